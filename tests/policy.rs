//! Policy files and command-line merging through the real binary (docs/protocol.md §1, §2):
//! the example policies in `policy/` check clean, bad policies fail with a clear message,
//! `policy schema` is JSON, and `serve` merges `--policy` with `--root`.
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{Fsb, bin, tempdir};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs `fsbroker ARGS` with stdin closed, `HOME` set to `home` (when given) and returns its
/// output.
fn run(args: &[&str], home: Option<&Path>) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(h) = home {
        cmd.env("HOME", h);
    }
    cmd.output().expect("run fsbroker")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `fsbroker ARGS` with `input` on stdin (from a file) and `RUST_LOG` set.
fn run_with_input(args: &[&str], input: &str, rust_log: &str) -> Output {
    let (_t, dir) = tempdir();
    let path = dir.join("input.jsonl");
    std::fs::write(&path, input).unwrap();
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", rust_log)
        .stdin(std::fs::File::open(&path).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run fsbroker")
}

/// A TOML literal string holding `p` (temp paths hold no `'`).
fn lit(p: &Path) -> String {
    let s = p.to_str().unwrap();
    assert!(!s.contains('\''));
    format!("'{s}'")
}

/// The example policies shipped in `policy/`.
fn example_policies() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn parse_toml(p: &Path) -> toml::Table {
    let text = std::fs::read_to_string(p).unwrap();
    text.parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn roots_of(t: &toml::Table) -> Vec<toml::Table> {
    t.get("root")
        .and_then(|r| r.as_array())
        .map(|a| a.iter().map(|r| r.as_table().unwrap().clone()).collect())
        .unwrap_or_default()
}

fn str_of<'a>(t: &'a toml::Table, key: &str) -> Option<&'a str> {
    t.get(key).and_then(|v| v.as_str())
}

/// Creates, under `home`, the directory each `~/...` root of `policy` names; returns each
/// root's expected name.
fn make_home_for(policy: &toml::Table, home: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for root in roots_of(policy) {
        let path = str_of(&root, "path").expect("root path");
        let rest = path
            .strip_prefix("~/")
            .unwrap_or_else(|| panic!("example roots use ~/ paths: {path}"));
        let dir = home.join(rest);
        std::fs::create_dir_all(&dir).unwrap();
        let name = str_of(&root, "name")
            .map(str::to_owned)
            .unwrap_or_else(|| dir.file_name().unwrap().to_str().unwrap().to_owned());
        names.push(name);
    }
    names
}

/// Writes `text` as a policy file in a fresh temp dir; returns (dir guard, file path).
fn policy_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let (t, dir) = tempdir();
    let p = dir.join("policy.toml");
    std::fs::write(&p, text).unwrap();
    (t, p)
}

fn check(p: &Path) -> Output {
    run(&["policy", "check", p.to_str().unwrap()], None)
}

/// `policy check` must fail, say so on stderr (not stdout) and mention every `needle`.
fn assert_check_fails(text: &str, needles: &[&str]) {
    let (_t, p) = policy_file(text);
    let o = check(&p);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "accepted:\n{text}\nstdout: {}",
        stdout(&o)
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(o.status.code().is_some(), "killed by a signal: {err}");
    for n in needles {
        assert!(
            err.contains(n),
            "stderr lacks {n:?}:\n{err}\npolicy:\n{text}"
        );
    }
    assert!(
        !err.contains("panicked"),
        "a bad policy must not panic:\n{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// The example policies
// ---------------------------------------------------------------------------------------------

#[test]
fn example_policies_are_the_three_expected() {
    let names: Vec<String> = example_policies()
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .collect();
    for want in [
        "developer-laptop.toml",
        "enterprise-audited.toml",
        "reviewer-readonly.toml",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "missing policy/{want}: {names:?}"
        );
    }
}

#[test]
fn every_example_policy_checks_clean() {
    let files = example_policies();
    assert!(!files.is_empty());
    for file in files {
        let policy = parse_toml(&file);
        let (_t, home) = tempdir();
        let names = make_home_for(&policy, &home);
        assert!(!names.is_empty(), "{}: no roots", file.display());
        let o = run(&["policy", "check", file.to_str().unwrap()], Some(&home));
        let out = stdout(&o);
        assert!(
            o.status.success(),
            "{}: exit {:?}\n{}",
            file.display(),
            o.status.code(),
            stderr(&o)
        );
        assert!(out.contains("ok"), "{out}");
        assert!(
            out.contains(&format!("{} root(s)", names.len())),
            "{}: {out}",
            file.display()
        );
        for name in &names {
            assert!(
                out.lines()
                    .any(|l| l.trim_start().starts_with(&format!("{name} = "))),
                "{}: summary does not name root {name}:\n{out}",
                file.display()
            );
        }
        // `~/` was expanded with $HOME.
        assert!(out.contains(home.to_str().unwrap()), "{out}");
        assert!(!out.contains('~'), "{out}");
    }
}

#[test]
fn example_policies_fail_when_their_directories_are_missing() {
    for file in example_policies() {
        let (_t, home) = tempdir(); // empty: no project directories
        let o = run(&["policy", "check", file.to_str().unwrap()], Some(&home));
        assert!(!o.status.success(), "{}", file.display());
        assert!(
            stderr(&o).contains(home.to_str().unwrap()),
            "the error names the missing directory: {}",
            stderr(&o)
        );
    }
}

#[test]
fn developer_laptop_policy_says_what_it_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let p = parse_toml(&dir.join("developer-laptop.toml"));
    let roots = roots_of(&p);
    assert!(!roots.is_empty());
    for r in &roots {
        assert_eq!(str_of(r, "mode"), Some("read-write"), "{r}");
        assert_eq!(str_of(r, "consent"), Some("auto"), "{r}");
        let deny: Vec<&str> = r["deny"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for g in [".git/**", "**/.env", "**/*.pem"] {
            assert!(deny.contains(&g), "{g} not denied in {r}");
        }
    }
}

#[test]
fn reviewer_policy_says_what_it_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let p = parse_toml(&dir.join("reviewer-readonly.toml"));
    let roots = roots_of(&p);
    assert!(!roots.is_empty());
    for r in &roots {
        // read-only is also the default; either way no root may be writable.
        assert_ne!(str_of(r, "mode"), Some("read-write"), "{r}");
        assert_eq!(str_of(r, "consent"), Some("prompt"), "{r}");
    }
    let max = p["limits"]["max_list_entries"].as_integer().unwrap();
    assert!(max > 10_000, "generous list limits: {max}");
}

#[test]
fn enterprise_policy_says_what_it_should() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy");
    let path = dir.join("enterprise-audited.toml");
    let p = parse_toml(&path);
    for r in &roots_of(&p) {
        assert_eq!(str_of(r, "consent"), Some("prompt"), "{r}");
    }
    let limits = p["limits"].as_table().unwrap();
    let rps = limits["requests_per_second"].as_integer().unwrap();
    assert!(rps > 0 && rps < 200, "a real rate limit: {rps}");
    let mfs = limits["max_file_size"].as_integer().unwrap();
    assert!(mfs > 0 && mfs < 1 << 30, "tighter than the default: {mfs}");
    assert!(limits.contains_key("request_burst"));
    // Each choice is explained: comments in the [limits] section.
    let text = std::fs::read_to_string(&path).unwrap();
    let limits_text = &text[text.find("[limits]").unwrap()..];
    assert!(limits_text.matches('#').count() >= 6, "{limits_text}");
    // Audited: a rolling log with a copy in the journal that the user cannot rewrite.
    let audit = p["audit"].as_table().expect("an [audit] table");
    assert!(audit["max_bytes"].as_integer().unwrap() >= 4096);
    assert_eq!(audit["journald"].as_bool(), Some(true));
}

// ---------------------------------------------------------------------------------------------
// Bad policies
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_key_names_the_key_and_the_line() {
    let (_t, d) = tempdir();
    assert_check_fails(
        &format!("[[root]]\npath = {}\n\n[limits]\nchunk_sise = 4\n", lit(&d)),
        &["chunk_sise", "line 5"],
    );
    assert_check_fails(
        &format!(
            "# comment\n[[root]]\npath = {}\nmoed = \"read-write\"\n",
            lit(&d)
        ),
        &["moed", "line 4"],
    );
    assert_check_fails("[extra]\nx = 1\n", &["extra", "line 1"]);
    assert_check_fails("rooot = []\n", &["rooot", "line 1"]);
}

#[test]
fn bad_mode_and_consent_values() {
    let (_t, d) = tempdir();
    assert_check_fails(
        &format!("[[root]]\npath = {}\nmode = \"rw\"\n", lit(&d)),
        &["rw", "line 3", "read-only", "read-write"],
    );
    assert_check_fails(
        &format!("[[root]]\npath = {}\nconsent = \"maybe\"\n", lit(&d)),
        &["maybe", "line 3"],
    );
    assert_check_fails(
        &format!("[[root]]\npath = {}\nmode = 1\n", lit(&d)),
        &["line 3"],
    );
}

#[test]
fn missing_or_unusable_directory() {
    let (_t, d) = tempdir();
    let missing = d.join("no such dir");
    assert_check_fails(
        &format!("[[root]]\npath = {}\n", lit(&missing)),
        &[missing.to_str().unwrap()],
    );
    let file = d.join("a-file");
    std::fs::write(&file, "x").unwrap();
    assert_check_fails(
        &format!("[[root]]\npath = {}\n", lit(&file)),
        &[file.to_str().unwrap()],
    );
    // A root needs a path.
    assert_check_fails("[[root]]\nname = \"x\"\n", &["path"]);
}

#[test]
fn duplicate_names_and_paths() {
    let (_t, d) = tempdir();
    let (a, b) = (d.join("x/same"), d.join("y/same"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    // Same default name.
    assert_check_fails(
        &format!(
            "[[root]]\npath = {}\n\n[[root]]\npath = {}\n",
            lit(&a),
            lit(&b)
        ),
        &["\"same\"", a.to_str().unwrap(), b.to_str().unwrap()],
    );
    // Same explicit name.
    assert_check_fails(
        &format!(
            "[[root]]\npath = {}\nname = \"n\"\n\n[[root]]\npath = {}\nname = \"n\"\n",
            lit(&a),
            lit(&d)
        ),
        &["\"n\""],
    );
    // The same directory twice under two names.
    assert_check_fails(
        &format!(
            "[[root]]\npath = {}\n\n[[root]]\npath = {}\nname = \"other\"\n",
            lit(&a),
            lit(&a)
        ),
        &[a.to_str().unwrap(), "twice"],
    );
    // A name that is not one path segment.
    assert_check_fails(
        &format!("[[root]]\npath = {}\nname = \"a/b\"\n", lit(&a)),
        &["a/b"],
    );
}

#[test]
fn bad_glob_names_the_pattern() {
    let (_t, d) = tempdir();
    assert_check_fails(
        &format!("[[root]]\npath = {}\ndeny = [\"ok/**\", \"a[\"]\n", lit(&d)),
        &["a["],
    );
    assert_check_fails(
        &format!("[[root]]\npath = {}\ndeny = \"not-a-list\"\n", lit(&d)),
        &["line 3"],
    );
}

#[test]
fn inconsistent_or_ill_typed_limits() {
    assert_check_fails(
        "[limits]\nchunk_size = 10\nmax_chunk_size = 5\n",
        &["chunk_size", "max_chunk_size"],
    );
    assert_check_fails("[limits]\nchunk_size = \"big\"\n", &["line 2"]);
    assert_check_fails("[limits]\ntimeout_ms = 0\n", &["timeout_ms"]);
    assert_check_fails("[limits]\nmax_chunk_size = -1\n", &["line 2"]);
}

#[test]
fn syntax_errors_and_missing_files() {
    assert_check_fails("[[root]\npath = \n", &["line 1"]);
    let (_t, d) = tempdir();
    let nothing = d.join("nothing.toml");
    let o = check(&nothing);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(nothing.to_str().unwrap()),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_empty_policy_is_valid() {
    let (_t, p) = policy_file("# nothing yet\n");
    let o = check(&p);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("0 root(s)"), "{}", stdout(&o));
}

#[test]
fn schema_is_json_and_describes_the_policy() {
    let o = run(&["policy", "schema"], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let schema: Value = serde_json::from_slice(&o.stdout).expect("schema is JSON");
    assert!(schema.is_object());
    let text = schema.to_string();
    for word in [
        "root",
        "limits",
        "deny",
        "chunk_size",
        "max_list_entries",
        "consent",
        "mode",
    ] {
        assert!(text.contains(word), "schema lacks {word}");
    }
    assert!(schema["properties"].get("root").is_some(), "{schema:#}");
    assert!(schema["properties"].get("limits").is_some(), "{schema:#}");
}

// ---------------------------------------------------------------------------------------------
// serve: --policy merged with --root, --read-write, --consent
// ---------------------------------------------------------------------------------------------

/// A policy with one root `pol` (read-only, consent prompt) and a separate directory for
/// `--root`.
struct Setup {
    _t: tempfile::TempDir,
    policy: PathBuf,
    pol_dir: PathBuf,
    cli_dir: PathBuf,
}

fn setup() -> Setup {
    let (t, d) = tempdir();
    let pol_dir = d.join("pol");
    let cli_dir = d.join("cli");
    std::fs::create_dir(&pol_dir).unwrap();
    std::fs::create_dir(&cli_dir).unwrap();
    let policy = d.join("policy.toml");
    std::fs::write(
        &policy,
        format!("[[root]]\npath = {}\nname = \"pol\"\n", lit(&pol_dir)),
    )
    .unwrap();
    Setup {
        _t: t,
        policy,
        pol_dir,
        cli_dir,
    }
}

fn root_names(b: &mut Fsb) -> Vec<String> {
    let r = b.ok("roots/list", json!({}));
    r["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn policy_roots_come_first_then_command_line_roots() {
    let s = setup();
    // `roots/list` lists only roots the session may use now: make the policy's root `auto`.
    std::fs::write(
        &s.policy,
        format!(
            "[[root]]\npath = {}\nname = \"pol\"\nconsent = \"auto\"\n",
            lit(&s.pol_dir)
        ),
    )
    .unwrap();
    let mut b = Fsb::spawn(&[
        "serve",
        "--root",
        s.cli_dir.to_str().unwrap(),
        "--policy",
        s.policy.to_str().unwrap(),
    ]);
    let r = b.ok("roots/list", json!({}));
    let roots = r["roots"].as_array().unwrap();
    assert_eq!(roots.len(), 2, "{r}");
    assert_eq!(roots[0]["name"], "pol");
    assert_eq!(
        roots[0]["uri"],
        format!("file://{}", s.pol_dir.to_str().unwrap())
    );
    assert_eq!(roots[1]["name"], "cli");
    assert_eq!(
        roots[1]["uri"],
        format!("file://{}", s.cli_dir.to_str().unwrap())
    );
    // Several --root flags keep their order after the policy's roots.
    let extra = s.cli_dir.parent().unwrap().join("zz-extra");
    std::fs::create_dir(&extra).unwrap();
    let mut b = Fsb::spawn(&[
        "serve",
        "--policy",
        s.policy.to_str().unwrap(),
        "--root",
        extra.to_str().unwrap(),
        "--root",
        s.cli_dir.to_str().unwrap(),
    ]);
    assert_eq!(root_names(&mut b), ["pol", "zz-extra", "cli"]);
}

#[test]
fn read_write_applies_to_command_line_roots_only() {
    let s = setup();
    let input = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n";
    let o = run_with_input(
        &[
            "serve",
            "--policy",
            s.policy.to_str().unwrap(),
            "--root",
            s.cli_dir.to_str().unwrap(),
            "--read-write",
        ],
        input,
        "fsbroker=info",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let resp: Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<_> = resp["result"]["roots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    // `pol` is a `prompt` root nobody approved (and there is no one to ask): not listed.
    assert_eq!(names, ["cli"]);
    // The only outside view of a root's mode until files/write exists: the startup log.
    let err = stderr(&o);
    let line_of = |name: &str| {
        err.lines()
            .find(|l| {
                l.contains(&format!("name=\"{name}\"")) || l.contains(&format!("name={name} "))
            })
            .unwrap_or_else(|| panic!("no startup log line for root {name}:\n{err}"))
            .to_owned()
    };
    let pol = line_of("pol");
    let cli = line_of("cli");
    assert!(
        pol.contains("ReadOnly") && !pol.contains("ReadWrite"),
        "{pol}"
    );
    assert!(cli.contains("ReadWrite"), "{cli}");
    // Consent: the policy root keeps its default (prompt), the --root one is auto.
    assert!(pol.contains("Prompt"), "{pol}");
    assert!(cli.contains("Auto"), "{cli}");
}

#[test]
fn consent_override_is_accepted_and_applies_to_every_root() {
    let s = setup();
    for mode in ["deny", "prompt", "auto"] {
        let input = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"roots/list\"}\n";
        let o = run_with_input(
            &[
                "serve",
                "--policy",
                s.policy.to_str().unwrap(),
                "--root",
                s.cli_dir.to_str().unwrap(),
                "--consent",
                mode,
            ],
            input,
            "fsbroker=info",
        );
        assert!(o.status.success(), "--consent {mode}: {}", stderr(&o));
        let resp: Value = serde_json::from_slice(&o.stdout).unwrap();
        // Only roots the session may use now are listed: none of a `deny` root, none of a
        // `prompt` root with nobody to ask.
        let listed = if mode == "auto" { 2 } else { 0 };
        assert_eq!(
            resp["result"]["roots"].as_array().unwrap().len(),
            listed,
            "--consent {mode}: {resp}"
        );
        let want = match mode {
            "deny" => "consent=Deny",
            "prompt" => "consent=Prompt",
            _ => "consent=Auto",
        };
        let err = stderr(&o);
        let root_lines: Vec<_> = err.lines().filter(|l| l.contains(" root ")).collect();
        assert_eq!(root_lines.len(), 2, "{err}");
        for l in root_lines {
            assert!(l.contains(want), "--consent {mode}: {l}");
        }
    }
    // And through the pipes helper: a session starts and answers.
    let mut b = Fsb::spawn(&[
        "serve",
        "--root",
        s.cli_dir.to_str().unwrap(),
        "--consent",
        "deny",
    ]);
    assert!(root_names(&mut b).is_empty());
    // A bad value is refused by the command line parser.
    let o = run(
        &[
            "serve",
            "--root",
            s.cli_dir.to_str().unwrap(),
            "--consent",
            "sometimes",
        ],
        None,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("sometimes"), "{}", stderr(&o));
}

#[test]
fn two_command_line_roots_with_the_same_name_are_refused() {
    let (_t, d) = tempdir();
    let (a, b) = (d.join("x/same"), d.join("y/same"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let o = run(
        &[
            "serve",
            "--root",
            a.to_str().unwrap(),
            "--root",
            b.to_str().unwrap(),
        ],
        None,
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("\"same\""), "{err}");
    assert!(
        err.contains(a.to_str().unwrap()) && err.contains(b.to_str().unwrap()),
        "{err}"
    );
    assert!(stdout(&o).is_empty(), "nothing on stdout: {}", stdout(&o));
    // A policy root and a --root colliding by name is refused the same way.
    let s = setup();
    let other = d.join("z/pol");
    std::fs::create_dir_all(&other).unwrap();
    let o = run(
        &[
            "serve",
            "--policy",
            s.policy.to_str().unwrap(),
            "--root",
            other.to_str().unwrap(),
        ],
        None,
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("\"pol\""), "{}", stderr(&o));
}

#[test]
fn serve_refuses_a_bad_policy_and_a_missing_root() {
    let (_t, p) = policy_file("[limits]\nchunk_sise = 1\n");
    let o = run(&["serve", "--policy", p.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("chunk_sise"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty());
    let (_t2, d) = tempdir();
    let missing = d.join("gone");
    let o = run(&["serve", "--root", missing.to_str().unwrap()], None);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(missing.to_str().unwrap()),
        "{}",
        stderr(&o)
    );
}

#[test]
fn policy_limits_reach_the_session() {
    let (_t, d) = tempdir();
    let root = d.join("r");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "0123456789").unwrap();
    for i in 0..5 {
        std::fs::write(root.join(format!("g{i}")), "").unwrap();
    }
    let (_p, policy) = policy_file(&format!(
        "[[root]]\npath = {}\nconsent = \"auto\"\n\n[limits]\nchunk_size = 4\nmax_chunk_size = 6\nmax_list_entries = 2\n",
        lit(&root)
    ));
    let mut b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    let r = b.ok("files/read", json!({"path": "r/f.txt"}));
    assert_eq!(r["content"], "0123");
    let r = b.ok("files/read", json!({"path": "r/f.txt", "length": 100}));
    assert_eq!(r["content"], "012345");
    let r = b.ok("files/list", json!({"path": "r"}));
    assert_eq!(r["entries"].as_array().unwrap().len(), 2);
    assert!(r["nextCursor"].is_string());
}

#[test]
fn relative_and_home_paths_in_a_policy() {
    let (_t, d) = tempdir();
    // Relative root paths are relative to the policy file's directory.
    std::fs::create_dir_all(d.join("conf/proj")).unwrap();
    std::fs::write(d.join("conf/policy.toml"), "[[root]]\npath = \"proj\"\n").unwrap();
    let o = check(&d.join("conf/policy.toml"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(d.join("conf/proj").to_str().unwrap()),
        "{}",
        stdout(&o)
    );
    // `~/` is $HOME.
    std::fs::create_dir_all(d.join("home/code")).unwrap();
    std::fs::write(d.join("conf/home.toml"), "[[root]]\npath = \"~/code\"\n").unwrap();
    let o = run(
        &[
            "policy",
            "check",
            d.join("conf/home.toml").to_str().unwrap(),
        ],
        Some(&d.join("home")),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(d.join("home/code").to_str().unwrap()),
        "{}",
        stdout(&o)
    );
}

/// The strict example of docs/hosts.md fits `--confine=strict`: with its directories made,
/// `confine check` for the reference server's `npx -y` line finds every rule enforced (exit
/// 0), and the proxy starts a confined server under it (the policy's own `[confine] mode`).
#[test]
fn the_confined_server_policy_is_enforced_in_full_under_strict() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("policy/confined-server.toml");
    let policy = parse_toml(&file);
    assert_eq!(policy["confine"]["mode"].as_str(), Some("strict"));
    for r in roots_of(&policy) {
        assert!(
            r.get("deny").is_none(),
            "strict cannot enforce deny globs: {r}"
        );
    }
    let (_t, home) = tempdir();
    make_home_for(&policy, &home);
    let o = run(
        &[
            "confine",
            "check",
            "--policy",
            file.to_str().unwrap(),
            "--",
            common::python(),
            "-c",
            "print(1)",
        ],
        Some(&home),
    );
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("Every rule is enforced"),
        "{}",
        stdout(&o)
    );
    let o = run(
        &[
            "proxy",
            "--policy",
            file.to_str().unwrap(),
            "--",
            common::python(),
            "-c",
            "import json\ntry:\n    open('/etc/shadow')\n    r = 'open'\nexcept OSError:\n    r = 'refused'\nprint(json.dumps({'jsonrpc': '2.0', 'method': r}))",
        ],
        Some(&home),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // Confined: the kernel refused it what lies outside its roots.
    assert!(stdout(&o).contains("\"refused\""), "{}", stdout(&o));
}

/// Rule: a `[consent] timeout_ms` longer than `[limits] timeout_ms` is named by `policy
/// check`: the prompt is denied when its request's time runs out, which the page's countdown
/// showed without a word. The policy is still accepted; the default pair draws no warning.
#[test]
fn a_consent_timeout_past_the_requests_is_warned_of() {
    let (_t, dir) = tempdir();
    let text = format!(
        "[[root]]\npath = '{}'\n\n[consent]\ntimeout_ms = 120000\n",
        dir.display()
    );
    let (_p, file) = policy_file(&text);
    let o = check(&file);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(
            "warning: [consent] timeout_ms (120000) is longer than [limits] timeout_ms (60000)"
        ),
        "{err}"
    );
    let (_p, file) = policy_file(&format!("[[root]]\npath = '{}'\n", dir.display()));
    let o = check(&file);
    assert!(
        !stderr(&o).contains("[consent] timeout_ms"),
        "{}",
        stderr(&o)
    );
}

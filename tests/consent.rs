//! `files/consent` and the consent modes through the real binary (docs/protocol.md §2, §5.3, §6):
//! `auto` roots approve what lies inside them, `deny` roots approve nothing, `prompt` roots
//! ask the external command (scripts written here) or the controlling terminal (a real
//! pseudo-terminal, driven by a small python helper), and fail closed when neither can ask.
//! Grants are per session, cover subtrees, and are checked for both paths of a rename and
//! for where a symlink really leads.
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use common::{lit, path_str as s, python};

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Fsb, PolicyToml, RootToml, bin, code, tempdir};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The consent decision script. `MODE SAVE`: saves its stdin to SAVE, then
/// - `all`: approves every requested path;
/// - `first`: approves the first requested path, plus paths that were never requested;
/// - `refuse`: `{"granted": false}`;
/// - `refuse-listing`: `{"granted": false, "approvedPaths": [everything]}`;
/// - `fail`: approves everything on stdout but exits 3;
/// - `garbage`: prints something that is not JSON;
/// - `sleep`: answers only after 20 s.
const DECIDE_PY: &str = r#"
import json, sys, time
mode, save = sys.argv[1], sys.argv[2]
data = sys.stdin.buffer.read()
with open(save + ".tmp", "wb") as f:
    f.write(data)
import os
os.rename(save + ".tmp", save)
paths = json.loads(data)["requestedPaths"]
if mode == "all":
    print(json.dumps({"granted": True, "approvedPaths": paths}))
elif mode == "first":
    print(json.dumps({"approvedPaths": paths[:1] + ["/etc", "/", "/etc/passwd"]}))
elif mode == "refuse":
    print(json.dumps({"granted": False}))
elif mode == "refuse-listing":
    print(json.dumps({"granted": False, "approvedPaths": paths}))
elif mode == "fail":
    print(json.dumps({"granted": True, "approvedPaths": paths}))
    sys.stdout.flush()
    sys.exit(3)
elif mode == "garbage":
    print("yes, approve all of them")
elif mode == "sleep":
    time.sleep(20)
    print(json.dumps({"approvedPaths": paths}))
else:
    sys.exit("unknown mode " + mode)
"#;

/// Runs `ARGV...` with a pseudo-terminal as its controlling terminal while its stdin,
/// stdout and stderr stay this helper's (the test's pipes). `TRANSCRIPT ANSWERS ARGV...`:
/// everything the program writes to the terminal is appended to TRANSCRIPT; each time a new
/// "Approve" prompt appears, the next of ANSWERS (separated by `|`) is typed. Exits with the
/// program's status once it has ended and the terminal is drained.
const PTY_PY: &str = r#"
import fcntl, os, sys, termios, threading
transcript, answers, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
answers = [a for a in answers.split("|") if a]
master, slave = os.openpty()
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    os.close(master)
    os.close(slave)
    os.execv(argv[0], argv)
# The program alone holds the test's pipes, so their ends close when it exits.
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
status = []
def reap():
    status.append(os.waitpid(pid, 0)[1])
    # Our slave end kept the master readable while the program had no terminal fd open;
    # closing it lets the reads below end (with EIO) once the buffer is drained.
    os.close(slave)
reaper = threading.Thread(target=reap)
reaper.start()
seen = b""
given = 0
with open(transcript, "ab", buffering=0) as t:
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        t.write(data)
        seen += data
        while given < len(answers) and seen.count(b"Approve") > given:
            os.write(master, answers[given].encode() + b"\n")
            given += 1
reaper.join()
sys.exit(os.waitstatus_to_exitcode(status[0]))
"#;

/// A temp tree with one root `r` and the files every prompt test uses:
///
/// ```text
/// root/a/b/f.txt   root/a/x.txt   root/a/glink -> ../c/g.txt   root/a/toc -> ../c
/// root/ab/h.txt    (a sibling whose name starts with "a")
/// root/c/g.txt     root/c/h.txt   root/e/e.txt
/// root/lc -> c     root/secret/s.txt (denied by policy)
/// ```
struct Env {
    _t: tempfile::TempDir,
    dir: PathBuf,
    root: PathBuf,
    policy: PathBuf,
    /// Where the consent script saves the request it got.
    save: PathBuf,
}

impl Env {
    fn new() -> Env {
        let (t, dir) = tempdir();
        let root = dir.join("root");
        for d in ["a/b", "ab", "c", "e", "secret"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for (f, text) in [
            ("a/b/f.txt", "deep"),
            ("a/x.txt", "ax"),
            ("ab/h.txt", "ab"),
            ("c/g.txt", "gee"),
            ("c/h.txt", "aitch"),
            ("e/e.txt", "e"),
            ("secret/s.txt", "s"),
        ] {
            std::fs::write(root.join(f), text).unwrap();
        }
        symlink("../c/g.txt", root.join("a/glink")).unwrap();
        symlink("../c", root.join("a/toc")).unwrap();
        symlink("c", root.join("lc")).unwrap();
        // In a folder of its own: fsbroker seals the folder of the consent command's files,
        // and the root sits beside it.
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("bin/decide.py"), DECIDE_PY).unwrap();
        Env {
            policy: dir.join("policy.toml"),
            save: dir.join("request.json"),
            _t: t,
            dir,
            root,
        }
    }

    /// Writes the policy: root `r` (read-write, deny `secret/**`) with `consent`, and
    /// `consent_table` as the body of `[consent]` (`None`: no table at all).
    fn policy(&self, consent: &str, consent_table: Option<&str>) -> &Path {
        let mut policy = PolicyToml::new().root(
            RootToml::at(&self.root)
                .name("r")
                .rw()
                .consent(consent)
                .deny(&["secret/**"]),
        );
        if let Some(table) = consent_table {
            policy = policy.table("consent", table);
        }
        policy.write_to(&self.policy);
        &self.policy
    }

    /// The `[consent]` body that runs the decision script in `mode`.
    fn command(&self, mode: &str, timeout_ms: u64) -> String {
        format!(
            "command = [{}, {}, \"{mode}\", {}]\nterminal = false\ntimeout_ms = {timeout_ms}",
            lit(Path::new(python())),
            lit(&self.dir.join("bin/decide.py")),
            lit(&self.save)
        )
    }

    /// A prompt root whose consent command runs in `mode`.
    fn prompt_with(mode: &str, timeout_ms: u64) -> Env {
        let env = Env::new();
        env.policy("prompt", Some(&env.command(mode, timeout_ms)));
        env
    }

    fn serve(&self) -> Fsb {
        Fsb::spawn(&["serve", "--policy", self.policy.to_str().unwrap()])
    }

    fn abs(&self, rel: &str) -> String {
        s(&self.root.join(rel))
    }

    /// The request the consent script saved (it must have run).
    fn saved(&self) -> Value {
        let text = std::fs::read(&self.save).expect("the consent command ran and saved its input");
        serde_json::from_slice(&text).expect("the consent request is JSON")
    }

    fn command_ran(&self) -> bool {
        self.save.exists()
    }
}

/// `files/consent` that must succeed; checks the result's shape and returns `approvedPaths`.
fn consent(b: &mut Fsb, message: Option<&str>, paths: &[&str]) -> Vec<String> {
    let mut params = json!({ "requestedPaths": paths });
    if let Some(m) = message {
        params["message"] = json!(m);
    }
    let r = b.ok("files/consent", params);
    let approved: Vec<String> = r["approvedPaths"]
        .as_array()
        .unwrap_or_else(|| panic!("approvedPaths is not an array: {r}"))
        .iter()
        .map(|p| p.as_str().expect("approved paths are strings").to_owned())
        .collect();
    assert_eq!(
        r["granted"],
        json!(!approved.is_empty()),
        "granted must say whether anything was approved: {r}"
    );
    for p in &approved {
        assert!(p.starts_with('/'), "approved path not absolute: {r}");
    }
    let distinct: BTreeSet<_> = approved.iter().collect();
    assert_eq!(distinct.len(), approved.len(), "duplicates in {r}");
    approved
}

/// Asserts `PERMISSION_DENIED`, reason "no consent", naming the request path.
fn assert_no_consent(e: &Value, path: &str) {
    assert_eq!(code(e), "PERMISSION_DENIED", "{e}");
    assert_eq!(e["code"], json!(-31002), "{e}");
    assert_eq!(e["data"]["reason"], "no consent", "{e}");
    assert_eq!(e["data"]["path"], path, "{e}");
}

fn read_ok(b: &mut Fsb, path: &str, expect: &str) {
    let r = b.ok("files/read", json!({ "path": path }));
    assert_eq!(r["content"], expect, "{path}: {r}");
}

fn read_refused(b: &mut Fsb, path: &str) {
    let e = b.err("files/read", json!({ "path": path }));
    assert_no_consent(&e, path);
}

fn set(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

/// Runs `PROGRAM ARGS...` with `requests` (given ids 1..) on stdin, closes stdin, and returns
/// the responses by id and everything written to stderr.
fn run_batch<S: AsRef<OsStr>>(
    program: &str,
    args: &[S],
    requests: &[Value],
) -> (Vec<Value>, String) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {program}: {e}"));
    let mut input = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let mut msg = r.clone();
        msg["jsonrpc"] = json!("2.0");
        msg["id"] = json!(i + 1);
        serde_json::to_writer(&mut input, &msg).unwrap();
        input.push(b'\n');
    }
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
    }
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{program} failed: {out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut responses: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    responses.sort_by_key(|r| r["id"].as_u64());
    assert_eq!(responses.len(), requests.len(), "{stdout}");
    (responses, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------------------------
// auto
// ---------------------------------------------------------------------------------------------

#[test]
fn auto_root_needs_no_consent_and_approves_only_paths_inside() {
    let env = Env::new();
    // The policy names the root through a symlinked alias: approved paths are canonical.
    let alias = env.dir.join("alias");
    symlink(&env.root, &alias).unwrap();
    std::fs::write(env.root.join("a/.env"), "K=V").unwrap();
    std::fs::create_dir(env.dir.join("outside")).unwrap();
    std::fs::write(env.dir.join("outside/o.txt"), "o").unwrap();
    PolicyToml::new()
        .root(
            RootToml::at(&alias)
                .name("r")
                .deny(&["secret/**", "**/.env"]),
        )
        .table("consent", env.command("all", 20_000))
        .write_to(&env.policy);
    let mut b = env.serve();

    // Without any consent.
    read_ok(&mut b, "r/a/b/f.txt", "deep");
    b.ok("files/list", json!({"path": "r"}));

    let outside = s(&env.dir.join("outside/o.txt"));
    let uri_c = format!("file://{}", common::uri_path(&env.root.join("c")));
    let alias_ab = s(&alias.join("a/b"));
    let requested = [
        "r/a",
        &env.abs("c/g.txt"),
        &uri_c,
        &alias_ab,
        "r/lc",
        "r/a/b/../b/f.txt",
        // Never approved: outside every root, or denied by a glob.
        "/etc/passwd",
        "r/../outside/o.txt",
        &outside,
        "r/secret/s.txt",
        "r/secret",
        "r/a/.env",
    ];
    let approved = consent(&mut b, Some("index the project"), &requested);
    let expected: BTreeSet<String> = [
        env.abs("a"),
        env.abs("c/g.txt"),
        env.abs("c"),
        env.abs("a/b"),
        env.abs("a/b/f.txt"),
    ]
    .into_iter()
    .collect();
    assert_eq!(set(&approved), expected, "{approved:?}");
    for p in &approved {
        assert!(
            Path::new(p).starts_with(&env.root),
            "{p} is not under the canonical root {}",
            env.root.display()
        );
    }

    // Nothing approvable: granted false, nothing listed.
    for bad in [
        vec!["/etc/passwd", "r/secret/s.txt", "r/a/.env", "r/../outside"],
        vec![outside.as_str()],
        vec![],
    ] {
        let r = b.ok(
            "files/consent",
            json!({"message": "m", "requestedPaths": bad}),
        );
        assert_eq!(r, json!({"granted": false, "approvedPaths": []}), "{bad:?}");
    }
    // Denied paths stay refused whatever was asked.
    let e = b.err("files/read", json!({"path": "r/secret/s.txt"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    assert_eq!(e["data"]["reason"], "denied by policy", "{e}");
    // An auto root never asks anyone.
    assert!(
        !env.command_ran(),
        "the consent command ran for an auto root"
    );
}

#[test]
fn command_line_roots_are_auto() {
    let env = Env::new();
    let mut b = Fsb::serve_root(&env.root);
    read_ok(&mut b, "root/a/b/f.txt", "deep");
    let approved = consent(&mut b, None, &["root/a", "/etc"]);
    assert_eq!(approved, vec![env.abs("a")]);
}

// ---------------------------------------------------------------------------------------------
// deny
// ---------------------------------------------------------------------------------------------

/// Every `files/*` method that names a path, refused "no consent" on `r`.
fn assert_every_method_refused(b: &mut Fsb, env: &Env) {
    read_refused(b, "r/a/b/f.txt");
    read_refused(b, &env.abs("a/x.txt"));
    let e = b.err("files/list", json!({"path": "r"}));
    assert_no_consent(&e, "r");
    let e = b.err("files/list", json!({"path": "r/a"}));
    assert_no_consent(&e, "r/a");
    let e = b.err(
        "files/write",
        json!({"path": "r/a/new.txt", "content": "x"}),
    );
    assert_no_consent(&e, "r/a/new.txt");
    let e = b.err("files/write", json!({"path": "r/a/x.txt", "content": "x"}));
    assert_no_consent(&e, "r/a/x.txt");
    let e = b.err(
        "files/write",
        json!({"path": "r/a/up.txt", "content": "x", "offset": 0, "final": false}),
    );
    assert_no_consent(&e, "r/a/up.txt");
    let e = b.err(
        "files/create",
        json!({"path": "r/a/d", "type": "directory"}),
    );
    assert_no_consent(&e, "r/a/d");
    let e = b.err("files/delete", json!({"path": "r/a/x.txt"}));
    assert_no_consent(&e, "r/a/x.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a/x.txt", "newPath": "r/a/y.txt"}),
    );
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    assert_eq!(e["data"]["reason"], "no consent", "{e}");
    // Nothing changed on disk.
    assert_eq!(
        std::fs::read_to_string(env.root.join("a/x.txt")).unwrap(),
        "ax"
    );
    for p in ["a/new.txt", "a/d", "a/y.txt"] {
        assert!(!env.root.join(p).exists(), "{p} was created");
    }
    let leftovers: Vec<_> = std::fs::read_dir(env.root.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("fsbroker"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn deny_root_refuses_everything_and_approves_nothing() {
    let env = Env::new();
    env.policy("deny", Some(&env.command("all", 20_000)));
    let mut b = env.serve();
    assert_every_method_refused(&mut b, &env);
    let r = b.ok(
        "files/consent",
        json!({"message": "please", "requestedPaths": ["r/a", env.abs("c"), "r"]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    // Nobody was asked, and still nothing is allowed.
    assert!(
        !env.command_ran(),
        "the consent command ran for a deny root"
    );
    assert_every_method_refused(&mut b, &env);
    // roots/list lists only roots the session may use: never a deny root, and the command
    // is not asked about it either.
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots, json!({"roots": []}));
    assert!(!env.command_ran(), "roots/list offered a deny root");
}

#[test]
fn consent_flag_deny_overrides_command_line_roots() {
    let env = Env::new();
    let mut b = Fsb::spawn(&[
        "serve".as_ref(),
        "--root".as_ref(),
        env.root.as_os_str(),
        "--consent".as_ref(),
        "deny".as_ref(),
    ]);
    read_refused(&mut b, "root/a/b/f.txt");
    let r = b.ok("files/consent", json!({"requestedPaths": ["root/a"]}));
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    read_refused(&mut b, "root/a/b/f.txt");
}

#[test]
fn mixed_roots_each_follow_their_own_mode() {
    let env = Env::new();
    let other = env.dir.join("other");
    let denied = env.dir.join("denied");
    std::fs::create_dir(&other).unwrap();
    std::fs::create_dir(&denied).unwrap();
    std::fs::write(other.join("o.txt"), "o").unwrap();
    std::fs::write(denied.join("d.txt"), "d").unwrap();
    PolicyToml::new()
        .root(RootToml::at(&env.root).name("r").consent("prompt"))
        .root(RootToml::at(&other).name("o"))
        .root(RootToml::at(&denied).name("d").consent("deny"))
        .table("consent", env.command("all", 20_000))
        .write_to(&env.policy);
    let mut b = env.serve();
    read_ok(&mut b, "o/o.txt", "o");
    read_refused(&mut b, "r/c/g.txt");
    read_refused(&mut b, "d/d.txt");
    let approved = consent(&mut b, Some("m"), &["d/d.txt", "o/o.txt", "r/c", "/etc"]);
    assert_eq!(
        set(&approved),
        set(&[s(&other.join("o.txt")), env.abs("c")]),
        "{approved:?}"
    );
    // Only the prompt root's path went to the person.
    assert_eq!(env.saved()["requestedPaths"], json!([env.abs("c")]));
    read_ok(&mut b, "r/c/g.txt", "gee");
    read_refused(&mut b, "d/d.txt");
}

// ---------------------------------------------------------------------------------------------
// prompt, external command
// ---------------------------------------------------------------------------------------------

#[test]
fn prompt_root_refuses_everything_before_consent() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    assert_every_method_refused(&mut b, &env);
    assert!(!env.command_ran(), "asked without files/consent");
}

#[test]
fn command_approving_all_gets_the_request_on_stdin() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    read_refused(&mut b, "r/a/b/f.txt");
    let approved = consent(
        &mut b,
        Some("Index the project \"x\" for search"),
        &[
            "r/a",
            &env.abs("c"),
            "r/a/b/../../a", // the same as r/a: asked once
            "/etc/passwd",
            "r/secret/s.txt",
            "r/../x",
        ],
    );
    assert_eq!(approved, vec![env.abs("a"), env.abs("c")]);
    // Exactly what the person's agent got: only paths inside roots and not denied, absolute
    // and canonical; the server's name is unknown in `serve`.
    assert_eq!(
        env.saved(),
        json!({
            "server": null,
            "message": "Index the project \"x\" for search",
            "requestedPaths": [env.abs("a"), env.abs("c")],
        })
    );
    read_ok(&mut b, "r/a/b/f.txt", "deep");
    read_ok(&mut b, &env.abs("c/g.txt"), "gee");
    // Not granted: the root itself, a sibling, a name that merely starts with "a".
    let e = b.err("files/list", json!({"path": "r"}));
    assert_no_consent(&e, "r");
    read_refused(&mut b, "r/e/e.txt");
    read_refused(&mut b, "r/ab/h.txt");
}

#[test]
fn command_approving_a_subset_grants_only_those_subtrees() {
    let env = Env::prompt_with("first", 20_000);
    let mut b = env.serve();
    let approved = consent(&mut b, Some("work in a"), &["r/a", "r/c", "r/e"]);
    // The script also "approved" /etc, / and /etc/passwd, never requested: ignored.
    assert_eq!(approved, vec![env.abs("a")]);
    assert_eq!(
        env.saved()["requestedPaths"],
        json!([env.abs("a"), env.abs("c"), env.abs("e")])
    );

    // Inside the granted subtree, at any depth.
    read_ok(&mut b, "r/a/x.txt", "ax");
    read_ok(&mut b, "r/a/b/f.txt", "deep");
    read_ok(
        &mut b,
        &format!("file://{}", common::uri_path(&env.root.join("a/b/f.txt"))),
        "deep",
    );
    b.ok("files/list", json!({"path": "r/a", "recursive": true}));
    b.ok("files/list", json!({"path": "r/a/b"}));
    b.ok(
        "files/write",
        json!({"path": "r/a/new.txt", "content": "n"}),
    );
    b.ok(
        "files/create",
        json!({"path": "r/a/d1/d2/d3", "type": "directory"}),
    );
    b.ok(
        "files/write",
        json!({"path": "r/a/d1/d2/d3/f", "content": "f"}),
    );
    b.ok("files/delete", json!({"path": "r/a/new.txt"}));
    b.ok(
        "files/rename",
        json!({"oldPath": "r/a/x.txt", "newPath": "r/a/b/x.txt"}),
    );
    b.ok(
        "files/rename",
        json!({"oldPath": "r/a/b/x.txt", "newPath": "r/a/x.txt"}),
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("a/d1/d2/d3/f")).unwrap(),
        "f"
    );

    // Outside it: siblings, the root, a name that merely starts with "a".
    read_refused(&mut b, "r/c/g.txt");
    read_refused(&mut b, "r/e/e.txt");
    read_refused(&mut b, "r/ab/h.txt");
    let e = b.err("files/list", json!({"path": "r"}));
    assert_no_consent(&e, "r");
    let e = b.err("files/list", json!({"path": "r/c"}));
    assert_no_consent(&e, "r/c");
    let e = b.err(
        "files/write",
        json!({"path": "r/c/new.txt", "content": "x"}),
    );
    assert_no_consent(&e, "r/c/new.txt");
    let e = b.err(
        "files/create",
        json!({"path": "r/c/d", "type": "directory"}),
    );
    assert_no_consent(&e, "r/c/d");
    let e = b.err("files/delete", json!({"path": "r/c/h.txt"}));
    assert_no_consent(&e, "r/c/h.txt");
    let e = b.err(
        "files/create",
        json!({"path": "r/new", "type": "directory"}),
    );
    assert_no_consent(&e, "r/new");

    // Both paths of a rename are checked, in either direction.
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a/x.txt", "newPath": "r/c/x.txt"}),
    );
    assert_no_consent(&e, "r/c/x.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/c/g.txt", "newPath": "r/a/g.txt"}),
    );
    assert_no_consent(&e, "r/c/g.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a/x.txt", "newPath": "r/c/h.txt", "overwrite": true}),
    );
    assert_no_consent(&e, "r/c/h.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a", "newPath": "r/moved"}),
    );
    assert_no_consent(&e, "r/moved");

    // A symlink inside the granted subtree leading into an ungranted one is refused.
    read_refused(&mut b, "r/a/glink");
    read_refused(&mut b, "r/a/toc/g.txt");
    let e = b.err("files/list", json!({"path": "r/a/toc"}));
    assert_no_consent(&e, "r/a/toc");
    let e = b.err(
        "files/write",
        json!({"path": "r/a/glink", "content": "pwned"}),
    );
    assert_no_consent(&e, "r/a/glink");
    let e = b.err(
        "files/write",
        json!({"path": "r/a/toc/new.txt", "content": "pwned"}),
    );
    assert_no_consent(&e, "r/a/toc/new.txt");
    let e = b.err(
        "files/create",
        json!({"path": "r/a/toc/newdir", "type": "directory"}),
    );
    assert_no_consent(&e, "r/a/toc/newdir");
    let e = b.err("files/delete", json!({"path": "r/a/toc/h.txt"}));
    assert_no_consent(&e, "r/a/toc/h.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a/x.txt", "newPath": "r/a/toc/x.txt"}),
    );
    assert_no_consent(&e, "r/a/toc/x.txt");
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/a/toc/g.txt", "newPath": "r/a/g.txt"}),
    );
    assert_no_consent(&e, "r/a/toc/g.txt");

    // Nothing outside the grant changed.
    assert_eq!(
        std::fs::read_to_string(env.root.join("c/g.txt")).unwrap(),
        "gee"
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("c/h.txt")).unwrap(),
        "aitch"
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join("a/x.txt")).unwrap(),
        "ax"
    );
    let mut in_c: Vec<String> = std::fs::read_dir(env.root.join("c"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    in_c.sort();
    assert_eq!(in_c, ["g.txt", "h.txt"]);
    assert!(!env.root.join("new").exists() && !env.root.join("moved").exists());
    assert!(
        std::fs::symlink_metadata(env.root.join("a/glink"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Grants are per session: another broker process has none.
    let mut other = env.serve();
    read_refused(&mut other, "r/a/b/f.txt");
    // ... and the first keeps its own.
    read_ok(&mut b, "r/a/b/f.txt", "deep");
}

#[test]
fn consent_through_a_symlink_grants_its_real_target() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    let approved = consent(&mut b, Some("m"), &["r/lc"]);
    assert_eq!(approved, vec![env.abs("c")], "approved paths are canonical");
    assert_eq!(env.saved()["requestedPaths"], json!([env.abs("c")]));
    read_ok(&mut b, "r/c/g.txt", "gee");
    read_ok(&mut b, "r/lc/g.txt", "gee");
    read_ok(&mut b, &env.abs("lc/h.txt"), "aitch");
    read_refused(&mut b, "r/a/b/f.txt");
}

/// The root itself may be asked for; its canonical path has no trailing slash (as in
/// `roots/list`), whichever way it was spelled.
#[test]
fn consent_for_a_whole_root() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    let root = s(&env.root);
    let uri = format!("file://{}", common::uri_path(&env.root));
    for spelling in ["r", root.as_str(), &format!("{root}/"), &uri, "r/a/.."] {
        let mut fresh = env.serve();
        let approved = consent(&mut fresh, Some("m"), &[spelling]);
        assert_eq!(approved, vec![root.clone()], "{spelling}");
        assert_eq!(env.saved()["requestedPaths"], json!([root]), "{spelling}");
        fresh.ok("files/list", json!({"path": "r"}));
        read_ok(&mut fresh, "r/e/e.txt", "e");
    }
    // An auto root too.
    let mut auto = Fsb::serve_root(&env.root);
    let approved = consent(&mut auto, None, &["root"]);
    assert_eq!(approved, vec![root.clone()]);
    read_refused(&mut b, "r/e/e.txt");
}

#[test]
fn consent_for_one_file_covers_that_file_only() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    let approved = consent(&mut b, Some("m"), &["r/c/g.txt"]);
    assert_eq!(approved, vec![env.abs("c/g.txt")]);
    read_ok(&mut b, "r/c/g.txt", "gee");
    b.ok(
        "files/write",
        json!({"path": "r/c/g.txt", "content": "new"}),
    );
    read_ok(&mut b, "r/c/g.txt", "new");
    read_refused(&mut b, "r/c/h.txt");
    let e = b.err("files/list", json!({"path": "r/c"}));
    assert_no_consent(&e, "r/c");
}

#[test]
fn command_refusing_grants_nothing() {
    for mode in ["refuse", "refuse-listing"] {
        let env = Env::prompt_with(mode, 20_000);
        let mut b = env.serve();
        let r = b.ok(
            "files/consent",
            json!({"message": "m", "requestedPaths": ["r/a", "r/c"]}),
        );
        assert_eq!(r, json!({"granted": false, "approvedPaths": []}), "{mode}");
        assert!(env.command_ran(), "{mode}: the command was not asked");
        read_refused(&mut b, "r/a/b/f.txt");
        read_refused(&mut b, "r/c/g.txt");
    }
}

#[test]
fn command_failing_or_babbling_grants_nothing() {
    // "fail" prints an approval of everything but exits non-zero: not a decision.
    for mode in ["fail", "garbage"] {
        let env = Env::prompt_with(mode, 20_000);
        let mut b = env.serve();
        let r = b.ok(
            "files/consent",
            json!({"message": "m", "requestedPaths": ["r/a"]}),
        );
        assert_eq!(r, json!({"granted": false, "approvedPaths": []}), "{mode}");
        assert!(env.command_ran(), "{mode}: the command was not asked");
        read_refused(&mut b, "r/a/b/f.txt");
    }
}

#[test]
fn command_missing_grants_nothing() {
    let env = Env::new();
    env.policy(
        "prompt",
        Some(&format!(
            "command = [{}]\nterminal = false\ntimeout_ms = 20000",
            lit(&env.dir.join("no-such-program"))
        )),
    );
    let mut b = env.serve();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["r/a"]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    read_refused(&mut b, "r/a/b/f.txt");
}

#[test]
fn command_past_the_timeout_is_a_denial() {
    let env = Env::prompt_with("sleep", 300);
    let mut b = env.serve();
    let started = Instant::now();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["r/a"]}),
    );
    let took = started.elapsed();
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    assert!(
        took >= Duration::from_millis(300),
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the timeout was not enforced: {took:?}"
    );
    read_refused(&mut b, "r/a/b/f.txt");
    // The session goes on.
    assert_eq!(b.ok("ping", json!({})), json!({}));
}

#[test]
fn consent_params() {
    let env = Env::prompt_with("all", 20_000);
    let mut b = env.serve();
    // `message` is optional.
    let approved = consent(&mut b, None, &["r/a"]);
    assert_eq!(approved, vec![env.abs("a")]);
    let saved = env.saved();
    assert!(
        saved["message"].is_null() || saved["message"] == "",
        "no message must not become one: {saved}"
    );
    assert_eq!(saved["requestedPaths"], json!([env.abs("a")]));
    std::fs::remove_file(&env.save).unwrap();

    // `requestedPaths` is required and must be an array of strings.
    for params in [
        json!({"message": "m"}),
        json!({}),
        json!({"requestedPaths": "r/c"}),
        json!({"requestedPaths": [1]}),
        json!({"requestedPaths": null}),
        json!({"message": 5, "requestedPaths": ["r/c"]}),
        json!({"requestedPaths": ["r/c"], "requestedPath": ["r/c"]}),
        json!(["m", ["r/c"]]),
    ] {
        let e = b.err("files/consent", params.clone());
        assert_eq!(e["code"], json!(-32602), "{params}: {e}");
    }
    // An empty list asks nobody and grants nothing.
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": []}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    assert!(
        !env.command_ran(),
        "a bad or empty request asked the person"
    );
    read_refused(&mut b, "r/c/g.txt");
}

// ---------------------------------------------------------------------------------------------
// fail closed
// ---------------------------------------------------------------------------------------------

fn consent_request(paths: &[String]) -> Value {
    json!({"method": "files/consent", "params": {"message": "m", "requestedPaths": paths}})
}

fn assert_consent_warning(stderr: &str) {
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("WARN") && l.contains("consent") && !l.contains("refused")),
        "no consent warning on stderr:\n{stderr}"
    );
}

#[test]
fn no_command_and_no_terminal_fails_closed_with_a_warning() {
    let env = Env::new();
    env.policy("prompt", Some("terminal = false\ntimeout_ms = 20000"));
    let policy = s(&env.policy);
    let (responses, stderr) = run_batch(
        bin(),
        &["serve", "--policy", &policy],
        &[consent_request(&[env.abs("a")])],
    );
    assert_eq!(
        responses[0]["result"],
        json!({"granted": false, "approvedPaths": []}),
        "{responses:?}"
    );
    assert_consent_warning(&stderr);
}

#[test]
fn terminal_without_a_controlling_terminal_fails_closed() {
    if !have("setsid") {
        return common::skipped("util-linux setsid is not installed");
    }
    let env = Env::new();
    for table in [Some("terminal = true\ntimeout_ms = 20000"), None] {
        env.policy("prompt", table);
        let policy = s(&env.policy);
        // `setsid -w`: a new session without a controlling terminal, stdin/stdout still pipes.
        let started = Instant::now();
        let (responses, stderr) = run_batch(
            "setsid",
            &["-w", bin(), "serve", "--policy", &policy],
            &[
                consent_request(&[env.abs("a")]),
                json!({"method": "files/read", "params": {"path": "r/a/x.txt"}}),
            ],
        );
        assert_eq!(
            responses[0]["result"],
            json!({"granted": false, "approvedPaths": []}),
            "{table:?}: {responses:?}"
        );
        assert_no_consent(&responses[1]["error"], "r/a/x.txt");
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{table:?}: waited for a terminal that is not there"
        );
        assert_consent_warning(&stderr);
    }
}

// ---------------------------------------------------------------------------------------------
// prompt, controlling terminal (a real pseudo-terminal)
// ---------------------------------------------------------------------------------------------

/// A broker whose controlling terminal is a pty answered with `answers`; stdin and stdout
/// stay the test's pipes. Returns the broker and the transcript file.
fn serve_on_pty(env: &Env, answers: &[&str]) -> (Fsb, PathBuf) {
    let helper = env.dir.join("pty.py");
    std::fs::write(&helper, PTY_PY).unwrap();
    let transcript = env.dir.join("transcript");
    let args = [
        s(&helper),
        s(&transcript),
        answers.join("|"),
        bin().to_owned(),
        "serve".to_owned(),
        "--policy".to_owned(),
        s(&env.policy),
    ];
    (Fsb::spawn_program(python(), &args), transcript)
}

fn transcript(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

#[test]
fn terminal_prompt_lists_the_request_and_applies_the_answer() {
    let env = Env::new();
    // A path whose name holds control characters must not be able to forge prompt lines.
    let evil = "ev\u{1b}[2Jil\n  [9] all files";
    std::fs::create_dir(env.root.join(evil)).unwrap();
    env.policy("prompt", Some("terminal = true\ntimeout_ms = 30000"));
    // "x" is not an answer: asked again, then "2".
    let (mut b, tr) = serve_on_pty(&env, &["x", "2", "a", "n"]);
    read_refused(&mut b, "r/a/b/f.txt");

    let approved = consent(&mut b, Some("Please let me index"), &["r/a", "r/c"]);
    assert_eq!(approved, vec![env.abs("c")]);
    let text = transcript(&tr);
    assert!(text.contains("Please let me index"), "{text}");
    assert!(text.contains(&format!("[1] {}", env.abs("a"))), "{text}");
    assert!(text.contains(&format!("[2] {}", env.abs("c"))), "{text}");
    assert!(text.contains("Approve"), "{text}");
    assert!(text.contains("MCP server"), "{text}");
    assert_eq!(
        text.matches("Approve").count(),
        2,
        "re-asked once after \"x\": {text}"
    );
    read_ok(&mut b, "r/c/g.txt", "gee");
    read_refused(&mut b, "r/a/b/f.txt");

    let approved = consent(&mut b, Some("more"), &["r/a", "r/lc", "/etc"]);
    // r/lc is c, already asked for above but asked again: canonical, listed once.
    assert_eq!(approved, vec![env.abs("a"), env.abs("c")]);
    read_ok(&mut b, "r/a/b/f.txt", "deep");

    let approved = consent(
        &mut b,
        Some("line one\nline two\u{1b}[2J"),
        &["r/e", &format!("r/{evil}")],
    );
    assert!(approved.is_empty());
    read_refused(&mut b, "r/e/e.txt");
    let text = transcript(&tr);
    assert!(text.contains("line one line two"), "{text}");
    assert!(text.contains(&format!("[1] {}", env.abs("e"))), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "control characters reached the terminal: {text:?}"
    );
    assert!(text.contains("ev?[2Jil?  [9] all files"), "{text:?}");
    assert!(
        !text.contains("\n  [9]"),
        "a path forged a prompt line: {text:?}"
    );
    assert_eq!(text.matches("Approve").count(), 4, "{text}");

    let (status, rest) = b.finish();
    assert!(status.success(), "{status:?}");
    assert!(rest.is_empty(), "{rest}");
}

#[test]
fn terminal_prompt_unanswered_is_a_denial() {
    let env = Env::new();
    env.policy("prompt", Some("terminal = true\ntimeout_ms = 300"));
    let (mut b, tr) = serve_on_pty(&env, &[]);
    let started = Instant::now();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["r/a"]}),
    );
    let took = started.elapsed();
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    assert!(
        took >= Duration::from_millis(300),
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the timeout was not enforced: {took:?}"
    );
    read_refused(&mut b, "r/a/b/f.txt");
    let (status, _) = b.finish();
    assert!(status.success(), "{status:?}");
    // The helper has drained the terminal by the time it exits.
    let text = transcript(&tr);
    assert!(text.contains(&format!("[1] {}", env.abs("a"))), "{text}");
    assert!(text.contains("no answer"), "{text}");
}

#[test]
fn a_command_is_preferred_to_the_terminal() {
    let env = Env::new();
    env.policy(
        "prompt",
        Some(
            &env.command("all", 20_000)
                .replace("terminal = false", "terminal = true"),
        ),
    );
    // The terminal would answer "n"; the command approves.
    let (mut b, tr) = serve_on_pty(&env, &["n"]);
    let approved = consent(&mut b, Some("m"), &["r/a"]);
    assert_eq!(approved, vec![env.abs("a")]);
    assert!(env.command_ran());
    let _ = b.finish();
    assert!(
        !transcript(&tr).contains("Approve"),
        "asked on the terminal too"
    );
}

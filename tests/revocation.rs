//! Revocation by policy reload (docs/protocol.md §6 "Consent and revocation", §5.3
//! `files/consent`), through the real binary over real pipes.
//!
//! Each test serves a policy file in a temporary directory and rewrites it during the live
//! session, the way editors do (a new file renamed over the old one) and in place. It checks
//! that the broker sends `notifications/roots/list_changed`, that `roots/list` and every
//! `files/*` call follow the new policy at once, that grants of a removed root or of a root
//! whose consent turned `deny` are gone for good (turning it back does not resurrect them),
//! that uploads there are aborted and leave no staging file, that kept locks there are
//! released, that a broken policy leaves the old one in force and logs why, and that SIGHUP
//! reloads without ending the broker. `reload_latency` prints how long a revocation takes to
//! reach the server.
//!
//! Beyond the basics: roots that nest (removing the outer one must not abort the inner one's
//! upload), a policy reached through a symlink (editing its target must reload), and a failed
//! reload that must be logged once rather than retried by the broker on its own.
//!
//! Every read from the broker has a deadline: a missing notification fails the test, it
//! never hangs it.
//!
//! One file though long: every test reloads the policy under the same live sessions (`Live`)
//! and checks the same sequence: `list_changed`, refusals, ended work.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Fsb, RootToml, lit};
use serde_json::{Value, json};

/// Longest wait for a response or for a notification that must come.
const DEADLINE: Duration = Duration::from_secs(10);
/// How long to listen for a notification that must *not* come. Reloads take the watcher's
/// 50 ms quiet period plus a load; this is many times that.
const QUIET: Duration = Duration::from_millis(600);

/// The notification the contract names, exactly.
fn list_changed() -> Value {
    json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
}

// ---------------------------------------------------------------------------------------------
// A live broker ([`common::Fsb`]: stdout and stderr read by threads, every wait
// bounded) with the checks these tests make on it.
// ---------------------------------------------------------------------------------------------

/// `fsbroker serve --policy FILE` as a [`Fsb`]: each message stamped with its arrival
/// time, stderr kept and echoed so a failing test shows the broker's log.
struct Live(Fsb);

impl Deref for Live {
    type Target = Fsb;
    fn deref(&self) -> &Fsb {
        &self.0
    }
}

impl DerefMut for Live {
    fn deref_mut(&mut self) -> &mut Fsb {
        &mut self.0
    }
}

impl Live {
    /// Starts the broker on `policy` and waits until it answers (its policy watcher is set up
    /// before it serves, so a change made after this is seen).
    fn start(policy: &Path) -> Live {
        let mut live = Live(Fsb::start(
            &["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()],
            DEADLINE,
        ));
        live.ok("roots/list", json!({}));
        live
    }

    /// Asserts a request fails `PERMISSION_DENIED` with `reason`.
    fn denied(&mut self, method: &str, params: Value, reason: &str) {
        let e = self.err(method, params.clone());
        assert_eq!(
            common::code(&e),
            "PERMISSION_DENIED",
            "{method} {params}: {e}"
        );
        assert_eq!(e["data"]["reason"], reason, "{method} {params}: {e}");
    }

    /// Waits for `notifications/roots/list_changed` (exactly as the contract writes it) and
    /// returns when it arrived.
    fn expect_list_changed(&mut self, what: &str) -> Instant {
        let Some((at, n)) = self.next_notification(DEADLINE) else {
            panic!("{what}: no notifications/roots/list_changed within {DEADLINE:?}");
        };
        assert_eq!(n, list_changed(), "{what}: unexpected notification");
        at
    }

    /// Asserts that no notification arrives within `limit` (or is already waiting).
    fn expect_no_notification(&mut self, limit: Duration, what: &str) {
        if let Some((_, n)) = self.next_notification(limit) {
            panic!("{what}: unexpected notification {n}");
        }
    }

    /// Waits for a stderr line that satisfies `pred`, returning it.
    fn expect_log(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.next_log_line(left) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => {
                    let log = self.log_since(0).join("\n");
                    panic!("{what}: no such line on stderr within {DEADLINE:?}; stderr was:\n{log}")
                }
            }
        }
    }

    /// The names in `roots/list`, in order.
    fn root_names(&mut self) -> Vec<String> {
        let r = self.ok("roots/list", json!({}));
        r["roots"]
            .as_array()
            .unwrap_or_else(|| panic!("roots/list: {r}"))
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// `roots/list` entries as `(name, uri)`.
    fn roots(&mut self) -> Vec<(String, String)> {
        let r = self.ok("roots/list", json!({}));
        r["roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["name"].as_str().unwrap().to_owned(),
                    x["uri"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// Reads a whole small file and returns its text.
    fn read_text(&mut self, path: &str) -> String {
        let r = self.ok("files/read", json!({"path": path}));
        r["content"].as_str().unwrap().to_owned()
    }

    /// Sends SIGHUP with `kill -HUP PID`.
    fn hangup(&self) {
        let st = Command::new("kill")
            .arg("-HUP")
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -HUP failed: {st}");
    }
}

// ---------------------------------------------------------------------------------------------
// Policy files.
// ---------------------------------------------------------------------------------------------

/// One `[[root]]` table's text (the tests here compose policy text by hand: comments, typos
/// and in-place rewrites are part of what they try).
fn root(path: &Path, name: &str, mode: &str, consent: &str) -> String {
    RootToml::at(path)
        .name(name)
        .mode(mode)
        .consent(consent)
        .text()
        + "\n"
}

/// Limits that keep the rate limiter out of the way of quick test sequences.
const LIMITS: &str = "[limits]\nrequests_per_second = 0\n";

/// The policy file under test, in a directory of its own.
struct PolicyFile {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    path: PathBuf,
    n: u32,
}

impl PolicyFile {
    fn new(text: &str) -> PolicyFile {
        let (tmp, dir) = common::tempdir();
        let path = dir.join("policy.toml");
        std::fs::write(&path, text).unwrap();
        PolicyFile {
            _tmp: tmp,
            dir,
            path,
            n: 0,
        }
    }

    /// Writes `text` to a new file in the same directory and renames it over the policy, as
    /// editors do. Returns the instant just before the rename.
    fn replace(&mut self, text: &str) -> Instant {
        self.n += 1;
        let tmp = self.dir.join(format!(".policy.toml.new{}", self.n));
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.sync_all().unwrap();
        drop(f);
        let before = Instant::now();
        std::fs::rename(&tmp, &self.path).unwrap();
        before
    }

    /// Rewrites the policy in place (truncate and write the same inode).
    fn rewrite_in_place(&self, text: &str) {
        let ino = std::fs::metadata(&self.path).unwrap().ino();
        std::fs::write(&self.path, text).unwrap();
        assert_eq!(
            std::fs::metadata(&self.path).unwrap().ino(),
            ino,
            "not an in-place write"
        );
    }
}

/// A directory `name` under `base` holding `f.txt` with `content`.
fn dir_with_file(base: &Path, name: &str, content: &str) -> PathBuf {
    let d = base.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("f.txt"), content).unwrap();
    d
}

/// Names of fsbroker staging files in `dir`.
fn staging_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".fsbroker-"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// 1. Removing a root.
// ---------------------------------------------------------------------------------------------

#[test]
fn removing_a_root_revokes_it_at_once_and_aborts_its_upload() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "keep a");
    std::fs::write(a.join("target.txt"), "old content").unwrap();
    std::fs::create_dir(a.join("sub")).unwrap();
    let b = dir_with_file(&base, "b", "keep b");
    // A third root, so that `NAME/rel` paths stay names (with one root left, any relative
    // path would be relative to it, §3).
    let c = dir_with_file(&base, "c", "keep c");
    let rb = root(&b, "b", "read-only", "auto");
    let rc = root(&c, "c", "read-only", "auto");
    let with_a = format!("{}{rb}{rc}{LIMITS}", root(&a, "a", "read-write", "auto"));
    let without_a = format!("{rb}{rc}{LIMITS}");
    let mut policy = PolicyFile::new(&with_a);
    let mut live = Live::start(&policy.path);

    assert_eq!(live.root_names(), ["a", "b", "c"]);
    assert_eq!(live.read_text("a/f.txt"), "keep a");
    // An upload in progress in `a`: its staging file sits beside the target.
    let first = live.ok(
        "files/write",
        json!({"path": "a/target.txt", "content": "new part 1 ", "offset": 0, "final": false}),
    );
    assert_eq!(first["bytesWritten"], 11, "{first}");
    assert_eq!(
        staging_files(&a).len(),
        1,
        "no staging file beside the target"
    );
    // A kept lock in `a`.
    let kept = live.ok(
        "files/write",
        json!({"path": "a/locked.txt", "content": "x", "keepLocked": true}),
    );
    let lock_id = kept["lockId"].as_str().expect("lockId").to_owned();

    policy.replace(&without_a);
    live.expect_list_changed("root a removed");

    assert_eq!(
        live.roots(),
        [
            ("b".to_owned(), format!("file://{}", common::uri_path(&b))),
            ("c".to_owned(), format!("file://{}", common::uri_path(&c))),
        ]
    );
    // Every way of naming `a` is now outside every root.
    const OUT: &str = "outside every root";
    let abs = a.join("f.txt").to_str().unwrap().to_owned();
    let uri = format!("file://{}", common::uri_path(&a.join("f.txt")));
    for p in ["a/f.txt", abs.as_str(), uri.as_str()] {
        live.denied("files/read", json!({"path": p}), OUT);
    }
    live.denied("files/list", json!({"path": "a"}), OUT);
    live.denied("files/list", json!({"path": a.to_str().unwrap()}), OUT);
    live.denied(
        "files/write",
        json!({"path": "a/new.txt", "content": "x"}),
        OUT,
    );
    live.denied(
        "files/write",
        json!({"path": a.join("new.txt").to_str().unwrap(), "content": "x"}),
        OUT,
    );
    live.denied(
        "files/create",
        json!({"path": "a/sub/made", "type": "file"}),
        OUT,
    );
    live.denied("files/delete", json!({"path": "a/f.txt"}), OUT);
    live.denied(
        "files/rename",
        json!({"oldPath": "a/f.txt", "newPath": "a/g.txt"}),
        OUT,
    );
    // Consent for a path outside every root approves nothing.
    let r = live.ok(
        "files/consent",
        json!({"message": "again?", "requestedPaths": ["a", a.to_str().unwrap()]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}), "{r}");
    // The next chunk of the upload: refused (the path is outside every root now).
    live.denied(
        "files/write",
        json!({"path": "a/target.txt", "content": "part 2", "offset": 11, "final": true}),
        OUT,
    );
    // The upload was aborted and cleaned: no staging file, the target untouched.
    assert_eq!(
        staging_files(&a),
        Vec::<String>::new(),
        "staging file left behind"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("target.txt")).unwrap(),
        "old content"
    );
    assert!(!a.join("new.txt").exists() && !a.join("sub/made").exists());
    assert!(a.join("f.txt").exists() && !a.join("g.txt").exists());
    // The root that stayed works as before.
    assert_eq!(live.read_text("b/f.txt"), "keep b");

    // Giving `a` back does not bring the upload or the kept lock back.
    policy.replace(&with_a);
    live.expect_list_changed("root a added back");
    assert_eq!(live.root_names(), ["a", "b", "c"]);
    let e = live.err(
        "files/write",
        json!({"path": "a/target.txt", "content": "part 2", "offset": 11, "final": true}),
    );
    assert_eq!(common::code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(
        std::fs::read_to_string(a.join("target.txt")).unwrap(),
        "old content"
    );
    assert_eq!(staging_files(&a), Vec::<String>::new());
    let e = live.err("files/unlock", json!({"lockId": lock_id}));
    assert_eq!(
        e["code"], -32602,
        "the kept lock survived the revocation: {e}"
    );
    // And the root is fully usable again.
    live.ok(
        "files/write",
        json!({"path": "a/target.txt", "content": "fresh"}),
    );
    assert_eq!(live.read_text("a/target.txt"), "fresh");
    assert!(live.alive());
}

#[test]
fn removing_a_root_by_an_in_place_rewrite() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let both = format!(
        "{}{}{LIMITS}",
        root(&a, "a", "read-write", "auto"),
        root(&b, "b", "read-only", "auto")
    );
    let policy = PolicyFile::new(&both);
    let mut live = Live::start(&policy.path);
    live.ok(
        "files/write",
        json!({"path": "a/f.txt", "content": "half", "offset": 0, "final": false}),
    );
    assert_eq!(staging_files(&a).len(), 1);

    policy.rewrite_in_place(&format!("{}{LIMITS}", root(&b, "b", "read-only", "auto")));
    live.expect_list_changed("in-place rewrite removing a");
    assert_eq!(live.root_names(), ["b"]);
    live.denied(
        "files/read",
        json!({"path": a.join("f.txt")}),
        "outside every root",
    );
    assert_eq!(
        staging_files(&a),
        Vec::<String>::new(),
        "staging file left behind"
    );
    assert_eq!(std::fs::read_to_string(a.join("f.txt")).unwrap(), "in a");
    assert_eq!(live.read_text("b/f.txt"), "in b");
}

/// Roots nest (the deepest wins, docs/protocol.md): removing the outer root revokes what
/// lies "there" and nothing of the inner root, which stays in force.
#[test]
fn removing_an_outer_root_leaves_a_nested_root_alone() {
    let (_t, base) = common::tempdir();
    let outer = dir_with_file(&base, "outer", "outer");
    let inner = dir_with_file(&outer, "inner", "inner");
    let both = format!(
        "{}{}{LIMITS}",
        root(&outer, "outer", "read-write", "auto"),
        root(&inner, "inner", "read-write", "auto")
    );
    let mut policy = PolicyFile::new(&both);
    let mut live = Live::start(&policy.path);
    live.ok(
        "files/write",
        json!({"path": "inner/up.txt", "content": "one ", "offset": 0, "final": false}),
    );
    live.ok(
        "files/write",
        json!({"path": "outer/up.txt", "content": "one ", "offset": 0, "final": false}),
    );
    assert_eq!(staging_files(&inner).len(), 1);
    assert_eq!(staging_files(&outer).len(), 1);

    policy.replace(&format!(
        "{}{LIMITS}",
        root(&inner, "inner", "read-write", "auto")
    ));
    live.expect_list_changed("outer removed");
    assert_eq!(live.root_names(), ["inner"]);
    assert_eq!(
        staging_files(&outer),
        Vec::<String>::new(),
        "outer upload left behind"
    );
    live.denied(
        "files/read",
        json!({"path": outer.join("f.txt")}),
        "outside every root",
    );
    assert_eq!(live.read_text("inner/f.txt"), "inner");
    // The inner root's upload was not "there": it goes on.
    let r = live.request(
        "files/write",
        json!({"path": "inner/up.txt", "content": "two", "offset": 4, "final": true}),
    );
    assert!(
        r.get("error").is_none(),
        "an upload in the nested root that stays in force was aborted by revoking the outer root: {r}"
    );
    assert_eq!(
        std::fs::read_to_string(inner.join("up.txt")).unwrap(),
        "one two"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Consent turned "deny".
// ---------------------------------------------------------------------------------------------

/// A consent command (a POSIX sh script) that approves every requested path and counts its
/// calls in `calls.log` beside it. Returns the `[consent]` table naming it.
fn approving_consent_command(dir: &Path) -> (String, PathBuf) {
    // In a folder of its own: fsbroker seals the folder of the consent command's files.
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let script = dir.join("bin/approve.sh");
    let calls = dir.join("calls.log");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             input=$(cat)\n\
             echo called >> {}\n\
             printf '%s' \"$input\" | sed 's/.*\"requestedPaths\":\\(\\[[^]]*\\]\\).*/{{\"approvedPaths\":\\1}}/'\n",
            lit(&calls)
        ),
    )
    .unwrap();
    let table = format!(
        "[consent]\ncommand = [\"/bin/sh\", {}]\nterminal = false\ntimeout_ms = 20000\n\n",
        lit(&script)
    );
    (table, calls)
}

fn calls(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[test]
fn consent_turned_deny_drops_grants_for_good() {
    let (_t, base) = common::tempdir();
    let p = dir_with_file(&base, "p", "prompted");
    std::fs::create_dir(p.join("sub")).unwrap();
    std::fs::write(p.join("sub/s.txt"), "deeper").unwrap();
    let (consent, log) = approving_consent_command(&base);
    let policy_with =
        |mode: &str| format!("{}{consent}{LIMITS}", root(&p, "p", "read-write", mode));
    let mut policy = PolicyFile::new(&policy_with("prompt"));
    let mut live = Live::start(&policy.path);

    const NO: &str = "no consent";
    // The first roots/list (in `Live::start`) offered the prompt root, and it was approved.
    assert_eq!(
        calls(&log),
        1,
        "the first roots/list offers the prompt root"
    );
    assert_eq!(live.read_text("p/f.txt"), "prompted");
    let asked = [p.to_str().unwrap().to_owned()];
    let r = live.ok(
        "files/consent",
        json!({"message": "to read p", "requestedPaths": asked}),
    );
    assert_eq!(r["granted"], true, "{r}");
    // Checked at the end, so a spelling difference does not hide the revocation checks.
    let first_approval = r;
    assert_eq!(calls(&log), 2);
    assert_eq!(live.read_text("p/f.txt"), "prompted");
    assert_eq!(live.read_text("p/sub/s.txt"), "deeper");
    live.ok("files/list", json!({"path": "p"}));

    // Consent flips to deny: the grant is gone at once.
    policy.replace(&policy_with("deny"));
    live.expect_list_changed("consent turned deny");
    assert!(
        live.root_names().is_empty(),
        "a deny root is still a root, but roots/list lists only what may be used"
    );
    live.denied("files/read", json!({"path": "p/f.txt"}), NO);
    live.denied("files/read", json!({"path": "p/sub/s.txt"}), NO);
    live.denied("files/list", json!({"path": "p"}), NO);
    live.denied(
        "files/write",
        json!({"path": "p/w.txt", "content": "x"}),
        NO,
    );
    // A deny root approves nothing and asks no one.
    let r = live.ok(
        "files/consent",
        json!({"message": "again", "requestedPaths": asked}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}), "{r}");
    assert_eq!(calls(&log), 2, "a deny root ran the consent command");

    // Back to prompt (in place this time): the old grant does not come back.
    policy.rewrite_in_place(&policy_with("prompt"));
    live.expect_list_changed("consent back to prompt");
    live.denied("files/read", json!({"path": "p/f.txt"}), NO);
    live.denied("files/read", json!({"path": "p/sub/s.txt"}), NO);
    assert!(!p.join("w.txt").exists());
    // Only asking again grants it again.
    let r = live.ok(
        "files/consent",
        json!({"message": "once more", "requestedPaths": asked}),
    );
    assert_eq!(r["granted"], true, "{r}");
    assert_eq!(calls(&log), 3);
    assert_eq!(live.read_text("p/f.txt"), "prompted");

    // §5: approvedPaths are absolute canonical paths (no trailing slash, like roots/list).
    assert_eq!(
        first_approval,
        json!({"granted": true, "approvedPaths": asked}),
        "consent for a root's own canonical path approved a different spelling of it"
    );
}

#[test]
fn consent_turned_deny_aborts_uploads_and_releases_locks() {
    let (_t, base) = common::tempdir();
    let w = dir_with_file(&base, "w", "old");
    let policy_with = |mode: &str| format!("{}{LIMITS}", root(&w, "w", "read-write", mode));
    let mut policy = PolicyFile::new(&policy_with("auto"));
    let mut live = Live::start(&policy.path);
    live.ok(
        "files/write",
        json!({"path": "w/f.txt", "content": "new ", "offset": 0, "final": false}),
    );
    let kept = live.ok("files/read", json!({"path": "w/f.txt", "keepLocked": true}));
    let lock_id = kept["lockId"].as_str().map(str::to_owned);
    assert_eq!(staging_files(&w).len(), 1);

    policy.replace(&policy_with("deny"));
    live.expect_list_changed("auto turned deny");
    live.denied("files/read", json!({"path": "w/f.txt"}), "no consent");
    live.denied(
        "files/write",
        json!({"path": "w/f.txt", "content": "more", "offset": 4, "final": true}),
        "no consent",
    );
    assert_eq!(
        staging_files(&w),
        Vec::<String>::new(),
        "staging file left behind"
    );
    assert_eq!(std::fs::read_to_string(w.join("f.txt")).unwrap(), "old");

    policy.replace(&policy_with("auto"));
    live.expect_list_changed("deny turned auto");
    let e = live.err(
        "files/write",
        json!({"path": "w/f.txt", "content": "more", "offset": 4, "final": true}),
    );
    assert_eq!(common::code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(std::fs::read_to_string(w.join("f.txt")).unwrap(), "old");
    if let Some(id) = lock_id {
        let e = live.err("files/unlock", json!({"lockId": id}));
        assert_eq!(
            e["code"], -32602,
            "the kept lock survived the revocation: {e}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Adding a root.
// ---------------------------------------------------------------------------------------------

#[test]
fn adding_a_root_by_rename_and_in_place() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b b", "in b");
    let c = dir_with_file(&base, "c", "in c");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "bee", "read-only", "auto");
    let rc = root(&c, "c", "read-write", "auto");
    let mut policy = PolicyFile::new(&format!("{ra}{LIMITS}"));
    let mut live = Live::start(&policy.path);
    live.denied(
        "files/read",
        json!({"path": b.join("f.txt")}),
        "outside every root",
    );

    policy.replace(&format!("{ra}{rb}{LIMITS}"));
    live.expect_list_changed("bee added by rename");
    assert_eq!(
        live.roots(),
        [
            ("a".to_owned(), format!("file://{}", common::uri_path(&a))),
            ("bee".to_owned(), format!("file://{}", common::uri_path(&b))),
        ]
    );
    assert_eq!(live.read_text("bee/f.txt"), "in b");
    assert_eq!(live.read_text(b.join("f.txt").to_str().unwrap()), "in b");
    let l = live.ok("files/list", json!({"path": "bee"}));
    assert!(l.to_string().contains("f.txt"), "{l}");

    policy.rewrite_in_place(&format!("{ra}{rb}{rc}{LIMITS}"));
    live.expect_list_changed("c added in place");
    assert_eq!(live.root_names(), ["a", "bee", "c"]);
    assert_eq!(live.read_text("c/f.txt"), "in c");
    live.ok(
        "files/write",
        json!({"path": "c/new.txt", "content": "made"}),
    );
    assert_eq!(std::fs::read_to_string(c.join("new.txt")).unwrap(), "made");
    assert_eq!(live.read_text("a/f.txt"), "in a");
}

/// Rewriting the policy with the same roots (a comment, a limit) reloads it but does not
/// tell the server its roots changed.
#[test]
fn a_change_that_leaves_the_roots_alone_sends_no_list_changed() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let ra = root(&a, "a", "read-only", "auto");
    let mut policy = PolicyFile::new(&format!("{ra}{LIMITS}"));
    let mut live = Live::start(&policy.path);
    policy.replace(&format!("# a comment\n{ra}{LIMITS}chunk_size = 2\n"));
    live.expect_no_notification(QUIET, "roots unchanged");
    // The new limit is in force nonetheless (reads now default to 2 bytes).
    let end = Instant::now() + DEADLINE;
    loop {
        let r = live.ok("files/read", json!({"path": "a/f.txt"}));
        if r["length"] == 2 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the new chunk_size never took effect: {r}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------------
// 4. A broken policy keeps the old one.
// ---------------------------------------------------------------------------------------------

#[test]
fn a_broken_policy_keeps_the_old_one_and_logs_why() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "b", "read-only", "auto");
    let good = format!("{ra}{rb}{LIMITS}");
    let mut policy = PolicyFile::new(&good);
    let mut live = Live::start(&policy.path);
    let missing = base.join("no-such-dir");
    let missing_s = missing.to_str().unwrap().to_owned();

    // (what, policy text, how to wait for its error, what one error line must name)
    type Case = (&'static str, String, Box<dyn Fn(&str) -> bool>, Vec<String>);
    let cases: Vec<Case> = vec![
        (
            "unknown key",
            format!("{ra}{rb}{LIMITS}chunk_sise_typo = 4\n"),
            Box::new(|l: &str| l.contains("chunk_sise_typo")),
            vec!["chunk_sise_typo".into()],
        ),
        (
            "missing root directory",
            format!(
                "{ra}{}{LIMITS}",
                root(&missing, "gone", "read-only", "auto")
            ),
            {
                let m = missing_s.clone();
                Box::new(move |l: &str| l.contains(&m))
            },
            vec![missing_s.clone()],
        ),
        (
            // `ra` is 6 lines: the broken header is on line 7.
            "syntax error",
            format!("{ra}[[root]\npath = 'unterminated\n"),
            Box::new(|l: &str| l.contains("policy.toml") && l.contains("line 7")),
            vec!["policy.toml".into(), "line 7".into()],
        ),
    ];
    let mut unnamed = Vec::new();
    for (what, text, arrived, names) in &cases {
        live.drain_log();
        let from = live.log_len();
        policy.replace(text);
        live.expect_log(what, arrived);
        live.expect_no_notification(QUIET, what);
        // The old policy, both roots, is still in force.
        assert_eq!(live.root_names(), ["a", "b"], "{what}");
        assert_eq!(live.read_text("a/f.txt"), "in a", "{what}");
        assert_eq!(live.read_text("b/f.txt"), "in b", "{what}");
        assert!(live.alive(), "{what}");
        // One line says it is an error and names the problem (a log record spread over
        // several lines loses its level and time on all but the first).
        let named = live.log_since(from).iter().any(|l| {
            l.to_ascii_lowercase().contains("error") && names.iter().all(|n| l.contains(n.as_str()))
        });
        if !named {
            unnamed.push(format!(
                "{what}: no single stderr line is marked as an error and names {names:?} \
                 (the log record is split over several lines?)"
            ));
        }
    }
    // A syntax error written in place is refused the same way.
    live.drain_log();
    policy.rewrite_in_place("[[root]]\npath = \n");
    live.expect_log("in-place syntax error", |l| {
        l.to_ascii_lowercase().contains("error")
            && l.contains("policy.toml")
            && l.contains("line 2")
    });
    live.expect_no_notification(QUIET, "in-place syntax error");
    assert_eq!(live.root_names(), ["a", "b"]);

    // Watching goes on after failures: a good policy is picked up.
    policy.replace(&format!("{ra}{LIMITS}"));
    live.expect_list_changed("good policy after broken ones");
    assert_eq!(live.root_names(), ["a"]);
    live.denied(
        "files/read",
        json!({"path": b.join("f.txt")}),
        "outside every root",
    );

    assert!(unnamed.is_empty(), "{unnamed:#?}");
}

/// A failed reload is logged once: the broker does not keep re-reading the policy by
/// itself (a reload is caused by a change to the file, or by SIGHUP, and nothing else).
#[test]
fn a_failed_reload_is_not_retried_in_a_loop() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let late = base.join("late");
    let late_s = late.to_str().unwrap().to_owned();
    let ra = root(&a, "a", "read-only", "auto");
    let mut policy = PolicyFile::new(&format!("{ra}{LIMITS}"));
    let mut live = Live::start(&policy.path);
    policy.replace(&format!(
        "{ra}{}{LIMITS}",
        root(&late, "late", "read-only", "auto")
    ));
    live.expect_log("missing root", |l| l.contains(&late_s));
    let from = live.log_len();
    std::thread::sleep(Duration::from_millis(1500));
    let again = live
        .log_since(from)
        .iter()
        .filter(|l| l.contains(&late_s))
        .count();
    assert!(
        again <= 2,
        "the failed reload was logged {again} more times within 1.5 s of one change: the \
         broker keeps reloading the unchanged policy by itself"
    );
    // Creating the missing directory changes nothing the watcher watches: the old policy
    // stays until the file changes or SIGHUP.
    dir_with_file(&base, "late", "in late");
    live.expect_no_notification(QUIET, "missing directory created, no reload asked for");
    assert_eq!(live.root_names(), ["a"]);
    live.hangup();
    live.expect_list_changed("SIGHUP after the directory appeared");
    assert_eq!(live.root_names(), ["a", "late"]);
}

/// The policy file disappearing (deleted, or renamed away) is a failed load, not "no roots".
#[test]
fn a_deleted_policy_keeps_the_old_one() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let ra = root(&a, "a", "read-only", "auto");
    let policy = PolicyFile::new(&format!("{ra}{LIMITS}"));
    let mut live = Live::start(&policy.path);
    std::fs::remove_file(&policy.path).unwrap();
    live.expect_log("policy deleted", |l| {
        l.to_ascii_lowercase().contains("error") && l.contains("policy.toml")
    });
    live.expect_no_notification(QUIET, "policy deleted");
    assert_eq!(live.read_text("a/f.txt"), "in a");
    // Put back (with a change): picked up again.
    std::fs::write(&policy.path, LIMITS).unwrap();
    live.expect_list_changed("policy recreated without roots");
    assert_eq!(live.root_names(), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// 5. SIGHUP.
// ---------------------------------------------------------------------------------------------

/// A policy reached through a symlink whose target lives in another directory: the target
/// can be changed without touching the directory the watcher watches, so SIGHUP is what
/// reloads it (if a watcher ever follows the link, it may reload first; either is fine, the
/// test then says so on its output).
struct LinkedPolicy {
    _tmp: tempfile::TempDir,
    /// The link the broker is given.
    link: PathBuf,
    real_dir: PathBuf,
    real: PathBuf,
    n: u32,
}

impl LinkedPolicy {
    fn new(text: &str) -> LinkedPolicy {
        let (tmp, dir) = common::tempdir();
        let real_dir = dir.join("dotfiles");
        std::fs::create_dir(&real_dir).unwrap();
        let real = real_dir.join("fsbroker.toml");
        std::fs::write(&real, text).unwrap();
        let link_dir = dir.join("config");
        std::fs::create_dir(&link_dir).unwrap();
        let link = link_dir.join("policy.toml");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        LinkedPolicy {
            _tmp: tmp,
            link,
            real_dir,
            real,
            n: 0,
        }
    }

    /// Replaces the target (a new file renamed over it, in the target's directory).
    fn replace(&mut self, text: &str) {
        self.n += 1;
        let tmp = self.real_dir.join(format!(".new{}", self.n));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.real).unwrap();
    }
}

/// After changing the policy, waits for the reload that SIGHUP asks for (or that a watcher
/// did first) and says which it was.
fn reload_by_sighup(live: &mut Live, what: &str) {
    match live.next_notification(QUIET) {
        Some((_, n)) => {
            assert_eq!(n, list_changed(), "{what}");
            println!("{what}: reloaded by the watcher before SIGHUP");
            live.hangup();
            live.expect_no_notification(QUIET, &format!("{what}: SIGHUP after the reload"));
        }
        None => {
            live.hangup();
            live.expect_list_changed(&format!("{what}: SIGHUP"));
        }
    }
    assert!(live.alive(), "{what}: SIGHUP ended the broker");
}

#[test]
fn sighup_reloads_and_the_broker_keeps_running() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let c = dir_with_file(&base, "c", "in c");
    let late = base.join("late");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "b", "read-only", "auto");
    let rc = root(&c, "c", "read-write", "auto");
    let mut policy = LinkedPolicy::new(&format!("{ra}{rb}{LIMITS}"));
    let mut live = Live::start(&policy.link);

    // SIGHUP with nothing changed: still running, nothing to announce.
    live.hangup();
    live.expect_no_notification(QUIET, "SIGHUP, no change");
    assert!(live.alive(), "SIGHUP ended the broker");
    live.ok("ping", json!({}));
    assert_eq!(live.root_names(), ["a", "b"]);

    // Adding a root.
    policy.replace(&format!("{ra}{rb}{rc}{LIMITS}"));
    reload_by_sighup(&mut live, "c added");
    assert_eq!(live.root_names(), ["a", "b", "c"]);
    assert_eq!(live.read_text("c/f.txt"), "in c");

    // Revoking one, with an upload in progress there.
    live.ok(
        "files/write",
        json!({"path": "c/f.txt", "content": "half", "offset": 0, "final": false}),
    );
    assert_eq!(staging_files(&c).len(), 1);
    policy.replace(&format!("{ra}{rb}{LIMITS}"));
    reload_by_sighup(&mut live, "c removed");
    assert_eq!(live.root_names(), ["a", "b"]);
    live.denied(
        "files/read",
        json!({"path": "c/f.txt"}),
        "outside every root",
    );
    assert_eq!(
        staging_files(&c),
        Vec::<String>::new(),
        "staging file left behind"
    );
    assert_eq!(std::fs::read_to_string(c.join("f.txt")).unwrap(), "in c");

    // A policy that fails to load on SIGHUP: logged, the old one stays, the broker lives.
    let late_s = late.to_str().unwrap().to_owned();
    live.drain_log();
    policy.replace(&format!(
        "{ra}{rb}{}{LIMITS}",
        root(&late, "late", "read-only", "auto")
    ));
    live.hangup();
    live.expect_log("SIGHUP, missing root directory", |l| {
        l.to_ascii_lowercase().contains("error") && l.contains(&late_s)
    });
    live.expect_no_notification(QUIET, "failed load on SIGHUP");
    assert!(live.alive(), "SIGHUP with a broken policy ended the broker");
    assert_eq!(live.root_names(), ["a", "b"]);

    // The directory appears; nothing the broker watches changed, so SIGHUP is what loads it.
    dir_with_file(&base, "late", "in late");
    reload_by_sighup(&mut live, "late directory created");
    assert_eq!(live.root_names(), ["a", "b", "late"]);
    assert_eq!(live.read_text("late/f.txt"), "in late");

    // A burst of signals does not end it either.
    for _ in 0..5 {
        live.hangup();
    }
    live.expect_no_notification(QUIET, "SIGHUP burst, no change");
    assert!(live.alive(), "a burst of SIGHUP ended the broker");
    assert_eq!(live.read_text("a/f.txt"), "in a");
}

/// A policy given as a symlink (dotfile managers do this): editing the file it points to
/// changes the policy, and the watcher must notice (§2 "The policy file is watched").
#[test]
fn editing_the_target_of_a_symlinked_policy_reloads() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "b", "read-only", "auto");
    let policy = LinkedPolicy::new(&format!("{ra}{rb}{LIMITS}"));
    let mut live = Live::start(&policy.link);
    assert_eq!(live.root_names(), ["a", "b"]);

    std::fs::write(&policy.real, format!("{ra}{LIMITS}")).unwrap();
    live.expect_list_changed("the symlinked policy's target edited in place");
    assert_eq!(live.root_names(), ["a"]);
    live.denied(
        "files/read",
        json!({"path": b.join("f.txt")}),
        "outside every root",
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Latency.
// ---------------------------------------------------------------------------------------------

/// Time from the rename of a new policy over the old one to the arrival of list_changed on
/// the server's side, over 10 revocations and restorations. Printed, not asserted (beyond a
/// generous bound): it is the watcher's 50 ms quiet period plus a policy load.
#[test]
fn reload_latency() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "b", "read-only", "auto");
    let with_b = format!("{ra}{rb}{LIMITS}");
    let without_b = format!("{ra}{LIMITS}");
    let mut policy = PolicyFile::new(&with_b);
    let mut live = Live::start(&policy.path);
    let mut ms = Vec::new();
    for i in 0..10 {
        let removing = i % 2 == 0;
        let t0 = policy.replace(if removing { &without_b } else { &with_b });
        let at = live.expect_list_changed(&format!("repetition {i}"));
        let d = at.saturating_duration_since(t0);
        assert!(d < DEADLINE, "repetition {i}: {d:?}");
        ms.push(d.as_secs_f64() * 1000.0);
        if removing {
            assert_eq!(live.root_names(), ["a"]);
            live.denied(
                "files/read",
                json!({"path": b.join("f.txt")}),
                "outside every root",
            );
        } else {
            assert_eq!(live.root_names(), ["a", "b"]);
            assert_eq!(live.read_text("b/f.txt"), "in b");
        }
    }
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = (sorted[4] + sorted[5]) / 2.0;
    println!(
        "revocation latency (rename -> list_changed), {} runs: min {:.1} ms, median {:.1} ms, max {:.1} ms; all: {:?}",
        ms.len(),
        sorted[0],
        median,
        sorted[sorted.len() - 1],
        ms.iter()
            .map(|x| (x * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
}

/// Rule: a reload reaches every session of a shared broker (`serve --listen`): two sessions
/// on its socket each get `notifications/roots/list_changed` once, and each sees the new
/// roots; a file of the removed root is refused to both.
#[test]
fn a_reload_reaches_every_session_of_a_shared_broker() {
    let (_t, base) = common::tempdir();
    let a = dir_with_file(&base, "a", "in a");
    let b = dir_with_file(&base, "b", "in b");
    let ra = root(&a, "a", "read-only", "auto");
    let rb = root(&b, "b", "read-only", "auto");
    let mut policy = PolicyFile::new(&format!("{ra}{rb}{LIMITS}"));
    let pids = common::procs::Pids::default();
    let broker = common::fsb::Listener::start(&policy.path, &base.join("sock"), &[], &pids);
    let mut sessions: Vec<Live> = (0..2)
        .map(|_| Live(Fsb::connect_live(&broker.sock, DEADLINE)))
        .collect();
    for s in &mut sessions {
        assert_eq!(s.root_names(), ["a", "b"]);
        assert_eq!(
            s.ok("files/read", json!({"path": "b/f.txt"}))["content"],
            "in b"
        );
    }
    policy.replace(&format!("{ra}{LIMITS}"));
    for (k, s) in sessions.iter_mut().enumerate() {
        s.expect_list_changed(&format!("session {k}"));
        assert_eq!(s.root_names(), ["a"], "session {k}");
        let e = s.err(
            "files/read",
            json!({"path": b.join("f.txt").to_str().unwrap()}),
        );
        assert_eq!(common::code(&e), "PERMISSION_DENIED", "session {k}: {e}");
        s.expect_no_notification(QUIET, &format!("session {k}: a second notification"));
    }
}

//! What a server can make the broker wait for: locks and leases on files it can read.
//!
//! A confined server may read the audit log, the policy and the consent command's files when
//! they sit in something it is given (docs/security.md says so). Landlock does not stop
//! `flock` on a descriptor opened for reading, nor a lease (`F_SETLEASE`) on a file the user
//! owns. Each test here takes such a lock or lease from another process, as the server would,
//! and checks that the broker goes on: it never waits on a lock it does not own past a
//! deadline, and a policy it cannot read fails closed.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::audit::{log_lines, verify_files};
use common::policy::{PolicyToml, RootToml};
use common::{Fsb, code, python, tempdir};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Takes a lock or lease on a file and holds it until dropped, ignoring the signal that asks
/// a lease holder to let go (`SIGIO`), as a hostile server would.
const HOLDER: &str = r#"
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)
path, kind = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
if kind == "flock":
    fcntl.flock(fd, fcntl.LOCK_EX)
else:
    F_SETLEASE = 1024
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK if kind == "write-lease" else fcntl.F_RDLCK)
print("held", flush=True)
sys.stdin.read()
"#;

struct Held(Child);

impl Held {
    /// Holds `kind` (`flock`, `write-lease`, `read-lease`) on `path` once this returns.
    fn take(path: &Path, kind: &str) -> Held {
        let mut child = Command::new(python())
            .args(["-c", HOLDER])
            .arg(path)
            .arg(kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the lock holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "held",
            "the holder could not take {kind} on {path:?}"
        );
        Held(child)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A root `r` (read-write when `rw`) holding `f.txt`, and `policy.toml` serving it: (temp
/// dir, its path, the root, the policy).
fn root_and_policy(rw: bool) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "hi").unwrap();
    let path = dir.join("policy.toml");
    let table = RootToml::at(&root).name("r");
    PolicyToml::new()
        .root(if rw { table.rw() } else { table })
        .unlimited()
        .write_to(&path);
    (t, dir, root, path)
}

/// `fsbroker serve --policy POLICY`, its answers waited for 10 s at most.
fn serve(policy: &Path) -> Fsb {
    Fsb::start(
        &["serve", "--policy", policy.to_str().unwrap()],
        Duration::from_secs(10),
    )
}

/// The lock brokers take to append to the log at `log` (the user's private runtime
/// directory; see `src/rundir.rs`).
fn broker_lock(log: &Path) -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    let system = PathBuf::from(format!("/run/user/{uid}"));
    let dir = if system.is_dir() {
        system.join("fsbroker")
    } else {
        PathBuf::from(format!("/tmp/fsbroker-{uid}"))
    };
    let canonical = log
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap()
        .join(log.file_name().unwrap());
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("audit-{hex}.lock"))
}

/// A root `r` (read-write) holding `f.txt`, audited, with `timeout_ms` = 1 s; returns (temp
/// dir, its path, the policy, the log, the root).
fn audited_setup() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, PathBuf) {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "before").unwrap();
    let log = dir.join("audit.jsonl");
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("r").rw())
        .unlimited_with("timeout_ms = 1000\n")
        .table("audit", format!("path = {:?}\n", log.to_str().unwrap()))
        .write_to(&dir.join("policy.toml"));
    (t, dir, policy, log, root)
}

/// Rule: a server holding `flock` on the audit log file itself (it may read the log) holds
/// up nothing: the brokers' lock is elsewhere. (It once froze every broker on the log.)
#[test]
fn a_lock_on_the_log_file_holds_up_nothing() {
    let (_t, _dir, policy, log, root) = audited_setup();
    let mut b = serve(&policy);
    b.ok("ping", json!({}));
    let held = Held::take(&log, "flock");
    let started = Instant::now();
    let read = b.ok("files/read", json!({"path": "r/f.txt"}));
    assert_eq!(read["content"], "before");
    b.ok(
        "files/write",
        json!({"path": "r/f.txt", "content": "after"}),
    );
    assert_eq!(
        std::fs::read_to_string(root.join("f.txt")).unwrap(),
        "after"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(held);
    b.close_stdin();
    b.wait_exit(Duration::from_secs(20)).expect("serve exits");
    let (rc, out) = verify_files(&[&log], &[]);
    assert_eq!(rc, 0, "{out}");
    let methods: Vec<String> = log_lines(&log)
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["method"].to_string())
        .collect();
    assert!(
        methods.iter().any(|m| m.contains("files/write")),
        "{methods:?}"
    );
}

/// Rule: when the log cannot take a line before a request's deadline (its lock held past
/// it), the request answers `TIMEOUT` and is not done: a write changes nothing, a read sends
/// no content. The broker answers within the deadline, and takes lines again once the lock
/// is let go.
#[test]
fn a_held_audit_lock_times_out_requests_and_nothing_is_done() {
    let (_t, _dir, policy, log, root) = audited_setup();
    let mut b = serve(&policy);
    b.ok("ping", json!({}));
    let lock = broker_lock(&log);
    assert!(lock.exists(), "the broker's lock is at {lock:?}");
    let held = Held::take(&lock, "flock");
    let started = Instant::now();
    let err = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "after"}),
    );
    assert_eq!(code(&err), "TIMEOUT", "{err}");
    assert_eq!(
        std::fs::read_to_string(root.join("f.txt")).unwrap(),
        "before",
        "a request answered TIMEOUT acted"
    );
    let err = b.err("files/read", json!({"path": "r/f.txt"}));
    assert_eq!(code(&err), "TIMEOUT", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the two requests waited {:?} (deadline 1 s each)",
        started.elapsed()
    );
    // Other sessions' un-audited work was never held up.
    b.ok("ping", json!({}));
    drop(held);
    let read = b.ok("files/read", json!({"path": "r/f.txt"}));
    assert_eq!(read["content"], "before");
    b.close_stdin();
    b.wait_exit(Duration::from_secs(20)).expect("serve exits");
    let (rc, out) = verify_files(&[&log], &[]);
    assert_eq!(rc, 0, "{out}");
}

/// Rule: a lease on the policy file (taken, as a server would, on the file an editor renames
/// into place) cannot delay a reload: the broker cannot read the new policy without waiting,
/// so it withdraws every root at once (fails closed), and puts the new policy in force as
/// soon as it can read it. Before, the reload waited out the kernel's `lease-break-time`
/// (45 s) while the old policy, and the access it granted, stayed in force.
#[test]
fn a_lease_on_the_policy_withdraws_every_root_until_it_is_read() {
    let (_t, dir, root, path) = root_and_policy(true);
    let mut b = serve(&path);
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r", "{roots}");
    // The person's edit: the root becomes read-only and is renamed `r2`. The server leases
    // the new file before it is renamed into place.
    let new = dir.join("policy.toml.new");
    PolicyToml::new()
        .root(RootToml::at(&root).name("r2"))
        .unlimited()
        .write_to(&new);
    let held = Held::take(&new, "write-lease");
    std::fs::rename(&new, &path).unwrap();
    let (_, note) = b
        .next_notification(Duration::from_secs(5))
        .expect("the roots change at once: every root is withdrawn");
    assert_eq!(note["method"], "notifications/roots/list_changed", "{note}");
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"], json!([]), "{roots}");
    let err = b.err("files/write", json!({"path": "r/f.txt", "content": "x"}));
    assert_eq!(code(&err), "PERMISSION_DENIED", "{err}");
    assert!(
        b.log_text().contains("held by another process"),
        "{}",
        b.log_text()
    );
    // The lease goes: the new policy is read and put in force.
    drop(held);
    let (_, note) = b
        .next_notification(Duration::from_secs(5))
        .expect("the new policy is read once the lease is gone");
    assert_eq!(note["method"], "notifications/roots/list_changed", "{note}");
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r2", "{roots}");
    let err = b.err("files/write", json!({"path": "r2/f.txt", "content": "x"}));
    assert_eq!(code(&err), "PERMISSION_DENIED", "{err}");
    assert_eq!(std::fs::read_to_string(root.join("f.txt")).unwrap(), "hi");
}

/// Rule: a lease on the consent command's program (a file a confined server may read) cannot
/// hold a prompt past its `timeout_ms`: `exec` would wait out the lease, so the command is
/// started with the deadline, and a prompt it cannot start in time is a denial.
#[test]
fn a_lease_on_the_consent_command_is_a_denial_in_time() {
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "hi").unwrap();
    let bin_dir = dir.join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let command = bin_dir.join("approve.sh");
    std::fs::write(
        &command,
        "#!/bin/sh\ncat >/dev/null\necho '{\"granted\": true, \"approvedPaths\": []}'\n",
    )
    .unwrap();
    let mut perms = std::fs::metadata(&command).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&command, perms).unwrap();
    let path = PolicyToml::new()
        .root(RootToml::at(&root).name("r").consent("prompt"))
        .unlimited()
        .consent_command(&[&command], "timeout_ms = 1500\n")
        .write_to(&dir.join("policy.toml"));
    let mut b = Fsb::start(
        &["serve", "--policy", path.to_str().unwrap()],
        Duration::from_secs(15),
    );
    b.ok("ping", json!({}));
    let held = Held::take(&command, "write-lease");
    let started = Instant::now();
    let answer = b.request(
        "files/consent",
        json!({"requestedPaths": ["r"], "message": "please"}),
    );
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(6),
        "the prompt waited {waited:?} (timeout 1.5 s): {answer}"
    );
    // Denied: no grant was made, whatever shape the answer takes.
    let read = b.request("files/read", json!({"path": "r/f.txt"}));
    assert!(read.get("error").is_some(), "{read}");
    drop(held);
}

/// Rule: a confined server whose root is revoked is cut off at once, lease or not: the
/// server takes a lease on the new policy before the editor renames it into place, and the
/// proxy still ends it (the held policy withdraws every root). Before, it kept its revoked
/// access for the kernel's whole `lease-break-time` (45 s).
#[test]
fn a_lease_on_the_policy_does_not_delay_a_confined_servers_revocation() {
    use common::confine::{Fixture, wait_ended};
    let fx = Fixture::new();
    let policy = fx.policy("");
    let (mut proxy, _line) =
        fx.start_with("--confine", &policy, &json!([]), &[("PROBE_STAY", "1")]);
    let new = fx.dir.join("policy.toml.new");
    PolicyToml::new()
        .root(RootToml::at(&fx.dir.join("ro")))
        .write_to(&new);
    let held = Held::take(&new, "write-lease");
    let revoked = Instant::now();
    std::fs::rename(&new, &policy).unwrap();
    let status = wait_ended(&mut proxy);
    let took = revoked.elapsed();
    drop(held);
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(
        took < Duration::from_secs(10),
        "the server kept its access for {took:?}"
    );
    eprintln!("confined server ended {took:?} after the revocation, lease held");
}

/// Rule: touching the policy file (anyone who can name it can set its times) reloads nothing,
/// and a lease on a policy file that has not changed since it was read withdraws nothing:
/// only a change the broker cannot read fails closed. (A server that could read the policy
/// could otherwise take a lease, touch the file, and withdraw every root of every broker on
/// that policy.)
#[test]
fn a_touch_of_a_leased_policy_withdraws_nothing() {
    let (_t, _dir, _root, path) = root_and_policy(false);
    let mut b = serve(&path);
    b.ok("ping", json!({}));
    let held = Held::take(&path, "write-lease");
    for secs in [1_000_000_000, 1_100_000_000] {
        let t = rustix::fs::Timespec {
            tv_sec: secs,
            tv_nsec: 0,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            &path,
            &rustix::fs::Timestamps {
                last_access: t,
                last_modification: t,
            },
            rustix::fs::AtFlags::empty(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        b.next_notification(Duration::from_secs(2)).is_none(),
        "a touch changed the roots"
    );
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r", "{roots}");
    assert_eq!(
        b.ok("files/read", json!({"path": "r/f.txt"}))["content"],
        "hi"
    );
    drop(held);
}

//! Starting up, many at once, on the real binary: confined proxies started at the same moment
//! (a desktop host starting all its servers) each get their private temporary directory, and a
//! start clears what killed proxies left but nothing another proxy still uses or is still
//! making; a shared broker's socket accepts a connection from the moment its path exists.
//!
//! One file though long: every test starts brokers or proxies at once under the same
//! `LD_PRELOAD` shim that holds the race windows open.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use common::confine::{Fixture, results};
use common::fsb::{Cmd, Fsb, Listener};
use common::procs::{Pids, kill_group, within};
use common::{bin, tempdir};
use serde_json::{Value, json};

/// The start of the name of a confined server's private temporary directory.
const PREFIX: &str = "fsbroker-server-";

/// The start of the name a proxy makes its directory under, before it is locked and renamed
/// to a [`PREFIX`] name.
const STAGING: &str = "fsbroker-staging-";

/// What is in `dir`, by name.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The private directory a probe's `["tmpdir"]` reported, checked to be a fresh one in `base`.
fn private_dir(result: &str, base: &Path) -> PathBuf {
    let dir = PathBuf::from(result.strip_prefix("ok:").unwrap_or_else(|| {
        panic!("the server could not write its TMPDIR: {result}");
    }));
    assert_eq!(dir.parent(), Some(base), "{}", dir.display());
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(PREFIX),
        "{}",
        dir.display()
    );
    dir
}

/// Rule: confined proxies started at the same moment all start. Each one's start clears the
/// directories killed proxies left in the temporary directory; it must never take the
/// directory another proxy has just made and not yet locked (that proxy then failed with
/// "cannot make the server's temporary directory: No such file or directory"). Ten at once,
/// five rounds, in a TMPDIR of the test's own.
#[test]
fn confined_proxies_started_at_once_all_start() {
    const AT_ONCE: usize = 10;
    const ROUNDS: usize = 5;
    let fx = Fixture::new();
    let policy = fx.policy("");
    let (_t, base) = tempdir();
    let pids = Pids::default();
    within(Duration::from_secs(300), &pids, move |pids| {
        let mut failed = Vec::new();
        for round in 0..ROUNDS {
            let barrier = Arc::new(Barrier::new(AT_ONCE));
            let starts: Vec<_> = (0..AT_ONCE)
                .map(|_| {
                    let barrier = Arc::clone(&barrier);
                    let mut cmd = Command::new(bin());
                    cmd.args(["proxy", "--policy"])
                        .arg(&policy)
                        .args(["--confine", "--", "python3"])
                        .arg(fx.dir.join("srv/probe.py"))
                        .env("PROBE", json!([["tmpdir"]]).to_string())
                        .env("TMPDIR", &base)
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped());
                    let pids = pids.clone();
                    std::thread::spawn(move || {
                        barrier.wait();
                        let child = cmd.spawn().expect("start fsbroker proxy --confine");
                        pids.add(child.id());
                        child.wait_with_output().unwrap()
                    })
                })
                .collect();
            let mut dirs = Vec::new();
            for start in starts {
                let out = start.join().unwrap();
                if !out.status.success() {
                    failed.push(format!(
                        "round {round}: {}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                    continue;
                }
                dirs.push(private_dir(&results(&out)[0], &base));
            }
            let before = dirs.len();
            dirs.sort();
            dirs.dedup();
            assert_eq!(dirs.len(), before, "two servers shared a directory");
            assert_eq!(
                names(&base),
                Vec::<String>::new(),
                "round {round}: every proxy removes its own directory when it ends"
            );
        }
        assert!(
            failed.is_empty(),
            "{} of {} confined starts failed:\n{}",
            failed.len(),
            AT_ONCE * ROUNDS,
            failed.join("\n")
        );
    });
}

/// Rule: a start removes what is abandoned in the temporary directory, and only that: the
/// directory of a proxy killed outright, one made by hand with the prefix and never locked, a
/// staging directory left long ago by a proxy killed while making its own; it never removes the
/// directory of a running proxy, a staging directory just made (its proxy may be about to lock
/// it), a link with the prefix (nor what it points to), or a file with the prefix.
#[test]
fn a_start_removes_what_killed_proxies_left_and_nothing_else() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let (_t, base) = tempdir();
    let base_env = base.to_str().unwrap().to_owned();

    // A proxy killed outright (SIGKILL): its directory stays, unlocked.
    let (mut killed, line) = fx.start(
        &policy,
        &json!([["tmpdir"], ["pid"]]),
        &[("TMPDIR", &base_env), ("PROBE_STAY", "1")],
    );
    let r: Vec<String> = serde_json::from_str::<Value>(&line).unwrap()["params"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let killed_dir = private_dir(&r[0], &base);
    let server = r[1].strip_prefix("ok:").unwrap().to_owned();
    killed.kill_now();
    let end = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(format!("/proc/{server}/stat"))
        .is_ok_and(|s| !s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
    {
        assert!(Instant::now() < end, "the killed proxy's server lives on");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        killed_dir.join("t").exists(),
        "a killed proxy cannot clean up"
    );

    // A running proxy, holding its directory.
    let (mut running, line) = fx.start(
        &policy,
        &json!([["tmpdir"]]),
        &[("TMPDIR", &base_env), ("PROBE_STAY", "1")],
    );
    let v: Value = serde_json::from_str(&line).unwrap();
    let running_dir = private_dir(v["params"]["results"][0].as_str().unwrap(), &base);

    // By hand: an abandoned directory with a tree in it, staging directories old and new, and
    // things with the prefix that are not directories of ours.
    let (_o, outside) = tempdir();
    std::fs::write(outside.join("kept.txt"), "kept").unwrap();
    let by_hand = base.join(format!("{PREFIX}1-byhand"));
    std::fs::create_dir_all(by_hand.join("a/b/c")).unwrap();
    std::fs::write(by_hand.join("a/b/c/f"), "x").unwrap();
    std::os::unix::fs::symlink(&outside, by_hand.join("a/out")).unwrap();
    let old_staging = base.join(format!("{STAGING}1-old"));
    std::fs::create_dir(&old_staging).unwrap();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::open(&old_staging)
        .unwrap()
        .set_modified(an_hour_ago)
        .unwrap();
    // Made just now: its proxy may be between making and locking it.
    let new_staging = base.join(format!("{STAGING}1-new"));
    std::fs::create_dir(&new_staging).unwrap();
    let link = base.join(format!("{PREFIX}1-link"));
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    let file = base.join(format!("{PREFIX}1-file"));
    std::fs::write(&file, "a file").unwrap();

    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &json!([["tmpdir"]]),
        &[("TMPDIR", &base_env)],
    );
    assert!(out.status.success(), "{out:?}");
    private_dir(&results(&out)[0], &base);

    assert!(!killed_dir.exists(), "the killed proxy's directory is left");
    assert!(!by_hand.exists(), "the abandoned directory is left");
    assert!(!old_staging.exists(), "the old staging directory is left");
    assert!(
        running_dir.join("t").exists(),
        "a running proxy's directory"
    );
    assert!(new_staging.exists(), "a staging directory just made");
    assert!(link.symlink_metadata().unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a file");
    assert_eq!(
        std::fs::read_to_string(outside.join("kept.txt")).unwrap(),
        "kept"
    );

    // The running proxy's own end removes its directory.
    running.close_stdin();
    let status = common::confine::wait_ended(&mut running);
    assert!(status.success(), "{status:?}");
    assert!(!running_dir.exists(), "the proxy removes its directory");
}

/// `fsbroker serve --listen SOCK --root ROOT` in a process group of its own, with `env`; not
/// waited for (the moment its socket appears is what these tests look at).
fn serve_listen(sock: &Path, root: &Path, env: &[(&str, &Path)], pids: &Pids) -> Listener {
    let mut cmd = Cmd::new(&["--root".as_ref(), root.as_os_str()]).pids(pids);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    Listener::spawn(sock, cmd)
}

/// [`serve_listen`] held by the shim between `bind` and `listen`: returns the broker, the
/// file the shim makes once bound (`at`), and the gate file that lets it go on.
fn serve_listen_held(
    sock: &Path,
    root: &Path,
    shim: &Path,
    gates: &Path,
    pids: &Pids,
) -> (Listener, PathBuf, PathBuf) {
    let at = gates.join("bound");
    let gate = gates.join("gate");
    let broker = serve_listen(
        sock,
        root,
        &[
            ("LD_PRELOAD", shim),
            ("SHIM_LISTEN_AT", &at),
            ("SHIM_LISTEN_GATE", &gate),
        ],
        pids,
    );
    (broker, at, gate)
}

/// Waits, spinning (no sleep: the moment matters), for something to exist at `sock`; panics
/// if the broker exits first or nothing comes within 20 s.
fn spin_until_exists(sock: &Path, broker: &mut Listener) {
    let end = Instant::now() + Duration::from_secs(20);
    let mut spins = 0u32;
    while std::fs::symlink_metadata(sock).is_err() {
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 {
            if let Some(status) = broker.exited() {
                panic!("serve --listen exited before its socket appeared: {status}");
            }
            assert!(Instant::now() < end, "no socket at {}", sock.display());
        }
    }
}

/// Connects the moment `sock` exists; `Err` with what went wrong, else a `ping` and a
/// `roots/list` must be answered.
fn connect_at_once(sock: &Path, broker: &mut Listener) -> Result<(), String> {
    spin_until_exists(sock, broker);
    let stream = match UnixStream::connect(sock) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
            return Err(format!(
                "connect refused ({e}): the socket was not listening"
            ));
        }
        Err(e) => return Err(format!("connect: {e}")),
    };
    let meta = std::fs::symlink_metadata(sock).unwrap();
    assert!(meta.file_type().is_socket());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "owner-only");
    let mut c = Fsb::from_stream(stream);
    assert_eq!(c.ok("ping", json!({})), json!({}));
    let roots = c.ok("roots/list", json!({}));
    assert_eq!(roots["roots"].as_array().map(Vec::len), Some(1), "{roots}");
    Ok(())
}

/// Rule: a shared broker's socket path exists only once the broker listens on it, so a proxy
/// (or host) that starts the moment it appears is served, never refused. Thirty fresh brokers,
/// each connected to the instant its socket appears.
#[test]
fn a_socket_that_exists_accepts() {
    const BROKERS: usize = 30;
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let pids = Pids::default();
    within(Duration::from_secs(300), &pids, move |pids| {
        let mut refused = Vec::new();
        for i in 0..BROKERS {
            let sock = dir.join(format!("b{i}.sock"));
            let mut broker = serve_listen(&sock, &root, &[], &pids);
            if let Err(e) = connect_at_once(&sock, &mut broker) {
                refused.push(format!("broker {i}: {e}"));
            }
            drop(broker);
            let _ = std::fs::remove_file(&sock);
        }
        assert!(
            refused.is_empty(),
            "{} of {BROKERS} connects made as the socket appeared failed:\n{}",
            refused.len(),
            refused.join("\n")
        );
        assert_eq!(
            names(&dir),
            ["root"],
            "nothing else is left: no temporary names"
        );
    });
}

/// A shared library for `LD_PRELOAD` that holds the broker or proxy at the moment a race
/// needs, until the test opens a gate (creates a file): the binary's own code runs unchanged,
/// and no timing decides anything. `listen(2)`, when `$SHIM_LISTEN_AT` and `$SHIM_LISTEN_GATE`
/// are set, first creates the file `$SHIM_LISTEN_AT` (the socket is bound: its file exists
/// under some name) and waits for `$SHIM_LISTEN_GATE`. `mkdir(2)` of a name starting with
/// `fsbroker-`, when `$SHIM_MKDIR_GATE` is set, makes the directory and then waits for the
/// gate (the directory exists, not yet locked). Built with the C compiler Rust links with.
fn shim(dir: &Path) -> PathBuf {
    let src = dir.join("shim.c");
    std::fs::write(
        &src,
        r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void hold(const char *gate) {
    struct timespec tick = {0, 5000000};
    while (access(gate, F_OK) != 0)
        nanosleep(&tick, 0);
}

int listen(int fd, int backlog) {
    int (*real)(int, int) = (int (*)(int, int))dlsym(RTLD_NEXT, "listen");
    const char *at = getenv("SHIM_LISTEN_AT"), *gate = getenv("SHIM_LISTEN_GATE");
    if (at && gate) {
        int m = open(at, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (m >= 0)
            close(m);
        hold(gate);
    }
    return real(fd, backlog);
}

int mkdir(const char *path, mode_t mode) {
    int (*real)(const char *, mode_t) = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
    int r = real(path, mode);
    const char *gate = getenv("SHIM_MKDIR_GATE");
    const char *name = strrchr(path, '/');
    name = name ? name + 1 : path;
    if (r == 0 && gate && strncmp(name, "fsbroker-", 9) == 0)
        hold(gate);
    return r;
}
"#,
    )
    .unwrap();
    let lib = dir.join("shim.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("cc (the C compiler Rust links with) is needed by this test");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// Waits (at most 20 s) for `cond`, failing with `what` if the process `exited` first.
fn wait_for(
    what: &str,
    mut exited: impl FnMut() -> Option<ExitStatus>,
    mut cond: impl FnMut() -> bool,
) {
    let end = Instant::now() + Duration::from_secs(20);
    while !cond() {
        if let Some(status) = exited() {
            panic!("exited ({status}) while waiting for {what}");
        }
        assert!(Instant::now() < end, "no {what} within 20 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rule: a confined proxy's directory is never taken from it between its `mkdir` and its
/// lock. A proxy is held right after its `mkdir`; meanwhile another proxy starts and ends (and
/// clears the temporary directory as it starts); the first then goes on and must start.
/// Then the same with the held proxy's new directory aged past the grace clean-up gives a
/// directory nobody has locked (as if the proxy had stalled a long time there): clean-up
/// takes it, and the proxy starts over under a fresh name instead of failing.
#[test]
fn a_directory_being_made_is_not_taken_by_another_start() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let (_t, base) = tempdir();
    let (_s, gates) = tempdir();
    let shim = shim(&gates);
    let base_env = base.to_str().unwrap().to_owned();
    for aged in [false, true] {
        let gate = gates.join(format!("gate-{aged}"));
        let mut held = Command::new(bin())
            .args(["proxy", "--policy"])
            .arg(&policy)
            .args(["--confine", "--", "python3"])
            .arg(fx.dir.join("srv/probe.py"))
            .env("PROBE", json!([["tmpdir"]]).to_string())
            .env("TMPDIR", &base)
            .env("LD_PRELOAD", &shim)
            .env("SHIM_MKDIR_GATE", &gate)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for(
            "the held proxy's directory",
            || held.try_wait().unwrap(),
            || names(&base).iter().any(|n| n.starts_with("fsbroker-")),
        );
        let made = base.join(&names(&base)[0]);
        if aged {
            let long_ago = SystemTime::now() - Duration::from_secs(3600);
            std::fs::File::open(&made)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }

        let other = fx.run(
            &["--policy", policy.to_str().unwrap(), "--confine"],
            &json!([["tmpdir"]]),
            &[("TMPDIR", &base_env)],
        );
        let kept = made.exists();
        // Let the held proxy go on before anything is asserted: it then ends by itself.
        std::fs::write(&gate, "").unwrap();
        let pid = held.id();
        let out = common::with_deadline(
            Duration::from_secs(60),
            move || kill_group(pid),
            move || held.wait_with_output().unwrap(),
        );
        assert!(other.status.success(), "the other start: {other:?}");
        assert_eq!(
            kept, !aged,
            "a directory being made is kept, one long abandoned is removed"
        );
        assert!(
            out.status.success(),
            "the proxy held while making its directory (aged {aged}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        private_dir(&results(&out)[0], &base);
        assert_eq!(names(&base), Vec::<String>::new(), "nothing is left");
    }
}

/// Rule: the same, with the broker held between `bind` and `listen` (as a loaded machine may
/// hold it): while it is not listening, nothing is at the socket's path; the socket under its
/// temporary name is owner-only already; once it listens the path appears and is served; and
/// no temporary name is left.
#[test]
fn a_socket_appears_only_once_it_listens() {
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let (_g, gates) = tempdir();
    let shim = shim(&gates);
    let pids = Pids::default();
    within(Duration::from_secs(120), &pids, move |pids| {
        let sock = dir.join("held.sock");
        let (mut broker, at, gate) = serve_listen_held(&sock, &root, &shim, &gates, &pids);
        wait_for("the broker to bind", || broker.exited(), || at.exists());
        if sock.symlink_metadata().is_ok() {
            let why = match UnixStream::connect(&sock) {
                Ok(_) => "it connected (to what?)".to_owned(),
                Err(e) => e.to_string(),
            };
            panic!("the socket's path exists before the broker listens; a connect now: {why}");
        }
        use std::os::unix::fs::PermissionsExt;
        for name in names(&dir) {
            let meta = dir.join(&name).symlink_metadata().unwrap();
            if meta.file_type().is_socket() {
                assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
            }
        }
        std::fs::write(&gate, "").unwrap();
        connect_at_once(&sock, &mut broker).unwrap();
        drop(broker);
        std::fs::remove_file(&sock).unwrap();
        assert_eq!(
            names(&dir),
            ["root"],
            "nothing else is left: no temporary names"
        );
    });
}

/// Rule: two brokers started on one path at the same moment: the one that listens first
/// serves it; the other neither replaces it nor runs on unreachable, it exits saying the path
/// is taken, and leaves nothing behind. (Before, the first one's socket existed before it
/// listened, the second took it for stale, removed it and bound its own, and the first ran
/// on listening at a name that no longer existed.)
#[test]
fn two_brokers_on_one_path_one_serves_the_other_says_so() {
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let (_g, gates) = tempdir();
    let shim = shim(&gates);
    let pids = Pids::default();
    within(Duration::from_secs(120), &pids, move |pids| {
        let sock = dir.join("one.sock");
        let (mut held, at, gate) = serve_listen_held(&sock, &root, &shim, &gates, &pids);
        wait_for("the held broker to bind", || held.exited(), || at.exists());
        let mut first = serve_listen(&sock, &root, &[], &pids);
        connect_at_once(&sock, &mut first).unwrap();
        std::fs::write(&gate, "").unwrap();
        let end = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = held.exited() {
                break status;
            }
            assert!(
                Instant::now() < end,
                "the second broker on the path runs on, listening at a name that is gone"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(!status.success(), "the second broker on the path exits");
        // The first still serves the path.
        let mut c = Fsb::connect(&sock);
        assert_eq!(c.ok("ping", json!({})), json!({}));
        drop(c);
        drop(first);
        std::fs::remove_file(&sock).unwrap();
        assert_eq!(
            names(&dir),
            ["root"],
            "nothing else is left: no temporary names"
        );
    });
}

/// Rule: `--listen "$XDG_RUNTIME_DIR/fsbroker.sock"` with the variable unset is
/// `--listen /fsbroker.sock`: refused at once, saying why, with nothing made in `/`. Before,
/// the broker listened there (as root) or failed with a bare permission error.
#[test]
fn a_socket_directly_in_the_root_is_refused_with_why() {
    let (_t, dir) = tempdir();
    let name = format!("fsbroker-test-{}.sock", std::process::id());
    let sock = Path::new("/").join(&name);
    let mut child = Command::new(bin())
        .args(["serve", "--root", dir.to_str().unwrap(), "--listen"])
        .arg(&sock)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&sock);
            panic!("the broker listened at {}", sock.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("XDG_RUNTIME_DIR") && stderr.contains(&name),
        "{stderr}"
    );
    assert!(!sock.exists(), "{}", sock.display());
}

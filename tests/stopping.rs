//! A broker that stops seals its audit log, whatever its peer does (docs/protocol.md, audit
//! log, "Stopping" and "Seals"), through the real binary.
//!
//! - The proxy ends its own server as the MCP stdio transport's shutdown says a client should:
//!   its stdin closed, then SIGTERM, then SIGKILL. A server that ignores SIGTERM and the end of
//!   its input (the stubborn one here) cannot keep the proxy running after the host closed its
//!   stdin, nor make a proxy stopped by SIGTERM exit without sealing its log.
//! - A stopping broker abandons server-driven work that has not committed: recursive watches
//!   of a huge tree, pipelined, whose registrations and walks would take many seconds, are
//!   answered `TIMEOUT` instead of outliving the stop's grace.
//!
//! The bounds below are hang guards, not timing thresholds: a broker that does not end, or
//! ends unsealed, fails; how fast it ends is not measured.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::audit::verify_files;
use common::fsb::{Cmd, Fsb, Got, Listener, Log};
use common::kit::inotify_watches;
use common::procs::{Pids, within};
use common::{PolicyToml, RootToml, python, tempdir};

/// Longest a whole test may run before its processes are killed and it fails.
const TEST_DEADLINE: Duration = Duration::from_secs(120);
/// Longest wait for a broker to exit once told to stop (hang guard: the proxy's own sequence
/// takes about 3 s after a signal, 11 s after the host's EOF alone; a stopping `serve` well
/// under its 5 s grace).
const EXIT_BOUND: Duration = Duration::from_secs(30);
/// Longest wait for the stubborn server to say it is running, or for the huge watches to
/// begin.
const START_BOUND: Duration = Duration::from_secs(30);

/// A server that ignores SIGTERM, SIGINT and SIGHUP, reads its stdin to the end and then stays
/// (a minute: the test kills what is left of it). It names itself on stderr.
const STUBBORN: &str = r#"
import os, signal, sys, time
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
sys.stderr.write("stubborn-server pid %d\n" % os.getpid())
sys.stderr.flush()
for line in sys.stdin:
    pass
deadline = time.time() + 60
while time.time() < deadline:
    time.sleep(0.2)
"#;

/// `fsbroker ARGS...` as the live driver ([`Fsb::start`]: stdout and stderr read by threads,
/// stderr echoed), registered with `pids`.
fn start<S: AsRef<OsStr>>(args: &[S], pids: &Pids) -> Fsb {
    Cmd::new(args)
        .env("RUST_LOG", "fsbroker=info")
        .log(Log::Keep)
        .ahead()
        .deadline(EXIT_BOUND)
        .pids(pids)
        .spawn()
}

/// The stubborn server's pid, from the proxy's stderr (the server's own, inherited or
/// copied), within [`START_BOUND`].
fn server_pid(proxy: &mut Fsb) -> u32 {
    let end = Instant::now() + START_BOUND;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let Some(line) = proxy.next_log_line(left) else {
            panic!("the stubborn server did not start within {START_BOUND:?}");
        };
        if let Some(pid) = line
            .split("stubborn-server pid ")
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
        {
            return pid;
        }
    }
}

/// The exit status within [`EXIT_BOUND`]; panics, naming `what`, when it does not exit.
fn exit(p: &mut Fsb, what: &str) -> ExitStatus {
    p.wait_exit(EXIT_BOUND)
        .unwrap_or_else(|| panic!("{what}: fsbroker still running {EXIT_BOUND:?} later"))
}

/// Whether the stubborn server `pid` is still running (a zombie, or a number given to another
/// process, is not it).
fn stubborn_alive(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("stubborn.py"))
}

/// Kills the stubborn server if a broken proxy left it running.
struct Leftover(u32);

impl Drop for Leftover {
    fn drop(&mut self) {
        if stubborn_alive(self.0) {
            let pid = rustix::process::Pid::from_raw(self.0 as i32).unwrap();
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// How the host ends the proxy.
#[derive(Clone, Copy, Debug)]
enum HostStop {
    /// Closes the proxy's stdin.
    Eof,
    /// Sends the proxy SIGTERM (its stdin stays open).
    Term,
    /// Closes the proxy's stdin, then sends it SIGTERM (what the MCP SDKs do to a server that
    /// has not exited 2 s after its stdin closed).
    EofThenTerm,
}

/// `fsbroker proxy --audit LOG [--confine] -- python3 stubborn.py`, stopped by the host as
/// `how` says: the proxy exits within the hang guard with its server's code (SIGKILL: 137, as
/// the server ignores SIGTERM), the server is gone, and the log verifies sealed (exit 0).
fn proxy_ends_a_stubborn_server(confine: bool, how: HostStop) {
    let pids = Pids::default();
    within(TEST_DEADLINE, &pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f.txt"), "hello").unwrap();
        // The script in a folder of its own: a confined server may read it, and nothing else
        // of the test's.
        std::fs::create_dir(dir.join("srv")).unwrap();
        let script = dir.join("srv/stubborn.py");
        std::fs::write(&script, STUBBORN).unwrap();
        let log = dir.join("audit.jsonl");
        let mut args: Vec<&OsStr> = vec![
            "proxy".as_ref(),
            "--root".as_ref(),
            root.as_os_str(),
            "--audit".as_ref(),
            log.as_os_str(),
        ];
        if confine {
            args.push("--confine".as_ref());
        }
        args.extend(["--".as_ref(), python().as_ref(), script.as_os_str()]);
        let mut proxy = start(&args, &pids);
        let server = server_pid(&mut proxy);
        pids.add(server);
        let _leftover = Leftover(server);
        let what = format!("{how:?}, confine {confine}");
        match how {
            HostStop::Eof => proxy.close_stdin(),
            HostStop::Term => proxy.signal(rustix::process::Signal::TERM),
            HostStop::EofThenTerm => {
                proxy.close_stdin();
                proxy.signal(rustix::process::Signal::TERM);
            }
        }
        let status = exit(&mut proxy, &what);
        assert!(
            !stubborn_alive(server),
            "{what}: the server outlived the proxy"
        );
        let (code, out) = verify_files(&[&log], &[]);
        assert_eq!(code, 0, "{what}: the run's log is not sealed: {out}");
        assert_eq!(
            status.code(),
            Some(128 + libc::SIGKILL),
            "{what}: the proxy exits with its server's code ({status})"
        );
    })
}

/// Rule: a host that closes the proxy's stdin ends the proxy even when its server ignores the
/// end of its input and SIGTERM: the proxy closes the server's stdin, then (10 s later) sends
/// SIGTERM, then SIGKILL; it exits, with the server gone, and its log sealed. (Before, the
/// proxy ran as long as the server did.)
#[test]
fn host_eof_ends_a_stubborn_server() {
    proxy_ends_a_stubborn_server(false, HostStop::Eof);
}

/// Rule: the same for a confined server (`--confine`, a process group of its own).
#[test]
fn host_eof_ends_a_stubborn_confined_server() {
    proxy_ends_a_stubborn_server(true, HostStop::Eof);
}

/// Rule: SIGTERM to the proxy ends a server that ignores SIGTERM within the stop's grace, so
/// the proxy still seals its log. (Before, the proxy waited out the grace for its server and
/// exited 143 unsealed: `audit verify` reported a crash that never happened.)
#[test]
fn sigterm_ends_a_stubborn_server_and_seals() {
    proxy_ends_a_stubborn_server(false, HostStop::Term);
}

/// Rule: the same for a confined server.
#[test]
fn sigterm_ends_a_stubborn_confined_server_and_seals() {
    proxy_ends_a_stubborn_server(true, HostStop::Term);
}

/// Rule: the same when the host first closes the proxy's stdin, then sends SIGTERM.
#[test]
fn host_eof_then_sigterm_ends_a_stubborn_server_and_seals() {
    proxy_ends_a_stubborn_server(false, HostStop::EofThenTerm);
}

/// Directories in the huge tree: `TOP` folders of `INNER` folders each, plus the `TOP`
/// (100,000: as many as a watch's snapshot holds).
const TOP: usize = 400;
const INNER: usize = 249;
/// Recursive watches of the whole tree, pipelined.
const WATCHES: u64 = 6;

/// The huge tree at `root`.
fn build_tree(root: &Path) {
    for i in 0..TOP {
        let top = root.join(format!("d{i:03}"));
        std::fs::create_dir(&top).unwrap();
        for j in 0..INNER {
            std::fs::create_dir(top.join(format!("e{j:03}"))).unwrap();
        }
    }
}

/// Waits (at most [`START_BOUND`]) until broker `pid` has begun registering the watches: it
/// holds more inotify watches than `before`, what it held once it served (its policy
/// watcher's).
fn wait_registering(pid: u32, before: usize) {
    let end = Instant::now() + START_BOUND;
    while inotify_watches(pid) <= before {
        assert!(
            Instant::now() < end,
            "the watches did not begin within {START_BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Each answer is a watch made, or `TIMEOUT` (abandoned by the stop: "not done").
fn check_answers(answers: &[Value]) {
    for a in answers {
        let ok =
            a["result"]["watchId"].is_string() || a["error"]["data"]["code"] == json!("TIMEOUT");
        assert!(ok, "a watch neither made nor abandoned: {a}");
    }
}

/// A temp dir with the huge tree as root `r` (consent auto) and a policy auditing to
/// `audit.jsonl` beside it: (temp dir, the tree, the policy, the log).
fn huge_tree() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let (t, dir) = tempdir();
    let tree = dir.join("tree");
    std::fs::create_dir(&tree).unwrap();
    build_tree(&tree);
    let log = dir.join("audit.jsonl");
    let policy = PolicyToml::new()
        .root(RootToml::at(&tree).name("r"))
        .unlimited()
        .audit(&log, "")
        .write_to(&dir.join("policy.toml"));
    (t, tree, policy, log)
}

/// Rule: a stopping broker does not wait for watches it has not made: `serve` (stdio, then
/// `--listen`) with recursive watches of a 100,000-directory tree pipelined, told to stop
/// (SIGTERM) while it registers them, answers them `TIMEOUT` (or made), exits 0 and seals
/// its log. (Before, the registrations and the walks of the tree outlived the 5 s grace:
/// exit 143, the log unsealed.) The two brokers run one after the other, so their inotify
/// watches never add up past the user's limit.
#[test]
fn sigterm_abandons_pipelined_huge_watches_and_seals() {
    let pids = Pids::default();
    within(TEST_DEADLINE, &pids, move |pids| {
        let (_t, tree, policy, log) = huge_tree();
        let path = tree.to_str().unwrap().to_owned();

        // stdio
        let mut broker = start(
            &["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()],
            &pids,
        );
        // Serving (its policy watcher is set up before it serves): what it watches now is
        // not the tree.
        broker.ping("up");
        let before = inotify_watches(broker.pid());
        for id in 1..=WATCHES {
            broker.send_request(
                &json!(id),
                "files/watch",
                json!({"path": path, "recursive": true}),
            );
        }
        wait_registering(broker.pid(), before);
        broker.signal(rustix::process::Signal::TERM);
        let status = exit(&mut broker, "serve, SIGTERM during huge watches");
        check_answers(&broker.messages_until_closed(EXIT_BOUND));
        let (code, out) = verify_files(&[&log], &[]);
        assert_eq!(code, 0, "serve: the run's log is not sealed: {out}");
        assert_eq!(status.code(), Some(0), "serve: {status}");
        drop(broker);

        // serve --listen
        std::fs::remove_file(&log).unwrap();
        let sock = policy.with_file_name("broker.sock");
        let mut listener = Listener::start(&policy, &sock, &[], &pids);
        let mut conn = listener.connect();
        conn.ping("up");
        let before = inotify_watches(listener.pid());
        for _ in 0..WATCHES {
            conn.send("files/watch", json!({"path": path, "recursive": true}));
        }
        wait_registering(listener.pid(), before);
        let status = listener.terminate(EXIT_BOUND);
        let mut answers = Vec::new();
        loop {
            match conn.next(EXIT_BOUND) {
                Got::Line(m) => answers.push(m),
                Got::Eof => break,
                Got::Timeout => panic!("serve --listen: the connection is still open"),
            }
        }
        check_answers(&answers);
        let (code, out) = verify_files(&[&log], &[]);
        assert_eq!(
            code, 0,
            "serve --listen: the run's log is not sealed: {out}"
        );
        assert_eq!(status.code(), Some(0), "serve --listen: {status}");
        drop(conn);
        drop(listener);

        // stdio, with slow listings pipelined instead: work queued for the pool, or walking
        // the tree, when the stop comes answers TIMEOUT at once.
        std::fs::remove_file(&log).unwrap();
        let mut broker = start(
            &["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()],
            &pids,
        );
        for id in 1..=LISTINGS {
            broker.send_request(
                &json!(id),
                "files/list",
                json!({"path": path, "recursive": true}),
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        broker.signal(rustix::process::Signal::TERM);
        let status = exit(&mut broker, "serve, SIGTERM during huge listings");
        for a in broker.messages_until_closed(EXIT_BOUND) {
            let ok =
                a["result"]["entries"].is_array() || a["error"]["data"]["code"] == json!("TIMEOUT");
            assert!(ok, "a listing neither done nor abandoned: {a}");
        }
        let (code, out) = verify_files(&[&log], &[]);
        assert_eq!(code, 0, "serve: the run's log is not sealed: {out}");
        assert_eq!(status.code(), Some(0), "serve: {status}");
    })
}

/// Recursive listings of the whole tree, pipelined (as many as a session may have in flight).
const LISTINGS: u64 = 64;

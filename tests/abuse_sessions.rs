//! Sessions of a shared broker (`serve --listen`) that must not hold up the others: three
//! attacks, through the real binary over real Unix sockets:
//! - connections that half-close and stop reading must not freeze the other sessions (their
//!   writers are awaited, not joined on an async worker);
//! - a connection that sent one over-long line must not keep its share of the shared input
//!   budget (`max_pending_input`) while it sits idle;
//! - consent prompts nobody answers must not hold the blocking pool: other sessions' reads
//!   stay fast, and each prompt request is answered by its deadline.
//!
//! Every test runs under a deadline; past it the broker's process group (the broker and any
//! consent command it started) is killed and the test fails.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::{Fsb, Got, Listener};
use common::procs::Pids;
use common::{PolicyToml, RootToml, code, python, request_line, tempdir, write_policy};

/// Longest any one test may run before its processes are killed and it fails.
const TEST_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs a test body under [`TEST_DEADLINE`]; past it, the test's brokers (and their process
/// groups) are killed.
fn within<T: Send + 'static>(pids: &Pids, f: impl FnOnce(Pids) -> T + Send + 'static) -> T {
    common::procs::within(TEST_DEADLINE, pids, f)
}

/// Sets `SO_RCVBUF` on `stream` (the kernel may round it up to its minimum).
fn set_recv_buffer(stream: &UnixStream, bytes: libc::c_int) {
    // SAFETY: `setsockopt` only reads `optlen` bytes at `optval`: that is `&bytes`, a live
    // `c_int` whose exact size is passed; the descriptor is `stream`'s, open for the call's
    // whole duration because `stream` is borrowed.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        rc,
        0,
        "setsockopt SO_RCVBUF: {}",
        io::Error::last_os_error()
    );
}

/// A short description of a response for messages: `ok` or the error's code and message.
fn outcome(m: &Value) -> String {
    match m.get("error") {
        None => "ok".into(),
        Some(e) => {
            let s = format!("{} ({})", code(e), e["message"].as_str().unwrap_or(""));
            s.chars().take(160).collect()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Half-closed connections that stop reading
// ---------------------------------------------------------------------------------------------

/// Rule: a peer that stops reading and half-closes its connection holds up only its own
/// session. One connection more than the CPUs (so every async worker of the broker could be
/// hit; at least three, at most 17) each set a small `SO_RCVBUF`, send six `files/read` of 1 MiB,
/// never read, and `shutdown(SHUT_WR)`: the broker must wait for each writer without blocking
/// an async thread on it. Afterwards a connection made before the attack and a new one each
/// get their `ping` answered within 3 s, and again once the attackers have gone.
#[test]
fn half_closed_connections_that_stop_reading_do_not_freeze_other_sessions() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("big.txt"), vec![b'a'; 1 << 20]).unwrap();
        let policy = write_policy(&dir, &root, "", "requests_per_second = 0");
        let mut l = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);

        let mut before = l.connect();
        before.ping_within("before-0", Duration::from_secs(5));

        let cpus = std::thread::available_parallelism().map_or(2, usize::from);
        let n = (cpus + 1).clamp(3, 17);
        let mut attackers = Vec::new();
        for k in 0..n {
            let s = UnixStream::connect(&l.sock).expect("connect");
            set_recv_buffer(&s, 4096);
            let mut c = Fsb::from_stream(s);
            let mut input = Vec::new();
            for i in 0..6 {
                input.extend(request_line(
                    (k * 100 + i) as u64,
                    "files/read",
                    json!({"path": "r/big.txt", "length": 1048576}),
                ));
            }
            c.send_raw(&input);
            attackers.push(c);
        }
        std::thread::sleep(Duration::from_millis(500));
        for c in &attackers {
            c.stream()
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown(SHUT_WR)");
        }
        // Let every attacker's session reach its end of input and wait for its writer.
        std::thread::sleep(Duration::from_secs(1));
        l.assert_alive();
        println!("{n} connections half-closed without reading six 1 MiB answers each");

        let limit = Duration::from_secs(3);
        let mut fresh = l.connect();
        fresh.ping_within("fresh-1", limit);
        before.ping_within("before-1", limit);

        drop(attackers);
        std::thread::sleep(Duration::from_millis(300));
        let mut after = l.connect();
        after.ping_within("after-1", limit);
        fresh.ping_within("fresh-2", limit);
        l.assert_alive();
    });
}

// ---------------------------------------------------------------------------------------------
// 2. The input budget after an over-long line
// ---------------------------------------------------------------------------------------------

/// Rule: an over-long line gives back the share of `max_pending_input` it took while it
/// arrived. With `--max-line-bytes 1048576` and `max_pending_input = 3145728` (3 MiB), three
/// connections each send one line of 1.5 MiB, get the `-32600` answer (id null) and then stay
/// open and idle. An honest connection's `files/write` of a 600 KiB line (past the 256 KiB
/// that needs no budget, well within the 3 MiB) must then succeed, twice, and write the file.
#[test]
fn an_over_long_line_gives_back_its_share_of_the_input_budget() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        let policy = write_policy(
            &dir,
            &root,
            "mode = \"read-write\"",
            "max_pending_input = 3145728\ntimeout_ms = 5000\nrequests_per_second = 0",
        );
        let mut l = Listener::start(
            &policy,
            &dir.join("broker.sock"),
            &["--max-line-bytes", "1048576"],
            &pids,
        );

        let mut attackers = Vec::new();
        for k in 0..3 {
            let mut c = l.connect();
            let mut line = vec![b'x'; 3 << 19];
            line.push(b'\n');
            c.send_raw(&line);
            let m = match c.next(Duration::from_secs(5)) {
                Got::Line(m) => m,
                other => panic!("attacker {k}: no answer to its over-long line: {other:?}"),
            };
            assert_eq!(m.get("id"), Some(&Value::Null), "attacker {k}: {m}");
            assert_eq!(m["error"]["code"], -32600, "attacker {k}: {m}");
            println!("attacker {k}: {}", outcome(&m));
            attackers.push(c);
        }
        // The attackers now sit idle, each holding no partial line.

        let mut honest = l.connect();
        honest.ping_within("h-ping", Duration::from_secs(5));
        let content = "h".repeat(600 << 10);
        for round in 0..2 {
            let id = json!(format!("h-write-{round}"));
            let started = Instant::now();
            honest.send_request(
                &id,
                "files/write",
                json!({"path": "r/honest.txt", "content": content}),
            );
            let m = honest.answer_or_null_error(&id, Duration::from_secs(10));
            println!(
                "honest 600 KiB write {round} after {:?}: {}",
                started.elapsed(),
                outcome(&m)
            );
            assert!(
                m.get("result").is_some() && m["id"] == id,
                "with three idle connections that once sent an over-long line, an honest 600 KiB line was refused (3 MiB max_pending_input): {m}"
            );
            assert_eq!(m["result"]["bytesWritten"], content.len(), "{m}");
        }
        assert_eq!(
            std::fs::read_to_string(root.join("honest.txt")).unwrap(),
            content,
            "honest.txt holds other bytes"
        );
        // The attackers are still connected (their leak, if any, would still be held).
        for (k, c) in attackers.iter_mut().enumerate() {
            c.ping_within(&format!("a{k}-ping"), Duration::from_secs(5));
        }
        l.assert_alive();
    });
}

// ---------------------------------------------------------------------------------------------
// 3. Consent prompts nobody answers
// ---------------------------------------------------------------------------------------------

/// The consent command of a person who never answers. `PIDS`: appends its pid to PIDS, reads
/// the request, then waits 30 s (ending early once its parent, the broker, is gone) before
/// denying.
const SLOW_CONSENT_PY: &str = r#"
import os, sys, time
ppid = os.getppid()
with open(sys.argv[1], "a") as f:
    f.write("%d\n" % os.getpid())
sys.stdin.buffer.read()
end = time.time() + 30
while time.time() < end and os.getppid() == ppid:
    time.sleep(0.1)
if os.getppid() == ppid:
    print('{"approvedPaths": []}')
"#;

/// Hostile sessions.
const HOSTILE: usize = 3;
/// `files/consent` requests each hostile session keeps outstanding.
const OUTSTANDING: usize = 6;
/// `[limits] timeout_ms`.
const TIMEOUT_MS: u64 = 3000;

/// What one hostile session saw.
#[derive(Debug, Default)]
struct HostileReport {
    answered: usize,
    outcomes: std::collections::BTreeMap<String, usize>,
    slowest: Duration,
    /// Requests answered late, or left unanswered past the bound.
    late: Vec<String>,
}

/// A hostile session: keeps [`OUTSTANDING`] `files/consent` requests for `p/p.txt` in flight
/// (one more sent whenever one is answered) until `stop`; every request must be answered
/// within `bound` of being sent.
fn hostile(mut c: Fsb, k: usize, stop: Arc<AtomicBool>, bound: Duration) -> HostileReport {
    let mut report = HostileReport::default();
    let mut sent: std::collections::HashMap<String, Instant> = Default::default();
    let mut next = 0;
    let mut send = |c: &mut Fsb, sent: &mut std::collections::HashMap<String, Instant>| {
        let id = format!("hostile-{k}-{next}");
        next += 1;
        c.send_request(
            &json!(id),
            "files/consent",
            json!({"message": "hostile", "requestedPaths": ["p/p.txt"]}),
        );
        sent.insert(id, Instant::now());
    };
    for _ in 0..OUTSTANDING {
        send(&mut c, &mut sent);
    }
    while !stop.load(Ordering::SeqCst) {
        let oldest = sent.values().min().copied().expect("requests outstanding");
        let overdue = (oldest + bound).saturating_duration_since(Instant::now());
        if overdue.is_zero() {
            report.late.push(format!(
                "session {k}: a request still unanswered {:?} after it was sent",
                oldest.elapsed()
            ));
            break;
        }
        match c.next(overdue.min(Duration::from_millis(200))) {
            Got::Line(m) if m.get("method").is_some() => {}
            Got::Line(m) => {
                let id = m["id"].as_str().unwrap_or_default().to_owned();
                let Some(at) = sent.remove(&id) else {
                    panic!("session {k}: an answer to no request of its own: {m}");
                };
                let took = at.elapsed();
                report.answered += 1;
                report.slowest = report.slowest.max(took);
                *report.outcomes.entry(outcome(&m)).or_default() += 1;
                if took > bound {
                    report
                        .late
                        .push(format!("session {k}: {id} answered after {took:?}: {m}"));
                }
                send(&mut c, &mut sent);
            }
            Got::Eof => panic!("session {k}: the broker closed the connection"),
            Got::Timeout => {}
        }
    }
    report
}

/// Whether process `pid` is gone (or a zombie waiting to be reaped).
fn gone(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).map_or(true, |c| c.is_empty())
}

/// Rule: consent prompts wait for a person without holding the blocking pool and without
/// outliving their request. A consent command that never answers (it waits 30 s;
/// `[consent] timeout_ms = 30000`), `[limits] timeout_ms = 3000`. Three hostile sessions each
/// keep six `files/consent` requests on a `prompt` root outstanding. Meanwhile an honest
/// session's 1 KiB `files/read`s on an `auto` root, one every 200 ms for 8 s, must each
/// succeed within 1 s, and every hostile request must be answered (`TIMEOUT` is fine) within
/// timeout_ms + 2 s of being sent. At the end no consent command is left running.
#[test]
fn consent_prompts_nobody_answers_do_not_hold_other_sessions_reads() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let auto = dir.join("auto");
        let prompt = dir.join("prompt");
        std::fs::create_dir(&auto).unwrap();
        std::fs::create_dir(&prompt).unwrap();
        let small = "s".repeat(1024);
        std::fs::write(auto.join("small.txt"), &small).unwrap();
        std::fs::write(prompt.join("p.txt"), "p\n").unwrap();
        let script = dir.join("slow_consent.py");
        std::fs::write(&script, SLOW_CONSENT_PY).unwrap();
        let pid_file = dir.join("consent-pids");
        let policy = PolicyToml::new()
            .root(RootToml::at(&auto).name("r"))
            .root(RootToml::at(&prompt).name("p").consent("prompt"))
            .consent_command(
                &[Path::new(python()), &script, &pid_file],
                "timeout_ms = 30000",
            )
            .unlimited_with(&format!("timeout_ms = {TIMEOUT_MS}"))
            .write_to(&dir.join("policy.toml"));
        let mut l = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);

        let mut honest = l.connect();
        honest.ping_within("h-ping", Duration::from_secs(5));

        let stop = Arc::new(AtomicBool::new(false));
        let bound = Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(2);
        let threads: Vec<_> = (0..HOSTILE)
            .map(|k| {
                let c = l.connect();
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || hostile(c, k, stop, bound))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));

        // The honest session's reads, for 8 s (past two rounds of hostile timeouts).
        let started = Instant::now();
        let mut reads = Vec::new();
        let mut n = 0;
        while started.elapsed() < Duration::from_secs(8) {
            n += 1;
            let id = json!(format!("h-read-{n}"));
            let at = Instant::now();
            honest.send_request(&id, "files/read", json!({"path": "r/small.txt"}));
            let m = match honest.answer_within(&id, Duration::from_secs(4)) {
                Some(m) => m,
                None => {
                    reads.push((at.elapsed(), "no answer within 4 s".to_owned()));
                    break;
                }
            };
            let took = at.elapsed();
            if m.get("error").is_none() {
                assert_eq!(m["result"]["content"], small.as_str(), "{m}");
            }
            reads.push((took, outcome(&m)));
            std::thread::sleep(Duration::from_millis(200));
        }
        stop.store(true, Ordering::SeqCst);
        let reports: Vec<HostileReport> = threads
            .into_iter()
            .map(|t| t.join().expect("a hostile session panicked"))
            .collect();
        l.assert_alive();

        let slowest = reads.iter().map(|(d, _)| *d).max().unwrap_or_default();
        let bad: Vec<String> = reads
            .iter()
            .filter(|(d, o)| *d > Duration::from_secs(1) || o != "ok")
            .map(|(d, o)| format!("{d:?}: {o}"))
            .collect();
        println!(
            "honest reads: {} in 8 s, slowest {slowest:?}, {} slow or failed",
            reads.len(),
            bad.len()
        );
        for (k, r) in reports.iter().enumerate() {
            println!(
                "hostile session {k}: {} consent requests answered, slowest {:?}, {:?}",
                r.answered, r.slowest, r.outcomes
            );
        }
        let late: Vec<&String> = reports.iter().flat_map(|r| &r.late).collect();

        // Every consent command ends with the broker.
        let broker = l.pid();
        drop(l);
        let consent_pids: Vec<u32> = std::fs::read_to_string(&pid_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let end = Instant::now() + Duration::from_secs(3);
        while consent_pids.iter().any(|&p| !gone(p)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        let left: Vec<u32> = consent_pids.iter().copied().filter(|&p| !gone(p)).collect();
        println!(
            "{} consent commands ran; broker {broker} killed",
            consent_pids.len()
        );

        assert!(
            bad.is_empty(),
            "while {HOSTILE} sessions kept {OUTSTANDING} unanswered consent prompts each, {} of {} honest 1 KiB reads took over 1 s or failed: {bad:?}",
            bad.len(),
            reads.len()
        );
        assert!(
            late.is_empty(),
            "consent requests not answered within timeout_ms + 2 s ({bound:?}): {late:?}"
        );
        assert!(
            reports.iter().all(|r| r.answered > 0),
            "a hostile session's consent requests were never answered"
        );
        assert!(
            left.is_empty(),
            "consent commands still running after the broker was killed: {left:?}"
        );
    });
}

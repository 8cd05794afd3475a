//! A server behind `fsbroker proxy` that does not start is never silent to the host
//! (docs/protocol.md, Part II, "`fsbroker proxy`"): the host's `initialize` gets a JSON-RPC
//! error with the reason when the server exits before answering it, when a confined server
//! does not answer it within `--start-timeout` (the server is then ended), and when the
//! server cannot be started at all (`--confine=strict` refused); a confined server's error
//! carries the diagnosis read from its stderr. A server that answers in time is never ended
//! for being slow later.
//!
//! The test plays the host over the proxy's stdio; the servers are a few lines of Python,
//! started confined on the real kernel (`FSBROKER_LANDLOCK_ABI=0` simulates a kernel without
//! Landlock).

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::{Cmd, Fsb, Log};
use common::{python, tempdir};

/// How long the host waits for an answer the proxy owes it at once (debug build, a loaded
/// 2-core machine); far below the minutes a host would otherwise wait.
const ANSWER: Duration = Duration::from_secs(15);
/// How long a proxy may take to exit once it should.
const EXIT: Duration = Duration::from_secs(20);

/// `fsbroker proxy --root DIR ARGS -- python3 -c SCRIPT`, its stderr kept, and the host's
/// `initialize` (id `"init"`) sent.
fn host(dir: &std::path::Path, args: &[&str], script: &str, env: &[(&str, &str)]) -> Fsb {
    let mut argv = vec!["proxy", "--root", dir.to_str().unwrap()];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--", python(), "-c", script]);
    let mut cmd = Cmd::new(&argv).log(Log::Keep).deadline(ANSWER);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    let mut fsb = cmd.spawn();
    fsb.send_msg(&initialize("init"));
    fsb
}

fn initialize(id: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "confine-start-test", "version": "0"}
    }})
}

/// The error the host got for its `initialize`, within [`ANSWER`]; fails on a result.
fn init_error(fsb: &mut Fsb) -> Value {
    let answer = fsb.answer(&json!("init"), ANSWER);
    assert!(
        answer.get("result").is_none(),
        "the host's initialize got a result: {answer}"
    );
    let error = answer["error"].clone();
    assert_eq!(error["code"], -32603, "{answer}");
    error
}

fn message(error: &Value) -> String {
    error["message"].as_str().unwrap_or_default().to_owned()
}

/// Whether the process `pid` whose command line holds `marker` still runs.
fn running(pid: u32, marker: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
}

/// Rule: a confined server that never answers `initialize` is given `--start-timeout`: then
/// the host gets an error for its id, stderr the diagnosis, the server is ended, and the
/// proxy exits non-zero. Before, the host waited in silence for as long as it cared to.
#[test]
fn a_confined_server_that_never_answers_is_ended_and_the_host_told() {
    let (_t, dir) = tempdir();
    let marker = "never-answers-5e1c";
    let script = format!(
        "import os, sys, time\n\
         sys.stderr.write('server pid %d\\n' % os.getpid())\n\
         sys.stderr.flush()\n\
         time.sleep(600)  # {marker}\n"
    );
    let sent = Instant::now();
    let mut fsb = host(&dir, &["--confine", "--start-timeout", "2"], &script, &[]);
    let pid: u32 = loop {
        let line = fsb
            .next_log_line(ANSWER)
            .expect("the server did not say its pid");
        if let Some(pid) = line.split("server pid ").nth(1) {
            break pid.trim().parse().unwrap();
        }
    };
    assert!(running(pid, marker), "the server is not running");

    let error = init_error(&mut fsb);
    let took = sent.elapsed();
    let text = message(&error);
    assert!(
        text.contains("fsbroker: the confined server did not answer initialize within 2 s"),
        "{error}"
    );
    assert!(
        took >= Duration::from_millis(1900),
        "answered after {took:?}"
    );
    // The diagnosis rides along: the server's last words, and where to look.
    assert!(text.contains("server pid"), "{error}");
    assert!(text.contains("fsbroker confine check"), "{error}");

    let status = fsb.wait_exit(EXIT).expect("the proxy did not exit");
    assert!(!status.success(), "{status:?}");
    assert!(!running(pid, marker), "the server {pid} outlived the proxy");
    assert!(fsb.log_closed_within(EXIT), "stderr still open");
    let log = fsb.log_text();
    assert!(
        log.contains("did not answer initialize within 2 s"),
        "{log}"
    );
    assert!(log.contains("the server's last stderr lines"), "{log}");
}

/// Rule: a confined server that exits before answering leaves the host an error at once,
/// with what its stderr says the sandbox refused: the path (and what to add to the policy)
/// and the network.
#[test]
fn a_confined_server_that_exits_names_the_refused_path_and_the_network() {
    let (_t, dir) = tempdir();
    let script = "import sys\n\
                  sys.stdin.readline()\n\
                  sys.stderr.write(\"Error: EACCES: permission denied, open '/root/.npmrc'\\n\")\n\
                  sys.stderr.write('npm error code EAI_AGAIN\\n')\n\
                  sys.stderr.flush()\n\
                  sys.exit(1)\n";
    let sent = Instant::now();
    let mut fsb = host(&dir, &["--confine"], script, &[]);
    let error = init_error(&mut fsb);
    let took = sent.elapsed();
    let text = message(&error);
    assert!(
        text.contains("fsbroker: the server exited before answering initialize (exit code 1)"),
        "{error}"
    );
    assert!(
        text.contains("[confine] read = [\"/root/.npmrc\"]"),
        "the refused path is not named: {error}"
    );
    assert!(
        text.contains("EAI_AGAIN") && text.contains("[confine] net = true"),
        "the network is not named: {error}"
    );
    // Not the 20 s of the start timeout: the exit is answered when it happens.
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    let status = fsb.wait_exit(EXIT).expect("the proxy did not exit");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(fsb.log_closed_within(EXIT), "stderr still open");
    let log = fsb.log_text();
    assert!(
        log.contains("/root/.npmrc") && log.contains("net = true"),
        "{log}"
    );
}

/// Rule: a server the proxy refuses to start (`--confine=strict` on a kernel without
/// Landlock) leaves the host an error for its first request, naming the refusal, and the
/// proxy exits 1 at once; notifications before it are passed over, and a host that closes
/// its input (or says nothing) does not hold the proxy.
#[test]
fn a_refused_start_answers_the_hosts_first_request() {
    let (_t, dir) = tempdir();
    let args = [
        "proxy",
        "--root",
        dir.to_str().unwrap(),
        "--confine=strict",
        "--",
        python(),
        "-c",
        "pass",
    ];
    let start = |stdin_note: bool| {
        let mut fsb = Cmd::new(&args)
            .env("FSBROKER_LANDLOCK_ABI", "0")
            .log(Log::Keep)
            .deadline(ANSWER)
            .spawn();
        if stdin_note {
            fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 0}}));
            fsb.send_msg(&initialize("init"));
        }
        fsb
    };

    let started = Instant::now();
    let mut fsb = start(true);
    let error = init_error(&mut fsb);
    let text = message(&error);
    assert!(
        text.contains("fsbroker: confine=strict") && text.contains("was not started"),
        "{error}"
    );
    let status = fsb.wait_exit(EXIT).expect("the proxy did not exit");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(fsb.log_closed_within(EXIT));
    assert!(
        fsb.log_text().contains("was not started"),
        "{}",
        fsb.log_text()
    );

    // The host's EOF ends the wait at once.
    let mut fsb = start(false);
    let started = Instant::now();
    fsb.close_stdin();
    let status = fsb.wait_exit(EXIT).expect("the proxy did not exit");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the proxy waited {:?} for a host that had gone",
        started.elapsed()
    );

    // A host that says nothing holds it for a bounded time only.
    let mut fsb = start(false);
    let status = fsb
        .wait_exit(EXIT)
        .expect("the proxy waited for the host forever");
    assert_eq!(status.code(), Some(1), "{status:?}");
}

/// Rule: an unconfined server that exits before answering `initialize` leaves the host an
/// error naming its exit code; the proxy exits with that code.
#[test]
fn an_unconfined_server_that_exits_early_leaves_the_host_an_error() {
    let (_t, dir) = tempdir();
    let script = "import sys\nsys.stdin.readline()\nsys.exit(3)\n";
    let mut fsb = host(&dir, &[], script, &[]);
    let error = init_error(&mut fsb);
    assert!(
        message(&error)
            .contains("fsbroker: the server exited before answering initialize (exit code 3)"),
        "{error}"
    );
    let status = fsb.wait_exit(EXIT).expect("the proxy did not exit");
    assert_eq!(status.code(), Some(3), "{status:?}");
}

/// Rule: the start timeout ends only a start: a confined server that answered `initialize`
/// in time serves on however slowly it answers later.
#[test]
fn a_confined_server_that_answered_in_time_is_not_ended() {
    let (_t, dir) = tempdir();
    let script = "import json, sys, time\n\
                  for line in sys.stdin:\n\
                  \x20   m = json.loads(line)\n\
                  \x20   if m.get('method') == 'initialize':\n\
                  \x20       r = {'protocolVersion': '2025-06-18', 'capabilities': {}, 'serverInfo': {'name': 'slow', 'version': '0'}}\n\
                  \x20   elif m.get('method') == 'ping':\n\
                  \x20       time.sleep(3)\n\
                  \x20       r = {}\n\
                  \x20   else:\n\
                  \x20       continue\n\
                  \x20   sys.stdout.write(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': r}) + '\\n')\n\
                  \x20   sys.stdout.flush()\n";
    let mut fsb = host(&dir, &["--confine", "--start-timeout", "1"], script, &[]);
    let answer = fsb.answer(&json!("init"), ANSWER);
    assert_eq!(answer["result"]["serverInfo"]["name"], "slow", "{answer}");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for id in ["ping-1", "ping-2"] {
        fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"}));
        let pong = fsb.answer(&json!(id), ANSWER);
        assert_eq!(pong["result"], json!({}), "{pong}");
    }
    fsb.assert_alive("the proxy");
    let (status, rest) = fsb.end();
    assert!(status.success(), "{status:?}, left on stdout: {rest}");
    assert!(rest.is_empty(), "{rest}");
    let log = fsb.log_text();
    assert!(!log.contains("did not answer initialize"), "{log}");
}

/// Rule: an install before the start (`--confine-fetch`) that outlasts `--start-timeout` (a
/// registry that accepts and never answers) does not keep the host waiting: its `initialize`
/// gets an error saying what fsbroker is still installing, at the timeout. Before, the host
/// waited in silence for as long as npm did (71 s for a closed port, minutes for this one).
#[test]
fn an_install_past_the_start_timeout_tells_the_host() {
    let (_t, dir) = tempdir();
    let (home, root) = (dir.join("home"), dir.join("root"));
    for d in [&home, &root] {
        std::fs::create_dir_all(d).unwrap();
    }
    // A registry that takes the connection and never says a word.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let registry = format!("http://{}/", silent.local_addr().unwrap());
    let held = std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let argv = [
        "proxy",
        "--root",
        root.to_str().unwrap(),
        "--confine",
        "--confine-fetch",
        "npm",
        "--start-timeout",
        "3",
        "--",
        "npx",
        "-y",
        "fsbroker-never-published@1.0.0",
    ];
    let started = Instant::now();
    let mut fsb = Cmd::new(&argv)
        .log(Log::Keep)
        .deadline(ANSWER)
        .env("HOME", &home)
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("npm_config_registry", &registry)
        .env("npm_config_fetch_retries", "0")
        // npm gives up after 8 s: past the start's 3 s, and the proxy's end can be awaited.
        .env("npm_config_fetch_timeout", "8000")
        .spawn();
    fsb.send_msg(&initialize("init"));
    let error = init_error(&mut fsb);
    let waited = started.elapsed();
    let text = message(&error);
    assert!(
        text.contains("has not started within 3 s")
            && text.contains("installing fsbroker-never-published@1.0.0 from npm"),
        "{error}"
    );
    assert!(waited < ANSWER, "the host waited {waited:?}");
    // The install goes on to its end (here npm's failure), then the proxy exits.
    fsb.close_stdin();
    let status = fsb
        .wait_exit(EXIT + ANSWER)
        .expect("the proxy exits once the install has ended");
    assert!(!status.success(), "{status}");
    drop(held);
}

/// What the host got on stdout within `limit`: every line, raw.
fn lines_within(fsb: &mut Fsb, limit: Duration) -> Vec<String> {
    let until = Instant::now() + limit;
    let mut lines = Vec::new();
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match fsb.next_line(left) {
            common::fsb::Raw::Line(l) => lines.push(l.text()),
            _ => break,
        }
    }
    lines
}

/// Attack (round 4 review, F8 on stdio): a confined server answers the host's `initialize`
/// in a form the proxy's strict reader does not take for an answer, but the host's may: in a
/// batch, or with its id written twice. A batch that answers it settles the start (before,
/// the proxy did not see the answer, ended the working server at `--start-timeout` and gave
/// the host a second answer, an error). An id written twice, one of them the
/// `initialize`'s, cannot be paired for sure: it is not relayed, and the host gets the one
/// answer the start's time limit makes.
#[test]
fn an_answer_to_initialize_the_strict_reader_does_not_take_is_paired_as_the_host_would() {
    let result = r#"{"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "odd", "version": "0"}}"#;
    for (form, answer) in [
        (
            "batch",
            format!(r#"[{{"jsonrpc": "2.0", "id": "init", "result": {result}}}]"#),
        ),
        (
            "id twice",
            format!(r#"{{"jsonrpc": "2.0", "id": "other", "id": "init", "result": {result}}}"#),
        ),
    ] {
        let (_t, dir) = tempdir();
        let script = format!(
            "import sys, time\n\
             sys.stdin.readline()\n\
             sys.stdout.write({answer:?} + '\\n')\n\
             sys.stdout.flush()\n\
             time.sleep(600)\n"
        );
        let mut fsb = host(&dir, &["--confine", "--start-timeout", "2"], &script, &[]);
        let got = lines_within(&mut fsb, Duration::from_secs(5));
        let answers = got.iter().filter(|l| l.contains("\"init\"")).count();
        assert_eq!(
            answers, 1,
            "{form}: the host got {answers} answers: {got:?}"
        );
        let log = fsb.log_text();
        match form {
            "batch" => {
                assert!(got[0].starts_with('['), "{form}: {got:?}");
                assert!(!log.contains("did not answer initialize"), "{form}: {log}");
                fsb.assert_alive("the proxy");
            }
            _ => assert!(
                got[0].contains("did not answer initialize within 2 s"),
                "{form}: {got:?}"
            ),
        }
    }
}

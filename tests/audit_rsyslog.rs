//! The audit log's syslog copy against a real collector: Debian's `rsyslogd`, run in the
//! foreground as the test's own user with a private configuration (its own socket in a temp
//! dir instead of `/dev/log`, and each message's body written to a file), receives the chain
//! intact. `tests/audit_copies.rs` checks the framing byte by byte against sockets the tests
//! bind themselves; this checks that a collector people run reads that framing as meant.
//!
//! Needs `rsyslogd` (Debian's `rsyslog`; `.ci/run` installs it). Without it the test prints
//! `SKIPPED` and passes (fails with `FSBROKER_TEST_STRICT=1`, as in CI).

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::audit::{log_lines, s, verify_files};
use common::{Fsb, tempdir};
use serde_json::json;

/// `rsyslogd` on `PATH` or in the system folders it is installed in (`/usr/sbin` is not on
/// every user's `PATH`).
fn find_rsyslogd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("rsyslogd"))
        .find(|p| p.is_file())
}

/// A running `rsyslogd`, stopped when dropped.
struct Rsyslogd {
    child: Child,
    stderr: PathBuf,
}

impl Rsyslogd {
    /// Starts `program` in the foreground on `config` (written to `dir/NAME.conf`), and
    /// returns once `ready` exists (a socket it makes, or a file).
    fn run(program: &Path, dir: &Path, name: &str, config: &str, ready: &Path) -> Rsyslogd {
        let file = dir.join(format!("{name}.conf"));
        std::fs::write(&file, config).unwrap();
        let stderr = dir.join(format!("{name}.stderr"));
        let child = Command::new(program)
            .args([
                "-n",
                "-f",
                s(&file),
                "-i",
                s(&dir.join(format!("{name}.pid"))),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let mut r = Rsyslogd { child, stderr };
        let end = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("rsyslogd {name} exited ({status}): {}", r.log());
            }
            assert!(
                Instant::now() < end,
                "rsyslogd {name} not ready in 10 s: {}",
                r.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        r
    }

    /// Starts `program` in the foreground on a configuration of its own in `dir`: an
    /// `imuxsock` input on `socket` only (no system socket, so no root needed), the regular
    /// parsers (RFC 5424) rather than the local-socket shortcut, and an `omfile` action
    /// writing each message's MSG alone, one per line, to `out`. Returns once the socket
    /// exists.
    fn start(program: &Path, dir: &Path, socket: &Path, out: &Path) -> Rsyslogd {
        let config = format!(
            r#"global(workDirectory="{work}" maxMessageSize="64k")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="{socket}" UseSpecialParser="off" ParseHostname="on")
template(name="body" type="string" string="%msg%\n")
action(type="omfile" file="{out}" template="body")
"#,
            work = s(dir),
            socket = s(socket),
            out = s(out),
        );
        Rsyslogd::run(program, dir, "rsyslog", &config, socket)
    }

    /// What rsyslogd said on stderr.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Rsyslogd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of `file` once it holds at least `n` (rsyslogd writes them a little after they
/// arrive), or what it holds after 10 s.
fn lines_when(file: &Path, n: usize) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = std::fs::read_to_string(file)
            .map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default();
        if lines.len() >= n || Instant::now() >= end {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rule: the syslog copy reaches a real collector intact. Every line of the log (the start
/// line, allowed and refused requests, a path with a quote and a non-ASCII letter, the seal)
/// is in what rsyslogd wrote, once, in order, byte for byte, and that copy verifies as a chain
/// on its own (`fsbroker audit verify`).
#[test]
fn rsyslogd_receives_the_chain_intact() {
    let Some(rsyslogd) = find_rsyslogd() else {
        common::skipped("rsyslogd not installed (apt-get install rsyslog)");
        return;
    };
    let (_t, dir) = tempdir();
    let socket = dir.join("log.sock");
    let received = dir.join("received.jsonl");
    let collector = Rsyslogd::start(&rsyslogd, &dir, &socket, &received);

    let (_t2, _, policy, log) = common::audit::audited(
        "mode = \"read-write\"",
        &format!("syslog = '{}'", s(&socket)),
    );
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    b.ok("roots/list", json!({}));
    b.ok("files/read", json!({"path": "r/f.txt"}));
    b.err("files/read", json!({"path": "r/nö \"such\".txt"}));
    b.ok("files/write", json!({"path": "r/new.txt", "content": "x"}));
    b.ok("files/list", json!({"path": "r"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");

    let lines = log_lines(&log);
    assert_eq!(lines.len(), 7, "start, five requests, seal: {lines:#?}");
    let copy = lines_when(&received, lines.len());
    assert_eq!(
        copy,
        lines,
        "what rsyslogd wrote differs from the log; rsyslogd said: {}",
        collector.log()
    );
    let (code, text) = verify_files(&[&received], &[]);
    assert_eq!(code, 0, "{text}");
}

/// A free TCP port on loopback (bound and released; rsyslogd binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// docs/admin.md, "Forwarding the audit log to a collector", run as written (paths and the
/// collector's address made the test's own, TLS left out): the machine's rsyslogd takes the
/// broker's syslog copy on its own socket and forwards it over TCP to a central rsyslogd,
/// which files it; the collected copy verifies on its own, and its last hash is a head the
/// broker's log on the desktop still holds (`audit verify --head`).
#[test]
fn the_audit_forwarded_by_rsyslog_to_a_collector_verifies_against_the_desktop_log() {
    let Some(rsyslogd) = find_rsyslogd() else {
        common::skipped("rsyslogd not installed (apt-get install rsyslog)");
        return;
    };
    let (_t, dir) = tempdir();
    let port = free_port();
    // The central collector: TCP in, each message's line filed (docs/admin.md's collector).
    let (cdir, adir) = (dir.join("collector"), dir.join("desktop"));
    std::fs::create_dir_all(&cdir).unwrap();
    std::fs::create_dir_all(&adir).unwrap();
    // The collector files each desktop's lines under its host name.
    let filed = cdir.join("fsbroker");
    std::fs::create_dir_all(&filed).unwrap();
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let collected = filed.join(format!("{host}.jsonl"));
    let _collector = Rsyslogd::run(
        &rsyslogd,
        &cdir,
        "collector",
        &format!(
            r#"global(workDirectory="{work}" maxMessageSize="64k")
module(load="imtcp")
input(type="imtcp" Port="{port}" Address="127.0.0.1")
template(name="fsbroker-line" type="string" string="%msg%\n")
template(name="fsbroker-file" type="string" string="{out}/%hostname%.jsonl")
if $app-name == "fsbroker" then {{
    action(type="omfile" DynaFile="fsbroker-file" Template="fsbroker-line")
    stop
}}
"#,
            work = s(&cdir),
            out = s(&filed),
        ),
        &cdir.join("collector.pid"),
    );
    // Wait for the collector's port rather than guess.
    let end = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < end,
            "the collector never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The desktop's rsyslogd: the broker's own socket, parsed as RFC 5424, forwarded.
    let socket = adir.join("syslog.sock");
    let _desktop = Rsyslogd::run(
        &rsyslogd,
        &adir,
        "desktop",
        &format!(
            r#"global(workDirectory="{work}" maxMessageSize="64k")
module(load="imuxsock" SysSock.Use="off")
input(type="imuxsock" Socket="{socket}"
      UseSpecialParser="off" ParseHostname="on" Annotate="on" ParseTrusted="on")
if $app-name == "fsbroker" then {{
    action(type="omfwd" Target="127.0.0.1" Port="{port}" Protocol="tcp"
           Template="RSYSLOG_SyslogProtocol23Format")
    stop
}}
"#,
            work = s(&adir),
            socket = s(&socket),
        ),
        &socket,
    );
    let (_t2, _, policy, log) = common::audit::audited(
        "mode = \"read-write\"",
        &format!("syslog = '{}'", s(&socket)),
    );
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    b.ok("roots/list", json!({}));
    b.ok("files/read", json!({"path": "r/f.txt"}));
    b.ok("files/write", json!({"path": "r/new.txt", "content": "x"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let lines = log_lines(&log);
    let copy = lines_when(&collected, lines.len());
    assert_eq!(
        copy, lines,
        "the collected copy differs from the desktop's log"
    );
    let (code, text) = verify_files(&[&collected], &[]);
    assert_eq!(code, 0, "{text}");
    // The collector's last hash, checked against the desktop's log as an auditor would.
    let last: serde_json::Value = serde_json::from_str(copy.last().unwrap()).unwrap();
    let head = last["hash"].as_str().unwrap();
    let (code, text) = verify_files(&[&log], &["--head", head]);
    assert_eq!(code, 0, "{text}");
}

//! Copies of the audit log off the file: every line, as it is written, reaches a syslog
//! socket as RFC 5424 and a journal socket in the journal's native protocol. The collectors
//! here are Unix datagram sockets the tests bind themselves; the broker is the real binary.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::audit::{log_lines, s};
use common::{Fsb, bin, code, tempdir};
use serde_json::{Value, json};

/// A datagram received.
#[derive(Debug, Clone)]
struct Datagram {
    bytes: Vec<u8>,
}

/// A collector: a bound Unix datagram socket drained by a thread until dropped.
struct Collector {
    got: Arc<Mutex<Vec<Datagram>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Collector {
    fn bind(path: &Path) -> Collector {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (got, stop) = (Arc::clone(&got), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    if let Some(d) = receive(&sock) {
                        got.lock().unwrap().push(d);
                    }
                }
                // Whatever is still queued.
                sock.set_nonblocking(true).unwrap();
                while let Some(d) = receive(&sock) {
                    got.lock().unwrap().push(d);
                }
            })
        };
        Collector {
            got,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops listening and returns everything received, in order.
    fn finish(mut self) -> Vec<Datagram> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap();
        self.got.lock().unwrap().clone()
    }
}

/// One datagram, or None when none came in time.
fn receive(sock: &UnixDatagram) -> Option<Datagram> {
    let mut buf = vec![0u8; 1 << 20];
    match sock.recv(&mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Some(Datagram { bytes: buf })
        }
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::Interrupted
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// Parses the journal's native protocol into (name, value) pairs, in order.
fn journal_fields(mut b: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let nl = b
            .iter()
            .position(|&c| c == b'\n')
            .expect("field ends in a newline");
        let head = &b[..nl];
        if let Some(eq) = head.iter().position(|&c| c == b'=') {
            out.push((
                String::from_utf8(head[..eq].to_vec()).unwrap(),
                head[eq + 1..].to_vec(),
            ));
            b = &b[nl + 1..];
        } else {
            let name = String::from_utf8(head.to_vec()).unwrap();
            let len = u64::from_le_bytes(b[nl + 1..nl + 9].try_into().unwrap()) as usize;
            let value = b[nl + 9..nl + 9 + len].to_vec();
            assert_eq!(
                b[nl + 9 + len],
                b'\n',
                "binary field {name} not ended by a newline"
            );
            out.push((name, value));
            b = &b[nl + 10 + len..];
        }
    }
    out
}

/// The values of the fields called `name`, as text.
fn field(fields: &[(String, Vec<u8>)], name: &str) -> Vec<String> {
    fields
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// A root `root` (read-write, consent auto) holding `f.txt`, and a policy whose `[audit]`
/// table is `audit` (after `path = "audit.jsonl"`). Returns (temp dir, dir, policy, log).
fn setup(audit: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    common::audit::audited("mode = \"read-write\"", audit)
}

fn verify(files: &[&Path]) -> (i32, String) {
    common::audit::verify_files(files, &[])
}

/// Rule: every line of the log reaches both collectors, framed as each expects: the syslog
/// message is RFC 5424 with the facility configured, the line's time, the broker's pid and
/// the method as MSGID, and the line itself, byte for byte, as MSG; the journal entry has the
/// line as MESSAGE and each member as a field, a path holding a newline in the binary form.
#[test]
fn every_line_reaches_syslog_and_the_journal_as_each_frames_it() {
    let (_t, dir) = tempdir();
    let (_t2, _, policy, log) = setup(&format!(
        "syslog = '{}'\nsyslog_facility = \"local3\"\njournald = '{}'",
        s(&dir.join("syslog.sock")),
        s(&dir.join("journal.sock"))
    ));
    let syslog = Collector::bind(&dir.join("syslog.sock"));
    let journal = Collector::bind(&dir.join("journal.sock"));

    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    b.ok("files/read", json!({"path": "r/f.txt"}));
    b.err("files/read", json!({"path": "r/no\nsuch.txt"}));
    b.ok("files/write", json!({"path": "r/new.txt", "content": "x"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let (syslog, journal) = (syslog.finish(), journal.finish());

    let lines = log_lines(&log);
    assert_eq!(lines.len(), 5, "start, three requests, seal: {lines:#?}");
    assert_eq!(verify(&[&log]).0, 0);
    assert_eq!(syslog.len(), lines.len(), "{syslog:?}");
    assert_eq!(journal.len(), lines.len(), "{journal:?}");
    let pid = serde_json::from_str::<Value>(&lines[0]).unwrap()["pid"]
        .as_u64()
        .unwrap();
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        let kind = v["method"].as_str().or(v["event"].as_str()).unwrap();
        let severity = if v["outcome"].as_str().is_some_and(|o| o != "ok") {
            5
        } else {
            6
        };
        // local3 = 19
        let want = format!(
            "<{}>1 {} {} fsbroker {pid} {kind} - {line}",
            19 * 8 + severity,
            v["ts"].as_str().unwrap(),
            rustix::system::uname().nodename().to_str().unwrap(),
        );
        assert_eq!(
            String::from_utf8(syslog[i].bytes.clone()).unwrap(),
            want,
            "syslog message {i}"
        );

        let f = journal_fields(&journal[i].bytes);
        assert_eq!(
            field(&f, "MESSAGE"),
            vec![line.clone()],
            "journal entry {i}"
        );
        assert_eq!(field(&f, "PRIORITY"), vec![severity.to_string()]);
        assert_eq!(field(&f, "SYSLOG_IDENTIFIER"), vec!["fsbroker"]);
        assert_eq!(
            field(&f, "FSBROKER_HASH"),
            vec![v["hash"].as_str().unwrap()]
        );
        if let Some(path) = v["path"].as_str() {
            assert_eq!(field(&f, "FSBROKER_PATH"), vec![path]);
        }
    }
    // The refused read's path holds a newline: it came through the binary form whole.
    let f = journal_fields(&journal[2].bytes);
    assert_eq!(field(&f, "FSBROKER_PATH"), vec!["r/no\nsuch.txt"]);
    assert_eq!(field(&f, "FSBROKER_OUTCOME"), vec!["FILE_NOT_FOUND"]);
    assert!(!field(&f, "FSBROKER_DURATION_MS").is_empty());
}

/// Rule: a server decides how long its strings are, not how long the log's lines get. A
/// consent request for 3,000 paths of 1 KiB is logged with its first 16 paths, the count and a
/// digest of them all; the journal gets that line whole, and syslog, whose collectors cut
/// messages past 8 KiB, a shorter message that keeps the line's hash, prev and the start of
/// each long string, and names what it cut.
#[test]
fn a_huge_request_is_logged_capped_and_reaches_both_copies() {
    let (_t, dir) = tempdir();
    let (_t2, _, policy, log) = setup(&format!(
        "syslog = '{}'\njournald = '{}'",
        s(&dir.join("syslog.sock")),
        s(&dir.join("journal.sock"))
    ));
    let syslog = Collector::bind(&dir.join("syslog.sock"));
    let journal = Collector::bind(&dir.join("journal.sock"));
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let paths: Vec<String> = (0..3000)
        .map(|i| format!("r/{i:04}-{}", "p".repeat(1017)))
        .collect();
    // Over the paths a person may be asked about at once: refused, and recorded all the same.
    let e = b.err(
        "files/consent",
        json!({"message": "many", "requestedPaths": paths}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let (syslog, journal) = (syslog.finish(), journal.finish());
    let lines = log_lines(&log);
    let consent = &lines[1];
    let v: Value = serde_json::from_str(consent).unwrap();
    assert_eq!(v["paths"].as_array().unwrap().len(), 16);
    assert_eq!(v["paths"][0], paths[0]);
    assert_eq!(v["pathsCount"], 3000);
    let digest = hex_sha256(&serde_json::to_vec(&paths).unwrap());
    assert_eq!(v["pathsDigest"], digest);
    assert!(consent.len() < 20_000, "{}", consent.len());

    assert_eq!(journal.len(), lines.len());
    let f = journal_fields(&journal[1].bytes);
    assert_eq!(field(&f, "MESSAGE"), vec![consent.clone()]);
    assert_eq!(field(&f, "FSBROKER_PATHS").len(), 16);

    assert_eq!(syslog.len(), lines.len());
    let msg = String::from_utf8(syslog[1].bytes.clone()).unwrap();
    assert!(msg.len() <= 8192, "{}", msg.len());
    let body: Value = serde_json::from_str(&msg[msg.find(" - ").unwrap() + 3..]).unwrap();
    assert_eq!(body["hash"], v["hash"]);
    assert_eq!(body["prev"], v["prev"]);
    assert_eq!(body["pathsCount"], 3000);
    assert_eq!(body["elided"], json!(["paths"]));
    assert_eq!(body["lineBytes"], json!(consent.len()));
}

/// Rule: a path longer than `PATH_MAX` is logged cut to 4,096 bytes, with its length and
/// sha256, so a probe still shows and its line stays small.
#[test]
fn a_path_longer_than_path_max_is_logged_cut_with_its_digest() {
    let (_t, dir) = tempdir();
    let (_t2, _, policy, log) = setup(&format!("syslog = '{}'", s(&dir.join("syslog.sock"))));
    let syslog = Collector::bind(&dir.join("syslog.sock"));
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let path = format!("r/{}../../etc/passwd", "./".repeat(4200));
    b.err("files/read", json!({"path": path}));
    b.finish();
    let got = syslog.finish();
    let v: Value = serde_json::from_str(&log_lines(&log)[1]).unwrap();
    assert_eq!(v["path"], path[..4096]);
    assert_eq!(v["pathBytes"], path.len());
    assert_eq!(v["pathDigest"], hex_sha256(path.as_bytes()));
    // The syslog copy keeps the start of the path.
    let msg = String::from_utf8(got[1].bytes.clone()).unwrap();
    assert!(msg.contains("r/./././"), "{msg}");
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Rule: a copy that cannot be delivered does not silently lose lines. The log records the
/// loss (`copy-lost`, with the error) in its chain, carries on, and when the collector is back
/// records `copy-resumed` with the number of lines it missed; from then on lines reach it.
#[test]
fn a_lost_copy_is_recorded_in_the_chain_and_so_is_its_return() {
    let (_t, dir) = tempdir();
    let sock = dir.join("syslog.sock");
    let (_t2, _, policy, log) = setup(&format!("syslog = '{}'", s(&sock)));
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    // Nobody listens yet: the start line and these three are lost.
    for _ in 0..3 {
        b.ok("files/read", json!({"path": "r/f.txt"}));
    }
    let syslog = Collector::bind(&sock);
    b.ok("files/list", json!({"path": "r"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let got = syslog.finish();

    let lines: Vec<Value> = log_lines(&log)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["event"], "start");
    assert_eq!(lines[1]["event"], "copy-lost", "{lines:#?}");
    assert_eq!(lines[1]["to"], "syslog");
    assert_eq!(lines[1]["socket"], s(&sock));
    assert!(!lines[1]["error"].as_str().unwrap().is_empty());
    let resumed = lines
        .iter()
        .position(|l| l["event"] == "copy-resumed")
        .expect("copy-resumed recorded");
    // Lost: the start line, the copy-lost line itself and the three reads.
    assert_eq!(lines[resumed]["lost"], 5, "{lines:#?}");
    assert_eq!(lines[resumed - 1]["method"], "files/list");
    assert_eq!(verify(&[&log]).0, 0);
    // The collector got the list, the copy-resumed line and the seal, exactly as written.
    let text = log_lines(&log);
    let received: Vec<String> = got
        .iter()
        .map(|d| {
            let m = String::from_utf8(d.bytes.clone()).unwrap();
            m[m.find(" - ").unwrap() + 3..].to_owned()
        })
        .collect();
    assert_eq!(received, text[resumed - 1..].to_vec());
}

/// Rule: with `require_copies`, a copy that cannot be delivered stops the broker acting
/// unrecorded-elsewhere: every audited request is refused, as when the file cannot be written.
#[test]
fn require_copies_refuses_requests_once_a_copy_is_lost() {
    let (_t, dir) = tempdir();
    let sock = dir.join("absent.sock");
    let (_t2, root_dir, policy, log) =
        setup(&format!("syslog = '{}'\nrequire_copies = true", s(&sock)));
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let e = b.err("files/write", json!({"path": "r/new.txt", "content": "x"}));
    assert_eq!(code(&e), "IO_ERROR", "{e}");
    assert!(e.to_string().contains("audit log unavailable"), "{e}");
    assert!(!root_dir.join("root/new.txt").exists(), "the write ran");
    b.finish();
    let lines = log_lines(&log);
    assert!(lines[1].contains("\"copy-lost\""), "{lines:#?}");
    // The refused write is recorded too, and the file, which works, still takes the seal.
    assert!(lines[2].contains("\"IO_ERROR\""), "{lines:#?}");
    assert!(lines.last().unwrap().contains("\"seal\""), "{lines:#?}");
}

/// Rule: with `require_copies`, requests are refused while a copy is down, not for ever: once
/// the collector takes lines again (the line of a refused request gets through, and
/// `copy-resumed` is recorded), requests act again.
#[test]
fn require_copies_serves_again_once_the_copy_is_back() {
    let (_t, dir) = tempdir();
    let sock = dir.join("syslog.sock");
    let (_t2, root_dir, policy, log) =
        setup(&format!("syslog = '{}'\nrequire_copies = true", s(&sock)));
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let e = b.err("files/write", json!({"path": "r/a.txt", "content": "x"}));
    assert_eq!(code(&e), "IO_ERROR", "{e}");
    let collector = Collector::bind(&sock);
    // Refused, but its line reaches the collector: the copy is back.
    b.err("files/write", json!({"path": "r/b.txt", "content": "x"}));
    b.ok("files/write", json!({"path": "r/c.txt", "content": "x"}));
    b.finish();
    collector.finish();
    assert!(!root_dir.join("root/a.txt").exists());
    assert!(!root_dir.join("root/b.txt").exists());
    assert!(root_dir.join("root/c.txt").exists());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("\"copy-resumed\""), "{text}");
    assert_eq!(verify(&[&log]).0, 0);
}

/// Rule: the `[audit]` keys are checked when the policy loads, with the key named.
#[test]
fn bad_audit_keys_are_refused_with_the_reason() {
    for (table, want) in [
        ("max_bytes = 100", "max_bytes"),
        (
            "syslog = true\nsyslog_facility = \"mail2\"",
            "syslog_facility",
        ),
        ("syslog_facility = \"auth\"", "syslog is not"),
        ("require_copies = true", "require_copies"),
        ("syslog = 3", "syslog"),
    ] {
        let (_t, _, policy, _) = setup(table);
        let out = std::process::Command::new(bin())
            .args(["policy", "check", s(&policy)])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{table}: accepted");
        assert!(err.contains(want), "{table}: {err}");
    }
    let (_t, dir) = tempdir();
    let (_t2, _, policy, _) = setup(&format!(
        "max_bytes = 4096\nsyslog = '{}'\nsyslog_facility = \"local7\"\njournald = false",
        s(&dir.join("x.sock"))
    ));
    let out = std::process::Command::new(bin())
        .args(["policy", "check", s(&policy)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rule: the copy is itself a chain. Lines are sent before the file's lock is let go, so three
/// brokers sharing a log that rolls over send their lines in the file's order: the journal's
/// MESSAGEs, one per line, are the files' lines in order and verify as one log.
#[test]
fn brokers_sharing_a_rolling_log_copy_it_in_order() {
    let (_t, dir) = tempdir();
    let sock = dir.join("journal.sock");
    let (_t2, _, policy, log) = setup(&format!("max_bytes = 8192\njournald = '{}'", s(&sock)));
    let journal = Collector::bind(&sock);
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let policy = policy.clone();
            std::thread::spawn(move || {
                let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
                for _ in 0..100 {
                    b.ok("files/read", json!({"path": "r/f.txt"}));
                }
                let (status, stderr) = b.finish();
                assert!(status.success(), "{stderr}");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let got = journal.finish();
    let copy: Vec<String> = got
        .iter()
        .map(|d| field(&journal_fields(&d.bytes), "MESSAGE").remove(0))
        .collect();
    // The files, oldest first.
    let mut files: Vec<PathBuf> = std::fs::read_dir(log.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| s(p).starts_with(&format!("{}.", s(&log))))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the log rolled over: {files:?}");
    files.push(log.clone());
    let lines: Vec<String> = files.iter().flat_map(|f| log_lines(f)).collect();
    assert_eq!(copy.len(), lines.len());
    assert!(copy == lines, "the copy's order differs from the files'");
    let copied = dir.join("copy.jsonl");
    std::fs::write(&copied, copy.join("\n") + "\n").unwrap();
    let (code, text) = verify(&[&copied]);
    assert_eq!(code, 0, "{text}");
}

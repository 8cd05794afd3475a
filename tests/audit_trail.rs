//! The audit log as an auditor relies on it: several brokers appending to one file form one
//! chain, the hash covers the exact bytes written (a reformatted line fails), and line
//! separators inside strings are escaped so every line splitter sees the same lines.
//!
//! One file though long: each test is one promise the log makes to an auditor, on the same
//! several-brokers fixture.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::audit::s;
use common::fsb::{Cmd, Log};
use common::{Fsb, bin, tempdir};
use serde_json::json;

/// `fsbroker audit verify LOG`: (exit code, stdout + stderr).
fn verify(log: &Path) -> (i32, String) {
    verify_with(log, &[])
}

/// `fsbroker audit verify LOG EXTRA...`: (exit code, stdout + stderr).
fn verify_with(log: &Path, extra: &[&str]) -> (i32, String) {
    common::audit::verify_files(&[log], extra)
}

/// A temp dir with a root `root` holding `f.txt`, and where the log goes.
fn setup() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "hello").unwrap();
    (t, root, dir.join("audit.jsonl"))
}

fn serve_audited(root: &Path, log: &Path) -> Fsb {
    Fsb::spawn(&[
        "serve",
        "--root",
        s(root),
        "--read-write",
        "--audit",
        s(log),
    ])
}

/// Rule: brokers sharing one `[audit] path` keep one chain. Three brokers append at once,
/// 300 requests each; `audit verify` must find every line in one intact chain. (Before, two
/// brokers broke it within three lines: each chained to its own idea of the last line.)
#[test]
fn three_brokers_appending_to_one_log_form_one_chain() {
    let (_t, root, log) = setup();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (root, log) = (root.clone(), log.clone());
            std::thread::spawn(move || {
                let mut b = serve_audited(&root, &log);
                for _ in 0..300 {
                    b.ok("files/read", json!({"path": "root/f.txt"}));
                }
                let (status, _) = b.finish();
                assert!(status.success(), "{status}");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let (code, text) = verify(&log);
    assert_eq!(code, 0, "{text}");
    let lines = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(
        lines,
        3 * 302,
        "three start lines, 900 requests, three seals"
    );
}

/// Rule: the hash is over the exact bytes written. A line whose content is unchanged but whose
/// bytes are not the broker's form (a space added, a key given twice) fails `verify`.
#[test]
fn a_reformatted_line_fails_verify() {
    let (_t, root, log) = setup();
    let mut b = serve_audited(&root, &log);
    for _ in 0..3 {
        b.ok("files/read", json!({"path": "root/f.txt"}));
    }
    b.finish();
    assert_eq!(verify(&log).0, 0, "{}", verify(&log).1);
    let good = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    let with_line_2 = |new: String| {
        let mut all: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
        all[1] = new;
        all.join("\n") + "\n"
    };
    for (what, bad) in [
        ("a space after the brace", lines[1].replacen('{', "{ ", 1)),
        (
            "a leading key given twice",
            lines[1].replacen('{', "{\"bytes\":12345,", 1),
        ),
        ("a space after a colon", lines[1].replacen("\":", "\": ", 1)),
    ] {
        std::fs::write(&log, with_line_2(bad)).unwrap();
        let (code, text) = verify(&log);
        assert_ne!(code, 0, "{what}: verify accepted it: {text}");
        assert!(text.contains("line 2"), "{what}: {text}");
    }
}

/// Rule: a path holding U+0085, U+2028 or U+2029 is logged escaped, so the log has as many
/// lines for JavaScript's and Python's line splitters (`splitlines` ends lines at all three)
/// as it has newlines, and it still verifies.
#[test]
fn line_separators_in_paths_are_escaped() {
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    let log = dir.join("audit.jsonl");
    let mut b = serve_audited(&root, &log);
    b.err(
        "files/read",
        json!({"path": "root/a\u{2028}b\u{2029}c\u{85}d.txt"}),
    );
    b.finish();
    let bytes = std::fs::read(&log).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert!(
        !text.contains('\u{2028}') && !text.contains('\u{2029}') && !text.contains('\u{85}'),
        "raw separators in the log: {text:?}"
    );
    assert!(
        text.contains("a\\u2028b\\u2029c\\u0085d.txt"),
        "not escaped: {text}"
    );
    // Every way of splitting lines agrees.
    let newlines = text.matches('\n').count();
    let split_all = text
        .split(['\n', '\u{2028}', '\u{2029}', '\u{85}'])
        .filter(|l| !l.is_empty())
        .count();
    assert_eq!(newlines, split_all);
    // The escaped form is what was hashed: it verifies, and it reads back as the path sent.
    let (code, out) = verify(&log);
    assert_eq!(code, 0, "{out}");
    let read = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["method"] == "files/read")
        .expect("the read's line");
    assert_eq!(read["path"], "root/a\u{2028}b\u{2029}c\u{85}d.txt");
}

/// Rule: a hash chain cannot see its own end, so each run seals its part. A cleanly closed log
/// verifies (exit 0); with its seal, or its last two lines, removed it is reported unsealed
/// (exit 3, distinct from a broken chain's 1); a broker killed mid-run leaves its run unsealed.
#[test]
fn a_removed_tail_or_a_crash_is_reported_unsealed() {
    let (_t, root, log) = setup();
    let mut b = serve_audited(&root, &log);
    for _ in 0..3 {
        b.ok("files/read", json!({"path": "root/f.txt"}));
    }
    b.finish();
    let (code, text) = verify(&log);
    assert_eq!(code, 0, "{text}");
    let good = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    assert!(
        lines.last().unwrap().contains("\"event\":\"seal\""),
        "{good}"
    );
    for cut in [1, 2] {
        let kept = lines[..lines.len() - cut].join("\n") + "\n";
        std::fs::write(&log, kept).unwrap();
        let (code, text) = verify(&log);
        assert_eq!(code, 3, "last {cut} line(s) removed: {text}");
        assert!(text.contains("unsealed"), "{text}");
    }

    // A crash: the broker is killed after a request.
    std::fs::write(&log, &good).unwrap();
    let mut b = serve_audited(&root, &log);
    b.ok("files/read", json!({"path": "root/f.txt"}));
    b.kill_now();
    let (code, text) = verify(&log);
    assert_eq!(code, 3, "{text}");
}

/// Rule: the head can be anchored elsewhere. `audit head` prints the last line's hash;
/// `verify --head` accepts the log while that line is in it (also after it grew) and fails
/// (exit 1) once the log was cut before it.
#[test]
fn a_head_kept_elsewhere_catches_a_cut_log() {
    let (_t, root, log) = setup();
    let mut b = serve_audited(&root, &log);
    b.ok("files/read", json!({"path": "root/f.txt"}));
    b.finish();
    let out = Command::new(bin())
        .args(["audit", "head", s(&log)])
        .output()
        .unwrap();
    assert!(out.status.success());
    let head = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let text = std::fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(head, last["hash"].as_str().unwrap());
    let verify_head = |log: &Path| verify_with(log, &["--head", &head]);
    assert_eq!(verify_head(&log).0, 0, "{}", verify_head(&log).1);
    // The log grows: the anchor is still in it.
    let mut b = serve_audited(&root, &log);
    b.ok("files/read", json!({"path": "root/f.txt"}));
    b.finish();
    assert_eq!(verify_head(&log).0, 0, "{}", verify_head(&log).1);
    // Cut back to before the anchored line (and sealed-looking at a cut point or not): 1.
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&log, lines[..lines.len() - 1].join("\n") + "\n").unwrap();
    let (code, err) = verify_head(&log);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not in it"), "{err}");
}

/// Rule: session ids are unique across brokers and restarts. Two runs, then two brokers at
/// once, on one log: no two runs log the same session id, and each run's start line names
/// where its session ids begin (`firstSession`), tying them to its pid and version.
#[test]
fn session_ids_are_unique_across_runs_and_brokers() {
    let (_t, root, log) = setup();
    let one_run = |root: &Path, log: &Path| {
        let mut b = serve_audited(root, log);
        b.ok("files/read", json!({"path": "root/f.txt"}));
        b.finish();
    };
    one_run(&root, &log);
    one_run(&root, &log);
    let both: Vec<_> = (0..2)
        .map(|_| {
            let (root, log) = (root.clone(), log.clone());
            std::thread::spawn(move || {
                let mut b = serve_audited(&root, &log);
                b.ok("files/read", json!({"path": "root/f.txt"}));
                b.finish();
            })
        })
        .collect();
    for t in both {
        t.join().unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut firsts: Vec<(u64, u64)> = records
        .iter()
        .filter(|r| r["event"] == "start")
        .map(|r| {
            (
                r["pid"].as_u64().unwrap(),
                r["firstSession"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(firsts.len(), 4, "{text}");
    let mut sessions: Vec<u64> = records
        .iter()
        .filter(|r| r["method"] == "files/read")
        .map(|r| r["session"].as_u64().expect("a session id below 2^53"))
        .collect();
    assert_eq!(sessions.len(), 4);
    sessions.sort_unstable();
    sessions.dedup();
    assert_eq!(sessions.len(), 4, "session ids repeat across runs: {text}");
    // Each session id is its run's first (one session per run here).
    firsts.sort_unstable_by_key(|&(_, f)| f);
    let mut first_ids: Vec<u64> = firsts.iter().map(|&(_, f)| f).collect();
    first_ids.sort_unstable();
    assert_eq!(first_ids, sessions);
    assert_eq!(verify(&log).0, 0, "{}", verify(&log).1);
}

/// Rule: when the log fails, requests already in flight do not go on to act unrecorded. 40
/// deletes are pipelined at a broker whose log can take only a few lines (a file size limit
/// stands in for a full disk). Every delete re-checks the log at its point of no return, so
/// at most the few that were past it when the log failed act without a line, and each of
/// those is named on stderr. (Before, all 40 files went and the log held three lines.)
#[test]
fn requests_in_flight_when_the_log_fails_do_not_act_unrecorded() {
    let (_t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    for i in 0..40 {
        std::fs::write(root.join(format!("f{i:02}.txt")), "x").unwrap();
    }
    let log = dir.join("audit.jsonl");
    // `ulimit -f 2`: the broker may write files of 1 KiB at most (2 blocks of 512 bytes in
    // dash); SIGXFSZ ignored, so a longer write fails (EFBIG) as on a full disk. stderr is a
    // pipe, which the limit does not touch.
    let script =
        "trap '' XFSZ; ulimit -f 2; exec \"$0\" serve --root \"$1\" --read-write --audit \"$2\"";
    let mut b = Cmd::program("sh", &["-c", script, bin(), s(&root), s(&log)])
        .env("RUST_LOG", "warn")
        .log(Log::Keep)
        .spawn();
    let mut requests = String::new();
    for i in 0..40 {
        let line = json!({"jsonrpc": "2.0", "id": i, "method": "files/delete",
            "params": {"path": format!("root/f{i:02}.txt")}});
        requests += &format!("{line}\n");
    }
    b.send_raw(requests.as_bytes());
    let (_status, out) = b.end();
    let answers: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 40);
    assert!(
        b.log_closed_within(Duration::from_secs(60)),
        "stderr still open"
    );
    let stderr = b.log_text();
    let logged: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let gone: Vec<String> = (0..40)
        .map(|i| format!("root/f{i:02}.txt"))
        .filter(|p| !dir.join(p).exists())
        .collect();
    let refused = answers.iter().filter(|a| a.get("error").is_some()).count();
    assert!(refused > 0, "the log never failed: {logged:#?}");
    // A delete past its commit point holds a file-work thread while it acts, then waits for
    // its line without one: when the log fails, up to one pool's worth may be acting and
    // another pool's worth waiting for their lines (seen on a loaded 2-core machine: 9).
    // Before the re-check, all 40 acted.
    let slots = 2 * std::thread::available_parallelism().map_or(8, |n| (2 * n.get()).max(8));
    let mut unrecorded = 0;
    for p in &gone {
        let in_log = logged
            .iter()
            .any(|l| l["path"] == p.as_str() && l["outcome"] == "ok");
        if !in_log {
            unrecorded += 1;
            assert!(
                stderr.contains(p.as_str()) && stderr.contains("took effect"),
                "{p} was deleted, is not in the log, and stderr does not name it:\n{stderr}"
            );
        }
    }
    assert!(
        unrecorded <= slots,
        "{unrecorded} deletes acted unrecorded (at most {slots} may have been past their \
         commit point or waiting for their lines): {} gone, {} lines",
        gone.len(),
        logged.len()
    );
    assert!(gone.len() < 40, "every file was deleted");
}

/// Rule: a host stopping the broker with SIGTERM (or SIGINT) stops it cleanly: the log is
/// sealed, so the run does not look like a crash, and it exits 0.
#[test]
fn sigterm_seals_the_log() {
    let (_t, root, log) = setup();
    for signal in ["TERM", "INT"] {
        let mut b = serve_audited(&root, &log);
        b.ok("files/read", json!({"path": "root/f.txt"}));
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &b.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let status = with_deadline_wait(&mut b);
        assert_eq!(status.code(), Some(0), "SIG{signal}");
        let text = std::fs::read_to_string(&log).unwrap();
        let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        assert_eq!(last["event"], "seal", "SIG{signal}: {text}");
        assert!(
            last["firstSession"].is_u64(),
            "the seal names its run: {last}"
        );
        let (code, out) = verify(&log);
        assert_eq!(code, 0, "SIG{signal}: {out}");
    }
}

/// Waits for the broker to exit (it must, within 10 s, on its own).
fn with_deadline_wait(b: &mut Fsb) -> std::process::ExitStatus {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(status) = b.try_wait() {
            return status;
        }
        assert!(std::time::Instant::now() < until, "the broker did not stop");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Rule: a log that cannot be written to stderr does not cost requests or their lines. With
/// stderr a pipe nobody reads (the host closed it), a refused probe, which the broker logs on
/// stderr, is still answered and recorded.
#[test]
fn a_closed_stderr_costs_no_answer_and_no_audit_line() {
    let (_t, root, log) = setup();
    let mut b = Cmd::new(&["serve", "--root", s(&root), "--audit", s(&log)])
        .env("RUST_LOG", "debug")
        .log(Log::Closed)
        .spawn();
    let requests = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "files/read", "params": {"path": "/etc/passwd"}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "files/read", "params": {"path": "root/f.txt"}}),
    ];
    for r in &requests {
        b.send_raw(format!("{r}\n").as_bytes());
    }
    let (_status, out) = b.end();
    let answers: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("/etc/passwd"),
        "the refused probe is not in the log: {text}"
    );
    assert!(text.contains("\"seal\""), "{text}");
}

/// Rule: the log is never followed through a symlink: a broker refuses to start on one, and
/// one whose log is replaced by a symlink (to /dev/null, say) while it runs refuses every
/// audited request rather than write its lines there.
#[test]
fn a_log_replaced_by_a_symlink_is_not_written_through() {
    let (_t, root, log) = setup();
    let elsewhere = log.with_file_name("elsewhere.jsonl");
    std::fs::write(&elsewhere, "").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &log).unwrap();
    let out = Command::new(bin())
        .args(["serve", "--root", s(&root), "--audit", s(&log)])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success(), "started on a symlinked log");
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "");

    std::fs::remove_file(&log).unwrap();
    let mut b = serve_audited(&root, &log);
    b.ok("files/read", json!({"path": "root/f.txt"}));
    std::fs::remove_file(&log).unwrap();
    std::os::unix::fs::symlink("/dev/null", &log).unwrap();
    // The first request finds out (its line cannot be written: it is answered IO_ERROR, and
    // named on stderr had it acted); every later one is refused before it acts.
    let e = b.err("files/read", json!({"path": "root/f.txt"}));
    assert_eq!(common::code(&e), "IO_ERROR", "{e}");
    let e = b.err(
        "files/write",
        json!({"path": "root/new.txt", "content": "x"}),
    );
    assert_eq!(common::code(&e), "IO_ERROR", "{e}");
    assert!(
        !root.join("new.txt").exists(),
        "the write acted with nowhere to log it"
    );
    b.finish();
}

/// Rule: SIGTERM never leaves a sealed log that misses a change. A recursive delete of 20,000
/// files is running when the broker is told to stop: the broker takes no more requests, lets
/// the delete finish and be recorded, then seals. (Before, the request's task was dropped: the
/// files went, no line was written, and the log verified sealed.)
#[test]
fn sigterm_lets_running_work_finish_and_be_recorded_before_the_seal() {
    let (_t, root, log) = setup();
    let big = root.join("big");
    std::fs::create_dir(&big).unwrap();
    for i in 0..20_000 {
        std::fs::write(big.join(format!("{i}")), "").unwrap();
    }
    let mut b = serve_audited(&root, &log);
    b.send(
        "files/delete",
        json!({"path": "root/big", "recursive": true}),
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    Command::new("kill")
        .args(["-TERM", &b.pid().to_string()])
        .status()
        .unwrap();
    let status = with_deadline_wait(&mut b);
    let text = std::fs::read_to_string(&log).unwrap();
    let (code, out) = verify(&log);
    let recorded = text.contains("\"files/delete\"");
    let touched = !big.exists() || std::fs::read_dir(&big).unwrap().count() < 20_000;
    if code == 0 {
        assert!(status.success(), "{status}");
        assert!(
            !touched || recorded,
            "the log is sealed and intact, yet the delete acted without a line: {text}"
        );
    } else {
        // Not finished within the grace period: the run is reported, not hidden.
        assert_eq!(code, 3, "{out}");
    }
    assert!(
        touched,
        "the delete never ran: the test did not test anything"
    );
}

/// Rule: a shared broker (`serve --listen`) told to stop takes no more requests on any
/// connection and finishes those it took before it seals: every file written is in the log,
/// and nothing follows the seal.
#[test]
fn a_shared_broker_stopping_records_everything_before_its_seal() {
    let (_t, root, log) = setup();
    let sock = log.with_file_name("broker.sock");
    let mut b = Fsb::spawn(&[
        "serve",
        "--root",
        s(&root),
        "--read-write",
        "--audit",
        s(&log),
        "--listen",
        s(&sock),
    ]);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() {
        assert!(std::time::Instant::now() < until, "no socket");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let writers: Vec<_> = (0..4)
        .map(|c| {
            let sock = sock.clone();
            std::thread::spawn(move || {
                let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&sock) else {
                    return;
                };
                for i in 0..200 {
                    let line = json!({"jsonrpc": "2.0", "id": i, "method": "files/write",
                        "params": {"path": format!("root/c{c}-{i}.txt"), "content": "x"}});
                    if std::io::Write::write_all(&mut conn, format!("{line}\n").as_bytes()).is_err()
                    {
                        return;
                    }
                }
                let mut sink = Vec::new();
                let _ = std::io::Read::read_to_end(&mut conn, &mut sink);
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(150));
    Command::new("kill")
        .args(["-TERM", &b.pid().to_string()])
        .status()
        .unwrap();
    let status = with_deadline_wait(&mut b);
    for w in writers {
        w.join().unwrap();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (code, out) = verify(&log);
    assert_eq!(code, 0, "{out}");
    assert!(status.success(), "{status}");
    assert_eq!(
        lines.last().unwrap()["event"],
        "seal",
        "lines after the seal"
    );
    for entry in std::fs::read_dir(&root).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.starts_with('c') {
            let path = format!("root/{name}");
            assert!(
                lines
                    .iter()
                    .any(|l| l["path"] == path.as_str() && l["outcome"] == "ok"),
                "{path} was written but is not in the log"
            );
        }
    }
}

/// Rule: only a log is mended. A file named as the log by mistake — a text file whose last
/// line has no newline, a file that starts with an empty line, one long line — is refused and
/// left exactly as it was.
#[test]
fn a_file_that_is_not_a_log_is_refused_untouched() {
    let (_t, root, log) = setup();
    for (what, text) in [
        (
            "notes",
            "first note\nsecond note\nthird, unfinished".to_owned(),
        ),
        ("blank first line", "\n{\"hash\":".to_owned()),
        ("one long line", "x".repeat(3 << 20)),
    ] {
        std::fs::write(&log, &text).unwrap();
        let out = Command::new(bin())
            .args(["serve", "--root", s(&root), "--audit", s(&log)])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{what}: started");
        assert!(
            std::fs::read_to_string(&log).unwrap() == text,
            "{what}: the file was changed"
        );
        let (code, _) = verify(&log);
        assert_eq!(code, 1, "{what}");
    }
}

/// Rule: a log whose folders do not exist yet (`~/.local/state/fsbroker/` on a fresh account)
/// is opened all the same: the broker creates each missing folder owner-only (0700), says so
/// on stderr, and the chain it writes there verifies. So for `--audit` and for the policy's
/// `[audit] path`; and a folder made this way is protected like one that existed: a server
/// whose root holds it can neither read the log nor move the folder away.
#[test]
fn missing_folders_of_the_log_are_created_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;

    // `--audit`, two folders deep.
    let (_t, root, _) = setup();
    let base = root.parent().unwrap().to_path_buf();
    let log = base.join("state/fsbroker/audit.jsonl");
    let mut b = Cmd::new(&["serve", "--root", s(&root), "--audit", s(&log)])
        .log(Log::Keep)
        .spawn();
    b.ok("files/read", json!({"path": "root/f.txt"}));
    let stderr = finish_with_log(&mut b);
    for dir in [base.join("state"), base.join("state/fsbroker")] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        assert!(
            stderr.contains(&format!("folder={}", dir.display())),
            "stderr names {}: {stderr}",
            dir.display()
        );
    }
    assert!(
        stderr.contains("created the audit log's missing folder"),
        "{stderr}"
    );
    let (code, out) = verify(&log);
    assert_eq!(code, 0, "{out}");
    // The next run finds the folders there and says nothing of them.
    let mut b = Cmd::new(&["serve", "--root", s(&root), "--audit", s(&log)])
        .log(Log::Keep)
        .spawn();
    b.ok("files/read", json!({"path": "root/f.txt"}));
    let stderr = finish_with_log(&mut b);
    assert!(!stderr.contains("created the audit log"), "{stderr}");
    assert_eq!(verify(&log).0, 0);

    // The policy's `[audit] path` (relative to the policy), inside a read-write root.
    let (_t, root, _) = setup();
    let dir = root.parent().unwrap().to_path_buf();
    let policy = common::write_policy(&dir, &root, "mode = \"read-write\"", "");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text += "\n[audit]\npath = \"root/logs/deep/audit.jsonl\"\n";
    std::fs::write(&policy, text).unwrap();
    let log = root.join("logs/deep/audit.jsonl");
    let mut b = Cmd::new(&["serve", "--policy", s(&policy)])
        .log(Log::Keep)
        .spawn();
    let refused = b.err("files/read", json!({"path": "r/logs/deep/audit.jsonl"}));
    assert_eq!(common::code(&refused), "PERMISSION_DENIED", "{refused}");
    let refused = b.err(
        "files/rename",
        json!({"oldPath": "r/logs", "newPath": "r/moved"}),
    );
    assert_eq!(common::code(&refused), "PERMISSION_DENIED", "{refused}");
    let stderr = finish_with_log(&mut b);
    assert_eq!(mode(&root.join("logs")), 0o700);
    assert_eq!(mode(&root.join("logs/deep")), 0o700);
    assert!(
        stderr.contains("created the audit log's missing folder"),
        "{stderr}"
    );
    let (code, out) = verify(&log);
    assert_eq!(code, 0, "{out}");
}

/// Ends the broker's session and returns its whole stderr (kept: [`Log::Keep`]), after
/// checking that it exited 0.
fn finish_with_log(b: &mut Fsb) -> String {
    let (status, _) = b.end();
    assert!(b.log_closed_within(Duration::from_secs(10)));
    let stderr = b.log_text();
    assert!(status.success(), "{stderr}");
    stderr
}

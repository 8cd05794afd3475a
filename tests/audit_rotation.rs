//! `[audit] max_bytes`: a full log rolls over to a new file whose first line continues the
//! chain, `audit verify` checks the chain across the files, and brokers sharing the log roll
//! it over without losing or forking a line.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::audit::{lines_of, s};
use common::{Fsb, bin};
use serde_json::{Value, json};

/// A root `r` holding `f.txt`, and a policy whose log `audit.jsonl` rolls over past
/// `max_bytes`. Returns (temp dir, its path, the policy, the log).
fn setup(max_bytes: u64) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    common::audit::audited("", &format!("max_bytes = {max_bytes}"))
}

/// The kept files of the log, oldest first (their names sort in time order), then the log.
fn log_files(log: &Path) -> Vec<PathBuf> {
    let dir = log.parent().unwrap();
    let prefix = format!("{}.", log.file_name().unwrap().to_str().unwrap());
    let mut kept: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&prefix)
        })
        .collect();
    kept.sort();
    kept.push(log.to_owned());
    kept
}

fn verify(files: &[PathBuf]) -> (i32, String) {
    common::audit::verify_files(files, &[])
}

/// Rule: past `max_bytes` the log rolls over. Each kept file ends in a `rotate` line and is
/// read-only; the next begins with a `continue` line whose `prev` is that line's hash; the
/// files verify together, oldest first, and every request is in exactly one of them. Verifying
/// with a file left out, or in the wrong order, fails at the file after the gap.
#[test]
fn a_full_log_rolls_over_and_verifies_across_its_files() {
    let (_t, _dir, policy, log) = setup(4096);
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    for _ in 0..100 {
        b.ok("files/read", json!({"path": "r/f.txt"}));
    }
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");

    let files = log_files(&log);
    assert!(files.len() >= 4, "expected several files: {files:?}");
    for (i, f) in files.iter().enumerate() {
        let lines = lines_of(std::slice::from_ref(f));
        let size = std::fs::metadata(f).unwrap().len();
        if i + 1 < files.len() {
            // Full: the line that did not fit went to the next file, then the rotate line
            // closed this one.
            let last_line = std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .last()
                .unwrap()
                .len();
            assert!(size <= 4096 + last_line as u64 + 1, "{f:?}: {size} bytes");
            assert_eq!(lines.last().unwrap()["event"], "rotate", "{f:?}");
            assert_eq!(
                lines.last().unwrap()["file"],
                f.file_name().unwrap().to_str().unwrap(),
                "the rotate line names the file it ends"
            );
            let mode = std::fs::metadata(f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o400, "{f:?} is not read-only");
        }
        if i > 0 {
            assert_eq!(lines[0]["event"], "continue", "{f:?}");
            let before = lines_of(std::slice::from_ref(&files[i - 1]));
            assert_eq!(lines[0]["prev"], before.last().unwrap()["hash"]);
            assert_eq!(
                lines[0]["from"],
                files[i - 1].file_name().unwrap().to_str().unwrap()
            );
        }
    }
    let all = lines_of(&files);
    let reads = all.iter().filter(|l| l["method"] == "files/read").count();
    assert_eq!(reads, 100, "every request in exactly one file");

    let (code, text) = verify(&files);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains(&format!("{} line(s)", all.len())), "{text}");

    // The current file alone verifies, saying what it continues.
    let (code, text) = verify(&files[files.len() - 1..]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("continues"), "{text}");
    // The oldest alone verifies, saying the log goes on.
    let (code, text) = verify(&files[..1]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("goes on in a later file"), "{text}");

    // A file left out.
    let mut gap = files.clone();
    let left_out = gap.remove(1);
    let (code, text) = verify(&gap);
    assert_eq!(code, 1, "verify passed without {left_out:?}: {text}");
    assert!(
        text.contains(&format!("{}: line 1", gap[1].display())),
        "{text}"
    );
    // Out of order.
    let mut swapped = files.clone();
    swapped.swap(0, 1);
    let (code, text) = verify(&swapped);
    assert_eq!(code, 1, "{text}");

    // `audit head` of the files is the current file's last hash.
    let out = Command::new(bin())
        .args(["audit", "head"])
        .args(&files)
        .output()
        .unwrap();
    let head = String::from_utf8(out.stdout).unwrap();
    assert_eq!(head.trim(), all.last().unwrap()["hash"].as_str().unwrap());
}

/// Rule: the seal check works across files. A run that started in a kept file and whose
/// seal was cut from the current file is reported unsealed (exit 3) when the files are
/// verified together.
#[test]
fn a_cut_seal_is_found_across_files() {
    let (_t, _dir, policy, log) = setup(4096);
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    for _ in 0..60 {
        b.ok("files/read", json!({"path": "r/f.txt"}));
    }
    b.finish();
    let files = log_files(&log);
    assert!(files.len() >= 2, "{files:?}");
    assert_eq!(verify(&files).0, 0);
    let text = std::fs::read_to_string(&log).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines.pop().unwrap().contains("\"seal\""));
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    let (code, out) = verify(&files);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("unsealed"), "{out}");
}

/// Rule: brokers sharing one log roll it over together without losing a line or forking the
/// chain. Three brokers append 200 requests each to a log that rolls every 8 KiB; the files
/// verify together and hold every request once, and each roll-over has one `rotate` and one
/// `continue` line.
#[test]
fn three_brokers_rolling_one_log_over_lose_no_line() {
    let (_t, _dir, policy, log) = setup(8192);
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let policy = policy.clone();
            std::thread::spawn(move || {
                let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
                for _ in 0..200 {
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
    let files = log_files(&log);
    let (code, text) = verify(&files);
    assert_eq!(code, 0, "{text}");
    let all = lines_of(&files);
    let count = |f: &dyn Fn(&Value) -> bool| all.iter().filter(|l| f(l)).count();
    assert_eq!(count(&|l| l["method"] == "files/read"), 600);
    assert_eq!(count(&|l| l["event"] == "start"), 3);
    assert_eq!(count(&|l| l["event"] == "seal"), 3);
    let rotations = files.len() - 1;
    assert!(rotations >= 5, "{rotations} roll-overs");
    assert_eq!(count(&|l| l["event"] == "rotate"), rotations);
    assert_eq!(count(&|l| l["event"] == "continue"), rotations);
    // No temp file of a roll-over is left behind.
    let leftovers: Vec<_> = files.iter().filter(|f| s(f).contains(".new-")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Rule: a roll-over that cannot be prepared loses nothing. With the new file's place taken
/// (a folder where the broker writes `audit.jsonl.new-PID`), the log keeps growing in one
/// file, every request is answered and recorded, and no kept name is left behind; once the
/// place is free the next line rolls the log over.
#[test]
fn a_roll_over_that_cannot_happen_keeps_the_log_growing() {
    let (_t, dir, policy, log) = setup(4096);
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let blocker = dir.join(format!("audit.jsonl.new-{}", b.pid()));
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), "").unwrap();
    for _ in 0..60 {
        b.ok("files/read", json!({"path": "r/f.txt"}));
    }
    assert!(std::fs::metadata(&log).unwrap().len() > 4096);
    assert_eq!(log_files(&log), vec![blocker.clone(), log.clone()]);
    std::fs::remove_dir_all(&blocker).unwrap();
    b.ok("files/read", json!({"path": "r/f.txt"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let files = log_files(&log);
    assert_eq!(
        files.len(),
        2,
        "one roll-over once the place was free: {files:?}"
    );
    let (code, text) = verify(&files);
    assert_eq!(code, 0, "{text}");
    let all = lines_of(&files);
    assert_eq!(
        all.iter().filter(|l| l["method"] == "files/read").count(),
        61
    );
}

/// Rule: a log moved away, removed or emptied outside fsbroker (logrotate's `create` or
/// `copytruncate`, a person) does not start a new, unrelated chain: the first line of the new
/// file is a `continue` line chained to the old file's last line, so the files verify
/// together, and a file whose predecessor is gone says so.
#[test]
fn a_log_moved_removed_or_emptied_outside_the_broker_stays_linked() {
    let (_t, dir, policy, log) = setup(1 << 20);
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    let read = |b: &mut Fsb| {
        b.ok("files/read", json!({"path": "r/f.txt"}));
    };
    read(&mut b);

    // logrotate `create`: renamed away, a new empty file in its place.
    let first = dir.join("audit.jsonl.1");
    std::fs::rename(&log, &first).unwrap();
    std::fs::write(&log, "").unwrap();
    read(&mut b);
    // logrotate `copytruncate`: copied, then emptied in place.
    let second = dir.join("audit.jsonl.2");
    std::fs::copy(&log, &second).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&log)
        .unwrap();
    read(&mut b);
    // Removed: the broker creates the file again.
    let third = dir.join("audit.jsonl.3");
    std::fs::copy(&log, &third).unwrap();
    std::fs::remove_file(&log).unwrap();
    read(&mut b);
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");

    let files = vec![first, second, third, log.clone()];
    for f in &files[1..] {
        let lines = lines_of(std::slice::from_ref(f));
        assert_eq!(lines[0]["event"], "continue", "{f:?}: {lines:#?}");
        assert!(lines[0].get("from").is_none());
        assert_eq!(lines[1]["method"], "files/read", "{f:?}");
    }
    let (code, text) = verify(&files);
    assert_eq!(code, 0, "{text}");
    // The last file alone: intact, and it says the history before it is elsewhere.
    let (code, text) = verify(&files[3..]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("continues an earlier file"), "{text}");
    // From any file on, the rest verify; a file left out in the middle breaks the link.
    let (code, text) = verify(&files[1..]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = verify(&[files[0].clone(), files[2].clone()]);
    assert_eq!(code, 1, "{text}");
}

/// Rule: a roll-over a broker did not finish (killed between its `rotate` line and putting the
/// new file in place) is finished by the next broker to write: the kept name gets the full
/// file (read-only), and the log goes on in a new file that continues it.
#[test]
fn an_interrupted_roll_over_is_finished_by_the_next_broker() {
    let (_t, dir, policy, log) = setup(1 << 20);
    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    b.ok("files/read", json!({"path": "r/f.txt"}));
    b.finish();
    // What a broker killed mid-roll leaves: the kept name linked, the rotate line written.
    let kept_name = "audit.jsonl.20990101T000000.000Z";
    let kept = dir.join(kept_name);
    std::fs::hard_link(&log, &kept).unwrap();
    let head = lines_of(std::slice::from_ref(&log)).last().unwrap()["hash"].clone();
    let mut rotate: std::collections::BTreeMap<&str, Value> = std::collections::BTreeMap::new();
    rotate.insert("event", json!("rotate"));
    rotate.insert("file", json!(kept_name));
    rotate.insert("pid", json!(1));
    rotate.insert("prev", head);
    rotate.insert("ts", json!("2099-01-01T00:00:00.000Z"));
    let hash: String = {
        use sha2::Digest;
        sha2::Sha256::digest(serde_json::to_vec(&rotate).unwrap())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    rotate.insert("hash", json!(hash));
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(
        &mut file,
        format!("{}\n", serde_json::to_string(&rotate).unwrap()).as_bytes(),
    )
    .unwrap();
    drop(file);

    let mut b = Fsb::spawn(&["serve", "--policy", s(&policy)]);
    b.ok("files/read", json!({"path": "r/f.txt"}));
    let (status, stderr) = b.finish();
    assert!(status.success(), "{stderr}");
    let now = lines_of(std::slice::from_ref(&log));
    assert_eq!(now[0]["event"], "continue", "{now:#?}");
    assert_eq!(now[0]["from"], kept_name);
    assert_eq!(now[0]["prev"], json!(hash));
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o400);
    let (code, text) = verify(&[kept.clone(), log.clone()]);
    assert_eq!(code, 0, "{text}");
}

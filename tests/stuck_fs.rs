//! A file system that never answers a read, as a hung FUSE or network mount under a root
//! would, through the real binary: `timeout_ms` must hold on the blocking pool and on the fast
//! path (docs/protocol.md, "The fast path"), the session must go on serving everything else,
//! and the broker must still end when its peer leaves.
//!
//! The file system is `tests/common/stuck_fuse.py`, which speaks FUSE on `/dev/fuse` and
//! mounts itself, so these tests need root and `/dev/fuse`; without them they say so and pass.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::policy::{PolicyToml, RootToml};
use common::stuck::StuckFs;
use common::{Fsb, code, tempdir};
use serde_json::json;

const TIMEOUT: i64 = -31005;

/// A root holding `fast.txt` and the stuck file system at `mnt`, and a policy with
/// `timeout_ms` = `timeout_ms`; `None` (with a note) where the file system cannot be mounted.
fn setup(timeout_ms: u64) -> Option<(tempfile::TempDir, PathBuf, StuckFs)> {
    setup_with(timeout_ms, None)
}

/// [`setup`], with an audit log at `audit` when given.
fn setup_with(
    timeout_ms: u64,
    audit: Option<&Path>,
) -> Option<(tempfile::TempDir, PathBuf, StuckFs)> {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("mnt")).unwrap();
    std::fs::write(root.join("fast.txt"), "still here\n").unwrap();
    let fs = match StuckFs::mount(&root.join("mnt")) {
        Ok(fs) => fs,
        Err(why) => {
            common::skipped(&format!(
                "a stuck file system cannot be mounted here: {why}"
            ));
            return None;
        }
    };
    let mut policy = PolicyToml::new()
        .root(RootToml::at(&root).name("r"))
        .table("limits", format!("timeout_ms = {timeout_ms}"));
    if let Some(log) = audit {
        policy = policy.audit(log, "");
    }
    let policy = policy.write_to(&dir.join("policy.toml"));
    Some((t, policy, fs))
}

/// Waits at most `limit` for the process `pid` to end: gone, or a zombie whose main thread
/// has exited (a process with a thread stuck in a FUSE read cannot be reaped before that read
/// ends).
fn ended_within(pid: u32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        match common::kit::state(pid) {
            None | Some('Z') => return true,
            Some(_) if Instant::now() >= end => return false,
            Some(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A broker over the stuck file system. The file system goes first when this is dropped: a
/// process whose threads wait in a FUSE read cannot be reaped until that read ends.
struct Run {
    fs: StuckFs,
    b: Fsb,
}

impl Run {
    /// `fsbroker serve --policy POLICY` over the mounted `fs`.
    fn start(fs: StuckFs, policy: &Path) -> Run {
        let b = Fsb::start(
            &["serve", "--policy", policy.to_str().unwrap()],
            Duration::from_secs(20),
        );
        Run { fs, b }
    }
}

/// The params of a read of `length` bytes of the file whose reads never end.
fn stuck_read(length: u64) -> serde_json::Value {
    json!({"path": "r/mnt/slow.bin", "length": length})
}

#[test]
fn reads_stuck_in_a_hung_file_system_are_answered_timeout_and_everything_else_goes_on() {
    let Some((_t, policy, fs)) = setup(400) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let b = &mut run.b;
    let started = Instant::now();
    // Small reads take the fast path (one of them; the other goes to the pool while the
    // first holds it), a large one the pool: all three are stuck in the file system.
    let small = b.send("files/read", stuck_read(1024));
    let small2 = b.send("files/read", stuck_read(2048));
    let large = b.send(
        "files/read",
        json!({"path": "r/mnt/slow.bin", "length": 512 << 10, "encoding": "base64"}),
    );
    for id in [small, small2, large] {
        let r = b.response(id);
        assert_eq!(r["error"]["code"], TIMEOUT, "request {id}: {r}");
        assert_eq!(code(&r["error"]), "TIMEOUT", "{r}");
    }
    let answered = started.elapsed();
    // While they stay stuck, the session is served: reads of another file, small and large.
    for i in 0..20 {
        let r = b.ok("files/read", json!({"path": "r/fast.txt"}));
        assert_eq!(r["content"], "still here\n", "read {i}: {r}");
    }
    let r = b.ok("ping", json!({}));
    assert!(r.is_object(), "{r}");
    // No answer twice: nothing more arrives for the stuck requests.
    if let Some((_, m)) = b.next_stamped(Duration::from_millis(300)) {
        panic!("unexpected message after the TIMEOUT answers: {m}");
    }
    // The peer leaves: the broker ends although three reads are still stuck. Its process
    // cannot be reaped (nor its descriptors closed) while a thread waits in a FUSE read, so
    // "ended" is its main thread's exit: the process is a zombie waiting for those threads.
    b.close_stdin();
    let ended = ended_within(b.pid(), Duration::from_secs(15));
    println!(
        "stuck reads: TIMEOUT after {answered:?} (timeout_ms 400); ended after the peer left: {ended}"
    );
    assert!(
        ended,
        "the broker did not end while reads were stuck: {}",
        b.log_text()
    );
    // Once the file system goes, the stuck threads end and so does the process.
    drop(run.fs);
    let status = run.b.wait_exit(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "exit: {status:?}");
}

#[test]
fn a_request_answered_for_while_stuck_no_longer_holds_up_upload_chunks_behind_it() {
    // An upload chunk waits for its turn while any request that arrived before it is
    // unanswered, with no deadline of its own. A read stuck on the fast path and answered
    // `TIMEOUT` by the watchdog must stop counting as unanswered, or the chunk would wait for
    // as long as the file system hangs.
    let Some((_t, policy, fs)) = setup(300) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let b = &mut run.b;
    let stuck = b.send("files/read", stuck_read(1024));
    let chunk = b.send(
        "files/write",
        json!({"path": "r/up.bin", "content": "aGVsbG8=", "encoding": "base64",
               "offset": 5, "final": false}),
    );
    let r = b.response(stuck);
    assert_eq!(r["error"]["code"], TIMEOUT, "{r}");
    // Answered (the chunk has no upload to join), not left waiting on the stuck read.
    let r = b.response(chunk);
    assert!(r["error"].is_object(), "{r}");
    assert_ne!(r["error"]["code"], TIMEOUT, "{r}");
    println!("chunk behind a stuck read: {}", r["error"]["message"]);
}

#[test]
fn a_read_answered_by_the_watchdog_is_in_the_sealed_audit_log() {
    // The request's own task writes its audit line when its work returns, which a stuck read
    // never does; the broker may end (and seal its log) before that. The watchdog writes it.
    let (_logs, logs) = tempdir();
    let log = logs.join("audit.log");
    let Some((_t, policy, fs)) = setup_with(300, Some(&log)) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let b = &mut run.b;
    let stuck = b.send("files/read", stuck_read(1024));
    let r = b.response(stuck);
    assert_eq!(r["error"]["code"], TIMEOUT, "{r}");
    let r = b.ok("files/read", json!({"path": "r/fast.txt"}));
    assert_eq!(r["content"], "still here\n", "{r}");
    b.close_stdin();
    assert!(
        ended_within(b.pid(), Duration::from_secs(15)),
        "{}",
        b.log_text()
    );
    drop(run.fs);
    let status = run.b.wait_exit(Duration::from_secs(15));
    assert!(status.is_some_and(|s| s.success()), "exit: {status:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let reads: Vec<&str> = text.lines().filter(|l| l.contains("files/read")).collect();
    assert_eq!(reads.len(), 2, "one line per read, no more:\n{text}");
    assert!(
        reads
            .iter()
            .any(|l| l.contains("slow.bin") && l.contains("TIMEOUT")),
        "no TIMEOUT line for the stuck read:\n{text}"
    );
    let verify = Command::new(common::bin())
        .args(["audit", "verify", log.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "audit verify: {}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// Sends `lines` in one write, so that the broker finds them together and takes them as one
/// batch (src/transport/driver.rs), and returns the ids in the order their answers came.
fn answer_order(b: &mut Fsb, lines: &[(u64, serde_json::Value)]) -> Vec<(u64, serde_json::Value)> {
    let mut bytes = Vec::new();
    for (id, params) in lines {
        bytes.extend(common::request_line(*id, "files/read", params.clone()));
    }
    b.send_raw(&bytes);
    let mut answers = Vec::new();
    while answers.len() < lines.len() {
        let (_, m) = b
            .next_stamped(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("answers so far: {answers:?}\n{}", b.log_text()));
        let id = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        answers.push((id, m));
    }
    answers
}

/// The answer to `stuck` is `TIMEOUT`, and every other one the content of `fast.txt`.
fn assert_stuck_timed_out_and_the_rest_read(answers: &[(u64, serde_json::Value)], stuck: u64) {
    for (id, m) in answers {
        if *id == stuck {
            assert_eq!(m["error"]["code"], TIMEOUT, "{m}");
        } else {
            assert_eq!(m["result"]["content"], "still here\n", "{m}");
        }
    }
}

#[test]
fn a_batch_goes_on_past_a_request_stuck_inline() {
    // The first request of a burst runs inline and never returns. The watchdog answers it at
    // its deadline and must hand the rest of the burst to another runner: nothing else would
    // ever take them.
    let Some((_t, policy, fs)) = setup(400) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let fast = json!({"path": "r/fast.txt"});
    let mut lines = vec![(1001, stuck_read(1024))];
    lines.extend((1002..1008).map(|id| (id, fast.clone())));
    let answers = answer_order(&mut run.b, &lines);
    assert_stuck_timed_out_and_the_rest_read(&answers, 1001);
    let r = run.b.ok("ping", json!({}));
    assert!(r.is_object(), "{r}");
}

#[test]
fn answers_around_a_request_stalled_inline_do_not_wait_for_its_deadline() {
    // In one burst: small reads, then one that runs inline and never returns, then more small
    // reads. The answers of a batch's inline requests go out together, and a request that
    // stalls inline holds its runner: the watchdog must send the answers gathered before it
    // and hand the rest on once it stalls, not at its deadline. Every small read is therefore
    // answered before the stuck one's TIMEOUT, which comes last.
    let Some((_t, policy, fs)) = setup(3000) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let fast = json!({"path": "r/fast.txt"});
    let mut lines: Vec<(u64, serde_json::Value)> =
        (3001..3004).map(|id| (id, fast.clone())).collect();
    lines.push((3004, stuck_read(1024)));
    lines.extend((3005..3008).map(|id| (id, fast.clone())));
    let answers = answer_order(&mut run.b, &lines);
    let ids: Vec<u64> = answers.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.last(), Some(&3004), "answer order: {ids:?}");
    assert_stuck_timed_out_and_the_rest_read(&answers, 3004);
}

#[test]
fn requests_behind_one_waiting_for_the_pool_in_a_batch_do_not_wait_for_it() {
    // A large read goes to the pool and hangs there until its deadline. The small reads that
    // came in the same burst must not queue behind it: they are answered before its TIMEOUT.
    let Some((_t, policy, fs)) = setup(3000) else {
        return;
    };
    let mut run = Run::start(fs, &policy);
    let fast = json!({"path": "r/fast.txt"});
    let mut lines = vec![(
        2001,
        json!({"path": "r/mnt/slow.bin", "length": 512 << 10, "encoding": "base64"}),
    )];
    lines.extend((2002..2008).map(|id| (id, fast.clone())));
    let answers = answer_order(&mut run.b, &lines);
    let ids: Vec<u64> = answers.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.last(), Some(&2001), "answer order: {ids:?}");
    assert_eq!(answers[ids.len() - 1].1["error"]["code"], TIMEOUT);
}

//! Abusing chunked uploads (`files/write` with `offset`), through the real binary over real
//! pipes and Unix sockets, on real temp directories.
//!
//! Each test names the rule it tries to break:
//!
//! - pipelined chunks of one upload are applied in order and all succeed, however many are
//!   sent at once (the broker's small blocking pool must not be filled by chunks waiting for
//!   their turn while the chunk they wait for queues behind them);
//! - a chunk ahead of its turn that nothing in flight could precede is answered at once;
//! - one session's stalled chunks never delay another session's requests;
//! - `max_uploads` (per session, default 16) caps the unfinished uploads, and uploads count
//!   against `max_locks` together with kept locks;
//! - an idle upload is abandoned after `lock_timeout_ms`, like a kept lock;
//! - running out of file descriptors never ends the broker;
//! - a restart at offset 0 replaces its upload and is counted once.
//!
//! Bounds on time here are correctness bounds (an answer that must come before `timeout_ms`
//! could have run out, or a read that must not sit behind another session's stalled work),
//! never speed measurements. Every wait is bounded, so a broker that hangs fails a test.
//!
//! One file though long: every test abuses chunked uploads through the same fixture and checks
//! the same invariants (nothing half-written, staging files gone).

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::{Fsb, Got, Listener};
use common::procs::Pids;
use common::{code, request_line, tempdir, with_deadline, write_policy};

const RW: &str = "mode = \"read-write\"";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A temp dir holding the root `proj` (served as `r`) and `etc` (policy, socket).
struct Fixture {
    _t: tempfile::TempDir,
    root: PathBuf,
    etc: PathBuf,
}

fn fixture() -> Fixture {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    let etc = base.join("etc");
    std::fs::create_dir(&etc).unwrap();
    Fixture { _t: t, root, etc }
}

impl Fixture {
    /// Writes the policy (root read-write, `limits` in `[limits]`) and returns its path.
    fn policy(&self, limits: &str) -> PathBuf {
        write_policy(&self.etc, &self.root, RW, limits)
    }

    /// `fsbroker serve --policy` over pipes.
    fn stdio(&self, limits: &str) -> Fsb {
        let policy = self.policy(limits);
        Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()])
    }

    /// `fsbroker serve --listen SOCK --policy`, optionally under `ulimit -n`.
    fn listen(&self, limits: &str, fd_limit: Option<u32>) -> Listener {
        let policy = self.policy(limits);
        Listener::start_limited(
            &policy,
            &self.etc.join("sock"),
            &[],
            fd_limit,
            &Pids::default(),
        )
    }
}

/// The staging files (`.NAME.fsbroker-HEX.part`) in `dir`.
fn staging_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".fsbroker-") && n.ends_with(".part"))
        .collect();
    names.sort();
    names
}

/// The staging files of the upload to `name` in `dir`.
fn staging_of(dir: &Path, name: &str) -> Vec<String> {
    let prefix = format!(".{name}.fsbroker-");
    staging_files(dir)
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Waits (up to `limit`) until `dir` holds no staging file; returns what is left.
fn wait_no_staging(dir: &Path, limit: Duration) -> Vec<String> {
    let end = Instant::now() + limit;
    loop {
        let left = staging_files(dir);
        if left.is_empty() || Instant::now() >= end {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs the process `pid` (one this test started), so a thread blocked on its pipes or
/// sockets wakes up: for [`with_deadline`]'s timeout.
fn kill(pid: u32) -> impl FnOnce() {
    move || {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// An upload chunk's parameters (text content).
fn chunk_params(path: &str, offset: usize, content: &str, last: bool) -> Value {
    json!({"path": path, "content": content, "offset": offset, "final": last})
}

/// Whether a response is a success.
fn is_ok(r: &Value) -> bool {
    r.get("result").is_some() && r.get("error").is_none()
}

/// The contract code of a response's error, or `"ok"` for a success.
fn outcome(r: &Value) -> String {
    if is_ok(r) {
        "ok".into()
    } else {
        code(&r["error"])
    }
}

/// A 10-byte chunk: `RRR:IIIII\n`.
fn ten_bytes(round: usize, i: usize) -> String {
    let s = format!("{:03}:{:05}\n", round % 1000, i);
    assert_eq!(s.len(), 10);
    s
}

/// One pipelined upload of `n` 10-byte chunks to `r/NAME` over pipes: the first chunk
/// (offset 0, `final: false`) is sent and answered; chunks 1..n-1 (the last `final: true`)
/// then go in ONE write without waiting. Every chunk must succeed, with the right sizes, and
/// the file must be their concatenation. Fails at the first error answer.
fn pipelined_upload(b: &mut Fsb, root: &Path, name: &str, n: usize, round: usize) {
    assert!(n >= 2);
    let path = format!("r/{name}");
    let chunks: Vec<String> = (0..n).map(|i| ten_bytes(round, i)).collect();
    let first = b.request("files/write", chunk_params(&path, 0, &chunks[0], false));
    assert!(is_ok(&first), "round {round}: first chunk: {first}");

    // Ids far above the harness's own counter.
    let base = 1_000_000 + round as u64 * 100_000;
    let mut batch = Vec::new();
    for (i, c) in chunks.iter().enumerate().skip(1) {
        let last = i == n - 1;
        batch.extend(request_line(
            base + i as u64,
            "files/write",
            chunk_params(&path, i * 10, c, last),
        ));
    }
    // Written by a thread of its own (one write_all), so the answers are read meanwhile and
    // neither side's pipe can fill up and stall the other.
    let mut stdin = b.take_stdin();
    let writer = std::thread::spawn(move || {
        stdin.write_all(&batch).expect("write the chunks");
        stdin.flush().expect("flush");
        stdin
    });
    let mut seen = vec![false; n];
    for _ in 1..n {
        let m = b.read_message();
        let id = m["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("round {round}: answer without a numeric id: {m}"));
        let i = id
            .checked_sub(base)
            .map(|i| i as usize)
            .filter(|i| (1..n).contains(i))
            .unwrap_or_else(|| panic!("round {round}: answer to an unknown id: {m}"));
        assert!(!seen[i], "round {round}: chunk {i} answered twice: {m}");
        seen[i] = true;
        let r = m.get("result").unwrap_or_else(|| {
            panic!(
                "round {round}, {n} chunks: pipelined chunk {i} (offset {}) was refused: {m}",
                i * 10
            )
        });
        assert_eq!(r["bytesWritten"], json!(10), "chunk {i}: {m}");
        assert_eq!(r["size"], json!(10 * (i + 1)), "chunk {i}: {m}");
        if i == n - 1 {
            assert!(r["etag"].is_string(), "final chunk without etag: {m}");
        }
    }
    let stdin = writer.join().expect("writer thread");
    b.put_stdin(stdin);
    let want = chunks.concat();
    let got = std::fs::read_to_string(root.join(name)).expect("the committed file");
    assert!(
        got == want,
        "round {round}: file differs from the concatenation of its {n} chunks"
    );
    assert!(
        staging_of(root, name).is_empty(),
        "staging file left: {:?}",
        staging_files(root)
    );
}

/// Policy limits for the pipelining tests: `timeout_ms = 3000`, no request rate limit (a
/// thousand chunks would pass the default burst).
const PIPELINE_LIMITS: &str = "timeout_ms = 3000\nrequests_per_second = 0";

fn pipelined_rounds(n: usize, rounds: usize) {
    let f = fixture();
    let mut b = f.stdio(PIPELINE_LIMITS);
    let root = f.root.clone();
    with_deadline(Duration::from_secs(20), kill(b.pid()), move || {
        for round in 0..rounds {
            pipelined_upload(&mut b, &root, &format!("p{n}-{round}.txt"), n, round);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 1. Pipelined in-order upload commits, every time
// ---------------------------------------------------------------------------------------------

/// Rule: once its first chunk is answered, an upload's next chunks may be sent without waiting,
/// and each is applied in order and answered with success. Ten chunks pipelined (N = 11) are
/// more than the broker's blocking pool (8 threads on a 2-core machine) can hold while they
/// wait for their turn; the chunk they wait for must still run. A hundred rounds, each must
/// pass (a broker that gets it right only when its threads happen to pick the chunks up in
/// order fails some round).
#[test]
fn pipelined_upload_of_11_chunks_commits_every_time() {
    pipelined_rounds(11, 100);
}

/// Rule as above, N = 30 (29 chunks in flight at once), three rounds.
#[test]
fn pipelined_upload_of_30_chunks_commits_every_time() {
    pipelined_rounds(30, 3);
}

/// Rule as above, N = 300 (more than `max_in_flight`, so the broker also stops reading while
/// chunks wait), two rounds.
#[test]
fn pipelined_upload_of_300_chunks_commits_every_time() {
    pipelined_rounds(300, 2);
}

/// Rule as above, N = 1,000, three rounds in one session.
#[test]
fn pipelined_upload_of_1000_chunks_commits_repeatedly() {
    pipelined_rounds(1000, 3);
}

// ---------------------------------------------------------------------------------------------
// 2. A chunk ahead of its turn, with nothing to fill the gap, is answered at once
// ---------------------------------------------------------------------------------------------

/// Rule: a chunk ahead of its upload is answered `CONCURRENCY_CONFLICT` at once when nothing
/// in flight could fill the gap — even when other requests of the session (here: other chunks
/// that are themselves ahead) are in flight. It must not wait out `timeout_ms` (20 s here; the
/// answers must all come within 10 s), and the upload stays usable: the right next offset then
/// succeeds and the upload commits what was staged.
#[test]
fn chunks_ahead_with_nothing_to_fill_the_gap_are_refused_at_once() {
    let f = fixture();
    let mut b = f.stdio("timeout_ms = 20000\nrequests_per_second = 0");
    let root = f.root.clone();
    with_deadline(Duration::from_secs(10), kill(b.pid()), move || {
        let first = b.request(
            "files/write",
            chunk_params("r/g.txt", 0, "0123456789", false),
        );
        assert!(is_ok(&first), "{first}");
        // Ten bytes are staged; none of these starts at 10, and none ends where another
        // starts, so none can ever become the next chunk.
        let offsets = [25usize, 47, 1000, 5000, 123_456, 20];
        let mut batch = Vec::new();
        for (k, off) in offsets.iter().enumerate() {
            batch.extend(request_line(
                500 + k as u64,
                "files/write",
                chunk_params("r/g.txt", *off, "XXXXXXX", k % 2 == 1),
            ));
        }
        b.send_raw(&batch);
        for _ in 0..offsets.len() {
            let m = b.read_message();
            let k = m["id"].as_u64().expect("id") - 500;
            assert_eq!(
                outcome(&m),
                "CONCURRENCY_CONFLICT",
                "chunk at offset {} (10 bytes staged): {m}",
                offsets[k as usize]
            );
        }
        assert!(!root.join("g.txt").exists(), "committed by a refused chunk");
        // The upload is intact and goes on.
        let r = b.request("files/write", chunk_params("r/g.txt", 10, "abc", true));
        assert!(is_ok(&r), "the right next chunk after the refusals: {r}");
        assert_eq!(
            std::fs::read_to_string(root.join("g.txt")).unwrap(),
            "0123456789abc"
        );
        assert!(
            staging_files(&root).is_empty(),
            "{:?}",
            staging_files(&root)
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 3. One session cannot stall another
// ---------------------------------------------------------------------------------------------

/// Rule: a session's chunks that cannot proceed must not hold resources other sessions need.
/// Over `serve --listen` (`timeout_ms = 10000`), session A starts an upload and then, for about
/// three seconds, keeps sending batches of 16–64 chunks at offsets far ahead of it (each must be
/// answered `CONCURRENCY_CONFLICT`). Meanwhile session B reads a 1-KiB file, one request at a
/// time: every read must answer with the data, never `TIMEOUT`, and (a loose correctness
/// bound) within 2 s. A's upload still commits afterwards.
#[test]
fn one_sessions_stalled_chunks_do_not_delay_another_sessions_reads() {
    let f = fixture();
    let data: String = (0..1024).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    std::fs::write(f.root.join("data.txt"), &data).unwrap();
    let broker = f.listen("timeout_ms = 10000\nrequests_per_second = 0", None);
    let root = f.root.clone();
    let pid = broker.pid();
    let sock = broker.sock.clone();
    with_deadline(Duration::from_secs(20), kill(pid), move || {
        let stop = Arc::new(AtomicBool::new(false));
        let batches = Arc::new(AtomicUsize::new(0));
        let mut a = Fsb::connect(&sock);
        a.set_deadline(Duration::from_secs(15));
        let first = a.request(
            "files/write",
            chunk_params("r/up.txt", 0, "0123456789", false),
        );
        assert!(is_ok(&first), "A's first chunk: {first}");

        let (stop_a, batches_a) = (Arc::clone(&stop), Arc::clone(&batches));
        let flooder = std::thread::spawn(move || {
            let mut id = 10_000u64;
            let mut round = 0usize;
            let started = Instant::now();
            while !stop_a.load(Ordering::Acquire) && started.elapsed() < Duration::from_secs(8) {
                let size = 16 + (round * 13) % 49;
                let mut batch = Vec::new();
                let first_id = id;
                for j in 0..size {
                    // Far ahead, and 90 bytes apart: no chunk could fill another's gap.
                    let offset = 1_000_000 + round * 100_000 + j * 100;
                    batch.extend(request_line(
                        id,
                        "files/write",
                        chunk_params("r/up.txt", offset, "YYYYYYYYYY", false),
                    ));
                    id += 1;
                }
                a.try_send_raw(&batch).expect("A: send a batch");
                batches_a.fetch_add(1, Ordering::AcqRel);
                for _ in 0..size {
                    let m = a.read_message();
                    let got = m["id"].as_u64().expect("id");
                    assert!((first_id..id).contains(&got), "A: odd answer {m}");
                    assert_eq!(
                        outcome(&m),
                        "CONCURRENCY_CONFLICT",
                        "A: a chunk far ahead of its upload: {m}"
                    );
                }
                round += 1;
            }
            // The upload was never disturbed: its right next chunk commits it.
            let r = a.request("files/write", chunk_params("r/up.txt", 10, "end", true));
            assert!(is_ok(&r), "A: the right next chunk after the flood: {r}");
            round
        });

        // B starts once A's first batch is on its way.
        let wait_start = Instant::now();
        while batches.load(Ordering::Acquire) == 0 {
            assert!(
                wait_start.elapsed() < Duration::from_secs(5),
                "A never sent"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut b = Fsb::connect(&sock);
        b.set_deadline(Duration::from_secs(6));
        let started = Instant::now();
        let mut reads = 0;
        let mut slowest = Duration::ZERO;
        while started.elapsed() < Duration::from_secs(3) {
            let t = Instant::now();
            let id = b.send("files/read", json!({"path": "r/data.txt"}));
            let r = b.response(id);
            let took = t.elapsed();
            assert!(
                is_ok(&r),
                "B's read {reads} answered {} after {took:?}: {r}",
                outcome(&r)
            );
            assert_eq!(r["result"]["content"], json!(data), "B's read {reads}");
            assert!(
                took < Duration::from_secs(2),
                "B's read {reads} took {took:?} while A flooded"
            );
            slowest = slowest.max(took);
            reads += 1;
        }
        stop.store(true, Ordering::Release);
        let rounds = flooder.join().expect("session A");
        println!("B: {reads} reads, slowest {slowest:?}; A: {rounds} batches");
        assert!(rounds >= 2, "A sent only {rounds} batches during B's reads");
        assert_eq!(
            std::fs::read_to_string(root.join("up.txt")).unwrap(),
            "0123456789end"
        );
        drop(broker);
    });
}

// ---------------------------------------------------------------------------------------------
// 4. max_uploads
// ---------------------------------------------------------------------------------------------

/// Rule: a session has at most `max_uploads` unfinished uploads (new `[limits]` key). With
/// `max_uploads = 4`, the fifth upload's first chunk answers `QUOTA_EXCEEDED` and leaves
/// neither a staging file nor a target; once one of the four is finished, a new upload is
/// accepted (and commits).
#[test]
fn max_uploads_caps_a_sessions_unfinished_uploads() {
    let f = fixture();
    let mut b = f.stdio("max_uploads = 4");
    let root = f.root.clone();
    with_deadline(Duration::from_secs(20), kill(b.pid()), move || {
        for i in 0..4 {
            let r = b.request(
                "files/write",
                chunk_params(&format!("r/u{i}.txt"), 0, "part1-", false),
            );
            assert!(is_ok(&r), "upload {i} of 4: {r}");
        }
        assert_eq!(staging_files(&root).len(), 4, "{:?}", staging_files(&root));
        let r = b.request("files/write", chunk_params("r/u4.txt", 0, "part1-", false));
        assert_eq!(outcome(&r), "QUOTA_EXCEEDED", "a fifth upload: {r}");
        assert!(
            staging_of(&root, "u4.txt").is_empty(),
            "the refused upload left a staging file: {:?}",
            staging_files(&root)
        );
        assert!(
            !root.join("u4.txt").exists(),
            "the refused upload made its target"
        );
        assert_eq!(staging_files(&root).len(), 4);

        // Finish one: a new one fits.
        let r = b.request("files/write", chunk_params("r/u0.txt", 6, "done", true));
        assert!(is_ok(&r), "finishing upload 0: {r}");
        assert_eq!(
            std::fs::read_to_string(root.join("u0.txt")).unwrap(),
            "part1-done"
        );
        let r = b.request("files/write", chunk_params("r/u4.txt", 0, "part1-", false));
        assert!(is_ok(&r), "a new upload after one finished: {r}");
        let r = b.request("files/write", chunk_params("r/u4.txt", 6, "done", true));
        assert!(is_ok(&r), "{r}");
        assert_eq!(
            std::fs::read_to_string(root.join("u4.txt")).unwrap(),
            "part1-done"
        );
        assert_eq!(staging_files(&root).len(), 3, "{:?}", staging_files(&root));
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Uploads count as locks
// ---------------------------------------------------------------------------------------------

/// Rule: an unfinished upload holds a lock, so it counts against `max_locks` together with kept
/// locks. With `max_locks = 2` (`max_uploads` left at its default, 16, far above it): a third
/// concurrent upload answers `QUOTA_EXCEEDED` (no staging file, no target); two uploads in
/// progress leave no room for a `keepLocked` write (refused, the file untouched); one upload
/// plus one kept lock leave no room for another upload; each refusal clears once an upload
/// finishes or the lock is unlocked.
#[test]
fn unfinished_uploads_count_against_max_locks() {
    let f = fixture();
    std::fs::write(f.root.join("k.txt"), "old").unwrap();
    let mut b = f.stdio("max_locks = 2");
    let root = f.root.clone();
    with_deadline(Duration::from_secs(20), kill(b.pid()), move || {
        for name in ["a.txt", "b.txt"] {
            let r = b.request(
                "files/write",
                chunk_params(&format!("r/{name}"), 0, "xx", false),
            );
            assert!(is_ok(&r), "upload {name}: {r}");
        }
        let r = b.request("files/write", chunk_params("r/c.txt", 0, "xx", false));
        assert_eq!(
            outcome(&r),
            "QUOTA_EXCEEDED",
            "a third upload with max_locks = 2: {r}"
        );
        assert!(
            staging_of(&root, "c.txt").is_empty(),
            "{:?}",
            staging_files(&root)
        );
        assert!(!root.join("c.txt").exists());

        // Two uploads: no room for a kept lock either, and the refused write changes nothing.
        let r = b.request(
            "files/write",
            json!({"path": "r/k.txt", "content": "new", "keepLocked": true}),
        );
        assert_eq!(
            outcome(&r),
            "QUOTA_EXCEEDED",
            "keepLocked with two uploads in progress and max_locks = 2: {r}"
        );
        assert_eq!(std::fs::read_to_string(root.join("k.txt")).unwrap(), "old");

        // Finishing one makes room: the kept lock is granted.
        let r = b.request("files/write", chunk_params("r/a.txt", 2, "yy", true));
        assert!(is_ok(&r), "finishing a.txt: {r}");
        let r = b.ok(
            "files/write",
            json!({"path": "r/k.txt", "content": "new", "keepLocked": true}),
        );
        let lock_id = r["lockId"].as_str().expect("lockId").to_owned();
        assert_eq!(std::fs::read_to_string(root.join("k.txt")).unwrap(), "new");

        // One upload (b.txt) + one kept lock = 2: no third.
        let r = b.request("files/write", chunk_params("r/c.txt", 0, "xx", false));
        assert_eq!(
            outcome(&r),
            "QUOTA_EXCEEDED",
            "an upload beside one upload and one kept lock, max_locks = 2: {r}"
        );
        assert!(
            staging_of(&root, "c.txt").is_empty(),
            "{:?}",
            staging_files(&root)
        );

        // Unlocking makes room again.
        b.ok("files/unlock", json!({"lockId": lock_id}));
        let r = b.request("files/write", chunk_params("r/c.txt", 0, "xx", false));
        assert!(is_ok(&r), "an upload after the unlock: {r}");
        for name in ["b.txt", "c.txt"] {
            let r = b.request(
                "files/write",
                chunk_params(&format!("r/{name}"), 2, "zz", true),
            );
            assert!(is_ok(&r), "finishing {name}: {r}");
            assert_eq!(std::fs::read_to_string(root.join(name)).unwrap(), "xxzz");
        }
        assert!(
            staging_files(&root).is_empty(),
            "{:?}",
            staging_files(&root)
        );
    });
}

// ---------------------------------------------------------------------------------------------
// 6. Idle uploads are abandoned after lock_timeout_ms
// ---------------------------------------------------------------------------------------------

/// Rule: an upload's lock is no stronger than a kept lock: an upload left idle longer than
/// `lock_timeout_ms` is abandoned. Over `serve --listen` (`max_locks = 8`,
/// `lock_timeout_ms = 1000`): session A starts an upload to `f.txt` and goes idle; session B's
/// write to `f.txt` answers `FILE_LOCKED` at first, but succeeds 2.5 s after A's chunk; A's
/// staging file is gone, and A's next chunk answers `CONCURRENCY_CONFLICT` (B's content stays).
#[test]
fn an_idle_upload_is_abandoned_after_lock_timeout() {
    let f = fixture();
    let broker = f.listen("max_locks = 8\nlock_timeout_ms = 1000", None);
    let root = f.root.clone();
    let (pid, sock) = (broker.pid(), broker.sock.clone());
    with_deadline(Duration::from_secs(20), kill(pid), move || {
        let mut a = Fsb::connect(&sock);
        let mut b = Fsb::connect(&sock);
        let r = a.request("files/write", chunk_params("r/f.txt", 0, "AAA", false));
        assert!(is_ok(&r), "A's first chunk: {r}");
        let idle_since = Instant::now();
        assert_eq!(staging_of(&root, "f.txt").len(), 1);

        let r = b.request("files/write", json!({"path": "r/f.txt", "content": "BBB"}));
        assert_eq!(
            outcome(&r),
            "FILE_LOCKED",
            "B while A's upload is fresh: {r}"
        );

        std::thread::sleep(Duration::from_millis(2500).saturating_sub(idle_since.elapsed()));
        let r = b.request("files/write", json!({"path": "r/f.txt", "content": "BBB"}));
        assert!(
            is_ok(&r),
            "B 2.5 s after A's upload went idle (lock_timeout_ms = 1000) answered {}: {r}",
            outcome(&r)
        );
        assert_eq!(std::fs::read_to_string(root.join("f.txt")).unwrap(), "BBB");
        let end = Instant::now() + Duration::from_secs(2);
        while !staging_of(&root, "f.txt").is_empty() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            staging_of(&root, "f.txt").is_empty(),
            "A's abandoned upload kept its staging file: {:?}",
            staging_files(&root)
        );

        let r = a.request("files/write", chunk_params("r/f.txt", 3, "CCC", true));
        assert_eq!(
            outcome(&r),
            "CONCURRENCY_CONFLICT",
            "A's next chunk after its upload was abandoned: {r}"
        );
        assert_eq!(std::fs::read_to_string(root.join("f.txt")).unwrap(), "BBB");
        assert_eq!(a.ok("ping", json!({})), json!({}));
        drop(broker);
    });
}

// ---------------------------------------------------------------------------------------------
// 7. Descriptor exhaustion never ends the broker
// ---------------------------------------------------------------------------------------------

/// What a new connection got while the broker was out of descriptors.
#[derive(Debug)]
enum Probe {
    /// Its ping was answered; the connection stays open.
    Served(Box<Fsb>),
    /// One JSON-RPC error line, then the connection was closed.
    Refused(Value),
}

/// Connects and pings. Either the ping is answered (`Served`) or exactly one JSON-RPC error
/// line comes and the connection is closed (`Refused`); anything else (nothing within 5 s, a
/// close without an error line, more after the error) is `Err`.
fn try_probe(sock: &Path) -> Result<Probe, String> {
    let mut c = Fsb::connect(sock);
    c.set_deadline(Duration::from_secs(5));
    // The broker may already have closed the connection: a failed write is no failure yet.
    let id = c.next_id;
    c.next_id += 1;
    let _ = c.try_send_raw(&request_line(id, "ping", json!({})));
    let m = match c.next(c.deadline()) {
        Got::Line(m) => m,
        Got::Eof => return Err("connection closed or reset without a JSON-RPC error line".into()),
        Got::Timeout => return Err("no answer within 5 s (a hang)".into()),
    };
    if m["jsonrpc"] != "2.0" {
        return Err(format!("not JSON-RPC 2.0: {m}"));
    }
    if m["id"] == json!(id) && m.get("result").is_some() {
        return Ok(Probe::Served(Box::new(c)));
    }
    if m.get("error").is_none() {
        return Err(format!("neither the ping's answer nor an error: {m}"));
    }
    match c.next(c.deadline()) {
        Got::Eof => Ok(Probe::Refused(m)),
        Got::Line(more) => Err(format!("after the error {m}, more came: {more}")),
        Got::Timeout => Err(format!("after the error {m}, the connection stayed open")),
    }
}

/// [`try_probe`]; a bad outcome fails the test, saying whether the broker is still running.
fn probe(broker: &mut Listener, label: &str) -> Probe {
    match try_probe(&broker.sock) {
        Ok(p) => {
            if let Some(s) = broker.exited() {
                panic!("{label}: the broker exited ({s}) after {p:?}");
            }
            p
        }
        Err(why) => {
            std::thread::sleep(Duration::from_millis(200));
            let state = match broker.exited() {
                Some(s) => format!("the broker exited ({s})"),
                None => "the broker is still running".into(),
            };
            panic!("{label}: {why}; {state}");
        }
    }
}

/// One upload start (offset 0, `final: false`) to `r/NAME`; the answer.
fn start_upload(c: &mut Fsb, name: &str) -> Value {
    c.request(
        "files/write",
        chunk_params(&format!("r/{name}"), 0, "x", false),
    )
}

/// The second half of the descriptor-exhaustion tests, once `sessions` (still connected)
/// have used up the broker's descriptors: eight new connections, kept open, each get served
/// or one JSON-RPC error line and a close — no hang — and the broker stays alive throughout;
/// once those sessions are gone (their staging files removed), a fresh connection is served
/// normally: ping, a read and a write.
fn while_and_after_exhaustion(broker: &mut Listener, root: &Path, sessions: Vec<Fsb>) {
    let sock = broker.sock.clone();
    assert!(
        broker.exited().is_none(),
        "the broker exited: {:?}",
        broker.exited()
    );
    let mut held = Vec::new();
    let (mut served, mut turned_away) = (0, 0);
    for k in 0..8 {
        match probe(
            broker,
            &format!("new connection {k} while out of descriptors"),
        ) {
            Probe::Served(c) => {
                served += 1;
                held.push(*c);
            }
            Probe::Refused(e) => {
                println!("probe {k} refused: {e}");
                turned_away += 1;
            }
        }
    }
    println!("probes: {served} served, {turned_away} refused with an error line");
    // Served sessions still work.
    for (k, c) in held.iter_mut().enumerate() {
        assert_eq!(c.ok("ping", json!({})), json!({}), "served probe {k}");
    }
    assert!(broker.exited().is_none(), "the broker exited");

    // The sessions that took the descriptors leave; their uploads go, and with them the
    // descriptors.
    drop(sessions);
    drop(held);
    let left = wait_no_staging(root, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "staging files of ended sessions stayed: {} left",
        left.len()
    );
    assert!(broker.exited().is_none(), "the broker exited");

    let mut fresh = Fsb::connect(&sock);
    assert_eq!(fresh.ok("ping", json!({})), json!({}));
    let r = fresh.ok("files/read", json!({"path": "r/hello.txt"}));
    assert_eq!(r["content"], "hello");
    fresh.ok(
        "files/write",
        json!({"path": "r/after.txt", "content": "fine"}),
    );
    assert_eq!(
        std::fs::read_to_string(root.join("after.txt")).unwrap(),
        "fine"
    );
    assert!(broker.exited().is_none(), "the broker exited");
}

/// Rule: running out of file descriptors is an error for the request that needed one, never
/// the end of the broker. `serve --listen` under `ulimit -n 256` with `max_uploads = 100000`
/// and `max_locks = 100000` (so only descriptors can run out): one session A starts unfinished
/// uploads to distinct paths until they are refused (`IO_ERROR` "Too many open files" or
/// `QUOTA_EXCEEDED`; at most 3,000 tries). Then, with A's uploads open, eight new connections
/// each get served or one JSON-RPC error line and a close — no hang — and the broker stays
/// alive; after A disconnects a fresh connection is served normally (ping, read, write).
#[test]
fn descriptor_exhaustion_by_one_sessions_uploads_never_ends_the_broker() {
    let f = fixture();
    std::fs::write(f.root.join("hello.txt"), "hello").unwrap();
    let mut broker = f.listen(
        "max_uploads = 100000\nmax_locks = 100000\nrequests_per_second = 0",
        Some(256),
    );
    let root = f.root.clone();
    let pid = broker.pid();
    with_deadline(Duration::from_secs(30), kill(pid), move || {
        let mut a = Fsb::connect(&broker.sock);
        let mut refused = None;
        let mut accepted = 0;
        for i in 0..3000 {
            let r = start_upload(&mut a, &format!("fd{i:04}.txt"));
            if is_ok(&r) {
                accepted += 1;
                continue;
            }
            let c = outcome(&r);
            assert!(
                c == "IO_ERROR" || c == "QUOTA_EXCEEDED",
                "upload {i} refused with {c}, not IO_ERROR or QUOTA_EXCEEDED: {r}"
            );
            refused = Some((i, r));
            break;
        }
        let (at, first_refusal) =
            refused.expect("3,000 unfinished uploads under ulimit -n 256 were all accepted");
        println!("A: {accepted} uploads accepted, refused from attempt {at}: {first_refusal}");
        // A few more, so that no descriptor is left over.
        for i in 0..20 {
            let r = start_upload(&mut a, &format!("more{i:02}.txt"));
            let c = outcome(&r);
            assert!(
                ["ok", "IO_ERROR", "QUOTA_EXCEEDED"].contains(&c.as_str()),
                "extra upload {i}: {r}"
            );
        }
        while_and_after_exhaustion(&mut broker, &root, vec![a]);
    });
}

/// Rule as above, with the default `max_uploads` (16 per session) and `max_locks` raised:
/// `serve --listen` under `ulimit -n 256`; sessions are opened one after another, each
/// starting unfinished uploads to distinct paths until one is refused (its quota, or
/// `IO_ERROR`), until an upload answers `IO_ERROR` or a new connection is turned away with an
/// error line (at most 3,000 uploads and connections). Every connection along the way must be
/// served or turned away with one error line, never dropped silently or left hanging; then the
/// same checks as above: the broker stays alive, new connections are served or turned away,
/// and once the sessions leave a fresh one is served normally.
#[test]
fn descriptor_exhaustion_by_many_sessions_never_ends_the_broker() {
    let f = fixture();
    std::fs::write(f.root.join("hello.txt"), "hello").unwrap();
    let mut broker = f.listen("max_locks = 100000\nrequests_per_second = 0", Some(256));
    let root = f.root.clone();
    let pid = broker.pid();
    with_deadline(Duration::from_secs(30), kill(pid), move || {
        let mut sessions: Vec<Fsb> = Vec::new();
        let mut attempts = 0;
        let mut accepted = 0;
        let mut exhausted = None;
        'sessions: while attempts < 3000 {
            attempts += 1;
            let k = sessions.len();
            let mut c = match probe(&mut broker, &format!("session {k}'s connection")) {
                Probe::Served(c) => *c,
                Probe::Refused(e) => {
                    exhausted = Some(format!("session {k} turned away: {e}"));
                    break;
                }
            };
            loop {
                if attempts >= 3000 {
                    sessions.push(c);
                    break 'sessions;
                }
                attempts += 1;
                let r = start_upload(&mut c, &format!("s{k:03}-{attempts:04}.txt"));
                match outcome(&r).as_str() {
                    "ok" => accepted += 1,
                    // This session's quota: on to the next.
                    "QUOTA_EXCEEDED" => break,
                    "IO_ERROR" => {
                        exhausted = Some(format!("session {k}: {r}"));
                        sessions.push(c);
                        break 'sessions;
                    }
                    other => panic!("session {k}: upload refused with {other}: {r}"),
                }
            }
            sessions.push(c);
        }
        let how = exhausted.unwrap_or_else(|| {
            panic!(
                "{attempts} connections and uploads ({accepted} accepted) under ulimit -n 256 \
                 never ran out of descriptors"
            )
        });
        println!(
            "{} sessions, {accepted} uploads accepted, out of descriptors: {how}",
            sessions.len()
        );
        while_and_after_exhaustion(&mut broker, &root, sessions);
    });
}

/// Rule: with default limits (`max_uploads` = 16), a flood of upload starts is capped by the
/// quota, not by the descriptor table. `serve --listen` under `ulimit -n 256`: session A makes
/// 3,000 offset-0 `final: false` attempts to distinct paths; the first 16 are accepted and
/// every later one answers `QUOTA_EXCEEDED`, leaving neither a staging file nor a target. The
/// broker stays up, and another session is served (ping, read, write) meanwhile.
#[test]
fn default_max_uploads_caps_a_flood_of_upload_starts() {
    let f = fixture();
    std::fs::write(f.root.join("hello.txt"), "hello").unwrap();
    let mut broker = f.listen("requests_per_second = 0", Some(256));
    let root = f.root.clone();
    let (pid, sock) = (broker.pid(), broker.sock.clone());
    with_deadline(Duration::from_secs(30), kill(pid), move || {
        let mut a = Fsb::connect(&sock);
        for i in 0..16 {
            let r = a.request(
                "files/write",
                chunk_params(&format!("r/q{i:04}.txt"), 0, "x", false),
            );
            assert!(is_ok(&r), "upload {i} of the default 16: {r}");
        }
        // The rest in pipelined batches of 64.
        let mut next = 16usize;
        let mut id = 100_000u64;
        while next < 3000 {
            let end = (next + 64).min(3000);
            let mut batch = Vec::new();
            let first_id = id;
            for i in next..end {
                batch.extend(request_line(
                    id,
                    "files/write",
                    chunk_params(&format!("r/q{i:04}.txt"), 0, "x", false),
                ));
                id += 1;
            }
            a.try_send_raw(&batch).expect("send a batch");
            for _ in next..end {
                let m = a.read_message();
                let i = next + (m["id"].as_u64().expect("id") - first_id) as usize;
                assert_eq!(
                    outcome(&m),
                    "QUOTA_EXCEEDED",
                    "upload start {i} (default max_uploads = 16): {m}"
                );
            }
            next = end;
        }
        assert_eq!(staging_files(&root).len(), 16, "{:?}", staging_files(&root));
        for i in 16..3000 {
            assert!(!root.join(format!("q{i:04}.txt")).exists(), "q{i:04}.txt");
        }
        assert!(broker.exited().is_none(), "the broker exited");

        // Another session is served while A's 16 uploads stay open.
        let mut b = Fsb::connect(&sock);
        assert_eq!(b.ok("ping", json!({})), json!({}));
        assert_eq!(
            b.ok("files/read", json!({"path": "r/hello.txt"}))["content"],
            "hello"
        );
        b.ok("files/write", json!({"path": "r/b.txt", "content": "b"}));
        // And A's own uploads still commit.
        let r = a.request("files/write", chunk_params("r/q0000.txt", 1, "y", true));
        assert!(is_ok(&r), "finishing A's first upload: {r}");
        assert_eq!(
            std::fs::read_to_string(root.join("q0000.txt")).unwrap(),
            "xy"
        );
        assert!(broker.exited().is_none(), "the broker exited");
    });
}

// ---------------------------------------------------------------------------------------------
// 8. A restart at offset 0 counts once
// ---------------------------------------------------------------------------------------------

/// Rule: `offset: 0` while an upload of the same path is in progress replaces that upload; it
/// is one upload and one lock, never two. Under `max_uploads = 1`, and again under
/// `max_locks = 1`, sixteen restarts of one path all succeed (one staging file at a time), the
/// upload then commits the last restart's bytes, and a new upload of another path is accepted
/// afterwards.
#[test]
fn restarting_an_upload_at_offset_zero_counts_once() {
    for limits in ["max_uploads = 1", "max_locks = 1"] {
        let f = fixture();
        let mut b = f.stdio(limits);
        let root = f.root.clone();
        let what = limits.replace('\n', ", ");
        with_deadline(Duration::from_secs(20), kill(b.pid()), move || {
            for i in 0..16 {
                let r = b.request(
                    "files/write",
                    chunk_params("r/re.txt", 0, &format!("restart{i:02}-"), false),
                );
                assert!(is_ok(&r), "{what}: restart {i} at offset 0: {r}");
                assert_eq!(
                    staging_of(&root, "re.txt").len(),
                    1,
                    "{what}: one staging file per upload: {:?}",
                    staging_files(&root)
                );
            }
            let r = b.request("files/write", chunk_params("r/re.txt", 10, "tail", true));
            assert!(is_ok(&r), "{what}: final chunk after the restarts: {r}");
            assert_eq!(
                std::fs::read_to_string(root.join("re.txt")).unwrap(),
                "restart15-tail"
            );
            let r = b.request("files/write", chunk_params("r/next.txt", 0, "n", false));
            assert!(is_ok(&r), "{what}: a new upload after the commit: {r}");
            let r = b.request("files/write", chunk_params("r/next.txt", 1, "m", true));
            assert!(is_ok(&r), "{r}");
            assert!(
                staging_files(&root).is_empty(),
                "{:?}",
                staging_files(&root)
            );
        });
    }
}

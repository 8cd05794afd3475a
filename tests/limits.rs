//! Limits under pressure, through the real binary on real temp dirs: request and byte rates
//! (`RATE_LIMITED` with an honest `retryAfterMs`), per-operation timeouts (`TIMEOUT`, never a
//! torn file), a slow reader, an over-long line, a pipelined load and `max_in_flight`.
//!
//! Figures (retry-after values, VmHWM, requests/s) are printed; run with `--nocapture`.
//! Timing assertions are lower bounds only, so a slow or busy machine cannot fail them.
//!
//! One file though long: each test is one limit of docs/protocol.md section 7 pressed on the
//! same fixture; they share the load generators.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use common::procs::vm_hwm_mib;
use common::{
    Fsb, PolicyToml, RootToml, code, proc_status_kib, request_line, serve_policy, tempdir, uri_path,
};

const RATE_LIMITED: i64 = -31008;
const TIMEOUT: i64 = -31005;

/// Reads `n` messages and returns them by id (`None` for `id: null`); an id answered twice
/// fails the test.
fn collect(b: &mut Fsb, n: usize) -> (HashMap<u64, Value>, Vec<Value>) {
    let mut by_id = HashMap::new();
    let mut null_ids = Vec::new();
    for _ in 0..n {
        let m = b.read_message();
        assert_eq!(m["jsonrpc"], "2.0", "{m}");
        match m["id"].as_u64() {
            Some(id) => {
                let again = by_id.insert(id, m);
                assert!(again.is_none(), "id {id} answered twice");
            }
            None => {
                assert!(m["id"].is_null(), "unexpected id: {m}");
                null_ids.push(m);
            }
        }
    }
    (by_id, null_ids)
}

/// The `retryAfterMs` of a `RATE_LIMITED` response (checked to be the contract's error).
fn retry_after(resp: &Value) -> u64 {
    let e = &resp["error"];
    assert_eq!(e["code"], RATE_LIMITED, "not RATE_LIMITED: {resp}");
    assert_eq!(code(e), "RATE_LIMITED", "{resp}");
    let ms = e["data"]["retryAfterMs"]
        .as_u64()
        .unwrap_or_else(|| panic!("no data.retryAfterMs: {resp}"));
    assert!(ms > 0, "retryAfterMs must be positive: {resp}");
    ms
}

fn is_rate_limited(resp: &Value) -> bool {
    resp["error"]["code"] == RATE_LIMITED
}

fn staging_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".fsbroker-"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. Request rate
// ---------------------------------------------------------------------------------------

#[test]
fn request_rate_is_limited_per_session_with_an_honest_retry_after() {
    let (_t, root) = tempdir();
    std::fs::write(root.join("a.txt"), "hello").unwrap();
    let limits = "requests_per_second = 5\nrequest_burst = 5";
    let (_p, mut b) = serve_policy(&root, "", limits);
    // A second broker process is a second session with its own bucket.
    let (_p2, mut other) = serve_policy(&root, "", limits);
    // ping is never limited, so it shows both are up without spending the burst.
    assert_eq!(b.ok("ping", json!({})), json!({}));
    assert_eq!(other.ok("ping", json!({})), json!({}));

    // A quick burst of 6: the burst (5) passes, the 6th is refused.
    let mut burst = Vec::new();
    for i in 0..6 {
        burst.extend(request_line(1000 + i, "roots/list", json!({})));
    }
    b.send_raw(&burst);
    let (got, _) = collect(&mut b, 6);
    let limited: Vec<&Value> = got.values().filter(|r| is_rate_limited(r)).collect();
    let ok = got.values().filter(|r| r.get("result").is_some()).count();
    assert_eq!((ok, limited.len()), (5, 1), "burst of 6: {got:?}");
    let first_wait = retry_after(limited[0]);
    assert!(
        first_wait <= 200,
        "one request at 5/s is never more than 200 ms away: {first_wait}"
    );
    println!("request rate: 6th of a burst refused, retryAfterMs = {first_wait}");

    // Honest retry-after: waiting exactly that long, the retry succeeds. Then the bucket is
    // empty again, and the next refusal says how long to wait once more.
    let mut wait = first_wait;
    let mut waits = vec![first_wait];
    for round in 0..5 {
        std::thread::sleep(Duration::from_millis(wait));
        let resp = b.request("files/read", json!({"path": "r/a.txt"}));
        assert_eq!(
            resp["result"]["content"], "hello",
            "round {round}: retry after {wait} ms was refused: {resp}"
        );
        // Spend what is left until refused (normally at once).
        let mut refused = None;
        for _ in 0..6 {
            let resp = b.request("roots/list", json!({}));
            if is_rate_limited(&resp) {
                refused = Some(resp);
                break;
            }
        }
        let resp = refused.expect("the bucket never ran dry at 5/s");
        wait = retry_after(&resp);
        assert!(wait <= 200, "{resp}");
        waits.push(wait);
    }
    println!("request rate: retryAfterMs values (each honoured) = {waits:?}");

    // Limited now (the last answer was RATE_LIMITED): ping is still always answered.
    let mut pings = Vec::new();
    for i in 0..100 {
        pings.extend(request_line(5000 + i, "ping", json!({})));
    }
    b.send_raw(&pings);
    let (got, _) = collect(&mut b, 100);
    for i in 0..100 {
        let resp = &got[&(5000 + i)];
        assert_eq!(
            resp["result"],
            json!({}),
            "ping {i} in the limited state: {resp}"
        );
    }
    println!("request rate: 100 pings in the limited state all answered {{}}");

    // Exhaust this session once more, then the other session's full burst passes.
    loop {
        let resp = b.request("roots/list", json!({}));
        if is_rate_limited(&resp) {
            break;
        }
    }
    let mut burst = Vec::new();
    for i in 0..5 {
        burst.extend(request_line(
            9000 + i,
            "files/read",
            json!({"path": "r/a.txt"}),
        ));
    }
    other.send_raw(&burst);
    let (got, _) = collect(&mut other, 5);
    for (id, resp) in &got {
        assert_eq!(
            resp["result"]["content"], "hello",
            "the other session is limited by this one's rate (id {id}): {resp}"
        );
    }
    println!("request rate: a second broker process passed its full burst of 5");
}

// ---------------------------------------------------------------------------------------
// 2. Byte rate
// ---------------------------------------------------------------------------------------

#[test]
fn byte_rate_refuses_with_an_honest_wait_and_slows_large_writes() {
    let (_t, root) = tempdir();
    let content: String = (0..32 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    std::fs::write(root.join("32k.txt"), &content).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "mode = \"read-write\"",
        "bytes_per_second = 65536\nrequests_per_second = 0",
    );
    b.ok("ping", json!({}));

    let read = json!({"path": "r/32k.txt"});
    let r = b.ok("files/read", read.clone());
    assert_eq!(r["content"], content.as_str());
    // More reads at once: the 64 KiB burst runs out.
    let mut oks = 1;
    let limited = loop {
        let resp = b.request("files/read", read.clone());
        if is_rate_limited(&resp) {
            break resp;
        }
        assert_eq!(resp["result"]["content"], content.as_str(), "{resp}");
        oks += 1;
        assert!(
            oks <= 4,
            "64 KiB/s yet {oks} reads of 32 KiB passed at once"
        );
    };
    let mut wait = retry_after(&limited);
    println!("byte rate: {oks} reads of 32 KiB passed, then RATE_LIMITED, retryAfterMs = {wait}");
    assert!(
        wait <= 1000,
        "32 KiB at 64 KiB/s is never more than 500 ms away: {limited}"
    );
    let mut waits = vec![wait];
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(wait));
        let resp = b.request("files/read", read.clone());
        assert_eq!(
            resp["result"]["content"],
            content.as_str(),
            "round {round}: waiting {wait} ms was not enough: {resp}"
        );
        let resp = b.request("files/read", read.clone());
        if !is_rate_limited(&resp) {
            // The sleep overshot by a lot; that read is fine too. Spend one more.
            assert_eq!(resp["result"]["content"], content.as_str(), "{resp}");
            let resp = b.request("files/read", read.clone());
            wait = retry_after(&resp);
        } else {
            wait = retry_after(&resp);
        }
        waits.push(wait);
    }
    println!("byte rate: retryAfterMs values (each honoured) = {waits:?}");

    // A full bucket again, then a write of 200 KiB: more than one second's burst, so it is
    // admitted in burst-sized pieces, waiting for each, not refused.
    std::thread::sleep(Duration::from_millis(1300));
    let big: String = (0..200 * 1024)
        .map(|i| (b'A' + (i % 23) as u8) as char)
        .collect();
    let started = Instant::now();
    let r = b.ok("files/write", json!({"path": "r/big.txt", "content": big}));
    let took = started.elapsed();
    println!("byte rate: write of 200 KiB at 64 KiB/s took {took:?}");
    assert_eq!(r["bytesWritten"], 200 * 1024);
    assert!(
        took > Duration::from_millis(1500),
        "200 KiB at 64 KiB/s must be slowed to ~2 s, took {took:?}"
    );
    assert_eq!(std::fs::read_to_string(root.join("big.txt")).unwrap(), big);
}

/// What the process `pid` has read through system calls so far (`rchar` of
/// `/proc/PID/io`): the bytes asked of files, cached or not.
fn bytes_read(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Attack (issue 41, item 1): at `bytes_per_second` = 1 MiB, a server floods `files/checksum`
/// of a 64 MiB file and big reads, asking again at once after each `RATE_LIMITED`. The disk
/// work is bounded by the rate: a spent budget refuses before reading, and a checksum is
/// paced as it hashes. Before, each answer came after the work, refusals charged nothing,
/// and the broker read about 8 GiB in 5 s.
#[test]
fn the_byte_rate_bounds_what_the_disk_is_read_for() {
    let (_t, root) = tempdir();
    let big = vec![7u8; 64 << 20];
    std::fs::write(root.join("big.bin"), &big).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "",
        "bytes_per_second = 1048576\nrequests_per_second = 0\ntimeout_ms = 2000",
    );
    b.ok("ping", json!({}));
    let before = bytes_read(b.pid());
    let started = Instant::now();
    let mut id = 0u64;
    while started.elapsed() < Duration::from_secs(4) {
        let mut lines = Vec::new();
        for _ in 0..8 {
            id += 1;
            lines.extend(request_line(
                id,
                "files/checksum",
                json!({"path": "r/big.bin"}),
            ));
            id += 1;
            lines.extend(request_line(
                id,
                "files/read",
                json!({"path": "r/big.bin", "encoding": "base64", "length": 4 << 20}),
            ));
        }
        b.send_raw(&lines);
        let (got, _) = collect(&mut b, 16);
        for r in got.values() {
            assert!(
                r.get("result").is_some() || r["error"]["data"]["code"].is_string(),
                "{r}"
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let read = bytes_read(b.pid()) - before;
    println!(
        "byte rate: {id} requests in {secs:.1} s; the broker read {:.1} MiB",
        read as f64 / f64::from(1 << 20)
    );
    // The rate for the time taken (and the 2 s the last requests may take), its one-second
    // burst, and a few 256 KiB pieces of hashing or small reads in flight.
    let bound = (secs + 1.0 + 2.0) * f64::from(1 << 20) + f64::from(16 << 20);
    assert!(
        (read as f64) < bound,
        "at 1 MiB/s the broker read {read} bytes in {secs:.1} s"
    );
}

/// Rule: small reads (64 KiB and under, the fast path) pay for what they may read before
/// they read it, too: a flood of them at 64 KiB/s, with a `timeout_ms` short enough that
/// paying runs out of time, reads the disk at the rate. Before, a small read read first and
/// paid after, and one refused `TIMEOUT` while paying had read for nothing: 64 at once read
/// 64 × 64 KiB per `timeout_ms`, whatever the rate (the hostile review of round 4 measured
/// 20 times the limit).
#[test]
fn small_reads_pay_before_they_read() {
    let (_t, root) = tempdir();
    std::fs::write(root.join("f.bin"), vec![3u8; 1 << 20]).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "",
        "bytes_per_second = 65536\nrequests_per_second = 0\ntimeout_ms = 500",
    );
    b.ok("ping", json!({}));
    let before = bytes_read(b.pid());
    let started = Instant::now();
    let mut id = 0u64;
    while started.elapsed() < Duration::from_secs(4) {
        let mut lines = Vec::new();
        for _ in 0..64 {
            id += 1;
            lines.extend(request_line(
                id,
                "files/read",
                json!({"path": "r/f.bin", "encoding": "base64", "length": 65536, "offset": (id % 16) * 65536}),
            ));
        }
        b.send_raw(&lines);
        let (got, _) = collect(&mut b, 64);
        for r in got.values() {
            assert!(
                r.get("result").is_some() || r["error"]["data"]["code"].is_string(),
                "{r}"
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let read = bytes_read(b.pid()) - before;
    println!(
        "small reads: {id} requests in {secs:.1} s; the broker read {:.1} KiB",
        read as f64 / 1024.0
    );
    // The rate for the time taken and the last requests' 0.5 s, its one-second burst, and
    // the few reads that had paid when the flood stopped.
    let bound = (secs + 0.5 + 1.0) * 65536.0 + f64::from(4 * 65536);
    assert!(
        (read as f64) < bound,
        "at 64 KiB/s small reads read {read} bytes in {secs:.1} s"
    );
}

/// The threads of `pid` sleeping in `clock_nanosleep` now: what waiting out a byte rate on a
/// thread of the blocking pool looks like (tokio's own waits are `epoll_wait` and `futex`).
fn threads_sleeping(pid: u32) -> usize {
    #[cfg(target_arch = "x86_64")]
    const CLOCK_NANOSLEEP: &str = "230";
    #[cfg(target_arch = "aarch64")]
    const CLOCK_NANOSLEEP: &str = "115";
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("syscall"))
                .is_ok_and(|s| s.split(' ').next() == Some(CLOCK_NANOSLEEP))
        })
        .count()
}

/// Attack (issue 41, round 4 review): a server under a byte rate floods big reads and
/// checksums, each admitted by the budget's first KiB, so that each then waits out the rate.
/// The wait must happen off the blocking pool: before, each waited on a pool thread, asleep,
/// and one session held six of the broker's eight threads until `timeout_ms`, leaving the
/// other sessions two. Now no pool thread sleeps for the rate (the fast path's watchdog may
/// tick: at most one thread).
#[test]
fn waiting_out_the_byte_rate_holds_no_pool_thread() {
    let (_t, root) = tempdir();
    std::fs::write(root.join("f.bin"), vec![5u8; 4 << 20]).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "",
        "bytes_per_second = 65536\nrequests_per_second = 0\ntimeout_ms = 3000\nmax_chunk_size = 4194304",
    );
    b.ok("ping", json!({}));
    let mut lines = Vec::new();
    for id in 1..=24u64 {
        let (method, params) = if id % 2 == 0 {
            (
                "files/read",
                json!({"path": "r/f.bin", "encoding": "base64", "length": 2 << 20}),
            )
        } else {
            ("files/checksum", json!({"path": "r/f.bin"}))
        };
        lines.extend(request_line(id, method, params));
    }
    b.send_raw(&lines);
    let mut most = 0;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        most = most.max(threads_sleeping(b.pid()));
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("threads asleep for the byte rate, at most: {most}");
    let (got, _) = collect(&mut b, 24);
    let waited = got
        .values()
        .filter(|r| r["error"]["code"] == TIMEOUT)
        .count();
    println!("{waited} of 24 waited out the rate until timeout_ms");
    assert!(waited >= 2, "the flood never waited for the rate: {got:?}");
    assert!(
        most <= 1,
        "{most} threads of the broker slept waiting out a session's byte rate"
    );
    // The session goes on.
    b.ok("ping", json!({}));
}

/// Attack (issue 41, round 4 review, F2): `files/write` with `append` copies the file as it
/// is into its staging file, reading all of it from the disk. That read pays the byte rate
/// as a read would, before it is done. Before, a flood of one-byte appends to a 1 MiB file
/// read a mebibyte a request at any rate.
#[test]
fn an_append_pays_for_the_file_it_copies() {
    let (_t, root) = tempdir();
    let original = vec![7u8; 1 << 20];
    std::fs::write(root.join("log.bin"), &original).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "mode = \"read-write\"",
        "bytes_per_second = 65536\nrequests_per_second = 0\ntimeout_ms = 500",
    );
    b.ok("ping", json!({}));
    let before = bytes_read(b.pid());
    let started = Instant::now();
    let mut id = 0u64;
    let mut appended = 0usize;
    while started.elapsed() < Duration::from_secs(3) {
        let mut lines = Vec::new();
        for _ in 0..16 {
            id += 1;
            lines.extend(request_line(
                id,
                "files/write",
                json!({"path": "r/log.bin", "content": "x", "append": true}),
            ));
        }
        b.send_raw(&lines);
        let (got, _) = collect(&mut b, 16);
        for r in got.values() {
            match r.get("result") {
                Some(_) => appended += 1,
                None => assert!(
                    [RATE_LIMITED, TIMEOUT].contains(&r["error"]["code"].as_i64().unwrap_or(0)),
                    "{r}"
                ),
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let read = bytes_read(b.pid()) - before;
    println!(
        "appends: {id} requests in {secs:.1} s, {appended} appended; the broker read {:.1} KiB",
        read as f64 / 1024.0
    );
    // The rate for the time taken, its one-second burst, and one copy that had paid.
    let bound = (secs + 1.0) * 65536.0 + f64::from(1 << 20) + 65536.0;
    assert!(
        (read as f64) < bound,
        "at 64 KiB/s appends read {read} bytes in {secs:.1} s"
    );
    // Nothing half-written: the file is the original and whole appends.
    let now = std::fs::read(root.join("log.bin")).unwrap();
    assert_eq!(&now[..1 << 20], &original[..]);
    assert_eq!(now.len(), (1 << 20) + appended);
    assert!(now[1 << 20..].iter().all(|&c| c == b'x'));
}

// ---------------------------------------------------------------------------------------
// 3. Timeouts
// ---------------------------------------------------------------------------------------

#[test]
fn timeouts_answer_timeout_and_never_leave_a_torn_file() {
    let (_t, root) = tempdir();
    // ~20,000 entries: 100 directories of 200 files.
    for d in 0..100 {
        let dir = root.join(format!("tree/d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..200 {
            std::fs::File::create(dir.join(format!("f{f:03}"))).unwrap();
        }
    }
    let old = vec![b'o'; 1000];
    std::fs::write(root.join("target.bin"), &old).unwrap();
    let (_p, mut b) = serve_policy(
        &root,
        "mode = \"read-write\"",
        "timeout_ms = 1\nrequests_per_second = 0\nmax_chunk_size = 8388608",
    );
    assert_eq!(b.ok("ping", json!({})), json!({}));

    for attempt in 0..3 {
        let started = Instant::now();
        let e = b.err("files/list", json!({"path": "r/tree", "recursive": true}));
        assert_eq!(e["code"], TIMEOUT, "attempt {attempt}: {e}");
        assert_eq!(code(&e), "TIMEOUT", "{e}");
        println!(
            "timeout: recursive list of 20,100 entries → TIMEOUT after {:?}",
            started.elapsed()
        );
    }

    // 8 MiB writes (max_chunk_size) at timeout_ms = 1: each is done or not done, never torn.
    let mut expected = old.clone();
    let (mut timeouts, mut successes) = (0, 0);
    for i in 0..10u8 {
        let letter = b'a' + i;
        let new = vec![letter; 8 << 20];
        let text = String::from_utf8(new.clone()).unwrap();
        let resp = b.request(
            "files/write",
            json!({"path": "r/target.bin", "content": text}),
        );
        let now = std::fs::read(root.join("target.bin")).unwrap();
        let outcome = if resp["error"]["code"] == TIMEOUT {
            assert_eq!(code(&resp["error"]), "TIMEOUT", "{resp}");
            timeouts += 1;
            "TIMEOUT"
        } else {
            assert_eq!(
                resp["result"]["bytesWritten"],
                8 << 20,
                "write {i}: neither TIMEOUT nor done: {resp}"
            );
            successes += 1;
            expected = new;
            "done"
        };
        assert!(
            now == expected,
            "write {i} ({outcome}): the target is torn or wrong at once: {} bytes, first {:?}",
            now.len(),
            now.first().map(|&c| c as char)
        );
        // Let the work in the background finish (and roll back), then look again.
        std::thread::sleep(Duration::from_secs(1));
        let later = std::fs::read(root.join("target.bin")).unwrap();
        assert!(
            later == expected,
            "write {i}: the target changed after its answer: {} bytes, first {:?}",
            later.len(),
            later.first().map(|&c| c as char)
        );
        let staged = staging_files(&root);
        assert!(
            staged.is_empty(),
            "write {i}: staging files left: {staged:?}"
        );
    }
    println!(
        "timeout: 10 writes of 8 MiB at timeout_ms = 1: {timeouts} TIMEOUT, {successes} done; none torn, no staging file left"
    );
    assert!(timeouts >= 1, "no write of 8 MiB timed out at 1 ms");

    // The session goes on.
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r", "{roots}");
}

// ---------------------------------------------------------------------------------------
// 4. Slow reader
// ---------------------------------------------------------------------------------------

/// 64 KiB that are not UTF-8 (so they travel as base64, ~87 KiB per response).
fn binary_64k() -> Vec<u8> {
    let mut rng = common::kit::Rng::new(0x1234_5678);
    rng.bytes(64 * 1024).into_iter().map(|b| b | 0x80).collect()
}

#[test]
fn a_slow_reader_stalls_the_broker_not_its_memory() {
    let (_t, root) = tempdir();
    let data = binary_64k();
    std::fs::write(root.join("f.bin"), &data).unwrap();
    let (_p, mut b) = serve_policy(&root, "", "requests_per_second = 0");
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let pid = b.pid();
    let base = vm_hwm_mib(pid);

    // ~4 MB of requests: more than the broker's input pipe (grown to 1 MiB), its line buffer
    // and its requests in flight can absorb together.
    const N: u64 = 2000;
    let pad = "p".repeat(2000);
    let mut stdin = b.take_stdin();
    let written = Arc::new(AtomicUsize::new(0));
    let writer = {
        let written = Arc::clone(&written);
        std::thread::spawn(move || {
            for i in 0..N {
                let line = request_line(
                    10_000 + i,
                    "files/read",
                    json!({"path": "r/f.bin", "encoding": "base64", "_meta": {"pad": pad}}),
                );
                stdin.write_all(&line).expect("write a request");
                written.fetch_add(1, Ordering::SeqCst);
            }
            stdin.flush().unwrap();
            stdin
        })
    };
    // Read nothing for ~2 s; watch the broker's memory meanwhile.
    let mut peak_rss = 0;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        peak_rss = peak_rss.max(proc_status_kib(pid, "VmRSS"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent_while_stalled = written.load(Ordering::SeqCst);
    println!(
        "slow reader: after 2 s unread, {sent_while_stalled} of {N} requests were accepted by the broker's input; VmRSS peak {:.1} MiB",
        peak_rss as f64 / 1024.0
    );
    assert!(
        sent_while_stalled < N as usize,
        "the broker read all {N} requests while its output was not read: it buffers instead of stopping"
    );

    let started = Instant::now();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..N {
        let m = b.read_message();
        let id = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        assert!((10_000..10_000 + N).contains(&id), "unknown id: {m}");
        assert!(seen.insert(id), "id {id} answered twice");
        let r = &m["result"];
        assert_eq!(r["encoding"], "base64", "id {id}: {m}");
        let got = base64::engine::general_purpose::STANDARD
            .decode(r["content"].as_str().unwrap())
            .unwrap();
        assert!(got == data, "id {id}: wrong content");
    }
    let stdin = writer.join().expect("writer thread");
    b.put_stdin(stdin);
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let hwm = vm_hwm_mib(pid);
    println!(
        "slow reader: all {N} answered once (drained in {:?}); VmHWM {base:.1} MiB before, {hwm:.1} MiB after",
        started.elapsed()
    );
    assert!(hwm < 256.0, "VmHWM {hwm:.1} MiB");
}

// ---------------------------------------------------------------------------------------
// 5. Over-long line
// ---------------------------------------------------------------------------------------

#[test]
fn a_40_mib_line_is_refused_without_being_held() {
    let (_t, root) = tempdir();
    let (_p, mut b) = serve_policy(&root, "", "");
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let pid = b.pid();
    let before = vm_hwm_mib(pid);

    const LEN: usize = 40 << 20;
    let head = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":""#;
    let tail = br#""}}"#;
    let mut line = Vec::with_capacity(LEN + 1);
    line.extend_from_slice(head);
    line.resize(LEN - tail.len(), b'x');
    line.extend_from_slice(tail);
    assert_eq!(line.len(), LEN);
    line.push(b'\n');
    b.send_raw(&line);
    drop(line);

    let m = b.read_message();
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    let message = m["error"]["message"].as_str().unwrap_or_default();
    println!("over-long line: answered {m}");
    assert!(
        message.contains(&LEN.to_string()),
        "the message should give the line's length ({LEN}): {message}"
    );
    // The session goes on.
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let roots = b.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r");
    let after = vm_hwm_mib(pid);
    let rss_now = proc_status_kib(pid, "VmRSS") as f64 / 1024.0;
    println!(
        "over-long line: VmHWM {before:.1} MiB before, {after:.1} MiB after (growth {:.1} MiB); VmRSS now {rss_now:.1} MiB",
        after - before
    );
    assert!(
        after - before < 48.0,
        "holding a 40 MiB line: VmHWM grew by {:.1} MiB",
        after - before
    );
    // Once refused, the line's memory is given back: the resident size returns near where it
    // started instead of keeping the 32 MiB high-water mark for the rest of the session.
    let base_rss = before;
    assert!(
        rss_now - base_rss < 16.0,
        "after the over-long line VmRSS is {rss_now:.1} MiB (VmHWM before it {base_rss:.1} MiB)"
    );
}

// ---------------------------------------------------------------------------------------
// 6. Load
// ---------------------------------------------------------------------------------------

enum Expect {
    Read(usize),
    List,
    Roots,
    Ping,
    Write(String, String),
    Error(i64, &'static str),
}

#[test]
fn ten_thousand_pipelined_requests_are_each_answered_once_and_right() {
    let (_t, root) = tempdir();
    let sizes = [0usize, 1, 17, 100, 1000, 4096, 10_000, 20_000];
    let unit = "héllo wörld ✓ 0123456789\n";
    let files: Vec<String> = sizes
        .iter()
        .map(|&n| {
            let mut s = String::new();
            while s.len() < n {
                s.push_str(unit);
            }
            s
        })
        .collect();
    std::fs::create_dir(root.join("data")).unwrap();
    std::fs::create_dir(root.join("w")).unwrap();
    for (i, f) in files.iter().enumerate() {
        std::fs::write(root.join(format!("data/f{i}.txt")), f).unwrap();
    }
    let names: Vec<String> = (0..files.len()).map(|i| format!("f{i}.txt")).collect();
    let (_p, mut b) = serve_policy(&root, "mode = \"read-write\"", "requests_per_second = 0");
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let pid = b.pid();

    const N: u64 = 10_000;
    const FIRST: u64 = 100_000;
    let mut plan = HashMap::new();
    let mut input = Vec::new();
    let mut parse_errors = 0;
    for i in 0..N {
        let id = FIRST + i;
        let (method, params, expect) = match i % 20 {
            15 if i % 100 == 15 => {
                let path = format!("r/w/out{id}.txt");
                let text = format!("written by request {id}\n");
                (
                    "files/write",
                    json!({"path": path, "content": text}),
                    Expect::Write(format!("w/out{id}.txt"), text),
                )
            }
            0..=9 | 15 => {
                let f = (i as usize / 20 + i as usize) % files.len();
                (
                    "files/read",
                    json!({"path": format!("r/data/f{f}.txt")}),
                    Expect::Read(f),
                )
            }
            10 | 11 => ("files/list", json!({"path": "r/data"}), Expect::List),
            12 => ("roots/list", json!({}), Expect::Roots),
            13 | 14 => ("ping", json!({}), Expect::Ping),
            16 => (
                "files/read",
                json!({"path": "r/data/missing.txt"}),
                Expect::Error(-31001, "FILE_NOT_FOUND"),
            ),
            17 => (
                "files/read",
                json!({"path": "../../etc/passwd"}),
                Expect::Error(-31002, "PERMISSION_DENIED"),
            ),
            18 => ("files/nope", json!({}), Expect::Error(-32601, "")),
            _ => (
                "files/read",
                json!({"path": "r/data/f1.txt", "lenght": 5}),
                Expect::Error(-32602, ""),
            ),
        };
        input.extend(request_line(id, method, params));
        plan.insert(id, expect);
        if i % 500 == 250 {
            // Not JSON: answered -32700 with id null.
            input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":\n");
            parse_errors += 1;
        }
    }

    let mut stdin = b.take_stdin();
    let started = Instant::now();
    let writer = std::thread::spawn(move || {
        for piece in input.chunks(64 << 10) {
            stdin.write_all(piece).expect("write requests");
        }
        stdin.flush().unwrap();
        stdin
    });
    let (got, nulls) = collect(&mut b, N as usize + parse_errors);
    let elapsed = started.elapsed();
    let stdin = writer.join().expect("writer thread");
    b.put_stdin(stdin);
    let hwm = vm_hwm_mib(pid);

    assert_eq!(got.len(), N as usize);
    assert_eq!(nulls.len(), parse_errors);
    for m in &nulls {
        assert_eq!(m["error"]["code"], -32700, "{m}");
    }
    let root_uri = format!("file://{}", uri_path(&root));
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (id, expect) in &plan {
        let m = got
            .get(id)
            .unwrap_or_else(|| panic!("id {id} not answered"));
        let r = &m["result"];
        let kind = match expect {
            Expect::Read(f) => {
                assert_eq!(r["content"], files[*f].as_str(), "id {id}: {m}");
                assert_eq!(r["encoding"], "utf-8", "id {id}: {m}");
                assert_eq!(r["size"], files[*f].len(), "id {id}: {m}");
                assert_eq!(r["eof"], true, "id {id}: {m}");
                "read"
            }
            Expect::List => {
                let listed: Vec<&str> = r["entries"]
                    .as_array()
                    .unwrap_or_else(|| panic!("id {id}: {m}"))
                    .iter()
                    .map(|e| e["name"].as_str().unwrap())
                    .collect();
                assert_eq!(listed, names, "id {id}: {m}");
                "list"
            }
            Expect::Roots => {
                assert_eq!(
                    r["roots"],
                    json!([{"uri": root_uri, "name": "r"}]),
                    "id {id}: {m}"
                );
                "roots/list"
            }
            Expect::Ping => {
                assert_eq!(*r, json!({}), "id {id}: {m}");
                "ping"
            }
            Expect::Write(rel, text) => {
                assert_eq!(r["bytesWritten"], text.len(), "id {id}: {m}");
                assert_eq!(
                    std::fs::read_to_string(root.join(rel)).unwrap(),
                    *text,
                    "id {id}"
                );
                "write"
            }
            Expect::Error(num, data_code) => {
                assert_eq!(m["error"]["code"], *num, "id {id}: {m}");
                if !data_code.is_empty() {
                    assert_eq!(code(&m["error"]), *data_code, "id {id}: {m}");
                }
                "error"
            }
        };
        *counts.entry(kind).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort();
    println!(
        "load: {N} requests (+{parse_errors} non-JSON lines) answered in {elapsed:?}: {:.0} requests/s; mix {counts:?}; VmHWM {hwm:.1} MiB",
        N as f64 / elapsed.as_secs_f64()
    );
    assert!(staging_files(&root.join("w")).is_empty());
    assert!(hwm < 256.0, "VmHWM {hwm:.1} MiB");
}

// ---------------------------------------------------------------------------------------
// 7. max_in_flight
// ---------------------------------------------------------------------------------------

#[test]
fn max_in_flight_stops_reading_until_a_request_finishes() {
    let (_t, root) = tempdir();
    std::fs::write(root.join("a.txt"), "a").unwrap();
    let (_pt, pdir) = tempdir();
    let script = pdir.join("slow-consent.sh");
    std::fs::write(
        &script,
        "cat >/dev/null\nsleep 1\necho '{\"granted\": false}'\n",
    )
    .unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("r").consent("prompt"))
        .consent_command(&[Path::new("/bin/sh"), &script], "")
        .unlimited_with("max_in_flight = 2")
        .write_to(&pdir.join("policy.toml"));
    let mut b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    assert_eq!(b.ok("ping", json!({})), json!({}));

    let mut input = Vec::new();
    for i in 1..=3 {
        input.extend(request_line(
            i,
            "files/consent",
            json!({"message": "slow", "requestedPaths": ["r/a.txt"]}),
        ));
    }
    input.extend(request_line(4, "ping", json!({})));
    let started = Instant::now();
    b.send_raw(&input);
    let mut arrivals = HashMap::new();
    for _ in 0..4 {
        let m = b.read_message();
        let id = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        assert!(
            arrivals.insert(id, (started.elapsed(), m)).is_none(),
            "id {id} answered twice"
        );
    }
    let mut order: Vec<(u64, Duration)> = arrivals.iter().map(|(id, (t, _))| (*id, *t)).collect();
    order.sort_by_key(|(_, t)| *t);
    println!("max_in_flight = 2: arrivals (id, after) = {order:?}");
    for id in 1..=3 {
        let (_, m) = &arrivals[&id];
        assert_eq!(m["result"]["granted"], false, "consent {id}: {m}");
    }
    let (ping_at, ping) = &arrivals[&4];
    assert_eq!(ping["result"], json!({}), "{ping}");
    let first_consent = (1..=3).map(|id| arrivals[&id].0).min().unwrap();
    assert!(
        *ping_at >= Duration::from_millis(900),
        "the ping was read while 2 consents were in flight: answered after {ping_at:?}"
    );
    assert!(
        *ping_at >= first_consent,
        "the ping ({ping_at:?}) came before any consent finished ({first_consent:?})"
    );
}

#[test]
fn a_burst_is_answered_whole_with_a_single_request_slot() {
    // A burst that arrives in one write is taken as a batch (src/transport/driver.rs); its
    // requests each need a slot, and with `max_in_flight = 1` the batch must start before its
    // second request can have one, or nothing is ever answered.
    let (_t, root) = tempdir();
    std::fs::write(root.join("a.txt"), "a").unwrap();
    let (_pt, pdir) = tempdir();
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("r"))
        .unlimited_with("max_in_flight = 1")
        .write_to(&pdir.join("policy.toml"));
    let mut b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    let mut input = Vec::new();
    for i in 1..=20 {
        let (method, params) = if i % 2 == 0 {
            ("ping", json!({}))
        } else {
            ("files/read", json!({"path": "r/a.txt"}))
        };
        input.extend(request_line(i, method, params));
    }
    b.send_raw(&input);
    let mut seen = HashMap::new();
    for _ in 1..=20 {
        let m = b.read_message();
        let id = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        assert!(m.get("result").is_some(), "{m}");
        assert!(seen.insert(id, m).is_none(), "id {id} answered twice");
    }
    assert_eq!(seen[&1]["result"]["content"], "a");
}

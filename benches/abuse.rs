//! Abuse soak: one hostile session and three honest ones against ONE shared broker
//! (`fsbroker serve --listen SOCK --policy FILE`), for minutes, with the broker's memory
//! sampled every second.
//!
//! The policy has one read-write root and `requests_per_second = 0`; every other limit is the
//! broker's default (`max_sessions` 64, `max_uploads` 16, `max_pending_input` 96 MiB,
//! `timeout_ms` 60 s, `max_in_flight` 64).
//!
//! Honest sessions, each on its own connection, one request at a time, every answer checked
//! byte for byte:
//! 1. 1 KiB base64 `files/read`s of a fixed 64 KiB file;
//! 2. small atomic writes (1 B to 4 KiB, base64) each read back;
//! 3. uploads of 1 MiB in 64 KiB chunks: the first chunk alone, the other 15 pipelined once
//!    it is answered; then the file is read back whole.
//!
//! The hostile session rotates through five attacks, each for a few seconds (6 s in a run of
//! 30 s or more), then waits for every answer it is due (at most 75 s) before the next:
//! - (a) starts an upload, then floods batches of 64 chunks of 1 MiB far ahead of its offset;
//! - (b) starts uploads until `max_uploads` refuses (`QUOTA_EXCEEDED`), holds them while it
//!   keeps trying more, then finishes them;
//! - (c) keeps 64 expensive requests in flight: recursive `files/list`s of a tree of 5,000
//!   entries it made through the broker at start-up, and 8 MiB base64 reads;
//! - (d) opens 100 more connections (those past `max_sessions` are refused with an error
//!   line) and sends each a partial line, slowly (1 MiB/s each); when the attack ends, each
//!   line gets its newline, so the broker answers it (a parse error, or `QUOTA_EXCEEDED` for
//!   a line it refused for `max_pending_input`), and the connections are closed;
//! - (e) stops reading its answers while it sends requests (8 big reads, then small ones).
//!
//! Every answer the hostile session gets is counted by attack, request kind and outcome
//! (`ok`, or the error's `data.code`). It must get answers (errors are fine), never a hang.
//!
//! ```text
//! cargo build --release
//! cargo bench --bench abuse                          # 180 s
//! cargo bench --bench abuse -- --quick               # 15 s
//! cargo bench --bench abuse -- --no-hostile          # the same honest load alone
//! cargo bench --bench abuse -- --seconds 600 --json > abuse.json
//! ```
//!
//! Other flags: `--phase-seconds N` (length of each attack), `--attacks LETTERS` (only these,
//! e.g. `--attacks d`). Run without `--bench` (as
//! `cargo test --benches` does) and without `--seconds`/`--quick`, it runs for 3 s only, with
//! a smaller tree (500 entries), 1 MiB big reads and 64 KiB flood chunks, so test runs over
//! all targets stay short (the broker is then the debug build).
//!
//! With `--json` the tables go to stderr and the data to stdout. The exit status is non-zero
//! when an honest answer was wrong or missing, an honest request was answered with an error,
//! a hostile request was never answered (a hang), or the broker died or did not exit cleanly
//! on SIGTERM at the end.
//!
//! One file though long: a bench is one program with its own `main`; the hostile session and
//! the honest ones share the one broker, the sampler and the report.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

mod kit;
use kit::{Rng, broker_binary, is_listening, mib, nearest_rank, open_fds, status_field};

/// `VmRSS`, `VmHWM` (KiB) and `Threads` of `pid`.
fn proc_status(pid: u32) -> Option<(u64, u64, u64)> {
    Some((
        status_field(pid, "VmRSS")?,
        status_field(pid, "VmHWM")?,
        status_field(pid, "Threads")?,
    ))
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The file honest session 1 reads 1 KiB at a time.
const FIXED_PATH: &str = "files/fixed.bin";
const FIXED_SIZE: usize = 64 << 10;
const READ_LEN: usize = 1024;
/// The file the hostile session reads in big chunks.
const BIG_PATH: &str = "files/big.bin";
/// Files honest session 2 rewrites in turn.
const WRITE_FILES: usize = 8;
const WRITE_MAX: usize = 4096;
/// Honest uploads: 16 chunks of 64 KiB.
const UPLOAD_CHUNK: usize = 64 << 10;
const UPLOAD_CHUNKS: usize = 16;
const UPLOAD_FILES: usize = 4;
/// How long an honest request may wait for its answer before it counts as missing (the
/// broker's `timeout_ms` is 60 s; anything close to this is a stall).
const ANSWER_LIMIT: Duration = Duration::from_secs(70);
/// How long the hostile session waits for the answers it is due after each attack.
const HOSTILE_DRAIN: Duration = Duration::from_secs(75);
/// Hostile requests in flight (the broker reads 64 at once per session).
const HOSTILE_WINDOW: usize = 64;
/// Connections attack (d) opens.
const EXTRA_CONNS: usize = 100;
/// How fast attack (d) dribbles each partial line.
const SLOW_BYTES_PER_SEC: usize = 1 << 20;
const SLOW_TICK: Duration = Duration::from_millis(20);
/// Width of the honest sessions' windows, in seconds.
const WINDOW_SECS: u64 = 10;
/// Stored descriptions of honest failures (all are counted).
const MAX_REPORTED: usize = 20;
/// How much of a hostile answer line is kept (the rest is skipped unread): enough for any
/// error, and for the id and whether it is a result.
const HEAD_MAX: usize = 8 << 10;

/// Attack 0 is "none" (set-up, or no hostile session).
const ATTACK_LETTERS: [&str; 6] = ["-", "a", "b", "c", "d", "e"];
const ATTACK_NAMES: [&str; 6] = [
    "no attack under way",
    "upload chunks far ahead, 64 per batch",
    "uploads up to max_uploads, held",
    "64 expensive in flight (list 5000, read 8 MiB)",
    "slow partial lines on 100 connections",
    "not reading its answers",
];

const ROLES: [&str; 3] = ["read 1 KiB", "write + read back", "upload 1 MiB"];

struct Opts {
    seconds: u64,
    phase: Duration,
    json: bool,
    hostile: bool,
    /// The attacks to rotate through (1 = a … 5 = e).
    attacks: Vec<u8>,
    scale: Scale,
}

/// Sizes of the hostile session's work.
#[derive(Clone, Copy)]
struct Scale {
    big_read: usize,
    tree_dirs: usize,
    tree_files: usize,
    flood_chunk: usize,
}

const FULL: Scale = Scale {
    big_read: 8 << 20,
    tree_dirs: 50,
    tree_files: 99,
    flood_chunk: 1 << 20,
};

const SHORT: Scale = Scale {
    big_read: 1 << 20,
    tree_dirs: 10,
    tree_files: 49,
    flood_chunk: 64 << 10,
};

impl Scale {
    fn tree_entries(&self) -> usize {
        self.tree_dirs * (self.tree_files + 1)
    }
}

fn parse_args() -> Opts {
    let mut seconds = 180;
    let mut phase_secs: Option<f64> = None;
    let mut json = false;
    let mut hostile = true;
    let mut attacks: Vec<u8> = (1..=5).collect();
    let letters = |v: &str| -> Vec<u8> {
        v.bytes()
            .filter(|b| (b'a'..=b'e').contains(b))
            .map(|b| b - b'a' + 1)
            .collect()
    };
    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and then this only
    // checks that it works: a short run.
    let mut chosen = false;
    let mut bench = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => bench = true,
            "--quick" => {
                seconds = 15;
                chosen = true;
            }
            "--json" => json = true,
            "--no-hostile" => hostile = false,
            "--seconds" => {
                if let Some(n) = args.next().and_then(|v| v.parse().ok()) {
                    seconds = n;
                    chosen = true;
                }
            }
            "--phase-seconds" => phase_secs = args.next().and_then(|v| v.parse().ok()),
            "--attacks" => attacks = letters(&args.next().unwrap_or_default()),
            other => {
                if let Some(n) = other
                    .strip_prefix("--seconds=")
                    .and_then(|v| v.parse().ok())
                {
                    seconds = n;
                    chosen = true;
                } else if let Some(n) = other
                    .strip_prefix("--phase-seconds=")
                    .and_then(|v| v.parse().ok())
                {
                    phase_secs = Some(n);
                } else if let Some(v) = other.strip_prefix("--attacks=") {
                    attacks = letters(v);
                }
                // Anything else (filters, other harness flags) is ignored.
            }
        }
    }
    let short = !bench && !chosen;
    if short {
        seconds = 3;
    }
    let seconds = seconds.max(1);
    // Each attack gets a fifth of the run, between 0.5 s and 6 s (0.4 s in the short run, so
    // that all five are tried).
    let phase = match phase_secs {
        Some(s) if s > 0.0 => Duration::from_secs_f64(s),
        _ if short => Duration::from_millis(400),
        _ => Duration::from_millis((seconds * 1000 / 5).clamp(500, 6000)),
    };
    Opts {
        seconds,
        phase,
        json,
        hostile: hostile && !attacks.is_empty(),
        attacks,
        scale: if short { SHORT } else { FULL },
    }
}

// ---------------------------------------------------------------------------------------------
// What every thread shares
// ---------------------------------------------------------------------------------------------

struct Run {
    start: Instant,
    /// When the load stops.
    end: Instant,
    stop: AtomicBool,
    /// The attack under way (index into `ATTACK_LETTERS`).
    attack: AtomicU8,
    /// Honest requests answered, per session.
    ops: [AtomicU64; 3],
    /// The slowest honest answer since the sampler last looked, per session, in µs.
    sec_max_us: [AtomicU64; 3],
    problems: Mutex<Vec<String>>,
    problem_count: AtomicU64,
}

impl Run {
    /// A run that starts now and lasts `len`.
    fn new(len: Duration) -> Run {
        let start = Instant::now();
        Run {
            start,
            end: start + len,
            stop: AtomicBool::new(false),
            attack: AtomicU8::new(0),
            ops: Default::default(),
            sec_max_us: Default::default(),
            problems: Mutex::new(Vec::new()),
            problem_count: AtomicU64::new(0),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || Instant::now() >= self.end
    }

    fn since_start_us(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    fn problem(&self, what: String) {
        self.problem_count.fetch_add(1, Ordering::Relaxed);
        let mut p = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if p.len() < MAX_REPORTED {
            let t = self.start.elapsed().as_secs_f64();
            p.push(format!("at {t:.1} s: {what}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Honest sessions
// ---------------------------------------------------------------------------------------------

/// One connection, read a line at a time with a time limit.
struct Conn {
    w: UnixStream,
    r: BufReader<UnixStream>,
    partial: Vec<u8>,
}

impl Conn {
    fn connect(sock: &Path) -> io::Result<Conn> {
        let w = UnixStream::connect(sock)?;
        // A broker that stops reading an honest session for this long has stalled it.
        w.set_write_timeout(Some(ANSWER_LIMIT))?;
        let r = BufReader::with_capacity(1 << 20, w.try_clone()?);
        Ok(Conn {
            w,
            r,
            partial: Vec::new(),
        })
    }

    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)
    }

    /// The next line, parsed, within `limit`.
    fn recv(&mut self, limit: Duration) -> io::Result<Value> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {limit:?}"),
                ));
            }
            self.r
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
            match self.r.read_until(b'\n', &mut self.partial) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the broker closed the connection",
                    ));
                }
                Ok(_) if self.partial.ends_with(b"\n") => {
                    let line = std::mem::take(&mut self.partial);
                    return serde_json::from_slice(&line).map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "not JSON ({e}): {}",
                                String::from_utf8_lossy(&line[..line.len().min(200)])
                            ),
                        )
                    });
                }
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the broker closed the connection mid-line",
                    ));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a ping and waits for its answer.
    fn ping(&mut self) -> io::Result<()> {
        self.send(b"{\"jsonrpc\":\"2.0\",\"id\":\"hello\",\"method\":\"ping\"}\n")?;
        let v = self.recv(Duration::from_secs(10))?;
        if v["id"] == "hello" && v["result"].is_object() {
            Ok(())
        } else {
            Err(io::Error::other(format!("ping answered {}", brief(&v))))
        }
    }
}

/// One honest answer: when it came back, how long it took, which attack was under way when
/// its request left.
struct Sample {
    end_us: u64,
    lat_us: u32,
    attack: u8,
}

#[derive(Default)]
struct HonestOut {
    samples: Vec<Sample>,
    wrong: u64,
    errors: u64,
    missing: u64,
    uploads_ok: u64,
    uploads_failed: u64,
    /// Completed uploads: when, and how long the whole upload (16 chunks + read back) took.
    uploads: Vec<(u64, f64)>,
}

enum Fail {
    Wrong,
    Error,
    Missing,
}

struct Honest<'a> {
    run: &'a Run,
    role: usize,
    conn: Conn,
    next_id: u64,
    rng: Rng,
    out: HonestOut,
}

/// A request was answered with an error (counted), or its answer never came (counted; the
/// session ends).
enum Outcome {
    Result(Value),
    Error,
}

impl<'a> Honest<'a> {
    fn new(run: &'a Run, role: usize, conn: Conn) -> Honest<'a> {
        Honest {
            run,
            role,
            conn,
            next_id: 0,
            rng: Rng(1000 + role as u64),
            out: HonestOut::default(),
        }
    }

    fn fail(&mut self, kind: Fail, what: String) {
        match kind {
            Fail::Wrong => self.out.wrong += 1,
            Fail::Error => self.out.errors += 1,
            Fail::Missing => self.out.missing += 1,
        }
        self.run
            .problem(format!("honest {}: {what}", ROLES[self.role]));
    }

    fn line(&mut self, method: &str, params: &Value) -> (u64, Vec<u8>) {
        self.next_id += 1;
        let id = self.next_id;
        let mut line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":"#).into_bytes();
        serde_json::to_writer(&mut line, params).expect("params serialize");
        line.extend_from_slice(b"}\n");
        (id, line)
    }

    fn record(&mut self, sent: Instant, attack: u8) {
        let now = Instant::now();
        let lat_us = now.duration_since(sent).as_micros().min(u32::MAX as u128) as u32;
        self.out.samples.push(Sample {
            end_us: self.run.since_start_us(now),
            lat_us,
            attack,
        });
        self.run.ops[self.role].fetch_add(1, Ordering::Relaxed);
        self.run.sec_max_us[self.role].fetch_max(u64::from(lat_us), Ordering::Relaxed);
    }

    /// Whether the answer is to `id` and a result.
    fn judge(&mut self, what: &str, id: u64, mut answer: Value) -> Result<Outcome, ()> {
        if answer["id"] != json!(id) {
            self.fail(
                Fail::Wrong,
                format!("{what}: answer to another id: {}", brief(&answer)),
            );
            return Err(());
        }
        if let Some(result) = answer.as_object_mut().and_then(|o| o.remove("result")) {
            return Ok(Outcome::Result(result));
        }
        self.fail(
            Fail::Error,
            format!("{what}: answered with an error: {}", brief(&answer)),
        );
        Ok(Outcome::Error)
    }

    /// One request, answered before the next.
    fn call(&mut self, what: &str, method: &str, params: Value) -> Result<Outcome, ()> {
        let (id, line) = self.line(method, &params);
        let attack = self.run.attack.load(Ordering::Relaxed);
        let sent = Instant::now();
        if let Err(e) = self.conn.send(&line) {
            self.fail(Fail::Missing, format!("{what}: sending failed: {e}"));
            return Err(());
        }
        match self.conn.recv(ANSWER_LIMIT) {
            Ok(answer) => {
                self.record(sent, attack);
                self.judge(what, id, answer)
            }
            Err(e) => {
                self.fail(Fail::Missing, format!("{what}: {e}"));
                Err(())
            }
        }
    }

    /// Reads `path` whole (base64) and compares it with `want`.
    fn read_back(&mut self, path: &str, want: &[u8]) -> Result<bool, ()> {
        let params = json!({"path": path, "encoding": "base64", "length": want.len().max(1)});
        match self.call("read back", "files/read", params)? {
            Outcome::Error => Ok(false),
            Outcome::Result(r) => {
                let got = content_of(&r);
                if got.as_deref() != Some(want) {
                    let len = got.map(|g| g.len());
                    self.fail(
                        Fail::Wrong,
                        format!(
                            "{path} reads back as {len:?} bytes that differ from the {} written",
                            want.len()
                        ),
                    );
                    return Ok(false);
                }
                if r["size"].as_u64() != Some(want.len() as u64) {
                    self.fail(Fail::Wrong, format!("{path}: size {}", r["size"]));
                    return Ok(false);
                }
                Ok(true)
            }
        }
    }
}

fn honest_reads(run: &Run, conn: Conn, fixed: &[u8]) -> HonestOut {
    let mut h = Honest::new(run, 0, conn);
    let mut n = 0usize;
    while !run.stopping() {
        let offset = (n * READ_LEN) % fixed.len();
        n += 1;
        let params =
            json!({"path": FIXED_PATH, "offset": offset, "length": READ_LEN, "encoding": "base64"});
        match h.call("read", "files/read", params) {
            Err(()) => break,
            Ok(Outcome::Error) => {}
            Ok(Outcome::Result(r)) => {
                let want = &fixed[offset..offset + READ_LEN];
                if content_of(&r).as_deref() != Some(want) {
                    h.fail(
                        Fail::Wrong,
                        format!("read @{offset}: wrong content: {}", brief(&r)),
                    );
                } else if r["size"].as_u64() != Some(fixed.len() as u64) {
                    h.fail(Fail::Wrong, format!("read @{offset}: size {}", r["size"]));
                }
            }
        }
    }
    h.out
}

fn honest_writes(run: &Run, conn: Conn) -> HonestOut {
    let mut h = Honest::new(run, 1, conn);
    let mut n = 0usize;
    while !run.stopping() {
        let path = format!("honest/w{}.bin", n % WRITE_FILES);
        n += 1;
        let size = 1 + h.rng.below(WRITE_MAX);
        let content = h.rng.bytes(size);
        let params = json!({"path": path, "content": B64.encode(&content), "encoding": "base64"});
        match h.call("write", "files/write", params) {
            Err(()) => break,
            Ok(Outcome::Error) => continue,
            Ok(Outcome::Result(r)) => {
                if r["bytesWritten"].as_u64() != Some(size as u64)
                    || r["size"].as_u64() != Some(size as u64)
                {
                    h.fail(
                        Fail::Wrong,
                        format!("write {path}: {size} bytes answered {}", brief(&r)),
                    );
                }
            }
        }
        if h.read_back(&path, &content).is_err() {
            break;
        }
    }
    h.out
}

fn honest_uploads(run: &Run, conn: Conn) -> HonestOut {
    let mut h = Honest::new(run, 2, conn);
    let mut n = 0usize;
    while !run.stopping() {
        let path = format!("honest/up{}.bin", n % UPLOAD_FILES);
        n += 1;
        let content = h.rng.bytes(UPLOAD_CHUNK * UPLOAD_CHUNKS);
        let started = Instant::now();
        match upload_once(&mut h, &path, &content) {
            Err(()) => {
                h.out.uploads_failed += 1;
                break;
            }
            Ok(false) => h.out.uploads_failed += 1,
            Ok(true) => {
                h.out.uploads_ok += 1;
                let now = Instant::now();
                h.out.uploads.push((
                    run.since_start_us(now),
                    now.duration_since(started).as_secs_f64() * 1000.0,
                ));
            }
        }
    }
    h.out
}

/// One upload: chunk 0 alone, chunks 1.. pipelined, then the file read back.
fn upload_once(h: &mut Honest<'_>, path: &str, content: &[u8]) -> Result<bool, ()> {
    let chunk_params = |i: usize| {
        let start = i * UPLOAD_CHUNK;
        json!({
            "path": path,
            "content": B64.encode(&content[start..start + UPLOAD_CHUNK]),
            "encoding": "base64",
            "offset": start,
            "final": i + 1 == UPLOAD_CHUNKS,
        })
    };
    match h.call("upload chunk 0", "files/write", chunk_params(0))? {
        Outcome::Error => return Ok(false),
        Outcome::Result(r) => {
            if r["bytesWritten"].as_u64() != Some(UPLOAD_CHUNK as u64)
                || r["size"].as_u64() != Some(UPLOAD_CHUNK as u64)
            {
                h.fail(Fail::Wrong, format!("upload chunk 0: {}", brief(&r)));
                return Ok(false);
            }
        }
    }
    // The rest in one go, then their answers in any order.
    let mut due: HashMap<u64, usize> = HashMap::new();
    let mut batch = Vec::new();
    for i in 1..UPLOAD_CHUNKS {
        let (id, line) = h.line("files/write", &chunk_params(i));
        due.insert(id, i);
        batch.extend_from_slice(&line);
    }
    let attack = h.run.attack.load(Ordering::Relaxed);
    let sent = Instant::now();
    if let Err(e) = h.conn.send(&batch) {
        h.fail(
            Fail::Missing,
            format!("upload: sending pipelined chunks failed: {e}"),
        );
        return Err(());
    }
    let mut good = true;
    while !due.is_empty() {
        let mut answer = match h.conn.recv(ANSWER_LIMIT) {
            Ok(a) => a,
            Err(e) => {
                let left = due.len();
                h.fail(
                    Fail::Missing,
                    format!("upload: {left} pipelined chunk(s) unanswered: {e}"),
                );
                return Err(());
            }
        };
        h.record(sent, attack);
        let Some(i) = answer["id"].as_u64().and_then(|id| due.remove(&id)) else {
            h.fail(
                Fail::Wrong,
                format!("upload: answer to an id not due: {}", brief(&answer)),
            );
            return Err(());
        };
        let Some(r) = answer.as_object_mut().and_then(|o| o.remove("result")) else {
            h.fail(
                Fail::Error,
                format!(
                    "upload chunk {i}: answered with an error: {}",
                    brief(&answer)
                ),
            );
            good = false;
            continue;
        };
        let size_ok = r["size"].as_u64() == Some(((i + 1) * UPLOAD_CHUNK) as u64);
        let etag_ok = (i + 1 < UPLOAD_CHUNKS) || r["etag"].is_string();
        if r["bytesWritten"].as_u64() != Some(UPLOAD_CHUNK as u64) || !size_ok || !etag_ok {
            h.fail(Fail::Wrong, format!("upload chunk {i}: {}", brief(&r)));
            good = false;
        }
    }
    if !good {
        return Ok(false);
    }
    h.read_back(path, content)
}

/// The decoded `content` of a read result.
fn content_of(result: &Value) -> Option<Vec<u8>> {
    let content = result["content"].as_str()?;
    match result["encoding"].as_str()? {
        "base64" => B64.decode(content).ok(),
        "utf-8" => Some(content.as_bytes().to_vec()),
        _ => None,
    }
}

fn brief(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 300 {
        let mut cut = 300;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The hostile session
// ---------------------------------------------------------------------------------------------

/// What one hostile request was, so its answer is counted under it.
#[derive(Clone, Copy)]
struct Tag {
    attack: u8,
    kind: &'static str,
    /// Keep the outcome for the driver (`HShared::outcome`).
    want: bool,
}

#[derive(Default)]
struct HState {
    pending: HashMap<u64, Tag>,
    outcomes: HashMap<u64, String>,
    /// Answers with id `null` not yet matched against a request that will never be answered.
    nulls: usize,
}

type CountKey = (u8, &'static str, String);

#[derive(Default)]
struct HShared {
    state: Mutex<HState>,
    progress: Condvar,
    counts: Mutex<BTreeMap<CountKey, u64>>,
    paused: AtomicBool,
    quit: AtomicBool,
    eof: AtomicBool,
    answered: AtomicU64,
}

impl HShared {
    fn count(&self, attack: u8, kind: &'static str, outcome: String, n: u64) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((attack, kind, outcome))
            .or_default() += n;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One answer line (`head`: its first bytes; `whole`: whether that is all of it).
    fn answer(&self, head: &[u8], whole: bool, current: u8) {
        let (id, outcome) = classify(head, whole);
        match (id, outcome) {
            (Answer::Notification, _) => {}
            (Answer::Id(id), outcome) => {
                let tag = {
                    let mut st = self.lock();
                    let tag = st.pending.remove(&id);
                    if let Some(t) = tag {
                        if t.want {
                            st.outcomes.insert(id, outcome.clone());
                        }
                    }
                    tag
                };
                self.answered.fetch_add(1, Ordering::Relaxed);
                self.progress.notify_all();
                match tag {
                    Some(t) => self.count(t.attack, t.kind, outcome, 1),
                    None => self.count(current, "answer to an id not due", outcome, 1),
                }
            }
            (Answer::Null, outcome) => {
                self.lock().nulls += 1;
                self.answered.fetch_add(1, Ordering::Relaxed);
                self.progress.notify_all();
                self.count(current, "answer with id null", outcome, 1);
            }
            (Answer::Unreadable, outcome) => {
                self.count(current, "unreadable line", outcome, 1);
            }
        }
    }
}

enum Answer {
    Id(u64),
    Null,
    Notification,
    Unreadable,
}

/// What an answer line is: its id and outcome (`ok`, or the error's `data.code`, else its
/// `code`). Results are recognised from the frame's head (the broker writes
/// `{"jsonrpc":"2.0","id":ID,"result":`), so an 11 MB read answer is never parsed.
fn classify(head: &[u8], whole: bool) -> (Answer, String) {
    const PREFIX: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";
    if let Some(rest) = head.strip_prefix(PREFIX) {
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits > 0 && rest[digits..].starts_with(b",\"result\":") {
            let id = std::str::from_utf8(&rest[..digits])
                .ok()
                .and_then(|s| s.parse().ok());
            if let Some(id) = id {
                return (Answer::Id(id), "ok".into());
            }
        }
    }
    if !whole {
        return (Answer::Unreadable, "long line of unknown shape".into());
    }
    let v: Value = match serde_json::from_slice(head) {
        Ok(v) => v,
        Err(_) => return (Answer::Unreadable, "not JSON".into()),
    };
    if v.get("method").is_some() && v.get("id").is_none() {
        return (Answer::Notification, String::new());
    }
    let outcome = if v.get("result").is_some() {
        "ok".to_owned()
    } else if let Some(code) = v["error"]["data"]["code"].as_str() {
        code.to_owned()
    } else {
        format!("error {}", v["error"]["code"])
    };
    match &v["id"] {
        Value::Null => (Answer::Null, outcome),
        id => match id.as_u64() {
            Some(id) => (Answer::Id(id), outcome),
            None => (Answer::Unreadable, outcome),
        },
    }
}

/// Reads the hostile session's answers (unless paused) until the connection ends.
fn hostile_reader(stream: UnixStream, sh: &HShared, run: &Run) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut r = BufReader::with_capacity(1 << 20, stream);
    let mut head: Vec<u8> = Vec::with_capacity(HEAD_MAX);
    let mut len = 0usize;
    loop {
        if sh.quit.load(Ordering::Relaxed) {
            return;
        }
        // Paused between lines only (a line half read stays half read).
        if len == 0 && sh.paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let (used, end) = match r.fill_buf() {
            Ok([]) => {
                sh.eof.store(true, Ordering::Relaxed);
                sh.progress.notify_all();
                return;
            }
            Ok(buf) => {
                let (used, end) = match memchr::memchr(b'\n', buf) {
                    Some(i) => (i, true),
                    None => (buf.len(), false),
                };
                let keep = used.min(HEAD_MAX.saturating_sub(head.len()));
                head.extend_from_slice(&buf[..keep]);
                (used, end)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) => {
                sh.eof.store(true, Ordering::Relaxed);
                sh.progress.notify_all();
                return;
            }
        };
        len += used;
        if end {
            r.consume(used + 1);
            let current = run.attack.load(Ordering::Relaxed);
            sh.answer(&head, len <= HEAD_MAX, current);
            head.clear();
            len = 0;
        } else {
            r.consume(used);
        }
    }
}

struct Hostile<'a> {
    run: &'a Run,
    sh: &'a HShared,
    w: UnixStream,
    sock: PathBuf,
    scale: Scale,
    next_id: u64,
    rng: Rng,
    /// The flood chunk's content, base64.
    flood_b64: String,
    /// A 1 KiB chunk, base64.
    small_b64: String,
    sent: u64,
    /// Per attack: the longest wait for the answers due after it, in seconds.
    drains: [f64; 6],
    /// Requests never answered (hang).
    unanswered: u64,
    /// Bytes of partial lines sent by attack (d).
    slow_bytes: u64,
    /// Uploads attack (b) held at most.
    held_max: usize,
    dead: Option<String>,
}

/// How a hostile write ended.
enum Sent {
    Done,
    /// The broker did not take the line before `give_up`.
    Stuck,
}

impl<'a> Hostile<'a> {
    fn new(
        run: &'a Run,
        sh: &'a HShared,
        w: UnixStream,
        sock: &Path,
        scale: Scale,
        flood_b64: String,
        small_b64: String,
    ) -> Hostile<'a> {
        Hostile {
            run,
            sh,
            w,
            sock: sock.to_owned(),
            scale,
            next_id: 0,
            rng: Rng(99),
            flood_b64,
            small_b64,
            sent: 0,
            drains: [0.0; 6],
            unanswered: 0,
            slow_bytes: 0,
            held_max: 0,
            dead: None,
        }
    }

    /// Sends one request; its answer will be counted under `attack` and `kind`.
    fn send(
        &mut self,
        attack: u8,
        kind: &'static str,
        method: &str,
        params: &str,
        want: bool,
        phase_end: Instant,
    ) -> io::Result<u64> {
        self.next_id += 1;
        let id = self.next_id;
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}\n"
        );
        self.lock_pending(id, attack, kind, want);
        self.sent += 1;
        match self.write_all(line.as_bytes(), phase_end)? {
            Sent::Done => Ok(id),
            Sent::Stuck => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the broker took no input from the hostile session for {HOSTILE_DRAIN:?} after an attack ended"
                ),
            )),
        }
    }

    fn lock_pending(&self, id: u64, attack: u8, kind: &'static str, want: bool) {
        self.sh
            .lock()
            .pending
            .insert(id, Tag { attack, kind, want });
    }

    /// Writes all of `line`; the socket has a short send timeout, so a broker that stops
    /// reading is noticed. After `phase_end` the reader is resumed (attack (e) is over) and
    /// the line finished, for at most `HOSTILE_DRAIN` more.
    fn write_all(&mut self, line: &[u8], phase_end: Instant) -> io::Result<Sent> {
        let mut off = 0;
        while off < line.len() {
            match self.w.write(&line[off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => off += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.sh.eof.load(Ordering::Relaxed) {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the broker closed the hostile connection",
                        ));
                    }
                    let now = Instant::now();
                    if now >= phase_end {
                        self.sh.paused.store(false, Ordering::Relaxed);
                    }
                    if now >= phase_end + HOSTILE_DRAIN {
                        return Ok(Sent::Stuck);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Sent::Done)
    }

    /// Waits until fewer than `window` answers are due (or `until`).
    fn wait_window(&self, window: usize, until: Instant) {
        let mut st = self.sh.lock();
        while st.pending.len().saturating_sub(st.nulls) >= window
            && Instant::now() < until
            && !self.sh.eof.load(Ordering::Relaxed)
        {
            st = self
                .sh
                .progress
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The outcome of request `id` (sent with `want`), within `limit`.
    fn outcome(&self, id: u64, limit: Duration) -> Option<String> {
        let end = Instant::now() + limit;
        let mut st = self.sh.lock();
        loop {
            if let Some(o) = st.outcomes.remove(&id) {
                return Some(o);
            }
            if Instant::now() >= end || self.sh.eof.load(Ordering::Relaxed) {
                return None;
            }
            st = self
                .sh
                .progress
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits for every answer due; what is still due after `HOSTILE_DRAIN` is a hang.
    fn drain(&mut self, attack: u8) {
        self.sh.paused.store(false, Ordering::Relaxed);
        let started = Instant::now();
        self.wait_window(1, started + HOSTILE_DRAIN);
        let waited = started.elapsed().as_secs_f64();
        let slot = &mut self.drains[attack as usize];
        *slot = slot.max(waited);
        let mut st = self.sh.lock();
        let left = st.pending.len().saturating_sub(st.nulls);
        if left > 0 {
            let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
            for t in st.pending.values() {
                *kinds.entry(t.kind).or_default() += 1;
            }
            self.unanswered += left as u64;
            self.run.problem(format!(
                "hostile ({}): {left} request(s) unanswered {waited:.1} s after the attack ended: {kinds:?}",
                ATTACK_LETTERS[attack as usize]
            ));
        }
        // Lines answered with id null were requests never to be answered by id: forget them
        // with the rest, so the next attack starts from nothing due.
        st.pending.clear();
        st.outcomes.clear();
        st.nulls = 0;
    }

    /// (set-up) The tree attack (c) lists: `tree_dirs` folders of `tree_files` files.
    fn make_tree(&mut self) -> io::Result<usize> {
        let far = Instant::now() + Duration::from_secs(600);
        let dirs = self.scale.tree_dirs;
        let files = self.scale.tree_files;
        for d in 0..dirs {
            self.wait_window(HOSTILE_WINDOW, far);
            let params = format!(r#"{{"path":"hostile/tree/d{d:03}","type":"directory"}}"#);
            self.send(0, "create tree folder", "files/create", &params, false, far)?;
        }
        self.drain(0);
        for d in 0..dirs {
            for f in 0..files {
                self.wait_window(HOSTILE_WINDOW, far);
                let params =
                    format!(r#"{{"path":"hostile/tree/d{d:03}/f{f:03}.txt","type":"file"}}"#);
                self.send(0, "create tree file", "files/create", &params, false, far)?;
            }
        }
        self.drain(0);
        // A listing that says how many there are.
        let params = r#"{"path":"hostile/tree","recursive":true}"#;
        let id = self.send(0, "list tree", "files/list", params, true, far)?;
        let _ = self.outcome(id, Duration::from_secs(60));
        self.drain(0);
        Ok(self.scale.tree_entries())
    }

    /// (a) An upload started, then chunks far ahead of its offset, 64 at a time.
    fn flood_ahead(&mut self, end: Instant) -> io::Result<()> {
        let path = "hostile/flood.bin";
        let params = format!(
            r#"{{"path":"{path}","content":"{}","encoding":"base64","offset":0,"final":false}}"#,
            self.small_b64
        );
        let id = self.send(1, "start upload", "files/write", &params, true, end)?;
        let _ = self.outcome(id, Duration::from_secs(60));
        let chunk = self.scale.flood_chunk;
        let mut k: u64 = 0;
        while Instant::now() < end && !self.run.stop.load(Ordering::Relaxed) {
            self.wait_window(HOSTILE_WINDOW, end);
            for _ in 0..64 {
                let offset = (1u64 << 30) + k * chunk as u64;
                k += 1;
                let params = format!(
                    r#"{{"path":"{path}","content":"{}","encoding":"base64","offset":{offset},"final":false}}"#,
                    self.flood_b64
                );
                self.send(1, "chunk far ahead", "files/write", &params, false, end)?;
                if Instant::now() >= end {
                    break;
                }
            }
        }
        Ok(())
    }

    /// (b) Uploads started until `max_uploads` refuses, held while more are tried, then
    /// finished.
    fn hold_uploads(&mut self, end: Instant) -> io::Result<()> {
        let mut held: Vec<String> = Vec::new();
        for j in 0..64 {
            if Instant::now() >= end {
                break;
            }
            let path = format!("hostile/q{j:02}.bin");
            let params = format!(
                r#"{{"path":"{path}","content":"{}","encoding":"base64","offset":0,"final":false}}"#,
                self.small_b64
            );
            let id = self.send(2, "start upload", "files/write", &params, true, end)?;
            match self.outcome(id, Duration::from_secs(60)).as_deref() {
                Some("ok") => held.push(path),
                _ => break,
            }
        }
        self.held_max = self.held_max.max(held.len());
        let mut n = 0u64;
        while Instant::now() < end && !self.run.stop.load(Ordering::Relaxed) {
            self.wait_window(HOSTILE_WINDOW, end);
            for _ in 0..16 {
                let params = format!(
                    r#"{{"path":"hostile/r{n}.bin","content":"{}","encoding":"base64","offset":0,"final":false}}"#,
                    self.small_b64
                );
                n += 1;
                self.send(
                    2,
                    "start upload past max_uploads",
                    "files/write",
                    &params,
                    false,
                    end,
                )?;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let go: each held upload finished with an empty final chunk, once every start
        // tried is answered (requests run concurrently: a start still in flight would take
        // the room a finished upload leaves, and hold it).
        let far = Instant::now() + HOSTILE_DRAIN;
        self.wait_window(1, far);
        for path in held {
            let params = format!(
                r#"{{"path":"{path}","content":"","encoding":"base64","offset":1024,"final":true}}"#
            );
            self.send(2, "finish held upload", "files/write", &params, false, far)?;
        }
        Ok(())
    }

    /// (c) 64 expensive requests in flight: recursive listings and big reads.
    fn expensive(&mut self, end: Instant) -> io::Result<()> {
        let list = r#"{"path":"hostile/tree","recursive":true}"#.to_owned();
        let read = format!(
            r#"{{"path":"{BIG_PATH}","offset":0,"length":{},"encoding":"base64"}}"#,
            self.scale.big_read
        );
        let mut n = 0u64;
        while Instant::now() < end && !self.run.stop.load(Ordering::Relaxed) {
            self.wait_window(HOSTILE_WINDOW, end);
            if Instant::now() >= end {
                break;
            }
            n += 1;
            if n % 2 == 0 {
                self.send(3, "recursive list", "files/list", &list, false, end)?;
            } else {
                self.send(3, "big read", "files/read", &read, false, end)?;
            }
        }
        Ok(())
    }

    /// (d) Up to `EXTRA_CONNS` more connections, each sent a partial line, slowly.
    fn slow_lines(&mut self, end: Instant) {
        struct Extra {
            s: UnixStream,
            inbuf: Vec<u8>,
            sent: usize,
            open: bool,
            refused: bool,
            ended: bool,
            answered: bool,
            tail: Option<Vec<u8>>,
            /// A write failed (the broker closed its end): only reading goes on.
            broken: bool,
        }
        let prefix_of = |i: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":"slow{i}","method":"files/write","params":{{"path":"hostile/slow{i}.bin","encoding":"base64","content":""#
            )
        };
        let mut extras: Vec<Extra> = Vec::new();
        for _ in 0..EXTRA_CONNS {
            match UnixStream::connect(&self.sock) {
                Ok(s) => {
                    if s.set_nonblocking(true).is_ok() {
                        extras.push(Extra {
                            s,
                            inbuf: Vec::new(),
                            sent: 0,
                            open: true,
                            refused: false,
                            ended: false,
                            answered: false,
                            tail: None,
                            broken: false,
                        });
                    }
                }
                Err(e) => self.sh.count(4, "connection", format!("connect: {e}"), 1),
            }
        }
        let filler = vec![b'A'; SLOW_BYTES_PER_SEC];
        let per_tick = (SLOW_BYTES_PER_SEC as f64 * SLOW_TICK.as_secs_f64()).max(1.0) as usize;
        let mut next = Instant::now();
        let mut buf = vec![0u8; 16 << 10];
        // Until `end` the lines grow; then each is ended with a bare `\n` (the broker answers
        // a line it held with a parse error, one it refused for `max_pending_input` with
        // `QUOTA_EXCEEDED`), and the answers are awaited for a few seconds.
        let mut ended = false;
        let mut answers_by: Option<Instant> = None;
        loop {
            let now = Instant::now();
            if !ended && (now >= end || self.run.stop.load(Ordering::Relaxed)) {
                ended = true;
                answers_by = Some(now + Duration::from_secs(10));
            }
            if let Some(by) = answers_by {
                let waiting = extras
                    .iter()
                    .any(|x| x.open && !x.broken && !x.refused && !x.answered);
                if now >= by || !waiting {
                    break;
                }
            }
            for (i, x) in extras.iter_mut().enumerate() {
                if !x.open {
                    continue;
                }
                loop {
                    match x.s.read(&mut buf) {
                        Ok(0) => {
                            x.open = false;
                            break;
                        }
                        Ok(n) => x.inbuf.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            x.open = false;
                            break;
                        }
                    }
                }
                while let Some(nl) = memchr::memchr(b'\n', &x.inbuf) {
                    let line: Vec<u8> = x.inbuf.drain(..=nl).collect();
                    let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                    let code = v["error"]["data"]["code"]
                        .as_str()
                        .map_or_else(|| format!("error {}", v["error"]["code"]), str::to_owned);
                    let message = v["error"]["message"].as_str().unwrap_or_default();
                    if message.contains("max_sessions") {
                        x.refused = true;
                        self.sh
                            .count(4, "connection", format!("{code} (max_sessions)"), 1);
                    } else if message.contains("max_pending_input") {
                        x.answered = true;
                        self.sh.count(
                            4,
                            "partial line, ended",
                            format!("{code} (max_pending_input)"),
                            1,
                        );
                    } else {
                        x.answered = true;
                        self.sh.count(4, "partial line, ended", code, 1);
                    }
                }
                if !x.open || x.broken || x.refused || x.ended {
                    continue;
                }
                if ended {
                    // The rest of the prefix (if any) and the newline, as fast as the broker
                    // takes them (a connection may be waiting for room in the budget).
                    let tail = x.tail.get_or_insert_with(|| {
                        let prefix = prefix_of(i);
                        let mut t = prefix.as_bytes()[x.sent.min(prefix.len())..].to_vec();
                        t.push(b'\n');
                        t
                    });
                    loop {
                        match x.s.write(tail) {
                            Ok(n) => {
                                tail.drain(..n);
                                if tail.is_empty() {
                                    x.ended = true;
                                    break;
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(_) => {
                                x.broken = true;
                                break;
                            }
                        }
                    }
                    continue;
                }
                let prefix = prefix_of(i);
                let mut budget = per_tick;
                while budget > 0 {
                    let chunk: &[u8] = if x.sent < prefix.len() {
                        &prefix.as_bytes()[x.sent..]
                    } else {
                        &filler[..budget]
                    };
                    match x.s.write(&chunk[..chunk.len().min(budget)]) {
                        Ok(n) => {
                            x.sent += n;
                            self.slow_bytes += n as u64;
                            budget -= n;
                        }
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            x.broken = true;
                            break;
                        }
                    }
                }
            }
            next += SLOW_TICK;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        for x in &extras {
            if !x.refused {
                let what = if x.answered {
                    "served"
                } else if x.open && !x.broken {
                    "served, line never answered"
                } else {
                    "closed by the broker without a refusal"
                };
                self.sh.count(4, "connection", what.into(), 1);
            }
        }
        let unanswered = extras
            .iter()
            .filter(|x| x.open && !x.broken && !x.refused && !x.answered)
            .count();
        if unanswered > 0 {
            self.unanswered += unanswered as u64;
            self.run.problem(format!(
                "hostile (d): {unanswered} partial line(s) unanswered 10 s after the attack ended"
            ));
        }
    }

    /// (e) Requests sent while the answers are left unread: 8 big reads, then small ones,
    /// until the broker stops taking them.
    fn not_reading(&mut self, end: Instant) -> io::Result<()> {
        self.sh.paused.store(true, Ordering::Relaxed);
        let big = format!(
            r#"{{"path":"{BIG_PATH}","offset":0,"length":{},"encoding":"base64"}}"#,
            self.scale.big_read
        );
        let small =
            format!(r#"{{"path":"{FIXED_PATH}","offset":0,"length":1024,"encoding":"base64"}}"#);
        let list = r#"{"path":"hostile/tree/d000"}"#.to_owned();
        let mut n = 0u64;
        while Instant::now() < end && !self.run.stop.load(Ordering::Relaxed) {
            n += 1;
            if n <= 8 {
                self.send(5, "big read, unread", "files/read", &big, false, end)?;
            } else if n % 4 == 0 {
                self.send(5, "list, unread", "files/list", &list, false, end)?;
            } else {
                let kind = "1 KiB read, unread";
                let i = self.rng.below(FIXED_SIZE / READ_LEN);
                let params = if i == 0 {
                    small.clone()
                } else {
                    format!(
                        r#"{{"path":"{FIXED_PATH}","offset":{},"length":1024,"encoding":"base64"}}"#,
                        i * READ_LEN
                    )
                };
                self.send(5, kind, "files/read", &params, false, end)?;
            }
        }
        self.sh.paused.store(false, Ordering::Relaxed);
        Ok(())
    }

    /// The attacks in turn until the run ends.
    fn rotate(&mut self, phase: Duration, attacks: &[u8]) {
        let mut k = 0usize;
        while !self.run.stopping() {
            let attack = attacks[k % attacks.len()];
            k += 1;
            let end = (Instant::now() + phase).min(self.run.end);
            self.run.attack.store(attack, Ordering::Relaxed);
            let r = match attack {
                1 => self.flood_ahead(end),
                2 => self.hold_uploads(end),
                3 => self.expensive(end),
                4 => {
                    self.slow_lines(end);
                    Ok(())
                }
                _ => self.not_reading(end),
            };
            self.drain(attack);
            self.run.attack.store(0, Ordering::Relaxed);
            if let Err(e) = r {
                self.dead = Some(format!("attack ({}): {e}", ATTACK_LETTERS[attack as usize]));
                self.run.problem(format!(
                    "hostile session ended in attack ({}): {e}",
                    ATTACK_LETTERS[attack as usize]
                ));
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory, the broker, the report
// ---------------------------------------------------------------------------------------------

struct Second {
    t: u64,
    attack: u8,
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
    fds: u64,
    ops: [u64; 3],
    max_ms: [f64; 3],
    hostile: u64,
}

#[derive(Clone, Copy)]
struct Stats {
    n: usize,
    per_s: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

/// Latency figures (ms) of `lat_us` over `secs` seconds.
fn stats(lat_us: &mut [u32], secs: f64) -> Stats {
    lat_us.sort_unstable();
    let pick = |q: f64| -> f64 { nearest_rank(lat_us, q).map_or(0.0, |us| f64::from(us) / 1000.0) };
    Stats {
        n: lat_us.len(),
        per_s: if secs > 0.0 {
            lat_us.len() as f64 / secs
        } else {
            0.0
        },
        p50: pick(0.50),
        p99: pick(0.99),
        max: pick(1.0),
    }
}

fn stats_json(s: &Stats) -> Value {
    json!({"ops": s.n, "ops_per_s": round2(s.per_s), "p50_ms": round3(s.p50),
           "p99_ms": round3(s.p99), "max_ms": round3(s.max)})
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn main() -> ExitCode {
    let opts = parse_args();
    let binary = match broker_binary() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("abuse: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&opts, &binary) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("abuse: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The broker process, killed (by its id) if the bench ends without stopping it.
struct Broker(std::process::Child);

impl Drop for Broker {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn run(opts: &Opts, binary: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let tmp = tempfile::Builder::new()
        .prefix("fsbroker-abuse-")
        .tempdir()?;
    let root = tmp.path().join("root");
    let mut rng = Rng(7);
    let fixed = rng.bytes(FIXED_SIZE);
    std::fs::create_dir_all(root.join("files"))?;
    std::fs::create_dir_all(root.join("honest"))?;
    std::fs::create_dir_all(root.join("hostile"))?;
    std::fs::write(root.join(FIXED_PATH), &fixed)?;
    if opts.hostile {
        std::fs::write(root.join(BIG_PATH), rng.bytes(opts.scale.big_read))?;
    }
    let policy = tmp.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[root]]\npath = {}\nname = \"abuse\"\nmode = \"read-write\"\nconsent = \"auto\"\n\n[limits]\nrequests_per_second = 0\n",
            toml_string(&root)
        ),
    )?;
    let sock = tmp.path().join("broker.sock");
    let log_path = tmp.path().join("broker.log");
    let mut broker = Broker(
        Command::new(binary)
            .arg("serve")
            .arg("--listen")
            .arg(&sock)
            .arg("--policy")
            .arg(&policy)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path)?)
            .spawn()?,
    );
    let pid = broker.0.id();
    let up_by = Instant::now() + Duration::from_secs(30);
    while !is_listening(&sock, pid) {
        if let Some(status) = broker.0.try_wait()? {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("the broker exited before listening ({status}):\n{log}").into());
        }
        if Instant::now() > up_by {
            return Err("the broker did not listen within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Every session connects (and is answered) before any attack.
    let mut conns = Vec::new();
    for _ in 0..3 {
        let mut c = Conn::connect(&sock)?;
        c.ping()?;
        conns.push(c);
    }
    let mut hostile_conn = if opts.hostile {
        let mut c = Conn::connect(&sock)?;
        c.ping()?;
        Some(c)
    } else {
        None
    };

    let table_to_stderr = opts.json;
    let row = |s: &str| {
        if table_to_stderr {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    row(&format!(
        "abuse: {} serve --listen, pid {pid}, {} s, hostile session {}",
        binary.display(),
        opts.seconds,
        if opts.hostile {
            format!(
                "on: attacks {} in turn, {:.1} s each",
                opts.attacks
                    .iter()
                    .map(|&a| ATTACK_LETTERS[a as usize])
                    .collect::<String>(),
                opts.phase.as_secs_f64()
            )
        } else {
            "off".into()
        }
    ));
    if opts.hostile {
        for &a in &opts.attacks {
            let a = a as usize;
            row(&format!("  ({}) {}", ATTACK_LETTERS[a], ATTACK_NAMES[a]));
        }
    }

    let sh = HShared::default();
    let small_b64 = B64.encode(Rng(6).bytes(1024));
    let flood_b64 = if opts.hostile {
        B64.encode(Rng(5).bytes(opts.scale.flood_chunk))
    } else {
        String::new()
    };
    // Only the hostile session's writing half is kept; its reader is a thread of its own.
    let hostile_stream = match hostile_conn.take() {
        Some(c) => {
            c.w.set_write_timeout(Some(Duration::from_millis(100)))?;
            Some(c.w)
        }
        None => None,
    };

    // Set-up, before the clock starts: the hostile session makes its tree through the broker.
    let mut tree_entries = 0usize;
    let mut setup_secs = 0.0;
    if let Some(w) = &hostile_stream {
        let pre = Run::new(Duration::from_secs(3600));
        let t0 = Instant::now();
        let (made, unanswered) = std::thread::scope(|s| -> io::Result<_> {
            let rs = w.try_clone()?;
            let (sh, pre) = (&sh, &pre);
            let reader = s.spawn(move || hostile_reader(rs, sh, pre));
            let mut h = Hostile::new(
                pre,
                sh,
                w.try_clone()?,
                &sock,
                opts.scale,
                String::new(),
                small_b64.clone(),
            );
            let made = h.make_tree();
            sh.quit.store(true, Ordering::Relaxed);
            let _ = reader.join();
            sh.quit.store(false, Ordering::Relaxed);
            Ok((made, h.unanswered))
        })?;
        tree_entries = made?;
        setup_secs = t0.elapsed().as_secs_f64();
        let bad: Vec<String> = sh
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|((a, _, o), _)| *a == 0 && o != "ok")
            .map(|((_, k, o), n)| format!("{k}: {o} x{n}"))
            .collect();
        if unanswered > 0 || !bad.is_empty() {
            return Err(format!(
                "the hostile session's set-up failed: {unanswered} unanswered, {bad:?}"
            )
            .into());
        }
        row(&format!(
            "set-up: the hostile session made a tree of {tree_entries} entries through the broker in {setup_secs:.1} s"
        ));
    }

    let run_state = Run::new(Duration::from_secs(opts.seconds));
    let run = &run_state;
    let start = run.start;
    let mut seconds: Vec<Second> = Vec::new();
    let mut hostile_report: Option<HostileReport> = None;
    let outs: Vec<HonestOut> = std::thread::scope(|s| -> Result<_, Box<dyn std::error::Error>> {
        let mut it = conns.into_iter();
        let (c0, c1, c2) = (
            it.next().ok_or("no connection")?,
            it.next().ok_or("no connection")?,
            it.next().ok_or("no connection")?,
        );
        let fixed = &fixed;
        let honest = vec![
            s.spawn(move || honest_reads(run, c0, fixed)),
            s.spawn(move || honest_writes(run, c1)),
            s.spawn(move || honest_uploads(run, c2)),
        ];
        let hostile_thread = match hostile_stream {
            Some(w) => {
                let rs = w.try_clone()?;
                let sh = &sh;
                let sock = &sock;
                let (scale, phase) = (opts.scale, opts.phase);
                let attacks = &opts.attacks;
                let flood_b64 = flood_b64.clone();
                let small_b64 = small_b64.clone();
                Some(s.spawn(move || {
                    std::thread::scope(|s2| {
                        let reader = s2.spawn(move || hostile_reader(rs, sh, run));
                        let mut h = Hostile::new(run, sh, w, sock, scale, flood_b64, small_b64);
                        // Ids of the set-up are never reused.
                        h.next_id = 1 << 32;
                        h.rotate(phase, attacks);
                        sh.quit.store(true, Ordering::Relaxed);
                        let _ = reader.join();
                        HostileReport {
                            sent: h.sent,
                            drains: h.drains,
                            unanswered: h.unanswered,
                            slow_bytes: h.slow_bytes,
                            held_max: h.held_max,
                            dead: h.dead,
                        }
                    })
                }))
            }
            None => None,
        };

        row(&format!(
            "{:>5} {:>3} {:>8} {:>8} {:>4} {:>5} | {:>7} {:>8} | {:>7} {:>8} | {:>8} {:>8} | {:>9}",
            "t",
            "att",
            "RSS MiB",
            "HWM MiB",
            "thr",
            "fds",
            "reads/s",
            "max ms",
            "write/s",
            "max ms",
            "upload/s",
            "max ms",
            "hostile/s"
        ));
        let mut prev_ops = [0u64; 3];
        let mut prev_hostile = 0u64;
        let mut t = 0u64;
        loop {
            t += 1;
            let due = start + Duration::from_secs(t);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if let Ok(Some(status)) = broker.0.try_wait() {
                run.problem(format!("the broker exited during the run: {status}"));
                run.stop.store(true, Ordering::Relaxed);
                row(&format!("{t:>5} the broker has exited ({status})"));
                break;
            }
            if let Some((rss, hwm, threads)) = proc_status(pid) {
                let mut ops = [0u64; 3];
                let mut max_ms = [0f64; 3];
                for i in 0..3 {
                    let now = run.ops[i].load(Ordering::Relaxed);
                    ops[i] = now - prev_ops[i];
                    prev_ops[i] = now;
                    max_ms[i] = run.sec_max_us[i].swap(0, Ordering::Relaxed) as f64 / 1000.0;
                }
                let h_now = sh.answered.load(Ordering::Relaxed);
                let sec = Second {
                    t,
                    attack: run.attack.load(Ordering::Relaxed),
                    rss_kib: rss,
                    hwm_kib: hwm,
                    threads,
                    fds: open_fds(pid),
                    ops,
                    max_ms,
                    hostile: h_now - prev_hostile,
                };
                prev_hostile = h_now;
                row(&format!(
                    "{:>5} {:>3} {:>8.1} {:>8.1} {:>4} {:>5} | {:>7} {:>8.2} | {:>7} {:>8.2} | {:>8} {:>8.2} | {:>9}",
                    sec.t,
                    ATTACK_LETTERS[sec.attack as usize],
                    mib(sec.rss_kib),
                    mib(sec.hwm_kib),
                    sec.threads,
                    sec.fds,
                    sec.ops[0],
                    sec.max_ms[0],
                    sec.ops[1],
                    sec.max_ms[1],
                    sec.ops[2],
                    sec.max_ms[2],
                    sec.hostile
                ));
                seconds.push(sec);
            }
            if t >= opts.seconds {
                break;
            }
        }
        run.stop.store(true, Ordering::Relaxed);
        let mut outs = Vec::new();
        for (i, hnd) in honest.into_iter().enumerate() {
            match hnd.join() {
                Ok(o) => outs.push(o),
                Err(_) => {
                    run.problem(format!("the honest {} thread panicked", ROLES[i]));
                    outs.push(HonestOut::default());
                }
            }
        }
        if let Some(hnd) = hostile_thread {
            match hnd.join() {
                Ok(r) => hostile_report = Some(r),
                Err(_) => run.problem("the hostile thread panicked".into()),
            }
        }
        Ok(outs)
    })?;
    let elapsed = run.start.elapsed().as_secs_f64().min(opts.seconds as f64);
    let final_status = proc_status(pid);

    // The broker must still be there, and must end cleanly when asked.
    let exit = match broker.0.try_wait()? {
        Some(status) => {
            run.problem(format!("the broker exited during the run: {status}"));
            Some(status)
        }
        None => {
            if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
            }
            let by = Instant::now() + Duration::from_secs(30);
            let mut status = None;
            while Instant::now() < by {
                if let Some(s) = broker.0.try_wait()? {
                    status = Some(s);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            match status {
                Some(s) if s.success() => {}
                Some(s) => run.problem(format!("the broker exited with {s} on SIGTERM")),
                None => run.problem("the broker did not exit within 30 s of SIGTERM".into()),
            }
            status
        }
    };

    // ---- The report ----
    let secs_total = elapsed.max(1e-9);
    let windows = opts.seconds.div_ceil(WINDOW_SECS);
    row("");
    row(&format!(
        "honest sessions per {WINDOW_SECS} s window: ops/s and latency p50 / p99 / max in ms (attacks under way when the requests left)"
    ));
    row(&format!(
        "{:>9} {:>7} | {:>36} | {:>36} | {:>36} {:>4}",
        "window", "attacks", ROLES[0], ROLES[1], ROLES[2], "ups"
    ));
    let mut windows_json = Vec::new();
    for w in 0..windows {
        let lo = w * WINDOW_SECS * 1_000_000;
        let hi = ((w + 1) * WINDOW_SECS).min(opts.seconds) * 1_000_000;
        let span = (hi - lo) as f64 / 1e6;
        let mut cells = Vec::new();
        let mut attacks: BTreeSet<u8> = BTreeSet::new();
        let mut sess_json = Vec::new();
        for o in &outs {
            let mut lat: Vec<u32> = o
                .samples
                .iter()
                .filter(|s| s.end_us >= lo && s.end_us < hi)
                .map(|s| {
                    attacks.insert(s.attack);
                    s.lat_us
                })
                .collect();
            let st = stats(&mut lat, span);
            cells.push(format!(
                "{:>8.0}/s {:>7.2} {:>8.2} {:>8.2}",
                st.per_s, st.p50, st.p99, st.max
            ));
            sess_json.push(stats_json(&st));
        }
        let ups = outs[2]
            .uploads
            .iter()
            .filter(|(t, _)| *t >= lo && *t < hi)
            .count();
        let att: String = attacks
            .iter()
            .map(|&a| ATTACK_LETTERS[a as usize])
            .collect::<Vec<_>>()
            .join("");
        row(&format!(
            "{:>4}-{:<4} {:>7} | {} | {} | {} {:>4}",
            w * WINDOW_SECS,
            ((w + 1) * WINDOW_SECS).min(opts.seconds),
            att,
            cells[0],
            cells[1],
            cells[2],
            ups
        ));
        windows_json.push(json!({
            "from_s": w * WINDOW_SECS, "to_s": ((w + 1) * WINDOW_SECS).min(opts.seconds),
            "attacks": att, "read": sess_json[0], "write": sess_json[1], "upload": sess_json[2],
            "uploads_completed": ups,
        }));
    }

    row("");
    row("honest sessions over the whole run");
    let mut sessions_json = serde_json::Map::new();
    for (i, o) in outs.iter().enumerate() {
        let mut lat: Vec<u32> = o
            .samples
            .iter()
            .filter(|s| s.end_us <= opts.seconds * 1_000_000)
            .map(|s| s.lat_us)
            .collect();
        let all = stats(&mut lat, secs_total);
        row(&format!(
            "  {:<18} {:>8} ops {:>8.0}/s  p50 {:>7.3}  p99 {:>8.3}  max {:>9.3} ms; wrong {}, errors {}, missing {}",
            ROLES[i], all.n, all.per_s, all.p50, all.p99, all.max, o.wrong, o.errors, o.missing
        ));
        let mut by_attack = serde_json::Map::new();
        for a in 0..ATTACK_LETTERS.len() as u8 {
            let mut lat: Vec<u32> = o
                .samples
                .iter()
                .filter(|s| s.attack == a)
                .map(|s| s.lat_us)
                .collect();
            if lat.is_empty() {
                continue;
            }
            let st = stats(&mut lat, 0.0);
            row(&format!(
                "      under ({}) {:<48} {:>8} ops  p50 {:>7.3}  p99 {:>8.3}  max {:>9.3}",
                ATTACK_LETTERS[a as usize], ATTACK_NAMES[a as usize], st.n, st.p50, st.p99, st.max
            ));
            by_attack.insert(ATTACK_LETTERS[a as usize].into(), stats_json(&st));
        }
        let mut j = json!({
            "overall": stats_json(&all), "by_attack": by_attack,
            "wrong": o.wrong, "errors": o.errors, "missing": o.missing,
        });
        if i == 2 {
            let mut ms: Vec<u32> = o
                .uploads
                .iter()
                .map(|(_, ms)| (ms * 1000.0) as u32)
                .collect();
            let up = stats(&mut ms, secs_total);
            row(&format!(
                "  uploads: {} of {} succeeded (1 MiB, 16 chunks, read back); whole upload p50 {:.1} p99 {:.1} max {:.1} ms",
                o.uploads_ok,
                o.uploads_ok + o.uploads_failed,
                up.p50,
                up.p99,
                up.max
            ));
            j["uploads_ok"] = json!(o.uploads_ok);
            j["uploads_failed"] = json!(o.uploads_failed);
            j["upload_ms"] =
                json!({"p50": round3(up.p50), "p99": round3(up.p99), "max": round3(up.max)});
        }
        sessions_json.insert(["read", "write", "upload"][i].into(), j);
    }

    let rss: Vec<u64> = seconds.iter().map(|s| s.rss_kib).collect();
    let rss_min = rss.iter().copied().min().unwrap_or(0);
    let rss_max = rss.iter().copied().max().unwrap_or(0);
    let rss_last = rss.last().copied().unwrap_or(0);
    let hwm_end = final_status
        .map(|s| s.1)
        .or_else(|| seconds.last().map(|s| s.hwm_kib))
        .unwrap_or(0);
    let thr_max = seconds.iter().map(|s| s.threads).max().unwrap_or(0);
    let fds_max = seconds.iter().map(|s| s.fds).max().unwrap_or(0);
    row("");
    row(&format!(
        "broker VmRSS MiB over {} samples: min {:.1}, max {:.1}, last {:.1}; VmHWM at the end {:.1}; threads max {thr_max}, descriptors max {fds_max}",
        rss.len(),
        mib(rss_min),
        mib(rss_max),
        mib(rss_last),
        mib(hwm_end)
    ));

    let mut hostile_json = Value::Null;
    if opts.hostile {
        row("");
        row("hostile session: answers by attack, request kind and outcome");
        let counts = sh.counts.lock().unwrap_or_else(|e| e.into_inner());
        let mut list = Vec::new();
        for ((a, kind, outcome), n) in counts.iter() {
            row(&format!(
                "  ({}) {:<36} {:<44} {:>9}",
                ATTACK_LETTERS[*a as usize], kind, outcome, n
            ));
            list.push(json!({"attack": ATTACK_LETTERS[*a as usize], "kind": kind, "outcome": outcome, "n": n}));
        }
        if let Some(h) = &hostile_report {
            let drains: Vec<String> = (1..6)
                .map(|a| format!("({}) {:.2} s", ATTACK_LETTERS[a], h.drains[a]))
                .collect();
            row(&format!(
                "  {} requests sent; longest wait for the answers due after each attack: {}",
                h.sent,
                drains.join(", ")
            ));
            row(&format!(
                "  uploads held at most: {}; partial-line bytes sent by (d): {:.1} MiB; unanswered: {}{}",
                h.held_max,
                h.slow_bytes as f64 / 1048576.0,
                h.unanswered,
                h.dead
                    .as_deref()
                    .map(|d| format!("; ended early: {d}"))
                    .unwrap_or_default()
            ));
            hostile_json = json!({
                "tree_entries": tree_entries, "setup_s": round3(setup_secs),
                "sent": h.sent, "unanswered": h.unanswered, "held_uploads_max": h.held_max,
                "partial_line_bytes": h.slow_bytes,
                "drain_max_s": (1..6).map(|a| (ATTACK_LETTERS[a].to_owned(), json!(round3(h.drains[a])))).collect::<serde_json::Map<_, _>>(),
                "ended_early": h.dead,
                "counts": list,
            });
        }
    }

    let problems = run
        .problems
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let problem_count = run.problem_count.load(Ordering::Relaxed);
    for p in &problems {
        eprintln!("problem: {p}");
    }
    if problem_count as usize > problems.len() {
        eprintln!(
            "problem: … {} more",
            problem_count as usize - problems.len()
        );
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let log_lines = log.lines().count();
    let mut log_kinds: BTreeMap<String, u64> = BTreeMap::new();
    for l in log.lines() {
        // The message of a tracing line: what follows the target (`fsbroker::…: `).
        let msg = l
            .split_once("fsbroker")
            .and_then(|(_, rest)| rest.split_once(": "))
            .map_or(l, |(_, m)| m);
        let key: String = msg
            .split(|c: char| c == '=' || c.is_ascii_digit())
            .next()
            .unwrap_or("")
            .chars()
            .take(80)
            .collect();
        *log_kinds.entry(key.trim().to_owned()).or_default() += 1;
    }
    row(&format!("broker log: {log_lines} line(s) at RUST_LOG=warn"));
    for (k, n) in &log_kinds {
        row(&format!("  {n:>7}  {k}"));
    }
    if problem_count > 0 {
        for l in log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            eprintln!("broker: {l}");
        }
    }
    let ok = problem_count == 0;
    row(&format!(
        "{}: {problem_count} problem(s)",
        if ok { "PASS" } else { "FAIL" }
    ));

    if opts.json {
        let out = json!({
            "binary": binary.display().to_string(),
            "seconds": opts.seconds,
            "phase_s": opts.phase.as_secs_f64(),
            "hostile": opts.hostile,
            "honest": sessions_json,
            "windows": windows_json,
            "vmrss_kib": {"min": rss_min, "max": rss_max, "last": rss_last},
            "vmhwm_kib_final": hwm_end,
            "threads_max": thr_max,
            "fds_max": fds_max,
            "samples": seconds.iter().map(|s| json!({
                "t": s.t, "attack": ATTACK_LETTERS[s.attack as usize],
                "vmrss_kib": s.rss_kib, "vmhwm_kib": s.hwm_kib, "threads": s.threads, "fds": s.fds,
                "ops": s.ops, "max_ms": s.max_ms, "hostile_answers": s.hostile,
            })).collect::<Vec<_>>(),
            "hostile_session": hostile_json,
            "broker_exit": exit.and_then(|s| s.code()),
            "broker_log": log_kinds,
            "problems": problems,
            "problem_count": problem_count,
        });
        println!("{out:#}");
    }
    Ok(ok)
}

struct HostileReport {
    sent: u64,
    drains: [f64; 6],
    unanswered: u64,
    slow_bytes: u64,
    held_max: usize,
    dead: Option<String>,
}

/// A path as a TOML basic string.
fn toml_string(p: &Path) -> String {
    let s = p.to_string_lossy();
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

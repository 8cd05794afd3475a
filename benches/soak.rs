//! Soak: the real `fsbroker` binary under a steady mixed load for minutes, with its memory
//! sampled every second.
//!
//! The bench writes a policy (one read-write root in a temp dir, `requests_per_second = 0`),
//! starts `fsbroker serve --policy FILE` and keeps up to 256 requests in flight on its stdin:
//! reads of files from 0 B to 6 MiB at random offsets (utf-8 and base64), listings (flat,
//! recursive, paged), atomic writes read back and deleted, three-chunk uploads read back and
//! deleted, creates (files, nested directories) then deletes, bad requests of every kind, pings,
//! and a recursive `files/watch` whose directory changes all the time (through the broker and
//! directly on disk). Every answer is matched to its request by id and checked (content
//! byte for byte, counts, error codes); a line that cannot be parsed is answered with id `null`,
//! and those are counted too. Every second the broker's `VmRSS` and `VmHWM` are read from
//! `/proc/PID/status`.
//!
//! ```text
//! cargo build --release
//! cargo bench --bench soak                  # 120 s
//! cargo bench --bench soak -- --quick       # 10 s
//! cargo bench --bench soak -- --seconds 600 --json > soak.json   # or --csv
//! ```
//!
//! Run without `--bench` (as `cargo test --benches` does) and without `--seconds`/`--quick`,
//! it soaks for 2 s only, so test runs over all targets stay short.
//!
//! With `--json` or `--csv` the table goes to stderr and the data to stdout. The exit status
//! is non-zero when any answer was wrong, missing or duplicated, or the broker did not exit
//! cleanly at the end of its input.
//!
//! One file though long: a bench is one program with its own `main`; its phases share the
//! broker, the load and the memory sampler.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

mod kit;
use kit::{Rng, broker_binary, memory_kib, mib, nearest_rank};

/// Requests (and unparseable lines) in flight at once.
const WINDOW: usize = 256;
/// How long the answers still due at the end may take before the bench gives up on them.
const DRAIN: Duration = Duration::from_secs(30);
/// Stored descriptions of wrong answers (all are counted).
const MAX_REPORTED: usize = 20;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

struct Opts {
    seconds: u64,
    json: bool,
    csv: bool,
}

fn parse_args() -> Opts {
    let mut opts = Opts {
        seconds: 120,
        json: false,
        csv: false,
    };
    // `cargo bench` passes `--bench`; `cargo test --benches` (or `--all-targets`) does not,
    // and then, as criterion does, this only checks that it works: a short run.
    let mut chosen = false;
    let mut bench = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--bench" => bench = true,
            "--quick" => {
                opts.seconds = 10;
                chosen = true;
            }
            "--json" => opts.json = true,
            "--csv" => opts.csv = true,
            "--seconds" => {
                if let Some(n) = args.next().and_then(|v| v.parse().ok()) {
                    opts.seconds = n;
                    chosen = true;
                }
            }
            other => {
                if let Some(n) = other
                    .strip_prefix("--seconds=")
                    .and_then(|v| v.parse().ok())
                {
                    opts.seconds = n;
                    chosen = true;
                }
                // Anything else (filters, other harness flags) is ignored.
            }
        }
    }
    if !bench && !chosen {
        opts.seconds = 2;
    }
    opts.seconds = opts.seconds.max(1);
    opts
}

/// A file the bench created before starting the broker, kept in memory to check reads.
struct Fixture {
    rel: String,
    content: Vec<u8>,
    text: bool,
}

const TREE_DIRS: usize = 10;
const TREE_FILES: usize = 20;

fn make_fixtures(root: &Path) -> std::io::Result<Vec<Fixture>> {
    let mut rng = Rng(7);
    let specs: &[(&str, usize, bool)] = &[
        ("files/empty.bin", 0, false),
        ("files/small.txt", 1000, true),
        ("files/mid.bin", 64 << 10, false),
        ("files/text.txt", 300 << 10, true),
        ("files/big.bin", 1 << 20, false),
        ("files/huge.bin", 6 << 20, false),
    ];
    std::fs::create_dir_all(root.join("files"))?;
    let mut out = Vec::new();
    for &(rel, size, text) in specs {
        let content = if text {
            rng.text(size)
        } else {
            rng.bytes(size)
        };
        std::fs::write(root.join(rel), &content)?;
        out.push(Fixture {
            rel: rel.to_owned(),
            content,
            text,
        });
    }
    for d in 0..TREE_DIRS {
        let dir = root.join(format!("tree/d{d:02}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..TREE_FILES {
            std::fs::write(dir.join(format!("f{f:02}.txt")), format!("{d}/{f}\n"))?;
        }
    }
    std::fs::create_dir_all(root.join("scratch"))?;
    std::fs::create_dir_all(root.join("watched/sub"))?;
    Ok(out)
}

/// What the answer to a request must be, and what to send after it.
enum Expect {
    /// A chunk of a fixture.
    Read {
        file: usize,
        offset: usize,
        len: usize,
    },
    /// A file the bench wrote through the broker; deleted after the check.
    ReadBack { path: String, content: Arc<Vec<u8>> },
    /// A listing with exactly `entries` entries (`paged`: and a `nextCursor`).
    List { entries: usize, paged: bool },
    /// An atomic write; then read back (`check`) or deleted.
    Write {
        path: String,
        content: Arc<Vec<u8>>,
        check: bool,
    },
    /// Chunk `index` (of `CHUNKS`) of an upload.
    Upload {
        path: String,
        content: Arc<Vec<u8>>,
        index: usize,
    },
    /// A create; then a (recursive) delete of `cleanup`.
    Create { cleanup: String },
    /// A delete.
    Delete,
    /// The watch; its id is kept.
    Watch,
    /// Any success (ping, roots/list).
    Ok,
    /// An error with this `error.code`.
    Error(i64),
}

const UPLOAD_CHUNK: usize = 96 << 10;
const UPLOAD_CHUNKS: usize = 3;

/// One line to send: `expect` is `None` for lines without an id (answered with `null`, or
/// not at all when `answered` is false).
struct Job {
    line: String,
    expect: Option<(String, Expect)>,
    answered: bool,
}

#[derive(Default)]
struct Counts {
    /// Answers due: entries in `pending` plus `null`-id answers due.
    outstanding: usize,
    pending: HashMap<String, Expect>,
    null_due: u64,
}

struct Shared {
    state: Mutex<Counts>,
    space: Condvar,
    answered: AtomicU64,
    wrong: AtomicU64,
    reports: Mutex<Vec<String>>,
    notifications: AtomicU64,
    stop: AtomicBool,
    watch_id: Mutex<Option<String>>,
}

impl Shared {
    fn wrong(&self, what: String) {
        self.wrong.fetch_add(1, Ordering::Relaxed);
        let mut r = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() < MAX_REPORTED {
            r.push(what);
        }
    }
}

/// Makes request lines with their expectations.
struct Gen {
    rng: Rng,
    next_id: u64,
    fixtures: Arc<Vec<Fixture>>,
}

impl Gen {
    fn id(&mut self) -> String {
        self.next_id += 1;
        if self.next_id % 7 == 0 {
            format!("\"s{}\"", self.next_id)
        } else {
            self.next_id.to_string()
        }
    }

    fn request(&mut self, method: &str, params: Value, expect: Expect) -> Job {
        let id = self.id();
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
        Job {
            line,
            expect: Some((id, expect)),
            answered: true,
        }
    }

    fn raw(&mut self, line: &str, answered: bool) -> Job {
        Job {
            line: line.to_owned(),
            expect: None,
            answered,
        }
    }

    fn watch(&mut self) -> Job {
        self.request(
            "files/watch",
            json!({"path": "watched", "recursive": true}),
            Expect::Watch,
        )
    }

    /// The next request of the mix.
    fn next(&mut self) -> Job {
        let n = self.next_id;
        match self.rng.below(100) {
            0..=39 => self.read(),
            40..=49 => self.list(),
            50..=59 => self.write("scratch", true),
            60..=63 => self.upload(),
            64..=71 => self.create(n),
            72..=79 => self.bad(),
            80..=84 => {
                if self.rng.below(2) == 0 {
                    self.request("ping", json!({}), Expect::Ok)
                } else {
                    self.request("roots/list", json!({}), Expect::Ok)
                }
            }
            85..=89 => self.write("watched/sub", false),
            _ => self.read(),
        }
    }

    fn read(&mut self) -> Job {
        let file = self.rng.below(self.fixtures.len());
        let f = &self.fixtures[file];
        let size = f.content.len();
        let len = [512, 4096, 65_536, 1 << 20][self.rng.below(4)];
        let offset = if size == 0 || self.rng.below(4) == 0 {
            0
        } else {
            self.rng.below(size)
        };
        let encoding = if f.text { "utf-8" } else { "base64" };
        let params = json!({"path": f.rel, "offset": offset, "length": len, "encoding": encoding});
        self.request("files/read", params, Expect::Read { file, offset, len })
    }

    fn list(&mut self) -> Job {
        match self.rng.below(3) {
            0 => {
                let d = self.rng.below(TREE_DIRS);
                self.request(
                    "files/list",
                    json!({"path": format!("tree/d{d:02}")}),
                    Expect::List {
                        entries: TREE_FILES,
                        paged: false,
                    },
                )
            }
            1 => self.request(
                "files/list",
                json!({"path": "tree", "recursive": true}),
                Expect::List {
                    entries: TREE_DIRS * (TREE_FILES + 1),
                    paged: false,
                },
            ),
            _ => self.request(
                "files/list",
                json!({"path": "tree", "recursive": true, "limit": 50}),
                Expect::List {
                    entries: 50,
                    paged: true,
                },
            ),
        }
    }

    /// An atomic write of a new file under `dir`; read back then deleted when `check`.
    fn write(&mut self, dir: &str, check: bool) -> Job {
        let n = self.next_id;
        let size = [0, 100, 4096, 65_536, 200_000][self.rng.below(5)];
        let text = self.rng.below(2) == 0;
        let content = if text {
            self.rng.text(size)
        } else {
            self.rng.bytes(size)
        };
        let path = format!("{dir}/w{n}.{}", if text { "txt" } else { "bin" });
        let params = write_params(&path, &content, text, None);
        self.request(
            "files/write",
            params,
            Expect::Write {
                path,
                content: Arc::new(content),
                check,
            },
        )
    }

    fn upload(&mut self) -> Job {
        let n = self.next_id;
        let content = Arc::new(self.rng.bytes(UPLOAD_CHUNK * UPLOAD_CHUNKS));
        let path = format!("scratch/u{n}.bin");
        self.upload_chunk(path, content, 0)
    }

    fn upload_chunk(&mut self, path: String, content: Arc<Vec<u8>>, index: usize) -> Job {
        let start = index * UPLOAD_CHUNK;
        let chunk = &content[start..start + UPLOAD_CHUNK];
        let last = index + 1 == UPLOAD_CHUNKS;
        let params = write_params(&path, chunk, false, Some((start, last)));
        self.request(
            "files/write",
            params,
            Expect::Upload {
                path,
                content,
                index,
            },
        )
    }

    fn create(&mut self, n: u64) -> Job {
        if self.rng.below(2) == 0 {
            let path = format!("scratch/c{n}.txt");
            self.request(
                "files/create",
                json!({"path": path, "type": "file"}),
                Expect::Create { cleanup: path },
            )
        } else {
            let top = format!("scratch/d{n}");
            self.request(
                "files/create",
                json!({"path": format!("{top}/x/y"), "type": "directory"}),
                Expect::Create { cleanup: top },
            )
        }
    }

    fn delete(&mut self, path: &str) -> Job {
        self.request(
            "files/delete",
            json!({"path": path, "recursive": true}),
            Expect::Delete,
        )
    }

    fn bad(&mut self) -> Job {
        match self.rng.below(9) {
            0 => self.raw("this is not json", true),
            1 => self.raw("[1,2,3]", true),
            2 => self.raw(
                r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#,
                false,
            ),
            3 => self.request("files/frobnicate", json!({}), Expect::Error(-32601)),
            4 => self.request(
                "files/read",
                json!({"path": "files/small.txt", "lenght": 3}),
                Expect::Error(-32602),
            ),
            5 => self.request(
                "files/read",
                json!({"path": "../../../etc/passwd"}),
                Expect::Error(-31002),
            ),
            6 => self.request(
                "files/read",
                json!({"path": "files/missing.txt"}),
                Expect::Error(-31001),
            ),
            7 => {
                let id = self.id();
                Job {
                    line: format!(r#"{{"jsonrpc":"1.0","id":{id},"method":"ping"}}"#),
                    expect: Some((id, Expect::Error(-32600))),
                    answered: true,
                }
            }
            _ => self.request(
                "files/list",
                json!({"path": "files/small.txt"}),
                Expect::Error(-31003),
            ),
        }
    }
}

fn write_params(path: &str, content: &[u8], text: bool, chunk: Option<(usize, bool)>) -> Value {
    let mut p = if text {
        json!({"path": path, "content": String::from_utf8_lossy(content), "encoding": "utf-8"})
    } else {
        json!({"path": path, "content": B64.encode(content), "encoding": "base64"})
    };
    if let Some((offset, last)) = chunk {
        p["offset"] = json!(offset);
        p["final"] = json!(last);
    }
    p
}

/// Checks one answer; returns the requests that must follow it.
fn check(gen_fixtures: &[Fixture], expect: Expect, answer: &Value, shared: &Shared) -> Vec<Follow> {
    let id = answer["id"].to_string();
    let result = &answer["result"];
    let fail = |what: String| shared.wrong(format!("id {id}: {what}; answer {}", brief(answer)));
    let ok = !result.is_null();
    match expect {
        Expect::Error(code) => {
            if answer["error"]["code"].as_i64() != Some(code) {
                fail(format!("expected error {code}"));
            }
            Vec::new()
        }
        _ if !ok => {
            fail("expected a result".into());
            Vec::new()
        }
        Expect::Read { file, offset, len } => {
            let f = &gen_fixtures[file];
            let end = (offset + len).min(f.content.len());
            let want = &f.content[offset.min(end)..end];
            match content_of(result) {
                Some(got) if got == want => {}
                Some(got) => fail(format!(
                    "{} @{offset}+{len}: {} bytes, not the {} expected",
                    f.rel,
                    got.len(),
                    want.len()
                )),
                None => fail("no readable content".into()),
            }
            if result["size"].as_u64() != Some(f.content.len() as u64) {
                fail("wrong size".into());
            }
            Vec::new()
        }
        Expect::ReadBack { path, content } => {
            if content_of(result).as_deref() != Some(content.as_slice()) {
                fail(format!("{path} does not read back as written"));
            }
            vec![Follow::Delete(path)]
        }
        Expect::List { entries, paged } => {
            let n = result["entries"].as_array().map_or(0, Vec::len);
            if n != entries {
                fail(format!("{n} entries, expected {entries}"));
            }
            if paged != result["nextCursor"].is_string() {
                fail("nextCursor".into());
            }
            Vec::new()
        }
        Expect::Write {
            path,
            content,
            check,
        } => {
            if result["bytesWritten"].as_u64() != Some(content.len() as u64) {
                fail("bytesWritten".into());
            }
            if check {
                vec![Follow::ReadBack(path, content)]
            } else {
                vec![Follow::Delete(path)]
            }
        }
        Expect::Upload {
            path,
            content,
            index,
        } => {
            if result["size"].as_u64() != Some(((index + 1) * UPLOAD_CHUNK) as u64) {
                fail(format!("upload chunk {index}: wrong staged size"));
            }
            if index + 1 < UPLOAD_CHUNKS {
                vec![Follow::Chunk(path, content, index + 1)]
            } else {
                vec![Follow::ReadBack(path, content)]
            }
        }
        Expect::Create { cleanup } => {
            if result["created"] != json!(true) {
                fail("not created".into());
            }
            vec![Follow::Delete(cleanup)]
        }
        Expect::Watch => {
            match result["watchId"].as_str() {
                Some(w) => {
                    *shared.watch_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(w.into())
                }
                None => fail("no watchId".into()),
            }
            Vec::new()
        }
        Expect::Delete | Expect::Ok => Vec::new(),
    }
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

/// A request the reader asks the writer to send after an answer.
enum Follow {
    ReadBack(String, Arc<Vec<u8>>),
    Delete(String),
    Chunk(String, Arc<Vec<u8>>, usize),
}

impl Follow {
    fn job(self, generator: &mut Gen) -> Job {
        match self {
            Follow::ReadBack(path, content) => generator.request(
                "files/read",
                json!({"path": path, "encoding": "base64", "length": content.len().max(1)}),
                Expect::ReadBack { path, content },
            ),
            Follow::Delete(path) => generator.delete(&path),
            Follow::Chunk(path, content, index) => generator.upload_chunk(path, content, index),
        }
    }
}

/// Sends jobs, keeping at most `WINDOW` answers due; after `stop`, sends only follow-ups and
/// returns when nothing is due any more.
fn writer(
    mut input: BufWriter<std::process::ChildStdin>,
    mut generator: Gen,
    follows: mpsc::Receiver<Follow>,
    shared: &Shared,
) -> std::io::Result<()> {
    let mut unflushed = 0usize;
    let mut drain_deadline: Option<Instant> = None;
    let first = generator.watch();
    let mut queue: Vec<Job> = vec![first];
    loop {
        while let Ok(f) = follows.try_recv() {
            queue.push(f.job(&mut generator));
        }
        let stopping = shared.stop.load(Ordering::Relaxed);
        if queue.is_empty() {
            if stopping {
                input.flush()?;
                unflushed = 0;
                let deadline = *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN);
                let st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                if st.outstanding == 0 || Instant::now() > deadline {
                    // Nothing due and no follow-up can come any more.
                    if let Ok(f) = follows.try_recv() {
                        drop(st);
                        queue.push(f.job(&mut generator));
                        continue;
                    }
                    return Ok(());
                }
                drop(
                    shared
                        .space
                        .wait_timeout(st, Duration::from_millis(5))
                        .unwrap_or_else(|e| e.into_inner()),
                );
                continue;
            }
            queue.push(generator.next());
        }
        // Wait for room in the window (flushing first, so the broker has what it needs).
        {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.outstanding >= WINDOW {
                drop(st);
                input.flush()?;
                unflushed = 0;
                st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
                while st.outstanding >= WINDOW {
                    st = shared
                        .space
                        .wait_timeout(st, Duration::from_millis(50))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            // Expectations are registered before the lines leave (an answer can come back
            // at once)...
            for job in &mut queue {
                match job.expect.take() {
                    Some((id, expect)) => {
                        st.pending.insert(id, expect);
                        st.outstanding += 1;
                    }
                    None if job.answered => {
                        st.null_due += 1;
                        st.outstanding += 1;
                    }
                    None => {}
                }
            }
        }
        // ...and the lock is released before writing: a write can block on a full pipe
        // until the broker moves on, which needs the reader, which needs the lock.
        for job in queue.drain(..) {
            input.write_all(job.line.as_bytes())?;
            input.write_all(b"\n")?;
            unflushed += 1;
        }
        if unflushed >= 16 {
            input.flush()?;
            unflushed = 0;
        }
    }
}

/// Reads answers and notifications until the broker closes its output.
fn reader(
    mut lines: BufReader<std::process::ChildStdout>,
    fixtures: &[Fixture],
    follows: mpsc::Sender<Follow>,
    shared: &Shared,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        match lines.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                shared.wrong(format!("reading the broker's output: {e}"));
                return;
            }
        }
        let v: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            Err(e) => {
                shared.wrong(format!(
                    "unparseable output line ({e}): {}",
                    String::from_utf8_lossy(&line[..line.len().min(200)])
                ));
                continue;
            }
        };
        if v.get("method").is_some() {
            if v["method"] == "notifications/files/changed" {
                shared.notifications.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let expect = {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            if v["id"].is_null() {
                if st.null_due == 0 {
                    drop(st);
                    shared.wrong(format!("unexpected null-id answer: {}", brief(&v)));
                    continue;
                }
                st.null_due -= 1;
                None
            } else {
                match st.pending.remove(&v["id"].to_string()) {
                    Some(e) => Some(e),
                    None => {
                        drop(st);
                        shared.wrong(format!(
                            "answer for an id not pending (duplicate or unknown): {}",
                            brief(&v)
                        ));
                        continue;
                    }
                }
            }
        };
        shared.answered.fetch_add(1, Ordering::Relaxed);
        match expect {
            None => {
                if !matches!(v["error"]["code"].as_i64(), Some(-32700 | -32600)) {
                    shared.wrong(format!(
                        "null-id answer is not -32700/-32600: {}",
                        brief(&v)
                    ));
                }
            }
            Some(e) => {
                for f in check(fixtures, e, &v, shared) {
                    let _ = follows.send(f);
                }
            }
        }
        // Only now is the answer no longer due: its follow-ups are queued first, so a
        // stopping writer that sees nothing due has nothing left to send either.
        shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .outstanding -= 1;
        shared.space.notify_all();
    }
}

struct Sample {
    t: u64,
    requests: u64,
    rate: u64,
    rss_kib: u64,
    hwm_kib: u64,
}

fn main() -> ExitCode {
    let opts = parse_args();
    let binary = match broker_binary() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&opts, &binary) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(opts: &Opts, binary: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let tmp = tempfile::Builder::new()
        .prefix("fsbroker-soak-")
        .tempdir()?;
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root)?;
    let fixtures = Arc::new(make_fixtures(&root)?);
    let policy = tmp.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[[root]]\npath = {}\nname = \"soak\"\nmode = \"read-write\"\nconsent = \"auto\"\n\n[limits]\nrequests_per_second = 0\n",
            toml_string(&root)
        ),
    )?;
    let log_path = tmp.path().join("broker.log");
    let mut child = Command::new(binary)
        .args(["serve", "--policy"])
        .arg(&policy)
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    let pid = child.id();
    let mut input = BufWriter::with_capacity(1 << 20, child.stdin.take().ok_or("no stdin")?);
    let mut output = BufReader::with_capacity(1 << 20, child.stdout.take().ok_or("no stdout")?);
    // One ping answered before the load starts: the broker is up, and the first sample is
    // its idle memory.
    input.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"ping\"}\n")?;
    input.flush()?;
    let mut pong = String::new();
    output.read_line(&mut pong)?;
    if !pong.contains("\"result\"") {
        return Err(format!("the broker did not answer a ping: {pong:?}").into());
    }

    let shared = Arc::new(Shared {
        state: Mutex::new(Counts::default()),
        space: Condvar::new(),
        answered: AtomicU64::new(0),
        wrong: AtomicU64::new(0),
        reports: Mutex::new(Vec::new()),
        notifications: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        watch_id: Mutex::new(None),
    });
    let (follow_tx, follow_rx) = mpsc::channel();
    let generator = Gen {
        rng: Rng(42),
        next_id: 0,
        fixtures: Arc::clone(&fixtures),
    };

    let table_to_stderr = opts.json || opts.csv;
    let row = |s: &str| {
        if table_to_stderr {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    row(&format!(
        "soak: {} for {} s, pid {pid}, window {WINDOW}",
        binary.display(),
        opts.seconds
    ));
    row(&format!(
        "{:>5} {:>10} {:>8} {:>9} {:>9}",
        "t", "requests", "req/s", "VmRSS MB", "VmHWM MB"
    ));

    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::new();
    let (sent_ok, read_ok) = std::thread::scope(|s| {
        let w = s.spawn(|| writer(input, generator, follow_rx, &shared));
        let r = s.spawn(|| reader(output, &fixtures, follow_tx, &shared));
        let watched = root.join("watched/outside.txt");
        let mut prev = 0;
        if let Some((rss, hwm)) = memory_kib(pid) {
            samples.push(Sample {
                t: 0,
                requests: 0,
                rate: 0,
                rss_kib: rss,
                hwm_kib: hwm,
            });
            row(&format!(
                "{:>5} {:>10} {:>8} {:>9.1} {:>9.1}",
                0,
                0,
                0,
                mib(rss),
                mib(hwm)
            ));
        }
        for t in 1..=opts.seconds {
            let due = started + Duration::from_secs(t);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            // A change made behind the broker's back, for the watch.
            let _ = std::fs::write(&watched, format!("tick {t}\n"));
            let done = shared.answered.load(Ordering::Relaxed);
            let Some((rss, hwm)) = memory_kib(pid) else {
                row("the broker has exited");
                break;
            };
            let sample = Sample {
                t,
                requests: done,
                rate: done - prev,
                rss_kib: rss,
                hwm_kib: hwm,
            };
            prev = done;
            row(&format!(
                "{:>5} {:>10} {:>8} {:>9.1} {:>9.1}",
                sample.t,
                sample.requests,
                sample.rate,
                mib(rss),
                mib(hwm)
            ));
            samples.push(sample);
        }
        shared.stop.store(true, Ordering::Relaxed);
        let sent = w.join();
        // The writer returned and its input closed: the broker finishes and exits, which
        // ends the reader. One that hangs is killed.
        let exit_by = Instant::now() + DRAIN;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < exit_by {
            std::thread::sleep(Duration::from_millis(50));
        }
        if matches!(child.try_wait(), Ok(None)) {
            row("the broker did not exit at the end of its input; killing it");
            let _ = child.kill();
        }
        let read = r.join();
        (sent, read)
    });
    let status = child.wait()?;
    let elapsed = started.elapsed();
    let final_hwm = samples.last().map_or(0, |s| s.hwm_kib);

    let mut problems: Vec<String> = Vec::new();
    match sent_ok {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("writing to the broker failed: {e}")),
        Err(_) => problems.push("the writer thread panicked".into()),
    }
    if read_ok.is_err() {
        problems.push("the reader thread panicked".into());
    }
    if !status.success() {
        problems.push(format!("the broker exited with {status}"));
    }
    let unanswered = {
        let st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        st.outstanding
    };
    if unanswered > 0 {
        problems.push(format!("{unanswered} request(s) never answered"));
    }
    let wrong = shared.wrong.load(Ordering::Relaxed);
    if wrong > 0 {
        problems.push(format!("{wrong} wrong answer(s)"));
    }
    if shared
        .watch_id
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_none()
    {
        problems.push("the watch was not set up".into());
    }

    let total = shared.answered.load(Ordering::Relaxed);
    let notifications = shared.notifications.load(Ordering::Relaxed);
    let mut rss: Vec<u64> = samples.iter().map(|s| s.rss_kib).collect();
    let first = rss.first().copied().unwrap_or(0);
    let last = rss.last().copied().unwrap_or(0);
    rss.sort_unstable();
    let median = nearest_rank(&rss, 0.5).unwrap_or(0);
    let max = rss.last().copied().unwrap_or(0);
    // Skip the warm-up second when judging the steady state.
    let steady: Vec<u64> = samples.iter().skip(2).map(|s| s.rss_kib).collect();
    let steady_first = steady.first().copied().unwrap_or(first);

    row(&format!(
        "total: {total} requests answered in {:.1} s ({:.0} req/s), {notifications} file notifications, {wrong} wrong, {unanswered} unanswered",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    ));
    row(&format!(
        "VmRSS MB: first {:.1}, at 2 s {:.1}, median {:.1}, last {:.1}, max {:.1}; VmHWM at the end {:.1}",
        mib(first),
        mib(steady_first),
        mib(median),
        mib(last),
        mib(max),
        mib(final_hwm)
    ));
    for p in shared
        .reports
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        eprintln!("wrong: {p}");
    }
    for p in &problems {
        eprintln!("problem: {p}");
    }
    if !problems.is_empty() {
        if let Ok(log) = std::fs::read_to_string(&log_path) {
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            for l in tail.into_iter().rev() {
                eprintln!("broker: {l}");
            }
        }
    }

    if opts.json {
        let out = json!({
            "binary": binary.display().to_string(),
            "seconds": opts.seconds,
            "elapsed_s": elapsed.as_secs_f64(),
            "window": WINDOW,
            "requests": total,
            "requests_per_second": total as f64 / elapsed.as_secs_f64(),
            "file_notifications": notifications,
            "wrong": wrong,
            "unanswered": unanswered,
            "broker_exit": status.code(),
            "vmrss_kib": {"first": first, "median": median, "last": last, "max": max},
            "vmhwm_kib_final": final_hwm,
            "samples": samples.iter().map(|s| json!({
                "t": s.t, "requests": s.requests, "req_per_s": s.rate,
                "vmrss_kib": s.rss_kib, "vmhwm_kib": s.hwm_kib,
            })).collect::<Vec<_>>(),
            "problems": problems,
        });
        println!("{out:#}");
    }
    if opts.csv {
        println!("t,requests,req_per_s,vmrss_kib,vmhwm_kib");
        for s in &samples {
            println!(
                "{},{},{},{},{}",
                s.t, s.requests, s.rate, s.rss_kib, s.hwm_kib
            );
        }
    }
    Ok(problems.is_empty())
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

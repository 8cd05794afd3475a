//! Watch latency, end to end: from a file write to its `notifications/files/changed`.
//!
//! This drives the real binary over real pipes, the way an MCP server sees it:
//! `fsbroker serve --root TMPDIR --read-write`, one recursive `files/watch` on the root, then,
//! one sample at a time, `Instant::now()`, `std::fs::write`, and reading stdout until the
//! notification for that path arrives. Two cases:
//!
//! - `created`: a fresh file name each sample, so the expected event is `created`;
//! - `modified`: rewriting, one by one, the files the `created` case left behind.
//!
//! **The figures include the broker's coalescing window.** A burst on one path is held for
//! about 50 ms after its first event and then sent as one notification (the watch worker
//! wakes every 10 ms to check), so ~50 ms is the floor by design; what lies above it is
//! inotify, the watch worker, the session's queue, the stdout writer and the pipe.
//! Writes are spaced about 60 ms apart (and never before the previous sample's notification
//! has arrived), so every write is its own burst rather than being folded into the previous
//! one. A few warm-up writes come first and are not counted.
//!
//! Percentiles are nearest-rank: p99 of 200 samples is the 198th smallest.
//!
//! Run with `cargo build --release && cargo bench --bench watch` (200 samples per case),
//! `-- --quick` (20), `-- --samples N`, and `-- --json` for one JSON object on stdout instead
//! of the table. Any other argument (cargo passes `--bench`) is ignored.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod kit;
use kit::{broker_binary, nearest_rank};

/// The broker's coalescing window (`src/watch/worker.rs`), part of every figure.
const COALESCE_MS: u64 = 50;
/// The least time between two writes, so each one is a burst of its own.
const SPACING: Duration = Duration::from_millis(60);
/// How long one sample may wait for its notification before it counts as missed.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Writes before the measured ones, not counted.
const WARMUP: usize = 5;
const DEFAULT_SAMPLES: usize = 200;
const QUICK_SAMPLES: usize = 20;

struct Args {
    samples: usize,
    json: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut samples = None;
    let mut quick = false;
    let mut json = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = if arg == "--samples" {
            Some(args.next().ok_or("--samples needs a number")?)
        } else {
            arg.strip_prefix("--samples=").map(str::to_owned)
        };
        if let Some(v) = value {
            let n: usize = v
                .parse()
                .map_err(|_| format!("--samples: not a number: {v:?}"))?;
            if n == 0 {
                return Err("--samples must be at least 1".into());
            }
            samples = Some(n);
            continue;
        }
        match arg.as_str() {
            "--quick" => quick = true,
            "--json" => json = true,
            // `--bench` from cargo, filters, and anything else: not ours.
            _ => {}
        }
    }
    let samples = samples.unwrap_or(if quick {
        QUICK_SAMPLES
    } else {
        DEFAULT_SAMPLES
    });
    Ok(Args { samples, json })
}

/// One line from the broker's stdout, stamped when it was read.
struct Line {
    at: Instant,
    msg: Value,
}

struct Broker {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    next_id: u64,
}

impl Broker {
    fn spawn(bin: &Path, root: &Path) -> Result<Broker, String> {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--root")
            .arg(root)
            .arg("--read-write")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, lines) = mpsc::channel();
        // A thread of its own reads and stamps every line the moment it arrives, so a
        // sample's end is not delayed by whatever the main thread is doing.
        thread::Builder::new()
            .name("fsbroker-stdout".into())
            .spawn(move || {
                let mut stdout = BufReader::new(stdout);
                let mut buf = String::new();
                loop {
                    buf.clear();
                    match stdout.read_line(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                    let at = Instant::now();
                    let msg = match serde_json::from_str(&buf) {
                        Ok(v) => v,
                        Err(e) => {
                            eprintln!(
                                "watch bench: fsbroker wrote a line that is not JSON ({e}): {buf:?}"
                            );
                            continue;
                        }
                    };
                    if tx.send(Line { at, msg }).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| format!("cannot start the reader thread: {e}"))?;
        Ok(Broker {
            child,
            stdin,
            lines,
            next_id: 1,
        })
    }

    /// Sends a request and returns its `result`, skipping notifications on the way.
    fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .map_err(|e| e.to_string())?;
        frame.push(b'\n');
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        stdin
            .write_all(&frame)
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("write to fsbroker: {e}"))?;
        let deadline = Instant::now() + SAMPLE_TIMEOUT;
        loop {
            let line = self.next_line(deadline)?;
            if line.msg["id"] != json!(id) {
                continue;
            }
            return match line.msg.get("result") {
                Some(r) => Ok(r.clone()),
                None => Err(format!("{method} failed: {}", line.msg)),
            };
        }
    }

    fn next_line(&self, deadline: Instant) -> Result<Line, String> {
        let wait = deadline.saturating_duration_since(Instant::now());
        self.lines.recv_timeout(wait).map_err(|e| match e {
            RecvTimeoutError::Timeout => "timed out waiting for fsbroker".to_owned(),
            RecvTimeoutError::Disconnected => "fsbroker closed its stdout".to_owned(),
        })
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // End of stdin ends the session and the broker; kill it only if it lingers.
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one case measured.
#[derive(Default)]
struct Case {
    name: &'static str,
    /// Write → notification, in milliseconds, in the order taken.
    latencies: Vec<f64>,
    /// Writes whose notification never came within [`SAMPLE_TIMEOUT`].
    missed: usize,
    /// Notifications for the sample's path with another event than expected.
    unexpected: usize,
}

impl Case {
    fn sorted(&self) -> Vec<f64> {
        let mut v = self.latencies.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// Nearest-rank percentile.
    fn pct(sorted: &[f64], p: f64) -> f64 {
        nearest_rank(sorted, p / 100.0).unwrap_or(f64::NAN)
    }

    fn stats(&self) -> Stats {
        let s = self.sorted();
        let mean = if s.is_empty() {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / s.len() as f64
        };
        Stats {
            min: s.first().copied().unwrap_or(f64::NAN),
            p50: Case::pct(&s, 50.0),
            p90: Case::pct(&s, 90.0),
            p99: Case::pct(&s, 99.0),
            max: s.last().copied().unwrap_or(f64::NAN),
            mean,
        }
    }
}

struct Stats {
    min: f64,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    mean: f64,
}

/// Writes `rel` beneath `dir` and waits for its `event` notification; `None` if it never
/// came. Notifications for other paths (a late event of an earlier sample) are skipped.
fn sample(
    broker: &Broker,
    dir: &Path,
    root_name: &str,
    rel: &str,
    event: &str,
    content: &[u8],
    unexpected: &mut usize,
) -> Result<Option<f64>, String> {
    let want = format!("{root_name}/{rel}");
    let path = dir.join(rel);
    let start = Instant::now();
    std::fs::write(&path, content).map_err(|e| format!("write {}: {e}", path.display()))?;
    let deadline = start + SAMPLE_TIMEOUT;
    loop {
        let line = match broker.next_line(deadline) {
            Ok(l) => l,
            Err(e) if Instant::now() >= deadline => {
                eprintln!("watch bench: no {event} notification for {want}: {e}");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let msg = &line.msg;
        if msg["method"] != "notifications/files/changed" || msg["params"]["path"] != want.as_str()
        {
            continue;
        }
        if msg["params"]["event"] != event {
            *unexpected += 1;
            continue;
        }
        return Ok(Some(line.at.duration_since(start).as_secs_f64() * 1e3));
    }
}

/// Keeps writes at least [`SPACING`] apart.
fn pace(last_write: &mut Option<Instant>) {
    if let Some(t) = *last_write {
        let next = t + SPACING;
        let now = Instant::now();
        if next > now {
            thread::sleep(next - now);
        }
    }
    *last_write = Some(Instant::now());
}

fn run(args: &Args) -> Result<(PathBuf, Vec<Case>), String> {
    let bin = broker_binary()?;
    let tmp = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    // The root's own path, symlinks resolved, as the broker and inotify see it.
    let dir = tmp
        .path()
        .canonicalize()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let mut broker = Broker::spawn(&bin, &dir)?;

    let roots = broker.request("roots/list", json!({}))?;
    let root_name = roots["roots"][0]["name"]
        .as_str()
        .ok_or_else(|| format!("roots/list without a root: {roots}"))?
        .to_owned();
    broker.request("files/watch", json!({"path": root_name, "recursive": true}))?;

    let mut last_write = None;
    let mut ignored = 0;
    for i in 0..WARMUP {
        pace(&mut last_write);
        let rel = format!("warmup-{i}.txt");
        sample(
            &broker,
            &dir,
            &root_name,
            &rel,
            "created",
            b"warm-up\n",
            &mut ignored,
        )?;
    }

    let names: Vec<String> = (0..args.samples)
        .map(|i| format!("sample-{i:05}.txt"))
        .collect();
    let mut created = Case {
        name: "created",
        ..Default::default()
    };
    for rel in &names {
        pace(&mut last_write);
        match sample(
            &broker,
            &dir,
            &root_name,
            rel,
            "created",
            b"first version\n",
            &mut created.unexpected,
        )? {
            Some(ms) => created.latencies.push(ms),
            None => created.missed += 1,
        }
    }
    let mut modified = Case {
        name: "modified",
        ..Default::default()
    };
    for rel in &names {
        pace(&mut last_write);
        match sample(
            &broker,
            &dir,
            &root_name,
            rel,
            "modified",
            b"second version, a little longer\n",
            &mut modified.unexpected,
        )? {
            Some(ms) => modified.latencies.push(ms),
            None => modified.missed += 1,
        }
    }
    drop(broker);
    Ok((bin, vec![created, modified]))
}

fn print_table(bin: &Path, samples: usize, cases: &[Case]) {
    println!("fsbroker watch latency: std::fs::write -> notifications/files/changed on stdout");
    println!("binary:  {}", bin.display());
    println!(
        "samples: {samples} per case, writes >= {} ms apart, {WARMUP} warm-up writes not counted",
        SPACING.as_millis()
    );
    println!(
        "note:    every figure includes the broker's ~{COALESCE_MS} ms coalescing window (by design)"
    );
    println!();
    println!(
        "{:<10} {:>7} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "case", "samples", "missed", "min ms", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"
    );
    for c in cases {
        let s = c.stats();
        println!(
            "{:<10} {:>7} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            c.name,
            c.latencies.len(),
            c.missed,
            s.min,
            s.p50,
            s.p90,
            s.p99,
            s.max,
            s.mean
        );
    }
    for c in cases.iter().filter(|c| c.unexpected > 0) {
        println!(
            "{}: {} notification(s) for a sample's path carried another event",
            c.name, c.unexpected
        );
    }
}

fn json_out(bin: &Path, samples: usize, cases: &[Case]) -> Value {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "bench": "watch",
        "binary": bin.display().to_string(),
        "samplesRequested": samples,
        "spacingMs": SPACING.as_millis() as u64,
        "coalesceMs": COALESCE_MS,
        "includesCoalesceWindow": true,
        "warmup": WARMUP,
        "cases": cases.iter().map(|c| {
            let s = c.stats();
            json!({
                "case": c.name,
                "samples": c.latencies.len(),
                "missed": c.missed,
                "unexpectedEvents": c.unexpected,
                "minMs": round(s.min),
                "p50Ms": round(s.p50),
                "p90Ms": round(s.p90),
                "p99Ms": round(s.p99),
                "maxMs": round(s.max),
                "meanMs": round(s.mean),
            })
        }).collect::<Vec<_>>(),
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("watch bench: {e}");
            return ExitCode::from(2);
        }
    };
    let (bin, cases) = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("watch bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{}", json_out(&bin, args.samples, &cases));
    } else {
        print_table(&bin, args.samples, &cases);
    }
    if cases.iter().any(|c| c.missed > 0) {
        eprintln!("watch bench: some writes were never notified");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

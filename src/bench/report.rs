//! The bench's results: a summary table, or one JSON object (`--json`).
//!
//! Throughput is in MB/s and GB/s (powers of 10); latencies in microseconds; memory in bytes
//! (the table shows MiB). The other MCP servers' entries (`mcp`) are the exception: their
//! latencies are in milliseconds and their memory in MiB, as in the table.
//!
//! Reads and uploads are in `transfers`, one entry per chunk size with sftp's figures and the
//! ratios beside them. Last come the `goals`: each speed goal of the project this run has a
//! figure for, as text (figure, measured, goal) and whether it was met ([`goals`]).

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::Encoding;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The command that started the broker.
    pub broker: String,
    /// The file read and uploaded (none when only small operations ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<TestFile>,
    /// The knobs.
    pub settings: Settings,
    /// Chunked reads and uploads (and sftp's, with `--compare-sftp`): one entry per chunk
    /// size, in the order given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<Transfer>,
    /// Small operations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub small: Option<Small>,
    /// Change → notification latency of `files/watch`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watch: Option<Watch>,
    /// A recursive `files/list` of a large tree, against `find`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list: Option<List>,
    /// The broker's memory.
    pub memory: Memory,
    /// Whether OpenSSH's sftp could be compared (with `--compare-sftp`); its figures are in
    /// [`Report::transfers`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp: Option<Sftp>,
    /// Other MCP servers (with `--compare-mcp`), in the order given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<McpServer>>,
    /// The speed goals this run measured, met or not: [`goals`] of the rest of the report.
    pub goals: Vec<Goal>,
}

/// The file read and uploaded.
#[derive(Debug, Serialize)]
pub(crate) struct TestFile {
    /// Its path.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Whether the bench made it (and removed it afterwards).
    pub generated: bool,
}

/// The knobs of the run.
#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    /// Bytes per read or upload request: each size is one entry of [`Report::transfers`].
    pub chunk_sizes: Vec<u64>,
    /// Encoding asked for.
    pub encoding: &'static str,
    /// Read (and upload) requests in flight.
    pub depth: usize,
    /// Small operations per kind and mode.
    pub small_ops: usize,
    /// Requests in flight in the pipelined small runs.
    pub small_depth: usize,
    /// `sampled` (three windows per chunk) or `sha256` (every byte).
    pub verify: &'static str,
    /// Size of the file the other MCP servers read (when they run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_size: Option<u64>,
}

/// Bytes over time.
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct Throughput {
    /// Bytes moved.
    pub bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// 10^6 bytes per second.
    pub mb_per_s: f64,
    /// 10^9 bytes per second.
    pub gb_per_s: f64,
}

impl Throughput {
    /// `bytes` in `elapsed`.
    pub(crate) fn new(bytes: u64, elapsed: Duration) -> Throughput {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            bytes,
            seconds,
            mb_per_s: bytes as f64 / seconds / 1e6,
            gb_per_s: bytes as f64 / seconds / 1e9,
        }
    }
}

/// Chunked reads.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Read {
    /// Bytes over time.
    #[serde(flatten)]
    pub throughput: Throughput,
    /// Requests sent.
    pub requests: u64,
    /// Chunks that came back as base64.
    pub chunks_base64: u64,
    /// Chunks that came back as utf-8 text.
    pub chunks_utf8: u64,
}

/// The chunked upload.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Upload {
    /// Bytes over time (the commit included).
    #[serde(flatten)]
    pub throughput: Throughput,
    /// Requests sent.
    pub requests: u64,
    /// Round trip of the final chunk, which commits (sync and rename).
    pub last_chunk_seconds: f64,
}

/// Operations over time, with latency percentiles.
#[derive(Debug, Serialize)]
pub(crate) struct Ops {
    /// Operations done.
    pub ops: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median latency (request written to answer read), microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
}

impl Ops {
    /// `ops` in `elapsed`, with `sorted` latencies.
    pub(crate) fn new(ops: u64, elapsed: Duration, sorted: &[Duration]) -> Ops {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let pct = |q: f64| {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            sorted[rank - 1].as_secs_f64() * 1e6
        };
        Ops {
            ops,
            seconds,
            ops_per_s: ops as f64 / seconds,
            p50_us: pct(0.50),
            p99_us: pct(0.99),
        }
    }
}

/// One kind of small operation, both ways.
#[derive(Debug, Serialize)]
pub(crate) struct OpsPair {
    /// One at a time.
    pub sequential: Ops,
    /// `depth` in flight.
    pub pipelined: Ops,
}

/// Small operations.
#[derive(Debug, Serialize)]
pub(crate) struct Small {
    /// Requests in flight when pipelined.
    pub depth: usize,
    /// Bytes per small read.
    pub read_size: usize,
    /// Entries per listing.
    pub list_entries: usize,
    /// 1 KiB `files/read`.
    pub read_1k: OpsPair,
    /// Non-recursive `files/list`.
    pub list: OpsPair,
}

/// Change → notification latency of `files/watch` (nearest-rank percentiles).
#[derive(Debug, Serialize)]
pub(crate) struct Watch {
    /// Changes timed.
    pub samples: usize,
    /// Changes whose notification did not come within 5 s.
    pub missed: usize,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// The slowest, milliseconds.
    pub max_ms: f64,
}

impl Watch {
    /// From `sorted` latencies and the number `missed`.
    pub(crate) fn new(sorted: &[Duration], missed: usize) -> Watch {
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let rank = |q: f64| {
            let n = sorted.len();
            ms(sorted.get(((q * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1))
        };
        Watch {
            samples: sorted.len() + missed,
            missed,
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: ms(sorted.last()),
        }
    }
}

/// A recursive `files/list` of a large tree (every page), against `find` on the same tree.
#[derive(Debug, Serialize)]
pub(crate) struct List {
    /// Entries in the tree.
    pub entries: usize,
    /// fsbroker's whole listing, seconds (median of 3, warm cache).
    pub seconds: f64,
    /// `find DIR`'s (names only), seconds (median of 3, warm cache).
    pub find_seconds: f64,
    /// `find DIR -printf '%p %y %s %T@\n'`'s (what an entry holds), seconds.
    pub find_stat_seconds: f64,
    /// fsbroker's time ÷ `find`'s.
    pub ratio_to_find: f64,
    /// fsbroker's time ÷ `find -printf`'s.
    pub ratio_to_find_stat: f64,
}

impl List {
    /// `entries` listed in `ours`, by `find` in `names` and by `find -printf` in `stats`.
    pub(crate) fn new(entries: usize, ours: Duration, names: Duration, stats: Duration) -> List {
        let a = ours.as_secs_f64();
        let (b, c) = (names.as_secs_f64().max(1e-9), stats.as_secs_f64().max(1e-9));
        List {
            entries,
            seconds: a,
            find_seconds: b,
            find_stat_seconds: c,
            ratio_to_find: a / b,
            ratio_to_find_stat: a / c,
        }
    }
}

/// The broker's peak resident memory (`VmHWM`), in bytes, at points of the run.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Memory {
    /// At the end of the run.
    pub peak_bytes: Option<u64>,
    /// Once it answered its first ping.
    pub idle_bytes: Option<u64>,
    /// After the chunked reads.
    pub after_read_bytes: Option<u64>,
    /// After the small operations.
    pub after_small_bytes: Option<u64>,
    /// After the upload.
    pub after_upload_bytes: Option<u64>,
    /// How the broker ended once its input closed.
    pub exit: String,
}

/// Whether OpenSSH's sftp could be compared, and with which programs.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Sftp {
    /// Whether sftp and sftp-server were found.
    pub available: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The client program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The server program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

/// The reads and the upload at one chunk size, with sftp's measured right after each (so a
/// ratio compares runs close in time, not the first size's sftp with the last size's broker).
#[derive(Debug, Default, Serialize)]
pub(crate) struct Transfer {
    /// Bytes per read or upload request.
    pub chunk_size: u64,
    /// Chunked reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<Read>,
    /// The chunked upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Upload>,
    /// `sftp get FILE /dev/null`, right after the read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp_get: Option<Throughput>,
    /// `sftp put FILE TARGET`, right after the upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp_put: Option<Throughput>,
    /// `sftp put -f` (synced, like a broker's commit), after `sftp put`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp_put_fsync: Option<Throughput>,
    /// fsbroker read MB/s ÷ sftp get MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_ratio: Option<f64>,
    /// fsbroker upload MB/s ÷ sftp put MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_ratio: Option<f64>,
    /// fsbroker upload MB/s ÷ sftp put -f MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_ratio_fsync: Option<f64>,
}

impl Transfer {
    /// Nothing measured yet at `chunk_size`.
    pub(crate) fn new(chunk_size: u64) -> Transfer {
        Transfer {
            chunk_size,
            ..Transfer::default()
        }
    }

    /// Sets the ratios from whatever both sides measured.
    pub(crate) fn ratios(&mut self) {
        let ratio = |ours: Option<&Throughput>, theirs: Option<&Throughput>| {
            Some(ours?.mb_per_s / theirs?.mb_per_s).filter(|r| r.is_finite())
        };
        let read = self.read.as_ref().map(|r| &r.throughput);
        let upload = self.upload.as_ref().map(|u| &u.throughput);
        self.read_ratio = ratio(read, self.sftp_get.as_ref());
        self.upload_ratio = ratio(upload, self.sftp_put.as_ref());
        self.upload_ratio_fsync = ratio(upload, self.sftp_put_fsync.as_ref());
    }
}

/// Another MCP filesystem server (`--compare-mcp`). What it could not do is in `error`; what
/// it did before that is kept.
#[derive(Debug, Default, Serialize)]
pub(crate) struct McpServer {
    /// Its `serverInfo.name`, else its program's file name.
    pub name: String,
    /// The command as given.
    pub command: String,
    /// The command with `{dir}` replaced, run as `sh -c 'exec LAUNCHED'`.
    pub launched: String,
    /// `serverInfo` from its `initialize` answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_info: Option<ServerInfo>,
    /// The protocol version it answered with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// 1 KiB `read_text_file` calls, one at a time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub small: Option<McpSmall>,
    /// One `read_media_file` of a large file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub large: Option<McpLarge>,
    /// fsbroker's sequential 1 KiB reads per second ÷ this server's (when both ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Why it could not be measured (or not completely).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An MCP server's `serverInfo`.
#[derive(Debug, Default, Serialize)]
pub(crate) struct ServerInfo {
    /// `serverInfo.name`.
    pub name: Option<String>,
    /// `serverInfo.version`.
    pub version: Option<String>,
}

/// Sequential 1 KiB `read_text_file` calls, timed like fsbroker's sequential small reads.
#[derive(Debug, Serialize)]
pub(crate) struct McpSmall {
    /// Calls timed (after a warm-up).
    pub ops: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Calls per second.
    pub ops_per_sec: f64,
    /// Median latency (request written to answer read), milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
}

impl From<Ops> for McpSmall {
    fn from(o: Ops) -> McpSmall {
        McpSmall {
            ops: o.ops,
            seconds: o.seconds,
            ops_per_sec: o.ops_per_s,
            p50_ms: o.p50_us / 1e3,
            p99_ms: o.p99_us / 1e3,
        }
    }
}

/// One `read_media_file` of the whole file.
#[derive(Debug, Serialize)]
pub(crate) struct McpLarge {
    /// The file's size.
    pub bytes: u64,
    /// Request written to the whole answer read.
    pub seconds: f64,
    /// File bytes (not base64) per second, 10^6.
    pub mb_per_sec: f64,
    /// The server's peak resident memory (VmHWM) after it, MiB: the largest in its process
    /// tree.
    pub vm_hwm_mib: Option<f64>,
}

impl McpServer {
    /// Sets [`McpServer::ratio`] from fsbroker's small operations.
    pub(crate) fn set_ratio(&mut self, fsbroker: &Small) {
        self.ratio = self
            .small
            .as_ref()
            .map(|m| fsbroker.read_1k.sequential.ops_per_s / m.ops_per_sec)
            .filter(|r| r.is_finite());
    }
}

/// One of the project's speed goals, and how this run did against it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Goal {
    /// What is measured, e.g. `read 1 MiB vs sftp get`.
    pub figure: String,
    /// This run's figure, e.g. `1.23x` or `87,000 ops/s`.
    pub measured: String,
    /// The goal, e.g. `>= 1.0x`.
    pub goal: String,
    /// Whether the measured figure meets the goal.
    pub met: bool,
}

/// Chunks at least this large are held to [`READ_GOAL_LARGE`], smaller ones to
/// [`READ_GOAL_SMALL`]: a smaller chunk pays a request's fixed cost more often, while sftp's
/// own request size stays the same whatever `--chunk-size` is.
const READ_GOAL_FROM: u64 = 1 << 20;
const READ_GOAL_LARGE: f64 = 1.0;
const READ_GOAL_SMALL: f64 = 0.8;
/// fsbroker's durable upload ÷ `sftp put -f`.
const UPLOAD_GOAL: f64 = 1.0;
/// fsbroker's sequential 1 KiB reads per second ÷ another MCP server's.
const MCP_GOAL: f64 = 2.0;
/// Pipelined 1 KiB reads per second.
const PIPELINED_GOAL: f64 = 100_000.0;
/// The broker's peak resident memory over the run, bytes (strictly below).
const MEMORY_GOAL: u64 = 64 << 20;
/// `files/watch` change → notification p99, milliseconds (strictly below).
const WATCH_GOAL_MS: f64 = 100.0;
/// fsbroker's recursive listing time ÷ `find -printf`'s.
const LIST_GOAL: f64 = 2.0;

/// The speed goals (the project's speed issue) that `report` has a figure for, in the issue's
/// order, each met or not. Figures the run did not measure are left out rather than failed: a
/// run without `--compare-sftp` says nothing about sftp.
pub(crate) fn goals(report: &Report) -> Vec<Goal> {
    let mut out = Vec::new();
    let mut push = |figure: String, measured: String, goal: String, met: bool| {
        out.push(Goal {
            figure,
            measured,
            goal,
            met,
        })
    };
    let times = |r: f64| format!("{r:.2}x");
    // The read goals are for base64; utf-8 chunks are a different figure (JSON-escaped text).
    if report.settings.encoding == Encoding::Base64.name() {
        for t in &report.transfers {
            if let Some(r) = t.read_ratio {
                let want = if t.chunk_size >= READ_GOAL_FROM {
                    READ_GOAL_LARGE
                } else {
                    READ_GOAL_SMALL
                };
                push(
                    format!("read {} vs sftp get", size(t.chunk_size)),
                    times(r),
                    format!(">= {want:.1}x"),
                    r >= want,
                );
            }
        }
    }
    for t in &report.transfers {
        if let Some(r) = t.upload_ratio_fsync {
            push(
                format!("upload {} vs sftp put -f", size(t.chunk_size)),
                times(r),
                format!(">= {UPLOAD_GOAL:.1}x"),
                r >= UPLOAD_GOAL,
            );
        }
    }
    let kib = report.small.as_ref().map_or(1, |s| s.read_size / 1024);
    for s in report.mcp.iter().flatten() {
        if let Some(r) = s.ratio {
            push(
                format!("{kib} KiB reads one at a time vs {}", s.name),
                times(r),
                format!(">= {MCP_GOAL:.1}x"),
                r >= MCP_GOAL,
            );
        }
    }
    if let Some(sm) = &report.small {
        let ops = sm.read_1k.pipelined.ops_per_s;
        push(
            format!("{kib} KiB reads, {} in flight", sm.depth),
            format!("{} ops/s", thousands(ops)),
            format!(">= {} ops/s", thousands(PIPELINED_GOAL)),
            ops >= PIPELINED_GOAL,
        );
    }
    if let Some(peak) = report.memory.peak_bytes {
        push(
            "broker peak memory (VmHWM)".into(),
            mib(peak),
            format!("< {}", size(MEMORY_GOAL)),
            peak < MEMORY_GOAL,
        );
    }
    if let Some(w) = &report.watch {
        // A notification that never came is slower than any goal.
        let missed = if w.missed > 0 {
            format!(", {} missed", w.missed)
        } else {
            String::new()
        };
        push(
            "files/watch change → notification p99".into(),
            format!("{:.1} ms{missed}", w.p99_ms),
            format!("< {WATCH_GOAL_MS:.0} ms"),
            w.missed == 0 && w.p99_ms < WATCH_GOAL_MS,
        );
    }
    if let Some(l) = &report.list {
        push(
            format!(
                "recursive files/list ({} entries) vs find -printf",
                l.entries
            ),
            times(l.ratio_to_find_stat),
            format!("<= {LIST_GOAL:.1}x"),
            l.ratio_to_find_stat <= LIST_GOAL,
        );
    }
    out
}

impl Report {
    /// One JSON object and a newline.
    pub(crate) fn json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            serde_json::json!({"error": format!("cannot serialize the report: {e}")}).to_string()
        });
        text.push('\n');
        text
    }

    /// The summary table.
    pub(crate) fn table(&self) -> String {
        let mut t = String::new();
        let s = &self.settings;
        let _ = writeln!(t, "fsbroker bench");
        let _ = writeln!(t, "  broker    {}", self.broker);
        if let Some(f) = &self.file {
            let _ = writeln!(
                t,
                "  file      {} ({}{})",
                f.path,
                size(f.size),
                if f.generated {
                    ", made for this run"
                } else {
                    ""
                }
            );
        }
        let chunks: Vec<String> = s.chunk_sizes.iter().map(|&c| size(c)).collect();
        let _ = writeln!(
            t,
            "  requests  chunks of {}{}, {}, {} in flight; content checked: {}",
            chunks.join(", "),
            if chunks.len() > 1 { " (in turn)" } else { "" },
            s.encoding,
            s.depth,
            s.verify
        );
        let vs_sftp = self.sftp.as_ref().is_some_and(|s| s.available);
        for tr in &self.transfers {
            transfer_table(&mut t, tr, vs_sftp, s.encoding);
        }
        if let Some(sm) = &self.small {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                "small operations", "ops/s", "p50 ms", "p99 ms"
            );
            let row = |t: &mut String, name: String, o: &Ops| {
                let _ = writeln!(
                    t,
                    "  {:<30} {:>10.0} {:>8.3} {:>9.3}",
                    name,
                    o.ops_per_s,
                    o.p50_us / 1e3,
                    o.p99_us / 1e3
                );
            };
            let kib = sm.read_size / 1024;
            row(
                &mut t,
                format!("read {kib} KiB, sequential"),
                &sm.read_1k.sequential,
            );
            row(
                &mut t,
                format!("read {kib} KiB, {} in flight", sm.depth),
                &sm.read_1k.pipelined,
            );
            row(
                &mut t,
                format!("list {} entries, sequential", sm.list_entries),
                &sm.list.sequential,
            );
            row(
                &mut t,
                format!("list {} entries, {} in flight", sm.list_entries, sm.depth),
                &sm.list.pipelined,
            );
        }
        if let Some(w) = &self.watch {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                "files/watch", "p50 ms", "p99 ms", "max ms"
            );
            let _ = writeln!(
                t,
                "  {:<30} {:>10.1} {:>8.1} {:>9.1}{}",
                format!("change → notification ({})", w.samples),
                w.p50_ms,
                w.p99_ms,
                w.max_ms,
                if w.missed > 0 {
                    format!("  ({} missed)", w.missed)
                } else {
                    String::new()
                }
            );
            let _ = writeln!(t, "  (includes the broker's 50 ms coalescing window)");
        }
        if let Some(l) = &self.list {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                "recursive list", "seconds", "ref s", "fsbroker"
            );
            let _ = writeln!(
                t,
                "  {:<30} {:>10.3}",
                format!("files/list, {} entries", l.entries),
                l.seconds
            );
            for (name, seconds, ratio) in [
                ("  vs find (names only)", l.find_seconds, l.ratio_to_find),
                (
                    "  vs find -printf (+ stat)",
                    l.find_stat_seconds,
                    l.ratio_to_find_stat,
                ),
            ] {
                let _ = writeln!(
                    t,
                    "  {:<30} {:>10} {:>8.3} {:>9}",
                    name,
                    "",
                    seconds,
                    format!("{ratio:.2}x")
                );
            }
        }
        if let Some(servers) = &self.mcp {
            mcp_table(&mut t, servers, self.small.as_ref(), s.mcp_size);
        }
        let m = &self.memory;
        let _ = writeln!(t);
        let mib = |b: Option<u64>| b.map_or_else(|| "?".into(), mib);
        let _ = write!(t, "  broker peak memory (VmHWM)  {}", mib(m.peak_bytes));
        let mut parts = vec![format!("idle {}", mib(m.idle_bytes))];
        if m.after_read_bytes.is_some() {
            parts.push(format!("after reads {}", mib(m.after_read_bytes)));
        }
        if m.after_small_bytes.is_some() {
            parts.push(format!("after small ops {}", mib(m.after_small_bytes)));
        }
        let _ = writeln!(t, " ({})", parts.join(", "));
        let _ = writeln!(t, "  broker exit                 {}", m.exit);
        if let Some(note) = self.sftp.as_ref().and_then(|s| s.note.as_deref()) {
            let _ = writeln!(t);
            let _ = writeln!(t, "  no comparison: {note}");
        }
        goals_table(&mut t, &self.goals);
        t
    }
}

/// One chunk size's block: fsbroker's reads and upload, each followed by sftp's.
fn transfer_table(t: &mut String, tr: &Transfer, vs_sftp: bool, encoding: &str) {
    if tr.read.is_none() && tr.upload.is_none() {
        return;
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9}{}",
        format!("transfer, {} chunks", size(tr.chunk_size)),
        "MB/s",
        "GB/s",
        "seconds",
        if vs_sftp { "    vs sftp" } else { "" }
    );
    let row = |t: &mut String, name: &str, tp: &Throughput, ratio: Option<f64>| {
        let _ = writeln!(
            t,
            "  {:<30} {:>10.1} {:>8.3} {:>9.3}{}",
            name,
            tp.mb_per_s,
            tp.gb_per_s,
            tp.seconds,
            ratio.map_or_else(String::new, |r| format!(" {:>10}", format!("{r:.2}x")))
        );
    };
    if let Some(r) = &tr.read {
        row(t, "fsbroker files/read", &r.throughput, tr.read_ratio);
    }
    if let Some(g) = &tr.sftp_get {
        row(t, "sftp get", g, None);
    }
    if let Some(u) = &tr.upload {
        row(
            t,
            "fsbroker files/write upload",
            &u.throughput,
            tr.upload_ratio,
        );
    }
    if let Some(p) = &tr.sftp_put {
        row(t, "sftp put", p, None);
    }
    if let Some(p) = &tr.sftp_put_fsync {
        row(t, "sftp put -f (synced)", p, None);
    }
    if let Some(u) = &tr.upload {
        let _ = writeln!(
            t,
            "  (the upload's last chunk, which syncs and commits, took {:.3} s{})",
            u.last_chunk_seconds,
            tr.upload_ratio_fsync
                .map(|r| format!("; {r:.2}x sftp put -f"))
                .unwrap_or_default()
        );
    }
    if let Some(r) = tr
        .read
        .as_ref()
        .filter(|r| r.chunks_base64 > 0 && encoding == Encoding::Utf8.name())
    {
        let _ = writeln!(
            t,
            "  ({} of {} read chunks came back as base64: not UTF-8)",
            r.chunks_base64,
            r.chunks_base64 + r.chunks_utf8
        );
    }
}

/// The goals' block, last: each figure, what this run measured, the goal, met or not.
fn goals_table(t: &mut String, goals: &[Goal]) {
    if goals.is_empty() {
        return;
    }
    // Columns as wide as their longest entry, so a long server name or goal shifts no row.
    let widest = |f: fn(&Goal) -> &str, least: usize| {
        goals
            .iter()
            .map(|g| f(g).chars().count())
            .fold(least, usize::max)
    };
    let figure = widest(|g| &g.figure, 40);
    let measured = widest(|g| &g.measured, 10);
    let goal = widest(|g| &g.goal, 8);
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<figure$} {:>measured$}     goal",
        "goals", "measured"
    );
    for g in goals {
        let _ = writeln!(
            t,
            "  {:<figure$} {:>measured$}     {:<goal$}  {}",
            g.figure,
            g.measured,
            g.goal,
            if g.met { "met" } else { "NOT met" }
        );
    }
}

/// The other MCP servers' section.
fn mcp_table(t: &mut String, servers: &[McpServer], small: Option<&Small>, large: Option<u64>) {
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9} {:>12} {:>9} {:>10}",
        "other MCP servers", "ops/s", "p50 ms", "p99 ms", "fsbroker is", "MB/s", "VmHWM MiB"
    );
    let dash = || "-".to_owned();
    for s in servers {
        let name = match s.server_info.as_ref().and_then(|i| i.version.as_deref()) {
            Some(v) => format!("{} {v}", s.name),
            None => s.name.clone(),
        };
        if s.small.is_some() || s.large.is_some() {
            let m = s.small.as_ref();
            let l = s.large.as_ref();
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9} {:>12} {:>9} {:>10}",
                name,
                m.map_or_else(dash, |m| format!("{:.0}", m.ops_per_sec)),
                m.map_or_else(dash, |m| format!("{:.3}", m.p50_ms)),
                m.map_or_else(dash, |m| format!("{:.3}", m.p99_ms)),
                s.ratio.map_or_else(dash, |r| format!("{r:.2}x")),
                l.map_or_else(dash, |l| format!("{:.1}", l.mb_per_sec)),
                l.and_then(|l| l.vm_hwm_mib)
                    .map_or_else(dash, |v| format!("{v:.1}")),
            );
        }
        if let Some(e) = &s.error {
            let mut lines = e.lines();
            let _ = writeln!(
                t,
                "  {:<30} error: {}",
                name,
                lines.next().unwrap_or_default()
            );
            for line in lines {
                let _ = writeln!(t, "  {:<30}   {line}", "");
            }
        }
    }
    let kib = small.map_or(1, |s| s.read_size / 1024);
    let large = large.map_or_else(|| "a large file".to_owned(), size);
    let _ = writeln!(
        t,
        "  (ops/s, p50, p99: read_text_file of {kib} KiB files, one call at a time, timed like\n   \
         \"read {kib} KiB, sequential\"; fsbroker is: fsbroker's ops/s there ÷ the server's;\n   \
         MB/s: one read_media_file of {large}; VmHWM: the server's peak memory after it)"
    );
    for s in servers {
        let _ = writeln!(t, "  {:<30} {}", s.name, s.launched);
    }
}

/// Bytes in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A count, rounded, with thousands separated by commas: `87,000`.
fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes, in the binary unit that names them best.
fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes % unit == 0 {
                format!("{} {name}", bytes / unit)
            } else {
                format!("{v:.2} {name}")
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A report of a run that measured nothing.
    fn bare(encoding: &'static str) -> Report {
        Report {
            broker: "fsbroker serve".into(),
            file: None,
            settings: Settings {
                chunk_sizes: vec![1 << 20],
                encoding,
                depth: 8,
                small_ops: 10,
                small_depth: 64,
                verify: "sampled",
                mcp_size: None,
            },
            transfers: Vec::new(),
            small: None,
            watch: None,
            list: None,
            memory: Memory::default(),
            sftp: None,
            mcp: None,
            goals: Vec::new(),
        }
    }

    fn ops(ops_per_s: f64) -> Ops {
        Ops {
            ops: 100,
            seconds: 1.0,
            ops_per_s,
            p50_us: 10.0,
            p99_us: 20.0,
        }
    }

    fn small(pipelined: f64) -> Small {
        Small {
            depth: 64,
            read_size: 1024,
            list_entries: 32,
            read_1k: OpsPair {
                sequential: ops(10_000.0),
                pipelined: ops(pipelined),
            },
            list: OpsPair {
                sequential: ops(1_000.0),
                pipelined: ops(2_000.0),
            },
        }
    }

    /// A transfer at `chunk` with these ratios (and the figures behind them).
    fn transfer(chunk: u64, read: Option<f64>, upload_fsync: Option<f64>) -> Transfer {
        let mb = |x: f64| Throughput {
            mb_per_s: x,
            ..Throughput::default()
        };
        let mut t = Transfer::new(chunk);
        if let Some(r) = read {
            t.read = Some(Read {
                throughput: mb(100.0 * r),
                ..Read::default()
            });
            t.sftp_get = Some(mb(100.0));
        }
        if let Some(r) = upload_fsync {
            t.upload = Some(Upload {
                throughput: mb(100.0 * r),
                ..Upload::default()
            });
            t.sftp_put = Some(mb(200.0));
            t.sftp_put_fsync = Some(mb(100.0));
        }
        t.ratios();
        t
    }

    /// `(figure, measured, goal, met)` of each goal.
    fn summary(report: &Report) -> Vec<(String, String, String, bool)> {
        goals(report)
            .into_iter()
            .map(|g| (g.figure, g.measured, g.goal, g.met))
            .collect()
    }

    fn goal(figure: &str, measured: &str, goal: &str, met: bool) -> (String, String, String, bool) {
        (figure.into(), measured.into(), goal.into(), met)
    }

    #[test]
    fn nothing_measured_no_goals() {
        assert!(goals(&bare("base64")).is_empty());
        // Reads and uploads without sftp have no ratio, so no goal either.
        let mut r = bare("base64");
        r.transfers = vec![Transfer {
            read: Some(Read::default()),
            upload: Some(Upload::default()),
            ..Transfer::new(1 << 20)
        }];
        r.transfers[0].ratios();
        assert!(goals(&r).is_empty());
    }

    #[test]
    fn read_goal_depends_on_the_chunk_size() {
        let mut r = bare("base64");
        r.transfers = vec![
            transfer(256 << 10, Some(0.85), None),
            transfer(1 << 20, Some(0.95), None),
            transfer(8 << 20, Some(1.25), None),
            transfer(512 << 10, Some(0.75), None),
        ];
        assert_eq!(
            summary(&r),
            [
                goal("read 256 KiB vs sftp get", "0.85x", ">= 0.8x", true),
                goal("read 1 MiB vs sftp get", "0.95x", ">= 1.0x", false),
                goal("read 8 MiB vs sftp get", "1.25x", ">= 1.0x", true),
                goal("read 512 KiB vs sftp get", "0.75x", ">= 0.8x", false),
            ]
        );
    }

    #[test]
    fn utf8_reads_have_no_goal_but_uploads_do() {
        let mut r = bare("utf-8");
        r.transfers = vec![
            transfer(256 << 10, Some(2.0), Some(1.5)),
            transfer(1 << 20, Some(2.0), Some(0.9)),
        ];
        assert_eq!(
            summary(&r),
            [
                goal("upload 256 KiB vs sftp put -f", "1.50x", ">= 1.0x", true),
                goal("upload 1 MiB vs sftp put -f", "0.90x", ">= 1.0x", false),
            ]
        );
        // Against put -f, not plain put (which is twice as fast in `transfer`).
        assert_eq!(r.transfers[0].upload_ratio, Some(0.75));
    }

    #[test]
    fn reads_come_before_uploads() {
        let mut r = bare("base64");
        r.transfers = vec![
            transfer(256 << 10, Some(1.0), Some(1.0)),
            transfer(1 << 20, Some(1.0), Some(1.0)),
        ];
        let figures: Vec<String> = goals(&r).into_iter().map(|g| g.figure).collect();
        assert_eq!(
            figures,
            [
                "read 256 KiB vs sftp get",
                "read 1 MiB vs sftp get",
                "upload 256 KiB vs sftp put -f",
                "upload 1 MiB vs sftp put -f",
            ]
        );
    }

    #[test]
    fn one_mcp_goal_per_server_with_a_ratio() {
        let mut r = bare("base64");
        let server = |name: &str, ratio: Option<f64>| McpServer {
            name: name.into(),
            ratio,
            ..McpServer::default()
        };
        r.mcp = Some(vec![
            server("fast", Some(2.5)),
            server("broken", None),
            server("close", Some(1.99)),
        ]);
        assert_eq!(
            summary(&r),
            [
                goal(
                    "1 KiB reads one at a time vs fast",
                    "2.50x",
                    ">= 2.0x",
                    true
                ),
                goal(
                    "1 KiB reads one at a time vs close",
                    "1.99x",
                    ">= 2.0x",
                    false
                ),
            ]
        );
    }

    #[test]
    fn pipelined_small_reads() {
        let mut r = bare("base64");
        r.small = Some(small(87_000.4));
        assert_eq!(
            summary(&r),
            [goal(
                "1 KiB reads, 64 in flight",
                "87,000 ops/s",
                ">= 100,000 ops/s",
                false
            )]
        );
        r.small = Some(small(100_000.0));
        assert!(goals(&r)[0].met);
    }

    #[test]
    fn memory_must_stay_below_64_mib() {
        let mut r = bare("base64");
        r.memory.peak_bytes = Some((64 << 20) - 1);
        assert_eq!(
            summary(&r),
            [goal(
                "broker peak memory (VmHWM)",
                "64.0 MiB",
                "< 64 MiB",
                true
            )]
        );
        r.memory.peak_bytes = Some(64 << 20);
        assert!(!goals(&r)[0].met);
    }

    #[test]
    fn watch_p99_below_100_ms_and_nothing_missed() {
        let watch = |p99_ms: f64, missed: usize| Watch {
            samples: 20,
            missed,
            p50_ms: 55.0,
            p99_ms,
            max_ms: p99_ms,
        };
        let mut r = bare("base64");
        r.watch = Some(watch(99.9, 0));
        assert_eq!(
            summary(&r),
            [goal(
                "files/watch change → notification p99",
                "99.9 ms",
                "< 100 ms",
                true
            )]
        );
        r.watch = Some(watch(100.0, 0));
        assert!(!goals(&r)[0].met);
        r.watch = Some(watch(60.0, 1));
        let g = &goals(&r)[0];
        assert!(!g.met);
        assert_eq!(g.measured, "60.0 ms, 1 missed");
    }

    #[test]
    fn list_at_most_twice_find_printf() {
        let mut r = bare("base64");
        let secs = Duration::from_secs_f64;
        // Against find -printf (2.0x), not names-only find (4.0x).
        r.list = Some(List::new(1000, secs(0.4), secs(0.1), secs(0.2)));
        assert_eq!(
            summary(&r),
            [goal(
                "recursive files/list (1000 entries) vs find -printf",
                "2.00x",
                "<= 2.0x",
                true
            )]
        );
        r.list = Some(List::new(1000, secs(0.42), secs(0.1), secs(0.2)));
        assert!(!goals(&r)[0].met);
    }

    #[test]
    fn every_goal_in_order_and_in_the_table() {
        let mut r = bare("base64");
        r.transfers = vec![transfer(1 << 20, Some(1.21), Some(1.1))];
        r.mcp = Some(vec![McpServer {
            name: "other".into(),
            ratio: Some(3.0),
            ..McpServer::default()
        }]);
        r.small = Some(small(150_000.0));
        r.memory.peak_bytes = Some(20 << 20);
        r.watch = Some(Watch::new(&[Duration::from_millis(60)], 0));
        r.list = Some(List::new(
            10,
            Duration::from_millis(10),
            Duration::from_millis(9),
            Duration::from_millis(8),
        ));
        r.goals = goals(&r);
        let figures: Vec<&str> = r.goals.iter().map(|g| g.figure.as_str()).collect();
        assert_eq!(
            figures,
            [
                "read 1 MiB vs sftp get",
                "upload 1 MiB vs sftp put -f",
                "1 KiB reads one at a time vs other",
                "1 KiB reads, 64 in flight",
                "broker peak memory (VmHWM)",
                "files/watch change → notification p99",
                "recursive files/list (10 entries) vs find -printf",
            ]
        );
        assert!(r.goals.iter().all(|g| g.met), "{:#?}", r.goals);
        let table = r.table();
        let block = &table[table.rfind("goals").expect("a goals block")..];
        assert!(block.contains("read 1 MiB vs sftp get"), "{table}");
        assert!(
            block.contains("1.21x") && block.contains(">= 1.0x"),
            "{table}"
        );
        assert!(block.contains("150,000 ops/s"), "{table}");
        assert!(table.contains("transfer, 1 MiB chunks"), "{table}");
    }

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        assert_eq!(thousands(87_000.0), "87,000");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }
}

//! The bench's results: a summary table, or one JSON object (`--json`).
//!
//! Throughput is in MB/s and GB/s (powers of 10); latencies in microseconds; memory in bytes
//! (the table shows MiB). The other MCP servers' entries (`mcp`) are the exception: their
//! latencies are in milliseconds and their memory in MiB, as in the table.

use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The command that started the broker.
    pub broker: String,
    /// The file read and uploaded (none when only small operations ran).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<TestFile>,
    /// The knobs.
    pub settings: Settings,
    /// Chunked reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read: Option<Read>,
    /// The chunked upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Upload>,
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
    /// OpenSSH's sftp on the same file (with `--compare-sftp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sftp: Option<Sftp>,
    /// Other MCP servers (with `--compare-mcp`), in the order given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Vec<McpServer>>,
}

/// The file read and uploaded.
#[derive(Debug, Serialize)]
pub struct TestFile {
    /// Its path.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// Whether the bench made it (and removed it afterwards).
    pub generated: bool,
}

/// The knobs of the run.
#[derive(Debug, Serialize)]
pub struct Settings {
    /// Bytes per read or upload request.
    pub chunk_size: u64,
    /// Encoding asked for.
    pub encoding: &'static str,
    /// Read requests in flight.
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
pub struct Throughput {
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
    pub fn new(bytes: u64, elapsed: Duration) -> Throughput {
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
pub struct Read {
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
pub struct Upload {
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
pub struct Ops {
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
    pub fn new(ops: u64, elapsed: Duration, sorted: &[Duration]) -> Ops {
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
pub struct OpsPair {
    /// One at a time.
    pub sequential: Ops,
    /// `depth` in flight.
    pub pipelined: Ops,
}

/// Small operations.
#[derive(Debug, Serialize)]
pub struct Small {
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
pub struct Watch {
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
    pub fn new(sorted: &[Duration], missed: usize) -> Watch {
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
pub struct List {
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
    pub fn new(entries: usize, ours: Duration, names: Duration, stats: Duration) -> List {
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
pub struct Memory {
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

/// OpenSSH's sftp on the same file.
#[derive(Debug, Default, Serialize)]
pub struct Sftp {
    /// Whether sftp and sftp-server were found.
    pub available: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The programs used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The server program.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// `get FILE /dev/null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub get: Option<Throughput>,
    /// `put FILE TARGET`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub put: Option<Throughput>,
    /// `put -f` (synced, like a broker's commit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub put_fsync: Option<Throughput>,
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

impl Sftp {
    pub(crate) fn ratios(&mut self, read: Option<&Read>, upload: Option<&Upload>) {
        let ratio = |ours: Option<&Throughput>, theirs: &Option<Throughput>| {
            Some(ours?.mb_per_s / theirs.as_ref()?.mb_per_s).filter(|r| r.is_finite())
        };
        self.read_ratio = ratio(read.map(|r| &r.throughput), &self.get);
        self.upload_ratio = ratio(upload.map(|u| &u.throughput), &self.put);
        self.upload_ratio_fsync = ratio(upload.map(|u| &u.throughput), &self.put_fsync);
    }
}

/// Another MCP filesystem server (`--compare-mcp`). What it could not do is in `error`; what
/// it did before that is kept.
#[derive(Debug, Default, Serialize)]
pub struct McpServer {
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
pub struct ServerInfo {
    /// `serverInfo.name`.
    pub name: Option<String>,
    /// `serverInfo.version`.
    pub version: Option<String>,
}

/// Sequential 1 KiB `read_text_file` calls, timed like fsbroker's sequential small reads.
#[derive(Debug, Serialize)]
pub struct McpSmall {
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
pub struct McpLarge {
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

impl Report {
    /// One JSON object and a newline.
    pub fn json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            serde_json::json!({"error": format!("cannot serialize the report: {e}")}).to_string()
        });
        text.push('\n');
        text
    }

    /// The summary table.
    pub fn table(&self) -> String {
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
        let _ = writeln!(
            t,
            "  requests  chunks of {}, {}, {} in flight; content checked: {}",
            size(s.chunk_size),
            s.encoding,
            s.depth,
            s.verify
        );
        let sftp = self.sftp.as_ref();
        if self.read.is_some() || self.upload.is_some() {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}{}",
                "transfer",
                "MB/s",
                "GB/s",
                "seconds",
                if sftp.is_some_and(|s| s.available) {
                    "    vs sftp"
                } else {
                    ""
                }
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
            if let Some(r) = &self.read {
                row(
                    &mut t,
                    "fsbroker files/read",
                    &r.throughput,
                    sftp.and_then(|s| s.read_ratio),
                );
            }
            if let Some(g) = sftp.and_then(|s| s.get.as_ref()) {
                row(&mut t, "sftp get", g, None);
            }
            if let Some(u) = &self.upload {
                row(
                    &mut t,
                    "fsbroker files/write upload",
                    &u.throughput,
                    sftp.and_then(|s| s.upload_ratio),
                );
            }
            if let Some(p) = sftp.and_then(|s| s.put.as_ref()) {
                row(&mut t, "sftp put", p, None);
            }
            if let Some(p) = sftp.and_then(|s| s.put_fsync.as_ref()) {
                row(&mut t, "sftp put -f (synced)", p, None);
            }
            if let Some(u) = &self.upload {
                let _ = writeln!(
                    t,
                    "  (the upload's last chunk, which syncs and commits, took {:.3} s{})",
                    u.last_chunk_seconds,
                    sftp.and_then(|s| s.upload_ratio_fsync)
                        .map(|r| format!("; {r:.2}x sftp put -f"))
                        .unwrap_or_default()
                );
            }
            if let Some(r) = self
                .read
                .as_ref()
                .filter(|r| r.chunks_base64 > 0 && s.encoding == "utf-8")
            {
                let _ = writeln!(
                    t,
                    "  ({} of {} read chunks came back as base64: not UTF-8)",
                    r.chunks_base64,
                    r.chunks_base64 + r.chunks_utf8
                );
            }
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
        let mib = |b: Option<u64>| {
            b.map_or_else(
                || "?".into(),
                |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
            )
        };
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
        if let Some(note) = sftp.and_then(|s| s.note.as_deref()) {
            let _ = writeln!(t);
            let _ = writeln!(t, "  no comparison: {note}");
        }
        t
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

//! The bench's results: a summary table, or one JSON object (`--json`).
//!
//! Throughput is in MB/s and GB/s (powers of 10); latencies in microseconds, except where a
//! member's name says milliseconds (`_ms`: watch and console); memory in bytes (the table
//! shows MiB). The other MCP servers' entries (`mcp`) are the exception: their latencies are
//! in milliseconds and their memory in MiB, as in the table.
//!
//! Reads and uploads are in `transfers`, one entry per chunk size with sftp's figures and the
//! ratios beside them. Last come the `goals`: each speed goal of the project this run has a
//! figure for, as text (figure, measured, goal) and whether it was met ([`goals()`]).
//!
//! This file holds what a run measured, as serialized; `goals.rs` the speed goals it is held
//! to; `table.rs` the summary table.

mod goals;
mod table;

use std::time::Duration;

use serde::Serialize;

use super::Encoding;

pub(crate) use self::goals::{Goal, goals};

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
    /// The person's console: how soon it shows and acts, and what an open page costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console: Option<Console>,
    /// What the integrity extension's hashes cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub integrity: Option<Integrity>,
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
    /// `sampled` (three windows per chunk) or `sha256` (every byte, and the broker's hashes
    /// of each chunk read, of the whole file and of each upload checked too).
    pub verify: &'static str,
    /// The SHA-256 engine this CPU gets (`sha-ni`, `armv8-sha2` or `portable`), with
    /// `--verify`: the broker's hashes run on it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256_engine: Option<&'static str>,
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
    /// CPU time the broker spent per operation (user and system, every thread), microseconds:
    /// unlike the rate, it hardly moves when other programs share the machine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_cpu_us: Option<f64>,
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
            broker_cpu_us: None,
        }
    }

    /// With the broker's CPU time over the run (`None` where it could not be read).
    pub(crate) fn with_cpu(mut self, cpu: Option<Duration>) -> Ops {
        self.broker_cpu_us = cpu.map(|c| c.as_secs_f64() * 1e6 / self.ops.max(1) as f64);
        self
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

/// Latency of something that should follow an act within a time, with nearest-rank
/// percentiles of the samples that came, and how many did not.
#[derive(Debug, Serialize)]
pub(crate) struct Latency {
    /// Samples timed.
    pub samples: usize,
    /// Samples whose outcome did not come in time (for watch: within 5 s).
    pub missed: usize,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: f64,
    /// The slowest, milliseconds.
    pub max_ms: f64,
}

impl Latency {
    /// From `sorted` latencies and the number `missed`.
    pub(crate) fn new(sorted: &[Duration], missed: usize) -> Latency {
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let rank = |q: f64| {
            let n = sorted.len();
            ms(sorted.get(((q * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1))
        };
        Latency {
            samples: sorted.len() + missed,
            missed,
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: ms(sorted.last()),
        }
    }
}

/// Change → notification latency of `files/watch`.
pub(crate) type Watch = Latency;

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

/// The person's console (`--only console`), on brokers of the phase's own: latencies with a
/// page's view of them (`/api/events` open, `/api/state` read as the page reads it), and
/// read throughput with and without a page open.
#[derive(Debug, Serialize)]
pub(crate) struct Console {
    /// `files/consent` sent under a `prompt` root → a `state` event, then `/api/state` with
    /// the prompt in it.
    pub prompt: Latency,
    /// `POST /api/roots/NAME/pause` sent → `notifications/roots/list_changed` read by the
    /// session. `missed`: no notification within 5 s.
    pub revoke_list_changed: Latency,
    /// The same pause → the answer to a `files/read` there, sent right after the
    /// notification, read refused. `missed`: no notification, or the read was not refused.
    pub revoke_refused: Latency,
    /// `files/read` sent → its `activity` event (merged reads wait up to 250 ms).
    pub feed: Latency,
    /// Bytes read in each run of the pairs (the test file).
    pub pair_bytes: u64,
    /// Bytes per request in the pairs (the first `--chunk-size`).
    pub pair_chunk_size: u64,
    /// Chunked reads without and with a console and an open `/api/events`, back to back.
    pub pairs: Vec<ConsolePair>,
    /// Geometric mean of the pairs' ratios (with ÷ without).
    pub ratio_geomean: Option<f64>,
}

/// One pair of chunked reads of the test file, each on a broker of its own: without the
/// console, and with it and a page's `/api/events` open and drained.
#[derive(Debug, Serialize)]
pub(crate) struct ConsolePair {
    /// Whether the read with the console ran first (the order alternates).
    pub console_first: bool,
    /// Without `--console`.
    pub off: Throughput,
    /// With `--console` and `/api/events` open.
    pub on: Throughput,
    /// `on` MB/s ÷ `off` MB/s.
    pub ratio: f64,
    /// Requests the read with the console sent.
    pub requests: u64,
    /// `activity` events for those reads the page received (merged: a handful).
    pub activity_events: u64,
    /// The requests those events stand for (the sum of their `count`): all of them, unless
    /// the page fell behind (`lost`) or the feed missed some.
    pub activity_requests: u64,
}

/// What the integrity extension costs (`--only integrity`): transfers without and with the
/// broker's SHA-256, back to back, and a whole file's hash.
#[derive(Debug, Serialize)]
pub(crate) struct Integrity {
    /// The SHA-256 engine this CPU gets (`sha-ni`, `armv8-sha2`, `portable`).
    pub engine: &'static str,
    /// Bytes of each transfer (the test file).
    pub bytes: u64,
    /// Bytes per request (the first `--chunk-size`).
    pub chunk_size: u64,
    /// Chunked reads without and with `"sha256": true`.
    pub reads: Vec<IntegrityPair>,
    /// Geometric mean of the reads' ratios (with ÷ without).
    pub read_geomean: Option<f64>,
    /// Chunked uploads without and with the upload's sha256 (announced, then checked).
    pub uploads: Vec<IntegrityPair>,
    /// Geometric mean of the uploads' ratios.
    pub upload_geomean: Option<f64>,
    /// `files/checksum` of the whole file.
    pub checksum: Throughput,
    /// The bench's own process hashing the same file (page cache, same engine).
    pub local_sha256: Throughput,
}

/// One transfer without and with the hash, back to back.
#[derive(Debug, Serialize)]
pub(crate) struct IntegrityPair {
    /// Whether the one with the hash ran first (the order alternates).
    pub hashed_first: bool,
    /// Without the hash.
    pub off: Throughput,
    /// With it.
    pub on: Throughput,
    /// `on` MB/s ÷ `off` MB/s.
    pub ratio: f64,
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

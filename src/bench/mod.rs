//! `fsbroker bench`: a client that starts a broker over real pipes and measures it.
//!
//! The bench makes a workspace in the temp directory (removed afterwards, also on Ctrl-C):
//! the test file (random, incompressible; or `--file`), 32 small text files, and a policy with
//! two roots — `data` (read-only, the test file's directory) and `scratch` (read-write) —
//! and no rate limits. It starts `fsbroker serve --policy FILE` (this executable, or
//! `--broker-cmd`), then runs its phases on that one broker:
//!
//! - `read.rs`: chunked `files/read` of the whole file, `depth` requests in flight, content
//!   checked (sampled, or a full sha256 with `--verify`);
//! - `small.rs`: 1 KiB reads and non-recursive lists, sequential (latency p50/p99) and pipelined;
//! - `watch.rs`: change → notification latency of `files/watch`;
//! - `list.rs`: a recursive `files/list` of a large tree, against `find`;
//! - `mcp/`: with `--compare-mcp`, other MCP filesystem servers (each its own process):
//!   1 KiB `read_text_file` calls measured like fsbroker's sequential small reads, and one
//!   large `read_media_file` (MB/s and the server's VmHWM);
//! - `upload.rs`: a chunked `files/write` upload of the file (offset/final), size checked;
//! - `sftp.rs`: with `--compare-sftp`, OpenSSH's `sftp -D sftp-server` on the same file;
//! - `console/`: with `--only console`, the person's console on brokers of its own: how soon
//!   a prompt shows on the page, a paused root reaches the session and a request reaches the
//!   activity feed, and what an open page costs a large read;
//! - `integrity.rs`: with `--only integrity`, what the broker's SHA-256 costs: reads and
//!   uploads without and with it, in pairs, and `files/checksum` of the whole file.
//!
//! A run can take several chunk sizes (`--chunk-size 256KiB,1MiB,8MiB`): the reads run once
//! per size, in the order given, each followed by `sftp get`; the uploads likewise, each
//! followed by `sftp put` and `sftp put -f`. So every ratio compares with a reference measured
//! next to it in time, and one run gives every figure of the speed goals with its ratio.
//!
//! The broker's peak memory (VmHWM) is read from `/proc` after each phase. [`report`] prints
//! a table on stdout, or one JSON object with `--json`, ending with the speed goals the run
//! measured and whether each was met; progress bars go to stderr.
//!
//! This file holds the options and their checks; `run.rs` sets the run up (the workspace, the
//! policy, the broker) and builds the report from what `phases.rs` measured, phase by phase.
//! Beside those: `client.rs` runs the broker process and reads its answer lines, `wire.rs`
//! finds the parts of an answer without building JSON values, `fixture.rs` makes the files
//! and the workspace, `progress.rs` the progress bars, `codec.rs` the base64 engine.
//!
//! Requests use absolute paths, which any broker with those roots resolves, so the same run
//! can drive another build or another implementation (`--broker-cmd`).

// Ambient `std::fs` calls are allowed here (clippy.toml): the bench's own fixtures and the programs it compares, never a request path.
#![allow(clippy::disallowed_methods)]

mod client;
mod codec;
mod console;
mod fixture;
mod integrity;
mod list;
mod mcp;
mod phases;
mod progress;
mod read;
pub(crate) mod report;
mod run;
mod sftp;
mod small;
mod upload;
mod watch;
mod wire;

use std::path::PathBuf;

use clap::ValueEnum;

use self::fixture::Workspace;

/// The largest chunk a broker accepts (`max_chunk_size` is capped at 16 MiB).
pub(crate) const MAX_CHUNK: u64 = 16 << 20;

/// How chunks travel: asked for on reads, used for uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Encoding {
    /// Standard base64 (the file made by the bench is random bytes).
    Base64,
    /// JSON text (the file made by the bench is then random ASCII text with newlines).
    #[value(name = "utf-8", alias = "utf8")]
    Utf8,
}

impl Encoding {
    /// The name on the wire.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Encoding::Base64 => "base64",
            Encoding::Utf8 => "utf-8",
        }
    }
}

/// A part of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Phase {
    /// Chunked reads (and sftp get).
    Read,
    /// Chunked upload (and sftp put).
    Upload,
    /// 1 KiB reads and lists.
    Small,
    /// Other MCP servers (`--compare-mcp`); runs by default when that is given.
    Mcp,
    /// Change → notification latency of `files/watch`.
    Watch,
    /// A recursive `files/list` of a large tree, against `find`.
    List,
    /// The person's console: prompt, revoke and feed latency, and reads with a page open
    /// (brokers of its own; only when named).
    Console,
    /// What the integrity extension costs: reads and uploads without and with `sha256`, and
    /// `files/checksum` of the whole file (only when named).
    Integrity,
}

/// The `--compare-mcp` options, part of `fsbroker bench`'s command line.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct McpArgs {
    /// Also measure another MCP filesystem server (repeatable): a shell command starting a
    /// stdio MCP server. {dir} becomes the directory it may read (shell-quoted; appended as
    /// the last argument when absent). Timed: 1 KiB read_text_file calls, one at a time, as
    /// many as --small-ops (compared with fsbroker's sequential 1 KiB reads), and one
    /// read_media_file of an --mcp-size file (MB/s and the server's peak memory).
    ///
    /// Example: --compare-mcp 'rust-mcp-filesystem {dir}'
    #[arg(long, value_name = "COMMAND")]
    pub compare_mcp: Vec<String>,
    /// Size of the file the other MCP servers read with read_media_file.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "64MiB")]
    pub mcp_size: u64,
}

/// What to measure, resolved from the command line.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// An existing file to read (and upload a copy of); else one is made.
    pub file: Option<PathBuf>,
    /// Size of the file the bench makes.
    pub size: u64,
    /// Bytes per read or upload request: the reads and the upload run once per size, in this
    /// order (no duplicates).
    pub chunk_sizes: Vec<u64>,
    /// Encoding of reads and uploads.
    pub encoding: Encoding,
    /// Read (and upload) requests in flight.
    pub depth: usize,
    /// Small operations per kind and mode.
    pub small_ops: usize,
    /// Requests in flight in the pipelined small-operation runs.
    pub small_depth: usize,
    /// Check every byte read (sha256) and the uploaded file's sha256.
    pub verify: bool,
    /// One JSON object on stdout instead of the table.
    pub json: bool,
    /// Also run OpenSSH's sftp against sftp-server on the same file.
    pub compare_sftp: bool,
    /// Start this shell command instead of `fsbroker serve --policy FILE`.
    pub broker_cmd: Option<String>,
    /// Phases to run (empty: all but `console`; `mcp` only with `--compare-mcp`).
    pub only: Vec<Phase>,
    /// Changes timed by the watch phase; the console phase times a tenth as many of each of
    /// its latencies (at least [`console::MIN_SAMPLES`]).
    pub watch_samples: usize,
    /// Entries of the tree the list phase lists.
    pub list_entries: usize,
    /// Other MCP servers to measure.
    pub mcp: McpArgs,
}

impl Options {
    fn runs(&self, phase: Phase) -> bool {
        if self.only.is_empty() {
            // The console phase starts brokers of its own and reads the file six more times,
            // the integrity phase reads and uploads it eight times each: they run when asked
            // for.
            match phase {
                Phase::Mcp => !self.mcp.compare_mcp.is_empty(),
                Phase::Console | Phase::Integrity => false,
                _ => true,
            }
        } else {
            self.only.contains(&phase)
        }
    }

    /// Whether the other MCP servers are all this run measures.
    fn only_mcp(&self) -> bool {
        [
            Phase::Read,
            Phase::Upload,
            Phase::Small,
            Phase::Watch,
            Phase::List,
            Phase::Console,
            Phase::Integrity,
        ]
        .iter()
        .all(|&p| !self.runs(p))
    }
}

/// Runs the bench; returns its report (a table, or JSON with `--json`) for the command line to
/// print, or why it could not run. Whether every check passed is in the report.
pub(crate) fn main(opts: Options) -> Result<String, String> {
    validate(&opts)?;
    let ws = Workspace::create()
        .map_err(|e| format!("cannot make a workspace in the temp directory: {e}"))?;
    fixture::remove_on_interrupt(ws.path());
    let result = run::run(&opts, &ws);
    drop(ws);
    let report = result?;
    Ok(if opts.json {
        report.json()
    } else {
        report.table()
    })
}

fn validate(opts: &Options) -> Result<(), String> {
    if opts.chunk_sizes.is_empty() {
        return Err("--chunk-size needs at least one size".into());
    }
    if let Some(bad) = opts.chunk_sizes.iter().find(|&&c| c == 0 || c > MAX_CHUNK) {
        return Err(format!(
            "--chunk-size must be between 1 byte and 16MiB (a broker's largest chunk), not {bad}"
        ));
    }
    if opts.depth == 0 || opts.small_depth == 0 {
        return Err("--depth and --small-depth must be at least 1".into());
    }
    if (opts.runs(Phase::Small) || opts.runs(Phase::Mcp)) && opts.small_ops == 0 {
        return Err("--small-ops must be at least 1".into());
    }
    if opts.runs(Phase::Mcp) && opts.mcp.compare_mcp.is_empty() {
        return Err("--only mcp needs at least one --compare-mcp COMMAND".into());
    }
    if !opts.runs(Phase::Mcp) && !opts.mcp.compare_mcp.is_empty() {
        return Err("--compare-mcp needs the mcp phase: add mcp to --only".into());
    }
    if opts.mcp.compare_mcp.iter().any(|c| c.trim().is_empty()) {
        return Err("--compare-mcp needs a command".into());
    }
    if opts.runs(Phase::Mcp) && opts.mcp.mcp_size == 0 {
        return Err("--mcp-size must be at least 1 byte".into());
    }
    Ok(())
}

/// Parses a size: a number of bytes with an optional unit — `K`/`KiB`, `M`/`MiB`, `G`/`GiB`
/// (powers of 1024) or `kB`/`MB`/`GB` (powers of 1000), case-insensitive, e.g. `1GiB`, `8M`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use B, KiB, MiB, GiB, kB, MB or GB)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 1GiB, 8MiB, 4096)"))?;
    let bytes = value * factor as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("8m"), Ok(8 << 20));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert!(parse_size("1.1B").is_err());
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }
}

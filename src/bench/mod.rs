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
//! - `mcp.rs`: with `--compare-mcp`, other MCP filesystem servers (each its own process):
//!   1 KiB `read_text_file` calls measured like fsbroker's sequential small reads, and one
//!   large `read_media_file` (MB/s and the server's VmHWM);
//! - `upload.rs`: a chunked `files/write` upload of the file (offset/final), size checked;
//! - `sftp.rs`: with `--compare-sftp`, OpenSSH's `sftp -D sftp-server` on the same file.
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
//! Beside those: `client.rs` runs the broker process and reads its answer lines, `wire.rs`
//! finds the parts of an answer without building JSON values, `fixture.rs` makes the files
//! and the workspace, `progress.rs` the progress bars.
//!
//! Requests use absolute paths, which any broker with those roots resolves, so the same run
//! can drive another build or another implementation (`--broker-cmd`).

// Ambient `std::fs` calls are allowed here (clippy.toml): the bench's own fixtures and the programs it compares, never a request path.
#![allow(clippy::disallowed_methods)]

mod client;
mod codec;
mod fixture;
mod list;
mod mcp;
mod progress;
mod read;
pub(crate) mod report;
mod sftp;
mod small;
mod upload;
mod watch;
mod wire;

use std::path::{Path, PathBuf};

use clap::ValueEnum;

use self::client::{Broker, Launch};
use self::fixture::Workspace;
use self::report::{Memory, Report, Settings, TestFile};

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
    /// Phases to run (empty: all; `mcp` only with `--compare-mcp`).
    pub only: Vec<Phase>,
    /// Changes timed by the watch phase.
    pub watch_samples: usize,
    /// Entries of the tree the list phase lists.
    pub list_entries: usize,
    /// Other MCP servers to measure.
    pub mcp: McpArgs,
}

impl Options {
    fn runs(&self, phase: Phase) -> bool {
        if self.only.is_empty() {
            phase != Phase::Mcp || !self.mcp.compare_mcp.is_empty()
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
    let result = run(&opts, &ws);
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

/// Where things are, for the phases.
struct Layout {
    /// The file read and uploaded (absolute, canonical).
    file: PathBuf,
    /// Its size.
    size: u64,
    /// Its sha256, when `--verify`.
    sha256: Option<[u8; 32]>,
    /// The read-write root.
    scratch: PathBuf,
    /// The small files, in the order their content is in `small`.
    small_dir: PathBuf,
    small: Vec<(PathBuf, Vec<u8>)>,
    /// The directory the other MCP servers may read (`{dir}`), and the workspace (their logs).
    mcp_dir: PathBuf,
    workspace: PathBuf,
}

fn run(opts: &Options, ws: &Workspace) -> Result<Report, String> {
    let bars = progress::Bars::new();
    let data_dir;
    let (file, generated) = match &opts.file {
        Some(f) => {
            let f = std::fs::canonicalize(f)
                .map_err(|e| format!("cannot open {}: {e}", f.display()))?;
            data_dir = f
                .parent()
                .ok_or_else(|| format!("{} has no parent directory", f.display()))?
                .to_path_buf();
            (f, false)
        }
        None => {
            data_dir = ws.path().join("data");
            std::fs::create_dir(&data_dir).map_err(|e| format!("cannot make {data_dir:?}: {e}"))?;
            (data_dir.join("bench.bin"), true)
        }
    };
    let mut sha256 = None;
    // Small operations alone need no test file.
    let needs_file = opts.runs(Phase::Read) || opts.runs(Phase::Upload);
    let size = if !needs_file {
        0
    } else if generated {
        let bar = bars.bytes("making the test file", opts.size);
        sha256 = fixture::write_random(&file, opts.size, opts.encoding, opts.verify, &bar)
            .map_err(|e| format!("cannot write the test file {}: {e}", file.display()))?;
        bar.finish_and_clear();
        opts.size
    } else {
        let meta = std::fs::metadata(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", file.display()));
        }
        if opts.verify {
            let bar = bars.bytes("hashing the test file", meta.len());
            sha256 = Some(
                fixture::sha256_file(&file, &bar)
                    .map_err(|e| format!("cannot read {}: {e}", file.display()))?,
            );
            bar.finish_and_clear();
        }
        meta.len()
    };
    let scratch = ws.path().join("scratch");
    let small_dir = scratch.join("small");
    std::fs::create_dir_all(&small_dir).map_err(|e| format!("cannot make {small_dir:?}: {e}"))?;
    let small = fixture::write_small_files(&small_dir)
        .map_err(|e| format!("cannot write the small files: {e}"))?;
    // The test file's directory when the bench made it; with --file, a directory of the
    // workspace (the bench writes no files next to the user's).
    let mcp_dir = ws.path().join("data");
    if opts.runs(Phase::Mcp) {
        std::fs::create_dir_all(&mcp_dir).map_err(|e| format!("cannot make {mcp_dir:?}: {e}"))?;
    }
    let layout = Layout {
        file,
        size,
        sha256,
        scratch,
        small_dir,
        small,
        mcp_dir,
        workspace: ws.path().to_path_buf(),
    };

    let policy = ws.path().join("policy.toml");
    write_policy(&policy, &data_dir, &layout.scratch, opts, size)?;
    let launch = match &opts.broker_cmd {
        Some(cmd) => Launch::shell(cmd, &policy, &data_dir, &layout.scratch),
        None => Launch::own(&policy)?,
    };
    let mut broker = Broker::start(&launch, &ws.path().join("broker.log"))?;
    let result = phases(opts, &layout, &mut broker, &bars);
    let peak = broker.peak_memory();
    let exit = broker.finish();
    let Measured {
        transfers,
        small,
        watch,
        list,
        mcp,
        mut memory,
        sftp,
    } = result?;
    memory.peak_bytes = peak;
    memory.exit = exit;
    if let Some(servers) = &mcp {
        // A failing server is reported and the run goes on, unless it was all there was.
        if opts.only_mcp() && servers.iter().all(|s| s.error.is_some()) {
            let errors: Vec<String> = servers
                .iter()
                .map(|s| format!("{}: {}", s.command, s.error.as_deref().unwrap_or("")))
                .collect();
            return Err(format!(
                "no MCP server could be measured:\n{}",
                errors.join("\n")
            ));
        }
    }
    let mut report = Report {
        broker: launch.describe(),
        file: needs_file.then(|| TestFile {
            path: layout.file.display().to_string(),
            size: layout.size,
            generated,
        }),
        settings: Settings {
            chunk_sizes: opts.chunk_sizes.clone(),
            encoding: opts.encoding.name(),
            depth: opts.depth,
            small_ops: opts.small_ops,
            small_depth: opts.small_depth,
            verify: if opts.verify { "sha256" } else { "sampled" },
            mcp_size: opts.runs(Phase::Mcp).then_some(opts.mcp.mcp_size),
        },
        transfers,
        small,
        watch,
        list,
        memory,
        sftp,
        mcp,
        goals: Vec::new(),
    };
    report.goals = report::goals(&report);
    Ok(report)
}

/// What the phases measured.
struct Measured {
    transfers: Vec<report::Transfer>,
    small: Option<report::Small>,
    watch: Option<report::Watch>,
    list: Option<report::List>,
    mcp: Option<Vec<report::McpServer>>,
    memory: Memory,
    sftp: Option<report::Sftp>,
}

/// The phases, in an order that keeps them from disturbing each other: reads first (the file
/// is in the page cache), then small operations, watch and list, then the other MCP servers
/// (the broker idles), then uploads (whose written-back pages could slow what follows). Reads
/// and uploads run once per chunk size, each followed by sftp's, so a ratio compares two runs
/// next to each other in time.
fn phases(
    opts: &Options,
    layout: &Layout,
    broker: &mut Broker,
    bars: &progress::Bars,
) -> Result<Measured, String> {
    let mut memory = Memory {
        idle_bytes: broker.peak_memory(),
        ..Memory::default()
    };
    let sftp_tool = opts.compare_sftp.then(sftp::find);
    let sftp_report = sftp_tool.as_ref().map(sftp::report);
    let sftp = match &sftp_tool {
        Some(sftp::Tool::Found(tool)) => Some(tool),
        _ => None,
    };
    let mut transfers: Vec<report::Transfer> = if opts.runs(Phase::Read) || opts.runs(Phase::Upload)
    {
        opts.chunk_sizes
            .iter()
            .map(|&c| report::Transfer::new(c))
            .collect()
    } else {
        Vec::new()
    };

    if opts.runs(Phase::Read) {
        for transfer in &mut transfers {
            transfer.read = Some(read::run(
                broker,
                &read::Spec {
                    file: &layout.file,
                    size: layout.size,
                    chunk: transfer.chunk_size as usize,
                    depth: opts.depth,
                    encoding: opts.encoding,
                    sha256: layout.sha256,
                },
                bars,
            )?);
            if let Some(tool) = sftp {
                transfer.sftp_get = Some(sftp::get(tool, &layout.file, layout.size, bars)?);
            }
        }
        memory.after_read_bytes = broker.peak_memory();
    }

    let mut small_report = None;
    if opts.runs(Phase::Small) {
        small_report = Some(small::run(
            broker,
            &small::Spec {
                dir: &layout.small_dir,
                files: &layout.small,
                encoding: opts.encoding,
                ops: opts.small_ops,
                depth: opts.small_depth,
            },
            bars,
        )?);
        memory.after_small_bytes = broker.peak_memory();
    }

    let mut watch_report = None;
    if opts.runs(Phase::Watch) {
        let dir = layout.scratch.join("watched");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {dir:?}: {e}"))?;
        watch_report = Some(watch::run(
            broker,
            &watch::Spec {
                dir: &dir,
                samples: opts.watch_samples,
            },
            bars,
        )?);
    }

    let mut list_report = None;
    if opts.runs(Phase::List) {
        let dir = layout.scratch.join("tree");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {dir:?}: {e}"))?;
        list_report = Some(list::run(
            broker,
            &list::Spec {
                dir: &dir,
                entries: opts.list_entries,
            },
            bars,
        )?);
        // The tree is large; the upload that follows should not find it in its way.
        let _ = std::fs::remove_dir_all(&dir);
    }

    let mut mcp_report = None;
    if opts.runs(Phase::Mcp) {
        let mut servers = mcp::run(
            &mcp::Spec {
                commands: &opts.mcp.compare_mcp,
                dir: &layout.mcp_dir,
                small: &layout.small,
                ops: opts.small_ops,
                size: opts.mcp.mcp_size,
                logs: &layout.workspace,
            },
            bars,
        )?;
        if let Some(small) = &small_report {
            for server in &mut servers {
                server.set_ratio(small);
            }
        }
        mcp_report = Some(servers);
    }

    if opts.runs(Phase::Upload) {
        let target = layout.scratch.join("upload.bin");
        let sftp_target = layout.scratch.join("sftp-upload.bin");
        for transfer in &mut transfers {
            settle(&layout.scratch, layout.size);
            transfer.upload = Some(upload::run(
                broker,
                &upload::Spec {
                    source: &layout.file,
                    size: layout.size,
                    target: &target,
                    chunk: transfer.chunk_size as usize,
                    depth: opts.depth,
                    encoding: opts.encoding,
                    sha256: layout.sha256,
                },
                bars,
            )?);
            if let Some(tool) = sftp {
                settle(&layout.scratch, layout.size);
                transfer.sftp_put = Some(sftp::put(
                    tool,
                    &layout.file,
                    &sftp_target,
                    layout.size,
                    false,
                    bars,
                )?);
                settle(&layout.scratch, layout.size);
                transfer.sftp_put_fsync = Some(sftp::put(
                    tool,
                    &layout.file,
                    &sftp_target,
                    layout.size,
                    true,
                    bars,
                )?);
            }
        }
        memory.after_upload_bytes = broker.peak_memory();
    }
    for transfer in &mut transfers {
        transfer.ratios();
    }
    Ok(Measured {
        transfers,
        small: small_report,
        watch: watch_report,
        list: list_report,
        mcp: mcp_report,
        memory,
        sftp: sftp_report,
    })
}

/// Two roots and no rate limits; chunks up to the broker's maximum.
fn write_policy(
    path: &Path,
    data: &Path,
    scratch: &Path,
    opts: &Options,
    size: u64,
) -> Result<(), String> {
    let quote = |p: &Path| -> Result<String, String> {
        let s = p
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", p.display()))?;
        Ok(toml::Value::String(s.to_owned()).to_string())
    };
    let in_flight = opts.depth.max(opts.small_depth).max(64);
    // Only the default for requests without a length; the bench's all give one.
    let default_chunk = opts.chunk_sizes.iter().copied().max().unwrap_or(MAX_CHUNK);
    let text = format!(
        "# Written by fsbroker bench.\n\
         [[root]]\npath = {}\nname = \"data\"\nmode = \"read-only\"\nconsent = \"auto\"\n\n\
         [[root]]\npath = {}\nname = \"scratch\"\nmode = \"read-write\"\nconsent = \"auto\"\n\n\
         [limits]\nchunk_size = {}\nmax_chunk_size = {MAX_CHUNK}\nmax_file_size = {}\n\
         timeout_ms = 600000\nrequests_per_second = 0\nbytes_per_second = 0\n\
         max_in_flight = {in_flight}\n",
        quote(data)?,
        quote(scratch)?,
        default_chunk,
        size.max(1 << 30),
    );
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Puts every upload on the same footing before it is timed: no dirty pages left waiting for
/// the disk (the one before it, or making the test file, would otherwise throttle it), and
/// page-cache memory already in use once. On virtual machines whose free memory goes back to
/// the host, the first `size` bytes written after a pause run several times slower than the
/// next (seen here: 400 MB/s, then 3.7 GB/s, for the same 1 GiB written twice); whichever
/// upload came first would pay for that. So `size` bytes are written to a scratch file and
/// removed, untimed, then everything is synced.
fn settle(dir: &std::path::Path, size: u64) {
    let path = dir.join(".settle");
    let block = vec![0x5au8; 8 << 20];
    if let Ok(mut f) = std::fs::File::create(&path) {
        let mut left = size;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            if std::io::Write::write_all(&mut f, &block[..n]).is_err() {
                break;
            }
            left -= n as u64;
        }
    }
    let _ = std::fs::remove_file(&path);
    rustix::fs::sync();
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

//! A run set up and reported: the test file and the small files made (or `--file` taken),
//! the policy written, the broker started, the phases run on it (`phases.rs`), the broker
//! stopped, and the report with its goals.

use std::path::Path;

use super::client::{Broker, Launch};
use super::fixture::{self, Workspace};
use super::phases::{Layout, Measured, phases};
use super::report::{self, Report, Settings, TestFile};
use super::{MAX_CHUNK, Options, Phase, progress};

/// Runs the bench in `ws`: its report, or why it could not run.
pub(super) fn run(opts: &Options, ws: &Workspace) -> Result<Report, String> {
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
    // Small operations alone need no test file; the console and integrity phases read it.
    let needs_file = opts.runs(Phase::Read)
        || opts.runs(Phase::Upload)
        || opts.runs(Phase::Console)
        || opts.runs(Phase::Integrity);
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
    let result = phases(opts, &layout, &mut broker, &launch, &bars);
    let peak = broker.peak_memory();
    let exit = broker.finish();
    let Measured {
        transfers,
        small,
        watch,
        list,
        console,
        integrity,
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
            sha256_engine: opts.verify.then(fsbroker::sha256_engine),
            mcp_size: opts.runs(Phase::Mcp).then_some(opts.mcp.mcp_size),
        },
        transfers,
        small,
        watch,
        list,
        console,
        integrity,
        memory,
        sftp,
        mcp,
        goals: Vec::new(),
    };
    report.goals = report::goals(&report);
    Ok(report)
}

/// Two roots and no rate limits; chunks up to the broker's maximum.
fn write_policy(
    path: &Path,
    data: &Path,
    scratch: &Path,
    opts: &Options,
    size: u64,
) -> Result<(), String> {
    let quote = toml_path;
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

/// `p` as a TOML string, for a policy.
pub(super) fn toml_path(p: &Path) -> Result<String, String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))?;
    Ok(toml::Value::String(s.to_owned()).to_string())
}

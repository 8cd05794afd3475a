//! The phases, in order, on one broker: what each measures is in its own file (`read.rs`,
//! `small.rs`, `watch.rs`, `list.rs`, `console/`, `mcp/`, `upload.rs`, `sftp.rs`); here is the
//! order that keeps them from disturbing each other, and the broker's memory after each. (The
//! console phase starts brokers of its own, the same way this one was started.)

use std::path::PathBuf;

use super::client::{Broker, Launch};
use super::report::{self, Memory};
use super::{
    MAX_CHUNK, Options, Phase, console, integrity, list, mcp, progress, read, sftp, small, upload,
    watch,
};

/// Where things are, for the phases.
pub(super) struct Layout {
    /// The file read and uploaded (absolute, canonical).
    pub(super) file: PathBuf,
    /// Its size.
    pub(super) size: u64,
    /// Its sha256, when `--verify`.
    pub(super) sha256: Option<[u8; 32]>,
    /// The read-write root.
    pub(super) scratch: PathBuf,
    /// The small files, in the order their content is in `small`.
    pub(super) small_dir: PathBuf,
    pub(super) small: Vec<(PathBuf, Vec<u8>)>,
    /// The directory the other MCP servers may read (`{dir}`), and the workspace (their logs).
    pub(super) mcp_dir: PathBuf,
    pub(super) workspace: PathBuf,
}

/// What the phases measured.
pub(super) struct Measured {
    pub(super) transfers: Vec<report::Transfer>,
    pub(super) small: Option<report::Small>,
    pub(super) watch: Option<report::Watch>,
    pub(super) list: Option<report::List>,
    pub(super) console: Option<report::Console>,
    pub(super) integrity: Option<report::Integrity>,
    pub(super) mcp: Option<Vec<report::McpServer>>,
    pub(super) memory: Memory,
    pub(super) sftp: Option<report::Sftp>,
}

/// The phases, in an order that keeps them from disturbing each other: reads first (the file
/// is in the page cache), then small operations, watch and list, then the console (brokers of
/// its own, reading the file while it is still cached) and the other MCP servers (the broker
/// idles for both), then uploads (whose written-back pages could slow what follows). Reads
/// and uploads run once per chunk size, each followed by sftp's, so a ratio compares two runs
/// next to each other in time. `launch` is how `broker` was started.
pub(super) fn phases(
    opts: &Options,
    layout: &Layout,
    broker: &mut Broker,
    launch: &Launch,
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
                    chunk_sha256: None,
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

    let mut console_report = None;
    if opts.runs(Phase::Console) {
        console_report = Some(console::run(
            &console::Spec {
                workspace: &layout.workspace,
                broker_cmd: opts.broker_cmd.as_deref(),
                launch,
                samples: (opts.watch_samples / 10).max(console::MIN_SAMPLES),
                read: read::Spec {
                    file: &layout.file,
                    size: layout.size,
                    chunk: opts.chunk_sizes.first().copied().unwrap_or(MAX_CHUNK) as usize,
                    depth: opts.depth,
                    encoding: opts.encoding,
                    sha256: layout.sha256,
                    chunk_sha256: None,
                },
            },
            bars,
        )?);
    }

    let mut integrity_report = None;
    if opts.runs(Phase::Integrity) {
        integrity_report = Some(integrity::run(
            broker,
            &integrity::Spec {
                file: &layout.file,
                size: layout.size,
                chunk: opts.chunk_sizes.first().copied().unwrap_or(MAX_CHUNK) as usize,
                depth: opts.depth,
                scratch: &layout.scratch,
            },
            bars,
        )?);
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
        console: console_report,
        integrity: integrity_report,
        mcp: mcp_report,
        memory,
        sftp: sftp_report,
    })
}

/// Puts every upload on the same footing before it is timed: no dirty pages left waiting for
/// the disk (the one before it, or making the test file, would otherwise throttle it), and
/// page-cache memory already in use once. On virtual machines whose free memory goes back to
/// the host, the first `size` bytes written after a pause run several times slower than the
/// next (seen here: 400 MB/s, then 3.7 GB/s, for the same 1 GiB written twice); whichever
/// upload came first would pay for that. So `size` bytes are written to a scratch file and
/// removed, untimed, then everything is synced.
pub(super) fn settle(dir: &std::path::Path, size: u64) {
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

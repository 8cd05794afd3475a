//! `--compare-mcp`: other MCP filesystem servers, measured the way the small-operation phase
//! measures fsbroker.
//!
//! Each command runs as `sh -c 'exec COMMAND'` (so the server replaces the shell and its pid
//! is known), `{dir}` replaced by the directory the servers may read (shell-quoted; appended
//! as the last argument when the command has no `{dir}`), stdin and stdout on pipes (one
//! JSON-RPC message per line), stderr to a log in the workspace. Servers run one after
//! another; for each, the bench:
//!
//! 1. shakes hands: `initialize` (protocol [`PROTOCOL`], client `fsbroker-bench`, capability
//!    `roots`), `notifications/initialized`, `tools/list` (`read_text_file` must be there).
//!    Requests from the server are answered whenever they come — `roots/list` with the
//!    directory as a `file://` root, `ping`, anything else a -32601 error — so a server that
//!    asks does not stall;
//! 2. times 1 KiB reads: `tools/call read_text_file` (absolute paths) of copies of the small
//!    files, cycling over them, one call at a time: a warm-up, then `--small-ops` calls timed
//!    from the request written to its answer read, as `small.rs` times fsbroker's sequential
//!    reads. Every answer's text must equal the file's;
//! 3. times one `tools/call read_media_file` of a `--mcp-size` file of random bytes behind a
//!    PNG signature (servers that sniff the type, like rust-mcp-filesystem, refuse unknown
//!    data): request written to the whole answer read. The base64 is decoded and compared with
//!    the file. Then the server's peak memory: the largest VmHWM in its process tree, so a
//!    server started through a wrapper (`npx`) still counts.
//!
//! A server that cannot be started, fails the handshake, lacks a tool, answers wrongly, or
//! says nothing for [`SILENCE`] while an answer is due (it is then killed) gets an error in its
//! entry — with what it measured before that — and the next server runs. The files are
//! removed afterwards.
//!
//! This file holds the run and each server's session; `calls.rs` the requests timed and their
//! answers checked; `server.rs` the server's process, its pipes and its watchdog.

mod calls;
mod server;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::calls::{handshake, large_read, small_reads, tools};
use self::server::Server;
use super::fixture;
use super::progress::Bars;
use super::report::{McpServer, McpSmall};
use super::small::WARMUP;

/// The protocol version asked for.
pub(crate) const PROTOCOL: &str = "2025-06-18";

/// How long a server may say nothing while an answer is due before it is killed.
pub(crate) const SILENCE: Duration = Duration::from_secs(60);

/// The large file's first bytes.
const PNG_SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// What to run.
pub(crate) struct Spec<'a> {
    /// The commands, as given.
    pub commands: &'a [String],
    /// `{dir}`: where the files are made (absolute, canonical).
    pub dir: &'a Path,
    /// The small files' contents (their copies go in `dir`).
    pub small: &'a [(PathBuf, Vec<u8>)],
    /// Timed `read_text_file` calls.
    pub ops: usize,
    /// Size of the `read_media_file` file.
    pub size: u64,
    /// Where the servers' stderr logs go.
    pub logs: &'a Path,
}

/// Measures every server; an error here (the files cannot be made) ends the bench, a server's
/// own failure is in its entry.
pub(crate) fn run(spec: &Spec, bars: &Bars) -> Result<Vec<McpServer>, String> {
    let files = Files::make(spec, bars)?;
    let root = root_list(spec.dir)?;
    Ok(spec
        .commands
        .iter()
        .enumerate()
        .map(|(i, command)| {
            let log = spec.logs.join(format!("mcp-{i}.log"));
            measure(command, spec, &files, &root, &log, bars)
        })
        .collect())
}

/// `{dir}` becomes the directory, shell-quoted; a command without it gets it appended.
pub(crate) fn expand(command: &str, dir: &Path) -> String {
    let quoted = format!("'{}'", dir.display().to_string().replace('\'', r"'\''"));
    if command.contains("{dir}") {
        command.replace("{dir}", &quoted)
    } else {
        format!("{} {quoted}", command.trim_end())
    }
}

/// The file name of a command's program, to name a server that gives no name.
fn program_name(command: &str) -> String {
    let first = command
        .split_whitespace()
        .find(|w| !w.contains('=') && *w != "exec" && *w != "env")
        .unwrap_or(command)
        .trim_matches(|c| c == '\'' || c == '"');
    Path::new(first)
        .file_name()
        .map_or_else(|| first.to_owned(), |n| n.to_string_lossy().into_owned())
}

/// The result of `roots/list`: the directory as one `file://` root.
fn root_list(dir: &Path) -> Result<String, String> {
    let uri = url::Url::from_file_path(dir)
        .map_err(|()| format!("{} is not an absolute path", dir.display()))?;
    Ok(serde_json::json!({"roots": [{"uri": uri.as_str(), "name": "data"}]}).to_string())
}

/// The files the servers read, removed on drop.
struct Files {
    small_dir: PathBuf,
    /// Each small file's path as a JSON string, and its content.
    small: Vec<(String, Vec<u8>)>,
    large: PathBuf,
    large_json: String,
    size: u64,
}

impl Files {
    fn make(spec: &Spec, bars: &Bars) -> Result<Files, String> {
        let json = |p: &Path| {
            p.to_str()
                .ok_or_else(|| format!("{} is not UTF-8", p.display()))
                .and_then(|s| serde_json::to_string(s).map_err(|e| e.to_string()))
        };
        let small_dir = spec.dir.join("mcp-small");
        let large = spec.dir.join("mcp-large.png");
        let mut files = Files {
            small_dir: small_dir.clone(),
            small: Vec::with_capacity(spec.small.len()),
            large_json: json(&large)?,
            large,
            size: spec.size,
        };
        std::fs::create_dir(&small_dir).map_err(|e| format!("cannot make {small_dir:?}: {e}"))?;
        for (i, (_, content)) in spec.small.iter().enumerate() {
            let path = small_dir.join(format!("f{i:02}.txt"));
            std::fs::write(&path, content)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            files.small.push((json(&path)?, content.clone()));
        }
        if files.small.is_empty() {
            return Err("no small files to read".into());
        }
        let bar = bars.bytes("making the MCP file", spec.size);
        write_large(&files.large, spec.size, &bar)
            .map_err(|e| format!("cannot write {}: {e}", files.large.display()))?;
        bar.finish_and_clear();
        Ok(files)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.small_dir);
        let _ = std::fs::remove_file(&self.large);
    }
}

/// `size` random bytes starting with the PNG signature (written over the first bytes of the
/// bench's ordinary random file).
fn write_large(path: &Path, size: u64, bar: &indicatif::ProgressBar) -> io::Result<()> {
    fixture::write_random(path, size, super::Encoding::Base64, false, bar)?;
    let k = (size as usize).min(PNG_SIGNATURE.len());
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    std::os::unix::fs::FileExt::write_all_at(&file, &PNG_SIGNATURE[..k], 0)?;
    file.sync_all()
}

/// One server: its entry, with what it measured and what went wrong.
fn measure(
    command: &str,
    spec: &Spec,
    files: &Files,
    root: &str,
    log: &Path,
    bars: &Bars,
) -> McpServer {
    let mut entry = McpServer {
        name: program_name(command),
        command: command.to_owned(),
        launched: expand(command, spec.dir),
        ..McpServer::default()
    };
    let spinner = bars.spinner(&format!("starting {}", entry.name));
    let server = Server::start(&entry.launched, log, root);
    spinner.finish_and_clear();
    let outcome = server.and_then(|mut server| {
        let done = session(&mut server, &mut entry, spec, files, bars);
        done.map_err(|e| server.failed(&e))
    });
    if let Err(e) = outcome {
        entry.error = Some(e);
    }
    entry
}

/// Handshake, small reads, the large read.
fn session(
    server: &mut Server,
    entry: &mut McpServer,
    spec: &Spec,
    files: &Files,
    bars: &Bars,
) -> Result<(), String> {
    handshake(server, entry)?;
    let tools = tools(server)?;
    let has = |name: &str| tools.iter().any(|t| t == name);
    let missing = |name: &str| {
        format!(
            "it has no {name} tool (its tools: {})",
            if tools.is_empty() {
                "none".to_owned()
            } else {
                tools.join(", ")
            }
        )
    };
    if !has("read_text_file") {
        return Err(missing("read_text_file"));
    }
    let warmup = spec.ops.min(WARMUP);
    let bar = bars.ops(&format!("{} reads", entry.name), (warmup + spec.ops) as u64);
    small_reads(server, files, warmup, &bar)?;
    let timed = small_reads(server, files, spec.ops, &bar)?;
    bar.finish_and_clear();
    entry.small = Some(McpSmall::from(timed));
    if !has("read_media_file") {
        return Err(missing("read_media_file"));
    }
    let spinner = bars.spinner(&format!("{} read_media_file", entry.name));
    let large = large_read(server, files);
    spinner.finish_and_clear();
    entry.large = Some(large?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{expand, program_name};

    #[test]
    fn dir_is_replaced_or_appended_quoted() {
        let dir = Path::new("/tmp/it's here");
        assert_eq!(
            expand("srv --root {dir} -v", dir),
            r"srv --root '/tmp/it'\''s here' -v"
        );
        assert_eq!(
            expand("node s.mjs ", dir),
            r"node s.mjs '/tmp/it'\''s here'"
        );
    }

    #[test]
    fn names_from_commands() {
        assert_eq!(
            program_name("/tmp/rmfs/bin/rust-mcp-filesystem {dir}"),
            "rust-mcp-filesystem"
        );
        assert_eq!(program_name("RUST_LOG=x 'node' a.js"), "node");
    }
}

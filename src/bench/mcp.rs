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

use std::borrow::Cow;
use std::io::{self, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::client::Lines;
use super::fixture;
use super::progress::Bars;
use super::report::{McpLarge, McpServer, McpSmall, Ops, ServerInfo};
use super::small::WARMUP;
use super::wire;
use crate::bench::codec::BASE64;

/// The protocol version asked for.
pub(crate) const PROTOCOL: &str = "2025-06-18";

/// How long a server may say nothing while an answer is due before it is killed.
pub(crate) const SILENCE: Duration = Duration::from_secs(60);

/// How long a server may take to exit once its input is closed before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(5);

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

#[derive(Deserialize)]
struct InitResult {
    #[serde(rename = "protocolVersion")]
    protocol_version: Option<String>,
    #[serde(rename = "serverInfo")]
    server_info: Option<Info>,
}

#[derive(Deserialize)]
struct Info {
    name: Option<String>,
    version: Option<String>,
}

/// `initialize`, then `notifications/initialized`.
fn handshake(server: &mut Server, entry: &mut McpServer) -> Result<(), String> {
    let params = serde_json::json!({
        "protocolVersion": PROTOCOL,
        "capabilities": {"roots": {"listChanged": false}},
        "clientInfo": {"name": "fsbroker-bench", "version": env!("CARGO_PKG_VERSION")},
    });
    let id = server.request("initialize", &params.to_string())?;
    let (span, answer) = server.answer(id)?;
    let line = server.lines.line(span);
    let init: InitResult = result(line, &answer, "initialize")?;
    if let Some(info) = init.server_info {
        if let Some(name) = info.name.as_deref().filter(|n| !n.is_empty()) {
            entry.name = name.to_owned();
        }
        entry.server_info = Some(ServerInfo {
            name: info.name,
            version: info.version,
        });
    }
    entry.protocol_version = init.protocol_version;
    server.send("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}")
}

#[derive(Deserialize)]
struct ToolsPage {
    #[serde(default)]
    tools: Vec<Tool>,
    #[serde(rename = "nextCursor")]
    next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct Tool {
    name: String,
}

/// The names of the server's tools (every page of `tools/list`).
fn tools(server: &mut Server) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let params = match &cursor {
            Some(c) => serde_json::json!({ "cursor": c }),
            None => serde_json::json!({}),
        };
        let id = server.request("tools/list", &params.to_string())?;
        let (span, answer) = server.answer(id)?;
        let page: ToolsPage = result(server.lines.line(span), &answer, "tools/list")?;
        names.extend(page.tools.into_iter().map(|t| t.name));
        cursor = page.next_cursor.filter(|c| !c.is_empty());
        if cursor.is_none() {
            return Ok(names);
        }
    }
    Err("tools/list: more than 100 pages".into())
}

/// `n` sequential `read_text_file` calls, each checked: timed as in `small.rs`.
fn small_reads(
    server: &mut Server,
    files: &Files,
    n: usize,
    bar: &indicatif::ProgressBar,
) -> Result<Ops, String> {
    let mut latency = Vec::with_capacity(n);
    let started = Instant::now();
    for k in 0..n {
        let (path, want) = &files.small[k % files.small.len()];
        let id = server.call("read_text_file", path)?;
        let sent = Instant::now();
        let (span, answer) = server.answer(id)?;
        latency.push(sent.elapsed());
        let what = || format!("read_text_file {path}");
        let r: ToolResult = tool_result(server.lines.line(span), &answer, &what)?;
        match r.content.iter().find_map(|b| b.text.as_deref()) {
            Some(text) if text.as_bytes() == want.as_slice() => {}
            Some(text) => {
                return Err(format!(
                    "{}: the text differs from the file ({} bytes where {} were due: {})",
                    what(),
                    text.len(),
                    want.len(),
                    wire::preview(text.as_bytes())
                ));
            }
            None => return Err(format!("{}: no text content in the answer", what())),
        }
        if k % 64 == 63 {
            bar.inc(64);
        }
    }
    let elapsed = started.elapsed();
    bar.inc((n % 64) as u64);
    latency.sort_unstable();
    Ok(Ops::new(n as u64, elapsed, &latency))
}

/// One `read_media_file` of the large file: timed, checked, and the server's peak memory.
fn large_read(server: &mut Server, files: &Files) -> Result<McpLarge, String> {
    // Room for the answer (twice the base64: some servers repeat it in structuredContent), so
    // the buffer does not grow while it is timed.
    let base64_len = files.size.div_ceil(3) * 4;
    server
        .lines
        .reserve(usize::try_from(2 * base64_len).unwrap_or(usize::MAX / 2));
    let id = server.call("read_media_file", &files.large_json)?;
    let sent = Instant::now();
    let (span, answer) = server.answer(id)?;
    // Until the whole line was read (not until it was scanned).
    let elapsed = server.line_read_at.saturating_duration_since(sent);
    let vm_hwm = process_tree(server.pid)
        .into_iter()
        .filter_map(vm_hwm)
        .max();
    let what = || format!("read_media_file {}", files.large_json);
    let r: ToolResult = tool_result(server.lines.line(span), &answer, &what)?;
    let blob = r
        .content
        .iter()
        .find_map(|b| {
            b.data
                .as_deref()
                .or_else(|| b.resource.as_ref().and_then(|r| r.blob.as_deref()))
        })
        .ok_or_else(|| format!("{}: no base64 data or blob in the answer", what()))?;
    let bytes = BASE64
        .decode(blob.as_bytes())
        .map_err(|e| format!("{}: the data is not base64 ({e})", what()))?;
    if bytes.len() as u64 != files.size {
        return Err(format!(
            "{}: {} bytes came back where {} were due",
            what(),
            bytes.len(),
            files.size
        ));
    }
    same_as_file(&bytes, &files.large).map_err(|e| format!("{}: {e}", what()))?;
    let seconds = elapsed.as_secs_f64().max(1e-9);
    Ok(McpLarge {
        bytes: files.size,
        seconds,
        mb_per_sec: files.size as f64 / seconds / 1e6,
        vm_hwm_mib: vm_hwm.map(|b| b as f64 / (1 << 20) as f64),
    })
}

/// Whether `bytes` is the file's content.
fn same_as_file(bytes: &[u8], path: &Path) -> Result<(), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot reopen it: {e}"))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0;
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("cannot reread it: {e}"))?;
        if n == 0 {
            return Ok(());
        }
        let want = &buf[..n];
        let got = bytes.get(at..at + n).unwrap_or_default();
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!(
                "the bytes differ from the file at byte {}",
                at + first
            ));
        }
        at += n;
    }
}

#[derive(Deserialize)]
struct ToolResult<'a> {
    #[serde(borrow, default)]
    content: Vec<Block<'a>>,
    #[serde(rename = "isError", default)]
    is_error: bool,
}

/// A content block: text, image or audio (`data`), or an embedded resource (`blob`).
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    resource: Option<Resource<'a>>,
}

#[derive(Deserialize)]
struct Resource<'a> {
    #[serde(borrow, default)]
    blob: Option<Cow<'a, str>>,
}

/// The result of a request, or what its error says.
fn result<'a, T: Deserialize<'a>>(
    line: &'a [u8],
    answer: &wire::Answer,
    what: &str,
) -> Result<T, String> {
    if let Some(e) = &answer.error {
        return Err(format!("{what}: {}", wire::error_text(&line[e.clone()])));
    }
    let result = &line[answer.result.clone().ok_or("no result")?];
    serde_json::from_slice(result)
        .map_err(|e| format!("{what}: a bad result ({e}): {}", wire::preview(result)))
}

/// A `tools/call` result, or what its error (or its `isError` content) says.
fn tool_result<'a>(
    line: &'a [u8],
    answer: &wire::Answer,
    what: &dyn Fn() -> String,
) -> Result<ToolResult<'a>, String> {
    let r: ToolResult = result(line, answer, &what())?;
    if r.is_error {
        let texts: Vec<&str> = r.content.iter().filter_map(|b| b.text.as_deref()).collect();
        return Err(format!("{}: the server says: {}", what(), texts.join(" ")));
    }
    Ok(r)
}

/// A running server.
struct Server {
    child: Child,
    pid: u32,
    /// Its stdin (taken to close it).
    out: Option<BufWriter<ChildStdin>>,
    lines: Lines<ChildStdout>,
    /// When the last line was read.
    line_read_at: Instant,
    /// Whether its output ended.
    closed: bool,
    next_id: u64,
    /// The answer to `roots/list`.
    root: String,
    log: PathBuf,
    watchdog: Watchdog,
}

impl Server {
    fn start(launched: &str, log: &Path, root: &str) -> Result<Server, String> {
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("cannot create {log:?}: {e}"))?;
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("exec {launched}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run /bin/sh: {e}"))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the server's pipes are missing".into());
        };
        Ok(Server {
            child,
            pid,
            out: Some(BufWriter::with_capacity(64 << 10, stdin)),
            lines: Lines::new(stdout),
            line_read_at: Instant::now(),
            closed: false,
            next_id: 0,
            root: root.to_owned(),
            log: log.to_path_buf(),
            watchdog: Watchdog::start(pid),
        })
    }

    fn out(&mut self) -> Result<&mut BufWriter<ChildStdin>, String> {
        self.out
            .as_mut()
            .ok_or_else(|| "the server's input is closed".into())
    }

    /// Writes one message (sent at the next wait for an answer).
    fn send(&mut self, message: &str) -> Result<(), String> {
        writeln!(self.out()?, "{message}").map_err(|e| format!("writing to the server: {e}"))
    }

    /// Writes a request; returns its id.
    fn request(&mut self, method: &str, params: &str) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(
            self.out()?,
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}"
        )
        .map_err(|e| format!("writing to the server: {e}"))?;
        Ok(id)
    }

    /// Writes a `tools/call` of `tool` with `{"path": path}` (`path` a JSON string).
    fn call(&mut self, tool: &str, path: &str) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(
            self.out()?,
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"{tool}\",\"arguments\":{{\"path\":{path}}}}}}}"
        )
        .map_err(|e| format!("writing to the server: {e}"))?;
        Ok(id)
    }

    /// The answer to request `id` (sends what is buffered first); the server's notifications
    /// are skipped and its requests answered on the way.
    fn answer(&mut self, id: u64) -> Result<(Range<usize>, wire::Answer), String> {
        loop {
            let Server {
                out,
                lines,
                watchdog,
                ..
            } = self;
            let next = lines.next(&mut || {
                if let Some(out) = out.as_mut() {
                    out.flush()?;
                }
                watchdog.arm();
                Ok(())
            });
            watchdog.disarm();
            self.line_read_at = Instant::now();
            let span = next.map_err(|e| {
                self.closed = true;
                match e.kind() {
                    io::ErrorKind::UnexpectedEof => "the server closed its output".to_owned(),
                    _ => format!("reading the server's output: {e}"),
                }
            })?;
            let line = self.lines.line(span.clone());
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let answer = wire::answer(line)?;
            if answer.is_notification() {
                self.server_message(span)?;
                continue;
            }
            if answer.id != Some(id) {
                return Err(format!(
                    "an answer to no request (request {id} is due): {}",
                    wire::preview(line)
                ));
            }
            return Ok((span, answer));
        }
    }

    /// A request or notification from the server: requests are answered.
    fn server_message(&mut self, span: Range<usize>) -> Result<(), String> {
        #[derive(Deserialize)]
        struct Message<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            #[serde(borrow)]
            method: Option<Cow<'a, str>>,
        }
        let Server {
            out, lines, root, ..
        } = self;
        let line = lines.line(span);
        let message: Message = serde_json::from_slice(line).map_err(|e| {
            format!(
                "a bad message from the server ({e}): {}",
                wire::preview(line)
            )
        })?;
        let (Some(id), Some(method)) = (message.id, message.method) else {
            return Ok(());
        };
        let reply = match method.as_ref() {
            "roots/list" => format!("\"result\":{root}"),
            "ping" => "\"result\":{}".to_owned(),
            other => format!(
                "\"error\":{{\"code\":-32601,\"message\":{}}}",
                serde_json::to_string(&format!("fsbroker bench does not answer {other}"))
                    .unwrap_or_else(|_| "\"method not found\"".into())
            ),
        };
        let out = out.as_mut().ok_or("the server's input is closed")?;
        writeln!(out, "{{\"jsonrpc\":\"2.0\",\"id\":{},{reply}}}", id.get())
            .map_err(|e| format!("writing to the server: {e}"))
    }

    /// An error message with how the server ended (if it did) and the end of its log.
    fn failed(&mut self, error: &str) -> String {
        let mut message = error.to_owned();
        if self.watchdog.fired() {
            message = format!(
                "the server said nothing for {} s while an answer was due; it was killed",
                SILENCE.as_secs()
            );
        } else if self.closed {
            // A server that closed its output is usually exiting.
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(status)) => {
                        message.push_str(&format!(" (it exited: {status})"));
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                    Err(_) => break,
                }
            }
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        if !tail.is_empty() {
            let lines: Vec<&str> = tail.into_iter().rev().collect();
            message.push_str(&format!(
                "\nthe server's stderr ends with:\n  {}",
                lines.join("\n  ")
            ));
        }
        message
    }
}

impl Drop for Server {
    /// Closes the server's input and waits for it to exit; kills what is left after
    /// [`EXIT_WAIT`].
    fn drop(&mut self) {
        drop(self.out.take());
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => {
                    kill_tree(self.pid);
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }
}

/// Kills a server that says nothing for [`SILENCE`] while an answer is due, so a stuck
/// server cannot stall the bench. Costs the measured path one clock read and two stores per
/// blocking read.
struct Watchdog {
    state: Arc<WatchState>,
    thread: Option<JoinHandle<()>>,
}

struct WatchState {
    origin: Instant,
    /// Milliseconds since `origin` (plus one) when a wait began; 0 when not waiting.
    armed: AtomicU64,
    stop: AtomicBool,
    fired: AtomicBool,
}

impl Watchdog {
    fn start(pid: u32) -> Watchdog {
        let state = Arc::new(WatchState {
            origin: Instant::now(),
            armed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });
        let watched = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("fsbroker-bench-watchdog".into())
            .spawn(move || {
                let limit = SILENCE.as_millis() as u64;
                while !watched.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(Duration::from_millis(250));
                    let armed = watched.armed.load(Ordering::Relaxed);
                    let now = watched.origin.elapsed().as_millis() as u64;
                    if armed != 0 && now > armed + limit {
                        watched.fired.store(true, Ordering::Relaxed);
                        kill_tree(pid);
                        return;
                    }
                }
            })
            .ok();
        Watchdog { state, thread }
    }

    fn arm(&self) {
        let now = self.state.origin.elapsed().as_millis() as u64;
        self.state.armed.store(now + 1, Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.state.armed.store(0, Ordering::Relaxed);
    }

    fn fired(&self) -> bool {
        self.state.fired.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// `pid` and its descendants (from `/proc/*/stat`).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((child, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|&&(c, p)| p == parent && !tree.contains(&c))
                .map(|&(c, _)| c)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    tree
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// SIGKILL to `pid` and its descendants.
fn kill_tree(pid: u32) {
    for p in process_tree(pid).into_iter().rev() {
        if let Some(p) = i32::try_from(p)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
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

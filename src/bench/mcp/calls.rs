//! The calls timed and the answers checked: the handshake, `tools/list`, the 1 KiB
//! `read_text_file` calls, the one large `read_media_file`, and the shapes of their results.

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use base64::Engine;
use serde::Deserialize;

use super::server::{Server, process_tree, vm_hwm};
use super::{Files, PROTOCOL};
use crate::bench::codec::BASE64;
use crate::bench::report::{McpLarge, McpServer, Ops, ServerInfo};
use crate::bench::wire;

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
pub(super) fn handshake(server: &mut Server, entry: &mut McpServer) -> Result<(), String> {
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
pub(super) fn tools(server: &mut Server) -> Result<Vec<String>, String> {
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
pub(super) fn small_reads(
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
pub(super) fn large_read(server: &mut Server, files: &Files) -> Result<McpLarge, String> {
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

//! Chunked upload throughput: the test file sent as `files/write` chunks with `offset`, the
//! last one `final`, which commits (the broker syncs and renames).
//!
//! The first chunk starts the upload and is answered before the rest go; after it, up to
//! `depth` chunks are in flight (the broker writes them in order). A second thread reads and
//! encodes the next chunks while the broker handles the current ones, so the time measured is
//! the broker's and the pipe's. The answers' `bytesWritten` and `size`, and the
//! committed file's size (and sha256 with `--verify`), are checked. With `--verify` the
//! upload also carries its sha256 (announced on the first chunk, given on the last), which
//! the broker checks before it commits.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::Encoding;
use super::client::Broker;
use super::fixture;
use super::progress::Bars;
use super::report::{self, Throughput};
use super::wire;

/// What to upload, and where.
pub(crate) struct Spec<'a> {
    pub source: &'a Path,
    pub size: u64,
    pub target: &'a Path,
    pub chunk: usize,
    /// Chunks in flight once the upload has started.
    pub depth: usize,
    pub encoding: Encoding,
    pub sha256: Option<[u8; 32]>,
}

/// A chunk's request line, ready to send.
struct Chunk {
    line: Vec<u8>,
    id: u64,
    offset: u64,
    len: u64,
    last: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Written {
    bytes_written: u64,
    size: u64,
}

/// Uploads the file once; returns the throughput. The uploaded file is removed.
pub(crate) fn run(broker: &mut Broker, spec: &Spec, bars: &Bars) -> Result<report::Upload, String> {
    let source = std::fs::File::open(spec.source)
        .map_err(|e| format!("cannot open {}: {e}", spec.source.display()))?;
    let target = spec
        .target
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", spec.target.display()))?;
    let target_json = serde_json::to_string(target).map_err(|e| e.to_string())?;
    let bar = bars.bytes("files/write", spec.size);
    let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<Chunk, String>>(spec.depth.max(1));
    let (spare_tx, spare_rx) = mpsc::channel::<Vec<u8>>();
    let mut out = report::Upload::default();
    let result = std::thread::scope(|scope| {
        scope.spawn(|| encode_chunks(&source, spec, &target_json, ready_tx, spare_rx));
        let mut started = None;
        let mut last_chunk = Duration::ZERO;
        let mut sent_bytes = 0;
        let mut in_flight: VecDeque<(Chunk, Instant)> = VecDeque::new();
        let mut chunks = ready_rx.into_iter();
        let mut first = true;
        loop {
            // The first chunk alone; then keep `depth` in flight.
            let room = if first { 1 } else { spec.depth.max(1) };
            while in_flight.len() < room {
                let Some(chunk) = chunks.next() else { break };
                let chunk = chunk?;
                let sent = Instant::now();
                started.get_or_insert(sent);
                broker
                    .requests
                    .write_all(&chunk.line)
                    .and_then(|()| broker.requests.flush())
                    .map_err(|e| broker.failed(&format!("sending to the broker: {e}")))?;
                in_flight.push_back((chunk, sent));
            }
            if in_flight.is_empty() {
                break;
            }
            first = false;
            // Chunks land in order, but their answers may overtake one another.
            let (span, answer) = broker.answer()?;
            let line = broker.answers.line(span);
            let at = in_flight
                .iter()
                .position(|(c, _)| Some(c.id) == answer.id)
                .ok_or_else(|| format!("an answer to no chunk: {}", wire::preview(line)))?;
            let Some((chunk, sent)) = in_flight.remove(at) else {
                break;
            };
            let written = check(line, &answer, &chunk).map_err(|e| {
                broker.failed(&format!("files/write at offset {}: {e}", chunk.offset))
            })?;
            if chunk.last {
                last_chunk = sent.elapsed();
            }
            sent_bytes = written.size;
            out.requests += 1;
            bar.inc(chunk.len);
            let _ = spare_tx.send(chunk.line);
        }
        let elapsed = started.map(|s| s.elapsed()).unwrap_or_default();
        Ok::<_, String>((sent_bytes, elapsed, last_chunk))
    });
    bar.finish_and_clear();
    let (bytes, elapsed, last_chunk) = result?;
    let landed = std::fs::metadata(spec.target)
        .map_err(|e| format!("the uploaded file {}: {e}", spec.target.display()))?
        .len();
    if bytes != spec.size || landed != spec.size {
        return Err(format!(
            "uploaded {bytes} bytes; the file has {landed}; {} were sent",
            spec.size
        ));
    }
    if let Some(expected) = spec.sha256 {
        let got = fixture::sha256_file(spec.target, &indicatif::ProgressBar::hidden())
            .map_err(|e| format!("cannot read the uploaded file: {e}"))?;
        if got != expected {
            return Err("the uploaded file's sha256 differs from the source's".into());
        }
    }
    std::fs::remove_file(spec.target)
        .map_err(|e| format!("cannot remove {}: {e}", spec.target.display()))?;
    out.throughput = Throughput::new(bytes, elapsed);
    out.last_chunk_seconds = last_chunk.as_secs_f64();
    Ok(out)
}

/// Checks a chunk's answer.
fn check(line: &[u8], answer: &wire::Answer, chunk: &Chunk) -> Result<Written, String> {
    if answer.id != Some(chunk.id) {
        return Err(format!(
            "an answer to another request: {}",
            wire::preview(line)
        ));
    }
    if let Some(e) = &answer.error {
        return Err(wire::error_text(&line[e.clone()]));
    }
    let result = answer.result.clone().ok_or("no result")?;
    let w: Written = serde_json::from_slice(&line[result])
        .map_err(|e| format!("a bad result ({e}): {}", wire::preview(line)))?;
    if w.bytes_written != chunk.len || w.size != chunk.offset + chunk.len {
        return Err(format!(
            "bytesWritten {} and size {} after a chunk of {} bytes at offset {}",
            w.bytes_written, w.size, chunk.len, chunk.offset
        ));
    }
    Ok(w)
}

/// Reads the source chunk by chunk and builds each request line (reusing the buffers that
/// come back on `spare`).
fn encode_chunks(
    source: &std::fs::File,
    spec: &Spec,
    target: &str,
    ready: mpsc::SyncSender<Result<Chunk, String>>,
    spare: mpsc::Receiver<Vec<u8>>,
) {
    let mut data = vec![0u8; spec.chunk];
    let mut offset = 0u64;
    let mut id = UPLOAD_IDS;
    loop {
        let len = (spec.chunk as u64).min(spec.size - offset) as usize;
        let last = offset + len as u64 >= spec.size;
        let chunk = source
            .read_exact_at(&mut data[..len], offset)
            .map_err(|e| format!("cannot read the test file: {e}"))
            .map(|()| {
                let mut line = spare.try_recv().unwrap_or_default();
                line.clear();
                id += 1;
                request(
                    &mut line,
                    Piece {
                        id,
                        target,
                        offset,
                        last,
                        data: &data[..len],
                        encoding: spec.encoding,
                        sha256: spec.sha256.as_ref(),
                    },
                );
                Chunk {
                    line,
                    id,
                    offset,
                    len: len as u64,
                    last,
                }
            });
        let failed = chunk.is_err();
        if ready.send(chunk).is_err() || failed || last {
            return;
        }
        offset += len as u64;
    }
}

/// One chunk's request, as [`request`] writes it.
struct Piece<'a> {
    id: u64,
    target: &'a str,
    offset: u64,
    last: bool,
    data: &'a [u8],
    encoding: Encoding,
    /// The whole upload's sha256 (`--verify`): announced on the first chunk, given on the
    /// last, for the broker to check before it commits (the integrity extension).
    sha256: Option<&'a [u8; 32]>,
}

/// A `files/write` request line.
fn request(line: &mut Vec<u8>, p: Piece<'_>) {
    // Text that is not UTF-8 (a chunk of a binary file, or one cut inside a character) goes
    // as base64.
    let text = match p.encoding {
        Encoding::Utf8 => std::str::from_utf8(p.data).ok(),
        Encoding::Base64 => None,
    };
    let check = match p.sha256 {
        Some(hash) if p.last => format!(",\"sha256\":\"{}\"", super::read::hex(hash)),
        Some(_) if p.offset == 0 => ",\"sha256\":true".to_owned(),
        _ => String::new(),
    };
    let _ = write!(
        line,
        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"files/write\",\"params\":{{\"path\":{},\"offset\":{},\"final\":{}{check},\"encoding\":\"{}\",\"content\":",
        p.id,
        p.target,
        p.offset,
        p.last,
        if text.is_some() { "utf-8" } else { "base64" }
    );
    match text {
        Some(t) => {
            let _ = serde_json::to_writer(&mut *line, t);
        }
        None => {
            line.push(b'"');
            crate::bench::codec::base64_into(p.data, line);
            line.push(b'"');
        }
    }
    line.extend_from_slice(b"}}\n");
}

/// Upload requests are numbered from here, apart from the session's other requests (the
/// encoder runs ahead of the requests the main thread numbers).
const UPLOAD_IDS: u64 = 1 << 40;

//! Chunked read throughput: `files/read` over the whole file, `depth` requests in flight.
//!
//! Every answer is checked: its offset, the file size, the chunk's length (from the encoded
//! length, without decoding), and three 48-byte windows decoded and compared with the file
//! (start, middle, end of the chunk). With `--verify` every chunk is decoded and the whole
//! file's sha256 compared; the broker is asked for each chunk's sha256 too (the integrity
//! extension), which must be that of the bytes that came, and at the end for the whole
//! file's (`files/checksum`), which must be the file's. A chunk shortened by the broker (utf-8 ending inside a character)
//! is followed by a request for the rest.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Encoding;
use super::client::Broker;
use super::progress::Bars;
use super::report::{self, Throughput};
use super::wire;
use crate::bench::codec::BASE64;

/// What to read.
pub(crate) struct Spec<'a> {
    pub file: &'a Path,
    pub size: u64,
    pub chunk: usize,
    pub depth: usize,
    pub encoding: Encoding,
    /// The file's sha256: check every byte.
    pub sha256: Option<[u8; 32]>,
    /// Each chunk's sha256 (hex) by offset: ask the broker for its hash of each chunk and
    /// compare (the integrity phase; no chunk is decoded for it).
    pub chunk_sha256: Option<&'a HashMap<u64, String>>,
}

/// The members of a read result the bench looks at (besides `content`).
#[derive(Deserialize)]
struct Meta {
    encoding: String,
    size: u64,
    offset: Option<u64>,
    length: Option<u64>,
    eof: Option<bool>,
    /// The broker's sha256 of the chunk, asked for with `--verify`.
    sha256: Option<String>,
}

/// Reads the whole file once; returns the throughput.
pub(crate) fn run(broker: &mut Broker, spec: &Spec, bars: &Bars) -> Result<report::Read, String> {
    let local = std::fs::File::open(spec.file)
        .map_err(|e| format!("cannot open {}: {e}", spec.file.display()))?;
    let path = spec
        .file
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", spec.file.display()))?;
    let path = serde_json::to_string(path).map_err(|e| e.to_string())?;
    let mut checker = Checker {
        local,
        sha256: spec.sha256.map(|expected| (expected, Sha256::new())),
        pending: BTreeMap::new(),
        hashed_to: 0,
        text: Vec::new(),
    };
    let mut jobs = Jobs {
        next: 0,
        size: spec.size,
        chunk: spec.chunk as u64,
        retries: VecDeque::new(),
        empty_file_asked: false,
    };
    let bar = bars.bytes("files/read", spec.size);
    let mut in_flight: HashMap<u64, (u64, u64)> = HashMap::with_capacity(spec.depth);
    let mut out = report::Read::default();
    let started = Instant::now();
    loop {
        while in_flight.len() < spec.depth {
            let Some((offset, len)) = jobs.next() else {
                break;
            };
            let id = broker.requests.id();
            writeln!(
                broker.requests,
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"files/read\",\"params\":{{\"path\":{path},\"offset\":{offset},\"length\":{len},\"encoding\":\"{}\"{}}}}}",
                spec.encoding.name(),
                if spec.sha256.is_some() || spec.chunk_sha256.is_some() { ",\"sha256\":true" } else { "" }
            )
            .map_err(|e| format!("sending to the broker: {e}"))?;
            in_flight.insert(id, (offset, len));
            out.requests += 1;
        }
        if in_flight.is_empty() {
            break;
        }
        let (span, answer) = broker.answer()?;
        let line = broker.answers.line(span);
        let (offset, len) = answer
            .id
            .and_then(|id| in_flight.remove(&id))
            .ok_or_else(|| format!("an answer to no request: {}", wire::preview(line)))?;
        let got = checker
            .check(line, &answer, offset, len, spec.size, spec.chunk_sha256)
            .map_err(|e| broker.failed(&format!("files/read at offset {offset}: {e}")))?;
        match got.encoding {
            Encoding::Base64 => out.chunks_base64 += 1,
            Encoding::Utf8 => out.chunks_utf8 += 1,
        }
        out.throughput.bytes += got.length;
        bar.inc(got.length);
        if got.length < len && !got.eof {
            jobs.retries
                .push_back((offset + got.length, len - got.length));
        }
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    if out.throughput.bytes != spec.size {
        return Err(format!(
            "files/read returned {} bytes of a {}-byte file",
            out.throughput.bytes, spec.size
        ));
    }
    checker.finish()?;
    if let Some(expected) = spec.sha256 {
        whole_file_checksum(broker, &path, &expected)?;
    }
    out.throughput = Throughput::new(out.throughput.bytes, elapsed);
    Ok(out)
}

/// Asks the broker for the whole file's sha256 (`files/checksum`; `path` as JSON) and compares
/// it with the file's; returns how long the answer took.
pub(crate) fn whole_file_checksum(
    broker: &mut Broker,
    path: &str,
    expected: &[u8; 32],
) -> Result<Duration, String> {
    let id = broker.requests.id();
    let started = Instant::now();
    writeln!(
        broker.requests,
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"files/checksum\",\"params\":{{\"path\":{path}}}}}"
    )
    .and_then(|()| broker.requests.flush())
    .map_err(|e| format!("sending to the broker: {e}"))?;
    let (span, answer) = broker.answer()?;
    let elapsed = started.elapsed();
    let line = broker.answers.line(span);
    if let Some(e) = &answer.error {
        return Err(format!(
            "files/checksum: {}",
            wire::error_text(&line[e.clone()])
        ));
    }
    let result = answer.result.clone().ok_or("files/checksum: no result")?;
    let got: serde_json::Value = serde_json::from_slice(&line[result])
        .map_err(|e| format!("files/checksum: a bad result ({e})"))?;
    let want = hex(expected);
    if got["sha256"].as_str() != Some(want.as_str()) {
        return Err(format!(
            "files/checksum gave {} for a file whose sha256 is {want}",
            got["sha256"]
        ));
    }
    Ok(elapsed)
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The chunks still to ask for.
struct Jobs {
    next: u64,
    size: u64,
    chunk: u64,
    /// The rest of chunks that came back short.
    retries: VecDeque<(u64, u64)>,
    /// An empty file still gets one request.
    empty_file_asked: bool,
}

impl Jobs {
    fn next(&mut self) -> Option<(u64, u64)> {
        if let Some(job) = self.retries.pop_front() {
            return Some(job);
        }
        if self.size == 0 && !self.empty_file_asked {
            self.empty_file_asked = true;
            return Some((0, self.chunk));
        }
        if self.next >= self.size {
            return None;
        }
        let len = self.chunk.min(self.size - self.next);
        let job = (self.next, len);
        self.next += len;
        Some(job)
    }
}

/// What one answer held.
struct Got {
    encoding: Encoding,
    length: u64,
    eof: bool,
}

/// Checks answers against the file.
struct Checker {
    local: std::fs::File,
    /// Expected digest and the running hash, with `--verify`.
    sha256: Option<([u8; 32], Sha256)>,
    /// Decoded chunks that arrived ahead of the hash, by offset.
    pending: BTreeMap<u64, Vec<u8>>,
    hashed_to: u64,
    /// Unescaped utf-8 content.
    text: Vec<u8>,
}

impl Checker {
    fn check(
        &mut self,
        line: &[u8],
        answer: &wire::Answer,
        offset: u64,
        asked: u64,
        size: u64,
        chunk_sha256: Option<&HashMap<u64, String>>,
    ) -> Result<Got, String> {
        if let Some(e) = &answer.error {
            return Err(wire::error_text(&line[e.clone()]));
        }
        let (content, rest) = answer.content(line)?;
        let meta: Meta = serde_json::from_slice(&rest)
            .map_err(|e| format!("a bad result ({e}): {}", wire::preview(&rest)))?;
        if meta.size != size {
            return Err(format!("size {} for a {size}-byte file", meta.size));
        }
        if meta.offset.is_some_and(|o| o != offset) {
            return Err(format!("the answer is for offset {:?}", meta.offset));
        }
        let expected = asked.min(size.saturating_sub(offset));
        let (encoding, length, data) = match meta.encoding.to_ascii_lowercase().as_str() {
            "base64" => {
                let length = base64_len(content)?;
                let data = if self.sha256.is_some() {
                    let mut out = Vec::with_capacity(length as usize);
                    BASE64
                        .decode_vec(content, &mut out)
                        .map_err(|e| format!("bad base64: {e}"))?;
                    Some(out)
                } else {
                    self.samples(offset, length as usize, |w| {
                        decode_window(content, w, length as usize)
                    })?;
                    None
                };
                (Encoding::Base64, length, data)
            }
            "utf-8" | "utf8" => {
                self.text.clear();
                wire::unescape(content, &mut self.text)?;
                let length = self.text.len() as u64;
                let text = std::mem::take(&mut self.text);
                self.samples(offset, text.len(), |w| Ok(text[w].to_vec()))?;
                if self.sha256.is_some() {
                    (Encoding::Utf8, length, Some(text))
                } else {
                    self.text = text;
                    (Encoding::Utf8, length, None)
                }
            }
            other => return Err(format!("unknown encoding {other:?}")),
        };
        if meta.length.is_some_and(|l| l != length) {
            return Err(format!(
                "length {:?} but the content holds {length} bytes",
                meta.length
            ));
        }
        // A chunk of the grid the hashes were made on (a retried rest is not).
        if let Some(want) = chunk_sha256.and_then(|h| h.get(&offset)) {
            if length == expected && meta.sha256.as_deref() != Some(want.as_str()) {
                return Err(format!(
                    "the broker's sha256 of the chunk ({:?}) is not the chunk's ({want})",
                    meta.sha256
                ));
            }
        }
        let eof = meta.eof.unwrap_or(offset + length >= size);
        let short_ok = encoding == Encoding::Utf8 && length > 0 && !eof;
        if length != expected && !(short_ok && length < expected) {
            return Err(format!("{length} bytes where {expected} were due"));
        }
        if let (Some(data), Some((_, hasher))) = (data, &mut self.sha256) {
            let mine = hex(&Sha256::digest(&data));
            if meta.sha256.as_deref() != Some(mine.as_str()) {
                return Err(format!(
                    "the broker's sha256 of the chunk ({:?}) is not that of the {} bytes that came ({mine})",
                    meta.sha256,
                    data.len()
                ));
            }
            self.pending.insert(offset, data);
            while let Some(entry) = self.pending.first_entry() {
                if *entry.key() != self.hashed_to {
                    break;
                }
                let data = entry.remove();
                hasher.update(&data);
                self.hashed_to += data.len() as u64;
            }
        }
        Ok(Got {
            encoding,
            length,
            eof,
        })
    }

    /// Compares three windows of the chunk (start, middle, end) with the file.
    fn samples(
        &self,
        offset: u64,
        len: usize,
        window: impl Fn(Range<usize>) -> Result<Vec<u8>, String>,
    ) -> Result<(), String> {
        for w in windows(len) {
            let got = window(w.clone())?;
            let mut want = vec![0u8; w.len()];
            self.local
                .read_exact_at(&mut want, offset + w.start as u64)
                .map_err(|e| format!("cannot read the test file: {e}"))?;
            if got != want {
                return Err(format!(
                    "content differs from the file at bytes {}..{}",
                    offset + w.start as u64,
                    offset + w.end as u64
                ));
            }
        }
        Ok(())
    }

    fn finish(self) -> Result<(), String> {
        if let Some((expected, hasher)) = self.sha256 {
            if !self.pending.is_empty() {
                return Err("files/read left gaps in the file".into());
            }
            let got: [u8; 32] = hasher.finalize().into();
            if got != expected {
                return Err("the sha256 of the bytes read differs from the file's".into());
            }
        }
        Ok(())
    }
}

/// The decoded length of base64 text (checked for shape, not decoded).
fn base64_len(content: &[u8]) -> Result<u64, String> {
    if content.len() % 4 != 0 {
        return Err(format!(
            "base64 of {} characters (not a multiple of 4)",
            content.len()
        ));
    }
    let pad = content.iter().rev().take(2).filter(|&&c| c == b'=').count();
    Ok((content.len() / 4 * 3 - pad) as u64)
}

/// Bytes `w` of a chunk of `len` bytes whose base64 is `content`; `w.start` is a multiple of
/// 3, and `w.end` too unless it is `len`.
fn decode_window(content: &[u8], w: Range<usize>, len: usize) -> Result<Vec<u8>, String> {
    let from = w.start / 3 * 4;
    let to = if w.end == len {
        content.len()
    } else {
        w.end / 3 * 4
    };
    let mut out = vec![0u8; (to - from) / 4 * 3];
    let n = BASE64
        .decode_slice(&content[from..to], &mut out)
        .map_err(|e| format!("bad base64 near byte {}: {e}", w.start))?;
    out.truncate(n);
    Ok(out)
}

/// Up to three 48-byte windows: the start, the middle and the end of a chunk; starts are
/// multiples of 3, so a window of base64 can be decoded alone.
fn windows(len: usize) -> Vec<Range<usize>> {
    const W: usize = 48;
    if len <= 3 * W {
        return std::iter::once(0..len).collect();
    }
    let mid = len / 2 / 3 * 3;
    let last = (len - W) / 3 * 3;
    vec![0..W, mid..mid + W, last..len]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_decode_alone() {
        for len in [0usize, 1, 2, 3, 47, 144, 145, 146, 147, 1000, 1001, 1002] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let b64 = BASE64.encode(&data);
            assert_eq!(base64_len(b64.as_bytes()).unwrap(), len as u64);
            for w in windows(len) {
                assert!(w.end <= len);
                let got = decode_window(b64.as_bytes(), w.clone(), len).unwrap();
                assert_eq!(got, data[w], "len {len}");
            }
        }
    }
}

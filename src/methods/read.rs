//! `files/read {path, encoding?, offset?, length?}` →
//! `{content, encoding, size, offset, length, eof, mimeType, etag}`.

use std::io::Write;
use std::os::unix::fs::FileExt;

use serde::Deserialize;

use super::{Ctx, Op, ReplyInfo};
use crate::codec::{self, Encoding};
use crate::error::{Error, Result};
use crate::jsonrpc::WriteResult;
use crate::locks::LockMode;
use crate::sandbox::open;

/// `files/read` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(default)]
    encoding: Encoding,
    #[serde(default)]
    offset: u64,
    length: Option<u64>,
    #[serde(default)]
    keep_locked: bool,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// One chunk of a file, written to the wire without an intermediate JSON value.
#[derive(Debug)]
pub(crate) struct Reply {
    data: Vec<u8>,
    encoding: Encoding,
    size: u64,
    offset: u64,
    eof: bool,
    mime: &'static str,
    etag: String,
    lock_id: Option<String>,
}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Result<Params>) -> Result<Reply> {
    let params = params?;
    let reply = ctx.owned().run(move |op| read(op, params)).await?;
    if let Err(e) = super::admit_bytes(ctx, reply.data.len() as u64).await {
        // The server gets no content, so it must not be left holding a lock it never
        // learned the id of.
        if let Some(id) = &reply.lock_id {
            let _ = ctx.session.broker().locks().unlock(id, ctx.session.id());
        }
        return Err(e);
    }
    Ok(reply)
}

fn read(op: &Op, p: Params) -> Result<Reply> {
    let policy = &op.policy;
    let target = op.resolve(&p.path)?;
    let opened = open::open_regular(&target, &p.path)?;
    op.authorize(&target.root, &opened.real, &p.path)?;
    // Readers share; `keepLocked` asks for the exclusive lock that outlives the read.
    let mode = if p.keep_locked {
        LockMode::Exclusive
    } else {
        LockMode::Shared
    };
    let lock = op.lock(&target.root.path().join(&opened.real), mode, &p.path)?;
    let size = opened.meta.len();
    let limits = policy.limits();
    let wanted = p
        .length
        .unwrap_or(limits.chunk_size as u64)
        .min(limits.max_chunk_size as u64);
    let available = size.saturating_sub(p.offset).min(wanted) as usize;
    let mut data = vec![0u8; available];
    let got =
        read_full_at(&opened.file, &mut data, p.offset).map_err(|e| Error::from_io(&e, &p.path))?;
    data.truncate(got);

    let more = p.offset + (got as u64) < size;
    let encoding = match p.encoding {
        Encoding::Base64 => Encoding::Base64,
        Encoding::Utf8 => match codec::utf8_prefix(&data, more) {
            Some(n) => {
                data.truncate(n);
                Encoding::Utf8
            }
            None => Encoding::Base64,
        },
    };
    let length = data.len() as u64;
    let mime = mime_type(&target.rel, &opened.file, p.offset, &data);
    Ok(Reply {
        encoding,
        size,
        offset: p.offset,
        eof: p.offset.saturating_add(length) >= size,
        mime,
        etag: open::etag(&opened.meta),
        lock_id: op.keep(&lock, p.keep_locked, &p.path)?,
        data,
    })
}

/// `pread` until `buf` is full or the file ends (a regular file may return short reads).
fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// From the extension; for files without a known one, a sniff of the file's first bytes
/// (text or not), so every chunk of a file reports the same type.
fn mime_type(rel: &str, file: &std::fs::File, offset: u64, chunk: &[u8]) -> &'static str {
    if let Some(m) = mime_guess::from_path(rel).first_raw() {
        return m;
    }
    let mut head = [0u8; 512];
    let head: &[u8] = if offset == 0 {
        &chunk[..chunk.len().min(512)]
    } else {
        let n = read_full_at(file, &mut head, 0).unwrap_or(0);
        &head[..n]
    };
    let text =
        !head.contains(&0) && codec::utf8_prefix(head, true).is_some_and(|n| n + 4 > head.len());
    if text {
        "text/plain"
    } else {
        "application/octet-stream"
    }
}

impl WriteResult for Reply {
    fn write_result(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"content\":");
        match self.encoding {
            Encoding::Base64 => {
                out.push(b'"');
                codec::base64_into(&self.data, out);
                out.push(b'"');
            }
            // `data` was checked to be UTF-8 when the encoding was chosen.
            Encoding::Utf8 => match std::str::from_utf8(&self.data) {
                Ok(text) => {
                    let _ = serde_json::to_writer(&mut *out, text);
                }
                Err(_) => out.extend_from_slice(b"\"\""),
            },
        }
        // Writing into a Vec cannot fail.
        let _ = write!(
            out,
            ",\"encoding\":\"{}\",\"size\":{},\"offset\":{},\"length\":{},\"eof\":{}",
            self.encoding.name(),
            self.size,
            self.offset,
            self.data.len(),
            self.eof
        );
        out.extend_from_slice(b",\"mimeType\":");
        let _ = serde_json::to_writer(&mut *out, self.mime);
        out.extend_from_slice(b",\"etag\":");
        let _ = serde_json::to_writer(&mut *out, &self.etag);
        if let Some(id) = &self.lock_id {
            out.extend_from_slice(b",\"lockId\":");
            let _ = serde_json::to_writer(&mut *out, id);
        }
        out.push(b'}');
    }
}

impl ReplyInfo for Reply {
    fn size_hint(&self) -> usize {
        self.data.len() / 3 * 4 + 256
    }
    fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

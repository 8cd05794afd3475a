//! `files/read {path, encoding?, offset?, length?, keepLocked?, sha256?}` →
//! `{content, encoding, size, offset, length, eof, mimeType, etag, lockId?, sha256?}`.

use std::cell::RefCell;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::OwnedSemaphorePermit;

use super::{Ctx, Op, ReplyInfo};
use crate::codec::{self, Encoding};
use crate::digest;
use crate::error::{Error, Result};
use crate::jsonrpc::WriteResult;
use crate::locks::LockMode;
use crate::outgoing::{Body, BodyPool};
use crate::policy::Policy;
use crate::sandbox::open::{self, RegularFile};
use crate::throttle::{self, Prepaid};

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
    /// *ext*: the answer carries the SHA-256 of the chunk's bytes.
    #[serde(default)]
    sha256: bool,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// Chunks at least this large (in base64) are encoded into pages of their own, which a pipe
/// takes without a copy; smaller ones are not worth the `mmap`.
const PAGES_FROM: usize = 256 << 10;

/// Bytes read per `pread` when encoding into pages: a multiple of 3 (so the pieces' base64
/// joins up without padding), small enough to stay in the CPU's cache between the read and
/// the encode.
const PIECE: usize = 3 << 16;

/// One chunk of a file, written to the wire without an intermediate JSON value.
#[derive(Debug)]
pub(crate) struct Reply {
    content: Content,
    /// Bytes of the file in this chunk.
    length: u64,
    encoding: Encoding,
    size: u64,
    offset: u64,
    eof: bool,
    mime: &'static str,
    etag: String,
    lock_id: Option<String>,
    /// The SHA-256 of the chunk's bytes (hex), when asked.
    sha256: Option<String>,
    budget: Option<OwnedSemaphorePermit>,
}

/// A chunk's bytes: as read (encoded when the frame is written), or already base64 in pages.
#[derive(Debug)]
enum Content {
    Raw(Vec<u8>),
    /// Taken by the frame ([`ReplyInfo::take_body`]) before the result is written.
    Pages(Option<Body>),
}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Reply> {
    // The byte rate bounds what the disk is asked for, so it is paid before the work: a
    // session whose budget is spent reads nothing, and a read reads only what it paid for.
    ctx.broker.rate_limits().admit_start(ctx.state.id)?;
    let budget = ctx
        .state
        .reserve_output(wanted(&ctx.policy, &params) / 3 * 4)
        .await;
    let bodies = Arc::clone(ctx.state.bodies());
    let wanted = wanted(&ctx.policy, &params);
    let small = wanted <= crate::limits::MAX_INLINE_READ;
    // A big read pays for its bytes before it reads them, on its blocking thread (so a flood
    // of big reads reads the disk at the rate); a small one before it starts, for all it may
    // read (what EOF leaves unread is not given back): paid after, a read refused for time
    // would have read for nothing, and a flood of them at any rate. Unlimited, the hot path
    // awaits nothing.
    if small && ctx.broker.rate_limits().limits_bytes() {
        super::op::pay_ahead(ctx, Instant::now(), (wanted as u64).saturating_sub(1024)).await?;
    }
    let mut reply = if small {
        let work = move |op: &Op| read(op, params, &bodies, None);
        ctx.owned_inline().run_small(work).await?
    } else {
        let started = Instant::now();
        let (path, offset) = (params.path.clone(), params.offset);
        let probe = move |op: &Op| {
            let (_, opened) = op.open_readable(&path)?;
            Ok(to_read(&opened, offset, wanted as u64).saturating_sub(1024))
        };
        let prepaid = super::op::prepay(ctx, started, probe).await?;
        let work = move |op: &Op| read(op, params, &bodies, Some(&prepaid));
        ctx.owned_since(started).run(work).await?
    };
    // Reserved for what was asked; keep only what the answer holds (a 10-byte file read with
    // the default length must not hold a megabyte of the budget while it waits to be sent).
    reply.budget = budget.map(|mut permit| {
        let needed = (reply.length as usize / 3 * 4).div_ceil(1024).max(1);
        if let Some(excess) = permit.num_permits().checked_sub(needed).filter(|n| *n > 0) {
            drop(permit.split(excess));
        }
        permit
    });
    Ok(reply)
}

/// Bytes a read of `opened` from `offset` will read when it asks for `wanted`.
fn to_read(opened: &RegularFile, offset: u64, wanted: u64) -> u64 {
    opened.meta.len().saturating_sub(offset).min(wanted)
}

/// Bytes a request asks for, capped by the policy.
fn wanted(policy: &Policy, p: &Params) -> usize {
    let limits = policy.limits();
    p.length
        .unwrap_or(limits.chunk_size as u64)
        .min(limits.max_chunk_size as u64) as usize
}

fn read(op: &Op, p: Params, bodies: &Arc<BodyPool>, prepaid: Option<&Prepaid>) -> Result<Reply> {
    let (target, opened) = op.open_readable(&p.path)?;
    if let Some(prepaid) = prepaid {
        // Before the lock: a read that runs out of time waiting to pay holds nothing. Paid
        // ahead as a rule; here only what a file that grew since adds.
        let to_read = to_read(&opened, p.offset, wanted(&op.policy, &p) as u64);
        let go_on = || !op.deadline.expired();
        if !prepaid.pay(to_read.saturating_sub(1024), go_on) {
            return Err(throttle::timed_out(op.policy.limits().timeout));
        }
    }
    // Readers share; `keepLocked` asks for the exclusive lock that outlives the read.
    let mode = if p.keep_locked {
        LockMode::Exclusive
    } else {
        LockMode::Shared
    };
    let lock = op.lock(&target.root().join(&opened.real), mode, &p.path)?;
    let size = opened.meta.len();
    let available = size
        .saturating_sub(p.offset)
        .min(wanted(&op.policy, &p) as u64) as usize;
    let io_err = |e: std::io::Error| Error::from_io(&e, &p.path);

    let mut hasher = p.sha256.then(Sha256::new);
    let (content, encoding, length, mime) = if p.encoding == Encoding::Base64
        && available >= PAGES_FROM
    {
        let (body, got) = base64_pages(bodies, &opened.file, p.offset, available, hasher.as_mut())
            .map_err(io_err)?;
        let mime = mime_type(target.rel(), &opened.file, p.offset, None);
        (
            Content::Pages(Some(body)),
            Encoding::Base64,
            got as u64,
            mime,
        )
    } else {
        let mut data = vec![0u8; available];
        let got = read_full_at(&opened.file, &mut data, p.offset).map_err(io_err)?;
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
        let mime = mime_type(target.rel(), &opened.file, p.offset, Some(&data));
        let length = data.len() as u64;
        if let Some(h) = hasher.as_mut() {
            h.update(&data);
        }
        (Content::Raw(data), encoding, length, mime)
    };
    Ok(Reply {
        content,
        length,
        encoding,
        size,
        offset: p.offset,
        eof: p.offset.saturating_add(length) >= size,
        mime,
        etag: open::etag(&opened.meta),
        lock_id: op.keep(&lock, p.keep_locked, &p.path)?,
        sha256: hasher.map(|h| digest::hex(&h.finalize())),
        budget: None,
    })
}

thread_local! {
    /// Each blocking-pool thread's buffer for [`base64_pages`]: reused, so a chunk costs no
    /// allocation and no zeroing of its raw bytes.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Reads up to `len` bytes at `offset` and encodes them as base64 into fresh pages, a cache-
/// sized piece at a time (fed to `hasher` too, while still in the cache); returns the pages
/// and how many file bytes they hold.
fn base64_pages(
    bodies: &Arc<BodyPool>,
    file: &std::fs::File,
    offset: u64,
    len: usize,
    mut hasher: Option<&mut Sha256>,
) -> std::io::Result<(Body, usize)> {
    let mut body = bodies.take(base64::encoded_len(len, true).unwrap_or(0))?;
    SCRATCH.with_borrow_mut(|scratch| {
        scratch.resize(PIECE, 0);
        let mut done = 0;
        while done < len {
            let want = PIECE.min(len - done);
            let n = read_full_at(file, &mut scratch[..want], offset + done as u64)?;
            if let Some(h) = hasher.as_mut() {
                h.update(&scratch[..n]);
            }
            let written = codec::base64_into_slice(&scratch[..n], body.spare());
            body.advance(written);
            done += n;
            // Short means the file ended (it shrank since it was measured): the padding, if
            // any, is then the last thing encoded.
            if n < want {
                break;
            }
        }
        Ok((body, done))
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
fn mime_type(rel: &str, file: &std::fs::File, offset: u64, chunk: Option<&[u8]>) -> &'static str {
    if let Some(m) = mime_guess::from_path(rel).first_raw() {
        return m;
    }
    let mut head = [0u8; 512];
    let head: &[u8] = if let (0, Some(chunk)) = (offset, chunk) {
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
        // `body_at` below counts on `content` coming first.
        out.extend_from_slice(b"{\"content\":");
        match (&self.content, self.encoding) {
            (Content::Pages(_), _) => out.extend_from_slice(b"\"\""),
            (Content::Raw(data), Encoding::Base64) => {
                out.push(b'"');
                codec::base64_into(data, out);
                out.push(b'"');
            }
            // `data` was checked to be UTF-8 when the encoding was chosen.
            (Content::Raw(data), Encoding::Utf8) => match std::str::from_utf8(data) {
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
            self.length,
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
        if let Some(hash) = &self.sha256 {
            // Hex digits: nothing to escape.
            out.extend_from_slice(b",\"sha256\":\"");
            out.extend_from_slice(hash.as_bytes());
            out.push(b'"');
        }
        out.push(b'}');
    }

    fn body_at(&self) -> Option<usize> {
        matches!(self.content, Content::Pages(_)).then_some(b"{\"content\":\"".len())
    }
}

impl ReplyInfo for Reply {
    fn size_hint(&self) -> usize {
        match self.content {
            Content::Raw(_) => self.length as usize / 3 * 4 + 256,
            Content::Pages(_) => 256,
        }
    }
    fn bytes(&self) -> u64 {
        self.length
    }
    fn take_body(&mut self) -> Option<Body> {
        match &mut self.content {
            Content::Pages(body) => body.take(),
            Content::Raw(_) => None,
        }
    }
    fn take_budget(&mut self) -> Option<OwnedSemaphorePermit> {
        self.budget.take()
    }
}

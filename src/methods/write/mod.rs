//! `files/write {path, content, encoding?, create?, offset?, final?, ifMatch?, append?,
//! keepLocked?, sha256?}` → `{bytesWritten, size, etag?, lockId?, sha256?}`.
//!
//! Without `offset`: an atomic replace. The content goes to a staging file beside the target,
//! is synced, gets the old file's permission bits, and is renamed over the target; the
//! directory is synced. A reader sees the old file or the new one, never a mix; on any failure
//! the staging file is removed and the target is untouched.
//!
//! With `offset`: one chunk of an upload ([`crate::upload`]); the `final` chunk commits the same
//! way.
//!
//! The parts: this file is the method (its `Params`, its result, `handle`, and `write`, the
//! checks every write runs, in order, before it is a replace or a chunk, with the checks of
//! the target they share); `content.rs` makes the content bytes; `check.rs` reads `sha256`;
//! `replace.rs` is a write without `offset`, `chunk.rs` one with; `mode.rs` gives a new
//! file its permission bits.

mod check;
mod chunk;
mod content;
mod mode;
mod replace;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::codec::Encoding;
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::Json;
use crate::sandbox::mutate::{self, Parent};
use crate::sandbox::{Resolved, open};
use crate::throttle::Prepaid;
use check::Check;
use chunk::{await_turn, chunk};
use content::{Data, content_of, decode, decoded_estimate};
use replace::replace;

/// `files/write` parameters; `content` borrows from the request line (base64 has nothing to
/// unescape), so a chunk is decoded straight from the bytes that arrived.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params<'a> {
    path: String,
    #[serde(borrow)]
    content: Cow<'a, str>,
    #[serde(default)]
    encoding: Encoding,
    #[serde(default = "yes")]
    create: bool,
    offset: Option<u64>,
    #[serde(rename = "final", default = "yes")]
    last: bool,
    if_match: Option<String>,
    #[serde(default)]
    append: bool,
    #[serde(default)]
    keep_locked: bool,
    /// *ext*: `true` on an upload's first chunk announces a hash to come; a hex SHA-256 on a
    /// replace or an upload's final chunk is checked before anything is committed.
    sha256: Option<serde_json::Value>,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

fn yes() -> bool {
    true
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    bytes_written: u64,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    etag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_id: Option<String>,
    /// The checked SHA-256 of the committed content, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

impl super::PayloadBytes for Reply {
    fn payload_bytes(&self) -> u64 {
        self.bytes_written
    }
}

/// What the blocking part of a write gets: the parameters, with the content decoded.
struct Request {
    path: String,
    data: Data,
    create: bool,
    offset: Option<u64>,
    last: bool,
    if_match: Option<String>,
    append: bool,
    keep_locked: bool,
    check: Check,
}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params<'_>) -> Result<Json<Reply>> {
    let p = params;
    let check = Check::parse(p.sha256, p.offset, p.last)?;
    let content = content_of(ctx, &p.content, p.encoding)?;
    let payload = decoded_estimate(&content, p.encoding);
    // Decoded here, on the async thread (a few milliseconds of SIMD for the largest chunk):
    // a lifted chunk in place, in its own line; other content into a buffer of its own. And
    // before the chunk's turn: chunks land one at a time, and a chunk decoded while its
    // predecessor is written is one decode less on that path (it was a fifth of an 8 MiB
    // chunk's time there). It costs no memory: a long chunk decodes within its own line.
    let data = decode(
        content,
        p.encoding,
        ctx.policy.limits().max_chunk_size,
        &p.path,
    )?;
    if let Some(offset) = p.offset.filter(|&o| o > 0) {
        await_turn(ctx, &p.path, offset).await?;
    }
    // After the turn, so that chunks take the byte rate in their order.
    super::op::admit_bytes(ctx, payload as u64).await?;
    // An append copies the file as it is into the staging file: that reads the disk, and is
    // paid for as a read would be, ahead, off the pool.
    let started = std::time::Instant::now();
    let prepaid = if p.append {
        let path = p.path.clone();
        let probe = move |op: &Op| {
            let current = existing(&writable_parent(op, &path)?, &path)?;
            Ok(current.map_or(0, |(_, meta)| meta.len()))
        };
        super::op::prepay(ctx, started, probe).await?
    } else {
        Prepaid::new(ctx.broker.rate_limits(), ctx.state.id, 0)
    };
    let request = Request {
        path: p.path,
        data,
        create: p.create,
        offset: p.offset,
        last: p.last,
        if_match: p.if_match,
        append: p.append,
        keep_locked: p.keep_locked,
        check,
    };
    ctx.owned_since(started)
        .run(move |op| write(op, request, &prepaid))
        .await
        .map(Json)
}

fn write(op: &Op, p: Request, prepaid: &Prepaid) -> Result<Reply> {
    let raw = p.path.as_str();
    if p.append && p.offset.is_some() {
        return Err(Error::invalid_params(
            "append and offset cannot be combined",
        ));
    }
    let data = &p.data;
    if p.last {
        op.check_keep_quota(p.keep_locked, raw)?;
    }
    let parent = writable_parent(op, raw)?;
    // Checked again where the content is committed; here, so that an upload onto a path it
    // may never commit to is refused at its first chunk.
    parent.check_change("written", raw)?;
    match p.offset {
        None => replace(op, &p, &parent, data, raw, prepaid),
        Some(offset) => chunk(op, &p, parent, offset, data, raw),
    }
}

/// The parent of a file this session may write at `raw`: in a writable root, not the root,
/// and authorized where it really is.
fn writable_parent(op: &Op, raw: &str) -> Result<Parent> {
    let target = op.resolve(raw)?;
    mutate::require_writable(&target, raw)?;
    if target.is_root() {
        return Err(Error::new(ErrorKind::InvalidPath, "the root is a directory").with_path(raw));
    }
    let parent = parent_following_inner_link(&target, raw)?;
    op.authorize(target.root(), &parent.real, raw)?;
    Ok(parent)
}

/// Opens the target's parent. A symlink at the target that stays inside the root is written
/// through: the write lands on the link's target, the link stays (reads follow such links, so
/// a read after the write sees what was written). One that leads out, or is absolute, is
/// refused by the confined resolution, as a read of it would be.
fn parent_following_inner_link(target: &Resolved, raw: &str) -> Result<Parent> {
    let parent = mutate::open_parent(target, raw)?;
    if !parent.entry_type(raw)?.is_some_and(|t| t.is_symlink()) {
        return Ok(parent);
    }
    let through = target.real(raw)?;
    let parent = mutate::open_parent(&through, raw)?;
    if parent.entry_type(raw)?.is_some_and(|t| t.is_symlink()) {
        // The link changed while we followed it; do not chase it further.
        return Err(
            Error::new(ErrorKind::Io, "the symlink changed during the write").with_path(raw),
        );
    }
    Ok(parent)
}

/// The existing file at the target, or `None`; refuses directories and special files.
fn existing(parent: &Parent, raw: &str) -> Result<Option<(std::fs::File, std::fs::Metadata)>> {
    match parent.entry_type(raw)? {
        None => Ok(None),
        Some(t) if t.is_file() => parent.open_existing(raw).map(Some),
        Some(t) => Err(Error::new(
            ErrorKind::InvalidPath,
            format!("not a regular file ({})", open::describe(t)),
        )
        .with_path(raw)),
    }
}

/// `create: false` and `ifMatch`, against what is there now.
fn check_preconditions(p: &Request, current: Option<&std::fs::Metadata>, raw: &str) -> Result<()> {
    if current.is_none() && !p.create {
        return Err(
            Error::new(ErrorKind::FileNotFound, "no such file (create is false)").with_path(raw),
        );
    }
    match &p.if_match {
        Some(want) => match_etag(want, current, raw),
        None => Ok(()),
    }
}

/// Just before a commit: the file must still be what `ifMatch` named (another program may
/// have changed it while the content was being written).
fn recheck_if_match(if_match: Option<&str>, parent: &Parent, raw: &str) -> Result<()> {
    let Some(want) = if_match else {
        return Ok(());
    };
    let now = existing(parent, raw)?;
    match_etag(want, now.as_ref().map(|(_, m)| m), raw)
}

fn match_etag(want: &str, current: Option<&std::fs::Metadata>, raw: &str) -> Result<()> {
    let now = current.map(open::etag);
    if now.as_deref() == Some(want) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::ConcurrencyConflict,
        match now {
            Some(_) => "ifMatch differs from the file's current etag",
            None => "ifMatch given but the file does not exist",
        },
    )
    .with_path(raw))
}

fn too_large(size: u64, max: u64, raw: &str) -> Error {
    Error::new(
        ErrorKind::QuotaExceeded,
        format!("the file would be {size} bytes, over max_file_size ({max})"),
    )
    .with_path(raw)
}

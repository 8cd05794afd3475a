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

use std::borrow::Cow;
use std::os::unix::fs::PermissionsExt;
use std::sync::LazyLock;

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::{Ctx, Op};
use crate::buffers::{Content, Line};
use crate::codec::{self, BASE64, Encoding};
use crate::digest;
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::{self, Json};
use crate::locks::LockMode;
use crate::sandbox::mutate::{self, Parent};
use crate::sandbox::{Resolved, open};
use crate::throttle;
use crate::upload::{self, Upload};

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

/// What a write's `sha256` asks (*ext*).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Check {
    /// Nothing.
    None,
    /// `true` on an upload's first chunk: hash the chunks as they come; the final chunk will
    /// bring the hash.
    Announced,
    /// The SHA-256 the committed content must have (lower-case hex).
    Expect(String),
}

impl Check {
    /// Reads `sha256` for a write with this `offset` and `final`, refusing what cannot be
    /// meant: a hash on a chunk that commits nothing, `true` where there is nothing to come.
    fn parse(value: Option<serde_json::Value>, offset: Option<u64>, last: bool) -> Result<Check> {
        use serde_json::Value;
        let bad = |why: &str| Err(Error::invalid_params(format!("sha256: {why}")));
        match value {
            None | Some(Value::Bool(false)) | Some(Value::Null) => Ok(Check::None),
            Some(Value::Bool(true)) => match offset {
                Some(0) if !last => Ok(Check::Announced),
                Some(0) | None => bad(
                    "true announces a hash on an upload's first chunk; this write commits now, so give the hash itself (64 hex digits)",
                ),
                Some(_) => bad("true goes on an upload's first chunk (offset 0)"),
            },
            Some(Value::String(hex)) => {
                if !digest::is_sha256_hex(&hex) {
                    return bad("not a SHA-256: expected 64 hex digits");
                }
                if offset.is_some() && !last {
                    return bad(
                        "the hash of the whole upload goes on its final chunk (announce it with true on the first)",
                    );
                }
                Ok(Check::Expect(hex.to_ascii_lowercase()))
            }
            Some(_) => bad("expected true or 64 hex digits"),
        }
    }
}

/// The error for content whose hash is not the one given: nothing was committed.
fn mismatch(bytes: u64, actual: &str, expected: &str, raw: &str) -> Error {
    Error::new(
        ErrorKind::ChecksumMismatch,
        format!(
            "the {bytes} bytes received hash to sha256 {actual}, not the {expected} given; nothing was written"
        ),
    )
    .with_path(raw)
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
    ctx.owned()
        .run(move |op| write(op, request))
        .await
        .map(Json)
}

/// Waits, without a thread, until it is the turn of the chunk at `offset` of the upload that
/// the request path `raw` names: its predecessors have landed. It waits only while a request
/// that arrived before this one is unanswered (one that could be the chunk it needs); a chunk
/// whose turn cannot come is answered `CONCURRENCY_CONFLICT` here.
///
/// The wait has no deadline of its own, and needs none: every request it waits for either
/// waits the same way for requests older still, or is bounded by its own `timeout_ms`, so the
/// wait ends; and it is not part of this chunk's operation, whose `timeout_ms` starts once its
/// turn has come. (With a deadline, a long pipelined upload on a slow disk would time out the
/// chunks queued far behind, which are merely waiting their turn.)
///
/// A chunk that spells its path unlike the upload's first chunk finds no upload here and goes
/// on; the blocking part then finds it by its canonical path, and judges the offset without
/// waiting.
async fn await_turn(ctx: &Ctx<'_>, raw: &str, offset: u64) -> Result<()> {
    let state = ctx.state;
    let mut progress = state.progress();
    loop {
        progress.borrow_and_update();
        // Asked before the upload is looked at: a predecessor lands before it is answered, so
        // once none is unanswered, what the upload shows is final.
        let none_earlier = !state.earlier_unfinished(ctx.arrival);
        let slot = state.uploads.by_spelling(raw);
        let written = match &slot {
            Some(slot) if slot.ended() => return Ok(()),
            Some(slot) if slot.written() == offset => {
                slot.touch();
                return Ok(());
            }
            Some(slot) => Some(slot.written()),
            None => None,
        };
        if none_earlier || progress.changed().await.is_err() {
            return match written {
                Some(written) => Err(Error::new(
                    ErrorKind::ConcurrencyConflict,
                    offset_mismatch(offset, written),
                )
                .with_path(raw)),
                None => Ok(()),
            };
        }
    }
}

/// Bytes staged between two starts of writeback (`Staged::start_writeback`): the final
/// chunk's `fsync` then waits for at most this much besides what the kernel has not written yet.
const WRITEBACK_STEP: u64 = 8 << 20;

fn offset_mismatch(offset: u64, written: u64) -> String {
    format!("offset {offset} does not match the {written} bytes staged so far")
}

fn write(op: &Op, p: Request) -> Result<Reply> {
    let raw = p.path.as_str();
    let target = op.resolve(raw)?;
    mutate::require_writable(&target, raw)?;
    if target.is_root() {
        return Err(Error::new(ErrorKind::InvalidPath, "the root is a directory").with_path(raw));
    }
    if p.append && p.offset.is_some() {
        return Err(Error::invalid_params(
            "append and offset cannot be combined",
        ));
    }
    let data = &p.data;
    if p.last {
        op.check_keep_quota(p.keep_locked, raw)?;
    }
    let parent = parent_following_inner_link(&target, raw)?;
    op.authorize(target.root(), &parent.real, raw)?;
    // Checked again where the content is committed; here, so that an upload onto a path it
    // may never commit to is refused at its first chunk.
    parent.check_change("written", raw)?;
    match p.offset {
        None => replace(op, &p, &parent, data, raw),
        Some(offset) => chunk(op, &p, parent, offset, data, raw),
    }
}

/// The content as sent: lifted out of the request line before parsing (`jsonrpc::lift`)
/// when it was long, else as parsed. Text is valid UTF-8 either way.
fn content_of<'p, 'a: 'p>(
    ctx: &Ctx<'a>,
    parsed: &'p str,
    encoding: Encoding,
) -> Result<Content<'p>> {
    let lifted = ctx.lifted.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(lifted) = lifted else {
        return Ok(Content::Borrowed(parsed.as_bytes()));
    };
    if parsed != jsonrpc::placeholder() {
        // What was lifted is another member (one named `content` in `_meta`): it is checked
        // as the whole line would have been, so that no line passes with a string serde_json
        // would have refused.
        check_text(lifted.bytes())
            .map_err(|why| Error::new(ErrorKind::ParseError, format!("not valid JSON: {why}")))?;
        return Ok(Content::Borrowed(parsed.as_bytes()));
    }
    // Base64 decoding refuses any byte outside its alphabet; text is checked here.
    if matches!(encoding, Encoding::Utf8) {
        check_text(lifted.bytes())
            .map_err(|why| Error::invalid_params(format!("content: {why}")))?;
    }
    Ok(lifted)
}

/// What serde_json checks of a string without escapes: UTF-8, and no raw control character.
fn check_text(text: &[u8]) -> std::result::Result<(), String> {
    let text = simdutf8::compat::from_utf8(text)
        .map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    match text.bytes().position(|b| b < 0x20) {
        Some(at) => Err(format!(
            "control character (U+{:04X}) at byte {at} must be escaped",
            text.as_bytes()[at]
        )),
        None => Ok(()),
    }
}

/// A chunk's decoded bytes: in the request line's own buffer (decoded in place), or in a
/// buffer of their own.
#[derive(Debug)]
enum Data {
    /// `line[..len]`.
    InLine(Line, usize),
    Own(Vec<u8>),
}

impl std::ops::Deref for Data {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Data::InLine(line, len) => &line[..*len],
            Data::Own(bytes) => bytes,
        }
    }
}

/// About how many bytes `content` decodes to (base64: up to 2 fewer, for padding).
fn decoded_estimate(content: &Content<'_>, encoding: Encoding) -> usize {
    let sent = content.bytes().len();
    match encoding {
        Encoding::Utf8 => sent,
        Encoding::Base64 => sent / 4 * 3,
    }
}

/// The payload as bytes, refused before decoding when it cannot fit `max_chunk_size`.
fn decode(content: Content<'_>, encoding: Encoding, max: usize, raw: &str) -> Result<Data> {
    let too_big = |n: usize| {
        Error::new(
            ErrorKind::QuotaExceeded,
            format!("payload of {n} bytes is over max_chunk_size ({max})"),
        )
        .with_path(raw)
    };
    let estimate = decoded_estimate(&content, encoding);
    if estimate > max + 3 {
        return Err(too_big(estimate));
    }
    let not_base64 =
        |e: base64::DecodeError| Error::invalid_params(format!("content is not valid base64: {e}"));
    let data = match (content, encoding) {
        (Content::Owned(mut line, range), Encoding::Utf8) => {
            line.copy_within(range.clone(), 0);
            Data::InLine(line, range.len())
        }
        (Content::Owned(mut line, range), Encoding::Base64) => {
            let n = codec::base64_decode_in_place(&mut line, range).map_err(not_base64)?;
            Data::InLine(line, n)
        }
        (Content::Borrowed(text), Encoding::Utf8) => Data::Own(text.to_vec()),
        (Content::Borrowed(text), Encoding::Base64) => {
            Data::Own(BASE64.decode(text).map_err(not_base64)?)
        }
    };
    if data.len() > max {
        return Err(too_big(data.len()));
    }
    Ok(data)
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

/// The permission bits of the file being replaced, or the default for a new file.
fn mode_for(current: Option<&std::fs::Metadata>) -> u32 {
    current.map_or(*NEW_FILE_MODE, |m| m.permissions().mode() & 0o7777)
}

/// `0o666` less the process umask, as `open(2)` would give a new file. Read once from
/// `/proc/self/status`: `umask(2)` can only be read by setting it, which would race with
/// other threads creating files.
static NEW_FILE_MODE: LazyLock<u32> = LazyLock::new(|| {
    #[allow(clippy::disallowed_methods)] // the process's own status, never a request path
    let umask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022);
    0o666 & !umask
});

fn too_large(size: u64, max: u64, raw: &str) -> Error {
    Error::new(
        ErrorKind::QuotaExceeded,
        format!("the file would be {size} bytes, over max_file_size ({max})"),
    )
    .with_path(raw)
}

fn replace(op: &Op, p: &Request, parent: &Parent, data: &[u8], raw: &str) -> Result<Reply> {
    let checked = match &p.check {
        Check::Expect(expected) => {
            let actual = digest::sha256_hex(data);
            if &actual != expected {
                return Err(mismatch(data.len() as u64, &actual, expected, raw));
            }
            Some(actual)
        }
        Check::None | Check::Announced => None,
    };
    let max_file = op.policy.limits().max_file_size;
    let lock = op.lock(&parent.key, LockMode::Exclusive, raw)?;
    let current = existing(parent, raw)?;
    check_preconditions(p, current.as_ref().map(|(_, m)| m), raw)?;
    let kept = if p.append {
        current.as_ref().map_or(0, |(_, m)| m.len())
    } else {
        0
    };
    let size = kept + data.len() as u64;
    if size > max_file {
        return Err(too_large(size, max_file, raw));
    }
    let mut staged = parent.stage(raw)?;
    if let (true, Some((file, _))) = (p.append, current.as_ref()) {
        let mut src = file;
        std::io::copy(&mut src, staged.file()).map_err(|e| Error::from_io(&e, raw))?;
    }
    staged.write(data, raw)?;
    staged.finish(mode_for(current.as_ref().map(|(_, m)| m)), raw)?;
    recheck_if_match(p.if_match.as_deref(), parent, raw)?;
    op.commit()?;
    let meta = parent.commit(staged, raw)?;
    Ok(Reply {
        bytes_written: data.len() as u64,
        size: meta.len(),
        etag: Some(open::etag(&meta)),
        lock_id: op.keep(&lock, p.keep_locked, raw)?,
        sha256: checked,
    })
}

fn chunk(
    op: &Op,
    p: &Request,
    parent: Parent,
    offset: u64,
    data: &[u8],
    raw: &str,
) -> Result<Reply> {
    let limits = op.policy.limits();
    let key = parent.key.clone();
    let uploads = &op.state.uploads;
    if offset == 0 {
        // A new upload (or a restart: the earlier one at this path is dropped first, so its
        // lock does not stand in the way of this one). Refused before anything is created
        // when the session is at its bounds: an upload holds a lock and descriptors.
        uploads.end(&key);
        uploads.check_room(&key, limits.max_uploads, raw)?;
        let kept = op.locks.kept_by(op.state.id);
        if kept + uploads.len() >= limits.max_locks as usize {
            return Err(Error::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "this session holds {kept} kept locks and {} unfinished uploads (max_locks)",
                    uploads.len()
                ),
            )
            .with_path(raw));
        }
        let lock = op.lock(&key, LockMode::Exclusive, raw)?;
        let current = existing(&parent, raw)?;
        check_preconditions(p, current.as_ref().map(|(_, m)| m), raw)?;
        let mode = mode_for(current.as_ref().map(|(_, m)| m));
        let staged = parent.stage(raw)?;
        let upload = Upload {
            parent,
            staged,
            written: 0,
            mode,
            if_match: p.if_match.clone(),
            lock,
            hasher: (p.check != Check::None).then(upload::Hasher::default),
        };
        uploads.start(key.clone(), &p.path, upload, limits.max_uploads, raw)?;
    }
    let conflict = |why: String| Error::new(ErrorKind::ConcurrencyConflict, why).with_path(raw);
    let slot = uploads.get(&key).ok_or_else(|| {
        conflict(format!(
            "no upload in progress for this path; offset {offset} needs an upload started at offset 0"
        ))
    })?;
    slot.touch();
    let mut guard = upload::lock(&slot);
    let Some(up) = guard.as_mut() else {
        return Err(conflict("the upload has already ended".into()));
    };
    if up.written != offset {
        return Err(conflict(offset_mismatch(offset, up.written)));
    }
    let size = up.written + data.len() as u64;
    let failed = |e: Error| {
        uploads.end_slot(&key, &slot);
        Err(e)
    };
    if size > limits.max_file_size {
        drop(guard);
        return failed(too_large(size, limits.max_file_size, raw));
    }
    if let Err(e) = up.staged.write(data, raw) {
        drop(guard);
        return failed(e);
    }
    if let Err(e) = op.commit() {
        // Timed out: this chunk is not acknowledged, so the upload cannot go on consistently.
        drop(guard);
        return failed(e);
    }
    let hasher = up.hasher.clone();
    let mut hash = hasher.as_ref().map(upload::Hasher::take);
    // Writeback is started per 8 MiB staged rather than per chunk: each call walks the file's
    // dirty pages and queues I/O, and at 256 KiB chunks that was thousands of calls a second.
    if size / WRITEBACK_STEP != up.written / WRITEBACK_STEP {
        up.staged.start_writeback();
    }
    up.written = size;
    slot.landed(size);
    if !p.last {
        drop(guard);
        if let Some(h) = hash.as_mut() {
            h.update(data);
        }
        return Ok(Reply {
            bytes_written: data.len() as u64,
            size,
            etag: None,
            lock_id: None,
            sha256: None,
        });
    }
    let Some(mut up) = guard.take() else {
        return Err(conflict("the upload has already ended".into()));
    };
    drop(guard);
    uploads.end_slot(&key, &slot);
    let announced = hash.map(|mut h| {
        h.update(data);
        digest::hex(&std::mem::take(&mut *h).finalize())
    });
    // Past here a failure drops `up`, and with it the staging file: nothing is committed.
    let checked = match &p.check {
        Check::Expect(expected) => {
            let actual = match announced {
                Some(hex) => hex,
                // Not announced: hash what was staged, read back (from the page cache).
                None => {
                    let deadline = &op.deadline;
                    digest::hash_range(up.staged.file(), 0, up.written, || !deadline.expired())
                        .map_err(|e| Error::from_io(&e, raw))?
                        .map(|(hex, _)| hex)
                        .ok_or_else(|| throttle::timed_out(limits.timeout))?
                }
            };
            if &actual != expected {
                return Err(mismatch(up.written, &actual, expected, raw));
            }
            Some(actual)
        }
        Check::None | Check::Announced => None,
    };
    up.staged.finish(up.mode, raw)?;
    recheck_if_match(up.if_match.as_deref(), &up.parent, raw)?;
    recheck_if_match(p.if_match.as_deref(), &up.parent, raw)?;
    let meta = up.parent.commit(up.staged, raw)?;
    Ok(Reply {
        bytes_written: data.len() as u64,
        size: meta.len(),
        etag: Some(open::etag(&meta)),
        lock_id: op.keep(&up.lock, p.keep_locked, raw)?,
        sha256: checked,
    })
}

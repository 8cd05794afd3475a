//! A write with `offset`: one chunk of an upload ([`crate::upload`]), in its turn; the
//! `final` chunk checks the announced hash and commits as a replace does.

use sha2::Digest;

use super::check::{Check, mismatch};
use super::mode::mode_for;
use super::{Reply, Request, check_preconditions, existing, recheck_if_match, too_large};
use crate::digest;
use crate::error::{Error, ErrorKind, Result};
use crate::locks::LockMode;
use crate::methods::{Ctx, Op};
use crate::sandbox::mutate::Parent;
use crate::sandbox::open;
use crate::throttle;
use crate::upload::{self, Upload};

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
pub(super) async fn await_turn(ctx: &Ctx<'_>, raw: &str, offset: u64) -> Result<()> {
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

pub(super) fn chunk(
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

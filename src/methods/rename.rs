//! `files/rename {oldPath, newPath, overwrite?}` → `{}`.
//!
//! Both paths lie in writable roots (possibly two); neither may be a root. The last component
//! of each is never followed: a symlink is moved, or replaced, as the link it is. Without
//! `overwrite` an existing target is `ALREADY_EXISTS`, decided atomically by the kernel
//! (`renameat2(RENAME_NOREPLACE)`), never by a stat before the rename. Across file systems a
//! regular file is copied (the kernel's `copy_file_range`, bounded memory) into a staging file
//! beside the target, synced, committed the same way, and only then is the source removed.

use serde::Deserialize;

use super::{Ctx, Op};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::Json;
use crate::locks::LockMode;
use crate::methods::Empty;
use crate::sandbox::mutate::{self, Parent};
use crate::sandbox::open;
use crate::throttle::{self, Prepaid};
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

/// `files/rename` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    old_path: String,
    new_path: String,
    #[serde(default)]
    overwrite: bool,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Json<Empty>> {
    let started = Instant::now();
    let params = Arc::new(params);
    let unpaid = Prepaid::new(ctx.broker.rate_limits(), ctx.state.id, 0);
    let first = Arc::clone(&params);
    let moved = ctx
        .owned_since(started)
        .run(move |op| rename(op, &first, &unpaid, true))
        .await?;
    match moved {
        Moved::Done => Ok(Json(Empty {})),
        // Across file systems, and the copy not paid for: it is paid here, off the pool, and
        // the move tried again (nothing was changed by the first try).
        Moved::PayFirst(bytes) => {
            let prepaid = super::op::pay_ahead(ctx, started, bytes).await?;
            ctx.owned_since(started)
                .run(move |op| rename(op, &params, &prepaid, false))
                .await?;
            Ok(Json(Empty {}))
        }
    }
}

/// What a try at a rename did.
enum Moved {
    Done,
    /// Nothing: the move is a copy of this many bytes, to be paid for first.
    PayFirst(u64),
}

fn rename(op: &Op, p: &Params, prepaid: &Prepaid, may_hand_back: bool) -> Result<Moved> {
    let (old_raw, new_raw) = (p.old_path.as_str(), p.new_path.as_str());
    let from = op.resolve(old_raw)?;
    let to = op.resolve(new_raw)?;
    mutate::require_writable(&from, old_raw)?;
    mutate::require_writable(&to, new_raw)?;
    if from.is_root() {
        return Err(mutate::root_itself("renamed", old_raw));
    }
    if to.is_root() {
        return Err(mutate::root_itself("replaced", new_raw));
    }
    let src = mutate::open_parent(&from, old_raw)?;
    let dst = mutate::open_parent(&to, new_raw)?;
    op.authorize(from.root(), &src.real, old_raw)?;
    op.authorize(to.root(), &dst.real, new_raw)?;
    let Some(kind) = src.entry_type(old_raw)? else {
        return Err(
            Error::new(ErrorKind::FileNotFound, "no such file or directory").with_path(old_raw),
        );
    };
    let _src_lock = op.lock(&src.key, LockMode::Exclusive, old_raw)?;
    // A rename onto itself changes nothing, and answers alike whatever the entry holds:
    // checking its tree first would tell a directory holding denied files from an empty one.
    if src.key == dst.key {
        src.check_change("renamed", old_raw)?;
        return Ok(Moved::Done);
    }
    let _dst_lock = op.lock(&dst.key, LockMode::Exclusive, new_raw)?;
    op.commit()?;
    let deadline = op.started + op.policy.limits().timeout;
    match mutate::rename(&src, &dst, p.overwrite, deadline, old_raw, new_raw)? {
        Ok(()) => {}
        Err(rustix::io::Errno::XDEV) if kind.is_file() => {
            // A copy reads the whole file: it pays for it as a read would, before reading (the
            // byte rate bounds the disk work), within the request's time; ahead, off the pool,
            // on the first try, here only for what the file grew since.
            let pay = |bytes: u64| {
                if may_hand_back && !prepaid.covers(bytes) {
                    return Err(Copied::PayFirst(bytes));
                }
                let go_on = || std::time::Instant::now() < deadline;
                match prepaid.pay(bytes, go_on) {
                    true => Ok(()),
                    false => Err(Copied::Unpaid),
                }
            };
            match copy_across(&src, &dst, p.overwrite, new_raw, pay) {
                Ok(()) => {}
                Err(Copied::PayFirst(bytes)) => return Ok(Moved::PayFirst(bytes)),
                Err(Copied::Unpaid) => return Err(throttle::timed_out(op.policy.limits().timeout)),
                Err(Copied::Failed(e)) => return Err(e),
            }
        }
        Err(rustix::io::Errno::XDEV) => {
            return Err(Error::new(
                ErrorKind::Io,
                format!("cannot move {} across file systems", open::describe(kind)),
            )
            .with_path(old_raw));
        }
        Err(e) => return Err(rename_error(e, p.overwrite, old_raw, new_raw)),
    }
    dst.sync().map_err(|e| e.or_path(new_raw))?;
    src.sync().map_err(|e| e.or_path(old_raw))?;
    Ok(Moved::Done)
}

fn rename_error(e: rustix::io::Errno, overwrite: bool, old_raw: &str, new_raw: &str) -> Error {
    use rustix::io::Errno;
    match e {
        Errno::EXIST => Error::new(
            ErrorKind::AlreadyExists,
            "the target exists (set overwrite to replace it)",
        )
        .with_path(new_raw),
        Errno::NOTEMPTY if !overwrite => Error::new(
            ErrorKind::AlreadyExists,
            "the target exists (set overwrite to replace it)",
        )
        .with_path(new_raw),
        Errno::NOTEMPTY => {
            Error::new(ErrorKind::Io, "the target is a non-empty directory").with_path(new_raw)
        }
        Errno::INVAL => Error::new(
            ErrorKind::InvalidPath,
            "cannot move a directory inside itself",
        )
        .with_path(new_raw),
        Errno::ISDIR => Error::new(
            ErrorKind::InvalidPath,
            "cannot replace a directory with a file",
        )
        .with_path(new_raw),
        Errno::NOTDIR => Error::new(
            ErrorKind::InvalidPath,
            "cannot replace a file with a directory",
        )
        .with_path(new_raw),
        // The kernel does not say which of the two names was too long; the longer one was.
        Errno::NAMETOOLONG if new_raw.len() > old_raw.len() => Error::from_io(&e.into(), new_raw),
        other => Error::from_io(&other.into(), old_raw),
    }
}

/// Why a move across file systems did not happen.
enum Copied {
    /// The byte rate was not paid in time: nothing was copied.
    Unpaid,
    /// Not paid for ahead: nothing was copied, and the async side pays this many bytes.
    PayFirst(u64),
    Failed(Error),
}

impl From<Error> for Copied {
    fn from(e: Error) -> Copied {
        Copied::Failed(e)
    }
}

/// Moves a regular file to another file system: pay for its bytes (`pay`),
/// copy into a staging file beside the target, commit it (without replacing unless
/// `overwrite`), then remove the source.
fn copy_across(
    src: &Parent,
    dst: &Parent,
    overwrite: bool,
    new_raw: &str,
    pay: impl Fn(u64) -> std::result::Result<(), Copied>,
) -> std::result::Result<(), Copied> {
    let (mut file, meta) = src.open_existing(new_raw)?;
    pay(meta.len())?;
    let mut staged = dst.stage(new_raw)?;
    // What was paid for; a file another program changes meanwhile is not moved, since
    // removing the source would lose what the copy missed.
    let copied = std::io::copy(&mut (&mut file).take(meta.len()), staged.file())
        .map_err(|e| Error::from_io(&e, new_raw))?;
    let now = file.metadata().map_err(|e| Error::from_io(&e, new_raw))?;
    if copied != meta.len() || now.len() != meta.len() {
        return Err(Error::new(
            ErrorKind::ConcurrencyConflict,
            "the file changed while it was being moved; nothing was moved",
        )
        .with_path(new_raw)
        .into());
    }
    staged.finish(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o7777,
        new_raw,
    )?;
    dst.commit_with(staged, overwrite, new_raw)
        .map(drop)
        .map_err(|e| match e.kind() {
            ErrorKind::AlreadyExists => Error::new(
                ErrorKind::AlreadyExists,
                "the target exists (set overwrite to replace it)",
            )
            .with_path(new_raw),
            _ => e,
        })?;
    src.dir
        .remove_file(&src.name)
        .map_err(|e| Error::from_io(&e, new_raw).into())
}

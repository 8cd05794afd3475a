//! *ext* `files/checksum {path, offset?, length?, algorithm?}` →
//! `{algorithm, sha256, size, offset, length, eof, etag}`: the SHA-256 of a file, or of a range
//! of it, without its content. A client that moved a large file in chunks checks the whole
//! arrived intact (as sftp's `check-file` extension and object stores' checksums do).

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::digest;
use crate::error::{Error, Result};
use crate::jsonrpc::Json;
use crate::locks::LockMode;
use crate::sandbox::open::{self, RegularFile};
use crate::throttle::{self, Prepaid};
use std::time::Instant;

/// `files/checksum` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(default)]
    offset: u64,
    /// Bytes to hash from `offset`; absent: to the end of the file. Not clamped to
    /// `max_chunk_size`: nothing of the content is sent.
    length: Option<u64>,
    /// Only `"sha256"` (case-insensitive), the default.
    algorithm: Option<String>,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    algorithm: &'static str,
    sha256: String,
    /// The whole file's size.
    size: u64,
    offset: u64,
    /// Bytes the hash covers: fewer than asked when the file ends first.
    length: u64,
    eof: bool,
    etag: String,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, p: Params) -> Result<Json<Reply>> {
    if let Some(a) = &p.algorithm {
        if !a.eq_ignore_ascii_case("sha256") {
            return Err(Error::invalid_params(format!(
                "unknown algorithm {a:?}: only \"sha256\" is offered"
            )));
        }
    }
    // The bytes hashed count against the session's byte rate as a read's would: the rate
    // bounds how much of the person's disk a server reads, whatever it does with it. So a
    // spent budget refuses before any work, and the range is paid for before it is hashed,
    // waiting on this side, not on a thread of the pool.
    ctx.broker.rate_limits().admit_start(ctx.state.id)?;
    let started = Instant::now();
    let (path, offset, length) = (p.path.clone(), p.offset, p.length);
    let probe = move |op: &Op| Ok(range(&op.open_readable(&path)?.1, offset, length));
    let prepaid = super::op::prepay(ctx, started, probe).await?;
    let reply = ctx
        .owned_since(started)
        .run(move |op| checksum(op, p, &prepaid))
        .await?;
    Ok(Json(reply))
}

/// Bytes of `opened` the hash covers.
fn range(opened: &RegularFile, offset: u64, length: Option<u64>) -> u64 {
    let size = opened.meta.len();
    size.saturating_sub(offset).min(length.unwrap_or(u64::MAX))
}

fn checksum(op: &Op, p: Params, prepaid: &Prepaid) -> Result<Reply> {
    let (target, opened) = op.open_readable(&p.path)?;
    // A shared lock, as a read takes: an upload or a kept lock of another session makes this
    // FILE_LOCKED rather than a hash of half-written bytes.
    let key = target.root().join(&opened.real);
    let _lock = op.lock(&key, LockMode::Shared, &p.path)?;
    let len = range(&opened, p.offset, p.length);
    let size = opened.meta.len();
    let deadline = &op.deadline;
    // A large file takes a while: the hash stops at the deadline (the caller has its
    // TIMEOUT by then) instead of holding a pool thread to the end.
    let go_on = || !deadline.expired();
    // Each piece draws on what was paid ahead (only a file grown since pays here): a whole
    // piece, or the range's last bytes (a 10-byte file costs 10 bytes, not a piece).
    let left = std::cell::Cell::new(len);
    let paced = || {
        let piece = left.get().min(digest::PIECE as u64);
        left.set(left.get() - piece);
        go_on() && prepaid.pay(piece, go_on)
    };
    let hashed = digest::hash_range(&opened.file, p.offset, len, paced)
        .map_err(|e| Error::from_io(&e, &p.path))?;
    let Some((sha256, length)) = hashed else {
        return Err(throttle::timed_out(op.policy.limits().timeout));
    };
    Ok(Reply {
        algorithm: "sha256",
        sha256,
        size,
        offset: p.offset,
        length,
        eof: p.offset.saturating_add(length) >= size,
        etag: open::etag(&opened.meta),
    })
}

//! A write without `offset`: an atomic replace (or an append), committed in one step.

use super::check::{Check, mismatch};
use super::mode::mode_for;
use super::{Reply, Request, check_preconditions, existing, recheck_if_match, too_large};
use crate::digest;
use crate::error::{Error, Result};
use crate::locks::LockMode;
use crate::methods::Op;
use crate::sandbox::mutate::Parent;
use crate::sandbox::open;
use crate::throttle::{self, Prepaid};

pub(super) fn replace(
    op: &Op,
    p: &Request,
    parent: &Parent,
    data: &[u8],
    raw: &str,
    prepaid: &Prepaid,
) -> Result<Reply> {
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
    if p.append && !prepaid.pay(kept, || !op.deadline.expired()) {
        return Err(throttle::timed_out(op.policy.limits().timeout));
    }
    let mut staged = parent.stage(raw)?;
    if let (true, Some((file, _))) = (p.append, current.as_ref()) {
        // What was paid for and checked against max_file_size: a file another program
        // grows meanwhile is appended to as it was when it was locked.
        let mut src = std::io::Read::take(file, kept);
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

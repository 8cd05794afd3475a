//! The `[limits]` table, checked once at load: every limit in range and consistent with the
//! others, so no request ever meets a limit of 0 or a chunk larger than its maximum.

use std::time::Duration;

use super::{LimitsFile, PolicyError};

/// Validated limits (docs/policy.md, `[limits]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Default read length.
    pub chunk_size: usize,
    /// Largest read or write payload.
    pub max_chunk_size: usize,
    /// Largest file a write may produce.
    pub max_file_size: u64,
    /// Per-operation time limit.
    pub timeout: Duration,
    /// Requests per second per session; 0 = unlimited.
    pub requests_per_second: u32,
    /// Burst above the request rate.
    pub request_burst: u32,
    /// Payload bytes per second per session; 0 = unlimited.
    pub bytes_per_second: u64,
    /// Watches per session.
    pub max_watches: u32,
    /// Entries per `files/list` page.
    pub max_list_entries: usize,
    /// Kept locks per session.
    pub max_locks: u32,
    /// Lifetime of a kept lock.
    pub lock_timeout: Duration,
    /// Requests of one session handled at once.
    pub max_in_flight: usize,
    /// Unfinished uploads per session.
    pub max_uploads: usize,
    /// Sessions a `serve --listen` broker serves at once.
    pub max_sessions: usize,
    /// Bytes of partial request lines held across every connection of a broker.
    pub max_pending_input: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // The file defaults are valid by construction.
        Limits::from_file(&LimitsFile::default()).unwrap_or_else(|_| unreachable!())
    }
}

impl Limits {
    pub(super) fn from_file(f: &LimitsFile) -> Result<Limits, PolicyError> {
        let positive = |key: &'static str, v: u64| {
            if v == 0 {
                Err(PolicyError::Limit {
                    key,
                    reason: "must be greater than 0".into(),
                })
            } else {
                Ok(v)
            }
        };
        let as_usize = |key: &'static str, v: u64| {
            usize::try_from(v).map_err(|_| PolicyError::Limit {
                key,
                reason: format!("{v} is too large for this machine"),
            })
        };
        let chunk_size = as_usize("chunk_size", positive("chunk_size", f.chunk_size)?)?;
        let max_chunk_size = as_usize(
            "max_chunk_size",
            positive("max_chunk_size", f.max_chunk_size)?,
        )?;
        if chunk_size > max_chunk_size {
            return Err(PolicyError::Limit {
                key: "chunk_size",
                reason: format!("{chunk_size} is larger than max_chunk_size ({max_chunk_size})"),
            });
        }
        // A chunk is sent as base64 on one line; keep it well inside what the framer accepts
        // (and what servers can be expected to allocate).
        const MAX_CHUNK: u64 = 16 << 20;
        if f.max_chunk_size > MAX_CHUNK {
            return Err(PolicyError::Limit {
                key: "max_chunk_size",
                reason: format!(
                    "{} is above the supported maximum of {MAX_CHUNK}",
                    f.max_chunk_size
                ),
            });
        }
        Ok(Limits {
            chunk_size,
            max_chunk_size,
            max_file_size: positive("max_file_size", f.max_file_size)?,
            timeout: Duration::from_millis(positive("timeout_ms", f.timeout_ms)?),
            requests_per_second: f.requests_per_second,
            request_burst: f.request_burst,
            bytes_per_second: f.bytes_per_second,
            max_watches: f.max_watches,
            max_list_entries: as_usize(
                "max_list_entries",
                positive("max_list_entries", f.max_list_entries.into())?,
            )?,
            max_locks: f.max_locks,
            lock_timeout: Duration::from_millis(positive("lock_timeout_ms", f.lock_timeout_ms)?),
            max_in_flight: as_usize(
                "max_in_flight",
                positive("max_in_flight", f.max_in_flight.into())?,
            )?,
            max_uploads: as_usize(
                "max_uploads",
                positive("max_uploads", f.max_uploads.into())?,
            )?,
            max_sessions: as_usize(
                "max_sessions",
                positive("max_sessions", f.max_sessions.into())?,
            )?,
            max_pending_input: as_usize(
                "max_pending_input",
                positive("max_pending_input", f.max_pending_input)?,
            )?,
        })
    }
}

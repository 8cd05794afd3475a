//! How a log file ends: the head a broker continues the chain from, read back from the end
//! of the file, and what is wrong when it cannot be (a torn last line, a file that is not an
//! audit log).
//!
//! Every append reads the head again when another broker has appended since; this is that
//! read, bounded so that a file that is not a log cannot make it hold much in memory.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

use super::{AuditError, GENESIS};
pub use crate::limits::MAX_LINE;

/// How a log file ends.
pub(super) enum Tail {
    /// Nothing in it.
    Empty,
    /// A complete last line: its hash, and whether it is a `rotate` line and which file it
    /// names.
    Line {
        hash: String,
        rotate: Option<String>,
    },
    /// A last line without its newline (a broker killed in the middle of its write): where the
    /// complete lines end, and the torn piece.
    Torn { complete: u64, piece: Vec<u8> },
}

/// Reads how the file ends, scanning back from the end once (each byte read at most twice,
/// however long the last line).
pub(super) fn tail(mut file: &File, path: &Path) -> Result<Tail, AuditError> {
    let len = file
        .seek(SeekFrom::End(0))
        .map_err(|source| AuditError::Io {
            path: path.to_owned(),
            source,
        })?;
    tail_until(file, path, len)
}

/// [`tail`] of the file's first `len` bytes.
pub(super) fn tail_until(mut file: &File, path: &Path, len: u64) -> Result<Tail, AuditError> {
    let io = |source| AuditError::Io {
        path: path.to_owned(),
        source,
    };
    let too_long = || AuditError::Broken {
        path: path.to_owned(),
        line: count_lines(file).unwrap_or(0),
        reason: format!(
            "its last line is longer than {MAX_LINE} bytes, which no line fsbroker writes is; \
             is this an audit log?"
        ),
    };
    if len == 0 {
        return Ok(Tail::Empty);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1)).map_err(io)?;
    file.read_exact(&mut last).map_err(io)?;
    let whole = last[0] == b'\n';
    let end = if whole { len - 1 } else { len };
    // The last line starts after the last newline before `end`.
    let mut start = 0;
    let mut pos = end;
    let mut chunk = vec![0u8; 64 << 10];
    while pos > 0 {
        let step = pos.min(chunk.len() as u64);
        pos -= step;
        let piece = &mut chunk[..step as usize];
        file.seek(SeekFrom::Start(pos)).map_err(io)?;
        file.read_exact(piece).map_err(io)?;
        if let Some(i) = memchr::memrchr(b'\n', piece) {
            start = pos + i as u64 + 1;
            break;
        }
        if end - pos > MAX_LINE {
            return Err(too_long());
        }
    }
    if end - start > MAX_LINE {
        return Err(too_long());
    }
    let mut line = vec![0u8; (end - start) as usize];
    file.seek(SeekFrom::Start(start)).map_err(io)?;
    file.read_exact(&mut line).map_err(io)?;
    if !whole {
        return Ok(Tail::Torn {
            complete: start,
            piece: line,
        });
    }
    let broken = |reason: &str| {
        // Name the line the way `verify` counts: from 1.
        let line = count_lines(file).unwrap_or(0);
        AuditError::Broken {
            path: path.to_owned(),
            line,
            reason: reason.to_owned(),
        }
    };
    let last: BTreeMap<String, Value> = serde_json::from_slice(&line)
        .map_err(|_| broken("the last line is not an audit record; is this an audit log?"))?;
    let hash = match last.get("hash").and_then(Value::as_str) {
        Some(h) if h.len() == 64 => h.to_owned(),
        _ => return Err(broken("the last line has no hash; is this an audit log?")),
    };
    let rotate = (last.get("event").and_then(Value::as_str) == Some("rotate")).then(|| {
        last.get("file")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    });
    Ok(Tail::Line { hash, rotate })
}

/// The `hash` of the file's last line, or [`GENESIS`] for an empty file; an error for a torn
/// last line.
pub(super) fn last_hash(file: &File, path: &Path) -> Result<String, AuditError> {
    match tail(file, path)? {
        Tail::Empty => Ok(GENESIS.to_owned()),
        Tail::Line { hash, .. } => Ok(hash),
        Tail::Torn { .. } => Err(AuditError::Broken {
            path: path.to_owned(),
            line: count_lines(file).unwrap_or(0),
            reason: "the last line is incomplete".to_owned(),
        }),
    }
}

/// How many lines the file has, a last line without its newline included (read in pieces,
/// for an error message).
pub(super) fn count_lines(file: &File) -> std::io::Result<usize> {
    let mut file = file.try_clone()?;
    file.seek(SeekFrom::Start(0))?;
    let mut newlines = 0;
    let mut last = b'\n';
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        newlines += memchr::memchr_iter(b'\n', &buf[..n]).count();
        last = buf[n - 1];
    }
    Ok(newlines + usize::from(last != b'\n'))
}

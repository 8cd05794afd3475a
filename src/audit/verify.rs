//! `fsbroker audit verify`: checks a log's chain, across the files it was rolled over into.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chain::{canonical, sha256_hex};
use super::{AuditError, GENESIS};

/// What [`verify_files`] found in an intact log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Summary {
    /// Lines in the log (in all its files).
    pub lines: usize,
    /// The first line's `ts`.
    pub first: Option<String>,
    /// The last line's `ts`.
    pub last: Option<String>,
    /// The last line's `hash` ([`GENESIS`] for an empty log): what to keep elsewhere to
    /// detect, later, that the log was cut or rewritten before it.
    pub head: String,
    /// The pids of runs that started and have no seal after their start: brokers still
    /// running, or that crashed, or whose last lines were removed.
    pub unsealed: Vec<u64>,
    /// The last `seal` line's `ts`: when a run last ended cleanly.
    pub last_seal: Option<String>,
    /// Whether the anchor given to [`verify_files`] is the hash of a line of the log.
    pub anchor_found: bool,
    /// The first file given continues an earlier one (its first line is a `continue` line):
    /// the earlier file's name as that line gives it. Its runs' starts are in that file, so a
    /// run of it without a seal is not reported.
    pub continues_from: Option<String>,
    /// The last file given ends in a `rotate` line: the log goes on in a later file, which
    /// holds the seals of the runs still open.
    pub continued: bool,
}

/// Checks every line's hash and link; the error names the first bad line.
pub fn verify(path: &Path) -> Result<Summary, AuditError> {
    verify_files(&[path.to_owned()], None)
}

/// [`verify`], also looking for `anchor` (a head kept from an earlier `audit head`) among the
/// lines' hashes.
pub fn verify_anchored(path: &Path, anchor: Option<&str>) -> Result<Summary, AuditError> {
    verify_files(&[path.to_owned()], anchor)
}

/// Checks one log kept in several files, oldest first (the files a roll-over kept, then the
/// current one): each file's lines as [`verify`] does, and each file after the first must
/// begin with a `continue` line chained to the last line of the file before it (a `rotate`
/// line when the broker rolled the log over; any line when the file was moved away or
/// emptied outside it). A file left out, or given out of order, breaks the chain at its
/// successor's first line.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let log = dir.path().join("audit.jsonl");
/// std::fs::write(&log, "not a log\n")?;
/// // Anything but an intact chain is an error naming the file and the line.
/// assert!(fsbroker::audit::verify_files(&[log], None).is_err());
/// # Ok(()) }
/// ```
pub fn verify_files(paths: &[PathBuf], anchor: Option<&str>) -> Result<Summary, AuditError> {
    let mut summary = Summary {
        head: GENESIS.to_owned(),
        anchor_found: anchor == Some(GENESIS),
        ..Summary::default()
    };
    // Runs still open, by pid; a pid that starts again while open was a run that never sealed.
    let mut open: Vec<(u64, Option<u64>)> = Vec::new();
    let mut unsealed: Vec<u64> = Vec::new();
    let mut prev = GENESIS.to_owned();
    // Whether the line before was a `rotate` line (ending its file).
    let mut rotated = false;
    for (index, path) in paths.iter().enumerate() {
        let io = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        let broken = |line: usize, reason: String| AuditError::Broken {
            path: path.clone(),
            line,
            reason,
        };
        // Line by line: a log of any size is checked in the memory of its longest line.
        let mut reader =
            std::io::BufReader::with_capacity(256 << 10, std::fs::File::open(path).map_err(io)?);
        let mut raw = Vec::new();
        let mut n = 0;
        loop {
            raw.clear();
            let read = std::io::Read::take(&mut reader, super::MAX_LINE + 1)
                .read_until(b'\n', &mut raw)
                .map_err(io)?;
            if read == 0 {
                break;
            }
            n += 1;
            if raw.last() != Some(&b'\n') && raw.len() as u64 > super::MAX_LINE {
                return Err(broken(
                    n,
                    format!(
                        "longer than {} bytes, which no line fsbroker writes is",
                        super::MAX_LINE
                    ),
                ));
            }
            if raw.pop() != Some(b'\n') {
                return Err(broken(n, "incomplete line (no newline at the end)".into()));
            }
            let raw = raw.as_slice();
            let mut fields: BTreeMap<String, Value> = serde_json::from_slice(raw)
                .map_err(|e| broken(n, format!("not a JSON object: {e}")))?;
            let Some(Value::String(hash)) = fields.remove("hash") else {
                return Err(broken(n, "no hash".into()));
            };
            let event = fields
                .get("event")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let line_prev = fields.get("prev").and_then(Value::as_str).unwrap_or("");
            let continues = event.as_deref() == Some("continue");
            if n == 1 && index == 0 && !continues && event.as_deref() != Some("start") {
                return Err(broken(
                    n,
                    "a log begins with a broker's start line (or, carried on from another \
                     file, a continue line): lines before this one were removed"
                        .into(),
                ));
            }
            if n == 1 && index == 0 && continues {
                // The log was verified from a file a roll-over began: its predecessor's head
                // is taken on trust (verify the files together to check it).
                prev = line_prev.to_owned();
                // Without `from`, the file before was moved, removed or emptied outside the
                // broker, which then linked this file to it.
                summary.continues_from = Some(
                    fields
                        .get("from")
                        .and_then(Value::as_str)
                        .unwrap_or("an earlier file (moved, removed or emptied outside fsbroker)")
                        .to_owned(),
                );
            } else if n == 1 && index > 0 && !continues {
                return Err(broken(
                    n,
                    format!(
                        "does not continue {}: a file that carries a log on starts with a \
                         `continue` line",
                        paths[index - 1].display()
                    ),
                ));
            }
            if line_prev != prev {
                let reason = if n == 1 && index > 0 {
                    format!(
                        "does not follow the last line of {}: a file was left out, or the \
                         files are out of order",
                        paths[index - 1].display()
                    )
                } else {
                    "does not follow the line before it: a line was removed, reordered or \
                     inserted here"
                        .to_owned()
                };
                return Err(broken(n, reason));
            }
            // The hash covers the exact bytes written, which must be the line's one canonical
            // form: a line re-spaced, re-ordered, re-escaped or with a key given twice is not
            // what the broker wrote, even if it says the same.
            let mut whole = fields.clone();
            whole.insert("hash".to_owned(), Value::String(hash.clone()));
            if canonical(&whole) != raw {
                return Err(broken(
                    n,
                    "it is not byte for byte the form the broker writes: the line was \
                     reformatted or edited"
                        .into(),
                ));
            }
            if sha256_hex(&canonical(&fields)) != hash {
                return Err(broken(
                    n,
                    "its hash does not match its content: the line was edited".into(),
                ));
            }
            let ts = fields.get("ts").and_then(Value::as_str).map(str::to_owned);
            if summary.first.is_none() {
                summary.first = ts.clone();
            }
            // A run is its pid and, when its lines name it, its first session id (pids are
            // reused, and brokers in other pid namespaces may share the log).
            let pid = fields.get("pid").and_then(Value::as_u64);
            let run = fields.get("firstSession").and_then(Value::as_u64);
            match (event.as_deref(), pid) {
                (Some("start"), Some(pid)) => {
                    if let Some(i) = open.iter().position(|&(p, _)| p == pid) {
                        // The same pid started again without a seal: that run never sealed.
                        unsealed.push(open.remove(i).0);
                    }
                    open.push((pid, run));
                }
                (Some("seal"), Some(pid)) => {
                    summary.last_seal = ts.clone();
                    open.retain(|&(p, r)| {
                        !(p == pid && (run.is_none() || r.is_none() || r == run))
                    });
                }
                _ => {}
            }
            rotated = event.as_deref() == Some("rotate");
            summary.anchor_found |= anchor == Some(hash.as_str());
            summary.last = ts;
            summary.lines += 1;
            prev = hash;
        }
        // An empty log is an intact (empty) chain; an empty file after another is not.
        if n == 0 && index > 0 {
            return Err(broken(
                1,
                "empty, but it should continue the file before it".into(),
            ));
        }
    }
    summary.continued = rotated;
    // Runs still open when the log goes on in a later file may seal there.
    if !rotated {
        unsealed.extend(open.iter().map(|&(pid, _)| pid));
    }
    summary.unsealed = unsealed;
    summary.head = prev;
    Ok(summary)
}

//! Appending one line: under the log's lock, after whatever the file needs first.
//!
//! Several brokers may append to one file. Each append takes the log's lock, follows the log
//! to its new file when another broker rolled it over, reads the head again when another
//! broker appended, mends a line torn by a broker killed mid-write, links a file emptied or
//! replaced outside fsbroker to the old head, and rolls over when the line would pass
//! `max_bytes` (`rotate.rs`). Each line goes to the copies before the lock is let go, so the
//! copies get every broker's lines in the file's order.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::chain::{Fields, chain_line, sha256_hex};
use super::copy::{Copies, Notice};
use super::tail::{Tail, last_hash, tail, tail_until};
use super::{AuditError, AuditLog, GENESIS, event, rotate};

/// The log's end as this broker knows it: the open file, its head and length after this
/// broker's last append, and where lines are copied.
pub(super) struct Chain {
    pub(super) file: File,
    pub(super) prev: String,
    /// The file's length after this process's last append: if it has grown since, another
    /// process appended, and `prev` is read again from the file.
    pub(super) len: u64,
    /// Where each line is sent besides the file.
    pub(super) copies: Copies,
    /// The head of a file that was moved away, removed or emptied outside the broker: the
    /// next line, if it is the first of the file now at the path, is preceded by a `continue`
    /// line chained to it, so the log's history stays linked (and its loss visible).
    pub(super) carry: Option<String>,
}

/// What a file needs before a broker's line ([`AuditLog::settle`]).
enum Settled {
    /// Nothing: the line goes next.
    Ready,
    /// This line first (`continue` or `torn`), chained to the head.
    Write(Fields),
    /// The file ends in a `rotate` line naming `kept`, which is this same file, still at the
    /// path: a roll-over to finish.
    Unrolled(PathBuf),
}

impl AuditLog {
    /// Chains and appends one line, and sends it to the copies, waiting for the log until
    /// `until` at most (`None`: as long as it takes). On a failed write the log turns
    /// unhealthy for good; a line that only came too late ([`AuditError::Late`]) leaves it
    /// as it was.
    pub(super) fn append(&self, fields: Fields, until: Option<Instant>) -> Result<(), AuditError> {
        if !self.health.file_ok() {
            return Err(AuditError::Unavailable {
                path: self.path.clone(),
            });
        }
        let late = |reason: String| AuditError::Late {
            path: self.path.clone(),
            reason,
        };
        // Other threads of this broker wait for their lines here: the wait is bounded like
        // the one for the file's lock (each holder waits until its own deadline at most).
        let mut guard = loop {
            match self.chain.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    if until.is_some_and(|u| Instant::now() >= u) {
                        return Err(late("other lines of this broker are still waiting".into()));
                    }
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        };
        let chain = &mut *guard;
        let mut result = Ok(());
        // A lost or resumed copy is itself recorded; the bound only guards against a copy
        // that flaps on every line.
        let mut notices_left = 8;
        let mut queue = VecDeque::from([fields]);
        while let Some(fields) = queue.pop_front() {
            let notices = match self.write(chain, fields, until) {
                Ok(notices) => notices,
                Err(source) if source.kind() == std::io::ErrorKind::TimedOut => {
                    tracing::warn!(path = %self.path.display(), error = %source, "an audit line waited past its deadline");
                    return Err(late(source.to_string()));
                }
                Err(source) => {
                    self.health.file.store(false, Ordering::Release);
                    tracing::error!(path = %self.path.display(), error = %source, "audit log unavailable: refusing every audited request from now on");
                    return Err(AuditError::Io {
                        path: self.path.clone(),
                        source,
                    });
                }
            };
            for notice in notices {
                if let (true, Notice::Lost { to, socket, error }) = (self.require_copies, &notice) {
                    self.health.copy_down.store(true, Ordering::Release);
                    tracing::error!(path = %self.path.display(), to, "an audit copy was lost and require_copies is set: refusing audited requests until it is back");
                    result = Err(AuditError::CopyLost {
                        path: self.path.clone(),
                        to,
                        socket: socket.clone(),
                        error: error.clone(),
                    });
                }
                if notices_left > 0 {
                    notices_left -= 1;
                    let mut f = notice.fields();
                    f.insert("ts", Value::from(crate::rfc3339::format(SystemTime::now())));
                    f.insert("pid", Value::from(std::process::id()));
                    queue.push_back(f);
                }
            }
        }
        if self.require_copies && chain.copies.all_up() {
            // Every copy is back (its `copy-resumed` line is written): requests may act again.
            self.health.copy_down.store(false, Ordering::Release);
        }
        result
    }

    /// Writes one line under the file's lock, with what it takes first: following the log to
    /// its new file when another broker rolled it over, reading the head again when another
    /// broker appended ([`AuditLog::settle`]), and rolling over when the line would pass
    /// `max_bytes`. Each line written is sent to the copies before the lock is let go, so the
    /// copies get the lines of every broker in the file's order (a copy is itself a chain).
    /// Returns the changes in the copies' state, to be recorded.
    fn write(
        &self,
        chain: &mut Chain,
        fields: Fields,
        until: Option<Instant>,
    ) -> std::io::Result<Vec<Notice>> {
        let mut notices = Vec::new();
        let mut rolled = false;
        loop {
            let lock = self.health.lock.take(until)?;
            if rotate::moved_away(&chain.file, &self.path)? {
                // Another broker rolled the log over, or the file was moved away or removed
                // (logrotate, a person): the log goes on in the file now at the path. The
                // old file's head, read under its lock (nobody appends to a file no longer at
                // the path), links a new empty file to it.
                chain.carry = last_hash(&chain.file, &self.path).ok();
                drop(lock);
                chain.file = rotate::open(&self.path, until)?;
                chain.len = u64::MAX;
                continue;
            }
            let len = chain.file.metadata()?.len();
            match self.settle(chain, len)? {
                Settled::Ready => {}
                Settled::Write(first) => {
                    // A line that links or mends the log goes first.
                    let (line, fields) = chain_line(&chain.prev, first);
                    self.put(chain, &line)?;
                    notices.extend(chain.copies.send(&line, &fields));
                    chain.prev = fields["hash"].as_str().unwrap_or_default().to_owned();
                    drop(lock);
                    continue;
                }
                Settled::Unrolled(kept) => {
                    // A broker died between a roll-over's rotate line and the new file: this
                    // one finishes it.
                    let next = self.finish_roll(&chain.file, &chain.prev, &kept)?;
                    if let Some((_, line, fields)) = &next {
                        notices.extend(chain.copies.send(line, fields));
                    }
                    drop(lock);
                    if let Some((file, _, _)) = next {
                        chain.file = file;
                        chain.len = u64::MAX;
                    }
                    continue;
                }
            }
            let (line, fields) = chain_line(&chain.prev, fields.clone());
            let full = self
                .max_bytes
                .is_some_and(|max| len > 0 && len + line.len() as u64 + 1 > max);
            // One roll-over per line: a line longer than max_bytes still goes in the new file.
            if full && !rolled {
                rolled = true;
                let rolled_over = self.roll(&chain.file, chain.len, &chain.prev)?;
                for (line, fields) in &rolled_over.lines {
                    notices.extend(chain.copies.send(line, fields));
                }
                drop(lock);
                match rolled_over.file {
                    Some(file) => {
                        let (last, last_fields) = &rolled_over.lines[1];
                        chain.len = last.len() as u64 + 1;
                        chain.prev = last_fields["hash"].as_str().unwrap_or_default().to_owned();
                        chain.file = file;
                    }
                    // Not rolled over: the full file takes the line (after the rotate line,
                    // if one went in: the head is read again).
                    None => chain.len = u64::MAX,
                }
                continue;
            }
            self.put(chain, &line)?;
            chain.prev = fields["hash"].as_str().unwrap_or_default().to_owned();
            notices.extend(chain.copies.send(&line, &fields));
            drop(lock);
            return Ok(notices);
        }
    }

    /// Appends `line` and its newline to the file (`chain.len` bytes long, its lock held) in
    /// one write. A write that fails part-way is cut back off, so no other broker finds a torn
    /// line; the caller then marks the log unavailable.
    fn put(&self, chain: &mut Chain, line: &[u8]) -> std::io::Result<()> {
        let len = chain.len;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
        if let Err(e) = (&chain.file).write_all(&bytes) {
            if let Err(cut) = chain.file.set_len(len) {
                tracing::error!(path = %self.path.display(), error = %cut, "cannot remove a partly written audit line");
            }
            chain.len = u64::MAX;
            return Err(e);
        }
        chain.len = len + bytes.len() as u64;
        Ok(())
    }

    /// Brings `chain` up to date with the file (`len` bytes, its lock held): its head when
    /// another broker appended, and what the file needs before this broker's line:
    /// - an empty file that replaced, or is, a file this broker wrote to (moved away, removed,
    ///   emptied: logrotate, a person) begins with a `continue` line chained to the old head;
    /// - a torn last line (a broker killed mid-write) is cut off, and a `torn` line records its
    ///   length, sha256 and first bytes;
    /// - a file still at the path that ends in a `rotate` line is a roll-over a broker did not
    ///   finish.
    fn settle(&self, chain: &mut Chain, len: u64) -> std::io::Result<Settled> {
        let other = |e: AuditError| std::io::Error::other(e.to_string());
        if len == 0 {
            if chain.len != u64::MAX && chain.len > 0 {
                // Emptied in place (logrotate's copytruncate, a person).
                chain.carry = Some(chain.prev.clone());
            }
            chain.len = 0;
            chain.prev = GENESIS.to_owned();
            return Ok(match chain.carry.take().filter(|h| h != GENESIS) {
                Some(head) => {
                    tracing::warn!(path = %self.path.display(), "the audit log was moved, removed or emptied outside fsbroker; the new file continues its chain");
                    chain.prev = head;
                    Settled::Write(event("continue"))
                }
                None => Settled::Ready,
            });
        }
        chain.carry = None;
        if len == chain.len {
            return Ok(Settled::Ready);
        }
        chain.len = len;
        match tail(&chain.file, &self.path).map_err(other)? {
            Tail::Empty => {
                chain.prev = GENESIS.to_owned();
                Ok(Settled::Ready)
            }
            Tail::Line { hash, rotate } => {
                chain.prev = hash;
                match rotate.map(|name| self.path.with_file_name(name)) {
                    Some(kept) if rotate::same_file(&chain.file, &kept) => {
                        Ok(Settled::Unrolled(kept))
                    }
                    _ => Ok(Settled::Ready),
                }
            }
            Tail::Torn { complete, piece } => {
                // Only a log is mended: what stays must end in a broker's line. Anything else
                // (one incomplete line, a text file named by mistake) is left as it is.
                if !matches!(
                    tail_until(&chain.file, &self.path, complete),
                    Ok(Tail::Line { .. })
                ) {
                    return Err(std::io::Error::other(
                        "the file ends in an incomplete line after no audit record: is it an \
                         audit log?",
                    ));
                }
                tracing::warn!(path = %self.path.display(), bytes = piece.len(), "the audit log ends in a torn line (a broker killed mid-write); cutting it off and recording it");
                chain.file.set_len(complete)?;
                chain.len = complete;
                chain.prev = last_hash(&chain.file, &self.path).map_err(other)?;
                let mut torn = event("torn");
                torn.insert("bytes", Value::from(piece.len()));
                torn.insert("sha256", Value::from(sha256_hex(&piece)));
                let head = String::from_utf8_lossy(&piece[..piece.len().min(256)]).into_owned();
                torn.insert("head", Value::from(head));
                Ok(Settled::Write(torn))
            }
        }
    }
}

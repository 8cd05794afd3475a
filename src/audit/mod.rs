//! The hash-chained audit log (docs/protocol.md, "Audit log").
//!
//! One JSON line per `roots/list` and `files/*` request, allowed or refused. Each line carries
//! `prev` (the previous line's `hash`, or 64 zeros) and `hash`: the hex sha256 of the line's
//! canonical JSON without `hash` (compact, keys sorted, UTF-8). Editing, removing, reordering
//! or inserting a line breaks the chain at that line, which [`verify`] names. File contents are
//! never logged; with `redact_paths`, neither are paths (their sha256 is).
//!
//! Several brokers may append to one file (each append holds the log's lock, a file in the
//! user's private runtime directory that no server can reach: `crate::rundir`); a log with
//! `max_bytes` rolls over to a new file that continues the chain (`rotate.rs`); every line can
//! also be sent, as it is written, to the machine's log collector (`copy.rs`).
//!
//! The log fails closed: once a line cannot be written, the broker refuses every audited
//! request (`IO_ERROR`, "audit log unavailable") rather than act unrecorded.

// Ambient `std::fs` calls are allowed here (clippy.toml): the audit log, its kept files and its collectors' sockets are the broker's own files.
#![allow(clippy::disallowed_methods)]

pub(crate) mod copy;
mod pending;
mod rotate;
mod verify;

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::policy::AuditConfig;
use crate::rundir::LockFile;
use copy::{Copies, Notice};
pub(crate) use pending::PendingLine;
pub use verify::{Summary, verify, verify_anchored, verify_files};

/// A line's members, before it is chained.
type Fields = BTreeMap<&'static str, Value>;

/// A line as written (without its newline) and its members.
type Line = (Vec<u8>, Fields);

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

/// What a roll-over did: the new file, if it is in place, and the lines written.
#[derive(Default)]
struct Rolled {
    file: Option<File>,
    lines: Vec<Line>,
}

/// The `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Why the audit log could not be opened or verified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The file could not be opened, read or written.
    #[error("audit log {path}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// An earlier write failed; the log accepts nothing more.
    #[error("audit log {path}: unavailable since an earlier write failed")]
    Unavailable {
        /// The log file.
        path: PathBuf,
    },
    /// A copy of the log could not be delivered, and the policy requires copies.
    #[error("audit log {path}: its copy to {to} ({socket}) was lost: {error}")]
    CopyLost {
        /// The log file.
        path: PathBuf,
        /// `syslog` or `journald`.
        to: &'static str,
        /// The collector's socket.
        socket: PathBuf,
        /// Why it could not be sent.
        error: String,
    },
    /// The line could not be written before its deadline: another process holds the log's
    /// lock, or a lease on its file. Nothing was written; the log still takes lines.
    #[error("audit log {path}: not written in time: {reason}")]
    Late {
        /// The log file.
        path: PathBuf,
        /// What it waited for.
        reason: String,
    },
    /// The chain is broken (or the file is not an audit log).
    #[error("audit log {path}: line {line}: {reason}")]
    Broken {
        /// The log file.
        path: PathBuf,
        /// The first bad line, counting from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// What one request did, for its audit line.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    /// The session's number.
    pub session: u64,
    /// The JSON-RPC method.
    pub method: &'a str,
    /// The request's `path` (or `oldPath`).
    pub path: Option<&'a str>,
    /// A rename's `newPath`.
    pub new_path: Option<&'a str>,
    /// A consent request's `requestedPaths`.
    pub paths: Option<&'a [String]>,
    /// `ok`, or the error's code.
    pub outcome: &'a str,
    /// Payload bytes read or written.
    pub bytes: u64,
    /// How long the request took.
    pub duration: Duration,
    /// The MCP server's name, when its transport learnt it (its own `serverInfo.name`).
    pub server: Option<&'a str>,
    /// Refusals over the session's request rate folded into this line (`alsoRefused`): they
    /// came since the session's previous such line, and got no line of their own.
    pub also_refused: u64,
}

struct Chain {
    file: File,
    prev: String,
    /// The file's length after this process's last append: if it has grown since, another
    /// process appended, and `prev` is read again from the file.
    len: u64,
    /// Where each line is sent besides the file.
    copies: Copies,
    /// The head of a file that was moved away, removed or emptied outside the broker: the
    /// next line, if it is the first of the file now at the path, is preceded by a `continue`
    /// line chained to it, so the log's history stays linked (and its loss visible).
    carry: Option<String>,
}

/// How long the broker's own lines (its start, a seal, a proxy's account) wait for the log:
/// they have no request deadline of their own, and must not wait forever either.
pub const OWN_LINE_WAIT: Duration = Duration::from_secs(10);

/// An open, append-only audit log.
pub struct AuditLog {
    path: PathBuf,
    redact: bool,
    max_bytes: Option<u64>,
    require_copies: bool,
    chain: Mutex<Chain>,
    health: Arc<Health>,
    /// The run's first session id, named by its start line and its seal.
    first_session: Option<u64>,
}

/// Whether the log takes lines, shared with the operations that must not act when it does
/// not ([`AuditLog::health`]).
#[derive(Debug)]
pub struct Health {
    /// False once the file could not be written.
    file: AtomicBool,
    /// True while a copy is down and `require_copies` is set: requests are refused, but the
    /// file still takes the broker's own lines (the loss itself, the seal, refusals).
    copy_down: AtomicBool,
    /// The lock every broker appending to this log takes (by the log's path, so it also
    /// orders a roll-over against the appends of other brokers).
    lock: LockFile,
}

impl Health {
    /// Whether audited requests may act.
    pub fn ok(&self) -> bool {
        self.file.load(Ordering::Acquire) && !self.copy_down.load(Ordering::Acquire)
    }

    fn file_ok(&self) -> bool {
        self.file.load(Ordering::Acquire)
    }

    /// Waits until `until` at most for the log to be free to take a line: work about to act
    /// checks this at its point of no return, so that a log held elsewhere makes it answer
    /// `TIMEOUT` without acting, rather than act and then find its line cannot be written.
    pub(crate) fn wait_free(&self, until: Instant) -> bool {
        self.lock.wait_free(until).is_ok()
    }
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.path)
            .field("redact", &self.redact)
            .field("healthy", &self.is_healthy())
            .finish()
    }
}

impl AuditLog {
    /// Opens (or creates, owner-only) the log and continues its chain from its last line.
    ///
    /// A log whose last line is incomplete (a crash mid-write, or a file that is not an audit
    /// log) is refused: appending to it would hide the damage inside a valid-looking chain.
    pub fn open(config: &AuditConfig) -> Result<AuditLog, AuditError> {
        AuditLog::open_run(config, None)
    }

    /// [`AuditLog::open`] for a broker whose session ids start at `first_session`: the start
    /// line says so (`firstSession`), which ties the sessions in the log to the process and
    /// version that served them.
    pub fn open_run(
        config: &AuditConfig,
        first_session: Option<u64>,
    ) -> Result<AuditLog, AuditError> {
        let path = config.path.clone();
        let io = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        let until = Instant::now() + OWN_LINE_WAIT;
        let file = rotate::open(&path, Some(until)).map_err(io)?;
        let lock = LockFile::for_file(&path).map_err(io)?;
        let copies = Copies::new(&config.copies).map_err(io)?;
        // The chain's head is read under the lock each append takes anyway ([`AuditLog::append`]).
        let log = AuditLog {
            redact: config.redact_paths,
            max_bytes: config.max_bytes,
            require_copies: config.require_copies,
            chain: Mutex::new(Chain {
                file,
                prev: GENESIS.to_owned(),
                len: u64::MAX,
                copies,
                carry: None,
            }),
            first_session,
            health: Arc::new(Health {
                file: AtomicBool::new(true),
                copy_down: AtomicBool::new(false),
                lock,
            }),
            path: path.clone(),
        };
        // A first line at start-up proves the log writable before any request can act (and
        // tells one run of the broker from the next). If it cannot be written, the broker
        // runs but refuses every audited request.
        {
            // A file that is not an audit log is refused before anything is written to it.
            // (A log whose last line was torn by a broker killed mid-write is mended by the
            // start line's append: see `AuditLog::settle`.)
            let chain = log.chain.lock().unwrap_or_else(|e| e.into_inner());
            let _lock = log.health.lock.take(Some(until)).map_err(io)?;
            if let Tail::Torn { complete, .. } = tail(&chain.file, &log.path)? {
                let mendable = complete > 0
                    && matches!(
                        tail_until(&chain.file, &log.path, complete),
                        Ok(Tail::Line { .. })
                    );
                if !mendable {
                    return Err(AuditError::Broken {
                        path: log.path.clone(),
                        line: count_lines(&chain.file).unwrap_or(0),
                        reason: "the file ends in an incomplete line after no audit record; \
                                 is this an audit log?"
                            .into(),
                    });
                }
            }
        }
        let mut start = event("start");
        start.insert("version", Value::from(env!("CARGO_PKG_VERSION")));
        if let Some(first) = first_session {
            start.insert("firstSession", Value::from(first));
        }
        let _ = log.append(start, Some(until));
        Ok(log)
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// False once a write has failed (or, with `require_copies`, a copy was lost): every
    /// audited request is then refused.
    pub fn is_healthy(&self) -> bool {
        self.health.ok()
    }

    /// The log's health, for work that checks it again at its point of no return: a request
    /// that began while the log was healthy must not act once it is not.
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// Appends one line. On failure the log turns unhealthy for good and the error is logged;
    /// with `require_copies`, a lost copy also fails it (the line is in the file).
    pub fn record(&self, r: &Record<'_>) -> Result<(), AuditError> {
        self.append(self.line(r), None)
    }

    /// [`AuditLog::record`], waiting for the log until `until` at most ([`AuditError::Late`]
    /// past it, with nothing written).
    pub fn record_until(&self, r: &Record<'_>, until: Instant) -> Result<(), AuditError> {
        self.append(self.line(r), Some(until))
    }

    /// [`AuditLog::record_until`] off the async threads: the line is built here, and written
    /// (which may wait for another broker's lock on the log, or for a slow log collector) on
    /// the blocking pool, so a stalled log holds up audited requests, not the broker.
    pub async fn record_async(
        log: Arc<AuditLog>,
        r: &Record<'_>,
        until: Instant,
    ) -> Result<(), AuditError> {
        let fields = log.line(r);
        Self::append_async(log, fields, until).await
    }

    /// Appends on the blocking pool, waiting for the log until `until` at most.
    async fn append_async(
        log: Arc<AuditLog>,
        fields: Fields,
        until: Instant,
    ) -> Result<(), AuditError> {
        let path = log.path.clone();
        tokio::task::spawn_blocking(move || log.append(fields, Some(until)))
            .await
            .unwrap_or_else(|e| {
                Err(AuditError::Io {
                    path,
                    source: std::io::Error::other(e.to_string()),
                })
            })
    }

    /// The line's members for one request (before chaining).
    fn line(&self, r: &Record<'_>) -> Fields {
        let mut fields: Fields = BTreeMap::new();
        fields.insert("ts", Value::from(crate::rfc3339::format(SystemTime::now())));
        fields.insert("session", Value::from(r.session));
        put_capped(
            &mut fields,
            ["method", "methodBytes", "methodDigest"],
            r.method,
            256,
        );
        let mut put_path = |keys: [&'static str; 3], hashed: &'static str, p: &str| {
            if self.redact {
                fields.insert(hashed, Value::from(sha256_hex(p.as_bytes())));
            } else {
                put_capped(&mut fields, keys, p, MAX_LOGGED_PATH);
            }
        };
        if let Some(p) = r.path {
            put_path(["path", "pathBytes", "pathDigest"], "pathSha256", p);
        }
        if let Some(p) = r.new_path {
            put_path(
                ["newPath", "newPathBytes", "newPathDigest"],
                "newPathSha256",
                p,
            );
        }
        if let Some(ps) = r.paths {
            // A server chooses how many paths it asks consent for, and how long: the line
            // keeps the first few (at most MAX_LOGGED_PATHS, and MAX_LOGGED_PATHS_BYTES of
            // them as written), the count and a digest of them all.
            let (key, list): (&str, Vec<Value>) = if self.redact {
                let kept = ps.iter().take(MAX_LOGGED_PATHS);
                (
                    "pathsSha256",
                    kept.map(|p| Value::from(sha256_hex(p.as_bytes())))
                        .collect(),
                )
            } else {
                let mut room = MAX_LOGGED_PATHS_BYTES;
                let mut list = Vec::new();
                for p in ps.iter().take(MAX_LOGGED_PATHS) {
                    let kept = cap_escaped(p, MAX_LOGGED_PATH.min(room));
                    if kept.is_empty() && !p.is_empty() {
                        break;
                    }
                    room -= escaped_len(kept);
                    list.push(Value::from(kept));
                }
                ("paths", list)
            };
            let whole = list.len() == ps.len()
                && list
                    .iter()
                    .zip(ps)
                    .all(|(kept, p)| self.redact || kept.as_str() == Some(p.as_str()));
            fields.insert(key, Value::from(list));
            if !whole {
                fields.insert("pathsCount", Value::from(ps.len()));
                let all = serde_json::to_vec(ps).unwrap_or_default();
                fields.insert("pathsDigest", Value::from(sha256_hex(&all)));
            }
        }
        if let Some(name) = r.server {
            put_capped(
                &mut fields,
                ["server", "serverBytes", "serverDigest"],
                name,
                256,
            );
        }
        if r.also_refused > 0 {
            fields.insert("alsoRefused", Value::from(r.also_refused));
        }
        fields.insert("outcome", Value::from(r.outcome));
        fields.insert("bytes", Value::from(r.bytes));
        fields.insert(
            "durationMs",
            Value::from((r.duration.as_secs_f64() * 1e6).round() / 1e3),
        );
        fields
    }

    /// Turns the log unhealthy for good: a request acted and its line could not be written
    /// even given a second deadline, so the log no longer tells everything that was done.
    pub(crate) fn fail_closed(&self, why: &AuditError) {
        self.health.file.store(false, Ordering::Release);
        tracing::error!(path = %self.path.display(), error = %why, "audit log unavailable: refusing every audited request from now on");
    }

    /// Chains and appends one line, and sends it to the copies, waiting for the log until
    /// `until` at most (`None`: as long as it takes). On a failed write the log turns
    /// unhealthy for good; a line that only came too late ([`AuditError::Late`]) leaves it
    /// as it was.
    fn append(&self, fields: Fields, until: Option<Instant>) -> Result<(), AuditError> {
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

    /// Rolls the log over, holding the full file's lock: the full file is kept under a new
    /// name and ends with a `rotate` line naming it; a new file at the path begins with a
    /// `continue` line whose `prev` is that line's hash. The path is never missing (the new
    /// file replaces it in one rename), so a broker starting meanwhile opens one or the other,
    /// and a broker still holding the full file finds out at its next append
    /// (`rotate::moved_away`).
    ///
    /// The new file is ready before the full one is touched: when the roll-over cannot be
    /// prepared (no hard links on this file system, no room for the new file) nothing is
    /// written and the log carries on in the full file (`Rolled::file` is `None`). An error
    /// is a failed write to the log itself.
    fn roll(&self, full: &File, len: u64, prev: &str) -> std::io::Result<Rolled> {
        let cannot = |e: std::io::Error| {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot roll the audit log over; it keeps growing");
        };
        let kept = match rotate::keep(&self.path) {
            Ok(kept) => kept,
            Err(e) => {
                cannot(e);
                return Ok(Rolled::default());
            }
        };
        let kept_name = kept
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut end = event("rotate");
        end.insert("file", Value::from(kept_name.clone()));
        let (end_line, end_fields) = chain_line(prev, end);
        let mut next = event("continue");
        next.insert("from", Value::from(kept_name));
        let (next_line, next_fields) =
            chain_line(end_fields["hash"].as_str().unwrap_or_default(), next);
        let (temp, file) = match rotate::prepare(&self.path, &next_line) {
            Ok(ready) => ready,
            Err(e) => {
                rotate::unkeep(&kept);
                cannot(e);
                return Ok(Rolled::default());
            }
        };
        let mut bytes = end_line.clone();
        bytes.push(b'\n');
        let ended = (&*full).write_all(&bytes).and_then(|()| full.sync_data());
        if let Err(e) = ended {
            // As for any line: a rotate line written in part is cut back off.
            if let Err(cut) = full.set_len(len) {
                tracing::error!(path = %self.path.display(), error = %cut, "cannot remove a partly written audit line");
            }
            rotate::unkeep(&kept);
            rotate::discard(&temp);
            return Err(e);
        }
        if let Err(e) = rotate::install(&temp, &self.path) {
            // The full file ends in a rotate line yet stays the log: the next line follows
            // it in the same file, and the chain is whole.
            rotate::unkeep(&kept);
            rotate::discard(&temp);
            cannot(e);
            return Ok(Rolled {
                file: None,
                lines: vec![(end_line, end_fields)],
            });
        }
        rotate::finish(full, &kept);
        tracing::info!(path = %self.path.display(), kept = %kept.display(), "audit log rolled over");
        Ok(Rolled {
            file: Some(file),
            lines: vec![(end_line, end_fields), (next_line, next_fields)],
        })
    }

    /// Finishes a roll-over whose broker died after writing the rotate line (the full file,
    /// `full`, ends with it, its head `prev`; `kept` is its kept name): the new file, with its
    /// `continue` line, is put at the path. `None` when that cannot be done now (the log goes
    /// on in the full file, after its rotate line, which `verify` accepts).
    fn finish_roll(
        &self,
        full: &File,
        prev: &str,
        kept: &Path,
    ) -> std::io::Result<Option<(File, Vec<u8>, Fields)>> {
        let mut next = event("continue");
        let name = kept.file_name().map(|n| n.to_string_lossy().into_owned());
        next.insert("from", Value::from(name.unwrap_or_default()));
        let (line, fields) = chain_line(prev, next);
        let ready = rotate::prepare(&self.path, &line).and_then(|(temp, file)| {
            rotate::install(&temp, &self.path).inspect_err(|_| rotate::discard(&temp))?;
            Ok(file)
        });
        match ready {
            Ok(file) => {
                rotate::finish(full, kept);
                tracing::warn!(path = %self.path.display(), kept = %kept.display(), "finished a roll-over of the audit log that another broker began");
                Ok(Some((file, line, fields)))
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot finish an interrupted roll-over; the log goes on in the full file");
                Ok(None)
            }
        }
    }

    /// Records the kernel sandbox a server was started in (`fsbroker proxy --confine`): an
    /// `{"event":"confine","confinement":{…}}` line, chained like the rest.
    pub fn confinement(&self, details: Value) -> Result<(), AuditError> {
        let mut line = event("confine");
        line.insert("confinement", details);
        self.append(line, Some(Instant::now() + OWN_LINE_WAIT))
    }

    /// What a proxy reported about the server behind it, on a shared broker (the proxy's
    /// account, not the broker's own knowledge): `{"event":"confine","account":"proxy",
    /// "session":N,"confinement":{…}}`, written on the blocking pool. `details` is bounded by
    /// the caller.
    pub(crate) async fn proxy_account(
        log: Arc<AuditLog>,
        session: u64,
        details: Value,
        until: Instant,
    ) -> Result<(), AuditError> {
        let mut line = event("confine");
        line.insert("account", Value::from("proxy"));
        line.insert("session", Value::from(session));
        line.insert("confinement", details);
        Self::append_async(log, line, until).await
    }

    /// Seals this run's part of the log (at a clean exit): a last line,
    /// `{"event":"seal","pid":…}`, chained like the rest, then flushed to disk. `verify`
    /// reports a run without its seal — a crash, or lines removed from the end.
    pub fn seal(&self) {
        let mut seal = event("seal");
        if let Some(first) = self.first_session {
            seal.insert("firstSession", Value::from(first));
        }
        if let Err(e) = self.append(seal, Some(Instant::now() + OWN_LINE_WAIT)) {
            tracing::error!(error = %e, "cannot seal the audit log");
        }
        self.sync();
    }

    /// Flushes the log to disk (at exit).
    pub fn sync(&self) {
        let chain = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = chain.file.sync_all() {
            tracing::error!(path = %self.path.display(), error = %e, "cannot sync the audit log");
        }
    }
}

/// The longest path logged whole (Linux's `PATH_MAX`); a longer one is cut.
pub const MAX_LOGGED_PATH: usize = 4096;

/// How many of a consent request's paths a line lists.
pub const MAX_LOGGED_PATHS: usize = 16;

/// How many bytes of the consent paths a line lists, as written (escapes included).
pub const MAX_LOGGED_PATHS_BYTES: usize = 16 << 10;

/// The bytes `value` takes in a line once escaped: a control character is written as
/// `\u00XX`, six bytes for one, so a cut by the value's own length would let a server's
/// string grow sixfold in the log.
fn escaped_len(value: &str) -> usize {
    value.chars().map(escaped_char_len).sum()
}

fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        '\u{85}' | '\u{2028}' | '\u{2029}' => 6,
        c => c.len_utf8(),
    }
}

/// `value` cut where its escaped form reaches `max` bytes, at a character boundary.
fn cap_escaped(value: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, c) in value.char_indices() {
        used += escaped_char_len(c);
        if used > max {
            return &value[..i];
        }
    }
    value
}

/// `value` cut to at most `max` bytes, at a character boundary.
pub fn cap(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// Puts `value` under `keys[0]`, cut to `max` bytes as written (escapes counted): a server
/// decides how long its strings are, and a line must stay small enough to be written (and
/// copied) whole. A cut value comes
/// with its full length (`keys[1]`) and the sha256 of it all (`keys[2]`).
fn put_capped(fields: &mut Fields, keys: [&'static str; 3], value: &str, max: usize) {
    let kept = cap_escaped(value, max);
    fields.insert(keys[0], Value::from(kept));
    if kept.len() < value.len() {
        fields.insert(keys[1], Value::from(value.len()));
        fields.insert(keys[2], Value::from(sha256_hex(value.as_bytes())));
    }
}

/// A broker's own line (`start`, `seal`, `rotate`, …): its time, its event and its pid.
fn event(name: &'static str) -> Fields {
    let mut f: Fields = BTreeMap::new();
    f.insert("ts", Value::from(crate::rfc3339::format(SystemTime::now())));
    f.insert("event", Value::from(name));
    f.insert("pid", Value::from(std::process::id()));
    f
}

/// `fields` chained after `prev`: the line (canonical, no newline) and its members with
/// `prev` and `hash`.
fn chain_line(prev: &str, mut fields: Fields) -> (Vec<u8>, Fields) {
    fields.insert("prev", Value::from(prev));
    let hash = sha256_hex(&canonical(&fields));
    fields.insert("hash", Value::from(hash));
    (canonical(&fields), fields)
}

/// Compact JSON with keys in byte order, U+0085, U+2028 and U+2029 escaped: the one form a
/// line may have, and what the hash covers (the line without its `hash` member).
///
/// JSON allows those characters raw, but JavaScript's and Python's line splitters end a line
/// at them, so a log read that way would show more lines than it has. They can only occur
/// inside strings, where their `\u` escapes mean the same.
fn canonical<K: AsRef<str> + Ord + serde::Serialize>(fields: &BTreeMap<K, Value>) -> Vec<u8> {
    // A BTreeMap serializes its keys in order whatever serde_json's features are.
    let raw = serde_json::to_vec(fields).unwrap_or_default();
    escape_separators(raw)
}

/// Characters that some line splitters end a line at, besides `\n`: U+0085 (NEL), U+2028
/// and U+2029, with their JSON escapes. (serde_json escapes the C0 controls already.)
const SEPARATORS: [(&str, &[u8]); 3] = [
    ("\u{85}", b"\\u0085"),
    ("\u{2028}", b"\\u2028"),
    ("\u{2029}", b"\\u2029"),
];

/// Replaces the UTF-8 bytes of the [`SEPARATORS`] with their JSON escapes. Their UTF-8 forms
/// start with 0xC2 or 0xE2, lead bytes (never inside another character in valid UTF-8), so
/// only lines holding those are scanned closely.
fn escape_separators(raw: Vec<u8>) -> Vec<u8> {
    let hit = |rest: &[u8]| {
        SEPARATORS
            .iter()
            .find(|(c, _)| rest.starts_with(c.as_bytes()))
    };
    if !raw
        .iter()
        .enumerate()
        .any(|(i, &b)| (b == 0xC2 || b == 0xE2) && hit(&raw[i..]).is_some())
    {
        return raw;
    }
    let mut out = Vec::with_capacity(raw.len() + 16);
    let mut i = 0;
    while i < raw.len() {
        match hit(&raw[i..]) {
            Some((c, escaped)) => {
                out.extend_from_slice(escaped);
                i += c.len();
            }
            None => {
                out.push(raw[i]);
                i += 1;
            }
        }
    }
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// How a log file ends.
enum Tail {
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
fn tail(mut file: &File, path: &Path) -> Result<Tail, AuditError> {
    let len = file
        .seek(SeekFrom::End(0))
        .map_err(|source| AuditError::Io {
            path: path.to_owned(),
            source,
        })?;
    tail_until(file, path, len)
}

/// The longest line `tail` and `verify` read: far above any line a broker writes (its strings
/// are capped), far below what a file that is not a log can make them hold in memory.
pub const MAX_LINE: u64 = 1 << 20;

/// [`tail`] of the file's first `len` bytes.
fn tail_until(mut file: &File, path: &Path, len: u64) -> Result<Tail, AuditError> {
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
fn last_hash(file: &File, path: &Path) -> Result<String, AuditError> {
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
fn count_lines(file: &File) -> std::io::Result<usize> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn log(dir: &Path, redact: bool) -> AuditLog {
        AuditLog::open(&AuditConfig {
            redact_paths: redact,
            ..AuditConfig::at(dir.join("audit.jsonl"))
        })
        .unwrap()
    }

    fn rec<'a>(path: &'a str) -> Record<'a> {
        Record {
            session: 1,
            method: "files/read",
            path: Some(path),
            outcome: "ok",
            bytes: 3,
            ..Record::default()
        }
    }

    #[test]
    fn chain_survives_reopen_and_verifies() {
        let t = tempfile::tempdir().unwrap();
        let a = log(t.path(), false);
        a.record(&rec("p/a")).unwrap();
        a.record(&rec("p/b")).unwrap();
        drop(a);
        let a = log(t.path(), false);
        a.record(&rec("p/c")).unwrap();
        let s = verify(&t.path().join("audit.jsonl")).unwrap();
        // Two runs, each opened by a start line.
        assert_eq!(s.lines, 5);
        let text = std::fs::read_to_string(t.path().join("audit.jsonl")).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["prev"], GENESIS);
        assert_eq!(lines[0]["event"], "start");
        assert_eq!(lines[1]["path"], "p/a");
        assert_eq!(lines[3]["event"], "start");
        assert_eq!(lines[3]["prev"], lines[2]["hash"]);
    }

    #[test]
    fn verify_names_the_first_bad_line() {
        let t = tempfile::tempdir().unwrap();
        let a = log(t.path(), false);
        for p in ["p/1", "p/2", "p/3", "p/4"] {
            a.record(&rec(p)).unwrap();
        }
        let path = t.path().join("audit.jsonl");
        let good = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = good.lines().collect();
        let check = |text: String, line: usize| {
            std::fs::write(&path, text).unwrap();
            match verify(&path) {
                Err(AuditError::Broken { line: l, .. }) => assert_eq!(l, line),
                other => panic!("expected line {line}: {other:?}"),
            }
        };
        check(good.replace("p/2", "p/X"), 3); // line 1 is the start line
        check(format!("{}\n{}\n{}\n", lines[0], lines[2], lines[3]), 2);
        check(
            format!("{}\n{}\n{}\n{}\n", lines[0], lines[2], lines[1], lines[3]),
            2,
        );
        check(
            format!(
                "{}\n{}\n{}\n{}\n{}\n",
                lines[0], lines[1], lines[1], lines[2], lines[3]
            ),
            3,
        );
    }

    #[test]
    fn redaction_hides_paths() {
        let t = tempfile::tempdir().unwrap();
        let a = log(t.path(), true);
        a.record(&rec("secret/plan.txt")).unwrap();
        let text = std::fs::read_to_string(t.path().join("audit.jsonl")).unwrap();
        assert!(!text.contains("secret"), "{text}");
        assert!(text.contains(&sha256_hex(b"secret/plan.txt")));
    }

    #[test]
    fn a_torn_last_line_is_refused() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("audit.jsonl"), "{\"hash\":").unwrap();
        assert!(matches!(
            AuditLog::open(&AuditConfig::at(t.path().join("audit.jsonl"))),
            Err(AuditError::Broken { .. })
        ));
    }
}

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
//!
//! Here: opening the log, the calls that record to it, and the broker's own lines (its start,
//! its seal). A request's line is built in `record.rs` (what it keeps out: redaction, caps),
//! chained in `chain.rs` (the canonical form and its hash) and appended in `append.rs` (under
//! the lock, after what the file needs first), which reads the file's head with `tail.rs`.

// Ambient `std::fs` calls are allowed here (clippy.toml): the audit log, its kept files and its collectors' sockets are the broker's own files.
#![allow(clippy::disallowed_methods)]

mod append;
mod chain;
pub(crate) mod copy;
mod pending;
mod record;
mod rotate;
mod tail;
mod verify;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde_json::Value;

pub use crate::limits::OWN_LINE_WAIT;
use crate::policy::AuditConfig;
use crate::rundir::LockFile;
use append::Chain;
use chain::Fields;
pub use chain::GENESIS;
pub(crate) use chain::sha256_hex as digest;
use copy::Copies;
pub(crate) use pending::PendingLine;
pub(crate) use record::fields;
pub use record::{MAX_LOGGED_PATH, MAX_LOGGED_PATHS, MAX_LOGGED_PATHS_BYTES, Record, cap};
pub use tail::MAX_LINE;
use tail::{Tail, count_lines, tail, tail_until};
pub use verify::{Summary, verify, verify_anchored, verify_files};

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

/// What [`AuditLog::status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditStatus {
    /// Whether lines are still written (false once a write failed).
    pub writable: bool,
    /// The hash of the last line this broker wrote or read (the chain's head).
    pub head: String,
    /// Whether every copy to a log collector is delivered; `None` with no copies.
    pub copies_up: Option<bool>,
}

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
        create_folders(&path).map_err(io)?;
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

    /// Turns the log unhealthy for good: a request acted and its line could not be written
    /// even given a second deadline, so the log no longer tells everything that was done.
    pub(crate) fn fail_closed(&self, why: &AuditError) {
        self.health.file.store(false, Ordering::Release);
        tracing::error!(path = %self.path.display(), error = %why, "audit log unavailable: refusing every audited request from now on");
    }

    /// Records the kernel sandbox a server was started in (`fsbroker proxy --confine`): an
    /// `{"event":"confine","confinement":{…}}` line, chained like the rest.
    pub fn confinement(&self, details: Value) -> Result<(), AuditError> {
        let mut line = event("confine");
        line.insert("confinement", details);
        self.append(line, Some(Instant::now() + OWN_LINE_WAIT))
    }

    /// Records a sign-in to a remote server (`proxy --url`): a `{"event":"sign-in",
    /// "signIn":{"server","issuer","scopes","outcome",…}}` line, chained like the rest. The
    /// caller puts no secret in `details` (no token, code or client secret).
    pub fn sign_in(&self, details: Value) -> Result<(), AuditError> {
        let mut line = event("sign-in");
        line.insert("signIn", details);
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

    /// Whether the log takes lines now, and whether its copies to the machine's collectors
    /// are delivered (`None` when it has none), for a console to show.
    pub fn status(&self) -> AuditStatus {
        let chain = self.chain.lock().unwrap_or_else(|e| e.into_inner());
        AuditStatus {
            writable: self.health.file.load(Ordering::Acquire),
            head: chain.prev.clone(),
            copies_up: (!chain.copies.is_empty()).then(|| chain.copies.all_up()),
        }
    }

    /// Records what the person did (on the console, or in a host's own window): a line
    /// `{"event":NAME,"account":"person",…}` with `members`, chained like the rest. Paths in
    /// `members` are the caller's to redact (`redact_paths`).
    pub(crate) fn person(
        &self,
        name: &'static str,
        members: BTreeMap<&'static str, Value>,
    ) -> Result<(), AuditError> {
        let mut line = event(name);
        line.insert("account", Value::from("person"));
        line.extend(members);
        self.append(line, Some(Instant::now() + OWN_LINE_WAIT))
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

/// A time as the log writes it (`ts`): RFC 3339, UTC, milliseconds.
pub fn timestamp(t: SystemTime) -> String {
    crate::rfc3339::format(t)
}

/// Creates the folders missing above the log at `path`, owner-only (0700), and says so on
/// the log (stderr). A log under `~/.local/state/fsbroker/` must not need a `mkdir` first,
/// and the folders hold who did what with the person's files, so no one else may list them.
/// A folder made by another process meanwhile is taken as it is.
fn create_folders(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let absent = |dir: &Path| {
        std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    };
    let missing: Vec<&Path> = parent
        .ancestors()
        .take_while(|dir| !dir.as_os_str().is_empty() && absent(dir))
        .collect();
    for dir in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot create its folder {}: {e}", dir.display()),
                ));
            }
        }
        tracing::warn!(folder = %dir.display(), log = %path.display(), "created the audit log's missing folder, owner-only (0700)");
    }
    Ok(())
}

/// A broker's own line (`start`, `seal`, `rotate`, …): its time, its event and its pid.
fn event(name: &'static str) -> Fields {
    let mut f: Fields = BTreeMap::new();
    f.insert("ts", Value::from(crate::rfc3339::format(SystemTime::now())));
    f.insert("event", Value::from(name));
    f.insert("pid", Value::from(std::process::id()));
    f
}

#[cfg(test)]
mod tests {
    use super::chain::sha256_hex;
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

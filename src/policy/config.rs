//! The `[consent]`, `[audit]` and `[confine]` tables as the broker uses them: paths made
//! absolute, names resolved (a syslog facility), combinations that cannot work refused.
//!
//! Kept apart from the compiled [`Policy`](super::Policy) so that what each table becomes,
//! and every reason it is refused, can be read in one place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::compiled::expand;
use super::{AuditFile, ConfineMode, CopyTarget, OnRevoke, PolicyError};
pub use crate::limits::MIN_AUDIT_BYTES;

/// How `prompt` roots ask a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsentConfig {
    /// The external decision program (argv), if any; it wins over the terminal.
    pub command: Vec<String>,
    /// Whether the controlling terminal may be used.
    pub terminal: bool,
    /// How long a prompt may go unanswered before it counts as a denial.
    pub timeout: Duration,
}

/// Where and how the audit log is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The log file (absolute, or relative to the working directory).
    pub path: PathBuf,
    /// Whether paths are logged as their sha256.
    pub redact_paths: bool,
    /// Roll to a new file once the log would grow past this many bytes.
    pub max_bytes: Option<u64>,
    /// Copies of every line sent, as it is written, to the machine's log collectors.
    pub copies: Vec<CopyConfig>,
    /// Whether a copy that cannot be delivered makes the log unavailable.
    pub require_copies: bool,
}

impl AuditConfig {
    /// A log at `path` with nothing else set.
    pub fn at(path: PathBuf) -> AuditConfig {
        AuditConfig {
            path,
            redact_paths: false,
            max_bytes: None,
            copies: Vec::new(),
            require_copies: false,
        }
    }
}

/// How `fsbroker proxy` confines its server (the `[confine]` table, paths made absolute).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConfineConfig {
    /// Off, best effort or strict.
    pub mode: ConfineMode,
    /// More paths the server may read and run programs from.
    pub read: Vec<PathBuf>,
    /// More paths the server may read and write.
    pub write: Vec<PathBuf>,
    /// Whether TCP is allowed.
    pub net: bool,
    /// What a reload that takes access away does to the server.
    pub on_revoke: OnRevoke,
}

/// One copy of the audit log, off the file: where it goes and how it is framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyConfig {
    /// RFC 5424 syslog messages, one per datagram.
    Syslog {
        /// The Unix datagram socket (`/dev/log`).
        socket: PathBuf,
        /// The facility's number (RFC 5424 §6.2.1).
        facility: u8,
    },
    /// The systemd journal's native protocol.
    Journald {
        /// The Unix datagram socket (`/run/systemd/journal/socket`).
        socket: PathBuf,
    },
}

/// Syslog facilities by name (RFC 5424 §6.2.1).
const FACILITIES: &[(&str, u8)] = &[
    ("kern", 0),
    ("user", 1),
    ("daemon", 3),
    ("auth", 4),
    ("syslog", 5),
    ("authpriv", 10),
    ("local0", 16),
    ("local1", 17),
    ("local2", 18),
    ("local3", 19),
    ("local4", 20),
    ("local5", 21),
    ("local6", 22),
    ("local7", 23),
];

/// The `[audit]` table (when there is one) for a log at `path`.
pub(super) fn audit_config(
    path: PathBuf,
    table: Option<&AuditFile>,
    base: Option<&Path>,
) -> Result<AuditConfig, PolicyError> {
    let Some(a) = table else {
        return Ok(AuditConfig::at(path));
    };
    let bad = |reason: String| PolicyError::Table {
        table: "audit",
        reason,
    };
    if let Some(max) = a.max_bytes.filter(|&m| m < MIN_AUDIT_BYTES) {
        return Err(bad(format!(
            "max_bytes = {max} is too small: at least {MIN_AUDIT_BYTES}"
        )));
    }
    let facility = match a.syslog_facility.as_deref() {
        None => 10,
        Some(name) => FACILITIES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, f)| f)
            .ok_or_else(|| {
                let names: Vec<&str> = FACILITIES.iter().map(|(n, _)| *n).collect();
                bad(format!(
                    "syslog_facility {name:?} is not a facility: one of {}",
                    names.join(", ")
                ))
            })?,
    };
    if a.syslog_facility.is_some()
        && !matches!(
            a.syslog,
            Some(CopyTarget::Enabled(true) | CopyTarget::Socket(_))
        )
    {
        return Err(bad("syslog_facility is set but syslog is not".into()));
    }
    let socket = |target: &Option<CopyTarget>, usual: &str| match target {
        Some(CopyTarget::Enabled(true)) => Some(PathBuf::from(usual)),
        Some(CopyTarget::Socket(p)) => Some(expand(p, base)),
        Some(CopyTarget::Enabled(false)) | None => None,
    };
    let mut copies = Vec::new();
    if let Some(socket) = socket(&a.syslog, "/dev/log") {
        copies.push(CopyConfig::Syslog { socket, facility });
    }
    if let Some(socket) = socket(&a.journald, "/run/systemd/journal/socket") {
        copies.push(CopyConfig::Journald { socket });
    }
    if a.require_copies && copies.is_empty() {
        return Err(bad(
            "require_copies is set but there is no copy (set syslog or journald)".into(),
        ));
    }
    Ok(AuditConfig {
        path,
        redact_paths: a.redact_paths,
        max_bytes: a.max_bytes,
        copies,
        require_copies: a.require_copies,
    })
}

//! The `[consent]`, `[audit]` and `[confine]` tables as the broker uses them: paths made
//! absolute, names resolved (a syslog facility), combinations that cannot work refused.
//!
//! Kept apart from the compiled [`Policy`](super::Policy) so that what each table becomes,
//! and every reason it is refused, can be read in one place.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::file::expand;
use super::{AuditFile, ConfineMode, ConsoleFile, CopyTarget, OnRevoke, PolicyError, Provider};
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
    /// Who is asked (`[consent] provider`).
    pub provider: Provider,
}

/// The `[console]` table as the binary uses it: the address checked to be loopback, the URL
/// file made absolute.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsoleConfig {
    /// Whether the policy asks for the console.
    pub enabled: bool,
    /// Where to serve it, when the policy names an address.
    pub addr: Option<std::net::SocketAddr>,
    /// Where to write its URL.
    pub url_file: Option<PathBuf>,
}

impl ConsoleConfig {
    /// The `[console]` table, its paths relative to `base` (the policy file's folder).
    pub(super) fn from_file(file: &ConsoleFile, base: Option<&Path>) -> Result<Self, PolicyError> {
        let addr = match &file.addr {
            None => None,
            Some(text) => Some(loopback_addr(text).map_err(|reason| PolicyError::Table {
                table: "console",
                reason,
            })?),
        };
        Ok(ConsoleConfig {
            enabled: file.enabled,
            addr,
            url_file: file.url_file.as_ref().map(|p| expand(p, base)),
        })
    }
}

/// Parses a console address (`127.0.0.1:8080`, `[::1]:0`, `localhost:0`), refusing any that
/// is not loopback: the console holds the person's consent, and no other machine may reach
/// it.
pub fn loopback_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    let text = text.trim();
    let addr: std::net::SocketAddr = match text.strip_prefix("localhost:") {
        Some(port) => {
            let port: u16 = port
                .parse()
                .map_err(|_| format!("{text:?}: the port is not a number from 0 to 65535"))?;
            (std::net::Ipv4Addr::LOCALHOST, port).into()
        }
        None => text.parse().map_err(|_| {
            format!("{text:?} is not an address and port such as 127.0.0.1:0 or [::1]:8080")
        })?,
    };
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{text:?} is not a loopback address: the console is served on 127.0.0.1 or ::1 only"
        ));
    }
    Ok(addr)
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
    /// Registries a launcher may install a missing package from before the server starts.
    pub fetch: Vec<super::Registry>,
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

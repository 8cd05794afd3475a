//! The administrator's managed policy: `/etc/fsbroker/managed.toml`, bounds that no user
//! policy, flag or environment variable can lift (docs/policy.md, "The managed policy").
//!
//! It is read from one fixed path and trusted only as sudo trusts sudoers: the file and every
//! folder above it must be owned by root and writable by no one else, or the broker refuses
//! to start (and a running broker withdraws every root). An absent file changes nothing. It
//! only ever narrows: what it says is applied to the user's policy as it is compiled
//! (`compiled.rs`), and whatever the person asked for beyond it is a [`Narrowing`], refused at
//! start with the rule's name and dropped (with a warning) on a live reload.

// Ambient `std::fs` calls are allowed here (clippy.toml): the managed policy is the broker's own.
#![allow(clippy::disallowed_methods)]

use std::path::{Component, Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfineMode, LimitsFile, PolicyError};
use crate::limits::MAX_POLICY_BYTES;

/// Where the managed policy is. Fixed: no flag or variable names another.
pub const MANAGED_PATH: &str = "/etc/fsbroker/managed.toml";

/// The managed policy file as written (TOML). Unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "fsbroker managed policy")]
pub struct ManagedFile {
    /// Bounds on the roots every user policy and `--root` names.
    #[serde(default)]
    pub roots: ManagedRoots,
    /// Ceilings on the `[limits]` of every user policy: a user value above one is refused.
    #[serde(default)]
    pub limits: ManagedLimits,
    /// The audit log every broker must keep.
    #[serde(default)]
    pub audit: ManagedAudit,
    /// The confinement every `proxy -- SERVER` must run with.
    #[serde(default)]
    pub confine: ManagedConfine,
    /// The only programs `proxy -- SERVER` may start.
    #[serde(default)]
    pub servers: ManagedServers,
    /// The only remote servers `proxy --url` may reach.
    #[serde(default)]
    pub remote: ManagedRemote,
    /// Whether the person's console must be on.
    #[serde(default)]
    pub console: ManagedConsole,
}

/// `[roots]`: where user roots may be, and rules added to every one of them. Paths are
/// absolute, or `~/…` for the home folder of the user the broker runs as (from the password
/// database, never `$HOME`). They are compared as written, never through a link: write the
/// real path.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedRoots {
    /// Every root must lie within one of these folders (unset: anywhere; empty: no roots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Vec<PathBuf>>,
    /// Deny globs added to every root (the syntax of a root's `deny`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
    /// Folders (or files) that are read-only, whatever a root's mode says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
    /// Folders (or files) that always need the person's consent: a root's `consent = "auto"`
    /// (and `--consent auto`) is `prompt` there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consent: Vec<PathBuf>,
}

/// `[limits]`: a ceiling for each key of the user policy's `[limits]` (same names, same
/// units). For `requests_per_second` and `bytes_per_second`, whose 0 means unlimited, a
/// ceiling also turns 0 into the ceiling.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // the keys are `LimitsFile`'s, documented there
pub struct ManagedLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_chunk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_burst: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_watches: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_list_entries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_locks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uploads: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_input: Option<u64>,
}

/// `[audit]`: whether every broker must keep an audit log, and which copies of it must leave
/// the machine's disk.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedAudit {
    /// A broker without an audit log (`--audit` or the policy's `[audit]`) refuses to start.
    #[serde(default)]
    pub required: bool,
    /// Copies the log must have (`"syslog"`, `"journald"`); implies `required`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<CopyKind>,
    /// Requests are refused while a copy cannot be delivered (`[audit] require_copies`).
    #[serde(default)]
    pub require_copies: bool,
    /// The socket a required syslog copy must go to (default `/dev/log`): a copy to a socket
    /// of the person's own would leave the machine no record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syslog_socket: Option<PathBuf>,
    /// The socket a required journald copy must go to (default
    /// `/run/systemd/journal/socket`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journald_socket: Option<PathBuf>,
}

/// A copy of the audit log that leaves the file.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum CopyKind {
    /// RFC 5424 to the machine's syslog (`[audit] syslog`).
    Syslog,
    /// The systemd journal (`[audit] journald`).
    Journald,
}

impl CopyKind {
    /// Its name in policies.
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::Syslog => "syslog",
            CopyKind::Journald => "journald",
        }
    }
}

impl ManagedAudit {
    /// The socket a required copy of `kind` must be sent to.
    pub fn socket(&self, kind: CopyKind) -> PathBuf {
        match kind {
            CopyKind::Syslog => self
                .syslog_socket
                .clone()
                .unwrap_or_else(|| PathBuf::from("/dev/log")),
            CopyKind::Journald => self
                .journald_socket
                .clone()
                .unwrap_or_else(|| PathBuf::from("/run/systemd/journal/socket")),
        }
    }
}

/// `[confine]`: the least confinement a proxy's server may run with.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedConfine {
    /// `"best-effort"` or `"strict"`: every `proxy -- SERVER` must run at least so confined
    /// (`--confine`, `--confine=strict` or the policy's `[confine] mode`); without it the
    /// proxy refuses to start. Unset, or `"off"`: no requirement.
    #[serde(default)]
    pub required: ConfineMode,
    /// `false`: no policy may give a confined server the network (`[confine] net = true` is
    /// refused). Unset: the person's policy decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<bool>,
}

/// `[servers]`: the programs a proxy may start.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedServers {
    /// Unset: any. Otherwise the program the proxy runs (its absolute path with every link
    /// resolved, after a launcher such as `npx -y` is resolved to the installation it runs)
    /// must be one of these; an entry with an `interpreter` allows that interpreter running
    /// exactly that script as its first argument.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<AllowedServer>>,
}

/// One allowed server program.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum AllowedServer {
    /// Its absolute path.
    Path(PathBuf),
    /// Its absolute path, and optionally the SHA-256 of its contents and the interpreter it
    /// is a script of.
    Entry {
        /// The program, or the script when `interpreter` is set.
        path: PathBuf,
        /// The file's SHA-256, hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        /// The interpreter that runs `path` (`/usr/bin/node`): the command must be exactly
        /// this program with `path` as its first argument.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interpreter: Option<PathBuf>,
    },
}

impl AllowedServer {
    /// The path allowed.
    pub fn path(&self) -> &Path {
        match self {
            AllowedServer::Path(p) | AllowedServer::Entry { path: p, .. } => p,
        }
    }

    /// The SHA-256 the file must have, if pinned.
    pub fn sha256(&self) -> Option<&str> {
        match self {
            AllowedServer::Path(_) => None,
            AllowedServer::Entry { sha256, .. } => sha256.as_deref(),
        }
    }

    /// The interpreter `path` is a script of, if any.
    pub fn interpreter(&self) -> Option<&Path> {
        match self {
            AllowedServer::Path(_) => None,
            AllowedServer::Entry { interpreter, .. } => interpreter.as_deref(),
        }
    }
}

/// `[remote]`: the servers `proxy --url` may reach.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedRemote {
    /// Unset: any. Otherwise `--url` must have the scheme, host and port of one of these
    /// URLs, and a path at or beneath its path (by whole segments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
}

/// `[console]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ManagedConsole {
    /// Every broker serves the person's console, as if `--console` were given.
    #[serde(default)]
    pub required: bool,
}

/// A managed policy in force: what it says, checked, with its paths made absolute for the
/// user the broker runs as.
#[derive(Debug, Clone)]
pub struct Managed {
    /// The file's SHA-256 (hex): which rules were in force, for the audit log.
    pub sha256: String,
    /// What it says.
    pub file: ManagedFile,
    within: Option<Vec<PathBuf>>,
    read_only: Vec<PathBuf>,
    consent: Vec<PathBuf>,
    remote: Option<Vec<url::Url>>,
    deny: crate::sandbox::DenySet,
}

/// Something the person asked for that a managed rule does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Narrowing {
    /// The rule, as `[table] key`.
    pub rule: String,
    /// What was asked and what the rule allows.
    pub reason: String,
}

impl std::fmt::Display for Narrowing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (managed policy {MANAGED_PATH}, {})",
            self.reason, self.rule
        )
    }
}

impl Managed {
    /// The managed policy at [`MANAGED_PATH`]: `None` when there is none, an error when it is
    /// there but unsafe or not a valid managed policy (fail closed: the caller must not carry
    /// on without it).
    pub fn system() -> Result<Option<Managed>, PolicyError> {
        Managed::load(Path::new(MANAGED_PATH))
    }

    fn load(path: &Path) -> Result<Option<Managed>, PolicyError> {
        use std::io::Read;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let bad = |reason: String| PolicyError::Managed {
            path: path.to_owned(),
            reason,
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(bad(
                    "it is a symbolic link: the managed policy must be the file itself".into(),
                ));
            }
            Err(e) => return Err(bad(format!("cannot read it: {e}"))),
        };
        let meta = file
            .metadata()
            .map_err(|e| bad(format!("cannot read it: {e}")))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        safe_owner("the file", meta.uid(), meta.gid(), meta.mode()).map_err(&bad)?;
        // Every folder above it, as sudo checks sudoers: whoever could write one of them
        // could put another file in its place.
        let mut dir = path.parent();
        while let Some(d) = dir {
            let m = std::fs::symlink_metadata(d)
                .map_err(|e| bad(format!("cannot check {}: {e}", d.display())))?;
            if !m.is_dir() {
                return Err(bad(format!(
                    "{} is not a folder (a link?): every folder above the managed policy must be \
                     a real folder owned by root",
                    d.display()
                )));
            }
            safe_owner(
                &format!("folder {}", d.display()),
                m.uid(),
                m.gid(),
                m.mode(),
            )
            .map_err(&bad)?;
            dir = d.parent();
        }
        let mut bytes = Vec::new();
        (&file)
            .take(MAX_POLICY_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| bad(format!("cannot read it: {e}")))?;
        if bytes.len() as u64 > MAX_POLICY_BYTES {
            return Err(bad(format!("larger than {MAX_POLICY_BYTES} bytes")));
        }
        Managed::from_bytes(bytes, path).map(Some)
    }

    /// A managed policy from the bytes of its file (`origin` names it in errors), its
    /// SHA-256 taken of exactly those bytes: what `policy check --managed` checks before a
    /// file is deployed.
    pub fn from_bytes(bytes: Vec<u8>, origin: &Path) -> Result<Managed, PolicyError> {
        let sha256 = crate::digest::sha256_hex(&bytes);
        let text = String::from_utf8(bytes).map_err(|_| PolicyError::Managed {
            path: origin.to_owned(),
            reason: "not UTF-8 text".into(),
        })?;
        Managed::parse(&text, origin, sha256)
    }

    /// Parses and checks managed policy text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path, sha256: String) -> Result<Managed, PolicyError> {
        let bad = |reason: String| PolicyError::Managed {
            path: origin.to_owned(),
            reason,
        };
        let file: ManagedFile = toml::from_str(text)
            .map_err(|e| bad(format!("invalid: {}", e.to_string().trim_end())))?;
        let home = home_of_user();
        let absolute = |key: &str, p: &Path| -> Result<PathBuf, PolicyError> {
            managed_path(p, home.as_deref()).map_err(|why| bad(format!("{key}: {why}")))
        };
        let within = match &file.roots.within {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|p| absolute("[roots] within", p))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let read_only = file
            .roots
            .read_only
            .iter()
            .map(|p| absolute("[roots] read_only", p))
            .collect::<Result<Vec<_>, _>>()?;
        let consent = file
            .roots
            .consent
            .iter()
            .map(|p| absolute("[roots] consent", p))
            .collect::<Result<Vec<_>, _>>()?;
        let deny = crate::sandbox::DenySet::new(&file.roots.deny)
            .map_err(|e| bad(format!("[roots] deny: {e}")))?;
        for (key, ceiling) in file.limits.entries() {
            if ceiling == 0 && ZERO_IS_UNLIMITED.contains(&key) {
                return Err(bad(format!(
                    "[limits] {key} = 0 would mean unlimited: leave it out for no ceiling"
                )));
            }
            // Each ceiling must be a value the user's `[limits]` could hold.
            let mut probe = serde_json::to_value(LimitsFile::default()).unwrap_or_default();
            probe[key] = ceiling.into();
            serde_json::from_value::<LimitsFile>(probe)
                .map_err(|e| bad(format!("[limits] {key} = {ceiling}: {e}")))?;
        }
        let remote = match &file.remote.allow {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|u| {
                        let url = url::Url::parse(u)
                            .map_err(|e| bad(format!("[remote] allow: {u:?}: {e}")))?;
                        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                            return Err(bad(format!(
                                "[remote] allow: {u:?} is not an http:// or https:// URL"
                            )));
                        }
                        Ok(url)
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        for server in file.servers.allow.iter().flatten() {
            if server.interpreter().is_some_and(|i| !i.is_absolute()) {
                return Err(bad(format!(
                    "[servers] allow: the interpreter of {} is not an absolute path",
                    server.path().display()
                )));
            }
            if !server.path().is_absolute() {
                return Err(bad(format!(
                    "[servers] allow: {} is not an absolute path",
                    server.path().display()
                )));
            }
            if let Some(h) = server.sha256() {
                if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad(format!(
                        "[servers] allow: the sha256 of {} is not 64 hex digits",
                        server.path().display()
                    )));
                }
            }
        }
        let managed = Managed {
            sha256,
            file,
            within,
            read_only,
            consent,
            remote,
            deny,
        };
        // The ceilings must leave limits a broker can run with (no timeout of 0).
        let (capped, _) = managed.cap_limits(&LimitsFile::default());
        super::Limits::from_file(&capped).map_err(|e| bad(format!("[limits]: {e}")))?;
        Ok(managed)
    }

    /// The JSON Schema of the managed policy file.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(ManagedFile))
            .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }

    /// Why a root at `path` (canonical) may not be a root, if it lies outside every
    /// `[roots] within` folder.
    pub fn refuse_root(&self, path: &Path) -> Option<Narrowing> {
        if self.denied_at(path) {
            return Some(Narrowing {
                rule: "[roots] deny".into(),
                reason: format!(
                    "root {} lies in a path a managed deny glob covers ({})",
                    path.display(),
                    self.file.roots.deny.join(" ")
                ),
            });
        }
        let within = self.within.as_ref()?;
        if within.iter().any(|w| path.starts_with(w)) {
            return None;
        }
        Some(Narrowing {
            rule: "[roots] within".into(),
            reason: format!(
                "root {} is outside the folders roots must lie within ({})",
                path.display(),
                list(within)
            ),
        })
    }

    /// Why `[confine] read` (or `write`, when `write`) may not name `path`: a path a confined
    /// server is given beyond its roots is a root to it, bounded by `[roots] within` (and,
    /// for writing, by `[roots] read_only`). Compared where it leads, as a root is.
    pub fn refuse_confine_path(&self, path: &Path, write: bool) -> Option<Narrowing> {
        let key = if write { "write" } else { "read" };
        let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let (rule, why) = if let Some(no) = self.refuse_root(&real) {
            (no.rule, no.reason)
        } else {
            let ro = self.read_only_at(&real).filter(|_| write)?;
            (
                "[roots] read_only".to_owned(),
                format!("{} is read-only", ro.display()),
            )
        };
        Some(Narrowing {
            rule,
            reason: format!("[confine] {key} = {}: {why}", path.display()),
        })
    }

    /// Whether a `[roots] deny` glob covers `path` (absolute) itself, matched against the
    /// path below `/`: a root, or a path given to a confined server, inside a denied folder
    /// would otherwise be served whole (a glob only sees paths inside a root).
    pub fn denied_at(&self, path: &Path) -> bool {
        path.strip_prefix("/")
            .ok()
            .and_then(|rel| rel.to_str())
            .is_some_and(|rel| self.deny.is_denied(rel))
    }

    /// Whether everything at `path` (canonical) is read-only by a `[roots] read_only` rule.
    pub fn read_only_at(&self, path: &Path) -> Option<&Path> {
        self.read_only
            .iter()
            .find(|p| path.starts_with(p))
            .map(PathBuf::as_path)
    }

    /// Whether everything at `path` (canonical) needs consent by a `[roots] consent` rule.
    pub fn consent_at(&self, path: &Path) -> Option<&Path> {
        self.consent
            .iter()
            .find(|p| path.starts_with(p))
            .map(PathBuf::as_path)
    }

    /// The `[roots] read_only` paths.
    pub fn read_only(&self) -> &[PathBuf] {
        &self.read_only
    }

    /// The `[roots] consent` paths.
    pub fn consent(&self) -> &[PathBuf] {
        &self.consent
    }

    /// The `[roots] within` folders, if set.
    pub fn within(&self) -> Option<&[PathBuf]> {
        self.within.as_deref()
    }

    /// `limits` with every value above its ceiling lowered to it, and what the person set
    /// above a ceiling (a value other than the default: a default is only lowered).
    pub fn cap_limits(&self, limits: &LimitsFile) -> (LimitsFile, Vec<Narrowing>) {
        // The keys are `LimitsFile`'s own names, so one loop over its JSON form covers them
        // all, and a key added to `[limits]` without a ceiling here fails the schema test.
        let as_map = |l: &LimitsFile| match serde_json::to_value(l) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        };
        let defaults = as_map(&LimitsFile::default());
        let mut map = as_map(limits);
        let mut refused = Vec::new();
        for (key, ceiling) in self.file.limits.entries() {
            let Some(value) = map.get(key).and_then(serde_json::Value::as_u64) else {
                continue;
            };
            let unlimited = ZERO_IS_UNLIMITED.contains(&key) && value == 0;
            if !unlimited && value <= ceiling {
                continue;
            }
            if defaults.get(key).and_then(serde_json::Value::as_u64) != Some(value) {
                refused.push(Narrowing {
                    rule: format!("[limits] {key}"),
                    reason: format!(
                        "[limits] {key} = {} is above the ceiling of {ceiling}",
                        if unlimited {
                            "0 (unlimited)".to_owned()
                        } else {
                            value.to_string()
                        }
                    ),
                });
            }
            map.insert(key.to_owned(), ceiling.into());
        }
        let mut out: LimitsFile =
            serde_json::from_value(map.into()).unwrap_or_else(|_| limits.clone());
        // A default read length above a lowered maximum follows it down.
        if out.chunk_size > out.max_chunk_size && self.file.limits.max_chunk_size.is_some() {
            out.chunk_size = out.max_chunk_size;
        }
        (out, refused)
    }

    /// Why a proxy's server may not run with confinement `mode`, if `[confine] required`
    /// asks for more.
    pub fn refuse_confinement(&self, mode: ConfineMode) -> Option<Narrowing> {
        let rank = |m: ConfineMode| match m {
            ConfineMode::Off => 0,
            ConfineMode::BestEffort => 1,
            ConfineMode::Strict => 2,
        };
        let required = self.file.confine.required;
        if rank(mode) >= rank(required) {
            return None;
        }
        let (name, flag) = match required {
            ConfineMode::Strict => ("strict", "--confine=strict"),
            _ => ("best-effort", "--confine (or --confine=strict)"),
        };
        Some(Narrowing {
            rule: "[confine] required".into(),
            reason: format!(
                "the server must run confined ({name}), and this proxy would run it {}: add {flag}",
                match mode {
                    ConfineMode::Off => "unconfined",
                    ConfineMode::BestEffort => "with --confine (best effort)",
                    ConfineMode::Strict => "strict",
                }
            ),
        })
    }

    /// Why `proxy --url` may not reach `url`, if `[remote] allow` does not list it.
    pub fn refuse_url(&self, url: &url::Url) -> Option<Narrowing> {
        let allowed = self.remote.as_ref()?;
        let segments = |u: &url::Url| -> Vec<String> {
            u.path_segments()
                .map(|s| s.filter(|s| !s.is_empty()).map(str::to_owned).collect())
                .unwrap_or_default()
        };
        // A path whose separators or dots are percent-encoded, or with an empty segment, may
        // mean another path to the server (or a proxy in front of it) than its segments say.
        let path = url.path().to_ascii_lowercase();
        let disguised = ["%2f", "%2e", "%5c"].iter().any(|e| path.contains(e))
            || path.contains("//")
            || path.contains('\\');
        let ok = !disguised
            && allowed.iter().any(|a| {
                a.scheme() == url.scheme()
                    && a.host() == url.host()
                    && a.port_or_known_default() == url.port_or_known_default()
                    && segments(url).starts_with(&segments(a))
            });
        if ok {
            return None;
        }
        Some(Narrowing {
            rule: "[remote] allow".into(),
            reason: format!(
                "--url {}{} is not one of the remote servers allowed ({})",
                // Never the query or credentials: they may carry a token.
                url.origin().ascii_serialization(),
                url.path(),
                allowed
                    .iter()
                    .map(url::Url::as_str)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
    }

    /// Why the proxy may not start `command` (the program and arguments it would run), if
    /// `[servers] allow` does not list it: its program, or (for an entry with an
    /// `interpreter`) that interpreter with exactly that script as its first argument.
    pub fn refuse_command(&self, command: &[std::ffi::OsString]) -> Option<Narrowing> {
        let allowed = self.file.servers.allow.as_ref()?;
        let refuse = |reason: String| {
            Some(Narrowing {
                rule: "[servers] allow".into(),
                reason,
            })
        };
        let Some(program) = command.first().and_then(|p| which(Path::new(p))) else {
            return refuse(format!(
                "the server's program {:?} was not found, so it cannot be checked against \
                 the allowed servers",
                command
                    .first()
                    .map(|p| p.to_string_lossy())
                    .unwrap_or_default()
            ));
        };
        // The script, only as the very first argument: an option before it (`node -e …`)
        // would run something else.
        let script = command
            .get(1)
            .and_then(|p| std::fs::canonicalize(p).ok())
            .filter(|p| p.is_file());
        // An entry is compared where it leads (`/bin/true` is `/usr/bin/true` on a merged
        // /usr), as the program is.
        let same = |a: &Path, b: &Path| a == b || std::fs::canonicalize(a).is_ok_and(|p| p == b);
        let mut mismatch = None;
        for entry in allowed {
            let file = match entry.interpreter() {
                None if same(entry.path(), &program) => &program,
                Some(interp) if same(interp, &program) => match &script {
                    Some(s) if same(entry.path(), s) => s,
                    _ => continue,
                },
                _ => continue,
            };
            // Not pinned: allowed by its path alone.
            let want = entry.sha256()?;
            match std::fs::read(file) {
                Ok(bytes) if crate::digest::sha256_hex(&bytes).eq_ignore_ascii_case(want) => {
                    return None;
                }
                Ok(_) => {
                    mismatch = Some(format!(
                        "{} is allowed only with the SHA-256 {want}, and its contents differ",
                        file.display()
                    ))
                }
                Err(e) => mismatch = Some(format!("cannot read {}: {e}", file.display())),
            }
        }
        refuse(mismatch.unwrap_or_else(|| {
            format!(
                "{} is not one of the allowed servers ({})",
                program.display(),
                allowed
                    .iter()
                    .map(|a| match a.interpreter() {
                        Some(i) => format!("{} {}", i.display(), a.path().display()),
                        None => a.path().display().to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }))
    }
}

/// The `[limits]` keys whose 0 means unlimited.
const ZERO_IS_UNLIMITED: [&str; 2] = ["requests_per_second", "bytes_per_second"];

impl ManagedLimits {
    /// The ceilings set, by key.
    pub fn entries(&self) -> Vec<(&'static str, u64)> {
        [
            ("chunk_size", self.chunk_size),
            ("max_chunk_size", self.max_chunk_size),
            ("max_file_size", self.max_file_size),
            ("timeout_ms", self.timeout_ms),
            ("requests_per_second", self.requests_per_second),
            ("request_burst", self.request_burst),
            ("bytes_per_second", self.bytes_per_second),
            ("max_watches", self.max_watches),
            ("max_list_entries", self.max_list_entries),
            ("max_locks", self.max_locks),
            ("lock_timeout_ms", self.lock_timeout_ms),
            ("max_in_flight", self.max_in_flight),
            ("max_uploads", self.max_uploads),
            ("max_sessions", self.max_sessions),
            ("max_pending_input", self.max_pending_input),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
    }
}

/// Owned by root and writable by no one else (group write only for root's group), as sudo
/// requires of sudoers.
fn safe_owner(what: &str, uid: u32, gid: u32, mode: u32) -> Result<(), String> {
    if uid != 0 {
        return Err(format!(
            "{what} is owned by uid {uid}, not root: the managed policy and every folder above \
             it must be owned by root"
        ));
    }
    if mode & 0o002 != 0 || (mode & 0o020 != 0 && gid != 0) {
        return Err(format!(
            "{what} is writable by {} (mode {:o}): the managed policy and every folder above it \
             must be writable by root only",
            if mode & 0o002 != 0 {
                "everyone".to_owned()
            } else {
                format!("group {gid}")
            },
            mode & 0o7777
        ));
    }
    Ok(())
}

/// A managed path made absolute: `~/x` under the user's home folder (`home`), `..` refused,
/// `.` and repeated slashes dropped. Never resolved through links.
fn managed_path(p: &Path, home: Option<&Path>) -> Result<PathBuf, String> {
    let joined = match p.strip_prefix("~") {
        Ok(rest) => match home {
            Some(h) => h.join(rest),
            None => {
                return Err(format!(
                    "{}: the user has no home folder in the password database",
                    p.display()
                ));
            }
        },
        Err(_) if p.is_absolute() => p.to_path_buf(),
        Err(_) => {
            return Err(format!("{} is not absolute (write /… or ~/…)", p.display()));
        }
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                return Err(format!("{}: `..` is not allowed", p.display()));
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The home folder of the user this process runs as, from the password database: `$HOME`
/// is the person's to set, and would move `~/…` rules wherever they liked.
fn home_of_user() -> Option<PathBuf> {
    use std::ffi::CStr;
    use std::os::unix::ffi::OsStrExt;
    let uid = rustix::process::getuid().as_raw();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `getpwuid_r` is the reentrant lookup: it writes only into `pwd` and into `buf`
    // (whose true length is passed), and sets `result` to `&mut pwd` or null. Both outlive
    // the reads below; the strings it points `pwd` at lie inside `buf`, which is not touched
    // until they have been copied out.
    #[allow(unsafe_code)]
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result);
        if rc != 0 || result.is_null() || pwd.pw_dir.is_null() {
            return None;
        }
        let dir = CStr::from_ptr(pwd.pw_dir).to_bytes();
        (!dir.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(dir)))
    }
}

/// `program` as the proxy would run it: found on `PATH` when it has no slash, made absolute,
/// every link resolved.
fn which(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 || program.is_absolute() {
        return std::fs::canonicalize(program).ok();
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "none".into();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Managed, PolicyError> {
        Managed::parse(text, Path::new("m.toml"), String::new())
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        for (text, says) in [
            ("[roots]\nwithn = []\n", "withn"),
            ("[roots]\nwithin = [\"rel/path\"]\n", "not absolute"),
            ("[roots]\nread_only = [\"/a/../b\"]\n", "`..`"),
            ("[limits]\nbytes_per_second = 0\n", "unlimited"),
            ("[remote]\nallow = [\"ftp://x/\"]\n", "not an http"),
            ("[servers]\nallow = [\"bin/x\"]\n", "not an absolute"),
            (
                "[servers]\nallow = [{ path = \"/bin/x\", sha256 = \"12\" }]\n",
                "64 hex",
            ),
            ("[confine]\nrequired = \"always\"\n", "always"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
            assert!(err.contains("m.toml"), "{err}");
        }
    }

    #[test]
    fn limits_above_a_ceiling_are_lowered_and_a_set_value_is_named() {
        let m = parse("[limits]\nmax_file_size = 1000\nbytes_per_second = 500\n").unwrap();
        let (capped, refused) = m.cap_limits(&LimitsFile::default());
        assert_eq!((capped.max_file_size, capped.bytes_per_second), (1000, 500));
        assert!(refused.is_empty(), "defaults are lowered, not refused");
        let asked = LimitsFile {
            max_file_size: 5000,
            ..LimitsFile::default()
        };
        let (_, refused) = m.cap_limits(&asked);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].rule, "[limits] max_file_size");
    }

    #[test]
    fn a_url_is_allowed_by_origin_and_whole_path_segments() {
        let m = parse("[remote]\nallow = [\"https://mcp.example.com/team/mcp\"]\n").unwrap();
        let ok = |u: &str| m.refuse_url(&url::Url::parse(u).unwrap()).is_none();
        assert!(ok("https://mcp.example.com/team/mcp"));
        assert!(ok("https://mcp.example.com:443/team/mcp/"));
        assert!(ok("https://mcp.example.com/team/mcp/more"));
        assert!(!ok("https://mcp.example.com/team/mcpx"));
        assert!(!ok("http://mcp.example.com/team/mcp"));
        assert!(!ok("https://mcp.example.com.evil/team/mcp"));
        assert!(!ok("https://mcp.example.com:8443/team/mcp"));
        assert!(!ok("https://evil@other.example/team/mcp"));
    }

    #[test]
    fn folders_are_compared_by_whole_components() {
        let m = parse("[roots]\nwithin = [\"/srv/work\"]\n").unwrap();
        assert!(m.refuse_root(Path::new("/srv/work/a")).is_none());
        assert!(m.refuse_root(Path::new("/srv/work")).is_none());
        assert!(m.refuse_root(Path::new("/srv/workshop")).is_some());
        assert!(m.refuse_root(Path::new("/srv")).is_some());
    }
}

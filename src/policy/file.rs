//! The policy file as written: strict serde types, also the source of `policy schema`, and
//! how a path written in it reads ([`expand`]).

// Ambient `std::fs` calls are allowed here (clippy.toml): the policy file is the broker's own.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::PolicyError;
use crate::limits::MAX_POLICY_BYTES;
use crate::sandbox::{ConsentMode, Mode};

/// A policy file (TOML). Unknown keys are errors.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "fsbroker policy")]
pub struct PolicyFile {
    /// Approved roots: the only directories a server can reach.
    #[serde(default)]
    pub root: Vec<RootEntry>,
    /// Limits on sizes, time and rates.
    #[serde(default)]
    pub limits: LimitsFile,
    /// How `consent = "prompt"` roots ask a person.
    #[serde(default)]
    pub consent: ConsentFile,
    /// The hash-chained audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditFile>,
    /// How `fsbroker proxy` confines the server it starts (Landlock).
    #[serde(default)]
    pub confine: ConfineFile,
    /// The person's console: a local web page to answer prompts, watch and revoke.
    #[serde(default)]
    pub console: ConsoleFile,
}

/// The `[console]` table: the local web page where the person answers consent prompts, sees
/// what every server does and takes access back (`fsbroker serve|proxy --console`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleFile {
    /// Serve the console (as `--console` does).
    pub enabled: bool,
    /// The loopback address and port to serve it on (default `127.0.0.1:0`: any free port).
    /// Only loopback addresses are accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Write the console's URL, token included, to this file, readable by its owner only
    /// (as `--console-url-file`). Relative to the policy file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url_file: Option<PathBuf>,
}

/// The `[confine]` table: the kernel sandbox `fsbroker proxy` puts its server in.
#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConfineFile {
    /// `off` (default), `best-effort` (what the kernel can enforce; the rest is named on
    /// stderr) or `strict` (refuse to start unless every rule is enforced). `--confine` and
    /// `--confine=strict` override it.
    pub mode: ConfineMode,
    /// More paths the server may read (and run programs from), beyond its roots and what it
    /// needs to run. Relative to the policy file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<PathBuf>,
    /// More paths the server may read and write. Relative to the policy file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<PathBuf>,
    /// Let the server open TCP connections and listen on TCP ports (default: refused, where
    /// the kernel can refuse them).
    pub net: bool,
    /// Registries a launcher may install a missing package from before the server starts
    /// (`"npm"`, `"pypi"`): `npx -y PKG` or `uvx PKG` with nothing installed. The install runs
    /// before the server, with the network, into fsbroker's own cache, and runs none of the
    /// package's code; the server then runs confined with no network. Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fetch: Vec<Registry>,
    /// What happens to a confined server when a policy reload takes away access it was
    /// started with: `end` (default: it is stopped, and the host sees it exit) or `keep`
    /// (it keeps its access until it restarts; a warning says so).
    pub on_revoke: OnRevoke,
}

/// A package registry a launcher may install from (`[confine] fetch`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Registry {
    /// The npm registry, as npm's own configuration names it (`npx -y`, `npm exec`).
    Npm,
    /// The Python Package Index, as uv's and pip's configuration name it (`uvx`, `pipx run`).
    Pypi,
}

impl Registry {
    /// Its name in policies and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Registry::Npm => "npm",
            Registry::Pypi => "pypi",
        }
    }
}

/// `[confine] mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConfineMode {
    /// No kernel sandbox.
    #[default]
    Off,
    /// Enforce what the kernel can; name the rest on stderr.
    BestEffort,
    /// Refuse to start unless the kernel enforces every rule.
    Strict,
}

/// `[confine] on_revoke`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnRevoke {
    /// Stop the server.
    #[default]
    End,
    /// Let it run with the access it started with.
    Keep,
}

/// The `[consent]` table: how a `prompt` root asks.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConsentFile {
    /// An external program (argv) that decides: it gets a JSON request on stdin and prints
    /// a JSON decision. When set, it is used instead of the terminal.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Ask on the controlling terminal (`/dev/tty`) when there is one and no command is set.
    pub terminal: bool,
    /// A prompt unanswered for this long is a denial.
    pub timeout_ms: u64,
    /// Who is asked: `auto` (default: the command when one is set, else the console when one
    /// is open, else the terminal when allowed), or only `command`, `console` or `terminal`.
    pub provider: Provider,
}

/// `[consent] provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// The command if set, else an open console, else the terminal (if `terminal`).
    #[default]
    Auto,
    /// Only the `command`.
    Command,
    /// Only the console (`--console`): with none open, every prompt is a denial.
    Console,
    /// Only the controlling terminal.
    Terminal,
}

impl Default for ConsentFile {
    fn default() -> Self {
        ConsentFile {
            command: Vec::new(),
            terminal: true,
            timeout_ms: 60_000,
            provider: Provider::Auto,
        }
    }
}

/// The `[audit]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditFile {
    /// The log file: JSON lines, append-only, hash-chained. Relative to the policy file.
    pub path: PathBuf,
    /// Log the sha256 of paths instead of the paths.
    #[serde(default)]
    pub redact_paths: bool,
    /// Roll to a new file once the log would grow past this many bytes (at least 4096). The
    /// full file is kept beside it as `PATH.<UTC time>`, and the new file's first line
    /// continues the chain. Unset: one file that grows for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// Also send every line, as it is written, to the machine's syslog as RFC 5424: `true`
    /// for `/dev/log`, or the path of another Unix datagram socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syslog: Option<CopyTarget>,
    /// The syslog facility of those copies (`authpriv` unless set; `auth`, `daemon`, `user`,
    /// `local0` … `local7` also).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syslog_facility: Option<String>,
    /// Also send every line to the systemd journal over its native protocol, the line's
    /// members as `FSBROKER_*` fields: `true` for `/run/systemd/journal/socket`, or the path
    /// of another Unix datagram socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journald: Option<CopyTarget>,
    /// Refuse every audited request once a copy could not be delivered, as when the file
    /// cannot be written. Default: carry on, and record the gap in the log
    /// (`copy-lost`, then `copy-resumed` with the number of lines the copy missed).
    #[serde(default)]
    pub require_copies: bool,
}

/// Where a copy of the audit log goes: `true` for the system's usual socket, `false` for
/// nowhere, or a socket path.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum CopyTarget {
    /// `true`: the usual socket; `false`: no copy.
    Enabled(bool),
    /// A Unix datagram socket's path.
    Socket(PathBuf),
}

/// One `[[root]]` table.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RootEntry {
    /// The directory. Must exist. `~/` is the user's home; a relative path is relative to
    /// the policy file's directory. Canonicalised at load.
    pub path: PathBuf,
    /// Unique single path segment; the first segment of `NAME/rel` paths. Default: the
    /// directory's last component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `read-only` (default) or `read-write`.
    #[serde(default)]
    pub mode: Mode,
    /// `auto`, `prompt` (default) or `deny`: how `files/consent` is answered.
    #[serde(default)]
    pub consent: ConsentMode,
    /// Globs relative to the root (`*` stops at `/`; `dir/**` hides `dir` too): these
    /// paths are hidden from listings and refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<String>,
}

/// The default `max_chunk_size`: 7 MiB, whose base64 (9.8 MB) and the JSON around it stay
/// under the 10 MiB the TypeScript SDK's stdio transports take in one line (a longer line
/// closes their connection). 8 MiB of base64 is 11.2 MB.
pub(super) const DEFAULT_MAX_CHUNK: u64 = 7 << 20;

/// The `[limits]` table. Sizes are bytes, times milliseconds.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    /// Default read length.
    pub chunk_size: u64,
    /// Largest read or write payload (decoded). The default, 7 MiB, keeps a base64 chunk's
    /// line under the 10 MiB that TypeScript SDK peers accept.
    pub max_chunk_size: u64,
    /// Largest file a write may produce.
    pub max_file_size: u64,
    /// Per-operation time limit.
    pub timeout_ms: u64,
    /// Requests per second per session; 0 = unlimited.
    pub requests_per_second: u32,
    /// Requests that may arrive at once above the rate.
    pub request_burst: u32,
    /// Read plus write payload bytes per second per session; 0 = unlimited.
    pub bytes_per_second: u64,
    /// Watches per session.
    pub max_watches: u32,
    /// Entries per `files/list` response (then `nextCursor`).
    pub max_list_entries: u32,
    /// Kept locks per session.
    pub max_locks: u32,
    /// A kept lock is dropped after this long.
    pub lock_timeout_ms: u64,
    /// Requests of one session handled at once; beyond this the broker stops reading the
    /// session's input (extension).
    pub max_in_flight: u32,
    /// Unfinished uploads per session (extension).
    pub max_uploads: u32,
    /// Connections a `serve --listen` broker serves at once (extension).
    pub max_sessions: u32,
    /// Bytes of request lines still arriving that a broker holds across all its connections
    /// (extension).
    pub max_pending_input: u64,
}

impl Default for LimitsFile {
    fn default() -> Self {
        LimitsFile {
            chunk_size: 1 << 20,
            max_chunk_size: DEFAULT_MAX_CHUNK,
            max_file_size: 1 << 30,
            timeout_ms: 60_000,
            requests_per_second: 200,
            request_burst: 400,
            bytes_per_second: 0,
            max_watches: 64,
            max_list_entries: 10_000,
            max_locks: 256,
            lock_timeout_ms: 300_000,
            max_in_flight: 64,
            max_uploads: 16,
            max_sessions: 64,
            max_pending_input: 96 << 20,
        }
    }
}

impl PolicyFile {
    /// Reads and parses a policy file.
    ///
    /// The read never waits on another process: the file is opened non-blocking, so a lease
    /// on it is [`PolicyError::Held`] at once instead of a wait of up to the kernel's
    /// `lease-break-time`, and a FIFO or device put in its place is refused, as is a file
    /// over `MAX_POLICY_BYTES` (4 MiB).
    pub fn load(path: &Path) -> Result<PolicyFile, PolicyError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let read = |source| PolicyError::Read {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::WouldBlock => PolicyError::Held {
                    path: path.to_owned(),
                },
                _ => read(e),
            })?;
        let meta = file.metadata().map_err(read)?;
        if !meta.is_file() {
            return Err(read(std::io::Error::other("not a regular file")));
        }
        let mut text = String::new();
        file.take(MAX_POLICY_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_POLICY_BYTES {
            return Err(read(std::io::Error::other(format!(
                "larger than {MAX_POLICY_BYTES} bytes: not a policy"
            ))));
        }
        Self::parse(&text, path)
    }

    /// Parses policy text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<PolicyFile, PolicyError> {
        toml::from_str(text).map_err(|e| PolicyError::Parse {
            path: origin.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
    }

    /// The JSON Schema of the policy file, for editors.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(PolicyFile))
            .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
    }
}

/// `~/x` → `$HOME/x`; a relative path → under `base` (the policy's directory) when given,
/// else under the working directory (command-line roots).
pub(super) fn expand(path: &Path, base: Option<&Path>) -> PathBuf {
    if let Ok(rest) = path.strip_prefix("~") {
        if let Some(home) = std::env::var_os("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    match base {
        Some(base) if path.is_relative() => base.join(path),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = "[[root]]\npath = \"/tmp\"\n\n[limits]\nchunk_sise = 4\n";
        let err = PolicyFile::parse(text, Path::new("p.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("chunk_sise"), "{err}");
        assert!(err.contains("line 5"), "{err}");
    }

    #[test]
    fn defaults_follow_the_contract() {
        let p = PolicyFile::parse("[[root]]\npath = \"/tmp\"\n", Path::new("p")).unwrap();
        assert_eq!(p.root[0].mode, Mode::ReadOnly);
        assert_eq!(p.root[0].consent, ConsentMode::Prompt);
        assert_eq!(p.limits, LimitsFile::default());
        assert_eq!(p.limits.max_chunk_size, 7_340_032); // docs/protocol.md, "Policy": not the 8 MiB first written
    }

    #[test]
    fn bad_enum_value_is_an_error() {
        let err = PolicyFile::parse("[[root]]\npath = \"/x\"\nmode = \"rw\"\n", Path::new("p"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rw") && err.contains("line 3"), "{err}");
    }
}

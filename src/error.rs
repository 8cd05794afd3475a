//! The broker's one error type, and the single place that maps it to the wire.
//!
//! Every failure a request can meet becomes an [`Error`]: a closed [`ErrorKind`], the
//! request path it concerns (as the server wrote it) and a human reason. [`ErrorKind::wire`]
//! is the only mapping from kinds to JSON-RPC numbers and `data.code` strings, so the error table
//! of docs/protocol.md lives in exactly one `match`.

use std::io;

/// What went wrong, in the wire contract's vocabulary (docs/protocol.md, the error table).
///
/// The file-system kinds carry a `data.code` string on the wire; the JSON-RPC kinds
/// (`ParseError` .. `Internal`) are the standard protocol errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The path does not exist.
    FileNotFound,
    /// Outside every root, no consent, read-only root, denied glob, or the OS refused.
    PermissionDenied,
    /// Malformed path, or not the kind of file the operation needs.
    InvalidPath,
    /// Any other file-system failure; the reason says which.
    Io,
    /// The operation ran past `timeout_ms`.
    Timeout,
    /// `ifMatch` mismatch or a wrong upload offset.
    ConcurrencyConflict,
    /// A size limit, or too many watches or locks.
    QuotaExceeded,
    /// Over the session's rate.
    RateLimited,
    /// The rename target exists and overwrite was not asked.
    AlreadyExists,
    /// A write's content does not have the SHA-256 the write gave (*ext*); nothing was
    /// committed.
    ChecksumMismatch,
    /// Locked by another session or upload.
    FileLocked,
    /// The line is not JSON (`-32700`).
    ParseError,
    /// JSON, but not a JSON-RPC request (`-32600`).
    InvalidRequest,
    /// Unknown method (`-32601`).
    MethodNotFound,
    /// Missing or ill-typed parameter (`-32602`).
    InvalidParams,
    /// A bug or an unexpected failure inside the broker (`-32603`).
    Internal,
}

/// How an [`ErrorKind`] appears on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireCode {
    /// The JSON-RPC `error.code`.
    pub number: i32,
    /// The draft's string code for `error.data.code`, for file-system kinds.
    pub name: Option<&'static str>,
    /// A short lower-case label that starts `error.message`.
    pub label: &'static str,
}

impl ErrorKind {
    /// docs/protocol.md's error table: the one place a kind becomes wire numbers and names.
    pub fn wire(self) -> WireCode {
        let (number, name, label) = match self {
            ErrorKind::FileNotFound => (-31001, Some("FILE_NOT_FOUND"), "file not found"),
            ErrorKind::PermissionDenied => (-31002, Some("PERMISSION_DENIED"), "permission denied"),
            ErrorKind::InvalidPath => (-31003, Some("INVALID_PATH"), "invalid path"),
            ErrorKind::Io => (-31004, Some("IO_ERROR"), "i/o error"),
            ErrorKind::Timeout => (-31005, Some("TIMEOUT"), "timeout"),
            ErrorKind::ConcurrencyConflict => {
                (-31006, Some("CONCURRENCY_CONFLICT"), "concurrency conflict")
            }
            ErrorKind::QuotaExceeded => (-31007, Some("QUOTA_EXCEEDED"), "quota exceeded"),
            ErrorKind::RateLimited => (-31008, Some("RATE_LIMITED"), "rate limited"),
            ErrorKind::AlreadyExists => (-31009, Some("ALREADY_EXISTS"), "already exists"),
            ErrorKind::ChecksumMismatch => (-31010, Some("CHECKSUM_MISMATCH"), "checksum mismatch"),
            ErrorKind::FileLocked => (-32100, Some("FILE_LOCKED"), "file locked"),
            ErrorKind::ParseError => (-32700, None, "parse error"),
            ErrorKind::InvalidRequest => (-32600, None, "invalid request"),
            ErrorKind::MethodNotFound => (-32601, None, "method not found"),
            ErrorKind::InvalidParams => (-32602, None, "invalid params"),
            ErrorKind::Internal => (-32603, None, "internal error"),
        };
        WireCode {
            number,
            name,
            label,
        }
    }
}

impl ErrorKind {
    /// The name an audit line gives this outcome: the `data.code`, or for JSON-RPC errors a
    /// name in the same style.
    pub fn outcome(self) -> &'static str {
        match self {
            ErrorKind::ParseError => "PARSE_ERROR",
            ErrorKind::InvalidRequest => "INVALID_REQUEST",
            ErrorKind::MethodNotFound => "METHOD_NOT_FOUND",
            ErrorKind::InvalidParams => "INVALID_PARAMS",
            ErrorKind::Internal => "INTERNAL_ERROR",
            other => other.wire().name.unwrap_or("ERROR"),
        }
    }
}

/// A failed request: its kind, the path it concerns, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}{}", kind.wire().label, path.as_deref().map(|p| format!(" ({p})")).unwrap_or_default())]
pub struct Error {
    kind: ErrorKind,
    path: Option<String>,
    reason: String,
    retry_after_ms: Option<u64>,
}

/// The reason every confinement refusal carries, so servers and tests can rely on it.
pub const OUTSIDE_EVERY_ROOT: &str = "outside every root";

impl Error {
    /// An error of `kind` with a reason and no path.
    pub fn new(kind: ErrorKind, reason: impl Into<String>) -> Self {
        Error {
            kind,
            path: None,
            reason: reason.into(),
            retry_after_ms: None,
        }
    }

    /// Attaches the request path this error concerns (kept as the server wrote it).
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// Attaches `path` unless a path is already set (an inner layer knew better).
    pub fn or_path(self, path: &str) -> Self {
        if self.path.is_some() {
            self
        } else {
            self.with_path(path)
        }
    }

    /// The kind, which decides the wire code.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The request path this error concerns, if any.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// Why it failed, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// `error.message` on the wire: `"<label>: <reason>"`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.kind.wire().label, self.reason)
    }

    /// `RATE_LIMITED`, with how long to wait before the same request would be admitted.
    pub fn rate_limited(what: &str, retry_after: std::time::Duration) -> Self {
        // Round up: waiting the advertised time must be enough.
        let ms = retry_after.as_micros().div_ceil(1000) as u64;
        let mut e = Error::new(
            ErrorKind::RateLimited,
            format!("over this session's {what} limit; retry after {ms} ms"),
        );
        e.retry_after_ms = Some(ms);
        e
    }

    /// For `RATE_LIMITED`: milliseconds until the request would be admitted.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.retry_after_ms
    }

    /// Shorthand for a refusal because the path is not beneath any root.
    pub fn outside_roots() -> Self {
        Error::new(ErrorKind::PermissionDenied, OUTSIDE_EVERY_ROOT)
    }

    /// Shorthand for `-32602 invalid params`.
    pub fn invalid_params(reason: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidParams, reason)
    }

    /// Maps an OS error met while working on `path` to the contract's kinds.
    ///
    /// cap-std reports an escape attempt (`..` above the root, a symlink leading out, an
    /// absolute symlink) as `PermissionDenied` *without* a raw OS error; a real `EACCES` or
    /// `EPERM` carries one. Telling the two apart here is what lets every escape become
    /// "outside every root" while an OS refusal says so.
    pub fn from_io(err: &io::Error, path: &str) -> Self {
        let (kind, reason) = match (err.kind(), err.raw_os_error()) {
            (io::ErrorKind::PermissionDenied, None) => {
                (ErrorKind::PermissionDenied, OUTSIDE_EVERY_ROOT.to_owned())
            }
            (_, Some(libc_errno)) => match rustix::io::Errno::from_raw_os_error(libc_errno) {
                rustix::io::Errno::NOENT => {
                    (ErrorKind::FileNotFound, "no such file or directory".into())
                }
                rustix::io::Errno::ACCESS | rustix::io::Errno::PERM => (
                    ErrorKind::PermissionDenied,
                    format!("refused by the OS: {err}"),
                ),
                rustix::io::Errno::XDEV => (ErrorKind::PermissionDenied, OUTSIDE_EVERY_ROOT.into()),
                rustix::io::Errno::NAMETOOLONG => (ErrorKind::InvalidPath, "path too long".into()),
                rustix::io::Errno::NOTDIR => (
                    ErrorKind::InvalidPath,
                    "a component of the path is not a directory".into(),
                ),
                rustix::io::Errno::LOOP => {
                    (ErrorKind::Io, "too many levels of symbolic links".into())
                }
                rustix::io::Errno::ISDIR => (ErrorKind::InvalidPath, "is a directory".into()),
                rustix::io::Errno::EXIST => (ErrorKind::AlreadyExists, "already exists".into()),
                rustix::io::Errno::FBIG | rustix::io::Errno::NOSPC | rustix::io::Errno::DQUOT => {
                    (ErrorKind::QuotaExceeded, err.to_string())
                }
                _ => (ErrorKind::Io, err.to_string()),
            },
            (io::ErrorKind::NotFound, None) => {
                (ErrorKind::FileNotFound, "no such file or directory".into())
            }
            (io::ErrorKind::InvalidInput, None) => (ErrorKind::InvalidPath, err.to_string()),
            _ => (ErrorKind::Io, err.to_string()),
        };
        Error::new(kind, reason).with_path(path)
    }
}

/// A `Result` whose error is the broker's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_without_os_error_is_outside_roots() {
        let escape = io::Error::new(io::ErrorKind::PermissionDenied, "a path led outside");
        let e = Error::from_io(&escape, "../x");
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert_eq!(e.reason(), OUTSIDE_EVERY_ROOT);
        assert_eq!(e.path(), Some("../x"));
    }

    #[test]
    fn os_refusal_says_so() {
        let eacces = io::Error::from_raw_os_error(13);
        let e = Error::from_io(&eacces, "p");
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert!(
            e.reason().starts_with("refused by the OS"),
            "{}",
            e.reason()
        );
    }

    #[test]
    fn wire_numbers_match_the_contract() {
        let table = [
            (ErrorKind::FileNotFound, -31001, "FILE_NOT_FOUND"),
            (ErrorKind::PermissionDenied, -31002, "PERMISSION_DENIED"),
            (ErrorKind::InvalidPath, -31003, "INVALID_PATH"),
            (ErrorKind::Io, -31004, "IO_ERROR"),
            (ErrorKind::Timeout, -31005, "TIMEOUT"),
            (
                ErrorKind::ConcurrencyConflict,
                -31006,
                "CONCURRENCY_CONFLICT",
            ),
            (ErrorKind::QuotaExceeded, -31007, "QUOTA_EXCEEDED"),
            (ErrorKind::RateLimited, -31008, "RATE_LIMITED"),
            (ErrorKind::AlreadyExists, -31009, "ALREADY_EXISTS"),
            (ErrorKind::ChecksumMismatch, -31010, "CHECKSUM_MISMATCH"),
            (ErrorKind::FileLocked, -32100, "FILE_LOCKED"),
        ];
        for (kind, number, name) in table {
            assert_eq!(kind.wire().number, number);
            assert_eq!(kind.wire().name, Some(name));
        }
        assert_eq!(ErrorKind::MethodNotFound.wire().number, -32601);
        assert_eq!(ErrorKind::InvalidParams.wire().name, None);
    }
}

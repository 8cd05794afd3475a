//! Policy: what the TOML file says ([`PolicyFile`]), and what the broker runs with ([`Policy`]).
//!
//! A [`PolicyFile`] is parsed strictly (unknown keys are errors naming the key and line),
//! merged with command-line roots ([`Overrides`]), then compiled once into a [`Policy`]:
//! opened root capabilities, compiled globs, validated limits. Requests read a snapshot of
//! the compiled policy and never the file.

mod compiled;
mod config;
mod file;
mod limits;
mod managed;

use std::path::PathBuf;

pub use compiled::{Overrides, Policy};
pub use config::{
    AuditConfig, ConfineConfig, ConsentConfig, ConsoleConfig, CopyConfig, MIN_AUDIT_BYTES,
    loopback_addr,
};
pub use file::{
    AuditFile, ConfineFile, ConfineMode, ConsentFile, ConsoleFile, CopyTarget, LimitsFile,
    OnRevoke, PolicyFile, Provider, Registry, RootEntry,
};
pub use limits::Limits;
pub use managed::{
    AllowedServer, CopyKind, MANAGED_PATH, Managed, ManagedAudit, ManagedConfine, ManagedConsole,
    ManagedFile, ManagedLimits, ManagedRemote, ManagedRoots, ManagedServers, Narrowing,
};

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy {path}: {source}")]
    Read {
        /// The policy file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another process holds a lease on the file, so reading it would wait out the kernel's
    /// `lease-break-time`: a server trying to delay a reload (its own revocation). The broker
    /// withdraws every root until it can read the file again ([`crate::Broker::reload`]).
    #[error(
        "cannot read policy {path}: another process holds a lease on it, which would delay the \
         read; every root is withdrawn until it can be read"
    )]
    Held {
        /// The policy file.
        path: PathBuf,
    },
    /// The TOML is malformed, has an unknown key or a value of the wrong type.
    #[error("invalid policy {path}: {message}")]
    Parse {
        /// The policy file.
        path: PathBuf,
        /// The parser's message, which names the key and the line.
        message: String,
    },
    /// A root cannot be opened: its directory, its name or a deny glob is wrong.
    #[error(transparent)]
    Root(#[from] crate::sandbox::RootError),
    /// Two roots share a name.
    #[error("two roots are named {name:?} ({first} and {second}); give one of them a `name`")]
    DuplicateName {
        /// The shared name.
        name: String,
        /// The first root's path.
        first: PathBuf,
        /// The second root's path.
        second: PathBuf,
    },
    /// The same directory is configured twice.
    #[error("directory {path} is listed twice, as {first:?} and {second:?}")]
    DuplicatePath {
        /// The canonical directory.
        path: PathBuf,
        /// The first name.
        first: String,
        /// The second name.
        second: String,
    },
    /// The `[consent]` or `[audit]` table is inconsistent.
    #[error("[{table}] {reason}")]
    Table {
        /// The table's name.
        table: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The managed policy (`/etc/fsbroker/managed.toml`) is there but cannot be trusted or
    /// read: not owned by root, writable by another user, a link, or not a valid managed
    /// policy. Nothing runs without it (and a running broker withdraws every root).
    #[error("managed policy {path}: {reason}; fsbroker does not run without it")]
    Managed {
        /// The managed policy file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The person asked for more than the managed policy allows.
    #[error("refused by the managed policy {}, {}: {}", managed::MANAGED_PATH, .0.rule, .0.reason)]
    Narrowed(Narrowing),
    /// A limit is out of range or inconsistent with another.
    #[error("[limits] {key}: {reason}")]
    Limit {
        /// The key under `[limits]`.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

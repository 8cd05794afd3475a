//! `fsbroker proxy --confine`: the kernel holds the server to its roots.
//!
//! A policy binds a server only while the server asks fsbroker for files. One that opens
//! files itself (the reference filesystem server does) is bound by nothing but its own
//! checks. `--confine` starts the server in a Landlock domain built from the policy
//! ([`plan`]): read-write roots readable and writable, read-only roots readable, `deny` roots
//! and unapproved `prompt` roots not at all; what the server needs to run, read-only
//! (`runtime.rs`); a private temporary directory; no network unless `[confine] net` allows it. The
//! kernel then refuses everything else, to the server and everything it starts, for good.
//!
//! What Landlock cannot express (deny globs, files of fsbroker's own inside a read-write
//! root, rights an older kernel lacks) is named by the plan ([`Plan::gaps`]): best effort
//! runs and says so on stderr, strict refuses to start. See docs/security.md, "Confinement".
//!
//! The domain is built from the plan: `plan.rs` makes it, from what the roots grant
//! (`roots.rs`) and what the server's command line may be granted (`guard.rs`); `kernel.rs`
//! turns it into a Landlock ruleset and `seccomp.rs` into a filter. `spawn.rs` holds what is
//! built for one server's process and enters it between `fork` and `exec`.

// Ambient `std::fs` calls are allowed here (clippy.toml): the sandbox is built from the policy's own paths and the server's command line, before any request.
#![allow(clippy::disallowed_methods)]

mod guard;
pub mod kernel;
pub mod launch;
mod plan;
pub(crate) mod reap;
mod roots;
pub(crate) mod runtime;
pub(crate) mod seccomp;
mod spawn;
pub(crate) mod tmp;
pub(crate) mod walk;

use std::path::PathBuf;

use crate::policy::{ConfineMode, Policy};

pub use plan::plan;
pub use spawn::Confinement;

/// Why a server cannot be confined.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The server's command line cannot be resolved.
    #[error("confine: {0}")]
    Command(String),
    /// A path of the plan cannot be opened for a rule.
    #[error("confine: {path}: {reason}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The kernel refused the ruleset.
    #[error("confine: the kernel refused the ruleset: {0}")]
    Kernel(String),
    /// `--confine=strict` and something would not be enforced.
    #[error(
        "confine=strict: not every rule can be enforced here, so the server was not started:\n{}",
        .0.iter().map(|g| format!("  - {g}")).collect::<Vec<_>>().join("\n")
    )]
    Strict(Vec<String>),
    /// A launcher's package is not installed, and fetching it is not allowed.
    #[error(
        "confine: {launcher}: {package} is not installed anywhere it would run from, and a \
         confined server has no network to fetch it with: {instead}"
    )]
    NotInstalled {
        /// The launcher (`npx`).
        launcher: String,
        /// The package.
        package: String,
        /// What to do.
        instead: String,
    },
    /// fsbroker's install of a launcher's missing package failed.
    #[error("confine: installing {package} before the server starts failed: {reason}")]
    Install {
        /// The package.
        package: String,
        /// Why, with the installer's last words.
        reason: String,
    },
    /// The private temporary directory cannot be made.
    #[error("confine: cannot make the server's temporary directory: {0}")]
    Temp(std::io::Error),
}

/// What a rule lets the server do beneath its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, and run programs.
    ReadExec,
    /// Read, write, create, remove and rename.
    ReadWrite,
    /// Open a device to read and write (`/dev/null`).
    Device,
}

/// One allowed path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rule {
    /// The path; everything beneath it too.
    pub path: PathBuf,
    /// What is allowed there.
    pub access: Access,
    /// Why it is allowed, for `confine check` and the audit log.
    pub why: String,
    /// The device and inode the plan resolved the path to (`walk::resolve`); the kernel
    /// step grants the path only if it still is that file. `None`: it did not exist.
    #[serde(skip)]
    pub id: Option<(u64, u64)>,
}

/// A root the server gets nothing of, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Withheld {
    /// The root's directory.
    pub path: PathBuf,
    /// Why.
    pub why: String,
}

/// Everything a confined server is allowed, and what cannot be enforced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    /// The allowed paths: roots, then what the server needs to run, then the policy's
    /// additions, then its temporary directory.
    pub rules: Vec<Rule>,
    /// Roots the server gets nothing of.
    pub withheld: Vec<Withheld>,
    /// Whether TCP is allowed.
    pub net: bool,
    /// Rules of the policy Landlock cannot express, whatever the kernel.
    pub inexpressible: Vec<String>,
    /// What the server's command line would have granted and was not, or was narrowed (too
    /// broad, or reached through a symlink the server could have planted).
    pub narrowed: Vec<String>,
    /// The launcher recognised on the command line, what it resolved to and what it was
    /// granted ([`launch`]).
    pub launch: Option<launch::Launch>,
    /// The command the server is started with: the one given, or what its launcher would
    /// have run ([`launch::Launch::command`]).
    #[serde(skip)]
    pub command: Vec<std::ffi::OsString>,
    /// Whether a reload that takes access away ends the server (`[confine] on_revoke`):
    /// then the server must not be able to stop the proxy, which only the kernel's signal
    /// scoping (Landlock ABI 6) holds it to.
    pub ends_on_revoke: bool,
}

/// What a plan leaves unenforced on some kernel.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Gaps {
    /// Rules of the plan the kernel will not hold the server to: `--confine=strict` refuses
    /// to start when there is any.
    pub rules: Vec<String>,
    /// Hardening beyond the plan's rules that this kernel lacks (named, never refused for).
    pub hardening: Vec<String>,
}

/// How `--confine` was asked for: the command line's choice over the policy's.
pub fn mode(flag: Option<ConfineMode>, policy: &Policy) -> ConfineMode {
    flag.unwrap_or(policy.confine().mode)
}

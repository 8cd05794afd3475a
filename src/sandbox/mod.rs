//! The only door to the disk.
//!
//! A request path never reaches `std::fs`. [`resolve`] turns it, lexically, into a [`Root`]
//! and a normalised relative path; every open then goes through that root's
//! `cap_std::fs::Dir`, where `openat2(RESOLVE_BENEATH)` (or cap-std's race-safe
//! component-by-component fallback) refuses `..` above the root, absolute symlinks and
//! symlinks that lead out. `open.rs` adds what confinement alone does not give: refusing
//! anything that is not a regular file before it can block, and checking deny globs against
//! where a path *really* leads ([`Resolved::real`]), not only how it was spelled.
//! `protected.rs` keeps the broker's own files (its policy, its audit log, ...) out of every
//! root, and each [`Root`] applies the strictest rules of every root that covers a path.

mod deny;
pub(crate) mod mutate;
pub(crate) mod open;
pub(crate) mod protected;
mod resolve;
mod root;

pub use deny::DenySet;
pub use protected::{forget_written, protect_written};
pub(crate) use resolve::join_display;
pub use resolve::{MAX_WALK_DEPTH, Resolved, resolve};
pub(crate) use root::link;
pub use root::{ConsentMode, Mode, Root, RootSpec, Shadow};

use std::path::PathBuf;

/// Marks fsbroker's staging files: `.NAME.fsbroker-RANDOM.part`.
pub const STAGING_MARK: &str = ".fsbroker-";
/// The staging files' suffix.
pub const STAGING_SUFFIX: &str = ".part";

/// Whether a directory entry's name is one of fsbroker's staging files.
pub fn is_staging_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(STAGING_SUFFIX) && name.contains(STAGING_MARK)
}

/// Why a root cannot be opened: the policy that names it reports this as its own error.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// A root directory is missing, not a directory, or cannot be opened.
    #[error("root {path}: {reason}")]
    Dir {
        /// The root's path as configured.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A root name is not a single usable path segment.
    #[error("root name {name:?} {reason}")]
    Name {
        /// The offending name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A deny glob does not compile.
    #[error("deny pattern {pattern:?}: {reason}")]
    Glob {
        /// The pattern as written.
        pattern: String,
        /// The glob compiler's message.
        reason: String,
    },
}

//! The only door to the disk.
//!
//! A request path never reaches `std::fs`. [`resolve`] turns it, lexically, into a [`Root`]
//! and a normalised relative path; every open then goes through that root's
//! `cap_std::fs::Dir`, where `openat2(RESOLVE_BENEATH)` (or cap-std's race-safe
//! component-by-component fallback) refuses `..` above the root, absolute symlinks and
//! symlinks that lead out. [`open`] adds what confinement alone does not give: refusing
//! anything that is not a regular file before it can block, and checking deny globs against
//! where a path *really* leads ([`Resolved::real`]), not only how it was spelled.
//! [`protected`] keeps the broker's own files (its policy, its audit log, ...) out of every
//! root, and each [`Root`] applies the strictest rules of every root that covers a path.

mod deny;
pub mod mutate;
pub mod open;
pub mod protected;
mod resolve;
mod root;

pub use deny::DenySet;
pub(crate) use resolve::join_display;
pub use resolve::{MAX_WALK_DEPTH, Resolved, resolve};
pub(crate) use root::link;
pub use root::{ConsentMode, Mode, Root, RootSpec};

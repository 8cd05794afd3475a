//! What a session was granted, and the one check of a path against it.
//!
//! A grant is made on a canonical path, the one the person saw, through the `prompt` root it
//! was asked about. It covers the subtree beneath it whichever root a request comes
//! through (a root nested in an approved folder included), and goes with that root when the
//! root is revoked or withdrawn.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sandbox::{ConsentMode, Root};

/// Whether a session whose grants are `grants` may touch `rel` of `root` now: the strictest
/// consent mode of every root covering the path decides (`Root::consent_at`); `auto` allows,
/// `deny` refuses, and `prompt` needs a grant covering the path.
///
/// Every place that lets a session reach a path asks this: a request's resolution (on the
/// path as spelled and where it really leads), `roots/list`, and the watcher's filter of
/// change notifications.
pub(crate) fn allows(root: &Root, rel: &str, grants: &Grants) -> bool {
    match root.consent_at(rel) {
        ConsentMode::Auto => true,
        ConsentMode::Deny => false,
        ConsentMode::Prompt => grants.covers(&root.join(rel)),
    }
}

/// A subtree granted by `files/consent` (or when `roots/list` offered a root).
#[derive(Debug, Clone)]
struct Grant {
    /// Its number, unique in this process (to revoke it by).
    id: u64,
    /// The canonical path of the root it was granted through (revoked with that root).
    root: PathBuf,
    /// The subtree's canonical absolute path, as the person saw it.
    path: PathBuf,
}

/// One grant, as a host shows it ([`crate::SessionInfo::grants`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantInfo {
    /// Its number, unique in this process: revoke it with [`crate::Broker::revoke_grant`].
    pub id: u64,
    /// The subtree granted (canonical, absolute).
    pub path: PathBuf,
    /// The root it was granted through (canonical, absolute).
    pub root: PathBuf,
}

/// Grant numbers: one count for the process, so a number names one grant of one session.
static NEXT_GRANT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One session's grants.
#[derive(Debug, Default)]
pub(crate) struct Grants(Mutex<Vec<Grant>>);

impl Grants {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grants the subtree at the canonical absolute `path`, through the root at `root`.
    /// Returns whether it was not granted before.
    pub(crate) fn grant(&self, root: &Path, path: PathBuf) -> bool {
        let mut grants = self.lock();
        if grants.iter().any(|g| g.root == root && g.path == path) {
            return false;
        }
        grants.push(Grant {
            id: NEXT_GRANT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            root: root.to_path_buf(),
            path,
        });
        true
    }

    /// Whether a grant covers the absolute path `abs` (the path itself or an ancestor),
    /// whichever root it was granted through: a person who approved a folder approved what
    /// is in it, a root nested there included.
    pub(crate) fn covers(&self, abs: &Path) -> bool {
        self.lock().iter().any(|g| abs.starts_with(&g.path))
    }

    /// The granted subtrees at or beneath the absolute path `abs`.
    pub(crate) fn within(&self, abs: &Path) -> Vec<PathBuf> {
        self.lock()
            .iter()
            .filter(|g| g.path.starts_with(abs))
            .map(|g| g.path.clone())
            .collect()
    }

    /// Every grant, oldest first.
    pub(crate) fn list(&self) -> Vec<GrantInfo> {
        self.lock()
            .iter()
            .map(|g| GrantInfo {
                id: g.id,
                path: g.path.clone(),
                root: g.root.clone(),
            })
            .collect()
    }

    /// Drops grant `id`; returns it if it was one of these.
    pub(crate) fn revoke(&self, id: u64) -> Option<GrantInfo> {
        let mut grants = self.lock();
        let at = grants.iter().position(|g| g.id == id)?;
        let g = grants.remove(at);
        Some(GrantInfo {
            id: g.id,
            path: g.path,
            root: g.root,
        })
    }

    /// Drops every grant (the session was ended).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// Drops every grant made through the root at `root` (revoked, or withdrawn by a reload).
    pub(crate) fn revoke_root(&self, root: &Path) {
        self.lock().retain(|g| g.root != root);
    }
}

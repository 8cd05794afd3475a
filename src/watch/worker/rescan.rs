//! What the worker finds by looking, where notify's events fall short: the files of a new
//! directory created before notify watched it, every change of a watch whose events were
//! lost (a full queue, an overflow), and a watched path moved or deleted through an ancestor.
//!
//! Every look runs without the registry's lock: a directory may hold a whole tree, and
//! `files/watch` and the registrar must not wait for its walk.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::outbox::merge;
use super::{Worker, visible};
use crate::policy::Policy;
use crate::watch::snapshot::{self, Diff, Stamp};
use crate::watch::{Change, Subscriber, Watch, WatchHub};

impl Worker {
    /// Lists the new directories whose look is due, reporting what appeared in them. The
    /// listing runs without the registry's lock: a directory may hold a whole tree.
    pub(super) fn recheck_new_dirs(&mut self, hub: &WatchHub, policy: &Policy) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) =
            self.rechecks.drain(..).partition(|(t, _, _)| *t <= now);
        self.rechecks = later;
        for (_, id, rel) in due {
            let Some((root, session)) = hub
                .registry()
                .watches
                .get(&id)
                .filter(|w| w.live.load(Ordering::Acquire))
                .map(|w| (w.root.clone(), w.session.clone()))
            else {
                continue;
            };
            let Some(root) = policy.roots().iter().find(|r| r.path() == root) else {
                continue;
            };
            // A new folder too large to list is reported alone.
            let found: Vec<(String, Stamp)> = snapshot::scan(root, &rel, true, true)
                .unwrap_or_default()
                .into_iter()
                .filter(|(inner, _)| visible(root, &session, inner))
                .collect();
            if found.is_empty() {
                continue;
            }
            let mut reg = hub.registry();
            let Some(w) = reg.watches.get_mut(&id) else {
                continue;
            };
            for (inner, s) in found {
                if w.snapshot.insert(inner.clone(), s).is_none() {
                    merge(&mut self.pending, w, &id, inner, Change::Created);
                }
            }
        }
    }

    /// Ends watches whose watched path no longer leads to the directory they watch (moved or
    /// deleted, possibly through an ancestor), reporting the path `deleted`. The paths are
    /// looked at without the registry's lock.
    pub(super) fn check_watched_paths(&mut self, hub: &WatchHub, policy: &Policy) {
        /// A watch's id, root, registered directory and that directory's identity.
        type Placed = (String, PathBuf, PathBuf, Option<(u64, u64)>);
        let watches: Vec<Placed> = hub
            .registry()
            .watches
            .iter()
            .map(|(id, w)| (id.clone(), w.root.clone(), w.registered.clone(), w.identity))
            .collect();
        let moved: Vec<String> = watches
            .into_iter()
            .filter(|(_, root, registered, identity)| {
                policy
                    .roots()
                    .iter()
                    .find(|r| r.path() == root)
                    .is_some_and(|root| crate::watch::identity_of(root, registered) != *identity)
            })
            .map(|(id, ..)| id)
            .collect();
        for id in moved {
            let Some((root, session, rel)) = hub
                .registry()
                .watches
                .get(&id)
                .map(|w| (w.root.clone(), w.session.clone(), w.rel.clone()))
            else {
                continue;
            };
            self.ended.push(id.clone());
            let Some(root) = policy.roots().iter().find(|r| r.path() == root) else {
                continue;
            };
            if visible(root, &session, &rel) {
                if let Some(w) = hub.registry().watches.get_mut(&id) {
                    merge(&mut self.pending, w, &id, rel, Change::Deleted);
                }
            }
        }
    }

    /// Rescans the watches `which` selects and queues what changed since their snapshots.
    /// A watch's snapshot is taken out of the registry while its tree is walked and compared,
    /// so the registry's lock is never held across a walk; only this thread reads snapshots.
    pub(super) fn rescan(
        &mut self,
        hub: &WatchHub,
        policy: &Policy,
        which: impl Fn(&Watch) -> bool,
    ) {
        /// A watch's id, root, path, whether a directory, whether recursive, and session.
        type Chosen = (String, PathBuf, String, bool, bool, Weak<dyn Subscriber>);
        let chosen: Vec<Chosen> = hub
            .registry()
            .watches
            .iter()
            .filter(|(_, w)| which(w) && w.live.load(Ordering::Acquire))
            .map(|(id, w)| {
                let session = w.session.clone();
                (
                    id.clone(),
                    w.root.clone(),
                    w.rel.clone(),
                    w.is_dir,
                    w.recursive,
                    session,
                )
            })
            .collect();
        for (id, root, rel, is_dir, recursive, session) in chosen {
            let Some(root) = policy.roots().iter().find(|r| r.path() == root) else {
                continue;
            };
            let Ok(now) = snapshot::scan(root, &rel, is_dir, recursive) else {
                // Grown too large to compare since it was set up: its events still come, but
                // a lost one is not recovered by a rescan.
                tracing::warn!(path = %rel, "a watched tree grew too large to rescan");
                if let Some(w) = hub.registry().watches.get_mut(&id) {
                    w.lost = false;
                }
                continue;
            };
            let Some(before) = hub
                .registry()
                .watches
                .get_mut(&id)
                .map(|w| std::mem::take(&mut w.snapshot))
            else {
                continue;
            };
            let diffs: Vec<(String, Change)> = snapshot::diff(&before, &now)
                .into_iter()
                .filter(|(rel, _)| visible(root, &session, rel))
                .map(|(rel, d)| {
                    let change = match d {
                        Diff::Created => Change::Created,
                        Diff::Modified => Change::Modified,
                        Diff::Deleted => Change::Deleted,
                    };
                    (rel, change)
                })
                .collect();
            drop(before);
            let mut reg = hub.registry();
            let Some(w) = reg.watches.get_mut(&id) else {
                continue;
            };
            w.snapshot = now;
            w.lost = false;
            for (rel, change) in diffs {
                merge(&mut self.pending, w, &id, rel, change);
            }
        }
    }

    /// Watches that dropped events are rescanned once their backlog has gone out.
    pub(super) fn rescan_lost(&mut self, hub: &WatchHub, policy: &Policy) {
        let busy: HashSet<String> = self.pending.keys().map(|(id, _)| id.clone()).collect();
        let lost: Vec<String> = hub
            .registry()
            .watches
            .iter()
            .filter(|(id, w)| w.lost && !busy.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        if !lost.is_empty() {
            self.rescan(hub, policy, |w| w.lost);
        }
    }
}

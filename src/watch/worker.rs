//! The watch worker: notify events in, `notifications/files/changed` out.
//!
//! Here: the worker's loop, what each notify event means for each watch, what a session may
//! be told, and the roots that disappear. What events alone miss (new directories, lost
//! events, watched paths moved away) is found again in `worker/rescan.rs`; changes wait,
//! coalesced per path, and go out in `worker/outbox.rs`.

mod outbox;
mod rescan;

use std::collections::{HashMap, HashSet};
use std::ops::Bound;
use std::path::Path;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use notify::EventKind;
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};

use super::snapshot::Stamp;
use super::{Change, Owner, Subscriber, Watch, WatchHub};
use crate::limits::{RECHECK_AFTER, ROOT_CHECK};
use crate::policy::Policy;
use crate::sandbox::Root;
use crate::sandbox::is_staging_name;
use outbox::{Pending, merge};

/// How often the worker wakes with nothing to read.
const TICK: Duration = Duration::from_millis(10);

struct Worker {
    hub: Weak<WatchHub>,
    owner: Weak<dyn Owner>,
    /// (watch id, path relative to the root) → the coalesced change waiting to go out.
    pending: HashMap<(String, String), Pending>,
    /// Sessions already warned about not reading, so the log says it once per episode.
    stalled: HashSet<u64>,
    /// New directories to list, once the batch that reported them is handled and again
    /// shortly: notify reports a directory before it has placed its watches inside, so files
    /// created in that gap are found by a later look.
    rechecks: Vec<(Instant, String, String)>,
    /// Watches whose watched path is gone, to end once their last notification is out.
    ended: Vec<String>,
    last_root_check: Instant,
}

pub(super) fn spawn(hub: Weak<WatchHub>, owner: Weak<dyn Owner>, rx: Receiver<notify::Event>) {
    let mut worker = Worker {
        hub,
        owner,
        pending: HashMap::new(),
        stalled: HashSet::new(),
        rechecks: Vec::new(),
        ended: Vec::new(),
        last_root_check: Instant::now(),
    };
    let spawned = std::thread::Builder::new()
        .name("fsbroker-watch".into())
        .spawn(move || worker.run(rx));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the watch worker; files/watch will report nothing");
    }
}

impl Worker {
    fn run(&mut self, rx: Receiver<notify::Event>) {
        loop {
            let mut batch = Vec::new();
            match rx.recv_timeout(TICK) {
                Ok(ev) => {
                    batch.push(ev);
                    while batch.len() < 4096 {
                        match rx.try_recv() {
                            Ok(ev) => batch.push(ev),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            // Strong references only for one round, so the broker can end. The hub goes with
            // its broker, so a hub that is gone ends the worker; a broker that cannot be
            // reached yet is still being built (the worker starts inside its constructor).
            let Some(hub) = self.hub.upgrade() else {
                return;
            };
            let Some(owner) = self.owner.upgrade() else {
                continue;
            };
            let policy = owner.policy();
            for ev in batch {
                self.event(&hub, &*owner, &policy, ev);
            }
            self.recheck_new_dirs(&hub, &policy);
            if hub
                .overflow
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                tracing::warn!("file events were lost (queue overflow); rescanning watched trees");
                self.rescan(&hub, &policy, |_| true);
            }
            self.rescan_lost(&hub, &policy);
            self.flush(&hub, &policy);
            if self.last_root_check.elapsed() >= ROOT_CHECK {
                self.last_root_check = Instant::now();
                check_roots(&*owner, &policy);
                self.check_watched_paths(&hub, &policy);
            }
            self.end_watches(&hub);
        }
    }

    // A rename's direction is told by an `lstat` of the path inotify reported (never an
    // open); what is reported is filtered again before a server hears of it.
    #[allow(clippy::disallowed_methods)]
    fn event(&mut self, hub: &WatchHub, owner: &dyn Owner, policy: &Policy, ev: notify::Event) {
        if ev.need_rescan() {
            // Rescan now, before later events of the same batch update the snapshots: a file
            // whose creation was lost must come out of the rescan as `created`.
            tracing::warn!("the file watcher's queue overflowed; rescanning watched trees");
            self.rescan(hub, policy, |_| true);
            return;
        }
        let change = match ev.kind {
            EventKind::Create(_) => Change::Created,
            EventKind::Remove(_) => Change::Deleted,
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) => Change::Deleted,
            EventKind::Modify(ModifyKind::Name(RenameMode::To)) => Change::Created,
            // `Both` repeats a `From` and a `To` already seen.
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => return,
            EventKind::Modify(ModifyKind::Name(_)) => match ev.paths.first() {
                Some(p) if p.symlink_metadata().is_ok() => Change::Created,
                Some(_) => Change::Deleted,
                None => return,
            },
            EventKind::Modify(_) => Change::Modified,
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Change::Modified,
            _ => return,
        };
        for path in &ev.paths {
            // A root itself deleted or moved away: retire it now rather than at the next
            // periodic check.
            if change == Change::Deleted && policy.roots().iter().any(|r| r.path() == path) {
                check_roots(owner, policy);
            }
            self.path_changed(hub, policy, path, change);
        }
    }

    fn path_changed(&mut self, hub: &WatchHub, policy: &Policy, path: &Path, change: Change) {
        let mut reg = hub.registry();
        for (id, w) in reg.watches.iter_mut() {
            if !w.live.load(Ordering::Acquire) {
                continue;
            }
            // The watched directory itself (or a watched file's directory) deleted or moved:
            // report the watched path gone and end the watch — notify would go on reporting
            // the moved directory's changes under its old path.
            if change == Change::Deleted && path == w.registered {
                self.ended.push(id.clone());
                if let Some(root) = policy.roots().iter().find(|r| r.path() == w.root) {
                    if visible(root, &w.session, &w.rel) {
                        let rel = w.rel.clone();
                        merge(&mut self.pending, w, id, rel, Change::Deleted);
                    }
                }
                continue;
            }
            if !covers(w, path) {
                continue;
            }
            let Some(root) = policy.roots().iter().find(|r| r.path() == w.root) else {
                continue;
            };
            let Some(rel) = path.strip_prefix(&w.root).ok().and_then(|r| r.to_str()) else {
                continue;
            };
            if !visible(root, &w.session, rel) {
                continue;
            }
            let stamp = if rel.is_empty() {
                root.dir().dir_metadata().ok().map(|m| Stamp::of(&m))
            } else {
                root.dir().symlink_metadata(rel).ok().map(|m| Stamp::of(&m))
            };
            // A directory's own content changes are its entries' events.
            if change == Change::Modified && stamp.is_some_and(|s| s.is_dir()) {
                continue;
            }
            // Created or modified, yet not there: a stale path (its directory moved away), or
            // gone again already (its deletion follows). Report nothing that is not there.
            if change != Change::Deleted && stamp.is_none() {
                continue;
            }
            // A change to a path this watch has never seen is its creation: the kernel's
            // watch on a new directory can start after a file in it was created but before it
            // was written, so the first event for that file says "modified".
            let change = if change == Change::Modified && !w.snapshot.contains_key(rel) {
                Change::Created
            } else {
                change
            };
            match (change, stamp) {
                (Change::Deleted, _) | (_, None) => {
                    // A path's subtree is one run of keys in the map: a tree deleted entry by
                    // entry costs each deletion its own entries, not the whole snapshot.
                    w.snapshot.remove(rel);
                    let prefix = format!("{rel}/");
                    let inside: Vec<String> = w
                        .snapshot
                        .range::<str, _>((Bound::Included(prefix.as_str()), Bound::Unbounded))
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in inside {
                        w.snapshot.remove(&k);
                    }
                }
                (_, Some(s)) => {
                    w.snapshot.insert(rel.to_owned(), s);
                }
            }
            // notify misses files created right after their directory: list a new
            // directory (once this batch is done, without the registry's lock: it may hold
            // a whole tree moved in) and report what is already inside, then again shortly.
            if change == Change::Created && w.recursive && stamp.is_some_and(|s| s.is_dir()) {
                let now = Instant::now();
                for delay in RECHECK_AFTER {
                    self.rechecks
                        .push((now + delay, id.clone(), rel.to_owned()));
                }
            }
            merge(&mut self.pending, w, id, rel.to_owned(), change);
        }
    }

    /// Ends the watches found gone, once their last notification (`deleted`) is out.
    fn end_watches(&mut self, hub: &WatchHub) {
        if self.ended.is_empty() {
            return;
        }
        let waiting: HashSet<String> = self.pending.keys().map(|(id, _)| id.clone()).collect();
        let (now, later): (Vec<String>, Vec<String>) = std::mem::take(&mut self.ended)
            .into_iter()
            .partition(|id| !waiting.contains(id));
        self.ended = later;
        hub.remove_ids(&now);
    }
}

/// Whether `path` is in what the watch covers.
fn covers(w: &Watch, path: &Path) -> bool {
    let abs = if w.is_dir {
        w.registered.clone()
    } else {
        w.registered.join(w.rel.rsplit('/').next().unwrap_or(""))
    };
    if !w.is_dir {
        return path == abs;
    }
    if w.recursive {
        path.starts_with(&abs)
    } else {
        path == abs || path.parent() == Some(abs.as_path())
    }
}

/// Whether a change at `rel` may be told to the watch's session: never a staging file,
/// never a denied path or one of fsbroker's own files (a watch on the audit log's folder
/// would otherwise time every other session's requests), only what the session's grants
/// cover, with the rules of every root covering the path, and only a path whose
/// directories are, right now, real directories beneath the root (a watch that ended up on
/// a directory reached through a swapped-in symlink reports nothing).
fn visible(root: &Root, session: &Weak<dyn Subscriber>, rel: &str) -> bool {
    if rel.split('/').any(is_staging_name) || root.is_denied(rel) {
        return false;
    }
    let abs = root.join(rel);
    if root.protected().is_own_file(&abs, None) {
        return false;
    }
    // A session that has ended is told nothing.
    if !session
        .upgrade()
        .is_some_and(|s| crate::consent::allows(root, rel, s.grants()))
    {
        return false;
    }
    match rel.rsplit_once('/') {
        None => true,
        // A parent that is gone (a tree deleted at once) hides nothing; one that resolves
        // elsewhere, or out of the root, does.
        Some((parent, _)) => match root.dir().canonicalize(parent) {
            Ok(real) => real.as_os_str() == parent,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        },
    }
}

/// Retires every root whose directory is gone: deleted, moved, or unmounted. The root's
/// descriptor still works on the old directory, so "gone" means its path no longer leads to
/// the directory the descriptor holds.
#[allow(clippy::disallowed_methods)] // an `lstat` of each root's path, as the policy names it
fn check_roots(owner: &dyn Owner, policy: &Policy) {
    use std::os::unix::fs::MetadataExt;
    for root in policy.roots() {
        let held = root.dir().dir_metadata();
        let there = std::fs::symlink_metadata(root.path());
        let same = match (&held, &there) {
            (Ok(a), Ok(b)) => {
                cap_std::fs::MetadataExt::dev(a) == b.dev()
                    && cap_std::fs::MetadataExt::ino(a) == b.ino()
            }
            _ => false,
        };
        if !same {
            tracing::warn!(root = root.name(), path = %root.path().display(), "root directory is gone (deleted, moved or unmounted); retiring it");
            owner.retire_root(root.path());
        }
    }
}

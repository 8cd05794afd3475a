//! `files/watch`: one notify watcher per broker, shared by every session and watch.
//!
//! inotify limits are per user, so there is one notify watcher (created with
//! `follow_symlinks(false)`: notify's default would walk into, and report, directories outside
//! a root through a link inside it), one registration per watched directory however many
//! watches share it, and one worker thread (`worker.rs`) that maps notify's events to
//! `created` / `modified` / `deleted`, filters them (watch path, recursion, event kinds, deny
//! globs, grants), coalesces bursts per path, rescans after an overflow, and notices roots
//! that disappear.
//!
//! notify's callback never blocks: it `try_send`s into a bounded queue, and when that queue
//! is full it raises a flag that makes the worker rescan instead.

mod snapshot;
mod worker;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use notify::{RecursiveMode, Watcher as _};

use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::sandbox::Root;

pub use snapshot::Snapshot;

/// What the watch worker needs of the broker that owns the hub: the policy in force, and a
/// way to take a root whose directory is gone out of service. The broker implements it; the
/// hub holds it weakly, so a broker can end while its worker runs.
pub(crate) trait Owner: Send + Sync {
    /// The policy in force now (a reload's roots, names and deny globs apply at once).
    fn policy(&self) -> Arc<Policy>;
    /// Retires the root at `root`, as a reload that removed it would.
    fn retire_root(&self, root: &Path);
}

/// What the watch worker needs of a session with watches: to hand it a notification, and to
/// know which `prompt` paths it was granted.
pub(crate) trait Subscriber: Send + Sync {
    /// Queues a notification frame for the session's peer; `false` if its queue is full.
    fn try_notify(&self, frame: Vec<u8>) -> bool;
    /// Whether `abs` lies in something the person granted this session.
    fn is_granted(&self, abs: &Path) -> bool;
}

/// Events a watch reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSet {
    /// `created`
    pub created: bool,
    /// `modified`
    pub modified: bool,
    /// `deleted`
    pub deleted: bool,
}

impl EventSet {
    /// All three.
    pub const ALL: EventSet = EventSet {
        created: true,
        modified: true,
        deleted: true,
    };

    /// From the wire names; an unknown name is an error naming it.
    pub fn parse(names: &[String]) -> Result<EventSet> {
        let mut set = EventSet {
            created: false,
            modified: false,
            deleted: false,
        };
        for n in names {
            match n.as_str() {
                "created" => set.created = true,
                "modified" => set.modified = true,
                "deleted" => set.deleted = true,
                other => {
                    return Err(Error::invalid_params(format!(
                        "unknown event {other:?}: expected \"created\", \"modified\" or \"deleted\""
                    )));
                }
            }
        }
        if !(set.created || set.modified || set.deleted) {
            return Err(Error::invalid_params("events must name at least one event"));
        }
        Ok(set)
    }

    fn has(&self, e: Change) -> bool {
        match e {
            Change::Created => self.created,
            Change::Modified => self.modified,
            Change::Deleted => self.deleted,
        }
    }
}

/// What a new watch covers.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    /// The watched path relative to the root, symlinks resolved.
    pub rel: String,
    /// A directory (else a file).
    pub is_dir: bool,
    /// The whole subtree (directories only).
    pub recursive: bool,
    /// The events to report.
    pub events: EventSet,
}

/// A change as reported to servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The path appeared (created, or moved in).
    Created,
    /// Its content or metadata changed.
    Modified,
    /// The path went away (deleted, or moved out).
    Deleted,
}

impl Change {
    fn name(self) -> &'static str {
        match self {
            Change::Created => "created",
            Change::Modified => "modified",
            Change::Deleted => "deleted",
        }
    }

    /// Two changes to one path within the coalescing window, as one.
    fn then(self, next: Change) -> Change {
        match (self, next) {
            (Change::Created, Change::Modified) => Change::Created,
            (Change::Deleted, Change::Created) => Change::Modified,
            (_, next) => next,
        }
    }
}

/// One watch.
#[derive(Debug)]
struct Watch {
    session: Weak<dyn Subscriber>,
    session_id: u64,
    /// The root's canonical path (the root itself is looked up in the current policy on
    /// every event, so a reload's new name or deny globs apply at once).
    root: PathBuf,
    /// The watched path relative to the root, symlinks resolved.
    rel: String,
    is_dir: bool,
    recursive: bool,
    events: EventSet,
    /// What is registered with notify for this watch (the directory, or a file's parent).
    registered: PathBuf,
    /// (device, inode) of `registered` when the watch began: if the path stops leading to
    /// that directory (it, or an ancestor, was moved or deleted), the watch ends rather than
    /// report what happens to the directory at its new place.
    identity: Option<(u64, u64)>,
    snapshot: Snapshot,
    /// Set when events for this watch had to be dropped: the next quiet moment rescans it.
    lost: bool,
}

#[derive(Debug, Default)]
struct Registry {
    watches: HashMap<String, Watch>,
    /// Registered path → (recursive users, flat users).
    registered: HashMap<PathBuf, (usize, usize)>,
    /// What notify has been given (see [`WatchHub::sync_registrations`]).
    in_notify: HashMap<PathBuf, RecursiveMode>,
}

/// The broker's watch hub.
pub struct WatchHub {
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    registry: Mutex<Registry>,
    events: std::sync::mpsc::SyncSender<notify::Event>,
    overflow: Arc<AtomicBool>,
}

impl std::fmt::Debug for WatchHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHub").finish_non_exhaustive()
    }
}

/// (device, inode) of the directory at absolute `path` beneath `root`, without following a
/// final symlink.
fn identity_of(root: &Root, path: &Path) -> Option<(u64, u64)> {
    use cap_std::fs::MetadataExt;
    let rel = path.strip_prefix(root.path()).ok()?;
    let meta = if rel.as_os_str().is_empty() {
        root.dir().dir_metadata()
    } else {
        root.dir().symlink_metadata(rel)
    }
    .ok()?;
    Some((meta.dev(), meta.ino()))
}

/// Raw events waiting for the worker; beyond this the worker rescans instead.
const EVENT_QUEUE: usize = 16 * 1024;

impl WatchHub {
    /// Starts the hub and its worker thread for `broker`.
    pub(crate) fn start(owner: Weak<dyn Owner>) -> Arc<WatchHub> {
        let (tx, rx) = std::sync::mpsc::sync_channel(EVENT_QUEUE);
        let hub = Arc::new(WatchHub {
            watcher: Mutex::new(None),
            registry: Mutex::new(Registry::default()),
            events: tx,
            overflow: Arc::new(AtomicBool::new(false)),
        });
        worker::spawn(Arc::downgrade(&hub), owner, rx);
        hub
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The one notify watcher, created on first use.
    fn with_watcher<T>(
        &self,
        f: impl FnOnce(&mut notify::RecommendedWatcher) -> notify::Result<T>,
    ) -> notify::Result<T> {
        let mut slot = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_none() {
            let tx = self.events.clone();
            let overflow = Arc::clone(&self.overflow);
            let config = notify::Config::default().with_follow_symlinks(false);
            let watcher = notify::RecommendedWatcher::new(
                move |ev: notify::Result<notify::Event>| match ev {
                    // Never block notify's thread: a full queue becomes a rescan.
                    Ok(ev) => {
                        if tx.try_send(ev).is_err() {
                            overflow.store(true, Ordering::Release);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "file watcher error; rescanning");
                        overflow.store(true, Ordering::Release);
                    }
                },
                config,
            )?;
            *slot = Some(watcher);
        }
        match slot.as_mut() {
            Some(w) => f(w),
            None => Err(notify::Error::generic("no watcher")),
        }
    }

    /// Adds a watch for `session` on `rel` (symlinks resolved) in `root`; returns its id.
    pub(crate) fn add(
        &self,
        session: Weak<dyn Subscriber>,
        session_id: u64,
        root: &Root,
        spec: Spec,
        max_watches: u32,
        raw: &str,
    ) -> Result<String> {
        let Spec {
            rel,
            is_dir,
            recursive,
            events,
        } = spec;
        let abs = if rel.is_empty() {
            root.path().to_path_buf()
        } else {
            root.path().join(&rel)
        };
        let registered = if is_dir {
            abs.clone()
        } else {
            abs.parent().map_or_else(|| abs.clone(), Path::to_path_buf)
        };
        let recursive = recursive && is_dir;
        {
            let reg = self.registry();
            let mine = reg
                .watches
                .values()
                .filter(|w| w.session_id == session_id)
                .count();
            if mine >= max_watches as usize {
                return Err(Error::new(
                    ErrorKind::QuotaExceeded,
                    format!("this session already has {mine} watches (max_watches)"),
                )
                .with_path(raw));
            }
        }
        self.register(&registered, recursive, raw)?;
        let identity = identity_of(root, &registered);
        let Ok(snapshot) = snapshot::scan(root, &rel, is_dir, recursive) else {
            self.unregister(&registered, recursive);
            return Err(Error::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "the tree is too large to watch (over {} entries or {} MiB of paths); \
                     watch a smaller part of it",
                    snapshot::MAX_ENTRIES,
                    snapshot::MAX_PATH_BYTES >> 20
                ),
            )
            .with_path(raw));
        };
        let id = crate::random::hex(8);
        self.registry().watches.insert(
            id.clone(),
            Watch {
                session,
                session_id,
                root: root.path().to_path_buf(),
                rel,
                is_dir,
                recursive,
                events,
                registered,
                identity,
                snapshot,
                lost: false,
            },
        );
        Ok(id)
    }

    /// Counts one more use of `path` and brings notify's registrations in line.
    fn register(&self, path: &Path, recursive: bool, raw: &str) -> Result<()> {
        {
            let mut reg = self.registry();
            let counts = reg.registered.entry(path.to_path_buf()).or_default();
            if recursive {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        if let Err(e) = self.sync_registrations() {
            self.uncount(path, recursive);
            let _ = self.sync_registrations();
            let kind = match e.kind {
                notify::ErrorKind::MaxFilesWatch => ErrorKind::QuotaExceeded,
                notify::ErrorKind::PathNotFound => ErrorKind::FileNotFound,
                _ => ErrorKind::Io,
            };
            return Err(Error::new(kind, format!("cannot watch: {e}")).with_path(raw));
        }
        Ok(())
    }

    /// Counts one use of `path` fewer and brings notify's registrations in line.
    fn unregister(&self, path: &Path, recursive: bool) {
        self.uncount(path, recursive);
        if let Err(e) = self.sync_registrations() {
            tracing::debug!(path = %path.display(), error = %e, "unwatch");
        }
    }

    fn uncount(&self, path: &Path, recursive: bool) {
        let mut reg = self.registry();
        let Some(c) = reg.registered.get_mut(path) else {
            return;
        };
        if recursive {
            c.0 = c.0.saturating_sub(1);
        } else {
            c.1 = c.1.saturating_sub(1);
        }
        if c.0 + c.1 == 0 {
            reg.registered.remove(path);
        }
    }

    /// notify keeps one watch per directory: registering a directory that a recursive
    /// registration of an ancestor already covers would overwrite that watch, and
    /// unregistering it would blind the ancestor's watch. So notify is given only the
    /// *effective* set — every watched path not covered by a recursive ancestor, recursive if
    /// any watch of it is — and that set is recomputed on every change.
    fn sync_registrations(&self) -> notify::Result<()> {
        let (want, have) = {
            let reg = self.registry();
            let want: HashMap<PathBuf, RecursiveMode> = reg
                .registered
                .iter()
                .filter(|(p, _)| {
                    !reg.registered
                        .iter()
                        .any(|(a, c)| c.0 > 0 && a != *p && p.starts_with(a))
                })
                .map(|(p, c)| {
                    let mode = if c.0 > 0 {
                        RecursiveMode::Recursive
                    } else {
                        RecursiveMode::NonRecursive
                    };
                    (p.clone(), mode)
                })
                .collect();
            (want, reg.in_notify.clone())
        };
        self.with_watcher(|w| {
            // Removals first: unwatching a recursive directory drops the watches of its whole
            // tree, which the additions below may need again.
            for (path, mode) in &have {
                if want.get(path) != Some(mode) {
                    let _ = w.unwatch(path);
                }
            }
            let mut result = Ok(());
            for (path, mode) in &want {
                // `have` never holds a path beneath a recursive one (the effective set
                // excludes those), so a path is new or changed exactly when its mode differs.
                let stale = have.get(path) != Some(mode);
                if stale {
                    if let Err(e) = w.watch(path, *mode) {
                        result = Err(e);
                    }
                }
            }
            result
        })?;
        self.registry().in_notify = want;
        Ok(())
    }

    /// Ends a watch of `session`; unknown ids and other sessions' ids answer alike.
    pub(crate) fn remove(&self, session: u64, id: &str) -> Result<()> {
        let watch = {
            let mut reg = self.registry();
            match reg.watches.get(id) {
                Some(w) if w.session_id == session => reg.watches.remove(id),
                _ => None,
            }
        };
        let Some(w) = watch else {
            return Err(Error::invalid_params(
                "no watch with this watchId in this session",
            ));
        };
        self.unregister(&w.registered, w.recursive);
        Ok(())
    }

    /// Ends the watches with these ids (their path is gone).
    fn remove_ids(&self, ids: &[String]) {
        if !ids.is_empty() {
            let n = self.remove_where(|id, _| ids.iter().any(|i| i == id));
            tracing::debug!(watches = n, "watches ended: their path is gone");
        }
    }

    /// Ends every watch matching `doomed`.
    fn remove_where(&self, doomed: impl Fn(&str, &Watch) -> bool) -> usize {
        let gone: Vec<Watch> = {
            let mut reg = self.registry();
            let ids: Vec<String> = reg
                .watches
                .iter()
                .filter(|(id, w)| doomed(id, w))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| reg.watches.remove(id)).collect()
        };
        for w in &gone {
            self.unregister(&w.registered, w.recursive);
        }
        gone.len()
    }

    /// Ends the watches of a session that has ended.
    pub(crate) fn remove_session(&self, session: u64) {
        self.remove_where(|_, w| w.session_id == session);
    }

    /// Ends the watches made under the revoked root at `root`.
    pub(crate) fn remove_root(&self, root: &Path) {
        let n = self.remove_where(|_, w| w.root == root);
        if n > 0 {
            tracing::info!(root = %root.display(), watches = n, "watches ended with their root");
        }
    }
}

//! The watches and who owns them: what the hub, its worker and its registrar share, and the
//! order they take its locks in.
//!
//! The registry holds every watch with its snapshot and counts the uses of each registered
//! path (notify keeps one watch per directory, so it is given only the effective set). The
//! ledger holds only whose each watch is, so that `files/unwatch` and the `max_watches` count
//! never wait for the worker, which holds the registry across system calls on watched trees.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak, mpsc};

use notify::RecursiveMode;

use super::{EventSet, Snapshot, Subscriber, registrar};

/// One watch.
#[derive(Debug)]
pub(super) struct Watch {
    pub(super) session: Weak<dyn Subscriber>,
    pub(super) session_id: u64,
    /// The root's canonical path (the root itself is looked up in the current policy on
    /// every event, so a reload's new name or deny globs apply at once).
    pub(super) root: PathBuf,
    /// The watched path relative to the root, symlinks resolved.
    pub(super) rel: String,
    pub(super) is_dir: bool,
    pub(super) recursive: bool,
    pub(super) events: EventSet,
    /// What is registered with notify for this watch (the directory, or a file's parent).
    pub(super) registered: PathBuf,
    /// (device, inode) of `registered` when the watch began: if the path stops leading to
    /// that directory (it, or an ancestor, was moved or deleted), the watch ends rather than
    /// report what happens to the directory at its new place.
    pub(super) identity: Option<(u64, u64)>,
    pub(super) snapshot: Snapshot,
    /// Set when events for this watch had to be dropped: the next quiet moment rescans it.
    pub(super) lost: bool,
    /// Cleared the moment the watch is ended (its [`Entry`] shares it): an unwatch, a
    /// session's end or a revoked root takes effect at once, while the registrar takes the
    /// watch out of the registry later, and nothing may be reported for it in between.
    pub(super) live: Arc<AtomicBool>,
    /// When it was added, in the hub's order: a revoked root ends only the watches made
    /// before the revocation, not those of a root added back since.
    pub(super) serial: u64,
}

#[derive(Debug, Default)]
pub(super) struct Registry {
    pub(super) watches: HashMap<String, Watch>,
    /// Registered path → (recursive users, flat users).
    pub(super) registered: HashMap<PathBuf, (usize, usize)>,
}

impl Registry {
    /// Counts one more use of `path`.
    pub(super) fn count(&mut self, path: &Path, recursive: bool) {
        let counts = self.registered.entry(path.to_path_buf()).or_default();
        if recursive {
            counts.0 += 1;
        } else {
            counts.1 += 1;
        }
    }

    /// Counts one use of `path` fewer.
    pub(super) fn uncount(&mut self, path: &Path, recursive: bool) {
        let Some(c) = self.registered.get_mut(path) else {
            return;
        };
        if recursive {
            c.0 = c.0.saturating_sub(1);
        } else {
            c.1 = c.1.saturating_sub(1);
        }
        if c.0 + c.1 == 0 {
            self.registered.remove(path);
        }
    }

    /// notify keeps one watch per directory: registering a directory that a recursive
    /// registration of an ancestor already covers would overwrite that watch, and
    /// unregistering it would blind the ancestor's watch. So notify is given only the
    /// *effective* set: every watched path not covered by a recursive ancestor, recursive if
    /// any watch of it is.
    pub(super) fn effective(&self) -> HashMap<PathBuf, RecursiveMode> {
        self.registered
            .iter()
            .filter(|(p, _)| {
                !self
                    .registered
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
            .collect()
    }
}

/// Whose a live watch is: what `files/unwatch` and the `max_watches` count need, kept apart
/// from the registry so that they never wait for the watch worker (which holds the registry
/// across system calls on the watched trees).
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) session: u64,
    /// The root's canonical path, as in [`Watch::root`].
    pub(super) root: PathBuf,
    pub(super) live: Arc<AtomicBool>,
}

/// Where the registrar tells a waiting `files/watch` how its path fared.
pub(super) type Reply = mpsc::Sender<std::result::Result<(), registrar::Failure>>;

/// What the hub, its worker and its registrar share.
#[derive(Debug, Default)]
pub(super) struct Shared {
    pub(super) registry: Mutex<Registry>,
    /// Watch id → its owner. Locked only for map operations, never across a system call;
    /// when both are needed, the registry is taken first.
    pub(super) ledger: Mutex<HashMap<String, Entry>>,
    /// Set for good when the broker stops ([`WatchHub::stop`]).
    pub(super) stopping: AtomicBool,
    /// The `files/watch` requests waiting for the registrar, by ticket: a stop answers them
    /// at once, whatever the registrar is busy with.
    pub(super) waiting: Mutex<HashMap<u64, Reply>>,
    pub(super) next_ticket: AtomicU64,
}

impl Shared {
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub(super) fn waiting(&self) -> MutexGuard<'_, HashMap<u64, Reply>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn ledger(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes every watch `doomed` selects out of the registry and the ledger, and gives back
    /// their uses of registered paths; the caller hands them to the registrar, which brings
    /// notify in line.
    pub(super) fn take_where(&self, doomed: impl Fn(&str, &Watch) -> bool) -> Vec<Watch> {
        let mut reg = self.registry();
        let ids: Vec<String> = reg
            .watches
            .iter()
            .filter(|(id, w)| doomed(id, w))
            .map(|(id, _)| id.clone())
            .collect();
        let gone: Vec<Watch> = ids.iter().filter_map(|id| reg.watches.remove(id)).collect();
        for w in &gone {
            w.live.store(false, Ordering::Release);
            reg.uncount(&w.registered, w.recursive);
        }
        let mut ledger = self.ledger();
        for id in &ids {
            ledger.remove(id);
        }
        gone
    }
}

/// Which watches to end.
#[derive(Debug)]
pub(super) enum Doomed {
    /// `files/unwatch`.
    Ids(Vec<String>),
    /// A session that ended.
    Session(u64),
    /// A revoked root: the watches under it made before `before` (a [`Watch::serial`]).
    Root { root: PathBuf, before: u64 },
}

impl Doomed {
    pub(super) fn covers(&self, id: &str, w: &Watch) -> bool {
        match self {
            Doomed::Ids(ids) => ids.iter().any(|i| i == id),
            Doomed::Session(s) => w.session_id == *s,
            Doomed::Root { root, before } => w.root == *root && w.serial < *before,
        }
    }

    /// [`Doomed::covers`] for the ledger, which holds only watches already made.
    pub(super) fn covers_entry(&self, id: &str, e: &Entry) -> bool {
        match self {
            Doomed::Ids(ids) => ids.iter().any(|i| i == id),
            Doomed::Session(s) => e.session == *s,
            Doomed::Root { root, .. } => e.root == *root,
        }
    }
}

//! The registrar: the one thread that talks to notify's watcher.
//!
//! notify registers a recursive watch one directory at a time and removes it the same way,
//! on its own thread, while the caller waits: for a tree of 60,000 directories, a second or
//! more. Done under a lock, or on an async worker, that stalls every session of the broker.
//! So the registry (shared with the worker and `files/watch`) only counts the uses of each
//! registered path; this thread reads the counts (briefly, under the registry's lock), brings
//! notify in line with no lock held, and tells a waiting `files/watch` how its path fared.
//! Removals are only queued here: whoever ends a watch never waits for notify.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};

use super::{Doomed, Shared, Watch};
use crate::error::ErrorKind;

/// Jobs taken at once, so a steady stream of them cannot put off the sync they ask for.
const BATCH: usize = 1024;

/// What the registrar is asked to do.
pub(super) enum Job {
    /// Brings notify in line with the registry's counts; with `check`, answers how that path
    /// fared. `discard` holds watches already taken out of the registry, freed here.
    Sync {
        check: Option<Check>,
        discard: Vec<Watch>,
    },
    /// Ends the watches selected, then syncs.
    End(Doomed),
}

/// A `files/watch` waiting to hear whether its path is registered.
pub(super) struct Check {
    pub path: PathBuf,
    pub reply: Sender<Result<(), Failure>>,
}

/// Why a path could not be registered.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub kind: ErrorKind,
    pub message: String,
    mode: RecursiveMode,
}

impl Failure {
    /// The broker stops: the registration is abandoned ([`super::WatchHub::stop`]).
    pub(super) fn stopped() -> Failure {
        Failure {
            kind: ErrorKind::Timeout,
            message: "the broker is stopping".into(),
            mode: RecursiveMode::NonRecursive,
        }
    }

    /// Whether this is [`Failure::stopped`] (notify's own failures are never `Timeout`).
    pub(super) fn is_stop(&self) -> bool {
        self.kind == ErrorKind::Timeout
    }

    fn of(e: &notify::Error, mode: RecursiveMode) -> Failure {
        let kind = match e.kind {
            notify::ErrorKind::MaxFilesWatch => ErrorKind::QuotaExceeded,
            notify::ErrorKind::PathNotFound => ErrorKind::FileNotFound,
            _ => ErrorKind::Io,
        };
        Failure {
            kind,
            message: e.to_string(),
            mode,
        }
    }
}

struct Registrar {
    shared: Arc<Shared>,
    /// Created on first use, with what its callback needs.
    watcher: Option<notify::RecommendedWatcher>,
    events: SyncSender<notify::Event>,
    overflow: Arc<AtomicBool>,
    /// What notify has been given.
    in_notify: HashMap<PathBuf, RecursiveMode>,
    /// Paths notify refused, not tried again while they are wanted in that mode: the
    /// `files/watch` that asked hears why and gives its use back, and a second try of a tree
    /// over the inotify limit would only cost as much again.
    failed: HashMap<PathBuf, Failure>,
}

/// Starts the registrar; its jobs go to the returned sender. When the thread cannot start,
/// sends fail and the hub falls back to what needs no notify.
pub(super) fn spawn(
    shared: Arc<Shared>,
    events: SyncSender<notify::Event>,
    overflow: Arc<AtomicBool>,
) -> Sender<Job> {
    let (tx, rx) = mpsc::channel();
    let registrar = Registrar {
        shared,
        watcher: None,
        events,
        overflow,
        in_notify: HashMap::new(),
        failed: HashMap::new(),
    };
    let spawned = std::thread::Builder::new()
        .name("fsbroker-notify".into())
        .spawn(move || registrar.run(rx));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the watch registrar; files/watch will fail");
    }
    tx
}

/// Whether the worker does anything with an event of this kind: it ignores opens, reads and
/// closes without writing, which listing a watched tree makes by the directory.
fn wanted(ev: &notify::Event) -> bool {
    ev.need_rescan()
        || matches!(
            ev.kind,
            EventKind::Create(_)
                | EventKind::Remove(_)
                | EventKind::Modify(_)
                | EventKind::Access(AccessKind::Close(AccessMode::Write))
        )
}

impl Registrar {
    /// Runs until the hub is gone (its sender dropped).
    fn run(mut self, jobs: Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut checks = Vec::new();
            let mut garbage = Vec::new();
            let mut next = Some(first);
            let mut taken = 0;
            while let Some(job) = next {
                match job {
                    Job::Sync { check, discard } => {
                        checks.extend(check);
                        garbage.extend(discard);
                    }
                    Job::End(doomed) => {
                        let gone = self.shared.take_where(|id, w| doomed.covers(id, w));
                        if let Doomed::Root { root, .. } = &doomed {
                            if !gone.is_empty() {
                                tracing::info!(root = %root.display(), watches = gone.len(), "watches ended with their root");
                            }
                        }
                        garbage.extend(gone);
                    }
                }
                taken += 1;
                next = if taken < BATCH {
                    jobs.try_recv().ok()
                } else {
                    None
                };
            }
            if self.shared.stopping() {
                // The broker stops: nothing more is registered (or unregistered: the process
                // is ending, and a large tree's removal costs as much as its registration).
                for c in checks {
                    let _ = c.reply.send(Err(Failure::stopped()));
                }
                drop(garbage);
                continue;
            }
            self.sync();
            for c in checks {
                // The asker may have given up (its request timed out); its own release undoes it.
                let _ = c.reply.send(self.outcome(&c.path));
            }
            drop(garbage);
        }
    }

    /// How `path`'s registration fared in the last sync: refused if it, or a recursive
    /// ancestor covering it, was.
    fn outcome(&self, path: &Path) -> Result<(), Failure> {
        match self.failed.iter().find(|(p, f)| {
            p.as_path() == path || (f.mode == RecursiveMode::Recursive && path.starts_with(p))
        }) {
            Some((_, f)) => Err(f.clone()),
            None => Ok(()),
        }
    }

    /// Creates the one notify watcher, on first use.
    fn ensure_watcher(&mut self) -> notify::Result<()> {
        if self.watcher.is_some() {
            return Ok(());
        }
        let tx = self.events.clone();
        let overflow = Arc::clone(&self.overflow);
        let config = notify::Config::default().with_follow_symlinks(false);
        let watcher = notify::RecommendedWatcher::new(
            move |ev: notify::Result<notify::Event>| match ev {
                Ok(ev) if !wanted(&ev) => {}
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
        self.watcher = Some(watcher);
        Ok(())
    }

    /// Brings notify's registrations in line with the registry's effective set, with no lock
    /// held while notify works.
    fn sync(&mut self) {
        let want = self.shared.registry().effective();
        self.failed
            .retain(|p, f| want.get(p).is_some_and(|m| *m == f.mode));
        // `in_notify` never holds a path beneath a recursive one (the effective set excludes
        // those), so a path is new or changed exactly when its mode differs.
        let to_add: Vec<(PathBuf, RecursiveMode)> = want
            .iter()
            .filter(|(p, m)| self.in_notify.get(*p) != Some(*m) && !self.failed.contains_key(*p))
            .map(|(p, m)| (p.clone(), *m))
            .collect();
        let to_remove: Vec<PathBuf> = self
            .in_notify
            .iter()
            .filter(|(p, m)| want.get(*p) != Some(*m))
            .map(|(p, _)| p.clone())
            .collect();
        if to_add.is_empty() && to_remove.is_empty() {
            return;
        }
        if let Err(e) = self.ensure_watcher() {
            for (p, m) in to_add {
                let f = Failure::of(&e, m);
                self.failed.insert(p, f);
            }
            return;
        }
        let Some(w) = self.watcher.as_mut() else {
            return;
        };
        // Removals first: unwatching a recursive directory drops the watches of its whole
        // tree, which the additions below may need again.
        for path in &to_remove {
            let _ = w.unwatch(path);
            self.in_notify.remove(path);
        }
        for (path, mode) in to_add {
            match w.watch(&path, mode) {
                Ok(()) => {
                    self.in_notify.insert(path, mode);
                }
                Err(e) => {
                    // notify registers a tree directory by directory and keeps what it had
                    // registered when one fails (the inotify limit, say): drop that too.
                    let _ = w.unwatch(&path);
                    tracing::debug!(path = %path.display(), error = %e, "cannot watch");
                    self.failed.insert(path, Failure::of(&e, mode));
                }
            }
        }
        // A watch whose directory was unregistered and registered again (a recursive watch
        // over it began or ended) was blind in between, and its session may already have been
        // told that the watch that changed is gone: the worker rescans it.
        if !to_remove.is_empty() {
            let mut reg = self.shared.registry();
            for watch in reg.watches.values_mut() {
                if to_remove.iter().any(|p| watch.registered.starts_with(p)) {
                    watch.lost = true;
                }
            }
        }
    }
}

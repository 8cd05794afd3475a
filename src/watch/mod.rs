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
//! A second thread, the registrar (`registrar.rs`), owns the notify watcher and does every
//! registration and removal: for a recursive watch that is one system call per directory,
//! seconds for a large tree, and it must cost the session that asked for it, never an async
//! worker or another session's request. Nothing that async code waits on is held while it
//! runs, and the worker holds the registry (shared with the registrar and `files/watch`) only
//! between listings, never across a walk of a tree.
//!
//! A broker that stops ([`WatchHub::stop`]) abandons the watches it has not made: a
//! `files/watch` waiting for the registrar or walking its tree is answered `TIMEOUT` at once,
//! and the registrar registers nothing more, so a huge tree cannot hold the stop past its
//! grace (and leave the audit log unsealed).
//!
//! notify's callback never blocks: it `try_send`s into a bounded queue, and when that queue
//! is full it raises a flag that makes the worker rescan instead. Events the worker ignores
//! (a directory opened, as listing a watched tree opens every directory in it) never enter
//! the queue, so listing a large tree does not flood it into a rescan.

mod change;
mod registrar;
mod registry;
mod snapshot;
mod worker;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, Weak, mpsc};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::policy::Policy;
use crate::sandbox::Root;

use crate::limits::EVENT_QUEUE;
pub(crate) use change::{Change, EventSet};
use registrar::Job;
use registry::{Doomed, Entry, Registry, Shared, Watch};
pub(crate) use snapshot::Snapshot;

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
    /// What the person granted the session (see `crate::consent::allows`).
    fn grants(&self) -> &crate::consent::Grants;
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

/// Who asks for a watch, and how long they wait for it.
pub(crate) struct Asker<'a> {
    /// The session the watch reports to.
    pub session: Weak<dyn Subscriber>,
    /// Its id.
    pub session_id: u64,
    /// How many watches it may hold.
    pub max_watches: u32,
    /// The path as the request spelled it, for errors.
    pub raw: &'a str,
    /// When the request's `timeout_ms` runs out.
    pub until: Instant,
    /// `timeout_ms`, for the `TIMEOUT` error.
    pub limit: Duration,
}

/// The broker's watch hub.
///
/// Registering a recursive watch with notify, or ending one, costs a system call per
/// directory of the tree: seconds for a large one. That work runs on the hub's registrar
/// thread (`registrar.rs`), which alone holds the notify watcher. A `files/watch` waits for
/// it on the blocking pool (bounded by `timeout_ms`); `files/unwatch`, a session's end and a
/// revoked root only queue the removal, so no async worker, and no other session, waits for
/// a large tree's registrations.
pub(crate) struct WatchHub {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    overflow: Arc<AtomicBool>,
    /// The next [`Watch::serial`].
    serials: AtomicU64,
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

/// The answer to a `files/watch` the broker's stop abandoned: `TIMEOUT`, "not done".
fn abandoned(raw: &str) -> Error {
    Error::new(
        ErrorKind::Timeout,
        "the broker is stopping: the watch was not made",
    )
    .with_path(raw)
}

impl WatchHub {
    /// Starts the hub, its worker thread and its registrar thread for `broker`.
    pub(crate) fn start(owner: Weak<dyn Owner>) -> Arc<WatchHub> {
        let (tx, rx) = mpsc::sync_channel(EVENT_QUEUE);
        let shared = Arc::new(Shared::default());
        let overflow = Arc::new(AtomicBool::new(false));
        let jobs = registrar::spawn(Arc::clone(&shared), tx, Arc::clone(&overflow));
        let hub = Arc::new(WatchHub {
            shared,
            jobs,
            overflow,
            serials: AtomicU64::new(0),
        });
        worker::spawn(Arc::downgrade(&hub), owner, rx);
        hub
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.shared.registry()
    }

    /// Adds a watch on `rel` (symlinks resolved) in `root` for `who`; returns its id. Runs on
    /// the blocking pool: it waits for notify's registration (at most until `who.until`) and
    /// lists the tree. `commit` is the request's point of no return, called once everything
    /// is in place: when it fails (the request timed out meanwhile), nothing is left behind.
    pub(crate) fn add(
        &self,
        who: Asker<'_>,
        root: &Root,
        spec: Spec,
        commit: impl FnOnce() -> Result<()>,
    ) -> Result<String> {
        let Spec {
            rel,
            is_dir,
            recursive,
            events,
        } = spec;
        let raw = who.raw;
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
        let mine = self
            .shared
            .ledger()
            .values()
            .filter(|e| e.session == who.session_id)
            .count();
        if mine >= who.max_watches as usize {
            return Err(Error::new(
                ErrorKind::QuotaExceeded,
                format!("this session already has {mine} watches (max_watches)"),
            )
            .with_path(raw));
        }
        self.register(&registered, recursive, &who)?;
        let identity = identity_of(root, &registered);
        let snapshot =
            match snapshot::scan_unless(root, &rel, is_dir, recursive, &self.shared.stopping) {
                Ok(snapshot) => snapshot,
                Err(cut) => {
                    self.release(&registered, recursive, Vec::new());
                    return Err(match cut {
                        snapshot::Cut::Stopped => abandoned(raw),
                        snapshot::Cut::TooLarge => Error::new(
                            ErrorKind::QuotaExceeded,
                            format!(
                                "the tree is too large to watch (over {} entries or {} MiB of \
                             paths); watch a smaller part of it",
                                crate::limits::MAX_ENTRIES,
                                crate::limits::MAX_PATH_BYTES >> 20
                            ),
                        )
                        .with_path(raw),
                    });
                }
            };
        // The last moment a stop abandons the watch: past the commit it is made.
        let committed = if self.shared.stopping() {
            Err(abandoned(raw))
        } else {
            commit()
        };
        if let Err(e) = committed {
            self.release(&registered, recursive, vec![]);
            return Err(e);
        }
        let id = crate::random::hex(8);
        let live = Arc::new(AtomicBool::new(true));
        let mut reg = self.registry();
        reg.watches.insert(
            id.clone(),
            Watch {
                session: who.session,
                session_id: who.session_id,
                root: root.path().to_path_buf(),
                rel,
                is_dir,
                recursive,
                events,
                registered,
                identity,
                snapshot,
                lost: false,
                live: Arc::clone(&live),
                serial: self.serials.fetch_add(1, Ordering::AcqRel),
            },
        );
        // Under the registry's lock, so a session's end taking its watches out of both
        // cannot fall between the two.
        self.shared.ledger().insert(
            id.clone(),
            Entry {
                session: who.session_id,
                root: root.path().to_path_buf(),
                live,
            },
        );
        Ok(id)
    }

    /// Counts one more use of `path` and waits (at most until `who.until`, or until the
    /// broker stops) for the registrar to register it with notify.
    fn register(&self, path: &Path, recursive: bool, who: &Asker<'_>) -> Result<()> {
        if self.shared.stopping() {
            return Err(abandoned(who.raw));
        }
        self.registry().count(path, recursive);
        let (reply, answer) = mpsc::channel();
        // Listed before the flag is looked at again, so a stop either finds the ticket or is
        // seen here (both sides order their steps with `SeqCst`).
        let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
        self.shared.waiting().insert(ticket, reply.clone());
        let check = registrar::Check {
            path: path.to_path_buf(),
            reply,
        };
        let not_running = || {
            Error::new(
                ErrorKind::Io,
                "cannot watch: the file watcher is not running",
            )
            .with_path(who.raw)
        };
        let outcome = if self.shared.stopping() {
            Err(abandoned(who.raw))
        } else if self
            .jobs
            .send(Job::Sync {
                check: Some(check),
                discard: Vec::new(),
            })
            .is_err()
        {
            Err(not_running())
        } else {
            let wait = who.until.saturating_duration_since(Instant::now());
            match answer.recv_timeout(wait) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(f)) if f.is_stop() => Err(abandoned(who.raw)),
                Ok(Err(f)) => {
                    Err(Error::new(f.kind, format!("cannot watch: {}", f.message))
                        .with_path(who.raw))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => Err(crate::throttle::timed_out(who.limit)),
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(not_running()),
            }
        };
        self.shared.waiting().remove(&ticket);
        if outcome.is_err() {
            // Also after a TIMEOUT: the registrar may still be registering it; the sync this
            // asks for undoes that once it is done.
            self.release(path, recursive, Vec::new());
        }
        outcome
    }

    /// Stops taking watches, for good (the broker stops): a `files/watch` not yet made is
    /// answered `TIMEOUT` ("not done") at once, whether it waits for the registrar (queued
    /// behind, or on, a large tree's registration, which runs on regardless: notify cannot
    /// cut it short) or walks its tree; one that comes later gets the same. The registrar
    /// registers nothing more. Watches already made stay until their sessions end.
    pub(crate) fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let waiting = std::mem::take(&mut *self.shared.waiting());
        for reply in waiting.into_values() {
            let _ = reply.send(Err(registrar::Failure::stopped()));
        }
    }

    /// Gives back one use of `path`, and hands `discard` (watches already taken out) to the
    /// registrar, which unregisters what is no longer used and frees them.
    fn release(&self, path: &Path, recursive: bool, discard: Vec<Watch>) {
        self.registry().uncount(path, recursive);
        self.resync(discard);
    }

    /// Asks the registrar to bring notify in line with the registry, freeing `discard` (a
    /// large tree's snapshot takes a while to free) on its thread.
    fn resync(&self, discard: Vec<Watch>) {
        let _ = self.jobs.send(Job::Sync {
            check: None,
            discard,
        });
    }

    /// Ends the watches `doomed` selects: at once for reporting (nothing more is reported for
    /// them), and on the registrar's thread for notify. Never waits for either, so it may be
    /// called on an async worker, or outside any runtime.
    fn end(&self, doomed: Doomed) {
        self.shared.ledger().retain(|id, e| {
            let ends = doomed.covers_entry(id, e);
            if ends {
                e.live.store(false, Ordering::Release);
            }
            !ends
        });
        if let Err(mpsc::SendError(Job::End(doomed))) = self.jobs.send(Job::End(doomed)) {
            // No registrar: notify was never given anything, so only the registry is left.
            drop(self.shared.take_where(|id, w| doomed.covers(id, w)));
        }
    }

    /// Ends a watch of `session` (`files/unwatch`, answered on an async worker): unknown ids
    /// and other sessions' ids answer alike. Nothing is reported for the watch once this
    /// returns; the registrar unregisters it shortly after.
    pub(crate) fn remove(&self, session: u64, id: &str) -> Result<()> {
        let mine = self
            .shared
            .ledger()
            .get(id)
            .is_some_and(|e| e.session == session);
        if !mine {
            return Err(Error::invalid_params(
                "no watch with this watchId in this session",
            ));
        }
        self.end(Doomed::Ids(vec![id.to_owned()]));
        Ok(())
    }

    /// Ends the watches with these ids (their path is gone). Called by the worker.
    fn remove_ids(&self, ids: &[String]) {
        if !ids.is_empty() {
            let gone = self.shared.take_where(|id, _| ids.iter().any(|i| i == id));
            tracing::debug!(watches = gone.len(), "watches ended: their path is gone");
            self.resync(gone);
        }
    }

    /// How many watches the session `session` holds.
    pub(crate) fn count_for(&self, session: u64) -> usize {
        self.shared
            .ledger()
            .values()
            .filter(|e| e.session == session)
            .count()
    }

    /// Ends the watches of a session that has ended. Never waits (see [`WatchHub::end`]): a
    /// session may be dropped on an async worker, or by a library user outside any runtime.
    pub(crate) fn remove_session(&self, session: u64) {
        self.end(Doomed::Session(session));
    }

    /// Ends the watches made under the revoked root at `root`. Never waits (see
    /// [`WatchHub::end`]); the worker already reports nothing under a root the policy no
    /// longer has.
    pub(crate) fn remove_root(&self, root: &Path) {
        self.end(Doomed::Root {
            root: root.to_path_buf(),
            before: self.serials.load(Ordering::Acquire),
        });
    }
}

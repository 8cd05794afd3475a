//! Reloads and revocation: a new policy compared with the one in force, and what changes
//! for the sessions (roots withdrawn, grants and uploads under them ended, confined servers
//! cut off, `list_changed` raised); and the watch of the policy file that starts a reload.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use super::Broker;
use crate::limits::{HELD_RETRY, QUIET};
use crate::policy::{Policy, PolicyError};
use crate::sandbox::ConsentMode;
use crate::throttle::RateLimits;

/// What identifies one version of a file without opening it: device, inode, size and
/// modification time (a `stat`, which no lease delays).
pub(super) type Stamp = (u64, u64, u64, i64, i64);

#[allow(clippy::disallowed_methods)] // a `stat` of the policy file, the broker's own
pub(super) fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// What a policy reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Roots (canonical paths) whose access was revoked: removed, or consent turned `deny`.
    pub revoked: Vec<PathBuf>,
    /// Whether anything about the roots changed (and `list_changed` was sent).
    pub roots_changed: bool,
}

impl Broker {
    /// Loads the policy file again (with the same command-line overrides) and applies it.
    /// A policy that fails to load leaves the current one in force; the error says why.
    ///
    /// A policy file that cannot be read without waiting on another process (a lease on it,
    /// [`PolicyError::Held`]) fails closed: the file is being changed and the broker cannot
    /// see to what, so every root is withdrawn (revoked, as a reload that removed them) until
    /// a later reload reads it; a thread tries again every 250 ms (`HELD_RETRY`).
    pub fn reload(self: &Arc<Self>) -> Result<ReloadReport, PolicyError> {
        let old = self.policy();
        // What the file is before it is read: if a lease holds it, and it is still exactly
        // the file the policy in force was read from, nothing changed and nothing is
        // withdrawn.
        let stamp = old.source().and_then(stamp);
        let new = match Policy::load_narrowed(old.source(), &self.overrides) {
            Ok((new, refused)) => {
                for no in refused {
                    tracing::warn!(
                        rule = %no.rule,
                        "{} ({}): left out of the policy in force",
                        no.reason,
                        crate::policy::MANAGED_PATH
                    );
                }
                new
            }
            // The managed policy cannot be trusted or read, or it requires what this broker
            // cannot give (an audit log it does not keep): nothing may be served without it.
            Err(e @ (PolicyError::Managed { .. } | PolicyError::Narrowed(_))) => {
                let current = self.policy();
                if !current.roots().is_empty() {
                    tracing::error!(
                        error = %e,
                        roots = current.roots().len(),
                        "withdrawing every root until the managed policy can be applied"
                    );
                    self.apply(current.without_roots());
                }
                return Err(e);
            }
            Err(e @ PolicyError::Held { .. }) => {
                let same = stamp.is_some()
                    && stamp == *self.read_stamp.lock().unwrap_or_else(|e| e.into_inner());
                if same && !self.held.load(Ordering::Acquire) {
                    tracing::warn!(
                        "the policy file is held by another process but has not changed since it was read; the policy stays in force"
                    );
                    return Ok(ReloadReport::default());
                }
                self.withdraw_all();
                return Err(e);
            }
            Err(e) => {
                // The person's policy does not load, so the previous one would stay in force:
                // not if the managed policy changed meanwhile, or a broken policy file would
                // freeze the administrator's rules. Then every root is withdrawn until both
                // load.
                let managed_now = crate::policy::Managed::system();
                let in_force = old.managed().map(|m| m.sha256.as_str());
                let changed = match &managed_now {
                    Ok(now) => now.as_ref().map(|m| m.sha256.as_str()) != in_force,
                    Err(_) => true,
                };
                if changed {
                    let current = self.policy();
                    if !current.roots().is_empty() {
                        tracing::error!(
                            error = %e,
                            "the policy file does not load and the managed policy changed: \
                             withdrawing every root until the policy file loads"
                        );
                        self.apply(current.without_roots());
                    }
                }
                return Err(e);
            }
        };
        *self.read_stamp.lock().unwrap_or_else(|e| e.into_inner()) = stamp;
        self.held.store(false, Ordering::Release);
        if new.audit() != old.audit() {
            tracing::warn!("the [audit] table changed; the audit log in use stays until restart");
        }
        if new.limits().max_pending_input != old.limits().max_pending_input {
            tracing::warn!("max_pending_input changed; the budget in use stays until restart");
        }
        Ok(self.apply(new))
    }

    /// Withdraws every root (a held policy file: see [`Broker::reload`]), and tries the file
    /// again from a thread of its own until it reads, or fails for another reason (then the
    /// next change of the file, or SIGHUP, tries again).
    fn withdraw_all(self: &Arc<Self>) {
        let current = self.policy();
        if !current.roots().is_empty() {
            tracing::error!(
                roots = current.roots().len(),
                "the policy file is held by another process: withdrawing every root until it can be read"
            );
            self.apply(current.without_roots());
        }
        if self.held.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Arc::downgrade(self);
        let retry = move || {
            loop {
                std::thread::sleep(HELD_RETRY);
                let Some(broker) = me.upgrade() else { return };
                if !broker.held.load(Ordering::Acquire) {
                    return;
                }
                match broker.reload() {
                    Ok(_) => {
                        tracing::info!("the policy file can be read again; its roots are back");
                        return;
                    }
                    Err(PolicyError::Held { .. }) => {}
                    Err(_) => {
                        // Readable, but not a policy: the roots stay withdrawn until the file
                        // changes again (the watcher) or SIGHUP; this retry is done.
                        broker.held.store(false, Ordering::Release);
                        return broker.reload_and_log();
                    }
                }
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("fsbroker-policy-held".into())
            .spawn(retry)
        {
            tracing::error!(error = %e, "cannot start retrying the held policy file; reload with SIGHUP");
            self.held.store(false, Ordering::Release);
        }
    }

    /// Puts `new` in force: roots that were removed, or whose consent turned `deny`, lose
    /// their grants, uploads and kept locks at once, and every session hears
    /// `notifications/roots/list_changed` when the roots changed in any way. Roots the person
    /// paused ([`Broker::pause_root`]) stay out of it until resumed.
    pub fn apply(&self, new: Policy) -> ReloadReport {
        let new = Arc::new(new);
        *self.configured.write().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&new);
        let paused = self
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        self.put_in_force(new.without_paths(&paused))
    }

    /// Puts `new` (the configured policy without the paused roots) in force; see
    /// [`Broker::apply`].
    pub(super) fn put_in_force(&self, new: Policy) -> ReloadReport {
        let old = self.policy();
        let revoked: Vec<PathBuf> = old
            .roots()
            .iter()
            .filter(
                |r| match new.roots().iter().find(|n| n.path() == r.path()) {
                    None => true,
                    Some(n) => n.consent() == ConsentMode::Deny && r.consent() != ConsentMode::Deny,
                },
            )
            .map(|r| r.path().to_path_buf())
            .collect();
        let roots_changed = signature(&old) != signature(&new);
        if new.limits() != old.limits() {
            *self.rate.write().unwrap_or_else(|e| e.into_inner()) =
                Arc::new(RateLimits::new(new.limits()));
        }
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
        // A root nested inside a revoked one keeps its own uploads and locks.
        let staying: Vec<PathBuf> = self
            .policy()
            .roots()
            .iter()
            .map(|r| r.path().to_path_buf())
            .collect();
        let spared = |root: &Path| -> Vec<PathBuf> {
            staying
                .iter()
                .filter(|k| k.as_path() != root && k.starts_with(root))
                .cloned()
                .collect()
        };
        for root in &revoked {
            self.locks.release_under(root, &spared(root), None);
            self.watches.remove_root(root);
        }
        let sessions = self.members();
        for s in &sessions {
            for root in &revoked {
                s.revoke(root, &spared(root));
            }
            if roots_changed {
                s.notify_roots_changed();
            }
        }
        if !revoked.is_empty() || roots_changed {
            tracing::info!(revoked = ?revoked, roots_changed, sessions = sessions.len(), "policy reloaded");
        }
        self.applied.send_modify(|n| *n += 1);
        self.changed();
        ReloadReport {
            revoked,
            roots_changed,
        }
    }

    /// Changes each time a policy is put in force (a reload, a root retired): what a
    /// confined server's proxy watches, to end the server when access it holds is revoked.
    pub fn policy_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Takes a root out of service because its directory is gone (deleted, moved away or
    /// unmounted): the same as a reload that removed it.
    pub fn retire_root(&self, root: &Path) {
        let current = self.configured();
        if current.roots().iter().any(|r| r.path() == root) {
            self.apply(current.without_root(root));
        }
    }

    /// Watches the policy file (if the policy came from one) and reloads it on every change,
    /// after a short quiet period (editors write in several steps). Returns the watcher, which
    /// stops when dropped.
    ///
    /// The managed policy ([`crate::policy::MANAGED_PATH`]) is watched too, when its folder
    /// exists, whether or not the broker has a policy file: an administrator's change applies
    /// at once.
    #[allow(clippy::disallowed_methods)] // a `stat` of /etc/fsbroker, the administrator's
    pub fn watch_policy(self: &Arc<Self>) -> Option<PolicyWatcher> {
        let mut files: Vec<PathBuf> = self
            .policy()
            .source()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        let managed = Path::new(crate::policy::MANAGED_PATH);
        if managed.parent().is_some_and(Path::is_dir) {
            files.push(managed.to_path_buf());
        }
        if files.is_empty() {
            return None;
        }
        match PolicyWatcher::start(Arc::downgrade(self), &files) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(files = ?files, error = %e, "cannot watch the policy files; reload with SIGHUP");
                None
            }
        }
    }

    /// Reloads, logging the outcome: what a signal or a file change calls.
    pub fn reload_and_log(self: &Arc<Self>) {
        if let Err(e) = self.reload() {
            // One log line: a TOML error's code snippet spans several.
            let text = e.to_string();
            let flat: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            if matches!(e, PolicyError::Managed { .. } | PolicyError::Narrowed(_)) {
                // Said by `reload`: every root is withdrawn until it can be applied.
                return;
            }
            if matches!(e, PolicyError::Held { .. }) {
                // Said by `withdraw_all`: the roots are withdrawn, not kept.
                tracing::debug!(error = %flat.join(" "), "policy reload failed");
                return;
            }
            tracing::error!(
                error = %flat.join(" "),
                "policy reload failed; the previous policy stays in force"
            );
        }
    }
}

/// Everything `roots/list` and the access rules show of the roots.
fn signature(p: &Policy) -> Vec<(PathBuf, String, String)> {
    p.roots()
        .iter()
        .map(|r| {
            (
                r.path().to_path_buf(),
                r.name().to_owned(),
                format!(
                    "{:?} {:?} {:?} {:?} {:?}",
                    r.mode(),
                    r.consent(),
                    r.deny().patterns(),
                    r.managed_deny().patterns(),
                    r.managed_parts()
                ),
            )
        })
        .collect()
}

/// A running watch of the policy file.
pub struct PolicyWatcher {
    _watcher: notify::RecommendedWatcher,
}

impl std::fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyWatcher")
    }
}

impl PolicyWatcher {
    #[allow(clippy::disallowed_methods)] // the policy file, the broker's own
    fn start(broker: Weak<Broker>, files: &[PathBuf]) -> notify::Result<PolicyWatcher> {
        use notify::{EventKind, Watcher};
        // Watch directories, not the file: editors replace a file by renaming a new one over
        // it, which a watch on the old inode would never see. A policy that is a symlink is
        // watched where it is and where it leads (dotfile managers link configs).
        let mut places: Vec<PathBuf> = files.to_vec();
        for file in files {
            if let Ok(target) = std::fs::canonicalize(file) {
                if &target != file {
                    places.push(target);
                }
            }
        }
        let names: Vec<std::ffi::OsString> = places
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_os_string()))
            .collect();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            let Ok(ev) = ev else { return };
            // Opens and reads (the reload's own among them) are not changes, and neither is
            // a change of times or mode: anyone who can name the file may `touch` it, and a
            // reload costs every broker on the policy (and, when a lease holds the file,
            // withdraws every root).
            let metadata = matches!(
                ev.kind,
                EventKind::Modify(notify::event::ModifyKind::Metadata(_))
            );
            // Except the managed policy's: only root can change its mode or owner, and a
            // change that makes it unsafe must withdraw the roots at once.
            let managed = ev
                .paths
                .iter()
                .any(|p| p == Path::new(crate::policy::MANAGED_PATH));
            if (metadata && !managed)
                || !matches!(
                    ev.kind,
                    EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
                )
            {
                return;
            }
            let ours = |p: &PathBuf| p.file_name().is_some_and(|n| names.iter().any(|m| m == n));
            if ev.paths.iter().any(ours) {
                let _ = tx.send(());
            }
        })?;
        for place in &places {
            let dir = place
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        }
        std::thread::Builder::new()
            .name("fsbroker-policy".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    while rx.recv_timeout(QUIET).is_ok() {}
                    match broker.upgrade() {
                        Some(b) => b.reload_and_log(),
                        None => break,
                    }
                }
            })
            .map_err(|e| notify::Error::generic(&e.to_string()))?;
        Ok(PolicyWatcher { _watcher: watcher })
    }
}

impl crate::watch::Owner for Broker {
    fn policy(&self) -> Arc<Policy> {
        Broker::policy(self)
    }

    fn retire_root(&self, root: &Path) {
        Broker::retire_root(self, root);
    }
}

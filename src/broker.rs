//! The broker: state shared by every session.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use crate::audit::{AuditError, AuditLog};
use crate::consent::BrokerTurns;
use crate::fair::FairPool;
use crate::limits::{HELD_RETRY, QUIET};
use crate::locks::LockTable;
use crate::policy::{Overrides, Policy, PolicyError};
use crate::sandbox::ConsentMode;
use crate::throttle::RateLimits;
use crate::watch::WatchHub;

/// Shared state behind every session: the policy (and through it the roots), the locks, the
/// audit log, and the sessions themselves (to revoke and notify on a policy reload).
///
/// A request takes one snapshot of the policy ([`Broker::policy`]) and uses it throughout,
/// so a reload never changes the rules halfway through an operation.
#[derive(Debug)]
pub struct Broker {
    policy: RwLock<Arc<Policy>>,
    overrides: Overrides,
    locks: Arc<LockTable>,
    audit: Option<Arc<AuditLog>>,
    /// Set when the broker is asked to stop (SIGTERM, SIGINT): transports stop taking
    /// requests and let the running ones finish.
    stop: tokio::sync::watch::Sender<bool>,
    /// Counts the policies put in force ([`Broker::apply`]), for those that must follow them.
    applied: tokio::sync::watch::Sender<u64>,
    sessions: Mutex<Vec<Weak<dyn Member>>>,
    watches: Arc<WatchHub>,
    rate: RwLock<Arc<RateLimits>>,
    next_session: AtomicU64,
    pool: Arc<FairPool>,
    fast: Arc<crate::fast::FastPath>,
    turns: BrokerTurns,
    /// The key a proxy proves its link with (`serve --listen`); without one, no link is a
    /// proxy's, and what a peer says about its server is not taken.
    proxy_key: std::sync::OnceLock<crate::rundir::ProxyKey>,
    /// Every root is withdrawn because the policy file is held ([`PolicyError::Held`]).
    held: std::sync::atomic::AtomicBool,
    /// The policy file as it was when the policy in force was read from it ([`stamp`]).
    read_stamp: Mutex<Option<Stamp>>,
}

/// What identifies one version of a file without opening it: device, inode, size and
/// modification time (a `stat`, which no lease delays).
type Stamp = (u64, u64, u64, i64, i64);

#[allow(clippy::disallowed_methods)] // a `stat` of the policy file, the broker's own
fn stamp(path: &Path) -> Option<Stamp> {
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

/// What the broker needs of each session it opened: to revoke access and say the roots
/// changed on a reload, and to abandon uploads left idle. Sessions (the layer above) implement
/// it, so the broker reaches them without depending on them.
pub(crate) trait Member: Send + Sync {
    /// The session's id.
    fn id(&self) -> u64;
    /// Takes away what the session holds beneath `root` (grants, uploads), except beneath the
    /// `spared` roots nested in it.
    fn revoke(&self, root: &Path, spared: &[PathBuf]);
    /// Queues `notifications/roots/list_changed`.
    fn notify_roots_changed(&self);
    /// Abandons uploads idle for `idle` or longer; returns how many.
    fn reap_idle_uploads(&self, idle: Duration) -> usize;
}

impl Broker {
    /// A broker running `policy`; `overrides` are the command-line roots and switches that
    /// are merged again into every reload of the policy file. Opens the audit log when the
    /// policy asks for one.
    pub fn with_overrides(
        policy: Policy,
        mut overrides: Overrides,
    ) -> Result<Arc<Broker>, AuditError> {
        let first_session = first_session_id();
        // Taken after the policy was read: a file changed in between is read again at the
        // next change anyway (its stamp then differs).
        let source_stamp = policy.source().and_then(stamp);
        let audit = policy
            .audit()
            .map(|c| AuditLog::open_run(c, Some(first_session)).map(Arc::new))
            .transpose()?;
        if let Some(config) = policy.audit() {
            // Now that the log exists, know it by identity too; and keep it protected across
            // reloads that name another log (this one stays in use until restart).
            policy.protected().refresh();
            overrides.audit_in_use = Some(config.path.clone());
        }
        let broker = Arc::new_cyclic(|me| Broker {
            rate: RwLock::new(Arc::new(RateLimits::new(policy.limits()))),
            policy: RwLock::new(Arc::new(policy)),
            overrides,
            locks: Arc::default(),
            audit,
            stop: tokio::sync::watch::Sender::new(false),
            applied: tokio::sync::watch::Sender::new(0),
            sessions: Mutex::new(Vec::new()),
            watches: WatchHub::start(me.clone() as Weak<dyn crate::watch::Owner>),
            next_session: AtomicU64::new(first_session),
            pool: FairPool::new(crate::fair::blocking_slots()),
            fast: Arc::default(),
            turns: BrokerTurns::default(),
            proxy_key: std::sync::OnceLock::new(),
            held: Default::default(),
            read_stamp: Mutex::new(source_stamp),
        });
        reap_idle_uploads(Arc::downgrade(&broker));
        Ok(broker)
    }

    /// How many file operations one broker runs at once on tokio's blocking pool (twice the
    /// CPUs, at least 8), shared fairly between its sessions. A host that builds the runtime
    /// its brokers run in gives it at least this many blocking threads
    /// (`tokio::runtime::Builder::max_blocking_threads`), plus a few for tokio's own blocking
    /// work: fewer leave slots idle, many more only add threads woken for one operation each.
    pub fn blocking_slots() -> usize {
        crate::fair::blocking_slots()
    }

    /// A broker running `policy` (no command-line overrides).
    pub fn new(policy: Policy) -> Result<Arc<Broker>, AuditError> {
        Broker::with_overrides(policy, Overrides::default())
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        // A poisoned lock only means a writer panicked after a complete swap of the `Arc`;
        // the value inside is still a whole policy.
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The path locks every session shares.
    pub(crate) fn locks(&self) -> &Arc<LockTable> {
        &self.locks
    }

    /// The per-session rate limiters of the policy in force.
    pub(crate) fn rate_limits(&self) -> Arc<RateLimits> {
        Arc::clone(&self.rate.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The slots of the blocking pool, shared fairly between sessions.
    pub(crate) fn pool(&self) -> &Arc<FairPool> {
        &self.pool
    }

    /// The fast path small requests take instead of the pool when it is free.
    pub(crate) fn fast(&self) -> &Arc<crate::fast::FastPath> {
        &self.fast
    }

    /// Turns to ask the person (consent prompts), shared by every session.
    pub(crate) fn turns(&self) -> &BrokerTurns {
        &self.turns
    }

    /// The watch hub every session's `files/watch` goes through.
    pub(crate) fn watches(&self) -> &Arc<WatchHub> {
        &self.watches
    }

    /// Asks every transport to stop taking requests; the requests already taken finish (and
    /// are recorded), then the transports end.
    pub fn stop(&self) {
        self.stop.send_replace(true);
        // Watches not yet made are abandoned, so the run can end (and seal its log) in time.
        self.watches.stop();
    }

    /// Whether [`Broker::stop`] was called, as a receiver that sees it happen.
    pub(crate) fn stop_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Resolves once [`Broker::stop`] was called.
    pub fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Takes proxies on the links that offer `key` (a shared broker's socket). The first key
    /// stands.
    pub(crate) fn accept_proxies(&self, key: crate::rundir::ProxyKey) {
        let _ = self.proxy_key.set(key);
    }

    /// Whether `offered` is the key of this broker's proxies.
    pub(crate) fn is_proxy_key(&self, offered: &str) -> bool {
        self.proxy_key.get().is_some_and(|k| k.matches(offered))
    }

    /// The audit log, when auditing is on.
    pub fn audit(&self) -> Option<&Arc<AuditLog>> {
        self.audit.as_ref()
    }

    /// A new session's id: unique across brokers and restarts (see [`first_session_id`]).
    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Counts `member` among the sessions that hear of reloads and have idle uploads reaped.
    pub(crate) fn enroll(&self, member: Weak<dyn Member>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.retain(|w| w.strong_count() > 0);
        sessions.push(member);
    }

    /// The sessions still open.
    fn members(&self) -> Vec<Arc<dyn Member>> {
        let mut list = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    }

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
        let new = match Policy::load(old.source(), &self.overrides) {
            Ok(new) => new,
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
            Err(e) => return Err(e),
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
    /// `notifications/roots/list_changed` when the roots changed in any way.
    pub fn apply(&self, new: Policy) -> ReloadReport {
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
            self.locks.release_under(root, &spared(root));
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
        let current = self.policy();
        if current.roots().iter().any(|r| r.path() == root) {
            self.apply(current.without_root(root));
        }
    }

    /// Watches the policy file (if the policy came from one) and reloads it on every change,
    /// after a short quiet period (editors write in several steps). Returns the watcher, which
    /// stops when dropped.
    pub fn watch_policy(self: &Arc<Self>) -> Option<PolicyWatcher> {
        let file = self.policy().source()?.to_path_buf();
        match PolicyWatcher::start(Arc::downgrade(self), &file) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "cannot watch the policy file; reload with SIGHUP");
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

/// Where this broker's session ids start: a random number below 2^52, so that ids are unique
/// across brokers and restarts (two runs sharing one audit log never both log a session 1),
/// unguessable, and still exact as JSON numbers (below 2^53) for as many sessions as a broker
/// will ever serve. Within a broker they count up from here, so they never collide.
fn first_session_id() -> u64 {
    let hex = crate::random::hex(8);
    let random = u64::from_str_radix(&hex, 16).unwrap_or(1);
    (random >> 12).max(1)
}

/// Abandons uploads left idle for `lock_timeout_ms`, as kept locks expire: an upload holds a
/// lock and descriptors, and a session that stops sending chunks must not hold them for as
/// long as it stays connected. Runs on a thread of its own until the broker is gone.
fn reap_idle_uploads(broker: Weak<Broker>) {
    let spawned = std::thread::Builder::new()
        .name("fsbroker-uploads".into())
        .spawn(move || {
            loop {
                let idle = match broker.upgrade() {
                    Some(b) => b.policy().limits().lock_timeout,
                    None => return,
                };
                // Often enough that an upload goes within a quarter of its limit past it.
                std::thread::sleep(
                    (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1)),
                );
                let Some(b) = broker.upgrade() else { return };
                for s in b.members() {
                    let n = s.reap_idle_uploads(idle);
                    if n > 0 {
                        tracing::info!(
                            session = s.id(),
                            abandoned = n,
                            "idle uploads abandoned (lock_timeout_ms)"
                        );
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the idle-upload reaper; idle uploads last until their session ends");
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
                format!("{:?} {:?} {:?}", r.mode(), r.consent(), r.deny().patterns()),
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
    fn start(broker: Weak<Broker>, file: &Path) -> notify::Result<PolicyWatcher> {
        use notify::{EventKind, Watcher};
        // Watch directories, not the file: editors replace a file by renaming a new one over
        // it, which a watch on the old inode would never see. A policy that is a symlink is
        // watched where it is and where it leads (dotfile managers link configs).
        let mut places: Vec<PathBuf> = vec![file.to_path_buf()];
        if let Ok(target) = std::fs::canonicalize(file) {
            if target != file {
                places.push(target);
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
            if metadata
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

//! The broker: state shared by every session. Its reloads and revocations are in
//! `reload.rs`, what a host may show of its sessions in `sessions.rs`, and the person's acts
//! (answering prompts, revoking, pausing) in `person.rs`.

mod person;
mod reload;
mod sessions;

pub use person::{ActError, RootState};
pub use reload::{PolicyWatcher, ReloadReport};
use reload::{Stamp, stamp};
pub use sessions::{EVENT_BACKLOG, Event, SessionInfo, Transport};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use crate::audit::{AuditError, AuditLog};
use crate::consent::{BrokerTurns, Desk};
use crate::fair::FairPool;
use crate::locks::LockTable;
use crate::policy::{Overrides, Policy};
use crate::throttle::RateLimits;
use crate::watch::WatchHub;

/// Shared state behind every session: the policy (and through it the roots), the locks, the
/// audit log, and the sessions themselves (to revoke and notify on a policy reload).
///
/// A request takes one snapshot of the policy ([`Broker::policy`]) and uses it throughout,
/// so a reload never changes the rules halfway through an operation.
#[derive(Debug)]
pub struct Broker {
    /// The policy in force: `configured` without the roots the person paused.
    policy: RwLock<Arc<Policy>>,
    /// The policy as loaded or applied, before the person's pauses.
    configured: RwLock<Arc<Policy>>,
    /// The roots the person paused (canonical paths): kept out of every policy put in force
    /// until resumed.
    paused: Mutex<Vec<PathBuf>>,
    /// Consent prompts waiting for a console.
    desk: Desk,
    /// Bumped when sessions, prompts, grants or roots change ([`Broker::changes`]).
    changes: Arc<tokio::sync::watch::Sender<u64>>,
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
    /// Answered requests, for a host's live view ([`Broker::events`]).
    events: tokio::sync::broadcast::Sender<Event>,
    /// The key a proxy proves its link with (`serve --listen`); without one, no link is a
    /// proxy's, and what a peer says about its server is not taken.
    proxy_key: std::sync::OnceLock<crate::rundir::ProxyKey>,
    /// Every root is withdrawn because the policy file is held ([`PolicyError::Held`]).
    held: std::sync::atomic::AtomicBool,
    /// The policy file as it was when the policy in force was read from it ([`stamp`]).
    read_stamp: Mutex<Option<Stamp>>,
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
    /// Drops grant `id` if it is the session's (and the uploads it alone covered), and says
    /// the roots changed; returns the grant.
    fn revoke_grant(&self, id: u64) -> Option<crate::consent::GrantInfo>;
    /// Ends the session: its requests are refused from now on, its grants and uploads go,
    /// and its transport closes.
    fn end(&self);
    /// Abandons uploads idle for `idle` or longer; returns how many.
    fn reap_idle_uploads(&self, idle: Duration) -> usize;
    /// What a host may show of the session (its locks and watches, which the broker keeps,
    /// are filled in by the broker).
    fn info(&self) -> SessionInfo;
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
        let changes = Arc::new(tokio::sync::watch::Sender::new(0));
        let policy = Arc::new(policy);
        let broker = Arc::new_cyclic(|me| Broker {
            rate: RwLock::new(Arc::new(RateLimits::new(policy.limits()))),
            configured: RwLock::new(Arc::clone(&policy)),
            policy: RwLock::new(policy),
            paused: Mutex::default(),
            desk: Desk::new(Arc::clone(&changes)),
            changes,
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
            events: tokio::sync::broadcast::channel(EVENT_BACKLOG).0,
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

    /// The policy as loaded or applied, before the roots the person paused were taken out.
    pub(crate) fn configured(&self) -> Arc<Policy> {
        Arc::clone(&self.configured.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The prompts waiting for a console.
    pub(crate) fn desk(&self) -> &Desk {
        &self.desk
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
        {
            let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            sessions.retain(|w| w.strong_count() > 0);
            sessions.push(member);
        }
        self.changed();
    }

    /// The sessions still open.
    pub(crate) fn members(&self) -> Vec<Arc<dyn Member>> {
        let mut list = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
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

//! A session: one connected MCP server.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::broker::Broker;
use crate::jsonrpc;
use crate::outgoing::{BodyPool, OUTPUT_BUDGET_KIB};
use crate::upload::Uploads;

/// The notification a proxy sends a shared broker (`proxy --connect`) to name the MCP server
/// behind it: `{"name": "…"}`, the server's own `serverInfo.name`.
pub const PEER_NOTIFICATION: &str = "notifications/fsbroker/peer";

/// The largest [`PEER_NOTIFICATION`] taken: a proxy's note (a name, a revision, the rules of
/// a sandbox) is a few KiB.
pub(crate) const MAX_PEER_NOTE: usize = 64 << 10;

/// How often a session's refusals over the request rate get an audit line.
pub(crate) const RATE_REFUSAL_LINES: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest server name kept (consent prompts show it).
const MAX_PEER_NAME: usize = 256;

/// How many notifications may wait for a session's writer before new ones are dropped.
const NOTIFICATION_QUEUE: usize = 1024;

/// One peer's view of the broker. Requests of a session run concurrently; share it in an
/// `Arc`.
#[derive(Debug)]
pub struct Session {
    broker: Arc<Broker>,
    state: Arc<SessionState>,
    notifications: Mutex<Option<Notifications>>,
    output_budget: Arc<tokio::sync::Semaphore>,
}

/// The notifications for one session's peer, in the order they should be sent.
///
/// File notifications wait in a bounded queue (a peer that does not read makes the broker
/// hold them, coalesced, in the watcher instead). `notifications/roots/list_changed` never
/// waits behind them and is never dropped: it is a flag, delivered first by the next
/// [`Notifications::recv`].
#[derive(Debug)]
pub struct Notifications {
    rx: mpsc::Receiver<Vec<u8>>,
    state: std::sync::Weak<SessionState>,
    wake: Arc<tokio::sync::Notify>,
}

impl Notifications {
    /// The next notification frame (newline included), or `None` once the session is gone.
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        loop {
            let state = self.state.upgrade()?;
            if state
                .roots_changed
                .swap(false, std::sync::atomic::Ordering::AcqRel)
            {
                return Some(jsonrpc::notification_frame(
                    "notifications/roots/list_changed",
                    None,
                ));
            }
            drop(state);
            tokio::select! {
                biased;
                () = self.wake.notified() => {}
                frame = self.rx.recv() => return frame,
            }
        }
    }
}

/// A subtree granted by `files/consent` (or when `roots/list` offered a root).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Grant {
    /// The canonical path of the root it was granted through (revoked with that root).
    root: PathBuf,
    /// The subtree's canonical absolute path, as the person saw it.
    path: PathBuf,
}

/// What the broker and running operations need of a session, shared and outliving no one:
/// the broker holds it weakly, to revoke grants and send notifications on a policy reload.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub(crate) id: u64,
    pub(crate) uploads: Uploads,
    /// Pages for large response bodies, reused for the next large read; the broker's reaper
    /// gives back those idle for a second.
    bodies: Arc<BodyPool>,
    grants: Mutex<Vec<Grant>>,
    notify: mpsc::Sender<Vec<u8>>,
    roots_changed: std::sync::atomic::AtomicBool,
    wake: Arc<tokio::sync::Notify>,
    peer: Mutex<Option<String>>,
    /// Whether the peer speaks MCP 2026-07-28 (results then carry `resultType`).
    modern: std::sync::atomic::AtomicBool,
    /// Refusals over the request rate since the last one written to the audit log, and when
    /// that one was: see [`SessionState::rate_refusal_line`].
    rate_refused: Mutex<(u64, Option<std::time::Instant>)>,
    /// Whether a proxy's account of the server's confinement was recorded (one per session).
    confinement_recorded: std::sync::atomic::AtomicBool,
    /// Whether the session's `prompt` roots were offered to the person (on its first
    /// `roots/list`).
    pub(crate) roots_offered: std::sync::atomic::AtomicBool,
    /// Requests received and not yet answered, by arrival number, taken when the transport
    /// read them (their tasks may then run in any order): an upload chunk ahead of its turn
    /// waits only while a request that arrived before it, which could be the chunk it needs,
    /// is unanswered.
    in_flight: Mutex<std::collections::BTreeSet<u64>>,
    next_arrival: std::sync::atomic::AtomicU64,
    /// Bumped whenever a request of the session is answered or an upload moves: what chunks
    /// waiting for their turn wait on.
    progress: Arc<tokio::sync::watch::Sender<u64>>,
    /// One prompt to the person at a time for this session.
    pub(crate) prompting: Arc<tokio::sync::Semaphore>,
}

impl SessionState {
    /// Grants the subtree at the canonical absolute `path`, through the root at `root`, to
    /// this session. Returns whether it was not granted before.
    pub(crate) fn grant(&self, root: &Path, path: PathBuf) -> bool {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        let g = Grant {
            root: root.to_path_buf(),
            path,
        };
        if grants.contains(&g) {
            return false;
        }
        grants.push(g);
        true
    }

    /// Whether a grant covers the absolute path `abs` (the path itself or an ancestor),
    /// whichever root it was granted through: a person who approved a folder approved what
    /// is in it, a root nested there included.
    pub(crate) fn is_granted(&self, abs: &Path) -> bool {
        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.iter().any(|g| abs.starts_with(&g.path))
    }

    /// The granted subtrees at or beneath the absolute path `abs`.
    pub(crate) fn granted_within(&self, abs: &Path) -> Vec<PathBuf> {
        let grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants
            .iter()
            .filter(|g| g.path.starts_with(abs))
            .map(|g| g.path.clone())
            .collect()
    }

    /// Drops the grants of the revoked root at `root`, and the uploads under it except those
    /// under `spared` (roots nested inside it that stay in force).
    pub(crate) fn revoke(&self, root: &Path, spared: &[PathBuf]) {
        let mut grants = self.grants.lock().unwrap_or_else(|e| e.into_inner());
        grants.retain(|g| g.root != root);
        drop(grants);
        self.uploads.end_under(root, spared);
    }

    /// Queues a notification unless the queue is full (`false`: keep it and try later). A
    /// session whose peer has gone counts as delivered.
    pub(crate) fn try_notify(&self, frame: Vec<u8>) -> bool {
        !matches!(
            self.notify.try_send(frame),
            Err(mpsc::error::TrySendError::Full(_))
        )
    }

    /// Raises `notifications/roots/list_changed` (once, however often the roots change
    /// before the peer's next read; never dropped).
    pub(crate) fn notify_roots_changed(&self) {
        self.roots_changed
            .store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
    }

    /// Whether a request that arrived before request number `arrival` is still unanswered.
    pub(crate) fn earlier_unfinished(&self, arrival: u64) -> bool {
        let set = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        set.first().is_some_and(|&first| first < arrival)
    }

    /// A receiver that sees every answer and every upload move of the session.
    pub(crate) fn progress(&self) -> tokio::sync::watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// Counts a refusal over the request rate; returns whether it gets an audit line, and how
    /// many earlier ones that line stands for. A peer past its rate would otherwise fill the
    /// log as fast as it can write: one line a second, each counting the refusals folded
    /// into it (`alsoRefused`), keeps the log's growth to the rate.
    pub(crate) fn rate_refusal_line(&self) -> Option<u64> {
        let mut r = self.rate_refused.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if r.1
            .is_some_and(|last| now.duration_since(last) < RATE_REFUSAL_LINES)
        {
            r.0 += 1;
            return None;
        }
        r.1 = Some(now);
        Some(std::mem::take(&mut r.0))
    }

    /// Refusals over the request rate that no line has counted yet.
    pub(crate) fn rate_refusals_unwritten(&self) -> u64 {
        self.rate_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// The MCP server's name, when the transport learned it.
    pub(crate) fn peer_name(&self) -> Option<String> {
        self.peer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the peer speaks MCP 2026-07-28 ([`Session::set_modern`]).
    pub(crate) fn is_modern(&self) -> bool {
        self.modern.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl crate::broker::Member for SessionState {
    fn id(&self) -> u64 {
        self.id
    }

    fn revoke(&self, root: &Path, spared: &[PathBuf]) {
        SessionState::revoke(self, root, spared);
    }

    fn notify_roots_changed(&self) {
        SessionState::notify_roots_changed(self);
    }

    fn reap_idle_uploads(&self, idle: std::time::Duration) -> usize {
        // The same round gives back output pages a quiet session no longer uses.
        self.bodies.trim();
        self.uploads.reap(idle)
    }
}

impl crate::watch::Subscriber for SessionState {
    fn try_notify(&self, frame: Vec<u8>) -> bool {
        SessionState::try_notify(self, frame)
    }

    fn is_granted(&self, abs: &Path) -> bool {
        SessionState::is_granted(self, abs)
    }
}

impl Broker {
    /// Opens a new session (one connection, one MCP server).
    pub fn session(self: &Arc<Self>) -> Session {
        let (session, state) = Session::new(Arc::clone(self), self.next_session_id());
        self.enroll(Arc::downgrade(&state) as std::sync::Weak<dyn crate::broker::Member>);
        session
    }
}

impl Session {
    pub(crate) fn new(broker: Arc<Broker>, id: u64) -> (Session, Arc<SessionState>) {
        let (tx, rx) = mpsc::channel(NOTIFICATION_QUEUE);
        let wake = Arc::new(tokio::sync::Notify::new());
        let progress = Arc::new(tokio::sync::watch::Sender::new(0));
        let state = Arc::new(SessionState {
            id,
            uploads: Uploads::new(Arc::clone(&progress)),
            bodies: Arc::default(),
            grants: Mutex::new(Vec::new()),
            notify: tx,
            roots_changed: std::sync::atomic::AtomicBool::new(false),
            wake: Arc::clone(&wake),
            peer: Mutex::new(None),
            modern: std::sync::atomic::AtomicBool::new(false),
            roots_offered: Default::default(),
            confinement_recorded: Default::default(),
            rate_refused: Mutex::default(),
            in_flight: Mutex::default(),
            next_arrival: Default::default(),
            progress,
            prompting: Arc::new(tokio::sync::Semaphore::new(1)),
        });
        let session = Session {
            broker,
            state: Arc::clone(&state),
            notifications: Mutex::new(Some(Notifications {
                rx,
                state: Arc::downgrade(&state),
                wake,
            })),
            output_budget: Arc::new(tokio::sync::Semaphore::new(OUTPUT_BUDGET_KIB)),
        };
        (session, state)
    }

    /// This session's number, unique within its broker (it names the session in logs and
    /// in the audit log).
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The broker this session belongs to.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    pub(crate) fn state(&self) -> &Arc<SessionState> {
        &self.state
    }

    /// Pages for large response bodies, reused once the peer has read them.
    pub(crate) fn bodies(&self) -> &Arc<BodyPool> {
        &self.state.bodies
    }

    /// Reserves room for a response of about `bytes` bytes in this session's output budget;
    /// waits while the responses already built but not yet written fill it.
    pub(crate) async fn reserve_output(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        // At most half the budget each, so the largest chunks still overlap two at a time
        // (one being written while the next is read and encoded).
        let kib = bytes.div_ceil(1024).clamp(1, OUTPUT_BUDGET_KIB / 2) as u32;
        Arc::clone(&self.output_budget)
            .acquire_many_owned(kib)
            .await
            .ok()
    }

    /// Names the MCP server on the other end (shown in consent prompts).
    pub fn set_peer_name(&self, name: impl Into<String>) {
        let mut name: String = name.into();
        if name.len() > MAX_PEER_NAME {
            let mut cut = MAX_PEER_NAME;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        *self.state.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(name);
    }

    /// Marks the peer as speaking MCP 2026-07-28 (or not): every result the session sends it
    /// then carries `"resultType":"complete"`, which that revision requires and earlier ones
    /// do not expect.
    pub fn set_modern(&self, modern: bool) {
        self.state
            .modern
            .store(modern, std::sync::atomic::Ordering::Release);
    }

    /// Takes what a proxy reported ([`PEER_NOTIFICATION`]): the server's name (the first one
    /// stands, so the name a person saw in one prompt is the name they see in the next), the
    /// revision its connection speaks (`protocolVersion`), and the sandbox it started the
    /// server in (`confinement`, recorded in the audit log as the proxy's account).
    ///
    /// Only a proxy's link is heard: the note must carry the key of the shared broker's socket
    /// (`key`), which a proxy reads from the user's private runtime directory and a server,
    /// confined or talking to `serve` directly, does not have. Anything else (a plain `serve`
    /// peer is the server itself) is dropped with a warning, as is a note over
    /// [`MAX_PEER_NOTE`] bytes or beyond the session's request rate. A session records one
    /// confinement, the first.
    pub(crate) async fn learn_peer(&self, params: Option<&serde_json::value::RawValue>) {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Peer {
            key: Option<String>,
            name: Option<String>,
            protocol_version: Option<String>,
            confinement: Option<serde_json::Value>,
        }
        let ignore = |why: &str| {
            tracing::warn!(
                session = self.id(),
                why,
                "ignoring a notifications/fsbroker/peer"
            );
        };
        let text = params.map_or("", |p| p.get());
        if text.len() > MAX_PEER_NOTE {
            return ignore("it is larger than a proxy's note can be");
        }
        let Ok(peer) = serde_json::from_str::<Peer>(text) else {
            return ignore("it is not a proxy's note");
        };
        if !peer
            .key
            .as_deref()
            .is_some_and(|k| self.broker.is_proxy_key(k))
        {
            return ignore(
                "this link is not a proxy's (only `fsbroker proxy --connect` to a shared \
                 broker's socket, with the socket's key, may send it)",
            );
        }
        if self.broker.rate_limits().check_request(self.id()).is_err() {
            return ignore("the session is over its request rate");
        }
        if let Some(version) = &peer.protocol_version {
            self.set_modern(crate::jsonrpc::is_modern(version));
        }
        if let Some(confinement) = peer.confinement {
            let first = !self
                .state
                .confinement_recorded
                .swap(true, std::sync::atomic::Ordering::AcqRel);
            match (first, self.broker.audit()) {
                (false, _) => ignore("the session's confinement is already recorded"),
                (true, Some(log)) => {
                    let until = std::time::Instant::now() + crate::audit::OWN_LINE_WAIT;
                    let log = Arc::clone(log);
                    if let Err(e) =
                        crate::audit::AuditLog::proxy_account(log, self.id(), confinement, until)
                            .await
                    {
                        tracing::error!(error = %e, "cannot record a server's confinement");
                    }
                }
                (true, None) => {}
            }
        }
        let Some(name) = peer.name else { return };
        if self.state.peer_name().is_none() {
            tracing::info!(session = self.id(), server = %name, "server named by its proxy");
            self.set_peer_name(name);
        }
    }

    /// Counts a request as received, for a transport that hands requests to concurrent tasks:
    /// taken in arrival order, before the task is spawned.
    pub(crate) fn received(&self) -> Received {
        let arrival = self
            .state
            .next_arrival
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.state
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(arrival);
        Received {
            state: Arc::clone(&self.state),
            arrival,
        }
    }

    /// The stream of notification frames (newline included) for this session's peer:
    /// `notifications/roots/list_changed`, and later `notifications/files/changed`. It can be
    /// taken once; the transport that owns the peer's output takes it.
    pub fn take_notifications(&self) -> Option<Notifications> {
        self.notifications
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// A request counted as received until it has been answered (dropped).
#[derive(Debug)]
pub(crate) struct Received {
    state: Arc<SessionState>,
    arrival: u64,
}

impl Received {
    /// The request's arrival number in its session.
    pub(crate) fn arrival(&self) -> u64 {
        self.arrival
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        self.state
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.arrival);
        self.state.progress.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A session ends when its connection does: its kept locks are released, and its unfinished
/// uploads remove their staging files.
impl Drop for Session {
    fn drop(&mut self) {
        let unwritten = self.state.rate_refusals_unwritten();
        if unwritten > 0 && self.broker.audit().is_some() {
            // Folded into no line (the session ended within a second of its last one).
            tracing::warn!(
                session = self.id(),
                refused = unwritten,
                "requests over the rate refused in the session's last second, not in the audit log"
            );
        }
        self.broker.locks().release_session(self.id());
        self.broker.watches().remove_session(self.id());
        self.broker.rate_limits().prune();
        let abandoned = self.state.uploads.len();
        if abandoned > 0 {
            tracing::info!(
                session = self.id(),
                abandoned,
                "removing unfinished uploads"
            );
        }
        self.state.uploads.clear();
    }
}

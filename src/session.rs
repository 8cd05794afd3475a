//! A session's state: one connected MCP server, as the methods and the broker see it.
//!
//! The host's handle on it, [`crate::Session`], is in `host.rs`; this is what running
//! operations share (grants, uploads, the output budget, the notification queue, the
//! bookkeeping of requests in flight), held by the broker only weakly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::broker::{SessionInfo, Transport};
use crate::consent::{Grants, SessionTurns};
use crate::limits::{MAX_PEER_NAME, NOTIFICATION_QUEUE, OUTPUT_BUDGET_KIB, RATE_REFUSAL_LINES};
use crate::outgoing::BodyPool;
use crate::upload::Uploads;

/// What the broker and running operations need of a session, shared and outliving no one:
/// the broker holds it weakly, to revoke grants and send notifications on a policy reload.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub(crate) id: u64,
    pub(crate) uploads: Uploads,
    /// Pages for large response bodies, reused for the next large read; the broker's reaper
    /// gives back those idle for a second.
    bodies: Arc<BodyPool>,
    /// Room for responses built but not yet written, in KiB ([`SessionState::reserve_output`]).
    output_budget: Arc<tokio::sync::Semaphore>,
    /// What the person granted this session ([`crate::consent`]).
    pub(crate) grants: Grants,
    notify: mpsc::Sender<Vec<u8>>,
    /// `notifications/roots/list_changed` is due (a flag: never queued, never dropped).
    pub(crate) roots_changed: std::sync::atomic::AtomicBool,
    wake: Arc<tokio::sync::Notify>,
    peer: Mutex<Option<String>>,
    /// The managed policy's SHA-256 last put on one of this session's audit lines.
    managed_noted: Mutex<Option<String>>,
    /// Whether the peer speaks MCP 2026-07-28 (results then carry `resultType`).
    modern: std::sync::atomic::AtomicBool,
    /// Refusals over the request rate since the last one written to the audit log, and when
    /// that one was: see [`SessionState::rate_refusal_line`].
    rate_refused: Mutex<(u64, Option<std::time::Instant>)>,
    /// Whether a proxy's account of the server's confinement was recorded (one per session).
    pub(crate) confinement_recorded: std::sync::atomic::AtomicBool,
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
    pub(crate) turns: SessionTurns,
    /// When the session opened, how its server is connected, and what it has done: what a
    /// host shows of it ([`crate::SessionInfo`]).
    started: std::time::SystemTime,
    transport: Mutex<Transport>,
    /// The kernel sandbox its server runs in, as its transport reported it.
    confinement: Mutex<Option<String>>,
    pub(crate) stats: Stats,
    /// Set when the person ended the session ([`crate::Broker::end_session`]): requests are
    /// refused from then on, and its transport closes.
    ended: tokio::sync::watch::Sender<bool>,
}

/// A session's running counts, kept by the methods' `call`.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    denials: AtomicU64,
}

impl Stats {
    /// Counts one answered request: its outcome (`ok` or an error's code) and the payload
    /// bytes it read or wrote.
    pub(crate) fn count(&self, outcome: &str, read: u64, written: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(read, Ordering::Relaxed);
        self.bytes_written.fetch_add(written, Ordering::Relaxed);
        if outcome != "ok" {
            self.errors.fetch_add(1, Ordering::Relaxed);
            if outcome == "PERMISSION_DENIED" {
                self.denials.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What the session's notification stream ([`crate::Notifications`]) reads from.
#[derive(Debug)]
pub(crate) struct Outbox {
    pub(crate) rx: mpsc::Receiver<Vec<u8>>,
    pub(crate) wake: Arc<tokio::sync::Notify>,
}

impl SessionState {
    /// The state of a new session numbered `id`, and the outbox its notifications go to.
    pub(crate) fn new(id: u64) -> (Arc<SessionState>, Outbox) {
        let (tx, rx) = mpsc::channel(NOTIFICATION_QUEUE);
        let wake = Arc::new(tokio::sync::Notify::new());
        let progress = Arc::new(tokio::sync::watch::Sender::new(0));
        let state = Arc::new(SessionState {
            id,
            uploads: Uploads::new(Arc::clone(&progress)),
            bodies: Arc::default(),
            output_budget: Arc::new(tokio::sync::Semaphore::new(OUTPUT_BUDGET_KIB)),
            grants: Grants::default(),
            notify: tx,
            roots_changed: std::sync::atomic::AtomicBool::new(false),
            wake: Arc::clone(&wake),
            peer: Mutex::new(None),
            managed_noted: Mutex::new(None),
            modern: std::sync::atomic::AtomicBool::new(false),
            roots_offered: Default::default(),
            confinement_recorded: Default::default(),
            rate_refused: Mutex::default(),
            in_flight: Mutex::default(),
            next_arrival: Default::default(),
            progress,
            turns: SessionTurns::default(),
            started: std::time::SystemTime::now(),
            transport: Mutex::default(),
            confinement: Mutex::default(),
            stats: Stats::default(),
            ended: tokio::sync::watch::Sender::new(false),
        });
        (state, Outbox { rx, wake })
    }

    /// Pages for large response bodies, reused once the peer has read them.
    pub(crate) fn bodies(&self) -> &Arc<BodyPool> {
        &self.bodies
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

    /// Counts a request as received, for a transport that hands requests to concurrent tasks:
    /// taken in arrival order, before the task is spawned.
    pub(crate) fn received(self: &Arc<Self>) -> Received {
        let arrival = self
            .next_arrival
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(arrival);
        Received {
            state: Arc::clone(self),
            arrival,
        }
    }

    /// Names the MCP server on the other end (shown in consent prompts), cut to
    /// [`MAX_PEER_NAME`] bytes.
    pub(crate) fn set_peer_name(&self, mut name: String) {
        if name.len() > MAX_PEER_NAME {
            let mut cut = MAX_PEER_NAME;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        *self.peer.lock().unwrap_or_else(|e| e.into_inner()) = Some(name);
    }

    /// Says how the session's server is connected (the transport that serves it).
    pub(crate) fn set_transport(&self, transport: Transport) {
        *self.transport.lock().unwrap_or_else(|e| e.into_inner()) = transport;
    }

    /// How the session's server is connected.
    pub(crate) fn transport(&self) -> Transport {
        *self.transport.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says what kernel sandbox the session's server runs in (`best-effort`, `strict`).
    pub(crate) fn set_confinement(&self, mode: String) {
        *self.confinement.lock().unwrap_or_else(|e| e.into_inner()) = Some(mode);
    }

    /// Whether the person ended the session.
    pub(crate) fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// A receiver that sees the person end the session.
    pub(crate) fn ended(&self) -> tokio::sync::watch::Receiver<bool> {
        self.ended.subscribe()
    }

    /// Marks the peer as speaking MCP 2026-07-28 (or not).
    pub(crate) fn set_modern(&self, modern: bool) {
        self.modern
            .store(modern, std::sync::atomic::Ordering::Release);
    }

    /// Drops the grants of the revoked root at `root`, and the uploads under it except those
    /// under `spared` (roots nested inside it that stay in force).
    pub(crate) fn revoke(&self, root: &Path, spared: &[PathBuf]) {
        self.grants.revoke_root(root);
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

    /// The managed policy's SHA-256 (`current`) when this session's audit lines have not
    /// carried it yet: its first line, and the first after the managed policy changed, say
    /// which rules were in force.
    pub(crate) fn managed_to_note(&self, current: Option<&str>) -> Option<String> {
        let current = current?;
        let mut noted = self.managed_noted.lock().unwrap_or_else(|e| e.into_inner());
        if noted.as_deref() == Some(current) {
            return None;
        }
        *noted = Some(current.to_owned());
        Some(current.to_owned())
    }

    /// The MCP server's name, when the transport learned it.
    pub(crate) fn peer_name(&self) -> Option<String> {
        self.peer.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the peer speaks MCP 2026-07-28 ([`crate::Session::set_modern`]).
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

    fn revoke_grant(&self, id: u64) -> Option<crate::consent::GrantInfo> {
        let gone = self.grants.revoke(id)?;
        // Uploads beneath it end, unless another grant still covers them.
        if !self.grants.covers(&gone.path) {
            let spared = self.grants.within(&gone.path);
            self.uploads.end_under(&gone.path, &spared);
        }
        self.notify_roots_changed();
        Some(gone)
    }

    fn end(&self) {
        self.ended.send_replace(true);
        self.grants.clear();
        self.uploads.clear();
    }

    fn info(&self) -> SessionInfo {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SessionInfo {
            id: self.id,
            server: self.peer_name(),
            modern: self.is_modern(),
            transport: self.transport(),
            started: self.started,
            requests: n(&self.stats.requests),
            bytes_read: n(&self.stats.bytes_read),
            bytes_written: n(&self.stats.bytes_written),
            errors: n(&self.stats.errors),
            denials: n(&self.stats.denials),
            uploads: self.uploads.len(),
            locks: 0,
            watches: 0,
            grants: self.grants.list(),
            confinement: self
                .confinement
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
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

    fn grants(&self) -> &Grants {
        &self.grants
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

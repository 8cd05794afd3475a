//! The host's API: a [`Session`] per connected MCP server, and what it is asked.
//!
//! A host builds a [`Broker`] (`broker/`: the policy, reloads, revocation, the audit log,
//! `stop`), opens a [`Session`] per server with [`Broker::session`], feeds each line the
//! server sends to [`Session::handle`], and sends what [`Session::take_notifications`]
//! yields. The transports (`transport/`) are hosts of this API too; beyond it they use only
//! the crate-private variants of `handle` that keep a large body in pages of its own
//! ([`Session::respond`]) or answer late from another thread ([`Session::respond_received`]).
//!
//! The session's state that running operations share is in `session.rs`; the methods that
//! answer requests are in `methods/`.

use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;

use crate::broker::Broker;
use crate::buffers::{Content, Line};
use crate::fast::Late;
use crate::jsonrpc::{self, Incoming};
use crate::limits::MAX_PEER_NOTE;
use crate::outgoing::Outgoing;
/// A request's place among its session's unanswered requests, taken when it arrives
/// ([`Session::received`]); transports hold it until they hand the request over.
pub(crate) use crate::session::Received;
use crate::session::{Outbox, SessionState};

/// The notification a proxy sends a shared broker (`proxy --connect`) to name the MCP server
/// behind it: `{"name": "…"}`, the server's own `serverInfo.name`.
pub const PEER_NOTIFICATION: &str = "notifications/fsbroker/peer";

/// The one method whose line may have its content lifted out before parsing: the others
/// would read the stand-in as their content.
const LIFTS_FOR: &str = "files/write";

/// The notification a shared broker sends a proxy (`proxy --connect`) just before it closes
/// the link because the person ended the session: the proxy then ends its server, as a local
/// proxy does ([`Session::ended`]). Only the broker writes to that link, so a server cannot
/// send it.
pub(crate) const ENDED_NOTIFICATION: &str = "notifications/fsbroker/ended";

/// One peer's view of the broker. Requests of a session run concurrently; share it in an
/// `Arc`.
#[derive(Debug)]
pub struct Session {
    broker: Arc<Broker>,
    state: Arc<SessionState>,
    notifications: Mutex<Option<Notifications>>,
}

/// The notifications for one session's peer, in the order they should be sent.
///
/// File notifications wait in a bounded queue (a peer that does not read makes the broker
/// hold them, coalesced, in the watcher instead). `notifications/roots/list_changed` never
/// waits behind them and is never dropped: it is a flag, delivered first by the next
/// [`Notifications::recv`].
#[derive(Debug)]
pub struct Notifications {
    outbox: Outbox,
    state: std::sync::Weak<SessionState>,
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
                () = self.outbox.wake.notified() => {}
                frame = self.outbox.rx.recv() => return frame,
            }
        }
    }
}

impl Broker {
    /// Opens a new session (one connection, one MCP server).
    pub fn session(self: &Arc<Self>) -> Session {
        let (state, outbox) = SessionState::new(self.next_session_id());
        self.enroll(Arc::downgrade(&state) as std::sync::Weak<dyn crate::broker::Member>);
        Session {
            broker: Arc::clone(self),
            notifications: Mutex::new(Some(Notifications {
                outbox,
                state: Arc::downgrade(&state),
            })),
            state,
        }
    }
}

impl Session {
    /// This session's number, unique within its broker (it names the session in logs and
    /// in the audit log).
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// The broker this session belongs to.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Whether the session's peer is a proxy that proved its link (`proxy --connect`).
    pub(crate) fn is_proxy_link(&self) -> bool {
        self.state.transport().is_proxy()
    }

    pub(crate) fn state(&self) -> &Arc<SessionState> {
        &self.state
    }

    /// Names the MCP server on the other end (shown in consent prompts).
    pub fn set_peer_name(&self, name: impl Into<String>) {
        self.state.set_peer_name(name.into());
    }

    /// Says how the session's server is connected, for a host that shows its sessions
    /// ([`Broker::sessions`]). The transports of this crate set it; a library host's
    /// sessions are [`crate::broker::Transport::Library`].
    pub fn set_transport(&self, transport: crate::broker::Transport) {
        self.state.set_transport(transport);
    }

    /// Resolves when the person ends this session ([`Broker::end_session`]): the transport
    /// then closes the connection (a proxy ends its server). Its requests are refused from
    /// that moment whether or not the transport listens.
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.state.ended();
        async move {
            // A session that goes away without being ended was not ended: never resolve.
            if rx.wait_for(|ended| *ended).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Marks the peer as speaking MCP 2026-07-28 (or not): every result the session sends it
    /// then carries `"resultType":"complete"`, which that revision requires and earlier ones
    /// do not expect.
    pub fn set_modern(&self, modern: bool) {
        self.state.set_modern(modern);
    }

    /// The host the session's server answers to has gone (a proxy's host closed its input):
    /// the session's questions to the person are withdrawn, and it asks none from now on.
    /// Nobody would use the answers, and a server waiting for one would outlive its host.
    pub fn host_left(&self) {
        self.withdraw_prompts("the host the server was working for has left");
    }

    /// Withdraws the session's consent prompts on the console, now and from now on (each is
    /// denied at once), saying `why`.
    pub(crate) fn withdraw_prompts(&self, why: &'static str) {
        self.broker.desk().withdraw_session(self.id(), why);
    }

    /// Takes what a proxy reported ([`PEER_NOTIFICATION`]): the server's name (the first one
    /// stands, so the name a person saw in one prompt is the name they see in the next), the
    /// revision its connection speaks (`protocolVersion`), the sandbox it started the
    /// server in (`confinement`, recorded in the audit log as the proxy's account), and that
    /// its host has left (`hostLeft: true`: [`Session::host_left`]), and that its server is a
    /// remote one (`remote: true`, `proxy --url`: [`crate::broker::Transport::Remote`]).
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
            #[serde(default)]
            host_left: bool,
            #[serde(default)]
            remote: bool,
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
        if peer.host_left {
            // Before the rate: it only takes away, and a busy session's host leaves too.
            self.host_left();
        }
        if self.broker.rate_limits().check_request(self.id()).is_err() {
            return ignore("the session is over its request rate");
        }
        // A link that proves it is a proxy's is one; a remote server's says so (once said,
        // it stays: the later notes are about the same server).
        if peer.remote {
            self.set_transport(crate::broker::Transport::Remote);
        } else if !self.state.transport().is_proxy() {
            self.set_transport(crate::broker::Transport::Proxy);
        }
        if let Some(version) = &peer.protocol_version {
            self.set_modern(crate::jsonrpc::is_modern(version));
        }
        if let Some(confinement) = peer.confinement {
            let first = !self
                .state
                .confinement_recorded
                .swap(true, std::sync::atomic::Ordering::AcqRel);
            match confinement.get("mode").and_then(|m| m.as_str()) {
                Some(mode) if first => self
                    .state
                    .set_confinement(crate::audit::cap(mode, 32).to_owned()),
                _ => {}
            }
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
        self.state.received()
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
    /// Handles one message (a line without its newline) and returns the response frame,
    /// newline included, or `None` when the message gets no answer (a notification, or a
    /// response to a request the broker never sent).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fsbroker::{Broker, Overrides, Policy};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let policy = Policy::load(None, &Overrides { roots: vec![dir.path().into()], ..Default::default() })?;
    /// let session = Broker::new(policy)?.session();
    /// // A path that leads out of the root is refused, however it is spelled.
    /// let reply = session
    ///     .handle(br#"{"jsonrpc":"2.0","id":7,"method":"files/read","params":{"path":"../../etc/passwd"}}"#)
    ///     .await
    ///     .unwrap();
    /// let reply: serde_json::Value = serde_json::from_slice(&reply)?;
    /// assert_eq!(reply["id"], 7);
    /// assert!(reply["error"]["data"]["code"].is_string(), "{reply}");
    /// // A notification gets no answer.
    /// let none = session.handle(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    /// assert!(none.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn handle(&self, line: &[u8]) -> Option<Vec<u8>> {
        self.respond(line).await.map(Outgoing::into_vec)
    }

    /// [`Session::handle`] for transports: the response as an [`Outgoing`] frame, whose large
    /// body (a base64 chunk) has not been copied into the rest of the frame.
    pub(crate) async fn respond(&self, line: &[u8]) -> Option<Outgoing> {
        self.respond_received(line, self.received(), None).await
    }

    /// Runs one request of this session.
    async fn request(
        &self,
        id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        content: Option<Content<'_>>,
        received: Received,
        late: Option<&Arc<Late>>,
    ) -> Option<Outgoing> {
        let arrival = received.arrival();
        // Without `late`, `received` lives until the answer is built.
        let _received = match late {
            Some(late) => {
                late.hold(id, received);
                None
            }
            None => Some(received),
        };
        let frame = crate::methods::call(
            self.broker(),
            self.state(),
            method,
            crate::methods::Args {
                params,
                lifted: content,
            },
            id,
            arrival,
            late,
        )
        .await;
        // Answered: its place goes now, as `_received` does for the pool's callers.
        if let Some(late) = late {
            late.release();
        }
        match late {
            Some(late) if late.answered() => None,
            _ => Some(frame),
        }
    }

    /// [`Session::respond_received`] for a line the transport hands over: an upload chunk's
    /// content is then decoded in place, in the line's own buffer, which goes back to the
    /// connection's spares when the chunk is written.
    pub(crate) async fn respond_line(
        &self,
        line: Line,
        received: Received,
        late: Option<&Arc<Late>>,
    ) -> Option<Outgoing> {
        if let Some(lifted) = jsonrpc::lift(&line) {
            if let Incoming::Request { id, method, params } = jsonrpc::parse(&lifted.view) {
                if method == LIFTS_FOR {
                    let content = Content::Owned(line, lifted.content);
                    return self
                        .request(id, &method, params, Some(content), received, late)
                        .await;
                }
            }
        }
        // Not an upload chunk (or not one whose content could be lifted): parsed whole, and
        // not lifted a second time.
        self.respond_incoming(jsonrpc::parse(&line), None, received, late)
            .await
    }

    /// [`Session::respond`] for a request already counted by [`Session::received`]. With
    /// `late` (a transport that can take an answer from another thread), a request stuck on
    /// the fast path is answered `TIMEOUT` through it at its deadline, and `None` is returned
    /// when it finally ends.
    pub(crate) async fn respond_received(
        &self,
        line: &[u8],
        received: Received,
        late: Option<&Arc<Late>>,
    ) -> Option<Outgoing> {
        // An upload chunk's content is lifted out of its line before parsing (see
        // `jsonrpc::lift`); any other method's line is parsed whole.
        let lifted = jsonrpc::lift(line);
        let (incoming, content) = match &lifted {
            Some(lifted) => match jsonrpc::parse(&lifted.view) {
                request @ Incoming::Request { .. } if request.method() == Some(LIFTS_FOR) => {
                    let content = Content::Borrowed(&line[lifted.content.clone()]);
                    (request, Some(content))
                }
                _ => (jsonrpc::parse(line), None),
            },
            None => (jsonrpc::parse(line), None),
        };
        self.respond_incoming(incoming, content, received, late)
            .await
    }

    /// Answers a parsed message: the core of [`Session::respond_line`] and
    /// [`Session::respond_received`].
    async fn respond_incoming(
        &self,
        incoming: Incoming<'_>,
        content: Option<Content<'_>>,
        received: Received,
        late: Option<&Arc<Late>>,
    ) -> Option<Outgoing> {
        match incoming {
            Incoming::Request { id, method, params } => {
                self.request(id, &method, params, content, received, late)
                    .await
            }
            Incoming::Notification { method, params } => {
                if method == PEER_NOTIFICATION {
                    self.learn_peer(params).await;
                } else {
                    tracing::debug!(session = self.id(), %method, "notification");
                }
                None
            }
            Incoming::Response => {
                tracing::debug!(
                    session = self.id(),
                    "ignoring a response to no request of ours"
                );
                None
            }
            Incoming::Invalid { id, error } => {
                tracing::debug!(session = self.id(), %error, "invalid message");
                Some(jsonrpc::error_frame(id, &error).into())
            }
        }
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
        self.withdraw_prompts("the session ended");
        self.broker.changed();
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

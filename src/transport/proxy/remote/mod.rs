//! `fsbroker proxy --url URL`: the server is a remote MCP server behind Streamable HTTP, made
//! to look to the relay like a child's stdin and stdout.
//!
//! The relay (`route`, the eras, the broker side, the budgets) is the child's, unchanged: what
//! it would write to the server's stdin (the host's messages, the broker's answers and
//! notifications, the proxy's retries) arrives here as lines, each sent as one POST; every
//! message the server sends (a JSON response, the events of a POST's stream or of the GET
//! stream) comes back as a line on the stream the relay reads. Failures of the transport (no
//! connection, a 401, a 404 for an expired session, a 413, a stream that ends without the
//! answer) are written there too, as the server's JSON-RPC error for the request concerned, so
//! that every host request gets an answer and nothing else reaches the host.
//!
//! The parts: this file takes the relay's lines and sends them (in order, requests
//! concurrently once sent); `exchange.rs` is one message's POST and what comes back;
//! `session.rs` is the 2025 era's session (its id, its version, the GET stream, the DELETE);
//! `sse.rs` bounds the events; `reads.rs` clamps `files/read` after a 413; `http.rs` is the
//! client (TLS, headers, timeouts, bounded bodies).

mod exchange;
mod http;
mod reads;
mod session;
mod sse;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ::http::header::{HeaderMap, HeaderValue};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::{AbortHandle, JoinSet};

use crate::limits::{
    HOST_GONE_GRACE, OUTPUT_QUEUE, REMOTE_FAILED_KEPT, REMOTE_GOODBYE, REMOTE_IN_FLIGHT_MIN,
    REMOTE_PENDING, REMOTE_POSTS_AT_ONCE, REMOTE_SIDE_STREAMS,
};
use crate::outgoing::Outgoing;
use crate::transport::lenient::RequestId;
use crate::transport::pending::PendingIds;
use crate::transport::relay::{Budget, ToServer};
use exchange::{Failure, Kind, Message};
use http::Http;
use reads::Reads;
use session::Session;

/// A remote MCP server to relay to (`proxy --url`), with the headers every request carries.
///
/// Header values never appear in logs or errors (its `Debug` names the headers only).
///
/// ```
/// use fsbroker::transport::proxy::RemoteOptions;
///
/// let remote = RemoteOptions::new("https://mcp.example.com/mcp")?
///     .header("X-Team", "blue")?
///     .max_chunk(1 << 20);
/// assert_eq!(remote.url(), "https://mcp.example.com/mcp");
/// // The protocol's own headers cannot be replaced.
/// assert!(RemoteOptions::new("https://mcp.example.com/mcp")?.header("Mcp-Session-Id", "x").is_err());
/// # Ok::<(), fsbroker::transport::proxy::RemoteError>(())
/// ```
pub struct RemoteOptions {
    url: url::Url,
    headers: HeaderMap,
    ca_certs: Vec<PathBuf>,
    max_chunk: Option<u64>,
}

impl std::fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("url", &http::shown_url(&self.url))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("ca_certs", &self.ca_certs)
            .field("max_chunk", &self.max_chunk)
            .finish()
    }
}

/// Why a remote server cannot be used as given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The URL is not an `http` or `https` URL.
    #[error("--url {url}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// A header the proxy will not send (its value is never shown).
    #[error("header {name:?}: {reason}")]
    Header {
        /// The header's name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// `--header-env NAME=VAR` names a variable that is not set (or not UTF-8).
    #[error("--header-env {name}={var}: the environment variable {var} is not set (or not UTF-8)")]
    MissingVar {
        /// The header's name.
        name: String,
        /// The variable.
        var: String,
    },
    /// A `--ca-cert` file that cannot be used.
    #[error("--ca-cert {}: {reason}", path.display())]
    CaCert {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// TLS could not be set up.
    #[error("TLS: {0}")]
    Tls(String),
}

impl RemoteOptions {
    /// The server at `url` (`http://` or `https://`; a plain `http` URL to a host other than
    /// loopback is allowed, with a warning: its headers travel in the clear).
    pub fn new(url: &str) -> Result<RemoteOptions, RemoteError> {
        let bad = |reason: &str| RemoteError::Url {
            url: http::shown_given(url),
            reason: reason.to_owned(),
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        match parsed.scheme() {
            "https" => {}
            "http" => {
                let loopback = match parsed.host() {
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    Some(url::Host::Domain(d)) => d == "localhost",
                    None => false,
                };
                if !loopback {
                    tracing::warn!(
                        url = %http::shown_url(&parsed),
                        "plain http to a remote host: the headers (a token) travel in the clear"
                    );
                }
            }
            _ => return Err(bad("only http:// and https:// URLs are supported")),
        }
        if parsed.host().is_none() {
            return Err(bad("no host"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials in the URL are not sent; use --header-env Authorization=VAR",
            ));
        }
        Ok(RemoteOptions {
            url: parsed,
            headers: HeaderMap::new(),
            ca_certs: Vec::new(),
            max_chunk: None,
        })
    }

    /// Adds a header to every request (`--header NAME:VALUE`). Names the protocol sets
    /// (`Content-Type`, `Accept`, `Mcp-Session-Id`, `MCP-Protocol-Version`, `Mcp-Method`,
    /// `Mcp-Name`, `Last-Event-ID`, `Host`, `Content-Length`, `Transfer-Encoding`,
    /// `Connection`) and line breaks are refused.
    pub fn header(mut self, name: &str, value: &str) -> Result<RemoteOptions, RemoteError> {
        let (name, value) = http::user_header(name, value)?;
        self.headers.append(name, value);
        Ok(self)
    }

    /// Adds a header whose value is the environment variable `var`, read now
    /// (`--header-env NAME=VAR`): a secret stays out of the command line.
    pub fn header_from_env(self, name: &str, var: &str) -> Result<RemoteOptions, RemoteError> {
        let value = std::env::var(var).map_err(|_| RemoteError::MissingVar {
            name: name.to_owned(),
            var: var.to_owned(),
        })?;
        self.header(name, &value)
    }

    /// Trusts the certificates of a PEM file (a private CA) besides the system's roots.
    pub fn ca_cert(mut self, path: PathBuf) -> RemoteOptions {
        self.ca_certs.push(path);
        self
    }

    /// Caps the `length` of the server's `files/read` requests (`--max-chunk-size`), so
    /// that the broker's answers fit the server's body limit from the first.
    pub fn max_chunk(mut self, bytes: u64) -> RemoteOptions {
        self.max_chunk = Some(bytes.max(1));
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The server's URL as logs and errors show it: its query and fragment, which may carry a
    /// key (`?api_key=…`), as `?…`.
    pub fn shown_url(&self) -> String {
        http::shown_url(&self.url)
    }
}

/// A remote server connected to the relay: `output` is what the relay reads (the server's
/// messages, one per line; it ends when the connection does); `done` resolves, with how it
/// ended, once the host has gone or the server ended the session, the answers in flight
/// have come (or their grace passed) and the session was ended.
pub(super) struct Connected {
    pub(super) output: DuplexStream,
    pub(super) done: tokio::task::JoinHandle<Ended>,
}

/// How a remote server's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The host left (or the broker stopped), and the session was ended (`DELETE`).
    HostGone,
    /// The server ended the session (a 404 for its `Mcp-Session-Id`). The proxy does not
    /// start another behind the host's back (the host's state of the session, its
    /// subscriptions and log level, would silently be gone): it ends, so that the host
    /// notices and starts it again, with a handshake of its own.
    SessionLost,
}

/// Connects the relay's queue to the server at `opts` (nothing is sent before the relay's
/// first line); messages longer than `max_line` are refused both ways.
pub(super) fn connect(
    opts: RemoteOptions,
    max_line: usize,
    from_relay: mpsc::Receiver<ToServer>,
    ends: Ends,
) -> Result<Connected, RemoteError> {
    let http = Http::new(&opts.url, opts.headers, &opts.ca_certs)?;
    let (output, mut input) = tokio::io::duplex(64 << 10);
    let (inbound, mut lines) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
    // The server's messages, written for the relay by one task: each holds its share of a
    // budget until written, so a relay that stops reading stops the streams being read.
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            if input.write_all(&line.into_vec()).await.is_err() {
                break;
            }
        }
        let _ = input.shutdown().await;
    });
    let remote = Arc::new(Remote {
        http,
        session: Session::default(),
        reads: Mutex::new(Reads::new(opts.max_chunk)),
        ids: Mutex::default(),
        inbound,
        budget: Budget::new(),
        max_line,
        followers: Mutex::default(),
        in_flight: http::InFlight::new((2 * max_line).max(REMOTE_IN_FLIGHT_MIN)),
    });
    let done = tokio::spawn(remote.pump(from_relay, ends));
    Ok(Connected { output, done })
}

/// What every exchange with the server shares.
struct Remote {
    http: Http,
    session: Session,
    reads: Mutex<Reads>,
    /// The host requests sent and not yet answered, and the last ones failed.
    ids: Mutex<Ids>,
    /// The server's messages, as lines for the relay.
    inbound: mpsc::Sender<Outgoing>,
    budget: Budget,
    max_line: usize,
    /// The streams followed beside the pump; ended with the session.
    followers: Mutex<Followers>,
    /// The bytes being read from the server: events not yet whole, bodies not yet ended.
    in_flight: http::InFlight,
}

/// The tasks that follow a stream beside the pump, each holding the session (and so the
/// relay's input open): all ended when the session ends, and none started after, whatever
/// task was still running then. One left behind would keep the proxy after its host.
#[derive(Default)]
struct Followers {
    /// Streams that answer no request of the host's (a notification's, an answer's).
    side: JoinSet<()>,
    /// The session's GET stream.
    get: Option<AbortHandle>,
    ended: bool,
}

/// Why a stream was not followed.
enum NotFollowed {
    /// [`REMOTE_SIDE_STREAMS`] are followed already.
    Full,
    /// The session has ended.
    Ended,
}

impl Followers {
    /// Follows a stream that answers no request, unless there are too many or it is too late.
    fn side(
        &mut self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), NotFollowed> {
        while self.side.try_join_next().is_some() {}
        if self.ended {
            return Err(NotFollowed::Ended);
        }
        if self.side.len() >= REMOTE_SIDE_STREAMS {
            return Err(NotFollowed::Full);
        }
        self.side.spawn(task);
        Ok(())
    }

    /// Follows the session's GET stream in place of the one before it, unless it is too late.
    fn get(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
        if self.ended {
            return false;
        }
        if let Some(old) = self.get.replace(tokio::spawn(task).abort_handle()) {
            old.abort();
        }
        true
    }

    fn end(&mut self) {
        self.ended = true;
        self.side.abort_all();
        if let Some(get) = self.get.take() {
            get.abort();
        }
    }
}

/// The host's requests by [`RequestId`]: one lock for both maps, so that a request leaves
/// `pending` and enters `failed` at once (a late answer cannot pass in between).
struct Ids {
    /// Sent (or waiting for a slot) and not yet answered, at most [`REMOTE_PENDING`].
    pending: PendingIds<Waiting>,
    /// The last answered with the proxy's error (or cancelled by the host), at most
    /// [`REMOTE_FAILED_KEPT`], whose late answers from the server are dropped.
    failed: PendingIds<()>,
}

impl Default for Ids {
    fn default() -> Ids {
        Ids {
            pending: PendingIds::new(REMOTE_PENDING),
            failed: PendingIds::new(REMOTE_FAILED_KEPT),
        }
    }
}

impl Ids {
    fn fail(&mut self, key: RequestId) {
        self.failed.insert(key, ());
    }

    /// A response to `key` came: whether it goes on to the host (not when `key` was failed).
    /// The request waiting for it is settled, and the follower of its own stream woken.
    fn answered(&mut self, key: &RequestId) -> bool {
        if self.failed.contains(key) {
            return false;
        }
        if let Some(waiting) = self.pending.remove(key) {
            waiting.settled.notify_one();
        }
        true
    }
}

/// A host request waiting for its answer.
struct Waiting {
    /// Woken once the request is settled elsewhere (its answer came on another stream), so
    /// that its own stream, which may stay open and silent, is let go.
    settled: Arc<Notify>,
    /// Its task, ended when the host cancels the request (its stream may never end).
    task: Option<AbortHandle>,
}

/// How the proxy's end reaches the pump: `gone` once the host has gone (its EOF, or a stop),
/// `stopping` once the broker is stopping (a signal: less time for goodbyes).
pub(super) struct Ends {
    pub(super) gone: tokio::sync::watch::Receiver<bool>,
    pub(super) stopping: tokio::sync::watch::Receiver<bool>,
    /// When a send waiting in [`Ends::unless_gone`] saw the host go: the grace after it is
    /// one grace, not one for that send and another for the answers still coming.
    pub(super) gone_at: std::sync::OnceLock<tokio::time::Instant>,
}

impl Ends {
    /// Runs `work`, unless the host has gone and [`HOST_GONE_GRACE`] has passed since (a
    /// server that does not answer must not keep the proxy after its host); whether it ran
    /// to its end.
    async fn unless_gone(&self, work: impl std::future::Future<Output = ()>) -> bool {
        let mut gone = self.gone.clone();
        let late = async move {
            if gone.wait_for(|g| *g).await.is_err() {
                std::future::pending::<()>().await;
            }
            let at = *self.gone_at.get_or_init(tokio::time::Instant::now);
            tokio::time::sleep_until(at + HOST_GONE_GRACE).await;
        };
        tokio::select! {
            () = work => true,
            () = late => false,
        }
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }
}

impl Remote {
    /// Sends the relay's lines until the host has gone or the server ended the session, then
    /// says goodbye.
    async fn pump(self: Arc<Self>, mut from_relay: mpsc::Receiver<ToServer>, ends: Ends) -> Ended {
        let mut requests = JoinSet::new();
        let posts = Arc::new(Semaphore::new(REMOTE_POSTS_AT_ONCE));
        let mut ended = Ended::HostGone;
        loop {
            let next = tokio::select! {
                () = self.session.lost() => {
                    ended = Ended::SessionLost;
                    break;
                }
                next = from_relay.recv() => next,
            };
            let Some(ToServer::Frame(frame)) = next else {
                break;
            };
            while requests.try_join_next().is_some() {}
            // The line keeps its share of the relay's budget until it is sent: a host whose
            // requests wait for room here is stopped, as a child that stops reading stops it.
            let (bytes, body, held) = frame.into_parts();
            let mut line = match body {
                Some((at, body)) => Outgoing::with_body(bytes, at, body).into_vec(),
                None => bytes,
            };
            while line.last().is_some_and(|b| b.is_ascii_whitespace()) {
                line.pop();
            }
            if line.is_empty() {
                continue;
            }
            let msg = Message::read(line);
            if let Some(key) = msg.cancels() {
                self.cancelled(&key);
            }
            let key = msg.request_id();
            if let (Some(key), Kind::Request { id, .. }) = (&key, &msg.kind) {
                if !self.expect(key.clone()) {
                    // Answered here, on a task: the pump never waits for the host.
                    let (me, id) = (Arc::clone(&self), id.clone());
                    requests.spawn(async move {
                        let url = Arc::clone(&me.http.url);
                        me.fail(&id, &Failure::TooManyWaiting { url }).await;
                    });
                    continue;
                }
            }
            let sent = match &msg.kind {
                // The session is made here: nothing else goes before it is, and its GET
                // stream is open before the next message (`notifications/initialized`, on
                // which servers ask for roots) is sent.
                Kind::Request { method, .. } if method == "initialize" => {
                    let me = Arc::clone(&self);
                    ends.unless_gone(async {
                        Arc::clone(&me).exchange(msg).await;
                        me.open_get_stream().await;
                    })
                    .await
                }
                // Requests run at once, each on its own connection: one may wait for the
                // host (a tool call asking for roots) while the broker's answer goes out.
                // The pump never waits for room itself: the broker's answers behind a request
                // must not wait for the requests ahead of them (a tool call may be waiting
                // for exactly such an answer).
                Kind::Request { .. } => {
                    let me = Arc::clone(&self);
                    let posts = Arc::clone(&posts);
                    let task = requests.spawn(async move {
                        let Ok(permit) = posts.acquire_owned().await else {
                            return;
                        };
                        drop(held);
                        me.exchange(msg).await;
                        drop(permit);
                    });
                    if let Some(key) = &key {
                        self.track(key, task);
                    }
                    true
                }
                // Notifications and answers are taken at once (202): sent in order, so that
                // `notifications/initialized` precedes the requests after it.
                _ => ends.unless_gone(Arc::clone(&self).exchange(msg)).await,
            };
            if !sent {
                tracing::warn!(
                    "the host has gone and the server is not answering; ending the session"
                );
                break;
            }
        }
        // The host has gone: answers already coming are relayed while it may still read them
        // (less when the broker is stopping), then the session ends. The server that ended
        // the session fails the requests still in flight in moments (each gets the error);
        // one still coming gets the same grace.
        let grace = if ends.stopping() {
            REMOTE_GOODBYE
        } else if ended == Ended::SessionLost {
            HOST_GONE_GRACE
        } else {
            // What is left of the grace a send waiting for the server already began.
            let since = ends
                .gone_at
                .get()
                .map_or(std::time::Duration::ZERO, |at| at.elapsed());
            HOST_GONE_GRACE.saturating_sub(since)
        };
        let _ = tokio::time::timeout(grace, async {
            while requests.join_next().await.is_some() {}
        })
        .await;
        requests.abort_all();
        self.lock_followers().end();
        self.end_session().await;
        ended
    }

    fn lock_followers(&self) -> std::sync::MutexGuard<'_, Followers> {
        self.followers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands one message of the server's to the relay, as one line. Line breaks (which JSON
    /// allows only between tokens: an SSE event may carry pretty-printed JSON) become spaces.
    /// A `files/read` request may have its length clamped; a response answers its request.
    async fn deliver(&self, data: &[u8]) {
        let mut line: Vec<u8> = data
            .iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
            .collect();
        while line.last().is_some_and(|b| b.is_ascii_whitespace()) {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let Some(mut line) = self.read_message(line) else {
            return;
        };
        line.push(b'\n');
        let Some(frame) = self.budget.frame(line).await else {
            return;
        };
        let _ = self.inbound.send(frame).await;
    }

    /// What the proxy learns from a message of the server's on its way to the relay.
    fn read_message(&self, line: Vec<u8>) -> Option<Vec<u8>> {
        #[derive(serde::Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow)]
            id: Option<&'a serde_json::value::RawValue>,
            method: Option<String>,
            #[serde(borrow)]
            params: Option<&'a serde_json::value::RawValue>,
            #[serde(borrow)]
            result: Option<&'a serde_json::value::RawValue>,
        }
        let Ok(env) = serde_json::from_slice::<Envelope>(&line) else {
            return Some(line);
        };
        match (env.id, env.method.as_deref()) {
            (Some(id), Some("files/read")) => {
                let (id, params) = (id.to_owned(), env.params.map(ToOwned::to_owned));
                Some(self.lock_reads().arrived(&id, params.as_deref(), line))
            }
            (Some(id), None) => {
                // An id that is no id (`null`) pairs with no request of the host's.
                if let Some(key) = RequestId::of_raw(id) {
                    let version = env.result.and_then(negotiated_version);
                    if !self.answered(&key, version.as_deref()) {
                        tracing::debug!(id = %key, "a late answer to a request already failed was dropped");
                        return None;
                    }
                }
                Some(self.lock_reads().input_requests(line))
            }
            _ => Some(line),
        }
    }

    /// A response to `key` came: it is no longer waited for (its own stream, if it is still
    /// being followed, is let go); when it answers the session's `initialize`, its
    /// `protocolVersion` is the session's from now on.
    ///
    /// `false` for a request already answered with the proxy's error (its stream broke, say):
    /// it gets no second answer (the host may have reused the id). Checked and settled under
    /// one lock, so that the proxy's error and this answer cannot both go.
    fn answered(&self, key: &RequestId, version: Option<&str>) -> bool {
        if !self.lock_ids().answered(key) {
            return false;
        }
        if let Some(version) = version {
            self.session.negotiated(key, version);
        }
        true
    }

    /// The host's request `key` is about to be sent: its answer is waited for. `false` when
    /// [`REMOTE_PENDING`] others are waiting already: it is not sent.
    fn expect(&self, key: RequestId) -> bool {
        let waiting = Waiting {
            settled: Arc::new(Notify::new()),
            task: None,
        };
        let mut ids = self.lock_ids();
        if !ids.pending.has_room_for(&key) {
            return false;
        }
        ids.pending.insert(key, waiting);
        true
    }

    /// The task sending the host's request `key`, to end should the host cancel it.
    fn track(&self, key: &RequestId, task: AbortHandle) {
        if let Some(waiting) = self.lock_ids().pending.get_mut(key) {
            waiting.task = Some(task);
        }
    }

    /// The host cancelled its request `key`: its task ends (a stream the server never ends
    /// would hold its slot for good), and the server's answer, should it come, is dropped.
    /// The host expects no answer, so none is made.
    fn cancelled(&self, key: &RequestId) {
        let mut ids = self.lock_ids();
        let Some(waiting) = ids.pending.remove(key) else {
            return;
        };
        if let Some(task) = waiting.task {
            task.abort();
        }
        ids.fail(key.clone());
    }

    /// Whether the host's request `key` still waits for its answer.
    fn is_pending(&self, key: &RequestId) -> bool {
        self.lock_ids().pending.contains(key)
    }

    /// What wakes the follower of `key`'s stream once `key` is answered elsewhere.
    fn settled(&self, key: &RequestId) -> Option<Arc<Notify>> {
        let ids = self.lock_ids();
        ids.pending.get(key).map(|w| Arc::clone(&w.settled))
    }

    fn lock_ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_reads(&self) -> std::sync::MutexGuard<'_, Reads> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `result.protocolVersion` of an `initialize` answer.
fn negotiated_version(result: &serde_json::value::RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Init {
        #[serde(rename = "protocolVersion")]
        version: Option<String>,
    }
    serde_json::from_str::<Init>(result.get()).ok()?.version
}

/// A header value the proxy makes from a message's text (a version, a method, a name).
fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

/// For `properties.rs` (through `transport::id_filters`): whether the remote server's filters
/// take ids written `a` and `b` for one, each fed as the pump and `read_message` feed it;
/// `None` where no message with them reaches the filter.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    use serde_json::value::RawValue;
    let raw = |t: &str| RawValue::from_string(t.to_owned()).ok();
    // The host's request (`a`), as the pump reads it.
    let host = Message::read(format!(r#"{{"jsonrpc":"2.0","id":{a},"method":"x"}}"#).into_bytes());
    let key = host.request_id();
    // The server's response (`b`), as `read_message` reads it: `Some(None)` when its id is
    // no id (it is relayed as it is).
    let answer = raw(b).map(|b| RequestId::of_raw(&b));
    let waiting = || Waiting {
        settled: Arc::new(Notify::new()),
        task: None,
    };
    let failed = key.clone().zip(answer.clone()).map(|(key, answer)| {
        let mut ids = Ids::default();
        ids.fail(key);
        answer.is_some_and(|answer| !ids.answered(&answer))
    });
    let pending = key.clone().zip(answer.clone()).map(|(key, answer)| {
        let mut ids = Ids::default();
        ids.pending.insert(key.clone(), waiting());
        if let Some(answer) = answer {
            ids.answered(&answer);
        }
        !ids.pending.contains(&key)
    });
    // The host's cancel (`b`), as the pump reads it.
    let cancel = Message::read(
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{b}}}}}"#
        )
        .into_bytes(),
    );
    let cancelled = key
        .clone()
        .filter(|_| matches!(cancel.kind, Kind::Notification { .. }))
        .map(|key| cancel.cancels() == Some(key));
    // The server's `files/read` (`a`), and the broker's answer (`b`) on its way to the server.
    let reads = raw(a).zip(raw(b)).map(|(a, b)| {
        let mut reads = Reads::new(None);
        reads.arrived(&a, None, Vec::new());
        reads.answered(&b).is_some()
    });
    // The `initialize` (`a`) and a response negotiating a version (`b`).
    let session = key.zip(answer).map(|(key, answer)| {
        let session = Session::default();
        session.begin(Some(&key));
        if let Some(answer) = answer {
            session.negotiated(&answer, "2025-06-18");
        }
        session.is_initialized()
    });
    vec![
        ("remote failed ids", failed),
        ("remote pending ids", pending),
        ("remote cancel", cancelled),
        ("remote reads", reads),
        ("remote session's initialize", session),
    ]
}

//! The era and, in the 2025 era, the session of `proxy --url`: the `Mcp-Session-Id` the
//! `initialize` answer gives, the version it negotiates, the GET stream opened at once, its
//! resumption, the expiry (a 404), and the `DELETE` at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::http::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue};
use ::http::{Method, StatusCode};

use super::exchange::Failure;
use super::sse::Events;
use super::{Remote, header_value};
use crate::limits::{
    REMOTE_CONNECT, REMOTE_GOODBYE, REMOTE_MAX_RETRY, REMOTE_MIN_RETRY, REMOTE_RESUMES,
    REMOTE_RETRY,
};
use crate::transport::lenient::RequestId;

pub(super) const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub(super) const PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
pub(super) const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// The connection's era and its session.
#[derive(Default)]
pub(super) struct Session {
    state: Mutex<State>,
    /// Told once when the server ends the session (a 404): the proxy then ends.
    lost: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// The session's id, once `initialize` was answered with one.
    id: Option<HeaderValue>,
    /// The version `initialize` negotiated.
    version: Option<HeaderValue>,
    /// The id of the `initialize` waiting for its answer.
    init: Option<RequestId>,
    /// The server said the session is gone (404).
    expired: bool,
    /// The 2026-07-28 era's version, while the host's requests declare it.
    modern: Option<HeaderValue>,
}

impl Session {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A host's `initialize` (id `key`): a new session starts, in the 2025 era.
    pub(super) fn begin(&self, key: Option<&RequestId>) {
        *self.state() = State {
            init: key.cloned(),
            ..State::default()
        };
    }

    /// The `initialize` answer's headers came: the session's id, if it has one.
    pub(super) fn established(&self, id: Option<HeaderValue>) {
        let mut state = self.state();
        state.id = id.map(|mut v| {
            // A session id lets whoever holds it act in the session: never in debug output.
            v.set_sensitive(true);
            v
        });
    }

    /// The answer to `key` negotiated `version`; it counts when `key` is the `initialize`'s.
    pub(super) fn negotiated(&self, key: &RequestId, version: &str) {
        let mut state = self.state();
        if state.init.as_ref() == Some(key) {
            state.init = None;
            state.version = header_value(version);
        }
    }

    /// A host request declared `version` (2026-07-28 or later), or none (the 2025 era).
    pub(super) fn set_modern(&self, version: Option<HeaderValue>) {
        self.state().modern = version;
    }

    /// Whether the host speaks the 2026-07-28 era now.
    pub(super) fn is_modern(&self) -> bool {
        self.state().modern.is_some()
    }

    /// Marks the session gone; whether it was not already.
    pub(super) fn expire(&self) -> bool {
        let first = !std::mem::replace(&mut self.state().expired, true);
        if first {
            // Kept for the pump should it not be waiting now.
            self.lost.notify_one();
        }
        first
    }

    /// Resolves once the server has ended the session.
    pub(super) async fn lost(&self) {
        self.lost.notified().await;
    }

    /// Whether the server said the session is gone.
    pub(super) fn expired(&self) -> bool {
        self.state().expired
    }

    /// Whether `initialize` was answered (a version negotiated).
    pub(super) fn is_initialized(&self) -> bool {
        self.state().version.is_some()
    }

    /// Whether a session id is sent.
    pub(super) fn has_id(&self) -> bool {
        self.state().id.is_some()
    }

    /// The headers of the era on a request that is not the `initialize`: the session's id
    /// and version (2025), or the declared version (2026-07-28; its method headers are the
    /// message's, added by the caller).
    pub(super) fn headers(&self, into: &mut HeaderMap) {
        let state = self.state();
        if let Some(version) = &state.modern {
            into.insert(PROTOCOL_VERSION, version.clone());
            return;
        }
        if let Some(id) = &state.id {
            into.insert(SESSION_ID, id.clone());
        }
        if let Some(version) = &state.version {
            into.insert(PROTOCOL_VERSION, version.clone());
        }
    }
}

impl Remote {
    /// Opens the session's GET stream (the server's requests and notifications outside any
    /// POST), and follows it beside the pump, in place of any before it. Waits for its
    /// headers, so that the server's requests on the next message (roots, on
    /// `notifications/initialized`) have a stream to come on, but at most [`REMOTE_CONNECT`]:
    /// a server that never sends them must not hold up the session (the task goes on
    /// waiting, until the session ends). None in the 2026-07-28 era, which has no GET stream.
    pub(super) async fn open_get_stream(self: Arc<Self>) {
        if self.session.is_modern() || self.session.expired() || !self.session.is_initialized() {
            return;
        }
        let (opened, head) = tokio::sync::oneshot::channel();
        let follow = Arc::clone(&self).follow_get(opened);
        if self.lock_followers().get(follow) {
            let _ = tokio::time::timeout(REMOTE_CONNECT, head).await;
        }
    }

    /// Opens and follows the GET stream (`opened` once its first GET is answered, however),
    /// resuming it when it drops (with `Last-Event-ID` when its events had ids), at most
    /// [`REMOTE_RESUMES`] times in a row without an event between.
    async fn follow_get(self: Arc<Self>, opened: tokio::sync::oneshot::Sender<()>) {
        let mut events = match self.get(None).await {
            Ok(Some(events)) => Some(events),
            Ok(None) => {
                tracing::info!(url = %self.http.url, "the server offers no GET stream (405); its requests come on the POST streams");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the GET stream could not be opened; trying again");
                None
            }
        };
        let _ = opened.send(());
        let mut last: Option<String> = None;
        let mut retry = REMOTE_RETRY;
        let mut attempts = 0;
        loop {
            if let Some(stream) = events.as_mut() {
                match self.follow(stream, None, None, &mut last, &mut retry).await {
                    Ok(got) if got => attempts = 0,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %self.stream_failure(e), "the GET stream broke off");
                    }
                }
            }
            attempts += 1;
            if attempts > REMOTE_RESUMES || self.session.expired() {
                tracing::warn!(url = %self.http.url, "the GET stream is gone; the server's requests outside a POST will not arrive");
                return;
            }
            tokio::time::sleep(retry).await;
            events = match self.get(last.as_deref()).await {
                Ok(Some(events)) => Some(events),
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(error = %e, "the GET stream could not be resumed");
                    None
                }
            };
        }
    }

    /// A GET of the endpoint (the GET stream, or a POST's stream resumed after `last`):
    /// `None` when the server answers 405.
    pub(super) async fn get(&self, last: Option<&str>) -> Result<Option<Events>, Failure> {
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        self.session.headers(&mut headers);
        if let Some(value) = last.and_then(header_value) {
            headers.insert(LAST_EVENT_ID, value);
        }
        let sent_id = headers.contains_key(SESSION_ID);
        let response = self
            .http
            .send(Method::GET, headers, bytes::Bytes::new())
            .await?;
        match response.status() {
            StatusCode::METHOD_NOT_ALLOWED => Ok(None),
            StatusCode::NOT_FOUND if sent_id => {
                self.session_gone();
                Err(Failure::Expired {
                    url: Arc::clone(&self.http.url),
                })
            }
            s if s.is_success() && is_event_stream(response.headers()) => {
                Ok(Some(self.events(response.into_body())))
            }
            _ => Err(self.refusal(response).await),
        }
    }

    /// Logs, once, that the server no longer knows the session.
    pub(super) fn session_gone(&self) {
        if self.session.expire() {
            tracing::error!(url = %self.http.url, "the server ended the session (HTTP 404 for its Mcp-Session-Id): it expired or the server restarted; the proxy ends, so that the host starts it again for a new session");
        }
    }

    /// Ends the session (`DELETE`), within [`REMOTE_GOODBYE`].
    pub(super) async fn end_session(&self) {
        if self.session.is_modern() || self.session.expired() || !self.session.has_id() {
            return;
        }
        let mut headers = HeaderMap::new();
        self.session.headers(&mut headers);
        let sent = tokio::time::timeout(
            REMOTE_GOODBYE,
            self.http.send(Method::DELETE, headers, bytes::Bytes::new()),
        )
        .await;
        match sent {
            Ok(Ok(response)) => {
                tracing::debug!(status = %response.status(), "the session was ended (DELETE)");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "the session's DELETE failed"),
            Err(_) => tracing::debug!("the session's DELETE got no answer in time"),
        }
    }
}

/// Whether a response is an event stream.
pub(super) fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        })
}

/// The wait a server's `retry:` asks for, within bounds.
pub(super) fn retry_after(ms: u64) -> Duration {
    Duration::from_millis(ms).clamp(REMOTE_MIN_RETRY, REMOTE_MAX_RETRY)
}

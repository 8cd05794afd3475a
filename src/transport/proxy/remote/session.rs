//! The era and, in the 2025 era, the session of `proxy --url`: the `Mcp-Session-Id` the
//! `initialize` answer gives, the version it negotiates, and its expiry (a 404); the headers
//! that carry them, and the waits a server's `retry:` may ask for. (The session's GET stream
//! is `streams.rs`'s, its `DELETE` `pump.rs`'s.)

use std::sync::Mutex;
use std::time::Duration;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};

use super::header_value;
use crate::limits::{REMOTE_MAX_RETRY, REMOTE_MIN_RETRY};
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

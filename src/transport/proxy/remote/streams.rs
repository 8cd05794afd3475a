//! The server's event streams, read: a response's events, bounded; a stream followed until it
//! ends or a request is answered; a GET, to resume a stream after its last event or to open
//! the session's own GET stream (2025 era), which is followed beside the pump, resumed when
//! it drops, and gone with the session (a 404 ends it). The streams followed beside the pump
//! (the GET stream, and those that answer no request of the host's) are kept in
//! [`Followers`], and end with the session.

use std::sync::Arc;
use std::time::Duration;

use ::http::header::{ACCEPT, HeaderMap, HeaderValue};
use ::http::{Method, StatusCode};
use hyper::body::Incoming;
use tokio::sync::Notify;
use tokio::task::{AbortHandle, JoinSet};

use super::failure::Failure;
use super::session::{LAST_EVENT_ID, SESSION_ID, is_event_stream, retry_after};
use super::sse::{Events, StreamError};
use super::{Remote, header_value};
use crate::limits::{REMOTE_CONNECT, REMOTE_RESUMES, REMOTE_RETRY, REMOTE_SIDE_STREAMS};
use crate::transport::lenient::RequestId;

/// The tasks that follow a stream beside the pump, each holding the session (and so the
/// relay's input open): all ended when the session ends, and none started after, whatever
/// task was still running then. One left behind would keep the proxy after its host.
#[derive(Default)]
pub(super) struct Followers {
    /// Streams that answer no request of the host's (a notification's, an answer's).
    side: JoinSet<()>,
    /// The session's GET stream.
    get: Option<AbortHandle>,
    ended: bool,
}

/// Why a stream was not followed.
pub(super) enum NotFollowed {
    /// [`REMOTE_SIDE_STREAMS`] are followed already.
    Full,
    /// The session has ended.
    Ended,
}

impl Followers {
    /// Follows a stream that answers no request, unless there are too many or it is too late.
    pub(super) fn side(
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
    pub(super) fn get(
        &mut self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        if self.ended {
            return false;
        }
        if let Some(old) = self.get.replace(tokio::spawn(task).abort_handle()) {
            old.abort();
        }
        true
    }

    pub(super) fn end(&mut self) {
        self.ended = true;
        self.side.abort_all();
        if let Some(get) = self.get.take() {
            get.abort();
        }
    }
}

impl Remote {
    pub(super) fn lock_followers(&self) -> std::sync::MutexGuard<'_, Followers> {
        self.followers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The events of a response body, bounded by `max_line` and the bytes in flight.
    pub(super) fn events(&self, body: Incoming) -> Events {
        Events::new(
            body,
            self.max_line,
            Arc::clone(&self.in_flight.bytes),
            self.in_flight.size,
        )
    }
    /// Relays a stream's events until it ends, or until `key` is answered (on this stream, or
    /// on another: `settled` wakes it then). Keeps the last event id and the server's
    /// `retry:`; says whether any message came.
    pub(super) async fn follow(
        &self,
        events: &mut Events,
        key: Option<&RequestId>,
        settled: Option<&Notify>,
        last: &mut Option<String>,
        retry: &mut Duration,
    ) -> Result<bool, StreamError> {
        let mut got = false;
        loop {
            let next = match settled {
                // Only the wait for the next event is given up, never a message half
                // delivered.
                Some(settled) => tokio::select! {
                    next = events.next() => next,
                    () = settled.notified() => {
                        if key.is_some_and(|k| !self.is_pending(k)) {
                            return Ok(got);
                        }
                        continue;
                    }
                },
                None => events.next().await,
            };
            let Some(event) = next else {
                return Ok(got);
            };
            let event = event?;
            if let Some(id) = event.id {
                *last = Some(id).filter(|i| !i.is_empty());
            }
            if let Some(ms) = event.retry {
                *retry = retry_after(ms);
            }
            if event.event.as_deref().is_some_and(|e| e != "message") {
                continue;
            }
            let Some(data) = event.data.filter(|d| !d.trim().is_empty()) else {
                continue;
            };
            got = true;
            self.deliver(data.as_bytes()).await;
            if key.is_some_and(|k| !self.is_pending(k)) {
                return Ok(got);
            }
        }
    }
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
}

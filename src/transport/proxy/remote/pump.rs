//! The send loop: the relay's lines, each sent as one POST in the order they came (the host's
//! requests each on a task of its own once sent), until the host has gone or the server ended
//! the session; then the answers still coming, and the goodbye (the `DELETE`).

use std::sync::Arc;

use ::http::Method;
use ::http::header::HeaderMap;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::exchange::{Kind, Message};
use super::failure::Failure;
use super::{Ended, Remote};
use crate::limits::{HOST_GONE_GRACE, REMOTE_GOODBYE, REMOTE_POSTS_AT_ONCE};
use crate::outgoing::Outgoing;
use crate::transport::relay::ToServer;

/// How the proxy's end reaches the pump: `gone` once the host has gone (its EOF, or a stop),
/// `stopping` once the broker is stopping (a signal: less time for goodbyes).
pub(in crate::transport::proxy) struct Ends {
    pub(in crate::transport::proxy) gone: tokio::sync::watch::Receiver<bool>,
    pub(in crate::transport::proxy) stopping: tokio::sync::watch::Receiver<bool>,
    /// When a send waiting in [`Ends::unless_gone`] saw the host go: the grace after it is
    /// one grace, not one for that send and another for the answers still coming.
    pub(in crate::transport::proxy) gone_at: std::sync::OnceLock<tokio::time::Instant>,
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
    pub(super) async fn pump(
        self: Arc<Self>,
        mut from_relay: mpsc::Receiver<ToServer>,
        ends: Ends,
    ) -> Ended {
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

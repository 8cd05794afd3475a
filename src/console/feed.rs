//! `GET /api/events`: Server-Sent Events for the page. The stream opens with a `retry` field
//! (how soon to reopen it), then:
//!
//! - `state` (`{}`): sessions, prompts, grants or roots changed ([`Broker::changes`]), or a
//!   sign-in of the proxy's ([`SignIns::changes`]); the page reads `/api/state` again.
//! - `activity`: one answered request as the audit log records it ([`Broker::events`]: the
//!   same members, redacted the same way), or one of the person's acts. Successful reads and
//!   writes of one path by one session in a row are merged, and sent at most every
//!   [`FLUSH`], with `count` and the summed `bytes`: a 1 GiB read in 1 MiB chunks is a few
//!   records, not a thousand. A record of a session carries its number, `order`
//!   ([`super::api::Order`]), for the page to name it by.
//! - `lost` (`{"count":N}`): the page fell more than the broker's backlog behind, and N
//!   records were dropped.
//!
//! [`Broker::changes`]: fsbroker::Broker::changes
//! [`Broker::events`]: fsbroker::Broker::events
//! [`SignIns::changes`]: fsbroker::transport::proxy::SignIns::changes

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use tokio::sync::broadcast::error::RecvError;

use super::Shared;

/// How long merged records wait before they are sent: well inside the 500 ms in which an
/// operation should show in the feed.
const FLUSH: Duration = Duration::from_millis(250);

/// How soon a browser reopens a dropped stream (the SSE `retry` field, sent first).
const RETRY: Duration = Duration::from_secs(2);

/// `GET /api/events`.
pub(crate) async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let feed = Feed {
        shared: Arc::clone(&shared),
        changes: shared.broker.changes(),
        sign_ins: Some(shared.sign_ins.changes()),
        events: shared.broker.events(),
        pending: None,
        out: VecDeque::new(),
        tick: tokio::time::interval(FLUSH),
    };
    let stream = futures_util::stream::unfold(feed, |mut feed| async move {
        let next = feed.next().await;
        Some((Ok(next), feed))
    });
    // Something at once: the response's head goes out with its first bytes, and Firefox opens
    // an EventSource (and the page shows "live") only then. Without it, a quiet broker's page
    // waited for the first keep-alive, 15 s. The field itself sets how soon a dropped stream
    // is reopened.
    let first = futures_util::stream::once(async { Ok(Event::default().retry(RETRY)) });
    Sse::new(first.chain(stream)).keep_alive(KeepAlive::default())
}

/// One page's feed.
struct Feed {
    /// For the sessions' numbers ([`super::api::Order`]), which every record carries as
    /// `order`.
    shared: Arc<Shared>,
    changes: tokio::sync::watch::Receiver<u64>,
    /// The sign-ins' board; `None` once it is gone (it lives as long as the console).
    sign_ins: Option<tokio::sync::watch::Receiver<u64>>,
    events: tokio::sync::broadcast::Receiver<fsbroker::Event>,
    /// Records being merged, not yet sent.
    pending: Option<Merged>,
    /// Ready to send, oldest first.
    out: VecDeque<Event>,
    tick: tokio::time::Interval,
}

/// Successful transfers of one path by one session, in a row.
struct Merged {
    key: (Value, Value, Value),
    fields: Map<String, Value>,
    count: u64,
    bytes: u64,
}

impl Feed {
    async fn next(&mut self) -> Event {
        loop {
            if let Some(e) = self.out.pop_front() {
                return e;
            }
            tokio::select! {
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        // The broker is gone; nothing more will come.
                        std::future::pending::<()>().await;
                    }
                    self.changes.borrow_and_update();
                    self.out.push_back(Event::default().event("state").data("{}"));
                }
                seen = board_changed(&mut self.sign_ins), if self.sign_ins.is_some() => {
                    if seen {
                        self.out.push_back(Event::default().event("state").data("{}"));
                    } else {
                        // Without its board, the feed still carries the broker's changes.
                        self.sign_ins = None;
                    }
                }
                got = self.events.recv() => match got {
                    Ok(event) => {
                        let fields = self.numbered(&event);
                        self.take(fields)
                    }
                    Err(RecvError::Lagged(n)) => {
                        self.flush();
                        self.out.push_back(
                            Event::default().event("lost").data(format!("{{\"count\":{n}}}")),
                        );
                    }
                    Err(RecvError::Closed) => std::future::pending::<()>().await,
                },
                _ = self.tick.tick() => self.flush(),
            }
        }
    }

    /// A record's members, with its session's number (`order`) when it has one.
    fn numbered(&self, event: &fsbroker::Event) -> Map<String, Value> {
        let mut fields = event.fields().clone();
        let session = fields.get("session").and_then(Value::as_u64);
        if let Some(n) = session.and_then(|id| self.shared.order.of(&self.shared.broker, id)) {
            fields.insert("order".into(), Value::from(n));
        }
        fields
    }

    /// Takes one record: merged with the ones before it, or sent as it is.
    fn take(&mut self, fields: Map<String, Value>) {
        let get = |k: &str| fields.get(k).cloned().unwrap_or(Value::Null);
        let method = fields.get("method").and_then(Value::as_str);
        let mergeable = matches!(method, Some("files/read" | "files/write"))
            && fields.get("outcome").and_then(Value::as_str) == Some("ok")
            && !fields.contains_key("account");
        if !mergeable {
            self.flush();
            self.out.push_back(activity(fields, 1, None));
            return;
        }
        let path = if fields.contains_key("pathSha256") {
            get("pathSha256")
        } else {
            get("path")
        };
        let key = (get("session"), get("method"), path);
        let bytes = fields.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        match &mut self.pending {
            Some(m) if m.key == key => {
                m.count += 1;
                m.bytes += bytes;
                m.fields.insert("ts".into(), get("ts"));
            }
            _ => {
                self.flush();
                let ts = get("ts");
                let mut first = fields;
                first.insert("firstTs".into(), ts);
                self.pending = Some(Merged {
                    key,
                    fields: first,
                    count: 1,
                    bytes,
                });
            }
        }
    }

    /// Sends what is being merged.
    fn flush(&mut self) {
        if let Some(m) = self.pending.take() {
            self.out
                .push_back(activity(m.fields, m.count, Some(m.bytes)));
        }
    }
}

/// Waits for the sign-ins' next change (or the first one not seen yet), and marks it seen;
/// false when the board is gone.
async fn board_changed(board: &mut Option<tokio::sync::watch::Receiver<u64>>) -> bool {
    match board {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    }
}

/// An `activity` event: the record's members, with `count` (and the summed `bytes`).
fn activity(mut fields: Map<String, Value>, count: u64, bytes: Option<u64>) -> Event {
    fields.insert("count".into(), Value::from(count));
    if let Some(b) = bytes {
        fields.insert("bytes".into(), Value::from(b));
    }
    Event::default()
        .event("activity")
        .data(Value::Object(fields).to_string())
}

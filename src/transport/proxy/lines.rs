//! The relay of lines, each way: host → server (`initialize` and the 2026-07-28 era's
//! requests rewritten to declare roots), and server → host, where every line first passes
//! one gate, [`route`], that keeps the broker's requests, in any form a lenient host might
//! read, away from the host.
//!
//! Each direction is one loop that reads a line, decides, and queues it in a bounded budget:
//! the order of lines per direction is kept, and a side that stops reading stalls the other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::broker::BrokerSide;
use crate::jsonrpc::{self, Incoming};
use crate::limits::TAKEN_IDS;
use crate::outgoing::Outgoing;
use crate::transport::eras::{Eras, Outputs};
use crate::transport::framing::{Frame, LineReader};
use crate::transport::lenient::{self, RequestId};
use crate::transport::pending::PendingIds;
use crate::transport::relay::{Budget, ToServer};
use crate::transport::serve::too_long;

/// Host → server: verbatim, except `initialize` (2025 era) and the client capabilities of
/// every request of the 2026-07-28 era ([`Eras::host_request`]).
pub(super) async fn relay_host<R: AsyncRead + Unpin>(
    input: R,
    to_server: mpsc::Sender<ToServer>,
    to_host: mpsc::Sender<Outgoing>,
    init: Arc<Init>,
    eras: Arc<Eras>,
    budget: Budget,
    max: usize,
) {
    let mut reader = LineReader::new(input, max);
    while let Ok(Some(frame)) = reader.next_frame().await {
        let line = match frame {
            Frame::Line(line) => line,
            // The proxy's readers have no shared budget, so they never refuse a line.
            Frame::Refused { .. } => continue,
            Frame::TooLong { len } => {
                // Answer the host as a server would, so it does not wait for nothing.
                tracing::warn!(len, "an over-long line from the host was not relayed");
                let _ = to_host.send(too_long(len, max).into()).await;
                continue;
            }
        };
        let mut initialize = false;
        let line = match jsonrpc::parse(&line) {
            Incoming::Request { id, method, .. } if method == "initialize" => {
                init.asked(id.to_owned());
                initialize = true;
                eras.set_modern(false).await;
                declare_brokering(&line).unwrap_or(line)
            }
            Incoming::Request { id, method, .. } => {
                let id = id.to_owned();
                eras.host_request(line, &id, &method).await
            }
            Incoming::Notification { method, .. } if method == "notifications/cancelled" => {
                eras.cancelled(line)
            }
            _ => line,
        };
        let mut framed = line;
        framed.push(b'\n');
        let Some(frame) = budget.frame(framed).await else {
            break;
        };
        if to_server.send(ToServer::Frame(frame)).await.is_err() {
            break;
        }
        if initialize {
            init.relayed.send_replace(true);
        }
    }
}

/// The host's `initialize` (2025 era) on its way to the server and back: its id until the
/// server answers it (the answer names the server; a server that never answers leaves the
/// host an error from the proxy instead, `start.rs`).
#[derive(Default)]
pub(super) struct Init {
    ids: Mutex<InitIds>,
    /// Set once the host's first `initialize` was queued for the server.
    pub(super) relayed: tokio::sync::watch::Sender<bool>,
}

#[derive(Default)]
struct InitIds {
    /// The host's `initialize` the server has not answered.
    pending: Option<Box<RawValue>>,
    /// The one the proxy answered itself (the start timed out): the server's late answer
    /// would be a second answer to it, and is not relayed.
    failed: Option<Box<RawValue>>,
}

/// What the relay does with a response of the server's.
enum Answer {
    /// The answer to the host's pending `initialize`: relayed, and its result read.
    Initialize,
    /// The answer to the `initialize` the proxy already answered: dropped.
    Late,
    /// Any other response: relayed.
    Other,
}

impl Init {
    fn ids(&self) -> std::sync::MutexGuard<'_, InitIds> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The host sent `initialize` with `id`.
    fn asked(&self, id: Box<RawValue>) {
        self.ids().pending = Some(id);
    }

    /// The `initialize` still waiting for the server's answer, taken: the caller answers it.
    pub(super) fn take_pending(&self) -> Option<Box<RawValue>> {
        self.ids().pending.take()
    }

    /// [`Init::take_pending`], remembering the id so that the server's late answer is dropped.
    pub(super) fn fail(&self) -> Option<Box<RawValue>> {
        let mut ids = self.ids();
        let id = ids.pending.take()?;
        ids.failed = Some(id.clone());
        Some(id)
    }

    /// Whether the proxy answered the host's `initialize` itself.
    pub(super) fn failed(&self) -> bool {
        self.ids().failed.is_some()
    }

    /// Resolves once the host's first `initialize` was queued for the server (never, if the
    /// host sends none).
    pub(super) async fn wait_relayed(&self) {
        let mut relayed = self.relayed.subscribe();
        if relayed.wait_for(|r| *r).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether a response of the server's may be the answer to an `initialize`: once it is
    /// answered, responses (a tool's result may be megabytes) are not parsed for it.
    fn awaited(&self) -> bool {
        let ids = self.ids();
        ids.pending.is_some() || ids.failed.is_some()
    }

    /// What a response of the server's with `id` is to the host's `initialize` (the same
    /// [`RequestId`], however the server spelled it: the host takes it so).
    fn answer(&self, id: &RawValue) -> Answer {
        let mut ids = self.ids();
        if ids.pending.as_deref().is_some_and(|p| same_id(p, id)) {
            // Only the one answer matters; later responses are not parsed.
            ids.pending = None;
            Answer::Initialize
        } else if ids.failed.as_deref().is_some_and(|f| same_id(f, id)) {
            Answer::Late
        } else {
            Answer::Other
        }
    }
}

impl Init {
    /// A line no strict reader takes (a batch, an id written twice, a member no parser
    /// reads) that a host's reader may still take for the answer to its `initialize`: read as
    /// the host may read it ([`lenient::any_message`]). Whether it is relayed. Not when it may
    /// answer the `initialize` the proxy answered already (the host would get two answers),
    /// nor when its id reads two ways and one is the pending `initialize`'s (the proxy cannot
    /// tell whether the host takes it for the answer; the start's time limit answers instead).
    /// One that answers the pending one settles it: the host has its answer.
    fn irregular_answer(&self, line: &[u8]) -> bool {
        let mut ids = self.ids();
        let is = |raw: &Option<Box<RawValue>>, key: &RequestId| {
            raw.as_deref()
                .and_then(RequestId::of_raw)
                .is_some_and(|id| &id == key)
        };
        let mut settles = false;
        let refused = lenient::any_message(line, |env| {
            if !env.may_answer() {
                return false;
            }
            let pending = env.ids.iter().any(|k| is(&ids.pending, k));
            let failed = env.ids.iter().any(|k| is(&ids.failed, k));
            settles |= pending;
            failed || (pending && env.ids.len() > 1)
        });
        if refused {
            return false;
        }
        if settles {
            ids.pending = None;
        }
        true
    }
}

/// `initialize` with `params.capabilities.roots` declaring brokering (other capabilities, and
/// other members of `roots`, untouched). Members are kept as raw JSON, so numbers and
/// strings pass through exactly as the host wrote them; only the order of the members of the
/// message, of `params` and of `capabilities` may change.
fn declare_brokering(line: &[u8]) -> Option<Vec<u8>> {
    type Members = BTreeMap<String, Box<RawValue>>;
    fn raw<T: serde::Serialize>(v: &T) -> Option<Box<RawValue>> {
        serde_json::value::to_raw_value(v).ok()
    }
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params: Members = match msg.get("params") {
        Some(p) => serde_json::from_str(p.get()).ok()?,
        None => Members::new(),
    };
    let mut caps: Members = match params.get("capabilities") {
        Some(c) => serde_json::from_str(c.get()).ok()?,
        None => Members::new(),
    };
    let mut roots: serde_json::Map<String, Value> = caps
        .get("roots")
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default();
    roots.insert("listChanged".into(), Value::Bool(true));
    roots.insert("filesystemBrokering".into(), Value::Bool(true));
    caps.insert("roots".into(), raw(&roots)?);
    params.insert("capabilities".into(), raw(&caps)?);
    msg.insert("params".into(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// Where the server's messages go, and what the relay knows of the eras.
pub(super) struct Relay {
    pub(super) out: Outputs,
    pub(super) eras: Arc<Eras>,
}

/// Server → host: verbatim, except what [`route`] keeps away from the host (the broker's
/// requests, any other line whose method a lenient reader takes for the broker's or the
/// proxy's own), the lines the proxy cannot classify (the host could read a `roots/list`
/// request into them: they are answered with an error, or dropped), and (2026-07-28 era) what
/// [`Eras::server_message`] takes over.
pub(super) async fn relay_server<R: AsyncRead + Unpin>(
    output: R,
    relay: &Relay,
    broker: &mut BrokerSide,
    init: &Init,
    max: usize,
) {
    let to_host = &relay.out.to_host;
    let budget = Budget::new();
    let mut taken = TakenIds::new();
    let mut reader = LineReader::new(output, max);
    while let Ok(Some(frame)) = reader.next_frame().await {
        let line = match frame {
            Frame::Line(line) => line,
            Frame::Refused { .. } => continue,
            Frame::TooLong { len } => {
                tracing::warn!(len, "an over-long line from the server was not relayed");
                broker.answer(too_long(len, max).into()).await;
                continue;
            }
        };
        let mut line = match route(line) {
            Route::Relay(line) => line,
            Route::Broker(line) => {
                taken.note(&line);
                broker.request(line).await;
                continue;
            }
            Route::Refused { ids, why, len } => {
                tracing::warn!(len, why, "a line from the server was not relayed");
                let err = crate::error::Error::new(
                    crate::error::ErrorKind::InvalidRequest,
                    format!("fsbroker: {why}"),
                );
                for id in ids {
                    broker
                        .answer(jsonrpc::error_frame(Some(&id), &err).into())
                        .await;
                }
                continue;
            }
        };
        match jsonrpc::parse(&line) {
            // Every response is looked at: the one to `initialize` names the server.
            Incoming::Response if !learn_server_name(&line, init, broker) => {
                tracing::warn!(
                    "the server answered initialize after the proxy had answered it; not relayed"
                );
                continue;
            }
            Incoming::Invalid { .. } if init.awaited() && !init.irregular_answer(&line) => {
                tracing::warn!(
                    "the server answered initialize in a form the proxy cannot pair with it \
                     (in a batch, or with its id written twice) after the proxy had answered \
                     it, or ambiguously; not relayed"
                );
                continue;
            }
            Incoming::Notification { method, params }
                if method == "notifications/cancelled" && taken.cancels(params) =>
            {
                // The server gives up on a request the broker took (it timed out on its
                // side): the host never saw that request, and its cancellation is not the
                // host's either.
                tracing::debug!("the server cancelled a request the broker took; not relayed");
                continue;
            }
            _ => {}
        }
        match relay.eras.server_message(line, &relay.out).await {
            Some(passed) => line = passed,
            None => continue,
        }
        line.push(b'\n');
        let Some(frame) = budget.frame(line).await else {
            break;
        };
        if to_host.send(frame).await.is_err() {
            break;
        }
    }
}

/// The ids of the server's latest requests the broker took (the last [`TAKEN_IDS`]), so
/// that the server's `notifications/cancelled` for them, however it spells the id, stays away
/// from the host.
struct TakenIds(PendingIds<()>);

impl TakenIds {
    fn new() -> TakenIds {
        TakenIds(PendingIds::new(TAKEN_IDS))
    }

    fn note(&mut self, line: &[u8]) {
        let Incoming::Request { id, .. } = jsonrpc::parse(line) else {
            return;
        };
        if let Some(id) = RequestId::of_raw(id) {
            self.0.insert(id, ());
        }
    }

    /// Whether a `notifications/cancelled` with `params` names one of these requests.
    fn cancels(&self, params: Option<&RawValue>) -> bool {
        #[derive(serde::Deserialize)]
        struct Cancelled<'a> {
            #[serde(rename = "requestId", borrow)]
            request_id: &'a RawValue,
        }
        params
            .and_then(|p| serde_json::from_str::<Cancelled>(p.get()).ok())
            .and_then(|c| RequestId::of_raw(c.request_id))
            .is_some_and(|id| self.0.contains(&id))
    }
}

/// Whether two ids as written are one [`RequestId`].
fn same_id(a: &RawValue, b: &RawValue) -> bool {
    RequestId::of_raw(a).is_some_and(|a| RequestId::of_raw(b) == Some(a))
}

/// Where a line from the server goes.
enum Route {
    /// On towards the host (through [`Eras::server_message`], which reads what it carries).
    Relay(Vec<u8>),
    /// A request for the broker: it answers the server.
    Broker(Vec<u8>),
    /// Neither: the server's ids that can be echoed get an error; the line goes nowhere.
    Refused {
        ids: Vec<Box<RawValue>>,
        why: &'static str,
        len: usize,
    },
}

/// The one decision of where a server's line goes, made on every line before anything else
/// reads it (the rest of the relay gets the line only back from here).
///
/// A line is the broker's when any message in it has a `method` that any lenient reading
/// takes for `roots/list` or `files/…` ([`lenient::message_methods`]: escapes decoded, every
/// `method` member counted, batches and broken JSON scanned). The broker gets it when it is
/// also a sound request ([`jsonrpc::parse`], the broker's own reader); any other form (an id
/// that is an array or a fraction, no `jsonrpc`, params of the wrong type, a notification,
/// `method` twice, a batch, bytes or JSON no parser reads) is refused: a host that reads it
/// loosely would answer it with its own roots. The same holds for a `method` under
/// `notifications/fsbroker/`: those are the proxy's own words to a shared broker (the
/// server's name, its era, its confinement, recorded in the audit log), never the server's,
/// so they reach neither the broker nor the host. Lines naming such a method elsewhere (a
/// result's content) go on to [`Eras::server_message`], which passes them as written when
/// they read one way only, and refuses them otherwise.
fn route(line: Vec<u8>) -> Route {
    let claims = lenient::message_methods(&line);
    if !claims.broker && !claims.control {
        return Route::Relay(line);
    }
    let why = if claims.control {
        "notifications/fsbroker/* are the proxy's own messages; the server's are not relayed"
    } else {
        match jsonrpc::parse(&line) {
            Incoming::Request { method, .. } if lenient::is_broker_method(&method) => {
                return Route::Broker(line);
            }
            _ => {
                "a message naming roots/list or files/* that is not a sound request is not relayed"
            }
        }
    };
    // Whatever ids its top level carries, if the server can match them: strings and
    // numbers (a fraction too), each once, and a few.
    let (ids, _) = lenient::lenient_envelope(&line);
    let ids = ids
        .iter()
        .filter_map(|id| RawValue::from_string(id.to_string()).ok())
        .collect();
    Route::Refused {
        ids,
        why,
        len: line.len(),
    }
}

/// The `initialize` result names the server; consent prompts show it. Whether the response
/// is relayed: not when it answers an `initialize` the proxy already answered.
fn learn_server_name(line: &[u8], init: &Init, broker: &mut BrokerSide) -> bool {
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
    }
    #[derive(serde::Deserialize)]
    struct Reply {
        result: Option<Value>,
    }
    if !init.awaited() {
        return true;
    }
    let Ok(reply) = serde_json::from_slice::<Id>(line) else {
        return true;
    };
    match init.answer(reply.id) {
        Answer::Other => return true,
        Answer::Late => return false,
        Answer::Initialize => {}
    }
    if let Some(name) = serde_json::from_slice::<Reply>(line)
        .ok()
        .and_then(|r| r.result)
        .as_ref()
        .and_then(|r| r.pointer("/serverInfo/name"))
        .and_then(Value::as_str)
    {
        broker.name_server(name);
    }
    true
}

/// For `properties.rs` (through `transport::id_filters`): whether this file's filters take
/// ids written `a` and `b` for one, each fed as the relay feeds it; `None` where no message
/// with them reaches the filter.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    // The server's request the broker took (`a`), and its cancellation (`b`).
    let taken = {
        let request = format!(r#"{{"jsonrpc":"2.0","id":{a},"method":"roots/list"}}"#);
        let cancel = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{b}}}}}"#
        );
        let mut taken = TakenIds::new();
        match (
            jsonrpc::parse(request.as_bytes()),
            jsonrpc::parse(cancel.as_bytes()),
        ) {
            (Incoming::Request { .. }, Incoming::Notification { params, .. }) => {
                taken.note(request.as_bytes());
                Some(taken.cancels(params))
            }
            _ => None,
        }
    };
    // The host's `initialize` (`a`), and a response of the server's (`b`), pending and then
    // once the proxy answered it itself.
    let initialize = format!(r#"{{"jsonrpc":"2.0","id":{a},"method":"initialize"}}"#);
    let answer = RawValue::from_string(b.to_owned()).ok();
    let init = |failed: bool| {
        let Incoming::Request { id, .. } = jsonrpc::parse(initialize.as_bytes()) else {
            return None;
        };
        let init = Init::default();
        init.asked(id.to_owned());
        if failed {
            init.fail();
        }
        let answer = init.answer(answer.as_deref()?);
        Some(matches!(answer, Answer::Initialize | Answer::Late))
    };
    vec![
        ("lines.rs TakenIds", taken),
        ("lines.rs Init (pending)", init(false)),
        ("lines.rs Init (failed)", init(true)),
    ]
}

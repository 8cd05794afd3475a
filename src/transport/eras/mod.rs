//! The proxy's side of MCP 2026-07-28 on one connection: which era the host speaks, the host
//! requests that may come back `input_required`, the broker's answers to the input requests
//! that are its own (`roots/list`, `files/*`), the retries the proxy sends for the host, and
//! the answers waiting to be merged into the host's retry (docs/protocol.md, "Two eras").
//!
//! The server is the party the proxy does not trust. Whatever it writes, an input request of
//! the broker's never reaches the host (the host would answer it with its own roots): every
//! message from the server, in either era and from the first, is read where it decides
//! anything before it is passed on ([`modern::check_response`]); one the proxy cannot read one
//! way only and that names a broker method is not passed on; and the broker's input requests
//! are answered by the broker or taken out. Everything the server can make the proxy hold is
//! bounded: the requests kept for a retry, the input requests per result and those the broker
//! answers per round, the bytes of its answers, the rounds at once, the bytes of retries
//! waiting for the server, and the answers waiting for the host.
//!
//! The parts: this file is the flow of one connection (a host request on its way out, a
//! server message on its way back); `round.rs` is a round of the broker's answers;
//! `state.rs` is what the proxy holds between them, within those bounds; `asker.rs` is how the
//! proxy puts its own questions to the broker, local or shared.

mod asker;
mod round;
mod state;

use std::sync::{Arc, Mutex};

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::{Semaphore, mpsc};

use super::lenient::{self, RequestId};
use super::modern::{self, Checked};
use super::relay::ToServer;
use crate::error::{Error, ErrorKind};
use crate::jsonrpc;
use crate::limits::{MAX_KEPT_REQUEST, MAX_ROUNDS, MAX_UNREADABLE_IDS, ROUNDS_AT_ONCE};
use crate::outgoing::Outgoing;
pub(super) use asker::{Asker, Waiting, answer_ask, ask_prefix};
use state::{EraState, Kept};

/// A message's `id` as written, and whether it has a `method` (is a request, or may be read
/// as one): `(None, true)` when even that cannot be read one way.
fn envelope_of(line: &[u8]) -> (Option<String>, bool) {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
        method: Option<serde::de::IgnoredAny>,
    }
    match serde_json::from_slice::<Envelope>(line) {
        // A `method` in another case (`"Method"`) makes it a request to a lenient reader too.
        Ok(env) => (
            env.id.map(|id| id.get().to_owned()),
            env.method.is_some() || lenient::lenient_envelope(line).1,
        ),
        Err(_) => (None, true),
    }
}

/// The 2026-07-28 side of one proxy connection.
pub(super) struct Eras {
    state: Mutex<EraState>,
    asker: Asker,
    /// In the ids of the proxy's retries (which the server sees).
    nonce: String,
    /// In the ids of the proxy's questions to the broker, which the server never sees (so it
    /// cannot send a shared broker a request whose answer the proxy would take for one).
    ask_nonce: String,
    next: std::sync::atomic::AtomicU64,
    rounds: Arc<Semaphore>,
}

/// Where the answers of a round go.
pub(super) struct Outputs {
    pub(super) to_host: mpsc::Sender<Outgoing>,
    pub(super) to_server: mpsc::Sender<ToServer>,
    /// The host → server queue's budget, which the proxy's retries share: a server that
    /// stops reading stops the proxy's retries too, instead of growing its memory.
    pub(super) server_budget: super::relay::Budget,
}

impl Eras {
    pub(super) fn new(asker: Asker, ask_nonce: String) -> Eras {
        Eras {
            state: Mutex::default(),
            asker,
            nonce: crate::random::hex(8),
            ask_nonce,
            next: std::sync::atomic::AtomicU64::new(1),
            rounds: Arc::new(Semaphore::new(ROUNDS_AT_ONCE)),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, EraState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fresh_id(&self, kind: &str) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nonce = if kind == "ask" {
            &self.ask_nonce
        } else {
            &self.nonce
        };
        format!("fsbroker-{kind}-{nonce}-{n}")
    }

    /// Tells the broker the connection's era when it changes.
    pub(super) async fn set_modern(&self, modern: bool) {
        let changed = {
            let mut state = self.state();
            std::mem::replace(&mut state.modern, modern) != modern
        };
        if changed {
            self.asker.set_modern(modern).await;
        }
    }

    /// A host request (2026-07-28 era when it declares that revision): `roots` and the
    /// brokering extension declared in its capabilities; the broker's answers merged in when
    /// it is the host's retry of a request whose input requests were partly the broker's; and
    /// kept, when it may be answered `input_required`.
    pub(super) async fn host_request(&self, line: Vec<u8>, id: &RawValue, method: &str) -> Vec<u8> {
        let Some(version) = modern::declared_version(&line) else {
            return line;
        };
        if !modern::is_modern(&version) {
            return line;
        }
        self.set_modern(true).await;
        let mut line = modern::declare_roots(&line).unwrap_or(line);
        if modern::has_input_responses(&line) {
            let stashed = modern::retry_key(&line).and_then(|k| self.state().unstash(&k));
            if let Some(answers) = stashed {
                line = modern::merge_responses(&line, &answers).unwrap_or(line);
            }
        }
        let key = RequestId::of_raw(id);
        if let Some(key) = key
            .filter(|_| modern::INPUT_METHODS.contains(&method) && line.len() <= MAX_KEPT_REQUEST)
        {
            let kept = Kept {
                host_id: id.to_owned(),
                host_key: key.clone(),
                request: line.clone(),
                rounds: 0,
            };
            let _ = self.state().keep(key, kept);
        }
        line
    }

    /// The host's `notifications/cancelled`: the request is let go, and when the proxy has
    /// retried it, the server is told the id it knows it by.
    pub(super) fn cancelled(&self, line: Vec<u8>) -> Vec<u8> {
        let Some(Value::Object(mut msg)) = modern::strict(&line) else {
            return line;
        };
        let Some(key) = cancelled_id(&msg) else {
            return line;
        };
        let mut state = self.state();
        state.take(&key);
        let retried: Vec<RequestId> = state
            .kept
            .iter()
            .filter(|(_, k)| k.host_key == key)
            .map(|(retry, _)| retry.clone())
            .collect();
        let mut retry_id = None;
        for retry in retried {
            if let Some(kept) = state.take(&retry) {
                retry_id = Some(retry);
                drop(kept);
            }
        }
        drop(state);
        // The proxy's retry ids are strings no reader takes for a number.
        let Some(retry_id) = retry_id
            .as_ref()
            .and_then(|k| k.as_text())
            .map(str::to_owned)
        else {
            return line;
        };
        if let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut) {
            params.insert("requestId".into(), Value::String(retry_id));
        }
        serde_json::to_vec(&Value::Object(msg)).unwrap_or(line)
    }

    /// A message from the server that is not a request for the broker: `Some(line)` to pass
    /// on to the host, `None` when the proxy took it over or let it go.
    ///
    /// Every message is checked ([`modern::check_response`]), in both eras and from the first
    /// (a host may read a line written before its first 2026-07-28 request after sending
    /// it): one the proxy cannot read one way only and that names a broker method is not
    /// passed on (its request gets an error); an answer to a retry of the proxy's goes to the
    /// host under the host's id; an `input_required` result with input
    /// requests of the broker's is answered here (on a task, at most [`ROUNDS_AT_ONCE`] at a
    /// time: past that, this waits, and the proxy stops reading the server).
    pub(super) async fn server_message(
        self: &Arc<Self>,
        line: Vec<u8>,
        out: &Outputs,
    ) -> Option<Vec<u8>> {
        let ir = match modern::check_response(&line) {
            Checked::Plain(None) => return Some(line),
            Checked::Plain(Some(key)) => {
                let kept = self.state().take(&key);
                return match kept {
                    Some(kept) if kept.rounds > 0 => {
                        modern::with_id(&line, &kept.host_id).or(Some(line))
                    }
                    _ => Some(line),
                };
            }
            Checked::Unreadable {
                ids,
                request,
                broker,
            } => {
                return self.unreadable(line, ids, request, broker, out).await;
            }
            Checked::Input(ir) => ir,
        };
        let kept = ir.key.as_ref().and_then(|k| self.state().take(k));
        if ir.broker_keys().is_empty() {
            // Only the host's input requests: the host answers them and retries itself.
            return match kept {
                Some(kept) if kept.rounds > 0 => {
                    modern::with_id(&line, &kept.host_id).or(Some(line))
                }
                _ => Some(line),
            };
        }
        let kept = match kept {
            Some(kept) if kept.rounds < MAX_ROUNDS => kept,
            kept => return self.strip(&ir, kept),
        };
        let Ok(permit) = Arc::clone(&self.rounds).acquire_owned().await else {
            return None;
        };
        let me = Arc::clone(self);
        let out = Outputs {
            to_host: out.to_host.clone(),
            to_server: out.to_server.clone(),
            server_budget: out.server_budget.clone(),
        };
        tokio::spawn(async move {
            me.answer_inputs(ir, kept, out).await;
            drop(permit);
        });
        None
    }

    /// A message the proxy cannot read one way only ([`Checked::Unreadable`]): as written when
    /// no reading of it names a broker method (and it is not known to hold one, `broker`);
    /// else not passed on, and its request gets an error: the server's own (it reads as a
    /// request), or else the host's under each id the message carries.
    async fn unreadable(
        &self,
        line: Vec<u8>,
        mut ids: Vec<Value>,
        mut request: bool,
        broker: bool,
        out: &Outputs,
    ) -> Option<Vec<u8>> {
        if ids.is_empty() {
            // Not read at all: the lenient envelope says what it can (a reader that does not
            // check the bytes of strings it skips reads more lines).
            let (id, method) = envelope_of(&line);
            match id.and_then(|id| serde_json::from_str::<Value>(&id).ok()) {
                Some(id) => {
                    ids.push(id);
                    request = method;
                }
                // Not even that (a `NaN` somewhere): what a scan of the top level finds.
                None => (ids, request) = lenient::lenient_envelope(&line),
            }
        }
        // One answer per distinct id, and few: a line may write its id any number of times.
        distinct(&mut ids);
        ids.truncate(MAX_UNREADABLE_IDS);
        let kept: Vec<Kept> = {
            let mut state = self.state();
            ids.iter()
                .filter_map(RequestId::of_value)
                .filter_map(|k| state.take(&k))
                .collect()
        };
        let names = broker || lenient::names_broker_method(&line);
        let err = Error::new(
            ErrorKind::InvalidRequest,
            if names {
                "fsbroker: a message that is not valid JSON-RPC read one way only, naming a method the broker answers"
            } else {
                "fsbroker: the server's answer to the proxy's retry is not valid JSON-RPC read one way only"
            },
        );
        let errors = |ids: Vec<Box<RawValue>>| {
            let mut frames: Vec<u8> = Vec::new();
            for id in ids {
                frames.extend(jsonrpc::error_frame(Some(&id), &err));
            }
            frames.truncate(frames.trim_ascii_end().len());
            (!frames.is_empty()).then_some(frames)
        };
        if !names {
            // As written, unless it answers a retry of the proxy's: its id is not the host's,
            // and a line the proxy cannot read cannot be given the host's id.
            let retried: Vec<Box<RawValue>> = kept
                .into_iter()
                .filter(|k| k.rounds > 0)
                .map(|k| k.host_id)
                .collect();
            return if retried.is_empty() {
                Some(line)
            } else {
                errors(retried)
            };
        }
        tracing::warn!(
            len = line.len(),
            "a message from the server that reads more than one way and names a broker method was not passed on"
        );
        let raw = |v: &Value| RawValue::from_string(v.to_string()).ok();
        if request && kept.is_empty() {
            // The server's own (malformed) request: the error is the server's.
            if let Some(id) = ids.first().and_then(raw) {
                let frame = jsonrpc::error_frame(Some(&id), &err);
                let _ = out.to_server.send(ToServer::Frame(frame.into())).await;
            }
            return None;
        }
        if kept.is_empty() {
            errors(ids.iter().filter_map(raw).collect())
        } else {
            errors(kept.into_iter().map(|k| k.host_id).collect())
        }
    }

    /// The host's view of an `input_required` result whose broker input requests the proxy
    /// will not answer (the request was not kept, or the server kept asking past
    /// [`MAX_ROUNDS`]): the host's own input requests only, or an error when there
    /// are none.
    fn strip(&self, ir: &modern::InputRequired, kept: Option<Kept>) -> Option<Vec<u8>> {
        let exhausted = kept.is_some();
        let id = match kept {
            Some(kept) => kept.host_id,
            None => ir.id.clone()?,
        };
        let hosts = ir.host_keys();
        tracing::warn!(
            exhausted,
            "the server asked for roots or files input the proxy will not answer; the host sees only its own input requests"
        );
        if !hosts.is_empty() {
            return modern::only_requests(ir, &hosts, &id);
        }
        let reason = if exhausted {
            format!(
                "fsbroker: the server asked for roots or files input more than {} times",
                MAX_ROUNDS
            )
        } else {
            "fsbroker: the server asked for roots or files input on a request the proxy could not keep".to_owned()
        };
        let err = Error::new(ErrorKind::Internal, reason);
        let mut frame = jsonrpc::error_frame(Some(&id), &err);
        frame.truncate(frame.trim_ascii_end().len());
        Some(frame)
    }
}

/// The request a host's `notifications/cancelled` (read as `msg`) cancels.
fn cancelled_id(msg: &serde_json::Map<String, Value>) -> Option<RequestId> {
    msg.get("params")
        .and_then(|p| p.get("requestId"))
        .and_then(RequestId::of_value)
}

/// `ids` without those that are no id, and each [`RequestId`] once (the first spelling).
fn distinct(ids: &mut Vec<Value>) {
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| RequestId::of_value(id).is_some_and(|k| seen.insert(k)));
}

/// For `properties.rs` (through `transport::id_filters`): whether this era's filters take ids
/// written `a` and `b` for one, each fed as the relay feeds it; `None` where no message with
/// them reaches the filter.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    // The host's request (`a`), kept as `host_request` keeps it.
    let host = format!(r#"{{"jsonrpc":"2.0","id":{a},"method":"tools/call"}}"#);
    let key = match jsonrpc::parse(host.as_bytes()) {
        jsonrpc::Incoming::Request { id, .. } => RequestId::of_raw(id),
        _ => None,
    };
    let kept = |key: RequestId| {
        let mut state = EraState::default();
        let kept = Kept {
            host_id: RawValue::from_string("0".into()).ok()?,
            host_key: key.clone(),
            request: Vec::new(),
            rounds: 0,
        };
        state.keep(key, kept).ok()?;
        Some(state)
    };
    // The server's answer (`b`), as `server_message` reads it.
    let answer = format!(r#"{{"jsonrpc":"2.0","id":{b},"result":{{}}}}"#);
    let answered = key.clone().and_then(kept).and_then(|mut state| {
        match modern::check_response(answer.as_bytes()) {
            Checked::Plain(answer) => Some(answer.is_some_and(|k| state.take(&k).is_some())),
            _ => None,
        }
    });
    // The host's cancellation (`b`), as `cancelled` reads it.
    let cancel = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{b}}}}}"#
    );
    let cancelled = key.and_then(kept).and_then(|mut state| {
        let Some(Value::Object(msg)) = modern::strict(cancel.as_bytes()) else {
            return None;
        };
        Some(cancelled_id(&msg).is_some_and(|k| state.take(&k).is_some()))
    });
    // The ids of an unreadable message, each answered once.
    let unreadable = match (serde_json::from_str(a), serde_json::from_str(b)) {
        (Ok(a), Ok(b))
            if RequestId::of_value(&a).is_some() && RequestId::of_value(&b).is_some() =>
        {
            let mut ids = vec![a, b];
            distinct(&mut ids);
            Some(ids.len() == 1)
        }
        _ => None,
    };
    vec![
        ("eras kept (answered)", answered),
        ("eras kept (cancelled)", cancelled),
        ("eras unreadable ids", unreadable),
    ]
}

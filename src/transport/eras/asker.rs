//! The proxy's own questions to the broker: the input requests of the server's
//! `input_required` results that are the broker's, and the era the connection speaks.
//!
//! The broker must take these as the proxy's, never as the server's: a local session is
//! called directly; a shared broker gets them on the proxy's link, under ids with a nonce the
//! server never sees, and its answers are picked out of that link by their prefix before
//! anything else of the broker's goes to the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::host::Session;
use crate::outgoing::Outgoing;
use crate::transport::modern;

/// The proxy asking the broker itself (the input requests of `input_required` results), and
/// telling it which era the connection speaks.
#[derive(Clone)]
pub(in crate::transport) enum Asker {
    Local(Arc<Session>),
    Remote {
        to_broker: mpsc::Sender<Outgoing>,
        waiting: Waiting,
        /// The shared broker's key, which its notes about the server carry.
        key: Option<Arc<str>>,
    },
}

/// Questions to a shared broker waiting for their answers, by id.
pub(in crate::transport) type Waiting =
    Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<Vec<u8>>>>>;

/// The start of every answer to a question of the proxy's own: the broker writes every
/// response beginning `{"jsonrpc":"2.0","id":`, and the proxy's ids begin `fsbroker-ask-`
/// and a random nonce (so no id of the server's can take an answer meant for the proxy).
pub(in crate::transport) fn ask_prefix(nonce: &str) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":\"fsbroker-ask-{nonce}-")
}

/// Hands a shared broker's answer to the question waiting for it.
pub(in crate::transport) fn answer_ask(waiting: &Waiting, line: Vec<u8>) {
    let Some(id) = response_id(&line) else { return };
    let id: String = serde_json::from_str(&id).unwrap_or_default();
    if let Some(tx) = waiting
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id)
    {
        let _ = tx.send(line);
    }
}

/// A response's `id`, as written.
fn response_id(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Reply<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
    }
    serde_json::from_slice::<Reply>(line)
        .ok()
        .map(|r| r.id.get().to_owned())
}

impl Asker {
    /// Sends `{"method": method, "params": params}` to the broker; returns its answer frame.
    pub(super) async fn ask(
        &self,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) -> Option<Vec<u8>> {
        let mut request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params.and_then(|p| serde_json::from_str::<Value>(p.get()).ok()) {
            request["params"] = p;
        }
        let line = request.to_string().into_bytes();
        match self {
            Asker::Local(session) => session.handle(&line).await,
            Asker::Remote {
                to_broker, waiting, ..
            } => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                waiting
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id.to_owned(), tx);
                let mut framed = line;
                framed.push(b'\n');
                to_broker.send(framed.into()).await.ok()?;
                rx.await.ok()
            }
        }
    }

    /// Tells the broker whether the server speaks MCP 2026-07-28 (its results then carry
    /// `resultType`).
    pub(super) async fn set_modern(&self, modern: bool) {
        match self {
            Asker::Local(session) => session.set_modern(modern),
            Asker::Remote { to_broker, key, .. } => {
                let version = if modern {
                    modern::MODERN_VERSION
                } else {
                    "2025-11-25"
                };
                let params = serde_json::json!({ "protocolVersion": version });
                let line = crate::transport::peer_note(key.as_deref(), params);
                let _ = to_broker.send(line.into()).await;
            }
        }
    }
}

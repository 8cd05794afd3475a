//! What goes to the relay: each message of the server's, as one line (a `files/read` request
//! clamped, a response settling its request, or dropped as a late second answer), and the
//! proxy's own error for a host request that got no answer.

use serde_json::value::RawValue;

use super::Remote;
use super::failure::Failure;
use super::reads::Reads;
use crate::error::Error;
use crate::jsonrpc;
use crate::transport::lenient::RequestId;

impl Remote {
    /// Hands one message of the server's to the relay, as one line. Line breaks (which JSON
    /// allows only between tokens: an SSE event may carry pretty-printed JSON) become spaces.
    /// A `files/read` request may have its length clamped; a response answers its request.
    pub(super) async fn deliver(&self, data: &[u8]) {
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
    pub(super) fn lock_reads(&self) -> std::sync::MutexGuard<'_, Reads> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The host's request `id` (already moved to the failed ones) gets `failure` as its
    /// answer (and stderr says why). Queued as it is: it is no answer of the server's, which
    /// the failed ones' would be dropped as.
    pub(super) async fn fail(&self, id: &RawValue, failure: &Failure) {
        if !matches!(failure, Failure::Unauthorized { .. }) {
            tracing::warn!(error = %failure, "a request to the server failed");
        }
        let err = Error::new(failure.kind(), format!("fsbroker: {failure}"));
        let mut line = jsonrpc::error_frame(Some(id), &err);
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if let Some(frame) = self.budget.frame(line).await {
            let _ = self.inbound.send(frame).await;
        }
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

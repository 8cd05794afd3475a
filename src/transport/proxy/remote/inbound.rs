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
        // What goes on is one JSON value. Anything else no host can use as JSON-RPC, and a
        // lenient reader (one that reads value after value, skips a byte-order mark or a
        // comment, or splits lines at U+2028 or a form feed) could find in it an answer the
        // proxy cannot pair with its request (round 4 review).
        if serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_err() {
            tracing::warn!(
                len = line.len(),
                "a message of the server's that is not one JSON value was not relayed"
            );
            return;
        }
        let line = escape_line_separators(line);
        let Some(mut line) = self.read_message(line) else {
            return;
        };
        line.push(b'\n');
        let Some(frame) = self.budget.frame(line).await else {
            return;
        };
        let _ = self.inbound.send(frame).await;
    }
    /// What the proxy learns from a line of the server's on its way to the relay, and what of
    /// it goes on: a batch's messages are each read as one sent alone would be.
    ///
    /// A batch is kept a batch, less the messages that must not go on: the host (or the
    /// relay, which refuses a batch naming a method of the broker's) sees what the server
    /// sent, and its other messages (a notification, an answer to another request) still
    /// count. A batch left with none is dropped whole: an empty array is no JSON-RPC message.
    fn read_message(&self, line: Vec<u8>) -> Option<Vec<u8>> {
        let batch = line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        let elements = batch
            .then(|| serde_json::from_slice::<Vec<&RawValue>>(&line).ok())
            .flatten();
        let Some(elements) = elements.filter(|e| !e.is_empty()) else {
            return self.read_one(line);
        };
        let mut kept: Vec<Vec<u8>> = Vec::with_capacity(elements.len());
        let mut changed = false;
        for element in elements {
            let written = element.get().as_bytes();
            // A message is an object; an array in a batch is none, and a reader that
            // flattens it would find messages the proxy did not pair.
            if written.first() != Some(&b'{') {
                changed = true;
                continue;
            }
            match self.read_one(written.to_vec()) {
                Some(read) => {
                    changed |= read != written;
                    kept.push(read);
                }
                None => changed = true,
            }
        }
        if !changed {
            return Some(line);
        }
        if kept.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(line.len());
        out.push(b'[');
        for (n, message) in kept.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            out.extend_from_slice(message);
        }
        out.push(b']');
        Some(out)
    }

    /// One message (or a line no parser reads), read as the host's reader will read it.
    ///
    /// Its members are read the way JavaScript's `JSON.parse` and Python's `json` read them,
    /// the last of a name written twice winning (serde's derive refuses such a line, which
    /// used to go on unread, so a late answer written `{"id":11,"id":10,…}` reached the host).
    /// Before that, every reading of it that may be an answer ([`any_message`](crate::transport::lenient::any_message)) is
    /// checked: one under an id the proxy already answered itself is dropped, and so is one
    /// whose id reads more than one way (written twice, or in another case): the proxy
    /// cannot know which request the host pairs it with, and pairing it with the other would
    /// give that one two answers.
    fn read_one(&self, line: Vec<u8>) -> Option<Vec<u8>> {
        let env = serde_json::from_slice::<LastWins>(&line).ok();
        let method = env.as_ref().and_then(|e| e.method);
        let method = method.and_then(|m| serde_json::from_str::<Option<String>>(m.get()).ok());
        let (id, method) = match env.as_ref() {
            Some(env) => (env.id, method.flatten()),
            None => (None, None),
        };
        // An id that is no id (`null`) pairs with no request of the host's.
        let answers = match (id, &method) {
            (Some(id), None) => RequestId::of_raw(id),
            _ => None,
        };
        if !self.admit(&line, answers.as_ref()) {
            tracing::debug!(
                "a message of the server's the host may take for a second answer (to a request already failed, or under an id that reads two ways) was dropped"
            );
            return None;
        }
        let Some(env) = env else {
            return Some(line);
        };
        match (env.id, method.as_deref()) {
            (Some(id), Some("files/read")) => {
                let (id, params) = (id.to_owned(), env.params.map(ToOwned::to_owned));
                Some(self.lock_reads().arrived(&id, params.as_deref(), line))
            }
            (Some(_), None) => {
                if let (Some(key), Some(version)) =
                    (&answers, env.result.and_then(negotiated_version))
                {
                    self.session.negotiated(key, &version);
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

/// `line` (one JSON value) with U+2028, U+2029 and U+0085 written as escapes: JSON allows
/// them raw only inside strings, where the escape means the same, and a host that splits
/// lines where Python's `str.splitlines` does would cut the message there.
fn escape_line_separators(line: Vec<u8>) -> Vec<u8> {
    const SEPARATORS: [(&[u8], &[u8]); 3] = [
        ("\u{2028}".as_bytes(), b"\\u2028"),
        ("\u{2029}".as_bytes(), b"\\u2029"),
        ("\u{85}".as_bytes(), b"\\u0085"),
    ];
    if !SEPARATORS
        .iter()
        .any(|(raw, _)| line.windows(raw.len()).any(|w| w == *raw))
    {
        return line;
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    let mut i = 0;
    'bytes: while i < line.len() {
        for (raw, escaped) in SEPARATORS {
            if line[i..].starts_with(raw) {
                out.extend_from_slice(escaped);
                i += raw.len();
                continue 'bytes;
            }
        }
        out.push(line[i]);
        i += 1;
    }
    out
}

/// `result.protocolVersion` of an `initialize` answer (the last, if written twice).
fn negotiated_version(result: &RawValue) -> Option<String> {
    let result: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(result.get()).ok()?;
    Some(result.get("protocolVersion")?.as_str()?.to_owned())
}

/// A message's members as JavaScript's and Python's readers keep them: the last of each name
/// (serde's derive refuses a name written twice). Values as written.
#[derive(Default)]
struct LastWins<'a> {
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    result: Option<&'a RawValue>,
}

impl<'de> serde::Deserialize<'de> for LastWins<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Members;
        impl<'de> serde::de::Visitor<'de> for Members {
            type Value = LastWins<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<LastWins<'de>, A::Error> {
                let mut env = LastWins::default();
                while let Some(name) = map.next_key::<String>()? {
                    let value: &'de RawValue = map.next_value()?;
                    let slot = match name.as_str() {
                        "id" => &mut env.id,
                        "method" => &mut env.method,
                        "params" => &mut env.params,
                        "result" => &mut env.result,
                        _ => continue,
                    };
                    *slot = Some(value);
                }
                Ok(env)
            }
        }
        de.deserialize_map(Members)
    }
}

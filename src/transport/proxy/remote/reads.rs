//! The `files/read` clamp of `proxy --url`: a remote server whose HTTP endpoint refuses large
//! bodies (413) cannot take the broker's answer to a large read. The proxy remembers the
//! server's reads until their answers go, and after a 413 (or from `--max-chunk-size`) rewrites
//! the `length` of the server's later reads before the broker sees them. A smaller answer is
//! legal: a read's `length` says how much came, and the next chunk starts after it.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use crate::limits::{REMOTE_MIN_CHUNK, REMOTE_READS_KEPT};
use crate::transport::lenient::RequestId;
use crate::transport::pending::PendingIds;

/// The reads waiting for their answers, and the clamp.
pub(super) struct Reads {
    /// The longest `length` the server's reads may ask for now.
    clamp: Option<u64>,
    /// Each waiting read's path, by its id; past [`REMOTE_READS_KEPT`] the oldest are
    /// forgotten.
    waiting: PendingIds<String>,
}

impl Reads {
    pub(super) fn new(clamp: Option<u64>) -> Reads {
        Reads {
            clamp,
            waiting: PendingIds::new(REMOTE_READS_KEPT),
        }
    }

    /// A `files/read` request from the server, as the broker is to see it: remembered, and
    /// with its `length` clamped when it asks for more (or for the default).
    pub(super) fn arrived(
        &mut self,
        id: &RawValue,
        params: Option<&RawValue>,
        line: Vec<u8>,
    ) -> Vec<u8> {
        #[derive(serde::Deserialize)]
        struct Params {
            path: Option<String>,
            length: Option<Value>,
        }
        let read: Option<Params> = params.and_then(|p| serde_json::from_str(p.get()).ok());
        let path = read
            .as_ref()
            .and_then(|r| r.path.clone())
            .unwrap_or_default();
        if let Some(key) = RequestId::of_raw(id) {
            self.waiting.insert(key, path);
        }
        let Some(clamp) = self.clamp else { return line };
        let asked = read.as_ref().and_then(|r| r.length.as_ref());
        if asked
            .and_then(Value::as_u64)
            .is_some_and(|len| len <= clamp)
        {
            return line;
        }
        // A length that is not a number is left to the broker, which refuses it.
        if asked.is_some_and(|len| !len.is_u64()) {
            return line;
        }
        with_length(&line, clamp).unwrap_or(line)
    }

    /// A response of the server's, as the relay is to see it: an `input_required` result
    /// (MCP 2026-07-28) has the `length` of its `files/read` input requests clamped, as a
    /// request of the 2025 era would.
    pub(super) fn input_requests(&self, line: Vec<u8>) -> Vec<u8> {
        let Some(clamp) = self.clamp else { return line };
        if memchr::memmem::find(&line, b"input_required").is_none() {
            return line;
        }
        let Ok(mut msg) = serde_json::from_slice::<Value>(&line) else {
            return line;
        };
        let Some(requests) = msg
            .pointer_mut("/result/inputRequests")
            .and_then(Value::as_object_mut)
        else {
            return line;
        };
        let mut changed = false;
        for request in requests.values_mut() {
            if request.get("method").and_then(Value::as_str) != Some("files/read") {
                continue;
            }
            let Some(params) = request.get_mut("params").and_then(Value::as_object_mut) else {
                continue;
            };
            match params.get("length") {
                Some(len) if len.as_u64().is_some_and(|n| n <= clamp) => {}
                // A length that is not a number is left to the broker, which refuses it.
                Some(len) if !len.is_u64() => {}
                _ => {
                    params.insert("length".into(), Value::from(clamp));
                    changed = true;
                }
            }
        }
        if !changed {
            return line;
        }
        serde_json::to_vec(&msg).unwrap_or(line)
    }

    /// The path of the read `id` answers, when it was one; it is forgotten.
    pub(super) fn answered(&mut self, id: &RawValue) -> Option<String> {
        self.waiting.remove(&RequestId::of_raw(id)?)
    }

    /// The server refused an answer carrying `length` bytes of the file (`None`: unknown,
    /// `body` bytes on the wire): the clamp becomes half of it (whole 4 KiB, at least
    /// [`REMOTE_MIN_CHUNK`]), and is returned.
    pub(super) fn refused(&mut self, length: Option<u64>, body: usize) -> u64 {
        // base64 carries 3 bytes in 4; the JSON around it is small.
        let carried = length.unwrap_or(body as u64 / 4 * 3);
        let half = (carried / 2) / REMOTE_MIN_CHUNK * REMOTE_MIN_CHUNK;
        let clamp = half.max(REMOTE_MIN_CHUNK);
        let clamp = self.clamp.map_or(clamp, |c| c.min(clamp));
        self.clamp = Some(clamp);
        clamp
    }
}

/// `line` with `params.length` set to `length` (the other members kept as written).
fn with_length(line: &[u8], length: u64) -> Option<Vec<u8>> {
    type Members = BTreeMap<String, Box<RawValue>>;
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params: Members = serde_json::from_str(msg.get("params")?.get()).ok()?;
    params.insert(
        "length".into(),
        serde_json::value::to_raw_value(&length).ok()?,
    );
    msg.insert(
        "params".into(),
        serde_json::value::to_raw_value(&params).ok()?,
    );
    serde_json::to_vec(&msg).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> Box<RawValue> {
        RawValue::from_string(n.to_string()).unwrap()
    }

    #[test]
    fn clamps_only_longer_reads() {
        let mut reads = Reads::new(Some(8192));
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"files/read","params":{"path":"a","length":4096}}"#.to_vec();
        let p = RawValue::from_string(r#"{"path":"a","length":4096}"#.into()).unwrap();
        assert_eq!(reads.arrived(&id(1), Some(&p), line.clone()), line);
        let p = RawValue::from_string(r#"{"path":"a"}"#.into()).unwrap();
        let line =
            br#"{"jsonrpc":"2.0","id":2,"method":"files/read","params":{"path":"a"}}"#.to_vec();
        let out: Value = serde_json::from_slice(&reads.arrived(&id(2), Some(&p), line)).unwrap();
        assert_eq!(out["params"]["length"], 8192);
        assert_eq!(out["id"], 2);
        assert_eq!(reads.answered(&id(2)).as_deref(), Some("a"));
        assert_eq!(reads.answered(&id(2)), None);
    }

    #[test]
    fn input_requests_of_2026_are_clamped_too() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"files/read","params":{"path":"p","length":99999}},"b":{"method":"files/read","params":{"path":"p","length":10}},"c":{"method":"roots/list"}},"requestState":"s"}}"#.to_vec();
        assert_eq!(Reads::new(None).input_requests(line.clone()), line);
        let out: Value =
            serde_json::from_slice(&Reads::new(Some(4096)).input_requests(line)).unwrap();
        let reqs = &out["result"]["inputRequests"];
        assert_eq!(reqs["a"]["params"]["length"], 4096);
        assert_eq!(reqs["b"]["params"]["length"], 10);
        assert_eq!(reqs["c"], serde_json::json!({"method": "roots/list"}));
        assert_eq!(out["result"]["requestState"], "s");
        assert_eq!(out["id"], 7);
    }

    #[test]
    fn a_refusal_halves_and_never_grows() {
        let mut reads = Reads::new(None);
        assert_eq!(reads.refused(Some(1 << 20), 0), 512 << 10);
        assert_eq!(reads.refused(Some(4 << 20), 0), 512 << 10);
        assert_eq!(reads.refused(Some(100), 0), REMOTE_MIN_CHUNK);
    }
}

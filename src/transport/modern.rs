//! MCP 2026-07-28 on the proxy's wire: what it reads and rewrites in that revision's
//! messages (docs/protocol.md, "`fsbroker proxy`: two eras").
//!
//! The revision has no `initialize` and no server → client requests. A client declares its
//! revision and capabilities in every request's `params._meta`; a server that needs the
//! client's roots answers a request with `{"resultType":"input_required","inputRequests":{…}}`
//! and the client sends the request again with `inputResponses` (same keys) and the echoed
//! `requestState`. The proxy puts the broker in that loop: it declares `roots` (and the
//! brokering extension) on every request, answers the `roots/list` and `files/*` input
//! requests itself, and shows the host only the ones the host must answer.
//!
//! Everything here works on raw JSON members: numbers, strings and members the proxy does not
//! know pass through as the peers wrote them.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

/// `params._meta` key of a request's protocol revision.
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// `params._meta` key of a request's client capabilities.
pub const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";

/// The extension id under which the proxy declares fsbroker's `files/*` methods in the client
/// capabilities it injects (`capabilities.extensions`).
pub const EXTENSION_ID: &str = "io.github.fsbroker/files";

/// The methods whose results may be `input_required` (the 2026-07-28 schema's list).
pub const INPUT_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

/// At most this many rounds of `input_required` answered by the broker for one host request
/// (the SDKs stop at 10 too): a server that keeps asking gets its last answer to the host.
pub const MAX_ROUNDS: u32 = 10;

/// The revision of the new era the proxy knows (the first).
pub const MODERN_VERSION: &str = "2026-07-28";

/// Whether `version` is a revision of the new era (2026-07-28 or later: revisions are dates).
pub fn is_modern(version: &str) -> bool {
    version >= "2026-07-28"
}

type Members = BTreeMap<String, Box<RawValue>>;

fn raw<T: serde::Serialize + ?Sized>(v: &T) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(v).ok()
}

fn members(raw: &RawValue) -> Option<Members> {
    serde_json::from_str(raw.get()).ok()
}

/// A host request's era marker: the revision in `params._meta`, if it has one.
pub fn declared_version(line: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Msg<'a> {
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Params<'a> {
        #[serde(rename = "_meta", borrow)]
        meta: Option<&'a RawValue>,
    }
    let msg: Msg = serde_json::from_slice(line).ok()?;
    let params: Params = serde_json::from_str(msg.params?.get()).ok()?;
    let meta: BTreeMap<String, Value> = serde_json::from_str(params.meta?.get()).ok()?;
    meta.get(VERSION_KEY)?.as_str().map(str::to_owned)
}

/// The request with `roots` and the brokering extension added to the client capabilities in
/// its `params._meta` (the host's own capabilities, and the rest of the message, untouched).
pub fn declare_roots(line: &[u8]) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params = members(msg.get("params")?)?;
    let mut meta = members(params.get("_meta")?)?;
    let mut caps: serde_json::Map<String, Value> = meta
        .get(CAPABILITIES_KEY)
        .and_then(|c| serde_json::from_str(c.get()).ok())
        .unwrap_or_default();
    caps.entry("roots")
        .or_insert_with(|| Value::Object(Default::default()));
    let extensions = caps
        .entry("extensions")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Value::Object(map) = extensions {
        map.insert(
            EXTENSION_ID.to_owned(),
            serde_json::json!({ "methods": crate::methods::FILES_METHODS }),
        );
    }
    meta.insert(CAPABILITIES_KEY.to_owned(), raw(&caps)?);
    params.insert("_meta".to_owned(), raw(&meta)?);
    msg.insert("params".to_owned(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// Whether an input request is the broker's to answer.
pub fn is_broker_method(method: &str) -> bool {
    method == "roots/list" || method.starts_with("files/")
}

/// A result asking for input.
#[derive(Debug)]
pub struct InputRequired {
    /// The input requests, by key, as the server wrote them.
    pub requests: BTreeMap<String, Box<RawValue>>,
    /// The state to echo, as the server wrote it.
    pub state: Option<Box<RawValue>>,
    /// The whole result's members, for passing on a part of it.
    pub result: Members,
}

impl InputRequired {
    /// The method of the input request under `key`.
    pub fn method(&self, key: &str) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Req {
            method: String,
        }
        let req: Req = serde_json::from_str(self.requests.get(key)?.get()).ok()?;
        Some(req.method)
    }
}

/// The `input_required` result of a response, if it is one. Only responses that mention it
/// are parsed: most are passed on without a look inside.
pub fn input_required(line: &[u8]) -> Option<InputRequired> {
    memchr::memmem::find(line, b"input_required")?;
    let msg: Members = serde_json::from_slice(line).ok()?;
    let result = members(msg.get("result")?)?;
    let kind: String = serde_json::from_str(result.get("resultType")?.get()).ok()?;
    if kind != "input_required" {
        return None;
    }
    let requests = result
        .get("inputRequests")
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default();
    let state = result.get("requestState").map(|s| s.to_owned());
    Some(InputRequired {
        requests,
        state,
        result,
    })
}

/// The request `line` sent again under `id`, with `responses` added to its
/// `params.inputResponses` (keys already there kept) and `state` as its `requestState`.
pub fn retry(
    line: &[u8],
    id: &str,
    responses: &BTreeMap<String, Box<RawValue>>,
    state: Option<&RawValue>,
) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params = msg
        .get("params")
        .and_then(|p| members(p))
        .unwrap_or_default();
    let mut given: Members = params
        .get("inputResponses")
        .and_then(|r| members(r))
        .unwrap_or_default();
    for (k, v) in responses {
        given.entry(k.clone()).or_insert_with(|| v.clone());
    }
    params.insert("inputResponses".to_owned(), raw(&given)?);
    match state {
        Some(state) => {
            params.insert("requestState".to_owned(), state.to_owned());
        }
        None => {
            params.remove("requestState");
        }
    }
    msg.insert("params".to_owned(), raw(&params)?);
    msg.insert("id".to_owned(), raw(id)?);
    serde_json::to_vec(&msg).ok()
}

/// The host's retry `line` with the broker's `answers` added to its `inputResponses` (the
/// host's own answers kept).
pub fn merge_responses(line: &[u8], answers: &BTreeMap<String, Box<RawValue>>) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params = members(msg.get("params")?)?;
    let mut given: Members = params
        .get("inputResponses")
        .and_then(|r| members(r))
        .unwrap_or_default();
    for (k, v) in answers {
        given.entry(k.clone()).or_insert_with(|| v.clone());
    }
    params.insert("inputResponses".to_owned(), raw(&given)?);
    msg.insert("params".to_owned(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// The response `line` with its `id` replaced by `id` (the host's own, for the answer to a
/// retry the proxy made).
pub fn with_id(line: &[u8], id: &RawValue) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    msg.insert("id".to_owned(), id.to_owned());
    serde_json::to_vec(&msg).ok()
}

/// A response (id `id`) whose result is `ir`'s, with only the input requests under `keep`.
pub fn only_requests(ir: &InputRequired, keep: &[String], id: &RawValue) -> Option<Vec<u8>> {
    let mut result = ir.result.clone();
    let requests: Members = ir
        .requests
        .iter()
        .filter(|(k, _)| keep.contains(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    result.insert("inputRequests".to_owned(), raw(&requests)?);
    let mut msg: Members = Members::new();
    msg.insert("jsonrpc".to_owned(), raw("2.0")?);
    msg.insert("id".to_owned(), id.to_owned());
    msg.insert("result".to_owned(), raw(&result)?);
    serde_json::to_vec(&msg).ok()
}

/// What identifies a host's retry of a request whose input requests were partly the broker's:
/// the `requestState` it echoes, or else its method and params (without `inputResponses`,
/// `requestState` and `_meta`, which change between rounds).
pub fn retry_key(line: &[u8]) -> Option<String> {
    let msg: Members = serde_json::from_slice(line).ok()?;
    let method: String = serde_json::from_str(msg.get("method")?.get()).ok()?;
    let mut params = msg
        .get("params")
        .and_then(|p| members(p))
        .unwrap_or_default();
    if let Some(state) = params.get("requestState") {
        return Some(format!("state:{}", state.get()));
    }
    params.remove("inputResponses");
    params.remove("_meta");
    let canonical: BTreeMap<String, Value> = params
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), serde_json::from_str(v.get()).ok()?)))
        .collect();
    Some(format!(
        "{method}:{}",
        serde_json::to_string(&canonical).ok()?
    ))
}

/// [`retry_key`] for the request that got `ir`, as its retry will carry it.
pub fn retry_key_for(request: &[u8], ir: &InputRequired) -> Option<String> {
    match &ir.state {
        Some(state) => Some(format!("state:{}", state.get())),
        None => retry_key(request),
    }
}

/// Whether a host request carries `inputResponses` (a retry).
pub fn has_input_responses(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"inputResponses").is_some()
}

/// The broker's answer frame to one of the proxy's own questions, as an input response: its
/// `result` without `resultType` (an input response is the bare result), or its `error`.
pub fn input_response(frame: &[u8]) -> Option<Box<RawValue>> {
    let msg: Members = serde_json::from_slice(frame).ok()?;
    if let Some(result) = msg.get("result") {
        let mut result = members(result)?;
        result.remove("resultType");
        return raw(&result);
    }
    let mut wrapped = Members::new();
    wrapped.insert("error".to_owned(), msg.get("error")?.clone());
    raw(&wrapped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_the_extension_are_declared_and_the_rest_kept() {
        let line = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"n":1.50},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"form":{}}}}}}"#;
        let out: Value = serde_json::from_slice(&declare_roots(line).unwrap()).unwrap();
        let caps = &out["params"]["_meta"][CAPABILITIES_KEY];
        assert_eq!(caps["roots"], serde_json::json!({}));
        assert_eq!(caps["elicitation"], serde_json::json!({"form": {}}));
        assert!(caps["extensions"][EXTENSION_ID]["methods"].is_array());
        assert_eq!(out["id"], 7);
        // Raw members pass as written.
        assert!(
            String::from_utf8(declare_roots(line).unwrap())
                .unwrap()
                .contains("1.50")
        );
        assert_eq!(declared_version(line).as_deref(), Some("2026-07-28"));
    }

    #[test]
    fn a_retry_carries_the_responses_and_the_state() {
        let line = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t","inputResponses":{"host":{"action":"accept"}}}}"#;
        let mut responses = BTreeMap::new();
        responses.insert(
            "roots".to_owned(),
            RawValue::from_string(r#"{"roots":[]}"#.into()).unwrap(),
        );
        let state = RawValue::from_string(r#""s1""#.into()).unwrap();
        let out: Value = serde_json::from_slice(
            &retry(line, "fsbroker-retry-1", &responses, Some(&state)).unwrap(),
        )
        .unwrap();
        assert_eq!(out["id"], "fsbroker-retry-1");
        assert_eq!(out["params"]["requestState"], "s1");
        assert_eq!(out["params"]["inputResponses"]["host"]["action"], "accept");
        assert_eq!(
            out["params"]["inputResponses"]["roots"]["roots"],
            serde_json::json!([])
        );
    }

    #[test]
    fn retry_keys_match_across_rounds() {
        let first = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":1},"_meta":{"x":1}}}"#;
        let again = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{"a":1},"name":"t","inputResponses":{"k":{}},"_meta":{"x":2}}}"#;
        assert_eq!(retry_key(first), retry_key(again));
        let with_state = br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t","requestState":"abc"}}"#;
        assert_eq!(retry_key(with_state).unwrap(), "state:\"abc\"");
    }
}

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
//! Here: what the proxy writes in that loop (the host's requests with `roots` declared, its
//! retries, the broker's answers as input responses, the host's view of a result).
//! `check.rs` reads what the server writes, to decide where each message goes: its deciding
//! members strictly (`skeleton.rs`: each written once, spelled exactly), and the whole line
//! as the loosest host might (`transport/lenient`).
//!
//! Everything here works on raw JSON members: numbers, strings and members the proxy does not
//! know pass through as the peers wrote them.

mod check;
mod skeleton;

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

pub(crate) use check::{Checked, InputRequired, check_response};
pub(crate) use skeleton::strict;

/// `params._meta` key of a request's protocol revision.
pub(crate) const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// `params._meta` key of a request's client capabilities.
pub(crate) const CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";

/// The extension id under which the proxy declares fsbroker's `files/*` methods in the client
/// capabilities it injects (`capabilities.extensions`).
pub(crate) const EXTENSION_ID: &str = "io.github.fsbroker/files";

/// The methods whose results may be `input_required` (the 2026-07-28 schema's list).
pub(crate) const INPUT_METHODS: [&str; 3] = ["tools/call", "prompts/get", "resources/read"];

pub(crate) use crate::jsonrpc::{MODERN_VERSION, is_modern};

type Members = BTreeMap<String, Box<RawValue>>;

fn raw<T: serde::Serialize + ?Sized>(v: &T) -> Option<Box<RawValue>> {
    serde_json::value::to_raw_value(v).ok()
}

fn members(raw: &RawValue) -> Option<Members> {
    serde_json::from_str(raw.get()).ok()
}

/// A host request's era marker: the revision in `params._meta`, if it has one.
pub(crate) fn declared_version(line: &[u8]) -> Option<String> {
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
pub(crate) fn declare_roots(line: &[u8]) -> Option<Vec<u8>> {
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
            serde_json::json!({ "methods": crate::methods::files_methods().collect::<Vec<_>>() }),
        );
    }
    meta.insert(CAPABILITIES_KEY.to_owned(), raw(&caps)?);
    params.insert("_meta".to_owned(), raw(&meta)?);
    msg.insert("params".to_owned(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// The request `line` sent again under `id`, with `responses` added to its
/// `params.inputResponses` (keys already there kept) and `state` as its `requestState`.
pub(crate) fn retry(
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
    // The broker's answers win over any the request already carried under the same key.
    for (k, v) in responses {
        given.insert(k.clone(), v.clone());
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
/// host's answers to its own input requests kept; an answer of the host's under one of the
/// broker's keys is replaced).
pub(crate) fn merge_responses(
    line: &[u8],
    answers: &BTreeMap<String, Box<RawValue>>,
) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params = members(msg.get("params")?)?;
    let mut given: Members = params
        .get("inputResponses")
        .and_then(|r| members(r))
        .unwrap_or_default();
    for (k, v) in answers {
        given.insert(k.clone(), v.clone());
    }
    params.insert("inputResponses".to_owned(), raw(&given)?);
    msg.insert("params".to_owned(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// The response `line` with its `id` replaced by `id` (the host's own, for the answer to a
/// retry the proxy made).
pub(crate) fn with_id(line: &[u8], id: &RawValue) -> Option<Vec<u8>> {
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    msg.insert("id".to_owned(), id.to_owned());
    serde_json::to_vec(&msg).ok()
}

/// A response (id `id`) whose result is `ir`'s, with only the input requests under `keep`.
pub(crate) fn only_requests(ir: &InputRequired, keep: &[String], id: &RawValue) -> Option<Vec<u8>> {
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
pub(crate) fn retry_key(line: &[u8]) -> Option<String> {
    let msg: Members = serde_json::from_slice(line).ok()?;
    let method: String = serde_json::from_str(msg.get("method")?.get()).ok()?;
    let mut params = msg
        .get("params")
        .and_then(|p| members(p))
        .unwrap_or_default();
    if let Some(state) = params.get("requestState") {
        return state_key(state);
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
pub(crate) fn retry_key_for(request: &[u8], ir: &InputRequired) -> Option<String> {
    match &ir.state {
        Some(state) => state_key(state),
        None => retry_key(request),
    }
}

/// A `requestState` by value, however either side spelled it.
fn state_key(state: &RawValue) -> Option<String> {
    let value: Value = serde_json::from_str(state.get()).ok()?;
    Some(format!("state:{value}"))
}

/// Whether a host request carries `inputResponses` (a retry).
pub(crate) fn has_input_responses(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"inputResponses").is_some()
}

/// The broker's answer frame to one of the proxy's own questions, as an input response: its
/// `result` without `resultType` (an input response is the bare result), or its `error`.
pub(crate) fn input_response(frame: &[u8]) -> Option<Box<RawValue>> {
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

//! JSON-RPC 2.0 envelopes in, response frames out.
//!
//! Parsing reads only the envelope (`jsonrpc`, `id`, `method`, `params`), keeping `id` and
//! `params` as raw JSON text: an id is echoed byte for byte (so `92` and `"92"` stay
//! different), and each method parses its own params. Frames are written straight into a byte
//! buffer, so a large result (a base64 chunk) is encoded once, in place, with no intermediate
//! `serde_json::Value` or string escaping scan.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, ErrorKind};
use crate::outgoing::{Body, Outgoing};

/// An incoming message, classified.
#[derive(Debug)]
pub(crate) enum Incoming<'a> {
    /// A request: it gets exactly one response.
    Request {
        /// The raw id text, echoed in the response.
        id: &'a RawValue,
        /// The method name.
        method: String,
        /// The raw params, if present.
        params: Option<&'a RawValue>,
    },
    /// A notification: it gets no response.
    Notification {
        /// The method name.
        method: String,
        /// The raw params, if present.
        params: Option<&'a RawValue>,
    },
    /// A response to a request we did not send (the broker sends none in `serve`).
    Response,
    /// Not a valid message. Answered when `id` is known or the line was not JSON at all.
    Invalid {
        /// The id, when one could be read.
        id: Option<&'a RawValue>,
        /// What is wrong.
        error: Error,
    },
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    method: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

impl Incoming<'_> {
    /// The method of a request or a notification.
    pub(crate) fn method(&self) -> Option<&str> {
        match self {
            Incoming::Request { method, .. } | Incoming::Notification { method, .. } => {
                Some(method)
            }
            Incoming::Response | Incoming::Invalid { .. } => None,
        }
    }
}

/// Keeps a field that is present with value `null` apart from an absent one.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Classifies one line (without its newline).
pub(crate) fn parse(line: &[u8]) -> Incoming<'_> {
    // JSON is UTF-8. serde_json does not check the strings of members it skips, so a line
    // with invalid UTF-8 in an unread member would otherwise pass as a request. Checked with
    // SIMD, once: an upload chunk's line is megabytes of base64, and checking it was a tenth
    // of the broker's time on an upload. Parsed from the checked `str` below, serde_json does
    // not check the strings it borrows (the params, the content) a second time.
    let text = match simdutf8::compat::from_utf8(line) {
        Ok(text) => text,
        Err(e) => {
            return Incoming::Invalid {
                id: None,
                error: Error::new(
                    ErrorKind::ParseError,
                    format!("not valid JSON: invalid UTF-8 at byte {}", e.valid_up_to()),
                ),
            };
        }
    };
    // serde would happily read a JSON array positionally into the envelope struct; only an
    // object is a message (MCP has no batches).
    if line.trim_ascii_start().first() != Some(&b'{') {
        let (kind, reason) = match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
            Ok(_) => (
                ErrorKind::InvalidRequest,
                "a message must be a JSON object (batches are not supported)".to_owned(),
            ),
            Err(e) => (ErrorKind::ParseError, format!("not valid JSON: {e}")),
        };
        return Incoming::Invalid {
            id: None,
            error: Error::new(kind, reason),
        };
    }
    let env: Envelope = match serde_json::from_str(text) {
        Ok(env) => env,
        Err(e) => {
            let kind = match e.classify() {
                serde_json::error::Category::Data => ErrorKind::InvalidRequest,
                _ => ErrorKind::ParseError,
            };
            let reason = match kind {
                ErrorKind::InvalidRequest => format!("not a JSON-RPC message: {e}"),
                _ => format!("not valid JSON: {e}"),
            };
            return Incoming::Invalid {
                id: None,
                error: Error::new(kind, reason),
            };
        }
    };
    let invalid = |id, reason: &str| Incoming::Invalid {
        id,
        error: Error::new(ErrorKind::InvalidRequest, reason),
    };
    let id = match env.id {
        Some(raw) if is_valid_id(raw) => Some(raw),
        Some(_) => return invalid(None, "id must be a string or an integer"),
        None => None,
    };
    if env.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return invalid(id, "jsonrpc must be \"2.0\"");
    }
    let Some(method) = env.method else {
        if id.is_some() && (env.result.is_some() || env.error.is_some()) {
            return Incoming::Response;
        }
        return invalid(id, "missing method");
    };
    let Ok(method) = serde_json::from_str::<String>(method.get()) else {
        return invalid(id, "method must be a string");
    };
    if let Some(p) = env.params {
        if !matches!(p.get().as_bytes().first(), Some(b'{') | Some(b'[')) {
            return invalid(id, "params must be an object or an array");
        }
    }
    match id {
        Some(id) => Incoming::Request {
            id,
            method,
            params: env.params,
        },
        None => Incoming::Notification {
            method,
            params: env.params,
        },
    }
}

/// Lines shorter than this are parsed as they are: lifting their content would save less
/// than the copy of the line around it costs.
const LIFT_AT: usize = 64 << 10;

/// The key whose string value is lifted out of a long line.
const LIFT_KEY: &[u8] = br#""content":""#;

/// What stands in the parsed line for content lifted out of it: a NUL, then 128 random bits
/// drawn when the process starts. A peer cannot send it (it cannot know it), so a `content`
/// equal to it is the lifted one and nothing else. Held as JSON text and as the string that
/// text parses to.
static PLACEHOLDER: std::sync::LazyLock<(String, String)> = std::sync::LazyLock::new(|| {
    let nonce = crate::random::hex(16);
    (format!("\\u0000{nonce}"), format!("\0{nonce}"))
});

/// A long line with the value of its first `"content":"` member taken out: `view` is the line
/// with that string replaced by [`placeholder`], and `content` is where the string's bytes
/// are in the line. They are known to hold no `"` and no `\`, and are **not** checked: the view is
/// checked as UTF-8 when it is parsed, but the content is checked by its reader (base64
/// decoding refuses every byte outside its alphabet, so checking it as UTF-8 too was a pass
/// over megabytes for nothing).
///
/// An upload chunk's line is megabytes of base64 in one string. serde_json finds the end of a
/// string a few bytes at a time, and a chunk's string was scanned twice (once for the
/// envelope's `params`, once for the method's `content`), three times with an audit log (its
/// paths), which made a fifth of the broker's time on an upload. Here its end is found once,
/// with SIMD, and the parsers read the short view.
#[derive(Debug)]
pub(crate) struct Lifted {
    /// The line with the content replaced.
    pub view: Vec<u8>,
    /// Where the content is in the line (base64 or text without escapes, unchecked).
    pub content: std::ops::Range<usize>,
}

/// The string a lifted content's `content` member parses to in [`Lifted::view`].
pub(crate) fn placeholder() -> &'static str {
    &PLACEHOLDER.1
}

/// Lifts the content out of `line` when that is worth it and safe: the line is long, its
/// first `"content":"` opens a long string with no escape in it.
/// Anything else (an escape, a key spelt with spaces or escapes) is left to serde_json, whole.
///
/// The match may not be the `content` the method reads (it may be in `_meta`, or the method
/// may not be `files/write`); then the method's own `content` is not the placeholder, and it
/// is read as parsed. Only `files/write` substitutes it.
pub(crate) fn lift(line: &[u8]) -> Option<Lifted> {
    if line.len() < LIFT_AT {
        return None;
    }
    let start = memchr::memmem::find(line, LIFT_KEY)? + LIFT_KEY.len();
    let len = memchr::memchr2(b'"', b'\\', &line[start..])?;
    let end = start + len;
    if line[end] != b'"' || len < LIFT_AT {
        return None;
    }
    let stand_in = PLACEHOLDER.0.as_bytes();
    let mut view = Vec::with_capacity(line.len() - len + stand_in.len());
    view.extend_from_slice(&line[..start]);
    view.extend_from_slice(stand_in);
    view.extend_from_slice(&line[end..]);
    Some(Lifted {
        view,
        content: start..end,
    })
}

/// MCP ids are strings or integers (never null, never fractional).
fn is_valid_id(raw: &RawValue) -> bool {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => true,
        Some(b'-' | b'0'..=b'9') => text.bytes().all(|b| b == b'-' || b.is_ascii_digit()),
        _ => false,
    }
}

/// Something that can write itself as the `result` of a response.
pub(crate) trait WriteResult {
    /// Appends this result's JSON to `out`.
    fn write_result(&self, out: &mut Vec<u8>);

    /// For a result whose large middle is held apart (a [`Body`]): the offset, in what
    /// [`WriteResult::write_result`] wrote, where that body belongs.
    fn body_at(&self) -> Option<usize> {
        None
    }
}

/// Any serializable value is a result.
#[derive(Debug)]
pub(crate) struct Json<T>(pub(crate) T);

impl<T: Serialize> WriteResult for Json<T> {
    fn write_result(&self, out: &mut Vec<u8>) {
        if serde_json::to_writer(&mut *out, &self.0).is_err() {
            // Our result types serialize infallibly (no maps with non-string keys); an
            // empty object keeps the frame valid if that ever changes.
            out.extend_from_slice(b"{}");
        }
    }
}

#[cfg(test)]
/// A complete response frame (newline included) for a successful request.
pub(crate) fn result_frame(id: &RawValue, result: &dyn WriteResult, size_hint: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + id.get().len() + size_hint);
    write_result_frame(&mut out, id, result, false);
    out
}

/// A response frame whose body (if any) stays in its own pages, placed where the result
/// says ([`WriteResult::body_at`]). `modern` (MCP 2026-07-28) adds `"resultType":"complete"`
/// to the result.
pub(crate) fn result_frame_with(
    id: &RawValue,
    result: &dyn WriteResult,
    size_hint: usize,
    body: Option<Body>,
    modern: bool,
) -> Outgoing {
    let mut out =
        Vec::with_capacity(48 + id.get().len() + body.as_ref().map_or(size_hint, |_| 256));
    let (start, added) = write_result_frame(&mut out, id, result, modern);
    let Some(body) = body else {
        return out.into();
    };
    let at = start + added + result.body_at().unwrap_or(0);
    Outgoing::with_body(out, at, body)
}

/// The member MCP 2026-07-28 requires in every result.
const COMPLETE: &[u8] = b"\"resultType\":\"complete\"";

/// Writes a response frame; returns where the result starts, and how many bytes `modern`
/// added at its front.
fn write_result_frame(
    out: &mut Vec<u8>,
    id: &RawValue,
    result: &dyn WriteResult,
    modern: bool,
) -> (usize, usize) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.get().as_bytes());
    out.extend_from_slice(b",\"result\":");
    let start = out.len();
    result.write_result(out);
    let mut added = 0;
    // Every result is a JSON object: the member goes first, before whatever it holds.
    if modern && out.get(start) == Some(&b'{') {
        let empty = out.get(start + 1) == Some(&b'}');
        let mut member = COMPLETE.to_vec();
        if !empty {
            member.push(b',');
        }
        added = member.len();
        out.splice(start + 1..start + 1, member);
    }
    out.extend_from_slice(b"}\n");
    (start, added)
}

#[derive(Serialize)]
struct ErrorData<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    reason: &'a str,
    #[serde(rename = "retryAfterMs", skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i32,
    message: String,
    data: ErrorData<'a>,
}

/// A complete error frame (newline included); `id` `None` is written as `null`.
pub(crate) fn error_frame(id: Option<&RawValue>, err: &Error) -> Vec<u8> {
    let wire = err.kind().wire();
    let obj = ErrorObject {
        code: wire.number,
        message: err.message(),
        data: ErrorData {
            code: wire.name,
            path: err.path(),
            reason: err.reason(),
            retry_after_ms: err.retry_after_ms(),
        },
    };
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.map_or("null", RawValue::get).as_bytes());
    out.extend_from_slice(b",\"error\":");
    Json(obj).write_result(&mut out);
    out.extend_from_slice(b"}\n");
    out
}

/// A notification frame (newline included); `params` `None` leaves the member out.
pub(crate) fn notification_frame(method: &str, params: Option<&dyn WriteResult>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + method.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    Json(method).write_result(&mut out);
    if let Some(params) = params {
        out.extend_from_slice(b",\"params\":");
        params.write_result(&mut out);
    }
    out.extend_from_slice(b"}\n");
    out
}

/// The first MCP revision of the new era (no `initialize`; `_meta` on every request; results
/// carry `resultType`).
pub(crate) const MODERN_VERSION: &str = "2026-07-28";

/// Whether `version` is a revision of the new era: a date (`YYYY-MM-DD`, as revisions are
/// named) of 2026-07-28 or later. Anything else ("9999", "2026-13") is no revision at all.
pub(crate) fn is_modern(version: &str) -> bool {
    let b = version.as_bytes();
    let shaped = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        });
    shaped && version >= MODERN_VERSION
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(line: &str) -> String {
        match parse(line.as_bytes()) {
            Incoming::Request { id, method, .. } => format!("req {} {method}", id.get()),
            Incoming::Notification { method, .. } => format!("note {method}"),
            Incoming::Response => "response".into(),
            Incoming::Invalid { id, error } => {
                format!(
                    "invalid {} {}",
                    id.map_or("-", RawValue::get),
                    error.kind().wire().number
                )
            }
        }
    }

    #[test]
    fn classifies_envelopes() {
        let cases = [
            (r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#, "req 1 ping"),
            (
                r#"{"jsonrpc":"2.0","id":"92","method":"ping"}"#,
                "req \"92\" ping",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                "note notifications/initialized",
            ),
            (r#"{"jsonrpc":"2.0","id":3,"result":{}}"#, "response"),
            (r#"not json"#, "invalid - -32700"),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"x""#,
                "invalid - -32700",
            ),
            (r#"[1,2]"#, "invalid - -32600"),
            (r#""str""#, "invalid - -32600"),
            (
                r#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#,
                "invalid 4 -32600",
            ),
            (r#"{"jsonrpc":"2.0","id":5,"method":7}"#, "invalid 5 -32600"),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                "invalid - -32600",
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                "invalid - -32600",
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"ping","params":3}"#,
                "invalid 6 -32600",
            ),
            (r#"{"jsonrpc":"2.0","id":7}"#, "invalid 7 -32600"),
        ];
        for (line, want) in cases {
            assert_eq!(kind_of(line), want, "{line}");
        }
    }

    #[test]
    fn invalid_utf8_anywhere_is_a_parse_error() {
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\"}";
        match parse(line) {
            Incoming::Invalid { id: None, error } => {
                assert_eq!(error.kind(), ErrorKind::ParseError)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn frames_echo_the_id() {
        let id = RawValue::from_string("\"a\\\"b\"".into()).unwrap();
        let f = result_frame(&id, &Json(serde_json::json!({})), 0);
        assert_eq!(
            f,
            b"{\"jsonrpc\":\"2.0\",\"id\":\"a\\\"b\",\"result\":{}}\n"
        );
        let e = error_frame(None, &Error::outside_roots().with_path("../x"));
        let v: serde_json::Value = serde_json::from_slice(&e).unwrap();
        assert_eq!(v["id"], serde_json::Value::Null);
        assert_eq!(v["error"]["code"], -31002);
        assert_eq!(v["error"]["data"]["code"], "PERMISSION_DENIED");
        assert_eq!(v["error"]["data"]["path"], "../x");
        assert_eq!(
            v["error"]["message"],
            "permission denied: outside every root"
        );
    }
}

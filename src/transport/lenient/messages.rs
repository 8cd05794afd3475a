//! A line's messages at their top level, as the loosest reader might take them: their
//! methods (whose a line is, for the relay's one gate) and their ids (who gets the error
//! when the line is refused).
//!
//! Every line from the server goes through these scans, including lines no JSON parser
//! reads, so they follow only strings and nesting: broken JSON, two messages on a line,
//! batches, bytes that are not UTF-8 cannot hide a method or an id from them.

use serde::de::IgnoredAny;
use serde_json::Value;

use super::{
    CONTROL_PREFIX, RequestId, decode_escapes, fold_case, is_broker_method, is_claimed,
    is_control_method, json_string, lenient_name, string_end, string_readings,
};
use crate::limits::MAX_IDS;

/// The `id` members at the top level of a line no JSON parser reads (a `NaN`, a stray byte,
/// a cut-off end), and whether it has a top-level `method` (may be a request), found by a
/// scan that follows only strings and nesting, so the request it answers can still get an
/// error. Member names are read as a lenient reader reads them ([`lenient_name`]: `"ID"` is
/// an id). At most [`MAX_IDS`] ids, distinct as [`RequestId`]s (`1` and `1.0` are one); ids
/// that do not parse (`NaN`) are left out.
pub(crate) fn lenient_envelope(line: &[u8]) -> (Vec<Value>, bool) {
    let mut ids: Vec<Value> = Vec::new();
    let mut seen: Vec<RequestId> = Vec::new();
    let mut method = false;
    let mut depth = 0usize;
    let mut expect_key = false;
    let mut i = 0;
    while i < line.len() && ids.len() < MAX_IDS {
        match line[i] {
            b'"' => {
                let end = string_end(line, i);
                let key = expect_key && depth == 1;
                let name = &line[i..end];
                expect_key = false;
                i = end;
                let name = if key {
                    serde_json::from_slice::<String>(name).ok()
                } else {
                    None
                };
                let name = name.as_deref().map(lenient_name);
                method |= name.as_deref() == Some("method");
                if name.as_deref() == Some("id") {
                    let at = skip_ws(line, end);
                    if line.get(at) == Some(&b':') {
                        let start = skip_ws(line, at + 1);
                        let stop = match line.get(start) {
                            Some(b'"') => string_end(line, start),
                            _ => line[start..]
                                .iter()
                                .position(|b| {
                                    matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace()
                                })
                                .map_or(line.len(), |p| start + p),
                        };
                        if let Ok(id) = serde_json::from_slice::<Value>(&line[start..stop]) {
                            if let Some(key) = RequestId::of_value(&id) {
                                if !seen.contains(&key) {
                                    seen.push(key);
                                    ids.push(id);
                                }
                            }
                        }
                    }
                }
                continue;
            }
            b'{' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' => expect_key = depth == 1,
            _ => {}
        }
        i += 1;
    }
    (ids, method)
}

/// A message's top-level members as the loosest reader might take them ([`any_message`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Envelope {
    /// Its ids, distinct as [`RequestId`]s, at most [`MAX_IDS`]: more than one when `id` is
    /// written twice (JavaScript and Python keep the last, other readers the first) or in
    /// another case (`"ID"`, which a case-insensitive reader takes).
    pub(crate) ids: Vec<RequestId>,
    /// A member reads as `method`.
    pub(crate) method: bool,
    /// A member reads as `result` or `error`.
    pub(crate) outcome: bool,
}

impl Envelope {
    /// Whether some reader may take it for an answer: it has a `result` or an `error` (a
    /// reader that looks for those first takes one even beside a `method`), or no `method`.
    pub(crate) fn may_answer(&self) -> bool {
        self.outcome || !self.method
    }
}

/// Whether `found` holds of a message of `line`: an object no other object holds (at the
/// top level, in a batch, in arrays in arrays, or one of several values on the line), each
/// read when it ends (or when the line does). Found by a scan that follows only strings and
/// nesting, so lines no parser reads (a `NaN`, a cut-off end, two values on one line, a
/// byte-order mark or a comment before them, bytes that are not UTF-8) hide no message from
/// it; member names are read as [`lenient_name`] reads them, each way [`string_readings`]
/// decodes them, and an id as [`RequestId::parse`] reads it. Stops at the first message
/// `found` holds of.
pub(crate) fn any_message(line: &[u8], mut found: impl FnMut(&Envelope) -> bool) -> bool {
    let mut message: Option<Envelope> = None;
    let mut depth = 0usize;
    // The depth of the open message's members (a reader that flattens arrays, or reads
    // one value after another, may take any object outside another for a message).
    let mut level = 0usize;
    let mut expect_key = false;
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b'"' => {
                let end = string_end(line, i);
                let key = expect_key && depth == level;
                expect_key = false;
                if let Some(env) = message.as_mut().filter(|_| key) {
                    let names = string_readings(&line[i..end]);
                    let is = |name: &str| names.iter().any(|n| lenient_name(n) == name);
                    env.method |= is("method");
                    env.outcome |= is("result") || is("error");
                    if is("id") {
                        let id = member_value(line, end).and_then(RequestId::parse);
                        if let Some(id) = id {
                            if !env.ids.contains(&id) && env.ids.len() < MAX_IDS {
                                env.ids.push(id);
                            }
                        }
                    }
                }
                i = end;
                continue;
            }
            b'{' => {
                depth += 1;
                if message.is_none() {
                    message = Some(Envelope::default());
                    level = depth;
                }
                expect_key = depth == level;
            }
            b'[' => depth += 1,
            b'}' | b']' => {
                if depth == level {
                    if let Some(env) = message.take() {
                        if found(&env) {
                            return true;
                        }
                    }
                    level = 0;
                }
                depth = depth.saturating_sub(1);
            }
            b',' => expect_key = message.is_some() && depth == level,
            _ => {}
        }
        i += 1;
    }
    message.is_some_and(|env| found(&env))
}

/// The value written after the member name that ends at `end` (its colon, blanks around),
/// as far as an id can be one: a string literal, or a token up to the next `,`, `}`, `]` or
/// blank. `None` without a colon.
fn member_value(line: &[u8], end: usize) -> Option<&[u8]> {
    let at = skip_ws(line, end);
    if line.get(at) != Some(&b':') {
        return None;
    }
    let start = skip_ws(line, at + 1);
    let stop = match line.get(start) {
        Some(b'"') => string_end(line, start),
        _ => line[start..]
            .iter()
            .position(|b| matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace())
            .map_or(line.len(), |p| start + p),
    };
    Some(&line[start..stop])
}

/// For `properties.rs` (through `transport::id_filters`): whether [`lenient_envelope`] takes
/// ids written `a` and `b` for one (answers them once); `None` when either is not one JSON
/// value (the scan may read it as part of another) or is read as no id.
#[cfg(test)]
pub(in crate::transport) fn id_filter(a: &str, b: &str) -> Option<bool> {
    let ids = |line: String| lenient_envelope(line.as_bytes()).0.len();
    for id in [a, b] {
        serde_json::from_str::<IgnoredAny>(id).ok()?;
        if ids(format!(r#"{{"id":{id}}}"#)) != 1 {
            return None;
        }
    }
    Some(ids(format!(r#"{{"id":{a},"id":{b}}}"#)) == 1)
}

fn skip_ws(line: &[u8], mut i: usize) -> usize {
    while line.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// Whether `line`, read as leniently as a host's reader might, names a method of the broker's
/// (`roots/list`, `files/…`) or of the proxy's own ([`CONTROL_PREFIX`]): any string in it,
/// decoded; and when it is not JSON at all (a `NaN`, a cut-off end, single quotes), any
/// mention of one in its text, escapes resolved, where a token may start (a reader that
/// repairs broken JSON could make a method of it). Bytes that are not UTF-8 and lone
/// surrogates are read both ways lenient readers have: as U+FFFD (Node, Python's `replace`)
/// and as nothing (Python's `ignore`). For lines the proxy cannot read as one JSON-RPC
/// message: a host's reader might still read one into them.
pub(in crate::transport) fn names_broker_method(line: &[u8]) -> bool {
    let json = std::str::from_utf8(line)
        .is_ok_and(|text| serde_json::from_str::<IgnoredAny>(text).is_ok());
    let replaced = String::from_utf8_lossy(line);
    let dropped: String = line.utf8_chunks().map(|c| c.valid()).collect();
    [(&*replaced, false), (&*dropped, true)]
        .into_iter()
        .any(|(text, drop)| {
            if !json && mentions_claimed(&decode_escapes(&mut text.chars(), drop, false)) {
                return true;
            }
            let mut chars = text.chars();
            while let Some(c) = chars.next() {
                if c == '"' && is_claimed(&json_string(&mut chars, drop)) {
                    return true;
                }
            }
            false
        })
}

/// Whether `text` mentions a claimed method where a token may start (not inside a word or a
/// path: `profiles/`, `/home/u/files/`).
fn mentions_claimed(text: &str) -> bool {
    let text = fold_case(text);
    let mut claimed = crate::methods::broker_names().chain([CONTROL_PREFIX]);
    claimed.any(|name| {
        text.match_indices(name).any(|(at, _)| {
            !text[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || "_/.-\\".contains(c))
        })
    })
}

/// Whose the messages in a line are, by their `method` members as the loosest reader might
/// take them ([`message_methods`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claims {
    /// A `method` names one of the broker's (`roots/list`, `files/…`).
    pub broker: bool,
    /// A `method` names one of the proxy's own control messages ([`CONTROL_PREFIX`]).
    pub control: bool,
}

impl Claims {
    /// A `method` member's value as written (the opening quote first): each reading of it.
    fn add(&mut self, literal: &[u8]) {
        for name in string_readings(literal) {
            self.broker |= is_broker_method(&name);
            self.control |= is_control_method(&name);
        }
    }
}

/// The methods of every message a line may hold, read by a scan no line can escape: it
/// follows only strings and nesting, so it reads JSON, broken JSON (a `NaN`, a cut-off end,
/// junk after the message, two messages on one line), bytes that are not UTF-8 and lone
/// surrogates (both ways: U+FFFD, nothing), and batches. A message is an object at the top
/// level or in a top-level array; every member of one whose name reads as `method` (escapes
/// decoded; in any case: `"METHOD"`) counts, however many there are: its value when it is a
/// string, and every string in it when it is an array (a JavaScript reader that indexes its
/// handlers with `["roots/list"]` takes it for `"roots/list"`), each read as
/// [`is_broker_method`] reads it. What lies deeper (params, results, an `input_required`'s
/// input requests: [`input_claims`](super::input_claims)) is not a message's method.
pub(crate) fn message_methods(line: &[u8]) -> Claims {
    #[derive(Clone, Copy)]
    enum Expect {
        Key,
        Colon { method: bool },
        Value { method: bool },
        Next,
    }
    struct Level {
        message: bool,
        expect: Expect,
    }
    let mut claims = Claims::default();
    // The containers open at the message levels (at most two: a batch and a message in it);
    // anything below them is only counted, to find its end.
    let mut levels: Vec<Level> = Vec::with_capacity(2);
    let mut deeper = 0usize;
    // Whether the container being skipped is a message's `method`.
    let mut method_array = false;
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'"' {
            let end = string_end(line, i);
            if deeper > 0 && method_array {
                claims.add(&line[i..end]);
            }
            if deeper == 0 {
                if let Some(level) = levels.last_mut().filter(|l| l.message) {
                    level.expect = match level.expect {
                        Expect::Key => Expect::Colon {
                            method: string_readings(&line[i..end])
                                .iter()
                                .any(|k| lenient_name(k) == "method"),
                        },
                        // A missing colon is read as there: nothing valid is missed.
                        Expect::Colon { method: true } | Expect::Value { method: true } => {
                            claims.add(&line[i..end]);
                            Expect::Next
                        }
                        _ => Expect::Next,
                    };
                }
            }
            i = end;
            continue;
        }
        if deeper > 0 {
            match b {
                b'{' | b'[' => deeper += 1,
                b'}' | b']' => {
                    deeper -= 1;
                    method_array &= deeper > 0;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b':' => {
                if let Some(level) = levels.last_mut() {
                    if let Expect::Colon { method } = level.expect {
                        level.expect = Expect::Value { method };
                    }
                }
            }
            b',' => {
                if let Some(level) = levels.last_mut() {
                    level.expect = Expect::Key;
                }
            }
            b'{' | b'[' => {
                let object = b == b'{';
                let batch = levels.len() == 1 && !levels[0].message;
                if let Some(level) = levels.last_mut() {
                    method_array = !object
                        && level.message
                        && matches!(
                            level.expect,
                            Expect::Colon { method: true } | Expect::Value { method: true }
                        );
                    level.expect = Expect::Next;
                }
                if object && (levels.is_empty() || batch) {
                    levels.push(Level {
                        message: true,
                        expect: Expect::Key,
                    });
                } else if !object && levels.is_empty() {
                    levels.push(Level {
                        message: false,
                        expect: Expect::Next,
                    });
                } else {
                    deeper = 1;
                }
            }
            b'}' | b']' => {
                levels.pop();
            }
            // Whitespace, numbers, literals, stray bytes: a value that is not a string.
            _ => {}
        }
        i += 1;
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_in_lines_no_parser_reads() {
        let (ids, method) =
            lenient_envelope(br#"{"jsonrpc":"2.0","id":7,"result":{"x":NaN,"id":9,"method":1}}"#);
        assert_eq!((ids, method), (vec![serde_json::json!(7)], false));
        let (ids, method) = lenient_envelope(br#"{"id":1,"method":"files/read","params":NaN}"#);
        assert_eq!((ids, method), (vec![serde_json::json!(1)], true));
        let (ids, _) =
            lenient_envelope(b"{\"a\":[{\"id\":1}],\"i\\u0064\" : \"q\\\"\" ,\"b\":\xff}");
        assert_eq!(ids, vec![serde_json::json!("q\"")]);
        assert!(lenient_envelope(br#"{"id":NaN}"#).0.is_empty());
        let (ids, _) = lenient_envelope(br#"{"id":1,"id":1.0,"id":"1","id":"a","id":"a"}"#);
        assert_eq!(ids, vec![serde_json::json!(1), serde_json::json!("a")]);
        assert!(lenient_envelope(br#"{"x":"\"id\":3"}"#).0.is_empty());
        let many: String = (0..20).map(|n| format!(r#""id":{n},"#)).collect();
        assert_eq!(
            lenient_envelope(format!("{{{many}}}").as_bytes()).0.len(),
            MAX_IDS
        );
    }

    #[test]
    fn every_message_and_every_spelling_of_its_id_is_read() {
        let all = |line: &[u8]| {
            let mut seen = Vec::new();
            any_message(line, |env| {
                seen.push(env.clone());
                false
            });
            seen
        };
        let n = |v: f64| RequestId::of_value(&serde_json::json!(v)).unwrap();
        let one = |ids: Vec<RequestId>, method, outcome| Envelope {
            ids,
            method,
            outcome,
        };
        assert_eq!(
            all(br#"{"id":11,"i\u0064":10.0,"ID":"10","result":{"id":3}}"#),
            [one(vec![n(11.0), n(10.0)], false, true)]
        );
        assert_eq!(
            all(br#" [{"id":1,"method":"x"},[{"id":2}],{"error":{},"id":"3"}]"#),
            [
                one(vec![n(1.0)], true, false),
                one(vec![n(2.0)], false, false),
                one(vec![n(3.0)], false, true)
            ]
        );
        // A batch after an object, an object after a batch, a byte-order mark and a comment
        // before a batch, arrays in arrays (the round 4 review's forms).
        assert_eq!(
            all(br#"{"method":"n"}[{"id":9,"result":1}] {"id":10,"result":1}"#),
            [
                one(vec![], true, false),
                one(vec![n(9.0)], false, true),
                one(vec![n(10.0)], false, true)
            ]
        );
        assert_eq!(
            all(b"\xef\xbb\xbf/**/[[[{\"id\":11,\"result\":1}]]]"),
            [one(vec![n(11.0)], false, true)]
        );
        // Lines no parser reads: a `NaN`, two messages, a cut-off end.
        assert_eq!(
            all(br#"{"x":NaN,"id":4}{"Result":1,"id":5"#),
            [
                one(vec![n(4.0)], false, false),
                one(vec![n(5.0)], false, true)
            ]
        );
        assert!(
            all(br#"{"id":null,"method":"x","params":{"id":6}}"#)[0]
                .ids
                .is_empty()
        );
        assert!(any_message(br#"[{"id":7},{"id":8}]"#, |env| env.ids == [n(7.0)]));
    }

    #[test]
    fn a_messages_method_is_read_however_it_is_written() {
        let broker = Claims {
            broker: true,
            control: false,
        };
        let control = Claims {
            broker: false,
            control: true,
        };
        for line in [
            &br#"{"jsonrpc":"2.0","id":[9],"method":"roots/list"}"#[..],
            br#"{"method":"ping","method":"files/x"}"#,
            br#"{"m\u0065thod":"roots\/list"}"#,
            br#"[{"id":1},{"METHOD":" Roots/List\u0000x"}]"#,
            b"{\"method\":\"roots/\xfflist\"}",
            br#"{"method":"roots/list\ud800"}"#,
            br#"{"a":NaN,"method":"files/read""#,
            br#"{"result":{}}{"method":"roots/list"}"#,
            br#"{"method" "roots/list"}"#,
            br#"{"method":["x",["roots/list"]]}"#,
            br#"{"method":"Roots/L\u0131st"}"#,
        ] {
            assert_eq!(
                message_methods(line),
                broker,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        assert_eq!(
            message_methods(br#"{"method":"notifications\/fsbroker/peer"}"#),
            control
        );
        // Below the message level, and in strings, a method is content.
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"roots/list"}}}}"#[..],
            br#"{"method":"tools/call","params":{"method":"roots/list"}}"#,
            br#"{"id":1,"result":[{"method":"files/read"}]}"#,
            br#"[[{"method":"roots/list"}]]"#,
            br#"{"text":"\"method\":\"roots/list\"","method":"x"}"#,
            br#"{"method":{"roots/list":1}}"#,
            br#"{"params":["roots/list"],"method":"x"}"#,
            br#"{"xmethod":"roots/list"}"#,
        ] {
            assert_eq!(
                message_methods(line),
                Claims::default(),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        // Not JSON: a mention anywhere that does not continue a word.
        assert!(names_broker_method(
            br#"{'jsonrpc':'2.0','id':[9],'method':'roots/list'}"#
        ));
        assert!(names_broker_method(br#"{"a":NaN,"b":"x"} roots\u002flist"#));
        assert!(!names_broker_method(br#"{"a":NaN,"b":"Profiles/x"}"#));
        assert!(!names_broker_method(br#"{"a":NaN,"b":"/home/u/files/x"}"#));
        assert!(names_broker_method(br#"{"a":NaN,"b":" Files/x"}"#));
        assert!(!names_broker_method(br#"{"text":"see roots/list"}"#));
    }
}

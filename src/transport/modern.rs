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

use crate::limits::{MAX_IDS, MAX_INPUT_REQUESTS, MAX_MEMBERS};
use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

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

/// Whether a method is the broker's to answer ([`crate::methods::is_broker_method`]), as a
/// lenient reader might dispatch it ([`lenient_name`]): a host that matches methods loosely
/// must never get one of the broker's.
pub(crate) fn is_broker_method(method: &str) -> bool {
    crate::methods::is_broker_method(&lenient_name(method))
}

/// The start of the methods of the proxy's own control messages to a shared broker
/// (`notifications/fsbroker/peer`): a server's own messages under it are never passed on, to
/// the host or to the broker.
pub(crate) const CONTROL_PREFIX: &str = "notifications/fsbroker/";

/// Whether a method is one of the proxy's own control messages ([`CONTROL_PREFIX`]), read as
/// leniently as [`is_broker_method`].
pub(crate) fn is_control_method(method: &str) -> bool {
    lenient_name(method).starts_with(CONTROL_PREFIX)
}

/// A method name (or a member name) as the loosest reader might take it: cut at the first
/// NUL (a C string ends there), trimmed, and case-folded ([`fold_case`]). No legitimate name
/// differs from its lenient name only in these ways, so reading loosely costs nothing but the
/// hostile lines.
fn lenient_name(method: &str) -> std::borrow::Cow<'_, str> {
    let cut = method.split('\0').next().unwrap_or_default().trim();
    if cut.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        std::borrow::Cow::Borrowed(cut)
    } else {
        std::borrow::Cow::Owned(fold_case(cut))
    }
}

/// `text` with every letter that any case-insensitive reader equates with an ASCII letter
/// made that letter, in lower case: ASCII by itself; `K` (Kelvin) and `İ` by their lower case
/// (JavaScript, Python, .NET's `ToLowerInvariant`); `ı`, `ſ` and ligatures such as `ﬁ` by
/// their upper case (.NET's `OrdinalIgnoreCase` compares upper cases: `"ı"` is `"i"` to it).
/// Other characters stay as they are.
fn fold_case(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
            continue;
        }
        let lower: String = c.to_lowercase().collect();
        if lower.is_ascii() {
            out.push_str(&lower);
            continue;
        }
        let upper: String = c.to_uppercase().collect();
        if upper.is_ascii() {
            out.push_str(&upper.to_ascii_lowercase());
            continue;
        }
        // A simple mapping that keeps a mark in the full one (`İ` → `i̇`): the letter.
        match lower.chars().next().filter(char::is_ascii_alphabetic) {
            Some(letter) => out.push(letter),
            None => out.push(c),
        }
    }
    out
}

/// A result asking for input.
#[derive(Debug)]
pub(crate) struct InputRequired {
    /// The response's id as the server wrote it.
    pub id: Option<Box<RawValue>>,
    /// [`id_key`] of that id.
    pub key: Option<String>,
    /// The input requests, by key, as the server wrote them.
    pub requests: BTreeMap<String, Box<RawValue>>,
    /// The method of each input request that names one (decoded).
    pub methods: BTreeMap<String, String>,
    /// The state to echo, as the server wrote it.
    pub state: Option<Box<RawValue>>,
    /// The whole result's members, for passing on a part of it.
    pub result: Members,
}

impl InputRequired {
    /// The method of the input request under `key`.
    pub(crate) fn method(&self, key: &str) -> Option<&str> {
        self.methods.get(key).map(String::as_str)
    }

    /// The keys of the input requests the broker answers (`roots/list`, `files/*`).
    pub(crate) fn broker_keys(&self) -> Vec<String> {
        self.requests
            .keys()
            .filter(|k| self.method(k).is_some_and(is_broker_method))
            .cloned()
            .collect()
    }

    /// The keys of every other input request (the host's: elicitation, sampling, …).
    pub(crate) fn host_keys(&self) -> Vec<String> {
        self.requests
            .keys()
            .filter(|k| !self.method(k).is_some_and(is_broker_method))
            .cloned()
            .collect()
    }
}

/// What a message from the server is, to the proxy.
#[derive(Debug)]
pub(crate) enum Checked {
    /// Anything but an `input_required` result: it may go to the host as written. Carries the
    /// [`id_key`] of its id, if it has one.
    Plain(Option<String>),
    /// Not JSON that reads one way only where it matters (a member written twice at the
    /// levels that decide where it goes, in any case; a deciding member spelled other than
    /// exactly; bytes that are not UTF-8, a lone surrogate, not an object, a result that is
    /// also a request, a request for the broker with a malformed envelope, too many input
    /// requests): the host could read into it what the proxy did not.
    Unreadable {
        /// Every id it was seen to carry (ids written twice: each).
        ids: Vec<Value>,
        /// Whether it reads as a request (it has a `method`), or might.
        request: bool,
        /// Whether it is known to hold a method that is the broker's or the proxy's
        /// ([`is_claimed`]) where a lenient host would act on it: its `method`, or the
        /// `method` of an input request anywhere in it ([`input_claims`]). Such a message
        /// never reaches the host.
        broker: bool,
    },
    /// An `input_required` result.
    Input(InputRequired),
}

/// Reads a message from the server for what matters to the host: whether it asks for input.
///
/// It is read the way the peers' parsers read it, the most lenient of them included: escapes
/// are decoded (`"input_\u0072equired"` is `input_required`), ids are compared by value
/// ([`id_key`]), member names as a case-insensitive reader matches them ([`lenient_name`]:
/// `"Result"`, `"InputRequests"` and `"Method"` are `result`, `inputRequests` and `method` to
/// .NET's web defaults), and a member written twice where it decides anything (the message's,
/// its result's, each input request's members, in any case; the input requests' keys as
/// written) makes it unreadable (JavaScript and Python keep the last, other parsers the
/// first; the proxy cannot know which the host uses). No byte pattern decides anything. Only
/// the deciding members are kept while reading ([`Skeleton`]): the rest of a large result is
/// skipped over, not built.
///
/// A message holding an input request whose `method` any lenient reading takes for the
/// broker's or the proxy's ([`input_claims`]: under any spelling of `inputRequests`, at any
/// depth, as an object, an array or a string) is an [`Checked::Input`] only in the one form
/// the proxy answers: the message's `result` (spelled so) with `"resultType":"input_required"`
/// (exactly) and `inputRequests` (spelled so, an object) whose input requests of the
/// broker's are objects with `method` (spelled so) written exactly as the broker's method
/// (`roots/list`, `files/…`), not a request, not an error, nothing written twice. Any other
/// is [`Checked::Unreadable`] with `broker` set: it never reaches the host, whatever its
/// `resultType` says (a reader may take `"INPUT_REQUIRED"`, `"input_required "` or `1` for
/// `input_required`).
pub(crate) fn check_response(line: &[u8]) -> Checked {
    // Readers disagree on bytes that are not UTF-8 (replaced, dropped, refused), and
    // serde_json does not check the strings it skips.
    let sk = std::str::from_utf8(line)
        .ok()
        .and_then(|text| serde_json::from_str::<Skeleton>(text).ok());
    let Some(sk) = sk else {
        // Its ids and whether it is a request are left to a more lenient reading.
        return Checked::Unreadable {
            ids: Vec::new(),
            request: false,
            broker: false,
        };
    };
    let request = sk.method.is_some();
    let claims = input_claims(line);
    let broker = sk.method_claimed || claims.top || claims.other;
    // The relay's gate (`proxy::route`) keeps every message whose method is the broker's or
    // the proxy's away from here; should one come all the same (a method in an array, which
    // a JavaScript reader indexing its handlers with it takes for the string), it is not the
    // host's.
    if sk.dup || sk.odd || sk.method_claimed || claims.other {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
            broker,
        };
    }
    let key = sk.ids.first().and_then(id_key);
    let result = sk.result.unwrap_or_default();
    let asks = result.result_type.as_ref().and_then(Value::as_str) == Some("input_required");
    if claims.top {
        // Only the form the proxy answers: the broker's input requests, each written exactly
        // as the broker's method (never the proxy's own).
        let exact = |m: &str| is_broker_method(m) && lenient_name(m) == m;
        let sound = asks
            && !request
            && !sk.error
            && result.requests_object
            && result
                .methods
                .iter()
                .any(|(_, m)| m.as_deref().is_some_and(is_claimed))
            && result
                .methods
                .iter()
                .all(|(_, m)| m.as_deref().is_none_or(|m| !is_claimed(m) || exact(m)));
        if !sound {
            return Checked::Unreadable {
                ids: sk.ids,
                request,
                broker: true,
            };
        }
    } else if !asks {
        return Checked::Plain(key);
    }
    if request || sk.error {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
            broker,
        };
    }
    let methods = result
        .methods
        .into_iter()
        .filter_map(|(k, m)| Some((k, m?)))
        .collect();
    // The same line, its members kept as written: with no deciding member written twice or
    // spelled otherwise, they say what the skeleton says.
    let unreadable = || Checked::Unreadable {
        ids: Vec::new(),
        request: false,
        broker,
    };
    let Ok(raw_msg) = serde_json::from_slice::<Members>(line) else {
        return unreadable();
    };
    let Some(result) = raw_msg.get("result").and_then(|r| members(r)) else {
        return unreadable();
    };
    let requests = match result.get("inputRequests") {
        Some(r) => match serde_json::from_str(r.get()) {
            Ok(requests) => requests,
            Err(_) => return unreadable(),
        },
        None => BTreeMap::new(),
    };
    Checked::Input(InputRequired {
        id: raw_msg.get("id").cloned(),
        key,
        requests,
        methods,
        state: result.get("requestState").cloned(),
        result,
    })
}

/// Where a line's input requests name a method that is the broker's or the proxy's
/// ([`is_claimed`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputClaims {
    /// In the place the proxy answers them: an object under the message's `result`'s
    /// `inputRequests` (either in any spelling), its `method` (in any spelling) a string.
    pub top: bool,
    /// Anywhere else, or in another form: under an `inputRequests` member at any other depth
    /// (a result's `_meta`, a nested result, a task, an input request's `params`), in an
    /// `inputRequests` that is an array, an input request that is a string or an array, a
    /// `method` that is an array or an object.
    pub other: bool,
}

/// The input requests of a line that name a claimed method, found by a scan that follows
/// only strings and nesting (as [`message_methods`]), so no line escapes it: every object
/// member whose name reads as `inputRequests` to a lenient reader ([`lenient_name`]: escapes
/// decoded, in any case, trimmed; bytes that are not UTF-8 and lone surrogates read both
/// ways), at any depth and however many there are, is read as input requests. Each of its
/// members (or elements) is an input request: an object's members whose names read as
/// `method` count; an input request, or a `method`, that is not an object or a string counts
/// by every string in it (a JavaScript reader that indexes its handlers with `["roots/list"]`
/// takes it for `"roots/list"`). A host that reads no such structure loses nothing: no peer
/// writes one for the broker's methods but in the one place the proxy answers.
pub(crate) fn input_claims(line: &[u8]) -> InputClaims {
    /// What a value is, by where it stands.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Slot {
        /// The top-level object.
        Message,
        /// The message's `result`.
        Result,
        /// Input requests; `top` when they are the message's `result.inputRequests`.
        Requests { top: bool },
        /// One input request.
        Entry { top: bool },
        /// An input request's `method`.
        Method { top: bool },
        /// Every string in it, at any depth, counts.
        Any,
        /// Anything else.
        Plain,
    }
    #[derive(Clone, Copy)]
    enum Expect {
        Key,
        Colon(Slot),
        Value(Slot),
        Next,
    }
    struct Frame {
        object: bool,
        role: Slot,
        expect: Expect,
    }
    /// A value of a member named by `key` (its literal) in an object of `role`.
    fn member_slot(role: Slot, key: &[u8]) -> Slot {
        match role {
            Slot::Any | Slot::Method { .. } => Slot::Any,
            Slot::Requests { top } => Slot::Entry { top },
            Slot::Entry { top } if key_is(key, "method") => Slot::Method { top },
            Slot::Message if key_is(key, "result") => Slot::Result,
            Slot::Result if key_is(key, "inputrequests") => Slot::Requests { top: true },
            _ if key_is(key, "inputrequests") => Slot::Requests { top: false },
            _ => Slot::Plain,
        }
    }
    /// An element of an array of `role`.
    fn element_slot(role: Slot) -> Slot {
        match role {
            Slot::Any | Slot::Method { .. } => Slot::Any,
            // Input requests in an array are never the proxy's to answer.
            Slot::Requests { .. } => Slot::Entry { top: false },
            _ => Slot::Plain,
        }
    }
    /// The role of a container standing in `slot`.
    fn role(slot: Slot, object: bool) -> Slot {
        match (slot, object) {
            (Slot::Message | Slot::Result, false) => Slot::Plain,
            (Slot::Requests { .. }, false) => Slot::Requests { top: false },
            (Slot::Entry { .. }, false) | (Slot::Method { .. }, _) => Slot::Any,
            (slot, _) => slot,
        }
    }
    /// A string standing in `slot`.
    fn string(claims: &mut InputClaims, slot: Slot, literal: &[u8]) {
        let top = match slot {
            Slot::Method { top } => top,
            Slot::Entry { .. } | Slot::Any => false,
            _ => return,
        };
        if string_readings(literal).iter().any(|s| is_claimed(s)) {
            if top {
                claims.top = true;
            } else {
                claims.other = true;
            }
        }
    }
    // Deeper than any JSON reader in the proxy goes (serde_json stops at 128): past this,
    // containers are only counted.
    const MAX_DEPTH: usize = 256;
    let mut claims = InputClaims::default();
    let mut frames: Vec<Frame> = Vec::new();
    let mut deeper = 0usize;
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'"' {
            let end = string_end(line, i);
            let literal = &line[i..end];
            i = end;
            let Some(frame) = frames.last_mut() else {
                continue;
            };
            if deeper > 0 {
                if frame.role == Slot::Any {
                    string(&mut claims, Slot::Any, literal);
                }
                continue;
            }
            if !frame.object {
                string(&mut claims, element_slot(frame.role), literal);
                continue;
            }
            frame.expect = match frame.expect {
                Expect::Key => Expect::Colon(member_slot(frame.role, literal)),
                // A missing colon is read as there: nothing valid is missed.
                Expect::Colon(slot) | Expect::Value(slot) => {
                    string(&mut claims, slot, literal);
                    Expect::Next
                }
                Expect::Next => Expect::Next,
            };
            continue;
        }
        match b {
            b'{' | b'[' => {
                let object = b == b'{';
                let slot = match frames.last_mut() {
                    None => Slot::Message,
                    Some(frame) if frame.object => {
                        let slot = match frame.expect {
                            Expect::Colon(slot) | Expect::Value(slot) => slot,
                            _ if frame.role == Slot::Any => Slot::Any,
                            _ => Slot::Plain,
                        };
                        frame.expect = Expect::Next;
                        slot
                    }
                    Some(frame) => element_slot(frame.role),
                };
                if deeper > 0 || frames.len() >= MAX_DEPTH {
                    deeper += 1;
                } else {
                    frames.push(Frame {
                        object,
                        role: role(slot, object),
                        expect: Expect::Key,
                    });
                }
            }
            b'}' | b']' => {
                if deeper > 0 {
                    deeper -= 1;
                } else {
                    frames.pop();
                }
            }
            b':' if deeper == 0 => {
                if let Some(frame) = frames.last_mut().filter(|f| f.object) {
                    if let Expect::Colon(slot) = frame.expect {
                        frame.expect = Expect::Value(slot);
                    }
                }
            }
            b',' if deeper == 0 => {
                if let Some(frame) = frames.last_mut().filter(|f| f.object) {
                    frame.expect = Expect::Key;
                }
            }
            // Whitespace, numbers, literals, stray bytes: a value that is not a string.
            _ => {}
        }
        i += 1;
    }
    claims
}

/// Whether a member name (its literal, from the opening quote) reads as `name` (in lower
/// case) to a lenient reader ([`lenient_name`]). Plain ASCII names are compared as they are,
/// the rest decoded both ways ([`string_readings`]).
fn key_is(literal: &[u8], name: &str) -> bool {
    let body = literal.get(1..).unwrap_or_default();
    let body = body.strip_suffix(b"\"").unwrap_or(body);
    if body
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'\\')
    {
        return body.trim_ascii().eq_ignore_ascii_case(name.as_bytes());
    }
    string_readings(literal)
        .iter()
        .any(|k| lenient_name(k) == name)
}

/// The `id` members at the top level of a line no JSON parser reads (a `NaN`, a stray byte,
/// a cut-off end), and whether it has a top-level `method` (may be a request), found by a
/// scan that follows only strings and nesting, so the request it answers can still get an
/// error. Member names are read as a lenient reader reads them ([`lenient_name`]: `"ID"` is
/// an id). At most [`MAX_IDS`] ids, distinct; ids that do not parse (`NaN`) are left out.
pub(crate) fn lenient_envelope(line: &[u8]) -> (Vec<Value>, bool) {
    let mut ids: Vec<Value> = Vec::new();
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
                            if id_key(&id).is_some() && !ids.contains(&id) {
                                ids.push(id);
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

/// Just past the end of the string whose opening quote is at `start` (or the line's end).
fn string_end(line: &[u8], start: usize) -> usize {
    // Every line from the server is scanned: long strings (a file's content) are skipped
    // a word at a time, from quote to quote. A quote ends the string unless an odd number of
    // backslashes stands before it (each backslash escapes the byte after it); the runs
    // counted back lie between consecutive quotes, so the scan stays linear.
    let body = start + 1;
    let mut i = body;
    while let Some(at) = line.get(i..).and_then(|rest| memchr::memchr(b'"', rest)) {
        let quote = i + at;
        let backslashes = line[body..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return quote + 1;
        }
        i = quote + 1;
    }
    line.len()
}

fn skip_ws(line: &[u8], mut i: usize) -> usize {
    while line.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// `line` as a JSON value, or `None` when it is not JSON or some object in it has a member
/// written twice. For the host's small messages (its `notifications/cancelled`).
pub(crate) fn strict(line: &[u8]) -> Option<Value> {
    let value: Value = serde_json::from_slice(line).ok()?;
    serde_json::from_slice::<NoDuplicates>(line).ok()?;
    Some(value)
}

use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Passes when no object in the JSON has a member written twice.
struct NoDuplicates;

impl<'de> serde::Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NoDuplicates;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON with no member written twice")
            }
            fn visit_bool<E>(self, _: bool) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_i64<E>(self, _: i64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_u64<E>(self, _: u64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_f64<E>(self, _: f64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_str<E>(self, _: &str) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_unit<E>(self) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NoDuplicates, A::Error> {
                while seq.next_element::<NoDuplicates>()?.is_some() {}
                Ok(NoDuplicates)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoDuplicates, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if !seen.insert(key) {
                        return Err(A::Error::custom("a member is written twice"));
                    }
                    map.next_value::<NoDuplicates>()?;
                }
                Ok(NoDuplicates)
            }
        }
        d.deserialize_any(V)
    }
}

/// The members of a server message that decide where it goes, read in one pass; everything
/// else is skipped. Members are matched by their lenient names ([`lenient_name`]), as a
/// case-insensitive reader matches them.
#[derive(Default)]
struct Skeleton {
    /// Every `id` (a scalar; more than one when written twice).
    ids: Vec<Value>,
    /// Its `method`, if it has one (any scalar; `null` for an array or an object).
    method: Option<Value>,
    /// Whether its `method` (a string, or a string in an array) is claimed ([`is_claimed`]).
    method_claimed: bool,
    /// Whether it has an `error`.
    error: bool,
    /// Its `result`, when that is an object.
    result: Option<ResultSkeleton>,
    /// Whether a deciding member is written twice (in any case).
    dup: bool,
    /// Whether a deciding member is spelled other than exactly (`"Result"`, `"ID"`), or
    /// `inputRequests` is an array.
    odd: bool,
}

#[derive(Default)]
struct ResultSkeleton {
    result_type: Option<Value>,
    /// Whether `inputRequests` is an object.
    requests_object: bool,
    /// Each input request's key and method (when it names one as a string).
    methods: Vec<(String, Option<String>)>,
    dup: bool,
    odd: bool,
}

/// The deciding member that `key` names to a lenient reader, among `names` (as spelled
/// exactly), and whether it is spelled exactly so.
fn deciding(key: &str, names: &[&'static str]) -> Option<(&'static str, bool)> {
    if let Some(name) = names.iter().find(|n| **n == key) {
        return Some((name, true));
    }
    let folded = lenient_name(key);
    names
        .iter()
        .find(|n| n.eq_ignore_ascii_case(&folded))
        .map(|n| (*n, false))
}

/// A scalar member (`None` for an object or an array, skipped).
struct Scalar(Option<Value>);

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::Bool(v))))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(v))))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(v))))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::from(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::String(v.to_owned()))))
            }
            fn visit_unit<E>(self) -> Result<Scalar, E> {
                Ok(Scalar(Some(Value::Null)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A `method` member: the string it is (`None` for anything else), and whether a lenient
/// reader may take it for a claimed method ([`is_claimed`]): the string, or any string in it
/// when it is an array (JavaScript makes `["roots/list"]` the key `"roots/list"`).
struct MethodValue {
    text: Option<String>,
    claimed: bool,
}

impl<'de> serde::Deserialize<'de> for MethodValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MethodValue;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<MethodValue, E> {
                Ok(MethodValue::none())
            }
            fn visit_i64<E>(self, _: i64) -> Result<MethodValue, E> {
                Ok(MethodValue::none())
            }
            fn visit_u64<E>(self, _: u64) -> Result<MethodValue, E> {
                Ok(MethodValue::none())
            }
            fn visit_f64<E>(self, _: f64) -> Result<MethodValue, E> {
                Ok(MethodValue::none())
            }
            fn visit_str<E>(self, v: &str) -> Result<MethodValue, E> {
                Ok(MethodValue {
                    text: Some(v.to_owned()),
                    claimed: is_claimed(v),
                })
            }
            fn visit_unit<E>(self) -> Result<MethodValue, E> {
                Ok(MethodValue::none())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MethodValue, A::Error> {
                let mut claimed = false;
                while let Some(v) = seq.next_element::<MethodValue>()? {
                    claimed |= v.claimed;
                }
                Ok(MethodValue {
                    text: None,
                    claimed,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MethodValue, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MethodValue::none())
            }
        }
        d.deserialize_any(V)
    }
}

impl MethodValue {
    fn none() -> MethodValue {
        MethodValue {
            text: None,
            claimed: false,
        }
    }
}

/// Calls `member` for each member of an object, noting members written twice: by their
/// lenient names ([`lenient_name`]) when `fold`, else as written.
fn each_member<'de, A, F>(mut map: A, fold: bool, mut member: F) -> Result<bool, A::Error>
where
    A: MapAccess<'de>,
    F: FnMut(&str, &mut A) -> Result<(), A::Error>,
{
    let mut seen = std::collections::HashSet::new();
    let mut dup = false;
    while let Some(key) = map.next_key::<String>()? {
        if seen.len() >= MAX_MEMBERS {
            return Err(serde::de::Error::custom("too many members"));
        }
        member(&key, &mut map)?;
        let name = if fold {
            lenient_name(&key).into_owned()
        } else {
            key
        };
        dup |= !seen.insert(name);
    }
    Ok(dup)
}

/// Skips any JSON value that is not an object; reads an object with `$visit`.
macro_rules! object_or_skip {
    ($name:ident, $out:ty, $visit:expr) => {
        struct $name(Option<$out>);
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = $name;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("any JSON value")
                    }
                    fn visit_bool<E>(self, _: bool) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_i64<E>(self, _: i64) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_u64<E>(self, _: u64) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_f64<E>(self, _: f64) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_str<E>(self, _: &str) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_unit<E>(self) -> Result<$name, E> {
                        Ok($name(None))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<$name, A::Error> {
                        while seq.next_element::<IgnoredAny>()?.is_some() {}
                        Ok($name(None))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<$name, A::Error> {
                        let visit: fn(A) -> Result<$out, A::Error> = $visit;
                        visit(map).map(|v| $name(Some(v)))
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

/// One input request, as read: its `method` (a string, as written), whether a member is
/// written twice (in any case), and whether `method` or `params` is spelled otherwise.
#[derive(Default)]
struct Entry {
    method: Option<String>,
    dup: bool,
    odd: bool,
}

object_or_skip!(EntrySkeleton, Entry, |map| {
    let mut entry = Entry::default();
    entry.dup = each_member(map, true, |key, map| {
        match deciding(key, &["method", "params"]) {
            Some((name, exact)) => {
                entry.odd |= !exact;
                if name == "method" {
                    entry.method = map.next_value::<MethodValue>()?.text;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    })?;
    Ok(entry)
});

/// `inputRequests`: each key's method (at most [`MAX_INPUT_REQUESTS`] of them), whether a
/// key or an input request's member is written twice, whether one is spelled otherwise; or,
/// for an array, nothing but that it is one. `None` for anything else.
struct RequestsSkeleton(Option<Requests>);

#[derive(Default)]
struct Requests {
    entries: Vec<(String, Option<String>)>,
    array: bool,
    dup: bool,
    odd: bool,
}

impl<'de> serde::Deserialize<'de> for RequestsSkeleton {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RequestsSkeleton;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_unit<E>(self) -> Result<RequestsSkeleton, E> {
                Ok(RequestsSkeleton(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<RequestsSkeleton, A::Error> {
                // What the elements name is [`input_claims`]'s to find.
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(RequestsSkeleton(Some(Requests {
                    array: true,
                    ..Requests::default()
                })))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RequestsSkeleton, A::Error> {
                let mut r = Requests::default();
                let mut inner = false;
                // The keys are the server's own names for its requests: compared as written
                // by every reader.
                let dup = each_member(map, false, |key, map| {
                    if r.entries.len() >= MAX_INPUT_REQUESTS {
                        return Err(serde::de::Error::custom("too many input requests"));
                    }
                    let entry = map.next_value::<EntrySkeleton>()?.0.unwrap_or_default();
                    inner |= entry.dup;
                    r.odd |= entry.odd;
                    r.entries.push((key.to_owned(), entry.method));
                    Ok(())
                })?;
                r.dup = dup || inner;
                Ok(RequestsSkeleton(Some(r)))
            }
        }
        d.deserialize_any(V)
    }
}

// `result`: its `resultType` and input requests.
object_or_skip!(ResultOrSkip, ResultSkeleton, |map| {
    let mut r = ResultSkeleton::default();
    let mut inner = false;
    let dup = each_member(map, true, |key, map| {
        match deciding(key, &["resultType", "inputRequests", "requestState"]) {
            Some((name, exact)) => {
                r.odd |= !exact;
                match name {
                    "resultType" => r.result_type = map.next_value::<Scalar>()?.0,
                    "inputRequests" => {
                        if let Some(requests) = map.next_value::<RequestsSkeleton>()?.0 {
                            r.requests_object = !requests.array;
                            r.odd |= requests.odd || requests.array;
                            inner |= requests.dup;
                            r.methods = requests.entries;
                        }
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            None => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    })?;
    r.dup = dup || inner;
    Ok(r)
});

impl<'de> serde::Deserialize<'de> for Skeleton {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Skeleton;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON-RPC message (an object)")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Skeleton, A::Error> {
                let mut sk = Skeleton::default();
                let mut inner = false;
                let dup = each_member(map, true, |key, map| {
                    let Some((name, exact)) = deciding(key, &["id", "method", "error", "result"])
                    else {
                        map.next_value::<IgnoredAny>()?;
                        return Ok(());
                    };
                    sk.odd |= !exact;
                    match name {
                        "id" => {
                            if let Some(id) = map.next_value::<Scalar>()?.0 {
                                if sk.ids.len() < MAX_IDS && !sk.ids.contains(&id) {
                                    sk.ids.push(id);
                                }
                            }
                        }
                        "method" => {
                            let method = map.next_value::<MethodValue>()?;
                            sk.method_claimed |= method.claimed;
                            sk.method = Some(method.text.map_or(Value::Null, Value::String));
                        }
                        "error" => {
                            sk.error = true;
                            map.next_value::<IgnoredAny>()?;
                        }
                        _ => {
                            sk.result = map.next_value::<ResultOrSkip>()?.0;
                            if let Some(r) = &sk.result {
                                inner |= r.dup;
                                sk.odd |= r.odd;
                            }
                        }
                    }
                    Ok(())
                })?;
                sk.dup = dup || inner;
                Ok(sk)
            }
        }
        d.deserialize_any(V)
    }
}

/// What identifies a JSON-RPC id the way the peers compare ids: strings by their decoded
/// text, numbers by value (`3`, `3.0` and `3e0` are one id to JavaScript and to Python).
/// `None` for anything that is not an id.
pub(crate) fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::String(s) => Some(format!("s{s}")),
        Value::Number(n) => {
            let f = n.as_f64()?;
            if f.fract() == 0.0 && f.abs() < 1e18 {
                Some(format!("n{}", f as i64))
            } else {
                Some(format!("n{f:?}"))
            }
        }
        _ => None,
    }
}

/// [`id_key`] of an id as written.
pub(crate) fn raw_id_key(id: &RawValue) -> Option<String> {
    id_key(&serde_json::from_str(id.get()).ok()?)
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

/// Whether `line`, read as leniently as a host's reader might, names a method of the broker's
/// (`roots/list`, `files/…`) or of the proxy's own ([`CONTROL_PREFIX`]): any string in it,
/// decoded; and when it is not JSON at all (a `NaN`, a cut-off end, single quotes), any
/// mention of one in its text, escapes resolved, where a token may start (a reader that
/// repairs broken JSON could make a method of it). Bytes that are not UTF-8 and lone
/// surrogates are read both ways lenient readers have: as U+FFFD (Node, Python's `replace`)
/// and as nothing (Python's `ignore`). For lines the proxy cannot read as one JSON-RPC
/// message: a host's reader might still read one into them.
pub(super) fn names_broker_method(line: &[u8]) -> bool {
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

/// Whether a method is the broker's or the proxy's own: never the host's.
fn is_claimed(method: &str) -> bool {
    is_broker_method(method) || is_control_method(method)
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
/// input requests: [`input_claims`]) is not a message's method.
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

/// A JSON string literal as written (from its opening quote), decoded each way a lenient
/// reader may: bytes that are not UTF-8 and lone surrogates as U+FFFD, and as nothing.
fn string_readings(literal: &[u8]) -> [String; 2] {
    let body = literal.get(1..).unwrap_or_default();
    let replaced = String::from_utf8_lossy(body);
    let dropped: String = body.utf8_chunks().map(|c| c.valid()).collect();
    [
        json_string(&mut replaced.chars(), false),
        json_string(&mut dropped.chars(), true),
    ]
}

/// The rest of a JSON string literal whose opening quote was just read, decoded; stops after
/// the closing quote or at the end of the text. A lone surrogate becomes U+FFFD, or nothing
/// when `drop`.
fn json_string(chars: &mut std::str::Chars, drop: bool) -> String {
    decode_escapes(chars, drop, true)
}

/// `chars` with JSON's escapes decoded, up to and past a closing quote when `quote_ends`
/// (else to the end). A lone surrogate becomes U+FFFD, or nothing when `drop`.
fn decode_escapes(chars: &mut std::str::Chars, drop: bool, quote_ends: bool) -> String {
    let mut out = String::new();
    let lone = |out: &mut String| {
        if !drop {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    };
    let mut high: Option<u32> = None;
    while let Some(c) = chars.next() {
        let unit = match c {
            '"' if quote_ends => break,
            '\\' => match chars.next() {
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    match u32::from_str_radix(&hex, 16) {
                        Ok(u) => Some(u),
                        Err(_) => {
                            lone(&mut out);
                            continue;
                        }
                    }
                }
                Some(e) => {
                    let c = match e {
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        other => other,
                    };
                    if high.take().is_some() {
                        lone(&mut out);
                    }
                    out.push(c);
                    continue;
                }
                None => break,
            },
            c => {
                if high.take().is_some() {
                    lone(&mut out);
                }
                out.push(c);
                continue;
            }
        };
        let Some(u) = unit else { continue };
        match (high.take(), u) {
            (Some(h), 0xDC00..=0xDFFF) => {
                let c = 0x10000 + ((h - 0xD800) << 10) + (u - 0xDC00);
                out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            (h, 0xD800..=0xDBFF) => {
                if h.is_some() {
                    lone(&mut out);
                }
                high = Some(u);
            }
            (h, u) => {
                if h.is_some() {
                    lone(&mut out);
                }
                match char::from_u32(u) {
                    Some(c) => out.push(c),
                    None => lone(&mut out),
                }
            }
        }
    }
    if high.is_some() {
        lone(&mut out);
    }
    out
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
        assert!(lenient_envelope(br#"{"x":"\"id\":3"}"#).0.is_empty());
        let many: String = (0..20).map(|n| format!(r#""id":{n},"#)).collect();
        assert_eq!(
            lenient_envelope(format!("{{{many}}}").as_bytes()).0.len(),
            MAX_IDS
        );
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

    #[test]
    fn input_requests_are_read_however_they_are_written() {
        // The one form the proxy answers (escapes decoded; an unknown files/ method the
        // broker refuses itself; the host's own input requests beside them).
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"roots/list"}},"requestState":"s"}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_\u0072equired","inputRequests":{"r":{"method":"roots\/list"},"e":{"method":"elicitation/create","params":{"message":"files/x"}}}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"files/steal","params":{"path":"roots/list"}}}}}"#,
        ] {
            assert!(
                matches!(check_response(line), Checked::Input(_)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        // Every other form of a claimed input request: never the host's.
        let r = r#"{"r":{"method":"roots/list"}}"#;
        for line in [
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"Input_Required","inputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required ","inputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"complete","inputRequests":{r}}}}}"#
            ),
            format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"inputRequests":{r}}}}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":1,"inputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"Result":{{"resultType":"input_required","inputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"ResultType":"input_required","inputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","InputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","\u0131nputRequests":{r}}}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"input_required","inputRequests":{{"e":{{"method":"elicitation/create"}}}},"inputrequests":{r}}}}}"#
            ),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"Method":"roots/list"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"Roots/List"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"roots/l\u0131st"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":["roots/list"]}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":"roots/list"}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":[{"method":"roots/list"}]}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"r":{"method":"notifications/fsbroker/peer"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"e":{"method":"elicitation/create","params":{"inputRequests":{"r":{"method":"roots/list"}}}}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","_meta":{"x":{"resultType":"input_required","inputRequests":{"r":{"method":"files/read"}}}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"status":"input_required","INPUTREQUESTS":{"r":{"method":"roots/list"}}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"inputRequests":{"r":{"METHOD":" files/read "}}}]}}"#.into(),
            r#"{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{"inputRequests":{"r":{"method":"roots/list"}}}}"#.into(),
            r#"{"jsonrpc":"2.0","id":1,"method":["roots/list"]}"#.into(),
        ] {
            match check_response(line.as_bytes()) {
                Checked::Unreadable { broker: true, .. } => {}
                other => panic!("{line}: {other:?}"),
            }
        }
        // Content that merely mentions the broker's methods, and the host's own input
        // requests however the result is spelled, pass as written.
        for line in [
            &br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"roots/list"}],"structuredContent":{"method":"roots/list","requests":{"r":{"method":"files/read"}}}}}"#[..],
            br#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"INPUT_REQUIRED","inputRequests":{"e":{"method":"elicitation/create"}}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\ud800 files/x"}]}}"#,
            br#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":{"method":"roots/list"}}}"#,
        ] {
            assert!(
                matches!(check_response(line), Checked::Plain(_)),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        // Spelled otherwise, naming nothing of the broker's: unreadable, relayed as written.
        assert!(matches!(
            check_response(br#"{"jsonrpc":"2.0","ID":1,"result":{}}"#),
            Checked::Unreadable { broker: false, .. }
        ));
        // The scan finds input requests in lines no parser reads, and only where they are.
        assert_eq!(
            input_claims(b"{\"id\":1,\"result\":{\"x\":NaN,\"inputRequests\":{\"r\":{\"method\":\"roots/\xfflist\"}}}}"),
            InputClaims {
                top: true,
                other: false
            }
        );
        assert_eq!(
            input_claims(br#"{"id":1,"result":{"inputRequests":{"r":{"params":{"method":"roots/list"}}}},"method":"files/x"}"#),
            InputClaims::default()
        );
    }

    #[test]
    fn strings_end_at_their_first_unescaped_quote() {
        // The scan that stops at every backslash and skips the byte after it.
        fn reference(line: &[u8], start: usize) -> usize {
            let mut i = start + 1;
            while i < line.len() {
                match line[i] {
                    b'"' => return i + 1,
                    b'\\' => i += 2,
                    _ => i += 1,
                }
            }
            line.len()
        }
        let alphabet = [b'"', b'\\', b'a', 0xff];
        let mut checked = 0;
        for len in 0..=8u32 {
            for n in 0..4usize.pow(len) {
                let mut line = vec![b'"'];
                line.extend((0..len).map(|k| alphabet[n / 4usize.pow(k) % 4]));
                assert_eq!(string_end(&line, 0), reference(&line, 0), "{line:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 87381);
        assert_eq!(string_end(br#"x "a\\\"b" y"#, 2), 10);
    }

    #[test]
    fn names_are_folded_as_case_insensitive_readers_fold_them() {
        assert_eq!(lenient_name("Roots/L\u{131}st"), "roots/list");
        assert_eq!(lenient_name(" \u{17f}\u{130}"), "si");
        assert_eq!(
            lenient_name("notifications/fsbro\u{212a}er/x"),
            "notifications/fsbroker/x"
        );
        assert_eq!(lenient_name("\u{fb01}les/read"), "files/read");
        assert_eq!(lenient_name("caf\u{e9}"), "caf\u{e9}");
        assert!(is_broker_method("\u{fb01}les/read\u{0}x"));
    }

    #[test]
    fn a_deciding_object_with_too_many_members_is_unreadable() {
        let members: String = (0..MAX_MEMBERS + 1)
            .map(|n| format!(r#""m{n}":0,"#))
            .collect();
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{{members}"resultType":"input_required","inputRequests":{{"r":{{"method":"roots/list"}}}}}}}}"#
        );
        assert!(matches!(
            check_response(line.as_bytes()),
            Checked::Unreadable { .. }
        ));
        let nested = format!(r#"{{"jsonrpc":"2.0","id":1,"result":{{"big":{{{members}"z":0}}}}}}"#);
        assert!(matches!(
            check_response(nested.as_bytes()),
            Checked::Plain(_)
        ));
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

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

pub use crate::jsonrpc::{MODERN_VERSION, is_modern};

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

/// Whether a method is the broker's to answer (`roots/list`, `files/…`), as a lenient reader
/// might dispatch it ([`lenient_name`]): a host that matches methods loosely must never get
/// one of the broker's.
pub fn is_broker_method(method: &str) -> bool {
    let name = lenient_name(method);
    name == "roots/list" || name.starts_with("files/")
}

/// The start of the methods of the proxy's own control messages to a shared broker
/// (`notifications/fsbroker/peer`): a server's own messages under it are never passed on, to
/// the host or to the broker.
pub const CONTROL_PREFIX: &str = "notifications/fsbroker/";

/// Whether a method is one of the proxy's own control messages ([`CONTROL_PREFIX`]), read as
/// leniently as [`is_broker_method`].
pub fn is_control_method(method: &str) -> bool {
    lenient_name(method).starts_with(CONTROL_PREFIX)
}

/// A method name as the loosest reader might dispatch it: cut at the first NUL (a C string
/// ends there), trimmed, in ASCII lower case. No legitimate method differs from its lenient
/// name only in these ways, so reading loosely costs nothing but the hostile lines.
fn lenient_name(method: &str) -> std::borrow::Cow<'_, str> {
    let cut = method.split('\0').next().unwrap_or_default().trim();
    if cut.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(cut.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(cut)
    }
}

/// A result asking for input.
#[derive(Debug)]
pub struct InputRequired {
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
    pub fn method(&self, key: &str) -> Option<&str> {
        self.methods.get(key).map(String::as_str)
    }

    /// The keys of the input requests the broker answers (`roots/list`, `files/*`).
    pub fn broker_keys(&self) -> Vec<String> {
        self.requests
            .keys()
            .filter(|k| self.method(k).is_some_and(is_broker_method))
            .cloned()
            .collect()
    }

    /// The keys of every other input request (the host's: elicitation, sampling, …).
    pub fn host_keys(&self) -> Vec<String> {
        self.requests
            .keys()
            .filter(|k| !self.method(k).is_some_and(is_broker_method))
            .cloned()
            .collect()
    }
}

/// An `input_required` result with more input requests than this is not relayed: no peer
/// asks for so much at once, and the proxy would hold them all.
pub const MAX_INPUT_REQUESTS: usize = 64;

/// What a message from the server is, to the proxy.
#[derive(Debug)]
pub enum Checked {
    /// Anything but an `input_required` result: it may go to the host as written. Carries the
    /// [`id_key`] of its id, if it has one.
    Plain(Option<String>),
    /// Not JSON that reads one way only where it matters (a member written twice at the
    /// levels that decide where it goes, bytes that are not UTF-8, a lone surrogate, not an
    /// object, a result that is also a request, a request for the broker with a malformed
    /// envelope, too many input requests): the host could read into it what the proxy did
    /// not.
    Unreadable {
        /// Every id it was seen to carry (ids written twice: each).
        ids: Vec<Value>,
        /// Whether it reads as a request (it has a `method`), or might.
        request: bool,
    },
    /// An `input_required` result.
    Input(InputRequired),
}

/// Reads a message from the server for what matters to the host: whether it asks for input.
///
/// It is read the way the peers' parsers read it: escapes are decoded (`"input_\u0072equired"`
/// is `input_required`), ids are compared by value ([`id_key`]), and a member written twice
/// where it decides anything (the message's, its result's, the input requests' and each input
/// request's members) makes it unreadable (JavaScript and Python keep the last, other parsers
/// the first; the proxy cannot know which the host uses). No byte pattern decides anything.
/// Only those members are kept while reading ([`Skeleton`]): the rest of a large result is
/// skipped over, not built.
pub fn check_response(line: &[u8]) -> Checked {
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
        };
    };
    let request = sk.method.is_some();
    if sk.dup {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
        };
    }
    // The relay's gate (`proxy::route`) keeps every message whose method is the broker's or
    // the proxy's away from here; should one come all the same, it is not the host's.
    if sk
        .method
        .as_ref()
        .and_then(Value::as_str)
        .is_some_and(is_claimed)
    {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
        };
    }
    let key = sk.ids.first().and_then(id_key);
    let asks = sk
        .result
        .as_ref()
        .and_then(|r| r.result_type.as_ref())
        .and_then(Value::as_str)
        == Some("input_required");
    if !asks {
        return Checked::Plain(key);
    }
    if request || sk.error {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
        };
    }
    let methods = sk
        .result
        .map(|r| r.methods)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, m)| Some((k, m?)))
        .collect();
    // The same line, its members kept as written: with no deciding member written twice,
    // they say what the skeleton says.
    let unreadable = || Checked::Unreadable {
        ids: Vec::new(),
        request: false,
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

/// The `id` members at the top level of a line no JSON parser reads (a `NaN`, a stray byte,
/// a cut-off end), and whether it has a top-level `method` (may be a request), found by a
/// scan that follows only strings and nesting, so the request it answers can still get an
/// error. At most [`MAX_IDS`] ids, distinct; ids that do not parse (`NaN`) are left out.
pub fn lenient_envelope(line: &[u8]) -> (Vec<Value>, bool) {
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
    // a word at a time.
    let mut i = start + 1;
    while let Some(at) = line
        .get(i..)
        .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
    {
        if line[i + at] == b'"' {
            return i + at + 1;
        }
        i += at + 2;
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
pub fn strict(line: &[u8]) -> Option<Value> {
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
/// else is skipped.
#[derive(Default)]
struct Skeleton {
    /// Every `id` (a scalar; more than one when written twice).
    ids: Vec<Value>,
    /// Its `method`, if it has one (any scalar).
    method: Option<Value>,
    /// Whether it has an `error`.
    error: bool,
    /// Its `result`, when that is an object.
    result: Option<ResultSkeleton>,
    /// Whether a deciding member is written twice.
    dup: bool,
}

#[derive(Default)]
struct ResultSkeleton {
    result_type: Option<Value>,
    /// Each input request's key and method (when it names one as a string).
    methods: Vec<(String, Option<String>)>,
    dup: bool,
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

/// Calls `member` for each member of an object (`Ok(None)` for anything else, skipped),
/// noting members written twice.
fn each_member<'de, A, F>(mut map: A, mut member: F) -> Result<bool, A::Error>
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
        dup |= !seen.insert(key);
    }
    Ok(dup)
}

/// An object at a level that decides where a message goes (the message, its result, the
/// input requests and each of them) with more members than this is unreadable: the proxy
/// tracks each member's name there (and keeps each member of an `input_required` result),
/// so their number bounds what a line costs it beyond its own bytes. No peer writes so many.
pub const MAX_MEMBERS: usize = 4096;

/// How many distinct ids of one message are kept: a message that writes its id more than
/// once is unreadable anyway, and answered under at most a few of them.
pub const MAX_IDS: usize = 8;

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

// One input request: its `method`, and whether a member is written twice.
object_or_skip!(EntrySkeleton, (Option<String>, bool), |map| {
    let mut method = None;
    let dup = each_member(map, |key, map| {
        if key == "method" {
            method = map.next_value::<Scalar>()?.0;
        } else {
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    })?;
    let method = method.and_then(|m| m.as_str().map(str::to_owned));
    Ok((method, dup))
});

// `inputRequests`: each key's method; at most MAX_INPUT_REQUESTS of them.
object_or_skip!(
    RequestsSkeleton,
    (Vec<(String, Option<String>)>, bool),
    |map| {
        let mut entries = Vec::new();
        let mut inner = false;
        let dup = each_member(map, |key, map| {
            if entries.len() >= MAX_INPUT_REQUESTS {
                return Err(serde::de::Error::custom("too many input requests"));
            }
            let (method, dup) = map.next_value::<EntrySkeleton>()?.0.unwrap_or_default();
            inner |= dup;
            entries.push((key.to_owned(), method));
            Ok(())
        })?;
        Ok((entries, dup || inner))
    }
);

// `result`: its `resultType` and input requests.
object_or_skip!(ResultOrSkip, ResultSkeleton, |map| {
    let mut r = ResultSkeleton::default();
    let mut inner = false;
    let dup = each_member(map, |key, map| {
        match key {
            "resultType" => r.result_type = map.next_value::<Scalar>()?.0,
            "inputRequests" => {
                if let Some((methods, dup)) = map.next_value::<RequestsSkeleton>()?.0 {
                    r.methods = methods;
                    inner |= dup;
                }
            }
            _ => {
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
                let dup = each_member(map, |key, map| {
                    match key {
                        "id" => {
                            if let Some(id) = map.next_value::<Scalar>()?.0 {
                                if sk.ids.len() < MAX_IDS && !sk.ids.contains(&id) {
                                    sk.ids.push(id);
                                }
                            }
                        }
                        "method" => sk.method = map.next_value::<Scalar>()?.0.or(Some(Value::Null)),
                        "error" => {
                            sk.error = true;
                            map.next_value::<IgnoredAny>()?;
                        }
                        "result" => {
                            sk.result = map.next_value::<ResultOrSkip>()?.0;
                            inner |= sk.result.as_ref().is_some_and(|r| r.dup);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
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
pub fn id_key(id: &Value) -> Option<String> {
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
pub fn raw_id_key(id: &RawValue) -> Option<String> {
    id_key(&serde_json::from_str(id.get()).ok()?)
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
pub fn merge_responses(line: &[u8], answers: &BTreeMap<String, Box<RawValue>>) -> Option<Vec<u8>> {
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
pub fn retry_key_for(request: &[u8], ir: &InputRequired) -> Option<String> {
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
    let text = text.to_ascii_lowercase();
    ["roots/list", "files/", CONTROL_PREFIX].iter().any(|name| {
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
pub struct Claims {
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
/// decoded; in any case: `"METHOD"`) and whose value is a string counts, however many there
/// are, with the value read as [`is_broker_method`] reads it. What lies deeper (params,
/// results, an `input_required`'s input requests) is not a message's method.
pub fn message_methods(line: &[u8]) -> Claims {
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
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'"' {
            let end = string_end(line, i);
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
                b'}' | b']' => deeper -= 1,
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
            br#"{"method":["roots/list"]}"#,
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

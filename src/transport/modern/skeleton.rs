//! Strict reading of a line's deciding members, each written once.
//!
//! JSON lets an object write a member twice, and parsers disagree on which copy wins
//! (JavaScript and Python keep the last, others the first); case-insensitive readers also
//! take `"Result"` for `result`. Where a member decides where a message goes, the proxy
//! cannot know which reading the host makes, so it reads only those members, in one pass
//! that skips the rest of a large result, and notes every one written twice or spelled
//! otherwise: such a message is unreadable, never passed on as the proxy read it.

use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::limits::{MAX_IDS, MAX_INPUT_REQUESTS, MAX_MEMBERS};
use crate::transport::lenient::{is_claimed, lenient_name};

/// `line` as a JSON value, or `None` when it is not JSON or some object in it has a member
/// written twice. For the host's small messages (its `notifications/cancelled`).
pub(crate) fn strict(line: &[u8]) -> Option<Value> {
    let value: Value = serde_json::from_slice(line).ok()?;
    serde_json::from_slice::<NoDuplicates>(line).ok()?;
    Some(value)
}

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
pub(super) struct Skeleton {
    /// Every `id` (a scalar; more than one when written twice).
    pub(super) ids: Vec<Value>,
    /// Its `method`, if it has one (any scalar; `null` for an array or an object).
    pub(super) method: Option<Value>,
    /// Whether its `method` (a string, or a string in an array) is claimed ([`is_claimed`]).
    pub(super) method_claimed: bool,
    /// Whether it has an `error`.
    pub(super) error: bool,
    /// Its `result`, when that is an object.
    pub(super) result: Option<ResultSkeleton>,
    /// Whether a deciding member is written twice (in any case).
    pub(super) dup: bool,
    /// Whether a deciding member is spelled other than exactly (`"Result"`, `"ID"`), or
    /// `inputRequests` is an array.
    pub(super) odd: bool,
}

#[derive(Default)]
pub(super) struct ResultSkeleton {
    pub(super) result_type: Option<Value>,
    /// Whether `inputRequests` is an object.
    pub(super) requests_object: bool,
    /// Each input request's key and method (when it names one as a string).
    pub(super) methods: Vec<(String, Option<String>)>,
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

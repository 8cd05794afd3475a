//! Where a message from the server goes, decided by reading it the way every peer might.
//!
//! The server is the party the proxy does not trust, and the host's reader is not the
//! proxy's: a line the two could read differently is how a server would get one of the
//! broker's input requests (`roots/list`, `files/*`) past the proxy to the host, which would
//! answer it with its own roots. So one function, [`check_response`], reads every message
//! from the server before it is passed on, with the strict skeleton (`skeleton.rs`) and the
//! lenient scans (`transport/lenient`) side by side, and says what the message is to the
//! proxy.

use std::collections::BTreeMap;

use serde_json::Value;
use serde_json::value::RawValue;

use super::skeleton::Skeleton;
use super::{Members, members};
use crate::transport::lenient::{
    RequestId, input_claims, is_broker_method, is_claimed, lenient_name,
};

/// A result asking for input.
#[derive(Debug)]
pub(crate) struct InputRequired {
    /// The response's id as the server wrote it.
    pub id: Option<Box<RawValue>>,
    /// That id, as the peers pair ids.
    pub key: Option<RequestId>,
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
    /// Anything but an `input_required` result: it may go to the host as written. Carries its
    /// id, if it has one.
    Plain(Option<RequestId>),
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
/// are decoded (`"input_\u0072equired"` is `input_required`), ids are compared as
/// [`RequestId`]s (`1`, `1.0` and `"1"` are one), member names as a case-insensitive reader matches them ([`lenient_name`]:
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
    // The relay's gate (`route`, in proxy/lines.rs) keeps every message whose method is the
    // broker's or the proxy's away from here; should one come all the same (a method in an
    // array, which a JavaScript reader indexing its handlers with it takes for the string),
    // it is not the host's.
    if sk.dup || sk.odd || sk.method_claimed || claims.other {
        return Checked::Unreadable {
            ids: sk.ids,
            request,
            broker,
        };
    }
    let key = sk.ids.first().and_then(RequestId::of_value);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_MEMBERS;

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
}

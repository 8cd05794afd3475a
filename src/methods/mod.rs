//! The methods the broker answers, as one table, and how a request becomes its answer.
//!
//! [`METHODS`] is the only list of them: each row names a method, says what it does to the
//! person's files ([`Kind`]), and gives the `handle` function of its module, whose argument
//! type is the method's `Params`. Everything else that needs to know the methods (the
//! `files/*` list a proxy declares, "is this the broker's to answer", which requests are
//! audited and rate limited, which ones acted) asks the table.
//!
//! Each method module owns its `Params` (serde, unknown fields refused so a typo is an error,
//! not a silent default), its result type and one `handle`; they read as the method's checks,
//! in order. What they share is elsewhere in this directory: `op.rs`, an operation's runtime
//! (resolve, authorize, lock, commit, run inline or on the blocking pool), and `call.rs`,
//! a request's way from arrival to answer (the rate limit, the dispatch below, and the one
//! place its audit line is finished).

mod call;
mod op;

mod checksum;
mod consent;
mod create;
mod delete;
mod list;
mod ping;
mod read;
mod rename;
mod roots;
mod unlock;
mod watch;
mod write;

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::{self, WriteResult};
use crate::outgoing::{Body, Outgoing};

pub(crate) use call::{Args, call};
use op::{Ctx, Op};

/// What a method does to the person's files, as the audit log and the rate limiter see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Touches nothing (`ping`): not audited, not rate limited.
    Free,
    /// Only looks (reads, listings, roots): audited; a line that cannot be written in time
    /// withholds the answer (`TIMEOUT`), since nothing was done.
    Looks,
    /// May change something (or the session's reach: consent, locks, watches): audited; a
    /// line that cannot be written after it acted fails the log closed.
    Acts,
}

/// One row of [`METHODS`].
#[derive(Debug)]
pub(crate) struct Method {
    /// The JSON-RPC method name.
    pub(crate) name: &'static str,
    /// What it does.
    pub(crate) kind: Kind,
}

/// Every `files/…` name is the broker's, known or not: an unknown one is refused by the
/// broker (`-32601`), never passed on to a host that might answer it.
pub(crate) const FILES_NAMESPACE: &str = "files/";

/// The table: each method, what it does, and its handler. The handler's argument type is the
/// method's parsed `Params`; `dispatch` parses into it and answers with what it returns.
macro_rules! methods {
    ($( $name:literal, $kind:ident => $handler:path; )*) => {
        /// Every method the broker answers.
        pub(crate) const METHODS: &[Method] = &[
            $( Method { name: $name, kind: Kind::$kind }, )*
        ];

        /// Answers one request of a known or unknown method.
        async fn dispatch(
            ctx: &Ctx<'_>,
            method: &str,
            params: Option<&RawValue>,
            id: &RawValue,
        ) -> (Outgoing, Outcome) {
            match method {
                $( $name => respond(ctx, method, id, async { $handler(ctx, parse(params)?).await }.await), )*
                _ => refuse(
                    ctx,
                    method,
                    id,
                    Error::new(ErrorKind::MethodNotFound, format!("unknown method {method:?}")),
                ),
            }
        }
    };
}

methods! {
    "ping",          Free  => ping::handle;
    "roots/list",    Looks => roots::handle;
    "files/read",    Looks => read::handle;
    "files/list",    Looks => list::handle;
    "files/checksum", Looks => checksum::handle;
    "files/write",   Acts  => write::handle;
    "files/create",  Acts  => create::handle;
    "files/delete",  Acts  => delete::handle;
    "files/rename",  Acts  => rename::handle;
    "files/unlock",  Acts  => unlock::handle;
    "files/consent", Acts  => consent::handle;
    "files/watch",   Acts  => watch::handle;
    "files/unwatch", Acts  => watch::unwatch;
}

/// The row of `name`, if the broker knows the method.
pub(crate) fn method(name: &str) -> Option<&'static Method> {
    METHODS.iter().find(|m| m.name == name)
}

/// The `files/*` methods (declared by the proxy in the MCP 2026-07-28 extension it
/// advertises).
pub(crate) fn files_methods() -> impl Iterator<Item = &'static str> {
    METHODS
        .iter()
        .map(|m| m.name)
        .filter(|n| n.starts_with(FILES_NAMESPACE))
}

/// Whether a request of `name` is the broker's to answer, and so audited and rate limited:
/// a method of the table that is not [`Kind::Free`], or any name in [`FILES_NAMESPACE`].
pub(crate) fn is_broker_method(name: &str) -> bool {
    name.starts_with(FILES_NAMESPACE) || method(name).is_some_and(|m| m.kind != Kind::Free)
}

/// The names and prefixes a message must mention to be about one of the broker's methods:
/// [`FILES_NAMESPACE`] and every other method [`is_broker_method`] takes (for the proxy's
/// scanners, which look for them in raw bytes before anything is parsed).
pub(crate) fn broker_names() -> impl Iterator<Item = &'static str> {
    std::iter::once(FILES_NAMESPACE).chain(
        METHODS
            .iter()
            .filter(|m| m.kind != Kind::Free && !m.name.starts_with(FILES_NAMESPACE))
            .map(|m| m.name),
    )
}

/// How a request ended, for the audit log.
struct Outcome {
    /// `ok`, or the error's `data.code` (or JSON-RPC name).
    code: &'static str,
    /// Payload bytes read or written.
    bytes: u64,
}

fn respond<R: WriteResult + ReplyInfo>(
    ctx: &Ctx<'_>,
    method: &str,
    id: &RawValue,
    result: Result<R>,
) -> (Outgoing, Outcome) {
    match result {
        Ok(mut r) => {
            let body = r.take_body();
            let budget = r.take_budget();
            let modern = ctx.state.is_modern();
            let frame =
                jsonrpc::result_frame_with(id, &r, r.size_hint(), body, modern).hold(budget);
            let bytes = r.bytes();
            (frame, Outcome { code: "ok", bytes })
        }
        Err(e) => refuse(ctx, method, id, e),
    }
}

fn refuse(ctx: &Ctx<'_>, method: &str, id: &RawValue, e: Error) -> (Outgoing, Outcome) {
    // Refusals are what an operator watches for: a server probing outside its roots.
    if e.kind() == ErrorKind::PermissionDenied {
        tracing::warn!(
            session = ctx.state.id,
            method,
            // A server chooses its paths' length; stderr gets at most PATH_MAX of one.
            path = crate::audit::cap(e.path().unwrap_or(""), crate::audit::MAX_LOGGED_PATH),
            reason = e.reason(),
            "refused"
        );
    }
    let code = e.kind().outcome();
    (
        jsonrpc::error_frame(Some(id), &e).into(),
        Outcome { code, bytes: 0 },
    )
}

/// What a result says about itself: its rough size (so its frame is allocated once), the
/// payload bytes it carries (for the audit log), and what it hands to its frame: a body in
/// pages of its own, and a share of the session's output budget.
pub(crate) trait ReplyInfo {
    fn size_hint(&self) -> usize {
        256
    }
    fn bytes(&self) -> u64 {
        0
    }
    fn take_body(&mut self) -> Option<Body> {
        None
    }
    fn take_budget(&mut self) -> Option<OwnedSemaphorePermit> {
        None
    }
}

/// Payload bytes of a serialized result type (most carry none).
pub(crate) trait PayloadBytes {
    fn payload_bytes(&self) -> u64 {
        0
    }
}

/// The empty result, `{}`: `ping`'s, and that of every method that only acts.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Empty {}

impl PayloadBytes for Empty {}

impl<T: PayloadBytes> ReplyInfo for jsonrpc::Json<T> {
    fn bytes(&self) -> u64 {
        self.0.payload_bytes()
    }
}

/// Parses params; absent params read as `{}`.
///
/// Every method takes named params. serde would read an array into a struct by position,
/// which would let a server skip the unknown-field check, so arrays are refused here.
fn parse<'a, P: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<P> {
    let text = params.map_or("{}", RawValue::get);
    if !text.starts_with('{') {
        return Err(Error::invalid_params("params must be an object"));
    }
    serde_json::from_str(text).map_err(|e| Error::invalid_params(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules derived from the table say what the contract says: `roots/list` and every
    /// `files/` name are the broker's, `ping` answers but is no file access, and anything
    /// else (a host's method, a look-alike) is not the broker's.
    #[test]
    fn derived_rules() {
        assert!(is_broker_method("roots/list"));
        assert!(is_broker_method("files/read"));
        assert!(is_broker_method("files/no-such-method"));
        assert!(!is_broker_method("ping"));
        assert!(!is_broker_method("roots/other"));
        assert!(!is_broker_method("tools/call"));
        assert!(!is_broker_method("Files/read"));
        assert_eq!(files_methods().count(), 11);
        assert!(files_methods().all(|m| method(m).is_some()));
        assert_eq!(broker_names().collect::<Vec<_>>(), ["files/", "roots/list"]);
        let looks: Vec<_> = METHODS
            .iter()
            .filter(|m| m.kind == Kind::Looks)
            .map(|m| m.name)
            .collect();
        assert_eq!(
            looks,
            ["roots/list", "files/read", "files/list", "files/checksum"]
        );
    }
}

//! `fsbroker proxy --url URL`: the server is a remote MCP server behind Streamable HTTP, made
//! to look to the relay like a child's stdin and stdout.
//!
//! The relay (`route`, the eras, the broker side, the budgets) is the child's, unchanged: what
//! it would write to the server's stdin (the host's messages, the broker's answers and
//! notifications, the proxy's retries) arrives here as lines, each sent as one POST; every
//! message the server sends (a JSON response, the events of a POST's stream or of the GET
//! stream) comes back as a line on the stream the relay reads. Failures of the transport (no
//! connection, a 401, a 404 for an expired session, a 413, a stream that ends without the
//! answer) are written there too, as the server's JSON-RPC error for the request concerned, so
//! that every host request gets an answer and nothing else reaches the host.
//!
//! The parts, each leaning only on those before it: `given.rs` is the server as given (its
//! URL as messages show it, and [`RemoteError`]); `client.rs` the HTTP client (TLS, no
//! redirects); `auth/` signs in when the server answers 401 (MCP authorization: the person
//! signs in in a browser, and a token for this server alone is sent from then on);
//! `options.rs` is what the proxy is given ([`RemoteOptions`], public); `http.rs` the
//! server's endpoint (headers, the token, timeouts, bounded bodies); `sse.rs` bounds the
//! events; `reads.rs` clamps `files/read` after a 413; `session.rs` is the era and the 2025
//! era's session (its id, its version, its expiry); `failure.rs` why a message got no answer;
//! `requests.rs` the host's requests by id, pending and failed; `inbound.rs` what goes to the
//! relay (the server's messages, the proxy's errors); `streams.rs` the server's event
//! streams, followed and resumed, and the session's GET stream; `exchange.rs` one message's
//! POST and what comes back; `pump.rs` the send loop and the goodbye. This file connects
//! them: [`connect`], and `Remote`, what every exchange shares, whose methods are each in the
//! file of its part.

mod auth;
mod client;
mod exchange;
mod failure;
mod given;
mod http;
mod inbound;
mod options;
mod pump;
mod reads;
mod requests;
mod session;
mod sse;
mod streams;

use std::sync::{Arc, Mutex};

use ::http::header::HeaderValue;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use crate::limits::{OUTPUT_QUEUE, REMOTE_IN_FLIGHT_MIN};
use crate::outgoing::Outgoing;
use crate::transport::relay::{Budget, ToServer};
pub use auth::{
    CacheError, CachedSignIn, Revoked, SignIn, SignInCard, SignInState, SignIns, SignedOut,
    TokenCache,
};
pub use given::{RemoteError, invisible};
use http::Http;
pub use options::RemoteOptions;
pub(super) use pump::Ends;
use reads::Reads;
use requests::Ids;
use session::Session;
use streams::Followers;

/// A remote server connected to the relay: `output` is what the relay reads (the server's
/// messages, one per line; it ends when the connection does); `done` resolves, with how it
/// ended, once the host has gone or the server ended the session, the answers in flight
/// have come (or their grace passed) and the session was ended.
pub(super) struct Connected {
    pub(super) output: DuplexStream,
    pub(super) done: tokio::task::JoinHandle<Ended>,
}

/// How a remote server's connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// The host left (or the broker stopped), and the session was ended (`DELETE`).
    HostGone,
    /// The server ended the session (a 404 for its `Mcp-Session-Id`). The proxy does not
    /// start another behind the host's back (the host's state of the session, its
    /// subscriptions and log level, would silently be gone): it ends, so that the host
    /// notices and starts it again, with a handshake of its own.
    SessionLost,
}

/// Connects the relay's queue to the server at `opts` (nothing is sent before the relay's
/// first line); messages longer than `max_line` are refused both ways.
pub(super) fn connect(
    opts: RemoteOptions,
    max_line: usize,
    from_relay: mpsc::Receiver<ToServer>,
    ends: Ends,
) -> Result<Connected, RemoteError> {
    // The user's own token is sent as it is: no sign-in replaces it.
    let auth = match opts.sign_in {
        Some(sign_in) if !opts.headers.contains_key(::http::header::AUTHORIZATION) => Some(
            Arc::new(auth::Auth::new(&opts.url, sign_in, &opts.ca_certs)?),
        ),
        _ => None,
    };
    let http = Http::new(&opts.url, opts.headers, &opts.ca_certs, auth)?;
    let (output, mut input) = tokio::io::duplex(64 << 10);
    let (inbound, mut lines) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
    // The server's messages, written for the relay by one task: each holds its share of a
    // budget until written, so a relay that stops reading stops the streams being read.
    tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            if input.write_all(&line.into_vec()).await.is_err() {
                break;
            }
        }
        let _ = input.shutdown().await;
    });
    let remote = Arc::new(Remote {
        http,
        session: Session::default(),
        reads: Mutex::new(Reads::new(opts.max_chunk)),
        ids: Mutex::default(),
        inbound,
        budget: Budget::new(),
        max_line,
        followers: Mutex::default(),
        in_flight: http::InFlight::new((2 * max_line).max(REMOTE_IN_FLIGHT_MIN)),
    });
    let done = tokio::spawn(remote.pump(from_relay, ends));
    Ok(Connected { output, done })
}

/// What every exchange with the server shares.
struct Remote {
    http: Http,
    session: Session,
    reads: Mutex<Reads>,
    /// The host requests sent and not yet answered, and the last ones failed.
    ids: Mutex<Ids>,
    /// The server's messages, as lines for the relay.
    inbound: mpsc::Sender<Outgoing>,
    budget: Budget,
    max_line: usize,
    /// The streams followed beside the pump; ended with the session.
    followers: Mutex<Followers>,
    /// The bytes being read from the server: events not yet whole, bodies not yet ended.
    in_flight: http::InFlight,
}

/// A header value the proxy makes from a message's text (a version, a method, a name).
fn header_value(text: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(text).ok()
}

/// For `properties.rs` (through `transport::id_filters`): whether the remote server's filters
/// take ids written `a` and `b` for one, each fed as the pump and `read_message` feed it;
/// `None` where no message with them reaches the filter.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    use crate::transport::lenient::RequestId;
    use exchange::{Kind, Message};
    use requests::Waiting;
    use serde_json::value::RawValue;
    use tokio::sync::Notify;
    let raw = |t: &str| RawValue::from_string(t.to_owned()).ok();
    // The host's request (`a`), as the pump reads it.
    let host = Message::read(format!(r#"{{"jsonrpc":"2.0","id":{a},"method":"x"}}"#).into_bytes());
    let key = host.request_id();
    // The server's response (`b`), as `read_message` reads it: `Some(None)` when its id is
    // no id (it is relayed as it is).
    let answer = raw(b).map(|b| RequestId::of_raw(&b));
    let waiting = || Waiting {
        settled: Arc::new(Notify::new()),
        task: None,
    };
    let failed = key.clone().zip(answer.clone()).map(|(key, answer)| {
        let mut ids = Ids::default();
        ids.fail(key);
        answer.is_some_and(|answer| !ids.answered(&answer))
    });
    let pending = key.clone().zip(answer.clone()).map(|(key, answer)| {
        let mut ids = Ids::default();
        ids.pending.insert(key.clone(), waiting());
        if let Some(answer) = answer {
            ids.answered(&answer);
        }
        !ids.pending.contains(&key)
    });
    // The host's cancel (`b`), as the pump reads it.
    let cancel = Message::read(
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{b}}}}}"#
        )
        .into_bytes(),
    );
    let cancelled = key
        .clone()
        .filter(|_| matches!(cancel.kind, Kind::Notification { .. }))
        .map(|key| cancel.cancels() == Some(key));
    // The server's `files/read` (`a`), and the broker's answer (`b`) on its way to the server.
    let reads = raw(a).zip(raw(b)).map(|(a, b)| {
        let mut reads = Reads::new(None);
        reads.arrived(&a, None, Vec::new());
        reads.answered(&b).is_some()
    });
    // The `initialize` (`a`) and a response negotiating a version (`b`).
    let session = key.zip(answer).map(|(key, answer)| {
        let session = Session::default();
        session.begin(Some(&key));
        if let Some(answer) = answer {
            session.negotiated(&answer, "2025-06-18");
        }
        session.is_initialized()
    });
    vec![
        ("remote failed ids", failed),
        ("remote pending ids", pending),
        ("remote cancel", cancelled),
        ("remote reads", reads),
        ("remote session's initialize", session),
    ]
}

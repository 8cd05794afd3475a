//! Bytes in and out: line framing, the stdio server, the Unix-socket server (a broker shared
//! by many servers) and the proxy that puts the broker in front of any stdio MCP server.

pub(crate) mod driver;
mod eras;
pub(crate) mod framing;
mod lenient;
pub mod listen;
pub(crate) mod modern;
mod pending;
pub(crate) mod pipe;
pub mod proxy;
mod relay;
pub mod serve;

pub use crate::limits::DEFAULT_MAX_LINE;

/// A proxy's note to a shared broker about its server ([`crate::PEER_NOTIFICATION`]), as a
/// line: `params` with the socket's `key`, which is what makes the broker take it from this
/// link and not from a server's.
pub(crate) fn peer_note(key: Option<&str>, mut params: serde_json::Value) -> Vec<u8> {
    if let (Some(key), Some(p)) = (key, params.as_object_mut()) {
        p.insert("key".into(), serde_json::Value::from(key));
    }
    let note = serde_json::json!({
        "jsonrpc": "2.0",
        "method": crate::host::PEER_NOTIFICATION,
        "params": params,
    });
    let mut line = note.to_string().into_bytes();
    line.push(b'\n');
    line
}
pub use serve::{ServeOptions, serve_connection, serve_stdio};

/// For `properties.rs`: every filter of the proxy that pairs messages by id, and whether it
/// takes the ids written `a` and `b` (JSON text) for one, fed each as the proxy feeds it;
/// `None` where no message with them reaches the filter. Each must decide as
/// [`same_request_id`] does.
#[cfg(test)]
pub(crate) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    let mut filters = vec![("lenient_envelope", lenient::id_filter(a, b))];
    filters.extend(eras::id_filters(a, b));
    filters.extend(proxy::id_filters(a, b));
    filters
}

/// For `properties.rs`: whether ids written `a` and `b` are one [`lenient::RequestId`]
/// (`false` when either is no id).
#[cfg(test)]
pub(crate) fn same_request_id(a: &str, b: &str) -> bool {
    let id = |t: &str| lenient::RequestId::parse(t.as_bytes());
    id(a).is_some_and(|a| id(b) == Some(a))
}

//! Bytes in and out: line framing, the stdio server, the Unix-socket server (a broker shared
//! by many servers) and the proxy that puts the broker in front of any stdio MCP server.

pub(crate) mod driver;
mod eras;
pub(crate) mod framing;
mod lenient;
pub mod listen;
pub(crate) mod modern;
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

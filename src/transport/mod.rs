//! Bytes in and out: line framing and the stdio server.

pub mod framing;
pub mod serve;

pub use framing::{DEFAULT_MAX_LINE, Frame, LineReader};
pub use serve::{ServeOptions, serve_connection, serve_stdio};

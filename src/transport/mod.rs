//! Bytes in and out: line framing, the stdio server, the Unix-socket server (a broker shared
//! by many servers) and the proxy that puts the broker in front of any stdio MCP server.

pub(crate) mod driver;
mod eras;
pub mod framing;
pub mod listen;
pub(crate) mod modern;
pub(crate) mod pipe;
pub mod proxy;
mod relay;
pub mod serve;

pub use framing::{DEFAULT_MAX_LINE, Frame, InputBudget, LineReader};
pub use serve::{ServeOptions, serve_connection, serve_stdio};

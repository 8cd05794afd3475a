//! fsbroker: the client side of MCP file access.
//!
//! An MCP server asks the client for files (`files/read`, `files/list`, ...) and for its
//! roots (`roots/list`); fsbroker answers, resolving every path beneath a capability handle
//! for an approved root, so the server never holds the disk.
//!
//! # Layout
//!
//! A message travels one way through layers that each do one thing:
//!
//! ```text
//! bytes ─► transport ─► jsonrpc ─► session ─► methods/<name> ─► sandbox (cap-std) ─► disk
//! ```
//!
//! - [`transport`]: line framing with a named maximum ([`transport::framing`]), the stdio
//!   server ([`transport::serve`]), the Unix-socket server that shares one broker among
//!   many servers ([`transport::listen`]), and the proxy in front of any stdio MCP server
//!   ([`transport::proxy`]); [`transport::pipe`] writes frames and grows pipes.
//! - [`jsonrpc`]: envelope parsing (id kept raw, params parsed by each method) and response
//!   frames written straight into a buffer; [`outgoing`]: a frame on its way out, with a
//!   large read's base64 body in pages of its own (spliced into a pipe, not copied).
//! - [`broker`]: [`Broker`], the state every session shares (the policy, hence the roots;
//!   the lock table).
//! - [`session`]: [`Session`], one connected server: a message in, a response out
//!   ([`Session::handle`]), and a stream of notifications ([`Session::take_notifications`]);
//!   holds the session's grants and uploads and, on drop, releases its locks and watches.
//! - `methods/`: one file per method (`roots.rs`, `read.rs`, `list.rs`, `write.rs`,
//!   `create.rs`, `delete.rs`, `rename.rs`, `unlock.rs`, `consent.rs`, `watch.rs`,
//!   `ping.rs`), each with its `Params`, result and `handle`; `methods/mod.rs` dispatches.
//! - [`consent`]: the providers that ask a person (command, terminal).
//! - [`audit`]: the hash-chained audit log, its verifier, its roll-over and its copies to
//!   syslog or the journal.
//! - [`sandbox`]: [`sandbox::Root`] (the only ambient-authority open, and the strictest
//!   rules of every root covering a path), path resolution ([`sandbox::resolve`], and
//!   [`sandbox::Resolved::real`]: where a path really leads), deny globs, fsbroker's own
//!   files ([`sandbox::protected`]), safe opens ([`sandbox::open`]) and the building blocks
//!   of mutations ([`sandbox::mutate`]: parent handles, staging files, renames, each change
//!   checked against protected paths and modes).
//! - [`locks`]: the broker's path locks (SEP-1708), shared and exclusive, kept locks.
//! - [`limits`]: per-session rate limits (governor) and operation deadlines.
//! - [`upload`]: chunked uploads staged beside their targets.
//! - [`watch`]: `files/watch` — one notify watcher per broker, event mapping, coalescing,
//!   rescans, and retiring roots whose directory disappears.
//! - [`policy`]: the TOML file ([`policy::PolicyFile`]) compiled into a [`policy::Policy`].
//! - [`error`]: [`Error`] and the single kind → wire-code mapping.
//! - [`codec`]: UTF-8 and base64 content, with the SIMD base64 engine.
//! - [`cli`]: the `fsbroker` command line.
//! - [`bench`](mod@bench): `fsbroker bench`, a client measuring a broker over real pipes
//!   (chunked reads and uploads, small operations, OpenSSH's sftp-server for comparison).
//!
//! # Embedding
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use fsbroker::{Broker, policy::{Overrides, Policy}};
//! let policy = Policy::load(None, &Overrides { roots: vec![".".into()], ..Default::default() })?;
//! let session = Broker::new(policy)?.session();
//! let reply = session.handle(br#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#).await;
//! assert!(reply.is_some());
//! # Ok(()) }
//! ```

// Two `unsafe` calls in the crate (`vmsplice` in `transport::pipe`, `sync_file_range` in
// `sandbox::mutate`), each allowed where it is, with the argument for its soundness beside it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod audit;
pub mod bench;
pub mod broker;
pub mod cli;
pub mod codec;
pub mod confine;
pub mod consent;
pub mod error;
pub mod fair;
pub mod jsonrpc;
pub mod limits;
pub mod locks;
mod methods;
pub mod outgoing;
pub mod policy;
pub mod rfc3339;
pub mod sandbox;
pub mod session;
pub mod transport;
pub mod upload;
pub mod watch;

pub use broker::Broker;
pub use error::{Error, ErrorKind};
pub use session::{Notifications, Session};

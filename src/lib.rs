//! fsbroker: the client side of MCP file access.
//!
//! An MCP server asks the client for files (`files/read`, `files/list`, ...) and for its
//! roots (`roots/list`); fsbroker answers, resolving every path beneath a capability handle
//! for an approved root, so the server never holds the disk. The wire contract is in
//! `docs/protocol.md`; the threat model in `docs/security.md`.
//!
//! # What a host uses
//!
//! - [`Policy`] ([`policy`]): the roots, their modes, consent and deny globs, and the limits,
//!   from a TOML file and command-line [`Overrides`].
//! - [`Broker`]: the state every session shares (`broker/`: the policy, reloads and
//!   revocation, `stop`). [`Broker::session`] opens a [`Session`] per MCP server;
//!   [`Session::handle`] answers one message; [`Session::take_notifications`] streams
//!   `notifications/roots/list_changed` and `notifications/files/changed`. A session's whole
//!   API is in one file, `host.rs`. [`Broker::sessions`] and [`Broker::events`] show the
//!   person what each server does; [`Broker::prompts`] and [`Broker::answer_prompt`] let
//!   them answer consent prompts, and [`Broker::revoke_grant`], [`Broker::end_session`] and
//!   [`Broker::pause_root`] take access back (`broker/person.rs`). The console
//!   (`fsbroker … --console`) is built on these alone.
//! - [`transport`]: the ready-made ways to connect servers: [`transport::serve_stdio`],
//!   [`transport::serve_connection`] (any byte stream), [`transport::listen::listen`] (one
//!   broker shared over a Unix socket) and [`transport::proxy::run`] (in front of any stdio
//!   MCP server, optionally [`confine`]d by Landlock, or of a remote one over Streamable
//!   HTTP: [`transport::proxy::RemoteOptions`]).
//! - [`Error`] and [`ErrorKind`] (one kind per wire error code), [`PolicyError`],
//!   [`audit::AuditError`].
//! - [`audit::verify_files`]: checks a hash-chained audit log; [`sandbox::resolve`]: the
//!   path resolver every request goes through, for a host that wants to show a path the
//!   way the broker reads it.
//!
//! The command line (`fsbroker serve`, `proxy`, `bench`, ...) is the `fsbroker` binary, built
//! on this public API alone; the library is the same with or without the default `cli`
//! feature, which only brings the binary's dependencies (clap, indicatif,
//! tracing-subscriber): `fsbroker = { version = "0.1", default-features = false }` leaves
//! them out.
//!
//! # Layout
//!
//! A message travels one way through layers that each do one thing, and each layer imports
//! only the ones below it (`tests/layers.rs` checks every `crate::` path against its table of
//! which module may use which, and the table for circles; inside `policy/`, `transport/` and
//! `methods/` the same for their files and folders; and that no folder's files use each
//! other in a circle):
//!
//! ```text
//! bytes ─► transport ─► host (Session) ─► methods: table ─► call ─► <method>.rs ─► op ─► sandbox ─► disk
//!                                                     consent (may it?) ─┘     └─ session, broker (state)
//! ```
//!
//! - `transport/`: the ways in. Line framing with a named maximum (`framing.rs`), the stdio
//!   server (`serve.rs`), the Unix-socket server (`listen.rs`), the session driver every one
//!   of them shares (`driver.rs`), pipe writes (`pipe.rs`), and the proxy: `proxy/` (the
//!   server's process, the relay loops, the broker side, and `proxy/remote/`: a remote
//!   server's Streamable HTTP client made to look like a child's stdin and stdout, with its
//!   session, event streams and bounds, and `auth/`: signing in when it answers 401, the
//!   person in a browser, the tokens kept for the next start and revoked on signing out), `relay.rs` (its queues), `eras/`
//!   and `modern/` (the MCP 2026-07-28 era), `lenient/` (how the loosest host reader might
//!   read a server's line, so that no reader can be handed one of the broker's methods, and
//!   its ids: `RequestId`, the one meaning of "the same id"), `pending.rs` (the one bounded
//!   map of request ids every filter of the proxy keeps).
//! - `host.rs`: the host's API, [`Session`] and [`Notifications`]; the transports use it too.
//! - `methods/`: `mod.rs` is the table of every method (its name, what it does, its
//!   handler); `call.rs` takes a request from arrival to answer (rate limit, dispatch, audit
//!   line); `op.rs` is an operation's runtime (resolve, authorize, lock, commit, inline or on
//!   the pool); one file per method (`read.rs`, `list.rs`, ...) with its `Params`, result
//!   and `handle`, in the order its checks run; `write/` is one folder (the method in
//!   `mod.rs`; its content's decoding, `sha256`, a replace, a chunk, a new file's mode).
//! - `consent/`: the one place that decides whether a session may touch a path now: grants
//!   and the check (`grants.rs`), turns to ask (`turns.rs`), and the providers that ask a
//!   person (`command.rs`, `terminal.rs`, and `desk.rs`: prompts waiting for a console).
//! - `session.rs`: one connected server's state that operations share (grants, uploads,
//!   output budget, notifications, requests in flight).
//! - `broker/`: the state every session shares (the policy, hence the roots; the lock table;
//!   the watch hub; the audit log), its reloads and revocations (`reload.rs`), what a host
//!   may show of its sessions (`sessions.rs`) and the person's acts (`person.rs`). It
//!   reaches sessions through a small interface they implement, never the other way up.
//! - `sandbox/`: [`sandbox::Root`] (the only ambient-authority open, and the strictest rules
//!   of every root covering a path), path resolution ([`sandbox::resolve`]), deny globs,
//!   fsbroker's own files (`protected.rs`), safe opens (`open.rs`) and the building blocks of
//!   mutations (`mutate.rs`, `mutate/`). `clippy.toml` keeps `std::fs` out of every module
//!   that handles a request path.
//! - `audit/`: the hash-chained audit log (a request's line in `pending.rs` and
//!   `record.rs`, the chain, appends under a lock, the tail, roll-over), its verifier and its
//!   copies to syslog or the journal.
//! - `limits.rs`: every fixed bound, with its value and why, in one table. The limits a
//!   policy sets are [`policy`]'s; `throttle.rs` applies rates and deadlines at run time.
//! - `jsonrpc.rs` (envelopes in, frames out), `outgoing.rs` (a frame on its way out, with a
//!   large read's body in pages of its own), `buffers.rs` (large request lines, reused, and
//!   the content lifted out of them), `codec.rs` (UTF-8 and base64, SIMD), `digest.rs`
//!   (SHA-256 of chunks, uploads and ranges: the integrity extension): private.
//! - `locks.rs` (path locks, SEP-1708), `fair.rs` (the blocking pool shared fairly between
//!   sessions), `fast.rs` (small reads run inline, with a watchdog that answers `TIMEOUT`
//!   for one stuck there), `upload.rs` (chunked uploads staged beside their targets),
//!   `watch/` (`files/watch`: one notify watcher per broker, registered and unregistered by
//!   a thread of its own), `random.rs` (ids and nonces), `rfc3339.rs` (timestamps),
//!   `rundir.rs` (the user's private runtime directory: the audit log's lock, and the key a
//!   proxy proves its link to a shared broker with; and where the person's sign-ins to
//!   remote servers are kept, in their private state directory).
//! - [`confine`]: `proxy --confine`, the Landlock domain and seccomp filter a server runs in,
//!   and its launcher (`confine::launch`: npx, npm installs, uvx, uv run, pipx run, venvs)
//!   resolved to the installation it runs.
//! - [`policy`]: the TOML file ([`policy::PolicyFile`]) compiled into a [`Policy`], bounded by
//!   the administrator's managed policy (`managed.rs`: [`policy::Managed`], read only from
//!   `/etc/fsbroker/managed.toml`, which the person cannot widen).
//! - Built only for tests and fuzzing: `properties.rs` (property tests of the private
//!   layers) and `fuzzing.rs` (what `cargo fuzz` may ask of them).
//! - Not in the library: `main.rs`, `cli/`, `bench/` and `console/` are the binary's: the
//!   `fsbroker` command line, `fsbroker bench` and the person's web console, on this public
//!   API alone.
//!
//! # Embedding
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use fsbroker::{Broker, Overrides, Policy};
//!
//! let dir = tempfile::tempdir()?;
//! std::fs::write(dir.path().join("notes.txt"), "hello")?;
//! // One read-only root, as `fsbroker serve --root DIR` would have it.
//! let policy = Policy::load(None, &Overrides { roots: vec![dir.path().into()], ..Default::default() })?;
//! let session = Broker::new(policy)?.session();
//!
//! let reply = session
//!     .handle(br#"{"jsonrpc":"2.0","id":1,"method":"files/read","params":{"path":"notes.txt"}}"#)
//!     .await
//!     .expect("a request gets an answer");
//! let reply: serde_json::Value = serde_json::from_slice(&reply)?;
//! assert_eq!(reply["result"]["content"], "hello");
//! # Ok(()) }
//! ```

// `unsafe` is allowed only where a call needs it (`sync_file_range` in `sandbox::mutate`, the
// confinement's system calls), with the argument for its soundness beside it.
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![deny(unreachable_pub)]

// The public surface is what a host uses: the broker and its sessions, the policy, the errors,
// the transports, the path resolver and the audit log's verifier. The rest is the broker's own.
pub mod audit;
mod broker;
mod buffers;
mod codec;
pub mod confine;
mod consent;
mod digest;
pub mod error;
mod fair;
mod fast;
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing;
mod host;
mod jsonrpc;
mod limits;
mod locks;
mod methods;
mod outgoing;
pub mod policy;
#[cfg(test)]
mod properties;
mod random;
mod rfc3339;
mod rundir;
pub mod sandbox;
mod session;
mod throttle;
pub mod transport;
mod upload;
mod watch;

pub use broker::{
    ActError, Broker, EVENT_BACKLOG, Event, PolicyWatcher, ReloadReport, RootState, SessionInfo,
    Transport,
};
pub use consent::{AnswerError, ConsoleOpen, GrantInfo, Prompt, PromptAnswer, PromptPath};
pub use digest::engine as sha256_engine;
pub use error::{Error, ErrorKind};
pub use host::{Notifications, PEER_NOTIFICATION, Session};
pub use policy::{Overrides, Policy, PolicyError};
pub use rundir::{console_opener_file, console_url_file, console_url_files};

//! What the broker can tell a host about each open session: who the server is, how it is
//! connected, what it has done and what it holds now, and whether a path a prompt asks
//! about is a folder. A console shows this to the person whose files the servers reach;
//! nothing in it is a capability.

use std::sync::Arc;
use std::time::SystemTime;

use super::Broker;
pub use crate::limits::EVENT_BACKLOG;

/// How a session's server is connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// A host drives the session through the library ([`crate::Session::handle`]).
    #[default]
    Library,
    /// `fsbroker serve` on its standard input and output.
    Stdio,
    /// A connection to `serve --listen`'s socket.
    Socket,
    /// `fsbroker proxy`, in front of the server.
    Proxy,
    /// `fsbroker proxy --url`, in front of a remote server: it runs on another computer and
    /// cannot open this one's files itself, only ask the broker for them.
    Remote,
}

impl Transport {
    /// The name a console shows (`library`, `stdio`, `socket`, `proxy`, `remote`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Library => "library",
            Transport::Stdio => "stdio",
            Transport::Socket => "socket",
            Transport::Proxy => "proxy",
            Transport::Remote => "remote",
        }
    }

    /// Whether a proxy is in front of the server (local or remote).
    pub fn is_proxy(self) -> bool {
        matches!(self, Transport::Proxy | Transport::Remote)
    }
}

/// One open session, as a host may show it.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// The session's number (as in the audit log).
    pub id: u64,
    /// The server's name as its transport learnt it: the server's own claim (its
    /// `serverInfo.name`), or what its proxy reported. Never trusted for a decision.
    pub server: Option<String>,
    /// Whether the server speaks MCP 2026-07-28.
    pub modern: bool,
    /// How the server is connected.
    pub transport: Transport,
    /// When the session opened.
    pub started: SystemTime,
    /// Requests answered (every method but `ping`, refusals included).
    pub requests: u64,
    /// Payload bytes read (`files/read`).
    pub bytes_read: u64,
    /// Payload bytes written (`files/write`).
    pub bytes_written: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Of those, refusals (`PERMISSION_DENIED`): a server reaching for what it may not.
    pub denials: u64,
    /// Chunked uploads it has not finished.
    pub uploads: usize,
    /// Locks it keeps (`keepLocked`).
    pub locks: usize,
    /// Watches it holds.
    pub watches: usize,
    /// The subtrees the person granted it.
    pub grants: Vec<crate::consent::GrantInfo>,
    /// The kernel sandbox its server runs in (`best-effort` or `strict`), as its proxy
    /// reported it; `None` when unconfined or unknown.
    pub confinement: Option<String>,
}

impl Broker {
    /// The sessions open now, oldest first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let mut all: Vec<SessionInfo> = self
            .members()
            .iter()
            .map(|m| {
                let mut info = m.info();
                info.locks = self.locks().kept_by(info.id);
                info.watches = self.watches().count_for(info.id);
                info
            })
            .collect();
        all.sort_by_key(|s| s.id);
        all
    }
}

impl Broker {
    /// Whether the absolute path `path` (as a prompt shows it: canonical, inside a root) is a
    /// folder now, looked at beneath its root's directory without following a link: `Some(true)`
    /// for a folder, `Some(false)` for anything else that is there, `None` when nothing is
    /// there or the path is in no root of the policy in force. A host words a prompt by it:
    /// narrowing the grant to a folder inside the path makes sense for a folder only. It is
    /// what the path was at that moment, for the person to read, never a decision: an answer
    /// is checked again when it is given.
    pub fn is_folder(&self, path: &str) -> Option<bool> {
        if !path.starts_with('/') {
            return None;
        }
        let target = crate::sandbox::resolve(self.policy().roots(), path).ok()?;
        let meta = target
            .root()
            .dir()
            .symlink_metadata(target.rel_path())
            .ok()?;
        Some(meta.is_dir())
    }
}

/// One answered request, as the audit log records it: the same members (`ts`, `session`,
/// `method`, `path`, `outcome`, `bytes`, `server`, ...), capped and redacted the same way,
/// without the chain. Every string in it that a server chose is the server's, to be shown
/// as text, never as markup.
#[derive(Debug, Clone)]
pub struct Event(pub(super) Arc<serde_json::Map<String, serde_json::Value>>);

impl Event {
    /// The record's members.
    pub fn fields(&self) -> &serde_json::Map<String, serde_json::Value> {
        &self.0
    }
}

impl Broker {
    /// A live stream of the requests answered from now on ([`Event`]), for a host that shows
    /// them (the console). A receiver that falls behind by more than [`EVENT_BACKLOG`]
    /// events loses the oldest (`RecvError::Lagged` says how many). With no receiver, the
    /// broker builds no event at all.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Whether anyone receives [`Broker::events`] now.
    pub(crate) fn wants_events(&self) -> bool {
        self.events.receiver_count() > 0
    }

    /// Sends one answered request to the receivers of [`Broker::events`].
    pub(crate) fn publish(&self, record: &crate::audit::Record<'_>) {
        if !self.wants_events() {
            return;
        }
        let redact = self.policy().audit().is_some_and(|a| a.redact_paths);
        let fields = crate::audit::fields(record, redact)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let _ = self.events.send(Event(Arc::new(fields)));
    }
}

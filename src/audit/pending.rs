//! A request's audit line before its outcome is known.
//!
//! The line is begun when the request arrives and finished by whichever answers it: its own
//! task, or the fast path's watchdog for a read stuck on a hung file system. Both finish it
//! here, so the two can never say different things about the same request.

use std::borrow::Cow;
use std::time::Instant;

use serde::Deserialize;

use super::Record;

/// What a request's audit line says before it runs: who asked, what it names, and when.
#[derive(Debug, Clone)]
pub(crate) struct PendingLine {
    session: u64,
    method: Cow<'static, str>,
    paths: NamedPaths,
    server: Option<String>,
    started: Instant,
    managed: Option<String>,
}

/// The paths a request names, read leniently from its params: everything else is ignored,
/// and params that are not an object name none (the request itself is refused elsewhere).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NamedPaths {
    path: Option<String>,
    old_path: Option<String>,
    new_path: Option<String>,
    requested_paths: Option<Vec<String>>,
}

impl PendingLine {
    /// Begins the line of a request of `method` (its name as the method table spells it, or
    /// as it came for one the table does not know) with raw `params`.
    pub(crate) fn begin(
        session: u64,
        method: Cow<'static, str>,
        params: Option<&str>,
        server: Option<String>,
        started: Instant,
    ) -> PendingLine {
        let paths = params
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or_default();
        PendingLine {
            session,
            method,
            paths,
            server,
            started,
            managed: None,
        }
    }

    /// Puts the managed policy's SHA-256 on this line (see [`Record::managed`]).
    pub(crate) fn note_managed(&mut self, sha256: String) {
        self.managed = Some(sha256);
    }

    /// Names the server as its transport knows it now: a name learnt while the request ran
    /// (a server that answers `initialize` after asking for consent) is the line's.
    pub(crate) fn name_server(&mut self, server: Option<String>) {
        if server.is_some() {
            self.server = server;
        }
    }

    /// The finished line: how the request ended (`ok` or its error's code), the payload bytes
    /// it moved, and the refusals over the rate folded into it.
    pub(crate) fn record(
        &self,
        outcome: &'static str,
        bytes: u64,
        also_refused: u64,
    ) -> Record<'_> {
        Record {
            session: self.session,
            method: &self.method,
            path: self
                .paths
                .path
                .as_deref()
                .or(self.paths.old_path.as_deref()),
            new_path: self.paths.new_path.as_deref(),
            paths: self.paths.requested_paths.as_deref(),
            outcome,
            bytes,
            duration: self.started.elapsed(),
            server: self.server.as_deref(),
            also_refused,
            managed: self.managed.as_deref(),
        }
    }
}

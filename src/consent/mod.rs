//! Consent: the one place that decides whether a session may touch a path now.
//!
//! - `grants.rs`: what each session was granted, and [`allows`], the check every request,
//!   `roots/list` and the watcher's notifications go through. Revoking a root drops its
//!   grants ([`Grants::revoke_root`]); the broker does it on a reload or a revocation.
//! - `turns.rs`: whose turn it is to ask the person (one prompt per session, a few per
//!   broker), bounded by the request's deadline.
//! - this file and `command.rs`, `terminal.rs`: asking a person, the providers behind
//!   `consent = "prompt"` roots.
//!
//! The methods that lead here are `files/consent` (`methods/consent.rs`) and the offer of
//! `prompt` roots on a session's first `roots/list` (`methods/roots.rs`).
//!
//! A request goes to the external command named in the policy when there is one (an
//! administrator's explicit choice: a desktop dialog, an enterprise agent), else to the
//! controlling terminal when there is one and the policy allows it, else nowhere: it fails
//! closed, with a warning. Every provider is bounded by the policy's `[consent] timeout_ms`;
//! no answer is a denial. Providers block, so callers run them on the blocking pool.

mod command;
mod grants;
mod terminal;
mod turns;

pub(crate) use grants::{Grants, allows};
pub(crate) use turns::{BrokerTurns, SessionTurns, Turn};

use serde::Serialize;

use crate::policy::ConsentConfig;

/// What a person is asked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    /// The MCP server's name, when known.
    pub server: Option<String>,
    /// The server's explanation.
    pub message: String,
    /// Absolute canonical paths, all inside roots.
    pub requested_paths: Vec<String>,
}

/// Whether anyone can be asked: a command is configured, or the terminal is allowed and
/// there is one. Without either every `prompt` is a denial, and nothing should be offered.
pub(crate) fn available(config: &ConsentConfig) -> bool {
    !config.command.is_empty() || (config.terminal && terminal::open().is_some())
}

/// Asks, and returns the approved subset of `req.requested_paths` (in request order). The
/// person has until `[consent] timeout_ms` or `until` (the request's own deadline), whichever
/// comes first: a prompt whose request has already been answered is never shown.
pub(crate) fn ask(config: &ConsentConfig, req: &Request, until: std::time::Instant) -> Vec<String> {
    if req.requested_paths.is_empty() {
        return Vec::new();
    }
    let timeout = config
        .timeout
        .min(until.saturating_duration_since(std::time::Instant::now()));
    if timeout.is_zero() {
        tracing::info!("consent not asked: the request's time is up");
        return Vec::new();
    }
    let answer = if !config.command.is_empty() {
        command::ask(&config.command, req, timeout)
    } else if let Some(tty) = config.terminal.then(terminal::open).flatten() {
        terminal::ask(tty, req, timeout)
    } else {
        Err("no consent command is configured and there is no terminal to ask on".to_owned())
    };
    match answer {
        Ok(approved) => req
            .requested_paths
            .iter()
            .filter(|p| approved.contains(p))
            .cloned()
            .collect(),
        Err(why) => {
            tracing::warn!(reason = %why, paths = ?req.requested_paths, "consent denied");
            Vec::new()
        }
    }
}

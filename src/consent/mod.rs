//! Consent: the one place that decides whether a session may touch a path now.
//!
//! - `grants.rs`: what each session was granted, and [`allows`], the check every request,
//!   `roots/list` and the watcher's notifications go through. Revoking a root drops its
//!   grants ([`Grants::revoke_root`]); the broker does it on a reload or a revocation.
//! - `turns.rs`: whose turn it is to ask the person (one prompt per session, a few per
//!   broker), bounded by the request's deadline.
//! - this file and `command.rs`, `terminal.rs`, `desk.rs`: asking a person, the providers
//!   behind `consent = "prompt"` roots (`desk.rs` holds the prompts a console answers).
//!
//! The methods that lead here are `files/consent` (`methods/consent.rs`) and the offer of
//! `prompt` roots on a session's first `roots/list` (`methods/roots.rs`).
//!
//! `[consent] provider` says who is asked. With `auto` (the default), a request goes to the
//! external command named in the policy when there is one (an administrator's explicit
//! choice: a desktop dialog, an enterprise agent), else to the console when one is open
//! (`--console`), else to the controlling terminal when there is one and the policy allows
//! it, else nowhere: it fails closed, with a warning. Every provider is bounded by the
//! policy's `[consent] timeout_ms`; no answer is a denial. Providers block, so callers run
//! them on the blocking pool.
//!
//! A person may approve every path asked for, some of them, or a folder beneath one (narrowed
//! access); never anything else. What they approved is then placed where it really leads and
//! granted only if it is still inside what was asked (the methods do that).

mod command;
mod desk;
mod grants;
mod terminal;
mod turns;

pub use desk::{AnswerError, ConsoleOpen, Prompt, PromptAnswer, PromptPath};
pub(crate) use desk::{Desk, within};
pub use grants::GrantInfo;
pub(crate) use grants::{Grants, allows};
pub(crate) use turns::{BrokerTurns, SessionTurns, Turn};

use serde::Serialize;

use crate::policy::{ConsentConfig, Provider};

/// What a person is asked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Request {
    /// The MCP server's name, when known.
    pub server: Option<String>,
    /// The server's explanation (or the broker's, when `from_server` is false).
    pub message: String,
    /// Whether `message` is the server's words (`files/consent`) or the broker's (the offer
    /// of `prompt` roots on a first `roots/list`). Not sent to a command.
    #[serde(skip)]
    pub from_server: bool,
    /// Absolute canonical paths, all inside roots.
    pub requested_paths: Vec<String>,
    /// The session asking (shown on the console, not sent to a command).
    #[serde(skip)]
    pub session: u64,
    /// Each requested path with its root and mode (shown on the console).
    #[serde(skip)]
    pub details: Vec<PromptPath>,
}

/// `path` cut to what a log line keeps of it (`MAX_LOGGED_PATH` bytes).
fn cut(path: &str) -> &str {
    let mut end = path.len().min(crate::limits::MAX_LOGGED_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

/// Who will be asked, or `None` when nobody can be: then every `prompt` is a denial, and
/// nothing should be offered.
enum Asker {
    Command,
    Console,
    Terminal(std::fs::File),
}

fn asker(config: &ConsentConfig, desk: &Desk) -> Option<Asker> {
    let command = (!config.command.is_empty()).then_some(Asker::Command);
    let console = desk.is_open().then_some(Asker::Console);
    let terminal = || {
        config
            .terminal
            .then(terminal::open)
            .flatten()
            .map(Asker::Terminal)
    };
    match config.provider {
        Provider::Auto => command.or(console).or_else(terminal),
        Provider::Command => command,
        Provider::Console => console,
        Provider::Terminal => terminal(),
    }
}

/// Whether anyone can be asked now (see [`Provider`]). Without anyone every `prompt` is a
/// denial, and nothing should be offered.
pub(crate) fn available(config: &ConsentConfig, desk: &Desk) -> bool {
    asker(config, desk).is_some()
}

/// Asks, and returns what the person approved: paths of `req.requested_paths` (in request
/// order), and folders beneath them the person narrowed access to (as written; the caller
/// places and checks them). The person has until `[consent] timeout_ms` or `until` (the
/// request's own deadline), whichever comes first: a prompt whose request has already been
/// answered is never shown.
pub(crate) fn ask(
    config: &ConsentConfig,
    desk: &Desk,
    req: &Request,
    until: std::time::Instant,
) -> Vec<String> {
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
    let answer = match asker(config, desk) {
        Some(Asker::Command) => command::ask(&config.command, req, timeout),
        Some(Asker::Console) => desk.ask(req, timeout),
        Some(Asker::Terminal(tty)) => terminal::ask(tty, req, timeout),
        None => Err(format!(
            "nobody can be asked (provider {:?}: no command, no open console, no terminal)",
            config.provider
        )),
    };
    match answer {
        Ok(approved) => {
            let mut kept: Vec<String> = req
                .requested_paths
                .iter()
                .filter(|p| approved.contains(p))
                .cloned()
                .collect();
            // Then the narrowed ones, each beneath a path asked for and not already kept.
            for p in approved {
                let narrowed = !kept.contains(&p)
                    && req
                        .requested_paths
                        .iter()
                        .any(|asked| desk::within(&p, asked));
                if narrowed {
                    kept.push(p);
                }
            }
            kept
        }
        Err(why) => {
            tracing::warn!(
                reason = %why,
                paths = req.requested_paths.len(),
                first = ?req.requested_paths.first().map(|p| cut(p)),
                "consent denied"
            );
            Vec::new()
        }
    }
}

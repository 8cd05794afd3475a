//! `files/consent {message, requestedPaths}` → `{granted, approvedPaths}`.
//!
//! Each requested path is resolved like any other; paths outside every root or denied by a
//! glob are never approved. Then each root's consent mode decides: `auto` approves, `deny`
//! refuses, `prompt` asks a person ([`crate::consent`]) on the blocking pool, so other
//! requests of the session go on meanwhile. Each path is placed where it really leads
//! ([`Resolved::real`]) before anything else: the person is asked about exactly those
//! canonical paths, the server gets back exactly the approved ones, and they are what is
//! granted (a request through a link to a granted folder reaches it as well).

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::broker::Broker;
use crate::consent::{self, PromptPath, Request};
use crate::error::{Error, Result};
use crate::jsonrpc::Json;
use crate::limits::{MAX_CONSENT_MESSAGE, MAX_CONSENT_PATHS, MAX_LOGGED_PATH};
use crate::sandbox::{self, ConsentMode, Resolved, open};

/// `files/consent` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    #[serde(default)]
    message: String,
    requested_paths: Vec<String>,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    granted: bool,
    approved_paths: Vec<String>,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, mut params: Params) -> Result<Json<Reply>> {
    // A person reads every path and the message: beyond these bounds a request is no
    // question for a person, only a way to bury one (and the broker's time placing paths).
    if params.requested_paths.len() > MAX_CONSENT_PATHS {
        return Err(Error::invalid_params(format!(
            "at most {MAX_CONSENT_PATHS} requestedPaths per files/consent, not {}",
            params.requested_paths.len()
        )));
    }
    if params.message.len() > MAX_CONSENT_MESSAGE {
        let mut cut = MAX_CONSENT_MESSAGE;
        while !params.message.is_char_boundary(cut) {
            cut -= 1;
        }
        let whole = params.message.len();
        params.message.truncate(cut);
        params.message += &format!(" […cut: the server sent {whole} bytes]");
    }
    // One deadline for the wait for a turn and the work.
    let started = std::time::Instant::now();
    let turn = ctx.prompt_turn(started).await?;
    let broker = std::sync::Arc::clone(ctx.broker);
    let reply = ctx
        .owned_since(started)
        .run(move |op| consent(op, &broker, params))
        .await;
    drop(turn);
    reply.map(Json)
}

/// One requested path, placed where it really leads.
pub(super) struct Candidate {
    pub(super) real: Resolved,
    /// `real` as an absolute path: what the person sees and the server gets back.
    pub(super) absolute: String,
}

fn consent(op: &Op, broker: &Broker, p: Params) -> Result<Reply> {
    let mut approved: Vec<Candidate> = Vec::new();
    let mut to_ask: Vec<Candidate> = Vec::new();
    for raw in &p.requested_paths {
        let Some(c) = place(op, raw) else {
            continue;
        };
        if approved
            .iter()
            .chain(&to_ask)
            .any(|q| q.absolute == c.absolute)
        {
            continue;
        }
        match c.real.root().consent_at(c.real.rel()) {
            ConsentMode::Auto => approved.push(c),
            ConsentMode::Prompt => to_ask.push(c),
            ConsentMode::Deny => {}
        }
    }
    if !to_ask.is_empty() {
        let request = Request {
            server: op.state.peer_name(),
            message: p.message.clone(),
            from_server: true,
            requested_paths: to_ask.iter().map(|c| c.absolute.clone()).collect(),
            session: op.state.id,
            details: to_ask.iter().map(Candidate::shown).collect(),
        };
        let yes = consent::ask(
            op.policy.consent(),
            broker.desk(),
            &request,
            op.started + op.policy.limits().timeout,
        );
        for answer in yes {
            if let Some(c) = narrowed(op, &to_ask, &answer) {
                if !approved.iter().any(|q| q.absolute == c.absolute) {
                    approved.push(c);
                }
            }
        }
    }
    // A prompt answered after the deadline grants nothing: the server was told TIMEOUT.
    op.commit()?;
    // Only what a person approved is granted: a path approved because its root is `auto`
    // needs no grant, and a grant on it would cover any `prompt` root nested beneath it.
    let mut more_roots = false;
    for c in &approved {
        let root = c.real.root();
        if root.consent_at(c.real.rel()) == ConsentMode::Prompt {
            more_roots |= op.state.grants.grant(root.path(), c.real.absolute());
        }
    }
    // A granted part of a `prompt` root is now one of the session's roots.
    if more_roots {
        op.state.notify_roots_changed();
        broker.changed();
    }
    Ok(Reply {
        granted: !approved.is_empty(),
        approved_paths: approved.into_iter().map(|c| c.absolute).collect(),
    })
}

impl Candidate {
    /// The path as a prompt shows it: with its root and what the root allows there.
    fn shown(&self) -> PromptPath {
        PromptPath {
            path: self.absolute.clone(),
            root: self.real.root().name().to_owned(),
            mode: self.real.root().mode_at(self.real.rel()),
        }
    }
}

/// What the person approved (`answer`), placed where it really leads: one of `asked`, or a
/// folder the person narrowed one to, which counts only if it really is beneath the path
/// asked (not a link leading out of it) and still needs consent there.
fn narrowed(op: &Op, asked: &[Candidate], answer: &str) -> Option<Candidate> {
    if let Some(c) = asked.iter().find(|c| c.absolute == answer) {
        return Some(Candidate {
            real: c.real.clone(),
            absolute: c.absolute.clone(),
        });
    }
    let parent = asked
        .iter()
        .find(|c| consent::within(answer, &c.absolute))?;
    let c = place(op, answer)?;
    let inside = c.real.absolute().starts_with(parent.real.absolute());
    let prompted = c.real.root().consent_at(c.real.rel()) == ConsentMode::Prompt;
    if !(inside && prompted) {
        tracing::warn!(session = op.state.id, path = ?crate::audit::cap(answer, MAX_LOGGED_PATH), "consent: a narrowed path leads outside what was asked; not granted");
        return None;
    }
    Some(c)
}

/// Places a requested path where it really leads, or `None` (with a warning) when it may not
/// be approved at all: outside every root, through a link that leads out or nowhere, denied
/// by a glob, or one of fsbroker's own files.
pub(super) fn place(op: &Op, raw: &str) -> Option<Candidate> {
    let refuse = |why: &str| {
        tracing::warn!(session = op.state.id, path = ?crate::audit::cap(raw, MAX_LOGGED_PATH), "consent: {why}");
        None
    };
    let Ok(target) = sandbox::resolve(op.policy.roots(), raw) else {
        return refuse("not inside any root");
    };
    let real = match target.real(raw) {
        Ok(real) => real,
        Err(e) => return refuse(e.reason()),
    };
    if open::check_not_denied(&target, raw).is_err() || open::check_not_denied(&real, raw).is_err()
    {
        return refuse("denied by policy");
    }
    let Some(absolute) = real.absolute().to_str().map(str::to_owned) else {
        return refuse("not UTF-8");
    };
    Some(Candidate { real, absolute })
}

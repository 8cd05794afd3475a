//! `files/consent {message, requestedPaths}` → `{granted, approvedPaths}`.
//!
//! Each requested path is resolved like any other; paths outside every root or denied by a
//! glob are never approved. Then each root's consent mode decides: `auto` approves, `deny`
//! refuses, `prompt` asks a person ([`crate::consent`]) on the blocking pool, so other
//! requests of the session go on meanwhile. Approved paths are granted to this session as
//! subtrees, both as spelled and as they really resolve.

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::consent::{self, Request};
use crate::error::Result;
use crate::jsonrpc::Json;
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

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Result<Params>) -> Result<Json<Reply>> {
    let params = params?;
    ctx.owned()
        .run(move |op| consent(op, params))
        .await
        .map(Json)
}

/// One requested path, placed.
struct Candidate {
    target: Resolved,
    /// The path relative to the root with symlinks resolved (the lexical one if it does
    /// not exist yet).
    real: String,
    /// `root/real`, absolute: what the person sees and the server gets back.
    absolute: String,
}

fn consent(op: &Op, p: Params) -> Result<Reply> {
    let mut approved: Vec<Candidate> = Vec::new();
    let mut to_ask: Vec<Candidate> = Vec::new();
    for raw in &p.requested_paths {
        let Ok(target) = sandbox::resolve(op.policy.roots(), raw) else {
            tracing::warn!(session = op.state.id, path = %raw, "consent: not inside any root");
            continue;
        };
        if open::check_not_denied(&target, raw).is_err() {
            tracing::warn!(session = op.state.id, path = %raw, "consent: denied by policy");
            continue;
        }
        let real = target
            .root
            .dir()
            .canonicalize(target.rel_path())
            .ok()
            .and_then(|r| {
                r.to_str().map(|s| {
                    s.trim_start_matches("./")
                        .trim_start_matches('.')
                        .to_owned()
                })
            })
            .unwrap_or_else(|| target.rel.clone());
        // `join("")` would add a trailing slash; the root itself is its canonical path.
        let absolute = if real.is_empty() {
            target.root.path().to_path_buf()
        } else {
            target.root.path().join(&real)
        };
        let Some(absolute) = absolute.to_str().map(str::to_owned) else {
            continue;
        };
        let c = Candidate {
            target,
            real,
            absolute,
        };
        if approved
            .iter()
            .chain(&to_ask)
            .any(|q| q.absolute == c.absolute)
        {
            continue;
        }
        match c.target.root.consent() {
            ConsentMode::Auto => approved.push(c),
            ConsentMode::Prompt => to_ask.push(c),
            ConsentMode::Deny => {}
        }
    }
    if !to_ask.is_empty() {
        let request = Request {
            server: op.state.peer_name(),
            message: p.message.clone(),
            requested_paths: to_ask.iter().map(|c| c.absolute.clone()).collect(),
        };
        let yes = consent::ask(op.policy.consent(), &request);
        approved.extend(to_ask.into_iter().filter(|c| yes.contains(&c.absolute)));
    }
    // A prompt answered after the deadline grants nothing: the server was told TIMEOUT.
    op.commit()?;
    for c in &approved {
        let root = c.target.root.path();
        op.state.grant(root, &c.target.rel);
        op.state.grant(root, &c.real);
    }
    Ok(Reply {
        granted: !approved.is_empty(),
        approved_paths: approved.into_iter().map(|c| c.absolute).collect(),
    })
}

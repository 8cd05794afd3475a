//! `roots/list` → `{roots: [{uri, name}]}`.
//!
//! A session is shown only what it may use now: every root whose consent is `auto`, the whole
//! of a `prompt` root it was granted, and otherwise the granted parts of `prompt` roots
//! (named `NAME/rel`); never a `deny` root. A server that reads the disk itself (the
//! reference filesystem server does) takes `roots/list` as its access list, so listing a root
//! it may not use would hand it that root with no consent at all.
//!
//! Such a server never calls `files/consent`. So the first `roots/list` of a session offers
//! its `prompt` roots to the person, through the configured consent provider (none
//! configured: nothing is offered, and they stay unlisted); what is approved is granted and
//! listed in the same answer.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::broker::Broker;
use crate::consent::{self, PromptPath, Request};
use crate::error::Result;
use crate::jsonrpc::Json;
use crate::sandbox::{ConsentMode, Root, join_display};

/// `roots/list` takes no parameters but MCP's `_meta`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// One root as MCP describes it.
#[derive(Debug, Serialize)]
pub(crate) struct RootInfo {
    uri: String,
    name: String,
}

/// The result.
#[derive(Debug, Serialize)]
pub(crate) struct Reply {
    roots: Vec<RootInfo>,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, _params: Params) -> Result<Json<Reply>> {
    let state = ctx.state;
    if !state.roots_offered.swap(true, Ordering::AcqRel) {
        let unasked: Vec<Arc<Root>> = ctx
            .policy
            .roots()
            .iter()
            .filter(|r| r.consent_at("") == ConsentMode::Prompt && !state.grants.covers(r.path()))
            .cloned()
            .collect();
        if !unasked.is_empty() && consent::available(ctx.policy.consent(), ctx.broker.desk()) {
            // A refusal or a timeout only leaves the roots unlisted.
            let started = std::time::Instant::now();
            let offered = match ctx.prompt_turn(started).await {
                Ok(turn) => {
                    let broker = Arc::clone(ctx.broker);
                    let offered = ctx
                        .owned_since(started)
                        .run(move |op| offer(op, &broker, &unasked))
                        .await;
                    drop(turn);
                    offered
                }
                Err(e) => Err(e),
            };
            if let Err(e) = offered {
                tracing::warn!(session = ctx.state.id, error = %e, "roots/list: offering prompt roots failed");
            }
        }
    }
    let mut roots: Vec<RootInfo> = Vec::new();
    for root in ctx.policy.roots() {
        let whole = match root.consent_at("") {
            ConsentMode::Deny => continue,
            ConsentMode::Auto => true,
            ConsentMode::Prompt => state.grants.covers(root.path()),
        };
        let parts = if whole {
            vec![root.path().to_path_buf()]
        } else {
            state.grants.within(root.path())
        };
        for path in parts {
            let Ok(rel) = path.strip_prefix(root.path()) else {
                continue;
            };
            let rel = rel.to_string_lossy();
            if root.consent_at(&rel) == ConsentMode::Deny || root.is_denied(&rel) {
                continue;
            }
            let uri = uri_of(&path);
            if roots.iter().any(|r| r.uri == uri) {
                continue;
            }
            roots.push(RootInfo {
                uri,
                name: join_display(root.name(), &rel),
            });
        }
    }
    Ok(Json(Reply { roots }))
}

/// Asks the person about the session's ungranted `prompt` roots, and grants what they approve
/// (a whole root, or a folder in it the person narrowed it to).
fn offer(op: &Op, broker: &Broker, roots: &[Arc<Root>]) -> Result<()> {
    let paths: Vec<(PathBuf, String)> = roots
        .iter()
        .filter_map(|r| Some((r.path().to_path_buf(), r.path().to_str()?.to_owned())))
        .collect();
    let request = Request {
        server: op.state.peer_name(),
        message: "The server asks which folders it may use (roots/list).".to_owned(),
        from_server: false,
        requested_paths: paths.iter().map(|(_, p)| p.clone()).collect(),
        session: op.state.id,
        details: roots
            .iter()
            .filter_map(|r| {
                Some(PromptPath {
                    path: r.path().to_str()?.to_owned(),
                    root: r.name().to_owned(),
                    mode: r.mode(),
                })
            })
            .collect(),
    };
    let yes = consent::ask(
        op.policy.consent(),
        broker.desk(),
        &request,
        op.started + op.policy.limits().timeout,
    );
    // Narrowed folders are placed where they really lead first (off the commit point).
    let mut grants: Vec<(PathBuf, PathBuf)> = Vec::new();
    for answer in &yes {
        if let Some((path, _)) = paths.iter().find(|(_, text)| text == answer) {
            grants.push((path.clone(), path.clone()));
            continue;
        }
        let Some((root, _)) = paths.iter().find(|(_, text)| consent::within(answer, text)) else {
            continue;
        };
        let Some(c) = super::consent::place(op, answer) else {
            continue;
        };
        let real = c.real.absolute();
        if real.starts_with(root) && c.real.root().consent_at(c.real.rel()) == ConsentMode::Prompt {
            grants.push((c.real.root().path().to_path_buf(), real));
        } else {
            tracing::warn!(session = op.state.id, path = ?crate::audit::cap(answer, crate::limits::MAX_LOGGED_PATH), "roots/list: a narrowed path leads outside the root asked about; not granted");
        }
    }
    op.commit()?;
    for (root, path) in grants {
        op.state.grants.grant(&root, path);
    }
    broker.changed();
    Ok(())
}

/// A canonical absolute path as a `file://` URI: percent-encoded, no trailing slash.
fn uri_of(path: &std::path::Path) -> String {
    url::Url::from_file_path(path)
        .map(String::from)
        .unwrap_or_else(|()| format!("file://{}", path.display()))
}

//! `files/watch {path, recursive?, events?}` → `{watchId}`, and `files/unwatch {watchId}` →
//! `{}`. Changes then arrive as `notifications/files/changed {path, event, timestamp,
//! watchId}` ([`crate::watch`]).
//!
//! A watch is placed like any other operation: resolved beneath a root, refused outside every
//! root, under a deny glob, or without consent. The watched path is resolved through in-root
//! symlinks once, here; the watch then covers that real directory (or file) and, recursively,
//! never follows a symlink inside it.

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::Json;
use crate::methods::Empty;
use crate::sandbox::open;
use crate::watch::{Asker, EventSet, Spec, Subscriber};

/// `files/watch` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(default)]
    recursive: bool,
    events: Option<Vec<String>>,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    watch_id: String,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Json<Reply>> {
    let hub = std::sync::Arc::clone(ctx.broker.watches());
    ctx.owned()
        .run(move |op| watch(op, &hub, &params))
        .await
        .map(Json)
}

fn watch(op: &Op, hub: &crate::watch::WatchHub, p: &Params) -> Result<Reply> {
    let raw = p.path.as_str();
    let events = match &p.events {
        Some(names) => EventSet::parse(names)?,
        None => EventSet::ALL,
    };
    let target = op.resolve(raw)?;
    open::check_not_denied(&target, raw)?;
    let root = target.root();
    let meta = root
        .dir()
        .metadata(target.rel_path())
        .map_err(|e| Error::from_io(&e, raw))?;
    if !meta.is_dir() && !meta.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidPath,
            format!("cannot watch {}", open::describe(meta.file_type())),
        )
        .with_path(raw));
    }
    let real = target.real(raw)?;
    if root.is_denied(real.rel()) {
        return Err(open::denied(raw));
    }
    let id = crate::sandbox::protected::cap_id_of(&meta);
    if root.protected().is_own_file(&real.absolute(), Some(id)) {
        return Err(open::protected(raw));
    }
    op.authorize(root, real.rel(), raw)?;
    let spec = Spec {
        rel: real.rel().to_owned(),
        is_dir: meta.is_dir(),
        recursive: p.recursive,
        events,
    };
    let limit = op.policy.limits().timeout;
    let who = Asker {
        session: std::sync::Arc::downgrade(&op.state) as std::sync::Weak<dyn Subscriber>,
        session_id: op.state.id,
        max_watches: op.policy.limits().max_watches,
        raw,
        until: op.started + limit,
        limit,
    };
    // The commit comes once the watch is registered: a registration that outlasts
    // `timeout_ms` is undone rather than kept behind a TIMEOUT answer.
    let watch_id = hub.add(who, root, spec, || op.commit())?;
    Ok(Reply { watch_id })
}

/// `files/unwatch` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct UnwatchParams {
    watch_id: String,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// Answered on the async worker: it only takes the watch out of the session's reach; notify's
/// removal (a system call per directory of a recursive watch) is left to the hub's registrar.
pub(crate) async fn unwatch(ctx: &Ctx<'_>, p: UnwatchParams) -> Result<Json<Empty>> {
    ctx.broker.watches().remove(ctx.state.id, &p.watch_id)?;
    Ok(Json(Empty {}))
}

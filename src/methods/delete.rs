//! `files/delete {path, recursive?}` → `{}`.
//!
//! The last component is never followed: a symlink is removed, never its target. A non-empty
//! directory needs `recursive`, and is refused if anything beneath it is denied by policy
//! (deleting a tree must not reach files the server may not even see). The root itself is
//! never deleted.

use serde::Deserialize;

use super::{Ctx, Op};
use crate::error::Result;
use crate::jsonrpc::Json;
use crate::locks::LockMode;
use crate::methods::Empty;
use crate::sandbox::mutate;

/// `files/delete` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Json<Empty>> {
    ctx.owned().run(move |op| delete(op, &params)).await
}

fn delete(op: &Op, p: &Params) -> Result<Json<Empty>> {
    let raw = p.path.as_str();
    let target = op.resolve(raw)?;
    mutate::require_writable(&target, raw)?;
    if target.is_root() {
        return Err(mutate::root_itself("deleted", raw));
    }
    let parent = mutate::open_parent(&target, raw)?;
    op.authorize(target.root(), &parent.real, raw)?;
    let _lock = op.lock(&parent.key, LockMode::Exclusive, raw)?;
    parent.check_change("deleted", raw)?;
    let is_dir = parent.entry_type(raw)?.is_some_and(|t| t.is_dir());
    if p.recursive && is_dir {
        let deadline = op.started + op.policy.limits().timeout;
        mutate::check_tree(&parent, None, deadline, raw)?;
    }
    op.commit()?;
    parent.remove(p.recursive, raw)?;
    Ok(Json(Empty {}))
}

//! `files/unlock {lockId}` → `{}`: releases a kept lock of this session.

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;
use crate::jsonrpc::Json;
use crate::methods::Empty;

/// `files/unlock` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    lock_id: String,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

pub(crate) async fn handle(ctx: &Ctx<'_>, p: Params) -> Result<Json<Empty>> {
    ctx.broker.locks().unlock(&p.lock_id, ctx.state.id)?;
    Ok(Json(Empty {}))
}

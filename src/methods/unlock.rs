//! `files/unlock {lockId}` → `{}`: releases a kept lock of this session.

use serde::Deserialize;

use super::Ctx;
use crate::error::Result;
use crate::jsonrpc::Json;
use crate::methods::ping::Empty;

/// `files/unlock` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    lock_id: String,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

pub(crate) fn handle(ctx: &Ctx<'_>, params: Result<Params>) -> Result<Json<Empty>> {
    let p = params?;
    ctx.session
        .broker()
        .locks()
        .unlock(&p.lock_id, ctx.session.id())?;
    Ok(Json(Empty {}))
}

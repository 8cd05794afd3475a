//! `ping` → `{}`.

use serde::Deserialize;

use super::{Ctx, Empty};
use crate::error::Result;
use crate::jsonrpc::Json;

/// `ping` takes no parameters but MCP's `_meta`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

pub(crate) async fn handle(_ctx: &Ctx<'_>, _params: Params) -> Result<Json<Empty>> {
    Ok(Json(Empty {}))
}

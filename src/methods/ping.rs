//! `ping` → `{}`.

use serde::Deserialize;

use crate::error::Result;
use crate::jsonrpc::Json;

/// `ping` takes no parameters but MCP's `_meta`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// The empty result.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Empty {}

impl super::PayloadBytes for Empty {}

pub(crate) fn handle(params: Result<Params>) -> Result<Json<Empty>> {
    params.map(|_| Json(Empty {}))
}

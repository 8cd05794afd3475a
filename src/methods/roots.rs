//! `roots/list` → `{roots: [{uri, name}]}`.

use serde::{Deserialize, Serialize};

use super::Ctx;
use crate::error::Result;
use crate::jsonrpc::Json;

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

pub(crate) fn handle(ctx: &Ctx<'_>, params: Result<Params>) -> Result<Json<Reply>> {
    params?;
    let roots = ctx
        .policy
        .roots()
        .iter()
        .map(|r| RootInfo {
            uri: r.uri(),
            name: r.name().to_owned(),
        })
        .collect();
    Ok(Json(Reply { roots }))
}

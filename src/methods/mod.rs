//! One file per method; this module turns a method name into a call.
//!
//! Each method module owns its `Params` (serde, unknown fields refused so a typo is an error,
//! not a silent default), its result type and one `handle` function. Blocking file-system work
//! runs on tokio's blocking pool so a slow disk never stalls the session's other requests.

mod list;
mod ping;
mod read;
mod roots;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::{self, WriteResult};
use crate::policy::Policy;
use crate::session::Session;

/// What a handler sees: the policy snapshot for this request and the session.
pub(crate) struct Ctx<'a> {
    pub policy: Arc<Policy>,
    pub session: &'a Session,
}

/// The methods the broker answers, as a closed set.
enum Method {
    Ping,
    RootsList,
    FilesRead,
    FilesList,
    Unknown,
}

impl Method {
    fn from_name(name: &str) -> Method {
        match name {
            "ping" => Method::Ping,
            "roots/list" => Method::RootsList,
            "files/read" => Method::FilesRead,
            "files/list" => Method::FilesList,
            _ => Method::Unknown,
        }
    }
}

/// Runs one request and returns its response frame.
pub(crate) async fn call(
    session: &Session,
    method: &str,
    params: Option<&RawValue>,
    id: &RawValue,
) -> Vec<u8> {
    let ctx = Ctx {
        policy: session.broker().policy(),
        session,
    };
    match Method::from_name(method) {
        Method::Ping => respond(&ctx, method, id, ping::handle(parse(params))),
        Method::RootsList => respond(&ctx, method, id, roots::handle(&ctx, parse(params))),
        Method::FilesRead => match parse(params) {
            Ok(p) => respond(&ctx, method, id, read::handle(&ctx, p).await),
            Err(e) => jsonrpc::error_frame(Some(id), &e),
        },
        Method::FilesList => match parse(params) {
            Ok(p) => respond(&ctx, method, id, list::handle(&ctx, p).await),
            Err(e) => jsonrpc::error_frame(Some(id), &e),
        },
        Method::Unknown => {
            let err = Error::new(
                ErrorKind::MethodNotFound,
                format!("unknown method {method:?}"),
            );
            jsonrpc::error_frame(Some(id), &err)
        }
    }
}

fn respond<R: WriteResult + SizeHint>(
    ctx: &Ctx<'_>,
    method: &str,
    id: &RawValue,
    result: Result<R>,
) -> Vec<u8> {
    match result {
        Ok(r) => jsonrpc::result_frame(id, &r, r.size_hint()),
        Err(e) => {
            // Refusals are what an operator watches for: a server probing outside its roots.
            if e.kind() == ErrorKind::PermissionDenied {
                tracing::warn!(
                    session = ctx.session.id(),
                    method,
                    path = e.path().unwrap_or(""),
                    reason = e.reason(),
                    "refused"
                );
            }
            jsonrpc::error_frame(Some(id), &e)
        }
    }
}

/// How many bytes a result will roughly take, so its frame is allocated once.
pub(crate) trait SizeHint {
    fn size_hint(&self) -> usize {
        256
    }
}

impl<T> SizeHint for jsonrpc::Json<T> {}

/// Parses params; absent params read as `{}`.
///
/// Every method takes named params. serde would read an array into a struct by position,
/// which would let a server skip the unknown-field check, so arrays are refused here.
fn parse<P: DeserializeOwned>(params: Option<&RawValue>) -> Result<P> {
    let text = params.map_or("{}", RawValue::get);
    if !text.starts_with('{') {
        return Err(Error::invalid_params("params must be an object"));
    }
    serde_json::from_str(text).map_err(|e| Error::invalid_params(e.to_string()))
}

/// Runs blocking file-system work off the async worker threads.
async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(Error::new(
            ErrorKind::Internal,
            format!("worker failed: {e}"),
        ))
    })
}

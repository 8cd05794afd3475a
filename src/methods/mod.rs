//! One file per method; this module turns a method name into a call.
//!
//! Each method module owns its `Params` (serde, unknown fields refused so a typo is an error,
//! not a silent default), its result type and one `handle` function. Blocking file-system work
//! runs on tokio's blocking pool so a slow disk never stalls the session's other requests.

mod create;
mod delete;
mod list;
mod ping;
mod read;
mod rename;
mod roots;
mod unlock;
mod write;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::{self, WriteResult};
use crate::locks::{LockGuard, LockMode, LockTable};
use crate::policy::Policy;
use crate::session::Session;
use crate::upload::Uploads;

/// What a handler sees: the policy snapshot for this request and the session.
pub(crate) struct Ctx<'a> {
    pub policy: Arc<Policy>,
    pub session: &'a Session,
}

impl Ctx<'_> {
    /// The parts of the context that blocking work needs, owned so they can move to
    /// another thread.
    fn owned(&self) -> Op {
        Op {
            policy: Arc::clone(&self.policy),
            locks: Arc::clone(self.session.broker().locks()),
            session: self.session.id(),
            uploads: self.session.uploads().clone(),
        }
    }
}

/// An operation's context on the blocking pool.
#[derive(Clone)]
pub(crate) struct Op {
    pub policy: Arc<Policy>,
    pub locks: Arc<LockTable>,
    pub session: u64,
    pub uploads: Uploads,
}

impl Op {
    /// Locks `key` for this operation (`FILE_LOCKED` at once if another session holds it).
    fn lock(&self, key: &std::path::Path, mode: LockMode, raw: &str) -> Result<LockGuard> {
        self.locks
            .acquire(key.to_path_buf(), self.session, mode, raw)
    }

    /// With `keepLocked`, refuses *before* any work when the session's kept locks are at
    /// `max_locks`: a request answered `QUOTA_EXCEEDED` must not have changed anything.
    fn check_keep_quota(&self, keep: bool, raw: &str) -> Result<()> {
        if keep {
            self.locks
                .check_keep_quota(self.session, self.policy.limits().max_locks, raw)?;
        }
        Ok(())
    }

    /// With `keepLocked`, turns the operation's exclusive lock into a kept lock.
    fn keep(&self, guard: &LockGuard, keep: bool, raw: &str) -> Result<Option<String>> {
        if !keep {
            return Ok(None);
        }
        let limits = self.policy.limits();
        self.locks
            .keep(guard, limits.lock_timeout, limits.max_locks, raw)
            .map(Some)
    }
}

/// The methods the broker answers, as a closed set.
enum Method {
    Ping,
    RootsList,
    FilesRead,
    FilesList,
    FilesWrite,
    FilesCreate,
    FilesDelete,
    FilesRename,
    FilesUnlock,
    Unknown,
}

impl Method {
    fn from_name(name: &str) -> Method {
        match name {
            "ping" => Method::Ping,
            "roots/list" => Method::RootsList,
            "files/read" => Method::FilesRead,
            "files/list" => Method::FilesList,
            "files/write" => Method::FilesWrite,
            "files/create" => Method::FilesCreate,
            "files/delete" => Method::FilesDelete,
            "files/rename" => Method::FilesRename,
            "files/unlock" => Method::FilesUnlock,
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
        Method::FilesRead => respond(&ctx, method, id, read::handle(&ctx, parse(params)).await),
        Method::FilesList => respond(&ctx, method, id, list::handle(&ctx, parse(params)).await),
        Method::FilesWrite => respond(&ctx, method, id, write::handle(&ctx, parse(params)).await),
        Method::FilesCreate => respond(&ctx, method, id, create::handle(&ctx, parse(params)).await),
        Method::FilesDelete => respond(&ctx, method, id, delete::handle(&ctx, parse(params)).await),
        Method::FilesRename => respond(&ctx, method, id, rename::handle(&ctx, parse(params)).await),
        Method::FilesUnlock => respond(&ctx, method, id, unlock::handle(&ctx, parse(params))),
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

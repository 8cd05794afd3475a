//! One file per method; this module turns a method name into a call.
//!
//! Each method module owns its `Params` (serde, unknown fields refused so a typo is an error,
//! not a silent default), its result type and one `handle` function. Blocking file-system work
//! runs on tokio's blocking pool so a slow disk never stalls the session's other requests.

mod consent;
mod create;
mod delete;
mod list;
mod ping;
mod read;
mod rename;
mod roots;
mod unlock;
mod watch;
mod write;

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{AuditError, AuditLog, Record};
use crate::error::{Error, ErrorKind, Result};
use crate::fast::{FastPath, Late, LateAudit, Ticket};
use crate::jsonrpc::{self, Incoming, WriteResult};
use crate::limits::{self, Deadline};
use crate::locks::{LockGuard, LockMode, LockTable};
use crate::outgoing::{Body, Outgoing};
use crate::policy::Policy;
use crate::sandbox::{self, ConsentMode, Resolved, Root};
use crate::session::{PEER_NOTIFICATION, Received, Session, SessionState};

/// What a handler sees: the policy snapshot for this request and the session.
pub(crate) struct Ctx<'a> {
    pub policy: Arc<Policy>,
    pub session: &'a Session,
    /// The request's arrival number in its session (see `SessionState::earlier_unfinished`).
    pub arrival: u64,
    /// How the fast path's watchdog answers this request if it gets stuck there.
    pub late: Option<Arc<Late>>,
}

impl Ctx<'_> {
    /// The parts of the context that blocking work needs, owned so they can move to
    /// another thread.
    fn owned(&self) -> Op {
        self.owned_since(Instant::now())
    }

    /// [`Ctx::owned`] for small work that may take the fast path ([`Op::run_small`]): it
    /// carries how the watchdog answers the request if the work gets stuck there.
    fn owned_inline(&self) -> Op {
        Op {
            late: self.late.clone(),
            ..self.owned()
        }
    }

    /// [`Ctx::owned`] for an operation whose `timeout_ms` started counting at `started`.
    fn owned_since(&self, started: Instant) -> Op {
        Op {
            policy: Arc::clone(&self.policy),
            locks: Arc::clone(self.session.broker().locks()),
            pool: Arc::clone(self.session.broker().pool()),
            fast: Arc::clone(self.session.broker().fast()),
            late: None,
            state: Arc::clone(self.session.state()),
            deadline: Arc::default(),
            started,
            audit: self.session.broker().audit().map(|a| a.health()),
            stopping: self.session.broker().stop_signal(),
        }
    }
}

impl Ctx<'_> {
    /// Waits for this request's turn to ask the person (consent prompts, the offer of
    /// `prompt` roots): one prompt at a time per session, and at most [`crate::broker::PROMPTS`] running
    /// in the broker. A prompt waits for a person on a thread of the blocking pool; without
    /// these bounds, sessions queueing prompts nobody answers would hold every thread. The
    /// wait counts against `timeout_ms` (`TIMEOUT` when it runs out).
    async fn prompt_turn(&self, started: Instant) -> Result<PromptTurn> {
        let limit = self.policy.limits().timeout;
        let until = tokio::time::Instant::from_std(started + limit);
        let state = self.session.state();
        let mine = tokio::time::timeout_at(until, Arc::clone(&state.prompting).acquire_owned());
        let Ok(Ok(mine)) = mine.await else {
            return Err(limits::timed_out(limit));
        };
        let any = Arc::clone(self.session.broker().prompts()).acquire_owned();
        let Ok(Ok(any)) = tokio::time::timeout_at(until, any).await else {
            return Err(limits::timed_out(limit));
        };
        Ok(PromptTurn {
            _mine: mine,
            _any: any,
        })
    }
}

/// A request's turn to ask the person; see [`Ctx::prompt_turn`].
pub(crate) struct PromptTurn {
    _mine: OwnedSemaphorePermit,
    _any: OwnedSemaphorePermit,
}

/// An operation's context on the blocking pool.
#[derive(Clone)]
pub(crate) struct Op {
    pub policy: Arc<Policy>,
    pub locks: Arc<LockTable>,
    /// The blocking pool's slots, shared fairly between sessions.
    pub pool: Arc<crate::fair::FairPool>,
    /// The inline path for small work ([`Op::run_small`]).
    pub fast: Arc<FastPath>,
    /// How the fast path's watchdog answers the request if the work gets stuck there.
    pub late: Option<Arc<Late>>,
    pub state: Arc<SessionState>,
    pub deadline: Arc<Deadline>,
    /// When the request's blocking work was set up: `timeout_ms` counts from here.
    pub started: Instant,
    /// The audit log's health, checked again at the commit point.
    pub audit: Option<Arc<crate::audit::Health>>,
    /// Resolves when the broker is asked to stop: work that has not committed then answers
    /// `TIMEOUT` at once, so the run ends (and seals its log) within its grace.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

impl Op {
    /// Runs blocking file-system work off the async worker threads, bounded by
    /// `timeout_ms`. Past the deadline the caller gets `TIMEOUT` and the work, which keeps
    /// running on its thread, rolls back at its commit point ([`Op::commit`]) — unless it had
    /// already reached it, in which case its own result stands and is returned.
    async fn run<T, F>(self, f: F) -> Result<T>
    where
        F: FnOnce(&Op) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let limit = self.policy.limits().timeout;
        let until = tokio::time::Instant::from_std(self.started + limit);
        let deadline = Arc::clone(&self.deadline);
        let mut stop = self.stopping.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        tokio::pin!(stopped);
        // A slot first (waiting counts against the deadline), then a thread; the slot stays
        // with the work until it ends, also past a TIMEOUT answer.
        let slot = tokio::select! {
            slot = tokio::time::timeout_at(until, self.pool.acquire(self.state.id)) => slot.ok(),
            () = &mut stopped => None,
        };
        let Some(slot) = slot else {
            deadline.expire();
            return Err(limits::timed_out(limit));
        };
        let mut task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            // Queued behind other work past the deadline: the caller has its TIMEOUT already.
            if self.deadline.expired() {
                return Err(limits::timed_out(limit));
            }
            f(&self)
        });
        // Past the deadline, or once the broker is stopping, work that has not reached its
        // commit point answers TIMEOUT (and rolls back there); work already committing is
        // waited for.
        let ended = tokio::select! {
            joined = tokio::time::timeout_at(until, &mut task) => joined.ok(),
            () = &mut stopped => None,
        };
        let joined = match ended {
            Some(joined) => joined,
            None if deadline.expire() => return Err(limits::timed_out(limit)),
            None => task.await,
        };
        joined.unwrap_or_else(|e| {
            Err(Error::new(
                ErrorKind::Internal,
                format!("worker failed: {e}"),
            ))
        })
    }

    /// [`Op::run`] for work that is small by construction (a read of a few kilobytes): it
    /// runs inline on this thread when the broker's fast path is free (`crate::fast`), which
    /// saves two thread hand-offs, and on the pool otherwise. `timeout_ms` holds either way.
    async fn run_small<T, F>(self, f: F) -> Result<T>
    where
        F: FnOnce(&Op) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let Some(late) = self.late.clone() else {
            // Nobody to answer for it if it got stuck (the library's `Session::handle`).
            return self.run(f).await;
        };
        let limit = self.policy.limits().timeout;
        let ticket = Ticket {
            until: self.started + limit,
            limit,
            deadline: Arc::clone(&self.deadline),
            late,
        };
        match Arc::clone(&self.fast).try_run(ticket, &self, f) {
            Ok(done) => done,
            // On the pool the request is answered by its own task, which never waits past the
            // deadline: it needs no late answer.
            Err(f) => Op { late: None, ..self }.run(f).await,
        }
    }

    /// The point of no return of a mutation: fails with `TIMEOUT` (and the caller rolls
    /// back) when the operation's deadline has passed.
    ///
    /// Also fails, with the answer a request gets when the audit log cannot be written, once
    /// the log has failed since the request began: requests already in flight when the log
    /// fails (pipelined deletes, say) must not act unrecorded. Only work past its commit point
    /// when the log failed can still complete; it is named on stderr when its line fails.
    ///
    /// And it waits, until the deadline at most, for the log to be free to take the request's
    /// line (another broker may hold it): `TIMEOUT` means "not done", so a request must not
    /// act and then find that its line cannot be written in time.
    fn commit(&self) -> Result<()> {
        let limit = self.policy.limits().timeout;
        if let Some(health) = &self.audit {
            if !health.ok() {
                return Err(audit_unavailable());
            }
            if !health.wait_free(self.started + limit) {
                self.deadline.expire();
                return Err(limits::timed_out(limit));
            }
        }
        self.deadline.commit(limit)
    }

    /// Resolves a request path (docs/protocol.md, "Paths") and checks that this session may touch it: a path where
    /// the consent of a root covering it is not `auto` needs a grant covering it, as spelled
    /// or where it really leads (grants are made on real paths, the ones the person saw).
    fn resolve(&self, raw: &str) -> Result<Resolved> {
        let target = sandbox::resolve(self.policy.roots(), raw)?;
        if self.authorize(target.root(), target.rel(), raw).is_err() {
            let real = target.real(raw).map_err(|_| no_consent(raw))?;
            self.authorize(real.root(), real.rel(), raw)?;
        }
        Ok(target)
    }

    /// The consent check for `rel` of `root`: the strictest consent mode of every root that
    /// covers it decides, and `prompt` needs a grant covering the path. Handlers call it
    /// again on where a path really leads (a symlink inside a granted subtree must not carry
    /// the session into an ungranted one).
    fn authorize(&self, root: &Root, rel: &str, raw: &str) -> Result<()> {
        let allowed = match root.consent_at(rel) {
            ConsentMode::Auto => true,
            ConsentMode::Deny => false,
            ConsentMode::Prompt => self.state.is_granted(&root.join(rel)),
        };
        if allowed {
            Ok(())
        } else {
            Err(no_consent(raw))
        }
    }

    /// Locks `key` for this operation (`FILE_LOCKED` at once if another session holds it).
    fn lock(&self, key: &std::path::Path, mode: LockMode, raw: &str) -> Result<LockGuard> {
        self.locks
            .acquire(key.to_path_buf(), self.state.id, mode, raw)
    }

    /// With `keepLocked`, refuses *before* any work when the session's kept locks are at
    /// `max_locks`: a request answered `QUOTA_EXCEEDED` must not have changed anything.
    fn check_keep_quota(&self, keep: bool, raw: &str) -> Result<()> {
        if keep {
            self.locks
                .check_keep_quota(self.state.id, self.max_kept(), raw)?;
        }
        Ok(())
    }

    /// With `keepLocked`, turns the operation's exclusive lock into a kept lock.
    fn keep(&self, guard: &LockGuard, keep: bool, raw: &str) -> Result<Option<String>> {
        if !keep {
            return Ok(None);
        }
        // A kept lock outlives the request: an answer of TIMEOUT must not leave one behind.
        // (The deadline only: this runs after the change, which the audit check guards.)
        self.deadline.commit(self.policy.limits().timeout)?;
        let limits = self.policy.limits();
        self.locks
            .keep(guard, limits.lock_timeout, self.max_kept(), raw)
            .map(Some)
    }

    /// How many kept locks the session may hold: `max_locks`, less its unfinished uploads
    /// (which hold locks too).
    fn max_kept(&self) -> u32 {
        let uploads = u32::try_from(self.state.uploads.len()).unwrap_or(u32::MAX);
        self.policy.limits().max_locks.saturating_sub(uploads)
    }
}

/// The `files/*` methods the broker answers (declared by the proxy in the MCP 2026-07-28
/// extension it advertises).
pub(crate) const FILES_METHODS: [&str; 10] = [
    "files/read",
    "files/list",
    "files/write",
    "files/create",
    "files/delete",
    "files/rename",
    "files/unlock",
    "files/consent",
    "files/watch",
    "files/unwatch",
];

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
    FilesConsent,
    FilesWatch,
    FilesUnwatch,
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
            "files/consent" => Method::FilesConsent,
            "files/watch" => Method::FilesWatch,
            "files/unwatch" => Method::FilesUnwatch,
            _ => Method::Unknown,
        }
    }
}

/// Runs one request and returns its response frame; writes its audit line when the broker
/// keeps an audit log, and refuses it when that log cannot be written.
pub(crate) async fn call(
    session: &Session,
    method: &str,
    params: Option<&RawValue>,
    id: &RawValue,
    arrival: u64,
    late: Option<&Arc<Late>>,
) -> Outgoing {
    let started = Instant::now();
    let audit = session
        .broker()
        .audit()
        .filter(|_| method == "roots/list" || method.starts_with("files/"));
    // The paths the audit line names, read once: a read may take the fast path, where the
    // watchdog may answer it and write its line, so it needs them before the work runs.
    let paths: Option<AuditPaths> = audit.map(|_| {
        params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or_default()
    });
    if let (Some(log), Some(late), Some(paths), "files/read") = (audit, late, &paths, method) {
        late.audit_with(LateAudit {
            log: Arc::clone(log),
            session: session.id(),
            method: "files/read",
            path: paths.path.clone(),
            server: session.state().peer_name(),
            started,
        });
    }
    let mut also_refused = 0;
    let (frame, outcome) = if audit.is_some_and(|a| !a.is_healthy()) {
        // Refused before it runs. The refusal is still recorded when only a required copy
        // was lost: the file itself takes lines.
        let e = audit_unavailable();
        let code = e.kind().outcome();
        (
            jsonrpc::error_frame(Some(id), &e).into(),
            Outcome { code, bytes: 0 },
        )
    } else if method == "ping" {
        dispatch(session, method, params, id, arrival, late).await
    } else {
        match session.broker().rate_limits().check_request(session.id()) {
            Ok(()) => dispatch(session, method, params, id, arrival, late).await,
            Err(e) => {
                let frame = jsonrpc::error_frame(Some(id), &e).into();
                if audit.is_some() {
                    match session.state().rate_refusal_line() {
                        Some(folded) => also_refused = folded,
                        // Counted in the session's next such line.
                        None => return frame,
                    }
                }
                let code = e.kind().outcome();
                (frame, Outcome { code, bytes: 0 })
            }
        }
    };
    if late.is_some_and(|l| l.audited()) {
        // Answered and recorded by the watchdog; this answer is dropped.
        return frame;
    }
    if let (Some(log), Some(paths)) = (audit, paths) {
        let server = session.state().peer_name();
        let record = Record {
            session: session.id(),
            method,
            path: paths.path.as_deref().or(paths.old_path.as_deref()),
            new_path: paths.new_path.as_deref(),
            paths: paths.requested_paths.as_deref(),
            outcome: outcome.code,
            bytes: outcome.bytes,
            duration: started.elapsed(),
            server: server.as_deref(),
            also_refused,
        };
        // The line waits for the log no longer than the request's own deadline: past it a
        // request that only looked (a read, a listing) answers TIMEOUT and its content is not
        // sent. One that acted (its commit point found the log free) gets a second deadline,
        // and if its line still cannot be written the log fails closed.
        let limit = session.broker().policy().limits().timeout;
        let acted =
            outcome.code == "ok" && !matches!(method, "files/read" | "files/list" | "roots/list");
        let mut written = AuditLog::record_async(Arc::clone(log), &record, started + limit).await;
        if acted && matches!(written, Err(AuditError::Late { .. })) {
            written =
                AuditLog::record_async(Arc::clone(log), &record, Instant::now() + limit).await;
            if let Err(e) = &written {
                log.fail_closed(e);
            }
        }
        if let Err(e) = written {
            if matches!(e, AuditError::Late { .. }) && !acted {
                return jsonrpc::error_frame(Some(id), &limits::timed_out(limit)).into();
            }
            if outcome.code == "ok" {
                // It acted and its line is not in the log: say what it did, where it can be read.
                tracing::error!(
                    session = session.id(),
                    method,
                    path =
                        crate::audit::cap(record.path.unwrap_or(""), crate::audit::MAX_LOGGED_PATH),
                    new_path = crate::audit::cap(
                        record.new_path.unwrap_or(""),
                        crate::audit::MAX_LOGGED_PATH
                    ),
                    "this request took effect but its audit line could not be written"
                );
            }
            return jsonrpc::error_frame(Some(id), &audit_unavailable()).into();
        }
    }
    frame
}

fn no_consent(raw: &str) -> Error {
    Error::new(ErrorKind::PermissionDenied, "no consent").with_path(raw)
}

fn audit_unavailable() -> Error {
    Error::new(ErrorKind::Io, "audit log unavailable")
}

/// The paths a request names, for its audit line; everything else in the params is ignored.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditPaths {
    path: Option<String>,
    old_path: Option<String>,
    new_path: Option<String>,
    requested_paths: Option<Vec<String>>,
}

/// How a request ended, for the audit log.
struct Outcome {
    /// `ok`, or the error's `data.code` (or JSON-RPC name).
    code: &'static str,
    /// Payload bytes read or written.
    bytes: u64,
}

async fn dispatch(
    session: &Session,
    method: &str,
    params: Option<&RawValue>,
    id: &RawValue,
    arrival: u64,
    late: Option<&Arc<Late>>,
) -> (Outgoing, Outcome) {
    let ctx = Ctx {
        policy: session.broker().policy(),
        session,
        arrival,
        late: late.cloned(),
    };
    let c = &ctx;
    match Method::from_name(method) {
        Method::Ping => respond(c, method, id, ping::handle(parse(params))),
        Method::RootsList => respond(c, method, id, roots::handle(c, parse(params)).await),
        Method::FilesRead => respond(c, method, id, read::handle(c, parse(params)).await),
        Method::FilesList => respond(c, method, id, list::handle(c, parse(params)).await),
        Method::FilesWrite => respond(c, method, id, write::handle(c, parse(params)).await),
        Method::FilesCreate => respond(c, method, id, create::handle(c, parse(params)).await),
        Method::FilesDelete => respond(c, method, id, delete::handle(c, parse(params)).await),
        Method::FilesRename => respond(c, method, id, rename::handle(c, parse(params)).await),
        Method::FilesUnlock => respond(c, method, id, unlock::handle(c, parse(params))),
        Method::FilesConsent => respond(c, method, id, consent::handle(c, parse(params)).await),
        Method::FilesWatch => respond(c, method, id, watch::handle(c, parse(params)).await),
        Method::FilesUnwatch => respond(c, method, id, watch::unwatch(c, parse(params))),
        Method::Unknown => {
            let err = Error::new(
                ErrorKind::MethodNotFound,
                format!("unknown method {method:?}"),
            );
            let code = err.kind().outcome();
            (
                jsonrpc::error_frame(Some(id), &err).into(),
                Outcome { code, bytes: 0 },
            )
        }
    }
}

fn respond<R: WriteResult + ReplyInfo>(
    ctx: &Ctx<'_>,
    method: &str,
    id: &RawValue,
    result: Result<R>,
) -> (Outgoing, Outcome) {
    match result {
        Ok(mut r) => {
            let body = r.take_body();
            let budget = r.take_budget();
            let modern = ctx.session.state().is_modern();
            let frame =
                jsonrpc::result_frame_with(id, &r, r.size_hint(), body, modern).hold(budget);
            let bytes = r.bytes();
            (frame, Outcome { code: "ok", bytes })
        }
        Err(e) => {
            // Refusals are what an operator watches for: a server probing outside its roots.
            if e.kind() == ErrorKind::PermissionDenied {
                tracing::warn!(
                    session = ctx.session.id(),
                    method,
                    // A server chooses its paths' length; stderr gets at most PATH_MAX of one.
                    path = crate::audit::cap(e.path().unwrap_or(""), crate::audit::MAX_LOGGED_PATH),
                    reason = e.reason(),
                    "refused"
                );
            }
            let code = e.kind().outcome();
            (
                jsonrpc::error_frame(Some(id), &e).into(),
                Outcome { code, bytes: 0 },
            )
        }
    }
}

/// Admits `bytes` of payload under the session's byte rate, waiting for the part beyond the
/// burst but never past `timeout_ms`.
async fn admit_bytes(ctx: &Ctx<'_>, bytes: u64) -> Result<()> {
    let limit = ctx.policy.limits().timeout;
    let rate = ctx.session.broker().rate_limits();
    match tokio::time::timeout(limit, rate.admit_bytes(ctx.session.id(), bytes)).await {
        Ok(admitted) => admitted,
        Err(_) => Err(limits::timed_out(limit)),
    }
}

/// What a result says about itself: its rough size (so its frame is allocated once), the
/// payload bytes it carries (for the audit log), and what it hands to its frame: a body in
/// pages of its own, and a share of the session's output budget.
pub(crate) trait ReplyInfo {
    fn size_hint(&self) -> usize {
        256
    }
    fn bytes(&self) -> u64 {
        0
    }
    fn take_body(&mut self) -> Option<Body> {
        None
    }
    fn take_budget(&mut self) -> Option<OwnedSemaphorePermit> {
        None
    }
}

/// Payload bytes of a serialized result type (most carry none).
pub(crate) trait PayloadBytes {
    fn payload_bytes(&self) -> u64 {
        0
    }
}

impl<T: PayloadBytes> ReplyInfo for jsonrpc::Json<T> {
    fn bytes(&self) -> u64 {
        self.0.payload_bytes()
    }
}

/// Parses params; absent params read as `{}`.
///
/// Every method takes named params. serde would read an array into a struct by position,
/// which would let a server skip the unknown-field check, so arrays are refused here.
fn parse<'a, P: Deserialize<'a>>(params: Option<&'a RawValue>) -> Result<P> {
    let text = params.map_or("{}", RawValue::get);
    if !text.starts_with('{') {
        return Err(Error::invalid_params("params must be an object"));
    }
    serde_json::from_str(text).map_err(|e| Error::invalid_params(e.to_string()))
}

// The session's entry points live beside the dispatch they lead to: the session layer below
// holds a connection's state and knows nothing of the methods.
impl Session {
    /// Handles one message (a line without its newline) and returns the response frame,
    /// newline included, or `None` when the message gets no answer (a notification, or a
    /// response to a request the broker never sent).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fsbroker::{Broker, Overrides, Policy};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let policy = Policy::load(None, &Overrides { roots: vec![dir.path().into()], ..Default::default() })?;
    /// let session = Broker::new(policy)?.session();
    /// // A path that leads out of the root is refused, however it is spelled.
    /// let reply = session
    ///     .handle(br#"{"jsonrpc":"2.0","id":7,"method":"files/read","params":{"path":"../../etc/passwd"}}"#)
    ///     .await
    ///     .unwrap();
    /// let reply: serde_json::Value = serde_json::from_slice(&reply)?;
    /// assert_eq!(reply["id"], 7);
    /// assert!(reply["error"]["data"]["code"].is_string(), "{reply}");
    /// // A notification gets no answer.
    /// let none = session.handle(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).await;
    /// assert!(none.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn handle(&self, line: &[u8]) -> Option<Vec<u8>> {
        self.respond(line).await.map(Outgoing::into_vec)
    }

    /// [`Session::handle`] for transports: the response as an [`Outgoing`] frame, whose large
    /// body (a base64 chunk) has not been copied into the rest of the frame.
    pub(crate) async fn respond(&self, line: &[u8]) -> Option<Outgoing> {
        self.respond_received(line, self.received(), None).await
    }

    /// [`Session::respond`] for a request already counted by [`Session::received`]. With
    /// `late` (a transport that can take an answer from another thread), a request stuck on
    /// the fast path is answered `TIMEOUT` through it at its deadline, and `None` is returned
    /// when it finally ends.
    pub(crate) async fn respond_received(
        &self,
        line: &[u8],
        received: Received,
        late: Option<&Arc<Late>>,
    ) -> Option<Outgoing> {
        match jsonrpc::parse(line) {
            Incoming::Request { id, method, params } => {
                let arrival = received.arrival();
                // Without `late`, `received` lives until the answer is built.
                let _received = match late {
                    Some(late) => {
                        late.hold(id, received);
                        None
                    }
                    None => Some(received),
                };
                let frame = call(self, &method, params, id, arrival, late).await;
                // Answered: its place goes now, as `_received` does for the pool's callers.
                if let Some(late) = late {
                    late.release();
                }
                match late {
                    Some(late) if late.answered() => None,
                    _ => Some(frame),
                }
            }
            Incoming::Notification { method, params } => {
                if method == PEER_NOTIFICATION {
                    self.learn_peer(params).await;
                } else {
                    tracing::debug!(session = self.id(), %method, "notification");
                }
                None
            }
            Incoming::Response => {
                tracing::debug!(
                    session = self.id(),
                    "ignoring a response to no request of ours"
                );
                None
            }
            Incoming::Invalid { id, error } => {
                tracing::debug!(session = self.id(), %error, "invalid message");
                Some(jsonrpc::error_frame(id, &error).into())
            }
        }
    }
}

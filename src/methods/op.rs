//! An operation's runtime: what a handler sees of its session ([`Ctx`]), and the context its
//! work carries onto the blocking pool ([`Op`]): resolve a path and authorize it, lock it,
//! check quotas, reach the commit point, and run inline on the fast path or on the pool,
//! bounded by `timeout_ms` either way.

use std::sync::Arc;
use std::time::Instant;

use crate::broker::Broker;
use crate::buffers::Content;
use crate::consent;
use crate::error::{Error, ErrorKind, Result};
use crate::fast::{FastPath, Late, Ticket};
use crate::locks::{LockGuard, LockMode, LockTable};
use crate::policy::Policy;
use crate::sandbox::{self, Resolved, Root};
use crate::session::SessionState;
use crate::throttle::{self, Deadline, Prepaid};

/// What a handler sees: the policy snapshot for this request and the session.
pub(crate) struct Ctx<'a> {
    pub policy: Arc<Policy>,
    pub broker: &'a Arc<Broker>,
    pub state: &'a Arc<SessionState>,
    /// The request's arrival number in its session (see `SessionState::earlier_unfinished`).
    pub arrival: u64,
    /// How the fast path's watchdog answers this request if it gets stuck there.
    pub late: Option<Arc<Late>>,
    /// An upload chunk's content, lifted out of its line before parsing
    /// (`jsonrpc::lift`), unchecked; its `content` then parses to `jsonrpc::placeholder()`.
    /// Taken by the method that reads it.
    pub lifted: std::sync::Mutex<Option<Content<'a>>>,
}

impl Ctx<'_> {
    /// The parts of the context that blocking work needs, owned so they can move to
    /// another thread.
    pub(super) fn owned(&self) -> Op {
        self.owned_since(Instant::now())
    }

    /// [`Ctx::owned`] for small work that may take the fast path ([`Op::run_small`]): it
    /// carries how the watchdog answers the request if the work gets stuck there.
    pub(super) fn owned_inline(&self) -> Op {
        Op {
            late: self.late.clone(),
            ..self.owned()
        }
    }

    /// [`Ctx::owned`] for an operation whose `timeout_ms` started counting at `started`.
    pub(super) fn owned_since(&self, started: Instant) -> Op {
        Op {
            policy: Arc::clone(&self.policy),
            locks: Arc::clone(self.broker.locks()),
            pool: Arc::clone(self.broker.pool()),
            fast: Arc::clone(self.broker.fast()),
            late: None,
            state: Arc::clone(self.state),
            deadline: Arc::default(),
            started,
            audit: self.broker.audit().map(|a| a.health()),
            stopping: self.broker.stop_signal(),
        }
    }
}

impl Ctx<'_> {
    /// Waits for this request's turn to ask the person (consent prompts, the offer of
    /// `prompt` roots; see `consent/turns.rs`), until its `timeout_ms`.
    pub(super) async fn prompt_turn(&self, started: Instant) -> Result<consent::Turn> {
        let limit = self.policy.limits().timeout;
        self.state
            .turns
            .take(self.broker.turns(), started, limit)
            .await
    }
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
    pub(super) async fn run<T, F>(self, f: F) -> Result<T>
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
            return Err(throttle::timed_out(limit));
        };
        let mut task = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            // Queued behind other work past the deadline: the caller has its TIMEOUT already.
            if self.deadline.expired() {
                return Err(throttle::timed_out(limit));
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
            None if deadline.expire() => return Err(throttle::timed_out(limit)),
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
    pub(super) async fn run_small<T, F>(self, f: F) -> Result<T>
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
    pub(super) fn commit(&self) -> Result<()> {
        let limit = self.policy.limits().timeout;
        if let Some(health) = &self.audit {
            if !health.ok() {
                return Err(audit_unavailable());
            }
            if !health.wait_free(self.started + limit) {
                self.deadline.expire();
                return Err(throttle::timed_out(limit));
            }
        }
        self.deadline.commit(limit)
    }

    /// Resolves a request path (docs/protocol.md, "Paths") and checks that this session may touch it: a path where
    /// the consent of a root covering it is not `auto` needs a grant covering it, as spelled
    /// or where it really leads (grants are made on real paths, the ones the person saw).
    pub(super) fn resolve(&self, raw: &str) -> Result<Resolved> {
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
    pub(super) fn authorize(&self, root: &Root, rel: &str, raw: &str) -> Result<()> {
        if consent::allows(root, rel, &self.state.grants) {
            Ok(())
        } else {
            Err(no_consent(raw))
        }
    }

    /// The regular file at `raw`, opened, if this session may read it: resolved, opened
    /// without following a link out, and authorized where it really is.
    pub(super) fn open_readable(
        &self,
        raw: &str,
    ) -> Result<(Resolved, sandbox::open::RegularFile)> {
        let target = self.resolve(raw)?;
        let opened = sandbox::open::open_regular(&target, raw)?;
        self.authorize(target.root(), &opened.real, raw)?;
        Ok((target, opened))
    }

    /// Locks `key` for this operation (`FILE_LOCKED` at once if another session holds it).
    pub(super) fn lock(
        &self,
        key: &std::path::Path,
        mode: LockMode,
        raw: &str,
    ) -> Result<LockGuard> {
        self.locks
            .acquire(key.to_path_buf(), self.state.id, mode, raw)
    }

    /// With `keepLocked`, refuses *before* any work when the session's kept locks are at
    /// `max_locks`: a request answered `QUOTA_EXCEEDED` must not have changed anything.
    pub(super) fn check_keep_quota(&self, keep: bool, raw: &str) -> Result<()> {
        if keep {
            self.locks
                .check_keep_quota(self.state.id, self.max_kept(), raw)?;
        }
        Ok(())
    }

    /// With `keepLocked`, turns the operation's exclusive lock into a kept lock.
    pub(super) fn keep(&self, guard: &LockGuard, keep: bool, raw: &str) -> Result<Option<String>> {
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
    pub(super) fn max_kept(&self) -> u32 {
        let uploads = u32::try_from(self.state.uploads.len()).unwrap_or(u32::MAX);
        self.policy.limits().max_locks.saturating_sub(uploads)
    }
}

/// Admits `bytes` of payload under the session's byte rate, waiting for the part beyond the
/// burst but never past `timeout_ms`.
pub(super) async fn admit_bytes(ctx: &Ctx<'_>, bytes: u64) -> Result<()> {
    let limit = ctx.policy.limits().timeout;
    let rate = ctx.broker.rate_limits();
    match tokio::time::timeout(limit, rate.admit_bytes(ctx.state.id, bytes)).await {
        Ok(admitted) => admitted,
        Err(_) => Err(throttle::timed_out(limit)),
    }
}

/// Pays ahead, on the async side, for what blocking work will read: `probe` (run as small
/// work: resolve, authorize, look at the size) says how many bytes, and they are waited for
/// here, before the work takes a slot of the pool, within the request's time (which counts
/// from `started`). The work draws on what was paid ([`Prepaid::pay`]). Unlimited, nothing
/// is probed or paid.
pub(super) async fn prepay<F>(ctx: &Ctx<'_>, started: Instant, probe: F) -> Result<Prepaid>
where
    F: FnOnce(&Op) -> Result<u64> + Send + 'static,
{
    let rate = ctx.broker.rate_limits();
    let session = ctx.state.id;
    if !rate.limits_bytes() {
        return Ok(Prepaid::new(rate, session, 0));
    }
    // A probe that fails pays nothing, and the work then fails the same way. The probe
    // authorizes before it looks at a size, so how long an answer took never tells the size
    // of a file the session may not see. It runs on the pool, not inline: stuck inline, the
    // watchdog would answer the request while this went on to the work.
    let bytes = match ctx.owned_since(started).run(probe).await {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == ErrorKind::Timeout => return Err(e),
        Err(_) => 0,
    };
    pay_ahead(ctx, started, bytes).await
}

/// Pays `bytes` ahead for blocking work, waiting here within the request's time (which
/// counts from `started`); see [`prepay`].
pub(super) async fn pay_ahead(ctx: &Ctx<'_>, started: Instant, bytes: u64) -> Result<Prepaid> {
    let rate = ctx.broker.rate_limits();
    let limit = ctx.policy.limits().timeout;
    let until = tokio::time::Instant::from_std(started + limit);
    tokio::time::timeout_at(until, rate.pay(ctx.state.id, bytes))
        .await
        .map_err(|_| throttle::timed_out(limit))?;
    Ok(Prepaid::new(rate, ctx.state.id, bytes))
}

pub(super) fn no_consent(raw: &str) -> Error {
    Error::new(ErrorKind::PermissionDenied, "no consent").with_path(raw)
}

pub(super) fn audit_unavailable() -> Error {
    Error::new(ErrorKind::Io, "audit log unavailable")
}

//! The fast path: a small request runs on the async thread that parsed it, not on the
//! blocking pool.
//!
//! A 1 KiB read takes a few microseconds of work; handing it to a pool thread and back costs
//! two thread wake-ups, 10–20 µs each on a small VM, which was most of a sequential request's
//! round trip (docs/benchmarks.md). The pool exists so that a stuck file system (a hung FUSE
//! or network mount under a root) cannot stall the session or the broker, and so that
//! `timeout_ms` holds. The fast path keeps both:
//!
//! - **One at a time, broker-wide.** At most one request runs inline at any moment; a request
//!   that finds the fast path taken goes to the pool. So a stuck inline operation blocks one
//!   async worker at most, and it is only taken on a multi-threaded runtime with at least two
//!   workers: the others go on serving every session (tokio steals the stuck worker's queued
//!   tasks). While it is stuck, it holds the fast path, so nothing else runs inline.
//! - **A watchdog answers for it.** A thread checks the running request every [`TICK`]; at
//!   its deadline it expires the request (as the pool's waiter does) and sends its `TIMEOUT`
//!   answer through the session's output itself. When the operation finally returns, its
//!   result is dropped: the request was answered. The watchdog sleeps (parked) after a second
//!   without inline work, so an idle broker has no timer running.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::audit::{AuditLog, PendingLine};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc;
use crate::outgoing::Outgoing;
use crate::throttle::{self, Deadline};

/// How often the watchdog looks at the running request: the latest a stuck request's
/// `TIMEOUT` goes out after its deadline.
const TICK: Duration = Duration::from_millis(10);

/// How often it looks at a request it has already answered and that is still stuck.
const SETTLED_TICK: Duration = Duration::from_millis(500);

/// Ticks without inline work after which the watchdog parks.
const IDLE_TICKS: u32 = 100;

/// What a transport gives the broker to answer a request later: a way to send a frame on the
/// session's output without waiting. Returns `false` when the frame could not be queued now
/// (the queue is full); the watchdog tries again on its next tick.
pub(crate) type Sink = Arc<dyn Fn(Outgoing) -> bool + Send + Sync>;

/// A request that may be answered by the watchdog instead of by its own task.
pub(crate) struct Late {
    sink: Sink,
    /// The request's id, once parsed.
    id: OnceLock<Box<RawValue>>,
    answered: AtomicBool,
    /// The request's place in its session's bookkeeping: given up when the watchdog answers,
    /// so that requests waiting for earlier ones (upload chunks) do not wait on a request
    /// that is answered but still stuck.
    /// (The session's `Received`; kept opaque here, so this layer does not reach up into the
    /// session's.)
    received: Mutex<Option<Box<dyn Send>>>,
    /// The request's audit line, for the watchdog to write when it answers (its own task
    /// writes it otherwise): the log must have the request even if its work never returns.
    audit: Mutex<Option<LateAudit>>,
    /// The watchdog wrote the audit line; the task must not write another.
    audited: AtomicBool,
    /// Called once by the watchdog when the request has run inline for [`STALL`] (or reached
    /// its deadline, if that comes first): whatever waits behind it on its thread must go on
    /// elsewhere (a batch's other requests, and the answers gathered before it).
    stalled: Mutex<Option<Stalled>>,
}

/// What [`Late::on_stalled`] runs.
pub(crate) type Stalled = Box<dyn FnOnce() + Send>;

/// How long a request may hold its thread inline before what waits behind it goes on
/// elsewhere: inline work takes microseconds, so this one waits on its file system.
const STALL: Duration = Duration::from_millis(20);

/// The audit line of a request the watchdog may answer, and the log it goes to.
pub(crate) struct LateAudit {
    /// The broker's log.
    pub log: Arc<AuditLog>,
    /// The request's line, begun when it arrived.
    pub line: PendingLine,
}

impl std::fmt::Debug for Late {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Late")
            .field("id", &self.id)
            .field("answered", &self.answered)
            .finish_non_exhaustive()
    }
}

impl Late {
    /// A late answer through `sink`, for the request [`Late::hold`] names.
    pub(crate) fn new(sink: Sink) -> Arc<Late> {
        Arc::new(Late {
            sink,
            id: OnceLock::new(),
            answered: AtomicBool::new(false),
            received: Mutex::new(None),
            audit: Mutex::new(None),
            audited: AtomicBool::new(false),
            stalled: Mutex::new(None),
        })
    }

    /// Runs `f` (on the watchdog's thread) if the request is still running inline [`STALL`]
    /// after it started, or at its deadline if that is sooner; replaces what an earlier call
    /// set.
    pub(crate) fn on_stalled(&self, f: Stalled) {
        *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// Hands the watchdog the request's audit line, in case it answers the request.
    pub(crate) fn audit_with(&self, line: LateAudit) {
        *self.audit.lock().unwrap_or_else(|e| e.into_inner()) = Some(line);
    }

    /// Whether the watchdog wrote the request's audit line.
    pub(crate) fn audited(&self) -> bool {
        self.audited.load(Ordering::Acquire)
    }

    /// Names the request (its id) and keeps its bookkeeping until it is answered.
    pub(crate) fn hold(&self, id: &RawValue, received: impl Send + 'static) {
        let _ = self.id.set(id.to_owned());
        *self.received.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(received));
    }

    /// Gives up the request's place once its answer is built (or sent by the watchdog).
    pub(crate) fn release(&self) {
        drop(
            self.received
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// Whether the watchdog answered the request: its own answer must then not be sent.
    pub(crate) fn answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }
}

/// The broker's fast path (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct FastPath {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    running: Mutex<Option<Running>>,
    /// Set by the watchdog before it parks; whoever starts inline work then wakes it.
    parked: AtomicBool,
    watchdog: OnceLock<Option<Thread>>,
}

#[derive(Debug)]
struct Running {
    until: Instant,
    /// When [`Late::on_stalled`]'s hook runs if the work is still running.
    stall_at: Instant,
    limit: Duration,
    deadline: Arc<Deadline>,
    late: Arc<Late>,
    /// The watchdog has acted on the deadline (answered, or found the work committing).
    settled: bool,
}

/// The deadline of a request that asks to run inline.
pub(crate) struct Ticket {
    /// When `timeout_ms` runs out.
    pub until: Instant,
    /// `timeout_ms` itself, for the message.
    pub limit: Duration,
    /// Shared with the operation's commit point.
    pub deadline: Arc<Deadline>,
    /// How to answer the request if the watchdog must.
    pub late: Arc<Late>,
}

impl FastPath {
    /// Runs `f(arg)` inline when the fast path is free, the runtime can afford a blocked
    /// worker and the watchdog runs; otherwise gives `f` back, not run (for the pool). Past
    /// the deadline, the watchdog answers `TIMEOUT` and the result is `Ok(Err(TIMEOUT))`
    /// whatever `f` returned.
    pub(crate) fn try_run<A, T, F>(
        &self,
        ticket: Ticket,
        arg: &A,
        f: F,
    ) -> std::result::Result<Result<T>, F>
    where
        F: FnOnce(&A) -> Result<T>,
    {
        if !runtime_can_block() || self.watchdog().is_none() {
            return Err(f);
        }
        let limit = ticket.limit;
        let deadline = Arc::clone(&ticket.deadline);
        {
            let Ok(mut slot) = self.shared.running.try_lock() else {
                return Err(f);
            };
            if slot.is_some() {
                return Err(f);
            }
            *slot = Some(Running {
                stall_at: ticket.until.min(Instant::now() + STALL),
                until: ticket.until,
                limit: ticket.limit,
                deadline: ticket.deadline,
                late: ticket.late,
                settled: false,
            });
        }
        if self.shared.parked.swap(false, Ordering::SeqCst) {
            if let Some(thread) = self.watchdog() {
                thread.unpark();
            }
        }
        // Whatever happens in `f` (a panic included), the fast path is given back.
        struct Release<'a>(&'a Shared);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                *self.0.lock() = None;
            }
        }
        let release = Release(&self.shared);
        let out = if deadline.expired() {
            Err(throttle::timed_out(limit))
        } else {
            // A panic becomes the answer it would be on the pool, not a request never answered.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(arg))).unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Internal,
                    "worker failed: the operation panicked".to_string(),
                ))
            })
        };
        drop(release);
        // Expired by the watchdog while it ran: the answer is `TIMEOUT` (already sent, or to
        // be sent by the caller), as for work on the pool. A mutation checks the deadline at
        // its commit point, so it rolled back.
        if deadline.expired() {
            return Ok(Err(throttle::timed_out(limit)));
        }
        Ok(out)
    }

    /// The watchdog thread, started on first use; `None` when it could not be started (and
    /// then nothing runs inline).
    fn watchdog(&self) -> Option<&Thread> {
        self.shared
            .watchdog
            .get_or_init(|| {
                let shared = Arc::clone(&self.shared);
                std::thread::Builder::new()
                    .name("fsbroker-watchdog".into())
                    .spawn(move || watch(&shared))
                    .map_err(|e| tracing::warn!(error = %e, "no watchdog thread; small requests use the pool"))
                    .ok()
                    .map(|h| h.thread().clone())
            })
            .as_ref()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A blocked worker is only affordable where others remain to serve everything else.
fn runtime_can_block() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
            && h.metrics().num_workers() >= 2
    })
}

/// The watchdog's loop: it ends with the broker (its `Shared` is then only its own).
fn watch(shared: &Arc<Shared>) {
    let mut idle = 0;
    while Arc::strong_count(shared) > 1 {
        let (busy, settled) = {
            let mut slot = shared.lock();
            if let Some(running) = slot.as_mut() {
                settle(running);
                (true, running.settled)
            } else {
                (false, false)
            }
        };
        idle = if busy { 0 } else { idle + 1 };
        if idle >= IDLE_TICKS {
            // Parked, it is woken by the next inline request (`wake_watchdog`). The flag is set
            // before looking at the slot, and the slot is filled before the flag is read, so
            // one of the two sides sees the other.
            shared.parked.store(true, Ordering::SeqCst);
            if shared.lock().is_none() {
                std::thread::park_timeout(Duration::from_secs(5));
            }
            shared.parked.store(false, Ordering::SeqCst);
            idle = 0;
            continue;
        }
        if settled {
            // Answered and still stuck: nothing to do until it returns, but the next inline
            // request, which may start the moment it does, wakes the watchdog at once.
            shared.parked.store(true, Ordering::SeqCst);
            if shared.lock().as_ref().is_some_and(|r| r.settled) {
                std::thread::park_timeout(SETTLED_TICK);
            }
            shared.parked.store(false, Ordering::SeqCst);
            continue;
        }
        std::thread::sleep(TICK);
    }
}

/// Acts on a running request that has stalled (its hook) or whose deadline has passed (its
/// answer).
fn settle(running: &mut Running) {
    let now = Instant::now();
    if now >= running.stall_at {
        // The work holds its thread: what waits behind it there goes on elsewhere.
        let stalled = running
            .late
            .stalled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(f) = stalled {
            f();
        }
    }
    if running.settled || now < running.until {
        return;
    }
    if !running.deadline.expire() {
        // Committing: its own result stands and will be sent when it returns.
        running.settled = true;
        return;
    }
    let late = &running.late;
    let Some(id) = late.id.get() else {
        running.settled = true;
        return;
    };
    let error = throttle::timed_out(running.limit);
    // The line first, under the lock the work's end waits for: the request's own task then
    // finds it written and writes none, and the session cannot end (and the log be sealed)
    // before it is written, because the answer, which lets the session end, comes after.
    let line = late.audit.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(a) = line {
        let record = a.line.record(error.kind().outcome(), 0, 0);
        // The watchdog answers for every stuck request: its wait for the log is bounded too.
        let until = Instant::now() + running.limit.min(crate::audit::OWN_LINE_WAIT);
        if let Err(e) = a.log.record_until(&record, until) {
            tracing::error!(session = record.session, error = %e, "the audit line of a request stuck past its deadline could not be written");
        }
        late.audited.store(true, Ordering::Release);
    }
    let frame = jsonrpc::error_frame(Some(id), &error);
    if (late.sink)(frame.into()) {
        late.answered.store(true, Ordering::Release);
        running.settled = true;
        late.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn ticket(after: Duration, late: Option<Arc<Late>>) -> Ticket {
        // Without a late answer to watch, one whose frames go nowhere.
        let late = late.unwrap_or_else(|| Late::new(Arc::new(|_: Outgoing| true)));
        Ticket {
            until: Instant::now() + after,
            limit: after,
            deadline: Arc::default(),
            late,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stuck_request_is_answered_timeout_by_the_watchdog_and_holds_the_fast_path() {
        let fast = Arc::new(FastPath::default());
        let (sent_tx, sent_rx) = mpsc::channel::<Vec<u8>>();
        let sink: Sink = Arc::new(move |frame: Outgoing| {
            let _ = sent_tx.send(frame.into_vec());
            true
        });
        let id = RawValue::from_string("41".into()).unwrap();
        let late = Late::new(sink);
        let _ = late.id.set(id);
        // The "file system": an operation that blocks until the test lets it go.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let stuck = {
            let fast = Arc::clone(&fast);
            let late = Arc::clone(&late);
            tokio::spawn(async move {
                fast.try_run(
                    ticket(Duration::from_millis(30), Some(late)),
                    &(),
                    move |_| {
                        started_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                        Ok::<_, Error>("done")
                    },
                )
            })
        };
        started_rx.recv().unwrap();
        // While it is stuck, nothing else runs inline: the caller goes to the pool.
        assert!(
            fast.try_run(ticket(Duration::from_secs(5), None), &(), |_| Ok(()))
                .is_err()
        );
        // The TIMEOUT answer goes out while the operation is still stuck.
        let frame = sent_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(v["id"], 41, "{v}");
        assert_eq!(v["error"]["data"]["code"], "TIMEOUT", "{v}");
        release_tx.send(()).unwrap();
        let out = stuck.await.unwrap().ok().expect("it ran inline");
        assert!(out.is_err(), "its own result is dropped: {out:?}");
        // Marked answered before the work could return (the watchdog holds the fast path
        // while it answers), so the request's own answer is never sent.
        assert!(late.answered());
        // Given back: the next request runs inline again.
        let again = fast.try_run(ticket(Duration::from_secs(5), None), &(), |_| Ok(7));
        assert_eq!(again.ok().map(|r| r.ok()), Some(Some(7)));
        assert!(sent_rx.try_recv().is_err(), "answered twice");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_reached_its_commit_point_keeps_its_result() {
        let fast = FastPath::default();
        let t = ticket(Duration::from_millis(20), None);
        let deadline = Arc::clone(&t.deadline);
        let out = fast.try_run(t, &(), |_| {
            deadline.commit(Duration::from_millis(20))?;
            std::thread::sleep(Duration::from_millis(100));
            Ok(5)
        });
        assert_eq!(out.ok().map(|r| r.ok()), Some(Some(5)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn never_inline_where_a_blocked_thread_would_stall_everything() {
        let fast = FastPath::default();
        assert!(
            fast.try_run(ticket(Duration::from_secs(1), None), &(), |_| Ok(()))
                .is_err()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_inline_is_an_internal_error_and_gives_the_fast_path_back() {
        let fast = FastPath::default();
        let out = fast.try_run(
            ticket(Duration::from_secs(5), None),
            &(),
            |_| -> Result<()> { panic!("boom") },
        );
        let err = out.ok().expect("ran inline").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal);
        let again = fast.try_run(ticket(Duration::from_secs(5), None), &(), |_| Ok(3));
        assert_eq!(again.ok().map(|r| r.ok()), Some(Some(3)));
    }

    #[test]
    fn never_inline_outside_a_runtime() {
        let fast = FastPath::default();
        assert!(
            fast.try_run(ticket(Duration::from_secs(1), None), &(), |_| Ok(()))
                .is_err()
        );
    }
}

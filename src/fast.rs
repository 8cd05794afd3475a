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

use crate::jsonrpc;
use crate::limits::{self, Deadline};
use crate::outgoing::Outgoing;

/// How often the watchdog looks at the running request: the latest a stuck request's
/// `TIMEOUT` goes out after its deadline.
const TICK: Duration = Duration::from_millis(10);

/// Ticks without inline work after which the watchdog parks.
const IDLE_TICKS: u32 = 100;

/// Largest read (bytes) that runs inline.
pub(crate) const MAX_INLINE_READ: usize = 64 << 10;

/// What a transport gives the broker to answer a request later: a way to send a frame on the
/// session's output without waiting. Returns `false` when the frame could not be queued now
/// (the queue is full); the watchdog tries again on its next tick.
pub(crate) type Sink = Arc<dyn Fn(Outgoing) -> bool + Send + Sync>;

/// A request that may be answered by the watchdog instead of by its own task.
pub(crate) struct Late {
    sink: Sink,
    id: Box<RawValue>,
    answered: AtomicBool,
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
    /// A late answer for request `id` through `sink`.
    pub(crate) fn new(sink: Sink, id: &RawValue) -> Arc<Late> {
        Arc::new(Late {
            sink,
            id: id.to_owned(),
            answered: AtomicBool::new(false),
        })
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
    limit: Duration,
    deadline: Arc<Deadline>,
    late: Option<Arc<Late>>,
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
    pub late: Option<Arc<Late>>,
}

impl FastPath {
    /// Runs `f` inline when the fast path is free and the runtime can afford a blocked worker;
    /// `None` (and `f` not run) otherwise. Past the deadline, the watchdog answers `TIMEOUT`
    /// and the result is `Some(Err(TIMEOUT))` whatever `f` returned.
    pub(crate) fn try_run<T>(
        &self,
        ticket: Ticket,
        f: impl FnOnce() -> crate::error::Result<T>,
    ) -> Option<crate::error::Result<T>> {
        if !runtime_can_block() {
            return None;
        }
        let limit = ticket.limit;
        let deadline = Arc::clone(&ticket.deadline);
        {
            let mut slot = self.shared.running.try_lock().ok()?;
            if slot.is_some() {
                return None;
            }
            *slot = Some(Running {
                until: ticket.until,
                limit: ticket.limit,
                deadline: ticket.deadline,
                late: ticket.late,
                settled: false,
            });
        }
        self.wake_watchdog();
        // Whatever happens in `f` (a panic included), the fast path is given back.
        struct Release<'a>(&'a Shared);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                *self.0.lock() = None;
            }
        }
        let release = Release(&self.shared);
        let out = if deadline.expired() {
            Err(limits::timed_out(limit))
        } else {
            f()
        };
        drop(release);
        // Expired by the watchdog while it ran: the answer is `TIMEOUT` (already sent, or to
        // be sent by the caller), as for work on the pool. A mutation checks the deadline at
        // its commit point, so it rolled back.
        if deadline.expired() {
            return Some(Err(limits::timed_out(limit)));
        }
        Some(out)
    }

    fn wake_watchdog(&self) {
        let started = self.shared.watchdog.get_or_init(|| {
            let shared = Arc::clone(&self.shared);
            std::thread::Builder::new()
                .name("fsbroker-watchdog".into())
                .spawn(move || watch(&shared))
                .ok()
                .map(|h| h.thread().clone())
        });
        if self.shared.parked.swap(false, Ordering::SeqCst) {
            if let Some(thread) = started {
                thread.unpark();
            }
        }
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
        let busy = {
            let mut slot = shared.lock();
            if let Some(running) = slot.as_mut() {
                settle(running);
                true
            } else {
                false
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
        std::thread::sleep(TICK);
    }
}

/// Acts on a running request whose deadline has passed.
fn settle(running: &mut Running) {
    if running.settled || Instant::now() < running.until {
        return;
    }
    if !running.deadline.expire() {
        // Committing: its own result stands and will be sent when it returns.
        running.settled = true;
        return;
    }
    let Some(late) = &running.late else {
        // No way to answer from here (the library's `Session::handle`): its caller gets
        // `TIMEOUT` when the work returns.
        running.settled = true;
        return;
    };
    let frame = jsonrpc::error_frame(Some(&late.id), &limits::timed_out(running.limit));
    if (late.sink)(frame.into()) {
        late.answered.store(true, Ordering::Release);
        running.settled = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn ticket(after: Duration, late: Option<Arc<Late>>) -> Ticket {
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
        let late = Late::new(sink, &id);
        // The "file system": an operation that blocks until the test lets it go.
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let stuck = {
            let fast = Arc::clone(&fast);
            let late = Arc::clone(&late);
            tokio::spawn(async move {
                fast.try_run(ticket(Duration::from_millis(30), Some(late)), || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok::<_, crate::error::Error>("done")
                })
            })
        };
        started_rx.recv().unwrap();
        // While it is stuck, nothing else runs inline: the caller goes to the pool.
        assert!(
            fast.try_run(ticket(Duration::from_secs(5), None), || Ok(()))
                .is_none()
        );
        // The TIMEOUT answer goes out while the operation is still stuck.
        let frame = sent_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(v["id"], 41, "{v}");
        assert_eq!(v["error"]["data"]["code"], "TIMEOUT", "{v}");
        assert!(late.answered());
        release_tx.send(()).unwrap();
        let out = stuck.await.unwrap().expect("it ran inline");
        assert!(out.is_err(), "its own result is dropped: {out:?}");
        // Given back: the next request runs inline again.
        let again = fast.try_run(ticket(Duration::from_secs(5), None), || Ok(7));
        assert_eq!(again.map(|r| r.ok()), Some(Some(7)));
        assert!(sent_rx.try_recv().is_err(), "answered twice");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_that_reached_its_commit_point_keeps_its_result() {
        let fast = FastPath::default();
        let t = ticket(Duration::from_millis(20), None);
        let deadline = Arc::clone(&t.deadline);
        let out = fast.try_run(t, || {
            deadline.commit(Duration::from_millis(20))?;
            std::thread::sleep(Duration::from_millis(100));
            Ok(5)
        });
        assert_eq!(out.map(|r| r.ok()), Some(Some(5)));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn never_inline_where_a_blocked_thread_would_stall_everything() {
        let fast = FastPath::default();
        assert!(
            fast.try_run(ticket(Duration::from_secs(1), None), || Ok(()))
                .is_none()
        );
    }

    #[test]
    fn never_inline_outside_a_runtime() {
        let fast = FastPath::default();
        assert!(
            fast.try_run(ticket(Duration::from_secs(1), None), || Ok(()))
                .is_none()
        );
    }
}

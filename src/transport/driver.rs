//! Drives one session: the bounds every transport applies to the requests it hands a session.
//!
//! `serve` (stdio or a socket connection) and `proxy` (the server's requests, split from the
//! rest of its output) both feed request lines to a [`Driver`]. It runs them concurrently, at
//! most `max_in_flight` at once, holding at most [`INPUT_BUDGET_KIB`] of their lines; past
//! either bound, [`Driver::submit`] waits, so the transport stops reading its peer instead of
//! buffering. Answers go to one bounded queue whose writer owns the output; read answers also
//! hold a share of the session's output budget until they are written (see
//! `Session::reserve_output`). A peer that stops reading its answers therefore stops the
//! broker reading its requests, with memory bounded by these three budgets.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::buffers::{Line, Spares};
use crate::fast::{Late, Sink};
use crate::host::Session;
use crate::limits::INPUT_BUDGET_KIB;
use crate::outgoing::Outgoing;

/// A task's share of [`Driver`]'s count of answered, stuck requests, given back when it ends.
struct Unstuck(Arc<Late>, Arc<AtomicUsize>);

impl Drop for Unstuck {
    fn drop(&mut self) {
        if self.0.answered() {
            self.1.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// How often [`Driver::finish`] looks whether only stuck, already answered requests are left.
const STUCK_CHECK: Duration = Duration::from_millis(100);

/// Runs one session's requests within its bounds; answers go to `out`.
pub(crate) struct Driver<T> {
    session: Arc<Session>,
    in_flight: Arc<Semaphore>,
    held: Arc<Semaphore>,
    tasks: JoinSet<()>,
    out: mpsc::Sender<T>,
    /// `out` for the fast path's watchdog, which answers stuck requests from its own thread.
    sink: Sink,
    /// Requests the watchdog answered whose tasks are still stuck in their work.
    stuck: Arc<AtomicUsize>,
    /// Where large lines' buffers go back to, for the reader.
    spares: Option<Spares>,
}

impl<T> std::fmt::Debug for Driver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("session", &self.session.id())
            .field("in_flight", &self.in_flight.available_permits())
            .finish_non_exhaustive()
    }
}

impl<T: From<Outgoing> + Send + 'static> Driver<T> {
    /// A driver for `session` running at most `max_in_flight` requests at once.
    pub(crate) fn new(session: Arc<Session>, max_in_flight: usize, out: mpsc::Sender<T>) -> Self {
        // Weak, like the tasks' own senders: a request stuck in a file system must not keep
        // the output (and with it the session's end) open.
        let late_out = out.downgrade();
        let stuck = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&stuck);
        let sink: Sink = Arc::new(move |frame: Outgoing| {
            let taken = match late_out.upgrade() {
                // Full: tried again on the watchdog's next tick.
                Some(out) => !matches!(
                    out.try_send(T::from(frame)),
                    Err(mpsc::error::TrySendError::Full(_))
                ),
                // Closed: nobody left to answer.
                None => true,
            };
            if taken {
                counted.fetch_add(1, Ordering::AcqRel);
            }
            taken
        });
        Driver {
            sink,
            stuck,
            session,
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            held: Arc::new(Semaphore::new(INPUT_BUDGET_KIB)),
            tasks: JoinSet::new(),
            out,
            spares: None,
        }
    }

    /// Gives large lines' buffers back to `spares` (the reader's) once their requests are done.
    pub(crate) fn with_spares(mut self, spares: Spares) -> Self {
        self.spares = Some(spares);
        self
    }

    /// The session driven.
    pub(crate) fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// Hands one line (a request, notification or stray response) to the session, once a
    /// request slot and room for the line are free. Returns `false` when the output is gone
    /// (the session is over).
    pub(crate) async fn submit(&mut self, line: Vec<u8>) -> bool {
        if self.out.is_closed() {
            return false;
        }
        let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
            return false;
        };
        let kib = line.len().div_ceil(1024).clamp(1, INPUT_BUDGET_KIB) as u32;
        let Ok(held) = Arc::clone(&self.held).acquire_many_owned(kib).await else {
            return false;
        };
        let session = Arc::clone(&self.session);
        // Counted now, in arrival order: tasks may start in any order.
        let received = session.received();
        let out = self.out.downgrade();
        let late = Late::new(Arc::clone(&self.sink));
        let stuck = Arc::clone(&self.stuck);
        let spares = self.spares.clone();
        self.tasks.spawn(async move {
            // Uncounted when the task ends, however it ends (a panic included).
            let _counted = Unstuck(Arc::clone(&late), stuck);
            let line = Line::new(line, spares.clone());
            let frame = session.respond_line(line, received, Some(&late)).await;
            if let (Some(frame), Some(out)) = (frame, out.upgrade()) {
                let _ = out.send(T::from(frame)).await;
            }
            if let Some(spares) = spares.filter(|_| session.state().uploads.len() == 0) {
                // Kept only while an upload is open, whose next chunk's line is as long.
                spares.clear();
            }
            drop((permit, held));
        });
        while self.tasks.try_join_next().is_some() {}
        true
    }

    /// Sends a frame of the transport's own (an error for a line it could not pass on).
    pub(crate) async fn send(&self, frame: Outgoing) -> bool {
        self.out.send(T::from(frame)).await.is_ok()
    }

    /// Waits for the requests in flight to be answered. Requests the fast path's watchdog
    /// already answered `TIMEOUT` and that are still stuck in a file system are not waited
    /// for: they hold nothing the session's end needs (their output is a weak reference),
    /// and they end when their system call does.
    pub(crate) async fn finish(mut self) {
        while !self.tasks.is_empty() {
            if self.tasks.len() <= self.stuck.load(Ordering::Acquire) {
                self.tasks.detach_all();
                break;
            }
            tokio::select! {
                _ = self.tasks.join_next() => {}
                () = tokio::time::sleep(STUCK_CHECK) => {}
            }
        }
    }
}

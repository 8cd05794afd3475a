//! The blocking pool, shared fairly between sessions.
//!
//! File-system work runs on a small pool of threads (see the runtime in `cli/running.rs`).
//! Handed to it first come, first served, one session with many slow requests in flight would fill
//! every thread and make the other sessions' one-millisecond reads wait behind it. So work
//! passes through a [`FairPool`] before it takes a thread:
//! - a session never runs on more than [`FairPool::per_session`] slots at once, which leaves
//!   a quarter of the pool (at least one slot) to the others however busy it is;
//! - when a slot frees up and several sessions wait, the slot goes to them in turn (round
//!   robin), not to whichever queued the most.
//!
//! A slot is held until the work has actually finished — also when its caller has already
//! been answered `TIMEOUT` — so work that overruns counts against its own session.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// How many file-system operations may run at once in a broker: the blocking threads of the
/// runtime `serve` and `proxy` build (twice the CPUs, at least 8).
pub(crate) fn blocking_slots() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    (2 * cpus).max(8)
}

/// Slots shared between sessions; see the module documentation.
#[derive(Debug)]
pub(crate) struct FairPool {
    slots: usize,
    per_session: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    running: usize,
    sessions: HashMap<u64, Queue>,
    /// Sessions with waiters, in the order they are served next.
    ring: VecDeque<u64>,
}

#[derive(Debug, Default)]
struct Queue {
    running: usize,
    waiters: VecDeque<oneshot::Sender<Slot>>,
}

/// The right to run one operation; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    pool: Arc<FairPool>,
    session: u64,
    /// False for a slot whose hand-over failed (its counts were undone by the pool).
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.armed {
            self.pool.release(self.session);
        }
    }
}

impl FairPool {
    /// A pool of `slots` (at least 1).
    pub(crate) fn new(slots: usize) -> Arc<FairPool> {
        let slots = slots.max(1);
        Arc::new(FairPool {
            slots,
            per_session: (slots - slots / 4).max(1),
            inner: Mutex::default(),
        })
    }

    #[cfg(test)]
    /// The most slots one session may hold at once.
    pub(crate) fn per_session(&self) -> usize {
        self.per_session
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        // Every change under the lock is a few counter updates and queue pushes that cannot
        // panic half-way; a poisoned lock still holds consistent counts.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot for `session`. Dropping the future gives up the place in the queue
    /// (and any slot handed to it meanwhile).
    pub(crate) async fn acquire(self: &Arc<Self>, session: u64) -> Slot {
        let rx = {
            let mut inner = self.inner();
            let queue = inner.sessions.entry(session).or_default();
            let free = queue.running < self.per_session && queue.waiters.is_empty();
            if free && inner.running < self.slots {
                inner.running += 1;
                if let Some(q) = inner.sessions.get_mut(&session) {
                    q.running += 1;
                }
                return self.slot(session);
            }
            let (tx, rx) = oneshot::channel();
            let queue = inner.sessions.entry(session).or_default();
            queue.waiters.push_back(tx);
            if !inner.ring.contains(&session) {
                inner.ring.push_back(session);
            }
            rx
        };
        match rx.await {
            Ok(slot) => slot,
            // The pool never drops a waiter's sender without sending.
            Err(_) => unreachable!("a queued waiter is always handed a slot"),
        }
    }

    fn slot(self: &Arc<Self>, session: u64) -> Slot {
        Slot {
            pool: Arc::clone(self),
            session,
            armed: true,
        }
    }

    fn release(self: &Arc<Self>, session: u64) {
        let mut inner = self.inner();
        inner.running -= 1;
        if let Some(q) = inner.sessions.get_mut(&session) {
            q.running -= 1;
            if q.running == 0 && q.waiters.is_empty() {
                inner.sessions.remove(&session);
            }
        }
        self.hand_over(&mut inner);
    }

    /// Gives free slots to waiting sessions in turn.
    fn hand_over(self: &Arc<Self>, inner: &mut Inner) {
        let mut skipped = 0;
        while inner.running < self.slots && skipped < inner.ring.len() {
            let Some(session) = inner.ring.pop_front() else {
                return;
            };
            let Some(queue) = inner.sessions.get_mut(&session) else {
                continue;
            };
            if queue.running >= self.per_session {
                // At its share: it waits for one of its own to finish.
                inner.ring.push_back(session);
                skipped += 1;
                continue;
            }
            let Some(waiter) = queue.waiters.pop_front() else {
                continue;
            };
            queue.running += 1;
            inner.running += 1;
            if let Err(mut slot) = waiter.send(self.slot(session)) {
                // The waiter gave up; undo here (dropping the slot would take the lock again).
                slot.armed = false;
                inner.running -= 1;
                if let Some(q) = inner.sessions.get_mut(&session) {
                    q.running -= 1;
                }
            }
            match inner.sessions.get(&session) {
                Some(q) if !q.waiters.is_empty() => inner.ring.push_back(session),
                Some(q) if q.running == 0 => {
                    inner.sessions.remove(&session);
                }
                _ => {}
            }
            skipped = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_session_leaves_room_and_takes_turns() {
        let pool = FairPool::new(4);
        assert_eq!(pool.per_session(), 3);
        let mut hog = Vec::new();
        for _ in 0..3 {
            hog.push(pool.acquire(1).await);
        }
        // The hog is at its share; its fourth waits, while another session gets the last slot.
        let mut fourth = Box::pin(pool.acquire(1));
        assert!(futures_poll(&mut fourth).is_none());
        let other = pool.acquire(2).await;
        // Session 3 queues behind the full pool; when the other session's slot frees, it
        // goes to session 3, not to the hog (at its share).
        let mut third = Box::pin(pool.acquire(3));
        assert!(futures_poll(&mut third).is_none());
        drop(other);
        assert!(futures_poll(&mut third).is_some());
        assert!(futures_poll(&mut fourth).is_none());
        drop(hog.pop());
        assert!(futures_poll(&mut fourth).is_some());
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_passes_its_slot_on() {
        let pool = FairPool::new(1);
        let held = pool.acquire(1).await;
        let mut gone = Box::pin(pool.acquire(2));
        assert!(futures_poll(&mut gone).is_none());
        let mut next = Box::pin(pool.acquire(3));
        assert!(futures_poll(&mut next).is_none());
        drop(gone);
        drop(held);
        let got = futures_poll(&mut next);
        assert!(got.is_some());
        assert_eq!(pool.inner().running, 1);
        drop(got);
        assert_eq!(pool.inner().running, 0);
        assert!(pool.inner().sessions.is_empty());
    }

    /// Polls a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}

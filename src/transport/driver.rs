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
//!
//! A burst of small requests already waiting in the reader's buffer goes to the session as
//! one batch ([`Driver::submit_batch`]): one task takes them in turn, each polled once where
//! it stands, and spawned on its own only if it has to wait (for the pool, a lock, room in
//! the output). Small reads and lists then run on the fast path one after another, without
//! a task or a thread hand-off each, which was most of a pipelined small read's cost
//! (docs/benchmarks.md). A request stuck inline holds up the rest of its batch only until
//! the fast path's watchdog sees it stall (20 ms): it then starts another runner for the rest
//! ([`Late::on_stalled`]).
//!
//! The answers of requests a runner finished inline go out together, at most [`SEND_EVERY`]
//! at a time ([`Gathered`]): one wake-up of the writer and one write for several answers
//! instead of one each, which was the rest of a pipelined small read's cost.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

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

/// The most requests in one batch: a batch's last answer waits for its first ones, each a
/// few microseconds when inline.
pub(crate) const BATCH: usize = 32;

/// Lines at least this long go alone: they are upload chunks or long lists of paths, whose
/// work is not a few microseconds.
pub(crate) const BATCH_LINE: usize = 16 << 10;

/// Requests a batch runner answers at once: it sends the answers it gathered after this many
/// (and at its end).
const SEND_EVERY: usize = 8;

/// One request's whole way through the session (answer sent, bounds given back), owning what
/// it needs, so that it can run in a batch or as a task of its own.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Requests of one batch not yet started, taken in turn by a runner ([`run_batch`]).
type Queue = Arc<Mutex<VecDeque<(Job, Arc<Late>)>>>;

/// Answers a runner finished inline and has not sent yet, each with the slot and input room
/// its request held: a request counts as running until its answer is queued for the writer,
/// so that `max_in_flight` and [`Driver::finish`] see it.
type Gathered = Arc<Mutex<Vec<(Outgoing, Permits)>>>;

/// A request's slot and its line's share of the input budget.
type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

thread_local! {
    /// Where a request finished inline by a batch runner leaves its answer: set by the runner
    /// only while it polls one of its requests on this thread. A request that had to wait
    /// runs in a task of its own, polled with this unset, and sends its answer itself.
    static GATHER: RefCell<Option<Gathered>> = const { RefCell::new(None) };
}

/// Runs one session's requests within its bounds; answers go to `out`.
pub(crate) struct Driver<T> {
    session: Arc<Session>,
    /// Requests running; each holds one permit until its answer is sent.
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    held: Arc<Semaphore>,
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
        let max_in_flight = max_in_flight.max(1);
        Driver {
            sink,
            stuck,
            session,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            held: Arc::new(Semaphore::new(INPUT_BUDGET_KIB)),
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
        match self.job(line).await {
            Some((job, _)) => {
                tokio::spawn(job);
                true
            }
            None => false,
        }
    }

    /// Hands several lines to the session at once, to be taken in turn by one task (see the
    /// module documentation); for lines that arrived together, each shorter than
    /// [`BATCH_LINE`]. Returns `false` when the output is gone.
    pub(crate) async fn submit_batch(&mut self, lines: Vec<Vec<u8>>) -> bool {
        let mut jobs = VecDeque::with_capacity(lines.len());
        for line in lines {
            let kib = line.len().div_ceil(1024).clamp(1, INPUT_BUDGET_KIB);
            if !jobs.is_empty()
                && (self.in_flight.available_permits() == 0 || self.held.available_permits() < kib)
            {
                // The batch so far starts now: its requests hold slots and room that this
                // line may have to wait for (with `max_in_flight` 1, it always would).
                self.start_batch(std::mem::take(&mut jobs));
            }
            match self.job(line).await {
                Some(job) => jobs.push_back(job),
                None => return false,
            }
        }
        if !jobs.is_empty() {
            self.start_batch(jobs);
        }
        true
    }

    /// Starts a runner for `jobs`, with no answers gathered yet.
    fn start_batch(&self, jobs: VecDeque<(Job, Arc<Late>)>) {
        let queue = Arc::new(Mutex::new(jobs));
        tokio::spawn(run_batch(
            queue,
            self.out.downgrade(),
            Gathered::default(),
            0,
        ));
    }

    /// The job that answers `line`, once a request slot and room for the line are free;
    /// `None` when the output is gone.
    async fn job(&mut self, line: Vec<u8>) -> Option<(Job, Arc<Late>)> {
        if self.out.is_closed() {
            return None;
        }
        let permit = Arc::clone(&self.in_flight).acquire_owned().await.ok()?;
        let kib = line.len().div_ceil(1024).clamp(1, INPUT_BUDGET_KIB) as u32;
        let held = Arc::clone(&self.held).acquire_many_owned(kib).await.ok()?;
        // Counted now, in arrival order: requests may start in any order.
        let received = self.session.received();
        let late = Late::new(Arc::clone(&self.sink));
        let job = answer(
            Arc::clone(&self.session),
            Line::new(line, self.spares.clone()),
            received,
            Arc::clone(&late),
            Bounds {
                out: self.out.downgrade(),
                stuck: Arc::clone(&self.stuck),
                spares: self.spares.clone(),
                permits: (permit, held),
            },
        );
        Some((Box::pin(job), late))
    }

    /// Sends a frame of the transport's own (an error for a line it could not pass on).
    pub(crate) async fn send(&self, frame: Outgoing) -> bool {
        self.out.send(T::from(frame)).await.is_ok()
    }

    /// Waits for the requests in flight to be answered. Requests the fast path's watchdog
    /// already answered `TIMEOUT` and that are still stuck in a file system are not waited
    /// for: they hold nothing the session's end needs (their output is a weak reference),
    /// and they end when their system call does.
    pub(crate) async fn finish(self) {
        self.answered().await;
    }

    /// Resolves once the requests in flight now have been answered (but for stuck ones, as
    /// in [`Driver::finish`]); requests that come meanwhile wait behind it.
    async fn answered(&self) {
        all_answered(&self.in_flight, &self.stuck, self.max_in_flight).await;
    }

    /// Resolves once the session is quiet: every request answered, and none more for
    /// `quiet` (a server that got an answer may ask the next thing at once). Owns what it
    /// needs, so that a task other than the driver's may wait.
    pub(crate) fn quiet(&self, quiet: Duration) -> impl Future<Output = ()> + Send + 'static {
        let in_flight = Arc::clone(&self.in_flight);
        let stuck = Arc::clone(&self.stuck);
        let max = self.max_in_flight;
        async move {
            loop {
                all_answered(&in_flight, &stuck, max).await;
                tokio::time::sleep(quiet).await;
                let stuck = stuck.load(Ordering::Acquire).min(max);
                if in_flight.available_permits() + stuck >= max {
                    return;
                }
            }
        }
    }
}

/// Waits until every request slot but the stuck ones' is back: nothing is left to answer.
async fn all_answered(in_flight: &Semaphore, stuck: &AtomicUsize, max: usize) {
    loop {
        // Every request holds a slot until it is answered.
        let all = (max - stuck.load(Ordering::Acquire).min(max)) as u32;
        tokio::select! {
            _ = in_flight.acquire_many(all) => return,
            () = tokio::time::sleep(STUCK_CHECK) => {}
        }
    }
}

/// What a request holds until it is answered, and where its answer goes.
struct Bounds<T> {
    out: mpsc::WeakSender<T>,
    stuck: Arc<AtomicUsize>,
    spares: Option<Spares>,
    /// Its request slot and its line's share of the input budget.
    permits: Permits,
}

/// Answers one line: the body of every [`Job`].
async fn answer<T: From<Outgoing> + Send + 'static>(
    session: Arc<Session>,
    line: Line,
    received: crate::host::Received,
    late: Arc<Late>,
    bounds: Bounds<T>,
) {
    // Uncounted when the request ends, however it ends (a panic included).
    let _counted = Unstuck(Arc::clone(&late), bounds.stuck);
    let frame = session.respond_line(line, received, Some(&late)).await;
    if let Some(spares) = bounds.spares.filter(|_| session.state().uploads.len() == 0) {
        // Kept only while an upload is open, whose next chunk's line is as long.
        spares.clear();
    }
    let Some(frame) = frame else {
        return;
    };
    let gathering = GATHER.with(|g| g.borrow().clone());
    match gathering {
        Some(gathered) => lock(&gathered).push((frame, bounds.permits)),
        None => {
            if let Some(out) = bounds.out.upgrade() {
                let _ = out.send(T::from(frame)).await;
            }
        }
    }
}

fn lock<V>(m: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    // A push, a pop or a take cannot panic half-way.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `job` once with its answer, if it gives one now, left in `gathered`.
fn poll_gathering(job: &mut Job, gathered: &Gathered, cx: &mut std::task::Context<'_>) -> Poll<()> {
    struct Unset;
    impl Drop for Unset {
        fn drop(&mut self) {
            GATHER.with(|g| *g.borrow_mut() = None);
        }
    }
    GATHER.with(|g| *g.borrow_mut() = Some(Arc::clone(gathered)));
    let _unset = Unset;
    job.as_mut().poll(cx)
}

/// Queues the gathered answers for the writer, giving back each one's slot once it is queued.
async fn send_gathered<T: From<Outgoing>>(gathered: &Gathered, out: &mpsc::WeakSender<T>) {
    let answers = std::mem::take(&mut *lock(gathered));
    if answers.is_empty() {
        return;
    }
    let out = out.upgrade();
    for (frame, permits) in answers {
        if let Some(out) = &out {
            let _ = out.send(T::from(frame)).await;
        }
        drop(permits);
    }
}

/// Takes a batch's requests in turn: each is polled once here, and finished here when it
/// needs no wait (small work inline on the fast path), or spawned as a task of its own when
/// it does, so that no request waits for another's wait.
fn run_batch<T: From<Outgoing> + Send + 'static>(
    queue: Queue,
    out: mpsc::WeakSender<T>,
    gathered: Gathered,
    taken: usize,
) -> Job {
    // Boxed (as a `Job`): it spawns itself, and a recursive future needs a named type.
    Box::pin(take_one(queue, out, gathered, taken))
}

/// [`run_batch`]'s step: one request, then a new task for the rest.
///
/// The rest goes on in a new task, not in a loop here, because of where tokio puts what a
/// worker schedules: the task spawned or woken last waits in a slot of that worker's own,
/// which no other worker may take. Were this task to go on to the next request and stall
/// inline, whatever waited in that slot (a request this runner spawned, the reader a request
/// woke) would wait for the stalled request, and so would a task that merely yielded (tokio
/// keeps those on the worker too). Spawning the next step puts it in that slot instead: it
/// runs next, on this thread, and what the slot held moves to the worker's queue, which the
/// other workers take from. So nothing this step did may be followed by a stall but the
/// spawn: answers are sent after the request, not before the next.
async fn take_one<T: From<Outgoing> + Send + 'static>(
    queue: Queue,
    out: mpsc::WeakSender<T>,
    gathered: Gathered,
    taken: usize,
) {
    let next = lock(&queue).pop_front();
    let Some((mut job, late)) = next else {
        send_gathered(&gathered, &out).await;
        return;
    };
    // Stalled inline, this request holds this runner: the watchdog then sends the answers
    // gathered before it and starts another runner for the rest (a runner that finds nothing
    // left just ends).
    let runtime = tokio::runtime::Handle::current();
    let (rest, held, to) = (Arc::clone(&queue), Arc::clone(&gathered), out.clone());
    late.on_stalled(Box::new(move || {
        let first = to.clone();
        runtime.spawn(async move { send_gathered(&held, &first).await });
        runtime.spawn(run_batch(rest, to, Gathered::default(), 0));
    }));
    let polled =
        std::future::poll_fn(|cx| Poll::Ready(poll_gathering(&mut job, &gathered, cx))).await;
    if polled.is_pending() {
        // Its next poll, in its own task, registers that task to be woken.
        tokio::spawn(job);
    }
    let taken = taken + 1;
    let more = !lock(&queue).is_empty();
    if !more || taken % SEND_EVERY == 0 {
        // Sending gives back the requests' slots, which may wake the reader (into the slot
        // described above): the next step, spawned after, moves it out of the way.
        send_gathered(&gathered, &out).await;
    }
    if more {
        tokio::spawn(run_batch(queue, out, gathered, taken));
    }
}

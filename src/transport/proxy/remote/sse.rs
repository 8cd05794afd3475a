//! A response's Server-Sent Events (a POST's stream or the GET stream), parsed by `sse-stream`
//! and bounded here: the bytes taken from the body since the last whole event are counted, and
//! past the proxy's `max_line` the stream fails instead of letting the parser's buffer grow.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sse_stream::{Sse, SseByteStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes of SSE framing allowed beyond the longest message.
const FRAMING: usize = 64 << 10;

/// Why an event stream ended early.
#[derive(Debug, thiserror::Error)]
pub(super) enum StreamError {
    /// An event (or the bytes before the first) was longer than the proxy relays.
    #[error("an event longer than {max} bytes")]
    TooLarge { max: usize },
    /// The bytes being read from the server (all streams and bodies) filled their budget.
    #[error("the server's responses in flight already hold {budget} bytes")]
    Busy { budget: usize },
    /// The connection broke, or the stream was not valid SSE.
    #[error("the event stream broke off: {0}")]
    Broken(String),
}

/// The events of one response body.
pub(super) struct Events {
    inner: Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>,
    /// Bytes taken from the body since the last whole event.
    taken: Arc<AtomicUsize>,
    /// The share of the budget those bytes hold.
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
    /// The budget was spent.
    starved: Arc<AtomicBool>,
    max: usize,
    budget: usize,
}

impl Events {
    /// Events of `body`, none longer than `max` bytes, the bytes of the event being read
    /// taken from `budget` (`size` bytes in all) until it is whole.
    pub(super) fn new(body: Incoming, max: usize, budget: Arc<Semaphore>, size: usize) -> Events {
        // Room for the event's framing (`data: ` on each of its lines, `id:`, `retry:`) on
        // top of the message it carries.
        let bound = max + FRAMING;
        let taken = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&taken);
        let held: Arc<Mutex<Option<OwnedSemaphorePermit>>> = Arc::default();
        let holding = Arc::clone(&held);
        let starved = Arc::new(AtomicBool::new(false));
        let starving = Arc::clone(&starved);
        let bytes = body.into_data_stream().map(move |piece| {
            let piece = piece.map_err(std::io::Error::other)?;
            let n = u32::try_from(piece.len()).unwrap_or(u32::MAX);
            // Fails rather than waits: streams waiting for each other's room would never
            // make a whole event.
            let Ok(permit) = Arc::clone(&budget).try_acquire_many_owned(n) else {
                starving.store(true, Ordering::Relaxed);
                return Err(std::io::Error::other("the budget is spent"));
            };
            let mut share = holding.lock().unwrap_or_else(|e| e.into_inner());
            match share.as_mut() {
                Some(share) => share.merge(permit),
                None => *share = Some(permit),
            }
            drop(share);
            // The parser asks for more only when it holds no whole event: what it was given
            // since the last one is what it holds (and at most one piece more).
            let held = counter.fetch_add(piece.len(), Ordering::Relaxed) + piece.len();
            if held > bound {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "event too large",
                ));
            }
            Ok(piece)
        });
        Events {
            inner: Box::pin(SseByteStream::new(bytes)),
            taken,
            held,
            starved,
            max,
            budget: size,
        }
    }

    /// The next event; `None` at the end of the stream.
    pub(super) async fn next(&mut self) -> Option<Result<Sse, StreamError>> {
        let item = self.inner.next().await?;
        Some(match item {
            Ok(event) => {
                self.taken.store(0, Ordering::Relaxed);
                // What the parser held is this event (now the caller's) and at most a piece
                // of the next: let go, as the count is.
                self.held.lock().unwrap_or_else(|e| e.into_inner()).take();
                Ok(event)
            }
            Err(_) if self.starved.load(Ordering::Relaxed) => Err(StreamError::Busy {
                budget: self.budget,
            }),
            Err(_) if self.taken.load(Ordering::Relaxed) > self.max + FRAMING => {
                Err(StreamError::TooLarge { max: self.max })
            }
            Err(e) => Err(StreamError::Broken(e.to_string())),
        })
    }
}

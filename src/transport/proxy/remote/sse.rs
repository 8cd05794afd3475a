//! A response's Server-Sent Events (a POST's stream or the GET stream), parsed by `sse-stream`
//! and bounded here: the bytes taken from the body since the last whole event are counted, and
//! past the proxy's `max_line` the stream fails instead of letting the parser's buffer grow.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::{Stream, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sse_stream::{Sse, SseByteStream};

/// Bytes of SSE framing allowed beyond the longest message.
const FRAMING: usize = 64 << 10;

/// Why an event stream ended early.
#[derive(Debug, thiserror::Error)]
pub(super) enum StreamError {
    /// An event (or the bytes before the first) was longer than the proxy relays.
    #[error("an event longer than {max} bytes")]
    TooLarge { max: usize },
    /// The connection broke, or the stream was not valid SSE.
    #[error("the event stream broke off: {0}")]
    Broken(String),
}

/// The events of one response body.
pub(super) struct Events {
    inner: Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>,
    /// Bytes taken from the body since the last whole event.
    taken: Arc<AtomicUsize>,
    max: usize,
}

impl Events {
    /// Events of `body`, none longer than `max` bytes.
    pub(super) fn new(body: Incoming, max: usize) -> Events {
        // Room for the event's framing (`data: ` on each of its lines, `id:`, `retry:`) on
        // top of the message it carries.
        let bound = max + FRAMING;
        let taken = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&taken);
        let bytes = body.into_data_stream().map(move |piece| {
            let piece = piece.map_err(std::io::Error::other)?;
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
            max,
        }
    }

    /// The next event; `None` at the end of the stream.
    pub(super) async fn next(&mut self) -> Option<Result<Sse, StreamError>> {
        let item = self.inner.next().await?;
        Some(match item {
            Ok(event) => {
                self.taken.store(0, Ordering::Relaxed);
                Ok(event)
            }
            Err(_) if self.taken.load(Ordering::Relaxed) > self.max + FRAMING => {
                Err(StreamError::TooLarge { max: self.max })
            }
            Err(e) => Err(StreamError::Broken(e.to_string())),
        })
    }
}

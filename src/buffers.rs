//! Large request lines, and the spare buffers a connection reads the next one into.
//!
//! An upload chunk arrives as one line of megabytes. Read into a new buffer each time, a line
//! grew by doubling from one read's size (copied at each step), its pages were new and faulted
//! in, and the chunk was then decoded into another new buffer: a fifth of the broker's time on
//! an 8 MiB upload, and, freed into malloc's arenas, most of its peak memory. Now a line is read
//! into a spare buffer a finished line gave back, and the chunk is decoded in place, in the
//! line's own buffer (`codec::decode_base64_in_place`), which goes back to the spares when
//! the chunk is written.

use std::ops::{Deref, DerefMut, Range};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Lines at least this long are worth keeping for reuse (and are handed over by the reader in
/// the buffer they were read into).
pub(crate) const LARGE_LINE: usize = 256 << 10;

/// How many large line buffers a connection keeps for reuse: one being read into while one is
/// worked on, and one more for the line between them.
const SPARES: usize = 2;

/// A spare buffer, and its share of the budget.
type Kept = (Vec<u8>, Option<OwnedSemaphorePermit>);

/// A connection's spare line buffers. Cloned, it is the same spares.
///
/// A spare holds its size of the broker's budget for partial lines (`max_pending_input`)
/// while it is kept, and is freed when the budget has no room: spares are lines that are no
/// longer in flight, and without that bound a connection that read a few long lines and went
/// quiet kept them outside every limit, as many times over as there are connections.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spares {
    kept: Arc<Mutex<Vec<Kept>>>,
    /// The budget, in KiB (`None`: unbounded, for a reader of one trusted stream).
    budget: Option<Arc<Semaphore>>,
}

impl Spares {
    /// Spares counted against `budget` (permits of 1 KiB).
    pub(crate) fn within(budget: Arc<Semaphore>) -> Spares {
        Spares {
            kept: Arc::default(),
            budget: Some(budget),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Kept>> {
        // A push, a pop or a clear cannot panic half-way.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buf` when it is large, there is room among the spares, and the budget has room
    /// for it.
    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() < LARGE_LINE {
            return;
        }
        let mut kept = self.lock();
        if kept.len() >= SPARES {
            return;
        }
        let permit = match &self.budget {
            Some(budget) => {
                let kib = u32::try_from(buf.capacity().div_ceil(1024)).unwrap_or(u32::MAX);
                match Arc::clone(budget).try_acquire_many_owned(kib) {
                    Ok(permit) => Some(permit),
                    Err(_) => return,
                }
            }
            None => None,
        };
        kept.push((buf, permit));
    }

    /// The spare with the most room, if it has more than `than` bytes (its share of the
    /// budget is given back: the reader covers the line it reads as any other).
    pub(crate) fn take(&self, than: usize) -> Option<Vec<u8>> {
        let mut kept = self.lock();
        let best = (0..kept.len()).max_by_key(|&i| kept[i].0.capacity())?;
        (kept[best].0.capacity() > than).then(|| kept.swap_remove(best).0)
    }

    /// Frees every spare (the connection has no upload open: the next line may be small, and
    /// a connection that rests should not hold megabytes).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// How many spares are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// A request line that gives its buffer back to its connection's [`Spares`] when dropped.
#[derive(Debug)]
pub(crate) struct Line {
    buf: Vec<u8>,
    home: Option<Spares>,
}

impl Line {
    /// `buf`, given back to `home` (if any) once dropped.
    pub(crate) fn new(buf: Vec<u8>, home: Option<Spares>) -> Line {
        Line { buf, home }
    }
}

impl Deref for Line {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl DerefMut for Line {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give(std::mem::take(&mut self.buf));
        }
    }
}

/// A string lifted out of a request line before parsing (`jsonrpc::lift`): in a line the
/// broker owns, where it can be decoded in place, or in one a host lent it
/// ([`crate::Session::handle`]).
#[derive(Debug)]
pub(crate) enum Content<'a> {
    /// `line[range]`.
    Owned(Line, Range<usize>),
    /// Borrowed from the host's line.
    Borrowed(&'a [u8]),
}

impl Content<'_> {
    /// The string's bytes, as sent.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Content::Owned(line, range) => &line[range.clone()],
            Content::Borrowed(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_lines_come_back_and_small_ones_do_not() {
        let spares = Spares::default();
        drop(Line::new(vec![0; 10], Some(spares.clone())));
        assert_eq!(spares.len(), 0);
        for _ in 0..3 {
            drop(Line::new(
                Vec::with_capacity(LARGE_LINE),
                Some(spares.clone()),
            ));
        }
        assert_eq!(spares.len(), SPARES, "at most SPARES are kept");
        assert!(
            spares.take(LARGE_LINE).is_none(),
            "none has more room than asked"
        );
        assert!(spares.take(LARGE_LINE - 1).is_some());
        spares.clear();
        assert_eq!(spares.len(), 0);
    }

    #[test]
    fn spares_hold_the_budget_and_none_is_kept_past_it() {
        let budget = Arc::new(Semaphore::new(3 * LARGE_LINE / 1024));
        let spares = Spares::within(Arc::clone(&budget));
        drop(Line::new(
            Vec::with_capacity(2 * LARGE_LINE),
            Some(spares.clone()),
        ));
        assert_eq!(spares.len(), 1);
        assert_eq!(
            budget.available_permits(),
            LARGE_LINE / 1024,
            "held while kept"
        );
        drop(Line::new(
            Vec::with_capacity(2 * LARGE_LINE),
            Some(spares.clone()),
        ));
        assert_eq!(spares.len(), 1, "no room in the budget: freed");
        let buf = spares.take(0).expect("the spare");
        assert_eq!(
            budget.available_permits(),
            3 * LARGE_LINE / 1024,
            "given back when taken"
        );
        drop(Line::new(buf, Some(spares.clone())));
        spares.clear();
        assert_eq!(
            budget.available_permits(),
            3 * LARGE_LINE / 1024,
            "and when cleared"
        );
    }
}

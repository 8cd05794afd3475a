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

/// Lines at least this long are worth keeping for reuse (and are handed over by the reader in
/// the buffer they were read into).
pub(crate) const LARGE_LINE: usize = 1 << 20;

/// How many large line buffers a connection keeps for reuse: one being read into while one is
/// worked on, and one more for the line between them.
const SPARES: usize = 2;

/// A connection's spare line buffers. Cloned, it is the same spares.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spares(Arc<Mutex<Vec<Vec<u8>>>>);

impl Spares {
    fn lock(&self) -> MutexGuard<'_, Vec<Vec<u8>>> {
        // A push, a pop or a clear cannot panic half-way.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `buf` when it is large and there is room among the spares.
    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() >= LARGE_LINE {
            let mut spares = self.lock();
            if spares.len() < SPARES {
                spares.push(buf);
            }
        }
    }

    /// The spare with the most room, if it has more than `than` bytes.
    pub(crate) fn take(&self, than: usize) -> Option<Vec<u8>> {
        let mut spares = self.lock();
        let best = (0..spares.len()).max_by_key(|&i| spares[i].capacity())?;
        (spares[best].capacity() > than).then(|| spares.swap_remove(best))
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
}

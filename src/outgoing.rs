//! Frames on their way out: a response's bytes and, for a large read, its base64 body in
//! pages of its own.
//!
//! A chunk of several megabytes is encoded straight into an anonymous mapping ([`Body`]).
//! When the output is a pipe, the writer hands those pages to the kernel with `vmsplice`
//! instead of copying them ([`crate::transport::pipe`]) and then unmaps them: the pipe keeps
//! the pages alive until the peer has read them, and nothing can write to them again, so the
//! peer reads exactly what was encoded. Everywhere else (sockets, the library's `Vec`
//! frames) the body is copied like any other bytes, and its pages are reused.

use std::io;
use std::sync::{Arc, Mutex, Weak};

use memmap2::{MmapMut, MmapOptions};
use tokio::sync::OwnedSemaphorePermit;

/// Huge-page size: bodies start on this boundary and ask for transparent huge pages, so
/// faulting one in costs one fault (and one zeroing pass) per 2 MiB rather than per 4 KiB.
const HUGE: usize = 2 << 20;

/// Bodies a session keeps for reuse once the peer has read them.
const POOL_KEEP: usize = 2;

/// An anonymous mapping whose usable part starts on a huge-page boundary.
#[derive(Debug)]
struct Pages {
    map: MmapMut,
    start: usize,
}

impl Pages {
    fn new(capacity: usize) -> io::Result<Pages> {
        let map = MmapOptions::new().len(capacity.max(1) + HUGE).map_anon()?;
        // Best effort: without huge pages the body still works, one small page at a time.
        let _ = map.advise(memmap2::Advice::HugePage);
        let start = map.as_ptr().align_offset(HUGE).min(HUGE);
        Ok(Pages { map, start })
    }

    fn capacity(&self) -> usize {
        self.map.len() - self.start
    }
}

/// A session's bodies waiting to be reused.
///
/// Reuse saves the kernel zeroing fresh pages, which costs about as much as encoding into
/// them. A body only comes back here when nothing outside this process can see its pages:
/// when it was copied out (a socket, [`Outgoing::into_vec`]). A body spliced into a pipe is
/// discarded (`Body::discard`): the pipe, and whatever its reader splices them on to, may
/// hold its pages for as long as they like.
#[derive(Debug, Default)]
pub struct BodyPool {
    free: Mutex<Vec<Pages>>,
}

impl BodyPool {
    /// A body with room for `capacity` bytes: a reused one when one is big enough, else
    /// fresh pages.
    pub fn take(self: &Arc<Self>, capacity: usize) -> io::Result<Body> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .position(|p| p.capacity() >= capacity)
                .map(|i| free.swap_remove(i))
        };
        let pages = match reused {
            Some(pages) => pages,
            None => Pages::new(capacity)?,
        };
        Ok(Body {
            pages: Some(pages),
            len: 0,
            pool: Arc::downgrade(self),
        })
    }

    fn put(&self, pages: Pages) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < POOL_KEEP {
            free.push(pages);
        }
    }
}

/// A response body in pages of its own, filled front to back. Dropped, it goes back to its
/// pool; `Body::discard` unmaps it instead.
#[derive(Debug)]
pub struct Body {
    /// Always `Some` until dropped or discarded.
    pages: Option<Pages>,
    len: usize,
    pool: Weak<BodyPool>,
}

impl Body {
    fn region(&self) -> &[u8] {
        self.pages.as_ref().map_or(&[], |p| &p.map[p.start..])
    }

    fn region_mut(&mut self) -> &mut [u8] {
        self.pages
            .as_mut()
            .map_or(&mut [], |p| &mut p.map[p.start..])
    }

    /// The unfilled rest of the pages.
    pub fn spare(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region_mut()[len..]
    }

    /// Marks `n` more bytes of [`Body::spare`] as filled.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.region().len());
    }

    /// The filled bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.region()[..self.len]
    }

    /// The filled bytes, mutably: `vmsplice` takes them from a unique borrow, so whatever
    /// the kernel does with the pages, no shared reference observes it.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region_mut()[..len]
    }

    /// How many bytes are filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Unmaps the pages without returning them to the pool: for a body spliced into a pipe,
    /// whose pages must never be written again.
    pub(crate) fn discard(mut self) {
        self.pool = Weak::new();
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        if let (Some(pool), Some(pages)) = (self.pool.upgrade(), self.pages.take()) {
            pool.put(pages);
        }
    }
}

/// One frame for the peer (newline included): bytes, and possibly a [`Body`] that belongs
/// at an offset inside them. It may hold a share of its session's output budget, given back
/// when the frame has been written (or dropped).
#[derive(Debug, Default)]
pub struct Outgoing {
    bytes: Vec<u8>,
    body: Option<(usize, Body)>,
    budget: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    /// A frame whose body goes at byte `at` of `bytes`.
    pub(crate) fn with_body(bytes: Vec<u8>, at: usize, body: Body) -> Outgoing {
        let at = at.min(bytes.len());
        Outgoing {
            bytes,
            body: Some((at, body)),
            budget: None,
        }
    }

    /// Attaches a share of an output budget, held until this frame is gone.
    pub(crate) fn hold(mut self, budget: Option<OwnedSemaphorePermit>) -> Outgoing {
        self.budget = budget;
        self
    }

    /// The whole frame in one buffer (the body copied in).
    pub fn into_vec(self) -> Vec<u8> {
        match self.body {
            None => self.bytes,
            Some((at, body)) => {
                let mut out = Vec::with_capacity(self.bytes.len() + body.len());
                out.extend_from_slice(&self.bytes[..at]);
                out.extend_from_slice(body.as_slice());
                out.extend_from_slice(&self.bytes[at..]);
                out
            }
        }
    }

    /// The frame's parts: its bytes, the body and where it goes, and the share of the
    /// output budget (to be dropped once the frame is written).
    pub(crate) fn into_parts(
        self,
    ) -> (Vec<u8>, Option<(usize, Body)>, Option<OwnedSemaphorePermit>) {
        (self.bytes, self.body, self.budget)
    }
}

impl From<Vec<u8>> for Outgoing {
    fn from(bytes: Vec<u8>) -> Outgoing {
        Outgoing {
            bytes,
            body: None,
            budget: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_goes_where_it_belongs() {
        let pool = Arc::new(BodyPool::default());
        let mut body = pool.take(10).unwrap();
        body.spare()[..3].copy_from_slice(b"BBB");
        body.advance(3);
        let frame = Outgoing::with_body(b"{\"c\":\"\"}\n".to_vec(), 6, body);
        let whole = frame.into_vec();
        assert_eq!(whole.len(), 12);
        assert_eq!(whole, b"{\"c\":\"BBB\"}\n");
        // Copied out, the body went back to the pool and serves the next take.
        assert_eq!(pool.free.lock().unwrap().len(), 1);
    }
}

//! Frames on their way out: a response's bytes and, for a large read, its base64 body in
//! pages of its own.
//!
//! A chunk of hundreds of kilobytes or more is encoded straight into an anonymous mapping
//! ([`Body`]) that the writer copies to the output between the frame's head and tail, and
//! that then goes back to its session's [`BodyPool`] for the next chunk. Reused pages are warm:
//! the cost that bounded large reads before was not the copy into the pipe but the kernel
//! zeroing fresh pages for every chunk (more than half the broker's CPU at 1 MiB chunks on the
//! benchmark VM, whose freed memory goes back to the host), see docs/benchmarks.md.

use std::io;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::limits::{OUTPUT_BUDGET_KIB, POOL_IDLE};
use memmap2::{MmapMut, MmapOptions};
use tokio::sync::OwnedSemaphorePermit;

/// Huge-page size: bodies at least this large start on this boundary and ask for transparent
/// huge pages, so faulting one in costs one fault per 2 MiB rather than per 4 KiB. Smaller
/// bodies do not: a huge page would zero 2 MiB to hold a few hundred kilobytes.
const HUGE: usize = 2 << 20;

/// Bytes of mappings a session keeps for reuse: its output budget (the answers it may have in
/// flight at once), plus the huge-page alignment of up to four of them, so that a session
/// reading large chunks with as many in flight as its budget allows finds every body warm.
const POOL_KEEP: usize = (OUTPUT_BUDGET_KIB << 10) + 4 * HUGE;

/// An anonymous mapping whose usable part starts on a huge-page boundary when it is large.
#[derive(Debug)]
struct Pages {
    map: MmapMut,
    start: usize,
    /// When it last went back to the pool.
    returned: Instant,
}

impl Pages {
    fn new(capacity: usize) -> io::Result<Pages> {
        let huge = capacity >= HUGE;
        let pad = if huge { HUGE } else { 0 };
        let map = MmapOptions::new().len(capacity.max(1) + pad).map_anon()?;
        let start = if huge {
            // Best effort: without huge pages the body still works, one small page at a time.
            let _ = map.advise(memmap2::Advice::HugePage);
            map.as_ptr().align_offset(HUGE).min(HUGE)
        } else {
            0
        };
        Ok(Pages {
            map,
            start,
            returned: Instant::now(),
        })
    }

    fn capacity(&self) -> usize {
        self.map.len() - self.start
    }
}

/// A session's bodies waiting to be reused, at most [`POOL_KEEP`] bytes of them.
///
/// A body is only ever written by the request that took it and read by the writer that
/// copies it out; once copied, nothing outside this process has seen its pages (they are
/// never spliced), so reusing them cannot change what a peer already received.
#[derive(Debug, Default)]
pub(crate) struct BodyPool {
    free: Mutex<Vec<Pages>>,
}

impl BodyPool {
    /// A body with room for `capacity` bytes: the smallest reused one big enough, else fresh
    /// pages.
    pub(crate) fn take(self: &Arc<Self>, capacity: usize) -> io::Result<Body> {
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .enumerate()
                .filter(|(_, p)| p.capacity() >= capacity)
                .min_by_key(|(_, p)| p.capacity())
                .map(|(i, _)| i)
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

    fn put(&self, mut pages: Pages) {
        pages.returned = Instant::now();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.push(pages);
        // Over the bound, the oldest go first.
        free.sort_by_key(|p| std::cmp::Reverse(p.returned));
        let mut kept = 0;
        free.retain(|p| {
            kept += p.map.len();
            kept <= POOL_KEEP
        });
    }

    /// Unmaps the bodies unused for [`POOL_IDLE`]. The broker's reaper calls it about once a
    /// second for every session, so a session that stops reading large chunks gives their
    /// memory back.
    pub(crate) fn trim(&self) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if !free.is_empty() {
            free.retain(|p| p.returned.elapsed() < POOL_IDLE);
        }
    }

    /// Bytes of bodies waiting for reuse.
    #[cfg(test)]
    fn kept(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.iter().map(|p| p.map.len()).sum()
    }
}

/// A response body in pages of its own, filled front to back. Dropped, it goes back to its
/// pool.
#[derive(Debug)]
pub(crate) struct Body {
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
    pub(crate) fn spare(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region_mut()[len..]
    }

    /// Marks `n` more bytes of [`Body::spare`] as filled.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.region().len());
    }

    /// The filled bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.region()[..self.len]
    }

    /// How many bytes are filled.
    pub(crate) fn len(&self) -> usize {
        self.len
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
pub(crate) struct Outgoing {
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
    pub(crate) fn into_vec(self) -> Vec<u8> {
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
        let again = pool.take(10).unwrap();
        assert_eq!(pool.free.lock().unwrap().len(), 0);
        drop(again);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound_and_gives_idle_bodies_back() {
        let pool = Arc::new(BodyPool::default());
        let big = POOL_KEEP / 3;
        let bodies: Vec<Body> = (0..5).map(|_| pool.take(big).unwrap()).collect();
        drop(bodies);
        assert!(pool.kept() <= POOL_KEEP, "{} kept", pool.kept());
        assert!(pool.kept() >= big, "nothing kept");
        // Fresh bodies are not trimmed; old ones are.
        pool.trim();
        assert!(pool.kept() >= big);
        for p in pool.free.lock().unwrap().iter_mut() {
            p.returned -= POOL_IDLE;
        }
        pool.trim();
        assert_eq!(pool.kept(), 0);
    }
}

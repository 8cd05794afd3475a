//! MCP stdio framing: one message per `\n`-terminated line, with a named maximum.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::buffers::{LARGE_LINE, Spares};

/// How much to ask the OS for per read.
const READ_SIZE: usize = 256 << 10;

/// Lines at least this long are handed over in the buffer they were read into, not copied.
const HAND_OVER: usize = LARGE_LINE;

/// What the reader yields.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// One line without its `\n` (and without a `\r` before it).
    Line(Vec<u8>),
    /// A line longer than the maximum; its bytes were discarded up to and including its `\n`.
    TooLong {
        /// How many bytes the discarded line had.
        len: u64,
    },
    /// A line that could not be held: the budget shared by every connection's partial lines
    /// stayed full for as long as the reader was allowed to wait. Its bytes were discarded
    /// up to and including its `\n`; the peer may send it again.
    Refused {
        /// How many bytes the discarded line had.
        len: u64,
    },
}

/// Bytes of line buffer a reader holds without asking its budget: small requests never wait
/// for it (a buffer starts at one read's size, and grows by doubling).
const ALLOWANCE: usize = 2 * READ_SIZE;

/// A budget for partial lines shared by many readers (every connection of a broker), in KiB.
#[derive(Debug, Clone)]
pub(crate) struct InputBudget {
    kib: Arc<Semaphore>,
    total_kib: usize,
}

impl InputBudget {
    /// A budget of `bytes` (at least one read's worth).
    pub(crate) fn new(bytes: usize) -> InputBudget {
        let total_kib = bytes.div_ceil(1024).max(READ_SIZE / 1024);
        InputBudget {
            kib: Arc::new(Semaphore::new(total_kib)),
            total_kib,
        }
    }

    /// The budget itself, in permits of 1 KiB, for what else holds line memory (the spares).
    pub(crate) fn kib(&self) -> Arc<Semaphore> {
        Arc::clone(&self.kib)
    }

    /// KiB not held by any reader now.
    #[cfg(test)]
    pub(crate) fn available_kib(&self) -> usize {
        self.kib.available_permits()
    }
}

/// A reader's share of an [`InputBudget`].
#[derive(Debug)]
struct Share {
    budget: InputBudget,
    /// How long to wait for room before refusing the line.
    wait: Duration,
    held: Option<OwnedSemaphorePermit>,
}

impl Share {
    fn held_kib(&self) -> usize {
        self.held.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Makes the share cover `bytes` of partial line (less the allowance); `false` when the
    /// budget stayed full for the whole wait.
    async fn cover(&mut self, bytes: usize) -> bool {
        let want = bytes
            .saturating_sub(ALLOWANCE)
            .div_ceil(1024)
            .min(self.budget.total_kib);
        let held = self.held_kib();
        if want <= held {
            return true;
        }
        // In steps of at least a megabyte, so a large line asks a few times, not per read.
        let step = (want - held).max(1024).min(self.budget.total_kib - held) as u32;
        let sem = Arc::clone(&self.budget.kib);
        let more = match sem.clone().try_acquire_many_owned(step) {
            Ok(p) => p,
            Err(_) => match tokio::time::timeout(self.wait, sem.acquire_many_owned(step)).await {
                Ok(Ok(p)) => p,
                _ => return false,
            },
        };
        match &mut self.held {
            Some(p) => p.merge(more),
            None => self.held = Some(more),
        }
        true
    }

    fn release(&mut self) {
        self.held = None;
    }
}

/// Splits a byte stream into lines, never holding more than `max` bytes of one line.
#[derive(Debug)]
pub(crate) struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Start of the unconsumed part of `buf`.
    start: usize,
    /// Everything in `buf[start..scanned]` is known to hold no `\n`.
    scanned: usize,
    max: usize,
    eof: bool,
    share: Option<Share>,
    spares: Option<Spares>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// A reader refusing lines longer than `max` bytes.
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::with_capacity(READ_SIZE),
            start: 0,
            scanned: 0,
            max,
            eof: false,
            share: None,
            spares: None,
        }
    }

    /// Reads a large line into a buffer given back to `spares` rather than growing a new one.
    ///
    /// A line grows by doubling from one read's size: an upload chunk's 11 MB line was copied
    /// as it grew, and its pages were new and faulted in, for every chunk (a tenth of the
    /// broker's time on an 8 MiB upload, and, freed, most of its peak memory).
    pub(crate) fn with_spares(mut self, spares: Spares) -> Self {
        self.spares = Some(spares);
        self
    }

    /// Moves the partial line into a spare buffer with more room than `buf` has, when it is
    /// about to grow past [`HAND_OVER`] / 2 (so small lines never take one).
    fn adopt_spare(&mut self) {
        let partial = self.buf.len() - self.start;
        if self.buf.capacity() - self.buf.len() >= READ_SIZE || partial < HAND_OVER / 2 {
            return;
        }
        let Some(mut spare) = self
            .spares
            .as_ref()
            .and_then(|s| s.take(self.buf.capacity()))
        else {
            return;
        };
        spare.clear();
        spare.extend_from_slice(&self.buf[self.start..]);
        self.scanned -= self.start;
        self.start = 0;
        self.buf = spare;
    }

    /// Holds partial lines beyond a small allowance only with room in `budget`, waiting for
    /// it at most `wait`; a line that cannot get room is refused ([`Frame::Refused`]).
    pub(crate) fn with_budget(mut self, budget: InputBudget, wait: Duration) -> Self {
        self.share = Some(Share {
            budget,
            wait,
            held: None,
        });
        self
    }

    /// Whether a whole line is already here: the next [`LineReader::next_frame`] then reads
    /// nothing.
    pub(crate) fn has_line(&self) -> bool {
        memchr::memchr(b'\n', &self.buf[self.scanned..]).is_some()
    }

    /// The next frame, or `None` at end of input. A last line without `\n` is still a line.
    pub(crate) async fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.scanned..]) {
                let end = self.scanned + i;
                return Ok(Some(self.take(end)));
            }
            self.scanned = self.buf.len();
            if self.buf.len() - self.start > self.max {
                if let Some(share) = &mut self.share {
                    share.release();
                }
                return self.discard_rest().await.map(Some);
            }
            if self.eof {
                if self.start < self.buf.len() {
                    let end = self.buf.len();
                    return Ok(Some(self.take(end)));
                }
                return Ok(None);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.scanned -= self.start;
                self.start = 0;
            }
            // After a large line, give its memory back rather than keep the high-water mark
            // for the rest of the session.
            if self.buf.capacity() > 4 * READ_SIZE && self.buf.len() < READ_SIZE {
                self.buf.shrink_to(READ_SIZE);
            }
            self.adopt_spare();
            self.buf.reserve(READ_SIZE);
            if let Some(share) = &mut self.share {
                // The buffer's whole allocation counts: it grows by doubling, so a line holds
                // up to twice its length, and that is what the machine pays for.
                if !share.cover(self.buf.capacity()).await {
                    share.release();
                    let refused = match self.discard_rest().await? {
                        Frame::TooLong { len } => Frame::Refused { len },
                        other => other,
                    };
                    return Ok(Some(refused));
                }
            }
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                self.eof = true;
            }
        }
    }

    /// The line `buf[start..end]`, consumed along with its `\n` (if there is one).
    fn take(&mut self, end: usize) -> Frame {
        // The line leaves the reader (it is counted by whoever holds it now: the session's
        // own budget for lines in flight); what is left is asked for again at the next read.
        if let Some(share) = &mut self.share {
            share.release();
        }
        let next = (end + 1).min(self.buf.len());
        let len = end - self.start;
        if len > self.max {
            self.start = next;
            self.scanned = next;
            return Frame::TooLong { len: len as u64 };
        }
        let strip = usize::from(len > 0 && self.buf[end - 1] == b'\r');
        let rest = self.buf.len() - next;
        let line = if self.start == 0 && len >= HAND_OVER && rest <= len / 4 {
            // A large line (an upload chunk) leaves in the buffer it arrived in; only the
            // little read past it is copied into a new one.
            let mut fresh = Vec::with_capacity(READ_SIZE.max(rest));
            fresh.extend_from_slice(&self.buf[next..]);
            let mut line = std::mem::replace(&mut self.buf, fresh);
            line.truncate(end - strip);
            self.start = 0;
            self.scanned = 0;
            line
        } else {
            let line = self.buf[self.start..end - strip].to_vec();
            self.start = next;
            self.scanned = next;
            line
        };
        Frame::Line(line)
    }

    /// Drops the over-long line's bytes as they arrive, up to its `\n`, holding none of them.
    async fn discard_rest(&mut self) -> io::Result<Frame> {
        let mut len = (self.buf.len() - self.start) as u64;
        self.buf.clear();
        self.buf.shrink_to(READ_SIZE);
        self.start = 0;
        self.scanned = 0;
        loop {
            self.buf.reserve(READ_SIZE);
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                self.eof = true;
                self.buf.clear();
                return Ok(Frame::TooLong { len });
            }
            match memchr::memchr(b'\n', &self.buf) {
                Some(i) => {
                    len += i as u64;
                    self.start = i + 1;
                    self.scanned = self.start;
                    return Ok(Frame::TooLong { len });
                }
                None => {
                    len += self.buf.len() as u64;
                    self.buf.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        let mut r = LineReader::new(input, max);
        let mut out = Vec::new();
        while let Some(f) = r.next_frame().await.unwrap() {
            out.push(f);
        }
        out
    }

    fn line(s: &str) -> Frame {
        Frame::Line(s.as_bytes().to_vec())
    }

    #[tokio::test]
    async fn splits_lines() {
        assert_eq!(
            frames(b"a\nbc\r\n\nlast", 10).await,
            vec![line("a"), line("bc"), line(""), line("last")]
        );
        assert_eq!(frames(b"", 10).await, vec![]);
    }

    #[tokio::test]
    async fn large_lines_handed_over_keep_what_follows() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut input = big.clone();
        input.extend(b"\r\nafter\n");
        input.extend(&big[..1_500_000]);
        input.extend(b"\nlast");
        let got = frames(&input, 4 << 20).await;
        assert_eq!(
            got,
            vec![
                Frame::Line(big.clone()),
                line("after"),
                Frame::Line(big[..1_500_000].to_vec()),
                line("last")
            ]
        );
    }

    #[tokio::test]
    async fn over_long_lines_are_dropped_and_reading_goes_on() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 1_000_000));
        input.extend(b"\nnext\n");
        let got = frames(&input, 1000).await;
        assert_eq!(
            got,
            vec![line("ok"), Frame::TooLong { len: 1_000_000 }, line("next")]
        );
        // Exactly at the limit is fine; one over is not.
        assert_eq!(
            frames(b"12345\n123456\n", 5).await,
            vec![line("12345"), Frame::TooLong { len: 6 }]
        );
        // An over-long line cut off by EOF.
        assert_eq!(
            frames(&[b'y'; 50], 10).await,
            vec![Frame::TooLong { len: 50 }]
        );
    }

    #[tokio::test]
    async fn partial_lines_share_one_budget_and_a_line_without_room_is_refused() {
        use tokio::io::AsyncWriteExt;
        // Room for 2 MiB of partial lines beyond each reader's allowance.
        let budget = InputBudget::new(2 << 20);
        let wait = Duration::from_millis(200);
        let (mut a_in, a_out) = tokio::io::duplex(8 << 20);
        let (mut b_in, b_out) = tokio::io::duplex(8 << 20);
        let mut a = LineReader::new(a_out, 32 << 20).with_budget(budget.clone(), wait);
        let mut b = LineReader::new(b_out, 32 << 20).with_budget(budget.clone(), wait);
        // A holds a partial line of 3 MiB: it gets the whole budget, then waits for more.
        a_in.write_all(&vec![b'a'; 3 << 20]).await.unwrap();
        let pending = tokio::time::timeout(Duration::from_millis(100), a.next_frame()).await;
        assert!(pending.is_err(), "A's line is not complete");
        assert!(budget.available_kib() < 1024, "{}", budget.available_kib());
        // B's 3 MiB line finds no room: refused (its bytes discarded), and B goes on.
        b_in.write_all(&vec![b'b'; 3 << 20]).await.unwrap();
        b_in.write_all(b"\nping\n").await.unwrap();
        assert_eq!(
            b.next_frame().await.unwrap(),
            Some(Frame::Refused { len: 3 << 20 })
        );
        assert_eq!(b.next_frame().await.unwrap(), Some(line("ping")));
        // Once A's connection is gone, its room comes back and a large line goes through.
        drop(a);
        drop(a_in);
        b_in.write_all(&vec![b'c'; 2 << 20]).await.unwrap();
        b_in.write_all(b"\n").await.unwrap();
        assert_eq!(
            b.next_frame().await.unwrap(),
            Some(Frame::Line(vec![b'c'; 2 << 20]))
        );
    }
}

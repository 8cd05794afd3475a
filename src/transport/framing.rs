//! MCP stdio framing: one message per `\n`-terminated line, with a named maximum.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The default maximum line length: 32 MiB, room for an 8 MiB chunk in base64 and then some.
pub const DEFAULT_MAX_LINE: usize = 32 << 20;

/// How much to ask the OS for per read.
const READ_SIZE: usize = 256 << 10;

/// Lines at least this long are handed over in the buffer they were read into, not copied.
const HAND_OVER: usize = 1 << 20;

/// What the reader yields.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One line without its `\n` (and without a `\r` before it).
    Line(Vec<u8>),
    /// A line longer than the maximum; its bytes were discarded up to and including its `\n`.
    TooLong {
        /// How many bytes the discarded line had.
        len: u64,
    },
}

/// Splits a byte stream into lines, never holding more than `max` bytes of one line.
#[derive(Debug)]
pub struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Start of the unconsumed part of `buf`.
    start: usize,
    /// Everything in `buf[start..scanned]` is known to hold no `\n`.
    scanned: usize,
    max: usize,
    eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// A reader refusing lines longer than `max` bytes.
    pub fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::with_capacity(READ_SIZE),
            start: 0,
            scanned: 0,
            max,
            eof: false,
        }
    }

    /// The next frame, or `None` at end of input. A last line without `\n` is still a line.
    pub async fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[self.scanned..]) {
                let end = self.scanned + i;
                return Ok(Some(self.take(end)));
            }
            self.scanned = self.buf.len();
            if self.buf.len() - self.start > self.max {
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
            self.buf.reserve(READ_SIZE);
            if self.inner.read_buf(&mut self.buf).await? == 0 {
                self.eof = true;
            }
        }
    }

    /// The line `buf[start..end]`, consumed along with its `\n` (if there is one).
    fn take(&mut self, end: usize) -> Frame {
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
}

//! Writing frames to the peer.
//!
//! When stdout is a pipe, its size matters for megabyte-sized responses: the default 64 KiB
//! makes writer and reader wake each other 16 times per megabyte, so it is raised to the
//! system's `fs.pipe-max-size`. Bodies are copied into the output and go back to their
//! session's pool. (They were once handed over with `vmsplice`, which saves that copy but
//! needs fresh pages for every chunk, because a peer that splices the pipe onward holds the
//! pages past its read; zeroing those pages cost more than the copy: docs/benchmarks.md.)

// Ambient `std::fs` calls are allowed here (clippy.toml): the broker's own pipes (`/proc/sys/fs/pipe-max-size`).
#![allow(clippy::disallowed_methods)]

use std::io::{self, BufWriter, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::outgoing::Outgoing;

/// The pipe size asked for when the system allows no more (its usual `fs.pipe-max-size`).
const PIPE_SIZE: usize = 1 << 20;

/// Whether `fd` is a pipe (or FIFO).
pub(crate) fn is_pipe(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    })
}

/// Raises a pipe's buffer to the largest size an unprivileged process may set; leaves
/// anything that is not a pipe alone. Best effort: a pipe keeps working at its old size.
pub(crate) fn grow(fd: BorrowedFd<'_>) {
    if !is_pipe(fd) {
        return;
    }
    let max = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(PIPE_SIZE);
    match rustix::pipe::fcntl_setpipe_size(fd, max) {
        Ok(size) => tracing::debug!(size, "pipe buffer raised"),
        Err(e) => tracing::debug!(error = %e, "pipe buffer left as it is"),
    }
}

/// Writes frames to one output, small ones through a buffer.
pub(crate) struct FrameWriter<W: Write + AsFd> {
    out: BufWriter<W>,
}

impl<W: Write + AsFd> FrameWriter<W> {
    /// A writer over `output` (a pipe's buffer is grown on the way).
    pub(crate) fn new(output: W) -> FrameWriter<W> {
        grow(output.as_fd());
        FrameWriter {
            out: BufWriter::with_capacity(256 << 10, output),
        }
    }

    /// Writes one frame (perhaps only into the buffer: see [`FrameWriter::flush`]).
    pub(crate) fn write(&mut self, frame: Outgoing) -> io::Result<()> {
        // The budget share goes when this returns: the frame is then out of our memory.
        let (bytes, body, _budget) = frame.into_parts();
        let Some((at, body)) = body else {
            return self.out.write_all(&bytes);
        };
        self.out.write_all(&bytes[..at])?;
        // A body larger than the buffer goes straight from its pages to the output; dropped
        // after, it serves the session's next large read.
        self.out.write_all(body.as_slice())?;
        self.out.write_all(&bytes[at..])
    }

    /// Sends what is buffered.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A blocking writer over a descriptor that may be non-blocking (it shares its open file with
/// a tokio reader): waits for room with `poll` instead of failing with `EAGAIN`.
pub(crate) struct BlockingWriter(pub(crate) OwnedFd);

impl AsFd for BlockingWriter {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Write for BlockingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match rustix::io::write(&self.0, buf) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::AGAIN) => {
                    let fd = self.0.as_fd();
                    let mut fds = [rustix::event::PollFd::new(
                        &fd,
                        rustix::event::PollFlags::OUT,
                    )];
                    match rustix::event::poll(&mut fds, None) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

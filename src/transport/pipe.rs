//! Writing frames to the peer, and the pipe tricks that make large reads cheap.
//!
//! When stdout is a pipe, two things matter for megabyte-sized responses: the pipe's size
//! (the default 64 KiB makes writer and reader wake each other 16 times per megabyte; it is
//! raised to the system's `fs.pipe-max-size`) and copies (a body in its own pages is handed
//! over with `vmsplice`, so the only copy left is the peer's own `read`). Spliced pages are
//! given up, never reused; bodies written by copy go back to their session's pool.

use std::io::{self, BufWriter, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;

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

/// Writes frames to one output: small ones through a buffer, bodies spliced when the output
/// is the write end of a pipe.
pub(crate) struct FrameWriter<W: Write + AsFd> {
    out: BufWriter<W>,
    splice: bool,
}

impl<W: Write + AsFd> FrameWriter<W> {
    /// A writer over `output` (a pipe's buffer is grown on the way).
    pub(crate) fn new(output: W) -> FrameWriter<W> {
        let fd = output.as_fd();
        grow(fd);
        let writable = rustix::fs::fcntl_getfl(fd).is_ok_and(|flags| {
            let mode = flags & rustix::fs::OFlags::RWMODE;
            mode == rustix::fs::OFlags::WRONLY || mode == rustix::fs::OFlags::RDWR
        });
        let splice = writable && is_pipe(fd);
        FrameWriter {
            out: BufWriter::with_capacity(256 << 10, output),
            splice,
        }
    }

    /// Writes one frame (perhaps only into the buffer: see [`FrameWriter::flush`]).
    pub(crate) fn write(&mut self, frame: Outgoing) -> io::Result<()> {
        // The budget share goes when this returns: the frame is then out of our memory.
        let (bytes, body, _budget) = frame.into_parts();
        let Some((at, mut body)) = body else {
            return self.out.write_all(&bytes);
        };
        self.out.write_all(&bytes[..at])?;
        if self.splice {
            self.out.flush()?;
            let spliced = splice_all(self.out.get_ref().as_fd(), body.as_mut_slice());
            let done = match spliced {
                Ok(()) => body.len(),
                Err(Fallback { done, error }) => {
                    tracing::debug!(%error, "vmsplice failed; copying bodies instead");
                    self.splice = false;
                    done
                }
            };
            let rest = self.out.write_all(&body.as_slice()[done..]);
            // Spliced pages are never reused: the pipe holds references to them, and a
            // reader that `splice`s or `tee`s them onward (as `std::io::copy` does between a
            // pipe and a socket) keeps them after it has "read" them, so no count of bytes
            // read can tell when they are free. Unmapped here, they live on only in the
            // kernel's references and are freed with the last of them.
            if done > 0 {
                body.discard();
            }
            rest?;
        } else {
            // Copied: the pages may serve the next large read.
            self.out.write_all(body.as_slice())?;
        }
        self.out.write_all(&bytes[at..])
    }

    /// Sends what is buffered.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// `vmsplice` stopped part way (or never worked): `done` bytes went, the rest is written the
/// ordinary way. A failure that is not about splicing (the peer closed the pipe) fails that
/// write too, and is reported from there.
struct Fallback {
    done: usize,
    error: io::Error,
}

/// Hands all of `body` to the pipe `fd` without copying it.
fn splice_all(fd: BorrowedFd<'_>, body: &mut [u8]) -> Result<(), Fallback> {
    let mut done = 0;
    while done < body.len() {
        let rest = &mut body[done..];
        let iov = [rustix::pipe::IoSliceRaw::from_slice_mut(rest)];
        // SAFETY: `vmsplice` requires that memory the caller must not see mutated is only
        // given to the write end of a pipe. The slice is a unique borrow of pages this
        // process owns (`Body`, an anonymous mapping alive for the whole call), so even if
        // the kernel wrote into it, no other reference could observe that; and `fd` is the
        // write end (checked with `F_GETFL` when the writer was made), so it only reads.
        // Without `SPLICE_F_GIFT` the kernel takes references to the pages; the caller unmaps
        // them right after and never writes to them again, so the peer reads what was there.
        #[allow(unsafe_code)]
        let sent = unsafe { rustix::pipe::vmsplice(fd, &iov, rustix::pipe::SpliceFlags::empty()) };
        match sent {
            Ok(0) => {
                return Err(Fallback {
                    done,
                    error: io::Error::from(io::ErrorKind::WriteZero),
                });
            }
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(Errno::AGAIN) => wait_writable(fd),
            Err(e) => {
                return Err(Fallback {
                    done,
                    error: e.into(),
                });
            }
        }
    }
    Ok(())
}

/// Waits until a (non-blocking) pipe has room.
fn wait_writable(fd: BorrowedFd<'_>) {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::OUT,
    )];
    let _ = rustix::event::poll(&mut fds, None);
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

//! `fsbroker serve`: one session over a byte stream (stdio, later a socket).
//!
//! The reader turns lines into tasks; each task's response frame goes through a bounded
//! channel to a writer thread that owns the output. Responses leave in completion order,
//! each carrying its request's id. At end of input the requests in flight finish, the writer
//! flushes, and the session ends.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::io::AsyncRead;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use super::framing::{DEFAULT_MAX_LINE, Frame, LineReader};
use super::listen::BlockingWriter;
use super::pipe::FrameWriter;
use crate::error::{Error, ErrorKind};
use crate::jsonrpc;
use crate::outgoing::Outgoing;
use crate::session::Session;

/// Knobs of one served connection.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Longest accepted line, in bytes.
    pub max_line: usize,
    /// Requests handled at once; beyond this the reader waits instead of buffering.
    pub max_in_flight: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_line: DEFAULT_MAX_LINE,
            max_in_flight: 64,
        }
    }
}

/// KiB of request lines a connection may hold while their requests run: with upload chunks
/// pipelined, `max_in_flight` alone would let 64 lines of up to `max_line` bytes pile up. A
/// longer line is let through alone.
const INPUT_BUDGET_KIB: usize = 32 << 10;

/// Frames waiting for the writer; small, so a peer that stops reading stalls the broker's
/// reading rather than growing its memory.
const OUTPUT_QUEUE: usize = 64;

/// Serves `session` on this process's stdin and stdout.
pub async fn serve_stdio(session: Arc<Session>, opts: ServeOptions) -> io::Result<()> {
    // Written through a writer that waits for room on `EAGAIN`: a parent may have made the
    // pipe non-blocking (it shares the open file), and a write that fails for that must not
    // end the session.
    let stdout = BlockingWriter(io::stdout().as_fd().try_clone_to_owned()?);
    let stdin = io::stdin().as_fd().try_clone_to_owned()?;
    if super::pipe::is_pipe(stdin.as_fd()) {
        // Uploads arrive as megabyte lines: a larger pipe means fewer wake-ups per line, and
        // reading it through epoll puts the bytes straight into the line buffer, where
        // `tokio::io::stdin` would read on a helper thread and copy them over.
        super::pipe::grow(stdin.as_fd());
        let input = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin)?;
        serve_connection(session, input, stdout, opts).await
    } else {
        serve_connection(session, tokio::io::stdin(), stdout, opts).await
    }
}

/// Serves `session`: requests from `input`, responses to `output` (written from a thread of
/// its own, so a large frame goes out in blocking writes without a copy into tokio; when
/// `output` is a pipe, large read bodies are spliced into it).
pub async fn serve_connection<R, W>(
    session: Arc<Session>,
    input: R,
    output: W,
    opts: ServeOptions,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: Write + AsFd + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
    let writer = std::thread::Builder::new()
        .name("fsbroker-writer".into())
        .spawn(move || write_frames(rx, output))?;
    // Notifications (roots changed, files changed) share the output with responses.
    let forwarder = session.take_notifications().map(|mut notes| {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(frame) = notes.recv().await {
                if tx.send(frame.into()).await.is_err() {
                    break;
                }
            }
        })
    });
    let in_flight = Arc::new(Semaphore::new(opts.max_in_flight.max(1)));
    let held = Arc::new(Semaphore::new(INPUT_BUDGET_KIB));
    let mut tasks = JoinSet::new();
    let mut reader = LineReader::new(input, opts.max_line);
    loop {
        let frame = match reader.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(session = session.id(), error = %e, "input failed; ending the session");
                break;
            }
        };
        if tx.is_closed() {
            break;
        }
        match frame {
            Frame::TooLong { len } => {
                tracing::warn!(
                    session = session.id(),
                    len,
                    max = opts.max_line,
                    "discarded an over-long line"
                );
                let err = Error::new(
                    ErrorKind::InvalidRequest,
                    format!(
                        "line of {len} bytes is longer than the maximum of {} bytes",
                        opts.max_line
                    ),
                );
                let _ = tx.send(jsonrpc::error_frame(None, &err).into()).await;
            }
            Frame::Line(line) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else {
                    break;
                };
                let kib = line.len().div_ceil(1024).clamp(1, INPUT_BUDGET_KIB) as u32;
                let Ok(held) = Arc::clone(&held).acquire_many_owned(kib).await else {
                    break;
                };
                let session = Arc::clone(&session);
                let received = session.received();
                let tx = tx.clone();
                tasks.spawn(async move {
                    if let Some(frame) = session.respond_received(&line, received).await {
                        let _ = tx.send(frame).await;
                    }
                    drop((permit, held));
                });
            }
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    if let Some(f) = forwarder {
        f.abort();
        let _ = f.await;
    }
    drop(tx);
    match writer.join() {
        Ok(result) => result,
        Err(_) => Err(io::Error::other("the writer thread panicked")),
    }
}

/// Writes frames as they come, flushing whenever the queue runs dry.
pub(crate) fn write_frames<F, W>(mut rx: mpsc::Receiver<F>, output: W) -> io::Result<()>
where
    F: Into<Outgoing>,
    W: Write + AsFd,
{
    let mut out = FrameWriter::new(output);
    while let Some(frame) = rx.blocking_recv() {
        if let Err(e) = out.write(frame.into()) {
            rx.close();
            return quiet_broken_pipe(e);
        }
        if rx.is_empty() {
            if let Err(e) = out.flush() {
                rx.close();
                return quiet_broken_pipe(e);
            }
        }
    }
    out.flush().or_else(quiet_broken_pipe)
}

/// A peer that closed its end is how sessions end, not a failure.
fn quiet_broken_pipe(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::BrokenPipe {
        tracing::debug!("output closed by the peer");
        Ok(())
    } else {
        Err(e)
    }
}

//! `fsbroker serve`: one session over a byte stream (stdio, later a socket).
//!
//! The reader hands lines to the session's `Driver` (which bounds what is in flight); each
//! response frame goes through a bounded channel to a writer thread that owns the output.
//! Responses leave in completion order, each carrying its request's id. At end of input the
//! requests in flight finish, the writer flushes, and the session ends.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::Arc;

use tokio::io::AsyncRead;
use tokio::sync::mpsc;

use super::driver::{BATCH, BATCH_LINE, Driver};
use super::framing::{Frame, InputBudget, LineReader};
use super::pipe::BlockingWriter;
use super::pipe::FrameWriter;
use crate::buffers::Spares;
use crate::error::{Error, ErrorKind};
use crate::host::Session;
use crate::jsonrpc;
use crate::limits::{DEFAULT_MAX_LINE, MAX_INPUT_WAIT, OUTPUT_QUEUE};
use crate::outgoing::Outgoing;

/// Knobs of one served connection.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Longest accepted line, in bytes.
    pub max_line: usize,
    /// Requests handled at once; beyond this the reader waits instead of buffering.
    pub max_in_flight: usize,
    /// The room for partial request lines, shared by every connection served with (clones
    /// of) these options: the policy's `max_pending_input`, fixed when serving starts.
    pub(crate) input_budget: InputBudget,
}

impl ServeOptions {
    /// The options `policy` asks for, with lines of at most `max_line` bytes.
    pub fn for_policy(policy: &crate::policy::Policy, max_line: usize) -> ServeOptions {
        ServeOptions {
            max_line,
            max_in_flight: policy.limits().max_in_flight,
            input_budget: InputBudget::new(policy.limits().max_pending_input),
        }
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_line: DEFAULT_MAX_LINE,
            max_in_flight: 64,
            input_budget: InputBudget::new(96 << 20),
        }
    }
}

/// Serves `session` on this process's stdin and stdout.
pub async fn serve_stdio(session: Arc<Session>, opts: ServeOptions) -> io::Result<()> {
    session.set_transport(crate::broker::Transport::Stdio);
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
/// its own, so a large frame goes out in blocking writes without a copy into tokio).
///
/// Returns when `input` ends, once the requests in flight are answered.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use fsbroker::transport::{ServeOptions, serve_connection};
/// use fsbroker::{Broker, Overrides, Policy};
///
/// let dir = tempfile::tempdir()?;
/// let policy = Policy::load(None, &Overrides { roots: vec![dir.path().into()], ..Default::default() })?;
/// let session = Arc::new(Broker::new(policy)?.session());
/// // Requests from any byte stream; responses to a file (or a pipe, or a socket).
/// let input: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
/// let out = tempfile::NamedTempFile::new()?;
/// serve_connection(session, input, out.reopen()?, ServeOptions::default()).await?;
/// let answer = std::fs::read_to_string(out.path())?;
/// assert_eq!(answer, "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n");
/// # Ok(()) }
/// ```
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
    let writer = spawn_writer("fsbroker-writer", rx, output)?;
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
    let id = session.id();
    let budget = opts.input_budget.clone();
    let wait = session
        .broker()
        .policy()
        .limits()
        .timeout
        .min(MAX_INPUT_WAIT);
    let stop = session.broker().stopped();
    // The person ending the session (the console) closes it as the peer's EOF would.
    let ended = session.ended();
    tokio::pin!(stop, ended);
    let proxy_link = Arc::clone(&session);
    let spares = Spares::within(budget.kib());
    let mut driver = Driver::new(session, opts.max_in_flight, tx).with_spares(spares.clone());
    let mut reader = LineReader::new(input, opts.max_line)
        .with_budget(budget, wait)
        .with_spares(spares);
    let mut ended_by_person = false;
    // A frame read while gathering a batch that could not join it.
    let mut held_back: Option<Frame> = None;
    loop {
        // A broker asked to stop takes no more requests; those taken finish below.
        let next = tokio::select! {
            next = async { match held_back.take() {
                Some(frame) => Ok(Some(frame)),
                None => reader.next_frame().await,
            } } => next,
            () = &mut stop => break,
            () = &mut ended => {
                tracing::warn!(session = id, "the person ended the session; closing it");
                ended_by_person = true;
                break;
            }
        };
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                tracing::warn!(session = id, error = %e, "input failed; ending the session");
                break;
            }
        };
        let more = match frame {
            Frame::TooLong { len } => {
                tracing::warn!(
                    session = id,
                    len,
                    max = opts.max_line,
                    "discarded an over-long line"
                );
                driver.send(too_long(len, opts.max_line).into()).await
            }
            Frame::Refused { len } => {
                tracing::warn!(
                    session = id,
                    len,
                    "discarded a line: the input budget shared by every connection stayed full"
                );
                driver.send(refused(len).into()).await
            }
            Frame::Line(line) if line.iter().all(u8::is_ascii_whitespace) => true,
            Frame::Line(line) if line.len() < BATCH_LINE && reader.has_line() => {
                // More lines are already here: a pipelined burst, answered as one batch.
                let mut batch = vec![line];
                while batch.len() < BATCH && reader.has_line() {
                    match reader.next_frame().await {
                        Ok(Some(Frame::Line(line))) if line.iter().all(u8::is_ascii_whitespace) => {
                        }
                        Ok(Some(Frame::Line(line))) if line.len() < BATCH_LINE => batch.push(line),
                        Ok(other) => {
                            held_back = other;
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(session = id, error = %e, "input failed; ending the session");
                            break;
                        }
                    }
                }
                driver.submit_batch(batch).await
            }
            Frame::Line(line) => driver.submit(line).await,
        };
        if !more {
            break;
        }
    }
    // The peer has gone (or was ended): its questions to the person go too, and with them the
    // turns they held; the requests that asked them are answered now, not at their timeout.
    proxy_link.withdraw_prompts("the server's connection to the broker ended");
    if ended_by_person && proxy_link.is_proxy_link() {
        // A proxy's link: it ends its server when told (a plain peer just sees the close).
        let note = crate::jsonrpc::notification_frame(crate::host::ENDED_NOTIFICATION, None);
        driver.send(note.into()).await;
    }
    driver.finish().await;
    if let Some(f) = forwarder {
        f.abort();
        let _ = f.await;
    }
    writer
        .await
        .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")))
}

/// Starts a thread that writes the frames of `rx` to `output` ([`write_frames`]); its result
/// comes through the returned receiver. Awaited, not joined: a peer that stops reading keeps
/// its writer blocked for as long as it likes, and a join would block the async thread that
/// waits for it — and with it every other session that thread serves.
pub(crate) fn spawn_writer<F, W>(
    name: &str,
    rx: mpsc::Receiver<F>,
    output: W,
) -> io::Result<tokio::sync::oneshot::Receiver<io::Result<()>>>
where
    F: QueueItem + 'static,
    W: Write + AsFd + Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = done.send(write_frames(rx, output));
        })?;
    Ok(result)
}

/// The `-32600` answer (id `null`) to a line longer than the maximum.
pub(crate) fn too_long(len: u64, max: usize) -> Vec<u8> {
    let err = Error::new(
        ErrorKind::InvalidRequest,
        format!("line of {len} bytes is longer than the maximum of {max} bytes"),
    );
    jsonrpc::error_frame(None, &err)
}

/// The answer (id `null`) to a line dropped because the broker's shared input budget
/// (`max_pending_input`) stayed full: the broker is busy, the peer may send it again.
pub(crate) fn refused(len: u64) -> Vec<u8> {
    let err = Error::new(
        ErrorKind::QuotaExceeded,
        format!(
            "a line of {len} bytes was discarded: the broker's buffers for incoming lines \
             (max_pending_input) stayed full; send it again"
        ),
    );
    jsonrpc::error_frame(None, &err)
}

/// What a frame writer's queue carries: a frame, or (`None`) the order to stop and close the
/// output.
pub(crate) trait QueueItem: Send {
    /// The frame to write, or `None` to stop.
    fn into_frame(self) -> Option<Outgoing>;
}

impl QueueItem for Outgoing {
    fn into_frame(self) -> Option<Outgoing> {
        Some(self)
    }
}

/// Writes frames as they come, flushing whenever the queue runs dry.
pub(crate) fn write_frames<F, W>(mut rx: mpsc::Receiver<F>, output: W) -> io::Result<()>
where
    F: QueueItem,
    W: Write + AsFd,
{
    let mut out = FrameWriter::new(output);
    while let Some(item) = rx.blocking_recv() {
        let Some(frame) = item.into_frame() else {
            break;
        };
        if let Err(e) = out.write(frame) {
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

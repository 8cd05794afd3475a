//! `fsbroker proxy -- SERVER [ARGS]`: put the broker between an MCP host and a stdio server.
//!
//! The proxy relays raw lines in both directions and parses only a thin envelope of each
//! (method, id) — never a full MCP model that could drop fields it does not know. It rewrites
//! one message, the host's `initialize`, to declare `roots.listChanged` and
//! `roots.filesystemBrokering`; it hands the server's `roots/list` and `files/*` requests to the
//! broker (they never reach the host, in any form: `route`); it sends the broker's
//! notifications to the server.
//! Everything else passes through verbatim and in order, per direction: one writer owns each
//! output, and the server may send its requests at any moment — before `initialized`, while
//! host requests are in flight, many at once.
//!
//! The proxy is a transport, not a second session driver: the server's requests go to the
//! same `Driver` as `serve`'s, with the same in-flight limit, input budget and output budget,
//! and every relayed line waits in a queue bounded in bytes ([`RELAY_BUDGET_KIB`]). A server
//! that stops reading its stdin, or a host that stops reading the proxy's stdout, stops the
//! proxy reading the other side instead of growing its memory.
//!
//! Either side closing ends the proxy: host EOF (or a stop signal) closes the server's stdin,
//! and a server that does not exit by itself is ended (`end_server`: SIGTERM after
//! [`HOST_GONE_GRACE`], or [`CLOSE_GRACE`] when the proxy is stopping, then SIGKILL after
//! [`STOP_KILL_GRACE`]); the server's exit ends the relay. The proxy exits with the server's
//! exit code.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::process::{Pid, PidfdFlags, Signal};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::mpsc;

use super::driver::Driver;
use super::eras::{self, Asker, Eras, Outputs, Waiting};
use super::framing::{Frame, LineReader};
use super::lenient;
use super::pipe::BlockingWriter;
pub use super::relay::RELAY_BUDGET_KIB;
use super::relay::{Budget, ToServer};
use super::serve::{spawn_writer, too_long, write_frames};
use crate::host::Session;
use crate::jsonrpc::{self, Incoming};
pub use crate::limits::{CLOSE_GRACE, END_GRACE, HOST_GONE_GRACE, STOP_KILL_GRACE};
use crate::limits::{DRAIN, FINISH_SLACK, OUTPUT_QUEUE};
use crate::outgoing::Outgoing;

/// How the proxy reaches a broker.
#[derive(Debug)]
pub enum Link {
    /// A broker in this process.
    Local(Arc<Session>),
    /// A shared broker behind `fsbroker serve --listen PATH`.
    Remote(PathBuf),
}

/// A future that resolves, with the reason, when the server must be ended.
pub type EndServer = std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>>;

/// What to run and how.
pub struct ProxyOptions {
    /// The server's command line.
    pub command: Vec<OsString>,
    /// Longest relayed line.
    pub max_line: usize,
    /// Server requests the local broker handles at once (`max_in_flight`).
    pub max_in_flight: usize,
    /// The kernel sandbox to start the server in (`--confine`).
    pub confine: Option<crate::confine::Confinement>,
    /// Resolves, with the reason, when the server must be ended (a reload took away access a
    /// confined server holds): it is sent SIGTERM, then SIGKILL after [`END_GRACE`].
    pub end_server: Option<EndServer>,
}

/// Copies a confined server's stderr to the proxy's until every process holding it is gone.
///
/// The server must not be able to stop the proxy through it, nor reach the user's terminal:
/// - it writes through a descriptor of its own, not `io::stderr()`, whose lock the proxy's
///   own log lines take;
/// - when the proxy's stderr is a pipe, a chunk goes in only while the pipe is less than half
///   full, else it is dropped (and the loss said once space returns): a host that does not
///   drain stderr fills it with the server's flood, and the proxy's next log line (the one
///   before a revocation's signal, say) would block for good;
/// - control characters (escape sequences: a terminal's clipboard, title, cursor) become `?`;
/// - once the proxy's stderr fails (closed), the rest is read and dropped, so the server is
///   not killed by `SIGPIPE` for logging.
fn copy_stderr(mut from: std::fs::File) {
    use std::io::{Read, Write};
    let Ok(fd) = io::stderr().as_fd().try_clone_to_owned() else {
        return;
    };
    let is_pipe = rustix::fs::fstat(&fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    });
    let capacity = if is_pipe {
        rustix::pipe::fcntl_getpipe_size(&fd).unwrap_or(65536)
    } else {
        0
    };
    let mut to = Some(std::fs::File::from(fd));
    let mut buf = [0u8; 4096];
    let mut dropped = 0usize;
    let mut defang = Defang::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        let Some(out) = to.as_mut() else { continue };
        if is_pipe && unread(out) + n > capacity / 2 {
            dropped += n;
            continue;
        }
        let mut text = Vec::with_capacity(n + 64);
        if dropped > 0 {
            text.extend_from_slice(
                format!("[fsbroker: {dropped} bytes of the server's stderr dropped: the pipe was full]\n")
                    .as_bytes(),
            );
            dropped = 0;
        }
        text.extend(defang.feed(&buf[..n]));
        if out.write_all(&text).is_err() {
            to = None;
        }
    }
}

/// Bytes written to the pipe `fd` and not yet read.
fn unread(fd: &std::fs::File) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one `c_int` to the pointer, a live local of that type; the
    // descriptor is `fd`'s, open for the call.
    #[allow(unsafe_code)]
    let done = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(fd),
            libc::FIONREAD,
            &mut n as *mut libc::c_int,
        )
    };
    if done == 0 { n.max(0) as usize } else { 0 }
}

/// Makes a byte stream safe to show on a terminal, across reads: valid UTF-8 passes, except
/// control characters other than newline and tab (C0, DEL and C1, which a terminal takes as
/// commands), which become `?`, as does every byte that is not valid UTF-8 (a lone `0x9b` is
/// CSI to a terminal in 8-bit mode). A sequence cut by a read boundary is held for the next.
#[derive(Default)]
struct Defang {
    /// The start of a UTF-8 sequence the last read ended in (at most 3 bytes).
    held: Vec<u8>,
}

impl Defang {
    /// The safe form of `bytes`, which follow the bytes of earlier calls.
    fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut input = std::mem::take(&mut self.held);
        input.extend_from_slice(bytes);
        let mut out = Vec::with_capacity(input.len());
        let mut rest = &input[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    push_safe(&mut out, text);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8: `valid_up_to` says so.
                    push_safe(&mut out, std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(b'?');
                            rest = &bad[n..];
                        }
                        None => {
                            // Cut short by the end of this read: the rest comes next time.
                            self.held = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }
}

/// Appends `text` to `out` with control characters other than newline and tab made `?`.
fn push_safe(out: &mut Vec<u8>, text: &str) {
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push(b'?');
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
}

/// Runs the proxy until the server exits; returns its exit code.
pub async fn run(link: Link, mut opts: ProxyOptions) -> io::Result<i32> {
    let (program, args) = opts
        .command
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no server command given"))?;
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        // A confined server gets a pipe, not the proxy's stderr: that may be the user's
        // terminal, whose foreground a server could take (`tcsetpgrp`) to read what the user
        // types or to turn echo off. Its lines are copied to the proxy's stderr as they come.
        .stderr(if opts.confine.is_some() {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .kill_on_drop(true);
    if let Some(confine) = &opts.confine {
        confine.apply(&mut command);
        // The server and everything it starts are ended together (crate::confine::reap).
        crate::confine::reap::become_subreaper();
    }
    let mut child = command
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot start {program:?}: {e}")))?;
    // A confined server leads its own process group (crate::confine::reap). However this
    // function ends (returns, or is dropped when a stop signal's grace runs out), the group
    // and what is left below the proxy go with it.
    let group = child.id().map_or(0, |id| id as i32);
    // Once the server is reaped its number may go to another process (pid_max can be as low
    // as 32768): from then on nothing signals the group but the kill right after the reap.
    let reaped = Arc::new(AtomicBool::new(false));
    let _ends_group = opts.confine.is_some().then(|| GroupGuard {
        group,
        reaped: Arc::clone(&reaped),
    });
    // Whom the end of the server is signalled to: a confined server's whole tree, else the
    // server itself (it shares the proxy's process group).
    let target = if opts.confine.is_some() {
        Target::Tree {
            group,
            reaped: Arc::clone(&reaped),
        }
    } else {
        Target::Server {
            pidfd: Pid::from_raw(group)
                .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok()),
            pid: group,
            reaped: Arc::clone(&reaped),
        }
    };
    // Set once the server is to end: the host has gone (its EOF) or the broker stops (the
    // server's stdin is then closed), or the server closed its stdout. A server that does not
    // exit by itself is then ended ([`end_server`]).
    let (ending, gone) = tokio::sync::watch::channel(false);
    let revoked = opts.end_server.take().filter(|_| opts.confine.is_some());
    let stopped: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &link {
        Link::Local(session) => Box::pin(session.broker().stopped()),
        Link::Remote(_) => Box::pin(std::future::pending()),
    };
    let ender = tokio::spawn(end_server(
        revoked,
        wait_gone(gone.clone()),
        stopped,
        target,
    ));
    if let Some(err) = child.stderr.take() {
        let err = std::fs::File::from(err.into_owned_fd()?);
        std::thread::Builder::new()
            .name("fsbroker-server-stderr".into())
            .spawn(move || copy_stderr(err))?;
    }
    let server_in = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("no stdin"))?
        .into_owned_fd()?;
    let server_out = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;

    // The server's stdin: host lines, broker answers and broker notifications, one writer
    // thread, which writes large read answers straight from their pages, as `serve` does.
    let (to_server, server_rx) = mpsc::channel::<ToServer>(OUTPUT_QUEUE);
    let _server_writer = std::thread::Builder::new()
        .name("fsbroker-server-writer".into())
        .spawn(move || write_frames(server_rx, BlockingWriter(server_in)))?;

    // The host's stdout: the server's messages, one writer thread.
    let (to_host, host_rx) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
    let stdout = BlockingWriter(io::stdout().as_fd().try_clone_to_owned()?);
    let host_writer = spawn_writer("fsbroker-host-writer", host_rx, stdout)?;

    // A local broker asked to stop (SIGTERM, SIGINT) stops reading the host, as at the host's
    // EOF: the server's stdin is closed and the server is ended ([`end_server`]) in time for
    // the broker to seal its log; the server's file requests are no longer taken.
    let stopping = Arc::new(AtomicBool::new(false));
    let stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match &link {
        Link::Local(session) => {
            let stopped = session.broker().stopped();
            let flag = Arc::clone(&stopping);
            tokio::spawn(async move {
                stopped.await;
                flag.store(true, Ordering::Release);
            });
            Box::pin(session.broker().stopped())
        }
        Link::Remote(_) => Box::pin(std::future::pending()),
    };
    // Makes the proxy's own ids (its questions to the broker, its retries) its own.
    let nonce = crate::random::hex(8);
    let (mut broker, asker) =
        BrokerSide::start(link, to_server.clone(), &opts, &nonce, stopping).await?;
    if let (BrokerSide::Remote { to_broker, key, .. }, Some(confine)) = (&broker, &opts.confine) {
        // A shared broker records the confinement in its audit log, as a local one does.
        let params = serde_json::json!({ "confinement": confine.audit_record() });
        let line = super::peer_note(key.as_deref(), params);
        let _ = to_broker.send(line.into()).await;
    }
    let init_id: Arc<Mutex<Option<Box<RawValue>>>> = Arc::default();
    let eras = Arc::new(Eras::new(asker, nonce));

    // The host → server queue's budget, shared by the proxy's own retries.
    let server_budget = Budget::new();
    let host_reader = {
        let to_server = to_server.clone();
        let budget = server_budget.clone();
        let to_host = to_host.clone();
        let init_id = Arc::clone(&init_id);
        let eras = Arc::clone(&eras);
        let max = opts.max_line;
        let ending = ending.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = relay_host(tokio::io::stdin(), to_server.clone(), to_host, init_id, eras, budget, max) => {}
                () = stop => {}
            }
            // Before the close is queued: a server that stopped reading its stdin leaves no
            // room for it, and must be ended all the same.
            ending.send_replace(true);
            let _ = to_server.send(ToServer::Close).await;
        })
    };
    let relay = Relay {
        out: Outputs {
            to_host: to_host.clone(),
            to_server: to_server.clone(),
            server_budget,
        },
        eras,
    };
    let confined = opts.confine.is_some();
    let mut exited = None;
    {
        let relayed = relay_server(server_out, &relay, &mut broker, &init_id, opts.max_line);
        tokio::pin!(relayed);
        tokio::select! {
            () = &mut relayed => {}
            status = child.wait() => {
                reaped.store(true, Ordering::SeqCst);
                exited = Some(status);
                if confined {
                    // A confined server's descendants may hold its stdout open after it exits
                    // (and keep its access): they are ended, and the relay drains.
                    end_orphans(group).await;
                    relayed.await;
                } else {
                    // What an unconfined server started may hold its stdout open after it
                    // exits: their lines are relayed while the host is there; once it has
                    // gone, for [`DRAIN`] at most.
                    tokio::select! {
                        () = &mut relayed => {}
                        () = async {
                            wait_gone(gone).await;
                            tokio::time::sleep(DRAIN).await;
                        } => {
                            tracing::warn!("the server exited, but what it started still holds its stdout open; not waiting for it");
                        }
                    }
                }
            }
        }
    }

    // The server closed its stdout: it is exiting. Stop reading the host, let the host see
    // everything the server said, and return the server's exit code.
    host_reader.abort();
    // The relay's senders go too: the host's writer ends once every sender is gone.
    drop(relay);
    drop(to_server);
    // The group is signalled only at the moment its leader is reaped: here, unless that was
    // done above.
    let just_reaped = if exited.is_some() { 0 } else { group };
    let status = match exited {
        Some(status) => status?,
        None => {
            // It closed its stdout; it is ended if it does not exit by itself.
            ending.send_replace(true);
            let status = child.wait().await;
            reaped.store(true, Ordering::SeqCst);
            status?
        }
    };
    ender.abort();
    if confined {
        end_orphans(just_reaped).await;
    }
    // The server's requests still running finish, and are recorded, before the proxy ends
    // (and its broker seals the log): a request past its commit point has acted.
    broker.finish().await;
    drop(to_host);
    if let Ok(Err(e)) = host_writer.await {
        tracing::debug!(error = %e, "host output");
    }
    Ok(exit_code(status))
}

/// Ends what a confined server left running (daemons keep its access): every descendant of
/// the proxy, which is their reaper (crate::confine::reap).
async fn end_orphans(group: i32) {
    // The group at once, at the reap (crate::confine::reap::signal_descendants); then the
    // tree only.
    crate::confine::reap::signal_group(group, rustix::process::Signal::KILL);
    tokio::task::spawn_blocking(crate::confine::reap::end_descendants)
        .await
        .ok();
}

/// Kills a confined server's process group (while the server is not reaped) and what is
/// left below the proxy when dropped: the proxy's future may be dropped mid-way (a stop
/// signal's grace ran out) with the server and its children still running.
struct GroupGuard {
    group: i32,
    reaped: Arc<AtomicBool>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        crate::confine::reap::signal_descendants(
            live_group(self.group, &self.reaped),
            rustix::process::Signal::KILL,
        );
    }
}

/// `group` while the server that leads it is not reaped, else 0 (no group).
fn live_group(group: i32, reaped: &AtomicBool) -> i32 {
    if reaped.load(Ordering::SeqCst) {
        0
    } else {
        group
    }
}

/// Whom the proxy signals to end its server.
enum Target {
    /// A confined server: its process group and everything below the proxy
    /// (crate::confine::reap), while the server is not reaped; after, the tree only.
    Tree { group: i32, reaped: Arc<AtomicBool> },
    /// An unconfined server: the server itself. It runs in the proxy's process group, so its
    /// group is not signalled, and what it starts is its own, as without the proxy.
    Server {
        /// Pins the server (never another process given its number once it is reaped).
        pidfd: Option<std::os::fd::OwnedFd>,
        /// Its number, used only where pidfds are missing (Linux before 5.3) and while the
        /// server is not reaped.
        pid: i32,
        reaped: Arc<AtomicBool>,
    },
}

impl Target {
    /// Sends `signal`; whether it reached a process.
    fn signal(&self, signal: Signal) -> bool {
        match self {
            Target::Tree { group, reaped } => {
                crate::confine::reap::signal_descendants(live_group(*group, reaped), signal) > 0
            }
            Target::Server {
                pidfd: Some(fd), ..
            } => rustix::process::pidfd_send_signal(fd, signal).is_ok(),
            Target::Server {
                pidfd: None,
                pid,
                reaped,
            } => Pid::from_raw(*pid)
                .filter(|_| !reaped.load(Ordering::SeqCst))
                .is_some_and(|p| rustix::process::kill_process(p, signal).is_ok()),
        }
    }
}

/// Resolves once `gone` is set (never, if its sender goes without setting it).
async fn wait_gone(mut gone: tokio::sync::watch::Receiver<bool>) {
    if gone.wait_for(|g| *g).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Ends the server when it must go, through `target`:
/// - once `revoked` resolves (a reload took away access a confined server holds): SIGTERM at
///   once, SIGKILL after [`END_GRACE`];
/// - once `gone` resolves (the host has gone, or the server closed its stdout): SIGTERM after
///   [`HOST_GONE_GRACE`] if it is still running;
/// - once `stopped` resolves (SIGTERM or SIGINT to the proxy, whose stdin is then closed):
///   SIGTERM [`CLOSE_GRACE`] after its stdin closed (at once if that was longer ago);
/// - after either SIGTERM, SIGKILL [`STOP_KILL_GRACE`] later.
///
/// A signal to a server that has exited is harmless (see [`Target`]); the proxy aborts this
/// once the server is reaped. (What a confined server forks in between lands in the proxy's
/// tree too, and is ended when the server's exit is seen.)
async fn end_server(
    revoked: Option<EndServer>,
    gone: impl std::future::Future<Output = ()>,
    stopped: impl std::future::Future<Output = ()>,
    target: Target,
) {
    use tokio::time::Instant;
    let revoked = async move {
        match revoked {
            Some(end) => end.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(revoked, gone, stopped);
    // When the server's stdin closed, and when it is sent SIGTERM.
    let mut closed: Option<Instant> = None;
    let mut term_at: Option<Instant> = None;
    let mut stopping = false;
    let grace = loop {
        let due = term_at.unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(3600));
        tokio::select! {
            reason = &mut revoked => {
                // The signal first, then the log line: a log line can block (a host that
                // does not drain stderr), and nothing may hold up a revocation.
                target.signal(Signal::TERM);
                tracing::warn!(%reason, "ending the confined server: access it was started with was revoked");
                break END_GRACE;
            }
            () = &mut gone, if closed.is_none() => {
                let now = Instant::now();
                closed = Some(now);
                let grace = if stopping { CLOSE_GRACE } else { HOST_GONE_GRACE };
                term_at = Some(term_at.map_or(now + grace, |t| t.min(now + grace)));
            }
            () = &mut stopped, if !stopping => {
                stopping = true;
                // The stdin closes now if it has not yet (the host's reader stops too).
                let at = closed.unwrap_or_else(Instant::now) + CLOSE_GRACE;
                term_at = Some(term_at.map_or(at, |t| t.min(at)));
            }
            () = tokio::time::sleep_until(due), if term_at.is_some() => {
                if target.signal(Signal::TERM) {
                    let waited = closed.map_or(CLOSE_GRACE, |c| c.elapsed());
                    tracing::warn!("the server did not exit within {waited:.1?} of the end of its input; sent SIGTERM");
                }
                break STOP_KILL_GRACE;
            }
        }
    };
    tokio::time::sleep(grace).await;
    if target.signal(Signal::KILL) {
        tracing::warn!("the server did not exit within {grace:?} of SIGTERM; sent SIGKILL");
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Host → server: verbatim, except `initialize` (2025 era) and the client capabilities of
/// every request of the 2026-07-28 era ([`Eras::host_request`]).
async fn relay_host<R: AsyncRead + Unpin>(
    input: R,
    to_server: mpsc::Sender<ToServer>,
    to_host: mpsc::Sender<Outgoing>,
    init_id: Arc<Mutex<Option<Box<RawValue>>>>,
    eras: Arc<Eras>,
    budget: Budget,
    max: usize,
) {
    let mut reader = LineReader::new(input, max);
    while let Ok(Some(frame)) = reader.next_frame().await {
        let line = match frame {
            Frame::Line(line) => line,
            // The proxy's readers have no shared budget, so they never refuse a line.
            Frame::Refused { .. } => continue,
            Frame::TooLong { len } => {
                // Answer the host as a server would, so it does not wait for nothing.
                tracing::warn!(len, "an over-long line from the host was not relayed");
                let _ = to_host.send(too_long(len, max).into()).await;
                continue;
            }
        };
        let line = match jsonrpc::parse(&line) {
            Incoming::Request { id, method, .. } if method == "initialize" => {
                *init_id.lock().unwrap_or_else(|e| e.into_inner()) = Some(id.to_owned());
                eras.set_modern(false).await;
                declare_brokering(&line).unwrap_or(line)
            }
            Incoming::Request { id, method, .. } => {
                let id = id.to_owned();
                eras.host_request(line, &id, &method).await
            }
            Incoming::Notification { method, .. } if method == "notifications/cancelled" => {
                eras.cancelled(line)
            }
            _ => line,
        };
        let mut framed = line;
        framed.push(b'\n');
        let Some(frame) = budget.frame(framed).await else {
            break;
        };
        if to_server.send(ToServer::Frame(frame)).await.is_err() {
            break;
        }
    }
}

/// `initialize` with `params.capabilities.roots` declaring brokering (other capabilities, and
/// other members of `roots`, untouched). Members are kept as raw JSON, so numbers and
/// strings pass through exactly as the host wrote them; only the order of the members of the
/// message, of `params` and of `capabilities` may change.
fn declare_brokering(line: &[u8]) -> Option<Vec<u8>> {
    type Members = BTreeMap<String, Box<RawValue>>;
    fn raw<T: serde::Serialize>(v: &T) -> Option<Box<RawValue>> {
        serde_json::value::to_raw_value(v).ok()
    }
    let mut msg: Members = serde_json::from_slice(line).ok()?;
    let mut params: Members = match msg.get("params") {
        Some(p) => serde_json::from_str(p.get()).ok()?,
        None => Members::new(),
    };
    let mut caps: Members = match params.get("capabilities") {
        Some(c) => serde_json::from_str(c.get()).ok()?,
        None => Members::new(),
    };
    let mut roots: serde_json::Map<String, Value> = caps
        .get("roots")
        .and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default();
    roots.insert("listChanged".into(), Value::Bool(true));
    roots.insert("filesystemBrokering".into(), Value::Bool(true));
    caps.insert("roots".into(), raw(&roots)?);
    params.insert("capabilities".into(), raw(&caps)?);
    msg.insert("params".into(), raw(&params)?);
    serde_json::to_vec(&msg).ok()
}

/// Where the server's messages go, and what the relay knows of the eras.
struct Relay {
    out: Outputs,
    eras: Arc<Eras>,
}

/// Server → host: verbatim, except what [`route`] keeps away from the host (the broker's
/// requests, any other line whose method a lenient reader takes for the broker's or the
/// proxy's own), the lines the proxy cannot classify (the host could read a `roots/list`
/// request into them: they are answered with an error, or dropped), and (2026-07-28 era) what
/// [`Eras::server_message`] takes over.
async fn relay_server<R: AsyncRead + Unpin>(
    output: R,
    relay: &Relay,
    broker: &mut BrokerSide,
    init_id: &Mutex<Option<Box<RawValue>>>,
    max: usize,
) {
    let to_host = &relay.out.to_host;
    let budget = Budget::new();
    let mut reader = LineReader::new(output, max);
    while let Ok(Some(frame)) = reader.next_frame().await {
        let line = match frame {
            Frame::Line(line) => line,
            Frame::Refused { .. } => continue,
            Frame::TooLong { len } => {
                tracing::warn!(len, "an over-long line from the server was not relayed");
                broker.answer(too_long(len, max).into()).await;
                continue;
            }
        };
        let mut line = match route(line) {
            Route::Relay(line) => line,
            Route::Broker(line) => {
                broker.request(line).await;
                continue;
            }
            Route::Refused { ids, why, len } => {
                tracing::warn!(len, why, "a line from the server was not relayed");
                let err = crate::error::Error::new(
                    crate::error::ErrorKind::InvalidRequest,
                    format!("fsbroker: {why}"),
                );
                for id in ids {
                    broker
                        .answer(jsonrpc::error_frame(Some(&id), &err).into())
                        .await;
                }
                continue;
            }
        };
        if let Incoming::Response = jsonrpc::parse(&line) {
            learn_server_name(&line, init_id, broker);
        }
        match relay.eras.server_message(line, &relay.out).await {
            Some(passed) => line = passed,
            None => continue,
        }
        line.push(b'\n');
        let Some(frame) = budget.frame(line).await else {
            break;
        };
        if to_host.send(frame).await.is_err() {
            break;
        }
    }
}

/// Where a line from the server goes.
enum Route {
    /// On towards the host (through [`Eras::server_message`], which reads what it carries).
    Relay(Vec<u8>),
    /// A request for the broker: it answers the server.
    Broker(Vec<u8>),
    /// Neither: the server's ids that can be echoed get an error; the line goes nowhere.
    Refused {
        ids: Vec<Box<RawValue>>,
        why: &'static str,
        len: usize,
    },
}

/// The one decision of where a server's line goes, made on every line before anything else
/// reads it (the rest of the relay gets the line only back from here).
///
/// A line is the broker's when any message in it has a `method` that any lenient reading
/// takes for `roots/list` or `files/…` ([`lenient::message_methods`]: escapes decoded, every
/// `method` member counted, batches and broken JSON scanned). The broker gets it when it is
/// also a sound request ([`jsonrpc::parse`], the broker's own reader); any other form (an id
/// that is an array or a fraction, no `jsonrpc`, params of the wrong type, a notification,
/// `method` twice, a batch, bytes or JSON no parser reads) is refused: a host that reads it
/// loosely would answer it with its own roots. The same holds for a `method` under
/// `notifications/fsbroker/`: those are the proxy's own words to a shared broker (the
/// server's name, its era, its confinement, recorded in the audit log), never the server's,
/// so they reach neither the broker nor the host. Lines naming such a method elsewhere (a
/// result's content) go on to [`Eras::server_message`], which passes them as written when
/// they read one way only, and refuses them otherwise.
fn route(line: Vec<u8>) -> Route {
    let claims = lenient::message_methods(&line);
    if !claims.broker && !claims.control {
        return Route::Relay(line);
    }
    let why = if claims.control {
        "notifications/fsbroker/* are the proxy's own messages; the server's are not relayed"
    } else {
        match jsonrpc::parse(&line) {
            Incoming::Request { method, .. } if lenient::is_broker_method(&method) => {
                return Route::Broker(line);
            }
            _ => {
                "a message naming roots/list or files/* that is not a sound request is not relayed"
            }
        }
    };
    // Whatever ids its top level carries, if the server can match them: strings and
    // numbers (a fraction too), each once, and a few.
    let (ids, _) = lenient::lenient_envelope(&line);
    let ids = ids
        .iter()
        .filter_map(|id| RawValue::from_string(id.to_string()).ok())
        .collect();
    Route::Refused {
        ids,
        why,
        len: line.len(),
    }
}

/// The `initialize` result names the server; consent prompts show it.
fn learn_server_name(line: &[u8], init_id: &Mutex<Option<Box<RawValue>>>, broker: &mut BrokerSide) {
    let mut guard = init_id.lock().unwrap_or_else(|e| e.into_inner());
    let Some(want) = guard.as_deref() else { return };
    #[derive(serde::Deserialize)]
    struct Reply<'a> {
        #[serde(borrow)]
        id: &'a RawValue,
        result: Option<Value>,
    }
    let Ok(reply) = serde_json::from_slice::<Reply>(line) else {
        return;
    };
    if reply.id.get() != want.get() {
        return;
    }
    // Only the one answer matters; later responses are not parsed.
    *guard = None;
    if let Some(name) = reply
        .result
        .as_ref()
        .and_then(|r| r.pointer("/serverInfo/name"))
        .and_then(Value::as_str)
    {
        broker.name_server(name);
    }
}

/// The broker end of the proxy: a local session, or a connection to a shared broker.
enum BrokerSide {
    Local {
        driver: Driver<ToServer>,
        notes: tokio::task::JoinHandle<()>,
        /// Set when the broker stops: the server's requests are no longer taken.
        stopping: Arc<AtomicBool>,
    },
    Remote {
        to_broker: mpsc::Sender<Outgoing>,
        to_broker_budget: Budget,
        to_server: mpsc::Sender<ToServer>,
        alive: Arc<AtomicBool>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        named: bool,
        /// The shared broker's key, which the proxy's notes about its server carry.
        key: Option<Arc<str>>,
    },
}

impl BrokerSide {
    async fn start(
        link: Link,
        to_server: mpsc::Sender<ToServer>,
        opts: &ProxyOptions,
        nonce: &str,
        stopping: Arc<AtomicBool>,
    ) -> io::Result<(BrokerSide, Asker)> {
        match link {
            Link::Local(session) => {
                let asker = Asker::Local(Arc::clone(&session));
                let mut rx = session.take_notifications();
                let tx = to_server.clone();
                let notes = tokio::spawn(async move {
                    let Some(rx) = rx.as_mut() else { return };
                    while let Some(frame) = rx.recv().await {
                        if tx.send(ToServer::Frame(frame.into())).await.is_err() {
                            break;
                        }
                    }
                });
                Ok((
                    BrokerSide::Local {
                        driver: Driver::new(session, opts.max_in_flight, to_server),
                        notes,
                        stopping,
                    },
                    asker,
                ))
            }
            Link::Remote(path) => {
                let stream = tokio::net::UnixStream::connect(&path).await.map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("cannot connect to {}: {e}", path.display()),
                    )
                })?;
                // The key that makes the broker take this link for a proxy's. Without it the
                // proxy still works; the broker just does not learn the server's name, era
                // or confinement from it.
                let socket = path.clone();
                let read_key =
                    tokio::task::spawn_blocking(move || crate::rundir::ProxyKey::read(&socket));
                let key: Option<Arc<str>> = match read_key.await.map_err(io::Error::other) {
                    Ok(Ok(key)) => Some(key.into()),
                    Ok(Err(e)) | Err(e) => {
                        tracing::warn!(error = %e, "cannot read the shared broker's proxy key; it will not record this server's name or confinement");
                        None
                    }
                };
                let (read, mut write) = stream.into_split();
                let (to_broker, mut rx) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
                let writer = tokio::spawn(async move {
                    while let Some(frame) = rx.recv().await {
                        // The frame (and its share of the budget) goes once written.
                        if write.write_all(&frame.into_vec()).await.is_err() {
                            break;
                        }
                    }
                });
                // Answers and notifications from the shared broker go to the server as they
                // are: the broker echoes the server's own ids.
                let alive = Arc::new(AtomicBool::new(true));
                let waiting: Waiting = Arc::default();
                let ask_prefix = eras::ask_prefix(nonce);
                let reader = {
                    let to_server = to_server.clone();
                    let alive = Arc::clone(&alive);
                    let waiting = Arc::clone(&waiting);
                    let max = opts.max_line;
                    tokio::spawn(async move {
                        let budget = Budget::new();
                        let mut lines = LineReader::new(read, max);
                        while let Ok(Some(Frame::Line(mut line))) = lines.next_frame().await {
                            // The answers to the proxy's own questions (`Asker`) are the
                            // proxy's; the broker writes every response with this prefix.
                            if line.starts_with(ask_prefix.as_bytes()) {
                                eras::answer_ask(&waiting, line);
                                continue;
                            }
                            line.push(b'\n');
                            let Some(frame) = budget.frame(line).await else {
                                break;
                            };
                            if to_server.send(ToServer::Frame(frame)).await.is_err() {
                                break;
                            }
                        }
                        alive.store(false, Ordering::Release);
                        // Questions still waiting get no answer: let them know.
                        waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
                        tracing::error!(
                            "the shared broker closed the connection; file requests will fail"
                        );
                    })
                };
                let asker = Asker::Remote {
                    to_broker: to_broker.clone(),
                    waiting,
                    key: key.clone(),
                };
                Ok((
                    BrokerSide::Remote {
                        to_broker,
                        to_broker_budget: Budget::new(),
                        to_server,
                        alive,
                        tasks: vec![writer, reader],
                        named: false,
                        key,
                    },
                    asker,
                ))
            }
        }
    }

    /// Hands one server request to the broker; its answer goes to the server.
    async fn request(&mut self, line: Vec<u8>) {
        match self {
            BrokerSide::Local {
                driver, stopping, ..
            } => {
                // A stopping broker takes no more requests (as `serve` stops reading): what
                // the server asks now could outlast the stop's grace, and the log would go
                // unsealed. The server is being ended; it gets no answer.
                if stopping.load(Ordering::Acquire) {
                    tracing::debug!(
                        "the broker is stopping: a request from the server was not taken"
                    );
                    return;
                }
                driver.submit(line).await;
            }
            BrokerSide::Remote {
                to_broker,
                to_broker_budget,
                to_server,
                alive,
                ..
            } => {
                let gone = !alive.load(Ordering::Acquire);
                let id = match jsonrpc::parse(&line) {
                    Incoming::Request { id, .. } => Some(id.to_owned()),
                    _ => None,
                };
                let mut framed = line;
                framed.push(b'\n');
                let sent = !gone
                    && match to_broker_budget.frame(framed).await {
                        Some(frame) => to_broker.send(frame).await.is_ok(),
                        None => false,
                    };
                if !sent {
                    // Answer for the broker, so the server is not left waiting.
                    if let Some(id) = id {
                        let err = crate::error::Error::new(
                            crate::error::ErrorKind::Internal,
                            "the shared broker is unavailable",
                        );
                        let frame = jsonrpc::error_frame(Some(&id), &err);
                        let _ = to_server.send(ToServer::Frame(frame.into())).await;
                    }
                }
            }
        }
    }

    /// Sends the server a frame of the proxy's own.
    async fn answer(&self, frame: Outgoing) {
        let to_server = match self {
            BrokerSide::Local { driver, .. } => {
                driver.send(frame).await;
                return;
            }
            BrokerSide::Remote { to_server, .. } => to_server,
        };
        let _ = to_server.send(ToServer::Frame(frame)).await;
    }

    /// Tells the broker the server's name (consent prompts show it); a shared broker learns it
    /// from a [`PEER_NOTIFICATION`].
    fn name_server(&mut self, name: &str) {
        match self {
            BrokerSide::Local { driver, .. } => driver.session().set_peer_name(name),
            BrokerSide::Remote {
                to_broker,
                named,
                key,
                ..
            } => {
                if std::mem::replace(named, true) {
                    return;
                }
                let line = super::peer_note(key.as_deref(), serde_json::json!({ "name": name }));
                // Best effort: a full queue means the broker is busy, and the name is only
                // for prompts.
                let _ = to_broker.try_send(line.into());
            }
        }
    }

    /// Ends the broker side once the server is gone: a local session's requests still
    /// running finish (and are recorded); a shared broker's link closes.
    async fn finish(self) {
        match self {
            BrokerSide::Local { notes, driver, .. } => {
                notes.abort();
                // Each request ends by its `timeout_ms`. Past it, what is left only waits to
                // hand its answer (recorded already) to a server that is gone, through a
                // pipe something it started may hold open and unread.
                let limit = driver.session().broker().policy().limits().timeout;
                let waited = tokio::time::timeout(limit + FINISH_SLACK, driver.finish()).await;
                if waited.is_err() {
                    tracing::warn!("answers to the server's last requests could not be delivered");
                }
            }
            BrokerSide::Remote { tasks, .. } => tasks.iter().for_each(|t| t.abort()),
        }
    }
}

#[cfg(test)]
mod defang_tests {
    #[test]
    fn stderr_is_defanged_across_reads() {
        let mut d = super::Defang::default();
        // C1 CSI as UTF-8, cut between two reads.
        let mut out = d.feed(b"A\xc2");
        out.extend(d.feed(b"\x9b31mRED\n"));
        assert_eq!(out, b"A?31mRED\n");
        // Raw 8-bit C1 bytes, ESC, BEL: all `?`; text, newline and tab stay.
        assert_eq!(
            d.feed(b"\x9b31m\x90q\x1b]52;c;x\x07 caf\xc3\xa9 \xe2\x82\xac\tok\n"),
            "?31m?q?]52;c;x? café €\tok\n".as_bytes()
        );
        // A multi-byte character cut in three.
        let mut out = d.feed(b"\xe2");
        out.extend(d.feed(b"\x82"));
        out.extend(d.feed(b"\xac"));
        assert_eq!(out, "€".as_bytes());
    }
}

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
//!
//! The server is a process the proxy starts (`-- SERVER`), or a remote one (`--url`):
//! `remote/` makes a remote server's Streamable HTTP look like a child's stdin and stdout to
//! the relay, which is the same for both; this file only chooses ([`run`]).
//!
//! The parts: this file starts the server and the two relays and sees them end; `lines.rs`
//! is the relay of lines each way (and `route`, the gate every server line passes first);
//! `broker.rs` is the broker end (a local session or a shared broker's socket); `child.rs`
//! ends the server's process (and a confined server's tree); `stderr.rs` copies a confined
//! server's stderr; `start.rs` answers the host when the server does not start (with
//! `diagnosis.rs`'s reading of a confined server's stderr).

mod broker;
mod child;
mod diagnosis;
mod lines;
mod remote;
mod start;
mod stderr;

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, PidfdFlags};
use tokio::sync::mpsc;

use super::eras::{Eras, Outputs};
use super::pipe::BlockingWriter;
pub use super::relay::RELAY_BUDGET_KIB;
use super::relay::{Budget, ToServer};
use super::serve::{spawn_writer, write_frames};
use crate::host::Session;
pub use crate::limits::{
    CLOSE_GRACE, END_GRACE, HOST_GONE_GRACE, REFUSED_START_WAIT, START_TIMEOUT, STOP_KILL_GRACE,
};
use crate::limits::{DRAIN, OUTPUT_QUEUE};
use crate::outgoing::Outgoing;
use broker::BrokerSide;
use child::{GroupGuard, Target, end_orphans, end_server, exit_code, wait_gone};
use lines::{Init, Relay, relay_host, relay_server};
pub use remote::{RemoteError, RemoteOptions};
use start::Start;
pub use start::answer_refused_start;
use stderr::{Tail, copy_stderr};

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
    /// A remote server to reach over Streamable HTTP instead of starting `command`
    /// (`--url`); `confine` does not apply to it.
    pub remote: Option<RemoteOptions>,
    /// How long a confined server has to answer the host's `initialize` once it was relayed
    /// (`--start-timeout`; `None`: no limit): past it, the host gets an error with the
    /// diagnosis and the server is ended ([`START_TIMEOUT`] is the command line's default).
    /// An unconfined server has no such limit.
    pub start_timeout: Option<std::time::Duration>,
}

/// Runs the proxy until the server exits; returns its exit code.
pub async fn run(link: Link, mut opts: ProxyOptions) -> io::Result<i32> {
    if let Link::Local(session) = &link {
        session.set_transport(if opts.remote.is_some() {
            crate::broker::Transport::Remote
        } else {
            crate::broker::Transport::Proxy
        });
        if let Some(confine) = &opts.confine {
            let mode = match confine.mode {
                crate::policy::ConfineMode::Strict => "strict",
                _ => "best-effort",
            };
            session.state().set_confinement(mode.to_owned());
        }
    }
    match opts.remote.take() {
        Some(remote) => run_remote(link, opts, remote).await,
        None => run_child(link, opts).await,
    }
}

/// The server is a process of the proxy's: its stdin and stdout are the relay's.
async fn run_child(link: Link, mut opts: ProxyOptions) -> io::Result<i32> {
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
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let why = format!("cannot start {program:?}: {e}");
            // The host's `initialize` is answered with the reason before the proxy exits.
            let answered = why.clone();
            let _ = tokio::task::spawn_blocking(move || answer_refused_start(&answered)).await;
            return Err(io::Error::new(e.kind(), why));
        }
    };
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
    // `ending` is also set once the server closed its stdout. A server that does not exit by
    // itself is then ended ([`end_server`]). It is ended at once when a reload revokes access
    // a confined server holds, or when the person ends its session (`ended`).
    let Plumbing {
        to_server,
        server_input,
        ending,
        gone,
        person_ended,
        ended,
    } = plumbing(&link);
    let revocations = opts.end_server.take().filter(|_| opts.confine.is_some());
    // A confined server that does not answer `initialize` in time is ended too ([`Start::watch`]).
    let (start_failed, start_timed_out) = tokio::sync::oneshot::channel::<String>();
    let start_timed_out = async move {
        match start_timed_out.await {
            Ok(reason) => reason,
            Err(_) => std::future::pending().await,
        }
    };
    let revoked: Option<EndServer> = Some(Box::pin(async move {
        let person_or_start = async move {
            tokio::select! {
                reason = ended => reason,
                reason = start_timed_out => reason,
            }
        };
        match revocations {
            Some(revoked) => tokio::select! {
                reason = revoked => reason,
                reason = person_or_start => reason,
            },
            None => person_or_start.await,
        }
    }));
    let ender = tokio::spawn(end_server(
        revoked,
        wait_gone(gone.clone()),
        broker_stopped(&link),
        target,
    ));
    let tail = Arc::new(Tail::new());
    if let Some(err) = child.stderr.take() {
        let err = std::fs::File::from(err.into_owned_fd()?);
        let tail = Arc::clone(&tail);
        std::thread::Builder::new()
            .name("fsbroker-server-stderr".into())
            .spawn(move || copy_stderr(err, &tail))?;
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
    let _server_writer = std::thread::Builder::new()
        .name("fsbroker-server-writer".into())
        .spawn(move || write_frames(server_input, BlockingWriter(server_in)))?;

    let Sides {
        mut broker,
        relay,
        init,
        host_reader,
        host_writer,
        to_host,
    } = start_sides(link, &opts, false, &to_server, ending.clone(), person_ended).await?;
    let confined = opts.confine.is_some();
    let start = Arc::new(match &opts.confine {
        Some(confine) => Start::confined(Arc::clone(&init), tail, confine),
        None => Start::unconfined(Arc::clone(&init)),
    });
    let watchdog = match opts.start_timeout.filter(|_| confined) {
        Some(limit) => tokio::spawn(Arc::clone(&start).watch(limit, to_host.clone(), start_failed)),
        None => tokio::spawn(async {}),
    };
    let mut exited = None;
    {
        let relayed = relay_server(server_out, &relay, &mut broker, &init, opts.max_line);
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
    stop_relaying(&host_reader, relay, to_server);
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
    // A server that exited before answering `initialize` leaves the host an error; one whose
    // start timed out was answered by the watchdog, whose answer is let finish.
    start.exited(status, &to_host).await;
    if init.failed() {
        let _ = watchdog.await;
    } else {
        watchdog.abort();
    }
    finish(broker, to_host, host_writer).await;
    // A server ended for not starting in time may exit 0 on SIGTERM; the run failed.
    match exit_code(status) {
        0 if init.failed() => Ok(1),
        code => Ok(code),
    }
}

/// The server is remote (`--url`): the relay's lines for it go over Streamable HTTP, and what
/// it sends comes back as the lines the relay reads ([`remote`]). The proxy ends once the host
/// has gone (or the broker stops, or the person ends the session) and the session is ended;
/// it exits 0.
async fn run_remote(link: Link, opts: ProxyOptions, remote: RemoteOptions) -> io::Result<i32> {
    if opts.confine.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "--confine confines a server the proxy starts; it cannot apply to a remote server (--url)",
        ));
    }
    let url = remote.shown_url();
    // The person ending the session (the console) ends the remote session, as the host's EOF
    // does.
    let Plumbing {
        to_server,
        server_input,
        ending,
        gone,
        person_ended,
        ended,
    } = plumbing(&link);
    let (stopping_tx, stopping) = tokio::sync::watch::channel(false);
    if matches!(link, Link::Local(_)) {
        let stopped = broker_stopped(&link);
        tokio::spawn(async move {
            stopped.await;
            stopping_tx.send_replace(true);
        });
    }
    let ends = remote::Ends {
        gone,
        stopping,
        gone_at: std::sync::OnceLock::new(),
    };
    let connected = remote::connect(remote, opts.max_line, server_input, ends)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let Sides {
        mut broker,
        relay,
        init,
        host_reader,
        host_writer,
        to_host,
    } = start_sides(link, &opts, true, &to_server, ending, person_ended).await?;
    let closer = {
        let to_server = to_server.clone();
        tokio::spawn(async move {
            let reason = ended.await;
            tracing::warn!(%reason, "ending the remote session");
            let _ = to_server.send(ToServer::Close).await;
        })
    };
    tracing::info!(url, "relaying to a remote MCP server");
    relay_server(connected.output, &relay, &mut broker, &init, opts.max_line).await;
    closer.abort();
    stop_relaying(&host_reader, relay, to_server);
    let ended = connected.done.await;
    finish(broker, to_host, host_writer).await;
    // A lost session ends the proxy non-zero, as a server that fails does: the host sees its
    // server exit and can start it again (the reason was logged when the 404 came).
    Ok(match ended {
        Ok(remote::Ended::SessionLost) => 1,
        _ => 0,
    })
}

/// What the proxy runs whichever the server is: the host's reader and writer, the broker
/// side, the eras, and the relay's outputs.
struct Sides {
    broker: BrokerSide,
    relay: Relay,
    init: Arc<Init>,
    host_reader: tokio::task::JoinHandle<()>,
    host_writer: tokio::sync::oneshot::Receiver<io::Result<()>>,
    to_host: mpsc::Sender<Outgoing>,
}

/// Starts the host's side and the broker's; the host's lines go to `to_server`, and `ending`
/// is set once the host has gone (or the broker stops). `remote`: the server is a remote one
/// (`--url`), which a shared broker is told.
async fn start_sides(
    link: Link,
    opts: &ProxyOptions,
    remote: bool,
    to_server: &mpsc::Sender<ToServer>,
    ending: tokio::sync::watch::Sender<bool>,
    person_ended: tokio::sync::watch::Sender<bool>,
) -> io::Result<Sides> {
    // The host's stdout: the server's messages, one writer thread.
    let (to_host, host_rx) = mpsc::channel::<Outgoing>(OUTPUT_QUEUE);
    let stdout = BlockingWriter(io::stdout().as_fd().try_clone_to_owned()?);
    let host_writer = spawn_writer("fsbroker-host-writer", host_rx, stdout)?;

    // A local broker asked to stop (SIGTERM, SIGINT) stops reading the host, as at the host's
    // EOF: the server's stdin is closed and the server is ended ([`end_server`]) in time for
    // the broker to seal its log; the server's file requests are no longer taken.
    let stopping = Arc::new(AtomicBool::new(false));
    let stop = broker_stopped(&link);
    if matches!(link, Link::Local(_)) {
        let stopped = broker_stopped(&link);
        let flag = Arc::clone(&stopping);
        tokio::spawn(async move {
            stopped.await;
            flag.store(true, Ordering::Release);
        });
    }
    // Makes the proxy's own ids (its questions to the broker, its retries) its own.
    let nonce = crate::random::hex(8);
    let (broker, asker) = BrokerSide::start(
        link,
        to_server.clone(),
        opts,
        &nonce,
        stopping,
        person_ended,
    )
    .await?;
    if let BrokerSide::Remote { to_broker, key, .. } = &broker {
        // The link says at once that it is a proxy's (a console shows it so, and ending the
        // session ends the server); a shared broker records the confinement in its audit
        // log, as a local one does.
        // A remote server's link says so: the console tells the person it cannot open this
        // computer's files itself.
        let params = match &opts.confine {
            Some(confine) => serde_json::json!({ "confinement": confine.audit_record() }),
            None if remote => serde_json::json!({ "remote": true }),
            None => serde_json::json!({}),
        };
        let line = super::peer_note(key.as_deref(), params);
        let _ = to_broker.send(line.into()).await;
    }
    let host_left = broker.host_left();
    let init: Arc<Init> = Arc::default();
    let eras = Arc::new(Eras::new(asker, nonce));

    // The host → server queue's budget, shared by the proxy's own retries.
    let server_budget = Budget::new();
    let host_reader = {
        let to_server = to_server.clone();
        let budget = server_budget.clone();
        let to_host = to_host.clone();
        let init = Arc::clone(&init);
        let eras = Arc::clone(&eras);
        let max = opts.max_line;
        let ending = ending.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = relay_host(tokio::io::stdin(), to_server.clone(), to_host, init, eras, budget, max) => host_left.await,
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
    Ok(Sides {
        broker,
        relay,
        init,
        host_reader,
        host_writer,
        to_host,
    })
}

/// What either kind of server starts with, before the host's side and the broker's
/// ([`start_sides`]) and before the server's own end is built.
struct Plumbing {
    /// The server's input: the host's lines, the broker's answers, the proxy's retries.
    to_server: mpsc::Sender<ToServer>,
    /// Its other end: for the writer of a child's stdin, or a remote server's pump.
    server_input: mpsc::Receiver<ToServer>,
    /// Set once the server is to end: the host has gone (its EOF) or the broker stops (the
    /// server's input is then closed). `gone` sees it.
    ending: tokio::sync::watch::Sender<bool>,
    gone: tokio::sync::watch::Receiver<bool>,
    /// Resolves, with the reason, when the person ends the session (the console): a local
    /// session says so itself, a shared broker by a last note on the link, which the broker
    /// side reports through `person_ended` ([`person_ends`], [`crate::host::ENDED_NOTIFICATION`]).
    person_ended: tokio::sync::watch::Sender<bool>,
    ended: EndServer,
}

fn plumbing(link: &Link) -> Plumbing {
    let (to_server, server_input) = mpsc::channel::<ToServer>(OUTPUT_QUEUE);
    let (ending, gone) = tokio::sync::watch::channel(false);
    let (person_ended, ended) = person_ends(link);
    Plumbing {
        to_server,
        server_input,
        ending,
        gone,
        person_ended,
        ended,
    }
}

/// Resolves once the proxy's own broker stops (SIGTERM, SIGINT); never for a shared broker,
/// whose stop is its own.
fn broker_stopped(link: &Link) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    match link {
        Link::Local(session) => Box::pin(session.broker().stopped()),
        Link::Remote(_) => Box::pin(std::future::pending()),
    }
}

/// The server's output has ended (or the remote session has): the host is no longer read,
/// and the relay lets go of the server's input, which ends once what was queued for it is
/// written; the host's writer ends once every sender of the host's output is gone.
fn stop_relaying(
    host_reader: &tokio::task::JoinHandle<()>,
    relay: Relay,
    to_server: mpsc::Sender<ToServer>,
) {
    host_reader.abort();
    drop(relay);
    drop(to_server);
}

/// The end either kind of server comes to: the server's requests still running finish, and
/// are recorded, before the proxy ends (and its broker seals the log), since a request past
/// its commit point has acted; then the host gets what is left for it.
async fn finish(
    broker: BrokerSide,
    to_host: mpsc::Sender<Outgoing>,
    host_writer: tokio::sync::oneshot::Receiver<io::Result<()>>,
) {
    broker.finish().await;
    drop(to_host);
    if let Ok(Err(e)) = host_writer.await {
        tracing::debug!(error = %e, "host output");
    }
}

/// Resolves, with the reason, when the person ends the session (the console): a local
/// session says so itself; a shared broker by a last note on the link, which the broker side
/// reports through the returned sender.
fn person_ends(link: &Link) -> (tokio::sync::watch::Sender<bool>, EndServer) {
    let (person_ended, mut note) = tokio::sync::watch::channel(false);
    let ended: EndServer = match link {
        Link::Local(session) => {
            let ended = session.ended();
            Box::pin(async move {
                ended.await;
                "the person ended the session".to_owned()
            })
        }
        Link::Remote(_) => Box::pin(async move {
            if note.wait_for(|e| *e).await.is_err() {
                std::future::pending::<()>().await;
            }
            "the person ended the session on the shared broker".to_owned()
        }),
    };
    (person_ended, ended)
}

/// For `properties.rs` (through `transport::id_filters`): the proxy's filters that pair
/// messages by id, and whether each takes ids written `a` and `b` for one.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    let mut filters = lines::id_filters(a, b);
    filters.extend(remote::id_filters(a, b));
    filters
}

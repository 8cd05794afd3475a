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
//! The parts: this file starts the server, a child (`run_child`) or a remote one
//! (`run_remote`), and sees it and the two relays end; `sides.rs` is what both kinds share
//! (the server's input queue and the signals of its end, the host's side and the broker's,
//! and the end they come to); `lines.rs` is the relay of lines each way (and `route`, the gate every server line passes first);
//! `broker.rs` is the broker end (a local session or a shared broker's socket); `child.rs`
//! ends the server's process (and a confined server's tree); `stderr.rs` copies a confined
//! server's stderr; `start.rs` answers the host when the server does not start (with
//! `diagnosis.rs`'s reading of a confined server's stderr).

mod broker;
mod child;
mod diagnosis;
mod lines;
mod remote;
mod sides;
mod start;
mod stderr;

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, PidfdFlags};

use super::pipe::BlockingWriter;
pub use super::relay::RELAY_BUDGET_KIB;
use super::relay::ToServer;
use super::serve::write_frames;
use crate::host::Session;
use crate::limits::DRAIN;
pub use crate::limits::{
    CLOSE_GRACE, END_GRACE, HOST_GONE_GRACE, REFUSED_START_WAIT, START_TIMEOUT, STOP_KILL_GRACE,
};
use child::{GroupGuard, Target, end_orphans, end_server, exit_code, wait_gone};
use lines::relay_server;
pub use remote::{
    CacheError, CachedSignIn, RemoteError, RemoteOptions, Revoked, SignIn, SignInCard, SignInState,
    SignIns, SignedOut, TokenCache, invisible,
};
use sides::{Plumbing, Sides, broker_stopped, finish, plumbing, start_sides, stop_relaying};
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
    /// confined server holds, or the managed policy no longer allows the server): it is sent
    /// SIGTERM, then SIGKILL after [`END_GRACE`].
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
    // a confined server holds or the managed policy no longer allows it, or when the person
    // ends its session (`ended`).
    let Plumbing {
        to_server,
        server_input,
        ending,
        gone,
        person_ended,
        ended,
    } = plumbing(&link);
    let revocations = opts.end_server.take();
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

/// For `properties.rs` (through `transport::id_filters`): the proxy's filters that pair
/// messages by id, and whether each takes ids written `a` and `b` for one.
#[cfg(test)]
pub(super) fn id_filters(a: &str, b: &str) -> Vec<(&'static str, Option<bool>)> {
    let mut filters = lines::id_filters(a, b);
    filters.extend(remote::id_filters(a, b));
    filters
}

//! What the proxy runs whichever its server is, a child or a remote one: the server's input
//! queue and the signals of its end ([`Plumbing`]), the host's side and the broker's
//! ([`start_sides`]: the host's reader and writer, the broker side, the eras, the relay's
//! outputs), and the end both come to ([`stop_relaying`], [`finish`]).

use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::broker::BrokerSide;
use super::lines::{Init, Relay, relay_host};
use super::{EndServer, Link, ProxyOptions};
use crate::limits::OUTPUT_QUEUE;
use crate::outgoing::Outgoing;
use crate::transport::eras::{Eras, Outputs};
use crate::transport::pipe::BlockingWriter;
use crate::transport::relay::{Budget, ToServer};
use crate::transport::serve::spawn_writer;

/// What the proxy runs whichever the server is: the host's reader and writer, the broker
/// side, the eras, and the relay's outputs.
pub(super) struct Sides {
    pub(super) broker: BrokerSide,
    pub(super) relay: Relay,
    pub(super) init: Arc<Init>,
    pub(super) host_reader: tokio::task::JoinHandle<()>,
    pub(super) host_writer: tokio::sync::oneshot::Receiver<io::Result<()>>,
    pub(super) to_host: mpsc::Sender<Outgoing>,
}

/// Starts the host's side and the broker's; the host's lines go to `to_server`, and `ending`
/// is set once the host has gone (or the broker stops). `remote`: the server is a remote one
/// (`--url`), which a shared broker is told.
pub(super) async fn start_sides(
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
        let line = crate::transport::peer_note(key.as_deref(), params);
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
pub(super) struct Plumbing {
    /// The server's input: the host's lines, the broker's answers, the proxy's retries.
    pub(super) to_server: mpsc::Sender<ToServer>,
    /// Its other end: for the writer of a child's stdin, or a remote server's pump.
    pub(super) server_input: mpsc::Receiver<ToServer>,
    /// Set once the server is to end: the host has gone (its EOF) or the broker stops (the
    /// server's input is then closed). `gone` sees it.
    pub(super) ending: tokio::sync::watch::Sender<bool>,
    pub(super) gone: tokio::sync::watch::Receiver<bool>,
    /// Resolves, with the reason, when the person ends the session (the console): a local
    /// session says so itself, a shared broker by a last note on the link, which the broker
    /// side reports through `person_ended` ([`person_ends`], [`crate::host::ENDED_NOTIFICATION`]).
    pub(super) person_ended: tokio::sync::watch::Sender<bool>,
    pub(super) ended: EndServer,
}

pub(super) fn plumbing(link: &Link) -> Plumbing {
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
pub(super) fn broker_stopped(
    link: &Link,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    match link {
        Link::Local(session) => Box::pin(session.broker().stopped()),
        Link::Remote(_) => Box::pin(std::future::pending()),
    }
}

/// The server's output has ended (or the remote session has): the host is no longer read,
/// and the relay lets go of the server's input, which ends once what was queued for it is
/// written; the host's writer ends once every sender of the host's output is gone.
pub(super) fn stop_relaying(
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
pub(super) async fn finish(
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

//! The broker end of the proxy: a session in this process, or a connection to a shared
//! broker (`fsbroker serve --listen`).
//!
//! The relay hands the server's requests for the broker here and does not care which it is;
//! this is where the two differ: a local session's driver and its stop, or a socket whose
//! answers go to the server as they are, whose own questions are the proxy's (`Asker`), and
//! which may go away (its requests are then answered with an error, so the server is not
//! left waiting).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::{Link, ProxyOptions};
use crate::jsonrpc::{self, Incoming};
use crate::limits::{FINISH_SLACK, HOST_LEFT_ANSWERS, HOST_LEFT_QUIET, OUTPUT_QUEUE};
use crate::outgoing::Outgoing;
use crate::transport::driver::Driver;
use crate::transport::eras::{self, Asker, Waiting};
use crate::transport::framing::{Frame, LineReader};
use crate::transport::relay::{Budget, ToServer};

/// How every answer of the broker's starts (`jsonrpc.rs` writes them all; a notification has
/// its `method` there instead).
const RESPONSE_HEAD: &[u8] = b"{\"jsonrpc\":\"2.0\",\"id\":";

/// The broker end of the proxy: a local session, or a connection to a shared broker.
pub(super) enum BrokerSide {
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
        /// The server's requests sent to the shared broker and not yet answered.
        unanswered: Arc<AtomicUsize>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        named: bool,
        /// The shared broker's key, which the proxy's notes about its server carry.
        key: Option<Arc<str>>,
    },
}

impl BrokerSide {
    pub(super) async fn start(
        link: Link,
        to_server: mpsc::Sender<ToServer>,
        opts: &ProxyOptions,
        nonce: &str,
        stopping: Arc<AtomicBool>,
        ended: tokio::sync::watch::Sender<bool>,
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
                let unanswered = Arc::new(AtomicUsize::new(0));
                let waiting: Waiting = Arc::default();
                let ask_prefix = eras::ask_prefix(nonce);
                let ended_note = jsonrpc::notification_frame(crate::host::ENDED_NOTIFICATION, None);
                let reader = {
                    let to_server = to_server.clone();
                    let alive = Arc::clone(&alive);
                    let unanswered = Arc::clone(&unanswered);
                    let waiting = Arc::clone(&waiting);
                    let max = opts.max_line;
                    tokio::spawn(async move {
                        let budget = Budget::new();
                        let mut lines = LineReader::new(read, max);
                        let mut server_gone = false;
                        while let Ok(Some(Frame::Line(mut line))) = lines.next_frame().await {
                            // The answers to the proxy's own questions (`Asker`) are the
                            // proxy's; the broker writes every response with this prefix.
                            if line.starts_with(ask_prefix.as_bytes()) {
                                eras::answer_ask(&waiting, line);
                                continue;
                            }
                            // The broker's last word before it closes the link: the person
                            // ended the session (only the broker writes here).
                            if ended_note.strip_suffix(b"\n") == Some(&line[..]) {
                                ended.send_replace(true);
                                continue;
                            }
                            // Every answer of the broker's is written by `jsonrpc.rs` and starts
                            // so (a notification has its method there instead).
                            if line.starts_with(RESPONSE_HEAD) {
                                let _ = unanswered.fetch_update(
                                    Ordering::AcqRel,
                                    Ordering::Acquire,
                                    |n| n.checked_sub(1),
                                );
                            }
                            line.push(b'\n');
                            let Some(frame) = budget.frame(line).await else {
                                break;
                            };
                            if to_server.send(ToServer::Frame(frame)).await.is_err() {
                                server_gone = true;
                                break;
                            }
                        }
                        alive.store(false, Ordering::Release);
                        // Questions still waiting get no answer: let them know.
                        waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
                        if server_gone {
                            tracing::debug!(
                                "the server's input has closed; the link to the shared broker is no longer read"
                            );
                        } else {
                            tracing::error!(
                                "the shared broker closed the connection; file requests will fail"
                            );
                        }
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
                        unanswered,
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
    pub(super) async fn request(&mut self, line: Vec<u8>) {
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
                unanswered,
                ..
            } => {
                let gone = !alive.load(Ordering::Acquire);
                let id = match jsonrpc::parse(&line) {
                    Incoming::Request { id, .. } => Some(id.to_owned()),
                    _ => None,
                };
                let mut framed = line;
                framed.push(b'\n');
                // Counted before it goes: its answer may come back before `send` returns.
                if id.is_some() {
                    unanswered.fetch_add(1, Ordering::AcqRel);
                }
                let sent = !gone
                    && match to_broker_budget.frame(framed).await {
                        Some(frame) => to_broker.send(frame).await.is_ok(),
                        None => false,
                    };
                if !sent {
                    // Answer for the broker, so the server is not left waiting.
                    if let Some(id) = id {
                        unanswered.fetch_sub(1, Ordering::AcqRel);
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
    pub(super) async fn answer(&self, frame: Outgoing) {
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
    /// from a [`PEER_NOTIFICATION`](crate::host::PEER_NOTIFICATION).
    pub(super) fn name_server(&mut self, name: &str) {
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
                let line = crate::transport::peer_note(
                    key.as_deref(),
                    serde_json::json!({ "name": name }),
                );
                // Best effort: a full queue means the broker is busy, and the name is only
                // for prompts.
                let _ = to_broker.try_send(line.into());
            }
        }
    }

    /// What the proxy does once its host has left, before the server's input closes: the
    /// server's questions to the person are withdrawn (nobody would use the answers, and a
    /// server waiting for one would outlive its host), and their answers (refusals) are given
    /// [`HOST_LEFT_ANSWERS`] to reach the server while it can still read them, so that it can
    /// end by itself. A server answered may ask its next question at once (a tool call
    /// waiting behind the roots), refused at once too: the wait is for a quiet moment.
    pub(super) fn host_left(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        match self {
            BrokerSide::Local { driver, .. } => {
                let session = Arc::clone(driver.session());
                let quiet = driver.quiet(HOST_LEFT_QUIET);
                Box::pin(async move {
                    session.host_left();
                    let _ = tokio::time::timeout(HOST_LEFT_ANSWERS, quiet).await;
                })
            }
            BrokerSide::Remote {
                to_broker,
                key,
                unanswered,
                ..
            } => {
                let line = crate::transport::peer_note(
                    key.as_deref(),
                    serde_json::json!({ "hostLeft": true }),
                );
                let to_broker = to_broker.clone();
                let unanswered = Arc::clone(unanswered);
                Box::pin(async move {
                    let _ = to_broker.send(line.into()).await;
                    let quiet = async {
                        loop {
                            while unanswered.load(Ordering::Acquire) > 0 {
                                tokio::time::sleep(HOST_LEFT_QUIET / 5).await;
                            }
                            tokio::time::sleep(HOST_LEFT_QUIET).await;
                            if unanswered.load(Ordering::Acquire) == 0 {
                                return;
                            }
                        }
                    };
                    let _ = tokio::time::timeout(HOST_LEFT_ANSWERS, quiet).await;
                })
            }
        }
    }

    /// Ends the broker side once the server is gone: a local session's requests still
    /// running finish (and are recorded); a shared broker's link closes.
    pub(super) async fn finish(self) {
        match self {
            BrokerSide::Local { notes, driver, .. } => {
                notes.abort();
                // The server is gone: its questions to the person go too.
                let session = driver.session();
                session.withdraw_prompts("the server has gone");
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

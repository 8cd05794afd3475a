//! `fsbroker serve --listen PATH`: one broker, many sessions, over a Unix socket.
//!
//! Each connection is one session of the same broker, so locks, rate limits by session, the
//! watcher and the audit log are shared by every server a host runs. The socket is created
//! owner-only: other users of the machine cannot connect.

// Ambient `std::fs` calls are allowed here (clippy.toml): the socket is the broker's own file.
#![allow(clippy::disallowed_methods)]

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;

use super::serve::{ServeOptions, serve_connection};
use crate::broker::Broker;
use crate::error::{Error, ErrorKind};
use crate::jsonrpc;
use crate::limits::BACKOFF;

/// Serves `broker` on a Unix socket at `path` until the process is stopped.
///
/// At most `max_sessions` (policy `[limits]`) connections are served at once; one more is
/// answered with a single `QUOTA_EXCEEDED` error line (id `null`) and closed. Running out of
/// descriptors never ends the broker: a connection that cannot be taken on is refused the
/// same way (a descriptor kept in reserve makes room to accept it and say so), and `accept`
/// errors are waited out.
pub async fn listen(broker: Arc<Broker>, path: &Path, opts: ServeOptions) -> io::Result<()> {
    let listener = bind_private(path)?;
    let _cleanup = RemoveOnDrop(path.to_path_buf());
    // The proxies that connect here prove their link with a key (see `crate::rundir`). It is
    // made once the socket is this broker's, so a broker that loses a race for the path never
    // replaces the winner's; a proxy that connects in between waits for it
    // (`ProxyKey::read`).
    broker.accept_proxies(crate::rundir::ProxyKey::create(path)?);
    tracing::info!(path = %path.display(), "listening");
    // Stopping (SIGTERM, SIGINT: see `cli`) ends accepting; each connection then stops
    // taking requests, finishes those it took, and the socket file is removed.
    let stop = broker.stopped();
    tokio::pin!(stop);
    let mut connections = tokio::task::JoinSet::new();
    let active = Arc::new(AtomicUsize::new(0));
    let mut reserve = Reserve::open();
    let mut starved = false;
    loop {
        // Finished connections are let go as new ones come.
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => {
                drop(listener);
                while connections.join_next().await.is_some() {}
                return Ok(());
            }
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                if std::mem::take(&mut starved) {
                    tracing::info!("file descriptors available again; accepting connections");
                }
                stream
            }
            Err(e) if out_of_descriptors(&e) => {
                if !std::mem::replace(&mut starved, true) {
                    tracing::warn!(error = %e, "out of file descriptors; refusing new connections");
                }
                if pending(&listener) && reserve.release() {
                    // Polled once (a zero timeout still polls the accept before it expires):
                    // the connection is waiting, and the reserve's descriptor is free for it.
                    let next = tokio::time::timeout(Duration::ZERO, listener.accept()).await;
                    if let Ok(Ok((stream, _))) = next {
                        refuse(
                            stream,
                            "the broker is out of file descriptors; try again later",
                        );
                    }
                } else {
                    // `accept` fails for want of a descriptor before it looks for a
                    // connection, so this failure repeats until one is free: wait.
                    tokio::time::sleep(BACKOFF).await;
                }
                if !reserve.held() {
                    reserve = Reserve::open();
                }
                continue;
            }
            Err(e) => {
                // A connection that went away before it was accepted, and the like.
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(BACKOFF / 10).await;
                continue;
            }
        };
        let max = broker.policy().limits().max_sessions;
        if active.load(Ordering::Acquire) >= max {
            tracing::warn!(max, "max_sessions reached; refusing a connection");
            refuse(
                stream,
                &format!(
                    "the broker is serving its maximum of {max} sessions (max_sessions); try again later"
                ),
            );
            continue;
        }
        let counted = Counted::new(&active);
        let session = Arc::new(broker.session());
        session.set_transport(crate::broker::Transport::Socket);
        let opts = opts.clone();
        connections.spawn(async move {
            let _counted = counted;
            let id = session.id();
            let result = async {
                let std_stream = stream.into_std()?;
                // The writer's own descriptor: the first thing a connection needs that a broker
                // out of descriptors cannot give it. Then the peer hears why, as at accept.
                let dup = match std_stream.try_clone() {
                    Ok(dup) => dup,
                    Err(e) => {
                        let line =
                            refusal(&format!("the broker cannot serve this connection: {e}"));
                        let _ = (&std_stream).write(&line);
                        return Err(e);
                    }
                };
                let writer = super::pipe::BlockingWriter(OwnedFd::from(dup));
                let reader = tokio::net::UnixStream::from_std(std_stream)?;
                // Never made to yield by tokio's budget: a task that yields so waits on its
                // worker until that worker is free, and a worker running a request inline that
                // stalls in its file system is not free; the connection would stop being read
                // (docs/security.md, "Slow or stuck file systems"). Its reads and waits are
                // bounded by the session's budgets, which make it wait in any case.
                tokio::task::unconstrained(serve_connection(session, reader, writer, opts)).await
            }
            .await;
            match result {
                Ok(()) => tracing::debug!(session = id, "connection closed"),
                Err(e) => tracing::warn!(session = id, error = %e, "connection failed"),
            }
        });
    }
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == rustix::io::Errno::MFILE.raw_os_error()
            || code == rustix::io::Errno::NFILE.raw_os_error()
            || code == rustix::io::Errno::NOBUFS.raw_os_error()
            || code == rustix::io::Errno::NOMEM.raw_os_error()
    )
}

/// Whether a connection is waiting to be accepted (asked without taking a descriptor).
fn pending(listener: &UnixListener) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        listener,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

/// Tells a connection the broker will not serve it (one JSON-RPC error line, id `null`), then
/// closes it. Never waits: a peer that does not read simply misses the line.
fn refuse(stream: tokio::net::UnixStream, why: &str) {
    let _ = stream.try_write(&refusal(why));
}

/// The line a refused connection gets: `QUOTA_EXCEEDED`, id `null`.
fn refusal(why: &str) -> Vec<u8> {
    jsonrpc::error_frame(None, &Error::new(ErrorKind::QuotaExceeded, why))
}

/// One descriptor held back (`/dev/null`), given up to accept a connection when the process
/// has run out, so that connection hears why it is refused instead of waiting in the backlog.
struct Reserve(Option<std::fs::File>);

impl Reserve {
    fn open() -> Reserve {
        Reserve(std::fs::File::open("/dev/null").ok())
    }

    fn held(&self) -> bool {
        self.0.is_some()
    }

    /// Closes the reserve; `false` when there was none.
    fn release(&mut self) -> bool {
        self.0.take().is_some()
    }
}

/// A served connection, counted against `max_sessions` until it ends.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(active: &Arc<AtomicUsize>) -> Counted {
        active.fetch_add(1, Ordering::AcqRel);
        Counted(Arc::clone(active))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Binds a socket only its owner can connect to, and makes its path appear only once it
/// listens: a host or proxy that connects the moment the path exists is served, never refused
/// (`ECONNREFUSED` between `bind` and `listen`). So it is bound and listening under a
/// temporary name in the same directory first, then renamed into place, never over anything
/// already there. The umask is narrowed for the `bind` itself, so there is no moment when the
/// socket exists with wider permissions.
///
/// The kernel keeps the name a socket was bound to: `/proc/net/unix` and `getsockname` show
/// the temporary name, not `path`.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() && std::os::unix::net::UnixStream::connect(path).is_err() {
            // A stale socket from a broker that is gone.
            std::fs::remove_file(path)?;
        } else {
            return Err(already_there(path));
        }
    }
    // Checked here: nothing is bound at `path` itself, which would have said so.
    if path.as_os_str().len() >= SUN_PATH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: a Unix socket's path must be shorter than {SUN_PATH} bytes",
                path.display()
            ),
        ));
    }
    let mut attempts = 0;
    let (listener, at) = loop {
        let staging = staging_path(path)?;
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
        // `bind` makes the file and fails if anything is at that name (a link included), so
        // the temporary name cannot be taken over; `listen` follows at once.
        let bound = UnixListener::bind(&staging);
        rustix::process::umask(old);
        match bound {
            Ok(listener) => break (listener, staging),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < 8 => attempts += 1,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", staging.display()),
                ));
            }
        }
    };
    let staged = Staged(Some(at.clone()));
    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", at.display())))?;
    match rustix::fs::renameat_with(
        rustix::fs::CWD,
        &at,
        rustix::fs::CWD,
        path,
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Ok(()) => staged.renamed(),
        // A file system without RENAME_NOREPLACE: a hard link fails the same way on a name
        // already taken (and the temporary name goes with `staged`).
        Err(rustix::io::Errno::INVAL) => match std::fs::hard_link(&at, path) {
            Ok(()) => drop(staged),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(already_there(path)),
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        },
        // Another broker started on the same path at the same time, and got there first.
        Err(rustix::io::Errno::EXIST) => return Err(already_there(path)),
        Err(e) => {
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!("{}: {e}", path.display()),
            ));
        }
    }
    Ok(listener)
}

/// The size of `sun_path` (Linux), its terminating NUL included: a socket's path is shorter.
const SUN_PATH: usize = 108;

/// A temporary name for the socket, in `path`'s directory (a rename stays in one file
/// system), random, and short enough to bind wherever `path` itself could be bound.
fn staging_path(path: &Path) -> io::Result<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let sep = usize::from(!dir.as_os_str().is_empty());
    let room = (SUN_PATH - 1).saturating_sub(dir.as_os_str().len() + sep);
    let random = crate::random::hex(8);
    let full = format!(".fsbroker-{random}");
    let name = if full.len() <= room {
        full
    } else if room >= 5 {
        format!(".{}", &random[..(room - 1).min(random.len())])
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: too long for a temporary name beside it in a socket's {SUN_PATH} bytes; use a shorter path",
                path.display()
            ),
        ));
    };
    Ok(dir.join(name))
}

fn already_there(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "{} exists (another broker, or not a socket)",
            path.display()
        ),
    )
}

/// The socket's temporary name, removed when this is dropped (a failed start leaves nothing
/// behind) unless [`Staged::renamed`] says the name is gone already.
struct Staged(Option<PathBuf>);

impl Staged {
    /// Renamed into place: the name may be another's by now, and is left alone.
    fn renamed(mut self) {
        self.0 = None;
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(at) = self.0.take() {
            let _ = std::fs::remove_file(at);
        }
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

//! `fsbroker serve --listen PATH`: one broker, many sessions, over a Unix socket.
//!
//! Each connection is one session of the same broker, so locks, rate limits by session, the
//! watcher and the audit log are shared by every server a host runs. The socket is created
//! owner-only: other users of the machine cannot connect. It may also be handed over ready
//! made, by systemd's socket activation ([`Socket::handed`]): then it is checked to be such a
//! socket, at the same path, and left where it is at exit.

// Ambient `std::fs` calls are allowed here (clippy.toml): the socket is the broker's own file.
#![allow(clippy::disallowed_methods)]

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
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
    listen_on(broker, Socket::bind(path), opts, || {}).await
}

/// Where a shared broker's socket comes from: bound by the broker itself, or handed over
/// listening already (systemd's socket activation). Either way it is at one path, which the
/// broker protects as its own file (the policy's `listen`) and names the proxies' key after.
#[derive(Debug)]
pub struct Socket {
    path: PathBuf,
    handed: Option<std::os::unix::net::UnixListener>,
}

impl Socket {
    /// A socket the broker binds at `path` when it starts serving (owner-only, and only once
    /// it listens), and removes when it stops: what [`listen`] does.
    pub fn bind(path: &Path) -> Socket {
        Socket {
            path: path.to_path_buf(),
            handed: None,
        }
    }

    /// A listening socket handed over at `fd` (by systemd: `LISTEN_FDS`), which must be
    /// `path`'s: a listening Unix stream socket, bound to `path` (compared canonically),
    /// whose file belongs to this user and is writable by nobody else (so only this user can
    /// connect, as with a socket the broker binds). Anything else is refused with what it is.
    ///
    /// The descriptor is made close-on-exec, so no program the broker starts (a consent
    /// command) inherits it. The broker never binds it again nor removes its file: the
    /// socket is the service manager's, which keeps it listening across the broker's restarts.
    pub fn handed(fd: OwnedFd, path: &Path) -> io::Result<Socket> {
        check_handed(&fd, path)?;
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)
            .map_err(|e| handed_error(&fd, path, format!("cannot be made close-on-exec: {e}")))?;
        let listener = std::os::unix::net::UnixListener::from(fd);
        // Shared with the service manager's copy (one open file description), which polls it
        // and does not mind: tokio needs it non-blocking.
        listener.set_nonblocking(true)?;
        Ok(Socket {
            path: path.to_path_buf(),
            handed: Some(listener),
        })
    }

    /// The socket's path (`--listen PATH`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it was handed over (and so is not the broker's to remove).
    pub fn is_handed(&self) -> bool {
        self.handed.is_some()
    }
}

/// Checks that a handed descriptor is the listening socket at `path` ([`Socket::handed`]).
fn check_handed(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let refuse = |why: String| Err(handed_error(fd, path, why));
    let kind = match sockopt::socket_type(fd) {
        Ok(kind) => kind,
        Err(rustix::io::Errno::NOTSOCK) => {
            return refuse(format!("is not a socket but {}", file_kind(fd)));
        }
        Err(e) => return refuse(format!("cannot be inspected (SO_TYPE): {e}")),
    };
    let domain = sockopt::socket_domain(fd)
        .map_err(|e| handed_error(fd, path, format!("cannot be inspected (SO_DOMAIN): {e}")))?;
    if domain != AddressFamily::UNIX {
        let name = match domain {
            AddressFamily::INET => "an IPv4 (AF_INET)".to_owned(),
            AddressFamily::INET6 => "an IPv6 (AF_INET6)".to_owned(),
            other => format!("an address family {}", other.as_raw()),
        };
        return refuse(format!("is {name} socket, not a Unix (AF_UNIX) one"));
    }
    if kind != SocketType::STREAM {
        let name = match kind {
            SocketType::DGRAM => "a datagram (SOCK_DGRAM)".to_owned(),
            SocketType::SEQPACKET => "a sequenced-packet (SOCK_SEQPACKET)".to_owned(),
            other => format!("a type {}", other.as_raw()),
        };
        return refuse(format!(
            "is {name} Unix socket, not a stream (SOCK_STREAM) one"
        ));
    }
    match sockopt::socket_acceptconn(fd) {
        Ok(true) => {}
        Ok(false) => {
            return refuse(
                "is a Unix stream socket that is not listening (SO_ACCEPTCONN is off)".to_owned(),
            );
        }
        Err(e) => return refuse(format!("cannot be inspected (SO_ACCEPTCONN): {e}")),
    }
    let addr = rustix::net::getsockname(fd)
        .map_err(|e| handed_error(fd, path, format!("has no address (getsockname): {e}")))?;
    let bound = rustix::net::SocketAddrUnix::try_from(addr)
        .ok()
        .and_then(|a| {
            a.path_bytes()
                .map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p)))
        });
    let Some(bound) = bound else {
        return refuse(format!(
            "is bound to no path (an abstract or unnamed socket), not to {}",
            path.display()
        ));
    };
    // Canonically: the unit may name the socket through a link, or relative to the directory
    // both processes share.
    let canonical = |p: &Path| {
        std::fs::canonicalize(p).map_err(|e| {
            handed_error(
                fd,
                path,
                format!(
                    "is bound to {}, which cannot be resolved: {e}",
                    bound.display()
                ),
            )
        })
    };
    let at = canonical(&bound)?;
    let wanted = std::fs::canonicalize(path).map_err(|e| {
        handed_error(
            fd,
            path,
            format!(
                "is bound to {}, and {} cannot be resolved: {e}",
                bound.display(),
                path.display()
            ),
        )
    })?;
    if at != wanted {
        return refuse(format!(
            "is bound to {}, not to {}: the socket unit's ListenStream= and --listen must name \
             the same socket",
            bound.display(),
            path.display()
        ));
    }
    // As owner-only as a socket the broker binds (0600): connecting takes write permission.
    let meta = std::fs::metadata(&at)
        .map_err(|e| handed_error(fd, path, format!("{}: {e}", at.display())))?;
    let uid = rustix::process::geteuid().as_raw();
    if meta.uid() != uid {
        return refuse(format!(
            "has its file {} owned by user {}, not by this user ({uid})",
            at.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "has its file {} writable by others (mode {:04o}), so other users could connect: \
             set SocketMode=0600 in the socket unit",
            at.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// What a descriptor that is not a socket is, for the error that refuses it.
fn file_kind(fd: &OwnedFd) -> &'static str {
    use rustix::fs::FileType;
    match rustix::fs::fstat(fd).map(|st| FileType::from_raw_mode(st.st_mode)) {
        Ok(FileType::RegularFile) => "a regular file",
        Ok(FileType::Directory) => "a directory",
        Ok(FileType::Fifo) => "a pipe or FIFO",
        Ok(FileType::CharacterDevice) => "a character device",
        Ok(FileType::BlockDevice) => "a block device",
        Ok(FileType::Symlink) => "a symbolic link",
        _ => "something else",
    }
}

fn handed_error(fd: &OwnedFd, path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "--listen {}: the socket handed over (descriptor {}) {why}",
            path.display(),
            fd.as_raw_fd()
        ),
    )
}

/// Serves `broker` on `socket` until the process is stopped, as [`listen`] does; `ready` is
/// called once, when the socket accepts connections and the proxies' key is written (when a
/// service manager may be told the broker is ready: `sd_notify(READY=1)`).
pub async fn listen_on(
    broker: Arc<Broker>,
    socket: Socket,
    opts: ServeOptions,
    ready: impl FnOnce(),
) -> io::Result<()> {
    let path = socket.path.as_path();
    // Kept to the end: the socket file goes with it, when it is the broker's own.
    let (listener, remove_at_exit) = match socket.handed {
        // The service manager's socket: neither bound again nor removed at exit.
        Some(handed) => (UnixListener::from_std(handed)?, None),
        None => (bind_private(path)?, Some(RemoveOnDrop(path.to_path_buf()))),
    };
    // The proxies that connect here prove their link with a key (see `crate::rundir`). It is
    // made once the socket is this broker's, so a broker that loses a race for the path never
    // replaces the winner's; a proxy that connects in between waits for it
    // (`ProxyKey::read`).
    broker.accept_proxies(crate::rundir::ProxyKey::create(path)?);
    tracing::info!(path = %path.display(), handed = remove_at_exit.is_none(), "listening");
    ready();
    // Stopping (SIGTERM, SIGINT: see `cli`) ends accepting; each connection then stops
    // taking requests, finishes those it took, and the socket file is removed (unless it was
    // handed over: it stays, listening, in the service manager's hands).
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

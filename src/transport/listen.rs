//! `fsbroker serve --listen PATH`: one broker, many sessions, over a Unix socket.
//!
//! Each connection is one session of the same broker, so locks, rate limits by session, the
//! watcher and the audit log are shared by every server a host runs. The socket is created
//! owner-only: other users of the machine cannot connect.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;

use super::serve::{ServeOptions, serve_connection};
use crate::broker::Broker;

/// Serves `broker` on a Unix socket at `path` until the process is stopped.
pub async fn listen(broker: Arc<Broker>, path: &Path, opts: ServeOptions) -> io::Result<()> {
    let listener = bind_private(path)?;
    tracing::info!(path = %path.display(), "listening");
    let _cleanup = RemoveOnDrop(path.to_path_buf());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        // SIGTERM and SIGINT end the broker cleanly: the socket file is removed.
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            _ = term.recv() => return Ok(()),
            _ = int.recv() => return Ok(()),
        };
        let session = Arc::new(broker.session());
        let opts = opts.clone();
        tokio::spawn(async move {
            let id = session.id();
            let result = async {
                let std_stream = stream.into_std()?;
                let writer = BlockingWriter(OwnedFd::from(std_stream.try_clone()?));
                let reader = tokio::net::UnixStream::from_std(std_stream)?;
                serve_connection(session, reader, writer, opts).await
            }
            .await;
            match result {
                Ok(()) => tracing::debug!(session = id, "connection closed"),
                Err(e) => tracing::warn!(session = id, error = %e, "connection failed"),
            }
        });
    }
}

/// Binds a socket only its owner can connect to. The umask is narrowed for the `bind` itself,
/// so there is no moment when the socket exists with wider permissions.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() && std::os::unix::net::UnixStream::connect(path).is_err() {
            // A stale socket from a broker that is gone.
            std::fs::remove_file(path)?;
        } else {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists (another broker, or not a socket)",
                    path.display()
                ),
            ));
        }
    }
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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

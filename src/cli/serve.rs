//! `fsbroker serve`: one broker answering on stdio, or on a Unix socket (`--listen`).

use std::process::ExitCode;
use std::sync::Arc;

use fsbroker::transport;

use super::ServeArgs;
use super::running::{SHUTDOWN_WAIT, start};

/// Why `--listen PATH` is refused before anything starts: a socket directly in `/` is what
/// `--listen "$XDG_RUNTIME_DIR/fsbroker.sock"` becomes with the variable unset, never a
/// place a person means (and only root could make it).
fn unlikely_socket(path: &std::path::Path) -> Option<String> {
    (path.parent() == Some(std::path::Path::new("/"))).then(|| {
        format!(
            "--listen {}: a socket directly in /, which is what \"$XDG_RUNTIME_DIR/NAME\" \
             becomes when the variable is unset; give a path in a directory of yours, for \
             example $XDG_RUNTIME_DIR/fsbroker.sock with XDG_RUNTIME_DIR set, or \
             ~/.local/state/fsbroker.sock",
            path.display()
        )
    })
}

/// Runs `fsbroker serve`.
pub(super) fn run(args: ServeArgs) -> ExitCode {
    // First, while the process has one thread and no descriptor of its own: a socket systemd
    // handed over (socket activation), and its variables unset.
    let handed = match super::activation::take_listening_socket() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(why) = args.listen.as_deref().and_then(unlikely_socket) {
        eprintln!("fsbroker: {why}");
        return ExitCode::FAILURE;
    }
    // Checked before anything starts (a console, the policy's watcher), so that a unit that
    // hands the wrong socket fails at once and says why.
    let socket = match (&args.listen, handed) {
        (Some(path), Some(fd)) => match transport::listen::Socket::handed(fd, path) {
            Ok(socket) => Some(socket),
            Err(e) => {
                eprintln!("fsbroker: {e}");
                return ExitCode::FAILURE;
            }
        },
        (Some(path), None) => Some(transport::listen::Socket::bind(path)),
        (None, Some(_)) => {
            eprintln!(
                "fsbroker: systemd handed over a listening socket (LISTEN_FDS), but `serve` \
                 was not given --listen PATH: add --listen with the socket unit's ListenStream= \
                 path"
            );
            return ExitCode::FAILURE;
        }
        (None, None) => None,
    };
    raise_descriptor_limit();
    let running = match start(&args, &fsbroker::transport::proxy::SignIns::new()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = running.options(&args);
    let broker = Arc::clone(&running.broker);
    let result = running.run(async move {
        match socket {
            Some(socket) => {
                transport::listen::listen_on(broker, socket, opts, super::activation::notify_ready)
                    .await
            }
            None => transport::serve_stdio(Arc::new(broker.session()), opts).await,
        }
    });
    // Every request is answered by now; file work still on the blocking pool is stuck in a
    // file system (its requests were answered `TIMEOUT`). Dropping the runtime would wait
    // for it forever, keeping a broker whose peer has left alive.
    running.runtime.shutdown_timeout(SHUTDOWN_WAIT);
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
        // Stopped by a signal with work still running: not a clean end.
        Err(signal) => ExitCode::from(128 + signal as u8),
    }
}

/// Raises the soft limit on open descriptors to the hard limit, as servers do: each upload
/// and connection holds a few, and the default soft limit (often 1024) is far below what the
/// system allows. Only `serve` does: the proxy's server inherits the proxy's limits, and some
/// programs still assume descriptors below 1024. The bounds that matter are the policy's (`max_uploads`, `max_sessions`);
/// should descriptors still run out, that request or connection fails, never the broker.
fn raise_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(error = %e, "descriptor limit left as it is");
        }
    }
}

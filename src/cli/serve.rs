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
    if let Some(why) = args.listen.as_deref().and_then(unlikely_socket) {
        eprintln!("fsbroker: {why}");
        return ExitCode::FAILURE;
    }
    raise_descriptor_limit();
    let running = match start(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = running.options(&args);
    let broker = Arc::clone(&running.broker);
    let result = running.run(async move {
        match &args.listen {
            Some(path) => transport::listen::listen(broker, path, opts).await,
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

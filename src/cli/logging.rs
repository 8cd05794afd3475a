//! The log: `tracing` lines on stderr, filtered by `RUST_LOG` (default `warn`).

/// Sends the log to stderr, filtered by `RUST_LOG`.
pub(super) fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr(std::io::stderr()))
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// stderr for logs, where a failed write is dropped. A host that closes its end of the pipe,
/// or a log file on a full disk, must cost the log's lines, not the request that logged them:
/// tracing's writer otherwise reports the error with `eprintln!`, which panics on the same
/// stderr and takes the request (and its audit line) with it.
struct LossyStderr(std::io::Stderr);

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

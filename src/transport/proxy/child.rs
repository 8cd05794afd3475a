//! Ending the server's process: when (the host gone, the proxy stopping, access revoked),
//! whom (the server, or a confined server's whole tree), and never another process.
//!
//! A server that does not exit by itself when its input ends must not outlive the proxy, and
//! a confined server must not leave descendants holding access it was started with; but once
//! the server is reaped its number may go to another process, so every signal here is aimed
//! through a pidfd, or only while the server is not reaped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::process::{Pid, Signal};

use super::EndServer;
use crate::limits::{CLOSE_GRACE, END_GRACE, HOST_GONE_GRACE, STOP_KILL_GRACE};

/// Ends what a confined server left running (daemons keep its access): every descendant of
/// the proxy, which is their reaper (crate::confine::reap).
pub(super) async fn end_orphans(group: i32) {
    // The group at once, at the reap (crate::confine::reap::signal_descendants); then the
    // tree only.
    crate::confine::reap::signal_group(group, rustix::process::Signal::KILL);
    tokio::task::spawn_blocking(crate::confine::reap::end_descendants)
        .await
        .ok();
}

/// Kills a confined server's process group (while the server is not reaped) and what is
/// left below the proxy when dropped: the proxy's future may be dropped mid-way (a stop
/// signal's grace ran out) with the server and its children still running.
pub(super) struct GroupGuard {
    pub(super) group: i32,
    pub(super) reaped: Arc<AtomicBool>,
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        crate::confine::reap::signal_descendants(
            live_group(self.group, &self.reaped),
            rustix::process::Signal::KILL,
        );
    }
}

/// `group` while the server that leads it is not reaped, else 0 (no group).
fn live_group(group: i32, reaped: &AtomicBool) -> i32 {
    if reaped.load(Ordering::SeqCst) {
        0
    } else {
        group
    }
}

/// Whom the proxy signals to end its server.
pub(super) enum Target {
    /// A confined server: its process group and everything below the proxy
    /// (crate::confine::reap), while the server is not reaped; after, the tree only.
    Tree { group: i32, reaped: Arc<AtomicBool> },
    /// An unconfined server: the server itself. It runs in the proxy's process group, so its
    /// group is not signalled, and what it starts is its own, as without the proxy.
    Server {
        /// Pins the server (never another process given its number once it is reaped).
        pidfd: Option<std::os::fd::OwnedFd>,
        /// Its number, used only where pidfds are missing (Linux before 5.3) and while the
        /// server is not reaped.
        pid: i32,
        reaped: Arc<AtomicBool>,
    },
}

impl Target {
    /// Sends `signal`; whether it reached a process.
    fn signal(&self, signal: Signal) -> bool {
        match self {
            Target::Tree { group, reaped } => {
                crate::confine::reap::signal_descendants(live_group(*group, reaped), signal) > 0
            }
            Target::Server {
                pidfd: Some(fd), ..
            } => rustix::process::pidfd_send_signal(fd, signal).is_ok(),
            Target::Server {
                pidfd: None,
                pid,
                reaped,
            } => Pid::from_raw(*pid)
                .filter(|_| !reaped.load(Ordering::SeqCst))
                .is_some_and(|p| rustix::process::kill_process(p, signal).is_ok()),
        }
    }
}

/// Resolves once `gone` is set (never, if its sender goes without setting it).
pub(super) async fn wait_gone(mut gone: tokio::sync::watch::Receiver<bool>) {
    if gone.wait_for(|g| *g).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Ends the server when it must go, through `target`:
/// - once `revoked` resolves (a reload took away access a confined server holds): SIGTERM at
///   once, SIGKILL after [`END_GRACE`];
/// - once `gone` resolves (the host has gone, or the server closed its stdout): SIGTERM after
///   [`HOST_GONE_GRACE`] if it is still running;
/// - once `stopped` resolves (SIGTERM or SIGINT to the proxy, whose stdin is then closed):
///   SIGTERM [`CLOSE_GRACE`] after its stdin closed (at once if that was longer ago);
/// - after either SIGTERM, SIGKILL [`STOP_KILL_GRACE`] later.
///
/// A signal to a server that has exited is harmless (see [`Target`]); the proxy aborts this
/// once the server is reaped. (What a confined server forks in between lands in the proxy's
/// tree too, and is ended when the server's exit is seen.)
pub(super) async fn end_server(
    revoked: Option<EndServer>,
    gone: impl std::future::Future<Output = ()>,
    stopped: impl std::future::Future<Output = ()>,
    target: Target,
) {
    use tokio::time::Instant;
    let revoked = async move {
        match revoked {
            Some(end) => end.await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(revoked, gone, stopped);
    // When the server's stdin closed, and when it is sent SIGTERM.
    let mut closed: Option<Instant> = None;
    let mut term_at: Option<Instant> = None;
    let mut stopping = false;
    let grace = loop {
        let due = term_at.unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(3600));
        tokio::select! {
            reason = &mut revoked => {
                // The signal first, then the log line: a log line can block (a host that
                // does not drain stderr), and nothing may hold up a revocation.
                target.signal(Signal::TERM);
                tracing::warn!(%reason, "ending the server");
                break END_GRACE;
            }
            () = &mut gone, if closed.is_none() => {
                let now = Instant::now();
                closed = Some(now);
                let grace = if stopping { CLOSE_GRACE } else { HOST_GONE_GRACE };
                term_at = Some(term_at.map_or(now + grace, |t| t.min(now + grace)));
            }
            () = &mut stopped, if !stopping => {
                stopping = true;
                // The stdin closes now if it has not yet (the host's reader stops too).
                let at = closed.unwrap_or_else(Instant::now) + CLOSE_GRACE;
                term_at = Some(term_at.map_or(at, |t| t.min(at)));
            }
            () = tokio::time::sleep_until(due), if term_at.is_some() => {
                if target.signal(Signal::TERM) {
                    let waited = closed.map_or(CLOSE_GRACE, |c| c.elapsed());
                    tracing::warn!("the server did not exit within {waited:.1?} of the end of its input; sent SIGTERM");
                }
                break STOP_KILL_GRACE;
            }
        }
    };
    tokio::time::sleep(grace).await;
    if target.signal(Signal::KILL) {
        tracing::warn!("the server did not exit within {grace:?} of SIGTERM; sent SIGKILL");
    }
}

pub(super) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

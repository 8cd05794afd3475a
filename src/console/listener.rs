//! The console's connections: at most [`CONNECTIONS`] at once, and room kept for the ones
//! that proved who they are.
//!
//! Any local program can connect to a loopback port without a token. Unbounded, idle or
//! half-sent connections would take the broker's descriptors, which its sessions need. A plain
//! cap is not enough either: connections that send a harmless request now and then (the page's
//! script, say, or a refused `/api/` call) would hold every slot, and the person's page could
//! not get one. So a connection counts as *proven* once a request on it carried the run's
//! token or a page's key ([`Proven`], set by the guard), and when the cap is reached a new
//! connection takes the place of the oldest one that has not proven itself. Only when every
//! open connection has proven itself is the new one turned away.
//!
//! A program that keeps opening connections can still slow the page (its fresh connections
//! compete with the page's for a moment); it cannot hold the console.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::AbortHandle;

/// Connections the console serves at once (a page holds two or three).
pub(crate) const CONNECTIONS: usize = 64;

/// Set on a connection once one of its requests carried a credential; found by the guard in
/// the request's extensions.
#[derive(Clone, Default)]
pub(crate) struct Proven(Arc<AtomicBool>);

impl Proven {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One open connection: whether it proved itself, and how to end it.
struct Conn {
    proven: Proven,
    task: AbortHandle,
}

/// The open connections, oldest first.
#[derive(Default)]
pub(crate) struct Conns {
    open: Mutex<Vec<Conn>>,
}

impl Conns {
    /// Whether one more connection may be served: below the cap, or once the oldest that has
    /// not proven itself is ended to make room.
    pub(crate) fn make_room(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|c| !c.task.is_finished());
        if open.len() < CONNECTIONS {
            return true;
        }
        match open.iter().position(|c| !c.proven.get()) {
            Some(oldest) => {
                open.remove(oldest).task.abort();
                true
            }
            None => false,
        }
    }

    /// Counts a connection served by `task`.
    pub(crate) fn add(&self, proven: Proven, task: AbortHandle) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.push(Conn { proven, task });
    }
}

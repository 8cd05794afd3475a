//! The proxy's relay queues: what goes to the server's stdin, and the byte budget every
//! relayed line holds until it is written, so a peer that stops reading stalls its sender
//! instead of growing the proxy's memory.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::serve::QueueItem;
pub use crate::limits::RELAY_BUDGET_KIB;
use crate::outgoing::Outgoing;

/// Messages for the server's stdin.
pub(super) enum ToServer {
    Frame(Outgoing),
    /// The host is gone: close the server's stdin.
    Close,
}

impl From<Outgoing> for ToServer {
    fn from(frame: Outgoing) -> ToServer {
        ToServer::Frame(frame)
    }
}

impl QueueItem for ToServer {
    fn into_frame(self) -> Option<Outgoing> {
        match self {
            ToServer::Frame(frame) => Some(frame),
            ToServer::Close => None,
        }
    }
}

/// Room for relayed lines in one queue, in KiB.
#[derive(Clone)]
pub(super) struct Budget(Arc<Semaphore>);

impl Budget {
    pub(super) fn new() -> Budget {
        Budget(Arc::new(Semaphore::new(RELAY_BUDGET_KIB)))
    }

    /// `line` as a frame holding its share of the budget until it is written; waits for room.
    pub(super) async fn frame(&self, line: Vec<u8>) -> Option<Outgoing> {
        let kib = line.len().div_ceil(1024).clamp(1, RELAY_BUDGET_KIB) as u32;
        let permit = Arc::clone(&self.0).acquire_many_owned(kib).await.ok()?;
        Some(Outgoing::from(line).hold(Some(permit)))
    }
}

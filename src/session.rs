//! A session: one connected MCP server.

use std::sync::Arc;

use crate::broker::Broker;
use crate::jsonrpc::{self, Incoming};
use crate::methods;
use crate::upload::Uploads;

/// One peer's view of the broker. Cheap to share: requests of a session run concurrently.
#[derive(Debug)]
pub struct Session {
    broker: Arc<Broker>,
    id: u64,
    uploads: Uploads,
}

impl Session {
    pub(crate) fn new(broker: Arc<Broker>, id: u64) -> Session {
        Session {
            broker,
            id,
            uploads: Uploads::default(),
        }
    }

    /// The chunked uploads in progress.
    pub(crate) fn uploads(&self) -> &Uploads {
        &self.uploads
    }

    /// This session's number, unique within its broker (it names the session in logs).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The broker this session belongs to.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }

    /// Handles one message (a line without its newline) and returns the response frame,
    /// newline included, or `None` when the message gets no answer (a notification, or a
    /// response to a request the broker never sent).
    pub async fn handle(&self, line: &[u8]) -> Option<Vec<u8>> {
        match jsonrpc::parse(line) {
            Incoming::Request { id, method, params } => {
                Some(methods::call(self, &method, params, id).await)
            }
            Incoming::Notification { method } => {
                tracing::debug!(session = self.id, %method, "notification");
                None
            }
            Incoming::Response => {
                tracing::debug!(
                    session = self.id,
                    "ignoring a response to no request of ours"
                );
                None
            }
            Incoming::Invalid { id, error } => {
                tracing::debug!(session = self.id, %error, "invalid message");
                Some(jsonrpc::error_frame(id, &error))
            }
        }
    }
}

/// A session ends when its connection does: its kept locks are released, and its unfinished
/// uploads (dropped with it) remove their staging files.
impl Drop for Session {
    fn drop(&mut self) {
        self.broker.locks().release_session(self.id);
        let abandoned = self.uploads.len();
        if abandoned > 0 {
            tracing::info!(session = self.id, abandoned, "removing unfinished uploads");
        }
    }
}

//! The host's requests, by [`RequestId`]: those sent and not yet answered (what wakes the
//! stream that waits for each, and its task, which the host's cancel ends), and the last ones
//! the proxy answered with its own error, whose late answers are dropped.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::Remote;
use crate::limits::{REMOTE_FAILED_KEPT, REMOTE_PENDING};
use crate::transport::lenient::{self, RequestId};
use crate::transport::pending::PendingIds;

/// The host's requests by [`RequestId`]: one lock for both maps, so that a request leaves
/// `pending` and enters `failed` at once (a late answer cannot pass in between).
pub(super) struct Ids {
    /// Sent (or waiting for a slot) and not yet answered, at most [`REMOTE_PENDING`].
    pub(super) pending: PendingIds<Waiting>,
    /// The last answered with the proxy's error (or cancelled by the host), at most
    /// [`REMOTE_FAILED_KEPT`], whose late answers from the server are dropped.
    failed: PendingIds<()>,
}

impl Default for Ids {
    fn default() -> Ids {
        Ids {
            pending: PendingIds::new(REMOTE_PENDING),
            failed: PendingIds::new(REMOTE_FAILED_KEPT),
        }
    }
}

impl Ids {
    pub(super) fn fail(&mut self, key: RequestId) {
        self.failed.insert(key, ());
    }

    /// A response to `key` came: whether it goes on to the host (not when `key` was failed).
    /// The request waiting for it is settled, and the follower of its own stream woken.
    pub(super) fn answered(&mut self, key: &RequestId) -> bool {
        if self.failed.contains(key) {
            return false;
        }
        if let Some(waiting) = self.pending.remove(key) {
            waiting.settled.notify_one();
        }
        true
    }
}

/// A host request waiting for its answer.
pub(super) struct Waiting {
    /// Woken once the request is settled elsewhere (its answer came on another stream), so
    /// that its own stream, which may stay open and silent, is let go.
    pub(super) settled: Arc<Notify>,
    /// Its task, ended when the host cancels the request (its stream may never end).
    pub(super) task: Option<AbortHandle>,
}

impl Remote {
    /// Whether a line of the server's (one message, or what of one no parser reads) goes on
    /// towards the host, and, when it does and it answers `answer`, that request is settled:
    /// no longer waited for, and its own stream, if it is still being followed, let go.
    ///
    /// Not when some reading of it ([`lenient::any_message`]) may be an answer under an id
    /// the proxy already answered with its own error (its stream broke, say: the host may
    /// have reused the id), or under an id that reads more than one way. Checked and settled
    /// under one lock, so that the proxy's error and this answer cannot both go.
    pub(super) fn admit(&self, line: &[u8], answer: Option<&RequestId>) -> bool {
        let mut ids = self.lock_ids();
        let refused = lenient::any_message(line, |env| {
            env.may_answer()
                && (env.ids.len() > 1 || env.ids.iter().any(|id| ids.failed.contains(id)))
        });
        !refused && answer.is_none_or(|key| ids.answered(key))
    }
    /// The host's request `key` is about to be sent: its answer is waited for. `false` when
    /// [`REMOTE_PENDING`] others are waiting already: it is not sent.
    pub(super) fn expect(&self, key: RequestId) -> bool {
        let waiting = Waiting {
            settled: Arc::new(Notify::new()),
            task: None,
        };
        let mut ids = self.lock_ids();
        if !ids.pending.has_room_for(&key) {
            return false;
        }
        ids.pending.insert(key, waiting);
        true
    }
    /// The task sending the host's request `key`, to end should the host cancel it.
    pub(super) fn track(&self, key: &RequestId, task: AbortHandle) {
        if let Some(waiting) = self.lock_ids().pending.get_mut(key) {
            waiting.task = Some(task);
        }
    }
    /// The host cancelled its request `key`: its task ends (a stream the server never ends
    /// would hold its slot for good), and the server's answer, should it come, is dropped.
    /// The host expects no answer, so none is made.
    pub(super) fn cancelled(&self, key: &RequestId) {
        let mut ids = self.lock_ids();
        let Some(waiting) = ids.pending.remove(key) else {
            return;
        };
        if let Some(task) = waiting.task {
            task.abort();
        }
        ids.fail(key.clone());
    }
    /// Whether the host's request `key` still waits for its answer.
    pub(super) fn is_pending(&self, key: &RequestId) -> bool {
        self.lock_ids().pending.contains(key)
    }
    /// What wakes the follower of `key`'s stream once `key` is answered elsewhere.
    pub(super) fn settled(&self, key: &RequestId) -> Option<Arc<Notify>> {
        let ids = self.lock_ids();
        ids.pending.get(key).map(|w| Arc::clone(&w.settled))
    }
    pub(super) fn lock_ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

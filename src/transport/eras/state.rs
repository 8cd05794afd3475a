//! What the proxy holds for one connection, and the bounds on it: the host requests it may
//! have to send again (until the server answers them), and the broker's answers waiting for
//! the host's retry.
//!
//! The server decides how long a request waits for its answer and how many come back
//! `input_required`, and the host how many retries it never sends: either could make the
//! proxy hold more and more. So everything held is kept here, in maps bounded in count and in
//! bytes ([`MAX_KEPT`], [`MAX_STASHED`]): past them a request is not kept (its broker input
//! requests go unanswered), and the oldest answers waiting for a retry are dropped.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::value::RawValue;

use crate::limits::{MAX_KEPT, MAX_KEPT_BYTES, MAX_STASHED, MAX_STASHED_BYTES};
use crate::transport::lenient::RequestId;
use crate::transport::pending::PendingIds;

/// A host request the proxy may have to send again.
pub(super) struct Kept {
    /// The host's id for it, as the host wrote it.
    pub(super) host_id: Box<RawValue>,
    /// The host's id, as the peers pair ids.
    pub(super) host_key: RequestId,
    /// The request as first sent, which each round sends again.
    pub(super) request: Vec<u8>,
    /// Rounds of input requests the broker has answered for it.
    pub(super) rounds: u32,
}

pub(super) struct EraState {
    /// Whether the host's requests are of the 2026-07-28 era (the last one decides).
    pub(super) modern: bool,
    /// Kept host requests by the id the server answers under: the host's own id, or the
    /// proxy's retry id.
    pub(super) kept: PendingIds<Kept>,
    /// Bytes of the requests in `kept`.
    kept_bytes: usize,
    /// The broker's input responses waiting for the host's retry, by
    /// [`retry_key`](crate::transport::modern::retry_key).
    stash: HashMap<String, BTreeMap<String, Box<RawValue>>>,
    /// The keys of `stash`, oldest first.
    stash_order: VecDeque<String>,
    /// Bytes of the answers in `stash`.
    stash_bytes: usize,
}

impl Default for EraState {
    fn default() -> EraState {
        EraState {
            modern: false,
            kept: PendingIds::new(MAX_KEPT),
            kept_bytes: 0,
            stash: HashMap::new(),
            stash_order: VecDeque::new(),
            stash_bytes: 0,
        }
    }
}

fn answers_bytes(answers: &BTreeMap<String, Box<RawValue>>) -> usize {
    answers.iter().map(|(k, v)| k.len() + v.get().len()).sum()
}

impl EraState {
    /// Keeps `kept` under `key`; gives it back when the bounds are reached.
    pub(super) fn keep(&mut self, key: RequestId, kept: Kept) -> Result<(), Kept> {
        if !self.kept.has_room_for(&key) || self.kept_bytes + kept.request.len() > MAX_KEPT_BYTES {
            tracing::warn!(
                kept = self.kept.len(),
                "too many host requests waiting; this one's input requests will not be answered by the broker"
            );
            return Err(kept);
        }
        self.kept_bytes += kept.request.len();
        if let Some(old) = self.kept.remove(&key) {
            self.kept_bytes -= old.request.len();
        }
        // Room was made sure of: nothing is let go.
        self.kept.insert(key, kept);
        Ok(())
    }

    pub(super) fn take(&mut self, key: &RequestId) -> Option<Kept> {
        let kept = self.kept.remove(key)?;
        self.kept_bytes -= kept.request.len();
        Some(kept)
    }

    pub(super) fn stash(&mut self, key: String, answers: BTreeMap<String, Box<RawValue>>) {
        self.stash_bytes += answers_bytes(&answers);
        match self.stash.insert(key.clone(), answers) {
            Some(old) => self.stash_bytes -= answers_bytes(&old),
            None => self.stash_order.push_back(key),
        }
        while self.stash.len() > MAX_STASHED || self.stash_bytes > MAX_STASHED_BYTES {
            let Some(old) = self.stash_order.pop_front() else {
                break;
            };
            if let Some(answers) = self.stash.remove(&old) {
                self.stash_bytes -= answers_bytes(&answers);
            }
        }
    }

    pub(super) fn unstash(&mut self, key: &str) -> Option<BTreeMap<String, Box<RawValue>>> {
        let answers = self.stash.remove(key)?;
        self.stash_bytes -= answers_bytes(&answers);
        self.stash_order.retain(|k| k != key);
        Some(answers)
    }
}

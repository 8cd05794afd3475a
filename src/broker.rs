//! The broker: state shared by every session.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::locks::LockTable;
use crate::policy::Policy;
use crate::session::Session;

/// Shared state behind every session: the policy (and through it the roots) and the locks.
///
/// A request takes one snapshot of the policy ([`Broker::policy`]) and uses it throughout,
/// so a reload never changes the rules halfway through an operation.
#[derive(Debug)]
pub struct Broker {
    policy: RwLock<Arc<Policy>>,
    locks: Arc<LockTable>,
    next_session: AtomicU64,
}

impl Broker {
    /// A broker running `policy`.
    pub fn new(policy: Policy) -> Arc<Broker> {
        Arc::new(Broker {
            policy: RwLock::new(Arc::new(policy)),
            locks: Arc::default(),
            next_session: AtomicU64::new(1),
        })
    }

    /// The policy in force now.
    pub fn policy(&self) -> Arc<Policy> {
        // A poisoned lock only means a writer panicked after a complete swap of the `Arc`;
        // the value inside is still a whole policy.
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the policy; requests already running keep the snapshot they took.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// The path locks every session shares.
    pub fn locks(&self) -> &Arc<LockTable> {
        &self.locks
    }

    /// Opens a new session (one connection, one MCP server).
    pub fn session(self: &Arc<Self>) -> Session {
        let id = self.next_session.fetch_add(1, Ordering::Relaxed);
        Session::new(Arc::clone(self), id)
    }
}

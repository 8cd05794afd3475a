//! Whose turn it is to ask the person.
//!
//! A prompt waits for a person on a thread of the blocking pool. Without bounds, sessions
//! queueing prompts nobody answers would hold every thread: so one prompt at a time per
//! session, and at most [`PROMPTS`] in the whole broker. The wait for a turn counts against
//! the request's `timeout_ms` (`TIMEOUT` when it runs out).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::Result;
use crate::limits::PROMPTS;
use crate::throttle;

/// The broker's turns (shared by every session).
#[derive(Debug)]
pub(crate) struct BrokerTurns(Arc<Semaphore>);

impl Default for BrokerTurns {
    fn default() -> Self {
        BrokerTurns(Arc::new(Semaphore::new(PROMPTS)))
    }
}

/// One session's turn (one prompt at a time).
#[derive(Debug)]
pub(crate) struct SessionTurns(Arc<Semaphore>);

impl Default for SessionTurns {
    fn default() -> Self {
        SessionTurns(Arc::new(Semaphore::new(1)))
    }
}

/// A request's turn to ask the person; the next one's comes when it is dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    _mine: OwnedSemaphorePermit,
    _any: OwnedSemaphorePermit,
}

impl SessionTurns {
    /// Waits for the session's turn, then the broker's, until `started + limit` (the
    /// request's `timeout_ms`).
    pub(crate) async fn take(
        &self,
        broker: &BrokerTurns,
        started: Instant,
        limit: Duration,
    ) -> Result<Turn> {
        let until = tokio::time::Instant::from_std(started + limit);
        let mine = tokio::time::timeout_at(until, Arc::clone(&self.0).acquire_owned());
        let Ok(Ok(mine)) = mine.await else {
            return Err(throttle::timed_out(limit));
        };
        let any = tokio::time::timeout_at(until, Arc::clone(&broker.0).acquire_owned());
        let Ok(Ok(any)) = any.await else {
            return Err(throttle::timed_out(limit));
        };
        Ok(Turn {
            _mine: mine,
            _any: any,
        })
    }
}

//! Per-session rate limits (governor) and per-operation deadlines.
//!
//! Requests per second: over the rate, a request is refused at once with `RATE_LIMITED` and
//! `data.retryAfterMs`, governor's own wait time rounded up, so waiting that long and retrying
//! succeeds. `ping` is never limited.
//!
//! Payload bytes per second are counted in KiB (rounded up): governor's per-cell interval is a
//! whole number of nanoseconds, so one cell per byte could not express rates above ~1 GB/s and
//! is inexact well before. A payload larger than the burst is admitted piece by piece: the first
//! burst-sized piece must fit now (else `RATE_LIMITED`), the rest is waited for — so a large
//! chunk is slowed to the rate, never refused forever with `InsufficientCapacity`.
//!
//! What is read from the disk (`files/read`, `files/checksum`) is charged before the work:
//! its first KiB must fit now (else `RATE_LIMITED`, and nothing is read), and the rest is
//! paid as it is read, waiting, never refused. A refusal after the work would charge
//! nothing for it, and a server asking again at once would read the disk at any rate.
//!
//! That wait happens on the async side, before the work takes a slot of the blocking pool
//! ([`Prepaid`]): a session waiting out its own rate must not hold pool threads the other
//! sessions need. The work then pays on its thread only for bytes beyond what was paid
//! ahead (a file that grew in between), which is rare and short.

use std::cell::Cell;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use crate::error::{Error, ErrorKind, Result};
use crate::policy::Limits;

/// The broker's rate limiters, keyed by session.
#[derive(Debug)]
pub(crate) struct RateLimits {
    requests: Option<DefaultKeyedRateLimiter<u64>>,
    bytes: Option<(DefaultKeyedRateLimiter<u64>, NonZeroU32)>,
    clock: DefaultClock,
}

impl RateLimits {
    /// Limiters for `limits` (a rate of 0 is unlimited).
    pub(crate) fn new(limits: &Limits) -> RateLimits {
        let requests = NonZeroU32::new(limits.requests_per_second).map(|rate| {
            let burst = NonZeroU32::new(limits.request_burst).unwrap_or(rate);
            DefaultKeyedRateLimiter::keyed(Quota::per_second(rate).allow_burst(burst))
        });
        let bytes = (limits.bytes_per_second > 0).then(|| {
            let kib = limits
                .bytes_per_second
                .div_ceil(1024)
                .min(u64::from(u32::MAX)) as u32;
            let kib = NonZeroU32::new(kib).unwrap_or(NonZeroU32::MIN);
            (DefaultKeyedRateLimiter::keyed(Quota::per_second(kib)), kib)
        });
        RateLimits {
            requests,
            bytes,
            clock: DefaultClock::default(),
        }
    }

    /// Admits one request of `session`, or says when to retry.
    pub(crate) fn check_request(&self, session: u64) -> Result<()> {
        let Some(limiter) = &self.requests else {
            return Ok(());
        };
        limiter.check_key(&session).map_err(|not_until| {
            Error::rate_limited("request", not_until.wait_time_from(self.clock.now()))
        })
    }

    /// Admits `bytes` of payload for `session`: the first burst-sized piece now or
    /// `RATE_LIMITED`, the rest waited for.
    pub(crate) async fn admit_bytes(&self, session: u64, bytes: u64) -> Result<()> {
        let mut kib = bytes.div_ceil(1024);
        let mut first = true;
        while kib > 0 {
            match self.pay_piece(session, &mut kib) {
                Some(wait) if first => return Err(Error::rate_limited("payload bytes", wait)),
                Some(wait) => tokio::time::sleep(wait).await,
                None => first = false,
            }
        }
        Ok(())
    }

    /// Takes 1 KiB of `session`'s byte budget now, or `RATE_LIMITED` (with the honest wait):
    /// asked before a read's disk work, so a session whose budget is spent reads nothing at
    /// all. What the work then reads is paid with [`RateLimits::pay`] or
    /// [`RateLimits::pay_blocking`], waiting, never refused: a refusal after the work would
    /// charge nothing for work done, and a server could ask again at once.
    pub(crate) fn admit_start(&self, session: u64) -> Result<()> {
        let Some((limiter, _)) = &self.bytes else {
            return Ok(());
        };
        limiter.check_key(&session).map_err(|not_until| {
            Error::rate_limited("payload bytes", not_until.wait_time_from(self.clock.now()))
        })
    }

    /// Whether `bytes_per_second` limits anything (unlimited, nothing is ever owed).
    pub(crate) fn limits_bytes(&self) -> bool {
        self.bytes.is_some()
    }

    /// Pays `bytes` from `session`'s budget, a burst-sized piece at a time, waiting as long
    /// as that takes (the caller bounds the wait).
    pub(crate) async fn pay(&self, session: u64, bytes: u64) {
        let mut kib = bytes.div_ceil(1024);
        while kib > 0 {
            if let Some(wait) = self.pay_piece(session, &mut kib) {
                tokio::time::sleep(wait).await;
            }
        }
    }

    /// [`RateLimits::pay`] on a blocking thread, for as long as `go_on()`: whether it was
    /// paid. Paces work that reads as it goes (a checksum of a large file), in short sleeps
    /// so that a deadline is seen soon after it passes.
    pub(crate) fn pay_blocking(&self, session: u64, bytes: u64, go_on: impl Fn() -> bool) -> bool {
        let mut kib = bytes.div_ceil(1024);
        while kib > 0 {
            if let Some(wait) = self.pay_piece(session, &mut kib) {
                if !go_on() {
                    return false;
                }
                std::thread::sleep(wait.min(Duration::from_millis(50)));
            }
        }
        true
    }

    /// Pays one burst-sized piece of the `kib` left (taking it off), or says how long until
    /// it can be paid. Unlimited, everything is paid at once.
    fn pay_piece(&self, session: u64, kib: &mut u64) -> Option<Duration> {
        let Some((limiter, burst)) = &self.bytes else {
            *kib = 0;
            return None;
        };
        let piece = (*kib).min(u64::from(burst.get())) as u32;
        let n = NonZeroU32::new(piece).unwrap_or(NonZeroU32::MIN);
        match limiter.check_key_n(&session, n) {
            Ok(Ok(())) => *kib -= u64::from(piece),
            Ok(Err(not_until)) => return Some(not_until.wait_time_from(self.clock.now())),
            // `piece` never exceeds the burst, so capacity is always sufficient.
            Err(_) => *kib = 0,
        }
        None
    }

    /// Drops the state of sessions that have been idle long enough to be back at a full
    /// bucket: they are indistinguishable from new keys.
    pub(crate) fn prune(&self) {
        if let Some(l) = &self.requests {
            l.retain_recent();
            l.shrink_to_fit();
        }
        if let Some((l, _)) = &self.bytes {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }
}

/// Bytes a request paid on the async side before its blocking work (`methods::op::prepay`),
/// and how the work pays for what it reads beyond them. Moves with the work to its thread.
#[derive(Debug)]
pub(crate) struct Prepaid {
    rate: Arc<RateLimits>,
    session: u64,
    left: Cell<u64>,
}

impl Prepaid {
    /// `paid` bytes of `session` paid ahead under `rate`.
    pub(crate) fn new(rate: Arc<RateLimits>, session: u64, paid: u64) -> Prepaid {
        Prepaid {
            rate,
            session,
            left: Cell::new(paid),
        }
    }

    /// Pays for `bytes` the work is about to read: from what was paid ahead first, the rest
    /// on this thread, waiting while `go_on()` (whether it was paid).
    pub(crate) fn pay(&self, bytes: u64, go_on: impl Fn() -> bool) -> bool {
        let ahead = bytes.min(self.left.get());
        self.left.set(self.left.get() - ahead);
        let rest = bytes - ahead;
        rest == 0 || self.rate.pay_blocking(self.session, rest, go_on)
    }

    /// Whether `bytes` are paid for already, or cost nothing (no byte rate): work that
    /// would otherwise wait on its thread hands the payment back to the async side instead.
    pub(crate) fn covers(&self, bytes: u64) -> bool {
        !self.rate.limits_bytes() || bytes <= self.left.get()
    }
}

/// Where an operation stands with respect to its deadline. The commit of a mutation and the
/// timeout race for one atomic transition, so a `TIMEOUT` answer always means "not done".
#[derive(Debug, Default)]
pub(crate) struct Deadline(AtomicU8);

const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const TIMED_OUT: u8 = 2;

impl Deadline {
    /// Called by the operation just before its point of no return (a rename, a grant).
    /// Fails with `TIMEOUT` when the deadline already passed; the caller then rolls back.
    pub(crate) fn commit(&self, timeout: Duration) -> Result<()> {
        match self
            .0
            .compare_exchange(RUNNING, COMMITTING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(COMMITTING) => Ok(()),
            Err(_) => Err(timed_out(timeout)),
        }
    }

    /// Called by the waiting side when the deadline passes: `true` when the operation had
    /// not reached its commit (it will roll back), `false` when it is committing (the caller
    /// must wait for its result instead of reporting a timeout).
    pub(crate) fn expire(&self) -> bool {
        match self
            .0
            .compare_exchange(RUNNING, TIMED_OUT, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(TIMED_OUT) => true,
            Err(_) => false,
        }
    }

    /// Whether the operation should stop early (long walks check this).
    pub(crate) fn expired(&self) -> bool {
        self.0.load(Ordering::Acquire) == TIMED_OUT
    }
}

/// The `TIMEOUT` error.
pub(crate) fn timed_out(limit: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!(
            "the operation ran past timeout_ms ({} ms)",
            limit.as_millis()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rps: u32, burst: u32, bps: u64) -> Limits {
        Limits {
            requests_per_second: rps,
            request_burst: burst,
            bytes_per_second: bps,
            ..Limits::default()
        }
    }

    #[test]
    fn requests_over_the_burst_are_refused_with_an_honest_wait() {
        let r = RateLimits::new(&limits(10, 2, 0));
        r.check_request(1).unwrap();
        r.check_request(1).unwrap();
        let e = r.check_request(1).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RateLimited);
        let wait = e.retry_after_ms().unwrap();
        assert!((1..=100).contains(&wait), "{wait}");
        // Another session has its own bucket.
        r.check_request(2).unwrap();
        std::thread::sleep(Duration::from_millis(wait));
        r.check_request(1).unwrap();
    }

    #[test]
    fn unlimited_is_unlimited() {
        let r = RateLimits::new(&limits(0, 0, 0));
        for _ in 0..10_000 {
            r.check_request(1).unwrap();
        }
    }

    #[tokio::test]
    async fn bytes_larger_than_the_burst_are_split_not_refused() {
        // 64 KiB/s; a 100 KiB payload is more than one second's burst.
        let r = RateLimits::new(&limits(0, 0, 64 * 1024));
        let started = std::time::Instant::now();
        r.admit_bytes(1, 100 * 1024).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
        // The bucket is now empty: the next payload is refused with a wait.
        let e = r.admit_bytes(1, 1024).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RateLimited);
    }

    #[test]
    fn commit_and_timeout_race_for_one_outcome() {
        let d = Deadline::default();
        d.commit(Duration::from_secs(1)).unwrap();
        assert!(!d.expire(), "a committing operation is not timed out");
        let d = Deadline::default();
        assert!(d.expire());
        assert!(d.expired());
        assert_eq!(
            d.commit(Duration::from_secs(1)).unwrap_err().kind(),
            ErrorKind::Timeout
        );
    }
}

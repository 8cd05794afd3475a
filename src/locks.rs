//! Path locks shared by every session of a broker (SEP-1708).
//!
//! A mutation holds an exclusive lock on its path while it runs; a read holds a shared one, so
//! readers never refuse readers. `keepLocked` turns an exclusive lock into a *kept* lock that
//! outlives the operation, named by an unguessable id that only its session can use. A session
//! never conflicts with itself: locks coordinate servers, and one server's own concurrent
//! requests are already ordered by the atomic replace.
//!
//! Locks cover subtrees: an exclusive lock on a directory conflicts with any lock beneath it,
//! and a lock on a file conflicts with an exclusive lock on any of its ancestors — deleting or
//! renaming `a/` must not pull a locked `a/b` away from its holder.
//!
//! Keys are absolute canonical paths (root path joined with the real relative path) used only
//! as names, never opened, so two roots that nest agree on one file's key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};

/// Shared or exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// Readers: any number, from any session.
    Shared,
    /// Writers and kept locks: one session.
    Exclusive,
}

#[derive(Debug)]
struct Hold {
    session: u64,
    mode: LockMode,
    /// How many running operations of `session` hold it (kept locks count as one).
    count: u32,
}

#[derive(Debug)]
struct Kept {
    key: PathBuf,
    session: u64,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Table {
    holds: HashMap<PathBuf, Vec<Hold>>,
    kept: HashMap<String, Kept>,
}

/// The broker's lock table.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    table: Mutex<Table>,
}

/// An operation's lock; released when dropped.
#[derive(Debug)]
pub(crate) struct LockGuard {
    table: Arc<LockTable>,
    key: PathBuf,
    session: u64,
    mode: LockMode,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let mut t = self.table.lock();
        t.release(&self.key, self.session, self.mode);
    }
}

impl LockTable {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table is consistent after every statement that mutates it, so a panic while
        // it was held leaves nothing half-done.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a lock for the length of an operation, or fails at once with `FILE_LOCKED`
    /// (naming `raw`, the request path, never the holder or its lock id).
    pub(crate) fn acquire(
        self: &Arc<Self>,
        key: PathBuf,
        session: u64,
        mode: LockMode,
        raw: &str,
    ) -> Result<LockGuard> {
        let mut t = self.lock();
        t.expire(Instant::now());
        if t.conflicts(&key, session, mode) {
            return Err(locked(raw));
        }
        t.add(&key, session, mode);
        Ok(LockGuard {
            table: Arc::clone(self),
            key,
            session,
            mode,
        })
    }

    /// Keeps an exclusive lock on `key` for `session` beyond the operation that holds `guard`
    /// (which must be an exclusive guard on the same key), for `ttl`. Returns the lock id; a
    /// session that already keeps this path gets its existing id back, with a fresh expiry.
    pub(crate) fn keep(
        &self,
        guard: &LockGuard,
        ttl: Duration,
        max_per_session: u32,
        raw: &str,
    ) -> Result<String> {
        debug_assert_eq!(guard.mode, LockMode::Exclusive);
        let mut t = self.lock();
        let expires = Instant::now() + ttl;
        if let Some((id, kept)) = t
            .kept
            .iter_mut()
            .find(|(_, k)| k.key == guard.key && k.session == guard.session)
        {
            kept.expires = expires;
            return Ok(id.clone());
        }
        let mine = t
            .kept
            .values()
            .filter(|k| k.session == guard.session)
            .count();
        if mine >= max_per_session as usize {
            return Err(quota(mine, raw));
        }
        let id = new_lock_id();
        t.add(&guard.key, guard.session, LockMode::Exclusive);
        t.kept.insert(
            id.clone(),
            Kept {
                key: guard.key.clone(),
                session: guard.session,
                expires,
            },
        );
        Ok(id)
    }

    /// Fails with `QUOTA_EXCEEDED` when `session` already keeps `max_per_session` locks, so
    /// a request that would be refused a kept lock is refused before it does any work.
    pub(crate) fn check_keep_quota(
        &self,
        session: u64,
        max_per_session: u32,
        raw: &str,
    ) -> Result<()> {
        let mut t = self.lock();
        t.expire(Instant::now());
        let mine = t.kept.values().filter(|k| k.session == session).count();
        if mine >= max_per_session as usize {
            return Err(quota(mine, raw));
        }
        Ok(())
    }

    /// Releases a kept lock of `session`. Unknown ids and other sessions' ids give the same
    /// answer, so a session cannot probe for locks it does not own.
    pub(crate) fn unlock(&self, id: &str, session: u64) -> Result<()> {
        let mut t = self.lock();
        t.expire(Instant::now());
        match t.kept.get(id) {
            Some(k) if k.session == session => {
                if let Some(k) = t.kept.remove(id) {
                    t.release(&k.key, session, LockMode::Exclusive);
                }
                Ok(())
            }
            _ => Err(Error::invalid_params(
                "no kept lock with this lockId in this session",
            )),
        }
    }

    /// Releases every kept lock on a path under `root` (a revoked root or grant) but not under
    /// one of `spared` (roots nested in it that stay in force): of any session, or only of
    /// `only`.
    pub(crate) fn release_under(&self, root: &Path, spared: &[PathBuf], only: Option<u64>) {
        let mut t = self.lock();
        let ids: Vec<String> = t
            .kept
            .iter()
            .filter(|(_, k)| {
                k.key.starts_with(root)
                    && !spared.iter().any(|s| k.key.starts_with(s))
                    && only.is_none_or(|s| s == k.session)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(k) = t.kept.remove(&id) {
                t.release(&k.key, k.session, LockMode::Exclusive);
            }
        }
    }

    /// Releases every kept lock of a session that has ended.
    pub(crate) fn release_session(&self, session: u64) {
        let mut t = self.lock();
        let ids: Vec<String> = t
            .kept
            .iter()
            .filter(|(_, k)| k.session == session)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(k) = t.kept.remove(&id) {
                t.release(&k.key, session, LockMode::Exclusive);
            }
        }
    }

    /// The number of kept locks `session` holds (expired ones are dropped first).
    pub(crate) fn kept_by(&self, session: u64) -> usize {
        let mut t = self.lock();
        t.expire(Instant::now());
        t.kept.values().filter(|k| k.session == session).count()
    }

    #[cfg(test)]
    /// The number of kept locks still in force (expired ones are dropped first).
    pub(crate) fn kept_count(&self) -> usize {
        let mut t = self.lock();
        t.expire(Instant::now());
        t.kept.len()
    }
}

impl Table {
    fn conflicts(&self, key: &Path, session: u64, mode: LockMode) -> bool {
        let other_blocks = |holds: &Vec<Hold>, need_exclusive_holder: bool| {
            holds.iter().any(|h| {
                h.session != session
                    && (!need_exclusive_holder || h.mode == LockMode::Exclusive)
                    && (mode == LockMode::Exclusive || h.mode == LockMode::Exclusive)
            })
        };
        // The path itself.
        if self.holds.get(key).is_some_and(|h| other_blocks(h, false)) {
            return true;
        }
        // Ancestors held exclusively (a kept lock on a directory covers its subtree).
        if key
            .ancestors()
            .skip(1)
            .any(|a| self.holds.get(a).is_some_and(|h| other_blocks(h, true)))
        {
            return true;
        }
        // Descendants, for an exclusive operation on a directory.
        mode == LockMode::Exclusive
            && self
                .holds
                .iter()
                .any(|(k, h)| k != key && k.starts_with(key) && other_blocks(h, false))
    }

    fn add(&mut self, key: &Path, session: u64, mode: LockMode) {
        let holds = self.holds.entry(key.to_path_buf()).or_default();
        match holds
            .iter_mut()
            .find(|h| h.session == session && h.mode == mode)
        {
            Some(h) => h.count += 1,
            None => holds.push(Hold {
                session,
                mode,
                count: 1,
            }),
        }
    }

    fn release(&mut self, key: &Path, session: u64, mode: LockMode) {
        let Some(holds) = self.holds.get_mut(key) else {
            return;
        };
        if let Some(i) = holds
            .iter()
            .position(|h| h.session == session && h.mode == mode)
        {
            holds[i].count -= 1;
            if holds[i].count == 0 {
                holds.swap_remove(i);
            }
        }
        if holds.is_empty() {
            self.holds.remove(key);
        }
    }

    fn expire(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .kept
            .iter()
            .filter(|(_, k)| k.expires <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            if let Some(k) = self.kept.remove(&id) {
                tracing::info!(session = k.session, path = %k.key.display(), "kept lock expired");
                self.release(&k.key, k.session, LockMode::Exclusive);
            }
        }
    }
}

fn quota(kept: usize, raw: &str) -> Error {
    Error::new(
        ErrorKind::QuotaExceeded,
        format!("this session already keeps {kept} locks (max_locks)"),
    )
    .with_path(raw)
}

fn locked(raw: &str) -> Error {
    Error::new(ErrorKind::FileLocked, "locked by another session or upload").with_path(raw)
}

/// 128 random bits from the OS, as hex.
fn new_lock_id() -> String {
    crate::random::hex(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn readers_share_writers_exclude_other_sessions() {
        let t = Arc::new(LockTable::default());
        let r1 = t.acquire(key("/r/a"), 1, LockMode::Shared, "a").unwrap();
        let _r2 = t.acquire(key("/r/a"), 2, LockMode::Shared, "a").unwrap();
        let e = t
            .acquire(key("/r/a"), 3, LockMode::Exclusive, "a")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FileLocked);
        // A session never conflicts with itself.
        let _w1 = t.acquire(key("/r/a"), 1, LockMode::Exclusive, "a");
        drop(r1);
    }

    #[test]
    fn subtrees_are_covered() {
        let t = Arc::new(LockTable::default());
        let w = t
            .acquire(key("/r/d/f"), 1, LockMode::Shared, "d/f")
            .unwrap();
        assert!(t.acquire(key("/r/d"), 2, LockMode::Exclusive, "d").is_err());
        assert!(t.acquire(key("/r/d"), 2, LockMode::Shared, "d").is_ok());
        drop(w);
        let d = t.acquire(key("/r/d"), 1, LockMode::Exclusive, "d").unwrap();
        assert!(
            t.acquire(key("/r/d/f"), 2, LockMode::Shared, "d/f")
                .is_err()
        );
        assert!(
            t.acquire(key("/r/dx"), 2, LockMode::Exclusive, "dx")
                .is_ok()
        );
        drop(d);
        assert!(
            t.acquire(key("/r/d/f"), 2, LockMode::Exclusive, "d/f")
                .is_ok()
        );
    }

    #[test]
    fn kept_locks_outlive_the_guard_and_end_by_unlock_session_or_time() {
        let t = Arc::new(LockTable::default());
        let g = t.acquire(key("/r/a"), 1, LockMode::Exclusive, "a").unwrap();
        let id = t.keep(&g, Duration::from_secs(60), 8, "a").unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(t.keep(&g, Duration::from_secs(60), 8, "a").unwrap(), id);
        drop(g);
        assert!(t.acquire(key("/r/a"), 2, LockMode::Shared, "a").is_err());
        assert!(t.unlock(&id, 2).is_err(), "another session cannot unlock");
        t.unlock(&id, 1).unwrap();
        assert!(t.acquire(key("/r/a"), 2, LockMode::Shared, "a").is_ok());

        let g = t.acquire(key("/r/b"), 1, LockMode::Exclusive, "b").unwrap();
        t.keep(&g, Duration::from_secs(60), 8, "b").unwrap();
        drop(g);
        t.release_session(1);
        assert!(t.acquire(key("/r/b"), 2, LockMode::Exclusive, "b").is_ok());

        let g = t.acquire(key("/r/c"), 1, LockMode::Exclusive, "c").unwrap();
        t.keep(&g, Duration::from_millis(0), 8, "c").unwrap();
        drop(g);
        assert!(t.acquire(key("/r/c"), 2, LockMode::Exclusive, "c").is_ok());
        assert_eq!(t.kept_count(), 0);
    }

    #[test]
    fn max_locks_is_a_quota() {
        let t = Arc::new(LockTable::default());
        let g = t.acquire(key("/r/a"), 1, LockMode::Exclusive, "a").unwrap();
        t.keep(&g, Duration::from_secs(60), 1, "a").unwrap();
        let g2 = t.acquire(key("/r/b"), 1, LockMode::Exclusive, "b").unwrap();
        let e = t.keep(&g2, Duration::from_secs(60), 1, "b").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::QuotaExceeded);
    }
}

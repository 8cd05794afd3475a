//! Chunked uploads: a sequence of `files/write` calls with `offset`, staged beside the target
//! and committed atomically by the `final` chunk.
//!
//! Once the first chunk (offset 0) has been answered, the rest may be sent without waiting for
//! each answer. A chunk that arrives ahead of its turn waits for the ones before it — without
//! a thread: it waits on the session's progress before it asks for a slot of the blocking
//! pool (`methods/write/chunk.rs`), and only while a request that arrived before it is unanswered
//! (one that could be the chunk it needs), up to `timeout_ms`. Chunks sent in order therefore
//! land in order however many are in flight, and a chunk whose predecessor will never come is
//! answered `CONCURRENCY_CONFLICT` at once.
//!
//! An upload holds an exclusive lock on its path from its first chunk to its commit, so other
//! sessions see `FILE_LOCKED` rather than a half-built file. Unfinished uploads are bounded per
//! session (`max_uploads`, and together with kept locks `max_locks`), and one left idle for
//! `lock_timeout_ms` is abandoned like an expired kept lock. Its staging file is removed
//! whenever the upload ends without a commit: an error, a quota, a restart at offset 0, idling
//! out, or the session ending (the map is dropped with the session).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::locks::LockGuard;
use crate::sandbox::mutate::{Parent, Staged};

/// One upload in progress.
#[derive(Debug)]
pub(crate) struct Upload {
    /// Where it will land.
    pub parent: Parent,
    /// The staging file.
    pub staged: Staged,
    /// Bytes staged so far: the `offset` the next chunk must carry.
    pub written: u64,
    /// Permission bits the committed file gets.
    pub mode: u32,
    /// The first chunk's `ifMatch`, checked again at the commit: the precondition is the
    /// upload's, not only its first chunk's.
    pub if_match: Option<String>,
    /// Held until the upload ends.
    pub lock: LockGuard,
    /// The SHA-256 of what is staged so far, kept when the first chunk announced a `sha256`
    /// (*ext*): the final chunk's is then checked without reading the staged bytes again.
    /// Apart from the upload's own lock, so that a chunk is hashed while the next is written
    /// (see [`Hasher`]).
    pub hasher: Option<Hasher>,
}

/// A slot for an upload; `None` once it committed or was aborted, so a chunk that raced with
/// the end of its upload sees that instead of writing into a finished one.
pub(crate) type Slot = Arc<SlotInner>;

/// An upload, and what a chunk waiting for its turn can see of it without locking it.
#[derive(Debug)]
pub(crate) struct SlotInner {
    upload: Mutex<Option<Upload>>,
    /// Bytes staged so far (a copy of `Upload::written`, kept as chunks land).
    written: AtomicU64,
    ended: AtomicBool,
    /// When a chunk last arrived or landed, in milliseconds since `born`.
    touched_ms: AtomicU64,
    born: Instant,
    progress: Arc<tokio::sync::watch::Sender<u64>>,
}

impl SlotInner {
    fn new(upload: Upload, progress: Arc<tokio::sync::watch::Sender<u64>>) -> SlotInner {
        SlotInner {
            written: AtomicU64::new(upload.written),
            upload: Mutex::new(Some(upload)),
            ended: AtomicBool::new(false),
            touched_ms: AtomicU64::new(0),
            born: Instant::now(),
            progress,
        }
    }

    /// Records that a chunk landed: the upload now holds `written` bytes. Wakes the chunks
    /// waiting for their turn.
    pub(crate) fn landed(&self, written: u64) {
        self.written.store(written, Ordering::Release);
        self.touch();
        self.progress.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Bytes staged so far.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Whether the upload has ended (committed or aborted).
    pub(crate) fn ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Marks the upload as in use now (it is not idle).
    pub(crate) fn touch(&self) {
        let ms = self.born.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
        self.touched_ms.store(ms, Ordering::Release);
    }

    fn idle_for(&self) -> Duration {
        let touched = Duration::from_millis(self.touched_ms.load(Ordering::Acquire));
        self.born.elapsed().saturating_sub(touched)
    }
}

/// A session's uploads, by lock key (the canonical target path), and the path spellings
/// their chunks use (so a chunk can find its upload without touching the file system).
#[derive(Debug, Clone)]
pub(crate) struct Uploads {
    map: Arc<Mutex<Map>>,
    progress: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct Map {
    by_key: HashMap<PathBuf, Slot>,
    /// Request path as spelled by the chunk that started the upload → its key.
    by_spelling: HashMap<String, PathBuf>,
}

impl Uploads {
    /// No uploads; `progress` is bumped whenever one moves or ends.
    pub(crate) fn new(progress: Arc<tokio::sync::watch::Sender<u64>>) -> Uploads {
        Uploads {
            map: Arc::default(),
            progress,
        }
    }

    fn map(&self) -> MutexGuard<'_, Map> {
        // Every mutation of the map is a few inserts or removes that cannot panic half-way.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails with `QUOTA_EXCEEDED` unless the session may start one more upload at `key`
    /// (one at `key` already is replaced, so it does not count): at most `max` uploads.
    pub(crate) fn check_room(&self, key: &Path, max: usize, raw: &str) -> Result<()> {
        let map = self.map();
        let others = map.by_key.len() - usize::from(map.by_key.contains_key(key));
        if others >= max {
            return Err(Error::new(
                ErrorKind::QuotaExceeded,
                format!("this session already has {others} unfinished uploads (max_uploads)"),
            )
            .with_path(raw));
        }
        Ok(())
    }

    /// Starts an upload, replacing (and so aborting) any earlier one at the same key; fails
    /// with `QUOTA_EXCEEDED` (dropping `upload`, and with it its staging file and lock) when the
    /// session already has `max` others.
    pub(crate) fn start(
        &self,
        key: PathBuf,
        spelling: &str,
        upload: Upload,
        max: usize,
        raw: &str,
    ) -> Result<Slot> {
        let slot: Slot = Arc::new(SlotInner::new(upload, Arc::clone(&self.progress)));
        let old = {
            let mut map = self.map();
            let others = map.by_key.len() - usize::from(map.by_key.contains_key(&key));
            if others >= max {
                drop(map);
                return Err(Error::new(
                    ErrorKind::QuotaExceeded,
                    format!("this session already has {others} unfinished uploads (max_uploads)"),
                )
                .with_path(raw));
            }
            map.by_spelling.insert(spelling.to_owned(), key.clone());
            map.by_key.insert(key, Arc::clone(&slot))
        };
        if let Some(old) = old {
            self.abort(old);
        }
        self.progress.send_modify(|n| *n = n.wrapping_add(1));
        Ok(slot)
    }

    /// The upload at `key`, if one is in progress.
    pub(crate) fn get(&self, key: &Path) -> Option<Slot> {
        self.map().by_key.get(key).cloned()
    }

    /// The upload started with the request path `spelling`, if one is in progress.
    pub(crate) fn by_spelling(&self, spelling: &str) -> Option<Slot> {
        let map = self.map();
        let key = map.by_spelling.get(spelling)?;
        map.by_key.get(key).cloned()
    }

    /// Ends the upload at `key` (its staging file goes with it unless already committed).
    pub(crate) fn end(&self, key: &Path) {
        let old = {
            let mut map = self.map();
            let old = map.by_key.remove(key);
            map.by_spelling.retain(|_, k| k != key);
            old
        };
        if let Some(old) = old {
            self.abort(old);
        }
    }

    /// Ends the upload at `key` if it is still `slot` (a restart at offset 0 may have replaced
    /// it meanwhile; that one goes on).
    pub(crate) fn end_slot(&self, key: &Path, slot: &Slot) {
        let old = {
            let mut map = self.map();
            if !map.by_key.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
                None
            } else {
                map.by_spelling.retain(|_, k| k != key);
                map.by_key.remove(key)
            }
        };
        if let Some(old) = old {
            self.abort(old);
        }
    }

    /// Ends every upload whose target lies under `root` (a root being revoked) but not under
    /// one of `spared` (roots nested in it that stay).
    pub(crate) fn end_under(&self, root: &Path, spared: &[PathBuf]) {
        self.end_where(|k, _| k.starts_with(root) && !spared.iter().any(|s| k.starts_with(s)));
    }

    /// Abandons the uploads no chunk has touched for `idle` (`lock_timeout_ms`): their
    /// locks are released and their staging files removed. Returns how many.
    pub(crate) fn reap(&self, idle: Duration) -> usize {
        self.end_where(|_, slot| slot.idle_for() >= idle)
    }

    fn end_where(&self, gone: impl Fn(&Path, &Slot) -> bool) -> usize {
        let ended: Vec<Slot> = {
            let mut map = self.map();
            let keys: Vec<PathBuf> = map
                .by_key
                .iter()
                .filter(|(k, slot)| gone(k, slot))
                .map(|(k, _)| k.clone())
                .collect();
            let ended = keys.iter().filter_map(|k| map.by_key.remove(k)).collect();
            map.by_spelling.retain(|_, k| !keys.contains(k));
            ended
        };
        let n = ended.len();
        ended.into_iter().for_each(|slot| self.abort(slot));
        n
    }

    /// Ends every upload (the session is over).
    pub(crate) fn clear(&self) {
        self.end_where(|_, _| true);
    }

    /// How many uploads are in progress.
    pub(crate) fn len(&self) -> usize {
        self.map().by_key.len()
    }

    /// Empties a slot so a chunk holding a clone of it finds the upload gone.
    fn abort(&self, slot: Slot) {
        let mut guard = lock(&slot);
        drop(guard.take());
        slot.ended.store(true, Ordering::Release);
        drop(guard);
        self.progress.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Locks a slot for one chunk.
pub(crate) fn lock(slot: &Slot) -> MutexGuard<'_, Option<Upload>> {
    slot.upload.lock().unwrap_or_else(|e| e.into_inner())
}

/// An upload's running SHA-256.
///
/// A chunk takes it before it lets the upload go, and hashes its bytes after: the next chunk
/// cannot write before the upload is let go, so it finds the hash taken and waits for it only
/// once it has written. The hash follows the chunks' order, and the hashing of one chunk runs
/// beside the writing of the next instead of on the one path chunks take in turn.
#[derive(Debug, Clone, Default)]
pub(crate) struct Hasher(Arc<Mutex<sha2::Sha256>>);

impl Hasher {
    /// Takes the hash (waiting for the chunk before to finish hashing).
    pub(crate) fn take(&self) -> MutexGuard<'_, sha2::Sha256> {
        // An update cannot panic half-way.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

//! Chunked uploads: a sequence of `files/write` calls with `offset`, staged beside the target
//! and committed atomically by the `final` chunk.
//!
//! Once the first chunk (offset 0) has been answered, the rest may be sent without waiting for
//! each answer: a chunk that arrives ahead of its turn waits for the ones before it (up to
//! `timeout_ms`, and only while another request of the session is in progress), so the
//! client's sending overlaps the broker's writing.
//!
//! An upload holds an exclusive lock on its path from its first chunk to its commit, so other
//! sessions see `FILE_LOCKED` rather than a half-built file, and its staging file is removed
//! whenever the upload ends without a commit: an error, a quota, a restart at offset 0, or the
//! session ending (the map is dropped with the session).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::locks::LockGuard;
use crate::sandbox::mutate::{Parent, Staged};

/// One upload in progress.
#[derive(Debug)]
pub struct Upload {
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
}

/// A slot for an upload; `None` once it committed or was aborted, so a chunk that raced with
/// the end of its upload sees that instead of writing into a finished one.
pub type Slot = Arc<SlotInner>;

/// An upload and the signal its chunks wait on for their turn.
#[derive(Debug)]
pub struct SlotInner {
    upload: Mutex<Option<Upload>>,
    /// Raised whenever a chunk lands or the upload ends.
    moved: Condvar,
}

impl SlotInner {
    fn new(upload: Upload) -> SlotInner {
        SlotInner {
            upload: Mutex::new(Some(upload)),
            moved: Condvar::new(),
        }
    }

    /// Wakes the chunks waiting for their turn (a chunk landed, or the upload ended).
    pub fn moved(&self) {
        self.moved.notify_all();
    }
}

/// A session's uploads, by lock key (the canonical target path).
#[derive(Debug, Default, Clone)]
pub struct Uploads {
    map: Arc<Mutex<HashMap<PathBuf, Slot>>>,
}

impl Uploads {
    fn map(&self) -> MutexGuard<'_, HashMap<PathBuf, Slot>> {
        // Every mutation of the map is a single insert or remove: never half-done.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts an upload, replacing (and so aborting) any earlier one at the same key.
    pub fn start(&self, key: PathBuf, upload: Upload) -> Slot {
        let slot: Slot = Arc::new(SlotInner::new(upload));
        let old = self.map().insert(key, Arc::clone(&slot));
        if let Some(old) = old {
            abort(old);
        }
        slot
    }

    /// The upload at `key`, if one is in progress.
    pub fn get(&self, key: &Path) -> Option<Slot> {
        self.map().get(key).cloned()
    }

    /// Ends the upload at `key` (its staging file goes with it unless already committed).
    pub fn end(&self, key: &Path) {
        let old = self.map().remove(key);
        if let Some(old) = old {
            abort(old);
        }
    }

    /// Ends every upload whose target lies under `root` (a root being revoked) but not under
    /// one of `spared` (roots nested in it that stay).
    pub fn end_under(&self, root: &Path, spared: &[PathBuf]) {
        let gone: Vec<Slot> = {
            let mut map = self.map();
            let keys: Vec<PathBuf> = map
                .keys()
                .filter(|k| k.starts_with(root) && !spared.iter().any(|s| k.starts_with(s)))
                .cloned()
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        gone.into_iter().for_each(abort);
    }

    /// Ends every upload (the session is over).
    pub fn clear(&self) {
        let gone: Vec<Slot> = self.map().drain().map(|(_, slot)| slot).collect();
        gone.into_iter().for_each(abort);
    }

    /// How many uploads are in progress.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no upload is in progress.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Empties a slot so a chunk holding a clone of it finds the upload gone.
fn abort(slot: Slot) {
    let mut guard = lock(&slot);
    drop(guard.take());
    drop(guard);
    slot.moved();
}

/// Locks a slot for one chunk.
pub fn lock(slot: &Slot) -> MutexGuard<'_, Option<Upload>> {
    slot.upload.lock().unwrap_or_else(|e| e.into_inner())
}

/// Locks a slot for the chunk at `offset`, first waiting (until `deadline`) while chunks
/// before it may still land: a client may send an upload's chunks without waiting for each
/// answer, and the broker, which runs requests concurrently, still writes them in order.
///
/// It waits only while `others_busy()` says another request of the session is in progress
/// (one that could be the missing chunk); a chunk ahead of its upload with nothing in flight to
/// fill the gap is answered at once. Returns when it is this chunk's turn, the upload has
/// ended, or waiting is pointless; the caller then checks the offset.
pub fn lock_turn(
    slot: &Slot,
    offset: u64,
    deadline: Instant,
    others_busy: impl Fn() -> bool,
) -> MutexGuard<'_, Option<Upload>> {
    // Short waits, so a predecessor that fails for a reason that never touches this slot is
    // noticed through `others_busy` soon after.
    const POLL: std::time::Duration = std::time::Duration::from_millis(5);
    let mut guard = lock(slot);
    loop {
        let ahead = guard.as_ref().is_some_and(|up| up.written < offset);
        let now = Instant::now();
        if !ahead || now >= deadline || !others_busy() {
            return guard;
        }
        guard = slot
            .moved
            .wait_timeout(guard, POLL.min(deadline - now))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

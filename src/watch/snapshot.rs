//! What a watched tree looked like, so a rescan can report what changed.
//!
//! notify's queue can overflow (`need_rescan`) and a server that stops reading can make the
//! broker drop notifications; either way, walking the tree again and comparing it with the
//! last known state reports every difference, so nothing is lost silently.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, Metadata};

use crate::limits::{MAX_ENTRIES, MAX_PATH_BYTES};
use crate::sandbox::Root;
use crate::sandbox::is_staging_name;

/// One entry's identity for change detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    is_dir: bool,
    size: u64,
    modified_ns: i128,
}

impl Stamp {
    /// From `lstat`.
    pub(crate) fn of(meta: &Metadata) -> Stamp {
        let modified_ns = meta
            .modified()
            .ok()
            .map(|t| t.into_std())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        Stamp {
            is_dir: meta.is_dir(),
            size: meta.len(),
            modified_ns,
        }
    }

    /// Whether the entry is a directory.
    pub(crate) fn is_dir(&self) -> bool {
        self.is_dir
    }
}

/// Paths relative to the root → their stamps.
pub(crate) type Snapshot = BTreeMap<String, Stamp>;

/// A change found by comparing two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Diff {
    /// In the new snapshot only.
    Created,
    /// In both, with a different stamp.
    Modified,
    /// In the old snapshot only.
    Deleted,
}

/// A tree too large to watch: over [`MAX_ENTRIES`] entries or [`MAX_PATH_BYTES`] of paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooLarge;

/// Why [`scan_unless`] gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    /// [`TooLarge`].
    TooLarge,
    /// Its `stop` flag was set.
    Stopped,
}

/// Walks `rel` beneath `root` (its entries; all the way down when `recursive`, at most
/// [`crate::sandbox::MAX_WALK_DEPTH`] levels), without following symlinks and skipping staging
/// files and denied paths. Fails when the tree is too large to keep a snapshot of.
pub(super) fn scan(
    root: &Root,
    rel: &str,
    is_dir: bool,
    recursive: bool,
) -> Result<Snapshot, TooLarge> {
    scan_unless(root, rel, is_dir, recursive, &AtomicBool::new(false)).map_err(|_| TooLarge)
}

/// [`scan`], given up as soon as `stop` is set (the broker stops).
pub(super) fn scan_unless(
    root: &Root,
    rel: &str,
    is_dir: bool,
    recursive: bool,
    stop: &AtomicBool,
) -> Result<Snapshot, Cut> {
    let mut snap = Snapshot::new();
    let path = if rel.is_empty() { "." } else { rel };
    if !is_dir {
        if let Ok(m) = root.dir().symlink_metadata(path) {
            snap.insert(rel.to_owned(), Stamp::of(&m));
        }
        return Ok(snap);
    }
    let Ok(top) = root.dir().open_dir(path) else {
        return Ok(snap);
    };
    let Ok(listing) = top.entries() else {
        return Ok(snap);
    };
    // Depth first, one open folder (and its listing) per level: a wide tree never holds many
    // descriptors.
    let mut stack: Vec<(Dir, cap_std::fs::ReadDir, String)> = vec![(top, listing, rel.to_owned())];
    let mut bytes = 0usize;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(Cut::Stopped);
        }
        let depth = stack.len();
        let Some((dir, listing, base)) = stack.last_mut() else {
            break;
        };
        let Some(entry) = listing.next() else {
            stack.pop();
            continue;
        };
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_staging_name(name) {
            continue;
        }
        let child = if base.is_empty() {
            name.to_owned()
        } else {
            format!("{base}/{name}")
        };
        if root.is_denied(&child) || root.protected().is_own_file(&root.join(&child), None) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let stamp = Stamp::of(&meta);
        bytes += child.len();
        if snap.len() >= MAX_ENTRIES || bytes > MAX_PATH_BYTES {
            return Err(Cut::TooLarge);
        }
        let descend = recursive
            && stamp.is_dir
            && !meta.file_type().is_symlink()
            && depth < crate::sandbox::MAX_WALK_DEPTH;
        let sub = descend
            .then(|| dir.open_dir_nofollow(name).ok())
            .flatten()
            .and_then(|sub| sub.entries().ok().map(|l| (sub, l)));
        if let Some((sub, l)) = sub {
            stack.push((sub, l, child.clone()));
        }
        snap.insert(child, stamp);
    }
    Ok(snap)
}

/// What changed from `old` to `new`, in path order.
pub(super) fn diff(old: &Snapshot, new: &Snapshot) -> Vec<(String, Diff)> {
    let mut out = Vec::new();
    for (path, stamp) in new {
        match old.get(path) {
            None => out.push((path.clone(), Diff::Created)),
            // A directory's own stamp moves with every entry added or removed in it; those
            // entries are reported themselves.
            Some(before) if before != stamp && !(before.is_dir && stamp.is_dir) => {
                out.push((path.clone(), Diff::Modified))
            }
            Some(_) => {}
        }
    }
    for path in old.keys() {
        if !new.contains_key(path) {
            out.push((path.clone(), Diff::Deleted));
        }
    }
    out.sort();
    out
}

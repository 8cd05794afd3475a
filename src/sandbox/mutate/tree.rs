//! Changes that reach a whole tree: the lock that keeps folders where they are while an
//! entry is checked and changed, the check of every entry of a directory about to be moved or
//! deleted, and the removal of a directory with everything beneath it.
//!
//! A tree is walked depth first with one open folder (and its listing) per level, never on
//! the thread's stack, and bounded ([`MAX_WALK_DEPTH`], [`MAX_TREE_CHECK`],
//! [`MAX_TREE_WORK`]): a tree a server built to be deep or wide costs it an error, not the
//! broker its stack, its descriptors or every other session's time under the lock.

use cap_fs_ext::DirExt;
use cap_std::fs::Dir;

use super::Parent;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::{MAX_TREE_CHECK, MAX_TREE_WORK};
use crate::sandbox::MAX_WALK_DEPTH;
use crate::sandbox::open::denied;
use crate::sandbox::protected::OWN_FILE;

/// Removes the directory `name` of `parent` and everything beneath it, depth first, holding
/// one directory (and its listing) per level — never recursing on the thread's stack, which a
/// tree thousands of levels deep (renames can nest one) would overflow. A tree deeper than
/// [`MAX_WALK_DEPTH`] levels is refused with `QUOTA_EXCEEDED` when the walk reaches
/// that depth; what was removed before then stays removed, as with any recursive delete that
/// stops on an error.
pub(super) fn remove_tree(parent: &Dir, name: &str, raw: &str) -> Result<()> {
    struct Level {
        dir: Dir,
        entries: cap_std::fs::ReadDir,
        name: std::ffi::OsString,
    }
    let io = |e: std::io::Error| Error::from_io(&e, raw);
    let open = |at: &Dir, name: &std::ffi::OsStr| -> Result<Level> {
        let dir = at.open_dir_nofollow(name).map_err(io)?;
        let entries = dir.entries().map_err(io)?;
        Ok(Level {
            dir,
            entries,
            name: name.to_owned(),
        })
    };
    let mut stack = vec![open(parent, name.as_ref())?];
    loop {
        let depth = stack.len();
        let Some(level) = stack.last_mut() else { break };
        match level.entries.next() {
            Some(entry) => {
                let entry = entry.map_err(io)?;
                let child = entry.file_name();
                if entry.file_type().map_err(io)?.is_dir() {
                    if depth >= MAX_WALK_DEPTH {
                        return Err(Error::new(
                            ErrorKind::QuotaExceeded,
                            format!(
                                "the tree is more than {} levels deep; delete its deeper \
                                 folders first",
                                MAX_WALK_DEPTH
                            ),
                        )
                        .with_path(raw));
                    }
                    let inner = open(&level.dir, &child)?;
                    stack.push(inner);
                } else {
                    level.dir.remove_file_or_symlink(&child).map_err(io)?;
                }
            }
            None => {
                let Some(done) = stack.pop() else { break };
                let above = stack.last().map_or(parent, |l| &l.dir);
                drop(done.entries);
                drop(done.dir);
                above.remove_dir(&done.name).map_err(io)?;
            }
        }
    }
    Ok(())
}

/// The lock that keeps folders where they are while an entry is checked and changed.
///
/// Every change to an entry holds it shared, from its check to its system call; a rename —
/// the one change that moves other entries, or could move a folder swapped in for a file —
/// holds it exclusively, from the checks of both names (and a directory's whole tree) to the
/// rename. So no entry is ever checked under one name and created under another (an upload's
/// folder renamed onto a denied name between its first and last chunk, or a write racing the
/// rename of its folder). It is one lock for the process.
///
/// A rename never *waits* inside the lock: it polls for it, so other sessions' changes are
/// only ever held up while a rename actually holds it, and that hold is bounded by the work
/// its tree check may do ([`MAX_TREE_CHECK`], [`MAX_TREE_WORK`]); a rename that cannot get
/// the lock before its deadline answers `TIMEOUT`.
pub(crate) fn tree_lock() -> &'static TreeLock {
    static TREE: TreeLock = TreeLock(std::sync::RwLock::new(()));
    &TREE
}

/// See [`tree_lock`].
#[derive(Debug)]
pub(crate) struct TreeLock(std::sync::RwLock<()>);

impl TreeLock {
    /// Held while one entry is checked and changed.
    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        // Poisoning only means a holder panicked; the lock guards no data.
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Held while a directory is checked and moved; polled for until `deadline`.
    pub(crate) fn write_by(
        &self,
        deadline: std::time::Instant,
    ) -> Option<std::sync::RwLockWriteGuard<'_, ()>> {
        loop {
            match self.0.try_write() {
                Ok(guard) => return Some(guard),
                Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Checks every entry of the tree at `src` (walked without following symlinks) before it
/// is moved to `dst` (or deleted, with `dst` `None`): nothing beneath it may be denied where
/// it is (the tree would carry denied files out from under the globs that hide them, or
/// delete files the server may not even see), and, moved, no entry may land on a name denied
/// at the destination, or on one of fsbroker's own files. Checked under the destination's own
/// name, against every root covering it. Nothing is walked when no rule could apply.
pub(crate) fn check_tree(
    src: &Parent,
    dst: Option<(&Parent, &str)>,
    deadline: std::time::Instant,
    raw: &str,
) -> Result<()> {
    // Where both are now (the caller holds the tree lock): a folder above either may have
    // been renamed since they were opened, and the entries must be judged where they will be.
    let (src_real, _) = src.now(raw)?;
    let dst_now = match dst {
        Some((d, new_raw)) => Some((d, d.now(new_raw)?, new_raw)),
        None => None,
    };
    let dst_rules = dst_now
        .as_ref()
        .is_some_and(|(d, (_, key), _)| d.root.has_deny() || d.root.protected().any_beneath(key));
    if !src.root.has_deny() && !dst_rules {
        return Ok(());
    }
    let top = src
        .dir
        .open_dir_nofollow(&src.name)
        .map_err(|e| Error::from_io(&e, raw))?;
    // Each entry is matched with every folder above it, from the root down, on both sides.
    let depth = |rel: &str| rel.matches('/').count() + 1;
    let base = depth(&src_real) + dst_now.as_ref().map_or(0, |(_, (r, _), _)| depth(r));
    // Depth first, one open folder (and its listing) per level: a wide tree never holds many
    // descriptors, and a deep one is refused past `MAX_WALK_DEPTH`.
    let listing = top.entries().map_err(|e| Error::from_io(&e, raw))?;
    let mut stack = vec![(top, listing, String::new())];
    let (mut seen, mut work) = (0usize, 0usize);
    loop {
        let level = stack.len();
        let Some((dir, listing, sub)) = stack.last_mut() else {
            break;
        };
        let Some(entry) = listing.next() else {
            stack.pop();
            continue;
        };
        {
            let entry = entry.map_err(|e| Error::from_io(&e, raw))?;
            seen += 1;
            // Each entry costs one glob match per folder above it: bound that work too, so a
            // tree a thousand folders deep cannot hold the lock for seconds.
            work += base + 2 * (sub.matches('/').count() + 1);
            if seen % 256 == 0 && std::time::Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "the directory could not be checked before the deadline",
                )
                .with_path(raw));
            }
            if seen > MAX_TREE_CHECK || work > MAX_TREE_WORK {
                return Err(Error::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "the directory holds too much to check against the policy (over \
                         {MAX_TREE_CHECK} entries, or folders too deep); move it in parts"
                    ),
                )
                .with_path(raw));
            }
            let name = entry.file_name();
            // A name that is not UTF-8 cannot be matched by a glob; be safe and refuse.
            let Some(name) = name.to_str() else {
                return Err(holds_denied(raw));
            };
            let child = if sub.is_empty() {
                name.to_owned()
            } else {
                format!("{sub}/{name}")
            };
            if src.root.is_denied(&format!("{src_real}/{child}")) {
                return Err(holds_denied(raw));
            }
            if let Some((to, (to_real, to_key), new_raw)) = &dst_now {
                if to.root.is_denied(&format!("{to_real}/{child}")) {
                    return Err(denied(new_raw));
                }
                if to.root.protected().is_own_file(&to_key.join(&child), None) {
                    return Err(
                        Error::new(ErrorKind::PermissionDenied, OWN_FILE).with_path(*new_raw)
                    );
                }
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if level >= MAX_WALK_DEPTH {
                    return Err(Error::new(
                        ErrorKind::QuotaExceeded,
                        format!(
                            "the directory is more than {} levels deep to check against the \
                             policy; move it in parts",
                            MAX_WALK_DEPTH
                        ),
                    )
                    .with_path(raw));
                }
                let inner = dir
                    .open_dir_nofollow(name)
                    .map_err(|e| Error::from_io(&e, raw))?;
                let inner_listing = inner.entries().map_err(|e| Error::from_io(&e, raw))?;
                stack.push((inner, inner_listing, child));
            }
        }
    }
    Ok(())
}

fn holds_denied(raw: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        "the directory holds paths denied by policy",
    )
    .with_path(raw)
}

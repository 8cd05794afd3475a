//! The safe building blocks of every mutation.
//!
//! A mutation never opens its target by path from the root. It opens the target's *parent*
//! beneath the root (intermediate symlinks that stay inside are followed; the kernel refuses
//! the rest), and then works on the last component with `*at` calls that never follow it:
//! `renameat2`, `unlinkat`, `mkdirat`, `openat(O_CREAT | O_EXCL)`. So a symlink planted at
//! the target can be replaced, moved or removed, but never written through by accident.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use cap_fs_ext::{DirExt, OpenOptionsFollowExt, OpenOptionsMaybeDirExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

use super::open::{check_not_denied, denied, real_rel};
use super::protected::{OWN_FILE, cap_id_of};
use super::{Mode, Resolved, Root, STAGING_MARK, STAGING_SUFFIX};
use crate::error::{Error, ErrorKind, Result};

/// The directory holding a path, opened beneath the root, and the path's last component.
///
/// Every change to the entry goes through a method of its `Parent` ([`Parent::commit`],
/// [`Parent::create_dir`], [`Parent::remove`], [`rename`], ...), and each first checks that
/// the entry may be changed where it really is: the mode of every root covering it, and that
/// it is not one of fsbroker's own files, a root, or a folder holding either
/// ([`super::protected`]). No route — a write, an upload's commit, a rename onto or away, a
/// delete, a create — can skip that check.
#[derive(Debug)]
pub(crate) struct Parent {
    /// The root the entry lies in.
    pub root: Arc<Root>,
    /// The parent directory's capability.
    pub dir: Dir,
    /// The last component of the path.
    pub name: String,
    /// Where the entry really is, relative to the root (the parent resolved through any
    /// symlinks, then `name`).
    pub real: String,
    /// The lock key: the root's canonical path joined with `real`.
    pub key: PathBuf,
}

/// Refuses mutations of a root that is read-only itself, before any work. The mode of every
/// root covering where the entry really is decides later, in [`Parent::check_change`], after
/// the checks that say more (a root nested in this one is "the root itself", not merely
/// read-only).
pub(crate) fn require_writable(target: &Resolved, raw: &str) -> Result<()> {
    match target.root().mode() {
        Mode::ReadWrite => Ok(()),
        // A protected path says so, in a read-only root too: the answer does not depend on
        // which root's name reached it.
        Mode::ReadOnly => Err(Error::new(
            ErrorKind::PermissionDenied,
            match target.root().protected().change(&target.absolute(), None) {
                Some(verdict) => verdict.reason("changed"),
                None => "read-only root".to_owned(),
            },
        )
        .with_path(raw)),
    }
}

/// The error for an operation on the root itself, which is never deleted, renamed or replaced.
pub(crate) fn root_itself(what: &str, raw: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!("the root itself cannot be {what}"),
    )
    .with_path(raw)
}

/// Opens the parent of `target` (which must not be the root itself) and checks the deny
/// globs against where the entry really is.
pub(crate) fn open_parent(target: &Resolved, raw: &str) -> Result<Parent> {
    check_not_denied(target, raw)?;
    let (parent_rel, name) = match target.rel().rsplit_once('/') {
        Some((p, n)) => (p, n),
        None => ("", target.rel()),
    };
    if name.is_empty() {
        return Err(root_itself("changed", raw));
    }
    let root = target.root();
    let dir = if parent_rel.is_empty() {
        root.dir().try_clone()
    } else {
        root.dir().open_dir(parent_rel)
    }
    .map_err(|e| Error::from_io(&e, raw))?;
    let real_parent = real_rel(root, &dir, raw)?;
    let real = if real_parent.is_empty() {
        name.to_owned()
    } else {
        format!("{real_parent}/{name}")
    };
    if root.is_denied(&real) {
        return Err(denied(raw));
    }
    Ok(Parent {
        root: Arc::clone(root),
        key: root.path().join(&real),
        dir,
        name: name.to_owned(),
        real,
    })
}

impl Parent {
    /// Refuses changing the entry (`what` it would be: "written", "renamed", ...) where it is
    /// *now*: one of fsbroker's own files, a root, or a folder holding either; a name denied by
    /// the globs of a root covering it; or where a root covering it is read-only.
    ///
    /// "Now" is asked of the kernel (where the parent descriptor really is), not taken from
    /// when the parent was opened: a folder moved in the meantime — say, an upload's folder
    /// renamed onto a denied name before its last chunk — is judged where it has gone. The
    /// building blocks below call this while they hold the tree lock ([`tree_lock`]), so no
    /// folder moves between the check and the change.
    pub(crate) fn check_change(&self, what: &str, raw: &str) -> Result<()> {
        let (real, key) = self.now(raw)?;
        let id = self
            .dir
            .symlink_metadata(&self.name)
            .ok()
            .map(|m| cap_id_of(&m));
        if let Some(verdict) = self.root.protected().change(&key, id) {
            return Err(
                Error::new(ErrorKind::PermissionDenied, verdict.reason(what)).with_path(raw),
            );
        }
        if self.root.is_denied(&real) {
            return Err(denied(raw));
        }
        if self.root.mode_at(&real) == Mode::ReadOnly {
            return Err(Error::new(ErrorKind::PermissionDenied, "read-only root").with_path(raw));
        }
        Ok(())
    }

    /// Where the entry is now, relative to the root and absolute: its parent descriptor's path
    /// from the kernel (a folder moved since the parent was opened is followed), then the name.
    pub(crate) fn now(&self, raw: &str) -> Result<(String, PathBuf)> {
        let real_parent = real_rel(&self.root, &self.dir, raw)?;
        let real = if real_parent.is_empty() {
            self.name.clone()
        } else {
            format!("{real_parent}/{}", self.name)
        };
        let key = self.root.join(&real);
        Ok((real, key))
    }

    /// Flushes the parent directory, so a rename or unlink in it survives a crash.
    pub(crate) fn sync(&self) -> Result<()> {
        // The capability may be an `O_PATH` descriptor, which `fsync` refuses; open the
        // directory itself for reading to sync it.
        let mut opts = OpenOptions::new();
        opts.read(true).maybe_dir(true);
        self.dir
            .open_with(".", &opts)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::new(ErrorKind::Io, format!("cannot sync the directory: {e}")))
    }

    /// `lstat` of the entry: `None` when it does not exist.
    pub(crate) fn entry_type(&self, raw: &str) -> Result<Option<cap_std::fs::FileType>> {
        match self.dir.symlink_metadata(&self.name) {
            Ok(m) => Ok(Some(m.file_type())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::from_io(&e, raw)),
        }
    }

    /// Opens the existing regular file at the entry for reading, without following a
    /// symlink, and returns it with its `fstat`.
    pub(crate) fn open_existing(&self, raw: &str) -> Result<(File, std::fs::Metadata)> {
        let mut opts = OpenOptions::new();
        opts.read(true)
            .follow(cap_fs_ext::FollowSymlinks::No)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
        let file = self
            .dir
            .open_with(&self.name, &opts)
            .map_err(|e| Error::from_io(&e, raw))?
            .into_std();
        let meta = file.metadata().map_err(|e| Error::from_io(&e, raw))?;
        if !meta.is_file() {
            return Err(Error::new(ErrorKind::InvalidPath, "not a regular file").with_path(raw));
        }
        Ok((file, meta))
    }

    /// Creates a staging file beside the entry, private to the owner until committed.
    pub(crate) fn stage(&self, raw: &str) -> Result<Staged> {
        let dir = self.dir.try_clone().map_err(|e| Error::from_io(&e, raw))?;
        // Keep the whole name within NAME_MAX (255 bytes) whatever the target's length.
        let mut stem = self.name.as_str();
        while stem.len() > 200 {
            let mut cut = 200.min(stem.len() - 1);
            while !stem.is_char_boundary(cut) {
                cut -= 1;
            }
            stem = &stem[..cut];
        }
        let name = format!(
            ".{stem}{STAGING_MARK}{}{STAGING_SUFFIX}",
            crate::random::hex(8)
        );
        let mut opts = OpenOptions::new();
        opts.write(true)
            .create_new(true)
            .follow(cap_fs_ext::FollowSymlinks::No)
            .mode(0o600);
        let file = dir
            .open_with(&name, &opts)
            .map_err(|e| Error::from_io(&e, raw))?
            .into_std();
        Ok(Staged {
            dir,
            name,
            file,
            done: false,
        })
    }

    /// Renames `staged` over the entry (replacing whatever is there, a symlink included,
    /// never following it), then syncs the directory. Returns the committed file's `fstat`
    /// taken after the rename (a rename changes the inode's change time, hence its etag).
    pub(crate) fn commit(&self, staged: Staged, raw: &str) -> Result<std::fs::Metadata> {
        self.commit_with(staged, true, raw)
    }

    /// Like [`Parent::commit`]; without `overwrite` an existing entry is `ALREADY_EXISTS`,
    /// decided atomically by `RENAME_NOREPLACE`.
    pub(crate) fn commit_with(
        &self,
        mut staged: Staged,
        overwrite: bool,
        raw: &str,
    ) -> Result<std::fs::Metadata> {
        let flags = if overwrite {
            rustix::fs::RenameFlags::empty()
        } else {
            rustix::fs::RenameFlags::NOREPLACE
        };
        {
            let _tree = tree_lock().read();
            self.check_change("replaced", raw)?;
            rustix::fs::renameat_with(&staged.dir, &staged.name, &self.dir, &self.name, flags)
                .map_err(|e| Error::from_io(&e.into(), raw))?;
        }
        staged.done = true;
        self.sync().map_err(|e| e.or_path(raw))?;
        staged.file.metadata().map_err(|e| Error::from_io(&e, raw))
    }

    /// Creates the directory entry; `Ok(false)` when something already exists there.
    pub(crate) fn create_dir(&self, raw: &str) -> Result<bool> {
        let _tree = tree_lock().read();
        self.check_change("changed", raw)?;
        match self.dir.create_dir(&self.name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::from_io(&e, raw)),
        }
    }

    /// Creates an empty regular file; `Ok(false)` when something already exists there.
    pub(crate) fn create_file(&self, raw: &str) -> Result<bool> {
        let _tree = tree_lock().read();
        self.check_change("changed", raw)?;
        let mut opts = OpenOptions::new();
        opts.write(true)
            .create_new(true)
            .follow(cap_fs_ext::FollowSymlinks::No)
            .mode(0o666);
        match self.dir.open_with(&self.name, &opts) {
            Ok(f) => {
                f.sync_all().map_err(|e| Error::from_io(&e, raw))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::from_io(&e, raw)),
        }
    }

    /// Removes the entry: a file or symlink is unlinked (never its target), a directory
    /// removed if empty, or with everything beneath it when `recursive`.
    pub(crate) fn remove(&self, recursive: bool, raw: &str) -> Result<()> {
        let tree = tree_lock().read();
        self.check_change("deleted", raw)?;
        let Some(ft) = self.entry_type(raw)? else {
            return Err(
                Error::new(ErrorKind::FileNotFound, "no such file or directory").with_path(raw),
            );
        };
        let result = if ft.is_dir() {
            match self.dir.remove_dir(&self.name) {
                Err(e) if is_not_empty(&e) && recursive => {
                    return remove_tree(&self.dir, &self.name, raw).and_then(|()| {
                        drop(tree);
                        self.sync().map_err(|e| e.or_path(raw))
                    });
                }
                Err(e) if is_not_empty(&e) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        "directory not empty (set recursive to delete its contents)",
                    )
                    .with_path(raw));
                }
                other => other,
            }
        } else {
            self.dir.remove_file_or_symlink(&self.name)
        };
        result.map_err(|e| Error::from_io(&e, raw))?;
        drop(tree);
        self.sync().map_err(|e| e.or_path(raw))
    }
}

/// Removes the directory `name` of `parent` and everything beneath it, depth first, holding
/// one directory (and its listing) per level — never recursing on the thread's stack, which a
/// tree thousands of levels deep (renames can nest one) would overflow. A tree deeper than
/// [`super::MAX_WALK_DEPTH`] levels is refused with `QUOTA_EXCEEDED` when the walk reaches
/// that depth; what was removed before then stays removed, as with any recursive delete that
/// stops on an error.
fn remove_tree(parent: &Dir, name: &str, raw: &str) -> Result<()> {
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
                    if depth >= super::MAX_WALK_DEPTH {
                        return Err(Error::new(
                            ErrorKind::QuotaExceeded,
                            format!(
                                "the tree is more than {} levels deep; delete its deeper \
                                 folders first",
                                super::MAX_WALK_DEPTH
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

/// The most entries a directory rename checks against deny globs and fsbroker's own files
/// while it holds the tree lock exclusively; a larger tree is not moved (`QUOTA_EXCEEDED`).
/// It bounds how long one rename can hold up every other session's changes (a few hundred
/// milliseconds on a slow disk).
pub(crate) const MAX_TREE_CHECK: usize = 20_000;

/// The most glob matches (an entry's folders, counted for each entry) a directory rename
/// makes under the tree lock; with [`MAX_TREE_CHECK`] it keeps a hold to a fraction of a
/// second whatever the tree's shape.
pub(crate) const MAX_TREE_WORK: usize = 200_000;

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
                if level >= super::MAX_WALK_DEPTH {
                    return Err(Error::new(
                        ErrorKind::QuotaExceeded,
                        format!(
                            "the directory is more than {} levels deep to check against the \
                             policy; move it in parts",
                            super::MAX_WALK_DEPTH
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

fn is_not_empty(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOTEMPTY.raw_os_error())
        || e.kind() == std::io::ErrorKind::DirectoryNotEmpty
}

/// A staging file beside its target. Removed when dropped unless committed, so every
/// failure path — an error, a quota, a session that ends mid-upload — cleans up.
#[derive(Debug)]
pub(crate) struct Staged {
    dir: Dir,
    name: String,
    file: File,
    done: bool,
}

impl Staged {
    /// Appends bytes.
    pub(crate) fn write(&mut self, data: &[u8], raw: &str) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|e| Error::from_io(&e, raw))
    }

    /// Starts writing what is staged to the disk, without waiting for it: an upload's
    /// chunks then go to the disk while the next ones arrive, so the `fsync` of the final
    /// chunk has little left to do, and the dirty pages of a large upload never pile up to
    /// the point where the kernel throttles the writer. Best effort.
    pub(crate) fn start_writeback(&self) {
        use std::os::fd::AsRawFd;
        // No safe wrapper: rustix has no sync_file_range(2).
        // SAFETY: `sync_file_range` takes a descriptor and three integers, no memory; the
        // descriptor belongs to `self.file`, open for the whole call. Offset 0 with length 0
        // means the whole file; `SYNC_FILE_RANGE_WRITE` only starts writeback of dirty pages.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range failed");
        }
    }

    /// The open staging file (to copy into it, or to set its permissions).
    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes data and sets the permission bits the committed file will have.
    pub(crate) fn finish(&mut self, mode: u32, raw: &str) -> Result<()> {
        rustix::fs::fchmod(&self.file, rustix::fs::Mode::from_raw_mode(mode))
            .map_err(|e| Error::from_io(&e.into(), raw))?;
        self.file.sync_all().map_err(|e| Error::from_io(&e, raw))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.dir.remove_file(&self.name) {
                tracing::warn!(name = %self.name, error = %e, "could not remove a staging file");
            }
        }
    }
}

/// Renames `from` to `to` across any two parents; `overwrite: false` is atomic
/// (`RENAME_NOREPLACE`), never stat-then-rename.
///
/// Both entries are checked first ([`Parent::check_change`]): the source is "renamed", the
/// target "replaced"; a directory's whole tree too ([`check_tree`]). All of it under the tree
/// lock held exclusively, so nothing lands in the tree, and nothing swaps the source for a
/// folder, between the checks and the move. A refusal is the outer `Err`.
pub(crate) fn rename(
    from: &Parent,
    to: &Parent,
    overwrite: bool,
    deadline: std::time::Instant,
    old_raw: &str,
    new_raw: &str,
) -> Result<rustix::io::Result<()>> {
    let flags = if overwrite {
        rustix::fs::RenameFlags::empty()
    } else {
        rustix::fs::RenameFlags::NOREPLACE
    };
    // Every rename holds the lock exclusively: a rename decides by the type of its source
    // whether there is a tree to check, and creates and deletes (which hold it shared) could
    // otherwise swap a file for a folder between that decision and the move.
    let Some(_exclusive) = tree_lock().write_by(deadline) else {
        return Err(Error::new(
            ErrorKind::Timeout,
            "the rename could not be checked in time: other changes held it up",
        )
        .with_path(old_raw));
    };
    from.check_change("renamed", old_raw)?;
    to.check_change("replaced", new_raw)?;
    if from.entry_type(old_raw)?.is_some_and(|t| t.is_dir()) {
        check_tree(from, Some((to, new_raw)), deadline, old_raw)?;
    }
    Ok(rustix::fs::renameat_with(
        &from.dir, &from.name, &to.dir, &to.name, flags,
    ))
}

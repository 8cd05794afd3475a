//! The safe building blocks of every mutation.
//!
//! A mutation never opens its target by path from the root. It opens the target's *parent*
//! beneath the root (intermediate symlinks that stay inside are followed; the kernel refuses
//! the rest), and then works on the last component with `*at` calls that never follow it:
//! `renameat2`, `unlinkat`, `mkdirat`, `openat(O_CREAT | O_EXCL)`. So a symlink planted at
//! the target can be replaced, moved or removed, but never written through by accident.
//!
//! Here: the parent and every change made through it, renames included. A write's staging
//! file is in `mutate/staged.rs`; what a change to a whole tree needs (the tree lock, the
//! check of a directory moved or deleted, removing one) in `mutate/tree.rs`.

mod staged;
mod tree;

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use cap_fs_ext::{DirExt, OpenOptionsFollowExt, OpenOptionsMaybeDirExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};

use super::open::{check_not_denied, denied_in, real_rel};
use super::protected::cap_id_of;
use super::{Mode, Resolved, Root, STAGING_MARK, STAGING_SUFFIX};
use crate::error::{Error, ErrorKind, Result};
pub(crate) use staged::Staged;
pub(crate) use tree::check_tree;
use tree::{remove_tree, tree_lock};

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

/// The refusal of a change where the managed policy's `[roots] read_only` holds.
pub(crate) const MANAGED_READ_ONLY: &str =
    "read-only by your organisation's managed policy ([roots] read_only)";

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
                None if target.root().read_only_by_managed("") => MANAGED_READ_ONLY.to_owned(),
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
        return Err(denied_in(root, &real, raw));
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
            return Err(denied_in(&self.root, &real, raw));
        }
        if self.root.mode_at(&real) == Mode::ReadOnly {
            let why = if self.root.read_only_by_managed(&real) {
                MANAGED_READ_ONLY
            } else {
                "read-only root"
            };
            return Err(Error::new(ErrorKind::PermissionDenied, why).with_path(raw));
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
        // Readable too: an upload whose final chunk brings a `sha256` it did not announce is
        // hashed from what was staged.
        opts.read(true)
            .write(true)
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
        // Readable too: an upload whose final chunk brings a `sha256` it did not announce is
        // hashed from what was staged.
        opts.read(true)
            .write(true)
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

fn is_not_empty(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::NOTEMPTY.raw_os_error())
        || e.kind() == std::io::ErrorKind::DirectoryNotEmpty
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

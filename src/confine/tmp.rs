//! A confined server's private temporary directory: made owner-only, held by the proxy with a
//! lock for as long as it runs, and removed afterwards, by this proxy or, if it was killed,
//! by the next one.
//!
//! Two things a hostile server could do with it are met here:
//! - a tree thousands of levels deep: removal walks it with two descriptors and no recursion
//!   ([`remove_tree`]), so it can neither run out of descriptors nor overflow the stack;
//! - a proxy in another process-id namespace sharing `/tmp` would look gone by its process id:
//!   liveness is the directory's lock, which the kernel drops only when its holder is gone.
//!
//! And one thing proxies started at the same moment (a host starting all its servers) would do
//! to each other: a directory is unlocked between its `mkdir` and its `flock`, and another
//! proxy's clean-up would take it for abandoned and remove it. So a directory is made under a
//! [`STAGING`] name, which clean-up leaves alone until it is long past that moment
//! ([`STAGING_GRACE`]), and only locked is it renamed to its [`PREFIX`] name: a directory
//! under that name is locked from the moment it has it. A proxy whose staging directory was
//! taken all the same (it was stopped past the grace) starts over under a fresh name.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustix::fs::{AtFlags, CWD, FileType, FlockOperation, Mode, OFlags, RenameFlags};

use super::ConfineError;
use crate::limits::{ATTEMPTS, STAGING_GRACE};

/// The start of the name of a confined server's temporary directory; the proxy's process id
/// (for people reading `/tmp`) and a random part follow.
pub(crate) const PREFIX: &str = "fsbroker-server-";

/// The start of the name a proxy makes the directory under, before it holds its lock; the
/// proxy's process id and a random part follow.
pub(crate) const STAGING: &str = "fsbroker-staging-";

/// The directory, locked while this lives, removed when it is dropped.
#[derive(Debug)]
pub(crate) struct PrivateTmp {
    path: PathBuf,
    /// The directory, opened and `flock`ed: the lock says the directory is in use.
    _lock: OwnedFd,
}

/// Why one attempt at making the directory failed.
enum Failed {
    /// The directory made was taken away, or its lock or final name was: a fresh name may do.
    Taken(io::Error),
    /// Nothing can be made here.
    Fatal(io::Error),
}

impl PrivateTmp {
    /// Removes what killed proxies left in the system's temporary directory, then makes a
    /// new directory there (mode 0700) and locks it.
    pub(crate) fn new() -> Result<PrivateTmp, ConfineError> {
        let base = std::env::temp_dir();
        remove_abandoned(&base);
        let mut last = None;
        for _ in 0..ATTEMPTS {
            match PrivateTmp::make(&base) {
                Ok(tmp) => return Ok(tmp),
                Err(Failed::Taken(e)) => {
                    tracing::debug!(error = %e, "the server's temporary directory was taken while being made; trying a fresh name");
                    last = Some(e);
                }
                Err(Failed::Fatal(e)) => return Err(ConfineError::Temp(e)),
            }
        }
        Err(ConfineError::Temp(last.unwrap_or_else(|| {
            io::Error::other(format!("{}: no attempt made", base.display()))
        })))
    }

    /// One attempt: made under a staging name, opened, locked, made owner-only, renamed to
    /// its final name (never over another), and checked to be the directory locked.
    fn make(base: &Path) -> Result<PrivateTmp, Failed> {
        use std::os::unix::fs::PermissionsExt;
        let pid = std::process::id();
        let staged = tempfile::Builder::new()
            .prefix(&format!("{STAGING}{pid}-"))
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(base)
            .map_err(Failed::Fatal)?
            .keep();
        // Gone (removed as abandoned), held by the clean-up removing it, or its final name
        // taken: a fresh name may do. Anything else would fail again.
        let taken = |e: rustix::io::Errno, at: &Path| {
            use rustix::io::Errno;
            let again = matches!(
                e,
                Errno::NOENT | Errno::WOULDBLOCK | Errno::EXIST | Errno::NOTEMPTY
            );
            let e = at_path(e.into(), at);
            if again {
                Failed::Taken(e)
            } else {
                Failed::Fatal(e)
            }
        };
        let lock = open_dir(&staged).map_err(|e| taken(e, &staged))?;
        rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| taken(e, &staged))?;
        let fail = |e: Failed| {
            // Locked by this proxy and still at the staging name: removed, so that a failed
            // attempt leaves nothing behind.
            if same_file(&lock, &staged) {
                let _ = remove_tree(&staged);
            }
            e
        };
        // Whatever the umask made of it: the server's files are its own.
        rustix::fs::fchmod(&lock, Mode::from_raw_mode(0o700))
            .map_err(|e| fail(Failed::Fatal(at_path(e.into(), &staged))))?;
        let path = base.join(format!("{PREFIX}{pid}-{}", crate::random::hex(8)));
        rename_noreplace(&staged, &path).map_err(|e| fail(taken(e, &staged)))?;
        // The rename went by name: the staging name may have been removed (past the grace)
        // and made again by then. Only the directory this proxy locked is its own.
        if !same_file(&lock, &path) {
            return Err(Failed::Taken(at_path(
                io::Error::other("the directory renamed into place is not the one locked"),
                &path,
            )));
        }
        Ok(PrivateTmp { path, _lock: lock })
    }

    /// The directory's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the server's temporary directory");
        }
    }
}

/// `e` with the path it is about in its text, for the error the host shows.
fn at_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Opens the directory `path` (never a link to one) as a descriptor to lock.
fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Whether `path` (not followed if a link) names the file `fd` is open on.
fn same_file(fd: &OwnedFd, path: &Path) -> bool {
    let (Ok(held), Ok(named)) = (
        rustix::fs::fstat(fd),
        rustix::fs::statat(CWD, path, AtFlags::SYMLINK_NOFOLLOW),
    ) else {
        return false;
    };
    (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
}

/// Renames `from` to `to`, failing (`EEXIST`) rather than replacing what is at `to`. On a file
/// system without `RENAME_NOREPLACE`, a plain rename: `to` is a fresh random name, and a
/// rename replaces only an empty directory.
fn rename_noreplace(from: &Path, to: &Path) -> rustix::io::Result<()> {
    match rustix::fs::renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Err(rustix::io::Errno::INVAL) => rustix::fs::renameat(CWD, from, CWD, to),
        other => other,
    }
}

/// Removes the directories in `base` that confined servers' proxies left behind: owned by
/// this user, real directories (not links), and not locked by a running proxy; named with
/// [`PREFIX`], or with [`STAGING`] and older than [`STAGING_GRACE`] (a younger one may be
/// about to be locked). A directory is removed only while this holds its lock, and only if it
/// still is the directory at that name.
pub(crate) fn remove_abandoned(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let me = rustix::process::getuid().as_raw();
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let staged = name.starts_with(STAGING);
        if !staged && !name.starts_with(PREFIX) {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        // A clock set back makes every staging directory young: kept, never taken early.
        if staged
            && meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_none_or(|age| age < STAGING_GRACE)
        {
            continue;
        }
        let Ok(dir) = open_dir(&path) else {
            continue;
        };
        // Held by a running proxy (in any process-id namespace): not abandoned.
        if rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        // Removed, or replaced, since it was opened: what is there now is not the directory
        // this holds the lock of.
        if !same_file(&dir, &path) {
            continue;
        }
        // The lock is held (`dir`) until the tree is gone, so a proxy still setting this
        // directory up cannot lock it meanwhile and take it for its own.
        if let Err(e) = remove_tree(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an abandoned server temporary directory");
        }
        drop(dir);
    }
}

/// Removes the directory `path` and everything in it, never following a link, with at most
/// two descriptors open and no recursion, however deep the tree: each pass empties the
/// top's subdirectories one level, moving their subdirectories up to the top (renamed, in the
/// same directory, so nothing leaves the tree), until the top is empty. Directories the
/// server left unreadable or read-only (`mkdir(d, 0)`) are made the owner's again first.
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    let open_dir = |at: &OwnedFd, name: &std::ffi::CStr| {
        rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let top = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    make_owners(&top);
    let mut moved = 0u64;
    loop {
        let mut subdirs = Vec::new();
        for entry in rustix::fs::Dir::read_from(&top)? {
            let entry = entry?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if is_dir(&top, name, entry.file_type())? {
                subdirs.push(name.to_owned());
            } else {
                rustix::fs::unlinkat(&top, name, AtFlags::empty())?;
            }
        }
        if subdirs.is_empty() {
            break;
        }
        for name in subdirs {
            if let Ok(path) = rustix::fs::openat(
                &top,
                name.as_c_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                make_owners(&path);
            }
            let sub = open_dir(&top, &name)?;
            for entry in rustix::fs::Dir::read_from(&sub)? {
                let entry = entry?;
                let child = entry.file_name();
                if child == c"." || child == c".." {
                    continue;
                }
                if is_dir(&sub, child, entry.file_type())? {
                    moved += 1;
                    let up = format!(".fsbroker-rm-{moved}-{}", crate::random::hex(8));
                    rustix::fs::renameat(&sub, child, &top, up.as_str())?;
                } else {
                    rustix::fs::unlinkat(&sub, child, AtFlags::empty())?;
                }
            }
            drop(sub);
            rustix::fs::unlinkat(&top, name.as_c_str(), AtFlags::REMOVEDIR)?;
        }
    }
    drop(top);
    std::fs::remove_dir(path)
}

/// Makes the directory `dir` (any descriptor of it, `O_PATH` included) readable, writable and
/// searchable by its owner, through its `/proc/self/fd` entry, which names exactly that
/// directory (no path to swap). Failures are left to the removal to report.
fn make_owners(dir: &OwnedFd) {
    use std::os::fd::AsRawFd;
    let at = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let _ = rustix::fs::chmod(at.as_str(), Mode::from_raw_mode(0o700));
}

/// Whether `name` in `dir` is a directory (not a link to one), asking the file system when
/// the directory entry does not say.
fn is_dir(dir: impl AsFd, name: &std::ffi::CStr, hint: FileType) -> std::io::Result<bool> {
    if hint != FileType::Unknown {
        return Ok(hint == FileType::Directory);
    }
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deep_tree_is_removed_without_recursion() {
        let base = tempfile::tempdir().unwrap();
        let top = base.path().join("t");
        std::fs::create_dir(&top).unwrap();
        // Deeper than a path can name (PATH_MAX) and than a recursive removal with one
        // descriptor per level could go under a descriptor limit of 1024.
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut dir = rustix::fs::open(&top, flags, Mode::empty()).unwrap();
        for _ in 0..3000 {
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
            let next = rustix::fs::openat(&dir, "d", flags, Mode::empty()).unwrap();
            let file = OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC;
            drop(rustix::fs::openat(&next, "f", file, Mode::from_raw_mode(0o600)).unwrap());
            dir = next;
        }
        drop(dir);
        std::os::unix::fs::symlink(base.path(), top.join("link-out")).unwrap();
        // What a server can leave: a directory of mode 0, a read-only one holding a file.
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(top.join("locked/deeper")).unwrap();
        std::fs::create_dir(top.join("ro")).unwrap();
        std::fs::write(top.join("ro/f"), "x").unwrap();
        std::fs::set_permissions(top.join("locked"), std::fs::Permissions::from_mode(0o0)).unwrap();
        std::fs::set_permissions(top.join("ro"), std::fs::Permissions::from_mode(0o500)).unwrap();
        std::fs::write(base.path().join("outside"), "kept").unwrap();
        remove_tree(&top).unwrap();
        assert!(!top.exists());
        assert_eq!(
            std::fs::read_to_string(base.path().join("outside")).unwrap(),
            "kept"
        );
    }
}

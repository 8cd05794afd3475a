//! A confined server's private temporary directory: made owner-only, held by the proxy with a
//! lock for as long as it runs, and removed afterwards, by this proxy or, if it was killed,
//! by the next one.
//!
//! Two things a hostile server could do with it are met here:
//! - a tree thousands of levels deep: removal walks it with two descriptors and no recursion
//!   ([`remove_tree`]), so it can neither run out of descriptors nor overflow the stack;
//! - a proxy in another process-id namespace sharing `/tmp` would look gone by its process id:
//!   liveness is the directory's lock, which the kernel drops only when its holder is gone.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::ConfineError;

/// The start of the name of a confined server's temporary directory; the proxy's process id
/// (for people reading `/tmp`) and a random part follow.
pub const PREFIX: &str = "fsbroker-server-";

/// The directory, locked while this lives, removed when it is dropped.
#[derive(Debug)]
pub struct PrivateTmp {
    path: PathBuf,
    /// The directory, opened and `flock`ed: the lock says the directory is in use.
    _lock: OwnedFd,
}

impl PrivateTmp {
    /// Removes what killed proxies left in the system's temporary directory, then makes a
    /// new directory there (mode 0700) and locks it.
    pub fn new() -> Result<PrivateTmp, ConfineError> {
        let base = std::env::temp_dir();
        remove_abandoned(&base);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&base)
            .map_err(ConfineError::Temp)?;
        let path = dir.keep();
        let lock = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ConfineError::Temp(e.into()))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| ConfineError::Temp(e.into()))?;
        // Whatever the umask made of it: the server's files are its own.
        rustix::fs::fchmod(&lock, Mode::from_raw_mode(0o700))
            .map_err(|e| ConfineError::Temp(e.into()))?;
        Ok(PrivateTmp { path, _lock: lock })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
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

/// Removes the directories in `base` that confined servers' proxies left behind: named with
/// [`PREFIX`], owned by this user, real directories (not links), and not locked by a running
/// proxy.
pub fn remove_abandoned(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    let me = rustix::process::getuid().as_raw();
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(PREFIX));
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !ours || !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let Ok(dir) = rustix::fs::open(
            &path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        // Held by a running proxy (in any process-id namespace): not abandoned.
        if rustix::fs::flock(&dir, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        if let Err(e) = remove_tree(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an abandoned server temporary directory");
        }
    }
}

/// Removes the directory `path` and everything in it, never following a link, with at most
/// two descriptors open and no recursion, however deep the tree: each pass empties the
/// top's subdirectories one level, moving their subdirectories up to the top (renamed, in the
/// same directory, so nothing leaves the tree), until the top is empty. Directories the
/// server left unreadable or read-only (`mkdir(d, 0)`) are made the owner's again first.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
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

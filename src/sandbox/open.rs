//! Safe opens beneath a root.
//!
//! Every function here takes a [`Resolved`] and opens through its root's `Dir`, so the kernel
//! (or cap-std's fallback) keeps each step beneath the root. Symlinks that stay inside the
//! root are followed, as a user expects of their own tree; ones that leave it, or that are
//! absolute, are refused by cap-std and surface as `PERMISSION_DENIED`.

use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;

use cap_fs_ext::{DirExt, OpenOptionsFollowExt};
use cap_std::fs::{Dir, FileType, Metadata as CapMetadata, OpenOptions, OpenOptionsExt};

use super::{Resolved, Root};
use crate::error::{Error, ErrorKind, Result};

/// A regular file opened for reading, with the metadata taken from the open descriptor.
#[derive(Debug)]
pub(crate) struct RegularFile {
    /// The open file; use positional reads on it.
    pub file: File,
    /// `fstat` of `file`, so size and version describe exactly what was opened.
    pub meta: Metadata,
    /// Where the file really is, relative to the root (symlinks resolved).
    pub real: String,
}

/// Refuses `target` when it, or an ancestor, matches one of its root's deny globs — as
/// spelled, and as it resolves through symlinks inside the root — or names one of fsbroker's
/// staging files (an upload in progress is nobody's to read or change but its own).
///
/// The resolved check runs before anything else looks at the file, so that a link to a
/// denied path is refused as denied and does not even reveal what kind of file it leads to.
/// It is advisory (the link could change before the open); the check on the opened
/// descriptor that follows every open is the one that holds.
///
/// fsbroker's own files ([`super::protected`]) are refused the same way, by their spelled
/// path here and, after an open, by where the descriptor really is and by its identity.
pub(crate) fn check_not_denied(target: &Resolved, raw: &str) -> Result<()> {
    if target.rel().split('/').any(super::is_staging_name) {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            "reserved for fsbroker's staging files",
        )
        .with_path(raw));
    }
    let root = target.root();
    if root.protected().is_own_file(&target.absolute(), None) {
        return Err(protected(raw));
    }
    if !root.has_deny() {
        return Ok(());
    }
    if root.is_denied(target.rel()) {
        return Err(denied_in(root, target.rel(), raw));
    }
    if let Ok(real) = target.real(raw) {
        if root.is_denied(real.rel()) {
            return Err(denied_in(root, real.rel(), raw));
        }
        if root.protected().is_own_file(&real.absolute(), None) {
            return Err(protected(raw));
        }
    }
    Ok(())
}

/// The refusal of a path denied by a glob.
pub(crate) fn denied(raw: &str) -> Error {
    Error::new(ErrorKind::PermissionDenied, "denied by policy").with_path(raw)
}

/// The refusal of `rel` in `root`, denied by a glob: one of the managed policy's says so.
pub(crate) fn denied_in(root: &super::Root, rel: &str, raw: &str) -> Error {
    if root.denied_by_managed(rel) {
        return Error::new(
            ErrorKind::PermissionDenied,
            "denied by your organisation's managed policy ([roots] deny)",
        )
        .with_path(raw);
    }
    denied(raw)
}

/// The refusal of one of fsbroker's own files.
pub(crate) fn protected(raw: &str) -> Error {
    Error::new(ErrorKind::PermissionDenied, super::protected::OWN_FILE).with_path(raw)
}

/// Opens a regular file for reading.
///
/// The type is checked before the open (so a device node is never opened, and a FIFO never
/// waits for a writer) and again with `fstat` on the descriptor (so a swap between the two
/// cannot slip a non-regular file through). `O_NONBLOCK` is the second guard against a FIFO.
pub(crate) fn open_regular(target: &Resolved, raw: &str) -> Result<RegularFile> {
    check_not_denied(target, raw)?;
    let root = target.root();
    let dir = root.dir();
    let rel = target.rel_path();
    let pre = dir.metadata(rel).map_err(|e| Error::from_io(&e, raw))?;
    require_regular(pre.file_type(), raw)?;
    let mut opts = OpenOptions::new();
    opts.read(true)
        .follow(cap_fs_ext::FollowSymlinks::Yes)
        .custom_flags(
            rustix::fs::OFlags::NONBLOCK.bits() as i32 | rustix::fs::OFlags::NOCTTY.bits() as i32,
        );
    let file = dir
        .open_with(rel, &opts)
        .map_err(|e| Error::from_io(&e, raw))?
        .into_std();
    let meta = file.metadata().map_err(|e| Error::from_io(&e, raw))?;
    if !meta.is_file() {
        let what = describe(CapMetadata::from_just_metadata(meta.clone()).file_type());
        return Err(not_regular(what, raw));
    }
    let real = real_rel(root, &file, raw)?;
    if root.is_denied(&real) {
        return Err(denied_in(root, &real, raw));
    }
    if root
        .protected()
        .is_own_file(&root.join(&real), Some(super::protected::id_of(&meta)))
    {
        return Err(protected(raw));
    }
    Ok(RegularFile { file, meta, real })
}

/// Opens a directory beneath the root and returns its capability and its real path
/// relative to the root (which differs from `target.rel` when a symlink was followed).
pub(crate) fn open_dir(target: &Resolved, raw: &str) -> Result<(Dir, String)> {
    check_not_denied(target, raw)?;
    let root = target.root();
    let dir = root.dir();
    let opened = if target.is_root() {
        dir.try_clone()
    } else {
        let meta = dir
            .metadata(target.rel_path())
            .map_err(|e| Error::from_io(&e, raw))?;
        if !meta.is_dir() {
            return Err(Error::new(
                ErrorKind::InvalidPath,
                format!("not a directory ({})", describe(meta.file_type())),
            )
            .with_path(raw));
        }
        dir.open_dir(target.rel_path())
    }
    .map_err(|e| Error::from_io(&e, raw))?;
    // Always asked of the kernel, deny globs or not: consent and fsbroker's own files are
    // judged where the directory really is, not where a link in its spelling pointed.
    let real = {
        let real = real_rel(root, &opened, raw)?;
        if root.is_denied(&real) {
            return Err(denied_in(root, &real, raw));
        }
        real
    };
    Ok((opened, real))
}

/// Opens the subdirectory `name` of `parent` without following a symlink, for walks that
/// must never leave the tree they started in.
pub(crate) fn open_child_dir(parent: &Dir, name: &std::ffi::OsStr) -> std::io::Result<Dir> {
    parent.open_dir_nofollow(name)
}

/// The descriptor's path relative to the root, from `/proc/self/fd`.
///
/// Deny globs are written against paths inside the root, but a symlink inside the root can
/// lead to a denied file under another name, and locks must name a file the same way however
/// it was reached; so after opening, the kernel is asked where the descriptor really is.
/// Failing to tell, or a path that is no longer under the root (it was moved away), refuses
/// the request: an unanswerable question about a deny glob must not be answered "allowed".
pub(crate) fn real_rel(root: &Root, fd: &impl AsFd, raw: &str) -> Result<String> {
    let link = PathBuf::from(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()));
    // Where an open descriptor is, asked of the kernel: a readlink, never an open.
    #[allow(clippy::disallowed_methods)]
    let real = std::fs::read_link(&link).map_err(|e| {
        Error::new(
            ErrorKind::PermissionDenied,
            format!("cannot check deny globs: {e}"),
        )
        .with_path(raw)
    })?;
    let rest = real
        .strip_prefix(root.path())
        .map_err(|_| Error::outside_roots().with_path(raw))?;
    rest.to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::new(ErrorKind::InvalidPath, "path is not UTF-8").with_path(raw))
}

fn require_regular(ft: FileType, raw: &str) -> Result<()> {
    if ft.is_file() {
        Ok(())
    } else {
        Err(not_regular(describe(ft), raw))
    }
}

fn not_regular(what: &str, raw: &str) -> Error {
    Error::new(
        ErrorKind::InvalidPath,
        format!("not a regular file ({what})"),
    )
    .with_path(raw)
}

/// Names a cap-std file type for messages and for `files/list`'s `other` cases.
pub(crate) fn describe(ft: FileType) -> &'static str {
    use cap_std::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_file() {
        "a regular file"
    } else if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "an unknown kind of file"
    }
}

/// An opaque version token that changes whenever the file does: its identity (device and
/// inode, which an atomic replace changes), size, and modification and change times to the
/// nanosecond (the change time also moves when a `touch -d` sets the modification time back).
pub(crate) fn etag(meta: &Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}-{:x}.{:x}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

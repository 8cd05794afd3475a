//! Resolving a path of the confinement once, by descriptors, so that what is checked is what
//! is granted.
//!
//! A path is named, checked, and later opened for its Landlock rule. Between a check by name
//! and an open by name, another process (a sibling instance of the same server, writing its
//! read-write root) can swap a directory for a link (`renameat2(RENAME_EXCHANGE)`), and the
//! open follows the link to whatever it names. So [`resolve`] walks a path one component at a
//! time, each opened `O_PATH | O_NOFOLLOW` beneath the descriptor of the one before: every
//! link it meets is seen as a link, refused if it lies where the server may write, and
//! followed by its target otherwise. What it returns is the identity (device and inode) of
//! what it reached; the kernel step opens the canonical path again with no link allowed at
//! all and grants it only if it is the same file ([`super::kernel::prepare`]).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use crate::limits::MAX_LINKS;
use rustix::fs::{FileType, Mode, OFlags};

/// Where a walk ended.
#[derive(Debug)]
pub(crate) enum Walk {
    /// The path leads to an existing file or directory.
    Found {
        /// Its canonical path, as walked.
        path: PathBuf,
        /// Its device and inode.
        id: (u64, u64),
        /// The walk's descriptor of it (`O_PATH`).
        fd: OwnedFd,
    },
    /// Nothing is there (or the walk could not go on: a loop, a file in the middle).
    Absent,
    /// The path goes through a link that lies in one of the writable paths.
    Planted {
        /// The link.
        link: PathBuf,
        /// Where it leads (as far as can be told; for the message).
        to: PathBuf,
    },
}

/// Walks `path` (absolute; relative paths are taken from `/`) by descriptors, following
/// links except those lying in `writable` (canonical paths; `/` refuses every link).
pub(crate) fn resolve(path: &Path, writable: &[PathBuf]) -> Walk {
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(mut fd) = rustix::fs::open("/", flags | OFlags::DIRECTORY, Mode::empty()) else {
        return Walk::Absent;
    };
    let mut at = PathBuf::from("/");
    let mut todo: VecDeque<OsString> = names(path);
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        if name == ".." {
            let Ok(up) = rustix::fs::openat(&fd, "..", flags | OFlags::DIRECTORY, Mode::empty())
            else {
                return Walk::Absent;
            };
            fd = up;
            at.pop();
            continue;
        }
        let Ok(next) = rustix::fs::openat(&fd, name.as_os_str(), flags, Mode::empty()) else {
            return Walk::Absent;
        };
        let Ok(st) = rustix::fs::fstat(&next) else {
            return Walk::Absent;
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let link = at.join(&name);
                if writable.iter().any(|w| at.starts_with(w)) {
                    let to = link.canonicalize().unwrap_or_default();
                    return Walk::Planted { link, to };
                }
                links += 1;
                if links > MAX_LINKS {
                    return Walk::Absent;
                }
                let Ok(target) = rustix::fs::readlinkat(&next, "", Vec::new()) else {
                    return Walk::Absent;
                };
                let target: PathBuf =
                    <OsString as std::os::unix::ffi::OsStringExt>::from_vec(target.into_bytes())
                        .into();
                if target.is_absolute() {
                    let Ok(root) = rustix::fs::open("/", flags | OFlags::DIRECTORY, Mode::empty())
                    else {
                        return Walk::Absent;
                    };
                    fd = root;
                    at = PathBuf::from("/");
                }
                for part in names(&target).into_iter().rev() {
                    todo.push_front(part);
                }
            }
            kind => {
                if !todo.is_empty() && kind != FileType::Directory {
                    return Walk::Absent;
                }
                at.push(&name);
                fd = next;
            }
        }
    }
    match rustix::fs::fstat(&fd) {
        Ok(st) => Walk::Found {
            path: at,
            id: (st.st_dev, st.st_ino),
            fd,
        },
        Err(_) => Walk::Absent,
    }
}

/// The names of `path`'s components, `..` kept, `/` and `.` dropped.
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_followed_except_where_the_server_may_write() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        let rw = base.join("rw");
        std::fs::create_dir_all(base.join("elsewhere/sub")).unwrap();
        std::fs::create_dir(&rw).unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), base.join("outer-link")).unwrap();
        std::os::unix::fs::symlink(base.join("elsewhere"), rw.join("planted")).unwrap();
        let Walk::Found { path, .. } =
            resolve(&base.join("outer-link/sub"), std::slice::from_ref(&rw))
        else {
            panic!("a link outside the writable paths is followed");
        };
        assert_eq!(path, base.join("elsewhere/sub"));
        assert!(matches!(
            resolve(&rw.join("planted/sub"), std::slice::from_ref(&rw)),
            Walk::Planted { .. }
        ));
        assert!(matches!(
            resolve(&base.join("outer-link"), &[PathBuf::from("/")]),
            Walk::Planted { .. }
        ));
        assert!(matches!(resolve(&base.join("missing"), &[]), Walk::Absent));
        let Walk::Found { path, .. } = resolve(&base.join("rw/../elsewhere"), &[rw]) else {
            panic!("`..` is walked");
        };
        assert_eq!(path, base.join("elsewhere"));
    }
}

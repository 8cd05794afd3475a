//! The files of one audit log: opening the current one, noticing that another broker rolled
//! it over, and rolling it over (`[audit] max_bytes`).
//!
//! A full file is kept beside the log as `NAME.<UTC time>` (`audit.jsonl.20261123T080000.123Z`,
//! so the kept files sort in order and a shell glob lists them oldest first), made read-only,
//! and a new file takes its place at the path in one `rename`. Kept files share the log's name
//! as a prefix, which is what keeps them among fsbroker's protected files
//! ([`crate::sandbox::protected`]).

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// Opens (or creates, owner-only) the log file at `path` for reading and appending. A symlink
/// at the path (to `/dev/null`, to another file) is refused rather than followed, so the log
/// cannot be diverted by a link, and so is a FIFO or socket put there (a writer would block or
/// lose its lines). A regular file, or a device the user named (`/dev/full` in tests), is used.
///
/// A process that may read the log (a confined server whose root holds it) can take a lease
/// on it, which would make a plain open wait out the kernel's `lease-break-time` (45 s). The
/// open is therefore non-blocking, tried again until `until` (`None`: until it succeeds), then
/// `TimedOut`.
pub(super) fn open(path: &Path, until: Option<Instant>) -> std::io::Result<File> {
    let mut nap = Duration::from_millis(1);
    let file = loop {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path);
        match opened {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if until.is_some_and(|u| Instant::now() >= u) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("{}: another process holds a lease on it", path.display()),
                    ));
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(50));
            }
            other => break other?,
        }
    };
    let kind = file.metadata()?.file_type();
    if !(kind.is_file() || std::os::unix::fs::FileTypeExt::is_char_device(&kind)) {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(file)
}

/// Whether `file` is no longer the file at `path`: another broker rolled the log over, or the
/// file was removed or replaced (by a symlink too: the path itself is looked at).
pub(super) fn moved_away(file: &File, path: &Path) -> std::io::Result<bool> {
    let open = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok((now.dev(), now.ino()) != (open.dev(), open.ino())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    }
}

/// Whether `other` names the same file as `file` (a kept name that is still a link to the
/// log's current file).
pub(super) fn same_file(file: &File, other: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(other)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Links the log's current file under the name it is kept as, and returns that name. The
/// file stays at `path` too until [`replace`] puts the new one there.
pub(super) fn keep(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the audit log's path has no file name"))?;
    // 2026-11-23T08:00:00.123Z → 20261123T080000.123Z
    let stamp: String = crate::rfc3339::format(SystemTime::now())
        .chars()
        .filter(|c| *c != '-' && *c != ':')
        .collect();
    for n in 0u32.. {
        let mut kept = name.to_os_string();
        kept.push(format!(".{stamp}"));
        if n > 0 {
            // Zero-padded, so the names still sort in order.
            kept.push(format!("-{n:03}"));
        }
        let kept = path.with_file_name(kept);
        match std::fs::hard_link(path, &kept) {
            Ok(()) => return Ok(kept),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

/// Writes the new file, holding `first` (one line, without its newline), beside the log as
/// `NAME.new-PID`, synced; [`install`] then puts it in place. Returns its path, and the file
/// open for appending.
pub(super) fn prepare(path: &Path, first: &[u8]) -> std::io::Result<(PathBuf, File)> {
    // Named after the log, so it is protected like the log while it exists.
    let mut temp = path.as_os_str().to_os_string();
    temp.push(format!(".new-{}", std::process::id()));
    let temp = PathBuf::from(temp);
    let create = || {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
    };
    let mut file = match create() {
        // Left by a broker of this pid that died mid-roll: it holds nothing worth keeping.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&temp)?;
            create()?
        }
        other => other?,
    };
    let mut line = first.to_vec();
    line.push(b'\n');
    if let Err(e) = file.write_all(&line).and_then(|()| file.sync_data()) {
        discard(&temp);
        return Err(e);
    }
    Ok((temp, file))
}

/// Renames the prepared file onto the log's path, and makes the rename durable.
pub(super) fn install(temp: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Removes a prepared file that will not be used.
pub(super) fn discard(temp: &Path) {
    let _ = std::fs::remove_file(temp);
}

/// Removes the kept name of a roll-over that did not happen (the file stays at the path).
pub(super) fn unkeep(kept: &Path) {
    let _ = std::fs::remove_file(kept);
}

/// Makes a kept file read-only: nothing is appended to it any more, and a writer that tries
/// by its name is stopped (brokers holding it open notice the roll-over before they append).
pub(super) fn finish(full: &File, kept: &Path) {
    if let Err(e) = full.set_permissions(std::fs::Permissions::from_mode(0o400)) {
        tracing::warn!(kept = %kept.display(), error = %e, "cannot make the kept audit log read-only");
    }
}

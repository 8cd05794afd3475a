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

use serde_json::Value;

use super::chain::{Fields, Line, chain_line};
use super::{AuditLog, event};

/// What a roll-over did: the new file, if it is in place, and the lines written.
#[derive(Default)]
pub(super) struct Rolled {
    pub(super) file: Option<File>,
    pub(super) lines: Vec<Line>,
}

impl AuditLog {
    /// Rolls the log over, holding the full file's lock: the full file is kept under a new
    /// name and ends with a `rotate` line naming it; a new file at the path begins with a
    /// `continue` line whose `prev` is that line's hash. The path is never missing (the new
    /// file replaces it in one rename), so a broker starting meanwhile opens one or the other,
    /// and a broker still holding the full file finds out at its next append
    /// (`rotate::moved_away`).
    ///
    /// The new file is ready before the full one is touched: when the roll-over cannot be
    /// prepared (no hard links on this file system, no room for the new file) nothing is
    /// written and the log carries on in the full file (`Rolled::file` is `None`). An error
    /// is a failed write to the log itself.
    pub(super) fn roll(&self, full: &File, len: u64, prev: &str) -> std::io::Result<Rolled> {
        let cannot = |e: std::io::Error| {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot roll the audit log over; it keeps growing");
        };
        let kept = match keep(&self.path) {
            Ok(kept) => kept,
            Err(e) => {
                cannot(e);
                return Ok(Rolled::default());
            }
        };
        let kept_name = kept
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut end = event("rotate");
        end.insert("file", Value::from(kept_name.clone()));
        let (end_line, end_fields) = chain_line(prev, end);
        let mut next = event("continue");
        next.insert("from", Value::from(kept_name));
        let (next_line, next_fields) =
            chain_line(end_fields["hash"].as_str().unwrap_or_default(), next);
        let (temp, file) = match prepare(&self.path, &next_line) {
            Ok(ready) => ready,
            Err(e) => {
                unkeep(&kept);
                cannot(e);
                return Ok(Rolled::default());
            }
        };
        let mut bytes = end_line.clone();
        bytes.push(b'\n');
        let ended = (&*full).write_all(&bytes).and_then(|()| full.sync_data());
        if let Err(e) = ended {
            // As for any line: a rotate line written in part is cut back off.
            if let Err(cut) = full.set_len(len) {
                tracing::error!(path = %self.path.display(), error = %cut, "cannot remove a partly written audit line");
            }
            unkeep(&kept);
            discard(&temp);
            return Err(e);
        }
        if let Err(e) = install(&temp, &self.path) {
            // The full file ends in a rotate line yet stays the log: the next line follows
            // it in the same file, and the chain is whole.
            unkeep(&kept);
            discard(&temp);
            cannot(e);
            return Ok(Rolled {
                file: None,
                lines: vec![(end_line, end_fields)],
            });
        }
        finish(full, &kept);
        tracing::info!(path = %self.path.display(), kept = %kept.display(), "audit log rolled over");
        Ok(Rolled {
            file: Some(file),
            lines: vec![(end_line, end_fields), (next_line, next_fields)],
        })
    }

    /// Finishes a roll-over whose broker died after writing the rotate line (the full file,
    /// `full`, ends with it, its head `prev`; `kept` is its kept name): the new file, with its
    /// `continue` line, is put at the path. `None` when that cannot be done now (the log goes
    /// on in the full file, after its rotate line, which `verify` accepts).
    pub(super) fn finish_roll(
        &self,
        full: &File,
        prev: &str,
        kept: &Path,
    ) -> std::io::Result<Option<(File, Vec<u8>, Fields)>> {
        let mut next = event("continue");
        let name = kept.file_name().map(|n| n.to_string_lossy().into_owned());
        next.insert("from", Value::from(name.unwrap_or_default()));
        let (line, fields) = chain_line(prev, next);
        let ready = prepare(&self.path, &line).and_then(|(temp, file)| {
            install(&temp, &self.path).inspect_err(|_| discard(&temp))?;
            Ok(file)
        });
        match ready {
            Ok(file) => {
                finish(full, kept);
                tracing::warn!(path = %self.path.display(), kept = %kept.display(), "finished a roll-over of the audit log that another broker began");
                Ok(Some((file, line, fields)))
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot finish an interrupted roll-over; the log goes on in the full file");
                Ok(None)
            }
        }
    }
}

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

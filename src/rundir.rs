//! The user's private runtime directory for fsbroker: what the brokers and proxies of one
//! user share and a server must never reach.
//!
//! It holds two kinds of file:
//! - the lock every broker appending to one audit log takes ([`LockFile`]). It used to be the
//!   log file's own `flock`, but a confined server may read the log (it can sit in a root), and
//!   Landlock does not stop `flock` on a descriptor opened for reading: a server holding that
//!   lock froze every broker on the log;
//! - the key of a shared broker's socket ([`ProxyKey`]): a proxy proves with it that its link
//!   is a proxy's, so what it reports about its server (name, era, confinement) is taken, and
//!   the same message from a server is not.
//!
//! The directory is `/run/user/UID/fsbroker` when the system has a runtime directory for the
//! user, else `/tmp/fsbroker-UID`. It is chosen from the user id alone, not from the
//! environment, so two brokers sharing a log always find the same lock whatever `TMPDIR` or
//! `XDG_RUNTIME_DIR` each was started with; it still moves when `/run/user/UID` comes or goes
//! (logind removes it at logout), so the files of every broker are protected in both places.
//! `proxy --confine` never grants a server either place (both are shared directories its
//! guard refuses), and the directory is refused unless it is a real directory owned by the
//! user and closed to everyone else.

// Ambient `std::fs` calls are allowed here (clippy.toml): the user's private runtime directory is the broker's own.
#![allow(clippy::disallowed_methods)]

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::limits::KEY_WAIT_TRIES;
use rustix::fs::{FlockOperation, Mode, OFlags};
use sha2::{Digest, Sha256};

/// Where the directory is (it may not exist yet): the first of [`places`] when the system
/// has a runtime directory for the user, else the second.
fn place() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    let [system, tmp] = places();
    if system.parent().is_some_and(|run| owned_dir(run, uid)) {
        system
    } else {
        tmp
    }
}

/// Where this process, as a broker, writes its console's URL unless told otherwise
/// (`--console-url-file`): `console-PID.url` in the user's private runtime directory, which
/// no server is ever granted. One file per broker: several brokers' consoles run at once, and
/// one that exits takes only its own file with it. `fsbroker console` finds them all
/// ([`console_url_files`]).
pub fn console_url_file() -> io::Result<PathBuf> {
    Ok(dir()?.join(console_url_name(std::process::id())))
}

/// The URL files of the brokers running now that wrote theirs to the default place
/// ([`console_url_file`]), each with its broker's process id, oldest first. A file whose
/// broker is no longer running (killed before it could remove it) is left out, but not
/// removed: seen from another process namespace, a running broker looks gone too.
pub fn console_url_files() -> io::Result<Vec<(u32, PathBuf)>> {
    let dir = dir()?;
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| at(&dir, e))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(CONSOLE_URL_PREFIX))
            .and_then(|n| n.strip_suffix(CONSOLE_URL_SUFFIX))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        // EPERM: it runs, as another user (it cannot have written here, but it is not gone).
        let running = rustix::process::Pid::from_raw(pid as i32).is_some_and(|p| {
            matches!(
                rustix::process::test_kill_process(p),
                Ok(()) | Err(rustix::io::Errno::PERM)
            )
        });
        if !running {
            continue;
        }
        found.push((meta.modified().ok(), pid, entry.path()));
    }
    found.sort();
    Ok(found
        .into_iter()
        .map(|(_, pid, path)| (pid, path))
        .collect())
}

fn console_url_name(pid: u32) -> String {
    format!("{CONSOLE_URL_PREFIX}{pid}{CONSOLE_URL_SUFFIX}")
}

/// The directory, made owner-only on first use.
pub(crate) fn dir() -> io::Result<PathBuf> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = place();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(at(&dir, e)),
    }
    // Another user may have made it first (`/tmp` is shared), or it may be a link: refuse it
    // rather than share a lock or a key with whoever controls it.
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| at(&dir, e))?;
    if !meta.file_type().is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(at(
            &dir,
            io::Error::other(
                "not a private directory of this user (it must be a directory, owned by the \
                 user, mode 0700); remove it and start again",
            ),
        ));
    }
    Ok(dir)
}

fn owned_dir(path: &Path, uid: u32) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_dir() && m.uid() == uid)
}

/// An error that names the path it is about.
fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// The name under which something about `path` is kept: a digest of its canonical form, so
/// every process naming the same file, however spelled, finds the same entry.
fn entry(prefix: &str, path: &Path, suffix: &str) -> io::Result<PathBuf> {
    let name = entry_name(prefix, path, suffix)?;
    Ok(dir()?.join(name))
}

fn entry_name(prefix: &str, path: &Path, suffix: &str) -> io::Result<String> {
    let canonical = canonical(path)?;
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{prefix}-{hex}{suffix}"))
}

/// Where the lock of the audit log at `log` and the key of the socket at `socket` are, and
/// the console's URL file and opener page (for the broker's own files: no request reaches
/// them, and `proxy --confine` names them when a server would be given them).
pub(crate) fn own_files(logs: &[PathBuf], socket: Option<&Path>) -> Vec<PathBuf> {
    let dir = place();
    let logs = logs
        .iter()
        .filter_map(|l| entry_name("audit", l, ".lock").ok());
    let key = socket.and_then(|s| entry_name("listen", s, ".key").ok());
    logs.chain(key)
        .chain([
            console_url_name(std::process::id()),
            CONSOLE_OPENER.to_owned(),
        ])
        .map(|name| dir.join(name))
        .collect()
}

/// Every broker's files in the directory, as the starts of their names: the keys of shared
/// brokers' sockets (`listen-…`) and the locks of audit logs (`audit-…`). A root that holds
/// the directory (`/tmp`, `/run/user/UID`) must not hand another broker's key to a server,
/// whichever broker it asks. In both places the directory may be ([`places`]): a broker
/// started after `/run/user/UID` went (logind removes it at logout) writes to the other.
pub(crate) fn every_brokers_files() -> Vec<PathBuf> {
    places()
        .into_iter()
        .flat_map(|dir| [dir.join("listen-"), dir.join("audit-")])
        .collect()
}

/// The folder of the person's cached sign-ins to remote servers (`proxy --url`): in the
/// user's private state directory, `$XDG_STATE_HOME/fsbroker/sign-in`, else
/// `~/.local/state/fsbroker/sign-in`. `None` when neither variable is an absolute path.
pub(crate) fn sign_in_dir() -> Option<PathBuf> {
    let absolute = |var| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    let base =
        absolute("XDG_STATE_HOME").or_else(|| absolute("HOME").map(|h| h.join(".local/state")))?;
    Some(base.join("fsbroker").join("sign-in"))
}

/// The start of the name of every file of the sign-in cache (`token-…`, and the temporary
/// files a save writes through, `token-….tmp`): each holds a person's tokens, so no server
/// may read or replace one, whatever root holds the state directory.
pub(crate) const SIGN_IN_FILE: &str = "token-";

/// [`sign_in_dir`]'s files, as the start of their names (for the broker's protected files).
pub(crate) fn sign_in_files() -> Vec<PathBuf> {
    sign_in_dir()
        .map(|d| d.join(SIGN_IN_FILE))
        .into_iter()
        .collect()
}

/// Both places the directory may be, whichever it is now: it moves when `/run/user/UID`
/// comes or goes, and a broker's protection must cover another broker's files wherever
/// that one put them.
fn places() -> [PathBuf; 2] {
    let uid = rustix::process::geteuid().as_raw();
    [
        PathBuf::from(format!("/run/user/{uid}/fsbroker")),
        PathBuf::from(format!("/tmp/fsbroker-{uid}")),
    ]
}

/// The consoles' files in the directory, as the start of their names: every broker's URL file
/// (`console-PID.url`, where a broker writes it unless told otherwise) and the page `fsbroker
/// console` hands the browser (`console-open.html`). Each carries a console's secret, and is
/// rewritten through a temporary sibling (`NAME.RANDOM.tmp`) that carries it too; another
/// broker's is as secret as this one's.
pub(crate) fn console_files() -> Vec<PathBuf> {
    places()
        .into_iter()
        .map(|dir| dir.join(CONSOLE_URL_PREFIX))
        .collect()
}

/// How the consoles' URL files in the directory are named: `console-PID.url`.
const CONSOLE_URL_PREFIX: &str = "console-";
const CONSOLE_URL_SUFFIX: &str = ".url";
/// The page `fsbroker console` hands the browser, which forwards it to the console (its name
/// starts as the URL files' do, so that one prefix covers them all).
const CONSOLE_OPENER: &str = "console-open.html";

/// Where `fsbroker console` writes the page it hands the browser (it carries a one-time
/// ticket to the console): always here, never beside a URL file named elsewhere.
pub fn console_opener_file() -> io::Result<PathBuf> {
    Ok(dir()?.join(CONSOLE_OPENER))
}

/// `path` with its folder resolved (the file itself may not exist yet, or be a socket).
fn canonical(path: &Path) -> io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| at(path, io::Error::other("names no file")))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // An audit log's folder may not exist yet: the broker creates it when it opens the log,
    // after the policy has named the log's lock among its own files. The deepest folder that
    // exists stands for it, with the rest as written, so the name found before the folders
    // are made is the name found after.
    let mut missing = Vec::new();
    let mut existing = parent;
    loop {
        match existing.canonicalize() {
            Ok(real) => {
                let mut out = real;
                out.extend(missing.iter().rev());
                return Ok(out.join(name));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match (existing.parent(), existing.file_name()) {
                    (Some(up), Some(last)) => {
                        missing.push(last);
                        existing = if up.as_os_str().is_empty() {
                            Path::new(".")
                        } else {
                            up
                        };
                    }
                    _ => return Err(at(parent, e)),
                }
            }
            Err(e) => return Err(at(parent, e)),
        }
    }
}

/// An exclusive lock, by file, on something every broker of the user may share (an audit
/// log), taken with a deadline: nothing that holds it can make a broker wait longer.
#[derive(Debug)]
pub(crate) struct LockFile {
    path: PathBuf,
    /// Taken and let go by appends.
    fd: OwnedFd,
    /// A second open file, for [`LockFile::wait_free`]: `flock` belongs to the open file, so
    /// checking through the appends' own would take (and then drop) their lock.
    probe: OwnedFd,
}

/// How long a waiter sleeps between tries at most: short enough that an append waits little
/// past the moment the lock is let go.
const MAX_NAP: Duration = Duration::from_millis(10);

impl LockFile {
    /// The lock for the file at `path`.
    pub(crate) fn for_file(path: &Path) -> io::Result<LockFile> {
        let lock = entry("audit", path, ".lock")?;
        let open = || {
            rustix::fs::open(
                &lock,
                OFlags::RDWR
                    | OFlags::CREATE
                    | OFlags::NOFOLLOW
                    | OFlags::CLOEXEC
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| at(&lock, e.into()))
        };
        Ok(LockFile {
            fd: open()?,
            probe: open()?,
            path: lock,
        })
    }

    /// Takes the lock, waiting until `until` at most (`None`: as long as it takes). Past the
    /// deadline: `TimedOut`.
    pub(crate) fn take(&self, until: Option<Instant>) -> io::Result<Held<'_>> {
        try_until(&self.fd, until, &self.path)?;
        Ok(Held(self))
    }

    /// Waits until nobody holds the lock (and lets it go again at once): what work about to
    /// act checks, so that it does not act when its audit line could not be written in time.
    pub(crate) fn wait_free(&self, until: Instant) -> io::Result<()> {
        try_until(&self.probe, Some(until), &self.path)?;
        let _ = rustix::fs::flock(&self.probe, FlockOperation::Unlock);
        Ok(())
    }
}

fn try_until(fd: &OwnedFd, until: Option<Instant>, path: &Path) -> io::Result<()> {
    let mut nap = Duration::from_micros(50);
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(at(path, e.into())),
        }
        let now = Instant::now();
        if until.is_some_and(|u| now >= u) {
            return Err(at(
                path,
                io::Error::new(io::ErrorKind::TimedOut, "held by another process"),
            ));
        }
        let left = until.map_or(nap, |u| u - now);
        std::thread::sleep(nap.min(left));
        nap = (nap * 2).min(MAX_NAP);
    }
}

/// The lock, held until dropped.
pub(crate) struct Held<'a>(&'a LockFile);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.0.fd, FlockOperation::Unlock);
    }
}

/// The key of a shared broker's socket: random for each run, in an owner-only file of the
/// runtime directory that the proxies of the same user read. Removed when dropped.
#[derive(Debug)]
pub(crate) struct ProxyKey {
    path: PathBuf,
    key: String,
}

/// The length of a key, in hex digits (256 bits).
const KEY_HEX: usize = 64;

impl ProxyKey {
    /// Makes a new key for the socket at `socket` (replacing one a killed broker left).
    pub(crate) fn create(socket: &Path) -> io::Result<ProxyKey> {
        let path = entry("listen", socket, ".key")?;
        let key = crate::random::hex(KEY_HEX / 2);
        // Written whole under a temporary name and renamed into place, so a proxy never
        // reads half a key.
        let temp = path.with_extension(format!("tmp{}", crate::random::hex(6)));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(|e| at(&temp, e))?;
        let written = file
            .write_all(key.as_bytes())
            .and_then(|()| std::fs::rename(&temp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(at(&path, e));
        }
        Ok(ProxyKey { path, key })
    }

    /// Reads the key of the shared broker listening at `socket` (what a proxy sends it). A
    /// broker writes it just after its socket appears: a missing key is waited for a moment.
    pub(crate) fn read(socket: &Path) -> io::Result<String> {
        let mut tries = 0;
        loop {
            match ProxyKey::read_once(socket) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < KEY_WAIT_TRIES => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                done => return done,
            }
        }
    }

    fn read_once(socket: &Path) -> io::Result<String> {
        let path = entry("listen", socket, ".key")?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| at(&path, e))?;
        let mut key = String::new();
        file.take(KEY_HEX as u64 + 1)
            .read_to_string(&mut key)
            .map_err(|e| at(&path, e))?;
        if key.len() != KEY_HEX || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(at(&path, io::Error::other("not a key")));
        }
        Ok(key)
    }

    /// Whether `offered` is this key, compared in constant time.
    pub(crate) fn matches(&self, offered: &str) -> bool {
        let (a, b) = (self.key.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}

impl Drop for ProxyKey {
    fn drop(&mut self) {
        // Only our own: a broker started since on the same socket has replaced it.
        if std::fs::read_to_string(&self.path).is_ok_and(|k| k == self.key) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The other place is protected too: a broker started after `/run/user/UID` came or went
    /// keeps its key and its console's URL there.
    #[test]
    fn every_brokers_files_are_protected_in_both_places() {
        let protected: Vec<PathBuf> = every_brokers_files()
            .into_iter()
            .chain(console_files())
            .collect();
        for dir in places() {
            for start in ["listen-", "audit-", "console-"] {
                assert!(
                    protected.contains(&dir.join(start)),
                    "{}",
                    dir.join(start).display()
                );
            }
        }
        assert!(places().contains(&place()));
    }
}

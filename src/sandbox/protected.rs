//! What the broker itself trusts or writes: paths no request may read, change, move or
//! replace, whatever root, name or route it comes through.
//!
//! A server with a writable root that holds the broker's policy file could otherwise rewrite
//! the policy (the broker reloads it and obeys), and one that can write the audit log could
//! rewrite the history of what it did. So the policy file, the audit log and its rotated
//! copies, the files the consent command runs, and the `--listen` socket are *fsbroker's own
//! files*: never read, written, created, deleted or renamed through a root. The folders
//! holding them, and the roots and the folders holding roots, may not be moved, deleted or
//! replaced either, since the broker finds all of these by path again (a reload reads the
//! policy by path; a root moved away is retired).
//!
//! Each is known by its path (canonical, and as configured when that differs) — which also
//! covers what does not exist yet, such as the next rotated audit log — and by its device and
//! inode when it exists, so a hard link or a bind mount of it under another name is caught too.
//! Files made later in a known folder under a known name's prefix (a rotated audit log, the
//! console's URL file rewritten through a new file) are known by that name and their folder's
//! identity, so another path to the folder does not reach them either.

// Ambient `std::fs` calls are allowed here (clippy.toml): knowing the broker's own files by path and identity is this module's job.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;

/// Why a path may not be changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// One of fsbroker's own files: neither read nor changed.
    OwnFile,
    /// A folder holding one of fsbroker's own files: not moved, deleted or replaced.
    HoldsOwnFiles,
    /// A root's own directory.
    Root,
    /// A folder holding a root.
    HoldsRoot,
    /// Beside (beneath the folder of) a file the consent command runs.
    Sealed,
}

impl Verdict {
    /// The `data.reason` of a refusal, for an operation described by `what` ("renamed", ...).
    pub fn reason(self, what: &str) -> String {
        match self {
            Verdict::OwnFile => OWN_FILE.to_owned(),
            Verdict::HoldsOwnFiles => "protected: holds fsbroker's own files".to_owned(),
            Verdict::Root => format!("the root itself cannot be {what}"),
            Verdict::HoldsRoot => "protected: holds a root".to_owned(),
            Verdict::Sealed => "protected: beside fsbroker's consent command".to_owned(),
        }
    }
}

/// The reason given for any request on one of fsbroker's own files.
pub(crate) const OWN_FILE: &str = "protected: fsbroker's own file";

/// Whether two folders are one (device and inode), reached by different paths: a bind mount
/// of a family's folder, say. A family's members are made after the broker started (each
/// rotated log, each rewrite of the console's URL file through a new file), so their own
/// identities cannot be known in advance; their folder's can. Asked only for an entry whose
/// name already starts with a family's, so a listing pays nothing for it.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.is_dir() && id_of(&a) == id_of(&b),
        _ => false,
    }
}

/// Identities of the files this process keeps its secrets in now (the console's URL file),
/// whatever policy is in force: a hard link or a file bind mount made of one, under any name
/// in any root, is one of fsbroker's own files. A version that is replaced is emptied and
/// forgotten ([`forget_written`]): its inode number may then be given to any other file.
static WRITTEN: RwLock<Vec<Id>> = RwLock::new(Vec::new());

/// Registers the file `meta` describes as one of fsbroker's own files, for every policy, until
/// [`forget_written`]. Call it when the file is made, before anything secret is in it: a hard
/// link or a file bind mount made of it, under any name in any root, is then refused to
/// servers as the file itself is.
pub fn protect_written(meta: &std::fs::Metadata) {
    let id = id_of(meta);
    let mut written = WRITTEN.write().unwrap_or_else(|e| e.into_inner());
    if !written.contains(&id) {
        written.push(id);
    }
}

/// Forgets a file [`protect_written`] registered, once it holds nothing secret any more.
pub fn forget_written(meta: &std::fs::Metadata) {
    let id = id_of(meta);
    WRITTEN
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|w| *w != id);
}

/// A file's identity on the machine: device and inode.
pub(crate) type Id = (u64, u64);

/// The identity in `meta`.
pub(crate) fn id_of(meta: &std::fs::Metadata) -> Id {
    (meta.dev(), meta.ino())
}

/// The identity in cap-std's `meta`.
pub(crate) fn cap_id_of(meta: &cap_std::fs::Metadata) -> Id {
    use cap_std::fs::MetadataExt as _;
    (meta.dev(), meta.ino())
}

/// fsbroker's own files, the roots, and everything that holds them.
#[derive(Debug, Default)]
pub struct Protected {
    /// Own files by absolute path (canonical, and as configured).
    files: Vec<PathBuf>,
    /// Audit logs as (folder, file name): a sibling whose name starts with the file's name
    /// (`audit.jsonl.1`, `audit.jsonl-20261123.gz`) is a rotated copy, own too.
    families: Vec<(PathBuf, OsString)>,
    /// The roots' canonical paths.
    roots: Vec<PathBuf>,
    /// Identities of the own files that exist (refreshed once the broker has created its
    /// audit log: [`Protected::refresh`]).
    file_ids: RwLock<HashMap<Id, Verdict>>,
    /// Folders holding the files the consent command runs: nothing beneath them may change,
    /// since a program picks up what lies beside it (a script's modules, its packages and their
    /// compiled `__pycache__`, a `source`d file).
    sealed: Vec<PathBuf>,
    /// Identities of roots, and of every folder above an own file or a root.
    dir_ids: HashMap<Id, Verdict>,
    /// Identities of folders above an own file that were made after the policy was compiled
    /// (an audit log's folders, created when the log is opened): [`Protected::refresh`].
    late_dir_ids: RwLock<HashMap<Id, Verdict>>,
}

/// What to protect, as configured; [`Protected::new`] resolves it.
#[derive(Debug, Default, Clone)]
pub struct ProtectedSpec {
    /// Own files: the policy file, the audit log, the consent command's files, the socket.
    pub files: Vec<PathBuf>,
    /// The files the consent command runs (also in `files`): their folders are sealed.
    pub command: Vec<PathBuf>,
    /// Audit logs, whose rotated siblings are own files too.
    pub audit_logs: Vec<PathBuf>,
    /// Files rewritten through a temporary sibling named after them (`NAME.RANDOM.tmp`),
    /// which holds what the file holds: own files, and so is every sibling whose name starts
    /// with theirs (the console's URL file and opener page, which carry its secrets).
    pub rewritten: Vec<PathBuf>,
    /// The roots, as configured (their canonical paths and every link on the way are
    /// protected).
    pub roots: Vec<PathBuf>,
}

impl Protected {
    /// Resolves `spec`: absolute and canonical paths, and the identities of what exists now.
    pub fn new(spec: &ProtectedSpec) -> Protected {
        let mut p = Protected::default();
        let mut holders: Vec<(PathBuf, Verdict)> = Vec::new();
        for file in spec
            .files
            .iter()
            .chain(&spec.audit_logs)
            .chain(&spec.rewritten)
        {
            for path in spellings(file) {
                holders.push((path.clone(), Verdict::HoldsOwnFiles));
                push_unique(&mut p.files, path);
            }
        }
        for file in &spec.command {
            for path in spellings(file) {
                if let Some(dir) = path.parent() {
                    push_unique(&mut p.sealed, dir.to_path_buf());
                }
            }
        }
        for log in spec.audit_logs.iter().chain(&spec.rewritten) {
            for path in spellings(log) {
                if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
                    let family = (dir.to_path_buf(), name.to_os_string());
                    if !p.families.contains(&family) {
                        p.families.push(family);
                    }
                }
            }
        }
        for root in &spec.roots {
            for path in spellings(root) {
                holders.push((path.clone(), Verdict::HoldsRoot));
                push_unique(&mut p.roots, path);
            }
            if let Ok(meta) = std::fs::metadata(root) {
                p.dir_ids.insert(id_of(&meta), Verdict::Root);
            }
        }
        // Every folder above a protected path, by identity: a bind mount or a second name
        // for one of them is refused like the folder itself. A root's own identity wins
        // over "holds" (a root above another root is itself a root).
        for (path, verdict) in holders {
            for dir in path.ancestors().skip(1) {
                if let Ok(meta) = std::fs::metadata(dir) {
                    p.dir_ids.entry(id_of(&meta)).or_insert(verdict);
                }
            }
        }
        p.refresh();
        p
    }

    /// Learns the identities of the own files that exist now, and of the folders above them
    /// (the audit log, and any folder missing above it, is created after the policy is
    /// loaded).
    pub fn refresh(&self) {
        let ids: HashMap<Id, Verdict> = self
            .files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| (id_of(&m), Verdict::OwnFile))
            .collect();
        *self.file_ids.write().unwrap_or_else(|e| e.into_inner()) = ids;
        // The folders the broker made for its audit log did not exist when `new` looked for
        // the identities of the folders above its own files: learn the ones that exist now.
        let late: HashMap<Id, Verdict> = self
            .files
            .iter()
            .flat_map(|f| f.ancestors().skip(1))
            .filter_map(|dir| std::fs::metadata(dir).ok())
            .map(|m| id_of(&m))
            .filter(|id| !self.dir_ids.contains_key(id))
            .map(|id| (id, Verdict::HoldsOwnFiles))
            .collect();
        *self.late_dir_ids.write().unwrap_or_else(|e| e.into_inner()) = late;
    }

    /// Whether nothing is protected (no policy file, no audit log, no roots).
    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.roots.is_empty() && self.families.is_empty()
    }

    /// The own files by path, for warnings.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The folders sealed because the consent command runs files in them, for warnings.
    pub fn sealed(&self) -> &[PathBuf] {
        &self.sealed
    }

    /// Whether the entry at `abs` (absolute, symlinks resolved but for the last component),
    /// with the identity `meta` if it exists, is one of fsbroker's own files.
    pub fn is_own_file(&self, abs: &Path, id: Option<Id>) -> bool {
        match (abs.parent(), abs.file_name()) {
            (Some(dir), Some(name)) => self.is_own_entry(dir, name, id),
            _ => false,
        }
    }

    /// [`Protected::is_own_file`] for the entry `name` of the folder at `dir`, for walks that
    /// hold the folder's path already.
    pub fn is_own_entry(&self, dir: &Path, name: &std::ffi::OsStr, id: Option<Id>) -> bool {
        let bytes = name.as_encoded_bytes();
        self.files
            .iter()
            .any(|f| f.file_name() == Some(name) && f.parent() == Some(dir))
            || self.families.iter().any(|(d, n)| {
                bytes.starts_with(n.as_encoded_bytes()) && (d == dir || same_dir(d, dir))
            })
            || id.is_some_and(|id| {
                self.file_ids
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .contains_key(&id)
                    || WRITTEN
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&id)
            })
    }

    /// Whether one of fsbroker's own files lies beneath `abs` or may come to (so a tree moved
    /// there must be checked entry by entry).
    pub fn any_beneath(&self, abs: &Path) -> bool {
        self.files.iter().any(|f| f.starts_with(abs))
            || self.families.iter().any(|(d, _)| d.starts_with(abs))
    }

    /// Whether the entry at `abs` (with `meta` when it exists) may be written, created,
    /// deleted, renamed away or replaced; `None` when it may.
    pub fn change(&self, abs: &Path, id: Option<Id>) -> Option<Verdict> {
        if self.is_own_file(abs, id) {
            return Some(Verdict::OwnFile);
        }
        if self.roots.iter().any(|r| r == abs) {
            return Some(Verdict::Root);
        }
        if self.sealed.iter().any(|d| abs != d && abs.starts_with(d)) {
            return Some(Verdict::Sealed);
        }
        let above = |p: &PathBuf| p.as_path() != abs && p.starts_with(abs);
        if self.files.iter().any(above) || self.families.iter().any(|(d, _)| d == abs) {
            return Some(Verdict::HoldsOwnFiles);
        }
        if self.roots.iter().any(above) {
            return Some(Verdict::HoldsRoot);
        }
        let id = id?;
        self.dir_ids.get(&id).copied().or_else(|| {
            self.late_dir_ids
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&id)
                .copied()
        })
    }
}

/// Every absolute spelling the kernel walks through to reach `path`: as configured (`.` and
/// `..` applied), then, for each symlink met on the way, the same path with that link replaced
/// by its target, down to the canonical path. Protecting every spelling protects every link on
/// the way too — each is one of the spellings or a folder above one — so a chain like
/// `~/.config/p.toml -> ~/.dotfiles/p.toml`, `~/.dotfiles -> ~/src/dotfiles` cannot be
/// redirected at its middle hop.
pub(crate) fn spellings(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::with_capacity(2);
    let Ok(abs) = std::path::absolute(path) else {
        return out;
    };
    let mut current = lexical(&abs);
    // The kernel's own limit on links followed in one lookup.
    for _ in 0..40 {
        push_unique(&mut out, current.clone());
        match first_link(&current) {
            Some(next) => current = next,
            None => break,
        }
    }
    if let Some(c) = canonical_as_far_as_it_exists(&abs) {
        push_unique(&mut out, c);
    }
    out
}

/// `path` canonical up to its deepest ancestor that exists, and as written below it. A file
/// that does not exist yet (a rotated log, a socket) has no canonical form, and neither has an
/// audit log whose folders the broker creates when it opens the log (after the policy is
/// compiled): their deepest existing folder does.
fn canonical_as_far_as_it_exists(path: &Path) -> Option<PathBuf> {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut real) => {
                real.extend(missing.iter().rev());
                return Some(real);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                missing.push(existing.file_name()?);
                existing = existing.parent()?;
            }
            Err(_) => return None,
        }
    }
}

/// `path` with its first symlink (from the top) replaced by the link's target, or `None` when
/// no component is a link.
fn first_link(path: &Path) -> Option<PathBuf> {
    let parts: Vec<_> = path.components().collect();
    let mut prefix = PathBuf::new();
    for (i, part) in parts.iter().enumerate() {
        prefix.push(part);
        let is_link = std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink());
        if is_link {
            let target = std::fs::read_link(&prefix).ok()?;
            let mut next = prefix.parent().unwrap_or(Path::new("/")).join(target);
            next.extend(&parts[i + 1..]);
            return Some(lexical(&next));
        }
    }
    None
}

/// An absolute path with `.` and `..` applied lexically.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn push_unique(list: &mut Vec<PathBuf>, path: PathBuf) {
    if !list.contains(&path) {
        list.push(path);
    }
}

/// The consent command as it will run: its program made absolute (looked up in `PATH` now,
/// when it has no `/`, so that a program placed earlier in `PATH` later is never run instead).
/// A program that is not found stays as written; starting it fails, which is a denial.
pub(crate) fn resolve_command(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    // The command runs in `/`: a relative program or file argument is made absolute now.
    for (i, arg) in out.iter_mut().enumerate() {
        let path = Path::new(arg.as_str());
        let named = if i == 0 {
            arg.contains('/')
        } else {
            path.is_file()
        };
        if named && path.is_relative() {
            if let Some(abs) = std::path::absolute(path)
                .ok()
                .and_then(|p| p.to_str().map(str::to_owned))
            {
                *arg = abs;
            }
        }
    }
    if let Some(program) = out.first_mut() {
        if !program.contains('/') {
            let found = std::env::var_os("PATH").and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join(&*program))
                    .find(|p| p.is_file())
            });
            if let Some(found) = found.and_then(|p| p.to_str().map(str::to_owned)) {
                *program = found;
            }
        }
    }
    out
}

/// The files a (resolved) consent command runs: its program and every argument that names an
/// existing file (a script, a configuration).
pub(crate) fn command_files(argv: &[String]) -> Vec<PathBuf> {
    argv.iter()
        .enumerate()
        .map(|(i, a)| (i, PathBuf::from(a)))
        .filter(|(i, p)| *i == 0 || p.is_file())
        .map(|(_, p)| p)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_files_their_folders_and_rotated_siblings() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("proj/conf")).unwrap();
        std::fs::write(base.join("proj/conf/policy.toml"), "").unwrap();
        std::fs::write(base.join("proj/audit.jsonl"), "").unwrap();
        std::fs::write(base.join("proj/other.txt"), "").unwrap();
        std::fs::hard_link(base.join("proj/conf/policy.toml"), base.join("proj/alias")).unwrap();
        let p = Protected::new(&ProtectedSpec {
            files: vec![base.join("proj/conf/policy.toml")],
            audit_logs: vec![base.join("proj/audit.jsonl")],
            roots: vec![base.join("proj")],
            command: vec![],
            rewritten: vec![],
        });
        let id = |rel: &str| {
            std::fs::symlink_metadata(base.join(rel))
                .ok()
                .map(|m| id_of(&m))
        };
        let change = |rel: &str| p.change(&base.join(rel), id(rel));
        assert_eq!(change("proj/conf/policy.toml"), Some(Verdict::OwnFile));
        assert_eq!(change("proj/audit.jsonl"), Some(Verdict::OwnFile));
        assert_eq!(change("proj/audit.jsonl.1"), Some(Verdict::OwnFile));
        assert_eq!(change("proj/alias"), Some(Verdict::OwnFile), "a hard link");
        assert_eq!(change("proj/conf"), Some(Verdict::HoldsOwnFiles));
        assert_eq!(change("proj"), Some(Verdict::Root));
        assert_eq!(change("proj/other.txt"), None);
        assert_eq!(change("proj/conf/new.txt"), None);
        assert_eq!(change("proj/audit.json"), None);
        assert_eq!(change("proj/conf/policy.toml.bak"), None);
    }

    #[test]
    fn every_hop_of_a_symlink_chain_is_protected() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("src/dotfiles")).unwrap();
        std::fs::create_dir_all(base.join("cfg")).unwrap();
        std::fs::write(base.join("src/dotfiles/p.toml"), "").unwrap();
        std::os::unix::fs::symlink("src/dotfiles", base.join(".dotfiles")).unwrap();
        std::os::unix::fs::symlink("../.dotfiles/p.toml", base.join("cfg/p.toml")).unwrap();
        let got = spellings(&base.join("cfg/p.toml"));
        assert_eq!(
            got,
            vec![
                base.join("cfg/p.toml"),
                base.join(".dotfiles/p.toml"),
                base.join("src/dotfiles/p.toml"),
            ]
        );
        let p = Protected::new(&ProtectedSpec {
            files: vec![base.join("cfg/p.toml")],
            ..ProtectedSpec::default()
        });
        assert_eq!(
            p.change(&base.join(".dotfiles"), None),
            Some(Verdict::HoldsOwnFiles),
            "the middle link"
        );
        assert_eq!(
            p.change(&base.join("cfg/p.toml"), None),
            Some(Verdict::OwnFile)
        );
    }

    #[test]
    fn the_consent_commands_folder_is_sealed() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("tools/pkg")).unwrap();
        std::fs::write(base.join("tools/consent.py"), "").unwrap();
        let argv = resolve_command(&[
            "sh".into(),
            base.join("tools/consent.py").to_str().unwrap().into(),
        ]);
        assert!(
            argv[0].starts_with('/') && argv[0].ends_with("/sh"),
            "{argv:?}"
        );
        let command = command_files(&argv);
        let p = Protected::new(&ProtectedSpec {
            files: command.clone(),
            command,
            ..ProtectedSpec::default()
        });
        assert_eq!(
            p.change(&base.join("tools/json.py"), None),
            Some(Verdict::Sealed)
        );
        assert_eq!(
            p.change(&base.join("tools/pkg"), None),
            Some(Verdict::Sealed)
        );
        assert_eq!(
            p.change(&base.join("tools/pkg/__pycache__/x.pyc"), None),
            Some(Verdict::Sealed)
        );
        assert_eq!(
            p.change(&base.join("tools"), None),
            Some(Verdict::HoldsOwnFiles)
        );
        assert_eq!(p.change(&base.join("other.py"), None), None);
    }

    #[test]
    fn folders_holding_roots() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("outer/mid/inner")).unwrap();
        let p = Protected::new(&ProtectedSpec {
            roots: vec![base.join("outer"), base.join("outer/mid/inner")],
            ..ProtectedSpec::default()
        });
        let id = std::fs::metadata(base.join("outer/mid"))
            .ok()
            .map(|m| id_of(&m));
        assert_eq!(
            p.change(&base.join("outer/mid"), id),
            Some(Verdict::HoldsRoot)
        );
        assert_eq!(
            p.change(&base.join("outer/mid/inner"), None),
            Some(Verdict::Root)
        );
        assert_eq!(p.change(&base.join("outer/mid/x"), None), None);
    }
}

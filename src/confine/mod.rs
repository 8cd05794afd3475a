//! `fsbroker proxy --confine`: the kernel holds the server to its roots.
//!
//! A policy binds a server only while the server asks fsbroker for files. One that opens
//! files itself (the reference filesystem server does) is bound by nothing but its own
//! checks. `--confine` starts the server in a Landlock domain built from the policy
//! ([`plan`]): read-write roots readable and writable, read-only roots readable, `deny` roots
//! and unapproved `prompt` roots not at all; what the server needs to run, read-only
//! (`runtime.rs`); a private temporary directory; no network unless `[confine] net` allows it. The
//! kernel then refuses everything else, to the server and everything it starts, for good.
//!
//! What Landlock cannot express (deny globs, files of fsbroker's own inside a read-write
//! root, rights an older kernel lacks) is named by the plan ([`Plan::gaps`]): best effort
//! runs and says so on stderr, strict refuses to start. See docs/security.md, "Confinement".

// Ambient `std::fs` calls are allowed here (clippy.toml): the sandbox is built from the policy's own paths and the server's command line, before any request.
#![allow(clippy::disallowed_methods)]

pub mod kernel;
pub(crate) mod reap;
pub(crate) mod runtime;
pub(crate) mod seccomp;
pub(crate) mod tmp;
pub(crate) mod walk;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::policy::{ConfineMode, Policy};
use crate::sandbox::{ConsentMode, Mode};

/// Why a server cannot be confined.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The server's command line cannot be resolved.
    #[error("confine: {0}")]
    Command(String),
    /// A path of the plan cannot be opened for a rule.
    #[error("confine: {path}: {reason}")]
    Path {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The kernel refused the ruleset.
    #[error("confine: the kernel refused the ruleset: {0}")]
    Kernel(String),
    /// `--confine=strict` and something would not be enforced.
    #[error(
        "confine=strict: not every rule can be enforced here, so the server was not started:\n{}",
        .0.iter().map(|g| format!("  - {g}")).collect::<Vec<_>>().join("\n")
    )]
    Strict(Vec<String>),
    /// The private temporary directory cannot be made.
    #[error("confine: cannot make the server's temporary directory: {0}")]
    Temp(std::io::Error),
}

/// What a rule lets the server do beneath its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, and run programs.
    ReadExec,
    /// Read, write, create, remove and rename.
    ReadWrite,
    /// Open a device to read and write (`/dev/null`).
    Device,
}

/// One allowed path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rule {
    /// The path; everything beneath it too.
    pub path: PathBuf,
    /// What is allowed there.
    pub access: Access,
    /// Why it is allowed, for `confine check` and the audit log.
    pub why: String,
    /// The device and inode the plan resolved the path to (`walk::resolve`); the kernel
    /// step grants the path only if it still is that file. `None`: it did not exist.
    #[serde(skip)]
    pub id: Option<(u64, u64)>,
}

/// A root the server gets nothing of, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Withheld {
    /// The root's directory.
    pub path: PathBuf,
    /// Why.
    pub why: String,
}

/// Everything a confined server is allowed, and what cannot be enforced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    /// The allowed paths: roots, then what the server needs to run, then the policy's
    /// additions, then its temporary directory.
    pub rules: Vec<Rule>,
    /// Roots the server gets nothing of.
    pub withheld: Vec<Withheld>,
    /// Whether TCP is allowed.
    pub net: bool,
    /// Rules of the policy Landlock cannot express, whatever the kernel.
    pub inexpressible: Vec<String>,
    /// What the server's command line would have granted and was not, or was narrowed (too
    /// broad, or reached through a symlink the server could have planted).
    pub narrowed: Vec<String>,
    /// Whether a reload that takes access away ends the server (`[confine] on_revoke`):
    /// then the server must not be able to stop the proxy, which only the kernel's signal
    /// scoping (Landlock ABI 6) holds it to.
    pub ends_on_revoke: bool,
}

/// Directories of the home that hold language installations and the version manager that
/// runs them, nothing else: a program run through their shims needs the whole tree.
const VERSION_MANAGERS: [&str; 6] = [".pyenv", ".rbenv", ".nodenv", ".asdf", ".volta", ".nvm"];

/// Checks what a server's command line asks for ([`runtime::needs`]) against what must never
/// be granted that way. A grant is narrowed (to the program's own directory, or the script
/// alone) or dropped, and said so, when its path:
/// - is `/`, the user's home, or a directory holding the home or a withheld root;
/// - is, or holds, a directory every program shares: `/tmp`, `/var/tmp`, `/dev/shm`, `/run`,
///   the temporary directory and `$XDG_RUNTIME_DIR` (other servers' private directories, the
///   user's sockets): `python3 /tmp/server.py` gets the script, not `/tmp`;
/// - is a directory in a hidden directory of the home (`~/.cargo` for
///   `~/.cargo/bin/server`, `~/.config/app` for a configuration named like code: credentials
///   live there), other than a `bin`, `sbin` or `node_modules` directory or a version
///   manager's tree ([`VERSION_MANAGERS`]). The home is `$HOME` and the one in
///   `/etc/passwd`;
/// - was reached through a symlink inside a writable root or `[confine] write` path (the
///   server, or another, could have planted it there for its next run: `node_modules -> /`).
///
/// Every grant is made on the resolved path, which is what the kernel gets and what
/// `confine check` and the audit log show.
struct Guard {
    /// `$HOME` and the user's home in the password database (a host may start the proxy
    /// with `HOME` unset or elsewhere).
    homes: Vec<PathBuf>,
    withheld: Vec<PathBuf>,
    writable: Vec<PathBuf>,
    /// Directories every program shares.
    shared: Vec<PathBuf>,
}

impl Guard {
    fn new(policy: &Policy) -> Guard {
        let canonical = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        let writable = writable_paths(policy);
        Guard {
            homes: std::env::var_os("HOME")
                .map(PathBuf::from)
                .into_iter()
                .chain(passwd_home())
                .filter(|h| h.is_absolute() && h != Path::new("/"))
                .map(|h| canonical(&h))
                .collect(),
            withheld: policy
                .roots()
                .iter()
                .filter(|r| r.consent() != ConsentMode::Auto)
                .map(|r| r.path().to_path_buf())
                .collect(),
            writable,
            shared: ["/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run"]
                .into_iter()
                .map(PathBuf::from)
                .chain([std::env::temp_dir()])
                .chain(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
                .map(|p| canonical(&p))
                .collect(),
        }
    }

    /// Why `path` (resolved) may not be granted for the server to run, if it may not.
    fn too_broad(&self, path: &Path) -> Option<String> {
        if path == Path::new("/") {
            return Some("it is the whole file system".into());
        }
        // The shared directories, and what holds one (`/var`, `/dev`, `/run/user`).
        if self.shared.iter().any(|s| s.starts_with(path)) {
            return Some(
                "every program shares it (temporary files, other servers' private \
                 directories, sockets)"
                    .into(),
            );
        }
        for home in &self.homes {
            if home.starts_with(path) {
                return Some(format!("it holds the home directory {}", home.display()));
            }
            let Ok(inside) = path.strip_prefix(home) else {
                continue;
            };
            // A directory in a hidden directory of the home (`~/.config/app`, `~/.cargo`):
            // only programs' own directories (`~/.cargo/bin`) and installed packages
            // (`node_modules`) may be granted there.
            let hidden = inside
                .components()
                .next()
                .map(|c| c.as_os_str().to_string_lossy())
                .is_some_and(|n| n.starts_with('.') && !VERSION_MANAGERS.contains(&n.as_ref()));
            let code_dir = path
                .file_name()
                .is_some_and(|n| n == "bin" || n == "sbin" || n == "node_modules");
            if hidden && !code_dir && path.is_dir() {
                return Some(format!(
                    "it lies in a settings directory of the home ({}), where credentials live",
                    path.display()
                ));
            }
        }
        self.withheld
            .iter()
            .find(|r| r.starts_with(path))
            .map(|r| format!("it holds the withheld root {}", r.display()))
    }

    /// The rule to grant for `need`, if any; what was narrowed or dropped goes to `notes`.
    fn vet(&self, need: runtime::Need, notes: &mut Vec<String>) -> Option<Rule> {
        let runtime::Need { mut rule, narrower } = need;
        let asked = rule.path.clone();
        match walk::resolve(&asked, &self.writable) {
            // Absent: the kernel step leaves it out.
            walk::Walk::Absent => return Some(rule),
            walk::Walk::Planted { link, to } => {
                notes.push(planted_note(&asked, &rule.why, &link, &to));
                return None;
            }
            walk::Walk::Found { path, id, .. } => {
                rule.path = path;
                rule.id = Some(id);
            }
        }
        if let Some(why) = self.too_broad(&rule.path) {
            let narrower = narrower.and_then(|n| match walk::resolve(&n, &self.writable) {
                walk::Walk::Found { path, id, .. } => Some((path, id)),
                _ => None,
            });
            match narrower.filter(|(n, _)| self.too_broad(n).is_none()) {
                Some((n, id)) => {
                    notes.push(format!(
                        "narrowed: {} ({}) to {}: {why}",
                        rule.path.display(),
                        rule.why,
                        n.display()
                    ));
                    rule.path = n;
                    rule.id = Some(id);
                }
                None => {
                    notes.push(format!(
                        "not granted: {} ({}): {why}",
                        rule.path.display(),
                        rule.why
                    ));
                    return None;
                }
            }
        }
        Some(rule)
    }
}

/// Says that `path` (granted for `why`) is left out: it goes through the planted `link`.
fn planted_note(path: &Path, why: &str, link: &Path, to: &Path) -> String {
    format!(
        "not granted: {} ({why}): it is reached through the link {} -> {}, which lies in a \
         writable path",
        path.display(),
        link.display(),
        to.display()
    )
}

/// The home directory of this process's user in `/etc/passwd`.
fn passwd_home() -> Option<PathBuf> {
    let uid = rustix::process::getuid().as_raw().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.len() >= 7 && fields[2] == uid).then(|| PathBuf::from(fields[5]))
    })
}

/// The confinement of a server with `command` (run in `cwd` with `PATH` `path`) under
/// `policy`; `tmpdir` is its private temporary directory.
pub fn plan(
    policy: &Policy,
    command: &[OsString],
    cwd: &Path,
    path: Option<&std::ffi::OsStr>,
    tmpdir: Option<&Path>,
) -> Result<Plan, ConfineError> {
    let RootGrants {
        mut rules,
        withheld,
        mut inexpressible,
    } = root_grants(policy);
    let config = policy.confine();
    let mut narrowed = Vec::new();
    if !command.is_empty() {
        let guard = Guard::new(policy);
        for need in runtime::needs(command, cwd, path, &guard.writable, &mut narrowed)? {
            let Some(rule) = guard.vet(need, &mut narrowed) else {
                continue;
            };
            if !rules.iter().any(|r| r.path == rule.path) {
                rules.push(rule);
            }
        }
    }
    let writable = writable_paths(policy);
    // The policy's own additions are taken as written, but not through a link the server
    // could have put in their place: `models -> /home/user/.ssh`.
    // Resolved by descriptors, not through a link the server could have put in their place.
    let mut resolve = |p: &Path, why: &str| match walk::resolve(p, &writable) {
        walk::Walk::Found { path, id, .. } => Some((path, Some(id))),
        walk::Walk::Absent => Some((p.to_path_buf(), None)),
        walk::Walk::Planted { link, to } => {
            narrowed.push(planted_note(p, why, &link, &to));
            None
        }
    };
    for p in &config.read {
        let Some((path, id)) = resolve(p, "[confine] read") else {
            continue;
        };
        rules.push(Rule {
            path,
            access: Access::ReadExec,
            why: "[confine] read".into(),
            id,
        });
    }
    for p in &config.write {
        let Some((path, id)) = resolve(p, "[confine] write") else {
            continue;
        };
        let mine = own_files_at(policy, &path);
        let access = if mine.is_empty() {
            Access::ReadWrite
        } else {
            // As for a root: the kernel cannot keep fsbroker's own files read-only inside a
            // writable tree, so the tree is granted read-only.
            inexpressible.push(format!(
                "[confine] write {} holds fsbroker's own files ({}): granted read-only",
                path.display(),
                mine
            ));
            Access::ReadExec
        };
        rules.push(Rule {
            path,
            access,
            why: "[confine] write".into(),
            id,
        });
    }
    if let Some(tmp) = tmpdir {
        let (path, id) = match walk::resolve(tmp, &[]) {
            walk::Walk::Found { path, id, .. } => (path, Some(id)),
            _ => (tmp.to_path_buf(), None),
        };
        rules.push(Rule {
            path,
            access: Access::ReadWrite,
            why: "the server's private temporary directory (TMPDIR)".into(),
            id,
        });
    }
    // Landlock adds rules up: beneath a writable grant, a read-only root is writable too.
    for inner in rules.iter().filter(|r| r.access != Access::ReadWrite) {
        let Some(outer) = rules
            .iter()
            .find(|o| o.access == Access::ReadWrite && inner.path.starts_with(&o.path))
        else {
            continue;
        };
        if inner.path != outer.path && inner.why.starts_with("root ") {
            inexpressible.push(format!(
                "{} ({}) lies in {} ({}): the kernel grants the wider rights beneath it, so the \
                 server can write it, rename it or put a link in its place",
                inner.path.display(),
                inner.why,
                outer.path.display(),
                outer.why
            ));
        }
    }
    // A rule for anything that holds a withheld root, or lies in one, would hand it over.
    for w in &withheld {
        let touches = |r: &&Rule| w.path.starts_with(&r.path) || r.path.starts_with(&w.path);
        for r in rules.iter().filter(touches) {
            inexpressible.push(format!(
                "{} ({}) holds, or lies in, the withheld root {}: the server can {} it",
                r.path.display(),
                r.why,
                w.path.display(),
                if r.access == Access::ReadWrite {
                    "read and write"
                } else {
                    "read"
                }
            ));
        }
    }
    // fsbroker's own files are never readable through a root (docs/protocol.md, "Protected
    // paths"), but the kernel cannot take one file out of a granted tree: each grant holding
    // one is named, so strict refuses and best effort says so.
    for r in &rules {
        let own: Vec<String> = policy
            .protected()
            .files()
            .iter()
            .filter(|f| f.starts_with(&r.path))
            .map(|f| f.display().to_string())
            .collect();
        if !own.is_empty() {
            inexpressible.push(format!(
                "{} ({}) holds fsbroker's own files ({}): the server can read them; keep the \
                 policy and the audit log outside what a confined server is given",
                r.path.display(),
                r.why,
                own.join(", ")
            ));
        }
    }
    Ok(Plan {
        rules,
        withheld,
        net: config.net,
        inexpressible,
        narrowed,
        ends_on_revoke: config.on_revoke == crate::policy::OnRevoke::End,
    })
}

/// The part of a plan the roots make.
struct RootGrants {
    rules: Vec<Rule>,
    withheld: Vec<Withheld>,
    inexpressible: Vec<String>,
}

/// fsbroker's own files beneath `dir` (the policy, the audit log, the consent command's
/// files) and the folders the consent command runs from that `dir` holds or lies in, named
/// for a message; empty if none. A server that may write there could rewrite the rules it
/// runs under, or a program the user runs.
fn own_files_at(policy: &Policy, dir: &Path) -> String {
    let protected = policy.protected();
    let files = protected.files().iter().filter(|f| f.starts_with(dir));
    let sealed = protected
        .sealed()
        .iter()
        .filter(|s| s.starts_with(dir) || dir.starts_with(s));
    files
        .chain(sealed)
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The canonical paths a confined server under `policy` may write: its read-write roots and
/// `[confine] write` paths.
fn writable_paths(policy: &Policy) -> Vec<PathBuf> {
    let mut writable: Vec<PathBuf> = policy
        .roots()
        .iter()
        .filter(|r| r.mode() == Mode::ReadWrite && r.consent() == ConsentMode::Auto)
        .map(|r| r.path().to_path_buf())
        .collect();
    writable.extend(
        policy
            .confine()
            .write
            .iter()
            .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone())),
    );
    writable
}

/// What `policy`'s roots grant a confined server.
fn root_grants(policy: &Policy) -> RootGrants {
    let mut rules = Vec::new();
    let mut withheld = Vec::new();
    let mut inexpressible = Vec::new();
    let writable = writable_paths(policy);
    for root in policy.roots() {
        let dir = root.path().to_path_buf();
        // A root named through a link in a writable path leads where the server, on an
        // earlier run, may have pointed it (`rename(inner, x); symlink("/etc", inner)`); and
        // what the kernel is given must be the directory the broker opened for the root.
        let mut id = None;
        let changed = match walk::resolve(root.configured_path(), &writable) {
            walk::Walk::Planted { link, to } => Some(format!(
                "root {} is reached through the link {} -> {}, which lies in a writable path: \
                 the server could have made it",
                root.name(),
                link.display(),
                to.display()
            )),
            walk::Walk::Absent => Some(format!(
                "root {}: {} is no longer there",
                root.name(),
                root.configured_path().display()
            )),
            walk::Walk::Found { id: now, .. } => {
                let opened = rustix::fs::fstat(root.dir()).map(|st| (st.st_dev, st.st_ino));
                if opened.is_ok_and(|o| o == now) {
                    id = Some(now);
                    None
                } else {
                    Some(format!(
                        "root {}: {} is no longer the directory the policy opened (another \
                         was put in its place)",
                        root.name(),
                        root.configured_path().display()
                    ))
                }
            }
        };
        if let Some(why) = changed {
            withheld.push(Withheld { path: dir, why });
            continue;
        }
        match root.consent() {
            ConsentMode::Deny => {
                withheld.push(Withheld {
                    path: dir,
                    why: format!("root {}: consent is deny", root.name()),
                });
                continue;
            }
            ConsentMode::Prompt => {
                withheld.push(Withheld {
                    path: dir,
                    why: format!(
                        "root {}: consent is prompt, and a confined server is started with \
                         approved roots only (approvals later serve files/* requests)",
                        root.name()
                    ),
                });
                continue;
            }
            ConsentMode::Auto => {}
        }
        let mut access = match root.mode() {
            Mode::ReadWrite => Access::ReadWrite,
            Mode::ReadOnly => Access::Read,
        };
        let mine = own_files_at(policy, &dir);
        if access == Access::ReadWrite && !mine.is_empty() {
            // The kernel cannot keep one file of a writable tree read-only: the root is
            // granted read-only, and its writes go through files/*, which guards them.
            access = Access::Read;
            inexpressible.push(format!(
                "root {} holds fsbroker's own files ({}): granted read-only to the server, \
                 writes only through files/*",
                root.name(),
                mine
            ));
        }
        for glob in root.deny().patterns() {
            inexpressible.push(format!(
                "root {}: deny glob {glob:?} is not enforced by the kernel (the server can \
                 open such paths itself; through files/* they stay refused)",
                root.name()
            ));
        }
        rules.push(Rule {
            path: dir,
            access,
            why: format!(
                "root {} ({})",
                root.name(),
                match root.mode() {
                    Mode::ReadWrite => "read-write",
                    Mode::ReadOnly => "read-only",
                }
            ),
            id,
        });
    }
    RootGrants {
        rules,
        withheld,
        inexpressible,
    }
}

/// What a plan leaves unenforced on some kernel.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Gaps {
    /// Rules of the plan the kernel will not hold the server to: `--confine=strict` refuses
    /// to start when there is any.
    pub rules: Vec<String>,
    /// Hardening beyond the plan's rules that this kernel lacks (named, never refused for).
    pub hardening: Vec<String>,
}

impl Plan {
    /// What `policy` (a reload) takes away of what this plan granted, described: each root
    /// rule it no longer grants at the same access (a removed root, consent turned `deny` or
    /// `prompt`, read-write turned read-only), each `[confine]` path it no longer lists, the
    /// network if `net` was turned off, and a root now withheld inside one the server holds.
    pub fn lost(&self, policy: &Policy) -> Vec<String> {
        let now = root_grants(policy);
        let mut lost: Vec<String> = self
            .rules
            .iter()
            .filter(|r| r.why.starts_with("root "))
            .filter(|r| {
                !now.rules
                    .iter()
                    .any(|n| n.path == r.path && (n.access == r.access || r.access == Access::Read))
            })
            .map(|r| format!("{} ({})", r.path.display(), r.why))
            .collect();
        // The policy's own additions and the network, which the server also started with.
        let config = policy.confine();
        let canonical = |p: &PathBuf| p.canonicalize().unwrap_or_else(|_| p.clone());
        for r in &self.rules {
            let listed = |paths: &[PathBuf]| paths.iter().any(|p| canonical(p) == r.path);
            let kept = match r.why.as_str() {
                "[confine] write" => listed(&config.write),
                "[confine] read" => listed(&config.read) || listed(&config.write),
                _ => true,
            };
            if !kept {
                lost.push(format!("{} ({})", r.path.display(), r.why));
            }
        }
        if self.net && !config.net {
            lost.push("the network ([confine] net)".into());
        }
        // A root now withheld inside one the server holds (a `deny` root added within it).
        for w in &now.withheld {
            if let Some(r) = self.rules.iter().find(|r| w.path.starts_with(&r.path)) {
                lost.push(format!(
                    "{} ({}), inside {} the server holds",
                    w.path.display(),
                    w.why,
                    r.path.display()
                ));
            }
        }
        lost
    }

    /// What a reload `policy` asks of the roots that the kernel cannot hold the server to and
    /// that this plan did not already say (a deny glob added to a root the server holds): the
    /// server runs on under rules it was not started with, which `--confine=strict` treats
    /// as a revocation.
    pub fn newly_unenforced(&self, policy: &Policy) -> Vec<String> {
        root_grants(policy)
            .inexpressible
            .into_iter()
            .filter(|item| !self.inexpressible.contains(item))
            .collect()
    }

    /// What will not be enforced on a kernel with Landlock ABI `abi`: the plan's
    /// inexpressible rules and the file and network rules the ABI cannot hold (ABI 1 files,
    /// 2 renames across directories, 3 truncation, 4 TCP), then the hardening it lacks.
    pub fn gaps(&self, abi: i32) -> Gaps {
        let mut gaps = Gaps {
            rules: self.inexpressible.clone(),
            hardening: Vec::new(),
        };
        if abi < 1 {
            gaps.rules.insert(
                0,
                "the kernel has no Landlock (it needs Linux 5.13 or later, with landlock in \
                 the lsm= boot list): nothing is enforced"
                    .into(),
            );
            return gaps;
        }
        for feature in kernel::Feature::ALL {
            use kernel::Feature::*;
            let (needed, rule) = match feature {
                Files | Refer | Truncate => (true, true),
                Tcp => (!self.net, true),
                IoctlDev => (true, false),
                // Without signal scoping the server can stop the proxy (`SIGSTOP`) and so
                // outlive a revocation that should end it.
                Scopes => (true, self.ends_on_revoke),
                // With `net` off, the seccomp filter refuses Unix sockets where the kernel
                // cannot hold them to the allowed paths (see seccomp.rs).
                UnixPaths => (self.net, false),
            };
            if needed && abi < feature.abi() {
                let gap = format!(
                    "not enforced (needs Landlock ABI {}, the kernel has {abi}): {}",
                    feature.abi(),
                    feature.describe()
                );
                if rule {
                    gaps.rules.push(gap);
                } else {
                    gaps.hardening.push(gap);
                }
            }
        }
        gaps
    }
}

/// How `--confine` was asked for: the command line's choice over the policy's.
pub fn mode(flag: Option<ConfineMode>, policy: &Policy) -> ConfineMode {
    flag.unwrap_or(policy.confine().mode)
}

/// A confinement ready for the server's process: the plan, what the kernel will enforce of
/// it, the ruleset, and the server's temporary directory (removed when this is dropped).
#[derive(Debug)]
pub struct Confinement {
    /// What the server is allowed.
    pub plan: Plan,
    /// Best effort or strict.
    pub mode: ConfineMode,
    /// The Landlock ABI in use (0: none).
    pub abi: i32,
    /// What will not be enforced.
    pub gaps: Gaps,
    /// What a reload that takes access away does.
    pub on_revoke: crate::policy::OnRevoke,
    prepared: kernel::Prepared,
    filter: std::sync::Arc<seccomp::Filter>,
    tmp: tmp::PrivateTmp,
}

impl Confinement {
    /// Plans and builds the confinement of `command` (run in this process's working
    /// directory, with its `PATH`) under `policy`. Strict mode refuses here when anything
    /// would not be enforced.
    pub fn prepare(
        policy: &Policy,
        mode: ConfineMode,
        command: &[OsString],
    ) -> Result<Confinement, ConfineError> {
        let tmp = tmp::PrivateTmp::new()?;
        let cwd = std::env::current_dir().map_err(|e| ConfineError::Command(e.to_string()))?;
        let path = std::env::var_os("PATH");
        let plan = plan(policy, command, &cwd, path.as_deref(), Some(tmp.path()))?;
        let abi = kernel::abi();
        let gaps = plan.gaps(abi);
        if mode == ConfineMode::Strict && !gaps.rules.is_empty() {
            return Err(ConfineError::Strict(gaps.rules));
        }
        let prepared = kernel::prepare(&plan, abi)?;
        if !prepared.absent.is_empty() {
            // A grant of a path that is not there is harmless (nothing to reach), but a
            // runtime that then fails to start is easier to understand with it named.
            tracing::debug!(absent = ?prepared.absent, "paths of the confinement that do not exist here; left out");
        }
        Ok(Confinement {
            plan,
            mode,
            abi,
            gaps,
            on_revoke: policy.confine().on_revoke,
            prepared,
            filter: std::sync::Arc::new(seccomp::Filter::new(
                policy.confine().net,
                abi >= kernel::Feature::UnixPaths.abi(),
                rustix::process::geteuid().is_root(),
            )),
            tmp,
        })
    }

    /// Sets up `cmd` to run confined: the sandbox entered between `fork` and `exec`, and the
    /// environment pointing temporary files and caches into the private directory.
    pub fn apply(&self, cmd: &mut tokio::process::Command) {
        let tmp = self.tmp.path();
        for var in ["TMPDIR", "TMP", "TEMP"] {
            cmd.env(var, tmp);
        }
        // npm (npx) writes its cache and logs under $HOME, which a confined server cannot.
        if std::env::var_os("npm_config_cache").is_none() {
            cmd.env("npm_config_cache", tmp.join("npm-cache"));
        }
        cmd.env("npm_config_update_notifier", "false");
        if std::env::var_os("XDG_CACHE_HOME").is_none() {
            cmd.env("XDG_CACHE_HOME", tmp.join("cache"));
        }
        // Its own process group, which nothing it starts can leave (the seccomp filter):
        // `reap` ends the whole group with one signal, which no fork outruns.
        cmd.process_group(0);
        let fd = self.prepared.raw_fd();
        let filter = std::sync::Arc::clone(&self.filter);
        let proxy = rustix::process::getpid();
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe work is sound. `die_with_parent` makes two system calls (prctl,
        // getppid) on integers; `close_inherited` and `drop_capabilities` make system calls
        // on integers and on locals of their own; `restrict_self` makes three more (prctl
        // twice, landlock_restrict_self) on memory built before the fork (the filter, kept
        // alive by the Arc the closure owns) and on `fd`. Neither allocates (the error, if any, is a
        // raw OS error) or takes a lock. `fd` stays open in the parent while `self` lives,
        // which is past the spawn; it is close-on-exec, so the server does not inherit it.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                kernel::die_with_parent(proxy)?;
                kernel::close_inherited()?;
                kernel::drop_capabilities()?;
                kernel::restrict_self(fd, &filter)
            });
        }
    }

    /// Whether the kernel enforces anything at all.
    pub fn enforced(&self) -> bool {
        self.prepared.raw_fd().is_some()
    }

    /// The audit log's record of it.
    pub fn audit_record(&self) -> serde_json::Value {
        serde_json::json!({
            "mode": match self.mode {
                ConfineMode::Strict => "strict",
                ConfineMode::BestEffort => "best-effort",
                ConfineMode::Off => "off",
            },
            "abi": self.abi,
            "enforced": self.enforced(),
            "rules": self.plan.rules.iter().map(|r| serde_json::json!({
                "path": r.path, "access": r.access,
            })).collect::<Vec<_>>(),
            "withheld": self.plan.withheld.iter().map(|w| &w.path).collect::<Vec<_>>(),
            "net": self.plan.net,
            "notEnforced": self.gaps.rules,
        })
    }

    /// A report of the confinement for stderr, one line per item.
    pub fn summary(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "confining the server (Landlock ABI {}): {} paths allowed, {} roots withheld, TCP {}",
            self.abi,
            self.plan.rules.len(),
            self.plan.withheld.len(),
            if self.plan.net { "allowed" } else { "refused" }
        )];
        lines.extend(self.plan.narrowed.iter().cloned());
        lines.extend(self.gaps.rules.iter().map(|g| format!("NOT ENFORCED: {g}")));
        lines.extend(
            self.gaps
                .hardening
                .iter()
                .map(|g| format!("not available: {g}")),
        );
        lines
    }
}

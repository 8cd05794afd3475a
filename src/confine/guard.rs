//! What a server's command line may be granted: the runtime it needs (`runtime.rs`),
//! vetted against what must never be handed over that way.
//!
//! A grant is made on the path it resolves to, and refused or narrowed when it is too broad
//! (the whole file system, the home, what every program shares, a settings directory where
//! credentials live, a directory holding a withheld root) or was reached through a link the
//! server could have planted.

use std::path::{Path, PathBuf};

use super::roots::writable_paths;
use super::{Rule, runtime, walk};
use crate::policy::Policy;
use crate::sandbox::ConsentMode;

/// Directories of the home that hold language installations and the version manager that
/// runs them, nothing else: a program run through their shims needs the whole tree.
pub(super) const VERSION_MANAGERS: [&str; 6] =
    [".pyenv", ".rbenv", ".nodenv", ".asdf", ".volta", ".nvm"];

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
pub(super) struct Guard {
    /// `$HOME` and the user's home in the password database (a host may start the proxy
    /// with `HOME` unset or elsewhere).
    homes: Vec<PathBuf>,
    withheld: Vec<PathBuf>,
    pub(super) writable: Vec<PathBuf>,
    /// Directories every program shares.
    shared: Vec<PathBuf>,
}

impl Guard {
    pub(super) fn new(policy: &Policy) -> Guard {
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
            // Installed code: a package in `node_modules` (`~/.npm-global/lib/node_modules/
            // pkg`, npx's `~/.npm/_npx/HASH/node_modules/pkg`), a Python environment or
            // installation (`~/.local/share/uv/tools/pkg`), never the settings directory
            // around it.
            let code_dir = path.file_name().is_some_and(|n| n == "bin" || n == "sbin")
                || super::launch::holds_code_only(path, home);
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
    pub(super) fn vet(&self, need: runtime::Need, notes: &mut Vec<String>) -> Option<Rule> {
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
pub(super) fn planted_note(path: &Path, why: &str, link: &Path, to: &Path) -> String {
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

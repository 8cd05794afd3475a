//! What the policy's roots grant a confined server, and what they withhold.
//!
//! A root is granted at its mode when its consent is `auto` and it is still the directory the
//! policy opened; a `deny` or `prompt` root, or one reached through a link a server could have
//! made, is withheld. What the kernel cannot hold the server to (a deny glob, fsbroker's own
//! files inside a writable root) is named, for `--confine=strict` to refuse. A reload is
//! judged against the same grants ([`Plan::lost`](super::Plan::lost)).

use std::path::{Path, PathBuf};

use super::{Access, Rule, Withheld, walk};
use crate::policy::Policy;
use crate::sandbox::{ConsentMode, Mode};

/// The part of a plan the roots make.
pub(super) struct RootGrants {
    pub(super) rules: Vec<Rule>,
    pub(super) withheld: Vec<Withheld>,
    pub(super) inexpressible: Vec<String>,
}

/// fsbroker's own files beneath `dir` (the policy, the audit log, the consent command's
/// files) and the folders the consent command runs from that `dir` holds or lies in, named
/// for a message; empty if none. A server that may write there could rewrite the rules it
/// runs under, or a program the user runs.
pub(super) fn own_files_at(policy: &Policy, dir: &Path) -> String {
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
pub(super) fn writable_paths(policy: &Policy) -> Vec<PathBuf> {
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
pub(super) fn root_grants(policy: &Policy) -> RootGrants {
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
        let parts = root.managed_parts();
        if access == Access::ReadWrite && parts.iter().any(|(_, mode, _)| *mode == Mode::ReadOnly) {
            // As with fsbroker's own files: the kernel cannot keep part of a writable tree
            // read-only, so the whole root is granted read-only.
            access = Access::Read;
            inexpressible.push(format!(
                "root {} holds paths your organisation made read-only ([roots] read_only): \
                 granted read-only to the server, writes only through files/*",
                root.name()
            ));
        }
        for (at, _, consent) in &parts {
            if *consent == ConsentMode::Prompt {
                inexpressible.push(format!(
                    "root {}: {} needs the person's consent ([roots] consent of the managed \
                     policy), which the kernel cannot ask for (the server can open it itself; \
                     through files/* it is asked)",
                    root.name(),
                    if at.is_empty() {
                        "all of it".to_owned()
                    } else {
                        format!("{at:?}")
                    }
                ));
            }
        }
        for glob in root.managed_deny().patterns() {
            inexpressible.push(format!(
                "root {}: the managed deny glob {glob:?} is not enforced by the kernel (the \
                 server can open such paths itself; through files/* they stay refused)",
                root.name()
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

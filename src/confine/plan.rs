//! The plan: everything a confined server is allowed, and what cannot be enforced.
//!
//! Made from the policy's roots (`roots.rs`), what the server's command line needs to run
//! (`guard.rs`), the policy's `[confine]` additions and the private temporary directory; then
//! checked for what Landlock cannot express. A reload is compared with it ([`Plan::lost`]),
//! and so is a kernel's ABI ([`Plan::gaps`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::guard::{Guard, planted_note};
use super::roots::{RootGrants, own_files_at, root_grants, writable_paths};
use super::{Access, ConfineError, Gaps, Plan, Rule, kernel, launch, runtime, walk};
use crate::policy::Policy;

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
    let launch = (!command.is_empty())
        .then(|| launch::recognise(command, cwd, path, &writable_paths(policy)))
        .flatten();
    let run = launch
        .as_ref()
        .and_then(|l| l.command.clone())
        .unwrap_or_else(|| command.to_vec());
    if !command.is_empty() {
        let guard = Guard::new(policy);
        let launched = launch.iter().flat_map(|l| l.needs.iter().cloned());
        let needs = runtime::needs(&run, cwd, path, &guard.writable, &mut narrowed)?;
        for need in needs.into_iter().chain(launched) {
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
        launch,
        command: run,
        ends_on_revoke: config.on_revoke == crate::policy::OnRevoke::End,
    })
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

//! `fsbroker proxy --confine`: the kernel holds the server to its roots.
//!
//! A policy binds a server only while the server asks fsbroker for files. One that opens
//! files itself (the reference filesystem server does) is bound by nothing but its own
//! checks. `--confine` starts the server in a Landlock domain built from the policy
//! ([`plan`]): read-write roots readable and writable, read-only roots readable, `deny` roots
//! and unapproved `prompt` roots not at all; what the server needs to run, read-only
//! ([`runtime`]); a private temporary directory; no TCP unless `[confine] net` allows it. The
//! kernel then refuses everything else, to the server and everything it starts, for good.
//!
//! What Landlock cannot express (deny globs, files of fsbroker's own inside a read-write
//! root, rights an older kernel lacks) is named by the plan ([`Plan::gaps`]): best effort
//! runs and says so on stderr, strict refuses to start. See docs/security.md, "Confinement".

pub mod kernel;
pub mod reap;
pub mod runtime;

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
    if !command.is_empty() {
        for need in runtime::needs(command, cwd, path)? {
            if !rules.iter().any(|r| r.path == need.path) {
                rules.push(need);
            }
        }
    }
    let config = policy.confine();
    for p in &config.read {
        rules.push(Rule {
            path: p.clone(),
            access: Access::ReadExec,
            why: "[confine] read".into(),
        });
    }
    for p in &config.write {
        rules.push(Rule {
            path: p.clone(),
            access: Access::ReadWrite,
            why: "[confine] write".into(),
        });
    }
    if let Some(tmp) = tmpdir {
        rules.push(Rule {
            path: tmp.to_path_buf(),
            access: Access::ReadWrite,
            why: "the server's private temporary directory (TMPDIR)".into(),
        });
    }
    // A rule for anything that holds a withheld root would hand it over.
    for w in &withheld {
        for r in rules.iter().filter(|r| w.path.starts_with(&r.path)) {
            inexpressible.push(format!(
                "{} ({}) holds the withheld root {}: the server can {} it",
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
    Ok(Plan {
        rules,
        withheld,
        net: config.net,
        inexpressible,
    })
}

/// The part of a plan the roots make.
struct RootGrants {
    rules: Vec<Rule>,
    withheld: Vec<Withheld>,
    inexpressible: Vec<String>,
}

/// What `policy`'s roots grant a confined server.
fn root_grants(policy: &Policy) -> RootGrants {
    let mut rules = Vec::new();
    let mut withheld = Vec::new();
    let mut inexpressible = Vec::new();
    let own = policy.protected().files();
    for root in policy.roots() {
        let dir = root.path().to_path_buf();
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
        let mine: Vec<&PathBuf> = own.iter().filter(|f| f.starts_with(&dir)).collect();
        if access == Access::ReadWrite && !mine.is_empty() {
            // The kernel cannot keep one file of a writable tree read-only: the root is
            // granted read-only, and its writes go through files/*, which guards them.
            access = Access::Read;
            inexpressible.push(format!(
                "root {} holds fsbroker's own files ({}): granted read-only to the server, \
                 writes only through files/*",
                root.name(),
                mine.iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
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
    /// What `policy` (a reload) takes away of the roots this plan granted: each root rule it
    /// no longer grants at the same access (a removed root, consent turned `deny` or
    /// `prompt`, read-write turned read-only), described.
    pub fn lost(&self, policy: &Policy) -> Vec<String> {
        let now = root_grants(policy).rules;
        self.rules
            .iter()
            .filter(|r| r.why.starts_with("root "))
            .filter(|r| {
                !now.iter()
                    .any(|n| n.path == r.path && (n.access == r.access || r.access == Access::Read))
            })
            .map(|r| format!("{} ({})", r.path.display(), r.why))
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
                IoctlDev | Scopes | UnixPaths => (true, false),
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

/// A private temporary directory for a confined server (owner-only, removed when dropped).
pub fn temp_dir() -> Result<tempfile::TempDir, ConfineError> {
    tempfile::Builder::new()
        .prefix("fsbroker-server-")
        .tempdir()
        .map_err(ConfineError::Temp)
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
    tmp: tempfile::TempDir,
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
        let tmp = temp_dir()?;
        let cwd = std::env::current_dir().map_err(|e| ConfineError::Command(e.to_string()))?;
        let path = std::env::var_os("PATH");
        let plan = plan(policy, command, &cwd, path.as_deref(), Some(tmp.path()))?;
        let abi = kernel::abi();
        let gaps = plan.gaps(abi);
        if mode == ConfineMode::Strict && !gaps.rules.is_empty() {
            return Err(ConfineError::Strict(gaps.rules));
        }
        let prepared = kernel::prepare(&plan, abi)?;
        Ok(Confinement {
            plan,
            mode,
            abi,
            gaps,
            on_revoke: policy.confine().on_revoke,
            prepared,
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
        if let Some(fd) = self.prepared.raw_fd() {
            // SAFETY: the closure runs in the child between fork and exec, where only
            // async-signal-safe work is sound. `restrict_self` makes two system calls
            // (prctl, landlock_restrict_self) on `fd`, allocates nothing and takes no lock.
            // `fd` stays open in the parent while `self` lives, which is past the spawn; it
            // is close-on-exec, so the server does not inherit it.
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || kernel::restrict_self(fd));
            }
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

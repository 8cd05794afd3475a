//! The confinement of one server's process: planned and built in the proxy, before the
//! fork, then entered by the child between `fork` and `exec`.
//!
//! Everything that allocates or opens (the plan, the Landlock ruleset, the seccomp filter,
//! the private temporary directory) is done in [`Confinement::prepare`]; the child only makes
//! system calls on what was built ([`Confinement::apply`]), as a child forked from a
//! many-threaded process must.

use std::ffi::OsString;

use super::launch::{Missing, make_private};
use super::{ConfineError, Gaps, Plan, kernel, plan, seccomp, tmp};
use crate::limits::INSTALL_TIMEOUT;
use crate::policy::{ConfineMode, Policy, Registry};

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
    /// The command line as given (`npx -y PKG`), which the plan's may replace.
    given: Vec<OsString>,
    prepared: kernel::Prepared,
    filter: std::sync::Arc<seccomp::Filter>,
    tmp: tmp::PrivateTmp,
}

impl Confinement {
    /// Plans and builds the confinement of `command` (run in this process's working
    /// directory, with its `PATH`) under `policy`. Strict mode refuses here when anything
    /// would not be enforced.
    ///
    /// A launcher whose package is not installed (`npx -y PKG` the first time) gets it
    /// installed here, before the server starts, when `fetch` (the command line's, besides
    /// the policy's `[confine] fetch`) names its registry; otherwise the start is refused
    /// with what to do.
    pub fn prepare(
        policy: &Policy,
        mode: ConfineMode,
        command: &[OsString],
        fetch: &[Registry],
    ) -> Result<Confinement, ConfineError> {
        Confinement::prepare_with(policy, mode, command, fetch, &|_| {})
    }

    /// [`Confinement::prepare`], telling `progress` what it is doing when that may take long
    /// (`installing PKG from REGISTRY`), for a caller that answers the host meanwhile.
    pub fn prepare_with(
        policy: &Policy,
        mode: ConfineMode,
        command: &[OsString],
        fetch: &[Registry],
        progress: &dyn Fn(&str),
    ) -> Result<Confinement, ConfineError> {
        let tmp = tmp::PrivateTmp::new()?;
        let cwd = std::env::current_dir().map_err(|e| ConfineError::Command(e.to_string()))?;
        let path = std::env::var_os("PATH");
        let mut plan = plan(policy, command, &cwd, path.as_deref(), Some(tmp.path()))?;
        if let Some(missing) = plan.launch.as_ref().and_then(|l| l.missing.clone()) {
            let launcher = plan.launch.as_ref().map(|l| l.launcher.clone());
            let allowed = fetch
                .iter()
                .chain(&policy.confine().fetch)
                .any(|r| *r == missing.registry);
            if !allowed {
                return Err(ConfineError::NotInstalled {
                    launcher: launcher.unwrap_or_default(),
                    package: missing.package,
                    instead: missing.instead,
                });
            }
            progress(&format!(
                "installing {} from {}",
                missing.package,
                missing.registry.name()
            ));
            install(&missing, &super::roots::writable_paths(policy))?;
            plan = super::plan(policy, command, &cwd, path.as_deref(), Some(tmp.path()))?;
            if plan.launch.as_ref().is_some_and(|l| l.missing.is_some()) {
                return Err(ConfineError::Install {
                    package: missing.package,
                    reason: format!(
                        "the installer succeeded, but the package is not in {}",
                        missing.cache.display()
                    ),
                });
            }
        }
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
            given: command.to_vec(),
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
        // on integers and on locals of their own (rustix's wrappers among them are one system
        // call each, on the stack); `restrict_self` makes three more (prctl
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

    /// What the launcher of the server's command line was recognised as and what it was
    /// granted for it, one line each, for the diagnosis of a server that failed to start.
    pub fn launch_summary(&self) -> Vec<String> {
        let Some(launch) = &self.plan.launch else {
            return vec![
                "launcher: none recognised (the program, its interpreter and its script are \
                 granted as found)"
                    .into(),
            ];
        };
        std::iter::once(format!("launcher: {}", launch.launcher))
            .chain(launch.resolved.iter().cloned())
            .collect()
    }

    /// The server's command line as given, before its launcher was resolved: what the person
    /// wrote, and what `fsbroker confine check -- …` takes.
    pub fn given_command(&self) -> &[OsString] {
        &self.given
    }

    /// The command to start the server with: the one given, or the program its launcher
    /// would have run (`npx -y PKG` runs PKG's program).
    pub fn command(&self) -> &[OsString] {
        &self.plan.command
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
            "launcher": self.plan.launch.as_ref().map(|l| &l.launcher),
            "command": self.plan.command.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
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
        if self.plan.launch.is_some() {
            lines.extend(self.launch_summary());
        }
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

/// Whether `p` is relative (found from a working directory the server may write) or lies in
/// one of the server's `writable` paths.
fn server_may_write(p: &std::path::Path, writable: &[std::path::PathBuf]) -> bool {
    p.is_relative()
        || super::launch::in_writable(&p.canonicalize().unwrap_or_else(|_| p.into()), writable)
}

/// The programs an installer finds in `PATH` (npm's `#!/usr/bin/env node`, the `git` of a
/// git dependency, the `python3` uv may start, the shell of a script).
const INSTALLER_FINDS: [&str; 6] = ["node", "python3", "python", "git", "sh", "bash"];

/// The installer's `PATH`: `path` without a directory the server may write, or one where a
/// program the installer finds ([`INSTALLER_FINDS`]) leads to where the server may write
/// (`/usr/local/bin/node -> ~/project/node-v20/bin/node`).
fn installer_path(path: &std::ffi::OsStr, writable: &[std::path::PathBuf]) -> OsString {
    let trusted = |dir: &std::path::PathBuf| {
        !server_may_write(dir, writable)
            && INSTALLER_FINDS.iter().all(|name| {
                let found = dir.join(name);
                !found.exists() || !server_may_write(&found, writable)
            })
    };
    std::env::join_paths(std::env::split_paths(path).filter(trusted)).unwrap_or_default()
}

/// Installs a launcher's missing package into fsbroker's cache, before the server starts:
/// the installer (npm, uv, Python's venv and pip) runs with the person's rights and the
/// network, in the cache directory, with its output on stderr (stdout carries protocol messages only), and none of
/// the package's code runs (`--ignore-scripts`). Bounded by [`INSTALL_TIMEOUT`].
///
/// The installer, and what it finds in `PATH` (`npm` is `#!/usr/bin/env node`), is never a
/// program the server may have written: a relative `PATH` entry, or one in `writable` (the
/// server's writable paths), is left out of its `PATH`, and an installer lying there is
/// refused.
fn install(missing: &Missing, writable: &[std::path::PathBuf]) -> Result<(), ConfineError> {
    use std::os::fd::AsFd;
    let fail = |reason: String| ConfineError::Install {
        package: missing.package.clone(),
        reason,
    };
    make_private(&missing.cache).map_err(|e| fail(format!("{}: {e}", missing.cache.display())))?;
    let (program, args) = missing
        .install
        .split_first()
        .ok_or_else(|| fail("no installer".into()))?;
    // Not in a cache the server may write (`XDG_CACHE_HOME` in a project, a root holding the
    // home): an `.npmrc` or a half install it left there would steer the installer.
    if server_may_write(&missing.cache, writable) {
        return Err(fail(format!(
            "fsbroker's cache {} lies where the server may write; set XDG_CACHE_HOME to a \
             directory outside the server's read-write roots",
            missing.cache.display()
        )));
    }
    if server_may_write(std::path::Path::new(program), writable) {
        return Err(fail(format!(
            "the installer {} lies where the server may write (or is not an absolute path)",
            std::path::Path::new(program).display()
        )));
    }
    let path = std::env::var_os("PATH").map(|path| installer_path(&path, writable));
    tracing::warn!(
        package = %missing.package,
        registry = missing.registry.name(),
        cache = %missing.cache.display(),
        "installing the server's package before it starts (the network is the installer's, never the server's; none of the package's code runs)"
    );
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| fail(e.to_string()))?;
    let mut child = std::process::Command::new(program)
        .args(args)
        .envs(path.map(|p| (OsString::from("PATH"), p)))
        .envs(missing.env.iter().map(|(k, v)| (k, v)))
        // In fsbroker's own directory: no project configuration (`.npmrc`, `uv.toml`) or
        // program (`node_modules/.bin`) of the working directory, which a server may write,
        // steers the installer.
        .current_dir(&missing.cache)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(stderr))
        .spawn()
        .map_err(|e| {
            fail(format!(
                "cannot run {}: {e}",
                std::path::Path::new(program).display()
            ))
        })?;
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => {
                // Only a finished install is taken for one (a proxy killed mid-way leaves a
                // tree without this mark, which the next start installs again).
                std::fs::write(missing.cache.join(super::launch::INSTALLED), b"")
                    .map_err(|e| fail(format!("{}: {e}", missing.cache.display())))?;
                tracing::info!(
                    package = %missing.package,
                    seconds = started.elapsed().as_secs_f64(),
                    "installed"
                );
                return Ok(());
            }
            Ok(Some(status)) => {
                return Err(fail(format!(
                    "{} exited with {status} (its messages are above)",
                    std::path::Path::new(program).display()
                )));
            }
            Ok(None) if started.elapsed() > INSTALL_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "it took longer than {} s; is the registry reachable?",
                    INSTALL_TIMEOUT.as_secs()
                )));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Attack (a server plants `npm`, or the `node` that `npm`'s `#!/usr/bin/env node` finds,
    /// where it may write, for the unconfined install of its next start to run): a relative
    /// `PATH` entry and one in a writable path are left out of the installer's `PATH`, and an
    /// installer lying there is refused before it runs.
    #[test]
    fn the_installer_runs_nothing_the_server_may_write() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap().join("root");
        let bin = root.join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        let writable = std::slice::from_ref(&root);
        let path = std::env::join_paths([
            PathBuf::from("node_modules/.bin"),
            bin.clone(),
            PathBuf::from("/usr/bin"),
            PathBuf::from("/bin"),
        ])
        .unwrap();
        assert_eq!(
            installer_path(&path, writable),
            OsString::from("/usr/bin:/bin")
        );
        // A directory out of reach whose `node` leads into the root.
        let local = t.path().join("local-bin");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::write(bin.join("node"), "#!/bin/sh\n").unwrap();
        std::os::unix::fs::symlink(bin.join("node"), local.join("node")).unwrap();
        let path = std::env::join_paths([local.clone(), PathBuf::from("/usr/bin")]).unwrap();
        assert_eq!(installer_path(&path, writable), OsString::from("/usr/bin"));

        let planted = bin.join("npm");
        std::fs::write(&planted, "#!/bin/sh\ntouch pwned\n").unwrap();
        let missing = Missing {
            registry: Registry::Npm,
            package: "srv".into(),
            install: vec![planted.into_os_string()],
            env: Vec::new(),
            cache: t.path().join("cache"),
            instead: String::new(),
        };
        let err = install(&missing, writable).unwrap_err().to_string();
        assert!(err.contains("the installer"), "{err}");
        assert!(!t.path().join("cache/pwned").exists());
        // fsbroker's cache in the root: refused before anything runs.
        let in_root = Missing {
            install: vec!["/bin/sh".into(), "-c".into(), "touch pwned".into()],
            cache: root.join("cache"),
            ..missing
        };
        let err = install(&in_root, writable).unwrap_err().to_string();
        assert!(err.contains("XDG_CACHE_HOME"), "{err}");
        assert!(!root.join("cache/pwned").exists());
    }
}

//! Launchers: the programs people start MCP servers with (`npx -y PKG`, a package's program
//! in `node_modules`, `uvx PKG`, ...), recognised from the command line and resolved to the
//! installation they would run, so that the confinement grants that installation (the
//! package, its whole dependency tree, its interpreter), read and exec only, and nothing of
//! the settings directories of the home they live in.
//!
//! A launcher that would fetch at start (npx with a package it has not installed) cannot, as
//! a confined server gets no network. Here it either finds the package installed (the
//! person's project, the global prefix, the person's own npx cache, fsbroker's cache), or
//! names what is missing ([`Missing`]); the proxy then installs it before the server starts,
//! with the network, into fsbroker's own cache, running none of the package's code, when the
//! person or the policy allows that registry (`[confine] fetch`, `--confine-fetch`), and
//! refuses to start with what to do otherwise. The server itself then runs what was
//! resolved, read-only, with no network: it cannot reach a registry, and cannot change what
//! its next start runs.

pub(crate) mod npm;
pub(crate) mod python;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::Access;
use super::runtime::Need;
use crate::policy::Registry;

/// What a recognised launcher resolved to.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Launch {
    /// The launcher, in words (`npx`, `a package's program in node_modules`).
    pub launcher: String,
    /// What it runs and from where, in words, for `confine check` and the start's report.
    pub resolved: Vec<String>,
    /// The command the proxy runs instead of the one given: what the launcher would have run
    /// (the package's program), so that the launcher itself (npm, with its registry lookups
    /// and cache writes) does not run confined. `None`: the command as given.
    #[serde(skip)]
    pub command: Option<Vec<OsString>>,
    /// What it needs beyond the program's own installation, read and exec only.
    #[serde(skip)]
    pub(crate) needs: Vec<Need>,
    /// Not installed anywhere it looks: what would install it.
    pub missing: Option<Missing>,
}

/// A package a launcher would fetch at start, and how fsbroker would install it instead.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Missing {
    /// The registry it comes from.
    pub registry: Registry,
    /// The package, as the command line names it.
    pub package: String,
    /// The install: run before the server, with the network, never confined to the server's
    /// rules, but running none of the package's code (npm's `--ignore-scripts`).
    #[serde(skip)]
    pub install: Vec<OsString>,
    /// The installer's environment beyond the proxy's (where a tool installer puts what it
    /// installs).
    #[serde(skip)]
    pub env: Vec<(OsString, OsString)>,
    /// Where it installs: fsbroker's own cache for this package, never the person's.
    pub cache: PathBuf,
    /// What the person can do instead of letting fsbroker fetch.
    pub instead: String,
}

/// Recognises the launcher of `command` (run in `cwd`, `PATH` `path`); `None` when it is
/// none this module knows (the program's installation and script are then granted as
/// `runtime.rs` finds them).
pub(crate) fn recognise(
    command: &[OsString],
    cwd: &Path,
    path: Option<&std::ffi::OsStr>,
) -> Option<Launch> {
    npm::recognise(command, cwd, path).or_else(|| python::recognise(command, cwd, path))
}

/// The rule that grants `dir` (a package of a dependency tree) read and exec, for `why`.
fn grant(dir: PathBuf, why: &str) -> Need {
    Need {
        rule: super::Rule {
            path: dir,
            access: Access::ReadExec,
            why: why.to_owned(),
            id: None,
        },
        narrower: None,
    }
}

/// fsbroker's own cache directory for launchers (`$XDG_CACHE_HOME/fsbroker/launch`, else
/// `~/.cache/fsbroker/launch`): what it installs for a launcher lives here, never in the
/// person's own caches.
pub(crate) fn cache_root() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home().map(|h| h.join(".cache")))?;
    Some(base.join("fsbroker").join("launch"))
}

/// The person's home (`$HOME`).
fn home() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p != Path::new("/"))
}

/// Makes `dir` and the directories above it up to fsbroker's cache root, each owner-only:
/// what is installed there is run by the person's servers, so no other user may change it.
pub(crate) fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if let Some(root) = cache_root().and_then(|r| r.parent().map(Path::to_path_buf)) {
        for d in dir.ancestors().take_while(|d| d.starts_with(&root)) {
            let meta = std::fs::symlink_metadata(d)?;
            if !meta.is_dir() {
                return Err(std::io::Error::other(format!(
                    "{}: not a directory",
                    d.display()
                )));
            }
            if meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700))?;
            }
        }
    }
    Ok(())
}

/// Whether `dir` (a directory in a hidden directory of the home) holds installed code only,
/// so that a launcher's grant of it is not a grant of the person's settings: a package in
/// `node_modules`, a Python virtual environment (or a directory in one), or a Python
/// installation (`bin/python3*` beside `lib/python3*`, as uv and pyenv keep them).
pub(crate) fn holds_code_only(dir: &Path, home: &Path) -> bool {
    let Ok(inside) = dir.strip_prefix(home) else {
        return false;
    };
    if inside.components().any(|c| c.as_os_str() == "node_modules") {
        return true;
    }
    let mut at = home.to_path_buf();
    for c in inside.components() {
        at.push(c);
        if at.join("pyvenv.cfg").is_file() {
            return true;
        }
    }
    let named = |sub: &str, prefix: &str| {
        std::fs::read_dir(dir.join(sub)).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
    };
    named("bin", "python3") && named("lib", "python3")
}

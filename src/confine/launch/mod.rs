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

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::Access;
use super::runtime::{Need, find_program};
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
///
/// `writable` are the (canonical) paths the server may write: what lies there (a link, a
/// `package.json`) the server could have made on an earlier run, so no link there is
/// followed to make a grant ([`real`]).
pub(crate) fn recognise(
    command: &[OsString],
    cwd: &Path,
    path: Option<&std::ffi::OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    npm::recognise(command, cwd, path, writable)
        .or_else(|| python::recognise(command, cwd, path, writable))
}

/// `p` (absolute) as the kernel would reach it, every link on the way followed, unless one
/// lies in `writable` and leads out of it: the server could have planted it
/// (`node_modules/dep -> /etc`) to be granted its target on its next start. `None` then, and
/// when nothing is there. A link there that stays in what the server may write (npm's
/// `node_modules/.bin/NAME -> ../pkg/cli.js` in a project it may write) grants it nothing
/// new, and is followed.
pub(crate) fn real(p: &Path, writable: &[PathBuf]) -> Option<PathBuf> {
    match super::walk::resolve(p, writable) {
        super::walk::Walk::Found { path, .. } => Some(path),
        super::walk::Walk::Planted { .. } => {
            let target = p.canonicalize().ok()?;
            writable
                .iter()
                .any(|w| target.starts_with(w))
                .then_some(target)
        }
        super::walk::Walk::Absent => None,
    }
}

/// Whether `path` lies in one of `writable`.
pub(crate) fn in_writable(path: &Path, writable: &[PathBuf]) -> bool {
    writable.iter().any(|w| path.starts_with(w))
}

/// The name of the file that marks one of fsbroker's installs complete: written after the
/// installer succeeded, so an install cut short (the proxy killed) is not taken for one.
pub(crate) const INSTALLED: &str = ".fsbroker-installed";

/// The program `name` beside `launcher` (the same installation: `npm` beside `npx`, `uv` beside `uvx`), else in
/// `PATH`.
pub(crate) fn beside(launcher: &OsStr, name: &str, cwd: &Path, path: Option<&OsStr>) -> PathBuf {
    find_program(launcher, cwd, path)
        .and_then(|p| Some(p.parent()?.join(name)))
        .filter(|p| p.is_file())
        .or_else(|| find_program(OsStr::new(name), cwd, path))
        .unwrap_or_else(|| PathBuf::from(name))
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
/// installation (`bin/python3*` beside its standard library, `lib/python3.X/os.py`, as uv and
/// pyenv keep them).
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
    is_python_installation(dir)
}

/// Whether `dir` is a Python installation: its standard library (`lib/python3.X/os.py`)
/// beside its interpreter (`bin/python3…`). `~/.local`, with a user's `bin/python3` link and
/// `lib/python3.X/site-packages`, is not one (its `share` holds keyrings).
pub(crate) fn is_python_installation(dir: &Path) -> bool {
    let entries = |sub: &str| {
        std::fs::read_dir(dir.join(sub))
            .map(|e| e.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let python = entries("bin")
        .iter()
        .any(|e| e.file_name().to_string_lossy().starts_with("python3"));
    python
        && entries("lib").iter().any(|e| {
            e.file_name().to_string_lossy().starts_with("python3")
                && e.path().join("os.py").is_file()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_installed_code_passes_in_a_hidden_directory() {
        let home = tempfile::tempdir().unwrap();
        let home = home.path().canonicalize().unwrap();
        let mk = |p: &str| std::fs::create_dir_all(home.join(p)).unwrap();
        let touch = |p: &str| std::fs::write(home.join(p), "").unwrap();
        // `~/.local`: a user's python link and site-packages, and keyrings beside them.
        mk(".local/bin");
        mk(".local/lib/python3.11/site-packages");
        mk(".local/share/keyrings");
        touch(".local/bin/python3");
        assert!(!holds_code_only(&home.join(".local"), &home));
        assert!(!holds_code_only(&home.join(".local/share"), &home));
        // A Python installation (uv's): its standard library beside its interpreter.
        let py = ".local/share/uv/python/cpython-3.12-linux";
        mk(&format!("{py}/bin"));
        mk(&format!("{py}/lib/python3.12"));
        touch(&format!("{py}/bin/python3.12"));
        touch(&format!("{py}/lib/python3.12/os.py"));
        assert!(holds_code_only(&home.join(py), &home));
        // A virtual environment, and what lies in it.
        mk(".venvs/srv/lib");
        touch(".venvs/srv/pyvenv.cfg");
        assert!(holds_code_only(&home.join(".venvs/srv"), &home));
        assert!(holds_code_only(&home.join(".venvs/srv/lib"), &home));
        assert!(!holds_code_only(&home.join(".venvs"), &home));
        // Packages in node_modules; not the directory around them.
        mk(".npm-global/lib/node_modules/pkg");
        assert!(holds_code_only(
            &home.join(".npm-global/lib/node_modules/pkg"),
            &home
        ));
        assert!(!holds_code_only(&home.join(".npm-global"), &home));
        mk(".aws");
        assert!(!holds_code_only(&home.join(".aws"), &home));
    }
}

//! Python's launchers: `uvx PKG` (and `uv tool run`, `uv x`), `uv run CMD` in a project,
//! `pipx run PKG`, and a virtual environment's interpreter or program by its path.
//!
//! Each runs a program of a virtual environment, whose `#!` line names the environment's
//! interpreter; that interpreter links to a base installation (a system Python, pyenv's, or
//! one uv manages under `~/.local/share/uv/python`). The environment and the base
//! installation are granted read and exec (`runtime.rs` finds them from the program; the
//! guard lets them through even in a hidden directory of the home, as they hold code only),
//! and nothing else of the directory they lie in.
//!
//! `uvx` and `pipx run` make a throwaway environment in their cache on each start, asking the
//! index for the newest version: confined, they could do neither. So the environment is found
//! where the person installed the package as a tool (`uv tool install`, `pipx install`), or
//! where fsbroker installed it before ([`Missing`]: `uv tool install` or `pipx install` into
//! fsbroker's cache, building nothing from source), and its program runs directly. `uv run`
//! runs the project's `.venv`, which must have been made (`uv sync`): confined, uv could not
//! update it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::{Launch, Missing, cache_root, home};
use crate::confine::runtime::{find_program, read_regular};
use crate::policy::Registry;

/// Recognises a Python launcher; `None` for any other command line.
pub(super) fn recognise(
    command: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    let (program, args) = command.split_first()?;
    let name = Path::new(program).file_name()?.to_str()?;
    let word = |i: usize| args.get(i).and_then(|a| a.to_str());
    match (name, word(0), word(1)) {
        ("uvx", ..) => uvx(program, args, cwd, path, writable),
        ("uv", Some("tool"), Some("run")) => uvx(program, &args[2..], cwd, path, writable),
        ("uv", Some("x"), _) => uvx(program, &args[1..], cwd, path, writable),
        ("uv", Some("run"), _) => uv_run(&args[1..], cwd),
        ("pipx", Some("run"), _) => pipx_run(program, &args[1..], cwd, path, writable),
        _ => venv_program(program, cwd, path),
    }
}

/// A program of a virtual environment named by its path (`~/.venvs/srv/bin/python`,
/// `.venv/bin/mcp-server-x`): said, so that `confine check` shows why the environment is
/// granted.
fn venv_program(program: &OsStr, cwd: &Path, path: Option<&OsStr>) -> Option<Launch> {
    let exe = find_program(program, cwd, path)?;
    let venv = exe.parent()?.parent()?;
    if !venv.join("pyvenv.cfg").is_file() {
        return None;
    }
    Some(Launch {
        launcher: "a Python virtual environment's program".into(),
        resolved: vec![format!(
            "{} runs in the virtual environment {}: granted read+exec, with the Python \
             installation it was made from",
            exe.display(),
            venv.display()
        )],
        ..Launch::default()
    })
}

/// A package spec of PyPI: `name`, `name==1.2`, `name@1.2` (uvx's form), with the name
/// normalized (PEP 503) and the version kept.
#[derive(Debug, PartialEq)]
struct Spec {
    /// As written, for the installer (`name==1.2`).
    requirement: String,
    /// Normalized: lower case, runs of `-_.` one `-`.
    name: String,
    /// The name as written, which is also the program `uvx NAME` runs.
    written: String,
    version: Option<String>,
}

impl Spec {
    fn parse(spec: &str) -> Option<Spec> {
        let (written, version) = match spec.split_once("==").or_else(|| spec.split_once('@')) {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (spec, None),
        };
        let ok = !written.is_empty()
            && written.len() <= 200
            && written
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && written.starts_with(|c: char| c.is_ascii_alphanumeric());
        let version_ok = version.as_deref().is_none_or(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".+!-_".contains(c))
        });
        (ok && version_ok).then(|| Spec {
            requirement: match &version {
                Some(v) => format!("{written}=={v}"),
                None => written.to_owned(),
            },
            name: normalize(written),
            written: written.to_owned(),
            version,
        })
    }
}

/// PEP 503's normal form of a distribution name.
fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if "-_.".contains(c) {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Options a launcher line may carry before the package, and whether each takes a value.
/// Any other option makes the line unrecognised (said so), rather than guessed at.
struct Options<'a> {
    flags: &'a [&'a str],
    valued: &'a [&'a str],
}

/// The launcher line's package (or `--from`/`--spec` value), the program, and its arguments.
struct ToolLine {
    spec: String,
    /// The program named after the package (`--from PKG NAME`); else the package's own.
    program: Option<String>,
    args: Vec<OsString>,
}

fn parse_tool_line(args: &[OsString], from: &str, opts: Options) -> Result<ToolLine, String> {
    let mut it = args.iter();
    let mut spec = None;
    while let Some(arg) = it.next() {
        let a = arg
            .to_str()
            .ok_or_else(|| format!("{arg:?} is not UTF-8"))?;
        if a == from {
            spec = Some(
                it.next()
                    .and_then(|v| v.to_str())
                    .ok_or(format!("{from} without a value"))?
                    .to_owned(),
            );
        } else if let Some(v) = a.strip_prefix(&format!("{from}=")) {
            spec = Some(v.to_owned());
        } else if opts.flags.contains(&a) {
        } else if opts.valued.contains(&a) {
            it.next();
        } else if a.starts_with('-') {
            return Err(format!("the option {a} is not one fsbroker reads"));
        } else {
            let args = it.cloned().collect();
            return Ok(match spec {
                Some(spec) => ToolLine {
                    spec,
                    program: Some(a.to_owned()),
                    args,
                },
                None => ToolLine {
                    spec: a.to_owned(),
                    program: None,
                    args,
                },
            });
        }
    }
    Err("no package named".into())
}

/// A launch this module recognised but will not resolve: the line runs as given (and, with
/// no network, may fail; the start's diagnosis says so).
fn unresolved(launcher: &str, why: String) -> Launch {
    Launch {
        launcher: launcher.into(),
        resolved: vec![format!(
            "not resolved ({why}): it runs as given, and without the network it cannot fetch; \
             install the package as a tool first and give its program's path"
        )],
        ..Launch::default()
    }
}

/// A tool launcher's line read: its package (the `from` option's value, else the first plain
/// argument), the program to run and its arguments; or the launch that says why it is not
/// resolved. `flags` are the launcher's options that take no value and change nothing here.
fn read_tool_line(
    launcher: &str,
    args: &[OsString],
    from: &str,
    flags: &[&str],
) -> Result<(ToolLine, Spec, String), Box<Launch>> {
    let opts = Options { flags, valued: &[] };
    let line = parse_tool_line(args, from, opts).map_err(|why| unresolved(launcher, why))?;
    let spec = Spec::parse(&line.spec)
        .ok_or_else(|| unresolved(launcher, format!("{} is not a PyPI package", line.spec)))?;
    let program = line.program.clone().unwrap_or_else(|| spec.written.clone());
    Ok((line, spec, program))
}

/// `uvx [--from PKG] NAME ARGS…`: the package's environment where `uv tool install` put it
/// (the person's, or fsbroker's), and its program run directly.
fn uvx(
    uv: &OsStr,
    args: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    let flags = ["-q", "--quiet", "--offline", "--isolated", "--no-progress"];
    let (line, spec, program) = match read_tool_line("uvx", args, "--from", &flags) {
        Ok(read) => read,
        Err(launch) => return Some(*launch),
    };
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| home().map(|h| h.join(".local/share")));
    let person = std::env::var_os("UV_TOOL_DIR")
        .map(PathBuf::from)
        .or_else(|| data.map(|d| d.join("uv/tools")));
    let ours = cache_root()?.join("uvx").join(key(&spec.requirement));
    let places = person
        .map(|p| (p, "the person's uv tools".to_owned()))
        .into_iter()
        .chain(ours_if_installed(&ours, "tools"));
    let uv = super::beside(uv, "uv", cwd, path);
    // Nothing built from source, and no bytecode compiled: compiling starts the new
    // environment's python, which runs any `.pth` file a wheel ships.
    let install = vec![
        uv.into_os_string(),
        "tool".into(),
        "install".into(),
        "--no-build".into(),
        "--no-compile-bytecode".into(),
        "--quiet".into(),
        spec.requirement.clone().into(),
    ];
    let env = vec![
        ("UV_TOOL_DIR".into(), ours.join("tools").into_os_string()),
        ("UV_TOOL_BIN_DIR".into(), ours.join("bin").into_os_string()),
        ("UV_CACHE_DIR".into(), ours.join("cache").into_os_string()),
    ];
    let places = out_of_reach(places, writable);
    tool_launch(
        "uvx", &spec, &program, places, line.args, ours, install, env,
    )
}

/// `pipx run [--spec PKG] NAME ARGS…`: the package's environment where `pipx install` put it
/// (the person's, or fsbroker's), and its program run directly.
fn pipx_run(
    pipx: &OsStr,
    args: &[OsString],
    cwd: &Path,
    path: Option<&OsStr>,
    writable: &[PathBuf],
) -> Option<Launch> {
    let flags = ["-q", "--quiet", "--verbose", "-v", "--no-cache"];
    let (line, spec, program) = match read_tool_line("pipx run", args, "--spec", &flags) {
        Ok(read) => read,
        Err(launch) => return Some(*launch),
    };
    let person = std::env::var_os("PIPX_HOME")
        .map(PathBuf::from)
        .or_else(|| home().map(|h| h.join(".local/share/pipx")));
    let ours = cache_root()?.join("pipx").join(key(&spec.requirement));
    let places = person
        .map(|p| (p.join("venvs"), "the person's pipx installs".to_owned()))
        .into_iter()
        .chain(ours_if_installed(&ours, "home/venvs"));
    // Not pipx itself: after installing, it starts the new environment's python to read its
    // metadata, which runs any `.pth` file a wheel ships, unconfined. Python's own venv and
    // pip, started once before anything is installed, then never again; wheels only.
    let python = super::beside(pipx, "python3", cwd, path);
    let install = vec![
        python.into_os_string(),
        "-I".into(),
        "-c".into(),
        PIP_INSTALL.into(),
        ours.join("home/venvs").join(&spec.name).into_os_string(),
        spec.requirement.clone().into(),
    ];
    let env = vec![("PIP_CACHE_DIR".into(), ours.join("cache").into_os_string())];
    let places = out_of_reach(places, writable);
    tool_launch(
        "pipx run", &spec, &program, places, line.args, ours, install, env,
    )
}

/// How fsbroker installs a `pipx run` package: a virtual environment made by Python's `venv`
/// (with pip), then `pip install` of wheels only into it, in one run of its python.
const PIP_INSTALL: &str = "import subprocess, sys, venv\n\
venv.create(sys.argv[1], with_pip=True)\n\
subprocess.check_call([sys.argv[1] + '/bin/python', '-I', '-m', 'pip', 'install', '--quiet', \
'--disable-pip-version-check', '--only-binary=:all:', sys.argv[2]])\n";

/// The `places` the server cannot write: an environment there (the person's tools, or
/// fsbroker's cache, inside a read-write root) could be one a server made, and one server
/// must not choose what another runs.
fn out_of_reach(
    places: impl Iterator<Item = (PathBuf, String)>,
    writable: &[PathBuf],
) -> impl Iterator<Item = (PathBuf, String)> {
    places.filter(move |(dir, _)| {
        let real = dir.canonicalize().unwrap_or_else(|_| dir.clone());
        !super::in_writable(&real, writable)
    })
}

/// fsbroker's cache `ours`, at `sub`, as a place to look, once an install there finished.
fn ours_if_installed(ours: &Path, sub: &str) -> Option<(PathBuf, String)> {
    ours.join(super::INSTALLED).is_file().then(|| {
        (
            ours.join(sub),
            format!("fsbroker's cache ({})", ours.display()),
        )
    })
}

/// The launch of a tool's program found in one of `places` (directories holding one
/// environment per package), or what installs it.
#[allow(clippy::too_many_arguments)]
fn tool_launch(
    launcher: &str,
    spec: &Spec,
    program: &str,
    places: impl Iterator<Item = (PathBuf, String)>,
    args: Vec<OsString>,
    cache: PathBuf,
    install: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
) -> Option<Launch> {
    let mut launch = Launch {
        launcher: launcher.into(),
        ..Launch::default()
    };
    let mut looked = Vec::new();
    for (dir, what) in places {
        let venv = dir.join(&spec.name);
        let exe = venv.join("bin").join(program);
        if exe.is_file() && venv.join("pyvenv.cfg").is_file() && has_version(&venv, spec) {
            launch.resolved.push(format!(
                "runs {program} of {} from {what} ({}), directly",
                spec.requirement,
                venv.display()
            ));
            launch.resolved.push(format!(
                "{launcher} itself is not run: confined, it could neither ask the index for a \
                 newer version nor make its environment; it would have run this program"
            ));
            launch.resolved.push(format!(
                "granted read+exec: the environment {} and the Python it was made from",
                venv.display()
            ));
            // Granted here, not only through the program's `#!` line: a long path makes the
            // installer write a `#!/bin/sh` trampoline instead, which names no environment.
            launch
                .needs
                .push(super::grant(venv.clone(), "the tool's environment"));
            if let Some(base) = base_installation(&venv) {
                launch.needs.push(super::grant(
                    base,
                    "the Python the tool's environment was made from",
                ));
            }
            let mut run = vec![exe.into_os_string()];
            run.extend(args);
            launch.command = Some(run);
            return Some(launch);
        }
        looked.push(what);
    }
    launch.resolved.push(format!(
        "{} is not installed in {}",
        spec.requirement,
        looked.join(", nor in ")
    ));
    launch.missing = Some(Missing {
        registry: Registry::Pypi,
        package: spec.requirement.clone(),
        install,
        env,
        cache,
        instead: format!(
            "install it as a tool first (`uv tool install {0}` or `pipx install {0}`), or let \
             fsbroker install it (`--confine-fetch pypi`, or `fetch = [\"pypi\"]` in the \
             policy's [confine])",
            spec.requirement
        ),
    });
    Some(launch)
}

/// The Python installation a virtual environment was made from: `home` in its `pyvenv.cfg`
/// names that installation's `bin`. The package installed in the environment can rewrite
/// that file (a wheel's data files land in the environment's root), so `home` is taken only
/// when it names the `bin` of a real Python installation (an interpreter beside its standard
/// library), never a file or any other directory; and the last `home` line counts, as it
/// does for Python itself.
fn base_installation(venv: &Path) -> Option<PathBuf> {
    let cfg = read_regular(&venv.join("pyvenv.cfg"), 64 * 1024)?;
    let cfg = String::from_utf8_lossy(&cfg);
    let home = cfg.lines().rev().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "home").then(|| PathBuf::from(v.trim()))
    })?;
    let bin = home.canonicalize().ok()?;
    let installation = bin.parent()?;
    (bin.file_name().is_some_and(|n| n == "bin") && super::is_python_installation(installation))
        .then(|| installation.to_path_buf())
}

/// Whether the environment `venv` holds the version `spec` asks for (any, without one).
fn has_version(venv: &Path, spec: &Spec) -> bool {
    let Some(version) = &spec.version else {
        return true;
    };
    let Ok(libs) = std::fs::read_dir(venv.join("lib")) else {
        return false;
    };
    let dist = format!("{}-{version}.dist-info", spec.name.replace('-', "_"));
    libs.flatten().any(|lib| {
        std::fs::read_dir(lib.path().join("site-packages")).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| e.file_name().to_string_lossy().eq_ignore_ascii_case(&dist))
        })
    })
}

/// `uv run [--directory D | --project D] CMD ARGS…` in a project: CMD from the project's
/// `.venv` (a program of it, `python`, or a script run by its `python`).
fn uv_run(args: &[OsString], cwd: &Path) -> Option<Launch> {
    let mut it = args.iter();
    let mut dir = cwd.to_path_buf();
    let mut project = None;
    let first = loop {
        let arg = it.next()?;
        let Some(a) = arg.to_str() else {
            return Some(unresolved("uv run", format!("{arg:?} is not UTF-8")));
        };
        match a {
            "--directory" => dir = cwd.join(it.next()?),
            "--project" => project = Some(cwd.join(it.next()?)),
            "-q" | "--quiet" | "--frozen" | "--locked" | "--no-sync" | "--offline" => {}
            _ if a.starts_with('-') => {
                return Some(unresolved(
                    "uv run",
                    format!("the option {a} is not one fsbroker reads"),
                ));
            }
            _ => break a.to_owned(),
        }
    };
    let root = project.unwrap_or_else(|| {
        dir.ancestors()
            .find(|d| d.join("pyproject.toml").is_file())
            .unwrap_or(&dir)
            .to_path_buf()
    });
    let venv = std::env::var_os("UV_PROJECT_ENVIRONMENT")
        .map(|v| root.join(v))
        .unwrap_or_else(|| root.join(".venv"));
    let mut launch = Launch {
        launcher: "uv run".into(),
        ..Launch::default()
    };
    if !venv.join("pyvenv.cfg").is_file() {
        launch.resolved.push(format!(
            "the project {} has no environment {} yet: confined, uv could not make it. Run \
             `uv sync` in {} once, then start it again",
            root.display(),
            venv.display(),
            root.display()
        ));
        return Some(launch);
    }
    let bin = venv.join("bin");
    let mut run: Vec<OsString> = if first == "python" || first == "python3" {
        vec![bin.join("python").into_os_string()]
    } else if bin.join(&first).is_file() {
        vec![bin.join(&first).into_os_string()]
    } else if first.ends_with(".py") {
        vec![
            bin.join("python").into_os_string(),
            dir.join(&first).into_os_string(),
        ]
    } else {
        launch.resolved.push(format!(
            "{first} is neither a program of {} nor a script: uv runs as given",
            venv.display()
        ));
        return Some(launch);
    };
    launch.resolved.push(format!(
        "runs {} in the project's environment {}, directly: confined, uv could not update it \
         (run `uv sync` after changing the project)",
        Path::new(&run[run.len() - 1]).display(),
        venv.display()
    ));
    run.extend(it.cloned());
    launch.command = Some(run);
    Some(launch)
}

/// The first 16 hex digits of the SHA-256 of `spec`: fsbroker's cache directory of it.
fn key(spec: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(spec.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    /// Attack (a wheel's data files rewrite the environment's `pyvenv.cfg`): `home` naming a
    /// secret file, a directory that is no Python, or a real Python followed by a second
    /// `home` line, grants nothing but a real Python installation.
    #[test]
    fn a_rewritten_pyvenv_cfg_grants_only_a_python_installation() {
        let t = tempfile::tempdir().unwrap();
        let t = t.path().canonicalize().unwrap();
        let python = t.join("python");
        std::fs::create_dir_all(python.join("bin")).unwrap();
        std::fs::create_dir_all(python.join("lib/python3.11")).unwrap();
        std::fs::write(python.join("bin/python3.11"), "").unwrap();
        std::fs::write(python.join("lib/python3.11/os.py"), "").unwrap();
        std::fs::create_dir_all(t.join("secrets/bin")).unwrap();
        std::fs::write(t.join("secrets/bin/id_ed25519"), "KEY").unwrap();
        let venv = t.join("venv");
        std::fs::create_dir_all(&venv).unwrap();
        let with = |cfg: String| {
            std::fs::write(venv.join("pyvenv.cfg"), cfg).unwrap();
            base_installation(&venv)
        };
        let p = |p: &Path| p.display().to_string();
        assert_eq!(
            with(format!("home = {}\n", p(&python.join("bin")))),
            Some(python.clone())
        );
        for hostile in [
            format!("home = {}\n", p(&t.join("secrets/bin/id_ed25519"))),
            format!("home = {}\n", p(&t.join("secrets/bin"))),
            format!("home = {}\n", p(&t.join("secrets"))),
            format!("home = {}\n", p(&python)),
            format!(
                "home = {}\nhome = {}\n",
                p(&python.join("bin")),
                p(&t.join("secrets/bin"))
            ),
        ] {
            assert_eq!(with(hostile.clone()), None, "{hostile}");
        }
    }

    #[test]
    fn specs_are_pypi_names_with_a_version() {
        let s = Spec::parse("Mcp_Server.Git@1.2.0").unwrap();
        assert_eq!(s.name, "mcp-server-git");
        assert_eq!(s.requirement, "Mcp_Server.Git==1.2.0");
        assert_eq!(s.written, "Mcp_Server.Git");
        assert_eq!(Spec::parse("x==2").unwrap().version.as_deref(), Some("2"));
        for bad in [
            "../x",
            "git+https://x",
            "./dir",
            "/abs",
            "x==1 ; os",
            "",
            "-x",
        ] {
            assert_eq!(Spec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn tool_lines_name_the_package_the_program_and_its_arguments() {
        let opts = || Options {
            flags: &["-q"],
            valued: &[],
        };
        let l = parse_tool_line(&os(&["-q", "pkg", "--x", "y"]), "--from", opts()).unwrap();
        assert_eq!((l.spec.as_str(), l.program), ("pkg", None));
        assert_eq!(l.args, os(&["--x", "y"]));
        let l = parse_tool_line(&os(&["--from", "pkg==1", "prog", "a"]), "--from", opts()).unwrap();
        assert_eq!(
            (l.spec.as_str(), l.program.as_deref()),
            ("pkg==1", Some("prog"))
        );
        assert!(parse_tool_line(&os(&["--with", "x", "pkg"]), "--from", opts()).is_err());
    }
}

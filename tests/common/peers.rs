//! Real MCP peers for the tests: the npm packages pinned in `tests/peers/package.json` (and
//! its lockfile) and the Python packages pinned in `tests/peers/requirements.txt` (and, for the
//! Python SDK 1.x, `requirements-mcp1.txt`). When they are missing the tests install them
//! themselves, once (`npm ci --prefix tests/peers`; virtual environments in `tests/peers/.venv`
//! and `tests/peers/.venv-mcp1`), under a file lock so that tests starting at
//! the same moment install them once and wait for each other. Without Node.js and npm, or
//! Python 3 with venv, they fail, saying so: they are never skipped.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Hard limit for one script, beyond its own watchdog.
pub const LIMIT: Duration = Duration::from_secs(120);

/// `tests/peers`.
pub fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

/// The Node.js binary: `$NODE`, else `node` on the PATH.
pub fn node() -> String {
    std::env::var("NODE").unwrap_or_else(|_| "node".to_owned())
}

const NPM_PACKAGES: [&str; 7] = [
    "@anthropic-ai/claude-code",
    "@modelcontextprotocol/sdk",
    "@modelcontextprotocol/server-filesystem",
    "@modelcontextprotocol/server",
    "@modelcontextprotocol/client",
    "mcp-remote",
    "zod",
];

/// Runs `install` under the lock file `lock_path` unless `ready()` (checked again under the
/// lock): once, whichever test of whichever binary asks first.
pub fn install_once(lock_path: &Path, ready: impl Fn() -> bool, install: impl FnOnce()) {
    if ready() {
        return;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", lock_path.display()));
    // flock locks belong to the open file, so two tests of one binary exclude each other too.
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    if !ready() {
        install();
    }
}

/// Makes sure the npm peers are installed, exactly as pinned.
pub fn require_npm() {
    let ready = || {
        let modules = peers_dir().join("node_modules");
        NPM_PACKAGES
            .iter()
            .all(|p| modules.join(p).join("package.json").is_file())
    };
    install_once(&peers_dir().join(".install.lock"), ready, || {
        let npm = std::env::var("NPM").unwrap_or_else(|_| "npm".to_owned());
        let status = Command::new(&npm)
            .args(["ci", "--prefix"])
            .arg(peers_dir())
            .args(["--no-audit", "--no-fund"])
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "the MCP peers are not installed and `{npm} ci --prefix tests/peers` cannot \
                     run: {e} (install Node.js 20 or newer with npm, or set NPM to its path)"
                )
            });
        assert!(
            status.success(),
            "`{npm} ci --prefix tests/peers` failed ({status}): the MCP peers could not be installed"
        );
    });
    assert!(ready(), "npm ci ran but the MCP peers are still missing");
}

/// The virtual environment's Python, with the pinned Python peers installed (created on
/// first use: `python3 -m venv tests/peers/.venv`, then `pip install -r requirements.txt`).
pub fn require_python() -> PathBuf {
    require_venv(".venv", "requirements.txt")
}

/// The Python of `tests/peers/.venv-mcp1`, holding the Python SDK 1.x (`mcp` 1.30) that
/// `remote_py1.py` is made with: `requirements.txt` pins 2.x for the other peers, and one venv
/// cannot hold both.
pub fn require_python_mcp1() -> PathBuf {
    require_venv(".venv-mcp1", "requirements-mcp1.txt")
}

/// The Python of the virtual environment `tests/peers/VENV`, with `tests/peers/REQUIREMENTS`
/// installed (created on first use, under `tests/peers/VENV.lock`).
pub fn require_venv(venv: &str, requirements: &str) -> PathBuf {
    let lock = format!("{venv}.lock");
    let venv = peers_dir().join(venv);
    let python = venv.join("bin/python");
    let marker = venv.join(".installed");
    let requirements = peers_dir().join(requirements);
    let ready = || {
        // Installed from this very requirements file (a changed pin installs again).
        std::fs::read(&marker).ok() == std::fs::read(&requirements).ok()
    };
    install_once(&peers_dir().join(&lock), ready, || {
        let base = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let _ = std::fs::remove_dir_all(&venv);
        let status = Command::new(&base)
            .args(["-m", "venv"])
            .arg(&venv)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{base} -m venv`: {e} (install Python 3.10 or newer, or set PYTHON)"
                )
            });
        assert!(
            status.success(),
            "`{base} -m venv {}` failed ({status})",
            venv.display()
        );
        let status = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(&requirements)
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run pip in {}: {e}", venv.display()));
        assert!(
            status.success(),
            "`pip install -r {}` failed ({status})",
            requirements.display()
        );
        std::fs::copy(&requirements, &marker).expect("mark the venv installed");
    });
    assert!(
        ready(),
        "the Python peers of {} are still missing after installing them",
        requirements.display()
    );
    python
}

/// `tests/peers/wheels-NAME`, holding exactly the wheels that `tests/peers/requirements-NAME.txt`
/// pins (saved on first use by `pip download --only-binary=:all: --no-deps`, under
/// `tests/peers/wheels-NAME.lock`): a package index of files that a test gives a launcher
/// in place of the network.
pub fn require_wheels(name: &str) -> PathBuf {
    let dir = peers_dir().join(format!("wheels-{name}"));
    let requirements = peers_dir().join(format!("requirements-{name}.txt"));
    let marker = dir.join(".downloaded");
    let ready = || std::fs::read(&marker).ok() == std::fs::read(&requirements).ok();
    install_once(
        &peers_dir().join(format!("wheels-{name}.lock")),
        ready,
        || {
            let _ = std::fs::remove_dir_all(&dir);
            let python = require_venv(".venv-tools", "requirements-tools.txt");
            let status = Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--only-binary=:all:",
                    "--no-deps",
                    "-d",
                ])
                .arg(&dir)
                .arg("-r")
                .arg(&requirements)
                .stdin(Stdio::null())
                .status()
                .unwrap_or_else(|e| panic!("cannot run pip in {}: {e}", python.display()));
            assert!(
                status.success(),
                "`pip download -r {}` failed ({status})",
                requirements.display()
            );
            std::fs::copy(&requirements, &marker).expect("mark the wheels downloaded");
        },
    );
    assert!(
        ready(),
        "the wheels of {} are still missing after downloading them",
        requirements.display()
    );
    dir
}

/// Runs `program ARGS` (a peer script) in `tests/peers` against this build's `fsbroker`, in a
/// fresh scratch directory, with `env` added; asserts exit 0 and `"ok": true`, and returns the
/// script's JSON summary line (its last line that parses).
pub fn run_script(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Value {
    let scratch = tempfile::tempdir().expect("tempdir");
    let what = format!("{} {}", program.display(), args.join(" "));
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .current_dir(peers_dir())
        .env("FSBROKER_BIN", env!("CARGO_BIN_EXE_fsbroker"))
        .env("PEERS_TMPDIR", scratch.path())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the script") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    println!("--- {what}: stdout ---\n{stdout}");
    println!("--- {what}: stderr (servers' and proxy's logs) ---\n{stderr}");
    println!("--- {what}: {status:?} after {elapsed:?} ---");
    let status = status.unwrap_or_else(|| panic!("{what} ran longer than {LIMIT:?}; killed"));
    assert!(
        status.success(),
        "{what} failed ({status}):\n{}",
        stderr
            .lines()
            .skip_while(|l| !l.starts_with("PEER TEST FAILED"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let summary: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("{what} printed no JSON summary"));
    assert_eq!(summary["ok"], true, "{what}: {summary}");
    summary
}

/// Runs `node tests/peers/SCRIPT` ([`run_script`]).
pub fn run_node(script: &str) -> Value {
    require_npm();
    let path = peers_dir().join(script);
    run_script(
        Path::new(&node()),
        &[path.to_str().expect("utf-8 path")],
        &[],
    )
}

/// Where `program` is: itself when it names a path, else the first match on `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

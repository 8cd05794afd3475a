//! `fsbroker proxy --confine` with the launch lines people use: `npx -y PKG` with a cold
//! cache (fsbroker installs it first, `--confine-fetch npm`, from the tests' loopback
//! registry) and with a warm one (the registry gone), a global install under a prefix in a
//! hidden directory of the home (`~/.npm-global`), a project-local install with hoisted
//! dependencies (by `node_modules/.bin/NAME`, by `npx NAME`, and by `node script.js`), and a
//! compiled binary in `~/.cargo/bin`.
//!
//! Each form starts a hostile probe of our own (`tests/launchers/probe`, an npm package served
//! only by the loopback registry; `tests/launchers/probe.c` for the binary) that tries to read
//! `~/.ssh`, `/etc/shadow` and a sibling project, write outside its roots, open TCP to a
//! loopback service and to the registry, connect to a Unix socket (an ssh-agent's), and set
//! the times of a file outside its roots: all must fail, and its read-write root must work. The reference filesystem server (pinned in
//! `tests/launchers/npm`) starts through `npx -y` and through a hoisted project install, and
//! serves its root. A real server from PyPI, the reference git server, starts through `uvx`
//! and reports on the repository in its root, not on one beside it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fsb::{Cmd, Log};
use common::registry::{
    NpmRegistry, clear_npm_env, npm, npm_env, output_within, require_local_install,
    require_tarballs,
};
use common::{bin, path_str, tempdir};
use serde_json::{Value, json};

/// The probe's package name and program.
const PROBE: &str = "fsbroker-launch-probe";
const SERVER: &str = "@modelcontextprotocol/server-filesystem";
/// Bounds one start (a cold install of the reference server's ~100 packages takes seconds).
const LIMIT: Duration = Duration::from_secs(240);
/// `--start-timeout` for the starts here: a cold install counts against it, and on a loaded
/// 2-core machine one (pipx's venv and pip, ~100 npm packages) may pass the default 20 s,
/// whose own test is in `confine_start.rs`.
const START: &str = "200";

/// A home with secrets, a read-write root, a sibling project, a loopback service, an
/// ssh-agent's socket, and the loopback registry serving the pinned tarballs and the probe.
struct World {
    _t: tempfile::TempDir,
    dir: PathBuf,
    home: PathBuf,
    work: PathBuf,
    registry: Option<NpmRegistry>,
    url: String,
    registry_port: u16,
    service: std::net::TcpListener,
    agent: PathBuf,
    _agent: std::os::unix::net::UnixListener,
}

impl World {
    fn new() -> World {
        let tarballs = require_tarballs();
        let (t, dir) = tempdir();
        let served = dir.join("registry");
        std::fs::create_dir_all(&served).unwrap();
        for entry in std::fs::read_dir(&tarballs).unwrap() {
            let entry = entry.unwrap();
            std::os::unix::fs::symlink(entry.path(), served.join(entry.file_name())).unwrap();
        }
        let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/launchers/probe");
        let packed = output_within(
            clear_npm_env(&mut Command::new(npm()))
                .args(["pack", "--silent", "--pack-destination"])
                .arg(&served)
                .arg(&probe),
            LIMIT,
        );
        assert!(packed.status.success(), "npm pack: {packed:?}");
        let registry = NpmRegistry::start(&served);
        let home = dir.join("home");
        let work = dir.join("work");
        for d in [
            home.join(".ssh"),
            work.clone(),
            dir.join("sibling"),
            dir.join("outside"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(home.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
        std::fs::write(dir.join("sibling/secret.txt"), "sibling's secret").unwrap();
        std::fs::write(work.join("f.txt"), "in work").unwrap();
        let agent = dir.join("agent.sock");
        World {
            _t: t,
            url: registry.url(),
            registry_port: registry.port(),
            registry: Some(registry),
            service: std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            _agent: std::os::unix::net::UnixListener::bind(&agent).unwrap(),
            agent,
            dir,
            home,
            work,
        }
    }

    /// npm pointed at the loopback registry, with the home's own cache and prefix.
    fn env(&self) -> Vec<(String, String)> {
        npm_env(&self.url, &self.home.join(".npm"), &self.home)
    }

    /// `npm ARGS` in `cwd` against the registry.
    fn npm(&self, args: &[&str], cwd: &Path) {
        let out = output_within(
            clear_npm_env(&mut Command::new(npm()))
                .args(args)
                .current_dir(cwd)
                .envs(self.env()),
            LIMIT,
        );
        assert!(out.status.success(), "npm {args:?}: {out:?}");
    }

    /// What the probe tries, and what each must give: its root works; nothing else does.
    fn ops(&self) -> (Value, Vec<&'static str>) {
        let p = |p: &Path| path_str(p);
        let ops = json!([
            ["read", p(&self.work.join("f.txt"))],
            ["write", p(&self.work.join("new.txt"))],
            ["read", p(&self.home.join(".ssh/id_ed25519"))],
            ["read", "/etc/shadow"],
            ["read", p(&self.dir.join("sibling/secret.txt"))],
            ["write", p(&self.dir.join("outside/new.txt"))],
            ["list", p(&self.home)],
            ["connect", self.service.local_addr().unwrap().port()],
            ["connect", self.registry_port],
            ["unix", p(&self.agent)],
            ["utime", p(&self.dir.join("sibling/secret.txt"))],
        ]);
        let want = vec![
            "ok:in work",
            "ok",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            "err:EACCES",
            // Time changes by path are the seccomp filter's to refuse (Landlock has no right
            // for them).
            "err:EPERM",
        ];
        (ops, want)
    }

    /// A policy with `work` as a read-write root.
    fn policy(&self) -> PathBuf {
        let policy = self.dir.join("policy.toml");
        common::PolicyToml::new()
            .root(common::RootToml::at(&self.work).name("work").rw())
            .write_to(&policy);
        policy
    }

    /// `fsbroker proxy --policy P --confine EXTRA -- ARGV` in `cwd`, the host's stdin closed:
    /// the probe's results and the proxy's stderr.
    fn probe(&self, extra: &[&str], argv: &[OsString], cwd: &Path) -> (Vec<String>, String) {
        self.probe_with(extra, argv, cwd, &[])
    }

    /// [`World::probe`] with more environment.
    fn probe_with(
        &self,
        extra: &[&str],
        argv: &[OsString],
        cwd: &Path,
        env: &[(&str, String)],
    ) -> (Vec<String>, String) {
        let (ops, _) = self.ops();
        let policy = self.policy();
        let mut cmd = Command::new(bin());
        clear_npm_env(&mut cmd)
            .args(["proxy", "--policy", policy.to_str().unwrap(), "--confine"])
            .args(["--start-timeout", START])
            .args(extra)
            .arg("--")
            .args(argv)
            .current_dir(cwd)
            .envs(self.env())
            .env_remove("XDG_CACHE_HOME")
            .env("PROBE", ops.to_string())
            .envs(env.iter().map(|(k, v)| (k, v)));
        let out = output_within(&mut cmd, LIMIT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let line = stdout
            .lines()
            .find(|l| l.contains("\"probe\""))
            .unwrap_or_else(|| {
                panic!("no probe line from {argv:?}; stdout {stdout:?}, stderr {stderr}")
            });
        let v: Value = serde_json::from_str(line).unwrap();
        let results = v["params"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap().to_owned())
            .collect();
        (results, stderr)
    }

    /// Runs the probe through `argv` and checks every operation's outcome.
    fn confined(&self, what: &str, extra: &[&str], argv: &[OsString], cwd: &Path) -> String {
        let (results, stderr) = self.probe(extra, argv, cwd);
        let (ops, want) = self.ops();
        for (i, want) in want.iter().enumerate() {
            assert_eq!(
                results[i], *want,
                "{what}: {} gave {}; stderr:\n{stderr}",
                ops[i], results[i]
            );
        }
        assert_eq!(
            std::fs::read_to_string(self.work.join("new.txt")).unwrap(),
            "written by the server"
        );
        std::fs::remove_file(self.work.join("new.txt")).unwrap();
        assert!(!self.dir.join("outside/new.txt").exists(), "{what}");
        stderr
    }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Rule: `npx -y PKG` with nothing installed is installed by fsbroker before the server
/// starts (`--confine-fetch npm`), into fsbroker's own owner-only cache (never the person's
/// npm cache), and the server runs confined with no network: it reaches its root and nothing
/// else, not even the registry the install used. The next start finds it installed (the
/// registry gone, no `--confine-fetch`), and does not run npx.
#[test]
fn npx_dash_y_starts_confined_cold_and_warm() {
    let mut w = World::new();
    let stderr = w.confined(
        "npx -y, cold",
        &["--confine-fetch", "npm"],
        &os(&["npx", "-y", PROBE]),
        &w.dir,
    );
    assert!(stderr.contains("launcher: npx"), "{stderr}");
    let registry = w.registry.take().unwrap();
    assert!(
        registry.requests().iter().any(|r| r.contains(PROBE)),
        "the install asked the registry: {:?}",
        registry.requests()
    );
    drop(registry);
    let cache = w.home.join(".cache/fsbroker/launch");
    for d in [&cache, &cache.join("npx")] {
        let mode = std::fs::metadata(d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    assert!(
        !w.home.join(".npm/_npx").exists(),
        "the person's npm cache was written"
    );
    // Warm: no registry, no fetch allowed.
    let stderr = w.confined("npx -y, warm", &[], &os(&["npx", "-y", PROBE]), &w.dir);
    assert!(stderr.contains("fsbroker's cache"), "{stderr}");
}

/// Rule: `npx -y PKG` with nothing installed and no fetch allowed is refused within seconds,
/// and the host's `initialize` gets a JSON-RPC error that says what to do; the registry is
/// never asked.
#[test]
fn npx_without_an_install_or_fetch_fails_at_once_with_what_to_do() {
    let w = World::new();
    let policy = w.policy();
    let started = Instant::now();
    let args = [
        "proxy",
        "--policy",
        policy.to_str().unwrap(),
        "--confine",
        "--",
        "npx",
        "-y",
        PROBE,
    ];
    let mut cmd = Cmd::new(&args).cwd(&w.dir).log(Log::Keep);
    for (k, v) in w.env() {
        cmd = cmd.env(k, v);
    }
    let mut host = cmd.env("XDG_CACHE_HOME", w.home.join(".cache")).spawn();
    let id = host.send(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
    );
    let answer = host.response(id);
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--confine-fetch npm"), "{answer}");
    assert!(message.contains(PROBE), "{answer}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let status = host
        .wait_exit(Duration::from_secs(10))
        .expect("the proxy exits");
    assert!(!status.success());
    assert!(
        w.registry.as_ref().unwrap().requests().is_empty(),
        "the registry was asked: {:?}",
        w.registry.as_ref().unwrap().requests()
    );
}

/// Rule: a global install under a prefix in a hidden directory of the home (`~/.npm-global`,
/// npm's documented setup) starts confined, by its program's path and by `npx NAME`, and is
/// granted the package's tree, never `~/.npm-global` whole; so does one under a prefix like
/// npm's default (`/usr/local`, here a directory of the test's).
#[test]
fn a_global_install_under_npm_global_starts_confined() {
    let w = World::new();
    w.npm(&["install", "-g", PROBE], &w.dir);
    let program = w.home.join(".npm-global/bin").join(PROBE);
    let stderr = w.confined("global, by path", &[], &[program.into_os_string()], &w.dir);
    assert!(
        stderr.contains("a package's program in node_modules"),
        "{stderr}"
    );
    w.confined("global, npx NAME", &[], &os(&["npx", PROBE]), &w.dir);
    // A prefix like npm's default (`/usr/local`, outside the home).
    let prefix = w.dir.join("usr-local");
    w.npm(
        &["install", "-g", "--prefix", &path_str(&prefix), PROBE],
        &w.dir,
    );
    let program = prefix.join("bin").join(PROBE);
    w.confined(
        "global, a system-like prefix",
        &[],
        &[program.into_os_string()],
        &w.dir,
    );
    // What confine check shows: the package, not the prefix.
    let out = Command::new(bin())
        .args(["confine", "check", "--root"])
        .arg(&w.work)
        .arg("--")
        .arg(w.home.join(".npm-global/bin").join(PROBE))
        .envs(w.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let granted = |p: &Path| {
        text.lines()
            .any(|l| l.starts_with("  read") && l.contains(&format!(" {}  (", p.display())))
    };
    assert!(
        granted(&w.home.join(".npm-global/lib/node_modules").join(PROBE)),
        "{text}"
    );
    assert!(!granted(&w.home.join(".npm-global")), "{text}");
    assert!(
        !granted(&w.home.join(".npm-global/lib/node_modules")),
        "{text}"
    );
}

/// Rule: a project-local install outside every root, its dependencies hoisted beside it,
/// starts confined by `node_modules/.bin/NAME` from elsewhere, by `npx NAME` in the project,
/// and by `node script.js`.
#[test]
fn a_project_local_install_starts_confined_every_way() {
    let w = World::new();
    let tools = w.home.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    w.npm(&["install", PROBE], &tools);
    let bin = tools.join("node_modules/.bin").join(PROBE);
    w.confined("local .bin", &[], &[bin.into_os_string()], &w.dir);
    w.confined("local npx NAME", &[], &os(&["npx", PROBE]), &tools);
    let script = tools.join("node_modules").join(PROBE).join("probe.js");
    w.confined(
        "node script.js",
        &[],
        &[OsString::from("node"), script.into_os_string()],
        &w.dir,
    );
}

/// Rule: a compiled server in `~/.cargo/bin` starts confined and gets its `bin` directory,
/// not `~/.cargo` (where registry credentials live).
#[test]
fn a_compiled_binary_in_cargo_bin_starts_confined() {
    let w = World::new();
    let cargo_bin = w.home.join(".cargo/bin");
    std::fs::create_dir_all(&cargo_bin).unwrap();
    std::fs::write(w.home.join(".cargo/credentials.toml"), "token = \"secret\"").unwrap();
    let program = cargo_bin.join("probe");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/launchers/probe.c");
    let cc = Command::new("cc")
        .arg("-O")
        .arg("-o")
        .arg(&program)
        .arg(&source)
        .output()
        .expect("cc (Debian's gcc) builds the probe");
    assert!(cc.status.success(), "{cc:?}");
    let (ops, want) = w.ops();
    let mut lines: Vec<String> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|op| match &op[1] {
            Value::String(s) => format!("{} {s}", op[0].as_str().unwrap()),
            n => format!("{} {n}", op[0].as_str().unwrap()),
        })
        .collect();
    lines.push(format!(
        "read {}",
        path_str(&w.home.join(".cargo/credentials.toml"))
    ));
    let (results, stderr) = w.probe_with(
        &[],
        &[program.into_os_string()],
        &w.dir,
        &[("PROBE_OPS", lines.join("\n"))],
    );
    // The C probe reports no file contents: "ok" for a read that worked.
    let mut want: Vec<&str> = want
        .iter()
        .map(|s| if s.starts_with("ok") { "ok" } else { s })
        .collect();
    want.push("err:EACCES");
    assert_eq!(results, want, "{stderr}");
}

/// The reference filesystem server through `npx -y` (installed first by fsbroker from the
/// loopback registry) and through a hoisted project install run from elsewhere: it answers
/// `initialize`, takes the broker's root, and reads in it; what lies outside stays closed.
#[test]
fn the_reference_server_starts_by_npx_and_by_a_hoisted_install() {
    let w = World::new();
    let local = require_local_install();
    let bin = local.join("node_modules/.bin/mcp-server-filesystem");
    let spec = format!("{SERVER}@2026.8.31");
    let forms: Vec<(&str, Vec<OsString>, Vec<&str>)> = vec![
        (
            "npx -y",
            os(&["npx", "-y", &spec]),
            vec!["--confine-fetch", "npm"],
        ),
        ("hoisted .bin", vec![bin.into_os_string()], vec![]),
    ];
    for (what, argv, extra) in forms {
        let policy = w.policy();
        let mut args = os(&["proxy", "--policy", policy.to_str().unwrap(), "--confine"]);
        args.extend(os(&["--start-timeout", START]));
        args.extend(os(&extra));
        args.push("--".into());
        args.extend(argv);
        let mut cmd = Cmd::new(&args).cwd(&w.dir).log(Log::Keep).deadline(LIMIT);
        for (k, v) in w.env() {
            cmd = cmd.env(k, v);
        }
        let mut host = cmd.env("XDG_CACHE_HOME", w.home.join(".cache")).spawn();
        let init = host.ok(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        );
        assert_eq!(
            init["serverInfo"]["name"], "secure-filesystem-server",
            "{what}"
        );
        host.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        // The server asks for the roots after `initialized`; until it has them it has none.
        let deadline = Instant::now() + Duration::from_secs(30);
        let read = loop {
            let r = host.request(
                "tools/call",
                json!({"name": "read_text_file", "arguments": {"path": path_str(&w.work.join("f.txt"))}}),
            );
            if r["result"]["isError"] != json!(true) || Instant::now() > deadline {
                break r;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(
            read["result"]["content"][0]["text"], "in work",
            "{what}: {read}"
        );
        let outside = host.request(
            "tools/call",
            json!({"name": "read_text_file", "arguments": {"path": path_str(&w.dir.join("sibling/secret.txt"))}}),
        );
        assert!(
            !outside.to_string().contains("sibling's secret"),
            "{what}: {outside}"
        );
        host.close_stdin();
        host.wait_exit(Duration::from_secs(20))
            .expect("the proxy exits");
    }
}

/// The Python launchers' world: uv and pipx (pinned in `tests/peers/requirements-tools.txt`)
/// first in `PATH`, and the probe's wheel as the only package index (`--find-links` of a
/// directory: no network at all, so a warm start that asked the index would fail).
struct PyWorld {
    w: World,
    tools: PathBuf,
    wheels: PathBuf,
}

impl PyWorld {
    fn new() -> PyWorld {
        let python = common::peers::require_venv(".venv-tools", "requirements-tools.txt");
        let w = World::new();
        let wheels = w.dir.join("wheels");
        std::fs::create_dir_all(&wheels).unwrap();
        let built = Command::new(&python)
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/launchers/pyprobe/build_wheel.py"),
            )
            .arg(&wheels)
            .output()
            .unwrap();
        assert!(built.status.success(), "{built:?}");
        PyWorld {
            tools: python.parent().unwrap().to_path_buf(),
            wheels,
            w,
        }
    }

    /// What the launchers and the proxy run with: the tools first in `PATH`, the wheel
    /// directory as the index, no Python downloads.
    fn env(&self) -> Vec<(String, String)> {
        let path = format!(
            "{}:{}",
            self.tools.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let wheels = path_str(&self.wheels);
        [
            ("PATH", path),
            ("UV_FIND_LINKS", wheels.clone()),
            ("UV_NO_INDEX", "1".into()),
            ("UV_PYTHON_DOWNLOADS", "never".into()),
            ("PIP_FIND_LINKS", wheels),
            ("PIP_NO_INDEX", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    fn confined(&self, what: &str, extra: &[&str], argv: &[&str], cwd: &Path) -> String {
        let env = self.env();
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let (results, stderr) = self.w.probe_with(extra, &os(argv), cwd, &env);
        let (ops, want) = self.w.ops();
        for (i, want) in want.iter().enumerate() {
            assert_eq!(
                results[i], *want,
                "{what}: {} gave {}; stderr:\n{stderr}",
                ops[i], results[i]
            );
        }
        assert!(!self.w.dir.join("outside/new.txt").exists(), "{what}");
        stderr
    }

    /// Runs a tool (`uv`, `python`) with this world's environment; it must succeed.
    fn run(&self, program: &Path, args: &[&str]) {
        let out = output_within(
            Command::new(program)
                .args(args)
                .envs(self.env())
                .env("HOME", &self.w.home),
            LIMIT,
        );
        assert!(out.status.success(), "{program:?} {args:?}: {out:?}");
    }
}

/// Rule: `uvx PKG` and `pipx run PKG` with nothing installed are installed by fsbroker first
/// (`--confine-fetch pypi`: `uv tool install`, `pipx install`, into fsbroker's owner-only
/// cache), and the program runs confined with no network; the next start needs no index.
#[test]
fn uvx_and_pipx_run_start_confined_cold_and_warm() {
    let py = PyWorld::new();
    for (launcher, argv) in [
        ("uvx", vec!["uvx", PROBE]),
        ("pipx", vec!["pipx", "run", PROBE]),
    ] {
        let stderr = py.confined(launcher, &["--confine-fetch", "pypi"], &argv, &py.w.dir);
        assert!(stderr.contains("fsbroker's cache"), "{stderr}");
        let cache = py.w.home.join(".cache/fsbroker/launch").join(launcher);
        let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", cache.display());
        // Warm: the index gone, no fetch allowed.
        let saved = py.w.dir.join("wheels.saved");
        std::fs::rename(&py.wheels, &saved).unwrap();
        py.confined(&format!("{launcher}, warm"), &[], &argv, &py.w.dir);
        std::fs::rename(&saved, &py.wheels).unwrap();
    }
    // Neither the person's uv tools nor their pipx home got the install (uv's installer
    // reads the person's index credentials, under a lock file of its own there).
    assert!(!py.w.home.join(".local/share/uv/tools").exists());
    assert!(!py.w.home.join(".local/share/pipx").exists());
}

/// A real MCP server from PyPI, the reference git server (`mcp-server-git`, pinned with its
/// whole tree in `tests/peers/requirements-git-server.txt`), through `uvx`: installed first
/// by fsbroker from the pinned wheels (the only index), it starts confined and reports on the
/// repository in its root. Given no `--repository`, the server itself refuses no path, so the
/// repository beside the root, which the same line reads unconfined, is closed by the kernel.
#[test]
fn a_pypi_server_by_uvx_serves_its_root_and_nothing_beside() {
    let py = PyWorld::new();
    for entry in std::fs::read_dir(common::peers::require_wheels("git-server")).unwrap() {
        let entry = entry.unwrap();
        if entry.path().extension().is_some_and(|e| e == "whl") {
            std::os::unix::fs::symlink(entry.path(), py.wheels.join(entry.file_name())).unwrap();
        }
    }
    let sibling = py.w.dir.join("sibling");
    for repo in [&py.w.work, &sibling] {
        for args in [
            &["init", "-q"][..],
            &["add", "."],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "one",
            ],
        ] {
            let out = output_within(Command::new("git").args(args).current_dir(repo), LIMIT);
            assert!(out.status.success(), "git {args:?}: {out:?}");
        }
    }
    std::fs::write(sibling.join("untracked-secret.txt"), "beside the root").unwrap();
    let policy = py.w.policy();
    for confined in [true, false] {
        let mut args = os(&["proxy", "--policy", policy.to_str().unwrap()]);
        if confined {
            args.extend(os(&[
                "--confine",
                "--confine-fetch",
                "pypi",
                "--start-timeout",
                START,
            ]));
        }
        args.extend(os(&["--", "uvx", "mcp-server-git==2026.10.19"]));
        let mut cmd = Cmd::new(&args)
            .cwd(&py.w.dir)
            .log(Log::Keep)
            .deadline(LIMIT)
            .env("HOME", path_str(&py.w.home))
            .env("XDG_CACHE_HOME", path_str(&py.w.home.join(".cache")));
        for (k, v) in py.env() {
            cmd = cmd.env(k, v);
        }
        let mut host = cmd.spawn();
        let init = host.ok(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}),
        );
        assert_eq!(
            init["serverInfo"]["name"], "mcp-git",
            "confined: {confined}"
        );
        host.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let status = |host: &mut common::fsb::Fsb, repo: &Path| {
            host.request(
                "tools/call",
                json!({"name": "git_status", "arguments": {"repo_path": path_str(repo)}}),
            )
        };
        let inside = status(&mut host, &py.w.work);
        assert!(
            inside["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("nothing to commit")),
            "confined: {confined}: {inside}"
        );
        let beside = status(&mut host, &sibling);
        let read_it = beside.to_string().contains("untracked-secret.txt");
        assert_eq!(read_it, !confined, "confined: {confined}: {beside}");
        if confined {
            assert_eq!(beside["result"]["isError"], true, "{beside}");
        }
        host.close_stdin();
        host.wait_exit(Duration::from_secs(20))
            .expect("the proxy exits");
    }
}

/// Rule: `uv run CMD` in a project (its `.venv` synced) and a virtual environment's python by
/// absolute path, in a hidden directory of the home, start confined: the environment and its
/// Python installation are granted, nothing else of the home.
#[test]
fn uv_run_and_a_venv_python_start_confined() {
    let py = PyWorld::new();
    let uv = py.tools.join("uv");
    let project = py.w.dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("pyproject.toml"),
        "[project]\nname = \"srv\"\nversion = \"0.1.0\"\nrequires-python = \">=3.10\"\n",
    )
    .unwrap();
    let wheel = std::fs::read_dir(&py.wheels)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // A virtual environment at `dir` holding the probe; its python.
    let venv_with_probe = |dir: &Path| {
        py.run(&uv, &["venv", "--quiet", &path_str(dir)]);
        let python = dir.join("bin/python");
        let (python_arg, wheel_arg) = (path_str(&python), path_str(&wheel));
        let install = [
            "pip",
            "install",
            "--quiet",
            "--python",
            &python_arg,
            &wheel_arg,
        ];
        py.run(&uv, &install);
        python
    };
    venv_with_probe(&project.join(".venv"));
    py.confined(
        "uv run",
        &[],
        &["uv", "run", "--directory", &path_str(&project), PROBE],
        &py.w.dir,
    );
    let python = venv_with_probe(&py.w.home.join(".venvs/srv"));
    let stderr = py.confined(
        "venv python -m",
        &[],
        &[&path_str(&python), "-m", "fsbroker_launch_probe"],
        &py.w.dir,
    );
    assert!(stderr.contains("virtual environment"), "{stderr}");
}

/// A home so deep that an installed program's `#!` line would pass the kernel's limit (127
/// bytes), so pip and uv write a `/bin/sh` trampoline instead, which names the environment's
/// Python on its second line: `uvx`, `pipx run` and a venv's program by path still start
/// confined, the environment and its Python granted by what the launcher made, not by the
/// `#!` line.
#[test]
fn a_deep_installation_path_with_a_shell_trampoline_starts_confined() {
    let py = PyWorld::new();
    let deep =
        py.w.dir
            .join("d".repeat(100))
            .join("e".repeat(60))
            .join("home");
    std::fs::create_dir_all(&deep).unwrap();
    let run = |what: &str, extra: &[&str], argv: &[&str]| {
        let mut env: Vec<(String, String)> = py.env();
        env.push(("HOME".to_owned(), path_str(&deep)));
        let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let (results, stderr) = py.w.probe_with(extra, &os(argv), &py.w.dir, &env);
        let (ops, want) = py.w.ops();
        for (i, want) in want.iter().enumerate() {
            assert_eq!(
                results[i], *want,
                "{what}: {} gave {}; stderr:\n{stderr}",
                ops[i], results[i]
            );
        }
        stderr
    };
    // The program each launcher made starts with the trampoline, or this test tests nothing.
    let trampolined = |root: &Path| {
        let found = walk_files(root)
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n == PROBE))
            .collect::<Vec<_>>();
        assert!(!found.is_empty(), "no {PROBE} under {}", root.display());
        for program in found {
            let text = std::fs::read_to_string(&program).unwrap();
            assert!(
                text.starts_with("#!/bin/sh\n"),
                "{}: {text}",
                program.display()
            );
        }
    };
    let cache = deep.join(".cache/fsbroker/launch");
    run("uvx, deep", &["--confine-fetch", "pypi"], &["uvx", PROBE]);
    trampolined(&cache.join("uvx"));
    run(
        "pipx run, deep",
        &["--confine-fetch", "pypi"],
        &["pipx", "run", PROBE],
    );
    trampolined(&cache.join("pipx"));
    let venv = deep.join(".venvs/srv");
    let wheel = std::fs::read_dir(&py.wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .unwrap();
    let uv = py.tools.join("uv");
    py.run(&uv, &["venv", "--quiet", &path_str(&venv)]);
    let python = path_str(&venv.join("bin/python"));
    py.run(
        &uv,
        &[
            "pip",
            "install",
            "--quiet",
            "--python",
            &python,
            &path_str(&wheel),
        ],
    );
    trampolined(&venv.join("bin"));
    run(
        "venv program, deep",
        &[],
        &[&path_str(&venv.join("bin").join(PROBE))],
    );
}

/// Every file under `root`, links not followed.
fn walk_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files
}

/// Attack: a project install inside the server's own read-write root, where the server, on an
/// earlier run, planted `node_modules/evil -> ../../sibling` (a project with a package.json)
/// and made its package depend on `evil`. The next start does not follow the link: the
/// sibling stays closed, and `confine check` says why.
#[test]
fn a_link_planted_in_a_writable_install_does_not_steer_the_next_start() {
    let w = World::new();
    let project = w.work.join("project");
    std::fs::create_dir_all(&project).unwrap();
    w.npm(&["install", PROBE], &project);
    std::fs::write(
        w.dir.join("sibling/package.json"),
        r#"{"name":"evil","version":"1.0.0"}"#,
    )
    .unwrap();
    let modules = project.join("node_modules");
    std::os::unix::fs::symlink(w.dir.join("sibling"), modules.join("evil")).unwrap();
    let manifest = modules.join(PROBE).join("package.json");
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    json["dependencies"] = json!({"evil": "1.0.0"});
    std::fs::write(&manifest, json.to_string()).unwrap();
    let program = modules.join(".bin").join(PROBE);
    let stderr = w.confined("planted link", &[], &[program.into_os_string()], &w.dir);
    assert!(stderr.contains("not followed"), "{stderr}");
}

//! Claude Code's managed MCP servers (`/etc/claude-code/managed-mcp.json`) each run through
//! `fsbroker proxy --confine`, checked with a real Claude Code (`@anthropic-ai/claude-code`,
//! pinned in `tests/peers/package-lock.json`): `claude mcp list` starts every server it lists,
//! says "✔ Connected" for one that answered `initialize`, and "✘ Failed to connect" for one
//! that did not. This is the how-to of docs/admin.md ("Claude Code: every server through
//! `fsbroker proxy --confine`"), run as written there.
//!
//! Nothing here touches the machine's own `/etc`: Claude Code runs as root in private mount,
//! PID and network namespaces (`unshare`), whose `/etc` is an overlay of the real one (writes
//! go to a tmpfs) with `/etc/claude-code` and `/etc/fsbroker` private tmpfs of their own. The
//! network namespace has no interface up, not even loopback: `claude mcp list` needs no
//! network and no login (a private, empty `HOME`), and the test shows it. The PID namespace
//! ends every process Claude Code started (the broker, the server) when it exits.

// Tests set up their own files with std::fs.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::json;

use common::bin;
use common::peers::{peers_dir, require_npm};
use common::registry::output_within;

/// One `claude` command, from its start to its end (it starts each server and waits for its
/// `initialize`, up to 30 s, and fsbroker's confined start is bounded by 20 s).
const LIMIT: Duration = Duration::from_secs(90);

/// What `claude mcp list` prints after a server that answered `initialize` (Claude Code
/// 2.1.197; U+2714).
const CONNECTED: &str = " - \u{2714} Connected";
/// ... and after one that did not (U+2718).
const FAILED: &str = " - \u{2718} Failed to connect";

/// Builds the private `/etc` and runs the rest of its arguments there: `$1` a scratch folder
/// (a tmpfs is mounted on it, in the namespace only), `$2` the `managed-mcp.json` to install
/// and `$3` the `managed.toml` (`-` for none), each owned by root, mode 0644, as an
/// administrator deploys them.
const PRIVATE_ETC: &str = r#"set -e
scratch=$1; mcp=$2; managed=$3; shift 3
mount -t tmpfs -o mode=0700 fsbroker-test "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p /etc/claude-code /etc/fsbroker
mount -t tmpfs -o mode=0755 claude-code-managed /etc/claude-code
mount -t tmpfs -o mode=0755 fsbroker-managed /etc/fsbroker
if [ "$mcp" != - ]; then install -o 0 -g 0 -m 0644 "$mcp" /etc/claude-code/managed-mcp.json; fi
if [ "$managed" != - ]; then install -o 0 -g 0 -m 0644 "$managed" /etc/fsbroker/managed.toml; fi
"$@"
"#;

/// The administrator's `/etc/fsbroker/managed.toml`: no MCP server runs unconfined.
const REQUIRE_CONFINEMENT: &str = "[confine]\nrequired = \"best-effort\"\n";

/// Claude Code, the reference server and Node.js, a person's home and project, and a folder
/// the managed server is given.
struct World {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    claude: PathBuf,
    node: PathBuf,
    server: PathBuf,
    /// The folder `claude` is started in (its servers start there too).
    project: PathBuf,
    /// The managed server's folder, named by absolute path.
    shared: PathBuf,
}

impl World {
    fn new() -> Option<World> {
        if !rustix::process::getuid().is_root()
            || Command::new("unshare").arg("--help").output().is_err()
        {
            common::skipped("private mount and network namespaces need root and unshare(1)");
            return None;
        }
        require_npm();
        let claude = peers_dir().join("node_modules/.bin/claude");
        // The npm package is a wrapper whose postinstall puts the native build for this
        // platform in place: without one (another platform, or install scripts not run), it
        // cannot run here.
        let runs = Command::new(&claude)
            .arg("--version")
            .env_clear()
            .output()
            .is_ok_and(|o| o.status.success());
        if !runs {
            common::skipped(&format!(
                "{} --version fails: no Claude Code build for this platform, or its \
                 postinstall did not run (npm ci --prefix tests/peers)",
                claude.display()
            ));
            return None;
        }
        let Some(node) = common::peers::on_path(&common::peers::node()) else {
            panic!("Node.js is not on PATH (the npm peers need it)");
        };
        let server =
            peers_dir().join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
        assert!(server.is_file(), "{} is missing", server.display());
        let (tmp, dir) = common::tempdir();
        let project = dir.join("project");
        let shared = dir.join("shared");
        for d in [&project, &shared] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("notes.txt"), "notes").unwrap();
        }
        Some(World {
            _tmp: tmp,
            dir,
            claude,
            node,
            server,
            project,
            shared,
        })
    }

    /// A managed server entry: `fsbroker proxy [--confine] --root ROOT -- node SERVER ROOT`,
    /// every program by absolute path.
    fn proxy(&self, confine: bool, root: &str) -> Vec<String> {
        let mut v = vec![bin().to_owned(), "proxy".to_owned()];
        if confine {
            v.push("--confine".to_owned());
        }
        v.extend(["--root".to_owned(), root.to_owned(), "--".to_owned()]);
        v.push(self.node.to_string_lossy().into_owned());
        v.push(self.server.to_string_lossy().into_owned());
        v.push(root.to_owned());
        v
    }

    /// Writes `/etc/claude-code/managed-mcp.json`'s text, the servers `name → command line`,
    /// in the format of Claude Code's docs (a project `.mcp.json`'s), each with
    /// `RUST_LOG=fsbroker=info` so that the broker says on stderr how it confined the server.
    fn managed_mcp(&self, servers: &[(&str, &[String])]) -> PathBuf {
        let mut map = serde_json::Map::new();
        for (name, line) in servers {
            map.insert(
                (*name).to_owned(),
                json!({
                    "type": "stdio",
                    "command": line[0],
                    "args": line[1..],
                    "env": {"RUST_LOG": "fsbroker=info"},
                }),
            );
        }
        let path = self.dir.join("managed-mcp.json");
        let text = serde_json::to_string_pretty(&json!({ "mcpServers": map })).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `/etc/fsbroker/managed.toml`'s text.
    fn managed_toml(&self, text: &str) -> PathBuf {
        let path = self.dir.join("managed.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A fresh, empty home for the person (no login, no settings).
    fn home(&self, name: &str) -> PathBuf {
        let home = self.dir.join(name);
        std::fs::create_dir(&home).unwrap();
        home
    }

    /// Runs `claude ARGS` in the project folder with `home` as `HOME`, under a private `/etc`
    /// holding `mcp` and `managed` (when given), with no network: its output.
    fn claude(
        &self,
        home: &Path,
        mcp: Option<&Path>,
        managed: Option<&Path>,
        args: &[&str],
    ) -> Output {
        let scratch = self.dir.join(format!("etc-{}", serial()));
        std::fs::create_dir(&scratch).unwrap();
        let arg = |p: Option<&Path>| p.map_or("-".into(), |p| p.as_os_str().to_owned());
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--net",
            "--pid",
            "--fork",
            "sh",
            "-c",
            PRIVATE_ETC,
            "sh",
        ])
        .arg(&scratch)
        .arg(arg(mcp))
        .arg(arg(managed))
        .arg(&self.claude)
        .args(args)
        .current_dir(&self.project)
        // Nothing of the person running the tests reaches Claude Code: its whole environment
        // is this. CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC turns off its updater, telemetry
        // and error reports (Claude Code's docs, "Environment variables"); the network
        // namespace would refuse them anyway.
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", home)
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
        output_within(&mut cmd, LIMIT)
    }

    /// `claude mcp list`'s standard output (it must succeed, whatever its servers do).
    fn list(&self, home: &Path, mcp: Option<&Path>, managed: Option<&Path>) -> String {
        let out = self.claude(home, mcp, managed, &["mcp", "list"]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "claude mcp list failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("claude mcp list:\n{stdout}");
        stdout
    }
}

/// The line `claude mcp list` prints for the server `name` started by `line`, ending `state`.
fn listed(name: &str, line: &[String], state: &str) -> String {
    format!("{name}: {}{state}", line.join(" "))
}

fn assert_line(stdout: &str, want: &str) {
    assert!(
        stdout.lines().any(|l| l == want),
        "claude mcp list does not print {want:?}:\n{stdout}"
    );
}

/// Everything Claude Code logged of the server `name` (its `mcp-logs-NAME` files: each
/// connection's steps and the server's stderr), as one text.
fn server_log(home: &Path, name: &str) -> String {
    let mut text = String::new();
    let mut stack = vec![home.join(".cache/claude-cli-nodejs")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if dir
                .file_name()
                .is_some_and(|n| *n == *format!("mcp-logs-{name}"))
            {
                text.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    text
}

/// The absolute path of `program` on `PATH` (or `program` itself when it has a slash).
fn serial() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

#[test]
fn claude_code_shows_its_managed_servers_connected_through_fsbroker_proxy_confine() {
    let Some(w) = World::new() else { return };
    let home = w.home("home");

    // The person's own server, added the ordinary way before the administrator deploys
    // anything, and listed: the check below that it is gone can fail.
    let out = w.claude(
        &home,
        None,
        None,
        &["mcp", "add", "mine", "--", "/bin/true"],
    );
    assert!(
        out.status.success(),
        "claude mcp add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = w.list(&home, None, None);
    assert!(
        before.lines().any(|l| l.starts_with("mine: /bin/true")),
        "{before}"
    );

    // The administrator's files: two servers, each behind `fsbroker proxy --confine`, one
    // given a folder by absolute path, the other the folder `claude` starts in (`.`); and a
    // managed policy that refuses any server run unconfined.
    let shared = w.proxy(true, w.shared.to_str().unwrap());
    let project = w.proxy(true, ".");
    let mcp = w.managed_mcp(&[("files", &shared), ("project", &project)]);
    let managed = w.managed_toml(REQUIRE_CONFINEMENT);

    let after = w.list(&home, Some(&mcp), Some(&managed));
    assert_line(&after, &listed("files", &shared, CONNECTED));
    assert_line(&after, &listed("project", &project, CONNECTED));
    // Exclusive: the person's own server is no longer listed (nor started), and they cannot
    // add another.
    assert!(!after.contains("mine:"), "{after}");
    let out = w.claude(
        &home,
        Some(&mcp),
        Some(&managed),
        &["mcp", "add", "other", "--", "/bin/true"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "claude mcp add succeeded: {err}");
    assert!(
        err.contains("enterprise MCP configuration is active and has exclusive control"),
        "{err}"
    );
    // Nor pass their own for one run.
    let own_path = w.dir.join("own.json");
    let own = json!({"mcpServers": {"own": {"type": "stdio", "command": "/bin/true"}}});
    std::fs::write(&own_path, own.to_string()).unwrap();
    let out = w.claude(
        &home,
        Some(&mcp),
        Some(&managed),
        &["--mcp-config", own_path.to_str().unwrap(), "-p", "hello"],
    );
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "claude --mcp-config ran: {said}");
    assert!(
        said.contains(
            "You cannot dynamically configure MCP servers when an enterprise MCP config is present"
        ),
        "{said}"
    );
    // Each server was started by fsbroker, confined: the broker's stderr, which Claude Code
    // logs as the server's, says so, and Claude Code recorded the connection.
    for name in ["files", "project"] {
        let log = server_log(&home, name);
        assert!(
            log.contains("confining the server (Landlock ABI")
                && log.contains("Successfully connected"),
            "{name}: Claude Code's log of the server:\n{log}"
        );
    }
}

#[test]
fn a_managed_server_without_confine_is_refused_by_the_managed_policy_and_not_connected() {
    let Some(w) = World::new() else { return };
    let unconfined = w.proxy(false, w.shared.to_str().unwrap());
    let mcp = w.managed_mcp(&[("files", &unconfined)]);

    // Without a managed policy, the same line connects: what fails below is the rule.
    let home = w.home("home-free");
    let out = w.list(&home, Some(&mcp), None);
    assert_line(&out, &listed("files", &unconfined, CONNECTED));

    // With `[confine] required`, fsbroker refuses to start the server, and says why to
    // Claude Code's `initialize` and on stderr (both in Claude Code's log of the server).
    let home = w.home("home-managed");
    let managed = w.managed_toml(REQUIRE_CONFINEMENT);
    let out = w.list(&home, Some(&mcp), Some(&managed));
    assert_line(&out, &listed("files", &unconfined, FAILED));
    let log = server_log(&home, "files");
    assert!(
        log.contains(
            "refused by the managed policy /etc/fsbroker/managed.toml, [confine] required"
        ) && log.contains("would run it unconfined"),
        "Claude Code's log of the server does not show fsbroker's refusal:\n{log}"
    );
}

//! Tests against real MCP peers (issue 7, PROTOCOL.md §1.2): `fsbroker proxy` between hosts
//! and servers made with the official TypeScript SDK, and the reference filesystem server.
//!
//! The peers are npm packages pinned in `tests/peers/package.json` and its lockfile. When
//! they are missing the tests install them themselves, once (`npm ci --prefix tests/peers`,
//! under a lock); without Node.js and npm they fail, saying so: they are never skipped.
//!
//! - `host_fs.mjs`: an SDK `Client` declaring no roots runs
//!   `@modelcontextprotocol/server-filesystem` without directory arguments under the proxy.
//!   The server's `list_allowed_directories` reports exactly the broker's roots, follows
//!   policy edits (a root added, a root removed) through `notifications/roots/list_changed`,
//!   and its `read_text_file` works inside the roots and fails outside.
//! - `host_concurrent.mjs`: an SDK `Client` runs `server_files.mjs`, an SDK server whose tools
//!   call `roots/list` (also in the middle of the handshake) and every `files/*` method on
//!   the client, while the host keeps ~100 of its own requests in flight. Every result is
//!   checked, and the host never receives a brokered request or notification.
//!
//! Each script prints a one-line JSON summary (with the peers' versions) and exits 0, or
//! names what failed on stderr and exits 1. Each has its own 55 s watchdog; this side kills
//! it after 90 s in any case. Only loopback pipes: no network.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Hard limit for one script, beyond its own watchdog.
const LIMIT: Duration = Duration::from_secs(90);

fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers")
}

/// The Node.js binary: `$NODE`, else `node` on the PATH.
fn node() -> String {
    std::env::var("NODE").unwrap_or_else(|_| "node".to_owned())
}

const PACKAGES: [&str; 3] = [
    "@modelcontextprotocol/sdk",
    "@modelcontextprotocol/server-filesystem",
    "zod",
];

fn installed() -> bool {
    let modules = peers_dir().join("node_modules");
    PACKAGES
        .iter()
        .all(|p| modules.join(p).join("package.json").is_file())
}

/// Makes sure the npm peers are installed: when they are not, installs them once, exactly as
/// pinned (`npm ci --prefix tests/peers`), under a file lock so that tests starting at the
/// same moment (in this binary or another) install them once and wait for each other. Fails
/// (never skips) when they cannot be installed, naming the tool that is missing.
fn require_peers() {
    if installed() {
        return;
    }
    let lock_path = peers_dir().join(".install.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", lock_path.display()));
    // flock locks belong to the open file, so two tests of one binary exclude each other too.
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    if installed() {
        return;
    }
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
    assert!(
        installed(),
        "npm ci ran but the MCP peers are still missing"
    );
}

/// Runs `node tests/peers/SCRIPT` against this build's `fsbroker`, in a fresh scratch
/// directory; asserts exit 0 and returns the JSON summary line.
fn run_peer(script: &str) -> Value {
    require_peers();
    let scratch = tempfile::tempdir().expect("tempdir");
    let dir = peers_dir();
    let started = Instant::now();
    let mut child = Command::new(node())
        .arg(dir.join(script))
        .current_dir(&dir)
        .env("FSBROKER_BIN", env!("CARGO_BIN_EXE_fsbroker"))
        .env("PEERS_TMPDIR", scratch.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{} {script}`: {e} (Node.js 20 or newer is needed; set NODE to its path)",
                node()
            )
        });
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
        if let Some(status) = child.try_wait().expect("wait for node") {
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
    println!("--- {script}: stdout ---\n{stdout}");
    println!("--- {script}: stderr (servers' and proxy's logs) ---\n{stderr}");
    println!("--- {script}: {status:?} after {elapsed:?} ---");
    let status = status.unwrap_or_else(|| panic!("{script} ran longer than {LIMIT:?}; killed"));
    assert!(
        status.success(),
        "{script} failed ({status}):\n{}",
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
        .unwrap_or_else(|| panic!("{script} printed no JSON summary"));
    assert_eq!(summary["ok"], true, "{script}: {summary}");
    summary
}

#[test]
fn reference_filesystem_server_follows_the_brokers_roots() {
    let s = run_peer("host_fs.mjs");
    assert_eq!(s["test"], "host_fs");
    assert_eq!(s["readTool"], "read_text_file");
    assert_eq!(s["initial"]["dirs"].as_array().map(Vec::len), Some(1));
    assert_eq!(s["added"]["dirs"].as_array().map(Vec::len), Some(2));
    assert_eq!(s["removed"]["dirs"].as_array().map(Vec::len), Some(1));
    assert_eq!(s["proxyExit"]["code"], 0);
    println!("peers tested: {}", s["versions"]);
}

#[test]
fn sdk_server_calls_every_files_method_while_the_host_is_busy() {
    let s = run_peer("host_concurrent.mjs");
    assert_eq!(s["test"], "host_concurrent");
    assert!(
        s["maxInFlight"].as_u64().unwrap_or(0) >= 50,
        "the host should have had many requests in flight at once: {s}"
    );
    assert_eq!(s["proxyExit"]["code"], 0);
    println!("peers tested: {}", s["versions"]);
}

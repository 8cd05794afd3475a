//! The tests' kit (docs/testing.md says what is where): the real `fsbroker` binary driven
//! over real pipes and sockets ([`fsb`]), or the library in process ([`memory`]), on real
//! temporary directories.

#![allow(dead_code)] // each test file uses its own part of this helper

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

pub mod audit;
pub mod confine;
pub mod console;
pub mod fsb;
pub mod hostile;
pub mod http;
#[path = "../../benches/kit/mod.rs"]
pub mod kit;
pub mod memory;
pub mod peers;
pub mod policy;
pub mod procs;
pub mod registry;
pub mod remote;
pub mod stuck;

#[allow(unused_imports)] // each test file uses its own part
pub use fsb::{Fsb, Listener};
pub use policy::{PolicyToml, RootToml};
#[allow(unused_imports)]
pub use procs::proc_status_kib;

/// The `fsbroker` binary Cargo built for these tests, or the one `FSBROKER_TEST_BIN` names
/// (to show that a new test fails on an earlier build: docs/testing.md).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("FSBROKER_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fsbroker").to_owned())
    })
}

/// `error.data.code` (the contract's string code), or the JSON-RPC number as a string for
/// protocol errors that have none.
pub fn code(error: &Value) -> String {
    match error["data"]["code"].as_str() {
        Some(s) => s.to_owned(),
        None => error["code"].to_string(),
    }
}

/// A test that cannot run here (a tool `.ci/run` installs is missing, or the machine cannot
/// do what it needs) says so, `SKIPPED: why`, and ends as passed; with
/// `FSBROKER_TEST_STRICT=1`, which `.ci/run` sets, it fails instead, so that CI shows every
/// such test ran.
pub fn skipped(why: &str) {
    eprintln!("SKIPPED: {why}");
    assert!(
        std::env::var_os("FSBROKER_TEST_STRICT").is_none_or(|v| v != "1"),
        "SKIPPED under FSBROKER_TEST_STRICT=1 (a skipped test fails in CI): {why}"
    );
}

/// A temp directory with its canonical path (macOS-style `/tmp` symlinks resolved).
pub fn tempdir() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let p = t.path().canonicalize().expect("canonicalize");
    (t, p)
}

/// Runs `f` on its own thread and returns its result; if it has not finished within `limit`,
/// calls `on_timeout` (which may unblock it, e.g. by opening a FIFO's other end) and panics,
/// so a broker that blocks fails the test instead of hanging it. A panic in `f` is passed on.
pub fn with_deadline<T: Send + 'static>(
    limit: std::time::Duration,
    on_timeout: impl FnOnce(),
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => {
            let _ = worker.join();
            value
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("worker ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            on_timeout();
            panic!("did not finish within {limit:?}: a request blocked");
        }
    }
}

/// Serves `root` as the root `r` (consent auto) through a policy file; `root_extra` goes into
/// the `[[root]]` table, `limits` into `[limits]`. The returned temp dir holds the policy.
pub fn serve_policy(root: &Path, root_extra: &str, limits: &str) -> (tempfile::TempDir, Fsb) {
    let (t, dir) = tempdir();
    let policy = write_policy(&dir, root, root_extra, limits);
    let b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    (t, b)
}

/// Writes `dir/policy.toml` serving `root` as the root `r` (consent auto); `root_extra` goes
/// into the `[[root]]` table, `limits` into `[limits]`. Returns the file's path.
pub fn write_policy(dir: &Path, root: &Path, root_extra: &str, limits: &str) -> std::path::PathBuf {
    PolicyToml::new()
        .root(RootToml::at(root).name("r").extra(root_extra))
        .table("limits", limits)
        .write_to(&dir.join("policy.toml"))
}

/// Percent-encodes a path for a `file://` URI: everything but unreserved characters and `/`.
pub fn uri_path(p: &Path) -> String {
    let mut s = String::new();
    for &byte in p.to_str().unwrap().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            s.push(byte as char);
        } else {
            s.push_str(&format!("%{byte:02X}"));
        }
    }
    s
}

/// One request line (`\n`-terminated) with the given id, for pipelining.
pub fn request_line(id: u64, method: &str, params: Value) -> Vec<u8> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut line = serde_json::to_vec(&msg).unwrap();
    line.push(b'\n');
    line
}

/// The real python interpreter (not a version-manager shim, so a kill reaches python itself).
pub fn python() -> &'static str {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .stderr(Stdio::inherit())
            .output()
            .expect("python3 is needed by these tests");
        assert!(out.status.success(), "python3 failed");
        let exe = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(!exe.is_empty(), "python3 did not name its executable");
        exe
    })
}

/// The value of the first header named `name` among `headers` (names lower-cased).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A path as text (temp paths are UTF-8).
pub fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// A TOML literal string holding `p` (temp paths hold no `'`).
pub fn lit(p: &Path) -> String {
    let s = path_str(p);
    assert!(!s.contains('\''), "temp path unusable in a TOML literal");
    format!("'{s}'")
}

/// Everything beneath `dir`, never following a symlink: relative path → `dir`,
/// `file:CONTENT` or `link:TARGET`.
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path_str(path.strip_prefix(base).unwrap());
            let ft = entry.file_type().unwrap();
            if ft.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, format!("link:{}", target.display()));
            } else if ft.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &path, out);
            } else {
                let content = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                out.insert(rel, format!("file:{content}"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `len` bytes of xorshift32 from `seed` (not 0): neither all one value nor periodic at any
/// chunk size the tests use.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    assert_ne!(seed, 0, "xorshift from 0 stays 0");
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

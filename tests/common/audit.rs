//! The audit tests' shared kit: a root and a policy with an `[audit]` table, the log's lines,
//! and `fsbroker audit verify` over one log or a rolled log's files.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::{bin, tempdir, write_policy};

/// A path as `&str` (the tests' paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A temp dir holding a root `root` (with `root_extra` in its policy table, e.g.
/// `mode = "read-write"`) that holds `f.txt`, and a policy whose `[audit]` table is
/// `path = "audit.jsonl"` then `audit`. Returns (temp dir, its path, the policy, the log).
pub fn audited(root_extra: &str, audit: &str) -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "hello").unwrap();
    let policy = write_policy(&dir, &root, root_extra, "");
    let mut text = std::fs::read_to_string(&policy).unwrap();
    text += &format!("\n[audit]\npath = \"audit.jsonl\"\n{audit}\n");
    std::fs::write(&policy, text).unwrap();
    let log = dir.join("audit.jsonl");
    (t, dir, policy, log)
}

/// The log's lines, as written.
pub fn log_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every line of `files`, in order, as JSON.
pub fn lines_of(files: &[PathBuf]) -> Vec<Value> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `fsbroker audit verify FILES... EXTRA...`: (exit code, stdout + stderr).
pub fn verify_files<F: AsRef<OsStr>>(files: &[F], extra: &[&str]) -> (i32, String) {
    let out = Command::new(bin())
        .args(["audit", "verify"])
        .args(files)
        .args(extra)
        .output()
        .expect("run fsbroker audit verify");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

//! The crate as a host embeds it: without its command line, and through `docs/examples/embed.rs`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The command-line-only dependencies a host that turns off default features must not get.
const CLI_ONLY: [&str; 5] = [
    "clap",
    "clap_complete",
    "clap_mangen",
    "indicatif",
    "tracing-subscriber",
];

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

/// The names of the packages in the library's normal dependency tree, given `features`.
fn dependency_names(features: &[&str]) -> Vec<String> {
    let out = cargo()
        .args([
            "tree",
            "--locked",
            "--offline",
            "--edges",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--format", "{p}"])
        .args(features)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Rule: `fsbroker = { default-features = false }` pulls in none of the command line's crates,
/// and the default build does (so the check above can fail).
#[test]
fn the_library_without_default_features_has_no_command_line_crates() {
    let lean = dependency_names(&["--no-default-features"]);
    assert!(lean.iter().any(|n| n == "cap-std"), "{lean:?}");
    for name in CLI_ONLY {
        assert!(
            !lean.iter().any(|n| n == name),
            "{name} is in the lean tree"
        );
    }
    let full = dependency_names(&[]);
    for name in CLI_ONLY {
        assert!(full.iter().any(|n| n == name), "{name} missing by default");
    }
}

/// Rule: the library builds without its default features (a host's `default-features = false`).
#[test]
fn the_library_builds_without_default_features() {
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/lean");
    let out = cargo()
        .args([
            "check",
            "--locked",
            "--offline",
            "--lib",
            "--no-default-features",
        ])
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo check --no-default-features --lib failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `target/PROFILE/examples/NAME`: built by `cargo test` beside this test, or here when only
/// this test was built (`cargo test --test library`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/PROFILE/deps/library-HASH → target/PROFILE
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let mut build = cargo();
        build
            .args(["build", "--locked", "--offline", "--example", name])
            .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap());
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let out = build.output().expect("cargo runs");
        assert!(
            out.status.success(),
            "cannot build the example {name}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

/// `docs/examples/embed.rs` does what its comments say: lists the root, reads a file, refuses a
/// path outside the root, and reports a change through a watch.
#[test]
fn the_embedding_example_runs() {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("a.txt"), "alpha\n").unwrap();
    let out = Command::new(example("embed"))
        .arg(t.path())
        .output()
        .expect("the example runs (cargo test builds it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("<- "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_id = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .unwrap_or_else(|| panic!("no answer {id}: {text}"))
    };
    assert_eq!(by_id(1)["result"]["roots"].as_array().unwrap().len(), 1);
    assert_eq!(by_id(3)["result"]["content"], "alpha\n", "{text}");
    assert!(by_id(4)["error"].is_object(), "outside the root: {text}");
    assert!(
        answers
            .iter()
            .any(|a| a["method"] == "notifications/files/changed"),
        "a change was reported: {text}"
    );
}

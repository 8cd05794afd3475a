//! `fsbroker bench`: short runs whose JSON parses and whose numbers are all positive and
//! finite. No timing thresholds: speed is measured on release builds (docs/benchmarks.md),
//! not asserted in tests.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fsbroker")
}

fn run(args: &[&str], path_env: Option<&Path>) -> Output {
    let mut cmd = Command::new(bin());
    cmd.arg("bench").args(args);
    if let Some(p) = path_env {
        cmd.env("PATH", p);
    }
    let out = cmd.output().expect("run fsbroker bench");
    assert!(
        out.status.success(),
        "fsbroker bench {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn bench_json(args: &[&str]) -> Value {
    let out = run(args, None);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn positive(report: &Value, pointer: &str) -> f64 {
    let x = report
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer} in {report:#}"));
    assert!(x.is_finite() && x > 0.0, "{pointer} = {x}");
    x
}

/// Every throughput, ops and latency figure of a full run.
fn all_positive(report: &Value, size: u64) {
    for phase in ["/read", "/upload"] {
        for key in ["bytes", "seconds", "mb_per_s", "gb_per_s", "requests"] {
            positive(report, &format!("{phase}/{key}"));
        }
        assert_eq!(
            report.pointer(&format!("{phase}/bytes")),
            Some(&size.into())
        );
    }
    positive(report, "/upload/last_chunk_seconds");
    for kind in ["read_1k", "list"] {
        for mode in ["sequential", "pipelined"] {
            for key in ["ops", "seconds", "ops_per_s", "p50_us", "p99_us"] {
                positive(report, &format!("/small/{kind}/{mode}/{key}"));
            }
        }
    }
    for key in [
        "peak_bytes",
        "idle_bytes",
        "after_read_bytes",
        "after_upload_bytes",
    ] {
        positive(report, &format!("/memory/{key}"));
    }
    assert_eq!(report["memory"]["exit"], "exit status: 0", "{report:#}");
}

/// The workspace (and the file the bench made in it) is gone after the run.
fn workspace_removed(report: &Value) {
    let file = Path::new(report["file"]["path"].as_str().expect("file path"));
    let workspace = file.parent().and_then(Path::parent).expect("workspace");
    assert!(
        workspace
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("fsbroker-bench-")),
        "{}",
        workspace.display()
    );
    assert!(!workspace.exists(), "{} was left", workspace.display());
}

#[test]
fn quick_json_run_has_positive_numbers() {
    // --quick, with sizes a debug build gets through in a few seconds.
    let report = bench_json(&[
        "--quick",
        "--json",
        "--size",
        "6MiB",
        "--chunk-size",
        "512KiB",
        "--small-ops",
        "300",
    ]);
    all_positive(&report, 6 << 20);
    assert_eq!(report["settings"]["encoding"], "base64");
    assert_eq!(report["settings"]["verify"], "sampled");
    assert_eq!(report["read"]["requests"], 12);
    assert_eq!(report["read"]["chunks_base64"], 12);
    assert_eq!(report["small"]["depth"], 64);
    assert!(report.get("sftp").is_none(), "{report:#}");
    assert_eq!(report["file"]["generated"], true);
    workspace_removed(&report);
}

#[test]
fn utf8_run_checks_every_byte_through_a_broker_command() {
    let command = format!("'{}' serve --policy {{policy}}", bin());
    let report = bench_json(&[
        "--json",
        "--size",
        "3MiB",
        "--chunk-size",
        "256KiB",
        "--encoding",
        "utf-8",
        "--verify",
        "--depth",
        "3",
        "--small-ops",
        "100",
        "--small-depth",
        "8",
        "--broker-cmd",
        &command,
    ]);
    all_positive(&report, 3 << 20);
    assert_eq!(report["settings"]["verify"], "sha256");
    assert_eq!(report["read"]["chunks_base64"], 0, "{report:#}");
    assert_eq!(report["read"]["chunks_utf8"], 12);
    assert!(
        report["broker"]
            .as_str()
            .is_some_and(|b| b.contains("policy.toml")),
        "{report:#}"
    );
    workspace_removed(&report);
}

#[test]
fn table_says_when_sftp_is_missing() {
    // An empty PATH: no sftp, whatever this machine has installed.
    let empty = tempfile::tempdir().unwrap();
    let out = run(
        &[
            "--size",
            "1MiB",
            "--chunk-size",
            "256KiB",
            "--only",
            "read",
            "--compare-sftp",
        ],
        Some(empty.path()),
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "fsbroker files/read",
        "MB/s",
        "GB/s",
        "VmHWM",
        "sftp not installed; install openssh-client and openssh-sftp-server",
    ] {
        assert!(table.contains(needle), "no {needle:?} in:\n{table}");
    }
    assert!(!table.contains("upload"), "{table}");
}

#[test]
fn chunks_over_16_mib_are_refused() {
    let out = Command::new(bin())
        .args(["bench", "--chunk-size", "17MiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("16MiB"), "{err}");
    let out = Command::new(bin())
        .args(["bench", "--size", "12 parsecs"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

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
        "--watch-samples",
        "5",
        "--list-entries",
        "1500",
    ]);
    all_positive(&report, 6 << 20);
    // Every phase ran, the watch and list ones included.
    assert_eq!(report["watch"]["samples"], 5, "{report:#}");
    assert_eq!(report["list"]["entries"], 1500, "{report:#}");
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

/// The Node.js binary: `$NODE`, else `node` on the PATH (as in tests/peers.rs).
fn node() -> String {
    std::env::var("NODE").unwrap_or_else(|_| "node".to_owned())
}

/// A shell command starting tests/peers/tiny_fs_server.mjs (plain Node.js, no packages).
fn tiny_server(args: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/tiny_fs_server.mjs");
    format!("'{}' '{}' {args}", node(), script.display())
}

#[test]
fn other_mcp_servers_are_measured() {
    // The same server twice: `{dir}` replaced, then `{dir}` appended.
    let with_dir = tiny_server("{dir}");
    let appended = tiny_server("");
    let report = bench_json(&[
        "--quick",
        "--json",
        "--only",
        "small,mcp",
        "--small-ops",
        "200",
        "--mcp-size",
        "1MiB",
        "--compare-mcp",
        &with_dir,
        "--compare-mcp",
        &appended,
    ]);
    let servers = report["mcp"].as_array().expect("an mcp array");
    assert_eq!(servers.len(), 2, "{report:#}");
    for (i, given) in [&with_dir, &appended].into_iter().enumerate() {
        let s = &servers[i];
        assert!(s.get("error").is_none(), "{s:#}");
        assert_eq!(s["command"], given.as_str());
        assert_eq!(s["name"], "tiny-fs-server");
        assert_eq!(s["server_info"]["name"], "tiny-fs-server");
        assert_eq!(s["server_info"]["version"], "1.0.0");
        assert_eq!(s["protocol_version"], "2025-06-18");
        let launched = s["launched"].as_str().unwrap();
        assert!(launched.ends_with("/data'"), "{launched}");
        assert!(!launched.contains("{dir}"), "{launched}");
        for key in ["ops", "seconds", "ops_per_sec", "p50_ms", "p99_ms"] {
            positive(&report, &format!("/mcp/{i}/small/{key}"));
        }
        assert_eq!(s["small"]["ops"], 200);
        for key in ["bytes", "seconds", "mb_per_sec", "vm_hwm_mib"] {
            positive(&report, &format!("/mcp/{i}/large/{key}"));
        }
        assert_eq!(s["large"]["bytes"], 1 << 20);
        positive(&report, &format!("/mcp/{i}/ratio"));
    }
    positive(&report, "/small/read_1k/sequential/ops_per_s");
    assert!(report.get("read").is_none() && report.get("upload").is_none());
}

#[test]
fn a_failing_mcp_server_is_reported_and_the_run_goes_on() {
    let text_only = tiny_server("--text-only {dir}");
    let report = bench_json(&[
        "--json",
        "--only",
        "small,mcp",
        "--small-ops",
        "50",
        "--mcp-size",
        "64KiB",
        "--compare-mcp",
        "/nonexistent/mcp-server --flag",
        "--compare-mcp",
        &text_only,
    ]);
    let missing = &report["mcp"][0];
    let error = missing["error"].as_str().expect("an error");
    assert!(
        error.contains("/nonexistent/mcp-server") && error.contains("127"),
        "{error}"
    );
    assert_eq!(missing["name"], "mcp-server");
    assert!(missing.get("small").is_none() && missing.get("large").is_none());
    // What the text-only server could do is kept; the missing tool is the error.
    let partial = &report["mcp"][1];
    positive(&report, "/mcp/1/small/ops_per_sec");
    assert!(partial.get("large").is_none(), "{partial:#}");
    let error = partial["error"].as_str().expect("an error");
    assert!(
        error.contains("no read_media_file tool") && error.contains("read_text_file"),
        "{error}"
    );
    positive(&report, "/small/read_1k/sequential/ops_per_s");

    // The table says the same.
    let out = run(
        &[
            "--only",
            "small,mcp",
            "--small-ops",
            "20",
            "--compare-mcp",
            "/nonexistent/mcp-server",
        ],
        None,
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for needle in ["other MCP servers", "mcp-server", "error:", "not found"] {
        assert!(table.contains(needle), "no {needle:?} in:\n{table}");
    }
}

#[test]
fn a_failing_mcp_server_alone_fails_the_run() {
    let out = Command::new(bin())
        .args([
            "bench",
            "--only",
            "mcp",
            "--small-ops",
            "10",
            "--compare-mcp",
            "/nonexistent/mcp-server",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no MCP server could be measured"), "{err}");
    assert!(err.contains("/nonexistent/mcp-server"), "{err}");
    // And the mcp phase needs a server, and a server needs the mcp phase.
    for args in [
        &["bench", "--only", "mcp"][..],
        &["bench", "--only", "small", "--compare-mcp", "x"][..],
    ] {
        let out = Command::new(bin()).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--compare-mcp"), "{err}");
    }
}

/// `--only watch,list`: each change is reported (nothing missed, the coalescing window is the
/// floor), and the recursive listing of a tree larger than one page (10,000 entries) finds
/// every entry, compared with `find` on the same tree.
#[test]
fn watch_and_list_phases_measure_what_they_say() {
    let report = bench_json(&[
        "--only",
        "watch,list",
        "--json",
        "--watch-samples",
        "8",
        "--list-entries",
        "12000",
    ]);
    assert_eq!(report["watch"]["samples"], 8, "{report:#}");
    assert_eq!(report["watch"]["missed"], 0, "{report:#}");
    let p50 = positive(&report, "/watch/p50_ms");
    assert!(p50 >= 40.0, "below the coalescing window: {p50}");
    assert!(positive(&report, "/watch/p99_ms") >= p50);
    assert_eq!(report["list"]["entries"], 12000, "{report:#}");
    positive(&report, "/list/seconds");
    positive(&report, "/list/find_seconds");
    positive(&report, "/list/ratio_to_find");
    positive(&report, "/list/ratio_to_find_stat");
    assert!(report.get("read").is_none() && report.get("small").is_none());
    let table = run(
        &[
            "--only",
            "watch,list",
            "--watch-samples",
            "2",
            "--list-entries",
            "50",
        ],
        None,
    );
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("change → notification") && text.contains("vs find"),
        "{text}"
    );
}

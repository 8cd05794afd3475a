//! `fsbroker bench`: short runs whose JSON parses and whose numbers are all positive and
//! finite. No timing thresholds: speed is measured on release builds (docs/benchmarks.md),
//! not asserted in tests.
//!
//! One file though long: each test is one `fsbroker bench` option checked on the same JSON
//! shape.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

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

/// The reads and the upload of `transfers[i]`, at `chunk` bytes per request, moved `size`
/// bytes at a positive rate.
fn transfer_positive(report: &Value, i: usize, chunk: u64, size: u64) {
    assert_eq!(
        report.pointer(&format!("/transfers/{i}/chunk_size")),
        Some(&chunk.into()),
        "{report:#}"
    );
    for phase in ["read", "upload"] {
        let at = format!("/transfers/{i}/{phase}");
        for key in ["bytes", "seconds", "mb_per_s", "gb_per_s", "requests"] {
            positive(report, &format!("{at}/{key}"));
        }
        assert_eq!(report.pointer(&format!("{at}/bytes")), Some(&size.into()));
    }
    assert_eq!(
        report.pointer(&format!("/transfers/{i}/read/requests")),
        Some(&size.div_ceil(chunk).into())
    );
    positive(report, &format!("/transfers/{i}/upload/last_chunk_seconds"));
}

/// Every throughput, ops and latency figure of a full run at one chunk size.
fn all_positive(report: &Value, chunk: u64, size: u64) {
    let transfers = report["transfers"].as_array().expect("a transfers array");
    assert_eq!(transfers.len(), 1, "{report:#}");
    transfer_positive(report, 0, chunk, size);
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
    all_positive(&report, 512 << 10, 6 << 20);
    // Every phase ran, the watch and list ones included.
    assert_eq!(report["watch"]["samples"], 5, "{report:#}");
    assert_eq!(report["list"]["entries"], 1500, "{report:#}");
    assert_eq!(report["settings"]["encoding"], "base64");
    assert_eq!(report["settings"]["verify"], "sampled");
    assert_eq!(report["settings"]["depth"], 8);
    assert_eq!(
        report["settings"]["chunk_sizes"],
        serde_json::json!([512 << 10])
    );
    assert_eq!(report["transfers"][0]["read"]["chunks_base64"], 12);
    assert_eq!(report["small"]["depth"], 64);
    assert!(report.get("sftp").is_none(), "{report:#}");
    assert!(
        report["transfers"][0].get("sftp_get").is_none(),
        "{report:#}"
    );
    assert_eq!(report["file"]["generated"], true);
    // Without sftp and other MCP servers: the goals with no reference to compare with.
    assert_eq!(
        goal_figures(&report),
        [
            "1 KiB reads, 64 in flight",
            "broker peak memory (VmHWM)",
            "files/watch change → notification p99",
            "recursive files/list (1500 entries) vs find -printf",
        ]
    );
    workspace_removed(&report);
}

/// The `figure` of each entry of `goals`, checking each entry's shape on the way.
fn goal_figures(report: &Value) -> Vec<String> {
    let goals = report["goals"].as_array().expect("a goals array");
    goals
        .iter()
        .map(|g| {
            for key in ["figure", "measured", "goal"] {
                assert!(
                    g[key].as_str().is_some_and(|s| !s.is_empty()),
                    "{key} in {g:#}"
                );
            }
            assert!(g["met"].is_boolean(), "{g:#}");
            g["figure"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// Two chunk sizes in one run: one `transfers` entry each, in the order given; with
/// `--compare-sftp` (where sftp is installed) each has sftp's figures, its ratios and its
/// goals.
#[test]
fn several_chunk_sizes_in_one_run() {
    let mut args = vec![
        "--json",
        "--size",
        "2MiB",
        "--chunk-size",
        "256KiB,1MiB",
        "--chunk-size",
        "256KiB",
        "--small-ops",
        "50",
        "--only",
        "read,upload",
    ];
    let chunks = [256 << 10, 1 << 20];
    let report = bench_json(&args);
    assert_eq!(report["settings"]["chunk_sizes"], serde_json::json!(chunks));
    assert_eq!(
        report["transfers"].as_array().map(Vec::len),
        Some(2),
        "{report:#}"
    );
    for (i, chunk) in chunks.into_iter().enumerate() {
        transfer_positive(&report, i, chunk, 2 << 20);
    }
    positive(&report, "/memory/after_read_bytes");
    positive(&report, "/memory/after_upload_bytes");
    let figures = goal_figures(&report);
    assert!(
        !figures
            .iter()
            .any(|f| f.starts_with("read") || f.starts_with("upload")),
        "{figures:?}"
    );

    args.push("--compare-sftp");
    let report = bench_json(&args);
    if report["sftp"]["available"] != true {
        eprintln!(
            "note: sftp not compared here ({}); the --compare-sftp part is skipped",
            report["sftp"]["note"]
        );
        return;
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        transfer_positive(&report, i, chunk, 2 << 20);
        for key in ["sftp_get", "sftp_put", "sftp_put_fsync"] {
            assert_eq!(
                report.pointer(&format!("/transfers/{i}/{key}/bytes")),
                Some(&(2u64 << 20).into()),
                "{report:#}"
            );
            positive(&report, &format!("/transfers/{i}/{key}/mb_per_s"));
        }
        for key in ["read_ratio", "upload_ratio", "upload_ratio_fsync"] {
            positive(&report, &format!("/transfers/{i}/{key}"));
        }
    }
    let goals = report["goals"].as_array().expect("a goals array");
    let transfer_goals: Vec<(&str, &str)> = goals
        .iter()
        .filter(|g| {
            let f = g["figure"].as_str().unwrap_or("");
            f.starts_with("read") || f.starts_with("upload")
        })
        .map(|g| (g["figure"].as_str().unwrap(), g["goal"].as_str().unwrap()))
        .collect();
    assert_eq!(
        transfer_goals,
        [
            ("read 256 KiB vs sftp get", ">= 0.8x"),
            ("read 1 MiB vs sftp get", ">= 1.0x"),
            ("upload 256 KiB vs sftp put -f", ">= 1.0x"),
            ("upload 1 MiB vs sftp put -f", ">= 1.0x"),
        ],
        "{report:#}"
    );
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
    all_positive(&report, 256 << 10, 3 << 20);
    assert_eq!(report["settings"]["verify"], "sha256");
    assert_eq!(
        report["transfers"][0]["read"]["chunks_base64"], 0,
        "{report:#}"
    );
    assert_eq!(report["transfers"][0]["read"]["chunks_utf8"], 12);
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
    // Each of several sizes is checked.
    for sizes in ["1MiB,17MiB", "0,1MiB"] {
        let out = Command::new(bin())
            .args(["bench", "--chunk-size", sizes])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{sizes}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--chunk-size must be between"), "{err}");
    }
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
    assert!(report.get("transfers").is_none(), "{report:#}");
    // One goal per server measured.
    let vs: Vec<String> = goal_figures(&report)
        .into_iter()
        .filter(|f| f.contains(" vs "))
        .collect();
    assert_eq!(
        vs, ["1 KiB reads one at a time vs tiny-fs-server"; 2],
        "{report:#}"
    );
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
    assert!(report.get("transfers").is_none() && report.get("small").is_none());
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

/// `--only integrity`: reads and uploads without and with the broker's SHA-256, in pairs
/// (each hash checked by the bench: a chunk's against the file's chunk, an upload's by the
/// broker before it commits), and `files/checksum` of the whole file checked against the
/// file's; the report names the engine and each pair's rates. `--verify` asks the broker's
/// hashes of every read and upload too.
#[test]
fn integrity_phase_measures_the_hashes_cost() {
    let report = bench_json(&[
        "--only",
        "integrity",
        "--json",
        "--size",
        "3MiB",
        "--chunk-size",
        "256KiB",
    ]);
    let i = &report["integrity"];
    assert!(
        ["sha-ni", "armv8-sha2", "portable"].contains(&i["engine"].as_str().unwrap_or("")),
        "{report:#}"
    );
    assert_eq!(i["bytes"], 3 << 20, "{report:#}");
    for kind in ["reads", "uploads"] {
        let pairs = i[kind].as_array().expect("pairs");
        assert_eq!(pairs.len(), 4, "{report:#}");
        for n in 0..pairs.len() {
            positive(&report, &format!("/integrity/{kind}/{n}/off/mb_per_s"));
            positive(&report, &format!("/integrity/{kind}/{n}/on/mb_per_s"));
            positive(&report, &format!("/integrity/{kind}/{n}/ratio"));
        }
    }
    positive(&report, "/integrity/read_geomean");
    positive(&report, "/integrity/upload_geomean");
    positive(&report, "/integrity/checksum/mb_per_s");
    positive(&report, "/integrity/local_sha256/mb_per_s");
    let figures = goal_figures(&report);
    assert!(
        figures.contains(&"read with sha256 vs without, 256 KiB".to_owned()),
        "{figures:?}"
    );
    let verified = bench_json(&[
        "--only",
        "read,upload",
        "--json",
        "--size",
        "2MiB",
        "--verify",
    ]);
    assert_eq!(verified["settings"]["verify"], "sha256", "{verified:#}");
    assert!(
        verified["settings"]["sha256_engine"].is_string(),
        "{verified:#}"
    );
}

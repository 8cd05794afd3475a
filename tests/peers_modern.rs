//! `fsbroker proxy` between MCP 2026-07-28 peers: hosts and servers made with the TypeScript
//! SDK v2 (`@modelcontextprotocol/client` and `server` 2.4, npm) and the Python SDK (`mcp` 2.3,
//! PyPI), pinned in `tests/peers` and installed by the tests themselves when missing
//! (`tests/common/peers.rs`). The revision has no `initialize` and no server → client
//! requests: a server asks for roots with an `input_required` result, which the proxy answers
//! from the broker. Each script prints a JSON summary and exits 0, or says `PEER TEST FAILED`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;

use common::peers::{node, peers_dir, require_npm, require_python, run_script};

/// A Python host with roots of its own, a Python server asking for roots through
/// `input_required`: the server sees exactly the broker's roots (the host's callback is never
/// called), a policy reload changes the next answer, and a confirmation asked together with
/// roots reaches the host alone while the server gets both answers.
#[test]
fn python_server_and_host_see_the_brokers_roots() {
    let python = require_python();
    let s = run_script(&python, &["modern_host.py", "single"], &[]);
    assert_eq!(s["version"], "2026-07-28");
    assert_eq!(s["hostRootsCalls"], 0);
    assert_eq!(s["elicitations"], 1);
    println!("peers tested: {}", s["versions"]);
}

/// The same with a TypeScript v2 host and server, and the server reading a 50 MiB file through
/// `files/read` chunks on the modern connection (every answer carries `resultType`, which the
/// SDK requires), sha256 checked.
#[test]
fn typescript_server_and_host_see_the_brokers_roots_and_read_50_mib() {
    require_npm();
    let script = peers_dir().join("modern_host.mjs");
    let s = run_script(
        Path::new(&node()),
        &[script.to_str().unwrap()],
        &[("MODERN_SERVER", "ts")],
    );
    assert_eq!(s["version"], "2026-07-28");
    assert_eq!(s["hostRootsCalls"], 0);
    assert_eq!(s["big"]["bytes"], 50 << 20);
    assert_eq!(s["big"]["chunks"], 50);
    println!("peers tested: {}", s["versions"]);
}

/// A TypeScript v2 host with a Python server: the SDKs meet through the proxy.
#[test]
fn typescript_host_with_a_python_server() {
    require_npm();
    let python = require_python();
    let script = peers_dir().join("modern_host.mjs");
    let s = run_script(
        Path::new(&node()),
        &[script.to_str().unwrap()],
        &[
            ("MODERN_SERVER", "py"),
            ("PEERS_PYTHON", python.to_str().unwrap()),
        ],
    );
    assert_eq!(s["hostRootsCalls"], 0);
    assert_eq!(s["elicitations"], 1);
}

/// One shared broker (`serve --listen`), two proxies connected to it at once: a host of the
/// 2025 era and one of the 2026 era, each with the same Python server. Both servers see the
/// broker's roots, each in its own era.
#[test]
fn legacy_and_modern_servers_share_one_broker() {
    let python = require_python();
    let s = run_script(&python, &["modern_host.py", "shared"], &[]);
    assert_eq!(s["modern"]["version"], "2026-07-28");
    assert_ne!(s["legacy"]["version"], "2026-07-28");
    assert_eq!(s["legacy"]["roots"], s["modern"]["roots"]);
}

//! Tests against real MCP peers (docs/protocol.md §1.3 and docs/hosts.md): `fsbroker proxy` between hosts
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
//! - `host_confine.mjs`: the reference server started with `/` under `proxy --confine`
//!   (directly and through `npx` from the local install): the kernel holds it to its roots.
//! - `host_concurrent.mjs`: an SDK `Client` runs `server_files.mjs`, an SDK server whose tools
//!   call `roots/list` (also in the middle of the handshake) and every `files/*` method on
//!   the client, while the host keeps ~100 of its own requests in flight. Every result is
//!   checked, and the host never receives a brokered request or notification.
//!
//! Each script prints a one-line JSON summary (with the peers' versions) and exits 0, or
//! names what failed on stderr and exits 1. Each has its own 55 s watchdog; this side kills
//! it after 90 s in any case. Only loopback pipes: no network.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use common::peers::run_node as run_peer;

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

/// Issue 16: the reference filesystem server (started with `/`, directly and through `npx`
/// from the local install) under `proxy --confine`: the kernel refuses what its roots do
/// not allow, even when the server itself would try.
#[test]
fn reference_filesystem_server_is_held_to_its_roots_by_the_kernel() {
    let s = run_peer("host_confine.mjs");
    assert_eq!(s["test"], "host_confine");
    for run in ["direct", "npx"] {
        assert_eq!(s[run]["proxyExit"]["code"], 0, "{run}: {s}");
        assert!(
            s[run]["roWriteError"]
                .as_str()
                .is_some_and(|e| e.contains("EACCES")),
            "{run}: {s}"
        );
    }
    assert_eq!(s["noRoots"]["allowed"], serde_json::json!(["/"]));
    assert_eq!(
        s["noRoots"]["kernel"].as_object().map(|k| k.len()),
        Some(5),
        "{s}"
    );
    println!("peers tested: {}", s["versions"]);
}

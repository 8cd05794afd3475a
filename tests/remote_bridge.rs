//! A remote (Streamable HTTP) MCP server behind `fsbroker proxy` today, through a stdio ↔ HTTP
//! bridge that passes the server's requests on to its stdio client:
//! `fsbroker proxy --root DIR -- mcp-remote URL` (docs/hosts.md, "Remote servers").
//!
//! The real binary, the real bridge (`mcp-remote`, pinned in `tests/peers`) and real SDK
//! servers on 127.0.0.1 (`tests/peers/remote_*`): the test plays the host over the proxy's
//! stdio, calls the servers' tools that send `roots/list`, `files/consent`, `files/list` and
//! `files/read` to the client, and checks that the broker answered them (the root's name, a
//! real file's sha256) and that none of them reached the host. Without the npm (or Python)
//! peers the tests install them, or fail saying why: they are never skipped.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use common::fsb::{Cmd, Log};
use common::path_str;
use common::peers::{peers_dir, require_npm, require_python_mcp1};
use common::remote::{Host, RemoteServer, Root, brokered_round, test_ca};

/// Bounds every wait, only so that a hang fails instead of blocking the run; nothing here is
/// timed. Generous: debug builds, Node.js startup and a 3 MiB file in three requests.
const WAIT: Duration = Duration::from_secs(120);

/// The host of `fsbroker proxy --root ROOT -- node mcp-remote URL ARGS`. mcp-remote keeps
/// OAuth state under `MCP_REMOTE_CONFIG_DIR` (and `HOME`): a directory of the test's, so no
/// user's tokens are read and none are left behind.
impl Host {
    fn start(root: &Path, url: &str, bridge_args: &[&str]) -> Host {
        Host::start_with(root, url, bridge_args, &[])
    }

    /// [`Host::start`] with more environment for the proxy and the bridge it starts.
    fn start_with(root: &Path, url: &str, bridge_args: &[&str], env: &[(&str, &Path)]) -> Host {
        let home = tempfile::tempdir().expect("tempdir");
        let bridge = peers_dir().join("node_modules/mcp-remote/dist/proxy.js");
        let mut args = vec![
            "proxy".to_owned(),
            "--root".to_owned(),
            path_str(root),
            "--".to_owned(),
            common::peers::node(),
            path_str(&bridge),
            url.to_owned(),
        ];
        args.extend(bridge_args.iter().map(|a| (*a).to_owned()));
        let mut cmd = Cmd::new(&args)
            .env("HOME", home.path())
            .env("MCP_REMOTE_CONFIG_DIR", home.path().join("mcp-auth"));
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        Host::new(
            cmd.log(Log::Keep).record().deadline(WAIT).spawn(),
            Some(home),
        )
    }
}

/// TypeScript SDK 1.x server (stateful, SSE) through mcp-remote: the server's `roots/list`
/// and `files/*` requests on the tool call's POST stream and on the GET stream are answered by
/// the broker, and the host sees none of them.
#[test]
fn typescript_v1_server_through_mcp_remote() {
    require_npm();
    let root = Root::new();
    let server = RemoteServer::node("remote_ts1.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    let init = host.initialize();
    assert_eq!(init["serverInfo"]["name"], "fsbroker-remote-ts1", "{init}");
    brokered_round(&mut host, &root, "post");
    brokered_round(&mut host, &root, "get");
    host.finish();
}

/// The same server cutting every SSE stream after two events: mcp-remote resumes with
/// `Last-Event-ID` (the server's record shows the resumes) and the file still arrives whole.
#[test]
fn dropped_sse_streams_are_resumed_through_mcp_remote() {
    require_npm();
    let root = Root::new();
    let server = RemoteServer::node("remote_ts1.mjs", &["--drop-sse-after", "2"]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    host.initialize();
    brokered_round(&mut host, &root, "post");
    let seen = host.tool("sse_count", json!({}));
    assert!(
        seen["drops"].as_u64().is_some_and(|n| n > 0),
        "no stream was dropped: {seen}\n{}",
        server.log()
    );
    let resumed = seen["gets"]
        .as_array()
        .is_some_and(|g| g.iter().any(Value::is_string));
    assert!(
        resumed,
        "no GET carried a Last-Event-ID: {seen}\n{}",
        server.log()
    );
    host.finish();
}

/// Python SDK 1.x server (`mcp` 1.30, FastMCP, stateful, SSE) through mcp-remote: the same
/// requests on both streams, answered by the broker.
#[test]
fn python_v1_server_through_mcp_remote() {
    require_npm();
    let python = require_python_mcp1();
    let root = Root::new();
    let server = RemoteServer::start(&python, &["remote_py1.py"]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    let init = host.initialize();
    assert_eq!(init["serverInfo"]["name"], "fsbroker-remote-py1", "{init}");
    brokered_round(&mut host, &root, "post");
    brokered_round(&mut host, &root, "get");
    host.finish();
}

/// The Python server cutting its SSE streams after two events: resumed, the file whole.
#[test]
fn dropped_python_sse_streams_are_resumed_through_mcp_remote() {
    require_npm();
    let python = require_python_mcp1();
    let root = Root::new();
    let server = RemoteServer::start(&python, &["remote_py1.py", "--drop-sse-after", "2"]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    host.initialize();
    brokered_round(&mut host, &root, "post");
    let debug = server.debug();
    assert!(
        debug["drops"].as_u64().is_some_and(|n| n > 0),
        "no stream was dropped: {debug}"
    );
    let resumed = debug["get_streams"]
        .as_array()
        .is_some_and(|g| g.iter().any(|s| s["lastEventId"].is_string()));
    assert!(
        resumed,
        "no GET carried a Last-Event-ID: {debug}\n{}",
        server.log()
    );
    host.finish();
}

/// TypeScript SDK 2.x handler of the 2026-07-28 era (stateless, `input_required`) through
/// `mcp-remote --protocol auto`, with a 2026 host: the server's `roots/list` and hand-written
/// `files/*` input requests reach fsbroker's proxy as `input_required` results, which it
/// answers and retries itself; the host only sees the final results.
#[test]
fn typescript_v2_server_through_mcp_remote_with_a_2026_host() {
    require_npm();
    let root = Root::new();
    let server = RemoteServer::node("remote_ts2.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &["--protocol", "auto"]);
    host.modern();
    brokered_round(&mut host, &root, "post");
    host.finish();
}

/// The same server with a 2025 host: mcp-remote answers the handshake itself and puts the
/// server's `roots/list` input request to its client as a request, which the broker answers;
/// `files/*` input requests it cannot put to a 2025 client, and fails the call (a limit of
/// the bridge, documented in docs/hosts.md).
#[test]
fn typescript_v2_server_through_mcp_remote_with_a_2025_host() {
    require_npm();
    let root = Root::new();
    let server = RemoteServer::node("remote_ts2.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &["--protocol", "auto"]);
    host.initialize();
    let roots = host.ask("roots/list", json!({}), "post");
    assert_eq!(roots["roots"][0]["name"], "remote-root", "{roots}");
    let r = host.call(
        "request",
        json!({"method": "files/list", "params": {"path": path_str(&root.path)}}),
    );
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("files/list") && message.contains("2025"),
        "mcp-remote 0.15.1 was expected to refuse a files/* input request for a 2025 client: {r}"
    );
    host.finish();
}

/// HTTPS with a CA made for the test (trusted through `NODE_EXTRA_CA_CERTS`), and a server
/// that answers 401 without its header: mcp-remote sends the header (`--header`) and never
/// starts OAuth; the broker answers as over plain HTTP.
#[test]
fn typescript_v1_server_over_https_with_a_required_header() {
    require_npm();
    let root = Root::new();
    let certs = tempfile::tempdir().expect("tempdir");
    let Some(ca) = test_ca(certs.path()) else {
        return;
    };
    let server = RemoteServer::node(
        "remote_ts1.mjs",
        &[
            "--tls",
            ca.cert.to_str().unwrap(),
            ca.key.to_str().unwrap(),
            "--require-header",
            "X-Fsbroker-Test: s3cret",
        ],
    );
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let mut host = Host::start_with(
        &root.path,
        &server.url,
        &["--header", "X-Fsbroker-Test:s3cret"],
        &[("NODE_EXTRA_CA_CERTS", &ca.ca_cert)],
    );
    host.initialize();
    brokered_round(&mut host, &root, "post");
    host.finish();
    assert!(
        !server.log().contains("401 for"),
        "a request went without the header:\n{}",
        server.log()
    );
}

/// A session the server forgets (HTTP 404 on the next request) is initialized again by
/// mcp-remote, which resends the request: the broker answers on the new session as before.
#[test]
fn an_expired_session_is_reestablished_through_mcp_remote() {
    require_npm();
    let root = Root::new();
    let server = RemoteServer::node("remote_ts1.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    host.initialize();
    let expired = host.tool("expire_session", json!({}));
    let old = expired["expired"]
        .as_str()
        .expect("the expired session's id")
        .to_owned();
    brokered_round(&mut host, &root, "post");
    let debug = server.debug();
    assert_eq!(debug["expired_sessions"], json!([old]), "{debug}");
    let live = debug["sessions"].as_array().expect("sessions");
    assert!(
        !live.is_empty() && !live.contains(&json!(old)),
        "no new session after the expiry: {debug}"
    );
    host.finish();
}

//! `fsbroker proxy --url URL`: the proxy's own Streamable HTTP client against real remote
//! MCP servers on 127.0.0.1 (`tests/peers/remote_*`: the TypeScript SDK 1.x and the Python
//! SDK 1.x, stateful with SSE, and the TypeScript SDK 2.x handler of the 2026-07-28 era).
//!
//! The real binary; the test plays the host over its stdin and stdout: the servers' tools send
//! `roots/list` and `files/*` to the client on the tool call's POST stream, on the GET stream
//! and (2026) in `input_required` results; the broker must answer each (the root's name, a
//! real file's sha256) and the host must see none of them. Then the transport's edges the real
//! servers can produce: a body limit (413), TLS with a private CA, a token from the
//! environment (and the 401 without it), dropped streams resumed, an expired session, and the
//! session's DELETE at the end. Edges no real server produces are in `tests/remote_edges.rs`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use common::fsb::{Cmd, Log, Raw};
use common::peers::{require_npm, require_python_mcp1};
use common::remote::{FILE_SIZE, Host, RemoteServer, Root, brokered_round, test_ca};
use common::{Listener, PolicyToml, RootToml, path_str, tempdir};

/// Bounds every wait, only so that a hang fails instead of blocking the run; nothing here is
/// timed. Generous: debug builds, Node.js startup and a 20 MiB file in chunks.
const WAIT: Duration = Duration::from_secs(180);

/// The large file: read in chunks that fit a server's body limit.
const BIG_SIZE: usize = 20 << 20;

/// A root with `data.bin`, `note.txt` and the 20 MiB `big.bin`.
fn root() -> Root {
    Root::with_big(BIG_SIZE)
}

/// The three real servers, for what every one of them must do alike.
#[derive(Clone, Copy, Debug)]
enum Peer {
    /// TypeScript SDK 1.x, stateful, SSE.
    Ts1,
    /// Python SDK 1.x, stateful, SSE.
    Py1,
    /// TypeScript SDK 2.x, MCP 2026-07-28, stateless.
    Ts2,
}

const PEERS: [Peer; 3] = [Peer::Ts1, Peer::Py1, Peer::Ts2];

impl Peer {
    /// The server, started with `args`.
    fn start(self, args: &[&str]) -> RemoteServer {
        match self {
            Peer::Ts1 => RemoteServer::node("remote_ts1.mjs", args),
            Peer::Ts2 => RemoteServer::node("remote_ts2.mjs", args),
            Peer::Py1 => {
                let python = require_python_mcp1();
                let mut all = vec!["remote_py1.py"];
                all.extend(args);
                RemoteServer::start(&python, &all)
            }
        }
    }

    /// The host's opening: the 2025 handshake, or (2026-07-28) none, each request saying its
    /// revision.
    fn open(self, host: &mut Host) {
        match self {
            Peer::Ts2 => host.modern(),
            Peer::Ts1 | Peer::Py1 => {
                host.initialize();
            }
        }
    }

    /// The host's first request, raw: what a refused connection answers.
    fn first_request(self, host: &mut Host) -> Value {
        match self {
            Peer::Ts2 => host.call("read_all", json!({"path": "x", "chunk": 1})),
            Peer::Ts1 | Peer::Py1 => host.raw("initialize", Host::init_params()),
        }
    }
}

/// The host of `fsbroker proxy --root ROOT --url URL ARGS`.
impl Host {
    fn start(root: &Path, url: &str, args: &[&str]) -> Host {
        Host::start_with(root, url, args, &[])
    }

    fn start_with(root: &Path, url: &str, args: &[&str], env: &[(&str, &str)]) -> Host {
        let mut all = vec![
            "proxy".to_owned(),
            "--root".to_owned(),
            path_str(root),
            "--url".to_owned(),
            url.to_owned(),
        ];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        let mut cmd = Cmd::new(&all);
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        Host::new(cmd.log(Log::Keep).record().deadline(WAIT).spawn(), None)
    }
}

/// The `roots/list` the server sent the moment the session was initialized (on the GET
/// stream): answered by the broker, so the GET stream was open in time.
fn early_roots_answered(host: &mut Host) {
    let early = host.tool("early_roots", json!({}));
    assert_eq!(
        early["result"]["roots"][0]["name"],
        "remote-root",
        "the roots/list sent at initialization was not answered: {early}\n{}",
        host.fsb.log_text()
    );
}

/// The session the server's `/debug` shows, and that the proxy DELETEd it at the end.
fn deleted_at_exit(server: &RemoteServer, before: &Value) {
    let sessions = before["sessions"].as_array().expect("sessions").clone();
    assert_eq!(sessions.len(), 1, "{before}");
    let after = server.debug();
    assert!(
        after["deleted_sessions"]
            .as_array()
            .is_some_and(|d| d.contains(&sessions[0])),
        "the session was not DELETEd at the host's EOF: {after}\n{}",
        server.log()
    );
}

/// TypeScript SDK 1.x (stateful, SSE): the server's requests on the tool call's POST stream
/// and on the GET stream (also the one it sends at `oninitialized`) are answered by the
/// broker; none reaches the host; the session is DELETEd at the host's EOF.
#[test]
fn typescript_v1_server() {
    require_npm();
    let root = root();
    let server = RemoteServer::node("remote_ts1.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    let init = host.initialize();
    assert_eq!(init["serverInfo"]["name"], "fsbroker-remote-ts1", "{init}");
    early_roots_answered(&mut host);
    brokered_round(&mut host, &root, "post");
    brokered_round(&mut host, &root, "get");
    let before = server.debug();
    host.finish();
    deleted_at_exit(&server, &before);
}

/// Python SDK 1.x (FastMCP, stateful, SSE): the same, and a 20 MiB file read in 1 MiB
/// chunks under a 2 MiB body limit.
#[test]
fn python_v1_server() {
    require_npm();
    let python = require_python_mcp1();
    let root = root();
    let limit = (2 << 20).to_string();
    let server = RemoteServer::start(&python, &["remote_py1.py", "--body-limit", &limit]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    let init = host.initialize();
    assert_eq!(init["serverInfo"]["name"], "fsbroker-remote-py1", "{init}");
    early_roots_answered(&mut host);
    brokered_round(&mut host, &root, "post");
    brokered_round(&mut host, &root, "get");
    let read = host.tool(
        "read_all",
        json!({"path": path_str(&root.path.join("big.bin")), "chunk": 1 << 20}),
    );
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(read["bytes"], BIG_SIZE, "{read}");
    assert_eq!(read["sha256"], root.big_sha256(), "{read}");
    let before = server.debug();
    host.finish();
    deleted_at_exit(&server, &before);
}

/// A body limit the broker's answers do not fit: the first over-large answer is refused
/// with HTTP 413, and the server gets a clear error for that read (the size that fits)
/// instead of a time-out; its later reads are clamped, and a 20 MiB file then arrives whole.
/// With `--max-chunk-size` the reads fit from the first.
#[test]
fn a_body_limit_clamps_reads() {
    require_npm();
    let root = root();
    let limit = (1 << 20).to_string();
    let server = RemoteServer::node("remote_ts1.mjs", &["--body-limit", &limit]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    host.initialize();
    let big = path_str(&root.path.join("big.bin"));
    let first = host.tool("read_all", json!({"path": big, "chunk": 4 << 20}));
    let error = &first["errors"][0];
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("HTTP 413") && message.contains("ask for at most"),
        "the refused answer did not become a clear error: {first}"
    );
    assert_eq!(error["data"]["code"], "QUOTA_EXCEEDED", "{first}");
    // The proxy does not know the limit, only a size over it: each refusal halves the clamp
    // (and says so), until the answers fit.
    let mut read = Value::Null;
    for _ in 0..6 {
        read = host.tool("read_all", json!({"path": big, "chunk": 4 << 20}));
        let Some(error) = read["errors"].get(0) else {
            break;
        };
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("HTTP 413")),
            "{read}"
        );
    }
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(read["bytes"], BIG_SIZE, "{read}");
    assert_eq!(read["sha256"], root.big_sha256(), "{read}");
    assert!(read["clamped"].as_u64().is_some_and(|n| n > 0), "{read}");
    host.finish();

    let mut host = Host::start(&root.path, &server.url, &["--max-chunk-size", "512KiB"]);
    host.initialize();
    let read = host.tool("read_all", json!({"path": big, "chunk": 4 << 20}));
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(read["sha256"], root.big_sha256(), "{read}");
    assert_eq!(read["reads"], 40, "{read}");
    host.finish();
}

/// TypeScript SDK 2.x handler of the 2026-07-28 era (stateless): `Mcp-Method` and `Mcp-Name`
/// on every POST (the handler refuses a call without them), the server's `roots/list` and
/// `files/*` input requests answered by the broker and the call retried by the proxy; the
/// host sees only the final results.
#[test]
fn typescript_v2_server_with_a_2026_host() {
    require_npm();
    let root = root();
    let server = RemoteServer::node("remote_ts2.mjs", &[]);
    let mut host = Host::start(&root.path, &server.url, &[]);
    host.modern();
    brokered_round(&mut host, &root, "post");
    // 20 MiB in 2 MiB input requests: each retry fits the handler's 4 MiB body limit, and
    // the ten rounds fit the proxy's bound on rounds per request.
    let read = host.tool(
        "read_all",
        json!({"path": path_str(&root.path.join("big.bin")), "chunk": 2 << 20}),
    );
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(read["bytes"], BIG_SIZE, "{read}");
    assert_eq!(read["sha256"], root.big_sha256(), "{read}");
    host.finish();
}

/// Streams cut after two events: the proxy resumes them with `Last-Event-ID` (the server's
/// record shows it), and the file still arrives whole.
#[test]
fn dropped_sse_streams_are_resumed() {
    require_npm();
    let root = root();
    let server = RemoteServer::node("remote_ts1.mjs", &["--drop-sse-after", "2"]);
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
    assert!(resumed, "no GET carried a Last-Event-ID: {debug}");
    host.finish();
}

/// The Python server cutting its streams after two events: resumed, the file whole.
#[test]
fn dropped_python_sse_streams_are_resumed() {
    require_npm();
    let python = require_python_mcp1();
    let root = root();
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

/// The server forgets the session (each stateful server): the host's next request gets a
/// JSON-RPC error naming the URL and the expiry (never silence), and so does every later one.
#[test]
fn an_expired_session_is_reported_to_the_host() {
    require_npm();
    let root = root();
    for peer in [Peer::Ts1, Peer::Py1] {
        let server = peer.start(&[]);
        let mut host = Host::start(&root.path, &server.url, &[]);
        peer.open(&mut host);
        host.tool("expire_session", json!({}));
        // The proxy learns of it on its next request, or at once on its GET stream's
        // resumption: the call gets the error, or finds the proxy gone.
        let id = host
            .fsb
            .send("tools/call", json!({"name": "sse_count", "arguments": {}}));
        while let Raw::Line(line) = host.fsb.next_line(Duration::from_secs(20)) {
            let r = line.value();
            if r["id"] != id {
                continue;
            }
            let message = r["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(&server.url)
                    && message.contains("ended the session")
                    && message.contains("the proxy ends"),
                "{peer:?}: an expired session was not reported: {r}"
            );
            assert_eq!(r["error"]["code"], -32603, "{peer:?}: {r}");
        }
        // The proxy ends by itself, non-zero, its host still there: a host sees its server
        // exit (and may start it again), not a server that fails every call.
        let status = host
            .fsb
            .wait_exit(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("{peer:?}: the proxy stayed up after its session was lost"));
        assert_eq!(status.code(), Some(1), "{peer:?}: {}", host.fsb.log_text());
        assert!(
            host.fsb.log_text().contains("the host starts it again"),
            "{peer:?}: {}",
            host.fsb.log_text()
        );
    }
}

/// HTTPS with a private CA, for every server: trusted with `--ca-cert`; without it the
/// host's request gets an error naming the URL and the certificate.
#[test]
fn tls_with_a_private_ca() {
    require_npm();
    let root = root();
    let (_ca_dir, ca_path) = tempdir();
    let Some(ca) = test_ca(&ca_path) else {
        return;
    };
    for peer in PEERS {
        let server = peer.start(&["--tls", &path_str(&ca.cert), &path_str(&ca.key)]);
        assert!(
            server.url.starts_with("https://"),
            "{peer:?}: {}",
            server.url
        );
        let mut host = Host::start(
            &root.path,
            &server.url,
            &["--ca-cert", &path_str(&ca.ca_cert)],
        );
        peer.open(&mut host);
        brokered_round(&mut host, &root, "post");
        host.finish();

        let mut host = Host::start(&root.path, &server.url, &[]);
        let r = peer.first_request(&mut host);
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("cannot reach") && message.contains("certificate"),
            "{peer:?}: an untrusted certificate was not reported: {r}"
        );
        host.finish();
    }
}

/// A server that wants a bearer token, for every server: without one, the host's request gets
/// an error saying how to supply it (`--header-env Authorization=VAR`) and naming the resource
/// metadata, and stderr says the same; with the token from the environment everything works,
/// and the token appears nowhere in the proxy's output, nor does a key in the URL's query.
#[test]
fn a_token_from_the_environment() {
    require_npm();
    let root = root();
    let token = "Bearer s3cret-remote-token";
    for peer in PEERS {
        let server = peer.start(&["--require-header", &format!("Authorization:{token}")]);
        let mut host = Host::start(&root.path, &server.url, &[]);
        let r = peer.first_request(&mut host);
        let message = r["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("HTTP 401")
                && message.contains("--header-env Authorization=")
                && message.contains("/.well-known/oauth-protected-resource"),
            "{peer:?}: the 401 was not explained: {r}"
        );
        let log = host.finish();
        assert!(
            log.contains("HTTP 401"),
            "{peer:?}: stderr did not say: {log}"
        );

        let mut host = Host::start_with(
            &root.path,
            &server.url,
            &["--header-env", "Authorization=REMOTE_TEST_TOKEN"],
            &[("REMOTE_TEST_TOKEN", token), ("RUST_LOG", "fsbroker=trace")],
        );
        peer.open(&mut host);
        brokered_round(&mut host, &root, "post");
        let log = host.finish();
        assert!(
            !log.contains("s3cret"),
            "{peer:?}: the token was logged:\n{log}"
        );

        // A key in the URL's query is shown as `?…` too, at every level: the server, which
        // takes the header, ignores the query.
        let keyed = format!("{}?api_key=s3cret-query-key", server.url);
        let mut host = Host::start_with(
            &root.path,
            &keyed,
            &["--header-env", "Authorization=REMOTE_TEST_TOKEN"],
            &[("REMOTE_TEST_TOKEN", token), ("RUST_LOG", "fsbroker=trace")],
        );
        peer.open(&mut host);
        let log = host.finish();
        assert!(
            log.contains("relaying to a remote MCP server") && !log.contains("s3cret-query"),
            "{peer:?}: the URL's query was logged:\n{log}"
        );
    }
}

/// A body limit the broker's answers do not fit, for every server: the 413 never ends in a
/// time-out, and the file arrives whole (20 MiB in the 2025 era). In the 2025 era the broker's answers go in
/// POSTs of their own: each refusal becomes an error for the server's read naming the size
/// that fits, and halves the proxy's clamp until the answers fit. In the 2026-07-28 era they go
/// in the proxy's retry of the host's call: a refusal fails the host's call with a clear error
/// and halves the clamp of the server's later reads, and `--max-chunk-size` makes them fit
/// from the first.
#[test]
fn every_server_gets_a_20_mib_file_under_a_body_limit() {
    require_npm();
    let root = root();
    let limit = (1 << 20).to_string();
    let big = path_str(&root.path.join("big.bin"));
    for peer in PEERS {
        let server = peer.start(&["--body-limit", &limit]);
        let mut host = Host::start(&root.path, &server.url, &[]);
        peer.open(&mut host);
        if let Peer::Ts2 = peer {
            // Each refused retry fails the host's call clearly and halves the clamp of the
            // server's later reads; the host's next call then gets the file. (This server reads
            // with one round of input requests per chunk, and the proxy allows a request 10
            // rounds: the 2 MiB file, not the 20 MiB one.)
            let data = path_str(&root.path.join("data.bin"));
            let mut outcome = Value::Null;
            for _ in 0..8 {
                let r = host.call("read_all", json!({"path": data, "chunk": 2 << 20}));
                if r.get("error").is_none() {
                    outcome = r;
                    break;
                }
                let message = r["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("HTTP 413") && r["error"]["code"] == -31007,
                    "{peer:?}: the refused retry was not a clear error: {r}"
                );
            }
            let text = outcome["result"]["content"][0]["text"]
                .as_str()
                .unwrap_or_default();
            let read: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("{peer:?}: no read after the clamps ({e}): {outcome}"));
            assert_eq!(read["errors"], json!([]), "{peer:?}: {read}");
            assert_eq!(read["sha256"], root.sha256, "{peer:?}: {read}");
            host.finish();
            // With the clamp given up front, the first call gets it.
            let mut host = Host::start(&root.path, &server.url, &["--max-chunk-size", "512KiB"]);
            peer.open(&mut host);
            let read = host.tool("read_all", json!({"path": data, "chunk": 2 << 20}));
            assert_eq!(read["errors"], json!([]), "{peer:?}: {read}");
            assert_eq!(read["bytes"], FILE_SIZE, "{peer:?}: {read}");
            assert_eq!(read["sha256"], root.sha256, "{peer:?}: {read}");
            host.finish();
            continue;
        }
        let mut read = Value::Null;
        for _ in 0..8 {
            read = host.tool("read_all", json!({"path": big, "chunk": 2 << 20}));
            let Some(error) = read["errors"].get(0) else {
                break;
            };
            assert!(
                error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("HTTP 413") && m.contains("ask for at most")),
                "{peer:?}: {read}"
            );
        }
        assert_eq!(read["errors"], json!([]), "{peer:?}: {read}");
        assert_eq!(read["bytes"], BIG_SIZE, "{peer:?}: {read}");
        assert_eq!(read["sha256"], root.big_sha256(), "{peer:?}: {read}");
        host.finish();
    }
}

/// Every `files/*` method, asked by each server (on the tool call's POST stream, or in
/// `input_required` results in the 2026-07-28 era) and answered by the broker in a
/// read-write root: the disk changes as asked, and the host sees none of it.
#[test]
fn every_files_method_through_every_server() {
    require_npm();
    let root = root();
    for peer in PEERS {
        let server = peer.start(&[]);
        let mut host = Host::start(&root.path, &server.url, &["--read-write"]);
        peer.open(&mut host);
        let dir = root.path.join(format!("w-{peer:?}"));
        let d = path_str(&dir);
        let created = host.ask(
            "files/create",
            json!({"path": d, "type": "directory"}),
            "post",
        );
        assert_eq!(created["created"], true, "{peer:?}: {created}");
        let file = format!("{d}/t.txt");
        let written = host.ask(
            "files/write",
            json!({"path": file, "content": "remote write\n"}),
            "post",
        );
        assert_eq!(written["bytesWritten"], 13, "{peer:?}: {written}");
        assert_eq!(
            std::fs::read_to_string(dir.join("t.txt")).unwrap(),
            "remote write\n"
        );
        let read = host.ask("files/read", json!({"path": file}), "post");
        assert_eq!(read["content"], "remote write\n", "{peer:?}: {read}");
        let locked = host.ask(
            "files/read",
            json!({"path": file, "keepLocked": true}),
            "post",
        );
        let lock = locked["lockId"].clone();
        assert!(lock.is_string(), "{peer:?}: {locked}");
        host.ask("files/unlock", json!({"lockId": lock}), "post");
        let moved = format!("{d}/u.txt");
        host.ask(
            "files/rename",
            json!({"oldPath": file, "newPath": moved}),
            "post",
        );
        assert!(
            dir.join("u.txt").exists() && !dir.join("t.txt").exists(),
            "{peer:?}"
        );
        let watch = host.ask("files/watch", json!({"path": d}), "post");
        let watch_id = watch["watchId"].clone();
        assert!(watch_id.is_string(), "{peer:?}: {watch}");
        host.ask("files/unwatch", json!({"watchId": watch_id}), "post");
        host.ask(
            "files/delete",
            json!({"path": d, "recursive": true}),
            "post",
        );
        assert!(!dir.exists(), "{peer:?}: {d} is still there");
        host.finish();
    }
}

/// `--connect` and `--url` together: a shared broker answers the remote server's requests.
#[test]
fn a_shared_broker_answers_a_remote_server() {
    require_npm();
    let root = root();
    let (_tmp, dir) = tempdir();
    let policy = PolicyToml::new()
        .root(RootToml::at(&root.path))
        .write_to(&dir.join("shared.toml"));
    let broker = Listener::start(&policy, &dir.join("broker.sock"), &[], &Default::default());
    let server = RemoteServer::node("remote_ts1.mjs", &[]);
    let sock = path_str(&broker.sock);
    let mut host = Host::start(&root.path, &server.url, &["--connect", &sock]);
    host.initialize();
    brokered_round(&mut host, &root, "post");
    host.finish();
}

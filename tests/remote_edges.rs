//! `fsbroker proxy --url`: the transport's edges that no real MCP server produces on demand,
//! against a small HTTP server in the test (`tests/common/http.rs`: plain `std::net` on
//! 127.0.0.1, one request per connection, each answer written by the test): the headers
//! every request carries, a GET stream refused with 405, redirects (not followed), an event
//! longer than the proxy relays, a 413 for the host's own message, a stream that ends
//! without the answer, and the command line's refusals. The real servers are in
//! `tests/remote.rs`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;

use serde_json::{Value, json};

use common::http::{
    Server, WAIT, answer_json, error_message, init_result, initialize, proxy, respond,
};

/// After `initialize`, every request carries the session's id and the negotiated version,
/// and the user's headers; a GET stream refused with 405 is fine; the host's EOF DELETEs the
/// session.
#[test]
fn session_headers_on_every_request_and_delete_at_exit() {
    let server = Server::start(|req, stream| match req.method.as_str() {
        "GET" => respond(stream, "405 Method Not Allowed", &[], b""),
        "DELETE" => respond(stream, "200 OK", &[], b""),
        _ => match req.json()["method"].as_str() {
            Some("initialize") => {
                answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-1"])
            }
            Some(m) if m.starts_with("notifications/") => respond(stream, "202 Accepted", &[], b""),
            _ => answer_json(req, json!({"tools": []}), stream, &[]),
        },
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--header", "X-Team: blue"], &[]);
    let init = initialize(&mut fsb);
    assert_eq!(init["result"]["serverInfo"]["name"], "loopback", "{init}");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let tools = fsb.request("tools/list", json!({}));
    assert_eq!(tools["result"]["tools"], json!([]), "{tools}");
    let (status, _) = fsb.end();
    assert!(status.success(), "{status}\n{}", fsb.log_text());

    let seen = server.seen();
    let init = &seen[0];
    assert_eq!(init.method, "POST");
    assert_eq!(init.header("content-type"), Some("application/json"));
    let accept = init.header("accept").unwrap_or_default();
    assert!(accept.contains("application/json") && accept.contains("text/event-stream"));
    assert_eq!(init.header("mcp-session-id"), None);
    assert_eq!(init.header("x-team"), Some("blue"));
    for later in &seen[1..] {
        assert_eq!(later.header("mcp-session-id"), Some("sess-1"), "{later:?}");
        assert_eq!(
            later.header("mcp-protocol-version"),
            Some("2025-06-18"),
            "{later:?}"
        );
        assert_eq!(later.header("x-team"), Some("blue"), "{later:?}");
    }
    let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(
        methods[1], "GET",
        "the GET stream is opened right after initialize: {methods:?}"
    );
    assert_eq!(methods.last(), Some(&"DELETE"), "{methods:?}");
}

/// A redirect is reported, not followed: the host's request gets an error naming it, and
/// the other server is never contacted.
#[test]
fn redirects_are_not_followed() {
    let other = Server::start(|req, stream| answer_json(req, init_result(), stream, &[]));
    let location = format!("Location: {}", other.url);
    let server = Server::start(move |_, stream| {
        respond(stream, "307 Temporary Redirect", &[&location], b"")
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--header", "Authorization: Bearer x"], &[]);
    let r = initialize(&mut fsb);
    let message = error_message(&r);
    assert!(
        message.contains("HTTP 307") && message.contains("redirects are not followed"),
        "{r}"
    );
    assert!(message.contains(&other.url), "{r}");
    fsb.end();
    assert!(other.seen().is_empty(), "the redirect was followed");
}

/// An event longer than `--max-line-bytes` (here one that never ends) fails the request
/// with an error naming the bound, instead of growing the proxy's memory.
#[test]
fn an_over_long_event_fails_the_request() {
    let server = Server::start(|_, stream| {
        let head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: ";
        let _ = stream.write_all(head.as_bytes());
        let chunk = vec![b'x'; 64 << 10];
        // 64 MiB at most; the proxy gives up long before.
        for _ in 0..1024 {
            if stream.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", "1048576"], &[]);
    let r = initialize(&mut fsb);
    let message = error_message(&r);
    assert!(message.contains("longer than 1048576 bytes"), "{r}");
    fsb.end();
}

/// A 413 for the host's own message gets the host a clear error, not a time-out.
#[test]
fn a_413_for_the_hosts_message_is_an_error() {
    let server = Server::start(|req, stream| {
        if req.body.len() > 4096 {
            respond(stream, "413 Payload Too Large", &[], b"");
        } else {
            answer_json(req, init_result(), stream, &[]);
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request(
        "tools/call",
        json!({"name": "x", "arguments": {"blob": "y".repeat(10_000)}}),
    );
    let message = error_message(&r);
    assert!(message.contains("HTTP 413"), "{r}");
    assert_eq!(r["error"]["data"]["code"], "QUOTA_EXCEEDED", "{r}");
    fsb.end();
}

/// A POST's event stream that ends before the answer (and without event ids, so it cannot be
/// resumed) gets the host an error, not silence.
#[test]
fn a_stream_without_the_answer_is_an_error() {
    let server = Server::start(|req, stream| match req.json()["method"].as_str() {
        Some("initialize") => answer_json(req, init_result(), stream, &[]),
        _ => respond(
            stream,
            "200 OK",
            &["Content-Type: text/event-stream"],
            b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n",
        ),
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(
        message.contains("closed the response stream without answering"),
        "{r}"
    );
    fsb.end();
}

/// What the command line refuses, before anything starts, and how it says it: never with a
/// header's value.
#[test]
fn the_command_line_refuses_clearly() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(common::bin());
        cmd.args(args).stdin(std::process::Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run fsbroker");
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let url = "http://127.0.0.1:9/mcp";
    let e = run(&["proxy", "--url", url, "--", "server"], &[]);
    assert!(e.contains("--url and `-- SERVER`"), "{e}");
    let e = run(&["proxy", "--url", url, "--confine"], &[]);
    assert!(e.contains("--confine") && e.contains("remote"), "{e}");
    let e = run(
        &["proxy", "--url", url, "--header", "Mcp-Session-Id: stolen"],
        &[],
    );
    assert!(e.contains("Mcp-Session-Id") && !e.contains("stolen"), "{e}");
    let e = run(
        &[
            "proxy",
            "--url",
            url,
            "--header-env",
            "Authorization=FSB_UNSET_VAR",
        ],
        &[],
    );
    assert!(e.contains("FSB_UNSET_VAR") && e.contains("not set"), "{e}");
    let e = run(
        &["proxy", "--url", url, "--header-env", "X-Bad=FSB_BAD_VAR"],
        &[("FSB_BAD_VAR", "a\r\nInjected: yes")],
    );
    assert!(e.contains("line break") && !e.contains("Injected"), "{e}");
    let e = run(&["proxy", "--url", "ftp://example.com/mcp"], &[]);
    assert!(e.contains("http://"), "{e}");
}

/// A server that answers like an MCP server: `initialize` with a session, 202 for
/// notifications, `{}` for any other request, 405 for GET, 200 for DELETE.
fn plain_server() -> Server {
    Server::start(|req, stream| match req.method.as_str() {
        "GET" => respond(stream, "405 Method Not Allowed", &[], b""),
        "DELETE" => respond(stream, "200 OK", &[], b""),
        _ => match req.json()["method"].as_str() {
            Some("initialize") => {
                answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-2"])
            }
            Some(m) if m.starts_with("notifications/") => respond(stream, "202 Accepted", &[], b""),
            _ => answer_json(req, json!({}), stream, &[]),
        },
    })
}

/// A host that writes its messages and closes its end at once (`printf … | fsbroker proxy`)
/// still gets every answer, and the session is then DELETEd.
#[test]
fn a_host_that_writes_and_leaves_gets_its_answers() {
    let server = plain_server();
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}));
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let (status, rest) = fsb.end();
    assert!(status.success(), "{status}\n{}", fsb.log_text());
    let ids: Vec<Value> = rest
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|m| m["id"].clone())
        .collect();
    let mut all: Vec<Value> = fsb
        .received()
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .map(|m| m["id"].clone())
        .collect();
    all.extend(ids);
    assert!(
        all.contains(&json!(1)) && all.contains(&json!(2)),
        "{all:?}"
    );
    let methods: Vec<String> = server.seen().iter().map(|s| s.method.clone()).collect();
    assert_eq!(
        methods.last().map(String::as_str),
        Some("DELETE"),
        "{methods:?}"
    );
}

/// SIGTERM ends the proxy, and the session with it (`DELETE`).
#[test]
fn a_stop_signal_deletes_the_session() {
    let server = plain_server();
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.signal(rustix::process::Signal::TERM);
    let status = fsb
        .wait_exit(WAIT)
        .expect("the proxy did not end after SIGTERM");
    let deleted = server
        .seen()
        .iter()
        .any(|s| s.method == "DELETE" && s.header("mcp-session-id") == Some("sess-2"));
    assert!(
        deleted,
        "no DELETE after SIGTERM ({status}): {:?}",
        server.seen()
    );
}

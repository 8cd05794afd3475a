//! The proxy on MCP 2026-07-28's wire, line by line: this test is the host, and a scripted
//! server (Python, no SDK) answers with `input_required` results. What the server receives,
//! and what the host gets back, are checked byte for byte where it matters: the retry's id,
//! the bare input responses, the echoed `requestState`, the injected capabilities, the host's
//! own ids, and `resultType` on the broker's answers.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::{Fsb, tempdir};
use serde_json::{Value, json};

const SERVER: &str = r#"
import json, sys
out = sys.stdout.buffer
def send(o):
    out.write(json.dumps(o).encode() + b"\n")
    out.flush()
lines = iter(sys.stdin.buffer)
for raw in lines:
    msg = json.loads(raw)
    if "method" not in msg or "id" not in msg:
        continue
    p = msg.get("params") or {}
    name = p.get("name")
    done = {"resultType": "complete", "content": [{"type": "text", "text": "done"}],
            "seen": {"id": msg["id"], "params": p}, "rawLine": raw.decode()}
    if msg["method"] != "tools/call" or "inputResponses" in p:
        send({"jsonrpc": "2.0", "id": msg["id"], "result": done})
    elif name == "all_broker":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "resultType": "input_required",
            "inputRequests": {"r": {"method": "roots/list"},
                              "f": {"method": "files/read", "params": {"path": "proj/hello.txt"}}},
            "requestState": "st\u00e9-1"}})
    elif name == "mixed":
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "resultType": "input_required", "extra": 5,
            "inputRequests": {"e": {"method": "elicitation/create",
                                    "params": {"message": "ok?", "requestedSchema": {"type": "object"}}},
                              "r": {"method": "roots/list"}}}})
    elif name == "direct":
        send({"jsonrpc": "2.0", "id": "s1", "method": "files/read", "params": {"path": "proj/hello.txt"}})
        answer = json.loads(next(lines))
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", "answer": answer}})
    else:
        send({"jsonrpc": "2.0", "id": msg["id"], "result": done})
"#;

fn envelope() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
    })
}

/// Rule: on a 2026-07-28 connection the proxy declares roots on every request, answers the
/// `roots/list` and `files/*` input requests of an `input_required` result from the broker,
/// retries the request itself when they were all the broker's (a new id, bare answers, the
/// state echoed byte for byte) and gives the host the final answer under the host's own id;
/// when the host has input requests of its own it sees only those, and the broker's answers
/// join its retry. The broker's own answers to the server carry `resultType`.
#[test]
fn input_required_is_answered_by_the_broker_on_the_wire() {
    let (_t, dir) = tempdir();
    let proj = dir.join("proj");
    std::fs::create_dir(&proj).unwrap();
    std::fs::write(proj.join("hello.txt"), "hello from the broker\n").unwrap();
    std::fs::write(dir.join("server.py"), SERVER).unwrap();
    let server = dir.join("server.py");
    let mut proxy = Fsb::spawn(&[
        "proxy".as_ref(),
        "--root".as_ref(),
        proj.as_os_str(),
        "--".as_ref(),
        "python3".as_ref(),
        server.as_os_str(),
    ]);
    proxy.set_deadline(Duration::from_secs(30));
    let mut ask = |request: Value| -> Value {
        proxy.send_msg(&request);
        proxy.read_message()
    };
    let root_uri = url_of(&proj);

    // 1. Every input request the broker's: the host sees only the final answer.
    let r = ask(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "all_broker", "arguments": {}, "_meta": envelope()}}));
    assert_eq!(r["id"], 7, "{r}");
    let seen = &r["result"]["seen"];
    assert!(
        seen["id"].as_str().unwrap().starts_with("fsbroker-retry-"),
        "the retry has an id of its own: {r}"
    );
    let responses = &seen["params"]["inputResponses"];
    assert_eq!(responses["r"]["roots"][0]["uri"], root_uri.as_str(), "{r}");
    assert_eq!(responses["f"]["content"], "hello from the broker\n", "{r}");
    assert!(
        responses["r"].get("resultType").is_none(),
        "input responses are bare: {r}"
    );
    assert!(
        r["result"]["rawLine"]
            .as_str()
            .unwrap()
            .contains(r#""requestState":"st\u00e9-1""#),
        "requestState echoed as the server wrote it: {r}"
    );
    let caps = &seen["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"];
    assert_eq!(caps["roots"], json!({}), "{caps}");
    assert_eq!(
        caps["elicitation"],
        json!({}),
        "the host's own capabilities kept: {caps}"
    );
    assert!(
        caps["extensions"]["io.github.fsbroker/files"]["methods"].is_array(),
        "{caps}"
    );

    // 2. A host input request too: the host sees only its own, and its retry gets the
    //    broker's answer added.
    let r = ask(json!({"jsonrpc": "2.0", "id": "m1", "method": "tools/call",
        "params": {"name": "mixed", "arguments": {}, "_meta": envelope()}}));
    assert_eq!(r["id"], "m1");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    assert_eq!(r["result"]["extra"], 5, "{r}");
    let keys: Vec<&String> = r["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(
        keys,
        vec!["e"],
        "the host sees only its own input request: {r}"
    );
    let r = ask(json!({"jsonrpc": "2.0", "id": "m2", "method": "tools/call",
        "params": {"name": "mixed", "arguments": {}, "_meta": envelope(),
                   "inputResponses": {"e": {"action": "accept"}}}}));
    assert_eq!(r["id"], "m2");
    let responses = &r["result"]["seen"]["params"]["inputResponses"];
    assert_eq!(responses["e"]["action"], "accept", "{r}");
    assert_eq!(responses["r"]["roots"][0]["uri"], root_uri.as_str(), "{r}");

    // 3. A request the server sends itself (a TypeScript v2 server can): answered by the
    //    broker, with resultType.
    let r = ask(json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "direct", "arguments": {}, "_meta": envelope()}}));
    let answer = &r["result"]["answer"];
    assert_eq!(answer["id"], "s1");
    assert_eq!(answer["result"]["resultType"], "complete", "{r}");
    assert_eq!(answer["result"]["content"], "hello from the broker\n");

    proxy.close_stdin();
    let status = proxy
        .wait_exit(Duration::from_secs(30))
        .expect("the proxy exits");
    assert!(status.success(), "{status}");
}

fn url_of(p: &std::path::Path) -> String {
    format!("file://{}", common::uri_path(p))
}

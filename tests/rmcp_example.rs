//! `docs/examples/rmcp_host.rs` as a test: the rmcp client, its `ClientHandler` delegating to a
//! fsbroker `Session`, against a small Python MCP server that asks the client for `roots/list`
//! and `files/read` right after the handshake and reports the answers in a tool result.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

#[allow(dead_code)] // the example's `main` and argument parsing
#[path = "../docs/examples/rmcp_host.rs"]
mod rmcp_host;

use serde_json::{Value, json};

/// A Python MCP server that asks the client for `roots/list`, then `files/read` of
/// `<first root>/hello.txt` and of a missing file; its tool `report` answers (once all three
/// are in) with the responses as JSON text. `argv[1]` gets every raw line received; `argv[2]`
/// is the mode:
/// - `after-init`: negotiates protocol 2025-06-18 and asks right after
///   `notifications/initialized`, the way most servers of that revision do;
/// - `in-call`: negotiates the client's (newer) protocol, under which a client may refuse a
///   `roots/list` that is not tied to a request of its own in flight (SEP-2260, which rmcp
///   enforces), so it asks while handling the `report` call.
const SERVER: &str = r#"
import json, sys

log = open(sys.argv[1], "ab", buffering=0)
mode = sys.argv[2]
answers = {}
waiting = []

def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()

def ask_roots():
    send({"jsonrpc": "2.0", "id": "roots", "method": "roots/list"})

def report_if_ready():
    if len(answers) < 3:
        return
    for mid in waiting:
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "content": [{"type": "text", "text": json.dumps(answers)}], "isError": False}})
    waiting.clear()

for raw in sys.stdin:
    log.write(raw.encode())
    msg = json.loads(raw)
    method, mid = msg.get("method"), msg.get("id")
    if method is None:
        answers[mid] = msg
        if mid == "roots" and "result" in msg:
            root = msg["result"]["roots"][0]["name"]
            send({"jsonrpc": "2.0", "id": "read", "method": "files/read",
                  "params": {"path": root + "/hello.txt"}})
            send({"jsonrpc": "2.0", "id": "missing", "method": "files/read",
                  "params": {"path": root + "/no-such-file.txt"}})
        elif mid == "roots":
            answers["read"] = answers["missing"] = None
        report_if_ready()
    elif method == "initialize":
        version = "2025-06-18" if mode == "after-init" else msg["params"]["protocolVersion"]
        send({"jsonrpc": "2.0", "id": mid, "result": {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "py-files-peer", "version": "1.0"}}})
    elif method == "notifications/initialized":
        if mode == "after-init":
            ask_roots()
    elif mid is None:
        pass
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": mid, "result": {"tools": [
            {"name": "report", "description": "what the client answered",
             "inputSchema": {"type": "object", "properties": {}}}]}})
    elif method == "tools/call" and msg["params"]["name"] == "report":
        waiting.append(mid)
        if mode == "in-call" and "roots" not in answers:
            ask_roots()
        report_if_ready()
    else:
        send({"jsonrpc": "2.0", "id": mid,
              "error": {"code": -32601, "message": "no " + method}})
"#;

#[tokio::test(flavor = "multi_thread")]
async fn server_asking_right_after_initialized() {
    demo_answers_roots_and_files("after-init").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_asking_while_handling_a_tool_call() {
    demo_answers_roots_and_files("in-call").await;
}

/// Runs the example's demo against [`SERVER`] in `mode` and checks what the server got.
async fn demo_answers_roots_and_files(mode: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    let root = base.join("notes");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello.txt"), "hello through rmcp\n").unwrap();
    std::fs::write(base.join("server.py"), SERVER).unwrap();
    let log = base.join("server.log");

    let opts = rmcp_host::DemoOptions {
        roots: vec![root.clone()],
        calls: vec!["report".into()],
        server: vec![
            "python3".into(),
            base.join("server.py").into(),
            log.clone().into(),
            mode.into(),
        ],
    };
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        rmcp_host::run_demo(opts),
    )
    .await
    .expect("the demo finished in time")
    .expect("the demo ran");

    assert_eq!(report.server_name, "py-files-peer");
    assert_eq!(report.tools, ["report"]);
    assert_eq!(report.calls.len(), 1);
    let (name, result) = &report.calls[0];
    assert_eq!(name, "report");
    let text = result["content"][0]["text"].as_str().expect("text content");
    let answers: Value = serde_json::from_str(text).unwrap();

    // roots/list: exactly the broker's root.
    let uri = format!("file://{}", root.to_str().unwrap());
    assert_eq!(
        answers["roots"]["result"]["roots"],
        json!([{"uri": uri, "name": "notes"}]),
        "{answers:#}"
    );
    // files/read: the file's content, through on_custom_request.
    let read = &answers["read"]["result"];
    assert_eq!(read["content"], "hello through rmcp\n", "{answers:#}");
    assert_eq!(read["encoding"], "utf-8");
    assert_eq!(read["eof"], true);
    // A broker error reaches the server as the same JSON-RPC error, data.code included.
    let missing = &answers["missing"]["error"];
    assert_eq!(missing["data"]["code"], "FILE_NOT_FOUND", "{answers:#}");
    assert!(missing["code"].as_i64().unwrap() < 0);

    // The client declared roots with listChanged in its initialize.
    let first = std::fs::read_to_string(&log).unwrap();
    let init: Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(init["method"], "initialize");
    assert_eq!(
        init["params"]["capabilities"]["roots"]["listChanged"], true,
        "{init}"
    );
}

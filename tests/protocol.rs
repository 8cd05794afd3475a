//! JSON-RPC and MCP stdio behaviour of `fsbroker serve` through the real binary (contract
//! §1, §1.1, §4, §5 `ping` and `roots/list`).
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::{Fsb, bin, tempdir, uri_path};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A temp dir holding a root directory named `proj` with one small file.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "small").unwrap();
    (t, root)
}

/// Sends one raw line (a newline is added), then a `ping`, and returns the response to the
/// line, checking that the ping is answered too. Responses may come in either order; the
/// ping's id is numeric and small, so the raw line must not use it.
fn bad_line_then_ping(b: &mut Fsb, line: &[u8]) -> Value {
    let mut raw = line.to_vec();
    raw.push(b'\n');
    b.send_raw(&raw);
    let ping = b.send("ping", json!({}));
    let first = b.read_message();
    let second = b.read_message();
    let (pong, other) = if first["id"] == json!(ping) {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(
        pong["id"],
        json!(ping),
        "ping not answered: {pong} / {other}"
    );
    assert_eq!(pong["result"], json!({}), "{pong}");
    assert_eq!(other["jsonrpc"], "2.0", "{other}");
    assert!(other.get("result").is_none(), "{other}");
    assert!(other["error"]["message"].is_string(), "{other}");
    other
}

fn assert_error(resp: &Value, code: i64, id: Value, what: &str) {
    assert_eq!(resp["error"]["code"], code, "{what}: {resp}");
    assert_eq!(resp["id"], id, "{what}: {resp}");
    assert!(
        resp.get("id").is_some(),
        "{what}: id must be present: {resp}"
    );
}

/// Runs `fsbroker ARGS` with `input` on stdin (from a file, so no pipe can fill) and `env`
/// set; returns (status, stdout, stderr).
fn run_with_input(
    args: &[&str],
    input: &[u8],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    let (_t, dir) = tempdir();
    let path = dir.join("input.jsonl");
    std::fs::write(&path, input).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(std::fs::File::open(&path).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run fsbroker");
    (
        out.status,
        String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

// ---------------------------------------------------------------------------------------------
// ping and roots/list
// ---------------------------------------------------------------------------------------------

#[test]
fn ping_answers_an_empty_object() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    assert_eq!(b.ok("ping", json!({})), json!({}));
    assert_eq!(
        b.ok("ping", json!({"_meta": {"progressToken": 1}})),
        json!({})
    );
    // Without params at all.
    b.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"ping\"}\n");
    let resp = b.read_message();
    assert_eq!(resp, json!({"jsonrpc": "2.0", "id": 99, "result": {}}));
    // A broker with no roots still answers ping.
    let mut none = Fsb::spawn(&["serve"]);
    assert_eq!(none.ok("ping", json!({})), json!({}));
}

#[test]
fn roots_list_before_any_handshake_with_percent_encoded_uris() {
    let (_t, base) = tempdir();
    let root = base.join("my dir é");
    std::fs::create_dir(&root).unwrap();
    let mut b = Fsb::serve_root(&root);
    // The very first message: no initialize, no initialized notification.
    let r = b.ok("roots/list", json!({}));
    let roots = r["roots"].as_array().expect("roots array");
    assert_eq!(roots.len(), 1, "{r}");
    let uri = roots[0]["uri"].as_str().unwrap();
    assert_eq!(uri, format!("file://{}", uri_path(&root)));
    assert!(uri.starts_with("file:///"), "{uri}");
    assert!(uri.ends_with("/my%20dir%20%C3%A9"), "{uri}");
    assert!(!uri.ends_with('/'), "{uri}");
    assert!(!uri.contains(' '), "{uri}");
    assert_eq!(roots[0]["name"], "my dir é");
    assert_eq!(
        roots[0].as_object().unwrap().keys().collect::<Vec<_>>(),
        ["name", "uri"]
    );
    // The URI is usable as a path in requests.
    std::fs::write(root.join("x.txt"), "via uri").unwrap();
    let read = b.ok("files/read", json!({"path": format!("{uri}/x.txt")}));
    assert_eq!(read["content"], "via uri");
    // Params other than `_meta` are refused; absent params are fine.
    assert_eq!(b.ok("roots/list", json!({"_meta": {}})), r);
    let e = b.err("roots/list", json!({"cursor": "x"}));
    assert_eq!(e["code"], -32602, "{e}");
    b.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"rl\",\"method\":\"roots/list\"}\n");
    let resp = b.read_message();
    assert_eq!(resp["id"], "rl");
    assert_eq!(resp["result"], r);
}

#[test]
fn roots_list_uri_escapes_uri_delimiters_and_round_trips() {
    let (_t, base) = tempdir();
    let root = base.join("a#b?c%d");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("x.txt"), "delims").unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("roots/list", json!({}));
    let uri = r["roots"][0]["uri"].as_str().unwrap().to_owned();
    assert!(uri.ends_with("/a%23b%3Fc%25d"), "{uri}");
    assert_eq!(r["roots"][0]["name"], "a#b?c%d");
    let read = b.ok("files/read", json!({"path": format!("{uri}/x.txt")}));
    assert_eq!(read["content"], "delims");
}

#[test]
fn roots_list_uses_canonical_paths() {
    let (_t, base) = tempdir();
    let real = base.join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, base.join("alias")).unwrap();
    let alias = base.join("alias");
    let mut b = Fsb::spawn(&["serve", "--root", alias.to_str().unwrap()]);
    let r = b.ok("roots/list", json!({}));
    assert_eq!(
        r,
        json!({"roots": [{"uri": format!("file://{}", uri_path(&real)), "name": "real"}]})
    );
    let mut empty = Fsb::spawn(&["serve"]);
    assert_eq!(empty.ok("roots/list", json!({})), json!({"roots": []}));
}

#[test]
fn roots_list_before_initialize_and_with_a_handshake() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    let before = b.ok("roots/list", json!({}));
    // An MCP handshake's notification is accepted silently.
    b.send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    let after = b.ok("roots/list", json!({}));
    assert_eq!(before, after);
}

// ---------------------------------------------------------------------------------------------
// Malformed input
// ---------------------------------------------------------------------------------------------

#[test]
fn every_bad_message_is_answered_and_the_session_goes_on() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    let null = Value::Null;
    let cases: Vec<(&[u8], i64, Value)> = vec![
        (b"this is not json", -32700, null.clone()),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1000,\"method\":\"ping\"",
            -32700,
            null.clone(),
        ),
        (b"{\"jsonrpc\":\"2.0\",,}", -32700, null.clone()),
        (b"\xff\xfe\x00garbage", -32700, null.clone()),
        (b"[1,2,3]", -32600, null.clone()),
        (
            b"[{\"jsonrpc\":\"2.0\",\"id\":1001,\"method\":\"ping\"}]",
            -32600,
            null.clone(),
        ),
        (b"[]", -32600, null.clone()),
        (b"\"just a string\"", -32600, null.clone()),
        (b"42", -32600, null.clone()),
        (b"null", -32600, null.clone()),
        (b"true", -32600, null.clone()),
        (b"{}", -32600, null.clone()),
        (
            b"{\"jsonrpc\":\"1.0\",\"id\":1002,\"method\":\"ping\"}",
            -32600,
            json!(1002),
        ),
        (
            b"{\"jsonrpc\":2.0,\"id\":1003,\"method\":\"ping\"}",
            -32600,
            json!(1003),
        ),
        (b"{\"id\":1004,\"method\":\"ping\"}", -32600, json!(1004)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1005,\"method\":7}",
            -32600,
            json!(1005),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1006,\"method\":null}",
            -32600,
            json!(1006),
        ),
        (b"{\"jsonrpc\":\"2.0\",\"id\":1007}", -32600, json!(1007)),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}",
            -32600,
            null.clone(),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}",
            -32600,
            null.clone(),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}",
            -32600,
            null.clone(),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"ping\"}",
            -32600,
            null.clone(),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":true,\"method\":\"ping\"}",
            -32600,
            null.clone(),
        ),
        // JSON-RPC 2.0's own example: an invalid request without id is answered, id null.
        (
            b"{\"jsonrpc\":\"2.0\",\"method\":1,\"params\":\"bar\"}",
            -32600,
            null.clone(),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1008,\"method\":\"no/such/method\"}",
            -32601,
            json!(1008),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":\"m\",\"method\":\"files/teleport\",\"params\":{}}",
            -32601,
            json!("m"),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1009,\"method\":\"\"}",
            -32601,
            json!(1009),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1010,\"method\":\"ping\",\"params\":3}",
            -32600,
            json!(1010),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1011,\"method\":\"ping\",\"params\":\"x\"}",
            -32600,
            json!(1011),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1012,\"method\":\"ping\",\"params\":null}",
            -32600,
            json!(1012),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1013,\"method\":\"files/read\",\"params\":true}",
            -32600,
            json!(1013),
        ),
        (
            b"{\"jsonrpc\":\"2.0\",\"id\":1014,\"method\":\"ping\",\"params\":{\"x\":1}}",
            -32602,
            json!(1014),
        ),
    ];
    for (line, code, id) in cases {
        let what = String::from_utf8_lossy(line).into_owned();
        let resp = bad_line_then_ping(&mut b, line);
        assert_error(&resp, code, id, &what);
    }
    // After all that, real work still works.
    let r = b.ok("files/read", json!({"path": "proj/f.txt"}));
    assert_eq!(r["content"], "small");
    let (status, rest) = b.finish();
    assert!(status.success());
    assert_eq!(rest, "", "nothing more on stdout");
}

#[test]
fn params_as_an_array_never_succeed_silently_for_files_methods() {
    // MCP params are objects; a positional array for files/read must be an error carrying
    // the id (either -32600 or -32602), and the session goes on.
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    for line in [
        &b"{\"jsonrpc\":\"2.0\",\"id\":1100,\"method\":\"files/read\",\"params\":[\"proj/f.txt\"]}"[..],
        b"{\"jsonrpc\":\"2.0\",\"id\":1101,\"method\":\"files/read\",\"params\":[]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1102,\"method\":\"files/list\",\"params\":[]}",
        // Every field given by position: still not an object.
        b"{\"jsonrpc\":\"2.0\",\"id\":1103,\"method\":\"files/read\",\"params\":[\"proj/f.txt\",\"utf-8\",0,1,null]}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1104,\"method\":\"files/list\",\"params\":[\"proj\",false,false,null,null,null]}",
    ] {
        let resp = bad_line_then_ping(&mut b, line);
        let code = resp["error"]["code"].as_i64().unwrap();
        assert!(code == -32600 || code == -32602, "{resp}");
        assert!(resp["id"].as_u64().is_some_and(|id| id >= 1100), "{resp}");
    }
}

#[test]
fn over_long_line_is_discarded_with_a_small_maximum() {
    let (_t, root) = fixture();
    let mut b = Fsb::spawn(&[
        "serve",
        "--root",
        root.to_str().unwrap(),
        "--max-line-bytes",
        "4096",
    ]);
    // A valid ping padded (inside `_meta`) to exactly `len` bytes, without its newline.
    let padded = |id: u64, len: usize| -> Vec<u8> {
        let head = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\",\"params\":{{\"_meta\":{{\"pad\":\""
        );
        let tail = "\"}}}";
        let pad = len - head.len() - tail.len();
        let line = format!("{head}{}{tail}", "x".repeat(pad));
        assert_eq!(line.len(), len);
        line.into_bytes()
    };
    // Exactly at the maximum: a normal request.
    let mut line = padded(2000, 4096);
    line.push(b'\n');
    b.send_raw(&line);
    let resp = b.read_message();
    assert_eq!(resp, json!({"jsonrpc": "2.0", "id": 2000, "result": {}}));
    // One byte over, and far over: -32600 with id null, never the request's id.
    for len in [4097usize, 10_000, 1_000_000] {
        let resp = bad_line_then_ping(&mut b, &padded(2001, len));
        assert_error(&resp, -32600, Value::Null, &format!("line of {len} bytes"));
    }
    // Garbage that is too long is -32600 too (it is never parsed).
    let resp = bad_line_then_ping(&mut b, &vec![b'{'; 5000]);
    assert_error(&resp, -32600, Value::Null, "long garbage");
    let r = b.ok("files/read", json!({"path": "proj/f.txt"}));
    assert_eq!(r["content"], "small");
}

#[test]
fn over_long_line_with_the_default_32_mib_maximum() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    let head =
        b"{\"jsonrpc\":\"2.0\",\"id\":3000,\"method\":\"ping\",\"params\":{\"_meta\":{\"pad\":\"";
    let tail = b"\"}}}";
    let mut line = Vec::with_capacity(40 << 20);
    line.extend_from_slice(head);
    line.resize((40 << 20) - tail.len(), b'x');
    line.extend_from_slice(tail);
    assert_eq!(line.len(), 40 << 20);
    let resp = bad_line_then_ping(&mut b, &line);
    assert_error(&resp, -32600, Value::Null, "40 MiB line");
    let r = b.ok("files/read", json!({"path": "proj/f.txt"}));
    assert_eq!(r["content"], "small");
    let (status, rest) = b.finish();
    assert!(status.success());
    assert_eq!(rest, "");
}

#[test]
fn notifications_and_stray_responses_get_no_response() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    let silent: [&[u8]; 7] = [
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/cancelled\",\"params\":{\"requestId\":1}}\n",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}\n",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"no/such/notification\",\"params\":{}}\n",
        b"{\"jsonrpc\":\"2.0\",\"method\":\"files/read\",\"params\":{\"path\":\"proj/f.txt\"}}\n",
        // A response to a request the broker never sent.
        b"{\"jsonrpc\":\"2.0\",\"id\":77,\"result\":{}}\n",
        // Blank lines.
        b"\n   \n\r\n",
    ];
    for line in silent {
        b.send_raw(line);
        let id = b.send("ping", json!({}));
        let next = b.read_message();
        assert_eq!(
            next,
            json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            "after {:?}",
            String::from_utf8_lossy(line)
        );
    }
    // Whatever was still queued is flushed at EOF: there must be nothing.
    let (status, rest) = b.finish();
    assert!(status.success());
    assert_eq!(rest, "", "a notification or a stray response got an answer");
}

// ---------------------------------------------------------------------------------------------
// Concurrency, EOF, ids, stdout hygiene
// ---------------------------------------------------------------------------------------------

#[test]
fn two_hundred_requests_in_flight_each_answered_once() {
    let (_t, root) = fixture();
    for i in 0..10 {
        std::fs::write(root.join(format!("n{i}.txt")), format!("file {i}")).unwrap();
    }
    let mut b = Fsb::serve_root(&root);
    let mut sent: BTreeMap<u64, (String, Value)> = BTreeMap::new();
    for i in 0..200u64 {
        let (method, params) = match i % 4 {
            0 => ("ping", json!({})),
            1 => (
                "files/read",
                json!({"path": format!("proj/n{}.txt", i % 10)}),
            ),
            2 => ("roots/list", json!({})),
            _ => ("files/list", json!({"path": "proj", "limit": 2})),
        };
        let id = b.send(method, params.clone());
        sent.insert(id, (method.to_owned(), params));
    }
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let resp = b.read_message();
        let id = resp["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("bad id: {resp}"));
        assert!(seen.insert(id), "id {id} answered twice");
        let (method, params) = &sent[&id];
        let result = resp
            .get("result")
            .unwrap_or_else(|| panic!("{method} failed: {resp}"));
        match method.as_str() {
            "ping" => assert_eq!(result, &json!({})),
            "files/read" => {
                let path = params["path"].as_str().unwrap();
                let n = &path["proj/n".len()..path.len() - 4];
                assert_eq!(result["content"], format!("file {n}"));
            }
            "roots/list" => assert_eq!(result["roots"][0]["name"], "proj"),
            _ => {
                assert_eq!(result["entries"].as_array().unwrap().len(), 2);
                assert!(result["nextCursor"].is_string());
            }
        }
    }
    assert_eq!(seen.len(), 200);
    assert_eq!(seen, sent.keys().copied().collect());
    let (status, rest) = b.finish();
    assert!(status.success());
    assert_eq!(rest, "", "no extra responses");
}

#[test]
fn eof_finishes_requests_in_flight_and_exits_zero() {
    let (_t, root) = fixture();
    let big: String = (0..20_000).map(|i| format!("{i}\n")).collect();
    std::fs::write(root.join("big.txt"), &big).unwrap();
    let mut b = Fsb::serve_root(&root);
    let mut ids = BTreeSet::new();
    for i in 0..60 {
        let id = if i % 3 == 0 {
            b.send("files/list", json!({"path": "proj", "recursive": true}))
        } else {
            b.send("files/read", json!({"path": "proj/big.txt"}))
        };
        ids.insert(id);
    }
    // Close stdin at once; every response must still arrive.
    let (status, rest) = b.finish();
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(status.code(), Some(0));
    let mut seen = BTreeSet::new();
    for line in rest.lines() {
        let v: Value = serde_json::from_str(line).expect("every line is JSON");
        let id = v["id"].as_u64().unwrap();
        assert!(v.get("result").is_some(), "{line}");
        if let Some(content) = v["result"]["content"].as_str() {
            assert_eq!(content, big);
        }
        assert!(seen.insert(id), "id {id} twice");
    }
    assert!(rest.ends_with('\n') || rest.is_empty());
    assert_eq!(seen, ids);
}

#[test]
fn eof_with_nothing_sent_exits_zero() {
    let (_t, root) = fixture();
    let b = Fsb::serve_root(&root);
    let (status, rest) = b.finish();
    assert_eq!(status.code(), Some(0));
    assert_eq!(rest, "");
    // A last line without its newline is still answered.
    let (status, out, _) = run_with_input(
        &["serve", "--root", root.to_str().unwrap()],
        b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"}",
        &[],
    );
    assert_eq!(status.code(), Some(0));
    assert_eq!(out, "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{}}\n");
}

#[test]
fn ids_are_echoed_exactly() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    let ids = [
        "7",
        "\"7\"",
        "0",
        "-3",
        "9007199254740993",
        "18446744073709551615",
        "\"\"",
        "\"a\\\"b\\\\c\"",
        "\"é ✓ \\u00e9\"",
        "\"7 \"",
    ];
    for id in ids {
        for method in ["ping", "no/such/method", "files/read"] {
            let line = format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{{\"path\":\"proj/f.txt\"}}}}\n"
            );
            b.send_raw(line.as_bytes());
            let resp = b.read_message();
            let want = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},");
            assert!(
                b.last_raw.starts_with(&want),
                "id {id} not echoed byte for byte: {}",
                b.last_raw
            );
            let sent: Value = serde_json::from_str(id).unwrap();
            assert_eq!(resp["id"], sent);
        }
    }
    // `7` and `"7"` stay different.
    b.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":\"7\",\"method\":\"ping\"}\n");
    let r = b.read_message();
    assert_eq!(r["id"], json!("7"));
    assert_ne!(r["id"], json!(7));
    b.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}\n");
    let r = b.read_message();
    assert_eq!(r["id"], json!(7));
}

#[test]
fn stdout_carries_only_json_rpc_even_with_debug_logs() {
    let (_t, root) = fixture();
    let mut input = Vec::new();
    let lines = [
        r#"{"jsonrpc":"2.0","id":1,"method":"roots/list"}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"files/read","params":{"path":"proj/f.txt"}}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"files/list","params":{"path":"proj"}}"#,
        r#"{"jsonrpc":"2.0","id":4,"method":"files/read","params":{"path":"../../etc/passwd"}}"#,
        r#"{"jsonrpc":"2.0","id":5,"method":"files/read","params":{"path":"proj/missing"}}"#,
        r#"{"jsonrpc":"2.0","id":6,"method":"nope"}"#,
        "not json at all",
        r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
        r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#,
    ];
    for l in lines {
        input.extend_from_slice(l.as_bytes());
        input.push(b'\n');
    }
    for filter in ["debug", "trace", "fsbroker=trace"] {
        let (status, out, err) = run_with_input(
            &["serve", "--root", root.to_str().unwrap()],
            &input,
            &[("RUST_LOG", filter)],
        );
        assert_eq!(status.code(), Some(0), "{err}");
        let mut ids = BTreeSet::new();
        let mut count = 0;
        for line in out.split_inclusive('\n') {
            assert!(line.ends_with('\n'), "unterminated frame {line:?}");
            let v: Value = serde_json::from_str(line).unwrap_or_else(|e| {
                panic!("RUST_LOG={filter}: non-JSON on stdout ({e}): {line:?}")
            });
            assert_eq!(v["jsonrpc"], "2.0", "{line}");
            assert!(v.get("id").is_some(), "{line}");
            assert!(
                v.get("result").is_some() ^ v.get("error").is_some(),
                "{line}"
            );
            ids.insert(v["id"].to_string());
            count += 1;
        }
        // Responses to 1..=6 and 8, and the parse error (id null).
        assert_eq!(count, 8, "RUST_LOG={filter}: {out}");
        let want: BTreeSet<String> = ["1", "2", "3", "4", "5", "6", "8", "null"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(ids, want);
        assert!(!err.is_empty(), "RUST_LOG={filter}: the logs go to stderr");
        assert!(
            err.contains("DEBUG") || err.contains("TRACE"),
            "RUST_LOG={filter}: {err}"
        );
    }
}

//! `fsbroker proxy` through the real binary, with a small Python MCP server behind it
//! (docs/protocol.md §1.3, and §1.2 `--listen` / `proxy --connect`).
//!
//! The test plays the host: it writes raw lines to the proxy's stdin and reads raw lines from
//! its stdout. The Python server (written into a temp dir, see [`SERVER`]) logs every raw line
//! it receives, answers a few test tools, and sends `roots/list` and `files/*` requests to the
//! client on command, reporting the answers it got in tool results.
//!
//! One file though long: every test drives the proxy with the same small Python MCP server
//! behind it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::{OsStr, OsString};
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use common::fsb::{Cmd, Fsb, Listener, Log, Raw};
use common::procs::Pids;
use common::{PolicyToml, RootToml, tempdir, uri_path};

/// How long one expected line may take (debug builds, 20 MiB lines, a loaded CI machine).
const LINE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process may take to exit once it should.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// The MCP server behind the proxy. `argv[1]`: file that gets every raw line received;
/// `argv[2]`: JSON config:
/// - `early`: `{lines, bigLine, exit}`: write these lines (and one `bigLine`-byte line) and
///   exit with `exit` before reading anything;
/// - `rawAtStart`: hex-encoded byte lines written verbatim at start (non-JSON, bad UTF-8);
/// - `askAtStart` / `askOnInit`: requests sent to the client before reading anything / right
///   after answering `initialize` (before the host's `notifications/initialized`); the answers
///   are kept under "start" / "init" and returned by the `report` tool;
/// - `exitOnEof` / `signalOnEof`: what to do at end of input (after a `test/eof` notification).
///
/// Tools: `echo` (the raw request line), `ask` (send `arguments.requests` to the client, answer
/// with the responses once all are in), `report`, `seen` (the `n` of every `test/seq`
/// notification received), `burst` (n `test/seq` notifications to the host, with a
/// `roots/list` to the client every `every`), `raw` (write `arguments.lines` verbatim), `hash`
/// (sha256 and length of the raw request line), `big` (a `size`-byte response, then a
/// `test/bighash` notification with its sha256). Other requests get `{"raw": line}`.
const SERVER: &str = r#"
import hashlib, json, os, signal, sys

LOG = open(sys.argv[1], "ab", buffering=0)
CONFIG = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
out = sys.stdout.buffer
sys.stderr.write("pyserver: stderr marker 7f3a\n")
sys.stderr.flush()

def write(b):
    out.write(b)
    out.flush()

def send(obj):
    write(json.dumps(obj).encode() + b"\n")

def reply(mid, result):
    send({"jsonrpc": "2.0", "id": mid, "result": result})

early = CONFIG.get("early")
if early is not None:
    for line in early.get("lines", []):
        out.write(line.encode() + b"\n")
    n = early.get("bigLine", 0)
    if n:
        out.write(b"x" * n + b"\n")
    out.flush()
    os._exit(early.get("exit", 0))

for hexline in CONFIG.get("rawAtStart", []):
    write(bytes.fromhex(hexline) + b"\n")

counter = 0
pending = {}
buckets = {}

def ask(bucket, reqs, host=None):
    global counter
    buckets[bucket] = {"host": host, "results": [None] * len(reqs), "left": len(reqs)}
    if not reqs and host is not None:
        reply(host, {"results": []})
    for i, r in enumerate(reqs):
        counter += 1
        rid = "srv-%d" % counter
        pending[rid] = (bucket, i)
        msg = {"jsonrpc": "2.0", "id": rid, "method": r["method"]}
        if "params" in r:
            msg["params"] = r["params"]
        send(msg)

def answered(msg):
    bucket, i = pending.pop(msg["id"])
    b = buckets[bucket]
    b["results"][i] = {k: v for k, v in msg.items() if k in ("result", "error")}
    b["left"] -= 1
    if b["left"] == 0 and b["host"] is not None:
        reply(b["host"], {"results": b["results"]})

seen = []
if "askAtStart" in CONFIG:
    ask("start", CONFIG["askAtStart"])

while True:
    raw = sys.stdin.buffer.readline()
    if not raw:
        break
    LOG.write(raw if raw.endswith(b"\n") else raw + b"\n")
    line = raw.rstrip(b"\n")
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if not isinstance(msg, dict):
        continue
    method, mid = msg.get("method"), msg.get("id")
    if method is None:
        if mid in pending:
            answered(msg)
        continue
    if mid is None:
        if method == "test/seq":
            seen.append(msg["params"]["n"])
        continue
    if method == "initialize":
        reply(mid, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "pyserver", "version": "1.0"}})
        if "askOnInit" in CONFIG:
            ask("init", CONFIG["askOnInit"])
        continue
    if method != "tools/call":
        reply(mid, {"raw": line.decode("utf-8")})
        continue
    name = msg["params"]["name"]
    args = msg["params"].get("arguments", {})
    if name == "echo":
        reply(mid, {"raw": line.decode("utf-8")})
    elif name == "ask":
        ask("call-" + json.dumps(mid), args["requests"], host=mid)
    elif name == "report":
        reply(mid, {k: buckets.get(k) for k in ("start", "init")})
    elif name == "seen":
        reply(mid, {"seen": seen})
    elif name == "burst":
        every = args.get("every", 0)
        for i in range(args["n"]):
            send({"jsonrpc": "2.0", "method": "test/seq", "params": {"n": i}})
            if every and i % every == 0:
                ask("burst-%d" % i, [{"method": "roots/list"}])
        reply(mid, {"done": args["n"]})
    elif name == "raw":
        for s in args["lines"]:
            write(s.encode("utf-8") + b"\n")
        reply(mid, {"written": len(args["lines"])})
    elif name == "hash":
        reply(mid, {"sha256": hashlib.sha256(line).hexdigest(), "len": len(line)})
    elif name == "big":
        size = args["size"]
        data = "".join("%09d," % i for i in range(size // 10 + 1))[:size]
        big = json.dumps({"jsonrpc": "2.0", "id": mid, "result": {"data": data}}).encode()
        write(big + b"\n")
        send({"jsonrpc": "2.0", "method": "test/bighash",
              "params": {"sha256": hashlib.sha256(big).hexdigest(), "len": len(big)}})
    else:
        reply(mid, {"raw": line.decode("utf-8")})

send({"jsonrpc": "2.0", "method": "test/eof"})
if "signalOnEof" in CONFIG:
    os.kill(os.getpid(), CONFIG["signalOnEof"])
sys.exit(CONFIG.get("exitOnEof", 0))
"#;

/// A temp dir with a root `proj` (files `hello.txt`, `f0.txt`..`f49.txt`, `sub/deep.txt`), the
/// server script and its log.
struct Fixture {
    _t: tempfile::TempDir,
    dir: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let (t, dir) = tempdir();
        let proj = dir.join("proj");
        std::fs::create_dir_all(proj.join("sub")).unwrap();
        std::fs::write(proj.join("hello.txt"), "hello from the broker\n").unwrap();
        std::fs::write(proj.join("sub/deep.txt"), "deep\n").unwrap();
        for i in 0..50 {
            std::fs::write(proj.join(format!("f{i}.txt")), format!("file number {i}\n")).unwrap();
        }
        std::fs::write(dir.join("server.py"), SERVER).unwrap();
        Fixture { _t: t, dir }
    }

    fn proj(&self) -> PathBuf {
        self.dir.join("proj")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `fsbroker proxy --root proj --read-write -- python3 server.py LOG CONFIG`.
    fn proxy(&self, config: Value) -> Proxy {
        let root = self.proj();
        self.proxy_with(
            &[
                OsStr::new("--root"),
                root.as_os_str(),
                OsStr::new("--read-write"),
            ],
            "server.log",
            config,
        )
    }

    /// `fsbroker proxy BROKER_ARGS -- python3 server.py LOG CONFIG`.
    fn proxy_with(&self, broker_args: &[&OsStr], log: &str, config: Value) -> Proxy {
        let log = self.path(log);
        let mut args: Vec<OsString> = vec!["proxy".into()];
        args.extend(broker_args.iter().map(|a| a.to_os_string()));
        args.push("--".into());
        args.push("python3".into());
        args.push(self.path("server.py").into());
        args.push(log.clone().into());
        args.push(config.to_string().into());
        Proxy::spawn(&args, log)
    }
}

/// A running `fsbroker proxy`, seen from the host's side: the driver ([`Fsb`]: its output
/// read ahead and every line recorded, its stderr, which the server's is, kept) and the
/// server's log of raw lines received.
struct Proxy {
    b: Fsb,
    log: PathBuf,
}

impl Deref for Proxy {
    type Target = Fsb;
    fn deref(&self) -> &Fsb {
        &self.b
    }
}

impl DerefMut for Proxy {
    fn deref_mut(&mut self) -> &mut Fsb {
        &mut self.b
    }
}

impl Proxy {
    fn spawn(args: &[OsString], log: PathBuf) -> Proxy {
        let b = Cmd::new(args)
            .log(Log::Keep)
            .ahead()
            .record()
            .deadline(LINE_TIMEOUT)
            .spawn();
        Proxy { b, log }
    }

    /// The next raw line from the proxy's stdout (newline included; set-aside ones first),
    /// `None` at end of output.
    fn next_raw(&mut self) -> Option<Vec<u8>> {
        match self.b.next_line(LINE_TIMEOUT) {
            Raw::Line(l) => Some(l.raw),
            Raw::End { .. } => None,
            Raw::Timeout => panic!("no line from the proxy within {LINE_TIMEOUT:?}"),
        }
    }

    /// The response with this id; lines read on the way are set aside for
    /// [`Proxy::next_raw`].
    fn response(&mut self, id: &Value) -> Value {
        self.b.answer(id, LINE_TIMEOUT)
    }

    /// Sends a request and returns its response's `result`.
    fn call(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let resp = self.response(&id);
        assert!(resp.get("error").is_none(), "{method} failed: {resp}");
        resp["result"].clone()
    }

    fn tool(&mut self, id: Value, name: &str, arguments: Value) -> Value {
        self.call(
            id,
            "tools/call",
            json!({"name": name, "arguments": arguments}),
        )
    }

    /// The client's side of the handshake, with a host that declares no roots.
    fn initialize(&mut self) -> Value {
        let result = self.call(
            json!(0),
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "test-host", "version": "1.0"}
            }),
        );
        assert_eq!(result["serverInfo"]["name"], "pyserver");
        result
    }

    fn initialized(&mut self) {
        self.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    /// Lets the server ask the client `requests`; returns the responses it got.
    fn ask(&mut self, id: Value, requests: Value) -> Vec<Value> {
        let result = self.tool(id, "ask", json!({"requests": requests}));
        result["results"].as_array().expect("results").clone()
    }

    /// Waits for the proxy to exit (killing it and failing after [`EXIT_TIMEOUT`]).
    fn exit(&mut self) -> ExitStatus {
        match self.b.wait_exit(EXIT_TIMEOUT) {
            Some(status) => status,
            None => {
                self.b.kill_now();
                panic!("the proxy did not exit within {EXIT_TIMEOUT:?}");
            }
        }
    }

    /// Everything left on stdout until it closes.
    fn rest(&mut self) -> Vec<Vec<u8>> {
        let mut rest = Vec::new();
        while let Some(line) = self.next_raw() {
            rest.push(line);
        }
        rest
    }

    /// The proxy's stderr (which the server's stderr is), once the proxy has exited.
    fn stderr_text(&mut self) -> String {
        assert!(
            self.b.log_closed_within(EXIT_TIMEOUT),
            "the proxy's stderr still open {EXIT_TIMEOUT:?} after its exit"
        );
        self.b.log_text()
    }

    /// Every raw line the server received so far (newlines stripped).
    fn server_saw(&self) -> Vec<Vec<u8>> {
        let log = std::fs::read(&self.log).unwrap_or_default();
        log.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    }

    /// The host never saw a `roots/list` or `files/*` request: the broker answered them all.
    fn assert_host_saw_no_broker_traffic(&mut self) {
        for line in self.received() {
            let Ok(msg) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let method = msg["method"].as_str().unwrap_or("");
            assert!(
                method != "roots/list" && !method.starts_with("files/"),
                "the host saw a request meant for the broker: {msg}"
            );
            assert!(
                !msg["id"].as_str().unwrap_or("").starts_with("srv-"),
                "the host saw a message of the server's own requests: {msg}"
            );
        }
    }
}

/// The server's log without the broker's answers to the server's own requests (ids `srv-N`)
/// and without broker notifications: only what the host sent.
fn from_host(lines: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    lines
        .into_iter()
        .filter(|l| match serde_json::from_slice::<Value>(l) {
            Ok(m) => {
                !m["id"].as_str().unwrap_or("").starts_with("srv-")
                    && !m["method"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("notifications/roots/")
                    && !m["method"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("notifications/files/")
            }
            Err(_) => true,
        })
        .collect()
}

fn result_of(response: &Value) -> &Value {
    assert!(
        response.get("error").is_none(),
        "the broker refused: {response}"
    );
    &response["result"]
}

fn error_code(response: &Value) -> &str {
    response["error"]["data"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("expected an error with data.code: {response}"))
}

/// Polls `f` until it returns `Some`, for at most `limit`.
fn eventually<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// host → server

#[test]
fn initialize_declares_brokering_and_keeps_everything_else() {
    let fx = Fixture::new();
    let variants = [
        // A host with other capabilities and its own members in `roots`.
        json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {
                    "sampling": {},
                    "elicitation": {"form": {}},
                    "experimental": {"x": {"y": [1, 2]}},
                    "roots": {"listChanged": false, "futureThing": {"a": 1}}
                },
                "clientInfo": {"name": "test-host", "version": "1.0", "title": "T"},
                "_meta": {"k": "v"},
                "unknownParam": [null, true]
            },
            "extraTop": 123
        }),
        // A host that declares no roots.
        json!({
            "jsonrpc": "2.0", "id": "init", "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"sampling": {}},
                "clientInfo": {"name": "test-host", "version": "1.0"}
            }
        }),
        // No capabilities object at all.
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "clientInfo": {"name": "h", "version": "0"}}
        }),
    ];
    for (i, sent) in variants.into_iter().enumerate() {
        let log = format!("init{i}.log");
        let root = fx.proj();
        let mut p = fx.proxy_with(&[OsStr::new("--root"), root.as_os_str()], &log, json!({}));
        p.send_msg(&sent);
        let resp = p.response(&sent["id"]);
        assert_eq!(resp["result"]["serverInfo"]["name"], "pyserver");
        let saw = p.server_saw();
        let got: Value = serde_json::from_slice(&saw[0]).unwrap();
        let mut want = sent.clone();
        let host_roots = sent["params"]["capabilities"]["roots"].clone();
        let mut roots = host_roots.as_object().cloned().unwrap_or_default();
        roots.insert("listChanged".into(), json!(true));
        roots.insert("filesystemBrokering".into(), json!(true));
        want["params"]["capabilities"]["roots"] = Value::Object(roots);
        assert_eq!(got, want, "variant {i}: the server saw another initialize");
        assert_eq!(
            got["params"]["capabilities"]["roots"]["filesystemBrokering"],
            json!(true)
        );
        p.close_stdin();
        assert_eq!(p.exit().code(), Some(0));
    }
}

#[test]
fn host_messages_reach_the_server_byte_for_byte() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    // Odd spacing, key order, unknown fields, numbers written as they were, non-ASCII, a
    // response to a server request, notifications.
    let lines: [&str; 7] = [
        r#"  {"jsonrpc" : "2.0", "method":"notifications/initialized" ,"zz":{}}"#,
        r#"{"method":"tools/call","params":{"name":"echo","arguments":{"z":1,"a":[1, 2 ,3],"ü":"é\u00e9 😀"}},"id":"str-id","jsonrpc":"2.0","unknown":{"nested":null}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/custom","params":{"b":2,"a":1},"zzz":true}"#,
        r#"{"jsonrpc":"2.0","id":99,"result":{"answer":42,"x":[],"y":1.50e0}}"#,
        r#"{"jsonrpc":"2.0","id":7,"method":"resources/list","params":{}  ,"extra":1.50}"#,
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/list"}"#,
        r#"{"id":9,"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{},"name":"echo","_meta":{"progressToken":"t"}}}"#,
    ];
    for l in lines {
        p.send_raw(format!("{l}\n").as_bytes());
    }
    // The echoes carry the raw line as the server read it.
    for (id, line) in [
        (json!("str-id"), 1),
        (json!(7), 4),
        (json!(8), 5),
        (json!(9), 6),
    ] {
        let resp = p.response(&id);
        assert_eq!(resp["result"]["raw"], lines[line], "request {id}");
    }
    let saw = from_host(p.server_saw());
    let want: Vec<Vec<u8>> = lines.iter().map(|l| l.as_bytes().to_vec()).collect();
    assert_eq!(
        saw[1..]
            .iter()
            .map(|l| String::from_utf8_lossy(l))
            .collect::<Vec<_>>(),
        want.iter()
            .map(|l| String::from_utf8_lossy(l))
            .collect::<Vec<_>>()
    );
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// server → host

#[test]
fn server_messages_reach_the_host_byte_for_byte() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let lines = [
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"},"zz-unknown":[1,{"b":2,"a":1}]}"#,
        r#"{ "id" : "srv-host-1" , "method" : "sampling/createMessage" , "jsonrpc" : "2.0" , "params" : { "b" : 1 , "a" : 2 } }"#,
        r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":0.50,"total":1e2}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"héllo \u00e9 \ud83d\ude00 😀"}}"#,
        r#"{"result":{"tools":[],"unknown":{"deep":[true,false,null]}},"id":"not-a-host-request","jsonrpc":"2.0"}"#,
        r#"{"jsonrpc":"2.0","id":123,"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object"}}}"#,
    ];
    // (A `files/*` line, even a notification, is never the host's: `proxy_hostile.rs`.)
    let result = p.tool(json!("raw-1"), "raw", json!({"lines": lines}));
    assert_eq!(result["written"], json!(lines.len()));
    // The lines came before the tool result, in order, exactly as written.
    let got: Vec<String> = p.received()
        [p.received().len() - 1 - lines.len()..p.received().len() - 1]
        .iter()
        .map(|l| String::from_utf8(l.clone()).unwrap())
        .collect();
    let want: Vec<String> = lines.iter().map(|l| format!("{l}\n")).collect();
    assert_eq!(got, want);
    // The server's own response formatting (Python's ", " and ": ") is kept too.
    let last = String::from_utf8(p.received().last().unwrap().clone()).unwrap();
    assert_eq!(
        last,
        "{\"jsonrpc\": \"2.0\", \"id\": \"raw-1\", \"result\": {\"written\": 6}}\n"
    );
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn the_servers_cancellation_of_a_request_the_broker_took_stays_away_from_the_host() {
    // A server whose request to the client timed out on its side cancels it. When the broker
    // took that request, the host never saw it: the cancellation is not the host's either.
    // A cancellation of a request the host did get still reaches it.
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let results = p.ask(
        json!("ask-1"),
        json!([{"method": "files/read", "params": {"path": "proj/hello.txt"}}]),
    );
    assert!(results[0]["result"].is_object(), "{results:?}");
    let lines = [
        // The server's `ask` numbered that request srv-1; here it is spelled with an escape.
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"srv\u002d1","reason":"timed out"}}"#,
        r#"{"jsonrpc":"2.0","id":"host-q","method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"host-q"}}"#,
    ];
    let result = p.tool(json!("raw-1"), "raw", json!({"lines": lines}));
    assert_eq!(result["written"], json!(lines.len()));
    let cancels: Vec<Value> = p
        .received()
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|m| m["method"] == "notifications/cancelled")
        .collect();
    assert_eq!(
        cancels,
        vec![
            json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"host-q"}})
        ],
        "only the host's request's cancellation reaches it"
    );
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

/// The cancellation of [`the_servers_cancellation_of_a_request_the_broker_took_stays_away_from_the_host`]
/// with the id spelled as another number or as a string (`7.0`, `7e0`, `70e-1`, `"7"`, `" 7"`):
/// every reader of numbers as doubles takes `7.0` for `7`, and the Python SDK's
/// `coerce_request_id` takes `"7"` for it. It stays away from the host too (the relay used
/// to compare a JSON round trip of the id, in which `7.0` and `"7"` are not `7`).
#[test]
fn a_respelled_cancellation_of_a_request_the_broker_took_stays_away_from_the_host() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let mut lines = vec![r#"{"jsonrpc":"2.0","id":7,"method":"roots/list"}"#.to_owned()];
    for spelling in ["7", "7.0", "7e0", "70e-1", r#""7""#, r#"" 7""#] {
        lines.push(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{spelling}}}}}"#
        ));
    }
    // The host's own: a request of the server's it did get, then its cancellation.
    lines.push(r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#.to_owned());
    lines.push(
        r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":8}}"#
            .to_owned(),
    );
    let result = p.tool(json!("raw-1"), "raw", json!({"lines": lines}));
    assert_eq!(result["written"], json!(lines.len()));
    let cancels: Vec<Value> = p
        .received()
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|m| m["method"] == "notifications/cancelled")
        .map(|m| m["params"]["requestId"].clone())
        .collect();
    assert_eq!(
        cancels,
        vec![json!(8)],
        "only the host's request's cancellation reaches it"
    );
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn server_writing_non_json_is_relayed_verbatim() {
    let fx = Fixture::new();
    let raw: Vec<&[u8]> = vec![
        b"hello, this is not JSON",
        b"{\"unterminated\": ",
        b"[1,2,3]",
        b"\xff\xfe invalid UTF-8 \xc3\x28",
        b"   ",
    ];
    let hex: Vec<String> = raw
        .iter()
        .map(|l| l.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let mut p = fx.proxy(json!({"rawAtStart": hex}));
    let mut got = Vec::new();
    for _ in 0..raw.len() {
        got.push(p.next_raw().expect("a line"));
    }
    let want: Vec<Vec<u8>> = raw.iter().map(|l| [*l, b"\n"].concat()).collect();
    assert_eq!(got, want);
    // And the session goes on.
    p.initialize();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// The broker answers the server

fn roots_of(result: &Value) -> Vec<(String, String)> {
    result["roots"]
        .as_array()
        .expect("roots")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["uri"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn server_requests_are_answered_by_the_broker_even_before_initialized() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({
        // Before reading anything, even the host's initialize.
        "askAtStart": [{"method": "roots/list"}, {"method": "files/read", "params": {"path": "proj/hello.txt"}}],
        // Right after answering initialize: before the host's notifications/initialized.
        "askOnInit": [
            {"method": "roots/list"},
            {"method": "files/list", "params": {"path": "proj/sub"}},
            {"method": "files/read", "params": {"path": "proj/sub/deep.txt"}},
            {"method": "files/nonsense"}
        ]
    }));
    p.initialize();
    // The host holds back notifications/initialized until the broker has answered both sets.
    let mut n = 0;
    let report = eventually(Duration::from_secs(20), "the broker's answers", || {
        n += 1;
        let r = p.tool(json!(format!("report-{n}")), "report", json!({}));
        (r["start"]["left"] == json!(0) && r["init"]["left"] == json!(0)).then_some(r)
    });
    let uri = format!("file://{}", uri_path(&fx.proj()));
    let start = report["start"]["results"].as_array().unwrap();
    assert_eq!(
        roots_of(result_of(&start[0])),
        vec![("proj".to_owned(), uri.clone())]
    );
    assert_eq!(result_of(&start[1])["content"], "hello from the broker\n");
    let init = report["init"]["results"].as_array().unwrap();
    assert_eq!(
        roots_of(result_of(&init[0])),
        vec![("proj".to_owned(), uri)]
    );
    let entries = result_of(&init[1])["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["path"], "proj/sub/deep.txt");
    assert_eq!(result_of(&init[2])["content"], "deep\n");
    assert_eq!(init[3]["error"]["code"], json!(-32601), "{}", init[3]);
    p.initialized();
    // And after the handshake.
    let after = p.ask(
        json!(50),
        json!([{"method": "files/read", "params": {"path": "proj/f7.txt"}}]),
    );
    assert_eq!(result_of(&after[0])["content"], "file number 7\n");
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn server_requests_interleaved_with_host_requests_in_flight() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    for round in 0..5 {
        let reqs: Vec<Value> = (0..50)
            .map(|i| json!({"method": "files/read", "params": {"path": format!("proj/f{i}.txt")}}))
            .collect();
        let ask_id = json!(format!("ask-{round}"));
        p.send_msg(
            &json!({"jsonrpc": "2.0", "id": ask_id, "method": "tools/call",
            "params": {"name": "ask", "arguments": {"requests": reqs}}}),
        );
        // While the server's 50 requests are with the broker, the host fires its own.
        for i in 0..100 {
            p.send_msg(
                &json!({"jsonrpc": "2.0", "id": round * 1000 + i, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"i": i}}}),
            );
        }
        for i in 0..100 {
            let resp = p.response(&json!(round * 1000 + i));
            let raw: Value = serde_json::from_str(resp["result"]["raw"].as_str().unwrap()).unwrap();
            assert_eq!(raw["params"]["arguments"]["i"], json!(i));
        }
        let resp = p.response(&ask_id);
        let results = resp["result"]["results"].as_array().unwrap();
        assert_eq!(results.len(), 50);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(result_of(r)["content"], format!("file number {i}\n"));
        }
    }
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn two_hundred_server_requests_at_once() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let reqs: Vec<Value> = (0..200)
        .map(|i| match i % 4 {
            0 => json!({"method": "roots/list"}),
            1 => json!({"method": "files/list", "params": {"path": "proj/sub"}}),
            _ => {
                json!({"method": "files/read", "params": {"path": format!("proj/f{}.txt", i % 50)}})
            }
        })
        .collect();
    let results = p.ask(json!("many"), json!(reqs));
    assert_eq!(results.len(), 200);
    for (i, r) in results.iter().enumerate() {
        let r = result_of(r);
        match i % 4 {
            0 => assert_eq!(r["roots"][0]["name"], "proj"),
            1 => assert_eq!(r["entries"][0]["path"], "proj/sub/deep.txt"),
            _ => assert_eq!(r["content"], format!("file number {}\n", i % 50)),
        }
    }
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn order_is_kept_in_each_direction() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    const N: u64 = 2000;
    // The server sends N numbered notifications to the host, with a roots/list to the broker
    // every 10 (the broker's answers join the host's messages on the server's stdin), while
    // the host sends N numbered notifications to the server.
    p.send_msg(
        &json!({"jsonrpc": "2.0", "id": "burst", "method": "tools/call",
        "params": {"name": "burst", "arguments": {"n": N, "every": 10}}}),
    );
    let mut batch = Vec::new();
    for n in 0..N {
        let msg = json!({"jsonrpc": "2.0", "method": "test/seq", "params": {"n": n}});
        batch.extend(serde_json::to_vec(&msg).unwrap());
        batch.push(b'\n');
        if n % 50 == 49 {
            p.send_raw(&batch);
            batch.clear();
        }
    }
    p.send_raw(&batch);
    let done = p.response(&json!("burst"));
    assert_eq!(done["result"]["done"], json!(N));
    let seqs: Vec<u64> = p
        .received()
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|m| m["method"] == "test/seq")
        .map(|m| m["params"]["n"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "server → host order");
    let seen = p.tool(json!("seen"), "seen", json!({}));
    let seen: Vec<u64> = serde_json::from_value(seen["seen"].clone()).unwrap();
    assert_eq!(seen, (0..N).collect::<Vec<_>>(), "host → server order");
    p.assert_host_saw_no_broker_traffic();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Large messages

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Printable, varied, deterministic: corruption or truncation anywhere changes the hash.
fn varied_text(len: usize) -> String {
    let mut rng = common::kit::Rng::new(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| (b'a' + rng.below(26) as u8) as char)
        .collect()
}

#[test]
fn twenty_mib_messages_are_relayed_intact_both_ways() {
    const SIZE: usize = 20 << 20;
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();

    // Host → server.
    let msg = json!({"jsonrpc": "2.0", "id": "up", "method": "tools/call",
        "params": {"name": "hash", "arguments": {"data": varied_text(SIZE)}}});
    let line = serde_json::to_vec(&msg).unwrap();
    assert!(line.len() > SIZE);
    let mut framed = line.clone();
    framed.push(b'\n');
    p.send_raw(&framed);
    let resp = p.response(&json!("up"));
    assert_eq!(resp["result"]["len"], json!(line.len()));
    assert_eq!(
        resp["result"]["sha256"].as_str().unwrap(),
        sha256_hex(&line)
    );

    // Server → host: a 20 MiB response, then a notification with its hash.
    p.send_msg(
        &json!({"jsonrpc": "2.0", "id": "down", "method": "tools/call",
        "params": {"name": "big", "arguments": {"size": SIZE}}}),
    );
    let big = loop {
        let line = p.next_raw().expect("the big response");
        if line.len() > SIZE {
            break line;
        }
    };
    let note = p.next_raw().expect("the hash notification");
    let note: Value = serde_json::from_slice(&note).unwrap();
    assert_eq!(note["method"], "test/bighash");
    let body = &big[..big.len() - 1];
    assert_eq!(big.last(), Some(&b'\n'));
    assert_eq!(note["params"]["len"], json!(body.len()));
    assert_eq!(note["params"]["sha256"].as_str().unwrap(), sha256_hex(body));
    let parsed: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(parsed["id"], "down");
    assert_eq!(parsed["result"]["data"].as_str().unwrap().len(), SIZE);
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// Exit codes and either side closing

#[test]
fn exit_code_is_the_servers() {
    let fx = Fixture::new();
    for (config, want) in [
        (json!({"exitOnEof": 0}), 0),
        (json!({"exitOnEof": 3}), 3),
        (json!({"exitOnEof": 42}), 42),
        (json!({"signalOnEof": 9}), 128 + 9),
        (json!({"signalOnEof": 15}), 128 + 15),
    ] {
        let mut p = fx.proxy(config.clone());
        p.initialize();
        p.close_stdin();
        let status = p.exit();
        assert_eq!(status.code(), Some(want), "{config}: {status:?}");
    }
}

#[test]
fn host_closing_stdin_ends_the_server_and_the_proxy() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({"exitOnEof": 3}));
    p.initialize();
    p.initialized();
    p.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/last"}));
    p.close_stdin();
    // The server saw EOF (it says so after reading everything), the proxy relayed what the
    // server wrote after that, and exits with the server's code.
    let rest = p.rest();
    let last: Value = serde_json::from_slice(rest.last().expect("test/eof")).unwrap();
    assert_eq!(last["method"], "test/eof");
    assert_eq!(p.exit().code(), Some(3));
    let saw = p.server_saw();
    let last_seen: Value = serde_json::from_slice(saw.last().unwrap()).unwrap();
    assert_eq!(last_seen["method"], "notifications/last");
}

#[test]
fn server_exiting_early_ends_the_proxy_and_the_host_gets_everything() {
    let fx = Fixture::new();
    let lines = [
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"bye"}}"#,
        "not json at all",
        r#"{"jsonrpc":"2.0","id":"srv-x","method":"sampling/createMessage","params":{}}"#,
    ];
    let big = 3 << 20;
    let mut p = fx.proxy(json!({"early": {"lines": lines, "bigLine": big, "exit": 5}}));
    // The host keeps its stdin open: the proxy must not wait for it.
    let status = p.exit();
    assert_eq!(status.code(), Some(5), "{status:?}");
    let got = p.rest();
    assert_eq!(got.len(), lines.len() + 1, "lines: {}", got.len());
    for (g, l) in got.iter().zip(lines) {
        assert_eq!(g, format!("{l}\n").as_bytes());
    }
    assert_eq!(got[3].len(), big + 1);
    assert!(got[3][..big].iter().all(|&b| b == b'x'));
}

#[test]
fn host_writing_after_the_server_exited() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({"early": {"lines": ["{}"], "exit": 4}}));
    assert_eq!(p.next_raw().as_deref(), Some(&b"{}\n"[..]));
    std::thread::sleep(Duration::from_millis(300));
    // The host writes to a proxy whose server is gone: no crash (SIGPIPE), no other exit code.
    for i in 0..20 {
        let msg = json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"});
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        if p.try_send_raw(&line).is_err() {
            break;
        }
    }
    assert_eq!(p.exit().code(), Some(4));
}

#[test]
fn servers_stderr_passes_through() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
    let err = p.stderr_text();
    assert!(
        err.contains("pyserver: stderr marker 7f3a"),
        "stderr: {err:?}"
    );
    // And nothing of the server's stderr leaked to stdout.
    for line in p.received() {
        assert!(!String::from_utf8_lossy(line).contains("stderr marker"));
    }
}

// ---------------------------------------------------------------------------------------------
// Broker notifications to the server

#[test]
fn roots_list_changed_reaches_the_server_when_the_policy_changes() {
    let fx = Fixture::new();
    let other = fx.path("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("o.txt"), "other\n").unwrap();
    let one = PolicyToml::new().root(RootToml::at(&fx.proj()));
    let policy = one.write_to(&fx.path("policy.toml"));
    let mut p = fx.proxy_with(
        &[OsStr::new("--policy"), policy.as_os_str()],
        "server.log",
        json!({}),
    );
    p.initialize();
    p.initialized();
    let before = p.ask(json!(1), json!([{"method": "roots/list"}]));
    assert_eq!(roots_of(result_of(&before[0])).len(), 1);

    // An editor's save: a new file renamed over the policy.
    let tmp = one
        .root(RootToml::at(&other))
        .write_to(&fx.path("policy.toml.new"));
    std::fs::rename(&tmp, &policy).unwrap();

    eventually(
        Duration::from_secs(10),
        "notifications/roots/list_changed",
        || {
            p.server_saw()
                .iter()
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                .any(|m| m["method"] == "notifications/roots/list_changed" && m.get("id").is_none())
                .then_some(())
        },
    );
    let after = p.ask(
        json!(2),
        json!([{"method": "roots/list"}, {"method": "files/read", "params": {"path": "other/o.txt"}}]),
    );
    let names: Vec<String> = roots_of(result_of(&after[0]))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["proj", "other"]);
    assert_eq!(result_of(&after[1])["content"], "other\n");
    // The host never sees the broker's notification (it goes to the server only).
    for line in p.received() {
        assert!(!String::from_utf8_lossy(line).contains("list_changed"));
    }
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

#[test]
fn file_watches_notify_the_server_through_the_proxy() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let r = p.ask(
        json!(1),
        json!([{"method": "files/watch", "params": {"path": "proj"}}]),
    );
    let watch_id = result_of(&r[0])["watchId"].clone();
    std::fs::write(fx.proj().join("new.txt"), "new\n").unwrap();
    eventually(
        Duration::from_secs(10),
        "notifications/files/changed",
        || {
            p.server_saw()
                .iter()
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                .find(|m| {
                    m["method"] == "notifications/files/changed"
                        && m["params"]["path"] == "proj/new.txt"
                        && m["params"]["watchId"] == watch_id
                })
        },
    );
    for line in p.received() {
        assert!(!String::from_utf8_lossy(line).contains("files/changed"));
    }
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

/// The integrity extension (docs/protocol.md, 5.13) for a server behind the proxy: its read
/// with `"sha256": true` and its `files/checksum` give `sha256sum` of the file; its upload
/// whose final chunk carries the hash of other bytes is `CHECKSUM_MISMATCH` with nothing
/// written, and the same upload with the hash of what it sent commits.
#[test]
fn the_integrity_extension_works_for_a_proxied_server() {
    let fx = Fixture::new();
    let mut p = fx.proxy(json!({}));
    p.initialize();
    p.initialized();
    let hello = sha256_hex(b"hello from the broker\n");
    let r = p.ask(
        json!(1),
        json!([
            {"method": "files/read", "params": {"path": "proj/hello.txt", "sha256": true}},
            {"method": "files/checksum", "params": {"path": "proj/hello.txt"}},
        ]),
    );
    assert_eq!(result_of(&r[0])["sha256"], hello, "{r:?}");
    assert_eq!(result_of(&r[1])["sha256"], hello, "{r:?}");

    let (first, second) = ("first chunk, ", "second chunk");
    let whole = format!("{first}{second}");
    let upload = |sha: &str| {
        json!([
            {"method": "files/write", "params": {"path": "proj/up.txt", "content": first,
                                                 "offset": 0, "final": false, "sha256": true}},
            {"method": "files/write", "params": {"path": "proj/up.txt", "content": second,
                                                 "offset": first.len(), "final": true,
                                                 "sha256": sha}},
        ])
    };
    let r = p.ask(json!(2), upload(&sha256_hex(b"other bytes")));
    result_of(&r[0]);
    assert_eq!(error_code(&r[1]), "CHECKSUM_MISMATCH", "{r:?}");
    assert!(
        !fx.proj().join("up.txt").exists(),
        "a mismatched upload wrote its file"
    );
    let right = sha256_hex(whole.as_bytes());
    let r = p.ask(json!(3), upload(&right));
    assert_eq!(result_of(&r[1])["sha256"], right.as_str(), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(fx.proj().join("up.txt")).unwrap(),
        whole
    );
    p.close_stdin();
    assert_eq!(p.exit().code(), Some(0));
}

// ---------------------------------------------------------------------------------------------
// A shared broker: serve --listen + proxy --connect

/// A shared broker over the fixture's project, read-write.
fn shared_broker(fx: &Fixture) -> Listener {
    let policy = PolicyToml::new()
        .root(RootToml::at(&fx.proj()).rw())
        .write_to(&fx.path("shared.toml"));
    Listener::start(&policy, &fx.path("broker.sock"), &[], &Pids::default())
}

/// `fsbroker proxy --connect SOCK` in front of the fixture's server.
fn connect(broker: &Listener, fx: &Fixture, log: &str) -> Proxy {
    fx.proxy_with(
        &[OsStr::new("--connect"), broker.sock.as_os_str()],
        log,
        json!({}),
    )
}

#[test]
fn shared_broker_coordinates_locks_across_servers() {
    let fx = Fixture::new();
    let mut broker = shared_broker(&fx);

    let meta = std::fs::symlink_metadata(&broker.sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "socket mode {:o}",
        meta.permissions().mode()
    );

    let mut a = connect(&broker, &fx, "a.log");
    let mut b = connect(&broker, &fx, "b.log");
    a.initialize();
    a.initialized();
    b.initialize();
    b.initialized();

    // Server A writes and keeps the lock.
    let r = a.ask(
        json!(1),
        json!([{"method": "files/write",
            "params": {"path": "proj/shared.txt", "content": "from A", "keepLocked": true}}]),
    );
    let lock_id = result_of(&r[0])["lockId"]
        .as_str()
        .expect("lockId")
        .to_owned();

    // Server B, another session of the same broker, is refused.
    let r = b.ask(
        json!(1),
        json!([
            {"method": "files/write", "params": {"path": "proj/shared.txt", "content": "from B"}},
            {"method": "files/read", "params": {"path": "proj/shared.txt"}},
            {"method": "files/unlock", "params": {"lockId": lock_id}}
        ]),
    );
    assert_eq!(error_code(&r[0]), "FILE_LOCKED", "{}", r[0]);
    assert!(
        !r[0].to_string().contains(&lock_id),
        "lockId leaked: {}",
        r[0]
    );
    assert_eq!(error_code(&r[1]), "FILE_LOCKED", "{}", r[1]);
    assert!(r[2].get("error").is_some(), "B unlocked A's lock: {}", r[2]);
    assert_eq!(
        std::fs::read_to_string(fx.proj().join("shared.txt")).unwrap(),
        "from A"
    );

    // A lets go; B's write goes through.
    let r = a.ask(
        json!(2),
        json!([{"method": "files/unlock", "params": {"lockId": lock_id}}]),
    );
    result_of(&r[0]);
    let r = b.ask(
        json!(2),
        json!([{"method": "files/write", "params": {"path": "proj/shared.txt", "content": "from B"}}]),
    );
    result_of(&r[0]);
    assert_eq!(
        std::fs::read_to_string(fx.proj().join("shared.txt")).unwrap(),
        "from B"
    );

    // A kept lock ends with its session: A locks again, A's proxy ends, B can write.
    let r = a.ask(
        json!(3),
        json!([{"method": "files/write",
            "params": {"path": "proj/shared.txt", "content": "A again", "keepLocked": true}}]),
    );
    result_of(&r[0]);
    a.close_stdin();
    assert_eq!(a.exit().code(), Some(0));
    let mut n = 10;
    eventually(Duration::from_secs(10), "A's lock released", || {
        n += 1;
        let r = b.ask(
            json!(n),
            json!([{"method": "files/write", "params": {"path": "proj/shared.txt", "content": "B last"}}]),
        );
        r[0].get("result").map(|_| ())
    });
    b.assert_host_saw_no_broker_traffic();
    a.assert_host_saw_no_broker_traffic();

    // SIGTERM (with B still connected) ends the broker and removes the socket.
    let status = broker.terminate(EXIT_TIMEOUT);
    assert!(status.success(), "{status:?}");
    assert!(
        std::fs::symlink_metadata(&broker.sock).is_err(),
        "the socket file was left behind"
    );
    b.close_stdin();
    assert_eq!(b.exit().code(), Some(0));
}

#[test]
fn connecting_to_a_missing_socket_fails_clearly() {
    let fx = Fixture::new();
    let sock = fx.path("no-such.sock");
    let mut p = fx.proxy_with(
        &[OsStr::new("--connect"), sock.as_os_str()],
        "server.log",
        json!({}),
    );
    let status = p.exit();
    assert!(!status.success(), "{status:?}");
    assert!(status.signal().is_none(), "{status:?}");
    let err = p.stderr_text();
    assert!(
        err.contains("cannot connect to") && err.contains(sock.to_str().unwrap()),
        "stderr: {err:?}"
    );
}

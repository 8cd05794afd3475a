//! What a server can make the broker record.
//!
//! - `notifications/fsbroker/peer`, the note a proxy sends a shared broker about the server
//!   behind it (its name, its MCP era, its sandbox), is taken only from a proxy's link. A
//!   server talking to `serve` on stdio, or connecting to a shared broker's socket itself,
//!   cannot write `confine` records, name itself, switch its era, or grow the log with it,
//!   however large or frequent its notes.
//! - Requests refused over the session's request rate get one line a second, counting the
//!   rest (`alsoRefused`): a flood cannot grow the log faster than the rate allows.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::audit::{log_lines, verify_files};
use common::fsb::{Cmd, Listener, Raw};
use common::policy::{PolicyToml, RootToml};
use common::procs::Pids;
use common::{Fsb, python, tempdir};
use serde_json::{Value, json};

/// A forged note: a name, an era, and a `confinement` object of `pad` bytes, with `key` if
/// given (a guess at the socket's key).
fn forged(pad: usize, key: Option<&str>) -> Vec<u8> {
    let mut params = json!({
        "name": "FORGED-NAME",
        "protocolVersion": "2026-07-28",
        "confinement": { "mode": "strict", "enforced": true, "forged": "x".repeat(pad) },
    });
    if let Some(k) = key {
        params["key"] = json!(k);
    }
    let mut line = serde_json::to_vec(&json!({
        "jsonrpc": "2.0",
        "method": "notifications/fsbroker/peer",
        "params": params,
    }))
    .unwrap();
    line.push(b'\n');
    line
}

/// A root `r` holding `f.txt`, audited, 5 requests a second: (temp dir, its path, the policy,
/// the log).
fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (t, dir) = tempdir();
    let root = dir.join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "hi").unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("r"))
        .table("limits", "requests_per_second = 5\nrequest_burst = 5\n")
        .table("audit", "path = \"audit.jsonl\"\n")
        .write_to(&dir.join("policy.toml"));
    let log = dir.join("audit.jsonl");
    (t, dir, policy, log)
}

/// `fsbroker serve --policy POLICY`, its answers waited for a minute at most.
fn serve(policy: &Path) -> Fsb {
    Fsb::start(
        &["serve", "--policy", policy.to_str().unwrap()],
        Duration::from_secs(60),
    )
}

/// What the log holds, after the broker has ended (and sealed it).
fn check_log(log: &Path) {
    let lines = log_lines(log);
    for line in &lines {
        assert!(
            line.len() < 8192,
            "a line of {} bytes was written",
            line.len()
        );
        let v: Value = serde_json::from_str(line).unwrap();
        assert_ne!(v["event"], "confine", "a forged confine record: {line}");
        assert!(
            !line.contains("FORGED"),
            "a forged name reached the log: {line}"
        );
    }
    let (code, out) = verify_files(&[log], &[]);
    assert_eq!(code, 0, "{out}");
}

/// Rule: a plain `serve` peer is the server itself: its notes are dropped, whatever their size
/// or number, and change neither its name nor its era.
#[test]
fn a_serve_peer_cannot_write_records_or_name_itself() {
    let (_t, _dir, policy, log) = setup();
    let mut b = serve(&policy);
    // One note of 4 MiB (it was once written whole, and broke `audit verify`), then a flood
    // far past the request rate (5 per second), some with a guessed key.
    b.send_raw(&forged(4 << 20, None));
    for i in 0..300 {
        let key = (i % 2 == 0).then_some("00".repeat(32));
        b.send_raw(&forged(1024, key.as_deref()));
    }
    // The era did not change: a 2025-era result has no `resultType`.
    let list = b.ok("files/list", json!({"path": "r"}));
    assert!(
        list.get("resultType").is_none(),
        "the era was switched: {list}"
    );
    b.close_stdin();
    b.wait_exit(Duration::from_secs(20)).expect("serve exits");
    let text = b.log_text();
    assert!(
        text.contains("ignoring a notifications/fsbroker/peer"),
        "the refusal is logged: {text}"
    );
    check_log(&log);
    let size = std::fs::metadata(&log).unwrap().len();
    assert!(size < 64 << 10, "the notes grew the log to {size} bytes");
}

/// Rule: on a shared broker, a connection that is not a proxy's (it has not the socket's key)
/// cannot write records or name itself either; the session's own requests are recorded
/// without the forged name.
#[test]
fn a_socket_peer_without_the_key_cannot_write_records() {
    let (_t, dir, policy, log) = setup();
    let pids = Pids::default();
    let sock = dir.join("b.sock");
    let mut listener = Listener::start(&policy, &sock, &[], &pids);
    let mut c = listener.connect();
    c.send_raw(&forged(4 << 20, None));
    for i in 0..300 {
        let key = (i % 2 == 0).then_some("ab".repeat(32));
        c.send_raw(&forged(512, key.as_deref()));
    }
    let read = c.ok("files/read", json!({"path": "r/f.txt"}));
    assert_eq!(read["content"], "hi");
    drop(c);
    listener.terminate(Duration::from_secs(20));
    check_log(&log);
    let reads: Vec<Value> = log_lines(&log)
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["method"] == "files/read")
        .collect();
    assert_eq!(reads.len(), 1, "{reads:?}");
    assert!(reads[0].get("server").is_none(), "{:?}", reads[0]);
}

/// Rule: a flood of requests over the session's rate cannot grow the log faster than the
/// rate: refusals get one line a second, which counts those folded into it (`alsoRefused`).
/// Each refused `files/consent` here names 16 paths of 4000 bytes (about 64 KiB a line):
/// before, every refusal wrote such a line.
#[test]
fn refusals_over_the_rate_get_one_line_a_second() {
    let (_t, _dir, policy, log) = setup();
    let mut b = serve(&policy);
    let paths: Vec<String> = (0..16)
        .map(|i| format!("r/{i}{}", "p".repeat(4000)))
        .collect();
    let started = std::time::Instant::now();
    let sent = 2000;
    let mut ids = Vec::new();
    for _ in 0..sent {
        ids.push(b.send(
            "files/consent",
            json!({"requestedPaths": paths, "message": "m"}),
        ));
    }
    let mut refused = 0u64;
    for id in ids {
        let answer = b.response(id);
        if answer["error"]["data"]["code"] == "RATE_LIMITED" {
            refused += 1;
        }
    }
    let secs = started.elapsed().as_secs() + 2;
    b.close_stdin();
    b.wait_exit(Duration::from_secs(20)).expect("serve exits");
    assert!(
        refused > 1000,
        "only {refused} of {sent} were over the rate"
    );
    let lines: Vec<Value> = log_lines(&log)
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect();
    let limited: Vec<&Value> = lines
        .iter()
        .filter(|v| v["outcome"] == "RATE_LIMITED")
        .collect();
    let folded: u64 = limited
        .iter()
        .map(|v| v["alsoRefused"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        (limited.len() as u64) <= secs,
        "{} lines for refusals over {secs} s",
        limited.len()
    );
    assert!(!limited.is_empty() && limited.len() as u64 + folded <= refused);
    let size = std::fs::metadata(&log).unwrap().len();
    // What the rate lets through (a burst of 5, then 5 a second), one refusal line a second,
    // and the broker's own few lines, each at most about 70 KB.
    let bound = (5 + 5 * secs + secs + 4) * 70_000;
    assert!(
        size < bound,
        "the log grew to {size} bytes in {secs} s (bound {bound})"
    );
    let (code, out) = verify_files(&[&log], &[]);
    assert_eq!(code, 0, "{out}");
}

/// Rule: a request's line stays small whatever its strings hold: each is cut at 4 KiB as
/// written (a control character takes six bytes escaped), and consent paths at 16 KiB in all.
/// Before, 4,096 U+0001 characters in each of `path`, `newPath` and 16 `requestedPaths` of an
/// unknown `files/` method made one line of 444,234 bytes.
#[test]
fn a_request_line_is_small_whatever_its_strings_hold() {
    let (_t, _dir, policy, log) = setup();
    let mut b = serve(&policy);
    let nasty = "\u{1}".repeat(4096);
    let method = format!("files/{}", "\u{1}".repeat(4096));
    for m in [method.as_str(), "files/consent", "files/rename"] {
        b.request(
            m,
            json!({"path": nasty, "oldPath": nasty, "newPath": nasty,
                   "requestedPaths": vec![nasty.clone(); 16]}),
        );
    }
    b.close_stdin();
    b.wait_exit(Duration::from_secs(20)).expect("serve exits");
    let lines = log_lines(&log);
    let longest = lines.iter().map(String::len).max().unwrap();
    assert!(longest < 40_000, "a line of {longest} bytes");
    let cut: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v.get("method").is_some())
        .collect();
    assert_eq!(cut.len(), 3, "{cut:?}");
    for v in &cut {
        assert_eq!(v["pathBytes"], 4096, "the full length is kept: {v}");
        assert!(v["pathDigest"].is_string(), "{v}");
    }
    let consent = cut.iter().find(|v| v["method"] == "files/consent").unwrap();
    assert_eq!(consent["pathsCount"], 16, "{consent}");
    let (code, out) = verify_files(&[&log], &[]);
    assert_eq!(code, 0, "{out}");
}

/// How long a late-named server's run may take.
const LATE_NAME_DEADLINE: Duration = Duration::from_secs(60);

/// Approves every requested path, after 2 s (a person taking their time).
const SLOW_CONSENT_PY: &str = r#"
import json, sys, time
data = sys.stdin.buffer.read()
time.sleep(2)
print(json.dumps({"approvedPaths": json.loads(data)["requestedPaths"]}))
"#;

/// Asks `files/consent` first, and only then answers `initialize` as `late-named-server`.
const LATE_NAMED_PY: &str = r#"
import json, sys, time
out = sys.stdout.buffer
def send(o):
    out.write(json.dumps(o).encode() + b"\n")
    out.flush()
while True:
    raw = sys.stdin.buffer.readline()
    if not raw:
        break
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    if not isinstance(msg, dict):
        continue
    if msg.get("method") == "initialize" and "id" in msg:
        send({"jsonrpc": "2.0", "id": "srv-consent", "method": "files/consent",
              "params": {"message": "review", "requestedPaths": ["r/doc.txt"]}})
        time.sleep(0.7)
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "serverInfo": {"name": "late-named-server", "version": "1.0"}}})
    elif msg.get("id") == "srv-consent" and "method" not in msg:
        send({"jsonrpc": "2.0", "method": "test/consent", "params": msg})
"#;

fn wait_for(p: &mut Fsb, limit: Duration, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match p.next_line(left) {
            Raw::Line(l) => match l.json {
                Some(m) if want(&m) => return m,
                _ => {}
            },
            Raw::Timeout => panic!("no {what} within {limit:?}"),
            Raw::End { .. } => panic!("the proxy closed its output before {what}"),
        }
    }
}

fn consent_line_of_a_late_named_server(connect: bool) -> Value {
    let pids = Pids::default();
    common::procs::within(LATE_NAME_DEADLINE, &pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("doc.txt"), "doc\n").unwrap();
        let consent = dir.join("consent.py");
        std::fs::write(&consent, SLOW_CONSENT_PY).unwrap();
        let log = dir.join("audit.jsonl");
        let policy = PolicyToml::new()
            .root(RootToml::at(&root).name("r").consent("prompt"))
            .consent_command(&[Path::new(python()), &consent], "timeout_ms = 20000")
            .audit(&log, "")
            .write_to(&dir.join("policy.toml"));
        let server = dir.join("late.py");
        std::fs::write(&server, LATE_NAMED_PY).unwrap();
        let listener;
        let mut args: Vec<OsString> = vec!["proxy".into()];
        if connect {
            listener = Some(Listener::start(&policy, &dir.join("b.sock"), &[], &pids));
            args.extend([
                "--connect".into(),
                listener.as_ref().unwrap().sock.clone().into(),
            ]);
        } else {
            listener = None;
            args.extend(["--policy".into(), policy.clone().into()]);
        }
        args.extend(["--".into(), python().into(), server.into()]);
        let mut proxy = Cmd::new(&args)
            .pids(&pids)
            .deadline(LATE_NAME_DEADLINE)
            .ahead()
            .spawn();
        proxy.send_msg(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "review-host", "version": "1.0"}}}),
        );
        let answer = wait_for(
            &mut proxy,
            Duration::from_secs(30),
            "the consent answer",
            |m| m["method"] == "test/consent",
        );
        assert!(answer["params"]["result"].is_object(), "{answer}");
        proxy.close_stdin();
        let _ = proxy.next_line(Duration::from_secs(10));
        drop(proxy);
        if let Some(mut l) = listener {
            l.terminate(Duration::from_secs(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let audit = std::fs::read_to_string(&log).expect("the audit log");
        let line: Value = audit
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .find(|r| r["method"] == "files/consent")
            .unwrap_or_else(|| panic!("no files/consent line: {audit}"));
        line
    })
}

/// Rule: a request's audit line names the server as it is known when the line is written: a
/// server that asks for consent first and answers `initialize` (its name) while the person is
/// asked is named in the consent's line, behind a local broker and behind `--connect`.
#[test]
fn consent_line_names_a_server_named_while_the_prompt_ran_local() {
    let line = consent_line_of_a_late_named_server(false);
    assert_eq!(line["server"], "late-named-server", "{line}");
}

#[test]
fn consent_line_names_a_server_named_while_the_prompt_ran_connect() {
    let line = consent_line_of_a_late_named_server(true);
    assert_eq!(line["server"], "late-named-server", "{line}");
}

//! Abuse of the transports, through the real binary over real pipes and Unix sockets: a
//! server behind `fsbroker proxy` that floods the proxy with requests while never reading its
//! answers; honest pipelined traffic through the same proxy; a shared broker (`serve
//! --listen`) that must name the server behind `proxy --connect` in consent requests, cap its
//! sessions (`max_sessions`) and bound the partial lines its connections hold
//! (`max_pending_input`).
//!
//! Memory bounds are read from `/proc/PID/status` (VmHWM) and are correctness bounds, not
//! speed: a transport that buffers whatever a peer sends has no bound at all. Figures are
//! printed; run with `--nocapture` to see them.
//!
//! One file though long: every test floods one transport with the same hostile peers and
//! measures the same honest session beside them.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use common::fsb::{Cmd, Fsb, Got, Listener, Raw};
use common::procs::{Pids, vm_hwm_mib};
use common::{PolicyToml, RootToml, proc_status_kib, python, tempdir, write_policy};

/// Longest any one test may run before its processes are killed and it fails.
const TEST_DEADLINE: Duration = Duration::from_secs(60);
/// The memory bound every flood test holds the broker or the proxy to.
const BOUND_MIB: f64 = 200.0;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs a test body under [`TEST_DEADLINE`]; past it, the test's processes are killed.
fn within<T: Send + 'static>(pids: &Pids, f: impl FnOnce(Pids) -> T + Send + 'static) -> T {
    common::procs::within(TEST_DEADLINE, pids, f)
}

/// `fsbroker ARGS...` (stderr inherited, so a failing test shows the logs), registered with
/// `pids`; the host (the test) reads its output as it comes when `host_reads`, else only
/// when it asks.
fn spawn_fsbroker(args: &[OsString], pids: &Pids, host_reads: bool) -> Fsb {
    let cmd = Cmd::new(args).pids(pids).deadline(TEST_DEADLINE);
    if host_reads { cmd.ahead() } else { cmd }.spawn()
}

/// The first message `want` accepts, within `limit` (others, and lines that are not JSON,
/// are passed over).
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

/// Whether `m` is the refusal of a connection past `max_sessions`: a JSON-RPC error with
/// `id: null` and `data.code` `QUOTA_EXCEEDED`.
fn is_session_refusal(m: &Value) -> bool {
    m.get("id") == Some(&Value::Null) && m["error"]["data"]["code"] == "QUOTA_EXCEEDED"
}

/// Connects until a connection is served (its `ping` answered), for at most `limit`;
/// connections refused for `max_sessions` are retried. Returns how many were refused.
fn connect_served(l: &Listener, limit: Duration, what: &str) -> (Fsb, usize) {
    let end = Instant::now() + limit;
    let mut refused = 0;
    let mut n = 0;
    loop {
        assert!(
            Instant::now() < end,
            "{what}: no connection served within {limit:?} ({refused} refused)"
        );
        n += 1;
        let mut c = l.connect();
        // A refused connection hears its refusal at once; a served one hears nothing until
        // it asks.
        match c.next(Duration::from_millis(200)) {
            Got::Line(m) if is_session_refusal(&m) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Got::Line(m) => panic!("{what}: unasked-for message on a new connection: {m}"),
            Got::Eof => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Got::Timeout => {}
        }
        let id = json!(format!("fresh-{n}"));
        let msg =
            serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"})).unwrap();
        if c.stream()
            .write_all(&[msg, b"\n".to_vec()].concat())
            .is_err()
        {
            refused += 1;
            continue;
        }
        match c.next(Duration::from_secs(10)) {
            Got::Line(m) if m["id"] == id => {
                assert_eq!(m["result"], json!({}), "{what}: ping answered {m}");
                return (c, refused);
            }
            Got::Line(m) if is_session_refusal(&m) => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Got::Line(m) => panic!("{what}: unexpected answer to a ping: {m}"),
            Got::Eof => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Got::Timeout => panic!("{what}: a ping on a fresh connection was not answered in 10 s"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A proxy flooded by a server that never reads its answers
// ---------------------------------------------------------------------------------------------

/// The flooding server. `PROGRESS BIG SMALL`: never reads its stdin; writes 10 `files/read`
/// requests of BIG (8 MiB, base64) and then 300 `files/read` requests of SMALL, each padded
/// to 4 MiB with a `_meta` string, appending one byte to PROGRESS after each request written;
/// a `notifications/message` for the host before and after. Then sleeps until its parent
/// (the proxy) is gone. A write that fails (the proxy died) ends it.
const FLOOD_PY: &str = r#"
import json, os, sys, time
progress = open(sys.argv[1], "ab", buffering=0)
big, small = sys.argv[2], sys.argv[3]
ppid = os.getppid()
out = sys.stdout.buffer

def send(line, count=True):
    out.write(line)
    out.flush()
    if count:
        progress.write(b".")

def note(text):
    send(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                     "params": {"level": "info", "data": text}}).encode() + b"\n", False)

try:
    note("flood starts")
    for i in range(10):
        send(json.dumps({"jsonrpc": "2.0", "id": "big-%d" % i, "method": "files/read",
                         "params": {"path": big, "length": 8388608,
                                    "encoding": "base64"}}).encode() + b"\n")
    pad = b"p" * (4 << 20)
    for i in range(300):
        head = ('{"jsonrpc":"2.0","id":"pad-%d","method":"files/read","params":{"path":%s,'
                '"_meta":{"pad":"' % (i, json.dumps(small))).encode()
        send(head + pad + b'"}}}\n')
    note("flood written")
except (BrokenPipeError, OSError):
    os._exit(0)
while os.getppid() == ppid:
    time.sleep(0.2)
os._exit(0)
"#;

/// Runs [`FLOOD_PY`] behind `proxy --root proj --read-write --consent auto`; the host reads
/// the proxy's stdout or not. Returns nothing; asserts the proxy's VmHWM.
fn flood_the_proxy(host_reads: bool) {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let proj = dir.join("proj");
        std::fs::create_dir(&proj).unwrap();
        let big: Vec<u8> = (0..8u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        std::fs::write(proj.join("big.bin"), &big).unwrap();
        drop(big);
        std::fs::write(proj.join("small.txt"), "small\n").unwrap();
        let script = dir.join("flood.py");
        std::fs::write(&script, FLOOD_PY).unwrap();
        let progress = dir.join("progress");
        std::fs::write(&progress, b"").unwrap();

        let args: Vec<OsString> = vec![
            "proxy".into(),
            "--root".into(),
            proj.clone().into(),
            "--read-write".into(),
            "--consent".into(),
            "auto".into(),
            "--".into(),
            python().into(),
            script.into(),
            progress.clone().into(),
            "proj/big.bin".into(),
            "proj/small.txt".into(),
        ];
        // The host: reads everything the proxy relays, or nothing at all.
        let mut proxy = spawn_fsbroker(&args, &pids, host_reads);
        let pid = proxy.pid();

        // Watch the server's progress; sample once its writes stall (the proxy stopped
        // reading it), or it has written everything and the proxy had time to take it in,
        // or 2 s after the proxy went past the bound (enough to see it grow on), or 24 s.
        let started = Instant::now();
        let (mut last, mut last_change) = (0u64, Instant::now());
        let mut over: Option<Instant> = None;
        let written = loop {
            std::thread::sleep(Duration::from_millis(100));
            proxy.assert_alive("the proxy");
            let n = std::fs::metadata(&progress).map(|m| m.len()).unwrap_or(0);
            if n != last {
                (last, last_change) = (n, Instant::now());
            }
            if over.is_none() && vm_hwm_mib(pid) >= BOUND_MIB {
                over = Some(Instant::now());
            }
            let quiet = last_change.elapsed();
            let all = n >= 310;
            if (all && quiet > Duration::from_millis(1500))
                || (started.elapsed() > Duration::from_secs(4) && quiet > Duration::from_secs(3))
                || over.is_some_and(|t| t.elapsed() > Duration::from_secs(2))
                || started.elapsed() > Duration::from_secs(24)
            {
                break n;
            }
        };
        proxy.assert_alive("the proxy");
        let hwm = vm_hwm_mib(pid);
        let rss = proc_status_kib(pid, "VmRSS") as f64 / 1024.0;
        println!(
            "flood (host {}): the server wrote {written} of 310 requests (10 × 8 MiB reads, 300 × 4 MiB lines) in {:?}; proxy VmHWM {hwm:.1} MiB, VmRSS {rss:.1} MiB",
            if host_reads { "reading" } else { "not reading" },
            started.elapsed()
        );
        proxy.kill_now();
        if host_reads {
            // The notification the server wrote before its flood reached the host.
            let mut notes = Vec::new();
            while let Raw::Line(l) = proxy.next_line(Duration::from_secs(5)) {
                notes.extend(l.json);
            }
            assert!(
                notes.iter().any(|m| m["params"]["data"] == "flood starts"),
                "the host never got the server's first notification: {notes:?}"
            );
        }
        assert!(
            hwm < BOUND_MIB,
            "a server that never reads its answers drove the proxy to VmHWM {hwm:.1} MiB (bound {BOUND_MIB} MiB) with {written} requests written"
        );
    });
}

/// Rule: the proxy holds a bounded amount of a server's requests and of their answers. The
/// server never reads its stdin and floods the proxy with ~1.3 GB of requests (10 reads of
/// 8 MiB, 300 requests of 4 MiB); the host reads the proxy's output. The proxy must stop
/// reading the server (its writes stall) rather than buffer: VmHWM under 200 MiB.
#[test]
fn proxy_flooded_by_a_server_that_never_reads_stays_bounded_host_reading() {
    flood_the_proxy(true);
}

/// Rule: as above, with a host that never reads the proxy's stdout either: neither direction
/// may turn into unbounded buffering. VmHWM under 200 MiB.
#[test]
fn proxy_flooded_by_a_server_that_never_reads_stays_bounded_host_not_reading() {
    flood_the_proxy(false);
}

// ---------------------------------------------------------------------------------------------
// 2. Honest pipelined traffic through the proxy
// ---------------------------------------------------------------------------------------------

/// The honest server. `N`: writes N `files/read` requests (`proj/fK.txt`, K = i mod 20) at
/// once, then reads its stdin until each has an answer, then sends the host one
/// `test/answers` notification with every answer it got, by id, and waits for EOF.
const HONEST_PY: &str = r#"
import json, sys
n = int(sys.argv[1])
out = sys.stdout.buffer
out.write(b"".join(json.dumps({"jsonrpc": "2.0", "id": "r-%d" % i, "method": "files/read",
                               "params": {"path": "proj/f%d.txt" % (i % 20)}}).encode() + b"\n"
                   for i in range(n)))
out.flush()
got = {}
while len(got) < n:
    raw = sys.stdin.buffer.readline()
    if not raw:
        break
    try:
        msg = json.loads(raw)
    except ValueError:
        continue
    if isinstance(msg, dict) and "method" not in msg and str(msg.get("id", "")).startswith("r-"):
        got.setdefault(msg["id"], []).append(msg)
out.write(json.dumps({"jsonrpc": "2.0", "method": "test/answers",
                      "params": {"answers": got}}).encode() + b"\n")
out.flush()
while sys.stdin.buffer.readline():
    pass
"#;

/// Rule (regression guard for the bounded proxy): bounds must not cost honest traffic its
/// answers. A server that pipelines 200 small `files/read` requests gets exactly one correct
/// answer to each.
#[test]
fn proxy_answers_every_request_of_an_honest_pipelining_server() {
    const N: usize = 200;
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let proj = dir.join("proj");
        std::fs::create_dir(&proj).unwrap();
        for k in 0..20 {
            std::fs::write(proj.join(format!("f{k}.txt")), format!("file number {k}\n")).unwrap();
        }
        let script = dir.join("honest.py");
        std::fs::write(&script, HONEST_PY).unwrap();
        let args: Vec<OsString> = vec![
            "proxy".into(),
            "--root".into(),
            proj.into(),
            "--read-write".into(),
            "--consent".into(),
            "auto".into(),
            "--".into(),
            python().into(),
            script.into(),
            N.to_string().into(),
        ];
        let mut proxy = spawn_fsbroker(&args, &pids, true);
        let report = wait_for(
            &mut proxy,
            Duration::from_secs(30),
            "the server's test/answers",
            |m| m["method"] == "test/answers",
        );
        let answers = report["params"]["answers"]
            .as_object()
            .expect("answers")
            .clone();
        assert_eq!(
            answers.len(),
            N,
            "answered {} of {N} requests",
            answers.len()
        );
        for i in 0..N {
            let id = format!("r-{i}");
            let got = answers[&id].as_array().unwrap();
            assert_eq!(got.len(), 1, "{id} answered {} times: {got:?}", got.len());
            let m = &got[0];
            assert!(m.get("error").is_none(), "{id} failed: {m}");
            assert_eq!(
                m["result"]["content"],
                format!("file number {}\n", i % 20),
                "{id}: {m}"
            );
        }
        println!("honest pipelining: {N} reads answered once each and right");
        proxy.close_stdin();
        proxy.assert_alive("the proxy");
    });
}

// ---------------------------------------------------------------------------------------------
// 3. A shared broker names the server behind `proxy --connect`
// ---------------------------------------------------------------------------------------------

/// The consent command. `SAVE`: saves its stdin to SAVE and approves every requested path.
const CONSENT_PY: &str = r#"
import json, os, sys
save = sys.argv[1]
data = sys.stdin.buffer.read()
with open(save + ".tmp", "wb") as f:
    f.write(data)
os.rename(save + ".tmp", save)
print(json.dumps({"approvedPaths": json.loads(data)["requestedPaths"]}))
"#;

/// The named server: answers `initialize` as `abuse-test-server`, then at once asks
/// `files/consent` for `r/doc.txt`, and tells the host the answer in a `test/consent`
/// notification.
const NAMED_PY: &str = r#"
import json, sys
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
        send({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "serverInfo": {"name": "abuse-test-server", "version": "1.0"}}})
        send({"jsonrpc": "2.0", "id": "srv-consent", "method": "files/consent",
              "params": {"message": "abuse test", "requestedPaths": ["r/doc.txt"]}})
    elif msg.get("id") == "srv-consent" and "method" not in msg:
        send({"jsonrpc": "2.0", "method": "test/consent", "params": msg})
"#;

/// Rule: a consent prompt names the server that asks, also when the broker is shared. Behind
/// `proxy --connect` the server answers `initialize` as `abuse-test-server` and asks
/// `files/consent` on a `prompt` root; the consent command must get
/// `"server": "abuse-test-server"`, not `null`.
#[test]
fn shared_broker_names_the_server_behind_proxy_connect_in_consent_requests() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("doc.txt"), "doc\n").unwrap();
        std::fs::create_dir(dir.join("bin")).unwrap();
        let consent = dir.join("bin/consent.py");
        std::fs::write(&consent, CONSENT_PY).unwrap();
        let save = dir.join("consent-request.json");
        let policy = PolicyToml::new()
            .root(RootToml::at(&root).name("r").consent("prompt"))
            .consent_command(
                &[Path::new(python()), &consent, &save],
                "timeout_ms = 20000",
            )
            .audit(&dir.join("audit.jsonl"), "")
            .write_to(&dir.join("policy.toml"));
        let server = dir.join("named.py");
        std::fs::write(&server, NAMED_PY).unwrap();
        let listener = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);

        let args: Vec<OsString> = vec![
            "proxy".into(),
            "--connect".into(),
            listener.sock.clone().into(),
            "--".into(),
            python().into(),
            server.into(),
        ];
        let mut proxy = spawn_fsbroker(&args, &pids, true);
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "abuse-host", "version": "1.0"}}});
        proxy.send_msg(&init);
        let r = wait_for(
            &mut proxy,
            Duration::from_secs(20),
            "the initialize result",
            |m| m["id"] == 0 && m.get("method").is_none(),
        );
        assert_eq!(
            r["result"]["serverInfo"]["name"], "abuse-test-server",
            "{r}"
        );
        let answer = wait_for(
            &mut proxy,
            Duration::from_secs(30),
            "the consent answer",
            |m| m["method"] == "test/consent",
        );
        let result = &answer["params"]["result"];
        assert!(
            result["approvedPaths"]
                .as_array()
                .is_some_and(|a| !a.is_empty()),
            "the consent was not granted: {answer}"
        );
        let asked: Value =
            serde_json::from_slice(&std::fs::read(&save).expect("the consent command ran"))
                .expect("the consent request is JSON");
        println!("consent command got: {asked}");
        assert_eq!(
            asked["server"], "abuse-test-server",
            "the consent command was not told which server asks: {asked}"
        );
        // The audit log names it too.
        let audit = std::fs::read_to_string(dir.join("audit.jsonl")).expect("the audit log");
        let consent_line: Value = audit
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("an audit line is JSON"))
            .find(|r| r["method"] == "files/consent")
            .unwrap_or_else(|| panic!("no files/consent record in the audit log: {audit}"));
        assert_eq!(
            consent_line["server"], "abuse-test-server",
            "{consent_line}"
        );
        proxy.close_stdin();
    });
}

// ---------------------------------------------------------------------------------------------
// 4. max_sessions
// ---------------------------------------------------------------------------------------------

/// Rule: `[limits] max_sessions` caps the connections `serve --listen` serves at once. With
/// `max_sessions = 3`, three connections are served; a fourth gets exactly one line — a
/// JSON-RPC error, `id: null`, `data.code` `QUOTA_EXCEEDED`, naming `max_sessions` — and then
/// end of input; once one of the three closes, a new connection is served.
#[test]
fn listen_refuses_connections_past_max_sessions() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        let policy = write_policy(&dir, &root, "", "max_sessions = 3");
        let l = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);

        let mut served: Vec<Fsb> = (0..3).map(|_| l.connect()).collect();
        for (i, c) in served.iter_mut().enumerate() {
            c.ping(&format!("s{i}"));
        }
        // The fourth: one line, then end of input.
        let mut fourth = l.connect();
        let first = match fourth.next(Duration::from_secs(5)) {
            Got::Line(m) => m,
            other => panic!("the fourth connection got no refusal line: {other:?}"),
        };
        println!("fourth connection: {first}");
        assert_eq!(first["jsonrpc"], "2.0", "{first}");
        assert_eq!(first.get("id"), Some(&Value::Null), "{first}");
        assert!(first.get("result").is_none(), "{first}");
        assert_eq!(first["error"]["data"]["code"], "QUOTA_EXCEEDED", "{first}");
        assert!(first["error"]["code"].is_i64(), "{first}");
        assert!(
            first["error"].to_string().contains("max_sessions"),
            "the refusal does not name max_sessions: {first}"
        );
        match fourth.next(Duration::from_secs(5)) {
            Got::Eof => {}
            other => panic!("after its refusal the fourth connection got {other:?}, not EOF"),
        }
        // The three are still served.
        for (i, c) in served.iter_mut().enumerate() {
            c.ping(&format!("s{i}-again"));
        }
        // One leaves; a new connection gets its place.
        drop(served.remove(0));
        let (mut fresh, refused) = connect_served(&l, Duration::from_secs(3), "after a close");
        println!("after one of three closed: served, {refused} refused first");
        fresh.ping("fresh-again");
        for (i, c) in served.iter_mut().enumerate() {
            c.ping(&format!("s{i}-last"));
        }
    });
}

// ---------------------------------------------------------------------------------------------
// 5. Partial lines on many connections
// ---------------------------------------------------------------------------------------------

/// Rule: partial input is bounded across connections, not per connection. 200 connections to
/// `serve --listen` (default limits) each trickle a 4 MiB line that never ends, 256 KiB at a
/// time, round robin. Connections past `max_sessions` may be refused. The broker's VmHWM stays
/// under 200 MiB, it stays up, and once a few slow connections close a fresh one is served.
#[test]
fn listen_bounds_partial_lines_across_two_hundred_slow_connections() {
    const CONNS: usize = 200;
    const LINE: usize = 4 << 20;
    const PIECE: usize = 256 << 10;
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        let policy = write_policy(&dir, &root, "", "");
        let mut l = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);
        let pid = l.pid();
        let before = vm_hwm_mib(pid);

        let mut line =
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"_meta":{"pad":""#.to_vec();
        line.resize(LINE, b'x');
        let mut conns: Vec<Option<UnixStream>> = (0..CONNS)
            .map(|_| {
                let s = UnixStream::connect(&l.sock).expect("connect");
                s.set_nonblocking(true).unwrap();
                Some(s)
            })
            .collect();
        let mut sent = vec![0usize; CONNS];
        let mut failed = 0;
        // Writes what the socket takes now of `line[sent..target]`.
        let mut push =
            |conns: &mut Vec<Option<UnixStream>>, sent: &mut Vec<usize>, target: usize| {
                for i in 0..CONNS {
                    let Some(s) = conns[i].as_mut() else { continue };
                    while sent[i] < target {
                        match s.write(&line[sent[i]..target]) {
                            Ok(0) => break,
                            Ok(n) => sent[i] += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => {
                                // Refused (past max_sessions) or dropped by the broker.
                                conns[i] = None;
                                failed += 1;
                                break;
                            }
                        }
                    }
                }
            };
        let started = Instant::now();
        for round in 1..=LINE / PIECE {
            push(&mut conns, &mut sent, round * PIECE);
            std::thread::sleep(Duration::from_millis(150));
        }
        // Let the broker take in whatever more it will.
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            push(&mut conns, &mut sent, LINE);
            std::thread::sleep(Duration::from_millis(100));
        }
        let total: usize = sent.iter().sum();
        let open = conns.iter().filter(|c| c.is_some()).count();
        l.assert_alive();
        let hwm = vm_hwm_mib(pid);
        println!(
            "{CONNS} slow connections: {:.1} MiB of partial lines written in {:?} ({open} still open, {failed} refused or dropped); broker VmHWM {before:.1} → {hwm:.1} MiB",
            total as f64 / (1 << 20) as f64,
            started.elapsed()
        );

        // A few slow ones give up; a fresh connection is served.
        for c in conns.iter_mut().take(10) {
            *c = None;
        }
        let (mut fresh, refused) = connect_served(
            &l,
            Duration::from_secs(5),
            "after 10 slow connections closed",
        );
        fresh.ping("fresh-again");
        l.assert_alive();
        println!("fresh connection served ({refused} refused first)");
        let hwm = vm_hwm_mib(pid);
        assert!(
            hwm < BOUND_MIB,
            "{CONNS} connections holding partial lines drove the broker to VmHWM {hwm:.1} MiB (bound {BOUND_MIB} MiB; {:.1} MiB written)",
            total as f64 / (1 << 20) as f64
        );
        drop(conns);
    });
}

// ---------------------------------------------------------------------------------------------
// 6. max_pending_input
// ---------------------------------------------------------------------------------------------

/// Rule: `[limits] max_pending_input` bounds the input held for all connections together, and
/// a connection that cannot get room is answered, not left hanging. With 8 MiB and
/// `timeout_ms = 2000`: A holds a 6 MiB partial line; B's complete 4 MiB `files/write` cannot
/// fit, so while A holds, B gets a JSON-RPC error (any) within timeout_ms and a few seconds,
/// never silence, and never success unless the broker first let go of A (answered or closed
/// it); B's `ping` after the write is answered too. Once A disconnects, B's write succeeds.
#[test]
fn max_pending_input_bounds_partial_lines_across_connections() {
    let pids = Pids::default();
    within(&pids, move |pids| {
        let (_t, dir) = tempdir();
        let root = dir.join("root");
        std::fs::create_dir(&root).unwrap();
        let policy = write_policy(
            &dir,
            &root,
            "mode = \"read-write\"",
            "max_pending_input = 8388608\ntimeout_ms = 2000\nrequests_per_second = 0",
        );
        let l = Listener::start(&policy, &dir.join("broker.sock"), &[], &pids);
        let mut a = l.connect();
        let mut b = l.connect();
        a.ping("a0");
        b.ping("b0");

        // A: 6 MiB of a line that does not end (yet).
        let mut partial =
            br#"{"jsonrpc":"2.0","id":"a-write","method":"files/write","params":{"path":"r/a.bin","encoding":"base64","content":""#
                .to_vec();
        partial.resize(6 << 20, b'A');
        let a_done = a.write_in_background(partial);
        match a_done.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            other => {
                panic!("the broker did not take A's 6 MiB partial line (8 MiB allowed): {other:?}")
            }
        }
        // Small requests on B still go through.
        b.ping("b1");

        // B: a complete 4 MiB line (3 MiB of content in base64), then a ping.
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i % 251) as u8).collect();
        let content = base64::engine::general_purpose::STANDARD.encode(&data);
        let write_line = |id: &str| {
            let mut v =
                serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "method": "files/write",
                "params": {"path": "r/b.bin", "encoding": "base64", "content": content}}))
                .unwrap();
            v.push(b'\n');
            v
        };
        let mut input = write_line("b-write");
        assert!(input.len() >= 4 << 20);
        input.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":\"b2\",\"method\":\"ping\"}\n");
        let b_done = b.write_in_background(input);
        let window = Duration::from_millis(2000) + Duration::from_secs(6);
        let started = Instant::now();
        let (mut write_answer, mut pinged) = (None, false);
        while write_answer.is_none() || !pinged {
            let left = window.saturating_sub(started.elapsed());
            match b.next(left) {
                Got::Line(m) if m["id"] == "b2" => {
                    assert_eq!(m["result"], json!({}), "{m}");
                    pinged = true;
                }
                Got::Line(m)
                    if m["id"] == "b-write"
                        || (m.get("id") == Some(&Value::Null) && m.get("error").is_some()) =>
                {
                    println!(
                        "B's 4 MiB write while A holds 6 MiB, after {:?}: {}",
                        started.elapsed(),
                        {
                            let mut s = m.to_string();
                            s.truncate(300);
                            s
                        }
                    );
                    if m.get("result").is_some() {
                        // Success is right only once A no longer holds its line: the broker
                        // gave up on A (answered it or closed it) to make room.
                        let a_heard = a.next(Duration::from_secs(1));
                        assert!(
                            !matches!(a_heard, Got::Timeout),
                            "B's 4 MiB line was taken in and written while A held 6 MiB of an 8 MiB max_pending_input: {m}"
                        );
                        println!("the broker let go of A first: {a_heard:?}");
                    } else {
                        assert!(m["error"]["code"].is_i64(), "{m}");
                    }
                    write_answer = Some(m);
                }
                Got::Line(m) => panic!("B got an unexpected message: {m}"),
                Got::Eof => panic!("the broker closed B"),
                Got::Timeout => panic!(
                    "while A held its partial line, B got no answer within {window:?} (write answered: {}, ping answered: {pinged})",
                    write_answer.is_some()
                ),
            }
        }
        match b_done.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            other => panic!("the broker did not read the rest of B's input: {other:?}"),
        }

        // A goes away; B's write now goes through.
        drop(a);
        let end = Instant::now() + Duration::from_secs(10);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let id = format!("b-retry-{attempt}");
            let done = b.write_in_background(write_line(&id));
            let m = b.answer_or_null_error(&json!(id), Duration::from_secs(15));
            done.recv_timeout(Duration::from_secs(5))
                .expect("B's write was sent")
                .expect("B's write was sent");
            if m.get("result").is_some() {
                assert_eq!(m["result"]["bytesWritten"], data.len(), "{m}");
                break;
            }
            assert!(
                Instant::now() < end,
                "with A gone, B's 4 MiB write is still refused after {attempt} attempts: {m}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        assert!(
            std::fs::read(root.join("b.bin")).unwrap() == data,
            "b.bin holds other bytes"
        );
        b.ping("b-last");
    });
}

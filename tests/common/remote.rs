//! Remote MCP servers on loopback (`tests/peers/remote_*`, interface in
//! `tests/peers/README.md`): started with a piped stdin (they exit when it closes), their URL
//! read from their first stdout line, their stderr kept for the failure message; a throwaway
//! test CA for their `--tls` option, made with `openssl` at test time; and the host's side of
//! `fsbroker proxy` in front of them ([`Host`]), with the round of requests every server
//! sends the client ([`brokered_round`]), shared by `tests/remote.rs` (the proxy's own
//! Streamable HTTP client) and `tests/remote_bridge.rs` (a stdio ↔ HTTP bridge).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::fsb::Fsb;
use super::kit::Rng;
use super::peers::peers_dir;
use super::{path_str, tempdir, uri_path};

/// How long a server may take to print its URL (Node.js and Python start in well under it).
const START: Duration = Duration::from_secs(60);

/// A running remote peer. Dropping it closes its stdin and kills it.
pub struct RemoteServer {
    child: Child,
    stdin: Option<ChildStdin>,
    log: Arc<Mutex<String>>,
    /// `http(s)://127.0.0.1:PORT/mcp`, as the server printed it.
    pub url: String,
    /// The whole line it printed (a peer may say more than its URL).
    pub line: Value,
}

impl RemoteServer {
    /// Starts `PROGRAM ARGS` in `tests/peers` and waits for its `{"url": ...}` line.
    pub fn start(program: &Path, args: &[&str]) -> RemoteServer {
        let what = format!("{} {}", program.display(), args.join(" "));
        let mut child = Command::new(program)
            .args(args)
            .current_dir(peers_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            // Anything after the URL line is not part of the interface: read and dropped so
            // the server never blocks on a full pipe.
            for _ in lines {}
        });
        let mut server = RemoteServer {
            child,
            stdin: None,
            log,
            url: String::new(),
            line: Value::Null,
        };
        server.stdin = server.child.stdin.take();
        let first = match rx.recv_timeout(START) {
            Ok(Some(Ok(line))) => line,
            other => panic!(
                "`{what}` printed no URL line within {START:?} ({other:?}); its stderr:\n{}",
                server.log()
            ),
        };
        let parsed: Value = serde_json::from_str(&first)
            .unwrap_or_else(|e| panic!("`{what}` printed {first:?}, not JSON: {e}"));
        server.url = parsed["url"]
            .as_str()
            .unwrap_or_else(|| panic!("`{what}` printed {first:?}, without a url"))
            .to_owned();
        server.line = parsed;
        server
    }

    /// `node tests/peers/SCRIPT ARGS`.
    pub fn node(script: &str, args: &[&str]) -> RemoteServer {
        let path = peers_dir().join(script);
        let mut all = vec![path.to_str().expect("utf-8 path")];
        all.extend_from_slice(args);
        RemoteServer::start(Path::new(&super::peers::node()), &all)
    }

    /// What the server wrote to stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// `GET /debug` (plain HTTP servers only): the server's record of sessions, GET streams
    /// and DELETEs.
    pub fn debug(&self) -> Value {
        let rest = self
            .url
            .strip_prefix("http://")
            .expect("/debug is read over plain HTTP");
        let authority = rest.split('/').next().expect("authority");
        let mut s = TcpStream::connect(authority).expect("connect to the server");
        s.set_read_timeout(Some(START)).expect("timeout");
        write!(
            s,
            "GET /debug HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
        )
        .expect("send GET /debug");
        let mut text = String::new();
        s.read_to_string(&mut text).expect("read /debug");
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default();
        // Node.js answers with a Content-Length, but a chunked body would start with its size.
        let body = body.trim();
        let json = body
            .find('{')
            .map(|i| &body[i..=body.rfind('}').unwrap_or(i)])
            .unwrap_or(body);
        serde_json::from_str(json).unwrap_or_else(|e| panic!("/debug answered {text:?}: {e}"))
    }
}

impl Drop for RemoteServer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A throwaway CA and a server certificate it signed for `127.0.0.1` and `localhost`, as PEM
/// files in a directory of the test's.
pub struct TestCa {
    /// The CA's certificate: what a client is told to trust (`NODE_EXTRA_CA_CERTS`, ...).
    pub ca_cert: PathBuf,
    /// The server's certificate and key: `--tls CERT KEY`.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The `openssl` command (`OPENSSL`, or `openssl` on the `PATH`).
fn openssl_command() -> String {
    std::env::var("OPENSSL").unwrap_or_else(|_| "openssl".to_owned())
}

/// Runs `openssl ARGS` in `dir`; fails, with its stderr, if it does not succeed.
pub fn openssl(dir: &Path, args: &[&str]) {
    let openssl = openssl_command();
    let out = Command::new(&openssl)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `{openssl}`: {e} (install openssl, or set OPENSSL)")
        });
    assert!(
        out.status.success(),
        "`openssl {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes a fresh CA and a server certificate in `dir` with `openssl` (P-256 keys, valid for
/// two days, the CA key left in `dir` and never reused). Without `openssl` (which `.ci/run`
/// installs) it prints `SKIPPED` and returns `None`, and the test ends there, as the tests
/// of the other tools `.ci/run` installs do.
pub fn test_ca(dir: &Path) -> Option<TestCa> {
    let command = openssl_command();
    if let Err(e) = Command::new(&command)
        .arg("version")
        .stdin(Stdio::null())
        .output()
    {
        crate::common::skipped(&format!(
            "cannot run `{command}`: {e} (apt-get install openssl; .ci/run installs it)"
        ));
        return None;
    }
    let run = |args: &[&str]| openssl(dir, args);
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=fsbroker test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&ca);
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    run(&csr);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.pem",
    ]);
    Some(TestCa {
        ca_cert: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    })
}

/// Enough for three 1 MiB reads, the last one short: the reader must follow `length`/`eof`.
pub const FILE_SIZE: usize = (2 << 20) + 12_345;

/// A root named `remote-root` with `data.bin` ([`FILE_SIZE`] seeded bytes), `note.txt` and,
/// if asked, `big.bin`, and the sha256 of each `.bin`.
pub struct Root {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
    pub sha256: String,
    big_sha256: Option<String>,
}

impl Root {
    /// A root without `big.bin`.
    pub fn new() -> Root {
        Root::make(None)
    }

    /// A root with a `big.bin` of `size` seeded bytes too.
    pub fn with_big(size: usize) -> Root {
        Root::make(Some(size))
    }

    fn make(big: Option<usize>) -> Root {
        let (dir, base) = tempdir();
        let path = base.join("remote-root");
        std::fs::create_dir(&path).expect("mkdir root");
        let bytes = Rng::new(30).bytes(FILE_SIZE);
        std::fs::write(path.join("data.bin"), &bytes).expect("write data.bin");
        std::fs::write(path.join("note.txt"), "hello from the broker's root\n")
            .expect("write note");
        let big_sha256 = big.map(|size| {
            let big = Rng::new(31).bytes(size);
            std::fs::write(path.join("big.bin"), &big).expect("write big.bin");
            hex(&Sha256::digest(&big))
        });
        Root {
            _dir: dir,
            path,
            sha256: hex(&Sha256::digest(&bytes)),
            big_sha256,
        }
    }

    /// The sha256 of `big.bin`.
    pub fn big_sha256(&self) -> &str {
        self.big_sha256
            .as_deref()
            .expect("a root made with Root::with_big")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The host's side of `fsbroker proxy`: every line it reads recorded, and the ids of its own
/// requests, so that [`Host::finish`] can tell that nothing of the broker's reached it.
pub struct Host {
    pub fsb: Fsb,
    ids: Vec<u64>,
    /// `params._meta` of every tools/call: set for a 2026-07-28 host, which has no handshake.
    meta: Option<Value>,
    /// A directory the proxy's command keeps state in (a bridge's `HOME`): removed after the
    /// proxy ended.
    home: Option<tempfile::TempDir>,
}

impl Host {
    /// The host of a proxy already spawned (with `Cmd::record`), and the directory it keeps
    /// state in, if any.
    pub fn new(fsb: Fsb, home: Option<tempfile::TempDir>) -> Host {
        Host {
            fsb,
            ids: Vec::new(),
            meta: None,
            home,
        }
    }

    /// The raw response to a request of the host's.
    pub fn raw(&mut self, method: &str, params: Value) -> Value {
        let id = self.fsb.send(method, params);
        self.ids.push(id);
        self.fsb.response(id)
    }

    /// A request that must succeed: its `result`.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let r = self.raw(method, params.clone());
        assert!(
            r.get("error").is_none(),
            "{method} {params} failed: {r}\nproxy log:\n{}",
            self.fsb.log_text()
        );
        r["result"].clone()
    }

    /// The 2025 `initialize` params: the host declares no roots of its own.
    pub fn init_params() -> Value {
        json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "remote-test", "version": "0"}
        })
    }

    /// The 2025 handshake.
    pub fn initialize(&mut self) -> Value {
        let r = self.request("initialize", Host::init_params());
        self.fsb
            .send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r
    }

    /// From now on a host of MCP 2026-07-28: each request declares its revision (and no
    /// roots of the host's own) in its envelope.
    pub fn modern(&mut self) {
        self.meta = Some(json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "remote-test", "version": "0"}
        }));
    }

    /// The tool call's raw response.
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        let mut params = json!({"name": name, "arguments": arguments});
        if let Some(meta) = &self.meta {
            params["_meta"] = meta.clone();
        }
        self.raw("tools/call", params)
    }

    /// A tool call whose one text block is JSON: that JSON.
    pub fn tool(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.call(name, arguments);
        assert!(
            r.get("error").is_none(),
            "tools/call {name} failed: {r}\nproxy log:\n{}",
            self.fsb.log_text()
        );
        let r = r["result"].clone();
        assert_ne!(r["isError"], true, "tool {name} failed: {r}");
        let text = r["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("tool {name}: no text: {r}"));
        serde_json::from_str(text).unwrap_or_else(|e| panic!("tool {name}: {text}: {e}"))
    }

    /// The server's request to the client on its `stream` ("post": the tool call's own SSE
    /// stream; "get": the session's GET stream), answered: its `result` (the server's tool
    /// reports a JSON-RPC error as `{error}`).
    pub fn ask(&mut self, method: &str, params: Value, stream: &str) -> Value {
        let r = self.tool(
            "request",
            json!({"method": method, "params": params, "stream": stream}),
        );
        assert!(
            r.get("error").is_none(),
            "the server's {method} on its {stream} stream got an error: {r}\nproxy log:\n{}",
            self.fsb.log_text()
        );
        r["result"].clone()
    }

    /// Closes the host's side; the proxy must end by itself (exit 0), and every line the
    /// host read must be an answer to one of its own requests or a notification that is not
    /// the broker's. Returns the proxy's log.
    pub fn finish(mut self) -> String {
        let (status, _) = self.fsb.end();
        let log = self.fsb.log_text();
        assert!(status.success(), "the proxy exited with {status}:\n{log}");
        for raw in self.fsb.received() {
            let m: Value = serde_json::from_slice(raw)
                .unwrap_or_else(|e| panic!("the host read a line that is not JSON ({e}): {raw:?}"));
            match (m.get("method").and_then(Value::as_str), m.get("id")) {
                (Some(method), None) => assert!(
                    !method.starts_with("notifications/files/")
                        && !method.starts_with("notifications/roots/")
                        && !method.starts_with("notifications/fsbroker/"),
                    "a broker notification reached the host: {m}"
                ),
                (Some(_), Some(_)) => panic!("a request reached the host: {m}\n{log}"),
                (None, Some(id)) => assert!(
                    id.as_u64().is_some_and(|id| self.ids.contains(&id)),
                    "an answer to a request the host never sent: {m}"
                ),
                (None, None) => panic!("neither request nor answer: {m}"),
            }
        }
        drop(self.home.take());
        log
    }
}

/// What every remote server is asked to send on `stream` ("post" or "get"), each answered by
/// the broker: roots, consent, a listing of the root and `data.bin` read whole in 1 MiB
/// chunks.
pub fn brokered_round(host: &mut Host, root: &Root, stream: &str) {
    let roots = host.ask("roots/list", json!({}), stream);
    assert_eq!(
        roots["roots"],
        json!([{"uri": format!("file://{}", uri_path(&root.path)), "name": "remote-root"}]),
        "roots/list was not answered with the broker's root"
    );
    let consent = host.ask(
        "files/consent",
        json!({"requestedPaths": [path_str(&root.path)], "message": "remote test"}),
        stream,
    );
    assert_eq!(consent["granted"], true, "{consent}");
    assert_eq!(consent["approvedPaths"], json!([path_str(&root.path)]));
    let list = host.ask("files/list", json!({"path": path_str(&root.path)}), stream);
    let names: Vec<&str> = list["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("files/list: {list}"))
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    let mut expected: Vec<String> = std::fs::read_dir(&root.path)
        .expect("read the root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    expected.sort();
    assert_eq!(names, expected, "{list}");
    let read = host.tool(
        "read_all",
        json!({"path": path_str(&root.path.join("data.bin")), "chunk": 1 << 20, "stream": stream}),
    );
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(read["bytes"], FILE_SIZE, "{read}");
    assert_eq!(read["sha256"], root.sha256, "{read}");
    assert_eq!(read["reads"], 3, "{read}");
}

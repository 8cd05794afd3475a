//! A remote MCP server small enough to misbehave on demand: plain `std::net` on 127.0.0.1,
//! one thread per connection, one request per connection, every byte of every answer written
//! by the test; and `fsbroker proxy --url` in front of it, with the test as the host. Shared
//! by `tests/remote_edges.rs` (the transport's edges) and `tests/remote_hostile.rs` (a hostile
//! server); the real SDK servers are in [`super::remote`].

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::fsb::{Cmd, Fsb, Log};
use super::{path_str, tempdir};

/// Bounds every wait, only so that a hang fails instead of blocking the run.
pub const WAIT: Duration = Duration::from_secs(60);

/// One request as the test server read it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The HTTP method.
    pub method: String,
    /// Header names in lower case, with their values (lossy UTF-8).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// The first header of that (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        super::header(&self.headers, name)
    }

    /// The body as JSON (`null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The JSON-RPC method of the body, if it is a request or a notification.
    pub fn rpc_method(&self) -> Option<String> {
        self.json()["method"].as_str().map(str::to_owned)
    }
}

type Answer = dyn Fn(&Seen, &mut TcpStream) + Send + Sync;

/// A server on 127.0.0.1 that answers each request with what `answer` writes (the whole
/// response, head and body), and records every request.
pub struct Server {
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
}

impl Server {
    pub fn start(answer: impl Fn(&Seen, &mut TcpStream) + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let url = format!("http://127.0.0.1:{port}/mcp");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let connections = Arc::new(AtomicUsize::new(0));
        let record = Arc::clone(&seen);
        let count = Arc::clone(&connections);
        let answer: Arc<Answer> = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                count.fetch_add(1, Ordering::SeqCst);
                let record = Arc::clone(&record);
                let answer = Arc::clone(&answer);
                std::thread::spawn(move || {
                    let Some(req) = read_request(&mut stream) else {
                        return;
                    };
                    record.lock().unwrap().push(req.clone());
                    answer(&req, &mut stream);
                });
            }
        });
        Server {
            url,
            port,
            seen,
            connections,
        }
    }

    /// Every request read so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits (up to [`WAIT`]) until `pred` holds of the requests seen.
    pub fn wait_until(&self, what: &str, pred: impl Fn(&[Seen]) -> bool) {
        let end = Instant::now() + WAIT;
        while !pred(&self.seen()) {
            assert!(Instant::now() < end, "{what}: not within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    stream.set_read_timeout(Some(WAIT)).ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).ok()?;
    let method = String::from_utf8_lossy(&line).split(' ').next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_until(b'\n', &mut line).ok()?;
        let l = String::from_utf8_lossy(&line);
        let l = l.trim_end();
        if l.is_empty() {
            break;
        }
        let (n, v) = l.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(Seen {
        method,
        headers,
        body,
    })
}

/// A whole response: `status` (with its reason), extra header lines, a body.
pub fn respond(stream: &mut TcpStream, status: &str, headers: &[&str], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// The JSON-RPC answer to `req` with `result`.
pub fn answer_json(req: &Seen, result: Value, stream: &mut TcpStream, extra: &[&str]) {
    let body = json!({"jsonrpc": "2.0", "id": req.json()["id"], "result": result}).to_string();
    let mut headers = vec!["Content-Type: application/json"];
    headers.extend_from_slice(extra);
    respond(stream, "200 OK", &headers, body.as_bytes());
}

/// The server's `initialize` result (MCP 2025-06-18, no capabilities).
pub fn init_result() -> Value {
    json!({"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "loopback", "version": "0"}})
}

/// `fsbroker proxy --root ROOT --url URL ARGS` with `env`, every line the host reads
/// recorded; ROOT, in the returned directory, holds `big.bin` (1 MiB of `z`).
pub fn proxy(url: &str, args: &[&str], env: &[(&str, &str)]) -> (tempfile::TempDir, Fsb) {
    let (dir, root) = tempdir();
    std::fs::write(root.join("big.bin"), vec![b'z'; 1 << 20]).expect("write big.bin");
    let mut all = vec![
        "proxy".to_owned(),
        "--root".to_owned(),
        path_str(&root),
        "--url".to_owned(),
        url.to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let mut cmd = Cmd::new(&all).log(Log::Keep).record().deadline(WAIT);
    for (k, v) in env {
        cmd = cmd.env(k, v);
    }
    (dir, cmd.spawn())
}

/// The host's `initialize` (2025-06-18): its response.
pub fn initialize(fsb: &mut Fsb) -> Value {
    fsb.request(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    )
}

/// The error message of a response that must be an error.
pub fn error_message(r: &Value) -> String {
    r["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error: {r}"))
        .to_owned()
}

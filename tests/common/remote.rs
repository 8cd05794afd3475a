//! Remote MCP servers on loopback (`tests/peers/remote_*`, interface in
//! `tests/peers/README.md`): started with a piped stdin (they exit when it closes), their URL
//! read from their first stdout line, their stderr kept for the failure message; and a
//! throwaway test CA for their `--tls` option, made with `openssl` at test time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::peers::peers_dir;

/// How long a server may take to print its URL (Node.js and Python start in well under it).
const START: Duration = Duration::from_secs(60);

/// A running remote peer. Dropping it closes its stdin and kills it.
pub struct RemoteServer {
    child: Child,
    stdin: Option<ChildStdin>,
    log: Arc<Mutex<String>>,
    /// `http(s)://127.0.0.1:PORT/mcp`, as the server printed it.
    pub url: String,
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

/// Makes a fresh CA and a server certificate in `dir` with `openssl` (P-256 keys, valid for
/// two days, the CA key left in `dir` and never reused). Fails, saying so, without `openssl`.
pub fn test_ca(dir: &Path) -> TestCa {
    let openssl = std::env::var("OPENSSL").unwrap_or_else(|_| "openssl".to_owned());
    let run = |args: &[&str]| {
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
    };
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
    TestCa {
        ca_cert: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    }
}

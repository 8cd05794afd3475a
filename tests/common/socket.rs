//! A shared broker (`fsbroker serve --listen`) and connections to it, read line by line with
//! time limits, for tests of many sessions at once.

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::bin;
use super::procs::{Pids, kill_group};

/// `fsbroker serve --listen SOCK --policy POLICY [EXTRA...]` in a process group of its own;
/// dropping it kills the whole group (consent commands included) and reaps the broker.
pub struct Listener {
    child: Child,
    /// The socket's path.
    pub sock: PathBuf,
}

impl Listener {
    /// Starts the broker and waits for its socket; panics (with the exit status and the
    /// policy) when the broker exits instead, for instance because it refused the policy.
    /// The broker's pid goes into `pids`, so a test past its deadline can kill it.
    pub fn start(policy: &Path, sock: &Path, extra: &[&str], pids: &Pids) -> Listener {
        Listener::start_limited(policy, sock, extra, None, pids)
    }

    /// [`Listener::start`] under `ulimit -n FD_LIMIT` when given (through `sh -c`, which then
    /// `exec`s the broker, so the pid is the broker's).
    pub fn start_limited(
        policy: &Path,
        sock: &Path,
        extra: &[&str],
        fd_limit: Option<u32>,
        pids: &Pids,
    ) -> Listener {
        let mut args: Vec<OsString> = vec![
            "serve".into(),
            "--listen".into(),
            sock.into(),
            "--policy".into(),
            policy.into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        let mut cmd = match fd_limit {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(bin())
                    .args(&args);
                c
            }
            None => {
                let mut c = Command::new(bin());
                c.args(&args);
                c
            }
        };
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start fsbroker serve --listen");
        pids.add(child.id());
        let mut l = Listener {
            child,
            sock: sock.to_owned(),
        };
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = l.child.try_wait().expect("try_wait") {
                panic!(
                    "serve --listen exited before listening ({status}); policy:\n{}",
                    std::fs::read_to_string(policy).unwrap_or_default()
                );
            }
            // Not probed by connecting: a probe would be a session of its own, counted
            // against max_sessions until the broker sees it close. The socket's path appears
            // only once the broker listens (it binds under a temporary name and renames), so
            // its existence says enough; `/proc/net/unix` shows the temporary name.
            if std::fs::symlink_metadata(&l.sock).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                return l;
            }
            assert!(Instant::now() < end, "no socket at {}", l.sock.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new connection (a session of its own).
    pub fn connect(&self) -> Conn {
        Conn::new(UnixStream::connect(&self.sock).expect("connect to the broker"))
    }

    /// Sends SIGTERM and waits (at most `limit`) for the broker to exit.
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            assert!(Instant::now() < end, "serve --listen ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `None` while the broker runs, else how it ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Panics when the broker has exited.
    pub fn assert_alive(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("the broker exited ({status})");
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // The group first (the broker is not reaped yet, so its id is still its own).
        kill_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a bounded read of one line found.
#[derive(Debug)]
pub enum Got {
    Line(Value),
    Eof,
    Timeout,
}

/// One connection to `serve --listen`, read line by line with time limits.
pub struct Conn {
    /// The socket, for tests that set options on it or write from another thread.
    pub stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// The part of a line read so far.
    partial: Vec<u8>,
    /// The id [`Conn::request`] gives its next request.
    pub next_id: u64,
    /// How long [`Conn::line`] and what is built on it wait.
    limit: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Conn")
    }
}

impl Conn {
    /// Wraps a connected stream.
    pub fn new(stream: UnixStream) -> Conn {
        let reader = BufReader::new(stream.try_clone().expect("clone the socket"));
        Conn {
            stream,
            reader,
            partial: Vec::new(),
            next_id: 1,
            limit: Duration::from_secs(10),
        }
    }

    /// Connects to the broker at `sock`.
    pub fn connect(sock: &Path) -> Conn {
        Conn::new(
            UnixStream::connect(sock)
                .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display())),
        )
    }

    /// How long [`Conn::line`], [`Conn::message`] and [`Conn::request`] wait (10 s unless set).
    pub fn set_read_timeout(&mut self, limit: Duration) {
        self.limit = limit;
    }

    /// Writes raw bytes; the error, if the broker closed the connection.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends a request with the next numeric id; returns the id.
    pub fn send_numbered(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_request(&json!(id), method, params);
        id
    }

    /// The next line within the read timeout.
    pub fn line(&mut self) -> Got {
        self.next(self.limit)
    }

    /// The next message, which must come within the read timeout.
    pub fn message(&mut self, what: &str) -> Value {
        match self.line() {
            Got::Line(v) => v,
            Got::Eof => panic!("{what}: the broker closed the connection"),
            Got::Timeout => panic!("{what}: no answer within {:?}", self.limit),
        }
    }

    /// The response to the numeric `id` (notifications before it are passed over; a response
    /// to another request fails).
    pub fn response_to(&mut self, id: u64, what: &str) -> Value {
        loop {
            let m = self.message(what);
            if m.get("id").is_none() && m.get("method").is_some() {
                continue;
            }
            assert_eq!(m["id"], json!(id), "{what}: answer to another request: {m}");
            return m;
        }
    }

    /// Sends a request and waits for its response.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let what = format!("{method} {params}");
        let id = self.send_numbered(method, params);
        self.response_to(id, &what)
    }

    /// The result of a request that must succeed.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(
            r.get("result").is_some() && r.get("error").is_none(),
            "{method} {params} failed: {r}"
        );
        r["result"].clone()
    }

    /// Writes raw bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to the broker");
    }

    /// Writes one message as a line.
    pub fn send_msg(&mut self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.send(&line);
    }

    /// Sends a request with the given id.
    pub fn send_request(&mut self, id: &Value, method: &str, params: Value) {
        self.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    /// The next line (parsed), end of input, or nothing within `limit`. A read error (the
    /// broker reset the connection) counts as end of input.
    pub fn next(&mut self, limit: Duration) -> Got {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Got::Timeout;
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.reader.read_until(b'\n', &mut self.partial) {
                Ok(0) => return Got::Eof,
                Ok(_) if self.partial.ends_with(b"\n") => {
                    let line = std::mem::take(&mut self.partial);
                    let v = serde_json::from_slice(&line).unwrap_or_else(|e| {
                        panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&line))
                    });
                    return Got::Line(v);
                }
                Ok(_) => return Got::Eof,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Got::Eof,
            }
        }
    }

    /// The response to `id` within `limit` (other messages are passed over), or `None`.
    pub fn next_answer(&mut self, id: &Value, limit: Duration) -> Option<Value> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.next(left) {
                Got::Line(m) if m.get("method").is_none() && m["id"] == *id => return Some(m),
                Got::Line(_) => {}
                Got::Eof => panic!("the broker closed the connection before answering {id}"),
                Got::Timeout => return None,
            }
        }
    }

    /// The response to `id`, within `limit` (other messages are passed over).
    pub fn response(&mut self, id: &Value, limit: Duration) -> Value {
        self.next_answer(id, limit)
            .unwrap_or_else(|| panic!("no answer to {id} within {limit:?}"))
    }

    /// The response to `id`, or an error with `id: null` (a line the broker could not take
    /// in is refused without its id having been read), within `limit`; notifications are
    /// passed over.
    pub fn answer_or_null_error(&mut self, id: &Value, limit: Duration) -> Value {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.next(left) {
                Got::Line(m) if m.get("method").is_none() && m["id"] == *id => return m,
                Got::Line(m) if m.get("id") == Some(&Value::Null) && m.get("error").is_some() => {
                    return m;
                }
                Got::Line(_) => {}
                Got::Eof => panic!("the broker closed the connection before answering {id}"),
                Got::Timeout => panic!("no answer to {id} within {limit:?}"),
            }
        }
    }

    /// Sends `ping` and asserts it is answered `{}` within `limit`; returns how long it took.
    pub fn ping_within(&mut self, id: &str, limit: Duration) -> Duration {
        let id = json!(id);
        let started = Instant::now();
        self.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "ping"}));
        let r = self.answer_or_null_error(&id, limit);
        assert_eq!(r["result"], json!({}), "ping {id}: {r}");
        let took = started.elapsed();
        println!("ping {id} answered in {took:?}");
        took
    }

    /// Sends `ping` and asserts it is answered `{}` within 10 s.
    pub fn ping(&mut self, id: &str) {
        self.ping_within(id, Duration::from_secs(10));
    }

    /// Writes `data` from a thread of its own (the broker may stop reading); the receiver
    /// gets the outcome once the last byte is in the socket.
    pub fn write_in_background(&self, data: Vec<u8>) -> mpsc::Receiver<io::Result<()>> {
        let mut w = self.stream.try_clone().expect("clone the socket");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(w.write_all(&data));
        });
        rx
    }
}

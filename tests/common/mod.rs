//! Drives the real `fsbroker` binary over real pipes.

#![allow(dead_code)] // each test file uses its own part of this helper

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

use serde_json::{Value, json};

pub mod audit;
pub mod confine;
pub mod hostile;
pub mod peers;
pub mod policy;
pub mod procs;
pub mod socket;

pub use policy::{PolicyToml, RootToml};

/// A running `fsbroker serve` (or any subcommand) with piped stdin and stdout.
pub struct Broker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    /// The raw text of the last line read from stdout, for "no outside byte" checks.
    pub last_raw: String,
}

/// The `fsbroker` binary Cargo built for these tests, or the one `FSBROKER_TEST_BIN` names
/// (to show that a new test fails on an earlier build: docs/testing.md).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("FSBROKER_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_fsbroker").to_owned())
    })
}

impl Broker {
    /// Starts `fsbroker ARGS...` (stderr inherited, so its logs show in failing tests).
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Broker {
        Broker::spawn_program(bin(), args)
    }

    /// `fsbroker serve --root DIR` (read-only, consent auto).
    pub fn serve_root(dir: &Path) -> Broker {
        Broker::spawn(&["serve".as_ref(), "--root".as_ref(), dir.as_os_str()])
    }

    /// Writes raw bytes to the broker's stdin.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write to fsbroker");
        stdin.flush().expect("flush");
    }

    /// Sends a request with a fresh numeric id and returns that id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let mut line = serde_json::to_vec(&msg).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
        id
    }

    /// Reads one line from stdout and parses it.
    pub fn read_message(&mut self) -> Value {
        let mut line = String::new();
        let n = self
            .stdout
            .read_line(&mut line)
            .expect("read from fsbroker");
        assert!(n > 0, "fsbroker closed stdout");
        assert!(line.ends_with('\n'), "frame without newline: {line:?}");
        let v = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        self.last_raw = line;
        v
    }

    /// Sends a request and returns its response (which must carry the same id). A
    /// `notifications/roots/list_changed` arriving first (a grant made by `files/consent`
    /// sends one) is passed over; tests that watch for it use the live harness below.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        let mut resp = self.read_message();
        while resp.get("id").is_none() && resp["method"] == "notifications/roots/list_changed" {
            resp = self.read_message();
        }
        assert_eq!(resp["id"], json!(id), "response to another request: {resp}");
        assert_eq!(resp["jsonrpc"], "2.0");
        resp
    }

    /// The `result` of a request that must succeed.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let resp = self.request(method, params.clone());
        assert!(
            resp.get("error").is_none(),
            "{method} {params} failed: {resp}"
        );
        resp["result"].clone()
    }

    /// The `error` of a request that must fail.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let resp = self.request(method, params.clone());
        assert!(
            resp.get("result").is_none(),
            "{method} {params} should fail: {resp}"
        );
        resp["error"].clone()
    }

    /// Closes stdin and waits for exit; returns the status and whatever stdout still held.
    pub fn finish(mut self) -> (ExitStatus, String) {
        drop(self.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).expect("read rest");
        let status = self.child.wait().expect("wait");
        (status, rest)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `error.data.code` (the contract's string code), or the JSON-RPC number as a string for
/// protocol errors that have none.
pub fn code(error: &Value) -> String {
    match error["data"]["code"].as_str() {
        Some(s) => s.to_owned(),
        None => error["code"].to_string(),
    }
}

/// A temp directory with its canonical path (macOS-style `/tmp` symlinks resolved).
pub fn tempdir() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let p = t.path().canonicalize().expect("canonicalize");
    (t, p)
}

/// Runs `f` on its own thread and returns its result; if it has not finished within `limit`,
/// calls `on_timeout` (which may unblock it, e.g. by opening a FIFO's other end) and panics,
/// so a broker that blocks fails the test instead of hanging it. A panic in `f` is passed on.
pub fn with_deadline<T: Send + 'static>(
    limit: std::time::Duration,
    on_timeout: impl FnOnce(),
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(value) => {
            let _ = worker.join();
            value
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("worker ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            on_timeout();
            panic!("did not finish within {limit:?}: a request blocked");
        }
    }
}

/// Serves `root` as the root `r` (consent auto) through a policy file; `root_extra` goes into
/// the `[[root]]` table, `limits` into `[limits]`. The returned temp dir holds the policy.
pub fn serve_policy(root: &Path, root_extra: &str, limits: &str) -> (tempfile::TempDir, Broker) {
    let (t, dir) = tempdir();
    let policy = write_policy(&dir, root, root_extra, limits);
    let b = Broker::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    (t, b)
}

/// Writes `dir/policy.toml` serving `root` as the root `r` (consent auto); `root_extra` goes
/// into the `[[root]]` table, `limits` into `[limits]`. Returns the file's path.
pub fn write_policy(dir: &Path, root: &Path, root_extra: &str, limits: &str) -> std::path::PathBuf {
    PolicyToml::new()
        .root(RootToml::at(root).name("r").extra(root_extra))
        .table("limits", limits)
        .write_to(&dir.join("policy.toml"))
}

/// Percent-encodes a path for a `file://` URI: everything but unreserved characters and `/`.
pub fn uri_path(p: &Path) -> String {
    let mut s = String::new();
    for &byte in p.to_str().unwrap().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            s.push(byte as char);
        } else {
            s.push_str(&format!("%{byte:02X}"));
        }
    }
    s
}

impl Broker {
    /// Starts `program ARGS...` (for instance a shell that sets limits and then `exec`s
    /// [`bin`]) with the same pipes as [`Broker::spawn`].
    pub fn spawn_program<S: AsRef<std::ffi::OsStr>>(program: &str, args: &[S]) -> Broker {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Broker {
            child,
            stdin,
            stdout,
            next_id: 1,
            last_raw: String::new(),
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait")
    }

    /// Sends SIGKILL (no chance to clean up) and reaps the process.
    pub fn kill_now(&mut self) -> ExitStatus {
        self.child.kill().expect("SIGKILL fsbroker");
        self.child.wait().expect("wait")
    }
}

impl Broker {
    /// Starts `fsbroker ARGS...` in `cwd` with `RUST_LOG` set to `rust_log` and its stderr
    /// written to the file `stderr_file` (created or truncated), so a test can read the
    /// broker's log lines after it exits without a pipe that could fill up.
    pub fn spawn_stderr_to_file<S: AsRef<std::ffi::OsStr>>(
        args: &[S],
        cwd: &Path,
        rust_log: &str,
        stderr_file: &Path,
    ) -> Broker {
        let err = std::fs::File::create(stderr_file)
            .unwrap_or_else(|e| panic!("create {}: {e}", stderr_file.display()));
        let mut child = Command::new(bin())
            .args(args)
            .current_dir(cwd)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin()));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Broker {
            child,
            stdin,
            stdout,
            next_id: 1,
            last_raw: String::new(),
        }
    }
}

impl Broker {
    /// Like [`Broker::serve_root`] (read-only, consent auto, named after the directory) but
    /// with no request rate limit, for tests that send thousands of requests.
    pub fn serve_root_unlimited(dir: &Path) -> (tempfile::TempDir, Broker) {
        let (t, pdir) = tempdir();
        let policy = PolicyToml::new()
            .root(RootToml::at(dir))
            .unlimited()
            .write_to(&pdir.join("policy.toml"));
        let b = Broker::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
        (t, b)
    }
}

impl Broker {
    /// Takes the broker's stdin, so a thread of its own can write requests while this one
    /// reads responses (until [`Broker::put_stdin`], `send` and `send_raw` panic).
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin open")
    }

    /// Gives back a stdin taken with [`Broker::take_stdin`].
    pub fn put_stdin(&mut self, stdin: ChildStdin) {
        self.stdin = Some(stdin);
    }
}

/// One request line (`\n`-terminated) with the given id, for pipelining.
pub fn request_line(id: u64, method: &str, params: Value) -> Vec<u8> {
    let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let mut line = serde_json::to_vec(&msg).unwrap();
    line.push(b'\n');
    line
}

/// A field of `/proc/PID/status` given in kB (`VmRSS`, `VmHWM`, ...), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

// ---------------------------------------------------------------------------------------------
// A live broker for tests that see notifications: stdout and stderr read by threads, every
// wait bounded.
// ---------------------------------------------------------------------------------------------

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Lets a test stop a [`LiveBroker`]'s stdout reader, so the broker's output backs up in the
/// pipe (a server that stops reading).
#[derive(Default)]
pub struct ReadGate {
    paused: Mutex<bool>,
    cv: Condvar,
}

impl ReadGate {
    fn set(&self, paused: bool) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = paused;
        self.cv.notify_all();
    }

    fn wait_open(&self) {
        let mut p = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        while *p {
            p = self.cv.wait(p).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The live driver: a session with a broker whose output is read by a thread (each message
/// stamped with its arrival time; the thread can be paused). Over stdio
/// ([`LiveBroker::start`]: `fsbroker serve ...`, or `fsbroker proxy ... -- SERVER`, whose
/// stdio is the host's side) the process's stderr is read by another thread (kept, offered
/// line by line, and echoed so a failing test shows the broker's log); over a shared
/// broker's socket ([`LiveBroker::connect`]) there is no process and no log. Responses are
/// matched to requests by id; notifications read meanwhile are set aside. Every wait is
/// bounded.
pub struct LiveBroker {
    /// The broker's process (none for a connection to a shared broker).
    child: Option<Child>,
    stdin: Option<Box<dyn Write + Send>>,
    out: Receiver<(Instant, Value)>,
    err: Receiver<String>,
    gate: Arc<ReadGate>,
    /// Every stderr line so far.
    log: Arc<Mutex<Vec<String>>>,
    /// Notifications read while waiting for a response, oldest first.
    notes: VecDeque<(Instant, Value)>,
    /// Responses read while waiting for something else, by id.
    early: HashMap<u64, Value>,
    next_id: u64,
    /// Longest wait for a response.
    deadline: Duration,
}

impl LiveBroker {
    /// Starts `fsbroker ARGS...`; responses are waited for at most `deadline`. Does not wait
    /// for the broker to answer.
    pub fn start<S: AsRef<std::ffi::OsStr>>(args: &[S], deadline: Duration) -> LiveBroker {
        let mut child = Command::new(bin())
            .args(args)
            .env("RUST_LOG", "fsbroker=info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start fsbroker");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        LiveBroker::over(Some(child), Box::new(stdin), stdout, Some(stderr), deadline)
    }

    /// A new session with the shared broker listening at `sock` (`serve --listen`).
    pub fn connect(sock: &Path, deadline: Duration) -> LiveBroker {
        let stream = std::os::unix::net::UnixStream::connect(sock)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display()));
        let reader = stream.try_clone().expect("clone the socket");
        LiveBroker::over(None, Box::new(stream), reader, None, deadline)
    }

    fn over(
        child: Option<Child>,
        stdin: Box<dyn Write + Send>,
        stdout: impl std::io::Read + Send + 'static,
        stderr: Option<std::process::ChildStderr>,
        deadline: Duration,
    ) -> LiveBroker {
        let gate = Arc::new(ReadGate::default());
        let (out_tx, out) = channel();
        let g = Arc::clone(&gate);
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                g.wait_open();
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let at = Instant::now();
                        assert!(line.ends_with('\n'), "frame without newline: {line:?}");
                        let v: Value = serde_json::from_str(&line)
                            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
                        if out_tx.send((at, v)).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let log = Arc::new(Mutex::new(Vec::new()));
        let (err_tx, err) = channel();
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            let Some(stderr) = stderr else { return };
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[fsbroker] {line}");
                kept.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.clone());
                let _ = err_tx.send(line);
            }
        });
        LiveBroker {
            child,
            stdin: Some(stdin),
            out,
            err,
            gate,
            log,
            notes: VecDeque::new(),
            early: HashMap::new(),
            next_id: 1,
            deadline,
        }
    }

    /// The child's process id (a connection to a shared broker has none).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("a connection has no process")
            .id()
    }

    /// The child's exit status, if it has exited (never, for a connection).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().expect("wait")
    }

    /// Whether the process is still running (a connection: always).
    pub fn alive(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Stops reading the broker's stdout (at most the line being read gets through).
    pub fn pause_reading(&self) {
        self.gate.set(true);
    }

    /// Undoes [`LiveBroker::pause_reading`].
    pub fn resume_reading(&self) {
        self.gate.set(false);
    }

    /// Writes `bytes` as they are (a forged or malformed line, a notification).
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write to fsbroker");
        stdin.flush().expect("flush");
    }

    /// Sends a request; returns its id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .unwrap();
        line.push(b'\n');
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(&line).expect("write to fsbroker");
        stdin.flush().expect("flush");
        id
    }

    /// The next message from stdout within `limit`, with its arrival time (`None` on
    /// timeout). Panics if the broker closed stdout.
    pub fn next_raw(&mut self, limit: Duration) -> Option<(Instant, Value)> {
        match self.out.recv_timeout(limit) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.try_wait();
                panic!("fsbroker closed stdout (exit status {status:?})")
            }
        }
    }

    /// A message with a `method` and no `id`.
    pub fn is_notification(m: &Value) -> bool {
        m.get("method").is_some() && m.get("id").is_none()
    }

    /// Files a message that is not the one being waited for: a notification goes to the
    /// set-aside queue, a response is kept for [`LiveBroker::response`]; anything else (a
    /// request from the broker, a response without a numeric id) fails the test.
    pub fn set_aside(&mut self, at: Instant, m: Value) {
        if LiveBroker::is_notification(&m) {
            self.notes.push_back((at, m));
        } else {
            assert!(m.get("method").is_none(), "the broker sent a request: {m}");
            let id = m["id"].as_u64().unwrap_or_else(|| panic!("odd id: {m}"));
            self.early.insert(id, m);
        }
    }

    /// The oldest notification set aside, if any.
    pub fn pop_note(&mut self) -> Option<(Instant, Value)> {
        self.notes.pop_front()
    }

    /// Waits for the response to `id`; notifications that come first are set aside.
    pub fn response(&mut self, id: u64) -> Value {
        if let Some(r) = self.early.remove(&id) {
            return r;
        }
        let deadline = self.deadline;
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let Some((at, m)) = self.next_raw(left) else {
                panic!("no response to request {id} within {deadline:?}");
            };
            if m.get("method").is_none() && m["id"] == json!(id) {
                assert_eq!(m["jsonrpc"], "2.0", "{m}");
                return m;
            }
            self.set_aside(at, m);
        }
    }

    /// Sends a request and waits for its response.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.response(id)
    }

    /// The result of a request that must succeed.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(r.get("error").is_none(), "{method} {params} failed: {r}");
        r["result"].clone()
    }

    /// The error of a request that must fail.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(
            r.get("result").is_none(),
            "{method} {params} should fail: {r}"
        );
        r["error"].clone()
    }

    /// The next notification (set aside or waiting up to `limit`), with its arrival time.
    pub fn next_notification(&mut self, limit: Duration) -> Option<(Instant, Value)> {
        if let Some(n) = self.notes.pop_front() {
            return Some(n);
        }
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let (at, m) = self.next_raw(left)?;
            if LiveBroker::is_notification(&m) {
                return Some((at, m));
            }
            self.set_aside(at, m);
        }
    }

    /// The next stderr line not yet taken or drained, waiting up to `limit` (`None` on
    /// timeout or once stderr is closed and empty).
    pub fn next_log_line(&mut self, limit: Duration) -> Option<String> {
        self.err.recv_timeout(limit).ok()
    }

    /// Discards stderr lines read so far from [`LiveBroker::next_log_line`] (they stay in the
    /// log).
    pub fn drain_log(&mut self) {
        while self.err.try_recv().is_ok() {}
    }

    /// How many stderr lines have been read so far.
    pub fn log_len(&self) -> usize {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The stderr lines read since line `from`.
    pub fn log_since(&self, from: usize) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.get(from..).unwrap_or_default().to_vec()
    }

    /// Closes the broker's input (end of the session, as a peer that leaves).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Whether the broker closes its output within `limit` (messages before that are
    /// dropped): it has ended its session, even where its process cannot be reaped yet.
    pub fn output_closed_within(&mut self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return false,
                Err(RecvTimeoutError::Disconnected) => return true,
            }
        }
    }

    /// Waits at most `limit` for the broker's process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every stderr line so far, joined by newlines.
    pub fn log_text(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }
}

impl Drop for LiveBroker {
    fn drop(&mut self) {
        self.gate.set(false);
        drop(self.stdin.take());
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The real python interpreter (not a version-manager shim, so a kill reaches python itself).
pub fn python() -> &'static str {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .stderr(Stdio::inherit())
            .output()
            .expect("python3 is needed by these tests");
        assert!(out.status.success(), "python3 failed");
        let exe = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(!exe.is_empty(), "python3 did not name its executable");
        exe
    })
}

/// A path as text (temp paths are UTF-8).
pub fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// A TOML literal string holding `p` (temp paths hold no `'`).
pub fn lit(p: &Path) -> String {
    let s = path_str(p);
    assert!(!s.contains('\''), "temp path unusable in a TOML literal");
    format!("'{s}'")
}

/// Everything beneath `dir`, never following a symlink: relative path → `dir`,
/// `file:CONTENT` or `link:TARGET`.
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let rel = path_str(path.strip_prefix(base).unwrap());
            let ft = entry.file_type().unwrap();
            if ft.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, format!("link:{}", target.display()));
            } else if ft.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &path, out);
            } else {
                let content = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                out.insert(rel, format!("file:{content}"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

//! Drives the real `fsbroker` binary over real pipes.

#![allow(dead_code)] // each test file uses its own part of this helper

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

use serde_json::{Value, json};

/// A running `fsbroker serve` (or any subcommand) with piped stdin and stdout.
pub struct Broker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    /// The raw text of the last line read from stdout, for "no outside byte" checks.
    pub last_raw: String,
}

/// The `fsbroker` binary Cargo built for these tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fsbroker")
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

    /// Sends a request and returns its response (which must carry the same id).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        let resp = self.read_message();
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
    let policy = dir.join("policy.toml");
    let root = root.to_str().unwrap();
    assert!(!root.contains('\''), "temp path unusable in a TOML literal");
    std::fs::write(
        &policy,
        format!(
            "[[root]]\npath = '{root}'\nname = \"r\"\nconsent = \"auto\"\n{root_extra}\n\n[limits]\n{limits}\n"
        ),
    )
    .unwrap();
    let b = Broker::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    (t, b)
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
        let policy = pdir.join("policy.toml");
        let path = dir.to_str().unwrap();
        assert!(!path.contains('\''), "temp path unusable in a TOML literal");
        std::fs::write(
            &policy,
            format!(
                "[[root]]\npath = '{path}'\nconsent = \"auto\"\n\n[limits]\nrequests_per_second = 0\n"
            ),
        )
        .unwrap();
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

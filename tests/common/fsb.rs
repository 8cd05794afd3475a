//! The process driver: the real `fsbroker` binary ([`super::bin`], which honours
//! `FSBROKER_TEST_BIN`) and a session with it, over the stdio of a process the test started
//! (`serve`; `proxy ... -- SERVER`, whose stdio is the host's side) or over a connection to a
//! shared broker's socket ([`Listener`]: `serve --listen`).
//!
//! [`Fsb`] is the one driver. A thread reads its output line by line (each line stamped with
//! its arrival time, parsed when it is JSON); how much it reads is the test's choice:
//!
//! - **on demand** ([`Fsb::spawn`], [`Fsb::connect`]): only while the test waits for a message,
//!   so a test that reads nothing leaves the broker's output in the pipe or socket (a peer
//!   that stops reading);
//! - **ahead** ([`Fsb::start`], [`Fsb::connect_live`]): everything, as it comes, so arrival
//!   times are exact and pipelined floods never back up; [`Fsb::pause_reading`] stops it.
//!
//! Messages read while waiting for something else are set aside in arrival order and handed
//! out by whatever asks next; nothing read is lost. Every wait is bounded: by the session's
//! deadline ([`Fsb::set_deadline`]) or by the limit the call is given.
//!
//! [`Cmd`] starts a process with more than the shortcuts say: environment, working
//! directory, where its stderr goes ([`Log`]), a process group of its own, registration with
//! a test's [`Pids`].
//!
//! One file though long: the driver is one type and its builder; spawning, reading ahead or on
//! demand and waiting all share the reader thread's state.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::bin;
use super::procs::{Pids, kill_group};

/// How long a spawned broker's session waits for a message unless told otherwise: a hang
/// guard, far above anything a request takes.
pub const SPAWN_DEADLINE: Duration = Duration::from_secs(300);
/// How long a socket session ([`Fsb::connect`]) waits for a message unless told otherwise.
pub const SOCKET_DEADLINE: Duration = Duration::from_secs(10);

/// Where a started process's stderr goes.
#[derive(Debug)]
pub enum Log {
    /// The test's own stderr (shown when a test fails).
    Inherit,
    /// Read by a thread: kept (for [`Fsb::log_text`], [`Fsb::next_log_line`], ...) and echoed
    /// with a `[fsbroker]` prefix, so a failing test shows it.
    Keep,
    /// Into this file (created or truncated), to be read after the process exits.
    File(PathBuf),
    /// Nowhere.
    Null,
    /// A pipe whose reading end is already closed (a host that closed it): writes fail.
    Closed,
    /// This descriptor (the writing end of a pipe the test reads when it likes, say).
    Fd(std::os::fd::OwnedFd),
}

/// One line of output: its bytes (newline included), when it was read, and its JSON (`None`
/// when it is not JSON).
#[derive(Clone, Debug)]
pub struct Line {
    pub at: Instant,
    pub raw: Vec<u8>,
    pub json: Option<Value>,
}

impl Line {
    /// The line as JSON; panics when it is not.
    pub fn value(&self) -> Value {
        self.json
            .clone()
            .unwrap_or_else(|| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.raw)))
    }

    /// The line as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// A message with a `method` and no `id`.
    pub fn is_notification(&self) -> bool {
        self.json.as_ref().is_some_and(is_notification)
    }
}

/// A message with a `method` and no `id`.
pub fn is_notification(m: &Value) -> bool {
    m.get("method").is_some() && m.get("id").is_none()
}

/// What a bounded read of one message found.
#[derive(Debug)]
pub enum Got {
    /// A message (a line that is not JSON fails the test).
    Line(Value),
    /// The output closed (or broke, or ended in the middle of a line).
    Eof,
    /// Nothing within the limit.
    Timeout,
}

/// What a bounded read of one raw line found.
#[derive(Debug)]
pub enum Raw {
    Line(Line),
    /// The output ended: what came after the last newline, and the read error if it broke.
    End {
        partial: Vec<u8>,
        error: Option<String>,
    },
    Timeout,
}

/// What the reader thread sends.
enum Event {
    Line(Line),
    End {
        partial: Vec<u8>,
        error: Option<String>,
    },
}

/// When the reader thread may read: ahead (always), or while the test waits; never while
/// paused.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    ahead: bool,
    paused: bool,
    waiting: bool,
    closing: bool,
}

impl Gate {
    fn update(&self, f: impl FnOnce(&mut GateState)) {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.cv.notify_all();
    }

    /// Blocks until a read is allowed.
    fn wait_open(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while !s.closing && (s.paused || !(s.ahead || s.waiting)) {
            s = self.cv.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Reads `from` line by line into `tx`, as `gate` allows.
fn read_lines(from: impl Read + Send + 'static, gate: Arc<Gate>) -> Receiver<Event> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        loop {
            gate.wait_open();
            let mut buf = Vec::new();
            let end = match r.read_until(b'\n', &mut buf) {
                Ok(0) => Some(None),
                Ok(_) if buf.ends_with(b"\n") => None,
                Ok(_) => Some(None),
                Err(e) => Some(Some(e.to_string())),
            };
            if let Some(error) = end {
                let _ = tx.send(Event::End {
                    partial: buf,
                    error,
                });
                return;
            }
            let at = Instant::now();
            let json = serde_json::from_slice(&buf).ok();
            if tx.send(Event::Line(Line { at, raw: buf, json })).is_err() {
                return;
            }
        }
    });
    rx
}

/// The stderr reader: every line kept and echoed, and offered to [`Fsb::next_log_line`].
struct Stderr {
    lines: Receiver<String>,
    kept: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn read_stderr(stderr: impl Read + Send + 'static) -> Stderr {
    let kept = Arc::new(Mutex::new(Vec::new()));
    let (tx, lines) = channel();
    let k = Arc::clone(&kept);
    let thread = std::thread::spawn(move || {
        let mut r = BufReader::new(stderr);
        loop {
            let mut buf = Vec::new();
            match r.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if buf.ends_with(b"\n") {
                buf.pop();
            }
            let line = String::from_utf8_lossy(&buf).into_owned();
            eprintln!("[fsbroker] {line}");
            k.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(line.clone());
            let _ = tx.send(line);
        }
    });
    Stderr {
        lines,
        kept,
        thread: Some(thread),
    }
}

/// How to start a process to drive: `fsbroker ARGS...` unless [`Cmd::program`] says
/// otherwise. Built, then [`Cmd::spawn`]ed.
pub struct Cmd {
    program: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    /// Variables of the test's own environment the process does not get.
    unset: Vec<OsString>,
    cwd: Option<PathBuf>,
    log: Log,
    group: bool,
    pids: Option<Pids>,
    ahead: bool,
    record: bool,
    deadline: Duration,
    fd_limit: Option<u32>,
}

impl Cmd {
    /// `fsbroker ARGS...`: stderr inherited, read on demand, [`SPAWN_DEADLINE`].
    pub fn new<S: AsRef<OsStr>>(args: &[S]) -> Cmd {
        Cmd::program(bin(), args)
    }

    /// `PROGRAM ARGS...` (a shell that sets a limit and then `exec`s [`bin`], `env`, a pty
    /// helper), otherwise as [`Cmd::new`].
    pub fn program<P: AsRef<OsStr>, S: AsRef<OsStr>>(program: P, args: &[S]) -> Cmd {
        Cmd {
            program: program.as_ref().to_owned(),
            args: args.iter().map(|a| a.as_ref().to_owned()).collect(),
            env: Vec::new(),
            unset: Vec::new(),
            cwd: None,
            log: Log::Inherit,
            group: false,
            pids: None,
            ahead: false,
            record: false,
            deadline: SPAWN_DEADLINE,
            fd_limit: None,
        }
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Cmd {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Leaves an environment variable of the test's out.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Cmd {
        self.unset.push(key.as_ref().to_owned());
        self
    }

    /// Runs in `dir`.
    pub fn cwd(mut self, dir: &Path) -> Cmd {
        self.cwd = Some(dir.to_owned());
        self
    }

    /// Where stderr goes.
    pub fn log(mut self, log: Log) -> Cmd {
        self.log = log;
        self
    }

    /// In a process group of its own, killed as a group when dropped (the consent commands
    /// it runs with it).
    pub fn group(mut self) -> Cmd {
        self.group = true;
        self
    }

    /// Registers the process with `pids`, so a test past its deadline kills it.
    pub fn pids(mut self, pids: &Pids) -> Cmd {
        self.pids = Some(pids.clone());
        self
    }

    /// Reads the output ahead, as it comes (see the module's doc).
    pub fn ahead(mut self) -> Cmd {
        self.ahead = true;
        self
    }

    /// Records every line read, in order ([`Fsb::received`]).
    pub fn record(mut self) -> Cmd {
        self.record = true;
        self
    }

    /// How long a wait for a message may take.
    pub fn deadline(mut self, deadline: Duration) -> Cmd {
        self.deadline = deadline;
        self
    }

    /// Under `ulimit -n LIMIT` (through `sh -c`, which then `exec`s the program, so the pid is
    /// the program's).
    pub fn fd_limit(mut self, limit: u32) -> Cmd {
        self.fd_limit = Some(limit);
        self
    }

    /// The command, with stdin and stdout as given (the log is taken: a command is made once).
    fn command(&mut self, stdin: Stdio, stdout: Stdio) -> Command {
        let mut cmd = match self.fd_limit {
            Some(n) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                    .arg(&self.program)
                    .args(&self.args);
                c
            }
            None => {
                let mut c = Command::new(&self.program);
                c.args(&self.args);
                c
            }
        };
        for key in &self.unset {
            cmd.env_remove(key);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(stdin)
            .stdout(stdout);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if self.group {
            cmd.process_group(0);
        }
        match std::mem::replace(&mut self.log, Log::Inherit) {
            Log::Inherit => cmd.stderr(Stdio::inherit()),
            Log::Keep => cmd.stderr(Stdio::piped()),
            Log::Closed => {
                self.log = Log::Closed;
                cmd.stderr(Stdio::piped())
            }
            Log::Null => cmd.stderr(Stdio::null()),
            Log::File(path) => {
                let f = std::fs::File::create(&path)
                    .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
                cmd.stderr(Stdio::from(f))
            }
            Log::Fd(fd) => cmd.stderr(Stdio::from(fd)),
        };
        cmd
    }

    /// Starts the process with its stdin and stdout piped to the test. Does not wait for it
    /// to answer.
    pub fn spawn(mut self) -> Fsb {
        let mut child = self
            .command(Stdio::piped(), Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.program.to_string_lossy()));
        if let Some(pids) = &self.pids {
            pids.add(child.id());
        }
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = match self.log {
            // Closed at once: the process writes into a pipe nobody will read.
            Log::Closed => {
                drop(child.stderr.take());
                None
            }
            _ => child.stderr.take().map(read_stderr),
        };
        let mut f = Fsb::over(Box::new(stdin), stdout, None, self.ahead, self.deadline);
        f.child = Some(child);
        f.group = self.group;
        f.received = self.record.then(Vec::new);
        f.stderr = stderr;
        f
    }
}

/// A session with a broker: the process's stdio, or a connection to a shared broker. See the
/// module's doc.
pub struct Fsb {
    /// The process (none for a connection to a shared broker).
    child: Option<Child>,
    /// Whether the process leads a group of its own (killed as a group).
    group: bool,
    /// The socket (a connection only).
    socket: Option<UnixStream>,
    stdin: Option<Box<dyn Write + Send>>,
    out: Receiver<Event>,
    gate: Arc<Gate>,
    /// How the output ended, once it has.
    ended: Option<(Vec<u8>, Option<String>)>,
    stderr: Option<Stderr>,
    /// Lines read while waiting for something else, oldest first.
    pending: VecDeque<Line>,
    /// Every line read, in order, when recorded ([`Cmd::record`]).
    received: Option<Vec<Vec<u8>>>,
    /// Numeric ids of the requests written and not yet answered.
    asked: std::collections::BTreeSet<u64>,
    /// The id [`Fsb::send`] gives its next request.
    pub next_id: u64,
    /// Longest wait for a message.
    deadline: Duration,
    /// The raw text of the last message [`Fsb::read_message`] or a response returned, for
    /// "no outside byte" checks.
    pub last_raw: String,
}

impl std::fmt::Debug for Fsb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.child {
            Some(c) => write!(f, "Fsb(pid {})", c.id()),
            None => f.write_str("Fsb(connection)"),
        }
    }
}

impl Fsb {
    /// `fsbroker ARGS...` (stderr inherited, output read on demand). See [`Cmd`] for more.
    pub fn spawn<S: AsRef<OsStr>>(args: &[S]) -> Fsb {
        Cmd::new(args).spawn()
    }

    /// `PROGRAM ARGS...` (for instance a shell that sets limits and then `exec`s [`bin`]) as
    /// [`Fsb::spawn`].
    pub fn spawn_program<P: AsRef<OsStr>, S: AsRef<OsStr>>(program: P, args: &[S]) -> Fsb {
        Cmd::program(program, args).spawn()
    }

    /// `fsbroker serve --root DIR` (read-only, consent auto).
    pub fn serve_root(dir: &Path) -> Fsb {
        Fsb::spawn(&["serve".as_ref(), "--root".as_ref(), dir.as_os_str()])
    }

    /// Like [`Fsb::serve_root`] (read-only, consent auto, named after the directory) but
    /// with no request rate limit, for tests that send thousands of requests. The returned
    /// temp dir holds the policy.
    pub fn serve_root_unlimited(dir: &Path) -> (tempfile::TempDir, Fsb) {
        let (t, pdir) = super::tempdir();
        let policy = super::PolicyToml::new()
            .root(super::RootToml::at(dir))
            .unlimited()
            .write_to(&pdir.join("policy.toml"));
        let b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
        (t, b)
    }

    /// The live driver: `fsbroker ARGS...` with `RUST_LOG=fsbroker=info`, its stderr kept
    /// ([`Log::Keep`]) and its output read ahead; responses are waited for at most
    /// `deadline`. Does not wait for the broker to answer.
    pub fn start<S: AsRef<OsStr>>(args: &[S], deadline: Duration) -> Fsb {
        Cmd::new(args)
            .env("RUST_LOG", "fsbroker=info")
            .log(Log::Keep)
            .ahead()
            .deadline(deadline)
            .spawn()
    }

    /// A new session with the shared broker at `sock`, read on demand, waits bounded by
    /// [`SOCKET_DEADLINE`].
    pub fn connect(sock: &Path) -> Fsb {
        Fsb::over_socket(
            UnixStream::connect(sock)
                .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display())),
            false,
            SOCKET_DEADLINE,
        )
    }

    /// [`Fsb::connect`] with the output read ahead and waits bounded by `deadline`.
    pub fn connect_live(sock: &Path, deadline: Duration) -> Fsb {
        Fsb::over_socket(
            UnixStream::connect(sock)
                .unwrap_or_else(|e| panic!("connect to {}: {e}", sock.display())),
            true,
            deadline,
        )
    }

    /// A session over a stream already connected (read on demand, [`SOCKET_DEADLINE`]).
    pub fn from_stream(stream: UnixStream) -> Fsb {
        Fsb::over_socket(stream, false, SOCKET_DEADLINE)
    }

    /// A session over a connected stream.
    pub fn over_socket(stream: UnixStream, ahead: bool, deadline: Duration) -> Fsb {
        let reader = stream.try_clone().expect("clone the socket");
        let writer = stream.try_clone().expect("clone the socket");
        let mut f = Fsb::over(Box::new(writer), reader, None, ahead, deadline);
        f.socket = Some(stream);
        f
    }

    fn over(
        stdin: Box<dyn Write + Send>,
        stdout: impl Read + Send + 'static,
        stderr: Option<Stderr>,
        ahead: bool,
        deadline: Duration,
    ) -> Fsb {
        let gate = Arc::new(Gate::default());
        gate.update(|s| s.ahead = ahead);
        let out = read_lines(stdout, Arc::clone(&gate));
        Fsb {
            child: None,
            group: false,
            socket: None,
            stdin: Some(stdin),
            out,
            gate,
            ended: None,
            stderr,
            pending: VecDeque::new(),
            received: None,
            asked: Default::default(),
            next_id: 1,
            deadline,
            last_raw: String::new(),
        }
    }

    // -----------------------------------------------------------------------------------------
    // The process
    // -----------------------------------------------------------------------------------------

    /// The process's id (a connection to a shared broker has none).
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("a connection has no process")
            .id()
    }

    /// The exit status, if the process has exited (never, for a connection).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().expect("wait")
    }

    /// Whether the process is still running (a connection: always).
    pub fn alive(&mut self) -> bool {
        self.try_wait().is_none()
    }

    /// Panics, naming `what`, when the process has exited.
    pub fn assert_alive(&mut self, what: &str) {
        if let Some(status) = self.try_wait() {
            panic!("{what} exited ({status})");
        }
    }

    /// Waits at most `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid() as i32).unwrap();
        rustix::process::kill_process(pid, signal).expect("signal fsbroker");
    }

    /// Sends SIGKILL (no chance to clean up) and reaps the process.
    pub fn kill_now(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("a connection has no process");
        child.kill().expect("SIGKILL fsbroker");
        child.wait().expect("wait")
    }

    // -----------------------------------------------------------------------------------------
    // Writing
    // -----------------------------------------------------------------------------------------

    /// Writes `bytes` as they are (a forged or malformed line, a notification); panics when
    /// the broker does not take them.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.try_send_raw(bytes).expect("write to fsbroker");
    }

    /// Writes `bytes`; the error, if the broker closed its input.
    pub fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        // The numeric ids of the requests among them (lines of up to 1 MiB), so that their
        // responses may be set aside while another is waited for.
        for line in bytes.split(|&b| b == b'\n').filter(|l| l.len() <= 1 << 20) {
            if let Ok(m) = serde_json::from_slice::<Value>(line) {
                if let (Some(_), Some(id)) = (m.get("method"), m.get("id").and_then(Value::as_u64))
                {
                    self.asked.insert(id);
                }
            }
        }
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes)?;
        stdin.flush()
    }

    /// Writes one message as a line.
    pub fn send_msg(&mut self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap();
        line.push(b'\n');
        self.send_raw(&line);
    }

    /// Sends a request with the given id.
    pub fn send_request(&mut self, id: &Value, method: &str, params: Value) {
        self.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    /// Sends a request with the next numeric id; returns the id.
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_request(&json!(id), method, params);
        id
    }

    /// Takes the broker's input, so a thread of its own can write requests while this one
    /// reads responses (until [`Fsb::put_stdin`], writing here panics).
    pub fn take_stdin(&mut self) -> Box<dyn Write + Send> {
        self.stdin.take().expect("stdin open")
    }

    /// Gives back an input taken with [`Fsb::take_stdin`].
    pub fn put_stdin(&mut self, stdin: Box<dyn Write + Send>) {
        self.stdin = Some(stdin);
    }

    /// Closes the broker's input (the end of the session, as a peer that leaves; for a
    /// connection, a shutdown of its writing side).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
        if let Some(s) = &self.socket {
            let _ = s.shutdown(std::net::Shutdown::Write);
        }
    }

    /// The socket of a connection, for tests that set options on it.
    pub fn stream(&self) -> &UnixStream {
        self.socket.as_ref().expect("not a connection")
    }

    /// Writes `data` from a thread of its own (the broker may stop reading); the receiver
    /// gets the outcome once the last byte is in. A connection only.
    pub fn write_in_background(&self, data: Vec<u8>) -> Receiver<io::Result<()>> {
        let mut w = self.stream().try_clone().expect("clone the socket");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let _ = tx.send(w.write_all(&data));
        });
        rx
    }

    // -----------------------------------------------------------------------------------------
    // Reading
    // -----------------------------------------------------------------------------------------

    /// Longest wait for a message from now on.
    pub fn set_deadline(&mut self, deadline: Duration) {
        self.deadline = deadline;
    }

    /// The session's deadline.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Stops reading the output (at most the line being read gets through).
    pub fn pause_reading(&self) {
        self.gate.update(|s| s.paused = true);
    }

    /// Undoes [`Fsb::pause_reading`].
    pub fn resume_reading(&self) {
        self.gate.update(|s| s.paused = false);
    }

    /// A line from the reader within `limit`, set-aside lines not consulted.
    fn fresh(&mut self, limit: Duration) -> Raw {
        if let Some((partial, error)) = &self.ended {
            return Raw::End {
                partial: partial.clone(),
                error: error.clone(),
            };
        }
        self.gate.update(|s| s.waiting = true);
        let got = self.out.recv_timeout(limit);
        self.gate.update(|s| s.waiting = false);
        match got {
            Ok(Event::Line(l)) => {
                if let Some(r) = self.received.as_mut() {
                    r.push(l.raw.clone());
                }
                Raw::Line(l)
            }
            Ok(Event::End { partial, error }) => {
                self.ended = Some((partial.clone(), error.clone()));
                Raw::End { partial, error }
            }
            Err(RecvTimeoutError::Timeout) => Raw::Timeout,
            Err(RecvTimeoutError::Disconnected) => Raw::End {
                partial: Vec::new(),
                error: Some("the reader is gone".into()),
            },
        }
    }

    /// Every line read so far (newline included), in order: what the peer received.
    /// Recorded sessions only ([`Cmd::record`]).
    pub fn received(&self) -> &[Vec<u8>] {
        self.received
            .as_deref()
            .expect("not recorded (Cmd::record)")
    }

    /// The next raw line (set-aside ones first) within `limit`.
    pub fn next_line(&mut self, limit: Duration) -> Raw {
        match self.pending.pop_front() {
            Some(l) => Raw::Line(l),
            None => self.fresh(limit),
        }
    }

    /// Panics: the output ended while waiting for `what`.
    fn ended_panic(&mut self, what: &str, partial: &[u8], error: Option<String>) -> ! {
        assert!(
            partial.is_empty(),
            "frame without newline while waiting for {what}: {:?}",
            String::from_utf8_lossy(partial)
        );
        if let Some(e) = error {
            panic!("reading from fsbroker failed while waiting for {what}: {e}");
        }
        let status = self.try_wait();
        panic!("fsbroker closed its output while waiting for {what} (exit status {status:?})")
    }

    /// The next message (set-aside ones first) within `limit`: `None` on timeout; panics when
    /// the output ends or a line is not JSON.
    pub fn next_stamped(&mut self, limit: Duration) -> Option<(Instant, Value)> {
        match self.next_line(limit) {
            Raw::Line(l) => Some((l.at, l.value())),
            Raw::Timeout => None,
            Raw::End { partial, error } => self.ended_panic("a message", &partial, error),
        }
    }

    /// The next message (set-aside ones first) within `limit`, end of output (a broken or
    /// cut-off one included), or nothing. A line that is not JSON fails.
    pub fn next(&mut self, limit: Duration) -> Got {
        match self.next_line(limit) {
            Raw::Line(l) => Got::Line(l.value()),
            Raw::Timeout => Got::Timeout,
            Raw::End { .. } => Got::Eof,
        }
    }

    /// The next message within the session's deadline; panics on end of output or timeout.
    pub fn read_message(&mut self) -> Value {
        let deadline = self.deadline;
        match self.next_line(deadline) {
            Raw::Line(l) => {
                let v = l.value();
                if let Some(id) = v.get("id").and_then(Value::as_u64) {
                    self.asked.remove(&id);
                }
                self.last_raw = l.text();
                v
            }
            Raw::Timeout => panic!("no message from fsbroker within {deadline:?}"),
            Raw::End { partial, error } => self.ended_panic("a message", &partial, error),
        }
    }

    /// Sets a line aside: a response to a request this session sent is kept for
    /// [`Fsb::response`], a notification for [`Fsb::next_notification`]; a request from the
    /// broker, or a response to nothing asked, fails the test.
    fn set_aside(&mut self, l: Line) {
        let m = l.value();
        if !is_notification(&m) {
            assert!(m.get("method").is_none(), "the broker sent a request: {m}");
            let asked = m["id"].as_u64().is_some_and(|id| self.asked.contains(&id));
            assert!(asked, "a response to another request: {m}");
        }
        self.pending.push_back(l);
    }

    /// The first set-aside line `want` accepts, taken out.
    fn take_pending(&mut self, want: impl Fn(&Line) -> bool) -> Option<Line> {
        let i = self.pending.iter().position(want)?;
        self.pending.remove(i)
    }

    /// Waits up to `limit` for a line `want` accepts (set-aside ones first); lines read
    /// meanwhile go through `aside`. `Err` with how the output ended, or `Ok(None)` on timeout.
    fn wait_for(
        &mut self,
        limit: Duration,
        want: impl Fn(&Line) -> bool,
        mut aside: impl FnMut(&mut Fsb, Line),
    ) -> Result<Option<Line>, (Vec<u8>, Option<String>)> {
        if let Some(l) = self.take_pending(&want) {
            return Ok(Some(l));
        }
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.fresh(left) {
                Raw::Line(l) if want(&l) => return Ok(Some(l)),
                Raw::Line(l) => aside(self, l),
                Raw::Timeout => return Ok(None),
                Raw::End { partial, error } => return Err((partial, error)),
            }
        }
    }

    /// Waits for the response to the numeric `id` (within the deadline); notifications and
    /// responses to other requests sent meanwhile are set aside.
    pub fn response(&mut self, id: u64) -> Value {
        let want = json!(id);
        let deadline = self.deadline;
        let is_it = |l: &Line| {
            l.json
                .as_ref()
                .is_some_and(|m| m.get("method").is_none() && m["id"] == want)
        };
        match self.wait_for(deadline, is_it, Fsb::set_aside) {
            Ok(Some(l)) => {
                self.asked.remove(&id);
                let m = l.value();
                assert_eq!(m["jsonrpc"], "2.0", "{m}");
                self.last_raw = l.text();
                m
            }
            Ok(None) => panic!("no response to request {id} within {deadline:?}"),
            Err((partial, error)) => {
                self.ended_panic(&format!("the response to {id}"), &partial, error)
            }
        }
    }

    /// Sends a request and waits for its response.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.response(id)
    }

    /// The `result` of a request that must succeed.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(
            r.get("result").is_some() && r.get("error").is_none(),
            "{method} {params} failed: {r}"
        );
        r["result"].clone()
    }

    /// The `error` of a request that must fail.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(
            r.get("error").is_some() && r.get("result").is_none(),
            "{method} {params} should fail: {r}"
        );
        r["error"].clone()
    }

    /// The response to `id` (any JSON id) within `limit`, or `None`; other messages read
    /// meanwhile are set aside. Panics when the output ends first.
    pub fn answer_within(&mut self, id: &Value, limit: Duration) -> Option<Value> {
        let is_it = |l: &Line| {
            l.json
                .as_ref()
                .is_some_and(|m| m.get("method").is_none() && m.get("id") == Some(id))
        };
        match self.wait_for(limit, is_it, |f, l| f.pending.push_back(l)) {
            Ok(found) => found.map(|l| {
                self.last_raw = l.text();
                l.value()
            }),
            Err(_) => panic!("the broker closed the connection before answering {id}"),
        }
    }

    /// The response to `id` within `limit` (other messages are set aside).
    pub fn answer(&mut self, id: &Value, limit: Duration) -> Value {
        self.answer_within(id, limit)
            .unwrap_or_else(|| panic!("no answer to {id} within {limit:?}"))
    }

    /// The response to `id`, or an error with `id: null` (a line the broker could not take
    /// in is refused without its id having been read), within `limit`; other messages are
    /// set aside.
    pub fn answer_or_null_error(&mut self, id: &Value, limit: Duration) -> Value {
        let is_it = |l: &Line| {
            l.json.as_ref().is_some_and(|m| {
                (m.get("method").is_none() && m.get("id") == Some(id))
                    || (m.get("id") == Some(&Value::Null) && m.get("error").is_some())
            })
        };
        match self.wait_for(limit, is_it, |f, l| f.pending.push_back(l)) {
            Ok(Some(l)) => l.value(),
            Ok(None) => panic!("no answer to {id} within {limit:?}"),
            Err(_) => panic!("the broker closed the connection before answering {id}"),
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

    /// The next notification (set aside, or waiting up to `limit`), with its arrival time;
    /// responses read meanwhile are set aside.
    pub fn next_notification(&mut self, limit: Duration) -> Option<(Instant, Value)> {
        match self.wait_for(limit, Line::is_notification, Fsb::set_aside) {
            Ok(found) => found.map(|l| (l.at, l.value())),
            Err((partial, error)) => self.ended_panic("a notification", &partial, error),
        }
    }

    /// The oldest notification set aside, if any.
    pub fn pop_note(&mut self) -> Option<(Instant, Value)> {
        self.take_pending(Line::is_notification)
            .map(|l| (l.at, l.value()))
    }

    /// Whether the output closes within `limit` (lines before that are dropped): the broker
    /// ended the session, even where its process cannot be reaped yet.
    pub fn output_closed_within(&mut self, limit: Duration) -> bool {
        self.pending.clear();
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.fresh(left) {
                Raw::Line(_) => {}
                Raw::End { .. } => return true,
                Raw::Timeout => return false,
            }
        }
    }

    /// Every message left (set-aside ones first) until the output closes, which must be
    /// within `limit` (the process has exited or is exiting).
    pub fn messages_until_closed(&mut self, limit: Duration) -> Vec<Value> {
        let end = Instant::now() + limit;
        let mut got = Vec::new();
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.next_line(left) {
                Raw::Line(l) => got.push(l.value()),
                Raw::End { partial, error } => {
                    assert!(
                        partial.is_empty(),
                        "frame without newline: {:?}",
                        String::from_utf8_lossy(&partial)
                    );
                    assert!(error.is_none(), "reading from fsbroker failed: {error:?}");
                    return got;
                }
                Raw::Timeout => panic!("the output still open {limit:?} later"),
            }
        }
    }

    /// Closes the input, reads the output to its end and waits for the process to exit
    /// (each within the session's deadline); returns the status and whatever the output
    /// still held, as text: what nobody read, after what was set aside and never asked for
    /// (but for `notifications/roots/list_changed`, which a grant sends between responses and
    /// a request passes over).
    pub fn finish(mut self) -> (ExitStatus, String) {
        self.end()
    }

    /// [`Fsb::finish`], keeping the session (its log, when kept, can be read after).
    pub fn end(&mut self) -> (ExitStatus, String) {
        self.close_stdin();
        let deadline = self.deadline;
        let end = Instant::now() + deadline;
        let mut rest = Vec::new();
        for l in std::mem::take(&mut self.pending) {
            let list_changed = l.json.as_ref().is_some_and(|m| {
                is_notification(m) && m["method"] == "notifications/roots/list_changed"
            });
            if !list_changed {
                rest.extend_from_slice(&l.raw);
            }
        }
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.fresh(left) {
                Raw::Line(l) => rest.extend_from_slice(&l.raw),
                Raw::End { partial, error } => {
                    assert!(error.is_none(), "read the rest: {error:?}");
                    rest.extend_from_slice(&partial);
                    break;
                }
                Raw::Timeout => {
                    panic!("fsbroker's output still open {deadline:?} after its input closed")
                }
            }
        }
        let left = end.saturating_duration_since(Instant::now());
        let status = self.wait_exit(left).unwrap_or_else(|| {
            panic!("fsbroker still running {deadline:?} after its input closed")
        });
        (status, String::from_utf8(rest).expect("UTF-8 output"))
    }

    // -----------------------------------------------------------------------------------------
    // The process's log ([`Log::Keep`])
    // -----------------------------------------------------------------------------------------

    fn stderr(&self) -> &Stderr {
        self.stderr
            .as_ref()
            .expect("stderr is not kept (Log::Keep)")
    }

    /// The next stderr line not yet taken or drained, waiting up to `limit` (`None` on
    /// timeout or once stderr is closed and empty).
    pub fn next_log_line(&mut self, limit: Duration) -> Option<String> {
        self.stderr().lines.recv_timeout(limit).ok()
    }

    /// Discards the stderr lines read so far from [`Fsb::next_log_line`] (they stay in the
    /// log).
    pub fn drain_log(&mut self) {
        while self.stderr().lines.try_recv().is_ok() {}
    }

    /// How many stderr lines have been read so far.
    pub fn log_len(&self) -> usize {
        self.stderr()
            .kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// The stderr lines read since line `from`.
    pub fn log_since(&self, from: usize) -> Vec<String> {
        let log = self.stderr().kept.lock().unwrap_or_else(|e| e.into_inner());
        log.get(from..).unwrap_or_default().to_vec()
    }

    /// Every stderr line so far, joined by newlines.
    pub fn log_text(&self) -> String {
        self.log_since(0).join("\n")
    }

    /// Waits at most `limit` for stderr to close (the process and whatever it started have
    /// exited); whether it did. The log is then complete.
    pub fn log_closed_within(&mut self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let t = self
            .stderr
            .as_mut()
            .expect("stderr is not kept (Log::Keep)");
        loop {
            if t.thread.as_ref().is_none_or(|t| t.is_finished()) {
                if let Some(t) = t.thread.take() {
                    let _ = t.join();
                }
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Fsb {
    fn drop(&mut self) {
        self.gate.update(|s| s.closing = true);
        drop(self.stdin.take());
        if let Some(s) = &self.socket {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(child) = self.child.as_mut() {
            // The group first, while the process is not reaped (its id, and its group's,
            // are surely still its own).
            if self.group && matches!(child.try_wait(), Ok(None)) {
                kill_group(child.id());
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A shared broker
// ---------------------------------------------------------------------------------------------

/// `fsbroker serve --listen SOCK ...` in a process group of its own (stdin and stdout null);
/// dropping it kills the whole group (consent commands included) and reaps the broker. (A
/// broker already reaped, by [`Listener::exited`] say, is not killed as a group: its id
/// may name another group by then.)
/// Sessions with it are [`Fsb::connect`]ions.
pub struct Listener {
    child: Child,
    /// The socket's path.
    pub sock: PathBuf,
}

impl Listener {
    /// `serve --listen SOCK --policy POLICY EXTRA...`, once its socket is there; panics (with
    /// the exit status and the policy) when the broker exits instead, for instance because it
    /// refused the policy. The broker's pid goes into `pids`, so a test past its deadline can
    /// kill it.
    pub fn start(policy: &Path, sock: &Path, extra: &[&str], pids: &Pids) -> Listener {
        Listener::start_limited(policy, sock, extra, None, pids)
    }

    /// [`Listener::start`] under `ulimit -n FD_LIMIT` when given.
    pub fn start_limited(
        policy: &Path,
        sock: &Path,
        extra: &[&str],
        fd_limit: Option<u32>,
        pids: &Pids,
    ) -> Listener {
        let mut args: Vec<OsString> = vec!["--policy".into(), policy.into()];
        args.extend(extra.iter().map(OsString::from));
        let mut cmd = Cmd::new(&args).pids(pids);
        if let Some(n) = fd_limit {
            cmd = cmd.fd_limit(n);
        }
        let mut l = Listener::spawn(sock, cmd);
        if let Err(status) = l.wait_listening(Duration::from_secs(15)) {
            panic!(
                "serve --listen exited before listening ({status}); policy:\n{}",
                std::fs::read_to_string(policy).unwrap_or_default()
            );
        }
        l
    }

    /// `serve --listen SOCK` followed by `cmd`'s arguments (with its environment, log and
    /// pids), in a group of its own; does not wait for the socket.
    pub fn spawn(sock: &Path, cmd: Cmd) -> Listener {
        let mut cmd = cmd.group();
        let mut args: Vec<OsString> = vec!["serve".into(), "--listen".into(), sock.into()];
        args.append(&mut cmd.args);
        cmd.args = args;
        let child = cmd
            .command(Stdio::null(), Stdio::null())
            .spawn()
            .expect("start fsbroker serve --listen");
        if let Some(pids) = &cmd.pids {
            pids.add(child.id());
        }
        Listener {
            child,
            sock: sock.to_owned(),
        }
    }

    /// Waits at most `limit` for the socket; `Err` with the exit status when the broker exits
    /// first. Not probed by connecting: a probe would be a session of its own, counted
    /// against max_sessions until the broker sees it close. The socket's path appears only
    /// once the broker listens (it binds under a temporary name and renames; startup.rs holds
    /// that rule), so its existence says enough.
    pub fn wait_listening(&mut self, limit: Duration) -> Result<(), ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Err(status);
            }
            if std::fs::symlink_metadata(&self.sock).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                return Ok(());
            }
            assert!(Instant::now() < end, "no socket at {}", self.sock.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A new session (read on demand).
    pub fn connect(&self) -> Fsb {
        Fsb::connect(&self.sock)
    }

    /// Sends SIGTERM and waits (at most `limit`) for the broker to exit.
    pub fn terminate(&mut self, limit: Duration) -> ExitStatus {
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
    pub fn exited(&mut self) -> Option<ExitStatus> {
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
        // The group first, while the broker is not reaped (its id, and its group's, are then
        // surely still its own).
        if let Ok(None) = self.child.try_wait() {
            kill_group(self.child.id());
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

//! A server's process: started through `sh -c 'exec COMMAND'`, written to and read from one
//! line at a time (its own requests answered on the way), killed by a watchdog when it says
//! nothing for [`SILENCE`] while an answer is due, and ended (its whole process tree) when
//! dropped.

use std::borrow::Cow;
use std::io::{self, BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::SILENCE;
use crate::bench::client::Lines;
use crate::bench::wire;

/// How long a server may take to exit once its input is closed before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// A running server.
pub(super) struct Server {
    child: Child,
    pub(super) pid: u32,
    /// Its stdin (taken to close it).
    out: Option<BufWriter<ChildStdin>>,
    pub(super) lines: Lines<ChildStdout>,
    /// When the last line was read.
    pub(super) line_read_at: Instant,
    /// Whether its output ended.
    closed: bool,
    next_id: u64,
    /// The answer to `roots/list`.
    root: String,
    log: PathBuf,
    watchdog: Watchdog,
}

impl Server {
    pub(super) fn start(launched: &str, log: &Path, root: &str) -> Result<Server, String> {
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("cannot create {log:?}: {e}"))?;
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("exec {launched}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot run /bin/sh: {e}"))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the server's pipes are missing".into());
        };
        Ok(Server {
            child,
            pid,
            out: Some(BufWriter::with_capacity(64 << 10, stdin)),
            lines: Lines::new(stdout),
            line_read_at: Instant::now(),
            closed: false,
            next_id: 0,
            root: root.to_owned(),
            log: log.to_path_buf(),
            watchdog: Watchdog::start(pid),
        })
    }

    fn out(&mut self) -> Result<&mut BufWriter<ChildStdin>, String> {
        self.out
            .as_mut()
            .ok_or_else(|| "the server's input is closed".into())
    }

    /// Writes one message (sent at the next wait for an answer).
    pub(super) fn send(&mut self, message: &str) -> Result<(), String> {
        writeln!(self.out()?, "{message}").map_err(|e| format!("writing to the server: {e}"))
    }

    /// Writes a request; returns its id.
    pub(super) fn request(&mut self, method: &str, params: &str) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(
            self.out()?,
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\",\"params\":{params}}}"
        )
        .map_err(|e| format!("writing to the server: {e}"))?;
        Ok(id)
    }

    /// Writes a `tools/call` of `tool` with `{"path": path}` (`path` a JSON string).
    pub(super) fn call(&mut self, tool: &str, path: &str) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(
            self.out()?,
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"{tool}\",\"arguments\":{{\"path\":{path}}}}}}}"
        )
        .map_err(|e| format!("writing to the server: {e}"))?;
        Ok(id)
    }

    /// The answer to request `id` (sends what is buffered first); the server's notifications
    /// are skipped and its requests answered on the way.
    pub(super) fn answer(&mut self, id: u64) -> Result<(Range<usize>, wire::Answer), String> {
        loop {
            let Server {
                out,
                lines,
                watchdog,
                ..
            } = self;
            let next = lines.next(&mut || {
                if let Some(out) = out.as_mut() {
                    out.flush()?;
                }
                watchdog.arm();
                Ok(())
            });
            watchdog.disarm();
            self.line_read_at = Instant::now();
            let span = next.map_err(|e| {
                self.closed = true;
                match e.kind() {
                    io::ErrorKind::UnexpectedEof => "the server closed its output".to_owned(),
                    _ => format!("reading the server's output: {e}"),
                }
            })?;
            let line = self.lines.line(span.clone());
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let answer = wire::answer(line)?;
            if answer.is_notification() {
                self.server_message(span)?;
                continue;
            }
            if answer.id != Some(id) {
                return Err(format!(
                    "an answer to no request (request {id} is due): {}",
                    wire::preview(line)
                ));
            }
            return Ok((span, answer));
        }
    }

    /// A request or notification from the server: requests are answered.
    fn server_message(&mut self, span: Range<usize>) -> Result<(), String> {
        #[derive(Deserialize)]
        struct Message<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            #[serde(borrow)]
            method: Option<Cow<'a, str>>,
        }
        let Server {
            out, lines, root, ..
        } = self;
        let line = lines.line(span);
        let message: Message = serde_json::from_slice(line).map_err(|e| {
            format!(
                "a bad message from the server ({e}): {}",
                wire::preview(line)
            )
        })?;
        let (Some(id), Some(method)) = (message.id, message.method) else {
            return Ok(());
        };
        let reply = match method.as_ref() {
            "roots/list" => format!("\"result\":{root}"),
            "ping" => "\"result\":{}".to_owned(),
            other => format!(
                "\"error\":{{\"code\":-32601,\"message\":{}}}",
                serde_json::to_string(&format!("fsbroker bench does not answer {other}"))
                    .unwrap_or_else(|_| "\"method not found\"".into())
            ),
        };
        let out = out.as_mut().ok_or("the server's input is closed")?;
        writeln!(out, "{{\"jsonrpc\":\"2.0\",\"id\":{},{reply}}}", id.get())
            .map_err(|e| format!("writing to the server: {e}"))
    }

    /// An error message with how the server ended (if it did) and the end of its log.
    pub(super) fn failed(&mut self, error: &str) -> String {
        let mut message = error.to_owned();
        if self.watchdog.fired() {
            message = format!(
                "the server said nothing for {} s while an answer was due; it was killed",
                SILENCE.as_secs()
            );
        } else if self.closed {
            // A server that closed its output is usually exiting.
            let deadline = Instant::now() + Duration::from_millis(500);
            while Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(status)) => {
                        message.push_str(&format!(" (it exited: {status})"));
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                    Err(_) => break,
                }
            }
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        if !tail.is_empty() {
            let lines: Vec<&str> = tail.into_iter().rev().collect();
            message.push_str(&format!(
                "\nthe server's stderr ends with:\n  {}",
                lines.join("\n  ")
            ));
        }
        message
    }
}

impl Drop for Server {
    /// Closes the server's input and waits for it to exit; kills what is left after
    /// [`EXIT_WAIT`].
    fn drop(&mut self) {
        drop(self.out.take());
        let deadline = Instant::now() + EXIT_WAIT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => {
                    kill_tree(self.pid);
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }
}

/// Kills a server that says nothing for [`SILENCE`] while an answer is due, so a stuck
/// server cannot stall the bench. Costs the measured path one clock read and two stores per
/// blocking read.
struct Watchdog {
    state: Arc<WatchState>,
    thread: Option<JoinHandle<()>>,
}

struct WatchState {
    origin: Instant,
    /// Milliseconds since `origin` (plus one) when a wait began; 0 when not waiting.
    armed: AtomicU64,
    stop: AtomicBool,
    fired: AtomicBool,
}

impl Watchdog {
    fn start(pid: u32) -> Watchdog {
        let state = Arc::new(WatchState {
            origin: Instant::now(),
            armed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            fired: AtomicBool::new(false),
        });
        let watched = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("fsbroker-bench-watchdog".into())
            .spawn(move || {
                let limit = SILENCE.as_millis() as u64;
                while !watched.stop.load(Ordering::Relaxed) {
                    std::thread::park_timeout(Duration::from_millis(250));
                    let armed = watched.armed.load(Ordering::Relaxed);
                    let now = watched.origin.elapsed().as_millis() as u64;
                    if armed != 0 && now > armed + limit {
                        watched.fired.store(true, Ordering::Relaxed);
                        kill_tree(pid);
                        return;
                    }
                }
            })
            .ok();
        Watchdog { state, thread }
    }

    fn arm(&self) {
        let now = self.state.origin.elapsed().as_millis() as u64;
        self.state.armed.store(now + 1, Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.state.armed.store(0, Ordering::Relaxed);
    }

    fn fired(&self) -> bool {
        self.state.fired.load(Ordering::Relaxed)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// `pid` and its descendants (from `/proc/*/stat`).
pub(super) fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let ppid = stat
                .rfind(')')
                .and_then(|end| stat[end + 1..].split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parents.push((child, ppid));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|&&(c, p)| p == parent && !tree.contains(&c))
                .map(|&(c, _)| c)
                .collect::<Vec<_>>(),
        );
        i += 1;
    }
    tree
}

/// A process's peak resident memory (`VmHWM`), in bytes.
pub(super) fn vm_hwm(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// SIGKILL to `pid` and its descendants.
fn kill_tree(pid: u32) {
    for p in process_tree(pid).into_iter().rev() {
        if let Some(p) = i32::try_from(p)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
    }
}

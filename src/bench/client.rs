//! The broker under test: a child process with its stdin and stdout on real pipes, requests
//! written through a buffer, answers read as lines from a buffer of our own (one copy out of
//! the pipe; lines are found with `memchr`).

use std::io::{self, BufWriter, Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::wire::{self, Answer};

/// How the broker is started.
pub(crate) enum Launch {
    /// This executable: `fsbroker serve --policy FILE`, then `extra`.
    Own {
        exe: PathBuf,
        policy: PathBuf,
        extra: Vec<String>,
    },
    /// A shell command (`--broker-cmd`), run with `sh -c 'exec COMMAND'`.
    Shell { command: String },
}

impl Launch {
    pub(crate) fn own(policy: &Path) -> Result<Launch, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this executable to start the broker: {e}"))?;
        Ok(Launch::Own {
            exe,
            policy: policy.to_path_buf(),
            extra: Vec::new(),
        })
    }

    /// `{policy}`, `{data}` and `{scratch}` in `command` become those paths (shell-quoted);
    /// a command naming none of them gets ` serve --policy FILE` appended, so an fsbroker
    /// binary can be given alone.
    pub(crate) fn shell(command: &str, policy: &Path, data: &Path, scratch: &Path) -> Launch {
        let quote = |p: &Path| shell_quote(&p.display().to_string());
        let names = ["{policy}", "{data}", "{scratch}"];
        let command = if names.iter().any(|n| command.contains(n)) {
            command
                .replace("{policy}", &quote(policy))
                .replace("{data}", &quote(data))
                .replace("{scratch}", &quote(scratch))
        } else {
            format!("{command} serve --policy {}", quote(policy))
        };
        Launch::Shell { command }
    }

    /// The same broker with `args` after its own options (the console phase's `--console`,
    /// `--listen`): appended to this executable's arguments, or to a shell command
    /// shell-quoted, so a `--broker-cmd` with placeholders must end where `serve`'s options
    /// may follow.
    pub(crate) fn with_args(&self, args: &[&str]) -> Launch {
        match self {
            Launch::Own { exe, policy, extra } => Launch::Own {
                exe: exe.clone(),
                policy: policy.clone(),
                extra: extra
                    .iter()
                    .cloned()
                    .chain(args.iter().map(|a| (*a).to_owned()))
                    .collect(),
            },
            Launch::Shell { command } => {
                let mut command = command.clone();
                for a in args {
                    command.push(' ');
                    command.push_str(&shell_quote(a));
                }
                Launch::Shell { command }
            }
        }
    }

    /// For the report.
    pub(crate) fn describe(&self) -> String {
        match self {
            Launch::Own { exe, extra, .. } => {
                let mut text = format!("{} serve --policy FILE", exe.display());
                for a in extra {
                    text.push(' ');
                    text.push_str(a);
                }
                text
            }
            Launch::Shell { command } => command.clone(),
        }
    }

    fn command(&self) -> Command {
        match self {
            Launch::Own { exe, policy, extra } => {
                let mut c = Command::new(exe);
                c.arg("serve").arg("--policy").arg(policy).args(extra);
                c
            }
            Launch::Shell { command } => {
                let mut c = Command::new("/bin/sh");
                c.arg("-c").arg(format!("exec {command}"));
                c
            }
        }
    }
}

/// `text` as one word of `sh`: in single quotes, each `'` written `'\''`.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A running broker.
pub(crate) struct Broker {
    child: Reaper,
    pid: u32,
    /// Its stdin.
    pub requests: Requests,
    /// Its stdout.
    pub answers: Lines<ChildStdout>,
    log: PathBuf,
}

/// Kills the child if the bench ends without [`Broker::finish`] (an error).
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Broker {
    /// Starts the broker (its stderr goes to `log`) and waits for it to answer a ping.
    pub(crate) fn start(launch: &Launch, log: &Path) -> Result<Broker, String> {
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("cannot create {log:?}: {e}"))?;
        let mut child = launch
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start the broker ({}): {e}", launch.describe()))?;
        let pid = child.id();
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("the broker's pipes are missing".into());
        };
        let mut broker = Broker {
            child: Reaper(child),
            pid,
            requests: Requests {
                out: BufWriter::with_capacity(256 << 10, stdin),
                next_id: 0,
            },
            answers: Lines::new(stdout),
            log: log.to_path_buf(),
        };
        let id = broker.requests.id();
        let started = (|| {
            writeln!(
                broker.requests,
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"ping\"}}"
            )?;
            broker.requests.flush()
        })();
        let answered = started
            .map_err(|e| e.to_string())
            .and_then(|()| broker.answer())
            .and_then(|(line, a)| match (a.id, &a.result) {
                (Some(got), Some(_)) if got == id => Ok(()),
                _ => Err(format!(
                    "the broker did not answer a ping: {}",
                    wire::preview(broker.answers.line(line))
                )),
            });
        answered.map_err(|e| broker.failed(&e))?;
        Ok(broker)
    }

    /// The next answer (notifications are skipped): the line's span and its parts.
    pub(crate) fn answer(&mut self) -> Result<(Range<usize>, Answer), String> {
        loop {
            let requests = &mut self.requests;
            let line = self
                .answers
                .next(&mut || requests.flush())
                .map_err(|e| format!("reading the broker's answers: {e}"))?;
            let answer = wire::answer(self.answers.line(line.clone()))?;
            if !answer.is_notification() {
                return Ok((line, answer));
            }
        }
    }

    /// An error message with the end of the broker's log, when it wrote one.
    pub(crate) fn failed(&self, error: &str) -> String {
        with_log(&self.log, error)
    }

    /// The broker's peak resident memory so far (`VmHWM`), in bytes.
    pub(crate) fn peak_memory(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// The CPU time the broker has used so far, in all its threads (user and system).
    pub(crate) fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // The command name (field 2) may hold spaces; the fields after it do not.
        let rest = &stat[stat.rfind(')')? + 2..];
        let mut fields = rest.split_whitespace().skip(11);
        let user: u64 = fields.next()?.parse().ok()?;
        let system: u64 = fields.next()?.parse().ok()?;
        let hz = rustix::param::clock_ticks_per_second().max(1);
        Some(Duration::from_secs_f64((user + system) as f64 / hz as f64))
    }

    /// Closes the broker's stdin and waits for it to exit (up to 30 s, then kills it); says
    /// how it ended.
    pub(crate) fn finish(self) -> String {
        let Broker {
            mut child,
            requests,
            answers,
            ..
        } = self;
        drop(requests);
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            match child.0.try_wait() {
                Ok(Some(status)) => break status.to_string(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    let _ = child.0.kill();
                    break "did not exit within 30 s of the end of its input; killed".into();
                }
                Err(e) => break format!("cannot wait for it: {e}"),
            }
        };
        drop(answers);
        status
    }
}

/// `error` with the end of the broker's log at `log`, when it wrote one.
fn with_log(log: &Path, error: &str) -> String {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(10).collect();
    if tail.is_empty() {
        error.to_owned()
    } else {
        let lines: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "{error}\nthe broker's log ends with:\n  {}",
            lines.join("\n  ")
        )
    }
}

/// A broker serving a Unix socket (`serve --listen`): no pipes of ours, its stderr to a log.
/// Its sessions are the caller's own connections to the socket.
pub(crate) struct Listening {
    child: Reaper,
    pid: u32,
    log: PathBuf,
}

impl Listening {
    /// Starts the broker (its stderr goes to `log`); whether it came up is for the caller to
    /// see (its socket, its files).
    pub(crate) fn start(launch: &Launch, log: &Path) -> Result<Listening, String> {
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("cannot create {log:?}: {e}"))?;
        let child = launch
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start the broker ({}): {e}", launch.describe()))?;
        Ok(Listening {
            pid: child.id(),
            child: Reaper(child),
            log: log.to_path_buf(),
        })
    }

    /// How it ended, if it has.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.0.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("cannot wait for it: {e}")),
        }
    }

    /// An error message with the end of the broker's log, when it wrote one.
    pub(crate) fn failed(&self, error: &str) -> String {
        with_log(&self.log, error)
    }

    /// Stops the broker as a service manager would (SIGTERM; SIGKILL after 10 s); says how
    /// it ended.
    pub(crate) fn finish(mut self) -> String {
        let pid = i32::try_from(self.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.0.kill();
                let _ = self.child.0.wait();
                return "did not exit within 10 s of SIGTERM; killed".into();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Requests to the broker's stdin, through a buffer: call [`Requests::flush`] (or let
/// [`Broker::answer`] do it before it waits) to send them.
pub(crate) struct Requests {
    out: BufWriter<ChildStdin>,
    next_id: u64,
}

impl Requests {
    /// A fresh request id.
    pub(crate) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }
}

impl Write for Requests {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.out.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Reads free space below this makes the buffer compact or grow.
const MIN_READ: usize = 256 << 10;

/// Splits a byte stream into lines, reading straight into one growing buffer.
pub(crate) struct Lines<R> {
    src: R,
    buf: Vec<u8>,
    /// Start of the first unreturned line.
    start: usize,
    /// End of the bytes read.
    end: usize,
    /// `buf[start..scanned]` holds no newline.
    scanned: usize,
}

impl<R: Read> Lines<R> {
    pub(crate) fn new(src: R) -> Self {
        Lines {
            src,
            buf: vec![0; 4 * MIN_READ],
            start: 0,
            end: 0,
            scanned: 0,
        }
    }

    /// The span of the next line (without its `\n`), valid until the next call;
    /// `before_wait` runs before every read that may block.
    pub(crate) fn next(
        &mut self,
        before_wait: &mut dyn FnMut() -> io::Result<()>,
    ) -> io::Result<Range<usize>> {
        loop {
            if let Some(line) = self.take_line() {
                return Ok(line);
            }
            before_wait()?;
            self.fill()?;
        }
    }

    /// The next whole line already read, if any (else everything read is marked scanned).
    fn take_line(&mut self) -> Option<Range<usize>> {
        let Some(k) = memchr::memchr(b'\n', &self.buf[self.scanned..self.end]) else {
            self.scanned = self.end;
            return None;
        };
        let newline = self.scanned + k;
        let line = self.start..newline;
        self.start = newline + 1;
        self.scanned = self.start;
        Some(line)
    }

    /// [`Lines::next`], giving up at `deadline`: `None` when no whole line arrived by then.
    pub(crate) fn next_until(
        &mut self,
        deadline: Instant,
        before_wait: &mut dyn FnMut() -> io::Result<()>,
    ) -> io::Result<Option<Range<usize>>>
    where
        R: std::os::fd::AsFd,
    {
        loop {
            if let Some(line) = self.take_line() {
                return Ok(Some(line));
            }
            before_wait()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let mut fds = [rustix::event::PollFd::new(
                &self.src,
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec {
                tv_sec: left.as_secs().try_into().unwrap_or(i64::MAX),
                tv_nsec: left.subsec_nanos().into(),
            };
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(0) => return Ok(None),
                Ok(_) => self.fill()?,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Makes room for `len` more bytes, so a line that long is read without the buffer
    /// growing (and being copied) on the way.
    pub(crate) fn reserve(&mut self, len: usize) {
        let want = self.end.saturating_add(len).saturating_add(MIN_READ);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
    }

    /// A line returned by [`Lines::next`].
    pub(crate) fn line(&self, span: Range<usize>) -> &[u8] {
        &self.buf[span]
    }

    fn fill(&mut self) -> io::Result<()> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.scanned = 0;
        }
        if self.buf.len() - self.end < MIN_READ {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.scanned -= self.start;
                self.start = 0;
            }
            if self.buf.len() - self.end < MIN_READ {
                let len = self.buf.len() * 2;
                self.buf.resize(len, 0);
            }
        }
        loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the broker closed its output",
                    ));
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    #[test]
    fn lines_across_reads_and_growth() {
        let long = "x".repeat(3 << 20);
        let text = format!("a\n{long}\n\nb\n");
        // A reader that hands out 1000 bytes at a time.
        struct Trickle<'a>(&'a [u8]);
        impl std::io::Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let n = buf.len().min(1000).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut lines = Lines::new(Trickle(text.as_bytes()));
        let mut waits = 0;
        let mut next = |l: &mut Lines<Trickle>| {
            let r = l.next(&mut || {
                waits += 1;
                Ok(())
            });
            r.map(|r| l.line(r).to_vec())
        };
        assert_eq!(next(&mut lines).unwrap(), b"a");
        assert_eq!(next(&mut lines).unwrap(), long.as_bytes());
        assert_eq!(next(&mut lines).unwrap(), b"");
        assert_eq!(next(&mut lines).unwrap(), b"b");
        assert!(next(&mut lines).is_err());
        assert!(waits > 3000);
    }
}

//! The confinement probe: a Python "server" that opens files itself and tries, on the real
//! kernel, whatever `$PROBE` lists, then reports what the kernel let it do; and a fixture of
//! roots around it. Used by `tests/confine.rs` and `tests/confine_escapes.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::fsb::{Cmd, Raw};
use super::{Fsb, PolicyToml, RootToml, bin, tempdir};

/// Runs each operation of `$PROBE` (a JSON list) and writes the results as one notification;
/// with `$PROBE_STAY` it then reads stdin until it closes; with `$PROBE_LINGER` it then stays
/// a minute.
pub const PROBE: &str = r#"
import json, os, socket, sys
def run(op):
    kind, arg = op[0], op[1] if len(op) > 1 else None
    try:
        if kind == "read":
            return "ok:" + open(arg).read()
        if kind == "write":
            with open(arg, "w") as f:
                f.write("written by the server")
            return "ok"
        if kind == "list":
            return "ok:" + ",".join(sorted(os.listdir(arg)))
        if kind == "mkdir":
            os.mkdir(arg)
            return "ok"
        if kind == "rename":
            os.rename(arg[0], arg[1])
            return "ok"
        if kind == "connect":
            socket.create_connection(("127.0.0.1", arg), timeout=5).close()
            return "ok"
        if kind == "mptcp":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
            s.settimeout(5)
            s.connect(("127.0.0.1", arg))
            s.close()
            return "ok"
        if kind == "udp":
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
            return "ok"
        if kind == "unix":
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close()
            return "ok"
        if kind == "syscall":
            # A raw system call `arg[0]` with integer arguments `arg[1:]`; its errno if it fails.
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syscall(*[ctypes.c_long(a) for a in arg]) == -1:
                raise OSError(ctypes.get_errno(), "syscall")
            return "ok"
        if kind == "family":
            # A socket of family `arg` (AF_VSOCK 40, AF_PACKET 17, ...), of any type it has.
            last = None
            for t in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
                try:
                    socket.socket(arg, t).close()
                    return "ok"
                except OSError as e:
                    last = e
            raise last
        if kind == "pair":
            a, b = socket.socketpair()
            a.close(); b.close()
            return "ok"
        if kind == "dgram":
            # A datagram pair, then a datagram to the path `arg` (a listener outside).
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b"from the server", arg)
            return "ok"
        if kind == "netlink":
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, arg).close()
            return "ok"
        if kind == "create_setid":
            os.close(os.open(arg, os.O_WRONLY | os.O_CREAT, 0o4755))
            return "ok"
        if kind == "fchmod":
            fd = os.open(arg[0], os.O_RDONLY)
            try:
                os.fchmod(fd, arg[1])
            finally:
                os.close(fd)
            return "ok"
        if kind == "mknod_setid":
            import stat
            os.mknod(arg, stat.S_IFREG | 0o4755)
            return "ok"
        if kind == "prlimit_parent":
            import resource
            resource.prlimit(os.getppid(), resource.RLIMIT_NOFILE, (0, 0))
            return "ok"
        if kind == "flood":
            # `arg` bytes to stderr, escape sequences among them.
            sys.stderr.write(("\x1b]52;c;cHduZWQ=\x07" + "x" * 1000 + "\n") * (arg // 1024))
            sys.stderr.flush()
            return "ok"
        if kind == "fd":
            # Read from descriptor `arg`, if the server was handed one.
            return "ok:" + os.pread(arg, 100, 0).decode()
        if kind == "stderr":
            import stat
            mode = os.fstat(2).st_mode
            return "ok:" + ("pipe" if stat.S_ISFIFO(mode) else "tty" if os.isatty(2) else "other")
        if kind == "setuid":
            os.setuid(os.getuid())
            return "ok"
        if kind == "chmod":
            os.chmod(arg, 0o777)
            return "ok"
        if kind == "chown":
            os.chown(arg, os.getuid(), os.getgid())
            return "ok"
        if kind == "xattr":
            os.setxattr(arg, "user.fsbroker", b"x")
            return "ok"
        if kind == "tiocsti":
            import fcntl, termios
            fcntl.ioctl(2, termios.TIOCSTI, b"x")
            return "ok"
        if kind == "daemon":
            # Leave a daemon behind: fork, setsid, fork again; it appends to `arg` for 30 s.
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    import time
                    for _ in range(300):
                        try:
                            with open(arg, "a") as f:
                                f.write(".")
                        except OSError:
                            pass
                        time.sleep(0.1)
                os._exit(0)
            os.wait()
            return "ok"
        if kind == "chain":
            # A chain of processes `depth` deep, each the child of the one before; the last
            # appends to `marker` every 0.1 s. Returns once the last one runs.
            import subprocess, time
            depth, marker = arg
            s = 'if [ "$N" -gt 0 ]; then N=$((N-1)) sh -c "$S" & exec sleep 1000; fi; ' \
                'while :; do echo . >> "$M"; sleep 0.1; done'
            subprocess.Popen(["sh", "-c", s], env=dict(os.environ, N=str(depth), S=s, M=marker))
            for _ in range(1200):
                if os.path.exists(marker):
                    return "ok"
                time.sleep(0.05)
            return "err:timeout"
        if kind == "ignore_term":
            import signal
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            return "ok"
        if kind == "pid":
            return "ok:" + str(os.getpid())
        if kind == "setsid":
            # Try to leave the process group the proxy ends at once.
            os.setsid()
            kept = os.getpgrp() == os.getpid() and os.getsid(0) != os.getpid()
            return "ok:" + ("kept" if kept else "left")
        if kind == "nodeath":
            # Try to clear the death signal the proxy set.
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, 0, 0, 0, 0)
            sig = ctypes.c_int(-1)
            libc.prctl(2, ctypes.byref(sig), 0, 0, 0)
            return "ok:" + str(sig.value)
        if kind == "utime":
            # The times of `arg`, by path (utimensat with a path).
            os.utime(arg, (1000000000, 1000000000))
            return "ok"
        if kind == "futime":
            # The times of `arg`, through a descriptor opened for reading (futimens).
            fd = os.open(arg, os.O_RDONLY)
            try:
                os.utime(fd, (1000000000, 1000000000))
            finally:
                os.close(fd)
            return "ok"
        if kind == "tmpmode":
            return "ok:" + oct(os.stat(os.environ["TMPDIR"]).st_mode & 0o777)
        if kind == "tmpdir":
            d = os.environ.get("TMPDIR", "/tmp")
            with open(os.path.join(d, "t"), "w") as f:
                f.write("t")
            return "ok:" + d
    except OSError as e:
        import errno
        return "err:" + errno.errorcode.get(e.errno, str(e.errno))
results = [run(op) for op in json.loads(os.environ["PROBE"])]
sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "probe", "params": {"results": results}}) + "\n")
sys.stdout.flush()
if os.environ.get("PROBE_STAY"):
    for _ in sys.stdin:
        pass
if os.environ.get("PROBE_LINGER"):
    import time
    time.sleep(60)
"#;

pub struct Fixture {
    _t: tempfile::TempDir,
    /// The temp dir holding the roots, `outside`, and `srv/probe.py`.
    pub dir: PathBuf,
}

impl Fixture {
    /// A read-write root `rw`, a read-only root `ro`, a `deny` root, a `prompt` root, and
    /// `outside` (no root), each holding `f.txt`; the probe script.
    pub fn new() -> Fixture {
        let (t, dir) = tempdir();
        for d in ["rw", "ro", "denied", "asked", "outside"] {
            std::fs::create_dir(dir.join(d)).unwrap();
            std::fs::write(dir.join(d).join("f.txt"), format!("in {d}")).unwrap();
        }
        std::fs::create_dir(dir.join("srv")).unwrap();
        std::fs::write(dir.join("srv/probe.py"), PROBE).unwrap();
        Fixture { _t: t, dir }
    }

    pub fn p(&self, rel: &str) -> String {
        self.dir.join(rel).to_str().unwrap().to_owned()
    }

    /// The four roots: `rw` read-write, `ro` read-only, `denied` (consent deny) and `asked`
    /// (consent prompt).
    pub fn roots(&self) -> PolicyToml {
        PolicyToml::new()
            .root(RootToml::at(&self.dir.join("rw")).rw())
            .root(RootToml::at(&self.dir.join("ro")))
            .root(RootToml::at(&self.dir.join("denied")).consent("deny"))
            .root(RootToml::at(&self.dir.join("asked")).consent("prompt"))
    }

    /// A policy with the four roots and `extra` (more tables) appended.
    pub fn policy(&self, extra: &str) -> PathBuf {
        let path = self.dir.join("policy.toml");
        std::fs::write(&path, format!("{}\n{extra}\n", self.roots().text())).unwrap();
        path
    }

    /// `fsbroker proxy --policy POLICY --confine -- python3 probe.py` with `$PROBE = ops` and
    /// `env`, left running: the proxy (its stdin, the host's end, held open until closed or
    /// dropped) and the first line it relayed.
    pub fn start(&self, policy: &Path, ops: &Value, env: &[(&str, &str)]) -> (Fsb, String) {
        self.start_with("--confine", policy, ops, env)
    }

    /// [`Fixture::start`] with `flag` (`--confine` or `--confine=strict`).
    pub fn start_with(
        &self,
        flag: &str,
        policy: &Path,
        ops: &Value,
        env: &[(&str, &str)],
    ) -> (Fsb, String) {
        let probe = self.dir.join("srv/probe.py");
        let mut cmd = Cmd::new(&[
            "proxy".as_ref(),
            "--policy".as_ref(),
            policy.as_os_str(),
            flag.as_ref(),
            "--".as_ref(),
            "python3".as_ref(),
            probe.as_os_str(),
        ])
        .env("PROBE", ops.to_string());
        for (k, v) in env {
            cmd = cmd.env(k, v);
        }
        let mut proxy = cmd.deadline(Duration::from_secs(60)).spawn();
        let line = match proxy.next_line(Duration::from_secs(60)) {
            Raw::Line(l) => l.text(),
            other => panic!("the confined probe said nothing: {other:?}"),
        };
        (proxy, line)
    }

    /// `fsbroker proxy ARGS -- python3 probe.py` with `$PROBE = ops`, its stdin closed.
    pub fn run(&self, args: &[&str], ops: &Value, env: &[(&str, &str)]) -> Output {
        self.run_script(args, &self.dir.join("srv/probe.py"), ops, env)
    }

    /// [`Fixture::run`] with the probe at `script`.
    pub fn run_script(
        &self,
        args: &[&str],
        script: &Path,
        ops: &Value,
        env: &[(&str, &str)],
    ) -> Output {
        self.run_argv(args, &["python3".as_ref(), script.as_os_str()], ops, env)
    }

    /// `fsbroker proxy ARGS -- ARGV...` with `$PROBE = ops` and `env`, its stdin closed.
    pub fn run_argv(
        &self,
        args: &[&str],
        argv: &[&std::ffi::OsStr],
        ops: &Value,
        env: &[(&str, &str)],
    ) -> Output {
        let mut cmd = Command::new(bin());
        cmd.arg("proxy")
            .args(args)
            .arg("--")
            .args(argv)
            .env("PROBE", ops.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        super::with_deadline(
            Duration::from_secs(60),
            || {},
            move || cmd.output().unwrap(),
        )
    }
}

/// Waits (at most 20 s) for a proxy told to end its server (a revocation) to exit.
pub fn wait_ended(proxy: &mut Fsb) -> std::process::ExitStatus {
    proxy
        .wait_exit(Duration::from_secs(20))
        .expect("the proxy did not exit within 20 s")
}

/// Whether the file at `trace` grows within 0.6 s (something still writes to it).
pub fn growing(trace: &Path) -> bool {
    let before = std::fs::metadata(trace).map(|m| m.len()).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(600));
    std::fs::metadata(trace).map(|m| m.len()).unwrap_or(0) > before
}

/// The probe's results from the proxy's stdout.
pub fn results(out: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.contains("\"probe\""))
        .unwrap_or_else(|| {
            panic!(
                "no probe line; stdout {stdout:?}, stderr {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let v: Value = serde_json::from_str(line).unwrap();
    v["params"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect()
}

/// `fsbroker confine check ARGS -- python3 SCRIPT EXTRA...` run in `cwd` with `env`; its text.
pub fn check(
    fx: &Fixture,
    args: &[&str],
    script: &Path,
    extra: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
) -> String {
    let out = Command::new(bin())
        .args(["confine", "check"])
        .args(args)
        .arg("--")
        .arg("python3")
        .arg(script)
        .args(extra)
        .current_dir(cwd)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let _ = fx;
    String::from_utf8_lossy(&out.stdout).into_owned()
}

//! Processes a test starts, ended if the test runs past its deadline, and whether a broker's
//! Unix socket is listening yet: what the abuse tests' `serve --listen` and proxy drivers share.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::process::{Pid, Signal};

/// Processes a test started, killed (SIGKILL) if the test runs past its deadline: a process
/// that leads a group of its own (a broker and the consent commands it runs) with its group.
#[derive(Clone, Default)]
pub struct Pids(Arc<Mutex<Vec<u32>>>);

impl Pids {
    /// Adds a process to end at the deadline.
    pub fn add(&self, pid: u32) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
    }

    /// Kills every process added (its group when it leads one).
    pub fn kill_all(&self) {
        for &pid in self.0.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let Some(pid) = Pid::from_raw(pid as i32) else {
                continue;
            };
            // A group's id is its leader's pid, so only the process's own group can answer.
            if rustix::process::kill_process_group(pid, Signal::KILL).is_err() {
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
        }
    }
}

/// SIGKILLs the process group led by `pid` (a broker started in a group of its own: the broker
/// and the consent commands it runs).
pub fn kill_group(pid: u32) {
    if let Some(pid) = Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    }
}

/// Runs a test body under `deadline`; past it, the processes in `pids` are killed and the test
/// fails.
pub fn within<T: Send + 'static>(
    deadline: Duration,
    pids: &Pids,
    f: impl FnOnce(Pids) -> T + Send + 'static,
) -> T {
    let killer = pids.clone();
    let inner = pids.clone();
    super::with_deadline(deadline, move || killer.kill_all(), move || f(inner))
}

/// Whether a Unix socket bound at `path` is listening (`__SO_ACCEPTCON` in `/proc/net/unix`).
/// Asked without connecting: a probe would be a session of its own.
pub fn is_listening(path: &Path) -> bool {
    let path = path.to_str().expect("UTF-8 temp path");
    std::fs::read_to_string("/proc/net/unix")
        .expect("read /proc/net/unix")
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 8 && f[7] == path && f[3] == "00010000"
        })
}

//! Processes a test starts, ended if the test runs past its deadline, and what `/proc` says
//! of them (the readers themselves are the kit's, shared with the benches: [`super::kit`]).

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

/// A field of `/proc/PID/status` given in kB (`VmRSS`, `VmHWM`, ...), in KiB; panics when the
/// process or the field is gone ([`super::kit::status_field`] says `None` instead).
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    super::kit::status_field(pid, field)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// `VmHWM` of `pid` in MiB (panics when it is gone).
pub fn vm_hwm_mib(pid: u32) -> f64 {
    super::kit::mib(proc_status_kib(pid, "VmHWM"))
}

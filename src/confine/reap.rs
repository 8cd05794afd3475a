//! Ending a confined server with everything it started.
//!
//! A Landlock domain outlives the process that entered it: a server that forks, calls
//! `setsid` and lets its parent exit leaves a daemon with the server's access. When the proxy
//! ends a confined server (a revocation) or the server exits, all its descendants go too.
//!
//! The server runs in a process group of its own, which nothing it starts can leave (the
//! seccomp filter makes `setsid` and `setpgid` do nothing): one `kill(-group)` ends all of
//! it at once, and the kernel lets no fork in progress escape such a signal (processes that
//! fork faster than `/proc` can be read, each replacing the last, die with the rest).
//!
//! Beside it, the proxy is a child subreaper, so every descendant that loses its parent
//! becomes the proxy's child rather than init's: while the proxy lives, everything the
//! server started is in the proxy's process tree, which `/proc` shows. Each round also
//! signals that whole tree, each process through a pidfd opened before its place in the tree
//! is checked, so a number reused by an unrelated process in between is never hit.
//!
//! If the proxy itself is killed (`SIGKILL`), the server gets `SIGKILL` too
//! ([`super::kernel::die_with_parent`]); what the server had already started then outlives
//! both, as nothing is left to end it (docs/security.md, "Confinement").

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::limits::GIVE_UP;
use rustix::process::{Pid, PidfdFlags, Signal};

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
pub(crate) fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(error = %e, "cannot become a child subreaper: a confined server's daemons could outlive it");
    }
}

/// Sends `signal` to the server's process `group` (the server's pid), then to every
/// descendant of this process: the server, what it started, and what those left behind
/// (reparented here). Returns how many descendants there were.
///
/// The group goes first, with one system call and before `/proc` is read: processes that
/// fork without pause leave a reader of `/proc` a sliver of the CPU, and the group signal
/// reaches them all at once. The group's number is the server's pid. Callers pass it only
/// while the server is not reaped (its number is then the server's alone), or at the moment
/// of the reap (crate::transport::proxy), and 0 (no group) after: once reaped, the number
/// may go to another process soon (`pid_max` can be 32768).
pub(crate) fn signal_descendants(group: i32, signal: Signal) -> usize {
    signal_group(group, signal);
    let tree = ProcessTable::read();
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let mut sent = 0;
    for pid in tree.descendants(me) {
        if signal_if_descendant(pid, me, signal) {
            sent += 1;
        }
    }
    sent
}

/// Sends `signal` to the server's process `group` only: one system call, for the moment the
/// server's exit is seen (see [`signal_descendants`] for when the number may be used).
pub(crate) fn signal_group(group: i32, signal: Signal) {
    if let Some(g) = Pid::from_raw(group) {
        let _ = rustix::process::kill_process_group(g, signal);
    }
}

/// Signals `pid` only if, once a pidfd pins the process, it is still below `me`: a process
/// alive from the `pidfd_open` to the signal kept its number all along, so the check read
/// that process; one that died in between makes the signal fail harmlessly.
fn signal_if_descendant(pid: i32, me: i32, signal: Signal) -> bool {
    let Some(p) = Pid::from_raw(pid) else {
        return false;
    };
    let Ok(fd) = rustix::process::pidfd_open(p, PidfdFlags::empty()) else {
        return false;
    };
    if !is_below(pid, me) {
        return false;
    }
    rustix::process::pidfd_send_signal(&fd, signal).is_ok()
}

/// Whether `me` is an ancestor of `pid`, walking `/proc` parent links.
fn is_below(pid: i32, me: i32) -> bool {
    let mut at = pid;
    // A process tree is at most as deep as the number of processes; pid_max bounds it.
    for _ in 0..4_194_304 {
        match parent_of(at) {
            Some(p) if p == me => return true,
            Some(p) if p > 1 && p != at => at = p,
            _ => return false,
        }
    }
    false
}

/// This process's children (running or not yet reaped), from `/proc`.
pub(crate) fn children() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    ProcessTable::read()
        .children_of(me)
        .filter_map(Pid::from_raw)
        .collect()
}

/// Every process's parent, read from `/proc` at one moment.
struct ProcessTable {
    parent: HashMap<i32, i32>,
}

impl ProcessTable {
    fn read() -> ProcessTable {
        let mut table = ProcessTable {
            parent: HashMap::new(),
        };
        let pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok());
        for pid in pids {
            if let Some(parent) = parent_of(pid) {
                table.parent.insert(pid, parent);
            }
        }
        table
    }

    fn children_of(&self, pid: i32) -> impl Iterator<Item = i32> + '_ {
        self.parent
            .iter()
            .filter(move |(_, p)| **p == pid)
            .map(|(c, _)| *c)
    }

    /// Everything below `root`, parents before their children.
    fn descendants(&self, root: i32) -> Vec<i32> {
        let mut kids: HashMap<i32, Vec<i32>> = HashMap::new();
        for (c, p) in &self.parent {
            kids.entry(*p).or_default().push(*c);
        }
        let mut out = Vec::new();
        let mut queue = vec![root];
        while let Some(at) = queue.pop() {
            for c in kids.get(&at).into_iter().flatten() {
                out.push(*c);
                queue.push(*c);
            }
        }
        out
    }
}

/// The parent of `pid`, from `/proc/PID/stat` (the field after the command's closing paren).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Reaps the children that have exited, without waiting for the others.
fn reap_exited() {
    for kid in children() {
        let _ = rustix::process::waitpid(Some(kid), rustix::process::WaitOptions::NOHANG);
    }
}

/// Kills every descendant of this process (what a confined server left running, after the
/// server itself was reaped) and reaps those that become its children, until none is left.
/// Every round kills the whole tree; what a dying process forks in the meantime is below it,
/// reparented here, and found in the next round. Gives up, loudly, after [`GIVE_UP`].
pub(crate) fn end_descendants() {
    let deadline = Instant::now() + GIVE_UP;
    let mut told = false;
    // Only through the tree: the group was signalled at the reap (the caller's), and its
    // number may be another's by now.
    loop {
        let left = signal_descendants(0, Signal::KILL);
        reap_exited();
        if left == 0 {
            // Killed processes may still be unreaped here; a last sweep takes them.
            reap_exited();
            return;
        }
        if !std::mem::replace(&mut told, true) {
            tracing::warn!(count = left, "ending what the confined server left running");
        }
        if Instant::now() > deadline {
            tracing::error!(
                count = left,
                "processes the confined server started are still running after {GIVE_UP:?}"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spawned_child_is_found() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        assert!(super::children().contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_grandchild_is_a_descendant_and_an_unrelated_process_is_not() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let me = std::process::id() as i32;
        let table = super::ProcessTable::read();
        assert!(table.descendants(me).contains(&grandchild));
        assert!(super::is_below(grandchild, me));
        assert!(!super::is_below(1, me));
        child.kill().unwrap();
        child.wait().unwrap();
        let _ = std::process::Command::new("kill")
            .arg(grandchild.to_string())
            .status();
    }
}

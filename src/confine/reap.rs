//! Ending a confined server with everything it started.
//!
//! A Landlock domain outlives the process that entered it: a server that forks, calls
//! `setsid` and lets its parent exit leaves a daemon with the server's access. When the proxy
//! ends a confined server (a revocation) or the server exits, its descendants go too. The
//! proxy is a child subreaper, so every descendant that loses its parent (a daemon's parent
//! exits at once; the server's children when it dies) becomes the proxy's child. The proxy
//! finds its children in `/proc` and signals them by numbers that cannot be reused while they
//! are its unreaped children.

use rustix::process::{Pid, Signal};

/// Makes this process the reaper of its orphaned descendants (`PR_SET_CHILD_SUBREAPER`).
pub fn become_subreaper() {
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        tracing::warn!(error = %e, "cannot become a child subreaper: a confined server's daemons could outlive it");
    }
}

/// Sends `signal` to every child of this process: the server, and the descendants that lost
/// their parent and became the proxy's. A child's number cannot be reused while it is not
/// reaped, so no other process is hit.
pub fn signal_children(signal: Signal) {
    for child in children() {
        let _ = rustix::process::kill_process(child, signal);
    }
}

/// This process's children (running or not yet reaped), from `/proc`.
pub fn children() -> Vec<Pid> {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| parent_of(*pid) == Some(me))
        .filter_map(Pid::from_raw)
        .collect()
}

/// The parent of `pid`, from `/proc/PID/stat` (the field after the command's closing paren).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Kills every child of this process (the orphans a confined server left, reparented here)
/// and reaps them, until none is left: each one killed may leave orphans of its own, which
/// become children in turn. Gives up after a few seconds.
pub fn end_orphans() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let kids = children();
        if kids.is_empty() || std::time::Instant::now() > deadline {
            return;
        }
        tracing::warn!(
            count = kids.len(),
            "ending what the confined server left running"
        );
        for kid in &kids {
            let _ = rustix::process::kill_process(*kid, Signal::KILL);
        }
        for kid in kids {
            let _ = rustix::process::waitpid(Some(kid), rustix::process::WaitOptions::empty());
        }
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
}

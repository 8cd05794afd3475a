//! The external consent command: JSON request on stdin, JSON decision on stdout.
//!
//! Request: `{"server": "name"|null, "message": "...", "requestedPaths": ["/abs", ...]}`.
//! Decision: `{"approvedPaths": ["/abs", ...]}` (any subset; anything not requested is
//! ignored), or `{"approvedPaths": []}` / `{"granted": false}` for none. A non-zero exit,
//! output that is not such an object, or no answer within the timeout is a denial.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::Request;
use crate::limits::MAX_OUTPUT;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Decision {
    #[serde(default)]
    approved_paths: Vec<String>,
    #[serde(default)]
    granted: Option<bool>,
}

pub(super) fn ask(
    argv: &[String],
    req: &Request,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let (program, args) = argv.split_first().ok_or("empty consent command")?;
    let deadline = Instant::now() + timeout;
    let mut command = Command::new(program);
    command
        .args(args)
        // Nothing the command runs may come from where a server can write: not the broker's
        // working directory (hosts start it inside the project; `python -m`, `-c` and Node
        // look there), not Python's user site folder (`usercustomize`), not a module path
        // or preloaded code named in the environment.
        .current_dir("/")
        .env("PYTHONNOUSERSITE", "1")
        .env("PYTHONSAFEPATH", "1")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONSTARTUP")
        .env_remove("NODE_PATH")
        .env_remove("NODE_OPTIONS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = spawn_until(command, deadline)
        .map_err(|e| format!("cannot start the consent command {program:?}: {e}"))?;
    let input = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        // A command that exits without reading its input is its own answer (below).
        let _ = stdin.write_all(&input);
    }
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(MAX_OUTPUT).read_to_end(&mut out);
        out
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "the consent command gave no answer within {timeout:?}"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for the consent command: {e}")),
        }
    };
    let output = reader.join().unwrap_or_default();
    if !status.success() {
        return Err(format!("the consent command failed ({status})"));
    }
    let decision: Decision = serde_json::from_slice(&output)
        .map_err(|e| format!("the consent command's answer is not a decision: {e}"))?;
    if decision.granted == Some(false) {
        return Ok(Vec::new());
    }
    Ok(decision.approved_paths)
}

/// Starts `command`, waiting until `deadline` at most. `spawn` returns only once the program
/// is running, and `exec` waits out a lease on the program's file (up to the kernel's
/// `lease-break-time`, 45 s): a server that can read the command's files (a read-only root)
/// could take one. So the start runs on a thread of its own; past the deadline the prompt is
/// a denial, and the child, if it starts after all, is killed there.
fn spawn_until(mut command: Command, deadline: Instant) -> std::io::Result<Child> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fsbroker-consent-start".into())
        .spawn(move || {
            let started = command.spawn();
            if let Err(std::sync::mpsc::SendError(Ok(mut late))) = tx.send(started) {
                let _ = late.kill();
                let _ = late.wait();
            }
        })?;
    let left = deadline.saturating_duration_since(Instant::now());
    match rx.recv_timeout(left) {
        Ok(started) => started,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "it did not start before the consent timeout",
        )),
    }
}

//! A file system that never answers a read (`tests/common/stuck_fuse.py`, FUSE on
//! `/dev/fuse`), as a hung FUSE or network mount under a root would be.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use super::python;

/// The mounted file system; unmounted and ended when dropped.
pub struct StuckFs {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl StuckFs {
    /// Mounts the stuck file system at `mnt`, or says why it cannot here.
    pub fn mount(mnt: &Path) -> Result<StuckFs, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse".into());
        }
        if rustix::process::geteuid().as_raw() != 0 {
            return Err("not root (mounting needs it)".into());
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/stuck_fuse.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(mnt)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start python: {e}"))?;
        let stdin = child.stdin.take();
        let mut line = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
        let fs = StuckFs { child, stdin };
        if line.trim() != "ready" {
            return Err(format!("the file system did not mount ({line:?})"));
        }
        Ok(fs)
    }
}

impl StuckFs {
    /// Unmounts it now: the reads stuck in it fail, and what waited behind them goes on.
    pub fn unmount(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

impl Drop for StuckFs {
    fn drop(&mut self) {
        // Its stdin closing makes it unmount and exit; the blocked readers then fail.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

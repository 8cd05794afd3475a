//! `fsbroker audit verify` and `audit head`: an audit log's hash chain checked, its head
//! printed.

use std::path::PathBuf;
use std::process::ExitCode;

use super::print;

/// Runs `fsbroker audit verify`.
pub(super) fn verify(files: &[PathBuf], anchor: Option<&str>) -> ExitCode {
    let s = match fsbroker::audit::verify_files(files, anchor) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fsbroker: {e}");
            return ExitCode::FAILURE;
        }
    };
    let name = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(anchor) = anchor.filter(|_| !s.anchor_found) {
        eprintln!(
            "fsbroker: audit log {name}: the head {anchor} is not in it: the log was cut or \
             rewritten before that line"
        );
        return ExitCode::FAILURE;
    }
    // What the files given leave unchecked: the file before them, and the one after.
    let mut scope = String::new();
    if let Some(from) = &s.continues_from {
        scope += &format!(
            "; it continues {from}, which was not checked (give the files together, oldest \
             first, to check the link)"
        );
    }
    if s.continued {
        scope += "; the log goes on in a later file, which was not checked";
    }
    if !s.unsealed.is_empty() {
        let pids: Vec<String> = s.unsealed.iter().map(u64::to_string).collect();
        eprintln!(
            "fsbroker: audit log {name}: unsealed: crash or truncation — the run(s) of pid {} \
             have no seal (a broker still running, one that crashed, or lines removed from the \
             end); the chain itself is intact, {} line(s), head {}{scope}",
            pids.join(", "),
            s.lines,
            s.head
        );
        return ExitCode::from(3);
    }
    let sealed = if s.continued {
        "every run that ended in them is sealed"
    } else {
        "every run is sealed"
    };
    print(&format!(
        "{name}: ok, {} line(s), first {}, last {}, head {}; the hash chain is intact and \
         {sealed}{scope}\n",
        s.lines,
        s.first.as_deref().unwrap_or("-"),
        s.last.as_deref().unwrap_or("-"),
        s.head
    ))
}

/// Runs `fsbroker audit head`.
pub(super) fn head(files: &[PathBuf]) -> ExitCode {
    match fsbroker::audit::verify_files(files, None) {
        Ok(s) => print(&format!("{}\n", s.head)),
        Err(e) => {
            eprintln!("fsbroker: {e}");
            ExitCode::FAILURE
        }
    }
}

//! Asking on the controlling terminal.
//!
//! stdin and stdout carry the protocol, so the question goes to `/dev/tty`, which is the
//! person at the keyboard whatever the pipes are. Prompts are serialised: one question on
//! the screen at a time.

// Ambient `std::fs` calls are allowed here (clippy.toml): the controlling terminal (`/dev/tty`).
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Request;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The controlling terminal, if this process has one.
pub(super) fn open() -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(rustix::fs::OFlags::NOCTTY.bits() as i32)
        .open("/dev/tty")
        .ok()
}

pub(super) fn ask(mut tty: File, req: &Request, timeout: Duration) -> Result<Vec<String>, String> {
    // One prompt at a time, and the wait for the terminal counts against the request's time:
    // prompts queued behind one nobody answers are denied when their time is up, not shown
    // later to a person whose answer no longer matters.
    let deadline = Instant::now() + timeout;
    let _turn = loop {
        match ONE_AT_A_TIME.try_lock() {
            Ok(turn) => break turn,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                if Instant::now() >= deadline {
                    return Err(
                        "the terminal was busy with another prompt until the deadline".into(),
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let mut text = format!(
        "\nfsbroker: {} asks for file access:\n",
        req.server
            .as_deref()
            .map_or("an MCP server".to_owned(), |s| format!(
                "the MCP server {s:?}"
            ))
    );
    if !req.message.is_empty() {
        text += &format!("  \"{}\"\n", req.message.replace(char::is_control, " "));
    }
    for (i, p) in req.requested_paths.iter().enumerate() {
        text += &format!("  [{}] {}\n", i + 1, p.replace(char::is_control, "?"));
    }
    let n = req.requested_paths.len();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let prompt = format!(
            "{text}Approve [a]ll, [n]one, or some (e.g. 1,3)? ({}s to answer) ",
            left.as_secs()
        );
        tty.write_all(prompt.as_bytes())
            .map_err(|e| e.to_string())?;
        let Some(line) = read_line(&mut tty, deadline)? else {
            let _ = tty.write_all(b"\nfsbroker: no answer; denied.\n");
            return Err("no answer on the terminal in time".into());
        };
        match parse_answer(&line, n) {
            Ok(picked) => {
                return Ok(picked
                    .into_iter()
                    .map(|i| req.requested_paths[i].clone())
                    .collect());
            }
            Err(why) => {
                tty.write_all(format!("fsbroker: {why}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
                text.clear();
            }
        }
    }
}

/// One line from the terminal, or `None` when the deadline passes first.
fn read_line(tty: &mut File, deadline: Instant) -> Result<Option<String>, String> {
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let fd = tty.as_fd();
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec::try_from(left).ok();
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(None),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
        let mut byte = [0u8; 256];
        let got = tty.read(&mut byte).map_err(|e| e.to_string())?;
        if got == 0 {
            return Ok(None);
        }
        line.extend_from_slice(&byte[..got]);
        if let Some(end) = line.iter().position(|&b| b == b'\n' || b == b'\r') {
            line.truncate(end);
            return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
        }
    }
}

/// `a`/`all`/`y`/`yes` → every index; `n`/`none`/`no` → none; `1,3`, `1 3`, `2-4` → those.
pub(super) fn parse_answer(answer: &str, n: usize) -> Result<Vec<usize>, String> {
    let a = answer.trim().to_ascii_lowercase();
    match a.as_str() {
        "a" | "all" | "y" | "yes" => return Ok((0..n).collect()),
        "n" | "none" | "no" => return Ok(Vec::new()),
        "" => return Err("please answer a, n, or numbers".into()),
        _ => {}
    }
    let mut picked = Vec::new();
    for part in a
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|p| !p.is_empty())
    {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (part, part),
        };
        let parse = |s: &str| {
            s.parse::<usize>()
                .ok()
                .filter(|&i| (1..=n).contains(&i))
                .ok_or_else(|| format!("{part:?} is not a number from 1 to {n}"))
        };
        for i in parse(lo)?..=parse(hi)? {
            if !picked.contains(&(i - 1)) {
                picked.push(i - 1);
            }
        }
    }
    picked.sort_unstable();
    Ok(picked)
}

#[cfg(test)]
mod tests {
    use super::parse_answer;

    #[test]
    fn answers() {
        assert_eq!(parse_answer("a", 3), Ok(vec![0, 1, 2]));
        assert_eq!(parse_answer(" YES ", 2), Ok(vec![0, 1]));
        assert_eq!(parse_answer("n", 3), Ok(vec![]));
        assert_eq!(parse_answer("3,1", 3), Ok(vec![0, 2]));
        assert_eq!(parse_answer("1 2-3", 4), Ok(vec![0, 1, 2]));
        assert!(parse_answer("4", 3).is_err());
        assert!(parse_answer("0", 3).is_err());
        assert!(parse_answer("", 3).is_err());
        assert!(parse_answer("x", 3).is_err());
    }
}

//! A confined server's stderr, copied to the proxy's.
//!
//! A confined server does not get the proxy's stderr (which may be the user's terminal, and
//! whose foreground a server could take): it gets a pipe, and its lines are copied here,
//! defanged, so that neither a flood nor an escape sequence from the server reaches or stalls
//! the proxy's own stderr. The last of them are kept ([`Tail`]) for the diagnosis of a server
//! that fails to start.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::sync::Mutex;

use crate::limits::{STDERR_TAIL_BYTES, STDERR_TAIL_LINE, STDERR_TAIL_LINES};

/// The end of a confined server's stderr, defanged, bounded ([`STDERR_TAIL_LINES`] lines,
/// [`STDERR_TAIL_BYTES`] bytes, each line cut at [`STDERR_TAIL_LINE`]): what the diagnosis
/// of a start that failed reads.
pub(super) struct Tail {
    text: Mutex<TailText>,
    /// Set once every process holding the pipe has closed it.
    closed: tokio::sync::watch::Sender<bool>,
}

#[derive(Default)]
struct TailText {
    lines: VecDeque<String>,
    /// Bytes of `lines`.
    bytes: usize,
    /// The line being written (no newline yet).
    partial: String,
    /// Whether `partial` was cut.
    cut: bool,
}

impl Tail {
    pub(super) fn new() -> Tail {
        Tail {
            text: Mutex::default(),
            closed: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Adds defanged text (valid UTF-8 by then).
    fn push(&self, text: &str) {
        let mut t = self.text.lock().unwrap_or_else(|e| e.into_inner());
        let mut rest = text;
        while !rest.is_empty() {
            let (piece, ended) = match rest.find('\n') {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            let room = STDERR_TAIL_LINE.saturating_sub(t.partial.len());
            if piece.len() <= room {
                t.partial.push_str(piece);
            } else {
                let mut end = room;
                while !piece.is_char_boundary(end) {
                    end -= 1;
                }
                t.partial.push_str(&piece[..end]);
                t.cut = true;
            }
            match ended {
                Some(i) => {
                    let mut line = std::mem::take(&mut t.partial);
                    if std::mem::take(&mut t.cut) {
                        line.push_str(" [cut]");
                    }
                    t.bytes += line.len();
                    t.lines.push_back(line);
                    while t.lines.len() > STDERR_TAIL_LINES || t.bytes > STDERR_TAIL_BYTES {
                        let Some(old) = t.lines.pop_front() else {
                            break;
                        };
                        t.bytes -= old.len();
                    }
                    rest = &rest[i..];
                }
                None => break,
            }
        }
    }

    /// The lines kept, oldest first, with the one not yet ended last.
    pub(super) fn lines(&self) -> Vec<String> {
        let t = self.text.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines: Vec<String> = t.lines.iter().cloned().collect();
        if !t.partial.is_empty() {
            lines.push(t.partial.clone());
        }
        lines
    }

    /// Waits, at most `limit`, for the pipe to close (everything the server wrote is in).
    pub(super) async fn settled(&self, limit: std::time::Duration) {
        let mut closed = self.closed.subscribe();
        let _ = tokio::time::timeout(limit, closed.wait_for(|c| *c)).await;
    }
}

/// Copies a confined server's stderr to the proxy's until every process holding it is gone,
/// keeping its last lines in `tail`.
///
/// The server must not be able to stop the proxy through it, nor reach the user's terminal:
/// - it writes through a descriptor of its own, not `io::stderr()`, whose lock the proxy's
///   own log lines take;
/// - when the proxy's stderr is a pipe, a chunk goes in only while the pipe is less than half
///   full, else it is dropped (and the loss said once space returns): a host that does not
///   drain stderr fills it with the server's flood, and the proxy's next log line (the one
///   before a revocation's signal, say) would block for good;
/// - control characters (escape sequences: a terminal's clipboard, title, cursor) become `?`;
/// - once the proxy's stderr fails (closed), the rest is read and dropped, so the server is
///   not killed by `SIGPIPE` for logging.
pub(super) fn copy_stderr(mut from: std::fs::File, tail: &Tail) {
    use std::io::{Read, Write};
    let fd = io::stderr().as_fd().try_clone_to_owned().ok();
    let is_pipe = fd.as_ref().is_some_and(|fd| {
        rustix::fs::fstat(fd).is_ok_and(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
        })
    });
    let capacity = match &fd {
        Some(fd) if is_pipe => rustix::pipe::fcntl_getpipe_size(fd).unwrap_or(65536),
        _ => 0,
    };
    let mut to = fd.map(std::fs::File::from);
    let mut buf = [0u8; 4096];
    let mut dropped = 0usize;
    let mut defang = Defang::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // Every chunk is read as text for the tail, whether it is shown or dropped: a
        // diagnosis must see the server's last words even when a host does not drain stderr.
        let safe = defang.feed(&buf[..n]);
        tail.push(std::str::from_utf8(&safe).unwrap_or_default());
        let Some(out) = to.as_mut() else { continue };
        if is_pipe && unread(out) + n > capacity / 2 {
            dropped += n;
            continue;
        }
        let mut text = Vec::with_capacity(n + 64);
        if dropped > 0 {
            text.extend_from_slice(
                format!("[fsbroker: {dropped} bytes of the server's stderr dropped: the pipe was full]\n")
                    .as_bytes(),
            );
            dropped = 0;
        }
        text.extend(safe);
        if out.write_all(&text).is_err() {
            to = None;
        }
    }
    tail.closed.send_replace(true);
}

/// Bytes written to the pipe `fd` and not yet read (none when the kernel will not say).
fn unread(fd: &std::fs::File) -> usize {
    rustix::io::ioctl_fionread(fd).map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// Makes a byte stream safe to show on a terminal, across reads: valid UTF-8 passes, except
/// control characters other than newline and tab (C0, DEL and C1, which a terminal takes as
/// commands), which become `?`, as does every byte that is not valid UTF-8 (a lone `0x9b` is
/// CSI to a terminal in 8-bit mode). A sequence cut by a read boundary is held for the next.
#[derive(Default)]
struct Defang {
    /// The start of a UTF-8 sequence the last read ended in (at most 3 bytes).
    held: Vec<u8>,
}

impl Defang {
    /// The safe form of `bytes`, which follow the bytes of earlier calls.
    fn feed(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut input = std::mem::take(&mut self.held);
        input.extend_from_slice(bytes);
        let mut out = Vec::with_capacity(input.len());
        let mut rest = &input[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    push_safe(&mut out, text);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8: `valid_up_to` says so.
                    push_safe(&mut out, std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(b'?');
                            rest = &bad[n..];
                        }
                        None => {
                            // Cut short by the end of this read: the rest comes next time.
                            self.held = bad.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }
}

/// Appends `text` to `out` with control characters other than newline and tab made `?`.
fn push_safe(out: &mut Vec<u8>, text: &str) {
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.push(b'?');
        } else {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tail_keeps_the_last_lines_bounded() {
        let tail = super::Tail::new();
        for i in 0..200 {
            tail.push(&format!("line {i}\n"));
        }
        tail.push("half of a ");
        tail.push("line");
        let lines = tail.lines();
        assert_eq!(lines.len(), super::STDERR_TAIL_LINES + 1);
        assert_eq!(lines[0], format!("line {}", 200 - super::STDERR_TAIL_LINES));
        assert_eq!(lines.last().unwrap(), "half of a line");
        // One endless line is cut, on a character boundary.
        let tail = super::Tail::new();
        tail.push(&"é".repeat(super::STDERR_TAIL_LINE));
        tail.push("\nnext\n");
        let lines = tail.lines();
        assert!(
            lines[0].len() <= super::STDERR_TAIL_LINE + 6,
            "{}",
            lines[0].len()
        );
        assert!(lines[0].ends_with(" [cut]"));
        assert_eq!(lines[1], "next");
        // Many long lines keep at most the byte bound.
        let tail = super::Tail::new();
        for _ in 0..100 {
            tail.push(&format!("{}\n", "x".repeat(1000)));
        }
        let kept: usize = tail.lines().iter().map(String::len).sum();
        assert!(kept <= super::STDERR_TAIL_BYTES, "{kept}");
    }

    #[test]
    fn stderr_is_defanged_across_reads() {
        let mut d = super::Defang::default();
        // C1 CSI as UTF-8, cut between two reads.
        let mut out = d.feed(b"A\xc2");
        out.extend(d.feed(b"\x9b31mRED\n"));
        assert_eq!(out, b"A?31mRED\n");
        // Raw 8-bit C1 bytes, ESC, BEL: all `?`; text, newline and tab stay.
        assert_eq!(
            d.feed(b"\x9b31m\x90q\x1b]52;c;x\x07 caf\xc3\xa9 \xe2\x82\xac\tok\n"),
            "?31m?q?]52;c;x? café €\tok\n".as_bytes()
        );
        // A multi-byte character cut in three.
        let mut out = d.feed(b"\xe2");
        out.extend(d.feed(b"\x82"));
        out.extend(d.feed(b"\xac"));
        assert_eq!(out, "€".as_bytes());
    }
}

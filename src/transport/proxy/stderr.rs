//! A confined server's stderr, copied to the proxy's.
//!
//! A confined server does not get the proxy's stderr (which may be the user's terminal, and
//! whose foreground a server could take): it gets a pipe, and its lines are copied here,
//! defanged, so that neither a flood nor an escape sequence from the server reaches or stalls
//! the proxy's own stderr.

use std::io;
use std::os::fd::AsFd;

/// Copies a confined server's stderr to the proxy's until every process holding it is gone.
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
pub(super) fn copy_stderr(mut from: std::fs::File) {
    use std::io::{Read, Write};
    let Ok(fd) = io::stderr().as_fd().try_clone_to_owned() else {
        return;
    };
    let is_pipe = rustix::fs::fstat(&fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Fifo
    });
    let capacity = if is_pipe {
        rustix::pipe::fcntl_getpipe_size(&fd).unwrap_or(65536)
    } else {
        0
    };
    let mut to = Some(std::fs::File::from(fd));
    let mut buf = [0u8; 4096];
    let mut dropped = 0usize;
    let mut defang = Defang::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
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
        text.extend(defang.feed(&buf[..n]));
        if out.write_all(&text).is_err() {
            to = None;
        }
    }
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

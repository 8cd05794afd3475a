//! Large `files/read` chunks in base64 through the real binary. A chunk of at least 256 KiB is
//! encoded into pages of its own, copied into the output and then reused for a later chunk of
//! the same session (src/outgoing.rs). Pages reused while something still held them would show
//! as a response carrying bytes of a later chunk: an earlier design handed the pages to the
//! stdout pipe with `vmsplice` and reused them once the peer had read them, and the tests here
//! with a peer that splices, tees or `std::io::copy`s the output onward caught exactly that.
//! So every test here decodes every answer and compares it with the exact bytes of the file —
//! with readers that are slow and irregular, readers that leave in the middle of a response,
//! readers that splice onward, and two files at once. Every 4-KiB page of a test file starts
//! with a tag naming its file and page, so a wrong byte is reported with where it came from.
//!
//! One file though long: every test reads large chunks through the same raw-pipe reader that
//! checks framing byte for byte.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use common::kit::{Rng, splitmix64};
use common::{bin, proc_status_kib, request_line, tempdir, with_deadline, write_policy};
use serde_json::{Value, json};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// The smallest chunk encoded into pages (`PAGES_FROM` in src/methods/read.rs).
const PAGES_FROM: u64 = 256 * KIB;
/// `max_chunk_size` in every policy here (the default, written out).
const MAX_CHUNK: u64 = 8 * MIB;

// ---------------------------------------------------------------------------------------------
// File contents: deterministic, every 4-KiB page distinguishable
// ---------------------------------------------------------------------------------------------

/// The top bits of a page tag (the first eight bytes of every 4-KiB page).
const TAG: u64 = 0xF5B0 << 48;

/// Eight-byte word `i` of the file made from `seed`: a tag (seed, page) at the start of each
/// page, pseudo-random bytes elsewhere.
fn word(seed: u64, i: u64) -> u64 {
    if i % 512 == 0 {
        TAG | (seed << 32) | (i / 512)
    } else {
        splitmix64(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ i)
    }
}

/// Bytes `offset..offset + len` of the file made from `seed`.
fn bytes_at(seed: u64, offset: u64, len: u64) -> Vec<u8> {
    let first = offset / 8;
    let last = (offset + len).div_ceil(8);
    let mut v = Vec::with_capacity(((last - first) * 8) as usize);
    for i in first..last {
        v.extend_from_slice(&word(seed, i).to_le_bytes());
    }
    v.drain(..(offset - first * 8) as usize);
    v.truncate(len as usize);
    v
}

/// Writes the `size`-byte file made from `seed` at `path`.
fn write_file(path: &Path, seed: u64, size: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    let mut off = 0;
    while off < size {
        let n = MIB.min(size - off);
        f.write_all(&bytes_at(seed, off, n)).unwrap();
        off += n;
    }
    f.sync_all().unwrap();
}

/// Writes the file made from `seed` and returns its bytes as read back from disk.
fn make_file(path: &Path, seed: u64, size: u64) -> Arc<Vec<u8>> {
    write_file(path, seed, size);
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, size);
    Arc::new(data)
}

/// Says which file and page a received page came from, by its tag.
fn describe_tag(bytes: &[u8]) -> String {
    let Some(w) = bytes.get(..8) else {
        return "(too short for a tag)".into();
    };
    let w = u64::from_le_bytes(w.try_into().unwrap());
    if w & (0xFFFF << 48) == TAG {
        format!("file seed {} page {}", (w >> 32) & 0xFFFF, w & 0xFFFF_FFFF)
    } else {
        format!("no tag ({w:#018x})")
    }
}

/// A description of where `got` (a chunk at file offset `offset`) first differs from `want`.
fn first_difference(got: &[u8], want: &[u8], offset: u64) -> String {
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let pos = offset + i as u64;
    let wrong_pages = got
        .chunks(4096)
        .zip(want.chunks(4096))
        .filter(|(a, b)| a != b)
        .count();
    // The tag of the first whole page at or after the difference, as received.
    let page = pos.div_ceil(4096) * 4096;
    let rel = (page - offset) as usize;
    let tag = got
        .get(rel..)
        .map_or("(past the chunk)".to_owned(), describe_tag);
    let want_tag = want
        .get(rel..)
        .map_or("(past the chunk)".to_owned(), describe_tag);
    format!(
        "{} bytes received, {} expected; first wrong byte at chunk byte {i} (file offset \
         {pos}); {wrong_pages} of {} 4-KiB pieces differ; the page at file offset {page} \
         holds {tag}, expected {want_tag}",
        got.len(),
        want.len(),
        want.len().div_ceil(4096)
    )
}

// ---------------------------------------------------------------------------------------------
// Frames
// ---------------------------------------------------------------------------------------------

/// A response line as JSON with the `content` string emptied, and the range of the raw
/// content string in `line` (for frames large enough to be split; smaller ones are parsed
/// whole and the range is `None`). Base64 has no quote or backslash, so the first quote after
/// the content's opening quote closes it; a torn or mixed frame fails the JSON parse or the
/// content check.
fn split_frame(line: &[u8]) -> (Value, Option<std::ops::Range<usize>>) {
    assert!(
        line.ends_with(b"\n"),
        "frame without newline ({} bytes): {:?}...",
        line.len(),
        String::from_utf8_lossy(&line[..line.len().min(300)])
    );
    let parse = |bytes: &[u8]| -> Value {
        serde_json::from_slice(bytes).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}), {} bytes: {:?}...",
                bytes.len(),
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            )
        })
    };
    const KEY: &[u8] = b"\"content\":\"";
    if line.len() < 64 << 10 {
        return (parse(line), None);
    }
    let head = &line[..line.len().min(256)];
    let Some(k) = head.windows(KEY.len()).position(|w| w == KEY) else {
        return (parse(line), None);
    };
    let start = k + KEY.len();
    let end = start
        + memchr::memchr(b'"', &line[start..])
            .unwrap_or_else(|| panic!("unterminated content in a {}-byte frame", line.len()));
    let mut rest = line[..start].to_vec();
    rest.extend_from_slice(&line[end..]);
    (parse(&rest), Some(start..end))
}

/// The response's id, which must be a number.
fn id_of(v: &Value) -> u64 {
    v["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("response without a numeric id: {v}"))
}

/// One base64 read and what its answer must be.
#[derive(Debug, Clone)]
struct Want {
    /// The served path (`r/NAME`).
    path: String,
    /// The file's bytes.
    data: Arc<Vec<u8>>,
    offset: u64,
    /// The length asked for.
    asked: u64,
}

impl Want {
    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    /// The bytes the answer must cover: the asked length, capped by the policy and the end.
    fn length(&self) -> u64 {
        self.asked
            .min(MAX_CHUNK)
            .min(self.size().saturating_sub(self.offset))
    }

    fn params(&self) -> Value {
        json!({"path": self.path, "offset": self.offset, "length": self.asked,
               "encoding": "base64"})
    }

    fn expected(&self) -> &[u8] {
        let start = self.offset.min(self.size()) as usize;
        &self.data[start..start + self.length() as usize]
    }

    /// Checks a whole answer: fields, and every byte of the content.
    fn check(&self, line: &[u8], v: &Value, content: Option<std::ops::Range<usize>>) {
        let what = format!(
            "read of {} at {} for {} (id {})",
            self.path, self.offset, self.asked, v["id"]
        );
        assert!(v.get("error").is_none(), "{what} failed: {v}");
        let r = &v["result"];
        assert_eq!(r["encoding"], "base64", "{what}: {r}");
        assert_eq!(r["offset"], json!(self.offset), "{what}: {r}");
        assert_eq!(r["length"], json!(self.length()), "{what}: {r}");
        assert_eq!(r["size"], json!(self.size()), "{what}: {r}");
        assert_eq!(
            r["eof"],
            json!(self.offset + self.length() >= self.size()),
            "{what}: {r}"
        );
        let b64: &[u8] = match content {
            Some(range) => &line[range],
            None => r["content"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: content is not a string: {r}"))
                .as_bytes(),
        };
        assert_eq!(
            b64.len() as u64,
            4 * self.length().div_ceil(3),
            "{what}: base64 of the wrong length"
        );
        let got = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_else(|e| panic!("{what}: bad base64 ({e})"));
        let want = self.expected();
        if got != want {
            panic!(
                "{what}: wrong bytes: {}",
                first_difference(&got, want, self.offset)
            );
        }
    }
}

/// What a pipelined request's answer must be.
#[derive(Debug, Clone)]
enum Check {
    Read(Want),
    Ping,
    /// `files/list` of the root: these names among the entries.
    List(Vec<&'static str>),
    /// A small utf-8 read of the whole file: this text.
    Text(String),
}

impl Check {
    fn request(&self, id: u64) -> Vec<u8> {
        match self {
            Check::Read(w) => request_line(id, "files/read", w.params()),
            Check::Ping => request_line(id, "ping", json!({})),
            Check::List(_) => request_line(id, "files/list", json!({"path": "r"})),
            Check::Text(_) => request_line(id, "files/read", json!({"path": "r/notes.txt"})),
        }
    }

    fn check(&self, line: &[u8], v: &Value, content: Option<std::ops::Range<usize>>) {
        match self {
            Check::Read(w) => w.check(line, v, content),
            Check::Ping => assert_eq!(v["result"], json!({}), "ping: {v}"),
            Check::List(names) => {
                let entries = v["result"]["entries"]
                    .as_array()
                    .unwrap_or_else(|| panic!("list: {v}"));
                for name in names {
                    assert!(
                        entries.iter().any(|e| e["name"] == *name),
                        "list lacks {name}: {v}"
                    );
                }
            }
            Check::Text(text) => {
                let r = &v["result"];
                assert_eq!(r["encoding"], "utf-8", "{v}");
                assert_eq!(r["content"], json!(text), "text read: {v}");
                assert_eq!(r["eof"], true, "{v}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A slow, irregular reader
// ---------------------------------------------------------------------------------------------

/// Reads in pieces of irregular size (often tiny), now and then pausing, so the broker's
/// output pipe is full most of the time and often partly read.
struct Irregular<R> {
    inner: R,
    rng: Rng,
    max_piece: u64,
    /// About one read in this many is preceded by a pause of up to 3 ms.
    pause_one_in: u64,
}

impl<R: Read> Read for Irregular<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let r = self.rng.next();
        let piece = match r % 4 {
            0 => 1 + (r >> 8) % 64,
            1 => 1 + (r >> 8) % 4096,
            _ => 1 + (r >> 8) % self.max_piece,
        } as usize;
        if (r >> 40) % self.pause_one_in == 0 {
            std::thread::sleep(Duration::from_micros((r >> 20) % 3000));
        }
        let n = piece.min(buf.len());
        self.inner.read(&mut buf[..n])
    }
}

/// Reads answers off `inner` through [`Irregular`], taking from it no more than it is told
/// (no read-ahead), so that it can stop with a chosen part of an answer still in the pipe.
struct FrameReader<R> {
    inner: Irregular<R>,
    /// Bytes read and not yet handed out.
    buf: Vec<u8>,
    /// Where each piece is read into.
    scratch: Vec<u8>,
    rng: Rng,
}

impl<R: Read> FrameReader<R> {
    fn new(inner: R, seed: u64) -> FrameReader<R> {
        FrameReader {
            inner: Irregular {
                inner,
                rng: Rng(seed),
                max_piece: 256 << 10,
                pause_one_in: 12,
            },
            buf: Vec::new(),
            scratch: vec![0; 512 << 10],
            rng: Rng(seed ^ 0x5555),
        }
    }

    /// Reads one more piece, of at most `most` bytes; false at end of input.
    fn more(&mut self, most: usize) -> bool {
        let n = loop {
            let most = most.min(self.scratch.len());
            match self.inner.read(&mut self.scratch[..most]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => panic!("read output: {e}"),
            }
        };
        self.buf.extend_from_slice(&self.scratch[..n]);
        n > 0
    }

    /// Reads until what is buffered holds a whole line, or the start of a line up to the
    /// opening quote of its `content` (or 256 bytes of it); false at end of input.
    fn head(&mut self) -> bool {
        const KEY: &[u8] = b"\"content\":\"";
        let mut scanned = 0;
        loop {
            if memchr::memchr(b'\n', &self.buf[scanned..]).is_some()
                || self.buf.len() >= 256
                || self.buf.windows(KEY.len()).any(|w| w == KEY)
            {
                return true;
            }
            scanned = self.buf.len();
            if !self.more(64) {
                assert!(self.buf.is_empty(), "output ended inside a frame");
                return false;
            }
        }
    }

    /// What is read and not yet handed out: the start of the next line.
    fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Reads until the next line's first `stop` bytes are in (no further).
    fn read_to(&mut self, stop: usize) {
        while self.buf.len() < stop {
            let most = stop - self.buf.len();
            assert!(self.more(most), "output ended inside a frame");
        }
    }

    /// The next line (read to its end).
    fn line(&mut self) -> Vec<u8> {
        let mut scanned = 0;
        loop {
            if let Some(i) = memchr::memchr(b'\n', &self.buf[scanned..]) {
                let rest = self.buf.split_off(scanned + i + 1);
                return std::mem::replace(&mut self.buf, rest);
            }
            scanned = self.buf.len();
            assert!(self.more(512 << 10), "output ended inside a frame");
        }
    }

    /// The next line; `stall(head)` may name a position in it (seeing its first bytes, up to
    /// the start of a `content` string) at which to stop reading for 10-50 ms, leaving the
    /// rest in the pipe. `None` at end of input.
    fn next_line(&mut self, stall: &mut dyn FnMut(&[u8]) -> Option<usize>) -> Option<Vec<u8>> {
        if !self.head() {
            return None;
        }
        if let Some(stop) = stall(self.buffered()) {
            self.read_to(stop);
            let r = self.rng.next();
            std::thread::sleep(Duration::from_millis(10 + r % 40));
        }
        Some(self.line())
    }
}

/// Where the `content` string of a line starting with `head` starts.
fn content_start(head: &[u8]) -> Option<usize> {
    const KEY: &[u8] = b"\"content\":\"";
    Some(head.windows(KEY.len()).position(|w| w == KEY)? + KEY.len())
}

/// A response line, its JSON with `content` emptied, and where its content is in the line
/// (see [`split_frame`]).
type Answer = (Vec<u8>, Value, Option<std::ops::Range<usize>>);

/// The id of a response from its first bytes (`{"jsonrpc":"2.0","id":N,...`).
fn id_in_head(head: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"id\":";
    let k = head.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let digits: Vec<u8> = head[k..]
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// Sends every request at once from a thread of its own (keeping `input` open until all are
/// answered) while `output` is read here; checks each answer against its request's check.
/// About every other answer whose body is in pages, reading stops for 10-50 ms with the last
/// few bytes (0 to 64 KiB) of the body, or the bytes right after it, still in the pipe — the
/// moment the broker must not yet reuse those pages, while it goes on building later answers.
/// Returns `input`, still open.
fn exchange<W, R>(input: W, output: &mut FrameReader<R>, checks: Vec<Check>) -> W
where
    W: Write + Send + 'static,
    R: Read,
{
    let mut wire = Vec::new();
    let mut pending = HashMap::new();
    for (i, c) in checks.into_iter().enumerate() {
        let id = 1000 + i as u64;
        wire.extend(c.request(id));
        pending.insert(id, c);
    }
    let total = pending.len();
    let writer = std::thread::spawn(move || {
        let mut input = input;
        input.write_all(&wire).expect("send requests");
        input.flush().expect("flush requests");
        input
    });
    let mut rng = Rng(total as u64);
    let mut stalls = 0;
    while !pending.is_empty() {
        let mut stall = |head: &[u8]| -> Option<usize> {
            let start = content_start(head)?;
            let Some(Check::Read(w)) = pending.get(&id_in_head(head)?) else {
                return None;
            };
            if w.length() < PAGES_FROM || rng.below_u64(2) == 0 {
                return None;
            }
            let end = start + 4 * w.length().div_ceil(3) as usize;
            let stop = match rng.below_u64(6) {
                0 => end,                                  // the body read, not what follows
                1 => end + 1 + rng.below_u64(20) as usize, // inside what follows
                2 => end - 1,                              // all but the last byte
                _ => end - 1 - rng.below_u64(64 << 10) as usize,
            };
            stalls += 1;
            Some(stop.max(head.len()))
        };
        let Some(line) = output.next_line(&mut stall) else {
            panic!(
                "output closed with {} of {total} answers missing",
                pending.len()
            );
        };
        let (v, content) = split_frame(&line);
        let id = id_of(&v);
        let check = pending
            .remove(&id)
            .unwrap_or_else(|| panic!("answer to an unknown or already answered id {id}"));
        check.check(&line, &v, content);
    }
    assert!(stalls > 0, "no answer was large enough to stall in");
    writer.join().expect("writer thread")
}

// ---------------------------------------------------------------------------------------------
// Brokers
// ---------------------------------------------------------------------------------------------

/// A policy serving `root` as `r` (consent auto), with no request rate limit and 8-MiB
/// chunks allowed; written into `dir`.
fn policy(dir: &Path, root: &Path) -> PathBuf {
    let limits = format!("requests_per_second = 0\nmax_chunk_size = {MAX_CHUNK}");
    write_policy(dir, root, "", &limits)
}

/// A broker process: killed if still running when dropped. Not the kit's driver
/// (`common::fsb::Fsb`) on purpose: these tests take the broker's raw stdin and stdout (or
/// leave them null for `--listen`) and read them themselves, in irregular pieces and with
/// stalls ([`FrameReader`]), to check the framing byte for byte; the driver reads whole lines.
struct Proc {
    child: Child,
    /// Its stderr, in a file (read after it exits).
    stderr: PathBuf,
}

impl Proc {
    /// `fsbroker ARGS...` with the given stdio for stdin and stdout, stderr into `stderr`.
    fn start(args: &[&std::ffi::OsStr], stdio: (Stdio, Stdio), stderr: &Path) -> Proc {
        let err = std::fs::File::create(stderr).unwrap();
        let child = Command::new(bin())
            .args(args)
            .env("RUST_LOG", "fsbroker=debug")
            .stdin(stdio.0)
            .stdout(stdio.1)
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start fsbroker");
        Proc {
            child,
            stderr: stderr.to_path_buf(),
        }
    }

    /// `fsbroker serve --policy POLICY` over pipes.
    fn stdio(policy: &Path, stderr: &Path) -> (Proc, ChildStdin, ChildStdout) {
        let mut p = Proc::start(
            &["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()],
            (Stdio::piped(), Stdio::piped()),
            stderr,
        );
        let stdin = p.child.stdin.take().unwrap();
        let stdout = p.child.stdout.take().unwrap();
        (p, stdin, stdout)
    }

    /// `fsbroker serve --listen SOCK --policy POLICY`, once the socket is there.
    fn listen(policy: &Path, sock: &Path, stderr: &Path) -> Proc {
        let mut p = Proc::start(
            &[
                "serve".as_ref(),
                "--listen".as_ref(),
                sock.as_os_str(),
                "--policy".as_ref(),
                policy.as_os_str(),
            ],
            (Stdio::null(), Stdio::null()),
            stderr,
        );
        let end = Instant::now() + Duration::from_secs(10);
        // The socket file appears at `bind`, a moment before `listen`: wait for a connection
        // to be accepted.
        while UnixStream::connect(sock).is_err() {
            if let Some(s) = p.child.try_wait().unwrap() {
                panic!("serve --listen exited ({s}): {}", p.log());
            }
            assert!(
                Instant::now() < end,
                "no listening socket after 10 s: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        p
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to exit on its own.
    fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < end,
                "fsbroker still running {limit:?} after being told to stop; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Asserts a clean exit (status 0, no panic in the log).
    fn assert_clean_exit(&mut self, limit: Duration) {
        let status = self.wait_exit(limit);
        let log = self.log();
        assert!(!log.contains("panicked"), "fsbroker panicked:\n{log}");
        assert!(status.success(), "fsbroker exited with {status}:\n{log}");
    }

    /// SIGTERM (how `serve --listen` is stopped), then a clean exit.
    fn terminate(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.assert_clean_exit(Duration::from_secs(10));
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills the process `pid` (one this test started) so that a thread blocked on its pipes
/// wakes up: for [`with_deadline`]'s timeout.
fn kill(pid: u32) -> impl FnOnce() {
    move || {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// The temp root `root` (inside the returned dir) and a place for the policy and logs.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let (t, base) = tempdir();
    let root = base.join("root");
    std::fs::create_dir(&root).unwrap();
    let etc = base.join("etc");
    std::fs::create_dir(&etc).unwrap();
    (t, root, etc)
}

// ---------------------------------------------------------------------------------------------
// Request plans
// ---------------------------------------------------------------------------------------------

/// A length between 256 KiB and 8 MiB, small ones more often (so bodies of many sizes are
/// made, and small ones reuse the pages of large ones).
fn large_length(rng: &mut Rng) -> u64 {
    let bits = 18 + rng.below_u64(6); // 256 KiB .. 8 MiB
    let len = (1 << bits) + rng.below_u64(1 << bits);
    len.clamp(PAGES_FROM, MAX_CHUNK)
}

/// An offset for a read of `len` bytes in a file of `size`: anywhere, often odd.
fn offset_for(rng: &mut Rng, size: u64, len: u64) -> u64 {
    let room = size.saturating_sub(len).max(1);
    let pages = (room / 4096).max(1);
    match rng.below_u64(4) {
        // A page boundary plus a little, or minus a little.
        0 => (rng.below_u64(pages) * 4096 + 1 + rng.below_u64(7)).min(room - 1),
        1 => (rng.below_u64(pages) * 4096).saturating_sub(1 + rng.below_u64(5)),
        _ => rng.below_u64(room),
    }
}

/// The edge cases of a file of `size` (at least 9 MiB) read as `path`, then `n` random reads.
fn large_reads(path: &str, data: &Arc<Vec<u8>>, n: usize, seed: u64) -> Vec<Want> {
    let size = data.len() as u64;
    let want = |offset: u64, asked: u64| Want {
        path: path.to_owned(),
        data: Arc::clone(data),
        offset,
        asked,
    };
    let mut v = vec![
        want(0, PAGES_FROM),
        want(1, PAGES_FROM),
        want(4095, PAGES_FROM + 1),
        want(2, MAX_CHUNK),
        want(3 * 4096 + 5, MAX_CHUNK + 7),  // clamped to 8 MiB
        want(size - 300 * KIB - 1, MIB),    // runs past the end
        want(size - PAGES_FROM, MAX_CHUNK), // exactly 256 KiB left: pages, eof
        want(size - PAGES_FROM + 1, MIB),   // one byte less: not pages, eof
        want(size - 1, MIB),
        want(5, PAGES_FROM - 1), // just below the page threshold
    ];
    let mut rng = Rng(seed);
    for _ in 0..n {
        let len = large_length(&mut rng);
        let off = offset_for(&mut rng, size, len);
        // Now and then past the end.
        let len = if rng.below_u64(10) == 0 {
            len + size
        } else {
            len
        };
        v.push(want(off, len));
    }
    // Shuffle, so edge cases sit between the random reads.
    for i in (1..v.len()).rev() {
        let j = rng.below_u64(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Many large reads sent at once, answered into a pipe that a slow, irregular reader drains:
/// bodies are spliced while later answers are built. Every byte of
/// every answer must be the file's.
#[test]
fn pipelined_large_reads_through_a_slowly_read_pipe_carry_exactly_the_file() {
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 1, 24 * MIB + 12_345);
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));
    let checks: Vec<Check> = large_reads("r/big.bin", &data, 60, 7)
        .into_iter()
        .map(Check::Read)
        .collect();
    let stdin = with_deadline(Duration::from_secs(120), kill(p.pid()), move || {
        let mut out = FrameReader::new(stdout, 11);
        exchange(stdin, &mut out, checks)
    });
    drop(stdin);
    p.assert_clean_exit(Duration::from_secs(10));
}

/// The moment that matters, made on purpose: answer X (~1 MiB, in pages) is read up to `gap`
/// bytes before the end of its body and reading stops. Then Y (256 KiB, in pages) is asked
/// for — writing it, the broker checks what the peer has read of X — and then W, as large as
/// X: on a fresh broker (empty pool), the only pages W could reuse are X's, and X's last
/// bytes are still in the pipe. Then reading resumes: X must end with its own bytes. Gaps of
/// one byte up to 300 KiB; a gap of 0 (the body read, not what follows it) and stops inside
/// the JSON after the body must work too.
#[test]
fn a_body_is_not_reused_while_its_last_bytes_are_in_the_pipe() {
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 12, 12 * MIB + 21);
    let policy = policy(&etc, &root);
    // Bytes before the end of X's body (negative: after it, inside the JSON that follows).
    let gaps: [i64; 14] = [
        1, 2, 3, 4, 5, 100, 4095, 4096, 4097, 65_535, 65_537, 300_000, 0, -5,
    ];
    for (round, gap) in gaps.into_iter().enumerate() {
        let r = round as u64;
        let (mut p, stdin, stdout) = Proc::stdio(&policy, &etc.join(format!("stderr.{round}")));
        let data = Arc::clone(&data);
        with_deadline(Duration::from_secs(60), kill(p.pid()), move || {
            let mut stdin = stdin;
            let mut out = FrameReader::new(stdout, 50 + r);
            let want = |offset: u64, asked: u64| Want {
                path: "r/big.bin".into(),
                data: Arc::clone(&data),
                offset,
                asked,
            };
            // A multiple of 3 (no padding, so X's and W's last characters differ), and now
            // and then not.
            let len = if round % 3 == 2 { MIB } else { MIB - 1 };
            let x = want(3 + r * 7 * 4096, len);
            let y = want(5 * MIB + 1 + r, PAGES_FROM);
            let w = want(9 * MIB + 2 + r * 3, len);
            let mut ask = |id: u64, what: &Want| {
                stdin
                    .write_all(&request_line(id, "files/read", what.params()))
                    .unwrap();
                stdin.flush().unwrap();
            };
            ask(1, &x);
            assert!(out.head(), "output closed");
            let start = content_start(out.buffered()).expect("X is a read answer");
            let end = start + 4 * x.length().div_ceil(3) as usize;
            let stop = usize::try_from(end as i64 - gap).unwrap();
            out.read_to(stop);
            ask(2, &y);
            std::thread::sleep(Duration::from_millis(30));
            ask(3, &w);
            // Time for W to be encoded (into whatever pages it got) before X is read on.
            std::thread::sleep(Duration::from_millis(200));
            let mut answers: HashMap<u64, Answer> = HashMap::new();
            for _ in 0..3 {
                let line = out.line();
                let (v, content) = split_frame(&line);
                answers.insert(id_of(&v), (line, v, content));
            }
            let (line, v, content) = answers.remove(&1).expect("X answered");
            assert!(
                line.len() >= stop,
                "X's answer ({} bytes) is shorter than the {stop} bytes read before the stop",
                line.len()
            );
            x.check(&line, &v, content);
            for (id, what) in [(2, &y), (3, &w)] {
                let (line, v, content) = answers.remove(&id).expect("answered");
                what.check(&line, &v, content);
            }
            drop(stdin);
        });
        p.assert_clean_exit(Duration::from_secs(10));
    }
}

/// Reads of two files alternate, at the same offsets and lengths (so a body reused too early
/// would still hold the other file's bytes, with its tags), with small frames — ping, a
/// listing, a utf-8 read, small base64 reads — between the spliced bodies.
#[test]
fn alternating_files_with_small_frames_between_keep_their_own_bytes() {
    let (_t, root, etc) = fixture();
    let a = make_file(&root.join("a.bin"), 2, 10 * MIB + 333);
    let b = make_file(&root.join("b.bin"), 3, 9 * MIB + 4097);
    let text: String = (0..200)
        .map(|i| format!("line {i}: \"quoted\" \\ tab\t é\n"))
        .collect();
    std::fs::write(root.join("notes.txt"), &text).unwrap();
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));

    let mut rng = Rng(21);
    let mut checks = Vec::new();
    let smalls = [
        Check::Ping,
        Check::List(vec!["a.bin", "b.bin", "notes.txt"]),
        Check::Text(text),
    ];
    let min_size = b.len() as u64;
    for i in 0..24 {
        let len = large_length(&mut rng);
        let off = offset_for(&mut rng, min_size, len);
        for (j, (path, data)) in [("r/a.bin", &a), ("r/b.bin", &b)].into_iter().enumerate() {
            checks.push(Check::Read(Want {
                path: path.into(),
                data: Arc::clone(data),
                offset: off,
                asked: len,
            }));
            checks.push(smalls[(2 * i + j) % smalls.len()].clone());
        }
        // A small base64 read (not in pages) of one or the other.
        let (path, data) = if i % 2 == 0 {
            ("r/a.bin", &a)
        } else {
            ("r/b.bin", &b)
        };
        checks.push(Check::Read(Want {
            path: path.into(),
            data: Arc::clone(data),
            offset: rng.below_u64(min_size),
            asked: 1 + rng.below_u64(20_000),
        }));
    }
    let stdin = with_deadline(Duration::from_secs(120), kill(p.pid()), move || {
        let mut out = FrameReader::new(stdout, 23);
        exchange(stdin, &mut out, checks)
    });
    drop(stdin);
    p.assert_clean_exit(Duration::from_secs(10));
}

/// Over `serve --listen` the output is a socket, not a pipe: bodies are copied. Two sessions
/// at once, each with its own slow reader, each getting exactly its file's bytes.
#[test]
fn large_reads_over_the_socket_are_copied_exactly() {
    let (_t, root, etc) = fixture();
    let a = make_file(&root.join("a.bin"), 4, 12 * MIB + 77);
    let b = make_file(&root.join("b.bin"), 5, 10 * MIB + 1);
    let sock = etc.join("broker.sock");
    let mut p = Proc::listen(&policy(&etc, &root), &sock, &etc.join("stderr"));
    let sessions: Vec<_> = [("r/a.bin", a, 31u64), ("r/b.bin", b, 37)]
        .into_iter()
        .map(|(path, data, seed)| {
            let stream = UnixStream::connect(&sock).expect("connect");
            let checks: Vec<Check> = large_reads(path, &data, 16, seed)
                .into_iter()
                .map(Check::Read)
                .collect();
            let pid = p.pid();
            std::thread::spawn(move || {
                with_deadline(Duration::from_secs(120), kill(pid), move || {
                    let input = stream.try_clone().unwrap();
                    let mut out = FrameReader::new(stream, seed);
                    let input = exchange(input, &mut out, checks);
                    input.shutdown(std::net::Shutdown::Both).unwrap();
                })
            })
        })
        .collect();
    for s in sessions {
        if let Err(panic) = s.join() {
            std::panic::resume_unwind(panic);
        }
    }
    p.terminate();
}

/// The file shrinks and grows back (same bytes) over and over while large reads run: a
/// piece of a body may then come up short, ending the body early with its base64 padding.
/// Every answer must still be self-consistent: `length` is what the content holds, and those
/// bytes are the file's at that offset. (Cuts are at page boundaries: a cut inside a page
/// zeroes the rest of that page, which a read racing with it could see; that would be the
/// kernel's doing, not the broker's.)
#[test]
fn a_file_that_shrinks_under_large_reads_gives_consistent_chunks() {
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_t, root, etc) = fixture();
    let path = root.join("big.bin");
    let data = make_file(&path, 13, 12 * MIB + 4321);
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));
    let stop = Arc::new(AtomicBool::new(false));
    let changer = {
        let stop = Arc::clone(&stop);
        let data = Arc::clone(&data);
        std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let mut rng = Rng(77);
            let mut cuts = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let cut = rng.below_u64(data.len() as u64 / 4096) * 4096;
                f.set_len(cut).unwrap();
                std::thread::sleep(Duration::from_micros(rng.below_u64(1500)));
                f.write_all_at(&data[cut as usize..], cut).unwrap();
                std::thread::sleep(Duration::from_micros(2000 + rng.below_u64(20_000)));
                cuts += 1;
            }
            cuts
        })
    };
    let mut rng = Rng(78);
    let size = data.len() as u64;
    let mut lines = Vec::new();
    let mut wants = HashMap::new();
    for i in 0..30u64 {
        let len = large_length(&mut rng);
        let offset = offset_for(&mut rng, size, len);
        let w = Want {
            path: "r/big.bin".into(),
            data: Arc::clone(&data),
            offset,
            asked: len,
        };
        lines.extend(request_line(i, "files/read", w.params()));
        wants.insert(i, w);
    }
    // Stops the changer however this test ends.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stopper = StopOnDrop(Arc::clone(&stop));
    let pid = p.pid();
    let (short, stdin) = with_deadline(Duration::from_secs(120), kill(pid), move || {
        let mut stdin = stdin;
        stdin.write_all(&lines).unwrap();
        stdin.flush().unwrap();
        let mut out = FrameReader::new(stdout, 79);
        let mut short = 0;
        while !wants.is_empty() {
            let line = out.next_line(&mut |_| None).expect("output closed");
            let (v, content) = split_frame(&line);
            let w = wants.remove(&id_of(&v)).expect("a pending id");
            assert!(v.get("error").is_none(), "{v}");
            let r = &v["result"];
            let len = r["length"].as_u64().expect("length");
            let reported = r["size"].as_u64().expect("size");
            assert!(len <= w.length(), "longer than asked: {r}");
            assert!(reported <= size, "{r}");
            assert_eq!(r["offset"], w.offset, "{r}");
            assert_eq!(r["eof"], w.offset + len >= reported, "{r}");
            let b64: &[u8] = match content {
                Some(range) => &line[range],
                None => r["content"].as_str().expect("content").as_bytes(),
            };
            assert_eq!(b64.len() as u64, 4 * len.div_ceil(3), "{r}");
            let got = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_else(|e| panic!("bad base64 ({e})"));
            let want = &data[w.offset as usize..(w.offset + len) as usize];
            if got != want {
                panic!(
                    "read at {} for {}: {}",
                    w.offset,
                    w.asked,
                    first_difference(&got, want, w.offset)
                );
            }
            // Shorter than the size measured at open allowed: the file ended mid-body.
            if len
                < w.asked
                    .min(MAX_CHUNK)
                    .min(reported.saturating_sub(w.offset))
            {
                short += 1;
            }
        }
        (short, stdin)
    });
    drop(stopper);
    let cuts = changer.join().expect("changer thread");
    println!("{short} of 30 answers ended early (the file shrank mid-read); {cuts} cuts");
    drop(stdin);
    p.assert_clean_exit(Duration::from_secs(10));
}

/// The peer closes its end of the output pipe while the broker is splicing a large body into
/// it (with more queued behind): the session ends quietly; once its input closes too, the
/// broker exits cleanly, without a panic, within seconds.
#[test]
fn a_pipe_reader_that_leaves_mid_body_ends_the_session_cleanly() {
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 6, 24 * MIB + 5);
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));
    let pid = p.pid();
    with_deadline(Duration::from_secs(60), kill(pid), move || {
        let mut stdin = stdin;
        let mut out = BufReader::with_capacity(64 << 10, stdout);
        // A first answer read whole, so the broker is known to be answering.
        let first = Want {
            path: "r/big.bin".into(),
            data: Arc::clone(&data),
            offset: 1,
            asked: MIB,
        };
        stdin
            .write_all(&request_line(1, "files/read", first.params()))
            .unwrap();
        let mut line = Vec::new();
        out.read_until(b'\n', &mut line).unwrap();
        let (v, content) = split_frame(&line);
        first.check(&line, &v, content);
        // Then six 8-MiB reads (11 MiB of base64 each), and only part of the first.
        for i in 0..6u64 {
            let w = Want {
                path: "r/big.bin".into(),
                data: Arc::clone(&data),
                offset: i * 3 * MIB + i,
                asked: MAX_CHUNK,
            };
            stdin
                .write_all(&request_line(10 + i, "files/read", w.params()))
                .unwrap();
        }
        stdin.flush().unwrap();
        let mut part = vec![0u8; 300 << 10];
        out.read_exact(&mut part).unwrap();
        assert!(
            part.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":1"),
            "{:?}",
            String::from_utf8_lossy(&part[..100])
        );
        // The broker is now blocked splicing into a full pipe. Leave.
        drop(out);
        std::thread::sleep(Duration::from_millis(200));
        // Its input still works (or is closed, if it already ended the session): more
        // requests, large and small, must not make it crash.
        for i in 0..4u64 {
            let line = if i % 2 == 0 {
                request_line(
                    100 + i,
                    "files/read",
                    json!({"path": "r/big.bin", "offset": i, "length": MAX_CHUNK,
                           "encoding": "base64"}),
                )
            } else {
                request_line(100 + i, "ping", json!({}))
            };
            if stdin.write_all(&line).is_err() {
                break;
            }
        }
        drop(stdin);
    });
    p.assert_clean_exit(Duration::from_secs(10));
}

/// Over the socket, one session leaves in the middle of a large answer (more queued) while
/// another reads large answers: the other gets every byte right, and new sessions still work.
#[test]
fn a_socket_peer_that_leaves_mid_response_does_not_disturb_another_session() {
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 8, 20 * MIB + 999);
    let sock = etc.join("broker.sock");
    let mut p = Proc::listen(&policy(&etc, &root), &sock, &etc.join("stderr"));
    let pid = p.pid();
    let sock2 = sock.clone();
    with_deadline(Duration::from_secs(120), kill(pid), move || {
        // The one that leaves.
        let mut leaver = UnixStream::connect(&sock2).unwrap();
        for i in 0..6u64 {
            leaver
                .write_all(&request_line(
                    i + 1,
                    "files/read",
                    json!({"path": "r/big.bin", "offset": i * MIB + 3, "length": MAX_CHUNK,
                           "encoding": "base64"}),
                ))
                .unwrap();
        }
        // The one that stays, started before the other leaves.
        let stayer = UnixStream::connect(&sock2).unwrap();
        let checks: Vec<Check> = large_reads("r/big.bin", &data, 12, 41)
            .into_iter()
            .map(Check::Read)
            .collect();
        let staying = std::thread::spawn(move || {
            let input = stayer.try_clone().unwrap();
            let mut out = FrameReader::new(stayer, 43);
            exchange(input, &mut out, checks)
        });
        let mut part = vec![0u8; 200 << 10];
        leaver.read_exact(&mut part).unwrap();
        assert!(part.starts_with(b"{\"jsonrpc\":\"2.0\",\"id\":"));
        drop(leaver);
        let stayer = match staying.join() {
            Ok(s) => s,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        drop(stayer);
        // A new session after all that.
        let mut s = UnixStream::connect(&sock2).unwrap();
        s.write_all(&request_line(1, "ping", json!({}))).unwrap();
        let mut line = Vec::new();
        BufReader::new(&mut s).read_until(b'\n', &mut line).unwrap();
        let (v, _) = split_frame(&line);
        assert_eq!(v["result"], json!({}), "{v}");
    });
    p.terminate();
}

/// A 256-MiB file streamed in 8-MiB chunks, eight requests in flight, read promptly: the
/// broker's peak resident memory stays bounded (pages are reused or let go, and the output
/// budget holds back answers built ahead of the writer). Every answer's fields and length are
/// checked, and its content at spots spread over it.
#[test]
fn streaming_a_large_file_keeps_broker_memory_bounded() {
    const SIZE: u64 = 256 * MIB;
    const SEED: u64 = 9;
    const IN_FLIGHT: u64 = 8;
    let (_t, root, etc) = fixture();
    write_file(&root.join("huge.bin"), SEED, SIZE);
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));
    let pid = p.pid();
    let hwm = with_deadline(Duration::from_secs(120), kill(pid), move || {
        let mut stdin = stdin;
        let mut out = BufReader::with_capacity(1 << 20, stdout);
        let chunks = SIZE / MAX_CHUNK;
        let send = |stdin: &mut ChildStdin, i: u64| {
            let params = json!({"path": "r/huge.bin", "offset": i * MAX_CHUNK,
                                "length": MAX_CHUNK, "encoding": "base64"});
            stdin
                .write_all(&request_line(i, "files/read", params))
                .unwrap();
            stdin.flush().unwrap();
        };
        let mut sent = 0;
        while sent < IN_FLIGHT.min(chunks) {
            send(&mut stdin, sent);
            sent += 1;
        }
        let mut seen = vec![false; chunks as usize];
        let mut line = Vec::new();
        let mut rng = Rng(99);
        for _ in 0..chunks {
            line.clear();
            let n = out.read_until(b'\n', &mut line).unwrap();
            assert!(n > 0, "output closed");
            let (v, content) = split_frame(&line);
            let i = id_of(&v);
            assert!(
                !std::mem::replace(&mut seen[i as usize], true),
                "id {i} twice"
            );
            let r = &v["result"];
            let offset = i * MAX_CHUNK;
            assert_eq!(r["offset"], offset, "{v}");
            assert_eq!(r["length"], MAX_CHUNK, "{v}");
            assert_eq!(r["size"], SIZE, "{v}");
            assert_eq!(r["eof"], i == chunks - 1, "{v}");
            let b64 = &line[content.expect("a large frame")];
            assert_eq!(b64.len() as u64, MAX_CHUNK / 3 * 4 + 4, "chunk {i}");
            // Spots: the start, the end, and a dozen 4-KiB-ish windows (at 4-character
            // boundaries of the base64, i.e. 3-byte boundaries of the file).
            let mut spots = vec![0u64, b64.len() as u64 / 4 - 1024];
            for _ in 0..12 {
                spots.push(rng.below_u64(b64.len() as u64 / 4 - 1024));
            }
            for q in spots {
                let window = &b64[(q * 4) as usize..(q * 4 + 4096) as usize];
                let got = base64::engine::general_purpose::STANDARD
                    .decode(window)
                    .unwrap_or_else(|e| panic!("chunk {i}: bad base64 at {q} ({e})"));
                let at = offset + q * 3;
                let want = bytes_at(SEED, at, got.len() as u64);
                if got != want {
                    panic!("chunk {i}: {}", first_difference(&got, &want, at));
                }
            }
            if sent < chunks {
                send(&mut stdin, sent);
                sent += 1;
            }
        }
        let hwm = proc_status_kib(pid, "VmHWM");
        drop(stdin);
        hwm
    });
    println!("broker VmHWM after streaming 256 MiB in 8-MiB chunks: {hwm} KiB");
    p.assert_clean_exit(Duration::from_secs(10));
    assert!(
        hwm < 128 * 1024,
        "broker peak resident memory {hwm} KiB (bound 128 MiB, target 64 MiB)"
    );
}

/// How a peer passes the broker's output on without copying it.
#[derive(Clone, Copy, Debug)]
enum Onward {
    /// `splice` from the broker's pipe into another pipe (as `pv` does, or a relay into a
    /// socket): the page references move, the broker's pipe reports the bytes read.
    Splice,
    /// `tee` into another pipe, then an ordinary read: the other pipe keeps references to
    /// pages the broker's pipe reports read.
    Tee,
    /// `std::io::copy` from the broker's stdout into a pipe: on Linux it uses `splice`.
    StdCopy,
}

/// Answer A (384 KiB of the file, 512 KiB of base64: it fits a 1-MiB pipe) is passed into a
/// pipe of the test's own (`how`) and left there; B and C are asked for and read normally,
/// one at a time. Writing B, the broker sees A's bytes gone from its pipe and lets A's pages
/// go back to its pool; C is encoded into them. Then A is read from the other pipe: it must
/// still be A.
fn passed_on_answer_keeps_its_bytes(how: Onward) {
    use rustix::pipe::{SpliceFlags, fcntl_setpipe_size, pipe, splice, tee};
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 10, 12 * MIB);
    let (mut p, stdin, stdout) = Proc::stdio(&policy(&etc, &root), &etc.join("stderr"));
    let pid = p.pid();
    with_deadline(Duration::from_secs(60), kill(pid), move || {
        let (mut stdin, mut stdout) = (stdin, stdout);
        let read = |offset: u64| Want {
            path: "r/big.bin".into(),
            data: Arc::clone(&data),
            offset,
            asked: 384 * KIB,
        };
        let mut ask = |id: u64, w: &Want| {
            stdin
                .write_all(&request_line(id, "files/read", w.params()))
                .unwrap();
            stdin.flush().unwrap();
        };
        // Each answer is asked for after the previous one is read, so a read of the raw pipe
        // (no read-ahead) never takes bytes of the next.
        fn read_line(fd: impl AsFd) -> Vec<u8> {
            let mut line = Vec::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = rustix::io::read(&fd, &mut buf).unwrap();
                assert!(n > 0, "output closed");
                line.extend_from_slice(&buf[..n]);
                if line.ends_with(b"\n") {
                    return line;
                }
            }
        }
        let check = |line: &[u8], w: &Want| {
            let (v, content) = split_frame(line);
            w.check(line, &v, content);
        };
        // A first answer, read normally, gives the length of an answer of this size: ids and
        // offsets of the same width, same file, same length. Offsets one past a page
        // boundary, so a wrong page's tag says which answer it belongs to.
        let w0 = read(1_024_001);
        ask(1, &w0);
        let first = read_line(&stdout);
        check(&first, &w0);
        let frame_len = first.len();
        let (held_r, held_w) = pipe().unwrap();
        fcntl_setpipe_size(&held_w, 1 << 20).unwrap();
        let wa = read(2_048_001);
        ask(2, &wa);
        match how {
            Onward::Splice => {
                let mut moved = 0;
                while moved < frame_len {
                    let n = splice(
                        stdout.as_fd(),
                        None,
                        held_w.as_fd(),
                        None,
                        frame_len - moved,
                        SpliceFlags::empty(),
                    )
                    .unwrap();
                    assert!(n > 0, "output closed");
                    moved += n;
                }
            }
            Onward::StdCopy => {
                let mut to = std::fs::File::from(held_w.try_clone().unwrap());
                let n = std::io::copy(&mut (&mut stdout).take(frame_len as u64), &mut to).unwrap();
                assert_eq!(n, frame_len as u64);
            }
            Onward::Tee => {
                // The whole answer in the broker's pipe first, then one `tee` of all of it.
                let end = Instant::now() + Duration::from_secs(10);
                while (rustix::io::ioctl_fionread(&stdout).unwrap() as usize) < frame_len {
                    assert!(Instant::now() < end, "answer A not in the pipe");
                    std::thread::sleep(Duration::from_millis(5));
                }
                let n = tee(
                    stdout.as_fd(),
                    held_w.as_fd(),
                    frame_len,
                    SpliceFlags::empty(),
                )
                .unwrap();
                assert_eq!(n, frame_len);
                check(&read_line(&stdout), &wa);
            }
        }
        let wb = read(5_120_001);
        ask(3, &wb);
        check(&read_line(&stdout), &wb);
        let wc = read(8_192_001);
        ask(4, &wc);
        check(&read_line(&stdout), &wc);
        // Now A, from the other pipe.
        let mut a = vec![0u8; frame_len];
        let mut got = 0;
        while got < frame_len {
            let n = rustix::io::read(&held_r, &mut a[got..]).unwrap();
            assert!(n > 0);
            got += n;
        }
        check(&a, &wa);
        drop(stdin);
    });
    p.assert_clean_exit(Duration::from_secs(10));
}

/// A peer that moves the broker's output onward with `splice` (as `pv` does, or any relay
/// into another pipe or a socket) must still pass on the bytes it was sent.
#[test]
fn a_peer_that_splices_the_output_onward_passes_on_the_bytes_it_was_sent() {
    passed_on_answer_keeps_its_bytes(Onward::Splice);
}

/// A peer written the ordinary way — `std::io::copy` from the broker's stdout into a pipe
/// (to another process, say) — must pass on the bytes it was sent.
#[test]
fn a_peer_that_copies_the_output_with_std_io_copy_passes_on_the_bytes_it_was_sent() {
    passed_on_answer_keeps_its_bytes(Onward::StdCopy);
}

/// A peer that `tee`s the broker's output into another pipe (a tap) and reads it: the tap
/// must see the bytes that were sent.
#[test]
fn a_peer_that_tees_the_output_passes_on_the_bytes_it_was_sent() {
    passed_on_answer_keeps_its_bytes(Onward::Tee);
}

/// A stdout pipe left non-blocking (a parent that shares its open file set `O_NONBLOCK`):
/// when it fills, writes fail with `EAGAIN`, and the broker must wait for room, not give up
/// its output and leave the session unanswered. Small frames and spliced bodies both.
#[test]
fn a_non_blocking_stdout_pipe_still_gets_every_answer() {
    let (_t, root, etc) = fixture();
    let data = make_file(&root.join("big.bin"), 21, 3 * MIB);
    let (read_end, write_end) =
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::NONBLOCK).expect("pipe2");
    // Our end blocks; the broker's end (its own open file) stays non-blocking.
    rustix::fs::fcntl_setfl(&read_end, rustix::fs::OFlags::empty()).unwrap();
    let mut p = Proc::start(
        &[
            "serve".as_ref(),
            "--policy".as_ref(),
            policy(&etc, &root).as_os_str(),
        ],
        (Stdio::piped(), Stdio::from(write_end)),
        &etc.join("stderr"),
    );
    let mut stdin = p.child.stdin.take().unwrap();
    let mut out = BufReader::new(std::fs::File::from(read_end));
    let pid = p.pid();
    with_deadline(Duration::from_secs(60), kill(pid), move || {
        // Enough answers to fill the pipe many times over while nothing reads it.
        let mut expected = HashMap::new();
        for id in 0..400u64 {
            let line = if id % 40 == 7 {
                let offset = (id * 4099) % (2 * MIB);
                expected.insert(id, Some(offset));
                format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"files/read","params":{{"path":"r/big.bin","encoding":"base64","offset":{offset},"length":{MIB}}}}}"#
                )
            } else {
                expected.insert(id, None);
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#)
            };
            stdin.write_all(line.as_bytes()).unwrap();
            stdin.write_all(b"\n").unwrap();
        }
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut line = String::new();
        while !expected.is_empty() {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "output ended early");
            let m: Value = serde_json::from_str(&line).unwrap();
            let id = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
            match expected
                .remove(&id)
                .unwrap_or_else(|| panic!("unknown or repeated id {id}"))
            {
                None => assert_eq!(m["result"], json!({}), "{m}"),
                Some(offset) => {
                    let got = base64::engine::general_purpose::STANDARD
                        .decode(m["result"]["content"].as_str().expect("content"))
                        .unwrap();
                    let offset = offset as usize;
                    assert!(
                        got == data[offset..offset + MIB as usize],
                        "id {id}: wrong bytes"
                    );
                }
            }
        }
        drop(stdin);
    });
    p.assert_clean_exit(Duration::from_secs(10));
}

//! The console's API spoken by hand: a few lines of plain HTTP/1.1 on a loopback TCP
//! connection, and the answers read back (`Content-Length` or chunked).
//!
//! This is a measuring client, so it is written out rather than taken from an HTTP library:
//! every request is one `write` of its whole text, the time an event arrived is taken on the
//! thread that reads it, right after the read returns, and nothing stands between the socket
//! and the clock (no pool, no runtime). It speaks only what the console answers: HTTP/1.1,
//! `Connection: close` for single requests, the SSE stream of `/api/events` chunked.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::bench::wire;

/// How long one answer may take before the bench gives up on it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A console's address and token, from its URL.
pub(super) struct Api {
    addr: SocketAddr,
    /// `127.0.0.1:PORT`: the `Host` the console answers to.
    host: String,
    token: String,
}

/// An answer: its status and body.
pub(super) struct Answer {
    pub(super) status: u16,
    pub(super) body: Vec<u8>,
}

impl Answer {
    /// The body as JSON, for a 200 answer.
    pub(super) fn json(&self, what: &str) -> Result<serde_json::Value, String> {
        if self.status != 200 {
            return Err(format!("{what}: HTTP {} {}", self.status, self.text()));
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("{what}: not JSON ({e}): {}", self.text()))
    }

    /// That the answer is `204 No Content`, as every act of the person's is.
    pub(super) fn no_content(&self, what: &str) -> Result<(), String> {
        if self.status == 204 {
            Ok(())
        } else {
            Err(format!("{what}: HTTP {} {}", self.status, self.text()))
        }
    }

    fn text(&self) -> String {
        wire::preview(&self.body)
    }
}

impl Api {
    /// From the URL file: `http://127.0.0.1:PORT/?ticket=…` and, on the next line,
    /// `token=TOKEN` (what scripts authenticate with).
    pub(super) fn from_url(text: &str) -> Result<Api, String> {
        let bad = |why: &str| format!("the console's URL file {text:?}: {why}");
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("").trim();
        let url = url::Url::parse(first).map_err(|e| bad(&e.to_string()))?;
        let host = url.host_str().ok_or_else(|| bad("no host"))?;
        let port = url.port().ok_or_else(|| bad("no port"))?;
        let token = lines
            .find_map(|l| l.trim().strip_prefix("token="))
            .map(str::to_owned)
            .ok_or_else(|| bad("no token"))?;
        let addr = (host, port)
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("names no address"))?;
        Ok(Api {
            addr,
            host: format!("{host}:{port}"),
            token,
        })
    }

    /// Sends `METHOD PATH` (with a JSON `body` for a POST) on a new connection, and returns
    /// the connection to read the answer from ([`read_answer`]): the caller can do other
    /// things meanwhile, such as waiting for what the request sets off.
    pub(super) fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<TcpStream, String> {
        let fail = |e: io::Error| format!("{method} {path} on the console: {e}");
        let mut stream = TcpStream::connect(self.addr).map_err(fail)?;
        stream.set_nodelay(true).map_err(fail)?;
        stream
            .set_read_timeout(Some(ANSWER_TIMEOUT))
            .map_err(fail)?;
        let body = body.unwrap_or("");
        let content = if method == "GET" {
            String::new()
        } else {
            format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            )
        };
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n{content}Connection: close\r\n\r\n{body}",
            self.host, self.token
        );
        stream.write_all(request.as_bytes()).map_err(fail)?;
        Ok(stream)
    }

    /// `METHOD PATH` and its whole answer.
    pub(super) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<Answer, String> {
        let stream = self.send(method, path, body)?;
        read_answer(stream).map_err(|e| format!("{method} {path} on the console: {e}"))
    }

    /// Opens `GET /api/events` and reads its header before returning, so the stream is live
    /// when this returns; a thread then reads the events as they come ([`Events`]).
    pub(super) fn events(&self) -> Result<Events, String> {
        let fail = |e: String| format!("GET /api/events on the console: {e}");
        let mut stream = TcpStream::connect(self.addr).map_err(|e| fail(e.to_string()))?;
        stream.set_nodelay(true).map_err(|e| fail(e.to_string()))?;
        let request = format!(
            "GET /api/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
            self.host, self.token
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
        stream
            .set_read_timeout(Some(ANSWER_TIMEOUT))
            .map_err(|e| fail(e.to_string()))?;
        let mut reader = Reader::new(stream.try_clone().map_err(|e| fail(e.to_string()))?);
        let head = reader.head().map_err(|e| fail(e.to_string()))?;
        if head.status != 200 {
            return Err(fail(format!("HTTP {}", head.status)));
        }
        // From here the stream is quiet for as long as nothing happens.
        stream
            .set_read_timeout(None)
            .map_err(|e| fail(e.to_string()))?;
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("bench-console-events".into())
            .spawn(move || read_events(reader, head.chunked, &tx))
            .map_err(|e| fail(format!("cannot start its reader: {e}")))?;
        Ok(Events {
            stream,
            rx,
            thread: Some(thread),
        })
    }
}

/// Reads a whole answer (the console closes the connection after it: `Connection: close`).
pub(super) fn read_answer(stream: TcpStream) -> io::Result<Answer> {
    let mut reader = Reader::new(stream);
    let head = reader.head()?;
    let body = if head.chunked {
        let mut body = Vec::new();
        while let Some(chunk) = reader.chunk()? {
            body.extend_from_slice(&chunk);
        }
        body
    } else if let Some(len) = head.length {
        reader.exact(len)?
    } else {
        reader.rest()?
    };
    Ok(Answer {
        status: head.status,
        body,
    })
}

/// One server-sent event, and when the bench read it.
#[derive(Debug)]
pub(super) struct Sse {
    /// `event:` (`message` when none was given).
    pub(super) kind: String,
    /// `data:`, lines joined with `\n`.
    pub(super) data: String,
    /// When its last line was read.
    pub(super) at: Instant,
}

/// An open `/api/events`: the events its thread read, in order, each timestamped.
pub(super) struct Events {
    /// The connection, kept to end the reading thread ([`Events::close`]).
    stream: TcpStream,
    rx: mpsc::Receiver<Sse>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Events {
    /// The next event, or `None` if none came by `deadline`; an error once the stream has
    /// ended (the console closed it, or the broker is gone).
    pub(super) fn next_until(&self, deadline: Instant) -> Result<Option<Sse>, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(event) => Ok(Some(event)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err("the console's /api/events stream ended".into())
            }
        }
    }

    /// The events already read, without waiting.
    pub(super) fn drain(&self) -> Vec<Sse> {
        self.rx.try_iter().collect()
    }

    /// Closes the stream, ends the reading thread; returns why the stream ended early, if
    /// it did.
    pub(super) fn close(mut self) -> Result<(), String> {
        self.end()
    }

    fn end(&mut self) -> Result<(), String> {
        let _ = self.stream.shutdown(Shutdown::Both);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err("the events reader panicked".into()),
            None => Ok(()),
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

/// The events thread: parses the stream (`event:`, `data:`, a blank line ends an event; `:`
/// lines are keep-alives) and sends each event on, timestamped, until the stream ends or the
/// receiver is gone. A stream cut by [`Events::close`] is a normal end.
fn read_events(mut reader: Reader, chunked: bool, tx: &mpsc::Sender<Sse>) -> Result<(), String> {
    let mut text: Vec<u8> = Vec::new();
    let mut kind = String::new();
    let mut data: Option<String> = None;
    loop {
        let got = if chunked {
            reader.chunk()
        } else {
            reader.some().map(Some)
        };
        let bytes = match got {
            Ok(Some(b)) if !b.is_empty() => b,
            // The end of the stream, or the connection shut by `close`.
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("reading /api/events: {e}")),
        };
        let at = Instant::now();
        text.extend_from_slice(&bytes);
        let mut start = 0;
        while let Some(k) = memchr::memchr(b'\n', &text[start..]) {
            let line = &text[start..start + k];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            start += k + 1;
            let line = String::from_utf8_lossy(line);
            if line.is_empty() {
                if let Some(d) = data.take() {
                    let event = Sse {
                        kind: if kind.is_empty() {
                            "message".into()
                        } else {
                            std::mem::take(&mut kind)
                        },
                        data: d,
                        at,
                    };
                    if tx.send(event).is_err() {
                        return Ok(());
                    }
                }
                kind.clear();
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (&*line, ""),
            };
            match field {
                "event" => kind = value.to_owned(),
                "data" => match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(value);
                    }
                    None => data = Some(value.to_owned()),
                },
                // A comment (keep-alive), `id`, `retry`: nothing the bench needs.
                _ => {}
            }
        }
        text.drain(..start);
    }
}

/// An answer's status line and the headers the bench needs.
struct Head {
    status: u16,
    chunked: bool,
    length: Option<usize>,
}

/// Reads an HTTP/1.1 answer from a stream, through a buffer of its own.
struct Reader {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Start of the bytes not yet used.
    at: usize,
}

impl Reader {
    fn new(stream: TcpStream) -> Reader {
        Reader {
            stream,
            buf: Vec::with_capacity(16 << 10),
            at: 0,
        }
    }

    /// Reads more; `false` at the end of the stream.
    fn fill(&mut self) -> io::Result<bool> {
        // What was used goes, so a long stream does not grow the buffer.
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let mut more = [0u8; 16 << 10];
        loop {
            match self.stream.read(&mut more) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&more[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn eof() -> io::Error {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the console closed the connection",
        )
    }

    /// The next line (without `\r\n`).
    fn line(&mut self) -> io::Result<String> {
        loop {
            if let Some(k) = memchr::memchr(b'\n', &self.buf[self.at..]) {
                let line = &self.buf[self.at..self.at + k];
                let line =
                    String::from_utf8_lossy(line.strip_suffix(b"\r").unwrap_or(line)).into_owned();
                self.at += k + 1;
                return Ok(line);
            }
            if !self.fill()? {
                return Err(Self::eof());
            }
        }
    }

    /// The status line and headers.
    fn head(&mut self) -> io::Result<Head> {
        let status_line = self.line()?;
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("not an HTTP answer: {status_line:?}"),
                )
            })?;
        let mut head = Head {
            status,
            chunked: false,
            length: None,
        };
        loop {
            let line = self.line()?;
            if line.is_empty() {
                return Ok(head);
            }
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("transfer-encoding") {
                head.chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("content-length") {
                head.length = value.parse().ok();
            }
        }
    }

    /// `len` bytes of body.
    fn exact(&mut self, len: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() - self.at < len {
            if !self.fill()? {
                return Err(Self::eof());
            }
        }
        let out = self.buf[self.at..self.at + len].to_vec();
        self.at += len;
        Ok(out)
    }

    /// Everything to the end of the stream.
    fn rest(&mut self) -> io::Result<Vec<u8>> {
        while self.fill()? {}
        let out = self.buf[self.at..].to_vec();
        self.at = self.buf.len();
        Ok(out)
    }

    /// Whatever body bytes come next (at least one, or none at the end).
    fn some(&mut self) -> io::Result<Vec<u8>> {
        if self.at == self.buf.len() && !self.fill()? {
            return Ok(Vec::new());
        }
        let out = self.buf[self.at..].to_vec();
        self.at = self.buf.len();
        Ok(out)
    }

    /// The next chunk of a chunked body, or `None` after the last.
    fn chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let size_line = self.line()?;
        let size = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a bad chunk size {size_line:?}"),
            )
        })?;
        if size == 0 {
            // Trailers, up to the blank line.
            while !self.line()?.is_empty() {}
            return Ok(None);
        }
        let data = self.exact(size)?;
        if !self.line()?.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a chunk not followed by CRLF",
            ));
        }
        Ok(Some(data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that writes `answer` to the first connection and closes it.
    fn serve_once(answer: &'static [u8]) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = s.read(&mut request);
            s.write_all(answer).unwrap();
        });
        addr
    }

    fn api(addr: SocketAddr) -> Api {
        Api::from_url(&format!("http://{addr}/?ticket=t\ntoken=abc\n")).unwrap()
    }

    #[test]
    fn answers_with_length_chunked_or_neither() {
        let a = api(serve_once(
            b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n{\"a\":1}",
        ));
        assert_eq!(a.token, "abc");
        let got = a.call("GET", "/api/state", None).unwrap();
        assert_eq!(got.json("state").unwrap()["a"], 1);
        let a = api(serve_once(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4;x=y\r\n\":2}\r\n0\r\n\r\n",
        ));
        let got = a.call("GET", "/api/state", None).unwrap();
        assert_eq!(got.json("state").unwrap()["a"], 2);
        let a = api(serve_once(b"HTTP/1.1 204 No Content\r\n\r\n"));
        let got = a.call("POST", "/api/roots/x/pause", None).unwrap();
        assert!(got.no_content("pause").is_ok());
        assert!(got.json("pause").is_err());
    }

    #[test]
    fn events_are_split_across_chunks_and_timestamped() {
        let a = api(serve_once(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
              12\r\nevent: state\ndata:\r\n\
              5\r\n {}\n\n\r\n\
              e\r\n: keep-alive\n\n\r\n\
              27\r\nevent: activity\ndata: {\"a\":1}\ndata: x\n\n\r\n\
              0\r\n\r\n",
        ));
        let events = a.events().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let first = events.next_until(deadline).unwrap().unwrap();
        assert_eq!((first.kind.as_str(), first.data.as_str()), ("state", "{}"));
        let second = events.next_until(deadline).unwrap().unwrap();
        assert_eq!(second.kind, "activity");
        assert_eq!(second.data, "{\"a\":1}\nx");
        assert!(second.at >= first.at);
        // The stream ended with its last chunk.
        assert!(events.next_until(deadline).is_err());
        events.close().unwrap();
    }
}

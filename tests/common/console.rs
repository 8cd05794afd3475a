//! The person's console as a test reaches it: the URL file a broker wrote, and plain HTTP/1.1
//! over a loopback TCP connection, written by hand so a test can send exactly the hostile
//! headers it wants (a rebound `Host`, a foreign `Origin`, no token).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running console: where it is and its token.
#[derive(Clone, Debug)]
pub struct Console {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The run's token (scripts' `Authorization: Bearer`).
    pub token: String,
    /// The URL file, whose first line is the page's URL with its one-time ticket.
    pub url_file: std::path::PathBuf,
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        super::header(&self.headers, name)
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

impl Console {
    /// Reads the URL file a broker wrote (waiting up to 15 s for it): the page's URL with its
    /// one-time ticket, then `token=TOKEN`.
    pub fn from_url_file(path: &Path) -> Console {
        let end = Instant::now() + Duration::from_secs(15);
        let (url, token) = loop {
            if let Ok(text) = std::fs::read_to_string(path) {
                let mut lines = text.lines();
                if let (Some(url), Some(token)) = (lines.next(), lines.next()) {
                    if let Some(token) = token.strip_prefix("token=") {
                        break (url.to_owned(), token.to_owned());
                    }
                }
            }
            assert!(Instant::now() < end, "no console URL at {}", path.display());
            std::thread::sleep(Duration::from_millis(20));
        };
        let rest = url.strip_prefix("http://").expect("an http URL");
        let (host, _) = rest.split_once("/?ticket=").expect("a ticket in the URL");
        Console {
            host: host.to_owned(),
            token,
            url_file: path.to_owned(),
        }
    }

    /// The page's URL as the URL file has it now (each ticket works once).
    pub fn page_url(&self) -> String {
        let text = std::fs::read_to_string(&self.url_file).expect("the URL file");
        text.lines().next().expect("a URL line").to_owned()
    }

    /// Opens the page as a browser would: spends the ticket, and takes the page session's
    /// key from the page the console answers with (its `<meta name="fsbroker-key">`).
    pub fn open_page(&self) -> String {
        let url = self.page_url();
        let path = &url[url.find("/?ticket=").expect("a ticket")..];
        let page = self.request("GET", path, &[], None);
        assert_eq!(page.status, 200, "{page:?}");
        let at = page
            .body
            .find("<meta name=\"fsbroker-key\" content=\"")
            .unwrap_or_else(|| panic!("no key in the page: {}", page.body));
        let rest = &page.body[at + "<meta name=\"fsbroker-key\" content=\"".len()..];
        let key = rest[..rest.find('"').expect("the attribute's end")].to_owned();
        assert!(
            key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
            "{key}"
        );
        key
    }

    /// `GET` with the token as `Authorization: Bearer`.
    pub fn get(&self, path: &str) -> Reply {
        let auth = format!("Bearer {}", self.token);
        self.request("GET", path, &[("Authorization", &auth)], None)
    }

    /// `POST` with the token as `Authorization: Bearer` and a JSON body (or none).
    pub fn post(&self, path: &str, body: Option<&str>) -> Reply {
        let auth = format!("Bearer {}", self.token);
        self.request("POST", path, &[("Authorization", &auth)], body)
    }

    /// `GET /api/state`, checked to be 200.
    pub fn state(&self) -> Value {
        let r = self.get("/api/state");
        assert_eq!(r.status, 200, "{r:?}");
        r.json()
    }

    /// Waits (at most `limit`) until `/api/state` satisfies `want`; returns that state.
    pub fn wait_state(&self, limit: Duration, want: impl Fn(&Value) -> bool) -> Value {
        let end = Instant::now() + limit;
        loop {
            let s = self.state();
            if want(&s) {
                return s;
            }
            assert!(
                Instant::now() < end,
                "the console's state never got there: {s:#}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Any request: `Host` is the console's unless `headers` names one.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Reply {
        let mut stream = TcpStream::connect(&self.host).expect("connect to the console");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
            head += &format!("Host: {}\r\n", self.host);
        }
        for (n, v) in headers {
            head += &format!("{n}: {v}\r\n");
        }
        let body = body.unwrap_or("");
        if !body.is_empty() || method == "POST" {
            head += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            );
        }
        head += "Connection: close\r\n\r\n";
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).expect("read the answer");
        parse(&raw)
    }

    /// Opens `GET /api/events` (Server-Sent Events) with the token.
    pub fn events(&self) -> Events {
        let mut stream = TcpStream::connect(&self.host).expect("connect to the console");
        let head = format!(
            "GET /api/events HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
            self.host, self.token
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        read_line_patiently(&mut reader, &mut status, Duration::from_secs(10));
        assert!(status.contains(" 200 "), "events: {status}");
        let mut chunked = false;
        loop {
            let mut line = String::new();
            read_line_patiently(&mut reader, &mut line, Duration::from_secs(10));
            if line == "\r\n" {
                break;
            }
            chunked |= line
                .to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked");
        }
        Events {
            reader,
            chunked,
            text: String::new(),
            retry: None,
        }
    }
}

/// A live `text/event-stream`.
pub struct Events {
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Decoded text not yet split into events.
    text: String,
    /// The last `retry` field read (ms).
    pub retry: Option<u64>,
}

impl Events {
    /// The next event (name, data) within `limit`, or `None`.
    pub fn next(&mut self, limit: Duration) -> Option<(String, String)> {
        let end = Instant::now() + limit;
        loop {
            if let Some(at) = self.text.find("\n\n") {
                let block: String = self.text.drain(..at + 2).collect();
                let mut name = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("retry:") {
                        self.retry = v.trim().parse().ok();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data += v.trim_start();
                    }
                }
                if data.is_empty() && name == "message" {
                    continue; // a keep-alive comment
                }
                return Some((name, data));
            }
            if Instant::now() >= end {
                return None;
            }
            self.fill();
        }
    }

    /// Events named `name` within `limit`, until `enough` says stop (or the time is up).
    pub fn collect(
        &mut self,
        name: &str,
        limit: Duration,
        mut enough: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let end = Instant::now() + limit;
        let mut got = Vec::new();
        while Instant::now() < end && !enough(&got) {
            if let Some((n, data)) = self.next(end.saturating_duration_since(Instant::now())) {
                if n == name {
                    got.push(serde_json::from_str(&data).expect("event data is JSON"));
                }
            }
        }
        got
    }

    /// Reads what has come (waiting at most the socket's short read timeout).
    fn fill(&mut self) {
        if self.chunked {
            let mut size = String::new();
            if self.reader.read_line(&mut size).unwrap_or(0) == 0 {
                return;
            }
            let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
                return;
            };
            let mut chunk = vec![0u8; n + 2];
            let end = Instant::now() + Duration::from_secs(10);
            let mut got = 0;
            while got < chunk.len() && Instant::now() < end {
                match self.reader.read(&mut chunk[got..]) {
                    Ok(0) => break,
                    Ok(k) => got += k,
                    Err(_) => {}
                }
            }
            chunk.truncate(n);
            self.text += &String::from_utf8_lossy(&chunk).replace("\r\n", "\n");
        } else {
            let mut line = String::new();
            let _ = self.reader.read_line(&mut line);
            self.text += &line.replace("\r\n", "\n");
        }
    }
}

fn read_line_patiently(reader: &mut BufReader<TcpStream>, line: &mut String, limit: Duration) {
    let end = Instant::now() + limit;
    while !line.ends_with('\n') {
        let _ = reader.read_line(line);
        assert!(Instant::now() < end, "no line from the console: {line:?}");
    }
}

/// The answer; status 0 when the connection closed with none (the broker exited).
fn parse(raw: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(raw).into_owned();
    if text.is_empty() {
        return Reply {
            status: 0,
            headers: Vec::new(),
            body: String::new(),
        };
    }
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out += &rest[..n];
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

//! `fsbroker proxy --url` against a hostile remote server: a tiny HTTP server in the test
//! (`tests/common/http.rs`: plain `std::net` on 127.0.0.1, one thread per connection, every
//! byte of every answer written by the test), the real binary as the proxy, and the test as
//! the host on its stdin and stdout. Each test names what must hold. Failing when written (the review's
//! findings; its report gives the fix proposed for each):
//! `streams_opened_for_broker_answers_are_bounded_in_memory`,
//! `partial_json_bodies_in_flight_are_bounded_in_memory`,
//! `cancelled_requests_whose_streams_never_end_free_their_slots`,
//! `a_request_answered_on_another_stream_frees_its_slot`,
//! `a_get_stream_without_a_head_holds_up_nothing`,
//! `the_servers_cancel_of_a_broker_request_does_not_reach_the_host` (known of the stdio
//! proxy too), `a_late_answer_with_the_id_respelled_is_dropped`,
//! `a_late_answer_while_the_host_is_slow_is_dropped`, `the_token_is_in_no_error_and_no_log`,
//! `a_late_answer_in_a_batch_or_with_its_id_twice_is_dropped` and
//! `an_answer_in_a_batch_settles_its_request` (F8 of a later review).
//! The others held, and stay as regression tests.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::Fsb;
use common::http::{
    Seen, Server, WAIT, answer_json, error_message, init_result, initialize, proxy, respond,
};
use common::remote::openssl;
use common::{path_str, proc_status_kib, tempdir};

/// What the proxy may hold beyond the longest message it relays (`--max-line-bytes`).
const BASE_MIB: u64 = 100;

/// The head of an event stream that ends when the connection closes.
fn sse_head(stream: &mut TcpStream) -> std::io::Result<()> {
    stream.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n",
    )
}

/// Keeps a connection open (the server never ends the response) until the peer goes or
/// [`WAIT`] twice over has passed.
fn hold(stream: &mut TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let end = Instant::now() + 2 * WAIT;
    let mut buf = [0u8; 1024];
    while Instant::now() < end {
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// What an MCP server does with what is not the attack: `initialize` with a session, 202 for
/// notifications and answers, 405 for GET, 200 for DELETE; `None` for the rest (the caller's).
fn ordinary(req: &Seen, stream: &mut TcpStream) -> Option<()> {
    match req.method.as_str() {
        "GET" => respond(stream, "405 Method Not Allowed", &[], b""),
        "DELETE" => respond(stream, "200 OK", &[], b""),
        _ => {
            let msg = req.json();
            match msg["method"].as_str() {
                Some("initialize") => {
                    answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-h"]);
                }
                Some(m) if m.starts_with("notifications/") => {
                    respond(stream, "202 Accepted", &[], b"");
                }
                None => respond(stream, "202 Accepted", &[], b""),
                Some(_) => return None,
            }
        }
    }
    Some(())
}

/// The proxy's peak resident memory, in MiB.
fn peak_mib(fsb: &Fsb) -> u64 {
    proc_status_kib(fsb.pid(), "VmHWM") / 1024
}

/// Writes `total` bytes of `fill` in 64 KiB pieces, until the peer stops reading.
fn pour(stream: &mut TcpStream, fill: u8, total: usize) {
    let chunk = vec![fill; 64 << 10];
    let mut sent = 0;
    while sent < total {
        if stream.write_all(&chunk).is_err() {
            return;
        }
        sent += chunk.len();
    }
}

// -------------------------------------------------------------------------------------------
// 1. Oversized events
// -------------------------------------------------------------------------------------------

/// One `data:` line of 160 MiB (the default `--max-line-bytes`, 32 MiB): the host's request
/// gets an error naming the bound, and the proxy's memory stays within 100 MiB plus the
/// bound.
#[test]
fn a_160_mib_data_line_is_an_error_within_bounded_memory() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        if sse_head(stream).is_ok() && stream.write_all(b"data: ").is_ok() {
            pour(stream, b'x', 160 << 20);
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(message.contains("longer than 33554432 bytes"), "{r}");
    let peak = peak_mib(&fsb);
    assert!(peak < BASE_MIB + 32, "the proxy peaked at {peak} MiB");
    fsb.end();
}

/// Many short `data:` lines that add up to one event past the bound, and never a blank
/// line: an error, memory bounded.
#[test]
fn data_lines_adding_up_past_the_bound_are_an_error() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        if sse_head(stream).is_err() {
            return;
        }
        let mut line = b"data: ".to_vec();
        line.extend(std::iter::repeat_n(b'y', 1000));
        line.push(b'\n');
        let piece = line.repeat(64);
        for _ in 0..(64 << 20) / piece.len() {
            if stream.write_all(&piece).is_err() {
                return;
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", "4194304"], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(message.contains("longer than 4194304 bytes"), "{r}");
    let peak = peak_mib(&fsb);
    assert!(peak < BASE_MIB + 4, "the proxy peaked at {peak} MiB");
    fsb.end();
}

/// An event without its blank line, and then the end of the stream: not an answer (the
/// host gets an error, not the half event, not a hang).
#[test]
fn an_event_without_its_blank_line_is_not_an_answer() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = req.json()["id"].clone();
        let event = format!(
            "data: {}\n",
            json!({"jsonrpc": "2.0", "id": id, "result": {}})
        );
        if sse_head(stream).is_ok() {
            let _ = stream.write_all(event.as_bytes());
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(message.contains("without answering"), "{r}");
    fsb.end();
}

/// Every broker answer the proxy POSTs may come back as an event stream the proxy keeps
/// reading (it answers no host request, so nothing ends it): a server that asks for roots
/// again and again and answers each answer with a stream holding one event just short of
/// the bound makes the proxy hold all of them at once. The proxy's memory must stay within
/// 100 MiB plus the bound however many such streams the server opens.
#[test]
fn streams_opened_for_broker_answers_are_bounded_in_memory() {
    const ASKS: usize = 24;
    const MAX: usize = 8 << 20;
    let poured = Arc::new(AtomicUsize::new(0));
    let done = Arc::clone(&poured);
    let server = Server::start(move |req, stream| match req.method.as_str() {
        "GET" => {
            if sse_head(stream).is_err() {
                return;
            }
            for i in 0..ASKS {
                let ask = json!({"jsonrpc": "2.0", "id": format!("r{i}"), "method": "roots/list"});
                if stream
                    .write_all(format!("data: {ask}\n\n").as_bytes())
                    .is_err()
                {
                    return;
                }
            }
            hold(stream);
        }
        "POST" if req.json().get("result").is_some() => {
            // The broker's answer: an event stream with one event that never ends.
            if sse_head(stream).is_ok() && stream.write_all(b"data: ").is_ok() {
                pour(stream, b'x', MAX - (1 << 20));
                done.fetch_add(1, Ordering::SeqCst);
                hold(stream);
            }
        }
        _ => {
            if ordinary(req, stream).is_none() {
                answer_json(req, json!({}), stream, &[]);
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", &MAX.to_string()], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let end = Instant::now() + WAIT;
    while poured.load(Ordering::SeqCst) < ASKS && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let streams = poured.load(Ordering::SeqCst);
    let peak = peak_mib(&fsb);
    println!("{streams} answer streams poured; the proxy peaked at {peak} MiB");
    assert!(
        peak < BASE_MIB + (MAX >> 20) as u64,
        "the proxy peaked at {peak} MiB holding {streams} open answer streams of {} MiB each",
        (MAX >> 20) - 1
    );
    fsb.end();
}

// -------------------------------------------------------------------------------------------
// 2. Endless streams
// -------------------------------------------------------------------------------------------

/// An event stream of nothing but comments, never an event: the bytes since the last event
/// are counted, so it ends in an error (bounded), not a hang.
#[test]
fn an_endless_stream_of_comments_fails_the_request() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        if sse_head(stream).is_err() {
            return;
        }
        let piece = b": keep-alive\n\n".repeat(4096);
        for _ in 0..(64 << 20) / piece.len() {
            if stream.write_all(&piece).is_err() {
                return;
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", "1048576"], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(message.contains("longer than 1048576 bytes"), "{r}");
    fsb.end();
}

/// A chunked JSON body without end: an error naming the bound, memory bounded.
#[test]
fn an_endless_chunked_json_body_fails_the_request() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        let mut chunk = format!("{:x}\r\n", 64 << 10).into_bytes();
        chunk.extend(std::iter::repeat_n(b' ', 64 << 10));
        chunk.extend_from_slice(b"\r\n");
        for _ in 0..2048 {
            if stream.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", "1048576"], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(message.contains("longer than 1048576 bytes"), "{r}");
    assert!(peak_mib(&fsb) < BASE_MIB + 1);
    fsb.end();
}

/// A host that cancels requests whose event streams the server never ends gets its slots
/// back: 64 such requests cancelled, the host's next request is still sent and answered
/// (the proxy must not stop reading the host for good).
#[test]
fn cancelled_requests_whose_streams_never_end_free_their_slots() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        match req.rpc_method().as_deref() {
            Some("tools/call") => {
                // Headers, a keep-alive, and then nothing, ever.
                if sse_head(stream).is_ok() && stream.write_all(b": working\n\n").is_ok() {
                    hold(stream);
                }
            }
            _ => answer_json(req, json!({}), stream, &[]),
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for i in 0..64 {
        fsb.send_msg(&json!({"jsonrpc": "2.0", "id": format!("call-{i}"), "method": "tools/call", "params": {"name": "slow", "arguments": {}}}));
    }
    server.wait_until("64 tools/call sent", |seen| {
        seen.iter()
            .filter(|s| s.rpc_method().as_deref() == Some("tools/call"))
            .count()
            == 64
    });
    for i in 0..64 {
        fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": format!("call-{i}"), "reason": "the user gave up"}}));
    }
    let id = json!("after");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let r = fsb.answer_within(&id, WAIT);
    assert!(
        r.is_some(),
        "the host's request after 64 cancelled ones was never answered (the proxy stopped reading the host); the server saw {} requests",
        server.seen().len()
    );
    fsb.kill_now();
}

// -------------------------------------------------------------------------------------------
// 3. Redirects
// -------------------------------------------------------------------------------------------

/// No 3xx is followed (to another port, to `file://`, to the cloud metadata address), the
/// host gets an error naming the status, and the token goes nowhere else.
#[test]
fn no_redirect_is_followed_and_the_token_goes_nowhere_else() {
    let other = Server::start(|req, stream| answer_json(req, init_result(), stream, &[]));
    let locations = [
        ("301 Moved Permanently", other.url.clone()),
        ("302 Found", "file:///etc/passwd".to_owned()),
        (
            "307 Temporary Redirect",
            "http://169.254.169.254/latest/meta-data/".to_owned(),
        ),
        (
            "308 Permanent Redirect",
            format!("https://127.0.0.1:{}/mcp", other.port),
        ),
        ("303 See Other", "//127.0.0.1:1/x".to_owned()),
    ];
    for (status, location) in locations {
        let header = format!("Location: {location}");
        let server = Server::start(move |_, stream| respond(stream, status, &[&header], b""));
        let (_dir, mut fsb) = proxy(
            &server.url,
            &["--header-env", "Authorization=HOSTILE_TOKEN"],
            &[("HOSTILE_TOKEN", "Bearer tok-redirect-5ecret")],
        );
        let r = initialize(&mut fsb);
        let message = error_message(&r);
        let code = &status[..3];
        assert!(
            message.contains(&format!("HTTP {code}")) && message.contains("not followed"),
            "{status}: {r}"
        );
        fsb.end();
        assert!(!fsb.log_text().contains("5ecret"), "{}", fsb.log_text());
        assert_eq!(server.seen().len(), 1, "{status}: {:?}", server.seen());
    }
    assert_eq!(
        other.connections.load(Ordering::SeqCst),
        0,
        "a redirect was followed"
    );
}

// -------------------------------------------------------------------------------------------
// 4. Headers
// -------------------------------------------------------------------------------------------

/// A session id with a bare CR, with bytes outside ASCII, or 1 MB long: it injects no header
/// into the next request, and the host gets an answer either way (a session id the proxy
/// cannot use is an error, not a hang).
#[test]
fn a_hostile_session_id_injects_nothing() {
    let long = "a".repeat(1 << 20);
    let ids: Vec<Vec<u8>> = vec![
        b"abc\rX-Injected: yes".to_vec(),
        b"abc\nX-Injected: yes".to_vec(),
        "s\u{e9}ss\u{2028}X-Injected: yes".as_bytes().to_vec(),
        b"ok\x00X-Injected: yes".to_vec(),
        long.into_bytes(),
    ];
    for sid in ids {
        let shown = String::from_utf8_lossy(&sid[..sid.len().min(40)]).into_owned();
        let sid = Arc::new(sid);
        let server = Server::start(move |req, stream| {
            if req.rpc_method().as_deref() == Some("initialize") {
                let body =
                    json!({"jsonrpc": "2.0", "id": req.json()["id"], "result": init_result()})
                        .to_string();
                let mut head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\nMcp-Session-Id: ",
                    body.len()
                )
                .into_bytes();
                head.extend_from_slice(&sid);
                head.extend_from_slice(b"\r\n\r\n");
                head.extend_from_slice(body.as_bytes());
                let _ = stream.write_all(&head);
                return;
            }
            if ordinary(req, stream).is_none() {
                answer_json(req, json!({"tools": []}), stream, &[]);
            }
        });
        let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
        let _ = initialize(&mut fsb);
        let r = fsb.request("tools/list", json!({}));
        assert!(
            r.get("result").is_some() || r.get("error").is_some(),
            "{shown:?}: {r}"
        );
        fsb.end();
        for s in server.seen() {
            assert!(
                s.header("x-injected").is_none(),
                "{shown:?}: a header was injected: {s:?}"
            );
        }
    }
}

/// A response head of 10 000 headers, and one that never ends: an error for the host,
/// memory bounded.
#[test]
fn huge_and_endless_response_heads_are_errors() {
    for endless in [false, true] {
        let server = Server::start(move |req, stream| {
            if req.rpc_method().as_deref() != Some("initialize") {
                let _ = ordinary(req, stream);
                return;
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n");
            let count = if endless { usize::MAX } else { 10_000 };
            let mut i = 0usize;
            while i < count {
                let mut piece = Vec::new();
                for j in i..(i + 1000).min(count) {
                    piece
                        .extend_from_slice(format!("X-Pad-{j}: {}\r\n", "p".repeat(40)).as_bytes());
                }
                if stream.write_all(&piece).is_err() {
                    return;
                }
                i += 1000;
            }
            let _ = stream.write_all(b"Content-Length: 2\r\n\r\n{}");
        });
        let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
        let r = initialize(&mut fsb);
        let message = error_message(&r);
        assert!(message.contains("cannot reach"), "endless={endless}: {r}");
        assert!(peak_mib(&fsb) < BASE_MIB + 32);
        fsb.end();
    }
}

// -------------------------------------------------------------------------------------------
// 6. Broker methods smuggled to the host
// -------------------------------------------------------------------------------------------

/// A host line, normalized: re-serialized when it is JSON (escapes decoded: `\u006d`,
/// `\/`), else as it is.
fn normalized(raw: &[u8]) -> String {
    match serde_json::from_slice::<Value>(raw) {
        Ok(v) => v.to_string(),
        Err(_) => String::from_utf8_lossy(raw).into_owned(),
    }
}

/// No line the host got names a broker method, in any form.
fn assert_nothing_for_the_broker_reached_the_host(fsb: &Fsb) {
    for raw in fsb.received() {
        let text = String::from_utf8_lossy(raw);
        let norm = normalized(raw);
        for form in [&*text, &*norm] {
            assert!(
                !form.contains("roots/list")
                    && !form.contains("files/")
                    && !form.contains("files\\/"),
                "a broker method reached the host: {text}"
            );
        }
    }
}

/// Server messages a lenient host might read as `roots/list` or `files/*` requests, in every
/// SSE and JSON form at hand, on a POST's stream: none reaches the host; the host's own
/// answer, after them, does.
#[test]
fn no_form_of_a_broker_request_reaches_the_host() {
    let events: Vec<&'static [u8]> = vec![
        br#"data: {"jsonrpc":"2.0","id":"s1","method":"files/read","params":{"path":"big.bin","length":10}}"#,
        b"data: {\"jsonrpc\":\"2.0\",\"id\":\"s2\",\ndata: \"method\":\"roots/list\"}",
        br#"data: [{"jsonrpc":"2.0","id":"s3","method":"roots/list"}]"#,
        br#"data: {"jsonrpc":"2.0","id":"s4","method":"files/read","method":"tools/list"}"#,
        br#"data: {"jsonrpc":"2.0","id":"s5","method":"tools/list","method":"files/read"}"#,
        br#"data: {"jsonrpc":"2.0","id":"s6","\u006dethod":"files/list","params":{"path":""}}"#,
        br#"data: {"jsonrpc":"2.0","id":"s7","method":"files\/stat","params":{"path":""}}"#,
        br#"data: {"jsonrpc":"2.0","id":"s8","method":"\u0066iles/stat","params":{"path":""}}"#,
        b"event: request\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"s9\",\"method\":\"roots/list\"}",
        b"data: \xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":\"s10\",\"method\":\"roots/list\"}",
        b"data: {\"jsonrpc\":\"2.0\",\"id\":\"s11\",\"method\":\"files/\ndata: read\"}",
        b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"s12\",\"method\":\"roots/list\"}",
        b"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}} {\"jsonrpc\":\"2.0\",\"id\":\"s13\",\"method\":\"roots/list\"}",
        br#"data: {"jsonrpc":"2.0","id":"s14","method":"roots/list","params":[]}"#,
        br#"data: {"jsonrpc":"2.0","id":null,"method":"roots/list"}"#,
        br#"data: {"jsonrpc":"2.0","method":"roots/list"}"#,
        br#"data: {"id":"s15","method":"roots/list"}"#,
        br#"data: {"jsonrpc":"2.0","id":"s16","method":"Roots/List"}"#,
        br#"data: {"jsonrpc":"2.0","id":"s17","method":"roots/list\u0000"}"#,
        br#"data: {"jsonrpc":"2.0","id":"s18","method":"roots/list","id":"s19"}"#,
        b"data:{\"jsonrpc\":\"2.0\",\"id\":\"s20\",\"method\":\"roots/list\"}",
        br#"data: {"jsonrpc":"2.0","id":"s21","method":"notifications/fsbroker/peer","params":{}}"#,
    ];
    // Each event ended three ways: LF, CRLF, CR alone (which SSE allows).
    let mut body = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let end: &[u8] = match i % 3 {
            0 => b"\n\n",
            1 => b"\r\n\r\n",
            _ => b"\r\r",
        };
        let event: Vec<u8> = if i % 3 == 2 {
            // CR alone between the event's own lines too.
            e.iter()
                .map(|&b| if b == b'\n' { b'\r' } else { b })
                .collect()
        } else {
            e.to_vec()
        };
        body.extend_from_slice(&event);
        body.extend_from_slice(end);
    }
    let body = Arc::new(body);
    let server = Server::start(move |req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = req.json()["id"].clone();
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [{"name": "clean", "inputSchema": {"type": "object"}}]}});
        if sse_head(stream).is_ok() && stream.write_all(&body).is_ok() {
            let _ = stream.write_all(format!("data: {answer}\n\n").as_bytes());
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    assert_eq!(r["result"]["tools"][0]["name"], "clean", "{r}");
    // The broker's answer to the sound read went back to the server.
    server.wait_until("the broker's answer to s1", |seen| {
        seen.iter().any(|s| s.json()["id"] == "s1")
    });
    fsb.end();
    assert_nothing_for_the_broker_reached_the_host(&fsb);
}

/// The same forms as a JSON body answering the host's request (one message per body; the
/// broker's request in the body rather than the answer): nothing reaches the host, and the
/// host's request gets an answer.
#[test]
fn a_json_body_holding_a_broker_request_reaches_only_the_broker() {
    let note = r#"{"jsonrpc":"2.0","method":"notifications/message","params":{}}"#;
    let ask = r#"{"jsonrpc":"2.0","id":"bz","method":"roots/list"}"#;
    // Separators some line readers split on (Python's `str.splitlines`, Unicode's line and
    // paragraph separators, NEL, NUL).
    let split: Vec<String> = [
        "\u{b}", "\u{c}", "\u{1c}", "\u{1d}", "\u{1e}", "\u{85}", "\u{2028}", "\u{2029}", "\0",
    ]
    .iter()
    .map(|sep| format!("{note}{sep}{ask}"))
    .collect();
    let mut bodies: Vec<&'static str> = vec![
        r#"{"jsonrpc":"2.0","id":"b1","method":"roots/list"}"#,
        r#"[{"jsonrpc":"2.0","id":"b2","method":"roots/list"}]"#,
        "{\"jsonrpc\":\"2.0\",\"id\":\"b3\",\r\"method\":\"roots/list\"}",
        "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":\"b4\",\"method\":\"roots/list\"}",
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n{\"jsonrpc\":\"2.0\",\"id\":\"b5\",\"method\":\"roots/list\"}",
    ];
    bodies.extend(split.into_iter().map(|b| &*Box::leak(b.into_boxed_str())));
    let count = bodies.len();
    let bodies = Arc::new(bodies);
    let server = Server::start(move |req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let n: usize = req.json()["params"]["n"].as_u64().unwrap_or(0) as usize;
        respond(
            stream,
            "200 OK",
            &["Content-Type: application/json"],
            bodies[n].as_bytes(),
        );
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    for n in 0..count {
        let r = fsb.request("tools/list", json!({"n": n}));
        assert!(r.get("error").is_some(), "{n}: {r}");
    }
    fsb.end();
    assert_nothing_for_the_broker_reached_the_host(&fsb);
}

/// The server's `notifications/cancelled` for a request the broker answered (its
/// `roots/list`) concerns the broker only: the host never sent that request, and must not
/// get the notice (a host may cancel its own request of that id in turn).
#[test]
fn the_servers_cancel_of_a_broker_request_does_not_reach_the_host() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = req.json()["id"].clone();
        let ask = json!({"jsonrpc": "2.0", "id": 7, "method": "roots/list"});
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "no longer needed"}});
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": []}});
        if sse_head(stream).is_ok() {
            let _ = stream.write_all(
                format!("data: {ask}\n\ndata: {cancel}\n\ndata: {answer}\n\n").as_bytes(),
            );
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    assert_eq!(r["result"]["tools"], json!([]), "{r}");
    fsb.end();
    for raw in fsb.received() {
        let text = String::from_utf8_lossy(raw);
        assert!(
            !text.contains("notifications/cancelled"),
            "the server's cancel of the broker's request reached the host: {text}"
        );
    }
}

// -------------------------------------------------------------------------------------------
// 7. Answers out of place, 413 loops
// -------------------------------------------------------------------------------------------

/// A server that refuses every POST of the broker's with 413 (the answer to its read, and
/// the error the proxy sends instead): the proxy sends each at most twice (no loop), and
/// the clamp halves down to 4 KiB and never to nothing.
#[test]
fn a_413_for_every_answer_neither_loops_nor_clamps_to_nothing() {
    const READS: usize = 12;
    let server = Server::start(|req, stream| {
        let msg = req.json();
        if req.method == "POST" && msg.get("method").is_none() && msg.get("id").is_some() {
            respond(stream, "413 Payload Too Large", &[], b"");
            return;
        }
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = msg["id"].clone();
        if sse_head(stream).is_err() {
            return;
        }
        for i in 0..READS {
            let read = json!({"jsonrpc": "2.0", "id": format!("read-{i}"), "method": "files/read", "params": {"path": "big.bin"}});
            if stream
                .write_all(format!("data: {read}\n\n").as_bytes())
                .is_err()
            {
                return;
            }
            // One at a time, so that each read is clamped by the 413s before it.
            std::thread::sleep(Duration::from_millis(300));
        }
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": []}});
        let _ = stream.write_all(format!("data: {answer}\n\n").as_bytes());
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    assert_eq!(r["result"]["tools"], json!([]), "{r}");
    server.wait_until("every read answered", |seen| {
        (0..READS).all(|i| {
            let id = format!("read-{i}");
            seen.iter()
                .any(|s| s.json()["id"] == id.as_str() && s.json().get("error").is_some())
        })
    });
    fsb.end();
    let seen = server.seen();
    let mut lengths = Vec::new();
    for i in 0..READS {
        let id = format!("read-{i}");
        let posts: Vec<&Seen> = seen
            .iter()
            .filter(|s| s.json()["id"] == id.as_str())
            .collect();
        assert!(posts.len() <= 2, "{id} was posted {} times", posts.len());
        if let Some(n) = posts
            .iter()
            .find_map(|s| s.json()["result"]["length"].as_u64())
        {
            lengths.push(n);
        }
    }
    println!("lengths answered: {lengths:?}");
    assert!(lengths.iter().all(|&n| n >= 4096), "{lengths:?}");
    assert!(lengths.windows(2).all(|w| w[1] <= w[0]), "{lengths:?}");
}

// -------------------------------------------------------------------------------------------
// 9. The token
// -------------------------------------------------------------------------------------------

/// With `--header-env Authorization=VAR`, every error path the server can choose (401 with
/// a `WWW-Authenticate` quoting the token, 404 after the session, 413, a 500 whose body
/// echoes the request's headers, a redirect to a URL holding it, broken SSE): the token's
/// value is on no line of the proxy's stderr and in no error the proxy makes for the host.
#[test]
fn the_token_is_in_no_error_and_no_log() {
    const TOKEN: &str = "Bearer tok-8c1f0e-SECRET";
    let server = Server::start(|req, stream| {
        let auth = req.header("authorization").unwrap_or_default().to_owned();
        if req.method != "POST" {
            let _ = ordinary(req, stream);
            return;
        }
        let msg = req.json();
        let n = msg["params"]["n"].as_u64().unwrap_or(99);
        match msg["method"].as_str() {
            Some("initialize") => {
                answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-t"]);
            }
            Some(m) if m.starts_with("notifications/") => respond(stream, "202 Accepted", &[], b""),
            _ => match n {
                0 => {
                    let h = format!(
                        "WWW-Authenticate: Bearer error=\"invalid_token\", resource_metadata=\"https://evil.example/{auth}\""
                    );
                    respond(stream, "401 Unauthorized", &[&h], auth.as_bytes());
                }
                1 => {
                    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32000, "message": format!("bad request; you sent Authorization: {auth}")}}).to_string();
                    respond(
                        stream,
                        "500 Internal Server Error",
                        &["Content-Type: application/json"],
                        body.as_bytes(),
                    );
                }
                2 => respond(stream, "413 Payload Too Large", &[], auth.as_bytes()),
                3 => {
                    let l = format!(
                        "Location: https://evil.example/?t={}",
                        auth.replace(' ', "%20")
                    );
                    respond(stream, "302 Found", &[&l], b"");
                }
                4 => {
                    let _ = sse_head(stream);
                    let mut event = format!("data: {auth}").into_bytes();
                    event.extend_from_slice(b"\xFF\n\n");
                    let _ = stream.write_all(&event);
                }
                5 => {
                    let h = format!("X-Echo: {auth}");
                    respond(stream, "400 Bad Request", &[&h], auth.as_bytes());
                }
                _ => respond(stream, "404 Not Found", &[], auth.as_bytes()),
            },
        }
    });
    let (_dir, mut fsb) = proxy(
        &server.url,
        &["--header-env", "Authorization=HOSTILE_TOKEN"],
        &[("HOSTILE_TOKEN", TOKEN), ("RUST_LOG", "fsbroker=trace")],
    );
    initialize(&mut fsb);
    let mut errors = Vec::new();
    for n in 0..7 {
        let r = fsb.request("tools/call", json!({"name": "x", "arguments": {}, "n": n}));
        errors.push(error_message(&r));
    }
    fsb.end();
    assert!(
        server
            .seen()
            .iter()
            .any(|s| s.header("authorization") == Some(TOKEN)),
        "the token was not sent at all"
    );
    let mut leaks: Vec<String> = errors
        .iter()
        .enumerate()
        .filter(|(_, e)| e.contains("SECRET"))
        .map(|(n, e)| format!("error {n} for the host: {e}"))
        .collect();
    leaks.extend(
        fsb.log_text()
            .lines()
            .filter(|l| l.contains("SECRET"))
            .map(|l| format!("stderr: {l}")),
    );
    assert!(leaks.is_empty(), "the token leaked:\n{}", leaks.join("\n"));
}

/// Many host requests answered at once with JSON bodies just short of the bound, each
/// stalled before its last bytes: the proxy holds every partial body at once. Its memory
/// must stay within 100 MiB plus the bound (the bodies in flight share one budget, as the
/// server's messages waiting for the relay do).
#[test]
fn partial_json_bodies_in_flight_are_bounded_in_memory() {
    const CALLS: usize = 20;
    const MAX: usize = 8 << 20;
    let poured = Arc::new(AtomicUsize::new(0));
    let done = Arc::clone(&poured);
    let server = Server::start(move |req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MAX - 1024
        );
        if stream.write_all(head.as_bytes()).is_ok() && stream.write_all(b"{\"pad\":\"").is_ok() {
            pour(stream, b'x', MAX - (1 << 20));
            done.fetch_add(1, Ordering::SeqCst);
            hold(stream);
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &["--max-line-bytes", &MAX.to_string()], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for i in 0..CALLS {
        fsb.send_msg(&json!({"jsonrpc": "2.0", "id": format!("c{i}"), "method": "tools/call", "params": {"name": "x", "arguments": {}}}));
    }
    let end = Instant::now() + WAIT;
    while poured.load(Ordering::SeqCst) < CALLS && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let bodies = poured.load(Ordering::SeqCst);
    let peak = peak_mib(&fsb);
    println!("{bodies} partial bodies poured; the proxy peaked at {peak} MiB");
    assert!(
        peak < BASE_MIB + (MAX >> 20) as u64,
        "the proxy peaked at {peak} MiB holding {bodies} partial bodies of {} MiB each",
        (MAX >> 20) - 1
    );
    fsb.kill_now();
}

/// A `protocolVersion` with a line break, or outside ASCII, or 100 KB long, in the
/// `initialize` answer, and another `protocolVersion` in a later answer: no header is
/// injected, the later answer changes nothing, and the host gets its answers.
#[test]
fn a_hostile_protocol_version_injects_nothing() {
    for version in [
        "2025-06-18\r\nX-Injected: yes".to_owned(),
        "2025-06-18\u{2028}X-Injected: yes".to_owned(),
        "v".repeat(100_000),
    ] {
        let v = version.clone();
        let server = Server::start(move |req, stream| {
            if req.rpc_method().as_deref() == Some("initialize") {
                let mut r = init_result();
                r["protocolVersion"] = json!(v);
                answer_json(req, r, stream, &["Mcp-Session-Id: sess-v"]);
                return;
            }
            if ordinary(req, stream).is_none() {
                answer_json(
                    req,
                    json!({"protocolVersion": "1999-01-01\r\nX-Injected: later", "tools": []}),
                    stream,
                    &[],
                );
            }
        });
        let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
        initialize(&mut fsb);
        fsb.request("tools/list", json!({}));
        let r = fsb.request("tools/list", json!({}));
        assert!(r.get("result").is_some(), "{r}");
        fsb.end();
        for s in server.seen() {
            assert!(s.header("x-injected").is_none(), "{s:?}");
            let pv = s.header("mcp-protocol-version").unwrap_or_default();
            assert!(
                !pv.contains("1999"),
                "a later answer changed the version: {s:?}"
            );
        }
    }
}

/// A POST's stream that breaks mid-way (an event with an id, then the end), whose resumption
/// the server answers 404: the host's request gets "ended the session", and so does its next
/// one, without a POST.
#[test]
fn a_404_on_resumption_ends_the_session_clearly() {
    let server = Server::start(|req, stream| {
        if req.method == "GET" && req.header("last-event-id").is_some() {
            respond(stream, "404 Not Found", &[], b"");
            return;
        }
        if ordinary(req, stream).is_some() {
            return;
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}});
        if sse_head(stream).is_ok() {
            let _ = stream.write_all(format!("id: e1\nretry: 10\ndata: {note}\n\n").as_bytes());
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/list", json!({}));
    assert!(error_message(&r).contains("ended the session"), "{r}");
    let posts = server.seen().len();
    // The proxy ends by itself (exit 1), its host still there, so that the host starts it
    // again rather than keep a server that fails every call.
    let status = fsb
        .wait_exit(Duration::from_secs(30))
        .expect("the proxy ends once its session is lost");
    assert_eq!(status.code(), Some(1), "{}", fsb.log_text());
    let later: Vec<Seen> = server.seen()[posts..].to_vec();
    assert!(
        later.iter().all(|s| s.method != "POST"),
        "a POST after the session ended: {later:?}"
    );
}

/// The server's answer to a request the proxy already failed (its stream ended without the
/// answer), sent later on the GET stream: dropped, so the host gets one answer per request.
#[test]
fn a_late_answer_after_the_proxys_error_is_dropped() {
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let rx = Mutex::new(rx);
    let server = Server::start(move |req, stream| match req.method.as_str() {
        "GET" => {
            if sse_head(stream).is_err() {
                return;
            }
            // The answer to the failed request, once the test says it failed.
            let Ok(id) = rx.lock().unwrap().recv_timeout(WAIT) else {
                return;
            };
            let late = json!({"jsonrpc": "2.0", "id": id, "result": {"late": true}});
            let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "after"}});
            let _ = stream.write_all(format!("data: {late}\n\ndata: {note}\n\n").as_bytes());
            hold(stream);
        }
        _ => {
            if ordinary(req, stream).is_some() {
                return;
            }
            // An event stream with no id (cannot be resumed) that ends without the answer.
            if sse_head(stream).is_ok() {
                let _ = stream.write_all(b": nothing\n\n");
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let id = fsb.send("tools/list", json!({}));
    let r = fsb.response(id);
    assert!(error_message(&r).contains("without answering"), "{r}");
    tx.send(json!(id)).unwrap();
    let (_, note) = fsb
        .next_notification(WAIT)
        .expect("the notification after the late answer");
    assert_eq!(note["params"]["data"], "after", "{note}");
    fsb.end();
    let answers = fsb
        .received()
        .iter()
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|m| m["id"] == json!(id))
        .count();
    assert_eq!(answers, 1, "request {id} got {answers} answers");
}

// -------------------------------------------------------------------------------------------
// 8. TLS
// -------------------------------------------------------------------------------------------

/// A TLS server on 127.0.0.1 with `cert` and `key` (PEM); counts the requests' bytes it
/// read after a handshake (none, when the client refuses the certificate).
fn tls_server(cert: &std::path::Path, key: &std::path::Path) -> (String, Arc<AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("cert")
        .collect::<Result<_, _>>()
        .expect("certs");
    let key = PrivateKeyDer::from_pem_file(key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("server config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!(
        "https://127.0.0.1:{}/mcp",
        listener.local_addr().unwrap().port()
    );
    let read = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&read);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { break };
            let config = Arc::clone(&config);
            let count = Arc::clone(&count);
            std::thread::spawn(move || {
                let _ = tcp.set_read_timeout(Some(WAIT));
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut buf = [0u8; 4096];
                if let Ok(n) = tls.read(&mut buf) {
                    count.fetch_add(n, Ordering::SeqCst);
                    let _ = tls.write_all(
                        b"HTTP/1.1 500 Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                }
            });
        }
    });
    (url, read)
}

/// With `--ca-cert`, a certificate the CA signed for another name; without it, a
/// self-signed one for the right address: every request fails closed, naming the
/// certificate, and no byte of a request (so no token) reaches the server.
#[test]
fn tls_fails_closed_on_a_wrong_name_and_on_a_self_signed_certificate() {
    let (_tmp, dir) = tempdir();
    let Some(ca) = common::remote::test_ca(&dir) else {
        return;
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "wrong.key",
        "-out",
        "wrong.csr",
        "-subj",
        "/CN=wrong.example",
    ]);
    openssl(&dir, &csr);
    std::fs::write(
        dir.join("wrong.ext"),
        "subjectAltName=DNS:wrong.example\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "wrong.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "wrong.ext",
            "-out",
            "wrong.pem",
        ],
    );
    let mut selfsigned = vec!["req", "-x509", "-nodes", "-days", "2"];
    selfsigned.extend(ec);
    selfsigned.extend([
        "-keyout",
        "self.key",
        "-out",
        "self.pem",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
    ]);
    openssl(&dir, &selfsigned);

    let ca_arg = path_str(&ca.ca_cert);
    let cases = [
        ("wrong.pem", "wrong.key", vec!["--ca-cert", ca_arg.as_str()]),
        ("self.pem", "self.key", vec![]),
    ];
    for (cert, key, extra) in cases {
        let (url, read) = tls_server(&dir.join(cert), &dir.join(key));
        let mut args = extra.clone();
        args.extend(["--header-env", "Authorization=HOSTILE_TOKEN"]);
        let (_d, mut fsb) = proxy(&url, &args, &[("HOSTILE_TOKEN", "Bearer tls-5ecret")]);
        let r = initialize(&mut fsb);
        let message = error_message(&r);
        assert!(
            message.contains("cannot reach") && message.contains("certificate"),
            "{cert}: {r}"
        );
        let r = fsb.request("tools/list", json!({}));
        assert!(error_message(&r).contains("certificate"), "{cert}: {r}");
        fsb.end();
        assert_eq!(
            read.load(Ordering::SeqCst),
            0,
            "{cert}: the server read a request"
        );
    }
}

/// The server answers each host request on the GET stream and leaves the request's own
/// event stream open (it never sends anything on it): the request is answered, so its slot
/// must come back; after 64 such requests the host's next request is still sent and
/// answered.
#[test]
fn a_request_answered_on_another_stream_frees_its_slot() {
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let rx = Mutex::new(rx);
    let server = Server::start(move |req, stream| match req.method.as_str() {
        "GET" => {
            if sse_head(stream).is_err() {
                return;
            }
            while let Ok(id) = rx.lock().unwrap().recv_timeout(2 * WAIT) {
                let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": []}});
                if stream
                    .write_all(format!("data: {answer}\n\n").as_bytes())
                    .is_err()
                {
                    return;
                }
            }
        }
        _ => {
            if ordinary(req, stream).is_some() {
                return;
            }
            if sse_head(stream).is_ok() && stream.write_all(b": see the GET stream\n\n").is_ok() {
                let _ = tx.send(req.json()["id"].clone());
                hold(stream);
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for i in 0..64 {
        let id = json!(format!("t{i}"));
        fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
        let r = fsb.answer(&id, WAIT);
        assert!(r.get("result").is_some(), "{r}");
    }
    let id = json!("after");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let r = fsb.answer_within(&id, WAIT);
    assert!(
        r.is_some(),
        "the host's 65th request was never answered (64 answered requests still hold their slots)"
    );
    fsb.kill_now();
}

/// The late answer of [`a_late_answer_after_the_proxys_error_is_dropped`], its id spelled
/// another way a host's JSON reader takes for the same number (`1.0`, `1e0`, `10e-1`), or as
/// a string the SDKs take for it (`"1"`: the TypeScript SDK pairs an answer by
/// `Number(id)`, the Python SDK by `int(id)`): still dropped, so the host never gets two
/// answers for one request. (The string spellings got through before `RequestId`: the
/// remote's own key kept `"1"` apart from `1`.)
#[test]
fn a_late_answer_with_the_id_respelled_is_dropped() {
    for spelling in [
        "{id}.0",
        "{id}e0",
        "{id}0e-1",
        "\"{id}\"",
        "\" {id}\\t\"",
        "\"{id}.0\"",
    ] {
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let rx = Mutex::new(rx);
        let server = Server::start(move |req, stream| match req.method.as_str() {
            "GET" => {
                if sse_head(stream).is_err() {
                    return;
                }
                let Ok(id) = rx.lock().unwrap().recv_timeout(WAIT) else {
                    return;
                };
                let id = spelling.replace("{id}", &id.to_string());
                let late = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"late":true}}}}"#);
                // A line separator inside a string is sound JSON: it arrives, as an escape.
                let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "after\u{2028}it"}});
                let _ = stream.write_all(format!("data: {late}\n\ndata: {note}\n\n").as_bytes());
                hold(stream);
            }
            _ => {
                if ordinary(req, stream).is_some() {
                    return;
                }
                if sse_head(stream).is_ok() {
                    let _ = stream.write_all(b": nothing\n\n");
                }
            }
        });
        let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
        initialize(&mut fsb);
        let id = fsb.send("tools/list", json!({}));
        let r = fsb.response(id);
        assert!(error_message(&r).contains("without answering"), "{r}");
        tx.send(id).unwrap();
        // Raw lines until the notification after the late answer (a second answer is not
        // taken for the test helper's protocol error: it is counted below).
        loop {
            match fsb.next_line(WAIT) {
                common::fsb::Raw::Line(l) if l.text().contains(r#""after\u2028it""#) => break,
                common::fsb::Raw::Line(_) => {}
                other => panic!("no notification after the late answer: {other:?}"),
            }
        }
        fsb.end();
        let answers: Vec<String> = fsb
            .received()
            .iter()
            .filter_map(|l| {
                let m: Value = serde_json::from_slice(l).ok()?;
                // The id as the TypeScript SDK pairs it: `Number(id)`.
                let number = match &m["id"] {
                    Value::String(s) => s.trim().parse().ok(),
                    other => other.as_f64(),
                };
                (number == Some(id as f64)).then(|| String::from_utf8_lossy(l).into_owned())
            })
            .collect();
        assert_eq!(
            answers.len(),
            1,
            "{spelling}: request {id} got two answers: {answers:?}"
        );
    }
}

/// The late answer of [`a_late_answer_after_the_proxys_error_is_dropped`] in forms the
/// proxy's strict reader refused and so passed on unread (the hostile review's F8): inside a
/// batch (alone, and beside a notification that must still arrive), and with `id` written
/// twice (JavaScript's and Python's readers keep the last, others the first) or in another
/// case. None of them may reach the host: it gets one answer, the proxy's error.
#[test]
fn a_late_answer_in_a_batch_or_with_its_id_twice_is_dropped() {
    const LATE: &str = r#""late":true"#;
    // Every form is tried, and those that reached the host are named together.
    let mut reached = Vec::new();
    for form in [
        r#"[{"jsonrpc":"2.0","id":{id},"result":{"late":true}}]"#,
        r#"[{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"beside"}},{"jsonrpc":"2.0","id":{id},"result":{"late":true}}]"#,
        r#"{"jsonrpc":"2.0","id":987654,"id":{id},"result":{"late":true}}"#,
        r#"{"jsonrpc":"2.0","id":{id},"id":987654,"result":{"late":true}}"#,
        r#"{"jsonrpc":"2.0","id":987654,"ID":{id},"result":{"late":true}}"#,
        r#"{"jsonrpc":"2.0","id":{id},"method":"x","result":{"late":true}}"#,
        r#"{"jsonrpc":"2.0","id":{id},"result":{"late":true,"x":NaN}}"#,
        // The second hostile pass: a batch after a message, a message after a batch (read
        // by readers that take value after value), line separators a splitter cuts at, a
        // byte-order mark, a comment, arrays in a batch.
        r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}[{"jsonrpc":"2.0","id":{id},"result":{"late":true}}]"#,
        r#"[{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}] {"jsonrpc":"2.0","id":{id},"result":{"late":true}}"#,
        "{\"a\":[\u{2028}{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{\"late\":true}}\u{2028}]}",
        "{\"a\":[\u{c}{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{\"late\":true}}\u{c}]}",
        "\u{feff}[{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{\"late\":true}}]",
        r#"/**/[{"jsonrpc":"2.0","id":{id},"result":{"late":true}}]"#,
        r#"[[[{"jsonrpc":"2.0","id":{id},"result":{"late":true}}]]]"#,
    ] {
        let (tx, rx) = std::sync::mpsc::channel::<u64>();
        let rx = Mutex::new(rx);
        let server = Server::start(move |req, stream| match req.method.as_str() {
            "GET" => {
                if sse_head(stream).is_err() {
                    return;
                }
                let Ok(id) = rx.lock().unwrap().recv_timeout(WAIT) else {
                    return;
                };
                let late = form.replace("{id}", &id.to_string());
                let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "after"}});
                let _ = stream.write_all(format!("data: {late}\n\ndata: {note}\n\n").as_bytes());
                hold(stream);
            }
            _ => {
                if ordinary(req, stream).is_some() {
                    return;
                }
                if sse_head(stream).is_ok() {
                    let _ = stream.write_all(b": nothing\n\n");
                }
            }
        });
        let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
        initialize(&mut fsb);
        let id = fsb.send("tools/list", json!({}));
        let r = fsb.response(id);
        assert!(error_message(&r).contains("without answering"), "{r}");
        tx.send(id).unwrap();
        loop {
            match fsb.next_line(WAIT) {
                common::fsb::Raw::Line(l) if l.text().contains("\"after\"") => break,
                common::fsb::Raw::Line(_) => {}
                other => panic!("{form}: no notification after the late answer: {other:?}"),
            }
        }
        fsb.end();
        let lines: Vec<String> = fsb
            .received()
            .iter()
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        if lines.iter().any(|l| l.contains(LATE)) {
            reached.push(form);
        }
        if form.contains("beside") {
            assert!(
                lines.iter().any(|l| l.contains("\"beside\"")),
                "{form}: the batch's notification was lost: {lines:?}"
            );
        }
    }
    assert!(
        reached.is_empty(),
        "the late answer reached the host in these forms: {reached:#?}"
    );
}

/// The answer to a pending request, sent as a one-message batch in the POST's JSON body:
/// it settles the request, so the host gets that answer and not also the proxy's error
/// ("the server answered without answering"). Before, a batch was passed on unread and the
/// request stayed pending: the host got two answers.
#[test]
fn an_answer_in_a_batch_settles_its_request() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = req.json()["id"].clone();
        let batch = json!([{"jsonrpc": "2.0", "id": id, "result": {"tools": []}}]).to_string();
        respond(
            stream,
            "200 OK",
            &["Content-Type: application/json"],
            batch.as_bytes(),
        );
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let id = fsb.send("tools/list", json!({}));
    // A second request, answered the same way, after the first's answer (and its error, if
    // any) was queued.
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": "second", "method": "tools/list"}));
    loop {
        match fsb.next_line(WAIT) {
            common::fsb::Raw::Line(l) if l.text().contains("\"second\"") => break,
            common::fsb::Raw::Line(_) => {}
            other => panic!("no answer to the second request: {other:?}"),
        }
    }
    fsb.end();
    let answers: Vec<String> = fsb
        .received()
        .iter()
        .filter_map(|l| {
            let m: Value = serde_json::from_slice(l).ok()?;
            let one = |m: &Value| m["id"] == json!(id);
            (one(&m) || m.as_array().is_some_and(|b| b.iter().any(one)))
                .then(|| String::from_utf8_lossy(l).into_owned())
        })
        .collect();
    assert_eq!(answers.len(), 1, "request {id} got {answers:?}");
    assert!(answers[0].starts_with('['), "{answers:?}");
}

/// More host requests than the proxy keeps waiting for the server (`REMOTE_PENDING`, 4096)
/// against a server that answers none until the test lets it: the first 64 are sent (the
/// POSTs at once) and held, the other 4032 wait for a POST of their own and count as
/// pending too, so the 4097th, pipelined behind them, gets the proxy's error at once and is
/// never sent. Once the server answers, every request of the burst gets its answer, and a
/// second burst of 4096 is taken whole (its 4097th refused again): no slot of the first
/// burst stayed taken.
#[test]
fn requests_past_the_pending_bound_are_refused_and_their_slots_come_back() {
    // `REMOTE_PENDING` in src/limits.rs.
    const PENDING: usize = 4096;
    let holding = Arc::new(AtomicBool::new(true));
    let held = Arc::clone(&holding);
    let server = Server::start(move |req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        // No answer, not even its head, while the test holds the server.
        let end = Instant::now() + 2 * WAIT;
        while held.load(Ordering::SeqCst) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        answer_json(req, json!({"tools": []}), stream, &[]);
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for round in ["a", "b"] {
        holding.store(true, Ordering::SeqCst);
        let over = format!("{round}-over");
        let mut burst = Vec::new();
        for n in 0..PENDING {
            let id = format!("{round}{n}");
            burst.extend(
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"})
                    .to_string()
                    .bytes(),
            );
            burst.push(b'\n');
        }
        burst.extend(
            json!({"jsonrpc": "2.0", "id": over, "method": "tools/list"})
                .to_string()
                .bytes(),
        );
        burst.push(b'\n');
        fsb.send_raw(&burst);
        let r = fsb.answer(&json!(over), WAIT);
        assert!(
            error_message(&r).contains("requests unanswered; this one was not sent"),
            "{round}: {r}"
        );
        holding.store(false, Ordering::SeqCst);
        let mut answered = std::collections::HashSet::new();
        while answered.len() < PENDING {
            let m = match fsb.next_line(WAIT) {
                common::fsb::Raw::Line(l) => l.json.clone().unwrap_or_default(),
                other => panic!(
                    "{round}: {} of {PENDING} answered, then {other:?}",
                    answered.len()
                ),
            };
            let Some(id) = m["id"].as_str().filter(|id| id.starts_with(round)) else {
                continue;
            };
            assert!(m.get("result").is_some(), "{round}: {m}");
            assert!(
                answered.insert(id.to_owned()),
                "{round}: {id} answered twice"
            );
        }
    }
    let id = json!("after");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let r = fsb.answer(&id, WAIT);
    assert!(r.get("result").is_some(), "{r}");
    fsb.end();
    let sent: Vec<Value> = server
        .seen()
        .iter()
        .map(|req| req.json()["id"].clone())
        .filter(|id| id.as_str().is_some_and(|id| id.ends_with("-over")))
        .collect();
    assert!(
        sent.is_empty(),
        "requests past the bound were sent: {sent:?}"
    );
}

/// A server that answers 401 to everything after `initialize` (the GET stream too): each host
/// request gets its error, and the GET stream is tried at most 1 + 5 times, not in a loop.
#[test]
fn a_401_for_everything_is_an_error_each_time_and_no_loop() {
    let server = Server::start(|req, stream| {
        if req.rpc_method().as_deref() == Some("initialize") {
            answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-401"]);
            return;
        }
        respond(
            stream,
            "401 Unauthorized",
            &["WWW-Authenticate: Bearer resource_metadata=\"https://a.example/m\""],
            b"",
        );
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    for _ in 0..3 {
        let r = fsb.request("tools/list", json!({}));
        assert!(error_message(&r).contains("HTTP 401"), "{r}");
    }
    // The GET stream gives up after its 5 resumptions (1 s apart).
    server.wait_until("the GET stream given up", |seen| {
        seen.iter().filter(|s| s.method == "GET").count() >= 6
    });
    std::thread::sleep(Duration::from_secs(3));
    fsb.end();
    let gets = server.seen().iter().filter(|s| s.method == "GET").count();
    assert!(gets <= 6, "{gets} GETs");
}

/// A server that holds everything (the GET stream's head never comes, every request's
/// stream stays open without an answer, the `DELETE` is never answered): the host's EOF
/// still ends the proxy (answers still coming are given 10 s, the `DELETE` 2 s), exit 0:
/// the proxy does not outlive its host.
#[test]
fn the_hosts_eof_ends_the_proxy_whatever_the_server_holds() {
    let server = Server::start(|req, stream| match req.method.as_str() {
        "GET" | "DELETE" => hold(stream),
        _ => {
            if req.rpc_method().as_deref() == Some("initialize") {
                answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-hold"]);
                return;
            }
            if sse_head(stream).is_ok() {
                hold(stream);
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    for i in 0..8 {
        fsb.send_msg(&json!({"jsonrpc": "2.0", "id": format!("h{i}"), "method": "tools/call", "params": {"name": "x", "arguments": {}}}));
    }
    fsb.close_stdin();
    let status = fsb
        .wait_exit(WAIT)
        .expect("the proxy outlived its host by a minute");
    assert!(status.success(), "{status}");
}

/// The host goes before the server has answered its `initialize`, and the server then holds
/// the GET stream without a word: the grace for the host's going ends while the proxy still
/// waits for that stream's head, and the task following it must end with the session all
/// the same (left running, it held the proxy for the 300 s a head may take).
#[test]
fn the_hosts_eof_before_the_session_is_made_ends_the_proxy() {
    let server = Server::start(|req, stream| match req.method.as_str() {
        "GET" | "DELETE" => hold(stream),
        _ => {
            if req.rpc_method().as_deref() == Some("initialize") {
                std::thread::sleep(Duration::from_secs(1));
                answer_json(req, init_result(), stream, &["Mcp-Session-Id: sess-late"]);
                return;
            }
            hold(stream);
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    fsb.close_stdin();
    let status = fsb
        .wait_exit(WAIT)
        .expect("the proxy outlived its host by a minute");
    assert!(status.success(), "{status}");
}

/// The proxy's error for a request and the server's own late answer to it, while the host is
/// slow to read (the queues to it full): the error is queued, and the late answer, coming
/// on another stream before the host has taken the error, must still be dropped (the host
/// gets one answer per request, as documented, whatever the host's pace).
#[test]
fn a_late_answer_while_the_host_is_slow_is_dropped() {
    const NOTE: usize = 1 << 20;
    let written = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&written);
    let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
    let close_rx = Mutex::new(close_rx);
    let (late_tx, late_rx) = std::sync::mpsc::channel::<Value>();
    let late_rx = Mutex::new(late_rx);
    let server = Server::start(move |req, stream| match req.method.as_str() {
        "GET" => {
            if sse_head(stream).is_err() {
                return;
            }
            // 128 notifications of 1 MiB: more than every queue to the host holds.
            let note = json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "n".repeat(NOTE)}});
            let event = format!("data: {note}\n\n");
            for _ in 0..128 {
                if stream.write_all(event.as_bytes()).is_err() {
                    return;
                }
                count.fetch_add(1, Ordering::SeqCst);
            }
            hold(stream);
        }
        _ => {
            if ordinary(req, stream).is_some() {
                return;
            }
            let id = req.json()["id"].clone();
            if id == "x" {
                // No answer; the stream ends when the test says.
                if sse_head(stream).is_ok() && stream.write_all(b": wait\n\n").is_ok() {
                    let _ = close_rx.lock().unwrap().recv_timeout(2 * WAIT);
                }
                return;
            }
            let Ok(late) = late_rx.lock().unwrap().recv_timeout(WAIT) else {
                return;
            };
            let late = json!({"jsonrpc": "2.0", "id": late, "result": {"late": true}});
            let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": []}});
            if sse_head(stream).is_ok() {
                let _ = stream.write_all(format!("data: {late}\n\ndata: {answer}\n\n").as_bytes());
            }
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.pause_reading();
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "x", "arguments": {}}}));
    // Until the notifications stop going in: every queue to the host is full.
    let mut last = usize::MAX;
    let end = Instant::now() + WAIT;
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let now = written.load(Ordering::SeqCst);
        if now == last && now > 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the notifications never stopped going in"
        );
        last = now;
    }
    println!("{last} notifications went in before the queues were full");
    assert!(
        last < 128,
        "the proxy took every notification with the host not reading"
    );
    // `x`'s stream ends without its answer: the proxy's error for it waits for the host.
    close_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // The server's own answer to `x`, late, on the stream of another request.
    late_tx.send(json!("x")).unwrap();
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": "y", "method": "tools/list"}));
    std::thread::sleep(Duration::from_secs(2));
    fsb.resume_reading();
    let mut answers = Vec::new();
    loop {
        match fsb.next_line(WAIT) {
            common::fsb::Raw::Line(l) => {
                let Some(m) = l.json.clone() else { continue };
                if m["id"] == "x" {
                    answers.push(l.text());
                }
                if m["id"] == "y" {
                    break;
                }
            }
            other => panic!("no answer to y: {other:?}"),
        }
    }
    // Whatever else the host still gets before the proxy ends.
    let (_, rest) = fsb.end();
    for line in rest.lines() {
        if serde_json::from_str::<Value>(line).is_ok_and(|m| m["id"] == "x") {
            answers.push(line.to_owned());
        }
    }
    println!("answers to x: {answers:?}");
    assert_eq!(answers.len(), 1, "x got two answers: {answers:?}");
}

/// The answer to the host's request may carry a request in its `result` (a tool's output
/// quoting one): the host gets it inside the answer, as written, with no `method` at the top;
/// an answer that also has a broker `method` at the top (a lenient host could take it for a
/// request) does not reach the host, and the host's request then gets the proxy's error.
#[test]
fn a_request_inside_an_answer_stays_inside_it() {
    let server = Server::start(|req, stream| {
        if ordinary(req, stream).is_some() {
            return;
        }
        let id = req.json()["id"].clone();
        let body = match req.json()["params"]["n"].as_u64() {
            Some(0) => json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "x"}], "quoted": {"jsonrpc": "2.0", "id": 9, "method": "roots/list"}}}).to_string(),
            Some(1) => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}},"method":"roots/list"}}"#),
            _ => format!(r#"{{"jsonrpc":"2.0","method":"files/read","id":{id},"result":{{}},"params":{{"path":"big.bin"}}}}"#),
        };
        if sse_head(stream).is_ok() {
            let _ = stream.write_all(format!("data: {body}\n\n").as_bytes());
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    let r = fsb.request("tools/call", json!({"name": "q", "arguments": {}, "n": 0}));
    assert_eq!(r["result"]["quoted"]["method"], "roots/list", "{r}");
    assert!(r.get("method").is_none(), "{r}");
    for n in 1..3 {
        let r = fsb.request("tools/call", json!({"name": "q", "arguments": {}, "n": n}));
        assert!(
            r.get("method").is_none() && r.get("error").is_some(),
            "{n}: {r}"
        );
    }
    fsb.end();
    for raw in fsb.received() {
        let Ok(m) = serde_json::from_slice::<Value>(raw) else {
            continue;
        };
        assert!(
            m.get("method").is_none_or(|m| {
                let m = m.as_str().unwrap_or_default();
                m != "roots/list" && !m.starts_with("files/")
            }),
            "{m}"
        );
    }
}

/// A GET stream whose response head never comes (the server accepts the connection and says
/// nothing) must not hold up the session: the host's messages after `initialize` are sent,
/// and its request answered, while the proxy waits for that head.
#[test]
fn a_get_stream_without_a_head_holds_up_nothing() {
    let server = Server::start(|req, stream| {
        if req.method == "GET" {
            hold(stream);
            return;
        }
        if ordinary(req, stream).is_none() {
            answer_json(req, json!({"tools": []}), stream, &[]);
        }
    });
    let (_dir, mut fsb) = proxy(&server.url, &[], &[]);
    initialize(&mut fsb);
    fsb.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let id = json!("first");
    fsb.send_msg(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}));
    let r = fsb.answer_within(&id, WAIT);
    assert!(
        r.is_some(),
        "the host's first request was not answered within {WAIT:?} (the server saw {:?})",
        server
            .seen()
            .iter()
            .map(|s| s.method.clone())
            .collect::<Vec<_>>()
    );
    fsb.kill_now();
}

/// Rule: a key in `--url`'s query never reaches stderr or the host, even when the server
/// echoes it: in a refusal's message (a 400 naming the path it was asked) or in a redirect's
/// `Location` (frameworks copy the query there), at the default log level and at `trace`.
#[test]
fn a_key_in_the_urls_query_is_never_shown_even_when_echoed() {
    const KEY: &str = "k3yS3CRETvalue42";
    for mode in ["echo", "redirect"] {
        let server = Server::start(move |_req, stream| {
            let path = format!("/mcp?api_key={KEY}");
            if mode == "echo" {
                let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32600, "message": format!("bad request to {path}")}});
                respond(
                    stream,
                    "400 Bad Request",
                    &["Content-Type: application/json"],
                    body.to_string().as_bytes(),
                );
            } else {
                let location = format!("Location: http://127.0.0.1:1{path}");
                respond(stream, "307 Temporary Redirect", &[&location], b"");
            }
        });
        let url = format!("{}?api_key={KEY}", server.url);
        let (_dir, mut fsb) = proxy(&url, &[], &[("RUST_LOG", "fsbroker=trace")]);
        let r = initialize(&mut fsb);
        let message = error_message(&r);
        assert!(
            message.contains(if mode == "echo" {
                "HTTP 400"
            } else {
                "HTTP 307"
            }),
            "{mode}: {message}"
        );
        assert!(
            !r.to_string().contains(KEY),
            "{mode}: the host was shown the key: {r}"
        );
        fsb.end();
        let log = fsb.log_text();
        assert!(!log.contains(KEY), "{mode}: stderr shows the key: {log}");
    }
}

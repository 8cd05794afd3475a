//! A long `files/write` line has its content lifted out before parsing and decoded in place,
//! in the line's own buffer (`jsonrpc::lift`, `codec::base64_decode_in_place`). Through the
//! real binary, on real temp directories, these tests check that the shortcut reads exactly
//! what serde_json would have read, and refuses exactly what it would have refused:
//!
//! - chunked uploads of every padding case, in base64 and UTF-8, land byte for byte, over
//!   lines long enough to be lifted and reused;
//! - content that is not lifted (an escape in it, a key spelt with spaces) lands as parsed;
//! - a line a parser would refuse (invalid UTF-8 or a raw control character in a long
//!   string, in the content or in another member named `content`) is refused, and nothing is
//!   written; invalid base64 anywhere in a long chunk is refused, and nothing is written;
//! - content that imitates the stand-in the broker puts in its place is written as sent;
//! - a long line of another method with a `content` member is answered as that method.
//!
//! After every refusal the session goes on.

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the library's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::PathBuf;

use base64::Engine;
use common::{Fsb, code, pattern, serve_policy, tempdir};
use serde_json::{Value, json};

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A read-write root, with room for 4 MiB chunks.
fn served() -> (tempfile::TempDir, PathBuf, Fsb, tempfile::TempDir) {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    let (policy_dir, b) = serve_policy(
        &root,
        "mode = \"read-write\"",
        "requests_per_second = 0\nmax_chunk_size = 4194304",
    );
    (t, root, b, policy_dir)
}

/// Sends `line` (no newline) as it is, and returns the response to `id`.
fn raw(b: &mut Fsb, id: u64, line: &[u8]) -> Value {
    let mut bytes = line.to_vec();
    bytes.push(b'\n');
    b.send_raw(&bytes);
    b.response(id)
}

/// Rule: an upload in long chunks lands byte for byte, whatever the last chunk's padding,
/// in base64 and in UTF-8; the lines are long enough to be lifted and their buffers reused.
#[test]
fn long_chunks_land_byte_for_byte() {
    let (_t, root, mut b, _p) = served();
    for (i, len) in [
        3 * (1 << 20),
        3 * (1 << 20) + 1,
        3 * (1 << 20) + 2,
        5 * (1 << 20) + 7,
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, 0x9e37_79b9 + i as u32);
        let name = format!("up{i}.bin");
        let chunk = 1 << 20;
        let mut offset = 0;
        while offset < len {
            let end = (offset + chunk).min(len);
            let r = b.ok(
                "files/write",
                json!({"path": name, "encoding": "base64", "offset": offset,
                       "final": end == len, "content": b64(&data[offset..end])}),
            );
            assert_eq!(r["bytesWritten"], end - offset, "{r}");
            offset = end;
        }
        assert!(
            std::fs::read(root.join(&name)).unwrap() == data,
            "{name}: the file is the bytes sent"
        );
    }
    // UTF-8 text, lifted (no escape in it), one shot and in chunks.
    let text: String = pattern(300_000, 7)
        .iter()
        .map(|b| char::from(b'a' + b % 26))
        .collect();
    b.ok("files/write", json!({"path": "t.txt", "content": text}));
    assert_eq!(std::fs::read_to_string(root.join("t.txt")).unwrap(), text);
    b.ok(
        "files/write",
        json!({"path": "u.txt", "offset": 0, "final": false, "content": &text[..200_000]}),
    );
    b.ok(
        "files/write",
        json!({"path": "u.txt", "offset": 200_000, "final": true, "content": &text[200_000..]}),
    );
    assert_eq!(std::fs::read_to_string(root.join("u.txt")).unwrap(), text);
}

/// Rule: content the shortcut does not take (an escape in it, a key spelt with spaces, keys
/// in another order) is read as parsed.
#[test]
fn content_not_lifted_is_read_as_parsed() {
    let (_t, root, mut b, _p) = served();
    let mut text = "x".repeat(150_000);
    text.push('\n');
    text.push_str(&"é\"\\".repeat(30_000));
    b.ok("files/write", json!({"path": "esc.txt", "content": text}));
    assert_eq!(std::fs::read_to_string(root.join("esc.txt")).unwrap(), text);

    let data = pattern(200_000, 3);
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":901,"method":"files/write","params":{{"content" : "{}","encoding":"base64","path":"spaced.bin"}}}}"#,
        b64(&data)
    );
    let r = raw(&mut b, 901, line.as_bytes());
    assert!(r.get("result").is_some(), "{r}");
    assert!(std::fs::read(root.join("spaced.bin")).unwrap() == data);

    // Params before the method, content before the path.
    let line = format!(
        r#"{{"params":{{"content":"{}","path":"order.bin","encoding":"base64"}},"id":902,"jsonrpc":"2.0","method":"files/write"}}"#,
        b64(&data)
    );
    let r = raw(&mut b, 902, line.as_bytes());
    assert!(r.get("result").is_some(), "{r}");
    assert!(std::fs::read(root.join("order.bin")).unwrap() == data);
}

/// Rule: what a JSON parser refuses in a long string is refused with the shortcut too (raw
/// control characters, invalid UTF-8), in the content and in any other member named
/// `content`; invalid base64 anywhere in a long chunk is refused. Nothing is written, and the
/// session goes on.
#[test]
fn hostile_long_lines_are_refused_and_nothing_is_written() {
    let (_t, root, mut b, _p) = served();
    let long = "A".repeat(120_000);

    // A raw tab in long UTF-8 content.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"files/write","params":{{"path":"tab.txt","content":"{long}{}{long}"}}}}"#,
        '\t'
    );
    let r = raw(&mut b, 1, line.as_bytes());
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("control character"),
        "{r}"
    );
    assert!(!root.join("tab.txt").exists());

    // Invalid UTF-8 in long UTF-8 content.
    let mut line = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"files/write","params":{{"path":"bad.txt","content":"{long}"#
    )
    .into_bytes();
    line.extend_from_slice(&[0xff, 0xfe]);
    line.extend_from_slice(format!(r#"{long}"}}}}"#).as_bytes());
    let r = raw(&mut b, 2, &line);
    assert!(r.get("error").is_some(), "{r}");
    assert!(!root.join("bad.txt").exists());

    // Invalid UTF-8 in a long `content` inside `_meta`, the real content short: the line is
    // not valid JSON, as if it had been parsed whole.
    let mut line =
        br#"{"jsonrpc":"2.0","id":3,"method":"files/write","params":{"_meta":{"content":""#
            .to_vec();
    line.extend_from_slice(long.as_bytes());
    line.extend_from_slice(&[0xc3, 0x28]);
    line.extend_from_slice(long.as_bytes());
    line.extend_from_slice(br#""},"path":"meta.txt","content":"short"}}"#);
    let r = raw(&mut b, 3, &line);
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(!root.join("meta.txt").exists());

    // A raw newline cannot be inside a line, but a raw 0x01 in `_meta.content` can.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"files/write","params":{{"_meta":{{"content":"{long}{}"}},"path":"meta2.txt","content":"short"}}}}"#,
        '\u{1}'
    );
    let r = raw(&mut b, 4, line.as_bytes());
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert!(!root.join("meta2.txt").exists());

    // A valid long `_meta.content`: the real content is written.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":5,"method":"files/write","params":{{"_meta":{{"content":"{long}"}},"path":"meta3.txt","content":"short"}}}}"#
    );
    let r = raw(&mut b, 5, line.as_bytes());
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(
        std::fs::read_to_string(root.join("meta3.txt")).unwrap(),
        "short"
    );

    // Invalid base64: a bad byte deep in the chunk, padding in the middle, a short tail.
    let good = b64(&pattern(300_000, 11));
    for (i, bad) in [
        format!("{}*{}", &good[..200_001], &good[200_002..]),
        format!("{}=={}", &good[..65_536], &good[65_538..]),
        format!("{}A", good),
    ]
    .into_iter()
    .enumerate()
    {
        let e = b.err(
            "files/write",
            json!({"path": format!("b{i}.bin"), "encoding": "base64", "content": bad}),
        );
        assert_eq!(e["code"], -32602, "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("not valid base64"),
            "{e}"
        );
        assert!(!root.join(format!("b{i}.bin")).exists());
    }
    // The first upload chunk broken: no upload is left, no staging file.
    let e = b.err(
        "files/write",
        json!({"path": "up.bin", "encoding": "base64", "offset": 0, "final": false,
               "content": format!("{}!", &good[..good.len() - 1])}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("up.bin"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // The session goes on.
    b.ok(
        "files/write",
        json!({"path": "after.txt", "content": "still here"}),
    );
    assert_eq!(
        code(&b.err("files/read", json!({"path": "nope"}))),
        "FILE_NOT_FOUND"
    );
}

/// Rule: content that imitates the stand-in (a NUL and hex digits) is written as sent: the
/// stand-in's digits are drawn when the broker starts, and no peer knows them.
#[test]
fn content_imitating_the_stand_in_is_written_as_sent() {
    let (_t, root, mut b, _p) = served();
    let fake = format!("\u{0}{}", "0".repeat(32));
    let long = "B".repeat(100_000);
    // The imitation is the content; a long string elsewhere is lifted.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"files/write","params":{{"_meta":{{"content":"{long}"}},"path":"fake.txt","content":{}}}}}"#,
        serde_json::to_string(&fake).unwrap()
    );
    let r = raw(&mut b, 7, line.as_bytes());
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(
        std::fs::read(root.join("fake.txt")).unwrap(),
        fake.as_bytes()
    );
}

/// Rule: a long line of another method with a member named `content` is that method's: a
/// read with a long `_meta.content` reads.
#[test]
fn other_methods_long_lines_are_theirs() {
    let (_t, root, mut b, _p) = served();
    std::fs::write(root.join("r.txt"), "read me").unwrap();
    let long = "C".repeat(100_000);
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":8,"method":"files/read","params":{{"_meta":{{"content":"{long}"}},"path":"r.txt"}}}}"#
    );
    let r = raw(&mut b, 8, line.as_bytes());
    assert_eq!(r["result"]["content"], "read me", "{r}");
    // And one whose `content` is unknown to it is refused as unknown, not written.
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"files/create","params":{{"path":"c.txt","content":"{long}"}}}}"#
    );
    let r = raw(&mut b, 9, line.as_bytes());
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert!(!root.join("c.txt").exists());
}

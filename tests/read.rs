//! `files/read` through the real binary, on real temp directories (docs/protocol.md §3, §4, §5.4).
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::path::PathBuf;

use base64::Engine;
use common::{Fsb, code, serve_policy, tempdir, uri_path};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A temp dir holding a root directory named `proj`.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    (t, root)
}

fn b64_decode(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("bad base64 from the broker ({e}): {s:?}"))
}

/// The bytes a `files/read` result carries, decoded according to its `encoding`.
fn decoded(r: &Value) -> Vec<u8> {
    let content = r["content"].as_str().expect("content is a string");
    match r["encoding"].as_str() {
        Some("utf-8") => content.as_bytes().to_vec(),
        Some("base64") => b64_decode(content),
        other => panic!("unexpected encoding {other:?} in {r}"),
    }
}

/// Reads `path` chunk by chunk (`length` per request, `encoding` if given), checking the
/// chunk invariants on the way; returns the reassembled bytes and every chunk's result.
fn read_in_chunks(
    b: &mut Fsb,
    path: &str,
    length: u64,
    encoding: Option<&str>,
) -> (Vec<u8>, Vec<Value>) {
    let mut out = Vec::new();
    let mut chunks = Vec::new();
    let mut offset = 0u64;
    loop {
        let mut params = json!({"path": path, "offset": offset, "length": length});
        if let Some(e) = encoding {
            params["encoding"] = json!(e);
        }
        // Hundreds of tiny chunks go past the default request rate (200/s, burst 400); a
        // client honours `retryAfterMs` and tries again, which must then succeed.
        let mut r = b.request("files/read", params.clone());
        let mut waits = 0;
        while r["error"]["data"]["code"] == "RATE_LIMITED" {
            let ms = r["error"]["data"]["retryAfterMs"]
                .as_u64()
                .expect("retryAfterMs");
            std::thread::sleep(std::time::Duration::from_millis(ms));
            waits += 1;
            assert!(waits < 3, "waiting retryAfterMs was not enough: {r}");
            r = b.request("files/read", params.clone());
        }
        assert!(r.get("error").is_none(), "{params}: {r}");
        let r = r["result"].clone();
        assert_eq!(r["offset"], json!(offset), "{r}");
        let bytes = decoded(&r);
        let len = r["length"].as_u64().expect("length");
        assert_eq!(
            bytes.len() as u64,
            len,
            "length must be the bytes covered: {r}"
        );
        assert!(len <= length, "chunk longer than asked: {r}");
        let size = r["size"].as_u64().expect("size");
        assert_eq!(r["eof"], json!(offset + len >= size), "{r}");
        out.extend_from_slice(&bytes);
        offset += len;
        let eof = r["eof"].as_bool().unwrap();
        chunks.push(r);
        if eof {
            break;
        }
        assert!(len > 0, "no progress and no eof: {:?}", chunks.last());
        assert!(chunks.len() < 100_000, "runaway chunking");
    }
    (out, chunks)
}

fn etag(b: &mut Fsb, path: &str) -> String {
    let r = b.ok("files/read", json!({"path": path}));
    r["etag"].as_str().expect("etag is a string").to_owned()
}

// ---------------------------------------------------------------------------------------------
// Fields and defaults
// ---------------------------------------------------------------------------------------------

#[test]
fn every_field_of_a_whole_small_file() {
    let (_t, root) = fixture();
    std::fs::write(root.join("hello.txt"), "hello, world\n").unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/read", json!({"path": "proj/hello.txt"}));
    assert_eq!(r["content"], "hello, world\n");
    assert_eq!(r["encoding"], "utf-8", "default encoding is utf-8");
    assert_eq!(r["size"], 13);
    assert_eq!(r["offset"], 0);
    assert_eq!(r["length"], 13);
    assert_eq!(r["eof"], true);
    assert_eq!(r["mimeType"], "text/plain");
    let etag = r["etag"].as_str().expect("etag is a string");
    assert!(!etag.is_empty());
    // Explicit defaults give the same answer.
    let r2 = b.ok(
        "files/read",
        json!({"path": "proj/hello.txt", "encoding": "utf-8", "offset": 0}),
    );
    assert_eq!(r2, r);
}

#[test]
fn empty_file() {
    let (_t, root) = fixture();
    std::fs::write(root.join("empty.txt"), "").unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/read", json!({"path": "proj/empty.txt"}));
    assert_eq!(r["content"], "");
    assert_eq!(r["encoding"], "utf-8");
    assert_eq!(r["size"], 0);
    assert_eq!(r["length"], 0);
    assert_eq!(r["eof"], true);
}

#[test]
fn default_length_is_chunk_size() {
    let (_t, root) = fixture();
    let text: String = (0..100)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    std::fs::write(root.join("t.txt"), &text).unwrap();
    let (_p, mut b) = serve_policy(&root, "", "chunk_size = 16\nmax_chunk_size = 64");
    let r = b.ok("files/read", json!({"path": "r/t.txt"}));
    assert_eq!(r["length"], 16);
    assert_eq!(r["content"], &text[..16]);
    assert_eq!(r["size"], 100);
    assert_eq!(r["eof"], false);
    // From an offset, still chunk_size.
    let r = b.ok("files/read", json!({"path": "r/t.txt", "offset": 90}));
    assert_eq!(r["length"], 10, "short last chunk");
    assert_eq!(r["content"], &text[90..]);
    assert_eq!(r["eof"], true);
}

#[test]
fn length_above_max_chunk_size_is_clamped() {
    let (_t, root) = fixture();
    let data: Vec<u8> = (0..200u32).map(|i| b'0' + (i % 10) as u8).collect();
    std::fs::write(root.join("t.txt"), &data).unwrap();
    let (_p, mut b) = serve_policy(&root, "", "chunk_size = 16\nmax_chunk_size = 64");
    let r = b.ok("files/read", json!({"path": "r/t.txt", "length": 1000}));
    assert_eq!(r["length"], 64);
    assert_eq!(r["content"].as_str().unwrap().as_bytes(), &data[..64]);
    assert_eq!(r["eof"], false);
    let r = b.ok(
        "files/read",
        json!({"path": "r/t.txt", "length": u64::MAX, "encoding": "base64"}),
    );
    assert_eq!(r["length"], 64);
    assert_eq!(b64_decode(r["content"].as_str().unwrap()), &data[..64]);
    // Below the maximum, the asked length is honoured.
    let r = b.ok("files/read", json!({"path": "r/t.txt", "length": 40}));
    assert_eq!(r["length"], 40);
    // Chunking with an oversized length still reassembles the file.
    let (all, chunks) = read_in_chunks(&mut b, "r/t.txt", 1000, None);
    assert_eq!(all, data);
    assert_eq!(chunks.len(), 4); // 64 + 64 + 64 + 8
}

// ---------------------------------------------------------------------------------------------
// Chunking
// ---------------------------------------------------------------------------------------------

#[test]
fn text_chunks_reassemble_exactly() {
    let (_t, root) = fixture();
    let text: String = (0..331).map(|i| format!("line {i}\n")).collect::<String>();
    std::fs::write(root.join("lines.txt"), &text).unwrap();
    let (_p, mut b) = Fsb::serve_root_unlimited(&root);
    for length in [1u64, 7, 64, 1000, 1 << 20] {
        let (all, chunks) = read_in_chunks(&mut b, "proj/lines.txt", length, None);
        assert_eq!(all, text.as_bytes(), "length {length}");
        for c in &chunks {
            assert_eq!(c["encoding"], "utf-8");
            assert_eq!(c["size"], text.len());
        }
        let expected = (text.len() as u64).div_ceil(length);
        assert_eq!(chunks.len() as u64, expected, "length {length}");
    }
}

#[test]
fn binary_chunks_reassemble_exactly_in_base64() {
    let (_t, root) = fixture();
    let data: Vec<u8> = (0..3_001u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("blob.bin"), &data).unwrap();
    let (_p, mut b) = Fsb::serve_root_unlimited(&root);
    for length in [1u64, 3, 1000, 4096, 5_000] {
        let (all, chunks) = read_in_chunks(&mut b, "proj/blob.bin", length, Some("base64"));
        assert_eq!(all, data, "length {length}");
        for c in &chunks {
            assert_eq!(c["encoding"], "base64");
        }
    }
    // Asked as utf-8 (the default), binary still reassembles (sent as base64).
    let (all, _) = read_in_chunks(&mut b, "proj/blob.bin", 777, None);
    assert_eq!(all, data);
}

#[test]
fn offset_past_the_end_is_empty_and_eof() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), "12345").unwrap();
    let mut b = Fsb::serve_root(&root);
    for offset in [5u64, 6, 1000, u64::MAX / 2] {
        let r = b.ok(
            "files/read",
            json!({"path": "proj/f.txt", "offset": offset}),
        );
        assert_eq!(r["content"], "", "offset {offset}: {r}");
        assert_eq!(r["length"], 0);
        assert_eq!(r["eof"], true);
        assert_eq!(r["size"], 5);
        assert_eq!(r["offset"], offset);
        let r = b.ok(
            "files/read",
            json!({"path": "proj/f.txt", "offset": offset, "encoding": "base64"}),
        );
        assert_eq!(r["content"], "");
        assert_eq!(r["eof"], true);
    }
    // The last byte exactly.
    let r = b.ok("files/read", json!({"path": "proj/f.txt", "offset": 4}));
    assert_eq!(r["content"], "5");
    assert_eq!(r["eof"], true);
}

#[test]
fn utf8_chunks_never_split_a_character() {
    let (_t, root) = fixture();
    // 1-, 2-, 3- and 4-byte characters in every alignment.
    let unit = "aé€😀bü中🎉ñ";
    let text: String = (0..50)
        .map(|i| format!("{}{unit}", "x".repeat(i % 4)))
        .collect();
    std::fs::write(root.join("u.txt"), &text).unwrap();
    let (_p, mut b) = Fsb::serve_root_unlimited(&root);
    // With room for at least one whole character, every chunk is utf-8 and ends on a
    // character boundary.
    for length in 4u64..=13 {
        let (all, chunks) = read_in_chunks(&mut b, "proj/u.txt", length, None);
        assert_eq!(all, text.as_bytes(), "length {length}");
        let mut offset = 0usize;
        for c in &chunks {
            assert_eq!(c["encoding"], "utf-8", "length {length}: {c}");
            let s = c["content"].as_str().unwrap();
            assert!(
                text.is_char_boundary(offset),
                "chunk starts inside a char: {c}"
            );
            offset += s.len();
            assert!(
                text.is_char_boundary(offset),
                "chunk ends inside a char: {c}"
            );
        }
    }
    // A precise case: "ab€" asked 3 bytes → "ab" (length 2), the next chunk starts at 2.
    std::fs::write(root.join("e.txt"), "ab€").unwrap();
    let r = b.ok("files/read", json!({"path": "proj/e.txt", "length": 3}));
    assert_eq!(r["content"], "ab");
    assert_eq!(r["length"], 2);
    assert_eq!(r["eof"], false);
    assert_eq!(r["encoding"], "utf-8");
    let r = b.ok(
        "files/read",
        json!({"path": "proj/e.txt", "offset": 2, "length": 3}),
    );
    assert_eq!(r["content"], "€");
    assert_eq!(r["length"], 3);
    assert_eq!(r["eof"], true);
    // A 4-byte character cut after 1, 2 and 3 of its bytes.
    std::fs::write(root.join("emoji.txt"), "z😀z").unwrap();
    for length in 2..=4u64 {
        let r = b.ok(
            "files/read",
            json!({"path": "proj/emoji.txt", "length": length}),
        );
        assert_eq!(r["content"], "z", "length {length}");
        assert_eq!(r["length"], 1);
        assert_eq!(r["encoding"], "utf-8");
    }
}

#[test]
fn non_utf8_bytes_come_back_as_base64() {
    let (_t, root) = fixture();
    let data = b"ab\xff\xfecd\x80".to_vec();
    std::fs::write(root.join("latin.txt"), &data).unwrap();
    let mut b = Fsb::serve_root(&root);
    for params in [
        json!({"path": "proj/latin.txt"}),
        json!({"path": "proj/latin.txt", "encoding": "utf-8"}),
    ] {
        let r = b.ok("files/read", params);
        assert_eq!(r["encoding"], "base64", "{r}");
        assert_eq!(b64_decode(r["content"].as_str().unwrap()), data);
        assert_eq!(r["length"], data.len());
        assert_eq!(r["size"], data.len());
        assert_eq!(r["eof"], true);
    }
    // A UTF-8 file truncated inside a character at end of file is not UTF-8 either.
    std::fs::write(root.join("cut.txt"), &"a€".as_bytes()[..3]).unwrap();
    let r = b.ok("files/read", json!({"path": "proj/cut.txt"}));
    assert_eq!(r["encoding"], "base64");
    assert_eq!(
        b64_decode(r["content"].as_str().unwrap()),
        &"a€".as_bytes()[..3]
    );
}

#[test]
fn explicit_base64_round_trips_every_byte_value() {
    let (_t, root) = fixture();
    let data: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
    std::fs::write(root.join("all.bin"), &data).unwrap();
    std::fs::write(root.join("text.txt"), "plain text").unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok(
        "files/read",
        json!({"path": "proj/all.bin", "encoding": "base64"}),
    );
    assert_eq!(r["encoding"], "base64");
    assert_eq!(r["size"], 512);
    assert_eq!(r["length"], 512);
    assert_eq!(r["eof"], true);
    assert_eq!(b64_decode(r["content"].as_str().unwrap()), data);
    // Padding is standard.
    assert_eq!(
        r["content"].as_str().unwrap(),
        base64::engine::general_purpose::STANDARD.encode(&data)
    );
    // Text asked as base64 stays base64.
    let r = b.ok(
        "files/read",
        json!({"path": "proj/text.txt", "encoding": "base64"}),
    );
    assert_eq!(r["encoding"], "base64");
    assert_eq!(b64_decode(r["content"].as_str().unwrap()), b"plain text");
    // Encoding names are not case-sensitive and `utf8` is accepted.
    for name in ["BASE64", "Base64"] {
        let r = b.ok(
            "files/read",
            json!({"path": "proj/text.txt", "encoding": name}),
        );
        assert_eq!(r["encoding"], "base64");
    }
    for name in ["UTF-8", "utf8"] {
        let r = b.ok(
            "files/read",
            json!({"path": "proj/text.txt", "encoding": name}),
        );
        assert_eq!(r["encoding"], "utf-8");
        assert_eq!(r["content"], "plain text");
    }
}

// ---------------------------------------------------------------------------------------------
// mimeType and etag
// ---------------------------------------------------------------------------------------------

#[test]
fn mime_type_from_extension_and_sniff() {
    let (_t, root) = fixture();
    std::fs::write(root.join("a.json"), "{}").unwrap();
    std::fs::write(root.join("a.png"), b"\x89PNG\r\n\x1a\n").unwrap();
    std::fs::write(root.join("a.rs"), "fn main() {}\n").unwrap();
    std::fs::write(root.join("a.txt"), "text").unwrap();
    std::fs::write(root.join("a.html"), "<p>").unwrap();
    std::fs::write(root.join("README"), "just some words\n").unwrap();
    std::fs::write(root.join("blob"), b"\x00\x01\x02\x03binary").unwrap();
    // Binary at the start, text later: every chunk reports the same type.
    let mut mixed = vec![0u8, 1, 2, 3];
    mixed.extend_from_slice(b"only text after the first bytes");
    std::fs::write(root.join("mixed"), &mixed).unwrap();
    let mut b = Fsb::serve_root(&root);
    let cases = [
        ("proj/a.json", "application/json"),
        ("proj/a.png", "image/png"),
        ("proj/a.rs", "text/x-rust"),
        ("proj/a.txt", "text/plain"),
        ("proj/a.html", "text/html"),
        ("proj/README", "text/plain"),
        ("proj/blob", "application/octet-stream"),
        ("proj/mixed", "application/octet-stream"),
    ];
    for (path, mime) in cases {
        let r = b.ok("files/read", json!({"path": path}));
        assert_eq!(r["mimeType"], mime, "{path}");
    }
    let r = b.ok("files/read", json!({"path": "proj/mixed", "offset": 4}));
    assert_eq!(r["encoding"], "utf-8");
    assert_eq!(r["mimeType"], "application/octet-stream");
    let r = b.ok(
        "files/read",
        json!({"path": "proj/README", "offset": 5, "length": 3}),
    );
    assert_eq!(r["mimeType"], "text/plain");
}

#[test]
fn etag_is_stable_and_changes_with_the_file() {
    let (_t, root) = fixture();
    let f = root.join("e.txt");
    std::fs::write(&f, "hello world").unwrap();
    let mut b = Fsb::serve_root(&root);
    let p = "proj/e.txt";

    let e1 = etag(&mut b, p);
    let e2 = etag(&mut b, p);
    assert_eq!(e1, e2, "etag must be stable while the file is unchanged");
    // A chunk of the file carries the file's etag, not the chunk's.
    let r = b.ok("files/read", json!({"path": p, "offset": 3, "length": 2}));
    assert_eq!(r["etag"], e1);

    // Same-size rewrite in place (same inode, same size).
    {
        let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all(b"HELLO WORLD").unwrap();
    }
    let r = b.ok("files/read", json!({"path": p}));
    assert_eq!(r["content"], "HELLO WORLD");
    let e3 = r["etag"].as_str().unwrap().to_owned();
    assert_ne!(e3, e2, "same-size in-place rewrite must change the etag");
    assert_eq!(etag(&mut b, p), e3);

    // Size change.
    std::fs::write(&f, "hello").unwrap();
    let e4 = etag(&mut b, p);
    assert_ne!(e4, e3);

    // Same-size rewrite whose modification time is then set back.
    let mtime = std::fs::metadata(&f).unwrap().modified().unwrap();
    {
        let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
        w.write_all(b"jello").unwrap();
        w.set_modified(mtime).unwrap();
    }
    assert_eq!(std::fs::metadata(&f).unwrap().modified().unwrap(), mtime);
    let e5 = etag(&mut b, p);
    assert_ne!(
        e5, e4,
        "a rewrite hidden behind a restored mtime must change the etag"
    );

    // Replaced by rename with identical content and size.
    let tmp = root.join("e.txt.tmp");
    std::fs::write(&tmp, "jello").unwrap();
    std::fs::rename(&tmp, &f).unwrap();
    let r = b.ok("files/read", json!({"path": p}));
    assert_eq!(r["content"], "jello");
    let e6 = r["etag"].as_str().unwrap().to_owned();
    assert_ne!(e6, e5, "an atomic replace must change the etag");

    // Deleted and recreated.
    std::fs::remove_file(&f).unwrap();
    std::fs::write(&f, "jello").unwrap();
    let e7 = etag(&mut b, p);
    assert_ne!(e7, e6);
    assert_eq!(etag(&mut b, p), e7);
}

// ---------------------------------------------------------------------------------------------
// Path forms
// ---------------------------------------------------------------------------------------------

#[test]
fn all_four_path_forms_read_the_same_file() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("sub dir")).unwrap();
    let name = "a b é 中.txt";
    std::fs::write(root.join("sub dir").join(name), "same file").unwrap();
    let abs = root.join("sub dir").join(name);
    let mut b = Fsb::serve_root(&root);
    let forms = [
        format!("proj/sub dir/{name}"),
        abs.to_str().unwrap().to_owned(),
        format!("file://{}", uri_path(&abs)),
        format!("file://localhost{}", uri_path(&abs)),
        format!("sub dir/{name}"),
        format!("./sub dir/{name}"),
        format!("proj/sub dir/../sub dir/{name}"),
    ];
    let uri = &forms[2];
    assert!(uri.contains("%20") && uri.contains("%C3%A9"), "{uri}");
    let mut etags = Vec::new();
    for path in &forms {
        let r = b.ok("files/read", json!({"path": path}));
        assert_eq!(r["content"], "same file", "{path}");
        assert_eq!(r["size"], 9);
        etags.push(r["etag"].clone());
    }
    assert!(etags.windows(2).all(|w| w[0] == w[1]), "{etags:?}");
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_file_is_file_not_found() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    for path in ["proj/nope.txt", "proj/no/such/dir/file", "nope.txt"] {
        let e = b.err("files/read", json!({"path": path}));
        assert_eq!(e["code"], -31001, "{path}: {e}");
        assert_eq!(code(&e), "FILE_NOT_FOUND");
        assert_eq!(e["data"]["path"], path);
        assert!(e["message"].is_string());
    }
}

#[test]
fn directory_is_invalid_path() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("d")).unwrap();
    let mut b = Fsb::serve_root(&root);
    for path in ["proj/d", "proj", "d"] {
        let e = b.err("files/read", json!({"path": path}));
        assert_eq!(e["code"], -31003, "{path}: {e}");
        assert_eq!(code(&e), "INVALID_PATH");
    }
}

#[test]
fn fifo_fails_at_once() {
    let (_t, root) = fixture();
    let status = std::process::Command::new("mkfifo")
        .arg(root.join("pipe"))
        .status()
        .expect("run mkfifo");
    assert!(status.success());
    let mut b = Fsb::serve_root(&root);
    let e = b.err("files/read", json!({"path": "proj/pipe"}));
    let c = code(&e);
    assert!(c == "INVALID_PATH" || c == "IO_ERROR", "{e}");
    // And the session is fine.
    assert_eq!(b.ok("ping", json!({})), json!({}));
}

#[test]
fn bad_params_are_invalid_params() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), "x").unwrap();
    let mut b = Fsb::serve_root(&root);
    let bad = [
        json!({"path": "proj/f.txt", "encoding": "utf-16"}),
        json!({"path": "proj/f.txt", "encoding": "latin1"}),
        json!({"path": "proj/f.txt", "encoding": ""}),
        json!({"path": "proj/f.txt", "encoding": 7}),
        json!({"path": 5}),
        json!({"path": null}),
        json!({"path": ["proj/f.txt"]}),
        json!({"path": "proj/f.txt", "offset": "3"}),
        json!({"path": "proj/f.txt", "offset": -1}),
        json!({"path": "proj/f.txt", "offset": 1.5}),
        json!({"path": "proj/f.txt", "length": "10"}),
        json!({"path": "proj/f.txt", "length": -10}),
        json!({"path": "proj/f.txt", "length": true}),
        json!({"path": "proj/f.txt", "lenght": 10}),
        json!({"path": "proj/f.txt", "Path": "proj/f.txt"}),
        json!({"encoding": "utf-8"}),
        json!({}),
    ];
    for params in bad {
        let e = b.err("files/read", params.clone());
        assert_eq!(e["code"], -32602, "{params}: {e}");
        // The session goes on.
        let r = b.ok("files/read", json!({"path": "proj/f.txt"}));
        assert_eq!(r["content"], "x");
    }
    // Absent params are `{}`: a missing path.
    let id = b.send_raw_request(r#"{"jsonrpc":"2.0","id":"np","method":"files/read"}"#);
    let resp = b.read_message();
    assert_eq!(resp["id"], id);
    assert_eq!(resp["error"]["code"], -32602, "{resp}");
}

#[test]
fn meta_param_is_accepted() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), "meta").unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok(
        "files/read",
        json!({"path": "proj/f.txt", "_meta": {"progressToken": "tok-1", "x": [1, 2]}}),
    );
    assert_eq!(r["content"], "meta");
    let r = b.ok("files/read", json!({"path": "proj/f.txt", "_meta": {}}));
    assert_eq!(r["content"], "meta");
}

#[test]
fn bad_paths() {
    let (_t, root) = fixture();
    let mut b = Fsb::serve_root(&root);
    for path in ["", "proj/a\0b"] {
        let e = b.err("files/read", json!({"path": path}));
        assert_eq!(code(&e), "INVALID_PATH", "{path:?}: {e}");
        assert_eq!(e["code"], -31003);
    }
    for path in ["../etc/passwd", "/etc/passwd", "file:///etc/passwd"] {
        let e = b.err("files/read", json!({"path": path}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{path:?}: {e}");
        assert_eq!(e["code"], -31002);
    }
}

/// Extension trait so a test can send one hand-written request line and get its id back.
trait RawRequest {
    fn send_raw_request(&mut self, line: &str) -> Value;
}

impl RawRequest for Fsb {
    fn send_raw_request(&mut self, line: &str) -> Value {
        let v: Value = serde_json::from_str(line).unwrap();
        self.send_raw(format!("{line}\n").as_bytes());
        v["id"].clone()
    }
}

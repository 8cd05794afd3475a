//! The integrity extension through the real binary, on real temp directories
//! (docs/protocol.md §5.4, §5.5, §5.13): `sha256` on `files/read` and `files/write`, and
//! `files/checksum`. Every expected hash comes from `sha256sum` (coreutils), run on the bytes
//! the test itself holds, never from the code under test.
//!
//! - A read's `sha256` is the hash of exactly the bytes of that answer, for every chunk size
//!   (both the small path and the one that encodes large base64 chunks into pages), in base64
//!   and UTF-8, including a UTF-8 chunk shortened to a character boundary.
//! - `files/checksum` of a file or a range is `sha256sum` of those bytes; of a range past the
//!   end, of the empty input.
//! - An upload whose final chunk carries the right hash commits (announced on the first chunk,
//!   or not); one where a chunk was corrupted on its way is `CHECKSUM_MISMATCH`, commits
//!   nothing (the old file stays, no staging file is left), and the session goes on. The same
//!   for a one-shot replace.
//! - An announced upload's hash follows the file's order when its chunks are all in flight
//!   (the broker hashes one chunk while it writes the next).
//! - A `sha256` where it cannot mean anything is a clear `-32602`.

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the library's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine;
use common::{Fsb, code, serve_policy, tempdir};
use serde_json::{Value, json};

const RW: &str = "mode = \"read-write\"";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn b64_decode(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("bad base64 from the broker ({e})"))
}

/// `sha256sum` of `bytes`, fed on its stdin.
fn sha256sum(bytes: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run sha256sum (coreutils)");
    let mut stdin = child.stdin.take().expect("its stdin");
    let input = bytes.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("sha256sum's output");
    feeder.join().expect("the feeder").expect("feed sha256sum");
    assert!(out.status.success(), "sha256sum failed");
    let text = String::from_utf8(out.stdout).expect("UTF-8 from sha256sum");
    text.split_whitespace().next().expect("a digest").to_owned()
}

/// A root `r` at `base/proj`, served read-write, with `limits` in `[limits]`.
fn served(limits: &str) -> (tempfile::TempDir, PathBuf, Fsb, tempfile::TempDir) {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    let (policy_dir, b) = serve_policy(&root, RW, limits);
    (t, root, b, policy_dir)
}

/// Bytes that are neither all one value nor periodic at any chunk size used here.
fn pattern(len: usize) -> Vec<u8> {
    common::pattern(len, 0x1234_5678)
}

/// Staging files (`.NAME.fsbroker-….part`) left in `dir`.
fn staging_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".fsbroker-"))
        .collect()
}

/// Rule: a read's `sha256` is the hash of exactly the bytes that answer carries, for every
/// chunk size (the small path, and the one that encodes large base64 chunks into pages), and
/// the chunks' bytes put together are the file.
#[test]
fn a_reads_hash_is_the_hash_of_its_bytes_at_every_chunk_size() {
    let (_t, root, mut b, _p) = served("requests_per_second = 0\nmax_chunk_size = 4194304");
    let file = pattern(3 * 1024 * 1024 + 17);
    std::fs::write(root.join("data.bin"), &file).unwrap();
    for chunk in [1usize, 1000, 65_536, 262_144, 300_000, 1 << 20, 3 << 20] {
        let mut got = Vec::new();
        let mut chunks = 0;
        loop {
            let r = b.ok(
                "files/read",
                json!({"path": "data.bin", "encoding": "base64", "offset": got.len(),
                       "length": chunk, "sha256": true}),
            );
            let bytes = b64_decode(r["content"].as_str().unwrap());
            assert_eq!(r["length"], bytes.len(), "chunk {chunk}");
            assert_eq!(
                r["sha256"].as_str(),
                Some(sha256sum(&bytes).as_str()),
                "chunk {chunk} at offset {}",
                got.len()
            );
            got.extend_from_slice(&bytes);
            chunks += 1;
            if r["eof"] == true || chunks > 4000 {
                break;
            }
            // A 1-byte chunk size would take 3 million requests: a few are enough.
            if chunk == 1 && chunks == 64 {
                break;
            }
        }
        if chunk > 1 {
            assert_eq!(
                got, file,
                "chunk {chunk}: the chunks put together are the file"
            );
        }
    }
    // Without the field, no hash (nothing is computed).
    let r = b.ok("files/read", json!({"path": "data.bin", "length": 10}));
    assert!(r.get("sha256").is_none(), "{r}");
}

/// Rule: in UTF-8, the hash covers the chunk as sent: shortened to the last whole character.
#[test]
fn a_utf8_chunks_hash_covers_the_shortened_chunk() {
    let (_t, root, mut b, _p) = served("");
    let text = "aé€😀".repeat(100);
    std::fs::write(root.join("t.txt"), &text).unwrap();
    let r = b.ok(
        "files/read",
        json!({"path": "t.txt", "length": 5, "sha256": true}),
    );
    assert_eq!(r["encoding"], "utf-8", "{r}");
    let content = r["content"].as_str().unwrap();
    assert_eq!(content, "aé", "shortened to a character boundary: {r}");
    assert_eq!(r["length"], 3);
    assert_eq!(r["sha256"].as_str(), Some(sha256sum(b"a\xc3\xa9").as_str()));
}

/// Rule: `files/checksum` gives `sha256sum` of the whole file or of a range, without the
/// content; past the end it covers nothing (the empty input's hash); only `sha256` is
/// offered; it is refused outside the roots and on a directory, as a read is.
#[test]
fn checksum_of_a_file_or_a_range_matches_sha256sum() {
    let (_t, root, mut b, _p) =
        served("requests_per_second = 0\nmax_chunk_size = 65536\nchunk_size = 65536");
    let file = pattern(5 * 1024 * 1024 + 3);
    std::fs::write(root.join("big.bin"), &file).unwrap();
    // The whole file, far beyond max_chunk_size: nothing of it is sent.
    let r = b.ok("files/checksum", json!({"path": "big.bin"}));
    assert_eq!(r["algorithm"], "sha256");
    assert_eq!(r["sha256"].as_str(), Some(sha256sum(&file).as_str()));
    assert_eq!(r["size"], file.len());
    assert_eq!(r["length"], file.len());
    assert_eq!(r["eof"], true);
    assert!(r["etag"].is_string(), "{r}");
    assert!(r.get("content").is_none(), "{r}");
    // A range.
    let r = b.ok(
        "files/checksum",
        json!({"path": "big.bin", "offset": 1000, "length": 2_000_000, "algorithm": "SHA256"}),
    );
    assert_eq!(
        r["sha256"].as_str(),
        Some(sha256sum(&file[1000..2_001_000]).as_str())
    );
    assert_eq!(r["length"], 2_000_000);
    assert_eq!(r["eof"], false);
    // A range running past the end covers what is there.
    let r = b.ok(
        "files/checksum",
        json!({"path": "big.bin", "offset": file.len() - 10, "length": 100}),
    );
    assert_eq!(
        r["sha256"].as_str(),
        Some(sha256sum(&file[file.len() - 10..]).as_str())
    );
    assert_eq!(r["length"], 10);
    let r = b.ok(
        "files/checksum",
        json!({"path": "big.bin", "offset": file.len() + 5}),
    );
    assert_eq!(r["sha256"].as_str(), Some(sha256sum(b"").as_str()));
    assert_eq!(r["length"], 0);

    let e = b.err(
        "files/checksum",
        json!({"path": "big.bin", "algorithm": "md5"}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("only \"sha256\""),
        "{e}"
    );
    let e = b.err("files/checksum", json!({"path": "/etc/passwd"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    std::fs::create_dir(root.join("dir")).unwrap();
    let e = b.err("files/checksum", json!({"path": "dir"}));
    assert_eq!(code(&e), "INVALID_PATH", "{e}");
    let e = b.err(
        "files/checksum",
        json!({"path": "big.bin", "content": true}),
    );
    assert_eq!(e["code"], -32602, "unknown fields are refused: {e}");
}

/// Sends an upload of `chunks` to `path`, the first with `first_sha` (if any) and the final
/// with `final_sha` (if any); returns the final chunk's answer (result or error).
fn upload(
    b: &mut Fsb,
    path: &str,
    chunks: &[Vec<u8>],
    first_sha: Option<Value>,
    final_sha: Option<&str>,
) -> Value {
    let mut offset = 0usize;
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let mut params = json!({"path": path, "content": b64(c), "encoding": "base64",
                                "offset": offset, "final": last});
        if i == 0 {
            if let Some(v) = &first_sha {
                params["sha256"] = v.clone();
            }
        }
        if last {
            if let Some(h) = final_sha {
                params["sha256"] = json!(h);
            }
            return b.request("files/write", params);
        }
        b.ok("files/write", params);
        offset += c.len();
    }
    unreachable!("no chunks")
}

/// Rule: an upload whose final chunk carries the SHA-256 of everything sent commits, whether
/// the first chunk announced it (hashed as the chunks came) or not (hashed from what was
/// staged); its answer repeats the hash. One whose bytes were corrupted on the way (here: a
/// chunk sent with one byte changed, the hash being of what the client meant to send) is
/// `CHECKSUM_MISMATCH` naming both hashes: nothing is committed (the old file is intact, no
/// staging file is left), and the session goes on.
#[test]
fn an_upload_commits_only_with_the_hash_of_what_arrived() {
    let (_t, root, mut b, _p) = served("requests_per_second = 0\nmax_chunk_size = 1048576");
    let whole = pattern(3 * 1024 * 1024 + 100);
    let chunks: Vec<Vec<u8>> = whole.chunks(1 << 20).map(<[u8]>::to_vec).collect();
    let right = sha256sum(&whole);

    for announce in [Some(json!(true)), None] {
        let name = format!("up-{}.bin", announce.is_some());
        let r = upload(&mut b, &name, &chunks, announce.clone(), Some(&right));
        assert_eq!(
            r["result"]["sha256"].as_str(),
            Some(right.as_str()),
            "announced {announce:?}: {r}"
        );
        assert_eq!(std::fs::read(root.join(&name)).unwrap(), whole);
    }

    // Corrupted on the way: the second chunk arrives with one byte changed.
    std::fs::write(root.join("keep.bin"), b"the old content").unwrap();
    for announce in [Some(json!(true)), None] {
        let mut sent = chunks.clone();
        sent[1][12345] ^= 0x40;
        let r = upload(&mut b, "keep.bin", &sent, announce.clone(), Some(&right));
        let e = &r["error"];
        assert_eq!(code(e), "CHECKSUM_MISMATCH", "announced {announce:?}: {r}");
        assert_eq!(e["code"], -31010, "{r}");
        assert_eq!(e["data"]["path"], "keep.bin", "{r}");
        let reason = e["data"]["reason"].as_str().unwrap();
        assert!(reason.contains(&right), "names the hash given: {reason}");
        let actual = sha256sum(&sent.concat());
        assert!(
            reason.contains(&actual),
            "names the hash of what came: {reason}"
        );
        assert!(reason.contains("nothing was written"), "{reason}");
        assert_eq!(
            std::fs::read(root.join("keep.bin")).unwrap(),
            b"the old content",
            "the old file is intact"
        );
        assert_eq!(staging_files(&root), Vec::<String>::new());
        // The upload ended: a chunk after it has no upload to go to.
        let e = b.err(
            "files/write",
            json!({"path": "keep.bin", "content": "", "offset": whole.len(), "final": true}),
        );
        assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    }
    // The session goes on, and the path takes a good upload.
    let r = upload(&mut b, "keep.bin", &chunks, Some(json!(true)), Some(&right));
    assert_eq!(r["result"]["size"], whole.len(), "{r}");
    assert_eq!(std::fs::read(root.join("keep.bin")).unwrap(), whole);
}

/// Rule: the hash of an announced upload follows the file's order when its chunks are sent
/// without waiting for their answers, as the broker hashes one chunk while it writes the next.
/// Chunks of very unequal sizes (a large one, whose hashing takes longest, before small ones
/// that could overtake it) all in flight: the final answer repeats `sha256sum` of the file,
/// and the file is the bytes sent.
#[test]
fn a_pipelined_uploads_hash_follows_the_files_order() {
    let (_t, root, mut b, _p) = served("requests_per_second = 0\nmax_chunk_size = 4194304");
    let sizes: Vec<usize> = (0..40)
        .map(|i| match i % 4 {
            0 => 3 << 20,
            1 => 1,
            2 => 70_000,
            _ => 4096 + i,
        })
        .collect();
    let whole = pattern(sizes.iter().sum());
    let right = sha256sum(&whole);
    for round in 0..3 {
        let name = format!("piped-{round}.bin");
        let mut offset = 0usize;
        let mut ids = Vec::new();
        for (i, &len) in sizes.iter().enumerate() {
            let last = i + 1 == sizes.len();
            let mut params = json!({"path": name, "content": b64(&whole[offset..offset + len]),
                                    "encoding": "base64", "offset": offset, "final": last});
            if i == 0 {
                params["sha256"] = json!(true);
                b.ok("files/write", params);
            } else {
                if last {
                    params["sha256"] = json!(right);
                }
                ids.push(b.send("files/write", params));
            }
            offset += len;
        }
        let answers: Vec<Value> = ids.iter().map(|&id| b.response(id)).collect();
        for (i, a) in answers.iter().enumerate() {
            assert!(
                a.get("result").is_some(),
                "round {round}, chunk {}: {a}",
                i + 1
            );
        }
        let last = &answers[answers.len() - 1]["result"];
        assert_eq!(
            last["sha256"].as_str(),
            Some(right.as_str()),
            "round {round}: {last}"
        );
        assert_eq!(last["size"], whole.len(), "round {round}");
        assert!(
            std::fs::read(root.join(&name)).unwrap() == whole,
            "round {round}: the file differs"
        );
    }
    assert_eq!(staging_files(&root), Vec::<String>::new());
}

/// Rule: a one-shot write (no `offset`) with the right `sha256` commits and repeats it; with
/// a wrong one it is `CHECKSUM_MISMATCH` and the file is not touched (nor created). Hex in
/// either case is accepted.
#[test]
fn a_replace_commits_only_with_the_hash_of_its_content() {
    let (_t, root, mut b, _p) = served("");
    let content = b"new content\n";
    let right = sha256sum(content);
    let r = b.ok(
        "files/write",
        json!({"path": "a.txt", "content": "new content\n", "sha256": right.to_ascii_uppercase()}),
    );
    assert_eq!(r["sha256"].as_str(), Some(right.as_str()), "{r}");
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), content);

    let wrong = sha256sum(b"something else");
    let e = b.err(
        "files/write",
        json!({"path": "a.txt", "content": "changed", "sha256": wrong}),
    );
    assert_eq!(code(&e), "CHECKSUM_MISMATCH", "{e}");
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), content);
    let e = b.err(
        "files/write",
        json!({"path": "new.txt", "content": "x", "sha256": wrong}),
    );
    assert_eq!(code(&e), "CHECKSUM_MISMATCH", "{e}");
    assert!(!root.join("new.txt").exists());
    assert_eq!(staging_files(&root), Vec::<String>::new());
}

/// Rule: a `sha256` that cannot mean anything where it is is `-32602` with a reason, before
/// anything is written: `true` on a write that commits at once, `true` on a chunk after the
/// first, a hash on a chunk that is not final, something that is not 64 hex digits, a number.
#[test]
fn a_misplaced_or_malformed_hash_is_a_clear_error() {
    let (_t, root, mut b, _p) = served("");
    let hex = sha256sum(b"x");
    let cases = [
        (
            json!({"path": "f", "content": "x", "sha256": true}),
            "give the hash itself",
        ),
        (
            json!({"path": "f", "content": "x", "offset": 0, "sha256": true}),
            "give the hash itself",
        ),
        (
            json!({"path": "f", "content": "x", "offset": 0, "final": false, "sha256": hex}),
            "goes on its final chunk",
        ),
        (
            json!({"path": "f", "content": "x", "sha256": "abc"}),
            "64 hex digits",
        ),
        (
            json!({"path": "f", "content": "x", "sha256": "z".repeat(64)}),
            "64 hex digits",
        ),
        (
            json!({"path": "f", "content": "x", "sha256": 7}),
            "true or 64 hex digits",
        ),
    ];
    for (params, says) in cases {
        let e = b.err("files/write", params.clone());
        assert_eq!(e["code"], -32602, "{params}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(says), "{params}: {message}");
    }
    // `true` past the first chunk.
    b.ok(
        "files/write",
        json!({"path": "f", "content": "x", "offset": 0, "final": false}),
    );
    let e = b.err(
        "files/write",
        json!({"path": "f", "content": "y", "offset": 1, "final": false, "sha256": true}),
    );
    assert_eq!(e["code"], -32602, "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("first chunk"),
        "{e}"
    );
    assert!(!root.join("f").exists(), "nothing was committed");
}

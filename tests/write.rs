//! `files/write`, `files/create`, `files/delete` and `files/rename` through the real binary,
//! on real temp directories (docs/protocol.md §2 limits, §4 errors, §5).
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine;
use common::{Fsb, PolicyToml, RootToml, code, serve_policy, tempdir, with_deadline};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

const RW: &str = "mode = \"read-write\"";

/// A temp dir holding a root directory named `proj`.
fn fixture() -> (tempfile::TempDir, PathBuf) {
    let (t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir(&root).unwrap();
    (t, root)
}

/// `root` served read-write as the root `r`, default limits.
fn rw(root: &Path) -> (tempfile::TempDir, Fsb) {
    serve_policy(root, RW, "")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn b64_decode(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("bad base64 from the broker ({e}): {s:?}"))
}

/// Reads a whole file through `files/read` (base64, chunk by chunk); returns its bytes and the
/// last chunk's `etag`.
fn read_back(b: &mut Fsb, path: &str) -> (Vec<u8>, String) {
    let mut out = Vec::new();
    loop {
        let r = b.ok(
            "files/read",
            json!({"path": path, "encoding": "base64", "offset": out.len()}),
        );
        assert_eq!(r["encoding"], "base64", "{r}");
        out.extend(b64_decode(r["content"].as_str().expect("content")));
        if r["eof"] == json!(true) {
            let etag = r["etag"].as_str().expect("etag").to_owned();
            assert_eq!(r["size"], json!(out.len()), "{r}");
            return (out, etag);
        }
    }
}

/// Every fsbroker staging file beneath `dir` (recursively, symlinks not followed).
fn staging_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(".fsbroker-") {
                found.push(e.path());
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

fn assert_no_staging(dir: &Path) {
    let left = staging_files(dir);
    assert!(left.is_empty(), "staging files left behind: {left:?}");
}

/// Everything beneath `dir`: relative path → what it is (file content, link target, dir).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("link -> {}", std::fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", meta.mode() & 0o7777)
            } else {
                format!(
                    "file {:o} {:?}",
                    meta.mode() & 0o7777,
                    std::fs::read(&p).unwrap()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// The error's numeric code.
fn num(e: &Value) -> i64 {
    e["code"].as_i64().unwrap_or_else(|| panic!("no code: {e}"))
}

/// Deterministic pseudo-random bytes (the kit's generator), so failures reproduce.
fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    common::kit::Rng::new(seed).bytes(len)
}

/// The mode a new file gets here: `0o666 & !umask`, learned by creating one with std
/// (the broker inherits this process's umask).
fn new_file_mode(dir: &Path) -> u32 {
    let probe = dir.join("umask-probe");
    std::fs::File::create(&probe).unwrap();
    let mode = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o7777;
    std::fs::remove_file(&probe).unwrap();
    mode
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A policy serving each `(dir, name)` read-write with consent auto.
fn serve_roots(roots: &[(&Path, &str)]) -> (tempfile::TempDir, Fsb) {
    let (t, dir) = tempdir();
    let mut policy = PolicyToml::new();
    for (path, name) in roots {
        policy = policy.root(RootToml::at(path).name(name).rw());
    }
    let policy = policy.write_to(&dir.join("policy.toml"));
    let b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    (t, b)
}

/// Sends one upload chunk.
fn chunk(b: &mut Fsb, path: &str, offset: usize, data: &[u8], last: bool) -> Value {
    b.request(
        "files/write",
        json!({"path": path, "content": b64(data), "encoding": "base64",
               "offset": offset, "final": last}),
    )
}

// ---------------------------------------------------------------------------------------------
// files/write: fields and defaults
// ---------------------------------------------------------------------------------------------

#[test]
fn write_result_fields_and_etag_match_read() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);

    let r = b.ok(
        "files/write",
        json!({"path": "r/a.txt", "content": "hello"}),
    );
    assert_eq!(r["bytesWritten"], 5, "{r}");
    assert_eq!(r["size"], 5, "{r}");
    let etag = r["etag"].as_str().expect("etag is a string").to_owned();
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"hello");

    let read = b.ok("files/read", json!({"path": "r/a.txt"}));
    assert_eq!(read["content"], "hello");
    assert_eq!(read["etag"], json!(etag), "write's etag must equal read's");

    // A replace with shorter content: size is the new file's.
    let r2 = b.ok("files/write", json!({"path": "r/a.txt", "content": "hi"}));
    assert_eq!(r2["bytesWritten"], 2);
    assert_eq!(r2["size"], 2);
    assert_ne!(r2["etag"], json!(etag), "etag must change on a write");
    let (bytes, etag2) = read_back(&mut b, "r/a.txt");
    assert_eq!(bytes, b"hi");
    assert_eq!(r2["etag"], json!(etag2));

    // An empty write makes an empty file.
    let r3 = b.ok("files/write", json!({"path": "r/empty", "content": ""}));
    assert_eq!(r3["bytesWritten"], 0);
    assert_eq!(r3["size"], 0);
    assert_eq!(std::fs::read(root.join("empty")).unwrap(), b"");
    assert_no_staging(&root);
}

#[test]
fn default_encoding_is_utf8() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    // Valid base64, but without `encoding` it is text, written as is.
    let r = b.ok("files/write", json!({"path": "r/t.txt", "content": "aGk="}));
    assert_eq!(r["bytesWritten"], 4);
    assert_eq!(std::fs::read(root.join("t.txt")).unwrap(), b"aGk=");
    // bytesWritten counts bytes, not characters.
    let text = "héllo ✓ 😀";
    let r = b.ok("files/write", json!({"path": "r/u.txt", "content": text}));
    assert_eq!(r["bytesWritten"], json!(text.len()), "{r}");
    assert_eq!(r["size"], json!(text.len()), "{r}");
    assert_eq!(std::fs::read(root.join("u.txt")).unwrap(), text.as_bytes());
    // Explicit utf-8 too.
    b.ok(
        "files/write",
        json!({"path": "r/v.txt", "content": "x", "encoding": "utf-8"}),
    );
    assert_eq!(std::fs::read(root.join("v.txt")).unwrap(), b"x");
}

#[test]
fn create_defaults_to_true_and_false_refuses_a_missing_file() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    // Default: a missing file is created.
    b.ok("files/write", json!({"path": "r/new.txt", "content": "n"}));
    assert_eq!(std::fs::read(root.join("new.txt")).unwrap(), b"n");
    b.ok(
        "files/write",
        json!({"path": "r/new2.txt", "content": "n", "create": true}),
    );
    assert!(root.join("new2.txt").is_file());

    let e = b.err(
        "files/write",
        json!({"path": "r/missing.txt", "content": "x", "create": false}),
    );
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    assert_eq!(num(&e), -31001, "{e}");
    assert!(!root.join("missing.txt").exists());
    // The same through an upload's first chunk.
    let e = b.err(
        "files/write",
        json!({"path": "r/missing.txt", "content": "x", "create": false, "offset": 0, "final": false}),
    );
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    assert!(!root.join("missing.txt").exists());

    // create:false on an existing file replaces it.
    b.ok(
        "files/write",
        json!({"path": "r/new.txt", "content": "again", "create": false}),
    );
    assert_eq!(std::fs::read(root.join("new.txt")).unwrap(), b"again");
    assert_no_staging(&root);
}

#[test]
fn if_match_equal_ok_differing_conflict_missing_conflict() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    let first = b.ok("files/write", json!({"path": "r/f.txt", "content": "v1"}));
    let etag1 = first["etag"].as_str().unwrap().to_owned();
    let read_etag = b.ok("files/read", json!({"path": "r/f.txt"}))["etag"].clone();
    assert_eq!(read_etag, json!(etag1));

    let second = b.ok(
        "files/write",
        json!({"path": "r/f.txt", "content": "v2", "ifMatch": etag1}),
    );
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"v2");
    let etag2 = second["etag"].as_str().unwrap().to_owned();
    assert_ne!(etag1, etag2);

    // The stale etag now differs.
    let e = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "v3", "ifMatch": etag1}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(num(&e), -31006, "{e}");
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"v2");
    let e = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "v3", "ifMatch": "not-an-etag"}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"v2");
    // Nor may an upload start against a stale etag.
    let e = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "v3", "ifMatch": etag1, "offset": 0, "final": true}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"v2");

    // Changed behind the broker's back: the etag read before no longer matches.
    std::fs::write(root.join("f.txt"), b"outside change").unwrap();
    let e = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "v3", "ifMatch": etag2}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(
        std::fs::read(root.join("f.txt")).unwrap(),
        b"outside change"
    );

    // ifMatch on a missing file.
    let e = b.err(
        "files/write",
        json!({"path": "r/none.txt", "content": "x", "ifMatch": etag2}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(num(&e), -31006);
    assert!(!root.join("none.txt").exists());
    assert_no_staging(&root);
}

#[test]
fn append_appends_and_refuses_offset() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    b.ok("files/write", json!({"path": "r/log", "content": "abc"}));
    let r = b.ok(
        "files/write",
        json!({"path": "r/log", "content": "def", "append": true}),
    );
    assert_eq!(r["bytesWritten"], 3, "{r}");
    assert_eq!(r["size"], 6, "{r}");
    assert_eq!(std::fs::read(root.join("log")).unwrap(), b"abcdef");
    let (bytes, etag) = read_back(&mut b, "r/log");
    assert_eq!(bytes, b"abcdef");
    assert_eq!(r["etag"], json!(etag));

    // Binary append.
    b.ok(
        "files/write",
        json!({"path": "r/log", "content": b64(&[0, 255, 10]), "encoding": "base64", "append": true}),
    );
    assert_eq!(std::fs::read(root.join("log")).unwrap(), b"abcdef\0\xff\n");

    // append: false is a plain replace.
    b.ok(
        "files/write",
        json!({"path": "r/log", "content": "z", "append": false}),
    );
    assert_eq!(std::fs::read(root.join("log")).unwrap(), b"z");

    // Appending to a missing file creates it (create defaults to true)...
    b.ok(
        "files/write",
        json!({"path": "r/new.log", "content": "first", "append": true}),
    );
    assert_eq!(std::fs::read(root.join("new.log")).unwrap(), b"first");
    // ...unless create is false.
    let e = b.err(
        "files/write",
        json!({"path": "r/nope.log", "content": "x", "append": true, "create": false}),
    );
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    assert!(!root.join("nope.log").exists());

    // append + offset is a malformed request.
    for offset in [0, 1] {
        let e = b.err(
            "files/write",
            json!({"path": "r/log", "content": "x", "append": true, "offset": offset}),
        );
        assert_eq!(num(&e), -32602, "{e}");
    }
    assert_eq!(std::fs::read(root.join("log")).unwrap(), b"z");
    assert_no_staging(&root);
}

#[test]
fn base64_round_trips_arbitrary_binary() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    let all: Vec<u8> = (0..=255u8).collect();
    let r = b.ok(
        "files/write",
        json!({"path": "r/all.bin", "content": b64(&all), "encoding": "base64"}),
    );
    assert_eq!(r["bytesWritten"], 256);
    assert_eq!(r["size"], 256);
    assert_eq!(std::fs::read(root.join("all.bin")).unwrap(), all);
    let (back, etag) = read_back(&mut b, "r/all.bin");
    assert_eq!(back, all);
    assert_eq!(r["etag"], json!(etag));

    // The reversed sequence too, and every byte value repeated.
    let rev: Vec<u8> = (0..=255u8).rev().cycle().take(256 * 7 + 3).collect();
    b.ok(
        "files/write",
        json!({"path": "r/rev.bin", "content": b64(&rev), "encoding": "BASE64"}),
    );
    assert_eq!(read_back(&mut b, "r/rev.bin").0, rev);

    for seed in 1..=4u64 {
        let blob = random_bytes(seed, 100 * 1024 + seed as usize);
        let path = format!("r/blob{seed}.bin");
        let r = b.ok(
            "files/write",
            json!({"path": path, "content": b64(&blob), "encoding": "base64"}),
        );
        assert_eq!(r["bytesWritten"], json!(blob.len()));
        assert_eq!(r["size"], json!(blob.len()));
        let (back, etag) = read_back(&mut b, &path);
        assert!(back == blob, "blob {seed} differs after the round trip");
        assert_eq!(r["etag"], json!(etag));
        assert!(std::fs::read(root.join(format!("blob{seed}.bin"))).unwrap() == blob);
    }
    assert_no_staging(&root);
}

#[test]
fn bad_base64_is_invalid_params_and_writes_nothing() {
    let (_t, root) = fixture();
    std::fs::write(root.join("keep.bin"), b"keep").unwrap();
    let (_p, mut b) = rw(&root);
    for bad in ["!!!!", "aGk", "aGk=x", "a=Gk", "ä===", "aGk=\n"] {
        let e = b.err(
            "files/write",
            json!({"path": "r/x.bin", "content": bad, "encoding": "base64"}),
        );
        assert_eq!(num(&e), -32602, "{bad:?}: {e}");
        let e = b.err(
            "files/write",
            json!({"path": "r/keep.bin", "content": bad, "encoding": "base64"}),
        );
        assert_eq!(num(&e), -32602, "{bad:?}: {e}");
        let e = b.err(
            "files/write",
            json!({"path": "r/up.bin", "content": bad, "encoding": "base64", "offset": 0, "final": false}),
        );
        assert_eq!(num(&e), -32602, "{bad:?}: {e}");
    }
    // An unknown encoding name too.
    let e = b.err(
        "files/write",
        json!({"path": "r/x.bin", "content": "aGk=", "encoding": "hex"}),
    );
    assert_eq!(num(&e), -32602, "{e}");
    assert!(!root.join("x.bin").exists());
    assert!(!root.join("up.bin").exists());
    assert_eq!(std::fs::read(root.join("keep.bin")).unwrap(), b"keep");
    assert_no_staging(&root);
}

#[test]
fn permission_bits_kept_on_replace_and_umask_for_new_files() {
    let (_t, root) = fixture();
    let expected_new = new_file_mode(&root);
    std::fs::write(root.join("secret.txt"), b"old").unwrap();
    std::fs::set_permissions(
        root.join("secret.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o751)).unwrap();
    let (_p, mut b) = rw(&root);

    b.ok(
        "files/write",
        json!({"path": "r/secret.txt", "content": "new"}),
    );
    assert_eq!(std::fs::read(root.join("secret.txt")).unwrap(), b"new");
    assert_eq!(mode_of(&root.join("secret.txt")), 0o640);

    b.ok(
        "files/write",
        json!({"path": "r/run.sh", "content": "#!/bin/sh\necho\n"}),
    );
    assert_eq!(mode_of(&root.join("run.sh")), 0o751);
    // An append and an upload keep them too.
    b.ok(
        "files/write",
        json!({"path": "r/secret.txt", "content": "+", "append": true}),
    );
    assert_eq!(mode_of(&root.join("secret.txt")), 0o640);
    assert_eq!(
        chunk(&mut b, "r/run.sh", 0, b"ab", false)["result"]["bytesWritten"],
        2
    );
    assert!(
        chunk(&mut b, "r/run.sh", 2, b"cd", true)
            .get("error")
            .is_none()
    );
    assert_eq!(std::fs::read(root.join("run.sh")).unwrap(), b"abcd");
    assert_eq!(mode_of(&root.join("run.sh")), 0o751);

    // New files: 0666 & ~umask, as open(2) would give (single write and upload).
    b.ok(
        "files/write",
        json!({"path": "r/fresh.txt", "content": "x"}),
    );
    assert_eq!(
        mode_of(&root.join("fresh.txt")),
        expected_new,
        "umask-derived mode"
    );
    assert!(
        chunk(&mut b, "r/fresh2.txt", 0, b"x", true)
            .get("error")
            .is_none()
    );
    assert_eq!(mode_of(&root.join("fresh2.txt")), expected_new);
    println!("new file mode here: {expected_new:o}");
}

#[test]
fn writing_a_directory_or_the_root_fails() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/inner"), b"inner").unwrap();
    let before = snapshot(&root);
    let (_p, mut b) = rw(&root);

    let e = b.err("files/write", json!({"path": "r/d", "content": "x"}));
    assert_eq!(code(&e), "INVALID_PATH", "{e}");
    assert_eq!(num(&e), -31003, "{e}");
    let e = b.err(
        "files/write",
        json!({"path": "r/d", "content": "x", "offset": 0, "final": true}),
    );
    assert_eq!(code(&e), "INVALID_PATH", "{e}");
    let e = b.err(
        "files/write",
        json!({"path": "r/d", "content": "x", "append": true}),
    );
    assert_eq!(code(&e), "INVALID_PATH", "{e}");
    assert!(root.join("d").is_dir());

    for path in ["r", "r/", "r/.", "r/d/..", root.to_str().unwrap()] {
        let e = b.err("files/write", json!({"path": path, "content": "x"}));
        assert!(num(&e) <= -31001 && num(&e) >= -31009, "{path}: {e}");
        assert_ne!(code(&e), "IO_ERROR", "{path}: {e}");
    }
    assert!(root.is_dir());
    assert_eq!(snapshot(&root), before, "nothing may change");
}

#[test]
fn read_only_root_refuses_every_mutation() {
    let (_t, root) = fixture();
    std::fs::write(root.join("a.txt"), b"a").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/b.txt"), b"b").unwrap();
    let before = snapshot(&root);
    let mut b = Fsb::serve_root(&root); // named `proj`, read-only
    let mut refused = 0;
    let mut check = |b: &mut Fsb, method: &str, params: Value| {
        let e = b.err(method, params.clone());
        assert_eq!(code(&e), "PERMISSION_DENIED", "{method} {params}: {e}");
        assert_eq!(num(&e), -31002, "{e}");
        assert_eq!(
            e["data"]["reason"], "read-only root",
            "{method} {params}: {e}"
        );
        refused += 1;
    };
    check(
        &mut b,
        "files/write",
        json!({"path": "proj/a.txt", "content": "x"}),
    );
    check(
        &mut b,
        "files/write",
        json!({"path": "proj/new.txt", "content": "x"}),
    );
    check(
        &mut b,
        "files/write",
        json!({"path": "proj/a.txt", "content": "x", "append": true}),
    );
    check(
        &mut b,
        "files/write",
        json!({"path": "proj/a.txt", "content": "x", "offset": 0, "final": false}),
    );
    check(
        &mut b,
        "files/create",
        json!({"path": "proj/new.txt", "type": "file"}),
    );
    check(
        &mut b,
        "files/create",
        json!({"path": "proj/newdir/x", "type": "directory"}),
    );
    check(&mut b, "files/delete", json!({"path": "proj/a.txt"}));
    check(
        &mut b,
        "files/delete",
        json!({"path": "proj/d", "recursive": true}),
    );
    check(
        &mut b,
        "files/rename",
        json!({"oldPath": "proj/a.txt", "newPath": "proj/c.txt"}),
    );
    check(
        &mut b,
        "files/rename",
        json!({"oldPath": "proj/a.txt", "newPath": "proj/d/b.txt", "overwrite": true}),
    );
    // Reading still works.
    assert_eq!(
        b.ok("files/read", json!({"path": "proj/a.txt"}))["content"],
        "a"
    );
    assert_eq!(refused, 10);
    assert_eq!(snapshot(&root), before, "a read-only root must not change");
}

#[test]
fn payload_over_max_chunk_size_is_quota_exceeded_and_leaves_nothing() {
    let (_t, root) = fixture();
    std::fs::write(root.join("old.txt"), b"old content").unwrap();
    let (_p, mut b) = serve_policy(&root, RW, "chunk_size = 1024\nmax_chunk_size = 1024");
    let big = "x".repeat(1025);
    let cases = [
        json!({"path": "r/new.txt", "content": big}),
        json!({"path": "r/new.txt", "content": b64(big.as_bytes()), "encoding": "base64"}),
        json!({"path": "r/new.txt", "content": b64(&random_bytes(9, 4096)), "encoding": "base64"}),
        json!({"path": "r/new.txt", "content": big, "offset": 0, "final": false}),
        json!({"path": "r/new.txt", "content": big, "offset": 0, "final": true}),
        json!({"path": "r/old.txt", "content": big}),
        json!({"path": "r/old.txt", "content": big, "append": true}),
        json!({"path": "r/old.txt", "content": big, "offset": 0, "final": true}),
    ];
    for params in cases {
        let e = b.err("files/write", params.clone());
        assert_eq!(code(&e), "QUOTA_EXCEEDED", "{params}: {e}");
        assert_eq!(num(&e), -31007, "{e}");
        assert!(!root.join("new.txt").exists(), "{params}");
        assert_eq!(std::fs::read(root.join("old.txt")).unwrap(), b"old content");
        assert_no_staging(&root);
    }
    // Exactly max_chunk_size is allowed (decoded size counts, not the base64 length).
    let exact = random_bytes(3, 1024);
    let r = b.ok(
        "files/write",
        json!({"path": "r/new.txt", "content": b64(&exact), "encoding": "base64"}),
    );
    assert_eq!(r["bytesWritten"], 1024);
    assert_eq!(std::fs::read(root.join("new.txt")).unwrap(), exact);
    // And a 2 KiB file fits in two chunks of 1 KiB.
    assert!(
        chunk(&mut b, "r/two.bin", 0, &exact, false)
            .get("error")
            .is_none()
    );
    assert!(
        chunk(&mut b, "r/two.bin", 1024, &exact, true)
            .get("error")
            .is_none()
    );
    assert_eq!(std::fs::read(root.join("two.bin")).unwrap().len(), 2048);
    assert_no_staging(&root);
}

#[test]
fn growing_past_max_file_size_is_quota_exceeded_and_leaves_nothing() {
    let (_t, root) = fixture();
    std::fs::write(root.join("old.txt"), vec![b'o'; 900]).unwrap();
    let (_p, mut b) = serve_policy(&root, RW, "max_file_size = 1000");

    // Single writes.
    for params in [
        json!({"path": "r/new.txt", "content": "y".repeat(1001)}),
        json!({"path": "r/old.txt", "content": "y".repeat(1001)}),
        json!({"path": "r/old.txt", "content": "y".repeat(101), "append": true}),
    ] {
        let e = b.err("files/write", params.clone());
        assert_eq!(code(&e), "QUOTA_EXCEEDED", "{params}: {e}");
        assert_eq!(num(&e), -31007);
        assert!(!root.join("new.txt").exists());
        assert_eq!(
            std::fs::read(root.join("old.txt")).unwrap(),
            vec![b'o'; 900]
        );
        assert_no_staging(&root);
    }
    // Exactly max_file_size is fine, by append too.
    b.ok(
        "files/write",
        json!({"path": "r/old.txt", "content": "y".repeat(100), "append": true}),
    );
    assert_eq!(std::fs::read(root.join("old.txt")).unwrap().len(), 1000);
    std::fs::write(root.join("old.txt"), vec![b'o'; 900]).unwrap();

    // Uploads: 400 + 400 fit, the third chunk would make 1200.
    for target in ["r/old.txt", "r/new.txt"] {
        let part = vec![b'u'; 400];
        for (i, last) in [(0, false), (1, false)] {
            let r = chunk(&mut b, target, i * 400, &part, last);
            assert!(r.get("error").is_none(), "{r}");
        }
        let r = chunk(&mut b, target, 800, &part, true);
        assert_eq!(code(&r["error"]), "QUOTA_EXCEEDED", "{r}");
        assert!(!root.join("new.txt").exists());
        assert_eq!(
            std::fs::read(root.join("old.txt")).unwrap(),
            vec![b'o'; 900]
        );
        assert_no_staging(&root);
        // Nothing is left to continue: the upload is gone.
        let r = chunk(&mut b, target, 800, &part[..100], true);
        assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
        assert!(!root.join("new.txt").exists());
        assert_eq!(
            std::fs::read(root.join("old.txt")).unwrap(),
            vec![b'o'; 900]
        );
    }
    assert_no_staging(&root);
}

// ---------------------------------------------------------------------------------------------
// Chunked uploads
// ---------------------------------------------------------------------------------------------

#[test]
fn five_chunk_upload_over_an_existing_file() {
    let (_t, root) = fixture();
    let old = b"the old content\n".to_vec();
    std::fs::write(root.join("up.bin"), &old).unwrap();
    let (_p, mut b) = rw(&root);
    let data = random_bytes(42, 5 * 30_000 + 17);
    let parts = [
        &data[..30_000],
        &data[30_000..60_000],
        &data[60_000..90_000],
        &data[90_000..120_000],
        &data[120_000..],
    ];
    let mut offset = 0;
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        let r = chunk(&mut b, "r/up.bin", offset, part, last);
        let res = &r["result"];
        assert!(r.get("error").is_none(), "chunk {i}: {r}");
        assert_eq!(res["bytesWritten"], json!(part.len()), "{r}");
        offset += part.len();
        if !last {
            assert_eq!(
                std::fs::read(root.join("up.bin")).unwrap(),
                old,
                "the target changed before the final chunk (after chunk {i})"
            );
            assert_eq!(
                staging_files(&root).len(),
                1,
                "chunks are staged beside the target"
            );
        } else {
            assert_eq!(res["size"], json!(data.len()), "{r}");
            let (back, etag) = read_back(&mut b, "r/up.bin");
            assert!(back == data, "uploaded file differs");
            assert_eq!(res["etag"], json!(etag));
        }
    }
    assert!(std::fs::read(root.join("up.bin")).unwrap() == data);
    assert_no_staging(&root);
}

#[test]
fn upload_of_a_new_file_stays_absent_until_final() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("sub")).unwrap();
    let (_p, mut b) = rw(&root);
    let data = random_bytes(7, 5000);
    for (i, part) in data.chunks(1000).enumerate() {
        let last = i == 4;
        let r = b.request(
            "files/write",
            json!({"path": "r/sub/new.bin", "content": b64(part), "encoding": "base64",
                   "offset": i * 1000, "final": last}),
        );
        assert!(r.get("error").is_none(), "{r}");
        if !last {
            assert!(
                std::fs::symlink_metadata(root.join("sub/new.bin")).is_err(),
                "the target appeared before the final chunk"
            );
        }
    }
    assert_eq!(std::fs::read(root.join("sub/new.bin")).unwrap(), data);
    // Text chunks work too (default encoding), including a one-chunk "upload".
    let r = b.ok(
        "files/write",
        json!({"path": "r/t.txt", "content": "one ", "offset": 0, "final": false}),
    );
    assert_eq!(r["bytesWritten"], 4);
    assert!(!root.join("t.txt").exists());
    b.ok(
        "files/write",
        json!({"path": "r/t.txt", "content": "two", "offset": 4}),
    );
    assert_eq!(std::fs::read(root.join("t.txt")).unwrap(), b"one two");
    b.ok(
        "files/write",
        json!({"path": "r/single.txt", "content": "s", "offset": 0, "final": true}),
    );
    assert_eq!(std::fs::read(root.join("single.txt")).unwrap(), b"s");
    assert_no_staging(&root);
}

#[test]
fn wrong_offsets_are_concurrency_conflicts() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.bin"), b"old").unwrap();
    let (_p, mut b) = rw(&root);

    // offset > 0 with no upload in progress.
    for path in ["r/f.bin", "r/none.bin"] {
        let r = chunk(&mut b, path, 5, b"abc", false);
        assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
        assert_eq!(num(&r["error"]), -31006);
        let r = chunk(&mut b, path, 5, b"abc", true);
        assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
    }
    assert!(!root.join("none.bin").exists());
    assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"old");
    assert_no_staging(&root);

    // Two chunks staged (6 bytes), then offsets that are not 6.
    assert!(
        chunk(&mut b, "r/f.bin", 0, b"abc", false)
            .get("error")
            .is_none()
    );
    assert!(
        chunk(&mut b, "r/f.bin", 3, b"def", false)
            .get("error")
            .is_none()
    );
    for wrong in [3, 5, 7, 100] {
        for last in [false, true] {
            let r = chunk(&mut b, "r/f.bin", wrong, b"ghi", last);
            assert_eq!(
                code(&r["error"]),
                "CONCURRENCY_CONFLICT",
                "offset {wrong}: {r}"
            );
            assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"old");
        }
    }
    // An upload of another path does not count.
    let r = chunk(&mut b, "r/other.bin", 6, b"ghi", true);
    assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
    assert!(!root.join("other.bin").exists());

    // Restart from 0: the earlier chunks are dropped.
    assert!(
        chunk(&mut b, "r/f.bin", 0, b"XY", false)
            .get("error")
            .is_none()
    );
    assert!(
        staging_files(&root).len() <= 1,
        "a restart must drop the earlier staging file: {:?}",
        staging_files(&root)
    );
    assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"old");
    assert!(
        chunk(&mut b, "r/f.bin", 2, b"Z", true)
            .get("error")
            .is_none()
    );
    assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"XYZ");
    assert_no_staging(&root);

    // After the commit the upload is over: continuing it is a conflict, the file stays.
    let r = chunk(&mut b, "r/f.bin", 3, b"more", true);
    assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
    assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"XYZ");
}

/// After its first chunk is answered, an upload's chunks may be sent without waiting for
/// each answer: the broker, which runs requests concurrently, still applies them in order.
#[test]
fn pipelined_chunks_land_in_order() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    const CHUNK: usize = 256 << 10;
    const N: usize = 12;
    let data = random_bytes(7, CHUNK * N);
    let first = chunk(&mut b, "r/p.bin", 0, &data[..CHUNK], false);
    assert!(first.get("error").is_none(), "{first}");
    let mut ids = Vec::new();
    for i in 1..N {
        let last = i == N - 1;
        ids.push(b.send(
            "files/write",
            json!({"path": "r/p.bin", "content": b64(&data[i * CHUNK..(i + 1) * CHUNK]),
                   "encoding": "base64", "offset": i * CHUNK, "final": last}),
        ));
    }
    let mut answers = std::collections::HashMap::new();
    while answers.len() < ids.len() {
        let m = b.read_message();
        answers.insert(m["id"].as_u64().expect("an id"), m);
    }
    for (i, id) in ids.iter().enumerate() {
        let m = &answers[id];
        let r = m
            .get("result")
            .unwrap_or_else(|| panic!("chunk {}: {m}", i + 1));
        assert_eq!(r["bytesWritten"], json!(CHUNK), "{m}");
        assert_eq!(r["size"], json!(CHUNK * (i + 2)), "{m}");
    }
    assert!(
        std::fs::read(root.join("p.bin")).unwrap() == data,
        "uploaded file differs"
    );
    assert_no_staging(&root);
}

/// A chunk ahead of its upload, with no other write in flight to fill the gap, is answered
/// at once; it does not wait out `timeout_ms`.
#[test]
fn a_chunk_ahead_with_nothing_in_flight_is_refused_at_once() {
    let (_t, root) = fixture();
    let (_p, mut b) = serve_policy(&root, RW, "timeout_ms = 20000");
    assert!(
        chunk(&mut b, "r/g.bin", 0, b"abc", false)
            .get("error")
            .is_none()
    );
    let started = std::time::Instant::now();
    let r = chunk(&mut b, "r/g.bin", 6, b"ghi", true);
    assert_eq!(code(&r["error"]), "CONCURRENCY_CONFLICT", "{r}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited {:?} for a chunk that nothing could precede",
        started.elapsed()
    );
    // The upload is intact and goes on.
    assert!(
        chunk(&mut b, "r/g.bin", 3, b"def", true)
            .get("error")
            .is_none()
    );
    assert_eq!(std::fs::read(root.join("g.bin")).unwrap(), b"abcdef");
}

#[test]
fn offset_zero_restarts_an_upload() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    for (offset, data, last) in [
        (0, b"AAAA", false),
        (4, b"BBBB", false),
        (0, b"CCCC", false),
        (4, b"DDDD", false),
        (0, b"EEEE", false),
        (4, b"FFFF", true),
    ] {
        let r = chunk(&mut b, "r/re.txt", offset, data, last);
        assert!(r.get("error").is_none(), "{r}");
        if !last {
            assert!(!root.join("re.txt").exists());
            assert_eq!(staging_files(&root).len(), 1, "one staging file per upload");
        }
    }
    assert_eq!(std::fs::read(root.join("re.txt")).unwrap(), b"EEEEFFFF");
    assert_no_staging(&root);
}

#[test]
fn abandoned_uploads_are_removed_when_the_session_ends() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("deep")).unwrap();
    std::fs::write(root.join("existing.txt"), b"keep me").unwrap();
    let (_p, mut b) = rw(&root);
    for path in ["r/existing.txt", "r/absent.txt", "r/deep/absent.bin"] {
        assert!(
            chunk(&mut b, path, 0, b"part one ", false)
                .get("error")
                .is_none()
        );
        assert!(
            chunk(&mut b, path, 9, b"part two", false)
                .get("error")
                .is_none()
        );
    }
    assert_eq!(staging_files(&root).len(), 3, "{:?}", staging_files(&root));
    let (status, rest) = b.finish();
    assert!(status.success(), "exit status {status:?}");
    assert!(rest.is_empty(), "unexpected output: {rest}");
    assert_no_staging(&root);
    assert_eq!(
        std::fs::read(root.join("existing.txt")).unwrap(),
        b"keep me"
    );
    assert!(!root.join("absent.txt").exists());
    assert!(!root.join("deep/absent.bin").exists());
}

#[test]
fn staging_files_cannot_be_named_in_requests() {
    let (_t, root) = fixture();
    let (_p, mut b) = rw(&root);
    assert!(
        chunk(&mut b, "r/f.bin", 0, b"staged", false)
            .get("error")
            .is_none()
    );
    let staged = staging_files(&root);
    assert_eq!(staged.len(), 1);
    let name = staged[0].file_name().unwrap().to_str().unwrap().to_owned();
    let path = format!("r/{name}");
    for (method, params) in [
        ("files/read", json!({"path": path})),
        ("files/write", json!({"path": path, "content": "hijack"})),
        ("files/delete", json!({"path": path})),
        (
            "files/rename",
            json!({"oldPath": path, "newPath": "r/stolen"}),
        ),
        (
            "files/create",
            json!({"path": format!("{path}/x"), "type": "file"}),
        ),
    ] {
        let e = b.err(method, params);
        assert_eq!(code(&e), "PERMISSION_DENIED", "{method}: {e}");
        assert_eq!(e["data"]["reason"], "reserved for fsbroker's staging files");
    }
    // The upload is intact and still commits what it staged.
    let done = chunk(&mut b, "r/f.bin", 6, b"!", true);
    assert!(done.get("error").is_none(), "{done}");
    assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), b"staged!");
}

#[test]
fn list_never_shows_staging_files() {
    let (_t, root) = fixture();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join(".hidden"), b"h").unwrap();
    std::fs::write(root.join("sub/t.txt"), b"t").unwrap();
    let (_p, mut b) = rw(&root);
    assert!(
        chunk(&mut b, "r/top.bin", 0, b"x", false)
            .get("error")
            .is_none()
    );
    assert!(
        chunk(&mut b, "r/sub/t.txt", 0, b"y", false)
            .get("error")
            .is_none()
    );
    assert!(
        chunk(&mut b, "r/.hidden", 0, b"z", false)
            .get("error")
            .is_none()
    );
    assert_eq!(staging_files(&root).len(), 3);
    for params in [
        json!({"path": "r"}),
        json!({"path": "r", "includeHidden": true}),
        json!({"path": "r", "includeHidden": true, "recursive": true}),
        json!({"path": "r/sub", "includeHidden": true}),
        json!({"path": "r", "recursive": true}),
    ] {
        let r = b.ok("files/list", params.clone());
        let names: Vec<&str> = r["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert!(
            names.iter().all(|n| !n.contains(".fsbroker-")),
            "{params}: {names:?}"
        );
        assert!(
            !names.contains(&"r/top.bin"),
            "not committed yet: {names:?}"
        );
        if params["includeHidden"] == json!(true) && params["path"] == "r" {
            assert!(names.contains(&"r/.hidden"), "{names:?}");
        }
    }
    // Reading a staging file by name is refused or not found, never its content.
    let name = staging_files(&root)[0]
        .strip_prefix(&root)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    let resp = b.request("files/read", json!({"path": format!("r/{name}")}));
    println!("reading staging file {name} directly: {resp}");
}

#[test]
fn if_match_on_the_final_chunk_is_checked_at_commit() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), b"v1").unwrap();
    let (_p, mut b) = rw(&root);
    let etag = b.ok("files/read", json!({"path": "r/f.txt"}))["etag"].clone();
    let r = b.request(
        "files/write",
        json!({"path": "r/f.txt", "content": "AAA", "offset": 0, "final": false, "ifMatch": etag}),
    );
    assert!(r.get("error").is_none(), "{r}");
    std::fs::write(root.join("f.txt"), b"changed outside").unwrap();
    let e = b.err(
        "files/write",
        json!({"path": "r/f.txt", "content": "BBB", "offset": 3, "final": true, "ifMatch": etag}),
    );
    assert_eq!(code(&e), "CONCURRENCY_CONFLICT", "{e}");
    assert_eq!(
        std::fs::read(root.join("f.txt")).unwrap(),
        b"changed outside"
    );
    assert_no_staging(&root);
}

/// The etag an upload started against must still hold when the upload commits, even when
/// only its first chunk named it: otherwise a change made during the upload is silently lost,
/// the very thing `ifMatch` exists to prevent (the atomic replace re-checks just before its
/// commit for the same reason).
#[test]
fn if_match_of_an_upload_still_holds_at_its_commit() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), b"v1").unwrap();
    let (_p, mut b) = rw(&root);
    let etag = b.ok("files/read", json!({"path": "r/f.txt"}))["etag"].clone();
    let first = json!({"path": "r/f.txt", "content": "AAA", "offset": 0, "final": false,
                       "ifMatch": etag});
    let r = b.request("files/write", first.clone());
    assert!(r.get("error").is_none(), "{r}");
    std::fs::write(root.join("f.txt"), b"changed outside").unwrap();
    let last = json!({"path": "r/f.txt", "content": "BBB", "offset": 3, "final": true});
    let r = b.request("files/write", last.clone());
    assert_eq!(
        code(&r["error"]),
        "CONCURRENCY_CONFLICT",
        "upload started with {first}, file changed on disk, then {last} answered {r}: \
         the outside change was overwritten"
    );
    assert_eq!(
        std::fs::read(root.join("f.txt")).unwrap(),
        b"changed outside"
    );
    assert_no_staging(&root);
}

#[test]
fn new_files_follow_the_brokers_umask() {
    let (_t, root) = fixture();
    std::fs::write(root.join("old.txt"), b"old").unwrap();
    std::fs::set_permissions(root.join("old.txt"), std::fs::Permissions::from_mode(0o664)).unwrap();
    let mut b = Fsb::spawn_program(
        "sh",
        &[
            "-c",
            "umask 027 && exec \"$0\" \"$@\"",
            common::bin(),
            "serve",
            "--root",
            root.to_str().unwrap(),
            "--read-write",
        ],
    );
    b.ok("files/write", json!({"path": "proj/w.txt", "content": "w"}));
    assert_eq!(mode_of(&root.join("w.txt")), 0o640);
    assert!(
        chunk(&mut b, "proj/u.txt", 0, b"u", true)
            .get("error")
            .is_none()
    );
    assert_eq!(mode_of(&root.join("u.txt")), 0o640);
    b.ok(
        "files/create",
        json!({"path": "proj/c.txt", "type": "file"}),
    );
    assert_eq!(mode_of(&root.join("c.txt")), 0o640);
    b.ok(
        "files/create",
        json!({"path": "proj/d/e", "type": "directory"}),
    );
    assert_eq!(mode_of(&root.join("d")), 0o750);
    assert_eq!(mode_of(&root.join("d/e")), 0o750);
    // A replaced file keeps its own bits, whatever the umask.
    b.ok(
        "files/write",
        json!({"path": "proj/old.txt", "content": "new"}),
    );
    assert_eq!(mode_of(&root.join("old.txt")), 0o664);
}

// ---------------------------------------------------------------------------------------------
// files/create
// ---------------------------------------------------------------------------------------------

#[test]
fn create_files_and_directories() {
    let (_t, root) = fixture();
    let expected_new = new_file_mode(&root);
    let (_p, mut b) = rw(&root);

    let r = b.ok("files/create", json!({"path": "r/f.txt", "type": "file"}));
    assert_eq!(r["created"], true, "{r}");
    assert!(root.join("f.txt").is_file());
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"");
    assert_eq!(mode_of(&root.join("f.txt")), expected_new);

    let r = b.ok("files/create", json!({"path": "r/d", "type": "directory"}));
    assert_eq!(r["created"], true);
    assert!(root.join("d").is_dir());

    // Parents as needed.
    let r = b.ok(
        "files/create",
        json!({"path": "r/a/b/c", "type": "directory"}),
    );
    assert_eq!(r["created"], true);
    assert!(root.join("a/b/c").is_dir());
    let r = b.ok(
        "files/create",
        json!({"path": "r/x/y/z.txt", "type": "file"}),
    );
    assert_eq!(r["created"], true);
    assert!(root.join("x/y/z.txt").is_file());
    assert!(root.join("x/y").is_dir());

    // Existing, same type: created false, untouched.
    std::fs::write(root.join("f.txt"), b"content").unwrap();
    std::fs::set_permissions(root.join("f.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(root.join("d/inside"), b"in").unwrap();
    let mtime = std::fs::metadata(root.join("f.txt")).unwrap().mtime_nsec();
    let r = b.ok("files/create", json!({"path": "r/f.txt", "type": "file"}));
    assert_eq!(r["created"], false, "{r}");
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"content");
    assert_eq!(mode_of(&root.join("f.txt")), 0o600);
    assert_eq!(
        std::fs::metadata(root.join("f.txt")).unwrap().mtime_nsec(),
        mtime
    );
    let r = b.ok("files/create", json!({"path": "r/d", "type": "directory"}));
    assert_eq!(r["created"], false);
    assert_eq!(std::fs::read(root.join("d/inside")).unwrap(), b"in");
    let r = b.ok(
        "files/create",
        json!({"path": "r/a/b", "type": "directory"}),
    );
    assert_eq!(r["created"], false);
    assert!(root.join("a/b/c").is_dir());

    // Existing, other type: ALREADY_EXISTS, untouched.
    let e = b.err(
        "files/create",
        json!({"path": "r/f.txt", "type": "directory"}),
    );
    assert_eq!(code(&e), "ALREADY_EXISTS", "{e}");
    assert_eq!(num(&e), -31009);
    assert_eq!(std::fs::read(root.join("f.txt")).unwrap(), b"content");
    let e = b.err("files/create", json!({"path": "r/d", "type": "file"}));
    assert_eq!(code(&e), "ALREADY_EXISTS", "{e}");
    assert_eq!(std::fs::read(root.join("d/inside")).unwrap(), b"in");

    // A bad type is malformed.
    let e = b.err("files/create", json!({"path": "r/q", "type": "symlink"}));
    assert_eq!(num(&e), -32602, "{e}");
    let e = b.err("files/create", json!({"path": "r/q"}));
    assert_eq!(num(&e), -32602, "{e}");
    assert!(!root.join("q").exists());
}

// ---------------------------------------------------------------------------------------------
// files/delete
// ---------------------------------------------------------------------------------------------

#[test]
fn delete_files_directories_and_symlinks() {
    let (_t, base) = tempdir();
    let root = base.join("proj");
    std::fs::create_dir_all(root.join("full/sub")).unwrap();
    std::fs::write(root.join("f.txt"), b"f").unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
    std::fs::write(root.join("full/a"), b"a").unwrap();
    std::fs::write(root.join("full/sub/b"), b"b").unwrap();
    std::fs::write(root.join("target.txt"), b"target content").unwrap();
    std::fs::create_dir(root.join("tdir")).unwrap();
    std::fs::write(root.join("tdir/kept"), b"kept").unwrap();
    symlink("target.txt", root.join("link")).unwrap();
    symlink("tdir", root.join("dlink")).unwrap();
    std::fs::write(base.join("outside.txt"), b"outside").unwrap();
    symlink("../outside.txt", root.join("out_link")).unwrap();
    let (_p, mut b) = rw(&root);

    assert_eq!(b.ok("files/delete", json!({"path": "r/f.txt"})), json!({}));
    assert!(!root.join("f.txt").exists());
    b.ok("files/delete", json!({"path": "r/empty"}));
    assert!(!root.join("empty").exists());

    let e = b.err("files/delete", json!({"path": "r/full"}));
    assert_eq!(code(&e), "IO_ERROR", "{e}");
    assert_eq!(num(&e), -31004);
    let e = b.err(
        "files/delete",
        json!({"path": "r/full", "recursive": false}),
    );
    assert_eq!(code(&e), "IO_ERROR", "{e}");
    assert_eq!(std::fs::read(root.join("full/sub/b")).unwrap(), b"b");
    assert_eq!(std::fs::read(root.join("full/a")).unwrap(), b"a");
    b.ok("files/delete", json!({"path": "r/full", "recursive": true}));
    assert!(std::fs::symlink_metadata(root.join("full")).is_err());

    // Symlinks: the link goes, the target stays (recursive or not, inside or outside).
    b.ok("files/delete", json!({"path": "r/link"}));
    assert!(std::fs::symlink_metadata(root.join("link")).is_err());
    assert_eq!(
        std::fs::read(root.join("target.txt")).unwrap(),
        b"target content"
    );
    b.ok(
        "files/delete",
        json!({"path": "r/dlink", "recursive": true}),
    );
    assert!(std::fs::symlink_metadata(root.join("dlink")).is_err());
    assert_eq!(std::fs::read(root.join("tdir/kept")).unwrap(), b"kept");
    b.ok("files/delete", json!({"path": "r/out_link"}));
    assert!(std::fs::symlink_metadata(root.join("out_link")).is_err());
    assert_eq!(std::fs::read(base.join("outside.txt")).unwrap(), b"outside");

    // The root itself.
    for path in ["r", "r/", root.to_str().unwrap()] {
        for recursive in [false, true] {
            let e = b.err(
                "files/delete",
                json!({"path": path, "recursive": recursive}),
            );
            assert_eq!(code(&e), "PERMISSION_DENIED", "{path}: {e}");
            assert_eq!(num(&e), -31002);
        }
    }
    assert!(root.is_dir());
    assert_eq!(
        std::fs::read(root.join("target.txt")).unwrap(),
        b"target content"
    );

    // Missing.
    for path in ["r/missing", "r/tdir/missing", "r/link"] {
        let e = b.err("files/delete", json!({"path": path}));
        assert_eq!(code(&e), "FILE_NOT_FOUND", "{path}: {e}");
        assert_eq!(num(&e), -31001);
    }
}

// ---------------------------------------------------------------------------------------------
// files/rename
// ---------------------------------------------------------------------------------------------

#[test]
fn rename_within_a_root() {
    let (_t, root) = fixture();
    std::fs::write(root.join("a.txt"), b"A").unwrap();
    std::fs::write(root.join("b.txt"), b"B").unwrap();
    std::fs::create_dir_all(root.join("d/inner")).unwrap();
    std::fs::write(root.join("d/inner/x"), b"x").unwrap();
    let (_p, mut b) = rw(&root);

    // File, into a subdirectory.
    assert_eq!(
        b.ok(
            "files/rename",
            json!({"oldPath": "r/a.txt", "newPath": "r/d/a2.txt"})
        ),
        json!({})
    );
    assert!(!root.join("a.txt").exists());
    assert_eq!(std::fs::read(root.join("d/a2.txt")).unwrap(), b"A");
    // Directory.
    b.ok("files/rename", json!({"oldPath": "r/d", "newPath": "r/e"}));
    assert!(!root.join("d").exists());
    assert_eq!(std::fs::read(root.join("e/inner/x")).unwrap(), b"x");

    // Existing target without overwrite: ALREADY_EXISTS, both unchanged.
    std::fs::write(root.join("c.txt"), b"C").unwrap();
    for params in [
        json!({"oldPath": "r/b.txt", "newPath": "r/c.txt"}),
        json!({"oldPath": "r/b.txt", "newPath": "r/c.txt", "overwrite": false}),
    ] {
        let e = b.err("files/rename", params.clone());
        assert_eq!(code(&e), "ALREADY_EXISTS", "{params}: {e}");
        assert_eq!(num(&e), -31009);
        assert_eq!(std::fs::read(root.join("b.txt")).unwrap(), b"B");
        assert_eq!(std::fs::read(root.join("c.txt")).unwrap(), b"C");
    }
    // A directory onto an existing directory without overwrite too.
    std::fs::create_dir(root.join("f")).unwrap();
    let e = b.err("files/rename", json!({"oldPath": "r/e", "newPath": "r/f"}));
    assert_eq!(code(&e), "ALREADY_EXISTS", "{e}");
    assert!(root.join("e/inner/x").exists());

    // With overwrite: replaced.
    b.ok(
        "files/rename",
        json!({"oldPath": "r/b.txt", "newPath": "r/c.txt", "overwrite": true}),
    );
    assert!(!root.join("b.txt").exists());
    assert_eq!(std::fs::read(root.join("c.txt")).unwrap(), b"B");

    // Missing source.
    let e = b.err(
        "files/rename",
        json!({"oldPath": "r/missing", "newPath": "r/new"}),
    );
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    assert_eq!(num(&e), -31001);
    assert!(!root.join("new").exists());

    // The root as old or new path.
    for params in [
        json!({"oldPath": "r", "newPath": "r/moved"}),
        json!({"oldPath": "r/", "newPath": "r/moved", "overwrite": true}),
        json!({"oldPath": "r/c.txt", "newPath": "r"}),
        json!({"oldPath": "r/c.txt", "newPath": "r", "overwrite": true}),
        json!({"oldPath": "r/e", "newPath": "r/.", "overwrite": true}),
    ] {
        let e = b.err("files/rename", params.clone());
        assert_eq!(code(&e), "PERMISSION_DENIED", "{params}: {e}");
        assert_eq!(num(&e), -31002);
    }
    assert!(root.is_dir());
    assert_eq!(std::fs::read(root.join("c.txt")).unwrap(), b"B");
    assert!(!root.join("moved").exists());

    // A directory into itself.
    for new in ["r/e/inside", "r/e/inner/deeper"] {
        let e = b.err("files/rename", json!({"oldPath": "r/e", "newPath": new}));
        assert_eq!(code(&e), "INVALID_PATH", "{new}: {e}");
        assert_eq!(num(&e), -31003);
        assert_eq!(std::fs::read(root.join("e/inner/x")).unwrap(), b"x");
    }
    assert_no_staging(&root);
}

#[test]
fn rename_across_two_roots() {
    let (_t, base) = tempdir();
    let (ra, rb) = (base.join("one"), base.join("two"));
    std::fs::create_dir(&ra).unwrap();
    std::fs::create_dir(&rb).unwrap();
    std::fs::write(ra.join("f.txt"), b"from one").unwrap();
    std::fs::create_dir_all(ra.join("dir/sub")).unwrap();
    std::fs::write(ra.join("dir/sub/x"), b"x").unwrap();
    std::fs::write(rb.join("taken.txt"), b"taken").unwrap();
    std::fs::write(ra.join("g.txt"), b"g").unwrap();
    let (_p, mut b) = serve_roots(&[(&ra, "a"), (&rb, "b")]);

    b.ok(
        "files/rename",
        json!({"oldPath": "a/f.txt", "newPath": "b/f.txt"}),
    );
    assert!(!ra.join("f.txt").exists());
    assert_eq!(std::fs::read(rb.join("f.txt")).unwrap(), b"from one");
    b.ok(
        "files/rename",
        json!({"oldPath": "a/dir", "newPath": "b/moved"}),
    );
    assert!(!ra.join("dir").exists());
    assert_eq!(std::fs::read(rb.join("moved/sub/x")).unwrap(), b"x");
    // Absolute paths name roots too.
    b.ok(
        "files/rename",
        json!({"oldPath": rb.join("f.txt").to_str().unwrap(),
               "newPath": ra.join("back.txt").to_str().unwrap()}),
    );
    assert_eq!(std::fs::read(ra.join("back.txt")).unwrap(), b"from one");

    let e = b.err(
        "files/rename",
        json!({"oldPath": "a/g.txt", "newPath": "b/taken.txt"}),
    );
    assert_eq!(code(&e), "ALREADY_EXISTS", "{e}");
    assert_eq!(std::fs::read(ra.join("g.txt")).unwrap(), b"g");
    assert_eq!(std::fs::read(rb.join("taken.txt")).unwrap(), b"taken");
    b.ok(
        "files/rename",
        json!({"oldPath": "a/g.txt", "newPath": "b/taken.txt", "overwrite": true}),
    );
    assert!(!ra.join("g.txt").exists());
    assert_eq!(std::fs::read(rb.join("taken.txt")).unwrap(), b"g");

    // Either root itself.
    for params in [
        json!({"oldPath": "a", "newPath": "b/a"}),
        json!({"oldPath": "b/taken.txt", "newPath": "a", "overwrite": true}),
    ] {
        let e = b.err("files/rename", params.clone());
        assert_eq!(code(&e), "PERMISSION_DENIED", "{params}: {e}");
    }
    assert!(ra.is_dir() && rb.is_dir());
    assert_no_staging(&base);
}

/// Two folders on different file systems (the temp dir and `/dev/shm`), or `None` with
/// `SKIPPED` (a failure in CI) where there are no two.
fn two_file_systems(base: &Path) -> Option<(tempfile::TempDir, PathBuf, PathBuf)> {
    let Ok(shm) = tempfile::Builder::new()
        .prefix("fsbroker-write-test")
        .tempdir_in("/dev/shm")
    else {
        common::skipped("/dev/shm is not usable here");
        return None;
    };
    let shm_root = shm.path().canonicalize().unwrap();
    let disk_root = base.join("disk");
    std::fs::create_dir(&disk_root).unwrap();
    if std::fs::metadata(&disk_root).unwrap().dev() == std::fs::metadata(&shm_root).unwrap().dev() {
        common::skipped("/dev/shm is on the same file system as the temp dir");
        return None;
    }
    Some((shm, disk_root, shm_root))
}

/// Attack (the fourth hostile review): a move across file systems copies the whole file, and
/// at 1 MiB/s the copy of 32 MiB must pay for it first: within `timeout_ms` it cannot, so the
/// move is refused `TIMEOUT` before anything is read or written. (It copied 2 GB in 10 s.)
#[test]
fn a_move_across_file_systems_pays_the_byte_rate() {
    let (_t, base) = tempdir();
    let Some((_shm, disk_root, shm_root)) = two_file_systems(&base) else {
        return;
    };
    std::fs::write(disk_root.join("big.bin"), vec![1u8; 32 << 20]).unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&disk_root).name("disk").rw())
        .root(RootToml::at(&shm_root).name("shm").rw())
        .unlimited_with("bytes_per_second = 1048576\ntimeout_ms = 1000")
        .write_to(&base.join("policy.toml"));
    let mut b = Fsb::spawn(&["serve", "--policy", policy.to_str().unwrap()]);
    let e = b.err(
        "files/rename",
        json!({"oldPath": "disk/big.bin", "newPath": "shm/big.bin"}),
    );
    assert_eq!(code(&e), "TIMEOUT", "{e}");
    assert_eq!(
        std::fs::metadata(disk_root.join("big.bin")).unwrap().len(),
        32 << 20
    );
    assert!(!shm_root.join("big.bin").exists());
    assert_no_staging(&shm_root);
    // A small one fits the rate and moves.
    std::fs::write(disk_root.join("small.bin"), vec![2u8; 64 << 10]).unwrap();
    b.ok(
        "files/rename",
        json!({"oldPath": "disk/small.bin", "newPath": "shm/small.bin"}),
    );
    assert_eq!(
        std::fs::read(shm_root.join("small.bin")).unwrap().len(),
        64 << 10
    );
}

#[test]
fn rename_across_file_systems() {
    let (_t, base) = tempdir();
    let Some((_shm, disk_root, shm_root)) = two_file_systems(&base) else {
        return;
    };
    let (dev_disk, dev_shm) = (
        std::fs::metadata(&disk_root).unwrap().dev(),
        std::fs::metadata(&shm_root).unwrap().dev(),
    );
    let data = random_bytes(11, 3 * 1024 * 1024 + 5);
    std::fs::write(disk_root.join("big.bin"), &data).unwrap();
    std::fs::set_permissions(
        disk_root.join("big.bin"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(shm_root.join("small.txt"), b"small").unwrap();
    std::fs::write(shm_root.join("taken.txt"), b"taken").unwrap();
    std::fs::write(disk_root.join("other.txt"), b"other").unwrap();
    let (_p, mut b) = serve_roots(&[(&disk_root, "disk"), (&shm_root, "shm")]);

    b.ok(
        "files/rename",
        json!({"oldPath": "disk/big.bin", "newPath": "shm/big.bin"}),
    );
    assert!(std::fs::symlink_metadata(disk_root.join("big.bin")).is_err());
    assert!(std::fs::read(shm_root.join("big.bin")).unwrap() == data);
    assert_eq!(mode_of(&shm_root.join("big.bin")), 0o640);
    b.ok(
        "files/rename",
        json!({"oldPath": "shm/small.txt", "newPath": "disk/small.txt"}),
    );
    assert!(!shm_root.join("small.txt").exists());
    assert_eq!(
        std::fs::read(disk_root.join("small.txt")).unwrap(),
        b"small"
    );

    // Existing target without overwrite: both unchanged, nothing staged left.
    let e = b.err(
        "files/rename",
        json!({"oldPath": "disk/other.txt", "newPath": "shm/taken.txt"}),
    );
    assert_eq!(code(&e), "ALREADY_EXISTS", "{e}");
    assert_eq!(
        std::fs::read(disk_root.join("other.txt")).unwrap(),
        b"other"
    );
    assert_eq!(std::fs::read(shm_root.join("taken.txt")).unwrap(), b"taken");
    b.ok(
        "files/rename",
        json!({"oldPath": "disk/other.txt", "newPath": "shm/taken.txt", "overwrite": true}),
    );
    assert!(!disk_root.join("other.txt").exists());
    assert_eq!(std::fs::read(shm_root.join("taken.txt")).unwrap(), b"other");
    assert_no_staging(&disk_root);
    assert_no_staging(&shm_root);
    println!("cross-file-system rename tested (st_dev {dev_disk} -> {dev_shm})");
}

// ---------------------------------------------------------------------------------------------
// Atomicity, crashes and failures mid-way
// ---------------------------------------------------------------------------------------------

const EIGHT_MIB: usize = 8 * 1024 * 1024;

#[test]
fn readers_never_see_a_torn_file_during_8_mib_rewrites() {
    let (_t, root) = fixture();
    let target = root.join("big.txt");
    std::fs::write(&target, vec![b'A'; EIGHT_MIB]).unwrap();
    // 8 MiB writes: above the default max_chunk_size (7 MiB), so allowed here.
    let (_p, mut b) = serve_policy(&root, RW, "max_chunk_size = 8388608");

    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let reader = {
        let (stop, reads, target) = (Arc::clone(&stop), Arc::clone(&reads), target.clone());
        std::thread::spawn(move || {
            let (mut seen_a, mut seen_b) = (0u64, 0u64);
            let mut first = Some(started_tx);
            loop {
                let done = stop.load(Ordering::Acquire);
                let bytes = std::fs::read(&target).expect("the target must always exist");
                assert_eq!(bytes.len(), EIGHT_MIB, "short or long read: a torn file");
                let letter = bytes[0];
                assert!(letter == b'A' || letter == b'B', "unexpected byte {letter}");
                assert!(
                    bytes.iter().all(|&c| c == letter),
                    "a mixed file: starts with {} but not all of it",
                    letter as char
                );
                if letter == b'A' {
                    seen_a += 1;
                } else {
                    seen_b += 1;
                }
                reads.fetch_add(1, Ordering::Relaxed);
                if let Some(tx) = first.take() {
                    let _ = tx.send(());
                }
                if done {
                    return (seen_a, seen_b);
                }
            }
        })
    };
    started_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the reader made its first read");

    let rewrites = 20;
    let (a, bb) = ("A".repeat(EIGHT_MIB), "B".repeat(EIGHT_MIB));
    for i in 0..rewrites {
        let content = if i % 2 == 0 { &bb } else { &a };
        let r = b.ok(
            "files/write",
            json!({"path": "r/big.txt", "content": content}),
        );
        assert_eq!(r["bytesWritten"], json!(EIGHT_MIB));
        assert_eq!(r["size"], json!(EIGHT_MIB));
    }
    let during = reads.load(Ordering::Relaxed);
    stop.store(true, Ordering::Release);
    let (seen_a, seen_b) = reader.join().expect("reader saw a torn file");
    let total = reads.load(Ordering::Relaxed);
    println!(
        "atomicity: {rewrites} rewrites of 8 MiB; {total} whole-file reads checked \
         ({during} while rewriting; {seen_a} all-A, {seen_b} all-B), none torn"
    );
    assert!(total > 0);
    // The last rewrite (i = 19) wrote A.
    let last = std::fs::read(&target).unwrap();
    assert!(last.len() == EIGHT_MIB && last.iter().all(|&c| c == b'A'));
    assert_no_staging(&root);
}

#[test]
fn sigkill_mid_upload_leaves_the_target_with_its_old_content() {
    let (_t, root) = fixture();
    let old = random_bytes(5, 50_000);
    std::fs::write(root.join("victim.bin"), &old).unwrap();
    let (_p, mut b) = rw(&root);
    let new = random_bytes(6, 5 * 200_000);
    for i in 0..3 {
        let part = &new[i * 200_000..(i + 1) * 200_000];
        let r = chunk(&mut b, "r/victim.bin", i * 200_000, part, false);
        assert!(r.get("error").is_none(), "chunk {i}: {r}");
        assert_eq!(r["result"]["bytesWritten"], 200_000);
    }
    let status = b.kill_now();
    println!("broker killed: {status:?}");
    assert!(
        std::fs::read(root.join("victim.bin")).unwrap() == old,
        "the target changed although the upload never committed"
    );
    println!(
        "staging files left after SIGKILL (expected): {:?}",
        staging_files(&root)
    );

    // A new broker serves the old content and hides the leftover.
    let (_p2, mut b2) = rw(&root);
    assert_eq!(read_back(&mut b2, "r/victim.bin").0, old);
    let listed = b2.ok("files/list", json!({"path": "r", "includeHidden": true}));
    assert!(!listed.to_string().contains(".fsbroker-"), "{listed}");
}

/// Reads `Max file size` (soft limit) from `/proc/PID/limits`, in bytes.
fn fsize_limit(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max file size"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[test]
fn a_write_failing_mid_way_leaves_the_target_intact() {
    let (_t, root) = fixture();
    let old = b"old content that must survive\n".to_vec();
    std::fs::write(root.join("t.bin"), &old).unwrap();
    // `ulimit -f` counts 512-byte blocks in dash, 1024-byte ones in bash: 32 or 64 KiB.
    let script = "ulimit -f 64 && trap '' XFSZ && exec \"$0\" \"$@\"";
    let mut b = Fsb::spawn_program(
        "sh",
        &[
            "-c",
            script,
            common::bin(),
            "serve",
            "--root",
            root.to_str().unwrap(),
            "--read-write",
        ],
    );
    // The first answer proves the exec happened; then the limit can be read.
    assert_eq!(b.ok("ping", json!({})), json!({}));
    let limit = fsize_limit(b.pid()).expect("RLIMIT_FSIZE of the broker");
    println!("broker RLIMIT_FSIZE: {limit} bytes");
    assert!(limit <= 64 * 1024, "the limit did not apply: {limit}");

    let big = random_bytes(8, 1024 * 1024);
    let r = b.request(
        "files/write",
        json!({"path": "proj/t.bin", "content": b64(&big), "encoding": "base64"}),
    );
    let e = &r["error"];
    assert!(
        ["IO_ERROR", "QUOTA_EXCEEDED"].contains(&code(e).as_str()),
        "a write past RLIMIT_FSIZE: {r}"
    );
    println!("1 MiB write under RLIMIT_FSIZE answered: {e}");
    assert_eq!(std::fs::read(root.join("t.bin")).unwrap(), old);
    assert_no_staging(&root);
    // A new file too: nothing is left.
    let r = b.request(
        "files/write",
        json!({"path": "proj/new.bin", "content": b64(&big), "encoding": "base64"}),
    );
    assert!(
        ["IO_ERROR", "QUOTA_EXCEEDED"].contains(&code(&r["error"]).as_str()),
        "{r}"
    );
    assert!(!root.join("new.bin").exists());
    assert_no_staging(&root);

    // An upload whose chunks cross the limit.
    let part = &big[..16 * 1024];
    let mut failed = None;
    for i in 0..16 {
        let r = chunk(&mut b, "proj/t.bin", i * part.len(), part, i == 15);
        if let Some(e) = r.get("error") {
            failed = Some((i, e.clone()));
            break;
        }
        assert_eq!(std::fs::read(root.join("t.bin")).unwrap(), old);
    }
    let (at, e) = failed.expect("an upload of 256 KiB must fail under the limit");
    assert!(
        ["IO_ERROR", "QUOTA_EXCEEDED"].contains(&code(&e).as_str()),
        "chunk {at}: {e}"
    );
    println!("upload failed at chunk {at}: {e}");
    assert_eq!(std::fs::read(root.join("t.bin")).unwrap(), old);
    assert_no_staging(&root);

    // A small write in the same session still works.
    let small = random_bytes(9, 1024);
    let r = b.ok(
        "files/write",
        json!({"path": "proj/t.bin", "content": b64(&small), "encoding": "base64"}),
    );
    assert_eq!(r["size"], 1024);
    assert_eq!(std::fs::read(root.join("t.bin")).unwrap(), small);
    assert_no_staging(&root);
    let (status, _) = with_deadline(Duration::from_secs(30), || {}, move || b.finish());
    assert!(status.success(), "{status:?}");
}

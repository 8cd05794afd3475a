//! `files/list` through the real binary, on real temp directories (docs/protocol.md §3, §4, §5.6).
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Fsb, code, serve_policy, tempdir};
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

/// Creates `rel` (a file with `content`, or a directory when `rel` ends in `/`).
fn touch(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    if rel.ends_with('/') {
        std::fs::create_dir_all(&p).unwrap();
    } else {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
    }
}

fn mkfifo(p: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(p)
        .status()
        .expect("run mkfifo");
    assert!(status.success());
}

fn paths(result: &Value) -> Vec<String> {
    entries(result)
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect()
}

fn entries(result: &Value) -> &Vec<Value> {
    result["entries"].as_array().expect("entries is an array")
}

fn by_path(result: &Value) -> BTreeMap<String, Value> {
    entries(result)
        .iter()
        .map(|e| (e["path"].as_str().unwrap().to_owned(), e.clone()))
        .collect()
}

/// Parses an RFC 3339 UTC timestamp (`YYYY-MM-DDTHH:MM:SS[.frac]Z`) into a `SystemTime`.
fn parse_rfc3339_utc(s: &str) -> SystemTime {
    let bad = || panic!("not an RFC 3339 UTC timestamp: {s:?}");
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        bad();
    }
    if b[16] != b':' || !s.ends_with('Z') {
        bad();
    }
    let num = |r: std::ops::Range<usize>| -> i64 {
        let t = &s[r];
        if !t.bytes().all(|c| c.is_ascii_digit()) {
            bad();
        }
        t.parse().unwrap()
    };
    let (y, mo, d) = (num(0..4), num(5..7), num(8..10));
    let (h, mi, sec) = (num(11..13), num(14..16), num(17..19));
    let frac = &s[19..s.len() - 1];
    let nanos = if frac.is_empty() {
        0
    } else {
        let digits = frac.strip_prefix('.').unwrap_or_else(bad);
        if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|c| c.is_ascii_digit()) {
            bad();
        }
        format!("{digits:0<9}").parse::<u32>().unwrap()
    };
    assert!((1..=12).contains(&mo) && (1..=31).contains(&d), "{s}");
    assert!(h < 24 && mi < 60 && sec < 61, "{s}");
    // Days from civil (Howard Hinnant).
    let (yy, m) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec;
    assert!(secs >= 0, "{s}");
    UNIX_EPOCH + Duration::new(secs as u64, nanos)
}

fn year_of(s: &str) -> i64 {
    s[..4].parse().unwrap()
}

/// Walks a listing page by page with `limit`, returning every entry in order and the number
/// of pages; checks that every page but the last is full and carries a `nextCursor`.
fn walk_pages(b: &mut Fsb, params: Value, limit: u64) -> (Vec<Value>, usize) {
    walk_clamped_pages(b, params, limit, limit)
}

/// [`walk_pages`] where a full page holds `page` entries (the limit after clamping).
fn walk_clamped_pages(b: &mut Fsb, params: Value, limit: u64, page: u64) -> (Vec<Value>, usize) {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut p = params.clone();
        p["limit"] = json!(limit);
        if let Some(c) = &cursor {
            p["cursor"] = json!(c);
        }
        let r = b.ok("files/list", p);
        pages += 1;
        let got = entries(&r).clone();
        assert!(got.len() as u64 <= page, "page over the limit: {r}");
        all.extend(got.iter().cloned());
        match r.get("nextCursor") {
            Some(c) => {
                assert_eq!(got.len() as u64, page, "a page with a cursor must be full");
                cursor = Some(c.as_str().expect("nextCursor is a string").to_owned());
            }
            None => break,
        }
        assert!(pages < 10_000, "runaway pagination");
    }
    (all, pages)
}

// ---------------------------------------------------------------------------------------------
// Entries
// ---------------------------------------------------------------------------------------------

#[test]
fn entry_fields_and_the_four_types() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), "12345").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    std::os::unix::fs::symlink("f.txt", root.join("link")).unwrap();
    mkfifo(&root.join("pipe"));
    let mut b = Fsb::serve_root(&root);
    // The root itself by its bare name.
    let r = b.ok("files/list", json!({"path": "proj"}));
    assert!(r.get("nextCursor").is_none(), "{r}");
    assert_eq!(
        paths(&r),
        ["proj/d", "proj/f.txt", "proj/link", "proj/pipe"]
    );
    let m = by_path(&r);
    let expect = [
        ("proj/d", "d", "directory"),
        ("proj/f.txt", "f.txt", "file"),
        ("proj/link", "link", "symlink"),
        ("proj/pipe", "pipe", "other"),
    ];
    for (path, name, kind) in expect {
        let e = &m[path];
        assert_eq!(e["name"], name, "{e}");
        assert_eq!(e["type"], kind, "{e}");
        assert!(e["size"].is_u64(), "{e}");
        let modified = e["modified"].as_str().expect("modified is a string");
        assert!(modified.ends_with('Z'), "{modified}");
        let year = year_of(modified);
        assert!((2000..2200).contains(&year), "{modified}");
        let t = parse_rfc3339_utc(modified);
        let now = SystemTime::now();
        assert!(
            t <= now + Duration::from_secs(60),
            "{modified} is in the future"
        );
        for k in ["name", "path", "type", "size", "modified"] {
            assert!(e.get(k).is_some(), "missing {k}: {e}");
        }
    }
    assert_eq!(m["proj/f.txt"]["size"], 5);
    // A symlink's size is the link's own (the length of its target text), not the target's.
    assert_eq!(m["proj/link"]["size"], 5);
    assert_eq!(m["proj/pipe"]["size"], 0);
}

#[test]
fn modified_is_the_file_time_in_utc() {
    let (_t, root) = fixture();
    let f = root.join("old.txt");
    std::fs::write(&f, "x").unwrap();
    let when = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123); // 2023-11-14T22:13:20.123Z
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(when)
        .unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/list", json!({"path": "proj"}));
    let modified = entries(&r)[0]["modified"].as_str().unwrap().to_owned();
    assert!(modified.starts_with("2023-11-14T22:13:20"), "{modified}");
    let t = parse_rfc3339_utc(&modified);
    let diff = t.duration_since(when).unwrap_or_else(|e| e.duration());
    assert!(diff < Duration::from_secs(1), "{modified}");
}

#[test]
fn sorted_by_path_in_byte_order() {
    let (_t, root) = fixture();
    for rel in [
        "a/b.txt", "a-x", "a.b", "a0", "B", "b", "Z/z", "_u", "a/c/", "é", "zz/", "a b",
    ] {
        touch(&root, rel, "x");
    }
    let mut b = Fsb::serve_root(&root);
    let flat = b.ok("files/list", json!({"path": "proj"}));
    let p = paths(&flat);
    let mut sorted = p.clone();
    sorted.sort();
    assert_eq!(p, sorted);
    assert_eq!(
        p,
        [
            "proj/B", "proj/Z", "proj/_u", "proj/a", "proj/a b", "proj/a-x", "proj/a.b", "proj/a0",
            "proj/b", "proj/zz", "proj/é"
        ]
    );
    let deep = b.ok("files/list", json!({"path": "proj", "recursive": true}));
    let p = paths(&deep);
    assert_eq!(
        p,
        [
            "proj/B",
            "proj/Z",
            "proj/Z/z",
            "proj/_u",
            "proj/a",
            "proj/a b",
            "proj/a-x",
            "proj/a.b",
            "proj/a/b.txt",
            "proj/a/c",
            "proj/a0",
            "proj/b",
            "proj/zz",
            "proj/é",
        ],
        "recursive listings are sorted by the whole path, not depth first"
    );
}

#[test]
fn recursive_lists_the_whole_tree() {
    let (_t, root) = fixture();
    for rel in [
        "top.txt",
        "a/one.txt",
        "a/b/two.txt",
        "a/b/c/three.txt",
        "e/",
    ] {
        touch(&root, rel, "data");
    }
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/list", json!({"path": "proj", "recursive": true}));
    assert_eq!(
        paths(&r),
        [
            "proj/a",
            "proj/a/b",
            "proj/a/b/c",
            "proj/a/b/c/three.txt",
            "proj/a/b/two.txt",
            "proj/a/one.txt",
            "proj/e",
            "proj/top.txt",
        ]
    );
    let m = by_path(&r);
    assert_eq!(m["proj/a/b/c/three.txt"]["name"], "three.txt");
    assert_eq!(m["proj/a/b/c/three.txt"]["size"], 4);
    assert_eq!(m["proj/a/b"]["type"], "directory");
    // Not recursive: one level only.
    let r = b.ok("files/list", json!({"path": "proj/a"}));
    assert_eq!(paths(&r), ["proj/a/b", "proj/a/one.txt"]);
    // Recursive from a subdirectory.
    let r = b.ok("files/list", json!({"path": "proj/a/b", "recursive": true}));
    assert_eq!(
        paths(&r),
        ["proj/a/b/c", "proj/a/b/c/three.txt", "proj/a/b/two.txt"]
    );
    // An empty directory.
    let r = b.ok("files/list", json!({"path": "proj/e", "recursive": true}));
    assert_eq!(entries(&r).len(), 0);
    assert!(r.get("nextCursor").is_none());
}

#[test]
fn recursion_never_follows_symlinks() {
    let (t, root) = fixture();
    touch(&root, "real/inner.txt", "in");
    touch(&root, "real/deeper/x.txt", "x");
    std::os::unix::fs::symlink("real", root.join("linkdir")).unwrap();
    // A symlink loop and a link leading out of the root.
    std::os::unix::fs::symlink(".", root.join("real/self")).unwrap();
    let outside = t.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "s").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/list", json!({"path": "proj", "recursive": true}));
    assert_eq!(
        paths(&r),
        [
            "proj/linkdir",
            "proj/out",
            "proj/real",
            "proj/real/deeper",
            "proj/real/deeper/x.txt",
            "proj/real/inner.txt",
            "proj/real/self",
        ]
    );
    let m = by_path(&r);
    assert_eq!(m["proj/linkdir"]["type"], "symlink");
    assert_eq!(m["proj/out"]["type"], "symlink");
    assert_eq!(m["proj/real/self"]["type"], "symlink");
    assert!(!r.to_string().contains("secret.txt"));
}

#[test]
fn hidden_entries_need_include_hidden() {
    let (_t, root) = fixture();
    for rel in [
        ".hidden",
        ".hdir/inner.txt",
        ".hdir/sub/deep.txt",
        "visible/.dot",
        "visible/plain.txt",
        "top.txt",
    ] {
        touch(&root, rel, "x");
    }
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/list", json!({"path": "proj", "recursive": true}));
    assert_eq!(
        paths(&r),
        ["proj/top.txt", "proj/visible", "proj/visible/plain.txt"],
        "hidden entries are left out and hidden directories not descended"
    );
    let r = b.ok(
        "files/list",
        json!({"path": "proj", "recursive": true, "includeHidden": false}),
    );
    assert_eq!(entries(&r).len(), 3);
    let r = b.ok(
        "files/list",
        json!({"path": "proj", "recursive": true, "includeHidden": true}),
    );
    assert_eq!(
        paths(&r),
        [
            "proj/.hdir",
            "proj/.hdir/inner.txt",
            "proj/.hdir/sub",
            "proj/.hdir/sub/deep.txt",
            "proj/.hidden",
            "proj/top.txt",
            "proj/visible",
            "proj/visible/.dot",
            "proj/visible/plain.txt",
        ]
    );
    // Listing a hidden directory by name works; its own hidden children still need the flag.
    touch(&root, ".hdir/.inner-hidden", "x");
    let r = b.ok("files/list", json!({"path": "proj/.hdir"}));
    assert_eq!(paths(&r), ["proj/.hdir/inner.txt", "proj/.hdir/sub"]);
}

#[test]
fn denied_globs_never_appear() {
    let (_t, root) = fixture();
    for rel in [
        ".git/config",
        ".git/objects/ab/cdef",
        ".gitignore",
        ".env",
        "sub/.env",
        "sub/deep/.env",
        "sub/keep.txt",
        "secrets/key.pem",
        "secrets/nested/more",
        "a/secrets",
        "secretsx",
        "src/main.rs",
    ] {
        touch(&root, rel, "x");
    }
    let (_p, mut b) = serve_policy(&root, r#"deny = [".git/**", "**/.env", "secrets"]"#, "");
    for hidden in [false, true] {
        let r = b.ok(
            "files/list",
            json!({"path": "r", "recursive": true, "includeHidden": hidden}),
        );
        let p = paths(&r);
        let mut want = vec![
            "r/a",
            "r/a/secrets",
            "r/secretsx",
            "r/src",
            "r/src/main.rs",
            "r/sub",
            "r/sub/deep",
            "r/sub/keep.txt",
        ];
        if hidden {
            want.insert(0, "r/.gitignore");
        }
        assert_eq!(p, want, "includeHidden {hidden}");
        for path in &p {
            assert!(
                !path.starts_with("r/.git/") && path != "r/.git",
                "denied {path}"
            );
            assert!(!path.ends_with("/.env"), "denied {path}");
            assert!(!path.starts_with("r/secrets/") && path != "r/secrets");
        }
    }
    // Not recursive either.
    let r = b.ok(
        "files/list",
        json!({"path": "r/sub", "includeHidden": true}),
    );
    assert_eq!(paths(&r), ["r/sub/deep", "r/sub/keep.txt"]);
    // Listing or reading a denied path directly is refused.
    for path in ["r/.git", "r/.git/objects", "r/secrets", "r/secrets/nested"] {
        let e = b.err("files/list", json!({"path": path, "includeHidden": true}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{path}: {e}");
        assert_eq!(e["code"], -31002);
    }
    for path in [
        "r/.env",
        "r/sub/deep/.env",
        "r/.git/config",
        "r/secrets/key.pem",
    ] {
        let e = b.err("files/read", json!({"path": path}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{path}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Pagination
// ---------------------------------------------------------------------------------------------

/// About 250 entries, with names that sort across directory boundaries (`a-x` < `a/b`).
fn big_tree(root: &Path) -> usize {
    let mut n = 0;
    for d in ["a", "a-x", "a.b", "a0", "b", "c", "d", "é"] {
        std::fs::create_dir(root.join(d)).unwrap();
        n += 1;
        for i in 0..25 {
            std::fs::write(root.join(d).join(format!("f{i:02}")), "x").unwrap();
            n += 1;
        }
    }
    std::fs::create_dir_all(root.join("a/sub/deeper")).unwrap();
    n += 2;
    for i in 0..20 {
        std::fs::write(root.join("a/sub/deeper").join(format!("g{i}")), "y").unwrap();
        n += 1;
    }
    for i in 0..25 {
        std::fs::write(root.join(format!("top{i:02}")), "z").unwrap();
        n += 1;
    }
    n
}

#[test]
fn pages_concatenate_to_the_full_listing_exactly_once() {
    let (_t, root) = fixture();
    let n = big_tree(&root);
    assert!((240..=260).contains(&n), "{n}");
    let mut b = Fsb::serve_root(&root);
    let params = json!({"path": "proj", "recursive": true});
    let full = b.ok("files/list", params.clone());
    assert!(full.get("nextCursor").is_none());
    let full_entries = entries(&full).clone();
    assert_eq!(full_entries.len(), n);
    let full_paths = paths(&full);
    let mut sorted = full_paths.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(full_paths, sorted, "sorted and without duplicates");

    // Later pages skip the folders earlier ones finished and those past their own end: page
    // boundaries anywhere (inside `a/sub/deeper`, between `a.b` and `a/…`, at `a0`) must not
    // lose or repeat an entry.
    for limit in [3, 7, 13, 50] {
        let (paged, pages) = walk_pages(&mut b, params.clone(), limit);
        assert_eq!(pages, n.div_ceil(limit as usize), "limit {limit}");
        let paged_paths: Vec<_> = paged
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(paged_paths, full_paths, "limit {limit}");
        assert_eq!(
            paged, full_entries,
            "pages carry the same entries (limit {limit})"
        );
    }

    // Flat, with a limit that divides the count exactly: the last full page has no cursor
    // or is followed by an empty one; either way nothing repeats.
    let (flat, _) = walk_pages(&mut b, json!({"path": "proj/a"}), 5);
    let flat_paths: Vec<_> = flat.iter().map(|e| e["path"].as_str().unwrap()).collect();
    let want: Vec<String> = (0..25)
        .map(|i| format!("proj/a/f{i:02}"))
        .chain(["proj/a/sub".to_owned()])
        .collect();
    assert_eq!(flat_paths, want);
    let (flat, pages) = walk_pages(&mut b, json!({"path": "proj/b"}), 5);
    assert_eq!(flat.len(), 25);
    assert_eq!(pages, 5, "no empty trailing page");
}

#[test]
fn limit_is_clamped_to_max_list_entries() {
    let (_t, root) = fixture();
    for i in 0..12 {
        std::fs::write(root.join(format!("f{i:02}")), "x").unwrap();
    }
    let (_p, mut b) = serve_policy(&root, "", "max_list_entries = 5");
    let r = b.ok("files/list", json!({"path": "r", "limit": 100}));
    assert_eq!(entries(&r).len(), 5);
    assert!(r["nextCursor"].is_string(), "{r}");
    let r = b.ok("files/list", json!({"path": "r"}));
    assert_eq!(entries(&r).len(), 5, "the default page is max_list_entries");
    assert!(r["nextCursor"].is_string());
    let r = b.ok("files/list", json!({"path": "r", "limit": 3}));
    assert_eq!(entries(&r).len(), 3);
    let (all, pages) = walk_clamped_pages(&mut b, json!({"path": "r"}), 100_000, 5);
    assert_eq!(all.len(), 12);
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..12).map(|i| format!("r/f{i:02}")).collect();
    let got: Vec<_> = all.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(got, want);
}

#[test]
fn bad_limit_and_cursor_are_invalid_params() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f"), "x").unwrap();
    let mut b = Fsb::serve_root(&root);
    let bad = [
        json!({"path": "proj", "limit": 0}),
        json!({"path": "proj", "limit": -1}),
        json!({"path": "proj", "limit": "5"}),
        json!({"path": "proj", "cursor": "!!!garbage!!!"}),
        json!({"path": "proj", "cursor": "aGVsbG8"}), // base64url of "hello": not ours
        json!({"path": "proj", "cursor": ""}),
        json!({"path": "proj", "cursor": 5}),
        json!({"path": "proj", "recursive": "yes"}),
        json!({"path": "proj", "includeHidden": 1}),
        json!({"path": "proj", "recursiv": true}),
        json!({"path": 7}),
        json!({}),
    ];
    for params in bad {
        let e = b.err("files/list", params.clone());
        assert_eq!(e["code"], -32602, "{params}: {e}");
        let r = b.ok("files/list", json!({"path": "proj"}));
        assert_eq!(paths(&r), ["proj/f"]);
    }
    // `_meta` is accepted.
    let r = b.ok(
        "files/list",
        json!({"path": "proj", "_meta": {"progressToken": 3}}),
    );
    assert_eq!(paths(&r), ["proj/f"]);
}

// ---------------------------------------------------------------------------------------------
// Errors and path forms
// ---------------------------------------------------------------------------------------------

#[test]
fn listing_a_file_is_invalid_path() {
    let (_t, root) = fixture();
    std::fs::write(root.join("f.txt"), "x").unwrap();
    mkfifo(&root.join("pipe"));
    let mut b = Fsb::serve_root(&root);
    for path in ["proj/f.txt", "proj/pipe"] {
        let e = b.err("files/list", json!({"path": path}));
        assert_eq!(e["code"], -31003, "{path}: {e}");
        assert_eq!(code(&e), "INVALID_PATH");
        assert_eq!(e["data"]["path"], path);
    }
    let e = b.err("files/list", json!({"path": "proj/missing"}));
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    assert_eq!(e["code"], -31001);
    let e = b.err("files/list", json!({"path": "/etc"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
}

#[test]
fn every_path_form_lists_with_name_rel_results() {
    let (_t, root) = fixture();
    touch(&root, "my dir é/x.txt", "x");
    let mut b = Fsb::serve_root(&root);
    let abs = root.join("my dir é");
    let want = ["proj/my dir é/x.txt"];
    for path in [
        "proj/my dir é".to_owned(),
        "my dir é".to_owned(),
        abs.to_str().unwrap().to_owned(),
        format!("file://{}/my%20dir%20%C3%A9", root.to_str().unwrap()),
    ] {
        let r = b.ok("files/list", json!({"path": path}));
        assert_eq!(paths(&r), want, "{path}");
    }
    // The root by every form.
    for path in [
        "proj".to_owned(),
        ".".to_owned(),
        root.to_str().unwrap().to_owned(),
        format!("file://{}", root.to_str().unwrap()),
    ] {
        let r = b.ok("files/list", json!({"path": path}));
        assert_eq!(paths(&r), ["proj/my dir é"], "{path}");
    }
}

#[test]
fn result_paths_can_be_sent_back_as_they_are() {
    let (_t, root) = fixture();
    let files = [
        ("top.txt", "top"),
        ("a b/é ü.txt", "unicode and spaces"),
        ("deep/er/still/f.rs", "fn f() {}"),
        ("deep/x", "x"),
    ];
    for (rel, content) in files {
        touch(&root, rel, content);
    }
    let mut b = Fsb::serve_root(&root);
    let r = b.ok("files/list", json!({"path": "proj", "recursive": true}));
    let mut read = 0;
    for e in entries(&r) {
        let path = e["path"].as_str().unwrap();
        assert!(path.starts_with("proj/"), "{path}");
        match e["type"].as_str().unwrap() {
            "file" => {
                let got = b.ok("files/read", json!({"path": path}));
                let rel = &path["proj/".len()..];
                let want = files.iter().find(|(r, _)| *r == rel).unwrap().1;
                assert_eq!(got["content"], want, "{path}");
                assert_eq!(got["size"], e["size"]);
                read += 1;
            }
            "directory" => {
                let sub = b.ok("files/list", json!({"path": path}));
                for child in entries(&sub) {
                    let cp = child["path"].as_str().unwrap();
                    assert!(cp.starts_with(&format!("{path}/")), "{cp} under {path}");
                }
            }
            other => panic!("unexpected type {other}"),
        }
    }
    assert_eq!(read, files.len());
}

/// Rule (§3, "which form"): with a single root, a first segment that names the root means the
/// root, even when the root holds an entry of that name (`--root .` in a clone named `src`):
/// `files/list {"path":"src"}` lists the root, and the entry is `src/src`. The broker warns of
/// this on stderr at start, naming the way round it; a root without such an entry gets no
/// warning.
#[test]
fn a_root_named_like_its_own_entry_is_listed_by_its_name_and_warned_of() {
    use common::fsb::{Cmd, Log};
    let (_t, base) = tempdir();
    let src = base.join("src");
    touch(&src, "src/inner.rs", "x");
    touch(&src, "top.txt", "y");
    let mut b = Cmd::new(&["serve", "--root", "."])
        .cwd(&src)
        .log(Log::Keep)
        .spawn();
    let listed = b.ok("files/list", json!({"path": "src"}));
    assert_eq!(paths(&listed), ["src/src", "src/top.txt"], "{listed}");
    let inner = b.ok("files/list", json!({"path": "src/src"}));
    assert_eq!(paths(&inner), ["src/src/inner.rs"], "{inner}");
    let (status, _) = b.end();
    assert!(b.log_closed_within(Duration::from_secs(10)));
    let log = b.log_text();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("root \"src\"")
            && log.contains("holds an entry also named \"src\"")
            && log.contains("\"src/src\""),
        "{log}"
    );

    // The same tree under another name: nothing to warn of.
    let plain = base.join("plain");
    touch(&plain, "src/inner.rs", "x");
    let mut b = Cmd::new(&["serve", "--root", "."])
        .cwd(&plain)
        .log(Log::Keep)
        .spawn();
    let listed = b.ok("files/list", json!({"path": "src"}));
    assert_eq!(paths(&listed), ["plain/src/inner.rs"], "{listed}");
    let (status, _) = b.end();
    assert!(b.log_closed_within(Duration::from_secs(10)));
    let log = b.log_text();
    assert!(status.success(), "{log}");
    assert!(!log.contains("holds an entry also named"), "{log}");
}

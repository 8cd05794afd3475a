//! The hash-chained audit log (docs/protocol.md §8) through the real binary on
//! real temp dirs: a start line (`event`, `pid`, `version`) opening each run's part of the log,
//! then one line per `roots/list` and `files/*` request, allowed or refused, with the chained
//! sha256 recomputed here independently over every line; `fsbroker audit verify` naming the
//! first bad line of an edited, deleted, swapped, inserted or truncated log; `redact_paths`; a
//! restart adding a second start line and continuing the chain, and a torn log refusing to
//! start (naming its torn line); an unwritable log failing closed; refusals warned on stderr.
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use common::fsb::{Cmd, Log};
use common::{Fsb, PolicyToml, RootToml, bin, code, tempdir, uri_path};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The `prev` of the first line.
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The crate version a start line must name.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The keys a start line carries, exactly.
const START_KEYS: [&str; 7] = [
    "event",
    "pid",
    "version",
    "firstSession",
    "ts",
    "prev",
    "hash",
];

/// The keys every request line carries.
const ALWAYS: [&str; 8] = [
    "ts",
    "session",
    "method",
    "outcome",
    "bytes",
    "durationMs",
    "prev",
    "hash",
];

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A temp dir holding a root `proj` (files `f1.txt` .. `f5.txt`, `notes.txt`, `data.bin`, a
/// directory `sub`), a sibling directory `outside` with `secret.txt`, and room for logs.
struct Ws {
    _t: tempfile::TempDir,
    dir: PathBuf,
    root: PathBuf,
    outside_file: PathBuf,
}

fn workspace() -> Ws {
    let (t, dir) = tempdir();
    let root = dir.join("proj");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    for i in 1..=5 {
        std::fs::write(root.join(format!("f{i}.txt")), format!("file number {i}\n")).unwrap();
    }
    std::fs::write(root.join("notes.txt"), "some notes\n").unwrap();
    std::fs::write(root.join("data.bin"), [0u8, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    std::fs::create_dir(dir.join("outside")).unwrap();
    let outside_file = dir.join("outside").join("secret.txt");
    std::fs::write(&outside_file, "not yours\n").unwrap();
    Ws {
        _t: t,
        dir,
        root,
        outside_file,
    }
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// `fsbroker serve --root ROOT --read-write EXTRA...` in the workspace, `RUST_LOG=warn`, stderr
/// into `stderr_file`.
fn serve(ws: &Ws, extra: &[&str], stderr_file: &Path) -> Fsb {
    let mut args = vec![
        "serve".to_owned(),
        "--root".to_owned(),
        s(&ws.root),
        "--read-write".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Cmd::new(&args)
        .cwd(&ws.dir)
        .env("RUST_LOG", "warn")
        .log(Log::File(stderr_file.to_owned()))
        .spawn()
}

/// Runs `fsbroker ARGS` with stdin closed and returns its output.
fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run fsbroker")
}

fn verify(log: &Path) -> Output {
    run(&["audit", "verify", log.to_str().unwrap()])
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Closes stdin, waits for a clean exit, and returns the broker's stderr.
fn finish(b: Fsb, stderr_file: &Path) -> String {
    let (status, rest) = b.finish();
    let err = std::fs::read_to_string(stderr_file).unwrap_or_default();
    assert!(status.success(), "fsbroker exited {status}; stderr:\n{err}");
    assert!(
        rest.is_empty(),
        "unexpected output after the last response: {rest}"
    );
    err
}

/// One parsed audit line and its raw text.
struct Line {
    raw: String,
    fields: BTreeMap<String, Value>,
}

/// Reads the log: every line must end in `\n` and be a JSON object.
fn read_log(log: &Path) -> (String, Vec<Line>) {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("read audit log {}: {e}", log.display()));
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the log does not end with a newline:\n{text}"
    );
    let lines = text
        .lines()
        .map(|raw| Line {
            raw: raw.to_owned(),
            fields: serde_json::from_str(raw)
                .unwrap_or_else(|e| panic!("audit line is not a JSON object ({e}): {raw}")),
        })
        .collect();
    (text, lines)
}

/// Checks the whole chain independently of the broker: each line is canonical JSON (compact,
/// keys sorted); `hash` is the sha256 hex of the line without `hash`, serialized the same way;
/// `prev` is 64 zeros on line 1 and the previous line's `hash` after that.
fn check_chain(lines: &[Line]) {
    let mut prev = GENESIS.to_owned();
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let again = serde_json::to_string(&line.fields).unwrap();
        assert_eq!(
            again, line.raw,
            "line {n} is not canonical JSON (compact, keys sorted)"
        );
        let mut fields = line.fields.clone();
        let hash = match fields.remove("hash") {
            Some(Value::String(h)) => h,
            other => panic!("line {n}: hash is {other:?}: {}", line.raw),
        };
        assert!(
            hash.len() == 64
                && hash
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "line {n}: hash is not 64 lower-case hex digits: {hash}"
        );
        assert_eq!(
            fields.get("prev").and_then(Value::as_str),
            Some(prev.as_str()),
            "line {n}: prev does not chain to the line before: {}",
            line.raw
        );
        let canonical = serde_json::to_vec(&fields).unwrap();
        assert_eq!(
            sha256_hex(&canonical),
            hash,
            "line {n}: hash is not the sha256 of the line's canonical JSON without hash: {}",
            line.raw
        );
        prev = hash;
    }
}

/// Milliseconds since the epoch of an RFC 3339 UTC timestamp
/// (`YYYY-MM-DDTHH:MM:SS[.fraction]Z`), or `None` when it is not one.
fn parse_rfc3339_utc(ts: &str) -> Option<i64> {
    let b = ts.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' {
        return None;
    }
    if b[16] != b':' || *b.last()? != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = ts.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let rest = &ts[19..ts.len() - 1];
    let millis = if rest.is_empty() {
        0
    } else {
        let frac = rest.strip_prefix('.')?;
        if frac.is_empty() || !frac.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        format!("{frac:0<3}")[..3].parse::<i64>().ok()?
    };
    // Howard Hinnant's days_from_civil.
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + millis)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What one audit line must say.
#[derive(Debug, Clone)]
struct Want {
    method: &'static str,
    path: Option<String>,
    new_path: Option<String>,
    paths: Option<Vec<String>>,
    outcome: String,
    bytes: u64,
}

fn want(method: &'static str, path: Option<&str>, outcome: &str, bytes: u64) -> Want {
    Want {
        method,
        path: path.map(str::to_owned),
        new_path: None,
        paths: None,
        outcome: outcome.to_owned(),
        bytes,
    }
}

/// Checks one line against what its request should have logged: exactly the expected keys
/// (plain or redacted paths), the values, a sane `durationMs`, an RFC 3339 UTC `ts` within
/// `[start_ms, end_ms]`.
fn check_line(n: usize, line: &Line, w: &Want, redacted: bool, start_ms: i64, end_ms: i64) {
    let f = &line.fields;
    let raw = &line.raw;
    let mut keys: BTreeSet<&str> = ALWAYS.into_iter().collect();
    let (pk, nk, psk) = if redacted {
        ("pathSha256", "newPathSha256", "pathsSha256")
    } else {
        ("path", "newPath", "paths")
    };
    let conv = |p: &str| {
        if redacted {
            sha256_hex(p.as_bytes())
        } else {
            p.to_owned()
        }
    };
    if let Some(p) = &w.path {
        keys.insert(pk);
        assert_eq!(f.get(pk), Some(&json!(conv(p))), "line {n} {pk}: {raw}");
    }
    if let Some(p) = &w.new_path {
        keys.insert(nk);
        assert_eq!(f.get(nk), Some(&json!(conv(p))), "line {n} {nk}: {raw}");
    }
    if let Some(ps) = &w.paths {
        keys.insert(psk);
        let conv_all: Vec<String> = ps.iter().map(|p| conv(p)).collect();
        assert_eq!(f.get(psk), Some(&json!(conv_all)), "line {n} {psk}: {raw}");
    }
    let have: BTreeSet<&str> = f.keys().map(String::as_str).collect();
    assert_eq!(have, keys, "line {n} has other keys than expected: {raw}");
    assert_eq!(f["method"], json!(w.method), "line {n} method: {raw}");
    assert_eq!(f["outcome"], json!(w.outcome), "line {n} outcome: {raw}");
    assert_eq!(f["bytes"], json!(w.bytes), "line {n} bytes: {raw}");
    let session = f["session"].as_u64();
    assert!(
        session.is_some_and(|s| s > 0),
        "line {n}: session is not a positive integer: {raw}"
    );
    let ms = f["durationMs"].as_f64();
    assert!(
        ms.is_some_and(|ms| (0.0..60_000.0).contains(&ms)),
        "line {n}: durationMs is not a plausible number of milliseconds: {raw}"
    );
    let ts = f["ts"].as_str().unwrap_or("");
    let t =
        parse_rfc3339_utc(ts).unwrap_or_else(|| panic!("line {n}: ts is not RFC 3339 UTC: {raw}"));
    assert!(
        (start_ms..=end_ms).contains(&t),
        "line {n}: ts {ts} is not within the run ({start_ms}..={end_ms} ms): {raw}"
    );
}

/// Whether `line` records a request (it has a `method`; a start line has none).
fn is_request(line: &Line) -> bool {
    line.fields.contains_key("method")
}

/// Whether `line` is a start line (`"event":"start"`).
fn is_start(line: &Line) -> bool {
    line.fields.get("event") == Some(&json!("start"))
}

/// Checks that line `n` is a start line written by the broker whose process id is `pid`:
/// exactly `event` "start", `pid`, `version` (this crate's), an RFC 3339 UTC `ts` within
/// `[start_ms, end_ms]`, `prev` and `hash` (no `method`, no `session`).
fn check_start(n: usize, line: &Line, pid: u32, start_ms: i64, end_ms: i64) {
    let f = &line.fields;
    let raw = &line.raw;
    assert!(is_start(line), "line {n} is not a start line: {raw}");
    let have: BTreeSet<&str> = f.keys().map(String::as_str).collect();
    let keys: BTreeSet<&str> = START_KEYS.into_iter().collect();
    assert_eq!(
        have, keys,
        "start line {n} has other keys than expected: {raw}"
    );
    assert_eq!(
        f["pid"],
        json!(pid),
        "start line {n}: pid is not the broker's ({pid}): {raw}"
    );
    assert_eq!(
        f["version"],
        json!(VERSION),
        "start line {n}: version is not the crate's ({VERSION}): {raw}"
    );
    let ts = f["ts"].as_str().unwrap_or("");
    let t = parse_rfc3339_utc(ts)
        .unwrap_or_else(|| panic!("start line {n}: ts is not RFC 3339 UTC: {raw}"));
    assert!(
        (start_ms..=end_ms).contains(&t),
        "start line {n}: ts {ts} is not within the run ({start_ms}..={end_ms} ms): {raw}"
    );
}

/// Checks that `lines`, the first of which is line `first_n` of the file, are one run of the
/// broker whose process id is `pid`: a start line first, then request lines only. Returns the
/// request lines (file line `first_n + 1 + i` is the `i`-th of them).
fn one_run(first_n: usize, lines: &[Line], pid: u32, start_ms: i64, end_ms: i64) -> &[Line] {
    let all: Vec<&str> = lines.iter().map(|l| l.raw.as_str()).collect();
    let first = lines
        .first()
        .unwrap_or_else(|| panic!("no start line at line {first_n}: the run logged nothing"));
    check_start(first_n, first, pid, start_ms, end_ms);
    // A run that ended cleanly ends with its seal.
    let mut requests = &lines[1..];
    if let Some(last) = requests.last() {
        if last.fields.get("event") == Some(&json!("seal")) {
            assert_eq!(
                last.fields["pid"],
                json!(pid),
                "a seal of another run: {}",
                last.raw
            );
            requests = &requests[..requests.len() - 1];
        }
    }
    for (i, line) in requests.iter().enumerate() {
        assert!(
            is_request(line) && !line.fields.contains_key("event"),
            "line {} is not a request line (a run has one start line, at its top):\n{}",
            first_n + 1 + i,
            all.join("\n")
        );
    }
    requests
}

/// Checks a whole one-run log of the broker `pid`: the start line, then the expected request
/// lines in order, and the chain over all of them from 64 zeros.
fn check_log(lines: &[Line], wants: &[Want], pid: u32, redacted: bool, start_ms: i64, end_ms: i64) {
    check_run(1, lines, wants, pid, redacted, start_ms, end_ms);
    check_chain(lines);
}

/// Checks one run's part of a log (`lines`, the first of which is line `first_n` of the file)
/// written by the broker `pid`: its start line, then the expected request lines in order. The
/// chain is the caller's to check, over the whole file.
fn check_run(
    first_n: usize,
    lines: &[Line],
    wants: &[Want],
    pid: u32,
    redacted: bool,
    start_ms: i64,
    end_ms: i64,
) {
    let all: Vec<&str> = lines.iter().map(|l| l.raw.as_str()).collect();
    let requests = one_run(first_n, lines, pid, start_ms, end_ms);
    assert_eq!(
        requests.len(),
        wants.len(),
        "expected one line per logged request ({}), got {}:\n{}",
        wants.len(),
        requests.len(),
        all.join("\n")
    );
    for (i, (line, w)) in requests.iter().zip(wants).enumerate() {
        check_line(first_n + 1 + i, line, w, redacted, start_ms, end_ms);
    }
    let sessions: BTreeSet<u64> = requests
        .iter()
        .filter_map(|l| l.fields["session"].as_u64())
        .collect();
    assert_eq!(
        sessions.len(),
        1,
        "one session, one session number: {sessions:?}"
    );
    let ts: Vec<i64> = lines
        .iter()
        .map(|l| parse_rfc3339_utc(l.fields["ts"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        ts.windows(2).all(|w| w[0] <= w[1]),
        "timestamps go backwards in a sequential session:\n{}",
        all.join("\n")
    );
}

/// The error object of a response, checked to be `IO_ERROR` "audit log unavailable".
fn assert_audit_unavailable(resp: &Value, what: &str) {
    let err = &resp["error"];
    assert!(
        resp.get("result").is_none(),
        "{what} answered without an audit line: {resp}"
    );
    assert_eq!(err["code"], json!(-31004), "{what}: {resp}");
    assert_eq!(err["data"]["code"], json!("IO_ERROR"), "{what}: {resp}");
    assert_eq!(
        err["data"]["reason"],
        json!("audit log unavailable"),
        "{what}: {resp}"
    );
}

/// The number in the first `line N` that `text` mentions.
fn first_line_named(text: &str) -> Option<usize> {
    text.match_indices("line ").find_map(|(i, m)| {
        let digits: String = text[i + m.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    })
}

/// A good log of 8 lines (the start line, roots/list, then reads of `proj/f1.txt` ..
/// `proj/f5.txt`, and the seal of the run), its text and its lines.
fn fresh_log(ws: &Ws) -> (PathBuf, String, Vec<String>) {
    let log = ws.dir.join("audit.jsonl");
    let err = ws.dir.join("fresh.stderr");
    let start = now_ms();
    let mut b = serve(ws, &["--audit", log.to_str().unwrap()], &err);
    let pid = b.pid();
    b.ok("roots/list", json!({}));
    let mut wants = vec![want("roots/list", None, "ok", 0)];
    for i in 1..=5 {
        let p = format!("proj/f{i}.txt");
        let r = b.ok("files/read", json!({"path": p}));
        wants.push(want(
            "files/read",
            Some(p.as_str()),
            "ok",
            r["length"].as_u64().unwrap(),
        ));
    }
    finish(b, &err);
    let end = now_ms();
    let (text, lines) = read_log(&log);
    assert_eq!(lines.len(), 8, "{text}");
    check_log(&lines, &wants, pid, false, start, end);
    let raw = lines.into_iter().map(|l| l.raw).collect();
    (log, text, raw)
}

fn join_lines(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Writes `text` as a log, runs `audit verify` on it and checks that it fails naming line `n`.
fn assert_broken_at(ws: &Ws, what: &str, text: &str, n: usize) {
    let path = ws
        .dir
        .join(format!("tampered-{}.jsonl", what.replace(' ', "-")));
    std::fs::write(&path, text).unwrap();
    let out = verify(&path);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "{what}: verify passed a tampered log: {}{err}\n{text}",
        stdout(&out)
    );
    assert_eq!(
        first_line_named(&err),
        Some(n),
        "{what}: verify should name line {n} as the first bad line; stderr: {err}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. One line per logged request, allowed or refused
// ---------------------------------------------------------------------------------------------

#[test]
fn allowed_and_refused_calls_each_get_one_chained_line() {
    let ws = workspace();
    let read_marker = "READ-MARKER-4c1d9e2f7a";
    let write_marker = "WRITE-MARKER-b83e51f0c6";
    let chunk1 = "CHUNK-ONE-6d20aa91";
    let chunk2 = "CHUNK-TWO-e7f3c0b2";
    std::fs::write(ws.root.join("marked.txt"), format!("{read_marker}\n")).unwrap();
    let log = ws.dir.join("audit.jsonl");
    let err_file = ws.dir.join("broker.stderr");
    let outside = s(&ws.outside_file);
    let start = now_ms();
    let mut b = serve(&ws, &["--audit", log.to_str().unwrap()], &err_file);
    let pid = b.pid();
    let mut wants: Vec<Want> = Vec::new();

    let r = b.ok("roots/list", json!({}));
    assert_eq!(r["roots"].as_array().map(Vec::len), Some(1), "{r}");
    wants.push(want("roots/list", None, "ok", 0));

    assert_eq!(b.ok("ping", json!({})), json!({}));

    let r = b.ok("files/read", json!({"path": "proj/marked.txt"}));
    assert!(r["content"].as_str().unwrap().contains(read_marker), "{r}");
    let len = r["length"].as_u64().unwrap();
    assert_eq!(len, read_marker.len() as u64 + 1);
    wants.push(want("files/read", Some("proj/marked.txt"), "ok", len));

    let e = b.err("files/read", json!({"path": outside}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    wants.push(want("files/read", Some(&outside), "PERMISSION_DENIED", 0));

    let r = b.ok("files/list", json!({"path": "proj"}));
    assert!(
        r["entries"].as_array().is_some_and(|e| !e.is_empty()),
        "{r}"
    );
    wants.push(want("files/list", Some("proj"), "ok", 0));

    let content = format!("{write_marker}\n");
    let r = b.ok(
        "files/write",
        json!({"path": "proj/new.txt", "content": b64(content.as_bytes()), "encoding": "base64"}),
    );
    assert_eq!(r["bytesWritten"], json!(content.len()), "{r}");
    wants.push(want(
        "files/write",
        Some("proj/new.txt"),
        "ok",
        content.len() as u64,
    ));

    let r = b.ok(
        "files/read",
        json!({"path": "proj/data.bin", "encoding": "base64", "offset": 2, "length": 4}),
    );
    assert_eq!(r["length"], json!(4), "{r}");
    wants.push(want("files/read", Some("proj/data.bin"), "ok", 4));

    b.ok(
        "files/rename",
        json!({"oldPath": "proj/new.txt", "newPath": "proj/renamed.txt"}),
    );
    wants.push(Want {
        new_path: Some("proj/renamed.txt".into()),
        ..want("files/rename", Some("proj/new.txt"), "ok", 0)
    });

    let r = b.ok(
        "files/read",
        json!({"path": "proj/renamed.txt", "encoding": "utf-8"}),
    );
    assert_eq!(r["content"], json!(content), "{r}");
    wants.push(want(
        "files/read",
        Some("proj/renamed.txt"),
        "ok",
        content.len() as u64,
    ));

    let requested = vec!["proj/notes.txt".to_owned(), "proj/sub".to_owned()];
    let r = b.ok(
        "files/consent",
        json!({"message": "to review the notes", "requestedPaths": requested}),
    );
    assert_eq!(r["granted"], json!(true), "{r}");
    wants.push(Want {
        paths: Some(requested),
        ..want("files/consent", None, "ok", 0)
    });

    let e = b.err("files/read", json!({"path": "proj/notes.txt", "lenght": 3}));
    assert_eq!(e["code"], json!(-32602), "{e}");
    wants.push(want(
        "files/read",
        Some("proj/notes.txt"),
        "INVALID_PARAMS",
        0,
    ));

    let e = b.err("files/bogus", json!({}));
    assert_eq!(e["code"], json!(-32601), "{e}");
    wants.push(want("files/bogus", None, "METHOD_NOT_FOUND", 0));

    assert_eq!(b.ok("ping", json!({})), json!({}));

    // A two-chunk upload: each chunk is one request and one line, bytes = that chunk.
    let r = b.ok(
        "files/write",
        json!({"path": "proj/up.txt", "content": chunk1, "offset": 0, "final": false}),
    );
    assert_eq!(r["bytesWritten"], json!(chunk1.len()), "{r}");
    wants.push(want(
        "files/write",
        Some("proj/up.txt"),
        "ok",
        chunk1.len() as u64,
    ));
    let r = b.ok(
        "files/write",
        json!({"path": "proj/up.txt", "content": chunk2, "offset": chunk1.len(), "final": true}),
    );
    assert_eq!(r["bytesWritten"], json!(chunk2.len()), "{r}");
    wants.push(want(
        "files/write",
        Some("proj/up.txt"),
        "ok",
        chunk2.len() as u64,
    ));
    assert_eq!(
        std::fs::read_to_string(ws.root.join("up.txt")).unwrap(),
        format!("{chunk1}{chunk2}")
    );

    let e = b.err("files/read", json!({"path": "proj/missing.txt"}));
    assert_eq!(code(&e), "FILE_NOT_FOUND", "{e}");
    wants.push(want(
        "files/read",
        Some("proj/missing.txt"),
        "FILE_NOT_FOUND",
        0,
    ));

    // Paths are logged as sent, as raw UTF-8, escaped so that no path can split a line or
    // forge a record: non-ASCII, quotes and backslashes, a newline followed by fake JSON.
    let unicode = "proj/caf\u{e9} \u{2615}.txt";
    std::fs::write(ws.root.join("caf\u{e9} \u{2615}.txt"), "x").unwrap();
    b.ok("files/read", json!({"path": unicode}));
    wants.push(want("files/read", Some(unicode), "ok", 1));
    for odd in [
        "proj/quote\"back\\slash.txt",
        "proj/evil\n{\"method\":\"files/read\",\"outcome\":\"ok\"}\n.txt",
    ] {
        let e = b.err("files/read", json!({"path": odd}));
        wants.push(want("files/read", Some(odd), &code(&e), 0));
    }

    finish(b, &err_file);
    let end = now_ms();

    let (text, lines) = read_log(&log);
    check_log(&lines, &wants, pid, false, start, end);
    // The start line opens the chain; the first request line follows it.
    assert_eq!(lines[0].fields["prev"], json!(GENESIS));
    assert_eq!(lines[1].fields["prev"], lines[0].fields["hash"]);
    assert!(
        text.contains("caf\u{e9} \u{2615}"),
        "non-ASCII paths are not raw UTF-8 in the log:\n{text}"
    );

    // File contents never appear, in any form.
    for marker in [
        read_marker.to_owned(),
        write_marker.to_owned(),
        b64(content.as_bytes()),
        b64(format!("{read_marker}\n").as_bytes()),
        chunk1.to_owned(),
        chunk2.to_owned(),
        "file number".to_owned(),
        "some notes".to_owned(),
    ] {
        assert!(
            !text.contains(&marker),
            "file content {marker:?} is in the audit log:\n{text}"
        );
    }

    // The broker's own verifier agrees with the independent check.
    let out = verify(&log);
    assert!(out.status.success(), "verify failed: {}", stderr(&out));
}

/// Requests sent all at once (the session runs them concurrently) still produce one line each
/// and an unbroken chain.
#[test]
fn pipelined_requests_keep_the_chain_intact() {
    let ws = workspace();
    let log = ws.dir.join("audit.jsonl");
    let err_file = ws.dir.join("broker.stderr");
    let outside = s(&ws.outside_file);
    let start = now_ms();
    let mut b = serve(&ws, &["--audit", log.to_str().unwrap()], &err_file);
    let pid = b.pid();
    let mut expected: Vec<(String, String, String)> = Vec::new();
    let mut ids = BTreeSet::new();
    for _ in 0..8 {
        for i in 1..=5 {
            let p = format!("proj/f{i}.txt");
            ids.insert(b.send("files/read", json!({"path": p})));
            expected.push(("files/read".into(), p, "ok".into()));
        }
        ids.insert(b.send("files/read", json!({"path": outside})));
        expected.push((
            "files/read".into(),
            outside.clone(),
            "PERMISSION_DENIED".into(),
        ));
        ids.insert(b.send("files/list", json!({"path": "proj"})));
        expected.push(("files/list".into(), "proj".into(), "ok".into()));
        ids.insert(b.send("ping", json!({})));
    }
    let mut answered = BTreeSet::new();
    for _ in 0..ids.len() {
        let m = b.read_message();
        answered.insert(m["id"].as_u64().expect("numeric id"));
    }
    assert_eq!(answered, ids);
    finish(b, &err_file);
    let end = now_ms();

    let (text, lines) = read_log(&log);
    let requests = one_run(1, &lines, pid, start, end);
    assert_eq!(
        requests.len(),
        expected.len(),
        "expected one line per logged request:\n{text}"
    );
    check_chain(&lines);
    let mut got: Vec<(String, String, String)> = requests
        .iter()
        .map(|l| {
            (
                l.fields["method"].as_str().unwrap_or("").to_owned(),
                l.fields["path"].as_str().unwrap_or("").to_owned(),
                l.fields["outcome"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    got.sort();
    expected.sort();
    assert_eq!(got, expected);
    let out = verify(&log);
    assert!(out.status.success(), "verify failed: {}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// 2. `fsbroker audit verify`
// ---------------------------------------------------------------------------------------------

#[test]
fn verify_summarises_an_intact_log() {
    let ws = workspace();
    let (log, _text, lines) = fresh_log(&ws);
    let out = verify(&log);
    let out_text = stdout(&out);
    assert!(
        out.status.success(),
        "verify failed on an intact log: {}",
        stderr(&out)
    );
    assert_eq!(
        out_text.lines().count(),
        1,
        "the summary is one line: {out_text:?}"
    );
    // The start line counts: it is the first line, and its ts the first timestamp.
    let first: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(first["event"], json!("start"), "{first}");
    let last: Value = serde_json::from_str(&lines[7]).unwrap();
    assert!(
        out_text.contains("8 line"),
        "line count missing: {out_text}"
    );
    assert!(
        out_text.contains(first["ts"].as_str().unwrap()),
        "first timestamp missing: {out_text}"
    );
    assert!(
        out_text.contains(last["ts"].as_str().unwrap()),
        "last timestamp missing: {out_text}"
    );
}

#[test]
fn verify_of_an_empty_or_missing_log() {
    let ws = workspace();
    let empty = ws.dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = verify(&empty);
    assert!(
        out.status.success(),
        "an empty log is an intact chain: {}",
        stderr(&out)
    );
    assert!(stdout(&out).contains("0 line"), "{}", stdout(&out));

    let out = verify(&ws.dir.join("no-such.jsonl"));
    assert!(!out.status.success(), "verify passed a missing file");
    assert!(stderr(&out).contains("no-such.jsonl"), "{}", stderr(&out));
}

/// Re-serializes a line with `field` set to `value` and its `hash` recomputed, as a forger
/// who knows the format would.
fn rehashed(line: &str, field: &str, value: Value) -> String {
    let mut fields: BTreeMap<String, Value> = serde_json::from_str(line).unwrap();
    fields.insert(field.into(), value);
    fields.remove("hash");
    let hash = sha256_hex(&serde_json::to_vec(&fields).unwrap());
    fields.insert("hash".into(), json!(hash));
    serde_json::to_string(&fields).unwrap()
}

#[test]
fn verify_names_an_edited_line() {
    let ws = workspace();
    let (_log, _text, lines) = fresh_log(&ws);
    // One character of a path, JSON still valid: lines 1..7 are the start line, roots/list,
    // f1 .. f5.
    for (n, file) in [(4usize, "f2.txt"), (3, "f1.txt"), (7, "f5.txt")] {
        let mut edited = lines.clone();
        assert!(edited[n - 1].contains(file));
        edited[n - 1] = edited[n - 1].replace(file, &file.replace('f', "g"));
        serde_json::from_str::<Value>(&edited[n - 1]).expect("still JSON");
        assert_broken_at(
            &ws,
            &format!("path edited on line {n}"),
            &join_lines(&edited),
            n,
        );
    }
    // A number (bytes) and the method.
    let mut edited = lines.clone();
    let bytes = serde_json::from_str::<Value>(&lines[4]).unwrap()["bytes"].clone();
    edited[4] = edited[4].replace(&format!("\"bytes\":{bytes}"), "\"bytes\":0");
    assert_ne!(edited[4], lines[4]);
    assert_broken_at(&ws, "bytes edited", &join_lines(&edited), 5);
    let mut edited = lines.clone();
    assert!(edited[1].contains("roots/list"));
    edited[1] = edited[1].replace("roots/list", "roots/lisT");
    assert_broken_at(&ws, "method edited on line 2", &join_lines(&edited), 2);
    // An outcome turned from refused to ok would be the classic forgery; here ok → refused.
    let mut edited = lines.clone();
    edited[5] = edited[5].replace("\"outcome\":\"ok\"", "\"outcome\":\"FILE_NOT_FOUND\"");
    assert_ne!(edited[5], lines[5]);
    assert_broken_at(&ws, "outcome edited", &join_lines(&edited), 6);
    // The start line itself: its pid (passing one run off as another) and its version.
    let start: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(start["event"], json!("start"), "{start}");
    let pid = start["pid"].as_u64().unwrap();
    let mut edited = lines.clone();
    edited[0] = edited[0].replace(&format!("\"pid\":{pid}"), &format!("\"pid\":{}", pid + 1));
    assert_ne!(edited[0], lines[0]);
    serde_json::from_str::<Value>(&edited[0]).expect("still JSON");
    assert_broken_at(&ws, "start line pid edited", &join_lines(&edited), 1);
    let mut edited = lines.clone();
    edited[0] = edited[0].replace(
        &format!("\"version\":\"{VERSION}\""),
        "\"version\":\"9.9.9\"",
    );
    assert_ne!(edited[0], lines[0]);
    assert_broken_at(&ws, "start line version edited", &join_lines(&edited), 1);
}

#[test]
fn verify_catches_an_edit_whose_hash_was_recomputed_at_the_next_line() {
    let ws = workspace();
    let (_log, _text, lines) = fresh_log(&ws);
    // Line 4 (the read of f2) rehashed: line 5 no longer follows it.
    let mut edited = lines.clone();
    edited[3] = rehashed(&lines[3], "path", json!("proj/other.txt"));
    assert_broken_at(&ws, "edited and rehashed", &join_lines(&edited), 5);
    // The start line rehashed with another pid: line 2 no longer follows it.
    let mut edited = lines.clone();
    edited[0] = rehashed(&lines[0], "pid", json!(1));
    assert_broken_at(
        &ws,
        "start line edited and rehashed",
        &join_lines(&edited),
        2,
    );
}

#[test]
fn verify_names_a_deleted_line() {
    let ws = workspace();
    let (_log, _text, lines) = fresh_log(&ws);
    // Requests (lines 4, 2, 6), then the start line (line 1): the first request line, now
    // line 1, claims a `prev` that is not 64 zeros.
    for n in [4usize, 2, 6, 1] {
        let mut cut = lines.clone();
        cut.remove(n - 1);
        assert_broken_at(&ws, &format!("line {n} deleted"), &join_lines(&cut), n);
    }
}

#[test]
fn verify_names_a_line_swapped_with_its_neighbour() {
    let ws = workspace();
    let (_log, _text, lines) = fresh_log(&ws);
    // Requests (lines 4, 2, 6), then the start line with the first request.
    for n in [4usize, 2, 6, 1] {
        let mut swapped = lines.clone();
        swapped.swap(n - 1, n);
        assert_broken_at(
            &ws,
            &format!("lines {n} and {} swapped", n + 1),
            &join_lines(&swapped),
            n,
        );
    }
}

#[test]
fn verify_names_an_inserted_line() {
    let ws = workspace();
    let (_log, _text, lines) = fresh_log(&ws);
    // Line 4 duplicated right after itself: the copy (line 5) does not follow line 4.
    let mut dup = lines.clone();
    dup.insert(4, lines[3].clone());
    assert_broken_at(&ws, "line 4 duplicated", &join_lines(&dup), 5);
    // The first request line (line 2) repeated right before itself.
    let mut dup = lines.clone();
    dup.insert(1, lines[1].clone());
    assert_broken_at(&ws, "line 2 duplicated", &join_lines(&dup), 3);
    // The start line repeated at the top.
    let mut dup = lines.clone();
    dup.insert(0, lines[0].clone());
    assert_broken_at(&ws, "start line duplicated", &join_lines(&dup), 2);
    // The last line repeated at the end.
    let mut dup = lines.clone();
    dup.push(lines[7].clone());
    assert_broken_at(&ws, "last line duplicated", &join_lines(&dup), 9);
}

#[test]
fn verify_names_a_truncated_last_line() {
    let ws = workspace();
    let (_log, text, lines) = fresh_log(&ws);
    // Cut in the middle of the last line (a crash mid-write).
    let cut = &text[..text.len() - 1 - lines[7].len() / 2];
    assert_broken_at(&ws, "last line cut in half", cut, 8);
    // Only the newline missing.
    assert_broken_at(&ws, "final newline missing", &text[..text.len() - 1], 8);
    // Cut, but ending in a newline.
    let cut = format!("{}\n", &text[..text.len() - 20]);
    assert_broken_at(&ws, "last line cut, newline kept", &cut, 8);
    // A log torn inside its start line, the only line.
    let cut = &lines[0][..lines[0].len() / 2];
    assert_broken_at(&ws, "start line cut in half", cut, 1);
}

// ---------------------------------------------------------------------------------------------
// 3. Redaction
// ---------------------------------------------------------------------------------------------

#[test]
fn redaction_leaves_no_plain_path() {
    let (t, dir) = tempdir();
    let root = dir.join("zebra-land");
    std::fs::create_dir_all(root.join("aardvark-dir")).unwrap();
    std::fs::write(root.join("giraffe.txt"), "giraffe contents\n").unwrap();
    std::fs::create_dir(dir.join("elsewhere")).unwrap();
    let outside = dir.join("elsewhere").join("wombat.txt");
    std::fs::write(&outside, "x").unwrap();
    let log = dir.join("redacted.jsonl");
    let policy = PolicyToml::new()
        .root(RootToml::at(&root).name("okapi").rw())
        .audit(&log, "redact_paths = true")
        .write_to(&dir.join("policy.toml"));
    let err_file = dir.join("broker.stderr");
    let start = now_ms();
    let mut b = Cmd::new(&["serve", "--policy", policy.to_str().unwrap()])
        .cwd(&dir)
        .env("RUST_LOG", "warn")
        .log(Log::File(err_file.to_owned()))
        .spawn();
    let pid = b.pid();
    let abs = s(&root.join("giraffe.txt"));
    let uri = format!("file://{}", uri_path(&root.join("giraffe.txt")));
    let outside_s = s(&outside);
    let mut wants = Vec::new();

    b.ok("roots/list", json!({}));
    wants.push(want("roots/list", None, "ok", 0));
    for p in ["okapi/giraffe.txt", abs.as_str(), uri.as_str()] {
        let r = b.ok("files/read", json!({"path": p}));
        wants.push(want(
            "files/read",
            Some(p),
            "ok",
            r["length"].as_u64().unwrap(),
        ));
    }
    let e = b.err("files/read", json!({"path": outside_s}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    wants.push(want("files/read", Some(&outside_s), "PERMISSION_DENIED", 0));
    b.ok("files/list", json!({"path": "okapi"}));
    wants.push(want("files/list", Some("okapi"), "ok", 0));
    let r = b.ok(
        "files/write",
        json!({"path": "okapi/narwhal.txt", "content": "narwhal contents"}),
    );
    wants.push(want(
        "files/write",
        Some("okapi/narwhal.txt"),
        "ok",
        r["bytesWritten"].as_u64().unwrap(),
    ));
    b.ok(
        "files/rename",
        json!({"oldPath": "okapi/narwhal.txt", "newPath": "okapi/aardvark-dir/pangolin.txt"}),
    );
    wants.push(Want {
        new_path: Some("okapi/aardvark-dir/pangolin.txt".into()),
        ..want("files/rename", Some("okapi/narwhal.txt"), "ok", 0)
    });
    let requested = vec![
        "okapi/giraffe.txt".to_owned(),
        s(&root.join("aardvark-dir")),
    ];
    b.ok(
        "files/consent",
        json!({"message": "please", "requestedPaths": requested}),
    );
    wants.push(Want {
        paths: Some(requested),
        ..want("files/consent", None, "ok", 0)
    });
    let e = b.err(
        "files/read",
        json!({"path": "okapi/giraffe.txt", "bogus": 1}),
    );
    assert_eq!(e["code"], json!(-32602), "{e}");
    wants.push(want(
        "files/read",
        Some("okapi/giraffe.txt"),
        "INVALID_PARAMS",
        0,
    ));
    finish(b, &err_file);
    let end = now_ms();

    let (text, lines) = read_log(&log);
    check_log(&lines, &wants, pid, true, start, end);
    for plain in [
        "okapi".to_owned(),
        "zebra".to_owned(),
        "giraffe".to_owned(),
        "narwhal".to_owned(),
        "pangolin".to_owned(),
        "aardvark".to_owned(),
        "wombat".to_owned(),
        "elsewhere".to_owned(),
        "file:".to_owned(),
        s(&dir),
        s(t.path()),
    ] {
        assert!(
            !text.contains(&plain),
            "redacted log holds {plain:?}:\n{text}"
        );
    }
    let out = verify(&log);
    assert!(out.status.success(), "verify failed: {}", stderr(&out));
}

// ---------------------------------------------------------------------------------------------
// 4. Restarts
// ---------------------------------------------------------------------------------------------

#[test]
fn a_restart_continues_the_chain() {
    let ws = workspace();
    let log = ws.dir.join("audit.jsonl");
    let err_file = ws.dir.join("broker.stderr");
    let start = now_ms();
    let mut b = serve(&ws, &["--audit", log.to_str().unwrap()], &err_file);
    let pid1 = b.pid();
    b.ok("roots/list", json!({}));
    let r = b.ok("files/read", json!({"path": "proj/f1.txt"}));
    let f1_len = r["length"].as_u64().unwrap();
    b.err("files/read", json!({"path": s(&ws.outside_file)}));
    finish(b, &err_file);
    let mid = now_ms();
    let (_, first_run) = read_log(&log);
    check_log(
        &first_run,
        &[
            want("roots/list", None, "ok", 0),
            want("files/read", Some("proj/f1.txt"), "ok", f1_len),
            want(
                "files/read",
                Some(&s(&ws.outside_file)),
                "PERMISSION_DENIED",
                0,
            ),
        ],
        pid1,
        false,
        start,
        mid,
    );

    let mut b = serve(&ws, &["--audit", log.to_str().unwrap()], &err_file);
    let pid2 = b.pid();
    let r = b.ok("files/read", json!({"path": "proj/f2.txt"}));
    let f2_len = r["length"].as_u64().unwrap();
    b.ok("files/list", json!({"path": "proj"}));
    finish(b, &err_file);
    let end = now_ms();

    let (text, lines) = read_log(&log);
    assert_eq!(lines.len(), 9, "{text}");
    for (a, b) in first_run.iter().zip(&lines) {
        assert_eq!(a.raw, b.raw, "a restart rewrote an earlier line");
    }
    // Two runs, two start lines: each run's part of the log begins with its own.
    let starts: Vec<usize> = (0..lines.len()).filter(|&i| is_start(&lines[i])).collect();
    assert_eq!(
        starts,
        [0, 5],
        "expected a start line opening each run:\n{text}"
    );
    check_run(
        6,
        &lines[5..],
        &[
            want("files/read", Some("proj/f2.txt"), "ok", f2_len),
            want("files/list", Some("proj"), "ok", 0),
        ],
        pid2,
        false,
        mid,
        end,
    );
    assert_eq!(
        lines[5].fields["prev"], lines[4].fields["hash"],
        "the second run's start line does not chain to the first run's last line:\n{text}"
    );
    assert_eq!(
        lines[5].fields["prev"], lines[4].fields["hash"],
        "the second run's first request does not chain to its start line:\n{text}"
    );
    check_chain(&lines);
    for l in &lines {
        let ts = parse_rfc3339_utc(l.fields["ts"].as_str().unwrap()).unwrap();
        assert!((start..=end).contains(&ts), "{}", l.raw);
    }
    let out = verify(&log);
    assert!(out.status.success(), "verify failed: {}", stderr(&out));
    assert!(stdout(&out).contains("9 line"), "{}", stdout(&out));
}

/// Rule: a log whose last line is torn (a broker killed in the middle of its write) is mended,
/// not abandoned: the next broker cuts the torn piece off and records it in a `torn` line
/// (its length, sha256 and first bytes) chained to the last complete line, and the log
/// verifies. A file holding nothing but one incomplete line may not be an audit log at all:
/// the broker refuses it and leaves it as it was.
#[test]
fn a_torn_log_is_mended_and_the_tear_recorded() {
    let ws = workspace();
    let (_log, text, lines) = fresh_log(&ws);
    for (what, torn) in [
        (
            "cut",
            text[..text.len() - 1 - lines[7].len() / 2].to_owned(),
        ),
        ("no-newline", text[..text.len() - 1].to_owned()),
    ] {
        let log = ws.dir.join(format!("torn-{what}.jsonl"));
        std::fs::write(&log, &torn).unwrap();
        let piece = &torn[torn.rfind('\n').unwrap() + 1..];
        let out = run(&[
            "serve",
            "--root",
            ws.root.to_str().unwrap(),
            "--audit",
            log.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{what}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("torn line"),
            "{what}: {}",
            stderr(&out)
        );
        let mended = std::fs::read_to_string(&log).unwrap();
        let mended: Vec<Value> = mended
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let torn_at = lines.len() - 1;
        let record = &mended[torn_at];
        assert_eq!(record["event"], "torn", "{what}: {mended:#?}");
        assert_eq!(record["bytes"], piece.len(), "{what}");
        assert_eq!(record["sha256"], sha256_hex(piece.as_bytes()), "{what}");
        assert_eq!(
            record["prev"],
            serde_json::from_str::<Value>(&lines[torn_at - 1]).unwrap()["hash"],
            "{what}: chained to the last complete line"
        );
        assert_eq!(mended[torn_at + 1]["event"], "start", "{what}");
        // The torn line was the first run's seal: the chain is whole, and that run is
        // reported unsealed (exit 3), as a crash should be.
        let out = verify(&log);
        assert_eq!(out.status.code(), Some(3), "{what}: {}", stderr(&out));
    }
    // One incomplete line and nothing else: refused, untouched.
    let log = ws.dir.join("torn-start-line-cut.jsonl");
    let torn = lines[0][..lines[0].len() / 2].to_owned();
    std::fs::write(&log, &torn).unwrap();
    let out = run(&[
        "serve",
        "--root",
        ws.root.to_str().unwrap(),
        "--audit",
        log.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "started on a one-line torn file: {err}"
    );
    assert!(err.contains(log.to_str().unwrap()), "{err}");
    assert!(err.contains("incomplete"), "{err}");
    assert!(stdout(&out).is_empty());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), torn);
    assert_broken_at(&ws, "torn start line", &torn, 1);
}

// ---------------------------------------------------------------------------------------------
// 5. Failing closed; where the log goes
// ---------------------------------------------------------------------------------------------

#[test]
fn an_unwritable_log_fails_every_audited_request_closed() {
    let ws = workspace();
    let err_file = ws.dir.join("broker.stderr");
    let mut b = serve(&ws, &["--audit", "/dev/full"], &err_file);
    let outside = s(&ws.outside_file);
    let requests = [
        ("roots/list", json!({})),
        ("files/read", json!({"path": "proj/f1.txt"})),
        ("files/read", json!({"path": outside})),
        ("files/list", json!({"path": "proj"})),
        (
            "files/write",
            json!({"path": "proj/after.txt", "content": "should not exist"}),
        ),
        (
            "files/create",
            json!({"path": "proj/newdir", "type": "directory"}),
        ),
        ("files/delete", json!({"path": "proj/f2.txt"})),
        (
            "files/rename",
            json!({"oldPath": "proj/f3.txt", "newPath": "proj/moved.txt"}),
        ),
        (
            "files/consent",
            json!({"message": "m", "requestedPaths": ["proj/f1.txt"]}),
        ),
        ("files/read", json!({"path": "proj/f1.txt", "bogus": true})),
        ("files/bogus", json!({})),
        ("roots/list", json!({})),
    ];
    for (method, params) in requests {
        let resp = b.request(method, params.clone());
        assert_audit_unavailable(&resp, &format!("{method} {params}"));
        // The session goes on: ping is not audited and still answers.
        assert_eq!(b.ok("ping", json!({})), json!({}));
    }
    finish_any(b);
    assert!(
        !ws.root.join("after.txt").exists(),
        "a refused write took effect"
    );
    assert!(
        !ws.root.join("newdir").exists(),
        "a refused create took effect"
    );
    assert!(
        ws.root.join("f2.txt").exists(),
        "a refused delete took effect"
    );
    assert!(
        ws.root.join("f3.txt").exists() && !ws.root.join("moved.txt").exists(),
        "a refused rename took effect"
    );
}

/// Closes stdin and waits, whatever the exit status.
fn finish_any(b: Fsb) {
    let (_status, rest) = b.finish();
    assert!(rest.is_empty(), "unexpected output: {rest}");
}

/// "An audited desktop must never act unrecorded" : when the very first
/// audit line cannot be written, the request it records must not have changed anything.
#[test]
fn an_unwritable_log_lets_not_even_the_first_request_act() {
    let ws = workspace();
    let err_file = ws.dir.join("broker.stderr");
    let mut b = serve(&ws, &["--audit", "/dev/full"], &err_file);
    let resp = b.request(
        "files/write",
        json!({"path": "proj/first.txt", "content": "written without a record"}),
    );
    assert_audit_unavailable(&resp, "first files/write");
    finish_any(b);
    assert!(
        !ws.root.join("first.txt").exists(),
        "the first files/write was answered IO_ERROR \"audit log unavailable\" but the file \
         was written anyway: the broker acted unrecorded"
    );
}

#[test]
fn cli_audit_overrides_the_policy_path() {
    let ws = workspace();
    let pol_dir = ws.dir.join("pol");
    std::fs::create_dir(&pol_dir).unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&ws.root).name("r"))
        .table(
            "audit",
            "path = \"policy-audit.jsonl\"\nredact_paths = true",
        )
        .write_to(&pol_dir.join("policy.toml"));
    let cli_log = ws.dir.join("cli-audit.jsonl");
    let err_file = ws.dir.join("broker.stderr");
    let start = now_ms();
    let mut b = Cmd::new(&[
        "serve",
        "--policy",
        policy.to_str().unwrap(),
        "--audit",
        cli_log.to_str().unwrap(),
    ])
    .cwd(&ws.dir)
    .env("RUST_LOG", "warn")
    .log(Log::File(err_file.to_owned()))
    .spawn();
    let pid = b.pid();
    let r = b.ok("files/read", json!({"path": "r/f1.txt"}));
    finish(b, &err_file);
    let end = now_ms();
    assert!(
        !pol_dir.join("policy-audit.jsonl").exists() && !ws.dir.join("policy-audit.jsonl").exists(),
        "the policy's [audit] path was written although --audit overrides it"
    );
    let (_, lines) = read_log(&cli_log);
    // The override replaces the path only: the policy's redaction still applies.
    check_log(
        &lines,
        &[want(
            "files/read",
            Some("r/f1.txt"),
            "ok",
            r["length"].as_u64().unwrap(),
        )],
        pid,
        true,
        start,
        end,
    );
}

#[test]
fn the_policy_audit_path_is_relative_to_the_policy_file() {
    let ws = workspace();
    let pol_dir = ws.dir.join("pol");
    let cwd = ws.dir.join("cwd");
    std::fs::create_dir(&pol_dir).unwrap();
    std::fs::create_dir(&cwd).unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&ws.root).name("r"))
        .table("audit", "path = \"audit.jsonl\"")
        .write_to(&pol_dir.join("policy.toml"));
    let err_file = ws.dir.join("broker.stderr");
    let start = now_ms();
    let mut b = Cmd::new(&["serve", "--policy", policy.to_str().unwrap()])
        .cwd(&cwd)
        .env("RUST_LOG", "warn")
        .log(Log::File(err_file.to_owned()))
        .spawn();
    let pid = b.pid();
    b.ok("roots/list", json!({}));
    b.err("files/read", json!({"path": "r/nope.txt"}));
    finish(b, &err_file);
    let end = now_ms();
    assert!(
        !cwd.join("audit.jsonl").exists(),
        "log written relative to the cwd"
    );
    let (_, lines) = read_log(&pol_dir.join("audit.jsonl"));
    check_log(
        &lines,
        &[
            want("roots/list", None, "ok", 0),
            want("files/read", Some("r/nope.txt"), "FILE_NOT_FOUND", 0),
        ],
        pid,
        false,
        start,
        end,
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Refusals warned on stderr
// ---------------------------------------------------------------------------------------------

#[test]
fn refusals_are_warned_on_stderr_with_session_and_path() {
    let ws = workspace();
    std::fs::create_dir(ws.root.join("secret")).unwrap();
    std::fs::write(ws.root.join("secret").join("key.txt"), "k").unwrap();
    let locked = ws.dir.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("doc.txt"), "d").unwrap();
    let log = ws.dir.join("audit.jsonl");
    let policy = PolicyToml::new()
        .root(RootToml::at(&ws.root).name("r").deny(&["secret/**"]))
        .root(RootToml::at(&locked).name("locked").consent("deny"))
        .audit(&log, "")
        .write_to(&ws.dir.join("policy.toml"));
    let err_file = ws.dir.join("broker.stderr");
    let start = now_ms();
    let mut b = Cmd::new(&["serve", "--policy", policy.to_str().unwrap()])
        .cwd(&ws.dir)
        .env("RUST_LOG", "warn")
        .log(Log::File(err_file.to_owned()))
        .spawn();
    let pid = b.pid();
    b.ok("files/read", json!({"path": "r/f1.txt"}));
    let outside = s(&ws.outside_file);
    let refused = [
        ("files/read", json!({"path": outside}), outside.clone()),
        (
            "files/read",
            json!({"path": "r/secret/key.txt"}),
            "r/secret/key.txt".to_owned(),
        ),
        (
            "files/read",
            json!({"path": "locked/doc.txt"}),
            "locked/doc.txt".to_owned(),
        ),
        (
            "files/write",
            json!({"path": "r/ro.txt", "content": "x"}),
            "r/ro.txt".to_owned(),
        ),
        (
            "files/list",
            json!({"path": "r/secret"}),
            "r/secret".to_owned(),
        ),
    ];
    for (method, params, _) in &refused {
        let e = b.err(method, params.clone());
        assert_eq!(code(&e), "PERMISSION_DENIED", "{method} {params}: {e}");
    }
    let err = finish(b, &err_file);
    let end = now_ms();

    let (text, lines) = read_log(&log);
    let requests = one_run(1, &lines, pid, start, end);
    assert_eq!(requests.len(), 1 + refused.len(), "{text}");
    check_chain(&lines);
    let session = requests[0].fields["session"].as_u64().unwrap();
    let session_field = format!("session={session}");
    for (i, (method, _, path)) in refused.iter().enumerate() {
        let line = &requests[i + 1];
        assert_eq!(
            line.fields["outcome"],
            json!("PERMISSION_DENIED"),
            "{}",
            line.raw
        );
        assert_eq!(line.fields["path"], json!(path), "{}", line.raw);
        assert!(
            err.lines().any(|l| {
                l.contains("WARN")
                    && l.contains(path.as_str())
                    && l.match_indices(&session_field).any(|(j, _)| {
                        !l[j + session_field.len()..]
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_digit())
                    })
            }),
            "no warn line with {session_field} and {path:?} for the refused {method}; stderr:\n{err}"
        );
    }
}

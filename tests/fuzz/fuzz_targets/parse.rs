//! The message path on arbitrary bytes: the JSON-RPC envelope parser, the line framer, and a
//! whole `Session::handle` against real temp-dir roots.
//!
//! Every input is used three ways:
//!
//! 1. the JSON-RPC parser on the raw bytes (must not panic);
//! 2. the bytes split into lines by the line framer (as `serve` does, with a small maximum so
//!    over-long lines are exercised too), each line through `Session::handle`;
//! 3. the bytes after the first as the *body of the params object* of a well-formed request
//!    whose method the first byte picks, so the fuzzer reaches every method's params parser and
//!    the file operations without first having to invent a JSON-RPC envelope.
//!
//! Checked for every line: a request or an invalid message gets exactly one answer, a
//! notification or a response none; an answer is one JSON object on one line (`\n` only at
//! its end), `"jsonrpc":"2.0"`, exactly one of `result`/`error`, and it echoes the request's id
//! byte for byte (`null` when the id could not be read).
//!
//! The runtime (current-thread) and the broker are built once. Each input gets a fresh
//! session (so watches, kept locks and uploads end with it) and starts from the same
//! read-write root contents, so a crash reproduces from its input alone.

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use fsbroker::Broker;
use fsbroker::fuzzing::{expected_answer, frames};
use fsbroker::policy::{ConsentFile, LimitsFile, Overrides, Policy, PolicyFile, RootEntry};
use fsbroker::sandbox::{ConsentMode, Mode};
use libfuzzer_sys::fuzz_target;

/// The framer's maximum in this target: small, so over-long lines are common.
const MAX_LINE: usize = 2048;
/// At most this many lines of one input go through `handle` (a run of `\n` is cheap to
/// generate and would otherwise dominate the time).
const MAX_LINES: usize = 32;
/// The one file the read-write root holds at the start of every input.
const RW_FIXTURE: &[u8] = b"rewritable\n";

const METHODS: &[&str] = &[
    "files/read",
    "files/list",
    "files/write",
    "files/create",
    "files/delete",
    "files/rename",
    "files/unlock",
    "files/consent",
    "files/watch",
    "files/unwatch",
    "roots/list",
    "ping",
];

struct World {
    rt: tokio::runtime::Runtime,
    broker: Arc<Broker>,
    rw: PathBuf,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(build)
}

fn build() -> World {
    // Kept for the life of the process (libFuzzer exits without running destructors).
    let base = tempfile::Builder::new()
        .prefix("fsbroker-fuzz-parse-")
        .tempdir()
        .expect("temp dir")
        .keep();
    let ro = base.join("ro");
    let rw = base.join("rw");
    for d in [&ro, &rw, &ro.join("dir/sub"), &ro.join("secret")] {
        std::fs::create_dir_all(d).expect("fixture dir");
    }
    let files: &[(&str, &[u8])] = &[
        ("hello.txt", b"hello, world\n"),
        ("utf8.txt", "h\u{e9}llo \u{1f600} w\u{f6}rld\n".as_bytes()),
        (
            "bin.dat",
            &[0, 0xff, 0xfe, 0x80, b'a', 0xc3, 0x28, 0xe2, 0x82],
        ),
        ("empty", b""),
        (".hidden", b"hidden\n"),
        (".env", b"SECRET=1\n"),
        ("secret/key", b"k\n"),
        ("dir/a.rs", b"fn main() {}\n"),
        ("dir/sub/deep.txt", b"deep\n"),
    ];
    for (name, content) in files {
        std::fs::write(ro.join(name), content).expect("fixture file");
    }
    let big: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(ro.join("big.bin"), big).expect("fixture file");
    let links = [
        ("hello.txt", "link"),
        ("/etc/passwd", "abs-link"),
        ("../rw", "up-link"),
        (".env", "env-link"),
        ("missing", "dangling"),
        ("loop", "loop"),
    ];
    for (target, name) in links {
        std::os::unix::fs::symlink(target, ro.join(name)).expect("fixture link");
    }
    let _ = std::process::Command::new("mkfifo")
        .arg(ro.join("fifo"))
        .status();

    let file = PolicyFile {
        root: vec![
            RootEntry {
                path: ro,
                name: Some("ro".into()),
                mode: Mode::ReadOnly,
                consent: ConsentMode::Auto,
                deny: vec![".env".into(), "secret/**".into()],
            },
            RootEntry {
                path: rw.clone(),
                name: Some("rw".into()),
                mode: Mode::ReadWrite,
                consent: ConsentMode::Auto,
                deny: vec!["*.key".into()],
            },
        ],
        limits: LimitsFile {
            chunk_size: 4096,
            max_chunk_size: 65_536,
            max_file_size: 1 << 20,
            timeout_ms: 10_000,
            requests_per_second: 0,
            max_list_entries: 64,
            max_watches: 4,
            max_locks: 4,
            ..LimitsFile::default()
        },
        consent: ConsentFile {
            terminal: false,
            ..ConsentFile::default()
        },
        audit: None,
        confine: Default::default(),
    };
    let policy = Policy::compile(&file, None, &Overrides::default()).expect("policy");
    let broker = Broker::new(policy).expect("broker");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    World { rt, broker, rw }
}

impl World {
    /// Puts the read-write root back to one fixture file (cheap when it already is).
    fn reset_rw(&self) {
        let Ok(entries) = std::fs::read_dir(&self.rw) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_fixture =
                entry.file_name() == "a.txt" && entry.file_type().is_ok_and(|t| t.is_file());
            if is_fixture {
                continue;
            }
            let _ = match entry.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
        }
        let fixture = self.rw.join("a.txt");
        if std::fs::read(&fixture).ok().as_deref() != Some(RW_FIXTURE) {
            let _ = std::fs::write(&fixture, RW_FIXTURE);
        }
    }
}

/// The lines `serve` would hand to the session (at most `MAX_LINES`).
async fn lines(data: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for frame in frames(data, MAX_LINE).await {
        match frame {
            Ok(line) => {
                assert!(
                    line.len() <= MAX_LINE,
                    "a line over the maximum was yielded"
                );
                assert!(!line.contains(&b'\n'), "a line holds a newline");
                if out.len() < MAX_LINES {
                    out.push(line);
                }
            }
            Err(len) => {
                assert!(len as usize > MAX_LINE, "TooLong for a line of {len} bytes");
            }
        }
    }
    out
}

/// Handles one line and checks the answer against what the parser made of it.
async fn check_line(session: &fsbroker::Session, line: &[u8]) {
    // `Some(id text)` when an answer is due (`"null"` when the id could not be read).
    let expected = expected_answer(line);
    let answer = session.handle(line).await;
    match (expected, answer) {
        (None, None) => {}
        (None, Some(a)) => panic!(
            "a notification or response was answered: {}",
            String::from_utf8_lossy(&a)
        ),
        (Some(id), None) => panic!("no answer for a message with id {id}"),
        (Some(id), Some(a)) => check_answer(&id, &a),
    }
}

fn check_answer(id: &str, frame: &[u8]) {
    let text = String::from_utf8_lossy(frame);
    assert_eq!(
        frame.last(),
        Some(&b'\n'),
        "answer does not end in \\n: {text}"
    );
    assert_eq!(
        frame.iter().filter(|&&b| b == b'\n').count(),
        1,
        "answer spans several lines: {text}"
    );
    let prefix = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},");
    assert!(
        frame.starts_with(prefix.as_bytes()),
        "answer does not echo id {id}: {text}"
    );
    let value: serde_json::Value = match serde_json::from_slice(frame) {
        Ok(v) => v,
        Err(e) => panic!("answer is not JSON ({e}): {text}"),
    };
    let obj = value.as_object().expect("answer is an object");
    assert_eq!(
        obj.contains_key("result"),
        !obj.contains_key("error"),
        "answer needs exactly one of result/error: {text}"
    );
    if let Some(err) = obj.get("error") {
        assert!(err["code"].is_i64(), "error.code: {text}");
        assert!(err["message"].is_string(), "error.message: {text}");
    }
}

/// A well-formed request whose params object has `body` inside its braces.
fn templated(selector: u8, body: &[u8]) -> Vec<u8> {
    let method = METHODS[usize::from(selector) % METHODS.len()];
    let mut line = format!(r#"{{"jsonrpc":"2.0","id":{selector},"method":"{method}","params":{{"#)
        .into_bytes();
    line.extend_from_slice(body);
    line.push(b'}');
    line
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let _ = expected_answer(data);
    w.reset_rw();
    let session = w.broker.session();
    w.rt.block_on(async {
        for line in lines(data).await {
            check_line(&session, &line).await;
        }
        if let Some((&selector, body)) = data.split_first() {
            check_line(&session, &templated(selector, body)).await;
        }
    });
    drop(session);
});

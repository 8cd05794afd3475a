//! `files/watch`, `files/unwatch` and `notifications/files/changed` (docs/protocol.md §5.11, §5.12),
//! through the real binary over real pipes on real temporary directories.
//!
//! Notifications arrive on the broker's stdout interleaved with responses, so every test
//! drives a [`Live`] broker whose stdout is read by a thread: responses are matched to their
//! requests by id and notifications are set aside. Assertions are made on *final sets* of
//! `(path, event)` pairs, never on timing or exact counts (inotify batches, the broker
//! coalesces bursts within ~50 ms, and a two-core machine may run a test slowly): a collector
//! waits until what must come has come (bounded), then until no notification arrived for
//! [`QUIET`], and returns everything seen. Where something must *not* be reported, a
//! sentinel change is made after the forbidden ones and waited for, so "nothing arrived" is
//! not just "nothing arrived yet".
//!
//! Every notification seen anywhere is checked: exactly the contract's method, a `path` in
//! `NAME/rel` form, an `event` among the three names, an RFC 3339 UTC `timestamp` close to
//! now, and a `watchId` that this session was given.
//!
//! Covered: create, modify, delete (by hand and through `files/write`/`files/delete`); rename
//! within the tree, out of it, into it (a file and a whole tree); nested directories made and
//! filled at once; a burst of 10,000 writes from four threads (which usually overflows a queue
//! and forces a rescan); nothing from outside the root, behind a symlinked directory or under
//! a denied glob; the `events` filter; non-recursive watches; a watch on one file and its
//! atomic replacement; `files/unwatch` and unknown or foreign ids; `max_watches`; refusals
//! (outside every root, missing, bad `events`, no consent); roots deleted or moved away while
//! watched; coalescing; a server that stops reading (alive, responsive, bounded memory, every
//! path reported, `roots/list_changed` not lost); watched directories that move (out of the
//! root, or within it); watches that share directories; brokers started on a busy machine.
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::io::Write;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{Fsb, PolicyToml, RootToml};
use serde_json::{Value, json};

/// Longest wait for a response, or for notifications that must come.
const DEADLINE: Duration = Duration::from_secs(20);
/// No notification for this long: the broker has said all it will about the changes made.
const QUIET: Duration = Duration::from_millis(300);
/// Longest wait for the quiet period once what had to come has come.
const SETTLE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// A live broker ([`common::Fsb`]: stdout read by a thread that can be paused, a server
// that stops reading; stderr kept and echoed; every wait bounded) and what it reported.
// ---------------------------------------------------------------------------------------------

/// One `notifications/files/changed`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Note {
    path: String,
    event: String,
    watch_id: String,
    timestamp: String,
}

/// What a collector saw.
#[derive(Debug, Default)]
struct Seen {
    notes: Vec<Note>,
    /// `notifications/roots/list_changed` received.
    list_changed: usize,
    /// The `(path, event)` pairs of `notes`, for quick look-ups (a burst brings thousands).
    index: HashSet<(String, String)>,
    /// Notifications per path.
    per_path: HashMap<String, usize>,
}

impl Seen {
    /// The distinct `(path, event)` pairs.
    fn set(&self) -> BTreeSet<(String, String)> {
        self.notes
            .iter()
            .map(|n| (n.path.clone(), n.event.clone()))
            .collect()
    }

    /// The distinct paths.
    fn paths(&self) -> BTreeSet<String> {
        self.notes.iter().map(|n| n.path.clone()).collect()
    }

    fn push(&mut self, note: Note) {
        self.index.insert((note.path.clone(), note.event.clone()));
        *self.per_path.entry(note.path.clone()).or_default() += 1;
        self.notes.push(note);
    }

    fn has(&self, path: &str, event: &str) -> bool {
        self.index.contains(&(path.to_owned(), event.to_owned()))
    }

    /// Notifications about `path`.
    fn count(&self, path: &str) -> usize {
        self.per_path.get(path).copied().unwrap_or(0)
    }

    /// Whether every pair in `want` was seen.
    fn includes(&self, want: &BTreeSet<(String, String)>) -> bool {
        want.iter().all(|(p, e)| self.has(p, e))
    }
}

/// `(path, event)` pairs as a set.
fn pairs(list: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    list.iter()
        .map(|(p, e)| ((*p).to_owned(), (*e).to_owned()))
        .collect()
}

/// Held for writing while a test keeps every core busy on purpose.
static BUSY: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A running `fsbroker` ([`Fsb`]: every pipe read by a thread, stdout reading can be
/// paused) with what this session was given.
struct Live {
    b: Fsb,
    /// Every `watchId` this session was given.
    ids: HashSet<String>,
    started: SystemTime,
}

impl Deref for Live {
    type Target = Fsb;
    fn deref(&self) -> &Fsb {
        &self.b
    }
}

impl DerefMut for Live {
    fn deref_mut(&mut self) -> &mut Fsb {
        &mut self.b
    }
}

impl Live {
    /// Starts `fsbroker ARGS...` and waits until it answers.
    fn start<S: AsRef<OsStr>>(args: &[S]) -> Live {
        // Not while `brokers_started_on_a_busy_machine_all_report` loads the machine: that
        // test's findings belong to it.
        drop(BUSY.read().unwrap_or_else(|e| e.into_inner()));
        Live::start_now(args)
    }

    /// [`Live::start`] without waiting for a busy phase to end.
    fn start_now<S: AsRef<OsStr>>(args: &[S]) -> Live {
        let started = SystemTime::now();
        let mut live = Live {
            b: Fsb::start(args, DEADLINE),
            ids: HashSet::new(),
            started,
        };
        live.ok("ping", json!({}));
        live
    }

    /// `fsbroker serve --root DIR... --read-write`.
    fn serve_rw(roots: &[&Path]) -> Live {
        let mut args: Vec<&OsStr> = vec!["serve".as_ref()];
        for r in roots {
            args.push("--root".as_ref());
            args.push(r.as_os_str());
        }
        args.push("--read-write".as_ref());
        Live::start(&args)
    }

    /// `fsbroker serve --policy FILE`.
    fn serve_policy(policy: &Path) -> Live {
        Live::start(&["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()])
    }

    /// `files/watch` that must succeed; returns the `watchId` (and remembers it).
    fn watch(&mut self, params: Value) -> String {
        let r = self.ok("files/watch", params.clone());
        let id = r["watchId"]
            .as_str()
            .unwrap_or_else(|| panic!("files/watch {params}: no watchId in {r}"))
            .to_owned();
        assert!(!id.is_empty(), "empty watchId: {r}");
        assert!(self.ids.insert(id.clone()), "watchId {id} given twice");
        id
    }

    /// Checks one notification and adds it to `seen`.
    fn record(&self, seen: &mut Seen, m: Value) {
        assert_eq!(m["jsonrpc"], "2.0", "{m}");
        match m["method"].as_str() {
            Some("notifications/roots/list_changed") => seen.list_changed += 1,
            Some("notifications/files/changed") => {
                let p = &m["params"];
                let field = |k: &str| {
                    p[k].as_str()
                        .unwrap_or_else(|| panic!("notification without a string {k}: {m}"))
                        .to_owned()
                };
                let note = Note {
                    path: field("path"),
                    event: field("event"),
                    watch_id: field("watchId"),
                    timestamp: field("timestamp"),
                };
                assert!(
                    ["created", "modified", "deleted"].contains(&note.event.as_str()),
                    "unknown event: {m}"
                );
                assert!(
                    self.ids.contains(&note.watch_id),
                    "watchId {} was never returned to this session: {m}",
                    note.watch_id
                );
                check_timestamp(&note.timestamp, self.started, &m);
                // NAME/rel: a root name, then a relative path; never absolute, never `..`,
                // never a URI, never a trailing or doubled slash.
                assert!(
                    !note.path.starts_with('/')
                        && !note.path.contains("//")
                        && !note.path.ends_with('/')
                        && !note.path.contains("://")
                        && note
                            .path
                            .split('/')
                            .all(|seg| !seg.is_empty() && seg != "." && seg != ".."),
                    "path not in NAME/rel form: {m}"
                );
                assert!(
                    !note.path.contains(".fsbroker-"),
                    "a staging file was reported: {m}"
                );
                seen.push(note);
            }
            _ => panic!("unexpected notification: {m}"),
        }
    }

    /// Collects notifications until `done` holds (at most `limit`), then until none has
    /// arrived for [`QUIET`] (at most [`SETTLE`] more). Responses that arrive meanwhile are
    /// kept for [`Fsb::response`].
    fn collect_until(&mut self, limit: Duration, done: impl Fn(&Seen) -> bool) -> Seen {
        let mut seen = Seen::default();
        while let Some((_, m)) = self.pop_note() {
            self.record(&mut seen, m);
        }
        let hard = Instant::now() + limit;
        while !done(&seen) {
            let left = hard.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match self.next_notification(left) {
                Some((_, m)) => self.record(&mut seen, m),
                None => break,
            }
        }
        let settle_end = Instant::now() + SETTLE;
        let mut last = Instant::now();
        loop {
            let until = (last + QUIET).min(settle_end);
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            if let Some((_, m)) = self.next_notification(left) {
                self.record(&mut seen, m);
                last = Instant::now();
            }
        }
        seen
    }

    /// Everything reported until a quiet period.
    fn collect(&mut self) -> Seen {
        self.collect_until(Duration::ZERO, |_| true)
    }

    /// Waits for every pair in `want` (then for quiet) and returns all that was seen; fails
    /// naming what is missing.
    fn expect(&mut self, want: &[(&str, &str)]) -> Seen {
        let want = pairs(want);
        let seen = self.collect_until(DEADLINE, |s| s.includes(&want));
        let missing: Vec<_> = want.iter().filter(|(p, e)| !seen.has(p, e)).collect();
        assert!(
            missing.is_empty(),
            "not reported within {DEADLINE:?}: {missing:?}; seen: {:?}",
            seen.set()
        );
        seen
    }

    /// Waits for `notifications/roots/list_changed`.
    fn expect_list_changed(&mut self, what: &str) -> Seen {
        let seen = self.collect_until(DEADLINE, |s| s.list_changed > 0);
        assert!(
            seen.list_changed > 0,
            "{what}: no notifications/roots/list_changed within {DEADLINE:?}"
        );
        seen
    }

    fn root_names(&mut self) -> Vec<String> {
        let r = self.ok("roots/list", json!({}));
        r["roots"]
            .as_array()
            .unwrap_or_else(|| panic!("roots/list: {r}"))
            .iter()
            .map(|x| x["name"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Resident memory of the broker, in kB (`VmRSS` from `/proc/PID/status`).
    fn rss_kb(&self) -> u64 {
        common::proc_status_kib(self.pid(), "VmRSS")
    }
}

// ---------------------------------------------------------------------------------------------
// Timestamps.
// ---------------------------------------------------------------------------------------------

/// An RFC 3339 timestamp in UTC, as the contract has the broker write them (`…Z`).
fn parse_utc(ts: &str) -> Option<SystemTime> {
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    (ts.ends_with('Z') && t.offset().is_utc()).then(|| t.into())
}

/// An RFC 3339 UTC timestamp between the broker's start and now (a few seconds' slack).
fn check_timestamp(ts: &str, started: SystemTime, m: &Value) {
    let t = parse_utc(ts).unwrap_or_else(|| panic!("timestamp not RFC 3339 UTC: {m}"));
    let slack = Duration::from_secs(5);
    assert!(
        t + slack >= started && t <= SystemTime::now() + slack,
        "timestamp {ts} is not the time of the change: {m}"
    );
}

// ---------------------------------------------------------------------------------------------
// Files and policies.
// ---------------------------------------------------------------------------------------------

/// A temp dir `base` holding the root `base/proj` (named `proj`) and `base/outside`.
fn layout() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (t, base) = common::tempdir();
    let proj = base.join("proj");
    let outside = base.join("outside");
    std::fs::create_dir(&proj).unwrap();
    std::fs::create_dir(&outside).unwrap();
    (t, base, proj, outside)
}

fn write(p: impl AsRef<Path>, text: &str) {
    let p = p.as_ref();
    std::fs::write(p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn append(p: impl AsRef<Path>, text: &str) {
    let p = p.as_ref();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(p)
        .unwrap_or_else(|e| panic!("open {}: {e}", p.display()));
    f.write_all(text.as_bytes()).unwrap();
}

/// A policy file (in a temp dir of its own) serving `root` read-write as `r`, consent auto,
/// with `root_extra` in the `[[root]]` table and `limits` in `[limits]` (the rate limiter off).
fn policy(root: &Path, root_extra: &str, limits: &str) -> (tempfile::TempDir, PathBuf) {
    let (t, dir) = common::tempdir();
    let file = PolicyToml::new()
        .root(RootToml::at(root).name("r").rw().extra(root_extra))
        .unlimited_with(limits)
        .write_to(&dir.join("policy.toml"));
    (t, file)
}

/// Asserts every reported pair is in `allowed`.
fn assert_only(seen: &Seen, allowed: &BTreeSet<(String, String)>, what: &str) {
    let extra: Vec<_> = seen.set().difference(allowed).cloned().collect();
    assert!(
        extra.is_empty(),
        "{what}: unexpected notifications {extra:?}; all: {:?}",
        seen.set()
    );
}

/// Asserts an error's string code and JSON-RPC number.
fn assert_code(e: &Value, want: &str, number: i64, what: &str) {
    assert_eq!(common::code(e), want, "{what}: {e}");
    assert_eq!(e["code"], json!(number), "{what}: {e}");
}

// ---------------------------------------------------------------------------------------------
// Create, modify, delete, rename.
// ---------------------------------------------------------------------------------------------

#[test]
fn create_modify_delete_are_reported() {
    let (_t, _base, proj, _outside) = layout();
    let mut b = Live::serve_rw(&[&proj]);
    let id = b.watch(json!({"path": "proj", "recursive": true}));

    write(proj.join("a.txt"), "one");
    let s = b.expect(&[("proj/a.txt", "created")]);
    // Creating and writing may be one notification or two, never anything else.
    assert_only(
        &s,
        &pairs(&[("proj/a.txt", "created"), ("proj/a.txt", "modified")]),
        "create",
    );

    append(proj.join("a.txt"), " two");
    let s = b.expect(&[("proj/a.txt", "modified")]);
    assert_only(&s, &pairs(&[("proj/a.txt", "modified")]), "modify");

    std::fs::remove_file(proj.join("a.txt")).unwrap();
    let s = b.expect(&[("proj/a.txt", "deleted")]);
    assert_only(&s, &pairs(&[("proj/a.txt", "deleted")]), "delete");

    std::fs::create_dir(proj.join("d")).unwrap();
    let s = b.expect(&[("proj/d", "created")]);
    assert_only(&s, &pairs(&[("proj/d", "created")]), "mkdir");
    std::fs::remove_dir(proj.join("d")).unwrap();
    let s = b.expect(&[("proj/d", "deleted")]);
    assert_only(&s, &pairs(&[("proj/d", "deleted")]), "rmdir");

    // Changes made through the broker itself are reported too, under the target's name
    // (never its staging file).
    b.ok(
        "files/write",
        json!({"path": "proj/w.txt", "content": "via broker"}),
    );
    let s = b.expect(&[("proj/w.txt", "created")]);
    assert_only(
        &s,
        &pairs(&[("proj/w.txt", "created"), ("proj/w.txt", "modified")]),
        "files/write",
    );
    b.ok("files/delete", json!({"path": "proj/w.txt"}));
    let s = b.expect(&[("proj/w.txt", "deleted")]);
    assert_only(&s, &pairs(&[("proj/w.txt", "deleted")]), "files/delete");
    assert!(s.notes.iter().all(|n| n.watch_id == id));
}

#[test]
fn rename_within_the_tree_is_deleted_then_created() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir_all(proj.join("a")).unwrap();
    std::fs::create_dir_all(proj.join("b")).unwrap();
    write(proj.join("a/old.txt"), "x");
    write(proj.join("a/other.txt"), "y");
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    std::fs::rename(proj.join("a/old.txt"), proj.join("b/new.txt")).unwrap();
    let want = pairs(&[("proj/a/old.txt", "deleted"), ("proj/b/new.txt", "created")]);
    let s = b.expect(&[("proj/a/old.txt", "deleted"), ("proj/b/new.txt", "created")]);
    assert_eq!(s.set(), want, "file renamed within the tree");

    // A directory renamed within the tree: the old name deleted, the new one created, and
    // the tree under its new name is still watched.
    std::fs::rename(proj.join("a"), proj.join("c")).unwrap();
    let s = b.expect(&[("proj/a", "deleted"), ("proj/c", "created")]);
    assert!(
        s.paths().iter().all(|p| p == "proj/a"
            || p == "proj/c"
            || p.starts_with("proj/a/")
            || p.starts_with("proj/c/")),
        "directory rename: {:?}",
        s.set()
    );
    assert!(!s.has("proj/c", "deleted") && !s.has("proj/a", "created"));
    append(proj.join("c/other.txt"), "more");
    let s = b.expect(&[("proj/c/other.txt", "modified")]);
    assert_only(
        &s,
        &pairs(&[("proj/c/other.txt", "modified")]),
        "a file in a renamed directory reported under its new path",
    );
}

#[test]
fn rename_out_is_deleted_and_rename_in_is_created() {
    let (_t, _base, proj, outside) = layout();
    write(proj.join("leaving.txt"), "bye");
    write(outside.join("coming.txt"), "hi");
    std::fs::create_dir_all(outside.join("tree/sub")).unwrap();
    write(outside.join("tree/sub/inner.txt"), "inside");
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    std::fs::rename(proj.join("leaving.txt"), outside.join("left.txt")).unwrap();
    let s = b.expect(&[("proj/leaving.txt", "deleted")]);
    assert_eq!(
        s.set(),
        pairs(&[("proj/leaving.txt", "deleted")]),
        "moved out"
    );

    std::fs::rename(outside.join("coming.txt"), proj.join("came.txt")).unwrap();
    let s = b.expect(&[("proj/came.txt", "created")]);
    assert_eq!(s.set(), pairs(&[("proj/came.txt", "created")]), "moved in");

    // A whole tree moved in: it appears, what is inside it is reported, and it is watched.
    std::fs::rename(outside.join("tree"), proj.join("tree")).unwrap();
    let want = [
        ("proj/tree", "created"),
        ("proj/tree/sub", "created"),
        ("proj/tree/sub/inner.txt", "created"),
    ];
    let s = b.expect(&want);
    assert_eq!(s.set(), pairs(&want), "tree moved in");
    append(proj.join("tree/sub/inner.txt"), " and more");
    let s = b.expect(&[("proj/tree/sub/inner.txt", "modified")]);
    assert_only(
        &s,
        &pairs(&[("proj/tree/sub/inner.txt", "modified")]),
        "in a tree moved in",
    );

    // Changes to what was moved out are no longer reported.
    append(outside.join("left.txt"), "still here");
    write(proj.join("sentinel"), "s");
    let s = b.expect(&[("proj/sentinel", "created")]);
    assert!(
        s.paths().iter().all(|p| p == "proj/sentinel"),
        "after moving out: {:?}",
        s.set()
    );
}

#[test]
fn nested_directories_created_at_once_report_everything_inside() {
    let (_t, _base, proj, _outside) = layout();
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    // `mkdir -p a/b/c && write a/b/c/f`, several times over, as fast as it goes.
    let mut want = Vec::new();
    for i in 0..50 {
        let top = format!("n{i:02}");
        std::fs::create_dir_all(proj.join(&top).join("b/c")).unwrap();
        write(proj.join(&top).join("b/c/f"), "x");
        for rel in ["", "/b", "/b/c", "/b/c/f"] {
            want.push(format!("proj/{top}{rel}"));
        }
    }
    // And once through a shell, exactly as the issue writes it.
    let st = Command::new("sh")
        .arg("-c")
        .arg("mkdir -p a/b/c && echo hello > a/b/c/f")
        .current_dir(&proj)
        .status()
        .unwrap();
    assert!(st.success());
    for p in ["proj/a", "proj/a/b", "proj/a/b/c", "proj/a/b/c/f"] {
        want.push(p.to_owned());
    }
    let want_pairs: Vec<(&str, &str)> = want.iter().map(|p| (p.as_str(), "created")).collect();
    let s = b.expect(&want_pairs);
    let allowed: BTreeSet<String> = want.iter().cloned().collect();
    for n in &s.notes {
        assert!(allowed.contains(&n.path), "unexpected path: {n:?}");
        assert_ne!(n.event, "deleted", "nothing was deleted: {n:?}");
    }
    // The new directories are watched.
    append(proj.join("a/b/c/f"), "again");
    write(proj.join("a/b/c/g"), "new");
    let s = b.expect(&[("proj/a/b/c/f", "modified"), ("proj/a/b/c/g", "created")]);
    assert!(
        s.paths()
            .iter()
            .all(|p| p == "proj/a/b/c/f" || p == "proj/a/b/c/g"),
        "{:?}",
        s.set()
    );
}

#[test]
fn a_burst_of_ten_thousand_writes_ends_in_the_right_state() {
    let (_t, _base, proj, _outside) = layout();
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    // 2,000 files in 20 new directories, each written 5 times: 10,000 writes.
    const DIRS: usize = 20;
    const PER_DIR: usize = 100;
    let mut files = Vec::new();
    for d in 0..DIRS {
        std::fs::create_dir(proj.join(format!("d{d:02}"))).unwrap();
        for f in 0..PER_DIR {
            files.push(format!("d{d:02}/f{f:03}.txt"));
        }
    }
    // Four writers at once, so that events arrive faster than one thread could make them
    // (on a small machine this is what overflows queues and forces a rescan).
    std::thread::scope(|scope| {
        for part in files.chunks(files.len() / 4) {
            let proj = &proj;
            scope.spawn(move || {
                for round in 0..5 {
                    for f in part {
                        write(proj.join(f), &format!("round {round} of {f}"));
                    }
                }
            });
        }
    });
    let mut want: BTreeSet<(String, String)> = files
        .iter()
        .map(|f| (format!("proj/{f}"), "created".to_owned()))
        .collect();
    for d in 0..DIRS {
        want.insert((format!("proj/d{d:02}"), "created".to_owned()));
    }
    let wrote = Instant::now();
    let s = b.collect_until(Duration::from_secs(90), |s| s.includes(&want));
    eprintln!(
        "burst: {} notifications, settled {:?} after the last write",
        s.notes.len(),
        wrote.elapsed()
    );
    let missing: Vec<_> = want.iter().filter(|(p, e)| !s.has(p, e)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} paths never reported created, e.g. {:?} (last event seen for it: {:?})",
        missing.len(),
        want.len(),
        &missing[..missing.len().min(5)],
        missing
            .first()
            .and_then(|(p, _)| s.notes.iter().rev().find(|n| &n.path == p))
    );
    let known: BTreeSet<&str> = want.iter().map(|(p, _)| p.as_str()).collect();
    for n in &s.notes {
        assert!(known.contains(n.path.as_str()), "unexpected path: {n:?}");
        assert_ne!(n.event, "deleted", "nothing was deleted: {n:?}");
    }
    let log = b.log_text();
    if log.contains("rescan") {
        eprintln!("the burst overflowed a queue; the broker rescanned");
    }
    // The broker is still well: it answers and still reports.
    b.ok("ping", json!({}));
    append(proj.join("d07/f042.txt"), "after");
    let s = b.expect(&[("proj/d07/f042.txt", "modified")]);
    // A rescan after an overflow reports what it finds changed as it walks, and may still be
    // walking (a ping does not wait for it): its late reports are of the burst's own files.
    // Without one, the write after the burst is all there is.
    let rescanned = b.log_text().contains("rescan");
    for n in &s.notes {
        if rescanned {
            assert!(
                known.contains(n.path.as_str()) && n.event != "deleted",
                "after the rescan: {n:?}"
            );
        } else {
            assert_eq!(n.path, "proj/d07/f042.txt", "{n:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Nothing outside the root, behind a symlink, or under a denied glob.
// ---------------------------------------------------------------------------------------------

#[test]
fn changes_outside_the_root_are_never_reported() {
    let (_t, base, proj, outside) = layout();
    // A sibling whose name starts like the root's.
    let sibling = base.join("proj-other");
    std::fs::create_dir(&sibling).unwrap();
    write(outside.join("x.txt"), "x");
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    write(outside.join("new.txt"), "n");
    append(outside.join("x.txt"), "more");
    std::fs::create_dir_all(outside.join("deep/er")).unwrap();
    write(outside.join("deep/er/f"), "f");
    std::fs::remove_file(outside.join("x.txt")).unwrap();
    write(sibling.join("s.txt"), "s");
    write(base.join("beside.txt"), "b");
    std::fs::remove_dir_all(outside.join("deep")).unwrap();
    write(proj.join("sentinel"), "s");

    let s = b.expect(&[("proj/sentinel", "created")]);
    assert_only(
        &s,
        &pairs(&[("proj/sentinel", "created"), ("proj/sentinel", "modified")]),
        "outside the root",
    );
}

#[test]
fn changes_behind_a_symlinked_directory_are_never_reported() {
    let (_t, _base, proj, outside) = layout();
    std::os::unix::fs::symlink("../outside", proj.join("link")).unwrap();
    let abs = outside.canonicalize().unwrap();
    std::os::unix::fs::symlink(&abs, proj.join("abslink")).unwrap();
    write(outside.join("existing.txt"), "e");
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    // In the target directly, and through the links.
    write(outside.join("a.txt"), "a");
    append(outside.join("existing.txt"), "more");
    std::fs::create_dir(outside.join("sub")).unwrap();
    write(outside.join("sub/b.txt"), "b");
    write(proj.join("link/c.txt"), "c");
    write(proj.join("abslink/d.txt"), "d");
    append(proj.join("link/existing.txt"), "again");
    std::fs::remove_file(outside.join("a.txt")).unwrap();
    std::fs::remove_file(proj.join("link/c.txt")).unwrap();
    write(proj.join("sentinel"), "s");

    let s = b.expect(&[("proj/sentinel", "created")]);
    assert_only(
        &s,
        &pairs(&[("proj/sentinel", "created"), ("proj/sentinel", "modified")]),
        "behind a symlinked directory",
    );

    // A watch placed through the link itself leads outside: refused like any operation.
    for p in ["proj/link", "proj/abslink", "proj/link/existing.txt"] {
        let e = b.err("files/watch", json!({"path": p, "recursive": true}));
        assert_code(&e, "PERMISSION_DENIED", -31002, p);
    }
}

#[test]
fn denied_globs_are_never_reported() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("sub")).unwrap();
    write(proj.join("sub/.env"), "KEY=old");
    let (_p, file) = policy(&proj, "deny = [\"secret/**\", \"**/.env\"]", "");
    let mut b = Live::serve_policy(&file);
    b.watch(json!({"path": "r", "recursive": true}));

    std::fs::create_dir(proj.join("secret")).unwrap();
    write(proj.join("secret/key.pem"), "k");
    std::fs::create_dir_all(proj.join("secret/deeper/still")).unwrap();
    write(proj.join("secret/deeper/still/x"), "x");
    write(proj.join(".env"), "TOP=1");
    append(proj.join("sub/.env"), "\nKEY=new");
    std::fs::create_dir_all(proj.join("deep/x")).unwrap();
    write(proj.join("deep/x/.env"), "D=1");
    std::fs::remove_file(proj.join("sub/.env")).unwrap();
    std::fs::rename(proj.join("deep/x/.env"), proj.join("deep/x/.env2")).unwrap();
    std::fs::rename(proj.join("deep/x/.env2"), proj.join("deep/x/.env")).unwrap();
    std::fs::remove_dir_all(proj.join("secret/deeper")).unwrap();
    write(proj.join("sentinel"), "s");

    let s = b.expect(&[
        ("r/sentinel", "created"),
        ("r/deep", "created"),
        ("r/deep/x", "created"),
    ]);
    for n in &s.notes {
        let denied =
            n.path == "r/secret" || n.path.starts_with("r/secret/") || n.path.ends_with("/.env");
        assert!(!denied, "a denied path was reported: {n:?}");
    }
    // `.env2` is not denied: its creation and deletion are allowed to show.
    assert_only(
        &s,
        &pairs(&[
            ("r/sentinel", "created"),
            ("r/sentinel", "modified"),
            ("r/deep", "created"),
            ("r/deep/x", "created"),
            ("r/deep/x/.env2", "created"),
            ("r/deep/x/.env2", "deleted"),
            ("r/deep/x/.env2", "modified"),
        ]),
        "denied globs",
    );

    // A watch on a denied path is refused.
    for p in ["r/secret", "r/secret/key.pem", "r/.env", "r/deep/x/.env"] {
        let e = b.err("files/watch", json!({"path": p}));
        assert_code(&e, "PERMISSION_DENIED", -31002, p);
    }
}

// ---------------------------------------------------------------------------------------------
// What a watch covers: events, recursion, a single file.
// ---------------------------------------------------------------------------------------------

#[test]
fn an_events_filter_reports_only_those_events() {
    let (_t, _base, proj, _outside) = layout();
    write(proj.join("old.txt"), "old");
    write(proj.join("last.txt"), "last");
    let mut b = Live::serve_rw(&[&proj]);
    let id = b.watch(json!({"path": "proj", "recursive": true, "events": ["deleted"]}));

    write(proj.join("new.txt"), "new");
    append(proj.join("old.txt"), "more");
    std::fs::create_dir(proj.join("dir")).unwrap();
    std::fs::remove_file(proj.join("old.txt")).unwrap();
    std::fs::remove_file(proj.join("last.txt")).unwrap();
    let want = [("proj/old.txt", "deleted"), ("proj/last.txt", "deleted")];
    let s = b.expect(&want);
    assert_eq!(s.set(), pairs(&want), "events: [\"deleted\"]");
    assert!(s.notes.iter().all(|n| n.watch_id == id));
}

#[test]
fn a_non_recursive_watch_reports_direct_children_only() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir_all(proj.join("sub/deeper")).unwrap();
    write(proj.join("sub/inner.txt"), "i");
    write(proj.join("top-old.txt"), "t");
    let mut b = Live::serve_rw(&[&proj]);
    // `recursive` defaults to false.
    b.watch(json!({"path": "proj"}));

    append(proj.join("sub/inner.txt"), "more");
    write(proj.join("sub/new-inner.txt"), "n");
    write(proj.join("sub/deeper/deep.txt"), "d");
    std::fs::create_dir(proj.join("newdir")).unwrap();
    write(proj.join("newdir/in-new.txt"), "x");
    std::fs::remove_file(proj.join("sub/inner.txt")).unwrap();
    write(proj.join("top.txt"), "t");
    append(proj.join("top-old.txt"), "more");

    let s = b.expect(&[
        ("proj/newdir", "created"),
        ("proj/top.txt", "created"),
        ("proj/top-old.txt", "modified"),
    ]);
    assert_only(
        &s,
        &pairs(&[
            ("proj/newdir", "created"),
            ("proj/top.txt", "created"),
            ("proj/top.txt", "modified"),
            ("proj/top-old.txt", "modified"),
        ]),
        "non-recursive watch",
    );

    // The same for a non-recursive watch on a subdirectory.
    let (_t2, _base2, proj2, _outside2) = layout();
    std::fs::create_dir_all(proj2.join("w/below")).unwrap();
    let mut b = Live::serve_rw(&[&proj2]);
    b.watch(json!({"path": "proj/w", "recursive": false}));
    write(proj2.join("w/below/no.txt"), "no");
    write(proj2.join("above.txt"), "no");
    write(proj2.join("w/yes.txt"), "yes");
    let s = b.expect(&[("proj/w/yes.txt", "created")]);
    assert_only(
        &s,
        &pairs(&[
            ("proj/w/yes.txt", "created"),
            ("proj/w/yes.txt", "modified"),
        ]),
        "non-recursive watch on a subdirectory",
    );
}

#[test]
fn a_watch_on_a_file_reports_it_and_its_replacement_and_nothing_else() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("d")).unwrap();
    write(proj.join("d/file.txt"), "v1");
    write(proj.join("d/sibling.txt"), "s");
    let mut b = Live::serve_rw(&[&proj]);
    let id = b.watch(json!({"path": "proj/d/file.txt"}));

    append(proj.join("d/sibling.txt"), "more");
    write(proj.join("d/new-sibling.txt"), "n");
    append(proj.join("d/file.txt"), " v2");
    let s = b.expect(&[("proj/d/file.txt", "modified")]);
    assert_eq!(s.set(), pairs(&[("proj/d/file.txt", "modified")]), "append");

    // Atomic replacement, as editors do it: a temporary file renamed over the target.
    write(proj.join("d/.file.txt.swp"), "v3");
    std::fs::rename(proj.join("d/.file.txt.swp"), proj.join("d/file.txt")).unwrap();
    let s = b.collect_until(DEADLINE, |s| s.count("proj/d/file.txt") > 0);
    assert!(
        s.count("proj/d/file.txt") > 0,
        "the atomic replacement was not reported"
    );
    assert!(
        s.paths().iter().all(|p| p == "proj/d/file.txt"),
        "replacement: {:?}",
        s.set()
    );
    // The file is there afterwards: its last event is not `deleted`.
    let last = s.notes.last().unwrap();
    assert_ne!(
        last.event, "deleted",
        "the replaced file still exists: {last:?}"
    );

    // It is still watched after being replaced, and the broker's own atomic write (a staging
    // file renamed over it) is reported under its name only.
    append(proj.join("d/file.txt"), " v4");
    let s = b.expect(&[("proj/d/file.txt", "modified")]);
    assert_eq!(
        s.set(),
        pairs(&[("proj/d/file.txt", "modified")]),
        "after replacement"
    );
    b.ok(
        "files/write",
        json!({"path": "proj/d/file.txt", "content": "v5"}),
    );
    let s = b.collect_until(DEADLINE, |s| s.count("proj/d/file.txt") > 0);
    assert!(s.count("proj/d/file.txt") > 0, "files/write not reported");
    assert!(
        s.paths().iter().all(|p| p == "proj/d/file.txt"),
        "files/write: {:?}",
        s.set()
    );
    assert_ne!(s.notes.last().unwrap().event, "deleted");

    // Deleting it is reported.
    std::fs::remove_file(proj.join("d/file.txt")).unwrap();
    write(proj.join("d/sibling.txt"), "last");
    let s = b.expect(&[("proj/d/file.txt", "deleted")]);
    assert_eq!(s.set(), pairs(&[("proj/d/file.txt", "deleted")]), "delete");
    assert!(s.notes.iter().all(|n| n.watch_id == id));
}

// ---------------------------------------------------------------------------------------------
// Unwatch, quotas, refusals.
// ---------------------------------------------------------------------------------------------

#[test]
fn unwatch_stops_reports_and_refuses_unknown_ids() {
    let (_t, _base, proj, _outside) = layout();
    let mut b = Live::serve_rw(&[&proj]);
    let gone = b.watch(json!({"path": "proj", "recursive": true}));
    let stays = b.watch(json!({"path": "proj", "recursive": true}));
    assert_ne!(gone, stays);

    write(proj.join("one.txt"), "1");
    let s = b.expect(&[("proj/one.txt", "created")]);
    let ids: BTreeSet<&str> = s.notes.iter().map(|n| n.watch_id.as_str()).collect();
    assert_eq!(
        ids,
        BTreeSet::from([gone.as_str(), stays.as_str()]),
        "each watch reports with its own watchId"
    );
    let by_watch = |w: &str| -> BTreeSet<(String, String)> {
        s.notes
            .iter()
            .filter(|n| n.watch_id == w)
            .map(|n| (n.path.clone(), n.event.clone()))
            .collect()
    };
    assert!(by_watch(&gone).contains(&("proj/one.txt".to_owned(), "created".to_owned())));
    assert!(by_watch(&stays).contains(&("proj/one.txt".to_owned(), "created".to_owned())));

    assert_eq!(b.ok("files/unwatch", json!({"watchId": gone})), json!({}));
    write(proj.join("two.txt"), "2");
    std::fs::create_dir_all(proj.join("x/y")).unwrap();
    let s = b.expect(&[("proj/two.txt", "created"), ("proj/x/y", "created")]);
    for n in &s.notes {
        assert_eq!(
            n.watch_id, stays,
            "a notification for an ended watch: {n:?}"
        );
    }

    // An id already ended, an unknown one, one of another session (another broker's), and
    // an ill-typed one: invalid params.
    let (_t2, _b2, proj2, _o2) = layout();
    let mut other = Live::serve_rw(&[&proj2]);
    let foreign = other.watch(json!({"path": "proj"}));
    for bad in [
        json!(gone),
        json!("0123456789abcdef"),
        json!(foreign),
        json!(""),
    ] {
        let e = b.err("files/unwatch", json!({"watchId": bad}));
        assert_eq!(e["code"], -32602, "unwatch {bad}: {e}");
    }
    let e = b.err("files/unwatch", json!({"watchId": 7}));
    assert_eq!(e["code"], -32602, "{e}");
    let e = b.err("files/unwatch", json!({}));
    assert_eq!(e["code"], -32602, "{e}");
    // The other session's watch is unaffected.
    write(proj2.join("theirs.txt"), "t");
    other.expect(&[("proj/theirs.txt", "created")]);
    // And this session's remaining watch too.
    assert_eq!(b.ok("files/unwatch", json!({"watchId": stays})), json!({}));
    write(proj.join("three.txt"), "3");
    let s = b.collect();
    assert!(s.notes.is_empty(), "no watch left: {:?}", s.notes);
}

#[test]
fn max_watches_is_a_quota() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("a")).unwrap();
    let (_p, file) = policy(&proj, "", "max_watches = 2");
    let mut b = Live::serve_policy(&file);
    let first = b.watch(json!({"path": "r"}));
    b.watch(json!({"path": "r/a", "recursive": true}));
    let e = b.err("files/watch", json!({"path": "r/a"}));
    assert_code(&e, "QUOTA_EXCEEDED", -31007, "third watch");
    // Ending one makes room for another.
    b.ok("files/unwatch", json!({"watchId": first}));
    b.watch(json!({"path": "r"}));
    let e = b.err("files/watch", json!({"path": "r", "recursive": true}));
    assert_code(&e, "QUOTA_EXCEEDED", -31007, "third watch again");
}

#[test]
fn refused_watches() {
    let (_t, base, proj, outside) = layout();
    write(outside.join("secret.txt"), "s");
    write(proj.join("f.txt"), "f");
    let mut b = Live::serve_rw(&[&proj]);

    // Outside every root, however it is spelled.
    let abs_out = outside.to_str().unwrap().to_owned();
    let uri_out = format!("file://{}", common::uri_path(&outside));
    for p in [
        abs_out.as_str(),
        uri_out.as_str(),
        "../outside",
        "proj/../outside",
        base.to_str().unwrap(),
        "/",
    ] {
        let e = b.err("files/watch", json!({"path": p, "recursive": true}));
        assert_code(&e, "PERMISSION_DENIED", -31002, p);
    }
    // Missing.
    for p in ["proj/missing", "proj/missing/deeper"] {
        let e = b.err("files/watch", json!({"path": p}));
        assert_code(&e, "FILE_NOT_FOUND", -31001, p);
    }
    // Bad `events` entries, or an ill-typed field.
    for params in [
        json!({"path": "proj", "events": ["created", "renamed"]}),
        json!({"path": "proj", "events": ["CREATED"]}),
        json!({"path": "proj", "events": [1]}),
        json!({"path": "proj", "events": "created"}),
        json!({"path": "proj", "recursive": "yes"}),
        json!({"recursive": true}),
    ] {
        let e = b.err("files/watch", params.clone());
        assert_eq!(e["code"], -32602, "{params}: {e}");
    }
    // None of them left a watch behind.
    write(proj.join("g.txt"), "g");
    let s = b.collect();
    assert!(s.notes.is_empty(), "refused watches report: {:?}", s.notes);
    // A good one by absolute path and by URI reports in NAME/rel form.
    let abs = proj.to_str().unwrap().to_owned();
    b.watch(json!({"path": abs}));
    b.watch(json!({"path": format!("file://{}", common::uri_path(&proj.join("f.txt")))}));
    append(proj.join("f.txt"), "more");
    let s = b.expect(&[("proj/f.txt", "modified")]);
    assert_eq!(s.set(), pairs(&[("proj/f.txt", "modified")]));
    assert_eq!(
        s.notes
            .iter()
            .map(|n| &n.watch_id)
            .collect::<HashSet<_>>()
            .len(),
        2
    );
}

#[test]
fn a_prompt_root_without_a_grant_refuses_watch() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("sub")).unwrap();
    let mut b = Live::start(&[
        "serve".as_ref(),
        "--root".as_ref(),
        proj.as_os_str(),
        "--consent".as_ref(),
        "prompt".as_ref(),
    ]);
    for p in ["proj", "proj/sub"] {
        let e = b.err("files/watch", json!({"path": p, "recursive": true}));
        assert_code(&e, "PERMISSION_DENIED", -31002, p);
        assert_eq!(e["data"]["reason"], "no consent", "{p}: {e}");
    }
    write(proj.join("sub/x"), "x");
    let s = b.collect();
    assert!(s.notes.is_empty(), "{:?}", s.notes);
}

// ---------------------------------------------------------------------------------------------
// Timestamps and ids (checked on every notification by the collector; here explicitly).
// ---------------------------------------------------------------------------------------------

#[test]
fn notifications_carry_their_watch_id_and_an_rfc3339_utc_timestamp() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("sub")).unwrap();
    let mut b = Live::serve_rw(&[&proj]);
    let whole = b.watch(json!({"path": "proj", "recursive": true}));
    let sub = b.watch(json!({"path": "proj/sub"}));
    let before = SystemTime::now();
    write(proj.join("top.txt"), "t");
    write(proj.join("sub/in.txt"), "i");
    let s = b.expect(&[("proj/top.txt", "created"), ("proj/sub/in.txt", "created")]);
    let after = SystemTime::now();
    for n in &s.notes {
        let t = parse_utc(&n.timestamp).unwrap();
        assert!(
            t + Duration::from_secs(2) >= before && t <= after + Duration::from_secs(2),
            "timestamp {} not the time of the change",
            n.timestamp
        );
        assert!(n.timestamp.ends_with('Z'), "{n:?}");
    }
    let of = |w: &str| -> BTreeSet<String> {
        s.notes
            .iter()
            .filter(|n| n.watch_id == w)
            .map(|n| n.path.clone())
            .collect()
    };
    assert_eq!(
        of(&whole),
        BTreeSet::from(["proj/top.txt".to_owned(), "proj/sub/in.txt".to_owned()])
    );
    assert_eq!(of(&sub), BTreeSet::from(["proj/sub/in.txt".to_owned()]));
}

// ---------------------------------------------------------------------------------------------
// Roots that disappear.
// ---------------------------------------------------------------------------------------------

/// Three roots `proj`, `keep`, `keep2` (with one left, a relative path would be relative to
/// it, §3), a file in `proj`, a recursive watch on `proj` and one on `keep` as a sentinel.
fn three_roots() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, Live) {
    let (t, base, proj, _outside) = layout();
    let keep = base.join("keep");
    let keep2 = base.join("keep2");
    std::fs::create_dir(&keep).unwrap();
    std::fs::create_dir(&keep2).unwrap();
    write(proj.join("f.txt"), "f");
    std::fs::create_dir(proj.join("sub")).unwrap();
    let mut b = Live::serve_rw(&[&proj, &keep, &keep2]);
    assert_eq!(b.root_names(), ["proj", "keep", "keep2"]);
    b.watch(json!({"path": "proj", "recursive": true}));
    b.watch(json!({"path": "keep"}));
    (t, base, proj, keep, b)
}

/// After `proj` is gone: it is no longer listed, operations there fail cleanly, and its
/// watch has ended.
fn check_retired(b: &mut Live, proj: &Path, keep: &Path, what: &str) {
    assert_eq!(b.root_names(), ["keep", "keep2"], "{what}");
    let abs = proj.join("f.txt").to_str().unwrap().to_owned();
    for p in ["proj/f.txt", abs.as_str()] {
        let e = b.err("files/read", json!({"path": p}));
        assert_code(
            &e,
            "PERMISSION_DENIED",
            -31002,
            &format!("{what}: read {p}"),
        );
    }
    let e = b.err("files/list", json!({"path": "proj"}));
    assert_code(&e, "PERMISSION_DENIED", -31002, &format!("{what}: list"));
    let e = b.err("files/watch", json!({"path": "proj"}));
    assert_code(&e, "PERMISSION_DENIED", -31002, &format!("{what}: watch"));
    let e = b.err(
        "files/write",
        json!({"path": "proj/new.txt", "content": "x"}),
    );
    assert_code(&e, "PERMISSION_DENIED", -31002, &format!("{what}: write"));
    b.ok("ping", json!({}));
    // The other roots still work, and report.
    write(keep.join("sentinel"), "s");
    let s = b.expect(&[("keep/sentinel", "created")]);
    assert!(
        s.paths().iter().all(|p| p == "keep/sentinel"),
        "{what}: {:?}",
        s.set()
    );
}

#[test]
fn a_root_deleted_while_watched_is_retired() {
    let (_t, _base, proj, keep, mut b) = three_roots();
    std::fs::remove_dir_all(&proj).unwrap();
    let s = b.expect_list_changed("root deleted");
    // Whatever came before the retirement is about `proj`'s own paths.
    assert!(
        s.notes
            .iter()
            .all(|n| n.event == "deleted" && (n.path == "proj" || n.path.starts_with("proj/"))),
        "{:?}",
        s.notes
    );
    check_retired(&mut b, &proj, &keep, "root deleted");

    // A directory made again at the same place is not watched by the ended watch.
    std::fs::create_dir(&proj).unwrap();
    write(proj.join("again.txt"), "a");
    write(keep.join("sentinel2"), "s");
    let s = b.expect(&[("keep/sentinel2", "created")]);
    assert!(
        s.paths().iter().all(|p| p.starts_with("keep/")),
        "a retired root's watch reported: {:?}",
        s.set()
    );
    assert!(b.alive());
}

#[test]
fn a_root_moved_away_while_watched_is_retired() {
    let (_t, base, proj, keep, mut b) = three_roots();
    let moved = base.join("moved");
    std::fs::rename(&proj, &moved).unwrap();
    let s = b.expect_list_changed("root moved away");
    assert!(
        s.notes
            .iter()
            .all(|n| n.path == "proj" || n.path.starts_with("proj/")),
        "{:?}",
        s.notes
    );
    check_retired(&mut b, &proj, &keep, "root moved away");
    // Where it went is outside every root too.
    let abs = moved.join("f.txt").to_str().unwrap().to_owned();
    let e = b.err("files/read", json!({"path": abs}));
    assert_code(&e, "PERMISSION_DENIED", -31002, "read at the new place");

    // Changes in the moved directory are not reported (the watch ended with the root).
    append(moved.join("f.txt"), "more");
    write(moved.join("sub/new.txt"), "n");
    std::fs::remove_file(moved.join("f.txt")).unwrap();
    write(keep.join("sentinel2"), "s");
    let s = b.expect(&[("keep/sentinel2", "created")]);
    assert!(
        s.paths().iter().all(|p| p.starts_with("keep/")),
        "the moved root's watch still reports: {:?}",
        s.set()
    );
    assert!(b.alive());
}

// ---------------------------------------------------------------------------------------------
// Coalescing and backpressure.
// ---------------------------------------------------------------------------------------------

#[test]
fn quick_appends_to_one_file_are_coalesced() {
    let (_t, _base, proj, _outside) = layout();
    write(proj.join("log.txt"), "");
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));

    let start = Instant::now();
    for i in 0..50 {
        append(proj.join("log.txt"), &format!("line {i}\n"));
    }
    let took = start.elapsed();
    let s = b.expect(&[("proj/log.txt", "modified")]);
    let n = s.count("proj/log.txt");
    eprintln!("50 appends in {took:?} gave {n} notification(s)");
    assert_only(&s, &pairs(&[("proj/log.txt", "modified")]), "appends");
    assert!(
        (1..10).contains(&n),
        "50 appends within {took:?} gave {n} notifications (want at least 1, fewer than 10)"
    );
}

#[test]
fn a_server_that_stops_reading_does_not_sink_the_broker() {
    let (_t, _base, proj, _outside) = layout();
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj", "recursive": true}));
    let rss_before = b.rss_kb();

    b.pause_reading();
    // ~5,000 changes to 100 files, spread over a few seconds so that coalescing (per ~50 ms)
    // still leaves thousands of notifications: far more than the pipe holds.
    const FILES: usize = 100;
    const ROUNDS: usize = 50;
    for f in 0..FILES {
        write(proj.join(format!("f{f:03}.txt")), "start\n");
    }
    for round in 0..ROUNDS - 1 {
        for f in 0..FILES {
            append(
                proj.join(format!("f{f:03}.txt")),
                &format!("round {round}\n"),
            );
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    // A request while the server is not reading: answered once it reads again.
    let ping = b.send("ping", json!({}));
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        b.alive(),
        "the broker died while its server was not reading"
    );
    let rss_stalled = b.rss_kb();

    b.resume_reading();
    let want: BTreeSet<String> = (0..FILES).map(|f| format!("proj/f{f:03}.txt")).collect();
    let s = b.collect_until(Duration::from_secs(60), |s| {
        want.iter().all(|p| s.count(p) > 0)
    });
    let missing: Vec<_> = want.iter().filter(|p| s.count(p) == 0).collect();
    assert!(missing.is_empty(), "never reported: {missing:?}");
    for n in &s.notes {
        assert!(want.contains(&n.path), "unexpected path: {n:?}");
        assert_ne!(n.event, "deleted", "nothing was deleted: {n:?}");
    }
    let r = b.response(ping);
    assert!(r.get("error").is_none(), "ping: {r}");
    b.ok("ping", json!({}));
    let rss_after = b.rss_kb();
    eprintln!(
        "{} notifications for {FILES} files; RSS {rss_before} kB before, {rss_stalled} kB \
         stalled, {rss_after} kB after",
        s.notes.len()
    );
    for rss in [rss_stalled, rss_after] {
        assert!(
            rss < 200 * 1024,
            "RSS {rss} kB: the backlog grew without bound"
        );
    }
    // And it still reports.
    append(proj.join("f000.txt"), "after");
    b.expect(&[("proj/f000.txt", "modified")]);
    if !b.log_text().contains("not reading") && !b.log_text().contains("dropping") {
        eprintln!("note: no log line said that notifications were held or dropped");
    }
}

// ---------------------------------------------------------------------------------------------
// Watched directories that move.
// ---------------------------------------------------------------------------------------------

/// Fails with every problem at once: pairs reported beyond `allowed`, and pairs of `required`
/// never reported.
fn assert_exactly_within(
    seen: &Seen,
    allowed: &BTreeSet<(String, String)>,
    required: &[(&str, &str)],
    what: &str,
) {
    let mut problems = Vec::new();
    let extra: Vec<_> = seen.set().difference(allowed).cloned().collect();
    if !extra.is_empty() {
        problems.push(format!("reported but must not be: {extra:?}"));
    }
    let missing: Vec<_> = required.iter().filter(|(p, e)| !seen.has(p, e)).collect();
    if !missing.is_empty() {
        problems.push(format!("never reported: {missing:?}"));
    }
    assert!(
        problems.is_empty(),
        "{what}: {}; all seen: {:?}",
        problems.join("; "),
        seen.set()
    );
}

#[test]
fn a_watched_directory_moved_out_of_the_root_reports_nothing_from_its_new_place() {
    let (_t, _base, proj, outside) = layout();
    std::fs::create_dir_all(proj.join("sub/deeper")).unwrap();
    write(proj.join("sub/a.txt"), "a");
    std::fs::create_dir(proj.join("d")).unwrap();
    write(proj.join("d/file.txt"), "f");
    std::fs::create_dir(proj.join("other")).unwrap();
    let mut b = Live::serve_rw(&[&proj]);
    // Watches whose directories have no watched parent: only their own inotify watches see
    // them move.
    b.watch(json!({"path": "proj/sub", "recursive": true}));
    b.watch(json!({"path": "proj/d/file.txt"}));
    b.watch(json!({"path": "proj/other"}));

    std::fs::rename(proj.join("sub"), outside.join("sub")).unwrap();
    std::fs::rename(proj.join("d"), outside.join("d")).unwrap();
    // Let the broker see the moves before anything happens at the new places.
    std::thread::sleep(Duration::from_millis(300));
    write(outside.join("sub/leak.txt"), "outside");
    append(outside.join("sub/a.txt"), "outside");
    write(outside.join("sub/deeper/leak2.txt"), "outside");
    append(outside.join("d/file.txt"), "outside");
    write(proj.join("other/sentinel"), "s");

    let s = b.expect(&[("proj/other/sentinel", "created")]);
    // The watched paths went away (moved out is `deleted`); what then happens at their new
    // place, outside the root, is never reported.
    assert_exactly_within(
        &s,
        &pairs(&[
            ("proj/other/sentinel", "created"),
            ("proj/other/sentinel", "modified"),
            ("proj/sub", "deleted"),
            ("proj/d/file.txt", "deleted"),
        ]),
        &[("proj/sub", "deleted"), ("proj/d/file.txt", "deleted")],
        "watched directories moved out of the root",
    );
}

#[test]
fn a_watched_directory_renamed_within_the_root_reports_no_stale_paths() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("w")).unwrap();
    std::fs::create_dir(proj.join("d")).unwrap();
    write(proj.join("d/file.txt"), "f");
    std::fs::create_dir(proj.join("other")).unwrap();
    let mut b = Live::serve_rw(&[&proj]);
    b.watch(json!({"path": "proj/w"}));
    b.watch(json!({"path": "proj/d/file.txt"}));
    b.watch(json!({"path": "proj/other"}));

    std::fs::rename(proj.join("w"), proj.join("w2")).unwrap();
    std::fs::rename(proj.join("d"), proj.join("e")).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    write(proj.join("w2/x.txt"), "x");
    append(proj.join("e/file.txt"), "more");
    write(proj.join("other/sentinel"), "s");

    let s = b.expect(&[("proj/other/sentinel", "created")]);
    // The watched paths are gone: that is `deleted`. `proj/w/x.txt` never existed and
    // `proj/d/file.txt` no longer does: a notification naming them sends the server to a
    // path that is not there.
    assert_exactly_within(
        &s,
        &pairs(&[
            ("proj/other/sentinel", "created"),
            ("proj/other/sentinel", "modified"),
            ("proj/w", "deleted"),
            ("proj/d/file.txt", "deleted"),
        ]),
        &[("proj/w", "deleted"), ("proj/d/file.txt", "deleted")],
        "watched directories renamed within the root",
    );
}

// ---------------------------------------------------------------------------------------------
// Watches that share directories.
// ---------------------------------------------------------------------------------------------

/// The pairs reported for the watch `id`.
fn of_watch(seen: &Seen, id: &str) -> BTreeSet<(String, String)> {
    seen.notes
        .iter()
        .filter(|n| n.watch_id == id)
        .map(|n| (n.path.clone(), n.event.clone()))
        .collect()
}

#[test]
fn a_flat_watch_inside_a_recursive_one_does_not_blind_it() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("sub")).unwrap();
    let mut b = Live::serve_rw(&[&proj]);
    let whole = b.watch(json!({"path": "proj", "recursive": true}));
    let flat = b.watch(json!({"path": "proj/sub"}));

    // A new directory in `sub`, and later a file in it: the recursive watch covers it.
    std::fs::create_dir(proj.join("sub/nd")).unwrap();
    b.expect(&[("proj/sub/nd", "created")]);
    write(proj.join("sub/nd/y.txt"), "y");
    write(proj.join("sentinel"), "s");
    let s = b.expect(&[("proj/sentinel", "created")]);
    let mut problems = Vec::new();
    if !of_watch(&s, &whole).contains(&("proj/sub/nd/y.txt".into(), "created".into())) {
        problems.push(format!(
            "with a flat watch on proj/sub, the recursive watch on proj missed \
             proj/sub/nd/y.txt (made in a directory created after the watch); it saw {:?}",
            of_watch(&s, &whole)
        ));
    }
    assert!(
        !of_watch(&s, &flat)
            .iter()
            .any(|(p, _)| p.starts_with("proj/sub/nd/")),
        "the flat watch reported below its directory: {:?}",
        of_watch(&s, &flat)
    );

    // Ending the flat watch leaves the recursive one whole.
    b.ok("files/unwatch", json!({"watchId": flat}));
    write(proj.join("sub/x.txt"), "x");
    write(proj.join("sentinel2"), "s");
    let s = b.expect(&[("proj/sentinel2", "created")]);
    if !s.has("proj/sub/x.txt", "created") {
        problems.push(format!(
            "after files/unwatch of the flat watch on proj/sub, the recursive watch on proj \
             no longer reports proj/sub/x.txt; it saw {:?}",
            s.set()
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn ending_a_recursive_watch_leaves_a_flat_one_on_the_same_directory() {
    let (_t, _base, proj, _outside) = layout();
    std::fs::create_dir(proj.join("sub")).unwrap();
    let mut b = Live::serve_rw(&[&proj]);
    let flat = b.watch(json!({"path": "proj"}));
    let deep = b.watch(json!({"path": "proj", "recursive": true}));
    write(proj.join("sub/one.txt"), "1");
    write(proj.join("top1.txt"), "1");
    let s = b.expect(&[
        ("proj/sub/one.txt", "created"),
        ("proj/top1.txt", "created"),
    ]);
    assert!(of_watch(&s, &deep).contains(&("proj/sub/one.txt".into(), "created".into())));
    assert!(
        !of_watch(&s, &flat)
            .iter()
            .any(|(p, _)| p == "proj/sub/one.txt")
    );

    b.ok("files/unwatch", json!({"watchId": deep}));
    write(proj.join("sub/two.txt"), "2");
    write(proj.join("top2.txt"), "2");
    let s = b.expect(&[("proj/top2.txt", "created")]);
    assert_only(
        &s,
        &pairs(&[("proj/top2.txt", "created"), ("proj/top2.txt", "modified")]),
        "the flat watch after the recursive one ended",
    );
    assert!(s.notes.iter().all(|n| n.watch_id == flat));
}

#[test]
fn roots_list_changed_is_not_lost_while_the_server_is_not_reading() {
    let (_t, _base, proj, keep, mut b) = three_roots();
    b.pause_reading();
    // Enough file notifications to fill every queue between the broker and the server.
    for round in 0..40 {
        for f in 0..100 {
            write(keep.join(format!("f{f:03}.txt")), &format!("round {round}"));
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    // Then a root goes away while nothing is being read.
    std::fs::remove_dir_all(&proj).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    b.resume_reading();
    let s = b.collect_until(DEADLINE, |s| s.list_changed > 0);
    assert!(
        s.list_changed > 0,
        "notifications/roots/list_changed was lost while the server was not reading \
         ({} file notifications came instead)",
        s.notes.len()
    );
    assert_eq!(b.root_names(), ["keep", "keep2"]);
}

// ---------------------------------------------------------------------------------------------
// A broker started on a busy machine.
// ---------------------------------------------------------------------------------------------

#[test]
fn brokers_started_on_a_busy_machine_all_report() {
    // Busy threads, so that the brokers start with their threads preempted at odd moments
    // (as on a loaded two-core machine). This is a stress test: a broker whose watch
    // machinery gives up at start-up is found by chance, not every run.
    let busy = BUSY.write().unwrap_or_else(|e| e.into_inner());
    let hogs = Hogs::start(16);
    let mut started = Vec::new();
    for _ in 0..30 {
        let (t, _base, proj, _outside) = layout();
        let mut b = Live::start_now(&[
            "serve".as_ref(),
            "--root".as_ref(),
            proj.as_os_str(),
            "--read-write".as_ref(),
        ]);
        b.watch(json!({"path": "proj"}));
        started.push((t, proj, b));
    }
    drop(hogs);
    drop(busy);
    // Now quiet: every broker must report a change in its root.
    for (_, proj, _) in &started {
        write(proj.join("x.txt"), "x");
    }
    let mut silent = Vec::new();
    for (i, (_, _, b)) in started.iter_mut().enumerate() {
        let s = b.collect_until(Duration::from_secs(5), |s| s.has("proj/x.txt", "created"));
        if !s.has("proj/x.txt", "created") {
            silent.push((i, thread_names(b.pid())));
        }
    }
    assert!(
        silent.is_empty(),
        "{} of {} brokers started under load never report anything; their threads: {silent:?}",
        silent.len(),
        started.len()
    );
}

/// Threads that keep the CPUs busy until dropped (also when a test fails).
struct Hogs {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Hogs {
    fn start(n: usize) -> Hogs {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    }
                    x
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The names of a process's threads (for diagnostics).
fn thread_names(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|n| n.trim().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.dedup();
    names
}

//! fsbroker's own files are off limits to the servers it serves, through the real binary on
//! real temp dirs.
//!
//! A *protected path* is anything the broker trusts or writes at run time: the policy file
//! (and a symlink's target), the folder holding it, the audit log (`[audit] path` or
//! `--audit`) and every name in its folder that starts with its name (rotated siblings such as
//! `audit.jsonl.1`), every file the `[consent] command` argv names, and the `--listen` socket;
//! by canonical path and by device + inode. Through any root, name or path form (`NAME/rel`,
//! absolute, `file://`): no write (plain, `append`, `create: false`, `ifMatch`), no chunked
//! upload, no `files/create`, no `files/delete`, no rename of it away or of another file onto
//! it, no rename or recursive delete of a directory that holds one; no read and no watch of
//! the files; listings leave them out and a watch on their folder never reports them.
//!
//! Every refusal must be `-31002` / `PERMISSION_DENIED` with `data.path` the request path as
//! sent and a reason starting "protected"; afterwards every guarded file is the same file with
//! the same bytes (the audit log only grew, by appends), no staging file is left, and (where a
//! policy was aimed at) the broker did not reload.
//!
//! Rows run in tables: a row that fails is reported, the tree and the broker are rebuilt, and
//! the next row runs, so one run shows every route that is open.
//!
//! Layout of the usual world (in a fresh temp dir `T`):
//! ```text
//! T/outside/secret.txt     outside every root
//! T/proj/                  the root `project` (read-write, consent auto)
//! T/proj/fsbroker.toml     the policy: `[[root]] path = "."`, `[audit] path = "audit.jsonl"`
//! T/proj/audit.jsonl       the audit log, written by the broker
//! T/proj/a.txt, sub/b.txt  ordinary files
//! ```
//!
//! One file though long: its tables share one tree of traps and one runner, and the hostile-
//! case counts it prints are this file's; split, a row could land where no runner checks it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use common::hostile::{put, shown, uri};
use common::{PolicyToml, RootToml, lit, path_str as s};

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fsb::{Cmd, Listener};
use common::{Fsb, bin, tempdir};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// In the policy file (a TOML comment): must never reach the wire.
const POLICY_MARKER: &str = "POLICY-MARKER-41c7";
/// In the consent command's files and in an existing rotated audit log.
const OWN_MARKER: &str = "OWN-FILE-MARKER-8d03";
/// In the file outside every root.
const OUTSIDE_MARKER: &str = "OUTSIDE-MARKER-e52a";
/// What hostile writes try to put into files that are not policies.
const PAYLOAD: &str = "PWNED by a hostile server\n";
/// A forged audit line.
const FORGED_AUDIT: &str = "{\"event\":\"start\",\"forged\":true}\n";
/// Longest wait for a response.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long a test watches for a reload that must not happen.
const NO_RELOAD_FOR: Duration = Duration::from_millis(1000);

// ---------------------------------------------------------------------------------------------
// Helpers: text, files, policies
// ---------------------------------------------------------------------------------------------

fn hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A read-write, consent-auto `[[root]]` table; `path` is TOML text (a literal string).
fn root_table(path: &str, name: &str) -> String {
    RootToml::raw(path).name(name).rw().text()
}

/// A policy: the marker comment, read-write roots (`path` as written, `name`), then `extra`
/// (more tables, as text: rows here splice policy text).
fn policy_text(roots: &[(&str, &str)], extra: &str) -> String {
    let mut policy =
        PolicyToml::new().head(&format!("# {POLICY_MARKER}: this file is fsbroker's own\n"));
    for (path, name) in roots {
        policy = policy.root(RootToml::raw(&format!("'{path}'")).name(name).rw());
    }
    policy.text() + "\n" + extra
}

/// `text` plus a root granting the whole file system: what a hostile server would write.
fn granting_everything(text: &str) -> String {
    format!("{text}\n{}", root_table("'/'", "everything"))
}

/// The broker's `etag` of a file (its format: `src/sandbox/open.rs`), for `ifMatch`. If the
/// format ever changes, the row still fails closed today (`CONCURRENCY_CONFLICT`).
fn etag_of(path: &Path) -> String {
    let m = std::fs::metadata(path).unwrap();
    format!(
        "{:x}-{:x}-{:x}-{:x}.{:x}-{:x}.{:x}",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    )
}

/// The ordinary tree every world starts from: `T/outside/secret.txt`, `T/proj/a.txt`,
/// `T/proj/sub/b.txt`.
fn project(base: &Path) {
    put(
        &base.join("outside/secret.txt"),
        &format!("{OUTSIDE_MARKER} secret\n"),
    );
    put(&base.join("proj/a.txt"), "inside a\n");
    put(&base.join("proj/sub/b.txt"), "inside b\n");
}

/// The usual world: the policy and the audit log inside the root `project`.
fn usual(base: &Path) {
    project(base);
    put(
        &base.join("proj/fsbroker.toml"),
        &policy_text(&[(".", "project")], "[audit]\npath = \"audit.jsonl\"\n"),
    );
}

/// `serve --policy T/proj/fsbroker.toml`.
fn serve_usual(base: &Path) -> Vec<OsString> {
    vec![
        "serve".into(),
        "--policy".into(),
        base.join("proj/fsbroker.toml").into(),
    ]
}

/// The entries whose name holds fsbroker's staging mark, anywhere beneath `dir`.
fn staging_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_name().to_string_lossy().contains(".fsbroker-") {
                found.push(path.clone());
            }
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

/// One entry, not followed: what it is, which inode, and for a regular file its mode,
/// modification time and sha256; "absent" when there is none.
fn describe(path: &Path) -> String {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return "absent".into(),
        Err(e) => panic!("lstat {}: {e}", path.display()),
    };
    let ft = m.file_type();
    if ft.is_symlink() {
        format!("symlink -> {}", std::fs::read_link(path).unwrap().display())
    } else if ft.is_dir() {
        format!("dir ino={}", m.ino())
    } else if ft.is_file() {
        let bytes = std::fs::read(path).unwrap();
        format!(
            "file ino={} mode={:o} mtime={}.{:09} size={} sha256={}",
            m.ino(),
            m.mode() & 0o7777,
            m.mtime(),
            m.mtime_nsec(),
            bytes.len(),
            hex(&bytes)
        )
    } else if ft.is_socket() {
        format!("socket ino={}", m.ino())
    } else {
        format!("other ino={}", m.ino())
    }
}

/// Checks a response is the protected-path refusal: `-31002`, `PERMISSION_DENIED`,
/// `data.path` exactly `blame`, a reason starting "protected".
fn protected_refusal(resp: &Value, blame: &str) -> Result<(), String> {
    if resp.get("result").is_some() {
        return Err(format!("answered ok: {}", shown(resp)));
    }
    let err = &resp["error"];
    let mut wrong = Vec::new();
    if err["code"] != json!(-31002) {
        wrong.push(format!("code {}", err["code"]));
    }
    if err["data"]["code"] != "PERMISSION_DENIED" {
        wrong.push(format!("data.code {}", err["data"]["code"]));
    }
    if err["data"]["path"].as_str() != Some(blame) {
        wrong.push(format!(
            "data.path {} (want {})",
            err["data"]["path"],
            json!(blame)
        ));
    }
    let reason = err["data"]["reason"].as_str().unwrap_or_default();
    if !reason.starts_with("protected") {
        wrong.push(format!("reason {reason:?}"));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {}", wrong.join(", "), shown(resp)))
    }
}

// ---------------------------------------------------------------------------------------------
// A server reached over a Unix socket (`serve --listen`)
// ---------------------------------------------------------------------------------------------

/// `fsbroker serve --listen SOCK ...` (`args`, from `serve` on) with `RUST_LOG=warn`, once its
/// socket is there, and a session with it.
fn start_listener(args: &[OsString], sock: &Path) -> (Listener, Fsb) {
    assert_eq!(
        args[..3],
        [
            "serve".into(),
            "--listen".into(),
            sock.as_os_str().to_owned()
        ]
    );
    let mut l = Listener::spawn(sock, Cmd::new(&args[3..]).env("RUST_LOG", "warn"));
    if let Err(status) = l.wait_listening(Duration::from_secs(10)) {
        panic!("serve --listen exited ({status})");
    }
    let mut conn = l.connect();
    conn.set_deadline(DEADLINE);
    (l, conn)
}

// ---------------------------------------------------------------------------------------------
// The lab: a world, a broker on it, guarded files, and tables of attempts
// ---------------------------------------------------------------------------------------------

enum Server {
    Stdio(Fsb),
    Socket { listener: Listener, conn: Fsb },
}

/// What a step must answer.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// The protected-path refusal.
    Protected,
    /// Success (controls).
    Ok,
}

/// One request of a row.
struct Step {
    method: &'static str,
    params: Value,
    /// The request path `data.path` must echo.
    blame: String,
    want: Want,
}

/// One attempt: a request, or a short sequence (a chunked upload, a delete then a create).
struct Row {
    desc: String,
    steps: Vec<Step>,
}

impl Row {
    fn one(desc: impl Into<String>, method: &'static str, params: Value, blame: &str) -> Row {
        Row {
            desc: desc.into(),
            steps: vec![Step {
                method,
                params,
                blame: blame.to_owned(),
                want: Want::Protected,
            }],
        }
    }

    /// The row's single step must succeed instead (a control).
    fn control(mut self) -> Row {
        for step in &mut self.steps {
            step.want = Want::Ok;
        }
        self
    }
}

fn read(desc: &str, path: &str) -> Row {
    Row::one(
        format!("read {desc}"),
        "files/read",
        json!({"path": path}),
        path,
    )
}

fn watch(desc: &str, path: &str) -> Row {
    Row::one(
        format!("watch {desc}"),
        "files/watch",
        json!({"path": path}),
        path,
    )
}

fn write(desc: &str, path: &str, content: &str) -> Row {
    Row::one(
        format!("write {desc}"),
        "files/write",
        json!({"path": path, "content": content}),
        path,
    )
}

/// `files/write` with extra fields (`append`, `create: false`, `ifMatch`, `offset`...).
fn write_with(desc: &str, path: &str, content: &str, extra: Value) -> Row {
    let mut params = json!({"path": path, "content": content});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    Row::one(format!("write {desc}"), "files/write", params, path)
}

/// A chunked upload: `offset: 0, final: false`, then the final chunk; both refused.
fn upload(desc: &str, path: &str, first: &str, last: &str) -> Row {
    Row {
        desc: format!("chunked upload {desc}"),
        steps: vec![
            Step {
                method: "files/write",
                params: json!({"path": path, "content": first, "offset": 0, "final": false}),
                blame: path.to_owned(),
                want: Want::Protected,
            },
            Step {
                method: "files/write",
                params: json!({
                    "path": path, "content": last, "offset": first.len(), "final": true
                }),
                blame: path.to_owned(),
                want: Want::Protected,
            },
        ],
    }
}

fn create(desc: &str, path: &str, kind: &str) -> Row {
    Row::one(
        format!("create {kind} {desc}"),
        "files/create",
        json!({"path": path, "type": kind}),
        path,
    )
}

fn delete(desc: &str, path: &str, recursive: bool) -> Row {
    let what = if recursive {
        "delete recursive"
    } else {
        "delete"
    };
    Row::one(
        format!("{what} {desc}"),
        "files/delete",
        json!({"path": path, "recursive": recursive}),
        path,
    )
}

/// "Delete then create": refused at the delete, and the create is refused too.
fn delete_then_create(desc: &str, path: &str) -> Row {
    Row {
        desc: format!("delete then create {desc}"),
        steps: vec![
            Step {
                method: "files/delete",
                params: json!({"path": path}),
                blame: path.to_owned(),
                want: Want::Protected,
            },
            Step {
                method: "files/create",
                params: json!({"path": path, "type": "file"}),
                blame: path.to_owned(),
                want: Want::Protected,
            },
        ],
    }
}

/// Which path of a rename `data.path` must name.
#[derive(Clone, Copy)]
enum Side {
    Old,
    New,
}

fn rename(desc: &str, old: &str, new: &str, overwrite: bool, blame: Side) -> Row {
    let blamed = match blame {
        Side::Old => old,
        Side::New => new,
    };
    Row::one(
        format!("rename {desc} (overwrite: {overwrite})"),
        "files/rename",
        json!({"oldPath": old, "newPath": new, "overwrite": overwrite}),
        blamed,
    )
}

/// A path spelled three ways: by root name, absolute, and as a `file://` URI.
struct Forms {
    rel: String,
    abs: String,
    uri: String,
}

impl Forms {
    fn new(root_name: &str, root_dir: &Path, rel: &str) -> Forms {
        let path = root_dir.join(rel);
        Forms {
            rel: format!("{root_name}/{rel}"),
            abs: s(&path),
            uri: uri(&path),
        }
    }

    /// `(label, path)` for each form.
    fn each(&self) -> [(&'static str, &str); 3] {
        [
            ("NAME/rel", &self.rel),
            ("absolute", &self.abs),
            ("file:// URI", &self.uri),
        ]
    }
}

/// A world (rebuilt on demand), the broker serving it, and what must not change.
struct Lab {
    _t: tempfile::TempDir,
    base: PathBuf,
    populate: Box<dyn Fn(&Path)>,
    args: Vec<OsString>,
    /// `Some(socket)`: the broker is `serve --listen` and is reached over this socket.
    listen: Option<PathBuf>,
    server: Option<Server>,
    /// Must stay the same entry (same inode; for files the same bytes, mode and mtime).
    exact: Vec<PathBuf>,
    /// Audit logs: may only grow, in place (same inode, old bytes a prefix of the new).
    grows: Vec<PathBuf>,
    /// Texts that must never reach the wire.
    forbidden: Vec<String>,
}

/// The guarded state of a lab at one moment.
struct State {
    exact: Vec<String>,
    grows: Vec<(u64, Vec<u8>)>,
}

impl Lab {
    /// Builds the world in a fresh temp dir with `populate`, starts `fsbroker ARGS` (from
    /// `args(T)`), and waits until it answers.
    fn new(populate: impl Fn(&Path) + 'static, args: impl Fn(&Path) -> Vec<OsString>) -> Lab {
        Lab::build(populate, |base| (args(base), None))
    }

    /// The same for `fsbroker serve --listen T/REL_SOCKET ARGS...`, reached over the socket.
    fn listening(
        populate: impl Fn(&Path) + 'static,
        args: impl Fn(&Path) -> Vec<OsString>,
        rel_socket: &str,
    ) -> Lab {
        Lab::build(populate, |base| {
            let sock = base.join(rel_socket);
            let mut all: Vec<OsString> =
                vec!["serve".into(), "--listen".into(), sock.clone().into()];
            all.extend(args(base));
            (all, Some(sock))
        })
    }

    fn build(
        populate: impl Fn(&Path) + 'static,
        how: impl FnOnce(&Path) -> (Vec<OsString>, Option<PathBuf>),
    ) -> Lab {
        let (t, base) = tempdir();
        populate(&base);
        let (args, listen) = how(&base);
        let mut lab = Lab {
            _t: t,
            base,
            populate: Box::new(populate),
            args,
            listen,
            server: None,
            exact: Vec::new(),
            grows: Vec::new(),
            forbidden: vec![
                POLICY_MARKER.into(),
                OWN_MARKER.into(),
                OUTSIDE_MARKER.into(),
            ],
        };
        lab.start();
        lab
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.base.join(rel)
    }

    /// Guards `T/rel` exactly.
    fn guard(&mut self, rel: &str) -> &mut Lab {
        self.exact.push(self.base.join(rel));
        self
    }

    /// Guards `T/rel` as an audit log (grows in place only).
    fn guard_log(&mut self, rel: &str) -> &mut Lab {
        self.grows.push(self.base.join(rel));
        self
    }

    fn start(&mut self) {
        let server = match &self.listen {
            None => {
                let mut b = Fsb::start(&self.args, DEADLINE);
                let r = b.request("roots/list", json!({}));
                assert!(r.get("error").is_none(), "roots/list failed: {r}");
                Server::Stdio(b)
            }
            Some(sock) => {
                let (listener, mut conn) = start_listener(&self.args, sock);
                let r = conn.request("roots/list", json!({}));
                assert!(r.get("error").is_none(), "roots/list failed: {r}");
                Server::Socket { listener, conn }
            }
        };
        self.server = Some(server);
    }

    fn stop(&mut self) {
        match self.server.take() {
            Some(Server::Stdio(b)) => drop(b),
            Some(Server::Socket { listener, conn }) => {
                drop(conn);
                drop(listener);
            }
            None => {}
        }
    }

    /// Rebuilds the world from scratch (same paths) and restarts the broker: after a row
    /// that got through, so the next row meets the tree it was written for.
    fn reset(&mut self) {
        self.stop();
        for entry in std::fs::read_dir(&self.base).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        (self.populate)(&self.base);
        self.start();
    }

    /// The stdio broker (panics for a listening lab).
    fn live(&mut self) -> &mut Fsb {
        match self.server.as_mut() {
            Some(Server::Stdio(b)) => b,
            _ => panic!("not a stdio broker"),
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        match self.server.as_mut().expect("broker running") {
            Server::Stdio(b) => b.request(method, params),
            Server::Socket { conn, .. } => conn.request(method, params),
        }
    }

    fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.request(method, params.clone());
        assert!(r.get("error").is_none(), "{method} {params} failed: {r}");
        r["result"].clone()
    }

    fn state(&self) -> State {
        State {
            exact: self.exact.iter().map(|p| describe(p)).collect(),
            grows: self
                .grows
                .iter()
                .map(|p| match std::fs::metadata(p) {
                    Ok(m) => (m.ino(), std::fs::read(p).unwrap()),
                    Err(_) => (0, Vec::new()),
                })
                .collect(),
        }
    }

    /// What changed since `before` that must not have.
    fn changes(&self, before: &State) -> Vec<String> {
        let mut out = Vec::new();
        let now = self.state();
        for ((path, b), a) in self.exact.iter().zip(&before.exact).zip(&now.exact) {
            if b != a {
                out.push(format!("{} changed: {b} -> {a}", path.display()));
            }
        }
        for ((path, (ino_b, bytes_b)), (ino_a, bytes_a)) in
            self.grows.iter().zip(&before.grows).zip(&now.grows)
        {
            if ino_b != ino_a {
                out.push(format!(
                    "{} is another file now (inode {ino_b} -> {ino_a})",
                    path.display()
                ));
            } else if !bytes_a.starts_with(bytes_b) {
                out.push(format!(
                    "{} was rewritten, not appended to ({} -> {} bytes)",
                    path.display(),
                    bytes_b.len(),
                    bytes_a.len()
                ));
            }
        }
        let staging = staging_files(&self.base);
        if !staging.is_empty() {
            out.push(format!("staging files left: {staging:?}"));
        }
        out
    }

    /// Runs one row; returns what went wrong.
    fn attempt(&mut self, row: &Row) -> Vec<String> {
        let mut problems = Vec::new();
        for step in &row.steps {
            let before = self.state();
            let resp = self.request(step.method, step.params.clone());
            let wire = resp.to_string();
            let ctx = format!("{} {}", step.method, shown(&step.params));
            for secret in &self.forbidden {
                if wire.contains(secret.as_str()) {
                    problems.push(format!("{ctx}: {secret} on the wire"));
                }
            }
            match step.want {
                Want::Protected => {
                    if let Err(e) = protected_refusal(&resp, &step.blame) {
                        problems.push(format!("{ctx}: {e}"));
                    }
                }
                Want::Ok => {
                    if resp.get("error").is_some() {
                        problems.push(format!("{ctx}: should succeed: {}", shown(&resp)));
                    }
                }
            }
            for change in self.changes(&before) {
                problems.push(format!("{ctx}: {change}"));
            }
        }
        problems
    }

    /// Runs every row (a row that fails is reported, then the world is rebuilt), and panics
    /// listing the rows that failed.
    fn run(&mut self, label: &str, rows: &[Row]) {
        let mut failed = Vec::new();
        for row in rows {
            let problems = self.attempt(row);
            if !problems.is_empty() {
                failed.push(format!("[{}]\n    {}", row.desc, problems.join("\n    ")));
                self.reset();
            }
        }
        let hostile = rows
            .iter()
            .filter(|r| r.steps.iter().any(|s| matches!(s.want, Want::Protected)))
            .count();
        println!("{label}: {hostile} hostile rows, {} in all", rows.len());
        assert!(
            failed.is_empty(),
            "{label}: {} of {} rows failed:\n{}",
            failed.len(),
            rows.len(),
            failed.join("\n")
        );
    }

    /// The `path`s of a recursive listing of `path`, hidden names included.
    fn listed(&mut self, path: &str) -> Vec<String> {
        let r = self.ok(
            "files/list",
            json!({"path": path, "recursive": true, "includeHidden": true}),
        );
        assert!(r.get("nextCursor").is_none(), "one page expected: {r}");
        r["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_owned())
            .collect()
    }

    /// For [`NO_RELOAD_FOR`]: `roots/list` stays `roots` and the outside file stays out of
    /// reach (absolutely, and through a root named `everything`); no
    /// `notifications/roots/list_changed` arrives. Returns what was seen instead.
    fn no_reload(&mut self, roots: &Value) -> Vec<String> {
        let outside = self.p("outside/secret.txt");
        let through_everything = format!("everything{}", s(&outside));
        let mut seen = Vec::new();
        let start = Instant::now();
        while start.elapsed() < NO_RELOAD_FOR {
            let at = start.elapsed();
            let now = self.ok("roots/list", json!({}));
            if &now != roots {
                seen.push(format!("after {at:?}: roots/list is {}", shown(&now)));
            }
            for path in [s(&outside), through_everything.clone()] {
                let r = self.request("files/read", json!({"path": path}));
                if r.get("error").is_none() {
                    seen.push(format!(
                        "after {at:?}: the outside file was read as {path}: {}",
                        shown(&r)
                    ));
                }
            }
            if !seen.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(Server::Stdio(b)) = self.server.as_mut() {
            while let Some((_, n)) = b.next_notification(Duration::ZERO) {
                if n["method"] == "notifications/roots/list_changed" {
                    seen.push(format!("the broker sent {n}"));
                }
            }
        }
        seen
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `fsbroker ARGS` with stdin closed; returns (success, stdout + stderr).
fn run_cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run fsbroker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The log's chain is intact (exit 0), or intact with a run still unsealed (exit 3: the
/// broker under test may still be running).
fn verify_audit(log: &Path) {
    let out = Command::new(bin())
        .args(["audit", "verify", log.to_str().unwrap()])
        .output()
        .expect("run fsbroker");
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "audit verify {}: {code:?} {}",
        log.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------------------------
// The headline attacks
// ---------------------------------------------------------------------------------------------

/// `files/write` of the policy file, through the root the policy itself grants (`path = "."`),
/// with a policy adding `[[root]] path = "/"`: refused; the policy is byte-identical; for a
/// second afterwards `roots/list` is unchanged, a file outside every root stays unreadable and
/// no `roots/list_changed` arrives (no reload).
#[test]
fn headline_writing_the_policy_to_grant_everything_is_refused_and_nothing_reloads() {
    let original = policy_text(&[(".", "project")], "");
    let text = original.clone();
    let mut lab = Lab::new(
        move |base| {
            project(base);
            put(&base.join("proj/fsbroker.toml"), &text);
        },
        serve_usual,
    );
    lab.guard("proj/fsbroker.toml");
    let roots = lab.ok("roots/list", json!({}));
    let outside = s(&lab.p("outside/secret.txt"));
    let before = lab.request("files/read", json!({"path": outside}));
    assert!(before.get("error").is_some(), "{before}");

    let state = lab.state();
    let resp = lab.request(
        "files/write",
        json!({"path": "project/fsbroker.toml", "content": granting_everything(&original)}),
    );
    let mut problems = Vec::new();
    if let Err(e) = protected_refusal(&resp, "project/fsbroker.toml") {
        problems.push(format!("the write of the policy: {e}"));
    }
    problems.extend(lab.changes(&state));
    problems.extend(lab.no_reload(&roots));
    assert!(
        problems.is_empty(),
        "a server rewrote its own policy:\n  {}",
        problems.join("\n  ")
    );
    assert_eq!(
        std::fs::read_to_string(lab.p("proj/fsbroker.toml")).unwrap(),
        original
    );
}

/// `files/read` of the audit log inside the writable root, and `files/write` of a doctored
/// copy back over it: both refused; the log only grew and its hash chain verifies.
#[test]
fn headline_the_audit_log_in_a_writable_root_can_be_neither_read_nor_rewritten() {
    let mut lab = Lab::new(usual, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl");
    let log = lab.p("proj/audit.jsonl");
    lab.ok("files/read", json!({"path": "project/a.txt"}));
    let doctored = String::from_utf8(std::fs::read(&log).unwrap())
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned()
        + "\n";
    lab.run(
        "audit log in the root",
        &[
            read("the audit log", "project/audit.jsonl"),
            write(
                "the audit log back, doctored",
                "project/audit.jsonl",
                &doctored,
            ),
        ],
    );
    lab.stop();
    verify_audit(&log);
}

// ---------------------------------------------------------------------------------------------
// The policy file
// ---------------------------------------------------------------------------------------------

/// `files/write` of the policy: plain, `append`, `create: false`, `ifMatch` with its real
/// etag, in every path form (plus a lexical climb and a percent-encoded URI).
#[test]
fn writes_to_the_policy_are_refused_in_every_form() {
    let mut lab = Lab::new(usual, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl");
    let policy = lab.p("proj/fsbroker.toml");
    let evil = granting_everything(&std::fs::read_to_string(&policy).unwrap());
    let f = Forms::new("project", &lab.p("proj"), "fsbroker.toml");
    // First, while the file is the one the etag was taken from.
    let mut rows = vec![write_with(
        "with ifMatch = its etag",
        &f.rel,
        &evil,
        json!({"ifMatch": etag_of(&policy)}),
    )];
    for (form, path) in f.each() {
        rows.push(write(&format!("[{form}]"), path, &evil));
        rows.push(write_with(
            &format!("append [{form}]"),
            path,
            &granting_everything(""),
            json!({"append": true}),
        ));
        rows.push(write_with(
            &format!("create: false [{form}]"),
            path,
            &evil,
            json!({"create": false}),
        ));
    }
    rows.push(write(
        "through a lexical climb",
        "project/sub/../fsbroker.toml",
        &evil,
    ));
    let encoded = format!("{}/fsbroker%2Etoml", uri(&lab.p("proj")));
    rows.push(write("by a URI with %2E", &encoded, &evil));
    rows.push(write_with(
        "as base64",
        &f.rel,
        "W1tyb290XV0KcGF0aCA9ICcvJwo=",
        json!({"encoding": "base64"}),
    ));
    lab.run("writes to the policy", &rows);
}

/// Chunked uploads (`offset: 0, final: false`, then `final: true`) onto the policy, the audit
/// log and a not-yet-existing rotated sibling: both chunks refused, no staging file at any
/// moment, nothing committed.
#[test]
fn chunked_uploads_onto_the_policy_and_the_audit_log_are_refused_at_every_chunk() {
    let mut lab = Lab::new(usual, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl")
        .guard("proj/audit.jsonl.1");
    let evil = granting_everything(&std::fs::read_to_string(lab.p("proj/fsbroker.toml")).unwrap());
    let (first, last) = evil.split_at(evil.len() / 2);
    let mut rows = Vec::new();
    for (what, rel) in [
        ("onto the policy", "fsbroker.toml"),
        ("onto the audit log", "audit.jsonl"),
        ("onto a new rotated sibling", "audit.jsonl.1"),
    ] {
        let f = Forms::new("project", &lab.p("proj"), rel);
        for (form, path) in f.each() {
            rows.push(upload(&format!("{what} [{form}]"), path, first, last));
        }
        rows.push(write_with(
            &format!("{what}, one final chunk"),
            &f.rel,
            &evil,
            json!({"offset": 0}),
        ));
    }
    lab.run("chunked uploads", &rows);
}

/// `files/create` (file or directory, though it exists), `files/delete` (plain, recursive),
/// "delete then create", and `files/rename` of the policy away, in every path form.
#[test]
fn create_delete_and_rename_of_the_policy_are_refused() {
    let mut lab = Lab::new(usual, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl")
        .guard("proj/moved.toml");
    let f = Forms::new("project", &lab.p("proj"), "fsbroker.toml");
    let moved = Forms::new("project", &lab.p("proj"), "moved.toml");
    let mut rows = Vec::new();
    for (form, path) in f.each() {
        rows.push(create(&format!("[{form}]"), path, "file"));
        rows.push(create(&format!("[{form}]"), path, "directory"));
        rows.push(delete(&format!("[{form}]"), path, false));
        rows.push(delete(&format!("[{form}]"), path, true));
        rows.push(delete_then_create(&format!("[{form}]"), path));
    }
    for ((form, old), (_, new)) in f.each().into_iter().zip(moved.each()) {
        rows.push(rename(
            &format!("the policy away [{form}]"),
            old,
            new,
            false,
            Side::Old,
        ));
    }
    rows.push(rename(
        "the policy over an ordinary file",
        &f.rel,
        "project/a.txt",
        true,
        Side::Old,
    ));
    rows.push(rename(
        "the policy into a subdirectory",
        &f.rel,
        "project/sub/fsbroker.toml",
        false,
        Side::Old,
    ));
    lab.guard("proj/a.txt");
    lab.run("create, delete, rename of the policy", &rows);
}

/// `files/rename` of a prepared file (a valid policy granting `/`) onto the policy, with and
/// without `overwrite`, in every path form: refused (blaming `newPath`), both files as they
/// were, and no reload.
#[test]
fn renaming_another_file_onto_the_policy_is_refused() {
    let populate = |base: &Path| {
        usual(base);
        let text = std::fs::read_to_string(base.join("proj/fsbroker.toml")).unwrap();
        put(&base.join("proj/evil.toml"), &granting_everything(&text));
    };
    let mut lab = Lab::new(populate, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard("proj/evil.toml")
        .guard_log("proj/audit.jsonl");
    let roots = lab.ok("roots/list", json!({}));
    let f = Forms::new("project", &lab.p("proj"), "fsbroker.toml");
    let src = Forms::new("project", &lab.p("proj"), "evil.toml");
    let mut rows = Vec::new();
    for ((form, new), (_, old)) in f.each().into_iter().zip(src.each()) {
        for overwrite in [true, false] {
            rows.push(rename(
                &format!("a prepared policy onto the policy [{form}]"),
                old,
                new,
                overwrite,
                Side::New,
            ));
        }
    }
    lab.run("renames onto the policy", &rows);
    let seen = lab.no_reload(&roots);
    assert!(
        seen.is_empty(),
        "the broker reloaded:\n  {}",
        seen.join("\n  ")
    );
}

/// `files/read` and `files/watch` of the policy in every path form (and through a lexical
/// climb): refused, no policy byte on the wire.
#[test]
fn reading_and_watching_the_policy_are_refused() {
    let mut lab = Lab::new(usual, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl");
    let f = Forms::new("project", &lab.p("proj"), "fsbroker.toml");
    let mut rows = Vec::new();
    for (form, path) in f.each() {
        rows.push(read(&format!("the policy [{form}]"), path));
        rows.push(watch(&format!("the policy [{form}]"), path));
    }
    rows.push(read(
        "the policy through a climb",
        "project/sub/../fsbroker.toml",
    ));
    rows.push(Row::one(
        "read the policy from an offset",
        "files/read",
        json!({"path": f.rel, "offset": 2, "length": 40}),
        &f.rel,
    ));
    rows.push(read("an ordinary file", "project/a.txt").control());
    lab.run("reading the policy", &rows);
}

// ---------------------------------------------------------------------------------------------
// The audit log
// ---------------------------------------------------------------------------------------------

/// The audit log (`[audit] path`), a rotated sibling that does not exist yet
/// (`audit.jsonl.1`) and one that does (`audit.jsonl-2026.gz`): every read, watch and
/// mutation refused in every path form; the log only grew and its chain verifies; the
/// sibling stays absent; names that merely resemble the log stay writable.
#[test]
fn the_audit_log_and_its_rotated_siblings_are_protected() {
    let populate = |base: &Path| {
        usual(base);
        put(
            &base.join("proj/audit.jsonl-2026.gz"),
            &format!("{OWN_MARKER} rotated\n"),
        );
    };
    let mut lab = Lab::new(populate, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl")
        .guard("proj/audit.jsonl.1")
        .guard("proj/audit.jsonl-2026.gz");
    let root = lab.p("proj");
    let log = Forms::new("project", &root, "audit.jsonl");
    let next = Forms::new("project", &root, "audit.jsonl.1");
    let old = Forms::new("project", &root, "audit.jsonl-2026.gz");
    let mut rows = Vec::new();
    for (form, path) in log.each() {
        let d = format!("the audit log [{form}]");
        rows.push(read(&d, path));
        rows.push(watch(&d, path));
        rows.push(write(&d, path, FORGED_AUDIT));
        rows.push(write_with(
            &format!("append to {d}"),
            path,
            FORGED_AUDIT,
            json!({"append": true}),
        ));
        rows.push(write_with(
            &format!("create: false {d}"),
            path,
            FORGED_AUDIT,
            json!({"create": false}),
        ));
        rows.push(create(&d, path, "file"));
        rows.push(create(&d, path, "directory"));
        rows.push(delete(&d, path, false));
        rows.push(delete(&d, path, true));
        rows.push(delete_then_create(&d, path));
    }
    rows.push(rename(
        "the audit log away",
        &log.rel,
        "project/sub/audit.jsonl",
        false,
        Side::Old,
    ));
    rows.push(rename(
        "an ordinary file onto the audit log",
        "project/a.txt",
        &log.rel,
        true,
        Side::New,
    ));
    for (form, path) in next.each() {
        let d = format!("the new sibling audit.jsonl.1 [{form}]");
        rows.push(write(&d, path, FORGED_AUDIT));
        rows.push(write_with(
            &format!("append to {d}"),
            path,
            FORGED_AUDIT,
            json!({"append": true}),
        ));
        rows.push(write_with(
            &format!("one-chunk upload to {d}"),
            path,
            FORGED_AUDIT,
            json!({"offset": 0}),
        ));
        rows.push(create(&d, path, "file"));
        rows.push(create(&d, path, "directory"));
        rows.push(rename(
            &format!("an ordinary file onto {d}"),
            "project/a.txt",
            path,
            false,
            Side::New,
        ));
    }
    rows.push(create(
        "under the new sibling's name",
        "project/audit.jsonl.1/x",
        "file",
    ));
    for (form, path) in old.each() {
        let d = format!("the old sibling audit.jsonl-2026.gz [{form}]");
        rows.push(read(&d, path));
        rows.push(watch(&d, path));
        rows.push(write(&d, path, PAYLOAD));
        rows.push(delete(&d, path, false));
        rows.push(rename(
            &format!("{d} away"),
            path,
            "project/sub/old.gz",
            false,
            Side::Old,
        ));
    }
    // Controls: not in the log's folder, or not starting with the log's name.
    rows.push(write("a resembling name", "project/audit.json", PAYLOAD).control());
    rows.push(
        write(
            "the log's name in another folder",
            "project/sub/audit.jsonl",
            PAYLOAD,
        )
        .control(),
    );
    rows.push(read("an ordinary file", "project/a.txt").control());
    lab.run("audit log and siblings", &rows);
    let log_path = lab.p("proj/audit.jsonl");
    lab.stop();
    verify_audit(&log_path);
}

/// An audit log named by `--audit` (not by the policy), in a folder of the root: reads,
/// writes, deletes, renames refused; the folder holding it can be neither renamed nor
/// recursively deleted; a new rotated sibling cannot be made.
#[test]
fn an_audit_log_named_by_the_command_line_is_protected() {
    let populate = |base: &Path| {
        project(base);
        std::fs::create_dir_all(base.join("proj/logs")).unwrap();
        put(
            &base.join("etc/policy.toml"),
            &policy_text(&[("../proj", "project")], ""),
        );
    };
    let mut lab = Lab::new(populate, |base| {
        vec![
            "serve".into(),
            "--policy".into(),
            base.join("etc/policy.toml").into(),
            "--audit".into(),
            base.join("proj/logs/run.jsonl").into(),
        ]
    });
    lab.guard_log("proj/logs/run.jsonl")
        .guard("proj/logs/run.jsonl.1")
        .guard("proj/logs");
    let f = Forms::new("project", &lab.p("proj"), "logs/run.jsonl");
    let mut rows = Vec::new();
    for (form, path) in f.each() {
        let d = format!("the --audit log [{form}]");
        rows.push(read(&d, path));
        rows.push(write(&d, path, FORGED_AUDIT));
        rows.push(delete(&d, path, false));
    }
    rows.extend([
        write_with(
            "append to the --audit log",
            &f.rel,
            FORGED_AUDIT,
            json!({"append": true}),
        ),
        rename(
            "the --audit log away",
            &f.rel,
            "project/run.jsonl",
            false,
            Side::Old,
        ),
        rename(
            "an ordinary file onto the --audit log",
            "project/a.txt",
            &f.rel,
            true,
            Side::New,
        ),
        write("a new sibling", "project/logs/run.jsonl.1", FORGED_AUDIT),
        create("a new sibling", "project/logs/run.jsonl.1", "file"),
        rename(
            "the folder holding it",
            "project/logs",
            "project/old-logs",
            false,
            Side::Old,
        ),
        delete("the folder holding it", "project/logs", true),
        write(
            "an ordinary file beside it",
            "project/logs/notes.txt",
            PAYLOAD,
        )
        .control(),
    ]);
    lab.run("--audit log", &rows);
    let log = lab.p("proj/logs/run.jsonl");
    lab.stop();
    verify_audit(&log);
}

// ---------------------------------------------------------------------------------------------
// The consent command and the socket
// ---------------------------------------------------------------------------------------------

/// The files the `[consent] command` argv names (its program, a shell script, and a python
/// script argument) inside the root: reads, watches and every mutation refused; the folders
/// holding them can be neither renamed nor recursively deleted, and are sealed: nothing may
/// be written beside them (a python script imports what lies beside it). Arguments that name
/// no file change nothing; a folder elsewhere in the root stays writable.
#[test]
fn the_consent_command_files_are_protected() {
    let populate = |base: &Path| {
        project(base);
        let proj = base.join("proj");
        let sh = proj.join("ro/bin/consent.sh");
        put(
            &sh,
            &format!("#!/bin/sh\n# {OWN_MARKER}\nexec python3 \"$@\"\n"),
        );
        std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
        let py = proj.join("ro/tools/consent.py");
        put(
            &py,
            &format!(
                "# {OWN_MARKER}\nimport json, sys\n\
                 paths = json.load(sys.stdin)[\"requestedPaths\"]\n\
                 print(json.dumps({{\"approvedPaths\": paths}}))\n"
            ),
        );
        put(
            &proj.join("fsbroker.toml"),
            &policy_text(
                &[(".", "project")],
                &format!(
                    // The command's files lie in a read-only root: in a read-write one the
                    // policy is refused at load (a server could change what it runs).
                    "{}\n[consent]\ncommand = [{}, {}, \"--approve\", \"all\"]\n",
                    RootToml::raw("'ro'").name("ro").mode("read-only").text(),
                    lit(&sh),
                    lit(&py)
                ),
            ),
        );
    };
    let mut lab = Lab::new(populate, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard("proj/ro/bin/consent.sh")
        .guard("proj/ro/tools/consent.py")
        .guard("proj/ro/bin");
    let root = lab.p("proj");
    let mut rows = Vec::new();
    for (what, rel) in [
        ("the consent program", "ro/bin/consent.sh"),
        ("the consent script argument", "ro/tools/consent.py"),
    ] {
        let f = Forms::new("project", &root, rel);
        for (form, path) in f.each() {
            let d = format!("{what} [{form}]");
            rows.push(read(&d, path));
            rows.push(write(
                &d,
                path,
                "#!/bin/sh\necho '{\"approvedPaths\": [\"/\"]}'\n",
            ));
            rows.push(delete(&d, path, false));
        }
        rows.extend([
            watch(what, &f.rel),
            write_with(
                &format!("append to {what}"),
                &f.rel,
                PAYLOAD,
                json!({"append": true}),
            ),
            write_with(
                &format!("create: false {what}"),
                &f.rel,
                PAYLOAD,
                json!({"create": false}),
            ),
            upload(what, &f.rel, "print(1)\n", "print(2)\n"),
            create(what, &f.rel, "file"),
            rename(
                &format!("{what} away"),
                &f.rel,
                "project/moved",
                false,
                Side::Old,
            ),
            rename(
                &format!("an ordinary file onto {what}"),
                "project/a.txt",
                &f.rel,
                true,
                Side::New,
            ),
        ]);
    }
    rows.extend([
        rename(
            "the folder holding the program",
            "project/ro/bin",
            "project/ro/bin2",
            false,
            Side::Old,
        ),
        delete("the folder holding the program", "project/ro/bin", true),
        write(
            "an ordinary file beside the program",
            "project/ro/bin/other.sh",
            PAYLOAD,
        ),
        write(
            "a module beside the script, which it would import",
            "project/ro/tools/json.py",
            "print('PWNED')\n",
        ),
        create(
            "a package beside the script",
            "project/ro/tools/json",
            "directory",
        ),
        write(
            "an ordinary file in another folder",
            "project/sub/other.sh",
            PAYLOAD,
        )
        .control(),
    ]);
    lab.run("consent command files", &rows);
}

/// The `serve --listen` socket, inside the root, reached over that very socket: reads,
/// watches and every mutation (replacing it by a file, deleting it, renaming it away or
/// renaming a file onto it) refused in every path form; it stays the same socket and still
/// accepts connections; listings leave it out.
#[test]
fn the_listen_socket_is_protected() {
    let populate = |base: &Path| {
        project(base);
        put(
            &base.join("etc/policy.toml"),
            &policy_text(&[("../proj", "project")], ""),
        );
    };
    let mut lab = Lab::listening(
        populate,
        |base| vec!["--policy".into(), base.join("etc/policy.toml").into()],
        "proj/fsbroker.sock",
    );
    lab.guard("proj/fsbroker.sock");
    let f = Forms::new("project", &lab.p("proj"), "fsbroker.sock");
    let mut rows = Vec::new();
    for (form, path) in f.each() {
        let d = format!("the socket [{form}]");
        rows.push(read(&d, path));
        rows.push(write(&d, path, PAYLOAD));
        rows.push(delete(&d, path, false));
        rows.push(rename(
            &format!("{d} away"),
            path,
            "project/moved.sock",
            false,
            Side::Old,
        ));
    }
    rows.extend([
        watch("the socket", &f.rel),
        write_with(
            "append to the socket",
            &f.rel,
            PAYLOAD,
            json!({"append": true}),
        ),
        write_with(
            "create: false the socket",
            &f.rel,
            PAYLOAD,
            json!({"create": false}),
        ),
        upload("onto the socket", &f.rel, "one ", "two\n"),
        create("the socket", &f.rel, "file"),
        create("the socket", &f.rel, "directory"),
        delete("the socket", &f.rel, true),
        rename(
            "an ordinary file onto the socket",
            "project/a.txt",
            &f.rel,
            true,
            Side::New,
        ),
        rename(
            "an ordinary file onto the socket",
            "project/a.txt",
            &f.rel,
            false,
            Side::New,
        ),
    ]);
    lab.run("listen socket", &rows);
    let listed = lab.listed("project");
    assert!(
        listed.contains(&"project/a.txt".to_owned()) && !listed.contains(&f.rel),
        "the socket must be left out of listings: {listed:?}"
    );
    let mut fresh = Fsb::connect(&lab.p("proj/fsbroker.sock"));
    fresh.set_deadline(DEADLINE);
    let r = fresh.request("roots/list", json!({}));
    assert!(r.get("error").is_none(), "{r}");
}

// ---------------------------------------------------------------------------------------------
// Where the policy lives, and other ways to reach it
// ---------------------------------------------------------------------------------------------

/// A policy in a subfolder (`T/proj/etc/fsb/fsbroker.toml`, root `path = "../.."`): its
/// folder and that folder's parent can be neither renamed (away, or into another folder) nor
/// recursively deleted; the folder itself can be neither deleted nor created nor renamed onto;
/// "delete then create" of the policy fails at the delete; a file beside the policy is still
/// writable.
#[test]
fn a_policy_in_a_subfolder_protects_its_folder_and_every_ancestor() {
    let populate = |base: &Path| {
        project(base);
        std::fs::create_dir_all(base.join("proj/emptydir")).unwrap();
        put(
            &base.join("proj/etc/fsb/fsbroker.toml"),
            &policy_text(&[("../..", "project")], ""),
        );
    };
    let mut lab = Lab::new(populate, |base| {
        vec![
            "serve".into(),
            "--policy".into(),
            base.join("proj/etc/fsb/fsbroker.toml").into(),
        ]
    });
    lab.guard("proj/etc/fsb/fsbroker.toml")
        .guard("proj/etc/fsb")
        .guard("proj/etc");
    let root = lab.p("proj");
    let mut rows = Vec::new();
    for (what, rel) in [("the policy's folder", "etc/fsb"), ("its parent", "etc")] {
        let f = Forms::new("project", &root, rel);
        for (form, path) in f.each() {
            let d = format!("{what} [{form}]");
            rows.push(rename(
                &format!("{d} away"),
                path,
                &format!("{path}-moved"),
                false,
                Side::Old,
            ));
            rows.push(delete(&d, path, true));
        }
        rows.push(rename(
            &format!("{what} into another folder"),
            &f.rel,
            "project/sub/moved",
            false,
            Side::Old,
        ));
    }
    // The policy's folder is itself a protected path: no plain delete, no create (though it
    // exists), nothing renamed onto it. (Its parent only holds one: renaming and recursively
    // deleting it are what must fail, above.)
    let folder = "project/etc/fsb";
    rows.extend([
        delete("the policy's folder, not recursive", folder, false),
        create("the policy's folder (exists)", folder, "directory"),
        create("the policy's folder", folder, "file"),
        rename(
            "an empty folder onto the policy's folder",
            "project/emptydir",
            folder,
            true,
            Side::New,
        ),
    ]);
    let policy = Forms::new("project", &root, "etc/fsb/fsbroker.toml");
    for (form, path) in policy.each() {
        rows.push(delete_then_create(&format!("the policy [{form}]"), path));
        rows.push(write(
            &format!("the policy [{form}]"),
            path,
            &granting_everything(""),
        ));
    }
    rows.push(
        write(
            "an ordinary file beside the policy",
            "project/etc/fsb/notes.txt",
            PAYLOAD,
        )
        .control(),
    );
    lab.run("policy in a subfolder", &rows);
}

/// Links a user planted inside the root: a relative symlink to the policy (by name and by
/// absolute path), a symlinked folder leading to the policy's folder, a hard link to the
/// policy, and a symlink to the audit log. (An absolute symlink is refused today already, as
/// leading outside the root, so it is not a row here.) Reads and writes (plain, `append`,
/// chunk 0) through each are refused, blaming the path as sent; the policy, the hard link and
/// the symlink stay as they were.
#[test]
fn links_to_the_policy_planted_inside_the_root_are_refused() {
    let populate = |base: &Path| {
        usual(base);
        let proj = base.join("proj");
        symlink("fsbroker.toml", proj.join("link.toml")).unwrap();
        symlink("..", proj.join("sub/up")).unwrap();
        symlink("audit.jsonl", proj.join("alog")).unwrap();
        std::fs::hard_link(proj.join("fsbroker.toml"), proj.join("hard.toml")).unwrap();
    };
    let mut lab = Lab::new(populate, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard("proj/hard.toml")
        .guard("proj/link.toml")
        .guard_log("proj/audit.jsonl");
    let evil = granting_everything(&std::fs::read_to_string(lab.p("proj/fsbroker.toml")).unwrap());
    let abs_link = s(&lab.p("proj/link.toml"));
    let mut rows = Vec::new();
    for (what, path) in [
        ("a relative symlink to the policy", "project/link.toml"),
        ("a symlinked folder", "project/sub/up/fsbroker.toml"),
        ("a hard link to the policy", "project/hard.toml"),
        ("the relative symlink, absolute", abs_link.as_str()),
    ] {
        rows.extend([
            read(what, path),
            write(what, path, &evil),
            write_with(
                &format!("append through {what}"),
                path,
                &granting_everything(""),
                json!({"append": true}),
            ),
            write_with(
                &format!("chunk 0 through {what}"),
                path,
                &evil,
                json!({"offset": 0, "final": false}),
            ),
        ]);
    }
    rows.push(read("a symlink to the audit log", "project/alog"));
    rows.push(write(
        "a symlink to the audit log",
        "project/alog",
        FORGED_AUDIT,
    ));
    lab.run("links to the policy", &rows);
}

/// A second root on the project's parent (`path = ".."`, read-write) also reaches the policy
/// and the audit log: refused the same way through it (reads, writes, upload, create, delete,
/// renames both ways), and its listings leave them out.
#[test]
fn an_overlapping_root_on_the_parent_is_refused_the_same_way() {
    let populate = |base: &Path| {
        project(base);
        put(
            &base.join("proj/fsbroker.toml"),
            &policy_text(
                &[(".", "project"), ("..", "parent")],
                "[audit]\npath = \"audit.jsonl\"\n",
            ),
        );
    };
    let mut lab = Lab::new(populate, serve_usual);
    lab.guard("proj/fsbroker.toml")
        .guard_log("proj/audit.jsonl");
    let evil = granting_everything(&std::fs::read_to_string(lab.p("proj/fsbroker.toml")).unwrap());
    let mut rows = Vec::new();
    for (what, path) in [
        (
            "the policy through the parent root",
            "parent/proj/fsbroker.toml",
        ),
        (
            "the audit log through the parent root",
            "parent/proj/audit.jsonl",
        ),
    ] {
        rows.extend([
            read(what, path),
            watch(what, path),
            write(what, path, &evil),
            write_with(
                &format!("append to {what}"),
                path,
                "x",
                json!({"append": true}),
            ),
            upload(what, path, "[[root]]\n", "path = '/'\n"),
            create(what, path, "file"),
            delete(what, path, false),
            rename(
                &format!("{what} away"),
                path,
                "parent/stolen",
                false,
                Side::Old,
            ),
            rename(
                &format!("{what} into the other root"),
                path,
                "project/sub/stolen",
                false,
                Side::Old,
            ),
            rename(
                &format!("an outside-the-project file onto {what}"),
                "parent/outside/secret.txt",
                path,
                true,
                Side::New,
            ),
        ]);
    }
    rows.push(read("a file of the parent root", "parent/proj/a.txt").control());
    lab.run("overlapping root", &rows);
    let listed = lab.listed("parent");
    for hidden in ["parent/proj/fsbroker.toml", "parent/proj/audit.jsonl"] {
        assert!(
            !listed.iter().any(|p| p == hidden),
            "{hidden} listed: {listed:?}"
        );
    }
    assert!(
        listed.iter().any(|p| p == "parent/proj/a.txt"),
        "{listed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Listings and watches
// ---------------------------------------------------------------------------------------------

/// `files/list` of the root (flat and recursive, hidden names included, by name, absolute and
/// by URI) and of the folder holding the consent program leaves out the policy, the audit log,
/// its rotated siblings and the consent command's files, and still shows everything else.
#[test]
fn listings_never_show_protected_paths() {
    let populate = |base: &Path| {
        usual(base);
        let proj = base.join("proj");
        put(
            &proj.join("audit.jsonl.1"),
            &format!("{OWN_MARKER} rotated\n"),
        );
        put(
            &proj.join("bin/consent.sh"),
            &format!("#!/bin/sh\n# {OWN_MARKER}\n"),
        );
        put(&proj.join("bin/other.sh"), "#!/bin/sh\n");
        let text = std::fs::read_to_string(proj.join("fsbroker.toml")).unwrap();
        put(
            &proj.join("fsbroker.toml"),
            &format!(
                "{text}\n{}\n[consent]\ncommand = [{}]\n",
                RootToml::raw("'bin'").name("bin").mode("read-only").text(),
                lit(&proj.join("bin/consent.sh"))
            ),
        );
    };
    let mut lab = Lab::new(populate, serve_usual);
    let hidden = [
        "project/fsbroker.toml",
        "project/audit.jsonl",
        "project/audit.jsonl.1",
        "project/bin/consent.sh",
    ];
    let shown_paths = ["project/a.txt", "project/sub/b.txt", "project/bin/other.sh"];
    let root = lab.p("proj");
    let mut problems = Vec::new();
    for (form, path) in [
        ("NAME", "project".to_owned()),
        ("absolute", s(&root)),
        ("file:// URI", uri(&root)),
    ] {
        for recursive in [false, true] {
            let r = lab.ok(
                "files/list",
                json!({"path": path, "recursive": recursive, "includeHidden": true}),
            );
            let listed: Vec<&str> = r["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["path"].as_str().unwrap())
                .collect();
            for h in hidden {
                if listed.contains(&h) {
                    problems.push(format!("{form} (recursive: {recursive}) lists {h}"));
                }
            }
            if !listed.contains(&"project/a.txt") {
                problems.push(format!(
                    "{form} (recursive: {recursive}) lost a.txt: {listed:?}"
                ));
            }
            if recursive {
                for p in shown_paths {
                    if !listed.contains(&p) {
                        problems.push(format!("{form} (recursive) lost {p}: {listed:?}"));
                    }
                }
            }
        }
    }
    let r = lab.ok("files/list", json!({"path": "project/bin"}));
    let listed: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    if listed != ["project/bin/other.sh"] {
        problems.push(format!("project/bin lists {listed:?}"));
    }
    assert!(
        problems.is_empty(),
        "protected paths in listings:\n  {}",
        problems.join("\n  ")
    );
}

/// A recursive `files/watch` on the root that holds the policy and the audit log: while
/// requests append to the audit log, the user edits the policy and a rotated sibling appears,
/// no `notifications/files/changed` names any of them; an ordinary write made afterwards is
/// reported (so "nothing" is not "not yet").
#[test]
fn a_watch_on_the_folder_never_reports_protected_paths() {
    let mut lab = Lab::new(usual, serve_usual);
    let watch_id =
        lab.ok("files/watch", json!({"path": "project", "recursive": true}))["watchId"].clone();
    assert!(watch_id.is_string(), "{watch_id}");
    for i in 0..20 {
        lab.ok("files/read", json!({"path": "project/a.txt"}));
        if i % 5 == 0 {
            lab.ok("roots/list", json!({}));
            std::thread::sleep(Duration::from_millis(60));
        }
    }
    // The user edits the policy (a reload that changes nothing) and rotates the log.
    let policy = lab.p("proj/fsbroker.toml");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&policy)
        .unwrap();
    f.write_all(b"# edited by the user\n").unwrap();
    drop(f);
    put(&lab.p("proj/audit.jsonl.1"), "rotated\n");
    std::thread::sleep(Duration::from_millis(150));
    lab.ok(
        "files/write",
        json!({"path": "project/sentinel.txt", "content": "s"}),
    );
    let mut notes = Vec::new();
    let live = lab.live();
    let end = Instant::now() + DEADLINE;
    let mut sentinel_at: Option<Instant> = None;
    loop {
        let limit = match sentinel_at {
            Some(at) => (at + Duration::from_millis(600)).saturating_duration_since(Instant::now()),
            None => end.saturating_duration_since(Instant::now()),
        };
        if limit.is_zero() {
            break;
        }
        let Some((_, n)) = live.next_notification(limit) else {
            break;
        };
        if n["method"] == "notifications/files/changed" {
            let path = n["params"]["path"].as_str().unwrap_or_default().to_owned();
            if path == "project/sentinel.txt" && sentinel_at.is_none() {
                sentinel_at = Some(Instant::now());
            }
            notes.push(path);
        }
    }
    assert!(
        sentinel_at.is_some(),
        "the write of project/sentinel.txt was never reported: {notes:?}"
    );
    let leaked: Vec<&String> = notes
        .iter()
        .filter(|p| p.starts_with("project/audit.jsonl") || p.as_str() == "project/fsbroker.toml")
        .collect();
    assert!(
        leaked.is_empty(),
        "the watch reported protected paths {leaked:?} (all: {notes:?})"
    );
}

// ---------------------------------------------------------------------------------------------
// Warnings
// ---------------------------------------------------------------------------------------------

/// `fsbroker policy check`: exit 0, and a line with "warning" naming the protected file when a
/// read-write root holds the policy, or holds the audit log; no warning when no root holds
/// anything of fsbroker's.
#[test]
fn policy_check_warns_when_a_writable_root_holds_a_protected_path() {
    let (_t, base) = tempdir();
    project(&base);
    // The policy inside its read-write root.
    let inside = base.join("proj/fsbroker.toml");
    put(&inside, &policy_text(&[(".", "project")], ""));
    // A policy outside the root, its audit log inside.
    let audited = base.join("etc/audited.toml");
    put(
        &audited,
        &policy_text(
            &[("../proj", "project")],
            "[audit]\npath = '../proj/logs/audit.jsonl'\n",
        ),
    );
    std::fs::create_dir_all(base.join("proj/logs")).unwrap();
    // Nothing of fsbroker's in the root.
    let clean = base.join("etc/clean.toml");
    put(
        &clean,
        &policy_text(&[("../proj", "project")], "[audit]\npath = 'audit.jsonl'\n"),
    );

    let mut problems = Vec::new();
    for (policy, name) in [(&inside, "fsbroker.toml"), (&audited, "audit.jsonl")] {
        let (ok, text) = run_cli(&["policy", "check", policy.to_str().unwrap()]);
        if !ok {
            problems.push(format!("policy check {} failed: {text}", policy.display()));
        }
        let warned = text
            .lines()
            .any(|l| l.to_lowercase().contains("warning") && l.contains(name));
        if !warned {
            problems.push(format!(
                "policy check {}: no warning line naming {name}:\n{text}",
                policy.display()
            ));
        }
    }
    let (ok, text) = run_cli(&["policy", "check", clean.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(
        !text.to_lowercase().contains("warning"),
        "a warning for a policy whose root holds nothing of fsbroker's:\n{text}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// `fsbroker serve` with the policy inside its read-write root logs a warning containing
/// "protected" on stderr at start-up.
#[test]
fn serve_warns_at_start_up_when_a_writable_root_holds_a_protected_path() {
    let mut lab = Lab::new(usual, serve_usual);
    let live = lab.live();
    live.ok("roots/list", json!({}));
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end && !live.log_text().to_lowercase().contains("protected") {
        live.next_log_line(Duration::from_millis(100));
    }
    let log = live.log_text();
    assert!(
        log.lines().any(|l| l.to_lowercase().contains("protected")),
        "no start-up warning about protected paths in a writable root; stderr:\n{log}"
    );
}

/// The user's private runtime directory, where every broker keeps its socket's key and its
/// audit log's lock (`src/rundir.rs`).
fn runtime_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    let system = PathBuf::from(format!("/run/user/{uid}"));
    if system.is_dir() {
        system.join("fsbroker")
    } else {
        PathBuf::from(format!("/tmp/fsbroker-{uid}"))
    }
}

/// Attack (a root that holds the runtime directory, `/tmp` or `/run/user/UID`): a server of
/// one broker reads the key of *another* shared broker's socket there, with which it could
/// connect to that broker as a host. Every broker's keys and locks are refused, not only the
/// answering broker's own. Before, only its own were.
#[test]
fn another_brokers_key_is_not_readable_through_a_root() {
    let (_t, base) = tempdir();
    let sock = base.join("other.sock");
    let (mut other, _conn) = start_listener(
        &[
            "serve".into(),
            "--listen".into(),
            sock.clone().into_os_string(),
            "--root".into(),
            base.clone().into_os_string(),
        ],
        &sock,
    );
    let dir = runtime_dir();
    // The other broker's key: named after the digest of its socket's canonical path.
    let digest = Sha256::digest(sock.canonicalize().unwrap().as_os_str().as_encoded_bytes());
    let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let key = dir.join(format!("listen-{name}.key"));
    assert!(key.is_file(), "no key at {}", key.display());
    let mut b = Fsb::spawn(&["serve", "--root", dir.to_str().unwrap()]);
    let r = b.request("files/read", json!({"path": uri(&key)}));
    assert!(
        r.get("error").is_some() && r.to_string().contains("protected"),
        "{}: {r}",
        key.display()
    );
    let _ = b.finish();
    other.terminate(Duration::from_secs(10));
}

//! Attack corpus for the mutating methods: hostile `files/write`, `files/create`,
//! `files/delete` and `files/rename` requests, through the real binary over real pipes, on a
//! tree full of planted symlinks.
//!
//! Layout (in a fresh temp dir `T`):
//! ```text
//! T/outside/...        outside every root: files holding MARKER, a subdirectory
//! T/proj_evil/secret   prefix sibling of the root (CVE-2025-53110)
//! T/second/            outside in the single-root test; the second root of the policy test
//! T/policy.toml        two read-write roots; `proj` denies .git/**, **/.env, secrets
//! T/proj/              the root: ordinary files, denied files, a FIFO, and symlinks planted
//!                      at write targets and in parents, leading out (relative, absolute,
//!                      to existing and to not-yet-existing outside names), dangling, looping,
//!                      and to denied files
//! ```
//! Every case is a row of a table run by one `check`, which asserts the exact `data.code`
//! (and numeric code, `data.path`, and reason for confinement, deny and root refusals), that
//! no outside byte reaches the wire, that a snapshot of *everything outside the root(s)* —
//! names, types, modes, modification times, symlink targets, sha256 of contents — is the same
//! before and after (for successful cases too), and that no staging file is left anywhere.
//!
//! A third table puts fsbroker's own files inside the read-write root (`T/proj/etc/fsb/`
//! holds the policy, `T/proj/var/log/` the audit log) and aims every mutating route at them,
//! at a rotated sibling of the log that does not exist yet, and at the folders holding them:
//! each must be refused as protected, the policy (and the absent sibling) stay exactly as they
//! were, and the audit log only grows, in place.
//!
//! One file though long: its tables share one tree of traps and one runner, and the hostile-
//! case counts it prints are this file's; split, a row could land where no runner checks it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::hostile::{
    DENIED, DENIED_MARKER, MARKER, OUTSIDE, SECRET_TXT, World, number, put, shown,
};
use common::{Fsb, PolicyToml, RootToml, code};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// What hostile writes try to put somewhere.
const PAYLOAD: &str = "PWNED by a hostile server\n";
const ROOT_ITSELF: &str = "the root itself";
/// The reason of every refusal of fsbroker's own files starts with this.
const PROTECTED: &str = "protected";
/// In the policy file of the protected-paths world: must never reach the wire.
const POLICY_MARKER: &str = "POLICY-MARKER-7f31";
/// "Answer at once": far above any honest answer on a loaded 2-core machine, far below a
/// request blocked on a FIFO.
const AT_ONCE: Duration = Duration::from_secs(10);

/// What a request must produce.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// Succeeds (the row's `then` checks what it did).
    Ok,
    /// `files/create` succeeds with this `created`.
    Created(bool),
    /// Fails with this `data.code`, whatever the reason.
    Code(&'static str),
    /// Fails with this `data.code` and a reason starting with this text.
    CodeReason(&'static str, &'static str),
    /// `PERMISSION_DENIED`, reason exactly "outside every root".
    Outside,
    /// `PERMISSION_DENIED`, reason exactly "denied by policy".
    Denied,
    /// `PERMISSION_DENIED`, reason starting "the root itself".
    Root,
    /// `PERMISSION_DENIED`, reason starting "protected": fsbroker's own files and the folders
    /// holding them.
    Protected,
}

/// Which path of a rename an error must name in `data.path`.
#[derive(Debug, Clone, Copy)]
enum Side {
    Old,
    New,
}

/// One row: a request, what it must answer, and what must hold on disk afterwards.
struct Case {
    desc: &'static str,
    method: &'static str,
    params: Value,
    want: Want,
    /// The request path `data.path` must echo.
    blame: String,
    /// A control shows that the same spelling works where it should; not counted as hostile.
    control: bool,
    /// Extra checks on the tree after the request (for cases that succeed, mostly).
    then: Option<Box<dyn Fn()>>,
}

impl Case {
    fn control(mut self) -> Self {
        self.control = true;
        self
    }

    fn then(mut self, f: impl Fn() + 'static) -> Self {
        self.then = Some(Box::new(f));
        self
    }
}

fn row(desc: &'static str, method: &'static str, params: Value, want: Want, blame: &str) -> Case {
    Case {
        desc,
        method,
        params,
        want,
        blame: blame.to_owned(),
        control: false,
        then: None,
    }
}

/// `files/write {path, content: PAYLOAD}`.
fn write(desc: &'static str, path: impl Into<String>, want: Want) -> Case {
    let path = path.into();
    row(
        desc,
        "files/write",
        json!({"path": path, "content": PAYLOAD}),
        want,
        &path,
    )
}

/// `files/write` with extra fields (chunked uploads, `append`, `create: false`).
fn write_with(desc: &'static str, path: impl Into<String>, extra: Value, want: Want) -> Case {
    let path = path.into();
    let mut params = json!({"path": path, "content": PAYLOAD});
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    row(desc, "files/write", params, want, &path)
}

fn create(desc: &'static str, path: impl Into<String>, kind: &str, want: Want) -> Case {
    let path = path.into();
    row(
        desc,
        "files/create",
        json!({"path": path, "type": kind}),
        want,
        &path,
    )
}

fn delete(desc: &'static str, path: impl Into<String>, recursive: bool, want: Want) -> Case {
    let path = path.into();
    row(
        desc,
        "files/delete",
        json!({"path": path, "recursive": recursive}),
        want,
        &path,
    )
}

fn rename(
    desc: &'static str,
    old: impl Into<String>,
    new: impl Into<String>,
    overwrite: bool,
    want: Want,
    blame: Side,
) -> Case {
    let (old, new) = (old.into(), new.into());
    let blamed = match blame {
        Side::Old => old.clone(),
        Side::New => new.clone(),
    };
    row(
        desc,
        "files/rename",
        json!({"oldPath": old, "newPath": new, "overwrite": overwrite}),
        want,
        &blamed,
    )
}

// ---------------------------------------------------------------------------------------
// Snapshots of the file system.

/// Describes one entry without following it: type, permission bits, modification time, and
/// the sha256 of a regular file's content or a symlink's target.
fn describe(path: &Path) -> String {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return "absent".into(),
        Err(e) => panic!("lstat {}: {e}", path.display()),
    };
    let ft = m.file_type();
    let head = format!(
        "mode={:o} mtime={}.{:09}",
        m.mode() & 0o7777,
        m.mtime(),
        m.mtime_nsec()
    );
    if ft.is_symlink() {
        let target = std::fs::read_link(path).unwrap();
        format!("symlink -> {}", target.display())
    } else if ft.is_dir() {
        format!("dir {head}")
    } else if ft.is_file() {
        let bytes = std::fs::read(path).unwrap();
        format!("file {head} size={} sha256={}", bytes.len(), hex(&bytes))
    } else {
        // FIFOs, sockets, devices: never opened.
        format!("other {head}")
    }
}

fn hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every entry beneath `dir` (not following symlinks), keyed by its path relative to `base`,
/// skipping the directories in `skip` (the roots) entirely.
fn walk(base: &Path, dir: &Path, skip: &[PathBuf], out: &mut BTreeMap<String, String>) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        if skip.contains(&path) {
            continue;
        }
        let rel = path.strip_prefix(base).unwrap().display().to_string();
        out.insert(rel, describe(&path));
        if std::fs::symlink_metadata(&path).unwrap().is_dir() {
            walk(base, &path, skip, out);
        }
    }
}

/// Names, types, modes, modification times, symlink targets and content hashes of a set of
/// entries, with one sha256 over all of it.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    entries: BTreeMap<String, String>,
    sha256: String,
}

impl Snapshot {
    fn new(entries: BTreeMap<String, String>) -> Snapshot {
        let mut all = Vec::new();
        for (k, v) in &entries {
            all.extend_from_slice(k.as_bytes());
            all.push(0);
            all.extend_from_slice(v.as_bytes());
            all.push(b'\n');
        }
        Snapshot {
            sha256: hex(&all),
            entries,
        }
    }

    /// The entries that differ, for a readable failure.
    fn diff(&self, after: &Snapshot) -> String {
        let mut out = String::new();
        let keys: std::collections::BTreeSet<&String> =
            self.entries.keys().chain(after.entries.keys()).collect();
        for k in keys {
            let (b, a) = (self.entries.get(k), after.entries.get(k));
            if b != a {
                out.push_str(&format!("\n  {k}: {b:?} -> {a:?}"));
            }
        }
        out
    }
}

/// Everything beneath `base` except the roots in `skip`.
fn snapshot_outside(base: &Path, skip: &[PathBuf]) -> Snapshot {
    let mut entries = BTreeMap::new();
    walk(base, base, skip, &mut entries);
    Snapshot::new(entries)
}

/// The listed paths, each with everything beneath it.
fn snapshot_of(base: &Path, paths: &[PathBuf]) -> Snapshot {
    let mut entries = BTreeMap::new();
    for path in paths {
        let rel = path.strip_prefix(base).unwrap().display().to_string();
        entries.insert(rel, describe(path));
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            walk(base, path, &[], &mut entries);
        }
    }
    Snapshot::new(entries)
}

/// The entries whose name contains fsbroker's staging mark, anywhere beneath `dir`.
fn staging_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
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

// ---------------------------------------------------------------------------------------
// Post-conditions used by the rows that succeed.

fn assert_symlink(path: &Path, target: &Path) {
    let m = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{} should be a symlink: {e}", path.display()));
    assert!(
        m.file_type().is_symlink(),
        "{} is no longer a symlink",
        path.display()
    );
    assert_eq!(std::fs::read_link(path).unwrap(), target);
}

fn assert_file(path: &Path, content: &str) {
    let m = std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{} should be a file: {e}", path.display()));
    assert!(m.is_file(), "{} is not a regular file", path.display());
    assert_eq!(std::fs::read_to_string(path).unwrap(), content);
}

fn assert_absent(path: &Path) {
    assert!(
        std::fs::symlink_metadata(path).is_err(),
        "{} should not exist",
        path.display()
    );
}

// ---------------------------------------------------------------------------------------
// The check.

/// What `check` compares before and after each row.
struct Guarded<'a> {
    base: &'a Path,
    /// The roots: everything else under `base` must not change.
    roots: Vec<PathBuf>,
    /// Denied entries inside the roots, which must not change either.
    denied: Vec<PathBuf>,
    /// Texts that must never appear on the wire.
    forbidden: &'a [&'a str],
    /// fsbroker's own files (inside a root), which must not change at all (an absent one
    /// stays absent).
    protected: Vec<PathBuf>,
    /// Audit logs: they grow with every request, but only in place (same inode, the old
    /// bytes a prefix of the new).
    logs: Vec<PathBuf>,
}

/// A log's inode and bytes (0 and nothing when absent).
fn log_state(path: &Path) -> (u64, Vec<u8>) {
    match std::fs::metadata(path) {
        Ok(m) => (m.ino(), std::fs::read(path).unwrap()),
        Err(_) => (0, Vec::new()),
    }
}

/// Runs one row and asserts everything the contract promises about it.
fn check(b: &mut Fsb, g: &Guarded, case: &Case) {
    let ctx = format!("{} [{}] {}", case.method, case.desc, shown(&case.params));
    let outside_before = snapshot_outside(g.base, &g.roots);
    let denied_before = snapshot_of(g.base, &g.denied);
    let protected_before = snapshot_of(g.base, &g.protected);
    let logs_before: Vec<_> = g.logs.iter().map(|l| log_state(l)).collect();

    let started = Instant::now();
    let resp = b.request(case.method, case.params.clone());
    let took = started.elapsed();
    let raw = b.last_raw.clone();
    assert!(took < AT_ONCE, "{ctx}: took {took:?}; must answer at once");
    for secret in g.forbidden {
        assert!(!raw.contains(secret), "{ctx}: {secret} on the wire: {raw}");
    }
    let wire = shown(&resp);

    let failure = match case.want {
        Want::Ok | Want::Created(_) => None,
        Want::Code(c) => Some((c, None, false)),
        Want::CodeReason(c, r) => Some((c, Some(r), false)),
        Want::Outside => Some(("PERMISSION_DENIED", Some(OUTSIDE), true)),
        Want::Denied => Some(("PERMISSION_DENIED", Some(DENIED), true)),
        Want::Root => Some(("PERMISSION_DENIED", Some(ROOT_ITSELF), false)),
        Want::Protected => Some(("PERMISSION_DENIED", Some(PROTECTED), false)),
    };
    match failure {
        None => {
            assert!(resp.get("error").is_none(), "{ctx}: should succeed: {wire}");
            if let Want::Created(created) = case.want {
                assert_eq!(resp["result"]["created"], created, "{ctx}: {wire}");
            }
        }
        Some((want_code, want_reason, exact)) => {
            assert!(resp.get("result").is_none(), "{ctx}: should fail: {wire}");
            let err = &resp["error"];
            assert_eq!(code(err), want_code, "{ctx}: {wire}");
            assert_eq!(err["code"], json!(number(want_code)), "{ctx}: {wire}");
            let echoed = &err["data"]["path"];
            assert!(
                echoed.as_str() == Some(case.blame.as_str()),
                "{ctx}: data.path must echo the offending request path {}, got {}: {}",
                shown(&json!(case.blame)),
                shown(echoed),
                shown(&resp)
            );
            if let Some(reason) = want_reason {
                let got = err["data"]["reason"].as_str().unwrap_or_default();
                if exact {
                    assert_eq!(got, reason, "{ctx}: {wire}");
                } else {
                    assert!(got.starts_with(reason), "{ctx}: reason {got:?}: {wire}");
                }
            }
        }
    }

    let outside_after = snapshot_outside(g.base, &g.roots);
    assert!(
        outside_before == outside_after,
        "{ctx}: something outside the root changed (sha256 {} -> {}):{}\nresponse: {wire}",
        outside_before.sha256,
        outside_after.sha256,
        outside_before.diff(&outside_after)
    );
    let denied_after = snapshot_of(g.base, &g.denied);
    assert!(
        denied_before == denied_after,
        "{ctx}: a denied file changed:{}\nresponse: {wire}",
        denied_before.diff(&denied_after)
    );
    let protected_after = snapshot_of(g.base, &g.protected);
    assert!(
        protected_before == protected_after,
        "{ctx}: one of fsbroker's own files changed:{}\nresponse: {wire}",
        protected_before.diff(&protected_after)
    );
    for (log, (ino_before, bytes_before)) in g.logs.iter().zip(&logs_before) {
        let (ino_after, bytes_after) = log_state(log);
        assert!(
            ino_after == *ino_before && bytes_after.starts_with(bytes_before),
            "{ctx}: the audit log {} was replaced or rewritten (inode {ino_before} -> \
             {ino_after}, {} -> {} bytes)\nresponse: {wire}",
            log.display(),
            bytes_before.len(),
            bytes_after.len()
        );
    }
    let staging = staging_files(g.base);
    assert!(staging.is_empty(), "{ctx}: staging files left: {staging:?}");
    if let Some(then) = &case.then {
        then();
    }
}

/// Runs every row (all of them, even after one fails, so a run reports every broken row),
/// prints and asserts the number of hostile rows, then panics listing the rows that failed.
fn run_table(b: &mut Fsb, g: &Guarded, label: &str, cases: &[Case]) {
    let mut failed = Vec::new();
    for case in cases {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(b, g, case)));
        if let Err(panic) = outcome {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(msg);
        }
    }
    let hostile = cases.iter().filter(|c| !c.control).count();
    println!(
        "{label}: {hostile} hostile cases (+{} controls) across files/write, files/create, \
         files/delete and files/rename",
        cases.len() - hostile
    );
    assert!(hostile >= 30, "{label}: only {hostile} hostile cases");
    assert!(
        failed.is_empty(),
        "{label}: {} of {} rows failed:\n\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n\n")
    );
}

// ---------------------------------------------------------------------------------------
// The tree.

/// The kit's trap tree (both roots read-write) plus what only mutations try: files rows
/// rename away, an empty folder, a denied `.env` beside an allowed file, links to outside
/// names that do not exist yet, links in parents, a two-link chain out, a dangling link,
/// links that rows delete or overwrite (each used once), a folder `victim` holding links out,
/// and a link from `second` to `proj`.
fn world() -> World {
    let w = World::new(Some("read-write"));
    let (proj, out) = (w.proj.clone(), w.base.join("outside"));
    put(&out.join("sub/deep.txt"), &format!("{MARKER} deep\n"));
    for name in ["src1.txt", "src2.txt", "src3.txt", "src4.txt", "c1.txt"] {
        put(&proj.join(name), &format!("{name}\n"));
    }
    std::fs::create_dir(proj.join("emptydir")).unwrap();
    put(&proj.join("cfg/settings.toml"), "inside cfg\n");
    put(
        &proj.join("cfg/.env"),
        &format!("{DENIED_MARKER} cfg/.env\n"),
    );
    // At write targets, leading out to names that do not exist yet.
    w.link("../outside/new-rel.txt", "lnk_new_rel");
    w.link(out.join("new-abs.txt"), "lnk_new_abs");
    w.link("sub/chain2", "chain1");
    w.link("../../outside/secret.txt", "sub/chain2");
    // Parents leading out.
    w.link("../outside", "outdir");
    w.link(&out, "outdir_abs");
    w.link("../..", "sub/up"); // T itself
    w.link("missing-inside", "dangling");
    w.link("sub", "insub");
    // Consumed by rows that succeed (each used once).
    w.link("../outside/secret.txt", "del_file_link");
    w.link("../outside", "del_dir_link");
    w.link(&out, "del_abs_link");
    w.link("../outside", "del_dot_link");
    w.link("../outside/new-del.txt", "del_new_link");
    w.link("del_loop", "del_loop");
    w.link("../outside/secret.txt", "over_file");
    w.link("../outside", "over_dir");
    w.link("../outside/new-over.txt", "over_new");
    w.link(out.join("secret.txt"), "over_abs");
    w.link("../outside", "mv_link");
    put(&proj.join("victim/keep.txt"), "inside victim\n");
    w.link("../../outside", "victim/out");
    w.link(&out, "victim/out_abs");
    w.link("../../outside/secret.txt", "victim/out_file");
    put(&proj.join("victim/nested/n.txt"), "inside nested\n");
    w.link("../../../outside", "victim/nested/out");
    symlink("../proj", w.second.join("to_proj")).unwrap();
    w
}

/// Runs `f` with a deadline; a broker stuck opening the FIFO is freed, and the test fails.
fn guarded(w: World, f: impl FnOnce(World) + Send + 'static) {
    w.guarded(Duration::from_secs(180), f)
}

// ---------------------------------------------------------------------------------------
// Single root, `--read-write`, no deny globs.

fn single_root_cases(w: &World) -> Vec<Case> {
    use Want::{Code, Created, Ok, Outside, Root};
    let t = w.base.to_str().unwrap().to_owned();
    let p = w.proj.to_str().unwrap().to_owned();
    let proj = w.proj.clone();
    let out = w.base.join("outside");
    let invalid = Code("INVALID_PATH");
    let exists = Code("ALREADY_EXISTS");
    let long = "a".repeat(5000);
    let long_dirs = "x/".repeat(2500);
    let chunk0 = json!({"offset": 0, "final": false});

    let mut cases = vec![
        // ----- files/write: symlinks planted at the target.
        write(
            "target symlink, relative, to an outside file",
            "lnk_file_rel",
            Outside,
        ),
        write(
            "target symlink, absolute, to an outside file",
            "lnk_file_abs",
            Outside,
        ),
        write(
            "target symlink, relative, to a not-yet-existing outside name",
            "lnk_new_rel",
            Outside,
        ),
        write(
            "target symlink, absolute, to a not-yet-existing outside name",
            "lnk_new_abs",
            Outside,
        ),
        write("target symlink to the prefix sibling", "lnk_evil", Outside),
        write("chain of symlinks ending outside", "chain1", Outside),
        write(
            "target symlink leading out, by root name",
            "proj/lnk_file_rel",
            Outside,
        ),
        write(
            "target symlink leading out, by absolute path",
            format!("{p}/lnk_file_rel"),
            Outside,
        ),
        write_with(
            "upload, first chunk, to a symlink leading out",
            "lnk_file_rel",
            chunk0.clone(),
            Outside,
        ),
        write_with(
            "one-chunk upload to a dangling symlink leading out",
            "lnk_new_rel",
            json!({"offset": 0}),
            Outside,
        ),
        write_with(
            "append to a symlink leading out",
            "lnk_file_abs",
            json!({"append": true}),
            Outside,
        ),
        write_with(
            "create:false to a symlink leading out",
            "lnk_file_rel",
            json!({"create": false}),
            Outside,
        ),
        write("dangling symlink inside the root", "dangling", invalid),
        write("symlink loop", "loop_a", Code("IO_ERROR")),
        write("FIFO (must not block)", "fifo", invalid),
        write("FIFO by absolute path", format!("{p}/fifo"), invalid),
        // ----- files/write: symlinks planted in a parent.
        write(
            "parent symlink to outside, existing file",
            "outdir/secret.txt",
            Outside,
        ),
        write(
            "parent symlink to outside, new name",
            "outdir/new.txt",
            Outside,
        ),
        write(
            "parent symlink to outside, deeper",
            "outdir/sub/deep.txt",
            Outside,
        ),
        write(
            "absolute parent symlink to outside",
            "outdir_abs/new.txt",
            Outside,
        ),
        write(
            "parent symlink up out of the root",
            "sub/up/outside/secret.txt",
            Outside,
        ),
        write(
            "parent symlink through a dangling outside link",
            "lnk_new_rel/x",
            Outside,
        ),
        write_with(
            "upload, first chunk, through a parent symlink to outside",
            "outdir/upload.bin",
            chunk0.clone(),
            Outside,
        ),
        write("through a symlink loop", "loop_a/x", Code("IO_ERROR")),
        // ----- files/write: `..`, absolute, URI, prefix sibling.
        write("dotdot", "../outside/secret.txt", Outside),
        write(
            "dotdot after a subdir",
            "sub/../../outside/new.txt",
            Outside,
        ),
        write(
            "dotdot after the root name",
            "proj/../proj_evil/secret",
            Outside,
        ),
        write(
            "absolute outside file",
            format!("{t}/outside/secret.txt"),
            Outside,
        ),
        write(
            "absolute, new outside name",
            format!("{t}/outside/new.txt"),
            Outside,
        ),
        write(
            "prefix sibling (CVE-2025-53110)",
            format!("{t}/proj_evil/secret"),
            Outside,
        ),
        write(
            "absolute in-and-out",
            format!("{p}/../outside/secret.txt"),
            Outside,
        ),
        write(
            "file:// URI outside",
            format!("file://{t}/outside/secret.txt"),
            Outside,
        ),
        write(
            "file:// URI %2e%2e",
            format!("file://{p}/%2e%2e/outside/secret.txt"),
            Outside,
        ),
        write(
            "file:// URI ..%2F",
            format!("file://{p}/..%2Foutside%2Fsecret.txt"),
            Outside,
        ),
        // ----- files/write: malformed, and the root itself.
        write("NUL byte", "a.txt\0../../outside/secret.txt", invalid),
        write("empty path", "", invalid),
        write("5000-character path", long.clone(), invalid),
        write("5000-character path of dirs", long_dirs.clone(), invalid),
        write("the root itself, by name", "proj", invalid),
        write("the root itself, absolute", p.clone(), invalid),
        // ----- files/write: controls.
        {
            let proj = proj.clone();
            write("inside symlink is written through", "lnk_in", Ok)
                .control()
                .then(move || {
                    assert_symlink(&proj.join("lnk_in"), Path::new("a.txt"));
                    assert_file(&proj.join("a.txt"), PAYLOAD);
                })
        },
        {
            let proj = proj.clone();
            write("inside parent symlink", "insub/new.txt", Ok)
                .control()
                .then(move || assert_file(&proj.join("sub/new.txt"), PAYLOAD))
        },
        // ----- files/create: through symlinked directories, `..`, absolute, URI.
        create(
            "file through a parent symlink to outside",
            "outdir/new.txt",
            "file",
            Outside,
        ),
        create(
            "directory through a parent symlink to outside",
            "outdir/sub/dir",
            "directory",
            Outside,
        ),
        create(
            "new parents through a parent symlink to outside",
            "outdir/made/deeper/x.txt",
            "file",
            Outside,
        ),
        create(
            "directory through an absolute parent symlink",
            "outdir_abs/newdir",
            "directory",
            Outside,
        ),
        create(
            "directory through a parent symlink up out of the root",
            "sub/up/outside/made",
            "directory",
            Outside,
        ),
        create(
            "through a dangling symlink leading out",
            "lnk_new_rel/child",
            "directory",
            Outside,
        ),
        create("dotdot directory", "../outside/made", "directory", Outside),
        create(
            "dotdot file after a subdir",
            "sub/../../outside/made.txt",
            "file",
            Outside,
        ),
        create(
            "dotdot deep, with new parents",
            "a/b/../../../outside/made/x",
            "directory",
            Outside,
        ),
        create(
            "absolute outside",
            format!("{t}/outside/made"),
            "directory",
            Outside,
        ),
        create(
            "prefix sibling",
            format!("{t}/proj_evil/made.txt"),
            "file",
            Outside,
        ),
        create(
            "file:// URI outside",
            format!("file://{t}/outside/made.txt"),
            "file",
            Outside,
        ),
        create(
            "file:// URI %2e%2e",
            format!("file://{p}/%2e%2e/outside/made"),
            "directory",
            Outside,
        ),
        // Existing symlinks at the target are never followed by create.
        create(
            "file at a dangling symlink leading out",
            "lnk_new_rel",
            "file",
            exists,
        ),
        create(
            "directory at a dangling absolute symlink leading out",
            "lnk_new_abs",
            "directory",
            exists,
        ),
        create(
            "directory at a symlink to an outside directory",
            "outdir",
            "directory",
            exists,
        ),
        create(
            "file at a symlink to an outside file",
            "lnk_file_rel",
            "file",
            exists,
        ),
        create("file at a FIFO", "fifo", "file", exists),
        create(
            "through a symlink loop",
            "loop_a/x",
            "directory",
            Code("IO_ERROR"),
        ),
        create("NUL byte", "made\0x", "file", invalid),
        create("empty path", "", "directory", invalid),
        create("5000-character path", long.clone(), "file", invalid),
        // ----- files/create: controls.
        create(
            "the root as a directory",
            "proj",
            "directory",
            Created(false),
        )
        .control(),
        {
            let proj = proj.clone();
            create("new parents inside", "made/deep/dir", "directory", Ok)
                .control()
                .then(move || assert!(proj.join("made/deep/dir").is_dir()))
        },
        // ----- files/delete: the root.
        delete("the root by name", "proj", true, Root),
        delete("the root by absolute path", p.clone(), true, Root),
        delete(
            "the root by absolute path with a trailing slash",
            format!("{p}/"),
            true,
            Root,
        ),
        delete("the root by file:// URI", format!("file://{p}"), true, Root),
        delete(
            "the root by file://localhost URI",
            format!("file://localhost{p}/"),
            true,
            Root,
        ),
        delete("the root as `.`", ".", true, Root),
        delete("the root as `sub/..`", "sub/..", true, Root),
        delete("the root as `outdir/..` (lexical)", "outdir/..", true, Root),
        // ----- files/delete: through symlinks and out.
        delete(
            "file through a parent symlink to outside",
            "outdir/secret.txt",
            false,
            Outside,
        ),
        delete(
            "directory through a parent symlink to outside",
            "outdir/sub",
            true,
            Outside,
        ),
        delete(
            "file through an absolute parent symlink",
            "outdir_abs/secret.txt",
            false,
            Outside,
        ),
        delete(
            "through a parent symlink up out of the root",
            "sub/up/outside",
            true,
            Outside,
        ),
        delete("dotdot", "../outside/secret.txt", false, Outside),
        delete("dotdot directory", "../outside", true, Outside),
        delete("dotdot to the parent", "..", true, Outside),
        delete(
            "absolute outside",
            format!("{t}/outside/secret.txt"),
            false,
            Outside,
        ),
        delete("prefix sibling", format!("{t}/proj_evil"), true, Outside),
        delete(
            "file:// URI %2e%2e",
            format!("file://{p}/%2e%2e/outside"),
            true,
            Outside,
        ),
        delete("NUL byte", "a.txt\0x", false, invalid),
        delete("empty path", "", true, invalid),
        delete("5000-character path", long.clone(), false, invalid),
        // ----- files/delete: symlinks are removed, never their targets (these succeed).
        {
            let proj = proj.clone();
            delete("symlink to an outside file", "del_file_link", false, Ok)
                .then(move || assert_absent(&proj.join("del_file_link")))
        },
        {
            let proj = proj.clone();
            delete(
                "symlink to an outside directory, recursive",
                "del_dir_link",
                true,
                Ok,
            )
            .then(move || assert_absent(&proj.join("del_dir_link")))
        },
        {
            let proj = proj.clone();
            delete(
                "absolute symlink to an outside directory, recursive",
                "del_abs_link",
                true,
                Ok,
            )
            .then(move || assert_absent(&proj.join("del_abs_link")))
        },
        {
            let proj = proj.clone();
            delete(
                "symlink to an outside directory spelled `link/.`, recursive",
                "del_dot_link/.",
                true,
                Ok,
            )
            .then(move || assert_absent(&proj.join("del_dot_link")))
        },
        {
            let (proj, out) = (proj.clone(), out.clone());
            delete(
                "dangling symlink to a not-yet-existing outside name",
                "del_new_link",
                false,
                Ok,
            )
            .then(move || {
                assert_absent(&proj.join("del_new_link"));
                assert_absent(&out.join("new-del.txt"));
            })
        },
        {
            let proj = proj.clone();
            delete("self-looping symlink", "del_loop", false, Ok)
                .then(move || assert_absent(&proj.join("del_loop")))
        },
        {
            let (proj, out) = (proj.clone(), out.clone());
            delete(
                "recursive delete of a tree holding symlinks to outside",
                "victim",
                true,
                Ok,
            )
            .then(move || {
                assert_absent(&proj.join("victim"));
                assert!(out.join("secret.txt").is_file());
                assert!(out.join("sub/deep.txt").is_file());
            })
        },
        // ----- files/rename: from inside to outside.
        rename(
            "newPath dotdot",
            "a.txt",
            "../outside/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath dotdot after a subdir",
            "a.txt",
            "sub/../../outside/x",
            true,
            Outside,
            Side::New,
        ),
        rename(
            "newPath dotdot to the prefix sibling",
            "a.txt",
            "proj/../proj_evil/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath absolute outside",
            "a.txt",
            format!("{t}/outside/x"),
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath absolute over an outside file",
            "a.txt",
            format!("{t}/outside/secret.txt"),
            true,
            Outside,
            Side::New,
        ),
        rename(
            "newPath prefix sibling",
            "a.txt",
            format!("{t}/proj_evil/x"),
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath file:// URI outside",
            "a.txt",
            format!("file://{t}/outside/x"),
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath file:// URI %2e%2e",
            "a.txt",
            format!("file://{p}/%2e%2e/outside/x"),
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath parent is a symlink to outside",
            "a.txt",
            "outdir/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath parent is a symlink to outside, overwrite an outside file",
            "a.txt",
            "outdir/secret.txt",
            true,
            Outside,
            Side::New,
        ),
        rename(
            "newPath parent is an absolute symlink to outside",
            "a.txt",
            "outdir_abs/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath parent symlink up out of the root",
            "a.txt",
            "sub/up/outside/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath through a symlink loop",
            "a.txt",
            "loop_a/x",
            false,
            Code("IO_ERROR"),
            Side::New,
        ),
        // ----- files/rename: from outside to inside.
        rename(
            "oldPath dotdot",
            "../outside/secret.txt",
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath absolute outside",
            format!("{t}/outside/secret.txt"),
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath prefix sibling",
            format!("{t}/proj_evil/secret"),
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath file:// URI outside",
            format!("file://{t}/outside/secret.txt"),
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath through a parent symlink to outside",
            "outdir/secret.txt",
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath: a whole outside directory through a symlink",
            "outdir/sub",
            "stolen_dir",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "oldPath through an absolute parent symlink",
            "outdir_abs/secret.txt",
            "stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        // ----- files/rename: over symlinks that point outside.
        rename(
            "over a symlink to an outside directory, no overwrite",
            "a.txt",
            "outdir",
            false,
            exists,
            Side::New,
        ),
        rename(
            "over a symlink to an outside file, no overwrite",
            "a.txt",
            "lnk_file_rel",
            false,
            exists,
            Side::New,
        ),
        rename(
            "over a dangling symlink to an outside name, no overwrite",
            "a.txt",
            "lnk_new_rel",
            false,
            exists,
            Side::New,
        ),
        rename(
            "a directory over a symlink to an outside directory, overwrite",
            "sub",
            "outdir",
            true,
            invalid,
            Side::New,
        ),
        {
            let (proj, out) = (proj.clone(), out.clone());
            rename(
                "over a symlink to an outside file, overwrite",
                "src1.txt",
                "over_file",
                true,
                Ok,
                Side::New,
            )
            .then(move || {
                assert_file(&proj.join("over_file"), "src1.txt\n");
                assert_file(&out.join("secret.txt"), SECRET_TXT);
            })
        },
        {
            let (proj, out) = (proj.clone(), out.clone());
            rename(
                "over an absolute symlink to an outside file, overwrite",
                "src2.txt",
                "over_abs",
                true,
                Ok,
                Side::New,
            )
            .then(move || {
                assert_file(&proj.join("over_abs"), "src2.txt\n");
                assert_file(&out.join("secret.txt"), SECRET_TXT);
            })
        },
        {
            let (proj, out) = (proj.clone(), out.clone());
            rename(
                "over a symlink to an outside directory, overwrite",
                "src3.txt",
                "over_dir",
                true,
                Ok,
                Side::New,
            )
            .then(move || {
                assert_file(&proj.join("over_dir"), "src3.txt\n");
                assert_absent(&out.join("src3.txt"));
            })
        },
        {
            let (proj, out) = (proj.clone(), out.clone());
            rename(
                "over a dangling symlink to an outside name, overwrite",
                "src4.txt",
                "over_new",
                true,
                Ok,
                Side::New,
            )
            .then(move || {
                assert_file(&proj.join("over_new"), "src4.txt\n");
                assert_absent(&out.join("new-over.txt"));
            })
        },
        {
            let proj = proj.clone();
            rename(
                "a symlink to outside moves as a link",
                "mv_link",
                "sub/moved_link",
                false,
                Ok,
                Side::New,
            )
            .then(move || {
                assert_absent(&proj.join("mv_link"));
                assert_symlink(&proj.join("sub/moved_link"), Path::new("../outside"));
            })
        },
        // ----- files/rename: the root.
        rename(
            "oldPath the root by name",
            "proj",
            "renamed",
            false,
            Root,
            Side::Old,
        ),
        rename(
            "oldPath the root as `.`",
            ".",
            "renamed",
            false,
            Root,
            Side::Old,
        ),
        rename(
            "oldPath the root, absolute",
            p.clone(),
            format!("{p}/renamed"),
            false,
            Root,
            Side::Old,
        ),
        rename(
            "oldPath the root, out of itself",
            "proj",
            "../proj_moved",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "oldPath the root by file:// URI",
            format!("file://{p}"),
            "renamed",
            false,
            Root,
            Side::Old,
        ),
        rename(
            "newPath the root by name",
            "a.txt",
            "proj",
            true,
            Root,
            Side::New,
        ),
        rename(
            "newPath the root as `.`",
            "a.txt",
            ".",
            true,
            Root,
            Side::New,
        ),
        rename(
            "newPath the root, absolute",
            "a.txt",
            p.clone(),
            true,
            Root,
            Side::New,
        ),
        rename(
            "newPath the root as `outdir/..`",
            "a.txt",
            "outdir/..",
            true,
            Root,
            Side::New,
        ),
        // ----- files/rename: malformed.
        rename(
            "oldPath NUL byte",
            "a.txt\0x",
            "x",
            false,
            invalid,
            Side::Old,
        ),
        rename(
            "newPath NUL byte",
            "a.txt",
            "x\0../../outside/x",
            false,
            invalid,
            Side::New,
        ),
        rename("oldPath empty", "", "x", false, invalid, Side::Old),
        rename("newPath empty", "a.txt", "", false, invalid, Side::New),
        rename(
            "newPath 5000 characters",
            "a.txt",
            long.clone(),
            false,
            invalid,
            Side::New,
        ),
    ];
    // Nothing above may have created or removed the files the failed rows aimed at.
    let proj2 = proj.clone();
    cases.push(
        write("NUL byte after a valid prefix", "sub/b.txt\0", invalid).then(move || {
            assert_file(&proj2.join("sub/b.txt"), "inside b\n");
            assert!(proj2.join("sub").is_dir());
            assert_symlink(&proj2.join("outdir"), Path::new("../outside"));
            assert_symlink(
                &proj2.join("lnk_file_rel"),
                Path::new("../outside/secret.txt"),
            );
            assert_absent(&proj2.join("stolen.txt"));
        }),
    );
    cases
}

#[test]
fn hostile_mutations_single_root() {
    let w = world();
    guarded(w, |w| {
        let cases = single_root_cases(&w);
        let mut b = Fsb::spawn(&[
            "serve".as_ref(),
            "--root".as_ref(),
            w.proj.as_os_str(),
            "--read-write".as_ref(),
        ]);
        let g = Guarded {
            base: &w.base,
            roots: vec![w.proj.clone()],
            denied: vec![],
            forbidden: &[MARKER],
            protected: vec![],
            logs: vec![],
        };
        run_table(&mut b, &g, "single read-write root", &cases);
        let (status, rest) = b.finish();
        assert!(status.success(), "{status}");
        assert!(!rest.contains(MARKER));
        let staging = staging_files(&w.base);
        assert!(staging.is_empty(), "staging files left: {staging:?}");
    });
}

// ---------------------------------------------------------------------------------------
// Two read-write roots through a policy file; `proj` has deny globs, `second` has none.

fn policy_cases(w: &World) -> Vec<Case> {
    use Want::{Code, CodeReason, Denied, Ok, Outside, Root};
    let t = w.base.to_str().unwrap().to_owned();
    let p = w.proj.to_str().unwrap().to_owned();
    let s = w.second.to_str().unwrap().to_owned();
    let (proj, second) = (w.proj.clone(), w.second.clone());
    let chunk0 = json!({"offset": 0, "final": false});
    vec![
        // ----- files/write on denied paths, however spelled or reached.
        write("denied file", "proj/.env", Denied),
        write("denied file, nested", "proj/sub/.env", Denied),
        write("denied file, new, under **/.env", "proj/new/.env", Denied),
        write("under a denied dir", "proj/.git/config", Denied),
        write("new file under a denied dir", "proj/.git/hooks", Denied),
        write("denied plain name", "proj/secrets", Denied),
        write("under a denied plain name", "proj/secrets/key.pem", Denied),
        write("denied after a lexical climb", "proj/sub/../.env", Denied),
        write("denied, absolute", format!("{p}/.env"), Denied),
        write("denied, URI with %2E", format!("file://{p}/%2Eenv"), Denied),
        write("ok.txt -> .env is refused", "proj/ok.txt", Denied),
        write("symlink to a denied file", "proj/lnk_secret", Denied),
        write("through gitlink -> .git", "proj/gitlink/config", Denied),
        write("new file through gitlink -> .git", "proj/gitlink/x", Denied),
        write_with(
            "upload, first chunk, to a denied file",
            "proj/.env",
            chunk0.clone(),
            Denied,
        ),
        write_with(
            "upload, first chunk, to ok.txt -> .env",
            "proj/ok.txt",
            chunk0,
            Denied,
        ),
        write_with(
            "append to ok.txt -> .env",
            "proj/ok.txt",
            json!({"append": true}),
            Denied,
        ),
        // ----- files/create on denied paths.
        create(
            "file under a denied dir",
            "proj/.git/hooks/post-checkout",
            "file",
            Denied,
        ),
        create(
            "file under a denied dir through gitlink",
            "proj/gitlink/hooks/post-checkout",
            "file",
            Denied,
        ),
        create(
            "directory under a denied plain name",
            "proj/secrets/more",
            "directory",
            Denied,
        ),
        create("a new denied name", "proj/newdir/.env", "file", Denied),
        create("the denied dir itself", "proj/.git", "directory", Denied),
        create("ok.txt -> .env", "proj/ok.txt", "file", Denied),
        // ----- files/delete on denied paths.
        delete("denied file", "proj/.env", false, Denied),
        delete("denied dir, recursive", "proj/.git", true, Denied),
        delete("denied plain name, recursive", "proj/secrets", true, Denied),
        delete(
            "through gitlink -> .git",
            "proj/gitlink/config",
            false,
            Denied,
        ),
        delete(
            "a tree holding a denied file, recursive",
            "proj/sub",
            true,
            CodeReason("PERMISSION_DENIED", "the directory holds paths denied"),
        ),
        // ----- files/rename with denied old and new paths.
        rename(
            "oldPath denied",
            "proj/.env",
            "proj/env.txt",
            false,
            Denied,
            Side::Old,
        ),
        rename(
            "oldPath denied, into the other root",
            "proj/.env",
            "second/env.txt",
            false,
            Denied,
            Side::Old,
        ),
        rename(
            "oldPath a denied dir, into the other root",
            "proj/.git",
            "second/git",
            false,
            Denied,
            Side::Old,
        ),
        rename(
            "oldPath under a denied plain name",
            "proj/secrets/key.pem",
            "second/key.pem",
            false,
            Denied,
            Side::Old,
        ),
        rename(
            "oldPath through gitlink -> .git",
            "proj/gitlink/config",
            "second/config",
            false,
            Denied,
            Side::Old,
        ),
        rename(
            "newPath denied, overwrite",
            "proj/a.txt",
            "proj/.env",
            true,
            Denied,
            Side::New,
        ),
        rename(
            "newPath denied through ok.txt -> .env, overwrite",
            "proj/a.txt",
            "proj/ok.txt",
            true,
            Denied,
            Side::New,
        ),
        rename(
            "newPath under a denied dir",
            "proj/a.txt",
            "proj/.git/x",
            false,
            Denied,
            Side::New,
        ),
        rename(
            "newPath through gitlink -> .git",
            "proj/a.txt",
            "proj/gitlink/x",
            false,
            Denied,
            Side::New,
        ),
        rename(
            "newPath a denied name from the other root",
            "second/s.txt",
            "proj/sub/.env",
            true,
            Denied,
            Side::New,
        ),
        rename(
            "a tree holding a denied file, into a root without deny globs",
            "proj/cfg",
            "second/cfg",
            false,
            CodeReason("PERMISSION_DENIED", ""),
            Side::Old,
        ),
        // ----- Across roots, and out of them.
        rename(
            "into the other root through its symlink leading out",
            "proj/a.txt",
            "second/to_proj/x.txt",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath climbs out of the other root",
            "proj/a.txt",
            "second/../outside/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "newPath names no root",
            "proj/a.txt",
            "outside/x",
            false,
            Outside,
            Side::New,
        ),
        rename(
            "oldPath names no root",
            "outside/secret.txt",
            "proj/stolen.txt",
            false,
            Outside,
            Side::Old,
        ),
        rename(
            "newPath prefix sibling",
            "proj/a.txt",
            format!("{t}/proj_evil/x"),
            false,
            Outside,
            Side::New,
        ),
        write(
            "a link in one root to another root's denied file",
            "second/lnk_cross_env",
            Outside,
        ),
        write("unknown first segment", "a.txt", Outside),
        create(
            "through the other root's symlink leading out",
            "second/to_proj/made",
            "directory",
            Outside,
        ),
        // ----- The roots themselves.
        delete("the first root", "proj", true, Root),
        delete("the second root", "second", true, Root),
        delete("the second root, absolute", s.clone(), true, Root),
        rename(
            "a root into the other root",
            "second",
            "proj/second",
            false,
            Root,
            Side::Old,
        ),
        rename(
            "over the other root",
            "proj/a.txt",
            "second",
            true,
            Root,
            Side::New,
        ),
        // ----- Controls.
        {
            let (proj, second) = (proj.clone(), second.clone());
            rename(
                "across roots",
                "proj/c1.txt",
                "second/c1.txt",
                false,
                Ok,
                Side::New,
            )
            .control()
            .then(move || {
                assert_absent(&proj.join("c1.txt"));
                assert_file(&second.join("c1.txt"), "c1.txt\n");
            })
        },
        write("a plain file next to denied ones", "proj/sub/plain.txt", Ok).control(),
        create(
            "a file spelled with a harmless climb",
            "proj/nope/../x",
            "file",
            Ok,
        )
        .control(),
        delete(
            "missing file",
            "proj/missing",
            false,
            Code("FILE_NOT_FOUND"),
        )
        .control(),
    ]
}

#[test]
fn hostile_mutations_two_roots_with_deny_globs() {
    let w = world();
    guarded(w, |w| {
        let cases = policy_cases(&w);
        let mut b = Fsb::spawn(&["serve".as_ref(), "--policy".as_ref(), w.policy.as_os_str()]);
        let p = &w.proj;
        let g = Guarded {
            base: &w.base,
            roots: vec![w.proj.clone(), w.second.clone()],
            denied: vec![
                p.join(".env"),
                p.join("sub/.env"),
                p.join("cfg/.env"),
                p.join(".git"),
                p.join("secrets"),
            ],
            forbidden: &[MARKER, DENIED_MARKER],
            protected: vec![],
            logs: vec![],
        };
        run_table(&mut b, &g, "two read-write roots + deny globs", &cases);
        let (status, rest) = b.finish();
        assert!(status.success(), "{status}");
        assert!(!rest.contains(MARKER) && !rest.contains(DENIED_MARKER));
        let staging = staging_files(&w.base);
        assert!(staging.is_empty(), "staging files left: {staging:?}");
    });
}

// ---------------------------------------------------------------------------------------
// fsbroker's own files inside the read-write root: the policy in `proj/etc/fsb/`, the audit
// log in `proj/var/log/`.

/// Where the protected-paths world keeps fsbroker's files, relative to the root `proj`.
const OWN_POLICY: &str = "etc/fsb/fsbroker.toml";
const OWN_LOG: &str = "var/log/audit.jsonl";
/// A rotated sibling of the log that does not exist yet.
const OWN_SIBLING: &str = "var/log/audit.jsonl.1";

/// [`world`], plus a policy inside the root `proj` (`T/proj/etc/fsb/fsbroker.toml`: `proj`
/// as `../..` and `second` as `../../../second`, both read-write, consent auto) whose audit
/// log is `T/proj/var/log/audit.jsonl`.
fn protected_world() -> World {
    let mut w = world();
    std::fs::create_dir_all(w.proj.join(OWN_POLICY).parent().unwrap()).unwrap();
    let policy = PolicyToml::new()
        .head(&format!("# {POLICY_MARKER}: fsbroker's own\n"))
        .root(RootToml::raw("\"../..\"").name("proj").rw())
        .root(RootToml::raw("\"../../../second\"").name("second").rw())
        .table("audit", "path = \"../../var/log/audit.jsonl\"")
        .write_to(&w.proj.join(OWN_POLICY));
    std::fs::create_dir_all(w.proj.join("var/log")).unwrap();
    put(&w.proj.join("onto.txt"), "renamed onto fsbroker's files\n");
    w.policy = policy;
    w
}

/// A generated row description: rows hold `&'static str`, so the few this table builds are
/// leaked (a few KiB, once per run).
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The broker's `etag` of a file (its format: `src/sandbox/open.rs`), for `ifMatch`.
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

fn protected_cases(w: &World) -> Vec<Case> {
    use Want::{Ok, Protected};
    let p = w.proj.to_str().unwrap().to_owned();
    let chunk0 = json!({"offset": 0, "final": false});
    // `NAME/rel`, absolute, `file://` URI.
    let forms = |rel: &str| -> [(&'static str, String); 3] {
        [
            ("name", format!("proj/{rel}")),
            ("absolute", format!("{p}/{rel}")),
            (
                "URI",
                format!("file://{}", common::uri_path(&w.proj.join(rel))),
            ),
        ]
    };
    let mut cases = Vec::new();
    // Controls: ordinary files beside fsbroker's own stay writable (first, so that a broker
    // that lets the rows below through cannot make them fail).
    let proj = w.proj.clone();
    cases.push(
        write(
            "an ordinary file beside the policy",
            "proj/etc/fsb/notes.txt",
            Ok,
        )
        .control()
        .then(move || assert_file(&proj.join("etc/fsb/notes.txt"), PAYLOAD)),
    );
    cases.push(
        write(
            "an ordinary file beside the audit log",
            "proj/var/log/other.txt",
            Ok,
        )
        .control(),
    );
    // Then, while the policy is the file the etag was taken from.
    cases.push(write_with(
        "policy, ifMatch its etag",
        format!("proj/{OWN_POLICY}"),
        json!({"ifMatch": etag_of(&w.policy)}),
        Protected,
    ));
    for (what, rel, exists) in [
        ("policy", OWN_POLICY, true),
        ("audit log", OWN_LOG, true),
        ("new audit sibling", OWN_SIBLING, false),
    ] {
        for (form, path) in forms(rel) {
            let d = |s: &str| -> &'static str { leak(format!("{what}, {s} [{form}]")) };
            cases.extend([
                write(d("write"), path.clone(), Protected),
                write_with(
                    d("append"),
                    path.clone(),
                    json!({"append": true}),
                    Protected,
                ),
                write_with(d("upload chunk 0"), path.clone(), chunk0.clone(), Protected),
                create(d("create file"), path.clone(), "file", Protected),
                create(d("create directory"), path.clone(), "directory", Protected),
                rename(
                    d("rename a file onto it"),
                    "proj/onto.txt",
                    path.clone(),
                    exists,
                    Protected,
                    Side::New,
                ),
            ]);
            if exists {
                cases.extend([
                    delete(d("delete"), path.clone(), false, Protected),
                    rename(
                        d("rename it away"),
                        path.clone(),
                        "proj/stolen",
                        false,
                        Protected,
                        Side::Old,
                    ),
                ]);
            }
        }
    }
    for (what, rel) in [("policy", OWN_POLICY), ("audit log", OWN_LOG)] {
        let path = format!("proj/{rel}");
        let d = |s: &str| -> &'static str { leak(format!("{what}, {s}")) };
        cases.extend([
            write_with(
                d("create: false"),
                path.clone(),
                json!({"create": false}),
                Protected,
            ),
            delete(d("delete recursive"), path.clone(), true, Protected),
            rename(
                d("rename over an ordinary file"),
                path.clone(),
                "proj/a.txt",
                true,
                Protected,
                Side::Old,
            ),
            rename(
                d("rename into the other root"),
                path.clone(),
                "second/stolen",
                false,
                Protected,
                Side::Old,
            ),
        ]);
    }
    // The folders holding them, and their parents.
    for (what, rel) in [
        ("the policy's folder", "etc/fsb"),
        ("the policy folder's parent", "etc"),
        ("the audit log's folder", "var/log"),
        ("the audit log folder's parent", "var"),
    ] {
        for (form, path) in forms(rel) {
            let d = |s: &str| -> &'static str { leak(format!("{what}, {s} [{form}]")) };
            cases.extend([
                delete(d("delete recursive"), path.clone(), true, Protected),
                rename(
                    d("rename away"),
                    path.clone(),
                    "proj/moved",
                    false,
                    Protected,
                    Side::Old,
                ),
            ]);
        }
        let path = format!("proj/{rel}");
        let d = |s: &str| -> &'static str { leak(format!("{what}, {s}")) };
        cases.push(rename(
            d("rename into the other root"),
            path,
            "second/moved",
            false,
            Protected,
            Side::Old,
        ));
    }
    cases
}

#[test]
fn hostile_mutations_on_protected_paths() {
    let w = protected_world();
    guarded(w, |w| {
        let cases = protected_cases(&w);
        let mut b = Fsb::spawn(&["serve".as_ref(), "--policy".as_ref(), w.policy.as_os_str()]);
        // The first request makes sure the audit log exists before its first row.
        b.ok("roots/list", json!({}));
        let g = Guarded {
            base: &w.base,
            roots: vec![w.proj.clone(), w.second.clone()],
            denied: vec![],
            forbidden: &[MARKER, POLICY_MARKER],
            protected: vec![w.proj.join(OWN_POLICY), w.proj.join(OWN_SIBLING)],
            logs: vec![w.proj.join(OWN_LOG)],
        };
        run_table(
            &mut b,
            &g,
            "fsbroker's own files in a read-write root",
            &cases,
        );
        let (status, rest) = b.finish();
        assert!(status.success(), "{status}");
        assert!(!rest.contains(MARKER) && !rest.contains(POLICY_MARKER));
        let staging = staging_files(&w.base);
        assert!(staging.is_empty(), "staging files left: {staging:?}");
    });
}

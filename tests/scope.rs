//! The scope a server is held to, end to end, through the real binary over real pipes: the
//! rules that keep a server inside what the person approved, where the paths it names and
//! where they really lead can differ.
//!
//! 1. **Consent is exact.** `files/consent` approves canonical absolute paths (symlinks
//!    resolved, a leading dot kept), a subset of what was asked and never outside a root; the
//!    consent command is asked about exactly those paths; a symlink leading out of its root is
//!    never asked about nor approved, nor is a not-yet-existing path beneath one.
//! 2. **A directory rename lands no file on a denied name**, whatever root it comes from and
//!    whether or not it replaces an empty directory.
//! 3. **Overlapping roots**: whichever root (name, absolute path or URI) a request goes
//!    through, the strictest mode, the deny globs and the consent mode of every root covering
//!    the path apply, and a root is never renamed, deleted or replaced through another one.
//! 4. **`roots/list` lists only what the session may use now**: auto roots, prompt roots the
//!    person approved (asked on the first `roots/list`), granted subtrees of prompt roots
//!    (announced with `notifications/roots/list_changed`, withdrawn on revocation); never deny
//!    roots.
//! 5. **A no-op rename is no probe**: renaming a directory onto itself answers the same
//!    whether or not it holds entries the globs hide.
//!
//! Each refusal is checked for its exact code, reason and `data.path`, and for the disk being
//! exactly as it was; each "must not" has a control showing the same request shape succeeds
//! where it should. Every broker is a [`Fsb`] (notifications set aside, every wait
//! bounded), since a grant may now be announced by a notification between two responses.
//!
//! One file though long: each test is one rule of a server's approved scope on the same roots;
//! the rules are read together.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use common::hostile::{mkdirs, uri};
use common::{lit, path_str as s, python, snapshot};

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Fsb, PolicyToml, RootToml, bin, code, tempdir};
use serde_json::{Value, json};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Longest wait for a response or for a notification that must come.
const DEADLINE: Duration = Duration::from_secs(10);

/// `error.code` of `PERMISSION_DENIED`.
const PERMISSION_DENIED: i64 = -31002;

/// The policy text: `roots`, then `consent` as the body of `[consent]` when given, then
/// limits that keep the rate limiter out of quick test sequences.
fn policy_text(roots: Vec<RootToml>, consent: Option<&str>) -> String {
    let mut policy = PolicyToml::new();
    for root in roots {
        policy = policy.root(root);
    }
    if let Some(table) = consent {
        policy = policy.table("consent", table);
    }
    policy.unlimited().text()
}

/// Writes `text` to a new file beside `policy` and renames it over it, as editors do.
fn replace_file(policy: &Path, text: &str) {
    let tmp = policy.with_extension("toml.new");
    let mut f = std::fs::File::create(&tmp).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.sync_all().unwrap();
    drop(f);
    std::fs::rename(&tmp, policy).unwrap();
}

/// `fsbroker serve --policy FILE`, not yet asked anything.
fn serve(policy: &Path) -> Fsb {
    Fsb::start(
        &[
            OsStr::new("serve"),
            OsStr::new("--policy"),
            policy.as_os_str(),
        ],
        DEADLINE,
    )
}

/// The consent decision script. `MODE SAVE`: appends its stdin as one line to `SAVE.log`,
/// saves it to SAVE, then answers by MODE:
/// - `all`: approves every requested path;
/// - `none`: `{"granted": false}`;
/// - `@FILE`: reads the mode (`all` or `none`) from FILE at the time it is asked.
const DECIDE_PY: &str = r#"
import json, os, sys
mode, save = sys.argv[1], sys.argv[2]
data = sys.stdin.buffer.read()
with open(save + ".log", "ab") as f:
    f.write(data.replace(b"\n", b" ") + b"\n")
with open(save + ".tmp", "wb") as f:
    f.write(data)
os.rename(save + ".tmp", save)
if mode.startswith("@"):
    with open(mode[1:]) as f:
        mode = f.read().strip()
paths = json.loads(data)["requestedPaths"]
if mode == "all":
    print(json.dumps({"granted": True, "approvedPaths": paths}))
elif mode == "none":
    print(json.dumps({"granted": False}))
else:
    sys.exit("unknown mode " + mode)
"#;

/// The consent command, in a directory of its own (never the policy's, which is watched).
struct Asker {
    script: PathBuf,
    save: PathBuf,
    log: PathBuf,
}

impl Asker {
    fn new(dir: &Path) -> Asker {
        std::fs::create_dir_all(dir).unwrap();
        let script = dir.join("decide.py");
        std::fs::write(&script, DECIDE_PY).unwrap();
        Asker {
            script,
            save: dir.join("request.json"),
            log: dir.join("request.json.log"),
        }
    }

    /// The `[consent]` body that runs the script in `mode`.
    fn table(&self, mode: &str) -> String {
        format!(
            "command = [{}, {}, \"{mode}\", {}]\nterminal = false\ntimeout_ms = 20000",
            lit(Path::new(python())),
            lit(&self.script),
            lit(&self.save)
        )
    }

    /// Every request the command got, oldest first.
    fn asked(&self) -> Vec<Value> {
        match std::fs::read_to_string(&self.log) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).expect("the consent request is JSON"))
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("read {}: {e}", self.log.display()),
        }
    }

    /// The `requestedPaths` of the last request (the command must have run).
    fn last_paths(&self) -> Vec<String> {
        let last = self.asked().pop().expect("the consent command was asked");
        strings(&last["requestedPaths"])
    }

    /// Every path the command was ever asked about.
    fn all_paths(&self) -> BTreeSet<String> {
        self.asked()
            .iter()
            .flat_map(|r| strings(&r["requestedPaths"]))
            .collect()
    }

    /// Forgets what was asked so far.
    fn clear(&self) {
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(&self.save);
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|p| {
            p.as_str()
                .unwrap_or_else(|| panic!("not a string: {p}"))
                .to_owned()
        })
        .collect()
}

/// What a refusal's reason must be.
#[derive(Clone, Copy)]
enum Reason<'a> {
    Is(&'a str),
    StartsWith(&'a str),
}

/// Asserts `PERMISSION_DENIED` (both codes), `reason`, and `data.path` = `path`.
fn assert_denied(e: &Value, path: &str, reason: Reason) {
    assert_eq!(code(e), "PERMISSION_DENIED", "{e}");
    assert_eq!(e["code"], json!(PERMISSION_DENIED), "{e}");
    assert_eq!(
        e["data"]["path"], path,
        "data.path must be the path as sent: {e}"
    );
    let got = e["data"]["reason"].as_str().unwrap_or_default();
    match reason {
        Reason::Is(want) => assert_eq!(got, want, "{e}"),
        Reason::StartsWith(want) => {
            assert!(got.starts_with(want), "reason should start {want:?}: {e}")
        }
    }
}

/// Sends a request that must be refused `PERMISSION_DENIED` with `reason` for `path`, and must
/// leave everything beneath `tree` exactly as it was. Returns the error.
fn refused(
    b: &mut Fsb,
    tree: &Path,
    method: &str,
    params: Value,
    path: &str,
    reason: Reason,
) -> Value {
    let before = snapshot(tree);
    let e = b.err(method, params.clone());
    assert_denied(&e, path, reason);
    assert_eq!(
        snapshot(tree),
        before,
        "{method} {params} was refused but changed the disk"
    );
    e
}

fn read_ok(b: &mut Fsb, path: &str, expect: &str) {
    let r = b.ok("files/read", json!({ "path": path }));
    assert_eq!(r["content"], expect, "{path}: {r}");
}

fn no_consent(b: &mut Fsb, path: &str) {
    let e = b.err("files/read", json!({ "path": path }));
    assert_denied(&e, path, Reason::Is("no consent"));
}

/// `files/consent` that must succeed: checks the result's shape, and that every approved path
/// is absolute, listed once and beneath one of `roots`. Returns `approvedPaths`.
fn consent(b: &mut Fsb, paths: &[&str], roots: &[&Path]) -> Vec<String> {
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": paths}),
    );
    let approved = strings(&r["approvedPaths"]);
    assert_eq!(
        r["granted"],
        json!(!approved.is_empty()),
        "granted must say whether anything was approved: {r}"
    );
    let distinct: BTreeSet<_> = approved.iter().collect();
    assert_eq!(distinct.len(), approved.len(), "duplicates in {r}");
    for p in &approved {
        assert!(p.starts_with('/'), "approved path not absolute: {r}");
        assert!(
            roots.iter().any(|root| Path::new(p).starts_with(root)),
            "approved path {p} is outside every root: {r}"
        );
    }
    approved
}

/// The names in a `files/list` of `path` (hidden entries included).
fn listed(b: &mut Fsb, path: &str, recursive: bool) -> Vec<String> {
    let r = b.ok(
        "files/list",
        json!({"path": path, "recursive": recursive, "includeHidden": true}),
    );
    r["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("files/list {path}: {r}"))
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_owned())
        .collect()
}

/// `roots/list` as a set of `(name, uri)`.
fn roots(b: &mut Fsb) -> BTreeSet<(String, String)> {
    let r = b.ok("roots/list", json!({}));
    r["roots"]
        .as_array()
        .unwrap_or_else(|| panic!("roots/list: {r}"))
        .iter()
        .map(|x| {
            (
                x["name"].as_str().unwrap().to_owned(),
                x["uri"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `(name, uri)` of a directory.
fn entry(name: &str, dir: &Path) -> (String, String) {
    (name.to_owned(), uri(dir))
}

/// Waits for `notifications/roots/list_changed` (exactly as the contract writes it).
fn expect_list_changed(b: &mut Fsb, what: &str) {
    let Some((_, n)) = b.next_notification(DEADLINE) else {
        panic!("{what}: no notifications/roots/list_changed within {DEADLINE:?}");
    };
    assert_eq!(
        n,
        json!({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}),
        "{what}: unexpected notification"
    );
}

/// Drops notifications already received, and any arriving within `limit`.
fn drain_notifications(b: &mut Fsb, limit: Duration) {
    let end = Instant::now() + limit;
    while b
        .next_notification(end.saturating_duration_since(Instant::now()))
        .is_some()
    {}
}

fn files(base: &Path, files: &[(&str, &str)]) {
    for (f, text) in files {
        let p = base.join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Consent is exact
// ---------------------------------------------------------------------------------------------

/// Two prompt roots whose consent command approves everything:
///
/// ```text
/// T/home/.ssh/id_rsa   T/home/ssh/notes.txt (a decoy: `.ssh` without its dot)
/// T/home/.config/app/settings   T/home/config/app/settings (decoy)   T/home/docs/readme.txt
/// T/proj/c/g.txt   T/proj/e/e.txt   T/proj/lc -> c   T/proj/link_out -> ../outside
/// T/outside/o.txt
/// ```
struct ConsentEnv {
    _t: tempfile::TempDir,
    home: PathBuf,
    proj: PathBuf,
    policy: PathBuf,
    asker: Asker,
}

impl ConsentEnv {
    fn new() -> ConsentEnv {
        let (t, dir) = tempdir();
        let home = dir.join("home");
        let proj = dir.join("proj");
        files(
            &home,
            &[
                (".ssh/id_rsa", "PRIVATE KEY"),
                ("ssh/notes.txt", "decoy"),
                (".config/app/settings", "hidden settings"),
                ("config/app/settings", "decoy settings"),
                ("docs/readme.txt", "docs"),
            ],
        );
        files(&proj, &[("c/g.txt", "gee"), ("e/e.txt", "e")]);
        files(&dir, &[("outside/o.txt", "outside")]);
        symlink("c", proj.join("lc")).unwrap();
        symlink("../outside", proj.join("link_out")).unwrap();
        let asker = Asker::new(&dir.join("asker"));
        let policy = dir.join("policy").join("policy.toml");
        std::fs::create_dir(policy.parent().unwrap()).unwrap();
        std::fs::write(
            &policy,
            policy_text(
                vec![
                    RootToml::at(&home).name("home").consent("prompt"),
                    RootToml::at(&proj).name("proj").rw().consent("prompt"),
                ],
                Some(&asker.table("all")),
            ),
        )
        .unwrap();
        ConsentEnv {
            _t: t,
            home,
            proj,
            policy,
            asker,
        }
    }

    fn serve(&self) -> Fsb {
        serve(&self.policy)
    }

    fn roots(&self) -> [&Path; 2] {
        [&self.home, &self.proj]
    }

    fn home(&self, rel: &str) -> String {
        s(&self.home.join(rel))
    }

    fn proj(&self, rel: &str) -> String {
        s(&self.proj.join(rel))
    }
}

/// Today the leading dot of a name at the top of a root is stripped: `home/.ssh` is asked
/// and approved as `…/home/ssh`, and both `.ssh` and the decoy `ssh` become readable.
#[test]
fn consent_keeps_the_leading_dot_of_a_name_at_the_top_of_a_root() {
    let env = ConsentEnv::new();
    let abs = env.home(".ssh");
    let as_uri = uri(&env.home.join(".ssh"));
    for spelling in ["home/.ssh", abs.as_str(), as_uri.as_str()] {
        env.asker.clear();
        let mut b = env.serve();
        let approved = consent(&mut b, &[spelling], &env.roots());
        assert_eq!(approved, [env.home(".ssh")], "{spelling}");
        assert_eq!(env.asker.last_paths(), [env.home(".ssh")], "{spelling}");
        // The approved subtree, and nothing beside it.
        read_ok(&mut b, "home/.ssh/id_rsa", "PRIVATE KEY");
        no_consent(&mut b, "home/ssh/notes.txt");
        no_consent(&mut b, "home/docs/readme.txt");
    }
}

/// The same below the top: `.config/app` keeps its dot.
#[test]
fn consent_keeps_the_leading_dot_of_a_hidden_directory_deeper_down() {
    let env = ConsentEnv::new();
    let mut b = env.serve();
    let approved = consent(&mut b, &["home/.config/app"], &env.roots());
    assert_eq!(approved, [env.home(".config/app")]);
    assert_eq!(env.asker.last_paths(), [env.home(".config/app")]);
    read_ok(&mut b, "home/.config/app/settings", "hidden settings");
    no_consent(&mut b, "home/config/app/settings");
}

/// Today `proj/link_out -> ../outside` is asked about and approved as `…/proj/link_out`.
#[test]
fn consent_never_approves_a_symlink_leading_out_of_its_root() {
    let env = ConsentEnv::new();
    let mut b = env.serve();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["proj/link_out"]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    assert!(
        env.asker.asked().is_empty(),
        "the command was asked about a link leading out: {:?}",
        env.asker.asked()
    );

    // Alongside an approvable path: that one is asked and approved, the link never.
    let approved = consent(&mut b, &["proj/link_out", "proj/e"], &env.roots());
    assert_eq!(approved, [env.proj("e")]);
    assert_eq!(env.asker.last_paths(), [env.proj("e")]);
    let asked = env.asker.all_paths();
    assert!(
        !asked
            .iter()
            .any(|p| p.contains("link_out") || p.contains("outside")),
        "{asked:?}"
    );
    read_ok(&mut b, "proj/e/e.txt", "e");
    // Nothing through the link.
    let e = b.err("files/read", json!({"path": "proj/link_out/o.txt"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    assert_eq!(e["data"]["path"], "proj/link_out/o.txt", "{e}");
    no_consent(&mut b, "proj/c/g.txt");
}

/// Control: a symlink that stays inside the root is asked and approved as its target.
#[test]
fn consent_through_a_symlink_inside_the_root_approves_its_target() {
    let env = ConsentEnv::new();
    let mut b = env.serve();
    let approved = consent(&mut b, &["proj/lc"], &env.roots());
    assert_eq!(approved, [env.proj("c")]);
    assert_eq!(env.asker.last_paths(), [env.proj("c")]);
    read_ok(&mut b, "proj/c/g.txt", "gee");
    read_ok(&mut b, "proj/lc/g.txt", "gee");
    no_consent(&mut b, "proj/e/e.txt");
}

/// A path that does not exist yet is its deepest existing ancestor, resolved, plus the rest.
/// Today `proj/lc/new/dir` is approved as `…/proj/lc/new/dir` (not resolved), and
/// `proj/link_out/new/dir` as `…/proj/link_out/new/dir` (leading out).
#[test]
fn consent_for_a_path_not_there_yet_resolves_its_deepest_existing_ancestor() {
    let env = ConsentEnv::new();
    let mut b = env.serve();
    // Control: beneath the root itself, nothing to resolve.
    let approved = consent(&mut b, &["proj/new/dir"], &env.roots());
    assert_eq!(approved, [env.proj("new/dir")]);
    assert_eq!(env.asker.last_paths(), [env.proj("new/dir")]);

    // Beneath a symlink that stays inside: its target.
    let approved = consent(&mut b, &["proj/lc/new/dir"], &env.roots());
    assert_eq!(approved, [env.proj("c/new/dir")]);
    assert_eq!(env.asker.last_paths(), [env.proj("c/new/dir")]);
    // The grant covers the subtree once it exists (made here, not through the broker: making
    // `c/new` is not what was approved).
    mkdirs(&env.proj, &["c/new/dir"]);
    b.ok(
        "files/write",
        json!({"path": "proj/c/new/dir/f.txt", "content": "made"}),
    );
    read_ok(&mut b, "proj/c/new/dir/f.txt", "made");
    assert_eq!(
        std::fs::read_to_string(env.proj.join("c/new/dir/f.txt")).unwrap(),
        "made"
    );
    no_consent(&mut b, "proj/c/g.txt");

    // Beneath a symlink leading out: never asked, never approved.
    env.asker.clear();
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["proj/link_out/new/dir"]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    assert!(
        env.asker.asked().is_empty(),
        "asked about a path beneath a link leading out: {:?}",
        env.asker.asked()
    );
    assert!(!env.proj.join("../outside/new").exists());
}

/// A mix: the command is asked about exactly the canonical approvable paths, and
/// `approvedPaths` is that same list.
#[test]
fn consent_asks_and_approves_exactly_the_canonical_paths() {
    let env = ConsentEnv::new();
    let mut b = env.serve();
    let abs_lc = env.proj("lc");
    let approved = consent(
        &mut b,
        &[
            "home/.ssh",
            "proj/link_out",
            "proj/lc",
            &abs_lc, // the same as proj/lc: once
            "/etc",
            "proj/../outside",
            "proj/new/dir",
            "proj/link_out/x",
        ],
        &env.roots(),
    );
    let want = BTreeSet::from([env.home(".ssh"), env.proj("c"), env.proj("new/dir")]);
    assert_eq!(approved.iter().cloned().collect::<BTreeSet<_>>(), want);
    assert_eq!(approved.len(), want.len(), "{approved:?}");
    let asked = env.asker.last_paths();
    assert_eq!(asked.iter().cloned().collect::<BTreeSet<_>>(), want);
    assert_eq!(asked.len(), want.len(), "{asked:?}");
    read_ok(&mut b, "home/.ssh/id_rsa", "PRIVATE KEY");
    no_consent(&mut b, "home/ssh/notes.txt");
    no_consent(&mut b, "proj/e/e.txt");
}

// ---------------------------------------------------------------------------------------------
// 2. A directory rename lands no file on a denied name
// ---------------------------------------------------------------------------------------------

const PROJ_DENY: &[&str] = &[".github/workflows/*", "secrets/*", "**/.env"];

/// `T/proj` (read-write, auto, [`PROJ_DENY`]) holding an empty `.github/`, and `T/other`
/// (read-write, auto, no globs).
struct RenameEnv {
    _t: tempfile::TempDir,
    dir: PathBuf,
    proj: PathBuf,
    other: PathBuf,
    b: Fsb,
}

impl RenameEnv {
    fn new() -> RenameEnv {
        let (t, dir) = tempdir();
        let proj = dir.join("proj");
        let other = dir.join("other");
        mkdirs(&proj, &[".github"]);
        std::fs::create_dir_all(&other).unwrap();
        let policy = dir.join("policy").join("policy.toml");
        std::fs::create_dir(policy.parent().unwrap()).unwrap();
        std::fs::write(
            &policy,
            policy_text(
                vec![
                    RootToml::at(&proj).name("proj").rw().deny(PROJ_DENY),
                    RootToml::at(&other).name("other").rw(),
                ],
                None,
            ),
        )
        .unwrap();
        let b = serve(&policy);
        RenameEnv {
            _t: t,
            dir,
            proj,
            other,
            b,
        }
    }

    /// Makes a directory and writes files in it through the broker.
    fn make(&mut self, dir: &str, files: &[(&str, &str)]) {
        self.b
            .ok("files/create", json!({"path": dir, "type": "directory"}));
        for (f, text) in files {
            self.b.ok(
                "files/write",
                json!({"path": format!("{dir}/{f}"), "content": text}),
            );
        }
    }

    /// A directory rename that must be refused "denied by policy" naming `new`, with
    /// nothing moved anywhere.
    fn rename_refused(&mut self, old: &str, new: &str, overwrite: bool) {
        let params = json!({"oldPath": old, "newPath": new, "overwrite": overwrite});
        refused(
            &mut self.b,
            &self.dir,
            "files/rename",
            params,
            new,
            Reason::Is("denied by policy"),
        );
    }
}

/// Today `proj/wf` renamed to `proj/.github/workflows` lands `workflows/evil.yml`, which no
/// write may create.
#[test]
fn directory_rename_onto_the_workflows_directory_is_refused() {
    let mut env = RenameEnv::new();
    // The name is denied to a write.
    refused(
        &mut env.b,
        &env.dir,
        "files/write",
        json!({"path": "proj/.github/workflows/evil.yml", "content": "on: push"}),
        "proj/.github/workflows/evil.yml",
        Reason::Is("denied by policy"),
    );
    env.make("proj/wf", &[("evil.yml", "on: push")]);
    env.rename_refused("proj/wf", "proj/.github/workflows", false);
    assert_eq!(
        std::fs::read_to_string(env.proj.join("wf/evil.yml")).unwrap(),
        "on: push"
    );
    assert!(!env.proj.join(".github/workflows").exists());
    // Control: the same directory moves where its entries are allowed.
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/wf", "newPath": "proj/.github/ci"}),
    );
    assert_eq!(
        std::fs::read_to_string(env.proj.join(".github/ci/evil.yml")).unwrap(),
        "on: push"
    );
}

/// The name `secrets` is allowed; its entries are not.
#[test]
fn directory_rename_into_secrets_is_refused() {
    let mut env = RenameEnv::new();
    env.make("proj/wf", &[("key.pem", "k")]);
    env.rename_refused("proj/wf", "proj/secrets", false);
    assert!(env.proj.join("wf/key.pem").is_file());
    assert!(!env.proj.join("secrets").exists());
    // Control: the directory itself may be made, and empty it may be renamed there.
    env.b.ok(
        "files/create",
        json!({"path": "proj/empty", "type": "directory"}),
    );
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/empty", "newPath": "proj/secrets"}),
    );
    assert!(env.proj.join("secrets").is_dir());
    let e = env.b.err(
        "files/write",
        json!({"path": "proj/secrets/key.pem", "content": "k"}),
    );
    assert_denied(&e, "proj/secrets/key.pem", Reason::Is("denied by policy"));
}

/// Files deep in the moved tree: `workflows/a` is a denied name even though the files are
/// further down.
#[test]
fn deep_tree_rename_onto_a_denied_prefix_is_refused() {
    let mut env = RenameEnv::new();
    env.make("proj/wf", &[]);
    env.make("proj/wf/a", &[]);
    env.make("proj/wf/a/b", &[("c.yml", "on: push")]);
    env.rename_refused("proj/wf", "proj/.github/workflows", false);
    assert!(env.proj.join("wf/a/b/c.yml").is_file());
    assert!(!env.proj.join(".github/workflows").exists());
}

/// `overwrite: true` onto an existing empty directory whose entries are denied.
#[test]
fn directory_rename_over_an_empty_directory_is_refused() {
    let mut env = RenameEnv::new();
    mkdirs(&env.proj, &[".github/workflows"]);
    env.make("proj/wf", &[("evil.yml", "on: push")]);
    env.rename_refused("proj/wf", "proj/.github/workflows", true);
    assert!(env.proj.join("wf/evil.yml").is_file());
    let left: Vec<_> = std::fs::read_dir(env.proj.join(".github/workflows"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // Control: the same overwrite onto an allowed empty directory.
    mkdirs(&env.proj, &["docs"]);
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/wf", "newPath": "proj/docs", "overwrite": true}),
    );
    assert!(env.proj.join("docs/evil.yml").is_file());
}

/// From a root without globs into one with them: the destination's globs decide.
#[test]
fn cross_root_directory_rename_onto_the_workflows_directory_is_refused() {
    let mut env = RenameEnv::new();
    env.make("other/wf", &[("evil.yml", "on: push")]);
    env.rename_refused("other/wf", "proj/.github/workflows", false);
    assert!(env.other.join("wf/evil.yml").is_file());
    assert!(!env.proj.join(".github/workflows").exists());
    // Into `secrets`, replacing an empty directory.
    mkdirs(&env.proj, &["secrets"]);
    env.rename_refused("other/wf", "proj/secrets", true);
    assert!(env.other.join("wf/evil.yml").is_file());
    // Control: the same cross-root move of allowed entries.
    env.make("other/ok", &[("readme.txt", "r")]);
    env.b.ok(
        "files/rename",
        json!({"oldPath": "other/ok", "newPath": "proj/.github/ok"}),
    );
    assert_eq!(
        std::fs::read_to_string(env.proj.join(".github/ok/readme.txt")).unwrap(),
        "r"
    );
    assert!(!env.other.join("ok").exists());
}

/// A `.env` deep in a tree of a root without globs would land on `**/.env` in `proj`.
#[test]
fn cross_root_rename_of_a_tree_holding_a_deep_env_is_refused() {
    let mut env = RenameEnv::new();
    env.make("other/app", &[]);
    env.make("other/app/a", &[]);
    env.make(
        "other/app/a/b",
        &[(".env", "TOKEN=1"), ("main.rs", "fn main() {}")],
    );
    env.rename_refused("other/app", "proj/app", false);
    assert_eq!(
        std::fs::read_to_string(env.other.join("app/a/b/.env")).unwrap(),
        "TOKEN=1"
    );
    assert!(!env.proj.join("app").exists());
    // Control: without the `.env` the same tree moves.
    env.b
        .ok("files/delete", json!({"path": "other/app/a/b/.env"}));
    env.b.ok(
        "files/rename",
        json!({"oldPath": "other/app", "newPath": "proj/app"}),
    );
    assert!(env.proj.join("app/a/b/main.rs").is_file());
}

/// Control: directory renames whose entries are all allowed work, inside and across roots,
/// deep trees and `overwrite` included.
#[test]
fn directory_renames_of_allowed_entries_still_work() {
    let mut env = RenameEnv::new();
    env.make("proj/wf", &[("evil.yml", "y")]);
    env.make("proj/wf/a", &[]);
    env.make("proj/wf/a/b", &[("c.txt", "c")]);
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/wf", "newPath": "proj/.github/other"}),
    );
    assert!(env.proj.join(".github/other/a/b/c.txt").is_file());
    mkdirs(&env.proj, &["empty"]);
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/.github/other", "newPath": "proj/empty", "overwrite": true}),
    );
    assert!(env.proj.join("empty/evil.yml").is_file());
    env.b.ok(
        "files/rename",
        json!({"oldPath": "proj/empty", "newPath": "other/moved"}),
    );
    assert!(env.other.join("moved/a/b/c.txt").is_file());
    assert!(!env.proj.join("empty").exists());
}

// ---------------------------------------------------------------------------------------------
// 3. Overlapping roots
// ---------------------------------------------------------------------------------------------

/// `T/outer` (read-write, auto, no globs) and, at `T/outer/<inner_rel>`, `inner` (read-only,
/// `inner_consent`, deny `secret.txt`):
///
/// ```text
/// outer/x.txt   outer/plain/p.txt
/// outer/<inner_rel>/ro.txt   outer/<inner_rel>/secret.txt
/// ```
struct Nested {
    _t: tempfile::TempDir,
    dir: PathBuf,
    outer: PathBuf,
    inner: PathBuf,
    policy: PathBuf,
}

impl Nested {
    fn new(inner_rel: &str, inner_consent: &str) -> Nested {
        let (t, dir) = tempdir();
        let outer = dir.join("outer");
        let inner = outer.join(inner_rel);
        files(&outer, &[("x.txt", "x"), ("plain/p.txt", "p")]);
        files(&inner, &[("ro.txt", "read only"), ("secret.txt", "SECRET")]);
        let policy = dir.join("policy").join("policy.toml");
        std::fs::create_dir(policy.parent().unwrap()).unwrap();
        std::fs::write(
            &policy,
            policy_text(
                vec![
                    RootToml::at(&outer).name("outer").rw(),
                    RootToml::at(&inner)
                        .name("inner")
                        .consent(inner_consent)
                        .deny(&["secret.txt"]),
                ],
                Some("terminal = false"),
            ),
        )
        .unwrap();
        Nested {
            _t: t,
            dir,
            outer,
            inner,
            policy,
        }
    }

    fn serve(&self) -> Fsb {
        serve(&self.policy)
    }

    fn inner_listed(&self, b: &mut Fsb) -> bool {
        let want = entry("inner", &self.inner);
        roots(b).contains(&want)
    }
}

/// Today `outer/inner/secret.txt` is read through the outer root, and listed.
#[test]
fn nested_deny_globs_apply_through_the_outer_root() {
    let env = Nested::new("inner", "auto");
    let mut b = env.serve();
    // Control: the file is readable through the outer root when it is not denied.
    read_ok(&mut b, "outer/inner/ro.txt", "read only");
    let secret = env.inner.join("secret.txt");
    let abs = s(&secret);
    let as_uri = uri(&secret);
    for p in [
        "outer/inner/secret.txt",
        "outer/plain/../inner/secret.txt",
        "inner/secret.txt",
        abs.as_str(),
        as_uri.as_str(),
    ] {
        let e = b.err("files/read", json!({"path": p}));
        assert_denied(&e, p, Reason::Is("denied by policy"));
    }
    let names = listed(&mut b, "outer/inner", false);
    assert!(
        names.contains(&"outer/inner/ro.txt".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.ends_with("secret.txt")),
        "a denied file is listed: {names:?}"
    );
    let names = listed(&mut b, "outer", true);
    assert!(
        names.contains(&"outer/inner/ro.txt".to_owned()),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|n| n.ends_with("secret.txt")),
        "a denied file is listed: {names:?}"
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "SECRET");
}

/// A symlink in the outer root leading into the inner one: the request names `outer`, the
/// file is the inner root's.
#[test]
fn nested_rules_apply_through_a_symlink_in_the_outer_root() {
    let env = Nested::new("inner", "auto");
    symlink("inner", env.outer.join("to_inner")).unwrap();
    let mut b = env.serve();
    // Control.
    read_ok(&mut b, "outer/to_inner/ro.txt", "read only");
    let e = b.err("files/read", json!({"path": "outer/to_inner/secret.txt"}));
    assert_denied(
        &e,
        "outer/to_inner/secret.txt",
        Reason::Is("denied by policy"),
    );
    refused(
        &mut b,
        &env.dir,
        "files/write",
        json!({"path": "outer/to_inner/ro.txt", "content": "changed"}),
        "outer/to_inner/ro.txt",
        Reason::Is("read-only root"),
    );
}

/// Today `outer/inner/ro.txt` is written, deleted, and created beside, through the outer root.
#[test]
fn nested_read_only_mode_applies_through_the_outer_root() {
    let env = Nested::new("inner", "auto");
    let mut b = env.serve();
    let ro = Reason::Is("read-only root");
    // Controls: the same requests in the outer root proper.
    b.ok(
        "files/write",
        json!({"path": "outer/x.txt", "content": "x2"}),
    );
    b.ok(
        "files/create",
        json!({"path": "outer/plain/new.txt", "type": "file"}),
    );
    b.ok("files/delete", json!({"path": "outer/plain/new.txt"}));

    let abs = s(&env.inner.join("ro.txt"));
    for p in ["outer/inner/ro.txt", abs.as_str()] {
        refused(
            &mut b,
            &env.dir,
            "files/write",
            json!({"path": p, "content": "changed"}),
            p,
            ro,
        );
    }
    refused(
        &mut b,
        &env.dir,
        "files/delete",
        json!({"path": "outer/inner/ro.txt"}),
        "outer/inner/ro.txt",
        ro,
    );
    refused(
        &mut b,
        &env.dir,
        "files/create",
        json!({"path": "outer/inner/new.txt", "type": "file"}),
        "outer/inner/new.txt",
        ro,
    );
    refused(
        &mut b,
        &env.dir,
        "files/create",
        json!({"path": "outer/inner/newdir", "type": "directory"}),
        "outer/inner/newdir",
        ro,
    );
    refused(
        &mut b,
        &env.dir,
        "files/write",
        json!({"path": "outer/inner/new.txt", "content": "n"}),
        "outer/inner/new.txt",
        ro,
    );
    refused(
        &mut b,
        &env.dir,
        "files/rename",
        json!({"oldPath": "outer/x.txt", "newPath": "outer/inner/x.txt"}),
        "outer/inner/x.txt",
        ro,
    );
    refused(
        &mut b,
        &env.dir,
        "files/rename",
        json!({"oldPath": "outer/inner/ro.txt", "newPath": "outer/ro.txt"}),
        "outer/inner/ro.txt",
        ro,
    );
    assert_eq!(
        std::fs::read_to_string(env.inner.join("ro.txt")).unwrap(),
        "read only"
    );
}

/// Today `files/rename outer/inner → outer/moved` moves the inner root away (and retires it).
#[test]
fn a_nested_root_is_never_renamed_deleted_or_replaced_through_the_outer_root() {
    let env = Nested::new("inner", "auto");
    let mut b = env.serve();
    assert!(env.inner_listed(&mut b));
    refused(
        &mut b,
        &env.dir,
        "files/rename",
        json!({"oldPath": "outer/inner", "newPath": "outer/moved"}),
        "outer/inner",
        Reason::StartsWith("the root itself"),
    );
    refused(
        &mut b,
        &env.dir,
        "files/delete",
        json!({"path": "outer/inner", "recursive": true}),
        "outer/inner",
        Reason::StartsWith("the root itself"),
    );
    refused(
        &mut b,
        &env.dir,
        "files/rename",
        json!({"oldPath": "outer/x.txt", "newPath": "outer/inner", "overwrite": true}),
        "outer/inner",
        Reason::StartsWith("the root itself"),
    );
    assert!(!env.outer.join("moved").exists());
    read_ok(&mut b, "inner/ro.txt", "read only");
    assert!(env.inner_listed(&mut b), "the inner root was retired");
    // Controls: a plain directory of the outer root is renamed and deleted.
    b.ok(
        "files/rename",
        json!({"oldPath": "outer/plain", "newPath": "outer/moved"}),
    );
    b.ok(
        "files/delete",
        json!({"path": "outer/moved", "recursive": true}),
    );
    assert!(!env.outer.join("moved").exists() && !env.outer.join("plain").exists());
}

/// Today renaming or recursively deleting `outer/mid`, which holds the root `inner`, works.
#[test]
fn a_directory_holding_a_root_is_protected() {
    let env = Nested::new("mid/inner", "auto");
    let mut b = env.serve();
    assert!(env.inner_listed(&mut b));
    refused(
        &mut b,
        &env.dir,
        "files/rename",
        json!({"oldPath": "outer/mid", "newPath": "outer/mid2"}),
        "outer/mid",
        Reason::StartsWith("protected"),
    );
    refused(
        &mut b,
        &env.dir,
        "files/delete",
        json!({"path": "outer/mid", "recursive": true}),
        "outer/mid",
        Reason::StartsWith("protected"),
    );
    let abs = s(&env.outer.join("mid"));
    refused(
        &mut b,
        &env.dir,
        "files/delete",
        json!({"path": abs, "recursive": true}),
        &abs,
        Reason::StartsWith("protected"),
    );
    assert_eq!(
        std::fs::read_to_string(env.inner.join("ro.txt")).unwrap(),
        "read only"
    );
    read_ok(&mut b, "inner/ro.txt", "read only");
    assert!(env.inner_listed(&mut b), "the inner root was retired");
    // Controls: the same requests on a directory that holds no root.
    b.ok(
        "files/rename",
        json!({"oldPath": "outer/plain", "newPath": "outer/plain2"}),
    );
    b.ok(
        "files/delete",
        json!({"path": "outer/plain2", "recursive": true}),
    );
    assert!(!env.outer.join("plain2").exists());
}

/// A nested `deny` root refuses through the outer root too; today the outer root's `auto`
/// lets `outer/inner/ro.txt` be read and even approved.
#[test]
fn nested_consent_applies_through_the_outer_root() {
    let env = Nested::new("inner", "deny");
    let mut b = env.serve();
    // Controls.
    read_ok(&mut b, "outer/x.txt", "x");
    no_consent(&mut b, "inner/ro.txt");
    // Through the outer root.
    no_consent(&mut b, "outer/inner/ro.txt");
    let e = b.err("files/list", json!({"path": "outer/inner"}));
    assert_denied(&e, "outer/inner", Reason::Is("no consent"));
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["outer/inner/ro.txt", "outer/inner"]}),
    );
    assert_eq!(r, json!({"granted": false, "approvedPaths": []}));
    no_consent(&mut b, "outer/inner/ro.txt");
}

/// A nested `prompt` root: consent asked for the `auto` outer root (approved without asking
/// anyone) must not grant the prompt root inside it; nobody was asked about it.
#[test]
fn consent_for_an_auto_outer_root_does_not_grant_a_prompt_root_inside() {
    let env = Nested::new("inner", "prompt");
    let mut b = env.serve();
    no_consent(&mut b, "outer/inner/ro.txt");
    let r = b.ok(
        "files/consent",
        json!({"message": "m", "requestedPaths": ["outer", "outer/x.txt"]}),
    );
    assert_eq!(r["granted"], true, "{r}");
    // Control: the outer root's own files need no grant at all.
    read_ok(&mut b, "outer/plain/p.txt", "p");
    no_consent(&mut b, "outer/inner/ro.txt");
    no_consent(&mut b, "inner/ro.txt");
    assert!(
        !env.inner_listed(&mut b),
        "roots/list lists the ungranted prompt root"
    );
}

/// Overlap is allowed (with the strictest rules): `policy check` says ok.
#[test]
fn policy_check_accepts_overlapping_roots() {
    for (rel, consent) in [("inner", "auto"), ("mid/inner", "deny")] {
        let env = Nested::new(rel, consent);
        let out = Command::new(bin())
            .args(["policy", "check"])
            .arg(&env.policy)
            .output()
            .expect("run fsbroker policy check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{rel}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("outer") && stdout.contains("inner"),
            "{stdout}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. roots/list lists only what the session may use now
// ---------------------------------------------------------------------------------------------

/// Roots `a` (auto), `p` (prompt), `d` (deny), each read-only:
/// `a/a.txt`, `p/other.txt`, `p/sub/f.txt`, `d/d.txt`.
struct ListEnv {
    _t: tempfile::TempDir,
    a: PathBuf,
    p: PathBuf,
    d: PathBuf,
    policy: PathBuf,
    asker: Asker,
    /// The file the `@FILE` mode of the consent command reads its answer from.
    answer: PathBuf,
}

impl ListEnv {
    fn new() -> ListEnv {
        let (t, dir) = tempdir();
        let (a, p, d) = (dir.join("a"), dir.join("p"), dir.join("d"));
        files(&a, &[("a.txt", "a")]);
        files(&p, &[("other.txt", "other"), ("sub/f.txt", "sub f")]);
        files(&d, &[("d.txt", "d")]);
        let asker = Asker::new(&dir.join("asker"));
        let policy = dir.join("policy").join("policy.toml");
        std::fs::create_dir(policy.parent().unwrap()).unwrap();
        ListEnv {
            _t: t,
            a,
            p,
            d,
            policy,
            answer: dir.join("asker").join("answer"),
            asker,
        }
    }

    /// Writes the policy with `p`'s consent mode and the `[consent]` body.
    fn text(&self, p_consent: &str, consent: &str) -> String {
        policy_text(
            vec![
                RootToml::at(&self.a).name("a"),
                RootToml::at(&self.p).name("p").consent(p_consent),
                RootToml::at(&self.d).name("d").consent("deny"),
            ],
            Some(consent),
        )
    }

    fn answer(&self, mode: &str) {
        std::fs::write(&self.answer, mode).unwrap();
    }

    fn switchable(&self) -> String {
        self.asker.table(&format!("@{}", s(&self.answer)))
    }
}

/// Today `roots/list` lists all three roots.
#[test]
fn roots_list_lists_only_auto_roots_when_nobody_can_be_asked() {
    let env = ListEnv::new();
    std::fs::write(&env.policy, env.text("prompt", "terminal = false")).unwrap();
    let mut b = serve(&env.policy);
    assert_eq!(roots(&mut b), BTreeSet::from([entry("a", &env.a)]));
    // The roots not listed are indeed not usable; the listed one is.
    read_ok(&mut b, "a/a.txt", "a");
    no_consent(&mut b, "p/other.txt");
    no_consent(&mut b, "d/d.txt");
    assert_eq!(roots(&mut b), BTreeSet::from([entry("a", &env.a)]));
}

/// Today the command is never asked and `d` is listed.
#[test]
fn roots_list_offers_prompt_roots_to_the_command() {
    let env = ListEnv::new();
    std::fs::write(&env.policy, env.text("prompt", &env.asker.table("all"))).unwrap();
    let mut b = serve(&env.policy);
    let listed = roots(&mut b);
    let offered = env.asker.all_paths();
    assert!(
        offered.contains(&s(&env.p)),
        "the prompt root was not offered: {offered:?}"
    );
    assert!(
        !offered.iter().any(|p| Path::new(p).starts_with(&env.d)),
        "a deny root was offered: {offered:?}"
    );
    assert_eq!(
        listed,
        BTreeSet::from([entry("a", &env.a), entry("p", &env.p)])
    );
    // What is listed is usable; `d` is not.
    read_ok(&mut b, "p/other.txt", "other");
    read_ok(&mut b, "p/sub/f.txt", "sub f");
    no_consent(&mut b, "d/d.txt");
    assert_eq!(
        roots(&mut b),
        BTreeSet::from([entry("a", &env.a), entry("p", &env.p)])
    );
}

/// Refused on the first `roots/list`, `p` is not listed; a later grant of `p/sub` is (after
/// `notifications/roots/list_changed`), and turning `p` to `deny` withdraws it (after another).
#[test]
fn roots_list_follows_grants_and_their_revocation() {
    let env = ListEnv::new();
    env.answer("none");
    std::fs::write(&env.policy, env.text("prompt", &env.switchable())).unwrap();
    let mut b = serve(&env.policy);
    let only_a = BTreeSet::from([entry("a", &env.a)]);
    assert_eq!(roots(&mut b), only_a);
    no_consent(&mut b, "p/sub/f.txt");
    drain_notifications(&mut b, Duration::from_millis(200));

    env.answer("all");
    let approved = consent(&mut b, &["p/sub"], &[&env.p]);
    assert_eq!(approved, [s(&env.p.join("sub"))]);
    expect_list_changed(&mut b, "after the grant of p/sub");
    // Whatever a later roots/list might ask again is refused.
    env.answer("none");
    let with_sub = BTreeSet::from([entry("a", &env.a), entry("p/sub", &env.p.join("sub"))]);
    assert_eq!(roots(&mut b), with_sub);
    read_ok(&mut b, "p/sub/f.txt", "sub f");
    no_consent(&mut b, "p/other.txt");
    no_consent(&mut b, "d/d.txt");

    // Revoked by a reload that turns `p` to deny.
    drain_notifications(&mut b, Duration::ZERO);
    replace_file(&env.policy, &env.text("deny", &env.switchable()));
    expect_list_changed(&mut b, "after p turned deny");
    assert_eq!(roots(&mut b), only_a);
    no_consent(&mut b, "p/sub/f.txt");
}

// ---------------------------------------------------------------------------------------------
// 5. A no-op rename is no probe
// ---------------------------------------------------------------------------------------------

/// Today `dirA` (holding only a denied `.env`) answers "holds paths denied by policy" while
/// the empty `dirB` answers `{}`.
#[test]
fn no_op_rename_answers_the_same_whether_or_not_denied_entries_hide_inside() {
    let (_t, dir) = tempdir();
    let root = dir.join("r");
    mkdirs(&root, &["dirA", "dirB", "deepA/x/y", "deepB/x/y"]);
    files(&root, &[("dirA/.env", "K=V"), ("deepA/x/y/.env", "K=V")]);
    let policy = dir.join("policy").join("policy.toml");
    std::fs::create_dir(policy.parent().unwrap()).unwrap();
    std::fs::write(
        &policy,
        policy_text(
            vec![RootToml::at(&root).name("r").rw().deny(&["**/.env"])],
            None,
        ),
    )
    .unwrap();
    let mut b = serve(&policy);

    for (hiding, empty) in [("dirA", "dirB"), ("deepA", "deepB")] {
        let (h, e) = (format!("r/{hiding}"), format!("r/{empty}"));
        // Both look the same to the server.
        let seen_h = listed(&mut b, &h, true);
        let seen_e = listed(&mut b, &e, true);
        let seen_h: Vec<String> = seen_h.iter().map(|p| p.replacen(&h, &e, 1)).collect();
        assert_eq!(seen_h, seen_e, "the listings differ");

        let before = snapshot(&dir);
        let mut answers = Vec::new();
        for p in [&h, &e] {
            let mut r = b.request("files/rename", json!({"oldPath": p, "newPath": p}));
            r.as_object_mut().unwrap().remove("id");
            answers.push(r.to_string().replace(p.as_str(), "PATH"));
        }
        assert_eq!(
            answers[0], answers[1],
            "a no-op rename of {h} (hiding a denied entry) answers unlike one of {empty}"
        );
        assert_eq!(snapshot(&dir), before, "a no-op rename changed the disk");
    }
    assert_eq!(
        std::fs::read_to_string(root.join("dirA/.env")).unwrap(),
        "K=V"
    );
}

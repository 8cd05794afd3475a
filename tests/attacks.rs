//! Attack corpus: hostile request paths against `files/read` and `files/list`, through the
//! real binary over real pipes, on a real tree full of traps.
//!
//! Layout (in a fresh temp dir `T`):
//! ```text
//! T/outside/secret.txt, T/outside/only-outside.txt   outside the root, hold MARKER
//! T/proj_evil/secret                                  prefix sibling of the root (CVE-2025-53110)
//! T/proj/                                             the root: files, a subdir, and
//!     symlinks out (relative, absolute, to files and dirs: CVE-2025-53109), a loop, a
//!     self-loop, a chain ending outside, an absolute symlink back inside, a FIFO, a socket,
//!     and files the policy variant denies (.env, .git/, secrets/) plus symlinks to them
//! T/second/                                           the second root of the policy variant
//! ```
//! Every case is a row of a table; one `check` runs a row against one method and asserts the
//! exact `data.code`, the numeric code, `data.path` echoing the request, the reason for
//! confinement and deny refusals, and that no marker byte appears on the wire.
//!
//! One file though long: its tables share one tree of traps and one runner, and the hostile-
//! case counts it prints are this file's; split, a row could land where no runner checks it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::time::{Duration, Instant};

use common::hostile::{
    A_TXT, B_TXT, DENIED, DENIED_MARKER, MARKER, OUTSIDE, S_TXT, World, number, put, shown_str,
};
use common::{Fsb, code};
use serde_json::{Value, json};

/// Names that exist only outside the root: no listing may show them.
const OUTSIDE_NAMES: &[&str] = &["secret.txt", "only-outside", "proj_evil"];
/// "Fail at once": far above any honest answer, far below a blocked FIFO.
const AT_ONCE: Duration = Duration::from_secs(5);

/// What a request must produce.
#[derive(Debug, Clone, Copy)]
enum Want {
    /// `files/read` succeeds with exactly this content.
    Content(&'static str),
    /// `files/list` succeeds (its entries are checked for outside names).
    Listed,
    /// Fails with this `data.code`.
    Code(&'static str),
    /// `PERMISSION_DENIED`, reason "outside every root".
    Outside,
    /// `PERMISSION_DENIED`, reason "denied by policy".
    Denied,
}

/// One row: a path, what `files/read` and `files/list` must answer, and whether it is a
/// hostile case or a control showing that the same spelling does work inside the root.
struct Case {
    desc: &'static str,
    path: String,
    read: Want,
    list: Want,
    control: bool,
}

/// A hostile row with the same expectation for both methods.
fn both(desc: &'static str, path: impl Into<String>, want: Want) -> Case {
    each(desc, path, want, want)
}

/// A hostile row whose two methods answer differently.
fn each(desc: &'static str, path: impl Into<String>, read: Want, list: Want) -> Case {
    Case {
        desc,
        path: path.into(),
        read,
        list,
        control: false,
    }
}

/// A control row (the request must partly or fully work).
fn control(desc: &'static str, path: impl Into<String>, read: Want, list: Want) -> Case {
    Case {
        control: true,
        ..each(desc, path, read, list)
    }
}

/// Runs one row against one method and asserts everything the contract promises about it.
fn check(b: &mut Fsb, method: &str, case: &Case, want: Want, forbidden: &[&str]) {
    let ctx = format!("{method} [{}] {}", case.desc, shown_str(&case.path));
    let started = Instant::now();
    let resp = b.request(method, json!({ "path": case.path }));
    let took = started.elapsed();
    let raw = b.last_raw.clone();
    assert!(took < AT_ONCE, "{ctx}: took {took:?}; must answer at once");
    for secret in forbidden {
        assert!(!raw.contains(secret), "{ctx}: {secret} on the wire: {raw}");
    }
    let (want_code, want_reason) = match want {
        Want::Content(text) => {
            assert!(resp.get("error").is_none(), "{ctx}: should succeed: {resp}");
            assert_eq!(resp["result"]["content"], text, "{ctx}: {resp}");
            assert_eq!(resp["result"]["encoding"], "utf-8", "{ctx}: {resp}");
            return;
        }
        Want::Listed => {
            assert!(resp.get("error").is_none(), "{ctx}: should succeed: {resp}");
            assert!(resp["result"]["entries"].is_array(), "{ctx}: {resp}");
            for name in OUTSIDE_NAMES {
                assert!(
                    !raw.contains(name),
                    "{ctx}: outside name {name} listed: {raw}"
                );
            }
            return;
        }
        Want::Code(c) => (c, None),
        Want::Outside => ("PERMISSION_DENIED", Some(OUTSIDE)),
        Want::Denied => ("PERMISSION_DENIED", Some(DENIED)),
    };
    assert!(resp.get("result").is_none(), "{ctx}: should fail: {raw}");
    let err = &resp["error"];
    assert_eq!(code(err), want_code, "{ctx}: {raw}");
    assert_eq!(err["code"], json!(number(want_code)), "{ctx}: {raw}");
    assert_eq!(
        err["data"]["path"].as_str(),
        Some(case.path.as_str()),
        "{ctx}: data.path must echo the request: {raw}"
    );
    if let Some(reason) = want_reason {
        assert_eq!(err["data"]["reason"], reason, "{ctx}: {raw}");
    }
}

/// Runs every row against `files/read` and `files/list`; returns the number of hostile rows.
fn run_table(b: &mut Fsb, cases: &[Case], forbidden: &[&str]) -> usize {
    for case in cases {
        check(b, "files/read", case, case.read, forbidden);
        check(b, "files/list", case, case.list, forbidden);
    }
    cases.iter().filter(|c| !c.control).count()
}

/// The kit's trap tree (read-only roots) plus what only reads and listings try: a deeper
/// file, links to directories out and to the parent, a self-loop, a three-link chain out, an
/// absolute link back inside, a socket, a file named only outside, and a cross-root link.
fn world() -> World {
    let w = World::new(None);
    put(
        &w.base.join("outside/only-outside.txt"),
        &format!("{MARKER} only-outside\n"),
    );
    put(&w.proj.join("sub/deep/c.txt"), "inside c\n");
    w.link("../outside", "lnk_dir_rel");
    w.link(w.base.join("outside"), "lnk_dir_abs");
    w.link("..", "lnk_parent");
    w.link("..", "sub/lnk_root"); // proj itself: inside
    w.link("self_loop", "self_loop");
    w.link("chain2", "chain1");
    w.link("sub/chain3", "chain2");
    w.link("../../outside/secret.txt", "sub/chain3");
    w.link(w.proj.join("a.txt"), "abs_inside");
    // The socket file stays after the listener is dropped.
    drop(std::os::unix::net::UnixListener::bind(w.proj.join("sock")).expect("bind socket"));
    symlink("../proj/a.txt", w.second.join("lnk_cross_a")).unwrap();
    w
}

/// Runs `f` with a deadline; a broker stuck opening the FIFO is freed, and the test fails.
fn guarded(w: World, f: impl FnOnce(World) + Send + 'static) {
    w.guarded(Duration::from_secs(120), f)
}

fn single_root_cases(w: &World) -> Vec<Case> {
    use Want::{Code, Content, Listed, Outside};
    let t = w.base.to_str().unwrap();
    let p = w.proj.to_str().unwrap();
    let not_found = Code("FILE_NOT_FOUND");
    let invalid = Code("INVALID_PATH");
    vec![
        // `..` climbs, lexical.
        both("dotdot to a sibling", "../outside/secret.txt", Outside),
        both(
            "root name then climb",
            "proj/../../outside/secret.txt",
            Outside,
        ),
        both(
            "root name then one climb",
            "proj/../proj_evil/secret",
            Outside,
        ),
        both("out and back in", "proj/../proj/a.txt", Outside),
        both("dot then climb", "./../outside/secret.txt", Outside),
        both(
            "deep climb",
            "sub/deep/../../../outside/secret.txt",
            Outside,
        ),
        both("climb exactly one above", "sub/deep/../../..", Outside),
        both("climb through a file", "a.txt/../../outside", Outside),
        both(
            "doubled slashes",
            "proj//../..//outside/secret.txt",
            Outside,
        ),
        both("tilde then climb", "~/../../etc/passwd", Outside),
        // Absolute paths.
        both("absolute /etc/passwd", "/etc/passwd", Outside),
        both("double slash absolute", "//etc/passwd", Outside),
        both("absolute /proc root", "/proc/self/root/etc/passwd", Outside),
        both(
            "absolute outside file",
            format!("{t}/outside/secret.txt"),
            Outside,
        ),
        both(
            "prefix sibling (CVE-2025-53110)",
            format!("{t}/proj_evil/secret"),
            Outside,
        ),
        both("prefix sibling dir", format!("{t}/proj_evil"), Outside),
        both(
            "absolute in-and-out to the sibling",
            format!("{t}/proj/../proj_evil/secret"),
            Outside,
        ),
        both("parent of the root", t.to_owned(), Outside),
        // file:// URIs.
        both(
            "URI %2e%2e",
            format!("file://{p}/%2e%2e/outside/secret.txt"),
            Outside,
        ),
        both(
            "URI upper-case %2E%2E and scheme",
            format!("FILE://{p}/sub/%2E%2E/%2E%2E/outside/secret.txt"),
            Outside,
        ),
        both(
            "URI ..%2F..%2F",
            format!("file://{p}/..%2F..%2Foutside%2Fsecret.txt"),
            Outside,
        ),
        both(
            "URI %2e%2e%2f in one segment",
            format!("file://{p}/%2e%2e%2fproj_evil%2fsecret"),
            Outside,
        ),
        both("URI /etc/passwd", "file:///etc/passwd", Outside),
        both(
            "URI single slash outside",
            format!("file:{t}/outside/secret.txt"),
            Outside,
        ),
        both(
            "URI foreign host",
            format!("file://evil.example{p}/a.txt"),
            invalid,
        ),
        both("URI %00", format!("file://{p}/a.txt%00.png"), invalid),
        both(
            "URI query smuggling a climb",
            format!("file://{p}/a.txt?../../outside/secret.txt"),
            invalid,
        ),
        both("URI fragment", format!("file://{p}/a.txt#x"), invalid),
        // Malformed.
        both("empty path", "", invalid),
        both("NUL byte", "a.txt\0../../outside/secret.txt", invalid),
        both("5000-character path", "x/".repeat(2500), invalid),
        both("300-character component", "y".repeat(300), invalid),
        // Spellings that are plain names on Linux.
        both("trailing whitespace", "proj/a.txt ", not_found),
        both("leading whitespace", " proj/a.txt", not_found),
        both("double-quoted", "\"proj/a.txt\"", not_found),
        both("single-quoted", "'proj/a.txt'", not_found),
        both("backslash traversal", "..\\..\\etc\\passwd", not_found),
        both(
            "%2e%2e in a plain path",
            "%2e%2e/outside/secret.txt",
            not_found,
        ),
        both("..%2F in a plain path", "..%2F..%2Foutside", not_found),
        both(
            "fullwidth dots",
            "\u{ff0e}\u{ff0e}/outside/secret.txt",
            not_found,
        ),
        both("tilde is not home", "~/.ssh/id_rsa", not_found),
        both(
            "newline then climb",
            "a.txt\n../../outside/secret.txt",
            not_found,
        ),
        // `..` is lexical: through an inside symlink to the root it cannot reach the parent.
        both(
            "climb after a symlink to the root",
            "sub/lnk_root/../outside/secret.txt",
            not_found,
        ),
        both("missing file", "missing.txt", not_found),
        // Symlinks planted inside the root (CVE-2025-53109).
        both(
            "relative symlink to an outside file",
            "lnk_file_rel",
            Outside,
        ),
        both(
            "absolute symlink to an outside file",
            "lnk_file_abs",
            Outside,
        ),
        both("relative symlink to an outside dir", "lnk_dir_rel", Outside),
        both(
            "file through a relative dir symlink",
            "lnk_dir_rel/secret.txt",
            Outside,
        ),
        both("absolute symlink to an outside dir", "lnk_dir_abs", Outside),
        both(
            "file through an absolute dir symlink",
            "lnk_dir_abs/secret.txt",
            Outside,
        ),
        both("symlink to the prefix sibling", "lnk_evil", Outside),
        both(
            "symlink to the parent, then down",
            "lnk_parent/outside/secret.txt",
            Outside,
        ),
        both("symlink to the parent", "lnk_parent", Outside),
        both("chain ending outside", "chain1", Outside),
        both("chain ending outside, by name", "proj/chain1", Outside),
        both("absolute symlink back inside", "abs_inside", Outside),
        both("symlink loop", "loop_a", Code("IO_ERROR")),
        both("symlink self-loop", "self_loop", Code("IO_ERROR")),
        both("through a symlink loop", "loop_a/x", Code("IO_ERROR")),
        // Not regular files: fail at once, never block.
        both("FIFO", "fifo", invalid),
        both("FIFO by absolute path", format!("{p}/fifo"), invalid),
        both("unix socket", "sock", invalid),
        each(
            "a file is not listable",
            "sub/b.txt",
            Content(B_TXT),
            invalid,
        ),
        // Controls: the same forms do work inside the root.
        control("plain relative", "a.txt", Content(A_TXT), invalid),
        control("by root name", "proj/sub", invalid, Listed),
        control("the root itself", p.to_owned(), invalid, Listed),
        control("inside symlink", "lnk_in", Content(A_TXT), invalid),
        control(
            "URI localhost inside",
            format!("file://localhost{p}/a.txt"),
            Content(A_TXT),
            invalid,
        ),
        control(
            "URI localhost inside dir",
            format!("file://localhost{p}/sub"),
            invalid,
            Listed,
        ),
        control(
            "URI empty host, encoded",
            format!("file://{p}/%61.txt"),
            Content(A_TXT),
            invalid,
        ),
    ]
}

#[test]
fn hostile_paths_single_root() {
    let w = world();
    guarded(w, |w| {
        let cases = single_root_cases(&w);
        let mut b = Fsb::serve_root(&w.proj);
        let hostile = run_table(&mut b, &cases, &[MARKER]);
        println!(
            "single root: {hostile} hostile cases (+{} controls), each against files/read and files/list",
            cases.len() - hostile
        );
        assert!(hostile >= 30, "only {hostile} hostile cases");
        let (status, rest) = b.finish();
        assert!(status.success(), "{status}");
        assert!(!rest.contains(MARKER));
    });
}

fn two_root_cases(w: &World) -> Vec<Case> {
    use Want::{Code, Content, Denied, Listed, Outside};
    let t = w.base.to_str().unwrap();
    let p = w.proj.to_str().unwrap();
    let invalid = Code("INVALID_PATH");
    vec![
        // With two roots a path must name one.
        both("unknown first segment", "a.txt", Outside),
        both("unknown first segment, dir", "sub", Outside),
        both(
            "outside dir as a first segment",
            "outside/secret.txt",
            Outside,
        ),
        both("dotdot", "../outside/secret.txt", Outside),
        both(
            "climb from one root into the other",
            "second/../proj/a.txt",
            Outside,
        ),
        both("climb from a root to a sibling", "proj/../outside", Outside),
        both(
            "prefix sibling absolute",
            format!("{t}/proj_evil/secret"),
            Outside,
        ),
        both(
            "symlink from one root into another's denied file",
            "second/lnk_cross_env",
            Outside,
        ),
        both(
            "symlink from one root into another",
            "second/lnk_cross_a",
            Outside,
        ),
        both(
            "symlink leading out",
            "proj/lnk_dir_rel/secret.txt",
            Outside,
        ),
        // Deny globs, however spelled.
        both("denied file", "proj/.env", Denied),
        both("denied file, nested", "proj/sub/.env", Denied),
        both("denied after a lexical climb", "proj/sub/../.env", Denied),
        both("denied with dot and doubled slash", "proj//./.env", Denied),
        both("denied dir", "proj/.git", Denied),
        both("denied dir's file", "proj/.git/config", Denied),
        both("denied plain name", "proj/secrets", Denied),
        both("under a denied plain name", "proj/secrets/key.pem", Denied),
        both("denied, absolute", format!("{p}/.env"), Denied),
        both("denied, URI with %2E", format!("file://{p}/%2Eenv"), Denied),
        both(
            "denied, URI localhost",
            format!("file://localhost{p}/.git/config"),
            Denied,
        ),
        // Symlinks inside the root that lead to denied paths: the deny check follows them,
        // before any type check, so not even the kind of the denied target is disclosed.
        both("ok.txt -> .env", "proj/ok.txt", Denied),
        both("gitlink -> .git", "proj/gitlink", Denied),
        both(
            "file through gitlink -> .git",
            "proj/gitlink/config",
            Denied,
        ),
        both("symlink to a denied file", "proj/lnk_secret", Denied),
        // Controls.
        control("by name", "proj/a.txt", Content(A_TXT), invalid),
        control("second root", "second/s.txt", Content(S_TXT), invalid),
        control("second root listed", "second", invalid, Listed),
        control(
            "absolute in the second root",
            format!("{}/s.txt", w.second.to_str().unwrap()),
            Content(S_TXT),
            invalid,
        ),
    ]
}

#[test]
fn hostile_paths_two_roots_with_deny_globs() {
    let w = world();
    guarded(w, |w| {
        let cases = two_root_cases(&w);
        let mut b = Fsb::spawn(&["serve".as_ref(), "--policy".as_ref(), w.policy.as_os_str()]);
        let hostile = run_table(&mut b, &cases, &[MARKER, DENIED_MARKER]);
        println!(
            "two roots + deny globs: {hostile} hostile cases (+{} controls), each against files/read and files/list",
            cases.len() - hostile
        );
        assert!(hostile >= 20, "only {hostile} hostile cases");
    });
}

/// `path -> type` of a recursive, hidden-included listing, checked for leaks on the way.
fn listing(b: &mut Fsb, path: &str, forbidden: &[&str]) -> BTreeMap<String, String> {
    let result = b.ok(
        "files/list",
        json!({"path": path, "recursive": true, "includeHidden": true}),
    );
    let raw = b.last_raw.clone();
    for secret in forbidden.iter().chain(OUTSIDE_NAMES) {
        assert!(
            !raw.contains(secret),
            "list {path}: {secret} on the wire: {raw}"
        );
    }
    assert!(result.get("nextCursor").is_none(), "{result}");
    let entries = result["entries"].as_array().expect("entries").clone();
    let paths: Vec<&str> = entries
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    let mut sorted = paths.clone();
    sorted.sort_unstable();
    assert_eq!(paths, sorted, "entries must be sorted by path");
    entries
        .iter()
        .map(|e: &Value| {
            let path = e["path"].as_str().unwrap().to_owned();
            let name = e["name"].as_str().unwrap();
            assert!(path.ends_with(&format!("/{name}")), "{e}");
            (path, e["type"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// Everything planted under `proj/`, as a recursive listing must report it.
fn proj_tree() -> BTreeMap<String, String> {
    let dirs = ["sub", "sub/deep", ".git", "secrets"];
    let files = [
        "a.txt",
        "sub/b.txt",
        "sub/deep/c.txt",
        ".env",
        "sub/.env",
        ".git/config",
        "secrets/key.pem",
    ];
    let links = [
        "lnk_in",
        "lnk_file_rel",
        "lnk_file_abs",
        "lnk_dir_rel",
        "lnk_dir_abs",
        "lnk_evil",
        "lnk_parent",
        "sub/lnk_root",
        "loop_a",
        "loop_b",
        "self_loop",
        "chain1",
        "chain2",
        "sub/chain3",
        "abs_inside",
        "ok.txt",
        "gitlink",
        "lnk_secret",
    ];
    let other = ["fifo", "sock"];
    let mut m = BTreeMap::new();
    for (names, kind) in [
        (&dirs[..], "directory"),
        (&files[..], "file"),
        (&links[..], "symlink"),
        (&other[..], "other"),
    ] {
        for n in names {
            m.insert(format!("proj/{n}"), kind.to_owned());
        }
    }
    m
}

#[test]
fn recursive_listing_stays_inside_and_never_follows_symlinks() {
    let w = world();
    guarded(w, |w| {
        // One root, no deny globs: exactly the planted tree, symlinks as `symlink`, none
        // descended into (nothing under lnk_dir_*, lnk_parent, sub/lnk_root, gitlink).
        let mut b = Fsb::serve_root(&w.proj);
        let got = listing(&mut b, "proj", &[MARKER]);
        assert_eq!(got, proj_tree());
        let uri = format!("file://localhost{}", w.proj.to_str().unwrap());
        assert_eq!(listing(&mut b, &uri, &[MARKER]), proj_tree());
        drop(b);

        // Two roots with deny globs: the denied entries vanish, the rest is unchanged.
        let mut b = Fsb::spawn(&["serve".as_ref(), "--policy".as_ref(), w.policy.as_os_str()]);
        let got = listing(
            &mut b,
            "proj",
            &[MARKER, DENIED_MARKER, "key.pem", "config"],
        );
        let mut want = proj_tree();
        for denied in [
            ".env",
            "sub/.env",
            ".git",
            ".git/config",
            "secrets",
            "secrets/key.pem",
        ] {
            want.remove(&format!("proj/{denied}"));
        }
        assert_eq!(got, want);
        let got = listing(&mut b, "second", &[MARKER, DENIED_MARKER]);
        let want: BTreeMap<String, String> = [
            ("second/lnk_cross_a", "symlink"),
            ("second/lnk_cross_env", "symlink"),
            ("second/s.txt", "file"),
        ]
        .into_iter()
        .map(|(p, t)| (p.to_owned(), t.to_owned()))
        .collect();
        assert_eq!(got, want);
    });
}

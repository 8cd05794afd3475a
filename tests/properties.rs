//! Property tests of what a host sees: the path resolver, a session's answers to any line
//! (`Session::handle`), and chunked reading (base64 and UTF-8). The private layers' own
//! properties (the line framer, the message parser, the codec) are in `src/properties.rs`.
//!
//! Each property runs through an explicit `TestRunner` so that its fixture (a real temp
//! directory, a broker, a tokio runtime) is built once per test and the strategies can name
//! the fixture's real paths. Failures print proptest's shrunk input. `PROPTEST_CASES` raises
//! (or lowers) every property's case count for a longer local run.
//!
//! One file though long: the properties share one harness (`check`) and the fixtures its
//! strategies name real paths of.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::fmt::Debug;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use fsbroker::policy::{Overrides, Policy};
use fsbroker::sandbox::{ConsentMode, Mode, Resolved, Root, RootSpec, resolve};
use fsbroker::{Broker, ErrorKind, Session};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{TestCaseResult, TestRunner};
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use tokio::runtime::Runtime;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// Cases for cheap, pure properties.
const CHEAP: u32 = 256;
/// Cases for properties that go through a session and the disk.
const HEAVY: u32 = 48;

/// Runs `test` on `cases` values of `strategy` (or `PROPTEST_CASES` of them), panicking with
/// the shrunk counterexample on failure. Nothing is persisted to disk.
fn check<S>(cases: u32, strategy: S, test: impl Fn(S::Value) -> TestCaseResult)
where
    S: Strategy,
    S::Value: Debug,
{
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// Bytes that print as an escaped byte string in counterexamples.
#[derive(Clone, PartialEq, Eq)]
struct Bytes(Vec<u8>);

impl Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

fn canonical_tempdir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().expect("tempdir");
    let base = t.path().canonicalize().expect("canonicalize");
    (t, base)
}

fn utf8(p: &Path) -> String {
    p.to_str().expect("temp paths are UTF-8").to_owned()
}

// ---------------------------------------------------------------------------------------------
// 1. The resolver
// ---------------------------------------------------------------------------------------------

fn open_root(path: &Path, name: &str) -> Arc<Root> {
    Arc::new(
        Root::open(&RootSpec {
            path: path.to_path_buf(),
            name: Some(name.into()),
            mode: Mode::ReadOnly,
            consent: ConsentMode::Auto,
            deny: vec![],
        })
        .expect("open root"),
    )
}

/// `base/root` (the root), `base/root/inner` (nested), `base/root_evil` (the sibling that
/// shares a string prefix) and `base/x` (to spell the root's configured path with a `..`).
struct ResolverFixture {
    _tmp: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    inner: PathBuf,
    evil: PathBuf,
}

impl ResolverFixture {
    fn new() -> ResolverFixture {
        let (tmp, base) = canonical_tempdir();
        let root = base.join("root");
        let inner = root.join("inner");
        let evil = base.join("root_evil");
        for d in [&inner, &evil, &base.join("x")] {
            std::fs::create_dir_all(d).unwrap();
        }
        ResolverFixture {
            _tmp: tmp,
            base,
            root,
            inner,
            evil,
        }
    }

    /// The prefixes path-like strings start with: root names, the real absolute paths (and
    /// the sibling's), `file:` URIs with and without a host, and a few broken forms.
    fn prefixes(&self) -> Vec<String> {
        let (base, root, inner, evil) = (
            utf8(&self.base),
            utf8(&self.root),
            utf8(&self.inner),
            utf8(&self.evil),
        );
        let root_uri = url::Url::from_file_path(&self.root).unwrap().to_string();
        let mut v: Vec<String> = [
            "",
            "/",
            "//",
            "./",
            "../",
            "root/",
            "root",
            "outer/",
            "inner/",
            "file://",
            "file:///",
            "file:",
            "file://localhost",
            "file://evil",
            "FILE://",
            "file:/",
            "\\",
            "~/",
            "%2e%2e/",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        for p in [&root, &inner, &evil, &base] {
            v.push(p.clone());
            v.push(format!("{p}/"));
            v.push(format!("file://{p}/"));
            v.push(format!("file://localhost{p}/"));
            v.push(format!("file://evil{p}/"));
        }
        v.push(format!("{root}/.."));
        v.push(format!("{root}/../root_evil/"));
        v.push(format!("{base}/x/../root/"));
        v.push(format!("{base}/x/../root_evil/"));
        v.push(format!("{base}/./root/"));
        v.push(format!("{base}//root//"));
        v.push(format!("FILE://{root}/"));
        v.push(format!("file:{root}/"));
        v.push(format!("file://{root}/%2e%2e/"));
        v.push(format!("file://{root}/..%2F..%2F"));
        v.push(format!("file://{root}%2F..%2Froot_evil/"));
        v.push(format!("{root_uri}/"));
        v
    }
}

fn segment() -> impl Strategy<Value = String> {
    let fixed = select(vec![
        "..",
        ".",
        "",
        "a",
        "b",
        "%2e%2e",
        "%2E%2e",
        ".%2e",
        "%2F",
        "..%2F..",
        "%00",
        "%5C",
        "%ff",
        "\\",
        "..\\..",
        "\0",
        "inner",
        "root",
        "outer",
        "root_evil",
        "é",
        "日本",
        "😀",
        "?q",
        "#f",
        "C:",
        "~",
        "...",
        " ",
        "a b",
        "%20",
        "%",
        "file:",
        "file://evil",
        "localhost",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        6 => fixed,
        2 => "[a-z.%/\\\\]{1,6}",
        1 => "\\PC{1,8}",
        1 => "[a-z]{200,300}",
    ]
}

fn separator() -> impl Strategy<Value = &'static str> {
    prop_oneof![8 => Just("/"), 1 => Just("//"), 1 => Just("\\"), 1 => Just("/./")]
}

/// A path-like string: a prefix, segments and separators, and an optional tail.
fn path_like(prefixes: Vec<String>) -> impl Strategy<Value = String> {
    let built = (
        select(prefixes.clone()),
        prop::collection::vec((segment(), separator()), 0..8),
        prop_oneof![Just(""), Just("/"), Just("?x=1"), Just("#frag"), Just("\0")],
    )
        .prop_map(|(prefix, segs, tail)| {
            let mut s = prefix;
            for (i, (seg, sep)) in segs.iter().enumerate() {
                if i > 0 {
                    s.push_str(sep);
                }
                s.push_str(seg);
            }
            s.push_str(tail);
            s
        });
    prop_oneof![
        6 => built,
        1 => any::<String>(),
        1 => (select(prefixes), any::<String>()).prop_map(|(p, s)| p + &s),
    ]
}

/// The spec's reading of a request path, written independently of the resolver (strings split
/// on `/`, not `Path` components): `Some(Ok((root index, rel)))`, `Some(Err(kind))`, or
/// `None` for `file:` URIs, which are only checked against the invariants.
type Model = Option<Result<(usize, String), ErrorKind>>;

struct ModelRoot {
    name: &'static str,
    /// Every absolute spelling of the root (canonical, configured), as segments.
    prefixes: Vec<Vec<String>>,
}

fn segments_of(p: &str) -> Vec<String> {
    p.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .map(str::to_owned)
        .collect()
}

/// Absolute segments with `..` applied; `..` at the top stays at the top.
fn absolute(segs: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in segs {
        if s == ".." {
            out.pop();
        } else {
            out.push(s.clone());
        }
    }
    out
}

fn climb(segs: &[String]) -> Result<String, ErrorKind> {
    let mut stack: Vec<&str> = Vec::new();
    for s in segs {
        if s == ".." {
            stack.pop().ok_or(ErrorKind::PermissionDenied)?;
        } else {
            stack.push(s);
        }
    }
    Ok(stack.join("/"))
}

fn model(roots: &[ModelRoot], raw: &str) -> Model {
    if raw.is_empty() || raw.contains('\0') {
        return Some(Err(ErrorKind::InvalidPath));
    }
    if raw
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("file:"))
    {
        return None;
    }
    let placed = |i: usize, segs: &[String]| climb(segs).map(|rel| (i, rel));
    if raw.starts_with('/') {
        // `.` and `..` are applied to an absolute path (`..` at `/` stays there) before the
        // root is chosen, to the request and to the configured spellings of the roots alike.
        let segs = absolute(&segments_of(raw));
        let best = roots
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.prefixes.iter().map(move |p| (i, absolute(p))))
            .filter(|(_, p)| p.len() <= segs.len() && p.iter().zip(&segs).all(|(a, b)| a == b))
            .max_by_key(|(_, p)| p.len());
        return Some(match best {
            Some((i, p)) => placed(i, &segs[p.len()..]),
            None => Err(ErrorKind::PermissionDenied),
        });
    }
    let (first, rest) = raw.split_once('/').unwrap_or((raw, ""));
    if let Some(i) = roots.iter().position(|r| r.name == first) {
        return Some(placed(i, &segments_of(rest)));
    }
    Some(match roots {
        [_] => placed(0, &segments_of(raw)),
        _ => Err(ErrorKind::PermissionDenied),
    })
}

/// Drops `.` and applies `..` without touching the disk.
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn location(r: &Resolved) -> PathBuf {
    r.root().path().join(r.rel())
}

/// The invariants every resolution keeps, its determinism, its agreement with the model,
/// and that the three spellings of the place it found (`NAME/rel`, absolute, `file://`)
/// lead back to the same place.
fn resolver_property(roots: &[Arc<Root>], models: &[ModelRoot], raw: &str) -> TestCaseResult {
    let first = resolve(roots, raw);
    let second = resolve(roots, raw);
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            prop_assert!(Arc::ptr_eq(a.root(), b.root()), "not deterministic");
            prop_assert_eq!(&a.rel(), &b.rel(), "not deterministic");
        }
        (Err(a), Err(b)) => {
            prop_assert_eq!(a.kind(), b.kind(), "not deterministic");
            prop_assert_eq!(a.to_string(), b.to_string(), "not deterministic");
        }
        _ => prop_assert!(false, "not deterministic: {:?} then {:?}", first, second),
    }
    let got = match first {
        Ok(r) => r,
        Err(e) => {
            prop_assert!(
                matches!(
                    e.kind(),
                    ErrorKind::InvalidPath | ErrorKind::PermissionDenied
                ),
                "unexpected error kind: {e}"
            );
            prop_assert_eq!(e.path(), Some(raw));
            if let Some(want) = model(models, raw) {
                prop_assert_eq!(Err(e.kind()), want, "disagrees with the model");
            }
            return Ok(());
        }
    };
    let index = roots.iter().position(|r| Arc::ptr_eq(r, got.root()));
    prop_assert!(index.is_some(), "resolved to a root not in the list");
    let index = index.unwrap_or_default();
    if !got.rel().is_empty() {
        prop_assert!(
            !got.rel().starts_with('/'),
            "rel {:?} is absolute",
            got.rel()
        );
        for seg in got.rel().split('/') {
            prop_assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "rel {:?} is not normalised",
                got.rel()
            );
        }
    }
    prop_assert!(!got.rel().contains('\0'));
    let joined = location(&got);
    prop_assert!(
        lexical(&joined).starts_with(got.root().path()),
        "{} is outside {}",
        joined.display(),
        got.root().path().display()
    );
    if let Some(want) = model(models, raw) {
        prop_assert_eq!(
            Ok((index, got.rel().to_owned())),
            want,
            "disagrees with the model"
        );
    }

    // Round trips: every spelling of the place resolves to the same place.
    let display = got.display();
    let again = resolve(roots, &display);
    prop_assert!(again.is_ok(), "NAME/rel {display:?} fails: {again:?}");
    if let Ok(again) = again {
        prop_assert!(Arc::ptr_eq(again.root(), got.root()));
        prop_assert_eq!(&again.rel(), &got.rel());
    }
    let abs = utf8(&joined);
    let again = resolve(roots, &abs);
    prop_assert!(again.is_ok(), "absolute {abs:?} fails: {again:?}");
    if let Ok(again) = again {
        prop_assert_eq!(location(&again), joined.clone(), "absolute {:?}", abs);
    }
    let uri = url::Url::from_file_path(&joined).map(String::from);
    prop_assert!(uri.is_ok());
    if let Ok(uri) = uri {
        let again = resolve(roots, &uri);
        prop_assert!(again.is_ok(), "URI {uri:?} fails: {again:?}");
        if let Ok(again) = again {
            prop_assert_eq!(location(&again), joined, "URI {:?}", uri);
        }
    }
    Ok(())
}

#[test]
fn resolver_one_root_stays_inside_and_is_deterministic() {
    let f = ResolverFixture::new();
    // Configured through a `..`, so both spellings of the root are prefixes.
    let configured = f.base.join("x/../root");
    let roots = [Arc::new(
        Root::open(&RootSpec {
            path: configured.clone(),
            name: Some("root".into()),
            mode: Mode::ReadOnly,
            consent: ConsentMode::Auto,
            deny: vec![],
        })
        .expect("open root"),
    )];
    let models = [ModelRoot {
        name: "root",
        prefixes: vec![segments_of(&utf8(&f.root)), segments_of(&utf8(&configured))],
    }];
    check(CHEAP * 4, path_like(f.prefixes()), |raw| {
        resolver_property(&roots, &models, &raw)
    });
}

#[test]
fn resolver_nested_roots_stay_inside_and_are_deterministic() {
    let f = ResolverFixture::new();
    let roots = [open_root(&f.root, "outer"), open_root(&f.inner, "inner")];
    let models = [
        ModelRoot {
            name: "outer",
            prefixes: vec![segments_of(&utf8(&f.root))],
        },
        ModelRoot {
            name: "inner",
            prefixes: vec![segments_of(&utf8(&f.inner))],
        },
    ];
    check(CHEAP * 4, path_like(f.prefixes()), |raw| {
        resolver_property(&roots, &models, &raw)
    });
}

// ---------------------------------------------------------------------------------------------
// 2. The message parser, through a session
// ---------------------------------------------------------------------------------------------

const METHODS: &[&str] = &[
    "ping",
    "roots/list",
    "files/read",
    "files/list",
    "files/checksum",
    "files/write",
    "files/create",
    "files/delete",
    "files/rename",
    "files/unlock",
    "files/consent",
    "files/watch",
    "files/unwatch",
    "notifications/initialized",
    "nope",
    "",
];

const PARAM_KEYS: &[&str] = &[
    "path",
    "encoding",
    "offset",
    "length",
    "content",
    "cursor",
    "limit",
    "recursive",
    "includeHidden",
    "type",
    "oldPath",
    "newPath",
    "overwrite",
    "requestedPaths",
    "message",
    "lockId",
    "keepLocked",
    "events",
    "watchId",
    "final",
    "append",
    "create",
    "ifMatch",
    "sha256",
    "algorithm",
    "_meta",
    "bogus",
];

/// A root with a couple of files, and a sibling `outside` directory that no request may
/// change.
struct SessionFixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

const SECRET: &str = "outside the root\n";

impl SessionFixture {
    fn new() -> SessionFixture {
        let (tmp, base) = canonical_tempdir();
        let root = base.join("root");
        let outside = base.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), SECRET).unwrap();
        let f = SessionFixture {
            _tmp: tmp,
            root,
            outside,
        };
        f.restore();
        f
    }

    /// Empties the root (keeping the directory: the broker holds it open) and puts its
    /// files back; requests may have changed them.
    fn restore(&self) {
        std::fs::create_dir_all(&self.root).unwrap();
        for entry in std::fs::read_dir(&self.root).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
        std::fs::create_dir(self.root.join("dir")).unwrap();
        std::fs::write(self.root.join("a.txt"), "héllo\nworld\n").unwrap();
        std::fs::write(self.root.join("dir/b.bin"), [0u8, 159, 146, 150, 255]).unwrap();
    }

    fn paths(&self) -> Vec<String> {
        let root = utf8(&self.root);
        let outside = utf8(&self.outside);
        let mut v: Vec<String> = [
            "a.txt",
            "a.txt",
            "dir",
            "dir/b.bin",
            "dir/b.bin",
            "./a.txt",
            "dir/../a.txt",
            "dir/",
            "root/a.txt",
            "root/dir/b.bin",
            "root",
            "new.txt",
            "dir/new",
            "",
            ".",
            "..",
            "../outside/secret",
            "root/../outside/secret",
            "a\0b",
            "dir/../../outside",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        v.push(format!("{root}/a.txt"));
        v.push(format!("{root}/../outside/secret"));
        v.push(format!("{outside}/secret"));
        v.push(outside.clone());
        v.push(format!("file://{root}/dir/b.bin"));
        v.push(format!("file://{root}/%2e%2e/outside/secret"));
        v.push(format!("file://{root}/..%2Foutside%2Fsecret"));
        v
    }

    fn assert_outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"], "something appeared outside the root");
        let text = std::fs::read_to_string(self.outside.join("secret")).unwrap();
        assert_eq!(text, SECRET, "the file outside the root changed");
    }
}

fn json_leaf(paths: Vec<String>) -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        select(vec![0i64, 1, -1, 4, 1 << 20, 1 << 53, i64::MAX, i64::MIN]).prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
        select(vec![
            "2.0",
            "utf-8",
            "base64",
            "latin1",
            "file",
            "directory",
            "dir",
            "create",
            "delete",
            "change",
            "rename",
        ])
        .prop_map(Value::from),
        select(paths).prop_map(Value::String),
    ]
}

fn json_value(paths: Vec<String>) -> BoxedStrategy<Value> {
    json_leaf(paths)
        .prop_recursive(3, 24, 4, |inner| {
            let key = prop_oneof![
                3 => select(PARAM_KEYS.to_vec()).prop_map(str::to_owned),
                1 => "\\PC{0,6}",
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key, inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
        .boxed()
}

/// What a method's parameter holds.
#[derive(Clone, Copy)]
enum Kind {
    Path,
    Count,
    Flag,
    Encoding,
    Text,
    Paths,
    Events,
    Type,
}

/// A value for a parameter of `kind`: mostly a plausible one, sometimes any JSON leaf.
fn param_value(kind: Kind, paths: &[String]) -> BoxedStrategy<Value> {
    let typed = match kind {
        Kind::Path => select(paths.to_vec()).prop_map(Value::String).boxed(),
        Kind::Count => prop_oneof![
            2 => select(vec![
                json!(0), json!(1), json!(3), json!(4), json!(5), json!(100), json!(4096),
                json!(1u64 << 20), json!(1u64 << 30), json!(1u64 << 40), json!(u64::MAX),
                json!(i64::MAX), json!(-1), json!(1.5),
            ]),
            1 => (0..64u64).prop_map(Value::from),
        ]
        .boxed(),
        Kind::Flag => any::<bool>().prop_map(Value::Bool).boxed(),
        Kind::Encoding => select(vec!["utf-8", "base64", "UTF8", "latin1", ""])
            .prop_map(Value::from)
            .boxed(),
        Kind::Text => prop_oneof![
            select(vec![
                "",
                "aGVsbG8=",
                "héllo\n",
                "not base64!",
                "AAAA",
                "eyJ9"
            ])
            .prop_map(Value::from),
            "\\PC{0,40}".prop_map(Value::String),
        ]
        .boxed(),
        Kind::Paths => prop::collection::vec(select(paths.to_vec()), 0..4)
            .prop_map(|v| json!(v))
            .boxed(),
        Kind::Events => prop::collection::vec(
            select(vec![
                "created", "modified", "deleted", "renamed", "create", "change", "bogus",
            ]),
            0..4,
        )
        .prop_map(|v| json!(v))
        .boxed(),
        Kind::Type => select(vec!["file", "directory", "dir", "symlink"])
            .prop_map(Value::from)
            .boxed(),
    };
    prop_oneof![9 => typed, 1 => json_leaf(paths.to_vec())].boxed()
}

/// A method and params shaped for it: each parameter present or not, sometimes a bogus one.
fn typed_call(paths: Vec<String>) -> impl Strategy<Value = (&'static str, Value)> {
    use Kind::*;
    let specs: Vec<(&'static str, Vec<(&'static str, Kind)>)> = vec![
        ("ping", vec![]),
        ("roots/list", vec![]),
        (
            "files/read",
            vec![
                ("path", Path),
                ("encoding", Encoding),
                ("offset", Count),
                ("length", Count),
                ("keepLocked", Flag),
                ("sha256", Flag),
            ],
        ),
        (
            "files/checksum",
            vec![
                ("path", Path),
                ("offset", Count),
                ("length", Count),
                ("algorithm", Text),
            ],
        ),
        (
            "files/list",
            vec![
                ("path", Path),
                ("recursive", Flag),
                ("includeHidden", Flag),
                ("cursor", Text),
                ("limit", Count),
            ],
        ),
        (
            "files/write",
            vec![
                ("path", Path),
                ("content", Text),
                ("encoding", Encoding),
                ("create", Flag),
                ("offset", Count),
                ("final", Flag),
                ("ifMatch", Text),
                ("append", Flag),
                ("keepLocked", Flag),
                ("sha256", Flag),
            ],
        ),
        (
            "files/create",
            vec![("path", Path), ("type", Type), ("keepLocked", Flag)],
        ),
        ("files/delete", vec![("path", Path), ("recursive", Flag)]),
        (
            "files/rename",
            vec![("oldPath", Path), ("newPath", Path), ("overwrite", Flag)],
        ),
        ("files/unlock", vec![("lockId", Text)]),
        (
            "files/consent",
            vec![("message", Text), ("requestedPaths", Paths)],
        ),
        (
            "files/watch",
            vec![("path", Path), ("recursive", Flag), ("events", Events)],
        ),
        ("files/unwatch", vec![("watchId", Text)]),
    ];
    let calls: Vec<BoxedStrategy<(&'static str, Value)>> = specs
        .into_iter()
        .map(|(method, keys)| {
            let members: Vec<BoxedStrategy<Option<(&'static str, Value)>>> = keys
                .into_iter()
                .map(|(key, kind)| {
                    let first = key == "path" || key == "oldPath" || key == "newPath";
                    prop::option::weighted(
                        if first { 0.95 } else { 0.5 },
                        param_value(kind, &paths),
                    )
                    .prop_map(move |v| v.map(|v| (key, v)))
                    .boxed()
                })
                .collect();
            let bogus = prop::option::weighted(0.05, json_leaf(vec![String::new()]));
            (members, bogus)
                .prop_map(move |(members, bogus)| {
                    let mut m: Map<String, Value> = members
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect();
                    if let Some(v) = bogus {
                        m.insert("bogus".into(), v);
                    }
                    (method, Value::Object(m))
                })
                .boxed()
        })
        .collect();
    prop::strategy::Union::new(calls)
}

/// A JSON-RPC-shaped message: each envelope member valid, invalid or absent.
fn message(paths: Vec<String>) -> impl Strategy<Value = Value> {
    let value = json_value(paths.clone());
    let jsonrpc = prop::option::weighted(
        0.95,
        prop_oneof![
            8 => Just(json!("2.0")),
            1 => select(vec![json!("1.0"), json!(2.0), json!(null), json!("2.0 ")]),
        ],
    );
    let id = prop::option::weighted(
        0.9,
        prop_oneof![
            6 => any::<i64>().prop_map(Value::from),
            1 => Just(Value::from(u64::MAX)),
            6 => "\\PC{0,10}".prop_map(Value::String),
            1 => select(vec![
                json!(null), json!(1.5), json!(true), json!({}), json!([1]), json!(-0.0),
            ]),
        ],
    );
    let method = prop::option::weighted(
        0.9,
        prop_oneof![
            8 => select(METHODS.to_vec()).prop_map(Value::from),
            1 => "\\PC{0,12}".prop_map(Value::String),
            1 => value.clone(),
        ],
    );
    let param = (
        select(PARAM_KEYS.to_vec()),
        prop_oneof![
            3 => select(paths.clone()).prop_map(Value::String),
            3 => json_leaf(vec![String::new()]),
            1 => value.clone(),
        ],
    );
    let params = prop::option::weighted(
        0.85,
        prop_oneof![
            6 => prop::collection::vec(param, 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
            1 => value.clone(),
        ],
    );
    // Either a method with params shaped for it (so requests reach the disk), or the two
    // drawn independently (so they mostly do not).
    let call = prop_oneof![
        4 => typed_call(paths).prop_map(|(m, p)| (Some(Value::from(m)), Some(p))),
        1 => (method, params),
    ];
    let extra = prop::option::weighted(
        0.15,
        (select(vec!["result", "error", "extra", "id2"]), value),
    );
    (jsonrpc, id, call, extra).prop_map(|(jsonrpc, id, (method, params), extra)| {
        let mut m = Map::new();
        for (k, v) in [
            ("jsonrpc", jsonrpc),
            ("id", id),
            ("method", method),
            ("params", params),
        ] {
            if let Some(v) = v {
                m.insert(k.to_owned(), v);
            }
        }
        if let Some((k, v)) = extra {
            m.insert(k.to_owned(), v);
        }
        Value::Object(m)
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(Index),
    Delete(Index),
    Insert(Index, u8),
    Replace(Index, u8),
    Duplicate(Index, Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        3 => select(b"{}[]\",:\\0123456789-.enulltrue \t\r".to_vec()),
        1 => any::<u8>(),
    ];
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        any::<Index>().prop_map(Mutation::Delete),
        (any::<Index>(), byte.clone()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), byte).prop_map(|(i, b)| Mutation::Replace(i, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::Duplicate(a, b)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len();
        match m {
            Mutation::Truncate(i) => bytes.truncate(i.index(len + 1)),
            Mutation::Delete(i) if len > 0 => {
                bytes.remove(i.index(len));
            }
            Mutation::Insert(i, b) => bytes.insert(i.index(len + 1), *b),
            Mutation::Replace(i, b) if len > 0 => bytes[i.index(len)] = *b,
            Mutation::Duplicate(a, b) if len > 0 => {
                let (a, b) = (a.index(len), b.index(len));
                let piece = bytes[a.min(b)..=a.max(b)].to_vec();
                bytes.splice(a.max(b) + 1..a.max(b) + 1, piece);
            }
            _ => {}
        }
    }
    bytes
}

/// One line handed to the session.
#[derive(Debug, Clone)]
enum Input {
    /// Serialized exactly: the answer is predicted by [`expected_answer`].
    Exact(Value),
    /// Mutated, or arbitrary bytes: only the answer's shape and id are checked.
    Raw(Bytes),
}

impl Input {
    fn line(&self) -> Vec<u8> {
        match self {
            Input::Exact(v) => serde_json::to_vec(v).expect("serialize"),
            Input::Raw(b) => b.0.clone(),
        }
    }
}

fn input(paths: Vec<String>) -> impl Strategy<Value = Input> {
    let no_newlines = |mut b: Vec<u8>| {
        b.retain(|&c| c != b'\n');
        b
    };
    let mutated = (
        message(paths.clone()),
        prop::collection::vec(mutation(), 1..4),
    )
        .prop_map(move |(m, muts)| {
            let line = serde_json::to_vec(&m).expect("serialize");
            Input::Raw(Bytes(no_newlines(mutate(line, &muts))))
        });
    prop_oneof![
        8 => message(paths.clone()).prop_map(Input::Exact),
        3 => mutated,
        1 => json_value(paths).prop_map(Input::Exact),
        1 => prop::collection::vec(any::<u8>(), 0..200)
            .prop_map(move |b| Input::Raw(Bytes(no_newlines(b)))),
        1 => "\\PC{0,100}".prop_map(|s| Input::Raw(Bytes(s.replace('\n', "").into_bytes()))),
    ]
}

/// For an exactly serialized value: `None` when it gets no answer (a notification, or a
/// response), else `Some(id)` with the id the answer must carry (`null` when the message
/// had no usable id).
fn expected_answer(v: &Value) -> Option<Value> {
    let Some(obj) = v.as_object() else {
        return Some(Value::Null);
    };
    let id = match obj.get("id") {
        None => None,
        Some(id @ Value::String(_)) => Some(id.clone()),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => Some(id.clone()),
        Some(_) => return Some(Value::Null),
    };
    let answer = Some(id.clone().unwrap_or(Value::Null));
    if obj.get("jsonrpc") != Some(&json!("2.0")) {
        return answer;
    }
    let Some(method) = obj.get("method") else {
        if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) {
            return None;
        }
        return answer;
    };
    if !method.is_string() {
        return answer;
    }
    if obj
        .get("params")
        .is_some_and(|p| !p.is_object() && !p.is_array())
    {
        return answer;
    }
    id
}

/// Whether `line` is one JSON text (RFC 8259: UTF-8 throughout; numbers of any magnitude,
/// which `serde_json::Value` would refuse as out of range).
fn is_json(line: &[u8]) -> bool {
    serde_json::from_slice::<Box<RawValue>>(line).is_ok()
}

/// The `id` member of a JSON object line (the last one, if repeated).
fn request_id(line: &[u8]) -> Option<Value> {
    let members: HashMap<String, Box<RawValue>> = serde_json::from_slice(line).ok()?;
    serde_json::from_str(members.get("id")?.get()).ok()
}

/// Checks one answer's shape: a single line of JSON, `jsonrpc: "2.0"`, an id, and exactly
/// one of `result` and `error` (a well-formed one); returns the parsed answer.
fn check_answer(answer: &[u8]) -> Result<Value, TestCaseError> {
    let text = String::from_utf8_lossy(answer);
    prop_assert!(answer.ends_with(b"\n"), "no final newline: {text}");
    prop_assert_eq!(
        answer.iter().filter(|&&b| b == b'\n').count(),
        1,
        "not one line: {}",
        text
    );
    let v: Value = serde_json::from_slice(answer)
        .map_err(|e| TestCaseError::fail(format!("answer is not JSON ({e}): {text}")))?;
    prop_assert_eq!(&v["jsonrpc"], &json!("2.0"), "{}", text);
    prop_assert!(v.get("id").is_some(), "no id: {text}");
    let (result, error) = (v.get("result"), v.get("error"));
    prop_assert!(
        result.is_some() != error.is_some(),
        "need exactly one of result and error: {text}"
    );
    if let Some(e) = error {
        prop_assert!(e["code"].is_i64(), "error code: {text}");
        prop_assert!(e["message"].is_string(), "error message: {text}");
        let reason = e["data"]["reason"].as_str().unwrap_or_default();
        prop_assert!(
            !reason.starts_with("worker failed"),
            "a worker panicked: {text}"
        );
    }
    Ok(v)
}

#[test]
fn session_answers_every_line_at_most_once_with_its_id() {
    let f = SessionFixture::new();
    let policy = Policy::load(
        None,
        &Overrides {
            roots: vec![f.root.clone()],
            read_write: true,
            ..Default::default()
        },
    )
    .expect("policy");
    let broker = Broker::new(policy).expect("broker");
    let rt = Runtime::new().expect("runtime");
    let strategy = prop::collection::vec(input(f.paths()), 1..8);
    check(HEAVY * 2, strategy, |inputs| {
        f.restore();
        // A session per case: one case's kept locks and watches do not leak into the next.
        let session: Session = broker.session();
        for input in &inputs {
            let line = input.line();
            let answer = rt.block_on(session.handle(&line));
            let parsed = answer.as_deref().map(check_answer).transpose()?;
            if let Input::Exact(v) = input {
                let want = expected_answer(v);
                let got_id = parsed.as_ref().map(|a| a["id"].clone());
                prop_assert_eq!(
                    got_id,
                    want,
                    "answer {:?} to {}",
                    answer.as_deref().map(String::from_utf8_lossy),
                    v
                );
            }
            // The broker never makes an id up: a non-null id is the request's, and a line that
            // is not JSON at all is a parse error, with id null.
            if let Some(id) = parsed.as_ref().map(|a| &a["id"]).filter(|id| !id.is_null()) {
                prop_assert!(
                    is_json(&line),
                    "a line that is not JSON (RFC 8259) was answered as a message with id {}: {:?}",
                    id,
                    Bytes(line.clone())
                );
                prop_assert_eq!(
                    request_id(&line),
                    Some(id.clone()),
                    "id made up for {}",
                    String::from_utf8_lossy(&line)
                );
            }
        }
        Ok(())
    });
    f.assert_outside_untouched();
}

/// A root `r` in a policy file without a request rate limit (tiny chunks make many requests).
struct ChunkFixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    session: Session,
}

impl ChunkFixture {
    fn new() -> ChunkFixture {
        let (tmp, base) = canonical_tempdir();
        let root = base.join("r");
        std::fs::create_dir(&root).unwrap();
        let policy_path = common::PolicyToml::new()
            .root(common::RootToml::at(&root).name("r"))
            .unlimited()
            .write_to(&base.join("policy.toml"));
        let policy = Policy::load(Some(&policy_path), &Overrides::default()).expect("policy");
        let session = Broker::new(policy).expect("broker").session();
        ChunkFixture {
            _tmp: tmp,
            root,
            session,
        }
    }
}

fn chunk_size() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1..=8u64,
        4 => 1..=4096u64,
        1 => select(vec![4097u64, 65536, 1 << 20, 8 << 20, 16 << 20, u64::MAX]),
    ]
}

/// One chunk as read: offset, length, encoding.
type Chunk = (usize, usize, String);

/// Reads `r/f` chunk by chunk through the session and returns the bytes and, per chunk,
/// `(offset, length, encoding)`.
fn read_chunked(
    rt: &Runtime,
    session: &Session,
    size: usize,
    chunk: u64,
    encoding: &str,
) -> Result<(Vec<u8>, Vec<Chunk>), TestCaseError> {
    let mut data = Vec::new();
    let mut chunks = Vec::new();
    let mut offset = 0usize;
    for id in 0.. {
        prop_assert!(id <= size + 1, "reading does not end");
        let request = json!({
            "jsonrpc": "2.0", "id": id, "method": "files/read",
            "params": {"path": "r/f", "encoding": encoding, "offset": offset, "length": chunk},
        });
        let line = serde_json::to_vec(&request).expect("serialize");
        let answer = rt.block_on(session.handle(&line));
        let answer = answer.ok_or_else(|| TestCaseError::fail("no answer"))?;
        let v = check_answer(&answer)?;
        prop_assert_eq!(&v["id"], &json!(id));
        let r = &v["result"];
        prop_assert!(r.is_object(), "files/read failed: {v}");
        prop_assert_eq!(&r["offset"], &json!(offset));
        prop_assert_eq!(&r["size"], &json!(size));
        let content = r["content"].as_str().unwrap_or_default();
        let enc = r["encoding"].as_str().unwrap_or_default().to_owned();
        let bytes = match enc.as_str() {
            "utf-8" => content.as_bytes().to_vec(),
            "base64" => STANDARD
                .decode(content)
                .map_err(|e| TestCaseError::fail(format!("bad base64 ({e}): {content:?}")))?,
            other => return Err(TestCaseError::fail(format!("encoding {other:?}"))),
        };
        if encoding == "base64" {
            prop_assert_eq!(&enc, "base64", "asked for base64");
        }
        prop_assert_eq!(&r["length"], &json!(bytes.len()));
        prop_assert!(bytes.len() as u64 <= chunk, "chunk longer than asked");
        let end = offset + bytes.len();
        prop_assert_eq!(&r["eof"], &json!(end >= size));
        data.extend_from_slice(&bytes);
        chunks.push((offset, bytes.len(), enc));
        if end >= size {
            break;
        }
        prop_assert!(!bytes.is_empty(), "an empty chunk before the end");
        offset = end;
    }
    Ok((data, chunks))
}

#[test]
fn chunked_reads_reassemble_any_file() {
    let f = ChunkFixture::new();
    let rt = Runtime::new().expect("runtime");
    let content = prop::collection::vec(any::<u8>(), 0..1500).prop_map(Bytes);
    let strategy = (content, chunk_size(), select(vec!["utf-8", "base64"]));
    check(HEAVY, strategy, |(Bytes(content), chunk, encoding)| {
        std::fs::write(f.root.join("f"), &content).unwrap();
        let (data, chunks) = read_chunked(&rt, &f.session, content.len(), chunk, encoding)?;
        prop_assert_eq!(&data, &content, "reassembled differently");
        // A UTF-8 chunk is shortened only by the piece of a character it could not hold
        // whole: what was cut off is the start of one character (and not the end of the file).
        for (offset, len, enc) in chunks {
            let stop = (offset as u64)
                .saturating_add(chunk)
                .min(content.len() as u64) as usize;
            if enc == "utf-8" && offset + len < stop {
                let cut = &content[offset + len..stop];
                let e = std::str::from_utf8(cut).err();
                prop_assert!(
                    cut.len() < 4
                        && stop < content.len()
                        && e.is_some_and(|e| e.valid_up_to() == 0 && e.error_len().is_none()),
                    "a utf-8 chunk at {} dropped {:?}",
                    offset,
                    cut
                );
            }
        }
        Ok(())
    });
}

#[test]
fn chunked_reads_of_text_split_on_character_boundaries() {
    let f = ChunkFixture::new();
    let rt = Runtime::new().expect("runtime");
    let text = prop_oneof!["\\PC{0,300}", "[a\né€😀]{0,400}"];
    let strategy = (text, chunk_size(), select(vec!["utf-8", "base64"]));
    check(HEAVY, strategy, |(text, chunk, encoding)| {
        std::fs::write(f.root.join("f"), &text).unwrap();
        let (data, chunks) = read_chunked(&rt, &f.session, text.len(), chunk, encoding)?;
        prop_assert_eq!(&data, text.as_bytes(), "reassembled differently");
        for (offset, len, enc) in chunks {
            if enc == "utf-8" {
                prop_assert!(text.is_char_boundary(offset) && text.is_char_boundary(offset + len));
            } else if encoding == "utf-8" {
                // Only a chunk too short for the character at its start falls back to base64.
                prop_assert!(chunk < 4, "a {len}-byte base64 chunk of text at {offset}");
            }
        }
        Ok(())
    });
}

/// What `session_answers_every_line_at_most_once_with_its_id` and
/// `parser_classifies_arbitrary_bytes_without_panicking` find, shrunk by hand (proptest cannot
/// shorten a mutated line much). serde_json skips the value of a member the envelope does not read
/// without checking that its strings are UTF-8, so a line that is not JSON (RFC 8259 §8.1)
/// is executed as a request, or taken as a notification, instead of answered `-32700`.
#[test]
fn a_line_with_invalid_utf8_in_an_unread_member_is_a_parse_error() {
    let (_tmp, root) = canonical_tempdir();
    let policy = Policy::load(
        None,
        &Overrides {
            roots: vec![root],
            ..Default::default()
        },
    )
    .expect("policy");
    let session = Broker::new(policy).expect("broker").session();
    let rt = Runtime::new().expect("runtime");
    for line in [
        &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\",\"x\":\"\xff\"}"[..],
        &b"{\"jsonrpc\":\"2.0\",\"method\":\"ping\",\"x\":\"\xff\"}"[..],
    ] {
        let answer = rt.block_on(session.handle(line));
        let answer: Option<Value> = answer.map(|a| serde_json::from_slice(&a).expect("JSON"));
        assert_eq!(
            answer.as_ref().map(|a| (&a["id"], &a["error"]["code"])),
            Some((&Value::Null, &json!(-32700))),
            "{:?} got {:?}",
            Bytes(line.to_vec()),
            answer
        );
    }
}

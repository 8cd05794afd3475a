//! The path resolver on arbitrary UTF-8: no input resolves outside its root.
//!
//! Two real roots in a temp dir, one nested in the other: `out` (configured through a
//! symlink `alias -> outer dir`, so its configured and canonical paths differ, and with a
//! space in its name, so `file://` URIs need percent-encoding) and `in` (`outer dir/inner`).
//! A sibling `outer dir_evil` sits beside them. Each input is tried as given and behind the
//! prefixes a fuzzer could not guess (the roots' absolute paths, canonical and configured,
//! and their `file://` URIs), against `[out]` alone (where any relative path is relative to
//! the one root) and `[out, in]`.
//!
//! Checked for every successful resolution: `rel` is normalised (relative; no empty, `.` or
//! `..` segment); `root.path().join(rel)` starts with `root.path()` (component-wise); the root
//! is one of those given; resolving again gives the same answer; and the result's own
//! `NAME/rel` display, and its absolute path, resolve back to the same place. Every error
//! carries the input as its path.

#![no_main]

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

use fsbroker::sandbox::{ConsentMode, Mode, Resolved, Root, RootSpec, resolve};
use libfuzzer_sys::fuzz_target;

struct World {
    /// `[out]` and `[out, in]`.
    sets: [Vec<Arc<Root>>; 2],
    /// Prefixes placed before the input (each ends in `/`).
    prefixes: Vec<String>,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(build)
}

fn build() -> World {
    let base = tempfile::Builder::new()
        .prefix("fsbroker-fuzz-resolve-")
        .tempdir()
        .expect("temp dir")
        .keep()
        .canonicalize()
        .expect("canonical temp dir");
    let outer = base.join("outer dir");
    let inner = outer.join("inner");
    std::fs::create_dir_all(&inner).expect("roots");
    std::fs::create_dir_all(base.join("outer dir_evil")).expect("sibling");
    let alias = base.join("alias");
    std::os::unix::fs::symlink("outer dir", &alias).expect("alias link");
    let open = |path: PathBuf, name: &str| {
        Arc::new(
            Root::open(&RootSpec {
                path,
                name: Some(name.into()),
                mode: Mode::ReadWrite,
                consent: ConsentMode::Auto,
                deny: vec![],
            })
            .expect("root"),
        )
    };
    let out = open(alias.clone(), "out");
    let inn = open(inner.clone(), "in");
    assert_eq!(out.path(), outer.as_path());
    let text = |p: &Path| p.to_str().expect("temp paths are UTF-8").to_owned();
    let uri = |p: &Path| format!("file://{}", text(p).replace('%', "%25").replace(' ', "%20"));
    let prefixes = vec![
        format!("{}/", text(&base)),
        format!("{}/", text(&outer)),
        format!("{}/", text(&alias)),
        format!("{}/", text(&inner)),
        format!("{}/", uri(&outer)),
        format!("{}/", uri(&inner)),
        "file://localhost/".to_owned(),
    ];
    World {
        sets: [vec![Arc::clone(&out)], vec![out, inn]],
        prefixes,
    }
}

fn check(roots: &[Arc<Root>], raw: &str) {
    match resolve(roots, raw) {
        Ok(r) => check_resolved(roots, raw, &r),
        Err(e) => assert_eq!(e.path(), Some(raw), "error path for {raw:?}: {e}"),
    }
}

fn check_resolved(roots: &[Arc<Root>], raw: &str, r: &Resolved) {
    assert!(
        roots.iter().any(|root| Arc::ptr_eq(root, r.root())),
        "{raw:?}: resolved to a root not given"
    );
    assert!(
        !r.rel().starts_with('/'),
        "{raw:?}: rel {:?} is absolute",
        r.rel()
    );
    if !r.rel().is_empty() {
        for seg in r.rel().split('/') {
            assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "{raw:?}: rel {:?} is not normalised",
                r.rel()
            );
        }
    }
    assert!(
        Path::new(&r.rel())
            .components()
            .all(|c| matches!(c, Component::Normal(_))),
        "{raw:?}: rel {:?} has a non-normal component",
        r.rel()
    );
    let full = r.root().path().join(r.rel());
    assert!(
        full.starts_with(r.root().path()),
        "{raw:?}: {} is outside {}",
        full.display(),
        r.root().path().display()
    );
    // Deterministic.
    let again = resolve(roots, raw).expect("resolved once, fails the second time");
    assert!(
        Arc::ptr_eq(again.root(), r.root()) && again.rel() == r.rel(),
        "{raw:?}: not deterministic"
    );
    // Results are written `NAME/rel` and must be sendable back unchanged.
    let shown = r.display();
    match resolve(roots, &shown) {
        Ok(back) => assert!(
            Arc::ptr_eq(back.root(), r.root()) && back.rel() == r.rel(),
            "{raw:?}: display {shown:?} resolves to {}/{}",
            back.root().name(),
            back.rel()
        ),
        Err(e) => panic!("{raw:?}: display {shown:?} does not resolve: {e}"),
    }
    // The absolute path it names resolves to the same file (perhaps through a deeper root).
    let abs = full.to_str().expect("UTF-8 in, UTF-8 out");
    match resolve(roots, abs) {
        Ok(back) => assert_eq!(
            back.root().path().join(back.rel()),
            full,
            "{raw:?}: absolute {abs:?} resolves elsewhere"
        ),
        Err(e) => panic!("{raw:?}: absolute {abs:?} does not resolve: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let w = world();
    for roots in &w.sets {
        check(roots, s);
        for prefix in &w.prefixes {
            check(roots, &format!("{prefix}{s}"));
        }
    }
});

//! Trees deeper than any request path: a server can nest folders thousands of levels deep by
//! renaming a deep folder into another one (each rename names only short paths). A recursive
//! delete of such a tree used to recurse once per level on a blocking thread's stack and
//! overflowed it, ending the broker (and again after every restart, the tree being still
//! there); a recursive listing held a directory and that level's path per level, so its
//! memory grew with the square of the depth. Each walk now goes at most
//! `MAX_WALK_DEPTH` (128) levels down and refuses deeper trees with `QUOTA_EXCEEDED`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::{code, serve_policy, tempdir, with_deadline};
use serde_json::json;

/// Builds, through the broker, a chain of folders `steps × 251 + 5` levels deep under
/// `r/deep`, and returns the path of its top (`r/deep/t{steps-1}`).
fn deep_tree(b: &mut common::Fsb, steps: usize) -> String {
    let chain = vec!["a"; 250].join("/");
    b.ok(
        "files/create",
        json!({"path": format!("r/deep/t0/{chain}"), "type": "directory"}),
    );
    for i in 1..steps {
        b.ok(
            "files/create",
            json!({"path": format!("r/deep/t{i}/{chain}"), "type": "directory"}),
        );
        b.ok(
            "files/rename",
            json!({
                "oldPath": format!("r/deep/t{}", i - 1),
                "newPath": format!("r/deep/t{i}/{chain}/t{}", i - 1),
            }),
        );
    }
    format!("r/deep/t{}", steps - 1)
}

/// Rule: no tree, however deep, ends the broker. A tree about 4,000 levels deep (deep enough to
/// overflow a 2 MiB stack with a recursive walk in a debug build) is refused by a recursive
/// delete and a recursive listing with `QUOTA_EXCEEDED`; the broker goes on answering; a tree
/// within the bound is still deleted whole.
#[test]
fn a_tree_deeper_than_any_path_is_refused_not_fatal() {
    let (_t, root) = tempdir();
    let (_p, mut b) = serve_policy(&root, "mode = \"read-write\"", "requests_per_second = 0");
    let pid = b.pid();
    with_deadline(
        Duration::from_secs(120),
        move || {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
        },
        move || {
            let top = deep_tree(&mut b, 16);
            let e = b.err("files/delete", json!({"path": top, "recursive": true}));
            assert_eq!(code(&e), "QUOTA_EXCEEDED", "{e}");
            let e = b.err("files/list", json!({"path": top, "recursive": true}));
            assert_eq!(code(&e), "QUOTA_EXCEEDED", "{e}");
            assert_eq!(b.ok("ping", json!({})), json!({}));

            // Within the bound: a 100-level tree with files at every level goes whole.
            let mut path = "r/ok".to_owned();
            for i in 0..100 {
                path = format!("{path}/d{i}");
                b.ok("files/create", json!({"path": path, "type": "directory"}));
                b.ok(
                    "files/write",
                    json!({"path": format!("{path}/f"), "content": "x"}),
                );
            }
            let listed = b.ok("files/list", json!({"path": "r/ok", "recursive": true}));
            assert_eq!(listed["entries"].as_array().map(Vec::len), Some(200));
            b.ok("files/delete", json!({"path": "r/ok", "recursive": true}));
            assert!(!root.join("ok").exists());
        },
    );
}

//! What a host can show of the sessions open on a broker (`Broker::sessions`): who each
//! server is, how it is connected, what it has done and what it holds now. Through the
//! library, on real temporary directories.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::PathBuf;

use common::memory::{Memory, err, ok};
use common::{PolicyToml, RootToml, code};
use fsbroker::Transport;
use serde_json::json;

/// Rule: each open session is listed once, oldest first, with what it did (requests, payload
/// bytes each way, errors and refusals; `ping` is no file access) and what it holds now
/// (kept locks, watches, grants); a session that has ended is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_show_what_each_server_did_and_holds() {
    let mut root = PathBuf::new();
    let mem = Memory::new(|base| {
        root = base.join("r");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a.txt"), "hello").unwrap();
        PolicyToml::new().root(RootToml::at(&root).name("r").rw())
    });
    let a = mem.session();
    a.set_peer_name("alpha");
    let b = mem.session();
    b.set_transport(Transport::Stdio);

    ok(&a, "files/read", json!({"path": "r/a.txt"})).await;
    ok(&a, "ping", json!({})).await;
    ok(
        &b,
        "files/write",
        json!({"path": "r/b.txt", "content": "12345678"}),
    )
    .await;
    let refused = err(&b, "files/read", json!({"path": "/etc/passwd"})).await;
    assert_eq!(code(&refused), "PERMISSION_DENIED", "{refused}");
    let missing = err(&b, "files/read", json!({"path": "r/missing"})).await;
    assert_ne!(code(&missing), "PERMISSION_DENIED", "{missing}");
    ok(&b, "files/watch", json!({"path": "r"})).await;
    ok(
        &b,
        "files/write",
        json!({"path": "r/c.txt", "content": "x", "keepLocked": true}),
    )
    .await;

    let all = mem.broker.sessions();
    assert_eq!(all.len(), 2, "{all:?}");
    let (sa, sb) = (&all[0], &all[1]);
    assert!(sa.id < sb.id, "oldest first: {all:?}");
    assert_eq!(sa.id, a.id());
    assert_eq!(sa.server.as_deref(), Some("alpha"));
    assert_eq!(sa.transport, Transport::Library);
    assert_eq!((sa.requests, sa.bytes_read, sa.bytes_written), (1, 5, 0));
    assert_eq!((sa.errors, sa.denials, sa.locks, sa.watches), (0, 0, 0, 0));
    assert_eq!(sb.transport, Transport::Stdio);
    assert_eq!(sb.server, None);
    assert_eq!((sb.requests, sb.bytes_read, sb.bytes_written), (5, 0, 9));
    assert_eq!((sb.errors, sb.denials), (2, 1));
    assert_eq!((sb.locks, sb.watches, sb.uploads), (1, 1, 0));
    assert!(sb.grants.is_empty(), "an auto root needs no grant: {sb:?}");
    assert!(sa.started <= sb.started);

    drop(a);
    let left = mem.broker.sessions();
    assert_eq!(
        left.iter().map(|s| s.id).collect::<Vec<_>>(),
        [b.id()],
        "an ended session is not listed"
    );
}

/// Rule: a host's live view (`Broker::events`) gets each answered request as the audit log
/// would record it (method, path, outcome, bytes, the server's name as written), refusals
/// included, and `ping` not at all; with `redact_paths` the paths are their sha256 there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_gets_what_the_audit_log_records() {
    for redact in [false, true] {
        let mut root = PathBuf::new();
        let mem = Memory::new(|base| {
            root = base.join("r");
            std::fs::create_dir(&root).unwrap();
            std::fs::write(root.join("a.txt"), "hello").unwrap();
            let policy = PolicyToml::new().root(RootToml::at(&root).name("r"));
            if redact {
                policy.audit(&base.join("audit.jsonl"), "redact_paths = true")
            } else {
                policy
            }
        });
        let mut events = mem.broker.events();
        let s = mem.session();
        s.set_peer_name("<img src=x onerror=alert(1)>");
        ok(&s, "ping", json!({})).await;
        ok(&s, "files/read", json!({"path": "r/a.txt"})).await;
        err(&s, "files/read", json!({"path": "/etc/passwd"})).await;
        let read = events.try_recv().expect("the read's event");
        let refused = events.try_recv().expect("the refusal's event");
        assert!(
            events.try_recv().is_err(),
            "one event per request, none for ping"
        );
        let (read, refused) = (read.fields(), refused.fields());
        assert_eq!(read["session"], s.id());
        assert_eq!(read["method"], "files/read");
        assert_eq!(read["outcome"], "ok");
        assert_eq!(read["bytes"], 5);
        assert_eq!(read["server"], "<img src=x onerror=alert(1)>");
        assert_eq!(refused["outcome"], "PERMISSION_DENIED");
        if redact {
            assert!(read.get("path").is_none(), "{read:?}");
            assert_eq!(read["pathSha256"].as_str().map(str::len), Some(64));
        } else {
            assert_eq!(read["path"], "r/a.txt");
            assert_eq!(refused["path"], "/etc/passwd");
        }
    }
}

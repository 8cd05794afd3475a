//! Locks (SEP-1708; docs/protocol.md §5.10 "Locks and `files/unlock`"): two sessions of one broker, through the library
//! API, on real temporary directories.
//!
//! Readers never refuse readers; `keepLocked` on read, write and create returns a 128-bit
//! `lockId`; while a lock is kept the other session fails at once with `FILE_LOCKED` (naming the
//! request path, never the lock id) and the holder carries on; locks cover subtrees; they end
//! with `files/unlock` (own id only), with the session, or after `lock_timeout_ms`; `max_locks`
//! is a per-session quota; an upload in progress locks its path, and an abandoned one leaves
//! nothing behind; one file reached through several spellings is one lock.
//!
//! One file though long: each test is a rule of this part of the contract on the same fixture;
//! split by rule, the fixture and the contract's section would be scattered across files.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fsbroker::Session;
use serde_json::{Value, json};

use common::memory::{Memory, call_raw, err, ok};
use common::{PolicyToml, RootToml};

/// "At once": a refused request must come back well within this.
const AT_ONCE: Duration = Duration::from_secs(2);

/// A broker in process ([`Memory`]) over one read-write root `r` (consent auto) in a fresh
/// temporary directory.
struct Env {
    mem: Memory,
    /// The root's canonical path.
    root: PathBuf,
}

impl Env {
    /// `limits` is extra TOML for the `[limits]` table.
    fn new(limits: &str) -> Env {
        Env::with_inner_root(limits, None)
    }

    /// Like [`Env::new`]; with `inner`, the directory `r/INNER` (created here) is a second,
    /// nested read-write root named `inner`.
    fn with_inner_root(limits: &str, inner: Option<&str>) -> Env {
        let mut root = PathBuf::new();
        let mem = Memory::new(|base| {
            root = base.join("r");
            std::fs::create_dir(&root).unwrap();
            let mut policy = PolicyToml::new().root(RootToml::at(&root).name("r").rw());
            if let Some(inner) = inner {
                let dir = root.join(inner);
                std::fs::create_dir_all(&dir).unwrap();
                policy = policy.root(RootToml::at(&dir).name("inner").rw());
            }
            policy.unlimited_with(limits)
        });
        Env { mem, root }
    }

    /// A new session of the broker.
    fn session(&self) -> Session {
        self.mem.session()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The absolute spelling of `r/rel`.
    fn abs(&self, rel: &str) -> String {
        self.path(rel).to_str().unwrap().to_owned()
    }

    fn put(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(p, content).unwrap();
    }

    fn get(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap()
    }
}

/// A request that must fail at once with `FILE_LOCKED` naming `path`, and whose whole
/// response never mentions any of `secrets` (the holder's lock ids).
async fn locked(s: &Session, method: &str, params: Value, path: &str, secrets: &[&str]) {
    let started = Instant::now();
    let (v, raw) = call_raw(s, method, params.clone()).await;
    let took = started.elapsed();
    assert!(
        v.get("result").is_none(),
        "{method} {params} should be FILE_LOCKED: {v}"
    );
    let e = &v["error"];
    assert_eq!(e["code"], -32100, "{method} {params}: {e}");
    assert_eq!(e["data"]["code"], "FILE_LOCKED", "{method} {params}: {e}");
    assert_eq!(e["data"]["path"], path, "{method} {params}: {e}");
    assert!(
        took < AT_ONCE,
        "{method} {params} took {took:?}, not at once"
    );
    for id in secrets {
        assert!(!raw.contains(id), "the refusal leaks the lock id: {raw}");
    }
}

/// One request another session makes against a kept lock, and the path its `FILE_LOCKED`
/// refusal must name (for a rename onto a locked file, the new path).
struct Try {
    method: &'static str,
    params: Value,
    path: String,
}

impl Try {
    fn new(method: &'static str, params: Value, path: &str) -> Try {
        Try {
            method,
            params,
            path: path.to_owned(),
        }
    }
}

/// `files/read` of `path`.
fn read_of(path: &str) -> Try {
    Try::new("files/read", json!({ "path": path }), path)
}

/// `files/write` of `"b"` to `path`.
fn write_of(path: &str) -> Try {
    Try::new("files/write", json!({"path": path, "content": "b"}), path)
}

/// `files/delete` of `path`.
fn delete_of(path: &str) -> Try {
    Try::new("files/delete", json!({ "path": path }), path)
}

/// Every try must fail at once with `FILE_LOCKED` (see [`locked`]), in order.
async fn all_locked(s: &Session, secrets: &[&str], tries: Vec<Try>) {
    for t in tries {
        locked(s, t.method, t.params, &t.path, secrets).await;
    }
}

/// `keepLocked` result's lock id, checked to be 128 bits of hex.
fn lock_id(result: &Value) -> String {
    let id = result["lockId"]
        .as_str()
        .unwrap_or_else(|| panic!("no lockId in {result}"))
        .to_owned();
    assert_eq!(id.len(), 32, "lockId is not 32 hex chars: {id}");
    assert!(
        id.bytes().all(|b| b.is_ascii_hexdigit()),
        "lockId is not hex: {id}"
    );
    id
}

async fn keep_write(s: &Session, path: &str, content: &str) -> String {
    lock_id(
        &ok(
            s,
            "files/write",
            json!({"path": path, "content": content, "keepLocked": true}),
        )
        .await,
    )
}

async fn keep_read(s: &Session, path: &str) -> String {
    lock_id(&ok(s, "files/read", json!({"path": path, "keepLocked": true})).await)
}

async fn read_text(s: &Session, path: &str) -> String {
    let r = ok(s, "files/read", json!({"path": path})).await;
    r["content"].as_str().expect("text content").to_owned()
}

async fn write(s: &Session, path: &str, content: &str) -> Value {
    ok(s, "files/write", json!({"path": path, "content": content})).await
}

/// Names in `dir` that look like fsbroker staging files.
fn staging_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".fsbroker-"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn readers_never_refuse_readers() {
    let env = Env::new("");
    // Large enough that two reads of it overlap on the blocking pool.
    let big = "x".repeat(2 << 20);
    env.put("f.txt", &big);
    let a = env.session();
    let b = env.session();
    for _ in 0..8 {
        let params = json!({"path": "r/f.txt", "length": 4 << 20});
        let (ra, rb, ra2, rb2) = tokio::join!(
            call_raw(&a, "files/read", params.clone()),
            call_raw(&b, "files/read", params.clone()),
            call_raw(&a, "files/read", json!({"path": env.abs("f.txt")})),
            call_raw(&b, "files/read", json!({"path": "r/f.txt", "offset": 100})),
        );
        for (v, _) in [&ra, &rb, &ra2, &rb2] {
            assert!(v.get("error").is_none(), "a reader was refused: {v}");
            assert!(
                v["result"].get("lockId").is_none(),
                "plain read kept a lock"
            );
        }
        assert_eq!(ra.0["result"]["content"].as_str().unwrap().len(), big.len());
        assert_eq!(rb.0["result"]["content"].as_str().unwrap().len(), big.len());
    }
    // Plain reads leave nothing behind: the other session can write at once.
    write(&b, "r/f.txt", "after").await;
    assert_eq!(read_text(&a, "r/f.txt").await, "after");
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_locked_on_write_read_create_returns_distinct_128_bit_ids() {
    let env = Env::new("");
    env.put("read.txt", "r");
    let a = env.session();
    let b = env.session();

    let plain = write(&a, "r/plain.txt", "p").await;
    assert!(
        plain.get("lockId").is_none(),
        "no keepLocked, no lockId: {plain}"
    );
    let plain = ok(
        &a,
        "files/create",
        json!({"path": "r/plain2.txt", "type": "file"}),
    )
    .await;
    assert!(
        plain.get("lockId").is_none(),
        "no keepLocked, no lockId: {plain}"
    );

    let mut ids = vec![
        keep_write(&a, "r/write.txt", "w").await,
        keep_read(&a, "r/read.txt").await,
        lock_id(
            &ok(
                &a,
                "files/create",
                json!({"path": "r/created.txt", "type": "file", "keepLocked": true}),
            )
            .await,
        ),
        lock_id(
            &ok(
                &a,
                "files/create",
                json!({"path": "r/dir", "type": "directory", "keepLocked": true}),
            )
            .await,
        ),
        keep_write(&b, "r/b-write.txt", "bw").await,
        keep_read(&b, "r/plain.txt").await,
    ];
    let n = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "lock ids repeat: {ids:?}");
    // The results are otherwise the ordinary ones.
    assert_eq!(env.get("write.txt"), "w");
    assert!(env.path("created.txt").is_file());
    assert!(env.path("dir").is_dir());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_lock_refuses_the_other_session_at_once_and_not_its_holder() {
    let env = Env::new("");
    env.put("f.txt", "old");
    env.put("h.txt", "other file");
    let a = env.session();
    let b = env.session();
    let id = keep_write(&a, "r/f.txt", "held by a").await;
    let ids = [id.as_str()];

    all_locked(
        &b,
        &ids,
        vec![
            read_of("r/f.txt"),
            Try::new(
                "files/read",
                json!({"path": "r/f.txt", "keepLocked": true}),
                "r/f.txt",
            ),
            Try::new(
                "files/write",
                json!({"path": "r/f.txt", "content": "b was here"}),
                "r/f.txt",
            ),
            Try::new(
                "files/write",
                json!({"path": "r/f.txt", "content": "b", "append": true}),
                "r/f.txt",
            ),
            Try::new(
                "files/write",
                json!({"path": "r/f.txt", "content": "b", "offset": 0, "final": false}),
                "r/f.txt",
            ),
            delete_of("r/f.txt"),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/f.txt", "newPath": "r/g.txt"}),
                "r/f.txt",
            ),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/h.txt", "newPath": "r/f.txt", "overwrite": true}),
                "r/f.txt",
            ),
            Try::new(
                "files/create",
                json!({"path": "r/f.txt", "type": "file"}),
                "r/f.txt",
            ),
        ],
    )
    .await;

    // Nothing b tried changed anything.
    assert_eq!(env.get("f.txt"), "held by a");
    assert_eq!(env.get("h.txt"), "other file");
    assert!(!env.path("g.txt").exists());
    assert!(
        staging_names(&env.root).is_empty(),
        "{:?}",
        staging_names(&env.root)
    );

    // The holder carries on: read, replace, append, chunked upload, create of what exists.
    assert_eq!(read_text(&a, "r/f.txt").await, "held by a");
    write(&a, "r/f.txt", "a again").await;
    ok(
        &a,
        "files/write",
        json!({"path": "r/f.txt", "content": "!", "append": true}),
    )
    .await;
    assert_eq!(env.get("f.txt"), "a again!");
    ok(
        &a,
        "files/write",
        json!({"path": "r/f.txt", "content": "up", "offset": 0, "final": false}),
    )
    .await;
    ok(
        &a,
        "files/write",
        json!({"path": "r/f.txt", "content": "load", "offset": 2, "final": true}),
    )
    .await;
    assert_eq!(env.get("f.txt"), "upload");
    let c = ok(
        &a,
        "files/create",
        json!({"path": "r/f.txt", "type": "file"}),
    )
    .await;
    assert_eq!(c["created"], false);

    // The lock is still kept after all that.
    all_locked(&b, &ids, vec![read_of("r/f.txt")]).await;

    // The holder can also delete and rename what it keeps.
    env.put("gone.txt", "g");
    env.put("mv.txt", "m");
    let gone = keep_read(&a, "r/gone.txt").await;
    let mv = keep_read(&a, "r/mv.txt").await;
    all_locked(&b, &[&gone], vec![delete_of("r/gone.txt")]).await;
    ok(&a, "files/delete", json!({"path": "r/gone.txt"})).await;
    assert!(!env.path("gone.txt").exists());
    all_locked(
        &b,
        &[&mv],
        vec![Try::new(
            "files/rename",
            json!({"oldPath": "r/mv.txt", "newPath": "r/mv2.txt"}),
            "r/mv.txt",
        )],
    )
    .await;
    ok(
        &a,
        "files/rename",
        json!({"oldPath": "r/mv.txt", "newPath": "r/mv2.txt"}),
    )
    .await;
    assert_eq!(env.get("mv2.txt"), "m");

    // Other paths are not locked.
    write(&b, "r/h.txt", "b writes elsewhere").await;
    write(&b, "r/f.txt.bak", "prefix sibling").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_lock_covers_its_subtree() {
    let env = Env::new("");
    env.put("d/inside.txt", "inside");
    env.put("dx/sibling.txt", "sibling");
    let a = env.session();
    let b = env.session();
    let id = lock_id(
        &ok(
            &a,
            "files/create",
            json!({"path": "r/d", "type": "directory", "keepLocked": true}),
        )
        .await,
    );
    let ids = [id.as_str()];

    all_locked(&b, &ids, vec![write_of("r/d/new.txt")]).await;
    assert!(!env.path("d/new.txt").exists());
    all_locked(
        &b,
        &ids,
        vec![
            write_of("r/d/inside.txt"),
            read_of("r/d/inside.txt"),
            delete_of("r/d/inside.txt"),
            Try::new(
                "files/delete",
                json!({"path": "r/d", "recursive": true}),
                "r/d",
            ),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/d/inside.txt", "newPath": "r/out.txt"}),
                "r/d/inside.txt",
            ),
            Try::new(
                "files/create",
                json!({"path": "r/d/newdir", "type": "directory"}),
                "r/d/newdir",
            ),
        ],
    )
    .await;
    assert!(!env.path("d/newdir").exists());
    env.put("loose.txt", "loose");
    all_locked(
        &b,
        &ids,
        vec![Try::new(
            "files/rename",
            json!({"oldPath": "r/loose.txt", "newPath": "r/d/moved.txt"}),
            "r/d/moved.txt",
        )],
    )
    .await;
    assert!(env.path("loose.txt").exists() && !env.path("d/moved.txt").exists());
    // A create that would make parents beneath the locked directory must not make them.
    all_locked(
        &b,
        &ids,
        vec![Try::new(
            "files/create",
            json!({"path": "r/d/sub/deeper.txt", "type": "file"}),
            "r/d/sub/deeper.txt",
        )],
    )
    .await;
    assert!(
        !env.path("d/sub").exists(),
        "a refused create made directories beneath another session's locked directory"
    );
    assert_eq!(env.get("d/inside.txt"), "inside");
    assert!(!env.path("out.txt").exists());

    // The holder works beneath it; a prefix sibling is not covered.
    write(&a, "r/d/new.txt", "a").await;
    assert_eq!(env.get("d/new.txt"), "a");
    write(&b, "r/dx/sibling.txt", "b").await;
    assert_eq!(env.get("dx/sibling.txt"), "b");

    ok(&a, "files/unlock", json!({"lockId": id})).await;
    write(&b, "r/d/inside.txt", "b after unlock").await;
    assert_eq!(env.get("d/inside.txt"), "b after unlock");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_lock_covers_its_ancestors_against_delete_and_rename() {
    let env = Env::new("");
    env.put("p/q/f.txt", "deep");
    env.put("p/other.txt", "other");
    env.put("px/f.txt", "prefix sibling");
    let a = env.session();
    let b = env.session();
    let id = keep_write(&a, "r/p/q/f.txt", "kept").await;
    let ids = [id.as_str()];

    all_locked(
        &b,
        &ids,
        vec![
            Try::new(
                "files/delete",
                json!({"path": "r/p", "recursive": true}),
                "r/p",
            ),
            Try::new(
                "files/delete",
                json!({"path": "r/p/q", "recursive": true}),
                "r/p/q",
            ),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/p", "newPath": "r/p2"}),
                "r/p",
            ),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/p/q", "newPath": "r/q2"}),
                "r/p/q",
            ),
        ],
    )
    .await;
    // Renaming another directory over an ancestor would pull the file away too.
    std::fs::create_dir(env.path("empty")).unwrap();
    all_locked(
        &b,
        &ids,
        vec![Try::new(
            "files/rename",
            json!({"oldPath": "r/empty", "newPath": "r/p/q", "overwrite": true}),
            "r/p/q",
        )],
    )
    .await;
    assert_eq!(env.get("p/q/f.txt"), "kept");
    assert!(!env.path("p2").exists() && !env.path("q2").exists());

    // Siblings and prefix siblings are not covered; neither is a read of the directory.
    write(&b, "r/p/other.txt", "b").await;
    write(&b, "r/px/f.txt", "b").await;
    ok(&b, "files/list", json!({"path": "r/p", "recursive": true})).await;
    ok(
        &b,
        "files/delete",
        json!({"path": "r/px", "recursive": true}),
    )
    .await;

    // The holder may move the tree it holds a lock in.
    ok(
        &a,
        "files/rename",
        json!({"oldPath": "r/p", "newPath": "r/p3"}),
    )
    .await;
    assert_eq!(env.get("p3/q/f.txt"), "kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn unlock_releases_only_with_the_holders_own_id() {
    let env = Env::new("");
    env.put("f.txt", "old");
    let a = env.session();
    let b = env.session();
    let id = keep_write(&a, "r/f.txt", "a").await;
    let b_id = keep_write(&b, "r/g.txt", "b").await;

    // Another session's id: refused, and the lock stays.
    let e = err(&b, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(e["code"], -32602, "{e}");
    all_locked(&b, &[&id], vec![read_of("r/f.txt")]).await;
    // A made-up id, from either session: refused, the lock stays.
    for made_up in [
        "0".repeat(32),
        "f".repeat(32),
        "not-a-lock".to_owned(),
        String::new(),
    ] {
        for s in [&a, &b] {
            let e = err(s, "files/unlock", json!({"lockId": made_up})).await;
            assert_eq!(e["code"], -32602, "{made_up:?}: {e}");
        }
    }
    // The id in another case is not the id either.
    if id.to_uppercase() != id {
        let e = err(&a, "files/unlock", json!({"lockId": id.to_uppercase()})).await;
        assert_eq!(e["code"], -32602, "{e}");
    }
    all_locked(&b, &[&id], vec![write_of("r/f.txt")]).await;
    // b's lock is b's: a cannot release it either.
    let e = err(&a, "files/unlock", json!({"lockId": b_id})).await;
    assert_eq!(e["code"], -32602, "{e}");
    all_locked(&a, &[&b_id], vec![read_of("r/g.txt")]).await;
    assert_eq!(env.get("f.txt"), "a");

    // The holder's unlock releases: `{}`, and the other session then succeeds.
    let r = ok(&a, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(r, json!({}));
    write(&b, "r/f.txt", "b now").await;
    assert_eq!(env.get("f.txt"), "b now");
    // Twice is unknown.
    let e = err(&a, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(e["code"], -32602, "{e}");

    ok(&b, "files/unlock", json!({"lockId": b_id})).await;
    write(&a, "r/g.txt", "a now").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_lock_ends_with_its_session() {
    let env = Env::new("");
    env.put("f.txt", "old");
    env.put("d/x.txt", "x");
    let a = env.session();
    let b = env.session();
    let id = keep_write(&a, "r/f.txt", "a").await;
    let dir_id = lock_id(
        &ok(
            &a,
            "files/create",
            json!({"path": "r/d", "type": "directory", "keepLocked": true}),
        )
        .await,
    );
    all_locked(&b, &[&id], vec![read_of("r/f.txt")]).await;
    all_locked(&b, &[&dir_id], vec![write_of("r/d/x.txt")]).await;

    drop(a);

    write(&b, "r/f.txt", "b").await;
    write(&b, "r/d/x.txt", "b").await;
    ok(
        &b,
        "files/delete",
        json!({"path": "r/d", "recursive": true}),
    )
    .await;
    assert_eq!(env.get("f.txt"), "b");
    // The ended session's id means nothing to anyone now.
    let e = err(&b, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(e["code"], -32602, "{e}");
    // A new session may keep the path.
    let c = env.session();
    keep_read(&c, "r/f.txt").await;
    all_locked(&b, &[], vec![read_of("r/f.txt")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kept_lock_ends_after_lock_timeout_ms() {
    let env = Env::new("lock_timeout_ms = 300");
    env.put("f.txt", "old");
    let a = env.session();
    let b = env.session();
    let id = keep_write(&a, "r/f.txt", "a").await;
    all_locked(&b, &[&id], vec![write_of("r/f.txt")]).await;

    tokio::time::sleep(Duration::from_millis(600)).await;

    write(&b, "r/f.txt", "b").await;
    assert_eq!(env.get("f.txt"), "b");
    // Now b may keep it, and a is the one refused.
    let b_id = keep_read(&b, "r/f.txt").await;
    assert_ne!(b_id, id);
    all_locked(&a, &[&b_id], vec![read_of("r/f.txt")]).await;
    // a's expired id no longer unlocks anything (and certainly not b's lock).
    let e = err(&a, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(e["code"], -32602, "{e}");
    all_locked(&a, &[&b_id], vec![read_of("r/f.txt")]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_locks_is_a_per_session_quota() {
    let env = Env::new("max_locks = 2");
    for n in 1..=5 {
        env.put(&format!("{n}.txt"), &format!("file {n}"));
    }
    let a = env.session();
    let b = env.session();
    let id1 = keep_read(&a, "r/1.txt").await;
    keep_read(&a, "r/2.txt").await;

    let e = err(
        &a,
        "files/read",
        json!({"path": "r/3.txt", "keepLocked": true}),
    )
    .await;
    assert_eq!(e["code"], -31007, "{e}");
    assert_eq!(e["data"]["code"], "QUOTA_EXCEEDED", "{e}");
    // The refused keep left no lock behind.
    write(&b, "r/3.txt", "b wrote 3").await;
    // A plain read is not a kept lock and is not counted.
    assert_eq!(read_text(&a, "r/3.txt").await, "b wrote 3");

    // The quota is per session: b has its own two.
    keep_read(&b, "r/4.txt").await;
    keep_read(&b, "r/5.txt").await;
    let e = err(
        &b,
        "files/write",
        json!({"path": "r/3.txt", "content": "x", "keepLocked": true}),
    )
    .await;
    assert_eq!(e["code"], -31007, "{e}");

    // Unlocking frees a slot.
    ok(&a, "files/unlock", json!({"lockId": id1})).await;
    keep_read(&a, "r/3.txt").await;
    all_locked(&b, &[], vec![read_of("r/3.txt")]).await;
}

/// A `keepLocked` request refused for the lock quota is an error: the client is told the
/// operation failed, so it must not have happened.
#[tokio::test(flavor = "multi_thread")]
async fn a_keep_refused_by_the_quota_changes_nothing() {
    let env = Env::new("max_locks = 1");
    env.put("held.txt", "h");
    env.put("w.txt", "old");
    let a = env.session();
    keep_read(&a, "r/held.txt").await;

    let e = err(
        &a,
        "files/write",
        json!({"path": "r/w.txt", "content": "new", "keepLocked": true}),
    )
    .await;
    assert_eq!(e["code"], -31007, "{e}");
    let e2 = err(
        &a,
        "files/create",
        json!({"path": "r/c.txt", "type": "file", "keepLocked": true}),
    )
    .await;
    assert_eq!(e2["code"], -31007, "{e2}");
    assert!(staging_names(&env.root).is_empty());
    let mut wrong = Vec::new();
    if env.get("w.txt") != "old" {
        wrong.push("files/write answered QUOTA_EXCEEDED but replaced the file anyway");
    }
    if env.path("c.txt").exists() {
        wrong.push("files/create answered QUOTA_EXCEEDED but created the file anyway");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_in_progress_locks_its_path() {
    let env = Env::new("");
    env.put("up.bin", "old content");
    let a = env.session();
    let b = env.session();
    let first = ok(
        &a,
        "files/write",
        json!({"path": "r/up.bin", "content": "AAAA", "offset": 0, "final": false}),
    )
    .await;
    assert!(first.get("lockId").is_none(), "{first}");

    all_locked(
        &b,
        &[],
        vec![
            read_of("r/up.bin"),
            write_of("r/up.bin"),
            Try::new(
                "files/write",
                json!({"path": "r/up.bin", "content": "b", "offset": 0, "final": false}),
                "r/up.bin",
            ),
        ],
    )
    .await;
    // b cannot continue a's upload either (it has none; a's is a's).
    let e = err(
        &b,
        "files/write",
        json!({"path": "r/up.bin", "content": "b", "offset": 4, "final": true}),
    )
    .await;
    assert!(
        e["data"]["code"] == "FILE_LOCKED" || e["data"]["code"] == "CONCURRENCY_CONFLICT",
        "{e}"
    );
    all_locked(
        &b,
        &[],
        vec![
            delete_of("r/up.bin"),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/up.bin", "newPath": "r/moved.bin"}),
                "r/up.bin",
            ),
        ],
    )
    .await;
    // The target keeps its old content until the final chunk; the uploader may read it.
    assert_eq!(env.get("up.bin"), "old content");
    assert_eq!(read_text(&a, "r/up.bin").await, "old content");

    ok(
        &a,
        "files/write",
        json!({"path": "r/up.bin", "content": "BBBB", "offset": 4, "final": true}),
    )
    .await;
    assert_eq!(env.get("up.bin"), "AAAABBBB");
    assert_eq!(read_text(&b, "r/up.bin").await, "AAAABBBB");
    write(&b, "r/up.bin", "b after").await;
    assert_eq!(env.get("up.bin"), "b after");
    assert!(staging_names(&env.root).is_empty());

    // An upload to a new path locks that path too.
    ok(
        &a,
        "files/write",
        json!({"path": "r/new.bin", "content": "N", "offset": 0, "final": false}),
    )
    .await;
    all_locked(
        &b,
        &[],
        vec![
            write_of("r/new.bin"),
            Try::new(
                "files/create",
                json!({"path": "r/new.bin", "type": "file"}),
                "r/new.bin",
            ),
        ],
    )
    .await;
    assert!(!env.path("new.bin").exists());
    ok(
        &a,
        "files/write",
        json!({"path": "r/new.bin", "content": "EW", "offset": 1, "final": true}),
    )
    .await;
    assert_eq!(read_text(&b, "r/new.bin").await, "NEW");

    // An upload whose final chunk asks keepLocked keeps the path past the commit.
    ok(
        &a,
        "files/write",
        json!({"path": "r/up.bin", "content": "K", "offset": 0, "final": false}),
    )
    .await;
    let id = lock_id(
        &ok(
            &a,
            "files/write",
            json!({"path": "r/up.bin", "content": "EPT", "offset": 1, "final": true, "keepLocked": true}),
        )
        .await,
    );
    all_locked(&b, &[&id], vec![read_of("r/up.bin")]).await;
    ok(&a, "files/unlock", json!({"lockId": id})).await;
    assert_eq!(read_text(&b, "r/up.bin").await, "KEPT");
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_session_mid_upload_removes_its_staging_file_and_releases_the_path() {
    let env = Env::new("");
    env.put("up.bin", "old content");
    env.put("sub/deep.bin", "old deep");
    let a = env.session();
    let b = env.session();
    for path in ["r/up.bin", "r/sub/deep.bin", "r/sub/fresh.bin"] {
        ok(
            &a,
            "files/write",
            json!({"path": path, "content": "partial", "offset": 0, "final": false}),
        )
        .await;
    }
    assert_eq!(staging_names(&env.root).len(), 1, "one upload staged in r/");
    assert_eq!(
        staging_names(&env.path("sub")).len(),
        2,
        "two staged in r/sub"
    );
    all_locked(&b, &[], vec![write_of("r/up.bin")]).await;

    drop(a);

    assert!(
        staging_names(&env.root).is_empty(),
        "{:?}",
        staging_names(&env.root)
    );
    assert!(
        staging_names(&env.path("sub")).is_empty(),
        "{:?}",
        staging_names(&env.path("sub"))
    );
    assert_eq!(env.get("up.bin"), "old content");
    assert_eq!(env.get("sub/deep.bin"), "old deep");
    assert!(!env.path("sub/fresh.bin").exists());

    assert_eq!(read_text(&b, "r/up.bin").await, "old content");
    write(&b, "r/up.bin", "b").await;
    write(&b, "r/sub/fresh.bin", "b").await;
    // b can run its own upload there now.
    ok(
        &b,
        "files/write",
        json!({"path": "r/sub/deep.bin", "content": "bb", "offset": 0, "final": false}),
    )
    .await;
    ok(
        &b,
        "files/write",
        json!({"path": "r/sub/deep.bin", "content": "b", "offset": 2}),
    )
    .await;
    assert_eq!(env.get("sub/deep.bin"), "bbb");
    assert_eq!(env.get("up.bin"), "b");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_file_under_several_spellings_is_one_lock() {
    let env = Env::new("");
    env.put("f.txt", "content");
    std::os::unix::fs::symlink("f.txt", env.path("alias")).unwrap();
    let a = env.session();
    let b = env.session();
    let abs = env.abs("f.txt");
    let uri = format!("file://{abs}");

    // Kept through the root-name spelling.
    let id = keep_read(&a, "r/f.txt").await;
    let ids = [id.as_str()];
    all_locked(
        &b,
        &ids,
        vec![
            read_of(&abs),
            read_of(&uri),
            read_of("r/alias"),
            write_of(&abs),
            write_of("r/alias"),
            delete_of(&abs),
        ],
    )
    .await;
    assert_eq!(env.get("f.txt"), "content");
    assert!(env.path("alias").is_symlink());
    // The holder reaches it under every spelling.
    assert_eq!(read_text(&a, &abs).await, "content");
    assert_eq!(read_text(&a, "r/alias").await, "content");
    ok(&a, "files/unlock", json!({"lockId": id})).await;

    // Kept through the absolute spelling.
    let id = keep_write(&a, &abs, "v2").await;
    let ids = [id.as_str()];
    all_locked(
        &b,
        &ids,
        vec![
            read_of("r/f.txt"),
            read_of("r/alias"),
            Try::new(
                "files/rename",
                json!({"oldPath": "r/f.txt", "newPath": "r/g.txt"}),
                "r/f.txt",
            ),
        ],
    )
    .await;
    ok(&a, "files/unlock", json!({"lockId": id})).await;

    // Kept through the symlink: the lock is on the file it leads to.
    let id = keep_read(&a, "r/alias").await;
    let ids = [id.as_str()];
    all_locked(
        &b,
        &ids,
        vec![read_of("r/f.txt"), write_of("r/f.txt"), read_of(&abs)],
    )
    .await;
    // Keeping the same file under another spelling in the same session is the same lock
    // (or at least not a conflict with itself).
    keep_read(&a, &abs).await;
    ok(&a, "files/unlock", json!({"lockId": id})).await;

    assert_eq!(env.get("f.txt"), "v2");
    // With a's locks gone (the second keep of the same file may have returned the same id
    // or a new one; end the session to be sure), b succeeds under every spelling.
    drop(a);
    assert_eq!(read_text(&b, "r/alias").await, "v2");
    write(&b, "r/alias", "b").await;
    assert_eq!(read_text(&b, &uri).await, "b");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_symlinked_directory_and_a_nested_root_reach_the_same_lock() {
    let env = Env::with_inner_root("", Some("sub"));
    env.put("sub/f.txt", "content");
    std::os::unix::fs::symlink("sub", env.path("dl")).unwrap();
    let a = env.session();
    let b = env.session();

    let id = keep_write(&a, "r/sub/f.txt", "a").await;
    let ids = [id.as_str()];
    all_locked(
        &b,
        &ids,
        vec![
            write_of("r/dl/f.txt"),
            read_of("r/dl/f.txt"),
            write_of("inner/f.txt"),
            read_of("inner/f.txt"),
            delete_of("inner/f.txt"),
        ],
    )
    .await;
    assert_eq!(env.get("sub/f.txt"), "a");
    ok(&a, "files/unlock", json!({"lockId": id})).await;

    // And the other way round: kept through the nested root, seen through the outer one.
    let id = keep_read(&a, "inner/f.txt").await;
    all_locked(&b, &[&id], vec![write_of("r/sub/f.txt")]).await;
    ok(&a, "files/unlock", json!({"lockId": id})).await;
    write(&b, "r/dl/f.txt", "b").await;
    assert_eq!(env.get("sub/f.txt"), "b");
}

//! The tests' loopback npm registry (`tests/common/registry.rs`) against plain HTTP and the
//! real npm: what it serves matches the lock, and `npm exec`/`npx` with a cold cache install
//! the reference filesystem server from it and nothing else, then start it from the cache
//! alone once the registry is gone.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use common::registry::{
    NpmRegistry, clear_npm_env, lock_tarballs, npm, npm_env, npx, output_within,
    require_local_install, require_tarballs, sha1_hex,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha512};

const SERVER: &str = "@modelcontextprotocol/server-filesystem";
const VERSION: &str = "2026.8.31";
/// Bounds one npm command (a cold install of the server's ~100 packages takes seconds).
const LIMIT: Duration = Duration::from_secs(240);

/// `GET path` on a connection of its own: the status code and the body.
fn get(registry: &NpmRegistry, path: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", registry.port())).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/vnd.npm.install-v1+json; q=1.0, application/json; q=0.8, */*\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).expect("read the answer");
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let status = head.split(' ').nth(1).expect("status").parse().unwrap();
    (status, all[split + 4..].to_vec())
}

/// `tests/launchers/npm/package-lock.json`.
fn lock_json() -> Value {
    let path = common::registry::project_dir().join("package-lock.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).expect("a JSON body")
}

#[test]
fn serves_the_locks_packuments_and_tarballs_over_http() {
    let registry = NpmRegistry::start(&require_tarballs());
    assert_eq!(registry.served().len(), lock_tarballs().len());
    assert!(registry.url().starts_with("http://127.0.0.1:"));

    let (status, body) = get(&registry, "/@modelcontextprotocol%2fserver-filesystem");
    assert_eq!(status, 200);
    let packument = json_of(&body);
    assert_eq!(packument["name"], SERVER);
    assert_eq!(packument["dist-tags"]["latest"], VERSION);
    let v = &packument["versions"][VERSION];
    assert_eq!(v["name"], SERVER);
    assert_eq!(v["bin"]["mcp-server-filesystem"], "dist/index.js");
    assert!(v["dependencies"]["@modelcontextprotocol/sdk"].is_string());
    // The same packument under the other spellings of a scoped name.
    for path in [
        "/@modelcontextprotocol%2Fserver-filesystem",
        "/@modelcontextprotocol/server-filesystem",
    ] {
        let (status, other) = get(&registry, path);
        assert_eq!(
            (status, json_of(&other)),
            (200, packument.clone()),
            "{path}"
        );
    }

    // The tarball is the lock's, byte for byte, and the packument's hashes are its own.
    let tarball = v["dist"]["tarball"].as_str().unwrap();
    let file = format!("modelcontextprotocol-server-filesystem-{VERSION}.tgz");
    assert_eq!(tarball, format!("{}tarballs/{file}", registry.url()));
    let (status, bytes) = get(&registry, &format!("/tarballs/{file}"));
    assert_eq!(status, 200);
    let integrity = format!(
        "sha512-{}",
        base64::engine::general_purpose::STANDARD.encode(Sha512::digest(&bytes))
    );
    assert_eq!(v["dist"]["integrity"], integrity);
    assert_eq!(
        lock_json()["packages"][format!("node_modules/{SERVER}")]["integrity"],
        integrity
    );
    let sha1sum = Command::new("sha1sum")
        .arg(
            common::registry::launchers_dir()
                .join("tarballs")
                .join(&file),
        )
        .output()
        .expect("sha1sum");
    let expected = String::from_utf8(sha1sum.stdout).unwrap();
    assert_eq!(v["dist"]["shasum"], expected.split(' ').next().unwrap());
    assert_eq!(sha1_hex(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");

    // A package with two versions in the tree: the highest is latest.
    let (_, body) = get(&registry, "/content-type");
    let versions = json_of(&body);
    assert_eq!(versions["dist-tags"]["latest"], "2.1.0");
    assert!(versions["versions"]["1.0.5"].is_object());

    for path in ["/left-pad", "/tarballs/left-pad-1.3.0.tgz", "/-/ping", "/"] {
        let (status, body) = get(&registry, path);
        assert_eq!(
            (status, json_of(&body)),
            (404, json!({"error": "not found"}))
        );
    }

    // Two requests on one kept-alive connection.
    let mut s = TcpStream::connect(("127.0.0.1", registry.port())).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        write!(s, "GET /zod HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line.trim_end().is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        assert_eq!(json_of(&body)["name"], "zod");
    }

    let seen = registry.requests();
    assert_eq!(seen[0], "/@modelcontextprotocol%2fserver-filesystem");
    assert_eq!(seen.iter().filter(|p| *p == "/zod").count(), 2);
    assert_eq!(
        registry.tarballs_fetched(),
        vec![file, "left-pad-1.3.0.tgz".to_owned()]
    );
    assert_eq!(
        registry.misses(),
        ["/left-pad", "/tarballs/left-pad-1.3.0.tgz", "/-/ping", "/"]
    );

    // Dropped, it stops: its port refuses, and the kept-alive connection is closed.
    let port = registry.port();
    drop(registry);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    let mut rest = Vec::new();
    assert_eq!(reader.read_to_end(&mut rest).ok(), Some(0));
}

/// Kills a process group when dropped (a server left running by a failed assertion).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        common::procs::kill_group(self.0);
    }
}

#[test]
fn npx_installs_the_server_from_the_registry_then_starts_it_offline() {
    let registry = NpmRegistry::start(&require_tarballs());
    let url = registry.url();
    let (_t, dir) = common::tempdir();
    let (home, cache, work) = (dir.join("home"), dir.join("cache"), dir.join("work"));
    for d in [&home, &cache, &work] {
        std::fs::create_dir(d).unwrap();
    }
    let env = npm_env(&url, &cache, &home);

    // A cold cache: `npm exec` must fetch the server and its tree from the registry.
    let mut exec = Command::new(npm());
    clear_npm_env(&mut exec)
        .args(["exec", "--yes", "--package"])
        .arg(format!("{SERVER}@{VERSION}"))
        .args(["--", "node", "-e", ""])
        .current_dir(&work)
        .envs(env.iter().cloned());
    let out = output_within(&mut exec, LIMIT);
    assert!(
        out.status.success(),
        "npm exec failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let installed: Vec<_> = std::fs::read_dir(cache.join("_npx"))
        .expect("npm exec made <cache>/_npx")
        .map(|e| e.unwrap().path().join("node_modules"))
        .filter(|m| m.join(SERVER).join("package.json").is_file())
        .collect();
    assert_eq!(installed.len(), 1, "the server in exactly one _npx install");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(installed[0].join(SERVER).join("package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["version"], VERSION);
    // Hoisted: its dependencies beside it.
    assert!(
        installed[0]
            .join("@modelcontextprotocol/sdk/package.json")
            .is_file()
    );
    let seen = registry.requests();
    assert!(
        seen.contains(&"/@modelcontextprotocol%2fserver-filesystem".to_owned()),
        "{seen:?}"
    );
    let fetched = registry.tarballs_fetched();
    assert!(
        fetched.contains(&format!(
            "modelcontextprotocol-server-filesystem-{VERSION}.tgz"
        )),
        "{fetched:?}"
    );
    // npm asked for nothing the registry lacks (no audit, no update check, no other package)
    // but the optional peers the lock leaves out, whose packuments npm looks at and does
    // without (`@cfworker/json-schema`, of the SDK).
    let lock = lock_json();
    let optional_peers: Vec<String> = lock["packages"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|p| p["peerDependenciesMeta"].as_object())
        .flat_map(|meta| meta.iter())
        .filter(|(name, m)| {
            m["optional"] == true && lock["packages"][format!("node_modules/{name}")].is_null()
        })
        .map(|(name, _)| format!("/{}", name.replace('/', "%2f")))
        .collect();
    let misses = registry.misses();
    assert!(
        misses.iter().all(|m| optional_peers.contains(m)),
        "npm asked for what the registry lacks: {misses:?} (optional peers: {optional_peers:?})"
    );
    println!(
        "npm exec: {} requests, {} tarballs of {} served",
        seen.len(),
        fetched.len(),
        registry.served().len()
    );

    // The registry gone, `npx -y` starts the server from the cache alone.
    drop(registry);
    let stderr = std::fs::File::create(dir.join("npx.log")).unwrap();
    let mut npx_cmd = Command::new(npx());
    clear_npm_env(&mut npx_cmd)
        .args(["-y", SERVER])
        .arg(&work)
        .current_dir(&work)
        .envs(env.iter().cloned())
        .env("npm_config_offline", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .process_group(0);
    let mut child = npx_cmd.spawn().expect("run npx");
    let _group = Group(child.id());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"1"}}}}}}"#
    )
    .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(LIMIT).unwrap_or_else(|_| {
        panic!(
            "no answer to initialize within {LIMIT:?}; npx said:\n{}",
            std::fs::read_to_string(dir.join("npx.log")).unwrap_or_default()
        )
    });
    let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {line:?}; npx said:\n{}",
            std::fs::read_to_string(dir.join("npx.log")).unwrap_or_default()
        )
    });
    assert_eq!(answer["id"], 1, "{answer}");
    assert_eq!(
        answer["result"]["protocolVersion"], "2025-06-18",
        "{answer}"
    );
    assert!(
        answer["result"]["serverInfo"]["name"].is_string(),
        "{answer}"
    );
    // Its input closed, the server ends.
    drop(stdin);
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < end,
            "the server did not end at EOF"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_project_local_install_is_the_locks_hoisted_tree() {
    let modules = require_local_install().join("node_modules");
    let version = |package: &str| -> Value {
        let manifest = modules.join(package).join("package.json");
        serde_json::from_slice::<Value>(&std::fs::read(&manifest).unwrap()).unwrap()["version"]
            .clone()
    };
    let lock = lock_json();
    for package in [SERVER, "@modelcontextprotocol/sdk", "zod"] {
        assert_eq!(
            version(package),
            lock["packages"][format!("node_modules/{package}")]["version"],
            "{package}"
        );
    }
    assert_eq!(version(SERVER), VERSION);
    let bin = std::fs::read_link(modules.join(".bin/mcp-server-filesystem")).unwrap();
    assert!(bin.ends_with("@modelcontextprotocol/server-filesystem/dist/index.js"));
}

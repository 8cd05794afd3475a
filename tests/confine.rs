//! `fsbroker proxy --confine` on the real kernel: a server that opens files itself (a Python
//! probe, no MCP SDK, no checks of its own) is started under the proxy and tries to reach
//! everything a hostile server would: its roots, the roots it must not have, the rest of the
//! disk, its temporary directory, the network. What it reports back is what the kernel let
//! it do. Also: the simulated kernel without Landlock (strict refuses, best effort warns),
//! `confine check`, the audit record, and revocation ending the server.
//!
//! One file though long: every test runs the same probe server under `--confine` on the real
//! kernel; its fixture and probe are shared.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::confine::{Fixture, check, growing, results, wait_ended};
use common::procs::Pids;
use common::{Listener, PolicyToml, RootToml, bin};
use serde_json::{Value, json};

/// Rule: under `--confine` the server can read and write its read-write root, read its
/// read-only root, and nothing else: not the `deny` and `prompt` roots, not a directory
/// outside every root, not the user's home, not `/etc/shadow`; it can rename within its
/// read-write root but not move a file out of it; its TMPDIR is its own and writable.
#[test]
fn a_confined_server_reaches_its_roots_and_nothing_else() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let ops = json!([
        ["read", fx.p("rw/f.txt")],
        ["write", fx.p("rw/new.txt")],
        ["mkdir", fx.p("rw/sub")],
        ["rename", [fx.p("rw/new.txt"), fx.p("rw/sub/moved.txt")]],
        ["read", fx.p("ro/f.txt")],
        ["write", fx.p("ro/new.txt")],
        ["write", fx.p("ro/f.txt")],
        ["read", fx.p("denied/f.txt")],
        ["list", fx.p("denied")],
        ["read", fx.p("asked/f.txt")],
        ["write", fx.p("asked/new.txt")],
        ["read", fx.p("outside/f.txt")],
        ["list", fx.p("outside")],
        ["write", fx.p("outside/new.txt")],
        ["rename", [fx.p("rw/f.txt"), fx.p("outside/stolen.txt")]],
        ["list", home],
        ["read", "/etc/shadow"],
        ["tmpdir"],
    ]);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let r = results(&out);
    let denied = "err:EACCES";
    assert_eq!(r[0], "ok:in rw");
    assert_eq!(r[1], "ok");
    assert_eq!(r[2], "ok");
    assert_eq!(r[3], "ok");
    assert_eq!(
        std::fs::read_to_string(fx.dir.join("rw/sub/moved.txt")).unwrap(),
        "written by the server"
    );
    assert_eq!(r[4], "ok:in ro");
    assert_eq!(r[5], denied, "create in a read-only root");
    assert_eq!(r[6], denied, "overwrite in a read-only root");
    assert_eq!(
        std::fs::read_to_string(fx.dir.join("ro/f.txt")).unwrap(),
        "in ro"
    );
    assert!(!fx.dir.join("ro/new.txt").exists());
    for (i, what) in [(7, "read a deny root"), (8, "list a deny root")] {
        assert_eq!(r[i], denied, "{what}");
    }
    assert_eq!(r[9], denied, "read an unapproved prompt root");
    assert_eq!(r[10], denied, "write an unapproved prompt root");
    assert_eq!(r[11], denied, "read outside every root");
    assert_eq!(r[12], denied, "list outside every root");
    assert_eq!(r[13], denied, "write outside every root");
    assert!(
        r[14].starts_with("err:"),
        "move a file out of its root: {}",
        r[14]
    );
    assert!(fx.dir.join("rw/f.txt").exists());
    assert_eq!(r[15], denied, "list the home directory");
    if Path::new("/etc/shadow").exists() {
        assert_eq!(r[16], denied, "read /etc/shadow");
    }
    let tmp = r[17].strip_prefix("ok:").expect("TMPDIR writable");
    assert!(
        Path::new(tmp)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("fsbroker-server-"),
        "{tmp}"
    );
    assert!(
        !Path::new(tmp).exists(),
        "the private TMPDIR is removed after"
    );

    // Unconfined, the same server reaches everything: the probe itself is not the limit.
    let out = fx.run(&["--policy", policy.to_str().unwrap()], &ops, &[]);
    let r = results(&out);
    assert_eq!(r[11], "ok:in outside");
    assert_eq!(r[7], "ok:in denied");
}

/// Rule: TCP is refused to a confined server unless `[confine] net = true`.
#[test]
fn tcp_is_refused_unless_the_policy_allows_it() {
    let fx = Fixture::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let ops = json!([["connect", port]]);
    let policy = fx.policy("");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &[],
    );
    assert_eq!(results(&out), vec!["err:EACCES"]);
    let policy = fx.policy("[confine]\nnet = true\n");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &[],
    );
    assert_eq!(results(&out), vec!["ok"]);
    // Unconfined: connects.
    let out = fx.run(&["--policy", fx.policy("").to_str().unwrap()], &ops, &[]);
    assert_eq!(results(&out), vec!["ok"]);
}

/// Rule: on a kernel without Landlock (simulated with FSBROKER_LANDLOCK_ABI=0),
/// `--confine=strict` refuses to start the server and says why; `--confine` runs it,
/// unconfined, and says on stderr that nothing is enforced.
#[test]
fn without_landlock_strict_refuses_and_best_effort_warns() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let ops = json!([["read", fx.p("outside/f.txt")]]);
    let no_landlock = [("FSBROKER_LANDLOCK_ABI", "0")];
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &ops,
        &no_landlock,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("no Landlock"), "{stderr}");
    assert!(stderr.contains("was not started"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("probe"),
        "the server must not run"
    );

    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &no_landlock,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(stderr.contains("NOT ENFORCED"), "{stderr}");
    assert!(stderr.contains("no Landlock"), "{stderr}");
    assert_eq!(results(&out), vec!["ok:in outside"]);

    // The policy can ask for strict too.
    let strict = fx.policy("[confine]\nmode = \"strict\"\n");
    let out = fx.run(&["--policy", strict.to_str().unwrap()], &ops, &no_landlock);
    assert!(!out.status.success());
    // And --confine=off overrides it.
    let out = fx.run(
        &["--policy", strict.to_str().unwrap(), "--confine=off"],
        &ops,
        &no_landlock,
    );
    assert!(out.status.success(), "{out:?}");
}

/// Rule: deny globs cannot be expressed to the kernel: strict refuses to start a server on a
/// root that has them, best effort names them; `confine check` shows both, exiting 2.
#[test]
fn deny_globs_are_named_as_not_enforced() {
    let fx = Fixture::new();
    let policy = PolicyToml::new()
        .root(RootToml::at(&fx.dir.join("rw")).rw().deny(&["**/.env"]))
        .write_to(&fx.dir.join("globs.toml"));
    let ops = json!([["read", fx.p("rw/f.txt")]]);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &ops,
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("**/.env"), "{stderr}");

    let check = Command::new(bin())
        .args([
            "confine",
            "check",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "python3",
        ])
        .arg(fx.dir.join("srv/probe.py"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(2), "{text}");
    assert!(text.contains("**/.env"), "{text}");
    assert!(
        text.contains(&format!("read-write  {}", fx.p("rw"))),
        "{text}"
    );
    assert!(
        text.contains("probe.py") || text.contains(&fx.p("srv")),
        "{text}"
    );

    // `[confine] write` over fsbroker's own files (the policy lives in fx.dir): granted
    // read-only and named; strict refuses; best effort runs and the policy stays as it was.
    let policy = fx.policy(&format!("[confine]\nwrite = [{:?}]\n", fx.p("")));
    let check = Command::new(bin())
        .args(["confine", "check", "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(2), "{text}");
    assert!(text.contains("fsbroker's own files"), "{text}");
    assert!(text.contains(policy.to_str().unwrap()), "{text}");
    let before = std::fs::read_to_string(&policy).unwrap();
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &json!([
            ["write", policy.to_str().unwrap()],
            ["write", fx.p("outside/new.txt")]
        ]),
        &[],
    );
    assert_eq!(results(&out), vec!["err:EACCES", "err:EACCES"]);
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), before);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &json!([]),
        &[],
    );
    assert!(!out.status.success());

    // An audit log inside a read-only root: the kernel cannot keep one file of a granted
    // tree unreadable. Named; strict refuses; best effort runs (the server can read it).
    let policy = fx.policy(&format!("[audit]\npath = {:?}\n", fx.p("ro/audit.jsonl")));
    let check = Command::new(bin())
        .args(["confine", "check", "--policy", policy.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(2), "{text}");
    assert!(
        text.contains("holds fsbroker's own files") && text.contains("ro/audit.jsonl"),
        "{text}"
    );
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &json!([]),
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("audit.jsonl"), "{stderr}");

    // Without globs: every rule is enforced here, exit 0.
    let check = Command::new(bin())
        .args(["confine", "check", "--root", &fx.p("ro")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("read        {}", fx.p("ro"))),
        "{text}"
    );
}

/// Rule: the audit log records the confinement applied at the server's start, and the log
/// still verifies.
#[test]
fn the_audit_log_records_the_confinement() {
    let fx = Fixture::new();
    let log = fx.dir.join("audit.jsonl");
    let policy = fx.policy(&format!("[audit]\npath = {:?}\n", log.to_str().unwrap()));
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &json!([["read", fx.p("ro/f.txt")]]),
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(&log).unwrap();
    let confine: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["event"] == "confine")
        .expect("a confine line");
    let c = &confine["confinement"];
    assert_eq!(c["mode"], "best-effort");
    assert_eq!(c["enforced"], true);
    let rules = c["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["path"] == fx.p("rw") && r["access"] == "read-write"),
        "{c}"
    );
    assert!(
        rules
            .iter()
            .any(|r| r["path"] == fx.p("ro") && r["access"] == "read"),
        "{c}"
    );
    assert!(
        c["withheld"]
            .as_array()
            .unwrap()
            .contains(&json!(fx.p("denied"))),
        "{c}"
    );
    let verify = Command::new(bin())
        .args(["audit", "verify"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
}

/// Rule: a reload that takes away a root the confined server was started with ends the
/// server (`on_revoke = "end"`, the default): the host sees it exit. With `keep`, it runs on.
#[test]
fn revoking_a_root_ends_a_confined_server() {
    for (extra, ends) in [("", true), ("[confine]\non_revoke = \"keep\"\n", false)] {
        let fx = Fixture::new();
        let policy = fx.policy(extra);
        let (mut proxy, line) = fx.start(&policy, &json!([]), &[("PROBE_STAY", "1")]);
        assert!(line.contains("probe"), "{line}");
        // The policy without the read-write root, renamed over the old one.
        let text = std::fs::read_to_string(&policy).unwrap();
        let without = text.replacen("mode = \"read-write\"", "mode = \"read-only\"", 1);
        let tmp = fx.dir.join("policy.toml.new");
        std::fs::write(&tmp, without).unwrap();
        std::fs::rename(&tmp, &policy).unwrap();
        // The policy watcher waits out a short quiet period; `end` then has the server gone
        // within the 3 s grace at most. `keep` is given time to (wrongly) end it too.
        let wait = Duration::from_secs(if ends { 15 } else { 5 });
        let deadline = std::time::Instant::now() + wait;
        let mut status = None;
        while std::time::Instant::now() < deadline {
            if let Some(s) = proxy.try_wait() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !ends {
            assert!(status.is_none(), "with keep, the server runs on");
            proxy.close_stdin();
        }
        if ends && status.is_none() {
            proxy.kill_now();
        }
        let status = proxy
            .wait_exit(Duration::from_secs(60))
            .expect("the proxy exits");
        if ends {
            assert_eq!(
                status.code(),
                Some(128 + 15),
                "ended by the revocation: {status:?}"
            );
        } else {
            assert!(status.success(), "{status:?}");
        }
    }
}

/// Rule: with a shared broker (`serve --listen` + `proxy --connect`), the proxy confines its
/// server from the policy it is given, and the shared broker records the confinement.
#[test]
fn a_proxy_of_a_shared_broker_confines_and_the_broker_records_it() {
    let fx = Fixture::new();
    let log = fx.dir.join("audit.jsonl");
    let policy = fx.policy(&format!("[audit]\npath = {:?}\n", log.to_str().unwrap()));
    let sock = fx.dir.join("broker.sock");
    let broker = Listener::start(&policy, &sock, &[], &Pids::default());
    let ops = json!([["read", fx.p("outside/f.txt")], ["read", fx.p("ro/f.txt")]]);
    let out = fx.run(
        &[
            "--connect",
            sock.to_str().unwrap(),
            "--policy",
            policy.to_str().unwrap(),
            "--confine",
        ],
        &ops,
        &[],
    );
    assert_eq!(results(&out), vec!["err:EACCES", "ok:in ro"]);
    // The record reaches the log once the broker has read the proxy's note.
    let mut found = None;
    for _ in 0..100 {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["event"] == "confine");
        if found.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(broker);
    let c = found.expect("the shared broker recorded the confinement");
    assert_eq!(c["confinement"]["enforced"], true, "{c}");
    // Recorded as the proxy's account of its server, for the proxy's session.
    assert_eq!(c["account"], "proxy", "{c}");
    assert!(c["session"].is_u64(), "{c}");
}

/// Rule: what a confined server leaves running (a daemon: fork, setsid, fork) ends with it,
/// when it exits and when a revocation ends it: a Landlock domain outlives its process, and
/// the daemon would keep the access.
#[test]
fn daemons_of_a_confined_server_end_with_it() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let trace = fx.dir.join("rw/daemon.txt");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &json!([["daemon", trace.to_str().unwrap()]]),
        &[],
    );
    assert_eq!(results(&out), vec!["ok"]);
    assert!(trace.exists(), "the daemon ran");
    assert!(!growing(&trace), "the daemon outlived the confined server");

    // Ended by a revocation: the daemon goes too.
    std::fs::remove_file(&trace).unwrap();
    let (mut proxy, _line) = fx.start(
        &policy,
        &json!([["daemon", trace.to_str().unwrap()]]),
        &[("PROBE_STAY", "1")],
    );
    assert!(growing(&trace), "the daemon runs");
    let text = std::fs::read_to_string(&policy).unwrap();
    let tmp = fx.dir.join("policy.toml.new");
    std::fs::write(
        &tmp,
        text.replacen("mode = \"read-write\"", "mode = \"read-only\"", 1),
    )
    .unwrap();
    std::fs::rename(&tmp, &policy).unwrap();
    let status = proxy
        .wait_exit(Duration::from_secs(60))
        .expect("the proxy exits");
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    assert!(!growing(&trace), "the daemon outlived the revocation");
}

/// Rule: nothing a confined server started outlives it, however deep: a chain of a thousand
/// processes, each the child of the one before, ends with the server (the proxy ends the
/// whole tree at once, not one level per round).
#[test]
fn a_deep_process_chain_ends_with_the_server() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let marker = fx.dir.join("rw/deep.txt");
    // The host's end stays open until the probe has built its chain (a thousand processes
    // take seconds on a loaded machine, longer than a proxy whose host has gone waits).
    let (mut proxy, line) = fx.start(
        &policy,
        &json!([["chain", [1000, marker.to_str().unwrap()]]]),
        &[],
    );
    let message: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(message["params"]["results"], json!(["ok"]), "{line}");
    proxy.close_stdin();
    assert!(
        proxy.wait_exit(Duration::from_secs(30)).is_some(),
        "the proxy did not end with its server"
    );
    assert!(
        !growing(&marker),
        "the end of the chain outlived the server"
    );
}

/// Rule: a proxy killed outright (`SIGKILL`, no chance to clean up) takes its confined
/// server with it: the server must not keep running with its access, unwatched. The server
/// can neither clear that death signal nor leave the process group the proxy ends at once
/// (both calls "succeed" and do nothing).
#[test]
fn a_killed_proxy_takes_its_confined_server_along() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    // A server that outlives its stdin: only the kernel's death signal ends it.
    let (mut proxy, line) = fx.start(
        &policy,
        &json!([["pid"], ["nodeath"], ["setsid"]]),
        &[("PROBE_STAY", "1"), ("PROBE_LINGER", "1")],
    );
    let message: Value = serde_json::from_str(&line).unwrap();
    let pid = message["params"]["results"][0]
        .as_str()
        .and_then(|r| r.strip_prefix("ok:"))
        .expect("the server's pid")
        .to_owned();
    assert_eq!(
        message["params"]["results"].as_array().unwrap()[1..],
        [json!("ok:9"), json!("ok:kept")],
        "the death signal and the process group stay"
    );
    let alive = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
    };
    assert!(alive(&pid));
    proxy.kill_now();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(&pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(&pid), "the server outlived its killed proxy");
}

/// Rule: the host's ordinary stop (stdin closed, then SIGTERM) ends what a confined server
/// started even when the server outlives the proxy's grace: the proxy's last act is to kill
/// the server's process group and what is left below it.
#[test]
fn a_host_stop_ends_what_the_server_started() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let trace = fx.dir.join("rw/child.txt");
    let (mut proxy, _line) = fx.start(
        &policy,
        &json!([["daemon", trace.to_str().unwrap()], ["ignore_term"]]),
        &[("PROBE_LINGER", "1")],
    );
    assert!(growing(&trace), "the child runs");
    proxy.close_stdin();
    std::thread::sleep(Duration::from_millis(300));
    let _ = Command::new("kill")
        .args(["-TERM", &proxy.pid().to_string()])
        .status();
    let status = proxy.wait_exit(Duration::from_secs(30));
    assert!(status.is_some(), "the proxy did not exit within 30 s");
    assert!(
        !growing(&trace),
        "the server's child outlived the host's stop"
    );
}

/// Rule: what Landlock does not cover is refused by the seccomp filter beside it: IP sockets
/// of any kind when `net` is off (MPTCP and UDP pass Landlock's TCP rules), mode, owner and
/// extended-attribute changes by path (anywhere, even on files the server cannot read), and
/// `TIOCSTI` (typing into a terminal it inherited), Unix sockets while the kernel cannot hold
/// their paths, and identity changes. Socket pairs still work.
#[test]
fn what_landlock_misses_is_refused_by_seccomp() {
    let fx = Fixture::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    let policy = fx.policy("");
    let ops = json!([
        ["mptcp", port],
        ["udp"],
        ["unix"],
        ["chmod", fx.p("outside/f.txt")],
        ["chmod", fx.p("ro/f.txt")],
        ["chown", fx.p("outside/f.txt")],
        ["xattr", fx.p("outside/f.txt")],
        ["tiocsti"],
        ["write", fx.p("rw/still.txt")],
        ["pair"],
        ["setuid"],
        ["family", libc::AF_VSOCK],
        ["family", libc::AF_PACKET],
        ["family", libc::AF_NETLINK],
        // KEYCTL_GET_KEYRING_ID of the session keyring: works for any process of the user.
        ["syscall", [libc::SYS_keyctl, 0, -3, 0]],
        // finit_module(-1): EBADF (or EPERM without CAP_SYS_MODULE) when it reaches the kernel.
        ["syscall", [libc::SYS_finit_module, -1, 0, 0]],
    ]);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &[],
    );
    let r = results(&out);
    assert_eq!(r[0], "err:EACCES", "MPTCP");
    assert_eq!(r[1], "err:EACCES", "UDP");
    // Before Landlock ABI 9 (this kernel's is 7 or less) a Unix socket could reach any
    // service listening by path: refused while net is off. Pairs still work.
    assert_eq!(r[2], "err:EACCES", "Unix sockets");
    for (i, what) in [
        (3, "chmod outside"),
        (4, "chmod in a read-only root"),
        (5, "chown"),
        (6, "setxattr"),
        (7, "TIOCSTI"),
    ] {
        assert_eq!(r[i], "err:EPERM", "{what}");
    }
    assert_eq!(r[8], "ok");
    assert_eq!(r[9], "ok", "socket pairs");
    assert_eq!(r[10], "err:EPERM", "identity changes");
    // Every family that leaves the machine: a virtual machine's channel to its host, raw
    // frames. Netlink (the kernel's own, which getaddrinfo asks) stays.
    assert_eq!(r[11], "err:EACCES", "AF_VSOCK");
    assert_eq!(r[12], "err:EACCES", "AF_PACKET");
    assert_eq!(r[13], "ok", "AF_NETLINK");
    assert_eq!(r[14], "err:EPERM", "the session keyring");
    assert_eq!(r[15], "err:EPERM", "loading a kernel module");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(fx.dir.join("outside/f.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_ne!(mode & 0o777, 0o777, "the mode outside is unchanged");
    // With net allowed, IP sockets work again (TCP included).
    let out = fx.run(
        &[
            "--policy",
            fx.policy("[confine]\nnet = true\n").to_str().unwrap(),
            "--confine",
        ],
        &json!([["udp"], ["connect", port], ["unix"], ["pair"]]),
        &[],
    );
    assert_eq!(results(&out), vec!["ok", "ok", "ok", "ok"]);
}

/// Rule: what the server's command line brings stays narrow. A symlink in a writable root
/// (planted by an earlier run: `node_modules -> /`) grants nothing; a file argument other
/// than the script grants that file alone; a script in the home directory grants the script,
/// not the home; the private TMPDIR is the server's alone (0700); TLS private keys are not
/// among the system files.
#[test]
fn grants_from_the_command_line_stay_narrow() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let p = policy.to_str().unwrap();
    let probe = fx.dir.join("srv/probe.py");

    // A planted link, with the server started from inside its writable root.
    std::os::unix::fs::symlink("/", fx.dir.join("rw/node_modules")).unwrap();
    std::fs::write(fx.dir.join("srv/server.js"), "").unwrap();
    let out = Command::new(bin())
        .args(["confine", "check", "--policy", p, "--", "node"])
        .arg(fx.dir.join("srv/server.js"))
        .current_dir(fx.dir.join("rw"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.lines().any(|l| l
            .trim_end()
            .ends_with("  /  (where npx finds a locally installed package)")),
        "{text}"
    );
    assert!(!text.contains("read+exec   /  "), "{text}");
    assert!(
        text.contains("not granted") && text.contains("node_modules"),
        "{text}"
    );

    // A configuration file argument: the file alone.
    let text = check(
        &fx,
        &["--policy", p],
        &probe,
        &["--config", "/etc/hostname"],
        &fx.dir,
        &[],
    );
    assert!(text.contains("read        /etc/hostname"), "{text}");
    assert!(!text.contains("  /etc  "), "{text}");

    // A script in the home directory: the script alone.
    let home = fx.dir.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join(".secret"), "key").unwrap();
    std::fs::copy(&probe, home.join("server.py")).unwrap();
    let text = check(
        &fx,
        &["--policy", p],
        &home.join("server.py"),
        &[],
        &fx.dir,
        &[("HOME", home.to_str().unwrap())],
    );
    assert!(text.contains("narrowed"), "{text}");
    assert!(
        !text.contains(&format!("read+exec   {}  ", home.display())),
        "{text}"
    );
    let out = fx.run_script(
        &["--policy", p, "--confine"],
        &home.join("server.py"),
        &json!([
            ["read", home.join(".secret").to_str().unwrap()],
            ["tmpmode"]
        ]),
        &[("HOME", home.to_str().unwrap())],
    );
    assert_eq!(results(&out), vec!["err:EACCES", "ok:0o700"]);

    // A program installed in a settings directory of the home (`~/.cargo/bin`): its own
    // bin directory, not `~/.cargo` (where credentials live).
    let cargo_bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&cargo_bin).unwrap();
    std::fs::write(home.join(".cargo/credentials.toml"), "token").unwrap();
    let server = cargo_bin.join("server");
    std::fs::write(&server, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&server, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // A configuration beside secrets, given to a program that is not an interpreter: the
    // file alone, not its directory.
    let secrets = fx.dir.join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    std::fs::write(secrets.join("config.json"), "{}").unwrap();
    std::fs::write(secrets.join("key"), "key").unwrap();
    let out = Command::new(bin())
        .args(["confine", "check", "--policy", p, "--"])
        .arg(&server)
        .arg("-c")
        .arg(secrets.join("config.json"))
        .env("HOME", &home)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let dot_cargo = home.join(".cargo").canonicalize().unwrap();
    assert!(
        !text.contains(&format!("{}  ", dot_cargo.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}  ", dot_cargo.join("bin").display())),
        "{text}"
    );
    let secrets = secrets.canonicalize().unwrap();
    assert!(
        !text.contains(&format!("{}  ", secrets.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "read        {}  ",
            secrets.join("config.json").display()
        )),
        "{text}"
    );

    // An interpreter option's file value (`node --env-file ~/.config/app/prod.env`) is not
    // the script; a configuration named like code in a settings directory of the home
    // (`--settings ~/.config/app/settings.py`) brings the file, not the directory.
    let app = home.join(".config/app");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::write(app.join("prod.env"), "A=1").unwrap();
    std::fs::write(app.join("settings.py"), "A = 1").unwrap();
    std::fs::write(app.join("token.json"), "{}").unwrap();
    let app = app.canonicalize().unwrap();
    for extra in [
        vec![
            "--env-file",
            app.join("prod.env").to_str().unwrap(),
            fx.p("srv/server.js").as_str(),
        ],
        vec!["--settings", app.join("settings.py").to_str().unwrap()],
    ] {
        let program = if extra[0] == "--env-file" {
            "node"
        } else {
            server.to_str().unwrap()
        };
        let out = Command::new(bin())
            .args(["confine", "check", "--policy", p, "--", program])
            .args(&extra)
            .env("HOME", &home)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains(&format!("{}  ", app.display())), "{text}");
        assert!(
            text.contains(&format!(
                "{}  ",
                app.join(extra[1].rsplit('/').next().unwrap()).display()
            )),
            "{text}"
        );
    }

    // No TLS private keys among the system files.
    let text = check(&fx, &["--policy", p], &probe, &[], &fx.dir, &[]);
    assert!(
        !text.contains("/etc/ssl  ") && !text.contains("/etc/ssl/private"),
        "{text}"
    );
}

/// Rule: a reload that withholds a root inside one the server holds (a `deny` root added
/// within its read-write root) is a revocation: the server is ended.
#[test]
fn a_deny_root_added_inside_a_held_root_ends_the_server() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.dir.join("rw/secret")).unwrap();
    let policy = fx.policy("");
    let (mut proxy, _line) = fx.start(&policy, &json!([]), &[("PROBE_STAY", "1")]);
    let tmp = fx
        .roots()
        .root(RootToml::at(&fx.dir.join("rw/secret")).consent("deny"))
        .write_to(&fx.dir.join("policy.toml.new"));
    std::fs::rename(&tmp, &policy).unwrap();
    let status = wait_ended(&mut proxy);
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
}

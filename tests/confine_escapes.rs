//! Escapes from `--confine`: the routes around Landlock a hostile server could take, each test
//! one route, tried on the real kernel by the probe server (`tests/common/confine.rs`), and
//! failing if the route is open again.
//!
//! - things Landlock does not see: datagram socket pairs that `sendto` any path, netlink
//!   beyond routing, System V IPC, set-id bits, descriptors the host left open, the terminal;
//! - grants a server could steer on an earlier run for its next start: links in place of
//!   `[confine]` paths and of nested roots, a `#!` line it rewrote;
//! - rules the kernel cannot hold: a read-only root inside a writable one, signal scoping on
//!   an old kernel, a deny glob added by a reload;
//! - shared directories and what a killed proxy leaves in them.
//!
//! One file though long: its tables share one tree of traps and one runner, and the hostile-
//! case counts it prints are this file's; split, a row could land where no runner checks it.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::confine::{Fixture, PROBE, check, results, wait_ended};
use common::fsb::{Cmd, Log};
use common::{PolicyToml, RootToml, bin};
use serde_json::json;

/// `secretdir/keys.txt` ("TOP SECRET") beside the roots; the directory.
fn secret_dir(fx: &Fixture) -> std::path::PathBuf {
    let secret = fx.dir.join("secretdir");
    std::fs::create_dir(&secret).unwrap();
    std::fs::write(secret.join("keys.txt"), "TOP SECRET").unwrap();
    secret
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Rule: what Landlock does not see is refused by the filter beside it. A datagram socket
/// pair cannot send to a listener's path outside; netlink is routing only (`sock_diag` lists
/// every socket of the machine); System V shared memory, queues and semaphores are refused;
/// no file gets a set-id bit, at creation (`open`, `mknod`) or by `fchmod` (plain modes still
/// change, unless the proxy runs as root); no limit of another process changes
/// (`prlimit64` of the proxy); the
/// server's stderr is a pipe, never the proxy's terminal; stream socket pairs still work.
#[test]
fn what_landlock_does_not_see_is_refused() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let sock = fx.dir.join("outside/dgram.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let ipc_create = 0o1000 | 0o600;
    let ops = json!([
        ["dgram", sock.to_str().unwrap()],
        ["netlink", libc::NETLINK_SOCK_DIAG],
        ["netlink", libc::NETLINK_ROUTE],
        ["syscall", [libc::SYS_shmget, 0, 4096, ipc_create]],
        ["syscall", [libc::SYS_msgget, 0, ipc_create]],
        ["syscall", [libc::SYS_semget, 0, 1, ipc_create]],
        ["create_setid", fx.p("rw/setid")],
        ["write", fx.p("rw/plain")],
        ["fchmod", [fx.p("rw/plain"), 0o4755]],
        ["fchmod", [fx.p("rw/plain"), 0o2755]],
        ["fchmod", [fx.p("rw/plain"), 0o640]],
        ["stderr"],
        ["pair"],
        // mknod(path, S_IFREG | 04755): a set-user-id file without open.
        ["mknod_setid", fx.p("rw/setid2")],
        // prlimit64(parent, RLIMIT_NOFILE, {0, 0}): the proxy could open no file again.
        ["prlimit_parent"],
    ]);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &ops,
        &[],
    );
    let r = results(&out);
    assert_eq!(r[0], "err:EACCES", "a datagram pair: {}", stderr(&out));
    let mut buf = [0u8; 64];
    assert!(
        listener.recv(&mut buf).is_err(),
        "the listener outside got a datagram"
    );
    assert_eq!(r[1], "err:EACCES", "NETLINK_SOCK_DIAG");
    assert_eq!(r[2], "ok", "NETLINK_ROUTE");
    assert_eq!(r[3], "err:EPERM", "shmget");
    assert_eq!(r[4], "err:EPERM", "msgget");
    assert_eq!(r[5], "err:EPERM", "semget");
    assert_eq!(r[6], "err:EPERM", "a file created set-user-id");
    assert!(!fx.dir.join("rw/setid").exists());
    assert_eq!(r[7], "ok");
    assert_eq!(r[8], "err:EPERM", "fchmod set-user-id");
    assert_eq!(r[9], "err:EPERM", "fchmod set-group-id");
    let mode = std::fs::metadata(fx.dir.join("rw/plain"))
        .unwrap()
        .permissions()
        .mode();
    if rustix::process::geteuid().is_root() {
        // Started by root, the server owns the system's files: no fchmod at all.
        assert_eq!(r[10], "err:EPERM", "fchmod under a root proxy");
        assert_ne!(mode & 0o7777, 0o640);
    } else {
        assert_eq!(r[10], "ok", "fchmod of plain bits");
        assert_eq!(mode & 0o7777, 0o640);
    }
    assert_eq!(r[11], "ok:pipe", "the server's stderr");
    assert_eq!(r[12], "ok", "stream socket pairs");
    assert_eq!(r[13], "err:EPERM", "mknod of a set-user-id file");
    assert!(!fx.dir.join("rw/setid2").exists());
    assert_eq!(r[14], "err:EPERM", "prlimit64 of the proxy");
}

/// Rule: descriptors the proxy was started with (a file outside every root, opened by the
/// host) do not reach the server, and what the server writes to stderr still reaches the
/// proxy's stderr.
#[test]
fn descriptors_the_host_left_open_do_not_reach_the_server() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let script = format!(
        "exec 7<{:?}; exec {:?} proxy --policy {:?} --confine=strict -- python3 {:?}",
        fx.p("outside/f.txt"),
        bin(),
        policy.to_str().unwrap(),
        fx.p("srv/probe.py")
    );
    let probe = format!("{PROBE}\nsys.stderr.write('stderr marker 5e1f\\n')\n");
    std::fs::write(fx.dir.join("srv/probe.py"), probe).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .env("PROBE", json!([["fd", 7]]).to_string())
        .stdin(Stdio::null());
    let out = common::with_deadline(
        Duration::from_secs(60),
        || {},
        move || cmd.output().unwrap(),
    );
    assert_eq!(results(&out), vec!["err:EBADF"], "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stderr marker 5e1f"),
        "{}",
        stderr(&out)
    );
}

/// Rule: a `[confine] read` or `write` path, or a root, named through a link in a writable
/// root (made by the server on an earlier run: `rmdir models; ln -s /elsewhere models`) is
/// not granted, and `confine check` says why.
#[test]
fn links_a_server_planted_for_its_next_start_grant_nothing() {
    let fx = Fixture::new();
    let secret = secret_dir(&fx);
    std::os::unix::fs::symlink(&secret, fx.dir.join("rw/models")).unwrap();
    std::os::unix::fs::symlink(fx.dir.join("outside"), fx.dir.join("rw/cache")).unwrap();
    std::os::unix::fs::symlink(&secret, fx.dir.join("rw/inner")).unwrap();
    let policy = fx
        .roots()
        .root(RootToml::at(&fx.dir.join("rw/inner")).name("inner"))
        .table(
            "confine",
            format!(
                "read = [{:?}]\nwrite = [{:?}]",
                fx.p("rw/models"),
                fx.p("rw/cache")
            ),
        )
        .write_to(&fx.dir.join("policy.toml"));
    let p = policy.to_str().unwrap();
    let ops = json!([
        ["read", secret.join("keys.txt").to_str().unwrap()],
        ["write", fx.p("outside/planted.txt")],
        ["read", fx.p("rw/f.txt")],
    ]);
    let out = fx.run(&["--policy", p, "--confine=strict"], &ops, &[]);
    assert_eq!(
        results(&out),
        vec!["err:EACCES", "err:EACCES", "ok:in rw"],
        "{}",
        stderr(&out)
    );
    assert!(!fx.dir.join("outside/planted.txt").exists());
    let text = check(
        &fx,
        &["--policy", p],
        &fx.dir.join("srv/probe.py"),
        &[],
        &fx.dir,
        &[],
    );
    for name in ["models", "cache", "inner"] {
        assert!(
            text.lines()
                .any(|l| l.contains(&format!("rw/{name}")) && l.contains("link")),
            "{name} not named: {text}"
        );
    }
    let secret = secret.canonicalize().unwrap();
    assert!(
        !text
            .lines()
            .any(|l| l.contains(&format!("{}  ", secret.display()))
                && l.trim_start().starts_with("read")),
        "{text}"
    );
}

/// Rule: a read-only root inside a read-write one cannot be kept read-only by the kernel:
/// strict refuses to start and names it; best effort runs and says so.
#[test]
fn a_read_only_root_inside_a_writable_one_is_named() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.dir.join("rw/inner")).unwrap();
    let policy = fx
        .roots()
        .root(RootToml::at(&fx.dir.join("rw/inner")).name("inner"))
        .write_to(&fx.dir.join("policy.toml"));
    let p = policy.to_str().unwrap();
    let ops = json!([["write", fx.p("rw/inner/x.txt")]]);
    let out = fx.run(&["--policy", p, "--confine=strict"], &ops, &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("root inner") && err.contains("lies in"),
        "{err}"
    );
    assert!(!fx.dir.join("rw/inner/x.txt").exists());
    let out = fx.run(&["--policy", p, "--confine"], &ops, &[]);
    assert!(stderr(&out).contains("NOT ENFORCED"), "{}", stderr(&out));
}

/// Rule: a `#!` line in a file the server can write is not followed: rewritten to name
/// another directory (`env -S -u DIR/x python3`, whose `-u` value is not the program, or
/// an interpreter in that directory), it grants nothing there; the server still runs.
#[test]
fn a_hash_bang_line_the_server_can_write_grants_nothing() {
    let fx = Fixture::new();
    let secret = secret_dir(&fx);
    let tool = secret.join("tool");
    std::fs::write(&tool, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let policy = fx.policy("");
    let p = policy.to_str().unwrap();
    let server = fx.dir.join("rw/tools/server");
    std::fs::create_dir(server.parent().unwrap()).unwrap();
    let secret = secret.canonicalize().unwrap();
    for line in [
        format!(
            "#!/usr/bin/env -S -u {} python3",
            secret.join("keys.txt").display()
        ),
        format!("#!{}", tool.display()),
    ] {
        std::fs::write(&server, format!("{line}\n{PROBE}")).unwrap();
        std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = Command::new(bin())
            .args(["confine", "check", "--policy", p, "--"])
            .arg(&server)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains(&format!("{}  ", secret.display())),
            "{line}: {text}"
        );
        assert!(text.contains("not followed"), "{line}: {text}");
    }
    // Run as the kernel runs it (`env -S` drops the variable and runs python3): the server
    // works, and the directory its line named stays closed.
    std::fs::write(
        &server,
        format!(
            "#!/usr/bin/env -S -u {} python3\n{PROBE}",
            secret.join("keys.txt").display()
        ),
    )
    .unwrap();
    let ops = json!([
        ["read", secret.join("keys.txt").to_str().unwrap()],
        ["read", fx.p("rw/f.txt")]
    ]);
    let out = fx.run_argv(
        &["--policy", p, "--confine=strict"],
        &[server.as_os_str()],
        &ops,
        &[],
    );
    assert_eq!(
        results(&out),
        vec!["err:EACCES", "ok:in rw"],
        "{}",
        stderr(&out)
    );
}

/// Rule: when a revocation must end the server (`on_revoke = "end"`, the default), strict
/// needs the kernel's signal scoping (Landlock ABI 6): without it the server could stop the
/// proxy and outlive the revocation. With `on_revoke = "keep"` it is not needed.
#[test]
fn strict_needs_signal_scoping_when_revocation_ends_the_server() {
    let fx = Fixture::new();
    let env = [("FSBROKER_LANDLOCK_ABI", "5")];
    let ops = json!([["read", fx.p("rw/f.txt")]]);
    let policy = fx.policy("");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &ops,
        &env,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("ABI 6"), "{}", stderr(&out));
    let policy = fx.policy("[confine]\non_revoke = \"keep\"\n");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &ops,
        &env,
    );
    assert_eq!(results(&out), vec!["ok:in rw"], "{}", stderr(&out));
}

/// Rule: under strict, a reload that asks for a rule the kernel cannot hold the running
/// server to (a deny glob on a root it holds) ends the server, as a revocation does; best
/// effort keeps it running and warns.
#[test]
fn a_reload_adding_a_deny_glob_ends_a_strict_server() {
    for (flag, ends) in [("--confine=strict", true), ("--confine", false)] {
        let fx = Fixture::new();
        let policy = fx.roots().write_to(&fx.dir.join("policy.toml"));
        let (mut proxy, _line) = fx.start_with(flag, &policy, &json!([]), &[("PROBE_STAY", "1")]);
        let tmp = PolicyToml::new()
            .root(RootToml::at(&fx.dir.join("rw")).rw().deny(&["**/.env"]))
            .root(RootToml::at(&fx.dir.join("ro")))
            .root(RootToml::at(&fx.dir.join("denied")).consent("deny"))
            .root(RootToml::at(&fx.dir.join("asked")).consent("prompt"))
            .write_to(&fx.dir.join("policy.toml.new"));
        std::fs::rename(&tmp, &policy).unwrap();
        if ends {
            let status = wait_ended(&mut proxy);
            assert_eq!(status.code(), Some(128 + 15), "{flag}: {status:?}");
        } else {
            std::thread::sleep(Duration::from_secs(2));
            assert!(proxy.try_wait().is_none(), "{flag}: the server ended");
            proxy.kill_now();
        }
    }
}

/// Rule: a script in a directory every program shares (the temporary directory) brings the
/// script, not the directory, where other servers keep their private files.
#[test]
fn a_script_in_a_shared_directory_brings_the_script_alone() {
    let fx = Fixture::new();
    let shared = fx.dir.join("sharedtmp");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("server.py"), PROBE).unwrap();
    std::fs::create_dir(shared.join("fsbroker-server-1-other")).unwrap();
    std::fs::write(shared.join("fsbroker-server-1-other/token"), "other's").unwrap();
    // Another server's directory, in use: its proxy holds the lock.
    let _in_use = lock(&shared.join("fsbroker-server-1-other"));
    let policy = fx.policy("");
    let env = [("TMPDIR", shared.to_str().unwrap())];
    let text = check(
        &fx,
        &["--policy", policy.to_str().unwrap()],
        &shared.join("server.py"),
        &[],
        &fx.dir,
        &env,
    );
    let shared = shared.canonicalize().unwrap();
    assert!(
        !text.contains(&format!("read+exec   {}  ", shared.display())),
        "{text}"
    );
    assert!(text.contains("every program shares it"), "{text}");
    let out = fx.run_script(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &shared.join("server.py"),
        &json!([[
            "read",
            shared
                .join("fsbroker-server-1-other/token")
                .to_str()
                .unwrap()
        ]]),
        &env,
    );
    assert_eq!(results(&out), vec!["err:EACCES"], "{}", stderr(&out));
}

/// Holds the lock a running proxy holds on its server's temporary directory.
fn lock(dir: &Path) -> std::fs::File {
    let f = std::fs::File::open(dir).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
    f
}

/// Rule: the private temporary directory a killed proxy left behind is removed by the next
/// confined start, however deep the tree the server made there (removal neither recurses
/// nor holds a descriptor per level); one whose proxy still runs (its lock held, whatever
/// its process id says) is left alone.
#[test]
fn an_abandoned_temporary_directory_is_removed() {
    let fx = Fixture::new();
    let tmp = fx.dir.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let abandoned = tmp.join("fsbroker-server-4000000-abc");
    // A running proxy whose process id says nothing here (another process-id namespace).
    let alive = tmp.join("fsbroker-server-4000001-abc");
    for d in [&abandoned, &alive] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("left.txt"), "x").unwrap();
    }
    let _in_use = lock(&alive);
    // A tree deeper than a path can name, made by descriptors.
    let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY;
    let mode = rustix::fs::Mode::from_raw_mode(0o755);
    let mut dir = rustix::fs::open(&abandoned, flags, rustix::fs::Mode::empty()).unwrap();
    for _ in 0..3000 {
        rustix::fs::mkdirat(&dir, "d", mode).unwrap();
        dir = rustix::fs::openat(&dir, "d", flags, rustix::fs::Mode::empty()).unwrap();
    }
    drop(dir);
    let policy = fx.policy("");
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine=strict"],
        &json!([["tmpdir"]]),
        &[("TMPDIR", tmp.to_str().unwrap())],
    );
    assert_eq!(results(&out).len(), 1, "{}", stderr(&out));
    assert!(
        !abandoned.exists(),
        "the abandoned directory is still there"
    );
    assert!(alive.exists(), "a running proxy's directory was removed");
}

/// Rule: a path swapped between a directory and a link while the proxy starts (a sibling
/// instance of the server racing `renameat2(RENAME_EXCHANGE)` in its read-write root) never
/// hands over what the link names: the path is resolved once by descriptors, and the kernel
/// step grants it only if it is still that directory (else the server is not started).
#[test]
fn a_directory_swapped_for_a_link_during_start_grants_nothing() {
    let fx = Fixture::new();
    let secret = secret_dir(&fx);
    std::fs::create_dir(fx.dir.join("rw/models")).unwrap();
    std::os::unix::fs::symlink(&secret, fx.dir.join("rw/lnk")).unwrap();
    let policy = fx
        .roots()
        .table("confine", format!("read = [{:?}]", fx.p("rw/models")))
        .write_to(&fx.dir.join("policy.toml"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (stop, rw) = (stop.clone(), fx.dir.join("rw"));
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    rw.join("models"),
                    rustix::fs::CWD,
                    rw.join("lnk"),
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let ops = json!([["read", secret.join("keys.txt").to_str().unwrap()]]);
    let mut started = 0;
    for _ in 0..30 {
        let out = fx.run(
            &["--policy", policy.to_str().unwrap(), "--confine=strict"],
            &ops,
            &[],
        );
        if out.status.success() || String::from_utf8_lossy(&out.stdout).contains("probe") {
            started += 1;
            assert_eq!(results(&out), vec!["err:EACCES"], "{}", stderr(&out));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = racer.join().unwrap();
    assert!(swaps > 1000, "the racer swapped only {swaps} times");
    assert!(started > 0, "no start got through the race at all");
}

/// Rule: a reload that takes away a `[confine] write` path or the network the server was
/// started with ends it, as a removed root does.
#[test]
fn a_reload_taking_a_confine_path_or_the_network_ends_the_server() {
    for (before, after) in [
        (
            "write = [\"{cache}\"]\nnet = true".to_owned(),
            "net = true".to_owned(),
        ),
        ("net = true".to_owned(), "net = false".to_owned()),
    ] {
        let fx = Fixture::new();
        let cache = fx.dir.join("cache");
        std::fs::create_dir(&cache).unwrap();
        let table = |t: &str| t.replace("{cache}", cache.to_str().unwrap());
        let policy = fx
            .roots()
            .table("confine", table(&before))
            .write_to(&fx.dir.join("policy.toml"));
        let (mut proxy, _line) =
            fx.start_with("--confine", &policy, &json!([]), &[("PROBE_STAY", "1")]);
        let tmp = fx
            .roots()
            .table("confine", table(&after))
            .write_to(&fx.dir.join("policy.toml.new"));
        std::fs::rename(&tmp, &policy).unwrap();
        let status = wait_ended(&mut proxy);
        assert_eq!(
            status.code(),
            Some(128 + 15),
            "{before} -> {after}: {status:?}"
        );
    }
}

/// Rule: the server cannot hold up the proxy through stderr. With the proxy's stderr a pipe
/// nobody reads, a server that floods its stderr is still ended by a revocation; and what it
/// writes reaches the proxy's stderr without escape sequences.
#[test]
fn a_flood_on_stderr_does_not_stop_a_revocation() {
    let fx = Fixture::new();
    let policy = fx.policy("");
    let (reader, writer) = std::io::pipe().unwrap();
    let probe = fx.dir.join("srv/probe.py");
    let mut proxy = Cmd::new(&[
        "proxy".as_ref(),
        "--policy".as_ref(),
        policy.as_os_str(),
        "--confine".as_ref(),
        "--".as_ref(),
        "python3".as_ref(),
        probe.as_os_str(),
    ])
    .env("PROBE", json!([["flood", 1 << 20]]).to_string())
    .env("PROBE_STAY", "1")
    .env("RUST_LOG", "fsbroker=info")
    .log(Log::Fd(writer.into()))
    .spawn();
    let line = proxy.read_message().to_string();
    assert!(line.contains("probe"), "{line}");
    // The flood has gone in; the proxy's stderr pipe is full or nearly so. Revoke.
    std::thread::sleep(Duration::from_millis(300));
    let tmp = PolicyToml::new()
        .root(RootToml::at(&fx.dir.join("ro")))
        .write_to(&fx.dir.join("policy.toml.new"));
    std::fs::rename(&tmp, &policy).unwrap();
    let status = wait_ended(&mut proxy);
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
    // What got through has no escape character.
    // Every writer is gone with the proxy and its server: the pipe reads to its end.
    let got = common::with_deadline(
        Duration::from_secs(20),
        || {},
        move || {
            let mut got = Vec::new();
            let _ = std::io::Read::read_to_end(&mut &reader, &mut got);
            got
        },
    );
    assert!(
        !got.contains(&0x1b),
        "an escape sequence reached the proxy's stderr"
    );
    assert!(
        got.windows(3).any(|w| w == b"xxx"),
        "nothing of the server's stderr arrived"
    );
}

/// Rule: a confined server cannot change the times of a file by path, which Landlock does not
/// govern (metadata): not outside its roots (the case srt refused and fsbroker did not, in
/// the side-by-side run), and, as the filter cannot read a path, not inside them either; it
/// still sets the times of a file it opened (`futimens`), and `touch` by path keeps failing
/// without changing anything. Raw `utime`/`utimes`/`futimesat` are refused too.
#[test]
fn times_change_only_through_a_descriptor() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    let policy = fx.policy("");
    std::fs::write(fx.dir.join("outside/times.txt"), "x").unwrap();
    std::fs::write(fx.dir.join("rw/times.txt"), "x").unwrap();
    let mtime = |p: &str| std::fs::metadata(fx.dir.join(p)).unwrap().mtime();
    let (outside, inside) = (mtime("outside/times.txt"), mtime("rw/times.txt"));
    let path = |p: &str| fx.dir.join(p).to_str().unwrap().to_owned();
    // Raw calls get a NULL path (the probe's JSON cannot pass an address): refused by
    // number, before the kernel reads anything.
    let ops = json!([
        ["utime", path("outside/times.txt")],
        ["utime", path("rw/times.txt")],
        ["futime", path("rw/times.txt")],
        ["futime", path("ro/f.txt")],
        ["syscall", [libc::SYS_utimes, 0, 0]],
        ["syscall", [libc::SYS_utime, 0, 0]],
        ["syscall", [libc::SYS_futimesat, libc::AT_FDCWD, 0, 0]],
    ]);
    let out = fx.run(
        &["--policy", policy.to_str().unwrap(), "--confine"],
        &ops,
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    let r = results(&out);
    assert_eq!(r[0], "err:EPERM", "times outside the roots, by path");
    assert_eq!(r[1], "err:EPERM", "times inside a root, by path");
    assert_eq!(r[2], "ok", "times of a file opened in a read-write root");
    assert_eq!(mtime("outside/times.txt"), outside);
    assert_ne!(mtime("rw/times.txt"), inside, "futimens changed it");
    assert_eq!(mtime("rw/times.txt"), 1_000_000_000);
    // A read-only root: the descriptor is read-only, and the kernel's own rule (owner or
    // write access) applies; as root it is the owner, so only the result's form is checked.
    assert!(
        r[3] == "ok" || r[3] == "err:EPERM" || r[3] == "err:EACCES",
        "{}",
        r[3]
    );
    for (i, what) in [(4, "utimes"), (5, "utime"), (6, "futimesat")] {
        assert_eq!(r[i], "err:EPERM", "raw {what}");
    }
}

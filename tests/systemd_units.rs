//! The shipped systemd user units (`dist/systemd/`) and `serve --listen` under socket
//! activation, with the real binary and systemd's own tools: `systemd-analyze verify` on the
//! units, and `systemd-socket-activate` handing the broker the socket the way a `.socket`
//! unit does (descriptor 3, `LISTEN_FDS`, `LISTEN_PID`). Descriptors that are not that
//! socket are handed by a small Python launcher, which can hand anything.

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the broker's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::fsb::{Cmd, Log};
use common::{Fsb, PolicyToml, RootToml, bin, path_str, tempdir};
use serde_json::json;

const UNITS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dist/systemd");

/// How long a broker may take to start, answer, or exit when it should.
const LIMIT: Duration = Duration::from_secs(20);

/// Whether `tool` is on `PATH`; when it is not, the test says `SKIPPED` (a failure under
/// `FSBROKER_TEST_STRICT=1`: `.ci/run` installs it).
fn have(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()));
    if !found {
        common::skipped(&format!(
            "{tool} is not installed (Debian's systemd package)"
        ));
    }
    found
}

/// The values of `key=` in a unit file, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(UNITS).join(unit)).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
        .collect()
}

/// The one value of `key=` in a unit file.
fn unit_value(unit: &str, key: &str) -> String {
    let values = unit_values(unit, key);
    assert_eq!(values.len(), 1, "{unit}: {key}= {values:?}");
    values[0].clone()
}

/// A unit's line with systemd's specifiers as a user manager would fill them (`%t`: the
/// runtime directory, `%h`: the home directory) and the binary the tests run.
fn expand(line: &str, runtime: &Path, home: &Path) -> String {
    line.replace("/usr/bin/fsbroker", bin())
        .replace("%t", &path_str(runtime))
        .replace("%h", &path_str(home))
}

/// The policy file fsbroker.service's `--policy` names, for this runtime and home.
fn policy_path(runtime: &Path, home: &Path) -> String {
    let exec = unit_value("fsbroker.service", "ExecStart");
    let policy = exec
        .split(' ')
        .skip_while(|a| *a != "--policy")
        .nth(1)
        .expect("the service names a --policy");
    expand(policy, runtime, home)
}

/// A user's runtime and home directories, a policy at the path the service names (a
/// read-only root `r` with `a.txt`, and `p` whose consent is asked of a command that records
/// its environment in `consent-env.txt`; at most two sessions), and the socket's directory, made as the socket
/// unit's `DirectoryMode=0700` makes it. Returns (temp dir, runtime, home, root).
fn user_dirs() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf) {
    let (t, dir) = tempdir();
    let (runtime, home, root) = (dir.join("run"), dir.join("home"), dir.join("root"));
    for d in [&runtime, &home, &root] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    std::fs::write(root.join("a.txt"), "a").unwrap();
    let script = dir.join("consent.sh");
    std::fs::write(
        &script,
        format!(
            "env > '{}'\ncat >/dev/null\necho '{{\"granted\": true}}'\n",
            path_str(&dir.join("consent-env.txt"))
        ),
    )
    .unwrap();
    let policy = policy_path(&runtime, &home);
    std::fs::create_dir_all(Path::new(&policy).parent().unwrap()).unwrap();
    let asked = dir.join("asked");
    std::fs::create_dir(&asked).unwrap();
    std::fs::write(asked.join("a.txt"), "a").unwrap();
    PolicyToml::new()
        .root(RootToml::at(&root).name("r"))
        .root(RootToml::at(&asked).name("p").consent("prompt"))
        .consent_command(&[Path::new("/bin/sh"), &script], "")
        .unlimited_with("max_sessions = 2")
        .write_to(Path::new(&policy));
    (t, runtime, home, root)
}

/// Asks for consent to `p/a.txt` on `conn`, so that the policy's consent command runs, and
/// returns what it saw of its environment: none of systemd's `LISTEN_*` may be there.
fn assert_consent_command_has_no_listen_vars(conn: &mut Fsb, dir: &Path) {
    let env_file = dir.join("consent-env.txt");
    let _ = std::fs::remove_file(&env_file);
    conn.ok(
        "files/consent",
        json!({"message": "systemd test", "requestedPaths": ["p/a.txt"]}),
    );
    let env = std::fs::read_to_string(&env_file).expect("the consent command ran");
    assert!(env.contains("PATH="), "the command's environment: {env}");
    let inherited: Vec<&str> = env.lines().filter(|l| l.starts_with("LISTEN_")).collect();
    assert!(
        inherited.is_empty(),
        "the consent command inherited systemd's variables: {inherited:?}"
    );
}

/// Where a shared broker's proxies find its key (`src/rundir.rs`): `listen-HASH.key`, HASH
/// the first 16 bytes of the SHA-256 of the socket's canonical path, in either place the
/// user's runtime directory for fsbroker may be.
fn proxy_key_files(sock: &Path) -> Vec<PathBuf> {
    use sha2::{Digest, Sha256};
    let canonical = sock.canonicalize().unwrap();
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let uid = rustix::process::geteuid().as_raw();
    [
        format!("/run/user/{uid}/fsbroker"),
        format!("/tmp/fsbroker-{uid}"),
    ]
    .iter()
    .map(|d| Path::new(d).join(format!("listen-{hex}.key")))
    .collect()
}

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

/// `systemd-analyze verify --user` passes on both units as shipped (with `ExecStart=` naming
/// the binary the tests built, so that the check that it is executable means something), and
/// prints nothing, not even a warning. That it would catch a broken unit is shown each run:
/// the same check on a copy with an unknown key warns, and on one whose program does not
/// exist fails.
#[test]
fn units_pass_systemd_analyze_verify() {
    if !have("systemd-analyze") {
        return;
    }
    let (_t, dir) = tempdir();
    let runtime = dir.join("run");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
    let verify = |service: &str| {
        let units = dir.join("units");
        let _ = std::fs::remove_dir_all(&units);
        std::fs::create_dir(&units).unwrap();
        std::fs::copy(
            Path::new(UNITS).join("fsbroker.socket"),
            units.join("fsbroker.socket"),
        )
        .unwrap();
        std::fs::write(units.join("fsbroker.service"), service).unwrap();
        // A user manager's runtime directory is all `--user` needs to load the units.
        let out = Command::new("systemd-analyze")
            .args(["verify", "--user"])
            .arg(units.join("fsbroker.socket"))
            .arg(units.join("fsbroker.service"))
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("run systemd-analyze");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    let shipped = std::fs::read_to_string(Path::new(UNITS).join("fsbroker.service")).unwrap();
    assert!(
        shipped.contains("ExecStart=/usr/bin/fsbroker "),
        "{shipped}"
    );
    let service = shipped.replace("/usr/bin/fsbroker", bin());
    let (ok, text) = verify(&service);
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify: {text}"
    );

    // The controls: the same check on broken copies.
    let (ok, text) = verify(&service.replace("[Service]\n", "[Service]\nNoSuchKey=yes\n"));
    assert!(
        !ok || text.contains("NoSuchKey"),
        "an unknown key went unnoticed: {text}"
    );
    let (ok, text) = verify(&service.replace(bin(), "/nonexistent/fsbroker"));
    assert!(!ok, "a missing program went unnoticed: {text}");

    // The service's flags are the binary's: `serve --help` knows every one it passes.
    let help = Command::new(bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let exec = unit_value("fsbroker.service", "ExecStart");
    for flag in exec.split(' ').filter(|a| a.starts_with("--")) {
        assert!(help.contains(flag), "`serve --help` has no {flag}");
    }
    // And the socket the broker is told to listen on is the one the socket unit makes.
    assert!(
        exec.contains(&format!(
            "--listen {}",
            unit_value("fsbroker.socket", "ListenStream")
        )),
        "{exec}"
    );
    assert_eq!(unit_value("fsbroker.socket", "SocketMode"), "0600");
}

/// The broker started as fsbroker.service's `ExecStart=` says, by `systemd-socket-activate`
/// listening where fsbroker.socket's `ListenStream=` says: it takes the socket handed to it,
/// answers `roots/list` on a connection and on a second one, keeps `max_sessions` (a third
/// at once is refused), writes its proxies' key, tells `NOTIFY_SOCKET` it is ready, runs its
/// consent command without systemd's variables, and on SIGTERM exits 0 and leaves the socket
/// file, which is systemd's, where it is (its key goes).
#[test]
fn activated_broker_serves_the_handed_socket_and_leaves_it() {
    if !have("systemd-socket-activate") {
        return;
    }
    let started = Instant::now();
    let (t, runtime, home, root) = user_dirs();
    let sock = PathBuf::from(expand(
        &unit_value("fsbroker.socket", "ListenStream"),
        &runtime,
        &home,
    ));
    std::fs::create_dir(sock.parent().unwrap()).unwrap();
    std::fs::set_permissions(
        sock.parent().unwrap(),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let notify_path = t.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(LIMIT)).unwrap();

    let exec = expand(
        &unit_value("fsbroker.service", "ExecStart"),
        &runtime,
        &home,
    );
    // It passes on only the variables it is told to (`-E`), and names the socket as a unit
    // would (`LISTEN_FDNAMES`, which must not reach the consent command either).
    let mut args = vec![
        "-l".to_owned(),
        path_str(&sock),
        "--fdname=broker".to_owned(),
        format!("--setenv=NOTIFY_SOCKET={}", path_str(&notify_path)),
        "--setenv=PATH".to_owned(),
    ];
    args.extend(exec.split(' ').map(str::to_owned));
    let mut broker = Cmd::program("systemd-socket-activate", &args)
        .group()
        .log(Log::Keep)
        .spawn();
    let end = Instant::now() + LIMIT;
    while !is_socket(&sock) {
        assert!(
            broker.alive(),
            "systemd-socket-activate exited: {}",
            broker.log_text()
        );
        assert!(Instant::now() < end, "no socket at {}", sock.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    // systemd-socket-activate starts the broker at the first connection, as systemd does.
    let mut first = Fsb::connect(&sock);
    let roots = first.ok("roots/list", json!({}));
    assert_eq!(roots["roots"][0]["name"], "r", "{roots}");
    assert!(
        roots["roots"][0]["uri"]
            .as_str()
            .is_some_and(|u| u.ends_with(&path_str(&root))),
        "{roots}"
    );
    let mut ready = [0u8; 64];
    let n = notify.recv(&mut ready).expect("READY=1 on NOTIFY_SOCKET");
    assert_eq!(&ready[..n], b"READY=1\n");
    assert!(
        proxy_key_files(&sock).iter().any(|k| k.is_file()),
        "no proxy key among {:?}",
        proxy_key_files(&sock)
    );
    assert_consent_command_has_no_listen_vars(&mut first, t.path());

    let mut second = Fsb::connect(&sock);
    let again = second.ok("roots/list", json!({}));
    assert_eq!(again, roots);
    // max_sessions = 2: a third connection at once is told so and closed.
    let mut third = Fsb::connect(&sock);
    let refused = third.read_message();
    assert_eq!(
        common::code(&refused["error"]),
        "QUOTA_EXCEEDED",
        "{refused}"
    );
    drop(third);

    broker.signal(rustix::process::Signal::TERM);
    let status = broker
        .wait_exit(LIMIT)
        .expect("the broker exits on SIGTERM");
    assert!(status.success(), "{status}: {}", broker.log_text());
    assert!(
        is_socket(&sock),
        "the socket file, systemd's, was removed at exit"
    );
    assert!(
        proxy_key_files(&sock).iter().all(|k| !k.exists()),
        "the proxies' key outlived the broker"
    );
    println!("activated broker: {:?}", started.elapsed());
}

/// A launcher that hands `serve --listen` a descriptor 3 of the kind named, the way systemd
/// would (`LISTEN_FDS`, `LISTEN_PID` = the broker's, since it `exec`s), and then runs it.
const LAUNCHER: &str = r#"
import os, socket, sys
kind, path, scratch, pid = sys.argv[1:5]
argv = sys.argv[5:]
keep, count = [], 1
# Descriptors 3 and 4 are held on /dev/null first, so that what is made below lands above
# them (and is close-on-exec, as Python makes it) and only what is put on them is handed.
reserved = [os.open(os.devnull, os.O_RDONLY) for _ in range(2)]
assert reserved == [3, 4], reserved
def unix(at, listen=True, kind=socket.SOCK_STREAM):
    s = socket.socket(socket.AF_UNIX, kind)
    s.bind(at)
    if listen:
        s.listen()
    keep.append(s)
    return s.fileno()
if kind == "file":
    f = open(os.path.join(scratch, "plain.txt"), "w"); keep.append(f); fd = f.fileno()
elif kind == "tcp":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); keep.append(s); fd = s.fileno()
elif kind == "datagram":
    fd = unix(path, listen=False, kind=socket.SOCK_DGRAM)
elif kind == "not-listening":
    fd = unix(path, listen=False)
elif kind == "elsewhere":
    unix(path)
    fd = unix(os.path.join(scratch, "elsewhere.sock"))
elif kind == "abstract":
    unix(path)
    fd = unix("\0fsbroker-test-%d" % os.getpid())
elif kind == "writable-by-others":
    fd = unix(path)
    os.chmod(path, 0o666)
elif kind == "two":
    fd = unix(path)
    os.dup2(unix(path + ".2"), 4)
    count = 2
elif kind == "none":
    fd = None
elif kind == "listening":
    fd = unix(path)
else:
    sys.exit("unknown kind " + kind)
if fd is None:
    os.close(3)
else:
    os.dup2(fd, 3)
if count == 1:
    os.close(4)
os.environ["LISTEN_FDS"] = str(count)
os.environ["LISTEN_PID"] = str(os.getpid()) if pid == "ours" else pid
os.execv(argv[0], argv)
"#;

/// `serve` with descriptor 3 of `kind` handed by [`LAUNCHER`], `LISTEN_PID` = `pid` ("ours"
/// for the broker's own), the socket path `sock`, and `extra` arguments.
fn launch(kind: &str, pid: &str, sock: &Path, scratch: &Path, extra: &[&str]) -> Fsb {
    let mut args = vec![
        "-c".to_owned(),
        LAUNCHER.to_owned(),
        kind.to_owned(),
        path_str(sock),
        path_str(scratch),
        pid.to_owned(),
        bin().to_owned(),
        "serve".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Cmd::program(common::python(), &args)
        .group()
        .log(Log::Keep)
        .spawn()
}

/// Every descriptor that is not a listening Unix stream socket at `--listen`'s path, handed
/// as systemd's, is refused: the broker exits 1 at once with an error that names what it got
/// (and the paths when they differ), never hangs, and never serves it.
#[test]
fn handed_descriptors_that_are_not_the_socket_are_refused() {
    let started = Instant::now();
    let (_t, dir) = tempdir();
    let cases: &[(&str, &[&str], &str)] = &[
        ("file", &[], "is not a socket but a regular file"),
        (
            "tcp",
            &[],
            "is an IPv4 (AF_INET) socket, not a Unix (AF_UNIX) one",
        ),
        (
            "datagram",
            &[],
            "is a datagram (SOCK_DGRAM) Unix socket, not a stream (SOCK_STREAM) one",
        ),
        (
            "not-listening",
            &[],
            "is a Unix stream socket that is not listening",
        ),
        ("elsewhere", &[], "elsewhere.sock, not to "),
        ("abstract", &[], "is bound to no path"),
        (
            "writable-by-others",
            &[],
            "writable by others (mode 0666), so other users could connect",
        ),
        ("two", &[], "handed over 2 descriptors"),
        ("none", &[], "is not open"),
        // Handed a good socket, but told to serve stdio.
        ("listening", &["--no-listen"], "was not given --listen PATH"),
    ];
    for (i, (kind, extra, expected)) in cases.iter().enumerate() {
        let scratch = dir.join(format!("case{i}"));
        std::fs::create_dir(&scratch).unwrap();
        let sock = scratch.join("broker.sock");
        let mut args = vec!["--root", scratch.to_str().unwrap()];
        let sock_arg = path_str(&sock);
        if !extra.contains(&"--no-listen") {
            args.extend(["--listen", sock_arg.as_str()]);
        }
        let mut broker = launch(kind, "ours", &sock, &scratch, &args);
        let status = broker
            .wait_exit(LIMIT)
            .unwrap_or_else(|| panic!("{kind}: still running after {LIMIT:?}"));
        assert!(broker.log_closed_within(LIMIT), "{kind}: stderr still open");
        let log = broker.log_text();
        assert_eq!(status.code(), Some(1), "{kind}: {status}: {log}");
        assert!(
            log.contains(expected),
            "{kind}: wanted {expected:?} in:\n{log}"
        );
        if *kind == "elsewhere" {
            // Both paths, so the unit's mistake is plain.
            assert!(
                log.contains(&path_str(&scratch.join("elsewhere.sock")))
                    && log.contains(&format!("not to {}", sock.display())),
                "{log}"
            );
        }
        println!("{kind}: {}", log.lines().last().unwrap_or_default());
    }
    println!(
        "{} handed descriptors refused in {:?}",
        cases.len(),
        started.elapsed()
    );
}

/// Variables meant for another process (`LISTEN_PID` not the broker's; here with a regular
/// file at descriptor 3, which the broker must not take) are ignored: it binds its own socket
/// as usual, serves it, removes it at exit, and unsets them, so its consent command does not
/// inherit them either.
#[test]
fn listen_vars_for_another_process_are_ignored() {
    let (t, runtime, home, _root) = user_dirs();
    let policy = policy_path(&runtime, &home);
    let sock = t.path().join("own.sock");
    let mut broker = launch(
        "file",
        "1",
        &sock,
        t.path(),
        &["--listen", &path_str(&sock), "--policy", &policy],
    );
    let end = Instant::now() + LIMIT;
    while !is_socket(&sock) {
        assert!(broker.alive(), "the broker exited: {}", broker.log_text());
        assert!(Instant::now() < end, "no socket at {}", sock.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut conn = Fsb::connect(&sock);
    assert_eq!(conn.ok("roots/list", json!({}))["roots"][0]["name"], "r");
    assert_consent_command_has_no_listen_vars(&mut conn, t.path());
    broker.signal(rustix::process::Signal::TERM);
    let status = broker
        .wait_exit(LIMIT)
        .expect("the broker exits on SIGTERM");
    assert!(status.success(), "{status}: {}", broker.log_text());
    assert!(
        !sock.exists(),
        "its own socket, bound by itself, stays after exit"
    );
}

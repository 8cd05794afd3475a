//! The administrator's managed policy (`/etc/fsbroker/managed.toml`, docs/policy.md "The
//! managed policy"), on the real binary: bounds the person cannot lift with their policy or
//! flags, a managed file that cannot be trusted stopping the broker, and a live narrowing
//! revoking at once.
//!
//! Nothing here touches the machine's own `/etc`: each broker runs as root in a private mount
//! namespace (`unshare --mount`) whose `/etc` is an overlay of the real one (writes go to a
//! tmpfs) with `/etc/fsbroker` a private tmpfs of its own, and the test reaches that file
//! through `/proc/PID/root`.

// Tests set up their own files with std::fs.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::{Cmd, Log};
use common::{Fsb, bin};

/// How long a live narrowing may take to revoke (the issue's bound).
const REVOKE_WITHIN: Duration = Duration::from_secs(2);

/// Makes the private `/etc` and runs the rest of its arguments there: `$1` a scratch folder
/// (a tmpfs is mounted on it, in the namespace only), `$2` the managed file to install (`-`
/// for none), `$3` its owner and `$4` its mode.
const PRIVATE_ETC: &str = r#"set -e
scratch=$1; managed=$2; owner=$3; mode=$4; shift 4
mount -t tmpfs -o mode=0700 fsbroker-test "$scratch"
mkdir "$scratch/upper" "$scratch/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$scratch/upper,workdir=$scratch/work" /etc
mkdir -p /etc/fsbroker
mount -t tmpfs -o mode=0755 fsbroker-managed /etc/fsbroker
if [ "$managed" != - ]; then
  cp "$managed" /etc/fsbroker/managed.toml
  chown "$owner" /etc/fsbroker/managed.toml
  chmod "$mode" /etc/fsbroker/managed.toml
fi
exec "$@"
"#;

/// A managed policy for one broker: its text, owner and mode, and the folder the private
/// `/etc` is built in.
struct Etc {
    _dir: tempfile::TempDir,
    scratch: PathBuf,
    managed: Option<PathBuf>,
    owner: String,
    mode: String,
}

impl Etc {
    /// `text` as the managed policy, owned by root, mode 0644; `None` without the file.
    fn new(text: Option<&str>) -> Option<Etc> {
        if !rustix::process::getuid().is_root()
            || Command::new("unshare").arg("--help").output().is_err()
        {
            common::skipped("a private mount namespace needs root and unshare(1)");
            return None;
        }
        let (dir, path) = common::tempdir();
        let scratch = path.join("etc");
        std::fs::create_dir(&scratch).unwrap();
        let managed = text.map(|t| {
            let p = path.join("managed.toml");
            std::fs::write(&p, t).unwrap();
            p
        });
        Some(Etc {
            _dir: dir,
            scratch,
            managed,
            owner: "0:0".into(),
            mode: "0644".into(),
        })
    }

    /// The arguments of `unshare` that run `fsbroker ARGS` under this `/etc`.
    fn argv(&self, args: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = [
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            PRIVATE_ETC,
            "sh",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(self.scratch.to_string_lossy().into_owned());
        v.push(
            self.managed
                .as_ref()
                .map_or("-".into(), |p| p.to_string_lossy().into_owned()),
        );
        v.push(self.owner.clone());
        v.push(self.mode.clone());
        v.push(bin().to_owned());
        v.extend(args.iter().map(|s| s.to_string()));
        v
    }

    /// Runs `fsbroker ARGS` to its end, stdin closed: its exit status and stderr.
    fn run(&self, args: &[&str]) -> (std::process::ExitStatus, String) {
        let out = Command::new("unshare")
            .args(self.argv(args))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Asserts `fsbroker ARGS` refuses to start, naming `rule` (and the managed file).
    fn refused(&self, args: &[&str], rule: &str) -> String {
        let (status, err) = self.run(args);
        assert!(!status.success(), "{args:?} started: {err}");
        assert!(
            err.contains(rule) && err.contains("/etc/fsbroker/managed.toml"),
            "{args:?}: the refusal does not name {rule:?} and the managed file: {err}"
        );
        err
    }

    /// `fsbroker ARGS` as a live broker (stderr kept, output read ahead).
    fn start(&self, args: &[&str]) -> Fsb {
        Cmd::program("unshare", &self.argv(args))
            .env("RUST_LOG", "fsbroker=info")
            .log(Log::Keep)
            .ahead()
            .deadline(Duration::from_secs(10))
            .spawn()
    }
}

/// The managed file of the broker `b` as the test reaches it: through its mount namespace.
fn managed_of(b: &Fsb) -> PathBuf {
    PathBuf::from(format!("/proc/{}/root/etc/fsbroker/managed.toml", b.pid()))
}

/// Replaces the managed file of `b` with `text` as an administrator's tool would: a new
/// file renamed over it, owned by root, mode 0644.
fn rewrite(b: &Fsb, text: &str) {
    let target = managed_of(b);
    let tmp = target.with_file_name("managed.toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &target).unwrap();
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Two folders of the person's, `a` and `b`, each with `notes.txt`, `.env` and a `locked/`
/// folder holding `plan.txt`.
fn person() -> (tempfile::TempDir, PathBuf) {
    let (t, home) = common::tempdir();
    let home = home.canonicalize().unwrap();
    for d in ["a", "b"] {
        let dir = home.join(d);
        std::fs::create_dir_all(dir.join("locked")).unwrap();
        std::fs::write(dir.join("notes.txt"), "notes").unwrap();
        std::fs::write(dir.join(".env"), "SECRET=1").unwrap();
        std::fs::write(dir.join("locked/plan.txt"), "plan").unwrap();
        std::fs::create_dir_all(dir.join(".ssh")).unwrap();
        std::fs::write(dir.join(".ssh/id"), "KEY").unwrap();
        std::fs::write(dir.join("run.sh"), "exit 0\n").unwrap();
    }
    (t, home)
}

#[test]
fn an_unsafe_or_broken_managed_file_stops_the_broker_and_an_absent_one_changes_nothing() {
    let (_t, home) = person();
    let a = home.join("a");
    let args = ["serve", "--root", s(&a)];
    // Absent: the broker starts and serves as it always did.
    let Some(etc) = Etc::new(None) else { return };
    let mut b = etc.start(&args);
    assert_eq!(
        b.ok("roots/list", json!({}))["roots"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    drop(b);

    let ok = "[roots]\nwithin = [\"/\"]\n";
    for (owner, mode, text, says) in [
        ("1000:1000", "0644", ok, "owned by uid 1000, not root"),
        ("0:0", "0666", ok, "writable by everyone"),
        ("0:1000", "0664", ok, "writable by group 1000"),
        ("0:0", "0644", "[roots]\nwithn = []\n", "withn"),
        (
            "0:0",
            "0644",
            "[confine]\nrequired = \"sometimes\"\n",
            "sometimes",
        ),
        ("0:0", "0644", "[limits]\ntimeout_ms = 0\n", "timeout_ms"),
    ] {
        let Some(mut etc) = Etc::new(Some(text)) else {
            return;
        };
        etc.owner = owner.into();
        etc.mode = mode.into();
        let (status, err) = etc.run(&args);
        assert!(!status.success(), "{owner} {mode} {text:?}: started: {err}");
        assert!(
            err.contains("managed policy /etc/fsbroker/managed.toml") && err.contains(says),
            "{owner} {mode} {text:?}: {err}"
        );
        assert!(err.contains("does not run without it"), "{err}");
    }
}

#[test]
fn the_person_cannot_widen_any_managed_rule_from_their_policy_or_flags() {
    let (_t, home) = person();
    let (a, b) = (home.join("a"), home.join("b"));
    let (pt, pdir) = common::tempdir();
    let log = pdir.join("audit.jsonl");
    let sock = pdir.join("syslog.sock");
    let _sock = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    let managed = format!(
        r#"[roots]
within = ["{a}"]
read_only = ["{a}/locked"]
consent = ["{a}/locked"]
deny = ["**/.env", "**/.ssh/**"]

[limits]
max_file_size = 1000
bytes_per_second = 1000000

[audit]
required = true
copies = ["syslog"]
syslog_socket = "{sock}"

[confine]
required = "best-effort"
net = false

[servers]
allow = ["/bin/true", {{ path = "{a}/run.sh", interpreter = "/bin/sh" }}]

[remote]
allow = ["https://mcp.example.com/team/mcp"]
"#,
        a = a.display(),
        sock = sock.display()
    );
    let Some(etc) = Etc::new(Some(&managed)) else {
        return;
    };
    let audit = format!(
        "[audit]\npath = \"{}\"\nsyslog = \"{}\"\n",
        log.display(),
        sock.display()
    );
    let policy = |body: &str| {
        let p = pdir.join(format!("p{}.toml", body.len()));
        std::fs::write(&p, format!("{audit}{body}")).unwrap();
        p
    };
    // A root outside the folders roots must lie within, from the policy and from a flag.
    let outside = policy(&format!("[[root]]\npath = \"{}\"\n", b.display()));
    etc.refused(&["serve", "--policy", s(&outside)], "[roots] within");
    let good = policy("");
    etc.refused(
        &["serve", "--policy", s(&good), "--root", s(&b)],
        "[roots] within",
    );
    // Paths a confined server would be given beyond its roots are bounded as roots are.
    let extra = policy(&format!("[confine]\nwrite = [\"{}\"]\n", b.display()));
    etc.refused(&["serve", "--policy", s(&extra)], "[roots] within");
    let extra = policy(&format!("[confine]\nread = [\"{}\"]\n", b.display()));
    etc.refused(&["serve", "--policy", s(&extra)], "[roots] within");
    let extra = policy(&format!(
        "[confine]\nwrite = [\"{}\"]\n",
        a.join("locked").display()
    ));
    etc.refused(&["serve", "--policy", s(&extra)], "[roots] read_only");
    // A root inside a folder a managed deny glob covers (the glob sees no path inside it).
    etc.refused(
        &["serve", "--policy", s(&good), "--root", s(&a.join(".ssh"))],
        "[roots] deny",
    );
    // The network, and keeping revoked access, for a confined server.
    let net = policy("[confine]\nnet = true\n");
    etc.refused(&["serve", "--policy", s(&net)], "[confine] net");
    let keep = policy("[confine]\non_revoke = \"keep\"\n");
    etc.refused(&["serve", "--policy", s(&keep)], "[confine] on_revoke");
    // The required copy sent to a socket of the person's own.
    let own = pdir.join("own.sock");
    let _own = std::os::unix::net::UnixDatagram::bind(&own).unwrap();
    let elsewhere = pdir.join("elsewhere.toml");
    std::fs::write(
        &elsewhere,
        format!(
            "[audit]\npath = \"{}\"\nsyslog = \"{}\"\n",
            log.display(),
            own.display()
        ),
    )
    .unwrap();
    etc.refused(
        &["serve", "--policy", s(&elsewhere), "--root", s(&a)],
        "[audit] copies",
    );
    // A mode: read-write where the administrator said read-only.
    let locked = a.join("locked");
    etc.refused(
        &[
            "serve",
            "--policy",
            s(&good),
            "--root",
            s(&locked),
            "--read-write",
        ],
        "[roots] read_only",
    );
    // Consent: `auto` where the administrator requires the person's consent.
    let auto = policy(&format!(
        "[[root]]\npath = \"{}\"\nconsent = \"auto\"\n",
        locked.display()
    ));
    etc.refused(&["serve", "--policy", s(&auto)], "[roots] consent");
    etc.refused(
        &[
            "serve",
            "--policy",
            s(&good),
            "--root",
            s(&locked),
            "--consent",
            "auto",
        ],
        "[roots] consent",
    );
    // Limits above a ceiling, and 0 (unlimited) where a ceiling is set.
    let big = policy("[limits]\nmax_file_size = 5000\n");
    etc.refused(&["serve", "--policy", s(&big)], "[limits] max_file_size");
    let unlimited = policy("[limits]\nbytes_per_second = 0\nmax_file_size = 999\n");
    let _ = unlimited; // 0 is the default: lowered to the ceiling, not refused
    let fast = policy("[limits]\nbytes_per_second = 2000000\n");
    etc.refused(
        &["serve", "--policy", s(&fast)],
        "[limits] bytes_per_second",
    );
    // No audit log at all, and one without the copy that must leave the machine.
    etc.refused(&["serve", "--root", s(&a)], "[audit] required");
    etc.refused(
        &[
            "serve",
            "--root",
            s(&a),
            "--audit",
            s(&pdir.join("other.jsonl")),
        ],
        "[audit] copies",
    );
    // The proxy: without --confine, with --confine=off, another server, another URL.
    let proxy = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["proxy", "--policy", s(&good), "--root", s(&a)]
            .iter()
            .map(|x| x.to_string())
            .collect();
        v.extend(extra.iter().map(|x| x.to_string()));
        v
    };
    let args = proxy(&["--", "true"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    etc.refused(&refs, "[confine] required");
    let args = proxy(&["--confine=off", "--", "true"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    etc.refused(&refs, "[confine] required");
    let args = proxy(&["--confine", "--", "sh", "-c", "exit 0"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = etc.refused(&refs, "[servers] allow");
    assert!(err.contains("is not one of the allowed servers"), "{err}");
    // An allowed program as the first argument of another never makes that other allowed,
    // and the allowed script runs only as its interpreter's very first argument.
    let script = a.join("run.sh");
    let evil = pdir.join("evil");
    std::fs::write(&evil, "#!/bin/sh\necho EVIL RAN >&2\n").unwrap();
    std::fs::set_permissions(&evil, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for server in [
        vec![s(&evil), "/bin/true"],
        vec![s(&evil), s(&script)],
        vec!["/bin/sh", "-e", s(&script)],
        vec!["/bin/bash", s(&script)],
    ] {
        let mut extra = vec!["--confine", "--"];
        extra.extend(server.iter().copied());
        let args = proxy(&extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        etc.refused(&refs, "[servers] allow");
    }
    let args = proxy(&["--confine", "--", "sh", s(&script)]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, err) = etc.run(&refs);
    assert!(status.success(), "the allowed script was refused: {err}");
    // The tests' switch that pretends an older kernel, lowering required confinement.
    let args = proxy(&["--confine", "--", "/bin/true"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = Command::new("unshare")
        .args(etc.argv(&refs))
        .env("FSBROKER_LANDLOCK_ABI", "0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("[confine] required"),
        "{err}"
    );
    for url in [
        "https://mcp.example.com/other",
        "https://mcp.example.com/team/mcpx",
        "http://mcp.example.com/team/mcp",
        "https://mcp.example.com:8443/team/mcp",
        "https://mcp.example.com.evil.test/team/mcp",
        "https://mcp.example.com/team/mcp/..%2fadmin",
        "https://mcp.example.com/team/mcp/%2E%2E/admin",
        "https://mcp.example.com//team/mcp",
    ] {
        let args = proxy(&["--url", url]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        etc.refused(&refs, "[remote] allow");
    }
    // The controls: the allowed URL gets past the managed rules (to a connection error), and
    // the allowed server runs confined and its exit code comes back.
    let args = proxy(&["--url", "https://mcp.example.com/team/mcp/v1"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (_, err) = etc.run(&refs);
    assert!(!err.contains("[remote] allow"), "{err}");
    let args = proxy(&["--confine", "--", "/bin/true"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, err) = etc.run(&refs);
    assert!(
        !err.contains("refused by the managed policy"),
        "the allowed, confined server was refused: {err}"
    );
    assert!(status.success(), "{err}");
    drop(pt);
}

#[test]
fn managed_rules_hold_on_every_request_and_the_audit_names_the_file_in_force() {
    let (_t, home) = person();
    let a = home.join("a");
    let managed = format!(
        "[roots]\nread_only = [\"{a}/locked\"]\ndeny = [\"**/.env\"]\n\n[limits]\nmax_file_size = 1000\n\n[audit]\nrequired = true\n",
        a = a.display()
    );
    let Some(etc) = Etc::new(Some(&managed)) else {
        return;
    };
    let (_pt, pdir) = common::tempdir();
    let log = pdir.join("audit.jsonl");
    let mut b = etc.start(&["serve", "--root", s(&a), "--read-write", "--audit", s(&log)]);
    // What the user asked for where no managed rule speaks: a write.
    b.ok(
        "files/write",
        json!({"path": "a/new.txt", "content": "hello"}),
    );
    // A managed deny glob the person's policy does not have.
    let e = b.err("files/read", json!({"path": "a/.env"}));
    assert_eq!(common::code(&e), "PERMISSION_DENIED", "{e}");
    assert!(
        e["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("managed policy ([roots] deny)"),
        "{e}"
    );
    // A read-only folder inside a read-write root.
    let e = b.err(
        "files/write",
        json!({"path": "a/locked/plan.txt", "content": "x"}),
    );
    assert_eq!(common::code(&e), "PERMISSION_DENIED", "{e}");
    assert!(
        e["data"]["reason"]
            .as_str()
            .unwrap()
            .contains("([roots] read_only)"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(a.join("locked/plan.txt")).unwrap(),
        "plan"
    );
    // The ceiling on file size, lowered from the default.
    let e = b.err(
        "files/write",
        json!({"path": "a/big.txt", "content": "x".repeat(2000)}),
    );
    assert_ne!(common::code(&e), "", "{e}");
    assert!(!a.join("big.txt").exists());
    drop(b);
    // The session's first line carries the managed file's SHA-256, and only the first.
    let want = sha256_hex(managed.as_bytes());
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &Value| l.get("method").is_some())
        .collect();
    assert!(lines.len() >= 4, "{text}");
    assert_eq!(lines[0]["managedPolicySha256"], want, "{text}");
    assert!(
        lines[1..]
            .iter()
            .all(|l| l.get("managedPolicySha256").is_none()),
        "{text}"
    );
}

#[test]
fn a_live_narrowing_revokes_within_two_seconds_and_an_unsafe_file_withdraws_every_root() {
    let (_t, home) = person();
    let (a, b_dir) = (home.join("a"), home.join("b"));
    let wide = format!("[roots]\nwithin = [\"{}\"]\n", home.display());
    let Some(etc) = Etc::new(Some(&wide)) else {
        return;
    };
    let mut b = etc.start(&["serve", "--root", s(&a), "--root", s(&b_dir)]);
    let names = |b: &mut Fsb| -> Vec<String> {
        b.ok("roots/list", json!({}))["roots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&mut b), ["a", "b"]);
    b.ok("files/read", json!({"path": "b/notes.txt"}));

    // The administrator narrows `within` to `a`: `b` is revoked.
    let narrowed = format!("[roots]\nwithin = [\"{}\"]\n", a.display());
    let at = Instant::now();
    rewrite(&b, &narrowed);
    let Some((when, n)) = b.next_notification(Duration::from_secs(10)) else {
        panic!("no list_changed after narrowing the managed policy")
    };
    assert_eq!(n["method"], "notifications/roots/list_changed");
    let took = when.duration_since(at);
    assert!(took < REVOKE_WITHIN, "revoked after {took:?}");
    assert_eq!(names(&mut b), ["a"]);
    let e = b.err(
        "files/read",
        json!({"path": format!("{}/notes.txt", b_dir.display())}),
    );
    assert_ne!(common::code(&e), "", "{e}");

    // The file made writable by everyone: every root is withdrawn, and the log says why.
    let at = Instant::now();
    let perms = std::os::unix::fs::PermissionsExt::from_mode(0o666);
    std::fs::set_permissions(managed_of(&b), perms).unwrap();
    let Some((when, _)) = b.next_notification(Duration::from_secs(10)) else {
        panic!("no list_changed after making the managed policy unsafe")
    };
    assert!(when.duration_since(at) < REVOKE_WITHIN);
    assert!(names(&mut b).is_empty());
    let end = Instant::now() + Duration::from_secs(5);
    while !b.log_text().contains("writable by everyone") && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        b.log_text().contains("writable by everyone"),
        "{}",
        b.log_text()
    );

    // Made safe again: its roots come back.
    let perms = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    std::fs::set_permissions(managed_of(&b), perms).unwrap();
    assert!(b.next_notification(Duration::from_secs(10)).is_some());
    assert_eq!(names(&mut b), ["a"]);
}

#[test]
fn policy_explain_marks_where_each_rule_comes_from_and_the_console_can_be_required() {
    let (_t, home) = person();
    let a = home.join("a");
    let managed = format!(
        "[roots]\nread_only = [\"{a}/locked\"]\ndeny = [\"**/.env\"]\n\n[limits]\ntimeout_ms = 5000\n\n[console]\nrequired = true\n",
        a = a.display()
    );
    let Some(etc) = Etc::new(Some(&managed)) else {
        return;
    };
    let mut explain = Command::new("unshare");
    explain.args(etc.argv(&["policy", "explain", "--root", s(&a), "--read-write"]));
    prints_every(
        explain,
        &[
            "managed policy: /etc/fsbroker/managed.toml (sha256 ",
            "mode read-write [flag --read-write]",
            "locked: read-only [managed: [roots] read_only]",
            "deny **/.env [managed: [roots] deny]",
            "timeout_ms = 5000 [managed: ceiling 5000]",
            "max_file_size = 1073741824 [default]",
            "console: on [managed: [console] required]",
        ],
    );
    // The console is on although no flag asked for it, and shows the person which rules
    // their organisation set on each root.
    let (_u, udir) = common::tempdir();
    let url = udir.join("console.url");
    let mut b = etc.start(&["serve", "--root", s(&a), "--console-url-file", s(&url)]);
    b.ok("roots/list", json!({}));
    assert!(
        b.log_text().contains("fsbroker: console at"),
        "{}",
        b.log_text()
    );
    let console = common::console::Console::from_url_file(&url);
    let state = console.state();
    assert_eq!(
        state["roots"][0]["managed"],
        json!(["servers may only read locked", "servers never see **/.env"]),
        "{state}"
    );
}

#[test]
fn a_running_server_the_managed_policy_no_longer_allows_is_ended() {
    let (_t, home) = person();
    let a = home.join("a");
    let Some(etc) = Etc::new(Some("[roots]\ndeny = [\"**/.env\"]\n")) else {
        return;
    };
    // An unconfined server (nothing required yet) that runs until it is ended.
    let mut p = etc.start(&["proxy", "--root", s(&a), "--", "sleep", "300"]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(p.alive(), "{}", p.log_text());
    let at = Instant::now();
    rewrite(&p, "[confine]\nrequired = \"best-effort\"\n");
    let status = p.wait_exit(Duration::from_secs(10));
    let took = at.elapsed();
    assert!(
        status.is_some(),
        "the server was not ended: {}",
        p.log_text()
    );
    // The reload's quiet period, the SIGTERM and the proxy's exit: well inside the bound.
    assert!(took < REVOKE_WITHIN, "ended after {took:?}");
    assert!(
        p.log_text().contains("[confine] required"),
        "{}",
        p.log_text()
    );
}

/// Runs `command`, asserting it succeeds and prints each of `wants` on stdout.
fn prints_every(mut command: Command, wants: &[&str]) {
    let out = command.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in wants {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Debian package's conffile (`dist/debian/managed.toml`) ships every rule commented out;
/// with its rules uncommented it must be a valid managed policy, so that the example an
/// administrator starts from works as written.
#[test]
fn the_shipped_example_uncommented_is_a_valid_managed_policy() {
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("dist/debian/managed.toml"),
    )
    .unwrap();
    // A rule is a commented line that starts a table, sets a key, or continues a list.
    let rule = |l: &str| {
        let rest = l.trim_start_matches("# ");
        l.starts_with("# ")
            && (rest.starts_with('[')
                || rest.starts_with("  {")
                || rest.starts_with("  \"")
                || rest.starts_with(']')
                || rest
                    .split_once(" = ")
                    .is_some_and(|(k, _)| k.chars().all(|c| c.is_ascii_lowercase() || c == '_')))
    };
    let uncommented: String = shipped
        .lines()
        .map(|l| if rule(l) { &l[2..] } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        uncommented.contains("\n[roots]\n") && uncommented.contains("\nwithin = "),
        "{uncommented}"
    );
    let (_t, dir) = common::tempdir();
    let file = dir.join("managed.toml");
    std::fs::write(&file, &uncommented).unwrap();
    let mut check = Command::new(bin());
    check.args(["policy", "check", "--managed", s(&file)]);
    prints_every(
        check,
        &[
            "roots within:",
            "read-only:",
            "consent always:",
            "[limits] max_file_size at most 104857600",
            "audit required, with copies to syslog",
            "confinement required",
            "servers allowed: /usr/bin/mcp-server-git, /opt/acme/mcp-server",
            "remote servers allowed: https://mcp.example.com/",
            "console required",
        ],
    );
}

/// A folder above a managed read-only or consent-only path cannot be moved or deleted
/// through files/*: that would take its files out of the rule (the hostile pass renamed
/// `team` to `team2` and wrote `team2/contracts`).
#[test]
fn moving_or_deleting_a_folder_above_a_managed_path_is_refused() {
    let (_t, home) = person();
    let a = home.join("a");
    let managed = format!("[roots]\nread_only = [\"{}/locked\"]\n", a.display());
    let Some(etc) = Etc::new(Some(&managed)) else {
        return;
    };
    let mut b = etc.start(&["serve", "--root", s(&home), "--read-write"]);
    let name = home.file_name().unwrap().to_str().unwrap().to_owned();
    let e = b.err(
        "files/rename",
        json!({"oldPath": format!("{name}/a"), "newPath": format!("{name}/a2")}),
    );
    assert_eq!(common::code(&e), "PERMISSION_DENIED", "{e}");
    let e = b.err(
        "files/delete",
        json!({"path": format!("{name}/a"), "recursive": true}),
    );
    assert_eq!(common::code(&e), "PERMISSION_DENIED", "{e}");
    let e = b.err(
        "files/rename",
        json!({"oldPath": format!("{name}/a/locked"), "newPath": format!("{name}/b/locked2")}),
    );
    assert_eq!(common::code(&e), "PERMISSION_DENIED", "{e}");
    assert!(a.join("locked/plan.txt").exists());
    // The control: a folder above nothing managed moves.
    b.ok(
        "files/rename",
        json!({"oldPath": format!("{name}/b"), "newPath": format!("{name}/b2")}),
    );
}

/// A policy file the person breaks must not freeze the administrator's rules: when the
/// managed policy changes while the person's policy does not load, every root is withdrawn.
#[test]
fn a_broken_policy_file_cannot_freeze_a_managed_narrowing() {
    let (_t, home) = person();
    let (a, b_dir) = (home.join("a"), home.join("b"));
    let Some(etc) = Etc::new(Some(&format!(
        "[roots]\nwithin = [\"{}\"]\n",
        home.display()
    ))) else {
        return;
    };
    let (_p, pdir) = common::tempdir();
    let user = pdir.join("policy.toml");
    std::fs::write(
        &user,
        format!("[[root]]\npath = \"{}\"\nconsent = \"auto\"\n", a.display()),
    )
    .unwrap();
    let mut b = etc.start(&["serve", "--policy", s(&user)]);
    assert_eq!(
        b.ok("roots/list", json!({}))["roots"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    std::fs::write(&user, "not toml [[[\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The broken file alone keeps the policy in force (no notification).
    assert_eq!(
        b.ok("roots/list", json!({}))["roots"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let at = Instant::now();
    rewrite(
        &b,
        &format!("[roots]\nwithin = [\"{}\"]\n", b_dir.display()),
    );
    let Some((when, _)) = b.next_notification(Duration::from_secs(10)) else {
        panic!("the managed narrowing was frozen: {}", b.log_text())
    };
    assert!(when.duration_since(at) < REVOKE_WITHIN);
    assert!(
        b.ok("roots/list", json!({}))["roots"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{}",
        b.log_text()
    );
}

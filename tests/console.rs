//! The person's console over HTTP (the page's own browser tests are `console_browser.rs`):
//! the real binary (`serve --listen … --console`), real MCP sessions on its socket, and plain
//! HTTP/1.1 on loopback.
//!
//! - Who may use it: the token (Bearer) or the page's key (handed out only in the answer that
//!   spends the URL's one-time ticket), `Host` against DNS rebinding, `Origin`, `Sec-Fetch-Site` and the CSRF token on every state change, the
//!   headers every answer carries, loopback only, an owner-only URL file no server can read.
//! - Consent on the page: a prompt shows the paths with root and mode; the person approves
//!   some, narrows one to a folder beneath it, or denies; nobody answering is a denial; an
//!   answer can never widen what was asked.
//! - Revocation: a grant revoked, a session ended, a root paused (and kept paused across a
//!   reload) reach the live session (`list_changed`, refusals, the link closed), and each is
//!   in the audit log as the person's act.
//! - The feed: requests show in `/api/events` as the audit log has them, and a bulk read is
//!   merged into a few records.

#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::console::Console;
use common::fsb::{Fsb, Got};
use common::procs::Pids;
use common::{Listener, PolicyToml, RootToml, code};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(15);

/// A shared broker with its console, on a policy of the test's.
struct Setup {
    _dir: tempfile::TempDir,
    base: PathBuf,
    listener: Listener,
    console: Console,
    url_file: PathBuf,
    _pids: Pids,
}

impl Setup {
    fn start(policy: impl FnOnce(&Path) -> PolicyToml) -> Setup {
        Setup::start_with(policy, &[])
    }

    fn start_with(policy: impl FnOnce(&Path) -> PolicyToml, extra: &[&str]) -> Setup {
        let (dir, base) = common::tempdir();
        let file = policy(&base).write_to(&base.join("policy.toml"));
        let url_file = base.join("run").join("console.url");
        std::fs::create_dir(base.join("run")).unwrap();
        let pids = Pids::default();
        let url_arg = url_file.to_str().unwrap().to_owned();
        let mut args = vec!["--console", "--console-url-file", &url_arg];
        args.extend_from_slice(extra);
        let listener = Listener::start(&file, &base.join("s.sock"), &args, &pids);
        let console = Console::from_url_file(&url_file);
        Setup {
            _dir: dir,
            base,
            listener,
            console,
            url_file,
            _pids: pids,
        }
    }

    /// A session on the socket, as an MCP server's (a plain peer names no server: only a
    /// proxy's link is believed about that).
    fn session(&self) -> Fsb {
        let mut s = self.listener.connect();
        s.set_deadline(WAIT);
        s
    }
}

/// A policy with one `prompt` root `docs` (holding `a/`, `a/inner/`, `b/`) asked on the console
/// only, and an audit log.
fn prompt_policy(base: &Path, timeout_ms: u64) -> PolicyToml {
    let docs = base.join("docs");
    for d in ["a/inner", "b"] {
        std::fs::create_dir_all(docs.join(d)).unwrap();
    }
    std::fs::write(docs.join("a/inner/note.txt"), "inner").unwrap();
    std::fs::write(docs.join("a/top.txt"), "top").unwrap();
    std::fs::write(docs.join("b/other.txt"), "other").unwrap();
    PolicyToml::new()
        .root(RootToml::at(&docs).name("docs").consent("prompt"))
        .unlimited()
        .table(
            "consent",
            format!("provider = \"console\"\nterminal = false\ntimeout_ms = {timeout_ms}\n"),
        )
        .audit(&base.join("audit.jsonl"), "")
}

/// Sends `files/consent` for `paths` (relative to the root's folder) and returns its id; the
/// answer comes once the person answers.
fn ask(s: &mut Fsb, base: &Path, message: &str, paths: &[&str]) -> u64 {
    let abs: Vec<String> = paths
        .iter()
        .map(|p| base.join("docs").join(p).to_string_lossy().into_owned())
        .collect();
    s.send(
        "files/consent",
        json!({"message": message, "requestedPaths": abs}),
    )
}

/// The one prompt on the desk, once it is there.
fn one_prompt(c: &Console) -> Value {
    let state = c.wait_state(WAIT, |s| {
        s["prompts"].as_array().is_some_and(|p| !p.is_empty())
    });
    state["prompts"][0].clone()
}

fn audit_lines(base: &Path) -> Vec<Value> {
    std::fs::read_to_string(base.join("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Rule: the API answers only a request that names the console's own address in `Host`
/// (a rebound DNS name is refused) and carries the token; a wrong or missing token is 401;
/// every answer has the CSP, `nosniff` and framing headers and no CORS header, a preflight
/// included.
#[test]
fn only_the_token_holder_on_the_right_host_gets_in() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let c = &s.console;
    let bearer = format!("Bearer {}", c.token);

    let ok = c.get("/api/state");
    assert_eq!(ok.status, 200, "{ok:?}");
    let none = c.request("GET", "/api/state", &[], None);
    assert_eq!(none.status, 401, "{none:?}");
    let wrong = c.request(
        "GET",
        "/api/state",
        &[("Authorization", &format!("Bearer {}", "0".repeat(64)))],
        None,
    );
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let port = c.host.rsplit(':').next().unwrap();
    for host in [
        format!("evil.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        "127.0.0.1".to_owned(),
        format!("127.0.0.2:{port}"),
    ] {
        let rebound = c.request(
            "GET",
            "/api/state",
            &[("Host", &host), ("Authorization", &bearer)],
            None,
        );
        assert_eq!(rebound.status, 421, "Host {host}: {rebound:?}");
        assert!(!rebound.body.contains("csrf"), "{rebound:?}");
    }
    // Two `Host`s, the console's first (a proxy in between may take the other), and a
    // target in absolute form naming another host (which HTTP/1.1 says wins over `Host`):
    // refused too (round 4 review).
    let twice = c.request(
        "GET",
        "/api/state",
        &[
            ("Host", &c.host),
            ("Host", &format!("evil.example:{port}")),
            ("Authorization", &bearer),
        ],
        None,
    );
    assert_eq!(twice.status, 421, "{twice:?}");
    let absolute = c.request(
        "GET",
        &format!("http://evil.example:{port}/api/state"),
        &[("Host", &c.host), ("Authorization", &bearer)],
        None,
    );
    assert_eq!(absolute.status, 421, "{absolute:?}");
    let own_absolute = c.request(
        "GET",
        &format!("http://{}/api/state", c.host),
        &[("Host", &c.host), ("Authorization", &bearer)],
        None,
    );
    assert_eq!(own_absolute.status, 200, "{own_absolute:?}");
    let localhost = c.request(
        "GET",
        "/api/state",
        &[
            ("Host", &format!("localhost:{port}")),
            ("Authorization", &bearer),
        ],
        None,
    );
    assert_eq!(localhost.status, 200, "{localhost:?}");

    let preflight = c.request(
        "OPTIONS",
        "/api/roots/docs/pause",
        &[
            ("Origin", "http://evil.example"),
            ("Access-Control-Request-Method", "POST"),
            ("Access-Control-Request-Headers", "authorization"),
        ],
        None,
    );
    assert_ne!(preflight.status / 100, 2, "{preflight:?}");
    for r in [&ok, &none, &preflight, &c.request("GET", "/", &[], None)] {
        let csp = r.header("content-security-policy").unwrap_or_default();
        assert!(csp.contains("default-src 'self'"), "{r:?}");
        assert!(csp.contains("frame-ancestors 'none'"), "{r:?}");
        assert!(!csp.contains("unsafe-inline"), "{r:?}");
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"), "{r:?}");
        assert!(
            !r.headers
                .iter()
                .any(|(n, _)| n.starts_with("access-control-")),
            "no CORS header: {r:?}"
        );
    }
}

/// Rule: the page's URL carries a one-time ticket: spending it answers the page itself, not
/// cached, with a new page session's key in a `<meta>` element, and no cookie and no
/// redirect (nothing that would put the key in a URL, which the browser's history keeps);
/// the URL file gets the next ticket (the spent one opens nothing). The key is handed out
/// nowhere else: no endpoint trades anything for it. Cookies count for nothing (another
/// loopback port's program receives and sets them): a cookie jar full enough for a browser
/// to send near 700 KiB of them does not stop a request with the key. A state change from the
/// page needs the console's own `Origin`; a foreign or missing `Origin`, a cross-site
/// `Sec-Fetch-Site`, or a guessed key are all refused, and nothing is done.
#[test]
fn a_page_from_another_origin_cannot_act() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let c = &s.console;
    let first = c.page_url();
    let key = c.open_page();
    let spent = &first[first.find("/?ticket=").unwrap()..];
    let again = c.request("GET", spent, &[], None);
    assert_eq!(again.status, 401, "a ticket opens the page once: {again:?}");
    assert!(!again.body.contains(&key), "{again:?}");
    assert_ne!(c.page_url(), first, "the URL file has the next ticket");
    assert!(!std::fs::read_to_string(&s.url_file).unwrap().contains(&key));
    let page = c.request(
        "GET",
        &c.page_url()[c.page_url().find("/?ticket=").unwrap()..],
        &[],
        None,
    );
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(page.header("cache-control"), Some("no-store"), "{page:?}");
    assert_eq!(page.header("set-cookie"), None, "no cookie: {page:?}");
    assert_eq!(page.header("location"), None, "no redirect: {page:?}");
    assert!(
        !page.body.contains(&c.token),
        "the run's token stays out of the page"
    );
    let bare = c.request("GET", "/", &[], None);
    assert_eq!(bare.status, 200, "{bare:?}");
    assert!(
        !bare.body.contains("fsbroker-key"),
        "the page without a ticket holds no key"
    );

    let own = format!("http://{}", c.host);
    // What a program on another loopback port might try: the first sign-in's way to the
    // key (a claim), by every method.
    for method in ["POST", "GET"] {
        let claim = c.request(
            method,
            "/api/claim",
            &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
            (method == "POST").then_some(""),
        );
        assert_eq!(claim.status, 401, "no key for the asking: {claim:?}");
        assert!(!claim.body.contains(&key), "{claim:?}");
    }
    let with_key = c.request("GET", "/api/state", &[("X-CSRF-Token", &key)], None);
    assert_eq!(with_key.status, 200, "{with_key:?}");
    // A browser sends every cookie of 127.0.0.1 to every port, and pages there can fill the
    // jar: 170 cookies of 4 KiB.
    let jar: Vec<String> = (0..170)
        .map(|i| format!("c{i}={}", "x".repeat(4000)))
        .collect();
    let jar = jar.join("; ");
    let flooded = c.request(
        "GET",
        "/api/state",
        &[("Cookie", &jar), ("X-CSRF-Token", &key)],
        None,
    );
    assert_eq!(
        flooded.status, 200,
        "a full cookie jar shuts nobody out: {}",
        flooded.status
    );
    for (what, headers) in [
        (
            "a cookie of the console's first design",
            vec![("Cookie", &*format!("fsbroker_console_1={key}"))],
        ),
        (
            "the key as a Bearer token",
            vec![("Authorization", &*format!("Bearer {key}"))],
        ),
    ] {
        let r = c.request("GET", "/api/state", &headers, None);
        assert_eq!(r.status, 401, "{what}: {r:?}");
    }
    let events = c.request(
        "GET",
        &format!("/api/events?csrf={}", "0".repeat(64)),
        &[],
        None,
    );
    assert_eq!(events.status, 401, "{events:?}");

    let other_key = "a".repeat(64);
    let tries: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("no Origin", vec![("X-CSRF-Token", &key)]),
        (
            "a foreign Origin",
            vec![("Origin", "http://evil.example"), ("X-CSRF-Token", &key)],
        ),
        (
            "another port of loopback",
            vec![("Origin", "http://127.0.0.1:1"), ("X-CSRF-Token", &key)],
        ),
        ("no key", vec![("Origin", &own)]),
        (
            "a guessed key",
            vec![("Origin", &own), ("X-CSRF-Token", &c.token)],
        ),
        (
            "a cross-site fetch",
            vec![
                ("Origin", &own),
                ("X-CSRF-Token", &key),
                ("Sec-Fetch-Site", "cross-site"),
            ],
        ),
        (
            "a key of another run",
            vec![("Origin", &own), ("X-CSRF-Token", other_key.as_str())],
        ),
    ];
    for (what, headers) in &tries {
        let r = c.request("POST", "/api/roots/docs/pause", headers, Some(""));
        assert!(r.status == 403 || r.status == 401, "{what}: {r:?}");
    }
    let roots = c.state()["roots"].clone();
    assert_eq!(roots[0]["paused"], false, "nothing was paused: {roots}");

    let r = c.request(
        "POST",
        "/api/roots/docs/pause",
        &[
            ("Origin", &own),
            ("X-CSRF-Token", &key),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        Some(""),
    );
    assert_eq!(r.status, 204, "the page itself may act: {r:?}");
    assert_eq!(c.state()["roots"][0]["paused"], true);
    let bad = c.post("/api/sessions/not-a-number/end", None);
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.json()["error"].is_string(), "errors are JSON: {bad:?}");
}

/// Rule: the console serves at most 64 connections at once, and connections without a
/// credential cannot hold them: idle connections from any local program (120 of them) take
/// few of the broker's descriptors, its sessions go on, and the console answers a request
/// with the token while they are all held open; so it does while 64 others hold connections
/// kept alive by harmless requests of their own (the page's script), which need no
/// credential. A connection that sends nothing is closed (for a newer one, or at the 10 s a
/// request's head may take).
#[test]
fn idle_connections_cannot_exhaust_the_broker() {
    use std::io::{Read, Write};
    let s = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        std::fs::write(b.join("open/f.txt"), "f").unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
    });
    // More than the console serves, fewer than the kernel's backlog keeps waiting (beyond
    // it, a connect would wait for its SYN to be retried).
    let idle: Vec<std::net::TcpStream> = (0..120)
        .map(|_| std::net::TcpStream::connect(&s.console.host).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let fds = std::fs::read_dir(format!("/proc/{}/fd", s.listener.pid()))
        .unwrap()
        .count();
    assert!(
        fds < 120,
        "the broker holds {fds} descriptors for 120 idle connections"
    );
    let mut server = s.session();
    server.ok("files/read", json!({"path": "open/f.txt"}));
    // The limit is a hang guard: the answer comes at once, not after the 10 s.
    s.console.wait_state(WAIT, |st| st["roots"].is_array());
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut buf = [0u8; 16];
    let n = first.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "an idle connection is closed, not answered");
    drop(idle);

    // 64 connections, each kept alive by a request that needs no credential.
    let request = format!(
        "GET /console.css HTTP/1.1\r\nHost: {}\r\n\r\n",
        s.console.host
    );
    let mut busy = Vec::new();
    for _ in 0..64 {
        let mut conn = std::net::TcpStream::connect(&s.console.host).expect("connect");
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let n = conn.read(&mut buf).unwrap_or(0);
        assert!(n > 0, "the stylesheet is answered");
        busy.push(conn);
    }
    s.console.wait_state(WAIT, |st| st["roots"].is_array());
    drop(busy);
}

/// Rule: stderr, which hosts keep in their logs, names the console's address but never its
/// one-time ticket, which only the owner-only URL file holds (a server with a root over the
/// host's logs must not find a way in there).
#[test]
fn stderr_names_the_console_but_not_its_ticket() {
    use std::io::BufRead;
    let (_dir, base) = common::tempdir();
    let root = base.join("r");
    std::fs::create_dir(&root).unwrap();
    let url_file = base.join("console.url");
    let mut child = std::process::Command::new(common::bin())
        .args(["serve", "--root"])
        .arg(&root)
        .arg("--console")
        .arg("--console-url-file")
        .arg(&url_file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let line = loop {
        let line = rx.recv_timeout(WAIT).expect("the console's line on stderr");
        if line.contains("console at") {
            break line;
        }
    };
    let c = Console::from_url_file(&url_file);
    let url = c.page_url();
    let ticket = url.split("ticket=").nth(1).unwrap();
    assert!(
        line.starts_with(&format!("fsbroker: console at http://{}/ ", c.host)),
        "{line}"
    );
    assert!(!line.contains(ticket), "no ticket on stderr: {line}");
    assert!(!line.contains("ticket="), "{line}");
    assert!(!line.contains(&c.token), "{line}");
    assert!(
        line.contains(&format!(
            "fsbroker console --url-file {}",
            url_file.display()
        )),
        "says how to open it: {line}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Rule: the URL file is rewritten through a temporary file of a name no one can guess: a
/// file planted where the first design put it (`.NAME.PID.tmp`, in a directory others may
/// write to) does not stop the next ticket reaching the URL file.
#[test]
fn a_planted_temporary_file_does_not_stop_the_next_ticket() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let dir = s.url_file.parent().unwrap();
    let planted = dir.join(format!(".console.url.{}.tmp", s.listener.pid()));
    std::fs::write(&planted, "squatted").unwrap();
    let first = s.console.page_url();
    s.console.open_page();
    let next = s.console.page_url();
    assert_ne!(next, first, "the URL file has the next ticket");
    s.console.open_page();
    assert_eq!(std::fs::read_to_string(&planted).unwrap(), "squatted");
}

/// Rule: `--console` takes loopback addresses only; the URL file is owner-only and is one of
/// the broker's own files, which no server reads even when it lies inside a root; so is every
/// temporary sibling it is rewritten through (`console.url.RANDOM.tmp`), which holds the
/// same secrets, and a hard link made of it (an old version is emptied when replaced): a
/// server listing and reading the folder while the person opens the console again and again
/// never sees the token.
#[test]
fn loopback_only_and_the_url_file_is_protected() {
    let (_dir, base) = common::tempdir();
    let root = base.join("r");
    std::fs::create_dir(&root).unwrap();
    for addr in ["0.0.0.0:0", "192.0.2.1:80", "[::]:0", "example.com:80"] {
        let out = std::process::Command::new(common::bin())
            .args(["serve", "--root"])
            .arg(&root)
            .args(["--console", addr])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{addr} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("loopback") || err.contains("not an address"),
            "{addr}: {err}"
        );
    }
    let s = Setup::start_with(
        |b| {
            PolicyToml::new()
                .root(RootToml::at(b).name("all"))
                .unlimited()
        },
        &[],
    );
    let meta = std::fs::metadata(&s.url_file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let mut server = s.session();
    let e = server.err("files/read", json!({"path": s.url_file.to_str().unwrap()}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    let listed = server.ok(
        "files/list",
        json!({"path": s.base.join("run").to_str().unwrap()}),
    );
    assert!(!listed.to_string().contains(&s.console.token), "{listed}");
    // The file is rewritten through a temporary sibling (`console.url.RANDOM.tmp`) holding
    // the same token and ticket: one stands here as it would for a moment at each open.
    let sibling = s.base.join("run").join("console.url.0123456789abcdef.tmp");
    std::fs::write(&sibling, std::fs::read(&s.url_file).unwrap()).unwrap();
    let e = server.err("files/read", json!({"path": sibling.to_str().unwrap()}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    assert!(
        e["data"]["reason"].as_str().unwrap().contains("protected"),
        "{e}"
    );
    let listed = server.ok(
        "files/list",
        json!({"path": s.base.join("run").to_str().unwrap(), "includeHidden": true}),
    );
    assert!(!listed.to_string().contains(&s.console.token), "{listed}");
    let e = server.err("files/delete", json!({"path": sibling.to_str().unwrap()}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    // A hard link of the URL file under another name (a backup tool's, say): refused while
    // it is the file in use; once the person opened the console and the file was rewritten,
    // the old version is emptied (its inode may go to any file later, so it is not refused
    // for ever: it holds nothing).
    let link = s.base.join("copy.txt");
    std::fs::hard_link(&s.url_file, &link).unwrap();
    for method in ["files/read", "files/checksum"] {
        let e = server.err(method, json!({"path": link.to_str().unwrap()}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{method}: {e}");
    }
    s.console.open_page();
    let old = server.ok("files/read", json!({"path": link.to_str().unwrap()}));
    assert_eq!(old["content"], "", "the old version is emptied: {old}");
    let newer = s.base.join("copy-2.txt");
    std::fs::hard_link(&s.url_file, &newer).unwrap();
    let e = server.err("files/read", json!({"path": newer.to_str().unwrap()}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_file(&newer).unwrap();
    // And the real rewrites, many of them, while a session lists and reads the folder as
    // fast as it can: no token or ticket reaches it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let opener = {
        let (c, stop) = (s.console.clone(), std::sync::Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.open_page();
            }
        })
    };
    let run = s.base.join("run");
    std::fs::write(run.join("other.txt"), "not the broker's").unwrap();
    let mut seen = 0;
    for _ in 0..300 {
        let listed = server.ok(
            "files/list",
            json!({"path": run.to_str().unwrap(), "includeHidden": true}),
        );
        for entry in listed["entries"].as_array().into_iter().flatten() {
            let name = entry["name"].as_str().unwrap_or_default();
            assert!(!name.starts_with("console.url"), "listed: {listed}");
            let path = run.join(name);
            let r = server.request("files/read", json!({"path": path.to_str().unwrap()}));
            assert!(
                !r.to_string().contains(&s.console.token),
                "a server read the token: {r}"
            );
            seen += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    opener.join().unwrap();
    assert!(
        seen >= 300,
        "the folder's other file is listed each time ({seen})"
    );
}

/// Rule: a server's `files/consent` becomes a prompt on the console with each canonical path,
/// its root, its mode and whether it is a folder, the server's name and words, and the
/// session's number in the order the sessions connected (the first is 1, the next 2);
/// approving some gives the server exactly those; the session can then read there and
/// nowhere else.
#[test]
fn a_prompt_approved_in_part_grants_exactly_that() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let mut server = s.session();
    let id = ask(&mut server, &s.base, "I need your notes", &["a", "b"]);
    let prompt = one_prompt(&s.console);
    assert_eq!(
        prompt["server"],
        Value::Null,
        "a plain peer names no server: {prompt}"
    );
    assert_eq!(prompt["session"], s.console.state()["sessions"][0]["id"]);
    assert_eq!(prompt["sessionOrder"], 1, "{prompt}");
    assert_eq!(prompt["message"], "I need your notes");
    let docs = s.base.join("docs");
    assert_eq!(
        prompt["paths"],
        json!([
            {"path": docs.join("a").to_str().unwrap(), "root": "docs", "mode": "read-only", "kind": "folder"},
            {"path": docs.join("b").to_str().unwrap(), "root": "docs", "mode": "read-only", "kind": "folder"},
        ])
    );
    // A second session, asking for a file: numbered 2, its path a file.
    let mut second = s.session();
    let asked = ask(&mut second, &s.base, "one file", &["a/top.txt"]);
    let state = s.console.wait_state(WAIT, |st| {
        st["prompts"].as_array().is_some_and(|p| p.len() == 2)
    });
    assert_eq!(state["sessions"][0]["order"], 1, "{state}");
    assert_eq!(state["sessions"][1]["order"], 2, "{state}");
    let file = state["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["sessionOrder"] == 2)
        .unwrap_or_else(|| panic!("the second session's prompt: {state}"))
        .clone();
    assert_eq!(file["paths"][0]["kind"], "file", "{file}");
    let r = s.console.post(
        &format!("/api/prompts/{}", file["id"]),
        Some(r#"{"deny":true}"#),
    );
    assert_eq!(r.status, 204, "{r:?}");
    second.response(asked);
    assert!(prompt["expiresInMs"].as_u64().unwrap() > 0);
    let body = json!({"approvedPaths": [docs.join("a")]}).to_string();
    let r = s
        .console
        .post(&format!("/api/prompts/{}", prompt["id"]), Some(&body));
    assert_eq!(r.status, 204, "{r:?}");
    let answer = server.response(id);
    assert_eq!(
        answer["result"],
        json!({"granted": true, "approvedPaths": [docs.join("a").to_str().unwrap()]})
    );
    server.ok(
        "files/read",
        json!({"path": docs.join("a/top.txt").to_str().unwrap()}),
    );
    let e = server.err(
        "files/read",
        json!({"path": docs.join("b/other.txt").to_str().unwrap()}),
    );
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    let state = s.console.state();
    assert!(state["prompts"].as_array().unwrap().is_empty(), "{state}");
    let grants = &state["sessions"][0]["grants"];
    assert_eq!(grants.as_array().unwrap().len(), 1, "{state}");
    assert_eq!(grants[0]["path"], docs.join("a").to_str().unwrap());
    let again = s
        .console
        .post(&format!("/api/prompts/{}", prompt["id"]), Some(&body));
    assert_eq!(again.status, 404, "a prompt is answered once: {again:?}");
    let acts = audit_lines(&s.base);
    assert!(
        acts.iter().any(|l| l["event"] == "consent-answer"
            && l["account"] == "person"
            && l["granted"] == true),
        "{acts:?}"
    );
}

/// Rule: the person may narrow a path to a folder beneath it: the server gets the narrower
/// path and can use only it. An answer that names anything else (a sibling, a parent, a path
/// with `..`, a link inside the folder that leads out of it) grants nothing more.
#[test]
fn a_prompt_can_be_narrowed_never_widened() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let docs = s.base.join("docs");
    std::os::unix::fs::symlink("../b", docs.join("a/to-b")).unwrap();
    let mut server = s.session();
    let id = ask(&mut server, &s.base, "notes", &["a"]);
    let prompt = one_prompt(&s.console);
    let url = format!("/api/prompts/{}", prompt["id"]);
    for wider in [
        docs.to_str().unwrap().to_owned(),
        docs.join("b").to_str().unwrap().to_owned(),
        format!("{}/../b", docs.join("a").display()),
        format!("{}/./inner", docs.join("a").display()),
        "/etc".to_owned(),
        "a/inner".to_owned(),
    ] {
        let body = json!({"approvedPaths": [wider]}).to_string();
        let r = s.console.post(&url, Some(&body));
        assert_eq!(r.status, 400, "{wider}: {r:?}");
        assert!(
            r.json()["error"].as_str().unwrap().contains("not asked"),
            "{r:?}"
        );
    }
    let bad = s.console.post(&url, Some("{\"approvedPaths\": \"/x\"}"));
    assert_eq!(bad.status, 400, "{bad:?}");
    let both = s
        .console
        .post(&url, Some("{\"approvedPaths\": [], \"deny\": true}"));
    assert_eq!(both.status, 400, "{both:?}");
    // A link inside the folder asked about that leads out of it is placed where it leads,
    // and is not granted.
    let body = json!({"approvedPaths": [docs.join("a/inner"), docs.join("a/to-b")]}).to_string();
    let r = s.console.post(&url, Some(&body));
    assert_eq!(r.status, 204, "{r:?}");
    let answer = server.response(id);
    assert_eq!(
        answer["result"],
        json!({"granted": true, "approvedPaths": [docs.join("a/inner").to_str().unwrap()]}),
        "{answer}"
    );
    server.ok(
        "files/read",
        json!({"path": docs.join("a/inner/note.txt").to_str().unwrap()}),
    );
    for outside in ["a/top.txt", "b/other.txt", "a/to-b/other.txt"] {
        let e = server.err(
            "files/read",
            json!({"path": docs.join(outside).to_str().unwrap()}),
        );
        assert_eq!(code(&e), "PERMISSION_DENIED", "{outside}: {e}");
    }
}

/// Rule: a denied prompt grants nothing, and a prompt nobody answers is denied at the consent
/// timeout (fail closed) and leaves the console.
#[test]
fn denied_or_unanswered_prompts_grant_nothing() {
    let s = Setup::start(|b| prompt_policy(b, 1_500));
    let mut server = s.session();
    let id = ask(&mut server, &s.base, "please", &["a"]);
    let prompt = one_prompt(&s.console);
    let r = s.console.post(
        &format!("/api/prompts/{}", prompt["id"]),
        Some("{\"deny\":true}"),
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        server.response(id)["result"],
        json!({"granted": false, "approvedPaths": []})
    );

    let id = ask(&mut server, &s.base, "again", &["b"]);
    one_prompt(&s.console);
    let answer = server.response(id);
    assert_eq!(answer["result"]["granted"], false, "{answer}");
    s.console.wait_state(WAIT, |st| {
        st["prompts"].as_array().is_some_and(Vec::is_empty)
    });
    let e = server.err(
        "files/read",
        json!({"path": s.base.join("docs/b/other.txt").to_str().unwrap()}),
    );
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
}

/// Rule: revoking a grant on the console reaches the live session: `list_changed`, then
/// refusals beneath it; the act is in the audit log as the person's.
#[test]
fn revoking_a_grant_reaches_the_server() {
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let docs = s.base.join("docs");
    let mut server = s.session();
    let id = ask(&mut server, &s.base, "notes", &["a"]);
    let prompt = one_prompt(&s.console);
    let body = json!({"approvedPaths": [docs.join("a")]}).to_string();
    assert_eq!(
        s.console
            .post(&format!("/api/prompts/{}", prompt["id"]), Some(&body))
            .status,
        204
    );
    server.response(id);
    let note = docs.join("a/top.txt");
    server.ok("files/read", json!({"path": note.to_str().unwrap()}));
    // The grant's list_changed is set aside; the revocation's comes next.
    while server.pop_note().is_some() {}
    let grant = s.console.state()["sessions"][0]["grants"][0]["id"]
        .as_u64()
        .unwrap();
    let r = s.console.post(&format!("/api/grants/{grant}/revoke"), None);
    assert_eq!(r.status, 204, "{r:?}");
    let (_, note_msg) = server.next_notification(WAIT).expect("list_changed");
    assert_eq!(note_msg["method"], "notifications/roots/list_changed");
    let e = server.err("files/read", json!({"path": note.to_str().unwrap()}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    let again = s.console.post(&format!("/api/grants/{grant}/revoke"), None);
    assert_eq!(again.status, 404, "{again:?}");
    let acts = audit_lines(&s.base);
    let line = acts
        .iter()
        .find(|l| l["event"] == "revoke-grant")
        .unwrap_or_else(|| panic!("{acts:?}"));
    assert_eq!(line["account"], "person");
    assert_eq!(line["grant"], grant);
    assert_eq!(line["path"], docs.join("a").to_str().unwrap());
    let verified = std::process::Command::new(common::bin())
        .args(["audit", "verify"])
        .arg(s.base.join("audit.jsonl"))
        .output()
        .unwrap();
    // Still running, so its run has no seal yet (exit 3); the chain itself is intact.
    assert_eq!(verified.status.code(), Some(3), "{verified:?}");
}

/// Rule: ending a session on the console refuses its requests and closes its link; the
/// broker and its other sessions go on; the act is audited.
#[test]
fn ending_a_session_closes_it() {
    let s = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        std::fs::write(b.join("open/f.txt"), "f").unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
            .audit(&b.join("audit.jsonl"), "")
    });
    let mut ended = s.session();
    let mut other = s.session();
    ended.ok("files/read", json!({"path": "open/f.txt"}));
    let state = s.console.wait_state(WAIT, |st| {
        st["sessions"].as_array().is_some_and(|a| a.len() == 2)
    });
    // Oldest first: the first is the one to end.
    let sid = state["sessions"][0]["id"].as_u64().unwrap();
    let r = s.console.post(&format!("/api/sessions/{sid}/end"), None);
    assert_eq!(r.status, 204, "{r:?}");
    // The link closes; anything answered before that is a refusal.
    let mut closed = false;
    for _ in 0..50 {
        match ended.next(WAIT) {
            Got::Eof => {
                closed = true;
                break;
            }
            Got::Line(v) => assert!(
                v.get("result").is_none() || v.get("method").is_some(),
                "{v}"
            ),
            Got::Timeout => break,
        }
    }
    assert!(closed, "the ended session's link closed");
    other.ok("files/read", json!({"path": "open/f.txt"}));
    s.console.wait_state(WAIT, |st| {
        st["sessions"].as_array().is_some_and(|a| a.len() == 1)
    });
    let missing = s.console.post(&format!("/api/sessions/{sid}/end"), None);
    assert_eq!(missing.status, 404, "{missing:?}");
    let acts = audit_lines(&s.base);
    assert!(
        acts.iter().any(|l| l["event"] == "end-session"
            && l["session"] == sid
            && l["account"] == "person"),
        "{acts:?}"
    );
}

/// Rule: pausing a root withdraws it from every session at once (`list_changed`, `roots/list`
/// without it, refusals), keeps it withdrawn across a policy reload, and resuming gives it
/// back; an unknown root is 404; both acts are audited.
#[test]
fn a_paused_root_stays_paused_until_resumed() {
    let s = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        std::fs::write(b.join("open/f.txt"), "f").unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
            .audit(&b.join("audit.jsonl"), "")
    });
    let mut server = s.session();
    server.ok("files/read", json!({"path": "open/f.txt"}));
    assert_eq!(s.console.post("/api/roots/open/pause", None).status, 204);
    let (_, note) = server.next_notification(WAIT).expect("list_changed");
    assert_eq!(note["method"], "notifications/roots/list_changed");
    let roots = server.ok("roots/list", json!({}));
    assert_eq!(roots["roots"], json!([]), "{roots}");
    let e = server.err("files/read", json!({"path": "open/f.txt"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    // A reload of the policy file does not undo the person's pause.
    let policy = s.base.join("policy.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    std::fs::write(&policy, format!("# touched\n{text}")).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(s.listener.pid() as i32).unwrap(),
        rustix::process::Signal::HUP,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let e = server.err("files/read", json!({"path": "open/f.txt"}));
    assert_eq!(
        code(&e),
        "PERMISSION_DENIED",
        "still paused after a reload: {e}"
    );
    assert_eq!(s.console.state()["roots"][0]["paused"], true);

    assert_eq!(s.console.post("/api/roots/open/resume", None).status, 204);
    server.ok("files/read", json!({"path": "open/f.txt"}));
    assert_eq!(s.console.post("/api/roots/nope/pause", None).status, 404);
    let acts = audit_lines(&s.base);
    for act in ["pause-root", "resume-root"] {
        assert!(
            acts.iter()
                .any(|l| l["event"] == act && l["root"] == "open"),
            "{act}: {acts:?}"
        );
    }
}

/// Rule: answered requests reach `/api/events` as the audit log records them; successive
/// reads of one file by one session are merged (`count`, summed `bytes`); a refusal stands
/// alone; state changes are announced. The stream starts with a `retry` field.
#[test]
fn the_feed_shows_requests_and_merges_bulk_reads() {
    let s = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        std::fs::write(b.join("open/big.bin"), vec![7u8; 64 * 1024]).unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
    });
    let mut events = s.console.events();
    let mut server = s.session();
    let reads = 64;
    for i in 0..reads {
        server.ok(
            "files/read",
            json!({"path": "open/big.bin", "offset": i * 1024, "length": 1024, "encoding": "base64"}),
        );
    }
    let e = server.err("files/read", json!({"path": "/etc/passwd"}));
    assert_eq!(code(&e), "PERMISSION_DENIED");
    let got = events.collect("activity", WAIT, |got| {
        got.iter().any(|r| r["outcome"] == "PERMISSION_DENIED")
    });
    let merged: Vec<&Value> = got
        .iter()
        .filter(|r| r["method"] == "files/read" && r["path"] == "open/big.bin")
        .collect();
    let count: u64 = merged.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    let bytes: u64 = merged.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert_eq!(count, reads, "{got:?}");
    assert_eq!(bytes, reads * 1024, "{got:?}");
    // The stream opened with its `retry` field, before any event: a browser sees it open
    // without waiting for the first keep-alive.
    assert_eq!(events.retry, Some(2000));
    assert!(
        merged.len() < (reads / 4) as usize,
        "merged into a few records: {}",
        merged.len()
    );
    let refused = got
        .iter()
        .find(|r| r["outcome"] == "PERMISSION_DENIED")
        .unwrap();
    assert_eq!(refused["count"], 1);
    assert_eq!(refused["path"], "/etc/passwd");
    s.console.post("/api/roots/open/pause", None);
    let state = events.collect("state", WAIT, |g| !g.is_empty());
    assert!(!state.is_empty(), "a state event after the pause");
}

/// A server that answers nothing and never exits by itself.
const SLEEPER: &str = "import time\nwhile True: time.sleep(1)";

/// `fsbroker proxy --root DIR EXTRA… --console -- SLEEPER`, with the console's state once the
/// proxy's session says how it is connected.
fn own_proxy(extra: &[&str]) -> (tempfile::TempDir, Fsb, Console, Value) {
    let (dir, base) = common::tempdir();
    let root = base.join("r");
    std::fs::create_dir(&root).unwrap();
    let url_file = base.join("own.url");
    let mut args = vec!["proxy", "--root", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend([
        "--console",
        "--console-url-file",
        url_file.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        SLEEPER,
    ]);
    let proxy = Fsb::spawn(&args);
    let console = Console::from_url_file(&url_file);
    // The session exists a moment before its proxy says how it is connected.
    let state = console.wait_state(WAIT, |s| s["sessions"][0]["transport"] == "proxy");
    (dir, proxy, console, state)
}

/// Rule: ending a proxied session on the console ends its server, whether the proxy holds its
/// own broker (`proxy --console`) or links to a shared one (`proxy --connect`, the desktop
/// set-up): the host sees the server exit.
#[test]
fn ending_a_proxied_session_ends_its_server() {
    let (_dir, mut own, console, state) = own_proxy(&[]);
    let sid = state["sessions"][0]["id"].as_u64().unwrap();
    // Its broker is the proxy's own, and goes with it: the answer may not make it out.
    let r = console.post(&format!("/api/sessions/{sid}/end"), None);
    assert!(r.status == 204 || r.status == 0, "{r:?}");
    let status = own
        .wait_exit(WAIT)
        .expect("the proxy exits once its server is ended");
    assert!(
        !status.success(),
        "the server was ended by a signal: {status}"
    );

    let shared = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
    });
    let sock = shared.base.join("s.sock");
    let mut linked = Fsb::spawn(&[
        "proxy",
        "--connect",
        sock.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        SLEEPER,
    ]);
    let state = shared
        .console
        .wait_state(WAIT, |s| s["sessions"][0]["transport"] == "proxy");
    let sid = state["sessions"][0]["id"].as_u64().unwrap();
    assert_eq!(
        shared
            .console
            .post(&format!("/api/sessions/{sid}/end"), None)
            .status,
        204
    );
    let status = linked
        .wait_exit(WAIT)
        .expect("the linked proxy exits once its server is ended");
    assert!(!status.success(), "{status}");
    shared.console.wait_state(WAIT, |s| {
        s["sessions"].as_array().is_some_and(Vec::is_empty)
    });
}

/// Rule: with `[consent] provider = "auto"` (the default) and no command, an open console is
/// the one asked, before the terminal.
#[test]
fn an_open_console_is_asked_by_default() {
    let s = Setup::start(|b| {
        let policy = prompt_policy(b, 60_000);
        // The same policy without `provider`: its [consent] table says only terminal = false.
        let text = policy.text().replace("provider = \"console\"\n", "");
        PolicyToml::new().head(&text)
    });
    let mut server = s.session();
    let id = ask(&mut server, &s.base, "by default", &["b"]);
    let prompt = one_prompt(&s.console);
    assert_eq!(prompt["messageFrom"], "server", "{prompt}");
    assert_eq!(
        s.console
            .post(
                &format!("/api/prompts/{}", prompt["id"]),
                Some("{\"deny\":true}")
            )
            .status,
        204
    );
    assert_eq!(server.response(id)["result"]["granted"], false);
}

/// Rule: pausing a root a confined server was started with ends that server
/// (`[confine] on_revoke = "end"`, the default), as a reload that removed the root would.
#[test]
fn pausing_a_root_ends_a_confined_server_that_held_it() {
    let (_dir, mut proxy, console, state) = own_proxy(&["--confine"]);
    assert_eq!(
        state["sessions"][0]["confinement"], "best-effort",
        "{state}"
    );
    let r = console.post("/api/roots/r/pause", None);
    assert!(r.status == 204 || r.status == 0, "{r:?}");
    let status = proxy
        .wait_exit(WAIT)
        .expect("the confined server is ended, and its proxy with it");
    assert!(!status.success(), "{status}");
}

/// Rule: the default URL file (in the user's private runtime directory), another broker's
/// there, and the page `fsbroker console` hands the browser are the brokers' own files: a
/// server whose root covers that directory still cannot read them.
#[test]
fn the_default_url_file_is_protected_too() {
    let opener = fsbroker::console_opener_file().expect("the private runtime directory");
    let rundir = opener.parent().unwrap().to_owned();
    let (_dir, base) = common::tempdir();
    let policy = PolicyToml::new()
        .root(RootToml::at(rundir.parent().unwrap()).name("above"))
        .unlimited()
        .write_to(&base.join("policy.toml"));
    let pids = Pids::default();
    let listener = Listener::start(&policy, &base.join("s.sock"), &["--console"], &pids);
    let other = Listener::start(&policy, &base.join("t.sock"), &["--console"], &pids);
    let mut server = listener.connect();
    server.set_deadline(WAIT);
    let own = rundir.join(format!("console-{}.url", listener.pid()));
    let others = rundir.join(format!("console-{}.url", other.pid()));
    for file in [&own, &others] {
        assert!(file.exists(), "{} was not written", file.display());
    }
    for file in [&own, &others, &opener] {
        let e = server.err("files/read", json!({"path": file.to_str().unwrap()}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{}: {e}", file.display());
    }
}

/// `fsbroker ARGS` in the mount namespace of process `holder`; its exit code and stdout.
fn in_namespace(holder: u32, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new("nsenter")
        .args(["-t", &holder.to_string(), "-m", "--", common::bin()])
        .args(args)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .output()
        .expect("run nsenter");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Rule: several brokers' consoles run at once, each with its own URL file in the private
/// runtime directory: `fsbroker console` opens the only one, lists them when there are
/// several (process id, address, command line; never a ticket) and opens one by `--pid`; a
/// broker that exits takes only its own file with it, and a killed broker's file is not
/// offered, nor removed (from another process namespace a running broker looks gone) (it used to be one shared `console.url`: the second broker overwrote it and
/// removed it when it exited, and the first's console could no longer be opened). The
/// brokers run in a mount namespace whose runtime directory is a fresh tmpfs (as root), so
/// that no other test's console is counted.
#[test]
fn several_consoles_each_keep_their_url_file() {
    let rundir = fsbroker::console_opener_file()
        .expect("the private runtime directory")
        .parent()
        .unwrap()
        .to_owned();
    let holder = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount -t tmpfs -o mode=0700 tmpfs "$1" && echo ready && exec sleep 600"#)
        .arg("sh")
        .arg(&rundir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut holder = match holder {
        Ok(h) => Killed(h),
        Err(e) => return common::skipped(&format!("no unshare (util-linux): {e}")),
    };
    let mut ready = String::new();
    use std::io::BufRead;
    let _ = std::io::BufReader::new(holder.0.stdout.take().unwrap()).read_line(&mut ready);
    if ready.trim() != "ready" {
        let mut why = String::new();
        let _ = std::io::Read::read_to_string(&mut holder.0.stderr.take().unwrap(), &mut why);
        return common::skipped(&format!(
            "cannot mount a tmpfs in a mount namespace of our own (needs root): {}",
            why.trim()
        ));
    }
    let ns = holder.0.id();
    let (_dir, base) = common::tempdir();
    std::fs::create_dir(base.join("r")).unwrap();
    let policy = PolicyToml::new()
        .root(RootToml::at(&base.join("r")).name("r"))
        .unlimited()
        .write_to(&base.join("policy.toml"));
    let pids = Pids::default();
    // `nsenter` execs the broker: the process is the broker's, its id the one listed.
    let broker = |sock: &str| {
        let sock = base.join(sock);
        let fsb = common::fsb::Cmd::program(
            "nsenter",
            &[
                "-t",
                &ns.to_string(),
                "-m",
                "--",
                common::bin(),
                "serve",
                "--listen",
                sock.to_str().unwrap(),
                "--policy",
                policy.to_str().unwrap(),
                "--console",
            ],
        )
        .pids(&pids)
        .spawn();
        let end = std::time::Instant::now() + WAIT;
        while !sock.exists() {
            assert!(
                std::time::Instant::now() < end,
                "no socket at {}",
                sock.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        fsb
    };
    // Waits for `fsbroker console --print ARGS` to exit with `code`; its stdout.
    let console = |args: &[&str], want: i32| {
        let end = std::time::Instant::now() + WAIT;
        let mut all = vec!["console", "--print"];
        all.extend_from_slice(args);
        loop {
            let (code, out) = in_namespace(ns, &all);
            if code == Some(want) {
                return out;
            }
            assert!(
                std::time::Instant::now() < end,
                "`fsbroker console --print {args:?}` never exited {want}: {code:?} {out}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (code, _) = in_namespace(ns, &["console", "--print"]);
    assert_eq!(code, Some(1), "no console is running yet");

    let mut a = broker("a.sock");
    let only = console(&[], 0);
    assert!(only.starts_with("http://127.0.0.1:"), "{only}");
    let mut b = broker("b.sock");
    let listed = console(&[], 2);
    for pid in [a.pid(), b.pid()] {
        assert!(
            listed
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{pid} "))
                    && l.contains("127.0.0.1:")
                    && l.contains("serve --listen")),
            "broker {pid} is not listed: {listed}"
        );
    }
    assert!(listed.contains("--pid"), "{listed}");
    assert!(
        !listed.contains("ticket") && !listed.contains("token"),
        "{listed}"
    );
    let url_a = console(&["--pid", &a.pid().to_string()], 0);
    let url_b = console(&["--pid", &b.pid().to_string()], 0);
    let port = |u: &str| url::Url::parse(u.trim()).unwrap().port();
    assert_ne!(port(&url_a), port(&url_b), "{url_a} {url_b}");

    // B exits: A's console is still the one `fsbroker console` opens.
    b.signal(rustix::process::Signal::TERM);
    b.wait_exit(WAIT).expect("the broker exits on SIGTERM");
    let left = console(&[], 0);
    assert_eq!(port(&left), port(&url_a), "{left}");
    // A is killed, leaving its file: it is not offered.
    let pid_a = a.pid();
    a.kill_now();
    let stale = PathBuf::from(format!("/proc/{ns}/root"))
        .join(rundir.strip_prefix("/").unwrap())
        .join(format!("console-{pid_a}.url"));
    assert!(
        stale.exists(),
        "{} was removed by its broker",
        stale.display()
    );
    console(&[], 1);
}

/// A child process, killed however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Rule: the URL file and its temporary siblings are the broker's own files however their
/// folder is reached: a root that is a bind mount of that folder (another path, the same
/// folder) reads, lists and watches none of them. The broker runs in a mount namespace of its
/// own (`unshare -m`, as root), where the bind mount is made; elsewhere the test prints
/// `SKIPPED` with the reason.
#[test]
fn the_url_file_is_protected_through_a_bind_mount() {
    let (_dir, base) = common::tempdir();
    let real = base.join("real");
    let bound = base.join("bound");
    std::fs::create_dir(&real).unwrap();
    std::fs::create_dir(&bound).unwrap();
    std::fs::write(real.join("other.txt"), "readable").unwrap();
    let probe = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$2""#)
        .arg("sh")
        .arg(&real)
        .arg(&bound)
        .output();
    match probe {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            common::skipped(&format!(
                "cannot bind-mount in a mount namespace of our own (needs root): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            return;
        }
        Err(e) => {
            common::skipped(&format!("no unshare (util-linux): {e}"));
            return;
        }
    }
    let policy = PolicyToml::new()
        .root(RootToml::at(&real).name("real"))
        .root(RootToml::at(&bound).name("bound"))
        .unlimited()
        .write_to(&base.join("policy.toml"));
    let url_file = real.join("console.url");
    let sock = base.join("s.sock");
    /// The broker, killed however the test ends.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _broker = Killed(
        std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$2" && exec "$3" serve --listen "$4" --policy "$5" --console --console-url-file "$6""#)
        .arg("sh")
        .arg(&real)
        .arg(&bound)
        .arg(common::bin())
        .arg(&sock)
        .arg(&policy)
        .arg(&url_file)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the broker in a namespace of its own"),
    );
    let c = Console::from_url_file(&url_file);
    let end = std::time::Instant::now() + WAIT;
    while !sock.exists() {
        assert!(std::time::Instant::now() < end, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut server = common::Fsb::connect(&sock);
    // A temporary sibling as each rewrite makes one, for a moment.
    std::fs::write(
        real.join("console.url.00112233aabbccdd.tmp"),
        std::fs::read(&url_file).unwrap(),
    )
    .unwrap();
    for (through, name) in [
        ("real", "console.url"),
        ("bound", "console.url"),
        ("bound", "console.url.00112233aabbccdd.tmp"),
    ] {
        let e = server.err("files/read", json!({"path": format!("{through}/{name}")}));
        assert_eq!(code(&e), "PERMISSION_DENIED", "{through}/{name}: {e}");
    }
    let ok = server.ok("files/read", json!({"path": "bound/other.txt"}));
    assert_eq!(
        ok["content"], "readable",
        "the bind mount is a working root"
    );
    let listed = server.ok(
        "files/list",
        json!({"path": "bound", "includeHidden": true}),
    );
    let names: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(names, ["other.txt"], "{listed}");
    // The person opens the console again: the rewrite is not seen through the other path.
    c.open_page();
    let e = server.err("files/read", json!({"path": "bound/console.url"}));
    assert_eq!(code(&e), "PERMISSION_DENIED", "{e}");
    assert!(!e.to_string().contains(&c.token), "{e}");
}

/// Rule: a connection that proved itself (a request with the token) stays open while its
/// client keeps it, idle past the 10 s an unproven one gets, and through a flood of new
/// connections from another program (300, which evict one another, never it): its next
/// request is answered on it. So the page's requests need no fresh connection that a flood
/// could crowd out.
#[test]
fn a_proven_connection_outlasts_idleness_and_a_flood() {
    use std::io::{BufRead, BufReader, Read, Write};
    let s = Setup::start(|b| prompt_policy(b, 60_000));
    let c = &s.console;
    let mut conn = std::net::TcpStream::connect(&c.host).expect("connect");
    conn.set_read_timeout(Some(WAIT)).unwrap();
    let request = format!(
        "GET /api/state HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
        c.host, c.token
    );
    // One keep-alive answer: its head, then as many bytes as its Content-Length says.
    let answer = |conn: &mut std::net::TcpStream| -> String {
        conn.write_all(request.as_bytes()).unwrap();
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).unwrap();
        status
    };
    assert!(answer(&mut conn).contains(" 200 "));
    std::thread::sleep(Duration::from_secs(11));
    let flood: Vec<std::net::TcpStream> = (0..300)
        .filter_map(|_| std::net::TcpStream::connect(&c.host).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        answer(&mut conn).contains(" 200 "),
        "answered on the same connection"
    );
    drop(flood);
}

/// Docs that work as written: `serve --help` and `proxy --help` say where the console's
/// address and its URL go as they do (the URL and its ticket to the owner-only URL file only,
/// never to stderr, which hosts keep in their logs). Before, both said the URL "with the
/// run's token" went to stderr.
#[test]
fn the_help_says_where_the_consoles_url_goes() {
    for command in ["serve", "proxy"] {
        let out = std::process::Command::new(common::bin())
            .args([command, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(out.status.success(), "{command}: {help}");
        assert!(!help.contains("with the run's token"), "{command}: {help}");
        assert!(
            help.contains("only to the owner-only URL file"),
            "{command}: {help}"
        );
    }
}

/// `fsbroker proxy ARGS -- node server_files.mjs` (a real TypeScript SDK server whose `request`
/// tool sends any request to the client), as its host: the handshake done, then the tool
/// asked to send `files/consent` for `docs/a`, which waits for the person.
fn host_asking_consent(args: &[String], docs: &Path) -> Fsb {
    common::peers::require_npm();
    let mut all = args.to_vec();
    all.extend([
        "--".to_owned(),
        common::peers::node(),
        common::path_str(&common::peers::peers_dir().join("server_files.mjs")),
    ]);
    let mut host = common::fsb::Cmd::new(&all)
        .env("RUST_LOG", "fsbroker=info")
        .log(common::fsb::Log::Keep)
        .deadline(Duration::from_secs(60))
        .spawn();
    host.send_msg(&json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test-host", "version": "1"}}
    }));
    let init = host.answer(&json!(0), WAIT);
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    host.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    host.send_msg(&json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "request", "arguments": {"method": "files/consent", "params": {
            "message": "to read a", "requestedPaths": [common::path_str(&docs.join("a"))]}}}
    }));
    host
}

/// The host leaves (closes the proxy's stdin) while the person has not answered; the proxy
/// must end by itself, at once and with exit code 0.
fn host_leaves(host: &mut Fsb, console: &Console) {
    one_prompt(console);
    let left = std::time::Instant::now();
    host.close_stdin();
    let status = host
        .wait_exit(Duration::from_secs(30))
        .expect("the proxy ends once its host has left");
    let log = host.log_text();
    assert!(
        status.success() && left.elapsed() < Duration::from_secs(8),
        "the proxy ended with {status} {:?} after its host left (the server was not left to \
         end by itself: its question to the person went unanswered): {log}",
        left.elapsed()
    );
    assert!(!log.contains(" ERROR "), "{log}");
    assert!(
        log.contains("the host the server was working for has left"),
        "the withdrawal does not say why: {log}"
    );
}

/// Rule: when the host leaves while the person has a prompt of its server's in front of
/// them, the prompt is withdrawn (nobody would use the answer), the server gets its refusal
/// before its input closes, and so ends by itself: the proxy exits 0 at once, with its own
/// broker or linked to a shared one, and the shared broker's console no longer shows it.
/// (It used to exit 143 a minute later: the refusal came after the server's input closed,
/// and the server waited for it until it was ended.)
#[test]
fn a_host_leaving_during_a_prompt_ends_the_proxy_cleanly() {
    let (_dir, base) = common::tempdir();
    let policy = prompt_policy(&base, 60_000).write_to(&base.join("policy.toml"));
    let url_file = base.join("own.url");
    let mut own = host_asking_consent(
        &[
            "proxy".to_owned(),
            "--policy".to_owned(),
            common::path_str(&policy),
            "--console".to_owned(),
            "--console-url-file".to_owned(),
            common::path_str(&url_file),
        ],
        &base.join("docs"),
    );
    host_leaves(&mut own, &Console::from_url_file(&url_file));

    let shared = Setup::start(|b| prompt_policy(b, 60_000));
    let mut linked = host_asking_consent(
        &[
            "proxy".to_owned(),
            "--connect".to_owned(),
            common::path_str(&shared.base.join("s.sock")),
        ],
        &shared.base.join("docs"),
    );
    // The shared broker says why; the proxy's own log has only its side.
    one_prompt(&shared.console);
    let left = std::time::Instant::now();
    linked.close_stdin();
    let status = linked
        .wait_exit(Duration::from_secs(30))
        .expect("the linked proxy ends once its host has left");
    assert!(
        status.success() && left.elapsed() < Duration::from_secs(8),
        "the linked proxy ended with {status} {:?} after its host left: {}",
        left.elapsed(),
        linked.log_text()
    );
    shared.console.wait_state(WAIT, |s| {
        s["prompts"].as_array().is_some_and(Vec::is_empty)
            && s["sessions"].as_array().is_some_and(Vec::is_empty)
    });
}

/// Rule: a remote server's session (`proxy --url`) is shown as one (`transport: "remote"`),
/// with its own broker or linked to a shared one, so that the page does not tell the person
/// it runs on this computer with their rights: it can only ask the broker for files. (It was
/// shown as `proxy`, and its prompts warned of an unconfined local server.) No server needs
/// to answer: the session exists from the proxy's start.
#[test]
fn a_remote_servers_session_is_shown_as_remote() {
    let (_dir, base) = common::tempdir();
    let root = base.join("r");
    std::fs::create_dir(&root).unwrap();
    let url_file = base.join("own.url");
    // Nothing listens there: the host's first request would get the proxy's error.
    let url = "http://127.0.0.1:9/mcp";
    let mut own = Fsb::spawn(&[
        "proxy",
        "--root",
        root.to_str().unwrap(),
        "--console",
        "--console-url-file",
        url_file.to_str().unwrap(),
        "--url",
        url,
    ]);
    let console = Console::from_url_file(&url_file);
    console.wait_state(WAIT, |s| s["sessions"][0]["transport"] == "remote");
    own.close_stdin();
    assert!(own.wait_exit(WAIT).is_some_and(|s| s.success()));

    let shared = Setup::start(|b| {
        std::fs::create_dir(b.join("open")).unwrap();
        PolicyToml::new()
            .root(RootToml::at(&b.join("open")).name("open"))
            .unlimited()
    });
    let sock = shared.base.join("s.sock");
    let mut linked = Fsb::spawn(&["proxy", "--connect", sock.to_str().unwrap(), "--url", url]);
    shared
        .console
        .wait_state(WAIT, |s| s["sessions"][0]["transport"] == "remote");
    linked.close_stdin();
    assert!(linked.wait_exit(WAIT).is_some_and(|s| s.success()));
}

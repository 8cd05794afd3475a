//! `fsbroker proxy --url` signing in to a server that needs it (MCP authorization), against
//! the TypeScript SDK's own OAuth example (`simpleStreamableHttp.js --oauth`, and
//! `--oauth-strict`, which checks the token's `resource`) with its demo authorization server:
//! dynamic registration, PKCE, an authorize endpoint that approves at once. The browser is
//! `tests/peers/browser_follow.py` (`$BROWSER`), which follows the redirects as a person's
//! browser would once they approved, and logs each URL it was given.
//!
//! What is shown: the first sign-in; a second start signed in from the cache without the
//! browser; a clear sign-in again once the server restarted (its demo tokens were in
//! memory, and it issues no refresh token); the cache's permissions; `fsbroker auth
//! list/logout`; no token, code or secret on stderr at debug level, in the audit log, in the
//! console's API or in its URL file; and, with no browser and no console, one line on stderr
//! saying how to finish and an error for the host within a bounded time.

// Tests read their own files with `std::fs` (clippy.toml keeps it out of the library).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::console::Console;
use common::fsb::{Cmd, Log};
use common::peers::{peers_dir, require_npm};
use common::remote::{Host, RemoteServer};
use common::{path_str, tempdir};

/// Longer than the proxy's 45 s wait for a person, so that its own error arrives first.
const WAIT: Duration = Duration::from_secs(90);

/// The demo server, and its authorization server's issuer (`http://localhost:PORT/`).
struct Demo {
    server: RemoteServer,
    auth: String,
}

impl Demo {
    fn start(args: &[&str]) -> Demo {
        let server = RemoteServer::node("oauth_demo.mjs", args);
        let auth = server.line["auth"]
            .as_str()
            .expect("the peer names its authorization server")
            .to_owned();
        Demo { server, auth }
    }

    /// Both ports, to start it again where it was.
    fn ports(&self) -> (String, String) {
        (port_of(&self.server.url), port_of(&self.auth))
    }
}

fn port_of(url: &str) -> String {
    url::Url::parse(url).unwrap().port().unwrap().to_string()
}

/// A person's private state (the token cache), the browser's log, a root, an audit log.
struct Desk {
    _dir: tempfile::TempDir,
    base: PathBuf,
}

impl Desk {
    fn new() -> Desk {
        let (dir, base) = tempdir();
        std::fs::create_dir_all(base.join("root")).unwrap();
        std::fs::write(base.join("root/notes.txt"), "hello").unwrap();
        std::fs::create_dir_all(base.join("state")).unwrap();
        Desk { _dir: dir, base }
    }

    fn state(&self) -> PathBuf {
        self.base.join("state")
    }

    fn cache(&self) -> PathBuf {
        self.state().join("fsbroker/sign-in")
    }

    fn browser_log(&self) -> PathBuf {
        self.base.join("browser.jsonl")
    }

    /// The URLs the browser was given, and how each ended.
    fn browser_calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.browser_log())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn audit(&self) -> PathBuf {
        self.base.join("audit.log")
    }

    /// `fsbroker proxy --url URL`, signing in through the test's browser, at debug level,
    /// with its audit log and a console.
    fn proxy(&self, url: &str, browser: bool) -> Host {
        let mut cmd = Cmd::new(&[
            "proxy",
            "--root",
            &path_str(&self.base.join("root")),
            "--audit",
            &path_str(&self.audit()),
            "--console",
            "127.0.0.1:0",
            "--console-url-file",
            &path_str(&self.base.join("console.url")),
            "--url",
            url,
        ])
        .env("XDG_STATE_HOME", self.state())
        .env("BROWSER_LOG", self.browser_log())
        .env("RUST_LOG", "fsbroker=debug")
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY");
        cmd = if browser {
            cmd.env("BROWSER", peers_dir().join("browser_follow.py"))
        } else {
            cmd.env_remove("BROWSER")
        };
        Host::new(cmd.log(Log::Keep).record().deadline(WAIT).spawn(), None)
    }

    /// The one kept sign-in: its file and what it holds.
    fn kept(&self) -> (PathBuf, Value) {
        let files: Vec<PathBuf> = std::fs::read_dir(self.cache())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "one sign-in kept: {files:?}");
        let grant = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
        (files[0].clone(), grant)
    }

    fn console(&self) -> Console {
        Console::from_url_file(&self.base.join("console.url"))
    }
}

/// `fsbroker auth ARGS` with the desk's state directory: its exit status and stdout.
fn auth(desk: &Desk, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(common::bin())
        .arg("auth")
        .args(args)
        .env("XDG_STATE_HOME", desk.state())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The host's round with the demo server: the handshake, and its `greet` tool.
fn round(host: &mut Host) {
    host.initialize();
    let r = host.request(
        "tools/call",
        json!({"name": "greet", "arguments": {"name": "fsbroker"}}),
    );
    assert!(
        r.to_string().contains("Hello, fsbroker"),
        "the tool did not answer: {r}"
    );
}

/// Every secret of the sign-in: the access token (and refresh token, if any), the codes the
/// browser carried back, the client secret if one was issued.
fn secrets(desk: &Desk) -> Vec<String> {
    let (_, grant) = desk.kept();
    let mut out: Vec<String> = ["access_token", "refresh_token", "client_secret"]
        .iter()
        .filter_map(|k| grant[k].as_str().map(str::to_owned))
        .collect();
    for call in desk.browser_calls() {
        if let Some(ended) = call["ended"].as_str() {
            let url = url::Url::parse(ended).unwrap();
            out.extend(
                url.query_pairs()
                    .filter(|(k, _)| k == "code")
                    .map(|(_, v)| v.into_owned()),
            );
        }
    }
    assert!(!out.is_empty());
    out
}

fn assert_nowhere(secrets: &[String], places: &[(&str, String)]) {
    for secret in secrets {
        for (place, text) in places {
            assert!(
                !text.contains(secret.as_str()),
                "a secret ({}…) is in {place}:\n{text}",
                &secret[..4]
            );
        }
    }
}

fn sign_in_then_cached_then_again(strict: bool) {
    require_npm();
    let args: &[&str] = if strict {
        &["--oauth", "--oauth-strict"]
    } else {
        &["--oauth"]
    };
    let demo = Demo::start(args);
    let desk = Desk::new();
    let url = demo.server.url.clone();

    // The first start: the browser is opened once, the sign-in completes, the host's
    // requests are answered.
    let mut host = desk.proxy(&url, true);
    round(&mut host);
    let console = desk.console();
    let state = console.wait_state(Duration::from_secs(10), |s| {
        s["signIns"][0]["state"] == "signed-in"
    });
    let card = &state["signIns"][0];
    assert_eq!(card["server"], url.as_str(), "{card}");
    assert_eq!(card["issuer"], demo.auth.as_str(), "{card}");
    assert_eq!(card["scopes"], json!(["mcp:tools"]), "{card}");
    let url_file = std::fs::read_to_string(desk.base.join("console.url")).unwrap();
    let page = console.get("/api/state").body;
    let log = host.finish();
    let calls = desk.browser_calls();
    assert_eq!(calls.len(), 1, "the browser was opened once: {calls:?}");
    let opened = url::Url::parse(calls[0]["opened"].as_str().unwrap()).unwrap();
    let query: std::collections::HashMap<String, String> =
        opened.query_pairs().into_owned().collect();
    assert_eq!(
        opened.origin().ascii_serialization() + "/",
        demo.auth,
        "{opened}"
    );
    assert_eq!(query["code_challenge_method"], "S256", "{opened}");
    assert_eq!(query["resource"], url, "{opened}");
    assert!(
        query["redirect_uri"].starts_with("http://127.0.0.1:"),
        "{opened}"
    );
    assert_eq!(calls[0]["status"], 200, "the redirect was taken: {calls:?}");

    // The cache: an owner-only folder holding an owner-only file.
    let (file, grant) = desk.kept();
    assert_eq!(
        std::fs::metadata(desk.cache())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(grant["server"], url.as_str());
    assert_eq!(grant["issuer"], demo.auth.as_str());

    // No secret anywhere the person or another program reads.
    let audit = std::fs::read_to_string(desk.audit()).unwrap();
    let first = secrets(&desk);
    assert_nowhere(
        &first,
        &[
            ("stderr", log.clone()),
            ("the audit log", audit.clone()),
            ("the console's /api/state", page),
            ("the console's URL file", url_file),
        ],
    );
    let signed: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["event"] == "sign-in")
        .collect();
    assert_eq!(signed.len(), 1, "{audit}");
    assert_eq!(signed[0]["signIn"]["outcome"], "signed-in");
    assert_eq!(signed[0]["signIn"]["issuer"], demo.auth.as_str());
    assert_eq!(signed[0]["signIn"]["server"], url.as_str());
    assert_eq!(signed[0]["signIn"]["scopes"], json!(["mcp:tools"]));
    assert!(
        log.contains("signed-in") && log.contains("sign-in opened in the browser"),
        "{log}"
    );

    // A second start signs in silently, from the cache.
    let mut host = desk.proxy(&url, true);
    round(&mut host);
    let log = host.finish();
    assert_eq!(
        desk.browser_calls().len(),
        1,
        "the browser was opened again"
    );
    assert!(log.contains("using the sign-in kept from before"), "{log}");
    assert_nowhere(&first, &[("stderr", log)]);

    // The server restarts (its tokens and clients were in memory): the kept token is
    // refused, there is no refresh token, so the person signs in again, once.
    let (mcp, auth_port) = demo.ports();
    drop(demo.server);
    let mut restarted = args.to_vec();
    restarted.extend(["--ports", &mcp, &auth_port]);
    let demo = Demo::start(&restarted);
    assert_eq!(demo.server.url, url);
    let mut host = desk.proxy(&url, true);
    round(&mut host);
    let log = host.finish();
    assert_eq!(
        desk.browser_calls().len(),
        2,
        "the person was asked to sign in again, once"
    );
    let (_, again) = desk.kept();
    assert_ne!(again["access_token"], grant["access_token"]);
    assert_nowhere(&secrets(&desk), &[("stderr", log)]);

    // `fsbroker auth`: listed without a token, then forgotten.
    let (ok, listed, _) = auth(&desk, &["list"]);
    assert!(
        ok && listed.contains(&url) && listed.contains(&demo.auth),
        "{listed}"
    );
    assert_nowhere(&secrets(&desk), &[("auth list", listed)]);
    let (ok, out, err) = auth(&desk, &["logout", &url]);
    assert!(ok && out.contains("forgot the sign-in to"), "{out}{err}");
    let (ok, listed, _) = auth(&desk, &["list"]);
    assert!(ok && listed.contains("no sign-ins kept"), "{listed}");
    let (ok, _, err) = auth(&desk, &["logout", &url]);
    assert!(!ok && err.contains("no sign-in kept"), "{err}");
}

#[test]
fn signs_in_keeps_the_token_and_signs_in_again_after_a_restart() {
    sign_in_then_cached_then_again(false);
}

#[test]
fn with_oauth_strict_the_token_is_for_this_server() {
    sign_in_then_cached_then_again(true);
}

/// No browser to open and no console: one line on stderr says how to finish, and the host's
/// request gets an error within the proxy's bounded wait, never silence. The sign-in stays
/// open: following the line's URL signs in, and the host's next request is answered.
#[test]
fn without_a_browser_one_line_says_how_and_the_host_hears_why() {
    require_npm();
    let demo = Demo::start(&["--oauth"]);
    let desk = Desk::new();
    let mut cmd = Cmd::new(&[
        "proxy",
        "--root",
        &path_str(&desk.base.join("root")),
        "--url",
        &demo.server.url,
    ])
    .env("XDG_STATE_HOME", desk.state())
    .env("RUST_LOG", "fsbroker=debug")
    .env_remove("BROWSER")
    .env_remove("DISPLAY")
    .env_remove("WAYLAND_DISPLAY");
    cmd = cmd.log(Log::Keep).record().deadline(WAIT);
    let mut host = Host::new(cmd.spawn(), None);
    let asked = Instant::now();
    let r = host.raw("initialize", Host::init_params());
    let waited = asked.elapsed();
    let message = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("requires authorization (HTTP 401")
            && message.contains("waiting for you to sign in at http://localhost:"),
        "{r}"
    );
    assert!(waited < Duration::from_secs(60), "{waited:?}");
    let log = host.fsb.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("in a browser on this machine"))
        .collect();
    assert_eq!(lines.len(), 1, "one line says how to finish:\n{log}");
    let at = lines[0].find("open http").expect("the URL") + "open ".len();
    let link = lines[0][at..].split(' ').next().unwrap().to_owned();
    // The person opens it (here, the test's browser); the host's next request is answered.
    let status = std::process::Command::new(peers_dir().join("browser_follow.py"))
        .arg(&link)
        .env("BROWSER_LOG", desk.browser_log())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        desk.browser_calls()[0]["status"],
        200,
        "{:?}",
        desk.browser_calls()
    );
    host.initialize();
    let log = host.finish();
    assert!(log.contains("signed-in"), "{log}");
    assert_nowhere(&secrets(&desk), &[("stderr", log)]);
}

/// The section "A remote server that needs sign-in" of docs/hosts.md.
fn documented_section() -> String {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/hosts.md")).unwrap();
    let at = doc
        .find("### A remote server that needs sign-in")
        .expect("docs/hosts.md has the section");
    let rest = &doc[at..];
    let end = rest[4..].find("\n### ").map_or(rest.len(), |e| e + 4);
    rest[..end].to_owned()
}

/// The section's code block that starts with `first`.
fn block(section: &str, first: &str) -> String {
    section
        .split("```")
        .skip(1)
        .step_by(2)
        .map(|b| b.split_once('\n').map_or("", |(_, body)| body))
        .find(|b| b.trim_start().starts_with(first))
        .unwrap_or_else(|| panic!("no block starting {first:?} in the section"))
        .to_owned()
}

/// The documented entries, run as written (their example paths and URL made this machine's):
/// Claude Desktop's as a host runs it, and Claude Code's added with `claude mcp add-json`,
/// then `claude mcp list` connected through a sign-in in the browser, and a second time from
/// the kept sign-in, without it.
#[test]
fn the_documented_entries_sign_in_claude_code_included() {
    require_npm();
    let claude = peers_dir().join("node_modules/.bin/claude");
    let runs = std::process::Command::new(&claude)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        runs,
        "{} --version fails: npm ci --prefix tests/peers",
        claude.display()
    );
    let demo = Demo::start(&["--oauth"]);
    let desk = Desk::new();
    let policy = desk.base.join("policy.toml");
    std::fs::write(
        &policy,
        format!("[[root]]\npath = {:?}\n", path_str(&desk.base.join("root"))),
    )
    .unwrap();
    let ours = |text: &str| {
        text.replace("/home/ana/.cargo/bin/fsbroker", common::bin())
            .replace("/Users/ana/.cargo/bin/fsbroker", common::bin())
            .replace("/home/ana/.config/fsbroker/policy.toml", &path_str(&policy))
            .replace(
                "/Users/ana/.config/fsbroker/policy.toml",
                &path_str(&policy),
            )
            .replace("https://mcp.example.com/mcp", &demo.server.url)
    };
    let section = documented_section();

    // Claude Desktop's entry, run as the host runs it.
    let desktop: Value = serde_json::from_str(&ours(&block(&section, "{"))).unwrap();
    let entry = &desktop["mcpServers"]["acme"];
    let args: Vec<String> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let cmd = Cmd::program(entry["command"].as_str().unwrap(), &args)
        .env("XDG_STATE_HOME", desk.state())
        .env("BROWSER", peers_dir().join("browser_follow.py"))
        .env("BROWSER_LOG", desk.browser_log())
        .log(Log::Keep)
        .record()
        .deadline(WAIT);
    let mut host = Host::new(cmd.spawn(), None);
    round(&mut host);
    host.finish();
    assert_eq!(desk.browser_calls().len(), 1);
    let (ok, out, err) = auth(&desk, &["logout", &demo.server.url]);
    assert!(ok, "{out}{err}");

    // Claude Code's, added as written, then listed: it connects through the sign-in.
    let home = desk.base.join("home");
    let project = desk.base.join("project");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&project).unwrap();
    let node_dir = common::peers::on_path(&common::peers::node())
        .and_then(|p| p.parent().map(PathBuf::from))
        .expect("node on PATH");
    let path = format!(
        "{}:{}:/usr/local/bin:/usr/bin:/bin",
        claude.parent().unwrap().display(),
        node_dir.display()
    );
    let run = |script: &str| {
        let mut cmd = std::process::Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(&project)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", &home)
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("XDG_STATE_HOME", desk.state())
            .env("BROWSER", peers_dir().join("browser_follow.py"))
            .env("BROWSER_LOG", desk.browser_log());
        let out = common::registry::output_within(&mut cmd, Duration::from_secs(120));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "`{script}` failed:\n{text}");
        text
    };
    run(&ours(&block(&section, "claude mcp add-json acme")));
    let listed = run("claude mcp list");
    let connected = |text: &str| {
        text.lines()
            .any(|l| l.starts_with("acme: ") && l.ends_with("\u{2714} Connected"))
    };
    assert!(connected(&listed), "{listed}");
    assert_eq!(desk.browser_calls().len(), 2, "signed in once more");
    let listed = run("claude mcp list");
    assert!(connected(&listed), "{listed}");
    assert_eq!(
        desk.browser_calls().len(),
        2,
        "the second start was signed in already"
    );
}

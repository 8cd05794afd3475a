//! `fsbroker proxy --url` signing in (MCP authorization, OAuth 2.1) to a hostile server, or
//! merely one that tests each rule of the sign-in: `tests/peers/oauth_peer.py` plays the MCP
//! server and its authorization server, in the mode each test names, plus a third listener no
//! token, code or verifier may ever reach, and logs every request it reads (method, path,
//! query, headers with `Authorization`, form body); `tests/peers/browser_follow.py`, given as
//! `$BROWSER`, signs in at once by following the authorization server's redirects back to the
//! proxy's loopback listener, logging what it opened. The real binary is the proxy, the test
//! its host; each test has its own state directory (`XDG_STATE_HOME`, where tokens are kept)
//! and audit log, and runs the proxy at `RUST_LOG=fsbroker=trace`.
//!
//! Each refusal is shown twice, as the person would meet it (the host's JSON-RPC error and
//! stderr say why), and each test shows from the peer's log that the dangerous thing did not
//! happen. Failing when written, each fixed in `src/transport/proxy/remote/auth/` with a
//! comment naming its test:
//! - `hostile_strings_reach_stderr_only_as_text`: an issuer with CR, LF, ESC and BEL inside
//!   and after the URL passed the issuer check (a URL parser drops them) and reached stderr and
//!   the host's error raw; a token response's `scope` with them reached stderr raw (at info).
//! - `a_refresh_failing_for_a_while_keeps_the_sign_in`: any error answer to a refresh
//!   (a 503 `temporarily_unavailable`) forgot the sign-in and sent the person to the browser.
//! - `an_expiry_past_the_end_of_time_is_no_crash`: `expires_in` of 2^64 - 1 overflowed (the
//!   sign-in's task panicked; the person was told nobody signed in), and a time past what
//!   `SystemTime` holds panicked `fsbroker auth list`.

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the library's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::fsb::Fsb;
use common::http::{error_message, initialize, proxy};
use common::peers::peers_dir;
use common::remote::{RemoteServer, TestCa, test_ca};
use common::{bin, path_str, python, tempdir};

/// How long stderr may lag behind the host's answer.
const LOG_LAG: Duration = Duration::from_secs(10);

/// How long the proxy has a request wait for a refresh and a sign-in in all (`SIGN_IN_WAIT`
/// in src/limits.rs; docs/protocol.md).
const SIGN_IN_WAIT: Duration = Duration::from_secs(45);

/// `tests/peers/oauth_peer.py` in one mode, and its request log.
struct Peer {
    server: RemoteServer,
    log: PathBuf,
    /// The MCP endpoint, `http://127.0.0.1:RS/mcp`.
    url: String,
    /// The authorization server, `http://127.0.0.1:AS` (its issuer).
    issuer: String,
    /// The listener that is no part of the sign-in, `http://127.0.0.1:OT`.
    other: String,
}

impl Peer {
    fn start(mode: &str, dir: &Path) -> Peer {
        Peer::start_with(mode, dir, &[])
    }

    /// The peer in `mode` serving https with the certificate of `ca` on all three listeners.
    fn start_tls(mode: &str, dir: &Path, ca: &TestCa) -> Peer {
        let (cert, key) = (path_str(&ca.cert), path_str(&ca.key));
        Peer::start_with(mode, dir, &["--tls", &cert, &key])
    }

    fn start_with(mode: &str, dir: &Path, more: &[&str]) -> Peer {
        let log = dir.join(format!("peer-{mode}.jsonl"));
        let script = path_str(&peers_dir().join("oauth_peer.py"));
        let log_arg = path_str(&log);
        let mut args = vec![script.as_str(), "--mode", mode, "--log", &log_arg];
        args.extend_from_slice(more);
        let server = RemoteServer::start(Path::new(python()), &args);
        let text = |k: &str| {
            server.line[k]
                .as_str()
                .unwrap_or_else(|| panic!("the peer did not print {k}: {}", server.line))
                .to_owned()
        };
        let (issuer, other) = (text("as"), text("other"));
        Peer {
            url: server.url.clone(),
            issuer,
            other,
            log,
            server,
        }
    }

    /// Every line of its log so far.
    fn entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    /// The requests `listener` ("rs", "as", "other") read.
    fn requests(&self, listener: &str) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["event"] == "request" && e["listener"] == listener)
            .collect()
    }

    /// The form bodies POSTed to the authorization server's token endpoint.
    fn token_forms(&self) -> Vec<Value> {
        self.requests("as")
            .into_iter()
            .filter(|e| e["path"] == "/token")
            .map(|e| e["form"].clone())
            .collect()
    }

    /// The queries of the authorization requests.
    fn authorizations(&self) -> Vec<Value> {
        self.requests("as")
            .into_iter()
            .filter(|e| e["path"] == "/authorize")
            .map(|e| e["query"].clone())
            .collect()
    }

    /// The tokens it issued: `{grant, access_token, refresh_token, scope}`.
    fn issued(&self) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["event"] == "issued")
            .collect()
    }

    /// The callbacks its authorization server sent the proxy's listener itself.
    fn callbacks(&self) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e["event"] == "callback")
            .collect()
    }

    /// The bearer tokens the MCP endpoint received, in order (`None`: a request without).
    fn bearers(&self) -> Vec<Option<String>> {
        self.requests("rs")
            .into_iter()
            .filter(|e| e["path"] == "/mcp")
            .map(|e| {
                e["headers"]["authorization"]
                    .as_str()
                    .map(|a| a.strip_prefix("Bearer ").unwrap_or(a).to_owned())
            })
            .collect()
    }

    /// Fails unless the listener that is no part of the sign-in read nothing at all.
    fn other_saw_nothing(&self) {
        let seen = self.requests("other");
        assert!(
            seen.is_empty(),
            "the other listener ({}) was reached: {seen:#?}",
            self.other
        );
    }

    /// The peer's stderr, for a failure message.
    fn stderr(&self) -> String {
        self.server.log()
    }
}

/// The person at the machine: a state directory, a browser that signs in at once, an audit log.
struct Person {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    state: PathBuf,
    browser_log: PathBuf,
}

impl Person {
    fn new() -> Person {
        let (t, dir) = tempdir();
        let state = dir.join("state");
        std::fs::create_dir(&state).expect("mkdir state");
        Person {
            browser_log: dir.join("browser.jsonl"),
            state,
            dir,
            _dir: t,
        }
    }

    /// `$BROWSER`: the script, with its log and the cache to snapshot, the URL appended by
    /// the proxy.
    fn browser(&self) -> String {
        let command = format!(
            "{} {} --log {} --kept {}",
            python(),
            path_str(&peers_dir().join("browser_follow.py")),
            path_str(&self.browser_log),
            path_str(&self.cache())
        );
        assert!(
            !command.contains(':') && !command.contains('%'),
            "$BROWSER splits on ':' and replaces %s: {command}"
        );
        command
    }

    /// The audit log of the run named `run`.
    fn audit(&self, run: &str) -> PathBuf {
        self.dir.join(format!("audit-{run}.jsonl"))
    }

    /// `fsbroker proxy --root R --url URL --audit AUDIT`, the run named `run`, at trace level.
    fn proxy(&self, url: &str, run: &str) -> (tempfile::TempDir, Fsb) {
        self.proxy_with(url, run, &[], &[])
    }

    /// [`Person::proxy`] with more arguments and environment.
    fn proxy_with(
        &self,
        url: &str,
        run: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> (tempfile::TempDir, Fsb) {
        let browser = self.browser();
        let state = path_str(&self.state);
        let audit = path_str(&self.audit(run));
        let mut all = vec!["--audit", &audit];
        all.extend_from_slice(args);
        let mut environment = vec![
            ("BROWSER", browser.as_str()),
            ("XDG_STATE_HOME", state.as_str()),
            ("RUST_LOG", "fsbroker=trace"),
        ];
        environment.extend_from_slice(env);
        proxy(url, &all, &environment)
    }

    /// What the browser was asked to open, in order.
    fn opened(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.browser_log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    /// Waits (a bounded time) until the browser has finished `n` openings: it logs once the
    /// proxy's listener has answered it.
    fn wait_opened(&self, n: usize) -> Vec<Value> {
        let end = Instant::now() + LOG_LAG;
        loop {
            let opened = self.opened();
            if opened.len() >= n || Instant::now() > end {
                return opened;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sign-in cache's folder.
    fn cache(&self) -> PathBuf {
        self.state.join("fsbroker").join("sign-in")
    }

    /// The cache's files and their text.
    fn kept(&self) -> Vec<(PathBuf, String)> {
        let Ok(entries) = std::fs::read_dir(self.cache()) else {
            return Vec::new();
        };
        entries
            .map(|e| {
                let path = e.expect("entry").path();
                let text = std::fs::read_to_string(&path).expect("read a kept sign-in");
                (path, text)
            })
            .collect()
    }

    /// The sign-in lines of the audit log of `run`.
    fn sign_ins(&self, run: &str) -> Vec<Value> {
        let end = Instant::now() + LOG_LAG;
        loop {
            let text = std::fs::read_to_string(self.audit(run)).unwrap_or_default();
            let lines: Vec<Value> = text
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).expect("an audit line is JSON"))
                .filter(|l| l["event"] == "sign-in")
                .collect();
            if !lines.is_empty() || Instant::now() > end {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `fsbroker auth ARGS` with this person's state directory: exit success, stdout, stderr.
    fn auth(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(bin())
            .arg("auth")
            .args(args)
            .env("XDG_STATE_HOME", &self.state)
            .stdin(Stdio::null())
            .output()
            .expect("run fsbroker auth");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Waits (a bounded time) until the proxy's stderr holds every one of `needles`; its text.
fn log_holding(fsb: &Fsb, needles: &[&str]) -> String {
    let end = Instant::now() + LOG_LAG;
    loop {
        let log = fsb.log_text();
        if needles.iter().all(|n| log.contains(n)) {
            return log;
        }
        assert!(
            Instant::now() < end,
            "stderr does not say {needles:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the proxy logs (at info) each time it opens the browser.
const OPENED: &str = "sign-in opened in the browser";

/// The proxy whose stderr is `log` opened the browser `n` times, and the browser script has
/// finished `total` sign-ins in all (this person's runs so far).
fn browser_opened(person: &Person, log: &str, n: usize, total: usize) {
    assert_eq!(log.matches(OPENED).count(), n, "stderr:\n{log}");
    let opened = person.wait_opened(total);
    assert_eq!(opened.len(), total, "{opened:#?}");
}

/// The host's `initialize` must fail: its message holds every one of `needles`, and so does
/// stderr. Returns the message.
fn refused(fsb: &mut Fsb, needles: &[&str]) -> String {
    let r = initialize(fsb);
    let message = error_message(&r);
    assert!(
        message.contains("signing in did not give a token"),
        "not a sign-in failure: {r}"
    );
    for n in needles {
        assert!(
            message.contains(n),
            "the host's error does not say {n:?}: {message}"
        );
    }
    log_holding(fsb, needles);
    message
}

/// Closes the host's side: the proxy must exit 0 by itself. Its stderr.
fn finish(mut fsb: Fsb) -> String {
    let (status, _) = fsb.end();
    assert!(fsb.log_closed_within(LOG_LAG), "stderr still open");
    let log = fsb.log_text();
    assert!(status.success(), "the proxy exited with {status}:\n{log}");
    log
}

/// `tools/list` must succeed.
fn tools_list(fsb: &mut Fsb, peer: &Peer) {
    let r = fsb.request("tools/list", json!({}));
    assert_eq!(
        r["result"]["tools"],
        json!([]),
        "tools/list failed: {r}\npeer:\n{}",
        peer.stderr()
    );
}

/// `initialize` must succeed (signing in first when asked).
fn signed_in(fsb: &mut Fsb, peer: &Peer) {
    let r = initialize(fsb);
    assert_eq!(
        r["result"]["serverInfo"]["name"],
        "oauth-peer",
        "initialize failed: {r}\nstderr:\n{}\npeer:\n{}",
        fsb.log_text(),
        peer.stderr()
    );
}

/// Every secret the sign-in handled, as the peer's log shows them: access and refresh tokens,
/// codes and PKCE verifiers.
fn secrets(peer: &Peer) -> Vec<String> {
    let mut out = Vec::new();
    for i in peer.issued() {
        for k in ["access_token", "refresh_token"] {
            out.extend(i[k].as_str().map(str::to_owned));
        }
    }
    for f in peer.token_forms() {
        for k in ["code", "code_verifier", "refresh_token"] {
            out.extend(f[k].as_str().map(str::to_owned));
        }
    }
    for c in peer.callbacks() {
        out.extend(c["params"]["code"].as_str().map(str::to_owned));
    }
    assert!(!out.is_empty(), "the peer issued nothing");
    out
}

// -------------------------------------------------------------------------------------------
// 1. A token for this server goes to this server alone
// -------------------------------------------------------------------------------------------

/// (a) Protected resource metadata naming another origin as the resource: refused before
/// anything is asked of the authorization server; no browser, no token, nothing kept.
#[test]
fn a_resource_of_another_origin_is_refused_before_any_token_is_asked() {
    let person = Person::new();
    let peer = Peer::start("resource-other", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "a");
    let resource = format!("{}/mcp", peer.other);
    let message = refused(
        &mut fsb,
        &[
            &format!("names the resource {resource}"),
            &format!("which is not this server ({})", peer.url),
            "RFC 9728",
        ],
    );
    assert!(message.contains("HTTP 401"), "{message}");
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    let asked = peer.requests("as");
    assert!(
        asked.is_empty(),
        "the authorization server was asked: {asked:#?}"
    );
    peer.other_saw_nothing();
    assert!(person.kept().is_empty(), "something was kept");
}

/// (b) Signed in, the MCP endpoint answers 307 to another loopback origin: the proxy does not
/// follow it (the host is told why), and the other listener never sees a request, let alone
/// the token.
#[test]
fn a_redirect_of_the_mcp_endpoint_is_not_followed_with_the_token() {
    let person = Person::new();
    let peer = Peer::start("redirect-mcp", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "b");
    let r = initialize(&mut fsb);
    let message = error_message(&r);
    for n in ["HTTP 307", "redirects are not followed"] {
        assert!(message.contains(n), "{n:?} not in {message}");
    }
    log_holding(&fsb, &["HTTP 307"]);
    tools_list_fails(&mut fsb);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    // It did sign in, and the token was sent, to the MCP endpoint alone.
    let issued = peer.issued();
    assert_eq!(issued.len(), 1, "{issued:#?}");
    let token = issued[0]["access_token"].as_str().unwrap().to_owned();
    assert!(
        peer.bearers().contains(&Some(token.clone())),
        "the token never reached the MCP endpoint: {:?}",
        peer.bearers()
    );
    peer.other_saw_nothing();
}

/// A second request after a redirect is refused the same way (the proxy stays up).
fn tools_list_fails(fsb: &mut Fsb) {
    let r = fsb.request("tools/list", json!({}));
    assert!(r.get("error").is_some(), "{r}");
}

/// (c) An ordinary sign-in: the token travels in the `Authorization` header of requests to
/// the MCP endpoint and nowhere else, never to the authorization server, nor to a metadata
/// URL of either; the refresh token goes to the token endpoint alone; the authorization
/// request is PKCE S256 with a `state` and the `resource`, the redirect a loopback one.
#[test]
fn the_token_goes_to_the_mcp_endpoint_alone() {
    let person = Person::new();
    let peer = Peer::start("ok", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "c");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);

    let issued = peer.issued();
    assert_eq!(issued.len(), 1, "one sign-in, one token: {issued:#?}");
    let access = issued[0]["access_token"].as_str().unwrap();
    let refresh = issued[0]["refresh_token"].as_str().unwrap();
    let mut to_mcp = 0;
    for e in peer.entries().iter().filter(|e| e["event"] == "request") {
        let text = e.to_string();
        let at_mcp = e["listener"] == "rs" && e["path"] == "/mcp";
        if let Some(a) = e["headers"]["authorization"].as_str() {
            assert!(
                at_mcp,
                "an Authorization header outside the MCP endpoint: {e}"
            );
            assert_eq!(a, format!("Bearer {access}"), "{e}");
            to_mcp += 1;
        }
        if !at_mcp {
            assert!(
                !text.contains(access),
                "the token left the MCP endpoint: {e}"
            );
        }
        let at_token = e["listener"] == "as" && e["path"] == "/token";
        if !at_token {
            assert!(
                !text.contains(refresh),
                "the refresh token left the token endpoint: {e}"
            );
        }
    }
    assert!(to_mcp >= 2, "initialize and tools/list carried the token");

    let auth = peer.authorizations();
    assert_eq!(auth.len(), 1, "{auth:#?}");
    let a = &auth[0];
    assert_eq!(a["response_type"], "code", "{a}");
    assert_eq!(a["code_challenge_method"], "S256", "{a}");
    assert!(
        a["code_challenge"].as_str().is_some_and(|c| c.len() >= 43),
        "{a}"
    );
    assert!(a["state"].as_str().is_some_and(|s| s.len() >= 16), "{a}");
    assert_eq!(a["resource"], peer.url, "{a}");
    assert_eq!(a["scope"], "mcp", "{a}");
    let redirect = a["redirect_uri"].as_str().unwrap();
    assert!(
        redirect.starts_with("http://127.0.0.1:") && redirect.ends_with("/callback"),
        "{redirect}"
    );
    let forms = peer.token_forms();
    assert_eq!(forms.len(), 1, "{forms:#?}");
    let f = &forms[0];
    assert_eq!(f["grant_type"], "authorization_code", "{f}");
    assert_eq!(f["resource"], peer.url, "{f}");
    assert_eq!(f["redirect_uri"], redirect, "{f}");
    assert!(
        f["code_verifier"].as_str().is_some_and(|v| v.len() >= 43),
        "{f}"
    );
    let opened = person.opened();
    assert!(
        opened[0]["opened"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/authorize?", peer.issuer)),
        "{opened:#?}"
    );
    assert_eq!(
        opened[0]["status"], 200,
        "the listener took the code: {opened:#?}"
    );
    peer.other_saw_nothing();
}

/// A server that echoes the token it was sent (and the refresh token) in its refusal: the
/// host's error and stderr show the refusal with both redacted.
#[test]
fn a_server_echoing_the_token_sees_it_redacted() {
    let person = Person::new();
    let peer = Peer::start("echo-token", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "x");
    signed_in(&mut fsb, &peer);
    let r = fsb.request("tools/list", json!({}));
    let message = error_message(&r);
    assert!(
        message.contains("HTTP 400") && message.contains("you sent Bearer [redacted]"),
        "{message}"
    );
    let log = finish(fsb);
    for secret in secrets(&peer) {
        assert!(
            !message.contains(&secret),
            "the host's error holds {secret}: {message}"
        );
        assert!(!log.contains(&secret), "stderr holds {secret}:\n{log}");
    }
}

/// An authorization server that echoes what it was sent in its refusals: the refresh token
/// when it refuses a refresh, the code and the PKCE verifier when it refuses a code. The
/// refusals are said (the host's error, stderr, the audit log's `refresh-failed` and `failed`
/// lines) with every one of them redacted.
#[test]
fn secrets_an_authorization_server_echoes_are_redacted_everywhere() {
    let person = Person::new();
    let peer = Peer::start("echo-secrets", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "echo");
    signed_in(&mut fsb, &peer);
    // The token is due (5 s, inside the refresh margin): this request starts the refresh,
    // which is refused for good and forgets the sign-in. It runs on its own task, so the
    // request goes with the token still held, or, if the refusal came first, with none (and
    // meets the refused sign-in below itself).
    let first = fsb.request("tools/list", json!({}));
    log_holding(&fsb, &["could not be refreshed", "[redacted] was revoked"]);
    // No token now: the server's 401 leads to a sign-in whose code is refused.
    let r = if first.get("error").is_some() {
        first
    } else {
        fsb.request("tools/list", json!({}))
    };
    let message = error_message(&r);
    assert!(
        message.contains("refused to issue a token")
            && message.contains("code [redacted] with verifier [redacted]"),
        "{message}"
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 2, 2);
    let forms = peer.token_forms();
    assert!(
        forms.iter().any(|f| f["grant_type"] == "refresh_token"),
        "no refresh was asked: {forms:#?}"
    );
    assert_eq!(
        forms
            .iter()
            .filter(|f| f["grant_type"] == "authorization_code")
            .count(),
        2,
        "{forms:#?}"
    );
    let audit: Vec<String> = person
        .sign_ins("echo")
        .iter()
        .map(Value::to_string)
        .collect();
    for outcome in ["refresh-failed", "failed"] {
        assert!(
            audit
                .iter()
                .any(|l| l.contains(&format!("\"outcome\":\"{outcome}\""))
                    && l.contains("[redacted]")),
            "no {outcome} line with its reason: {audit:#?}"
        );
    }
    for secret in secrets(&peer) {
        assert!(
            !message.contains(&secret),
            "the host's error holds {secret}: {message}"
        );
        assert!(!log.contains(&secret), "stderr holds {secret}:\n{log}");
        for line in &audit {
            assert!(
                !line.contains(&secret),
                "the audit log holds {secret}: {line}"
            );
        }
    }
}

/// A local process floods the sign-in's loopback listener with idle connections (40, more
/// than the 32 it serves at once), opening a new one each time the listener closes one: the
/// person's redirect still lands (the oldest connection that sent nothing makes room for
/// it), and the sign-in succeeds.
#[test]
fn a_flood_of_idle_connections_does_not_keep_the_person_out() {
    let person = Person::new();
    let peer = Peer::start("ok", &person.dir);
    let (_root, mut fsb) = person.proxy_with(&peer.url, "flood", &[], &[("BROWSER_FLOOD", "40")]);
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    let opened = person.wait_opened(1);
    assert_eq!(opened[0]["status"], 200, "{opened:#?}");
    assert!(
        opened[0]["reopened"].as_u64().is_some_and(|n| n > 0),
        "the listener never closed an idle connection (was it full?): {opened:#?}"
    );
}

/// One deadline per request: a token due for a refresh that stalls (25 s, then refused) and
/// that the server refuses, then a sign-in the person never finishes. The host's request is
/// answered with the sign-in's error [`SIGN_IN_WAIT`] after it was sent (within 5 s), not
/// after the refresh's wait plus a whole wait of the sign-in's own (55 s before this rule).
#[test]
fn a_stalled_refresh_and_a_sign_in_share_one_deadline() {
    let person = Person::new();
    let peer = Peer::start("refresh-stall", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "stall");
    signed_in(&mut fsb, &peer);
    let sent = Instant::now();
    let r = fsb.request("tools/list", json!({}));
    let took = sent.elapsed();
    let message = error_message(&r);
    assert!(message.contains("waiting for you to sign in"), "{message}");
    assert!(
        took < SIGN_IN_WAIT + Duration::from_secs(5),
        "answered after {took:?}: {message}"
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 2, 2);
    let forms = peer.token_forms();
    assert!(
        forms.iter().any(|f| f["grant_type"] == "refresh_token"),
        "no refresh was asked: {forms:#?}"
    );
}

// -------------------------------------------------------------------------------------------
// 2. The issuer is the URL the metadata was found for
// -------------------------------------------------------------------------------------------

/// Metadata stating another issuer (the other listener, whose endpoints a client would then
/// take for this one's): refused, the error naming both; nothing registered, no browser.
#[test]
fn an_issuer_that_is_not_the_url_it_was_found_for_is_refused() {
    let person = Person::new();
    let peer = Peer::start("issuer-mismatch", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "i");
    refused(
        &mut fsb,
        &[
            &format!("states the issuer {}", peer.other),
            &format!("not {}/", peer.issuer),
            "RFC 8414",
        ],
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    let asked: Vec<Value> = peer
        .requests("as")
        .into_iter()
        .filter(|e| e["path"] != "/.well-known/oauth-authorization-server")
        .collect();
    assert!(
        asked.is_empty(),
        "more than its metadata was asked: {asked:#?}"
    );
    peer.other_saw_nothing();
}

// -------------------------------------------------------------------------------------------
// 3. Plain http only on loopback
// -------------------------------------------------------------------------------------------

/// An authorization server on plain http to a host that is not loopback
/// (`http://as.example.invalid/`, which no resolver knows: refused before any connection,
/// so the error is the rule's, not "cannot reach"); and a token endpoint so, on an otherwise
/// good authorization server: refused before registering or opening a browser.
#[test]
fn plain_http_off_loopback_is_refused_before_connecting() {
    let person = Person::new();
    let peer = Peer::start("as-plain", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "p1");
    let message = refused(
        &mut fsb,
        &[
            "http://as.example.invalid/",
            "must use https (plain http is allowed on loopback only)",
        ],
    );
    assert!(!message.contains("cannot reach"), "{message}");
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    assert!(peer.requests("as").is_empty(), "the loopback AS was asked");

    let peer = Peer::start("token-plain", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "p2");
    let message = refused(
        &mut fsb,
        &[
            "its token_endpoint",
            "http://as.example.invalid/token",
            "must use https",
        ],
    );
    assert!(!message.contains("cannot reach"), "{message}");
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    let asked: Vec<Value> = peer
        .requests("as")
        .into_iter()
        .filter(|e| e["path"] != "/.well-known/oauth-authorization-server")
        .collect();
    assert!(asked.is_empty(), "the AS was used: {asked:#?}");
    peer.other_saw_nothing();
}

// -------------------------------------------------------------------------------------------
// 4. No redirect at the token endpoint
// -------------------------------------------------------------------------------------------

/// The token endpoint answers 307 to another listener: the exchange is refused with an error
/// naming the redirect, and the other listener never sees the code or the verifier (nor
/// anything else).
#[test]
fn a_redirected_token_endpoint_gets_no_code() {
    let person = Person::new();
    let peer = Peer::start("token-redirect", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "r");
    refused(
        &mut fsb,
        &[
            &format!("{}/token answered HTTP 307 (a redirect)", peer.issuer),
            "redirects are not followed when signing in",
            "refused to issue a token",
        ],
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    let forms = peer.token_forms();
    assert_eq!(forms.len(), 1, "one exchange, not repeated: {forms:#?}");
    assert!(forms[0]["code"].is_string(), "{forms:#?}");
    peer.other_saw_nothing();
    assert!(person.kept().is_empty(), "something was kept");
}

// -------------------------------------------------------------------------------------------
// 5. One code per sign-in, for its state alone
// -------------------------------------------------------------------------------------------

/// The authorization server sends the proxy's listener, besides the browser's redirect, a
/// callback with a wrong state and one with none (both with codes it would honour), and,
/// while the first code is being exchanged, a second code with the right state: each gets a
/// 400 and changes nothing; only the browser's code is exchanged; once the sign-in is over,
/// the listener is gone.
#[test]
fn a_second_code_for_the_same_state_is_refused() {
    let person = Person::new();
    let peer = Peer::start("double-code", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "d");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);

    let callbacks = peer.callbacks();
    let status = |what: &str| {
        callbacks
            .iter()
            .find(|c| c["what"] == what)
            .unwrap_or_else(|| panic!("no {what} callback: {callbacks:#?}"))["status"]
            .clone()
    };
    assert_eq!(status("wrong-state"), 400, "{callbacks:#?}");
    assert_eq!(status("no-state"), 400, "{callbacks:#?}");
    assert_eq!(status("second-code"), 400, "{callbacks:#?}");

    let opened = person.wait_opened(1);
    assert_eq!(opened.len(), 1, "{opened:#?}");
    let back = opened[0]["seen"][1].as_str().expect("the redirect back");
    let code = url_param(back, "code");
    let forms = peer.token_forms();
    let codes: Vec<&str> = forms.iter().filter_map(|f| f["code"].as_str()).collect();
    assert_eq!(
        codes,
        [code.as_str()],
        "only the browser's code is exchanged"
    );

    // The sign-in is over: its listener answers no one (or, were the port taken again by
    // then, not with a sign-in).
    let redirect = peer.authorizations()[0]["redirect_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = callbacks
        .iter()
        .find(|c| c["what"] == "second-code")
        .unwrap();
    let late = late_callback(&redirect, &second["params"]);
    assert!(
        late.is_none_or(|s| s != 200),
        "a late code was taken: {late:?}"
    );
    finish(fsb);
    assert_eq!(peer.token_forms().len(), 1);
}

/// `name`'s value in `url`'s query.
fn url_param(url: &str, name: &str) -> String {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or_default();
    query
        .split('&')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {url}"))
        .to_owned()
}

/// A GET of `redirect?code=…&state=…`: the status, or `None` when nothing listens.
fn late_callback(redirect: &str, params: &Value) -> Option<u16> {
    use std::io::{Read, Write};
    let rest = redirect.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let mut s = std::net::TcpStream::connect(authority).ok()?;
    s.set_read_timeout(Some(LOG_LAG)).unwrap();
    let query = format!(
        "code={}&state={}",
        params["code"].as_str().unwrap(),
        params["state"].as_str().unwrap()
    );
    write!(
        s,
        "GET /{path}?{query} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.split(' ').nth(1)?.parse().ok()
}

// -------------------------------------------------------------------------------------------
// 6. Refresh, a refused refresh, step-up
// -------------------------------------------------------------------------------------------

/// A token that expires within the proxy's margin (5 s, with a refresh token): the next
/// request starts a refresh (on its own task: the token it holds is still valid, and goes
/// with it), at the token endpoint it came from, with the `resource`; once it is refreshed,
/// a request carries the new token; no browser is opened the second time.
#[test]
fn a_token_near_its_expiry_is_refreshed_first() {
    let person = Person::new();
    let peer = Peer::start("refresh", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "f");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    log_holding(&fsb, &["refreshed"]);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);

    let issued = peer.issued();
    let first = &issued[0];
    assert_eq!(first["grant"], "authorization_code", "{issued:#?}");
    let refreshes: Vec<Value> = peer
        .token_forms()
        .into_iter()
        .filter(|f| f["grant_type"] == "refresh_token")
        .collect();
    assert!(!refreshes.is_empty(), "no refresh:\n{log}");
    assert_eq!(
        refreshes[0]["refresh_token"], first["refresh_token"],
        "{refreshes:#?}"
    );
    for f in &refreshes {
        assert_eq!(
            f["resource"], peer.url,
            "a refresh without the resource: {f}"
        );
    }
    // The last request carried a token a refresh issued (the server here honours every token
    // it issued until it ends: only a refresh before sending explains a new one).
    let refreshed: Vec<&str> = issued
        .iter()
        .filter(|i| i["grant"] == "refresh_token")
        .filter_map(|i| i["access_token"].as_str())
        .collect();
    let bearers = peer.bearers();
    let last = bearers.last().cloned().flatten().expect("a token");
    assert!(
        refreshed.contains(&last.as_str()),
        "the last request did not carry a refreshed token: {bearers:?}"
    );
    browser_opened(&person, &log, 1, 1);
    assert!(
        !bearers.iter().skip(1).any(Option::is_none),
        "a request after the sign-in went without a token: {bearers:?}"
    );
    // To the token endpoint the token came from, though the metadata names another since.
    peer.other_saw_nothing();
}

/// A refresh refused (`invalid_grant`): the refresh token is forgotten (neither sent again nor
/// kept), the proxy says so and signs in again: the browser is opened a second time, and the
/// request that met it succeeds.
#[test]
fn a_refused_refresh_signs_in_again_and_forgets_the_refresh_token() {
    let person = Person::new();
    let peer = Peer::start("refresh-invalid", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "v");
    signed_in(&mut fsb, &peer);
    let first = peer.issued()[0]["refresh_token"]
        .as_str()
        .unwrap()
        .to_owned();
    tools_list(&mut fsb, &peer);
    log_holding(&fsb, &["could not be refreshed", "invalid_grant"]);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 2, 2);
    let opened = person.opened();
    // When the browser opened the first time nothing was kept yet; the second time (after
    // the refused refresh) the refused sign-in was no longer kept either.
    for (i, o) in opened.iter().enumerate() {
        assert_eq!(o["kept"], json!({}), "opening {i}: {o:#}");
    }
    let refreshes: Vec<Value> = peer
        .token_forms()
        .into_iter()
        .filter(|f| f["grant_type"] == "refresh_token")
        .collect();
    assert_eq!(
        refreshes.len(),
        1,
        "refused once, never sent again: {refreshes:#?}"
    );
    assert_eq!(refreshes[0]["refresh_token"], first.as_str());
    let second = peer.issued()[1]["refresh_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept = person.kept();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].1.contains(&second), "the new sign-in is kept");
    assert!(!kept[0].1.contains(&first), "{kept:?}");
    let outcomes: Vec<Value> = person
        .sign_ins("v")
        .iter()
        .map(|l| l["signIn"]["outcome"].clone())
        .collect();
    assert_eq!(
        outcomes,
        json!(["signed-in", "refresh-failed", "signed-in"])
            .as_array()
            .unwrap()
            .clone(),
        "the audit log"
    );
}

/// A refresh that fails for a while (503 `temporarily_unavailable`) is not a refresh token
/// refused for good: the sign-in is kept (in memory and in the cache), the token still held is
/// sent, and the person is not sent to the browser again.
#[test]
fn a_refresh_failing_for_a_while_keeps_the_sign_in() {
    let person = Person::new();
    let peer = Peer::start("refresh-unavailable", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "u");
    signed_in(&mut fsb, &peer);
    let issued = peer.issued();
    let access = issued[0]["access_token"].as_str().unwrap().to_owned();
    let refresh = issued[0]["refresh_token"].as_str().unwrap().to_owned();
    tools_list(&mut fsb, &peer);
    log_holding(&fsb, &["could not be refreshed", "temporarily_unavailable"]);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    let refreshes: Vec<Value> = peer
        .token_forms()
        .into_iter()
        .filter(|f| f["grant_type"] == "refresh_token")
        .collect();
    assert!(!refreshes.is_empty(), "no refresh was tried");
    for f in &refreshes {
        assert_eq!(f["refresh_token"], refresh.as_str(), "{f}");
    }
    let bearers = peer.bearers();
    assert_eq!(
        bearers.last().cloned().flatten(),
        Some(access),
        "the token held was sent: {bearers:?}"
    );
    let kept = person.kept();
    assert_eq!(kept.len(), 1, "the sign-in is still kept: {kept:?}");
    assert!(kept[0].1.contains(&refresh), "{kept:?}");
}

/// A token response whose `expires_in` is 2^64 - 1: a token that does not expire in any
/// time that matters. The sign-in holds, requests carry it, and `auth list` still lists it.
#[test]
fn an_expiry_past_the_end_of_time_is_no_crash() {
    let person = Person::new();
    let peer = Peer::start("hostile-expiry", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "e");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    assert!(!log.contains("panicked"), "{log}");
    let refreshed = peer
        .token_forms()
        .iter()
        .any(|f| f["grant_type"] == "refresh_token");
    assert!(!refreshed, "a token that does not expire was refreshed");
    let (ok, list, err) = person.auth(&["list"]);
    assert!(ok, "auth list failed: {err}");
    assert!(list.contains(&peer.url), "{list}");
    let (_root, mut fsb) = person.proxy(&peer.url, "e2");
    signed_in(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 1);
}

/// A 403 `insufficient_scope` with `scope="a b"` to a token for `a`: a new sign-in asking for
/// both, then the request goes through.
#[test]
fn insufficient_scope_signs_in_again_for_both_scopes() {
    let person = Person::new();
    let peer = Peer::start("step-up", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "s");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 2, 2);
    let scopes: Vec<Value> = peer
        .authorizations()
        .iter()
        .map(|a| a["scope"].clone())
        .collect();
    assert_eq!(
        scopes,
        [json!("a"), json!("a b")],
        "the second asks for both"
    );
    for a in peer.authorizations() {
        assert_eq!(a["resource"], peer.url, "{a}");
    }
    let bearers = peer.bearers();
    let both = peer.issued()[1]["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(bearers.last().cloned().flatten(), Some(both), "{bearers:?}");
    let outcomes: Vec<Value> = person
        .sign_ins("s")
        .iter()
        .map(|l| l["signIn"]["scopes"].clone())
        .collect();
    assert_eq!(outcomes, [json!(["a"]), json!(["a", "b"])], "the audit log");
}

// -------------------------------------------------------------------------------------------
// 7. The cache
// -------------------------------------------------------------------------------------------

/// Tokens are kept owner-only (file 0600, folder 0700), appear in no log at trace level and
/// in no audit line (which records server, issuer, scopes and outcome); `fsbroker auth list`
/// shows the server and issuer but no token; a later start uses the kept token without a
/// browser; `fsbroker auth logout URL` forgets it, and the next start opens the browser again.
#[test]
fn the_cache_is_private_and_tokens_appear_nowhere() {
    let person = Person::new();
    let peer = Peer::start("ok", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "1");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log1 = finish(fsb);
    // At trace level (the sign-in logs nothing below debug: debug lines show the level).
    assert!(log1.contains(" DEBUG "), "not at trace level:\n{log1}");
    browser_opened(&person, &log1, 1, 1);

    let cache = person.cache();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700, "{}", cache.display());
    let kept = person.kept();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(mode(&kept[0].0), 0o600, "{}", kept[0].0.display());
    let name = kept[0]
        .0
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("token-") && name.ends_with(".json"),
        "{name}"
    );
    let access = peer.issued()[0]["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(kept[0].1.contains(&access), "the token is what is kept");

    let audit1 = std::fs::read_to_string(person.audit("1")).unwrap_or_default();
    let lines = person.sign_ins("1");
    assert_eq!(lines.len(), 1, "{audit1}");
    let s = &lines[0]["signIn"];
    assert_eq!(s["server"], peer.url, "{s}");
    // The issuer as a URL reads it (the proxy keeps it parsed): with its path's slash.
    assert_eq!(s["issuer"], format!("{}/", peer.issuer), "{s}");
    assert_eq!(s["scopes"], json!(["mcp"]), "{s}");
    assert_eq!(s["outcome"], "signed-in", "{s}");

    let (ok, list, err) = person.auth(&["list"]);
    assert!(ok, "auth list failed: {err}");
    assert!(list.contains(&peer.url), "{list}");
    assert!(list.contains(&peer.issuer), "{list}");

    // A later start: the kept token, first time, no browser.
    let before = peer.bearers().len();
    let (_root, mut fsb) = person.proxy(&peer.url, "2");
    signed_in(&mut fsb, &peer);
    let log2 = finish(fsb);
    browser_opened(&person, &log2, 0, 1);
    let later = peer.bearers().split_off(before);
    assert!(!later.is_empty());
    assert!(
        later.iter().all(|b| b.as_deref() == Some(access.as_str())),
        "every request of a later start, the first too, carries the kept token: {later:?}"
    );
    assert_eq!(person.sign_ins("2")[0]["signIn"]["outcome"], "cached");
    let audit2 = std::fs::read_to_string(person.audit("2")).unwrap_or_default();

    // No secret anywhere it may be read: stderr, the audit logs, `auth list`.
    let held = secrets(&peer);
    for (what, text) in [
        ("stderr of the sign-in", &log1),
        ("stderr of the later start", &log2),
        ("the audit log", &audit1),
        ("the later audit log", &audit2),
        ("auth list", &list),
    ] {
        for secret in &held {
            assert!(
                !text.contains(secret.as_str()),
                "{what} holds {secret}:\n{text}"
            );
        }
    }

    let (ok, out, err) = person.auth(&["logout", &peer.url]);
    assert!(ok, "auth logout failed: {err}");
    // Its revocation endpoint is plain http: not used (RFC 7009 §2), and said so.
    assert!(
        out.contains(&format!("forgot the sign-in to {}", peer.url))
            && out.contains("offers no revocation endpoint"),
        "{out}"
    );
    assert!(person.kept().is_empty(), "{:?}", person.kept());
    let (ok, list, _) = person.auth(&["list"]);
    assert!(ok && list.contains("no sign-ins kept"), "{list}");
    let (ok, _, err) = person.auth(&["logout", &peer.url]);
    assert!(!ok && err.contains("no sign-in kept"), "{err}");

    let (_root, mut fsb) = person.proxy(&peer.url, "3");
    signed_in(&mut fsb, &peer);
    let log3 = finish(fsb);
    browser_opened(&person, &log3, 1, 2);
    assert_eq!(peer.issued().len(), 2, "signed in again after logout");
    let audit3 = std::fs::read_to_string(person.audit("3")).unwrap_or_default();
    for secret in secrets(&peer) {
        assert!(!log3.contains(&secret), "stderr holds {secret}:\n{log3}");
        assert!(
            !audit3.contains(&secret),
            "the audit log holds {secret}:\n{audit3}"
        );
    }
}

// -------------------------------------------------------------------------------------------
// Signing out (RFC 7009)
// -------------------------------------------------------------------------------------------

/// `fsbroker auth logout URL` against an authorization server on https (a private CA,
/// `--ca-cert`): the refresh token, then the access token, are revoked at its revocation
/// endpoint, as the client that got them; the sign-in is forgotten and the next start signs in
/// again. Nothing printed holds a secret.
#[test]
fn logout_revokes_the_tokens_at_the_authorization_server() {
    let (_ca_dir, ca_path) = tempdir();
    let Some(ca) = test_ca(&ca_path) else {
        return;
    };
    let ca_cert = path_str(&ca.ca_cert);
    let person = Person::new();
    let peer = Peer::start_tls("ok", &person.dir, &ca);
    assert!(peer.url.starts_with("https://"), "{}", peer.url);
    let trust = [("SSL_CERT_FILE", ca_cert.as_str())];
    let (_root, mut fsb) = person.proxy_with(&peer.url, "rv", &["--ca-cert", &ca_cert], &trust);
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    finish(fsb);
    let issued = peer.issued();
    assert_eq!(issued.len(), 1, "{issued:#?}");
    let access = issued[0]["access_token"].as_str().unwrap();
    let refresh = issued[0]["refresh_token"].as_str().unwrap();

    let (ok, out, err) = person.auth(&["logout", &peer.url, "--ca-cert", &ca_cert]);
    assert!(ok, "auth logout failed: {out}{err}");
    assert!(
        out.contains(&format!(
            "signed out of {}: {}/ revoked its tokens",
            peer.url, peer.issuer
        )),
        "{out}"
    );
    assert!(
        err.contains("to revoke the sign-in to"),
        "no progress said: {err}"
    );
    let revoked: Vec<Value> = peer
        .entries()
        .into_iter()
        .filter(|e| e["event"] == "revoked")
        .collect();
    assert_eq!(
        revoked,
        vec![
            json!({"event": "revoked", "token": refresh, "hint": "refresh_token"}),
            json!({"event": "revoked", "token": access, "hint": "access_token"}),
        ],
        "the refresh token first, then the access token"
    );
    let client = peer.authorizations()[0]["client_id"].clone();
    for r in peer
        .requests("as")
        .iter()
        .filter(|e| e["path"] == "/revoke")
    {
        assert_eq!(
            r["form"]["client_id"], client,
            "as the client that got them: {r}"
        );
    }
    assert!(person.kept().is_empty(), "{:?}", person.kept());
    for secret in secrets(&peer) {
        assert!(!out.contains(&secret) && !err.contains(&secret), "{secret}");
    }
    peer.other_saw_nothing();
}

/// An authorization server that refuses the revocation (and echoes the token): `auth logout`
/// exits 1 saying so, the token redacted, and the sign-in is forgotten here all the same. One
/// whose metadata names a revocation endpoint on another origin: it is never used (the tokens
/// and the client would go to a server they were not issued by), and logout says the tokens
/// were not revoked.
#[test]
fn a_refused_or_foreign_revocation_is_said_and_the_sign_in_still_forgotten() {
    let (_ca_dir, ca_path) = tempdir();
    let Some(ca) = test_ca(&ca_path) else {
        return;
    };
    let ca_cert = path_str(&ca.ca_cert);
    let trust = [("SSL_CERT_FILE", ca_cert.as_str())];
    for mode in ["revoke-refused", "revoke-other"] {
        let person = Person::new();
        let peer = Peer::start_tls(mode, &person.dir, &ca);
        let (_root, mut fsb) = person.proxy_with(&peer.url, mode, &["--ca-cert", &ca_cert], &trust);
        signed_in(&mut fsb, &peer);
        let log = finish(fsb);
        let (ok, out, err) = person.auth(&["logout", &peer.url, "--ca-cert", &ca_cert]);
        if mode == "revoke-refused" {
            assert!(!ok, "{mode}: logout succeeded: {out}");
            assert!(
                err.contains("did not revoke the sign-in")
                    && err.contains("cannot revoke [redacted] now")
                    && err.contains("forgotten here all the same"),
                "{mode}: {err}"
            );
        } else {
            assert!(ok, "{mode}: {out}{err}");
            assert!(
                out.contains("offers no revocation endpoint"),
                "{mode}: {out}"
            );
            assert!(
                log.contains("revocation endpoint is not used"),
                "{mode}: the sign-in did not say it: {log}"
            );
            peer.other_saw_nothing();
        }
        assert!(person.kept().is_empty(), "{mode}: {:?}", person.kept());
        for secret in secrets(&peer) {
            assert!(
                !out.contains(&secret) && !err.contains(&secret),
                "{mode}: {secret}"
            );
        }
    }
}

// -------------------------------------------------------------------------------------------
// Hostile strings
// -------------------------------------------------------------------------------------------

/// What the peer's hostile words carry besides controls (`HOSTILE` in oauth_peer.py): each
/// shows nothing, or reorders what follows.
const HIDDEN: [char; 10] = [
    '\u{202E}',
    '\u{200B}',
    '\u{2028}',
    '\u{00AD}',
    '\u{E0069}',
    '\u{E0067}',
    '\u{3164}',
    '\u{2800}',
    '\u{FE0F}',
    '\u{E000}',
];

/// The first control character (but a line break) or [`HIDDEN`] character of `text`.
fn raw(text: &str) -> Option<char> {
    text.chars()
        .find(|c| (c.is_control() && *c != '\n') || HIDDEN.contains(c))
}

/// Control characters, ANSI escapes and invisible characters in what the servers say (an issuer with CR, LF, ESC
/// and BEL that still parses as the right URL; an issuer of another origin with colours; a
/// token endpoint's and an authorization redirect's `error_description` with a screen clear,
/// a title change, a C1 CSI and a forged log line after CR LF) reach neither stderr nor the
/// host's error raw: the refusal is still said, as text.
#[test]
fn hostile_strings_reach_stderr_only_as_text() {
    let person = Person::new();
    for (mode, needles) in [
        (
            "hostile-token",
            &["refused to issue a token", "invalid_grant"][..],
        ),
        ("hostile-issuer", &["states the issuer", "RFC 8414"][..]),
        (
            "hostile-refused",
            &["did not sign you in", "access_denied"][..],
        ),
    ] {
        let peer = Peer::start(mode, &person.dir);
        let (_root, mut fsb) = person.proxy(&peer.url, mode);
        let message = refused(&mut fsb, needles);
        if mode == "hostile-token" {
            // Named as the URL it parsed to, which the issuer check compared.
            let clean = format!("the authorization server {}/ refused", peer.issuer);
            assert!(message.contains(&clean), "{message:?}");
        }
        let log = finish(fsb);
        assert_eq!(
            raw(&message),
            None,
            "{mode}: the host's error holds a control character: {message:?}"
        );
        for line in log.lines() {
            assert_eq!(
                raw(line),
                None,
                "{mode}: stderr holds a control character: {line:?}"
            );
            assert!(
                !line.starts_with("2099-01-01") && !line.starts_with("FORGED"),
                "{mode}: a forged line on stderr: {line:?}"
            );
        }
        assert!(
            !message.contains('\n'),
            "{mode}: the host's error holds a line break: {message:?}"
        );
        for line in person.sign_ins(mode) {
            let text = line.to_string();
            assert!(
                !text.contains("\\u001b") && !text.contains("\\r") && raw(&text).is_none(),
                "{mode}: {text}"
            );
        }
        peer.other_saw_nothing();
    }

    // Granted: the token response's scope is the hostile text. The sign-in succeeds, and
    // neither stderr (where it is logged at info), the audit log nor `auth list` show it raw.
    let peer = Peer::start("hostile-scope", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "hostile-scope");
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    let log = log_holding(&fsb, &["signed-in"]);
    finish(fsb);
    for line in log.lines() {
        assert_eq!(
            raw(line),
            None,
            "hostile-scope: stderr holds a control character: {line:?}"
        );
        assert!(
            !line.starts_with("2099-01-01"),
            "hostile-scope: a forged line on stderr: {line:?}"
        );
    }
    for line in person.sign_ins("hostile-scope") {
        let text = line.to_string();
        assert!(
            !text.contains("\\u001b") && !text.contains("\\r") && raw(&text).is_none(),
            "hostile-scope: {text}"
        );
    }
    let (ok, list, err) = person.auth(&["list"]);
    assert!(ok, "{err}");
    assert_eq!(raw(&list), None, "{list:?}");
}

// -------------------------------------------------------------------------------------------
// The hostile review's findings: a mix-up, a client's secret, loops
// -------------------------------------------------------------------------------------------

/// A mix-up: metadata naming another server's sign-in page beside its own token endpoint
/// (the person would sign in at the honest page, and the code and verifier go to this
/// server's token endpoint). Refused before the browser opens; the other server sees nothing.
#[test]
fn a_sign_in_page_of_another_origin_is_refused() {
    let person = Person::new();
    let peer = Peer::start("mixup", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "m");
    refused(
        &mut fsb,
        &[
            &format!("{}/authorize", peer.other),
            "is on neither its own origin nor its token endpoint's",
        ],
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    assert!(peer.token_forms().is_empty(), "a token was asked for");
    peer.other_saw_nothing();
}

/// RFC 9207: an answer whose `iss` names another authorization server, and one without the
/// `iss` the metadata promised, are refused at the listener: the code is never exchanged.
#[test]
fn an_answer_from_another_authorization_server_is_refused() {
    for (mode, says) in [
        ("iss-other", "(a mix-up, RFC 9207)"),
        ("iss-required", "the answer carries no iss"),
    ] {
        let person = Person::new();
        let peer = Peer::start(mode, &person.dir);
        let (_root, mut fsb) = person.proxy(&peer.url, "i");
        let message = refused(&mut fsb, &["did not sign you in", says]);
        let log = finish(fsb);
        browser_opened(&person, &log, 1, 1);
        assert!(
            peer.token_forms().is_empty(),
            "{mode}: the code was exchanged: {message}"
        );
        assert!(person.kept().is_empty(), "{mode}: something was kept");
    }
}

/// A client registered beforehand goes with its secret to the authorization server it is
/// registered with (`--oauth-issuer`) alone: a server naming another gets neither.
#[test]
fn a_registered_clients_secret_goes_to_its_own_authorization_server_alone() {
    let person = Person::new();
    let peer = Peer::start("ok", &person.dir);
    let secret = "corp-secret-7f3a9c2e11";
    let theirs = format!("{}/", peer.other);
    let (_root, mut fsb) = person.proxy_with(
        &peer.url,
        "c",
        &[
            "--oauth-client-id",
            "corp-client",
            "--oauth-issuer",
            &theirs,
            "--oauth-client-secret-env",
            "CORP_SECRET",
        ],
        &[("CORP_SECRET", secret)],
    );
    refused(
        &mut fsb,
        &[&format!(
            "is registered with {theirs}, not with this server's authorization server"
        )],
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 0, 0);
    assert!(!log.contains(secret), "the secret was logged");
    let peer_log = std::fs::read_to_string(&peer.log).unwrap_or_default();
    assert!(
        !peer_log.contains(secret) && !peer_log.contains("corp-client"),
        "the client reached the server's authorization server:\n{peer_log}"
    );

    // Without --oauth-issuer, a secret is refused at start.
    let (_root, mut fsb) = person.proxy_with(
        &peer.url,
        "c2",
        &[
            "--oauth-client-id",
            "corp-client",
            "--oauth-client-secret-env",
            "CORP_SECRET",
        ],
        &[("CORP_SECRET", secret)],
    );
    let (status, _) = fsb.end();
    assert!(!status.success());
    assert!(
        fsb.log_text().contains("--oauth-issuer"),
        "{}",
        fsb.log_text()
    );
}

/// A server that refuses every token, or asks for one more scope each time, does not have
/// the browser opened for every request: a token this process just got and the server
/// refused is an error, and the person is asked at most 3 times in 10 minutes.
#[test]
fn a_server_refusing_every_token_asks_the_person_a_few_times_at_most() {
    let person = Person::new();
    let peer = Peer::start("always-401", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "l1");
    // The request that met the first 401 is sent once more, with the new token, and its
    // 401 is the host's error; later ones are refused without asking anyone.
    let first = error_message(&initialize(&mut fsb));
    assert!(first.contains("HTTP 401"), "{first}");
    for _ in 0..4 {
        let r = fsb.request("tools/list", json!({}));
        assert!(
            error_message(&r).contains("the server refused the token it was just issued"),
            "{r}"
        );
    }
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);

    let person = Person::new();
    let peer = Peer::start("always-403", &person.dir);
    let (_root, mut fsb) = person.proxy(&peer.url, "l2");
    let mut last = String::new();
    for _ in 0..6 {
        let r = fsb.request("tools/list", json!({}));
        last = error_message(&r);
    }
    assert!(
        last.contains("you were asked to sign in 3 times in 10 minutes"),
        "{last}"
    );
    let log = finish(fsb);
    browser_opened(&person, &log, 3, 3);
}

/// A server listing two authorization servers, the client's (`--oauth-issuer`) second: the
/// client signs in at its own, and the first listed is never asked anything.
#[test]
fn a_registered_client_picks_its_own_of_the_listed_authorization_servers() {
    let person = Person::new();
    let peer = Peer::start("two-as", &person.dir);
    let issuer = format!("{}/", peer.issuer);
    let (_root, mut fsb) = person.proxy_with(
        &peer.url,
        "two",
        &[
            "--oauth-client-id",
            "corp-client",
            "--oauth-issuer",
            &issuer,
            "--oauth-client-secret-env",
            "CORP_SECRET",
        ],
        &[("CORP_SECRET", "corp-secret-0b8e3c7d55")],
    );
    signed_in(&mut fsb, &peer);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    assert_eq!(peer.authorizations()[0]["client_id"], "corp-client");
    peer.other_saw_nothing();
}

/// A client registered beforehand (`--oauth-client-id`, its secret from the environment) at
/// its own authorization server: no dynamic registration, its id in the authorization
/// request, its secret at the token endpoint alone (for the code, then for a refresh), and
/// never on stderr, in the audit log or in the sign-in cache (it is the person's to give at
/// each start).
#[test]
fn a_registered_client_signs_in_without_registering() {
    let person = Person::new();
    let peer = Peer::start("refresh", &person.dir);
    let secret = "corp-secret-5d1e90aa42";
    let issuer = format!("{}/", peer.issuer);
    let (_root, mut fsb) = person.proxy_with(
        &peer.url,
        "rc",
        &[
            "--oauth-client-id",
            "corp-client",
            "--oauth-issuer",
            &issuer,
            "--oauth-client-secret-env",
            "CORP_SECRET",
        ],
        &[("CORP_SECRET", secret)],
    );
    signed_in(&mut fsb, &peer);
    tools_list(&mut fsb, &peer);
    // The token lives 5 s: inside the refresh margin, refreshed with the configured secret.
    log_holding(&fsb, &["refreshed"]);
    let log = finish(fsb);
    browser_opened(&person, &log, 1, 1);
    let registered: Vec<Value> = peer
        .requests("as")
        .into_iter()
        .filter(|e| e["path"] == "/register")
        .collect();
    assert!(registered.is_empty(), "it registered: {registered:#?}");
    let asked = peer.authorizations();
    assert_eq!(asked.len(), 1, "{asked:#?}");
    assert_eq!(asked[0]["client_id"], "corp-client", "{asked:#?}");
    let forms = peer.token_forms();
    assert!(forms.len() >= 2, "{forms:#?}");
    assert_eq!(forms[1]["grant_type"], "refresh_token", "{forms:#?}");
    for form in &forms {
        // The metadata lists no client_secret_basic: the secret goes in the form.
        assert_eq!(form["client_id"], "corp-client", "{forms:#?}");
        assert_eq!(form["client_secret"], secret, "{forms:#?}");
    }
    let carried: Vec<Value> = peer
        .entries()
        .into_iter()
        .filter(|e| e.to_string().contains(secret))
        .collect();
    assert!(
        carried
            .iter()
            .all(|e| e["listener"] == "as" && e["path"] == "/token"),
        "the secret went elsewhere too: {carried:#?}"
    );
    let audit = std::fs::read_to_string(person.audit("rc")).unwrap_or_default();
    assert!(!log.contains(secret) && !audit.contains(secret));
    let kept = person.kept();
    assert!(!kept.is_empty(), "nothing kept");
    for (path, text) in kept {
        assert!(
            !text.contains(secret),
            "{} holds the secret",
            path.display()
        );
    }
}

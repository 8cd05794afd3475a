//! The person's console in real browsers, headless Chromium and Firefox, each driven through
//! WebDriver (`fantoccini`), against the real binary (`serve --listen … --console`, or `proxy
//! --console` with a small Python MCP server behind it). Each test runs once per browser
//! (`NAME::chromium`, `NAME::firefox`). `console.rs` holds the same console's rules over plain
//! HTTP; this file proves what only a browser shows:
//!
//! - Consent on the page: a prompt card answered by a click or by the keyboard; a path
//!   unticked is left out, a path edited to a folder beneath it is narrowed, Deny denies, and
//!   the card goes.
//! - Revocation from the page reaches a live server behind `fsbroker proxy`: Pause gives it
//!   `list_changed` and then refusals; End session (confirmed in the page's dialog) ends it.
//! - A server's hostile name and message are shown as text: no element is made of them, no
//!   script runs, a direction-changing character is shown as `⟨U+…⟩`; a name that poses as
//!   the page's verdict stays a quoted value in its box, cut short, its spaces shown.
//! - The page in plain words: a server named by its claim and "server N", what it did said in
//!   words, the technical details one keyboard press away; each prompt says what approving
//!   lets its server do (unconfined: everything under the folder with the person's rights;
//!   confined: only through fsbroker); one Approve button, folder advice only for folders.
//! - A page of another origin, in the browser where the console is open, cannot act:
//!   what it sends arrives and is refused (Chromium's network log shows each request).
//! - The page as a person sees it: screenshots, wide and 360 px narrow (no sideways scroll).
//! - A click never answers a prompt it was not meant for: a second click where the answered
//!   card was does not answer the card that moved up into its place; a folder's path is never
//!   put raw in a field (U+202E, zero-width spaces, look-alikes) and is sent exactly as asked,
//!   a line break and all.
//! - Signing in to a remote server (`proxy --url`, the TypeScript SDK's own OAuth example
//!   behind it): the "Sign in to" card names the sign-in page's origin and links to it in a
//!   new tab; following the link from the keyboard signs in, the page then lists the session
//!   as signed in and the host's held request is answered; no token reaches the page or
//!   `/api/state`. A hostile server's URL, issuer, scope and refusal are shown as text.
//!
//! Needs Debian's `chromium` and `chromium-driver`, Debian's `firefox-esr`, and `geckodriver`
//! (`cargo install geckodriver`; found through `$GECKODRIVER`, `PATH` or cargo's bin folder).
//! The sign-in test needs Node.js and the pinned peers too (`tests/peers`, installed on first
//! use like the other peer tests).
//! `.ci/run` installs them all; without one, the tests of that browser print `SKIPPED` and
//! pass (fail with `FSBROKER_TEST_STRICT=1`, as in CI). Every wait is bounded; no time is a pass criterion.

// Tests work on their own files with `std::fs` (clippy.toml keeps it out of the library's
// request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::future::Future;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::console::Console;
use common::fsb::{Cmd, Fsb};
use common::procs::{Pids, kill_group};
use common::{Listener, PolicyToml, RootToml};
use fantoccini::elements::Element;
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const FIREFOX: &str = "/usr/bin/firefox-esr";
/// The longest any one wait may take: a hang guard, far above what a step takes.
const WAIT: Duration = Duration::from_secs(15);
/// A whole test's browser part; past it the test fails instead of hanging.
const TEST_LIMIT: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------
// The browser
// ---------------------------------------------------------------------------------------------

/// A WebDriver (`chromedriver` or `geckodriver`) in a process group of its own, with the
/// browser it starts on a fresh profile. Dropping it kills the group and then every process still using the profile (by
/// pid, found in `/proc`), so a failing test leaves no browser behind.
struct Driver {
    child: Child,
    port: u16,
    profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_group(self.child.id());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        kill_users_of(self.profile.path());
    }
}

/// SIGKILLs every process whose command line names `dir` (Chromium's processes for one
/// profile: a renderer may have left the driver's group).
fn kill_users_of(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// A free loopback port (bound and let go: whoever binds it next gets it).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The browsers the page must work in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// Debian's Chromium, through its `chromedriver`.
    Chromium,
    /// Debian's Firefox ESR, through `geckodriver` (crates.io; `.ci/run` installs it).
    Firefox,
}

impl Engine {
    /// The browser and its WebDriver, with where each comes from; `None` (after printing
    /// `SKIPPED: …`) when either is missing.
    fn programs(self) -> Option<(PathBuf, PathBuf)> {
        let (browser, driver) = match self {
            Engine::Chromium => (
                (PathBuf::from(CHROMIUM), "Debian's chromium"),
                (PathBuf::from(CHROMEDRIVER), "Debian's chromium-driver"),
            ),
            Engine::Firefox => (
                (PathBuf::from(FIREFOX), "Debian's firefox-esr"),
                (geckodriver(), "`cargo install geckodriver`"),
            ),
        };
        for (path, from) in [&browser, &driver] {
            if !path.exists() {
                common::skipped(&format!(
                    "{} is missing ({from}; .ci/run installs it)",
                    path.display()
                ));
                return None;
            }
        }
        Some((browser.0, driver.0))
    }
}

/// Where `geckodriver` is: `$GECKODRIVER`, else the first on `PATH`, else cargo's own bin
/// folder (where `cargo install` puts it, which is not always on a test's `PATH`).
fn geckodriver() -> PathBuf {
    if let Some(path) = std::env::var_os("GECKODRIVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("geckodriver"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| {
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .unwrap_or_default();
        cargo_home.join("bin/geckodriver")
    })
}

/// One headless browser session.
struct Browser {
    c: Client,
    driver: Driver,
    engine: Engine,
}

impl Browser {
    /// Starts the engine's WebDriver and a browser; `None` (after printing `SKIPPED: …`) when
    /// either program is missing.
    async fn start(engine: Engine) -> Option<Browser> {
        Browser::start_with(engine, false).await
    }

    /// [`Browser::start`], with the browser's network log kept when `network_log` (for
    /// [`Browser::requests`]; Chromium only).
    async fn start_with(engine: Engine, network_log: bool) -> Option<Browser> {
        let (browser, driver_program) = engine.programs()?;
        let profile = tempfile::tempdir().expect("a temp dir for the browser's profile");
        let log = profile.path().join("driver.log");
        // A port found free may be taken again before the driver binds it (another test's
        // console or driver), and then a connection to it reaches that other server: the
        // driver is waited for until its own log says it listens on the port, and started
        // again on another port if it could not bind.
        let mut started = None;
        for _ in 0..5 {
            let log_file = std::fs::File::create(&log).expect("the driver's log file");
            let port = free_port();
            let mut command = Command::new(&driver_program);
            let listening = match engine {
                Engine::Chromium => {
                    command
                        .arg(format!("--port={port}"))
                        .arg(format!("--log-path={}", log.display()))
                        .stdout(Stdio::null())
                        .stderr(Stdio::null());
                    format!("ChromeDriver was started successfully on port {port}")
                }
                Engine::Firefox => {
                    // geckodriver logs to stderr; a Marionette port of 0 lets Firefox pick a
                    // free one, so tests running side by side never collide.
                    // It says where it listens on stdout.
                    command
                        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                        .args(["--marionette-port", "0"])
                        .stdout(log_file.try_clone().expect("the driver's log file"))
                        .stderr(log_file);
                    format!("Listening on 127.0.0.1:{port}")
                }
            };
            let mut child = command
                .stdin(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", driver_program.display()));
            let end = Instant::now() + WAIT;
            let up = loop {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                if said.contains(&listening) {
                    break true;
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break false;
                }
                assert!(
                    Instant::now() < end,
                    "{} never said it listens on {port}: {said}",
                    driver_program.display()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if up {
                started = Some((child, port));
                break;
            }
            eprintln!(
                "{} could not listen on {port}, trying another port: {}",
                driver_program.display(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let (child, port) = started.unwrap_or_else(|| {
            panic!(
                "{} could not listen on any of 5 ports",
                driver_program.display()
            )
        });
        let driver = Driver {
            child,
            port,
            profile,
        };
        let data_dir = driver.profile.path().join("profile");
        let mut caps = serde_json::Map::new();
        // Dialogs stay open until the test handles them, so an alert a page should never
        // raise is seen, not dismissed on the next command.
        caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
        match engine {
            Engine::Chromium => {
                caps.insert("browserName".into(), json!("chrome"));
                if network_log {
                    caps.insert("goog:loggingPrefs".into(), json!({"performance": "ALL"}));
                }
                caps.insert(
                    "goog:chromeOptions".into(),
                    json!({
                        "binary": browser,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--disable-quic",
                            "--no-first-run",
                            "--disable-background-networking",
                            "--disable-component-update",
                            "--disable-sync",
                            "--window-size=1280,900",
                            format!("--user-data-dir={}", data_dir.display()),
                        ],
                    }),
                );
            }
            Engine::Firefox => {
                std::fs::create_dir(&data_dir).expect("the browser's profile folder");
                caps.insert("browserName".into(), json!("firefox"));
                caps.insert(
                    "moz:firefoxOptions".into(),
                    json!({
                        "binary": browser,
                        "args": [
                            "-headless",
                            "-width", "1280", "-height", "900",
                            "-profile", data_dir,
                        ],
                        // This machine's network is closed: nothing of the browser's own
                        // (updates, telemetry, captive-portal checks) should try it.
                        "prefs": {
                            "network.captive-portal-service.enabled": false,
                            "network.connectivity-service.enabled": false,
                            "app.update.disabledForTesting": true,
                            "browser.safebrowsing.update.enabled": false,
                            "datareporting.policy.dataSubmissionEnabled": false,
                            "toolkit.telemetry.enabled": false,
                            // See `the_page_renders_wide_and_narrow`: Firefox opens no
                            // window under 500 px, and the page's breakpoints are in rem.
                            "font.size.variable.x-western": 20,
                        },
                    }),
                );
            }
        }
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let session = tokio::time::timeout(
            Duration::from_secs(60),
            ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await;
        let c = match session {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!(
                "no {engine:?} session: {e}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
            Err(_) => panic!("no {engine:?} session within 60 s"),
        };
        Some(Browser { c, driver, engine })
    }

    /// The requests the browser sent since the last call (from chromedriver's performance
    /// log: the browser's own network events), with what it saw of each.
    async fn requests(&self) -> Vec<Sent> {
        let sid = self
            .c
            .session_id()
            .await
            .expect("the session's id")
            .expect("a session");
        // chromedriver's log endpoint, which fantoccini does not wrap.
        let log = driver_post(
            self.driver.port,
            &format!("/session/{sid}/se/log"),
            "{\"type\":\"performance\"}",
        );
        let mut sent: Vec<Sent> = Vec::new();
        let entries = log["value"].as_array().cloned().unwrap_or_default();
        for entry in entries {
            let Some(event) = entry["message"]
                .as_str()
                .and_then(|m| serde_json::from_str::<Value>(m).ok())
            else {
                continue;
            };
            let params = &event["message"]["params"];
            let Some(id) = params["requestId"].as_str() else {
                continue;
            };
            let at = match sent.iter().position(|r| r.id == id) {
                Some(at) => at,
                None => {
                    sent.push(Sent {
                        id: id.to_owned(),
                        ..Sent::default()
                    });
                    sent.len() - 1
                }
            };
            let r = &mut sent[at];
            match event["message"]["method"].as_str().unwrap_or_default() {
                "Network.requestWillBeSent" => {
                    r.url = params["request"]["url"].as_str().unwrap_or_default().into();
                    r.method = params["request"]["method"]
                        .as_str()
                        .unwrap_or_default()
                        .into();
                }
                "Network.requestWillBeSentExtraInfo" => {
                    r.on_wire = true;
                    let headers = params["headers"].as_object();
                    r.origin = headers
                        .and_then(|h| h.iter().find(|(k, _)| k.eq_ignore_ascii_case("origin")))
                        .and_then(|(_, v)| v.as_str())
                        .map(str::to_owned);
                }
                "Network.responseReceivedExtraInfo" => {
                    r.status = params["statusCode"].as_u64();
                }
                "Network.responseReceived" => {
                    r.status = r.status.or(params["response"]["status"].as_u64());
                }
                _ => {}
            }
        }
        sent
    }

    /// Ends the browser session (the driver is killed on drop either way).
    async fn quit(&self) {
        let _ = tokio::time::timeout(WAIT, self.c.clone().close()).await;
    }

    /// Opens the console as `fsbroker console` would, at the URL file's URL: the answer that
    /// spends the one-time ticket is the page with its key, which it keeps, taking the ticket
    /// out of the address bar; then waits for the live state.
    async fn open_console(&self, console: &Console) {
        let url = console.page_url();
        self.c.goto(&url).await.expect("open the console");
        let bare = format!("http://{}/", console.host);
        until(
            "the ticket spent and the key out of the address bar",
            || async {
                let now = self.c.current_url().await.expect("the page's URL");
                (now.as_str() == bare).then_some(())
            },
        )
        .await;
        let kept = self
            .js("return sessionStorage.getItem('fsbroker-key');")
            .await;
        assert!(
            kept.as_str().is_some_and(|k| k.len() == 64),
            "the page keeps its key: {kept}"
        );
        let live = "document.getElementById('content').hidden === false && \
                    document.getElementById('connection').textContent === 'live'";
        let end = Instant::now() + WAIT;
        while self.js(&format!("return Boolean({live});")).await != json!(true) {
            if Instant::now() >= end {
                // What the page shows instead, to tell a slow start from a stuck one.
                let seen = self
                    .js("return {url: location.href, connection: document.getElementById('connection').textContent, \
                         contentHidden: document.getElementById('content').hidden, \
                         key: sessionStorage.length, text: document.body.innerText.slice(0, 600)};")
                    .await;
                panic!(
                    "not within {WAIT:?}: the page's first state and its live event stream: {seen:#}"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `script` (a function body; `return` gives the value).
    async fn js(&self, script: &str) -> Value {
        self.c
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed ({e}): {script}"))
    }

    /// Waits until the JavaScript expression `expr` is true.
    async fn wait_js(&self, what: &str, expr: &str) {
        let script = format!("return Boolean({expr});");
        until(what, || async {
            (self.js(&script).await == json!(true)).then_some(())
        })
        .await
    }

    async fn find(&self, css: &str) -> Element {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css}: {e}"))
    }

    async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// The oldest prompt card once it is armed (presses count); its selector.
    async fn armed_card(&self) -> String {
        self.wait_js(
            "an armed prompt card",
            "document.querySelector('#prompts [data-prompt-id][data-armed=\"true\"]')",
        )
        .await;
        let id = self
            .js("return document.querySelector('#prompts [data-prompt-id]').dataset.promptId;")
            .await;
        let id = id.as_str().expect("a prompt id").to_owned();
        assert!(id.bytes().all(|b| b.is_ascii_digit()), "{id}");
        format!("#prompts [data-prompt-id=\"{id}\"]")
    }

    /// Waits until no element matches `css`.
    async fn wait_gone(&self, what: &str, css: &str) {
        let expr = format!("document.querySelector({}) === null", json!(css));
        self.wait_js(what, &expr).await;
    }
}

/// `POST`s `body` to chromedriver and returns its JSON answer (plain HTTP/1.1 on loopback:
/// chromedriver answers with a `Content-Length` and keeps the connection open).
fn driver_post(port: u16, path: &str, body: &str) -> Value {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).expect("connect to chromedriver");
    conn.set_read_timeout(Some(WAIT)).expect("a read timeout");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes())
        .expect("write to chromedriver");
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let (head_len, length) = loop {
        let n = conn.read(&mut buf).expect("read chromedriver's answer");
        assert!(
            n > 0,
            "chromedriver closed: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or_else(|| panic!("no Content-Length from chromedriver: {head}"));
            break (at + 4, length);
        }
    };
    while raw.len() < head_len + length {
        let n = conn.read(&mut buf).expect("read chromedriver's answer");
        assert!(n > 0, "chromedriver closed mid-answer");
        raw.extend_from_slice(&buf[..n]);
    }
    serde_json::from_slice(&raw[head_len..head_len + length]).expect("chromedriver's JSON")
}

/// One request the browser sent, as its network log tells it.
#[derive(Debug, Default)]
struct Sent {
    id: String,
    method: String,
    url: String,
    /// Whether it left the browser (its headers as sent were logged): one a failed CORS
    /// preflight stopped never does.
    on_wire: bool,
    origin: Option<String>,
    /// The answer's status, if one came.
    status: Option<u64>,
}

/// Polls `f` (every 50 ms, for at most [`WAIT`]) until it gives a value.
async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "not within {WAIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a test's browser part under [`TEST_LIMIT`], then ends the browser session (a
/// panic ends it too: the driver is killed on drop).
async fn finish(b: &Browser, body: impl Future<Output = ()>) {
    let done = tokio::time::timeout(TEST_LIMIT, body).await;
    b.quit().await;
    assert!(
        done.is_ok(),
        "the test did not finish within {TEST_LIMIT:?}"
    );
}

/// Runs the test `$name(engine)` once in each browser, as `$name::chromium` and
/// `$name::firefox`.
macro_rules! in_each_browser {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn chromium() {
                super::$name(super::Engine::Chromium).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn firefox() {
                super::$name(super::Engine::Firefox).await
            }
        }
    };
}

in_each_browser!(prompts_are_approved_narrowed_and_denied_on_the_page);
in_each_browser!(pausing_and_ending_on_the_page_reach_a_proxied_server);
in_each_browser!(hostile_strings_render_as_text_and_run_nothing);
in_each_browser!(a_page_from_another_origin_cannot_act);
in_each_browser!(the_page_renders_wide_and_narrow);
in_each_browser!(a_flood_from_one_session_leaves_anothers_rows);
in_each_browser!(a_claimed_name_stays_a_quoted_value_in_its_box);
in_each_browser!(servers_are_named_and_described_in_plain_words);
in_each_browser!(the_prompt_says_what_approving_lets_the_server_do);
in_each_browser!(one_approve_button_and_folder_advice_only_for_folders);
in_each_browser!(a_second_click_does_not_answer_the_prompt_that_moved_up);
in_each_browser!(a_deceptive_folder_path_is_shown_escaped_and_sent_as_asked);
in_each_browser!(a_folder_with_a_line_break_in_its_name_can_be_approved);
in_each_browser!(a_stray_or_double_click_never_widens_a_narrowed_folder);
in_each_browser!(a_remote_server_is_signed_in_to_from_the_page);
in_each_browser!(hostile_sign_in_strings_render_as_text);

// ---------------------------------------------------------------------------------------------
// Brokers
// ---------------------------------------------------------------------------------------------

/// A shared broker (`serve --listen … --console`) on a policy of the test's.
struct Shared {
    _dir: tempfile::TempDir,
    base: PathBuf,
    listener: Listener,
    console: Console,
    _pids: Pids,
}

impl Shared {
    fn start(policy: impl FnOnce(&Path) -> PolicyToml) -> Shared {
        let (dir, base) = common::tempdir();
        let file = policy(&base).write_to(&base.join("policy.toml"));
        let url_file = base.join("console.url");
        let pids = Pids::default();
        let url_arg = url_file.to_str().expect("a UTF-8 temp path");
        let listener = Listener::start(
            &file,
            &base.join("s.sock"),
            &["--console", "--console-url-file", url_arg],
            &pids,
        );
        let console = Console::from_url_file(&url_file);
        Shared {
            _dir: dir,
            base,
            listener,
            console,
            _pids: pids,
        }
    }

    /// A session on the socket.
    fn session(&self) -> Fsb {
        let mut s = self.listener.connect();
        s.set_deadline(WAIT);
        s
    }
}

/// A `prompt` root `docs` (holding `a/`, `a/inner/`, `b/`) asked on the console only, and an
/// `auto` root `open` holding `f.txt`.
fn prompt_policy(base: &Path) -> PolicyToml {
    let docs = base.join("docs");
    for d in ["a/inner", "b"] {
        std::fs::create_dir_all(docs.join(d)).expect("make the root's folders");
    }
    std::fs::write(docs.join("a/top.txt"), "top").expect("write a file");
    let open = base.join("open");
    std::fs::create_dir_all(&open).expect("make the root's folder");
    std::fs::write(open.join("f.txt"), "open").expect("write a file");
    PolicyToml::new()
        .root(RootToml::at(&docs).name("docs").consent("prompt"))
        .root(RootToml::at(&open).name("open"))
        .unlimited()
        .table(
            "consent",
            "provider = \"console\"\nterminal = false\ntimeout_ms = 60000\n",
        )
}

/// Sends `files/consent` for `paths` (beneath `docs`); the answer comes once the person
/// answers on the page.
fn ask(s: &mut Fsb, docs: &Path, message: &str, paths: &[&str]) -> u64 {
    let abs: Vec<PathBuf> = paths.iter().map(|p| docs.join(p)).collect();
    s.send(
        "files/consent",
        json!({"message": message, "requestedPaths": abs}),
    )
}

/// The MCP server behind the proxy: newline-delimited JSON-RPC on stdio. `argv[1]`: its log
/// (one line per event); `argv[2]`: JSON config: `name` (its `serverInfo.name`), `listRoots`
/// (send `roots/list` first), `consent` (params of one `files/consent` to send), `read` (a
/// path to `files/read` again and again, one at a time, 100 ms apart), `startAfter` (a path:
/// do nothing of that until it exists).
///
/// Log lines: `pid N`, `roots OUTCOME`, `consent RESULT-JSON`, `read N OUTCOME` (`ok` or the
/// error's code), `list_changed` for each `notifications/roots/list_changed`.
const SERVER: &str = r#"
import json, os, sys, threading, time

LOG = open(sys.argv[1], "a", buffering=1)
CONFIG = json.loads(sys.argv[2])
out_lock = threading.Lock()
answers = {}
arrived = threading.Condition()
initialized = threading.Event()

def log(text):
    LOG.write(text + "\n")

def send(obj):
    data = json.dumps(obj) + "\n"
    with out_lock:
        sys.stdout.write(data)
        sys.stdout.flush()

def outcome(msg):
    if msg is None:
        return "none"
    if "error" in msg:
        err = msg["error"]
        data = err.get("data") if isinstance(err.get("data"), dict) else {}
        return str(data.get("code", err.get("code")))
    return "ok"

def reader():
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        method, mid = msg.get("method"), msg.get("id")
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "serverInfo": {"name": CONFIG["name"], "version": "1.0"}}})
        elif method == "notifications/initialized":
            initialized.set()
        elif method == "notifications/roots/list_changed":
            log("list_changed")
        elif method is None and mid is not None:
            with arrived:
                answers[mid] = msg
                arrived.notify_all()
        elif mid is not None:
            send({"jsonrpc": "2.0", "id": mid, "error": {"code": -32601, "message": "no"}})
    # The proxy closed our input: it is gone, and so are we.
    os._exit(0)

def ask(mid, method, params, limit):
    send({"jsonrpc": "2.0", "id": mid, "method": method, "params": params})
    end = time.monotonic() + limit
    with arrived:
        while mid not in answers:
            left = end - time.monotonic()
            if left <= 0:
                return None
            arrived.wait(left)
        return answers.pop(mid)

log("pid %d" % os.getpid())
threading.Thread(target=reader, daemon=True).start()
initialized.wait()
while "startAfter" in CONFIG and not os.path.exists(CONFIG["startAfter"]):
    time.sleep(0.05)
if CONFIG.get("listRoots"):
    log("roots " + outcome(ask("roots", "roots/list", {}, 30)))
if "consent" in CONFIG:
    r = ask("consent", "files/consent", CONFIG["consent"], 120)
    log("consent " + json.dumps(r.get("result") if r else None))
n = 0
while "read" in CONFIG:
    n += 1
    log("read %d %s" % (n, outcome(ask(n, "files/read", {"path": CONFIG["read"]}, 10))))
    time.sleep(0.1)
threading.Event().wait()
"#;

/// `fsbroker proxy BROKER_ARGS --console --console-url-file F -- python3 server.py LOG
/// CONFIG`, with the test as the host: the handshake done, its console read. The log is
/// `server.log` in the temp dir, or in its folder `logIn` when the config names one.
struct Proxied {
    _dir: tempfile::TempDir,
    host: Fsb,
    console: Console,
    log: PathBuf,
}

impl Proxied {
    /// `setup` makes what the test needs in the temp dir and returns the broker's arguments
    /// and the server's config.
    fn start(setup: impl FnOnce(&Path) -> (Vec<String>, Value)) -> Proxied {
        let (dir, base) = common::tempdir();
        let (broker_args, config) = setup(&base);
        let server = base.join("server.py");
        std::fs::write(&server, SERVER).expect("write the server");
        // A confined server may write only in its read-write roots: its config's `logIn`
        // names the folder (beneath the temp dir) its log goes in.
        let log = match config["logIn"].as_str() {
            Some(dir) => base.join(dir).join("server.log"),
            None => base.join("server.log"),
        };
        let url_file = base.join("console.url");
        let mut args = vec!["proxy".to_owned()];
        args.extend(broker_args);
        args.extend([
            "--console".to_owned(),
            "--console-url-file".to_owned(),
            common::path_str(&url_file),
            "--".to_owned(),
            common::python().to_owned(),
            common::path_str(&server),
            common::path_str(&log),
            config.to_string(),
        ]);
        let mut host = Cmd::new(&args).group().deadline(WAIT).spawn();
        let console = Console::from_url_file(&url_file);
        host.send_msg(&json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "browser-test-host", "version": "1.0"}
            }
        }));
        let init = host.answer(&json!(0), WAIT);
        assert_eq!(
            init["result"]["serverInfo"]["name"], config["name"],
            "{init}"
        );
        host.send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        Proxied {
            _dir: dir,
            host,
            console,
            log,
        }
    }

    fn log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits until the server's log satisfies `want`; returns its lines.
    async fn wait_log(&self, what: &str, want: impl Fn(&[String]) -> bool) -> Vec<String> {
        let end = Instant::now() + WAIT;
        loop {
            let lines = self.log_lines();
            if want(&lines) {
                return lines;
            }
            assert!(
                Instant::now() < end,
                "the server's log never showed {what}: {lines:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The rules
// ---------------------------------------------------------------------------------------------

/// Rule: a prompt card is answered on the page: unticking a path leaves it out (the server is
/// granted exactly the rest); editing a path to a folder beneath it narrows the grant (here
/// answered from the keyboard: Tab from the path to the button, Enter); Deny grants nothing;
/// the card leaves the page each time.
async fn prompts_are_approved_narrowed_and_denied_on_the_page(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        let mut server = s.session();
        b.open_console(&s.console).await;

        // Two paths asked; the second unticked, the rest approved by a click.
        let id = ask(&mut server, &docs, "I need your notes", &["a", "b"]);
        let card = b.armed_card().await;
        let paths = b
            .js(&format!(
                "return [...document.querySelectorAll('{card} input[data-path-input]')].map((i) => i.value);"
            ))
            .await;
        assert_eq!(paths, json!([docs.join("a"), docs.join("b")]));
        b.click(&format!("{card} input[type=checkbox][data-path-index=\"1\"]"))
            .await;
        b.wait_js(
            "the unticked path's box disabled",
            &format!("document.querySelector('{card} input[data-path-input=\"1\"]').disabled"),
        )
        .await;
        b.click(&format!("{card} [data-action=approve-selected]")).await;
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": [docs.join("a")]}),
            "{answer}"
        );
        b.wait_gone("the answered card gone", &card).await;
        // The page shows the grant it made, in the session's row.
        let grant = json!(docs.join("a"));
        b.wait_js(
            "the grant listed under its session",
            &format!(
                "[...document.querySelectorAll('#sessions li[data-grant-id] .grant-path')]\
                 .some((e) => e.textContent === {grant})"
            ),
        )
        .await;

        // One path, narrowed to a folder beneath it by editing, answered from the keyboard.
        let id = ask(&mut server, &docs, "only the inner folder, please", &["a"]);
        let card = b.armed_card().await;
        b.click(&format!("{card} button[data-action=narrow]")).await;
        let input = b
            .find(&format!("{card} input[data-path-input=\"0\"]"))
            .await;
        input.clear().await.expect("clear the path");
        input
            .send_keys(&common::path_str(&docs.join("a/inner")))
            .await
            .expect("type the narrower path");
        input
            .send_keys(&Key::Tab.to_string())
            .await
            .expect("Tab to the next control");
        b.wait_js(
            "the focus on Approve selected",
            "document.activeElement && document.activeElement.dataset.action === 'approve-selected'",
        )
        .await;
        b.c.active_element()
            .await
            .expect("the focused element")
            .send_keys(&Key::Enter.to_string())
            .await
            .expect("press Enter");
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": [docs.join("a/inner")]}),
            "{answer}"
        );
        b.wait_gone("the narrowed card gone", &card).await;

        // Denied by a click.
        let id = ask(&mut server, &docs, "and the other folder", &["b"]);
        let card = b.armed_card().await;
        b.click(&format!("{card} [data-action=deny]")).await;
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": false, "approvedPaths": []}),
            "{answer}"
        );
        b.wait_gone("the denied card gone", &card).await;
        let left = s.console.state();
        assert_eq!(left["prompts"], json!([]), "{left}");
    })
    .await;
}

/// Rule: the person's acts on the page reach a live server behind `fsbroker proxy`: Pause on
/// its root sends it `list_changed`, and its reads are refused from then on (the page's feed
/// shows them refused); End session, once the page's confirmation is accepted, ends the
/// server, and with it the proxy.
async fn pausing_and_ending_on_the_page_reach_a_proxied_server(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let mut p = Proxied::start(|base| {
        let shared = base.join("shared");
        std::fs::create_dir(&shared).expect("make the root");
        std::fs::write(shared.join("f.txt"), "hello").expect("write a file");
        (
            vec!["--root".to_owned(), common::path_str(&shared)],
            json!({
                "name": "reader-server",
                "listRoots": true,
                "read": shared.join("f.txt"),
            }),
        )
    });
    finish(&b, async {
        let lines = p
            .wait_log("reads that succeed", |l| {
                l.iter().filter(|x| x.ends_with(" ok")).count() >= 3
            })
            .await;
        assert!(lines.contains(&"roots ok".to_owned()), "{lines:#?}");
        let pid: i32 = lines
            .iter()
            .find_map(|l| l.strip_prefix("pid ")?.parse().ok())
            .expect("the server's pid in its log");
        b.open_console(&p.console).await;
        b.wait_js(
            "the server's session, named as it calls itself",
            "[...document.querySelectorAll('#sessions tr[data-session-id] th [data-claim]')]\
             .some((e) => e.textContent === 'reader-server')",
        )
        .await;

        b.click("#roots tr[data-root-name=\"shared\"] button[data-action=pause]")
            .await;
        let lines = p
            .wait_log("list_changed, then refusals", |l| {
                l.iter()
                    .position(|x| x == "list_changed")
                    .is_some_and(|at| {
                        l[at..]
                            .iter()
                            .filter(|x| x.ends_with(" PERMISSION_DENIED"))
                            .count()
                            >= 3
                    })
            })
            .await;
        // Once one read is refused, none after it succeeds: the pause is in force for good.
        let reads: Vec<&String> = lines.iter().filter(|l| l.starts_with("read ")).collect();
        let first_refused = reads
            .iter()
            .position(|l| l.ends_with(" PERMISSION_DENIED"))
            .expect("a refusal");
        assert!(
            reads[first_refused..]
                .iter()
                .all(|l| l.ends_with(" PERMISSION_DENIED")),
            "{lines:#?}"
        );
        b.wait_js(
            "the root shown paused, with Resume",
            "document.querySelector('#roots tr[data-root-name=\"shared\"].paused button[data-action=resume]')",
        )
        .await;
        b.wait_js(
            "refused reads in the feed",
            "document.querySelector('#feed tr.refused')",
        )
        .await;
        assert_eq!(
            p.console.state()["roots"][0]["paused"],
            true,
            "the broker holds it paused"
        );

        // End session: the page asks first; the test accepts the browser's own dialog.
        b.click("#sessions tr[data-session-id] button[data-action=end-session]")
            .await;
        let question = until("the confirmation dialog", || async {
            b.c.get_alert_text().await.ok()
        })
        .await;
        assert!(
            question.starts_with("End the session of server 1?"),
            "{question}"
        );
        b.c.accept_alert().await.expect("accept the dialog");
        let status = p
            .host
            .wait_exit(WAIT)
            .expect("the proxy exits once its server is ended");
        assert!(!status.success(), "the server was ended: {status}");
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        until("the server process gone", || async {
            (!proc_dir.exists()).then_some(())
        })
        .await;
    })
    .await;
}

/// The server's name and message in the hostile-strings test: markup, a script, and U+202E
/// (RIGHT-TO-LEFT OVERRIDE), which would turn what follows it around.
const HOSTILE_NAME: &str = "<img src=x onerror=\"document.title='pwned'\">\u{202E}evil</script><script>document.title='pwned'</script>";
const HOSTILE_MESSAGE: &str = "<img src=x onerror=alert(1)><b>bold</b>\u{202E}txet";

/// Rule: a server's name and consent message are shown as the text they are: no element is
/// made of them (no `img`, no `b`, no script run: the title stays, no alert opens), and a
/// direction-changing character is shown as `⟨U+202E⟩` rather than acted on, on the prompt
/// card and in the sessions table alike (the name whole under their details).
async fn hostile_strings_render_as_text_and_run_nothing(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let p = Proxied::start(|base| {
        let docs = base.join("docs");
        std::fs::create_dir_all(docs.join("a")).expect("make the root's folder");
        let policy = PolicyToml::new()
            .root(RootToml::at(&docs).name("docs").consent("prompt"))
            .unlimited()
            .table(
                "consent",
                "provider = \"console\"\nterminal = false\ntimeout_ms = 60000\n",
            )
            .write_to(&base.join("policy.toml"));
        (
            vec!["--policy".to_owned(), common::path_str(&policy)],
            // No roots/list first: with a `prompt` root, the broker would ask about that.
            json!({
                "name": HOSTILE_NAME,
                "consent": {"message": HOSTILE_MESSAGE, "requestedPaths": [docs.join("a")]},
            }),
        )
    });
    finish(&b, async {
        b.open_console(&p.console).await;
        let card = b.armed_card().await;
        let shown = |s: &str| s.replace('\u{202E}', "⟨U+202E⟩");

        let found = b
            .js(&format!(
                "const card = document.querySelector('{card}');
                 const message = card.querySelector('.message');
                 return {{
                   imgsInCard: card.querySelectorAll('img').length,
                   imgsWithSrcX: document.querySelectorAll('img[src=\"x\"]').length,
                   inlineScripts: document.querySelectorAll('script:not([src])').length,
                   boldInMessage: message.querySelectorAll('b').length,
                   message: message.textContent,
                   claim: card.querySelector('details[data-tech] .box.full').textContent,
                   title: document.title,
                 }};"
            ))
            .await;
        assert_eq!(found["imgsInCard"], 0, "{found:#}");
        assert_eq!(found["imgsWithSrcX"], 0, "{found:#}");
        assert_eq!(found["inlineScripts"], 0, "{found:#}");
        assert_eq!(found["boldInMessage"], 0, "{found:#}");
        let message = found["message"].as_str().expect("the message's text");
        assert!(
            message.contains("<img src=x onerror=alert(1)>"),
            "{message:?}"
        );
        assert!(message.contains(&shown(HOSTILE_MESSAGE)), "{message:?}");
        assert!(!message.contains('\u{202E}'), "{message:?}");
        let claim = found["claim"].as_str().expect("the name's text");
        assert!(claim.contains(&shown(HOSTILE_NAME)), "{claim:?}");
        assert!(!claim.contains('\u{202E}'), "{claim:?}");

        // The sessions table shows the same name, as text.
        let name_cell = "#sessions tr[data-session-id]";
        b.wait_js(
            "the session's name in the table",
            &format!("document.querySelector('{name_cell}')"),
        )
        .await;
        let cell = b
            .js(&format!(
                "const tr = document.querySelector('{name_cell}');
                 return {{text: tr.querySelector('details .box.full').textContent,
                          elements: [...new Set([...tr.querySelectorAll('th *, .box *')].map((e) => e.tagName))].sort()}};"
            ))
            .await;
        assert_eq!(cell["text"], json!(shown(HOSTILE_NAME)), "{cell:#}");
        // Only the page's own wrappers: the isolating <bdi>, the <span>s of the box, of the
        // escape, of the cut and of the label.
        assert_eq!(cell["elements"], json!(["BDI", "SPAN"]), "{cell:#}");

        let title = b.c.title().await.expect("the title");
        assert!(!title.contains("pwned"), "{title}");
        assert!(
            b.c.get_alert_text().await.is_err(),
            "no dialog is open: nothing of the server's ran"
        );

        // The card still works: Deny reaches the server.
        b.click(&format!("{card} [data-action=deny]")).await;
        b.wait_gone("the denied card gone", &card).await;
        let lines = p
            .wait_log("the consent answer", |l| {
                l.iter().any(|x| x.starts_with("consent "))
            })
            .await;
        assert!(
            lines.contains(&"consent {\"granted\": false, \"approvedPaths\": []}".to_owned()),
            "{lines:#?}"
        );
        let title = b.c.title().await.expect("the title");
        assert!(!title.contains("pwned"), "{title}");
    })
    .await;
}

/// A one-page HTTP server on another loopback port: the attacker's site. Every request for
/// `/` gets `page`; anything else is 404. Stops when dropped.
struct Attacker {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Attacker {
    fn start(page: String) -> Attacker {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the attacker's port");
        let port = listener.local_addr().expect("its address").port();
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::Relaxed) {
                let Ok((mut conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = if head.starts_with(b"GET / ") {
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{page}",
                        page.len()
                    )
                } else {
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_owned()
                };
                let _ = conn.write_all(answer.as_bytes());
            }
        });
        Attacker {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Rule: a page of another origin (same site: loopback, another port), opened in the very
/// browser where the console is open, cannot act on the console: it tries a fetch with a
/// guessed CSRF token, a "simple" no-cors POST and a form posted into a frame, at `127.0.0.1`
/// and at `localhost`, and no root is paused; it cannot read the state either. The console
/// sets no cookie (cookies are shared by every port), so the browser holds none of its. The
/// page itself cannot tell a request refused by the console from one the browser never sent
/// (the console's `Cross-Origin-Resource-Policy` hides even a refusal), so in Chromium the
/// browser's network log shows that the simple POSTs did arrive and were refused.
async fn a_page_from_another_origin_cannot_act(engine: Engine) {
    let Some(b) = Browser::start_with(engine, true).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    let port = s
        .console
        .host
        .rsplit(':')
        .next()
        .expect("the console's port")
        .to_owned();
    let page = ATTACKER_PAGE.replace("PORT", &port);
    let attacker = Attacker::start(page);
    finish(&b, async {
        b.open_console(&s.console).await;
        let cookies = b.c.get_all_cookies().await.expect("the browser's cookies");
        assert!(cookies.is_empty(), "the console set no cookie: {cookies:?}");

        if b.engine == Engine::Chromium {
            b.requests().await; // the console's own, set aside
        }
        b.c.goto(&format!("http://127.0.0.1:{}/", attacker.port))
            .await
            .expect("open the attacker's page");
        b.wait_js(
            "the attacker's page done trying",
            "document.title === 'done'",
        )
        .await;
        let results = b.js("return window.results;").await;
        let tried: Vec<&str> = results
            .as_array()
            .expect("the attempts")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for which in ["127.0.0.1", "localhost"] {
            assert!(
                tried.contains(&format!("{which} read state: refused").as_str()),
                "the state (and its CSRF token) cannot be read: {tried:#?}"
            );
            assert!(
                tried.contains(&format!("{which} csrf guess: refused").as_str()),
                "{tried:#?}"
            );
        }
        if b.engine == Engine::Chromium {
            chromium_saw_the_posts_refused(&b, &port, attacker.port).await;
        }
        let roots = s.console.state()["roots"].clone();
        let docs = roots
            .as_array()
            .expect("roots")
            .iter()
            .find(|r| r["name"] == "docs")
            .expect("the docs root")
            .clone();
        assert_eq!(docs["paused"], false, "nothing was paused: {roots}");
        let open = roots
            .as_array()
            .expect("roots")
            .iter()
            .find(|r| r["name"] == "open")
            .expect("the open root")
            .clone();
        assert_eq!(open["paused"], false, "nothing was paused: {roots}");
    })
    .await;
    drop(attacker);
}

/// The rest of [`a_page_from_another_origin_cannot_act`] where the browser's network log
/// tells it (Chromium's): what reached the console. The "simple" POSTs (the no-cors fetches
/// and the form) were sent, all with the attacker's Origin, and the console itself refused
/// them; the one with a custom header never left the browser (its preflight got no CORS
/// answer).
async fn chromium_saw_the_posts_refused(b: &Browser, port: &str, attacker_port: u16) {
    let attacker_origin = format!("http://127.0.0.1:{}", attacker_port);
    let console_apis = [
        format!("http://127.0.0.1:{port}/api/"),
        format!("http://localhost:{port}/api/"),
    ];
    let to_console =
        |r: &&Sent| r.method == "POST" && console_apis.iter().any(|a| r.url.starts_with(a));
    let mut seen: Vec<Sent> = Vec::new();
    let end = Instant::now() + WAIT;
    loop {
        seen.extend(b.requests().await);
        let answered = |url: &str| {
            seen.iter()
                .filter(to_console)
                .any(|r| r.url == url && r.status.is_some())
        };
        let done = ["docs", "open"]
            .iter()
            .all(|root| answered(&format!("{}roots/{root}/pause", console_apis[0])))
            && answered(&format!("{}roots/docs/pause", console_apis[1]));
        if done {
            break;
        }
        assert!(
            Instant::now() < end,
            "the attacker's POSTs never reached the console: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let posts: Vec<&Sent> = seen.iter().filter(to_console).collect();
    for r in &posts {
        if !r.on_wire {
            assert_eq!(r.status, None, "{posts:#?}");
            continue;
        }
        assert_eq!(
            r.origin.as_deref(),
            Some(attacker_origin.as_str()),
            "{posts:#?}"
        );
        // No key (the page's is not sent cross-origin): refused before any check of the
        // origin.
        assert!(
            matches!(r.status, Some(401 | 403)),
            "refused by the console: {posts:#?}"
        );
    }
}

/// The attacker's page (`PORT`: the console's). Inline script is fine here: it is the
/// attacker's own page, under no CSP. `window.results` gets one line per attempt.
const ATTACKER_PAGE: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>attacker</title></head><body>
<iframe name="sink" id="sink"></iframe>
<form id="f" method="post" enctype="text/plain" target="sink"
      action="http://127.0.0.1:PORT/api/roots/open/pause"><input name="x" value="1"></form>
<img src="http://127.0.0.1:PORT/api/state" alt="">
<script>
const results = [];
async function attempt(label, url, init) {
  try {
    const r = await fetch(url, init);
    results.push(label + ': ' + r.type + ' ' + r.status);
  } catch (e) {
    results.push(label + ': refused');
  }
}
(async () => {
  for (const [which, base] of [['127.0.0.1', 'http://127.0.0.1:PORT'], ['localhost', 'http://localhost:PORT']]) {
    await attempt(which + ' csrf guess', base + '/api/roots/docs/pause',
      {method: 'POST', credentials: 'include', headers: {'X-CSRF-Token': 'guess'}});
    await attempt(which + ' no-cors', base + '/api/roots/docs/pause',
      {method: 'POST', credentials: 'include', mode: 'no-cors', body: '{}'});
    await attempt(which + ' read state', base + '/api/state', {credentials: 'include'});
  }
  const sink = document.getElementById('sink');
  const loaded = new Promise((ok) => { sink.onload = ok; setTimeout(ok, 5000); });
  document.getElementById('f').submit();
  await loaded;
  window.results = results.map((r) => r.replace(/ 0$/, ''));
  document.title = 'done';
})();
</script></body></html>
"#;

/// A PNG's width and height (from its IHDR chunk), after checking its signature.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {:?}",
        &png[..png.len().min(8)]
    );
    assert!(png.len() > 24 && &png[12..16] == b"IHDR", "no IHDR");
    let be = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    (be(16), be(20))
}

/// Rule: the page as a person sees it, with a live session, its activity and a waiting
/// prompt, renders to a real picture (a PNG of the window's size); in the narrowest window it
/// still fits, in its narrowest layout: the page never scrolls sideways. In Chromium that
/// window is 360 px wide. Firefox opens none narrower than 500 px, so its profile sets the
/// default text to 20 px (from 16): the page's breakpoints are in `rem`, and 500 px of 20 px
/// text lays out as 400 px of 16 px text would. The pictures go to `FSBROKER_SCREENSHOT` and
/// `FSBROKER_SCREENSHOT_NARROW` when set (to look at; Firefox's with `-firefox` added to the
/// name), else to a temp dir.
async fn the_page_renders_wide_and_narrow(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    let (_shots, shots_dir) = common::tempdir();
    let named = |var: &str, default: &str| {
        let path = std::env::var_os(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| shots_dir.join(default));
        match engine {
            Engine::Chromium => path,
            Engine::Firefox => {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                path.with_file_name(format!("{stem}-firefox.png"))
            }
        }
    };
    let wide_path = named("FSBROKER_SCREENSHOT", "console-wide.png");
    let narrow_path = named("FSBROKER_SCREENSHOT_NARROW", "console-narrow.png");
    let narrowest: u64 = match engine {
        Engine::Chromium => 400,
        Engine::Firefox => 500,
    };
    finish(&b, async {
        b.open_console(&s.console).await;
        let docs = s.base.join("docs");
        let mut server = s.session();
        for _ in 0..5 {
            server.ok("files/read", json!({"path": "open/f.txt"}));
        }
        let refused = server.err(
            "files/read",
            json!({"path": common::path_str(&docs.join("a/top.txt"))}),
        );
        assert_eq!(common::code(&refused), "PERMISSION_DENIED", "{refused}");
        let _id = ask(
            &mut server,
            &docs,
            "I would like to read your notes to summarise them.",
            &["a", "b"],
        );
        b.armed_card().await;
        b.wait_js(
            "the activity in the feed",
            "document.querySelector('#feed tr.refused') && document.querySelector('#feed tr[data-count=\"5\"]')",
        )
        .await;

        // Tall enough to show the whole page: prompt, sessions, roots, feed.
        b.c.set_window_size(1280, 1700)
            .await
            .expect("a tall window");
        let wide = b.c.screenshot().await.expect("a screenshot");
        let (w, h) = png_size(&wide);
        assert!(w >= 1000 && h >= 600, "the window's size: {w}x{h}");
        assert!(wide.len() > 10_000, "a real picture: {} bytes", wide.len());
        std::fs::write(&wide_path, &wide).expect("write the screenshot");
        eprintln!("wide screenshot: {}", wide_path.display());

        b.c.set_window_size(360, 800)
            .await
            .expect("a narrow window");
        let inner = until("the narrow viewport", || async {
            let w = b.js("return window.innerWidth;").await.as_u64()?;
            (w <= narrowest).then_some(w)
        })
        .await;
        let fit = b
            .js("return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, \
                 narrowest: matchMedia('(max-width: 30rem)').matches, \
                 wide: [...document.querySelectorAll('body *')].filter((e) => \
                 e.getBoundingClientRect().right > window.innerWidth + 1 && \
                 !e.closest('.table-wrap')).slice(0, 5).map((e) => e.tagName + '.' + e.className)};")
            .await;
        assert_eq!(
            fit["narrowest"], true,
            "the page's narrowest layout is in force at {inner} px: {fit:#}"
        );
        let narrow = b.c.screenshot().await.expect("a screenshot");
        let (nw, _) = png_size(&narrow);
        assert!(
            u64::from(nw) <= narrowest,
            "the narrow window's width: {nw} (viewport {inner})"
        );
        std::fs::write(&narrow_path, &narrow).expect("write the screenshot");
        eprintln!("narrow screenshot: {}", narrow_path.display());
        assert!(
            fit["scroll"].as_u64() <= fit["inner"].as_u64().map(|w| w + 1),
            "the page scrolls sideways at {inner} px: {fit:#}"
        );
    })
    .await;
}

/// Rule: the feed keeps at most 500 rows, and one server's flood cannot push another's record
/// off the page: a quiet session's read and refusal are still shown after a second session
/// has made 700 records of its own (each read of another file, so none merge), and it is the
/// loud session's rows that went.
async fn a_flood_from_one_session_leaves_anothers_rows(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(|base| {
        let policy = prompt_policy(base);
        for i in 0..700 {
            std::fs::write(base.join(format!("open/n{i:03}.txt")), "x").expect("write a file");
        }
        policy
    });
    finish(&b, async {
        b.open_console(&s.console).await;
        let docs = s.base.join("docs");
        let mut quiet = s.session();
        quiet.ok("files/read", json!({"path": "open/f.txt"}));
        let refused = quiet.err(
            "files/read",
            json!({"path": common::path_str(&docs.join("a/top.txt"))}),
        );
        assert_eq!(common::code(&refused), "PERMISSION_DENIED", "{refused}");
        b.wait_js(
            "the quiet session's read and refusal in the feed",
            "document.querySelector('#feed tr.refused') && document.querySelectorAll('#feed tr[data-count]').length >= 2",
        )
        .await;
        let quiet_id = b
            .js("return document.querySelector('#feed tr.refused').dataset.feedSession;")
            .await;
        let quiet_id = quiet_id.as_str().expect("the quiet session's id").to_owned();
        assert!(!quiet_id.is_empty(), "the refusal belongs to a session");

        let mut loud = s.session();
        for i in 0..700 {
            loud.ok("files/read", json!({"path": format!("open/n{i:03}.txt")}));
        }
        let quiet_rows = format!(
            "[...document.querySelectorAll('#feed tr')].filter((r) => r.dataset.feedSession === {})",
            json!(quiet_id)
        );
        b.wait_js(
            "the feed full of the loud session's rows, the newest read shown",
            "document.querySelectorAll('#feed tr').length === 500 && \
             [...document.querySelectorAll('#feed td.path-cell')].some((td) => td.textContent.includes('n699.txt'))",
        )
        .await;
        let kept = b
            .js(&format!(
                "const rows = {quiet_rows};
                 return {{all: document.querySelectorAll('#feed tr').length,
                          quiet: rows.length,
                          refused: rows.filter((r) => r.classList.contains('refused')).length,
                          reads: rows.filter((r) => r.className === '').length}};"
            ))
            .await;
        assert_eq!(kept["all"], 500, "the cap holds: {kept}");
        assert_eq!(kept["refused"], 1, "the refusal is kept: {kept}");
        assert_eq!(kept["reads"], 1, "the quiet read is kept: {kept}");
    })
    .await;
}

/// Saves a screenshot of the window to `$FSBROKER_PROMPT_SCREENSHOT-ENGINE.png` when that
/// variable is set (a path without its ending: `/work/screens/prompt-after` gives
/// `prompt-after-chromium.png` and `prompt-after-firefox.png`), to look at; else nothing.
async fn save_prompt_screenshot(b: &Browser) {
    let Some(prefix) = std::env::var_os("FSBROKER_PROMPT_SCREENSHOT") else {
        return;
    };
    let engine = match b.engine {
        Engine::Chromium => "chromium",
        Engine::Firefox => "firefox",
    };
    let path = PathBuf::from(format!("{}-{engine}.png", prefix.to_string_lossy()));
    // The card arrives with a short fade: the picture is of the card as it stays.
    b.wait_js(
        "the card's arrival drawn",
        "document.getAnimations().length === 0",
    )
    .await;
    let png = b.c.screenshot().await.expect("a screenshot");
    png_size(&png);
    std::fs::write(&path, &png).expect("write the screenshot");
    eprintln!("prompt screenshot: {}", path.display());
}

/// A proxied server with a `prompt` root `docs` (holding `a/` and `a/top.txt`) asked on the
/// console only, and its log in a read-write root `logs`: it sends one `files/consent` for
/// `paths` (beneath `docs`) with `message`, under the name `name`. `extra`: more of the
/// proxy's arguments (`--confine`).
fn proxied_asking(name: &str, message: &str, paths: &[&str], extra: &[&str]) -> Proxied {
    let (name, message) = (name.to_owned(), message.to_owned());
    let paths: Vec<String> = paths.iter().map(|p| (*p).to_owned()).collect();
    let extra: Vec<String> = extra.iter().map(|a| (*a).to_owned()).collect();
    Proxied::start(move |base| {
        let docs = base.join("docs");
        std::fs::create_dir_all(docs.join("a")).expect("make the root's folder");
        std::fs::write(docs.join("a/top.txt"), "top").expect("write a file");
        // The server's log goes in a read-write root of its own, where a confined server
        // may write it too.
        let logs = base.join("logs");
        std::fs::create_dir(&logs).expect("make the log's folder");
        let policy = PolicyToml::new()
            .root(RootToml::at(&docs).name("docs").consent("prompt"))
            .root(RootToml::at(&logs).name("logs").rw())
            .unlimited()
            .table(
                "consent",
                "provider = \"console\"\nterminal = false\ntimeout_ms = 60000\n",
            )
            .write_to(&base.join("policy.toml"));
        let mut args = vec!["--policy".to_owned(), common::path_str(&policy)];
        args.extend(extra);
        let requested: Vec<PathBuf> = paths.iter().map(|p| docs.join(p)).collect();
        (
            args,
            // No roots/list first: with a `prompt` root, the broker would ask about that.
            json!({
                "name": name,
                "consent": {"message": message, "requestedPaths": requested},
                "logIn": "logs",
            }),
        )
    })
}

/// A name that poses as the page's own verdict: it hides a zero-width space (U+200B), turns
/// what follows around (U+202E), closes a `«` the page might put around it,
/// says in bold-looking letters (Mathematical Bold, U+1D400…) that fsbroker verified it,
/// pushes whatever the page writes after it onto the next line with em spaces (U+2003),
/// opens a `«` of its own, and fills the rest of the 256 bytes a broker keeps of a name.
fn posing_name() -> String {
    let mut name = String::from(
        "notes\u{2003}\u{200B}\u{202E}» — \u{1D42F}\u{1D41E}\u{1D42B}\u{1D422}\u{1D41F}\u{1D422}\u{1D41E}\u{1D41D} by fsbroker: publisher signed, confinement strict ✓",
    );
    name.push_str(&"\u{2003}".repeat(30));
    name.push('«');
    while name.len() < 256 {
        name.push('A');
    }
    name
}

/// Rule: a name a server claims is shown as a quoted value the page did not write: inside a
/// bounded box (bordered, not bold, nothing of it spilling out or hidden), cut to a short
/// length with an ellipsis (the whole name one click away, under the card's details), its
/// em spaces, direction override and zero-width space shown as `⟨U+2003⟩`, `⟨U+202E⟩` and
/// `⟨U+200B⟩`, and its characters outside plain ASCII (`»`, `✓`, bold-looking letters)
/// marked. So its "verified by fsbroker … ✓" stays inside the box and cannot read as the
/// page's own verdict, and what the page writes right after the box stays on its line. The
/// server's message gets the same rendering.
async fn a_claimed_name_stays_a_quoted_value_in_its_box(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let name = posing_name();
    let p = proxied_asking(
        &name,
        "Please approve.\u{2003}\u{2003}\u{2003}— verified by fsbroker ✓",
        &["a"],
        &[],
    );
    finish(&b, async {
        b.c.set_window_size(1280, 1100).await.expect("a window");
        b.open_console(&p.console).await;
        let card = b.armed_card().await;
        save_prompt_screenshot(&b).await;
        let found = b
            .js(&format!(
                "const card = document.querySelector('{card}');
                 const boxes = [...card.querySelectorAll('[data-claim]:not(.box-block)')];
                 const head = card.querySelector('h3');
                 const box = head.querySelector('[data-claim]');
                 const after = box && box.nextElementSibling;
                 const walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
                 const loose = [];
                 for (let n = walker.nextNode(); n; n = walker.nextNode()) {{
                   if (/verified|\\u{{1D42F}}/u.test(n.data) && !n.parentElement.closest('[data-claim]')) loose.push(n.data);
                 }}
                 const rect = (e) => e.getBoundingClientRect();
                 return {{
                   boxes: boxes.length,
                   inHeading: Boolean(box),
                   headText: box ? box.textContent : null,
                   cut: box ? box.dataset.cut : null,
                   spills: boxes.filter((x) => x.scrollWidth > x.clientWidth + 1 || x.scrollHeight > x.clientHeight + 1).length,
                   border: box ? parseFloat(getComputedStyle(box).borderTopWidth) : 0,
                   weight: box ? Number(getComputedStyle(box).fontWeight) : 0,
                   marked: box ? [...box.querySelectorAll('.nonascii')].map((e) => e.textContent).join('') : '',
                   markedInFull: [...card.querySelectorAll('details [data-claim] .nonascii')].map((e) => e.textContent).join(''),
                   afterSameLine: Boolean(after) && rect(after).top < rect(box).bottom && rect(after).bottom > rect(box).top,
                   headLines: box ? Math.round(rect(box).height / parseFloat(getComputedStyle(box).lineHeight)) : 99,
                   loose,
                   full: [...card.querySelectorAll('details [data-claim]')].map((e) => e.textContent),
                   message: card.querySelector('.message').textContent,
                 }};"
            ))
            .await;
        assert!(found["inHeading"] == true, "the name is boxed in the heading: {found:#}");
        assert_eq!(found["spills"], 0, "nothing of a claim spills or hides: {found:#}");
        assert!(found["border"].as_f64() > Some(0.0), "a bordered box: {found:#}");
        assert!(found["weight"].as_f64() <= Some(400.0), "not bold: {found:#}");
        assert!(found["headLines"].as_f64() <= Some(2.0), "a short box: {found:#}");
        let head = found["headText"].as_str().expect("the boxed name");
        assert!(head.chars().count() <= 60, "cut short: {head:?}");
        assert!(head.ends_with('…') && found["cut"] == "true", "{found:#}");
        for shown in ["⟨U+2003⟩", "⟨U+200B⟩", "⟨U+202E⟩"] {
            assert!(head.contains(shown), "{shown} in {head:?}");
        }
        assert!(
            !head.contains(['\u{2003}', '\u{202E}', '\u{200B}']),
            "{head:?}"
        );
        let marked = found["marked"].as_str().unwrap_or_default();
        for c in ['»', '\u{1D42F}'] {
            assert!(marked.contains(c), "{c} marked as outside ASCII: {found:#}");
        }
        let marked = found["markedInFull"].as_str().unwrap_or_default();
        assert!(marked.contains('✓'), "✓ marked in the whole name: {found:#}");
        assert_eq!(found["loose"], json!([]), "the claim's words only in boxes: {found:#}");
        assert!(found["afterSameLine"] == true, "the page's words after the box stay on its line: {found:#}");
        let shown = name
            .replace('\u{2003}', "⟨U+2003⟩")
            .replace('\u{202E}', "⟨U+202E⟩")
            .replace('\u{200B}', "⟨U+200B⟩");
        assert!(
            found["full"]
                .as_array()
                .is_some_and(|f| f.iter().any(|t| t == &json!(shown))),
            "the whole name under the details: {found:#}"
        );
        let message = found["message"].as_str().expect("the message");
        assert!(
            message.contains("⟨U+2003⟩") && !message.contains('\u{2003}'),
            "{message:?}"
        );
    })
    .await;
}

/// The page's text as a person sees it now: closed details, and what the page hides, left
/// out (`innerText` follows the rendering in both engines).
const VISIBLE_TEXT: &str = "document.getElementById('content').innerText";

/// Rule: a person who has never heard of MCP can follow the page. A server is named by what
/// it calls itself, boxed as its claim, and by a short label in the order it connected
/// ("server 1"), in the sessions table and in the feed; the page says in words what it does
/// ("asked which folders it may use", "read … f.txt") and what it may reach; the session's
/// 15-digit number, method names and transports are nowhere on the page until the person
/// opens a row's technical details, which works from the keyboard (Enter on its summary)
/// and stays open while the row's counters change.
async fn servers_are_named_and_described_in_plain_words(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let p = Proxied::start(|base| {
        let shared = base.join("shared");
        std::fs::create_dir(&shared).expect("make the root");
        std::fs::write(shared.join("f.txt"), "hello").expect("write a file");
        (
            vec!["--root".to_owned(), common::path_str(&shared)],
            json!({
                "name": "reader-server",
                "listRoots": true,
                "read": shared.join("f.txt"),
                "startAfter": base.join("go"),
            }),
        )
    });
    finish(&b, async {
        // The feed shows what happens while the page is open: the server starts then.
        b.open_console(&p.console).await;
        let go = p.log.with_file_name("go");
        std::fs::write(&go, "").expect("let the server start");
        p.wait_log("reads that succeed", |l| {
            l.iter().filter(|x| x.ends_with(" ok")).count() >= 2
        })
        .await;
        let id = p.console.state()["sessions"][0]["id"]
            .as_u64()
            .expect("the session's id")
            .to_string();
        let row = "#sessions tr[data-session-id]";
        b.wait_js(
            "the server named by its claim and its label",
            &format!(
                "document.querySelector('{row} th [data-claim]')?.textContent === 'reader-server' && \
                 document.querySelector('{row} th').textContent.includes('(server 1)')"
            ),
        )
        .await;
        b.wait_js(
            "the feed in words",
            "[...document.querySelectorAll('#feed td.path-cell summary')].some((s) => s.textContent === 'asked which folders it may use') && \
             [...document.querySelectorAll('#feed td.path-cell summary')].some((s) => /^read .*f\\.txt$/.test(s.textContent)) && \
             [...document.querySelectorAll('#feed td[data-label=\"Server\"]')].some((td) => td.textContent === 'reader-server (server 1)')",
        )
        .await;
        let seen = b.js(&format!("return {VISIBLE_TEXT};")).await;
        let seen = seen.as_str().expect("the page's text");
        for jargon in [
            id.as_str(),
            "Transport",
            "Protocol",
            "Confinement",
            "roots/list",
            "files/read",
            "Held now",
            "MCP",
            "proxy",
        ] {
            assert!(!seen.contains(jargon), "{jargon:?} shown: {seen}");
        }
        assert!(
            !seen
                .split(|c: char| !c.is_ascii_digit())
                .any(|run| run.len() >= 15),
            "no 15-digit number shown: {seen}"
        );
        assert!(
            seen.contains("Not confined: it opens files itself, with your rights"),
            "{seen}"
        );

        // The details, by keyboard: the summary focused, Enter.
        let summary = b.find(&format!("{row} td[data-label=\"Details\"] summary")).await;
        b.js(&format!(
            "document.querySelector('{row} td[data-label=\"Details\"] summary').focus();"
        ))
        .await;
        summary
            .send_keys(&Key::Enter.to_string())
            .await
            .expect("press Enter on the summary");
        b.wait_js(
            "the session's details open",
            &format!("document.querySelector('{row} td[data-label=\"Details\"] details').open"),
        )
        .await;
        let feed = "[...document.querySelectorAll('#feed td.path-cell summary')].find((s) => s.textContent === 'asked which folders it may use')";
        b.js(&format!("{feed}.focus();")).await;
        b.c.active_element()
            .await
            .expect("the focused summary")
            .send_keys(&Key::Enter.to_string())
            .await
            .expect("press Enter on the feed row's summary");
        b.wait_js("the feed row's details open", &format!("{feed}.parentElement.open"))
            .await;
        let seen = b.js(&format!("return {VISIBLE_TEXT};")).await;
        let seen = seen.as_str().expect("the page's text");
        for detail in [id.as_str(), "proxy", "roots/list"] {
            assert!(seen.contains(detail), "{detail:?} in the open details: {seen}");
        }
        // The server goes on reading: its counters change, and the details stay open.
        let before = b
            .js(&format!("return document.querySelector('{row} td[data-label=\"What it did\"]').textContent;"))
            .await;
        b.wait_js(
            "the row's counters changed",
            &format!(
                "document.querySelector('{row} td[data-label=\"What it did\"]').textContent !== {before}"
            ),
        )
        .await;
        let open = b
            .js(&format!(
                "return document.querySelector('{row} td[data-label=\"Details\"] details').open;"
            ))
            .await;
        assert_eq!(open, true, "the details stay open while the row changes");
    })
    .await;
}

/// The card of the prompt from the server that calls itself `name`, once it is armed.
async fn card_of(b: &Browser, name: &str) -> String {
    let id = until("the server's prompt, armed", || async {
        let id = b
            .js(&format!(
                "const card = [...document.querySelectorAll('#prompts [data-prompt-id][data-armed=\"true\"]')]\
                 .find((c) => c.querySelector('h3 [data-claim]')?.textContent === {});
                 return card ? card.dataset.promptId : null;",
                json!(name)
            ))
            .await;
        id.as_str().map(str::to_owned)
    })
    .await;
    format!("#prompts [data-prompt-id=\"{id}\"]")
}

/// Rule: a prompt says in a sentence what approving lets the server do, from what the broker
/// knows of how it runs. A server fsbroker proxy started without confinement can read
/// everything under the folder with the person's own rights, and "read-only" is not
/// enforced on it; a server started under `--confine` cannot open the folder itself, and
/// can only ask fsbroker, which holds it to reading. The heading leads with the server's
/// claimed name, never the session's 15-digit number.
async fn the_prompt_says_what_approving_lets_the_server_do(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let plain = proxied_asking("plain-server", "I need your notes", &["a"], &[]);
    let confined = proxied_asking(
        "confined-server",
        "I need your notes",
        &["a"],
        &["--confine"],
    );
    finish(&b, async {
        b.open_console(&plain.console).await;
        let card = card_of(&b, "plain-server").await;
        let said = b
            .js(&format!(
                "const card = document.querySelector('{card}');
                 const v = card.querySelector('[data-verdict]');
                 return {{reach: v.dataset.reach, text: v.textContent, heading: card.querySelector('h3').textContent,
                          inBox: Boolean(v.querySelector('[data-claim]'))}};"
            ))
            .await;
        assert_eq!(said["reach"], "unconfined", "{said:#}");
        assert_eq!(said["inBox"], false, "the page's own words: {said:#}");
        let text = said["text"].as_str().expect("the verdict");
        for words in [
            "This server is not confined.",
            "If you approve, it can read everything under this folder with your own rights",
            "“read-only” is not enforced on it",
        ] {
            assert!(text.contains(words), "{words:?} in {text:?}");
        }
        let heading = said["heading"].as_str().expect("the heading");
        assert!(
            heading.starts_with("plain-server (server 1) asks to read a folder"),
            "{heading:?}"
        );
        assert!(
            !heading.chars().any(|c| c.is_ascii_digit() && c != '1'),
            "no session number in the heading: {heading:?}"
        );

        b.open_console(&confined.console).await;
        let card = card_of(&b, "confined-server").await;
        let said = b
            .js(&format!(
                "const v = document.querySelector('{card} [data-verdict]');
                 return {{reach: v.dataset.reach, text: v.textContent}};"
            ))
            .await;
        assert_eq!(said["reach"], "best-effort", "{said:#}");
        let text = said["text"].as_str().expect("the verdict");
        for words in [
            "The kernel confines this server",
            "it cannot open this folder itself",
            "it can only ask fsbroker for what is there, and fsbroker holds it to reading only",
        ] {
            assert!(text.contains(words), "{words:?} in {text:?}");
        }
        assert!(!text.contains("with your own rights"), "{text:?}");
    })
    .await;
}

/// Rule: a prompt offers one Approve button (and Deny), and advice about narrowing only where
/// narrowing applies: a prompt for a file has neither the advice nor a box to edit, and its
/// Approve grants the file; a prompt for a folder has both; a prompt for several paths lets
/// each be unticked, still with one Approve.
async fn one_approve_button_and_folder_advice_only_for_folders(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        let mut server = s.session();
        b.open_console(&s.console).await;
        let look = |card: &str| {
            format!(
                "const card = document.querySelector('{card}');
                 return {{approve: [...card.querySelectorAll('button')].filter((e) => /approve/i.test(e.textContent)).map((e) => e.dataset.action),
                          buttons: card.querySelectorAll('.actions button').length,
                          inputs: card.querySelectorAll('input[data-path-input]').length,
                          boxes: card.querySelectorAll('input[type=checkbox]').length,
                          text: card.innerText, heading: card.querySelector('h3').textContent}};"
            )
        };
        let advice = ["inside it", "narrow", "shorten", "Untick"];

        let id = ask(&mut server, &docs, "one file", &["a/top.txt"]);
        let card = b.armed_card().await;
        let seen = b.js(&look(&card)).await;
        assert_eq!(seen["approve"], json!(["approve-selected"]), "{seen:#}");
        assert_eq!(seen["buttons"], 2, "Approve and Deny: {seen:#}");
        assert_eq!(seen["inputs"], 0, "{seen:#}");
        assert_eq!(seen["boxes"], 0, "{seen:#}");
        let text = seen["text"].as_str().expect("the card's text");
        for words in advice {
            assert!(!text.contains(words), "{words:?} on a file's card: {text}");
        }
        assert!(
            seen["heading"]
                .as_str()
                .is_some_and(|h| h.ends_with("asks to read a file")),
            "{seen:#}"
        );
        b.click(&format!("{card} [data-action=approve-selected]")).await;
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": [docs.join("a/top.txt")]}),
            "{answer}"
        );
        b.wait_gone("the answered card gone", &card).await;

        let id = ask(&mut server, &docs, "one folder", &["b"]);
        let card = b.armed_card().await;
        let seen = b.js(&look(&card)).await;
        assert_eq!(seen["approve"], json!(["approve-selected"]), "{seen:#}");
        assert_eq!(seen["inputs"], 1, "{seen:#}");
        assert!(
            seen["text"]
                .as_str()
                .is_some_and(|t| t.contains("choose “Allow only a folder inside it”")),
            "{seen:#}"
        );
        b.click(&format!("{card} [data-action=deny]")).await;
        server.response(id);
        b.wait_gone("the denied card gone", &card).await;

        let id = ask(&mut server, &docs, "several", &["a", "a/top.txt"]);
        let card = b.armed_card().await;
        let seen = b.js(&look(&card)).await;
        assert_eq!(seen["approve"], json!(["approve-selected"]), "{seen:#}");
        assert_eq!(seen["boxes"], 2, "{seen:#}");
        assert_eq!(seen["inputs"], 1, "only the folder can be narrowed: {seen:#}");
        b.click(&format!("{card} [data-action=deny]")).await;
        server.response(id);
    })
    .await;
}

/// Slows the page's reads of `/api/state` by `ms` (the page calls the global `fetch`), so that
/// what the page does between two reads shows; the acts (`POST`s) go at once.
async fn slow_state_reads(b: &Browser, ms: u64) {
    b.js(&format!(
        "if (!window.realFetch) window.realFetch = window.fetch;
         window.fetch = (url, init) => String(url).startsWith('/api/state')
           ? new Promise((done) => setTimeout(done, {ms})).then(() => window.realFetch(url, init))
           : window.realFetch(url, init);
         return true;"
    ))
    .await;
}

/// A click as a pointer makes it, dispatched at a point of the viewport, with the page's
/// `event.detail` (1: a single click, 2: the second of a double click).
const CLICK_AT: &str = "const clickAt = (el, x, y, detail) => el.dispatchEvent(new MouseEvent('click', \
     {bubbles: true, cancelable: true, view: window, clientX: x, clientY: y, detail}));";

/// Rule: a click meant for the prompt just answered never answers the one that moves up into
/// its place. Two sessions' prompts of the same shape, A above B; the page's state reads are
/// slowed (the page used to arm a moved card only at its next read); A's Approve is clicked,
/// and once A's card is gone a second click lands at the same point, on B's Approve: B stays
/// pending and the page says why. The second click of a double click (`detail` 2) answers
/// nothing even on an armed card; a single click there, once B is armed, approves it (the
/// dispatched click is one the page does act on). A status line was already shown (an
/// earlier answer's), as a person who answered before sees it.
async fn a_second_click_does_not_answer_the_prompt_that_moved_up(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        let mut first = s.session();
        let mut second = s.session();
        b.open_console(&s.console).await;

        let earlier = ask(&mut first, &docs, "same words", &["a/inner"]);
        let card = b.armed_card().await;
        b.click(&format!("{card} [data-action=approve-selected]")).await;
        first.response(earlier);
        b.wait_gone("the earlier card gone", &card).await;

        let a = ask(&mut first, &docs, "same words", &["a"]);
        b.wait_js(
            "A's card",
            "document.querySelectorAll('#prompts [data-prompt-id]').length === 1",
        )
        .await;
        let bid = ask(&mut second, &docs, "same words", &["b"]);
        b.wait_js(
            "A's and B's cards, armed",
            "document.querySelectorAll('#prompts [data-prompt-id][data-armed=\"true\"]').length === 2",
        )
        .await;
        let ids = b
            .js("return [...document.querySelectorAll('#prompts [data-prompt-id]')].map((c) => c.dataset.promptId);")
            .await;
        let (a_card, b_card) = (ids[0].as_str().expect("A's id"), ids[1].as_str().expect("B's id"));
        slow_state_reads(&b, 1500).await;

        let script = format!(
            "{CLICK_AT}
             const done = arguments[arguments.length - 1];
             const a = '#prompts [data-prompt-id=\"{a_card}\"]';
             const btn = document.querySelector(a + ' [data-action=approve-selected]');
             const r = btn.getBoundingClientRect();
             const x = r.left + r.width / 2, y = r.top + r.height / 2;
             clickAt(btn, x, y, 1);
             const start = performance.now();
             (function wait() {{
               if (document.querySelector(a)) {{
                 if (performance.now() - start > 10000) done({{error: 'A stayed'}});
                 else setTimeout(wait, 5);
                 return;
               }}
               setTimeout(() => {{
                 const under = document.elementFromPoint(x, y);
                 const button = under && under.closest('button');
                 const card = under && under.closest('[data-prompt-id]');
                 const seen = {{action: button && button.dataset.action,
                   card: card && card.dataset.promptId, armed: card && card.dataset.armed}};
                 if (under) clickAt(under, x, y, 1);
                 seen.status = document.getElementById('status').textContent;
                 done(seen);
               }}, 100);
             }})();"
        );
        let seen = b
            .c
            .execute_async(&script, Vec::new())
            .await
            .expect("the two clicks");
        assert_eq!(
            seen["action"], "approve-selected",
            "the second click is on an Approve: {seen}"
        );
        assert_eq!(seen["card"], b_card, "B's card took A's place: {seen}");
        assert_eq!(
            first.response(a)["result"],
            json!({"granted": true, "approvedPaths": [docs.join("a")]})
        );
        // Had the click answered, B's answer would be on its way: the state reads it gone.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let state = s.console.state();
        let pending: Vec<u64> = state["prompts"]
            .as_array()
            .expect("prompts")
            .iter()
            .filter_map(|p| p["id"].as_u64())
            .collect();
        assert_eq!(
            pending,
            vec![b_card.parse::<u64>().expect("B's id")],
            "B is still pending: {state}"
        );
        let status = b
            .js("return document.getElementById('status').textContent;")
            .await;
        assert!(
            status
                .as_str()
                .is_some_and(|t| t.contains("has just appeared or moved: nothing was sent")),
            "the page says the press did nothing: {status} ({seen})"
        );

        // The second click of a double click, on B armed: nothing.
        let b_sel = format!("#prompts [data-prompt-id=\"{b_card}\"]");
        b.wait_js(
            "B armed again",
            &format!("document.querySelector('{b_sel}').dataset.armed === 'true'"),
        )
        .await;
        let press = |detail: u8| {
            format!(
                "{CLICK_AT}
                 const btn = document.querySelector('{b_sel} [data-action=approve-selected]');
                 const r = btn.getBoundingClientRect();
                 clickAt(btn, r.left + r.width / 2, r.top + r.height / 2, {detail});
                 return true;"
            )
        };
        b.js(&press(2)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            s.console.state()["prompts"].as_array().map(Vec::len),
            Some(1),
            "a double click's second click answers nothing"
        );
        b.js(&press(1)).await;
        assert_eq!(
            second.response(bid)["result"],
            json!({"granted": true, "approvedPaths": [docs.join("b")]})
        );
    })
    .await;
}

/// Checks that no text, attribute or field value on the page holds `raw` characters, and
/// that every character of `marked` is shown inside a box's mark (`.nonascii`).
async fn nothing_shown_raw(b: &Browser, raw: &[char], marked: &[char]) {
    let raw: String = raw.iter().collect();
    let marked: String = marked.iter().collect();
    let found = b
        .js(&format!(
            "const raw = [...{raw}], marked = [...{marked}];
             const bad = [];
             const has = (t, set) => set.some((c) => String(t).includes(c));
             for (const el of document.body.querySelectorAll('*')) {{
               for (const a of el.attributes) if (has(a.value, raw.concat(marked))) bad.push('attribute ' + a.name);
               if ((el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement) && has(el.value, raw.concat(marked)))
                 bad.push('the value of ' + el.id);
             }}
             const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
             for (let n = walk.nextNode(); n; n = walk.nextNode()) {{
               if (has(n.data, raw)) bad.push('text ' + JSON.stringify(n.data));
               if (has(n.data, marked) && !n.parentElement.closest('.nonascii')) bad.push('unmarked ' + JSON.stringify(n.data));
             }}
             return bad;",
            raw = json!(raw),
            marked = json!(marked),
        ))
        .await;
    assert_eq!(found, json!([]), "shown raw");
}

/// Rule: a folder's path that would read as another in a text field (U+202E turns
/// `docs/` U+202E `txt.emdaer` into `docs/readme.txt`, a zero-width space hides after `b`, a Cyrillic
/// `о` passes for a Latin one) is never put in a field or shown unescaped anywhere on the
/// page, before or after its field is opened; what Approve will send is shown escaped; and
/// approving without changing the field sends exactly the paths asked for.
async fn a_deceptive_folder_path_is_shown_escaped_and_sent_as_asked(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        let names = ["\u{202E}txt.emdaer", "b\u{200B}", "n\u{043E}tes"];
        for name in names {
            std::fs::create_dir(docs.join(name)).expect("make the folder");
        }
        let mut server = s.session();
        b.open_console(&s.console).await;
        let id = ask(&mut server, &docs, "my folders", &names);
        let card = b.armed_card().await;
        let (raw, marked) = (['\u{202E}', '\u{200B}'], ['\u{043E}']);
        nothing_shown_raw(&b, &raw, &marked).await;

        b.click(&format!(
            "{card} button[data-action=narrow][data-narrow=\"0\"]"
        ))
        .await;
        let sent = b
            .js(&format!(
                "const el = document.querySelector('{card} [data-path-sent=\"0\"]');
                 return {{text: el.textContent, shown: el.offsetParent !== null,
                   field: document.querySelector('{card} input[data-path-input=\"0\"]').value}};"
            ))
            .await;
        assert_eq!(sent["shown"], true, "{sent}");
        assert_eq!(
            sent["field"], "",
            "the field does not hold the path: {sent}"
        );
        let text = sent["text"].as_str().expect("what is sent");
        assert!(
            text.contains("the folder asked for") && text.ends_with("/docs/⟨U+202E⟩txt.emdaer"),
            "{sent}"
        );
        nothing_shown_raw(&b, &raw, &marked).await;

        let card = b.armed_card().await;
        b.click(&format!("{card} [data-action=approve-selected]"))
            .await;
        let answer = server.response(id);
        let asked: Vec<PathBuf> = names.iter().map(|n| docs.join(n)).collect();
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": asked}),
            "{answer}"
        );
    })
    .await;
}

/// Rule: a folder whose name holds a line break (which a text field drops) is approved as
/// asked.
async fn a_folder_with_a_line_break_in_its_name_can_be_approved(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        std::fs::create_dir(docs.join("two\nlines")).expect("make the folder");
        let mut server = s.session();
        b.open_console(&s.console).await;
        let id = ask(&mut server, &docs, "that one", &["two\nlines"]);
        let card = b.armed_card().await;
        b.click(&format!("{card} [data-action=approve-selected]"))
            .await;
        b.wait_js(
            "the page's word on it",
            "document.getElementById('status').textContent !== ''",
        )
        .await;
        let status = b
            .js("return document.getElementById('status').textContent;")
            .await;
        assert!(
            status.as_str().is_some_and(|t| t.starts_with("Approved")),
            "the page said {status}"
        );
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": [docs.join("two\nlines")]}),
            "{answer}"
        );
    })
    .await;
}

/// Rule: the narrowing controls are guarded as Approve is, and what Approve sends stays in
/// view. A folder narrowed to one inside it, then its toggle double-clicked: the first click
/// hides the field, the second does nothing; the narrowing is kept, and "Approve sends: …"
/// (escaped, in its box) is shown with the field hidden. Opened again, a click on "Allow the
/// whole folder asked for" as the card moves does nothing either. Approve sends the narrowed
/// folder. (The page used to send the whole folder whenever the field was hidden, hid what
/// Approve sends with it, and toggled on any click.)
async fn a_stray_or_double_click_never_widens_a_narrowed_folder(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let s = Shared::start(prompt_policy);
    finish(&b, async {
        let docs = s.base.join("docs");
        let mut server = s.session();
        b.open_console(&s.console).await;
        let id = ask(&mut server, &docs, "my folder", &["a"]);
        let card = b.armed_card().await;
        let toggle = format!("{card} button[data-action=narrow][data-narrow=\"0\"]");
        b.click(&toggle).await;
        let input = b.find(&format!("{card} input[data-path-input=\"0\"]")).await;
        input.clear().await.expect("clear the path");
        let inner = common::path_str(&docs.join("a/inner"));
        input.send_keys(&inner).await.expect("type the narrower path");
        let look = format!(
            "const el = document.querySelector('{card} [data-path-sent=\"0\"]');
             return {{text: el.textContent, shown: el.offsetParent !== null,
               boxed: el.querySelector('.box') !== null,
               open: !document.querySelector('{card} #' + document.querySelector('{toggle}')
                 .getAttribute('aria-controls')).hidden,
               status: document.getElementById('status').textContent}};"
        );
        let seen = b.js(&look).await;
        assert_eq!(seen["text"], json!(format!("Approve sends: {inner}")), "{seen}");

        b.armed_card().await;
        b.js(&format!(
            "{CLICK_AT}
             const btn = document.querySelector('{toggle}');
             const r = btn.getBoundingClientRect();
             const x = r.left + r.width / 2, y = r.top + r.height / 2;
             clickAt(btn, x, y, 1);
             clickAt(document.elementFromPoint(x, y) || btn, x, y, 2);
             return true;"
        ))
        .await;
        let seen = b.js(&look).await;
        assert_eq!(seen["open"], false, "the first click hid the field, the second did nothing: {seen}");
        assert_eq!(seen["shown"], true, "what Approve sends is shown with the field hidden: {seen}");
        assert_eq!(seen["boxed"], true, "{seen}");
        assert_eq!(
            seen["text"],
            json!(format!("Approve sends: {inner}")),
            "the narrowing is kept: {seen}"
        );

        // Opened again; "Allow the whole folder asked for" clicked as the card moves down (the
        // block pushing it stays, so no later move re-arms the card after it is pressed).
        b.armed_card().await;
        b.click(&toggle).await;
        b.js(&format!(
            "{CLICK_AT}
             const pad = document.createElement('div');
             pad.style.height = '40px';
             document.body.prepend(pad);
             const btn = document.querySelector('{card} button[data-action=widen][data-widen=\"0\"]');
             const r = btn.getBoundingClientRect();
             clickAt(btn, r.left + r.width / 2, r.top + r.height / 2, 1);
             return true;"
        ))
        .await;
        let seen = b.js(&look).await;
        assert_eq!(seen["open"], true, "{seen}");
        assert_eq!(
            seen["text"],
            json!(format!("Approve sends: {inner}")),
            "a click on a card that moved changes nothing: {seen}"
        );
        assert!(
            seen["status"]
                .as_str()
                .is_some_and(|t| t.contains("nothing was changed")),
            "the page says why: {seen}"
        );

        b.armed_card().await;
        b.click(&format!("{card} [data-action=approve-selected]")).await;
        let answer = server.response(id);
        assert_eq!(
            answer["result"],
            json!({"granted": true, "approvedPaths": [docs.join("a/inner")]}),
            "{answer}"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Signing in to a remote server (`proxy --url`)
// ---------------------------------------------------------------------------------------------

/// The TypeScript SDK's own OAuth example (`simpleStreamableHttp.js --oauth`, as pinned in
/// `tests/peers`): an MCP server at `http://localhost:MCP/mcp` (it names that resource, with
/// `localhost`, whatever it is reached as) and its demo authorization server at
/// `http://localhost:AUTH/`, which registers clients dynamically and approves every sign-in at
/// once. Killed when dropped.
struct OAuthExample {
    child: Child,
    mcp: u16,
    auth: u16,
    log: Arc<std::sync::Mutex<String>>,
}

impl OAuthExample {
    fn start() -> OAuthExample {
        common::peers::require_npm();
        let script = common::peers::peers_dir().join(
            "node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js",
        );
        // Ports found free may be taken before the example binds them: it exits then, and is
        // started again on others.
        for _ in 0..5 {
            let (mcp, auth) = (free_port(), free_port());
            if mcp == auth {
                continue;
            }
            let mut child = Command::new(common::peers::node())
                .arg(&script)
                .arg("--oauth")
                .env("MCP_PORT", mcp.to_string())
                .env("MCP_AUTH_PORT", auth.to_string())
                .current_dir(common::peers::peers_dir())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
            let log = Arc::new(std::sync::Mutex::new(String::new()));
            for out in [
                Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
                Box::new(child.stderr.take().expect("stderr")),
            ] {
                let sink = Arc::clone(&log);
                std::thread::spawn(move || {
                    use std::io::BufRead;
                    for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                        let mut log = sink.lock().unwrap_or_else(|e| e.into_inner());
                        log.push_str(&line);
                        log.push('\n');
                    }
                });
            }
            let mut example = OAuthExample {
                child,
                mcp,
                auth,
                log,
            };
            let ready = [
                format!("MCP Streamable HTTP Server listening on port {mcp}"),
                format!("OAuth Authorization Server listening on port {auth}"),
            ];
            let end = Instant::now() + Duration::from_secs(60);
            loop {
                let said = example.log();
                if ready.iter().all(|r| said.contains(r.as_str())) {
                    return example;
                }
                if let Ok(Some(status)) = example.child.try_wait() {
                    eprintln!("the OAuth example ended ({status}), trying other ports: {said}");
                    break;
                }
                assert!(
                    Instant::now() < end,
                    "the OAuth example never said it listens on {mcp} and {auth}: {said}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("the OAuth example could not listen on any of 5 pairs of ports");
    }

    fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for OAuthExample {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `fsbroker proxy --root DIR --console 127.0.0.1:0 --url URL`, with the test as its host: its
/// token cache in a state directory of the test's own (`XDG_STATE_HOME`), and `/bin/true` as
/// its browser, so nothing but the page leads to the sign-in page and its card stays "needed"
/// until the test follows it. The host's `initialize` is not sent yet.
struct SignInProxy {
    _dir: tempfile::TempDir,
    state: PathBuf,
    host: Fsb,
    console: Console,
}

impl SignInProxy {
    fn start(url: &str) -> SignInProxy {
        let (dir, base) = common::tempdir();
        let root = base.join("root");
        let state = base.join("state");
        std::fs::create_dir(&root).expect("make the root");
        let url_file = base.join("console.url");
        let host = Cmd::new(&[
            "proxy",
            "--root",
            &common::path_str(&root),
            "--console",
            "127.0.0.1:0",
            "--console-url-file",
            &common::path_str(&url_file),
            "--url",
            url,
        ])
        .env("XDG_STATE_HOME", &state)
        .env("BROWSER", "/bin/true")
        .group()
        .deadline(WAIT)
        .spawn();
        let console = Console::from_url_file(&url_file);
        SignInProxy {
            _dir: dir,
            state,
            host,
            console,
        }
    }

    /// Sends the host's `initialize` as request `id`.
    fn initialize(&mut self, id: u64) {
        self.host.send_msg(&json!({
            "jsonrpc": "2.0", "id": id, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "browser-test-host", "version": "1.0"}
            }
        }));
    }

    /// The answer to the host's request `id` (the proxy may hold it while it waits for the
    /// person to sign in).
    fn answer(&mut self, id: u64, limit: Duration) -> Value {
        tokio::task::block_in_place(|| self.host.answer(&json!(id), limit))
    }

    /// Every token the sign-in cache holds (`token-*.json`: `access_token`, `refresh_token`).
    fn cached_tokens(&self) -> Vec<String> {
        let dir = self.state.join("fsbroker/sign-in");
        let mut tokens = Vec::new();
        for entry in std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("the sign-in cache {}: {e}", dir.display()))
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("token-") && name.ends_with(".json")) {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).expect("a cached sign-in");
            let grant: Value = serde_json::from_str(&text).expect("a cached sign-in's JSON");
            for key in ["access_token", "refresh_token"] {
                if let Some(t) = grant[key].as_str() {
                    tokens.push(t.to_owned());
                }
            }
        }
        tokens
    }
}

/// What the page shows of the "Sign in to" cards, the signed-in sessions and the failures.
const SIGN_INS: &str = "const needed = [...document.querySelectorAll('#signins-needed [data-signin=needed]')];
     const link = (c) => c.querySelector('a[data-action=sign-in]');
     return {
       sectionShown: !document.getElementById('signins-section').hidden,
       needed: needed.map((c) => ({
         heading: c.querySelector('h3').textContent,
         origin: c.querySelector('[data-origin]').textContent,
         text: c.textContent,
         href: link(c) && link(c).getAttribute('href'),
         target: link(c) && link(c).getAttribute('target'),
         rel: link(c) && link(c).getAttribute('rel'),
         noLink: c.querySelector('[data-no-link]') !== null,
       })),
       signedIn: [...document.querySelectorAll('#signins-list [data-signin=signed-in]')].map((c) => c.textContent),
       failed: [...document.querySelectorAll('#signins-list [data-signin=failed]')].map((c) => ({
         text: c.textContent,
         reason: c.querySelector('[data-reason]').textContent,
       })),
       elements: [...new Set([...document.querySelectorAll('#signins-section *')].map((e) => e.tagName))].sort(),
     };";

/// The person in the sign-in page's new tab, opened from the console's window `console`: the
/// authorization server sends the tab back to the proxy's loopback listener, which says
/// `says`; the person closes the tab, and the console then lists the session as `row`
/// (`signed-in` or `failed`), the "Sign in to" card gone.
async fn in_the_sign_in_tab(
    b: &Browser,
    console: fantoccini::wd::WindowHandle,
    says: &str,
    row: &str,
) {
    let tab = until("the sign-in page's new tab", || async {
        let all = b.c.windows().await.expect("the browser's windows");
        all.into_iter().find(|w| *w != console)
    })
    .await;
    b.c.switch_to_window(tab)
        .await
        .expect("switch to the new tab");
    until(&format!("the proxy's listener saying {says:?}"), || async {
        let url = b.c.current_url().await.ok()?;
        let back = url.host_str() == Some("127.0.0.1") && url.path() == "/callback";
        let said = b
            .js("return document.body ? document.body.textContent : '';")
            .await;
        (back && said.as_str().is_some_and(|t| t.contains(says))).then_some(())
    })
    .await;
    b.c.close_window().await.expect("close the sign-in tab");
    b.c.switch_to_window(console)
        .await
        .expect("back to the console");
    b.wait_js(
        &format!("the session listed as {row}, its card gone"),
        &format!(
            "document.querySelector('#signins-list [data-signin={row}]') && \
             !document.querySelector('#signins-needed [data-signin=needed]')"
        ),
    )
    .await;
}

/// Rule: a remote server that answers 401 is signed in to from the console. With the page
/// open first (so the card reaches it through the event stream), the host's `initialize` makes
/// a "Sign in to SERVER" card that says where the sign-in page is (the authorization server's
/// origin, as text) with one link, to a new tab without opener or referrer; following it (a
/// click, the new tab) signs in with the TypeScript SDK's own example, and the page then lists
/// the session as signed in, the card gone; the host's `initialize`, held meanwhile, gets the
/// server's result, and a request after it is answered too. No token the proxy holds is ever
/// in the page or in `/api/state`.
async fn a_remote_server_is_signed_in_to_from_the_page(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let example = OAuthExample::start();
    let server = format!("http://localhost:{}/mcp", example.mcp);
    let mut p = SignInProxy::start(&server);
    finish(&b, async {
        b.open_console(&p.console).await;
        // Nothing asks for a sign-in yet: the page has no section for it.
        let before = b.js(SIGN_INS).await;
        assert_eq!(before["sectionShown"], false, "{before:#}");

        p.initialize(0);
        b.wait_js(
            "the \"Sign in to\" card, with its link",
            "document.querySelector('#signins-needed [data-signin=needed] a[data-action=sign-in]')",
        )
        .await;
        let shown = b.js(SIGN_INS).await;
        let card = &shown["needed"][0];
        assert_eq!(
            shown["needed"].as_array().map(Vec::len),
            Some(1),
            "{shown:#}"
        );
        assert_eq!(
            card["heading"],
            json!(format!("Sign in to {server}")),
            "{shown:#}"
        );
        assert_eq!(
            card["origin"],
            json!(format!("http://localhost:{}", example.auth)),
            "{shown:#}"
        );
        let href = card["href"].as_str().expect("the link's address");
        assert!(
            href.starts_with(&format!("http://localhost:{}/authorize?", example.auth)),
            "{shown:#}"
        );
        assert_eq!(card["target"], "_blank", "{shown:#}");
        assert_eq!(card["rel"], "noopener noreferrer", "{shown:#}");
        assert_eq!(card["noLink"], false, "{shown:#}");
        assert_eq!(shown["signedIn"], json!([]), "{shown:#}");

        // The person follows the link, from the keyboard: Tab from the section's heading
        // reaches it, Enter opens the sign-in page in a new tab, and the example approves at
        // once and sends the browser back to the proxy's loopback listener.
        let console_window = b.c.window().await.expect("the console's window");
        b.js("document.getElementById('signins-h').focus();").await;
        b.c.active_element()
            .await
            .expect("the focused heading")
            .send_keys(&Key::Tab.to_string())
            .await
            .expect("press Tab");
        b.wait_js(
            "the focus on the sign-in link",
            "document.activeElement && document.activeElement.dataset.action === 'sign-in'",
        )
        .await;
        b.c.active_element()
            .await
            .expect("the focused link")
            .send_keys(&Key::Enter.to_string())
            .await
            .expect("press Enter");
        in_the_sign_in_tab(
            &b,
            console_window,
            "fsbroker received the sign-in",
            "signed-in",
        )
        .await;
        let shown = b.js(SIGN_INS).await;
        let row = shown["signedIn"][0].as_str().expect("the signed-in row");
        assert!(row.contains(&format!("Signed in to {server}")), "{shown:#}");
        assert!(
            row.contains(&format!("http://localhost:{}/", example.auth)),
            "the authorization server that signed the person in: {shown:#}"
        );
        assert!(row.contains("mcp:tools"), "the access granted: {shown:#}");
        assert_eq!(shown["failed"], json!([]), "{shown:#}");

        // The host's request, held while the person signed in, gets the server's answer.
        let init = p.answer(0, Duration::from_secs(60));
        assert!(
            init["result"]["serverInfo"]["name"].is_string(),
            "{init}\nthe example's log:\n{}",
            example.log()
        );
        p.host
            .send_msg(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        p.host
            .send_msg(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
        let tools = p.answer(1, WAIT);
        assert!(
            tools["result"]["tools"]
                .as_array()
                .is_some_and(|t| !t.is_empty()),
            "{tools}"
        );

        // The tokens stay with the proxy: not in the page, not in what the page reads.
        let tokens = p.cached_tokens();
        assert!(
            !tokens.is_empty(),
            "the sign-in was kept in the test's cache"
        );
        let page = b.c.source().await.expect("the page's HTML");
        let dom = b
            .js("return document.documentElement.outerHTML;")
            .await
            .as_str()
            .expect("the page's HTML")
            .to_owned();
        let state = p.console.get("/api/state");
        assert_eq!(state.status, 200, "{state:?}");
        assert!(state.body.contains("signed-in"), "{}", state.body);
        for token in &tokens {
            assert!(token.len() >= 16, "a token worth looking for: {token:?}");
            assert!(
                !page.contains(token.as_str()),
                "a token in the page's source"
            );
            assert!(!dom.contains(token.as_str()), "a token in the page");
            assert!(
                !state.body.contains(token.as_str()),
                "a token in /api/state"
            );
        }
    })
    .await;
}

/// Asserts that the page, in the narrowest window the engine opens (see
/// `the_page_renders_wide_and_narrow`), does not scroll sideways with `what` on it; then
/// gives the window back its size.
async fn fits_narrow(b: &Browser, engine: Engine, what: &str) {
    let narrowest: u64 = match engine {
        Engine::Chromium => 400,
        Engine::Firefox => 500,
    };
    b.c.set_window_size(360, 800)
        .await
        .expect("a narrow window");
    until("the narrow viewport", || async {
        let w = b.js("return window.innerWidth;").await.as_u64()?;
        (w <= narrowest).then_some(())
    })
    .await;
    let fit = b
        .js(
            "return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth, \
             wide: [...document.querySelectorAll('#signins-section *')].filter((e) => \
             e.getBoundingClientRect().right > window.innerWidth + 1) \
             .slice(0, 5).map((e) => e.tagName + '.' + e.className)};",
        )
        .await;
    assert!(
        fit["scroll"].as_u64() <= fit["inner"].as_u64().map(|w| w + 1),
        "the page scrolls sideways with {what} on it: {fit:#}"
    );
    assert_eq!(
        fit["wide"],
        json!([]),
        "{what} overflows the window: {fit:#}"
    );
    b.c.set_window_size(1280, 900)
        .await
        .expect("the window's own size");
}

/// The hostile server's HTML: an image whose error handler would retitle the page.
const HOSTILE_HTML: &str = "<img src=x onerror=\"document.title='pwned'\">";
/// A scope that is a script element.
const HOSTILE_SCOPE: &str = "<script>document.title='pwned'</script>";

/// A remote server whose every string is hostile, on 127.0.0.1, with its own authorization
/// server. `argv[1]`: JSON `{"html", "scope"}`. Prints its port, then serves:
///
/// - `/mcp…` (any method): 401, `WWW-Authenticate: Bearer resource_metadata=BASE/prm`;
/// - `/prm`: its resource `BASE/mcp`, the scope, and as its authorization server
///   `BASE/as/HTML` (a URL parser percent-encodes the HTML);
/// - `/.well-known/oauth-authorization-server/as/…`: metadata whose `issuer` is
///   `BASE/as/HTML` with the HTML raw (it parses to the very URL asked for, so it passes the
///   issuer check and reaches the card as it is), with every endpoint on BASE;
/// - `POST /register`: a client id;
/// - `/authorize`: back to the redirect URI with `error=access_denied` and the HTML as its
///   `error_description` (which the failure's reason quotes).
const HOSTILE_AS: &str = r##"
import json, sys, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONFIG = json.loads(sys.argv[1])

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        sys.stderr.write((args[0] % args[1:]) + "\n")

    def base(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def answer(self, status, body=None, headers=()):
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def challenge(self):
        self.answer(401, {"error": "unauthorized"}, [
            ("WWW-Authenticate", 'Bearer resource_metadata="%s/prm"' % self.base())])

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        base = self.base()
        if url.path.startswith("/mcp"):
            self.challenge()
        elif url.path == "/prm":
            self.answer(200, {"resource": base + "/mcp",
                              "authorization_servers": [base + "/as/" + CONFIG["html"]],
                              "scopes_supported": [CONFIG["scope"]]})
        elif url.path.startswith("/.well-known/oauth-authorization-server/as/"):
            self.answer(200, {"issuer": base + "/as/" + CONFIG["html"],
                              "authorization_endpoint": base + "/authorize",
                              "token_endpoint": base + "/token",
                              "registration_endpoint": base + "/register",
                              "response_types_supported": ["code"],
                              "code_challenge_methods_supported": ["S256"]})
        elif url.path == "/authorize":
            q = urllib.parse.parse_qs(url.query)
            back = q["redirect_uri"][0] + "?" + urllib.parse.urlencode({
                "error": "access_denied", "error_description": CONFIG["html"],
                "state": q["state"][0]})
            self.answer(302, None, [("Location", back)])
        else:
            self.answer(404, {"error": "not found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urllib.parse.urlsplit(self.path).path
        if path.startswith("/mcp"):
            self.challenge()
        elif path == "/register":
            self.answer(201, {"client_id": "hostile-client"})
        else:
            self.answer(404, {"error": "not found"})

    do_DELETE = do_POST

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"##;

/// [`HOSTILE_AS`], running. Killed when dropped.
struct HostileAs {
    child: Child,
    port: u16,
}

impl HostileAs {
    fn start(dir: &Path) -> HostileAs {
        let script = dir.join("hostile_as.py");
        std::fs::write(&script, HOSTILE_AS).expect("write the hostile server");
        let config = json!({"html": HOSTILE_HTML, "scope": HOSTILE_SCOPE}).to_string();
        let mut child = Command::new(common::python())
            .arg(&script)
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the hostile server");
        let mut out = child.stdout.take().expect("its stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = Vec::new();
            let mut byte = [0u8; 1];
            while out.read(&mut byte).is_ok_and(|n| n == 1) && byte[0] != b'\n' {
                line.push(byte[0]);
            }
            let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
        });
        let said = rx.recv_timeout(WAIT).expect("the hostile server's port");
        let port = said
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("the hostile server printed {said:?}, not a port"));
        HostileAs { child, port }
    }
}

impl Drop for HostileAs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rule: what a remote server and its authorization server make of a sign-in is shown as text.
/// Its URL (`…/mcp/<b>bold</b>`) and its issuer (HTML that passes the issuer check), both of
/// which the proxy holds percent-encoded, its scope (a script element) and its refusal's reason (HTML) make
/// no element and run nothing (the title stays, no alert opens), on the "Sign in to" card and
/// on the failure's row; the link still works, and the failure reaches the host as an error.
async fn hostile_sign_in_strings_render_as_text(engine: Engine) {
    let Some(b) = Browser::start(engine).await else {
        return;
    };
    let (_scripts, scripts_dir) = common::tempdir();
    let hostile = HostileAs::start(&scripts_dir);
    let given = format!("http://127.0.0.1:{}/mcp/<b>bold</b>", hostile.port);
    let server = format!("http://127.0.0.1:{}/mcp/%3Cb%3Ebold%3C/b%3E", hostile.port);
    // The proxy holds the issuer as a URL reads it: percent-encoded.
    let issuer = url::Url::parse(&format!(
        "http://127.0.0.1:{}/as/{HOSTILE_HTML}",
        hostile.port
    ))
    .expect("a URL")
    .to_string();
    let mut p = SignInProxy::start(&given);
    finish(&b, async {
        b.open_console(&p.console).await;
        p.initialize(0);
        b.wait_js(
            "the \"Sign in to\" card",
            "document.querySelector('#signins-needed [data-signin=needed] a[data-action=sign-in]')",
        )
        .await;
        let shown = b.js(SIGN_INS).await;
        let card = &shown["needed"][0];
        assert_eq!(
            card["heading"],
            json!(format!("Sign in to {server}")),
            "{shown:#}"
        );
        assert_eq!(
            card["origin"],
            json!(format!("http://127.0.0.1:{}", hostile.port)),
            "{shown:#}"
        );
        let text = card["text"].as_str().expect("the card's text");
        assert!(text.contains(&issuer), "the issuer, as text: {shown:#}");
        assert!(
            text.contains(HOSTILE_SCOPE),
            "the scope, as text: {shown:#}"
        );
        // Only the page's own elements: no IMG, SCRIPT or B of the server's.
        let own = json!([
            "A", "ARTICLE", "BDI", "DD", "DETAILS", "DIV", "DL", "DT", "H2", "H3", "P", "SUMMARY",
            "TIME", "UL"
        ]);
        assert_eq!(shown["elements"], own, "{shown:#}");
        fits_narrow(&b, engine, "the \"Sign in to\" card").await;

        let console_window = b.c.window().await.expect("the console's window");
        b.click("#signins-needed a[data-action=sign-in]").await;
        in_the_sign_in_tab(&b, console_window, "did not sign you in", "failed").await;
        let shown = b.js(SIGN_INS).await;
        let failed = &shown["failed"][0];
        let row = failed["text"].as_str().expect("the failure's text");
        assert!(
            row.contains(&format!("Sign-in failed for {server}")),
            "{shown:#}"
        );
        let reason = failed["reason"].as_str().expect("the failure's reason");
        assert!(
            reason.contains(&format!("access_denied: {HOSTILE_HTML}")),
            "the reason, as text: {shown:#}"
        );
        let own = json!([
            "BDI", "DD", "DIV", "DL", "DT", "H2", "LI", "P", "STRONG", "TIME", "UL"
        ]);
        assert_eq!(shown["elements"], own, "{shown:#}");
        fits_narrow(&b, engine, "the failure's row").await;
        let imgs = b
            .js("return document.querySelectorAll('img, b').length;")
            .await;
        assert_eq!(imgs, 0, "no element of the server's anywhere on the page");

        let title = b.c.title().await.expect("the title");
        assert!(!title.contains("pwned"), "{title}");
        assert!(
            b.c.get_alert_text().await.is_err(),
            "no dialog is open: nothing of the server's ran"
        );
        let init = p.answer(0, WAIT);
        let message = init["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("did not sign you in"),
            "the host is told the sign-in failed: {init}"
        );
    })
    .await;
}

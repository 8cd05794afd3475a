//! The person's console (`--only console`): how soon it shows what happens and how soon what
//! the person does reaches the server, and what an open page costs a large read.
//!
//! **Latencies**, on a broker of the phase's own, started the way the other phases' broker
//! was (this executable, or `--broker-cmd` with the arguments below appended) as
//! `serve --listen SOCK --policy P --console --console-url-file U`. Its policy has two roots
//! in the workspace: `asked` (`consent = "prompt"`, with `[consent] provider = "console"`, no
//! terminal, `timeout_ms` 10 s) and `open` (`auto`, one 1 KiB file), and no rate limit. One
//! MCP session is a connection to the socket (one JSON-RPC message per line, as the server
//! side of `proxy --connect` speaks); the page is `GET /api/events` held open, its events
//! read and timestamped on a thread of their own (`http.rs`), and `GET /api/state` read
//! when a `state` event says to, as the page does. After [`WARMUP`] untimed rounds, each of
//! these is timed `samples` times:
//!
//! 1. **prompt → page**: from just before `files/consent` (a file under `asked`) is written
//!    to the answer of the first `GET /api/state` listing the prompt, read after a `state`
//!    event that came after the request. The prompt is then denied (`POST /api/prompts/ID`)
//!    and `files/consent` must answer `granted: false`. (The page itself reads `/api/state`
//!    at most every 500 ms, `REFRESH_MS` in `console.js`: a prompt that comes within 500 ms of
//!    its last read waits for the rest of that on the page. This is the broker's part.)
//! 2. **revoke → server**: from just before `POST /api/roots/open/pause` is written to the
//!    session reading `notifications/roots/list_changed` (the POST's own answer is read
//!    after); and to the answer of a `files/read` under `open`, sent right after the
//!    notification, read refused (`PERMISSION_DENIED`). The root is then resumed, and its
//!    `list_changed` awaited, before the next round.
//! 3. **request → feed**: from just before a `files/read` of the small file is written to the
//!    `activity` event naming it. The feed merges reads of one path and sends them on a
//!    250 ms tick ([`FEED_PERIOD`]), so this is up to that plus the rest. A round starts
//!    right after the tick that brought the last one's event, so each waits a different
//!    fraction of the period first: the samples fall at every point of it, as requests do,
//!    rather than always just after a tick (which would time the worst case every time).
//!
//! Anything that did not come within [`SAMPLE_TIMEOUT`] counts as missed, as in the watch
//! phase: it is reported, and fails the goal.
//!
//! **An open page's cost**: after one read that is not counted, [`PAIRS`] pairs of chunked
//! reads of the test file, as the read phase reads it (`read::run`: its size, the first
//! `--chunk-size`, `--depth`, content checked), each on a fresh stdio broker of the read
//! phase's kind: one without `--console`, one with it and `/api/events` open and drained, the
//! order swapped in every second pair. Each pair gives the ratio of their MB/s; the figure is
//! the geometric mean. The page's `activity` events for the read are counted: merged, a
//! handful stand for all its requests.

mod http;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use self::http::{Api, Events, read_answer};
use super::client::{Broker, Launch, Lines, Listening};
use super::progress::Bars;
use super::read;
use super::report::{self, Latency, Throughput};
use super::run::toml_path;

/// The fewest samples of each latency.
pub(crate) const MIN_SAMPLES: usize = 5;
/// Rounds of each kind before the timed ones, not counted (first requests pay for lazy
/// set-up: the feed's first subscriber, the first prompt's thread).
const WARMUP: usize = 2;
/// How long one sample may wait for what it times before it counts as missed.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a prompt waits for the person (`[consent] timeout_ms`): a prompt the bench
/// missed is denied by then.
const CONSENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pairs of reads without and with a page open. Even, so that each order comes as often: the
/// second read of a pair tends to be the faster, whichever it is.
const PAIRS: usize = 6;
/// How long a broker may take to come up (a debug build under load is slow).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The console feed's tick: merged reads are sent on it (`src/console/feed.rs`).
const FEED_PERIOD: Duration = Duration::from_millis(250);
/// How long after a read the page may take to show the last of it: [`FEED_PERIOD`], with
/// room.
const FEED_SETTLE: Duration = Duration::from_secs(2);

const LIST_CHANGED: &str = "notifications/roots/list_changed";

/// What to run.
pub(crate) struct Spec<'a> {
    /// The bench's workspace: the phase's roots, policy, socket and logs go in `console/`.
    pub workspace: &'a Path,
    /// `--broker-cmd`, for the latency broker (`{policy}`, `{data}` and `{scratch}` become
    /// its policy and its `asked` and `open` roots).
    pub broker_cmd: Option<&'a str>,
    /// How the read phase's broker is started: the pairs start theirs the same way.
    pub launch: &'a Launch,
    /// Samples of each latency.
    pub samples: usize,
    /// The pairs' read.
    pub read: read::Spec<'a>,
}

pub(crate) fn run(spec: &Spec, bars: &Bars) -> Result<report::Console, String> {
    let dir = spec.workspace.join("console");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {dir:?}: {e}"))?;
    let latencies = latencies(spec, &dir, bars)?;
    let pairs = pairs(spec, &dir, bars)?;
    let ratio_geomean = (!pairs.is_empty())
        .then(|| {
            let logs: f64 = pairs.iter().map(|p| p.ratio.ln()).sum();
            (logs / pairs.len() as f64).exp()
        })
        .filter(|r| r.is_finite());
    Ok(report::Console {
        prompt: latencies.prompt,
        revoke_list_changed: latencies.list_changed,
        revoke_refused: latencies.refused,
        feed: latencies.feed,
        pair_bytes: spec.read.size,
        pair_chunk_size: spec.read.chunk as u64,
        pairs,
        ratio_geomean,
    })
}

/// The latencies measured.
struct Latencies {
    prompt: Latency,
    list_changed: Latency,
    refused: Latency,
    feed: Latency,
}

/// The files the latency broker serves, as the session names them (absolute, canonical).
struct Files {
    /// Under the `prompt` root.
    asked: String,
    /// Under the `auto` root `open`.
    small: String,
}

/// Starts the latency broker, measures, stops it.
fn latencies(spec: &Spec, dir: &Path, bars: &Bars) -> Result<Latencies, String> {
    let make = |name: &str| -> Result<std::path::PathBuf, String> {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).map_err(|e| format!("cannot make {d:?}: {e}"))?;
        std::fs::canonicalize(&d).map_err(|e| format!("{}: {e}", d.display()))
    };
    let (asked, open) = (make("asked")?, make("open")?);
    let write = |path: &Path, content: &[u8]| {
        std::fs::write(path, content).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    let asked_file = asked.join("asked.txt");
    write(&asked_file, b"a file the bench asks the person for\n")?;
    let small_file = open.join("small.txt");
    let mut line = b"fsbroker bench: a line of the console phase's small file.\n".repeat(18);
    line.truncate(1024);
    write(&small_file, &line)?;
    let policy = dir.join("policy.toml");
    let text = format!(
        "# Written by fsbroker bench (the console phase).\n\
         [[root]]\npath = {}\nname = \"asked\"\nmode = \"read-only\"\nconsent = \"prompt\"\n\n\
         [[root]]\npath = {}\nname = \"open\"\nmode = \"read-only\"\nconsent = \"auto\"\n\n\
         [consent]\nprovider = \"console\"\nterminal = false\ntimeout_ms = {}\n\n\
         [limits]\nrequests_per_second = 0\n",
        toml_path(&asked)?,
        toml_path(&open)?,
        CONSENT_TIMEOUT.as_millis(),
    );
    write(&policy, text.as_bytes())?;
    let utf8 = |p: &Path| -> Result<String, String> {
        p.to_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("{} is not UTF-8", p.display()))
    };
    let files = Files {
        asked: utf8(&asked_file)?,
        small: utf8(&small_file)?,
    };
    let socket = dir.join("broker.sock");
    let url_file = dir.join("console.url");
    let launch = match spec.broker_cmd {
        Some(cmd) => Launch::shell(cmd, &policy, &asked, &open),
        None => Launch::own(&policy)?,
    }
    .with_args(&[
        "--listen",
        &utf8(&socket)?,
        "--console",
        "--console-url-file",
        &utf8(&url_file)?,
    ]);
    let mut server = Listening::start(&launch, &dir.join("console-broker.log"))?;
    let measured = come_up(&mut server, &socket, &url_file).and_then(|(mut session, api)| {
        let events = api.events()?;
        let measured = measure(&mut session, &api, &events, &files, spec.samples, bars);
        // The page closes first: nothing of the broker's shutdown is timed or waited for.
        let closed = events.close();
        drop(session);
        let measured = measured?;
        closed?;
        Ok(measured)
    });
    let measured = measured.map_err(|e| server.failed(&format!("the console phase: {e}")));
    server.finish();
    measured
}

/// Waits for the broker to write its URL file and serve its socket; connects the session.
fn come_up(
    server: &mut Listening,
    socket: &Path,
    url_file: &Path,
) -> Result<(Session, Api), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = server.exited() {
            return Err(format!(
                "the broker ended ({status}) before it served its socket"
            ));
        }
        // The URL file is written whole (through a rename) before the socket is served.
        if let Ok(url) = std::fs::read_to_string(url_file) {
            if let Ok(stream) = UnixStream::connect(socket) {
                return Ok((Session::new(stream)?, Api::from_url(&url)?));
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the broker served no socket at {} within {START_TIMEOUT:?}",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The three latencies, on one session and one open page.
fn measure(
    s: &mut Session,
    api: &Api,
    events: &Events,
    files: &Files,
    samples: usize,
    bars: &Bars,
) -> Result<Latencies, String> {
    let deadline = Instant::now() + SAMPLE_TIMEOUT;
    let id = s.send("ping", json!({}))?;
    match s.answer(id, deadline)? {
        Some((_, Ok(_))) => {}
        other => return Err(format!("the session's ping was not answered: {other:?}")),
    }
    let state = api
        .call("GET", "/api/state", None)?
        .json("GET /api/state")?;
    let roots: Vec<&str> = state["roots"]
        .as_array()
        .map(|r| r.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    if !(roots.contains(&"asked") && roots.contains(&"open")) {
        return Err(format!(
            "/api/state lists the roots {roots:?}, not the policy's asked and open"
        ));
    }
    if first_prompt(&state).is_some() {
        return Err(format!(
            "a prompt is waiting before the bench asked: {}",
            state["prompts"]
        ));
    }
    let bar = bars.ops("console: latencies", 3 * samples as u64);
    let mut prompt = Timed::default();
    for i in 0..WARMUP + samples {
        prompt.add(i >= WARMUP, prompt_once(s, api, events, &files.asked)?);
        bar.inc(u64::from(i >= WARMUP));
    }
    let (mut list_changed, mut refused) = (Timed::default(), Timed::default());
    for i in 0..WARMUP + samples {
        let (notified, refusal) = revoke_once(s, api, &files.small)?;
        list_changed.add(i >= WARMUP, notified);
        refused.add(i >= WARMUP, refusal);
        bar.inc(u64::from(i >= WARMUP));
    }
    let mut feed = Timed::default();
    for i in 0..WARMUP + samples {
        let phase = FEED_PERIOD.mul_f64((i % samples) as f64 / samples as f64);
        feed.add(i >= WARMUP, feed_once(s, events, &files.small, phase)?);
        bar.inc(u64::from(i >= WARMUP));
    }
    bar.finish_and_clear();
    Ok(Latencies {
        prompt: prompt.latency(),
        list_changed: list_changed.latency(),
        refused: refused.latency(),
        feed: feed.latency(),
    })
}

/// Samples of one latency: those that came, and the count of those that did not.
#[derive(Default)]
struct Timed {
    times: Vec<Duration>,
    missed: usize,
}

impl Timed {
    fn add(&mut self, counted: bool, sample: Option<Duration>) {
        match sample {
            _ if !counted => {}
            Some(d) => self.times.push(d),
            None => self.missed += 1,
        }
    }

    fn latency(mut self) -> Latency {
        self.times.sort();
        Latency::new(&self.times, self.missed)
    }
}

/// One prompt: `files/consent` sent → the page shows it (`None`: not within
/// [`SAMPLE_TIMEOUT`]); then denied, and the server told so.
fn prompt_once(
    s: &mut Session,
    api: &Api,
    events: &Events,
    asked: &str,
) -> Result<Option<Duration>, String> {
    events.drain();
    let started = Instant::now();
    let id = s.send(
        "files/consent",
        json!({"requestedPaths": [asked], "message": "fsbroker bench: the console phase asks"}),
    )?;
    let deadline = started + SAMPLE_TIMEOUT;
    let mut shown = None;
    while shown.is_none() {
        let Some(event) = events.next_until(deadline)? else {
            break;
        };
        if event.kind != "state" || event.at < started {
            continue;
        }
        let state = api
            .call("GET", "/api/state", None)?
            .json("GET /api/state")?;
        shown = first_prompt(&state).map(|prompt| (started.elapsed(), prompt));
    }
    // Missed, the prompt may still be waiting: deny it if it is, so the next round starts
    // clean (else the broker's timeout denies it).
    let prompt = match shown {
        Some((_, prompt)) => Some(prompt),
        None => first_prompt(
            &api.call("GET", "/api/state", None)?
                .json("GET /api/state")?,
        ),
    };
    if let Some(prompt) = prompt {
        api.call(
            "POST",
            &format!("/api/prompts/{prompt}"),
            Some(r#"{"deny":true}"#),
        )?
        .no_content("denying the prompt")?;
    }
    match s.answer(id, Instant::now() + CONSENT_TIMEOUT + SAMPLE_TIMEOUT)? {
        Some((_, Ok(result))) if result["granted"] == false => {}
        Some((_, Ok(result))) => {
            return Err(format!(
                "files/consent was granted after a denial: {result}"
            ));
        }
        Some((_, Err(error))) => return Err(format!("files/consent failed: {error}")),
        None => return Err("files/consent was never answered".into()),
    }
    Ok(shown.map(|(took, _)| took))
}

/// The first prompt `/api/state` lists: its id.
fn first_prompt(state: &Value) -> Option<u64> {
    state["prompts"].as_array()?.first()?["id"].as_u64()
}

/// One pause of `open`: → the session's `list_changed`, and → a read there refused; then the
/// root resumed (and its `list_changed` read) for the next round.
fn revoke_once(
    s: &mut Session,
    api: &Api,
    small: &str,
) -> Result<(Option<Duration>, Option<Duration>), String> {
    let started = Instant::now();
    let pause = api.send("POST", "/api/roots/open/pause", None)?;
    let deadline = started + SAMPLE_TIMEOUT;
    let notified = s.notification(LIST_CHANGED, deadline)?;
    let mut refused = None;
    if notified.is_some() {
        let id = s.send("files/read", json!({"path": small, "length": 1024}))?;
        if let Some((at, Err(error))) = s.answer(id, deadline)? {
            if error["data"]["code"] == "PERMISSION_DENIED" {
                refused = Some(at - started);
            }
        }
    }
    read_answer(pause)
        .map_err(|e| format!("POST /api/roots/open/pause: {e}"))?
        .no_content("pausing the root")?;
    let resume = api.send("POST", "/api/roots/open/resume", None)?;
    let back = s.notification(LIST_CHANGED, Instant::now() + SAMPLE_TIMEOUT)?;
    read_answer(resume)
        .map_err(|e| format!("POST /api/roots/open/resume: {e}"))?
        .no_content("resuming the root")?;
    // A notification missed for the pause is a flag still raised: the resume's is the same.
    if back.is_none() && notified.is_some() {
        return Err("the session heard nothing when the root was resumed".into());
    }
    Ok((notified.map(|at| at - started), refused))
}

/// One read of the small file, `phase` after the last round's event → its `activity` event on
/// the page.
fn feed_once(
    s: &mut Session,
    events: &Events,
    small: &str,
    phase: Duration,
) -> Result<Option<Duration>, String> {
    std::thread::sleep(phase);
    events.drain();
    let started = Instant::now();
    let id = s.send("files/read", json!({"path": small, "length": 1024}))?;
    let deadline = started + SAMPLE_TIMEOUT;
    match s.answer(id, deadline)? {
        Some((_, Ok(_))) => {}
        Some((_, Err(error))) => return Err(format!("files/read of {small} failed: {error}")),
        None => return Err(format!("files/read of {small} got no answer")),
    }
    while let Some(event) = events.next_until(deadline)? {
        if event.kind != "activity" || event.at < started {
            continue;
        }
        let record: Value = serde_json::from_str(&event.data)
            .map_err(|e| format!("an activity event that is not JSON ({e}): {}", event.data))?;
        if record["method"] == "files/read" && record["path"] == small && record["outcome"] == "ok"
        {
            return Ok(Some(event.at - started));
        }
    }
    Ok(None)
}

/// An MCP session on the broker's socket: requests written whole, lines read as they come.
struct Session {
    out: UnixStream,
    lines: Lines<UnixStream>,
    next_id: u64,
}

/// An answer: when it was read, and its result or error.
type Answered = (Instant, Result<Value, Value>);

impl Session {
    fn new(stream: UnixStream) -> Result<Session, String> {
        let out = stream
            .try_clone()
            .map_err(|e| format!("the broker's socket: {e}"))?;
        Ok(Session {
            out,
            lines: Lines::new(stream),
            next_id: 0,
        })
    }

    /// Sends a request; returns its id.
    fn send(&mut self, method: &str, params: Value) -> Result<u64, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .map_err(|e| format!("sending {method} to the broker: {e}"))?;
        Ok(id)
    }

    /// The next message by `deadline`, parsed, and when it was read.
    fn next(&mut self, deadline: Instant) -> Result<Option<(Instant, Value)>, String> {
        let Some(span) = self
            .lines
            .next_until(deadline, &mut || Ok(()))
            .map_err(|e| format!("reading the broker's socket: {e}"))?
        else {
            return Ok(None);
        };
        let at = Instant::now();
        let line = self.lines.line(span);
        let message = serde_json::from_slice(line).map_err(|e| {
            format!(
                "the broker wrote a line that is not JSON ({e}): {}",
                super::wire::preview(line)
            )
        })?;
        Ok(Some((at, message)))
    }

    /// The answer to request `id` by `deadline`; other messages are passed over.
    fn answer(&mut self, id: u64, deadline: Instant) -> Result<Option<Answered>, String> {
        while let Some((at, mut message)) = self.next(deadline)? {
            if message["id"] != id {
                continue;
            }
            return Ok(Some(match message.get_mut("error") {
                Some(error) => (at, Err(error.take())),
                None => (at, Ok(message["result"].take())),
            }));
        }
        Ok(None)
    }

    /// When notification `method` was read, by `deadline`; other messages are passed over.
    fn notification(&mut self, method: &str, deadline: Instant) -> Result<Option<Instant>, String> {
        while let Some((at, message)) = self.next(deadline)? {
            if message["method"] == method && message.get("id").is_none() {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }
}

/// One read of the test file, as the read phase reads it.
struct OneRead {
    throughput: Throughput,
    requests: u64,
    /// With a page open: its `activity` events for the file, and the requests they stand for.
    events: u64,
    event_requests: u64,
}

/// The pairs of reads without and with a page open.
fn pairs(spec: &Spec, dir: &Path, bars: &Bars) -> Result<Vec<report::ConsolePair>, String> {
    let path = spec
        .read
        .file
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", spec.read.file.display()))?;
    // One read first, not counted: the first read after the file is made runs slower than any
    // after it (quiet-machine runs: 0.6-0.9x of the rest), and would weigh on pair 1 alone.
    read_once(spec, dir, path, None, false, bars)?;
    let mut out = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let console_first = pair % 2 == 1;
        let order = if console_first {
            [true, false]
        } else {
            [false, true]
        };
        let mut runs: [Option<OneRead>; 2] = [None, None];
        for page in order {
            runs[usize::from(page)] = Some(read_once(spec, dir, path, Some(pair), page, bars)?);
        }
        let [Some(off), Some(on)] = runs else {
            return Err("a read of the pair did not run".into());
        };
        out.push(report::ConsolePair {
            console_first,
            ratio: on.throughput.mb_per_s / off.throughput.mb_per_s,
            requests: on.requests,
            activity_events: on.events,
            activity_requests: on.event_requests,
            off: off.throughput,
            on: on.throughput,
        });
    }
    Ok(out)
}

/// One read of the test file on a broker of its own, with `page` a console and an open
/// `/api/events` drained while it reads; `pair` is `None` for the warm-up read.
fn read_once(
    spec: &Spec,
    dir: &Path,
    path: &str,
    pair: Option<usize>,
    page: bool,
    bars: &Bars,
) -> Result<OneRead, String> {
    let name = match pair {
        Some(pair) => format!("pair-{}-{}", pair + 1, if page { "page" } else { "none" }),
        None => "warm-up".to_owned(),
    };
    let url_file = dir.join(format!("{name}.url"));
    let url_arg = url_file
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", url_file.display()))?;
    let with_console;
    let launch = if page {
        with_console = spec
            .launch
            .with_args(&["--console", "--console-url-file", url_arg]);
        &with_console
    } else {
        spec.launch
    };
    let mut broker = Broker::start(launch, &dir.join(format!("{name}.log")))?;
    let measured = (|| -> Result<OneRead, String> {
        // The console writes its URL file before the broker reads its first request, so it
        // is there once the broker has answered its ping.
        let events = if page {
            let url = std::fs::read_to_string(&url_file)
                .map_err(|e| format!("cannot read {}: {e}", url_file.display()))?;
            Some(Api::from_url(&url)?.events()?)
        } else {
            None
        };
        let got = read::run(&mut broker, &spec.read, bars)?;
        let mut one = OneRead {
            throughput: got.throughput,
            requests: got.requests,
            events: 0,
            event_requests: 0,
        };
        if let Some(events) = events {
            (one.events, one.event_requests) = activity(&events, path, got.requests)?;
            events.close()?;
        }
        Ok(one)
    })();
    let measured = measured.map_err(|e| broker.failed(&e));
    broker.finish();
    measured
}

/// The page's `activity` events for reads of `path`, and the requests they stand for:
/// waits until they stand for all `requests`, or [`FEED_SETTLE`] has passed.
fn activity(events: &Events, path: &str, requests: u64) -> Result<(u64, u64), String> {
    let deadline = Instant::now() + FEED_SETTLE;
    let (mut count, mut stand_for) = (0, 0);
    while stand_for < requests {
        let Some(event) = events.next_until(deadline)? else {
            break;
        };
        if event.kind != "activity" {
            continue;
        }
        let record: Value = serde_json::from_str(&event.data)
            .map_err(|e| format!("an activity event that is not JSON ({e}): {}", event.data))?;
        if record["method"] == "files/read" && record["path"] == path {
            count += 1;
            stand_for += record["count"].as_u64().unwrap_or(1);
        }
    }
    Ok((count, stand_for))
}

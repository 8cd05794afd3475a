//! Change → notification latency of `files/watch`, the way an MCP server sees it: one
//! recursive watch on a directory of the scratch root, then one file written at a time, each
//! timed from just before `write` to the `notifications/files/changed` naming it.
//!
//! The figures include the broker's coalescing window: a burst of events on one path is held
//! about 50 ms and sent as one notification, so ~50 ms is the floor by design; what lies above
//! it is inotify, the watch worker, the session's queue, the writer and the pipe. Writes are
//! spaced [`SPACING`] apart (and never before the last one was reported), so each is a burst of
//! its own. `benches/watch.rs` measures the same with modified files too.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::client::Broker;
use super::progress::Bars;
use super::report;
use super::wire;

/// What to run.
pub(crate) struct Spec<'a> {
    /// An empty directory inside a root of the broker's.
    pub dir: &'a Path,
    /// Changes timed.
    pub samples: usize,
}

/// The least time between two writes, so each one is a burst of its own.
const SPACING: Duration = Duration::from_millis(60);
/// How long one change may wait for its notification before it counts as missed.
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Changes before the timed ones, not counted.
const WARMUP: usize = 5;

pub(crate) fn run(broker: &mut Broker, spec: &Spec, bars: &Bars) -> Result<report::Watch, String> {
    let dir = spec
        .dir
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", spec.dir.display()))?;
    let id = broker.requests.id();
    let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "files/watch",
        "params": {"path": dir, "recursive": true}});
    writeln!(broker.requests, "{request}").map_err(|e| e.to_string())?;
    let (line, answer) = broker.answer()?;
    if answer.id != Some(id) || answer.result.is_none() {
        return Err(broker.failed(&format!(
            "files/watch was refused: {}",
            wire::preview(broker.answers.line(line))
        )));
    }
    let bar = bars.ops("watch: change → notification", spec.samples as u64);
    let mut latencies = Vec::with_capacity(spec.samples);
    let mut missed = 0;
    let mut last = Instant::now();
    for i in 0..WARMUP + spec.samples {
        let name = format!("change-{i}.txt");
        let wait = SPACING.saturating_sub(last.elapsed());
        std::thread::sleep(wait);
        let path = spec.dir.join(&name);
        let started = Instant::now();
        last = started;
        std::fs::write(&path, b"x").map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        match notified(broker, &name, started + SAMPLE_TIMEOUT)? {
            Some(at) if i >= WARMUP => {
                latencies.push(at - started);
                bar.inc(1);
            }
            Some(_) => {}
            None if i >= WARMUP => {
                missed += 1;
                bar.inc(1);
            }
            None => {}
        }
    }
    bar.finish_and_clear();
    latencies.sort();
    Ok(report::Watch::new(&latencies, missed))
}

/// When the notification for a file named `name` was read, or `None` by `deadline`. Other
/// lines (notifications for earlier changes, of directories) are passed over.
fn notified(broker: &mut Broker, name: &str, deadline: Instant) -> Result<Option<Instant>, String> {
    let needle = format!("/{name}\"");
    loop {
        let requests = &mut broker.requests;
        let Some(line) = broker
            .answers
            .next_until(deadline, &mut || requests.flush())
            .map_err(|e| format!("reading the broker's answers: {e}"))?
        else {
            return Ok(None);
        };
        let text = broker.answers.line(line);
        if memchr::memmem::find(text, b"notifications/files/changed").is_some()
            && memchr::memmem::find(text, needle.as_bytes()).is_some()
        {
            return Ok(Some(Instant::now()));
        }
    }
}

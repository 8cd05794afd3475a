//! Small operations: 1 KiB `files/read`s (cycling over the small files) and non-recursive
//! `files/list`s of their directory, first one at a time (ops/s and latency p50/p99), then
//! pipelined with `depth` requests in flight. Every answer is checked: the content against
//! the file, the number of entries.

use std::borrow::Cow;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use serde::Deserialize;

use super::Encoding;
use super::client::Broker;
use super::fixture::{SMALL_FILES, SMALL_SIZE};
use super::progress::Bars;
use super::report::{self, Ops};
use super::wire;
use crate::bench::codec::BASE64;

/// What to run.
pub(crate) struct Spec<'a> {
    pub dir: &'a Path,
    pub files: &'a [(PathBuf, Vec<u8>)],
    pub encoding: Encoding,
    /// Operations per kind and mode.
    pub ops: usize,
    /// In flight when pipelined.
    pub depth: usize,
}

/// Operations before each measurement that are not counted.
pub(crate) const WARMUP: usize = 200;

#[derive(Clone, Copy)]
enum Kind {
    Read,
    List,
}

/// Paths as JSON strings, and what the answers must hold.
struct Requests<'a> {
    files: Vec<(String, &'a [u8])>,
    dir: String,
    encoding: Encoding,
}

pub(crate) fn run(broker: &mut Broker, spec: &Spec, bars: &Bars) -> Result<report::Small, String> {
    let json = |p: &Path| {
        p.to_str()
            .ok_or_else(|| format!("{} is not UTF-8", p.display()))
            .and_then(|s| serde_json::to_string(s).map_err(|e| e.to_string()))
    };
    let reqs = Requests {
        files: spec
            .files
            .iter()
            .map(|(p, content)| Ok((json(p)?, content.as_slice())))
            .collect::<Result<_, String>>()?,
        dir: json(spec.dir)?,
        encoding: spec.encoding,
    };
    let warmup = spec.ops.min(WARMUP);
    let bar = bars.ops("small operations", (4 * spec.ops + 2 * warmup) as u64);
    let mut ops = |kind, n, depth| measure(broker, &reqs, kind, n, depth, &bar);
    ops(Kind::Read, warmup, 1)?;
    let read_seq = ops(Kind::Read, spec.ops, 1)?;
    let read_pipe = ops(Kind::Read, spec.ops, spec.depth)?;
    ops(Kind::List, warmup, 1)?;
    let list_seq = ops(Kind::List, spec.ops, 1)?;
    let list_pipe = ops(Kind::List, spec.ops, spec.depth)?;
    bar.finish_and_clear();
    Ok(report::Small {
        depth: spec.depth,
        read_size: SMALL_SIZE,
        list_entries: SMALL_FILES,
        read_1k: report::OpsPair {
            sequential: read_seq,
            pipelined: read_pipe,
        },
        list: report::OpsPair {
            sequential: list_seq,
            pipelined: list_pipe,
        },
    })
}

/// `n` operations of one kind with up to `depth` in flight.
fn measure(
    broker: &mut Broker,
    reqs: &Requests,
    kind: Kind,
    n: usize,
    depth: usize,
    bar: &indicatif::ProgressBar,
) -> Result<Ops, String> {
    let mut sent_at: Vec<Instant> = Vec::with_capacity(n);
    let mut latency: Vec<Option<Duration>> = vec![None; n];
    let mut first_id = None;
    let mut done = 0;
    let cpu_before = broker.cpu_time();
    let started = Instant::now();
    while done < n {
        while sent_at.len() < n && sent_at.len() - done < depth {
            let k = sent_at.len();
            let id = broker.requests.id();
            let first = *first_id.get_or_insert(id);
            debug_assert_eq!(id - first, k as u64);
            let sent = match kind {
                Kind::Read => writeln!(
                    broker.requests,
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"files/read\",\"params\":{{\"path\":{},\"length\":{SMALL_SIZE},\"encoding\":\"{}\"}}}}",
                    reqs.files[k % reqs.files.len()].0,
                    reqs.encoding.name()
                ),
                Kind::List => writeln!(
                    broker.requests,
                    "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"files/list\",\"params\":{{\"path\":{}}}}}",
                    reqs.dir
                ),
            };
            sent.map_err(|e| format!("sending to the broker: {e}"))?;
            sent_at.push(Instant::now());
        }
        let (span, answer) = broker.answer()?;
        let now = Instant::now();
        let line = broker.answers.line(span);
        let k = answer
            .id
            .zip(first_id)
            .and_then(|(id, first)| usize::try_from(id.checked_sub(first)?).ok())
            .filter(|&k| k < sent_at.len() && latency[k].is_none())
            .ok_or_else(|| format!("an answer to no request: {}", wire::preview(line)))?;
        check(line, &answer, kind, reqs, k).map_err(|e| broker.failed(&e))?;
        latency[k] = Some(now - sent_at[k]);
        done += 1;
        if done % 64 == 0 {
            bar.inc(64);
        }
    }
    let elapsed = started.elapsed();
    bar.inc((n % 64) as u64);
    let mut latency: Vec<Duration> = latency.into_iter().flatten().collect();
    latency.sort_unstable();
    let cpu = broker
        .cpu_time()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    Ok(Ops::new(n as u64, elapsed, &latency).with_cpu(cpu))
}

#[derive(Deserialize)]
struct ReadResult<'a> {
    #[serde(borrow)]
    content: Cow<'a, str>,
    #[serde(borrow)]
    encoding: Cow<'a, str>,
}

#[derive(Deserialize)]
struct ListResult {
    entries: Vec<serde::de::IgnoredAny>,
}

fn check(
    line: &[u8],
    answer: &wire::Answer,
    kind: Kind,
    reqs: &Requests,
    k: usize,
) -> Result<(), String> {
    let what = match kind {
        Kind::Read => "files/read",
        Kind::List => "files/list",
    };
    if let Some(e) = &answer.error {
        return Err(format!("{what}: {}", wire::error_text(&line[e.clone()])));
    }
    let result = &line[answer.result.clone().ok_or("no result")?];
    let bad =
        |e: serde_json::Error| format!("{what}: a bad result ({e}): {}", wire::preview(result));
    match kind {
        Kind::Read => {
            let r: ReadResult = serde_json::from_slice(result).map_err(bad)?;
            let want = reqs.files[k % reqs.files.len()].1;
            let same = match r.encoding.to_ascii_lowercase().as_str() {
                "base64" => BASE64.decode(r.content.as_bytes()).is_ok_and(|d| d == want),
                _ => r.content.as_bytes() == want,
            };
            if !same {
                return Err(format!("{what}: the content differs from the file"));
            }
        }
        Kind::List => {
            let r: ListResult = serde_json::from_slice(result).map_err(bad)?;
            if r.entries.len() != SMALL_FILES {
                return Err(format!(
                    "{what}: {} entries where {SMALL_FILES} were due",
                    r.entries.len()
                ));
            }
        }
    }
    Ok(())
}

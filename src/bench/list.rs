//! A recursive `files/list` of a large tree, every page followed through `nextCursor`,
//! against `find` on the same tree in the same run, twice: printing names only (`find DIR`,
//! which reads directories and stats nothing) and printing what a listing entry holds
//! (`find DIR -printf '%p %y %s %T@\n'`: path, type, size, modification time, one `stat`
//! per entry as the broker makes). Everything runs once untimed first (a warm page cache);
//! the median of three timed runs counts. The tree: folders of 1,000 empty files.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::client::Broker;
use super::progress::Bars;
use super::report;
use super::wire;

/// What to run.
pub(crate) struct Spec<'a> {
    /// A directory inside a root of the broker's, where the tree is made.
    pub dir: &'a Path,
    /// Entries in the tree (directories and files), about.
    pub entries: usize,
}

/// Files per directory of the tree.
const PER_DIR: usize = 1000;
/// Timed listings of each kind; the median counts.
const RUNS: usize = 3;

pub(crate) fn run(broker: &mut Broker, spec: &Spec, bars: &Bars) -> Result<report::List, String> {
    let made = make_tree(spec.dir, spec.entries, bars)?;
    let dir = spec
        .dir
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", spec.dir.display()))?;
    let bar = bars.ops("list: files/list and find", 2 * (RUNS as u64 + 1));
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut theirs_stat = Vec::new();
    for run in 0..=RUNS {
        let (took, seen) = list(broker, dir)?;
        bar.inc(1);
        if seen != made {
            return Err(format!(
                "files/list returned {seen} entries of a tree of {made}"
            ));
        }
        let (find_took, find_seen) = find(spec.dir, None)?;
        let (stat_took, stat_seen) = find(spec.dir, Some("%p %y %s %T@\n"))?;
        bar.inc(1);
        // `find` prints the directory itself too.
        if find_seen != made + 1 || stat_seen != made + 1 {
            return Err(format!(
                "find printed {find_seen} and {stat_seen} lines for a tree of {made}"
            ));
        }
        if run > 0 {
            ours.push(took);
            theirs.push(find_took);
            theirs_stat.push(stat_took);
        }
    }
    bar.finish_and_clear();
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[RUNS / 2]
    };
    Ok(report::List::new(
        made,
        median(ours),
        median(theirs),
        median(theirs_stat),
    ))
}

/// Makes `dir/dNNNN/fNNNN` until about `entries` entries exist; returns how many.
fn make_tree(dir: &Path, entries: usize, bars: &Bars) -> Result<usize, String> {
    let dirs = entries.div_ceil(PER_DIR + 1).max(1);
    let bar = bars.ops("list: making the tree", entries as u64);
    let mut made = 0;
    for d in 0..dirs {
        let sub = dir.join(format!("d{d:05}"));
        std::fs::create_dir_all(&sub).map_err(|e| format!("cannot make {}: {e}", sub.display()))?;
        made += 1;
        for f in 0..PER_DIR.min(entries.saturating_sub(made)) {
            let path = sub.join(format!("f{f:05}"));
            std::fs::File::create(&path)
                .map_err(|e| format!("cannot make {}: {e}", path.display()))?;
            made += 1;
        }
        bar.set_position(made as u64);
    }
    bar.finish_and_clear();
    Ok(made)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    entries: Vec<serde::de::IgnoredAny>,
    next_cursor: Option<String>,
}

/// One whole recursive listing through the broker: its time and its number of entries.
fn list(broker: &mut Broker, dir: &str) -> Result<(Duration, usize), String> {
    let started = Instant::now();
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let id = broker.requests.id();
        let mut params = serde_json::json!({"path": dir, "recursive": true});
        if let Some(c) = &cursor {
            params["cursor"] = c.clone().into();
        }
        let request = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "files/list", "params": params});
        writeln!(broker.requests, "{request}").map_err(|e| e.to_string())?;
        let (line, answer) = broker.answer()?;
        let text = broker.answers.line(line);
        let (Some(got), Some(result)) = (answer.id, answer.result) else {
            return Err(broker.failed(&format!("files/list failed: {}", wire::preview(text))));
        };
        if got != id {
            return Err(format!("an answer to {got} came for {id}"));
        }
        let page: Page = serde_json::from_slice(&text[result])
            .map_err(|e| format!("files/list answered something else: {e}"))?;
        seen += page.entries.len();
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok((started.elapsed(), seen)),
        }
    }
}

/// `find DIR [-printf FORMAT]` into a pipe we read: its time and its number of lines.
fn find(dir: &Path, printf: Option<&str>) -> Result<(Duration, usize), String> {
    let started = Instant::now();
    let out = Command::new("find")
        .arg(dir)
        .args(printf.map(|f| ["-printf", f]).into_iter().flatten())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run find: {e}"))?;
    let took = started.elapsed();
    if !out.status.success() {
        return Err(format!("find failed: {}", out.status));
    }
    Ok((took, memchr::memchr_iter(b'\n', &out.stdout).count()))
}

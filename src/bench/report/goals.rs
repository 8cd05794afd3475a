//! The speed goals of the project a run is held to: each goal's figure, what this run
//! measured, and whether it was met.

use serde::Serialize;

use super::table::{mib, size, thousands};
use super::{Encoding, Latency, Report};

/// One of the project's speed goals, and how this run did against it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Goal {
    /// What is measured, e.g. `read 1 MiB vs sftp get`.
    pub figure: String,
    /// This run's figure, e.g. `1.23x` or `87,000 ops/s`.
    pub measured: String,
    /// The goal, e.g. `>= 1.0x`.
    pub goal: String,
    /// Whether the measured figure meets the goal.
    pub met: bool,
}

/// Chunks at least this large are held to [`READ_GOAL_LARGE`], smaller ones to
/// [`READ_GOAL_SMALL`]: a smaller chunk pays a request's fixed cost more often, while sftp's
/// own request size stays the same whatever `--chunk-size` is.
const READ_GOAL_FROM: u64 = 1 << 20;
const READ_GOAL_LARGE: f64 = 1.0;
const READ_GOAL_SMALL: f64 = 0.8;
/// fsbroker's durable upload ÷ `sftp put -f`.
const UPLOAD_GOAL: f64 = 1.0;
/// fsbroker's sequential 1 KiB reads per second ÷ another MCP server's.
const MCP_GOAL: f64 = 2.0;
/// Pipelined 1 KiB reads per second.
const PIPELINED_GOAL: f64 = 100_000.0;
/// The broker's peak resident memory over the run, bytes (strictly below).
const MEMORY_GOAL: u64 = 64 << 20;
/// `files/watch` change → notification p99, milliseconds (strictly below).
const WATCH_GOAL_MS: f64 = 100.0;
/// fsbroker's recursive listing time ÷ `find -printf`'s.
const LIST_GOAL: f64 = 2.0;
/// The console: `files/consent` → the prompt on the page, p99, milliseconds (at most).
const PROMPT_GOAL_MS: f64 = 200.0;
/// The console: pausing a root → the session's `list_changed`, p99, milliseconds (at most).
const REVOKE_GOAL_MS: f64 = 200.0;
/// The console: a request → its line in the activity feed, p99, milliseconds (at most).
const FEED_GOAL_MS: f64 = 500.0;
/// Reads and uploads with the broker's SHA-256 ÷ without (geometric mean of the pairs): a
/// hash costs at most a tenth.
pub(crate) const INTEGRITY_GOAL: f64 = 0.90;
/// Read MB/s with a console page open ÷ without (geometric mean of the pairs).
const OPEN_PAGE_GOAL: f64 = 0.95;

/// The speed goals (the project's speed issue) that `report` has a figure for, in the issue's
/// order, each met or not. Figures the run did not measure are left out rather than failed: a
/// run without `--compare-sftp` says nothing about sftp.
pub(crate) fn goals(report: &Report) -> Vec<Goal> {
    let mut out = Vec::new();
    let mut push = |figure: String, measured: String, goal: String, met: bool| {
        out.push(Goal {
            figure,
            measured,
            goal,
            met,
        })
    };
    let times = |r: f64| format!("{r:.2}x");
    // The read goals are for base64; utf-8 chunks are a different figure (JSON-escaped text).
    if report.settings.encoding == Encoding::Base64.name() {
        for t in &report.transfers {
            if let Some(r) = t.read_ratio {
                let want = if t.chunk_size >= READ_GOAL_FROM {
                    READ_GOAL_LARGE
                } else {
                    READ_GOAL_SMALL
                };
                push(
                    format!("read {} vs sftp get", size(t.chunk_size)),
                    times(r),
                    format!(">= {want:.1}x"),
                    r >= want,
                );
            }
        }
    }
    for t in &report.transfers {
        if let Some(r) = t.upload_ratio_fsync {
            push(
                format!("upload {} vs sftp put -f", size(t.chunk_size)),
                times(r),
                format!(">= {UPLOAD_GOAL:.1}x"),
                r >= UPLOAD_GOAL,
            );
        }
    }
    let kib = report.small.as_ref().map_or(1, |s| s.read_size / 1024);
    for s in report.mcp.iter().flatten() {
        if let Some(r) = s.ratio {
            push(
                format!("{kib} KiB reads one at a time vs {}", s.name),
                times(r),
                format!(">= {MCP_GOAL:.1}x"),
                r >= MCP_GOAL,
            );
        }
    }
    if let Some(sm) = &report.small {
        let ops = sm.read_1k.pipelined.ops_per_s;
        push(
            format!("{kib} KiB reads, {} in flight", sm.depth),
            format!("{} ops/s", thousands(ops)),
            format!(">= {} ops/s", thousands(PIPELINED_GOAL)),
            ops >= PIPELINED_GOAL,
        );
    }
    if let Some(peak) = report.memory.peak_bytes {
        push(
            "broker peak memory (VmHWM)".into(),
            mib(peak),
            format!("< {}", size(MEMORY_GOAL)),
            peak < MEMORY_GOAL,
        );
    }
    if let Some(w) = &report.watch {
        // A notification that never came is slower than any goal.
        let missed = if w.missed > 0 {
            format!(", {} missed", w.missed)
        } else {
            String::new()
        };
        push(
            "files/watch change → notification p99".into(),
            format!("{:.1} ms{missed}", w.p99_ms),
            format!("< {WATCH_GOAL_MS:.0} ms"),
            w.missed == 0 && w.p99_ms < WATCH_GOAL_MS,
        );
    }
    if let Some(l) = &report.list {
        push(
            format!(
                "recursive files/list ({} entries) vs find -printf",
                l.entries
            ),
            times(l.ratio_to_find_stat),
            format!("<= {LIST_GOAL:.1}x"),
            l.ratio_to_find_stat <= LIST_GOAL,
        );
    }
    if let Some(c) = &report.console {
        // As for watch: what never came is slower than any goal.
        let latency = |l: &Latency| {
            let missed = if l.missed > 0 {
                format!(", {} missed", l.missed)
            } else {
                String::new()
            };
            format!("{:.1} ms{missed}", l.p99_ms)
        };
        for (figure, l, want) in [
            ("console: prompt → page p99", &c.prompt, PROMPT_GOAL_MS),
            (
                "console: revoke → list_changed p99",
                &c.revoke_list_changed,
                REVOKE_GOAL_MS,
            ),
            ("console: request → feed p99", &c.feed, FEED_GOAL_MS),
        ] {
            push(
                figure.into(),
                latency(l),
                format!("<= {want:.0} ms"),
                l.missed == 0 && l.p99_ms <= want,
            );
        }
        if let Some(r) = c.ratio_geomean {
            push(
                "console: read with a page open vs none".into(),
                times(r),
                format!(">= {OPEN_PAGE_GOAL:.2}x"),
                r >= OPEN_PAGE_GOAL,
            );
        }
    }
    if let Some(i) = &report.integrity {
        for (figure, r) in [
            ("read with sha256 vs without", i.read_geomean),
            ("upload with sha256 vs without", i.upload_geomean),
        ] {
            if let Some(r) = r {
                push(
                    format!("{figure}, {}", super::table::size(i.chunk_size)),
                    times(r),
                    format!(">= {INTEGRITY_GOAL:.2}x"),
                    r >= INTEGRITY_GOAL,
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::goals;
    use crate::bench::report::{
        Console, ConsolePair, Integrity, IntegrityPair, Latency, List, McpServer, Memory, Ops,
        OpsPair, Read, Report, Settings, Small, Throughput, Transfer, Upload, Watch,
    };

    /// A report of a run that measured nothing.
    fn bare(encoding: &'static str) -> Report {
        Report {
            broker: "fsbroker serve".into(),
            file: None,
            settings: Settings {
                chunk_sizes: vec![1 << 20],
                encoding,
                depth: 8,
                small_ops: 10,
                small_depth: 64,
                verify: "sampled",
                sha256_engine: None,
                mcp_size: None,
            },
            transfers: Vec::new(),
            small: None,
            watch: None,
            list: None,
            console: None,
            integrity: None,
            memory: Memory::default(),
            sftp: None,
            mcp: None,
            goals: Vec::new(),
        }
    }

    fn ops(ops_per_s: f64) -> Ops {
        Ops {
            ops: 100,
            seconds: 1.0,
            ops_per_s,
            p50_us: 10.0,
            p99_us: 20.0,
            broker_cpu_us: None,
        }
    }

    fn small(pipelined: f64) -> Small {
        Small {
            depth: 64,
            read_size: 1024,
            list_entries: 32,
            read_1k: OpsPair {
                sequential: ops(10_000.0),
                pipelined: ops(pipelined),
            },
            list: OpsPair {
                sequential: ops(1_000.0),
                pipelined: ops(2_000.0),
            },
        }
    }

    /// A transfer at `chunk` with these ratios (and the figures behind them).
    fn transfer(chunk: u64, read: Option<f64>, upload_fsync: Option<f64>) -> Transfer {
        let mb = |x: f64| Throughput {
            mb_per_s: x,
            ..Throughput::default()
        };
        let mut t = Transfer::new(chunk);
        if let Some(r) = read {
            t.read = Some(Read {
                throughput: mb(100.0 * r),
                ..Read::default()
            });
            t.sftp_get = Some(mb(100.0));
        }
        if let Some(r) = upload_fsync {
            t.upload = Some(Upload {
                throughput: mb(100.0 * r),
                ..Upload::default()
            });
            t.sftp_put = Some(mb(200.0));
            t.sftp_put_fsync = Some(mb(100.0));
        }
        t.ratios();
        t
    }

    /// `(figure, measured, goal, met)` of each goal.
    fn summary(report: &Report) -> Vec<(String, String, String, bool)> {
        goals(report)
            .into_iter()
            .map(|g| (g.figure, g.measured, g.goal, g.met))
            .collect()
    }

    fn goal(figure: &str, measured: &str, goal: &str, met: bool) -> (String, String, String, bool) {
        (figure.into(), measured.into(), goal.into(), met)
    }

    #[test]
    fn nothing_measured_no_goals() {
        assert!(goals(&bare("base64")).is_empty());
        // Reads and uploads without sftp have no ratio, so no goal either.
        let mut r = bare("base64");
        r.transfers = vec![Transfer {
            read: Some(Read::default()),
            upload: Some(Upload::default()),
            ..Transfer::new(1 << 20)
        }];
        r.transfers[0].ratios();
        assert!(goals(&r).is_empty());
    }

    #[test]
    fn read_goal_depends_on_the_chunk_size() {
        let mut r = bare("base64");
        r.transfers = vec![
            transfer(256 << 10, Some(0.85), None),
            transfer(1 << 20, Some(0.95), None),
            transfer(8 << 20, Some(1.25), None),
            transfer(512 << 10, Some(0.75), None),
        ];
        assert_eq!(
            summary(&r),
            [
                goal("read 256 KiB vs sftp get", "0.85x", ">= 0.8x", true),
                goal("read 1 MiB vs sftp get", "0.95x", ">= 1.0x", false),
                goal("read 8 MiB vs sftp get", "1.25x", ">= 1.0x", true),
                goal("read 512 KiB vs sftp get", "0.75x", ">= 0.8x", false),
            ]
        );
    }

    #[test]
    fn utf8_reads_have_no_goal_but_uploads_do() {
        let mut r = bare("utf-8");
        r.transfers = vec![
            transfer(256 << 10, Some(2.0), Some(1.5)),
            transfer(1 << 20, Some(2.0), Some(0.9)),
        ];
        assert_eq!(
            summary(&r),
            [
                goal("upload 256 KiB vs sftp put -f", "1.50x", ">= 1.0x", true),
                goal("upload 1 MiB vs sftp put -f", "0.90x", ">= 1.0x", false),
            ]
        );
        // Against put -f, not plain put (which is twice as fast in `transfer`).
        assert_eq!(r.transfers[0].upload_ratio, Some(0.75));
    }

    #[test]
    fn reads_come_before_uploads() {
        let mut r = bare("base64");
        r.transfers = vec![
            transfer(256 << 10, Some(1.0), Some(1.0)),
            transfer(1 << 20, Some(1.0), Some(1.0)),
        ];
        let figures: Vec<String> = goals(&r).into_iter().map(|g| g.figure).collect();
        assert_eq!(
            figures,
            [
                "read 256 KiB vs sftp get",
                "read 1 MiB vs sftp get",
                "upload 256 KiB vs sftp put -f",
                "upload 1 MiB vs sftp put -f",
            ]
        );
    }

    #[test]
    fn one_mcp_goal_per_server_with_a_ratio() {
        let mut r = bare("base64");
        let server = |name: &str, ratio: Option<f64>| McpServer {
            name: name.into(),
            ratio,
            ..McpServer::default()
        };
        r.mcp = Some(vec![
            server("fast", Some(2.5)),
            server("broken", None),
            server("close", Some(1.99)),
        ]);
        assert_eq!(
            summary(&r),
            [
                goal(
                    "1 KiB reads one at a time vs fast",
                    "2.50x",
                    ">= 2.0x",
                    true
                ),
                goal(
                    "1 KiB reads one at a time vs close",
                    "1.99x",
                    ">= 2.0x",
                    false
                ),
            ]
        );
    }

    #[test]
    fn pipelined_small_reads() {
        let mut r = bare("base64");
        r.small = Some(small(87_000.4));
        assert_eq!(
            summary(&r),
            [goal(
                "1 KiB reads, 64 in flight",
                "87,000 ops/s",
                ">= 100,000 ops/s",
                false
            )]
        );
        r.small = Some(small(100_000.0));
        assert!(goals(&r)[0].met);
    }

    #[test]
    fn memory_must_stay_below_64_mib() {
        let mut r = bare("base64");
        r.memory.peak_bytes = Some((64 << 20) - 1);
        assert_eq!(
            summary(&r),
            [goal(
                "broker peak memory (VmHWM)",
                "64.0 MiB",
                "< 64 MiB",
                true
            )]
        );
        r.memory.peak_bytes = Some(64 << 20);
        assert!(!goals(&r)[0].met);
    }

    #[test]
    fn watch_p99_below_100_ms_and_nothing_missed() {
        let watch = |p99_ms: f64, missed: usize| Watch {
            samples: 20,
            missed,
            p50_ms: 55.0,
            p99_ms,
            max_ms: p99_ms,
        };
        let mut r = bare("base64");
        r.watch = Some(watch(99.9, 0));
        assert_eq!(
            summary(&r),
            [goal(
                "files/watch change → notification p99",
                "99.9 ms",
                "< 100 ms",
                true
            )]
        );
        r.watch = Some(watch(100.0, 0));
        assert!(!goals(&r)[0].met);
        r.watch = Some(watch(60.0, 1));
        let g = &goals(&r)[0];
        assert!(!g.met);
        assert_eq!(g.measured, "60.0 ms, 1 missed");
    }

    #[test]
    fn list_at_most_twice_find_printf() {
        let mut r = bare("base64");
        let secs = Duration::from_secs_f64;
        // Against find -printf (2.0x), not names-only find (4.0x).
        r.list = Some(List::new(1000, secs(0.4), secs(0.1), secs(0.2)));
        assert_eq!(
            summary(&r),
            [goal(
                "recursive files/list (1000 entries) vs find -printf",
                "2.00x",
                "<= 2.0x",
                true
            )]
        );
        r.list = Some(List::new(1000, secs(0.42), secs(0.1), secs(0.2)));
        assert!(!goals(&r)[0].met);
    }

    /// A console report whose latencies have these p99s (ms) and whose one pair has `ratio`.
    fn console(prompt: f64, revoke: f64, feed: f64, ratio: f64) -> Console {
        let ms = |p99: f64| Latency::new(&[Duration::from_secs_f64(p99 / 1e3)], 0);
        let mb = |x: f64| Throughput {
            mb_per_s: x,
            ..Throughput::default()
        };
        Console {
            prompt: ms(prompt),
            revoke_list_changed: ms(revoke),
            revoke_refused: ms(revoke + 1.0),
            feed: ms(feed),
            pair_bytes: 64 << 20,
            pair_chunk_size: 1 << 20,
            pairs: vec![ConsolePair {
                console_first: false,
                off: mb(100.0),
                on: mb(100.0 * ratio),
                ratio,
                requests: 64,
                activity_events: 3,
                activity_requests: 64,
            }],
            ratio_geomean: Some(ratio),
        }
    }

    #[test]
    fn console_goals_are_p99s_and_the_open_page_ratio() {
        let mut r = bare("base64");
        r.console = Some(console(200.0, 12.5, 480.0, 0.95));
        assert_eq!(
            summary(&r),
            [
                goal("console: prompt → page p99", "200.0 ms", "<= 200 ms", true),
                goal(
                    "console: revoke → list_changed p99",
                    "12.5 ms",
                    "<= 200 ms",
                    true
                ),
                goal("console: request → feed p99", "480.0 ms", "<= 500 ms", true),
                goal(
                    "console: read with a page open vs none",
                    "0.95x",
                    ">= 0.95x",
                    true
                ),
            ]
        );
        r.console = Some(console(200.5, 201.0, 501.0, 0.94));
        assert!(goals(&r).iter().all(|g| !g.met), "{:#?}", goals(&r));
        // A prompt that never showed fails the goal, however fast the others were.
        let mut c = console(10.0, 10.0, 10.0, 1.0);
        c.prompt = Latency::new(&[Duration::from_millis(10)], 1);
        r.console = Some(c);
        let g = &goals(&r)[0];
        assert!(!g.met);
        assert_eq!(g.measured, "10.0 ms, 1 missed");
        r.goals = goals(&r);
        let table = r.table();
        for needle in [
            "prompt → page (2)",
            "revoke → read refused (1)",
            "pair 1 (no page first)",
            "standing for all 64 requests in every pair",
            "console: request → feed p99",
        ] {
            assert!(table.contains(needle), "no {needle:?} in:\n{table}");
        }
    }

    /// An integrity report whose read and upload pairs have these ratios.
    fn integrity(read: f64, upload: f64) -> Integrity {
        let mb = |x: f64| Throughput {
            mb_per_s: x,
            ..Throughput::default()
        };
        let pair = |ratio: f64| IntegrityPair {
            hashed_first: false,
            off: mb(1000.0),
            on: mb(1000.0 * ratio),
            ratio,
        };
        Integrity {
            engine: "sha-ni",
            bytes: 64 << 20,
            chunk_size: 1 << 20,
            reads: vec![pair(read)],
            read_geomean: Some(read),
            uploads: vec![pair(upload)],
            upload_geomean: Some(upload),
            checksum: mb(900.0),
            local_sha256: mb(1000.0),
        }
    }

    #[test]
    fn integrity_goals_are_at_most_a_tenth_slower() {
        let mut r = bare("base64");
        r.integrity = Some(integrity(0.90, 0.95));
        assert_eq!(
            summary(&r),
            [
                goal(
                    "read with sha256 vs without, 1 MiB",
                    "0.90x",
                    ">= 0.90x",
                    true
                ),
                goal(
                    "upload with sha256 vs without, 1 MiB",
                    "0.95x",
                    ">= 0.90x",
                    true
                ),
            ]
        );
        r.integrity = Some(integrity(0.89, 0.5));
        assert!(goals(&r).iter().all(|g| !g.met), "{:#?}", goals(&r));
        r.goals = goals(&r);
        let table = r.table();
        for needle in [
            "sha256, 1 MiB chunks (sha-ni)",
            "read pair 1 (without first)",
            "upload: geometric mean",
            "files/checksum of 64.0 MiB: 900.0 MB/s; this process hashing it: 1000.0 MB/s (0.90x)",
        ] {
            assert!(table.contains(needle), "no {needle:?} in:\n{table}");
        }
    }

    #[test]
    fn every_goal_in_order_and_in_the_table() {
        let mut r = bare("base64");
        r.transfers = vec![transfer(1 << 20, Some(1.21), Some(1.1))];
        r.mcp = Some(vec![McpServer {
            name: "other".into(),
            ratio: Some(3.0),
            ..McpServer::default()
        }]);
        r.small = Some(small(150_000.0));
        r.memory.peak_bytes = Some(20 << 20);
        r.watch = Some(Watch::new(&[Duration::from_millis(60)], 0));
        r.list = Some(List::new(
            10,
            Duration::from_millis(10),
            Duration::from_millis(9),
            Duration::from_millis(8),
        ));
        r.goals = goals(&r);
        let figures: Vec<&str> = r.goals.iter().map(|g| g.figure.as_str()).collect();
        assert_eq!(
            figures,
            [
                "read 1 MiB vs sftp get",
                "upload 1 MiB vs sftp put -f",
                "1 KiB reads one at a time vs other",
                "1 KiB reads, 64 in flight",
                "broker peak memory (VmHWM)",
                "files/watch change → notification p99",
                "recursive files/list (10 entries) vs find -printf",
            ]
        );
        assert!(r.goals.iter().all(|g| g.met), "{:#?}", r.goals);
        let table = r.table();
        let block = &table[table.rfind("goals").expect("a goals block")..];
        assert!(block.contains("read 1 MiB vs sftp get"), "{table}");
        assert!(
            block.contains("1.21x") && block.contains(">= 1.0x"),
            "{table}"
        );
        assert!(block.contains("150,000 ops/s"), "{table}");
        assert!(table.contains("transfer, 1 MiB chunks"), "{table}");
    }
}

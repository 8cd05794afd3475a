//! The report as text: one JSON object, or the summary table (the run's settings, a block per
//! chunk size, the small operations, watch and list, the other MCP servers, memory, and the
//! goals last).

use std::fmt::Write;

use super::{Console, Goal, Latency, McpServer, Ops, Report, Small, Throughput, Transfer};
use crate::bench::Encoding;

impl Report {
    /// One JSON object and a newline.
    pub(crate) fn json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            serde_json::json!({"error": format!("cannot serialize the report: {e}")}).to_string()
        });
        text.push('\n');
        text
    }

    /// The summary table.
    pub(crate) fn table(&self) -> String {
        let mut t = String::new();
        let s = &self.settings;
        let _ = writeln!(t, "fsbroker bench");
        let _ = writeln!(t, "  broker    {}", self.broker);
        if let Some(f) = &self.file {
            let _ = writeln!(
                t,
                "  file      {} ({}{})",
                f.path,
                size(f.size),
                if f.generated {
                    ", made for this run"
                } else {
                    ""
                }
            );
        }
        let chunks: Vec<String> = s.chunk_sizes.iter().map(|&c| size(c)).collect();
        let _ = writeln!(
            t,
            "  requests  chunks of {}{}, {}, {} in flight; content checked: {}{}",
            chunks.join(", "),
            if chunks.len() > 1 { " (in turn)" } else { "" },
            s.encoding,
            s.depth,
            s.verify,
            s.sha256_engine
                .map(|e| format!(
                    " (and the broker's sha256 of each chunk, upload and file; engine {e})"
                ))
                .unwrap_or_default()
        );
        let vs_sftp = self.sftp.as_ref().is_some_and(|s| s.available);
        for tr in &self.transfers {
            transfer_table(&mut t, tr, vs_sftp, s.encoding);
        }
        if let Some(sm) = &self.small {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9} {:>13}",
                "small operations", "ops/s", "p50 ms", "p99 ms", "broker CPU µs"
            );
            let row = |t: &mut String, name: String, o: &Ops| {
                let cpu = o
                    .broker_cpu_us
                    .map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"));
                let _ = writeln!(
                    t,
                    "  {:<30} {:>10.0} {:>8.3} {:>9.3} {:>13}",
                    name,
                    o.ops_per_s,
                    o.p50_us / 1e3,
                    o.p99_us / 1e3,
                    cpu
                );
            };
            let kib = sm.read_size / 1024;
            row(
                &mut t,
                format!("read {kib} KiB, sequential"),
                &sm.read_1k.sequential,
            );
            row(
                &mut t,
                format!("read {kib} KiB, {} in flight", sm.depth),
                &sm.read_1k.pipelined,
            );
            row(
                &mut t,
                format!("list {} entries, sequential", sm.list_entries),
                &sm.list.sequential,
            );
            row(
                &mut t,
                format!("list {} entries, {} in flight", sm.list_entries, sm.depth),
                &sm.list.pipelined,
            );
        }
        if let Some(w) = &self.watch {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                "files/watch", "p50 ms", "p99 ms", "max ms"
            );
            let _ = writeln!(
                t,
                "  {:<30} {:>10.1} {:>8.1} {:>9.1}{}",
                format!("change → notification ({})", w.samples),
                w.p50_ms,
                w.p99_ms,
                w.max_ms,
                if w.missed > 0 {
                    format!("  ({} missed)", w.missed)
                } else {
                    String::new()
                }
            );
            let _ = writeln!(t, "  (includes the broker's 50 ms coalescing window)");
        }
        if let Some(l) = &self.list {
            let _ = writeln!(t);
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                "recursive list", "seconds", "ref s", "fsbroker"
            );
            let _ = writeln!(
                t,
                "  {:<30} {:>10.3}",
                format!("files/list, {} entries", l.entries),
                l.seconds
            );
            for (name, seconds, ratio) in [
                ("  vs find (names only)", l.find_seconds, l.ratio_to_find),
                (
                    "  vs find -printf (+ stat)",
                    l.find_stat_seconds,
                    l.ratio_to_find_stat,
                ),
            ] {
                let _ = writeln!(
                    t,
                    "  {:<30} {:>10} {:>8.3} {:>9}",
                    name,
                    "",
                    seconds,
                    format!("{ratio:.2}x")
                );
            }
        }
        if let Some(c) = &self.console {
            console_table(&mut t, c);
        }
        if let Some(i) = &self.integrity {
            let _ = writeln!(t);
            integrity_table(&mut t, i);
        }
        if let Some(servers) = &self.mcp {
            mcp_table(&mut t, servers, self.small.as_ref(), s.mcp_size);
        }
        let m = &self.memory;
        let _ = writeln!(t);
        let mib = |b: Option<u64>| b.map_or_else(|| "?".into(), mib);
        let _ = write!(t, "  broker peak memory (VmHWM)  {}", mib(m.peak_bytes));
        let mut parts = vec![format!("idle {}", mib(m.idle_bytes))];
        if m.after_read_bytes.is_some() {
            parts.push(format!("after reads {}", mib(m.after_read_bytes)));
        }
        if m.after_small_bytes.is_some() {
            parts.push(format!("after small ops {}", mib(m.after_small_bytes)));
        }
        let _ = writeln!(t, " ({})", parts.join(", "));
        let _ = writeln!(t, "  broker exit                 {}", m.exit);
        if let Some(note) = self.sftp.as_ref().and_then(|s| s.note.as_deref()) {
            let _ = writeln!(t);
            let _ = writeln!(t, "  no comparison: {note}");
        }
        goals_table(&mut t, &self.goals);
        t
    }
}

/// One chunk size's block: fsbroker's reads and upload, each followed by sftp's.
fn transfer_table(t: &mut String, tr: &Transfer, vs_sftp: bool, encoding: &str) {
    if tr.read.is_none() && tr.upload.is_none() {
        return;
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9}{}",
        format!("transfer, {} chunks", size(tr.chunk_size)),
        "MB/s",
        "GB/s",
        "seconds",
        if vs_sftp { "    vs sftp" } else { "" }
    );
    let row = |t: &mut String, name: &str, tp: &Throughput, ratio: Option<f64>| {
        let _ = writeln!(
            t,
            "  {:<30} {:>10.1} {:>8.3} {:>9.3}{}",
            name,
            tp.mb_per_s,
            tp.gb_per_s,
            tp.seconds,
            ratio.map_or_else(String::new, |r| format!(" {:>10}", format!("{r:.2}x")))
        );
    };
    if let Some(r) = &tr.read {
        row(t, "fsbroker files/read", &r.throughput, tr.read_ratio);
    }
    if let Some(g) = &tr.sftp_get {
        row(t, "sftp get", g, None);
    }
    if let Some(u) = &tr.upload {
        row(
            t,
            "fsbroker files/write upload",
            &u.throughput,
            tr.upload_ratio,
        );
    }
    if let Some(p) = &tr.sftp_put {
        row(t, "sftp put", p, None);
    }
    if let Some(p) = &tr.sftp_put_fsync {
        row(t, "sftp put -f (synced)", p, None);
    }
    if let Some(u) = &tr.upload {
        let _ = writeln!(
            t,
            "  (the upload's last chunk, which syncs and commits, took {:.3} s{})",
            u.last_chunk_seconds,
            tr.upload_ratio_fsync
                .map(|r| format!("; {r:.2}x sftp put -f"))
                .unwrap_or_default()
        );
    }
    if let Some(r) = tr
        .read
        .as_ref()
        .filter(|r| r.chunks_base64 > 0 && encoding == Encoding::Utf8.name())
    {
        let _ = writeln!(
            t,
            "  ({} of {} read chunks came back as base64: not UTF-8)",
            r.chunks_base64,
            r.chunks_base64 + r.chunks_utf8
        );
    }
}

/// The console's block: its latencies, then the pairs of reads without and with a page open.
fn console_table(t: &mut String, c: &Console) {
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9}",
        "the person's console", "p50 ms", "p99 ms", "max ms"
    );
    let row = |t: &mut String, name: &str, l: &Latency, missed: &str| {
        let _ = writeln!(
            t,
            "  {:<30} {:>10.1} {:>8.1} {:>9.1}{}",
            format!("{name} ({})", l.samples),
            l.p50_ms,
            l.p99_ms,
            l.max_ms,
            if l.missed > 0 {
                format!("  ({} {missed})", l.missed)
            } else {
                String::new()
            }
        );
    };
    row(t, "prompt → page", &c.prompt, "missed");
    row(t, "revoke → list_changed", &c.revoke_list_changed, "missed");
    row(
        t,
        "revoke → read refused",
        &c.revoke_refused,
        "missed or not refused",
    );
    row(t, "request → feed", &c.feed, "missed");
    let _ = writeln!(
        t,
        "  (page: a state event, then /api/state with the prompt; the feed sends merged reads\n   \
         every 250 ms)"
    );
    if c.pairs.is_empty() {
        return;
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9} {:>8}",
        format!(
            "read {}, {} chunks",
            size(c.pair_bytes),
            size(c.pair_chunk_size)
        ),
        "no page",
        "page",
        "page/no",
        "events"
    );
    for (i, p) in c.pairs.iter().enumerate() {
        let _ = writeln!(
            t,
            "  {:<30} {:>10.1} {:>8.1} {:>9} {:>8}",
            format!(
                "pair {} ({} first)",
                i + 1,
                if p.console_first { "page" } else { "no page" }
            ),
            p.off.mb_per_s,
            p.on.mb_per_s,
            format!("{:.2}x", p.ratio),
            p.activity_events
        );
    }
    if let Some(g) = c.ratio_geomean {
        let _ = writeln!(
            t,
            "  {:<30} {:>10} {:>8} {:>9}",
            "geometric mean",
            "",
            "",
            format!("{g:.2}x")
        );
    }
    // Every pair's events normally stand for all its requests: say so once, not six times.
    let all = c.pairs.first().map(|p| p.requests);
    let requests = if c
        .pairs
        .iter()
        .all(|p| Some(p.requests) == all && p.activity_requests == p.requests)
    {
        format!("all {} requests in every pair", all.unwrap_or(0))
    } else {
        let each: Vec<String> = c
            .pairs
            .iter()
            .map(|p| format!("{} of {}", p.activity_requests, p.requests))
            .collect();
        format!("{} requests", each.join(", "))
    };
    let _ = writeln!(
        t,
        "  (MB/s; page: --console and /api/events open and drained; events: activity events the\n   \
         page got for the read, standing for {requests})"
    );
}

/// The integrity block: the pairs without and with the broker's hash, and a whole file's.
fn integrity_table(t: &mut String, i: &super::Integrity) {
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9}",
        format!("sha256, {} chunks ({})", size(i.chunk_size), i.engine),
        "without",
        "with",
        "with/out"
    );
    for (kind, pairs, mean) in [
        ("read", &i.reads, i.read_geomean),
        ("upload", &i.uploads, i.upload_geomean),
    ] {
        for (n, p) in pairs.iter().enumerate() {
            let _ = writeln!(
                t,
                "  {:<30} {:>10.1} {:>8.1} {:>9}",
                format!(
                    "{kind} pair {} ({} first)",
                    n + 1,
                    if p.hashed_first { "with" } else { "without" }
                ),
                p.off.mb_per_s,
                p.on.mb_per_s,
                format!("{:.2}x", p.ratio)
            );
        }
        if let Some(g) = mean {
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9}",
                format!("{kind}: geometric mean"),
                "",
                "",
                format!("{g:.2}x")
            );
        }
    }
    let _ = writeln!(
        t,
        "  files/checksum of {}: {:.1} MB/s; this process hashing it: {:.1} MB/s ({:.2}x)",
        mib(i.bytes),
        i.checksum.mb_per_s,
        i.local_sha256.mb_per_s,
        i.checksum.mb_per_s / i.local_sha256.mb_per_s.max(1e-9)
    );
    let _ = writeln!(
        t,
        "  (MB/s; with: \"sha256\": true on every read, checked against the chunk's hash made\n   \
         beforehand; the upload's hash announced on its first chunk, checked at its commit)"
    );
}

/// The goals' block, last: each figure, what this run measured, the goal, met or not.
fn goals_table(t: &mut String, goals: &[Goal]) {
    if goals.is_empty() {
        return;
    }
    // Columns as wide as their longest entry, so a long server name or goal shifts no row.
    let widest = |f: fn(&Goal) -> &str, least: usize| {
        goals
            .iter()
            .map(|g| f(g).chars().count())
            .fold(least, usize::max)
    };
    let figure = widest(|g| &g.figure, 40);
    let measured = widest(|g| &g.measured, 10);
    let goal = widest(|g| &g.goal, 8);
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<figure$} {:>measured$}     goal",
        "goals", "measured"
    );
    for g in goals {
        let _ = writeln!(
            t,
            "  {:<figure$} {:>measured$}     {:<goal$}  {}",
            g.figure,
            g.measured,
            g.goal,
            if g.met { "met" } else { "NOT met" }
        );
    }
}

/// The other MCP servers' section.
fn mcp_table(t: &mut String, servers: &[McpServer], small: Option<&Small>, large: Option<u64>) {
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "  {:<30} {:>10} {:>8} {:>9} {:>12} {:>9} {:>10}",
        "other MCP servers", "ops/s", "p50 ms", "p99 ms", "fsbroker is", "MB/s", "VmHWM MiB"
    );
    let dash = || "-".to_owned();
    for s in servers {
        let name = match s.server_info.as_ref().and_then(|i| i.version.as_deref()) {
            Some(v) => format!("{} {v}", s.name),
            None => s.name.clone(),
        };
        if s.small.is_some() || s.large.is_some() {
            let m = s.small.as_ref();
            let l = s.large.as_ref();
            let _ = writeln!(
                t,
                "  {:<30} {:>10} {:>8} {:>9} {:>12} {:>9} {:>10}",
                name,
                m.map_or_else(dash, |m| format!("{:.0}", m.ops_per_sec)),
                m.map_or_else(dash, |m| format!("{:.3}", m.p50_ms)),
                m.map_or_else(dash, |m| format!("{:.3}", m.p99_ms)),
                s.ratio.map_or_else(dash, |r| format!("{r:.2}x")),
                l.map_or_else(dash, |l| format!("{:.1}", l.mb_per_sec)),
                l.and_then(|l| l.vm_hwm_mib)
                    .map_or_else(dash, |v| format!("{v:.1}")),
            );
        }
        if let Some(e) = &s.error {
            let mut lines = e.lines();
            let _ = writeln!(
                t,
                "  {:<30} error: {}",
                name,
                lines.next().unwrap_or_default()
            );
            for line in lines {
                let _ = writeln!(t, "  {:<30}   {line}", "");
            }
        }
    }
    let kib = small.map_or(1, |s| s.read_size / 1024);
    let large = large.map_or_else(|| "a large file".to_owned(), size);
    let _ = writeln!(
        t,
        "  (ops/s, p50, p99: read_text_file of {kib} KiB files, one call at a time, timed like\n   \
         \"read {kib} KiB, sequential\"; fsbroker is: fsbroker's ops/s there ÷ the server's;\n   \
         MB/s: one read_media_file of {large}; VmHWM: the server's peak memory after it)"
    );
    for s in servers {
        let _ = writeln!(t, "  {:<30} {}", s.name, s.launched);
    }
}

/// Bytes in MiB, one decimal.
pub(super) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A count, rounded, with thousands separated by commas: `87,000`.
pub(super) fn thousands(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes, in the binary unit that names them best.
pub(super) fn size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit {
            let v = bytes as f64 / unit as f64;
            return if bytes % unit == 0 {
                format!("{} {name}", bytes / unit)
            } else {
                format!("{v:.2} {name}")
            };
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::thousands;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        assert_eq!(thousands(87_000.0), "87,000");
        assert_eq!(thousands(1_234_567.0), "1,234,567");
    }
}

//! What the benches and the tests share: finding the broker binary, a seeded generator, the
//! `/proc` readers that measure a broker from outside, and the figures made of them.
//!
//! A bench includes it with `mod kit;`; the tests with
//! `#[path = "../../benches/kit/mod.rs"] pub mod kit;` in `tests/common/mod.rs` (see
//! docs/testing.md). It uses only the standard library, so every includer can.

#![allow(dead_code)] // each includer uses its own part

use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// The broker binary
// ---------------------------------------------------------------------------------------------

/// The `fsbroker` binary for a bench: the one Cargo built for it
/// (`CARGO_BIN_EXE_fsbroker`), else `target/release/fsbroker`, else `target/debug/fsbroker`;
/// `Err` says where it looked. (The tests take theirs from `common::bin()`, which also honours
/// `FSBROKER_TEST_BIN`.)
pub fn broker_binary() -> Result<PathBuf, String> {
    if let Some(p) = option_env!("CARGO_BIN_EXE_fsbroker") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    for profile in ["release", "debug"] {
        let p = manifest.join("target").join(profile).join("fsbroker");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(format!(
        "no fsbroker binary (looked for $CARGO_BIN_EXE_fsbroker and target/{{release,debug}}/fsbroker \
         under {}): run `cargo build --release` first",
        manifest.display()
    ))
}

// ---------------------------------------------------------------------------------------------
// A seeded generator
// ---------------------------------------------------------------------------------------------

/// splitmix64's output function of `z + 0x9e37_79b9_7f4a_7c15`: one well-mixed word per
/// input (what [`Rng`] draws, and a way to make a file's words from their index).
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// splitmix64 from a fixed seed: every run draws the same sequence, so a bench asks for the
/// same mix and a failing test reproduces.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        let z = self.0;
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        splitmix64(z)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A number in `0..n` for `u64` bounds (file offsets, lengths); panics when `n` is 0.
    pub fn below_u64(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `n` incompressible bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// `n` bytes of printable text in lines, with the odd `"` and `\` (JSON escapes them),
    /// from a random place in a fixed line.
    pub fn text(&mut self, n: usize) -> Vec<u8> {
        const LINE: &[u8] =
            b"The quick brown fox jumps over the lazy dog; \"quoted\" \\ 0123456789\n";
        let start = self.below(LINE.len());
        LINE.iter().copied().cycle().skip(start).take(n).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------------------------

/// The number a field of `/proc/PID/status` starts with: `VmRSS`, `VmHWM`, ... in KiB (the
/// file says kB), `Threads` as a count. `None` when the process or the field is gone.
pub fn status_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// `VmRSS` and `VmHWM` of `pid`, in KiB.
pub fn memory_kib(pid: u32) -> Option<(u64, u64)> {
    Some((status_field(pid, "VmRSS")?, status_field(pid, "VmHWM")?))
}

/// The process's state letter (`R`, `S`, `Z`, ...) from `/proc/PID/status`.
pub fn state(pid: u32) -> Option<char> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|rest| rest.trim_start().chars().next())
}

/// How many descriptors `pid` has open (0 when it is gone).
pub fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// The `fdinfo` text of each inotify instance process `pid` holds (none when it is gone).
fn inotify_fdinfo(pid: u32) -> impl Iterator<Item = String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().contains("inotify"))
        })
        .map(move |fd| {
            let info = format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy());
            std::fs::read_to_string(info).unwrap_or_default()
        })
}

/// The inotify watches process `pid` holds, over all its inotify instances (from
/// `/proc/PID/fdinfo`; 0 when it is gone).
pub fn inotify_watches(pid: u32) -> usize {
    inotify_fdinfo(pid)
        .map(|t| t.lines().filter(|l| l.starts_with("inotify wd:")).count())
        .sum()
}

/// Whether process `pid` holds any inotify watch (stops at the first instance that has one).
pub fn holds_inotify_watch(pid: u32) -> bool {
    inotify_fdinfo(pid).any(|t| t.contains("inotify wd:"))
}

/// Whether process `pid` listens on a Unix socket at `path`: the path exists, and one of the
/// process's sockets is listening (`__SO_ACCEPTCON` in `/proc/net/unix`). Asked without
/// connecting: a probe would be a session of its own. Not matched by name: the broker binds
/// under a temporary name and renames the socket into place once it listens, and
/// `/proc/net/unix` keeps the name it was bound with.
pub fn is_listening(path: &Path, pid: u32) -> bool {
    if std::fs::symlink_metadata(path).is_err() {
        return false;
    }
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_string_lossy();
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 7 && f[3] == "00010000" && sockets.iter().any(|s| s == f[6])
        })
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------

/// KiB as MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The nearest-rank `q`-quantile (`q` in 0..=1) of `sorted` (ascending); `None` when empty.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

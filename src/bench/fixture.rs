//! The bench's files: its workspace (removed afterwards), the test file (random bytes, or
//! random ASCII text for utf-8 runs, written fast) and the small files.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use sha2::{Digest, Sha256};

use super::Encoding;

/// Small files made for the small-operation phase, and the entries a listing of them has.
pub(crate) const SMALL_FILES: usize = 32;
/// Size of each small file.
pub(crate) const SMALL_SIZE: usize = 1024;

/// splitmix64: fast, and its output passes for incompressible.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn seeded() -> Rng {
        let mut seed = [0u8; 8];
        // Any seed will do; the OS's just makes runs differ.
        let _ = rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty());
        Rng(u64::from_le_bytes(seed))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Fills `buf` with random bytes, or with random text (64 characters: letters, digits,
    /// space and newline — lines of 64 characters on average).
    pub(crate) fn fill(&mut self, buf: &mut [u8], text: bool) {
        const TEXT: &[u8; 64] =
            b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n";
        let mut words = buf.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next().to_le_bytes());
        }
        let tail = words.into_remainder();
        let last = self.next().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
        if text {
            for b in buf.iter_mut() {
                *b = TEXT[usize::from(*b & 63)];
            }
        }
    }
}

/// Writes `size` random bytes (text for utf-8) to a new file at `path`; returns their sha256
/// when `hash`.
pub(crate) fn write_random(
    path: &Path,
    size: u64,
    encoding: Encoding,
    hash: bool,
    bar: &ProgressBar,
) -> std::io::Result<Option<[u8; 32]>> {
    const BLOCK: usize = 4 << 20;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let mut rng = Rng::seeded();
    let mut hasher = hash.then(Sha256::new);
    let mut buf = vec![0u8; BLOCK];
    let mut left = size;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        rng.fill(&mut buf[..n], encoding == Encoding::Utf8);
        file.write_all(&buf[..n])?;
        if let Some(h) = &mut hasher {
            h.update(&buf[..n]);
        }
        left -= n as u64;
        bar.inc(n as u64);
    }
    // Written back now, so the disk is quiet while the broker is measured (the pages stay in
    // the page cache).
    file.sync_all()?;
    Ok(hasher.map(|h| h.finalize().into()))
}

/// The sha256 of a file.
pub(crate) fn sha256_file(path: &Path, bar: &ProgressBar) -> std::io::Result<[u8; 32]> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finalize().into());
        }
        hasher.update(&buf[..n]);
        bar.inc(n as u64);
    }
}

/// [`SMALL_FILES`] text files of [`SMALL_SIZE`] bytes in `dir`; returns their paths and
/// contents.
pub(crate) fn write_small_files(dir: &Path) -> std::io::Result<Vec<(PathBuf, Vec<u8>)>> {
    let mut rng = Rng::seeded();
    (0..SMALL_FILES)
        .map(|i| {
            let path = dir.join(format!("f{i:02}.txt"));
            let mut content = vec![0u8; SMALL_SIZE];
            rng.fill(&mut content, true);
            std::fs::write(&path, &content)?;
            Ok((path, content))
        })
        .collect()
}

/// A fresh directory under the temp directory, removed with everything in it on drop.
pub(crate) struct Workspace {
    dir: PathBuf,
}

impl Workspace {
    pub(crate) fn create() -> std::io::Result<Workspace> {
        let base = std::env::temp_dir();
        let mut rng = Rng::seeded();
        let dir = base.join(format!(
            "fsbroker-bench-{}-{:08x}",
            std::process::id(),
            rng.next() as u32
        ));
        std::fs::create_dir(&dir)?;
        // Canonical, so the absolute paths in requests match the roots exactly.
        let dir = std::fs::canonicalize(&dir)?;
        Ok(Workspace { dir })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!(
                "fsbroker bench: cannot remove the workspace {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// On Ctrl-C or SIGTERM, removes `dir` (which holds a file as large as the test) and exits.
/// The broker is in the same process group, so the terminal's Ctrl-C ends it too; a SIGTERM
/// closes its stdin when this process exits, which ends it as well.
pub(crate) fn remove_on_interrupt(dir: &Path) {
    let dir = dir.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("fsbroker-bench-signals".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            let code = rt.block_on(async {
                use tokio::signal::unix::{SignalKind, signal};
                let (Ok(mut int), Ok(mut term)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) else {
                    return None;
                };
                tokio::select! {
                    _ = int.recv() => Some(130),
                    _ = term.recv() => Some(143),
                }
            });
            if let Some(code) = code {
                let _ = std::fs::remove_dir_all(&dir);
                eprintln!("\nfsbroker bench: interrupted; workspace removed");
                std::process::exit(code);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch for Ctrl-C; an interrupted run leaves its workspace");
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn text_is_ascii_and_bytes_vary() {
        let mut rng = Rng(1);
        let mut buf = vec![0u8; 1001];
        rng.fill(&mut buf, true);
        assert!(
            buf.iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b' ' || *b == b'\n')
        );
        rng.fill(&mut buf, false);
        let distinct = buf.iter().collect::<std::collections::HashSet<_>>().len();
        assert!(distinct > 200, "{distinct}");
    }
}

//! A staging file: where a write or an upload goes before it is committed over its target
//! ([`Parent::commit`](super::Parent::commit)), private to the owner until then, and removed
//! on every path that does not commit.

use std::fs::File;
use std::io::Write;

use cap_std::fs::Dir;

use crate::error::{Error, Result};

/// A staging file beside its target. Removed when dropped unless committed, so every
/// failure path — an error, a quota, a session that ends mid-upload — cleans up.
#[derive(Debug)]
pub(crate) struct Staged {
    pub(super) dir: Dir,
    pub(super) name: String,
    pub(super) file: File,
    pub(super) done: bool,
}

impl Staged {
    /// Appends bytes.
    pub(crate) fn write(&mut self, data: &[u8], raw: &str) -> Result<()> {
        self.file
            .write_all(data)
            .map_err(|e| Error::from_io(&e, raw))
    }

    /// Starts writing what is staged to the disk, without waiting for it: an upload's
    /// chunks then go to the disk while the next ones arrive, so the `fsync` of the final
    /// chunk has little left to do, and the dirty pages of a large upload never pile up to
    /// the point where the kernel throttles the writer. Best effort.
    pub(crate) fn start_writeback(&self) {
        use std::os::fd::AsRawFd;
        // No safe wrapper: rustix has no sync_file_range(2).
        // SAFETY: `sync_file_range` takes a descriptor and three integers, no memory; the
        // descriptor belongs to `self.file`, open for the whole call. Offset 0 with length 0
        // means the whole file; `SYNC_FILE_RANGE_WRITE` only starts writeback of dirty pages.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range failed");
        }
    }

    /// The open staging file (to copy into it, or to set its permissions).
    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes data and sets the permission bits the committed file will have.
    pub(crate) fn finish(&mut self, mode: u32, raw: &str) -> Result<()> {
        rustix::fs::fchmod(&self.file, rustix::fs::Mode::from_raw_mode(mode))
            .map_err(|e| Error::from_io(&e.into(), raw))?;
        self.file.sync_all().map_err(|e| Error::from_io(&e, raw))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.dir.remove_file(&self.name) {
                tracing::warn!(name = %self.name, error = %e, "could not remove a staging file");
            }
        }
    }
}

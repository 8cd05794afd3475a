//! The permission bits of a written file: the replaced file's, or those `open(2)` would give
//! a new one under the process's umask.

use std::os::unix::fs::PermissionsExt;
use std::sync::LazyLock;

/// The permission bits of the file being replaced, or the default for a new file.
pub(super) fn mode_for(current: Option<&std::fs::Metadata>) -> u32 {
    current.map_or(*NEW_FILE_MODE, |m| m.permissions().mode() & 0o7777)
}

/// `0o666` less the process umask, as `open(2)` would give a new file. Read once from
/// `/proc/self/status`: `umask(2)` can only be read by setting it, which would race with
/// other threads creating files.
static NEW_FILE_MODE: LazyLock<u32> = LazyLock::new(|| {
    #[allow(clippy::disallowed_methods)] // the process's own status, never a request path
    let umask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022);
    0o666 & !umask
});

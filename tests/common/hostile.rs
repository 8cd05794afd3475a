//! The hostile-path kit: a temp tree full of traps around a root, the markers that must never
//! reach the wire, the contract's error numbers, and small file helpers. The attack suites
//! (`attacks.rs` for reads and listings, `write_attacks.rs` for mutations, `protected.rs`,
//! `indirection.rs`) build on it and add the traps only they need.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{PolicyToml, RootToml, tempdir, uri_path, with_deadline};

/// In every file outside the roots: must never reach the wire.
pub const MARKER: &str = "OUTSIDE-MARKER-7f3a";
/// In every file the deny globs cover: must never reach the wire under the policy.
pub const DENIED_MARKER: &str = "DENIED-MARKER-c41e";
/// `outside/secret.txt` (it holds [`MARKER`]).
pub const SECRET_TXT: &str = "OUTSIDE-MARKER-7f3a outside/secret.txt\n";
/// `proj/a.txt`.
pub const A_TXT: &str = "inside a\n";
/// `proj/sub/b.txt`.
pub const B_TXT: &str = "inside b\n";
/// `second/s.txt`.
pub const S_TXT: &str = "inside the second root\n";
/// The reason of a refusal for a path outside every root.
pub const OUTSIDE: &str = "outside every root";
/// The reason of a refusal by a deny glob.
pub const DENIED: &str = "denied by policy";
/// The deny globs of the world's policy on `proj`.
pub const DENY_GLOBS: &[&str] = &[".git/**", "**/.env", "secrets"];

/// Writes `text` to `path`, making its folders.
pub fn put(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Makes an executable script.
pub fn put_exe(path: &Path, text: &str) {
    put(path, text);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Makes each of `dirs` (relative to `base`) with its parents.
pub fn mkdirs(base: &Path, dirs: &[&str]) {
    for d in dirs {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
}

/// `file://` URI of an absolute path.
pub fn uri(p: &Path) -> String {
    format!("file://{}", uri_path(p))
}

/// The JSON-RPC number of a contract error code (docs/protocol.md, "Errors").
pub fn number(data_code: &str) -> i64 {
    match data_code {
        "FILE_NOT_FOUND" => -31001,
        "PERMISSION_DENIED" => -31002,
        "INVALID_PATH" => -31003,
        "IO_ERROR" => -31004,
        "CONCURRENCY_CONFLICT" => -31006,
        "QUOTA_EXCEEDED" => -31007,
        "ALREADY_EXISTS" => -31009,
        "FILE_LOCKED" => -32100,
        other => panic!("no number for {other}"),
    }
}

/// A value short enough for a failure message (its JSON text, cut).
pub fn shown(v: &Value) -> String {
    cut(&v.to_string(), |s| s.to_owned())
}

/// A request path short enough for a failure message (debug-quoted, cut).
pub fn shown_str(s: &str) -> String {
    cut(s, |s| format!("{s:?}"))
}

fn cut(s: &str, quote: impl Fn(&str) -> String) -> String {
    if s.len() > 400 {
        let end = (0..=200)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        format!("{}... ({} bytes)", quote(&s[..end]), s.len())
    } else {
        quote(s)
    }
}

/// The trap tree, kept alive for the test's length. In a fresh temp dir `T`:
///
/// ```text
/// T/outside/secret.txt        outside every root, holds MARKER
/// T/proj_evil/secret          a prefix sibling of the root (CVE-2025-53110), holds MARKER
/// T/proj/                     the root: a.txt, sub/b.txt; .env, sub/.env, .git/config and
///                             secrets/key.pem (DENIED_MARKER; the policy denies them);
///                             symlinks out (lnk_file_rel, lnk_file_abs, lnk_evil), a loop
///                             (loop_a, loop_b), links to denied names (ok.txt, gitlink,
///                             lnk_secret), one inside (lnk_in), and a FIFO (fifo)
/// T/second/                   the policy's second root: s.txt, lnk_cross_env -> ../proj/.env
/// T/policy.toml               proj (deny DENY_GLOBS) and second, consent auto, in `mode`
/// ```
pub struct World {
    _tmp: tempfile::TempDir,
    /// `T`.
    pub base: PathBuf,
    /// `T/proj`.
    pub proj: PathBuf,
    /// `T/second`.
    pub second: PathBuf,
    /// `T/proj/fifo`.
    pub fifo: PathBuf,
    /// `T/policy.toml`.
    pub policy: PathBuf,
}

impl World {
    /// Builds the tree; the policy grants both roots in `mode` (`None`: read-only).
    pub fn new(mode: Option<&str>) -> World {
        let (tmp, base) = tempdir();
        let proj = base.join("proj");
        let second = base.join("second");

        assert!(SECRET_TXT.starts_with(MARKER));
        put(&base.join("outside/secret.txt"), SECRET_TXT);
        put(
            &base.join("proj_evil/secret"),
            &format!("{MARKER} proj_evil/secret\n"),
        );

        put(&proj.join("a.txt"), A_TXT);
        put(&proj.join("sub/b.txt"), B_TXT);
        put(&proj.join(".env"), &format!("{DENIED_MARKER} .env\n"));
        put(
            &proj.join("sub/.env"),
            &format!("{DENIED_MARKER} sub/.env\n"),
        );
        put(
            &proj.join(".git/config"),
            &format!("{DENIED_MARKER} .git\n"),
        );
        put(
            &proj.join("secrets/key.pem"),
            &format!("{DENIED_MARKER} key\n"),
        );

        let fifo = proj.join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .expect("mkfifo");

        put(&second.join("s.txt"), S_TXT);
        symlink("../proj/.env", second.join("lnk_cross_env")).unwrap();

        let root = |path: &Path, name: &str| {
            let r = RootToml::at(path).name(name);
            match mode {
                Some(m) => r.mode(m),
                None => r,
            }
        };
        let policy = PolicyToml::new()
            .root(root(&proj, "proj").deny(DENY_GLOBS))
            .root(root(&second, "second"))
            .write_to(&base.join("policy.toml"));

        let w = World {
            _tmp: tmp,
            base,
            proj,
            second,
            fifo,
            policy,
        };
        w.link("../outside/secret.txt", "lnk_file_rel");
        w.link(w.base.join("outside/secret.txt"), "lnk_file_abs");
        w.link("../proj_evil/secret", "lnk_evil");
        w.link("loop_b", "loop_a");
        w.link("loop_a", "loop_b");
        w.link(".env", "ok.txt");
        w.link(".git", "gitlink");
        w.link("secrets/key.pem", "lnk_secret");
        w.link("a.txt", "lnk_in");
        w
    }

    /// Makes the symlink `proj/AT` pointing at `target`.
    pub fn link(&self, target: impl AsRef<Path>, at: &str) {
        let at = self.proj.join(at);
        symlink(target.as_ref(), &at).unwrap_or_else(|e| panic!("symlink {}: {e}", at.display()));
    }

    /// Runs `f` on its own thread within `limit`. On timeout both ends of the FIFO are opened
    /// without blocking, so a broker stuck opening it (for reading or for writing) comes
    /// loose, and the test fails.
    pub fn guarded(self, limit: Duration, f: impl FnOnce(World) + Send + 'static) {
        let fifo = self.fifo.clone();
        with_deadline(
            limit,
            move || {
                use std::os::unix::fs::OpenOptionsExt;
                let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
                let reader = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(nonblock)
                    .open(&fifo);
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(nonblock)
                    .open(&fifo);
                drop(reader);
            },
            move || f(self),
        );
    }
}

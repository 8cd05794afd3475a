//! Request path → (root, relative path), lexically.
//!
//! This step only *chooses*: which root, and which normalised path beneath it. It never
//! touches the disk and never decides that a file is safe to open — [`super::open`] does that
//! through the root's directory capability, where symlinks are resolved by the kernel beneath
//! the root. Because the result is a plain relative path with no `.`, `..` or empty segment,
//! deny globs see the path the way it will be opened.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::Root;
use crate::error::{Error, ErrorKind, Result};
use crate::limits::MAX_DEPTH;
pub use crate::limits::MAX_WALK_DEPTH;

/// A request path placed beneath a root.
///
/// Only [`resolve`] and the methods here make one, so a `Resolved` always holds a normalised
/// path: no `.`, `..` or empty segment, relative to its root.
#[derive(Debug, Clone)]
pub struct Resolved {
    root: Arc<Root>,
    rel: String,
}

impl Resolved {
    /// The root the path lies in.
    pub fn root(&self) -> &Arc<Root> {
        &self.root
    }

    /// Normalised, `/`-separated, relative to the root; `""` is the root itself.
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// Whether this is the root itself.
    pub fn is_root(&self) -> bool {
        self.rel.is_empty()
    }

    /// The absolute path, as spelled (symlinks not resolved).
    pub fn absolute(&self) -> PathBuf {
        self.root.join(&self.rel)
    }

    /// The ancestors of this path beneath the root, nearest to the root first, without the
    /// root itself and without this path.
    pub fn ancestors(&self) -> impl Iterator<Item = Resolved> + '_ {
        self.rel.match_indices('/').map(|(i, _)| Resolved {
            root: Arc::clone(&self.root),
            rel: self.rel[..i].to_owned(),
        })
    }

    /// Where this path really leads, as a path of the same root: every symlink resolved by
    /// the kernel beneath the root (one that leads out, or is absolute, is refused as outside
    /// every root). A path that does not exist yet is its deepest existing ancestor, resolved,
    /// with the rest appended; a dangling symlink on the way is refused.
    ///
    /// This is the one place that answers "where does this path lead": consent shows and
    /// grants it, writes go through it, watches cover it, and deny globs, modes and grants are
    /// checked on it. It is advisory — a link can change after it answers — so opens check the
    /// descriptor they got again (`sandbox/open.rs`).
    pub fn real(&self, raw: &str) -> Result<Resolved> {
        let dir = self.root.dir();
        let mut known = self.rel.as_str();
        let mut rest: Vec<&str> = Vec::new();
        let base = loop {
            let attempt = if known.is_empty() {
                Ok(PathBuf::new())
            } else {
                dir.canonicalize(known)
            };
            match attempt {
                Ok(p) => break p,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let (parent, name) = known.rsplit_once('/').unwrap_or(("", known));
                    let parent_dir = if parent.is_empty() {
                        dir.try_clone()
                    } else {
                        dir.open_dir(parent)
                    };
                    // The last existing component is a link to nowhere: there is no telling
                    // where a file created through it would land.
                    if parent_dir.is_ok_and(|d| {
                        d.symlink_metadata(name)
                            .is_ok_and(|m| m.file_type().is_symlink())
                    }) {
                        return Err(Error::new(
                            ErrorKind::InvalidPath,
                            "a symlink whose target does not exist",
                        )
                        .with_path(raw));
                    }
                    rest.push(name);
                    known = parent;
                }
                Err(e) => return Err(Error::from_io(&e, raw)),
            }
        };
        let base = base.to_str().ok_or_else(|| {
            Error::new(ErrorKind::InvalidPath, "path is not UTF-8").with_path(raw)
        })?;
        let mut real = if base == "." { "" } else { base }
            .trim_start_matches("./")
            .to_owned();
        for name in rest.into_iter().rev() {
            if !real.is_empty() {
                real.push('/');
            }
            real.push_str(name);
        }
        Ok(Resolved {
            root: Arc::clone(&self.root),
            rel: real,
        })
    }

    /// The path in `NAME/rel` form, as results and notifications carry it.
    pub fn display(&self) -> String {
        join_display(self.root.name(), &self.rel)
    }

    /// `rel` as a path for cap-std; `.` for the root itself.
    pub fn rel_path(&self) -> &Path {
        if self.rel.is_empty() {
            Path::new(".")
        } else {
            Path::new(&self.rel)
        }
    }
}

/// `NAME` or `NAME/rel`.
pub(crate) fn join_display(name: &str, rel: &str) -> String {
    if rel.is_empty() {
        name.to_owned()
    } else {
        let mut s = String::with_capacity(name.len() + 1 + rel.len());
        s.push_str(name);
        s.push('/');
        s.push_str(rel);
        s
    }
}

/// Resolves one of the four path forms of docs/protocol.md ("Paths") against `roots`.
///
/// 1. `NAME/rel` when the first segment is a root's name (this wins over form 4);
/// 2. an absolute path beneath a root's canonical or configured path (the deepest root wins);
/// 3. a `file://` URI, percent-decoded, host empty or `localhost`;
/// 4. with exactly one root, any other relative path, relative to it.
///
/// Errors carry `raw` as their path.
pub fn resolve(roots: &[Arc<Root>], raw: &str) -> Result<Resolved> {
    resolve_inner(roots, raw).map_err(|e| e.with_path(raw))
}

fn resolve_inner(roots: &[Arc<Root>], raw: &str) -> Result<Resolved> {
    if raw.is_empty() {
        return Err(Error::new(ErrorKind::InvalidPath, "empty path"));
    }
    if raw.contains('\0') {
        return Err(Error::new(ErrorKind::InvalidPath, "NUL byte in path"));
    }
    if has_file_scheme(raw) {
        let path = file_uri_to_path(raw)?;
        return resolve_absolute(roots, &path);
    }
    if raw.starts_with('/') {
        return resolve_absolute(roots, raw);
    }
    let (first, rest) = raw.split_once('/').unwrap_or((raw, ""));
    if let Some(root) = roots.iter().find(|r| r.name() == first) {
        return beneath(root, rest);
    }
    match roots {
        [only] => beneath(only, raw),
        _ => Err(Error::outside_roots()),
    }
}

fn has_file_scheme(raw: &str) -> bool {
    raw.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("file:"))
}

/// Percent-decodes a `file:` URI into an absolute path string.
fn file_uri_to_path(raw: &str) -> Result<String> {
    let bad = |why: &str| Error::new(ErrorKind::InvalidPath, format!("bad file URI: {why}"));
    let url = url::Url::parse(raw).map_err(|e| bad(&e.to_string()))?;
    match url.host_str() {
        None | Some("") | Some("localhost") => {}
        Some(_) => return Err(bad("host must be empty or localhost")),
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("query and fragment are not allowed"));
    }
    // `to_file_path` percent-decodes each segment; the URL parser has already applied `.`
    // and `..` segments (including `%2e%2e`), so what is left can only climb through a
    // decoded `%2F`, and the lexical normalisation below refuses that.
    let mut decoded = String::new();
    for segment in url.path_segments().into_iter().flatten() {
        let text = percent_encoding::percent_decode_str(segment)
            .decode_utf8()
            .map_err(|_| bad("path is not UTF-8 once decoded"))?;
        if text.contains('\0') {
            return Err(Error::new(ErrorKind::InvalidPath, "NUL byte in path"));
        }
        decoded.push('/');
        decoded.push_str(&text);
    }
    if decoded.is_empty() {
        decoded.push('/');
    }
    Ok(decoded)
}

/// Places an absolute path under the deepest root whose canonical or configured path is a
/// component-wise prefix of it (so `/x/proj_evil` is never under `/x/proj`).
fn resolve_absolute(roots: &[Arc<Root>], abs: &str) -> Result<Resolved> {
    // `.` and `..` are applied before the root is chosen, so `/outer/x/../inner/f` belongs to
    // the inner root (the deepest wins) and `/outer/inner/../f` to the outer one.
    let abs = lexical(Path::new(abs));
    let mut best: Option<(&Arc<Root>, PathBuf, usize)> = None;
    for root in roots {
        for prefix in [root.path().to_path_buf(), lexical(root.configured_path())] {
            if let Ok(rest) = abs.strip_prefix(&prefix) {
                let depth = prefix.components().count();
                if best.as_ref().is_none_or(|(_, _, d)| depth > *d) {
                    best = Some((root, rest.to_path_buf(), depth));
                }
            }
        }
    }
    let (root, rest, _) = best.ok_or_else(Error::outside_roots)?;
    let rest = rest
        .to_str()
        .ok_or_else(|| Error::new(ErrorKind::InvalidPath, "path is not UTF-8"))?;
    beneath(root, rest)
}

/// An absolute path with `.` and `..` applied lexically (`..` at `/` stays at `/`).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// Normalises `rel` beneath `root`: drops empty and `.` segments, applies `..` lexically, and
/// refuses a `..` that would climb above the root.
fn beneath(root: &Arc<Root>, rel: &str) -> Result<Resolved> {
    let mut parts: Vec<&str> = Vec::new();
    for comp in Path::new(rel).components() {
        match comp {
            Component::Normal(s) => {
                // Request paths are JSON strings, so every component is UTF-8.
                parts.push(s.to_str().unwrap_or_default());
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                if parts.pop().is_none() {
                    return Err(Error::outside_roots());
                }
            }
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidPath,
            format!("path too deep (more than {MAX_DEPTH} components)"),
        ));
    }
    Ok(Resolved {
        root: Arc::clone(root),
        rel: parts.join("/"),
    })
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests set up their own files
mod tests {
    use super::*;
    use crate::sandbox::{ConsentMode, Mode, RootSpec};

    fn root(dir: &Path, name: &str) -> Arc<Root> {
        Arc::new(
            Root::open(&RootSpec {
                path: dir.to_path_buf(),
                name: Some(name.into()),
                mode: Mode::ReadOnly,
                consent: ConsentMode::Auto,
                deny: vec![],
            })
            .unwrap(),
        )
    }

    fn check(roots: &[Arc<Root>], raw: &str, expected: std::result::Result<&str, ErrorKind>) {
        match (resolve(roots, raw), expected) {
            (Ok(r), Ok(want)) => assert_eq!(r.display(), want, "{raw:?}"),
            (Err(e), Err(kind)) => {
                assert_eq!(e.kind(), kind, "{raw:?}: {e}");
                assert_eq!(e.path(), Some(raw));
            }
            (got, want) => panic!("{raw:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn the_four_forms() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("proj")).unwrap();
        std::fs::create_dir_all(base.join("proj_evil")).unwrap();
        let one = [root(&base.join("proj"), "p")];
        let b = base.display().to_string();
        check(&one, "p/src/a.rs", Ok("p/src/a.rs"));
        check(&one, "p", Ok("p"));
        check(&one, "src/./x//y", Ok("p/src/x/y"));
        check(&one, &format!("{b}/proj/a b"), Ok("p/a b"));
        check(&one, &format!("file://{b}/proj/a%20b"), Ok("p/a b"));
        check(&one, &format!("file://localhost{b}/proj/x"), Ok("p/x"));
        check(&one, &format!("FILE://{b}/proj/x"), Ok("p/x"));
        check(
            &one,
            &format!("{b}/proj_evil/secret"),
            Err(ErrorKind::PermissionDenied),
        );
        check(
            &one,
            &format!("{b}/proj/../proj_evil"),
            Err(ErrorKind::PermissionDenied),
        );
        check(
            &one,
            &format!("file://{b}/proj/%2e%2e/proj_evil"),
            Err(ErrorKind::PermissionDenied),
        );
        check(
            &one,
            &format!("file://{b}/proj/..%2F..%2Fetc"),
            Err(ErrorKind::PermissionDenied),
        );
        check(
            &one,
            &format!("file://evil.example{b}/proj/x"),
            Err(ErrorKind::InvalidPath),
        );
        check(
            &one,
            &format!("file://{b}/proj/x%00y"),
            Err(ErrorKind::InvalidPath),
        );
        check(&one, "../etc/passwd", Err(ErrorKind::PermissionDenied));
        check(&one, "p/../../x", Err(ErrorKind::PermissionDenied));
        check(&one, "a/../b", Ok("p/b"));
        check(&one, "", Err(ErrorKind::InvalidPath));
        check(&one, "a\0b", Err(ErrorKind::InvalidPath));
        check(&one, "/etc/passwd", Err(ErrorKind::PermissionDenied));
    }

    #[test]
    fn several_roots_need_a_name() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(base.join("a/inner")).unwrap();
        let roots = [
            root(&base.join("a"), "a"),
            root(&base.join("a/inner"), "in"),
        ];
        check(&roots, "a/x", Ok("a/x"));
        check(&roots, "in/x", Ok("in/x"));
        check(&roots, "x", Err(ErrorKind::PermissionDenied));
        // The deepest root wins for absolute paths, after `..` is applied.
        check(&roots, &format!("{}/a/inner/f", base.display()), Ok("in/f"));
        check(
            &roots,
            &format!("{}/a/x/../inner/f", base.display()),
            Ok("in/f"),
        );
        check(
            &roots,
            &format!("{}/a/inner/../f", base.display()),
            Ok("a/f"),
        );
        check(&roots, &format!("{}/a/f", base.display()), Ok("a/f"));
    }
}

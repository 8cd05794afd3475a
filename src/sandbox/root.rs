//! A root: a name, a canonical path, and the directory capability every access goes through.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DenySet;
use super::RootError;
use super::protected::Protected;

/// Whether a root may be changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Reads only; every mutation is `PERMISSION_DENIED`.
    #[default]
    ReadOnly,
    /// Reads and writes.
    ReadWrite,
}

/// How `files/consent` is answered for a root, and whether its files need a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConsentMode {
    /// Approve paths inside the root: the user named the root.
    Auto,
    /// Ask a person (terminal or external command); fail closed otherwise.
    #[default]
    Prompt,
    /// Approve nothing.
    Deny,
}

/// What a root should be, before it is opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootSpec {
    /// The directory as configured (absolute; `~` already expanded).
    pub path: PathBuf,
    /// The name, or `None` for the canonical path's last component.
    pub name: Option<String>,
    /// Read-only or read-write.
    pub mode: Mode,
    /// Consent mode.
    pub consent: ConsentMode,
    /// Deny globs, relative to the root.
    pub deny: Vec<String>,
}

/// An approved root, opened once.
///
/// Handlers receive a `Root`, never a root path: the only way to touch a file is through
/// `Root::dir` (crate-private), which confines every path beneath it.
///
/// The rules that apply at a path of the root are the strictest of every root that covers
/// it ([`Root::is_denied`], [`Root::mode_at`], [`Root::consent_at`]): a root nested in this
/// one keeps its own mode, consent and deny globs when reached through this one's name, and
/// this one's rules hold inside a root nested in it.
#[derive(Debug)]
pub struct Root {
    name: String,
    path: PathBuf,
    configured: PathBuf,
    dir: Dir,
    mode: Mode,
    consent: ConsentMode,
    deny: DenySet,
    /// The managed policy's `[roots] deny` globs (docs/policy.md, "The managed policy"):
    /// kept apart from the person's so that a refusal can name whose rule it was.
    managed_deny: DenySet,
    overlaps: Vec<Overlap>,
    protected: Arc<Protected>,
}

/// A managed rule over part of the disk that is not a root (`[roots] read_only` and
/// `[roots] consent`): it applies to every root that covers any of it, as a root nested there
/// would, and is never served itself.
#[derive(Debug, Clone)]
pub struct Shadow {
    /// The folder or file it covers (absolute, as written: never resolved through links).
    pub path: PathBuf,
    /// `ReadOnly` for a `[roots] read_only` path.
    pub mode: Mode,
    /// `Prompt` for a `[roots] consent` path.
    pub consent: ConsentMode,
}

/// Another root of the same policy that covers all of this one, or a part of it.
#[derive(Debug)]
struct Overlap {
    place: Place,
    mode: Mode,
    consent: ConsentMode,
    deny: DenySet,
    /// A managed [`Shadow`], not another root.
    managed: bool,
}

#[derive(Debug)]
enum Place {
    /// The other root holds this one, which lies at this path inside it.
    Outer(String),
    /// The other root lies at this path inside this one.
    Inner(String),
}

impl Overlap {
    /// The path relative to the other root, when it covers `rel` (relative to this one).
    fn there<'a>(&self, rel: &'a str) -> Option<Cow<'a, str>> {
        match &self.place {
            Place::Outer(at) if rel.is_empty() => Some(Cow::Owned(at.clone())),
            Place::Outer(at) => Some(Cow::Owned(format!("{at}/{rel}"))),
            Place::Inner(at) => {
                let rest = rel.strip_prefix(at.as_str())?;
                if rest.is_empty() {
                    Some(Cow::Borrowed(""))
                } else {
                    rest.strip_prefix('/').map(Cow::Borrowed)
                }
            }
        }
    }
}

/// Tells each root which others overlap it and what fsbroker protects, once every root of a
/// policy is open.
pub(crate) fn link(roots: &mut [Root], shadows: &[Shadow], protected: &Arc<Protected>) {
    let shapes: Vec<(PathBuf, Mode, ConsentMode, DenySet, bool)> = roots
        .iter()
        .map(|r| {
            // Both sets were compiled once already, so together they compile too.
            let both = [r.deny.patterns(), r.managed_deny.patterns()].concat();
            let deny = DenySet::new(&both).unwrap_or_else(|_| r.deny.clone());
            (r.path.clone(), r.mode, r.consent, deny, false)
        })
        .chain(
            shadows
                .iter()
                .map(|s| (s.path.clone(), s.mode, s.consent, DenySet::default(), true)),
        )
        .collect();
    for root in roots.iter_mut() {
        root.protected = Arc::clone(protected);
        root.overlaps.clear();
        for (path, mode, consent, deny, managed) in &shapes {
            let place = if let Ok(at) = root.path.strip_prefix(path) {
                Place::Outer(at.to_string_lossy().into_owned())
            } else if let Ok(at) = path.strip_prefix(&root.path) {
                Place::Inner(at.to_string_lossy().into_owned())
            } else {
                continue;
            };
            if !managed && matches!(&place, Place::Outer(at) | Place::Inner(at) if at.is_empty()) {
                continue; // the root itself
            }
            root.overlaps.push(Overlap {
                place,
                mode: *mode,
                consent: *consent,
                deny: deny.clone(),
                managed: *managed,
            });
        }
    }
}

impl Root {
    /// Canonicalises the spec's path and opens it as a directory capability.
    ///
    /// # Ambient Authority
    /// This is the crate's one open of a path with ambient authority: every other access to
    /// the disk is relative to a `Dir` made here.
    pub fn open(spec: &RootSpec) -> Result<Root, RootError> {
        let bad = |reason: String| RootError::Dir {
            path: spec.path.clone(),
            reason,
        };
        // The root as the policy names it: the one ambient open of a root (docs/security.md).
        #[allow(clippy::disallowed_methods)]
        let canonical = std::fs::canonicalize(&spec.path)
            .map_err(|e| bad(format!("cannot resolve the directory: {e}")))?;
        let dir = Dir::open_ambient_dir(&canonical, ambient_authority())
            .map_err(|e| bad(format!("cannot open as a directory: {e}")))?;
        let name = match &spec.name {
            Some(n) => n.clone(),
            None => canonical
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_owned)
                .ok_or_else(|| {
                    bad("has no usable last component to name it; give it a `name`".into())
                })?,
        };
        validate_name(&name).map_err(|reason| RootError::Name {
            name: name.clone(),
            reason,
        })?;
        let deny = DenySet::new(&spec.deny)?;
        Ok(Root {
            name,
            path: canonical,
            // Absolute, so that a root given as `.` is never read as `/` when absolute request
            // paths are matched against it.
            configured: std::path::absolute(&spec.path).unwrap_or_else(|_| spec.path.clone()),
            dir,
            mode: spec.mode,
            consent: spec.consent,
            deny,
            managed_deny: DenySet::default(),
            overlaps: Vec::new(),
            protected: Arc::default(),
        })
    }

    /// Narrows this root by the managed policy: its mode and consent (never widened), and
    /// deny globs added to its own.
    pub(crate) fn narrow(&mut self, mode: Mode, consent: ConsentMode, deny: DenySet) {
        if mode == Mode::ReadOnly {
            self.mode = Mode::ReadOnly;
        }
        if consent_rank(consent) > consent_rank(self.consent) {
            self.consent = consent;
        }
        self.managed_deny = deny;
    }

    /// The managed policy's deny globs on this root.
    pub fn managed_deny(&self) -> &DenySet {
        &self.managed_deny
    }

    /// The managed rules over parts of this root (`[roots] read_only`, `[roots] consent`):
    /// each path inside the root (relative, `""` for all of it), its mode and its consent.
    pub fn managed_parts(&self) -> Vec<(String, Mode, ConsentMode)> {
        self.overlaps
            .iter()
            .filter(|o| o.managed)
            .map(|o| {
                let at = match &o.place {
                    Place::Inner(at) => at.clone(),
                    Place::Outer(_) => String::new(),
                };
                (at, o.mode, o.consent)
            })
            .collect()
    }

    /// Whether the managed policy made `rel` read-only (a `[roots] read_only` path), so that
    /// a refusal can say whose rule it is.
    pub fn read_only_by_managed(&self, rel: &str) -> bool {
        self.overlaps
            .iter()
            .any(|o| o.managed && o.mode == Mode::ReadOnly && o.there(rel).is_some())
    }

    /// Whether a managed deny glob covers `rel`.
    pub fn denied_by_managed(&self, rel: &str) -> bool {
        self.managed_deny.is_denied(rel)
    }

    /// The root's unique name: the first segment of `NAME/rel` paths.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The canonical absolute path, resolved when the root was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as configured, also accepted as a prefix of absolute request paths.
    pub fn configured_path(&self) -> &Path {
        &self.configured
    }

    /// The capability every access to this root goes through. Crate-private: a host given
    /// the raw `Dir` could go past deny globs and fsbroker's own files.
    pub(crate) fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Read-only or read-write.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The consent mode.
    pub fn consent(&self) -> ConsentMode {
        self.consent
    }

    /// The deny globs written for this root (see [`Root::is_denied`] for what applies).
    pub fn deny(&self) -> &DenySet {
        &self.deny
    }

    /// Whether `rel` (normalised, relative to this root) or an ancestor of it is denied by
    /// this root's globs or by those of another root covering it.
    pub fn is_denied(&self, rel: &str) -> bool {
        self.deny.is_denied(rel)
            || self.managed_deny.is_denied(rel)
            || self.overlaps.iter().any(|o| {
                !o.deny.is_empty() && o.there(rel).is_some_and(|there| o.deny.is_denied(&there))
            })
    }

    /// Whether another root covers this one or a part of it (without one, the rules are the
    /// same all over the root, and a folder's consent covers everything in it).
    pub fn has_overlaps(&self) -> bool {
        !self.overlaps.is_empty()
    }

    /// Whether any deny glob can apply beneath this root (so callers can skip the work).
    pub fn has_deny(&self) -> bool {
        !self.deny.is_empty()
            || !self.managed_deny.is_empty()
            || self.overlaps.iter().any(|o| !o.deny.is_empty())
    }

    /// The mode at `rel`: read-only when this root or any root covering `rel` is.
    pub fn mode_at(&self, rel: &str) -> Mode {
        let read_only = self.mode == Mode::ReadOnly
            || self
                .overlaps
                .iter()
                .any(|o| o.mode == Mode::ReadOnly && o.there(rel).is_some());
        if read_only {
            Mode::ReadOnly
        } else {
            Mode::ReadWrite
        }
    }

    /// The consent mode at `rel`: the strictest of this root's and of every root covering
    /// `rel` (`deny` over `prompt` over `auto`).
    pub fn consent_at(&self, rel: &str) -> ConsentMode {
        self.overlaps
            .iter()
            .filter(|o| o.there(rel).is_some())
            .map(|o| o.consent)
            .chain(std::iter::once(self.consent))
            .max_by_key(|c| consent_rank(*c))
            .unwrap_or(self.consent)
    }

    /// fsbroker's own files and the paths that hold them or roots (`Protected`).
    pub fn protected(&self) -> &Protected {
        &self.protected
    }

    /// The absolute path of `rel`.
    pub fn join(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    /// The root as a `file://` URI: percent-encoded, no trailing slash.
    pub fn uri(&self) -> String {
        // `from_file_path` only fails for relative paths; a canonical path is absolute.
        url::Url::from_file_path(&self.path)
            .map(String::from)
            .unwrap_or_else(|()| format!("file://{}", self.path.display()))
    }
}

/// How strict a consent mode is: `deny` over `prompt` over `auto`.
fn consent_rank(c: ConsentMode) -> u8 {
    match c {
        ConsentMode::Auto => 0,
        ConsentMode::Prompt => 1,
        ConsentMode::Deny => 2,
    }
}

/// A root name must be one path segment that `NAME/rel` parsing can find again.
fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name == "." || name == ".." {
        return Err("cannot be `.` or `..`".into());
    }
    if name.contains('/') {
        return Err("must be a single path segment (no `/`)".into());
    }
    if name.chars().any(char::is_control) {
        return Err("contains a control character".into());
    }
    if name.starts_with("file:") {
        return Err("cannot start with `file:` (it would read as a URI)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::validate_name;

    #[test]
    fn names_are_single_segments() {
        assert!(validate_name("project").is_ok());
        assert!(validate_name("my project").is_ok());
        for bad in ["", ".", "..", "a/b", "a\0b", "file:x", "a\nb"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}

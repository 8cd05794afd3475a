//! A root: a name, a canonical path, and the directory capability every access goes through.

use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::DenySet;
use crate::policy::PolicyError;

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
/// [`Root::dir`], which confines every path beneath it.
#[derive(Debug)]
pub struct Root {
    name: String,
    path: PathBuf,
    configured: PathBuf,
    dir: Dir,
    mode: Mode,
    consent: ConsentMode,
    deny: DenySet,
}

impl Root {
    /// Canonicalises the spec's path and opens it as a directory capability.
    ///
    /// # Ambient Authority
    /// This is the crate's one open of a path with ambient authority: every other access to
    /// the disk is relative to a `Dir` made here.
    pub fn open(spec: &RootSpec) -> Result<Root, PolicyError> {
        let bad = |reason: String| PolicyError::Root {
            path: spec.path.clone(),
            reason,
        };
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
        validate_name(&name).map_err(|reason| PolicyError::RootName {
            name: name.clone(),
            reason,
        })?;
        let deny = DenySet::new(&spec.deny)?;
        Ok(Root {
            name,
            path: canonical,
            configured: spec.path.clone(),
            dir,
            mode: spec.mode,
            consent: spec.consent,
            deny,
        })
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

    /// The capability every access to this root goes through.
    pub fn dir(&self) -> &Dir {
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

    /// The deny globs.
    pub fn deny(&self) -> &DenySet {
        &self.deny
    }

    /// The root as a `file://` URI: percent-encoded, no trailing slash.
    pub fn uri(&self) -> String {
        // `from_file_path` only fails for relative paths; a canonical path is absolute.
        url::Url::from_file_path(&self.path)
            .map(String::from)
            .unwrap_or_else(|()| format!("file://{}", self.path.display()))
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

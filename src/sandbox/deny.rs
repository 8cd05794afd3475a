//! Deny globs: paths a root hides and refuses.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use super::RootError;

/// A root's compiled deny globs.
///
/// Globs are matched against the path relative to the root, with `*` stopping at `/`
/// (`literal_separator`), and against every ancestor of that path: denying `secrets` also
/// denies `secrets/key.pem`. A pattern `dir/**` also denies `dir` itself, so that a denied
/// tree is hidden, not shown as an empty directory.
#[derive(Debug, Clone, Default)]
pub struct DenySet {
    set: GlobSet,
    patterns: Vec<String>,
}

impl DenySet {
    /// Compiles the patterns; a bad pattern is an error that names it.
    pub fn new(patterns: &[String]) -> Result<DenySet, RootError> {
        let mut builder = GlobSetBuilder::new();
        for pattern in patterns {
            // Patterns are relative to the root; a leading `/` only anchors them there.
            let anchored = pattern.trim_start_matches('/');
            let mut add = |p: &str| -> Result<(), RootError> {
                let glob = GlobBuilder::new(p)
                    .literal_separator(true)
                    .backslash_escape(true)
                    .build()
                    .map_err(|e| RootError::Glob {
                        pattern: pattern.clone(),
                        reason: e.kind().to_string(),
                    })?;
                builder.add(glob);
                Ok(())
            };
            add(anchored)?;
            if let Some(dir) = anchored.strip_suffix("/**") {
                if !dir.is_empty() {
                    add(dir)?;
                }
            }
        }
        let set = builder.build().map_err(|e| RootError::Glob {
            pattern: patterns.join(", "),
            reason: e.to_string(),
        })?;
        Ok(DenySet {
            set,
            patterns: patterns.to_vec(),
        })
    }

    /// True when no pattern is set, so callers can skip the work of checking.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns as written in the policy.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `rel` (normalised, `/`-separated, relative to the root) or any ancestor of it
    /// is denied. The root itself (`""`) never is.
    pub fn is_denied(&self, rel: &str) -> bool {
        if self.is_empty() || rel.is_empty() {
            return false;
        }
        let mut end = 0;
        loop {
            let next = rel[end..].find('/').map(|i| end + i);
            let prefix = &rel[..next.unwrap_or(rel.len())];
            if self.set.is_match(prefix) {
                return true;
            }
            match next {
                Some(i) => end = i + 1,
                None => return false,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &[&str]) -> DenySet {
        DenySet::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn ancestors_are_checked() {
        let d = set(&["secrets"]);
        assert!(d.is_denied("secrets"));
        assert!(d.is_denied("secrets/a/b.pem"));
        assert!(!d.is_denied("secretsx/a"));
        assert!(!d.is_denied("a/secrets"));
    }

    #[test]
    fn star_does_not_cross_slash() {
        let d = set(&["*.pem"]);
        assert!(d.is_denied("k.pem"));
        assert!(!d.is_denied("dir/k.pem"));
        let d = set(&["**/*.pem"]);
        assert!(d.is_denied("dir/sub/k.pem"));
        assert!(d.is_denied("k.pem"));
    }

    #[test]
    fn double_star_suffix_hides_the_directory_too() {
        let d = set(&[".git/**", "**/.env"]);
        assert!(d.is_denied(".git"));
        assert!(d.is_denied(".git/config"));
        assert!(d.is_denied(".env"));
        assert!(d.is_denied("a/b/.env"));
        assert!(d.is_denied("a/.env/inner"));
        assert!(!d.is_denied(".gitignore"));
        assert!(!d.is_denied(""));
    }

    #[test]
    fn bad_pattern_names_itself() {
        let e = DenySet::new(&["a[".to_string()]).unwrap_err();
        assert!(e.to_string().contains("a["), "{e}");
    }
}

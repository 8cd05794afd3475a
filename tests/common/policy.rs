//! A builder for policy files, so a test names the roots and tables it needs instead of
//! spelling TOML by hand (and the file format lives in one place: docs/policy.md).
//!
//! ```ignore
//! let policy = PolicyToml::new()
//!     .root(RootToml::at(&proj).name("proj").rw().deny(&["**/.env"]))
//!     .root(RootToml::at(&second).name("second"))
//!     .unlimited()
//!     .write_to(&dir.join("policy.toml"));
//! ```

use std::path::{Path, PathBuf};

use super::lit;

/// One `[[root]]` table. Defaults: `consent = "auto"`, no name, no mode (read-only), no deny.
#[derive(Clone, Debug)]
pub struct RootToml {
    /// TOML text of the `path` value (a literal string, or raw text for relative paths).
    path: String,
    name: Option<String>,
    mode: Option<String>,
    consent: String,
    deny: Option<Vec<String>>,
    /// Raw `key = value` lines appended to the table.
    extra: String,
}

impl RootToml {
    /// A root at `path` (written as a TOML literal string).
    pub fn at(path: &Path) -> RootToml {
        RootToml::raw(&lit(path))
    }

    /// A root whose `path` value is the TOML text `value` (e.g. `"'.'"` for a path relative
    /// to the policy file).
    pub fn raw(value: &str) -> RootToml {
        RootToml {
            path: value.to_owned(),
            name: None,
            mode: None,
            consent: "auto".into(),
            deny: None,
            extra: String::new(),
        }
    }

    /// `name = NAME`.
    pub fn name(mut self, name: &str) -> RootToml {
        self.name = Some(name.to_owned());
        self
    }

    /// `mode = MODE` (`"read-only"` or `"read-write"`).
    pub fn mode(mut self, mode: &str) -> RootToml {
        self.mode = Some(mode.to_owned());
        self
    }

    /// `mode = "read-write"`.
    pub fn rw(self) -> RootToml {
        self.mode("read-write")
    }

    /// `consent = CONSENT` (`"auto"`, `"prompt"` or `"deny"`).
    pub fn consent(mut self, consent: &str) -> RootToml {
        self.consent = consent.to_owned();
        self
    }

    /// `deny = [GLOBS]` (written even when empty).
    pub fn deny(mut self, globs: &[&str]) -> RootToml {
        self.deny = Some(globs.iter().map(|g| g.to_string()).collect());
        self
    }

    /// Raw `key = value` lines appended to the table (keys this builder has no method for,
    /// or deliberately odd spellings).
    pub fn extra(mut self, lines: &str) -> RootToml {
        self.extra += lines;
        if !self.extra.is_empty() && !self.extra.ends_with('\n') {
            self.extra.push('\n');
        }
        self
    }

    /// The table's TOML text.
    pub fn text(&self) -> String {
        let mut t = format!("[[root]]\npath = {}\n", self.path);
        if let Some(name) = &self.name {
            t += &format!("name = {name:?}\n");
        }
        if let Some(mode) = &self.mode {
            t += &format!("mode = {mode:?}\n");
        }
        t += &format!("consent = {:?}\n", self.consent);
        if let Some(deny) = &self.deny {
            let globs: Vec<String> = deny.iter().map(|g| format!("{g:?}")).collect();
            t += &format!("deny = [{}]\n", globs.join(", "));
        }
        t + &self.extra
    }
}

/// A whole policy file: roots in order, then other tables in order.
#[derive(Clone, Debug, Default)]
pub struct PolicyToml {
    head: String,
    roots: Vec<RootToml>,
    tables: Vec<(String, String)>,
}

impl PolicyToml {
    /// An empty policy.
    pub fn new() -> PolicyToml {
        PolicyToml::default()
    }

    /// Text put before everything else (a comment, a marker).
    pub fn head(mut self, text: &str) -> PolicyToml {
        self.head = text.to_owned();
        self
    }

    /// Adds a `[[root]]` table.
    pub fn root(mut self, root: RootToml) -> PolicyToml {
        self.roots.push(root);
        self
    }

    /// Adds the table `[NAME]` with `body` (TOML `key = value` lines).
    pub fn table(mut self, name: &str, body: impl Into<String>) -> PolicyToml {
        self.tables.push((name.to_owned(), body.into()));
        self
    }

    /// `[limits] requests_per_second = 0` plus `more` lines: keeps the rate limiter out of
    /// tests that send many requests quickly.
    pub fn unlimited_with(self, more: &str) -> PolicyToml {
        self.table("limits", format!("requests_per_second = 0\n{more}"))
    }

    /// `[limits] requests_per_second = 0`.
    pub fn unlimited(self) -> PolicyToml {
        self.unlimited_with("")
    }

    /// `[consent] command = [ARGV...]` (each a path written as a literal string) and
    /// `terminal = false`, plus `more` lines.
    pub fn consent_command(self, argv: &[&Path], more: &str) -> PolicyToml {
        let argv: Vec<String> = argv.iter().map(|p| lit(p)).collect();
        self.table(
            "consent",
            format!("command = [{}]\nterminal = false\n{more}", argv.join(", ")),
        )
    }

    /// `[audit] path = LOG` plus `more` lines.
    pub fn audit(self, log: &Path, more: &str) -> PolicyToml {
        self.table("audit", format!("path = {}\n{more}", lit(log)))
    }

    /// The file's text.
    pub fn text(&self) -> String {
        let mut t = self.head.clone();
        for root in &self.roots {
            if !t.is_empty() {
                t.push('\n');
            }
            t += &root.text();
        }
        for (name, body) in &self.tables {
            t += &format!("\n[{name}]\n{body}");
            if !body.ends_with('\n') {
                t.push('\n');
            }
        }
        t
    }

    /// Writes the file at `path` and returns `path`.
    pub fn write_to(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.text())
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path.to_owned()
    }
}

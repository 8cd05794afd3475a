//! The runtime policy: roots opened, globs compiled, limits checked.
//!
//! One compile per load ([`Policy::load`], [`Policy::compile`]): the roots opened and checked
//! against each other, the tables made usable (`config.rs`, `limits.rs`), fsbroker's own
//! files gathered and protected. Requests share the result and never read the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::config::audit_config;
use super::file::expand;
use super::{
    AuditConfig, ConfineConfig, ConsentConfig, ConsoleConfig, CopyConfig, CopyKind, Limits,
    Managed, Narrowing, PolicyError, PolicyFile,
};
use crate::sandbox::protected::{self, Protected, ProtectedSpec};
use crate::sandbox::{ConsentMode, DenySet, Mode, Root, RootSpec, Shadow};

/// Roots and switches from the command line, merged into a policy (docs/protocol.md,
/// `fsbroker serve`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--root DIR`: added to the policy's roots, `consent = "auto"`.
    pub roots: Vec<PathBuf>,
    /// `--read-write`: command-line roots are writable (policy roots keep their mode).
    pub read_write: bool,
    /// `--consent MODE`: overrides the consent mode of every root.
    pub consent: Option<ConsentMode>,
    /// `--audit FILE`: the audit log, overriding the policy's `[audit] path`.
    pub audit: Option<PathBuf>,
    /// `--listen SOCKET`: the socket the broker serves, protected like its own files.
    pub listen: Option<PathBuf>,
    /// `--console-url-file FILE`: where the console's URL is written, protected like the
    /// broker's own files.
    pub console_url_file: Option<PathBuf>,
    /// The audit log the broker writes, set by the broker once it is open: it stays in use,
    /// and protected, whatever a reloaded policy's `[audit]` says.
    pub audit_in_use: Option<PathBuf>,
}

/// The policy a broker runs with. Built once per load; requests share it through an `Arc`.
#[derive(Debug)]
pub struct Policy {
    roots: Vec<Arc<Root>>,
    limits: Limits,
    consent: ConsentConfig,
    audit: Option<AuditConfig>,
    confine: ConfineConfig,
    console: ConsoleConfig,
    source: Option<PathBuf>,
    protected: Arc<Protected>,
    managed: Option<Arc<Managed>>,
}

impl Policy {
    /// Loads the policy file (if any), merges the command-line overrides and compiles.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use fsbroker::{Overrides, Policy};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let file = dir.path().join("policy.toml");
    /// let project = dir.path().join("project");
    /// std::fs::create_dir(&project)?;
    /// std::fs::write(
    ///     &file,
    ///     format!("[[root]]\npath = {:?}\nmode = \"read-write\"\ndeny = [\"**/.env\"]\n", project),
    /// )?;
    /// let policy = Policy::load(Some(&file), &Overrides::default())?;
    /// assert_eq!(policy.roots()[0].name(), "project");
    ///
    /// // A mistake is an error that names the file and the key, never a half-loaded policy.
    /// std::fs::write(&file, "[[root]]\npath = 3\n")?;
    /// assert!(Policy::load(Some(&file), &Overrides::default()).is_err());
    /// # Ok(()) }
    /// ```
    ///
    /// The machine's managed policy ([`super::MANAGED_PATH`]) bounds the result: anything the
    /// file or the overrides ask for beyond it is [`PolicyError::Narrowed`], naming the rule,
    /// and a managed policy that is there but cannot be trusted is [`PolicyError::Managed`].
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Policy, PolicyError> {
        let (policy, refused) = Policy::load_narrowed(file, overrides)?;
        match refused.into_iter().next() {
            Some(first) => Err(PolicyError::Narrowed(first)),
            None => Ok(policy),
        }
    }

    /// [`Policy::load`] for a reload: what the managed policy refuses is left out (a root
    /// outside `[roots] within` is dropped, a mode or consent narrowed, a limit lowered) and
    /// returned, so that narrowing the managed policy revokes instead of failing. What cannot
    /// be left out (a required audit log the broker does not keep) is still an error.
    pub fn load_narrowed(
        file: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<(Policy, Vec<Narrowing>), PolicyError> {
        let managed = Managed::system()?;
        let (parsed, base) = match file {
            Some(path) => {
                let parsed = PolicyFile::load(path)?;
                let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
                (parsed, Some(base))
            }
            None => (PolicyFile::default(), None),
        };
        Policy::compile_from(&parsed, base.as_deref(), file, overrides, managed)
    }

    /// Compiles parsed policy text; relative root paths are taken from `base`. The machine's
    /// managed policy applies as in [`Policy::load`].
    pub fn compile(
        file: &PolicyFile,
        base: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<Policy, PolicyError> {
        Policy::compile_under(file, base, overrides, Managed::system()?)
    }

    /// [`Policy::compile`] under the managed policy `managed` instead of the machine's
    /// (what `fsbroker policy explain` and tests use to show a managed file's effect).
    pub fn compile_under(
        file: &PolicyFile,
        base: Option<&Path>,
        overrides: &Overrides,
        managed: Option<Managed>,
    ) -> Result<Policy, PolicyError> {
        let (policy, refused) = Policy::compile_from(file, base, None, overrides, managed)?;
        match refused.into_iter().next() {
            Some(first) => Err(PolicyError::Narrowed(first)),
            None => Ok(policy),
        }
    }

    /// [`Policy::compile`] for the policy file at `source`, which is protected with the rest
    /// of what the broker trusts, under `managed`; what it refuses is left out and returned.
    fn compile_from(
        file: &PolicyFile,
        base: Option<&Path>,
        source: Option<&Path>,
        overrides: &Overrides,
        managed: Option<Managed>,
    ) -> Result<(Policy, Vec<Narrowing>), PolicyError> {
        let mut refused: Vec<Narrowing> = Vec::new();
        // Each spec with whether its mode and consent were asked for, or are defaults.
        let mut specs: Vec<(RootSpec, bool, bool)> = Vec::new();
        for entry in &file.root {
            specs.push((
                RootSpec {
                    path: expand(&entry.path, base),
                    name: entry.name.clone(),
                    mode: entry.mode,
                    consent: entry.consent,
                    deny: entry.deny.clone(),
                },
                entry.mode == Mode::ReadWrite,
                entry.consent == ConsentMode::Auto,
            ));
        }
        for dir in &overrides.roots {
            specs.push((
                RootSpec {
                    path: expand(dir, None),
                    name: None,
                    mode: if overrides.read_write {
                        Mode::ReadWrite
                    } else {
                        Mode::ReadOnly
                    },
                    consent: ConsentMode::Auto,
                    deny: Vec::new(),
                },
                overrides.read_write,
                false,
            ));
        }
        if let Some(consent) = overrides.consent {
            for (spec, _, auto_asked) in &mut specs {
                spec.consent = consent;
                *auto_asked = consent == ConsentMode::Auto;
            }
        }
        let managed_deny = match &managed {
            Some(m) => DenySet::new(&m.file.roots.deny)?,
            None => DenySet::default(),
        };
        let mut roots: Vec<Root> = Vec::with_capacity(specs.len());
        for (spec, writable_asked, auto_asked) in &specs {
            let mut root = Root::open(spec)?;
            if let Some(m) = &managed {
                if let Some(no) = m.refuse_root(root.path()) {
                    refused.push(no);
                    continue;
                }
                let read_only = m.read_only_at(root.path());
                if let Some(rule) = read_only.filter(|_| *writable_asked) {
                    refused.push(Narrowing {
                        rule: "[roots] read_only".into(),
                        reason: format!(
                            "root {} asks to be read-write, and {} is read-only",
                            root.path().display(),
                            rule.display()
                        ),
                    });
                }
                let prompt = m.consent_at(root.path());
                if let Some(rule) = prompt.filter(|_| *auto_asked) {
                    refused.push(Narrowing {
                        rule: "[roots] consent".into(),
                        reason: format!(
                            "root {} asks for consent \"auto\", and everything in {} needs the \
                             person's consent",
                            root.path().display(),
                            rule.display()
                        ),
                    });
                }
                root.narrow(
                    if read_only.is_some() {
                        Mode::ReadOnly
                    } else {
                        root.mode()
                    },
                    if prompt.is_some() {
                        ConsentMode::Prompt
                    } else {
                        root.consent()
                    },
                    managed_deny.clone(),
                );
            }
            if let Some(other) = roots.iter().find(|r| r.name() == root.name()) {
                return Err(PolicyError::DuplicateName {
                    name: root.name().to_owned(),
                    first: other.path().to_owned(),
                    second: root.path().to_owned(),
                });
            }
            if let Some(other) = roots.iter().find(|r| r.path() == root.path()) {
                return Err(PolicyError::DuplicatePath {
                    path: root.path().to_owned(),
                    first: other.name().to_owned(),
                    second: root.name().to_owned(),
                });
            }
            roots.push(root);
        }
        if file.consent.command.first().is_some_and(|c| c.is_empty()) {
            return Err(PolicyError::Table {
                table: "consent",
                reason: "command must start with a program name".into(),
            });
        }
        if file.consent.provider == super::Provider::Command && file.consent.command.is_empty() {
            return Err(PolicyError::Table {
                table: "consent",
                reason: "provider = \"command\" needs a command".into(),
            });
        }
        if file.consent.timeout_ms == 0 {
            return Err(PolicyError::Table {
                table: "consent",
                reason: "timeout_ms must be greater than 0".into(),
            });
        }
        let consent = ConsentConfig {
            command: protected::resolve_command(&file.consent.command),
            terminal: file.consent.terminal,
            timeout: Duration::from_millis(file.consent.timeout_ms),
            provider: file.consent.provider,
        };
        let console = ConsoleConfig::from_file(&file.console, base)?;
        let audit = match (&overrides.audit, &file.audit) {
            (Some(path), a) => Some(audit_config(expand(path, None), a.as_ref(), base)?),
            (None, Some(a)) => Some(audit_config(expand(&a.path, base), Some(a), base)?),
            (None, None) => None,
        };
        let limits = match &managed {
            Some(m) => {
                let (capped, above) = m.cap_limits(&file.limits);
                refused.extend(above);
                Limits::from_file(&capped)?
            }
            None => Limits::from_file(&file.limits)?,
        };
        let audit = match &managed {
            Some(m) => managed_audit(m, audit)?,
            None => audit,
        };
        let command = protected::command_files(&consent.command);
        let mut own: Vec<PathBuf> = source.map(Path::to_path_buf).into_iter().collect();
        own.extend(command.iter().cloned());
        own.extend(overrides.listen.clone());
        // The console's URL carries its token: no server may read or replace it.
        own.extend(overrides.console_url_file.clone());
        own.extend(console.url_file.clone());
        let logs: Vec<PathBuf> = audit
            .iter()
            .map(|a| a.path.clone())
            .chain(overrides.audit_in_use.clone())
            .collect();
        own.extend(crate::rundir::own_files(&logs, overrides.listen.as_deref()));
        let protected = Arc::new(Protected::new(&ProtectedSpec {
            files: own,
            command: command.clone(),
            // The log in use stays protected when a reload names another (it stays in use).
            audit_logs: audit
                .iter()
                .map(|a| a.path.clone())
                .chain(overrides.audit_in_use.clone())
                .collect(),
            // The console's URL file carries its token, and is rewritten through a temporary
            // sibling that carries it too.
            rewritten: overrides
                .console_url_file
                .iter()
                .chain(&console.url_file)
                .cloned()
                .chain(crate::rundir::console_files())
                .chain(crate::rundir::every_brokers_files())
                // The person's sign-ins to remote servers hold their tokens.
                .chain(crate::rundir::sign_in_files())
                .collect(),
            // A folder the managed policy makes read-only or consent-only is kept where it is
            // as a root is: moving or deleting a folder above it would take its files out of
            // the rule.
            roots: roots
                .iter()
                .map(|r| r.configured_path().to_path_buf())
                .chain(
                    managed
                        .iter()
                        .flat_map(|m| m.read_only().iter().chain(m.consent()).cloned()),
                )
                .collect(),
        }));
        let shadows: Vec<Shadow> = managed
            .iter()
            .flat_map(|m| {
                let read_only = m.read_only().iter().map(|p| Shadow {
                    path: p.clone(),
                    mode: Mode::ReadOnly,
                    consent: ConsentMode::Auto,
                });
                let consent = m.consent().iter().map(|p| Shadow {
                    path: p.clone(),
                    mode: Mode::ReadWrite,
                    consent: ConsentMode::Prompt,
                });
                read_only.chain(consent).collect::<Vec<_>>()
            })
            .collect();
        crate::sandbox::link(&mut roots, &shadows, &protected);
        refuse_writable_command(&roots, &command)?;
        let mut confine_read: Vec<PathBuf> =
            file.confine.read.iter().map(|p| expand(p, base)).collect();
        let mut confine_write: Vec<PathBuf> =
            file.confine.write.iter().map(|p| expand(p, base)).collect();
        if let Some(m) = &managed {
            // Paths a confined server is given beyond its roots are roots to it: bounded as
            // roots are.
            for (write, paths) in [(false, &mut confine_read), (true, &mut confine_write)] {
                paths.retain(|p| match m.refuse_confine_path(p, write) {
                    None => true,
                    Some(no) => {
                        refused.push(no);
                        false
                    }
                });
            }
        }
        let mut on_revoke = file.confine.on_revoke;
        let mut net = file.confine.net;
        if let Some(m) = &managed {
            if on_revoke == super::OnRevoke::Keep {
                refused.push(Narrowing {
                    rule: "[confine] on_revoke".into(),
                    reason: "[confine] on_revoke = \"keep\" would let a confined server keep \
                             access the managed policy takes back: under a managed policy a \
                             server is ended when its access is revoked"
                        .into(),
                });
                on_revoke = super::OnRevoke::End;
            }
            if net && m.file.confine.net == Some(false) {
                refused.push(Narrowing {
                    rule: "[confine] net".into(),
                    reason: "[confine] net = true: confined servers may not have the network"
                        .into(),
                });
                net = false;
            }
        }
        let confine = ConfineConfig {
            mode: file.confine.mode,
            read: confine_read,
            write: confine_write,
            net,
            fetch: file.confine.fetch.clone(),
            on_revoke,
        };
        let policy = Policy {
            roots: roots.into_iter().map(Arc::new).collect(),
            limits,
            consent,
            audit,
            confine,
            console,
            source: source.map(Path::to_path_buf),
            protected,
            managed: managed.map(Arc::new),
        };
        Ok((policy, refused))
    }

    /// The managed policy in force, if the machine has one.
    pub fn managed(&self) -> Option<&Arc<Managed>> {
        self.managed.as_ref()
    }

    /// What an operator should hear about this policy although it loads: each writable root
    /// that holds one of fsbroker's own files (refused to servers, but a sign that the policy
    /// sits in the tree it hands out), each root nested in another (both sets of rules
    /// apply, the strictest wins), and a single root holding an entry of its own name (a
    /// path starting with that name means the root, not the entry).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for root in &self.roots {
            // Judged where each file is: a read-only root nested here keeps it out of reach.
            let writable = |p: &Path| {
                p.strip_prefix(root.path())
                    .is_ok_and(|rel| root.mode_at(&rel.to_string_lossy()) == Mode::ReadWrite)
            };
            if root.mode() == Mode::ReadWrite {
                for dir in self.protected.sealed() {
                    if writable(dir) {
                        out.push(format!(
                            "read-write root {:?} ({}) holds {}, the folder of the consent \
                             command: it is protected, servers cannot change anything in it",
                            root.name(),
                            root.path().display(),
                            dir.display()
                        ));
                    }
                }
                for file in self.protected.files() {
                    if writable(file) {
                        out.push(format!(
                            "read-write root {:?} ({}) holds {}, one of fsbroker's own files: \
                             it is protected, servers can neither read nor change it",
                            root.name(),
                            root.path().display(),
                            file.display()
                        ));
                    }
                }
            }
            let home = std::env::var_os("HOME").map(PathBuf::from);
            if root.mode() == Mode::ReadWrite
                && home.as_ref().is_some_and(|h| h.starts_with(root.path()))
            {
                out.push(format!(
                    "read-write root {:?} ({}) holds your home folder: a server can write the \
                     dotfiles and user site folders that every program you run reads, the \
                     consent command included",
                    root.name(),
                    root.path().display()
                ));
            }
            // With one root, a relative path may leave out the root's name (form 4), but a
            // first segment that names the root always means the root (results are written
            // `NAME/rel` and must be sendable back): an entry of the same name is then reached
            // only as `NAME/NAME/...`, which surprises a server that reads paths relative to
            // the root. With several roots every relative path must start with a name.
            if self.roots.len() == 1 && root.dir().symlink_metadata(root.name()).is_ok() {
                out.push(format!(
                    "root {name:?} ({}) holds an entry also named {name:?}: the path \"{name}\", \
                     and every path starting with \"{name}/\", means the root itself, not that \
                     entry (a root's name always wins as a first segment); reach the entry as \
                     \"{name}/{name}\" or by its absolute path, or give the root another name \
                     (`name = \"...\"` in a policy's [[root]] table)",
                    root.path().display(),
                    name = root.name(),
                ));
            }
            for other in &self.roots {
                if other.path() != root.path() && other.path().starts_with(root.path()) {
                    out.push(format!(
                        "root {:?} is nested in root {:?}: the strictest mode, consent and \
                         every deny glob of both apply to it, through either name",
                        other.name(),
                        root.name()
                    ));
                }
            }
        }
        // A prompt lasts as long as its request may: the shorter of the two wins, without a
        // word on the page (its countdown shows the shorter).
        let (consent, request) = (self.consent().timeout, self.limits().timeout);
        if consent > request {
            out.push(format!(
                "[consent] timeout_ms ({}) is longer than [limits] timeout_ms ({}): a prompt \
                 is denied when its request's time runs out, after {} s; raise [limits] \
                 timeout_ms too for the person to have {} s",
                consent.as_millis(),
                request.as_millis(),
                request.as_secs(),
                consent.as_secs()
            ));
        }
        out
    }

    /// fsbroker's own files and the paths that hold them or the roots.
    pub fn protected(&self) -> &Arc<Protected> {
        &self.protected
    }

    /// This policy without any root (a policy file the broker cannot read in time).
    pub fn without_roots(&self) -> Policy {
        Policy {
            roots: Vec::new(),
            ..self.without_root(Path::new(""))
        }
    }

    /// This policy without the root at `path` (a root whose directory is gone).
    pub fn without_root(&self, path: &Path) -> Policy {
        self.without_paths(&[path.to_path_buf()])
    }

    /// This policy without the roots at `paths` (canonical; roots the person paused).
    pub fn without_paths(&self, paths: &[PathBuf]) -> Policy {
        Policy {
            roots: self
                .roots
                .iter()
                .filter(|r| !paths.iter().any(|p| p == r.path()))
                .cloned()
                .collect(),
            limits: self.limits.clone(),
            consent: self.consent.clone(),
            audit: self.audit.clone(),
            confine: self.confine.clone(),
            console: self.console.clone(),
            source: self.source.clone(),
            protected: Arc::clone(&self.protected),
            managed: self.managed.clone(),
        }
    }

    /// The approved roots, in policy order then command-line order.
    pub fn roots(&self) -> &[Arc<Root>] {
        &self.roots
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// How `prompt` roots ask.
    pub fn consent(&self) -> &ConsentConfig {
        &self.consent
    }

    /// The audit log's configuration, if auditing is on.
    pub fn audit(&self) -> Option<&AuditConfig> {
        self.audit.as_ref()
    }

    /// The `[console]` table.
    pub fn console(&self) -> &ConsoleConfig {
        &self.console
    }

    /// How `fsbroker proxy` confines its server.
    pub fn confine(&self) -> &ConfineConfig {
        &self.confine
    }

    /// The policy file this was loaded from, if any.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }
}

/// The audit log under the managed policy's `[audit]`: a log it requires but the broker does
/// not keep, or a copy it requires that the log does not have, is refused (never left out:
/// the broker cannot start a log a reload asks for); `require_copies` is forced on.
fn managed_audit(
    managed: &Managed,
    audit: Option<AuditConfig>,
) -> Result<Option<AuditConfig>, PolicyError> {
    let rules = &managed.file.audit;
    let required = rules.required || !rules.copies.is_empty();
    let Some(mut audit) = audit else {
        if required {
            return Err(PolicyError::Narrowed(Narrowing {
                rule: "[audit] required".into(),
                reason: "this broker would keep no audit log: give it one with --audit FILE or \
                         an [audit] table in the policy"
                    .into(),
            }));
        }
        return Ok(None);
    };
    for kind in &rules.copies {
        // The copy must go where the administrator's collector listens: one to a socket of
        // the person's own would leave no record off the disk.
        let want = rules.socket(*kind);
        let has = audit.copies.iter().any(|c| match (c, kind) {
            (CopyConfig::Syslog { socket, .. }, CopyKind::Syslog)
            | (CopyConfig::Journald { socket }, CopyKind::Journald) => *socket == want,
            _ => false,
        });
        if !has {
            return Err(PolicyError::Narrowed(Narrowing {
                rule: "[audit] copies".into(),
                reason: format!(
                    "the audit log must also go to {0} at {1}, and this one does not: set \
                     `{0} = \"{1}\"` in the policy's [audit] table",
                    kind.name(),
                    want.display()
                ),
            }));
        }
    }
    if rules.require_copies {
        audit.require_copies = true;
    }
    Ok(Some(audit))
}

/// Refuses a consent command that runs a file a server could write: it would run the
/// server's code, which answers every prompt. Protecting the file itself is not enough: an
/// interpreter loads what lies around it (a virtualenv's `site-packages` and `.pth` files, a
/// Node script's `node_modules` in every parent folder), so every file the command names must
/// lie where no root covering it is read-write.
fn refuse_writable_command(roots: &[Root], command: &[PathBuf]) -> Result<(), PolicyError> {
    for file in command {
        for spelling in protected::spellings(file) {
            for root in roots {
                let Ok(rel) = spelling.strip_prefix(root.path()) else {
                    continue;
                };
                if root.mode_at(&rel.to_string_lossy()) == Mode::ReadWrite {
                    return Err(PolicyError::Table {
                        table: "consent",
                        reason: format!(
                            "command runs {}, which lies in the read-write root {:?}: a server \
                             could change what it runs; move it out of the root, or make that \
                             folder a read-only root",
                            spelling.display(),
                            root.name()
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // tests set up their own files
mod tests {
    use super::*;

    fn compile(text: &str, overrides: &Overrides) -> Result<Policy, PolicyError> {
        let file = PolicyFile::parse(text, Path::new("t.toml"))?;
        Policy::compile(&file, None, overrides)
    }

    #[test]
    fn cli_roots_merge_with_policy_roots() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let text = format!(
            "[[root]]\npath = {:?}\nmode = \"read-write\"\n",
            a.display().to_string()
        );
        let p = compile(
            &text,
            &Overrides {
                roots: vec![b.clone()],
                read_write: false,
                ..Overrides::default()
            },
        )
        .unwrap();
        let names: Vec<_> = p
            .roots()
            .iter()
            .map(|r| (r.name(), r.mode(), r.consent()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("a", Mode::ReadWrite, ConsentMode::Prompt),
                ("b", Mode::ReadOnly, ConsentMode::Auto)
            ]
        );
        let p = compile(
            &text,
            &Overrides {
                roots: vec![b],
                read_write: true,
                consent: Some(ConsentMode::Deny),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert!(p.roots().iter().all(|r| r.consent() == ConsentMode::Deny));
        assert_eq!(p.roots()[1].mode(), Mode::ReadWrite);
    }

    #[test]
    fn name_collision_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("x/same"), t.path().join("y/same"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let err = compile(
            "",
            &Overrides {
                roots: vec![a, b],
                ..Overrides::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("two roots are named \"same\""), "{err}");
    }

    #[test]
    fn limits_are_checked() {
        let err = compile(
            "[limits]\nchunk_size = 10\nmax_chunk_size = 5\n",
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("chunk_size"), "{err}");
        let err = compile("[limits]\ntimeout_ms = 0\n", &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("timeout_ms"), "{err}");
    }

    #[test]
    fn missing_root_is_an_error() {
        let err = compile(
            "[[root]]\npath = \"/no/such/dir/fsbroker\"\n",
            &Overrides::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("/no/such/dir/fsbroker"), "{err}");
    }
}

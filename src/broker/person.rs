//! What the person does: answer consent prompts, revoke a grant, end a session, pause and
//! resume a root. The console (`fsbroker … --console`) calls these; a host with a window of
//! its own can too.
//!
//! Every act can only narrow access: none adds a root, widens a mode or grants outside what
//! a server asked about under a `prompt` root. Each takes effect as a policy revocation does
//! (grants, uploads and kept locks go at once, `list_changed` is raised, a confined server
//! that held the access is ended as `[confine] on_revoke` says), and each is written to the
//! audit log as the person's act (`"account":"person"`) and sent to [`Broker::events`].
//! An act that cannot be written to the log still takes effect: taking access away is never
//! refused.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;

use super::{Broker, Event, ReloadReport};
use crate::consent::{AnswerError, ConsoleOpen, GrantInfo, Prompt, PromptAnswer};
use crate::sandbox::{ConsentMode, Mode};

/// Why an act of the person's was not done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActError {
    /// No open session has this number.
    #[error("session {id}: no such session is open")]
    UnknownSession {
        /// The number given.
        id: u64,
    },
    /// No open session holds a grant with this number.
    #[error("grant {id}: no open session holds it")]
    UnknownGrant {
        /// The number given.
        id: u64,
    },
    /// The policy has no root by this name.
    #[error("root {name:?}: the policy has no root by this name")]
    UnknownRoot {
        /// The name given.
        name: String,
    },
    /// The answer to a prompt was not taken.
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

/// One root of the policy, as the person sees and steers it.
#[derive(Debug, Clone)]
pub struct RootState {
    /// Its name (what `roots/list` calls it, and what pausing names it by).
    pub name: String,
    /// Its canonical path.
    pub path: PathBuf,
    /// Read-only or read-write.
    pub mode: Mode,
    /// How access to it is decided.
    pub consent: ConsentMode,
    /// Whether the person paused it: withdrawn from every session until resumed.
    pub paused: bool,
    /// The rules the managed policy sets on it, in the person's words: set by their
    /// organisation, which they cannot lift (they can still pause the root).
    pub managed: Vec<String>,
}

impl Broker {
    /// Counts a console (or a host's window) as open until the guard is dropped: while one
    /// is, `[consent] provider = "auto"` without a command asks there
    /// ([`Broker::prompts`]).
    pub fn open_console(&self) -> ConsoleOpen {
        self.desk.open()
    }

    /// The consent prompts waiting for the person, oldest first.
    pub fn prompts(&self) -> Vec<Prompt> {
        self.desk.prompts()
    }

    /// Changes whenever sessions open or close, prompts come or go, grants are made or
    /// revoked, or the roots change: what a view of [`Broker::sessions`],
    /// [`Broker::prompts`] and [`Broker::roots`] watches to refresh. (Each answered request
    /// is in [`Broker::events`] instead.)
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Tells the watchers of [`Broker::changes`].
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Answers prompt `id`: the paths approved (each asked for, or a folder beneath one), or
    /// none. The approved paths are placed where they really lead and granted only if they
    /// are still inside what was asked. Writes to the audit log, so call it where blocking
    /// briefly is fine.
    pub fn answer_prompt(&self, id: u64, answer: PromptAnswer) -> Result<(), ActError> {
        let approved = match &answer {
            PromptAnswer::Approve(paths) => paths.clone(),
            PromptAnswer::Deny => Vec::new(),
        };
        let prompt = self.desk.answer(id, answer)?;
        let mut m = BTreeMap::new();
        m.insert("prompt", Value::from(id));
        m.insert("session", Value::from(prompt.session));
        m.insert("granted", Value::from(!approved.is_empty()));
        let redact = self.redacts();
        let shown: Vec<Value> = approved
            .iter()
            .take(crate::limits::MAX_LOGGED_PATHS)
            .map(|p| path_value(p, redact))
            .collect();
        m.insert(
            if redact {
                "approvedSha256"
            } else {
                "approvedPaths"
            },
            Value::from(shown),
        );
        self.record("consent-answer", m);
        Ok(())
    }

    /// The policy's roots (as configured, paused ones included), in policy order.
    pub fn roots(&self) -> Vec<RootState> {
        let paused = self
            .paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let configured = self.configured();
        let managed = configured.managed();
        configured
            .roots()
            .iter()
            .map(|r| RootState {
                name: r.name().to_owned(),
                path: r.path().to_path_buf(),
                mode: r.mode(),
                consent: r.consent(),
                paused: paused.iter().any(|p| p == r.path()),
                managed: managed.map(|m| managed_words(m, r)).unwrap_or_default(),
            })
            .collect()
    }

    /// Revokes grant `id`, whichever session holds it: the session is told its roots changed,
    /// its uploads beneath the grant end, and so do its kept locks there.
    pub fn revoke_grant(&self, id: u64) -> Result<GrantInfo, ActError> {
        for member in self.members() {
            if let Some(gone) = member.revoke_grant(id) {
                // Nested grants of the session stay; a kept lock beneath one of them too.
                let spared: Vec<PathBuf> = member
                    .info()
                    .grants
                    .into_iter()
                    .map(|g| g.path)
                    .filter(|p| p.starts_with(&gone.path))
                    .collect();
                self.locks
                    .release_under(&gone.path, &spared, Some(member.id()));
                self.changed();
                let mut m = BTreeMap::new();
                m.insert("session", Value::from(member.id()));
                m.insert("grant", Value::from(id));
                let (key, value) = path_member(&gone.path.to_string_lossy(), self.redacts());
                m.insert(key, value);
                self.record("revoke-grant", m);
                return Ok(gone);
            }
        }
        Err(ActError::UnknownGrant { id })
    }

    /// Ends session `id`: its requests are refused from now on, its grants, uploads, kept
    /// locks and watches go, and its transport closes (a proxy ends its server).
    pub fn end_session(&self, id: u64) -> Result<(), ActError> {
        let member = self
            .members()
            .into_iter()
            .find(|m| m.id() == id)
            .ok_or(ActError::UnknownSession { id })?;
        member.end();
        self.desk
            .withdraw_session(id, "the person ended the session");
        self.locks.release_session(id);
        self.watches.remove_session(id);
        self.changed();
        let mut m = BTreeMap::new();
        m.insert("session", Value::from(id));
        self.record("end-session", m);
        Ok(())
    }

    /// Pauses the root named `name` for every session, as a reload that removed it would:
    /// it leaves `roots/list`, and everything held beneath it goes. It stays paused across
    /// reloads until [`Broker::resume_root`].
    pub fn pause_root(&self, name: &str) -> Result<ReloadReport, ActError> {
        self.set_paused(name, true)
    }

    /// Resumes a root paused with [`Broker::pause_root`]: sessions get it back
    /// (`list_changed`). A `prompt` root's grants do not come back; the person is asked
    /// again.
    pub fn resume_root(&self, name: &str) -> Result<ReloadReport, ActError> {
        self.set_paused(name, false)
    }

    fn set_paused(&self, name: &str, pause: bool) -> Result<ReloadReport, ActError> {
        let configured = self.configured();
        let root = configured
            .roots()
            .iter()
            .find(|r| r.name() == name)
            .ok_or_else(|| ActError::UnknownRoot {
                name: name.to_owned(),
            })?;
        let path = root.path().to_path_buf();
        let paused = {
            let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
            paused.retain(|p| p != &path);
            if pause {
                paused.push(path.clone());
            }
            paused.clone()
        };
        let report = self.put_in_force(configured.without_paths(&paused));
        let mut m = BTreeMap::new();
        m.insert("root", Value::from(crate::audit::cap(name, 256)));
        let (key, value) = path_member(&path.to_string_lossy(), self.redacts());
        m.insert(key, value);
        self.record(if pause { "pause-root" } else { "resume-root" }, m);
        Ok(report)
    }

    /// Whether the log and the feed show paths as their sha256.
    fn redacts(&self) -> bool {
        self.policy().audit().is_some_and(|a| a.redact_paths)
    }

    /// Writes the person's act to the audit log (if any) and to [`Broker::events`].
    fn record(&self, name: &'static str, members: BTreeMap<&'static str, Value>) {
        tracing::info!(act = name, details = ?members, "the person's act");
        if self.wants_events() {
            let mut fields: serde_json::Map<String, Value> = members
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
            fields.insert(
                "ts".into(),
                Value::from(crate::audit::timestamp(std::time::SystemTime::now())),
            );
            fields.insert("event".into(), Value::from(name));
            fields.insert("account".into(), Value::from("person"));
            let _ = self.events.send(Event(Arc::new(fields)));
        }
        if let Some(Err(e)) = self.audit().map(|log| log.person(name, members)) {
            tracing::error!(act = name, error = %e, "the person's act took effect but could not be written to the audit log");
        }
    }
}

/// A path as the log keeps it: `("path", the path capped)`, or `("pathSha256", its digest)`.
fn path_member(path: &str, redact: bool) -> (&'static str, Value) {
    if redact {
        ("pathSha256", path_value(path, true))
    } else {
        ("path", path_value(path, false))
    }
}

fn path_value(path: &str, redact: bool) -> Value {
    if redact {
        Value::from(crate::audit::digest(path.as_bytes()))
    } else {
        Value::from(crate::audit::cap(path, crate::limits::MAX_LOGGED_PATH))
    }
}

/// What the managed policy `m` sets on `root`, one rule a line, as the person reads it.
fn managed_words(m: &crate::policy::Managed, root: &crate::sandbox::Root) -> Vec<String> {
    let mut out = Vec::new();
    if m.read_only_at(root.path()).is_some() {
        out.push("servers may only read it".to_owned());
    }
    if m.consent_at(root.path()).is_some() {
        out.push("servers get it only once you approve".to_owned());
    }
    for (at, mode, consent) in root.managed_parts() {
        if at.is_empty() {
            continue;
        }
        if mode == Mode::ReadOnly {
            out.push(format!("servers may only read {at}"));
        }
        if consent == ConsentMode::Prompt {
            out.push(format!("servers get {at} only once you approve"));
        }
    }
    for glob in root.managed_deny().patterns() {
        out.push(format!("servers never see {glob}"));
    }
    out
}

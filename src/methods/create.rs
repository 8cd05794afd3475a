//! `files/create {path, type: "file"|"directory", keepLocked?}` → `{created, lockId?}`.
//!
//! Parents are created as needed, one level at a time, each checked against the deny globs
//! where it really is (so a symlinked parent cannot be used to create inside a denied tree).
//! An existing entry of the requested type is left untouched (`created: false`); one of
//! another type is `ALREADY_EXISTS`.

use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::Json;
use crate::locks::LockMode;
use crate::sandbox::mutate::{self, Parent};
use crate::sandbox::{Resolved, open};

/// What to create.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    File,
    Directory,
}

/// `files/create` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(rename = "type")]
    kind: Kind,
    #[serde(default)]
    keep_locked: bool,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    created: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_id: Option<String>,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Json<Reply>> {
    ctx.owned()
        .run(move |op| create(op, &params))
        .await
        .map(Json)
}

fn create(op: &Op, p: &Params) -> Result<Reply> {
    let raw = p.path.as_str();
    let target = op.resolve(raw)?;
    mutate::require_writable(&target, raw)?;
    if target.is_root() {
        return match p.kind {
            Kind::Directory if !p.keep_locked => Ok(Reply {
                created: false,
                lock_id: None,
            }),
            Kind::Directory => Err(mutate::root_itself("locked", raw)),
            Kind::File => {
                Err(Error::new(ErrorKind::AlreadyExists, "the root is a directory").with_path(raw))
            }
        };
    }
    open::check_not_denied(&target, raw)?;
    // Consent where the path really leads, before any parent is made: a link in the spelling
    // must not get folders made in a root (or a part of one) this session may not touch.
    // (A path that leads nowhere or out is refused by the steps below, as it always was.)
    if let Ok(real) = target.real(raw) {
        op.authorize(real.root(), real.rel(), raw)?;
    }
    op.check_keep_quota(p.keep_locked, raw)?;
    op.commit()?;
    make_parents(op, &target, raw)?;
    let parent = mutate::open_parent(&target, raw)?;
    op.authorize(target.root(), &parent.real, raw)?;
    let lock = op.lock(&parent.key, LockMode::Exclusive, raw)?;
    // Refused even where the entry exists already and nothing would change: `created: false`
    // on a protected path would still confirm what is there.
    parent.check_change("changed", raw)?;
    let created = match p.kind {
        Kind::Directory => parent.create_dir(raw)?,
        Kind::File => parent.create_file(raw)?,
    };
    if created {
        parent.sync().map_err(|e| e.or_path(raw))?;
    } else {
        let existing = parent.entry_type(raw)?;
        let same = existing.is_some_and(|t| match p.kind {
            Kind::Directory => t.is_dir(),
            Kind::File => t.is_file(),
        });
        if !same {
            let what = existing.map_or("something", open::describe);
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{what} already exists there"),
            )
            .with_path(raw));
        }
    }
    Ok(Reply {
        created,
        lock_id: op.keep(&lock, p.keep_locked, raw)?,
    })
}

/// Creates each missing ancestor of `target`, each through its own checked parent and under
/// its own lock, so a directory another session keeps locked gains nothing beneath it.
fn make_parents(op: &Op, target: &Resolved, raw: &str) -> Result<()> {
    for ancestor in target.ancestors() {
        let parent: Parent = mutate::open_parent(&ancestor, raw)?;
        match parent.entry_type(raw)? {
            None => {
                op.authorize(&parent.root, &parent.real, raw)?;
                // Locked only when it is to be made: an existing directory is not changed,
                // and locking it would refuse this create whenever another session merely
                // reads a file beside it.
                let _lock = op.lock(&parent.key, LockMode::Exclusive, raw)?;
                parent.create_dir(raw)?;
            }
            Some(t) if t.is_dir() || t.is_symlink() => {}
            Some(t) => {
                return Err(Error::new(
                    ErrorKind::InvalidPath,
                    format!("a parent is {}, not a directory", open::describe(t)),
                )
                .with_path(raw));
            }
        }
    }
    Ok(())
}

//! `files/list {path, recursive?, includeHidden?, cursor?, limit?}` →
//! `{entries: [{name, path, type, size, modified}], nextCursor?}`.
//!
//! Entries are sorted by `path` (byte order) across the whole listing, recursion never
//! follows a symlink, and a page holds at most `limit` entries. Memory stays bounded by one
//! page whatever the tree's size: the walk keeps only the `limit + 1` smallest paths after
//! the cursor in a heap, and holds one open directory per level of depth.

use std::collections::BinaryHeap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use cap_std::fs::{Dir, FileType};
use serde::{Deserialize, Serialize};

use super::{Ctx, Op};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc::Json;
use crate::rfc3339;
use crate::sandbox::{self, Root, open};
use crate::throttle::Deadline;

/// `files/list` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Params {
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    include_hidden: bool,
    cursor: Option<String>,
    limit: Option<u64>,
    #[serde(rename = "_meta", default)]
    _meta: Option<serde::de::IgnoredAny>,
}

/// An entry's type, from the directory entry itself (never following a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryType {
    File,
    Directory,
    Symlink,
    Other,
}

/// One entry.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct Entry {
    name: String,
    path: String,
    #[serde(rename = "type")]
    kind: EntryType,
    size: u64,
    modified: String,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.path.cmp(&other.path)
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The result.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    entries: Vec<Entry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

impl super::PayloadBytes for Reply {}

pub(crate) async fn handle(ctx: &Ctx<'_>, params: Params) -> Result<Json<Reply>> {
    ctx.owned().run(move |op| list(op, params)).await.map(Json)
}

/// Cursors carry the last path returned; they are opaque to servers, not secret.
const CURSOR_TAG: &str = "v1:";

fn encode_cursor(last_path: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{CURSOR_TAG}{last_path}"))
}

fn decode_cursor(cursor: &str) -> Result<String> {
    let bad = || Error::invalid_params(format!("cursor {cursor:?} was not made by this broker"));
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    text.strip_prefix(CURSOR_TAG)
        .map(str::to_owned)
        .ok_or_else(bad)
}

/// A directory whose entries have been read, with the subdirectories still to visit.
struct Level {
    dir: Dir,
    lexical: String,
    real: String,
    pending: Vec<String>,
}

/// The page being collected: the `limit + 1` smallest paths after the cursor.
struct Page<'a> {
    params: &'a Params,
    op: &'a Op,
    root: &'a Root,
    deadline: &'a Deadline,
    after: Option<String>,
    limit: usize,
    heap: BinaryHeap<Entry>,
}

fn list(op: &Op, p: Params) -> Result<Reply> {
    let max = op.policy.limits().max_list_entries;
    let limit = match p.limit {
        Some(0) => return Err(Error::invalid_params("limit must be at least 1")),
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX).min(max),
        None => max,
    };
    let after = p.cursor.as_deref().map(decode_cursor).transpose()?;
    let target = op.resolve(&p.path)?;
    let (dir, real) = open::open_dir(&target, &p.path)?;
    op.authorize(target.root(), &real, &p.path)?;
    let mut page = Page {
        params: &p,
        op,
        root: target.root(),
        deadline: &op.deadline,
        after,
        limit,
        heap: BinaryHeap::with_capacity(limit.min(4096) + 1),
    };

    // Depth-first, one open directory per level: a wide tree never holds many descriptors.
    let top = page
        .scan(&dir, target.rel(), &real)
        .map_err(|e| Error::from_io(&e, &p.path))?;
    let mut stack = vec![Level {
        dir,
        lexical: target.rel().to_owned(),
        real,
        pending: top,
    }];
    while let Some(level) = stack.last_mut() {
        if op.deadline.expired() {
            return Err(crate::throttle::timed_out(op.policy.limits().timeout));
        }
        let Some(name) = level.pending.pop() else {
            stack.pop();
            continue;
        };
        if stack.len() > crate::sandbox::MAX_WALK_DEPTH {
            return Err(too_deep(&p.path));
        }
        let level = stack
            .last_mut()
            .unwrap_or_else(|| unreachable!("popped from it above"));
        let lexical = join(&level.lexical, &name);
        // A later page does not read again the folders an earlier one finished, nor a page
        // the folders past its end: each page costs its own entries, not the whole tree.
        if page.cannot_hold(&sandbox::join_display(target.root().name(), &lexical)) {
            continue;
        }
        let real = join(&level.real, &name);
        let scanned = open::open_child_dir(&level.dir, name.as_ref()).and_then(|dir| {
            page.scan(&dir, &lexical, &real)
                .map(|pending| (dir, pending))
        });
        match scanned {
            Ok((dir, pending)) => stack.push(Level {
                dir,
                lexical,
                real,
                pending,
            }),
            // A walk stopped by its deadline ends at the top of the loop; say nothing here.
            Err(_) if op.deadline.expired() => {}
            Err(e) => tracing::warn!(
                root = target.root().name(),
                path = %lexical,
                error = %e,
                "files/list: not descending into a directory it cannot read"
            ),
        }
    }

    let mut entries = page.heap.into_sorted_vec();
    let next_cursor = if entries.len() > limit {
        entries.truncate(limit);
        entries.last().map(|e| encode_cursor(&e.path))
    } else {
        None
    };
    Ok(Reply {
        entries,
        next_cursor,
    })
}

/// A recursive listing of a tree deeper than [`crate::sandbox::MAX_WALK_DEPTH`] levels.
fn too_deep(raw: &str) -> Error {
    Error::new(
        ErrorKind::QuotaExceeded,
        format!(
            "the tree is more than {} levels deep; list its deeper folders on their own",
            crate::sandbox::MAX_WALK_DEPTH
        ),
    )
    .with_path(raw)
}

impl Page<'_> {
    /// Whether no entry beneath the folder shown as `shown` can be on this page. In byte
    /// order they all lie between `shown/` and `shown0` (`0` follows `/`): none is past the
    /// cursor when the cursor is at `shown0` or beyond, and none is small enough for a full
    /// page whose largest path is `shown/` or before.
    fn cannot_hold(&self, shown: &str) -> bool {
        let mut bound = String::with_capacity(shown.len() + 1);
        bound.push_str(shown);
        bound.push('0');
        if self.after.as_deref().is_some_and(|a| a >= bound.as_str()) {
            return true;
        }
        bound.pop();
        bound.push('/');
        self.heap.len() > self.limit && self.heap.peek().is_some_and(|top| top.path <= bound)
    }

    /// Adds `dir`'s entries to the page and returns the subdirectories to descend into
    /// (none unless recursive), in reverse order so popping visits them in order.
    fn scan(&mut self, dir: &Dir, lexical: &str, real: &str) -> std::io::Result<Vec<String>> {
        let root = self.root;
        let protected = root.protected();
        let here = root.join(real);
        let mut subdirs = Vec::new();
        for entry in dir.entries()? {
            // The answer is already TIMEOUT; stop walking.
            if self.deadline.expired() {
                return Err(std::io::Error::other("timed out"));
            }
            let entry = match entry {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(root = self.root.name(), path = %lexical, error = %e, "unreadable directory entry");
                    continue;
                }
            };
            let os_name = entry.file_name();
            let Some(name) = os_name.to_str() else {
                tracing::warn!(root = self.root.name(), path = %lexical, name = ?os_name, "files/list: skipping a name that is not UTF-8");
                continue;
            };
            if !self.params.include_hidden && name.starts_with('.') {
                continue;
            }
            // Uploads in progress are the broker's business, not a listing's.
            if sandbox::is_staging_name(name) {
                continue;
            }
            let entry_rel = join(lexical, name);
            if root.is_denied(&entry_rel)
                || (real != lexical && root.is_denied(&join(real, name)))
                || protected.is_own_entry(&here, &os_name, None)
            {
                continue;
            }
            // A root nested here keeps its consent: a recursive listing neither shows nor
            // enters a `deny` root or an ungranted part of a `prompt` one. (Without another
            // root in play, the listed folder's consent covers all of it.)
            if root.has_overlaps() && self.op.authorize(root, &join(real, name), "").is_err() {
                continue;
            }
            let Ok(ft) = entry.file_type() else { continue };
            let kind = entry_type(ft);
            if self.params.recursive && kind == EntryType::Directory {
                subdirs.push(name.to_owned());
            }
            let path = sandbox::join_display(self.root.name(), &entry_rel);
            if self.after.as_deref().is_some_and(|a| path.as_str() <= a) {
                continue;
            }
            if self.heap.len() > self.limit && self.heap.peek().is_some_and(|top| top.path <= path)
            {
                continue;
            }
            let (size, modified) = match entry.metadata() {
                // A second name for one of fsbroker's own files (a hard link) is hidden too.
                Ok(m)
                    if protected.is_own_entry(
                        &here,
                        &os_name,
                        Some(sandbox::protected::cap_id_of(&m)),
                    ) =>
                {
                    continue;
                }
                Ok(m) => (m.len(), m.modified().ok().map(|t| t.into_std())),
                Err(_) => (0, None),
            };
            self.heap.push(Entry {
                name: name.to_owned(),
                path,
                kind,
                size,
                modified: rfc3339::format(modified.unwrap_or(std::time::UNIX_EPOCH)),
            });
            if self.heap.len() > self.limit + 1 {
                self.heap.pop();
            }
        }
        subdirs.sort_unstable_by(|a, b| b.cmp(a));
        Ok(subdirs)
    }
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

fn entry_type(ft: FileType) -> EntryType {
    if ft.is_symlink() {
        EntryType::Symlink
    } else if ft.is_dir() {
        EntryType::Directory
    } else if ft.is_file() {
        EntryType::File
    } else {
        EntryType::Other
    }
}

//! Where changes wait before they go out: coalesced per path for a short window, held (still
//! coalescing) while a session does not read, bounded per watch (past the bound a watch is
//! rescanned instead), then sent as `notifications/files/changed`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};

use serde::Serialize;

use super::Worker;
use crate::jsonrpc::{self, Json};
use crate::limits::{COALESCE, MAX_PENDING_PER_WATCH};
use crate::policy::Policy;
use crate::watch::{Change, Watch, WatchHub};

/// A change waiting to go out: the coalesced change, when the burst began, and when it was
/// seen first (the notification's timestamp).
#[derive(Debug)]
pub(super) struct Pending {
    change: Change,
    first: Instant,
    when: SystemTime,
}

/// The notification's parameters.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Changed<'a> {
    path: String,
    event: &'static str,
    timestamp: String,
    watch_id: &'a str,
}

impl Worker {
    /// Sends what has been quiet for the coalescing window. A session whose queue is full
    /// keeps its changes here, still coalescing per path, until it reads again.
    pub(super) fn flush(&mut self, hub: &WatchHub, policy: &Policy) {
        let now = Instant::now();
        let due: Vec<(String, String)> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.first) >= COALESCE)
            .map(|(k, _)| k.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let reg = hub.registry();
        for key in due {
            let Some(w) = reg
                .watches
                .get(&key.0)
                .filter(|w| w.live.load(Ordering::Acquire))
            else {
                self.pending.remove(&key);
                continue;
            };
            let Some(session) = w.session.upgrade() else {
                self.pending.remove(&key);
                continue;
            };
            let Some(p) = self.pending.get(&key) else {
                continue;
            };
            if !w.events.has(p.change) {
                self.pending.remove(&key);
                continue;
            }
            let Some(name) = root_name(policy, &w.root) else {
                self.pending.remove(&key);
                continue;
            };
            let params = Changed {
                path: crate::sandbox::join_display(&name, &key.1),
                event: p.change.name(),
                timestamp: crate::rfc3339::format(p.when),
                watch_id: &key.0,
            };
            let frame =
                jsonrpc::notification_frame("notifications/files/changed", Some(&Json(params)));
            if session.try_notify(frame) {
                self.pending.remove(&key);
                self.stalled.remove(&w.session_id);
            } else if self.stalled.insert(w.session_id) {
                tracing::warn!(
                    session = w.session_id,
                    "the server is not reading; holding file notifications, coalesced per path"
                );
            }
        }
    }
}

/// Queues `change` at `rel` for watch `id`, folded into what already waits for that path; past
/// [`MAX_PENDING_PER_WATCH`] paths the change is dropped and the watch marked for a rescan.
pub(super) fn merge(
    pending: &mut HashMap<(String, String), Pending>,
    w: &mut Watch,
    id: &str,
    rel: String,
    change: Change,
) {
    let key = (id.to_owned(), rel);
    if let Some(p) = pending.get_mut(&key) {
        p.change = p.change.then(change);
        return;
    }
    let waiting = pending.keys().filter(|(i, _)| i == id).count();
    if waiting >= MAX_PENDING_PER_WATCH {
        // Drop, and rescan this watch once its backlog is out: the rescan reports the
        // difference, so the drop loses nothing.
        if !w.lost {
            tracing::warn!(
                session = w.session_id,
                watch = id,
                "too many changes waiting; dropping and rescanning later"
            );
        }
        w.lost = true;
        return;
    }
    pending.insert(
        key,
        Pending {
            change,
            first: Instant::now(),
            when: SystemTime::now(),
        },
    );
}

fn root_name(policy: &Policy, root: &Path) -> Option<String> {
    policy
        .roots()
        .iter()
        .find(|r| r.path() == root)
        .map(|r| r.name().to_owned())
}

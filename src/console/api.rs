//! `GET /api/state` and the person's acts. Each act is one call of the broker's public API,
//! run off the async threads (it writes the audit log). Only numbers and root names come in
//! from the page; every string going out is the broker's or a server's, for the page to show
//! as text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use fsbroker::audit::timestamp;
use fsbroker::sandbox::{ConsentMode, Mode};
use fsbroker::{ActError, Broker, PromptAnswer};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Shared;
use super::guard::refuse;

/// How often the audit log's whole chain is checked again while the console runs.
const CHAIN_CHECK_EVERY: Duration = Duration::from_secs(30);

/// The last check of the audit log's chain, made on a thread of its own.
#[derive(Default)]
pub(crate) struct AuditCheck(Arc<Mutex<Option<Value>>>);

impl AuditCheck {
    /// Checks the broker's audit log now and every [`CHAIN_CHECK_EVERY`] after, until the
    /// broker is gone.
    pub(crate) fn start(broker: &Arc<Broker>) -> AuditCheck {
        let last: Arc<Mutex<Option<Value>>> = Arc::default();
        let Some(path) = broker.audit().map(|log| log.path().to_path_buf()) else {
            return AuditCheck(last);
        };
        let weak = Arc::downgrade(broker);
        let out = Arc::clone(&last);
        let spawned = std::thread::Builder::new()
            .name("fsbroker-console-audit".into())
            .spawn(move || {
                while weak.strong_count() > 0 {
                    let checked = match fsbroker::audit::verify(&path) {
                        Ok(s) => json!({
                            "intact": true,
                            "lines": s.lines,
                            "lastSeal": s.last_seal,
                            "error": null,
                        }),
                        Err(e) => json!({ "intact": false, "error": e.to_string() }),
                    };
                    let mut checked = checked;
                    checked["checkedAt"] = Value::from(timestamp(SystemTime::now()));
                    *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(checked);
                    std::thread::sleep(CHAIN_CHECK_EVERY);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot check the audit chain for the console");
        }
        AuditCheck(last)
    }

    fn last(&self) -> Option<Value> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Numbers the sessions in the order they connected, for the person to tell them apart by a
/// short label ("server 3") rather than a 15-digit id: a session's id less the first id this
/// console saw, plus one. A broker's ids count up from a random start, one per session, so
/// these numbers follow the connections and never change while the broker runs. The first id
/// is the smallest session open when the console first numbers one, so no open session is
/// older; a session that ended before that has no number (`None`).
#[derive(Default)]
pub(crate) struct Order(OnceLock<u64>);

impl Order {
    /// Session `id`'s number, from 1.
    pub(crate) fn of(&self, broker: &Broker, id: u64) -> Option<u64> {
        let first = *self.0.get_or_init(|| {
            let open = broker.sessions().into_iter().map(|s| s.id);
            open.chain([id]).min().unwrap_or(id)
        });
        id.checked_sub(first).map(|n| n + 1)
    }
}

/// Whether each path of a waiting prompt is a folder ([`Broker::is_folder`]), looked at once
/// per prompt: the page asks for the state twice a second, and a path on a file system that
/// stopped answering must hold up one read of the state at most (later reads find it
/// pending, and say nothing of it).
#[derive(Default)]
pub(crate) struct Kinds(Mutex<HashMap<u64, Option<Folders>>>);

/// Whether each path of a prompt is a folder, in its order ([`Broker::is_folder`]).
type Folders = Arc<[Option<bool>]>;

impl Kinds {
    /// What the paths of `prompt` are (`None` each while they are being looked at).
    fn of(&self, broker: &Broker, prompt: &fsbroker::Prompt) -> Folders {
        let unknown = || prompt.paths.iter().map(|_| None).collect();
        {
            let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match known.get(&prompt.id) {
                Some(Some(kinds)) => return Arc::clone(kinds),
                Some(None) => return unknown(),
                None => {
                    known.insert(prompt.id, None);
                }
            }
        }
        let kinds: Folders = prompt
            .paths
            .iter()
            .map(|p| broker.is_folder(&p.path))
            .collect();
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = known.get_mut(&prompt.id) {
            *slot = Some(Arc::clone(&kinds));
        }
        kinds
    }

    /// Forgets the prompts that no longer wait.
    fn keep(&self, waiting: &[u64]) {
        let mut known = self.0.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|id, _| waiting.contains(id));
    }
}

/// `GET /api/state`: sessions, prompts, roots and the audit trail, built off the async
/// threads (it walks every session and prompt; the sessions' requests go on meanwhile).
pub(crate) async fn state(State(shared): State<Arc<Shared>>) -> Response {
    match tokio::task::spawn_blocking(move || build_state(&shared)).await {
        Ok(state) => Json(state).into_response(),
        Err(_) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the state could not be read",
        ),
    }
}

fn build_state(shared: &Shared) -> Value {
    let broker = &shared.broker;
    let sessions: Vec<Value> = broker
        .sessions()
        .into_iter()
        .map(|s| {
            json!({
                "id": s.id,
                "order": shared.order.of(broker, s.id),
                "server": s.server,
                "era": if s.modern { "2026-07-28" } else { "2025" },
                "transport": s.transport.name(),
                "confinement": s.confinement,
                "startedAt": timestamp(s.started),
                "requests": s.requests,
                "bytesRead": s.bytes_read,
                "bytesWritten": s.bytes_written,
                "errors": s.errors,
                "denials": s.denials,
                "uploads": s.uploads,
                "locks": s.locks,
                "watches": s.watches,
                "grants": s.grants.iter().map(|g| json!({
                    "id": g.id,
                    "path": g.path.to_string_lossy(),
                    "root": g.root.to_string_lossy(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let now = SystemTime::now();
    let waiting = broker.prompts();
    shared
        .kinds
        .keep(&waiting.iter().map(|p| p.id).collect::<Vec<_>>());
    let prompts: Vec<Value> = waiting
        .into_iter()
        .map(|p| {
            let kinds = shared.kinds.of(broker, &p);
            json!({
                "id": p.id,
                "session": p.session,
                "sessionOrder": shared.order.of(broker, p.session),
                "server": p.server,
                "message": p.message,
                "messageFrom": if p.from_server { "server" } else { "broker" },
                "paths": p.paths.iter().zip(kinds.iter()).map(|(q, folder)| json!({
                    "path": q.path,
                    "root": q.root,
                    "mode": mode(q.mode),
                    "kind": folder.map(|f| if f { "folder" } else { "file" }),
                })).collect::<Vec<_>>(),
                "askedAt": timestamp(p.asked),
                "expiresAt": timestamp(p.expires),
                "expiresInMs": p.expires.duration_since(now).unwrap_or_default().as_millis() as u64,
            })
        })
        .collect();
    let roots: Vec<Value> = broker
        .roots()
        .into_iter()
        .map(|r| {
            json!({
                "name": r.name,
                "path": r.path.to_string_lossy(),
                "mode": mode(r.mode),
                "consent": match r.consent {
                    ConsentMode::Auto => "auto",
                    ConsentMode::Prompt => "prompt",
                    ConsentMode::Deny => "deny",
                },
                "paused": r.paused,
                "managed": r.managed,
            })
        })
        .collect();
    // What the person is shown of the proxy's sign-ins: never a token, code or secret (the
    // authorization URL carries none).
    let sign_ins: Vec<Value> = shared
        .sign_ins
        .cards()
        .into_iter()
        .map(|c| {
            json!({
                "server": c.server,
                "state": c.state,
                "issuer": c.issuer,
                "scopes": c.scopes,
                "authorize": c.authorize,
                "origin": c.origin,
                "reason": c.reason,
                "at": timestamp(c.at),
            })
        })
        .collect();
    let audit = broker.audit().map(|log| {
        let status = log.status();
        json!({
            "path": log.path().to_string_lossy(),
            "writable": status.writable,
            "head": status.head,
            "copiesUp": status.copies_up,
            "chain": shared.audit.last().unwrap_or_else(|| json!({ "intact": null, "checkedAt": null })),
        })
    });
    json!({
        "broker": {
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "startedAt": shared.started,
        },
        "sessions": sessions,
        "signIns": sign_ins,
        "prompts": prompts,
        "roots": roots,
        "audit": audit,
    })
}

fn mode(m: Mode) -> &'static str {
    match m {
        Mode::ReadOnly => "read-only",
        Mode::ReadWrite => "read-write",
    }
}

/// The body of `POST /api/prompts/{id}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Answer {
    #[serde(default)]
    approved_paths: Option<Vec<String>>,
    #[serde(default)]
    deny: bool,
}

/// `POST /api/prompts/{id}` with `{"approvedPaths":[…]}` or `{"deny":true}`.
pub(crate) async fn answer(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<u64>, PathRejection>,
    body: Result<Json<Answer>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return bad_id();
    };
    let Ok(Json(body)) = body else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the body must be {\"approvedPaths\":[…]} or {\"deny\":true}",
        );
    };
    let answer = match (body.approved_paths, body.deny) {
        (None, true) => PromptAnswer::Deny,
        (Some(paths), false) => PromptAnswer::Approve(paths),
        _ => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "give either approvedPaths or deny, not both",
            );
        }
    };
    act(shared, move |b| b.answer_prompt(id, answer)).await
}

/// `POST /api/grants/{id}/revoke`.
pub(crate) async fn revoke(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return bad_id();
    };
    act(shared, move |b| b.revoke_grant(id).map(drop)).await
}

/// `POST /api/sessions/{id}/end`.
pub(crate) async fn end(
    State(shared): State<Arc<Shared>>,
    id: Result<Path<u64>, PathRejection>,
) -> Response {
    let Ok(Path(id)) = id else {
        return bad_id();
    };
    act(shared, move |b| b.end_session(id)).await
}

/// An id in the path that is not a number.
fn bad_id() -> Response {
    refuse(StatusCode::BAD_REQUEST, "the id must be a number")
}

/// `POST /api/roots/{name}/pause` and `/resume`.
pub(crate) async fn root(
    State(shared): State<Arc<Shared>>,
    parts: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let Ok(Path((name, what))) = parts else {
        return refuse(StatusCode::BAD_REQUEST, "not a root's name");
    };
    match what.as_str() {
        "pause" => act(shared, move |b| b.pause_root(&name).map(drop)).await,
        "resume" => act(shared, move |b| b.resume_root(&name).map(drop)).await,
        _ => refuse(StatusCode::NOT_FOUND, "a root can be paused or resumed"),
    }
}

/// Runs one of the person's acts on the blocking pool: 204, or the reason it was not done.
async fn act<F>(shared: Arc<Shared>, f: F) -> Response
where
    F: FnOnce(&Broker) -> Result<(), ActError> + Send + 'static,
{
    let broker = Arc::clone(&shared.broker);
    match tokio::task::spawn_blocking(move || f(&broker)).await {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e @ ActError::Answer(fsbroker::AnswerError::NotAsked { .. }))) => {
            refuse(StatusCode::BAD_REQUEST, &e.to_string())
        }
        Ok(Err(e)) => refuse(StatusCode::NOT_FOUND, &e.to_string()),
        Err(_) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "the act failed"),
    }
}

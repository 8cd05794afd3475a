//! One request's way from arrival to answer: the audit log's health, the session's request
//! rate, the dispatch, and the request's audit line, begun here before it runs and finished
//! here (or by the fast path's watchdog, through the same [`PendingLine`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use serde_json::value::RawValue;

use super::op::{Ctx, audit_unavailable};
use super::{Kind, Outcome, dispatch, is_broker_method, method as row};
use crate::audit::{AuditError, AuditLog, PendingLine};
use crate::broker::Broker;
use crate::buffers::Content;
use crate::fast::{Late, LateAudit};
use crate::jsonrpc;
use crate::outgoing::Outgoing;
use crate::session::SessionState;
use crate::throttle;

/// A request's parameters: as parsed, and the content lifted out of its line before parsing.
#[derive(Debug)]
pub(crate) struct Args<'a> {
    /// The `params` member, raw.
    pub params: Option<&'a RawValue>,
    /// See `Ctx::lifted`.
    pub lifted: Option<Content<'a>>,
}

/// Runs one request and returns its response frame; writes its audit line when the broker
/// keeps an audit log, and refuses it when that log cannot be written. The same record goes
/// to a host's live view ([`Broker::events`]) when one is open, and the session's counts
/// ([`Broker::sessions`]) are kept here.
pub(crate) async fn call(
    broker: &Arc<Broker>,
    state: &Arc<SessionState>,
    method: &str,
    args: Args<'_>,
    id: &RawValue,
    arrival: u64,
    late: Option<&Arc<Late>>,
) -> Outgoing {
    let started = Instant::now();
    let Args { params, lifted } = args;
    let known = row(method);
    let audit = broker.audit().filter(|_| is_broker_method(method));
    // The line is begun before the work runs: a read may take the fast path, where the
    // watchdog may answer it and write its line. A host's live view gets the same record.
    let recorded = audit.is_some() || (broker.wants_events() && is_broker_method(method));
    let line = recorded.then(|| {
        let name = known.map_or_else(|| Cow::Owned(method.to_owned()), |m| Cow::Borrowed(m.name));
        let mut line = PendingLine::begin(
            state.id,
            name,
            params.map(RawValue::get),
            state.peer_name(),
            started,
        );
        if audit.is_some() {
            let policy = broker.policy();
            let managed = policy.managed().map(|m| m.sha256.as_str());
            if let Some(sha) = state.managed_to_note(managed) {
                line.note_managed(sha);
            }
        }
        line
    });
    if let (Some(log), Some(late), Some(line), "files/read") = (audit, late, &line, method) {
        late.audit_with(LateAudit {
            log: Arc::clone(log),
            line: line.clone(),
        });
    }
    let ctx = Ctx {
        policy: broker.policy(),
        broker,
        state,
        arrival,
        late: late.cloned(),
        lifted: std::sync::Mutex::new(lifted),
    };
    let mut also_refused = 0;
    let (frame, outcome) = if audit.is_some_and(|a| !a.is_healthy()) {
        // Refused before it runs. The refusal is still recorded when only a required copy
        // was lost: the file itself takes lines.
        let e = audit_unavailable();
        let code = e.kind().outcome();
        (
            jsonrpc::error_frame(Some(id), &e).into(),
            Outcome { code, bytes: 0 },
        )
    } else if state.is_ended() && is_broker_method(method) {
        // Between the person's end and the transport's close, nothing more is done.
        let e = crate::error::Error::new(
            crate::error::ErrorKind::PermissionDenied,
            "the person ended this session",
        );
        let code = e.kind().outcome();
        (
            jsonrpc::error_frame(Some(id), &e).into(),
            Outcome { code, bytes: 0 },
        )
    } else if known.is_some_and(|m| m.kind == Kind::Free) {
        dispatch(&ctx, method, params, id).await
    } else {
        match broker.rate_limits().check_request(state.id) {
            Ok(()) => dispatch(&ctx, method, params, id).await,
            Err(e) => {
                let frame = jsonrpc::error_frame(Some(id), &e).into();
                let code = e.kind().outcome();
                if audit.is_some() {
                    match state.rate_refusal_line() {
                        Some(folded) => also_refused = folded,
                        // Counted in the session's next such line.
                        None => {
                            state.stats.count(code, 0, 0);
                            return frame;
                        }
                    }
                }
                (frame, Outcome { code, bytes: 0 })
            }
        }
    };
    if known.is_none_or(|m| m.kind != Kind::Free) {
        let (read, written) = match known.map(|m| m.kind) {
            Some(Kind::Acts) => (0, outcome.bytes),
            _ => (outcome.bytes, 0),
        };
        state.stats.count(outcome.code, read, written);
    }
    if late.is_some_and(|l| l.audited()) {
        // Answered and recorded by the watchdog; this answer is dropped.
        return frame;
    }
    let Some(mut line) = line else {
        return frame;
    };
    line.name_server(state.peer_name());
    let record = line.record(outcome.code, outcome.bytes, also_refused);
    let Some(log) = audit else {
        broker.publish(&record);
        return frame;
    };
    // The line waits for the log no longer than the request's own deadline: past it a
    // request that only looked (a read, a listing) answers TIMEOUT and its content is not
    // sent. One that acted (its commit point found the log free) gets a second deadline, and
    // if its line still cannot be written the log fails closed.
    let limit = broker.policy().limits().timeout;
    let acted = outcome.code == "ok" && known.is_none_or(|m| m.kind == Kind::Acts);
    let mut written = AuditLog::record_async(Arc::clone(log), &record, started + limit).await;
    if acted && matches!(written, Err(AuditError::Late { .. })) {
        written = AuditLog::record_async(Arc::clone(log), &record, Instant::now() + limit).await;
        if let Err(e) = &written {
            log.fail_closed(e);
        }
    }
    match written {
        Ok(()) => {
            broker.publish(&record);
            frame
        }
        Err(AuditError::Late { .. }) if !acted => {
            let e = throttle::timed_out(limit);
            broker.publish(&line.record(e.kind().outcome(), 0, also_refused));
            jsonrpc::error_frame(Some(id), &e).into()
        }
        Err(_) => {
            if outcome.code == "ok" {
                // It acted and its line is not in the log: say what it did, where it can be read.
                tracing::error!(
                    session = state.id,
                    method,
                    path =
                        crate::audit::cap(record.path.unwrap_or(""), crate::audit::MAX_LOGGED_PATH),
                    new_path = crate::audit::cap(
                        record.new_path.unwrap_or(""),
                        crate::audit::MAX_LOGGED_PATH
                    ),
                    "this request took effect but its audit line could not be written"
                );
            }
            let e = audit_unavailable();
            broker.publish(&line.record(e.kind().outcome(), 0, also_refused));
            jsonrpc::error_frame(Some(id), &e).into()
        }
    }
}

//! One message to the remote server ([`Message`], read as far as its POST needs): its POST,
//! with the era's headers, and what comes back (a JSON body, or an event stream followed, and
//! resumed, until the request's answer). A request that gets no answer gets a JSON-RPC error
//! instead, under its own id, naming the URL and why; an answer of the broker's the server
//! refuses as too large (413) becomes an error for the server's request, and a clamp on its
//! later reads.

use std::sync::Arc;

use ::http::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use ::http::{Method, StatusCode};
use bytes::Bytes;
use serde_json::value::RawValue;

use super::failure::Failure;
use super::http::read_body;
use super::session::{SESSION_ID, is_event_stream};
use super::sse::{Events, StreamError};
use super::streams::NotFollowed;
use super::{Remote, header_value};
use crate::error::{Error, ErrorKind};
use crate::jsonrpc;
use crate::limits::{REMOTE_RESUMES, REMOTE_RETRY, REMOTE_SIDE_STREAMS};
use crate::transport::lenient::RequestId;
use crate::transport::modern;

const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// What a line for the server is.
pub(super) enum Kind {
    /// A request (the host's, or the proxy's retry of one): it must get an answer.
    Request { id: Box<RawValue>, method: String },
    /// A notification (the host's or the broker's).
    Notification { method: String },
    /// An answer (the broker's, or the host's to a server request).
    Response { id: Box<RawValue> },
    /// A line the proxy cannot read; sent as it is.
    Other,
}

/// A line for the server, read as far as its POST needs.
pub(super) struct Message {
    pub(super) line: Bytes,
    pub(super) kind: Kind,
    /// The 2026-07-28 revision (or later) a request declares.
    modern: Option<HeaderValue>,
    /// `Mcp-Name`'s value (2026-07-28: a tool's or prompt's name, a resource's URI).
    name: Option<HeaderValue>,
    /// The request a `notifications/cancelled` cancels.
    cancels: Option<Box<RawValue>>,
}

impl Message {
    pub(super) fn read(line: Vec<u8>) -> Message {
        #[derive(serde::Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            method: Option<String>,
            #[serde(borrow)]
            params: Option<&'a RawValue>,
        }
        let (kind, params) = match serde_json::from_slice::<Envelope>(&line) {
            Ok(Envelope {
                id: Some(id),
                method: Some(method),
                params,
            }) => (
                Kind::Request {
                    id: id.to_owned(),
                    method,
                },
                params,
            ),
            Ok(Envelope {
                id: None,
                method: Some(method),
                params,
            }) => (Kind::Notification { method }, params),
            Ok(Envelope {
                id: Some(id),
                method: None,
                ..
            }) => (Kind::Response { id: id.to_owned() }, None),
            _ => (Kind::Other, None),
        };
        let cancels = match &kind {
            Kind::Notification { method } if method == "notifications/cancelled" => {
                #[derive(serde::Deserialize)]
                struct Cancel {
                    #[serde(rename = "requestId")]
                    request: Option<Box<RawValue>>,
                }
                params
                    .and_then(|p| serde_json::from_str::<Cancel>(p.get()).ok())
                    .and_then(|c| c.request)
            }
            _ => None,
        };
        let modern = match &kind {
            Kind::Request { .. } => modern::declared_version(&line)
                .filter(|v| modern::is_modern(v))
                .and_then(|v| header_value(&v)),
            _ => None,
        };
        // The 2026-07-28 transport mirrors what a request acts on in `Mcp-Name`, so that a
        // gateway can route it without reading the body; the TypeScript SDK 2.x refuses a
        // `tools/call` without it.
        let member = match &kind {
            Kind::Request { method, .. } if modern.is_some() => match method.as_str() {
                "tools/call" | "prompts/get" => Some("name"),
                "resources/read" => Some("uri"),
                "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
                _ => None,
            },
            _ => None,
        };
        let name = member.and_then(|member| {
            let params: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(params?.get()).ok()?;
            Some(mcp_name(params.get(member)?.as_str()?))
        });
        Message {
            line: Bytes::from(line),
            kind,
            modern,
            name,
            cancels,
        }
    }

    /// The host's request this message cancels.
    pub(super) fn cancels(&self) -> Option<RequestId> {
        self.cancels.as_deref().and_then(RequestId::of_raw)
    }

    /// The id of the host's request this message is, if it is one.
    pub(super) fn request_id(&self) -> Option<RequestId> {
        match &self.kind {
            Kind::Request { id, .. } => RequestId::of_raw(id),
            _ => None,
        }
    }

    fn method(&self) -> Option<&str> {
        match &self.kind {
            Kind::Request { method, .. } | Kind::Notification { method } => Some(method),
            _ => None,
        }
    }
}

impl Remote {
    /// Sends `msg`; a request of the host's gets its answer, or an error, on the relay.
    pub(super) async fn exchange(self: Arc<Self>, msg: Message) {
        // The pump made the request pending (before its task, so that a cancel finds it).
        let key = msg.request_id();
        let outcome = self.send(&msg, key.as_ref()).await;
        match (&msg.kind, outcome) {
            (Kind::Request { id, .. }, outcome) => {
                // The one place an unanswered request is settled: once, whichever came first.
                // It is failed before its error is queued (which may wait for the host), so
                // that the server's answer, coming meanwhile, is dropped. (An id that is no
                // id, `null`, was never pending: no answer can be paired with it.)
                if let Some(key) = key {
                    let mut ids = self.lock_ids();
                    if ids.pending.remove(&key).is_none() {
                        return;
                    }
                    ids.fail(key);
                } else if outcome.is_ok() {
                    return;
                }
                let mut failure = outcome.err().unwrap_or(Failure::NoAnswer {
                    url: Arc::clone(&self.http.url),
                    resumed: "",
                });
                // A stream cut because the session ended says so, not only that it broke.
                if self.session.expired()
                    && !self.session.is_modern()
                    && matches!(failure, Failure::NoAnswer { .. } | Failure::Stream { .. })
                {
                    failure = Failure::Expired {
                        url: Arc::clone(&self.http.url),
                    };
                }
                self.fail(id, &failure).await;
            }
            (_, Err(failure)) => {
                tracing::warn!(error = %failure, "a message for the server was not delivered");
            }
            (_, Ok(())) => {}
        }
    }

    /// The POST of `msg` and what it brings back.
    async fn send(self: &Arc<Self>, msg: &Message, key: Option<&RequestId>) -> Result<(), Failure> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let initialize =
            matches!(&msg.kind, Kind::Request { method, .. } if method == "initialize");
        if initialize {
            self.session.begin(key);
        } else {
            if let Kind::Request { .. } = msg.kind {
                // Each host request decides the era, as the relay's `Eras` does.
                self.session.set_modern(msg.modern.clone());
            }
            if !self.session.is_modern() && self.session.expired() {
                return Err(Failure::Expired {
                    url: Arc::clone(&self.http.url),
                });
            }
            self.session.headers(&mut headers);
            if self.session.is_modern() {
                if let Some(method) = msg.method().and_then(header_value) {
                    headers.insert(MCP_METHOD, method);
                }
                if let Some(name) = &msg.name {
                    headers.insert(MCP_NAME, name.clone());
                }
            }
        }
        let sent_id = headers.contains_key(SESSION_ID);
        // The broker's answer to a read of the server's: the read is settled now.
        let read = match &msg.kind {
            Kind::Response { id } => self.lock_reads().answered(id),
            _ => None,
        };
        let response = self
            .http
            .send(Method::POST, headers, msg.line.clone())
            .await?;
        if initialize {
            self.session
                .established(response.headers().get(SESSION_ID).cloned());
        }
        let status = response.status();
        if status == StatusCode::NOT_FOUND && sent_id {
            self.session_gone();
            return Err(Failure::Expired {
                url: Arc::clone(&self.http.url),
            });
        }
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return self.refused_as_too_large(msg, read).await;
        }
        if !status.is_success() {
            return Err(self.refusal(response).await);
        }
        let is_request = matches!(msg.kind, Kind::Request { .. });
        if is_event_stream(response.headers()) {
            let events = self.events(response.into_body());
            if !is_request {
                // A stream for a notification or an answer owes the host nothing, and may
                // stay open: followed beside the pump, which goes on with the next message;
                // a few at once, or a server could have the proxy hold any number.
                let me = Arc::clone(self);
                let followed = self.lock_followers().side(async move {
                    if let Err(e) = me.follow_post(events, None).await {
                        tracing::debug!(error = %e, "a stream that answers no request ended");
                    }
                });
                if let Err(NotFollowed::Full) = followed {
                    tracing::warn!(
                        "the server answered a notification or an answer with an event stream while {REMOTE_SIDE_STREAMS} such streams are open; it is closed unread"
                    );
                }
                return Ok(());
            }
            return self.follow_post(events, key).await;
        }
        let body = read_body(response, self.max_line, &self.in_flight)
            .await
            .map_err(|error| Failure::Body {
                url: Arc::clone(&self.http.url),
                error,
            })?;
        if body.iter().all(u8::is_ascii_whitespace) {
            if is_request {
                return Err(Failure::NoBody {
                    url: Arc::clone(&self.http.url),
                    status: status.as_u16(),
                });
            }
            return Ok(());
        }
        self.deliver(&body).await;
        Ok(())
    }

    /// Follows a POST's event stream until the answer to `key` has come, resuming it (a GET
    /// with `Last-Event-ID`) when it drops before, at most [`REMOTE_RESUMES`] times in a row.
    async fn follow_post(
        &self,
        mut events: Events,
        key: Option<&RequestId>,
    ) -> Result<(), Failure> {
        let mut last = None;
        let mut retry = REMOTE_RETRY;
        let mut attempts = 0;
        let settled = key.and_then(|k| self.settled(k));
        loop {
            let outcome = self
                .follow(&mut events, key, settled.as_deref(), &mut last, &mut retry)
                .await;
            let Some(key) = key.filter(|k| self.is_pending(k)) else {
                return outcome
                    .map(|_| ())
                    .map_err(|error| self.stream_failure(error));
            };
            match outcome {
                Err(error @ (StreamError::TooLarge { .. } | StreamError::Busy { .. })) => {
                    return Err(self.stream_failure(error));
                }
                Ok(true) => attempts = 0,
                _ => {}
            }
            let Some(from) = last.clone().filter(|_| !self.session.is_modern()) else {
                return Err(Failure::NoAnswer {
                    url: Arc::clone(&self.http.url),
                    resumed: "",
                });
            };
            events = loop {
                attempts += 1;
                if attempts > REMOTE_RESUMES {
                    return Err(Failure::NoAnswer {
                        url: Arc::clone(&self.http.url),
                        resumed: " (resuming it failed)",
                    });
                }
                tokio::time::sleep(retry).await;
                tracing::debug!(request = %key, "resuming the server's stream");
                match self.get(Some(&from)).await {
                    Ok(Some(events)) => break events,
                    Ok(None) => {
                        return Err(Failure::NoAnswer {
                            url: Arc::clone(&self.http.url),
                            resumed: " (it cannot be resumed: GET is not allowed)",
                        });
                    }
                    Err(e @ Failure::Expired { .. }) => return Err(e),
                    Err(e) => tracing::debug!(error = %e, "the stream could not be resumed"),
                }
            };
        }
    }

    /// A 413. For the broker's answer to a `files/read` (the read's path in `read`) the
    /// server gets an error naming the size that fits, and its later reads are clamped to
    /// it; for another answer of the broker's, an error; for the host's message, the host.
    async fn refused_as_too_large(
        &self,
        msg: &Message,
        read: Option<String>,
    ) -> Result<(), Failure> {
        let len = msg.line.len();
        let Kind::Response { id } = &msg.kind else {
            if carries_input_responses(&msg.line) {
                // MCP 2026-07-28: the broker's answers to the server's input requests ride in
                // the proxy's retry of the host's request. The host's request fails, and the
                // server's later `files/read` input requests are clamped so that it fits.
                let clamp = self.lock_reads().refused(None, len);
                tracing::warn!(
                    bytes = len,
                    clamp,
                    "the server refused a retry carrying the broker's answers with HTTP 413; its reads are clamped to {clamp} bytes from now on"
                );
            }
            return Err(Failure::TooLarge {
                url: Arc::clone(&self.http.url),
                len,
            });
        };
        let err = match read {
            Some(path) => {
                let clamp = self.lock_reads().refused(read_length(&msg.line), len);
                tracing::warn!(
                    bytes = len,
                    clamp,
                    "the server refused the answer to its files/read with HTTP 413; its reads are clamped to {clamp} bytes from now on"
                );
                Error::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "the MCP server refused an answer of {len} bytes with HTTP 413 (Payload Too Large); ask for at most {clamp} bytes"
                    ),
                )
                .with_path(path)
            }
            None => Error::new(
                ErrorKind::QuotaExceeded,
                format!(
                    "the MCP server refused an answer of {len} bytes with HTTP 413 (Payload Too Large)"
                ),
            ),
        };
        let mut frame = jsonrpc::error_frame(Some(id), &err);
        frame.pop();
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(
            ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        self.session.headers(&mut headers);
        let response = self
            .http
            .send(Method::POST, headers, Bytes::from(frame))
            .await?;
        if !response.status().is_success() {
            return Err(self.refusal(response).await);
        }
        Ok(())
    }
}

/// `Mcp-Name`'s value for `text`: as it is when it is printable ASCII without blanks at its
/// ends, else `=?base64?…?=` (the UTF-8 in standard base64), the form the 2026-07-28
/// transport gives names a header cannot carry (and empty ones, and ones that look encoded).
fn mcp_name(text: &str) -> HeaderValue {
    use base64::Engine;
    const PREFIX: &str = "=?base64?";
    const SUFFIX: &str = "?=";
    let plain = !text.is_empty()
        && text.trim() == text
        && !(text.starts_with(PREFIX) && text.ends_with(SUFFIX))
        && text.chars().all(|c| c == '\t' || (' '..='~').contains(&c));
    let encoded;
    let value = if plain {
        text
    } else {
        encoded = format!(
            "{PREFIX}{}{SUFFIX}",
            base64::engine::general_purpose::STANDARD.encode(text)
        );
        &encoded
    };
    // Printable ASCII either way, so always a valid header value.
    HeaderValue::from_str(value).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `result.length` of a `files/read` answer.
fn read_length(line: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Answer {
        result: Option<Length>,
    }
    #[derive(serde::Deserialize)]
    struct Length {
        length: Option<u64>,
    }
    serde_json::from_slice::<Answer>(line).ok()?.result?.length
}

/// Whether a host's message is a 2026-07-28 retry carrying answers to input requests (the
/// broker's among them).
fn carries_input_responses(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"inputResponses\"").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_header_cannot_carry_are_base64() {
        assert_eq!(mcp_name("read_all"), "read_all");
        assert_eq!(mcp_name("héllo"), "=?base64?aMOpbGxv?=");
        assert_eq!(mcp_name(" x"), "=?base64?IHg=?=");
        assert_eq!(mcp_name(""), "=?base64??=");
        assert_eq!(mcp_name("a\r\nX: y"), "=?base64?YQ0KWDogeQ==?=");
    }

    #[test]
    fn names_the_tool_for_a_modern_call() {
        let line = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_all","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
        let msg = Message::read(line.to_vec());
        assert!(msg.modern.is_some());
        assert_eq!(msg.name.unwrap(), "read_all");
        let old = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"x"}}"#;
        let msg = Message::read(old.to_vec());
        assert!(msg.modern.is_none() && msg.name.is_none());
    }
}

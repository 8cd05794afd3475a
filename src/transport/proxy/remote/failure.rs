//! Why a message got no answer from the server ([`Failure`]), and how a response that is not
//! a success, or a stream that broke, is read as one: the server's own words shown as text,
//! without what could hide or reorder it, and without the user's secrets.

use std::sync::Arc;

use ::http::Response;
use ::http::StatusCode;
use ::http::header::{HeaderValue, LOCATION, WWW_AUTHENTICATE};
use hyper::body::Incoming;

use super::Remote;
use super::given::shown;
use super::http::{BodyError, SendError, read_body};
use super::sse::StreamError;
use crate::error::ErrorKind;
use crate::limits::REMOTE_PENDING;

/// Why a message got no answer from the server.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failure {
    /// No response at all.
    #[error(transparent)]
    Send(#[from] SendError),
    /// 404 for a request carrying the session's id.
    #[error(
        "the MCP server at {url} ended the session (HTTP 404 for its Mcp-Session-Id): it expired or the server restarted; the proxy ends, so that the host starts it again for a new session"
    )]
    Expired { url: Arc<str> },
    /// 401.
    #[error(
        "the MCP server at {url} requires authorization (HTTP 401{metadata}); supply a token with --header-env Authorization=VAR, the environment variable VAR holding \"Bearer <token>\""
    )]
    Unauthorized { url: Arc<str>, metadata: String },
    /// 3xx: redirects are not followed.
    #[error(
        "the MCP server at {url} answered HTTP {status}{location}; redirects are not followed: give the final URL with --url"
    )]
    Redirect {
        url: Arc<str>,
        status: u16,
        location: String,
    },
    /// 413 for a host's message.
    #[error(
        "the MCP server at {url} refused a message of {len} bytes with HTTP 413 (Payload Too Large)"
    )]
    TooLarge { url: Arc<str>, len: usize },
    /// Any other status that is not a success.
    #[error("the MCP server at {url} answered HTTP {status}{detail}")]
    Status {
        url: Arc<str>,
        status: u16,
        detail: String,
    },
    /// 202 (or another success without a body) for a request.
    #[error("the MCP server at {url} accepted the request (HTTP {status}) but sent no answer")]
    NoBody { url: Arc<str>, status: u16 },
    /// A JSON body that could not be read whole.
    #[error("the MCP server at {url} sent {error}")]
    Body { url: Arc<str>, error: BodyError },
    /// An event stream that broke, or had an event too long.
    #[error("the MCP server at {url}: {error}")]
    Stream { url: Arc<str>, error: StreamError },
    /// The stream ended (and could not be resumed) before the request's answer.
    #[error("the MCP server at {url} closed the response stream without answering{resumed}")]
    NoAnswer {
        url: Arc<str>,
        resumed: &'static str,
    },
    /// [`REMOTE_PENDING`] host requests wait for the server's answers: this one is not sent.
    #[error(
        "the MCP server at {url} has {REMOTE_PENDING} requests unanswered; this one was not sent"
    )]
    TooManyWaiting { url: Arc<str> },
}

impl Failure {
    pub(super) fn kind(&self) -> ErrorKind {
        match self {
            Failure::TooLarge { .. } => ErrorKind::QuotaExceeded,
            _ => ErrorKind::Internal,
        }
    }
}

impl Remote {
    /// The failure a status that is not a success stands for.
    pub(super) async fn refusal(&self, response: Response<Incoming>) -> Failure {
        let url = Arc::clone(&self.http.url);
        let status = response.status();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(|v| self.http.redact(v))
        };
        if status == StatusCode::UNAUTHORIZED {
            let metadata = header(WWW_AUTHENTICATE)
                .and_then(|h| resource_metadata(&h))
                .map(|m| format!("; resource metadata: {}", shown(&m)))
                .unwrap_or_default();
            let failure = Failure::Unauthorized { url, metadata };
            tracing::error!("{failure}");
            return failure;
        }
        if status.is_redirection() {
            // Its query is not shown, whatever it holds: frameworks copy the request's query
            // (a key) into the `Location` of a redirect that adds a slash.
            let location = header(LOCATION)
                .map(|l| {
                    let bare = match l.split_once(['?', '#']) {
                        Some((before, _)) => format!("{before}?…"),
                        None => l,
                    };
                    format!(" to {}", shown(&bare))
                })
                .unwrap_or_default();
            return Failure::Redirect {
                url,
                status: status.as_u16(),
                location,
            };
        }
        // The server's own words, when its body is a JSON-RPC error (the SDKs say why they
        // refuse a request that way): a few KiB at most, and shown as text.
        let detail = read_body(response, 4096, &self.in_flight)
            .await
            .ok()
            .and_then(|body| {
                let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
                let message = v.pointer("/error/message")?.as_str()?;
                Some(shown(&self.http.redact(message)))
            })
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        Failure::Status {
            url,
            status: status.as_u16(),
            detail,
        }
    }
    pub(super) fn stream_failure(&self, error: StreamError) -> Failure {
        // The parser's words may quote the bytes it choked on.
        let error = match error {
            StreamError::Broken(why) => StreamError::Broken(shown(&self.http.redact(&why))),
            other => other,
        };
        Failure::Stream {
            url: Arc::clone(&self.http.url),
            error,
        }
    }
}

/// `resource_metadata="…"` of a `WWW-Authenticate: Bearer …` header.
fn resource_metadata(header: &str) -> Option<String> {
    let at = header.find("resource_metadata=")? + "resource_metadata=".len();
    let rest = header[at..].trim_start();
    let value = match rest.strip_prefix('"') {
        Some(quoted) => &quoted[..quoted.find('"')?],
        None => rest.split([',', ' ']).next()?,
    };
    Some(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_resource_metadata() {
        let h = r#"Bearer error="invalid_token", resource_metadata="https://a.example/.well-known/oauth-protected-resource""#;
        assert_eq!(
            resource_metadata(h).as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource")
        );
        assert_eq!(resource_metadata("Bearer realm=x"), None);
    }
}

//! The HTTP client of `proxy --url`: rustls over hyper (HTTP/1.1), the user's headers on every
//! request, no redirects followed, and every wait and every body bounded.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HeaderMap, HeaderValue, WWW_AUTHENTICATE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use super::auth::Auth;
use super::client::{self, chain};
use super::given::{RemoteError, shown_url};
use crate::limits::{REMOTE_BODY_IDLE, REMOTE_BODY_TOTAL, REMOTE_HEAD, SIGN_IN_WAIT};

/// One remote server's endpoint and the client that reaches it.
pub(super) struct Http {
    client: client::Client,
    uri: http::Uri,
    /// The endpoint as given, for messages (a URL carries no secret the proxy adds).
    pub(super) url: Arc<str>,
    /// The user's headers, values marked sensitive so that no debug output shows them.
    headers: HeaderMap,
    /// What of those values [`Http::redact`] hides, longest first.
    secrets: Vec<String>,
    /// Signing in, when the server asks for it (a 401) and the user sent no token.
    auth: Option<Arc<Auth>>,
}

/// Why a request got no response to look at.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// No connection, a TLS failure, or the connection broke before the headers came.
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: Arc<str>, reason: String },
    /// The headers did not come in time.
    #[error("{url} sent no response within {}s", REMOTE_HEAD.as_secs())]
    NoHead { url: Arc<str> },
    /// The server asked for a sign-in (HTTP 401, or 403 for more scope) that gave no token.
    #[error(
        "the MCP server at {url} requires authorization (HTTP {status}{metadata}), and signing in did not give a token: {reason}. To send a token of your own instead: --header-env Authorization=VAR, the environment variable VAR holding \"Bearer <token>\""
    )]
    SignIn {
        url: Arc<str>,
        status: u16,
        metadata: String,
        reason: String,
    },
}

/// Why a response body could not be read whole.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    /// Longer than the proxy relays.
    #[error("a response body longer than {max} bytes")]
    TooLarge { max: usize },
    /// The bytes being read from the server (all streams and bodies) filled their budget.
    #[error("a response body while its responses in flight already held {budget} bytes")]
    Busy { budget: usize },
    /// No byte for [`REMOTE_BODY_IDLE`] in the middle of it.
    #[error("a response body stalled for {}s", REMOTE_BODY_IDLE.as_secs())]
    Stalled,
    /// Not whole within [`REMOTE_BODY_TOTAL`].
    #[error("a response body not whole within {}s", REMOTE_BODY_TOTAL.as_secs())]
    TooSlow,
    /// The connection broke.
    #[error("a response body broke off: {0}")]
    Broken(String),
}

impl Http {
    /// The client for `url`: TLS trusts the system's roots and the `ca_certs` (PEM files).
    pub(super) fn new(
        url: &url::Url,
        headers: HeaderMap,
        ca_certs: &[PathBuf],
        auth: Option<Arc<Auth>>,
    ) -> Result<Http, RemoteError> {
        let uri: http::Uri = url.as_str().parse().map_err(|e| RemoteError::Url {
            url: shown_url(url),
            reason: format!("{e}"),
        })?;
        let client = client::new(ca_certs)?;
        Ok(Http {
            client,
            uri,
            url: shown_url(url).into(),
            secrets: secrets(&headers, url),
            headers,
            auth,
        })
    }

    /// `text` (a server's words: a header, an error message) with every value of the user's
    /// headers in it replaced by `[redacted]`: a server may echo the token it was sent, and
    /// what the proxy shows goes to stderr and to the host.
    pub(super) fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in &self.secrets {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "[redacted]");
            }
        }
        match &self.auth {
            Some(auth) => auth.redact(&out),
            None => out,
        }
    }

    /// Sends one request to the endpoint: the user's headers, then `protocol`'s (which the
    /// user's may not replace), the token when signed in, and `body`. Resolves once the
    /// response's headers have come. A 401 (or a 403 asking for more scope) to a POST or GET
    /// is answered by signing in, and the request sent once more with the new token.
    pub(super) async fn send(
        &self,
        method: Method,
        protocol: HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, SendError> {
        let Some(auth) = &self.auth else {
            return self.send_once(method, protocol, body, None).await;
        };
        // One deadline for the whole request: a refresh to wait for, then a sign-in.
        let until = tokio::time::Instant::now() + SIGN_IN_WAIT;
        auth.prepare(until).await;
        let sent = auth.token();
        let response = self
            .send_once(
                method.clone(),
                protocol.clone(),
                body.clone(),
                sent.as_deref(),
            )
            .await?;
        let status = response.status();
        let header = response
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let more_scope = status == StatusCode::FORBIDDEN
            && header
                .as_deref()
                .is_some_and(|h| h.contains("insufficient_scope"));
        let refused = status == StatusCode::UNAUTHORIZED || more_scope;
        if !refused {
            if let Some(token) = &sent {
                auth.accepted(token);
            }
        }
        if !refused || method == Method::DELETE {
            return Ok(response);
        }
        drop(response);
        match auth
            .challenged(sent.as_deref(), header.as_deref(), until)
            .await
        {
            Ok(()) => {
                let token = auth.token();
                let response = self
                    .send_once(method, protocol, body, token.as_deref())
                    .await?;
                if let Some(token) = token.filter(|_| response.status() != StatusCode::UNAUTHORIZED)
                {
                    auth.accepted(&token);
                }
                Ok(response)
            }
            Err(e) => Err(SendError::SignIn {
                url: Arc::clone(&self.url),
                status: status.as_u16(),
                metadata: header
                    .as_deref()
                    .and_then(|h| super::auth::resource_metadata(&self.redact(h)))
                    .map(|m| format!("; resource metadata: {m}"))
                    .unwrap_or_default(),
                reason: self.redact(&e.to_string()),
            }),
        }
    }

    /// One request, with `token` as its bearer token.
    async fn send_once(
        &self,
        method: Method,
        protocol: HeaderMap,
        body: Bytes,
        token: Option<&str>,
    ) -> Result<Response<Incoming>, SendError> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = method;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.extend(self.headers.clone());
        headers.extend(protocol);
        if let Some(token) = token {
            // Only ever to this endpoint (the resource it was issued for): no redirect is
            // followed, and the URI is the one the server was given as.
            if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {token}")) {
                value.set_sensitive(true);
                headers.insert(AUTHORIZATION, value);
            }
        }
        match tokio::time::timeout(REMOTE_HEAD, self.client.request(request)).await {
            Err(_) => Err(SendError::NoHead {
                url: Arc::clone(&self.url),
            }),
            Ok(Err(e)) => Err(SendError::Unreachable {
                url: Arc::clone(&self.url),
                reason: chain(&e),
            }),
            Ok(Ok(response)) => Ok(response),
        }
    }
}

/// Values shorter than this are not redacted: they would not be secrets, and replacing them
/// would garble the text around them (a header `X-Team: blue`).
const SECRET_MIN: usize = 8;

/// The strings [`Http::redact`] hides: each header value, the credential after its
/// `Bearer `/`Basic ` scheme, the URL's query and fragment (whole, and each value in them: a
/// key in `?api_key=…`, which a server may echo in an error or a redirect's `Location`), and
/// their percent-encoded forms (a URL quoting them), longest first so that a value goes whole
/// before a part of it.
fn secrets(headers: &HeaderMap, url: &url::Url) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut from_url: Vec<String> = Vec::new();
    for text in [url.query(), url.fragment()].into_iter().flatten() {
        from_url.push(text.to_owned());
        for (_, value) in url::form_urlencoded::parse(text.as_bytes()) {
            from_url.push(value.into_owned());
        }
        // As written too: a value the server echoes undecoded.
        from_url.extend(
            text.split('&')
                .filter_map(|pair| pair.split_once('=').map(|(_, v)| v.to_owned())),
        );
    }
    let values = headers
        .values()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_owned())
        .chain(from_url);
    for value in values {
        let mut parts = vec![value.clone()];
        if let Some((scheme, credential)) = value.split_once(' ') {
            if ["bearer", "basic"].contains(&scheme.to_ascii_lowercase().as_str()) {
                parts.push(credential.trim().to_owned());
            }
        }
        for part in parts.into_iter().filter(|p| p.len() >= SECRET_MIN) {
            let form: String = url::form_urlencoded::byte_serialize(part.as_bytes()).collect();
            out.extend([percent_encoded(&part), form, part]);
        }
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// `text` with every byte but the unreserved ones as `%XX`.
fn percent_encoded(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The byte budget everything being read from the server shares, and its size.
pub(super) struct InFlight {
    pub(super) bytes: Arc<tokio::sync::Semaphore>,
    pub(super) size: usize,
}

impl InFlight {
    pub(super) fn new(size: usize) -> InFlight {
        let size = size.min(tokio::sync::Semaphore::MAX_PERMITS);
        InFlight {
            bytes: Arc::new(tokio::sync::Semaphore::new(size)),
            size,
        }
    }
}

/// A whole JSON body, at most `max` bytes, each piece within [`REMOTE_BODY_IDLE`] of the last,
/// its bytes taken from `budget` until it ends.
pub(super) async fn read_body(
    response: Response<Incoming>,
    max: usize,
    budget: &InFlight,
) -> Result<Vec<u8>, BodyError> {
    let declared = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > max as u64) {
        return Err(BodyError::TooLarge { max });
    }
    let mut body = response.into_body();
    let mut out = Vec::new();
    let mut held: Option<tokio::sync::SemaphorePermit<'_>> = None;
    let end = tokio::time::Instant::now() + REMOTE_BODY_TOTAL;
    loop {
        let wait = REMOTE_BODY_IDLE.min(end.saturating_duration_since(tokio::time::Instant::now()));
        let frame = match tokio::time::timeout(wait, body.frame()).await {
            Err(_) if tokio::time::Instant::now() >= end => return Err(BodyError::TooSlow),
            Err(_) => return Err(BodyError::Stalled),
            Ok(None) => return Ok(out),
            Ok(Some(Err(e))) => return Err(BodyError::Broken(chain(&e))),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > max {
                return Err(BodyError::TooLarge { max });
            }
            let n = u32::try_from(data.len()).unwrap_or(u32::MAX);
            // Fails rather than waits: bodies waiting for each other's room would never end.
            let Ok(permit) = budget.bytes.try_acquire_many(n) else {
                return Err(BodyError::Busy {
                    budget: budget.size,
                });
            };
            match held.as_mut() {
                Some(held) => held.merge(permit),
                None => held = Some(permit),
            }
            out.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::options::user_header;
    use super::*;

    #[test]
    fn the_urls_query_is_redacted_in_every_form() {
        let url =
            url::Url::parse("http://127.0.0.1/mcp?team=blue&api_key=k3y%2FSECRET99#frag-SECRET")
                .unwrap();
        let http = Http::new(&url, HeaderMap::new(), &[], None).unwrap();
        for echo in [
            "bad request to /mcp?team=blue&api_key=k3y%2FSECRET99",
            "no such key k3y/SECRET99",
            "fragment frag-SECRET",
        ] {
            let shown = http.redact(echo);
            assert!(!shown.contains("SECRET"), "{echo:?} became {shown:?}");
        }
    }

    #[test]
    fn the_token_is_redacted_in_every_form() {
        let (name, value) = user_header("Authorization", "Bearer tok/8c1f0e SECRET").unwrap();
        let (team, blue) = user_header("X-Team", "blue").unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(name, value);
        headers.insert(team, blue);
        let http = Http::new(
            &url::Url::parse("http://127.0.0.1/mcp").unwrap(),
            headers,
            &[],
            None,
        )
        .unwrap();
        for echo in [
            "you sent Bearer tok/8c1f0e SECRET!",
            "token tok/8c1f0e SECRET",
            "https://x/?t=Bearer%20tok%2F8c1f0e%20SECRET",
            "https://x/?t=tok%2F8c1f0e+SECRET",
        ] {
            let shown = http.redact(echo);
            assert!(!shown.contains("SECRET"), "{shown}");
            assert!(shown.contains("[redacted]"), "{shown}");
        }
        assert_eq!(http.redact("team blue"), "team blue");
    }
}

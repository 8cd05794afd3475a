//! Who may use the console, checked on every request before any handler runs.
//!
//! Every page the person opens can reach a loopback port, so:
//! - `Host` must name the address the console is bound to (`127.0.0.1:PORT`, `[::1]:PORT` or
//!   `localhost:PORT`): a rebound DNS name pointing at 127.0.0.1 is refused.
//! - The API needs the run's token: `Authorization: Bearer TOKEN` (scripts), or the cookie
//!   the page got by opening the URL once (HttpOnly, SameSite=Strict, named by the port
//!   because cookies are shared between a host's ports).
//! - A state change (`POST`) with an `Origin` must come from the console's own origin; one
//!   authenticated by the cookie must also carry `Origin` and the run's CSRF token
//!   (`X-CSRF-Token`), which only a page that read `/api/state` knows. A browser never sends
//!   `Authorization` cross-origin without a CORS preflight, which the console does not answer.
//! - Every answer carries a CSP with no inline script and no framing, `nosniff`, and no
//!   CORS header at all.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// The run's secrets and the names it answers to.
pub(crate) struct Guard {
    token: String,
    csrf: String,
    /// `Host` values accepted (the bound address, and `localhost` with its port).
    hosts: Vec<String>,
    cookie_name: String,
}

impl Guard {
    /// New secrets (256 bits each) for a console bound to `bound`.
    pub(crate) fn new(bound: SocketAddr) -> Result<Guard, String> {
        let port = bound.port();
        Ok(Guard {
            token: random_hex(32)?,
            csrf: random_hex(32)?,
            hosts: vec![bound.to_string(), format!("localhost:{port}")],
            cookie_name: format!("fsbroker_console_{port}"),
        })
    }

    /// The address as the URL names it.
    pub(crate) fn host(&self) -> &str {
        &self.hosts[0]
    }

    /// The run's token.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The CSRF token a page sends back on state changes.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether `offered` is the token (compared in constant time).
    pub(crate) fn token_matches(&self, offered: &str) -> bool {
        same(offered, &self.token)
    }

    /// The `Set-Cookie` value that keeps the token for the page.
    pub(crate) fn cookie(&self) -> String {
        format!(
            "{}={}; HttpOnly; SameSite=Strict; Path=/",
            self.cookie_name, self.token
        )
    }

    /// How the request proves it has the token, if it does.
    fn credential(&self, headers: &HeaderMap) -> Option<Credential> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(offered) = bearer {
            return self
                .token_matches(offered.trim())
                .then_some(Credential::Bearer);
        }
        let from_cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(cookie::Cookie::split_parse)
            .filter_map(Result::ok)
            .any(|c| c.name() == self.cookie_name && self.token_matches(c.value()));
        from_cookie.then_some(Credential::Cookie)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Credential {
    Bearer,
    Cookie,
}

/// The check every request goes through (an axum middleware).
pub(crate) async fn check(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let guard = &shared.guard;
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if !host.is_some_and(|h| guard.hosts.iter().any(|ok| ok == h)) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this console answers only to its own address (Host)",
        );
    }
    let path = request.uri().path();
    // The page and its assets hold nothing; everything under /api/ needs the token.
    if path.starts_with("/api/") {
        let Some(credential) = guard.credential(headers) else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "the console's token is missing or wrong: open the URL `fsbroker console` gives",
            );
        };
        if request.method() != Method::GET {
            if let Err(why) = check_change(guard, headers, credential) {
                return refuse(StatusCode::FORBIDDEN, why);
            }
        }
    }
    let mut response = next.run(request).await;
    harden(response.headers_mut());
    response
}

/// The extra checks of a state change.
fn check_change(
    guard: &Guard,
    headers: &HeaderMap,
    credential: Credential,
) -> Result<(), &'static str> {
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    let own = |o: &str| {
        o.strip_prefix("http://")
            .is_some_and(|h| guard.hosts.iter().any(|ok| ok == h))
    };
    match origin {
        Some(o) if !own(o) => return Err("a request from another origin may not act here"),
        None if credential == Credential::Cookie => {
            return Err("a state change from the page must carry its Origin");
        }
        _ => {}
    }
    // Browsers that say where a request comes from: only the console's own page may act.
    let site = headers.get("sec-fetch-site").and_then(|s| s.to_str().ok());
    if site.is_some_and(|s| s != "same-origin" && s != "none") {
        return Err("a request from another site may not act here");
    }
    if credential == Credential::Cookie {
        let csrf = headers.get("x-csrf-token").and_then(|t| t.to_str().ok());
        if !csrf.is_some_and(|t| same(t, guard.csrf())) {
            return Err("the CSRF token (X-CSRF-Token) is missing or wrong");
        }
    }
    Ok(())
}

/// The headers every answer carries.
fn harden(h: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, name: &'static str, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(
        h,
        "content-security-policy",
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    );
    set(h, "x-content-type-options", "nosniff");
    set(h, "x-frame-options", "DENY");
    set(h, "referrer-policy", "no-referrer");
    set(h, "cache-control", "no-store");
    set(h, "cross-origin-opener-policy", "same-origin");
    set(h, "cross-origin-resource-policy", "same-origin");
}

/// An error answer: `{"error": why}` with `status`.
pub(crate) fn refuse(status: StatusCode, why: &str) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({ "error": why }))).into_response();
    harden(r.headers_mut());
    r
}

/// Compares two secrets in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `bytes` random bytes from the kernel, as hex. Without randomness there is no secret worth
/// the name, and the console does not start.
fn random_hex(bytes: usize) -> Result<String, String> {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < bytes {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(format!(
                    "no randomness from the kernel for the console's token: {e}"
                ));
            }
        }
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

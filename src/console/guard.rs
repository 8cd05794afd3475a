//! Who may use the console, checked on every request before any handler runs.
//!
//! Every page the person opens can reach a loopback port, and every other local program can
//! listen on one, so:
//! - `Host` must name the address the console is bound to (`127.0.0.1:PORT`, `[::1]:PORT` or
//!   `localhost:PORT`): a rebound DNS name pointing at 127.0.0.1 is refused.
//! - Scripts authenticate with the run's token (`Authorization: Bearer TOKEN`, from the URL
//!   file's second line). It is never put in a URL or a cookie.
//! - The page is opened with a one-time ticket (`/?ticket=…`, the URL file's first line, and
//!   nowhere else: stderr gets the bare address): using it spends it (the next is written to
//!   the URL file), so a URL left in the browser's history or the opener page opens nothing
//!   later. The answer is the page itself, with a new page session's key in a `<meta>`
//!   element: the key travels only in that answer, to the browser that spent the ticket, and
//!   never in a URL (a URL reaches the browser's history, even one replaced at once). The page
//!   moves it to `sessionStorage` (this origin's, so this port's alone) and takes the ticket
//!   out of the address bar. Every API request of the page carries the key as
//!   `X-CSRF-Token` (or, for the event stream, which cannot send headers, `?csrf=`).
//! - No cookie. Cookies are not kept apart by port: every program on a loopback port the
//!   browser visits receives the cookies of `127.0.0.1`, and can set, overwrite or crowd out
//!   cookies of any name there. Three hostile reviews broke designs that let a cookie count
//!   for something (a key claimed with it; a session locked out by a planted or overwritten
//!   one). The key, which only the page holds, is the whole credential.
//! - A state change (`POST`) with an `Origin` must come from the console's own origin; one
//!   from the page must carry it, and a `Sec-Fetch-Site` other than `same-origin` is refused.
//!   A browser never sends `Authorization` or `X-CSRF-Token` cross-origin without a CORS
//!   preflight, which the console does not answer.
//! - Every answer carries a CSP with no inline script and no framing, `nosniff`, and no
//!   CORS header at all.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Shared;

/// How many page sessions are kept: each open of the URL makes one, and the oldest go first.
const PAGES: usize = 16;

/// The run's secrets and the names it answers to.
pub(crate) struct Guard {
    token: String,
    /// The ticket that opens the page now; spent when used.
    ticket: Mutex<String>,
    /// The keys of the page sessions, oldest first.
    pages: Mutex<Vec<String>>,
    /// `Host` values accepted (the bound address, and `localhost` with its port).
    hosts: Vec<String>,
}

/// How a request proved who it is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Credential {
    /// A script with the run's token.
    Bearer,
    /// The console's page: its key.
    Page,
}

impl Guard {
    /// New secrets (256 bits each) for a console bound to `bound`.
    pub(crate) fn new(bound: SocketAddr) -> Result<Guard, String> {
        let port = bound.port();
        Ok(Guard {
            token: random_hex(32)?,
            ticket: Mutex::new(random_hex(32)?),
            pages: Mutex::default(),
            hosts: vec![bound.to_string(), format!("localhost:{port}")],
        })
    }

    /// The run's token, for scripts.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The URL that opens the page now (with its one-time ticket).
    pub(crate) fn url(&self) -> String {
        let ticket = self.ticket.lock().unwrap_or_else(|e| e.into_inner());
        format!("http://{}/?ticket={ticket}", self.hosts[0])
    }

    /// The console's address, with no secret in it (for stderr and logs).
    pub(crate) fn address(&self) -> String {
        format!("http://{}/", self.hosts[0])
    }

    /// Spends `offered` if it is the ticket: a new ticket takes its place, and a new page
    /// session is made. Returns its key.
    pub(crate) fn redeem(&self, offered: &str) -> Result<String, String> {
        let next = random_hex(32)?;
        {
            let mut ticket = self.ticket.lock().unwrap_or_else(|e| e.into_inner());
            if !same(offered, &ticket) {
                return Err("this address has been used already, or is not this console's: open the console with `fsbroker console`".into());
            }
            *ticket = next;
        }
        let key = random_hex(32)?;
        let mut pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        if pages.len() >= PAGES {
            pages.remove(0);
        }
        pages.push(key.clone());
        Ok(key)
    }

    /// How the request proves it may use the API, if it does. `query_key` is the page's key
    /// as the event stream's URL carries it.
    fn credential(&self, headers: &HeaderMap, query_key: Option<&str>) -> Option<Credential> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if let Some(offered) = bearer {
            return same(offered.trim(), &self.token).then_some(Credential::Bearer);
        }
        let key = headers
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .or(query_key)?;
        let pages = self.pages.lock().unwrap_or_else(|e| e.into_inner());
        pages
            .iter()
            .any(|p| same(key, p))
            .then_some(Credential::Page)
    }

    /// Whether `origin` is the console's own.
    fn own_origin(&self, origin: &str) -> bool {
        origin
            .strip_prefix("http://")
            .is_some_and(|h| self.hosts.iter().any(|ok| ok == h))
    }
}

/// The check every request goes through (an axum middleware).
pub(crate) async fn check(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let guard = &shared.guard;
    let headers = request.headers();
    // One `Host`, the console's own; and a target in absolute form (which HTTP/1.1 says
    // wins over `Host`) names it too. A second `Host` could be the one something between
    // the browser and here reads.
    let own = |h: &str| guard.hosts.iter().any(|ok| ok == h);
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => h.to_str().ok(),
        _ => None,
    };
    let target = request.uri().authority().is_none_or(|a| own(a.as_str()));
    if !host.is_some_and(own) || !target {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "this console answers only to its own address (Host)",
        );
    }
    let path = request.uri().path();
    // The page and its assets hold nothing; everything under /api/ needs a credential.
    if path.starts_with("/api/") {
        let query_key = (path == "/api/events")
            .then(|| request.uri().query())
            .flatten()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("csrf=")));
        let Some(credential) = guard.credential(headers, query_key) else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "the console's token, or this page's session, is missing or wrong: open the console with `fsbroker console`",
            );
        };
        // The connection holds a credential: it keeps its place when the console is full
        // (listener.rs).
        if let Some(proven) = request.extensions().get::<super::listener::Proven>() {
            proven.set();
        }
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
    match origin {
        Some(o) if !guard.own_origin(o) => {
            return Err("a request from another origin may not act here");
        }
        None if credential == Credential::Page => {
            return Err("a state change from the page must carry its Origin");
        }
        _ => {}
    }
    // Browsers that say where a request comes from: only the console's own page may act.
    let site = headers.get("sec-fetch-site").and_then(|s| s.to_str().ok());
    if site.is_some_and(|s| s != "same-origin" && s != "none") {
        return Err("a request from another site may not act here");
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
pub(crate) fn random_hex(bytes: usize) -> Result<String, String> {
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

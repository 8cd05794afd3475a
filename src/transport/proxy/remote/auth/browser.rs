//! The person's side of a sign-in: the authorization URL opened with the desktop's opener
//! (`$BROWSER`, else `xdg-open`), and the loopback listener the code comes back to
//! (RFC 8252 §7.3), which takes one code, for this sign-in's `state` only.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::oneshot;

use super::SignInError;
use super::discover::shown;

/// Opens `url` in the person's browser: each command of `$BROWSER` (`:`-separated, the URL
/// in place of `%s` or after its words) until one starts, else `xdg-open` on a desktop.
/// Returns what opened it; an error when nothing could.
pub(super) fn open(url: &str) -> Result<String, String> {
    let mut tried = Vec::new();
    if let Some(browser) = std::env::var_os("BROWSER") {
        let browser = browser.to_string_lossy().into_owned();
        for command in browser.split(':').filter(|c| !c.trim().is_empty()) {
            let mut words: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
            if words.iter().any(|w| w.contains("%s")) {
                for w in &mut words {
                    *w = w.replace("%s", url);
                }
            } else {
                words.push(url.to_owned());
            }
            match spawn(&words) {
                Ok(()) => return Ok(format!("$BROWSER ({})", words[0])),
                Err(e) => tried.push(format!("$BROWSER {}: {e}", words[0])),
            }
        }
    }
    let set = |var| std::env::var_os(var).is_some_and(|v| !v.is_empty());
    let desktop = set("DISPLAY") || set("WAYLAND_DISPLAY");
    if desktop {
        match spawn(&["xdg-open".to_owned(), url.to_owned()]) {
            Ok(()) => return Ok("xdg-open".to_owned()),
            Err(e) => tried.push(format!("xdg-open: {e}")),
        }
    } else {
        tried.push("no $BROWSER, and no desktop for xdg-open".to_owned());
    }
    Err(tried.join("; "))
}

/// Starts `words` with nothing of the proxy's stdio (stdout is the host's protocol), and
/// reaps it whenever it ends.
fn spawn(words: &[String]) -> std::io::Result<()> {
    let mut child = tokio::process::Command::new(&words[0])
        .args(&words[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(())
}

/// The loopback listener a sign-in's code comes back to.
pub(super) struct Callback {
    /// `http://127.0.0.1:PORT/callback`.
    pub(super) redirect: String,
    listener: tokio::net::TcpListener,
}

/// What the listener got for the sign-in's `state`: the code, and the `iss` the
/// authorization server added (RFC 9207), if it did.
type Outcome = Result<(String, Option<String>), SignInError>;

/// Connections the listener serves at once: a local process that opens many and holds them
/// must not take the proxy's descriptors (the one that matters, the person's, comes once).
const CALLBACK_CONNECTIONS: usize = 32;

/// How long one connection to the listener may take, its request and the answer.
const CALLBACK_CONNECTION: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a connection may take to send its request's head: a browser sends it at once.
const CALLBACK_HEAD: std::time::Duration = std::time::Duration::from_secs(2);

/// One connection the listener serves.
struct Served {
    task: tokio::task::AbortHandle,
    /// Whether its request's head has arrived.
    asked: Arc<AtomicBool>,
}

/// Makes room for a new connection when [`CALLBACK_CONNECTIONS`] are served: the oldest that
/// has sent no request yet is closed. A local process holding idle connections open (and
/// opening new ones as they close) then loses its own, not the person's redirect, which
/// sends its request as soon as it connects. False when every one has sent its request.
fn make_room(served: &mut VecDeque<Served>) -> bool {
    served.retain(|c| !c.task.is_finished());
    if served.len() < CALLBACK_CONNECTIONS {
        return true;
    }
    match served.iter().position(|c| !c.asked.load(Ordering::Acquire)) {
        Some(i) => {
            if let Some(idle) = served.remove(i) {
                idle.task.abort();
            }
            true
        }
        None => false,
    }
}

impl Callback {
    /// Listens on `127.0.0.1`, on `port` or one the system picks.
    pub(super) async fn bind(port: Option<u16>) -> Result<Callback, SignInError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.unwrap_or(0)))
            .await
            .map_err(|e| SignInError::Callback {
                reason: format!(
                    "cannot listen on 127.0.0.1:{} for the sign-in's redirect: {e}",
                    port.unwrap_or(0)
                ),
            })?;
        let port = listener
            .local_addr()
            .map_err(|e| SignInError::Callback {
                reason: e.to_string(),
            })?
            .port();
        Ok(Callback {
            redirect: format!("http://127.0.0.1:{port}/callback"),
            listener,
        })
    }

    /// Serves the redirect until one request carries `state`: its code (or the authorization
    /// server's refusal) is the outcome. A request with another `state`, or none, is told so
    /// and changes nothing; once the outcome is taken, every later request is told the
    /// sign-in already has its answer (a second code is never used). The listener goes on
    /// answering so until `serving` is dropped.
    pub(super) fn serve(self, state: String) -> (oneshot::Receiver<Outcome>, Serving) {
        let (tx, rx) = oneshot::channel();
        let slot = Arc::new(Mutex::new(Some(tx)));
        let state = Arc::new(state);
        let task = tokio::spawn(async move {
            let mut served = VecDeque::with_capacity(CALLBACK_CONNECTIONS);
            loop {
                let stream = match self.listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin on the error.
                        tracing::debug!(error = %e, "the sign-in listener could not accept");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if !make_room(&mut served) {
                    tracing::warn!(
                        "the sign-in listener has {CALLBACK_CONNECTIONS} requests under way: a new connection is closed"
                    );
                    continue;
                }
                let asked = Arc::new(AtomicBool::new(false));
                let slot = Arc::clone(&slot);
                let state = Arc::clone(&state);
                let flag = Arc::clone(&asked);
                let connection = tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        flag.store(true, Ordering::Release);
                        let answer = answer(&request, &state, &slot);
                        async move { Ok::<_, Infallible>(answer) }
                    });
                    let _ = tokio::time::timeout(
                        CALLBACK_CONNECTION,
                        hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(CALLBACK_HEAD)
                            .keep_alive(false)
                            .serve_connection(TokioIo::new(stream), service),
                    )
                    .await;
                });
                served.push_back(Served {
                    task: connection.abort_handle(),
                    asked,
                });
            }
        });
        (rx, Serving(task))
    }
}

/// The listener's task, ended when dropped.
pub(super) struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The answer to one request to the listener, taking the outcome when it is the sign-in's.
fn answer(
    request: &Request<Incoming>,
    state: &str,
    slot: &Mutex<Option<oneshot::Sender<Outcome>>>,
) -> Response<Full<Bytes>> {
    if request.uri().path() != "/callback" {
        return page(
            StatusCode::NOT_FOUND,
            "Not found",
            "This is fsbroker's sign-in listener.",
        );
    }
    let mut code = None;
    let mut given_state = None;
    let mut error = None;
    let mut description = None;
    let mut iss = None;
    for (name, value) in url::form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
    {
        match name.as_ref() {
            "code" => code = Some(value.into_owned()),
            "state" => given_state = Some(value.into_owned()),
            "error" => error = Some(value.into_owned()),
            "error_description" => description = Some(value.into_owned()),
            "iss" => iss = Some(value.into_owned()),
            _ => {}
        }
    }
    // Compared in constant time: the state is what keeps another page's code out.
    let ours = given_state.is_some_and(|s| constant_eq(s.as_bytes(), state.as_bytes()));
    if !ours {
        tracing::warn!(
            "the sign-in listener was sent a request that is not this sign-in's (no state, or another): ignored"
        );
        return page(
            StatusCode::BAD_REQUEST,
            "Not this sign-in",
            "This link is not the sign-in fsbroker is waiting for. Nothing was changed.",
        );
    }
    let Some(tx) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        tracing::warn!("the sign-in listener was sent a second answer for its state: refused");
        return page(
            StatusCode::BAD_REQUEST,
            "Already answered",
            "This sign-in already received its answer; a second one is not used.",
        );
    };
    match (code, error) {
        (Some(code), None) => {
            let _ = tx.send(Ok((code, iss)));
            page(
                StatusCode::OK,
                "Signed in",
                "fsbroker received the sign-in. You can close this tab.",
            )
        }
        (_, error) => {
            let reason = match (error, description) {
                (Some(e), Some(d)) => format!("{}: {}", shown(&e), shown(&d)),
                (Some(e), None) => shown(&e),
                (None, _) => "the redirect carried no code".to_owned(),
            };
            let _ = tx.send(Err(SignInError::Refused { reason }));
            page(
                StatusCode::BAD_REQUEST,
                "Sign-in refused",
                "The authorization server did not sign you in. fsbroker's log says why.",
            )
        }
    }
}

/// A small page of fsbroker's own words (nothing the request carried is put in it).
fn page(status: StatusCode, title: &str, text: &str) -> Response<Full<Bytes>> {
    let html = format!(
        "<!doctype html><meta charset=utf-8><meta name=viewport content=\"width=device-width\"><title>{title}</title><h1>{title}</h1><p>{text}</p>\n"
    );
    let mut response = Response::new(Full::new(Bytes::from(html)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page holds nothing to frame, cache or refer on: the URL that reached it has the code.
    headers.insert(
        http::header::REFERRER_POLICY,
        http::HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-store"),
    );
    headers.insert(
        http::header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    );
    response
}

/// Whether `a` and `b` are equal, in a time that does not depend on where they differ.
fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

//! The person's console: a local web page, and the small JSON API it is built on, where the
//! person whose files these are answers consent prompts, sees what every server does, and
//! takes access back (docs/protocol.md, "The console").
//!
//! - `guard.rs`: who may use it: scripts with the run's token (`Authorization: Bearer`), the
//!   page with a key handed to it once, in the answer that spends its one-time ticket; `Host`
//!   (DNS rebinding), `Origin` on every state change, and the headers every answer carries.
//!   `listener.rs` bounds the connections, keeping room for those that proved themselves.
//! - `api.rs`: `GET /api/state` and the person's acts (`POST`), on the broker's public API.
//! - `feed.rs`: `GET /api/events`, Server-Sent Events: state changes and the activity feed,
//!   bulk transfers merged.
//! - `open.rs`: opening the page in the person's browser (`fsbroker console`).
//! - `assets/`: the page (HTML, CSS, JavaScript), embedded: it works offline, from no CDN.
//!
//! It serves loopback only, and it can only narrow access: every act it offers is one of
//! [`Broker::answer_prompt`], [`Broker::revoke_grant`], [`Broker::end_session`],
//! [`Broker::pause_root`] and [`Broker::resume_root`].

mod api;
mod feed;
mod guard;
mod listener;
mod notify;
mod open;

pub(crate) use open::{has_display, open_in_browser, read_url_file};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use fsbroker::Broker;

/// A running console.
pub(crate) struct Console {
    /// The console's address, without its ticket: the ticket is in the URL file only.
    pub(crate) address: String,
    /// The run's token, which the URL file also holds (to know it at exit).
    token: String,
    /// Counts the console as a consent provider while it runs.
    _open: fsbroker::ConsoleOpen,
    /// The URL file written, removed when the console goes.
    url_file: Option<PathBuf>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Console {
    fn drop(&mut self) {
        self.server.abort();
        if let Some(path) = &self.url_file {
            remove_url_file(path, &self.token);
        }
    }
}

/// Shared by every handler.
pub(crate) struct Shared {
    pub(crate) broker: Arc<Broker>,
    pub(crate) guard: guard::Guard,
    pub(crate) audit: api::AuditCheck,
    /// The sessions' numbers in the order they connected ("server 3").
    pub(crate) order: api::Order,
    /// Whether the paths of waiting prompts are folders.
    pub(crate) kinds: api::Kinds,
    /// When the console started (the broker, within a moment).
    pub(crate) started: String,
    /// Where the URL is kept for the person (rewritten when its ticket is spent).
    url_file: Option<PathBuf>,
    /// The proxy's sign-ins to its remote server (none for `serve`).
    pub(crate) sign_ins: fsbroker::transport::proxy::SignIns,
}

/// Starts the console for `broker` on `addr` (loopback only), on the current tokio runtime;
/// writes its URL to `url_file` (owner-only) when given.
pub(crate) fn start(
    broker: &Arc<Broker>,
    addr: SocketAddr,
    url_file: Option<&Path>,
    sign_ins: &fsbroker::transport::proxy::SignIns,
) -> Result<Console, String> {
    if !addr.ip().is_loopback() {
        return Err(format!(
            "--console {addr}: only loopback addresses (127.0.0.1, ::1) are accepted"
        ));
    }
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| format!("cannot serve the console on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("console socket: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("console socket: {e}"))?;
    let guard = guard::Guard::new(bound)?;
    let url = guard.url();
    let address = guard.address();
    let shared = Arc::new(Shared {
        broker: Arc::clone(broker),
        guard,
        audit: api::AuditCheck::start(broker),
        order: api::Order::default(),
        kinds: api::Kinds::default(),
        started: fsbroker::audit::timestamp(std::time::SystemTime::now()),
        url_file: url_file.map(Path::to_path_buf),
        sign_ins: sign_ins.clone(),
    });
    sign_ins.shown_on_console();
    let app = Router::new()
        .route("/", get(page))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/api/state", get(api::state))
        .route("/api/events", get(feed::events))
        .route("/api/prompts/{id}", post(api::answer))
        .route("/api/grants/{id}/revoke", post(api::revoke))
        .route("/api/sessions/{id}/end", post(api::end))
        .route("/api/roots/{name}/{act}", post(api::root))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            guard::check,
        ))
        .with_state(Arc::clone(&shared));
    // A longer queue than the standard library's 128, so a burst of connections from another
    // program leaves room for the page's (Linux takes a second listen() as the new length).
    if let Err(e) = rustix::net::listen(&listener, BACKLOG) {
        tracing::debug!(error = %e, "console: the listen backlog stays at its default");
    }
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| format!("console socket: {e}"))?;
    let server = tokio::spawn(serve(listener, app));
    if let Some(path) = url_file {
        write_url_file(path, &url, shared.guard.token())?;
        notify::spawn(broker, path.to_path_buf());
    }
    Ok(Console {
        address,
        token: shared.guard.token().to_owned(),
        _open: broker.open_console(),
        url_file: url_file.map(Path::to_path_buf),
        server,
    })
}

/// How long a connection may stay open without proving itself (a request carrying the token
/// or a page's key): past it, it is closed, whatever it is doing (sending nothing, or a head a
/// byte at a time). A proven connection is kept as long as its client keeps it: the page's
/// next requests reuse it rather than needing a new connection, which a flood of connections
/// from another program could crowd out.
const UNPROVEN_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The listen backlog: connections the kernel keeps waiting while the console accepts.
const BACKLOG: i32 = 1024;

/// The most a request's head may take in memory. A browser sends every cookie of
/// `127.0.0.1` to every port, and any page served there can set up to some 180 cookies of
/// 4 KiB: a head over hyper's default (about 400 KiB) would be refused (`431`), and the person
/// shut out until they clear their cookies. This takes the largest cookie jar browsers allow.
const MAX_HEAD: usize = 1 << 20;

/// Serves the console's connections (HTTP/1.1), each on a task of its own, as many at once
/// as [`listener::Conns`] allows.
async fn serve(listener: tokio::net::TcpListener, app: Router) {
    let conns = listener::Conns::default();
    loop {
        let io = match listener.accept().await {
            Ok((io, _)) => io,
            Err(e) => {
                tracing::debug!(error = %e, "console: accept failed");
                // Out of descriptors, say: give the broker a moment before trying again.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if !conns.make_room() {
            continue; // every slot is a proven connection's: this one is closed
        }
        let proven = listener::Proven::default();
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone().layer(axum::Extension(proven.clone())),
        );
        let task = tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            // No head timeout of hyper's: it would close a proven connection left idle too;
            // the watch below closes unproven ones instead.
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(None)
                .max_buf_size(MAX_HEAD);
            let served = http
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "console: a connection ended");
            }
        });
        let (watched, ending) = (proven.clone(), task.abort_handle());
        tokio::spawn(async move {
            tokio::time::sleep(UNPROVEN_FOR).await;
            if !watched.get() {
                ending.abort();
            }
        });
        conns.add(proven, task.abort_handle());
    }
}

/// The page. Opened with its one-time ticket, it spends the ticket (the URL file gets the
/// next) and is the page itself with a new page session's key in a `<meta>` element; the
/// page keeps the key in `sessionStorage` and takes the ticket out of the address bar. The
/// key is never in a URL: browsers keep every URL they were sent to in their history.
async fn page(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    proven: Option<axum::Extension<listener::Proven>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    if let Some(ticket) = q.get("ticket") {
        let key = match shared.guard.redeem(ticket) {
            Ok(key) => key,
            Err(why) => return guard::refuse(axum::http::StatusCode::UNAUTHORIZED, &why),
        };
        // The ticket was a credential: the connection keeps its place while the page goes
        // out on it (a flood of other connections must not cut it off, the ticket spent).
        if let Some(axum::Extension(proven)) = proven {
            proven.set();
        }
        if let Some(path) = &shared.url_file {
            let (path, url, token) = (
                path.clone(),
                shared.guard.url(),
                shared.guard.token().to_owned(),
            );
            let written =
                tokio::task::spawn_blocking(move || write_url_file(&path, &url, &token)).await;
            if let Ok(Err(e)) = written {
                tracing::warn!(error = %e, "cannot write the console's next URL");
            }
        }
        // The key is hex: nothing in it needs escaping.
        let page = include_str!("assets/index.html").replacen(
            "<head>",
            &format!("<head>\n<meta name=\"fsbroker-key\" content=\"{key}\">"),
            1,
        );
        return (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            page,
        )
            .into_response();
    }
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("assets/index.html"),
    )
        .into_response()
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/console.js"),
    )
}

async fn style() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
}

async fn not_found() -> axum::response::Response {
    guard::refuse(axum::http::StatusCode::NOT_FOUND, "no such page")
}

/// Writes `url` and the run's `token` (`token=TOKEN`, for scripts) to `path`, readable and
/// writable by its owner only ([`open::write_owner_only`]).
fn write_url_file(path: &Path, url: &str, token: &str) -> Result<(), String> {
    open::write_owner_only(path, format!("{url}\ntoken={token}\n").as_bytes())
        .map_err(|e| format!("cannot write the console URL to {}: {e}", path.display()))
}

/// Removes the URL file at exit if it is still this console's (another console may have
/// written its own there since): its token line tells.
#[allow(clippy::disallowed_methods)] // the URL file is the broker's own file
fn remove_url_file(path: &Path, token: &str) {
    let mine = format!("token={token}");
    if std::fs::read_to_string(path).is_ok_and(|s| s.lines().any(|l| l == mine)) {
        let _ = std::fs::remove_file(path);
    }
}

//! The person's console: a local web page, and the small JSON API it is built on, where the
//! person whose files these are answers consent prompts, sees what every server does, and
//! takes access back (docs/protocol.md, "The console").
//!
//! - `guard.rs`: who may use it: scripts with the run's token (`Authorization: Bearer`), the
//!   page with a one-time ticket spent for an HttpOnly SameSite=Strict cookie plus a key
//!   handed to the page in its address's fragment; `Host` (DNS rebinding), `Origin` on every state change, and the
//!   headers every answer carries. `listener.rs` bounds the connections.
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
    /// When the console started (the broker, within a moment).
    pub(crate) started: String,
    /// Where the URL is kept for the person (rewritten when its ticket is spent).
    url_file: Option<PathBuf>,
}

/// Starts the console for `broker` on `addr` (loopback only), on the current tokio runtime;
/// writes its URL to `url_file` (owner-only) when given.
pub(crate) fn start(
    broker: &Arc<Broker>,
    addr: SocketAddr,
    url_file: Option<&Path>,
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
        started: fsbroker::audit::timestamp(std::time::SystemTime::now()),
        url_file: url_file.map(Path::to_path_buf),
    });
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
    let listener = listener::Capped::new(
        tokio::net::TcpListener::from_std(listener).map_err(|e| format!("console socket: {e}"))?,
    );
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

/// How long a connection may take to send a request's head, counted from when the console
/// starts waiting for one (on a new connection, or an idle kept-alive one): past it the
/// connection is closed, so connections that send nothing cannot hold the console's
/// [`listener::CONNECTIONS`] slots for good. A page sends its requests' heads at once; its
/// event stream, once asked for, is not reading a head and is not cut.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the console's connections (HTTP/1.1), each on a task of its own.
async fn serve(mut listener: listener::Capped, app: Router) {
    use axum::serve::Listener;
    loop {
        let (io, _) = listener.accept().await;
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT);
            let served = http
                .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "console: a connection ended");
            }
        });
    }
}

/// The page. Opened with its one-time ticket, it spends the ticket (the URL file gets the
/// next), gives the browser the cookie of a new page session, and sends it to the page with
/// the session's key in the fragment (`/#key=KEY`), which no browser sends to a server; the
/// page keeps the key and takes it out of the address bar.
async fn page(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> axum::response::Response {
    if let Some(ticket) = q.get("ticket") {
        let (cookie, key) = match shared.guard.redeem(ticket) {
            Ok(page) => page,
            Err(why) => return guard::refuse(axum::http::StatusCode::UNAUTHORIZED, &why),
        };
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
        return (
            axum::http::StatusCode::SEE_OTHER,
            [
                (header::LOCATION, format!("/#key={key}")),
                (header::SET_COOKIE, cookie),
                (header::CACHE_CONTROL, "no-store".to_owned()),
            ],
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
/// writable by its owner only, through a new file renamed into place: a reader sees all of
/// it or none, and a file someone else made there (a link, another owner's) is replaced,
/// never written through.
#[allow(clippy::disallowed_methods)] // the URL file is the broker's own file
fn write_url_file(path: &Path, url: &str, token: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail =
        |e: std::io::Error| format!("cannot write the console URL to {}: {e}", path.display());
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| format!("--console-url-file {}: names no file", path.display()))?;
    // A random name, and another on a clash: a name others can guess could be taken first
    // (in a directory they may write to), and every rewrite would then fail, leaving a spent
    // ticket in the file.
    let mut attempt = 0;
    let (tmp, mut file) = loop {
        let suffix = guard::random_hex(8)?;
        let tmp = dir.join(format!(".{}.{suffix}.tmp", name.to_string_lossy()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)
        {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 8 => {
                attempt += 1;
            }
            Err(e) => return Err(fail(e)),
        }
    };
    let written = file
        .write_all(format!("{url}\ntoken={token}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
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

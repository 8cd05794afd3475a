//! An MCP host built with [rmcp] whose file access goes through fsbroker.
//!
//! rmcp's [`ClientHandler`] is the part of an rmcp client that answers the *server's*
//! requests. Two of its methods are all a host needs to give a server brokered file access:
//!
//! - [`ClientHandler::list_roots`] answers `roots/list`;
//! - [`ClientHandler::on_custom_request`] receives every request rmcp has no type for, which
//!   includes all of `files/*` (`files/read`, `files/write`, `files/list`, ...).
//!
//! Both delegate to a fsbroker [`Session`]: the request is wrapped in a JSON-RPC line,
//! [`Session::handle`] answers it, and the answer's `result` (or `error`) is handed back to
//! rmcp. Notifications the broker sends (`notifications/roots/list_changed` when the policy
//! changes, `notifications/files/changed` for watches) are forwarded to the server through
//! rmcp's [`Peer`].
//!
//! The demo spawns the MCP server given on the command line over stdio, initializes, lists
//! its tools and calls some of them (by default `list_allowed_directories`, which
//! `@modelcontextprotocol/server-filesystem` answers by asking the client for its roots):
//!
//! ```sh
//! cargo run --example rmcp_host -- --root . -- npx -y @modelcontextprotocol/server-filesystem
//! cargo run --example rmcp_host -- --root ~/notes --call report -- python3 my_server.py
//! ```
//!
//! `tests/rmcp_example.rs` runs [`run_demo`] against a small Python server that asks for
//! `roots/list` and `files/read` and reports what it got.
//!
//! Note for servers: when the negotiated protocol is 2026-07-28 or later, rmcp refuses a
//! `roots/list` that is not tied to a request of the client's in flight (SEP-2260, `-32602`);
//! such a server asks while it handles a tool call. `files/*` requests are not restricted.
//!
//! [rmcp]: https://docs.rs/rmcp

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]
// rmcp 3.9 marks roots deprecated (SEP-2577, which moves them out of the core protocol); they
// are still how servers ask a client for its directories, and what this example is about.
#![allow(deprecated)]

use std::error::Error;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fsbroker::policy::{Overrides, Policy};
use fsbroker::{Broker, Notifications, Session};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ClientNotification,
    CustomNotification, CustomRequest, CustomResult, ErrorCode, Implementation, ListRootsResult,
    RootsCapabilities,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData as McpError, Peer, RoleClient, ServiceExt};
use serde_json::{Value, json};

/// What the demo errors are.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// An rmcp client handler whose file access is a fsbroker session.
pub struct BrokeredClient {
    session: Arc<Session>,
    /// Ids for the JSON-RPC lines handed to the session (they only need to be unique among
    /// this session's requests in flight).
    next_id: AtomicU64,
    /// Signalled when the server has asked for its roots (the demo waits for it).
    roots_asked: tokio::sync::Notify,
}

impl BrokeredClient {
    /// A handler answering from `session` (one session per connected server).
    pub fn new(session: Arc<Session>) -> Self {
        BrokeredClient {
            session,
            next_id: AtomicU64::new(1),
            roots_asked: tokio::sync::Notify::new(),
        }
    }

    /// Sends `method(params)` to the broker as one JSON-RPC line; returns the `result`, or the
    /// broker's error as an rmcp error (same code, message and `data`, so a server sees
    /// `data.code` such as `FILE_NOT_FOUND` exactly as the broker wrote it).
    async fn delegate(&self, method: &str, params: Option<Value>) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(params) = params {
            request["params"] = params;
        }
        let line = serde_json::to_vec(&request)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let Some(frame) = self.session.handle(&line).await else {
            return Err(McpError::internal_error(
                "the broker gave no response",
                None,
            ));
        };
        let mut response: Value = serde_json::from_slice(&frame)
            .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        if let Some(error) = response.get_mut("error") {
            let code = error["code"].as_i64().unwrap_or(-32603);
            let message = error["message"].as_str().unwrap_or("error").to_owned();
            return Err(McpError::new(
                ErrorCode(i32::try_from(code).unwrap_or(-32603)),
                message,
                error.get_mut("data").map(Value::take),
            ));
        }
        Ok(response
            .get_mut("result")
            .map(Value::take)
            .unwrap_or(Value::Null))
    }
}

impl ClientHandler for BrokeredClient {
    /// The client's `initialize`: it has roots and tells the server when they change.
    /// (rmcp's `RootsCapabilities` has no room for the draft's `filesystemBrokering` flag; a
    /// server that needs it can still simply try `files/*`.)
    fn get_info(&self) -> ClientConfig {
        let mut roots = RootsCapabilities::default();
        roots.list_changed = Some(true);
        let mut capabilities = ClientCapabilities::default();
        capabilities.roots = Some(roots);
        ClientConfig::new(
            capabilities,
            Implementation::new("fsbroker-rmcp-host", env!("CARGO_PKG_VERSION")),
        )
    }

    /// `roots/list`: the broker's roots.
    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, McpError> {
        let result = self.delegate("roots/list", None).await;
        self.roots_asked.notify_one();
        let result = result?;
        serde_json::from_value(result).map_err(|e| McpError::internal_error(e.to_string(), None))
    }

    /// `files/*`: answered by the broker. Anything else is not ours.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<CustomResult, McpError> {
        if !request.method.starts_with("files/") {
            return Err(McpError::new(
                ErrorCode::METHOD_NOT_FOUND,
                request.method,
                None,
            ));
        }
        self.delegate(&request.method, request.params)
            .await
            .map(CustomResult)
    }
}

/// Forwards the broker's notifications for this session to the server.
async fn forward_notifications(mut notes: Notifications, peer: Peer<RoleClient>) {
    while let Some(frame) = notes.recv().await {
        let Ok(mut note) = serde_json::from_slice::<Value>(&frame) else {
            continue;
        };
        let method = note["method"].as_str().unwrap_or_default().to_owned();
        let sent = if method == "notifications/roots/list_changed" {
            peer.notify_roots_list_changed().await
        } else {
            let params = note.get_mut("params").map(Value::take);
            peer.send_notification(ClientNotification::CustomNotification(
                CustomNotification::new(method, params),
            ))
            .await
        };
        if sent.is_err() {
            break;
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct DemoOptions {
    /// Roots to serve (read-only, consent "auto"); the current directory when empty.
    pub roots: Vec<PathBuf>,
    /// Tools to call (without arguments); when empty, `list_allowed_directories` if the
    /// server has it.
    pub calls: Vec<String>,
    /// The server's command line.
    pub server: Vec<OsString>,
}

/// What happened.
#[derive(Debug)]
pub struct DemoReport {
    /// `serverInfo.name` from the `initialize` result.
    pub server_name: String,
    /// The server's tools, by name.
    pub tools: Vec<String>,
    /// Each tool called and its result (as JSON).
    pub calls: Vec<(String, Value)>,
}

/// Runs the demo: broker, server, `initialize`, `tools/list`, tool calls, shutdown.
pub async fn run_demo(opts: DemoOptions) -> Result<DemoReport, BoxError> {
    // The broker: a policy from the roots, one session for the one server.
    let roots = if opts.roots.is_empty() {
        vec![std::env::current_dir()?]
    } else {
        opts.roots.clone()
    };
    let policy = Policy::load(
        None,
        &Overrides {
            roots,
            ..Default::default()
        },
    )?;
    let broker = Broker::new(policy)?;
    let session = Arc::new(broker.session());
    let notes = session.take_notifications();

    // The server, over stdio (its stderr stays ours, so its logs show).
    let (program, args) = opts.server.split_first().ok_or("no server command given")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let stdin = child.stdin.take().ok_or("no stdin")?;
    let stdout = child.stdout.take().ok_or("no stdout")?;

    // `serve` performs the MCP handshake; from here on the server may call list_roots and
    // on_custom_request at any time.
    let client: RunningService<RoleClient, BrokeredClient> =
        BrokeredClient::new(Arc::clone(&session))
            .serve((stdout, stdin))
            .await?;
    let server_name = client
        .peer_info()
        .and_then(|info| info.server_info.as_ref().map(|s| s.name.clone()))
        .unwrap_or_default();
    session.set_peer_name(server_name.clone());
    let forwarder = notes.map(|n| tokio::spawn(forward_notifications(n, client.peer().clone())));

    let tools: Vec<String> = client
        .list_all_tools()
        .await?
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    let wanted = if opts.calls.is_empty() {
        vec!["list_allowed_directories".to_owned()]
    } else {
        opts.calls.clone()
    };
    // Servers that use roots usually ask for them right after the handshake, without
    // blocking their other work: a tool called too early may still see no directories. Give
    // the first roots/list a moment to arrive and be applied.
    let asked = client.service().roots_asked.notified();
    if tokio::time::timeout(Duration::from_secs(2), asked)
        .await
        .is_ok()
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut calls = Vec::new();
    for name in wanted.into_iter().filter(|n| tools.contains(n)) {
        let result = client
            .call_tool(CallToolRequestParams::new(name.clone()))
            .await?;
        calls.push((name, serde_json::to_value(result)?));
    }

    // Shut down: closing the transport closes the server's stdin.
    if let Some(f) = forwarder {
        f.abort();
    }
    client.cancel().await?;
    if tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .is_err()
    {
        child.kill().await?;
    }
    Ok(DemoReport {
        server_name,
        tools,
        calls,
    })
}

/// `rmcp_host [--root DIR]... [--call TOOL]... -- SERVER [ARGS...]`
fn parse_args() -> Result<DemoOptions, BoxError> {
    let mut opts = DemoOptions::default();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--root") => opts
                .roots
                .push(args.next().ok_or("--root needs a DIR")?.into()),
            Some("--call") => opts.calls.push(
                args.next()
                    .and_then(|a| a.into_string().ok())
                    .ok_or("--call needs a TOOL")?,
            ),
            Some("--") => {
                opts.server = args.collect();
                break;
            }
            _ => return Err(format!("unexpected argument {arg:?}").into()),
        }
    }
    if opts.server.is_empty() {
        return Err("usage: rmcp_host [--root DIR]... [--call TOOL]... -- SERVER [ARGS...]".into());
    }
    Ok(opts)
}

fn main() -> Result<(), BoxError> {
    let opts = parse_args()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let report = runtime.block_on(run_demo(opts))?;
    println!("server: {}", report.server_name);
    println!("tools: {}", report.tools.join(", "));
    for (name, result) in &report.calls {
        println!("{name} -> {result:#}");
    }
    Ok(())
}

//! Embedding fsbroker in a Rust MCP host.
//!
//! A host that speaks MCP to a server already reads the server's messages. When one of them
//! is a `roots/list` or `files/*` request, the host hands the raw line to a fsbroker
//! [`Session`] and sends back the line it returns. That is the whole integration:
//!
//! ```text
//!   server ──line──► host ──► session.handle(line).await ──► response line ──► server
//!                               │
//!                               └─ session.take_notifications(): list_changed, files/changed
//! ```
//!
//! This example plays the host's part without a server: it feeds a few JSON-RPC lines to a
//! session and prints what comes back, then shows the notification stream.
//!
//! Run it with a directory to serve (read-only), e.g. the current one:
//!
//! ```sh
//! cargo run --example embed -- .
//! ```
//!
//! The watch step creates (and removes again) one file named `fsbroker-embed-demo-*.txt` in
//! that directory, to have a change to report.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::path::PathBuf;
use std::time::Duration;

use fsbroker::policy::{Overrides, Policy};
use fsbroker::{Broker, Session};
use serde_json::{Value, json};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // ── Step 1: a policy. ─────────────────────────────────────────────────────────────────
    //
    // `Policy::load` is what `fsbroker serve` runs on its command line: an optional TOML policy
    // file plus `Overrides` (the `--root`, `--read-write`, `--consent`, `--audit` flags). Here
    // there is no file, and one root: the directory named on our command line. A root given
    // this way is read-only with consent "auto" (the user named it, so asking again would be
    // noise) and is named after its last path component. Loading opens the root as a
    // directory capability: from here on, nothing outside it can be reached.
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or(std::env::current_dir()?);
    let overrides = Overrides {
        roots: vec![dir.clone()],
        ..Default::default()
    };
    let policy = Policy::load(None, &overrides)?;

    // ── Step 2: a broker. ─────────────────────────────────────────────────────────────────
    //
    // One `Broker` per host: it owns the policy, the lock table, the file watcher, rate limits
    // and the audit log, and everything connected to it shares them. `Broker::new` returns an
    // `Arc<Broker>`.
    let broker = Broker::new(policy)?;

    // ── Step 3: a session per connected server. ───────────────────────────────────────────
    //
    // A `Session` is one MCP server's view of the broker: its consent grants, kept locks,
    // uploads and watches. They all end when the session is dropped, so drop it when the
    // server disconnects. Requests of one session may run concurrently: share it in an `Arc`
    // and call `handle` from as many tasks as you like.
    let session = broker.session();
    // Consent prompts name the server; a host learns the name from the `initialize` result.
    session.set_peer_name("embed-example");

    // ── Step 4: the notification stream (take it before the first request). ───────────────
    //
    // Notifications for this session's server (`notifications/roots/list_changed` when the
    // policy changes, `notifications/files/changed` for its watches) arrive here as complete
    // frames. A real host forwards them to the server's transport; it can be taken once.
    let mut notifications = session
        .take_notifications()
        .expect("the first take returns the stream");

    // ── Step 5: requests in, responses out. ───────────────────────────────────────────────
    //
    // `handle` takes one message exactly as it arrived (one line, without its newline) and
    // returns the response frame (with its newline), or `None` for a message that gets no
    // response (a notification). Errors are responses too: JSON-RPC errors with a
    // `data.code` such as `FILE_NOT_FOUND` or `PERMISSION_DENIED`.
    let roots = call(&session, 1, "roots/list", json!({})).await;
    // Paths on the wire are `ROOTNAME/relative/path`.
    let root = roots["result"]["roots"][0]["name"]
        .as_str()
        .expect("one root")
        .to_owned();

    let listing = call(&session, 2, "files/list", json!({"path": root, "limit": 5})).await;
    // Read the first regular file of the listing, if there is one.
    let first_file = listing["result"]["entries"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["type"] == "file")
        .and_then(|e| e["path"].as_str())
        .map(str::to_owned);
    match first_file {
        Some(path) => {
            call(
                &session,
                3,
                "files/read",
                json!({"path": path, "length": 200}),
            )
            .await;
        }
        None => println!("(no regular file among the first entries to read)\n"),
    }

    // A path outside the root is refused, however it is spelled.
    call(
        &session,
        4,
        "files/read",
        json!({"path": format!("{root}/../../etc/passwd")}),
    )
    .await;

    // ── Step 6: a watch, a change, a notification. ────────────────────────────────────────
    //
    // `files/watch` answers with a `watchId`; changes then arrive on the notification stream.
    call(&session, 5, "files/watch", json!({"path": root})).await;
    // The user (here: this program, behind the broker's back) creates a file in the root.
    let demo = tempfile::Builder::new()
        .prefix("fsbroker-embed-demo-")
        .suffix(".txt")
        .tempfile_in(&dir)?;
    std::fs::write(demo.path(), "hello\n")?;
    // Drain what arrives within a short while: a host would forward each frame to its server.
    println!("notifications:");
    let mut seen = 0;
    while let Ok(Some(frame)) =
        tokio::time::timeout(Duration::from_secs(2), notifications.recv()).await
    {
        print!("  <- {}", String::from_utf8_lossy(&frame));
        seen += 1;
        if seen >= 4 {
            break;
        }
    }
    if seen == 0 {
        println!("  (none within 2 s)");
    }
    drop(demo); // removes the demo file

    // ── Step 7: the end. ──────────────────────────────────────────────────────────────────
    //
    // Dropping the session releases its locks and watches and removes unfinished uploads.
    drop(session);
    Ok(())
}

/// Wraps a request in a JSON-RPC line, hands it to the session and prints both ways.
/// Returns the parsed response.
async fn call(session: &Session, id: u64, method: &str, params: Value) -> Value {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let line = serde_json::to_vec(&request).expect("JSON");
    println!("-> {request}");
    let response = session
        .handle(&line)
        .await
        .expect("a request always gets a response");
    print!("<- {}", String::from_utf8_lossy(&response));
    println!();
    serde_json::from_slice(&response).expect("the broker writes JSON")
}

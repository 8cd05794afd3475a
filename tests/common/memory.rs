//! The in-process driver (after lsp-server's `Connection::memory()`): the library's own
//! [`fsbroker::Broker`] on a policy file in a fresh temporary directory, and its
//! [`Session`]s, each request a real JSON-RPC line in and a framed response out
//! (`Session::handle`), with no process and no pipe. For what needs the broker's inside
//! reachable from the test (several sessions of one broker, `tokio::join!` on two of them);
//! everything a peer can see goes through the binary ([`super::fsb`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fsbroker::policy::{Overrides, Policy};
use fsbroker::{Broker, Session};
use serde_json::{Value, json};

use super::PolicyToml;

/// How long any single request may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(20);

/// A broker in process, on `policy.toml` in a temporary directory of its own.
pub struct Memory {
    _tmp: tempfile::TempDir,
    /// The temporary directory (canonical): the policy file, and whatever the test makes.
    pub dir: PathBuf,
    pub broker: Arc<Broker>,
}

impl Memory {
    /// A broker on the policy `policy` writes for the temporary directory it is given (make
    /// the roots there first).
    pub fn new(policy: impl FnOnce(&Path) -> PolicyToml) -> Memory {
        let (tmp, dir) = super::tempdir();
        let file = policy(&dir).write_to(&dir.join("policy.toml"));
        let policy = Policy::load(Some(&file), &Overrides::default()).expect("policy");
        Memory {
            _tmp: tmp,
            dir,
            broker: Broker::new(policy).expect("broker"),
        }
    }

    /// A new session of the broker.
    pub fn session(&self) -> Session {
        self.broker.session()
    }
}

/// Sends one request (id 1) and returns the parsed response and its raw frame, which must be
/// one JSON-RPC 2.0 line answering id 1 within [`HANG`].
pub async fn call_raw(s: &Session, method: &str, params: Value) -> (Value, String) {
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let line = serde_json::to_vec(&msg).unwrap();
    let frame = tokio::time::timeout(HANG, s.handle(&line))
        .await
        .unwrap_or_else(|_| panic!("{method} {params} hung"))
        .expect("a request gets a response");
    assert!(frame.ends_with(b"\n"), "frame without newline");
    let text = String::from_utf8(frame).expect("UTF-8 frame");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["jsonrpc"], "2.0");
    assert_eq!(v["id"], 1);
    (v, text)
}

/// The result of a request that must succeed.
pub async fn ok(s: &Session, method: &str, params: Value) -> Value {
    let (v, _) = call_raw(s, method, params.clone()).await;
    assert!(v.get("error").is_none(), "{method} {params} failed: {v}");
    v["result"].clone()
}

/// The error of a request that must fail.
pub async fn err(s: &Session, method: &str, params: Value) -> Value {
    let (v, _) = call_raw(s, method, params.clone()).await;
    assert!(
        v.get("result").is_none(),
        "{method} {params} should fail: {v}"
    );
    v["error"].clone()
}

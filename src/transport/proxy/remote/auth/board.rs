//! [`SignIns`]: what the person is shown of the proxy's sign-ins (a console's "Sign in to
//! SERVER" card, and which remote sessions are signed in), and the audit line of each.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::audit::AuditLog;

/// The sign-ins of a process's remote servers, shared by the proxy (which changes them) and
/// whatever shows them to the person (the console). Never holds a token, a code or a secret.
#[derive(Clone, Default)]
pub struct SignIns {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    cards: Mutex<Vec<SignInCard>>,
    audit: Mutex<Option<Arc<AuditLog>>>,
    /// Whether a console shows the cards (then a sign-in need not be spelled out on stderr).
    shown: std::sync::atomic::AtomicBool,
    /// Counts the changes: a receiver that was busy when one came still sees it.
    version: tokio::sync::watch::Sender<u64>,
}

impl std::fmt::Debug for SignIns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIns")
            .field("cards", &self.cards())
            .finish()
    }
}

/// One remote server's sign-in, as the person is shown it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SignInCard {
    /// The server's URL, its query and fragment shown as `?…`.
    pub server: String,
    /// Where it stands.
    pub state: SignInState,
    /// The authorization server, once known.
    pub issuer: Option<String>,
    /// The scopes asked for, or granted.
    pub scopes: Vec<String>,
    /// While [`SignInState::Needed`]: the page to sign in at (the authorization URL: it
    /// carries no token, code or secret).
    pub authorize: Option<String>,
    /// That page's origin, which the person should recognise.
    pub origin: Option<String>,
    /// Why the last sign-in failed.
    pub reason: Option<String>,
    /// When it last changed.
    #[serde(skip)]
    pub at: SystemTime,
}

/// Where a sign-in stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SignInState {
    /// The person is asked to sign in.
    Needed,
    /// Signed in: requests carry a token.
    SignedIn,
    /// The last sign-in failed.
    Failed,
}

impl SignIns {
    /// An empty board.
    pub fn new() -> SignIns {
        SignIns::default()
    }

    /// Records each sign-in's outcome in `log` too.
    pub fn audit_to(&self, log: Arc<AuditLog>) {
        *self.inner.audit.lock().unwrap_or_else(|e| e.into_inner()) = Some(log);
    }

    /// Says a console shows the board (a sign-in is then offered there as well).
    pub fn shown_on_console(&self) {
        self.inner
            .shown
            .store(true, std::sync::atomic::Ordering::Release);
    }

    pub(super) fn is_shown(&self) -> bool {
        self.inner.shown.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Every server's card.
    pub fn cards(&self) -> Vec<SignInCard> {
        self.inner
            .cards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves at the next change.
    pub async fn changed(&self) {
        let mut changes = self.changes();
        // The board holds the sender: it cannot close while `self` is here.
        let _ = changes.changed().await;
    }

    /// Every change from now on, for a loop that waits on other things too: a change that
    /// came while it was busy is still seen (its `changed()` resolves at once), where each new
    /// [`SignIns::changed`] sees only changes after it starts.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// Sets `server`'s card.
    pub(super) fn set(&self, card: SignInCard) {
        {
            let mut cards = self.inner.cards.lock().unwrap_or_else(|e| e.into_inner());
            match cards.iter_mut().find(|c| c.server == card.server) {
                Some(old) => *old = card,
                None => cards.push(card),
            }
        }
        self.inner.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Records an outcome in the audit log, when there is one: never a secret.
    pub(super) fn record(
        &self,
        server: &str,
        issuer: Option<&str>,
        scopes: &[String],
        outcome: Outcome,
        reason: Option<&str>,
    ) {
        let log = self
            .inner
            .audit
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(log) = log else { return };
        let mut details = serde_json::json!({
            "server": server,
            "issuer": issuer,
            "scopes": scopes,
            "outcome": outcome.as_str(),
        });
        if let Some(reason) = reason {
            details["reason"] = serde_json::Value::from(reason);
        }
        // Written on the blocking pool: the log may wait for its lock.
        tokio::task::spawn_blocking(move || {
            if let Err(e) = log.sign_in(details) {
                tracing::error!(error = %e, "cannot record a sign-in in the audit log");
            }
        });
    }
}

/// How a sign-in ended, as the audit log names it (docs/protocol.md, "Signing in").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The person signed in in a browser.
    SignedIn,
    /// A refresh token got a new access token, with no one asked.
    Refreshed,
    /// A sign-in kept from an earlier start is used.
    Cached,
    /// The authorization server refused a refresh.
    RefreshFailed,
    /// Signing in did not end with a token.
    Failed,
}

impl Outcome {
    /// The audit log's and the log line's word for it.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Outcome::SignedIn => "signed-in",
            Outcome::Refreshed => "refreshed",
            Outcome::Cached => "cached",
            Outcome::RefreshFailed => "refresh-failed",
            Outcome::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(server: &str, state: SignInState) -> SignInCard {
        SignInCard {
            server: server.to_owned(),
            state,
            issuer: None,
            scopes: Vec::new(),
            authorize: None,
            origin: None,
            reason: None,
            at: SystemTime::now(),
        }
    }

    /// The console's feed waits on other things too: a change made while it was busy with
    /// them must still wake it (a `Notify` would have dropped it).
    #[test]
    fn a_change_made_while_nobody_waits_is_still_seen() {
        let board = SignIns::new();
        let mut changes = board.changes();
        assert!(!changes.has_changed().unwrap());
        board.set(card("http://127.0.0.1:9/mcp", SignInState::Needed));
        board.set(card("http://127.0.0.1:9/mcp", SignInState::SignedIn));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert!(!changes.has_changed().unwrap());
        assert_eq!(board.cards().len(), 1);
        assert_eq!(board.cards()[0].state, SignInState::SignedIn);
    }
}

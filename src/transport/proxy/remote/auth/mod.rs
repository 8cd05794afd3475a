//! Signing in to a remote server that answers 401 (MCP authorization, 2025-06-18 and
//! 2025-11-25): the person signs in in a browser, and every request then carries a token
//! meant for this server alone.
//!
//! The parts: `fetch.rs` is the sign-in's HTTP (https off loopback, no redirects, bounded);
//! `discover.rs` reads the challenge and finds the authorization server, checking what each
//! document names; `browser.rs` opens the authorization URL and takes the one code that comes
//! back for its `state`; `cache.rs` keeps the tokens for the next start ([`TokenCache`]);
//! `board.rs` is what the person is shown ([`SignIns`]) and the audit line; `revoke.rs` signs
//! out, revoking the tokens (RFC 7009). This file is the flow: [`SignIn`] (what the proxy is
//! given), and `Auth`, which the proxy's HTTP client asks for the token to send and tells of
//! each challenge. The `oauth2` crate does PKCE, `state`, the token requests and revocation.

mod board;
mod browser;
mod cache;
mod discover;
mod fetch;
mod revoke;

use std::sync::{Arc, Mutex};

use futures_util::FutureExt;
use oauth2::basic::{BasicClient, BasicErrorResponseType, BasicTokenType};
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointNotSet,
    EndpointSet, EndpointState, PkceCodeChallenge, RedirectUrl, RefreshToken, RequestTokenError,
    Scope, TokenResponse, TokenUrl,
};
use tokio::sync::watch;

use board::Outcome;
pub use board::{SignInCard, SignInState, SignIns};
pub use cache::{CacheError, CachedSignIn, TokenCache};
use cache::{Grant, now};
use discover::{Challenge, Discovered, discover, shown};
use fetch::{Fetch, FetchError};
pub use revoke::{Revoked, SignedOut};

use super::given::{RemoteError, shown_url};
use crate::limits::{SIGN_IN_OPEN, TOKEN_REFRESH_MARGIN};

/// How `proxy --url` signs in to a server that answers 401: on by default on the command
/// line (`--no-sign-in` turns it off), and never when the user sends an `Authorization`
/// header of their own.
///
/// Its `Debug` never shows the client secret.
#[derive(Clone)]
pub struct SignIn {
    client_id: Option<String>,
    /// The authorization server the configured client is registered with.
    issuer: Option<String>,
    client_secret: Option<String>,
    redirect_port: Option<u16>,
    board: SignIns,
    cache: Option<TokenCache>,
    open_browser: bool,
}

impl std::fmt::Debug for SignIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignIn")
            .field("client_id", &self.client_id)
            .field("issuer", &self.issuer)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "…"))
            .field("redirect_port", &self.redirect_port)
            .field("cache", &self.cache)
            .field("open_browser", &self.open_browser)
            .finish()
    }
}

impl Default for SignIn {
    fn default() -> SignIn {
        SignIn::new()
    }
}

impl SignIn {
    /// Dynamic registration, the browser opened with `$BROWSER` or `xdg-open`, and the
    /// tokens kept in the user's private state directory ([`TokenCache::default_location`]).
    pub fn new() -> SignIn {
        SignIn {
            client_id: None,
            issuer: None,
            client_secret: None,
            redirect_port: None,
            board: SignIns::new(),
            cache: TokenCache::default_location().ok(),
            open_browser: true,
        }
    }

    /// A client registered beforehand with the authorization server (no dynamic
    /// registration).
    pub fn client_id(mut self, id: &str) -> SignIn {
        self.client_id = Some(id.to_owned());
        self
    }

    /// The authorization server (its issuer URL) the client of [`SignIn::client_id`] is
    /// registered with: the client's id and secret go to that server only, whichever
    /// authorization server a remote server names. Needed with a secret.
    pub fn issuer(mut self, issuer: &str) -> SignIn {
        self.issuer = Some(issuer.to_owned());
        self
    }

    /// The registered client's secret, from the environment variable `var` (never from the
    /// command line, where other users can read it).
    pub fn client_secret_from_env(mut self, var: &str) -> Result<SignIn, RemoteError> {
        let value = std::env::var(var).map_err(|_| RemoteError::MissingVar {
            name: "the OAuth client secret".into(),
            var: var.to_owned(),
        })?;
        self.client_secret = Some(value);
        Ok(self)
    }

    /// The port of the loopback redirect (`http://127.0.0.1:PORT/callback`), for a client
    /// registered with a fixed one; otherwise the system picks one per sign-in.
    pub fn redirect_port(mut self, port: u16) -> SignIn {
        self.redirect_port = Some(port);
        self
    }

    /// Shows the sign-ins on `board` (a console), and records them in its audit log.
    pub fn board(mut self, board: SignIns) -> SignIn {
        self.board = board;
        self
    }

    /// Keeps tokens in `cache`; `None` keeps them in memory only.
    pub fn cache(mut self, cache: Option<TokenCache>) -> SignIn {
        self.cache = cache;
        self
    }

    /// Whether to open the person's browser (`$BROWSER`, `xdg-open`); without, the sign-in
    /// is offered on the console and on stderr only.
    pub fn open_browser(mut self, open: bool) -> SignIn {
        self.open_browser = open;
        self
    }
}

/// Why signing in did not give a token.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum SignInError {
    /// The server's or its authorization server's metadata could not be found or was refused.
    #[error("cannot find where to sign in to {server}: {reason}")]
    Discovery { server: String, reason: String },
    /// Dynamic registration failed, or is not offered.
    #[error("cannot register fsbroker with the authorization server {issuer}: {reason}")]
    Registration { issuer: String, reason: String },
    /// The loopback listener could not be set up.
    #[error("{reason}")]
    Callback { reason: String },
    /// The authorization server sent the person back with an error.
    #[error("the authorization server did not sign you in: {reason}")]
    Refused { reason: String },
    /// The code (or a refresh token) was refused at the token endpoint.
    #[error("the authorization server {issuer} refused to issue a token: {reason}")]
    Token { issuer: String, reason: String },
    /// The person has not signed in yet; the sign-in stays open.
    #[error(
        "waiting for you to sign in at {origin} ({how}); the sign-in stays open for {} minutes: retry once signed in",
        SIGN_IN_OPEN.as_secs() / 60
    )]
    Pending { origin: String, how: String },
    /// Nobody signed in while the sign-in was open.
    #[error("nobody signed in within {} minutes", SIGN_IN_OPEN.as_secs() / 60)]
    Expired,
    /// The server refused the token its authorization server had just issued.
    #[error(
        "the server refused the token it was just issued (its authorization server and it disagree); fsbroker does not sign in again in a loop"
    )]
    Rejected,
    /// The person was asked too often in a while.
    #[error(
        "the server keeps refusing the tokens it is given: you were asked to sign in {SIGN_INS_AT_MOST} times in {} minutes, and are not asked again before that",
        SIGN_IN_OPEN.as_secs() / 60
    )]
    TooMany,
    /// A token would travel in the clear.
    #[error(
        "{server} is plain http to a host that is not loopback: a token sent there would travel in the clear; use https"
    )]
    Plain { server: String },
}

impl SignInError {
    /// The same error with `redact` applied to every text a server could have made.
    fn redacted(self, redact: impl Fn(&str) -> String) -> SignInError {
        match self {
            SignInError::Discovery { server, reason } => SignInError::Discovery {
                server,
                reason: redact(&reason),
            },
            SignInError::Registration { issuer, reason } => SignInError::Registration {
                issuer,
                reason: redact(&reason),
            },
            SignInError::Callback { reason } => SignInError::Callback {
                reason: redact(&reason),
            },
            SignInError::Refused { reason } => SignInError::Refused {
                reason: redact(&reason),
            },
            SignInError::Token { issuer, reason } => SignInError::Token {
                issuer,
                reason: redact(&reason),
            },
            other => other,
        }
    }
}

/// The sign-in state of one remote server, which the proxy's HTTP client consults.
pub(super) struct Auth {
    server: url::Url,
    /// The server as messages show it.
    shown: String,
    fetch: Arc<Fetch>,
    options: SignIn,
    grant: Mutex<Option<Grant>>,
    /// One decision at a time about refreshing or signing in.
    turn: Arc<tokio::sync::Mutex<Turn>>,
    /// Every token and secret this process has held, for [`Auth::redact`].
    seen: Mutex<Vec<String>>,
    /// The access token this process last got (signed in, or refreshed) until the server
    /// takes it.
    unproven: Mutex<Option<String>>,
    /// Whether that token came from the person signing in (not from a refresh).
    unproven_by_person: Mutex<bool>,
    /// When a refresh ahead of expiry last failed.
    refresh_failed: Mutex<Option<std::time::Instant>>,
    /// How the person was offered the sign-in under way, for the error of a request that
    /// waited for it.
    offered: Mutex<Option<String>>,
}

#[derive(Default)]
struct Turn {
    /// The interactive sign-in under way (`None` inside until it ends).
    signing_in: Option<watch::Receiver<Option<Result<(), SignInError>>>>,
    /// When the person was last asked to sign in (within [`SIGN_IN_OPEN`]).
    asked: Vec<std::time::Instant>,
}

/// What a refusal of the token leads to.
enum Decision {
    /// Send the request again, with the token held now.
    Retry,
    /// Give up, for this reason.
    Refused(SignInError),
    /// Wait for the sign-in under way.
    Wait(watch::Receiver<Option<Result<(), SignInError>>>),
}

/// How many times the person is asked to sign in within [`SIGN_IN_OPEN`], whatever a server
/// keeps asking for.
const SIGN_INS_AT_MOST: usize = 3;

/// How long after a failed refresh the proxy waits before trying one again ahead of expiry.
const REFRESH_BACKOFF: std::time::Duration = std::time::Duration::from_secs(60);

/// The longest lifetime a token is taken to have, whatever `expires_in` says.
const LONGEST_LIFETIME: u64 = 366 * 24 * 3600;

/// The `oauth2` client with a token endpoint.
type TokenClient =
    BasicClient<EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointSet>;

impl Auth {
    /// The sign-in state of `server`, with its cached sign-in if there is one.
    pub(super) fn new(
        server: &url::Url,
        options: SignIn,
        ca_certs: &[std::path::PathBuf],
    ) -> Result<Auth, RemoteError> {
        let auth = Auth {
            server: server.clone(),
            shown: shown_url(server),
            fetch: Arc::new(Fetch::new(ca_certs, server)?),
            options,
            grant: Mutex::new(None),
            turn: Arc::default(),
            seen: Mutex::new(Vec::new()),
            unproven: Mutex::new(None),
            unproven_by_person: Mutex::new(false),
            refresh_failed: Mutex::new(None),
            offered: Mutex::new(None),
        };
        let cached = auth.options.cache.as_ref().map(|c| c.load(server));
        match cached {
            Some(Ok(Some(grant))) => {
                tracing::info!(server = %auth.shown, issuer = %grant.issuer, "using the sign-in kept from before");
                auth.options.board.record(
                    &auth.shown,
                    Some(&grant.issuer),
                    &grant.scopes,
                    Outcome::Cached,
                    None,
                );
                auth.signed_in(grant);
            }
            Some(Err(e)) => tracing::warn!(error = %e, "the kept sign-ins cannot be read"),
            _ => {}
        }
        Ok(auth)
    }

    /// The access token to send now, if signed in.
    pub(super) fn token(&self) -> Option<String> {
        self.lock_grant().as_ref().map(|g| g.access_token.clone())
    }

    /// Refreshes the token first when it expires within [`TOKEN_REFRESH_MARGIN`] and can be:
    /// at most one refresh at a time (a request that finds one under way sends the token it
    /// has), and none for [`REFRESH_BACKOFF`] after one failed. The refresh runs on its own:
    /// a request waits for it only while its token has expired, and only until `until`.
    pub(super) async fn prepare(self: &Arc<Self>, until: tokio::time::Instant) {
        let due = |g: &Grant| {
            g.refresh_token.is_some()
                && g.expires_at
                    .is_some_and(|at| at <= now().saturating_add(TOKEN_REFRESH_MARGIN.as_secs()))
        };
        if !self.lock_grant().as_ref().is_some_and(due) {
            return;
        }
        let failed_lately = self
            .refresh_failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < REFRESH_BACKOFF);
        if failed_lately {
            return;
        }
        let Ok(turn) = Arc::clone(&self.turn).try_lock_owned() else {
            return;
        };
        let Some(grant) = self.lock_grant().clone().filter(due) else {
            return;
        };
        let expired = grant.expires_at.is_some_and(|at| at <= now());
        let me = Arc::clone(self);
        // Its own task, holding the turn: a request that stops waiting (or goes) must not cut
        // a refresh short, whose new refresh token would then be lost.
        let refreshing = tokio::spawn(async move {
            let _turn = turn;
            if let Err(e) = me.refresh(&grant).await {
                *me.refresh_failed.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::time::Instant::now());
                tracing::warn!(server = %me.shown, error = %e, "the token could not be refreshed before it expires");
            }
        });
        if expired {
            let _ = tokio::time::timeout_at(until, refreshing).await;
        }
    }

    /// The server refused `sent` (a 401, or a 403 asking for more scope): gets a token it
    /// may take (refreshed, or from a new sign-in), or says why not. Waits until `until` at
    /// most (the request's one deadline, [`SIGN_IN_WAIT`](crate::limits::SIGN_IN_WAIT) from
    /// when it was sent), for a refresh under way and for the person.
    pub(super) async fn challenged(
        self: &Arc<Self>,
        sent: Option<&str>,
        header: Option<&str>,
        until: tokio::time::Instant,
    ) -> Result<(), SignInError> {
        if self.server.scheme() == "http" && !fetch::is_loopback(&self.server) {
            return Err(SignInError::Plain {
                server: self.shown.clone(),
            });
        }
        let challenge = header.and_then(Challenge::parse).unwrap_or_default();
        let decided = tokio::time::timeout_at(until, self.decide(sent, challenge)).await;
        let mut waiting = match decided {
            Ok(Decision::Retry) => return Ok(()),
            Ok(Decision::Refused(e)) => return Err(e),
            Ok(Decision::Wait(rx)) => rx,
            Err(_) => return Err(self.pending()),
        };
        match tokio::time::timeout_at(until, waiting.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => outcome.clone().unwrap_or(Err(SignInError::Expired)),
            Ok(Err(_)) => Err(SignInError::Expired),
            Err(_) => Err(self.pending()),
        }
    }

    /// What to do about a refusal of `sent`, decided under the turn: send again (another
    /// request got a new token, or a refresh did), give up, or wait for a sign-in.
    async fn decide(self: &Arc<Self>, sent: Option<&str>, challenge: Challenge) -> Decision {
        let step_up = challenge.error.as_deref() == Some("insufficient_scope");
        let mut turn = self.turn.lock().await;
        let now_held = self.token();
        if now_held.is_some() && now_held.as_deref() != sent {
            return Decision::Retry;
        }
        if let Some(rx) = turn.signing_in.as_ref().filter(|rx| rx.borrow().is_none()) {
            return Decision::Wait(rx.clone());
        }
        // A token this process just got, refused before the server ever took it: getting
        // another the same way would loop (a browser window per request).
        let unproven = sent.is_some() && sent == self.lock_unproven().as_deref();
        let granted = self
            .lock_grant()
            .as_ref()
            .map(|g| g.scopes.clone())
            .unwrap_or_default();
        if step_up {
            let nothing_new = challenge.scopes().iter().all(|s| granted.contains(s));
            if unproven && nothing_new {
                return Decision::Refused(SignInError::Rejected);
            }
        } else {
            // One the person signed in for: asking them again would loop. One a refresh got:
            // refreshing again would loop, but the person may sign in once more (the
            // authorization server and the resource may have parted ways).
            let by_person = *self.lock_unproven_by_person();
            if unproven && by_person {
                return Decision::Refused(SignInError::Rejected);
            }
            let held = self.lock_grant().clone().filter(|_| !unproven);
            if let Some(grant) = held.filter(|g| g.refresh_token.is_some()) {
                // Its own task, as in `prepare`: a request that stops waiting must not cut it
                // short (the turn it holds ends then, and a second refresh with the same
                // refresh token may start; `refresh` forgets a grant only if it is the one
                // refused).
                let me = Arc::clone(self);
                let refreshed = tokio::spawn(async move { me.refresh(&grant).await })
                    .await
                    .unwrap_or_else(|_| {
                        Err(SignInError::Refused {
                            reason: "the refresh failed unexpectedly".into(),
                        })
                    });
                match refreshed {
                    Ok(()) => return Decision::Retry,
                    Err(e) => {
                        tracing::warn!(server = %self.shown, error = %e, "the token could not be refreshed; signing in again")
                    }
                }
            }
        }
        // However the server asks, the person is asked a few times in a while at most.
        let now = std::time::Instant::now();
        turn.asked
            .retain(|at| now.duration_since(*at) < SIGN_IN_OPEN);
        if turn.asked.len() >= SIGN_INS_AT_MOST {
            return Decision::Refused(SignInError::TooMany);
        }
        turn.asked.push(now);
        let keep = if step_up { granted } else { Vec::new() };
        let (tx, rx) = watch::channel(None);
        turn.signing_in = Some(rx.clone());
        let me = Arc::clone(self);
        tokio::spawn(async move {
            // A sign-in that panicked must still end, or every later request would wait
            // for it.
            let outcome = std::panic::AssertUnwindSafe(me.sign_in(challenge, keep))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| {
                    Err(SignInError::Refused {
                        reason: "the sign-in failed unexpectedly".into(),
                    })
                });
            let shared = match outcome {
                Ok(grant) => {
                    me.keep(grant, Outcome::SignedIn);
                    Ok(())
                }
                Err(e) => {
                    // Every path's words pass here before they are logged, recorded, shown on
                    // the console or sent to the host: none keeps a secret the servers echoed.
                    let e = e.redacted(|t| me.redact(t));
                    tracing::error!(server = %me.shown, error = %e, "signing in failed");
                    me.failed(&e);
                    Err(e)
                }
            };
            let _ = tx.send(Some(shared));
        });
        Decision::Wait(rx)
    }

    /// The server took `token` (it answered a request carrying it other than with a 401).
    pub(super) fn accepted(&self, token: &str) {
        let mut unproven = self.lock_unproven();
        if unproven.as_deref() == Some(token) {
            *unproven = None;
        }
    }

    /// The error for a request that waited as long as it may for the person.
    fn pending(&self) -> SignInError {
        let card = self
            .options
            .board
            .cards()
            .into_iter()
            .find(|c| c.server == self.shown);
        SignInError::Pending {
            origin: card
                .as_ref()
                .and_then(|c| c.origin.clone())
                .unwrap_or_else(|| "the authorization server".into()),
            how: self
                .offered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_else(|| "the sign-in is being prepared".into()),
        }
    }

    /// `text` without any token or secret this process has held.
    pub(super) fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for secret in self.seen.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if secret.len() >= 8 && out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "[redacted]");
            }
        }
        out
    }

    /// One interactive sign-in: discovery, registration, the browser, the code, the token.
    async fn sign_in(&self, challenge: Challenge, keep: Vec<String>) -> Result<Grant, SignInError> {
        let preferred = self.options.issuer.as_deref();
        let found = discover(&self.fetch, &self.server, &challenge, preferred).await?;
        let mut scopes = keep;
        for s in &found.scopes {
            if !scopes.contains(s) {
                scopes.push(s.clone());
            }
        }
        let callback = browser::Callback::bind(self.options.redirect_port).await?;
        let (client_id, secret, method) = self.client(&found, &callback.redirect).await?;
        let token_failed = |reason: String| SignInError::Token {
            issuer: found.issuer.clone(),
            reason,
        };
        let client = token_client(
            &found.metadata.token_endpoint,
            &client_id,
            secret.as_deref(),
            &method,
        )
        .map_err(token_failed)?
        .set_auth_uri(
            AuthUrl::new(found.metadata.authorization_endpoint.clone())
                .map_err(|e| token_failed(e.to_string()))?,
        )
        .set_redirect_uri(
            RedirectUrl::new(callback.redirect.clone()).map_err(|e| token_failed(e.to_string()))?,
        );
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client
            .authorize_url(CsrfToken::new_random)
            .set_pkce_challenge(challenge)
            .add_extra_param("resource", found.resource.clone());
        for scope in &scopes {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (authorize, state) = request.url();
        let (code, _serving) = callback.serve(state.secret().clone());
        let origin = authorize.origin().ascii_serialization();
        self.options.board.set(SignInCard {
            server: self.shown.clone(),
            state: SignInState::Needed,
            issuer: Some(found.issuer.clone()),
            scopes: scopes.clone(),
            authorize: Some(authorize.to_string()),
            origin: Some(origin.clone()),
            reason: None,
            at: std::time::SystemTime::now(),
        });
        let opened = if self.options.open_browser {
            browser::open(authorize.as_str())
        } else {
            Err("opening a browser is turned off".into())
        };
        let console = if self.options.board.is_shown() {
            " (or on the console: `fsbroker console`)"
        } else {
            ""
        };
        let offered = match &opened {
            Ok(how) => {
                tracing::info!(server = %self.shown, at = %origin, "sign-in opened in the browser with {how}");
                format!("a browser was opened with {how}{console}")
            }
            // The one line that says how to finish: the URL carries no secret (PKCE keeps a
            // code sent to it useless to anyone but this process).
            Err(why) => {
                tracing::warn!(
                    "sign in to {}: open {} in a browser on this machine{console}; no browser was opened ({why}); waiting {} minutes",
                    self.shown,
                    authorize,
                    SIGN_IN_OPEN.as_secs() / 60
                );
                format!("no browser could be opened: the URL is on fsbroker's stderr{console}")
            }
        };
        *self.offered.lock().unwrap_or_else(|e| e.into_inner()) = Some(offered);
        let (code, iss) = match tokio::time::timeout(SIGN_IN_OPEN, code).await {
            Ok(Ok(Ok(answer))) => answer,
            Ok(Ok(Err(e))) => return Err(e),
            _ => return Err(SignInError::Expired),
        };
        // The token endpoint may echo them in a refusal, which is logged and shown.
        self.remember(&code);
        self.remember(verifier.secret());
        // RFC 9207: the answer says which authorization server sent it; one that is not the
        // server this sign-in started at (a mix-up) is refused before the code goes anywhere.
        let same = |iss: &str| url::Url::parse(iss).is_ok_and(|i| i.as_str() == found.issuer);
        match iss {
            Some(iss) if !same(&iss) => {
                return Err(SignInError::Refused {
                    reason: format!(
                        "the answer came from the authorization server {} (its iss), not {}: refused (a mix-up, RFC 9207)",
                        shown(&iss),
                        found.issuer
                    ),
                });
            }
            None if found
                .metadata
                .authorization_response_iss_parameter_supported =>
            {
                return Err(SignInError::Refused {
                    reason: format!(
                        "the answer carries no iss, which {} says it always sends: refused (RFC 9207)",
                        found.issuer
                    ),
                });
            }
            _ => {}
        }
        let http = fetch::for_oauth2(&self.fetch);
        let token = client
            .exchange_code(AuthorizationCode::new(code))
            .set_pkce_verifier(verifier)
            .add_extra_param("resource", found.resource.clone())
            .request_async(&http)
            .await
            .map_err(|e| token_failed(token_error(&e)))?;
        if *token.token_type() != BasicTokenType::Bearer {
            return Err(token_failed(format!(
                "it issued a {:?} token; MCP takes Bearer tokens",
                token.token_type()
            )));
        }
        let granted = token
            .scopes()
            .map(|s| discover::scope_tokens(s.iter().map(|s| s.to_string()).collect()))
            .unwrap_or(scopes);
        Ok(Grant {
            server: self.server.to_string(),
            issuer: found.issuer.clone(),
            token_endpoint: found.metadata.token_endpoint.clone(),
            revocation_endpoint: found.metadata.revocation_endpoint.clone(),
            resource: found.resource.clone(),
            // A configured client's secret is the person's to give at each start
            // (--oauth-client-secret-env), not the cache's to keep: one registered here is.
            client_secret: secret.filter(|_| self.options.client_id.as_deref() != Some(&client_id)),
            client_id,
            auth_method: method,
            access_token: token.access_token().secret().clone(),
            refresh_token: token.refresh_token().map(|r| r.secret().clone()),
            expires_at: token.expires_in().map(expiry),
            scopes: granted,
            saved_at: now(),
        })
    }

    /// The client to sign in as: the one configured, else one registered now (RFC 7591)
    /// for `redirect`. Its id, secret and how it authenticates at the token endpoint.
    async fn client(
        &self,
        found: &Discovered,
        redirect: &str,
    ) -> Result<(String, Option<String>, String), SignInError> {
        let methods = &found.metadata.token_endpoint_auth_methods_supported;
        if let Some(id) = &self.options.client_id {
            // The server chooses the authorization server: a client registered with one
            // (and its secret above all) goes to that one only.
            let pinned = self.options.issuer.as_deref().map(url::Url::parse);
            let matches = |i: &url::Url| i.as_str() == found.issuer;
            match pinned {
                Some(Ok(ref i)) if matches(i) => {}
                None if self.options.client_secret.is_none() => {}
                _ => {
                    return Err(SignInError::Registration {
                        issuer: found.issuer.clone(),
                        reason: format!(
                            "the client given (--oauth-client-id) is registered with {}, not with this server's authorization server: refused, its id and secret go to that one only",
                            self.options.issuer.as_deref().map_or(
                                "an authorization server not named (give --oauth-issuer)".into(),
                                shown
                            )
                        ),
                    });
                }
            }
            let secret = self.options.client_secret.clone();
            let method = match &secret {
                None => "none",
                Some(_)
                    if methods.is_empty() || methods.iter().any(|m| m == "client_secret_basic") =>
                {
                    "basic"
                }
                Some(_) => "post",
            };
            if let Some(s) = &secret {
                self.remember(s);
            }
            return Ok((id.clone(), secret, method.to_owned()));
        }
        let failed = |reason: String| SignInError::Registration {
            issuer: found.issuer.clone(),
            reason,
        };
        let Some(endpoint) = &found.metadata.registration_endpoint else {
            return Err(failed(
                "it offers no dynamic registration (no registration_endpoint): give a client registered with it, --oauth-client-id ID".into(),
            ));
        };
        let body = serde_json::json!({
            "client_name": "fsbroker",
            "redirect_uris": [redirect],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "token_endpoint_auth_method": "none",
        });
        let request = http::Request::post(endpoint.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(body.to_string().into_bytes())
            .map_err(|e| failed(e.to_string()))?;
        let response = self
            .fetch
            .request(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        if !response.status().is_success() {
            let why = serde_json::from_slice::<serde_json::Value>(response.body())
                .ok()
                .and_then(|v| {
                    let e = v.get("error")?.as_str()?.to_owned();
                    let d = v.get("error_description").and_then(|d| d.as_str());
                    Some(match d {
                        Some(d) => format!("{}: {}", shown(&e), shown(d)),
                        None => shown(&e),
                    })
                })
                .unwrap_or_default();
            return Err(failed(format!("HTTP {} {why}", response.status().as_u16())));
        }
        #[derive(serde::Deserialize)]
        struct Registered {
            client_id: String,
            #[serde(default)]
            client_secret: Option<String>,
            #[serde(default)]
            token_endpoint_auth_method: Option<String>,
        }
        let registered: Registered = serde_json::from_slice(response.body())
            .map_err(|e| failed(format!("its answer is not a registration: {e}")))?;
        if let Some(s) = &registered.client_secret {
            self.remember(s);
        }
        let method = match (
            &registered.client_secret,
            registered.token_endpoint_auth_method.as_deref(),
        ) {
            (None, _) | (_, Some("none")) => "none",
            (Some(_), Some("client_secret_post")) => "post",
            (Some(_), _) => "basic",
        };
        Ok((
            registered.client_id,
            registered.client_secret,
            method.to_owned(),
        ))
    }

    /// Refreshes `grant`'s token at the token endpoint it came from.
    async fn refresh(&self, grant: &Grant) -> Result<(), SignInError> {
        let failed = |reason: String| SignInError::Token {
            issuer: grant.issuer.clone(),
            reason,
        };
        let Some(refresh) = &grant.refresh_token else {
            return Err(failed("no refresh token was issued".into()));
        };
        // The endpoint was checked when it was found; a cache edited since is checked again.
        let endpoint = url::Url::parse(&grant.token_endpoint).map_err(|e| failed(e.to_string()))?;
        self.fetch
            .allowed(&endpoint)
            .map_err(|e| failed(e.to_string()))?;
        // A configured client's secret comes from this start's environment, and only for the
        // authorization server it was given for (as when signing in).
        let configured =
            self.options
                .client_secret
                .as_deref()
                .filter(|_| self.options.client_id.as_deref() == Some(&grant.client_id))
                .filter(|_| {
                    self.options.issuer.as_deref().is_some_and(|i| {
                        url::Url::parse(i).is_ok_and(|i| i.as_str() == grant.issuer)
                    })
                });
        let client = token_client(
            &grant.token_endpoint,
            &grant.client_id,
            grant.client_secret.as_deref().or(configured),
            &grant.auth_method,
        )
        .map_err(failed)?;
        let http = fetch::for_oauth2(&self.fetch);
        let refresh = RefreshToken::new(refresh.clone());
        let outcome = client
            .exchange_refresh_token(&refresh)
            .add_extra_param("resource", grant.resource.clone())
            .request_async(&http)
            .await;
        let token = match outcome {
            Ok(t) => t,
            Err(e) => {
                let reason = self.redact(&token_error(&e));
                // A refresh token refused for good is forgotten, so no later start sends it.
                // Only an error that says so (RFC 6749 §5.2: the grant is invalid, or the
                // client may not use it): any answer with an error code used to count, and a
                // token endpoint down for a while (503 `temporarily_unavailable`) cost the
                // person their sign-in and a trip to the browser
                // (tests/sign_in_hostile.rs: a_refresh_failing_for_a_while_keeps_the_sign_in).
                if let RequestTokenError::ServerResponse(r) = &e
                    && matches!(
                        r.error(),
                        BasicErrorResponseType::InvalidGrant
                            | BasicErrorResponseType::InvalidClient
                            | BasicErrorResponseType::UnauthorizedClient
                    )
                {
                    // Unless another refresh has already replaced it.
                    let mut held = self.lock_grant();
                    if held
                        .as_ref()
                        .is_some_and(|g| g.refresh_token == grant.refresh_token)
                    {
                        *held = None;
                        drop(held);
                        if let Some(cache) = &self.options.cache {
                            let _ = cache.forget(&grant.server, &grant.issuer);
                        }
                    }
                }
                self.options.board.record(
                    &self.shown,
                    Some(&grant.issuer),
                    &grant.scopes,
                    Outcome::RefreshFailed,
                    Some(&reason),
                );
                return Err(failed(reason));
            }
        };
        let mut next = grant.clone();
        next.access_token = token.access_token().secret().clone();
        if let Some(r) = token.refresh_token() {
            next.refresh_token = Some(r.secret().clone());
        }
        next.expires_at = token.expires_in().map(expiry);
        if let Some(s) = token.scopes() {
            next.scopes = discover::scope_tokens(s.iter().map(|s| s.to_string()).collect());
        }
        next.saved_at = now();
        self.keep(next, Outcome::Refreshed);
        Ok(())
    }

    /// Holds `grant` from now on, keeps it in the cache, and shows and records it.
    fn keep(&self, grant: Grant, outcome: Outcome) {
        *self.lock_unproven() = Some(grant.access_token.clone());
        *self.lock_unproven_by_person() = outcome == Outcome::SignedIn;
        if let Some(cache) = &self.options.cache {
            if let Err(e) = cache.save(&grant) {
                tracing::warn!(error = %e, "the sign-in is not kept for the next start");
            }
        }
        tracing::info!(server = %self.shown, issuer = %grant.issuer, scopes = ?grant.scopes, "{}", outcome.as_str());
        self.options.board.record(
            &self.shown,
            Some(&grant.issuer),
            &grant.scopes,
            outcome,
            None,
        );
        self.signed_in(grant);
    }

    fn signed_in(&self, grant: Grant) {
        self.remember(&grant.access_token);
        if let Some(r) = &grant.refresh_token {
            self.remember(r);
        }
        self.options.board.set(SignInCard {
            server: self.shown.clone(),
            state: SignInState::SignedIn,
            issuer: Some(grant.issuer.clone()),
            scopes: grant.scopes.clone(),
            authorize: None,
            origin: None,
            reason: None,
            at: std::time::SystemTime::now(),
        });
        *self.lock_grant() = Some(grant);
    }

    fn failed(&self, error: &SignInError) {
        let reason = self.redact(&error.to_string());
        let issuer = self.lock_grant().as_ref().map(|g| g.issuer.clone());
        self.options.board.record(
            &self.shown,
            issuer.as_deref(),
            &[],
            Outcome::Failed,
            Some(&reason),
        );
        self.options.board.set(SignInCard {
            server: self.shown.clone(),
            state: SignInState::Failed,
            issuer,
            scopes: Vec::new(),
            authorize: None,
            origin: None,
            reason: Some(reason),
            at: std::time::SystemTime::now(),
        });
    }

    fn remember(&self, secret: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if !seen.iter().any(|s| s == secret) {
            seen.push(secret.to_owned());
            seen.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    fn lock_unproven_by_person(&self) -> std::sync::MutexGuard<'_, bool> {
        self.unproven_by_person
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock_unproven(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.unproven.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_grant(&self) -> std::sync::MutexGuard<'_, Option<Grant>> {
        self.grant.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// When a token given `lifetime` expires, in seconds since the epoch: an authorization
/// server's `expires_in` is taken at most as [`LONGEST_LIFETIME`], so the sum cannot overflow
/// (`2^64 - 1` panicked the sign-in's task: tests/sign_in_hostile.rs,
/// `an_expiry_past_the_end_of_time_is_no_crash`).
fn expiry(lifetime: std::time::Duration) -> u64 {
    now().saturating_add(lifetime.as_secs().min(LONGEST_LIFETIME))
}

/// The `resource_metadata` of a `WWW-Authenticate` value, as messages show it.
pub(super) fn resource_metadata(header: &str) -> Option<String> {
    Challenge::parse(header)?
        .resource_metadata
        .map(|m| shown(&m))
}

/// The `oauth2` client for a token endpoint, as `client_id` authenticating by `method`.
fn token_client(
    endpoint: &str,
    client_id: &str,
    secret: Option<&str>,
    method: &str,
) -> Result<TokenClient, String> {
    let client = BasicClient::new(ClientId::new(client_id.to_owned()))
        .set_token_uri(TokenUrl::new(endpoint.to_owned()).map_err(|e| e.to_string())?);
    Ok(authenticated(client, secret, method))
}

/// `client` proving itself by `method` (`basic`, `post` or `none`, as kept in a grant) with
/// `secret`, at whichever endpoint it is used for: the token endpoint or revocation.
fn authenticated<A, D, I, R, T>(
    client: BasicClient<A, D, I, R, T>,
    secret: Option<&str>,
    method: &str,
) -> BasicClient<A, D, I, R, T>
where
    A: EndpointState,
    D: EndpointState,
    I: EndpointState,
    R: EndpointState,
    T: EndpointState,
{
    let client = match secret.filter(|_| method != "none") {
        Some(secret) => client.set_client_secret(ClientSecret::new(secret.to_owned())),
        None => client,
    };
    client.set_auth_type(if method == "post" {
        AuthType::RequestBody
    } else {
        AuthType::BasicAuth
    })
}

/// A token request's failure in words: the authorization server's error code and
/// description (shown as text), never its whole body.
fn token_error<T: oauth2::ErrorResponse + 'static>(e: &RequestTokenError<FetchError, T>) -> String {
    match e {
        RequestTokenError::ServerResponse(r) => shown(&r.to_string()),
        RequestTokenError::Request(e) => e.to_string(),
        RequestTokenError::Parse(e, _) => format!(
            "its answer is not a token response ({})",
            shown(&e.to_string())
        ),
        RequestTokenError::Other(e) => shown(e),
    }
}

//! Signing out (`fsbroker auth logout URL`): each kept sign-in to the server has its tokens
//! revoked at the authorization server that issued them (RFC 7009), where that server offers
//! a revocation endpoint, and is then forgotten here whatever the answer, so that this machine
//! stops using it either way. The `oauth2` crate makes the revocation requests, over the
//! sign-in's own HTTP (no redirects, bounded).

use std::path::PathBuf;
use std::sync::Arc;

use oauth2::basic::BasicClient;
use oauth2::{
    AccessToken, ClientId, RefreshToken, RequestTokenError, RevocationUrl, StandardRevocableToken,
};

use super::cache::{CacheError, Grant, TokenCache, remove};
use super::discover::on_its_own_origins;
use super::fetch::{self, Fetch};
use super::{authenticated, shown, token_error};
use crate::transport::proxy::remote::given::shown_url;

/// What signing out did with one kept sign-in.
#[derive(Debug, Clone)]
pub struct SignedOut {
    /// The server, as `fsbroker auth list` shows it.
    pub server: String,
    /// The authorization server that signed the person in.
    pub issuer: String,
    /// Whether its tokens were revoked there. The sign-in is forgotten here in every case.
    pub revoked: Revoked,
}

/// Whether an authorization server revoked a sign-in's tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revoked {
    /// It took the revocation: the tokens are no longer valid anywhere.
    Yes,
    /// It offers no revocation endpoint that may be used (none in its metadata, or one that
    /// is not `https` on its own origin): its tokens stay valid until they expire.
    NotOffered,
    /// Revoking was not asked for (`--no-revoke`).
    NotAsked,
    /// It was asked and did not revoke them; why.
    Failed(String),
}

impl TokenCache {
    /// Signs out of the server at `url` (as given to `proxy --url`): every sign-in kept for it,
    /// whichever issuer, is revoked where its issuer offers it (when `revoke`), then forgotten.
    /// `ca_certs` are trusted besides the system's roots, as `proxy --ca-cert` does;
    /// `client_secret` is the secret of a client registered beforehand (which the cache does
    /// not keep), for a sign-in made as that client; `revoking(server, issuer)` is told before
    /// each authorization server is asked, since that can take a while.
    pub async fn sign_out(
        &self,
        url: &str,
        ca_certs: &[PathBuf],
        client_secret: Option<&str>,
        revoke: bool,
        mut revoking: impl FnMut(&str, &str),
    ) -> Result<Vec<SignedOut>, CacheError> {
        let mut out = Vec::new();
        for (path, grant) in self.kept_for(url)? {
            let server = url::Url::parse(&grant.server)
                .map(|u| shown_url(&u))
                .unwrap_or_else(|_| "?".into());
            let revoked = if !revoke {
                Revoked::NotAsked
            } else if grant.revocation_endpoint.is_none() {
                Revoked::NotOffered
            } else {
                revoking(&server, &grant.issuer);
                match revoke_at_issuer(&grant, ca_certs, client_secret).await {
                    Ok(()) => Revoked::Yes,
                    Err(why) => Revoked::Failed(redacted(&why, &grant, client_secret)),
                }
            };
            remove(&path)?;
            out.push(SignedOut {
                server,
                issuer: grant.issuer,
                revoked,
            });
        }
        Ok(out)
    }
}

/// Revokes `grant`'s refresh token, then its access token, at its revocation endpoint.
async fn revoke_at_issuer(
    grant: &Grant,
    ca_certs: &[PathBuf],
    configured: Option<&str>,
) -> Result<(), String> {
    let endpoint = grant
        .revocation_endpoint
        .as_deref()
        .ok_or("no revocation endpoint")?;
    let server = url::Url::parse(&grant.server).map_err(|e| e.to_string())?;
    let parsed = url::Url::parse(endpoint).map_err(|e| e.to_string())?;
    // Checked when it was found; a cache file edited since is checked again, with the same
    // rule: the refresh token and the client's secret go to the issuer's own origins alone.
    if !on_its_own_origins(&parsed, &grant.issuer, &grant.token_endpoint) {
        return Err(format!(
            "its revocation endpoint {} is on neither its own origin nor its token endpoint's",
            shown_url(&parsed)
        ));
    }
    let fetch = Arc::new(Fetch::new(ca_certs, &server).map_err(|e| e.to_string())?);
    fetch.allowed(&parsed).map_err(|e| e.to_string())?;
    let client = authenticated(
        BasicClient::new(ClientId::new(grant.client_id.clone()))
            .set_revocation_url(RevocationUrl::from_url(parsed)),
        grant.client_secret.as_deref().or(configured),
        &grant.auth_method,
    );
    let http = fetch::for_oauth2(&fetch);
    let mut refresh_revoked = false;
    if let Some(refresh) = &grant.refresh_token {
        let token = StandardRevocableToken::RefreshToken(RefreshToken::new(refresh.clone()));
        client
            .revoke_token(token)
            .map_err(|e| e.to_string())?
            .request_async(&http)
            .await
            .map_err(|e| format!("revoking the refresh token: {}", token_error(&e)))?;
        refresh_revoked = true;
    }
    let token = StandardRevocableToken::AccessToken(AccessToken::new(grant.access_token.clone()));
    match client
        .revoke_token(token)
        .map_err(|e| e.to_string())?
        .request_async(&http)
        .await
    {
        Ok(()) => Ok(()),
        // RFC 7009 §2.1: revoking a refresh token should end the access tokens of its grant
        // too; a server that revokes refresh tokens only says `unsupported_token_type` for
        // the access token, which is then no failure.
        Err(RequestTokenError::ServerResponse(r))
            if refresh_revoked
                && *r.error() == oauth2::RevocationErrorResponseType::UnsupportedTokenType =>
        {
            Ok(())
        }
        Err(e) => Err(format!("revoking the access token: {}", token_error(&e))),
    }
}

/// `why`, with none of `grant`'s secrets in it (an authorization server may echo them).
fn redacted(why: &str, grant: &Grant, configured: Option<&str>) -> String {
    let mut out = shown(why);
    let secrets = [
        Some(&grant.access_token),
        grant.refresh_token.as_ref(),
        grant.client_secret.as_ref(),
    ];
    let configured = configured.map(str::to_owned);
    for secret in secrets.into_iter().flatten().chain(configured.as_ref()) {
        if secret.len() >= 8 {
            out = out.replace(secret.as_str(), "[redacted]");
        }
    }
    out
}

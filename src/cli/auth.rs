//! `fsbroker auth`: the sign-ins kept for remote servers (`proxy --url`), listed, or signed
//! out of (revoked and forgotten).
//! Nothing here prints a token.

use std::path::PathBuf;
use std::process::ExitCode;

use fsbroker::transport::proxy::{Revoked, TokenCache, invisible};

/// `fsbroker auth list`.
pub(super) fn list() -> ExitCode {
    let cache = match TokenCache::default_location() {
        Ok(c) => c,
        Err(e) => return failed(&e.to_string()),
    };
    let kept = match cache.list() {
        Ok(k) => k,
        Err(e) => return failed(&e.to_string()),
    };
    if kept.is_empty() {
        println!("no sign-ins kept (in {})", cache.dir().display());
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<40}  {:<30}  {:<20}  EXPIRES",
        "SERVER", "SIGNED IN AT", "SCOPES"
    );
    for k in kept {
        let expires = match k.expires_at {
            Some(at) => match at.duration_since(std::time::SystemTime::now()) {
                Ok(left) => format!("in {} min", left.as_secs() / 60),
                Err(_) => "expired".to_owned(),
            },
            None => "not said".to_owned(),
        };
        let refresh = if k.refreshable { ", refreshable" } else { "" };
        let scopes = if k.scopes.is_empty() {
            "-".to_owned()
        } else {
            k.scopes.join(" ")
        };
        println!(
            "{:<40}  {:<30}  {:<20}  {expires}{refresh}",
            printable(&k.server),
            printable(&k.issuer),
            printable(&scopes)
        );
    }
    ExitCode::SUCCESS
}

/// `fsbroker auth logout URL`: revoked where the issuer offers it (`revoke`), forgotten here.
pub(super) fn logout(
    url: &str,
    ca_certs: &[PathBuf],
    client_secret_env: Option<&str>,
    revoke: bool,
) -> ExitCode {
    let cache = match TokenCache::default_location() {
        Ok(c) => c,
        Err(e) => return failed(&e.to_string()),
    };
    let client_secret = match client_secret_env.map(std::env::var) {
        None => None,
        Some(Ok(secret)) => Some(secret),
        Some(Err(_)) => {
            return failed(&format!(
                "the environment variable {} (--oauth-client-secret-env) is not set",
                client_secret_env.unwrap_or_default()
            ));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return failed(&format!("cannot start: {e}")),
    };
    let secret = client_secret.as_deref();
    let signed_out =
        runtime.block_on(
            cache.sign_out(url, ca_certs, secret, revoke, |server, issuer| {
                eprintln!(
                    "fsbroker: asking {} to revoke the sign-in to {}…",
                    printable(issuer),
                    printable(server)
                );
            }),
        );
    let signed_out = match signed_out {
        Ok(s) => s,
        Err(e) => return failed(&e.to_string()),
    };
    if signed_out.is_empty() {
        eprintln!("fsbroker: no sign-in kept for {url} (`fsbroker auth list` shows them)");
        return ExitCode::FAILURE;
    }
    let mut code = ExitCode::SUCCESS;
    for s in signed_out {
        let (server, issuer) = (printable(&s.server), printable(&s.issuer));
        match s.revoked {
            Revoked::Yes => println!("signed out of {server}: {issuer} revoked its tokens"),
            Revoked::NotAsked => {
                println!("forgot the sign-in to {server} (not revoked at {issuer}: --no-revoke)")
            }
            Revoked::NotOffered => println!(
                "forgot the sign-in to {server}; {issuer} offers no revocation endpoint fsbroker may use (RFC 7009: https, on its own origin), so its tokens stay valid there until they expire"
            ),
            Revoked::Failed(why) => {
                eprintln!(
                    "fsbroker: {issuer} did not revoke the sign-in to {server}: {}; it is forgotten here all the same, and its tokens stay valid there until they expire",
                    printable(&why)
                );
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

fn failed(why: &str) -> ExitCode {
    eprintln!("fsbroker: {why}");
    ExitCode::FAILURE
}

/// A server-made string (an issuer, a scope) with `?` for each character that would not show
/// as itself: a control would forge another row, and the invisible ones reorder or hide text.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if invisible(c) { '?' } else { c })
        .collect()
}

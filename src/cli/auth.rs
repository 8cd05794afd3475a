//! `fsbroker auth`: the sign-ins kept for remote servers (`proxy --url`), listed or forgotten.
//! Nothing here prints a token.

use std::process::ExitCode;

use fsbroker::transport::proxy::TokenCache;

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

/// `fsbroker auth logout URL`.
pub(super) fn logout(url: &str) -> ExitCode {
    let cache = match TokenCache::default_location() {
        Ok(c) => c,
        Err(e) => return failed(&e.to_string()),
    };
    match cache.logout(url) {
        Ok(0) => {
            eprintln!("fsbroker: no sign-in kept for {url} (`fsbroker auth list` shows them)");
            ExitCode::FAILURE
        }
        Ok(n) => {
            println!(
                "forgot {n} sign-in{} to {url}",
                if n == 1 { "" } else { "s" }
            );
            ExitCode::SUCCESS
        }
        Err(e) => failed(&e.to_string()),
    }
}

fn failed(why: &str) -> ExitCode {
    eprintln!("fsbroker: {why}");
    ExitCode::FAILURE
}

/// A server-made string (an issuer, a scope) without control characters, which would forge
/// another row, nor the invisible ones that reorder or hide text (bidi controls, zero-width
/// characters).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            let invisible = matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}' | '\u{061C}');
            if c.is_control() || invisible { '?' } else { c }
        })
        .collect()
}

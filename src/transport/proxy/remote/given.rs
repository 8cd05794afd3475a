//! The remote server as it was given: how its URL is shown (without what may be a key), and
//! why what was given may be refused ([`RemoteError`]). Beneath everything else of `remote/`.

use std::path::PathBuf;

/// Why a remote server cannot be used as given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The URL is not an `http` or `https` URL.
    #[error("--url {url}: {reason}")]
    Url {
        /// The URL as given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// A header the proxy will not send (its value is never shown).
    #[error("header {name:?}: {reason}")]
    Header {
        /// The header's name.
        name: String,
        /// Why it is refused.
        reason: String,
    },
    /// `--header-env NAME=VAR` names a variable that is not set (or not UTF-8).
    #[error("--header-env {name}={var}: the environment variable {var} is not set (or not UTF-8)")]
    MissingVar {
        /// The header's name.
        name: String,
        /// The variable.
        var: String,
    },
    /// A `--ca-cert` file that cannot be used.
    #[error("--ca-cert {}: {reason}", path.display())]
    CaCert {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// TLS could not be set up.
    #[error("TLS: {0}")]
    Tls(String),
}

/// The URL as messages show it: without its query or fragment, which some services use for
/// a key (`?api_key=…`); `?…` says one was there.
pub(super) fn shown_url(url: &url::Url) -> String {
    let mut shown = url.clone();
    let hidden = shown.query().is_some() || shown.fragment().is_some();
    shown.set_query(None);
    shown.set_fragment(None);
    let mut text = shown.to_string();
    if hidden {
        text.push_str("?…");
    }
    text
}

/// A URL as given on the command line, for an error that refuses it: without its query and
/// fragment (`?…`) or credentials (`user:password@`), and at most 200 characters, since it may
/// not even parse.
pub(super) fn shown_given(url: &str) -> String {
    let (bare, hidden) = match url.split_once(['?', '#']) {
        Some((before, _)) => (before, true),
        None => (url, false),
    };
    let bare = match bare.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => bare.to_owned(),
    };
    let mut shown: String = bare.chars().take(200).collect();
    if shown.len() < bare.len() {
        shown.push('…');
    }
    if hidden {
        shown.push_str("?…");
    }
    shown
}

/// A server-made string, as the proxy shows it: no control characters, nor the invisible
/// ones that reorder or hide text on a terminal (bidi controls, zero-width characters), at
/// most 300 chars.
pub(super) fn shown(text: &str) -> String {
    text.chars()
        .filter(|&c| !c.is_control() && !invisible(c))
        .take(300)
        .collect()
}

/// Bidi embeddings, overrides and isolates, and zero-width characters.
fn invisible(c: char) -> bool {
    matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}' | '\u{061C}')
}

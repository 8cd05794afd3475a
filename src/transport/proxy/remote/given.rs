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

/// A server-made string, as the proxy shows it: no character that would not show as itself
/// ([`invisible`]), at most 300 chars.
pub(super) fn shown(text: &str) -> String {
    text.chars().filter(|&c| !invisible(c)).take(300).collect()
}

/// Whether a character in a server's text would not show as itself, and so could forge or
/// hide words on a terminal, in a log or before a model: controls (C0, C1), format characters
/// (bidi controls, zero-width characters, the soft hyphen, tag characters, which a model
/// reads and a person does not see), line and paragraph separators, private-use and
/// unassigned code points, and the letters and symbols that draw nothing (Hangul fillers, the
/// blank Braille pattern, variation selectors, the combining grapheme joiner, the object
/// replacement character).
pub fn invisible(c: char) -> bool {
    use unicode_properties::{GeneralCategory as G, UnicodeGeneralCategory};
    matches!(
        c.general_category(),
        G::Control
            | G::Format
            | G::LineSeparator
            | G::ParagraphSeparator
            | G::PrivateUse
            | G::Unassigned
            | G::Surrogate
    ) || matches!(
        c,
        '\u{034F}'
            | '\u{115F}'
            | '\u{1160}'
            | '\u{17B4}'
            | '\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2800}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{FFFC}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_hides_or_reorders_text_is_not_shown() {
        let hidden = [
            '\u{1B}',
            '\u{9B}',
            '\u{7F}',
            '\u{202E}',
            '\u{2066}',
            '\u{200B}',
            '\u{200F}',
            '\u{FEFF}',
            '\u{061C}',
            '\u{2028}',
            '\u{2029}',
            '\u{00AD}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{FFF9}',
            '\u{1D173}',
            '\u{180E}',
            '\u{206A}',
            '\u{3164}',
            '\u{115F}',
            '\u{FFA0}',
            '\u{2800}',
            '\u{034F}',
            '\u{FE0F}',
            '\u{E0100}',
            '\u{FFFC}',
            '\u{17B4}',
            '\u{E000}',
            '\u{F0000}',
            '\u{0378}',
        ];
        for c in hidden {
            assert!(invisible(c), "U+{:04X} is shown", u32::from(c));
        }
        let text = "plain é д 中 → 😀 ~!@#$%^&*()_+ and spaces";
        assert_eq!(shown(text), text, "visible text is kept whole");
        let hostile: String = hidden.iter().collect();
        assert_eq!(shown(&format!("a{hostile}b")), "ab");
    }
}

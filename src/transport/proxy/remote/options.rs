//! What `proxy --url` is given: the remote server's URL, the user's headers (checked, and
//! never shown), private CAs and the `files/read` cap ([`RemoteOptions`]), and why they may be
//! refused ([`RemoteError`]). The public face of `remote/`.

use std::path::PathBuf;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};

use super::auth::SignIn;
use super::given::{RemoteError, shown_given, shown_url};

/// A remote MCP server to relay to (`proxy --url`), with the headers every request carries.
///
/// Header values never appear in logs or errors (its `Debug` names the headers only).
///
/// ```
/// use fsbroker::transport::proxy::RemoteOptions;
///
/// let remote = RemoteOptions::new("https://mcp.example.com/mcp")?
///     .header("X-Team", "blue")?
///     .max_chunk(1 << 20);
/// assert_eq!(remote.url(), "https://mcp.example.com/mcp");
/// // The protocol's own headers cannot be replaced.
/// assert!(RemoteOptions::new("https://mcp.example.com/mcp")?.header("Mcp-Session-Id", "x").is_err());
/// # Ok::<(), fsbroker::transport::proxy::RemoteError>(())
/// ```
pub struct RemoteOptions {
    pub(super) url: url::Url,
    pub(super) headers: HeaderMap,
    pub(super) ca_certs: Vec<PathBuf>,
    pub(super) max_chunk: Option<u64>,
    pub(super) sign_in: Option<SignIn>,
}

impl std::fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("url", &shown_url(&self.url))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("ca_certs", &self.ca_certs)
            .field("max_chunk", &self.max_chunk)
            .field("sign_in", &self.sign_in)
            .finish()
    }
}

impl RemoteOptions {
    /// The server at `url` (`http://` or `https://`; a plain `http` URL to a host other than
    /// loopback is allowed, with a warning: its headers travel in the clear).
    pub fn new(url: &str) -> Result<RemoteOptions, RemoteError> {
        let bad = |reason: &str| RemoteError::Url {
            url: shown_given(url),
            reason: reason.to_owned(),
        };
        let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        match parsed.scheme() {
            "https" => {}
            "http" => {
                let loopback = match parsed.host() {
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    Some(url::Host::Domain(d)) => d == "localhost",
                    None => false,
                };
                if !loopback {
                    tracing::warn!(
                        url = %shown_url(&parsed),
                        "plain http to a remote host: the headers (a token) travel in the clear"
                    );
                }
            }
            _ => return Err(bad("only http:// and https:// URLs are supported")),
        }
        if parsed.host().is_none() {
            return Err(bad("no host"));
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(bad(
                "credentials in the URL are not sent; use --header-env Authorization=VAR",
            ));
        }
        Ok(RemoteOptions {
            url: parsed,
            headers: HeaderMap::new(),
            ca_certs: Vec::new(),
            max_chunk: None,
            sign_in: None,
        })
    }

    /// Adds a header to every request (`--header NAME:VALUE`). Names the protocol sets
    /// (`Content-Type`, `Accept`, `Mcp-Session-Id`, `MCP-Protocol-Version`, `Mcp-Method`,
    /// `Mcp-Name`, `Last-Event-ID`, `Host`, `Content-Length`, `Transfer-Encoding`,
    /// `Connection`) and line breaks are refused.
    pub fn header(mut self, name: &str, value: &str) -> Result<RemoteOptions, RemoteError> {
        let (name, value) = user_header(name, value)?;
        self.headers.append(name, value);
        Ok(self)
    }

    /// Adds a header whose value is the environment variable `var`, read now
    /// (`--header-env NAME=VAR`): a secret stays out of the command line.
    pub fn header_from_env(self, name: &str, var: &str) -> Result<RemoteOptions, RemoteError> {
        let value = std::env::var(var).map_err(|_| RemoteError::MissingVar {
            name: name.to_owned(),
            var: var.to_owned(),
        })?;
        self.header(name, &value)
    }

    /// Trusts the certificates of a PEM file (a private CA) besides the system's roots.
    pub fn ca_cert(mut self, path: PathBuf) -> RemoteOptions {
        self.ca_certs.push(path);
        self
    }

    /// Caps the `length` of the server's `files/read` requests (`--max-chunk-size`), so
    /// that the broker's answers fit the server's body limit from the first.
    pub fn max_chunk(mut self, bytes: u64) -> RemoteOptions {
        self.max_chunk = Some(bytes.max(1));
        self
    }

    /// Signs in when the server answers 401 (MCP authorization): the person signs in in a
    /// browser, and the token is kept for the next start. Not used when an `Authorization`
    /// header is given (the user's own token is sent as it is).
    pub fn sign_in(mut self, sign_in: SignIn) -> RemoteOptions {
        self.sign_in = Some(sign_in);
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    /// The server's URL as logs and errors show it: its query and fragment, which may carry a
    /// key (`?api_key=…`), as `?…`.
    pub fn shown_url(&self) -> String {
        shown_url(&self.url)
    }
}

/// Headers the protocol itself sets (or HTTP framing needs): a user's `--header` may not
/// replace them, or the session, the era and the message's framing would be the user's guess.
pub(super) const RESERVED: &[&str] = &[
    "content-type",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
];

/// A user's header, checked: a token name, a value without CR, LF or NUL, and not one the
/// protocol sets. Errors name the header, never its value.
pub(super) fn user_header(
    name: &str,
    value: &str,
) -> Result<(HeaderName, HeaderValue), RemoteError> {
    let bad = |reason: &str| RemoteError::Header {
        name: name.to_owned(),
        reason: reason.to_owned(),
    };
    if name.bytes().any(|b| b == b'\r' || b == b'\n')
        || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
    {
        return Err(bad("a header may not contain a line break"));
    }
    let parsed = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| bad("not a valid header name"))?;
    if RESERVED.contains(&parsed.as_str()) {
        return Err(bad(
            "the proxy sets this header itself (the protocol's own headers, and HTTP framing, cannot be replaced)",
        ));
    }
    let mut value = HeaderValue::from_str(value.trim())
        .map_err(|_| bad("the value has bytes a header may not carry"))?;
    value.set_sensitive(true);
    Ok((parsed, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_url_is_shown_without_its_secrets() {
        for given in [
            "http://user:pw-SECRET@127.0.0.1:99999/mcp?api_key=SECRET",
            "ftp://127.0.0.1/mcp#SECRET",
        ] {
            let shown = shown_given(given);
            assert!(
                !shown.contains("SECRET") && shown.ends_with("?…") == given.contains(['?', '#']),
                "{given:?} became {shown:?}"
            );
        }
        assert!(shown_given(&"x".repeat(70_000)).chars().count() <= 201);
    }
}

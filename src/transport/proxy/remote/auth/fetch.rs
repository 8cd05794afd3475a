//! The sign-in's own HTTP: metadata documents, the registration and the token endpoint, over
//! the proxy's client (rustls, HTTP/1.1). Every URL is `https`, or `http` on loopback; no
//! redirect is followed (a 3xx is an error naming it), and every response is bounded in
//! size and time. It is also the HTTP client the `oauth2` crate is given.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};

use super::super::client::{self, chain};
use super::super::given::{RemoteError, shown_url};
use crate::limits::{SIGN_IN_BODY, SIGN_IN_FETCH};

/// Why a request of the sign-in got no usable response.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    /// Plain `http` to a host that is not loopback.
    #[error(
        "{url}: an authorization server must use https (plain http is allowed on loopback only)"
    )]
    NotHttps {
        /// The URL refused.
        url: String,
    },
    /// A loopback address named by a server that is not itself on loopback.
    #[error(
        "{url}: a loopback address, named by a server that is not on this machine: refused (its metadata would reach this machine's own services)"
    )]
    Local {
        /// The URL refused.
        url: String,
    },
    /// Not an `http`/`https` URL at all.
    #[error("{url}: not an http or https URL")]
    Scheme {
        /// The URL refused.
        url: String,
    },
    /// A 3xx: the sign-in follows no redirect (a code or a token would go where it leads).
    #[error(
        "{url} answered HTTP {status} (a redirect); redirects are not followed when signing in"
    )]
    Redirect {
        /// The URL asked.
        url: String,
        /// Its status.
        status: u16,
    },
    /// No connection, or no whole response within [`SIGN_IN_FETCH`].
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// Why.
        reason: String,
    },
    /// A body longer than [`SIGN_IN_BODY`].
    #[error("{url} sent a response longer than {SIGN_IN_BODY} bytes")]
    TooLarge {
        /// The URL asked.
        url: String,
    },
}

/// The sign-in's HTTP client.
pub(super) struct Fetch {
    client: client::Client,
    /// Whether the MCP server is on loopback: only then may what it names be too.
    local: bool,
}

impl Fetch {
    /// A client trusting the system's roots and `ca_certs`, as the proxy's own does.
    pub(super) fn new(
        ca_certs: &[std::path::PathBuf],
        server: &url::Url,
    ) -> Result<Fetch, RemoteError> {
        Ok(Fetch {
            client: client::new(ca_certs)?,
            local: is_loopback(server),
        })
    }

    /// Whether the sign-in may talk to `url` ([`allowed`], for this server).
    pub(super) fn allowed(&self, url: &url::Url) -> Result<(), FetchError> {
        allowed(url, self.local)
    }

    /// Sends `request` to an `https` URL (or `http` on loopback) and reads its whole response.
    pub(super) async fn request(
        &self,
        request: Request<Vec<u8>>,
    ) -> Result<Response<Vec<u8>>, FetchError> {
        let url = url::Url::parse(&request.uri().to_string()).map_err(|_| FetchError::Scheme {
            url: request.uri().to_string(),
        })?;
        self.allowed(&url)?;
        let shown = shown_url(&url);
        let (parts, body) = request.into_parts();
        let request = Request::from_parts(parts, Full::new(Bytes::from(body)));
        let whole = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|e| FetchError::Unreachable {
                        url: shown.clone(),
                        reason: chain(&e),
                    })?;
            let status = response.status();
            if status.is_redirection() {
                return Err(FetchError::Redirect {
                    url: shown.clone(),
                    status: status.as_u16(),
                });
            }
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, SIGN_IN_BODY)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<http_body_util::LengthLimitError>()
                        .is_some()
                    {
                        FetchError::TooLarge { url: shown.clone() }
                    } else {
                        FetchError::Unreachable {
                            url: shown.clone(),
                            reason: format!("the response broke off: {e}"),
                        }
                    }
                })?
                .to_bytes();
            Ok(Response::from_parts(parts, body.to_vec()))
        };
        match tokio::time::timeout(SIGN_IN_FETCH, whole).await {
            Ok(outcome) => outcome,
            Err(_) => Err(FetchError::Unreachable {
                url: shown,
                reason: format!("no whole response within {}s", SIGN_IN_FETCH.as_secs()),
            }),
        }
    }

    /// A JSON document at `url` (a GET): `Ok(None)` for a 4xx (not there), an error for
    /// anything else that is not a success or not JSON.
    pub(super) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        url: &url::Url,
    ) -> Result<Option<T>, String> {
        let request = Request::get(url.as_str())
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let response = self.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        if status.is_client_error() {
            return Ok(None);
        }
        if status != StatusCode::OK {
            return Err(format!(
                "{} answered HTTP {}",
                shown_url(url),
                status.as_u16()
            ));
        }
        serde_json::from_slice(response.body())
            .map(Some)
            .map_err(|e| format!("{} is not the JSON document expected: {e}", shown_url(url)))
    }
}

/// A token request's response on its way, as `oauth2` awaits it.
type Pending = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Vec<u8>>, FetchError>> + Send>,
>;

/// The client `oauth2` sends its token requests through: `fetch`'s rules hold for them too.
pub(super) fn for_oauth2(fetch: &Arc<Fetch>) -> impl Fn(Request<Vec<u8>>) -> Pending + use<> {
    let fetch = Arc::clone(fetch);
    move |request| {
        let fetch = Arc::clone(&fetch);
        Box::pin(async move { fetch.request(request).await })
    }
}

/// Whether the sign-in may talk to `url`: `https`, or `http` to a loopback host; and a
/// loopback host only when the MCP server is one too (`local`), so that a remote server's
/// metadata cannot turn the proxy against this machine's own services.
pub(super) fn allowed(url: &url::Url, local: bool) -> Result<(), FetchError> {
    let loopback = is_loopback(url);
    match url.scheme() {
        "https" | "http" if loopback && !local => Err(FetchError::Local {
            url: shown_url(url),
        }),
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        "http" => Err(FetchError::NotHttps {
            url: shown_url(url),
        }),
        _ => Err(FetchError::Scheme {
            url: shown_url(url),
        }),
    }
}

/// Whether `url`'s host is a loopback address (or `localhost`).
pub(super) fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_on_loopback() {
        for ok in [
            "https://as.example/",
            "http://127.0.0.1:9/token",
            "http://[::1]/",
            "http://localhost:3001/",
        ] {
            assert!(allowed(&url::Url::parse(ok).unwrap(), true).is_ok(), "{ok}");
        }
        for no in [
            "http://as.example/",
            "http://127.0.0.1.nip.io/",
            "http://10.0.0.1/",
            "ftp://127.0.0.1/",
        ] {
            assert!(
                allowed(&url::Url::parse(no).unwrap(), true).is_err(),
                "{no}"
            );
        }
        // A remote server's metadata may not name this machine.
        for no in [
            "http://127.0.0.1:9/token",
            "https://localhost/",
            "https://[::1]/",
        ] {
            assert!(
                allowed(&url::Url::parse(no).unwrap(), false).is_err(),
                "{no}"
            );
        }
        assert!(allowed(&url::Url::parse("https://as.example/").unwrap(), false).is_ok());
    }
}

//! The HTTP client every request to a remote server and its authorization server goes
//! through: rustls (the ring provider) over hyper, HTTP/1.1, trusting the system's roots and
//! the user's `--ca-cert` files; no redirect is followed and no connection kept.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::given::RemoteError;
use crate::limits::REMOTE_CONNECT;

/// The client.
pub(super) type Client =
    hyper_util::client::legacy::Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client trusting the system's roots and `ca_certs` (PEM files).
pub(super) fn new(ca_certs: &[PathBuf]) -> Result<Client, RemoteError> {
    let tls = tls_config(ca_certs)?;
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(REMOTE_CONNECT));
    tcp.set_nodelay(true);
    // The scheme is checked by the TLS connector, which takes both.
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    // hyper's client follows no redirect: a 3xx is reported as it is, so the user's headers
    // (a token) never go to another origin.
    // No connection is kept for the next request: a kept one the server closes (its idle
    // timeout, a stream it cut) just as it is taken fails the request after it was sent, and
    // a POST is not safe to send twice (a tool call would run twice). A new connection per
    // message costs a handshake; the messages that matter are large.
    Ok(
        hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector),
    )
}

/// An error and its causes, as one line (hyper's own says only "client error (Connect)").
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// rustls with the ring provider, trusting the system's roots and the given PEM files.
fn tls_config(ca_certs: &[PathBuf]) -> Result<rustls::ClientConfig, RemoteError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "a system root certificate could not be loaded");
    }
    let (added, _) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, "system root certificates");
    for path in ca_certs {
        let bad = |reason: String| RemoteError::CaCert {
            path: path.clone(),
            reason,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in it".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RemoteError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

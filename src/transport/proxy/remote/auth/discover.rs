//! Finding where to sign in: the 401's (or 403's) `WWW-Authenticate: Bearer` challenge, the
//! server's protected resource metadata (RFC 9728) and its authorization server's metadata
//! (RFC 8414, or OpenID discovery), each checked before anything is sent to what it names.

pub(super) use super::super::given::shown;
use super::super::given::shown_url;
use super::SignInError;
use super::fetch::Fetch;

/// What a `WWW-Authenticate: Bearer` challenge says.
#[derive(Debug, Default, Clone)]
pub(super) struct Challenge {
    /// `error` (`invalid_token`, `insufficient_scope`).
    pub(super) error: Option<String>,
    /// `scope`: the scopes the request needs.
    pub(super) scope: Option<String>,
    /// `resource_metadata`: where the server's metadata is.
    pub(super) resource_metadata: Option<String>,
}

impl Challenge {
    /// The `Bearer` challenge in a `WWW-Authenticate` value (RFC 6750 §3: auth-params, their
    /// values tokens or quoted strings); none when it names no `Bearer` scheme.
    pub(super) fn parse(header: &str) -> Option<Challenge> {
        let at = header.to_ascii_lowercase().find("bearer")?;
        let mut rest = &header[at + "bearer".len()..];
        let mut out = Challenge::default();
        loop {
            rest = rest.trim_start_matches([' ', '\t', ',']);
            let Some(eq) = rest.find('=') else { break };
            let name = rest[..eq].trim().to_ascii_lowercase();
            // A name with a blank in it is the next challenge's scheme: this one ended.
            if name.contains([' ', '\t']) {
                break;
            }
            rest = rest[eq + 1..].trim_start();
            let value = if let Some(quoted) = rest.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = quoted.len();
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, next)) = chars.next() {
                                value.push(next);
                            }
                        }
                        '"' => {
                            end = i + 1;
                            break;
                        }
                        c => value.push(c),
                    }
                }
                rest = &quoted[end.min(quoted.len())..];
                value
            } else {
                let end = rest.find([',', ' ', '\t']).unwrap_or(rest.len());
                let value = rest[..end].to_owned();
                rest = &rest[end..];
                value
            };
            match name.as_str() {
                "error" => out.error = Some(value),
                "scope" => out.scope = Some(value),
                "resource_metadata" => out.resource_metadata = Some(value),
                _ => {}
            }
        }
        Some(out)
    }

    /// The scopes the challenge names.
    pub(super) fn scopes(&self) -> Vec<String> {
        words(self.scope.as_deref())
    }
}

/// What signing in to the server needs: its authorization server, checked.
#[derive(Debug, Clone)]
pub(super) struct Discovered {
    /// The authorization server's issuer, as its metadata states it (and checked against the
    /// URL the metadata came from).
    pub(super) issuer: String,
    pub(super) metadata: AsMetadata,
    /// The resource tokens are asked for (RFC 8707): the server's, as its metadata names it.
    pub(super) resource: String,
    /// The scopes to ask for: the challenge's, else the server's `scopes_supported`.
    pub(super) scopes: Vec<String>,
}

/// RFC 9728 protected resource metadata (the members the sign-in uses).
#[derive(Debug, serde::Deserialize)]
struct ProtectedResource {
    resource: String,
    #[serde(default)]
    authorization_servers: Vec<String>,
    #[serde(default)]
    scopes_supported: Vec<String>,
}

/// RFC 8414 authorization server metadata (the members the sign-in uses).
#[derive(Debug, Clone, serde::Deserialize)]
pub(super) struct AsMetadata {
    pub(super) issuer: String,
    pub(super) authorization_endpoint: String,
    pub(super) token_endpoint: String,
    #[serde(default)]
    pub(super) registration_endpoint: Option<String>,
    #[serde(default)]
    pub(super) code_challenge_methods_supported: Vec<String>,
    #[serde(default)]
    pub(super) scopes_supported: Vec<String>,
    #[serde(default)]
    pub(super) token_endpoint_auth_methods_supported: Vec<String>,
    /// RFC 9207: the authorization response carries `iss`.
    #[serde(default)]
    pub(super) authorization_response_iss_parameter_supported: bool,
    /// RFC 7009: where `fsbroker auth logout` revokes the tokens. Kept only when it passes
    /// [`revocation_endpoint`]'s checks.
    #[serde(default)]
    pub(super) revocation_endpoint: Option<String>,
}

/// Finds and checks the authorization server of `server`, from `challenge` or the well-known
/// URLs (MCP authorization, 2025-06-18 and 2025-11-25); of several listed, `preferred` if it
/// is one of them.
pub(super) async fn discover(
    fetch: &Fetch,
    server: &url::Url,
    challenge: &Challenge,
    preferred: Option<&str>,
) -> Result<Discovered, SignInError> {
    let failed = |reason: String| SignInError::Discovery {
        server: shown_url(server),
        reason,
    };
    // The server's metadata: where its challenge says, else where RFC 9728 puts it (the
    // path-aware URL first, then the origin's).
    let mut candidates = Vec::new();
    if let Some(given) = &challenge.resource_metadata {
        let url = server
            .join(given)
            .map_err(|e| failed(format!("resource_metadata {given:?} is not a URL: {e}")))?;
        candidates.push(url);
    } else {
        candidates.extend(well_known(server, "oauth-protected-resource"));
    }
    let mut resource = None;
    for url in &candidates {
        fetch.allowed(url).map_err(|e| failed(e.to_string()))?;
        if let Some(found) = fetch
            .json::<ProtectedResource>(url)
            .await
            .map_err(|e| failed(format!("its resource metadata: {e}")))?
        {
            resource = Some(found);
            break;
        }
    }
    let (resource_id, issuer_url, mut scopes) = match resource {
        Some(found) => {
            let id = checked_resource(server, &found.resource).map_err(failed)?;
            // The one a client was registered with (--oauth-issuer) when the server lists it,
            // else its first.
            let same = |a: &String| {
                let parsed = |u: &str| url::Url::parse(u).ok();
                preferred.is_some_and(|p| parsed(p).is_some() && parsed(p) == parsed(a))
            };
            let listed = &found.authorization_servers;
            let Some(first) = listed.iter().find(|a| same(a)).or(listed.first()) else {
                return Err(failed(
                    "its resource metadata names no authorization server".into(),
                ));
            };
            let issuer = url::Url::parse(first)
                .map_err(|e| failed(format!("authorization server {first:?}: {e}")))?;
            (id, issuer, scope_tokens(found.scopes_supported))
        }
        // 2025-03-26: no resource metadata; the server's origin is its authorization server.
        None => {
            let mut origin = server.clone();
            origin.set_path("/");
            origin.set_query(None);
            origin.set_fragment(None);
            (canonical(server), origin, Vec::new())
        }
    };
    fetch
        .allowed(&issuer_url)
        .map_err(|e| failed(e.to_string()))?;
    let metadata = authorization_server(fetch, &issuer_url)
        .await
        .map_err(failed)?;
    // The challenge's scopes first: the request that met it needs them.
    let challenged = challenge.scopes();
    if !challenged.is_empty() {
        scopes = challenged;
    } else if scopes.is_empty() {
        scopes = scope_tokens(metadata.scopes_supported.clone());
    }
    Ok(Discovered {
        issuer: metadata.issuer.clone(),
        metadata,
        resource: resource_id,
        scopes,
    })
}

/// Whether `url` is on the origin of the authorization server `issuer` or of its token
/// endpoint: where a sign-in page may be (a mix-up's is another server's), and where a
/// revocation may send the tokens and the client's secret.
pub(super) fn on_its_own_origins(url: &url::Url, issuer: &str, token_endpoint: &str) -> bool {
    let origin = |u: &str| url::Url::parse(u).map(|u| u.origin()).ok();
    let at = Some(url.origin());
    at == origin(issuer) || at == origin(token_endpoint)
}

/// The metadata's revocation endpoint, if it may be used: `https` (RFC 7009 §2: the client
/// must check it is), on the issuer's origin or its token endpoint's, since the refresh token
/// and the client's secret go there, and they were only ever meant for that server. One that
/// fails is dropped, not a reason to refuse the sign-in: only signing out needs it, and it
/// then says the tokens were not revoked.
fn revocation_endpoint(metadata: &AsMetadata, issuer: &url::Url) -> Option<String> {
    let stated = metadata.revocation_endpoint.as_deref()?;
    let parsed = url::Url::parse(stated);
    let why = match &parsed {
        Err(e) => format!("not a URL: {e}"),
        Ok(u) if u.scheme() != "https" => "not https (RFC 7009 §2)".to_owned(),
        Ok(u) if !on_its_own_origins(u, issuer.as_str(), &metadata.token_endpoint) => {
            "on neither the issuer's origin nor its token endpoint's".to_owned()
        }
        Ok(u) => return Some(u.to_string()),
    };
    tracing::warn!(
        issuer = %shown_url(issuer),
        endpoint = %shown(stated),
        "the authorization server's revocation endpoint is not used ({why}): signing out will forget its tokens without revoking them"
    );
    None
}

/// The authorization server's metadata for `issuer` (RFC 8414 §3 and OpenID discovery, in
/// the order MCP 2025-11-25 gives), checked: its `issuer` is the URL it was found for, every
/// endpoint is `https` (or loopback), and it does PKCE with S256.
async fn authorization_server(fetch: &Fetch, issuer: &url::Url) -> Result<AsMetadata, String> {
    let path = issuer.path().trim_end_matches('/');
    let at = |suffix: &str| {
        let mut url = issuer.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.set_path(suffix);
        url
    };
    let mut urls = vec![at(&format!(
        "/.well-known/oauth-authorization-server{path}"
    ))];
    urls.push(at(&format!("/.well-known/openid-configuration{path}")));
    if !path.is_empty() {
        urls.push(at(&format!("{path}/.well-known/openid-configuration")));
    }
    for url in urls {
        let Some(mut metadata) = fetch
            .json::<AsMetadata>(&url)
            .await
            .map_err(|e| format!("its authorization server's metadata: {e}"))?
        else {
            continue;
        };
        // RFC 8414 §3.3: the issuer must be the one the metadata was asked for, or a server
        // could name another's endpoints as its own.
        let stated = url::Url::parse(&metadata.issuer).map_err(|e| {
            format!(
                "the authorization server's metadata at {} states an issuer that is not a URL: {e}",
                shown_url(&url)
            )
        })?;
        if stated != *issuer {
            return Err(format!(
                "the authorization server's metadata at {} states the issuer {}, not {}: refused (RFC 8414 §3.3)",
                shown_url(&url),
                shown(&metadata.issuer),
                shown_url(issuer)
            ));
        }
        // Kept as parsed: the text as written may carry what a URL drops (line breaks, tabs)
        // into every log line that names the issuer.
        metadata.issuer = stated.to_string();
        for (name, endpoint) in [
            (
                "authorization_endpoint",
                Some(&metadata.authorization_endpoint),
            ),
            ("token_endpoint", Some(&metadata.token_endpoint)),
            (
                "registration_endpoint",
                metadata.registration_endpoint.as_ref(),
            ),
        ] {
            let Some(endpoint) = endpoint else { continue };
            let parsed = url::Url::parse(endpoint)
                .map_err(|e| format!("its {name} {:?} is not a URL: {e}", shown(endpoint)))?;
            fetch
                .allowed(&parsed)
                .map_err(|e| format!("its {name}: {e}"))?;
        }
        // A mix-up (RFC 9207 §1): metadata of its own naming another server's sign-in page
        // and its own token endpoint, so that the code a person gets at the honest page, and
        // this process's PKCE verifier, are sent to it. The page must be on the issuer's origin
        // or the token endpoint's.
        let page = url::Url::parse(&metadata.authorization_endpoint);
        if !page.is_ok_and(|p| on_its_own_origins(&p, stated.as_str(), &metadata.token_endpoint)) {
            return Err(format!(
                "the authorization server {}'s sign-in page ({}) is on neither its own origin nor its token endpoint's: refused, the code from that page would go to another server",
                shown_url(issuer),
                shown(&metadata.authorization_endpoint)
            ));
        }
        metadata.revocation_endpoint = revocation_endpoint(&metadata, &stated);
        if !metadata
            .code_challenge_methods_supported
            .iter()
            .any(|m| m == "S256")
        {
            return Err(format!(
                "the authorization server {} does not list PKCE with S256 (code_challenge_methods_supported), which MCP requires",
                shown_url(issuer)
            ));
        }
        return Ok(metadata);
    }
    Err(format!(
        "no authorization server metadata found for {} (RFC 8414 or OpenID discovery)",
        shown_url(issuer)
    ))
}

/// RFC 9728's well-known URLs for `server`: with its path inserted, then at its origin.
fn well_known(server: &url::Url, name: &str) -> Vec<url::Url> {
    let path = server.path().trim_end_matches('/');
    let mut out = Vec::new();
    for suffix in [
        format!("/.well-known/{name}{path}"),
        format!("/.well-known/{name}"),
    ] {
        let mut url = server.clone();
        url.set_query(None);
        url.set_fragment(None);
        url.set_path(&suffix);
        if !out.contains(&url) {
            out.push(url);
        }
    }
    out
}

/// The `resource` a server's metadata states, checked against the server itself (RFC 9728
/// §3.3): its origin, and its path the server's or a whole-segment prefix of it. Any other
/// would have the person sign in for, and the proxy then hold, a token for another resource.
fn checked_resource(server: &url::Url, stated: &str) -> Result<String, String> {
    let refused = || {
        format!(
            "its resource metadata names the resource {}, which is not this server ({}): refused, a token for it must not be sent here (RFC 9728 §3.3)",
            shown(stated),
            shown_url(server)
        )
    };
    let parsed = url::Url::parse(stated).map_err(|_| refused())?;
    if parsed.origin() != server.origin()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
        || !parsed.username().is_empty()
        || parsed.password().is_some()
    {
        return Err(refused());
    }
    let theirs = parsed.path().trim_end_matches('/');
    let ours = server.path().trim_end_matches('/');
    let prefix = theirs.is_empty()
        || ours == theirs
        || ours
            .strip_prefix(theirs)
            .is_some_and(|rest| rest.starts_with('/'));
    if !prefix {
        return Err(refused());
    }
    // Sent as parsed (dot segments resolved, the host as a URL reads it), never as written:
    // an authorization server that compares resources as text must see what was checked.
    Ok(parsed.to_string())
}

/// The server's URL as a resource indicator: without its fragment.
fn canonical(server: &url::Url) -> String {
    let mut url = server.clone();
    url.set_fragment(None);
    url.to_string()
}

/// Space-separated scopes (only the well-formed ones: [`scope_tokens`]).
pub(super) fn words(text: Option<&str>) -> Vec<String> {
    scope_tokens(
        text.unwrap_or_default()
            .split_ascii_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// The scopes that are RFC 6749 §3.3 scope-tokens (printable ASCII but blank, `"` and `\`):
/// a server-made scope with anything else (a control character, an escape sequence) would
/// reach logs and the console; it is dropped, with a warning.
pub(super) fn scope_tokens(scopes: Vec<String>) -> Vec<String> {
    let token = |s: &String| {
        !s.is_empty()
            && s.chars()
                .all(|c| c == '!' || ('#'..='[').contains(&c) || (']'..='~').contains(&c))
    };
    let (ok, bad): (Vec<String>, Vec<String>) = scopes.into_iter().partition(token);
    if !bad.is_empty() {
        tracing::warn!(
            dropped = bad.len(),
            "scopes that are not well-formed (RFC 6749 §3.3) were dropped"
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bearer_challenge() {
        let c = Challenge::parse(
            r#"Bearer error="insufficient_scope", scope="files:read files:write", resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp""#,
        )
        .unwrap();
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scopes(), ["files:read", "files:write"]);
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("https://a.example/.well-known/oauth-protected-resource/mcp")
        );
        let c = Challenge::parse(r#"Basic realm="x", Bearer error=invalid_token, scope="a\"b""#)
            .unwrap();
        assert_eq!(c.error.as_deref(), Some("invalid_token"));
        assert_eq!(c.scope.as_deref(), Some("a\"b"));
        assert!(Challenge::parse("Basic realm=x").is_none());
        // An escape sequence in a scope never reaches a log: the scope is dropped.
        let c = Challenge::parse("Bearer scope=\"ok \u{1b}]52;c;x\u{7} a\\b\"").unwrap();
        assert_eq!(c.scopes(), ["ok", "ab"]);
    }

    #[test]
    fn a_resource_must_be_this_server() {
        let server = url::Url::parse("https://mcp.example/team/mcp").unwrap();
        for ok in [
            "https://mcp.example/team/mcp",
            "https://mcp.example/team/",
            "https://mcp.example/",
            "https://mcp.example",
        ] {
            assert!(checked_resource(&server, ok).is_ok(), "{ok}");
        }
        for no in [
            "https://other.example/team/mcp",
            "http://mcp.example/team/mcp",
            "https://mcp.example:8443/team/mcp",
            "https://mcp.example/tea",
            "https://mcp.example/team/mcp/more",
            "https://mcp.example/team/mcp?x=1",
            "https://user@mcp.example/team/mcp",
            "not a url",
        ] {
            assert!(checked_resource(&server, no).is_err(), "{no}");
        }
    }

    #[test]
    fn the_well_known_urls_keep_the_path() {
        let server = url::Url::parse("https://mcp.example/team/mcp?k=1").unwrap();
        let urls: Vec<String> = well_known(&server, "oauth-protected-resource")
            .iter()
            .map(|u| u.to_string())
            .collect();
        assert_eq!(
            urls,
            [
                "https://mcp.example/.well-known/oauth-protected-resource/team/mcp",
                "https://mcp.example/.well-known/oauth-protected-resource"
            ]
        );
    }
}

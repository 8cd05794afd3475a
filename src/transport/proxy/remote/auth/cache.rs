//! The person's sign-ins, kept so that a later start signs in silently: one owner-only file
//! per server URL and issuer, in an owner-only folder of the user's private state directory
//! (`$XDG_STATE_HOME/fsbroker/sign-in`, else `~/.local/state/fsbroker/sign-in`).

// Ambient `std::fs` calls are allowed here (clippy.toml): the cache is the person's own
// folder, never a request path.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use super::super::given::shown_url;

/// A token cache that cannot be used: the folder's path and why.
#[derive(Debug, thiserror::Error)]
#[error("the sign-in cache {}: {reason}", path.display())]
pub struct CacheError {
    /// The folder or file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

/// What one sign-in left: the tokens, and where they came from and may go back to.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Grant {
    /// The server's URL as given (the only one its access token is sent to).
    pub(super) server: String,
    pub(super) issuer: String,
    /// Where its refresh token goes (the issuer's, as its metadata said when it was issued).
    pub(super) token_endpoint: String,
    /// Where signing out revokes its tokens (RFC 7009), if the issuer offered one that passed
    /// the checks.
    #[serde(default)]
    pub(super) revocation_endpoint: Option<String>,
    /// The resource the tokens were asked for (RFC 8707).
    pub(super) resource: String,
    pub(super) client_id: String,
    #[serde(default)]
    pub(super) client_secret: Option<String>,
    /// How the client proves itself at the token endpoint: `basic`, `post` or `none`.
    pub(super) auth_method: String,
    pub(super) access_token: String,
    #[serde(default)]
    pub(super) refresh_token: Option<String>,
    /// Seconds since the epoch.
    #[serde(default)]
    pub(super) expires_at: Option<u64>,
    #[serde(default)]
    pub(super) scopes: Vec<String>,
    /// Seconds since the epoch.
    pub(super) saved_at: u64,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("server", &self.server)
            .field("issuer", &self.issuer)
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

/// A cached sign-in as `fsbroker auth list` shows it: never a token or a secret.
#[derive(Debug, Clone)]
pub struct CachedSignIn {
    /// The server's URL, its query and fragment shown as `?…`.
    pub server: String,
    /// The authorization server that signed the person in.
    pub issuer: String,
    /// The scopes granted.
    pub scopes: Vec<String>,
    /// When the access token expires, if the authorization server said.
    pub expires_at: Option<SystemTime>,
    /// Whether a refresh token is kept (a later start may get a new access token silently).
    pub refreshable: bool,
}

/// The person's cached sign-ins.
#[derive(Debug, Clone)]
pub struct TokenCache {
    dir: PathBuf,
}

impl TokenCache {
    /// The cache in the user's private state directory.
    pub fn default_location() -> Result<TokenCache, CacheError> {
        match crate::rundir::sign_in_dir() {
            Some(dir) => Ok(TokenCache { dir }),
            None => Err(CacheError {
                path: PathBuf::from("~/.local/state/fsbroker/sign-in"),
                reason: "neither XDG_STATE_HOME nor HOME is set to an absolute path".into(),
            }),
        }
    }

    /// The cache in `dir`.
    pub fn at(dir: PathBuf) -> TokenCache {
        TokenCache { dir }
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every cached sign-in.
    pub fn list(&self) -> Result<Vec<CachedSignIn>, CacheError> {
        Ok(self
            .grants()?
            .into_iter()
            .map(|(_, g)| CachedSignIn {
                server: url::Url::parse(&g.server)
                    .map(|u| shown_url(&u))
                    .unwrap_or_else(|_| "?".into()),
                issuer: g.issuer,
                scopes: g.scopes,
                // Checked: a time past what `SystemTime` holds (an authorization server's
                // `expires_in` of 2^63 s and more) panicked `auth list`; it is shown as not
                // said (tests/sign_in_hostile.rs: an_expiry_past_the_end_of_time_is_no_crash).
                expires_at: g
                    .expires_at
                    .and_then(|s| UNIX_EPOCH.checked_add(std::time::Duration::from_secs(s))),
                refreshable: g.refresh_token.is_some(),
            })
            .collect())
    }

    /// Every sign-in kept for the server at `url` (whichever issuer), with its file.
    pub(super) fn kept_for(&self, url: &str) -> Result<Vec<(PathBuf, Grant)>, CacheError> {
        let wanted = url::Url::parse(url).map_err(|e| CacheError {
            path: self.dir.clone(),
            reason: format!("{url:?} is not a URL: {e}"),
        })?;
        Ok(self
            .grants()?
            .into_iter()
            .filter(|(_, g)| url::Url::parse(&g.server).is_ok_and(|s| s == wanted))
            .collect())
    }

    /// The latest sign-in to `server` whose token was asked for it.
    pub(super) fn load(&self, server: &url::Url) -> Result<Option<Grant>, CacheError> {
        Ok(self
            .grants()?
            .into_iter()
            .map(|(_, g)| g)
            .filter(|g| url::Url::parse(&g.server).is_ok_and(|s| s == *server))
            .max_by_key(|g| g.saved_at))
    }

    /// Keeps `grant`, replacing the one for its server and issuer.
    pub(super) fn save(&self, grant: &Grant) -> Result<(), CacheError> {
        self.folder(true)?;
        let path = self.dir.join(file_name(&grant.server, &grant.issuer));
        let bad = |reason: String| CacheError {
            path: path.clone(),
            reason,
        };
        let text = serde_json::to_vec_pretty(grant).map_err(|e| bad(e.to_string()))?;
        // Named as the cache's files are, so it is one of the broker's protected files too.
        let tmp = self.dir.join(format!(
            "{}.{}.tmp",
            file_name(&grant.server, &grant.issuer),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| bad(e.to_string()))?;
        let written = file
            .write_all(&text)
            .and_then(|()| file.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(bad(e.to_string()));
        }
        Ok(())
    }

    /// Forgets the sign-in to `server` at `issuer` (its tokens were refused for good).
    pub(super) fn forget(&self, server: &str, issuer: &str) -> Result<(), CacheError> {
        let path = self.dir.join(file_name(server, issuer));
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CacheError {
                path,
                reason: e.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Every readable grant and its file.
    fn grants(&self) -> Result<Vec<(PathBuf, Grant)>, CacheError> {
        if !self.folder(false)? {
            return Ok(Vec::new());
        }
        let entries = std::fs::read_dir(&self.dir).map_err(|e| CacheError {
            path: self.dir.clone(),
            reason: e.to_string(),
        })?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with(crate::rundir::SIGN_IN_FILE) || !name.ends_with(".json") {
                continue;
            }
            match read(&path) {
                Ok(grant) => out.push((path, grant)),
                Err(e) => tracing::warn!(error = %e, "a cached sign-in was skipped"),
            }
        }
        Ok(out)
    }

    /// Checks the folder (made, 0700, when `create`): a folder of this user's that no one else
    /// may enter. `false` when it does not exist and was not to be made.
    fn folder(&self, create: bool) -> Result<bool, CacheError> {
        let bad = |reason: String| CacheError {
            path: self.dir.clone(),
            reason,
        };
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .map_err(|e| bad(e.to_string()))?;
        }
        let meta = match std::fs::symlink_metadata(&self.dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(false),
            Err(e) => return Err(bad(e.to_string())),
        };
        if !meta.is_dir() {
            return Err(bad("not a folder (a link or a file is not used)".into()));
        }
        if meta.uid() != rustix::process::geteuid().as_raw() {
            return Err(bad(format!(
                "owned by user {}, not by this user: refused (it holds tokens)",
                meta.uid()
            )));
        }
        if meta.mode() & 0o077 != 0 {
            // Ours, but open to others: closed again before anything is read or written.
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| bad(format!("open to other users, and cannot be closed: {e}")))?;
        }
        Ok(true)
    }
}

/// One grant file: this user's, owner-only, not followed if a link.
fn read(path: &Path) -> Result<Grant, CacheError> {
    let bad = |reason: String| CacheError {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() || meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(bad("not a file of this user's".into()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "readable by other users (mode {:o}): not used",
            meta.mode() & 0o777
        )));
    }
    if meta.len() > 1 << 20 {
        return Err(bad("too large".into()));
    }
    let grant: Grant = serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| bad(format!("not a cached sign-in: {e}")))?;
    Ok(grant)
}

pub(super) fn remove(path: &Path) -> Result<(), CacheError> {
    std::fs::remove_file(path).map_err(|e| CacheError {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// The file of a server's sign-in at an issuer: a digest of both, so that neither shows.
fn file_name(server: &str, issuer: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(server.as_bytes());
    hash.update(b"\n");
    hash.update(issuer.as_bytes());
    let digest = hash.finalize();
    let mut name = String::from(crate::rundir::SIGN_IN_FILE);
    for b in &digest[..16] {
        use std::fmt::Write as _;
        let _ = write!(name, "{b:02x}");
    }
    name.push_str(".json");
    name
}

/// Now, in seconds since the epoch.
pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

//! `sha256` on a write (*ext*, the integrity extension): what it asks, read once, and the
//! error when the content is not what it names.

use crate::digest;
use crate::error::{Error, ErrorKind, Result};

/// What a write's `sha256` asks (*ext*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Check {
    /// Nothing.
    None,
    /// `true` on an upload's first chunk: hash the chunks as they come; the final chunk will
    /// bring the hash.
    Announced,
    /// The SHA-256 the committed content must have (lower-case hex).
    Expect(String),
}

impl Check {
    /// Reads `sha256` for a write with this `offset` and `final`, refusing what cannot be
    /// meant: a hash on a chunk that commits nothing, `true` where there is nothing to come.
    pub(super) fn parse(
        value: Option<serde_json::Value>,
        offset: Option<u64>,
        last: bool,
    ) -> Result<Check> {
        use serde_json::Value;
        let bad = |why: &str| Err(Error::invalid_params(format!("sha256: {why}")));
        match value {
            None | Some(Value::Bool(false)) | Some(Value::Null) => Ok(Check::None),
            Some(Value::Bool(true)) => match offset {
                Some(0) if !last => Ok(Check::Announced),
                Some(0) | None => bad(
                    "true announces a hash on an upload's first chunk; this write commits now, so give the hash itself (64 hex digits)",
                ),
                Some(_) => bad("true goes on an upload's first chunk (offset 0)"),
            },
            Some(Value::String(hex)) => {
                if !digest::is_sha256_hex(&hex) {
                    return bad("not a SHA-256: expected 64 hex digits");
                }
                if offset.is_some() && !last {
                    return bad(
                        "the hash of the whole upload goes on its final chunk (announce it with true on the first)",
                    );
                }
                Ok(Check::Expect(hex.to_ascii_lowercase()))
            }
            Some(_) => bad("expected true or 64 hex digits"),
        }
    }
}

/// The error for content whose hash is not the one given: nothing was committed.
pub(super) fn mismatch(bytes: u64, actual: &str, expected: &str, raw: &str) -> Error {
    Error::new(
        ErrorKind::ChecksumMismatch,
        format!(
            "the {bytes} bytes received hash to sha256 {actual}, not the {expected} given; nothing was written"
        ),
    )
    .with_path(raw)
}

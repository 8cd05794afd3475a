//! A request's line: what it records, and what it keeps out.
//!
//! File contents are never logged. Paths are, unless `redact_paths` asks for their sha256
//! instead. Everything a server chooses (a path, a method name, its own name, how many paths
//! it asks consent for) is capped as written, escapes counted, with the full length and a
//! digest beside a cut value: a line must stay small enough to be written, and copied, whole.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::AuditLog;
use super::chain::{Fields, sha256_hex};
pub use crate::limits::{MAX_LOGGED_PATH, MAX_LOGGED_PATHS, MAX_LOGGED_PATHS_BYTES};

/// What one request did, for its audit line.
#[derive(Debug, Clone, Default)]
pub struct Record<'a> {
    /// The session's number.
    pub session: u64,
    /// The JSON-RPC method.
    pub method: &'a str,
    /// The request's `path` (or `oldPath`).
    pub path: Option<&'a str>,
    /// A rename's `newPath`.
    pub new_path: Option<&'a str>,
    /// A consent request's `requestedPaths`.
    pub paths: Option<&'a [String]>,
    /// `ok`, or the error's code.
    pub outcome: &'a str,
    /// Payload bytes read or written.
    pub bytes: u64,
    /// How long the request took.
    pub duration: Duration,
    /// The MCP server's name, when its transport learnt it (its own `serverInfo.name`).
    pub server: Option<&'a str>,
    /// Refusals over the session's request rate folded into this line (`alsoRefused`): they
    /// came since the session's previous such line, and got no line of their own.
    pub also_refused: u64,
    /// The SHA-256 of the managed policy in force (`managedPolicySha256`), on a session's
    /// first line and on its first line after the managed policy changed.
    pub managed: Option<&'a str>,
}

impl AuditLog {
    /// The line's members for one request (before chaining).
    pub(super) fn line(&self, r: &Record<'_>) -> Fields {
        fields(r, self.redact)
    }
}

/// The members of a request's line (before chaining), paths replaced by their sha256 when
/// `redact`: what the audit log writes, and what a host's live view of the requests is
/// shown ([`crate::Broker::events`]), capped and redacted the same way.
pub(crate) fn fields(r: &Record<'_>, redact: bool) -> Fields {
    let mut fields: Fields = BTreeMap::new();
    fields.insert("ts", Value::from(crate::rfc3339::format(SystemTime::now())));
    fields.insert("session", Value::from(r.session));
    put_capped(
        &mut fields,
        ["method", "methodBytes", "methodDigest"],
        r.method,
        256,
    );
    let mut put_path = |keys: [&'static str; 3], hashed: &'static str, p: &str| {
        if redact {
            fields.insert(hashed, Value::from(sha256_hex(p.as_bytes())));
        } else {
            put_capped(&mut fields, keys, p, MAX_LOGGED_PATH);
        }
    };
    if let Some(p) = r.path {
        put_path(["path", "pathBytes", "pathDigest"], "pathSha256", p);
    }
    if let Some(p) = r.new_path {
        put_path(
            ["newPath", "newPathBytes", "newPathDigest"],
            "newPathSha256",
            p,
        );
    }
    if let Some(ps) = r.paths {
        // A server chooses how many paths it asks consent for, and how long: the line
        // keeps the first few (at most MAX_LOGGED_PATHS, and MAX_LOGGED_PATHS_BYTES of
        // them as written), the count and a digest of them all.
        let (key, list): (&str, Vec<Value>) = if redact {
            let kept = ps.iter().take(MAX_LOGGED_PATHS);
            (
                "pathsSha256",
                kept.map(|p| Value::from(sha256_hex(p.as_bytes())))
                    .collect(),
            )
        } else {
            let mut room = MAX_LOGGED_PATHS_BYTES;
            let mut list = Vec::new();
            for p in ps.iter().take(MAX_LOGGED_PATHS) {
                let kept = cap_escaped(p, MAX_LOGGED_PATH.min(room));
                if kept.is_empty() && !p.is_empty() {
                    break;
                }
                room -= escaped_len(kept);
                list.push(Value::from(kept));
            }
            ("paths", list)
        };
        let whole = list.len() == ps.len()
            && list
                .iter()
                .zip(ps)
                .all(|(kept, p)| redact || kept.as_str() == Some(p.as_str()));
        fields.insert(key, Value::from(list));
        if !whole {
            fields.insert("pathsCount", Value::from(ps.len()));
            let all = serde_json::to_vec(ps).unwrap_or_default();
            fields.insert("pathsDigest", Value::from(sha256_hex(&all)));
        }
    }
    if let Some(name) = r.server {
        put_capped(
            &mut fields,
            ["server", "serverBytes", "serverDigest"],
            name,
            256,
        );
    }
    if r.also_refused > 0 {
        fields.insert("alsoRefused", Value::from(r.also_refused));
    }
    if let Some(sha) = r.managed {
        fields.insert("managedPolicySha256", Value::from(sha));
    }
    fields.insert("outcome", Value::from(r.outcome));
    fields.insert("bytes", Value::from(r.bytes));
    fields.insert(
        "durationMs",
        Value::from((r.duration.as_secs_f64() * 1e6).round() / 1e3),
    );
    fields
}

/// The bytes `value` takes in a line once escaped: a control character is written as
/// `\u00XX`, six bytes for one, so a cut by the value's own length would let a server's
/// string grow sixfold in the log.
fn escaped_len(value: &str) -> usize {
    value.chars().map(escaped_char_len).sum()
}

fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        '\u{85}' | '\u{2028}' | '\u{2029}' => 6,
        c => c.len_utf8(),
    }
}

/// `value` cut where its escaped form reaches `max` bytes, at a character boundary.
fn cap_escaped(value: &str, max: usize) -> &str {
    let mut used = 0;
    for (i, c) in value.char_indices() {
        used += escaped_char_len(c);
        if used > max {
            return &value[..i];
        }
    }
    value
}

/// `value` cut to at most `max` bytes, at a character boundary.
pub fn cap(value: &str, max: usize) -> &str {
    if value.len() <= max {
        return value;
    }
    let mut end = max;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

/// Puts `value` under `keys[0]`, cut to `max` bytes as written (escapes counted): a server
/// decides how long its strings are, and a line must stay small enough to be written (and
/// copied) whole. A cut value comes
/// with its full length (`keys[1]`) and the sha256 of it all (`keys[2]`).
fn put_capped(fields: &mut Fields, keys: [&'static str; 3], value: &str, max: usize) {
    let kept = cap_escaped(value, max);
    fields.insert(keys[0], Value::from(kept));
    if kept.len() < value.len() {
        fields.insert(keys[1], Value::from(value.len()));
        fields.insert(keys[2], Value::from(sha256_hex(value.as_bytes())));
    }
}

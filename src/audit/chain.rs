//! How a line is chained: the one canonical form a line may have, and the hash over it.
//!
//! Everything that writes a line (a request's record, the broker's own lines, a roll-over)
//! and everything that checks one (`verify`, the copies) goes through these few functions, so
//! the form that is hashed is the form that is written, byte for byte.

use std::collections::BTreeMap;

use serde_json::Value;

/// A line's members, before it is chained.
pub(super) type Fields = BTreeMap<&'static str, Value>;

/// A line as written (without its newline) and its members.
pub(super) type Line = (Vec<u8>, Fields);

/// The `prev` of the first line.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// `fields` chained after `prev`: the line (canonical, no newline) and its members with
/// `prev` and `hash`.
pub(super) fn chain_line(prev: &str, mut fields: Fields) -> (Vec<u8>, Fields) {
    fields.insert("prev", Value::from(prev));
    let hash = sha256_hex(&canonical(&fields));
    fields.insert("hash", Value::from(hash));
    (canonical(&fields), fields)
}

/// Compact JSON with keys in byte order, U+0085, U+2028 and U+2029 escaped: the one form a
/// line may have, and what the hash covers (the line without its `hash` member).
///
/// JSON allows those characters raw, but JavaScript's and Python's line splitters end a line
/// at them, so a log read that way would show more lines than it has. They can only occur
/// inside strings, where their `\u` escapes mean the same.
pub(super) fn canonical<K: AsRef<str> + Ord + serde::Serialize>(
    fields: &BTreeMap<K, Value>,
) -> Vec<u8> {
    // A BTreeMap serializes its keys in order whatever serde_json's features are.
    let raw = serde_json::to_vec(fields).unwrap_or_default();
    escape_separators(raw)
}

/// Characters that some line splitters end a line at, besides `\n`: U+0085 (NEL), U+2028
/// and U+2029, with their JSON escapes. (serde_json escapes the C0 controls already.)
const SEPARATORS: [(&str, &[u8]); 3] = [
    ("\u{85}", b"\\u0085"),
    ("\u{2028}", b"\\u2028"),
    ("\u{2029}", b"\\u2029"),
];

/// Replaces the UTF-8 bytes of the [`SEPARATORS`] with their JSON escapes. Their UTF-8 forms
/// start with 0xC2 or 0xE2, lead bytes (never inside another character in valid UTF-8), so
/// only lines holding those are scanned closely.
fn escape_separators(raw: Vec<u8>) -> Vec<u8> {
    let hit = |rest: &[u8]| {
        SEPARATORS
            .iter()
            .find(|(c, _)| rest.starts_with(c.as_bytes()))
    };
    if !raw
        .iter()
        .enumerate()
        .any(|(i, &b)| (b == 0xC2 || b == 0xE2) && hit(&raw[i..]).is_some())
    {
        return raw;
    }
    let mut out = Vec::with_capacity(raw.len() + 16);
    let mut i = 0;
    while i < raw.len() {
        match hit(&raw[i..]) {
            Some((c, escaped)) => {
                out.extend_from_slice(escaped);
                i += c.len();
            }
            None => {
                out.push(raw[i]);
                i += 1;
            }
        }
    }
    out
}

pub(crate) use crate::digest::sha256_hex;

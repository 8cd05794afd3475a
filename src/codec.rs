//! Content encodings on the wire: UTF-8 text and base64.

use std::sync::LazyLock;

use base64::Engine;
use base64::engine::Simd;
use base64::engine::general_purpose::PAD;
use serde::{Deserialize, Deserializer};

/// The SIMD base64 engine (AVX2 or NEON when the CPU has it, scalar otherwise), detected once.
pub(crate) static BASE64: LazyLock<Simd> = LazyLock::new(|| Simd::standard(PAD));

/// How file bytes travel in a JSON string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Encoding {
    /// Text; JSON-escaped.
    #[default]
    Utf8,
    /// Standard base64 with padding.
    Base64,
}

impl Encoding {
    /// The name used on the wire.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Encoding::Utf8 => "utf-8",
            Encoding::Base64 => "base64",
        }
    }
}

impl<'de> Deserialize<'de> for Encoding {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<str>::deserialize(d)?;
        match s.to_ascii_lowercase().as_str() {
            "utf-8" | "utf8" => Ok(Encoding::Utf8),
            "base64" => Ok(Encoding::Base64),
            _ => Err(serde::de::Error::custom(format!(
                "unknown encoding {s:?}: expected \"utf-8\" or \"base64\""
            ))),
        }
    }
}

/// Appends the base64 of `data` to `out`, encoding in place (no intermediate string, no
/// JSON escaping pass: base64 never needs escaping).
pub(crate) fn base64_into(data: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    let Some(len) = base64::encoded_len(data.len(), true) else {
        return;
    };
    out.resize(start + len, 0);
    match BASE64.encode_slice(data, &mut out[start..]) {
        Ok(written) => out.truncate(start + written),
        // The slice was sized by `encoded_len`, so this cannot happen; keep the frame valid.
        Err(_) => out.truncate(start),
    }
}

/// Writes the base64 of `data` at the start of `out`; returns how many bytes it wrote (none
/// when `out` is too short, which callers rule out by sizing it with `encoded_len`).
pub(crate) fn base64_into_slice(data: &[u8], out: &mut [u8]) -> usize {
    BASE64.encode_slice(data, out).unwrap_or(0)
}

/// How much of `chunk` to send as UTF-8 text, or `None` to send it as base64.
///
/// A chunk that ends inside a character is shortened to the last whole character when more
/// of the file follows (`more`), so the next chunk starts on a boundary. Anything that is not
/// UTF-8 — or a chunk too short to hold a single whole character — goes as base64.
pub(crate) fn utf8_prefix(chunk: &[u8], more: bool) -> Option<usize> {
    match std::str::from_utf8(chunk) {
        Ok(_) => Some(chunk.len()),
        Err(e) if e.error_len().is_none() && more && e.valid_up_to() > 0 => Some(e.valid_up_to()),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_reference_engine() {
        for n in [0usize, 1, 2, 3, 31, 32, 33, 1000, 4097] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let mut out = b"x".to_vec();
            base64_into(&data, &mut out);
            assert_eq!(
                &out[1..],
                base64::engine::general_purpose::STANDARD
                    .encode(&data)
                    .as_bytes()
            );
        }
    }

    #[test]
    fn utf8_boundaries() {
        let s = "aé€😀".as_bytes(); // 1 + 2 + 3 + 4 bytes
        assert_eq!(utf8_prefix(s, false), Some(10));
        assert_eq!(utf8_prefix(&s[..2], true), Some(1)); // cut inside é
        assert_eq!(utf8_prefix(&s[..5], true), Some(3)); // cut inside €
        assert_eq!(utf8_prefix(&s[..2], false), None); // truncated at end of file: not UTF-8
        assert_eq!(utf8_prefix(&s[1..2], true), None); // not even one character fits
        assert_eq!(utf8_prefix(&s[2..], true), None); // starts inside a character
        assert_eq!(utf8_prefix(b"\xff\xfe", true), None);
    }
}

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

/// Input bytes decoded per step of [`base64_decode_in_place`] once the room allows: small
/// enough to stay in cache between the decoder's read and its write.
const IN_PLACE_BLOCK: usize = 64 << 10;

/// Decodes the base64 at `buf[src]` into the start of `buf`, and returns its length: the
/// decoded bytes are `buf[..n]`. `src` must start past the first byte or two.
///
/// Base64 decodes 4 bytes into 3, so the output, begun at 0, stays behind the input, begun at
/// `src.start`: each step decodes as many whole quads as the gap between them allows (the
/// output of a step must end before its input begins), and the gap grows by a quarter of each
/// step's input, so after a few dozen small steps every step is [`IN_PLACE_BLOCK`]. Only the
/// last step may hold padding, as in a decode of the whole. An error's byte offset is counted
/// from `src.start`.
pub(crate) fn base64_decode_in_place(
    buf: &mut [u8],
    src: std::ops::Range<usize>,
) -> Result<usize, base64::DecodeError> {
    use base64::DecodeError;
    let (mut out, mut at) = (0, src.start);
    while at < src.end {
        let quads = ((at - out) / 3).min(IN_PLACE_BLOCK / 4);
        if quads == 0 {
            // No gap yet (the content starts at the line's first bytes, which a request
            // never does): one quad through a stack buffer.
            let step = (src.end - at).min(4);
            let mut tmp = [0u8; 3];
            let n = BASE64
                .decode_slice(&buf[at..at + step], &mut tmp)
                .map_err(|e| shift(slice_error(e), at - src.start))?;
            buf[out..out + n].copy_from_slice(&tmp[..n]);
            (out, at) = (out + n, at + step);
            continue;
        }
        let step = (src.end - at).min(quads * 4);
        let (written, unread) = buf.split_at_mut(at);
        let n = BASE64
            .decode_slice(&unread[..step], &mut written[out..])
            .map_err(|e| shift(slice_error(e), at - src.start))?;
        (out, at) = (out + n, at + step);
        if n != step / 4 * 3 && at < src.end {
            // Padding ended a step that is not the last: bytes follow the padding.
            return Err(DecodeError::InvalidByte(at - src.start, buf[at]));
        }
    }
    return Ok(out);

    fn slice_error(e: base64::DecodeSliceError) -> DecodeError {
        match e {
            base64::DecodeSliceError::DecodeError(e) => e,
            // The output slice is the whole gap, at least 3 bytes per quad of input.
            base64::DecodeSliceError::OutputSliceTooSmall => DecodeError::InvalidLength(0),
        }
    }

    fn shift(e: DecodeError, by: usize) -> DecodeError {
        match e {
            DecodeError::InvalidByte(at, b) => DecodeError::InvalidByte(at + by, b),
            DecodeError::InvalidLastSymbol {
                offset,
                symbol,
                symbol_value,
            } => DecodeError::InvalidLastSymbol {
                offset: offset + by,
                symbol,
                symbol_value,
            },
            DecodeError::InvalidLength(n) => DecodeError::InvalidLength(n + by),
            other => other,
        }
    }
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
    fn in_place_decoding_matches_a_whole_decode() {
        for n in [0usize, 1, 2, 3, 4, 5, 47, 48, 1000, 4097, 200_000, 300_001] {
            let data: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
            let text = BASE64.encode(&data);
            for gap in [1usize, 2, 3, 11, 100] {
                let mut buf = vec![b'{'; gap];
                buf.extend_from_slice(text.as_bytes());
                buf.extend_from_slice(b"\"}");
                let got = base64_decode_in_place(&mut buf, gap..gap + text.len());
                assert_eq!(got, Ok(n), "n {n}, gap {gap}");
                assert!(buf[..n] == data[..], "n {n}, gap {gap}");
            }
        }
    }

    #[test]
    fn in_place_decoding_refuses_what_a_whole_decode_refuses() {
        let good = BASE64.encode((0..100_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let bad_at = |at: usize, b: u8| {
            let mut t = good.clone().into_bytes();
            t[at] = b;
            t
        };
        let cases: Vec<Vec<u8>> = vec![
            bad_at(70_000, b'"'),
            bad_at(5, b'\\'),
            bad_at(65_536, b'='),
            bad_at(133_331, b'*'),
            format!("{good}A").into_bytes(),
            good.as_bytes()[..good.len() - 1].to_vec(),
            b"QQ==QQ==".to_vec(),
            b"Q".to_vec(),
        ];
        for text in cases {
            let whole = BASE64.decode(&text);
            let mut buf = b"{\"content\":\"".to_vec();
            let start = buf.len();
            buf.extend_from_slice(&text);
            let got = base64_decode_in_place(&mut buf, start..start + text.len());
            assert!(whole.is_err(), "the reference refuses it");
            assert!(
                got.is_err(),
                "refused in place too: {:?}",
                &text[..text.len().min(20)]
            );
            if let (
                Err(base64::DecodeError::InvalidByte(w, _)),
                Err(base64::DecodeError::InvalidByte(g, _)),
            ) = (&whole, &got)
            {
                assert_eq!(w, g, "the offset is the content's");
            }
        }
    }

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

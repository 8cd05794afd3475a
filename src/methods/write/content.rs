//! A write's content, from the request to bytes: where it is (lifted out of a long line
//! before parsing, or as parsed), what serde_json would have refused of it, and its decoding
//! (UTF-8 or base64), in place in the line's own buffer when it was lifted.

use base64::Engine;

use super::Ctx;
use crate::buffers::{Content, Line};
use crate::codec::{self, BASE64, Encoding};
use crate::error::{Error, ErrorKind, Result};
use crate::jsonrpc;

/// The content as sent: lifted out of the request line before parsing (`jsonrpc::lift`)
/// when it was long, else as parsed. Text is valid UTF-8 either way.
pub(super) fn content_of<'p, 'a: 'p>(
    ctx: &Ctx<'a>,
    parsed: &'p str,
    encoding: Encoding,
) -> Result<Content<'p>> {
    let lifted = ctx.lifted.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(lifted) = lifted else {
        return Ok(Content::Borrowed(parsed.as_bytes()));
    };
    if parsed != jsonrpc::placeholder() {
        // What was lifted is another member (one named `content` in `_meta`): it is checked
        // as the whole line would have been, so that no line passes with a string serde_json
        // would have refused.
        check_text(lifted.bytes())
            .map_err(|why| Error::new(ErrorKind::ParseError, format!("not valid JSON: {why}")))?;
        return Ok(Content::Borrowed(parsed.as_bytes()));
    }
    // Base64 decoding refuses any byte outside its alphabet; text is checked here.
    if matches!(encoding, Encoding::Utf8) {
        check_text(lifted.bytes())
            .map_err(|why| Error::invalid_params(format!("content: {why}")))?;
    }
    Ok(lifted)
}

/// What serde_json checks of a string without escapes: UTF-8, and no raw control character.
fn check_text(text: &[u8]) -> std::result::Result<(), String> {
    let text = simdutf8::compat::from_utf8(text)
        .map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    match text.bytes().position(|b| b < 0x20) {
        Some(at) => Err(format!(
            "control character (U+{:04X}) at byte {at} must be escaped",
            text.as_bytes()[at]
        )),
        None => Ok(()),
    }
}

/// A chunk's decoded bytes: in the request line's own buffer (decoded in place), or in a
/// buffer of their own.
#[derive(Debug)]
pub(super) enum Data {
    /// `line[..len]`.
    InLine(Line, usize),
    Own(Vec<u8>),
}

impl std::ops::Deref for Data {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Data::InLine(line, len) => &line[..*len],
            Data::Own(bytes) => bytes,
        }
    }
}

/// About how many bytes `content` decodes to (base64: up to 2 fewer, for padding).
pub(super) fn decoded_estimate(content: &Content<'_>, encoding: Encoding) -> usize {
    let sent = content.bytes().len();
    match encoding {
        Encoding::Utf8 => sent,
        Encoding::Base64 => sent / 4 * 3,
    }
}

/// The payload as bytes, refused before decoding when it cannot fit `max_chunk_size`.
pub(super) fn decode(
    content: Content<'_>,
    encoding: Encoding,
    max: usize,
    raw: &str,
) -> Result<Data> {
    let too_big = |n: usize| {
        Error::new(
            ErrorKind::QuotaExceeded,
            format!("payload of {n} bytes is over max_chunk_size ({max})"),
        )
        .with_path(raw)
    };
    let estimate = decoded_estimate(&content, encoding);
    if estimate > max + 3 {
        return Err(too_big(estimate));
    }
    let not_base64 =
        |e: base64::DecodeError| Error::invalid_params(format!("content is not valid base64: {e}"));
    let data = match (content, encoding) {
        (Content::Owned(mut line, range), Encoding::Utf8) => {
            line.copy_within(range.clone(), 0);
            Data::InLine(line, range.len())
        }
        (Content::Owned(mut line, range), Encoding::Base64) => {
            let n = codec::base64_decode_in_place(&mut line, range).map_err(not_base64)?;
            Data::InLine(line, n)
        }
        (Content::Borrowed(text), Encoding::Utf8) => Data::Own(text.to_vec()),
        (Content::Borrowed(text), Encoding::Base64) => {
            Data::Own(BASE64.decode(text).map_err(not_base64)?)
        }
    };
    if data.len() > max {
        return Err(too_big(data.len()));
    }
    Ok(data)
}

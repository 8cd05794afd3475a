//! How the loosest reader a host might use reads a line, so that no reading of a server's
//! line hands the host a request that is the broker's.
//!
//! The proxy cannot know which JSON reader its host uses, and some are lenient: they match
//! member names and methods case-insensitively (with Unicode's case folding), stop a name at
//! a NUL, repair broken JSON, replace or drop bytes that are not UTF-8, index handlers with an
//! array. A line the proxy's strict reader rejects or reads one way may still read as
//! `roots/list` to such a host. So every question "does this name a method of the broker's
//! (or the proxy's own)?" is asked here, of every reading at once:
//!
//! - this file: one name or one string literal, read each lenient way ([`lenient_name`],
//!   [`string_readings`]);
//! - `id.rs`: a request id as the peers might take it ([`RequestId`]): two ids any reader
//!   could take for one are one;
//! - `messages.rs`: a line's messages at their top level (their methods, their ids), by
//!   scans no line can escape;
//! - `inputs.rs`: the input requests of an `input_required` result, at any depth.

mod id;
mod inputs;
mod messages;

pub(crate) use id::RequestId;
pub(crate) use inputs::input_claims;
#[cfg(test)]
pub(super) use messages::id_filter;
pub(super) use messages::names_broker_method;
pub(crate) use messages::{any_message, lenient_envelope, message_methods};

/// Whether a method is the broker's to answer ([`crate::methods::is_broker_method`]), as a
/// lenient reader might dispatch it ([`lenient_name`]): a host that matches methods loosely
/// must never get one of the broker's.
pub(crate) fn is_broker_method(method: &str) -> bool {
    crate::methods::is_broker_method(&lenient_name(method))
}

/// The start of the methods of the proxy's own control messages to a shared broker
/// (`notifications/fsbroker/peer`): a server's own messages under it are never passed on, to
/// the host or to the broker.
pub(crate) const CONTROL_PREFIX: &str = "notifications/fsbroker/";

/// Whether a method is one of the proxy's own control messages ([`CONTROL_PREFIX`]), read as
/// leniently as [`is_broker_method`].
pub(crate) fn is_control_method(method: &str) -> bool {
    lenient_name(method).starts_with(CONTROL_PREFIX)
}

/// A method name (or a member name) as the loosest reader might take it: cut at the first
/// NUL (a C string ends there), trimmed, and case-folded ([`fold_case`]). No legitimate name
/// differs from its lenient name only in these ways, so reading loosely costs nothing but the
/// hostile lines.
pub(super) fn lenient_name(method: &str) -> std::borrow::Cow<'_, str> {
    let cut = method.split('\0').next().unwrap_or_default().trim();
    if cut.bytes().all(|b| b.is_ascii() && !b.is_ascii_uppercase()) {
        std::borrow::Cow::Borrowed(cut)
    } else {
        std::borrow::Cow::Owned(fold_case(cut))
    }
}

/// `text` with every letter that any case-insensitive reader equates with an ASCII letter
/// made that letter, in lower case: ASCII by itself; `K` (Kelvin) and `İ` by their lower case
/// (JavaScript, Python, .NET's `ToLowerInvariant`); `ı`, `ſ` and ligatures such as `ﬁ` by
/// their upper case (.NET's `OrdinalIgnoreCase` compares upper cases: `"ı"` is `"i"` to it).
/// Other characters stay as they are.
fn fold_case(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_lowercase());
            continue;
        }
        let lower: String = c.to_lowercase().collect();
        if lower.is_ascii() {
            out.push_str(&lower);
            continue;
        }
        let upper: String = c.to_uppercase().collect();
        if upper.is_ascii() {
            out.push_str(&upper.to_ascii_lowercase());
            continue;
        }
        // A simple mapping that keeps a mark in the full one (`İ` → `i̇`): the letter.
        match lower.chars().next().filter(char::is_ascii_alphabetic) {
            Some(letter) => out.push(letter),
            None => out.push(c),
        }
    }
    out
}

/// Whether a method is the broker's or the proxy's own: never the host's.
pub(super) fn is_claimed(method: &str) -> bool {
    is_broker_method(method) || is_control_method(method)
}

/// Just past the end of the string whose opening quote is at `start` (or the line's end).
fn string_end(line: &[u8], start: usize) -> usize {
    // Every line from the server is scanned: long strings (a file's content) are skipped
    // a word at a time, from quote to quote. A quote ends the string unless an odd number of
    // backslashes stands before it (each backslash escapes the byte after it); the runs
    // counted back lie between consecutive quotes, so the scan stays linear.
    let body = start + 1;
    let mut i = body;
    while let Some(at) = line.get(i..).and_then(|rest| memchr::memchr(b'"', rest)) {
        let quote = i + at;
        let backslashes = line[body..quote]
            .iter()
            .rev()
            .take_while(|&&b| b == b'\\')
            .count();
        if backslashes % 2 == 0 {
            return quote + 1;
        }
        i = quote + 1;
    }
    line.len()
}

/// A JSON string literal as written (from its opening quote), decoded each way a lenient
/// reader may: bytes that are not UTF-8 and lone surrogates as U+FFFD, and as nothing.
fn string_readings(literal: &[u8]) -> [String; 2] {
    let body = literal.get(1..).unwrap_or_default();
    let replaced = String::from_utf8_lossy(body);
    let dropped: String = body.utf8_chunks().map(|c| c.valid()).collect();
    [
        json_string(&mut replaced.chars(), false),
        json_string(&mut dropped.chars(), true),
    ]
}

/// The rest of a JSON string literal whose opening quote was just read, decoded; stops after
/// the closing quote or at the end of the text. A lone surrogate becomes U+FFFD, or nothing
/// when `drop`.
fn json_string(chars: &mut std::str::Chars, drop: bool) -> String {
    decode_escapes(chars, drop, true)
}

/// `chars` with JSON's escapes decoded, up to and past a closing quote when `quote_ends`
/// (else to the end). A lone surrogate becomes U+FFFD, or nothing when `drop`.
fn decode_escapes(chars: &mut std::str::Chars, drop: bool, quote_ends: bool) -> String {
    let mut out = String::new();
    let lone = |out: &mut String| {
        if !drop {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    };
    let mut high: Option<u32> = None;
    while let Some(c) = chars.next() {
        let unit = match c {
            '"' if quote_ends => break,
            '\\' => match chars.next() {
                Some('u') => {
                    let hex: String = chars.by_ref().take(4).collect();
                    match u32::from_str_radix(&hex, 16) {
                        Ok(u) => Some(u),
                        Err(_) => {
                            lone(&mut out);
                            continue;
                        }
                    }
                }
                Some(e) => {
                    let c = match e {
                        'b' => '\u{8}',
                        'f' => '\u{c}',
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        other => other,
                    };
                    if high.take().is_some() {
                        lone(&mut out);
                    }
                    out.push(c);
                    continue;
                }
                None => break,
            },
            c => {
                if high.take().is_some() {
                    lone(&mut out);
                }
                out.push(c);
                continue;
            }
        };
        let Some(u) = unit else { continue };
        match (high.take(), u) {
            (Some(h), 0xDC00..=0xDFFF) => {
                let c = 0x10000 + ((h - 0xD800) << 10) + (u - 0xDC00);
                out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
            }
            (h, 0xD800..=0xDBFF) => {
                if h.is_some() {
                    lone(&mut out);
                }
                high = Some(u);
            }
            (h, u) => {
                if h.is_some() {
                    lone(&mut out);
                }
                match char::from_u32(u) {
                    Some(c) => out.push(c),
                    None => lone(&mut out),
                }
            }
        }
    }
    if high.is_some() {
        lone(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_end_at_their_first_unescaped_quote() {
        // The scan that stops at every backslash and skips the byte after it.
        fn reference(line: &[u8], start: usize) -> usize {
            let mut i = start + 1;
            while i < line.len() {
                match line[i] {
                    b'"' => return i + 1,
                    b'\\' => i += 2,
                    _ => i += 1,
                }
            }
            line.len()
        }
        let alphabet = [b'"', b'\\', b'a', 0xff];
        let mut checked = 0;
        for len in 0..=8u32 {
            for n in 0..4usize.pow(len) {
                let mut line = vec![b'"'];
                line.extend((0..len).map(|k| alphabet[n / 4usize.pow(k) % 4]));
                assert_eq!(string_end(&line, 0), reference(&line, 0), "{line:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 87381);
        assert_eq!(string_end(br#"x "a\\\"b" y"#, 2), 10);
    }

    #[test]
    fn names_are_folded_as_case_insensitive_readers_fold_them() {
        assert_eq!(lenient_name("Roots/L\u{131}st"), "roots/list");
        assert_eq!(lenient_name(" \u{17f}\u{130}"), "si");
        assert_eq!(
            lenient_name("notifications/fsbro\u{212a}er/x"),
            "notifications/fsbroker/x"
        );
        assert_eq!(lenient_name("\u{fb01}les/read"), "files/read");
        assert_eq!(lenient_name("caf\u{e9}"), "caf\u{e9}");
        assert!(is_broker_method("\u{fb01}les/read\u{0}x"));
    }
}

//! One meaning of "the same request id": [`RequestId`], an id as the loosest of the peers'
//! readers might take it (docs/protocol.md, "Request ids").
//!
//! Every filter of the proxy that pairs one message with another by id (an answer with its
//! request, a cancellation with the request it cancels) compares `RequestId`s and nothing
//! else. A filter that took two ids for different ones while the host takes them for one
//! would let the host have what the filter was there to keep from it: a second answer to one
//! of its requests, or the cancellation of a request it never saw. So two ids are one
//! whenever any reader a peer may use could take one for the other, and the rule errs that
//! way: taking two ids for one that no reader confuses costs an honest peer nothing, since no
//! honest peer writes one id two ways.

use std::fmt;

use icu_properties::CodePointMapData;
use icu_properties::props::GeneralCategory;
use serde_json::Value;
use serde_json::value::RawValue;

use super::decode_escapes;

/// A JSON-RPC request id, read so that two ids are equal (`==`, and one key of a map)
/// whenever any reader a peer may use could take one for the other:
///
/// - A number is its value as a double, correctly rounded, as JavaScript reads JSON: `1`,
///   `1.0`, `1e0` and `10e-1` are one id, and so are `9007199254740993` and
///   `9007199254740992`; `-0` is `0`; beyond the doubles' range, ±infinity. A lenient
///   reader's numbers count too (`+1`, `.5`, `0x1F`, `Infinity`).
/// - A string is the number it reads as, when a reader that pairs answers by number reads it
///   as one: JavaScript's `Number()` (the TypeScript SDK pairs an answer with its request by
///   `Number(id)`: blanks around it ignored, `""` is `0`, `"1.0"`, `"1e0"`, `"0x1"`,
///   `"Infinity"`) or Python's `int()` (the Python SDK's `coerce_request_id`: a sign, decimal
///   digits of any script, `_` between them). So `"1"`, `" 1 "`, `"0x1"`, `"١"` and `1` are
///   one id.
/// - Any other string is its decoded text with what lenient readers drop or replace taken
///   out: cut at a NUL (a C string ends there), without lone surrogates, bytes that are not
///   UTF-8, or U+FFFD (one reader's replacement is another's nothing). `"\u0061"` is `"a"`.
/// - Anything else (`null`, `true`, an array, an object) is no id.
///
/// Unlike lsp-server's `RequestId`, where `92` and `"92"` differ, they are one id here: both
/// MCP SDKs take them for one when they pair an answer with their request.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct RequestId(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    /// A number, or a string that reads as one: the double's bits (`-0` made `0`).
    Number(u64),
    /// Any other string, as every lenient reader would leave it.
    Text(Box<str>),
}

impl RequestId {
    /// An id as written in a message (a JSON number or string literal, blanks around it
    /// allowed); `None` when it is no id. Read leniently: a lenient reader's number (`+1`,
    /// `0x1F`, `Infinity`) is a number, and a string's bytes that are not UTF-8 and its lone
    /// surrogates are read the ways lenient readers read them.
    pub(crate) fn parse(written: &[u8]) -> Option<RequestId> {
        let written = written.trim_ascii();
        if written.first() == Some(&b'"') {
            // Bytes that are not UTF-8 go, as a reader that drops them reads them; one that
            // replaces them reads U+FFFD, which `of_text` takes out as well.
            let text: String = written[1..].utf8_chunks().map(|c| c.valid()).collect();
            let decoded = decode_escapes(&mut text.chars(), true, true);
            return Some(RequestId::of_text(&decoded));
        }
        if written.is_empty() {
            return None;
        }
        let token = std::str::from_utf8(written).ok()?;
        js_number(token).map(RequestId::number)
    }

    /// An id as a parser kept it ([`RequestId::parse`] of its text).
    pub(crate) fn of_raw(raw: &RawValue) -> Option<RequestId> {
        RequestId::parse(raw.get().as_bytes())
    }

    /// An id as serde_json read it: a string by its text, a number by its value.
    pub(crate) fn of_value(value: &Value) -> Option<RequestId> {
        match value {
            Value::String(text) => Some(RequestId::of_text(text)),
            // serde_json reads integers exactly and other numbers as the nearest double
            // (`float_roundtrip`); either way, the nearest double is the value.
            Value::Number(n) => n.as_f64().map(RequestId::number),
            _ => None,
        }
    }

    /// A string id, by its decoded text.
    pub(crate) fn of_text(text: &str) -> RequestId {
        let cut = text.split('\0').next().unwrap_or_default();
        let text: String = cut
            .chars()
            .filter(|&c| c != char::REPLACEMENT_CHARACTER)
            .collect();
        match number_in(&text) {
            Some(value) => RequestId::number(value),
            None => RequestId(Repr::Text(text.into())),
        }
    }

    fn number(value: f64) -> RequestId {
        // `-0.0 == 0.0`: both are `0` (a JavaScript `Map`, a Python `dict` take them for one).
        let value = if value == 0.0 { 0.0 } else { value };
        RequestId(Repr::Number(value.to_bits()))
    }

    /// The text of a string id that reads as no number (the proxy's own ids are such).
    pub(crate) fn as_text(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(text) => Some(text),
            Repr::Number(_) => None,
        }
    }
}

/// A number as its value (`7`, `1.5`, `inf`), a string as a quoted string (`"a"`), so that
/// logs show which it is.
impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Number(bits) => write!(f, "{}", f64::from_bits(*bits)),
            Repr::Text(text) => write!(f, "{text:?}"),
        }
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({self})")
    }
}

/// The number a string id reads as to JavaScript's `Number()` or to Python's `int()`, if
/// either reads it as one. No string reads as two different numbers: the strings both read
/// are plain decimal integers, and they read them alike.
fn number_in(text: &str) -> Option<f64> {
    let text = text.trim_matches(is_blank);
    js_number(text).or_else(|| python_int(text))
}

/// The blanks either reader ignores around a number: Unicode's white space, and JavaScript's
/// byte order mark; Python's `int()` also takes the information separators U+001C to U+001F,
/// and older JavaScript engines U+180E.
fn is_blank(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{feff}' | '\u{1c}'..='\u{1f}' | '\u{180e}')
}

/// JavaScript's `Number()` of a string without blanks around it (ECMAScript's
/// StringNumericLiteral): `""` is `0`; a decimal with an optional sign, point and exponent;
/// `Infinity`; `0x`, `0o` and `0b` integers without a sign. `None` where it is `NaN`.
fn js_number(text: &str) -> Option<f64> {
    if text.is_empty() {
        return Some(0.0);
    }
    let (negative, body) = match text.as_bytes()[0] {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if body == "Infinity" {
        return Some(if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        });
    }
    if body.len() == text.len() {
        for (prefix, bits) in [(b"0x", 4), (b"0o", 3), (b"0b", 1)] {
            // Compared as bytes: `text` may start with a character of several.
            if text.len() > 2 && text.as_bytes()[..2].eq_ignore_ascii_case(prefix) {
                return binary_integer(&text[2..], bits);
            }
        }
    }
    if !is_decimal(body.as_bytes()) {
        return None;
    }
    // Rust's parser rounds correctly, as JavaScript's does, and takes every form checked
    // above (`5.`, `.5`, `+1e3`).
    text.parse().ok()
}

/// Whether `s` is digits with an optional point and exponent (at least one digit before the
/// exponent), JavaScript's StrUnsignedDecimalLiteral without `Infinity`.
fn is_decimal(s: &[u8]) -> bool {
    let digits = |from: usize| s[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let whole = digits(0);
    let mut at = whole;
    let mut fraction = 0;
    if s.get(at) == Some(&b'.') {
        fraction = digits(at + 1);
        at += 1 + fraction;
    }
    if whole + fraction == 0 {
        return false;
    }
    if matches!(s.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(s.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let exponent = digits(at);
        if exponent == 0 {
            return false;
        }
        at += exponent;
    }
    at == s.len()
}

/// The value of `digits` in base 2^`bits` (hexadecimal, octal, binary), rounded to the
/// nearest double as JavaScript rounds it.
fn binary_integer(digits: &str, bits: u32) -> Option<f64> {
    // The first 125 or more significant bits are kept exactly; below them only whether any
    // is set (a sticky bit), which is all the rounding of a 53-bit mantissa needs.
    let mut kept: u128 = 0;
    let mut sticky = false;
    let mut dropped: i32 = 0;
    for c in digits.chars() {
        let digit = c.to_digit(1 << bits)?;
        if kept >> (128 - bits) == 0 {
            kept = kept << bits | u128::from(digit);
        } else {
            sticky |= digit != 0;
            dropped = dropped.saturating_add(bits as i32);
        }
    }
    // A power of two scales a double exactly (or to infinity, as JavaScript's would).
    Some((kept | u128::from(sticky)) as f64 * 2f64.powi(dropped))
}

/// Python's `int()` of a string without blanks around it: an optional sign, then decimal
/// digits of any script (Unicode's `Nd`: `٣`, `３`, `𝟑`), single `_` between them.
fn python_int(text: &str) -> Option<f64> {
    let (sign, body) = match text.strip_prefix('-') {
        Some(body) => ("-", body),
        None => ("", text.strip_prefix('+').unwrap_or(text)),
    };
    let mut ascii = String::with_capacity(body.len() + 1);
    ascii.push_str(sign);
    // `true` before the first digit too: no leading `_`.
    let mut after_underscore = true;
    for c in body.chars() {
        if c == '_' {
            if after_underscore {
                return None;
            }
            after_underscore = true;
            continue;
        }
        ascii.push(char::from(b'0' + decimal_digit(c)?));
        after_underscore = false;
    }
    if after_underscore {
        // Empty, or a trailing `_`.
        return None;
    }
    ascii.parse().ok()
}

/// The value of a decimal digit of any script (Unicode's general category `Nd`).
fn decimal_digit(c: char) -> Option<u8> {
    if c.is_ascii_digit() {
        return Some(c as u8 - b'0');
    }
    let category = CodePointMapData::<GeneralCategory>::new();
    let is_digit = |c: char| category.get(c) == GeneralCategory::DecimalNumber;
    if !is_digit(c) {
        return None;
    }
    // Unicode assigns decimal digits only in runs of ten, 0 to 9 in order (a stability
    // guarantee), and adjacent runs add up to multiples of ten: a digit's value is its
    // distance from the start of the digits before it, modulo ten.
    let mut start = c;
    while let Some(before) = (start as u32).checked_sub(1).and_then(char::from_u32) {
        if !is_digit(before) {
            break;
        }
        start = before;
    }
    Some(((c as u32 - start as u32) % 10) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(written: &str) -> Option<RequestId> {
        RequestId::parse(written.as_bytes())
    }

    #[test]
    fn one_number_however_it_is_written() {
        for same in [
            "1",
            "1.0",
            "1e0",
            "10e-1",
            " 1 ",
            "0.1e1",
            "+1",
            "0x1",
            "1.",
            "\"1\"",
            "\" 1\t\"",
            "\"1.0\"",
            "\"1e0\"",
            "\"0x1\"",
            "\"0b1\"",
            "\"0o1\"",
            "\"+1\"",
            "\"\\u0031\"",
            "\"\u{661}\"",
            "\"\u{ff11}\"",
            "\"\u{1d7cf}\"",
            "\"0_1\"",
            "\"1\u{0}x\"",
            "\"1\\ud800\"",
            "\"\u{feff}1\u{3000}\"",
        ] {
            assert_eq!(id(same), id("1"), "{same}");
        }
        assert_eq!(id("9007199254740993"), id("9007199254740992"));
        assert_eq!(id("-0"), id("0"));
        assert_eq!(id("\"\""), id("0"));
        assert_eq!(id("\"   \""), id("-0.0"));
        assert_eq!(id("1e400"), id("\"Infinity\""));
        assert_eq!(id("-1e999"), id("\"-Infinity\""));
        assert_eq!(id("\"0x20000000000001\""), id("9007199254740992"));
        assert_eq!(id("\"0x20000000000003\""), id("9007199254740996"));
        assert_eq!(id("\"1_000\""), id("1000"));
        assert_eq!(id("\"-\u{663}\""), id("-3"));
        assert_eq!(
            id("\"\u{1d7d9}\""),
            id("1"),
            "double-struck one, past the bold digits"
        );
    }

    #[test]
    fn other_strings_by_their_text() {
        assert_eq!(id(r#""\u0061""#), id("\"a\""));
        assert_eq!(id("\"a\\ud800b\""), id("\"a\u{fffd}b\""));
        assert_eq!(id("\"a\u{fffd}b\""), id("\"ab\""));
        assert_eq!(id("\"ab\\u0000c\""), id("\"ab\""));
        for different in [
            "\"a\"",
            "\"A\"",
            "\"1a\"",
            "\"1__0\"",
            "\"_1\"",
            "\"1_\"",
            "\"-0x1\"",
            "\"1n\"",
            "\"\u{2460}\"",
            "\"NaN\"",
            "\"infinity\"",
            "2",
            "1.5",
            // A character of several bytes where a `0x` prefix would be.
            "\"\u{661}x\"",
            "\"\u{e9}\u{661}\"",
        ] {
            assert_ne!(id(different), id("1"), "{different}");
        }
        assert_eq!(id("\"a\"").unwrap().as_text(), Some("a"));
        assert_eq!(id("\"7\"").unwrap().as_text(), None);
    }

    #[test]
    fn no_id() {
        for not in [
            "", "null", "true", "[1]", "{}", "NaN", "-", "1e", "0x", "--1", "'a'",
        ] {
            assert_eq!(id(not), None, "{not}");
        }
        assert_eq!(RequestId::of_value(&Value::Null), None);
    }

    #[test]
    fn a_parsed_value_is_the_same_id() {
        for written in [
            "1",
            "1.0",
            "-0",
            "\"a\"",
            "\"1\"",
            "0.30000000000000004",
            "1e300",
        ] {
            let value: Value = serde_json::from_str(written).unwrap();
            assert_eq!(RequestId::of_value(&value), id(written), "{written}");
        }
    }

    #[test]
    fn shown_as_numbers_and_quoted_strings() {
        assert_eq!(id("1.0").unwrap().to_string(), "1");
        assert_eq!(id("\"a\"").unwrap().to_string(), "\"a\"");
        assert_eq!(id("1e400").unwrap().to_string(), "inf");
    }
}

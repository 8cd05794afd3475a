//! The input requests of a line, wherever and however they are written, as the loosest
//! reader might take them.
//!
//! An `input_required` result carries requests for the client; the broker's among them
//! (`roots/list`, `files/*`) must never reach the host, which would answer them with its own
//! roots. The proxy answers them only in one exact form (`modern/check.rs`); this scan finds
//! them in every other form a lenient host might act on: under any spelling of
//! `inputRequests`, at any depth, as objects, arrays or strings, in lines no parser reads.

use super::{is_claimed, lenient_name, string_end, string_readings};

/// Where a line's input requests name a method that is the broker's or the proxy's
/// ([`is_claimed`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputClaims {
    /// In the place the proxy answers them: an object under the message's `result`'s
    /// `inputRequests` (either in any spelling), its `method` (in any spelling) a string.
    pub top: bool,
    /// Anywhere else, or in another form: under an `inputRequests` member at any other depth
    /// (a result's `_meta`, a nested result, a task, an input request's `params`), in an
    /// `inputRequests` that is an array, an input request that is a string or an array, a
    /// `method` that is an array or an object.
    pub other: bool,
}

/// The input requests of a line that name a claimed method, found by a scan that follows only
/// strings and nesting (as [`message_methods`](super::message_methods)), so no line escapes it:
/// every object member whose name reads as `inputRequests` to a lenient reader
/// ([`lenient_name`]: escapes decoded, in any case, trimmed; bytes that are not UTF-8 and lone
/// surrogates read both ways), at any depth and however many there are, is read as input
/// requests. Each of its members (or elements) is an input request: an object's members whose
/// names read as `method` count; an input request, or a `method`, that is not an object or a
/// string counts by every string in it (a JavaScript reader that indexes its handlers with
/// `["roots/list"]` takes it for `"roots/list"`). A host that reads no such structure loses
/// nothing: no peer writes one for the broker's methods but in the one place the proxy answers.
pub(crate) fn input_claims(line: &[u8]) -> InputClaims {
    /// What a value is, by where it stands.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Slot {
        /// The top-level object.
        Message,
        /// The message's `result`.
        Result,
        /// Input requests; `top` when they are the message's `result.inputRequests`.
        Requests { top: bool },
        /// One input request.
        Entry { top: bool },
        /// An input request's `method`.
        Method { top: bool },
        /// Every string in it, at any depth, counts.
        Any,
        /// Anything else.
        Plain,
    }
    #[derive(Clone, Copy)]
    enum Expect {
        Key,
        Colon(Slot),
        Value(Slot),
        Next,
    }
    struct Frame {
        object: bool,
        role: Slot,
        expect: Expect,
    }
    /// A value of a member named by `key` (its literal) in an object of `role`.
    fn member_slot(role: Slot, key: &[u8]) -> Slot {
        match role {
            Slot::Any | Slot::Method { .. } => Slot::Any,
            Slot::Requests { top } => Slot::Entry { top },
            Slot::Entry { top } if key_is(key, "method") => Slot::Method { top },
            Slot::Message if key_is(key, "result") => Slot::Result,
            Slot::Result if key_is(key, "inputrequests") => Slot::Requests { top: true },
            _ if key_is(key, "inputrequests") => Slot::Requests { top: false },
            _ => Slot::Plain,
        }
    }
    /// An element of an array of `role`.
    fn element_slot(role: Slot) -> Slot {
        match role {
            Slot::Any | Slot::Method { .. } => Slot::Any,
            // Input requests in an array are never the proxy's to answer.
            Slot::Requests { .. } => Slot::Entry { top: false },
            _ => Slot::Plain,
        }
    }
    /// The role of a container standing in `slot`.
    fn role(slot: Slot, object: bool) -> Slot {
        match (slot, object) {
            (Slot::Message | Slot::Result, false) => Slot::Plain,
            (Slot::Requests { .. }, false) => Slot::Requests { top: false },
            (Slot::Entry { .. }, false) | (Slot::Method { .. }, _) => Slot::Any,
            (slot, _) => slot,
        }
    }
    /// A string standing in `slot`.
    fn string(claims: &mut InputClaims, slot: Slot, literal: &[u8]) {
        let top = match slot {
            Slot::Method { top } => top,
            Slot::Entry { .. } | Slot::Any => false,
            _ => return,
        };
        if string_readings(literal).iter().any(|s| is_claimed(s)) {
            if top {
                claims.top = true;
            } else {
                claims.other = true;
            }
        }
    }
    // Deeper than any JSON reader in the proxy goes (serde_json stops at 128): past this,
    // containers are only counted.
    const MAX_DEPTH: usize = 256;
    let mut claims = InputClaims::default();
    let mut frames: Vec<Frame> = Vec::new();
    let mut deeper = 0usize;
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        if b == b'"' {
            let end = string_end(line, i);
            let literal = &line[i..end];
            i = end;
            let Some(frame) = frames.last_mut() else {
                continue;
            };
            if deeper > 0 {
                if frame.role == Slot::Any {
                    string(&mut claims, Slot::Any, literal);
                }
                continue;
            }
            if !frame.object {
                string(&mut claims, element_slot(frame.role), literal);
                continue;
            }
            frame.expect = match frame.expect {
                Expect::Key => Expect::Colon(member_slot(frame.role, literal)),
                // A missing colon is read as there: nothing valid is missed.
                Expect::Colon(slot) | Expect::Value(slot) => {
                    string(&mut claims, slot, literal);
                    Expect::Next
                }
                Expect::Next => Expect::Next,
            };
            continue;
        }
        match b {
            b'{' | b'[' => {
                let object = b == b'{';
                let slot = match frames.last_mut() {
                    None => Slot::Message,
                    Some(frame) if frame.object => {
                        let slot = match frame.expect {
                            Expect::Colon(slot) | Expect::Value(slot) => slot,
                            _ if frame.role == Slot::Any => Slot::Any,
                            _ => Slot::Plain,
                        };
                        frame.expect = Expect::Next;
                        slot
                    }
                    Some(frame) => element_slot(frame.role),
                };
                if deeper > 0 || frames.len() >= MAX_DEPTH {
                    deeper += 1;
                } else {
                    frames.push(Frame {
                        object,
                        role: role(slot, object),
                        expect: Expect::Key,
                    });
                }
            }
            b'}' | b']' => {
                if deeper > 0 {
                    deeper -= 1;
                } else {
                    frames.pop();
                }
            }
            b':' if deeper == 0 => {
                if let Some(frame) = frames.last_mut().filter(|f| f.object) {
                    if let Expect::Colon(slot) = frame.expect {
                        frame.expect = Expect::Value(slot);
                    }
                }
            }
            b',' if deeper == 0 => {
                if let Some(frame) = frames.last_mut().filter(|f| f.object) {
                    frame.expect = Expect::Key;
                }
            }
            // Whitespace, numbers, literals, stray bytes: a value that is not a string.
            _ => {}
        }
        i += 1;
    }
    claims
}

/// Whether a member name (its literal, from the opening quote) reads as `name` (in lower
/// case) to a lenient reader ([`lenient_name`]). Plain ASCII names are compared as they are,
/// the rest decoded both ways ([`string_readings`]).
fn key_is(literal: &[u8], name: &str) -> bool {
    let body = literal.get(1..).unwrap_or_default();
    let body = body.strip_suffix(b"\"").unwrap_or(body);
    if body
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'\\')
    {
        return body.trim_ascii().eq_ignore_ascii_case(name.as_bytes());
    }
    string_readings(literal)
        .iter()
        .any(|k| lenient_name(k) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_requests_are_found_in_lines_no_parser_reads_and_only_where_they_are() {
        // The scan finds input requests in lines no parser reads, and only where they are.
        assert_eq!(
            input_claims(b"{\"id\":1,\"result\":{\"x\":NaN,\"inputRequests\":{\"r\":{\"method\":\"roots/\xfflist\"}}}}"),
            InputClaims {
                top: true,
                other: false
            }
        );
        assert_eq!(
            input_claims(br#"{"id":1,"result":{"inputRequests":{"r":{"params":{"method":"roots/list"}}}},"method":"files/x"}"#),
            InputClaims::default()
        );
    }
}

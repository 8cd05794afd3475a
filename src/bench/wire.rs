//! Reading the broker's answers without building JSON values.
//!
//! A structural scanner finds an object's members by name and steps over long strings with
//! `memchr` (an 11 MB base64 chunk is looked at once, at memory speed); only the small rest
//! of an answer goes through serde_json. This keeps the client's share of the CPU small, so
//! the bench measures the broker rather than itself.

use std::ops::Range;

use serde::Deserialize;

/// One answer: its id and where its parts are in the line.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub id: Option<u64>,
    /// The `result` value.
    pub result: Option<Range<usize>>,
    /// The `error` value.
    pub error: Option<Range<usize>>,
    /// `result.content`, a string: its span with the quotes.
    pub content: Option<Range<usize>>,
}

impl Answer {
    /// A message with neither result nor error (a notification from the broker).
    pub(crate) fn is_notification(&self) -> bool {
        self.result.is_none() && self.error.is_none()
    }

    /// `result.content` between its quotes (escapes kept), and the result without it (its
    /// value replaced by `""`): small enough to hand to serde_json.
    pub(crate) fn content<'a>(&self, line: &'a [u8]) -> Result<(&'a [u8], Vec<u8>), String> {
        let result = self.result.clone().ok_or("no result")?;
        let content = self.content.clone().ok_or_else(|| {
            format!(
                "no string \"content\" in {}",
                preview(&line[result.clone()])
            )
        })?;
        let mut rest = Vec::with_capacity(result.len() - content.len() + 2);
        rest.extend_from_slice(&line[result.start..content.start]);
        rest.extend_from_slice(b"\"\"");
        rest.extend_from_slice(&line[content.end..result.end]);
        Ok((&line[content.start + 1..content.end - 1], rest))
    }
}

/// Finds an answer's parts in one pass over the line.
pub(crate) fn answer(line: &[u8]) -> Result<Answer, String> {
    let mut a = Answer::default();
    Scanner::new(line)
        .members(|key, s| {
            match key {
                b"id" => {
                    let v = s.value()?;
                    a.id = std::str::from_utf8(&line[v])
                        .ok()
                        .and_then(|t| t.parse().ok());
                }
                b"result" => {
                    s.ws();
                    let start = s.i;
                    if s.s.get(s.i) == Some(&b'{') {
                        s.members(|key, s| {
                            let v = s.value()?;
                            if key == b"content" && line[v.start] == b'"' {
                                a.content = Some(v);
                            }
                            Ok(())
                        })?;
                    } else {
                        s.value()?;
                    }
                    a.result = Some(start..s.i);
                }
                b"error" => a.error = Some(s.value()?),
                _ => {
                    s.value()?;
                }
            }
            Ok(())
        })
        .map_err(|e| format!("unreadable answer ({e}): {}", preview(line)))?;
    Ok(a)
}

/// The span of member `key`'s value in the JSON object `obj`.
#[cfg(test)]
fn member(obj: &[u8], key: &str) -> Result<Option<Range<usize>>, String> {
    let mut found = None;
    Scanner::new(obj).members(|k, s| {
        let v = s.value()?;
        if found.is_none() && k == key.as_bytes() {
            found = Some(v);
        }
        Ok(())
    })?;
    Ok(found)
}

/// Appends the text of a JSON string's raw contents (between its quotes) to `out`.
pub(crate) fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
    let mut i = 0;
    while let Some(k) = memchr::memchr(b'\\', &raw[i..]) {
        out.extend_from_slice(&raw[i..i + k]);
        i += k;
        let c = *raw.get(i + 1).ok_or("a string ends in a backslash")?;
        i += 2;
        let simple = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let (ch, used) = unicode_escape(&raw[i - 2..])?;
                let mut utf8 = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
                i += used - 2;
                continue;
            }
            other => return Err(format!("unknown escape \\{}", other as char)),
        };
        out.push(simple);
    }
    out.extend_from_slice(&raw[i..]);
    Ok(())
}

/// `\uXXXX`, or a surrogate pair `\uXXXX\uXXXX`, at the start of `s`: the character and the
/// bytes used.
fn unicode_escape(s: &[u8]) -> Result<(char, usize), String> {
    let hex = |at: usize| -> Result<u32, String> {
        let digits = s.get(at..at + 4).ok_or("a short \\u escape")?;
        let text = std::str::from_utf8(digits).map_err(|_| "a bad \\u escape")?;
        u32::from_str_radix(text, 16).map_err(|_| "a bad \\u escape".to_owned())
    };
    let first = hex(2)?;
    if (0xd800..0xdc00).contains(&first) {
        if s.get(6..8) != Some(b"\\u") {
            return Err("a lone surrogate in a \\u escape".into());
        }
        let second = hex(8)?;
        let code = 0x10000 + ((first - 0xd800) << 10) + (second.wrapping_sub(0xdc00) & 0x3ff);
        let ch = char::from_u32(code).ok_or("a bad surrogate pair")?;
        return Ok((ch, 12));
    }
    let ch = char::from_u32(first).ok_or("a lone surrogate in a \\u escape")?;
    Ok((ch, 6))
}

/// `error.code`, `error.data.code` and `error.message` of an error object, for messages.
pub(crate) fn error_text(err: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Data {
        code: Option<String>,
        reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Error {
        code: Option<i64>,
        message: Option<String>,
        data: Option<Data>,
    }
    match serde_json::from_slice::<Error>(err) {
        Ok(e) => {
            let data = e.data.as_ref();
            format!(
                "error {} {}: {}{}",
                e.code.map_or_else(|| "?".into(), |c| c.to_string()),
                data.and_then(|d| d.code.as_deref()).unwrap_or(""),
                e.message.as_deref().unwrap_or(""),
                data.and_then(|d| d.reason.as_deref())
                    .filter(|r| !e.message.as_deref().unwrap_or("").contains(r))
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )
        }
        Err(_) => format!("error {}", preview(err)),
    }
}

/// The start of a long line, for messages.
pub(crate) fn preview(line: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&line[..line.len().min(MAX)]);
    if line.len() > MAX {
        format!("{text}... ({} bytes)", line.len())
    } else {
        text.into_owned()
    }
}

/// Walks JSON text: just enough to find members and step over values.
struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Scanner<'a> {
    fn new(s: &'a [u8]) -> Self {
        Scanner { s, i: 0 }
    }

    fn ws(&mut self) {
        while matches!(self.s.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }

    /// A string starting at the cursor; returns the span between its quotes.
    fn string(&mut self) -> Result<Range<usize>, String> {
        self.expect(b'"')?;
        let start = self.i;
        loop {
            let k = memchr::memchr2(b'"', b'\\', &self.s[self.i.min(self.s.len())..])
                .ok_or("an unterminated string")?;
            let at = self.i + k;
            if self.s[at] == b'"' {
                self.i = at + 1;
                return Ok(start..at);
            }
            self.i = at + 2;
        }
    }

    /// Any value; returns its span.
    fn value(&mut self) -> Result<Range<usize>, String> {
        self.ws();
        let start = self.i;
        match self.s.get(self.i) {
            Some(b'"') => {
                self.string()?;
            }
            Some(b'{' | b'[') => {
                let mut depth = 0usize;
                loop {
                    match self.s.get(self.i) {
                        None => return Err("an unterminated object or array".into()),
                        Some(b'"') => {
                            self.string()?;
                            continue;
                        }
                        Some(b'{' | b'[') => depth += 1,
                        Some(b'}' | b']') => {
                            depth -= 1;
                            if depth == 0 {
                                self.i += 1;
                                break;
                            }
                        }
                        Some(_) => {}
                    }
                    self.i += 1;
                }
            }
            Some(_) => {
                while let Some(c) = self.s.get(self.i) {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.i += 1;
                }
                if self.i == start {
                    return Err(format!("a value expected at byte {start}"));
                }
            }
            None => return Err("a value expected at the end".into()),
        }
        Ok(start..self.i)
    }

    /// Calls `f` with each member's raw key of the object at the cursor; `f` must read the
    /// member's value (the cursor is at it).
    fn members(
        &mut self,
        mut f: impl FnMut(&'a [u8], &mut Self) -> Result<(), String>,
    ) -> Result<(), String> {
        self.ws();
        self.expect(b'{')?;
        self.ws();
        if self.s.get(self.i) == Some(&b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            let text: &'a [u8] = self.s;
            self.ws();
            self.expect(b':')?;
            f(&text[key], self)?;
            self.ws();
            match self.s.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(format!("expected ',' or '}}' at byte {}", self.i)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_members_past_tricky_strings() {
        let line = br#"{"jsonrpc":"2.0","id":7,"result":{"etag":"a\"content\":\"x","content":"QUJD","n":[1,{"a":"}"}],"eof":true}}"#;
        let a = answer(line).unwrap();
        assert_eq!(a.id, Some(7));
        let (content, rest) = a.content(line).unwrap();
        assert_eq!(content, b"QUJD");
        let v: serde_json::Value = serde_json::from_slice(&rest).unwrap();
        assert_eq!(v["content"], "");
        assert_eq!(v["eof"], true);
        assert_eq!(v["etag"], "a\"content\":\"x");
        let result = &line[a.result.unwrap()];
        assert_eq!(
            member(result, "eof").unwrap().map(|r| &result[r]),
            Some(&b"true"[..])
        );
        assert_eq!(member(result, "nope").unwrap(), None);
    }

    #[test]
    fn errors_and_notifications() {
        let a = answer(br#"{"jsonrpc":"2.0","method":"notifications/x"}"#).unwrap();
        assert!(a.is_notification());
        let line = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}"#;
        let a = answer(line).unwrap();
        assert_eq!(a.id, None);
        assert!(error_text(&line[a.error.unwrap()]).contains("-32700"));
        assert!(answer(b"{\"id\":1,").is_err());
        assert!(answer(b"[1]").is_err());
    }

    #[test]
    fn unescapes_like_serde() {
        let text = "a\"b\\c\nd\te/f\u{1}é😀";
        let json = serde_json::to_string(text).unwrap();
        let mut out = Vec::new();
        unescape(&json.as_bytes()[1..json.len() - 1], &mut out).unwrap();
        assert_eq!(out, text.as_bytes());
        out.clear();
        unescape(br"\ud83d\ude00 \u00e9", &mut out).unwrap();
        assert_eq!(out, "😀 é".as_bytes());
    }
}

//! Property tests of the crate's private layers: the line framer, the message parser, the
//! content codec, and the proxy's one meaning of "the same request id". They are not part of the public surface, so their properties are
//! checked here; the properties a host can see (the resolver, a session's answers, chunked
//! reads) are in `tests/properties.rs`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, ReadBuf};

use crate::codec::{base64_into, utf8_prefix};
use crate::error::ErrorKind;
use crate::jsonrpc::{Incoming, parse};
use crate::transport::framing::{Frame, LineReader};
use crate::transport::{id_filters, same_request_id};

/// Cases per property (or `PROPTEST_CASES`); nothing is persisted to disk.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The framer
// ---------------------------------------------------------------------------------------------

/// Hands out its bytes in the given read sizes (cycled), so lines straddle reads.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    reads: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let size = match this.sizes.as_slice() {
            [] => usize::MAX,
            sizes => sizes[this.reads % sizes.len()],
        };
        this.reads += 1;
        let n = size.min(buf.remaining()).min(this.data.len() - this.pos);
        buf.put_slice(&this.data[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

async fn all_frames<R: AsyncRead + Unpin>(reader: R, max: usize) -> io::Result<Vec<Frame>> {
    let mut r = LineReader::new(reader, max);
    let mut out = Vec::new();
    while let Some(f) = r.next_frame().await? {
        out.push(f);
    }
    Ok(out)
}

/// The lines the framer must produce: every `\n`-terminated piece, then a non-empty
/// unterminated remainder.
fn pieces(input: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if v.last().is_some_and(|last| last.is_empty()) {
        v.pop();
    }
    v
}

/// A piece longer than `max` is `TooLong` with its full length (`\r` included); a shorter
/// one is a `Line` without a final `\r` (the unterminated remainder loses one too).
fn model_frame(piece: &[u8], max: usize) -> Frame {
    if piece.len() > max {
        Frame::TooLong {
            len: piece.len() as u64,
        }
    } else {
        Frame::Line(piece.strip_suffix(b"\r").unwrap_or(piece).to_vec())
    }
}

fn framer_input() -> impl Strategy<Value = Vec<u8>> {
    let runs = prop::collection::vec(
        (
            select(vec![b'a', b'\n', b'\r', b'{', 0xff, 0x00]),
            0..200usize,
        ),
        0..12,
    )
    .prop_map(|runs| {
        runs.into_iter()
            .flat_map(|(b, n)| std::iter::repeat_n(b, n))
            .collect()
    });
    let crlf_lines = prop::collection::vec(
        (
            "[a-z{}\":,]{0,100}",
            select(vec!["\n", "\r\n", "\r\r\n", "\n\n", ""]),
        ),
        0..16,
    )
    .prop_map(|lines| {
        lines
            .into_iter()
            .flat_map(|(l, end)| [l.into_bytes(), end.as_bytes().to_vec()])
            .flatten()
            .collect()
    });
    prop_oneof![
        2 => prop::collection::vec(any::<u8>(), 0..600),
        2 => prop::collection::vec(select(vec![b'\n', b'\r', b'a', b'b', 0xff]), 0..600),
        2 => runs,
        2 => crlf_lines,
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// Every byte of the input is in a line, in a line too long (counted, not kept), a `\r`
    /// before a newline, or a newline; however the reads split it.
    #[test]
    fn framer_accounts_for_every_byte(
        input in framer_input(),
        max in prop_oneof![2 => Just(64usize), 1 => 0..=80usize],
        sizes in prop_oneof![
            1 => Just(Vec::new()),
            3 => prop::collection::vec(1..=70usize, 1..5),
        ],
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let reader = Trickle { data: input.clone(), pos: 0, sizes, reads: 0 };
        let frames = rt.block_on(all_frames(reader, max));
        prop_assert!(frames.is_ok(), "read error: {frames:?}");
        let frames = frames.unwrap_or_default();
        // The same input as one slice (a single read) gives the same frames.
        let whole = rt.block_on(all_frames(input.as_slice(), max));
        prop_assert!(whole.as_ref().is_ok_and(|w| *w == frames));

        let newlines = input.iter().filter(|&&b| b == b'\n').count();
        let remainder = !input.is_empty() && input.last() != Some(&b'\n');
        prop_assert_eq!(frames.len(), newlines + usize::from(remainder));
        let (mut line_bytes, mut dropped_bytes) = (0u64, 0u64);
        for f in &frames {
            match f {
                Frame::Line(l) => {
                    prop_assert!(l.len() <= max, "a line of {} > {max}", l.len());
                    line_bytes += l.len() as u64;
                }
                Frame::TooLong { len } => {
                    prop_assert!(*len > max as u64);
                    dropped_bytes += len;
                }
                // Only a reader with a shared budget refuses lines; this one has none.
                Frame::Refused { .. } => {
                    prop_assert!(false, "a reader without a budget refused a line")
                }
            }
        }
        let expected: Vec<Frame> = pieces(&input).into_iter().map(|p| model_frame(p, max)).collect();
        let stripped_cr = pieces(&input)
            .into_iter()
            .filter(|p| p.len() <= max && p.ends_with(b"\r"))
            .count() as u64;
        prop_assert_eq!(
            line_bytes + dropped_bytes + stripped_cr + newlines as u64,
            input.len() as u64,
            "bytes unaccounted for"
        );
        prop_assert_eq!(frames, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// The message parser
// ---------------------------------------------------------------------------------------------

/// Lines near the messages a server sends: well-formed ones of each kind, with odd ids,
/// params of every JSON type, repeated and misspelt members; then broken by edits of the
/// bytes JSON is made of.
fn near_messages() -> impl Strategy<Value = Vec<u8>> {
    let id = select(vec![
        "1",
        "-7",
        "\"a\"",
        "null",
        "1.5",
        "true",
        "{}",
        "[1]",
        "-0.0",
        "18446744073709551615",
        "1e400",
    ]);
    let params = select(vec![
        "",
        ",\"params\":{}",
        ",\"params\":[]",
        ",\"params\":null",
        ",\"params\":\"x\"",
        ",\"params\":{\"path\":\"a\"}",
        ",\"params\":7",
    ]);
    let method = select(vec![
        "files/read",
        "roots/list",
        "",
        "notifications/initialized",
        "\\u0066iles/read",
    ]);
    let shape = select(vec![0u8, 1, 2, 3, 4, 5]);
    let edits = prop::collection::vec(
        (
            any::<Index>(),
            select(b"{}[]\",:\\0-.enul \t\r\xff".to_vec()),
            0u8..4,
        ),
        0..6,
    );
    (shape, id, method, params, edits).prop_map(|(shape, id, method, params, edits)| {
        let mut line = match shape {
            0 => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\"{params}}}"),
            1 => format!("{{\"jsonrpc\":\"2.0\",\"method\":\"{method}\"{params}}}"),
            2 => format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{}}}}"),
            3 => format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":-1,\"message\":\"m\"}}}}"
            ),
            4 => format!("{{\"id\":{id},\"id\":2,\"jsonrpc\":\"2.0\",\"method\":\"{method}\"}}"),
            _ => format!("[{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"{method}\"}}]"),
        }
        .into_bytes();
        for (at, byte, how) in edits {
            let len = line.len();
            match how {
                0 => line.truncate(at.index(len + 1)),
                1 if len > 0 => drop(line.remove(at.index(len))),
                2 => line.insert(at.index(len + 1), byte),
                _ if len > 0 => line[at.index(len)] = byte,
                _ => {}
            }
        }
        line
    })
}

/// Whether `line` is one JSON text (RFC 8259: UTF-8 throughout; numbers of any magnitude).
fn is_json(line: &[u8]) -> bool {
    serde_json::from_slice::<Box<RawValue>>(line).is_ok()
}

proptest! {
    #![proptest_config(config(1024))]

    /// Any bytes are classified without a panic, and only JSON is taken for a message: a
    /// request's id is a number or a string, and its params an object or an array.
    #[test]
    fn parser_classifies_arbitrary_bytes_without_panicking(
        line in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..300),
            "\\PC{0,200}".prop_map(String::into_bytes),
            near_messages(),
        ]
    ) {
        match parse(&line) {
            Incoming::Request { id, params, .. } => {
                prop_assert!(is_json(&line), "a line that is not JSON taken as a request");
                let id = id.get();
                prop_assert!(
                    id.starts_with('"') || id.bytes().all(|b| b == b'-' || b.is_ascii_digit()),
                    "id {}",
                    id
                );
                if let Some(p) = params {
                    let first = p.get().as_bytes().first().copied();
                    prop_assert!(matches!(first, Some(b'{' | b'[')), "params {}", p.get());
                }
            }
            Incoming::Notification { .. } | Incoming::Response => {
                prop_assert!(is_json(&line), "a line that is not JSON taken as a message");
            }
            Incoming::Invalid { error, .. } => {
                prop_assert!(matches!(
                    error.kind(),
                    ErrorKind::ParseError | ErrorKind::InvalidRequest
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Content: UTF-8 chunk boundaries and base64
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(512))]

    /// The prefix taken of a chunk is whole characters, shortened only when more follows,
    /// and then only by an incomplete character at its end.
    #[test]
    fn utf8_prefix_accepts_only_whole_characters(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        more in any::<bool>(),
    ) {
        match utf8_prefix(&bytes, more) {
            Some(n) => {
                prop_assert!(n <= bytes.len());
                prop_assert!(std::str::from_utf8(&bytes[..n]).is_ok());
                prop_assert!(n == bytes.len() || more, "shortened at the end of the file");
                if n < bytes.len() {
                    prop_assert!(n > 0, "an empty prefix");
                    let tail = &bytes[n..];
                    let e = std::str::from_utf8(tail).expect_err("tail must be incomplete");
                    prop_assert_eq!(e.valid_up_to(), 0);
                    prop_assert!(e.error_len().is_none(), "tail is invalid, not incomplete");
                    prop_assert!(tail.len() < 4);
                }
            }
            None => prop_assert!(std::str::from_utf8(&bytes).is_err()),
        }
    }

    /// Text cut anywhere: the prefix is exactly the whole characters before the cut.
    #[test]
    fn utf8_prefix_of_cut_text(
        s in prop_oneof!["\\PC{0,40}", "[aé€😀]{0,20}"],
        cut in any::<Index>(),
    ) {
        let cut = cut.index(s.len() + 1);
        let more = cut < s.len();
        let floor = (0..=cut).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
        let want = if s.is_char_boundary(cut) {
            Some(cut)
        } else if floor > 0 {
            Some(floor)
        } else {
            None
        };
        prop_assert_eq!(utf8_prefix(&s.as_bytes()[..cut], more), want);
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// The SIMD engine appends what the reference engine writes, and it decodes back.
    #[test]
    fn base64_into_matches_the_reference_engine(
        prefix in prop::collection::vec(any::<u8>(), 0..8),
        data in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut out = prefix.clone();
        base64_into(&data, &mut out);
        prop_assert_eq!(&out[..prefix.len()], &prefix[..]);
        let reference = STANDARD.encode(&data);
        prop_assert_eq!(&out[prefix.len()..], reference.as_bytes());
        prop_assert_eq!(STANDARD.decode(&out[prefix.len()..]).ok(), Some(data));
    }
}

// ---------------------------------------------------------------------------------------------
// Request ids: every filter of the proxy pairs ids as `RequestId` does
// ---------------------------------------------------------------------------------------------

/// What an id stands for, before it is spelled.
#[derive(Clone, Debug)]
enum IdBase {
    Int(i64),
    Text(String),
}

fn id_base() -> impl Strategy<Value = IdBase> {
    prop_oneof![
        (-3i64..40).prop_map(IdBase::Int),
        select(vec![
            9_007_199_254_740_992i64,
            9_007_199_254_740_993,
            1_000_000_000_000_000_000,
            i64::MAX,
        ])
        .prop_map(IdBase::Int),
        "[ab1 _.x\u{661}\u{fffd}-]{0,4}".prop_map(IdBase::Text),
        select(vec!["fsbroker-retry-0a-1", "a", "A", ""]).prop_map(|s| IdBase::Text(s.into())),
    ]
}

/// `text` as a JSON string with every character escaped (`"\u0061"`).
fn escaped(text: &str) -> String {
    let units: String = text.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
    format!("\"{units}\"")
}

/// The ways a peer may write `base` that some host reader takes for it, and a few near ones.
fn id_spellings(base: &IdBase) -> Vec<String> {
    match base {
        IdBase::Int(n) => {
            let digits = n.unsigned_abs().to_string();
            let sign = if *n < 0 { "-" } else { "" };
            // Arabic-Indic digits: Python's `int()` reads them.
            let arabic: String = digits
                .chars()
                .map(|d| char::from_u32(0x660 + d.to_digit(10).unwrap_or(0)).unwrap_or('0'))
                .collect();
            let mut spellings = vec![
                n.to_string(),
                format!("{n}.0"),
                format!("{n}e0"),
                format!("{n}0e-1"),
                format!("{sign}{digits}.000e+0"),
                format!("\"{n}\""),
                format!("\" {n}\\t\""),
                format!("\"{n}.0\""),
                format!("\"{n}e0\""),
                format!("\"{n}\\u0000x\""),
                escaped(&n.to_string()),
                format!("\"{sign}{arabic}\""),
                format!("{n}.5"),
                format!("\"{n}a\""),
            ];
            if *n >= 0 {
                spellings.push(format!("\"0x{n:x}\""));
                spellings.push(format!("\"+{n}\""));
            }
            if *n == 0 {
                spellings.extend(["-0".into(), "\"\"".into(), "-0.0".into()]);
            }
            spellings
        }
        IdBase::Text(text) => {
            let json = serde_json::Value::String(text.clone()).to_string();
            let body = &json[1..json.len() - 1];
            vec![
                json.clone(),
                escaped(text),
                format!("\"{body}\\ud800\""),
                format!("\"{body}\\u0000tail\""),
                format!("\"{body}\\ufffd\""),
                format!("\"{body}z\""),
            ]
        }
    }
}

/// Two spellings: of one base (`same`) or of two.
fn id_pair() -> impl Strategy<Value = (String, String)> {
    (
        id_base(),
        id_base(),
        any::<bool>(),
        any::<Index>(),
        any::<Index>(),
    )
        .prop_map(|(first, second, same, i, j)| {
            let a = id_spellings(&first);
            let b = id_spellings(if same { &first } else { &second });
            (i.get(&a).clone(), j.get(&b).clone())
        })
}

/// A JSON number literal, or a line's bytes no JSON reader reads as one.
fn id_literal() -> impl Strategy<Value = String> {
    prop_oneof![
        "-?(0|[1-9][0-9]{0,2})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
        // One token: a lenient scan ends an unquoted id at a blank.
        "[0-9+.eExa\"\\\\-]{1,6}",
        Just("null".to_owned()),
        Just("1e400".to_owned()),
        Just("[1]".to_owned()),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    /// Every filter of the proxy that pairs messages by id (the stdio relay's `TakenIds` and
    /// `Init`, the remote server's failed and pending ids, cancels, reads and session, the
    /// eras' kept requests and unreadable ids, the lenient envelope), fed two spellings the
    /// way the proxy feeds it, takes them for one exactly when `RequestId` does.
    #[test]
    fn every_id_filter_decides_as_request_id(
        (a, b) in prop_oneof![id_pair(), (id_literal(), id_literal())],
    ) {
        let same = same_request_id(&a, &b);
        for (filter, decided) in id_filters(&a, &b) {
            if let Some(decided) = decided {
                prop_assert_eq!(decided, same, "{} on {} and {}", filter, &a, &b);
            }
        }
    }

    /// Every spelling of an integer that a JavaScript or Python reader takes for it is one
    /// id with it; and an integer id and any spelling of it that serde_json reads reach
    /// every filter (none of them is left out by its reading).
    #[test]
    fn an_integer_is_one_id_however_it_is_spelled(n in -3i64..100_000, i in any::<Index>()) {
        let spellings = id_spellings(&IdBase::Int(n));
        let spelling = i.get(&spellings);
        let near = *spelling == format!("{n}.5") || *spelling == format!("\"{n}a\"");
        prop_assert_eq!(same_request_id(&n.to_string(), spelling), !near, "{}", spelling);
        if serde_json::from_str::<serde_json::Value>(spelling).is_ok() {
            for (filter, decided) in id_filters(&n.to_string(), spelling) {
                prop_assert!(decided.is_some(), "{} never saw {}", filter, spelling);
            }
        }
    }
}

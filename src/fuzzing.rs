//! What the fuzz targets (`tests/fuzz/`) need of the private layers, built only under
//! `cargo fuzz` (which sets `--cfg fuzzing`): the framer and the parser stay private to
//! every other build, and the targets see only these two questions about them.

use crate::jsonrpc::{self, Incoming};
use crate::transport::framing::{Frame, LineReader};

/// The answer `Session::handle` owes `line`: `Some(id)` (the id's JSON text, `null` when it
/// could not be read) for a request or an invalid message, `None` for a notification or a
/// response. Parsing must not panic on any bytes.
pub fn expected_answer(line: &[u8]) -> Option<String> {
    match jsonrpc::parse(line) {
        Incoming::Request { id, .. } => Some(id.get().to_owned()),
        Incoming::Invalid { id, .. } => Some(id.map_or("null", |i| i.get()).to_owned()),
        Incoming::Notification { .. } | Incoming::Response => None,
    }
}

/// What the line framer makes of `data` with lines of at most `max` bytes: each line, or
/// the length of one too long (dropped), in order.
pub async fn frames(data: &[u8], max: usize) -> Vec<Result<Vec<u8>, u64>> {
    let mut reader = LineReader::new(data, max);
    let mut out = Vec::new();
    while let Some(frame) = reader
        .next_frame()
        .await
        .expect("reading a slice cannot fail")
    {
        out.push(match frame {
            Frame::Line(line) => Ok(line),
            Frame::TooLong { len } | Frame::Refused { len } => Err(len),
        });
    }
    out
}

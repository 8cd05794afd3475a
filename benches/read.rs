//! The `files/read` hot path: 1 MiB of a real file → a framed JSON-RPC response.
//!
//! Every benchmark in the `read` group handles the same 1 MiB and reports throughput in
//! bytes of *file content* per second, so the rows compare directly:
//!
//! - `framed_read/base64` and `framed_read/utf8`: the whole request through the public API
//!   (`Session::handle`): parse, resolve beneath the root, `pread`, encode, frame.
//! - `encode/simd_into`, `encode/scalar_string`, `encode/serde_escaped`: base64 alone, three
//!   ways, as yardsticks for what the framed read spends beyond encoding (`simd_into` is the
//!   base64 crate's SIMD engine set up as `src/codec.rs` sets it up; the bench uses only the
//!   library's public API).
//!
//! Run with `cargo bench --bench read`.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fsbroker::policy::{Overrides, Policy};
use fsbroker::{Broker, Session};
use serde::Serialize;

mod kit;

/// One chunk: the broker's default `chunk_size`.
const CHUNK: usize = 1 << 20;

/// Incompressible bytes from a fixed seed (the kit's splitmix64), so runs are comparable and
/// the encoders cannot benefit from repetitive input.
fn random_bytes(n: usize) -> Vec<u8> {
    kit::Rng::new(0x9e37_79b9_7f4a_7c15).bytes(n)
}

/// Source-like ASCII text: printable lines ending in `\n`, with the odd `"` and `\`, so the
/// utf-8 read pays for JSON escaping the way a real text file does.
fn ascii_text(n: usize) -> Vec<u8> {
    const LINE: &[u8] = b"    let reply = session.handle(line).await; // \"quoted\" \\ path\n";
    LINE.iter().copied().cycle().take(n).collect()
}

/// A `files/read` request line for `path` (relative to the single root).
fn read_request(path: &str, encoding: &str) -> Vec<u8> {
    format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"files/read","params":{{"path":"{path}","encoding":"{encoding}","offset":0,"length":{CHUNK}}}}}"#
    )
    .into_bytes()
}

/// A session whose only root is `dir`.
fn session_for(dir: &Path) -> Session {
    let policy = Policy::load(
        None,
        &Overrides {
            roots: vec![dir.to_path_buf()],
            ..Default::default()
        },
    )
    .expect("policy for the temp dir");
    Broker::new(policy).expect("broker").session()
}

/// Checks once, outside the timing, that a frame carries the whole chunk as expected, so a
/// benchmark never measures a fast error response.
fn check_frame(frame: &[u8], encoding: &str, want: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(frame).expect("frame is JSON");
    let result = &v["result"];
    assert_eq!(result["encoding"], encoding, "{}", &v);
    assert_eq!(result["length"], CHUNK as u64);
    let content = result["content"].as_str().expect("content is a string");
    let got = match encoding {
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(content)
            .expect("valid base64"),
        _ => content.as_bytes().to_vec(),
    };
    assert!(got == want, "content differs from the file");
}

/// The naive framing: a base64 `String` inside a result struct, serialized by serde_json,
/// which scans every byte of the string for characters to escape.
#[derive(Serialize)]
struct NaiveResult<'a> {
    content: String,
    encoding: &'a str,
    length: usize,
}

fn bench_read(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let binary = random_bytes(CHUNK);
    let text = ascii_text(CHUNK);
    std::fs::write(dir.path().join("blob.bin"), &binary).expect("write blob.bin");
    std::fs::write(dir.path().join("text.txt"), &text).expect("write text.txt");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let session = session_for(dir.path());
    let base64_line = read_request("blob.bin", "base64");
    let utf8_line = read_request("text.txt", "utf-8");

    for (line, encoding, want) in [
        (&base64_line, "base64", &binary),
        (&utf8_line, "utf-8", &text),
    ] {
        let frame = rt.block_on(session.handle(line)).expect("a response");
        check_frame(&frame, encoding, want);
    }

    let mut group = c.benchmark_group("read");
    group
        .throughput(Throughput::Bytes(CHUNK as u64))
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    // The product: a base64 read of random bytes, request line in, response frame out
    // (parse, resolve, open, pread, SIMD encode in place, frame). Includes the hop to tokio's
    // blocking pool.
    group.bench_function("framed_read/base64", |b| {
        b.iter(|| rt.block_on(session.handle(black_box(&base64_line))))
    });

    // The other read path: a 1 MiB ASCII file sent as utf-8, which pays UTF-8 validation and
    // serde_json string escaping instead of base64.
    group.bench_function("framed_read/utf8", |b| {
        b.iter(|| rt.block_on(session.handle(black_box(&utf8_line))))
    });

    // The encoder the read path uses, built as src/codec.rs builds it (the base64 crate's SIMD
    // engine, standard alphabet with padding, encoding into a reused buffer sized by
    // `encoded_len`): the floor for the framed base64 read; the gap to it is I/O and request
    // overhead.
    let simd = base64::engine::Simd::standard(base64::engine::general_purpose::PAD);
    let mut out = Vec::with_capacity(CHUNK / 3 * 4 + 4);
    group.bench_function("encode/simd_into", |b| {
        b.iter(|| {
            let data = black_box(&binary);
            let len = base64::encoded_len(data.len(), true).expect("fits");
            out.clear();
            out.resize(len, 0);
            let written = simd
                .encode_slice(data, &mut out)
                .expect("sized by encoded_len");
            out.truncate(written);
            black_box(out.len())
        })
    });

    // The obvious alternative: the base64 crate's scalar engine, allocating a String.
    group.bench_function("encode/scalar_string", |b| {
        b.iter(|| base64::engine::general_purpose::STANDARD.encode(black_box(&binary)))
    });

    // What the read path avoids: a base64 String inside a struct through serde_json, which
    // scans the whole string for escapes after encoding it.
    let mut json = Vec::with_capacity(CHUNK / 3 * 4 + 128);
    group.bench_function("encode/serde_escaped", |b| {
        b.iter(|| {
            json.clear();
            let result = NaiveResult {
                content: base64::engine::general_purpose::STANDARD.encode(black_box(&binary)),
                encoding: "base64",
                length: CHUNK,
            };
            serde_json::to_writer(&mut json, &result).expect("serialize");
            black_box(json.len())
        })
    });

    group.finish();
}

criterion_group!(benches, bench_read);
criterion_main!(benches);

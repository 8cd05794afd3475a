//! What the integrity extension costs (`--only integrity`): the same transfer without and
//! with the broker's SHA-256, back to back, on the bench's broker.
//!
//! - **Reads**: [`PAIRS`] pairs of chunked reads of the test file (base64, the first
//!   `--chunk-size`, `--depth` in flight), one without `sha256` (three windows of each chunk
//!   checked, as the read phase does) and one with `"sha256": true`, each answer's hash
//!   compared with the chunk's, hashed from the file before the timing starts (so the client
//!   does no more work in one than in the other). The order swaps in every second pair.
//! - **Uploads**: as many pairs of chunked uploads of the test file, one without a hash and
//!   one announced on the first chunk and given on the last, which the broker checks before
//!   it commits. Each upload starts from the same footing (`settle`).
//! - **A whole file's hash**: `files/checksum` of the test file (from the page cache),
//!   against this process hashing the same file with the same engine: the broker's cost
//!   beyond the hash itself.
//!
//! Each pair's ratio is with ÷ without (MB/s); the figure is their geometric mean. Goal:
//! ≥ 0.90× at 1 MiB chunks (a hash costs at most a tenth).

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::client::Broker;
use super::progress::Bars;
use super::read::hex;
use super::report::{self, IntegrityPair, Throughput};
use super::{Encoding, read, upload};

/// Pairs of each kind: even, so each order comes as often.
const PAIRS: usize = 4;

/// What to measure on.
pub(crate) struct Spec<'a> {
    pub file: &'a Path,
    pub size: u64,
    pub chunk: usize,
    pub depth: usize,
    /// Where the uploads land (a read-write root).
    pub scratch: &'a Path,
}

/// Runs the phase on `broker`.
pub(crate) fn run(
    broker: &mut Broker,
    spec: &Spec,
    bars: &Bars,
) -> Result<report::Integrity, String> {
    let (chunks, whole, local) = hash_locally(spec, bars)?;
    let read_spec = |hashes| read::Spec {
        file: spec.file,
        size: spec.size,
        chunk: spec.chunk,
        depth: spec.depth,
        encoding: Encoding::Base64,
        sha256: None,
        chunk_sha256: hashes,
    };
    let mut reads = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let hashed_first = pair % 2 == 1;
        let mut got: [Option<Throughput>; 2] = [None, None];
        for hashed in [hashed_first, !hashed_first] {
            let r = read::run(broker, &read_spec(hashed.then_some(&chunks)), bars)?;
            got[usize::from(hashed)] = Some(r.throughput);
        }
        reads.push(pair_of(got, hashed_first)?);
    }
    let target = spec.scratch.join("integrity-upload.bin");
    let mut uploads = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let hashed_first = pair % 2 == 1;
        let mut got: [Option<Throughput>; 2] = [None, None];
        for hashed in [hashed_first, !hashed_first] {
            super::phases::settle(spec.scratch, spec.size);
            let r = upload::run(
                broker,
                &upload::Spec {
                    source: spec.file,
                    size: spec.size,
                    target: &target,
                    chunk: spec.chunk,
                    depth: spec.depth,
                    encoding: Encoding::Base64,
                    sha256: hashed.then_some(whole),
                },
                bars,
            )?;
            got[usize::from(hashed)] = Some(r.throughput);
        }
        uploads.push(pair_of(got, hashed_first)?);
    }
    let checksum = checksum(broker, spec.file, spec.size, &whole)?;
    Ok(report::Integrity {
        engine: fsbroker::sha256_engine(),
        bytes: spec.size,
        chunk_size: spec.chunk as u64,
        read_geomean: geomean(&reads),
        reads,
        upload_geomean: geomean(&uploads),
        uploads,
        checksum,
        local_sha256: local,
    })
}

/// What the bench hashed itself: each chunk's sha256 (hex, by offset), the whole file's, and
/// how fast this process hashed the whole (from the page cache: `files/checksum`'s
/// reference).
type Local = (HashMap<u64, String>, [u8; 32], Throughput);

/// Hashes the test file as [`Local`] says.
fn hash_locally(spec: &Spec, bars: &Bars) -> Result<Local, String> {
    let file = std::fs::File::open(spec.file)
        .map_err(|e| format!("cannot open {}: {e}", spec.file.display()))?;
    let bar = bars.bytes("hashing the test file's chunks", spec.size);
    let mut chunks = HashMap::new();
    let mut whole = Sha256::new();
    let mut buf = vec![0u8; spec.chunk.max(1)];
    let mut offset = 0u64;
    while offset < spec.size {
        let len = (spec.chunk as u64).min(spec.size - offset) as usize;
        file.read_exact_at(&mut buf[..len], offset)
            .map_err(|e| format!("cannot read the test file: {e}"))?;
        chunks.insert(offset, hex(&Sha256::digest(&buf[..len])));
        whole.update(&buf[..len]);
        offset += len as u64;
        bar.inc(len as u64);
    }
    bar.finish_and_clear();
    // Timed apart from the chunks' hashes: one pass, as `files/checksum` makes.
    let started_whole = Instant::now();
    let mut again = Sha256::new();
    let mut at = 0u64;
    while at < spec.size {
        let len = (buf.len() as u64).min(spec.size - at) as usize;
        file.read_exact_at(&mut buf[..len], at)
            .map_err(|e| format!("cannot read the test file: {e}"))?;
        again.update(&buf[..len]);
        at += len as u64;
    }
    let local = Throughput::new(spec.size, started_whole.elapsed());
    let whole: [u8; 32] = whole.finalize().into();
    let again: [u8; 32] = again.finalize().into();
    if whole != again {
        return Err("the test file changed while it was hashed".into());
    }
    Ok((chunks, whole, local))
}

/// `files/checksum` of the whole file, timed, checked against its sha256.
fn checksum(
    broker: &mut Broker,
    file: &Path,
    size: u64,
    whole: &[u8; 32],
) -> Result<Throughput, String> {
    let path = file
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", file.display()))?;
    let path = serde_json::to_string(path).map_err(|e| e.to_string())?;
    let elapsed = read::whole_file_checksum(broker, &path, whole)?;
    Ok(Throughput::new(size, elapsed))
}

/// A pair from its two runs (index 1: with the hash).
fn pair_of(got: [Option<Throughput>; 2], hashed_first: bool) -> Result<IntegrityPair, String> {
    let [Some(off), Some(on)] = got else {
        return Err("a run of the pair did not run".into());
    };
    Ok(IntegrityPair {
        hashed_first,
        ratio: on.mb_per_s / off.mb_per_s,
        off,
        on,
    })
}

fn geomean(pairs: &[IntegrityPair]) -> Option<f64> {
    (!pairs.is_empty()).then(|| {
        let logs: f64 = pairs.iter().map(|p| p.ratio.ln()).sum();
        (logs / pairs.len() as f64).exp()
    })
}

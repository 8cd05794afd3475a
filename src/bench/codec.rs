//! The bench's base64: the same engine and configuration as the broker's (the SIMD engine of
//! the `base64` crate, standard alphabet with padding), built here because the library keeps
//! its own to itself.

use std::sync::LazyLock;

use base64::engine::Simd;
use base64::engine::general_purpose::PAD;

/// The SIMD base64 engine (AVX2 or NEON when the CPU has it, scalar otherwise), detected once.
pub(crate) static BASE64: LazyLock<Simd> = LazyLock::new(|| Simd::standard(PAD));

/// Appends the base64 of `data` to `out`, encoding in place (no intermediate string).
pub(crate) fn base64_into(data: &[u8], out: &mut Vec<u8>) {
    use base64::Engine;
    let start = out.len();
    let Some(len) = base64::encoded_len(data.len(), true) else {
        return;
    };
    out.resize(start + len, 0);
    match BASE64.encode_slice(data, &mut out[start..]) {
        Ok(written) => out.truncate(start + written),
        // The slice was sized by `encoded_len`, so this cannot happen; keep the line valid.
        Err(_) => out.truncate(start),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    #[test]
    fn matches_the_reference_engine() {
        for n in [0usize, 1, 2, 3, 31, 32, 33, 1000, 4097] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let mut out = b"x".to_vec();
            super::base64_into(&data, &mut out);
            let reference = base64::engine::general_purpose::STANDARD.encode(&data);
            assert_eq!(&out[1..], reference.as_bytes());
            assert_eq!(super::BASE64.decode(reference).unwrap(), data);
        }
    }
}

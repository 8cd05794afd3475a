//! SHA-256 for the integrity extension (`sha256` on `files/read` and `files/write`, and
//! `files/checksum`): hex spelling, and the hash of a file's range read in cache-sized
//! pieces.
//!
//! `sha2` picks its engine when first used: the CPU's SHA extensions (SHA-NI on x86-64)
//! where they exist, else portable code. [`engine`] says which, for `fsbroker bench`.

use std::os::unix::fs::FileExt;

use sha2::{Digest, Sha256};

/// Bytes hashed per `pread`: small enough to stay in the CPU's cache between the read and
/// the hash, large enough that the system call is a small part of the work.
pub(crate) const PIECE: usize = 256 << 10;

/// Lower-case hex of a digest.
pub(crate) fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(digest.len() * 2);
    for b in digest {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The SHA-256 of `bytes`, in hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Whether `s` is a SHA-256 in hex (64 hex digits, either case).
pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Hashes up to `len` bytes of `file` from `offset` (fewer if the file ends first), asking
/// `go_on` before each piece whether to continue (the caller's deadline): `Ok(None)` when it
/// said no. Returns the hex digest and how many bytes it covers.
pub(crate) fn hash_range(
    file: &std::fs::File,
    offset: u64,
    len: u64,
    mut go_on: impl FnMut() -> bool,
) -> std::io::Result<Option<(String, u64)>> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; PIECE.min(usize::try_from(len).unwrap_or(PIECE)).max(1)];
    let mut done: u64 = 0;
    while done < len {
        if !go_on() {
            return Ok(None);
        }
        let want = buf
            .len()
            .min(usize::try_from(len - done).unwrap_or(usize::MAX));
        let n = match file.read_at(&mut buf[..want], offset + done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        done += n as u64;
    }
    Ok(Some((hex(&hasher.finalize()), done)))
}

/// Which SHA-256 engine this CPU gets: `"sha-ni"` (x86-64's SHA extensions), `"armv8-sha2"`,
/// or `"portable"`. Mirrors the features `sha2` checks before it uses them.
pub fn engine() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse2")
            && std::arch::is_x86_feature_detected!("ssse3")
            && std::arch::is_x86_feature_detected!("sse4.1")
        {
            return "sha-ni";
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("sha2") {
            return "armv8-sha2";
        }
    }
    "portable"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_of_the_empty_input_is_the_known_digest() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(is_sha256_hex(&sha256_hex(b"abc")));
        assert!(!is_sha256_hex("e3b0"));
        assert!(!is_sha256_hex(&"g".repeat(64)));
    }
}

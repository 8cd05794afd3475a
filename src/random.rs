//! Random names from the OS: lock ids, nonces, staging and watch ids. A module of its own so
//! that every layer can draw one without depending on the one that first needed it.

use std::time::Instant;

/// `n` random bytes from the OS, as lowercase hex (for lock ids and temporary names).
pub(crate) fn hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(k) => filled += k,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom(2) cannot fail once the pool is initialised except by interruption;
            // should it, fall back to the time and address entropy rather than panic.
            Err(_) => {
                let t = Instant::now();
                let fallback = format!("{t:?}{:p}", &bytes);
                for (i, b) in fallback.bytes().enumerate() {
                    bytes[(filled + i) % n] ^= b;
                }
                break;
            }
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

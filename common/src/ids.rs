//! Owns reservation ids: unique across processes and restarts without a
//! coordinator, and the idempotency key from Redis all the way into MySQL.
//!
//! An id is 32 lowercase hex digits: 64 bits read from the operating system's
//! random source once per process, then a 64-bit per-process counter. Two
//! processes collide only if their random halves are equal (probability
//! 2^-64 per pair), and a restart draws a new random half, so ids never depend
//! on Redis keeping a counter across a data loss.

use std::fs::File;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static PREFIX: OnceLock<u64> = OnceLock::new();
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn process_prefix() -> u64 {
    *PREFIX.get_or_init(|| {
        let mut buf = [0u8; 8];
        let from_os = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
        if from_os.is_err() {
            // No /dev/urandom (a chroot): fall back to std's randomly keyed
            // SipHash, which is seeded from the OS in another way, mixed
            // with the pid and the time.
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            return h.finish();
        }
        u64::from_le_bytes(buf)
    })
}

/// A new reservation id, e.g. `"9f86d081884c7d65000000000000002a"`.
pub fn new_reservation_id() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // `format!("{:016x}{:016x}")` by hand: one allocation, no formatter
    // (a purchase's id is drawn on its connection thread); the prefix's
    // digits are written once per process.
    static PREFIX_HEX: OnceLock<String> = OnceLock::new();
    let prefix = PREFIX_HEX.get_or_init(|| format!("{:016x}", process_prefix()));
    let mut id = String::with_capacity(32);
    id.push_str(prefix);
    id.push_str(hex16(n, &mut [0u8; 16]));
    id
}

/// `v` as 16 lowercase hex digits, written into `buf`.
fn hex16(v: u64, buf: &mut [u8; 16]) -> &str {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (i, d) in buf.iter_mut().enumerate() {
        *d = HEX[((v >> ((15 - i) * 4)) & 0xf) as usize];
    }
    // Hex digits are ASCII, so this is never the empty fallback.
    std::str::from_utf8(buf).unwrap_or_default()
}

/// The reservation id of a purchase made with an `Idempotency-Key`: the
/// first 32 hex digits of SHA-256 over the sale, the buyer and the key, so
/// every gateway draws the same id for the same key and the reservation
/// script recognises a repeat by it (its flow record or status exists).
/// An id is not a credential: every route that acts on one checks the
/// buyer's token.
pub fn keyed_reservation_id(sale_id: u64, user_id: &str, key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"seckill-idempotency-v1\n");
    h.update(sale_id.to_string().as_bytes());
    h.update(b"\n");
    h.update(user_id.as_bytes());
    h.update(b"\n");
    h.update(key.as_bytes());
    let d = h.finalize();
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is an acceptable `Idempotency-Key`: 1-64 characters of
/// `A-Z a-z 0-9 _ . : -` (a UUID fits).
pub fn is_valid_idempotency_key(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// Whether `s` has the shape of a reservation id (32 lowercase hex digits).
pub fn is_valid_reservation_id(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_well_formed_and_distinct() {
        let ids: HashSet<String> = (0..10_000).map(|_| new_reservation_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|i| is_valid_reservation_id(i)));
        assert!(!is_valid_reservation_id("ABCDEF0123456789abcdef0123456789"));
        let (id, next) = (new_reservation_id(), COUNTER.load(Ordering::Relaxed));
        assert!(id.starts_with(&format!("{:016x}", process_prefix())));
        assert!(u64::from_str_radix(&id[16..], 16).is_ok_and(|n| n < next));
        let k = keyed_reservation_id(7, "alice", "k-1");
        assert!(is_valid_reservation_id(&k));
        assert_eq!(k, keyed_reservation_id(7, "alice", "k-1"));
        assert_ne!(k, keyed_reservation_id(7, "alice", "k-2"));
        assert_ne!(k, keyed_reservation_id(8, "alice", "k-1"));
        assert!(is_valid_idempotency_key(
            "550e8400-e29b-41d4-a716-446655440000"
        ));
        assert!(!is_valid_idempotency_key("") && !is_valid_idempotency_key("a b"));
        assert!(!is_valid_idempotency_key(&"k".repeat(65)));
        for v in [0, 42, u64::MAX, 0x0123_4567_89ab_cdef] {
            assert_eq!(hex16(v, &mut [0; 16]), format!("{v:016x}"));
        }
    }
}

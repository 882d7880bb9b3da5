//! Request ids: the name a request carries from the edge through every hop and into every log line
//! it causes.
//!
//! A caller may send its own id in `x-request-id`; it is kept only if it is 1 to 64 characters of
//! `[A-Za-z0-9._-]` (anything else — control characters, quotes, spaces, a long value — could forge
//! or break a log line, and is replaced). Otherwise the process makes one: 16 hex digits, a random
//! per-process prefix and a counter, unique within the process and unlikely to meet another's.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The HTTP header that carries a request id, in and out.
pub const HEADER: &str = "x-request-id";

/// The longest id accepted from a caller.
pub const MAX_LEN: usize = 64;

/// Whether `id` may be kept as a request id (1 to 64 characters of `[A-Za-z0-9._-]`).
pub fn is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A fresh id: 16 lowercase hex digits.
pub fn fresh() -> String {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        // RandomState is seeded from the OS's randomness once per process.
        let mut h = RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() as u32
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix:08x}{:08x}", n as u32)
}

/// The id to use for a request that arrived with `given` (the header's value, if any): `given`
/// when it is valid, a fresh one otherwise.
pub fn accept(given: Option<&str>) -> String {
    match given {
        Some(id) if is_valid(id) => id.to_string(),
        _ => fresh(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids_are_kept_and_hostile_ones_replaced() {
        assert_eq!(accept(Some("abc-DEF_1.2")), "abc-DEF_1.2");
        let long = "a".repeat(MAX_LEN);
        assert_eq!(accept(Some(&long)), long);
        for bad in [
            "",
            "has space",
            "quote\"",
            "new\nline",
            "tab\t",
            "é",
            "{\"json\":1}",
            &"a".repeat(MAX_LEN + 1),
        ] {
            let id = accept(Some(bad));
            assert_ne!(id, bad);
            assert_eq!(id.len(), 16);
            assert!(is_valid(&id));
        }
    }

    #[test]
    fn fresh_ids_differ() {
        let a = fresh();
        let b = fresh();
        assert_ne!(a, b);
        assert_eq!(a[..8], b[..8], "one prefix per process");
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}

//! Transaction expiry: what bounds the ledger's replay-answer state.
//!
//! Every transaction carries `expires`, the last second (Unix time) at which a ledger may apply
//! it, inside the signed txid. The rules:
//! - **At the edge** ([`check`]), a sentinel refuses a transaction whose expiry has passed
//!   ([`ExpiryError::Expired`]) or lies more than [`MAX_TTL_SECS`] (plus [`CLOCK_SKEW_SECS`]) in
//!   the future ([`ExpiryError::TooFarAhead`]): no transaction keeps a txid remembered for long.
//! - **In a store**, a transaction not applied before whose expiry is before the store's clock is
//!   answered [`crate::SwapOutcome::Expired`] and changes nothing; a transfer's or a redeem's
//!   txid is forgotten once its expiry is before the store's clock. So a store remembers only
//!   the transactions of the last [`MAX_TTL_SECS`] (the replay-answer state is at most the
//!   transaction rate times that), and a replay after expiry is told "expired", never "missing
//!   input".
//! - **Mints are remembered for ever**: a mint has no inputs, so only its txid stops a replay
//!   from issuing its value twice, and the issuer's audit asks for every mint it journaled. That
//!   state grows with issuance events, which only the issuer creates, not with payments.
//!
//! Forgetting a transfer is safe whatever the clocks say: its inputs are spent for good and its
//! outputs are unique (their serials hash the txid), so a forgotten transfer can never apply
//! again. Clocks decide only *when* a txid is forgotten and which answer a late replay gets.

use std::collections::{BTreeMap, HashMap};

use florin_crypto::Digest;
use thiserror::Error;

/// The validity a wallet gives a transaction it builds: ten minutes.
pub const DEFAULT_TTL_SECS: u64 = 600;
/// The longest validity a ledger accepts: fifteen minutes. The replay-answer state holds at
/// most this long's transactions.
pub const MAX_TTL_SECS: u64 = 900;
/// How far the clocks of a builder and a sentinel may disagree.
pub const CLOCK_SKEW_SECS: u64 = 60;

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The expiry of a transaction built now with the default validity.
pub fn default_expiry() -> u64 {
    unix_now().saturating_add(DEFAULT_TTL_SECS)
}

/// Whether an `expired` answer about a transaction with this expiry is final at `now`: no
/// ledger can still apply it. A sentinel whose clock lags by up to [`CLOCK_SKEW_SECS`] may
/// still pass it, and the transaction may still be in a batch committing on some shard; twice
/// the skew after its expiry neither holds. Before that, whoever asks waits and asks again.
/// A version-1 transaction ([`crate::tx::LEGACY_EXPIRES`]) is refused by every ledger: its
/// answer is final at once.
pub fn expired_for_good(expires: u64, now: u64) -> bool {
    expires == crate::tx::LEGACY_EXPIRES || now > expires.saturating_add(2 * CLOCK_SKEW_SECS)
}

/// Why a transaction's expiry is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ExpiryError {
    /// Its expiry has passed.
    #[error(
        "the transaction expired at {expires} (Unix seconds); it is now {now}: build it again"
    )]
    Expired {
        /// Its expiry.
        expires: u64,
        /// The ledger's clock.
        now: u64,
    },
    /// Its expiry is further ahead than any ledger keeps a txid.
    #[error("the transaction's expiry {expires} is more than {MAX_TTL_SECS} s after now ({now})")]
    TooFarAhead {
        /// Its expiry.
        expires: u64,
        /// The ledger's clock.
        now: u64,
    },
}

/// The edge's check of an expiry against the clock `now`.
pub fn check(expires: u64, now: u64) -> Result<(), ExpiryError> {
    if expires < now {
        return Err(ExpiryError::Expired { expires, now });
    }
    if expires > now.saturating_add(MAX_TTL_SECS + CLOCK_SKEW_SECS) {
        return Err(ExpiryError::TooFarAhead { expires, now });
    }
    Ok(())
}

/// Txids are uniformly random hashes: a fast keyed hasher is enough.
type Fast = foldhash::fast::RandomState;

/// The txids a store remembers to answer replays, each with a value `V` (what the store keeps
/// about it) and an expiry: forgotten once the clock passes its expiry, or kept for ever.
///
/// The clock is whatever [`TxMemory::advance`] is given (the store's; a replicated store's
/// comes from its commands, so every replica forgets the same txids at the same point).
/// Forgetting costs one map removal per txid: txids are grouped by expiry second, and a
/// clock advance pops the seconds that passed.
///
/// Each second's txids are kept in chunks of [`CHUNK`] (8 KiB), and the chunks of seconds
/// that passed are kept for reuse (as many as were ever live at once): at a steady
/// transaction rate nothing is allocated or freed once the memory has warmed up, so resident
/// memory stays flat instead of drifting with the allocator's fragmentation.
#[derive(Debug, Clone)]
pub struct TxMemory<V> {
    map: HashMap<Digest, (V, u64), Fast>,
    /// What the table could hold when it was last sized here (at least twice its entries).
    room: usize,
    by_expiry: BTreeMap<u64, Vec<Vec<Digest>>>,
    spare: Vec<Vec<Digest>>,
    now: u64,
}

/// Txids per chunk of [`TxMemory`]'s expiry index.
pub const CHUNK: usize = 256;

impl<V> Default for TxMemory<V> {
    fn default() -> Self {
        TxMemory {
            map: HashMap::default(),
            room: 0,
            by_expiry: BTreeMap::new(),
            spare: Vec::new(),
            now: 0,
        }
    }
}

/// Grows `map` ahead of need so it can always hold twice its entries (`room` is what it could
/// hold when last sized here), before `more` are inserted.
///
/// Under steady churn — as many entries removed as inserted, as a store's unspent set and its
/// remembered txids see — a hash table's deleted slots fill it up; `hashbrown` then cleans them
/// in place if at most half of it is live, and otherwise doubles. Left to itself it so doubles
/// at some such moment, however late in a run; kept at least twice its entries, it only ever
/// cleans in place. Its size then follows the most entries it ever held at once, reached during
/// warm-up, instead of stepping up hours into a run.
pub fn keep_room<K, V, S>(map: &mut HashMap<K, V, S>, room: &mut usize, more: usize)
where
    K: Eq + std::hash::Hash,
    S: std::hash::BuildHasher,
{
    let want = (map.len() + more) * 2;
    if want > *room {
        map.reserve(want - map.len());
        *room = map.capacity();
    }
}

/// The expiry a txid kept for ever is recorded with.
pub const FOR_EVER: u64 = u64::MAX;

impl<V> TxMemory<V> {
    /// The clock: the highest time [`TxMemory::advance`] was given.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Raises the clock to `now` (never lowers it) and forgets every txid whose expiry is
    /// before it. Returns how many were forgotten.
    pub fn advance(&mut self, now: u64) -> usize {
        self.now = self.now.max(now);
        let mut forgotten = 0;
        while let Some(entry) = self.by_expiry.first_entry() {
            if *entry.key() >= self.now {
                break;
            }
            for mut chunk in entry.remove() {
                for txid in chunk.drain(..) {
                    if self.map.remove(&txid).is_some() {
                        forgotten += 1;
                    }
                }
                self.spare.push(chunk);
            }
        }
        forgotten
    }

    /// Remembers `txid` until the clock passes `expires` ([`FOR_EVER`]: always). A txid
    /// already expired is not remembered (a replay of it is refused as expired anyway); one
    /// already remembered keeps its first value and expiry.
    pub fn insert(&mut self, txid: Digest, value: V, expires: u64) {
        if expires < self.now {
            return;
        }
        keep_room(&mut self.map, &mut self.room, 1);
        if let std::collections::hash_map::Entry::Vacant(slot) = self.map.entry(txid) {
            slot.insert((value, expires));
            if expires != FOR_EVER {
                let chunks = self.by_expiry.entry(expires).or_default();
                match chunks.last_mut() {
                    Some(c) if c.len() < CHUNK => c.push(txid),
                    _ => {
                        let mut c = self
                            .spare
                            .pop()
                            .unwrap_or_else(|| Vec::with_capacity(CHUNK));
                        c.push(txid);
                        chunks.push(c);
                    }
                }
            }
        }
    }

    /// What is remembered of `txid`.
    pub fn get(&self, txid: &Digest) -> Option<&V> {
        self.map.get(txid).map(|(v, _)| v)
    }

    /// Whether `txid` is remembered.
    pub fn contains(&self, txid: &Digest) -> bool {
        self.map.contains_key(txid)
    }

    /// How many txids are remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every remembered txid with its value and expiry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Digest, &V, u64)> {
        self.map.iter().map(|(t, (v, e))| (t, v, *e))
    }

    /// Room for `n` more txids.
    pub fn reserve(&mut self, n: usize) {
        self.map.reserve(n);
        self.room = self.room.max(self.map.capacity());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u8) -> Digest {
        [n; 32]
    }

    #[test]
    fn txids_are_forgotten_once_the_clock_passes_their_expiry_and_kept_ones_never() {
        let mut m = TxMemory::default();
        m.advance(100);
        m.insert(t(1), 'a', 100);
        m.insert(t(2), 'b', 105);
        m.insert(t(3), 'c', FOR_EVER);
        m.insert(t(4), 'd', 99); // already expired: not remembered
        assert_eq!(m.len(), 3);
        assert_eq!(m.advance(100), 0, "expiry is inclusive");
        assert_eq!(m.get(&t(1)), Some(&'a'));
        assert_eq!(m.advance(101), 1);
        assert!(!m.contains(&t(1)) && m.contains(&t(2)));
        assert_eq!(m.advance(50), 0, "the clock never goes back");
        assert_eq!(m.now(), 101);
        assert_eq!(m.advance(u64::MAX), 1);
        assert!(m.contains(&t(3)) && m.len() == 1);
        // Inserting a remembered txid again keeps one entry.
        m.insert(t(3), 'e', FOR_EVER);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn an_expired_answer_is_final_twice_the_skew_after_the_expiry() {
        assert!(!expired_for_good(1000, 1000 + 2 * CLOCK_SKEW_SECS));
        assert!(expired_for_good(1000, 1001 + 2 * CLOCK_SKEW_SECS));
        assert!(!expired_for_good(u64::MAX - 1, u64::MAX));
        assert!(expired_for_good(crate::tx::LEGACY_EXPIRES, 0));
    }

    #[test]
    fn chunks_of_passed_seconds_are_reused() {
        let mut m = TxMemory::default();
        let id = |n: u32| {
            let mut d = [0u8; 32];
            d[..4].copy_from_slice(&n.to_le_bytes());
            d
        };
        // Two and a half chunks a second for ten seconds, each second forgotten as the next
        // one comes: after the first round, every chunk comes from the spares.
        let per = CHUNK as u32 * 5 / 2;
        for sec in 0..10u32 {
            m.advance(u64::from(sec));
            for k in 0..per {
                m.insert(id(sec * per + k), (), u64::from(sec));
            }
            assert_eq!(m.len(), per as usize);
            let live: usize = m.by_expiry.values().map(Vec::len).sum();
            assert!(
                live + m.spare.len() <= 6,
                "{live} live, {} spare",
                m.spare.len()
            );
        }
        assert!(m
            .spare
            .iter()
            .all(|c| c.is_empty() && c.capacity() >= CHUNK));
    }

    #[test]
    fn the_window_is_now_to_the_longest_validity() {
        assert!(check(1000, 1000).is_ok());
        assert!(check(1000 + MAX_TTL_SECS + CLOCK_SKEW_SECS, 1000).is_ok());
        assert_eq!(
            check(999, 1000),
            Err(ExpiryError::Expired {
                expires: 999,
                now: 1000
            })
        );
        assert!(matches!(
            check(1001 + MAX_TTL_SECS + CLOCK_SKEW_SECS, 1000),
            Err(ExpiryError::TooFarAhead { .. })
        ));
        assert!(check(u64::MAX, u64::MAX - 1).is_ok());
        assert!(check(0, 0).is_ok());
    }
}

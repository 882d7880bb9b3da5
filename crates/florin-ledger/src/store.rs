//! The swap engine's contract, shared by every store (in-memory, embedded durable,
//! PostgreSQL), and the one test suite every store must pass ([`testing::run_suite`]).

use florin_crypto::Digest;
use serde::Serialize;
use thiserror::Error;

use crate::compact::CompactTx;
use crate::tx::UhsId;

/// What a swap did to one compact transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapOutcome {
    /// Committed and durable: inputs removed, outputs inserted.
    Confirmed,
    /// An input is missing (spent, or never existed): nothing changed. State-invalid.
    MissingInput,
    /// The transaction was applied before; nothing changed (a replay).
    AlreadyApplied,
    /// Its expiry has passed and the store does not remember applying it: nothing changed
    /// (a transfer applied before is forgotten after its expiry; its spent inputs say whether
    /// it was). Last, so older encodings still decode.
    Expired,
}

/// The ledger's books, for the supply audit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Supply {
    /// Cents ever minted.
    pub minted_cents: u64,
    /// Cents ever redeemed.
    pub redeemed_cents: u64,
    /// Cents in unspent outputs (summed from the values stored beside the ids).
    pub unspent_cents: u64,
    /// Unspent outputs.
    pub unspent_count: u64,
}

/// Why a store failed. A failed call changed nothing.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// I/O failure.
    #[error("store I/O: {0}")]
    Io(String),
    /// Stored data is corrupt.
    #[error("store corrupt: {0}")]
    Corrupt(String),
    /// A durable file is damaged (or missing) where a crash cannot explain it: the store
    /// refuses to open and has changed nothing on disk.
    #[error("{file}: damaged at byte {offset}: expected {expected}, found {found}")]
    Damaged {
        /// The file.
        file: String,
        /// Byte offset of the damage in the file.
        offset: u64,
        /// What should have been there.
        expected: String,
        /// What was there.
        found: String,
    },
    /// The backend (a database) refused.
    #[error("store backend: {0}")]
    Backend(String),
}

/// A set of UHS ids with one atomic primitive.
pub trait SwapStore: Send + Sync {
    /// Applies compact transactions in order at the clock `now` (Unix seconds; a store's clock
    /// is the highest `now` it was given; transfers and redeems whose expiry is before it may
    /// be forgotten, [`crate::expiry`]). For each transaction: a transfer or redeem whose
    /// expiry is before the clock is [`SwapOutcome::Expired`]; a mint whose expiry is before the
    /// clock is [`SwapOutcome::AlreadyApplied`] if it was applied, else `Expired`; otherwise, if
    /// its txid was applied before, [`SwapOutcome::AlreadyApplied`]; else if all inputs
    /// exist, removes them and inserts the outputs ([`SwapOutcome::Confirmed`]); otherwise
    /// changes nothing ([`SwapOutcome::MissingInput`]). The whole batch is durable when this
    /// returns.
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError>;
    /// [`SwapStore::swap_at`] at this machine's clock.
    fn swap(&self, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        self.swap_at(crate::expiry::unix_now(), batch)
    }
    /// Whether an id is unspent.
    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError>;
    /// Whether a transaction was confirmed: mints for ever, transfers and redeems at least until
    /// their expiry has passed (after that a store may have forgotten them: whether their
    /// inputs are spent and their outputs exist says it).
    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError>;
    /// The books.
    fn supply(&self) -> Result<Supply, StoreError>;
    /// A cheap, advisory look at a transaction's inputs, asked before any of its signatures
    /// is verified: `Some(false)` when one of `inputs` is not unspent and `txid` was never
    /// applied (the swap would refuse it now), `Some(true)` when all are unspent or it was
    /// applied, `None` when the store cannot tell at once (its lock is busy, or a look would
    /// cross the network). The default is `None`: every transaction is verified in full.
    fn inputs_hint(&self, _txid: &Digest, _inputs: &[UhsId]) -> Option<bool> {
        None
    }
}

/// The shared store suite and its helpers. It is a test suite: it panics on the first failed
/// check, so it allows `unwrap`.
#[allow(clippy::unwrap_used)]
pub mod testing {
    use super::*;
    use crate::compact::TxKind;

    /// The expiry the suite's transactions carry unless a check sets another: far ahead of any
    /// clock the suite passes.
    pub const FAR: u64 = 1 << 40;

    /// A deterministic id.
    pub fn id(n: u64) -> UhsId {
        florin_crypto::hash("florin/ledger/test-id", &[&n.to_le_bytes()])
    }

    /// A mint of the given (id, value) outputs under `txid`.
    pub fn mint(txid: u64, outputs: &[(u64, u64)]) -> CompactTx {
        CompactTx {
            txid: id(1 << 40 | txid),
            kind: TxKind::Mint,
            inputs: vec![],
            outputs: outputs.iter().map(|(i, v)| (id(*i), *v)).collect(),
            expires: FAR,
        }
    }

    /// A transfer spending `inputs` into (id, value) `outputs`.
    pub fn transfer(txid: u64, inputs: &[u64], outputs: &[(u64, u64)]) -> CompactTx {
        CompactTx {
            txid: id(2 << 40 | txid),
            kind: TxKind::Transfer,
            inputs: inputs.iter().map(|i| id(*i)).collect(),
            outputs: outputs.iter().map(|(i, v)| (id(*i), *v)).collect(),
            expires: FAR,
        }
    }

    /// A redeem of `inputs`.
    pub fn redeem(txid: u64, inputs: &[u64]) -> CompactTx {
        CompactTx {
            txid: id(3 << 40 | txid),
            kind: TxKind::Redeem,
            inputs: inputs.iter().map(|i| id(*i)).collect(),
            outputs: vec![],
            expires: FAR,
        }
    }

    /// The shared suite: every store must pass every check. `open` returns a fresh store, and
    /// for durable stores `reopen` returns the same store after a restart (else it may return
    /// the same handle).
    pub fn run_suite<S: SwapStore>(open: impl Fn() -> S, reopen: impl Fn(S) -> S) {
        use SwapOutcome::*;
        // Double spend: the second spender fails, its other inputs stay unspent.
        let s = open();
        assert_eq!(
            s.swap(&[mint(1, &[(1, 100), (2, 50), (3, 25)])]).unwrap(),
            vec![Confirmed]
        );
        let out = s
            .swap(&[
                transfer(1, &[1, 2], &[(10, 150)]),
                transfer(2, &[2, 3], &[(11, 75)]),
            ])
            .unwrap();
        assert_eq!(out, vec![Confirmed, MissingInput]);
        assert!(
            s.is_unspent(&id(3)).unwrap(),
            "the loser's other input stays unspent"
        );
        assert!(!s.is_unspent(&id(1)).unwrap() && !s.is_unspent(&id(2)).unwrap());
        assert!(s.is_unspent(&id(10)).unwrap() && !s.is_unspent(&id(11)).unwrap());
        assert!(s.is_confirmed(&transfer(1, &[], &[]).txid).unwrap());
        assert!(!s.is_confirmed(&transfer(2, &[], &[]).txid).unwrap());

        // A replayed transaction changes nothing.
        assert_eq!(
            s.swap(&[transfer(1, &[1, 2], &[(10, 150)])]).unwrap(),
            vec![AlreadyApplied]
        );
        // A replayed mint creates nothing, even after its outputs were spent.
        assert_eq!(
            s.swap(&[transfer(3, &[10], &[(12, 150)])]).unwrap(),
            vec![Confirmed]
        );
        assert_eq!(
            s.swap(&[mint(1, &[(1, 100), (2, 50), (3, 25)])]).unwrap(),
            vec![AlreadyApplied]
        );
        assert!(!s.is_unspent(&id(1)).unwrap(), "a spent id never returns");
        // A batch with a conflict applies the rest.
        let out = s
            .swap(&[
                mint(2, &[(20, 5), (21, 5)]),
                transfer(4, &[20], &[(22, 5)]),
                transfer(5, &[20], &[(23, 5)]),
                transfer(6, &[21], &[(24, 5)]),
            ])
            .unwrap();
        assert_eq!(out, vec![Confirmed, Confirmed, MissingInput, Confirmed]);
        // Unknown inputs.
        assert_eq!(
            s.swap(&[transfer(7, &[999], &[(25, 1)])]).unwrap(),
            vec![MissingInput]
        );
        // Redeem destroys value.
        assert_eq!(s.swap(&[redeem(1, &[22])]).unwrap(), vec![Confirmed]);
        let books = s.supply().unwrap();
        assert_eq!(books.minted_cents, 185);
        assert_eq!(books.redeemed_cents, 5);
        assert_eq!(books.unspent_cents, 180);
        assert_eq!(books.unspent_count, 3); // 3 (25), 12 (150), 24 (5)
                                            // Everything above survives a restart.
        let s = reopen(s);
        assert_eq!(s.supply().unwrap(), books);
        assert!(s.is_unspent(&id(12)).unwrap() && !s.is_unspent(&id(10)).unwrap());
        assert_eq!(
            s.swap(&[transfer(1, &[1, 2], &[(10, 150)])]).unwrap(),
            vec![AlreadyApplied]
        );
        assert_eq!(
            s.swap(&[transfer(8, &[12], &[(30, 100), (31, 50)])])
                .unwrap(),
            vec![Confirmed]
        );
        // An empty batch is fine.
        assert!(s.swap(&[]).unwrap().is_empty());

        // Expiry. A transaction whose expiry is before the store's clock changes nothing.
        drop(s);
        let s = open();
        let soon = |mut t: CompactTx, at: u64| {
            t.expires = at;
            t
        };
        // Near real time: a replicated store never takes a clock far ahead of its own.
        let t0 = crate::expiry::unix_now();
        assert_eq!(
            s.swap_at(t0, &[soon(mint(100, &[(100, 100), (101, 100)]), t0 + 10)])
                .unwrap(),
            vec![Confirmed]
        );
        let pay = soon(transfer(100, &[100], &[(110, 100)]), t0 + 10);
        let late = soon(transfer(101, &[101], &[(111, 100)]), t0 - 1);
        assert_eq!(
            s.swap_at(t0, &[pay.clone(), late.clone()]).unwrap(),
            vec![Confirmed, Expired]
        );
        assert!(s.is_unspent(&id(101)).unwrap() && !s.is_unspent(&id(111)).unwrap());
        // Within its validity a replay is answered as one.
        assert_eq!(
            s.swap_at(t0 + 10, std::slice::from_ref(&pay)).unwrap(),
            vec![AlreadyApplied]
        );
        // After it, the replay is refused as expired: never applied again, never "missing".
        // A mint is remembered for ever.
        let s = reopen(s);
        assert_eq!(
            s.swap_at(
                t0 + 11,
                &[
                    pay.clone(),
                    soon(mint(100, &[(100, 100), (101, 100)]), t0 + 10)
                ]
            )
            .unwrap(),
            vec![Expired, AlreadyApplied]
        );
        assert!(s.is_confirmed(&mint(100, &[]).txid).unwrap());
        assert!(!s.is_unspent(&id(100)).unwrap() && s.is_unspent(&id(110)).unwrap());
        // The clock never goes back: an earlier `now` does not revive an expired transaction.
        assert_eq!(s.swap_at(t0, &[late]).unwrap(), vec![Expired]);
        assert!(s.is_unspent(&id(101)).unwrap());
    }
}

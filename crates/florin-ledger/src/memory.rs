//! The in-memory swap store: for tests and simulation. Not durable.

use std::collections::HashMap;
use std::sync::Mutex;

use florin_crypto::Digest;

use crate::compact::{CompactTx, TxKind};
use crate::expiry::{TxMemory, FOR_EVER};
use crate::store::{StoreError, Supply, SwapOutcome, SwapStore};
use crate::tx::UhsId;

/// Ids are SHA-256 outputs, so a fast keyed hasher (randomly seeded per process) is enough;
/// SipHash would spend more time hashing than the set spends on everything else.
type Fast = foldhash::fast::RandomState;

/// The UHS state, shared by the in-memory and the embedded durable store
/// (`florin_store::embedded`).
#[derive(Default)]
pub struct UhsState {
    /// Unspent ids and their values.
    pub unspent: HashMap<UhsId, u64, Fast>,
    /// Confirmed txids: transfers and redeems until their expiry, mints for ever.
    pub applied: TxMemory<()>,
    /// Cents ever minted.
    pub minted: u64,
    /// Cents ever redeemed.
    pub redeemed: u64,
    /// What `unspent` could hold when last sized ([`crate::expiry::keep_room`]).
    pub unspent_room: usize,
}

impl UhsState {
    /// Raises the clock to `now` (Unix seconds; never lowers it) and forgets the txids of
    /// transfers and redeems that expired ([`crate::expiry`]).
    pub fn advance(&mut self, now: u64) {
        self.applied.advance(now);
    }

    /// Applies one compact transaction (the swap primitive) at the clock of the last
    /// [`UhsState::advance`]: a replay still remembered is `AlreadyApplied`, a transaction
    /// whose expiry is before the clock `Expired`.
    pub fn apply(&mut self, tx: &CompactTx) -> SwapOutcome {
        // A remembered transfer or redeem has not expired (they are forgotten at expiry), so
        // this is the store contract's order: expired transfers first, then replays.
        if self.applied.contains(&tx.txid) {
            return SwapOutcome::AlreadyApplied;
        }
        if tx.expires < self.applied.now() {
            return SwapOutcome::Expired;
        }
        if !tx.inputs.iter().all(|i| self.unspent.contains_key(i))
            || tx.outputs.iter().any(|(o, _)| self.unspent.contains_key(o))
        {
            return SwapOutcome::MissingInput;
        }
        let mut removed = 0u64;
        for i in &tx.inputs {
            removed = removed.saturating_add(self.unspent.remove(i).unwrap_or(0));
        }
        let mut added = 0u64;
        crate::expiry::keep_room(&mut self.unspent, &mut self.unspent_room, tx.outputs.len());
        for (o, v) in &tx.outputs {
            self.unspent.insert(*o, *v);
            added = added.saturating_add(*v);
        }
        match tx.kind {
            TxKind::Mint => self.minted = self.minted.saturating_add(added),
            TxKind::Redeem => self.redeemed = self.redeemed.saturating_add(removed),
            TxKind::Transfer => {}
        }
        let keep = if tx.forgettable() {
            tx.expires
        } else {
            FOR_EVER
        };
        self.applied.insert(tx.txid, (), keep);
        SwapOutcome::Confirmed
    }

    /// Whether a transaction could be applied as far as its inputs go: all of `inputs` are
    /// unspent, or `txid` was applied (a resubmission). The advisory check run before any
    /// signature is verified ([`SwapStore::inputs_hint`]).
    pub fn inputs_present(&self, txid: &Digest, inputs: &[UhsId]) -> bool {
        inputs.iter().all(|i| self.unspent.contains_key(i)) || self.applied.contains(txid)
    }

    /// The books.
    pub fn supply(&self) -> Supply {
        Supply {
            minted_cents: self.minted,
            redeemed_cents: self.redeemed,
            unspent_cents: self
                .unspent
                .values()
                .fold(0u64, |a, v| a.saturating_add(*v)),
            unspent_count: self.unspent.len() as u64,
        }
    }
}

/// A swap store in memory.
#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<UhsState>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, UhsState>, StoreError> {
        self.state
            .lock()
            .map_err(|_| StoreError::Corrupt("a writer panicked".into()))
    }
}

impl SwapStore for MemoryStore {
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        let mut s = self.lock()?;
        s.advance(now);
        Ok(batch.iter().map(|tx| s.apply(tx)).collect())
    }

    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        Ok(self.lock()?.unspent.contains_key(id))
    }

    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        Ok(self.lock()?.applied.contains(txid))
    }

    fn supply(&self) -> Result<Supply, StoreError> {
        Ok(self.lock()?.supply())
    }

    fn inputs_hint(&self, txid: &Digest, inputs: &[UhsId]) -> Option<bool> {
        Some(self.state.try_lock().ok()?.inputs_present(txid, inputs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_suite() {
        crate::store::testing::run_suite(MemoryStore::new, |s| s);
    }
}

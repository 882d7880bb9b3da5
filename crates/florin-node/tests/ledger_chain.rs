//! A chain of transactions inside one group when the store cannot always answer the cheap
//! look at inputs (it is busy committing): a link verified in full whose input a deferred link
//! makes must wait for it, not be refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use florin_crypto::{Digest, LocalSigner, SecretKey, Signer};
use florin_ledger::memory::MemoryStore;
use florin_ledger::{
    CompactTx, Encumbrance, Output, StoreError, Supply, SwapOutcome, SwapStore, Transaction,
    Transfer, UhsId, Utxo, Witness,
};
use florin_node::{Ledger, TxStatus};

/// A memory store whose cheap look answers from its state, except for one transaction, for
/// which it cannot tell (as a busy store cannot): that one is verified in full.
struct BusyFor {
    inner: MemoryStore,
    busy_for: Digest,
}

impl SwapStore for BusyFor {
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        self.inner.swap_at(now, batch)
    }
    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        self.inner.is_unspent(id)
    }
    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        self.inner.is_confirmed(txid)
    }
    fn supply(&self) -> Result<Supply, StoreError> {
        self.inner.supply()
    }
    fn inputs_hint(&self, txid: &Digest, inputs: &[UhsId]) -> Option<bool> {
        if *txid == self.busy_for {
            return None;
        }
        Some(
            self.inner.is_confirmed(txid).unwrap()
                || inputs.iter().all(|i| self.inner.is_unspent(i).unwrap()),
        )
    }
}

fn pay(input: Utxo, owner: &LocalSigner, to: &LocalSigner) -> (Transaction, Utxo) {
    let mut t = Transfer {
        expires: florin_ledger::expiry::default_expiry(),
        inputs: vec![input],
        outputs: vec![Output {
            value: input.value,
            encumbrance: Encumbrance::ed25519(&to.public_key()),
        }],
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = vec![Witness::ed25519(
        owner.public_key(),
        owner.sign(&txid).unwrap(),
    )];
    let out = t.output_utxos()[0];
    (Transaction::Transfer(t), out)
}

#[test]
fn a_link_verified_in_full_waits_for_the_deferred_link_that_makes_its_input() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let issuer = Arc::new(LocalSigner::new(SecretKey::from_seed(&[7; 32])));
    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    // The coin, then the chain t1 → t2 → t3 built ahead (t3 is the one the store is busy for).
    let (mint, coins) = {
        let probe = Ledger::start(Arc::new(MemoryStore::new()), issuer.clone());
        probe
            .build_mint(Encumbrance::ed25519(&alice.public_key()), 100)
            .unwrap()
    };
    let (t1, o1) = pay(coins[0], &alice, &bob);
    let (t2, o2) = pay(o1, &bob, &alice);
    let (t3, _) = pay(o2, &alice, &bob);
    let store = Arc::new(BusyFor {
        inner: MemoryStore::new(),
        busy_for: t3.txid(),
    });
    let ledger = Ledger::start(store, issuer);
    rt.block_on(async {
        let (_, st) = ledger.submit(mint).await.unwrap();
        assert_eq!(st, TxStatus::Confirmed);
        let answers = ledger.submit_many(vec![t1, t2, t3]).await.unwrap();
        let statuses: Vec<TxStatus> = answers.into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            statuses,
            vec![
                TxStatus::Confirmed,
                TxStatus::Confirmed,
                TxStatus::Confirmed
            ]
        );
    });
}

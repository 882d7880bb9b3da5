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

/// What the console lists as recent transactions: each decided submission, newest first, a
/// refusal with its reason, and never more than `RECENT_DECIDED`, however many are submitted.
#[test]
fn recent_decisions_are_newest_first_and_bounded() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let issuer = Arc::new(LocalSigner::new(SecretKey::from_seed(&[7; 32])));
    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    let ledger = Ledger::start(Arc::new(MemoryStore::new()), issuer);
    assert!(ledger.recent_decided().is_empty());
    let (mint, coins) = ledger
        .build_mint(Encumbrance::ed25519(&alice.public_key()), 100)
        .unwrap();
    let (paid, _) = pay(coins[0], &alice, &bob);
    // The same coin again, to another payee: refused, as spent.
    let (again, _) = pay(coins[0], &alice, &alice);
    rt.block_on(async {
        ledger.submit(mint.clone()).await.unwrap();
        ledger.submit(paid.clone()).await.unwrap();
        ledger.submit(again.clone()).await.unwrap();
    });
    let recent = ledger.recent_decided();
    assert_eq!(recent.len(), 3);
    assert_eq!(recent[0].txid, hex::encode(again.txid()));
    assert_eq!(recent[0].status, "state_invalid");
    assert!(recent[0].error.is_some());
    assert_eq!(recent[1].txid, hex::encode(paid.txid()));
    assert_eq!(recent[1].status, "confirmed");
    assert_eq!(recent[2].txid, hex::encode(mint.txid()));

    // Many more (resubmissions of the same, answered from the store) keep the log bounded.
    let many = florin_node::ledger::RECENT_DECIDED + 40;
    rt.block_on(async {
        ledger.submit_many(vec![paid.clone(); many]).await.unwrap();
    });
    let recent = ledger.recent_decided();
    assert_eq!(recent.len(), florin_node::ledger::RECENT_DECIDED);
    assert!(recent.iter().all(|r| r.txid == hex::encode(paid.txid())));
}

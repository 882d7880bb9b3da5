//! The online flows against an in-memory connector: a ledger of unspent outputs and
//! mailboxes, with answers that can be forced (a refusal, an unreachable node). The HTTP path
//! is covered by the `florin` crate's CLI tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use florin_crypto::PublicKey;
use florin_ledger::{Encumbrance, Transaction, UhsId, Utxo};
use florin_token::Token;
use florin_wallet::connector::{Mail, TxAnswer, TxVerdict, Withdrawal};
use florin_wallet::flows::Notice;
use florin_wallet::{
    Connector, ConnectorError, DepositItem, FileStore, FlowError, Flows, Wallet, WalletStore,
};
use rand::rngs::OsRng;
use rand::RngCore;

#[derive(Default)]
struct Ledger {
    unspent: HashSet<UhsId>,
    mail: HashMap<String, Vec<Mail>>,
    seq: u64,
    /// Answer the next submission with this instead of checking it.
    force: Option<TxVerdict>,
    /// Every call fails as if the node could not be reached.
    down: bool,
    /// Apply the next submission, then answer it expired (a resubmission after the
    /// transaction's expiry, whose first answer was lost).
    expired_after_apply: bool,
    submitted: usize,
    /// Mailboxes (by address) that refuse messages, as a full one does (429).
    full: HashSet<String>,
}

/// A node in memory: transfers are confirmed when their inputs are unspent (no signature
/// checks: the ledger's validation is tested in florin-ledger).
#[derive(Default)]
struct FakeNode {
    authority: Option<PublicKey>,
    ledger: RefCell<Ledger>,
}

impl FakeNode {
    fn check(&self) -> Result<(), ConnectorError> {
        if self.ledger.borrow().down {
            return Err(ConnectorError::Unreachable {
                node: "memory".into(),
                source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
            });
        }
        Ok(())
    }

    /// Spends `u` behind the wallet's back (a copy of the wallet paid with it).
    fn spend_elsewhere(&self, u: &Utxo) {
        self.ledger.borrow_mut().unspent.remove(&u.id());
    }
}

impl Connector for FakeNode {
    async fn authority(&self) -> Result<PublicKey, ConnectorError> {
        self.check()?;
        self.authority
            .ok_or_else(|| ConnectorError::unreadable("no authority"))
    }

    async fn faucet(&self, owner: &PublicKey, cents: u64) -> Result<Vec<Utxo>, ConnectorError> {
        self.check()?;
        let mut serial = [0u8; 32];
        OsRng.fill_bytes(&mut serial);
        let u = Utxo {
            value: cents,
            encumbrance: Encumbrance::ed25519(owner),
            serial,
        };
        self.ledger.borrow_mut().unspent.insert(u.id());
        Ok(vec![u])
    }

    async fn submit(&self, tx: &Transaction) -> Result<TxAnswer, ConnectorError> {
        self.check()?;
        let mut l = self.ledger.borrow_mut();
        l.submitted += 1;
        if let Some(verdict) = l.force.take() {
            return Ok(TxAnswer {
                verdict,
                error: Some("forced".into()),
            });
        }
        let Transaction::Transfer(t) = tx else {
            return Ok(TxAnswer {
                verdict: TxVerdict::StaticInvalid,
                error: Some("not a transfer".into()),
            });
        };
        let outputs = t.output_utxos();
        // Idempotent: a transfer already applied is confirmed again.
        if outputs.iter().all(|o| l.unspent.contains(&o.id())) {
            return Ok(TxAnswer {
                verdict: TxVerdict::Confirmed,
                error: None,
            });
        }
        if !t.inputs.iter().all(|i| l.unspent.contains(&i.id())) {
            return Ok(TxAnswer {
                verdict: TxVerdict::StateInvalid,
                error: Some("input not unspent".into()),
            });
        }
        for i in &t.inputs {
            l.unspent.remove(&i.id());
        }
        l.unspent.extend(outputs.iter().map(Utxo::id));
        if std::mem::take(&mut l.expired_after_apply) {
            return Ok(TxAnswer {
                verdict: TxVerdict::Expired,
                error: Some("the transaction expired".into()),
            });
        }
        Ok(TxAnswer {
            verdict: TxVerdict::Confirmed,
            error: None,
        })
    }

    async fn unspent(&self, id: &UhsId) -> Result<bool, ConnectorError> {
        self.check()?;
        Ok(self.ledger.borrow().unspent.contains(id))
    }

    async fn mailbox_put(&self, to: &PublicKey, sealed: &[u8]) -> Result<u64, ConnectorError> {
        self.check()?;
        let mut l = self.ledger.borrow_mut();
        if l.full.contains(&to.to_address()) {
            return Err(ConnectorError::Refused {
                status: "429 Too Many Requests".into(),
                code: "quota".into(),
                message: "the recipient's mailbox is full".into(),
            });
        }
        l.seq += 1;
        let seq = l.seq;
        l.mail.entry(to.to_address()).or_default().push(Mail {
            seq,
            message: sealed.to_vec(),
        });
        Ok(seq)
    }

    async fn mailbox_get(
        &self,
        owner: &PublicKey,
        after: u64,
    ) -> Result<Vec<Mail>, ConnectorError> {
        self.check()?;
        let l = self.ledger.borrow();
        Ok(l.mail
            .get(&owner.to_address())
            .map(|m| m.iter().filter(|m| m.seq > after).cloned().collect())
            .unwrap_or_default())
    }

    async fn withdraw(&self, _: &Withdrawal) -> Result<Vec<Token>, ConnectorError> {
        Err(ConnectorError::Refused {
            status: "501 Not Implemented".into(),
            code: "http_501".into(),
            message: "no reserve here".into(),
        })
    }

    async fn deposit(
        &self,
        _: &PublicKey,
        _: &[Token],
        _: bool,
    ) -> Result<Vec<DepositItem>, ConnectorError> {
        Err(ConnectorError::Refused {
            status: "501 Not Implemented".into(),
            code: "http_501".into(),
            message: "no authority here".into(),
        })
    }
}

fn wallet(dir: &tempfile::TempDir, name: &str, node: &FakeNode) -> (Wallet, FileStore) {
    let store = FileStore::new(dir.path().join(name));
    let w = Wallet::generate(&mut OsRng, node.authority);
    store.create(&w).unwrap();
    (w, store)
}

fn node() -> FakeNode {
    FakeNode {
        authority: Some(Wallet::generate(&mut OsRng, None).public_key()),
        ..FakeNode::default()
    }
}

#[tokio::test]
async fn pay_hands_off_and_the_payee_collects_it_by_sync() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, alice_store) = wallet(&dir, "alice.json", &node);
    let (mut bob, bob_store) = wallet(&dir, "bob.json", &node);
    let a = Flows::new(&alice_store, &node);
    let b = Flows::new(&bob_store, &node);

    a.ensure_authority(&mut alice).await.unwrap();
    let f = a.faucet(&mut alice, 1_000).await.unwrap();
    assert_eq!((f.received, f.outputs), (1_000, 1));

    let paid = a.pay(&mut alice, bob.public_key(), 250).await.unwrap();
    assert!(paid.settled.confirmed());
    assert_eq!(paid.fate, florin_wallet::online::HandoffFate::Delivered);
    assert!(alice.outbox().is_empty());
    assert_eq!(alice.balance().online_cents, 750);
    // Saved as it went: the file holds what memory holds.
    assert_eq!(alice_store.load().unwrap().balance().online_cents, 750);

    let r = b.sync(&mut bob).await.unwrap();
    assert_eq!(r.received, 250);
    assert_eq!(r.removed, (0, 0));
    assert_eq!(bob.balance().online_cents, 250);
    // Collected once: a second sync finds nothing new.
    assert_eq!(b.sync(&mut bob).await.unwrap().received, 0);
    assert_eq!(bob_store.load().unwrap().balance().online_cents, 250);
}

#[tokio::test]
async fn a_payment_refused_as_state_invalid_removes_coins_spent_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let bob = Wallet::generate(&mut OsRng, node.authority).public_key();
    let a = Flows::new(&store, &node);
    a.faucet(&mut alice, 500).await.unwrap();
    a.faucet(&mut alice, 500).await.unwrap();
    // A copy of this wallet spent both coins.
    for u in alice.held_utxos() {
        node.spend_elsewhere(&u);
    }

    let paid = a.pay(&mut alice, bob, 300).await.unwrap();
    assert_eq!(paid.settled.verdict, TxVerdict::StateInvalid);
    assert_eq!(paid.settled.removed, (2, 1_000));
    assert!(alice.pending_tx().is_none());
    assert_eq!(alice.balance().online_cents, 0);
    let refusal = paid.settled.check("payment", &alice).unwrap_err();
    let msg = FlowError::from(refusal).to_string();
    assert!(
        msg.starts_with("the ledger refused the payment (state_invalid: input not unspent): 2 of your coins worth €10.00 were already spent elsewhere"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_expired_payment_is_settled_by_its_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let bob = Wallet::generate(&mut OsRng, node.authority).public_key();
    let a = Flows::new(&store, &node);
    a.faucet(&mut alice, 500).await.unwrap();
    a.faucet(&mut alice, 500).await.unwrap();

    // Expired only just now (the ledger's clock ahead of this one): it may still be
    // committing, so it stays in flight and nothing is concluded.
    node.ledger.borrow_mut().force = Some(TxVerdict::Expired);
    let paid = a.pay(&mut alice, bob, 300).await.unwrap();
    assert_eq!(paid.settled.verdict, TxVerdict::Pending);
    assert!(alice.pending_tx().is_some());
    // Long after its expiry (a clock 20 minutes on), the answer is final.
    let a = Flows::new(&store, &node).with_clock(|| florin_ledger::expiry::unix_now() + 1200);
    node.ledger.borrow_mut().force = Some(TxVerdict::Expired);
    a.sync(&mut alice).await.unwrap();
    assert!(alice.pending_tx().is_none());
    assert_eq!(alice.balance().online_cents, 1_000);

    // Expired before it applied (its coins are still unspent): nothing was paid, the coins
    // are back, and the user is told so.
    node.ledger.borrow_mut().force = Some(TxVerdict::Expired);
    let paid = a.pay(&mut alice, bob, 300).await.unwrap();
    assert_eq!(paid.settled.verdict, TxVerdict::Expired);
    assert!(alice.pending_tx().is_none());
    assert_eq!(alice.balance().online_cents, 1_000);
    let msg = FlowError::from(paid.settled.check("payment", &alice).unwrap_err()).to_string();
    assert!(
        msg.contains("(expired: forced); nothing was paid and your coins are back"),
        "{msg}"
    );

    // Applied before it expired (the answer was lost, and the resubmission came too late):
    // its coins are spent, so it is settled as paid.
    node.ledger.borrow_mut().expired_after_apply = true;
    let paid = a.pay(&mut alice, bob, 300).await.unwrap();
    assert_eq!(paid.settled.verdict, TxVerdict::Confirmed);
    assert!(paid.settled.check("payment", &alice).is_ok());
    assert!(alice.pending_tx().is_none());
    assert_eq!(alice.balance().online_cents, 700);
    assert_eq!(store.load().unwrap().balance().online_cents, 700);
}

#[tokio::test]
async fn a_static_refusal_gives_the_coins_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let bob = Wallet::generate(&mut OsRng, node.authority).public_key();
    let a = Flows::new(&store, &node);
    a.faucet(&mut alice, 500).await.unwrap();
    node.ledger.borrow_mut().force = Some(TxVerdict::StaticInvalid);
    let paid = a.pay(&mut alice, bob, 300).await.unwrap();
    let msg = paid
        .settled
        .check("payment", &alice)
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        "the ledger refused the payment (static_invalid: forced); nothing was paid and your \
         coins are back in the wallet"
    );
    assert_eq!(alice.balance().online_cents, 500);
}

#[tokio::test]
async fn an_unreachable_node_leaves_the_payment_in_flight_for_sync() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let (mut bob, bob_store) = wallet(&dir, "bob.json", &node);
    let notices = RefCell::new(Vec::new());
    let steps = RefCell::new(Vec::new());
    let a = Flows::new(&store, &node).with_notices(|n: &Notice| match n {
        // Progress for a display: which step, how far.
        Notice::Step(_) | Notice::Progress { .. } => steps.borrow_mut().push(n.to_string()),
        _ => notices.borrow_mut().push(n.to_string()),
    });
    a.faucet(&mut alice, 500).await.unwrap();

    node.ledger.borrow_mut().down = true;
    let e = a.pay(&mut alice, bob.public_key(), 200).await.unwrap_err();
    assert!(matches!(
        e,
        FlowError::SubmitUnanswered(ConnectorError::Unreachable { .. })
    ));
    assert_eq!(
        florin_wallet::connector::error_chain(&e),
        "the payment is saved and will be retried by `florin wallet sync`: cannot reach the \
         node at memory: connection refused"
    );
    // Saved in flight, not lost: the file has it too.
    assert!(alice.pending_tx().is_some());
    assert!(store.load().unwrap().pending_tx().is_some());

    node.ledger.borrow_mut().down = false;
    let mut alice = store.load().unwrap();
    let r = a.sync(&mut alice).await.unwrap();
    assert!(alice.pending_tx().is_none());
    assert_eq!(r.handoffs.delivered.len(), 1);
    assert_eq!(alice.balance().online_cents, 300);
    // The first submission never reached the node; sync's is the one it saw.
    assert_eq!(node.ledger.borrow().submitted, 1);
    assert!(notices.borrow().is_empty());
    // Sync told its steps, and counted its coins to the end.
    let steps = steps.borrow().clone();
    assert!(
        steps.contains(&"collecting payments from the mailbox".to_string()),
        "{steps:?}"
    );
    let at = steps
        .iter()
        .position(|s| s == "checking coins with the ledger")
        .expect("the coin check");
    let held = alice.held_utxos().len();
    assert_eq!(
        steps.last(),
        Some(&format!("{held} of {held}")),
        "{steps:?}"
    );
    assert!(at < steps.len() - 1);

    let b = Flows::new(&bob_store, &node);
    assert_eq!(b.sync(&mut bob).await.unwrap().received, 200);
}

#[tokio::test]
async fn a_node_serving_another_authority_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (_, store) = wallet(&dir, "alice.json", &node);
    let mut other = Wallet::generate(
        &mut OsRng,
        Some(Wallet::generate(&mut OsRng, None).public_key()),
    );
    let a = Flows::new(&store, &node);
    assert!(matches!(
        a.ensure_authority(&mut other).await,
        Err(FlowError::AuthorityMismatch { .. })
    ));
    let mut fresh = Wallet::generate(&mut OsRng, None);
    a.ensure_authority(&mut fresh).await.unwrap();
    assert_eq!(fresh.authority(), node.authority);
}

#[tokio::test]
async fn a_full_mailbox_holds_back_only_its_own_handoff() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let (mut bob, bob_store) = wallet(&dir, "bob.json", &node);
    let (mut carol, carol_store) = wallet(&dir, "carol.json", &node);
    let a = Flows::new(&store, &node);
    a.faucet(&mut alice, 500).await.unwrap();

    // Bob's mailbox is full: the payment is made, its handoff stays queued.
    node.ledger
        .borrow_mut()
        .full
        .insert(bob.public_key().to_address());
    let paid = a.pay(&mut alice, bob.public_key(), 200).await.unwrap();
    assert!(paid.handoffs.delivered.is_empty());
    assert!(paid.handoffs.pending.is_some());
    assert_eq!(alice.outbox().len(), 1);
    // A payment to Carol goes past Bob's queued handoff.
    let paid = a.pay(&mut alice, carol.public_key(), 100).await.unwrap();
    assert_eq!(paid.handoffs.delivered.len(), 1);
    assert_eq!(alice.outbox().len(), 1);
    let c = Flows::new(&carol_store, &node);
    assert_eq!(c.sync(&mut carol).await.unwrap().received, 100);

    // Once Bob's mailbox takes messages again, a sync delivers his.
    node.ledger.borrow_mut().full.clear();
    let r = a.sync(&mut alice).await.unwrap();
    assert_eq!(r.handoffs.delivered.len(), 1);
    assert!(alice.outbox().is_empty());
    let b = Flows::new(&bob_store, &node);
    assert_eq!(b.sync(&mut bob).await.unwrap().received, 200);
}

/// The words alone bring back the ledger funds: the faucet's output, the change of a
/// payment (a derived key), a payment handed off by someone else; nothing already spent.
#[tokio::test]
async fn a_wallet_restored_from_its_words_finds_its_ledger_funds() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let (mut bob, bob_store) = wallet(&dir, "bob.json", &node);
    let a = Flows::new(&store, &node);
    let b = Flows::new(&bob_store, &node);
    a.faucet(&mut alice, 500).await.unwrap();
    a.pay(&mut alice, bob.public_key(), 200).await.unwrap();
    a.pay(&mut alice, bob.public_key(), 20).await.unwrap();
    b.faucet(&mut bob, 100).await.unwrap();
    b.sync(&mut bob).await.unwrap();
    b.pay(&mut bob, alice.public_key(), 50).await.unwrap();
    a.sync(&mut alice).await.unwrap();
    assert_eq!(alice.balance().online_cents, 330);

    // An empty machine: the words, nothing else.
    let words = alice.backup_words().unwrap().clone();
    let restored_store = FileStore::new(dir.path().join("restored.json"));
    let mut restored = Wallet::from_words(words, node.authority);
    restored_store.create(&restored).unwrap();
    let r = Flows::new(&restored_store, &node)
        .restore(&mut restored)
        .await
        .unwrap();
    assert_eq!(restored.public_key(), alice.public_key());
    assert_eq!(r.received, 330);
    assert_eq!(restored.balance().online_cents, 330);
    // No used change key is derived again.
    let next = |w: &Wallet| {
        serde_json::from_slice::<serde_json::Value>(&w.to_json()).unwrap()["online"]["next_key"]
            .as_u64()
    };
    assert_eq!(next(&restored), next(&alice));
    // The restored wallet spends what it found.
    let paid = Flows::new(&restored_store, &node)
        .pay(&mut restored, bob.public_key(), 330)
        .await
        .unwrap();
    assert!(paid.settled.confirmed());
}

/// A sync while a payment is in flight (the ledger has not decided) must not take the
/// payment's inputs back from the wallet's own restore notes, or count anything twice.
#[tokio::test]
async fn a_sync_with_a_payment_in_flight_counts_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let node = node();
    let (mut alice, store) = wallet(&dir, "alice.json", &node);
    let (bob, _bob_store) = wallet(&dir, "bob.json", &node);
    let a = Flows::new(&store, &node);
    a.faucet(&mut alice, 500).await.unwrap();
    node.ledger.borrow_mut().force = Some(TxVerdict::Pending);
    let paid = a.pay(&mut alice, bob.public_key(), 200).await.unwrap();
    assert!(!paid.settled.confirmed());
    assert_eq!(alice.balance().online_cents, 500);
    node.ledger.borrow_mut().force = Some(TxVerdict::Pending);
    let r = a.sync(&mut alice).await.unwrap();
    assert_eq!(r.received, 0);
    assert_eq!(alice.balance().online_cents, 500);
    assert!(alice.pending_tx().is_some());
    // The ledger then refuses it for good: the coins come back once.
    node.ledger.borrow_mut().force = Some(TxVerdict::StaticInvalid);
    a.sync(&mut alice).await.unwrap();
    assert!(alice.pending_tx().is_none());
    assert_eq!(alice.balance().online_cents, 500);
    assert_eq!(alice.held_utxos().len(), 1);
}

/// A note sealed to the wallet by someone else (anyone can seal to an address) is not
/// acted on: notes are authenticated with a key only the wallet's words derive.
#[test]
fn a_forged_restore_note_is_ignored() {
    use florin_wallet::online::{decode_note, encode_note};
    let w = Wallet::generate(&mut OsRng, None);
    let u = Utxo {
        value: 5,
        encumbrance: Encumbrance::ed25519(&w.public_key()),
        serial: [7; 32],
    };
    let mine = encode_note(&w.note_key(), &[(None, u)]);
    assert_eq!(decode_note(&w.note_key(), &mine).unwrap().len(), 1);
    let forged = encode_note(&[9; 32], &[(None, u)]);
    assert!(decode_note(&w.note_key(), &forged).is_none());
    let mut flipped = mine.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert!(decode_note(&w.note_key(), &flipped).is_none());
}

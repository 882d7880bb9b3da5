//! Wallet logic without a node: the authority is played by a local signer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_token::{Denomination, Payment, PaymentRequest, Token};
use florin_wallet::{DepositItem, FileStore, Wallet, WalletError, WalletStore};
use rand::rngs::StdRng;
use rand::SeedableRng;

mod common;
use common::{authority, funded};

#[test]
fn pay_and_accept_with_exact_change() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut alice = funded(
        &mut rng,
        &[
            Denomination::E50,
            Denomination::E20,
            Denomination::E20,
            Denomination::E20,
        ],
    );
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    let req = bob.request(6000, &mut rng).unwrap();
    let req = PaymentRequest::decode(&req.encode()).unwrap();
    let payment = alice.pay(&req).unwrap();
    assert_eq!(payment.tokens.len(), 3);
    // Paying the same request again re-emits the same payment: no second signature.
    assert_eq!(alice.pay(&req).unwrap(), payment);
    assert_eq!(alice.balance().total_cents, 5000);
    let wire = Payment::decode(&payment.encode()).unwrap();
    assert_eq!(bob.accept(&wire, &mut rng).unwrap(), 6000);
    let b = bob.balance();
    assert_eq!(
        (b.offline_cents, b.verified_cents, b.total_cents),
        (6000, 0, 6000)
    );
    // The replayed payment is refused and changes nothing.
    assert!(matches!(
        bob.accept(&wire, &mut rng),
        Err(WalletError::UnknownRequest)
    ));
    assert_eq!(bob.balance().total_cents, 6000);
}

#[test]
fn replay_against_a_new_request_is_refused() {
    let mut rng = StdRng::seed_from_u64(2);
    let mut alice = funded(&mut rng, &[Denomination::E5, Denomination::E5]);
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    let first = alice.pay(&bob.request(500, &mut rng).unwrap()).unwrap();
    bob.accept(&first, &mut rng).unwrap();
    // Bob asks again; someone re-sends the old payment re-labelled with the new handshake.
    let req2 = bob.request(500, &mut rng).unwrap();
    let mut forged = first.clone();
    forged.handshake = req2.handshake;
    let err = bob.accept(&forged, &mut rng).unwrap_err();
    assert!(
        matches!(err, WalletError::Token(_) | WalletError::DuplicateSerial(_)),
        "{err}"
    );
}

#[test]
fn errors_are_typed_and_change_nothing() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut alice = funded(&mut rng, &[Denomination::E5, Denomination::E5]);
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    assert!(matches!(
        alice.pay(&bob.request(2000, &mut rng).unwrap()),
        Err(WalletError::InsufficientFunds { .. })
    ));
    assert!(matches!(
        alice.pay(&bob.request(700, &mut rng).unwrap()),
        Err(WalletError::NoExactChange { .. })
    ));
    let own = alice.request(500, &mut rng).unwrap();
    assert!(matches!(alice.pay(&own), Err(WalletError::PayingSelf)));
    assert_eq!(alice.balance().total_cents, 1000);
    // A payment for another payee.
    let mut carol = Wallet::generate(&mut rng, Some(authority().public_key()));
    let p = alice.pay(&bob.request(500, &mut rng).unwrap()).unwrap();
    assert!(matches!(
        carol.accept(&p, &mut rng),
        Err(WalletError::WrongPayee(_))
    ));
    // Wrong amount.
    let req = bob.request(1000, &mut rng).unwrap();
    let mut short = alice.pay(&bob.request(500, &mut rng).unwrap()).unwrap();
    short.handshake = req.handshake;
    assert!(bob.accept(&short, &mut rng).is_err());
    // Offline limit: refused when requesting, and checked again when accepting.
    let mut rich = funded(&mut rng, &[Denomination::E5]);
    let req = bob.request(500, &mut rng).unwrap();
    bob.max_offline_cents = 100;
    assert!(matches!(
        bob.request(500, &mut rng),
        Err(WalletError::OfflineLimit { .. })
    ));
    let p = rich.pay(&req).unwrap();
    assert!(matches!(
        bob.accept(&p, &mut rng),
        Err(WalletError::OfflineLimit { .. })
    ));
    assert_eq!(bob.balance().total_cents, 0);
}

#[test]
fn payer_only_uses_tokens_within_the_payees_hop_limit() {
    let mut rng = StdRng::seed_from_u64(6);
    let mut alice = funded(&mut rng, &[Denomination::E5]);
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    let p = alice.pay(&bob.request(500, &mut rng).unwrap()).unwrap();
    bob.accept(&p, &mut rng).unwrap();
    // Bob's token has one hop; Carol accepts at most one.
    let mut carol = Wallet::generate(&mut rng, Some(authority().public_key()));
    carol.max_hops = 1;
    let req = carol.request(500, &mut rng).unwrap();
    assert_eq!(req.max_hops, 1);
    assert!(matches!(
        bob.pay(&req),
        Err(WalletError::TooManyHops {
            max_hops: 1,
            eligible: 0
        })
    ));
    assert_eq!(bob.balance().total_cents, 500, "nothing signed");
}

#[test]
fn deposit_answers_are_checked_before_money_is_written_off() {
    let mut rng = StdRng::seed_from_u64(7);
    let auth = authority();
    let mut alice = funded(&mut rng, &[Denomination::E10]);
    let mut bob = Wallet::generate(&mut rng, Some(auth.public_key()));
    let p = alice.pay(&bob.request(1000, &mut rng).unwrap()).unwrap();
    bob.accept(&p, &mut rng).unwrap();
    let (hs, signed) = bob.prepare_deposit(&mut rng).unwrap().unwrap();
    // A proof about some other token's history, and a re-anchored token under another
    // handshake: both are refused and the token stays pending.
    let x = LocalSigner::new(SecretKey::from_seed(&[1; 32]));
    let (y, z) = (
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
        LocalSigner::new(SecretKey::from_seed(&[3; 32])),
    );
    let to_x = Token::mint(
        &auth,
        [9; 8],
        Denomination::E10,
        [1; 64],
        x.public_key(),
        [0; 32],
    )
    .unwrap();
    let a = to_x.transfer(&x, y.public_key(), [1; 32]).unwrap();
    let b = to_x.transfer(&x, z.public_key(), [2; 32]).unwrap();
    let foreign = florin_token::FraudProof::from_fork(&a, &a.links, &b.links).unwrap();
    let wrong_hs = Token::mint(
        &auth,
        signed[0].serial,
        signed[0].value,
        [3; 64],
        bob.public_key(),
        [7; 32],
    )
    .unwrap();
    assert_ne!(hs, [7; 32]);
    let r = bob
        .finish_deposit(
            vec![
                DepositItem::DoubleSpend {
                    serial: signed[0].serial,
                    proof: Box::new(foreign),
                },
                DepositItem::Reanchored(wrong_hs),
            ],
            &mut rng,
        )
        .unwrap();
    assert_eq!((r.lost_cents, r.credited_cents, r.still_pending), (0, 0, 1));
    assert_eq!(bob.balance().total_cents, 1000);
}

#[test]
fn deposit_flow_reanchors_and_reports_fraud() {
    let mut rng = StdRng::seed_from_u64(4);
    let auth = authority();
    let mut alice = funded(&mut rng, &[Denomination::E10, Denomination::E20]);
    let mut bob = Wallet::generate(&mut rng, Some(auth.public_key()));
    let p = alice.pay(&bob.request(3000, &mut rng).unwrap()).unwrap();
    bob.accept(&p, &mut rng).unwrap();
    let (hs, signed) = bob.prepare_deposit(&mut rng).unwrap().unwrap();
    assert_eq!(signed.len(), 2);
    // Resuming returns the same signed tokens.
    let (hs2, again) = bob.prepare_deposit(&mut rng).unwrap().unwrap();
    assert_eq!((hs2, &again), (hs, &signed));
    assert_eq!(bob.balance().pending_deposit_cents, 3000);
    let fresh = Token::mint(
        &auth,
        signed[0].serial,
        signed[0].value,
        [3; 64],
        bob.public_key(),
        hs,
    )
    .unwrap();
    let items = vec![
        DepositItem::Reanchored(fresh),
        DepositItem::Refused {
            serial: signed[1].serial,
            reason: "busy".into(),
            retry: true,
        },
    ];
    let r = bob.finish_deposit(items, &mut rng).unwrap();
    assert_eq!(
        (r.credited_cents, r.reanchored, r.still_pending),
        (signed[0].value.cents(), 1, 1)
    );
    assert_eq!(bob.balance().total_cents, 3000);
}

#[test]
fn file_store_roundtrip_and_refuses_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.json");
    let store = FileStore::new(&path);
    let mut rng = StdRng::seed_from_u64(5);
    let w = funded(&mut rng, &[Denomination::C1, Denomination::E500]);
    store.create(&w).unwrap();
    assert!(store.create(&w).is_err());
    let back = store.load().unwrap();
    assert_eq!(back.public_key(), w.public_key());
    assert_eq!(back.balance().total_cents, 50_001);
    std::fs::write(&path, b"{not json").unwrap();
    assert!(store.load().is_err());
    assert!(FileStore::new(dir.path().join("missing")).load().is_err());
}

#[test]
fn channel_payments_are_acknowledged_once_and_survive_a_reload() {
    let mut rng = StdRng::seed_from_u64(40);
    let mut alice = funded(&mut rng, &[Denomination::E5, Denomination::E2]);
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    let req = bob.request(500, &mut rng).unwrap();
    let p = alice.pay_to_peer(&req).unwrap();
    assert_eq!(alice.balance().undelivered_cents, 500);
    assert_eq!(alice.undelivered(&bob.public_key()), vec![p.clone()]);
    // The wallet file keeps the undelivered payment.
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path().join("a.json"));
    store.save(&alice).unwrap();
    let mut alice = store.load().unwrap();
    assert_eq!(alice.undelivered(&bob.public_key()), vec![p.clone()]);
    // Delivered, the receipt lost, delivered again: counted once.
    assert_eq!(bob.accept_once(&p, &mut rng).unwrap(), (500, true));
    assert_eq!(bob.accept_once(&p, &mut rng).unwrap(), (500, false));
    assert_eq!(bob.balance().offline_cents, 500);
    // Another payment under the same handshake is refused.
    let mut carol = funded(&mut rng, &[Denomination::E5]);
    let forged = carol.pay(&req).unwrap();
    assert!(matches!(
        bob.accept_once(&forged, &mut rng),
        Err(WalletError::UnknownRequest)
    ));
    assert!(alice.mark_delivered(&bob.public_key(), &p.handshake));
    assert!(alice.undelivered(&bob.public_key()).is_empty());
    assert_eq!(alice.balance().undelivered_cents, 0);
}

#[test]
fn refused_channel_payments_are_not_retried_and_open_requests_count_against_the_limit() {
    let mut rng = StdRng::seed_from_u64(41);
    let mut alice = funded(&mut rng, &[Denomination::E5, Denomination::E2]);
    let mut bob = Wallet::generate(&mut rng, Some(authority().public_key()));
    bob.max_offline_cents = 600;
    let req = bob.request(500, &mut rng).unwrap();
    // A second request that together with the open one would pass the limit is refused now.
    assert!(matches!(
        bob.request(200, &mut rng),
        Err(WalletError::OfflineLimit { .. })
    ));
    let p = alice.pay_to_peer(&req).unwrap();
    alice.mark_refused(&bob.public_key(), &p.handshake, "limit");
    assert!(alice.undelivered(&bob.public_key()).is_empty());
    assert_eq!(alice.balance().undelivered_cents, 500);
}

/// A wallet holding one ledger output of `cents` locked to its main key.
fn with_ledger_funds(rng: &mut StdRng, cents: u64) -> (Wallet, florin_ledger::Utxo) {
    let mut w = Wallet::generate(rng, Some(authority().public_key()));
    let u = florin_ledger::Utxo {
        value: cents,
        encumbrance: florin_ledger::Encumbrance::ed25519(&w.public_key()),
        serial: [cents as u8; 32],
    };
    assert_eq!(w.receive_utxos(&[u]), cents);
    (w, u)
}

#[test]
fn payments_to_invalid_addresses_are_refused_before_signing() {
    let mut rng = StdRng::seed_from_u64(40);
    let (mut w, _) = with_ledger_funds(&mut rng, 1000);
    let before = w.to_json();
    let mut identity = [0u8; 32];
    identity[0] = 1;
    for bad in [
        florin_crypto::PublicKey([0u8; 32]),
        florin_crypto::PublicKey(identity),
        florin_crypto::PublicKey([0xff; 32]),
    ] {
        let e = w.build_payment(bad, 100, "pay").unwrap_err();
        assert!(matches!(e, WalletError::InvalidAddress(_)), "{e}");
        assert!(w.pending_tx().is_none());
        assert_eq!(w.to_json(), before, "nothing signed, nothing changed");
    }
    // Offline: a request naming an invalid payee is refused too.
    let mut payer = funded(&mut rng, &[Denomination::E1]);
    let before = payer.to_json();
    let req = PaymentRequest {
        amount_cents: 100,
        payee: florin_crypto::PublicKey([0u8; 32]),
        handshake: [3; 32],
        max_hops: 8,
    };
    assert!(matches!(
        payer.pay(&req).unwrap_err(),
        WalletError::InvalidAddress(_)
    ));
    assert_eq!(payer.to_json(), before);
    // A queued handoff to an unusable key can never be sealed: it is reported for dropping.
    let u = hex::encode(
        florin_ledger::Utxo {
            value: 5,
            encumbrance: florin_ledger::Encumbrance::ed25519(&florin_crypto::PublicKey([0; 32])),
            serial: [1; 32],
        }
        .encode(),
    );
    let why = Wallet::seal_handoff(&florin_crypto::PublicKey([0; 32]), &u, &mut rng).unwrap_err();
    assert!(why.contains("not a usable key"), "{why}");
    let good = Wallet::generate(&mut rng, None).public_key();
    assert!(Wallet::seal_handoff(&good, &u, &mut rng).is_ok());
}

#[test]
fn withdrawals_carry_an_owner_signature_over_the_request() {
    let mut rng = StdRng::seed_from_u64(41);
    let (mut w, _) = with_ledger_funds(&mut rng, 1000);
    let reserve = authority().public_key();
    let tx = w.build_payment(reserve, 400, "withdraw").unwrap();
    w.settle_pending(true);
    let a = w.awaiting_tokens()[0].clone();
    let auth = a.auth.clone().expect("stored at build time");
    // Signed by the key of the input, over txid, output 0, recipient and handshake.
    let florin_ledger::Transaction::Transfer(t) = &tx else {
        panic!()
    };
    assert_eq!(
        t.inputs[0].encumbrance,
        florin_ledger::Encumbrance::ed25519(&florin_crypto::PublicKey::parse(&auth.key).unwrap())
    );
    let hs: [u8; 32] = hex::decode(&a.handshake).unwrap().try_into().unwrap();
    let msg = florin_wallet::online::withdraw_message(&tx.txid(), 0, &w.public_key(), &hs);
    let sig: [u8; 64] = hex::decode(&auth.signature).unwrap().try_into().unwrap();
    let key = florin_crypto::PublicKey::parse(&auth.key).unwrap();
    florin_crypto::verify(&key, &msg, &florin_crypto::Signature(sig)).unwrap();
    let other = florin_wallet::online::withdraw_message(&tx.txid(), 0, &reserve, &hs);
    assert!(florin_crypto::verify(&key, &other, &florin_crypto::Signature(sig)).is_err());
    // A wallet file from before authorizations: recomputed from the transaction, same bytes.
    let mut old = a.clone();
    old.auth = None;
    assert_eq!(w.withdraw_authorization(&old), Some(auth));
    // Another wallet holds no input of it: it cannot authorize.
    let (stranger, _) = with_ledger_funds(&mut rng, 10);
    assert_eq!(stranger.withdraw_authorization(&old), None);
}

#[test]
fn forget_spent_removes_coins_the_ledger_no_longer_holds() {
    let mut rng = StdRng::seed_from_u64(42);
    let (mut w, u) = with_ledger_funds(&mut rng, 700);
    let v = florin_ledger::Utxo {
        serial: [9; 32],
        ..u
    };
    w.receive_utxos(&[v]);
    assert_eq!(w.online_cents(), 1400);
    assert_eq!(w.forget_spent(&[u.id()]), (1, 700));
    assert_eq!(w.online_cents(), 700);
    assert_eq!(w.held_utxos(), vec![v]);
    assert_eq!(w.forget_spent(&[u.id()]), (0, 0));
    // Set aside, not deleted: a node that was wrong (a ledger restored) gives it back.
    assert_eq!(w.set_aside_utxos(), vec![u]);
    assert_eq!(w.restore_unspent(&[v.id()]), (0, 0));
    assert_eq!(w.restore_unspent(&[u.id()]), (1, 700));
    assert_eq!(w.online_cents(), 1400);
    assert!(w.set_aside_utxos().is_empty());
}

#[test]
fn wallet_file_checksum_detects_damage_and_old_files_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(43);
    let path = dir.path().join("w.json");
    let store = FileStore::new(&path);
    let (w, _) = with_ledger_funds(&mut rng, 1234);
    store.create(&w).unwrap();
    let good = std::fs::read_to_string(&path).unwrap();
    assert!(good.starts_with("{\n  \"checksum\": \""), "{good}");
    assert!(
        serde_json::from_str::<serde_json::Value>(&good).is_ok(),
        "still JSON"
    );
    assert_eq!(store.load().unwrap().online_cents(), 1234);
    // A changed digit in an amount is refused, naming the file and the expected checksum.
    let damaged = good.replace(
        "\"max_offline_cents\": 100000",
        "\"max_offline_cents\": 900000",
    );
    assert_ne!(damaged, good);
    std::fs::write(&path, &damaged).unwrap();
    let Err(e) = store.load() else {
        panic!("a damaged file must not load")
    };
    let msg = e.to_string();
    assert!(
        matches!(e, florin_wallet::StoreError::Damaged { .. }),
        "{msg}"
    );
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    let expected = &good[17..17 + 64];
    assert!(msg.contains(expected), "names the expected checksum: {msg}");
    // Nothing on disk was changed by the refused load.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), damaged);
    // A flipped byte in the checksum itself, or in its name, is refused too.
    let mut bad_sum = good.clone().into_bytes();
    bad_sum[20] = if bad_sum[20] == b'0' { b'1' } else { b'0' };
    std::fs::write(&path, &bad_sum).unwrap();
    assert!(store.load().is_err());
    std::fs::write(&path, good.replacen("\"checksum\"", "\"checksuM\"", 1)).unwrap();
    assert!(store.load().is_err());
    // A hex digit of a held output changed: refused.
    let utxo_at = good.find("\"utxo\": \"").unwrap() + 20;
    let mut bad_utxo = good.clone().into_bytes();
    bad_utxo[utxo_at] = if bad_utxo[utxo_at] == b'a' {
        b'b'
    } else {
        b'a'
    };
    std::fs::write(&path, &bad_utxo).unwrap();
    assert!(matches!(
        store.load(),
        Err(florin_wallet::StoreError::Damaged { .. })
    ));
    // An old file without a checksum loads, and is rewritten with one on the next save.
    let old = format!("{{\n{}", &good[good.find("\",\n").unwrap() + 3..]);
    std::fs::write(&path, &old).unwrap();
    let w2 = store.load().unwrap();
    assert_eq!(w2.online_cents(), 1234);
    store.save(&w2).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), good);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["w.json".to_string()]);
}

/// A wallet holding more coins than one ledger transaction takes never builds a transaction
/// the ledger cannot decode: the payment asks for a consolidation first, after which the whole
/// balance pays.
#[test]
fn more_coins_than_one_transaction_takes_are_consolidated_first() {
    use florin_ledger::tx::MAX_IO;
    let mut rng = StdRng::seed_from_u64(44);
    let mut w = Wallet::generate(&mut rng, Some(authority().public_key()));
    let coins: Vec<florin_ledger::Utxo> = (0..MAX_IO as u32 + 76)
        .map(|i| {
            let mut serial = [7u8; 32];
            serial[..4].copy_from_slice(&i.to_le_bytes());
            florin_ledger::Utxo {
                value: 1,
                encumbrance: florin_ledger::Encumbrance::ed25519(&w.public_key()),
                serial,
            }
        })
        .collect();
    let total = coins.len() as u64;
    assert_eq!(w.receive_utxos(&coins), total);
    let payee = SecretKey::generate(&mut rng).public_key();
    let e = w.build_payment(payee, total, "pay").unwrap_err();
    assert!(
        matches!(e, WalletError::TooManyInputs { needed, max } if needed == coins.len() && max == MAX_IO),
        "{e}"
    );
    assert!(w.pending_tx().is_none(), "nothing built");
    assert_eq!(w.online_cents(), total);
    // One consolidation of the most one transaction takes; it decodes on the ledger's side.
    let tx = w.build_consolidation().unwrap().unwrap();
    let florin_ledger::Transaction::Transfer(t) = &tx else {
        panic!("a transfer")
    };
    assert_eq!((t.inputs.len(), t.outputs.len()), (MAX_IO, 1));
    assert_eq!(t.outputs[0].value, MAX_IO as u64);
    assert!(florin_ledger::Transaction::decode(&tx.encode()).is_ok());
    assert_eq!(w.online_cents(), total, "in flight, still the wallet's");
    w.settle_pending(true);
    assert_eq!(w.held_utxos().len(), 77);
    // Now the whole balance pays in one transaction.
    let tx = w.build_payment(payee, total, "pay").unwrap();
    let florin_ledger::Transaction::Transfer(t) = &tx else {
        panic!("a transfer")
    };
    assert_eq!(t.inputs.len(), 77);
    assert!(florin_ledger::Transaction::decode(&tx.encode()).is_ok());
    w.settle_pending(true);
    assert_eq!(w.online_cents(), 0);
    // A single coin has nothing to consolidate.
    let (mut one, _) = with_ledger_funds(&mut rng, 5);
    assert!(one.build_consolidation().unwrap().is_none());
}

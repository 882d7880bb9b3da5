//! Sentinel validation: one test per rule, in order; compaction; value conservation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signature, SignatureError, Signer};
use florin_ledger::memory::MemoryStore;
use florin_ledger::tx::{output_serial, SCHEME_ED25519};
use florin_ledger::validate::validate_many;
use florin_ledger::{
    validate, CompactTx, DecodeError, Encumbrance, Mint, Output, Redeem, SwapOutcome, SwapStore,
    Transaction, Transfer, Utxo, ValidationError, Witness,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn key(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

fn issuer() -> LocalSigner {
    key(200)
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(1)
}

fn out(v: u64, k: &LocalSigner) -> Output {
    Output {
        value: v,
        encumbrance: Encumbrance::ed25519(&k.public_key()),
    }
}

fn mint(outputs: Vec<Output>, nonce: u8) -> Mint {
    let mut m = Mint {
        nonce: [nonce; 32],
        outputs,
        issuer_signature: Signature([0; 64]),
    };
    m.issuer_signature = issuer().sign(&m.txid()).unwrap();
    m
}

/// Signs a transfer of `inputs` (owned by `owners`) into `outputs`.
fn transfer(inputs: Vec<Utxo>, owners: &[&LocalSigner], outputs: Vec<Output>) -> Transfer {
    let mut t = Transfer {
        inputs,
        outputs,
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = owners
        .iter()
        .map(|o| Witness {
            scheme: SCHEME_ED25519,
            key: o.public_key().0,
            signature: o.sign(&txid).unwrap(),
        })
        .collect();
    t
}

fn check(t: &Transaction) -> Result<CompactTx, ValidationError> {
    validate(t, &issuer().public_key(), &mut rng())
}

fn funded() -> (Vec<Utxo>, LocalSigner, LocalSigner) {
    let (a, b) = (key(1), key(2));
    let m = mint(vec![out(70, &a), out(30, &a)], 1);
    (m.output_utxos(), a, b)
}

#[test]
fn a_valid_transfer_compacts_and_roundtrips() {
    let (u, a, b) = funded();
    let t = transfer(u.clone(), &[&a, &a], vec![out(60, &b), out(40, &a)]);
    let tx = Transaction::Transfer(t.clone());
    assert_eq!(Transaction::decode(&tx.encode()), Ok(tx.clone()));
    let c = check(&tx).unwrap();
    assert_eq!(c.inputs, vec![u[0].id(), u[1].id()]);
    assert_eq!(c.outputs[0].1, 60);
    assert_eq!(t.output_utxos()[1].serial, output_serial(&t.txid(), 1));
    // Witnesses are not part of the txid.
    let mut unsigned = t.clone();
    unsigned.witnesses.clear();
    assert_eq!(unsigned.txid(), t.txid());
}

#[test]
fn each_rule_has_its_error_in_order() {
    let (u, a, b) = funded();
    let i = issuer().public_key();
    let e = |t: Transfer| check(&Transaction::Transfer(t)).unwrap_err();
    assert_eq!(
        e(transfer(vec![], &[], vec![out(1, &b)])),
        ValidationError::NoInputs
    );
    assert_eq!(
        e(transfer(u.clone(), &[&a, &a], vec![])),
        ValidationError::NoOutputs
    );
    assert!(matches!(
        e(transfer(u.clone(), &[&a], vec![out(100, &b)])),
        ValidationError::WitnessCount { .. }
    ));
    assert_eq!(
        e(transfer(vec![u[0], u[0]], &[&a, &a], vec![out(140, &b)])),
        ValidationError::DuplicateInput(1)
    );
    assert!(matches!(
        e(transfer(
            u.clone(),
            &[&a, &a],
            vec![out(100, &b), out(0, &b)]
        )),
        ValidationError::ZeroValue {
            which: "output",
            index: 1
        }
    ));
    let big = Utxo {
        value: u64::MAX,
        ..u[0]
    };
    assert_eq!(
        e(transfer(vec![big, u[1]], &[&a, &a], vec![out(1, &b)])),
        ValidationError::Overflow
    );
    assert!(matches!(
        e(transfer(u.clone(), &[&a, &a], vec![out(101, &b)])),
        ValidationError::Unbalanced {
            inputs: 100,
            outputs: 101
        }
    ));
    let mut weird = out(100, &b);
    weird.encumbrance.scheme = 9;
    assert!(matches!(
        e(transfer(u.clone(), &[&a, &a], vec![weird])),
        ValidationError::UnknownScheme {
            which: "output",
            ..
        }
    ));
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    t.witnesses[1].scheme = 7;
    assert_eq!(e(t), ValidationError::MalformedWitness(1));
    // b signs for a's input.
    assert_eq!(
        e(transfer(u.clone(), &[&a, &b], vec![out(100, &b)])),
        ValidationError::KeyMismatch(1)
    );
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    t.witnesses[0].signature.0[10] ^= 1;
    assert!(matches!(
        e(t),
        ValidationError::BadSignature { index: 0, .. }
    ));
    // A signature by the right key on another transaction.
    let other = transfer(u.clone(), &[&a, &a], vec![out(99, &b), out(1, &a)]);
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    t.witnesses[1].signature = other.witnesses[1].signature;
    assert_eq!(
        e(t),
        ValidationError::BadSignature {
            index: 1,
            reason: SignatureError::Equation
        }
    );
    // Mints need the issuer; redeems need owners and the issuer.
    let mut m = mint(vec![out(5, &a)], 2);
    m.issuer_signature = a.sign(&m.txid()).unwrap();
    assert!(matches!(
        check(&Transaction::Mint(m)),
        Err(ValidationError::BadIssuerSignature(_))
    ));
    assert_eq!(
        check(&Transaction::Mint(mint(vec![], 3))).unwrap_err(),
        ValidationError::NoOutputs
    );
    let mut r = Redeem {
        inputs: vec![u[0]],
        witnesses: vec![],
        issuer_signature: Signature([0; 64]),
    };
    let txid = r.txid();
    r.witnesses = vec![Witness {
        scheme: SCHEME_ED25519,
        key: a.public_key().0,
        signature: a.sign(&txid).unwrap(),
    }];
    assert!(matches!(
        check(&Transaction::Redeem(r.clone())),
        Err(ValidationError::BadIssuerSignature(_))
    ));
    r.issuer_signature = issuer().sign(&txid).unwrap();
    assert!(check(&Transaction::Redeem(r)).is_ok());
    let _ = i;
}

#[test]
fn batch_validation_pins_the_bad_transaction() {
    let (u, a, b) = funded();
    let good = Transaction::Transfer(transfer(u.clone(), &[&a, &a], vec![out(100, &b)]));
    let mut bad = transfer(u.clone(), &[&a, &a], vec![out(50, &b), out(50, &b)]);
    bad.witnesses[1].signature.0[0] ^= 4;
    let bad = Transaction::Transfer(bad);
    let m = Transaction::Mint(mint(vec![out(1, &b)], 9));
    let res = validate_many(&[&good, &bad, &m], &issuer().public_key(), &mut rng());
    assert!(res[0].is_ok() && res[2].is_ok());
    assert!(matches!(
        res[1],
        Err(ValidationError::BadSignature { index: 1, .. })
    ));
}

#[test]
fn decoder_rejects_malformed_bytes() {
    let (u, a, b) = funded();
    let bytes = Transaction::Transfer(transfer(u, &[&a, &a], vec![out(100, &b)])).encode();
    for cut in 0..bytes.len() {
        assert!(Transaction::decode(&bytes[..cut]).is_err());
    }
    let mut extra = bytes.clone();
    extra.push(0);
    assert_eq!(
        Transaction::decode(&extra),
        Err(DecodeError::TrailingBytes(1))
    );
    let mut v = bytes.clone();
    v[0] = 9;
    assert!(matches!(
        Transaction::decode(&v),
        Err(DecodeError::UnknownVersion { .. })
    ));
    let mut k = bytes;
    k[1] = 4;
    assert!(Transaction::decode(&k).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Value is conserved under random streams of valid and invalid transactions: the unspent
    /// total always equals minted − redeemed, and only valid, unspent-input transfers confirm.
    #[test]
    fn value_is_conserved(ops in proptest::collection::vec((0u8..4, 0usize..16, 1u64..1000, any::<bool>()), 1..40)) {
        let store = MemoryStore::new();
        let keys: Vec<LocalSigner> = (1..=4).map(key).collect();
        let issuer_pk: PublicKey = issuer().public_key();
        let mut wallet: Vec<(Utxo, usize)> = Vec::new();
        let mut spent: Vec<Utxo> = Vec::new();
        for (n, (op, pick, amount, corrupt)) in ops.into_iter().enumerate() {
            let tx = match op {
                0 => Transaction::Mint(mint(vec![out(amount, &keys[pick % 4])], n as u8)),
                1 | 2 if !wallet.is_empty() => {
                    let (u, owner) = wallet[pick % wallet.len()];
                    let split = (amount % u.value).max(1).min(u.value);
                    let mut outs = vec![out(split, &keys[(owner + 1) % 4])];
                    if u.value > split { outs.push(out(u.value - split, &keys[owner])); }
                    let mut t = transfer(vec![u], &[&keys[owner]], outs);
                    if corrupt { t.outputs[0].value += 1; }
                    Transaction::Transfer(t)
                }
                3 if !spent.is_empty() => {
                    // Replay of an already spent input.
                    let u = spent[pick % spent.len()];
                    let owner = keys.iter().position(|k| k.public_key().0 == u.encumbrance.key).unwrap_or(0);
                    Transaction::Transfer(transfer(vec![u], &[&keys[owner]], vec![out(u.value, &keys[owner])]))
                }
                _ => continue,
            };
            let Ok(c) = validate(&tx, &issuer_pk, &mut rng()) else { continue };
            let outcome = store.swap(&[c]).unwrap()[0];
            if outcome == SwapOutcome::Confirmed {
                match &tx {
                    Transaction::Mint(m) => {
                        for u in m.output_utxos() {
                            let o = keys.iter().position(|k| k.public_key().0 == u.encumbrance.key).unwrap();
                            wallet.push((u, o));
                        }
                    }
                    Transaction::Transfer(t) => {
                        for i in &t.inputs {
                            wallet.retain(|(w, _)| w != i);
                            spent.push(*i);
                        }
                        for u in t.output_utxos() {
                            let o = keys.iter().position(|k| k.public_key().0 == u.encumbrance.key).unwrap();
                            wallet.push((u, o));
                        }
                    }
                    Transaction::Redeem(_) => {}
                }
            }
            let s = store.supply().unwrap();
            prop_assert_eq!(s.unspent_cents, s.minted_cents - s.redeemed_cents);
            prop_assert_eq!(s.unspent_cents, wallet.iter().map(|(u, _)| u.value).sum::<u64>());
            for u in &spent {
                prop_assert!(!store.is_unspent(&u.id()).unwrap(), "a spent id returned");
            }
        }
    }
}

//! Sentinel validation: one test per rule, in order; compaction; value conservation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{
    LocalSigner, P256Error, P256PublicKey, P256SecretKey, P256Signature, PublicKey, SecretKey,
    Signature, SignatureError, Signer,
};
use florin_ledger::memory::MemoryStore;
use florin_ledger::tx::{output_serial, p256_key_hash, SCHEME_ED25519, SCHEME_P256};
use florin_ledger::validate::validate_many;
use florin_ledger::{
    validate, CompactTx, DecodeError, Encumbrance, Mint, Output, Redeem, SwapOutcome, SwapStore,
    Transaction, Transfer, Utxo, ValidationError, Witness,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// The encoding of `funded()`'s transfer of both inputs to `b` (version 2, with its expiry): its
/// length and `H("pin", bytes)`, pinned so no encoder change goes unnoticed.
const PINNED_ED25519_LEN: usize = 397;
const PINNED_ED25519_HASH: &str =
    "635e2b728a501781a347b92e7a23cb6aa9fe8df79014574f6afb58ee03d46eec";

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

/// The expiry of every transaction here (validation does not read the clock).
const EXPIRES: u64 = 1_900_000_000;

fn mint(outputs: Vec<Output>, nonce: u8) -> Mint {
    let mut m = Mint {
        expires: EXPIRES,
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
        expires: EXPIRES,
        inputs,
        outputs,
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = owners
        .iter()
        .map(|o| Witness::ed25519(o.public_key(), o.sign(&txid).unwrap()))
        .collect();
    t
}

/// Flips bit 0 of byte `at` of a witness's signature, whatever its scheme.
fn flip_signature(w: &mut Witness, at: usize) {
    match w {
        Witness::Ed25519 { signature, .. } => signature.0[at] ^= 1,
        Witness::P256 { signature, .. } => signature.0[at] ^= 1,
    }
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
fn version_1_transactions_still_decode_with_their_txid_and_every_edge_refuses_them() {
    use florin_ledger::tx::LEGACY_EXPIRES;
    // `funded()`'s transfer of both inputs to `b`, as the encoder wrote it before expiries
    // existed: its pinned bytes (length and hash) come back from a version-1 transaction.
    let (a, b) = (key(1), key(2));
    let mut m = mint(vec![out(70, &a), out(30, &a)], 1);
    m.expires = LEGACY_EXPIRES;
    m.issuer_signature = issuer().sign(&m.txid()).unwrap();
    let u = m.output_utxos();
    let mut t = Transfer {
        expires: LEGACY_EXPIRES,
        inputs: u,
        outputs: vec![out(100, &b)],
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = vec![Witness::ed25519(a.public_key(), a.sign(&txid).unwrap()); 2];
    let tx = Transaction::Transfer(t);
    let bytes = tx.encode();
    assert_eq!(bytes[0], 1, "version 1");
    assert_eq!(bytes.len(), 389);
    assert_eq!(
        hex::encode(florin_crypto::hash("pin", &[&bytes])),
        "0d949b29963c95c954ea3699da8e066fa3e33a07133c1eceff989a4c89fb8d4e"
    );
    assert_eq!(Transaction::decode(&bytes), Ok(tx.clone()));
    assert_eq!(tx.txid(), txid);
    assert!(
        check(&tx).is_ok(),
        "its signatures are over its version-1 txid"
    );
    // Every ledger refuses it: its expiry never passes the edge.
    assert!(matches!(
        florin_ledger::expiry::check(tx.expires(), florin_ledger::expiry::unix_now()),
        Err(florin_ledger::ExpiryError::TooFarAhead { .. })
    ));
    // One encoding per transaction: version 2 with the legacy expiry is refused.
    let mut v2 = bytes.clone();
    v2[0] = 2;
    v2.splice(2..2, u64::MAX.to_le_bytes());
    assert!(Transaction::decode(&v2).is_err());
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
    // A P-256 witness for an Ed25519 input.
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    let p = P256SecretKey::generate(&mut rng());
    t.witnesses[1] = Witness::p256(p.public_key(), p.sign(&t.txid()).unwrap());
    assert_eq!(e(t), ValidationError::MalformedWitness(1));
    // b signs for a's input.
    assert_eq!(
        e(transfer(u.clone(), &[&a, &b], vec![out(100, &b)])),
        ValidationError::KeyMismatch(1)
    );
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    flip_signature(&mut t.witnesses[0], 10);
    assert!(matches!(
        e(t),
        ValidationError::BadSignature { index: 0, .. }
    ));
    // A signature by the right key on another transaction.
    let other = transfer(u.clone(), &[&a, &a], vec![out(99, &b), out(1, &a)]);
    let mut t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    t.witnesses[1] = other.witnesses[1];
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
        expires: EXPIRES,
        inputs: vec![u[0]],
        witnesses: vec![],
        issuer_signature: Signature([0; 64]),
    };
    let txid = r.txid();
    r.witnesses = vec![Witness::ed25519(a.public_key(), a.sign(&txid).unwrap())];
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
    flip_signature(&mut bad.witnesses[1], 0);
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

// ECDSA P-256 (scheme 2): encumbrance = H(compressed key), witness = 2 ‖ key 33 ‖ r ‖ s.

fn p256_key(seed: u64) -> P256SecretKey {
    P256SecretKey::generate(&mut StdRng::seed_from_u64(1000 + seed))
}

fn p256_out(v: u64, k: &P256SecretKey) -> Output {
    Output {
        value: v,
        encumbrance: Encumbrance::p256(&k.public_key()),
    }
}

/// An input owner of either scheme.
#[derive(Clone, Copy)]
enum Owner<'a> {
    Ed(&'a LocalSigner),
    P256(&'a P256SecretKey),
}

impl Owner<'_> {
    fn witness(&self, txid: &[u8; 32]) -> Witness {
        match self {
            Owner::Ed(k) => Witness::ed25519(k.public_key(), k.sign(txid).unwrap()),
            Owner::P256(k) => Witness::p256(k.public_key(), k.sign(txid).unwrap()),
        }
    }
}

fn transfer_by(inputs: Vec<Utxo>, owners: &[Owner<'_>], outputs: Vec<Output>) -> Transfer {
    let mut t = Transfer {
        expires: EXPIRES,
        inputs,
        outputs,
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = owners.iter().map(|o| o.witness(&txid)).collect();
    t
}

/// Two P-256 outputs (70, 30) owned by `c`.
fn funded_p256(c: &P256SecretKey) -> Vec<Utxo> {
    mint(vec![p256_out(70, c), p256_out(30, c)], 11).output_utxos()
}

/// `(r, n − s)`: the high-S twin of a low-S signature, which satisfies the same equation.
fn high_s_twin(sig: &P256Signature) -> P256Signature {
    const N: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63,
        0x25, 0x51,
    ];
    let mut out = sig.0;
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let d = N[i] as i16 - sig.0[32 + i] as i16 - borrow;
        borrow = (d < 0) as i16;
        out[32 + i] = d.rem_euclid(256) as u8;
    }
    P256Signature(out)
}

fn p256_witness_parts(w: &Witness) -> (P256PublicKey, P256Signature) {
    match w {
        Witness::P256 { key, signature } => (*key, *signature),
        other => panic!("not a P-256 witness: {other:?}"),
    }
}

#[test]
fn a_p256_transfer_validates_and_roundtrips() {
    let (c, d) = (p256_key(1), p256_key(2));
    let u = funded_p256(&c);
    // The UTXO keeps its 73-byte shape; the encumbrance names the key only by its hash.
    assert_eq!(u[0].encumbrance.scheme, SCHEME_P256);
    assert_eq!(u[0].encumbrance.key, p256_key_hash(&c.public_key()));
    assert_eq!(u[0].encode().len(), 73);
    let t = transfer_by(
        u.clone(),
        &[Owner::P256(&c), Owner::P256(&c)],
        vec![p256_out(60, &d), out(40, &key(2))],
    );
    let tx = Transaction::Transfer(t.clone());
    let c_tx = check(&tx).unwrap();
    assert_eq!(c_tx.inputs, vec![u[0].id(), u[1].id()]);
    assert_eq!(c_tx.outputs[0].1, 60);
    let bytes = tx.encode();
    assert_eq!(Transaction::decode(&bytes), Ok(tx.clone()));
    // version, kind, expiry, 2 inputs, 2 outputs, 2 witnesses of 1 + 33 + 64 bytes.
    assert_eq!(
        bytes.len(),
        2 + 8 + (2 + 2 * 73) + (2 + 2 * 41) + (2 + 2 * 98)
    );
    let (wkey, sig) = p256_witness_parts(&t.witnesses[1]);
    let mut last = vec![SCHEME_P256];
    last.extend_from_slice(&wkey.0);
    last.extend_from_slice(&sig.0);
    assert_eq!(&bytes[bytes.len() - 98..], last.as_slice());
    assert_eq!(t.witnesses[1].scheme(), SCHEME_P256);
    // The spent P-256 output can be spent onwards by its new owner.
    let next = transfer_by(
        vec![t.output_utxos()[0]],
        &[Owner::P256(&d)],
        vec![out(60, &key(3))],
    );
    assert!(check(&Transaction::Transfer(next)).is_ok());
}

#[test]
fn ed25519_witness_encoding_is_unchanged() {
    let (u, a, b) = funded();
    let t = transfer(u.clone(), &[&a, &a], vec![out(100, &b)]);
    let bytes = Transaction::Transfer(t.clone()).encode();
    // Laid out by hand: version, kind, expiry, inputs, outputs, witnesses `1 ‖ key 32 ‖ sig 64`.
    let mut expect = vec![2u8, 1];
    expect.extend_from_slice(&EXPIRES.to_le_bytes());
    expect.extend_from_slice(&2u16.to_le_bytes());
    expect.extend_from_slice(&u[0].encode());
    expect.extend_from_slice(&u[1].encode());
    expect.extend_from_slice(&1u16.to_le_bytes());
    expect.extend_from_slice(&100u64.to_le_bytes());
    expect.push(SCHEME_ED25519);
    expect.extend_from_slice(&b.public_key().0);
    expect.extend_from_slice(&2u16.to_le_bytes());
    for w in &t.witnesses {
        let Witness::Ed25519 { key, signature } = w else {
            panic!("not Ed25519")
        };
        expect.push(SCHEME_ED25519);
        expect.extend_from_slice(&key.0);
        expect.extend_from_slice(&signature.0);
    }
    assert_eq!(bytes, expect);
    // Pinned (Ed25519 signatures are deterministic).
    assert_eq!(bytes.len(), PINNED_ED25519_LEN);
    assert_eq!(
        hex::encode(florin_crypto::hash("pin", &[&bytes])),
        PINNED_ED25519_HASH
    );
}

#[test]
fn mixed_ed25519_and_p256_inputs_in_one_transaction() {
    let (a, b) = (key(1), key(2));
    let c = p256_key(3);
    let m = mint(vec![out(70, &a), p256_out(30, &c)], 12);
    let u = m.output_utxos();
    let t = transfer_by(
        u.clone(),
        &[Owner::Ed(&a), Owner::P256(&c)],
        vec![out(50, &b), p256_out(50, &c)],
    );
    let tx = Transaction::Transfer(t.clone());
    assert!(check(&tx).is_ok());
    assert_eq!(Transaction::decode(&tx.encode()), Ok(tx));
    // The witnesses must follow their inputs' schemes, in order.
    let swapped = Transfer {
        expires: EXPIRES,
        witnesses: vec![t.witnesses[1], t.witnesses[0]],
        ..t.clone()
    };
    assert_eq!(
        check(&Transaction::Transfer(swapped)).unwrap_err(),
        ValidationError::MalformedWitness(0)
    );
    // A redeem of a P-256 input: the owner signs with P-256, the issuer with Ed25519.
    let mut r = Redeem {
        expires: EXPIRES,
        inputs: vec![u[1]],
        witnesses: vec![],
        issuer_signature: Signature([0; 64]),
    };
    let txid = r.txid();
    r.witnesses = vec![Owner::P256(&c).witness(&txid)];
    r.issuer_signature = issuer().sign(&txid).unwrap();
    assert!(check(&Transaction::Redeem(r.clone())).is_ok());
    r.issuer_signature = a.sign(&txid).unwrap();
    assert!(matches!(
        check(&Transaction::Redeem(r)),
        Err(ValidationError::BadIssuerSignature(_))
    ));
}

#[test]
fn p256_witness_errors_name_the_witness() {
    let a = key(1);
    let (c, d) = (p256_key(1), p256_key(2));
    let m = mint(vec![out(10, &a), p256_out(20, &c), p256_out(30, &c)], 13);
    let u = m.output_utxos();
    let owners = [Owner::Ed(&a), Owner::P256(&c), Owner::P256(&c)];
    let good = transfer_by(u.clone(), &owners, vec![out(60, &a)]);
    let txid = good.txid();
    let e = |t: &Transfer| check(&Transaction::Transfer(t.clone())).unwrap_err();
    assert!(check(&Transaction::Transfer(good.clone())).is_ok());

    // A corrupted signature (last byte of s: still in range and low).
    let mut t = good.clone();
    flip_signature(&mut t.witnesses[2], 63);
    assert_eq!(
        e(&t),
        ValidationError::BadP256Signature {
            index: 2,
            reason: P256Error::Equation
        }
    );
    assert_eq!(e(&t).witness(), Some(2));

    // c's key, but a signature by d.
    let mut t = good.clone();
    t.witnesses[1] = Witness::p256(c.public_key(), d.sign(&txid).unwrap());
    assert_eq!(
        e(&t),
        ValidationError::BadP256Signature {
            index: 1,
            reason: P256Error::Equation
        }
    );

    // c's key and signature, but on another transaction.
    let other = transfer_by(u.clone(), &owners, vec![out(59, &a), out(1, &a)]);
    let mut t = good.clone();
    t.witnesses[2] = other.witnesses[2];
    assert!(matches!(
        e(&t),
        ValidationError::BadP256Signature { index: 2, .. }
    ));

    // d signs with d's own key: the key does not hash to the input's encumbrance.
    let mut t = good.clone();
    t.witnesses[1] = Owner::P256(&d).witness(&txid);
    assert_eq!(e(&t), ValidationError::KeyMismatch(1));
    // Key mismatches are found before any signature is checked.
    flip_signature(&mut t.witnesses[2], 63);
    assert_eq!(e(&t), ValidationError::KeyMismatch(1));

    // The high-S twin of a valid signature satisfies the ECDSA equation but is refused.
    let (key_c, sig) = p256_witness_parts(&good.witnesses[1]);
    let mut t = good.clone();
    t.witnesses[1] = Witness::p256(key_c, high_s_twin(&sig));
    assert_eq!(
        e(&t),
        ValidationError::BadP256Signature {
            index: 1,
            reason: P256Error::HighS
        }
    );

    // An Ed25519 witness for a P-256 input, and the other way round.
    let mut t = good.clone();
    t.witnesses[1] = Owner::Ed(&a).witness(&txid);
    assert_eq!(e(&t), ValidationError::MalformedWitness(1));
    let mut t = good.clone();
    t.witnesses[0] = Owner::P256(&c).witness(&txid);
    assert_eq!(e(&t), ValidationError::MalformedWitness(0));

    // A P-256 encumbrance on bytes that are not a canonical point: its witness key hashes to
    // the encumbrance, and verification refuses it without panicking.
    let mut junk = c.public_key();
    junk.0[0] = 0x05;
    let m = mint(
        vec![Output {
            value: 5,
            encumbrance: Encumbrance::p256(&junk),
        }],
        14,
    );
    let mut t = transfer_by(m.output_utxos(), &[Owner::P256(&c)], vec![out(5, &a)]);
    let (_, sig) = p256_witness_parts(&t.witnesses[0]);
    t.witnesses[0] = Witness::p256(junk, sig);
    assert_eq!(
        e(&t),
        ValidationError::BadP256Signature {
            index: 0,
            reason: P256Error::NonCanonicalKey
        }
    );
}

#[test]
fn decoder_rejects_malformed_p256_witnesses() {
    let c = p256_key(1);
    let t = transfer_by(
        funded_p256(&c),
        &[Owner::P256(&c), Owner::P256(&c)],
        vec![out(100, &key(2))],
    );
    let bytes = Transaction::Transfer(t).encode();
    for cut in 0..bytes.len() {
        assert!(Transaction::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    // Cut inside the last witness's signature (two P-256 witnesses pass the count's bound of
    // 2 × 97 bytes with two bytes to spare)...
    assert_eq!(
        Transaction::decode(&bytes[..bytes.len() - 2]),
        Err(DecodeError::Truncated {
            what: "witness signature",
            needed: 2
        })
    );
    // ...or short of that bound.
    assert_eq!(
        Transaction::decode(&bytes[..bytes.len() - 10]),
        Err(DecodeError::Truncated {
            what: "witnesses",
            needed: 8
        })
    );
    let last = bytes.len() - 98;
    for unknown in [0u8, 3, 9, 0xff] {
        let mut b = bytes.clone();
        b[last] = unknown;
        assert_eq!(
            Transaction::decode(&b),
            Err(DecodeError::Invalid("witness scheme"))
        );
    }
    // Relabelled as Ed25519, the 98-byte witness leaves one byte over.
    let mut b = bytes.clone();
    b[last] = SCHEME_ED25519;
    assert_eq!(Transaction::decode(&b), Err(DecodeError::TrailingBytes(1)));
    // An Ed25519 witness relabelled as P-256 runs one byte short.
    let (u, a, bb) = funded();
    let ed = Transaction::Transfer(transfer(u, &[&a, &a], vec![out(100, &bb)])).encode();
    let mut b = ed.clone();
    let last = ed.len() - 97;
    b[last] = SCHEME_P256;
    assert!(matches!(
        Transaction::decode(&b),
        Err(DecodeError::Truncated { needed: 1, .. })
    ));
}

#[test]
fn a_bad_p256_transaction_fails_alone_in_a_batch() {
    let (a, b) = (key(1), key(2));
    let c = p256_key(1);
    let (u, _, _) = funded();
    let up = funded_p256(&c);
    let good_ed = Transaction::Transfer(transfer(u.clone(), &[&a, &a], vec![out(100, &b)]));
    let mut bad = transfer_by(
        up.clone(),
        &[Owner::P256(&c), Owner::P256(&c)],
        vec![out(100, &b)],
    );
    flip_signature(&mut bad.witnesses[1], 40);
    let bad_p = Transaction::Transfer(bad);
    let good_p = Transaction::Transfer(transfer_by(
        up,
        &[Owner::P256(&c), Owner::P256(&c)],
        vec![out(50, &b), p256_out(50, &c)],
    ));
    let good_ed2 = Transaction::Transfer(transfer(u, &[&a, &a], vec![out(99, &b), out(1, &a)]));
    let m = Transaction::Mint(mint(vec![out(1, &b)], 15));
    let txs = [&good_ed, &bad_p, &good_p, &good_ed2, &m];
    let res = validate_many(&txs, &issuer().public_key(), &mut rng());
    assert!(matches!(
        res[1],
        Err(ValidationError::BadP256Signature { index: 1, .. })
    ));
    for i in [0, 2, 3, 4] {
        assert_eq!(res[i], check(txs[i]), "transaction {i}");
        assert!(res[i].is_ok(), "transaction {i}");
    }
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Corrupting any byte of a mixed-scheme transfer never panics the decoder or the
    /// validator, and never yields a valid transaction other than the original.
    #[test]
    fn corrupted_mixed_transfers_never_validate(at in 0usize..1000, to in any::<u8>()) {
        let (a, b) = (key(1), key(2));
        let c = p256_key(3);
        let m = mint(vec![out(70, &a), p256_out(30, &c)], 16);
        let tx = Transaction::Transfer(transfer_by(
            m.output_utxos(),
            &[Owner::Ed(&a), Owner::P256(&c)],
            vec![out(100, &b)],
        ));
        let mut bytes = tx.encode();
        let at = at % bytes.len();
        let changed = bytes[at] != to;
        bytes[at] = to;
        if let Ok(decoded) = Transaction::decode(&bytes) {
            let verdict = check(&decoded);
            // The encoding is canonical, so a changed byte is a changed transaction: another
            // txid, key or signature, which no witness signed.
            prop_assert_eq!(verdict.is_ok(), !changed);
        }
    }
}

#[test]
fn encumbrance_text_round_trips_and_refuses_junk() {
    let ed = Encumbrance::ed25519(&SecretKey::from_seed(&[3; 32]).public_key());
    let p = Encumbrance::p256(&P256SecretKey::from_bytes(&[7; 32]).unwrap().public_key());
    for e in [ed, p] {
        let t = e.to_text();
        assert_eq!(Encumbrance::parse_text(&t), Some(e), "{t}");
    }
    assert!(p.to_text().starts_with("p256:"));
    assert!(ed.to_text().starts_with("ed25519:"));
    for junk in [
        "",
        "p256",
        "p256:",
        "p256:zz",
        "rsa:00",
        &format!("p256:{}", "ab".repeat(31)),
        &format!("p256:{}", "ab".repeat(33)),
        &format!("ed25519{}", "ab".repeat(32)),
    ] {
        assert_eq!(Encumbrance::parse_text(junk), None, "{junk:?}");
    }
}

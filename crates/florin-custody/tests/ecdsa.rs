//! Threshold ECDSA (CGGMP24) end to end, at the insecure test security level so it runs in
//! seconds: the protocol code is the production one. Signatures are checked with the ordinary
//! `p256` verifier, and a custodial wallet with a threshold key pays on the ledger.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use florin_custody::ecdsa::{
    self, add_key, aux_session, combine, export, import, keygen_session, new_session_id,
    partial_sign, presign_session, run_local, sign_session, AuxShare, CoreShare, InsecureTest,
    KeyShare, Partial, Primes, Session, WireMsg,
};
use florin_custody::{CustodyError, PartyId};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};

type L = InsecureTest;

struct Group {
    aux: Vec<AuxShare<L>>,
    /// A 2-of-3 key made by DKG.
    cores: Vec<CoreShare>,
}

/// Primes, auxiliary info and one DKG key for a 3-node group, made once for every test.
fn group() -> &'static Group {
    static G: OnceLock<Group> = OnceLock::new();
    G.get_or_init(|| {
        let sid = new_session_id();
        let sessions = (1..=3)
            .map(|p| {
                let primes = Primes::<L>::generate(&mut ecdsa::session_rng());
                // Through the pool-file encoding, as a node loads them.
                let primes = Primes::<L>::from_bytes(&primes.to_bytes()).unwrap();
                (p, aux_session(sid, p, 3, primes).unwrap())
            })
            .collect();
        let aux: Vec<AuxShare<L>> = run_local(sessions)
            .unwrap()
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        let cores = dkg(3, 2);
        Group { aux, cores }
    })
}

fn dkg(n: u16, t: u16) -> Vec<CoreShare> {
    let sid = new_session_id();
    let sessions = (1..=n)
        .map(|p| (p, keygen_session::<L>(sid, p, n, t).unwrap()))
        .collect();
    run_local(sessions)
        .unwrap()
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

fn shares(cores: &[CoreShare]) -> Vec<KeyShare<L>> {
    let g = group();
    cores
        .iter()
        .map(|c| KeyShare::from_parts(c.clone(), g.aux[c.party() as usize - 1].clone()).unwrap())
        .collect()
}

fn verify(pk: &[u8; 33], msg: &[u8], sig: &[u8; 64]) -> bool {
    let vk = VerifyingKey::from_sec1_bytes(pk).unwrap();
    let sig = Signature::from_slice(sig).unwrap();
    sig.normalize_s().is_none() && vk.verify(msg, &sig).is_ok()
}

fn presign(
    keys: &[KeyShare<L>],
    signers: &[PartyId],
) -> (Vec<(PartyId, ecdsa::Presignature)>, ecdsa::PresigPublic) {
    let sid = new_session_id();
    let sessions = signers
        .iter()
        .map(|&p| {
            let key = keys[p as usize - 1].clone();
            (p, presign_session(sid, signers, key).unwrap())
        })
        .collect();
    let out = run_local(sessions).unwrap();
    let public = out[0].0 .1.clone();
    assert!(out.iter().all(|((_, p), _)| *p == public));
    let presigs = signers
        .iter()
        .zip(out)
        .map(|(&p, ((s, _), _))| (p, s))
        .collect();
    (presigs, public)
}

fn sign_with_presignature(keys: &[KeyShare<L>], signers: &[PartyId], msg: &[u8]) -> [u8; 64] {
    let (presigs, public) = presign(keys, signers);
    let partials: Vec<Partial> = presigs
        .into_iter()
        .map(|(p, s)| Partial::from_bytes(&partial_sign(p, s, msg).to_bytes()).unwrap())
        .collect();
    let public = ecdsa::PresigPublic::from_bytes(&public.to_bytes()).unwrap();
    combine(&public, &partials, msg, &keys[0].public_key()).unwrap()
}

#[test]
fn any_two_of_three_sign_from_presignatures_and_p256_verifies() {
    let g = group();
    let keys = shares(&g.cores);
    let pk = keys[0].public_key();
    assert!(keys.iter().all(|k| k.public_key() == pk));
    for signers in [[1, 2], [1, 3], [2, 3], [3, 1]] {
        let msg = format!("txid signed by {signers:?}");
        let sig = sign_with_presignature(&keys, &signers, msg.as_bytes());
        assert!(verify(&pk, msg.as_bytes(), &sig), "signers {signers:?}");
        assert!(!verify(&pk, b"another message", &sig));
    }
}

#[test]
fn interactive_signing_is_the_fallback() {
    let g = group();
    let keys = shares(&g.cores);
    let sid = new_session_id();
    let msg = b"no presignature left";
    let sessions = [2u16, 3]
        .iter()
        .map(|&p| {
            (
                p,
                sign_session(sid, &[2, 3], keys[p as usize - 1].clone(), msg).unwrap(),
            )
        })
        .collect();
    let out = run_local(sessions).unwrap();
    assert_eq!(out[0].0, out[1].0);
    assert!(verify(&keys[0].public_key(), msg, &out[0].0));
}

#[test]
fn fewer_than_t_signers_are_refused_at_once() {
    let g = group();
    let keys = shares(&g.cores);
    let e = presign_session(new_session_id(), &[1], keys[0].clone())
        .err()
        .unwrap();
    assert_eq!(e, CustodyError::TooFewParties { have: 1, need: 2 });
    let e = presign_session(new_session_id(), &[1, 1], keys[0].clone())
        .err()
        .unwrap();
    assert!(matches!(e, CustodyError::BadParameters(_)), "{e}");
    let e = presign_session(new_session_id(), &[2, 3], keys[0].clone())
        .err()
        .unwrap();
    assert!(matches!(e, CustodyError::BadParameters(_)), "{e}");
    // t − 1 partials do not make a signature.
    let (mut presigs, public) = presign(&keys, &[1, 2]);
    let (p, s) = presigs.remove(0);
    let one = partial_sign(p, s, b"m");
    let e = combine(&public, &[one], b"m", &keys[0].public_key()).unwrap_err();
    assert_eq!(e, CustodyError::TooFewParties { have: 1, need: 2 });
}

#[test]
fn a_bad_partial_names_its_signer() {
    let g = group();
    let keys = shares(&g.cores);
    let msg = b"pay 10.00";
    let (presigs, public) = presign(&keys, &[1, 3]);
    let mut partials: Vec<Partial> = presigs
        .into_iter()
        .map(|(p, s)| partial_sign(p, s, msg))
        .collect();
    // Party 3 signs another message with its presignature share.
    let mut bytes = partials[1].to_bytes();
    bytes[33] ^= 1;
    partials[1] = Partial::from_bytes(&bytes).unwrap();
    let e = combine(&public, &partials, msg, &keys[0].public_key()).unwrap_err();
    assert!(
        matches!(e, CustodyError::Misbehaved { party: 3, .. }),
        "{e}"
    );
    assert!(Partial::from_bytes(&[0u8; 5]).is_err());
}

/// Runs a session set, letting `tamper` rewrite every message in flight; returns each party's
/// error (`None` for a party that finished).
fn run_tampered<O>(
    mut sessions: Vec<(PartyId, Session<O>)>,
    tamper: impl Fn(&mut WireMsg),
) -> Vec<Option<CustodyError>> {
    let mut queue: Vec<WireMsg> = Vec::new();
    let mut errors: Vec<Option<CustodyError>> = sessions.iter().map(|_| None).collect();
    let mut done = vec![false; sessions.len()];
    for _ in 0..32 {
        let mut next = Vec::new();
        for (k, (id, s)) in sessions.iter_mut().enumerate() {
            if done[k] {
                continue;
            }
            let mine: Vec<WireMsg> = queue
                .iter()
                .filter(|m| m.from != *id && m.to.is_none_or(|t| t == *id))
                .cloned()
                .collect();
            match s.step(mine) {
                Ok(step) => {
                    done[k] = step.done.is_some();
                    for mut m in step.out {
                        tamper(&mut m);
                        next.push(m);
                    }
                }
                Err(e) => {
                    errors[k] = Some(e);
                    done[k] = true;
                }
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        queue = next;
    }
    errors
}

#[test]
fn garbage_from_a_party_names_it() {
    let g = group();
    let keys = shares(&g.cores);
    let sid = new_session_id();
    let sessions = [1u16, 2]
        .iter()
        .map(|&p| {
            (
                p,
                presign_session(sid, &[1, 2], keys[p as usize - 1].clone()).unwrap(),
            )
        })
        .collect();
    let errors = run_tampered(sessions, |m| {
        if m.from == 2 {
            m.body.truncate(m.body.len() / 2);
        }
    });
    let e = errors[0].clone().expect("party 1 stops");
    assert!(
        matches!(e, CustodyError::Misbehaved { party: 2, .. }),
        "{e}"
    );
}

#[test]
fn a_message_replayed_from_another_session_is_caught_and_its_sender_named() {
    let g = group();
    let keys = shares(&g.cores);
    // Record party 1's first-round messages from one presigning run...
    let sid_a = new_session_id();
    let mut recorded = Vec::new();
    {
        let mut s = presign_session(sid_a, &[1, 2], keys[0].clone()).unwrap();
        recorded.extend(s.step(Vec::new()).unwrap().out);
    }
    // ...and play them in place of party 1's messages in another run.
    let sid_b = new_session_id();
    let sessions = [1u16, 2]
        .iter()
        .map(|&p| {
            (
                p,
                presign_session(sid_b, &[1, 2], keys[p as usize - 1].clone()).unwrap(),
            )
        })
        .collect();
    let first = std::sync::Mutex::new(recorded);
    let errors = run_tampered(sessions, |m| {
        if m.from == 1 {
            let mut rec = first.lock().unwrap();
            if let Some(pos) = rec.iter().position(|r| r.to == m.to) {
                *m = rec.remove(pos);
            }
        }
    });
    // Party 2 received the replayed messages: the echo check shows that the two parties saw
    // different first rounds. Neither can tell the relay's replay from a lie, so both stop and
    // neither names the other (with 2 parties the library would blame each other).
    for (k, e) in errors.iter().enumerate() {
        let e = e
            .clone()
            .unwrap_or_else(|| panic!("party {} finished", k + 1));
        assert!(
            matches!(e, CustodyError::Inconsistent(_)),
            "party {}: {e}",
            k + 1
        );
    }
}

#[test]
fn signer_order_does_not_matter() {
    let g = group();
    let keys = shares(&g.cores);
    let sid = new_session_id();
    let sessions = vec![
        (1, presign_session(sid, &[1, 3], keys[0].clone()).unwrap()),
        (3, presign_session(sid, &[3, 1], keys[2].clone()).unwrap()),
    ];
    let out = run_local(sessions).unwrap();
    assert_eq!(out[0].0 .1.signers, vec![1, 3]);
    assert_eq!(out[0].0 .1, out[1].0 .1);
    // A commitment list whose signers are out of order or repeated does not decode.
    let mut bytes = out[0].0 .1.to_bytes();
    let text = String::from_utf8(bytes.clone()).unwrap();
    bytes = text.replacen("[1,3]", "[3,1]", 1).into_bytes();
    assert!(ecdsa::PresigPublic::from_bytes(&bytes).is_err());
}

#[test]
fn import_then_export_round_trips_and_imported_keys_sign() {
    let sk = SigningKey::random(&mut rand::rngs::OsRng);
    let secret: [u8; 32] = sk.to_bytes().into();
    let pk: [u8; 33] = sk
        .verifying_key()
        .to_encoded_point(true)
        .as_bytes()
        .try_into()
        .unwrap();
    let cores = import(&secret, 2, 3, &mut ecdsa::session_rng()).unwrap();
    assert!(cores
        .iter()
        .all(|c| c.public_key() == pk && c.t() == 2 && c.n() == 3));
    for pair in [[0usize, 1], [1, 2], [2, 0]] {
        let two = [cores[pair[0]].clone(), cores[pair[1]].clone()];
        assert_eq!(export(&two).unwrap(), secret);
    }
    assert_eq!(
        export(&cores[..1]).unwrap_err(),
        CustodyError::TooFewParties { have: 1, need: 2 }
    );
    let keys = shares(&cores);
    let sig = sign_with_presignature(&keys, &[2, 3], b"imported");
    assert!(verify(&pk, b"imported", &sig));
    // Shares of different keys do not export.
    let other = dkg(3, 2);
    assert!(export(&[cores[0].clone(), other[1].clone()]).is_err());
    assert!(import(&[0u8; 32], 2, 3, &mut ecdsa::session_rng()).is_err());
    assert!(import(&[0xff; 32], 2, 3, &mut ecdsa::session_rng()).is_err());
    assert!(import(&secret, 4, 3, &mut ecdsa::session_rng()).is_err());
}

#[test]
fn key_addition_gives_a_key_the_sender_cannot_use() {
    let g = group();
    // Recipient provider's threshold key r1; the sender hands over a whole key r2.
    let r2 = SigningKey::random(&mut rand::rngs::OsRng);
    let r2_bytes: [u8; 32] = r2.to_bytes().into();
    let added: Vec<CoreShare> = g
        .cores
        .iter()
        .map(|c| add_key(c, &r2_bytes).unwrap())
        .collect();
    let pk = added[0].public_key();
    assert!(added.iter().all(|c| c.public_key() == pk));
    // R1 + R2.
    let r1 = p256::PublicKey::from_sec1_bytes(&g.cores[0].public_key()).unwrap();
    let sum = (r1.to_projective() + r2.verifying_key().as_affine()).to_affine();
    let sum: [u8; 33] = p256::PublicKey::from_affine(sum)
        .unwrap()
        .to_sec1_bytes()
        .as_ref()
        .try_into()
        .unwrap_or_else(|_| {
            let p = p256::PublicKey::from_affine(sum).unwrap();
            let e = p256::elliptic_curve::sec1::ToEncodedPoint::to_encoded_point(&p, true);
            e.as_bytes().try_into().unwrap()
        });
    assert_eq!(pk, sum);
    // The network signs for r1 + r2 ...
    let keys = shares(&added);
    let sig = sign_with_presignature(&keys, &[1, 2], b"after addition");
    assert!(verify(&pk, b"after addition", &sig));
    // ... the sender's r2 alone does not.
    let forged: Signature = p256::ecdsa::signature::Signer::sign(&r2, b"after addition");
    assert!(!verify(&pk, b"after addition", &forged.to_bytes().into()));
    // The exported key is r1 + r2.
    let r1_secret = export(&g.cores[..2]).unwrap();
    let sum_secret = export(&added[1..]).unwrap();
    let expect = p256::NonZeroScalar::try_from(&r1_secret[..])
        .unwrap()
        .as_ref()
        + p256::NonZeroScalar::try_from(&r2_bytes[..])
            .unwrap()
            .as_ref();
    assert_eq!(sum_secret, <[u8; 32]>::from(expect.to_bytes()));
}

#[test]
fn shares_round_trip_and_garbage_is_refused() {
    let g = group();
    for c in &g.cores {
        let back = CoreShare::from_bytes(&c.to_bytes()).unwrap();
        assert_eq!(back.public_key(), c.public_key());
        assert_eq!(back.party(), c.party());
    }
    for a in &g.aux {
        let back = AuxShare::<L>::from_bytes(&a.to_bytes()).unwrap();
        assert_eq!(back.n(), 3);
    }
    let mut bytes = g.cores[0].to_bytes();
    let n = bytes.len();
    bytes.truncate(n - 10);
    assert!(matches!(
        CoreShare::from_bytes(&bytes),
        Err(CustodyError::Malformed { .. })
    ));
    assert!(AuxShare::<L>::from_bytes(b"{}").is_err());
    assert!(Primes::<L>::from_bytes(b"not primes").is_err());
    // A share joined with another party's auxiliary info is refused.
    assert!(KeyShare::from_parts(g.cores[0].clone(), g.aux[1].clone()).is_err());
    // Bad parameters.
    assert!(keygen_session::<L>(new_session_id(), 4, 3, 2).is_err());
    assert!(keygen_session::<L>(new_session_id(), 1, 3, 1).is_err());
}

#[test]
fn a_custodial_threshold_wallet_pays_on_the_ledger_like_any_p256_wallet() {
    use florin_crypto::{
        LocalSigner, P256PublicKey, P256SecretKey, P256Signature, SecretKey, Signer,
    };
    use florin_ledger::memory::MemoryStore;
    use florin_ledger::tx::output_serial;
    use florin_ledger::{
        validate, Encumbrance, Mint, Output, SwapOutcome, SwapStore, Transaction, Transfer, Utxo,
        ValidationError, Witness,
    };

    let g = group();
    let keys = shares(&g.cores);
    let custodial = P256PublicKey::from_sec1(&keys[0].public_key()).unwrap();
    let issuer = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
    let payee = P256SecretKey::generate(&mut rand::rngs::OsRng);
    let mut rng = ecdsa::session_rng();
    let store = MemoryStore::new();

    // The issuer mints 10.00 to the custodial wallet.
    let mut mint = Mint {
        expires: florin_ledger::expiry::default_expiry(),
        nonce: [7; 32],
        outputs: vec![Output {
            value: 1_000,
            encumbrance: Encumbrance::p256(&custodial),
        }],
        issuer_signature: florin_crypto::Signature([0; 64]),
    };
    mint.issuer_signature = issuer.sign(&mint.txid()).unwrap();
    let minted = Utxo {
        value: 1_000,
        encumbrance: Encumbrance::p256(&custodial),
        serial: output_serial(&mint.txid(), 0),
    };
    let c = validate(&Transaction::Mint(mint), &issuer.public_key(), &mut rng).unwrap();
    assert_eq!(store.swap(&[c]).unwrap(), vec![SwapOutcome::Confirmed]);

    // The provider's network signs the transfer's txid with a presignature.
    let mut t = Transfer {
        expires: florin_ledger::expiry::default_expiry(),
        inputs: vec![minted],
        outputs: vec![Output {
            value: 1_000,
            encumbrance: Encumbrance::p256(&payee.public_key()),
        }],
        witnesses: vec![],
    };
    let txid = t.txid();
    let sig = sign_with_presignature(&keys, &[2, 3], &txid);
    t.witnesses = vec![Witness::p256(custodial, P256Signature(sig))];
    // A forged witness (the payee's own key signing) is refused without touching the store.
    let mut forged = t.clone();
    forged.witnesses = vec![Witness::p256(custodial, payee.sign(&txid).unwrap())];
    let e = validate(
        &Transaction::Transfer(forged),
        &issuer.public_key(),
        &mut rng,
    )
    .unwrap_err();
    assert!(
        matches!(e, ValidationError::BadP256Signature { index: 0, .. }),
        "{e}"
    );
    let c = validate(
        &Transaction::Transfer(t.clone()),
        &issuer.public_key(),
        &mut rng,
    )
    .unwrap();
    assert_eq!(
        store.swap(std::slice::from_ref(&c)).unwrap(),
        vec![SwapOutcome::Confirmed]
    );
    // A replay spends nothing twice.
    assert_eq!(store.swap(&[c]).unwrap(), vec![SwapOutcome::AlreadyApplied]);
}

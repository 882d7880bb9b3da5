//! The offline-cash protocol end to end, without I/O: mint, hops, client and authority
//! verification, replay prevention, double-spend detection and fraud proofs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_token::authority::{settle, Outcome, Reanchor, SettleMode};
use florin_token::registry::{Reconcile, TokenRecord};
use florin_token::verify::{authority_precheck, client_precheck, verify_chain, verify_chains};
use florin_token::{
    ClientPolicy, DecodeError, Denomination, FraudProof, Payment, PaymentRequest, Token, TokenError,
};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn signer(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

fn authority() -> LocalSigner {
    signer(250)
}

fn mint_to(holder: &PublicKey, serial: u8) -> Token {
    Token::mint(
        &authority(),
        [serial; 8],
        Denomination::E5,
        [9; 64],
        *holder,
        [1; 32],
    )
    .unwrap()
}

/// Passes `token` along `holders[1..]`, each hop with its own handshake.
fn hop(mut token: Token, holders: &[LocalSigner], salt: u8) -> Token {
    for w in holders.windows(2) {
        token = token
            .transfer(&w[0], w[1].public_key(), [salt; 32])
            .unwrap();
    }
    token
}

fn policy() -> ClientPolicy {
    ClientPolicy {
        trusted_authorities: vec![authority().public_key()],
        max_hops: 32,
    }
}

fn client_ok(token: &Token, me: &PublicKey) -> Result<(), TokenError> {
    client_precheck(token, me, None, &HashSet::new(), &policy())?;
    verify_chain(token, &mut rng())
}

#[test]
fn honest_chain_verifies_for_its_holder_only() {
    let w: Vec<_> = (1..=6).map(signer).collect();
    let t = hop(mint_to(&w[0].public_key(), 1), &w, 3);
    assert_eq!(t.hops(), 5);
    assert_eq!(t.encoded_len(), 108 + 6 * 128);
    assert_eq!(client_ok(&t, &w[5].public_key()), Ok(()));
    assert!(matches!(
        client_ok(&t, &w[4].public_key()),
        Err(TokenError::NotForMe { .. })
    ));
}

#[test]
fn only_the_holder_can_transfer() {
    let t = mint_to(&signer(1).public_key(), 1);
    assert!(t
        .transfer(&signer(2), signer(3).public_key(), [0; 32])
        .is_err());
}

#[test]
fn unknown_authority_and_hop_limit() {
    let fake = signer(99);
    let me = signer(1);
    let t = Token::mint(
        &fake,
        [1; 8],
        Denomination::C1,
        [0; 64],
        me.public_key(),
        [0; 32],
    )
    .unwrap();
    assert!(matches!(
        client_ok(&t, &me.public_key()),
        Err(TokenError::UnknownAuthority { .. })
    ));
    let w: Vec<_> = (1..=5).map(signer).collect();
    let long = hop(mint_to(&w[0].public_key(), 2), &w, 1);
    let tight = ClientPolicy {
        max_hops: 3,
        ..policy()
    };
    assert!(matches!(
        client_precheck(&long, &w[4].public_key(), None, &HashSet::new(), &tight),
        Err(TokenError::TooManyHops {
            hops: 4,
            max: 3,
            ..
        })
    ));
}

#[test]
fn replay_is_refused_by_handshake_and_seen_proof() {
    let (a, b) = (signer(1), signer(2));
    let t = mint_to(&a.public_key(), 1);
    let paid = t.transfer(&a, b.public_key(), [5; 32]).unwrap();
    // The payee issued a new handshake: the old payment does not carry it.
    let r = client_precheck(
        &paid,
        &b.public_key(),
        Some(&[6; 32]),
        &HashSet::new(),
        &policy(),
    );
    assert!(matches!(r, Err(TokenError::WrongHandshake { .. })));
    // Even with the right handshake, a proof already accepted is refused.
    let seen: HashSet<_> = [paid.links.last().unwrap().proof].into_iter().collect();
    let r = client_precheck(&paid, &b.public_key(), Some(&[5; 32]), &seen, &policy());
    assert!(matches!(r, Err(TokenError::Replayed { .. })));
}

#[test]
fn a_token_may_come_back_to_a_previous_holder() {
    let (a, b) = (signer(1), signer(2));
    let t = mint_to(&a.public_key(), 1);
    let to_b = t.transfer(&a, b.public_key(), [5; 32]).unwrap();
    let seen: HashSet<_> = [t.links[0].proof].into_iter().collect(); // a accepted the anchor
    let back = to_b.transfer(&b, a.public_key(), [6; 32]).unwrap();
    assert_eq!(
        client_precheck(&back, &a.public_key(), Some(&[6; 32]), &seen, &policy()),
        Ok(())
    );
}

#[test]
fn decoders_reject_malformed_bytes() {
    let t = mint_to(&signer(1).public_key(), 1);
    let bytes = t.encode();
    assert_eq!(Token::decode(&bytes), Ok(t.clone()));
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert_eq!(Token::decode(&trailing), Err(DecodeError::TrailingBytes(1)));
    let mut version = bytes.clone();
    version[0] = 2;
    assert!(matches!(
        Token::decode(&version),
        Err(DecodeError::UnknownVersion { found: 2, .. })
    ));
    let mut value = bytes.clone();
    value[9] = 0;
    assert_eq!(
        Token::decode(&value),
        Err(DecodeError::InvalidDenomination(0))
    );
    value[9] = 16;
    assert_eq!(
        Token::decode(&value),
        Err(DecodeError::InvalidDenomination(16))
    );
    for cut in 0..bytes.len() {
        assert!(Token::decode(&bytes[..cut]).is_err());
    }
    let mut no_links = bytes[..108].to_vec();
    no_links[106] = 0;
    no_links[107] = 0;
    assert!(Token::decode(&no_links).is_err());
    let mut huge = bytes.clone();
    huge[106] = 0xff;
    huge[107] = 0xff;
    assert!(matches!(
        Token::decode(&huge),
        Err(DecodeError::Truncated { .. })
    ));
    assert!(Payment::decode(&[]).is_err());
    assert!(PaymentRequest::decode(&[1, 0]).is_err());
}

#[test]
fn token_encoding_is_pinned() {
    let (a, b) = (signer(1), signer(2));
    let t = mint_to(&a.public_key(), 1)
        .transfer(&a, b.public_key(), [5; 32])
        .unwrap();
    let expected = include_str!("vectors/token_v1.hex").trim();
    assert_eq!(hex::encode(t.encode()), expected, "token encoding changed");
    let req = PaymentRequest {
        amount_cents: 1250,
        payee: b.public_key(),
        handshake: [5; 32],
        max_hops: 64,
    };
    let expected = include_str!("vectors/request_v1.hex").trim();
    assert_eq!(
        hex::encode(req.encode()),
        expected,
        "request encoding changed"
    );
}

#[test]
fn payment_roundtrip() {
    let (a, b) = (signer(1), signer(2));
    let tokens: Vec<_> = (0..3)
        .map(|i| {
            mint_to(&a.public_key(), i)
                .transfer(&a, b.public_key(), [5; 32])
                .unwrap()
        })
        .collect();
    let p = Payment {
        payee: b.public_key(),
        handshake: [5; 32],
        tokens,
    };
    assert_eq!(Payment::decode(&p.encode()), Ok(p.clone()));
    assert_eq!(p.amount_cents(), 1500);
    let mut extra = p.encode();
    extra.push(1);
    assert!(Payment::decode(&extra).is_err());
}

/// Runs the authority side for `token` deposited by its penultimate holder.
fn deposit(record: &mut TokenRecord, token: &Token, depositor: &LocalSigner) -> Outcome {
    let auth = authority();
    let checked = authority_precheck(token, &auth.public_key(), &depositor.public_key(), 64)
        .and_then(|()| verify_chain(token, &mut rng()));
    settle(
        Some(record),
        token,
        checked,
        &depositor.public_key(),
        Reanchor {
            signer: &auth,
            nonce: [77; 64],
        },
        SettleMode::Reanchor,
    )
    .0
}

#[test]
fn redeem_mode_takes_the_token_out_of_circulation() {
    let auth = authority();
    let w: Vec<_> = (1..=3).map(signer).collect();
    let minted = mint_to(&w[0].public_key(), 1);
    let mut rec = TokenRecord::minted(&minted);
    let t = hop(minted, &w, 2)
        .transfer(&w[2], auth.public_key(), [4; 32])
        .unwrap();
    let checked = verify_chain(&t, &mut rng());
    let r = Reanchor {
        signer: &auth,
        nonce: [1; 64],
    };
    let (out, changed) = settle(
        Some(&mut rec),
        &t,
        checked,
        &w[2].public_key(),
        r,
        SettleMode::Redeem,
    );
    assert_eq!((out, changed), (Outcome::Redeemed, true));
    assert_eq!(rec.status, florin_token::registry::TokenStatus::Deposited);
    // Depositing it again is refused, and a fork of it is still caught.
    let r = Reanchor {
        signer: &auth,
        nonce: [1; 64],
    };
    let (again, _) = settle(
        Some(&mut rec),
        &t,
        Ok(()),
        &w[2].public_key(),
        r,
        SettleMode::Redeem,
    );
    assert!(matches!(again, Outcome::Refused(_)));
}

#[test]
fn clean_deposit_reanchors_and_keeps_history() {
    let auth = authority();
    let w: Vec<_> = (1..=3).map(signer).collect();
    let minted = mint_to(&w[0].public_key(), 1);
    let mut rec = TokenRecord::minted(&minted);
    let t = hop(minted, &w, 2)
        .transfer(&w[2], auth.public_key(), [4; 32])
        .unwrap();
    let Outcome::Reanchored(fresh) = deposit(&mut rec, &t, &w[2]) else {
        panic!()
    };
    assert_eq!(fresh.links.len(), 1);
    assert_eq!(fresh.holder(), Some(w[2].public_key()));
    // The re-anchored token carries the handshake of the depositor's signed link.
    assert_eq!(fresh.links[0].handshake, [4; 32]);
    assert_eq!(client_ok(&fresh, &w[2].public_key()), Ok(()));
    assert_eq!(rec.links.len(), t.links.len() + 1);
    assert_eq!(rec.epochs.len(), 2);
    // Retrying the same deposit returns the same token and changes nothing.
    let before = rec.clone();
    assert_eq!(
        deposit(&mut rec, &t, &w[2]),
        Outcome::Repeated(fresh.clone())
    );
    assert_eq!(rec, before);
    // The re-anchored token circulates and comes back cleanly again.
    let w2: Vec<_> = vec![w[2].clone(), signer(4), signer(5)];
    let t2 = hop(fresh.clone(), &w2, 8)
        .transfer(&w2[2], auth.public_key(), [9; 32])
        .unwrap();
    assert!(matches!(
        deposit(&mut rec, &t2, &w2[2]),
        Outcome::Reanchored(_)
    ));
    // Retrying the first deposit after the token moved on still answers with the one-link
    // token issued then.
    assert_eq!(
        deposit(&mut rec, &t, &w[2]),
        Outcome::Repeated(fresh.clone())
    );
    assert_eq!(TokenRecord::decode(&rec.encode()), Ok(rec.clone()));
}

#[test]
fn deposit_structure_is_checked() {
    let auth = authority();
    let (a, b) = (signer(1), signer(2));
    let minted = mint_to(&a.public_key(), 1);
    let mut rec = TokenRecord::minted(&minted);
    // Only two links: never spent offline.
    let direct = minted.transfer(&a, auth.public_key(), [0; 32]).unwrap();
    assert!(matches!(
        deposit(&mut rec, &direct, &a),
        Outcome::Refused(_)
    ));
    // Not addressed to the authority.
    let to_b = minted.transfer(&a, b.public_key(), [0; 32]).unwrap();
    let to_a = to_b.transfer(&b, a.public_key(), [0; 32]).unwrap();
    assert!(matches!(deposit(&mut rec, &to_a, &b), Outcome::Refused(_)));
    // Depositor is not the sender.
    let ok = to_b.transfer(&b, auth.public_key(), [0; 32]).unwrap();
    assert!(matches!(deposit(&mut rec, &ok, &a), Outcome::Refused(_)));
    // A forged link.
    let mut forged = ok.clone();
    forged.links[1].proof.0[0] ^= 1;
    assert!(matches!(
        deposit(&mut rec, &forged, &b),
        Outcome::Refused(_)
    ));
    assert_eq!(rec, TokenRecord::minted(&minted));
}

/// Builds two copies of a token that `culprit_at` paid twice; the rest of each branch is
/// honest hops to fresh wallets, ending at the authority.
fn double_spend(
    prefix_len: usize,
    tail_a: usize,
    tail_b: usize,
) -> (Token, Token, Token, PublicKey, LocalSigner, LocalSigner) {
    let auth = authority();
    let common: Vec<_> = (1..=prefix_len as u8).map(signer).collect();
    let minted = mint_to(&common[0].public_key(), 1);
    let at_culprit = hop(minted.clone(), &common, 1);
    let culprit = common.last().unwrap().clone();
    let mut a_chain = vec![culprit.clone()];
    a_chain.extend((0..=tail_a as u8).map(|i| signer(100 + i)));
    let mut b_chain = vec![culprit.clone()];
    b_chain.extend((0..=tail_b as u8).map(|i| signer(150 + i)));
    let a = hop(at_culprit.clone(), &a_chain, 2);
    let b = hop(at_culprit, &b_chain, 3);
    let a_last = a_chain.last().unwrap().clone();
    let b_last = b_chain.last().unwrap().clone();
    let a = a.transfer(&a_last, auth.public_key(), [4; 32]).unwrap();
    let b = b.transfer(&b_last, auth.public_key(), [4; 32]).unwrap();
    (minted, a, b, culprit.public_key(), a_last, b_last)
}

#[test]
fn double_spend_names_the_payer_whichever_copy_arrives_first() {
    for first_a in [true, false] {
        let (minted, a, b, culprit, a_dep, b_dep) = double_spend(3, 2, 1);
        let mut rec = TokenRecord::minted(&minted);
        let (first, second, d1, d2) = if first_a {
            (&a, &b, &a_dep, &b_dep)
        } else {
            (&b, &a, &b_dep, &a_dep)
        };
        assert!(matches!(
            deposit(&mut rec, first, d1),
            Outcome::Reanchored(_)
        ));
        let Outcome::DoubleSpend(proof) = deposit(&mut rec, second, d2) else {
            panic!()
        };
        assert_eq!(proof.verify(Some(&authority().public_key())), Ok(culprit));
        // The proof concerns both copies, and not another token.
        assert!(proof.concerns(first) && proof.concerns(second));
        let other = mint_to(&signer(1).public_key(), 99);
        assert!(!proof.concerns(&other));
        assert_eq!(FraudProof::decode(&proof.encode()), Ok((*proof).clone()));
        // Tampering with any byte of the proof's links invalidates it or changes nothing.
        let bytes = proof.encode();
        for i in (108..bytes.len()).step_by(17) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            if let Ok(p) = FraudProof::decode(&bad) {
                assert_ne!(p.verify(None), Ok(culprit), "flip at {i} still blames");
            }
        }
        // Wrong authority pinned.
        assert!(proof.verify(Some(&signer(1).public_key())).is_err());
    }
}

#[test]
fn deposit_then_spend_again_is_caught() {
    // The holder deposits and also pays someone offline with the same token.
    let auth = authority();
    let (a, b, c) = (signer(1), signer(2), signer(3));
    let minted = mint_to(&a.public_key(), 1);
    let mut rec = TokenRecord::minted(&minted);
    let at_b = minted.transfer(&a, b.public_key(), [1; 32]).unwrap();
    let deposited = at_b.transfer(&b, auth.public_key(), [2; 32]).unwrap();
    assert!(matches!(
        deposit(&mut rec, &deposited, &b),
        Outcome::Reanchored(_)
    ));
    let to_c = at_b.transfer(&b, c.public_key(), [3; 32]).unwrap();
    let back = to_c.transfer(&c, auth.public_key(), [4; 32]).unwrap();
    let Outcome::DoubleSpend(proof) = deposit(&mut rec, &back, &c) else {
        panic!()
    };
    assert_eq!(proof.verify(None), Ok(b.public_key()));
}

#[test]
fn unknown_anchor_is_refused() {
    let (a, b) = (signer(1), signer(2));
    let minted = mint_to(&a.public_key(), 1);
    let rec = TokenRecord::minted(&minted);
    let other = Token::mint(
        &authority(),
        [1; 8],
        Denomination::E5,
        [8; 64],
        a.public_key(),
        [1; 32],
    )
    .unwrap();
    let t = other.transfer(&a, b.public_key(), [0; 32]).unwrap();
    assert_eq!(rec.reconcile(&t), Reconcile::UnknownAnchor);
}

#[test]
fn batched_chain_check_names_the_bad_token() {
    let w: Vec<_> = (1..=3).map(signer).collect();
    let mut tokens: Vec<_> = (0..10)
        .map(|i| hop(mint_to(&w[0].public_key(), i), &w, i))
        .collect();
    tokens[6].links[2].handshake[0] ^= 1;
    let refs: Vec<&Token> = tokens.iter().collect();
    let res = verify_chains(&refs, &mut rng());
    for (i, r) in res.iter().enumerate() {
        if i == 6 {
            assert!(matches!(r, Err(TokenError::BadProof { link: 2, .. })));
        } else {
            assert_eq!(r, &Ok(()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any chain of honest transfers verifies.
    #[test]
    fn any_honest_chain_verifies(n in 1usize..12, salt in any::<u8>()) {
        let w: Vec<_> = (0..n as u8).map(|i| signer(i.wrapping_add(salt) | 1)).collect();
        let t = hop(mint_to(&w[0].public_key(), salt), &w, salt);
        prop_assert_eq!(client_ok(&t, &w[n - 1].public_key()), Ok(()));
        prop_assert_eq!(Token::decode(&t.encode()), Ok(t));
    }

    /// Any fork yields a fraud proof naming exactly the forking key, in either order.
    #[test]
    fn any_fork_names_the_forking_key(prefix in 1usize..6, ta in 0usize..4, tb in 0usize..4, a_first in any::<bool>()) {
        let (minted, a, b, culprit, a_dep, b_dep) = double_spend(prefix, ta, tb);
        let mut rec = TokenRecord::minted(&minted);
        let (f, s, d1, d2) = if a_first { (&a, &b, &a_dep, &b_dep) } else { (&b, &a, &b_dep, &a_dep) };
        prop_assert!(matches!(deposit(&mut rec, f, d1), Outcome::Reanchored(_)));
        match deposit(&mut rec, s, d2) {
            Outcome::DoubleSpend(p) => prop_assert_eq!(p.verify(None), Ok(culprit)),
            other => prop_assert!(false, "expected a double spend, got {:?}", other),
        }
    }

    /// Any byte flip in a token is rejected by decoding or client verification.
    #[test]
    fn any_byte_flip_is_rejected(pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let w: Vec<_> = (1..=3).map(signer).collect();
        let t = hop(mint_to(&w[0].public_key(), 4), &w, 2);
        let mut bytes = t.encode();
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        match Token::decode(&bytes) {
            Err(_) => {}
            Ok(flipped) => prop_assert!(client_ok(&flipped, &w[2].public_key()).is_err()),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Decoders never panic on arbitrary bytes, and what decodes re-encodes identically
    /// (the stable-Rust companion of the cargo-fuzz targets in `fuzz/`).
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), lead in 0u8..3) {
        let mut b = bytes;
        if !b.is_empty() { b[0] = lead.max(1); }
        if let Ok(t) = Token::decode(&b) { prop_assert_eq!(t.encode(), b.clone()); }
        if let Ok(p) = Payment::decode(&b) { prop_assert_eq!(p.encode(), b.clone()); }
        if let Ok(r) = PaymentRequest::decode(&b) { prop_assert_eq!(r.encode(), b.clone()); }
        if let Ok(f) = FraudProof::decode(&b) { prop_assert_eq!(f.encode(), b.clone()); let _ = f.verify(None); }
        let _ = florin_token::registry::TokenRecord::decode(&b);
    }
}

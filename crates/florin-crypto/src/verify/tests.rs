//! Crafted signatures: the single and batch paths must agree on every one of them.

use super::*;
use crate::keys::SecretKey;
use curve25519_dalek::constants::EIGHT_TORSION;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn rng() -> StdRng {
    StdRng::seed_from_u64(42)
}

fn both(key: &PublicKey, msg: &[u8], sig: &Signature) -> (Result<(), SignatureError>, bool) {
    let single = verify(key, msg, sig);
    // Surround the signature with valid ones so the batch is a real batch.
    let mut b = BatchVerifier::new();
    let honest: Vec<_> = (0..5u8)
        .map(|i| SecretKey::from_seed(&[i + 100; 32]))
        .collect();
    for (i, sk) in honest.iter().enumerate() {
        b.queue(&sk.public_key(), &[i as u8], &sk.sign(&[i as u8]));
    }
    b.queue(key, msg, sig);
    let batch = match b.verify(&mut rng()) {
        Ok(()) => true,
        Err(e) => {
            // Only the crafted one (position 5) may be blamed, with the same reason.
            assert_eq!(
                e.invalid,
                vec![(5, single.expect_err("batch failed but single passed"))]
            );
            false
        }
    };
    (single, batch)
}

fn agree(key: &PublicKey, msg: &[u8], sig: &Signature) -> Result<(), SignatureError> {
    let (single, batch) = both(key, msg, sig);
    assert_eq!(single.is_ok(), batch, "single and batch disagree");
    single
}

/// Signs with an explicit secret scalar and an explicit R (possibly with torsion).
fn craft(
    a: &Scalar,
    a_point: &EdwardsPoint,
    r: &Scalar,
    torsion: &EdwardsPoint,
    msg: &[u8],
) -> (PublicKey, Signature) {
    let big_r = ED25519_BASEPOINT_POINT * r + torsion;
    let r_bytes = big_r.compress().to_bytes();
    let a_bytes = a_point.compress().to_bytes();
    let k = challenge(&r_bytes, &a_bytes, msg);
    let s = r + k * a;
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(&r_bytes);
    sig[32..].copy_from_slice(s.as_bytes());
    (PublicKey(a_bytes), Signature(sig))
}

#[test]
fn honest_signatures_verify_and_match_dalek() {
    for i in 0..20u8 {
        let sk = SecretKey::from_seed(&[i; 32]);
        let msg = vec![i; i as usize];
        let sig = sk.sign(&msg);
        assert_eq!(agree(&sk.public_key(), &msg, &sig), Ok(()));
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&sk.public_key().0).unwrap();
        assert!(vk
            .verify_strict(&msg, &ed25519_dalek::Signature::from_bytes(&sig.0))
            .is_ok());
    }
}

#[test]
fn wrong_message_key_or_signature_fails() {
    let sk = SecretKey::from_seed(&[1; 32]);
    let other = SecretKey::from_seed(&[2; 32]);
    let sig = sk.sign(b"pay 5");
    assert_eq!(
        agree(&sk.public_key(), b"pay 6", &sig),
        Err(SignatureError::Equation)
    );
    assert_eq!(
        agree(&other.public_key(), b"pay 5", &sig),
        Err(SignatureError::Equation)
    );
    let mut flipped = sig;
    flipped.0[40] ^= 1;
    assert!(agree(&sk.public_key(), b"pay 5", &flipped).is_err());
}

#[test]
fn non_canonical_s_is_rejected() {
    let sk = SecretKey::from_seed(&[3; 32]);
    let mut sig = sk.sign(b"m");
    // s + ℓ: the same point equation, a different byte string (malleability).
    // ℓ = 2^252 + 27742317777372353535851937790883648493, little-endian.
    let l: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];
    let mut carry = 0u16;
    for (byte, lb) in sig.0[32..].iter_mut().zip(l) {
        let v = *byte as u16 + lb as u16 + carry;
        *byte = v as u8;
        carry = v >> 8;
    }
    assert_eq!(carry, 0);
    assert_eq!(
        agree(&sk.public_key(), b"m", &sig),
        Err(SignatureError::NonCanonicalS)
    );
}

#[test]
fn small_order_key_is_rejected_although_its_equation_holds() {
    // A = identity: with R = [r]B and s = r, [8]([s]B − R − [k]A) = 0 for every message.
    let mut a_bytes = [0u8; 32];
    a_bytes[0] = 1;
    let r = Scalar::from(12345u64);
    let r_bytes = (ED25519_BASEPOINT_POINT * r).compress().to_bytes();
    let mut sig = [0u8; 64];
    sig[..32].copy_from_slice(&r_bytes);
    sig[32..].copy_from_slice(r.as_bytes());
    assert_eq!(
        agree(&PublicKey(a_bytes), b"anything", &Signature(sig)),
        Err(SignatureError::SmallOrderKey)
    );
    // Every eight-torsion point as a key.
    for t in EIGHT_TORSION.iter() {
        let key = PublicKey(t.compress().to_bytes());
        assert!(matches!(
            agree(&key, b"x", &Signature(sig)),
            Err(SignatureError::SmallOrderKey | SignatureError::NonCanonicalKey)
        ));
    }
}

#[test]
fn small_order_r_is_rejected() {
    let sk = SecretKey::from_seed(&[4; 32]);
    for t in EIGHT_TORSION.iter() {
        let mut sig = sk.sign(b"m");
        sig.0[..32].copy_from_slice(&t.compress().to_bytes());
        assert_eq!(
            agree(&sk.public_key(), b"m", &sig),
            Err(SignatureError::SmallOrderR)
        );
    }
}

#[test]
fn non_canonical_encodings_are_rejected() {
    // y = p + 1 (≡ 1): a non-canonical encoding of the identity.
    let mut y = [0xffu8; 32];
    y[0] = 0xee;
    y[31] = 0x7f;
    let sk = SecretKey::from_seed(&[5; 32]);
    let mut sig = sk.sign(b"m");
    sig.0[..32].copy_from_slice(&y);
    assert_eq!(
        agree(&sk.public_key(), b"m", &sig),
        Err(SignatureError::NonCanonicalR)
    );
    let good = sk.sign(b"m");
    assert_eq!(
        agree(&PublicKey(y), b"m", &good),
        Err(SignatureError::NonCanonicalKey)
    );
    // The same with the sign bit set.
    y[31] |= 0x80;
    sig.0[..32].copy_from_slice(&y);
    assert_eq!(
        agree(&sk.public_key(), b"m", &sig),
        Err(SignatureError::NonCanonicalR)
    );
}

#[test]
fn not_on_curve_is_rejected() {
    // y = 2 is not the y coordinate of any point on edwards25519.
    let mut y = [0u8; 32];
    y[0] = 2;
    let sk = SecretKey::from_seed(&[6; 32]);
    let mut sig = sk.sign(b"m");
    sig.0[..32].copy_from_slice(&y);
    assert_eq!(
        agree(&sk.public_key(), b"m", &sig),
        Err(SignatureError::InvalidR)
    );
    assert_eq!(
        agree(&PublicKey(y), b"m", &sk.sign(b"m")),
        Err(SignatureError::InvalidKey)
    );
}

#[test]
fn mixed_order_r_is_accepted_by_both_paths() {
    // A signer can add a torsion point to R. Cofactorless single verification rejects that
    // while a cofactorless batch accepts it with probability 1/8: the disagreement this crate
    // exists to avoid. Under the cofactored rule both paths accept, every time.
    let a = Scalar::from(987654321u64);
    let a_point = ED25519_BASEPOINT_POINT * a;
    for (i, t) in EIGHT_TORSION.iter().enumerate().skip(1) {
        let msg = [i as u8; 7];
        let (key, sig) = craft(&a, &a_point, &Scalar::from(55u64 + i as u64), t, &msg);
        assert_eq!(agree(&key, &msg, &sig), Ok(()));
        for seed in 0..16 {
            let mut b = BatchVerifier::new();
            b.queue(&key, &msg, &sig);
            assert!(b.verify(&mut StdRng::seed_from_u64(seed)).is_ok());
        }
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&key.0).unwrap();
        let dsig = ed25519_dalek::Signature::from_bytes(&sig.0);
        assert!(
            vk.verify_strict(&msg, &dsig).is_err(),
            "dalek's cofactorless rule differs here"
        );
    }
}

#[test]
fn mixed_order_key_is_treated_alike() {
    let a = Scalar::from(1234567u64);
    let a_point = ED25519_BASEPOINT_POINT * a + EIGHT_TORSION[3];
    for i in 0..8u8 {
        let msg = [i; 3];
        let (key, sig) = craft(
            &a,
            &a_point,
            &Scalar::from(77u64 + i as u64),
            &EIGHT_TORSION[0],
            &msg,
        );
        // Accepted by the cofactored rule whatever k is; both paths agree.
        assert_eq!(agree(&key, &msg, &sig), Ok(()));
    }
}

#[test]
fn batch_names_every_bad_signature() {
    let keys: Vec<_> = (0..40u8).map(|i| SecretKey::from_seed(&[i; 32])).collect();
    let mut b = BatchVerifier::new();
    let shared = SecretKey::from_seed(&[200; 32]);
    for (i, sk) in keys.iter().enumerate() {
        let msg = [i as u8; 4];
        let mut sig = sk.sign(&msg);
        if i % 13 == 5 {
            sig.0[3] ^= 0x10;
        }
        b.queue(&sk.public_key(), &msg, &sig);
        // A key shared by many signatures is coalesced into one point.
        b.queue(&shared.public_key(), &msg, &shared.sign(&msg));
    }
    let err = b.verify(&mut rng()).unwrap_err();
    let positions: Vec<usize> = err.invalid.iter().map(|x| x.0).collect();
    assert_eq!(positions, vec![10, 36, 62]);
}

#[test]
fn empty_batch_is_ok() {
    assert!(BatchVerifier::new().verify(&mut rng()).is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Whatever bytes are corrupted, the batch verdict for each signature equals the single one.
    #[test]
    fn batch_agrees_with_single(flips in proptest::collection::vec((0usize..8, 0usize..96, 0u8..8), 0..6)) {
        let keys: Vec<_> = (0..8u8).map(|i| SecretKey::from_seed(&[i + 1; 32])).collect();
        let mut items: Vec<(PublicKey, Vec<u8>, Signature)> = keys
            .iter()
            .enumerate()
            .map(|(i, sk)| (sk.public_key(), vec![i as u8; 9], sk.sign(&[i as u8; 9])))
            .collect();
        for (which, byte, bit) in flips {
            let it = &mut items[which];
            if byte < 32 { it.0 .0[byte] ^= 1 << bit } else { it.2 .0[byte - 32] ^= 1 << bit }
        }
        let mut b = BatchVerifier::new();
        for (k, m, s) in &items { b.queue(k, m, s); }
        let expected: Vec<(usize, SignatureError)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, (k, m, s))| verify(k, m, s).err().map(|e| (i, e)))
            .collect();
        match b.verify(&mut rng()) {
            Ok(()) => prop_assert!(expected.is_empty()),
            Err(e) => prop_assert_eq!(e.invalid, expected),
        }
    }
}

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::*;

/// The P-256 group order n, big-endian.
const N: [u8; 32] = hex32("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");

const fn hex32(s: &str) -> [u8; 32] {
    let b = s.as_bytes();
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = (nibble(b[2 * i]) << 4) | nibble(b[2 * i + 1]);
        i += 1;
    }
    out
}

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        _ => c - b'a' + 10,
    }
}

/// `a − b` on 32-byte big-endian integers (a ≥ b).
fn sub(a: &[u8; 32], b: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let mut d = a[i] as i16 - b[i] as i16 - borrow;
        borrow = (d < 0) as i16;
        if d < 0 {
            d += 256;
        }
        out[i] = d as u8;
    }
    out
}

/// The other signature satisfying the equation: `(r, n − s)`.
fn twin(sig: &P256Signature) -> P256Signature {
    let mut out = sig.0;
    out[32..].copy_from_slice(&sub(&N, &sig.0[32..]));
    P256Signature(out)
}

fn key(seed: u64) -> P256SecretKey {
    P256SecretKey::generate(&mut StdRng::seed_from_u64(seed))
}

#[test]
fn sign_verify_roundtrip() {
    let sk = key(1);
    let pk = sk.public_key();
    assert!(matches!(pk.0[0], 0x02 | 0x03));
    let sig = sk.sign(b"message").unwrap();
    assert_eq!(verify(&pk, b"message", &sig), Ok(()));
    assert_eq!(verify(&pk, b"messagf", &sig), Err(P256Error::Equation));
    assert_eq!(
        verify(&key(2).public_key(), b"message", &sig),
        Err(P256Error::Equation)
    );
    // The trait signs the same way.
    let via_trait = P256Signer::sign(&sk, b"message").unwrap();
    assert_eq!(via_trait, sig);
    assert_eq!(P256Signer::public_key(&sk), pk);
}

#[test]
fn signatures_are_always_low_s_and_the_high_twin_is_refused() {
    let sk = key(3);
    let pk = sk.public_key();
    for i in 0u32..64 {
        let msg = i.to_le_bytes();
        let sig = sk.sign(&msg).unwrap();
        assert_eq!(verify(&pk, &msg, &sig), Ok(()), "message {i}");
        assert_eq!(verify(&pk, &msg, &twin(&sig)), Err(P256Error::HighS));
    }
}

/// RFC 6979 A.2.5, P-256 with SHA-256, message "sample": the RFC's s is high, so the signer
/// returns its low twin and the verifier refuses the RFC's own form.
#[test]
fn rfc6979_vector() {
    let sk = P256SecretKey::from_bytes(&hex32(
        "c9afa9d845ba75166b5c215767b1d6934e50c3db36e89b127b8a622b120f6721",
    ))
    .unwrap();
    let pk = sk.public_key();
    assert_eq!(
        hex::encode(pk.0),
        "0360fed4ba255a9d31c961eb74c6356d68c049b8923b61fa6ce669622e60f29fb6"
    );
    let r = hex32("efd48b2aacb6a8fd1140dd9cd45e81d69d2c877b56aaf991c34d0ea84eaf3716");
    let s = hex32("f7cb1c942d657c41d436c7a1b6e29f65f3e900dbb9aff4064dc4ab2f843acda8");
    let mut rfc = [0u8; 64];
    rfc[..32].copy_from_slice(&r);
    rfc[32..].copy_from_slice(&s);
    let rfc = P256Signature(rfc);
    let ours = sk.sign(b"sample").unwrap();
    assert_eq!(ours, twin(&rfc));
    assert_eq!(verify(&pk, b"sample", &ours), Ok(()));
    assert_eq!(verify(&pk, b"sample", &rfc), Err(P256Error::HighS));
}

#[test]
fn scalars_out_of_range_are_refused() {
    let sk = key(4);
    let pk = sk.public_key();
    let sig = sk.sign(b"m").unwrap();
    let with = |r: Option<[u8; 32]>, s: Option<[u8; 32]>| {
        let mut b = sig.0;
        if let Some(r) = r {
            b[..32].copy_from_slice(&r);
        }
        if let Some(s) = s {
            b[32..].copy_from_slice(&s);
        }
        verify(&pk, b"m", &P256Signature(b))
    };
    assert_eq!(with(Some([0; 32]), None), Err(P256Error::InvalidR));
    assert_eq!(with(Some(N), None), Err(P256Error::InvalidR));
    assert_eq!(with(Some([0xff; 32]), None), Err(P256Error::InvalidR));
    assert_eq!(with(None, Some([0; 32])), Err(P256Error::InvalidS));
    assert_eq!(with(None, Some(N)), Err(P256Error::InvalidS));
    assert_eq!(with(None, Some([0xff; 32])), Err(P256Error::InvalidS));
    // n − 1 is in range but high.
    let mut one = [0u8; 32];
    one[31] = 1;
    assert_eq!(with(None, Some(sub(&N, &one))), Err(P256Error::HighS));
}

#[test]
fn keys_must_be_canonical_compressed_points() {
    let sk = key(5);
    let pk = sk.public_key();
    let sig = sk.sign(b"m").unwrap();
    // Same x under another tag: the compact form (0x05) names the same point but is refused.
    for tag in [0x00, 0x01, 0x04, 0x05, 0x06, 0xff] {
        let mut k = pk;
        k.0[0] = tag;
        assert_eq!(verify(&k, b"m", &sig), Err(P256Error::NonCanonicalKey));
    }
    // The other y parity is a valid point, but another key.
    let mut flipped = pk;
    flipped.0[0] ^= 0x01;
    assert_eq!(verify(&flipped, b"m", &sig), Err(P256Error::Equation));
    // x ≥ p.
    let mut big = [0xffu8; 33];
    big[0] = 0x02;
    assert_eq!(
        verify(&P256PublicKey(big), b"m", &sig),
        Err(P256Error::InvalidKey)
    );
    // About half of all x are not on the curve.
    let off_curve = (1u8..=255)
        .map(|x| {
            let mut k = [0u8; 33];
            k[0] = 0x02;
            k[32] = x;
            P256PublicKey(k)
        })
        .find(|k| verify(k, b"m", &sig) == Err(P256Error::InvalidKey));
    assert!(off_curve.is_some());
    assert_eq!(
        P256PublicKey::from_sec1(&off_curve.unwrap().0),
        Err(P256Error::InvalidKey)
    );
}

#[test]
fn from_sec1_normalizes_to_compressed() {
    let sk = key(6);
    let pk = sk.public_key();
    assert_eq!(P256PublicKey::from_sec1(&pk.0), Ok(pk));
    let uncompressed = sk.0.verifying_key().to_encoded_point(false);
    assert_eq!(uncompressed.as_bytes().len(), 65);
    assert_eq!(P256PublicKey::from_sec1(uncompressed.as_bytes()), Ok(pk));
    assert_eq!(
        P256PublicKey::from_sec1(&pk.0[..32]),
        Err(P256Error::NonCanonicalKey)
    );
    assert_eq!(
        P256PublicKey::from_sec1(&[]),
        Err(P256Error::NonCanonicalKey)
    );
    let mut compact = pk.0;
    compact[0] = 0x05;
    assert_eq!(
        P256PublicKey::from_sec1(&compact),
        Err(P256Error::NonCanonicalKey)
    );
}

#[test]
fn secret_keys_out_of_range_are_refused() {
    assert_eq!(
        P256SecretKey::from_bytes(&[0; 32]).map(|_| ()),
        Err(P256Error::InvalidSecretKey)
    );
    assert_eq!(
        P256SecretKey::from_bytes(&N).map(|_| ()),
        Err(P256Error::InvalidSecretKey)
    );
}

#[test]
fn debug_redacts_secret() {
    let bytes = [7u8; 32];
    let sk = P256SecretKey::from_bytes(&bytes).unwrap();
    let shown = format!("{sk:?}");
    assert!(shown.contains("redacted"));
    assert!(!shown.contains(&hex::encode(bytes)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes never panic and (but for a 2⁻¹²⁸-ish fluke) never verify.
    #[test]
    fn arbitrary_bytes_never_panic(
        key in proptest::collection::vec(any::<u8>(), 33),
        sig in proptest::collection::vec(any::<u8>(), 64),
        tag in 0u8..6,
        msg in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut k = [0u8; 33];
        k.copy_from_slice(&key);
        k[0] = tag;
        let mut s = [0u8; 64];
        s.copy_from_slice(&sig);
        prop_assert!(verify(&P256PublicKey(k), &msg, &P256Signature(s)).is_err());
        let _ = P256PublicKey::from_sec1(&key);
        let _ = P256PublicKey::from_sec1(&sig);
    }

    /// Any change to a valid signature's bytes is refused.
    #[test]
    fn any_bit_flip_is_refused(byte in 0usize..64, bit in 0u8..8) {
        let sk = key(7);
        let sig = sk.sign(b"txid").unwrap();
        let mut bad = sig;
        bad.0[byte] ^= 1 << bit;
        prop_assert!(verify(&sk.public_key(), b"txid", &bad).is_err());
    }
}

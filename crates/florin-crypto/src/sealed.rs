//! Sealed boxes: encryption to an Ed25519 public key, for the payment handoff (Hamilton 3.7:
//! the payer leaves the payee the preimages of the payee's new outputs), reserve-bridge
//! handoffs and custody share envelopes.
//!
//! # Construction (version 2, the only one sealed)
//! HPKE (RFC 9180) in base mode with the suite
//! DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / ChaCha20-Poly1305 (KEM `0x0020`, KDF `0x0001`,
//! AEAD `0x0003`), from the `hpke` crate. The recipient's HPKE key is its Ed25519 key mapped
//! to X25519: the public key is the Montgomery form of the Ed25519 point (small-order keys
//! are refused), the private key is the lower half of SHA-512 of the Ed25519 seed (the
//! Ed25519 secret scalar before reduction, which X25519 clamps) — the usual Ed25519 → X25519
//! conversion, so `pkR = X25519(skR, 9)`.
//!
//! * `info` = `"florin/sealed/v2"` ([`INFO`]): binds the key schedule to this purpose.
//! * `aad` = the version byte, `[0x02]`.
//! * Format: `0x02 ‖ enc (32, the sender's ephemeral X25519 key) ‖ ciphertext ‖ tag (16)`,
//!   49 bytes of overhead. One message per encapsulation (single-shot seal, sequence 0).
//!
//! Anyone can seal; only the holder of the recipient's secret key can open, and any change to
//! the bytes makes opening fail.
//!
//! # Legacy boxes (version 1): read, never written
//! Before HPKE, boxes were `0x01 ‖ ephemeral X25519 key (32) ‖ ChaCha20-Poly1305(key, nonce 0,
//! aad = [0x01])` with `key = SHA-256` (domain `"florin/sealed/v1"`) of the shared secret, the
//! ephemeral key and the recipient's key. Such boxes may still sit in mailboxes, custody
//! envelopes in flight and pending wallet handoffs, so [`open`] still opens them; [`seal`]
//! never makes one. Any other leading byte is refused with [`SealError::UnknownVersion`].

use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, HpkeError, OpModeR, OpModeS};
use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::keys::{PublicKey, SecretKey};

/// The leading byte of a box sealed with HPKE (the current format).
pub const VERSION_HPKE: u8 = 2;
/// The leading byte of a legacy box (opened, never sealed).
pub const VERSION_LEGACY: u8 = 1;
/// The HPKE `info` string of version-2 boxes.
pub const INFO: &[u8] = b"florin/sealed/v2";

type Kem = X25519HkdfSha256;
type Kdf = hpke::kdf::HkdfSha256;
type Aead = hpke::aead::ChaCha20Poly1305;

/// Length of the encapsulated key (an X25519 public key).
const ENC_LEN: usize = 32;
/// Length of the AEAD tag.
const TAG_LEN: usize = 16;
/// Bytes a box adds to its plaintext: version, encapsulated key, tag.
pub const OVERHEAD: usize = 1 + ENC_LEN + TAG_LEN;

/// Why a sealed box could not be made or opened.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealError {
    /// The recipient key is not a usable curve point.
    #[error("recipient key is not a valid point")]
    BadRecipient,
    /// Wrong key or tampered.
    #[error("cannot open: not for this key, or tampered")]
    Open,
    /// Too short to be a sealed box of its version.
    #[error("cannot open: too short to be a sealed box")]
    Truncated,
    /// A leading version byte this code does not know (neither 1, legacy, nor 2, HPKE).
    #[error("cannot open: unknown sealed-box version {0}")]
    UnknownVersion(u8),
}

fn montgomery(key: &PublicKey) -> Result<curve25519_dalek::MontgomeryPoint, SealError> {
    let p = curve25519_dalek::edwards::CompressedEdwardsY(key.0)
        .decompress()
        .ok_or(SealError::BadRecipient)?;
    if p.is_small_order() {
        return Err(SealError::BadRecipient);
    }
    Ok(p.to_montgomery())
}

/// Encrypts `plaintext` to `recipient` (version 2, HPKE).
pub fn seal<R: RngCore + CryptoRng>(
    recipient: &PublicKey,
    plaintext: &[u8],
    rng: &mut R,
) -> Result<Vec<u8>, SealError> {
    let rm = montgomery(recipient)?;
    let pk = <Kem as hpke::Kem>::PublicKey::from_bytes(rm.as_bytes())
        .map_err(|_| SealError::BadRecipient)?;
    let (enc, ct) = hpke::single_shot_seal::<Aead, Kdf, Kem, R>(
        &OpModeS::Base,
        &pk,
        INFO,
        plaintext,
        &[VERSION_HPKE],
        rng,
    )
    .map_err(|e| match e {
        // An all-zero shared secret: only a small-order key does that, refused above.
        HpkeError::EncapError => SealError::BadRecipient,
        // The AEAD refused the plaintext (past ChaCha20-Poly1305's 256 GiB limit).
        _ => SealError::Open,
    })?;
    let mut out = Vec::with_capacity(1 + ENC_LEN + ct.len());
    out.push(VERSION_HPKE);
    out.extend_from_slice(&hpke::Serializable::to_bytes(&enc));
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypts a sealed box with the recipient's secret key: a version-2 (HPKE) box, or a legacy
/// version-1 box.
pub fn open(secret: &SecretKey, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    match sealed.first() {
        None => Err(SealError::Truncated),
        Some(&VERSION_HPKE) => {
            if sealed.len() < OVERHEAD {
                return Err(SealError::Truncated);
            }
            let (enc, ct) = sealed[1..].split_at(ENC_LEN);
            hpke_open(&secret.x25519_secret(), enc, ct, INFO, &[VERSION_HPKE])
        }
        Some(&VERSION_LEGACY) => legacy::open(secret, sealed),
        Some(&v) => Err(SealError::UnknownVersion(v)),
    }
}

/// HPKE base-mode single-shot open with the suite above, from a raw X25519 private key.
fn hpke_open(
    sk: &[u8; 32],
    enc: &[u8],
    ct: &[u8],
    info: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, SealError> {
    let sk = <Kem as hpke::Kem>::PrivateKey::from_bytes(sk).map_err(|_| SealError::Open)?;
    let enc = <Kem as hpke::Kem>::EncappedKey::from_bytes(enc).map_err(|_| SealError::Open)?;
    hpke::single_shot_open::<Aead, Kdf, Kem>(&OpModeR::Base, &sk, &enc, info, ct, aad)
        .map_err(|_| SealError::Open)
}

/// The version-1 format: opened for boxes sealed before HPKE, never sealed outside tests.
mod legacy {
    use chacha20poly1305::aead::{Aead, KeyInit, Payload};
    use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
    use curve25519_dalek::montgomery::MontgomeryPoint;
    use zeroize::Zeroize;

    use super::{montgomery, SealError, VERSION_LEGACY};
    use crate::hash::Hasher;
    use crate::keys::SecretKey;

    pub(super) fn derive_key(
        shared: &MontgomeryPoint,
        eph: &MontgomeryPoint,
        recipient: &MontgomeryPoint,
    ) -> [u8; 32] {
        Hasher::new("florin/sealed/v1")
            .chain(shared.as_bytes())
            .chain(eph.as_bytes())
            .chain(recipient.as_bytes())
            .finalize()
    }

    pub(super) fn open(secret: &SecretKey, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < 1 + 32 + 16 {
            return Err(SealError::Truncated);
        }
        if sealed[0] != VERSION_LEGACY {
            return Err(SealError::UnknownVersion(sealed[0]));
        }
        let mut eb = [0u8; 32];
        eb.copy_from_slice(&sealed[1..33]);
        let epk = MontgomeryPoint(eb);
        let sk = secret.scalar();
        let rm = montgomery(&secret.public_key()).map_err(|_| SealError::Open)?;
        let shared = epk * sk;
        let mut key = derive_key(&shared, &epk, &rm);
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&key));
        key.zeroize();
        cipher
            .decrypt(
                Nonce::from_slice(&[0u8; 12]),
                Payload {
                    msg: &sealed[33..],
                    aad: &[VERSION_LEGACY],
                },
            )
            .map_err(|_| SealError::Open)
    }

    /// The old sealer, verbatim, kept only to make legacy boxes in tests.
    #[cfg(test)]
    pub(super) fn seal<R: rand::RngCore + rand::CryptoRng>(
        recipient: &crate::keys::PublicKey,
        plaintext: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, SealError> {
        use curve25519_dalek::scalar::Scalar;
        let rm = montgomery(recipient)?;
        let mut e = [0u8; 32];
        rng.fill_bytes(&mut e);
        let esk = Scalar::from_bytes_mod_order(e);
        e.zeroize();
        let epk = MontgomeryPoint::mul_base(&esk);
        let shared = rm * esk;
        let mut key = derive_key(&shared, &epk, &rm);
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&key));
        key.zeroize();
        let ct = cipher
            .encrypt(
                Nonce::from_slice(&[0u8; 12]),
                Payload {
                    msg: plaintext,
                    aad: &[VERSION_LEGACY],
                },
            )
            .map_err(|_| SealError::Open)?;
        let mut out = Vec::with_capacity(33 + ct.len());
        out.push(VERSION_LEGACY);
        out.extend_from_slice(epk.as_bytes());
        out.extend_from_slice(&ct);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hpke::Serializable;
    use rand::rngs::OsRng;

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn roundtrip_and_format() {
        let bob = SecretKey::generate(&mut OsRng);
        for msg in [&b""[..], b"utxo preimage", &[7u8; 5000]] {
            let boxed = seal(&bob.public_key(), msg, &mut OsRng).unwrap();
            assert_eq!(boxed[0], VERSION_HPKE);
            assert_eq!(boxed.len(), msg.len() + OVERHEAD);
            assert_eq!(open(&bob, &boxed).unwrap(), msg);
        }
        // Fresh ephemeral key each time.
        let a = seal(&bob.public_key(), b"x", &mut OsRng).unwrap();
        let b = seal(&bob.public_key(), b"x", &mut OsRng).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn wrong_key_refused() {
        let bob = SecretKey::generate(&mut OsRng);
        let eve = SecretKey::generate(&mut OsRng);
        let boxed = seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        assert_eq!(open(&eve, &boxed), Err(SealError::Open));
        let old = legacy::seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        assert_eq!(open(&eve, &old), Err(SealError::Open));
    }

    #[test]
    fn every_flipped_bit_refused() {
        let bob = SecretKey::generate(&mut OsRng);
        let boxed = seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        for i in 0..boxed.len() {
            for bit in 0..8 {
                let mut t = boxed.clone();
                t[i] ^= 1 << bit;
                assert!(open(&bob, &t).is_err(), "flip of bit {bit} at {i} opened");
            }
        }
        // A version-2 box relabelled as version 1 does not open either.
        let mut t = boxed.clone();
        t[0] = VERSION_LEGACY;
        assert_eq!(open(&bob, &t), Err(SealError::Open));
    }

    #[test]
    fn truncated_refused() {
        let bob = SecretKey::generate(&mut OsRng);
        let boxed = seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        assert_eq!(open(&bob, &[]), Err(SealError::Truncated));
        for n in 1..OVERHEAD {
            assert_eq!(open(&bob, &boxed[..n]), Err(SealError::Truncated), "{n}");
        }
        for n in OVERHEAD..boxed.len() {
            assert_eq!(open(&bob, &boxed[..n]), Err(SealError::Open), "{n}");
        }
        // Extended is refused too.
        let mut long = boxed.clone();
        long.push(0);
        assert_eq!(open(&bob, &long), Err(SealError::Open));
    }

    #[test]
    fn unknown_version_refused() {
        let bob = SecretKey::generate(&mut OsRng);
        let mut boxed = seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        for v in [0u8, 3, 0x80, 0xff] {
            boxed[0] = v;
            assert_eq!(open(&bob, &boxed), Err(SealError::UnknownVersion(v)));
        }
        assert_eq!(open(&bob, &[9]), Err(SealError::UnknownVersion(9)));
    }

    #[test]
    fn bad_recipient_refused() {
        let mut small = [0u8; 32];
        small[0] = 1; // the identity point
        assert_eq!(
            seal(&PublicKey(small), b"x", &mut OsRng),
            Err(SealError::BadRecipient)
        );
    }

    /// A box made by the version-1 code before HPKE replaced it (recipient: seed `[7; 32]`).
    const LEGACY_VECTOR: &str = "01769350838540e1fe98b40c0de9084b7c7380a5b813d6cf55415b2e4d19cf3738993fa9867f7a5233dba59d1f671851f8f69adca4e2c1f82a9fe1c89753f6fd3fc748bc8951309c0d54a57d4174";

    #[test]
    fn legacy_boxes_still_open() {
        let bob = SecretKey::from_seed(&[7u8; 32]);
        let old = unhex(LEGACY_VECTOR);
        assert_eq!(open(&bob, &old).unwrap(), b"florin legacy sealed box (v1)");
        let mut t = old.clone();
        let last = t.len() - 1;
        t[last] ^= 1;
        assert_eq!(open(&bob, &t), Err(SealError::Open));
        assert_eq!(open(&bob, &old[..48]), Err(SealError::Truncated));
        assert_eq!(
            open(&SecretKey::from_seed(&[8u8; 32]), &old),
            Err(SealError::Open)
        );

        let bob = SecretKey::generate(&mut OsRng);
        let boxed = legacy::seal(&bob.public_key(), b"pending handoff", &mut OsRng).unwrap();
        assert_eq!(boxed[0], VERSION_LEGACY);
        assert_eq!(open(&bob, &boxed).unwrap(), b"pending handoff");
    }

    /// The key mapping: the X25519 private key derived from the Ed25519 key gives, through
    /// X25519's base point, exactly the Montgomery form of the Ed25519 public key.
    #[test]
    fn key_mapping_matches() {
        for seed in [[0u8; 32], [7u8; 32], [0xffu8; 32]] {
            let sk = SecretKey::from_seed(&seed);
            let hsk = <Kem as hpke::Kem>::PrivateKey::from_bytes(&*sk.x25519_secret()).unwrap();
            let hpk = <Kem as hpke::Kem>::sk_to_pk(&hsk);
            let rm = montgomery(&sk.public_key()).unwrap();
            assert_eq!(hpk.to_bytes().as_slice(), rm.as_bytes());
        }
    }

    /// RFC 9180 Appendix A.2.1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20Poly1305,
    /// base mode, first encryption. The same open path as [`open`]'s version 2.
    #[test]
    fn rfc9180_known_answer() {
        let sk: [u8; 32] =
            unhex("8057991eef8f1f1af18f4a9491d16a1ce333f695d4db8e38da75975c4478e0fb")
                .try_into()
                .unwrap();
        let enc = unhex("1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a");
        let info = unhex("4f6465206f6e2061204772656369616e2055726e");
        let aad = unhex("436f756e742d30");
        let ct = unhex(
            "1c5250d8034ec2b784ba2cfd69dbdb8af406cfe3ff938e131f0def8c8b60b4db21993c62ce81883d2dd1b51a28",
        );
        let pt = unhex("4265617574792069732074727574682c20747275746820626561757479");
        assert_eq!(hpke_open(&sk, &enc, &ct, &info, &aad).unwrap(), pt);
        // pkRm from the RFC is X25519(skRm, 9).
        let hsk = <Kem as hpke::Kem>::PrivateKey::from_bytes(&sk).unwrap();
        assert_eq!(
            <Kem as hpke::Kem>::sk_to_pk(&hsk).to_bytes().as_slice(),
            unhex("4310ee97d88cc1f088a5576c77ab0cf5c3ac797f3d95139c6c84b5429c59662a")
        );
        let mut bad = ct.clone();
        bad[0] ^= 1;
        assert_eq!(
            hpke_open(&sk, &enc, &bad, &info, &aad),
            Err(SealError::Open)
        );
    }

    /// Interoperability with plain HPKE: a box made with the `hpke` crate directly (raw X25519
    /// key, `info` and `aad` as documented) opens with [`open`], and a box from [`seal`] opens
    /// with the `hpke` crate directly.
    #[test]
    fn interoperates_with_plain_hpke() {
        let bob = SecretKey::generate(&mut OsRng);
        let raw_sk = bob.x25519_secret();
        let hsk = <Kem as hpke::Kem>::PrivateKey::from_bytes(&*raw_sk).unwrap();
        let hpk = <Kem as hpke::Kem>::sk_to_pk(&hsk);

        let (enc, ct) = hpke::single_shot_seal::<Aead, Kdf, Kem, _>(
            &OpModeS::Base,
            &hpk,
            b"florin/sealed/v2",
            b"from elsewhere",
            &[2],
            &mut OsRng,
        )
        .unwrap();
        let mut boxed = vec![2u8];
        boxed.extend_from_slice(&enc.to_bytes());
        boxed.extend_from_slice(&ct);
        assert_eq!(open(&bob, &boxed).unwrap(), b"from elsewhere");

        let ours = seal(&bob.public_key(), b"to elsewhere", &mut OsRng).unwrap();
        let enc = <Kem as hpke::Kem>::EncappedKey::from_bytes(&ours[1..33]).unwrap();
        let pt = hpke::single_shot_open::<Aead, Kdf, Kem>(
            &OpModeR::Base,
            &hsk,
            &enc,
            b"florin/sealed/v2",
            &ours[33..],
            &[2],
        )
        .unwrap();
        assert_eq!(pt, b"to elsewhere");

        // A different info string (another purpose) does not open.
        let (enc, ct) = hpke::single_shot_seal::<Aead, Kdf, Kem, _>(
            &OpModeS::Base,
            &hpk,
            b"florin/other/v1",
            b"x",
            &[2],
            &mut OsRng,
        )
        .unwrap();
        let mut boxed = vec![2u8];
        boxed.extend_from_slice(&enc.to_bytes());
        boxed.extend_from_slice(&ct);
        assert_eq!(open(&bob, &boxed), Err(SealError::Open));
    }
}

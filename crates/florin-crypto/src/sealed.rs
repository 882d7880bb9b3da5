//! Sealed boxes: encryption to an Ed25519 public key, for the payment handoff (Hamilton 3.7:
//! the payer leaves the payee the preimages of the payee's new outputs).
//!
//! X25519 with an ephemeral key (the recipient's Ed25519 key mapped to its Montgomery form),
//! key = domain-separated SHA-256 of the shared secret and both public keys, then
//! ChaCha20-Poly1305. Format: `version ‖ ephemeral public key (32) ‖ ciphertext with tag`.
//! Anyone can seal; only the holder of the recipient's secret key can open, and any change to
//! the bytes makes opening fail.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use curve25519_dalek::edwards::CompressedEdwardsY;
use curve25519_dalek::montgomery::MontgomeryPoint;
use curve25519_dalek::scalar::Scalar;
use rand::{CryptoRng, RngCore};
use thiserror::Error;
use zeroize::Zeroize;

use crate::hash::Hasher;
use crate::keys::{PublicKey, SecretKey};

const SEALED_VERSION: u8 = 1;

/// Why a sealed box could not be made or opened.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealError {
    /// The recipient key is not a usable curve point.
    #[error("recipient key is not a valid point")]
    BadRecipient,
    /// Too short, unknown version, wrong key or tampered.
    #[error("cannot open: not for this key, or tampered")]
    Open,
}

fn derive_key(
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

fn montgomery(key: &PublicKey) -> Result<MontgomeryPoint, SealError> {
    let p = CompressedEdwardsY(key.0)
        .decompress()
        .ok_or(SealError::BadRecipient)?;
    if p.is_small_order() {
        return Err(SealError::BadRecipient);
    }
    Ok(p.to_montgomery())
}

/// Encrypts `plaintext` to `recipient`.
pub fn seal<R: RngCore + CryptoRng>(
    recipient: &PublicKey,
    plaintext: &[u8],
    rng: &mut R,
) -> Result<Vec<u8>, SealError> {
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
    // The key is fresh for every box, so a zero nonce is never reused under it.
    let ct = cipher
        .encrypt(
            Nonce::from_slice(&[0u8; 12]),
            Payload {
                msg: plaintext,
                aad: &[SEALED_VERSION],
            },
        )
        .map_err(|_| SealError::Open)?;
    let mut out = Vec::with_capacity(33 + ct.len());
    out.push(SEALED_VERSION);
    out.extend_from_slice(epk.as_bytes());
    out.extend_from_slice(&ct);
    Ok(out)
}

/// Decrypts a sealed box with the recipient's secret key.
pub fn open(secret: &SecretKey, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
    if sealed.len() < 1 + 32 + 16 || sealed[0] != SEALED_VERSION {
        return Err(SealError::Open);
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
                aad: &[SEALED_VERSION],
            },
        )
        .map_err(|_| SealError::Open)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::OsRng;

    #[test]
    fn roundtrip_and_tamper() {
        let bob = SecretKey::generate(&mut OsRng);
        let eve = SecretKey::generate(&mut OsRng);
        let boxed = seal(&bob.public_key(), b"utxo preimage", &mut OsRng).unwrap();
        assert_eq!(open(&bob, &boxed).unwrap(), b"utxo preimage");
        assert_eq!(open(&eve, &boxed), Err(SealError::Open));
        for i in [0, 5, 40, boxed.len() - 1] {
            let mut t = boxed.clone();
            t[i] ^= 1;
            assert_eq!(open(&bob, &t), Err(SealError::Open), "flip at {i}");
        }
        assert_eq!(open(&bob, &boxed[..40]), Err(SealError::Open));
        let mut small = [0u8; 32];
        small[0] = 1;
        assert_eq!(
            seal(&PublicKey(small), b"x", &mut OsRng),
            Err(SealError::BadRecipient)
        );
    }
}

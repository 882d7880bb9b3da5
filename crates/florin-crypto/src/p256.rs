//! ECDSA on P-256 (secp256r1): the signature scheme of custodial wallets whose keys are held by
//! a threshold network (CGGMP) at a payment provider, and of single-key P-256 wallets.
//!
//! # The message convention
//! A signature on message `M` is standard ECDSA-P256-SHA256: the signed digest is
//! `SHA-256(M)`, with no domain prefix of Florin's own, so that a threshold network producing
//! plain ECDSA signatures (`cggmp24` signs `SHA-256(M)`) and a single key produce the same thing.
//! On the ledger `M` is the 32-byte txid, which is already a domain-separated hash.
//!
//! # Encodings
//! - A public key is the 33-byte SEC1 *compressed* point `0x02|0x03 ‖ x` (x big-endian).
//! - A signature is 64 bytes `r ‖ s`, each a big-endian 32-byte integer.
//!
//! # The validity rule
//! A signature `(r, s)` by key `Q` on `M` is valid when, and only when:
//! 1. `Q` starts with `0x02` or `0x03`, `x < p`, and `x` is the abscissa of a curve point (so
//!    `Q` is never the identity);
//! 2. `1 ≤ r < n` and `1 ≤ s < n`;
//! 3. `s ≤ n / 2` (**low-S**): of the two signatures `(r, s)` and `(r, n − s)` that satisfy the
//!    equation, only the low one is accepted, so a third party cannot malleate a witness;
//! 4. the ECDSA equation holds for `SHA-256(M)`.
//!
//! [`P256SecretKey::sign`] always produces low-S signatures. A threshold signer must normalize
//! its output the same way (`cggmp24`'s `Signature::normalize_s`); a verifier never does.
//! Nothing here panics on any bytes, and nothing here does I/O or reads the clock.

use std::fmt;

use ::p256::ecdsa::signature::{Signer as _, Verifier as _};
use ::p256::ecdsa::{Signature as EcdsaSignature, SigningKey, VerifyingKey};
use ::p256::{FieldBytes, NonZeroScalar};
use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::signer::SignerError;

/// Why bytes are not a valid P-256 key or signature. Every variant is a property of the bytes,
/// so every verifier reaches the same verdict.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum P256Error {
    /// The public key is not a SEC1-compressed encoding (first byte not `0x02`/`0x03`).
    #[error("public key is not a SEC1-compressed point encoding")]
    NonCanonicalKey,
    /// The public key's x is not below p, or is not the abscissa of a curve point.
    #[error("public key is not a curve point")]
    InvalidKey,
    /// A secret key that is zero or not below the group order.
    #[error("secret key is not a scalar in [1, n)")]
    InvalidSecretKey,
    /// r is zero or not below the group order.
    #[error("signature r is not a scalar in [1, n)")]
    InvalidR,
    /// s is zero or not below the group order.
    #[error("signature s is not a scalar in [1, n)")]
    InvalidS,
    /// s is above n / 2: the malleated twin of a valid signature.
    #[error("signature s is high (non-canonical)")]
    HighS,
    /// The verification equation does not hold: wrong key, wrong message or forged.
    #[error("signature does not verify")]
    Equation,
}

/// A P-256 public key: the 33-byte SEC1-compressed point.
///
/// Any 33 bytes are accepted here; whether they are a usable key is decided when a signature is
/// verified against them (or eagerly, by [`P256PublicKey::from_sec1`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct P256PublicKey(pub [u8; 33]);

impl P256PublicKey {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 33] {
        &self.0
    }

    /// Parses a SEC1 point, compressed (33 bytes) or uncompressed (65 bytes, as some threshold
    /// libraries and HSMs export it), checking that it is a curve point, and returns its
    /// compressed form.
    pub fn from_sec1(bytes: &[u8]) -> Result<Self, P256Error> {
        match bytes.first() {
            Some(0x02 | 0x03) if bytes.len() == 33 => {}
            Some(0x04) if bytes.len() == 65 => {}
            _ => return Err(P256Error::NonCanonicalKey),
        }
        let key = VerifyingKey::from_sec1_bytes(bytes).map_err(|_| P256Error::InvalidKey)?;
        Ok(compress(&key))
    }
}

impl fmt::Debug for P256PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "P256PublicKey({})", hex::encode(self.0))
    }
}

impl fmt::Display for P256PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// A 64-byte ECDSA P-256 signature `r ‖ s` (big-endian).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct P256Signature(pub [u8; 64]);

impl P256Signature {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

impl fmt::Debug for P256Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "P256Signature({}…)", hex::encode(&self.0[..8]))
    }
}

/// A P-256 secret key held in process memory. Redacted in `Debug`, zeroized on drop (by the
/// wrapped `SigningKey`).
#[derive(Clone)]
pub struct P256SecretKey(SigningKey);

impl P256SecretKey {
    /// Generates a fresh key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        P256SecretKey(SigningKey::random(rng))
    }

    /// Restores a key from its 32-byte big-endian scalar, which must be in `[1, n)`.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, P256Error> {
        SigningKey::from_bytes(FieldBytes::from_slice(bytes))
            .map(P256SecretKey)
            .map_err(|_| P256Error::InvalidSecretKey)
    }

    /// The matching public key.
    pub fn public_key(&self) -> P256PublicKey {
        compress(self.0.verifying_key())
    }

    /// Signs `msg`: ECDSA-P256-SHA256 with an RFC 6979 deterministic nonce, normalized to
    /// low-S. Fails only if the nonce yields a zero `r` or `s` (probability about 2⁻²⁵⁶).
    pub fn sign(&self, msg: &[u8]) -> Result<P256Signature, SignerError> {
        let sig: EcdsaSignature = self
            .0
            .try_sign(msg)
            .map_err(|e| SignerError::Unavailable(format!("ECDSA P-256 signing failed: {e}")))?;
        let sig = sig.normalize_s().unwrap_or(sig);
        let mut out = [0u8; 64];
        out.copy_from_slice(&sig.to_bytes());
        Ok(P256Signature(out))
    }
}

impl fmt::Debug for P256SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "P256SecretKey(<redacted>, public: {})",
            self.public_key()
        )
    }
}

/// Something that signs with one P-256 key: a [`P256SecretKey`] in process, or a threshold
/// network whose signatures are indistinguishable from a single key's.
pub trait P256Signer: Send + Sync {
    /// The key signatures verify under.
    fn public_key(&self) -> P256PublicKey;
    /// Signs `msg` under the module's message convention; the result must be low-S.
    fn sign(&self, msg: &[u8]) -> Result<P256Signature, SignerError>;
}

impl P256Signer for P256SecretKey {
    fn public_key(&self) -> P256PublicKey {
        P256SecretKey::public_key(self)
    }

    fn sign(&self, msg: &[u8]) -> Result<P256Signature, SignerError> {
        P256SecretKey::sign(self, msg)
    }
}

fn compress(key: &VerifyingKey) -> P256PublicKey {
    // A `VerifyingKey` is never the identity, so its compressed encoding is 33 bytes.
    let point = key.to_encoded_point(true);
    P256PublicKey(<[u8; 33]>::try_from(point.as_bytes()).unwrap_or([0; 33]))
}

fn parse_scalar(bytes: &[u8], err: P256Error) -> Result<NonZeroScalar, P256Error> {
    Option::from(NonZeroScalar::from_repr(*FieldBytes::from_slice(bytes))).ok_or(err)
}

/// Verifies `sig` by `key` on `msg` under the validity rule of this module.
pub fn verify(key: &P256PublicKey, msg: &[u8], sig: &P256Signature) -> Result<(), P256Error> {
    if !matches!(key.0[0], 0x02 | 0x03) {
        return Err(P256Error::NonCanonicalKey);
    }
    let vk = VerifyingKey::from_sec1_bytes(&key.0).map_err(|_| P256Error::InvalidKey)?;
    let r = parse_scalar(&sig.0[..32], P256Error::InvalidR)?;
    let s = parse_scalar(&sig.0[32..], P256Error::InvalidS)?;
    let sig = EcdsaSignature::from_scalars(r, s).map_err(|_| P256Error::InvalidS)?;
    if sig.normalize_s().is_some() {
        return Err(P256Error::HighS);
    }
    vk.verify(msg, &sig).map_err(|_| P256Error::Equation)
}

#[cfg(test)]
mod tests;

//! Keys and signatures.

use std::fmt;

use ed25519_dalek::Signer as _;
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;
use zeroize::Zeroize;

use crate::address::{self, AddressError};

/// Why bytes or text are not a key.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// Wrong number of bytes.
    #[error("key is {0} bytes, expected 32")]
    WrongLength(usize),
    /// Not hex.
    #[error("key is not valid hex")]
    Hex,
    /// Not an address.
    #[error(transparent)]
    Address(#[from] AddressError),
}

/// An Ed25519 public key: 32 bytes, the identity of a wallet, the authority or the issuer.
///
/// Any 32 bytes are accepted here; whether they are a usable key is decided, under the one
/// validity rule, when a signature is verified against them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl PublicKey {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The bech32m address (`eur1…`).
    pub fn to_address(&self) -> String {
        address::encode(&self.0)
    }

    /// Parses a bech32m address.
    pub fn from_address(s: &str) -> Result<Self, AddressError> {
        address::decode(s).map(PublicKey)
    }

    /// Parses an address or 64 hex digits.
    pub fn parse(s: &str) -> Result<Self, KeyError> {
        let s = s.trim();
        if s.starts_with("eur1") {
            return Ok(Self::from_address(s)?);
        }
        let bytes = hex::decode(s).map_err(|_| KeyError::Hex)?;
        let arr = <[u8; 32]>::try_from(bytes.as_slice())
            .map_err(|_| KeyError::WrongLength(bytes.len()))?;
        Ok(PublicKey(arr))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_address())
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_address())
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_address())
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PublicKey::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A 64-byte Ed25519 signature `R ‖ s`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signature(pub [u8; 64]);

impl Signature {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

impl fmt::Debug for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signature({}…)", hex::encode(&self.0[..8]))
    }
}

/// An Ed25519 secret key. Redacted in `Debug`, zeroized on drop.
pub struct SecretKey(ed25519_dalek::SigningKey);

impl SecretKey {
    /// Generates a fresh key from `rng`.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        SecretKey(ed25519_dalek::SigningKey::generate(rng))
    }

    /// Restores a key from its 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        SecretKey(ed25519_dalek::SigningKey::from_bytes(seed))
    }

    /// Restores a key from 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        let mut bytes = hex::decode(s.trim()).map_err(|_| KeyError::Hex)?;
        let res = <[u8; 32]>::try_from(bytes.as_slice())
            .map(|seed| Self::from_seed(&seed))
            .map_err(|_| KeyError::WrongLength(bytes.len()));
        bytes.zeroize();
        res
    }

    /// The 32-byte seed, hex encoded, for storage in a key file. Handle with care.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0.to_bytes())
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key().to_bytes())
    }

    /// The secret scalar (for X25519 key agreement in sealed boxes). Handle with care.
    pub(crate) fn scalar(&self) -> curve25519_dalek::scalar::Scalar {
        self.0.to_scalar()
    }

    /// A key derived from this one for `purpose` and `index` (for example a fresh key per
    /// ledger output): the derivation is one-way, so derived keys reveal nothing about this one.
    pub fn derive(&self, purpose: &str, index: u64) -> SecretKey {
        let mut seed = self.0.to_bytes();
        let mut child = crate::hash::Hasher::new("florin/key/derive/v1")
            .chain(&seed)
            .chain(purpose.as_bytes())
            .chain(&index.to_le_bytes())
            .finalize();
        seed.zeroize();
        let k = SecretKey::from_seed(&child);
        child.zeroize();
        k
    }

    /// Signs `msg` (deterministic Ed25519, RFC 8032).
    pub fn sign(&self, msg: &[u8]) -> Signature {
        Signature(self.0.sign(msg).to_bytes())
    }
}

impl Clone for SecretKey {
    fn clone(&self) -> Self {
        SecretKey(self.0.clone())
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SecretKey(<redacted>, public: {})",
            self.public_key().to_address()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_secret() {
        let sk = SecretKey::from_seed(&[7u8; 32]);
        let shown = format!("{sk:?}");
        assert!(shown.contains("redacted"));
        assert!(!shown.contains(&sk.to_hex()));
    }

    #[test]
    fn address_roundtrip_and_errors() {
        let pk = SecretKey::from_seed(&[1u8; 32]).public_key();
        let a = pk.to_address();
        assert!(a.starts_with("eur1"));
        assert_eq!(PublicKey::from_address(&a), Ok(pk));
        assert_eq!(PublicKey::parse(&hex::encode(pk.0)), Ok(pk));
        // A flipped character breaks the checksum.
        let mut bad = a.clone().into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'q' { b'p' } else { b'q' };
        assert!(PublicKey::from_address(std::str::from_utf8(&bad).unwrap()).is_err());
        // Another HRP is refused.
        let other =
            bech32::encode::<bech32::Bech32m>(bech32::Hrp::parse_unchecked("btc"), &pk.0).unwrap();
        assert!(matches!(
            PublicKey::from_address(&other),
            Err(AddressError::WrongHrp { .. })
        ));
        // Bech32 (not m) is refused.
        let legacy =
            bech32::encode::<bech32::Bech32>(bech32::Hrp::parse_unchecked("eur"), &pk.0).unwrap();
        assert!(PublicKey::from_address(&legacy).is_err());
        assert_eq!(PublicKey::parse("abcd"), Err(KeyError::WrongLength(2)));
    }

    #[test]
    fn seed_roundtrip() {
        let sk = SecretKey::from_seed(&[9u8; 32]);
        let back = SecretKey::from_hex(&sk.to_hex()).unwrap();
        assert_eq!(sk.public_key(), back.public_key());
    }
}

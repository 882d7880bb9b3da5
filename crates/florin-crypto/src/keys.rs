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
    /// The bytes do not decompress to a point on the curve.
    #[error("key {0} is not a point on the curve")]
    NotAPoint(String),
    /// The point is encoded non-canonically (y ≥ p, or a sign bit set on x = 0): the same key
    /// has another, canonical, spelling.
    #[error("key {0} is not canonically encoded")]
    NonCanonical(String),
    /// The point has small order (the identity, zero-ish keys and the other torsion points):
    /// anyone could sign for it, or nobody can receive with it.
    #[error("key {0} has small order: it is not a usable key")]
    SmallOrder(String),
}

/// An Ed25519 public key: 32 bytes, the identity of a wallet, the authority or the issuer.
///
/// The type holds any 32 bytes (so that historical data — tokens, fraud proofs, wallet files —
/// always decodes; a signature by an unusable key simply never verifies). Where a key *enters*
/// the system — an address typed by a user, a payee in an API request — it is checked with
/// [`PublicKey::validate`] or parsed with [`PublicKey::parse_valid`]: a canonical encoding of a
/// curve point that does not have small order.
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

    /// Parses an address or 64 hex digits and [validates](PublicKey::validate) the key: use
    /// this wherever a key enters from outside before anything is signed or submitted to it.
    pub fn parse_valid(s: &str) -> Result<Self, KeyError> {
        let k = Self::parse(s)?;
        k.validate()?;
        Ok(k)
    }

    /// Checks that the key can own money: the bytes decompress to a point on the curve, they
    /// are that point's canonical encoding, and the point does not have small order (order
    /// dividing 8, which includes the identity and the all-zero-ish keys). The same rule the
    /// signature verifier applies to keys, so a valid key is one a signature can verify under.
    pub fn validate(&self) -> Result<(), KeyError> {
        use curve25519_dalek::edwards::CompressedEdwardsY;
        let point = CompressedEdwardsY(self.0)
            .decompress()
            .ok_or_else(|| KeyError::NotAPoint(self.to_address()))?;
        if point.compress().to_bytes() != self.0 {
            return Err(KeyError::NonCanonical(self.to_address()));
        }
        if point.is_small_order() {
            return Err(KeyError::SmallOrder(self.to_address()));
        }
        Ok(())
    }

    /// Whether [`PublicKey::validate`] accepts the key.
    pub fn is_valid(&self) -> bool {
        self.validate().is_ok()
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

    /// The secret scalar (for X25519 key agreement in legacy v1 sealed boxes). Handle with care.
    pub(crate) fn scalar(&self) -> curve25519_dalek::scalar::Scalar {
        self.0.to_scalar()
    }

    /// The X25519 private key matching this key's public key in Montgomery form (the lower half
    /// of SHA-512 of the seed, unclamped; X25519 clamps it), for HPKE sealed boxes. Handle with
    /// care.
    pub(crate) fn x25519_secret(&self) -> zeroize::Zeroizing<[u8; 32]> {
        zeroize::Zeroizing::new(self.0.to_scalar_bytes())
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
    fn validation_accepts_real_keys() {
        for seed in 0u8..32 {
            let pk = SecretKey::from_seed(&[seed; 32]).public_key();
            assert_eq!(pk.validate(), Ok(()));
            assert_eq!(PublicKey::parse_valid(&pk.to_address()), Ok(pk));
            assert_eq!(PublicKey::parse_valid(&hex::encode(pk.0)), Ok(pk));
        }
    }

    #[test]
    fn validation_refuses_zero_identity_small_order_and_non_canonical() {
        // All zeros: y = 0 is the point (±sqrt(-1), 0), of order 4.
        let zero = PublicKey([0u8; 32]);
        assert!(matches!(zero.validate(), Err(KeyError::SmallOrder(_))));
        // The identity (y = 1).
        let mut id = [0u8; 32];
        id[0] = 1;
        assert!(matches!(
            PublicKey(id).validate(),
            Err(KeyError::SmallOrder(_))
        ));
        // -1 (y = p - 1): order 2.
        let mut minus_one = [0xffu8; 32];
        minus_one[0] = 0xec;
        minus_one[31] = 0x7f;
        assert!(matches!(
            PublicKey(minus_one).validate(),
            Err(KeyError::SmallOrder(_))
        ));
        // The identity with the sign bit set: x = 0, so the sign bit must be clear.
        let mut id_neg = id;
        id_neg[31] |= 0x80;
        assert!(matches!(
            PublicKey(id_neg).validate(),
            Err(KeyError::NonCanonical(_)) | Err(KeyError::NotAPoint(_))
        ));
        // y = p + 1 ≡ 1: a non-canonical spelling of the identity.
        let mut p_plus_1 = [0xffu8; 32];
        p_plus_1[0] = 0xee;
        p_plus_1[31] = 0x7f;
        assert!(matches!(
            PublicKey(p_plus_1).validate(),
            Err(KeyError::NonCanonical(_)) | Err(KeyError::NotAPoint(_))
        ));
        // A real key with y increased by p (its top bits overflow): bytes that are not a point
        // or not canonical are refused, never accepted.
        let mut not_point = None;
        for i in 0u8..=255 {
            let mut b = [i; 32];
            b[31] &= 0x7f;
            if curve25519_dalek::edwards::CompressedEdwardsY(b)
                .decompress()
                .is_none()
            {
                not_point = Some(b);
                break;
            }
        }
        let b = not_point.expect("some y is not on the curve");
        assert!(matches!(
            PublicKey(b).validate(),
            Err(KeyError::NotAPoint(_))
        ));
        // Through the parser: the zero key as an address and as hex.
        let zero_addr = zero.to_address();
        assert!(
            PublicKey::parse(&zero_addr).is_ok(),
            "parse keeps history decodable"
        );
        assert!(matches!(
            PublicKey::parse_valid(&zero_addr),
            Err(KeyError::SmallOrder(_))
        ));
        assert!(PublicKey::parse_valid(&"00".repeat(32)).is_err());
        assert_eq!(
            PublicKey::parse_valid("abcd"),
            Err(KeyError::WrongLength(2))
        );
        // Every small-order point (the 8-torsion) is refused, canonical or not.
        let eight_torsion = curve25519_dalek::constants::EIGHT_TORSION;
        for p in eight_torsion {
            let k = PublicKey(p.compress().to_bytes());
            assert!(
                matches!(k.validate(), Err(KeyError::SmallOrder(_))),
                "{k:?}"
            );
        }
    }

    #[test]
    fn seed_roundtrip() {
        let sk = SecretKey::from_seed(&[9u8; 32]);
        let back = SecretKey::from_hex(&sk.to_hex()).unwrap();
        assert_eq!(sk.public_key(), back.public_key());
    }
}

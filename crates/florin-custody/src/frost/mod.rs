//! Ed25519 threshold keys with FROST (RFC 9591).
//!
//! Roles and what they compute:
//! - every node: [`DkgParty`] (distributed key generation, three steps), [`NoncePool`]
//!   (nonce commitments made ahead of time), [`sign_share`] (its signature share);
//! - the coordinator: [`SigningPackage::new`] (message plus the chosen nodes' commitments) and
//!   [`aggregate`] (one Ed25519 signature, or the name of the node whose share is bad);
//! - whoever imports or exports a key: [`split_ed25519_seed`], [`reconstruct`].
//!
//! Shares and group keys encode to bytes for the wire and for the vault; decoding another
//! party's bytes never panics and names the party on failure.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use curve25519_dalek::Scalar;
use florin_crypto::{hash, PublicKey, Signature};
use frost_ed25519 as frost;
use frost_ed25519::keys::dkg;
use frost_ed25519::{Identifier, SigningKey};
use rand::{CryptoRng, RngCore};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha512};
use zeroize::Zeroizing;

use crate::{CustodyError, PartyId};

/// Largest network this code accepts (the source document measured up to 52 nodes).
pub const MAX_PARTIES: u16 = 255;

const ECHO_DOMAIN: &str = "florin/custody/dkg-echo/v1";
const GROUP_DOMAIN: &str = "florin/custody/group/v1";

fn ident(p: PartyId) -> Result<Identifier, CustodyError> {
    Identifier::try_from(p).map_err(|_| CustodyError::BadParameters(format!("party {p}")))
}

/// The party number of a FROST identifier made by [`ident`].
fn party_of(id: &Identifier) -> PartyId {
    let b = id.serialize();
    if b.len() == 32 && b[2..].iter().all(|&x| x == 0) {
        u16::from_le_bytes([b[0], b[1]])
    } else {
        0
    }
}

fn frost_err(e: frost::Error) -> CustodyError {
    CustodyError::Frost(e.to_string())
}

/// Maps a FROST error that names culprits to [`CustodyError::Misbehaved`].
fn culprit_err(e: frost::Error, reason: &str) -> CustodyError {
    match e.culprits().first() {
        Some(c) => CustodyError::Misbehaved {
            party: party_of(c),
            reason: format!("{reason}: {e}"),
        },
        None => frost_err(e),
    }
}

fn check_params(t: u16, n: u16) -> Result<(), CustodyError> {
    if t < 2 || t > n || n > MAX_PARTIES {
        return Err(CustodyError::BadParameters(format!(
            "threshold {t} of {n}: need 2 ≤ t ≤ n ≤ {MAX_PARTIES}"
        )));
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct GroupRepr {
    v: u8,
    key_id: String,
    t: u16,
    n: u16,
    package: Vec<u8>,
}

/// The public side of a threshold key: what a coordinator needs, no secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupKey {
    key_id: String,
    t: u16,
    n: u16,
    package: frost::keys::PublicKeyPackage,
}

impl GroupKey {
    /// The key's name in the network (e.g. `issuer`).
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// Shares needed to sign.
    pub fn threshold(&self) -> u16 {
        self.t
    }

    /// Shares in existence.
    pub fn parties(&self) -> u16 {
        self.n
    }

    /// The Ed25519 public key every aggregate signature verifies under.
    pub fn public_key(&self) -> PublicKey {
        let b = self.package.verifying_key().serialize().unwrap_or_default();
        let mut k = [0u8; 32];
        if b.len() == 32 {
            k.copy_from_slice(&b);
        }
        PublicKey(k)
    }

    /// A digest of [`GroupKey::to_bytes`]: it names one sharing of the key, so it changes
    /// when the shares are refreshed while [`GroupKey::public_key`] stays.
    pub fn digest(&self) -> [u8; 32] {
        hash(GROUP_DOMAIN, &[&self.to_bytes()])
    }

    /// Whether `self` is a refreshed sharing of `old`: the same name, threshold, parties and
    /// public key, other public shares.
    pub fn is_refresh_of(&self, old: &GroupKey) -> bool {
        self.key_id == old.key_id
            && self.t == old.t
            && self.n == old.n
            && self.package.verifying_key() == old.package.verifying_key()
            && self.package.verifying_shares() != old.package.verifying_shares()
    }

    /// Encodes for the wire and for disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        let repr = GroupRepr {
            v: 1,
            key_id: self.key_id.clone(),
            t: self.t,
            n: self.n,
            package: self.package.serialize().unwrap_or_default(),
        };
        postcard::to_allocvec(&repr).unwrap_or_default()
    }

    /// Decodes [`GroupKey::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Result<GroupKey, CustodyError> {
        let bad = || CustodyError::malformed("group key");
        let r: GroupRepr = postcard::from_bytes(b).map_err(|_| bad())?;
        if r.v != 1 {
            return Err(bad());
        }
        check_params(r.t, r.n)?;
        let package = frost::keys::PublicKeyPackage::deserialize(&r.package).map_err(|_| bad())?;
        if package.verifying_shares().len() != r.n as usize {
            return Err(bad());
        }
        Ok(GroupKey {
            key_id: r.key_id,
            t: r.t,
            n: r.n,
            package,
        })
    }
}

#[derive(Serialize, Deserialize)]
struct ShareRepr {
    v: u8,
    party: PartyId,
    key_package: Vec<u8>,
    group: Vec<u8>,
}

/// One node's share of a threshold key, with the group's public side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyShare {
    party: PartyId,
    key_package: frost::keys::KeyPackage,
    group: GroupKey,
}

impl KeyShare {
    /// This share's party.
    pub fn party(&self) -> PartyId {
        self.party
    }

    /// The key this share belongs to.
    pub fn group(&self) -> &GroupKey {
        &self.group
    }

    /// Encodes, secret share included: store it only through [`crate::vault`].
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let repr = ShareRepr {
            v: 1,
            party: self.party,
            key_package: self.key_package.serialize().unwrap_or_default(),
            group: self.group.to_bytes(),
        };
        Zeroizing::new(postcard::to_allocvec(&repr).unwrap_or_default())
    }

    /// Decodes [`KeyShare::to_bytes`] and checks the share against the group's public
    /// verification share for this party.
    pub fn from_bytes(b: &[u8]) -> Result<KeyShare, CustodyError> {
        let bad = || CustodyError::malformed("key share");
        let r: ShareRepr = postcard::from_bytes(b).map_err(|_| bad())?;
        if r.v != 1 {
            return Err(bad());
        }
        let group = GroupKey::from_bytes(&r.group)?;
        let key_package =
            frost::keys::KeyPackage::deserialize(&r.key_package).map_err(|_| bad())?;
        let id = ident(r.party)?;
        let expected = group.package.verifying_shares().get(&id).ok_or_else(bad)?;
        let own = frost::keys::VerifyingShare::from(*key_package.signing_share());
        if *key_package.identifier() != id
            || &own != expected
            || key_package.verifying_key() != group.package.verifying_key()
        {
            return Err(CustodyError::malformed(
                "key share: does not match its group key",
            ));
        }
        Ok(KeyShare {
            party: r.party,
            key_package,
            group,
        })
    }
}

mod import;
mod keygen;
mod repair;
mod sign;
#[cfg(test)]
mod tests;

pub use import::*;
pub use keygen::*;
pub use repair::*;
pub use sign::*;

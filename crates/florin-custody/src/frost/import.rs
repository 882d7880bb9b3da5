//! Import and export.

use super::*;

/// The Ed25519 signing scalar of a 32-byte seed (RFC 8032: SHA-512, clamp, reduce).
pub(super) fn seed_scalar(seed: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let h = Sha512::digest(seed);
    let mut a = Zeroizing::new([0u8; 32]);
    a.copy_from_slice(&h[..32]);
    a[0] &= 248;
    a[31] &= 127;
    a[31] |= 64;
    Zeroizing::new(Scalar::from_bytes_mod_order(*a).to_bytes())
}

pub(super) fn split_key<R: RngCore + CryptoRng>(
    key_id: &str,
    key: &SigningKey,
    t: u16,
    n: u16,
    rng: &mut R,
) -> Result<(GroupKey, Vec<KeyShare>), CustodyError> {
    check_params(t, n)?;
    let (shares, public) = frost::keys::split(key, n, t, frost::keys::IdentifierList::Default, rng)
        .map_err(frost_err)?;
    let group = GroupKey {
        key_id: key_id.to_string(),
        t,
        n,
        package: public,
    };
    let mut out = Vec::with_capacity(n as usize);
    for (id, share) in shares {
        let key_package = frost::keys::KeyPackage::try_from(share).map_err(frost_err)?;
        out.push(KeyShare {
            party: party_of(&id),
            key_package,
            group: group.clone(),
        });
    }
    Ok((group, out))
}

/// Trusted-dealer import (R5) of an existing Ed25519 key given by its 32-byte seed (the
/// format of Florin's key files): n shares, any t of which sign under the same public key,
/// so everything the key signed before stays valid. The dealer must erase the seed
/// afterwards.
pub fn split_ed25519_seed<R: RngCore + CryptoRng>(
    key_id: &str,
    seed: &[u8; 32],
    t: u16,
    n: u16,
    rng: &mut R,
) -> Result<(GroupKey, Vec<KeyShare>), CustodyError> {
    let scalar = seed_scalar(seed);
    let key = SigningKey::deserialize(&scalar[..]).map_err(frost_err)?;
    split_key(key_id, &key, t, n, rng)
}

/// A fresh key split by a trusted dealer (for tests and for the benchmark's many custodial
/// keys; the nodes' own [`DkgParty`] is the way to make a key nobody ever held).
pub fn generate_with_dealer<R: RngCore + CryptoRng>(
    key_id: &str,
    t: u16,
    n: u16,
    rng: &mut R,
) -> Result<(GroupKey, Vec<KeyShare>), CustodyError> {
    let key = SigningKey::new(&mut *rng);
    split_key(key_id, &key, t, n, rng)
}

/// Key export (R4): the signing scalar rebuilt from at least t shares of one key, checked
/// against the group's public key. The result signs alone: handle it like the key file it
/// replaces.
pub fn reconstruct(shares: &[KeyShare]) -> Result<Zeroizing<[u8; 32]>, CustodyError> {
    let first = shares
        .first()
        .ok_or(CustodyError::TooFewParties { have: 0, need: 2 })?;
    let group = &first.group;
    let mut parties: Vec<PartyId> = shares.iter().map(|s| s.party).collect();
    parties.sort_unstable();
    parties.dedup();
    if parties.len() < group.t as usize {
        return Err(CustodyError::TooFewParties {
            have: parties.len(),
            need: group.t as usize,
        });
    }
    if let Some(s) = shares.iter().find(|s| s.group != *group) {
        return Err(CustodyError::BadParameters(format!(
            "share of party {} belongs to another key",
            s.party
        )));
    }
    let packages: Vec<_> = shares.iter().map(|s| s.key_package.clone()).collect();
    let key = frost::keys::reconstruct(&packages).map_err(frost_err)?;
    if frost::VerifyingKey::from(&key) != *group.package.verifying_key() {
        return Err(CustodyError::Frost(
            "the shares do not rebuild the group key".into(),
        ));
    }
    let mut out = Zeroizing::new([0u8; 32]);
    out.copy_from_slice(&key.serialize());
    Ok(out)
}

/// The public key of a signing scalar from [`reconstruct`].
pub fn scalar_public_key(scalar: &[u8; 32]) -> Result<PublicKey, CustodyError> {
    let key = SigningKey::deserialize(scalar).map_err(frost_err)?;
    let b = frost::VerifyingKey::from(&key)
        .serialize()
        .map_err(frost_err)?;
    let mut k = [0u8; 32];
    k.copy_from_slice(&b);
    Ok(PublicKey(k))
}

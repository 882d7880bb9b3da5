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

// ---------------------------------------------------------------------------------------------
// Distributed key generation

enum DkgStep {
    /// Round 1 sent; waiting for everyone's round-1 packages.
    Round1(Box<dkg::round1::SecretPackage>),
    /// Round 2 sent; waiting for echoes and the shares addressed to us.
    Round2 {
        secret: Box<dkg::round2::SecretPackage>,
        round1: BTreeMap<Identifier, dkg::round1::Package>,
        digests: BTreeMap<PartyId, [u8; 32]>,
    },
    Done,
}

/// One node's side of a distributed key generation (Pedersen DKG with proofs of knowledge, as
/// in FROST), plus an echo round: every node reports digests of the round-1 packages it got,
/// so a node that sent different packages to different nodes is caught and named before any
/// share is used.
///
/// Steps: [`DkgParty::start`] → broadcast its output; [`DkgParty::round2`] with everyone
/// else's round-1 output → broadcast the echo, send each direct message to its party only (it
/// carries a secret share: seal it); [`DkgParty::finish`] with everyone else's echo and the
/// direct messages addressed to us → the [`KeyShare`].
pub struct DkgParty {
    key_id: String,
    me: PartyId,
    t: u16,
    n: u16,
    own_round1: Vec<u8>,
    step: DkgStep,
    /// For a share refresh: the share being refreshed.
    refresh: Option<Box<KeyShare>>,
}

/// What [`DkgParty::round2`] sends.
pub struct Round2Out {
    /// Broadcast to every party: digests of the round-1 packages this party saw.
    pub echo: Vec<u8>,
    /// One message per other party, secret: deliver only to that party, sealed.
    pub direct: BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
}

impl DkgParty {
    /// Starts the DKG of key `key_id` as party `me` of `n`, threshold `t`. Returns the round-1
    /// message to broadcast.
    pub fn start<R: RngCore + CryptoRng>(
        key_id: &str,
        me: PartyId,
        t: u16,
        n: u16,
        rng: &mut R,
    ) -> Result<(DkgParty, Vec<u8>), CustodyError> {
        check_params(t, n)?;
        if me == 0 || me > n {
            return Err(CustodyError::BadParameters(format!("party {me} of {n}")));
        }
        let (secret, package) = dkg::part1(ident(me)?, n, t, &mut *rng).map_err(frost_err)?;
        let own_round1 = package.serialize().map_err(frost_err)?;
        Ok((
            DkgParty {
                key_id: key_id.to_string(),
                me,
                t,
                n,
                own_round1: own_round1.clone(),
                step: DkgStep::Round1(Box::new(secret)),
                refresh: None,
            },
            own_round1,
        ))
    }

    /// Starts a proactive refresh of `old`'s key as `old`'s party: the same three steps as a
    /// key generation, but every party deals a random sharing of zero, and each adds what it
    /// gets to its share. The public key stays; every share changes, so shares stolen before
    /// the refresh do not combine with shares stolen after it. Every party of the key must
    /// take part. Returns the round-1 message to broadcast.
    pub fn start_refresh<R: RngCore + CryptoRng>(
        old: &KeyShare,
        rng: &mut R,
    ) -> Result<(DkgParty, Vec<u8>), CustodyError> {
        let (t, n, me) = (old.group.t, old.group.n, old.party);
        check_params(t, n)?;
        let (secret, package) =
            frost_core::keys::refresh::refresh_dkg_part1(ident(me)?, n, t, &mut *rng)
                .map_err(frost_err)?;
        let own_round1 = package.serialize().map_err(frost_err)?;
        Ok((
            DkgParty {
                key_id: old.group.key_id.clone(),
                me,
                t,
                n,
                own_round1: own_round1.clone(),
                step: DkgStep::Round1(Box::new(secret)),
                refresh: Some(Box::new(old.clone())),
            },
            own_round1,
        ))
    }

    /// Whether this run refreshes an existing key (else it makes a new one).
    pub fn is_refresh(&self) -> bool {
        self.refresh.is_some()
    }

    /// This party's number.
    pub fn party(&self) -> PartyId {
        self.me
    }

    fn others(&self) -> impl Iterator<Item = PartyId> + '_ {
        (1..=self.n).filter(move |&p| p != self.me)
    }

    fn expect_all<T>(&self, m: &BTreeMap<PartyId, T>, what: &str) -> Result<(), CustodyError> {
        let missing: Vec<PartyId> = self.others().filter(|p| !m.contains_key(p)).collect();
        if !missing.is_empty() {
            return Err(CustodyError::OutOfOrder(format!(
                "{what}: nothing from parties {missing:?}"
            )));
        }
        if let Some(p) = m.keys().find(|&&p| p == self.me || p == 0 || p > self.n) {
            return Err(CustodyError::BadParameters(format!(
                "{what}: unexpected party {p}"
            )));
        }
        Ok(())
    }

    fn digest(&self, party: PartyId, bytes: &[u8]) -> [u8; 32] {
        hash(
            ECHO_DOMAIN,
            &[self.key_id.as_bytes(), &party.to_le_bytes(), bytes],
        )
    }

    /// Round 2: takes every other party's round-1 message.
    pub fn round2(
        &mut self,
        round1: &BTreeMap<PartyId, Vec<u8>>,
    ) -> Result<Round2Out, CustodyError> {
        self.expect_all(round1, "round 1")?;
        let secret = match std::mem::replace(&mut self.step, DkgStep::Done) {
            DkgStep::Round1(s) => s,
            other => {
                self.step = other;
                return Err(CustodyError::OutOfOrder("round 2 already done".into()));
            }
        };
        let mut packages = BTreeMap::new();
        let mut digests = BTreeMap::new();
        digests.insert(self.me, self.digest(self.me, &self.own_round1));
        for (&p, bytes) in round1 {
            let pkg =
                dkg::round1::Package::deserialize(bytes).map_err(|_| CustodyError::Misbehaved {
                    party: p,
                    reason: "malformed round-1 package".into(),
                })?;
            packages.insert(ident(p)?, pkg);
            digests.insert(p, self.digest(p, bytes));
        }
        let (secret2, out) = if self.refresh.is_some() {
            // A refresh commitment leaves out the constant term (zero, added back by each
            // receiver): t − 1 coefficients. The library refuses other lengths without a name.
            for (id, pkg) in &packages {
                if pkg.commitment().coefficients().len() + 1 != self.t as usize {
                    return Err(CustodyError::Misbehaved {
                        party: party_of(id),
                        reason: "refresh commitment of the wrong degree".into(),
                    });
                }
            }
            frost_core::keys::refresh::refresh_dkg_part2(*secret, &packages)
                .map_err(|e| culprit_err(e, "invalid round-1 package"))?
        } else {
            dkg::part2(*secret, &packages).map_err(|e| culprit_err(e, "invalid round-1 package"))?
        };
        let mut direct = BTreeMap::new();
        for (id, pkg) in out {
            let bytes = pkg.serialize().map_err(frost_err)?;
            direct.insert(party_of(&id), Zeroizing::new(bytes));
        }
        let echo = postcard::to_allocvec(&digests).map_err(|_| CustodyError::malformed("echo"))?;
        self.step = DkgStep::Round2 {
            secret: Box::new(secret2),
            round1: packages,
            digests,
        };
        Ok(Round2Out { echo, direct })
    }

    /// Round 3: checks every other party's echo against what this party saw, then the shares
    /// addressed to it. Returns this party's share of the new key.
    pub fn finish(
        &mut self,
        echoes: &BTreeMap<PartyId, Vec<u8>>,
        direct: &BTreeMap<PartyId, Vec<u8>>,
    ) -> Result<KeyShare, CustodyError> {
        self.expect_all(echoes, "echo")?;
        self.expect_all(direct, "round 2")?;
        let DkgStep::Round2 {
            secret,
            round1,
            digests,
        } = &self.step
        else {
            return Err(CustodyError::OutOfOrder(
                "finish before round 2, or twice".into(),
            ));
        };
        for (&witness, bytes) in echoes {
            let theirs: BTreeMap<PartyId, [u8; 32]> =
                postcard::from_bytes(bytes).map_err(|_| CustodyError::Misbehaved {
                    party: witness,
                    reason: "malformed echo".into(),
                })?;
            if theirs.len() != digests.len() {
                return Err(CustodyError::Misbehaved {
                    party: witness,
                    reason: "echo does not cover every party".into(),
                });
            }
            for (p, d) in digests {
                match theirs.get(p) {
                    Some(x) if x == d => {}
                    Some(_) => {
                        return Err(CustodyError::Equivocation {
                            culprit: *p,
                            witness,
                        })
                    }
                    None => {
                        return Err(CustodyError::Misbehaved {
                            party: witness,
                            reason: format!("echo leaves out party {p}"),
                        })
                    }
                }
            }
        }
        let mut packages = BTreeMap::new();
        for (&p, bytes) in direct {
            let pkg =
                dkg::round2::Package::deserialize(bytes).map_err(|_| CustodyError::Misbehaved {
                    party: p,
                    reason: "malformed round-2 package".into(),
                })?;
            packages.insert(ident(p)?, pkg);
        }
        let (key_package, public) = match &self.refresh {
            None => dkg::part3(secret, round1, &packages)
                .map_err(|e| culprit_err(e, "invalid secret share"))?,
            Some(old) => {
                check_refresh_shares(self.me, round1, &packages)?;
                let (kp, public) = frost_core::keys::refresh::refresh_dkg_shares(
                    secret,
                    round1,
                    &packages,
                    old.group.package.clone(),
                    old.key_package.clone(),
                )
                .map_err(frost_err)?;
                if public.verifying_key() != old.group.package.verifying_key() {
                    return Err(CustodyError::Inconsistent(
                        "the refresh changed the public key".into(),
                    ));
                }
                (kp, public)
            }
        };
        self.step = DkgStep::Done;
        Ok(KeyShare {
            party: self.me,
            key_package,
            group: GroupKey {
                key_id: self.key_id.clone(),
                t: self.t,
                n: self.n,
                package: public,
            },
        })
    }
}

/// Checks each refresh share addressed to `me` against its sender's commitment (with the
/// zero constant term put back), naming a sender whose share does not match: the library
/// checks the same but names no one.
fn check_refresh_shares(
    me: PartyId,
    round1: &BTreeMap<Identifier, dkg::round1::Package>,
    direct: &BTreeMap<Identifier, dkg::round2::Package>,
) -> Result<(), CustodyError> {
    use frost_core::keys::{CoefficientCommitment, SecretShare, VerifiableSecretSharingCommitment};
    for (id, pkg) in direct {
        let commitment = round1.get(id).ok_or_else(|| CustodyError::Misbehaved {
            party: party_of(id),
            reason: "refresh share without a commitment".into(),
        })?;
        let mut coefficients = vec![CoefficientCommitment::new(
            <frost::Ed25519Group as frost_core::Group>::identity(),
        )];
        coefficients.extend_from_slice(commitment.commitment().coefficients());
        let share = SecretShare::new(
            ident(me)?,
            *pkg.signing_share(),
            VerifiableSecretSharingCommitment::new(coefficients),
        );
        if share.verify().is_err() {
            return Err(CustodyError::Misbehaved {
                party: party_of(id),
                reason: "invalid refresh share".into(),
            });
        }
    }
    Ok(())
}

/// Runs a whole DKG with all `n` parties in this process (tests, benchmarks, an offline
/// ceremony on one air-gapped machine). Returns every party's share and how long each party
/// computed, over its three steps.
pub fn dkg_in_memory<R: RngCore + CryptoRng>(
    key_id: &str,
    t: u16,
    n: u16,
    rng: &mut R,
) -> Result<(Vec<KeyShare>, Vec<std::time::Duration>), CustodyError> {
    let mut spent = vec![Duration::ZERO; n as usize];
    let mut parties = Vec::with_capacity(n as usize);
    let mut round1 = BTreeMap::new();
    for p in 1..=n {
        let s = Instant::now();
        let (party, msg) = DkgParty::start(key_id, p, t, n, rng)?;
        spent[p as usize - 1] += s.elapsed();
        parties.push(party);
        round1.insert(p, msg);
    }
    finish_in_memory(parties, round1, spent)
}

/// Refreshes every share of one key in this process (tests, benchmarks, an offline
/// ceremony): `shares` must hold every party's share. Returns the refreshed shares, in
/// party order, and how long each party computed.
pub fn refresh_in_memory<R: RngCore + CryptoRng>(
    shares: &[KeyShare],
    rng: &mut R,
) -> Result<(Vec<KeyShare>, Vec<Duration>), CustodyError> {
    let n = shares.first().map(|s| s.group.n).unwrap_or(0) as usize;
    let mut spent = vec![Duration::ZERO; n];
    let mut parties = Vec::with_capacity(n);
    let mut round1 = BTreeMap::new();
    for old in shares {
        if old.group != shares[0].group || old.party == 0 || old.party as usize > n {
            return Err(CustodyError::BadParameters(
                "a refresh needs the shares of one key".into(),
            ));
        }
        let s = Instant::now();
        let (party, msg) = DkgParty::start_refresh(old, rng)?;
        spent[old.party as usize - 1] += s.elapsed();
        if round1.insert(party.party(), msg).is_some() {
            return Err(CustodyError::BadParameters(format!(
                "two shares of party {}",
                old.party
            )));
        }
        parties.push(party);
    }
    if round1.len() != n {
        return Err(CustodyError::BadParameters(
            "a refresh needs the share of every party".into(),
        ));
    }
    let (mut out, spent) = finish_in_memory(parties, round1, spent)?;
    out.sort_by_key(|s| s.party);
    Ok((out, spent))
}

/// Rounds 2 and 3 of an in-memory run; `spent` is indexed like `parties`.
fn finish_in_memory(
    mut parties: Vec<DkgParty>,
    round1: BTreeMap<PartyId, Vec<u8>>,
    mut spent: Vec<Duration>,
) -> Result<(Vec<KeyShare>, Vec<Duration>), CustodyError> {
    let others = |me: PartyId, m: &BTreeMap<PartyId, Vec<u8>>| -> BTreeMap<PartyId, Vec<u8>> {
        m.iter()
            .filter(|(p, _)| **p != me)
            .map(|(p, v)| (*p, v.clone()))
            .collect()
    };
    let mut echoes = BTreeMap::new();
    let mut direct: BTreeMap<PartyId, BTreeMap<PartyId, Vec<u8>>> = BTreeMap::new();
    for party in parties.iter_mut() {
        let me = party.party();
        let mine = others(me, &round1);
        let s = Instant::now();
        let out = party.round2(&mine)?;
        spent[me as usize - 1] += s.elapsed();
        echoes.insert(me, out.echo);
        for (to, m) in out.direct {
            direct.entry(to).or_default().insert(me, m.to_vec());
        }
    }
    let mut shares = Vec::with_capacity(parties.len());
    for party in parties.iter_mut() {
        let me = party.party();
        let e = others(me, &echoes);
        let d = direct.remove(&me).unwrap_or_default();
        let s = Instant::now();
        shares.push(party.finish(&e, &d)?);
        spent[me as usize - 1] += s.elapsed();
    }
    Ok((shares, spent))
}

// ---------------------------------------------------------------------------------------------
// Import and export

/// The Ed25519 signing scalar of a 32-byte seed (RFC 8032: SHA-512, clamp, reduce).
fn seed_scalar(seed: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let h = Sha512::digest(seed);
    let mut a = Zeroizing::new([0u8; 32]);
    a.copy_from_slice(&h[..32]);
    a[0] &= 248;
    a[31] &= 127;
    a[31] |= 64;
    Zeroizing::new(Scalar::from_bytes_mod_order(*a).to_bytes())
}

fn split_key<R: RngCore + CryptoRng>(
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

// ---------------------------------------------------------------------------------------------
// Signing

/// The secret mixed into every nonce a node makes. RFC 9591 (section 4.1) hedges each nonce
/// against a weak random generator by hashing the signing share in with fresh randomness.
/// A FROST nonce is not tied to a key (the binding factor ties each signature to its group
/// key, message and signer set), so one pool per node serves all its keys: the pool's size
/// follows the node's signing rate, not how many custodial keys it holds. The pool hashes
/// in a node-wide secret instead of one key's share.
pub struct NonceHedge(frost::keys::SigningShare);

impl NonceHedge {
    /// A hedge derived from a node secret (any length; the node uses its key-encryption key).
    pub fn derive(secret: &[u8]) -> Result<NonceHedge, CustodyError> {
        let wide: [u8; 64] = Sha512::new()
            .chain_update(b"florin/custody/nonce-hedge/v1")
            .chain_update(secret)
            .finalize()
            .into();
        let s = Zeroizing::new(Scalar::from_bytes_mod_order_wide(&wide).to_bytes());
        frost::keys::SigningShare::deserialize(&s[..])
            .map(NonceHedge)
            .map_err(frost_err)
    }
}

impl KeyShare {
    /// A hedge made from this share, as RFC 9591 does for nonces used with one key.
    pub fn nonce_hedge(&self) -> NonceHedge {
        NonceHedge(*self.key_package.signing_share())
    }
}

/// A node's nonces made ahead of time ("presignatures" in FROST's sense: round one of
/// signing, done before the message is known). Each nonce is handed out once with an id and
/// removed when it signs, so no nonce ever signs twice; nonces live only in memory, so a
/// restarted node cannot reuse one either (its old ids are simply unknown).
///
/// A commitment travels as 64 bytes: the hiding then the binding nonce's point, compressed.
pub struct NoncePool {
    ready: VecDeque<(frost::round1::SigningNonces, [u8; 64])>,
    issued: BTreeMap<u64, IssuedNonce>,
    next_id: u64,
    max_issued: usize,
}

/// A batch of nonces made by [`NoncePool::generate`], outside any lock.
pub type NonceBatch = Vec<(frost::round1::SigningNonces, [u8; 64])>;

/// A nonce taken back from the pool to sign with: the secret nonces and the commitment bytes
/// the pool handed out for them.
pub struct IssuedNonce {
    nonces: frost::round1::SigningNonces,
    commitment: [u8; 64],
}

fn commitment_bytes(c: &frost::round1::SigningCommitments) -> Option<[u8; 64]> {
    let h = c.hiding().serialize().ok()?;
    let b = c.binding().serialize().ok()?;
    let mut out = [0u8; 64];
    out.get_mut(..32)?.copy_from_slice(h.get(..32)?);
    out.get_mut(32..)?.copy_from_slice(b.get(..32)?);
    Some(out)
}

impl NoncePool {
    /// An empty pool. `first_id` should be random, so ids of a previous run never match.
    /// At most `max_issued` handed-out nonces wait for their signing request; older ones are
    /// dropped (a coordinator that asked for more than it used gets [`CustodyError::UnknownNonce`]
    /// and asks again).
    pub fn new(first_id: u64, max_issued: usize) -> NoncePool {
        NoncePool {
            ready: VecDeque::new(),
            issued: BTreeMap::new(),
            next_id: first_id,
            max_issued: max_issued.max(1),
        }
    }

    /// Makes `count` nonces hedged with `hedge` (two base-point multiplications each).
    pub fn generate<R: RngCore + CryptoRng>(
        hedge: &NonceHedge,
        count: usize,
        rng: &mut R,
    ) -> NonceBatch {
        (0..count)
            .filter_map(|_| {
                let (nonces, commitments) = frost::round1::commit(&hedge.0, &mut *rng);
                // Only an identity point fails to encode (probability 2^-252): skip it.
                commitment_bytes(&commitments).map(|b| (nonces, b))
            })
            .collect()
    }

    /// Adds generated nonces.
    pub fn add(&mut self, batch: NonceBatch) {
        self.ready.extend(batch);
    }

    /// Nonces ready to hand out.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Drops ready nonces beyond `keep` (never handed out, so no one waits for them; they
    /// are wiped as they drop). Returns how many were dropped.
    pub fn trim(&mut self, keep: usize) -> usize {
        let extra = self.ready.len().saturating_sub(keep);
        self.ready.truncate(keep);
        extra
    }

    /// Hands out up to `count` ready nonces' commitments, each with its id.
    pub fn issue(&mut self, count: usize) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::with_capacity(count.min(self.ready.len()));
        while out.len() < count {
            let Some((nonces, commitment)) = self.ready.pop_front() else {
                break;
            };
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            self.issued.insert(id, IssuedNonce { nonces, commitment });
            out.push((id, commitment.to_vec()));
        }
        while self.issued.len() > self.max_issued {
            self.issued.pop_first();
        }
        out
    }

    /// Removes and returns the nonce handed out as `id`.
    pub fn take(&mut self, id: u64) -> Result<IssuedNonce, CustodyError> {
        self.issued
            .remove(&id)
            .ok_or(CustodyError::UnknownNonce(id))
    }
}

/// A commitment's two points, decompressed without the prime-order check (cheap; for the
/// coordinator, which verifies the final signature instead).
fn decode_unchecked(
    p: PartyId,
    b: &[u8],
) -> Result<frost::round1::SigningCommitments, CustodyError> {
    let bad = || CustodyError::Misbehaved {
        party: p,
        reason: "malformed nonce commitment".into(),
    };
    if b.len() != 64 {
        return Err(bad());
    }
    let point = |s: &[u8]| -> Result<frost::round1::NonceCommitment, CustodyError> {
        let c = curve25519_dalek::edwards::CompressedEdwardsY::from_slice(s).map_err(|_| bad())?;
        let e = c.decompress().ok_or_else(bad)?;
        Ok(frost::round1::NonceCommitment::new(e))
    };
    Ok(frost::round1::SigningCommitments::new(
        point(&b[..32])?,
        point(&b[32..])?,
    ))
}

/// A commitment's two points, fully checked as RFC 9591 requires (canonical, not the
/// identity, in the prime-order subgroup: a scalar multiplication per point).
fn decode_checked(p: PartyId, b: &[u8]) -> Result<frost::round1::SigningCommitments, CustodyError> {
    let bad = |what: &str| CustodyError::Misbehaved {
        party: p,
        reason: format!("malformed nonce commitment ({what})"),
    };
    if b.len() != 64 {
        return Err(bad("length"));
    }
    let h =
        frost::round1::NonceCommitment::deserialize(&b[..32]).map_err(|e| bad(&e.to_string()))?;
    let g =
        frost::round1::NonceCommitment::deserialize(&b[32..]).map_err(|e| bad(&e.to_string()))?;
    Ok(frost::round1::SigningCommitments::new(h, g))
}

#[derive(Serialize, Deserialize)]
struct PackageWire {
    commitments: Vec<(PartyId, Vec<u8>)>,
    message: Vec<u8>,
}

/// What a coordinator sends the chosen nodes: the message and each chosen node's commitment
/// bytes as its node handed them out. Each node checks the others' commitments in full
/// before it signs; the coordinator only decompresses them (for the group commitment) and
/// relies on verifying the final signature, falling back to full checks and per-share
/// verification to name a culprit when that fails.
#[derive(Clone)]
pub struct SigningPackage {
    commitments: BTreeMap<PartyId, Vec<u8>>,
    message: Vec<u8>,
    /// Coordinator side: the commitments decompressed (not subgroup-checked).
    unchecked: Option<frost::SigningPackage>,
}

impl SigningPackage {
    /// Builds the package from each chosen party's commitment bytes (from
    /// [`NoncePool::issue`]). A commitment that does not decode names its party.
    pub fn new(
        commitments: &BTreeMap<PartyId, Vec<u8>>,
        msg: &[u8],
    ) -> Result<SigningPackage, CustodyError> {
        let mut m = BTreeMap::new();
        for (&p, bytes) in commitments {
            m.insert(ident(p)?, decode_unchecked(p, bytes)?);
        }
        Ok(SigningPackage {
            commitments: commitments.clone(),
            message: msg.to_vec(),
            unchecked: Some(frost::SigningPackage::new(m, msg)),
        })
    }

    /// Encodes for the wire.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CustodyError> {
        let w = PackageWire {
            commitments: self
                .commitments
                .iter()
                .map(|(p, c)| (*p, c.clone()))
                .collect(),
            message: self.message.clone(),
        };
        postcard::to_allocvec(&w).map_err(|e| CustodyError::Frost(e.to_string()))
    }

    /// Decodes [`SigningPackage::to_bytes`] (the commitments are checked when signing).
    pub fn from_bytes(b: &[u8]) -> Result<SigningPackage, CustodyError> {
        let w: PackageWire =
            postcard::from_bytes(b).map_err(|_| CustodyError::malformed("signing package"))?;
        let mut commitments = BTreeMap::new();
        for (p, c) in w.commitments {
            if commitments.insert(p, c).is_some() {
                return Err(CustodyError::malformed("signing package (a party twice)"));
            }
        }
        Ok(SigningPackage {
            commitments,
            message: w.message,
            unchecked: None,
        })
    }

    /// The message being signed.
    pub fn message(&self) -> &[u8] {
        &self.message
    }

    /// The parties whose commitments it carries.
    pub fn parties(&self) -> impl Iterator<Item = PartyId> + '_ {
        self.commitments.keys().copied()
    }

    /// Checks `party`'s commitment in full (a coordinator does this to judge a node that
    /// refused to sign and blamed `party`): `Err(Misbehaved)` when it is bad.
    pub fn check_commitment(&self, party: PartyId) -> Result<(), CustodyError> {
        let b = self
            .commitments
            .get(&party)
            .ok_or_else(|| CustodyError::BadParameters(format!("party {party} not in package")))?;
        decode_checked(party, b).map(|_| ())
    }

    /// FROST's package with every commitment fully checked; `own` stands in for this
    /// node's commitment (already trusted) when given.
    fn checked(
        &self,
        own: Option<(PartyId, &IssuedNonce)>,
    ) -> Result<frost::SigningPackage, CustodyError> {
        let mut m = BTreeMap::new();
        for (&p, bytes) in &self.commitments {
            let c = match own {
                Some((me, nonce)) if me == p => {
                    if bytes[..] != nonce.commitment[..] {
                        return Err(CustodyError::BadParameters(
                            "the package does not carry the commitment of the nonce it names"
                                .into(),
                        ));
                    }
                    *nonce.nonces.commitments()
                }
                _ => decode_checked(p, bytes)?,
            };
            m.insert(ident(p)?, c);
        }
        Ok(frost::SigningPackage::new(m, &self.message))
    }
}

/// A node's signature share: signs `package` with the nonce it handed out (taken from its
/// pool) and its key share, after checking every other party's commitment in full. Refuses
/// a package whose commitment for this node is not the one this nonce made.
pub fn sign_share(
    share: &KeyShare,
    nonce: &IssuedNonce,
    package: &SigningPackage,
) -> Result<Vec<u8>, CustodyError> {
    let full = package.checked(Some((share.party, nonce)))?;
    frost::round2::sign(&full, &nonce.nonces, &share.key_package)
        .map(|s| s.serialize())
        .map_err(frost_err)
}

/// The signature from the shares without checking them one by one: R from the decompressed
/// commitments, z the sum of the shares. `None` when anything does not fit; the caller
/// verifies the result.
fn aggregate_fast(
    group: &GroupKey,
    package: &frost::SigningPackage,
    shares: &BTreeMap<PartyId, Vec<u8>>,
) -> Option<Signature> {
    let vk = group.package.verifying_key();
    let binding = frost_core::compute_binding_factor_list(package, vk, &[]).ok()?;
    let r = frost_core::compute_group_commitment(package, &binding)
        .ok()?
        .to_element();
    let mut z = Scalar::ZERO;
    for s in shares.values() {
        let b: [u8; 32] = s.as_slice().try_into().ok()?;
        z += Option::<Scalar>::from(Scalar::from_canonical_bytes(b))?;
    }
    let mut out = [0u8; 64];
    out[..32].copy_from_slice(r.compress().as_bytes());
    out[32..].copy_from_slice(z.as_bytes());
    Some(Signature(out))
}

/// Combines the chosen parties' signature shares into one Ed25519 signature, verified with
/// Florin's own verifier (the ledger's). When the shares do not make a valid signature,
/// every commitment and share is checked in full and the party that sent a bad one is named
/// ([`CustodyError::Misbehaved`]).
pub fn aggregate(
    group: &GroupKey,
    package: &SigningPackage,
    shares: &BTreeMap<PartyId, Vec<u8>>,
) -> Result<Signature, CustodyError> {
    let mut m = BTreeMap::new();
    for (&p, bytes) in shares {
        let s = frost::round2::SignatureShare::deserialize(bytes).map_err(|_| {
            CustodyError::Misbehaved {
                party: p,
                reason: "malformed signature share".into(),
            }
        })?;
        m.insert(ident(p)?, s);
    }
    if m.len() < group.t as usize {
        return Err(CustodyError::TooFewParties {
            have: m.len(),
            need: group.t as usize,
        });
    }
    if shares.keys().ne(package.commitments.keys()) {
        return Err(CustodyError::BadParameters(
            "signature shares from other parties than the package's".into(),
        ));
    }
    let pk = group.public_key();
    if let Some(unchecked) = &package.unchecked {
        if let Some(sig) = aggregate_fast(group, unchecked, shares) {
            if florin_crypto::verify(&pk, &package.message, &sig).is_ok() {
                return Ok(sig);
            }
        }
    }
    // Slow path: full checks, then FROST's own aggregation, which verifies each share when
    // the sum does not verify and names the first bad one.
    let full = package.checked(None)?;
    let sig = frost::aggregate(&full, &m, &group.package)
        .map_err(|e| culprit_err(e, "invalid signature share"))?;
    let b = sig.serialize().map_err(frost_err)?;
    let out: [u8; 64] = b
        .as_slice()
        .try_into()
        .map_err(|_| CustodyError::Frost("signature is not 64 bytes".into()))?;
    let sig = Signature(out);
    florin_crypto::verify(&pk, &package.message, &sig)
        .map_err(|e| CustodyError::Frost(format!("aggregate signature does not verify: {e}")))?;
    Ok(sig)
}

// ---------------------------------------------------------------------------------------------
// Share repair

/// Checks a repair's party set: `helpers` distinct parties of the group, at least t of them,
/// `target` a party of the group that is not a helper.
fn check_repair(
    group: &GroupKey,
    helpers: &[PartyId],
    target: PartyId,
) -> Result<(), CustodyError> {
    let mut sorted = helpers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != helpers.len()
        || helpers.len() < group.t as usize
        || helpers.iter().any(|&h| h == 0 || h > group.n)
    {
        return Err(CustodyError::BadParameters(format!(
            "repair helpers {helpers:?}: at least {} distinct parties of {}",
            group.t, group.n
        )));
    }
    if target == 0 || target > group.n || helpers.contains(&target) {
        return Err(CustodyError::BadParameters(format!(
            "repair of party {target} by {helpers:?}"
        )));
    }
    Ok(())
}

/// Share repair, step 1, at each helper (the repairable threshold scheme of Laing and Stinson,
/// as `frost-core` implements it): splits this helper's Lagrange-weighted share into random
/// deltas, one per helper (this one included), that add up to it. Each delta is secret: seal
/// it to its helper. No helper, and not the coordinator, learns a share.
pub fn repair_deltas<R: RngCore + CryptoRng>(
    share: &KeyShare,
    helpers: &[PartyId],
    target: PartyId,
    rng: &mut R,
) -> Result<BTreeMap<PartyId, Zeroizing<Vec<u8>>>, CustodyError> {
    check_repair(&share.group, helpers, target)?;
    if !helpers.contains(&share.party) {
        return Err(CustodyError::BadParameters(format!(
            "party {} is not a helper of {helpers:?}",
            share.party
        )));
    }
    let ids = helpers
        .iter()
        .map(|&h| ident(h))
        .collect::<Result<Vec<_>, _>>()?;
    let deltas = frost_core::keys::repairable::repair_share_part1(
        &ids,
        &share.key_package,
        rng,
        ident(target)?,
    )
    .map_err(frost_err)?;
    Ok(deltas
        .iter()
        .map(|(id, d)| (party_of(id), Zeroizing::new(d.serialize())))
        .collect())
}

/// Decodes one value from each party; bytes that do not decode name their sender.
fn decode_each<T, E>(
    from: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
    what: &str,
    decode: impl Fn(&[u8]) -> Result<T, E>,
) -> Result<Vec<T>, CustodyError> {
    from.iter()
        .map(|(&p, bytes)| {
            decode(bytes).map_err(|_| CustodyError::Misbehaved {
                party: p,
                reason: format!("malformed {what}"),
            })
        })
        .collect()
}

/// Share repair, step 2, at each helper: adds the deltas addressed to it, one from every
/// helper, into its sigma for the target (secret: seal it to the target).
pub fn repair_sigma(
    deltas: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
) -> Result<Zeroizing<Vec<u8>>, CustodyError> {
    let list = decode_each(
        deltas,
        "repair delta",
        frost::keys::repairable::Delta::deserialize,
    )?;
    Ok(Zeroizing::new(
        frost::keys::repairable::repair_share_part2(&list).serialize(),
    ))
}

/// Share repair, step 3, at the target: adds every helper's sigma into the lost share and
/// checks it against the group's public share for the target, so a wrong value from any
/// helper fails the repair instead of storing a share that cannot sign.
pub fn repair_finish(
    group: &GroupKey,
    target: PartyId,
    sigmas: &BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
) -> Result<KeyShare, CustodyError> {
    let helpers: Vec<PartyId> = sigmas.keys().copied().collect();
    check_repair(group, &helpers, target)?;
    let list = decode_each(
        sigmas,
        "repair sigma",
        frost::keys::repairable::Sigma::deserialize,
    )?;
    let id = ident(target)?;
    let key_package = frost::keys::repairable::repair_share_part3(&list, id, &group.package)
        .map_err(frost_err)?;
    let expected = group
        .package
        .verifying_shares()
        .get(&id)
        .ok_or_else(|| CustodyError::malformed("group key"))?;
    if &frost::keys::VerifyingShare::from(*key_package.signing_share()) != expected {
        return Err(CustodyError::Inconsistent(format!(
            "the repaired share does not match party {target}'s public share: a helper sent a wrong value"
        )));
    }
    Ok(KeyShare {
        party: target,
        key_package,
        group: group.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_crypto::{verify, SecretKey};
    use rand::rngs::OsRng;

    type R<T> = Result<T, CustodyError>;

    fn dkg(t: u16, n: u16) -> R<Vec<KeyShare>> {
        Ok(dkg_in_memory("k", t, n, &mut OsRng)?.0)
    }

    fn sign_with(shares: &[&KeyShare], msg: &[u8]) -> R<Signature> {
        let mut pools: Vec<NoncePool> = shares.iter().map(|_| NoncePool::new(7, 100)).collect();
        let mut commitments = BTreeMap::new();
        let mut ids = Vec::new();
        for (s, pool) in shares.iter().zip(pools.iter_mut()) {
            pool.add(NoncePool::generate(&s.nonce_hedge(), 2, &mut OsRng));
            let (id, c) = pool.issue(1).remove(0);
            ids.push(id);
            commitments.insert(s.party(), c);
        }
        let package = SigningPackage::new(&commitments, msg)?;
        let wire = SigningPackage::from_bytes(&package.to_bytes()?)?;
        let mut out = BTreeMap::new();
        for ((s, pool), id) in shares.iter().zip(pools.iter_mut()).zip(ids) {
            let nonces = pool.take(id)?;
            out.insert(s.party(), sign_share(s, &nonces, &wire)?);
            // A nonce signs once.
            assert!(matches!(pool.take(id), Err(CustodyError::UnknownNonce(_))));
        }
        aggregate(shares[0].group(), &package, &out)
    }

    #[test]
    fn any_t_of_n_sign_and_plain_ed25519_verifies() -> R<()> {
        let shares = dkg(2, 3)?;
        let pk = shares[0].group().public_key();
        assert!(shares.iter().all(|s| s.group().public_key() == pk));
        for pair in [[0, 1], [0, 2], [1, 2]] {
            let msg = format!("pair {pair:?}");
            let sig = sign_with(&[&shares[pair[0]], &shares[pair[1]]], msg.as_bytes())?;
            assert!(verify(&pk, msg.as_bytes(), &sig).is_ok());
            // ed25519-dalek's strict verification, independent of Florin's verifier.
            let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk.0)
                .map_err(|e| CustodyError::Frost(e.to_string()))?;
            assert!(vk
                .verify_strict(
                    msg.as_bytes(),
                    &ed25519_dalek::Signature::from_bytes(&sig.0)
                )
                .is_ok());
        }
        // All three sign too.
        let sig = sign_with(&[&shares[0], &shares[1], &shares[2]], b"all")?;
        assert!(verify(&pk, b"all", &sig).is_ok());
        Ok(())
    }

    #[test]
    fn one_node_nonce_pool_serves_every_key() -> R<()> {
        // Two keys on the same two nodes; each node has one pool hedged with a node secret.
        let a = dkg(2, 3)?;
        let b = dkg(2, 3)?;
        let hedges = [
            NonceHedge::derive(b"node 1")?,
            NonceHedge::derive(b"node 2")?,
        ];
        let mut pools = [NoncePool::new(10, 100), NoncePool::new(20, 100)];
        for (h, pool) in hedges.iter().zip(pools.iter_mut()) {
            pool.add(NoncePool::generate(h, 4, &mut OsRng));
        }
        for (round, key) in [&a, &b, &a, &b].into_iter().enumerate() {
            let msg = format!("payment {round}");
            let mut commitments = BTreeMap::new();
            let mut ids = Vec::new();
            for (s, pool) in key[..2].iter().zip(pools.iter_mut()) {
                let (id, c) = pool.issue(1).remove(0);
                ids.push(id);
                commitments.insert(s.party(), c);
            }
            let package = SigningPackage::new(&commitments, msg.as_bytes())?;
            let mut out = BTreeMap::new();
            for ((s, pool), id) in key[..2].iter().zip(pools.iter_mut()).zip(ids) {
                out.insert(s.party(), sign_share(s, &pool.take(id)?, &package)?);
            }
            let sig = aggregate(key[0].group(), &package, &out)?;
            let pk = key[0].group().public_key();
            assert!(verify(&pk, msg.as_bytes(), &sig).is_ok());
        }
        assert_eq!(pools[0].ready(), 0);
        // A nonce handed out for one key and then offered a package with another node's
        // commitment in its place is refused (the package must carry this nonce's commitment).
        pools[0].add(NoncePool::generate(&hedges[0], 2, &mut OsRng));
        let (id, _) = pools[0].issue(1).remove(0);
        let (_, other) = pools[0].issue(1).remove(0);
        let mut commitments = BTreeMap::new();
        commitments.insert(a[0].party(), other);
        let mut p2 = NoncePool::new(30, 10);
        p2.add(NoncePool::generate(&hedges[1], 1, &mut OsRng));
        commitments.insert(a[1].party(), p2.issue(1).remove(0).1);
        let package = SigningPackage::new(&commitments, b"m")?;
        assert!(sign_share(&a[0], &pools[0].take(id)?, &package).is_err());
        Ok(())
    }

    /// Parties 1 and 2 of `shares` each hand out one commitment (nonce id 1).
    fn first_two_commit(shares: &[KeyShare]) -> ([NoncePool; 2], BTreeMap<PartyId, Vec<u8>>) {
        let mut pools = [NoncePool::new(1, 10), NoncePool::new(1, 10)];
        let mut commitments = BTreeMap::new();
        for (s, pool) in shares[..2].iter().zip(pools.iter_mut()) {
            pool.add(NoncePool::generate(&s.nonce_hedge(), 1, &mut OsRng));
            commitments.insert(s.party(), pool.issue(1).remove(0).1);
        }
        (pools, commitments)
    }

    /// Parties 1 and 2 sign `package` with the nonces from [`first_two_commit`].
    fn first_two_sign(
        shares: &[KeyShare],
        pools: &mut [NoncePool; 2],
        package: &SigningPackage,
    ) -> R<BTreeMap<PartyId, Vec<u8>>> {
        let mut out = BTreeMap::new();
        for (s, pool) in shares[..2].iter().zip(pools.iter_mut()) {
            out.insert(s.party(), sign_share(s, &pool.take(1)?, package)?);
        }
        Ok(out)
    }

    /// Party 2's commitment with the point at byte `at` (0: hiding, 32: binding) moved off
    /// the prime-order subgroup by adding the 8-torsion point `which`.
    fn with_torsion(
        commitments: &BTreeMap<PartyId, Vec<u8>>,
        at: usize,
        which: usize,
    ) -> R<BTreeMap<PartyId, Vec<u8>>> {
        let mut out = commitments.clone();
        let bytes = out.get_mut(&2).ok_or(CustodyError::Frost("2".into()))?;
        let p = curve25519_dalek::edwards::CompressedEdwardsY::from_slice(&bytes[at..at + 32])
            .ok()
            .and_then(|c| c.decompress())
            .ok_or(CustodyError::Frost("commitment".into()))?;
        let mixed = (p + curve25519_dalek::constants::EIGHT_TORSION[which]).compress();
        bytes[at..at + 32].copy_from_slice(mixed.as_bytes());
        Ok(out)
    }

    #[test]
    fn bad_commitments_name_their_sender() -> R<()> {
        let shares = dkg(2, 3)?;
        let (mut pools, commitments) = first_two_commit(&shares);
        // Party 2's hiding commitment plus a point of order 2: it still decompresses, so the
        // coordinator's cheap decoding takes it, but the signing node's full check refuses
        // and names party 2.
        let torsion = with_torsion(&commitments, 0, 4)?;
        let package = SigningPackage::new(&torsion, b"m")?;
        let wire = SigningPackage::from_bytes(&package.to_bytes()?)?;
        match sign_share(&shares[0], &pools[0].take(1)?, &wire) {
            Err(CustodyError::Misbehaved { party: 2, .. }) => {}
            other => panic!("expected party 2 named, got {other:?}"),
        }
        // Bytes that are not a point, or not 64 of them, are refused by the coordinator.
        let off_curve = (2u8..=255)
            .map(|y| {
                let mut b = [0u8; 32];
                b[0] = y;
                b
            })
            .find(|b| {
                curve25519_dalek::edwards::CompressedEdwardsY(*b)
                    .decompress()
                    .is_none()
            })
            .ok_or(CustodyError::Frost("no off-curve y".into()))?;
        for bad in [[off_curve, off_curve].concat(), vec![1; 10]] {
            let mut c = commitments.clone();
            c.insert(2, bad);
            assert!(matches!(
                SigningPackage::new(&c, b"m"),
                Err(CustodyError::Misbehaved { party: 2, .. })
            ));
        }
        // A package that does not decode, or names a party twice.
        assert!(SigningPackage::from_bytes(&[1, 2, 3]).is_err());
        let twice = PackageWire {
            commitments: vec![(1, vec![0; 64]), (1, vec![0; 64])],
            message: b"m".to_vec(),
        };
        let b = postcard::to_allocvec(&twice).map_err(|e| CustodyError::Frost(e.to_string()))?;
        assert!(SigningPackage::from_bytes(&b).is_err());
        Ok(())
    }

    #[test]
    fn aggregate_with_a_bad_commitment_names_its_sender() -> R<()> {
        // A coordinator whose package carries a mixed-order commitment from party 2 (which the
        // honest node would refuse to sign; here both "sign" the honest package and the
        // coordinator aggregates against the tampered one): the fast path's signature does
        // not verify, and the full check names party 2.
        let shares = dkg(2, 3)?;
        let (mut pools, commitments) = first_two_commit(&shares);
        let package = SigningPackage::new(&commitments, b"m")?;
        let out = first_two_sign(&shares, &mut pools, &package)?;
        assert!(aggregate(shares[0].group(), &package, &out).is_ok());
        let torsion = with_torsion(&commitments, 32, 2)?;
        let tampered = SigningPackage::new(&torsion, b"m")?;
        match aggregate(shares[0].group(), &tampered, &out) {
            Err(CustodyError::Misbehaved { party: 2, .. }) => {}
            other => panic!("expected party 2 named, got {other:?}"),
        }
        // Shares from parties the package does not name are refused.
        let mut stray = out.clone();
        let v = stray.remove(&2).ok_or(CustodyError::Frost("2".into()))?;
        stray.insert(3, v);
        assert!(aggregate(shares[0].group(), &package, &stray).is_err());
        Ok(())
    }

    #[test]
    fn t_minus_one_cannot_sign_or_export() -> R<()> {
        let shares = dkg(3, 5)?;
        let err = sign_with(&[&shares[0], &shares[1]], b"m");
        assert!(err.is_err(), "two of a 3-of-5 key signed");
        assert!(matches!(
            reconstruct(&shares[..2]),
            Err(CustodyError::TooFewParties { have: 2, need: 3 })
        ));
        // The same share twice is still one party.
        assert!(matches!(
            reconstruct(&[shares[0].clone(), shares[0].clone(), shares[1].clone()]),
            Err(CustodyError::TooFewParties { .. })
        ));
        Ok(())
    }

    #[test]
    fn corrupted_signature_share_names_its_sender() -> R<()> {
        let shares = dkg(2, 3)?;
        let (mut pools, commitments) = first_two_commit(&shares);
        let package = SigningPackage::new(&commitments, b"m")?;
        let out = first_two_sign(&shares, &mut pools, &package)?;
        // Party 2's share is replaced by another valid scalar.
        let mut bad = out.clone();
        let mut b = bad[&2].clone();
        b[0] ^= 1;
        bad.insert(2, b);
        match aggregate(shares[0].group(), &package, &bad) {
            Err(CustodyError::Misbehaved { party: 2, .. }) => {}
            other => panic!("expected party 2 named, got {other:?}"),
        }
        // Bytes that are not a scalar at all.
        bad.insert(1, vec![0xff; 32]);
        assert!(matches!(
            aggregate(shares[0].group(), &package, &bad),
            Err(CustodyError::Misbehaved { party: 1, .. })
        ));
        assert!(aggregate(shares[0].group(), &package, &out).is_ok());
        Ok(())
    }

    #[test]
    fn corrupted_dkg_share_names_its_sender() -> R<()> {
        let (t, n) = (2, 3);
        let mut parties = Vec::new();
        let mut r1 = BTreeMap::new();
        for p in 1..=n {
            let (party, msg) = DkgParty::start("k", p, t, n, &mut OsRng)?;
            parties.push(party);
            r1.insert(p, msg);
        }
        let others = |me: PartyId, m: &BTreeMap<PartyId, Vec<u8>>| -> BTreeMap<PartyId, Vec<u8>> {
            m.iter()
                .filter(|(p, _)| **p != me)
                .map(|(p, v)| (*p, v.clone()))
                .collect()
        };
        let mut echoes = BTreeMap::new();
        let mut to_one = BTreeMap::new();
        for party in parties.iter_mut() {
            let me = party.party();
            let out = party.round2(&others(me, &r1))?;
            echoes.insert(me, out.echo);
            if let Some(m) = out.direct.get(&1) {
                let mut m = m.to_vec();
                if me == 3 {
                    // Party 3 sends party 1 a share that does not match its commitment.
                    let pos = m.len() - 5;
                    m[pos] ^= 0x01;
                }
                to_one.insert(me, m);
            }
        }
        match parties[0].finish(&others(1, &echoes), &to_one) {
            Err(CustodyError::Misbehaved { party: 3, .. }) => Ok(()),
            other => panic!("expected party 3 named, got {other:?}"),
        }
    }

    #[test]
    fn equivocation_in_round_one_is_caught_by_the_echo() -> R<()> {
        let (t, n) = (2, 3);
        let mut parties = Vec::new();
        let mut r1 = BTreeMap::new();
        for p in 1..=n {
            let (party, msg) = DkgParty::start("k", p, t, n, &mut OsRng)?;
            parties.push(party);
            r1.insert(p, msg);
        }
        // Party 3 shows party 1 another round-1 package than the one party 2 sees.
        let (_, other3) = DkgParty::start("k", 3, t, n, &mut OsRng)?;
        let to1: BTreeMap<_, _> = [(2, r1[&2].clone()), (3, other3)].into();
        let to2: BTreeMap<_, _> = [(1, r1[&1].clone()), (3, r1[&3].clone())].into();
        parties[0].round2(&to1)?;
        let e2 = parties[1].round2(&to2)?.echo;
        let e3 = parties[2].round2(&[(1, r1[&1].clone()), (2, r1[&2].clone())].into())?;
        let echoes: BTreeMap<_, _> = [(2, e2), (3, e3.echo)].into();
        let direct: BTreeMap<_, _> = [(2, vec![0u8; 4]), (3, vec![0u8; 4])].into();
        match parties[0].finish(&echoes, &direct) {
            Err(CustodyError::Equivocation { culprit: 3, .. }) => Ok(()),
            other => panic!("expected equivocation by 3, got {other:?}"),
        }
    }

    #[test]
    fn import_then_export_round_trips_the_same_key() -> R<()> {
        let seed = [42u8; 32];
        let sk = SecretKey::from_seed(&seed);
        let (group, shares) = split_ed25519_seed("authority", &seed, 2, 3, &mut OsRng)?;
        assert_eq!(group.public_key(), sk.public_key());
        // Threshold signatures verify under the old key.
        let sig = sign_with(&[&shares[2], &shares[0]], b"token")?;
        assert!(verify(&sk.public_key(), b"token", &sig).is_ok());
        let scalar = reconstruct(&shares[1..])?;
        assert_eq!(scalar_public_key(&scalar)?, sk.public_key());
        assert_eq!(*scalar, *seed_scalar(&seed));
        // Re-import of the exported key's shares (split again) keeps the public key.
        let (again, _) = split_key(
            "authority",
            &SigningKey::deserialize(&scalar[..]).map_err(frost_err)?,
            3,
            5,
            &mut OsRng,
        )?;
        assert_eq!(again.public_key(), sk.public_key());
        Ok(())
    }

    #[test]
    fn shares_and_groups_round_trip_and_refuse_garbage() -> R<()> {
        let shares = dkg(2, 3)?;
        for s in &shares {
            assert_eq!(&KeyShare::from_bytes(&s.to_bytes())?, s);
            assert_eq!(&GroupKey::from_bytes(&s.group().to_bytes())?, s.group());
        }
        // A flipped bit in the secret share: it no longer matches its verifying share. (Found
        // by content, not offset: a flip elsewhere, e.g. in another party's verifying share,
        // can land on another valid point; at rest the vault's AEAD refuses those.)
        let mut b = shares[0].to_bytes().to_vec();
        let secret = shares[0].key_package.signing_share().serialize();
        let at = b
            .windows(secret.len())
            .position(|w| w == secret.as_slice())
            .ok_or_else(|| CustodyError::malformed("test: secret share not found"))?;
        b[at] ^= 0x01;
        assert!(KeyShare::from_bytes(&b).is_err());
        assert!(KeyShare::from_bytes(&[]).is_err());
        assert!(GroupKey::from_bytes(&[1, 2, 3]).is_err());
        // A share presented with another key's group is refused.
        let other = dkg(2, 3)?;
        let mixed = KeyShare {
            party: 1,
            key_package: shares[0].key_package.clone(),
            group: other[0].group().clone(),
        };
        assert!(KeyShare::from_bytes(&mixed.to_bytes()).is_err());
        Ok(())
    }

    #[test]
    fn dkg_refuses_bad_parameters_and_out_of_order_steps() -> R<()> {
        assert!(DkgParty::start("k", 1, 1, 3, &mut OsRng).is_err());
        assert!(DkgParty::start("k", 1, 4, 3, &mut OsRng).is_err());
        assert!(DkgParty::start("k", 4, 2, 3, &mut OsRng).is_err());
        let (mut p, _) = DkgParty::start("k", 1, 2, 3, &mut OsRng)?;
        assert!(matches!(
            p.finish(&BTreeMap::new(), &BTreeMap::new()),
            Err(CustodyError::OutOfOrder(_))
        ));
        // Missing party 3.
        let (_, m2) = DkgParty::start("k", 2, 2, 3, &mut OsRng)?;
        assert!(matches!(
            p.round2(&[(2, m2.clone())].into()),
            Err(CustodyError::OutOfOrder(_))
        ));
        // Garbage from party 3 names party 3.
        assert!(matches!(
            p.round2(&[(2, m2), (3, vec![1, 2, 3])].into()),
            Err(CustodyError::Misbehaved { party: 3, .. })
        ));
        Ok(())
    }
    /// Runs a repair of `target` by `helpers` in memory; `tamper` may change the deltas.
    fn repair(
        shares: &[KeyShare],
        helpers: &[PartyId],
        target: PartyId,
        tamper: impl Fn(PartyId, PartyId, &mut Zeroizing<Vec<u8>>),
    ) -> R<KeyShare> {
        let mut to: BTreeMap<PartyId, BTreeMap<PartyId, Zeroizing<Vec<u8>>>> = BTreeMap::new();
        for &h in helpers {
            let share = &shares[h as usize - 1];
            for (j, mut d) in repair_deltas(share, helpers, target, &mut OsRng)? {
                tamper(h, j, &mut d);
                to.entry(j).or_default().insert(h, d);
            }
        }
        let mut sigmas = BTreeMap::new();
        for (j, deltas) in &to {
            sigmas.insert(*j, repair_sigma(deltas)?);
        }
        repair_finish(shares[0].group(), target, &sigmas)
    }

    #[test]
    fn a_lost_share_is_repaired_by_t_helpers() -> R<()> {
        let shares = dkg(3, 5)?;
        let back = repair(&shares, &[1, 2, 4], 5, |_, _, _| {})?;
        assert_eq!(back.party(), 5);
        assert_eq!(back.to_bytes(), shares[4].to_bytes());
        // The repaired share signs with the others.
        let sig = sign_with(&[&back, &shares[0], &shares[2]], b"repaired")?;
        assert!(verify(&back.group().public_key(), b"repaired", &sig).is_ok());
        // A wrong delta from any helper fails the repair instead of giving a wrong share.
        let bad = repair(&shares, &[1, 2, 4], 5, |h, j, d| {
            if h == 2 && j == 4 {
                d[0] ^= 1;
            }
        });
        assert!(matches!(bad, Err(CustodyError::Inconsistent(_))), "{bad:?}");
        let garbled = repair(&shares, &[1, 2, 4], 5, |h, _, d| {
            if h == 4 {
                d.truncate(5);
            }
        });
        assert!(
            matches!(garbled, Err(CustodyError::Misbehaved { party: 4, .. })),
            "{garbled:?}"
        );
        // Too few helpers, a helper that is the target, duplicates, parties out of range.
        for (helpers, target) in [
            (vec![1, 2], 5),
            (vec![1, 2, 5], 5),
            (vec![1, 1, 2], 5),
            (vec![1, 2, 6], 5),
            (vec![1, 2, 3], 9),
        ] {
            assert!(
                matches!(
                    repair_deltas(&shares[0], &helpers, target, &mut OsRng),
                    Err(CustodyError::BadParameters(_))
                ),
                "{helpers:?} -> {target}"
            );
        }
        // A party that is not a helper does not take part.
        assert!(repair_deltas(&shares[2], &[1, 2, 4], 5, &mut OsRng).is_err());
        Ok(())
    }

    #[test]
    fn a_refresh_keeps_the_key_and_changes_every_share() -> R<()> {
        let old = dkg(3, 5)?;
        let (new, spent) = refresh_in_memory(&old, &mut OsRng)?;
        assert_eq!(spent.len(), 5);
        let pk = old[0].group().public_key();
        for (o, n) in old.iter().zip(&new) {
            assert_eq!(n.party(), o.party());
            assert_eq!(n.group().public_key(), pk);
            assert_ne!(n.key_package.signing_share(), o.key_package.signing_share());
            assert!(n.group().is_refresh_of(o.group()));
            assert_ne!(n.group().digest(), o.group().digest());
            // A refreshed share survives its own encoding and the check against its group.
            assert_eq!(&KeyShare::from_bytes(&n.to_bytes())?, n);
        }
        assert!(!old[0].group().is_refresh_of(old[0].group()));
        // Any t refreshed shares sign under the same public key.
        let sig = sign_with(&[&new[4], &new[0], &new[2]], b"after")?;
        assert!(verify(&pk, b"after", &sig).is_ok());
        // The secret is the same: reconstruction from new shares equals that from old.
        assert_eq!(reconstruct(&new[1..4])?, reconstruct(&old[..3])?);
        // Old and new shares do not combine, whichever group the coordinator holds.
        assert!(sign_with(&[&old[0], &new[1], &new[2]], b"mixed").is_err());
        assert!(sign_with(&[&new[0], &old[1], &old[2]], b"mixed").is_err());
        let mixed = [old[0].clone(), new[1].clone(), new[2].clone()];
        let back = reconstruct(&mixed);
        assert!(back.is_err() || back? != reconstruct(&old[..3])?);
        // A second refresh works from the first one's shares.
        let (again, _) = refresh_in_memory(&new, &mut OsRng)?;
        let sig = sign_with(&[&again[1], &again[3], &again[2]], b"twice")?;
        assert!(verify(&pk, b"twice", &sig).is_ok());
        // Shares of different keys, or a party missing, are refused.
        let other = dkg(3, 5)?;
        let stray = [
            old[0].clone(),
            old[1].clone(),
            other[2].clone(),
            old[3].clone(),
            old[4].clone(),
        ];
        assert!(refresh_in_memory(&stray, &mut OsRng).is_err());
        assert!(refresh_in_memory(&old[..4], &mut OsRng).is_err());
        Ok(())
    }

    /// Runs a refresh of `old` by hand; party 2 may send party 1 a key generation's round-1
    /// package (`tamper_round1`) or another party's share (`tamper_share`).
    fn refresh_with(old: &[KeyShare], tamper_round1: bool, tamper_share: bool) -> R<KeyShare> {
        let mut parties = Vec::new();
        let mut round1 = BTreeMap::new();
        for s in old {
            let (p, m) = DkgParty::start_refresh(s, &mut OsRng)?;
            round1.insert(s.party(), m);
            parties.push(p);
        }
        let mut to_one = round1.clone();
        to_one.remove(&1);
        if tamper_round1 {
            // A key generation's round-1 package: a commitment with a constant term.
            let (_, fresh) = DkgParty::start("k", 2, old[0].group().threshold(), 3, &mut OsRng)?;
            to_one.insert(2, fresh);
        }
        let mut first = parties.remove(0);
        first.round2(&to_one)?;
        let mut echoes = BTreeMap::new();
        let mut direct = BTreeMap::new();
        for p in parties.iter_mut() {
            let mut mine = round1.clone();
            mine.remove(&p.party());
            let out = p.round2(&mine)?;
            echoes.insert(p.party(), out.echo);
            let mut d = out.direct.get(&1).map(|d| d.to_vec()).unwrap_or_default();
            if tamper_share && p.party() == 2 {
                // Another party's share, valid bytes, wrong value.
                d = out.direct.get(&3).map(|d| d.to_vec()).unwrap_or_default();
            }
            direct.insert(p.party(), d);
        }
        first.finish(&echoes, &direct)
    }

    #[test]
    fn a_bad_refresh_share_or_commitment_names_its_sender() -> R<()> {
        let old = dkg(2, 3)?;
        let honest = refresh_with(&old, false, false)?;
        assert_eq!(honest.group().public_key(), old[0].group().public_key());
        match refresh_with(&old, false, true) {
            Err(CustodyError::Misbehaved { party: 2, reason }) => {
                assert!(reason.contains("refresh share"), "{reason}")
            }
            other => panic!("a wrong refresh share: {other:?}"),
        }
        match refresh_with(&old, true, false) {
            Err(CustodyError::Misbehaved { party: 2, reason }) => {
                assert!(reason.contains("degree"), "{reason}")
            }
            other => panic!("a commitment with a constant term: {other:?}"),
        }
        Ok(())
    }
}

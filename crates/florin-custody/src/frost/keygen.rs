//! Distributed key generation.

use super::*;

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

//! Signing.

use super::*;

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
pub(super) struct PackageWire {
    pub(super) commitments: Vec<(PartyId, Vec<u8>)>,
    pub(super) message: Vec<u8>,
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

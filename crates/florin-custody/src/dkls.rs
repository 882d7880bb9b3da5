//! Threshold ECDSA on P-256 with DKLs23 ("Threshold ECDSA in Three Rounds", Doerner, Kondi,
//! Lee, shelat 2023), the OT-based engine beside CGGMP24 ([`crate::ecdsa`]).
//!
//! Library: `dkls23-core =0.6.2` (0xCarbon) on RustCrypto's `p256 =0.14.0`, pinned exactly:
//! young and unaudited. (Its `dkls23-secp256r1` wrapper adds only type aliases and blockchain
//! address formats.) The signatures are ordinary ECDSA-P256-SHA256 (`r ‖ s`, low-S), the
//! same bytes the CGGMP24 engine and `p256::ecdsa::SigningKey` give.
//!
//! **Why a second engine.** CGGMP24 needs Paillier keys (minutes of prime search per node) and
//! costs 1.6–2.5 s of CPU per presignature at the production level here. DKLs23 needs no
//! Paillier: its two-party multiplications run on oblivious transfer (OT) set up once per pair of
//! parties at key generation, and a 2-of-3 signature costs milliseconds.
//!
//! **What it gives up (choose per key).**
//! - *Security model*: static corruption (the adversary picks its parties before the key is
//!   made), as the paper proves; CGGMP24 is proven against adaptive corruption with
//!   identifiable abort.
//! - *No full identifiable abort*: a failed signing run does not always name a culprit. When
//!   a party fails an OT consistency check the library says who ([`CustodyError::Banned`]); that
//!   party must then never sign or refresh with this node again, since further runs with it can
//!   leak the key. The node enforces that ban for good (`florin-node`).
//! - *No presignatures*: the message is bound from the first round, so every signature is a
//!   three-round run among t parties (still a few milliseconds of CPU).
//! - Broadcasts here are the sender's signed envelope relayed to all, with no echo round; a
//!   sender that signs two different broadcasts makes the parties end with different sharings,
//!   which the commit step catches (every node must report the same identity, which covers the
//!   session, the chain code and every public share).
//!
//! The pieces:
//! - [`keygen_session`]: distributed key generation of a t-of-n key (four message rounds: the
//!   polynomial fragments, then commitments, then what they commit to, so no party chooses its
//!   part after seeing the others').
//! - [`sign_session`]: the three rounds of signing by exactly t parties.
//! - [`refresh_session`]: proactive refresh by all n parties: new shares of the same key,
//!   new OT correlations; the old shares no longer combine with the new.
//! - [`complete_refresh_session`]: the same, but the OT set-up of every pair is made anew
//!   (a key generation whose polynomials have a zero constant term): after an import (the
//!   dealer knew the old set-up) and after a repair (the rebuilt share has none). It runs with
//!   every party, so it is no way back after a ban: a banned party's keys need new keys.
//! - [`repair_term`] and [`repair_assemble`]: t helpers rebuild a lost party's share without
//!   anyone learning it; the rebuilt share is *hollow* (no OT state) and signs only after a
//!   complete refresh by all n.
//! - [`import`] (a trusted dealer splits an existing key, R5), [`export`] (t shares rebuild
//!   it, R4) and [`add_key`] (shares of `r1` become shares of `r1 + r2`, R5).
//!
//! Every protocol is a [`Session`] moving [`WireMsg`]s, as the CGGMP24 side does, so the
//! key-management nodes relay them in the same signed, sealed envelopes.

use std::collections::BTreeMap;

use dkls23_core::protocols::dkg::{
    BroadcastDerivationPhase2to4, BroadcastDerivationPhase3to4, KeepInitMulPhase3to4,
    KeepInitZeroSharePhase2to3, KeepInitZeroSharePhase3to4, ProofCommitment,
    TransmitInitMulPhase3to4, TransmitInitZeroSharePhase2to4, TransmitInitZeroSharePhase3to4,
};
use dkls23_core::protocols::dkg_session::DkgSession;
use dkls23_core::protocols::refresh::{
    KeepRefreshPhase3to4, TransmitRefreshPhase2to4, TransmitRefreshPhase3to4,
};
use dkls23_core::protocols::repair::{self, RepairTerm};
use dkls23_core::protocols::signing::{
    Broadcast3to4, KeepPhase1to2, KeepPhase2to3, SignData, TransmitPhase1to2, TransmitPhase2to3,
    UniqueKeep1to2, UniqueKeep2to3,
};
use dkls23_core::protocols::{Abort, AbortKind, Parameters, PartyIndex, PublicKeyPackage};
use p256_dkls::elliptic_curve::group::{Group as _, GroupEncoding};
use p256_dkls::elliptic_curve::{Field, PrimeField};
use p256_dkls::{AffinePoint, NistP256, ProjectivePoint, Scalar};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use crate::ecdsa::{session_of, Driver, Session, Step, WireMsg};
use crate::{CustodyError, PartyId};

type Party = dkls23_core::protocols::Party<NistP256>;
type Package = PublicKeyPackage<NistP256>;

/// Most parties a DKLs23 key can have (the library numbers parties with one byte).
pub const MAX_PARTIES: u16 = 255;

/// The library wants an address for each key; Florin names keys by their public key.
fn no_address(_: &AffinePoint) -> String {
    String::new()
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // These types always serialize; an empty encoding would fail to decode loudly.
    postcard::to_allocvec(v).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, CustodyError> {
    postcard::from_bytes(bytes).map_err(|e| CustodyError::malformed(format!("{what}: {e}")))
}

fn index(p: PartyId) -> Result<PartyIndex, CustodyError> {
    u8::try_from(p)
        .ok()
        .and_then(|b| PartyIndex::new(b).ok())
        .ok_or_else(|| CustodyError::BadParameters(format!("party {p} (DKLs23: 1 to 255)")))
}

fn parameters(t: u16, n: u16) -> Result<Parameters, CustodyError> {
    let bad = || CustodyError::BadParameters(format!("{t} of {n} (DKLs23: 2 ≤ t ≤ n ≤ 255)"));
    if t < 2 {
        return Err(bad());
    }
    let (t, n) = (
        u8::try_from(t).map_err(|_| bad())?,
        u8::try_from(n).map_err(|_| bad())?,
    );
    Parameters::new(t, n).map_err(|_| bad())
}

/// SEC1 compressed encoding of a point (33 bytes; the identity, never a key, as zeros).
fn compressed(p: &AffinePoint) -> [u8; 33] {
    let mut out = [0u8; 33];
    let b = p.to_bytes();
    if b.len() == 33 {
        out.copy_from_slice(&b);
    }
    out
}

/// A library abort as a typed error: a party to ban is named as such.
fn abort(a: Abort) -> CustodyError {
    match a.kind {
        AbortKind::BanCounterparty(p) => CustodyError::Banned {
            party: PartyId::from(p.as_u8()),
            reason: a.description(),
        },
        _ => CustodyError::Ecdsa(format!("dkls23: {}", a.description())),
    }
}

/// One node's share of a DKLs23 key: its Shamir point, the pairwise OT state for the
/// multiplications of signing, the zero-sharing seeds, and the key's public package (every
/// party's public share). Secret: store it sealed, like every key share.
pub struct DklsShare {
    party: Box<Party>,
    package: Package,
}

#[derive(Serialize, Deserialize)]
struct ShareFile {
    party: Party,
    package: Package,
}

impl DklsShare {
    /// Encoding for the node's sealed share file.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        #[derive(Serialize)]
        struct Ref<'a> {
            party: &'a Party,
            package: &'a Package,
        }
        Zeroizing::new(encode(&Ref {
            party: &self.party,
            package: &self.package,
        }))
    }

    /// Decodes [`DklsShare::to_bytes`] and checks it: the share's public point is its party's
    /// in the package, the key is the package's, and there is OT state for every other party
    /// (a whole share) or for none (a share rebuilt by repair: [`DklsShare::is_hollow`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<DklsShare, CustodyError> {
        let f: ShareFile = decode(bytes, "DKLs23 share")?;
        let s = DklsShare {
            party: Box::new(f.party),
            package: f.package,
        };
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), CustodyError> {
        let bad = |why: &str| CustodyError::malformed(format!("DKLs23 share: {why}"));
        let p = &self.party;
        let (t, n) = (p.parameters.threshold, p.parameters.share_count);
        if t < 2 || t > n || p.party_index.as_u8() == 0 || p.party_index.as_u8() > n {
            return Err(bad("parameters"));
        }
        if self.package.threshold() != t || self.package.share_count() != n {
            return Err(bad("the package's parameters differ"));
        }
        if bool::from(p.pk.is_identity()) || *self.package.verifying_key() != p.pk {
            return Err(bad("the public key differs from the package's"));
        }
        let mine = ProjectivePoint::mul_by_generator(&p.poly_point).to_affine();
        if !self.package.verify_share(p.party_index, &mine) {
            return Err(bad("the secret point is not this party's in the package"));
        }
        if self.is_hollow() {
            return Ok(());
        }
        for i in 1..=n {
            if i == p.party_index.as_u8() {
                continue;
            }
            let Ok(j) = PartyIndex::new(i) else {
                return Err(bad("party index"));
            };
            if !p.mul_senders.contains_key(&j) || !p.mul_receivers.contains_key(&j) {
                return Err(bad("no multiplication state for a party"));
            }
        }
        Ok(())
    }

    /// Whether this share was rebuilt by repair and holds no OT state yet: it cannot sign, nor
    /// take a fast refresh, until a complete refresh by all n parties.
    pub fn is_hollow(&self) -> bool {
        self.party.mul_senders.is_empty() && self.party.mul_receivers.is_empty()
    }

    fn refuse_hollow(&self, what: &str) -> Result<(), CustodyError> {
        if self.is_hollow() {
            return Err(CustodyError::BadParameters(format!(
                "this DKLs23 share was rebuilt by repair and has no OT set-up: it cannot {what} \
                 until a complete refresh by all parties"
            )));
        }
        Ok(())
    }

    /// The key's SEC1-compressed public key.
    pub fn public_key(&self) -> [u8; 33] {
        compressed(&self.party.pk)
    }

    /// This share's party.
    pub fn party(&self) -> PartyId {
        PartyId::from(self.party.party_index.as_u8())
    }

    /// Threshold.
    pub fn t(&self) -> u16 {
        u16::from(self.party.parameters.threshold)
    }

    /// Parties.
    pub fn n(&self) -> u16 {
        u16::from(self.party.parameters.share_count)
    }

    /// What names this sharing: the public key, then a digest of the sharing's session, its
    /// chain code and every party's public share (the session and the shares change at a
    /// refresh; the key does not). Equal at every party of one sharing.
    pub fn identity(&self) -> Vec<u8> {
        let mut h = Sha256::new();
        h.update(b"florin/custody/dkls23/sharing/v1");
        h.update(&self.party.session_id);
        // The chain code binds every signing session: parties that ended a key generation with
        // different ones (a sender that split its opening) get different identities.
        h.update(self.party.derivation_data.chain_code);
        for i in 1..=self.party.parameters.share_count {
            if let Some(s) = PartyIndex::new(i)
                .ok()
                .and_then(|j| self.package.verifying_share(j))
            {
                h.update(compressed(s));
            }
        }
        let mut out = self.public_key().to_vec();
        out.extend_from_slice(&h.finalize());
        out
    }
}

/// What one round of a run sent: per sender, its broadcast and its direct message to us.
#[derive(Default)]
struct Inbox {
    broadcast: BTreeMap<PartyId, Vec<u8>>,
    direct: BTreeMap<PartyId, Vec<u8>>,
}

/// A protocol as rounds: each round's messages must all be in before the next phase runs.
trait Rounds {
    type Out;
    /// Whether round `r` (1 = the answer to the first messages) carries broadcasts and direct
    /// messages.
    fn kinds(&self, r: u8) -> (bool, bool);
    /// The first messages.
    fn start(&mut self) -> Result<Vec<WireMsg>, CustodyError>;
    /// Runs the phase after round `r`: the next messages, or the output.
    fn advance(
        &mut self,
        r: u8,
        inbox: Inbox,
    ) -> Result<Result<Vec<WireMsg>, Self::Out>, CustodyError>;
}

struct RoundDriver<R: Rounds> {
    rounds: R,
    me: PartyId,
    others: Vec<PartyId>,
    round: u8,
    inbox: Inbox,
    started: bool,
    finished: bool,
}

impl<R: Rounds> Driver<R::Out> for RoundDriver<R> {
    fn deliver(&mut self, m: WireMsg) -> Result<(), CustodyError> {
        if self.finished {
            return Err(CustodyError::OutOfOrder("session already finished".into()));
        }
        if m.to.is_some_and(|to| to != self.me) {
            return Err(CustodyError::OutOfOrder(format!(
                "message for party {} delivered to party {}",
                m.to.unwrap_or_default(),
                self.me
            )));
        }
        if !self.others.contains(&m.from) {
            return Err(CustodyError::BadParameters(format!(
                "party {} is not another party of this session",
                m.from
            )));
        }
        let (bcast, direct) = self.rounds.kinds(self.round + 1);
        let (slot, wanted) = match m.to {
            None => (&mut self.inbox.broadcast, bcast),
            Some(_) => (&mut self.inbox.direct, direct),
        };
        // The same message twice (a relay's repeat) is nothing; anything else is the sender's.
        if slot.get(&m.from) == Some(&m.body) {
            return Ok(());
        }
        if !wanted || slot.contains_key(&m.from) {
            return Err(CustodyError::Misbehaved {
                party: m.from,
                reason: format!("a message this round ({}) does not take", self.round + 1),
            });
        }
        slot.insert(m.from, m.body);
        Ok(())
    }

    fn abort(&mut self) {
        self.finished = true;
    }

    fn run(&mut self) -> Result<Step<R::Out>, CustodyError> {
        if self.finished {
            return Err(CustodyError::OutOfOrder("session already finished".into()));
        }
        // The first messages; first-round messages that came with the start are kept.
        let mut out = Vec::new();
        if !self.started {
            self.started = true;
            out = self.rounds.start().inspect_err(|_| self.finished = true)?;
        }
        let (bcast, direct) = self.rounds.kinds(self.round + 1);
        let all = |m: &BTreeMap<PartyId, Vec<u8>>| self.others.iter().all(|p| m.contains_key(p));
        if (bcast && !all(&self.inbox.broadcast)) || (direct && !all(&self.inbox.direct)) {
            return Ok(Step { out, done: None });
        }
        self.round += 1;
        let inbox = std::mem::take(&mut self.inbox);
        match self.rounds.advance(self.round, inbox) {
            Ok(Ok(more)) => {
                out.extend(more);
                Ok(Step { out, done: None })
            }
            Ok(Err(o)) => {
                self.finished = true;
                Ok(Step { out, done: Some(o) })
            }
            Err(e) => {
                self.finished = true;
                Err(e)
            }
        }
    }
}

fn rounds_session<R: Rounds + 'static>(
    rounds: R,
    me: PartyId,
    parties: &[PartyId],
) -> Session<R::Out> {
    session_of(Box::new(RoundDriver {
        rounds,
        me,
        others: parties.iter().copied().filter(|&p| p != me).collect(),
        round: 0,
        inbox: Inbox::default(),
        started: false,
        finished: false,
    }))
}

/// A message body from `from` of round `what`, decoded; bytes that do not decode name it.
fn body<T: DeserializeOwned>(from: PartyId, bytes: &[u8], what: &str) -> Result<T, CustodyError> {
    postcard::from_bytes(bytes).map_err(|e| CustodyError::Misbehaved {
        party: from,
        reason: format!("sent a {what} that does not decode: {e}"),
    })
}

fn direct(me: PartyId, to: PartyId, body: Vec<u8>) -> WireMsg {
    WireMsg {
        from: me,
        to: Some(to),
        body,
    }
}

fn broadcast(me: PartyId, body: Vec<u8>) -> WireMsg {
    WireMsg {
        from: me,
        to: None,
        body,
    }
}

/// A party claimed in a message to be another sender or for another recipient than the
/// envelope says.
fn check_route(
    from: PartyId,
    me: PartyId,
    sender: PartyIndex,
    receiver: PartyIndex,
) -> Result<(), CustodyError> {
    if PartyId::from(sender.as_u8()) != from || PartyId::from(receiver.as_u8()) != me {
        return Err(CustodyError::Misbehaved {
            party: from,
            reason: "its message names another sender or recipient than it was sent as".into(),
        });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Key generation and refresh: four rounds (fragments; commitments; openings; done).
// ---------------------------------------------------------------------------------------

#[derive(Serialize, Deserialize)]
struct Commit2 {
    /// The commitment to the sender's proof of its public share (opened in round 3).
    proof: [u8; 32],
    /// Key generation: the commitment to the sender's part of the chain code.
    chain: Option<BroadcastDerivationPhase2to4>,
}

#[derive(Serialize, Deserialize)]
struct Open3 {
    proof: ProofCommitment<NistP256>,
    chain: Option<BroadcastDerivationPhase3to4>,
}

#[derive(Serialize, Deserialize)]
enum Zero2 {
    Keygen(TransmitInitZeroSharePhase2to4),
    Refresh(TransmitRefreshPhase2to4),
}

#[derive(Serialize, Deserialize)]
enum Setup3 {
    Keygen {
        zero: TransmitInitZeroSharePhase3to4,
        mul: Box<TransmitInitMulPhase3to4<NistP256>>,
    },
    Refresh(TransmitRefreshPhase3to4),
}

/// Round 3 of a key generation or complete refresh: each party's zero-share opening and
/// multiplication set-up, paired into one direct message per recipient.
fn setup_messages(
    me: PartyId,
    zero: Vec<TransmitInitZeroSharePhase3to4>,
    mul: Vec<TransmitInitMulPhase3to4<NistP256>>,
) -> Result<Vec<WireMsg>, CustodyError> {
    let mut mul: BTreeMap<u8, _> = mul
        .into_iter()
        .map(|m| (m.parties.receiver.as_u8(), m))
        .collect();
    let mut out = Vec::with_capacity(zero.len());
    for z in zero {
        let to = z.parties.receiver.as_u8();
        let m = mul
            .remove(&to)
            .ok_or_else(|| CustodyError::Ecdsa("dkls23: multiplication setup".into()))?;
        out.push(direct(
            me,
            PartyId::from(to),
            encode(&Setup3::Keygen {
                zero: z,
                mul: Box::new(m),
            }),
        ));
    }
    Ok(out)
}

/// Round-2 state of a key generation or refresh, kept for round 3 and the end.
enum Kept {
    Keygen(Box<DkgSession<NistP256>>),
    Refresh(Box<RefreshKept>),
    Complete(Box<CompleteKept>),
}

/// A complete refresh: a key generation of a zero-constant polynomial, applied to the old
/// share, with the zero-sharing seeds and OT set-up made anew (key generation's messages).
struct CompleteKept {
    old: Box<Party>,
    package: Package,
    sid: Vec<u8>,
    correction: Zeroizing<Scalar>,
    zero2: BTreeMap<PartyIndex, KeepInitZeroSharePhase2to3>,
    zero3: BTreeMap<PartyIndex, KeepInitZeroSharePhase3to4>,
    mul3: BTreeMap<PartyIndex, KeepInitMulPhase3to4<NistP256>>,
}

struct RefreshKept {
    old: Box<Party>,
    package: Package,
    sid: Vec<u8>,
    correction: Zeroizing<Scalar>,
    kept3: BTreeMap<PartyIndex, KeepRefreshPhase3to4>,
    /// The zero-share seeds to open in round 3 (after every commitment is in).
    openings: Vec<TransmitRefreshPhase3to4>,
}

struct Dkg {
    me: PartyId,
    n: u16,
    kept: Kept,
    /// Fragment of our own polynomial for ourselves.
    own_fragment: Zeroizing<Vec<Scalar>>,
    own_proof: Option<ProofCommitment<NistP256>>,
    own_chain2: Option<BroadcastDerivationPhase2to4>,
    own_open: Option<Open3>,
    commits: BTreeMap<PartyId, Commit2>,
    /// The zero-share commitments received in round 2, by kind (a run uses its own kind).
    zero2_keygen: Vec<TransmitInitZeroSharePhase2to4>,
    zero2_refresh: Vec<TransmitRefreshPhase2to4>,
}

impl Dkg {
    fn new(me: PartyId, n: u16, kept: Kept) -> Dkg {
        Dkg {
            me,
            n,
            kept,
            own_fragment: Zeroizing::new(Vec::new()),
            own_proof: None,
            own_chain2: None,
            own_open: None,
            commits: BTreeMap::new(),
            zero2_keygen: Vec::new(),
            zero2_refresh: Vec::new(),
        }
    }
}

impl Rounds for Dkg {
    type Out = DklsShare;

    fn kinds(&self, r: u8) -> (bool, bool) {
        match r {
            1 => (false, true),
            _ => (true, true),
        }
    }

    fn start(&mut self) -> Result<Vec<WireMsg>, CustodyError> {
        let fragments = match &self.kept {
            Kept::Keygen(s) => s.phase1(),
            Kept::Refresh(r) => r.old.refresh_phase1(),
            Kept::Complete(c) => c.old.refresh_complete_phase1(),
        };
        if fragments.len() != usize::from(self.n) {
            return Err(CustodyError::Ecdsa("dkls23: fragment count".into()));
        }
        let mut out = Vec::new();
        for (k, f) in fragments.iter().enumerate() {
            let to = k as PartyId + 1;
            if to == self.me {
                self.own_fragment.push(*f);
            } else {
                out.push(direct(self.me, to, encode(f)));
            }
        }
        Ok(out)
    }

    fn advance(
        &mut self,
        r: u8,
        inbox: Inbox,
    ) -> Result<Result<Vec<WireMsg>, DklsShare>, CustodyError> {
        let me = self.me;
        match r {
            1 => {
                // Every fragment for us, in party order (ours included).
                let mut fragments = Vec::with_capacity(usize::from(self.n));
                for p in 1..=self.n {
                    if p == me {
                        fragments.push(
                            *self.own_fragment.first().ok_or_else(|| {
                                CustodyError::Ecdsa("dkls23: own fragment".into())
                            })?,
                        );
                    } else {
                        let b = inbox.direct.get(&p).ok_or_else(|| {
                            CustodyError::Ecdsa(format!("dkls23: no fragment from {p}"))
                        })?;
                        fragments.push(body::<Scalar>(p, b, "polynomial fragment")?);
                    }
                }
                let fragments = Zeroizing::new(fragments);
                let mut out = Vec::new();
                let (proof, chain, zeros) = match &mut self.kept {
                    Kept::Keygen(s) => {
                        let (proof, zero, chain) = s.phase2(&fragments).map_err(abort)?;
                        self.own_chain2 = Some(chain.clone());
                        (
                            proof,
                            Some(chain),
                            zero.into_iter()
                                .map(|z| (z.parties.receiver, Zero2::Keygen(z)))
                                .collect::<Vec<_>>(),
                        )
                    }
                    Kept::Refresh(r) => {
                        let (c, proof, keep2, transmit) = r.old.refresh_phase2(&r.sid, &fragments);
                        r.correction = Zeroizing::new(c);
                        let (keep3, t3) = r.old.refresh_phase3(&keep2);
                        r.kept3 = keep3;
                        r.openings = t3;
                        (
                            proof,
                            None,
                            transmit
                                .into_iter()
                                .map(|z| (z.parties.receiver, Zero2::Refresh(z)))
                                .collect(),
                        )
                    }
                    Kept::Complete(c) => {
                        let (corr, proof, keep2, transmit) =
                            c.old.refresh_complete_phase2(&c.sid, &fragments);
                        c.correction = Zeroizing::new(corr);
                        c.zero2 = keep2;
                        (
                            proof,
                            None,
                            transmit
                                .into_iter()
                                .map(|z| (z.parties.receiver, Zero2::Keygen(z)))
                                .collect(),
                        )
                    }
                };
                out.push(broadcast(
                    me,
                    encode(&Commit2 {
                        proof: proof.commitment,
                        chain,
                    }),
                ));
                self.own_proof = Some(proof);
                for (to, z) in zeros {
                    out.push(direct(me, PartyId::from(to.as_u8()), encode(&z)));
                }
                Ok(Ok(out))
            }
            2 => {
                for (p, b) in &inbox.broadcast {
                    self.commits.insert(*p, body(*p, b, "commitment")?);
                }
                for (p, b) in &inbox.direct {
                    match body::<Zero2>(*p, b, "zero-share commitment")? {
                        Zero2::Keygen(m) => {
                            check_route(*p, me, m.parties.sender, m.parties.receiver)?;
                            self.zero2_keygen.push(m);
                        }
                        Zero2::Refresh(m) => {
                            check_route(*p, me, m.parties.sender, m.parties.receiver)?;
                            self.zero2_refresh.push(m);
                        }
                    }
                }
                // Every commitment is in: now open ours.
                let mut out = Vec::new();
                let own_proof = self
                    .own_proof
                    .clone()
                    .ok_or_else(|| CustodyError::Ecdsa("dkls23: own proof".into()))?;
                match &mut self.kept {
                    Kept::Keygen(s) => {
                        let (zero, mul, chain) = s.phase3().map_err(abort)?;
                        let open = Open3 {
                            proof: own_proof,
                            chain: Some(chain),
                        };
                        out.push(broadcast(me, encode(&open)));
                        self.own_open = Some(open);
                        out.extend(setup_messages(me, zero, mul)?);
                    }
                    Kept::Refresh(r) => {
                        let open = Open3 {
                            proof: own_proof,
                            chain: None,
                        };
                        out.push(broadcast(me, encode(&open)));
                        self.own_open = Some(open);
                        for m in std::mem::take(&mut r.openings) {
                            let to = PartyId::from(m.parties.receiver.as_u8());
                            out.push(direct(me, to, encode(&Setup3::Refresh(m))));
                        }
                    }
                    Kept::Complete(c) => {
                        let (zero_keep, zero, mul_keep, mul) =
                            c.old.refresh_complete_phase3(&c.sid, &c.zero2);
                        c.zero3 = zero_keep;
                        c.mul3 = mul_keep;
                        let open = Open3 {
                            proof: own_proof,
                            chain: None,
                        };
                        out.push(broadcast(me, encode(&open)));
                        self.own_open = Some(open);
                        out.extend(setup_messages(me, zero, mul)?);
                    }
                }
                Ok(Ok(out))
            }
            3 => {
                let mut proofs = Vec::with_capacity(usize::from(self.n));
                let mut chains2 = BTreeMap::new();
                let mut chains3 = BTreeMap::new();
                let mut zero3 = Vec::new();
                let mut mul3 = Vec::new();
                let mut refresh3 = Vec::new();
                for p in 1..=self.n {
                    let open = if p == me {
                        let o = self
                            .own_open
                            .take()
                            .ok_or_else(|| CustodyError::Ecdsa("dkls23: own opening".into()))?;
                        if let Some(c) = self.own_chain2.take() {
                            chains2.insert(index(p)?, c);
                        }
                        o
                    } else {
                        let b = inbox.broadcast.get(&p).ok_or_else(|| {
                            CustodyError::Ecdsa(format!("dkls23: no opening from {p}"))
                        })?;
                        let o: Open3 = body(p, b, "opening")?;
                        let c = self.commits.remove(&p).ok_or_else(|| {
                            CustodyError::Ecdsa(format!("dkls23: no commitment from {p}"))
                        })?;
                        if o.proof.commitment != c.proof
                            || PartyId::from(o.proof.index.as_u8()) != p
                        {
                            return Err(CustodyError::Misbehaved {
                                party: p,
                                reason: "opened another proof than it committed to".into(),
                            });
                        }
                        if let Some(c2) = c.chain {
                            chains2.insert(index(p)?, c2);
                        }
                        o
                    };
                    if let Some(c3) = open.chain {
                        chains3.insert(index(p)?, c3);
                    }
                    proofs.push(open.proof);
                }
                for (p, b) in &inbox.direct {
                    match body::<Setup3>(*p, b, "setup")? {
                        Setup3::Keygen { zero, mul } => {
                            check_route(*p, me, zero.parties.sender, zero.parties.receiver)?;
                            check_route(*p, me, mul.parties.sender, mul.parties.receiver)?;
                            zero3.push(zero);
                            mul3.push(*mul);
                        }
                        Setup3::Refresh(m) => {
                            check_route(*p, me, m.parties.sender, m.parties.receiver)?;
                            refresh3.push(m);
                        }
                    }
                }
                let kept = std::mem::replace(
                    &mut self.kept,
                    Kept::Keygen(Box::new(DkgSession::new(
                        parameters(2, 2)?,
                        index(1)?,
                        Vec::new(),
                    ))),
                );
                let share = match kept {
                    Kept::Keygen(s) => {
                        let (party, package) = s
                            .phase4(
                                &proofs,
                                &self.zero2_keygen,
                                &zero3,
                                &mul3,
                                &chains2,
                                &chains3,
                                no_address,
                            )
                            .map_err(abort)?;
                        DklsShare {
                            party: Box::new(party),
                            package,
                        }
                    }
                    Kept::Refresh(r) => {
                        let RefreshKept {
                            old,
                            package,
                            sid,
                            correction,
                            kept3,
                            ..
                        } = *r;
                        let party = old
                            .refresh_phase4(
                                &sid,
                                &correction,
                                &proofs,
                                &kept3,
                                &self.zero2_refresh,
                                &refresh3,
                            )
                            .map_err(abort)?;
                        let package = package.refresh(&sid, &proofs).map_err(|r| {
                            CustodyError::Ecdsa(format!("dkls23: refreshed package: {r}"))
                        })?;
                        DklsShare {
                            party: Box::new(party),
                            package,
                        }
                    }
                    Kept::Complete(c) => {
                        let CompleteKept {
                            old,
                            package,
                            sid,
                            correction,
                            zero3: zero_kept,
                            mul3: mul_kept,
                            ..
                        } = *c;
                        let party = old
                            .refresh_complete_phase4(
                                &sid,
                                &correction,
                                &proofs,
                                &zero_kept,
                                &self.zero2_keygen,
                                &zero3,
                                &mul_kept,
                                &mul3,
                            )
                            .map_err(abort)?;
                        let package = package.refresh(&sid, &proofs).map_err(|r| {
                            CustodyError::Ecdsa(format!("dkls23: refreshed package: {r}"))
                        })?;
                        let share = DklsShare {
                            party: Box::new(party),
                            package,
                        };
                        if share.is_hollow() {
                            return Err(CustodyError::Ecdsa(
                                "dkls23: a complete refresh left no OT set-up".into(),
                            ));
                        }
                        share
                    }
                };
                share.check()?;
                Ok(Err(share))
            }
            _ => Err(CustodyError::OutOfOrder("a round after the last".into())),
        }
    }
}

/// Distributed generation of a `t`-of-`n` key, party `me`'s side. Every party must use the
/// same `session_id`, fresh for this run.
pub fn keygen_session(
    session_id: [u8; 32],
    me: PartyId,
    n: u16,
    t: u16,
) -> Result<Session<DklsShare>, CustodyError> {
    let params = parameters(t, n)?;
    let parties: Vec<PartyId> = (1..=n).collect();
    let dkg = Dkg::new(
        me,
        n,
        Kept::Keygen(Box::new(DkgSession::new(
            params,
            index(me)?,
            session_id.to_vec(),
        ))),
    );
    if me == 0 || me > n {
        return Err(CustodyError::BadParameters(format!("party {me} of {n}")));
    }
    Ok(rounds_session(dkg, me, &parties))
}

/// Proactive refresh of `share`'s key by all n parties: each ends with a new share of the
/// same public key (a new [`DklsShare::identity`]) and new OT correlations. Shares from
/// before and after do not sign together. Every party must use the same `session_id`, fresh.
///
/// This is the library's fast refresh, which re-randomizes the OT set-up instead of making it
/// anew: a share rebuilt by repair cannot take it, and for a key a dealer split only a
/// [`complete_refresh_session`] replaces the OT set-up.
pub fn refresh_session(
    session_id: [u8; 32],
    share: DklsShare,
) -> Result<Session<DklsShare>, CustodyError> {
    share.refuse_hollow("take a fast refresh")?;
    let me = share.party();
    let n = share.n();
    let parties: Vec<PartyId> = (1..=n).collect();
    let dkg = Dkg::new(
        me,
        n,
        Kept::Refresh(Box::new(RefreshKept {
            old: share.party,
            package: share.package,
            sid: session_id.to_vec(),
            correction: Zeroizing::new(Scalar::ZERO),
            kept3: BTreeMap::new(),
            openings: Vec::new(),
        })),
    );
    Ok(rounds_session(dkg, me, &parties))
}

/// Complete refresh of `share`'s key by all n parties: new shares of the same public key, as
/// [`refresh_session`] gives, but every pair's OT set-up and zero-sharing seeds are made anew,
/// as at key generation (seconds rather than a fraction of one). The one refresh a share
/// rebuilt by repair ([`DklsShare::is_hollow`]) can take, and the one to run after an import,
/// whose dealer made the old OT set-up. Every party must use the same `session_id`, fresh.
pub fn complete_refresh_session(
    session_id: [u8; 32],
    share: DklsShare,
) -> Result<Session<DklsShare>, CustodyError> {
    let me = share.party();
    let n = share.n();
    let parties: Vec<PartyId> = (1..=n).collect();
    let dkg = Dkg::new(
        me,
        n,
        Kept::Complete(Box::new(CompleteKept {
            old: share.party,
            package: share.package,
            sid: session_id.to_vec(),
            correction: Zeroizing::new(Scalar::ZERO),
            zero2: BTreeMap::new(),
            zero3: BTreeMap::new(),
            mul3: BTreeMap::new(),
        })),
    );
    Ok(rounds_session(dkg, me, &parties))
}

// ---------------------------------------------------------------------------------------
// Share repair: t helpers rebuild a lost party's share (hollow until a complete refresh).
// ---------------------------------------------------------------------------------------

/// What a helper sends the target (sealed to it): its masked term and its view of the key's
/// public package, which every helper must report alike.
#[derive(Serialize, Deserialize)]
struct RepairPart {
    term: RepairTerm<NistP256>,
    package: Package,
}

fn repair_error(e: repair::RepairError) -> CustodyError {
    CustodyError::BadParameters(format!("dkls23 repair: {e}"))
}

fn helper_indices(helpers: &[PartyId]) -> Result<Vec<PartyIndex>, CustodyError> {
    let mut sorted = helpers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != helpers.len() {
        return Err(CustodyError::BadParameters(format!(
            "helpers {helpers:?}: a party named twice"
        )));
    }
    sorted.into_iter().map(index).collect()
}

/// This helper's part of rebuilding party `target`'s lost share: its share times its Lagrange
/// coefficient at `target` over `helpers` (at least t parties, `target` not among them), masked
/// with a share of zero only the helpers together cancel. Send it to the target only (sealed):
/// only the sum of every helper's part is the target's share. Every helper must use the same
/// `helpers` and `repair_id` (fresh for the run).
pub fn repair_term(
    share: &DklsShare,
    helpers: &[PartyId],
    target: PartyId,
    repair_id: &[u8],
) -> Result<Zeroizing<Vec<u8>>, CustodyError> {
    share.refuse_hollow("help a repair")?;
    let hs = helper_indices(helpers)?;
    if target == 0 || target > share.n() {
        return Err(CustodyError::BadParameters(format!(
            "target {target}: not a party of 1 to {}",
            share.n()
        )));
    }
    let term = share
        .party
        .repair_term(&hs, index(target)?, repair_id)
        .map_err(repair_error)?;
    Ok(Zeroizing::new(encode(&RepairPart {
        term,
        package: share.package.clone(),
    })))
}

/// The target's side: adds every helper's part (`(helper, bytes)`, the helper as the sealed
/// envelope authenticated it) into its share. Every helper must report the same public package
/// and key; `expected` (the key's SEC1-compressed public key), when the target still knows it,
/// must be that key. The result is checked against the target's public share in the package
/// and is hollow: it signs only after [`complete_refresh_session`] by all n parties.
pub fn repair_assemble<B: AsRef<[u8]>>(
    target: PartyId,
    parts: &[(PartyId, B)],
    expected: Option<&[u8; 33]>,
) -> Result<DklsShare, CustodyError> {
    let mut package: Option<(Vec<u8>, Package)> = None;
    let mut terms = Vec::with_capacity(parts.len());
    for (from, bytes) in parts {
        let part: RepairPart = body(*from, bytes.as_ref(), "repair term")?;
        if PartyId::from(part.term.helper.as_u8()) != *from
            || PartyId::from(part.term.target.as_u8()) != target
        {
            return Err(CustodyError::Misbehaved {
                party: *from,
                reason: "its repair term names another helper or target than it was sent as".into(),
            });
        }
        let encoded = encode(&part.package);
        match &package {
            None => package = Some((encoded, part.package)),
            Some((first, _)) if *first == encoded => {}
            Some(_) => {
                return Err(CustodyError::Inconsistent(
                    "the repair helpers report different public packages for the key".into(),
                ))
            }
        }
        terms.push(part.term);
    }
    let Some((_, package)) = package else {
        return Err(CustodyError::BadParameters("no repair terms".into()));
    };
    if let Some(pk) = expected {
        if compressed(package.verifying_key()) != *pk {
            return Err(CustodyError::Inconsistent(
                "the repair helpers hold another key than this node knows".into(),
            ));
        }
    }
    let party = repair::repair_assemble(&package, index(target)?, &terms, no_address)
        .map_err(repair_error)?;
    let share = DklsShare {
        party: Box::new(party),
        package,
    };
    share.check()?;
    Ok(share)
}

// ---------------------------------------------------------------------------------------
// Signing: three rounds among exactly t parties.
// ---------------------------------------------------------------------------------------

type Keep1 = (
    UniqueKeep1to2<NistP256>,
    BTreeMap<PartyIndex, KeepPhase1to2<NistP256>>,
);
type Keep2 = (
    UniqueKeep2to3<NistP256>,
    BTreeMap<PartyIndex, KeepPhase2to3<NistP256>>,
);

struct Sign {
    party: Box<Party>,
    me: PartyId,
    data: SignData,
    keep1: Option<Keep1>,
    keep2: Option<Keep2>,
    x: String,
    own: Option<Broadcast3to4<NistP256>>,
}

impl Rounds for Sign {
    type Out = [u8; 64];

    fn kinds(&self, r: u8) -> (bool, bool) {
        match r {
            3 => (true, false),
            _ => (false, true),
        }
    }

    fn start(&mut self) -> Result<Vec<WireMsg>, CustodyError> {
        let (u, k, out) = self.party.sign_phase1(&self.data).map_err(abort)?;
        self.keep1 = Some((u, k));
        Ok(out
            .into_iter()
            .map(|m| {
                let to = PartyId::from(m.parties.receiver.as_u8());
                direct(self.me, to, encode(&m))
            })
            .collect())
    }

    fn advance(
        &mut self,
        r: u8,
        inbox: Inbox,
    ) -> Result<Result<Vec<WireMsg>, [u8; 64]>, CustodyError> {
        let me = self.me;
        let gone = || CustodyError::OutOfOrder("signing state already used".into());
        match r {
            1 => {
                let mut got = Vec::with_capacity(inbox.direct.len());
                for (p, b) in &inbox.direct {
                    let m: TransmitPhase1to2 = body(*p, b, "first signing message")?;
                    check_route(*p, me, m.parties.sender, m.parties.receiver)?;
                    got.push(m);
                }
                let (u, k) = self.keep1.take().ok_or_else(gone)?;
                let (u, k, out) = self
                    .party
                    .sign_phase2(&self.data, u, k, &got)
                    .map_err(abort)?;
                self.keep2 = Some((u, k));
                Ok(Ok(out
                    .into_iter()
                    .map(|m| {
                        let to = PartyId::from(m.parties.receiver.as_u8());
                        direct(me, to, encode(&m))
                    })
                    .collect()))
            }
            2 => {
                let mut got = Vec::with_capacity(inbox.direct.len());
                for (p, b) in &inbox.direct {
                    let m: TransmitPhase2to3<NistP256> = body(*p, b, "second signing message")?;
                    check_route(*p, me, m.parties.sender, m.parties.receiver)?;
                    got.push(m);
                }
                let (u, k) = self.keep2.take().ok_or_else(gone)?;
                let (x, b) = self
                    .party
                    .sign_phase3(&self.data, u, k, &got)
                    .map_err(abort)?;
                self.x = x;
                let out = vec![broadcast(me, encode(&b))];
                self.own = Some(b);
                Ok(Ok(out))
            }
            3 => {
                let mut all = Vec::with_capacity(inbox.broadcast.len() + 1);
                all.push(self.own.take().ok_or_else(gone)?);
                for (p, b) in &inbox.broadcast {
                    all.push(body(*p, b, "signing broadcast")?);
                }
                // The library checks the signature against the key before it answers.
                let (s_hex, _) = self
                    .party
                    .sign_phase4(&self.data, &self.x, &all, true)
                    .map_err(abort)?;
                let mut sig = [0u8; 64];
                hex::decode_to_slice(&self.x, &mut sig[..32])
                    .and_then(|_| hex::decode_to_slice(&s_hex, &mut sig[32..]))
                    .map_err(|e| CustodyError::Ecdsa(format!("dkls23: signature encoding: {e}")))?;
                Ok(Err(sig))
            }
            _ => Err(CustodyError::OutOfOrder("a round after the last".into())),
        }
    }
}

/// Signing of `message` (ECDSA-P256-SHA256) by exactly t `signers` (party numbers, this
/// share's among them), this share's side. Every signer must use the same `session_id`,
/// fresh for this run. The output is `r ‖ s`, low-S.
pub fn sign_session(
    session_id: [u8; 32],
    signers: &[PartyId],
    share: DklsShare,
    message: &[u8],
) -> Result<Session<[u8; 64]>, CustodyError> {
    share.refuse_hollow("sign")?;
    let me = share.party();
    let mut sorted = signers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != signers.len()
        || sorted.len() != usize::from(share.t())
        || !sorted.contains(&me)
        || sorted.iter().any(|&p| p == 0 || p > share.n())
    {
        return Err(CustodyError::BadParameters(format!(
            "signers {signers:?}: exactly {} distinct parties of 1 to {}, party {me} among them",
            share.t(),
            share.n()
        )));
    }
    let counterparties = sorted
        .iter()
        .filter(|&&p| p != me)
        .map(|&p| index(p))
        .collect::<Result<Vec<_>, _>>()?;
    let data = SignData {
        sign_id: session_id.to_vec(),
        counterparties,
        message_hash: Sha256::digest(message).into(),
    };
    let sign = Sign {
        party: share.party,
        me,
        data,
        keep1: None,
        keep2: None,
        x: String::new(),
        own: None,
    };
    Ok(rounds_session(sign, me, &sorted))
}

// ---------------------------------------------------------------------------------------
// Import, export, key addition.
// ---------------------------------------------------------------------------------------

fn scalar(bytes: &[u8; 32], what: &str) -> Result<Zeroizing<Scalar>, CustodyError> {
    let s: Option<Scalar> = Scalar::from_repr((*bytes).into()).into();
    match s {
        Some(s) if !bool::from(s.is_zero()) => Ok(Zeroizing::new(s)),
        _ => Err(CustodyError::BadParameters(format!(
            "{what}: not a non-zero P-256 scalar"
        ))),
    }
}

/// Splits an existing P-256 secret key into `n` shares with threshold `t` (a trusted dealer,
/// R5): the caller that holds the key makes every share, the multiplication set-up included,
/// and must erase the key and hand each share to its node only. The dealer knows the OT
/// set-up, so a refresh should follow before the key holds value.
pub fn import(secret: &[u8; 32], t: u16, n: u16) -> Result<Vec<DklsShare>, CustodyError> {
    let params = parameters(t, n)?;
    let x = scalar(secret, "the imported key")?;
    let mut sid = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut sid);
    let (parties, package) =
        dkls23_core::protocols::re_key::re_key(&params, &sid, &*x, None, no_address);
    parties
        .into_iter()
        .map(|p| {
            let s = DklsShare {
                party: Box::new(p),
                package: package.clone(),
            };
            s.check()?;
            Ok(s)
        })
        .collect()
}

/// Rebuilds the secret key from at least t shares of one sharing (R4), checked against the
/// public key. Whoever calls this holds the whole key.
pub fn export(shares: &[DklsShare]) -> Result<Zeroizing<[u8; 32]>, CustodyError> {
    let first = shares
        .first()
        .ok_or(CustodyError::TooFewParties { have: 0, need: 2 })?;
    let t = usize::from(first.t());
    let mut seen = Vec::new();
    for s in shares {
        if s.identity() != first.identity() {
            return Err(CustodyError::BadParameters(
                "shares of different sharings (or keys)".into(),
            ));
        }
        if !seen.contains(&s.party()) {
            seen.push(s.party());
        }
    }
    if seen.len() < t {
        return Err(CustodyError::TooFewParties {
            have: seen.len(),
            need: t,
        });
    }
    let used: Vec<&DklsShare> = seen
        .iter()
        .take(t)
        .filter_map(|p| shares.iter().find(|s| s.party() == *p))
        .collect();
    let mut x = Zeroizing::new(Scalar::ZERO);
    for s in &used {
        let i = Scalar::from(u64::from(s.party()));
        let mut l = Scalar::ONE;
        for o in &used {
            if o.party() == s.party() {
                continue;
            }
            let j = Scalar::from(u64::from(o.party()));
            let inv: Option<Scalar> = (j - i).invert().into();
            l *= j * inv.ok_or_else(|| CustodyError::BadParameters("party numbers".into()))?;
        }
        *x += s.party.poly_point * l;
    }
    if (ProjectivePoint::GENERATOR * *x).to_affine() != first.party.pk {
        return Err(CustodyError::Ecdsa(
            "dkls23: the shares do not rebuild the public key".into(),
        ));
    }
    Ok(Zeroizing::new(x.to_repr().into()))
}

fn point(bytes: &[u8; 33], what: &str) -> Result<ProjectivePoint, CustodyError> {
    let p: Option<AffinePoint> = AffinePoint::from_bytes(bytes.into()).into();
    match p {
        Some(p) if !bool::from(p.is_identity()) => Ok(ProjectivePoint::from(p)),
        _ => Err(CustodyError::BadParameters(format!(
            "{what}: not a P-256 point (SEC1 compressed)"
        ))),
    }
}

fn compressed_point(p: ProjectivePoint, what: &str) -> Result<[u8; 33], CustodyError> {
    let a = p.to_affine();
    if bool::from(a.is_identity()) {
        return Err(CustodyError::BadParameters(format!(
            "{what} is the point at infinity"
        )));
    }
    Ok(compressed(&a))
}

/// The note key `base + tweak·G` (SEC1 compressed): the public side of [`add_key`], for
/// whoever holds only public keys (a payment provider, a node checking an authorization).
pub fn tweak_public(base: &[u8; 33], tweak: &[u8; 32]) -> Result<[u8; 33], CustodyError> {
    let b = point(base, "the key")?;
    let t = scalar(tweak, "the tweak")?;
    compressed_point(b + ProjectivePoint::mul_by_generator(&*t), "the note key")
}

/// `R1 + R2` (SEC1 compressed): the key of a note that two parties' keys make together
/// (Filia's remote transfer).
pub fn add_public(a: &[u8; 33], b: &[u8; 33]) -> Result<[u8; 33], CustodyError> {
    compressed_point(point(a, "R1")? + point(b, "R2")?, "R1 + R2")
}

/// `secret·G` (SEC1 compressed), for a non-zero scalar.
pub fn public_of(secret: &[u8; 32]) -> Result<[u8; 33], CustodyError> {
    let s = scalar(secret, "the secret")?;
    compressed_point(ProjectivePoint::mul_by_generator(&*s), "the public key")
}

/// `a + b` mod the group order (32 bytes big-endian); an error if it is zero.
pub fn add_scalars(a: &[u8; 32], b: &[u8; 32]) -> Result<Zeroizing<[u8; 32]>, CustodyError> {
    let s = *scalar(a, "a")? + *scalar(b, "b")?;
    if bool::from(s.is_zero()) {
        return Err(CustodyError::BadParameters("the sum is zero".into()));
    }
    Ok(Zeroizing::new(s.to_repr().into()))
}

/// A fresh random non-zero P-256 scalar (32 bytes big-endian): a note's tweak, or Filia's
/// `r2`.
pub fn random_scalar() -> Zeroizing<[u8; 32]> {
    // Uniform by rejection: 32 random bytes are a scalar below the group order but for a
    // chance of about 2^-32.
    let mut b = Zeroizing::new([0u8; 32]);
    loop {
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, b.as_mut_slice());
        if scalar(&b, "").is_ok() {
            return b;
        }
    }
}

/// Key addition (R5): from this node's share of key `r1`, its share of `r1 + addend`. Every
/// node applies the same `addend`; the OT set-up is kept (signing binds each run to the key's
/// public key, so runs of the two keys never share a session).
pub fn add_key(share: &DklsShare, addend: &[u8; 32]) -> Result<DklsShare, CustodyError> {
    share.refuse_hollow("make another key")?;
    let a = scalar(addend, "the addend")?;
    let shift = ProjectivePoint::mul_by_generator(&*a);
    let mut party = share.party.clone();
    party.poly_point += *a;
    party.pk = (ProjectivePoint::from(party.pk) + shift).to_affine();
    if bool::from(party.pk.is_identity()) {
        return Err(CustodyError::BadParameters(
            "the addend cancels the key".into(),
        ));
    }
    party.derivation_data.poly_point = party.poly_point;
    party.derivation_data.pk = party.pk;
    let mut shares = BTreeMap::new();
    for i in 1..=party.parameters.share_count {
        let j = PartyIndex::new(i).map_err(|_| CustodyError::BadParameters("index".into()))?;
        let v = share
            .package
            .verifying_share(j)
            .ok_or_else(|| CustodyError::malformed("DKLs23 package: a party's share"))?;
        shares.insert(j, (ProjectivePoint::from(*v) + shift).to_affine());
    }
    let package = PublicKeyPackage::new(party.pk, shares, party.parameters.clone());
    let s = DklsShare { party, package };
    s.check()?;
    Ok(s)
}

/// Runs DKLs23 sessions of all parties in this process round by round, as the nodes' relay
/// does: every party's messages of one round are delivered together in the next step (a
/// session takes one round at a time). Returns each party's output and CPU time, in the order
/// given.
pub fn run_rounds<O>(
    mut sessions: Vec<(PartyId, Session<O>)>,
) -> Result<Vec<(O, std::time::Duration)>, CustodyError> {
    let mut queue: Vec<WireMsg> = Vec::new();
    for (_, s) in sessions.iter_mut() {
        queue.extend(s.step(Vec::new())?.out);
    }
    let mut outs: BTreeMap<PartyId, O> = BTreeMap::new();
    for _ in 0..16 {
        if outs.len() == sessions.len() {
            break;
        }
        let batch = std::mem::take(&mut queue);
        for (me, s) in sessions.iter_mut() {
            if outs.contains_key(me) {
                continue;
            }
            let mine: Vec<WireMsg> = batch
                .iter()
                .filter(|m| m.from != *me && m.to.is_none_or(|t| t == *me))
                .cloned()
                .collect();
            let st = s.step(mine)?;
            queue.extend(st.out);
            if let Some(o) = st.done {
                outs.insert(*me, o);
            }
        }
    }
    sessions
        .into_iter()
        .map(|(p, s)| {
            outs.remove(&p)
                .map(|o| (o, s.busy))
                .ok_or_else(|| CustodyError::Ecdsa(format!("party {p} did not finish")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Verifier;

    /// Runs sessions to the end, moving every message to its recipients.
    fn run_all<O>(sessions: Vec<(PartyId, Session<O>)>) -> Result<Vec<O>, CustodyError> {
        Ok(run_rounds(sessions)?.into_iter().map(|(o, _)| o).collect())
    }

    fn keygen(t: u16, n: u16) -> Vec<DklsShare> {
        let sid = [7u8; 32];
        run_all(
            (1..=n)
                .map(|p| (p, keygen_session(sid, p, n, t).unwrap()))
                .collect(),
        )
        .unwrap()
    }

    fn copy(s: &DklsShare) -> DklsShare {
        DklsShare::from_bytes(&s.to_bytes()).unwrap()
    }

    fn sign(
        shares: &[DklsShare],
        signers: &[PartyId],
        msg: &[u8],
    ) -> Result<[u8; 64], CustodyError> {
        let mut sid = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut sid);
        let sessions = signers
            .iter()
            .map(|&p| {
                let s = shares.iter().find(|s| s.party() == p).unwrap();
                Ok((p, sign_session(sid, signers, copy(s), msg)?))
            })
            .collect::<Result<Vec<_>, CustodyError>>()?;
        let sigs = run_all(sessions)?;
        assert!(
            sigs.windows(2).all(|w| w[0] == w[1]),
            "every signer ends with one signature"
        );
        Ok(sigs[0])
    }

    fn sec1(pk: &p256::PublicKey) -> [u8; 33] {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        pk.to_encoded_point(true).as_bytes().try_into().unwrap()
    }

    fn verifies(pk: &[u8; 33], msg: &[u8], sig: &[u8; 64]) -> bool {
        let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(pk).unwrap();
        let sig = p256::ecdsa::Signature::from_slice(sig).unwrap();
        sig.normalize_s().is_none() && vk.verify(msg, &sig).is_ok()
    }

    #[test]
    fn any_t_of_n_sign_and_the_p256_crate_verifies() {
        let shares = keygen(2, 3);
        let pk = shares[0].public_key();
        assert!(shares.iter().all(|s| s.public_key() == pk));
        assert!(shares.iter().all(|s| s.identity() == shares[0].identity()));
        for signers in [[1, 2], [1, 3], [2, 3]] {
            let sig = sign(&shares, &signers, b"txid").unwrap();
            assert!(verifies(&pk, b"txid", &sig), "{signers:?}");
            assert!(!verifies(&pk, b"other", &sig));
        }
    }

    #[test]
    fn first_round_messages_that_arrive_with_the_start_are_kept_and_later_ones_refused() {
        let shares = keygen(2, 3);
        let sid = [2u8; 32];
        let mut a = sign_session(sid, &[1, 2], copy(&shares[0]), b"m").unwrap();
        let mut b = sign_session(sid, &[1, 2], copy(&shares[1]), b"m").unwrap();
        let b1 = b.step(Vec::new()).unwrap().out;
        // Party 1 is handed party 2's first message with its own start: it answers both.
        let st = a.step(b1).unwrap();
        assert_eq!(
            st.out.len(),
            2,
            "its first message and its answer to round 1"
        );
        // A party one round ahead is not taken: rounds come one at a time.
        let mut c = sign_session([3u8; 32], &[1, 2], copy(&shares[0]), b"m").unwrap();
        let mut d = sign_session([3u8; 32], &[1, 2], copy(&shares[1]), b"m").unwrap();
        let c1 = c.step(Vec::new()).unwrap().out;
        let d1 = d.step(Vec::new()).unwrap().out;
        let d2 = d.step(c1).unwrap().out;
        let mut both = d1;
        both.extend(d2);
        assert!(matches!(
            c.step(both),
            Err(CustodyError::Misbehaved { party: 2, .. })
        ));
    }

    #[test]
    fn fewer_than_t_cannot_sign_and_a_bad_signer_set_is_refused() {
        let shares = keygen(3, 4);
        let err = sign(&shares, &[1, 2], b"m").unwrap_err();
        assert!(matches!(err, CustodyError::BadParameters(_)), "{err}");
        assert!(sign(&shares, &[1, 1, 2], b"m").is_err());
        assert!(sign(&shares, &[1, 2, 5], b"m").is_err());
        let sig = sign(&shares, &[2, 3, 4], b"m").unwrap();
        assert!(verifies(&shares[0].public_key(), b"m", &sig));
        // t − 1 shares do not rebuild the key either.
        let two: Vec<DklsShare> = shares.iter().take(2).map(copy).collect();
        assert!(matches!(
            export(&two),
            Err(CustodyError::TooFewParties { have: 2, need: 3 })
        ));
    }

    #[test]
    fn refresh_keeps_the_key_and_old_shares_stop_working_with_new() {
        let shares = keygen(2, 3);
        let pk = shares[0].public_key();
        let sid = [9u8; 32];
        let fresh = run_all(
            shares
                .iter()
                .map(|s| (s.party(), refresh_session(sid, copy(s)).unwrap()))
                .collect(),
        )
        .unwrap();
        assert!(fresh.iter().all(|s| s.public_key() == pk));
        assert_ne!(fresh[0].identity(), shares[0].identity());
        let sig = sign(&fresh, &[1, 3], b"after").unwrap();
        assert!(verifies(&pk, b"after", &sig));
        // An old share and a new one: no signature.
        let mixed = vec![copy(&shares[0]), copy(&fresh[1])];
        assert!(sign(&mixed, &[1, 2], b"mixed").is_err());
        assert!(export(&mixed).is_err());
        // The secret is the same.
        assert_eq!(
            *export(&shares[..2]).unwrap(),
            *export(&fresh[1..]).unwrap()
        );
    }

    fn complete_refresh(shares: &[DklsShare], sid: [u8; 32]) -> Vec<DklsShare> {
        run_all(
            shares
                .iter()
                .map(|s| (s.party(), complete_refresh_session(sid, copy(s)).unwrap()))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn complete_refresh_makes_new_ot_and_keeps_the_key() {
        // An imported key: the dealer made every pair's OT set-up; the complete refresh makes
        // it anew, so what the dealer kept no longer matches.
        let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let bytes: [u8; 32] = secret.to_bytes().into();
        let dealt = import(&bytes, 2, 3).unwrap();
        let pk = dealt[0].public_key();
        let fresh = complete_refresh(&dealt, [4u8; 32]);
        assert!(fresh.iter().all(|s| s.public_key() == pk && !s.is_hollow()));
        assert!(fresh.iter().all(|s| s.identity() == fresh[0].identity()));
        assert_ne!(fresh[0].identity(), dealt[0].identity());
        for (old, new) in dealt.iter().zip(&fresh) {
            assert_ne!(
                encode(&old.party.mul_senders),
                encode(&new.party.mul_senders),
                "the OT state changes (made anew: the complete refresh runs the OT set-up of a key generation)"
            );
        }
        for signers in [[1, 2], [1, 3], [2, 3]] {
            let sig = sign(&fresh, &signers, b"after").unwrap();
            assert!(verifies(&pk, b"after", &sig), "{signers:?}");
        }
        let mixed = vec![copy(&dealt[0]), copy(&fresh[1])];
        assert!(sign(&mixed, &[1, 2], b"mixed").is_err());
        assert_eq!(*export(&fresh[..2]).unwrap(), bytes);
        // A fast refresh after it still works.
        let again = run_all(
            fresh
                .iter()
                .map(|s| (s.party(), refresh_session([5u8; 32], copy(s)).unwrap()))
                .collect(),
        )
        .unwrap();
        assert!(verifies(&pk, b"x", &sign(&again, &[2, 3], b"x").unwrap()));
    }

    #[test]
    fn repair_rebuilds_a_lost_share_that_signs_after_a_complete_refresh() {
        let shares = keygen(2, 3);
        let pk = shares[0].public_key();
        let rid = b"repair run 1";
        // Party 3 lost its share; parties 1 and 2 help.
        let parts: Vec<(PartyId, Vec<u8>)> = [1u16, 2]
            .iter()
            .map(|&h| {
                let t = repair_term(&shares[usize::from(h) - 1], &[1, 2], 3, rid).unwrap();
                (h, t.to_vec())
            })
            .collect();
        let hollow = repair_assemble(3, &parts, Some(&pk)).unwrap();
        assert!(hollow.is_hollow());
        assert_eq!(hollow.public_key(), pk);
        assert_eq!(hollow.party(), 3);
        assert_eq!(hollow.party.poly_point, shares[2].party.poly_point);
        // It survives storage, but cannot sign, take a fast refresh or help another repair.
        let stored = DklsShare::from_bytes(&hollow.to_bytes()).unwrap();
        assert!(stored.is_hollow());
        let with_hollow = vec![copy(&shares[0]), copy(&hollow)];
        assert!(matches!(
            sign(&with_hollow, &[1, 3], b"m"),
            Err(CustodyError::BadParameters(_))
        ));
        assert!(refresh_session([1u8; 32], copy(&hollow)).is_err());
        assert!(repair_term(&hollow, &[1, 3], 2, rid).is_err());
        // A complete refresh by all three makes it whole.
        let group = vec![copy(&shares[0]), copy(&shares[1]), hollow];
        let fresh = complete_refresh(&group, [6u8; 32]);
        assert!(fresh.iter().all(|s| s.public_key() == pk && !s.is_hollow()));
        for signers in [[1, 3], [2, 3], [1, 2]] {
            let sig = sign(&fresh, &signers, b"repaired").unwrap();
            assert!(verifies(&pk, b"repaired", &sig), "{signers:?}");
        }
    }

    #[test]
    fn hostile_repair_terms_are_refused() {
        let shares = keygen(2, 3);
        let pk = shares[0].public_key();
        let rid = b"rid";
        let term = |h: u16, helpers: &[PartyId], target, rid: &[u8]| {
            repair_term(&shares[usize::from(h) - 1], helpers, target, rid)
                .unwrap()
                .to_vec()
        };
        // Too few helpers, the target among them, a helper twice, an empty run id.
        assert!(repair_term(&shares[0], &[1], 3, rid).is_err());
        assert!(repair_term(&shares[0], &[1, 3], 3, rid).is_err());
        assert!(repair_term(&shares[0], &[1, 1, 2], 3, rid).is_err());
        assert!(repair_term(&shares[0], &[1, 2], 3, b"").is_err());
        assert!(repair_term(&shares[0], &[1, 2], 9, rid).is_err());
        // One part alone, or parts for different run ids, do not add up.
        assert!(repair_assemble(3, &[(1, term(1, &[1, 2], 3, rid))], Some(&pk)).is_err());
        let mismatched = [
            (1, term(1, &[1, 2], 3, rid)),
            (2, term(2, &[1, 2], 3, b"other")),
        ];
        assert!(repair_assemble(3, &mismatched, Some(&pk)).is_err());
        // A part relayed as another helper's, or meant for another target.
        let relabelled = [(1, term(1, &[1, 2], 3, rid)), (1, term(2, &[1, 2], 3, rid))];
        assert!(matches!(
            repair_assemble(3, &relabelled, Some(&pk)),
            Err(CustodyError::Misbehaved { party: 1, .. })
        ));
        let other_target = [(1, term(1, &[1, 2], 3, rid)), (2, term(2, &[1, 2], 3, rid))];
        assert!(repair_assemble(2, &other_target, None).is_err());
        // Another key's helpers.
        let other = keygen(2, 3);
        let foreign = [
            (1, repair_term(&other[0], &[1, 2], 3, rid).unwrap().to_vec()),
            (2, repair_term(&other[1], &[1, 2], 3, rid).unwrap().to_vec()),
        ];
        assert!(matches!(
            repair_assemble(3, &foreign, Some(&pk)),
            Err(CustodyError::Inconsistent(_))
        ));
        // Helpers disagreeing on the package.
        let split = [
            (1, term(1, &[1, 2], 3, rid)),
            (2, repair_term(&other[1], &[1, 2], 3, rid).unwrap().to_vec()),
        ];
        assert!(repair_assemble(3, &split, None).is_err());
        // Garbage.
        assert!(repair_assemble(3, &[(1, vec![1, 2, 3]), (2, vec![])], None).is_err());
        assert!(repair_assemble::<Vec<u8>>(3, &[], None).is_err());
        // The honest parts still work.
        assert!(repair_assemble(3, &other_target, Some(&pk)).is_ok());
    }

    #[test]
    fn import_export_and_key_addition() {
        let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let bytes: [u8; 32] = secret.to_bytes().into();
        let pk = sec1(&secret.public_key());
        let shares = import(&bytes, 2, 3).unwrap();
        assert!(shares.iter().all(|s| s.public_key() == pk));
        assert_eq!(*export(&shares[1..]).unwrap(), bytes);
        let sig = sign(&shares, &[1, 3], b"imported").unwrap();
        assert!(verifies(&pk, b"imported", &sig));

        // r1 + r2: the sum's key is r1's key plus r2·G and it signs; r1's holder of r2 alone
        // (the sender) cannot sign for it.
        let r2 = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let r2b: [u8; 32] = r2.to_bytes().into();
        let sum: Vec<DklsShare> = shares.iter().map(|s| add_key(s, &r2b).unwrap()).collect();
        let want = p256::PublicKey::from_affine(
            (p256::ProjectivePoint::from(*secret.public_key().as_affine())
                + p256::ProjectivePoint::from(*r2.public_key().as_affine()))
            .to_affine(),
        )
        .unwrap();
        assert_eq!(sum[0].public_key(), sec1(&want));
        let sig = sign(&sum, &[2, 3], b"sum").unwrap();
        assert!(verifies(&sum[0].public_key(), b"sum", &sig));
        assert!(!verifies(&pk, b"sum", &sig));
        assert!(add_key(&shares[0], &[0u8; 32]).is_err());
        assert!(import(&[0u8; 32], 2, 3).is_err());
        assert!(import(&bytes, 1, 3).is_err());
        assert!(import(&bytes, 4, 3).is_err());
    }

    #[test]
    fn shares_round_trip_and_damage_is_refused() {
        let shares = keygen(2, 3);
        let b = shares[1].to_bytes();
        let back = DklsShare::from_bytes(&b).unwrap();
        assert_eq!(back.identity(), shares[1].identity());
        assert_eq!((back.party(), back.t(), back.n()), (2, 2, 3));
        assert!(DklsShare::from_bytes(&b[..b.len() / 2]).is_err());
        assert!(DklsShare::from_bytes(b"").is_err());
        // Another party's package under this party's share: refused.
        let mut f: ShareFile = postcard::from_bytes(&b).unwrap();
        f.party.poly_point += Scalar::ONE;
        assert!(DklsShare::from_bytes(&encode(&f)).is_err());
    }

    #[test]
    fn hostile_messages_end_the_run_and_name_the_sender() {
        let shares = keygen(2, 3);
        let sid = [3u8; 32];
        let mut a = sign_session(sid, &[1, 2], copy(&shares[0]), b"m").unwrap();
        let mut b = sign_session(sid, &[1, 2], copy(&shares[1]), b"m").unwrap();
        let _ = a.step(Vec::new()).unwrap();
        let out_b = b.step(Vec::new()).unwrap().out;
        assert_eq!(out_b.len(), 1);
        // Garbage from party 2: named.
        let mut bad = out_b[0].clone();
        bad.body = vec![1, 2, 3];
        match a.step(vec![bad]) {
            Err(CustodyError::Misbehaved { party: 2, .. }) => {}
            other => panic!("{:?}", other.err()),
        }
        // The run is over for good.
        assert!(a.step(out_b.clone()).is_err());
        // A party outside the signer set, or a broadcast in a direct round: refused.
        let mut c = sign_session([4u8; 32], &[1, 2], copy(&shares[0]), b"m").unwrap();
        let _ = c.step(Vec::new()).unwrap();
        let mut stranger = out_b[0].clone();
        stranger.from = 3;
        assert!(c.step(vec![stranger]).is_err());
        let mut d = sign_session([5u8; 32], &[1, 2], copy(&shares[0]), b"m").unwrap();
        let _ = d.step(Vec::new()).unwrap();
        let mut bcast = out_b[0].clone();
        bcast.to = None;
        assert!(matches!(
            d.step(vec![bcast]),
            Err(CustodyError::Misbehaved { party: 2, .. })
        ));
        // Signers that disagree on the message: no signature.
        assert!(sign_pair_with_messages(&shares, b"one", b"two").is_err());
    }

    #[test]
    fn a_failed_ot_consistency_check_names_the_party_to_ban() {
        let shares = keygen(2, 3);
        let sid = [8u8; 32];
        let mut a = sign_session(sid, &[1, 3], copy(&shares[0]), b"m").unwrap();
        let mut b = sign_session(sid, &[1, 3], copy(&shares[2]), b"m").unwrap();
        let a1 = a.step(Vec::new()).unwrap().out;
        let b1 = b.step(Vec::new()).unwrap().out;
        let _a2 = a.step(b1).unwrap().out;
        let b2 = b.step(a1).unwrap().out;
        // Party 3 sends party 1 a second-round message whose commitment to its share of the
        // instance key does not match its multiplication: the check that protects the OT
        // state fails, and party 3 is the one to ban.
        let mut m: TransmitPhase2to3<NistP256> = postcard::from_bytes(&b2[0].body).unwrap();
        m.gamma_u = AffinePoint::GENERATOR;
        let mut bad = b2[0].clone();
        bad.body = encode(&m);
        match a.step(vec![bad]) {
            Err(CustodyError::Banned { party: 3, .. }) => {}
            other => panic!("{:?}", other.err()),
        }
    }

    fn sign_pair_with_messages(
        shares: &[DklsShare],
        m1: &[u8],
        m2: &[u8],
    ) -> Result<Vec<[u8; 64]>, CustodyError> {
        let sid = [6u8; 32];
        run_all(vec![
            (1, sign_session(sid, &[1, 2], copy(&shares[0]), m1)?),
            (2, sign_session(sid, &[1, 2], copy(&shares[1]), m2)?),
        ])
    }
}

#[cfg(test)]
mod timing {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// `cargo test --release -p florin-custody --lib -- --ignored note_key_costs --nocapture`
    #[test]
    #[ignore]
    fn note_key_costs() {
        let secret = random_scalar();
        let shares = import(&secret, 2, 3).unwrap();
        let base = shares[0].public_key();
        let t = random_scalar();
        let n = 200;
        let time = |what: &str, f: &mut dyn FnMut()| {
            let s = std::time::Instant::now();
            for _ in 0..n {
                f();
            }
            eprintln!(
                "{what}: {:.1} µs",
                s.elapsed().as_secs_f64() * 1e6 / n as f64
            );
        };
        time("tweak_public", &mut || {
            tweak_public(&base, &t).unwrap();
        });
        time("public_of", &mut || {
            public_of(&t).unwrap();
        });
        time("add_key", &mut || {
            add_key(&shares[0], &t).unwrap();
        });
        let stored = shares[0].to_bytes();
        time("from_bytes", &mut || {
            DklsShare::from_bytes(&stored).unwrap();
        });
    }
}

//! Threshold ECDSA on P-256 with CGGMP24, for custodial wallet keys (the source document's R3–R6).
//!
//! Library: `cggmp24 =0.7.0-alpha.3` (Lockness, the successor of the `cggmp21` the document
//! chose). Why not `cggmp21 =0.6.3`: its own changelog says its proofs lack checks that the
//! CGGMP24 paper added and points users to `cggmp24`; it needs GMP built from source (and `m4`),
//! where `cggmp24`'s default big-integer backend is pure Rust and builds in ≈ 30 s here. The price
//! is an alpha version (pinned exactly, with `cggmp24-keygen` and `paillier-zk` pinned to the same
//! alpha, since a newer alpha of those breaks the build) and somewhat slower arithmetic.
//!
//! The pieces, in the order a key-management network uses them:
//! 1. [`Primes`]: four safe primes per node (two for its Paillier key, two for its ring-Pedersen
//!    parameters). Minutes of CPU each at [`Production`] strength, so nodes keep a pool made in
//!    the background and never generate on a request path.
//! 2. [`aux_session`]: auxiliary information (Paillier keys and ring-Pedersen parameters with
//!    their ZK proofs), run once per group of nodes. One [`AuxShare`] serves every key the group
//!    holds: the CGGMP24 authors show reuse across keys is safe for a fixed set of signers.
//! 3. [`keygen_session`]: distributed key generation of a t-of-n key; the output [`CoreShare`]
//!    plus the node's [`AuxShare`] make a signing [`KeyShare`]. [`import`] splits an existing key
//!    instead (a trusted dealer, R5); [`add_key`] turns shares of `r1` into shares of `r1 + r2`
//!    (key addition, R5); [`export`] rebuilds the key from t shares (R4).
//! 4. [`presign_session`]: three rounds among t signers, independent of the message, giving each
//!    signer a [`Presignature`] and everyone the same [`PresigPublic`]. Pools of these make
//!    online signing one step.
//! 5. [`partial_sign`] (a node, from a presignature, no interaction) and [`combine`] (the
//!    coordinator): checks every partial against the presignature's commitments, names the
//!    signer of a bad one, and returns a low-S `r ‖ s` signature that the ordinary `p256`
//!    verifier accepts. [`sign_session`] is the interactive fallback when the pool is empty.
//!
//! Every protocol is a [`Session`]: the caller moves [`WireMsg`]s between parties, as the
//! FROST side does. Parties are named by [`PartyId`] (1 to n) on the wire and in errors. The
//! library's reliable-broadcast check (each party echoes a hash of what it received in the
//! broadcast rounds) is on. When it fails the session stops with
//! [`CustodyError::Inconsistent`], naming no one, because the library cannot tell the sender
//! from a lying echoer. A party whose proof fails is named in [`CustodyError::Misbehaved`], and
//! so is one that sends bytes that do not decode. A session that received a bad message stops.
//!
//! Messages are signed ECDSA-P256-SHA256 of the message bytes (for ledger witnesses, the
//! 32-byte txid), exactly as `p256::ecdsa::SigningKey::sign` would.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use cggmp24::generic_ec::coords::AlwaysHasAffineX;
use cggmp24::generic_ec::{NonZero, Point, Scalar, SecretScalar};
use cggmp24::key_share::{AuxInfo, DirtyIncompleteKeyShare, Validate};
use cggmp24::round_based::state_machine::{ProceedResult, StateMachine};
use cggmp24::round_based::{Incoming, MessageDestination, MessageType};
pub use cggmp24::security_level::SecurityLevel;
use cggmp24::signing::{DataToSign, PartialSignature, PresignatureCommitment};
use cggmp24::{ExecutionId, IncompleteKeyShare, PregeneratedPrimes};
use rand::rngs::{OsRng, StdRng};
use rand::{CryptoRng, RngCore, SeedableRng};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::{CustodyError, PartyId};

/// The curve: NIST P-256 (secp256r1), for smart-card compatibility (R6).
pub type Curve = cggmp24::supported_curves::Secp256r1;

/// The production security level: 128-bit, 1536-bit Paillier primes (3072-bit moduli).
pub use cggmp24::security_level::SecurityLevel128 as Production;

/// A deliberately **insecure** security level with 768-bit primes, so tests and the quick
/// benchmark run the same protocol code in seconds instead of minutes. Never use it for keys
/// that hold value: 1536-bit Paillier moduli give well under 128-bit security. The proof masks
/// (ε = 512, ℓ = 256) are the production ones; ℓ′ is cut to 768 so every masked value still fits
/// the smaller modulus (with ε = 256 the range proofs of honest parties fail at random).
#[derive(Clone, Debug)]
pub struct InsecureTest;
cggmp24::define_security_level!(InsecureTest {
    kappa_bits: 256,
    rsa_prime_bitlen: 768,
    rsa_pubkey_bitlen: 1535,
    epsilon: 512,
    ell: 256,
    ell_prime: 768,
    m: 128,
});

/// A fresh RNG for one protocol run: seeded once from the OS (drawing every number from the
/// OS costs a minute of system time per prime search).
pub fn session_rng() -> StdRng {
    StdRng::from_entropy()
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    // These types always serialize; an empty encoding would fail to decode loudly.
    serde_json::to_vec(v).unwrap_or_default()
}

fn from_json<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, CustodyError> {
    serde_json::from_slice(bytes).map_err(|e| CustodyError::malformed(format!("{what}: {e}")))
}

/// Four safe primes for one node's auxiliary information. Secret; used once.
pub struct Primes<L: SecurityLevel = Production>(PregeneratedPrimes<L>);

impl<L: SecurityLevel> Primes<L> {
    /// Searches for four safe primes. Minutes of CPU at [`Production`] strength: run it in the
    /// background (a prime pool), never on a request path.
    pub fn generate<R: RngCore + CryptoRng>(rng: &mut R) -> Self {
        Primes(PregeneratedPrimes::generate(rng))
    }

    /// Encoding for a pool file (secret: store it like a key share).
    pub fn to_bytes(&self) -> Vec<u8> {
        to_json(&self.0)
    }

    /// Decodes [`Primes::to_bytes`], refusing numbers too small for the security level.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        let p: PregeneratedPrimes<L> = from_json(bytes, "primes")?;
        let p = PregeneratedPrimes::try_from(p.into_primes())
            .map_err(|_| CustodyError::malformed("primes: too small for the security level"))?;
        Ok(Primes(p))
    }
}

/// One node's auxiliary information for its group (its Paillier secret key, everyone's
/// Paillier public keys and ring-Pedersen parameters). Secret; one per node per group.
#[derive(Clone)]
pub struct AuxShare<L: SecurityLevel = Production>(AuxInfo<L>);

impl<L: SecurityLevel> AuxShare<L> {
    /// Encoding for storage (secret).
    pub fn to_bytes(&self) -> Vec<u8> {
        to_json(&self.0)
    }

    /// Decodes and validates [`AuxShare::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        Ok(AuxShare(from_json(bytes, "auxiliary info")?))
    }

    /// Number of parties in the group.
    pub fn n(&self) -> u16 {
        self.0.N.len() as u16
    }
}

/// One node's share of a key before it is joined with the node's [`AuxShare`]: the secret
/// share, everyone's public shares and the group key. Secret.
#[derive(Clone)]
pub struct CoreShare(IncompleteKeyShare<Curve>);

impl CoreShare {
    /// Encoding for storage (secret).
    pub fn to_bytes(&self) -> Vec<u8> {
        to_json(&self.0)
    }

    /// Decodes and validates (the share must match its own public share, the public shares must
    /// lie on one polynomial of the stated degree).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        Ok(CoreShare(from_json(bytes, "key share")?))
    }

    /// The group's public key, SEC1-compressed (33 bytes), as the ledger and `p256` take it.
    pub fn public_key(&self) -> [u8; 33] {
        compressed(&self.0.shared_public_key)
    }

    /// This share's party (1 to n).
    pub fn party(&self) -> PartyId {
        self.0.i + 1
    }

    /// Parties holding shares.
    pub fn n(&self) -> u16 {
        self.0.n()
    }

    /// Parties needed to sign.
    pub fn t(&self) -> u16 {
        self.0.min_signers()
    }

    /// The whole sharing's identity, public: the group key (33 bytes) then a digest of t, n
    /// and every party's public share (32 bytes). Two splits of one key share the public key
    /// but not the identity, so a coordinator that compares identities never makes a key of
    /// shares from two different splits.
    pub fn identity(&self) -> Vec<u8> {
        let mut h = florin_crypto::Hasher::new("florin/custody/ecdsa/sharing/v1");
        h.update(&self.t().to_le_bytes());
        h.update(&self.n().to_le_bytes());
        for p in &self.0.public_shares {
            h.update(&compressed(p));
        }
        let mut out = self.public_key().to_vec();
        out.extend_from_slice(&h.finalize());
        out
    }
}

/// The group key (SEC1-compressed) in a sharing identity ([`CoreShare::identity`]).
pub fn identity_public_key(identity: &[u8]) -> Option<[u8; 33]> {
    identity.get(..33)?.try_into().ok()
}

fn compressed(p: &Point<Curve>) -> [u8; 33] {
    let enc = p.to_bytes(true);
    let mut out = [0u8; 33];
    out.copy_from_slice(enc.as_bytes());
    out
}

/// A share ready to sign: a [`CoreShare`] joined with its node's [`AuxShare`].
#[derive(Clone)]
pub struct KeyShare<L: SecurityLevel = Production>(cggmp24::KeyShare<Curve, L>, CoreShare);

impl<L: SecurityLevel> KeyShare<L> {
    /// Joins a key's core share with the node's auxiliary information; refuses a pair from
    /// different groups or parties.
    pub fn from_parts(core: CoreShare, aux: AuxShare<L>) -> Result<Self, CustodyError> {
        cggmp24::KeyShare::from_parts((core.0.clone(), aux.0))
            .map(|k| KeyShare(k, core))
            .map_err(|e| CustodyError::BadParameters(format!("share and aux info do not fit: {e}")))
    }

    /// The group's public key, SEC1-compressed.
    pub fn public_key(&self) -> [u8; 33] {
        self.1.public_key()
    }

    /// This share's party (1 to n).
    pub fn party(&self) -> PartyId {
        self.1.party()
    }

    /// Parties needed to sign.
    pub fn t(&self) -> u16 {
        self.1.t()
    }

    /// The core share (for export).
    pub fn core(&self) -> &CoreShare {
        &self.1
    }
}

/// A protocol message between parties: from whom, to whom (`None`: every party of the
/// session), and the encoded body. The caller carries it and must authenticate `from`:
/// `WireMsg` itself is not signed. A coordinator that relays messages between nodes must wrap
/// them in [`crate::envelope`]s, signed by the sender and, for P2P messages, sealed to the
/// recipient (P2P messages carry secret material).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireMsg {
    /// Sender.
    pub from: PartyId,
    /// Recipient, or `None` for a broadcast.
    pub to: Option<PartyId>,
    /// Encoded protocol message.
    pub body: Vec<u8>,
}

/// Shows the route and the body's length only: P2P bodies carry secret shares in the clear.
impl Debug for WireMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireMsg")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// What one [`Session::step`] produced: messages to deliver and, at the end, the output.
pub struct Step<O> {
    /// Messages to deliver to other parties.
    pub out: Vec<WireMsg>,
    /// The protocol's result, once it is finished.
    pub done: Option<O>,
}

pub(crate) trait Driver<O> {
    fn deliver(&mut self, m: WireMsg) -> Result<(), CustodyError>;
    fn abort(&mut self);
    fn run(&mut self) -> Result<Step<O>, CustodyError>;
}

struct Machine<S: StateMachine> {
    sm: S,
    /// `parties[k]` is the party with session index `k`.
    parties: Vec<PartyId>,
    me: PartyId,
    inbox: VecDeque<Incoming<S::Msg>>,
    next_id: u64,
    finished: bool,
}

impl<S, M, O, E> Driver<O> for Machine<S>
where
    S: StateMachine<Msg = M, Output = Result<O, E>>,
    M: Serialize + DeserializeOwned,
    E: Debug + std::fmt::Display,
{
    fn deliver(&mut self, m: WireMsg) -> Result<(), CustodyError> {
        if m.to.is_some_and(|to| to != self.me) {
            return Err(CustodyError::OutOfOrder(format!(
                "message for party {} delivered to party {}",
                m.to.unwrap_or_default(),
                self.me
            )));
        }
        let Some(sender) = self.parties.iter().position(|&p| p == m.from) else {
            return Err(CustodyError::BadParameters(format!(
                "party {} is not in this session",
                m.from
            )));
        };
        if m.from == self.me {
            return Err(CustodyError::OutOfOrder("a party's own message".into()));
        }
        let msg: M = serde_json::from_slice(&m.body).map_err(|e| CustodyError::Misbehaved {
            party: m.from,
            reason: format!("sent bytes that are not a protocol message: {e}"),
        })?;
        self.inbox.push_back(Incoming {
            id: self.next_id,
            sender: sender as u16,
            msg_type: if m.to.is_none() {
                MessageType::Broadcast
            } else {
                MessageType::P2P
            },
            msg,
        });
        self.next_id += 1;
        Ok(())
    }

    fn abort(&mut self) {
        self.finished = true;
    }

    fn run(&mut self) -> Result<Step<O>, CustodyError> {
        let mut out = Vec::new();
        if self.finished {
            return Err(CustodyError::OutOfOrder("session already finished".into()));
        }
        loop {
            match self.sm.proceed() {
                ProceedResult::SendMsg(o) => {
                    let to = match o.recipient {
                        MessageDestination::AllParties => None,
                        MessageDestination::OneParty(k) => Some(
                            *self
                                .parties
                                .get(k as usize)
                                .ok_or_else(|| CustodyError::Ecdsa("bad recipient".into()))?,
                        ),
                    };
                    out.push(WireMsg {
                        from: self.me,
                        to,
                        body: serde_json::to_vec(&o.msg).unwrap_or_default(),
                    });
                }
                ProceedResult::NeedsOneMoreMessage => match self.inbox.pop_front() {
                    Some(m) => {
                        if self.sm.received_msg(m).is_err() {
                            return Err(CustodyError::Ecdsa(
                                "state machine refused a message".into(),
                            ));
                        }
                    }
                    None => return Ok(Step { out, done: None }),
                },
                ProceedResult::Yielded => {}
                ProceedResult::Output(Ok(o)) => {
                    self.finished = true;
                    return Ok(Step { out, done: Some(o) });
                }
                ProceedResult::Output(Err(e)) => {
                    self.finished = true;
                    return Err(blame(&e, &self.parties));
                }
                ProceedResult::Error(e) => {
                    self.finished = true;
                    return Err(CustodyError::Ecdsa(format!("protocol execution: {e}")));
                }
            }
        }
    }
}

/// Turns a protocol error into a typed one, naming the parties the library blamed (its error
/// carries `faulty_party` indices in the session's numbering).
fn blame<E: Debug + std::fmt::Display>(e: &E, parties: &[PartyId]) -> CustodyError {
    let detail = format!("{e:?}");
    if detail.contains("NotReliable") {
        // The echo check failed: parties saw different broadcasts. The library lists every
        // party whose echo differs from ours, which includes honest ones, so no one is named.
        return CustodyError::Inconsistent(format!("{e}: {detail}"));
    }
    let mut culprits: Vec<PartyId> = Vec::new();
    for piece in detail.split("faulty_party: ").skip(1) {
        let digits: String = piece.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let Some(p) = digits
            .parse::<usize>()
            .ok()
            .and_then(|k| parties.get(k).copied())
        {
            if !culprits.contains(&p) {
                culprits.push(p);
            }
        }
    }
    match culprits.first() {
        Some(&party) => CustodyError::Misbehaved {
            party,
            reason: format!("{e} (blamed parties {culprits:?}): {detail}"),
        },
        None => CustodyError::Ecdsa(format!("{e}: {detail}")),
    }
}

/// One party's run of one protocol. Feed it the messages addressed to it with
/// [`Session::step`]; it answers with messages to send and, at the end, its output.
///
/// A session is single-threaded (the library's state machine is not `Send`); a node runs each
/// on one thread.
pub struct Session<O> {
    driver: Box<dyn Driver<O>>,
    /// CPU time spent inside [`Session::step`].
    pub busy: Duration,
}

impl<O> Session<O> {
    /// Delivers `incoming` (any order within a round is fine) and runs as far as possible.
    pub fn step(&mut self, incoming: Vec<WireMsg>) -> Result<Step<O>, CustodyError> {
        let start = Instant::now();
        let r = {
            // Every message is looked at; a bad one ends the session (fail closed) and the
            // first error is returned.
            let mut first = None;
            for m in incoming {
                if let Err(e) = self.driver.deliver(m) {
                    first.get_or_insert(e);
                }
            }
            match first {
                Some(e) => {
                    self.driver.abort();
                    Err(e)
                }
                None => self.driver.run(),
            }
        };
        self.busy += start.elapsed();
        r
    }
}

/// A session around any driver (the DKLs23 engine's too).
pub(crate) fn session_of<O>(driver: Box<dyn Driver<O>>) -> Session<O> {
    Session {
        driver,
        busy: Duration::ZERO,
    }
}

fn session<S, M, O, E>(sm: S, parties: Vec<PartyId>, me: PartyId) -> Session<O>
where
    S: StateMachine<Msg = M, Output = Result<O, E>> + 'static,
    M: Serialize + DeserializeOwned + 'static,
    E: Debug + std::fmt::Display + 'static,
    O: 'static,
{
    Session {
        driver: Box::new(Machine {
            sm,
            parties,
            me,
            inbox: VecDeque::new(),
            next_id: 0,
            finished: false,
        }),
        busy: Duration::ZERO,
    }
}

fn check_group(n: u16, me: PartyId) -> Result<Vec<PartyId>, CustodyError> {
    if n < 2 || me == 0 || me > n {
        return Err(CustodyError::BadParameters(format!(
            "party {me} of {n} (parties are 1 to n, n ≥ 2)"
        )));
    }
    Ok((1..=n).collect())
}

/// Auxiliary-information generation for party `me` of `n`, from this node's [`Primes`].
/// Every party must use the same `session` id, fresh for this run.
pub fn aux_session<L: SecurityLevel>(
    session_id: [u8; 32],
    me: PartyId,
    n: u16,
    primes: Primes<L>,
) -> Result<Session<AuxShare<L>>, CustodyError> {
    let parties = check_group(n, me)?;
    let mut rng = session_rng();
    let sm = cggmp24::round_based::state_machine::wrap_protocol(move |party| async move {
        let eid = ExecutionId::new(&session_id);
        cggmp24::aux_info_gen(eid, me - 1, n, primes.0)
            .start(&mut rng, party)
            .await
            .map(AuxShare)
    });
    Ok(session(sm, parties, me))
}

/// Distributed generation of a `t`-of-`n` key, party `me`. All `n` parties take part.
pub fn keygen_session<L: SecurityLevel>(
    session_id: [u8; 32],
    me: PartyId,
    n: u16,
    t: u16,
) -> Result<Session<CoreShare>, CustodyError> {
    let parties = check_group(n, me)?;
    if t < 2 || t > n {
        return Err(CustodyError::BadParameters(format!(
            "threshold {t} of {n} (2 ≤ t ≤ n)"
        )));
    }
    let mut rng = session_rng();
    let sm = cggmp24::round_based::state_machine::wrap_protocol(move |party| async move {
        let eid = ExecutionId::new(&session_id);
        cggmp24::keygen::<Curve>(eid, me - 1, n)
            .set_threshold(t)
            .set_security_level::<L>()
            .start(&mut rng, party)
            .await
            .map(CoreShare)
    });
    Ok(session(sm, parties, me))
}

/// Checks the signer set and returns it in canonical (ascending) order, which fixes every
/// party's session index whatever order the caller listed them in.
fn check_signers<L: SecurityLevel>(
    share: &KeyShare<L>,
    signers: &[PartyId],
) -> Result<Vec<PartyId>, CustodyError> {
    let t = share.t() as usize;
    let n = share.1.n();
    let mut sorted = signers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != signers.len() || signers.iter().any(|&p| p == 0 || p > n) {
        return Err(CustodyError::BadParameters(format!(
            "signers {signers:?} must be distinct parties 1 to {n}"
        )));
    }
    if signers.len() != t {
        return Err(CustodyError::TooFewParties {
            have: signers.len(),
            need: t,
        });
    }
    if !signers.contains(&share.party()) {
        return Err(CustodyError::BadParameters(format!(
            "party {} is not among the signers {signers:?}",
            share.party()
        )));
    }
    Ok(sorted)
}

fn index_of(signers: &[PartyId], me: PartyId) -> Result<u16, CustodyError> {
    signers
        .iter()
        .position(|&p| p == me)
        .map(|k| k as u16)
        .ok_or_else(|| CustodyError::BadParameters(format!("party {me} is not a signer")))
}

/// A signer's secret half of a presignature. Signs exactly once: [`partial_sign`] consumes it.
/// Never store it where a restart could bring it back after use.
pub struct Presignature {
    inner: cggmp24::signing::Presignature<Curve>,
}

impl Presignature {
    /// Encoding, for a node that keeps its presignatures across restarts (sealed, and
    /// deleted durably before it signs with one: see the node's storage).
    pub fn to_bytes(&self) -> zeroize::Zeroizing<Vec<u8>> {
        zeroize::Zeroizing::new(to_json(&self.inner))
    }

    /// Decodes [`Presignature::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        Ok(Presignature {
            inner: from_json(bytes, "presignature")?,
        })
    }
}

/// The public half of a presignature, the same at every signer: what [`combine`] needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresigPublic {
    /// The signers, in session order.
    pub signers: Vec<PartyId>,
    gamma: NonZero<Point<Curve>>,
    commitments: Vec<(Point<Curve>, Point<Curve>)>,
}

impl PresigPublic {
    /// Encoding, for the coordinator's pool.
    pub fn to_bytes(&self) -> Vec<u8> {
        to_json(self)
    }

    /// Decodes [`PresigPublic::to_bytes`]: distinct signers in ascending order, one commitment
    /// pair each.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        let p: PresigPublic = from_json(bytes, "presignature commitments")?;
        if p.signers.len() < 2
            || p.signers.len() != p.commitments.len()
            || p.signers.contains(&0)
            || p.signers.windows(2).any(|w| w[0] >= w[1])
        {
            return Err(CustodyError::malformed(
                "presignature commitments: signer list",
            ));
        }
        Ok(p)
    }
}

/// Generation of a presignature by exactly t `signers` (any t of the n parties), as party
/// `share.party()`. Independent of the message.
pub fn presign_session<L: SecurityLevel>(
    session_id: [u8; 32],
    signers: &[PartyId],
    share: KeyShare<L>,
) -> Result<Session<(Presignature, PresigPublic)>, CustodyError> {
    let signers = check_signers(&share, signers)?;
    let at_keygen: Vec<u16> = signers.iter().map(|p| p - 1).collect();
    let me = share.party();
    let i = index_of(&signers, me)?;
    let signers2 = signers.clone();
    let mut rng = session_rng();
    let sm = cggmp24::round_based::state_machine::wrap_protocol(move |party| async move {
        let eid = ExecutionId::new(&session_id);
        let (presig, public) = cggmp24::signing(eid, i, &at_keygen, &share.0)
            .generate_presignature(&mut rng, party)
            .await?;
        Ok::<_, cggmp24::SigningError>((
            Presignature { inner: presig },
            PresigPublic {
                signers: signers2,
                gamma: public.Gamma,
                commitments: public
                    .commitments
                    .iter()
                    .map(|c| (c.tilde_Delta, c.tilde_S))
                    .collect(),
            },
        ))
    });
    Ok(session(sm, signers, me))
}

/// Interactive signing by exactly t `signers`: the fallback when no presignature is left
/// (four rounds, about as long as a presignature).
pub fn sign_session<L: SecurityLevel>(
    session_id: [u8; 32],
    signers: &[PartyId],
    share: KeyShare<L>,
    message: &[u8],
) -> Result<Session<[u8; 64]>, CustodyError> {
    let signers = check_signers(&share, signers)?;
    let at_keygen: Vec<u16> = signers.iter().map(|p| p - 1).collect();
    let me = share.party();
    let i = index_of(&signers, me)?;
    let data = DataToSign::<Curve>::digest::<Sha256>(message);
    let mut rng = session_rng();
    let sm = cggmp24::round_based::state_machine::wrap_protocol(move |party| async move {
        let eid = ExecutionId::new(&session_id);
        let sig = cggmp24::signing(eid, i, &at_keygen, &share.0)
            .sign(&mut rng, party, &data)
            .await?;
        Ok::<_, cggmp24::SigningError>(encode_signature(&sig.normalize_s()))
    });
    Ok(session(sm, signers, me))
}

fn encode_signature(sig: &cggmp24::signing::Signature<Curve>) -> [u8; 64] {
    let mut out = [0u8; 64];
    sig.write_to_slice(&mut out);
    out
}

/// A signer's contribution to one signature, made from a presignature without interaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The signer.
    pub party: PartyId,
    sigma: Scalar<Curve>,
}

impl Partial {
    /// Encoding (34 bytes: party little-endian, then σ big-endian). Not secret.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(34);
        out.extend_from_slice(&self.party.to_le_bytes());
        out.extend_from_slice(self.sigma.to_be_bytes().as_bytes());
        out
    }

    /// Decodes [`Partial::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CustodyError> {
        if bytes.len() != 34 {
            return Err(CustodyError::malformed("partial signature length"));
        }
        let party = u16::from_le_bytes([bytes[0], bytes[1]]);
        let sigma = Scalar::from_be_bytes(&bytes[2..])
            .map_err(|_| CustodyError::malformed("partial signature scalar"))?;
        Ok(Partial { party, sigma })
    }
}

/// Signs `message` with a presignature: one multiplication, no interaction. Consumes the
/// presignature — using one twice would reveal the key.
pub fn partial_sign(party: PartyId, presig: Presignature, message: &[u8]) -> Partial {
    let data = DataToSign::<Curve>::digest::<Sha256>(message);
    let PartialSignature { sigma } = presig.inner.issue_partial_signature(data);
    Partial { party, sigma }
}

/// Combines one partial per signer into an ECDSA signature (`r ‖ s`, low-S), after checking
/// each partial against the presignature's public commitments; a bad one names its signer.
/// The result is verified against `public_key` before it is returned.
///
/// `Partial::party` is what the sender wrote: the caller must check that it is the
/// authenticated sender of that partial (the envelope's signer), or one node could have another
/// blamed. A `public` from another presignature than the partials' also blames the first signer
/// checked, so pools must keep each `PresigPublic` with its presignature id.
pub fn combine(
    public: &PresigPublic,
    partials: &[Partial],
    message: &[u8],
    public_key: &[u8; 33],
) -> Result<[u8; 64], CustodyError> {
    if partials.len() != public.signers.len() || public.commitments.len() != partials.len() {
        return Err(CustodyError::TooFewParties {
            have: partials.len(),
            need: public.signers.len(),
        });
    }
    let m = DataToSign::<Curve>::digest::<Sha256>(message);
    let r = public.gamma.x().to_scalar();
    let mut ordered = Vec::with_capacity(partials.len());
    for (k, signer) in public.signers.iter().enumerate() {
        let p = partials
            .iter()
            .find(|p| p.party == *signer)
            .ok_or_else(|| {
                CustodyError::BadParameters(format!("no partial from party {signer}"))
            })?;
        let (delta, s) = &public.commitments[k];
        if *public.gamma * p.sigma != *delta * m.to_scalar() + *s * r {
            return Err(CustodyError::Misbehaved {
                party: *signer,
                reason: "partial signature does not match its presignature commitment".into(),
            });
        }
        ordered.push(PartialSignature { sigma: p.sigma });
    }
    let public_data = cggmp24::signing::PresignaturePublicData {
        Gamma: public.gamma,
        commitments: public
            .commitments
            .iter()
            .map(|(d, s)| PresignatureCommitment {
                tilde_Delta: *d,
                tilde_S: *s,
            })
            .collect(),
    };
    let sig = PartialSignature::combine(&ordered, &public_data, m)
        .ok_or_else(|| CustodyError::Ecdsa("partials do not combine".into()))?;
    let pk = Point::<Curve>::from_bytes(public_key)
        .map_err(|_| CustodyError::malformed("public key"))?;
    sig.verify(&pk, &m)
        .map_err(|_| CustodyError::Ecdsa("combined signature does not verify".into()))?;
    Ok(encode_signature(&sig))
}

/// Splits an existing P-256 secret key (32 bytes, big-endian) into `n` shares, any `t` of which
/// sign under the same public key (key import, R5). The caller sends each share to its node
/// over an encrypted channel and forgets the key.
pub fn import<R: RngCore + CryptoRng>(
    secret: &[u8; 32],
    t: u16,
    n: u16,
    rng: &mut R,
) -> Result<Vec<CoreShare>, CustodyError> {
    check_group(n, 1)?;
    if t < 2 || t > n {
        return Err(CustodyError::BadParameters(format!("threshold {t} of {n}")));
    }
    let sk = secret_scalar(secret)?;
    cggmp24::trusted_dealer::builder::<Curve, Production>(n)
        .set_threshold(Some(t))
        .set_shared_secret_key(sk)
        .generate_core_shares(rng)
        .map(|v| v.into_iter().map(CoreShare).collect())
        .map_err(|e| CustodyError::Ecdsa(format!("import: {e}")))
}

fn secret_scalar(secret: &[u8; 32]) -> Result<NonZero<SecretScalar<Curve>>, CustodyError> {
    let mut s = Scalar::<Curve>::from_be_bytes(secret).map_err(|_| {
        CustodyError::BadParameters("secret key is not below the group order".into())
    })?;
    NonZero::from_secret_scalar(SecretScalar::new(&mut s))
        .ok_or_else(|| CustodyError::BadParameters("secret key is zero".into()))
}

fn scalar_of(s: &NonZero<SecretScalar<Curve>>) -> Scalar<Curve> {
    let secret: &SecretScalar<Curve> = s.as_ref();
    *AsRef::<Scalar<Curve>>::as_ref(secret)
}

/// Rebuilds the secret key (32 bytes, big-endian) from at least t shares (key export, R4).
/// Refuses shares of different keys and shares that do not reproduce the public key.
pub fn export(shares: &[CoreShare]) -> Result<[u8; 32], CustodyError> {
    let need = shares.first().map(|s| s.t() as usize).unwrap_or(2);
    if shares.len() < need {
        return Err(CustodyError::TooFewParties {
            have: shares.len(),
            need,
        });
    }
    let inner: Vec<_> = shares.iter().map(|s| s.0.clone()).collect();
    let sk = cggmp24::key_share::reconstruct_secret_key(&inner)
        .map_err(|e| CustodyError::BadParameters(format!("export: {e}")))?;
    if Point::generator() * &sk != *shares[0].0.shared_public_key {
        return Err(CustodyError::Ecdsa(
            "export: rebuilt key does not match the public key".into(),
        ));
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(sk.as_ref().to_be_bytes().as_bytes());
    Ok(out)
}

/// Key addition (R5): turns this node's share of `r1` into its share of `r1 + r2`, where `r2`
/// (32 bytes, big-endian) is a whole key handed over by another provider. Every node adds the
/// same `r2`; the new key's public key is `R1 + R2`, and whoever knew `r2` alone cannot sign
/// for it.
pub fn add_key(share: &CoreShare, addend: &[u8; 32]) -> Result<CoreShare, CustodyError> {
    let r2 = secret_scalar(addend)?;
    let r2_pub = Point::generator() * &r2;
    let core = share.0.clone().into_inner();
    let mut x = scalar_of(&core.x) + scalar_of(&r2);
    let x = NonZero::from_secret_scalar(SecretScalar::new(&mut x))
        .ok_or_else(|| CustodyError::Ecdsa("key addition gave a zero share".into()))?;
    let mut key_info = core.key_info;
    key_info.shared_public_key = NonZero::from_point(*key_info.shared_public_key + r2_pub)
        .ok_or_else(|| CustodyError::Ecdsa("key addition gave the zero key".into()))?;
    key_info.public_shares = key_info
        .public_shares
        .iter()
        .map(|p| NonZero::from_point(**p + r2_pub))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| CustodyError::Ecdsa("key addition gave a zero public share".into()))?;
    DirtyIncompleteKeyShare::<Curve> {
        i: core.i,
        key_info,
        x,
    }
    .validate()
    .map(CoreShare)
    .map_err(|e| CustodyError::Ecdsa(format!("key addition: {}", e.error())))
}

/// Runs one session per party in this process, moving every message, until all finish;
/// returns the outputs in party order and each party's CPU time. For tests, benchmarks and
/// single-process networks.
pub fn run_local<O>(
    mut sessions: Vec<(PartyId, Session<O>)>,
) -> Result<Vec<(O, Duration)>, CustodyError> {
    let mut inboxes: Vec<Vec<WireMsg>> = vec![Vec::new(); sessions.len()];
    let mut outputs: Vec<Option<O>> = sessions.iter().map(|_| None).collect();
    let ids: Vec<PartyId> = sessions.iter().map(|(p, _)| *p).collect();
    let mut rounds = 0;
    loop {
        let mut sent = false;
        for k in 0..sessions.len() {
            if outputs[k].is_some() {
                continue;
            }
            let incoming = std::mem::take(&mut inboxes[k]);
            let step = sessions[k].1.step(incoming)?;
            for m in step.out {
                sent = true;
                for (j, id) in ids.iter().enumerate() {
                    if *id != m.from && m.to.is_none_or(|to| to == *id) {
                        inboxes[j].push(m.clone());
                    }
                }
            }
            outputs[k] = step.done;
        }
        if outputs.iter().all(Option::is_some) {
            break;
        }
        rounds += 1;
        if !sent && inboxes.iter().all(Vec::is_empty) || rounds > 64 {
            return Err(CustodyError::Ecdsa("local run stalled".into()));
        }
    }
    outputs
        .into_iter()
        .zip(sessions)
        .map(|(o, (_, s))| {
            o.map(|o| (o, s.busy))
                .ok_or_else(|| CustodyError::Ecdsa("a party did not finish".into()))
        })
        .collect()
}

/// A fresh random session id.
pub fn new_session_id() -> [u8; 32] {
    let mut id = [0u8; 32];
    OsRng.fill_bytes(&mut id);
    id
}

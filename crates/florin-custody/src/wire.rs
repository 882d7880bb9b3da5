//! What a coordinator asks a key-management node, and the answers. Encoded with postcard;
//! carried over an authenticated, encrypted channel (`florin-net`), one request, one answer.

use serde::{Deserialize, Serialize};

use crate::authz::{Authorization, AuthzError};
use crate::envelope::{Attestation, Envelope};
use crate::{CustodyError, PartyId};

/// Largest encoded request or answer a node or coordinator accepts.
pub const MAX_WIRE: usize = 16 << 20;

/// Most nonce commitments one [`Request::Commitments`] hands out.
pub const MAX_COMMITMENTS: u32 = 4096;

/// The payload of a node's echo in a distributed key generation (the broadcast of step 2).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DkgEcho {
    /// The FROST layer's echo (`frost::Round2Out::echo`).
    pub frost: Vec<u8>,
    /// Every round-1 broadcast the node got, its own included, with its sender's signature:
    /// the evidence that [`crate::envelope::check_echoes`] weighs.
    pub seen: Vec<Attestation>,
}

/// A coordinator's request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Request {
    /// The node's party number and the keys it holds.
    Status,
    /// Starts a distributed key generation of `key_id`; the answer is the node's round-1
    /// broadcast.
    DkgStart {
        /// The run.
        session: [u8; 16],
        /// The new key's name.
        key_id: String,
        /// Threshold.
        t: u16,
        /// Parties.
        n: u16,
    },
    /// Starts a proactive refresh of FROST key `key_id` (administrators only): the same three
    /// steps as a key generation ([`Request::DkgRound2`], [`Request::DkgFinish`] go on with
    /// the same session), each node dealing a sharing of zero. The node refuses unless it
    /// holds the key committed as `group` (a `GroupKey::digest`), so every node refreshes
    /// the same sharing. The refreshed share is stored pending and replaces the old one at
    /// [`Request::Commit`].
    RefreshStart {
        /// The run.
        session: [u8; 16],
        /// The key.
        key_id: String,
        /// `GroupKey::digest` of the sharing being refreshed.
        group: [u8; 32],
    },
    /// Every other party's round-1 broadcast; the answer is the echo and the sealed shares.
    DkgRound2 {
        /// The run.
        session: [u8; 16],
        /// Round-1 envelopes of the other parties.
        round1: Vec<Envelope>,
    },
    /// Every other party's echo and the shares addressed to this node; the node checks them,
    /// stores its share and answers with the group key.
    DkgFinish {
        /// The run.
        session: [u8; 16],
        /// Echo envelopes of the other parties.
        echoes: Vec<Envelope>,
        /// Round-2 envelopes addressed to this node.
        direct: Vec<Envelope>,
    },
    /// Stores a share made by a trusted dealer (key import).
    Import {
        /// The key's name.
        key_id: String,
        /// `KeyShare::to_bytes` of this node's share.
        share: Vec<u8>,
    },
    /// Hands out commitments to nonces for future signatures. A node keeps one pool of nonces
    /// for all its keys (see [`crate::frost::NonceHedge`]); each nonce signs once, with
    /// whichever key the [`Request::Sign`] that uses it names.
    Commitments {
        /// How many (at most [`MAX_COMMITMENTS`]).
        count: u32,
    },
    /// Signs: the node's signature share for `package` with the nonce handed out as `nonce`.
    Sign {
        /// The key.
        key_id: String,
        /// `GroupKey::digest` of the sharing the coordinator aggregates with: a node whose
        /// share was refreshed since refuses (`Refusal::stale_group`) instead of sending a
        /// share the coordinator would take for a bad one.
        group: [u8; 32],
        /// The nonce's id from [`Request::Commitments`].
        nonce: u64,
        /// `SigningPackage::to_bytes`.
        package: Vec<u8>,
    },
    /// Signs like [`Request::Sign`], for a key bound to a customer: the node first checks
    /// the customer's authorization of the transaction whose txid the package signs (see
    /// [`crate::authz`]).
    SignAuthorized {
        /// The key.
        key_id: String,
        /// As in [`Request::Sign`].
        group: [u8; 32],
        /// As in [`Request::Sign`].
        nonce: u64,
        /// As in [`Request::Sign`].
        package: Vec<u8>,
        /// The transaction and the customer's authorization.
        authz: Authorization,
    },
    /// Binds a customer key to `key_id` before the key is made (administrators only): from
    /// then on the node signs with the key only what that customer authorized. A key already
    /// committed keeps its binding: a bind naming another customer is refused.
    BindCustomer {
        /// The key.
        key_id: String,
        /// The customer's Ed25519 key.
        customer: [u8; 32],
    },
    /// Key export: this node's share (only to an administrator key).
    Export {
        /// The key.
        key_id: String,
    },
    /// Share repair, step 1, at a helper (administrators only): splits its share of `key_id`
    /// into deltas that rebuild `target`'s lost share; the answer is [`Response::Repair`] with
    /// one envelope per other helper, sealed to it.
    RepairStart {
        /// The run.
        session: [u8; 16],
        /// The key.
        key_id: String,
        /// The helpers (at least t, this node among them).
        helpers: Vec<PartyId>,
        /// The party whose share is lost.
        target: PartyId,
    },
    /// Share repair, step 2, at a helper: the other helpers' deltas for it; the answer is
    /// [`Response::Repair`] with its sigma, sealed to the target.
    RepairSigma {
        /// The run.
        session: [u8; 16],
        /// Every other helper's delta envelope for this node.
        deltas: Vec<Envelope>,
    },
    /// Share repair, step 3, at the target: every helper's sigma and the group key. The node
    /// checks the rebuilt share against its public share, stores it pending (it signs after
    /// [`Request::Commit`]) and answers [`Response::Key`].
    RepairFinish {
        /// The run.
        session: [u8; 16],
        /// `GroupKey::to_bytes` of the key.
        group: Vec<u8>,
        /// One sigma envelope per helper.
        sigmas: Vec<Envelope>,
    },
    /// Starts this node's part in an ECDSA (CGGMP24) protocol run; the answer is
    /// [`Response::EcdsaStep`] with the node's first messages.
    EcdsaStart {
        /// The run: fresh and random, the same at every party.
        session: [u8; 16],
        /// What to run.
        job: EcdsaJob,
    },
    /// The next step of an ECDSA run: every message the other parties sent this node in the
    /// previous step (signed envelopes; P2P ones sealed to this node).
    EcdsaStep {
        /// The run.
        session: [u8; 16],
        /// Envelopes of the previous step addressed to this node or to everyone.
        incoming: Vec<Envelope>,
    },
    /// This node's partial ECDSA signature of `message` from the presignature made in run
    /// `presig`, which is then forgotten (a presignature signs once).
    EcdsaPartial {
        /// The key.
        key_id: String,
        /// The presignature's run.
        presig: [u8; 16],
        /// The message (hashed with SHA-256 by the signature scheme).
        message: Vec<u8>,
    },
    /// [`Request::EcdsaPartial`] for a key bound to a customer: the node checks the customer's
    /// authorization of the transaction whose txid is `message` before it uses the
    /// presignature.
    EcdsaPartialAuthorized {
        /// The key.
        key_id: String,
        /// The presignature's run.
        presig: [u8; 16],
        /// The message (the txid).
        message: Vec<u8>,
        /// The transaction and the customer's authorization.
        authz: Authorization,
    },
    /// Ends this node's part of ECDSA run `session` (the coordinator gave up on it), freeing
    /// its thread at once.
    EcdsaAbort {
        /// The run.
        session: [u8; 16],
    },
    /// Stores an ECDSA key share made by a trusted dealer (key import).
    EcdsaImport {
        /// The key's name.
        key_id: String,
        /// `ecdsa::CoreShare::to_bytes` of this node's share.
        share: Vec<u8>,
    },
    /// ECDSA key export: this node's share (only to an administrator key).
    EcdsaExport {
        /// The key.
        key_id: String,
    },
    /// ECDSA key addition (R5): stores under `key_id` this node's share of `from`'s key plus
    /// `addend` (only from an administrator key). Every node is sent the same addend.
    EcdsaAddKey {
        /// The new key's name.
        key_id: String,
        /// The key held already (`r1`).
        from: String,
        /// The key handed over (`r2`), 32 bytes big-endian.
        addend: Vec<u8>,
    },
    /// Makes a pending key usable (only from an administrator key). A new key (generated,
    /// imported or added) is stored as *pending* at each node and signs nothing until the
    /// coordinator has seen every node report the same key and sends this. Idempotent: a
    /// key already committed with the same `public` answers again. A committed FROST key is
    /// replaced only by a pending refresh of it ([`Request::RefreshStart`]: same public key,
    /// new shares); any other is refused.
    Commit {
        /// The key's name.
        key_id: String,
        /// What every node answered with [`Response::Key`]: `GroupKey::to_bytes` for FROST,
        /// the sharing identity for ECDSA (`ecdsa::CoreShare::identity`: the SEC1-compressed
        /// public key, then a digest of every party's public share).
        public: Vec<u8>,
    },
    /// Commits a DKLs23 refresh of `key_id` (only from an administrator key): the committed
    /// sharing is replaced by the pending `identity` only with every node's attestation that
    /// it holds that same pending sharing ([`EcdsaDone::Refreshed`]), so no coordinator can
    /// leave the nodes on different sharings.
    CommitRefresh {
        /// The key's name.
        key_id: String,
        /// The new sharing's identity.
        identity: Vec<u8>,
        /// Every node's attestation, by party ([`refresh_attestation_digest`], signed with the
        /// node's identity key).
        attestations: Vec<(PartyId, Vec<u8>)>,
    },
    /// To finish a DKLs23 refresh that was committed at only some nodes (only from an
    /// administrator key): the node attests the sharing of `key_id` it would end with, its
    /// pending refresh if it holds one, else its committed sharing; the answer is
    /// [`Response::Attested`].
    AttestRefresh {
        /// The key's name.
        key_id: String,
    },
    /// The CGGMP24 presignatures of `key_id` this node holds unused (it keeps them across
    /// restarts): their sessions and public halves, for a coordinator that restarted to take
    /// them back into its pool. Answered with [`Response::Presigs`].
    EcdsaPresigs {
        /// The key.
        key_id: String,
    },
    /// DKLs23 share repair, at a helper (administrators only): its masked part of rebuilding
    /// party `target`'s lost share of `key_id` ([`crate::dkls::repair_term`]), with the key's
    /// customer binding, sealed to the target; answered with [`Response::Repair`] (one
    /// envelope). Every helper must be sent the same `session` and `helpers`.
    DklsRepairTerm {
        /// The run: fresh and random.
        session: [u8; 16],
        /// The key.
        key_id: String,
        /// The helpers (at least t, this node among them, the target not).
        helpers: Vec<PartyId>,
        /// The party whose share is lost.
        target: PartyId,
    },
    /// DKLs23 share repair, at the target (administrators only): every helper's sealed part.
    /// The node rebuilds its share, checks it against its public share in the key's package
    /// (which every helper must report alike), and stores it pending and *hollow*: it signs
    /// only after a complete refresh by all n nodes ([`EcdsaJob::DklsRefreshComplete`]) is
    /// committed. Answered with [`Response::Key`] (the sharing's identity).
    DklsRepairFinish {
        /// The run.
        session: [u8; 16],
        /// The key.
        key_id: String,
        /// The helpers, as every helper was told.
        helpers: Vec<PartyId>,
        /// One envelope per helper.
        terms: Vec<Envelope>,
    },
}

/// A presignature a node holds unused: its session and `PresigPublic::to_bytes`.
pub type HeldPresig = ([u8; 16], Vec<u8>);

/// What a node signs when it has stored a refreshed sharing pending.
pub fn refresh_attestation_digest(key_id: &str, identity: &[u8]) -> [u8; 32] {
    florin_crypto::hash(
        "florin/custody/dkls23/refresh-attestation/v1",
        &[key_id.as_bytes(), identity],
    )
}

/// The ECDSA protocol runs a coordinator can start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum EcdsaJob {
    /// Auxiliary information (Paillier keys and ring-Pedersen parameters) for the whole
    /// network, from each node's pregenerated primes. Once per network; every key reuses it.
    Aux,
    /// Distributed generation of a `t`-of-n key named `key_id` by all n nodes.
    Keygen {
        /// The key's name.
        key_id: String,
        /// Threshold.
        t: u16,
    },
    /// A presignature of `key_id` by exactly t `signers`; the node keeps its half in memory.
    Presign {
        /// The key.
        key_id: String,
        /// The t signers.
        signers: Vec<PartyId>,
    },
    /// Interactive signing of `message` by exactly t `signers` (when no presignature is left).
    Sign {
        /// The key.
        key_id: String,
        /// The t signers.
        signers: Vec<PartyId>,
        /// The message.
        message: Vec<u8>,
    },
    /// DKLs23 ([`crate::dkls`]): distributed generation of a `t`-of-n key named `key_id` by
    /// all n nodes. Needs no auxiliary information.
    DklsKeygen {
        /// The key's name.
        key_id: String,
        /// Threshold.
        t: u16,
    },
    /// DKLs23: three-round signing of `message` by exactly t `signers`. A key bound to a
    /// customer signs only with `authz`, the customer's authorization of the transaction whose
    /// txid is `message`, which every signer checks before its first message.
    DklsSign {
        /// The key.
        key_id: String,
        /// The t signers.
        signers: Vec<PartyId>,
        /// The message (a txid for ledger witnesses).
        message: Vec<u8>,
        /// The customer's authorization, for a key bound to one.
        authz: Option<Authorization>,
    },
    /// DKLs23: proactive refresh of `key_id` by all n nodes: new shares of the same public
    /// key, stored pending until committed; the old shares stop signing with the new.
    DklsRefresh {
        /// The key.
        key_id: String,
    },
    /// DKLs23: complete refresh of `key_id` by all n nodes: as [`EcdsaJob::DklsRefresh`], but
    /// every pair's OT set-up is made anew. The refresh after an import and after a repair
    /// (a node whose share was rebuilt takes part with its hollow pending share).
    DklsRefreshComplete {
        /// The key.
        key_id: String,
    },
}

impl EcdsaJob {
    /// The key a job uses or makes, if any.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            EcdsaJob::Aux => None,
            EcdsaJob::Keygen { key_id, .. }
            | EcdsaJob::Presign { key_id, .. }
            | EcdsaJob::Sign { key_id, .. }
            | EcdsaJob::DklsKeygen { key_id, .. }
            | EcdsaJob::DklsSign { key_id, .. }
            | EcdsaJob::DklsRefresh { key_id }
            | EcdsaJob::DklsRefreshComplete { key_id } => Some(key_id),
        }
    }
}

/// What an ECDSA run gave a node, reported when it finishes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum EcdsaDone {
    /// Auxiliary information made and stored.
    Aux,
    /// The key's share made and stored (pending): the sharing identity
    /// (`ecdsa::CoreShare::identity`, which starts with the SEC1-compressed public key).
    Key(Vec<u8>),
    /// A presignature made and kept: its public half (`ecdsa::PresigPublic::to_bytes`).
    Presig(Vec<u8>),
    /// The signature (`r ‖ s`, low-S).
    Signature(Vec<u8>),
    /// A DKLs23 refresh's new share stored pending: its identity, and this node's signature
    /// over [`refresh_attestation_digest`] that [`Request::CommitRefresh`] needs from every node.
    Refreshed {
        /// The new sharing's identity.
        identity: Vec<u8>,
        /// The node's signature (64 bytes).
        attestation: Vec<u8>,
    },
}

/// A node's ECDSA state, for status.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EcdsaStatus {
    /// The security level (`production`, `insecure-test`).
    pub level: String,
    /// Whether auxiliary information is made (ECDSA keys can sign).
    pub aux_ready: bool,
    /// Whether a set of pregenerated primes waits for the next auxiliary-information run.
    pub primes_ready: bool,
    /// ECDSA keys held: (name, identity, presignatures held). The identity is the
    /// SEC1-compressed public key then a digest of the sharing (`ecdsa::CoreShare::identity`,
    /// `dkls::DklsShare::identity`).
    pub keys: Vec<(String, Vec<u8>, u64)>,
    /// The names among `keys` that are DKLs23 keys (the others are CGGMP24's).
    pub dkls23: Vec<String>,
    /// Parties this node refuses to run DKLs23 with for good (they failed an OT check).
    pub banned: Vec<PartyId>,
}

/// A key stored but not yet committed (see [`Request::Commit`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PendingKey {
    /// Name.
    pub key_id: String,
    /// ECDSA P-256 (else FROST Ed25519).
    pub ecdsa: bool,
    /// What a [`Request::Commit`] for it must carry.
    pub public: Vec<u8>,
}

/// One key a node holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyInfo {
    /// Name.
    pub key_id: String,
    /// `GroupKey::to_bytes`.
    pub group: Vec<u8>,
}

/// Why a node refused, as the coordinator sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    /// The error's text.
    pub message: String,
    /// A party the node proved misbehaved (a bad share in a DKG).
    pub culprit: Option<PartyId>,
    /// The nonce was unknown (the node restarted or dropped it): ask for new commitments.
    pub stale_nonce: bool,
    /// The node holds another sharing of the key than the request named (its shares were
    /// refreshed): fetch the key's group again.
    pub stale_group: bool,
    /// The request needed a customer's authorization that was missing or did not hold.
    #[serde(default)]
    pub unauthorized: Option<AuthzError>,
    /// The node is at its limit of runs in progress ([`CustodyError::Busy`]): not a fault of
    /// the node, which a client must not take for down.
    #[serde(default)]
    pub busy: bool,
}

impl From<&CustodyError> for Refusal {
    fn from(e: &CustodyError) -> Self {
        Refusal {
            message: e.to_string(),
            culprit: match e {
                CustodyError::Misbehaved { party, .. } => Some(*party),
                CustodyError::Equivocation { culprit, .. } => Some(*culprit),
                CustodyError::Banned { party, .. } => Some(*party),
                _ => None,
            },
            stale_nonce: matches!(e, CustodyError::UnknownNonce(_)),
            stale_group: matches!(e, CustodyError::StaleGroup(_)),
            unauthorized: match e {
                CustodyError::Unauthorized(a) => Some(a.clone()),
                _ => None,
            },
            busy: matches!(e, CustodyError::Busy(_)),
        }
    }
}

/// A node's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum Response {
    /// To [`Request::Status`].
    Status {
        /// The node's party number.
        party: PartyId,
        /// Keys held.
        keys: Vec<KeyInfo>,
        /// FROST nonces ready to hand out (one pool for all keys).
        nonces_ready: u64,
        /// ECDSA state, when the node runs ECDSA.
        ecdsa: Option<EcdsaStatus>,
        /// Keys stored but not committed, of both schemes; they sign nothing.
        pending: Vec<PendingKey>,
    },
    /// To [`Request::DkgStart`].
    DkgRound1(Envelope),
    /// To [`Request::DkgRound2`].
    DkgRound2 {
        /// Broadcast.
        echo: Envelope,
        /// One sealed envelope per other party.
        direct: Vec<Envelope>,
    },
    /// To [`Request::DkgFinish`] and [`Request::Import`]: `GroupKey::to_bytes`; to
    /// [`Request::EcdsaImport`] and [`Request::EcdsaAddKey`]: the ECDSA sharing identity; to
    /// [`Request::Commit`]: what it named.
    Key(Vec<u8>),
    /// To [`Request::Commitments`]: (nonce id, commitment bytes).
    Commitments(Vec<(u64, Vec<u8>)>),
    /// To [`Request::Sign`]: the signature share.
    Share(Vec<u8>),
    /// To [`Request::Export`]: `KeyShare::to_bytes`.
    Exported(Vec<u8>),
    /// To [`Request::AttestRefresh`]: the sharing and the node's signature over
    /// [`refresh_attestation_digest`].
    Attested {
        /// The sharing's identity.
        identity: Vec<u8>,
        /// The node's signature (64 bytes).
        attestation: Vec<u8>,
    },
    /// To [`Request::RepairStart`] and [`Request::RepairSigma`]: sealed envelopes to relay.
    Repair(Vec<Envelope>),
    /// To [`Request::EcdsaStart`] and [`Request::EcdsaStep`]: envelopes to relay (broadcasts
    /// to every other party of the run, direct ones to their recipient) and, at the end, what
    /// the run gave this node.
    EcdsaStep {
        /// Messages of this step.
        out: Vec<Envelope>,
        /// The result, when the node's part is finished.
        done: Option<EcdsaDone>,
    },
    /// To [`Request::EcdsaPartial`]: `ecdsa::Partial::to_bytes`.
    EcdsaPartial(Vec<u8>),
    /// To [`Request::EcdsaAbort`].
    Aborted,
    /// The request was refused.
    Refused(Refusal),
    /// To [`Request::EcdsaPresigs`]: (session, `PresigPublic::to_bytes`) of each.
    Presigs(Vec<HeldPresig>),
}

/// Encodes a request or answer.
pub fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    postcard::to_allocvec(m).unwrap_or_default()
}

/// Decodes a request or answer; trailing bytes are refused.
pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8], what: &str) -> Result<T, CustodyError> {
    match postcard::take_from_bytes::<T>(b) {
        Ok((m, [])) => Ok(m),
        _ => Err(CustodyError::malformed(what)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let r = Request::Sign {
            key_id: "issuer".into(),
            group: [3; 32],
            nonce: 7,
            package: vec![1, 2, 3],
        };
        let b = encode(&r);
        assert_eq!(decode::<Request>(&b, "request"), Ok(r));
        assert!(decode::<Request>(&[0xff, 0xff, 0xff], "request").is_err());
        let mut long = b.clone();
        long.push(0);
        assert!(decode::<Request>(&long, "request").is_err());
        assert!(decode::<Response>(&[], "answer").is_err());
    }
}

//! Florin's key management network (KMN), as pure protocol code: no sockets, no files.
//!
//! Keys that must never sit on one machine — the issuer's minting key, the authority's
//! token-signing key, custodial wallet keys — are held as t-of-n shares by key-management
//! nodes. This crate holds what the nodes and the coordinator compute; the caller
//! (`florin-node`'s custody service) moves the bytes and stores them.
//!
//! - [`frost`]: Ed25519 threshold keys with FROST (RFC 9591, the Zcash Foundation's audited
//!   `frost-ed25519`). The aggregate signature is an ordinary Ed25519 signature, so tokens,
//!   mints and ledger witnesses do not change and an observer cannot tell a threshold key
//!   from a single one. Distributed key generation with an echo check ([`frost::DkgParty`]),
//!   trusted-dealer import of an existing key ([`frost::split_ed25519_seed`]), export by
//!   reconstruction ([`frost::reconstruct`]), nonce pools so that online signing is one
//!   round ([`frost::NoncePool`]), and aggregation that names a node sending a bad share
//!   ([`frost::aggregate`]).
//! - [`ecdsa`]: ECDSA P-256 threshold keys with CGGMP24 (Lockness `cggmp24`) for custodial
//!   wallet keys at payment providers: a pool of Paillier primes, auxiliary information per
//!   group, distributed key generation, import, export and key addition, presignatures so that
//!   online signing is one step, and interactive signing as the fallback.
//! - [`dkls`]: ECDSA P-256 threshold keys with DKLs23 (OT-based, no Paillier): key generation
//!   in seconds, three-round signing in milliseconds, refresh, import, export and key
//!   addition; a per-key choice beside CGGMP24 for keys that need no identifiable abort.
//! - [`envelope`]: node-to-node protocol messages, signed by the sender's identity key and,
//!   when they carry secret shares, sealed to the recipient, so a coordinator that relays
//!   them can neither read nor forge them.
//! - [`vault`]: key shares encrypted at rest.
//! - [`wire`]: the requests a coordinator sends a node, and the answers.
//!
//! Every function that reads bytes from another party returns a typed [`CustodyError`]; a
//! party that provably misbehaved is named in it.

pub mod authz;
pub mod dkls;
pub mod ecdsa;
pub mod envelope;
pub mod frost;
pub mod vault;
pub mod wire;

use thiserror::Error;

/// A party's number in a key-management network, 1 to n.
pub type PartyId = u16;

/// Why a custody operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CustodyError {
    /// Bytes that do not decode (from a party, from disk, from a request).
    #[error("malformed {what}")]
    Malformed {
        /// What could not be decoded.
        what: String,
    },
    /// A party provably misbehaved: a bad share, a bad proof, a bad signature on its message.
    #[error("party {party} misbehaved: {reason}")]
    Misbehaved {
        /// The culprit.
        party: PartyId,
        /// What it did.
        reason: String,
    },
    /// A party sent different round-one messages to different parties (caught by the echo
    /// check); `witness` reported the copy that differs from ours.
    #[error(
        "party {culprit} sent different messages to different parties (seen by party {witness})"
    )]
    Equivocation {
        /// The party whose message differs between recipients.
        culprit: PartyId,
        /// The party that reported the other copy.
        witness: PartyId,
    },
    /// Fewer parties than the threshold took part.
    #[error("{have} of the {need} parties needed")]
    TooFewParties {
        /// Parties available.
        have: usize,
        /// Parties required.
        need: usize,
    },
    /// Threshold and party count that make no sense (t < 2, t > n, duplicate parties, ...).
    #[error("bad parameters: {0}")]
    BadParameters(String),
    /// The asking client may not do this (an administrator's operation, or a key not granted
    /// to it).
    #[error("not allowed: {0}")]
    Forbidden(String),
    /// A signing request names a nonce this node never issued or already used.
    #[error("unknown or already used nonce {0}")]
    UnknownNonce(u64),
    /// A request named another sharing of a key than the one this node holds: the key's shares
    /// were refreshed (or the refresh is half committed). The public key is the same.
    #[error("key {0}: this node holds another sharing (refreshed shares); fetch the key again")]
    StaleGroup(String),
    /// A message arrived for a protocol step that is not the current one.
    #[error("out of order: {0}")]
    OutOfOrder(String),
    /// Decryption of a sealed share failed: wrong key, or the bytes were changed.
    #[error("cannot open sealed {0}: wrong key or tampered")]
    Sealed(String),
    /// The FROST library refused (message carries its reason).
    #[error("frost: {0}")]
    Frost(String),
    /// The reliable-broadcast (echo) check failed: parties saw different broadcast messages.
    /// From one party's view the sender and a lying echoer look alike, so no one is named.
    #[error("parties saw different broadcast messages: {0}")]
    Inconsistent(String),
    /// The CGGMP24 (threshold ECDSA) library refused or a protocol run failed without a
    /// provable culprit (message carries its reason).
    #[error("ecdsa: {0}")]
    Ecdsa(String),
    /// A party failed a check of the OT-based multiplication (DKLs23): running with it again
    /// could leak the key, so it must never take part in this node's runs again.
    #[error("party {party} must be banned: {reason}")]
    Banned {
        /// The party to ban.
        party: PartyId,
        /// The check it failed.
        reason: String,
    },
    /// The node is at its limit of runs in progress (for everyone, or for this client): not a
    /// fault; ask again when a run has ended, or ask other nodes.
    #[error("busy: {0}")]
    Busy(String),
    /// A signature with a customer-bound key without that customer's valid authorization
    /// (see [`authz`]): refused before the node's share is computed.
    #[error("unauthorized: {0}")]
    Unauthorized(authz::AuthzError),
}

impl CustodyError {
    /// Bytes that do not decode as `what`.
    pub fn malformed(what: impl Into<String>) -> Self {
        CustodyError::Malformed { what: what.into() }
    }
}

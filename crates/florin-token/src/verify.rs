//! Client verification (IV-C), the authority's structural checks (IV-E steps 1–4), and batched
//! signature checking across many tokens.

use std::collections::HashSet;

use florin_crypto::{BatchVerifier, PublicKey, Signature, SignatureError};
use rand::{CryptoRng, RngCore};
use thiserror::Error;

use crate::codec::DecodeError;
use crate::token::{Handshake, Token};

/// Why a token is refused. Each variant names what a user can act on.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenError {
    /// Malformed bytes.
    #[error("malformed token: {0}")]
    Decode(#[from] DecodeError),
    /// Step 1: the last recipient is someone else.
    #[error("token {serial} is addressed to {to}, not to this wallet")]
    NotForMe {
        /// Serial (hex).
        serial: String,
        /// The last recipient.
        to: PublicKey,
    },
    /// Step 2: the authority is not one this wallet trusts.
    #[error("token {serial} is issued by unknown authority {authority}")]
    UnknownAuthority {
        /// Serial (hex).
        serial: String,
        /// The authority named by the token.
        authority: PublicKey,
    },
    /// Step 3: a link's proof does not verify.
    #[error("token {serial}: proof of link {link} is invalid ({reason})")]
    BadProof {
        /// Serial (hex).
        serial: String,
        /// Which link (0 is the anchor).
        link: usize,
        /// Why.
        reason: SignatureError,
    },
    /// The chain is longer than the payee accepts.
    #[error("token {serial} has {hops} offline hops, more than the {max} accepted")]
    TooManyHops {
        /// Serial (hex).
        serial: String,
        /// Hops in the token.
        hops: usize,
        /// The limit.
        max: usize,
    },
    /// Replay prevention: the last link carries another handshake than the one issued.
    #[error(
        "token {serial} was not made for this payment request (handshake mismatch: a replay?)"
    )]
    WrongHandshake {
        /// Serial (hex).
        serial: String,
    },
    /// Replay prevention: this exact transfer was accepted before.
    #[error("token {serial} repeats a transfer this wallet already accepted (replay)")]
    Replayed {
        /// Serial (hex).
        serial: String,
    },
    /// Authority step 1: too few links to be a deposit.
    #[error("token {serial} has {links} links; a deposit needs the anchor, a transfer and the authority")]
    NotEnoughLinks {
        /// Serial (hex).
        serial: String,
        /// Links present.
        links: usize,
    },
    /// Authority step 1: the authority is not the last recipient.
    #[error("token {serial} is not addressed to the authority")]
    AuthorityNotLastRecipient {
        /// Serial (hex).
        serial: String,
    },
    /// Authority step 2: the sender is not the penultimate recipient.
    #[error("token {serial} was not sent by the depositor {depositor}")]
    NotFromDepositor {
        /// Serial (hex).
        serial: String,
        /// The declared depositor.
        depositor: PublicKey,
    },
    /// Authority step 3: the token names another authority.
    #[error("token {serial} belongs to authority {authority}, not this one")]
    WrongAuthority {
        /// Serial (hex).
        serial: String,
        /// The authority named by the token.
        authority: PublicKey,
    },
}

/// What a wallet accepts.
#[derive(Debug, Clone)]
pub struct ClientPolicy {
    /// Authorities whose tokens are accepted.
    pub trusted_authorities: Vec<PublicKey>,
    /// Most offline hops accepted in an incoming token.
    pub max_hops: usize,
}

/// The structural part of client verification (steps 1 and 2, the hop limit, replay checks);
/// signatures are queued into `batch` (step 3), in link order, and checked by the caller.
pub fn client_precheck(
    token: &Token,
    me: &PublicKey,
    expected_handshake: Option<&Handshake>,
    seen_proofs: &HashSet<Signature>,
    policy: &ClientPolicy,
) -> Result<(), TokenError> {
    let serial = token.serial_hex();
    let last = token
        .links
        .last()
        .ok_or(DecodeError::Invalid("token without links"))?;
    if last.recipient != *me {
        return Err(TokenError::NotForMe {
            serial,
            to: last.recipient,
        });
    }
    if !policy.trusted_authorities.contains(&token.authority) {
        return Err(TokenError::UnknownAuthority {
            serial,
            authority: token.authority,
        });
    }
    if token.hops() > policy.max_hops {
        return Err(TokenError::TooManyHops {
            serial,
            hops: token.hops(),
            max: policy.max_hops,
        });
    }
    if let Some(h) = expected_handshake {
        if last.handshake != *h {
            return Err(TokenError::WrongHandshake { serial });
        }
    }
    if seen_proofs.contains(&last.proof) {
        return Err(TokenError::Replayed { serial });
    }
    Ok(())
}

/// The structural part of authority verification: steps 1–3a of IV-E (at least three links,
/// authority last, depositor penultimate, our token).
pub fn authority_precheck(
    token: &Token,
    authority: &PublicKey,
    depositor: &PublicKey,
    max_hops: usize,
) -> Result<(), TokenError> {
    let serial = token.serial_hex();
    if token.authority != *authority {
        return Err(TokenError::WrongAuthority {
            serial,
            authority: token.authority,
        });
    }
    let n = token.links.len();
    // The last hop is to the authority itself.
    if n.saturating_sub(2) > max_hops {
        return Err(TokenError::TooManyHops {
            serial,
            hops: n - 2,
            max: max_hops,
        });
    }
    if n < 3 {
        return Err(TokenError::NotEnoughLinks { serial, links: n });
    }
    if token.links[n - 1].recipient != *authority {
        return Err(TokenError::AuthorityNotLastRecipient { serial });
    }
    if token.links[n - 2].recipient != *depositor {
        return Err(TokenError::NotFromDepositor {
            serial,
            depositor: *depositor,
        });
    }
    Ok(())
}

/// Queues every proof of `token` into `batch`.
pub fn queue_chain(token: &Token, batch: &mut BatchVerifier) {
    for i in 0..token.links.len() {
        if let (Some(msg), Some(signer)) = (token.message(i), token.signer_of(i)) {
            batch.queue(&signer, &msg, &token.links[i].proof);
        }
    }
}

/// Checks the full chain of every token in one batch and returns a verdict per token.
///
/// This is step 3 of client verification and step 4 of authority verification, batched across
/// tokens: one multi-scalar multiplication for all of them when all are valid.
pub fn verify_chains<R: RngCore + CryptoRng>(
    tokens: &[&Token],
    rng: &mut R,
) -> Vec<Result<(), TokenError>> {
    let total: usize = tokens.iter().map(|t| t.links.len()).sum();
    let mut batch = BatchVerifier::with_capacity(total);
    let mut owner = Vec::with_capacity(total);
    for (ti, t) in tokens.iter().enumerate() {
        queue_chain(t, &mut batch);
        owner.extend((0..t.links.len()).map(|li| (ti, li)));
    }
    let mut out: Vec<Result<(), TokenError>> = tokens.iter().map(|_| Ok(())).collect();
    if let Err(e) = batch.verify(rng) {
        for (pos, reason) in e.invalid {
            let (ti, li) = owner[pos];
            if out[ti].is_ok() {
                out[ti] = Err(TokenError::BadProof {
                    serial: tokens[ti].serial_hex(),
                    link: li,
                    reason,
                });
            }
        }
    }
    out
}

/// Verifies one token's chain (unbatched convenience).
pub fn verify_chain<R: RngCore + CryptoRng>(token: &Token, rng: &mut R) -> Result<(), TokenError> {
    verify_chains(&[token], rng).pop().unwrap_or(Ok(()))
}

//! The authority's decision for one returning token (IV-E steps 3, 5 and 6), as a pure
//! function over the stored record. Storage, batching of signatures and the network live in
//! the node; this module only decides and updates the record in memory.

use florin_crypto::{PublicKey, Signer};
use thiserror::Error;

use crate::fraud::FraudProof;
use crate::registry::{Reconcile, TokenRecord, TokenStatus};
use crate::token::{Handshake, MintNonce, Token};
use crate::verify::TokenError;

/// Why a deposited token was refused without a fraud proof.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DepositError {
    /// The token failed verification (structure or signatures).
    #[error(transparent)]
    Invalid(#[from] TokenError),
    /// The authority never minted this serial.
    #[error("token {0} is unknown to this authority")]
    UnknownToken(String),
    /// The chain starts from an anchor the authority never issued.
    #[error("token {0} starts from an anchor this authority never issued")]
    UnknownAnchor(String),
    /// The token is blacklisted.
    #[error("token {0} is blacklisted")]
    Blacklisted(String),
    /// The token was already taken out of circulation.
    #[error("token {0} was already deposited")]
    AlreadyDeposited(String),
    /// The chain conflicts with the history without a provable culprit.
    #[error("token {0} conflicts with the authority's history (no key paid twice)")]
    Conflict(String),
    /// The authority's signer failed.
    #[error("authority signer failed: {0}")]
    Signer(String),
}

/// The result of depositing one token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Clean: the history was extended and the token re-issued to the depositor with a fresh
    /// one-link chain.
    Reanchored(Token),
    /// Clean: the history was extended and the token taken out of circulation (its value is
    /// credited on the ledger by the caller).
    Redeemed,
    /// The same deposit was made before; here is what the authority issued then.
    Repeated(Token),
    /// The token was double spent. The history is unchanged (first come keeps the token).
    DoubleSpend(Box<FraudProof>),
    /// Refused.
    Refused(DepositError),
}

/// What to do with a clean token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleMode {
    /// Re-issue it to the depositor with a fresh one-link chain.
    Reanchor,
    /// Take it out of circulation (status `Deposited`); the value goes to the ledger.
    Redeem,
}

/// Fresh values the authority needs to re-anchor a token. The re-anchored token carries the
/// handshake of the depositor's link to the authority — covered by the depositor's signature,
/// so nobody relaying the deposit can change it.
pub struct Reanchor<'a> {
    /// The authority's signer.
    pub signer: &'a dyn Signer,
    /// A fresh random 64-byte nonce for the new anchor.
    pub nonce: MintNonce,
}

/// Settles one token whose chain has already been verified (`checked` is the verdict of the
/// structural checks and the batched signature check). Returns the outcome and whether the
/// record changed and must be stored.
pub fn settle(
    record: Option<&mut TokenRecord>,
    incoming: &Token,
    checked: Result<(), TokenError>,
    depositor: &PublicKey,
    reanchor: Reanchor<'_>,
    mode: SettleMode,
) -> (Outcome, bool) {
    let serial = incoming.serial_hex();
    if let Err(e) = checked {
        return (Outcome::Refused(e.into()), false);
    }
    let Some(record) = record else {
        return (Outcome::Refused(DepositError::UnknownToken(serial)), false);
    };
    match record.reconcile(incoming) {
        Reconcile::UnknownAnchor => (Outcome::Refused(DepositError::UnknownAnchor(serial)), false),
        Reconcile::ConflictWithoutCulprit => {
            (Outcome::Refused(DepositError::Conflict(serial)), false)
        }
        Reconcile::DoubleSpend(proof) => (Outcome::DoubleSpend(proof), false),
        Reconcile::Known { next: Some(next) }
            if next.anchor().map(|a| a.recipient) == Some(*depositor) =>
        {
            (Outcome::Repeated(next), false)
        }
        Reconcile::Known { .. } => (
            Outcome::Refused(DepositError::AlreadyDeposited(serial)),
            false,
        ),
        Reconcile::Extends { new_links } => match record.status {
            TokenStatus::Blacklisted => {
                (Outcome::Refused(DepositError::Blacklisted(serial)), false)
            }
            TokenStatus::Deposited => (
                Outcome::Refused(DepositError::AlreadyDeposited(serial)),
                false,
            ),
            TokenStatus::InCirculation if mode == SettleMode::Redeem => {
                record.extend(incoming, new_links);
                record.status = TokenStatus::Deposited;
                (Outcome::Redeemed, true)
            }
            TokenStatus::InCirculation => {
                let handshake: Handshake = incoming
                    .links
                    .last()
                    .map(|l| l.handshake)
                    .unwrap_or_default();
                let fresh = match Token::mint(
                    reanchor.signer,
                    incoming.serial,
                    incoming.value,
                    reanchor.nonce,
                    *depositor,
                    handshake,
                ) {
                    Ok(t) => t,
                    Err(e) => {
                        return (Outcome::Refused(DepositError::Signer(e.to_string())), false)
                    }
                };
                record.extend(incoming, new_links);
                record.reanchor(&fresh);
                (Outcome::Reanchored(fresh), true)
            }
        },
    }
}

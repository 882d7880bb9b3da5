//! The authority's copy of each token (IV-B, IV-E step 5–6) and the pure decision it makes
//! when a token comes back: clean extension, replay, or double spend.
//!
//! The record keeps the whole verified history across re-anchorings: a list of links and the
//! *epochs* — positions where the authority anchored the token anew, with that anchor's nonce.

use serde::{Deserialize, Serialize};

use crate::codec::{DecodeError, Reader};
use crate::denomination::Denomination;
use crate::fraud::FraudProof;
use crate::token::{Link, MintNonce, Serial, Token};
use florin_crypto::PublicKey;

/// Version byte of the record encoding.
pub const RECORD_VERSION: u8 = 1;

/// Where a token stands at its authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenStatus {
    /// Spendable.
    InCirculation,
    /// Returned to the authority and taken out of circulation.
    Deposited,
    /// Refused by the authority (lost, stolen, or withdrawn by policy).
    Blacklisted,
}

impl TokenStatus {
    fn to_byte(self) -> u8 {
        match self {
            Self::InCirculation => 1,
            Self::Deposited => 2,
            Self::Blacklisted => 3,
        }
    }
    fn from_byte(b: u8) -> Result<Self, DecodeError> {
        match b {
            1 => Ok(Self::InCirculation),
            2 => Ok(Self::Deposited),
            3 => Ok(Self::Blacklisted),
            _ => Err(DecodeError::Invalid("token status")),
        }
    }
}

/// An anchor in the history: where it starts and its nonce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    /// Index of the anchor link in [`TokenRecord::links`].
    pub start: u32,
    /// The anchor's nonce.
    pub nonce: MintNonce,
}

/// The authority's copy of a token: its whole verified history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// Serial.
    pub serial: Serial,
    /// Value.
    pub value: Denomination,
    /// The authority.
    pub authority: PublicKey,
    /// Status.
    pub status: TokenStatus,
    /// Anchors, in order; never empty.
    pub epochs: Vec<Epoch>,
    /// Every link the authority has verified, from the first mint on.
    pub links: Vec<Link>,
}

/// What a returning token means for the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconcile {
    /// The token continues the current history: `new_links` links are new.
    Extends {
        /// How many links the incoming chain adds.
        new_links: usize,
    },
    /// The chain is already part of the history (a retried or replayed deposit). `next` is the
    /// token as the authority re-anchored it after that deposit, if it did.
    Known {
        /// The re-anchored token that followed, if any.
        next: Option<Token>,
    },
    /// The chain conflicts with the history and a key paid twice.
    DoubleSpend(Box<FraudProof>),
    /// The chain conflicts with the history, but no key made two different payments (the
    /// copies differ only in re-signed signature bytes). Refused without blame.
    ConflictWithoutCulprit,
    /// The chain starts from an anchor the authority never issued.
    UnknownAnchor,
}

impl TokenRecord {
    /// A fresh record for a token just minted.
    pub fn minted(token: &Token) -> TokenRecord {
        TokenRecord {
            serial: token.serial,
            value: token.value,
            authority: token.authority,
            status: TokenStatus::InCirculation,
            epochs: vec![Epoch {
                start: 0,
                nonce: token.nonce,
            }],
            links: token.links.clone(),
        }
    }

    fn epoch_range(&self, e: usize) -> std::ops::Range<usize> {
        let start = self.epochs[e].start as usize;
        let end = self
            .epochs
            .get(e + 1)
            .map_or(self.links.len(), |n| n.start as usize);
        start..end.min(self.links.len())
    }

    /// The token as it stands in epoch `e`.
    pub fn epoch_token(&self, e: usize) -> Option<Token> {
        let ep = self.epochs.get(e)?;
        Some(Token {
            serial: self.serial,
            value: self.value,
            authority: self.authority,
            nonce: ep.nonce,
            links: self.links[self.epoch_range(e)].to_vec(),
        })
    }

    /// The token as the authority last issued or saw it.
    pub fn current_token(&self) -> Option<Token> {
        self.epoch_token(self.epochs.len().checked_sub(1)?)
    }

    /// Whether `token` starts from an anchor in this history (a byte comparison; no
    /// signature is checked).
    pub fn knows_anchor(&self, token: &Token) -> bool {
        let Some(first) = token.links.first() else {
            return false;
        };
        self.epochs.iter().enumerate().any(|(e, ep)| {
            ep.nonce == token.nonce && self.links.get(self.epoch_range(e).start) == Some(first)
        })
    }

    /// Compares an incoming chain (already verified) with the history (IV-E step 5, IV-F).
    pub fn reconcile(&self, incoming: &Token) -> Reconcile {
        let Some(first) = incoming.links.first() else {
            return Reconcile::UnknownAnchor;
        };
        let found = self.epochs.iter().enumerate().find(|(e, ep)| {
            ep.nonce == incoming.nonce && self.links.get(self.epoch_range(*e).start) == Some(first)
        });
        let Some((e, _)) = found else {
            return Reconcile::UnknownAnchor;
        };
        let history = &self.links[self.epoch_range(e)];
        let common = history
            .iter()
            .zip(&incoming.links)
            .take_while(|(a, b)| a == b)
            .count();
        let last_epoch = e + 1 == self.epochs.len();
        if common == incoming.links.len() {
            // Only the anchor of the next epoch: that is what the authority issued then; the
            // links after it are the holder's later history, not part of the answer.
            let next = self.epoch_token(e + 1).map(|mut t| {
                t.links.truncate(1);
                t
            });
            return Reconcile::Known { next };
        }
        if common == history.len() {
            return if last_epoch {
                Reconcile::Extends {
                    new_links: incoming.links.len() - common,
                }
            } else {
                // The history moved on from here (a deposit ended this epoch); going on from
                // its end would need the authority's signature on a transfer, which it never
                // makes.
                Reconcile::ConflictWithoutCulprit
            };
        }
        let header = incoming;
        match FraudProof::from_fork(header, history, &incoming.links) {
            Some(p) => Reconcile::DoubleSpend(Box::new(p)),
            None => Reconcile::ConflictWithoutCulprit,
        }
    }

    /// Appends the new links of a clean incoming chain (after [`Reconcile::Extends`]).
    pub fn extend(&mut self, incoming: &Token, new_links: usize) {
        let start = incoming.links.len() - new_links;
        self.links.extend_from_slice(&incoming.links[start..]);
    }

    /// Records a re-anchor (IV-E step 6): `token` is the fresh one-link token.
    pub fn reanchor(&mut self, token: &Token) {
        self.epochs.push(Epoch {
            start: self.links.len() as u32,
            nonce: token.nonce,
        });
        self.links.extend_from_slice(&token.links);
    }

    /// The canonical encoding (for storage).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.epochs.len() * 68 + self.links.len() * 128);
        out.push(RECORD_VERSION);
        out.extend_from_slice(&self.serial);
        out.push(self.value.to_byte());
        out.extend_from_slice(&self.authority.0);
        out.push(self.status.to_byte());
        out.extend_from_slice(&(self.epochs.len() as u32).to_le_bytes());
        for ep in &self.epochs {
            out.extend_from_slice(&ep.start.to_le_bytes());
            out.extend_from_slice(&ep.nonce);
        }
        out.extend_from_slice(&(self.links.len() as u32).to_le_bytes());
        for l in &self.links {
            l.encode_into(&mut out);
        }
        out
    }

    /// Decodes a stored record.
    pub fn decode(bytes: &[u8]) -> Result<TokenRecord, DecodeError> {
        let mut r = Reader::new(bytes);
        r.version(RECORD_VERSION, "token record")?;
        let serial = r.array("serial")?;
        let value = Denomination::from_byte(r.u8("value")?)?;
        let authority = PublicKey(r.array("authority")?);
        let status = TokenStatus::from_byte(r.u8("status")?)?;
        let ne = r.u32("epoch count")? as usize;
        if ne == 0 || r.remaining() < ne * 68 {
            return Err(DecodeError::Invalid("epoch count"));
        }
        let mut epochs = Vec::with_capacity(ne);
        for _ in 0..ne {
            epochs.push(Epoch {
                start: r.u32("epoch start")?,
                nonce: r.array("epoch nonce")?,
            });
        }
        let nl = r.u32("link count")? as usize;
        if r.remaining() < nl * 128 {
            return Err(DecodeError::Truncated {
                what: "links",
                needed: nl * 128 - r.remaining(),
            });
        }
        let links = (0..nl)
            .map(|_| Link::decode_from(&mut r))
            .collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        let mut prev = None;
        for ep in &epochs {
            if ep.start as usize >= links.len() || prev.is_some_and(|p| p >= ep.start) {
                return Err(DecodeError::Invalid("epoch start"));
            }
            prev = Some(ep.start);
        }
        Ok(TokenRecord {
            serial,
            value,
            authority,
            status,
            epochs,
            links,
        })
    }
}

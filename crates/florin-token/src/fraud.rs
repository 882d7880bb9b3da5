//! Fraud proofs (IV-F): self-contained evidence that one key paid the same token twice.
//!
//! A proof holds the token's anchor data, the common prefix of the two histories (from an
//! anchor signed by the authority), and two conflicting branches. Both branches start right
//! after the prefix; they pay the same recipients under the same handshakes at every position
//! but the last, where the same key signed two different payments. That key is the culprit.
//!
//! (The branches are longer than one link only when a signer re-signed the *same* payment with
//! different signature bytes — harmless in itself — and a later holder then spent both copies.
//! The culprit is still the key that made two different payments.)
//!
//! Anyone can check a proof offline with only the authority's public key. An honest holder is
//! never named: naming a key requires two valid signatures by it on different payments from
//! the same position, which an honest wallet never makes.

use florin_crypto::{hash, verify, Digest, PublicKey, SignatureError};
use thiserror::Error;

use crate::codec::{DecodeError, Reader};
use crate::denomination::Denomination;
use crate::token::{Link, MintNonce, Serial, Token};

/// Version byte of the fraud proof encoding.
pub const FRAUD_PROOF_VERSION: u8 = 1;

/// Evidence of a double spend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FraudProof {
    /// The token's serial.
    pub serial: Serial,
    /// Its value.
    pub value: Denomination,
    /// Its authority.
    pub authority: PublicKey,
    /// The nonce of the anchor the prefix starts from.
    pub nonce: MintNonce,
    /// Links both histories share, from the anchor.
    pub prefix: Vec<Link>,
    /// One history after the prefix.
    pub branch_a: Vec<Link>,
    /// The other history after the prefix (same length as `branch_a`).
    pub branch_b: Vec<Link>,
}

/// Why a fraud proof is not valid.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FraudProofError {
    /// Malformed bytes.
    #[error("malformed fraud proof: {0}")]
    Decode(#[from] DecodeError),
    /// The proof is signed under another authority than the one expected.
    #[error("proof is for authority {found}, expected {expected}")]
    WrongAuthority {
        /// Expected key.
        expected: PublicKey,
        /// Key in the proof.
        found: PublicKey,
    },
    /// A signature in the proof does not verify.
    #[error("{branch} link {link} has an invalid proof ({reason})")]
    BadSignature {
        /// "prefix", "branch a" or "branch b".
        branch: &'static str,
        /// Index within it.
        link: usize,
        /// Why.
        reason: SignatureError,
    },
    /// The shape is wrong (empty prefix or branches, unequal lengths).
    #[error("malformed fraud proof: {0}")]
    Shape(&'static str),
    /// The branches do not show two different payments by one key.
    #[error("the branches do not conflict: no key paid twice")]
    NoConflict,
}

impl FraudProof {
    /// Builds the proof for two valid chains from the same anchor that diverge, or `None`
    /// when no key made two different payments (one chain extends the other, or they differ
    /// only in re-signed copies of the same payments).
    ///
    /// The result does not depend on which chain is `a` and which is `b`.
    pub fn from_fork(header: &Token, a: &[Link], b: &[Link]) -> Option<FraudProof> {
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        if common == 0 {
            return None; // Different anchors: not one history.
        }
        let d = (common..a.len().min(b.len())).find(|&i| !a[i].same_payment(&b[i]))?;
        let mut branch_a = a[common..=d].to_vec();
        let mut branch_b = b[common..=d].to_vec();
        if encode_links(&branch_b) < encode_links(&branch_a) {
            std::mem::swap(&mut branch_a, &mut branch_b);
        }
        Some(FraudProof {
            serial: header.serial,
            value: header.value,
            authority: header.authority,
            nonce: header.nonce,
            prefix: a[..common].to_vec(),
            branch_a,
            branch_b,
        })
    }

    /// The key that signed twice, without checking signatures (see [`FraudProof::verify`]).
    pub fn culprit(&self) -> Option<PublicKey> {
        let n = self.branch_a.len();
        if n >= 2 {
            self.branch_a.get(n - 2).map(|l| l.recipient)
        } else {
            self.prefix.last().map(|l| l.recipient)
        }
    }

    /// Whether this proof is about `token`'s history: same serial and anchor nonce, and one of
    /// the two branches (with the prefix) is a prefix of `token`'s chain. A wallet checks this
    /// before writing a token off on the authority's word.
    pub fn concerns(&self, token: &Token) -> bool {
        if self.serial != token.serial
            || self.nonce != token.nonce
            || self.authority != token.authority
        {
            return false;
        }
        [&self.branch_a, &self.branch_b].iter().any(|branch| {
            let n = self.prefix.len() + branch.len();
            token.links.len() >= n
                && token.links[..self.prefix.len()] == self.prefix[..]
                && token.links[self.prefix.len()..n] == branch[..]
        })
    }

    /// A stable identifier: the hash of the encoding.
    pub fn id(&self) -> Digest {
        hash("florin/fraud-proof/id/v1", &[&self.encode()])
    }

    /// Checks the proof and returns the culprit.
    ///
    /// With `expected_authority`, the proof must be anchored by that key; without it the
    /// authority named inside the proof is used (the caller should then compare it).
    pub fn verify(
        &self,
        expected_authority: Option<&PublicKey>,
    ) -> Result<PublicKey, FraudProofError> {
        if let Some(exp) = expected_authority {
            if *exp != self.authority {
                return Err(FraudProofError::WrongAuthority {
                    expected: *exp,
                    found: self.authority,
                });
            }
        }
        if self.prefix.is_empty() {
            return Err(FraudProofError::Shape("empty prefix"));
        }
        if self.branch_a.is_empty() || self.branch_a.len() != self.branch_b.len() {
            return Err(FraudProofError::Shape(
                "branches empty or of unequal length",
            ));
        }
        let n = self.branch_a.len();
        for i in 0..n - 1 {
            if !self.branch_a[i].same_payment(&self.branch_b[i]) {
                return Err(FraudProofError::Shape(
                    "branches diverge before their last link",
                ));
            }
        }
        if self.branch_a[n - 1].same_payment(&self.branch_b[n - 1]) {
            return Err(FraudProofError::NoConflict);
        }
        for (name, branch) in [("branch a", &self.branch_a), ("branch b", &self.branch_b)] {
            let mut chain = self.prefix.clone();
            chain.extend_from_slice(branch);
            let token = Token {
                serial: self.serial,
                value: self.value,
                authority: self.authority,
                nonce: self.nonce,
                links: chain,
            };
            for i in 0..token.links.len() {
                // Prefix links are checked with branch a only; they are the same for b.
                if name == "branch b" && i < self.prefix.len() {
                    continue;
                }
                let (Some(msg), Some(signer)) = (token.message(i), token.signer_of(i)) else {
                    return Err(FraudProofError::Shape("link out of range"));
                };
                verify(&signer, &msg, &token.links[i].proof).map_err(|reason| {
                    let (branch, link) = if i < self.prefix.len() {
                        ("prefix", i)
                    } else {
                        (name, i - self.prefix.len())
                    };
                    FraudProofError::BadSignature {
                        branch,
                        link,
                        reason,
                    }
                })?;
            }
        }
        self.culprit().ok_or(FraudProofError::Shape("no culprit"))
    }

    /// The canonical encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(FRAUD_PROOF_VERSION);
        out.extend_from_slice(&self.serial);
        out.push(self.value.to_byte());
        out.extend_from_slice(&self.authority.0);
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&(self.prefix.len() as u16).to_le_bytes());
        out.extend_from_slice(&(self.branch_a.len() as u16).to_le_bytes());
        for l in self
            .prefix
            .iter()
            .chain(&self.branch_a)
            .chain(&self.branch_b)
        {
            l.encode_into(&mut out);
        }
        out
    }

    /// Decodes a proof, rejecting trailing bytes.
    pub fn decode(bytes: &[u8]) -> Result<FraudProof, FraudProofError> {
        let mut r = Reader::new(bytes);
        r.version(FRAUD_PROOF_VERSION, "fraud proof")?;
        let serial = r.array("serial")?;
        let value = Denomination::from_byte(r.u8("value")?)?;
        let authority = PublicKey(r.array("authority")?);
        let nonce = r.array("nonce")?;
        let np = r.u16("prefix length")? as usize;
        let nb = r.u16("branch length")? as usize;
        let need = (np + 2 * nb) * 128;
        if r.remaining() < need {
            return Err(DecodeError::Truncated {
                what: "links",
                needed: need - r.remaining(),
            }
            .into());
        }
        let mut read = |n: usize| {
            (0..n)
                .map(|_| Link::decode_from(&mut r))
                .collect::<Result<Vec<_>, _>>()
        };
        let prefix = read(np)?;
        let branch_a = read(nb)?;
        let branch_b = read(nb)?;
        r.finish()?;
        Ok(FraudProof {
            serial,
            value,
            authority,
            nonce,
            prefix,
            branch_a,
            branch_b,
        })
    }
}

fn encode_links(links: &[Link]) -> Vec<u8> {
    let mut out = Vec::with_capacity(links.len() * 128);
    for l in links {
        l.encode_into(&mut out);
    }
    out
}

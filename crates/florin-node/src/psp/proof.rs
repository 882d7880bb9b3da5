//! Proof of a cross-provider payment (Filia's non-repudiation, `004_…` 4.1, Fig. 1b).
//!
//! A paying provider keeps, for every payment to another provider's customer, a
//! [`TransferProof`] that anyone can check offline:
//!
//! 1. **Where to pay** ([`PayeeOffer`], step ③): the payee's provider signs, with its peer key,
//!    the encumbrance its account is paid at. The payer's provider refuses to pay an unsigned
//!    answer or one signed by another key than the peer's configured one.
//! 2. **That it was paid** ([`LedgerConfirmation`], steps ⑤–⑥): the ledger (the document's
//!    Verifier) signs, with the issuer's key, that the transaction is confirmed; the proof holds
//!    the transaction itself, whose txid binds the output of `amount_cents` to that
//!    encumbrance.
//! 3. **That the payee's provider took it** ([`ReceiptAck`], step ⑧): its signed answer to the
//!    hand-over (`credited`, or `known` for an output it had already credited).
//!
//! With 1 and 2 the payee's provider cannot say it was not paid, nor where; with 3 it cannot
//! say it was not told. What Florin does not do is Filia's joint key `r1 + r2` (steps ②, ④, ⑦):
//! the output pays the payee's account key directly, so it is the payee's from the moment it
//! is confirmed (see docs/psp.md).

use florin_crypto::{hash, Digest, PublicKey, SecretKey, Signature};
use florin_ledger::{Encumbrance, Transaction};
use serde::{Deserialize, Serialize};

use super::api::{ReceiveAnswer, Received};
use crate::api::LedgerConfirmation;

/// Domain of [`PayeeOffer`]'s signature.
pub const OFFER_DOMAIN: &str = "florin/psp/payee-offer/v1";
/// Domain of [`ReceiptAck`]'s signature.
pub const ACK_DOMAIN: &str = "florin/psp/receive-answer/v1";
/// The [`TransferProof`] format this version writes and reads.
pub const PROOF_VERSION: u32 = 1;

/// A proof that does not hold, in words naming the part that fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProofError(pub String);

fn bad(s: impl Into<String>) -> ProofError {
    ProofError(s.into())
}

fn signature(hex_sig: &str, what: &str) -> Result<Signature, ProofError> {
    hex::decode(hex_sig)
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .map(Signature)
        .ok_or_else(|| bad(format!("{what}: the signature is not 64 bytes of hex")))
}

fn key(s: &str, what: &str) -> Result<PublicKey, ProofError> {
    PublicKey::parse(s).map_err(|e| bad(format!("{what}: key {s:?}: {e}")))
}

/// The payee's provider's signed word on where one of its accounts is paid.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PayeeOffer {
    /// The payee's provider's own name.
    pub psp: String,
    /// The account.
    pub account: String,
    /// Its encumbrance (text form).
    pub encumbrance: String,
    /// Unix seconds when signed.
    pub at: u64,
    /// The provider's peer key (`eur1…`).
    pub key: String,
    /// Ed25519 (hex) over `H("florin/psp/payee-offer/v1", psp ‖ 0 ‖ account ‖ 0 ‖
    /// encumbrance ‖ 0 ‖ at (8, LE))`.
    pub signature: String,
}

impl PayeeOffer {
    fn digest(psp: &str, account: &str, encumbrance: &str, at: u64) -> Digest {
        hash(
            OFFER_DOMAIN,
            &[
                psp.as_bytes(),
                &[0],
                account.as_bytes(),
                &[0],
                encumbrance.as_bytes(),
                &[0],
                &at.to_le_bytes(),
            ],
        )
    }

    /// Signs where `account` is paid.
    pub fn sign(
        peer_key: &SecretKey,
        psp: &str,
        account: &str,
        encumbrance: &str,
        at: u64,
    ) -> PayeeOffer {
        let sig = peer_key.sign(&Self::digest(psp, account, encumbrance, at));
        PayeeOffer {
            psp: psp.into(),
            account: account.into(),
            encumbrance: encumbrance.into(),
            at,
            key: peer_key.public_key().to_address(),
            signature: hex::encode(sig.0),
        }
    }

    /// Checks the signature; the key it verifies under.
    pub fn verify(&self) -> Result<PublicKey, ProofError> {
        let k = key(&self.key, "the payee's provider's offer")?;
        let sig = signature(&self.signature, "the payee's provider's offer")?;
        florin_crypto::verify(
            &k,
            &Self::digest(&self.psp, &self.account, &self.encumbrance, self.at),
            &sig,
        )
        .map_err(|_| bad("the payee's provider's signature on where to pay does not verify"))?;
        Ok(k)
    }
}

/// A provider's signature on its answer to a hand-over (`POST /v1/psp/receive`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReceiptAck {
    /// The answering provider's own name.
    pub psp: String,
    /// Unix seconds when signed.
    pub at: u64,
    /// Its peer key (`eur1…`).
    pub key: String,
    /// Ed25519 (hex) over `H("florin/psp/receive-answer/v1", psp ‖ 0 ‖ at (8, LE) ‖ for each
    /// result: id ‖ 0 ‖ account ‖ 0 ‖ outcome ‖ 0)`.
    pub signature: String,
}

impl ReceiptAck {
    fn digest(psp: &str, at: u64, results: &[Received]) -> Digest {
        let mut parts: Vec<&[u8]> = vec![psp.as_bytes(), &[0]];
        let at = at.to_le_bytes();
        parts.push(&at);
        for r in results {
            parts.extend_from_slice(&[
                r.id.as_bytes(),
                &[0],
                r.account.as_deref().unwrap_or("").as_bytes(),
                &[0],
                r.outcome.as_bytes(),
                &[0],
            ]);
        }
        hash(ACK_DOMAIN, &parts)
    }

    /// Signs `results`.
    pub fn sign(peer_key: &SecretKey, psp: &str, at: u64, results: &[Received]) -> ReceiptAck {
        let sig = peer_key.sign(&Self::digest(psp, at, results));
        ReceiptAck {
            psp: psp.into(),
            at,
            key: peer_key.public_key().to_address(),
            signature: hex::encode(sig.0),
        }
    }

    /// Checks the signature over `results`; the key it verifies under.
    pub fn verify(&self, results: &[Received]) -> Result<PublicKey, ProofError> {
        let k = key(&self.key, "the acknowledgement")?;
        let sig = signature(&self.signature, "the acknowledgement")?;
        florin_crypto::verify(&k, &Self::digest(&self.psp, self.at, results), &sig).map_err(
            |_| bad("the payee's provider's signature on its acknowledgement does not verify"),
        )?;
        Ok(k)
    }
}

/// Everything a paying provider keeps about one cross-provider payment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TransferProof {
    /// [`PROOF_VERSION`].
    pub version: u32,
    /// The transaction's txid (hex).
    pub txid: String,
    /// The signed transaction (hex of `Transaction::encode`).
    pub tx: String,
    /// Which of its outputs pays the payee.
    pub output: usize,
    /// Amount paid, in cents.
    pub amount_cents: u64,
    /// The paying account, as `name@provider`.
    pub payer: String,
    /// The payee, as `account@peer` (the peer as the paying provider names it).
    pub payee: String,
    /// Where the payee's provider said to pay.
    pub offer: PayeeOffer,
    /// The ledger's confirmation; absent until fetched (the provider's upkeep fetches it).
    #[serde(default)]
    pub confirmation: Option<LedgerConfirmation>,
    /// The payee's provider's signed answer to the hand-over; absent until it answered.
    #[serde(default)]
    pub acknowledgement: Option<ReceiveAnswer>,
}

/// What a proof shows once checked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProofCheck {
    /// The txid (hex).
    pub txid: String,
    /// Amount paid, in cents.
    pub amount_cents: u64,
    /// The payer (`name@provider`).
    pub payer: String,
    /// The payee's account at its provider.
    pub payee_account: String,
    /// The payee's provider's own name.
    pub payee_psp: String,
    /// The key the payee's provider signed with.
    pub payee_psp_key: String,
    /// The encumbrance paid.
    pub encumbrance: String,
    /// The key that signed the ledger's confirmation, if there is one.
    pub ledger_issuer: Option<String>,
    /// When the ledger signed it.
    pub confirmed_at: Option<u64>,
    /// The payee's provider's answer for the output (`credited` / `known`), if it answered.
    pub acknowledged: Option<String>,
    /// Confirmed by the ledger and acknowledged by the payee's provider.
    pub complete: bool,
}

impl TransferProof {
    /// Checks every part that is present against the others and their signatures, offline.
    /// `issuer` and `payee_key`, when given, are the keys the caller trusts for the ledger and
    /// for the payee's provider: a proof signed by any other is refused. Without them the
    /// keys that signed are reported, for the caller to compare.
    pub fn verify(
        &self,
        issuer: Option<&PublicKey>,
        payee_key: Option<&PublicKey>,
    ) -> Result<ProofCheck, ProofError> {
        if self.version != PROOF_VERSION {
            return Err(bad(format!(
                "proof format {} (this version reads {PROOF_VERSION})",
                self.version
            )));
        }
        let bytes = hex::decode(&self.tx).map_err(|_| bad("the transaction is not hex"))?;
        let Ok(Transaction::Transfer(t)) = Transaction::decode(&bytes) else {
            return Err(bad("the transaction is not a ledger transfer"));
        };
        let txid = t.txid();
        if hex::encode(txid) != self.txid {
            return Err(bad(format!(
                "the transaction's txid is {}, the proof names {}",
                hex::encode(txid),
                self.txid
            )));
        }
        let outs = t.output_utxos();
        let out = outs
            .get(self.output)
            .ok_or_else(|| bad(format!("the transaction has no output {}", self.output)))?;
        if out.value != self.amount_cents {
            return Err(bad(format!(
                "output {} pays {} cents, the proof says {}",
                self.output, out.value, self.amount_cents
            )));
        }
        let offered = Encumbrance::parse_text(&self.offer.encumbrance)
            .ok_or_else(|| bad("the offer's encumbrance is not one"))?;
        if out.encumbrance != offered {
            return Err(bad(format!(
                "output {} pays {}, the payee's provider asked for {}",
                self.output,
                out.encumbrance.to_text(),
                self.offer.encumbrance
            )));
        }
        let psp_key = self.offer.verify()?;
        if let Some(k) = payee_key {
            if *k != psp_key {
                return Err(bad(format!(
                    "the offer is signed by {}, not by the payee's provider's key {}",
                    psp_key.to_address(),
                    k.to_address()
                )));
            }
        }
        let payee_account = self
            .payee
            .split_once('@')
            .map_or(self.payee.as_str(), |(a, _)| a);
        if payee_account != self.offer.account {
            return Err(bad(format!(
                "the proof names payee {}, the offer account {}",
                self.payee, self.offer.account
            )));
        }
        let (mut ledger_issuer, mut confirmed_at) = (None, None);
        if let Some(c) = &self.confirmation {
            let (ctxid, ikey) = c.verify().map_err(bad)?;
            if ctxid != txid {
                return Err(bad("the ledger's confirmation is for another transaction"));
            }
            if let Some(k) = issuer {
                if *k != ikey {
                    return Err(bad(format!(
                        "the confirmation is signed by {}, not by the ledger's issuer {}",
                        ikey.to_address(),
                        k.to_address()
                    )));
                }
            }
            ledger_issuer = Some(ikey.to_address());
            confirmed_at = Some(c.at);
        }
        let mut acknowledged = None;
        if let Some(a) = &self.acknowledgement {
            let signed = a
                .signed
                .as_ref()
                .ok_or_else(|| bad("the acknowledgement is not signed"))?;
            let k = signed.verify(&a.results)?;
            if k != psp_key {
                return Err(bad(
                    "the acknowledgement is signed by another key than the payee's provider's offer",
                ));
            }
            let id = hex::encode(out.id());
            let r = a
                .results
                .iter()
                .find(|r| r.id == id)
                .ok_or_else(|| bad("the acknowledgement does not name the payee's output"))?;
            if r.outcome != "credited" && r.outcome != "known" {
                return Err(bad(format!(
                    "the payee's provider answered {:?} for the output",
                    r.outcome
                )));
            }
            acknowledged = Some(r.outcome.clone());
        }
        Ok(ProofCheck {
            txid: self.txid.clone(),
            amount_cents: self.amount_cents,
            payer: self.payer.clone(),
            payee_account: self.offer.account.clone(),
            payee_psp: self.offer.psp.clone(),
            payee_psp_key: psp_key.to_address(),
            encumbrance: self.offer.encumbrance.clone(),
            complete: confirmed_at.is_some() && acknowledged.is_some(),
            ledger_issuer,
            confirmed_at,
            acknowledged,
        })
    }
}

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
/// The scalar 1 (big-endian), to check that a point is a usable key.
const ONE: [u8; 32] = {
    let mut b = [0u8; 32];
    b[31] = 1;
    b
};
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

/// Appends `b` with its length (4 bytes, LE) in front: fields of a signed digest can never
/// be spliced into one another.
fn field(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// The outcomes a provider may answer for one handed-over output.
pub const OUTCOMES: [&str; 4] = ["credited", "known", "not_ours", "not_unspent"];

fn key(s: &str, what: &str) -> Result<PublicKey, ProofError> {
    PublicKey::parse(s).map_err(|e| bad(format!("{what}: key {s:?}: {e}")))
}

/// The payee's provider's signed word on where one of its accounts is paid.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct PayeeOffer {
    /// The payee's provider's own name.
    pub psp: String,
    /// The account.
    pub account: String,
    /// Its encumbrance (text form): the account's key, or with `r1` the encumbrance of
    /// `R1` itself.
    pub encumbrance: String,
    /// Unix seconds when signed.
    pub at: u64,
    /// The amount announced (0 for a standing offer from `GET /v1/psp/payees/{name}`).
    #[serde(default)]
    pub amount_cents: u64,
    /// Filia's `R1` (hex, SEC1 compressed): a fresh note key of the account, whose secret
    /// `r1` the payee's key-management network holds in shares. The payment goes to
    /// `R1 + R2`.
    #[serde(default)]
    pub r1: Option<String>,
    /// The transfer's id, which the hand-over names.
    #[serde(default)]
    pub transfer: Option<String>,
    /// The provider's peer key (`eur1…`).
    pub key: String,
    /// Ed25519 (hex) over `H("florin/psp/payee-offer/v1", [psp] ‖ [account] ‖ [encumbrance] ‖
    /// at (8, LE) ‖ amount (8, LE) ‖ [r1 or empty] ‖ [transfer or empty])`, where `[x]` is x's
    /// length (4 bytes, LE) then x.
    pub signature: String,
}

impl PayeeOffer {
    fn digest(&self) -> Digest {
        let mut b = Vec::new();
        field(&mut b, self.psp.as_bytes());
        field(&mut b, self.account.as_bytes());
        field(&mut b, self.encumbrance.as_bytes());
        b.extend_from_slice(&self.at.to_le_bytes());
        b.extend_from_slice(&self.amount_cents.to_le_bytes());
        field(&mut b, self.r1.as_deref().unwrap_or("").as_bytes());
        field(&mut b, self.transfer.as_deref().unwrap_or("").as_bytes());
        hash(OFFER_DOMAIN, &[&b])
    }

    /// Signs where `account` is paid (a standing offer: its own key).
    pub fn sign(
        peer_key: &SecretKey,
        psp: &str,
        account: &str,
        encumbrance: &str,
        at: u64,
    ) -> PayeeOffer {
        Self::sign_joint(peer_key, psp, account, encumbrance, at, 0, None)
    }

    /// Signs an offer; with `joint` = (`R1` hex, transfer id), Filia's joint key.
    pub fn sign_joint(
        peer_key: &SecretKey,
        psp: &str,
        account: &str,
        encumbrance: &str,
        at: u64,
        amount_cents: u64,
        joint: Option<(String, String)>,
    ) -> PayeeOffer {
        let (r1, transfer) = match joint {
            Some((r, t)) => (Some(r), Some(t)),
            None => (None, None),
        };
        let mut o = PayeeOffer {
            psp: psp.into(),
            account: account.into(),
            encumbrance: encumbrance.into(),
            at,
            amount_cents,
            r1,
            transfer,
            key: peer_key.public_key().to_address(),
            signature: String::new(),
        };
        o.signature = hex::encode(peer_key.sign(&o.digest()).0);
        o
    }

    /// Checks the signature (and that `R1`, if any, is a key whose encumbrance the offer
    /// names); the key it verifies under.
    pub fn verify(&self) -> Result<PublicKey, ProofError> {
        let k = key(&self.key, "the payee's provider's offer")?;
        let sig = signature(&self.signature, "the payee's provider's offer")?;
        florin_crypto::verify(&k, &self.digest(), &sig)
            .map_err(|_| bad("the payee's provider's signature on where to pay does not verify"))?;
        if let Some(r1) = self.r1_key()? {
            if Encumbrance::p256(&florin_crypto::P256PublicKey(r1)).to_text() != self.encumbrance {
                return Err(bad("the offer's R1 is not the key of its encumbrance"));
            }
            if self.transfer.is_none() {
                return Err(bad("the offer has R1 but no transfer id"));
            }
        }
        Ok(k)
    }

    /// `R1`, if the offer is for a joint key.
    pub fn r1_key(&self) -> Result<Option<[u8; 33]>, ProofError> {
        self.r1
            .as_deref()
            .map(|h| {
                hex::decode(h)
                    .ok()
                    .and_then(|b| <[u8; 33]>::try_from(b).ok())
                    .filter(|k| florin_custody::dkls::tweak_public(k, &ONE).is_ok())
                    .ok_or_else(|| bad("the offer's R1 is not a P-256 key"))
            })
            .transpose()
    }

    /// Where a payment under this offer goes: `R1 + R2` for a joint key (`r2_public` =
    /// `R2`), else the offer's encumbrance.
    pub fn target(&self, r2_public: Option<&[u8; 33]>) -> Result<Encumbrance, ProofError> {
        match (self.r1_key()?, r2_public) {
            (Some(r1), Some(r2)) => {
                let k = florin_custody::dkls::add_public(&r1, r2)
                    .map_err(|e| bad(format!("R1 + R2: {e}")))?;
                Ok(Encumbrance::p256(&florin_crypto::P256PublicKey(k)))
            }
            (Some(_), None) => Err(bad("a joint-key offer needs R2")),
            (None, Some(_)) => Err(bad("R2 given for an offer without R1")),
            (None, None) => Encumbrance::parse_text(&self.encumbrance)
                .ok_or_else(|| bad("the offer's encumbrance is not one")),
        }
    }
}

/// A provider's signature on its answer to a hand-over (`POST /v1/psp/receive`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ReceiptAck {
    /// The answering provider's own name.
    pub psp: String,
    /// Unix seconds when signed.
    pub at: u64,
    /// Its peer key (`eur1…`).
    pub key: String,
    /// Ed25519 (hex) over `H("florin/psp/receive-answer/v1", [psp] ‖ at (8, LE) ‖ count (4,
    /// LE) ‖ for each result: [id] ‖ [account or empty] ‖ [outcome])`, where `[x]` is x's
    /// length (4 bytes, LE) then x.
    pub signature: String,
}

impl ReceiptAck {
    fn digest(psp: &str, at: u64, results: &[Received]) -> Digest {
        let mut b = Vec::new();
        field(&mut b, psp.as_bytes());
        b.extend_from_slice(&at.to_le_bytes());
        b.extend_from_slice(&(results.len() as u32).to_le_bytes());
        for r in results {
            field(&mut b, r.id.as_bytes());
            field(&mut b, r.account.as_deref().unwrap_or("").as_bytes());
            field(&mut b, r.outcome.as_bytes());
        }
        hash(ACK_DOMAIN, &[&b])
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

    /// Checks the signature over `results` (each result well formed: a 64-hex id and a known
    /// outcome); the key it verifies under.
    pub fn verify(&self, results: &[Received]) -> Result<PublicKey, ProofError> {
        for r in results {
            if r.id.len() != 64 || hex::decode(&r.id).is_err() {
                return Err(bad(
                    "the acknowledgement names an output id that is not 64 hex",
                ));
            }
            if !OUTCOMES.contains(&r.outcome.as_str()) {
                return Err(bad(format!(
                    "the acknowledgement has an unknown outcome {:?}",
                    r.outcome
                )));
            }
        }
        let k = key(&self.key, "the acknowledgement")?;
        let sig = signature(&self.signature, "the acknowledgement")?;
        florin_crypto::verify(&k, &Self::digest(&self.psp, self.at, results), &sig).map_err(
            |_| bad("the payee's provider's signature on its acknowledgement does not verify"),
        )?;
        Ok(k)
    }
}

/// `R2 = r2·G` (SEC1 compressed) for `r2` in hex.
pub fn r2_public(r2_hex: &str) -> Result<[u8; 33], ProofError> {
    hex::decode(r2_hex)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .and_then(|s| florin_custody::dkls::public_of(&s).ok())
        .ok_or_else(|| bad("r2 is not a P-256 scalar (32 bytes of hex)"))
}

/// Checks a payee's provider's answer to the hand-over of `output` (hex UTXO id): signed by
/// `peer_key`, exactly one result, for that output. Its outcome.
pub fn check_ack(
    ans: &ReceiveAnswer,
    peer_key: &PublicKey,
    output: &str,
) -> Result<String, ProofError> {
    let signed = ans
        .signed
        .as_ref()
        .ok_or_else(|| bad("the acknowledgement is not signed"))?;
    let k = signed.verify(&ans.results)?;
    if k != *peer_key {
        return Err(bad(
            "the acknowledgement is signed by another key than the payee's provider's",
        ));
    }
    match ans.results.as_slice() {
        [r] if r.id == output => Ok(r.outcome.clone()),
        _ => Err(bad(
            "the acknowledgement is not one answer for the payee's output",
        )),
    }
}

/// Everything a paying provider keeps about one cross-provider payment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
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
    /// The paying account, as `name@provider`: the paying provider's record (no one else
    /// signs it).
    pub payer: String,
    /// The payee, as `account@peer` (the peer as the paying provider names it).
    pub payee: String,
    /// Where the payee's provider said to pay.
    pub offer: PayeeOffer,
    /// Filia's `r2` (hex, 32 bytes) for a joint-key offer: the output pays `R1 + r2·G`, and
    /// `r2` is handed over with it. Holding `r2` shows the paying provider chose it (no one
    /// can name a key `R2` it cannot open to steer the output elsewhere); it opens nothing
    /// by itself, since `r1` stays in the payee's network.
    #[serde(default)]
    pub r2: Option<String>,
    /// The ledger's confirmation; absent until fetched (the provider's upkeep fetches it).
    #[serde(default)]
    pub confirmation: Option<LedgerConfirmation>,
    /// The payee's provider's signed answer to the hand-over; absent until it answered.
    #[serde(default)]
    pub acknowledgement: Option<ReceiveAnswer>,
}

/// What a proof shows once checked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
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
    /// Whether it is Filia's joint key `R1 + R2`.
    pub joint_key: bool,
    /// The key that signed the ledger's confirmation, if there is one.
    pub ledger_issuer: Option<String>,
    /// When the ledger signed it.
    pub confirmed_at: Option<u64>,
    /// The payee's provider's answer for the output (`credited` / `known`), if it answered.
    pub acknowledged: Option<String>,
    /// Confirmed by the ledger and acknowledged by the payee's provider.
    pub complete: bool,
    /// Whether the ledger's and the payee's provider's keys were given to check against:
    /// without both, a proof could be signed by anyone's keys, and proves nothing until the
    /// reader compares the keys reported.
    pub pinned: bool,
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
        let psp_key = self.offer.verify()?;
        let r2 = self.r2.as_deref().map(r2_public).transpose()?;
        let offered = self.offer.target(r2.as_ref())?;
        if out.encumbrance != offered {
            return Err(bad(format!(
                "output {} pays {}, the payee's provider asked for {}",
                self.output,
                out.encumbrance.to_text(),
                offered.to_text()
            )));
        }
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
            let outcome = check_ack(a, &psp_key, &hex::encode(out.id()))?;
            if a.results.first().and_then(|r| r.account.as_deref()) != Some(&self.offer.account) {
                return Err(bad(
                    "the acknowledgement credits another account than the offer's",
                ));
            }
            if outcome != "credited" && outcome != "known" {
                return Err(bad(format!(
                    "the payee's provider answered {outcome:?} for the output"
                )));
            }
            acknowledged = Some(outcome);
        }
        Ok(ProofCheck {
            txid: self.txid.clone(),
            amount_cents: self.amount_cents,
            payer: self.payer.clone(),
            payee_account: self.offer.account.clone(),
            payee_psp: self.offer.psp.clone(),
            payee_psp_key: psp_key.to_address(),
            encumbrance: offered.to_text(),
            joint_key: r2.is_some(),
            complete: confirmed_at.is_some() && acknowledged.is_some(),
            pinned: issuer.is_some() && payee_key.is_some(),
            ledger_issuer,
            confirmed_at,
            acknowledged,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn r(id: &str, account: Option<&str>, outcome: &str) -> Received {
        Received {
            id: id.into(),
            account: account.map(str::to_string),
            outcome: outcome.into(),
        }
    }

    #[test]
    fn an_acknowledgement_cannot_be_spliced_or_taken_for_another_output() {
        let b = SecretKey::from_seed(&[7; 32]);
        let (t, u) = ("aa".repeat(32), "bb".repeat(32));
        // B answered: T not unspent, U known.
        let results = vec![
            r(&t, Some("carol"), "not_unspent"),
            r(&u, Some("carol"), "known"),
        ];
        let ans = ReceiveAnswer {
            signed: Some(ReceiptAck::sign(&b, "bank-b", 5, &results)),
            results,
        };
        assert!(check_ack(&ans, &b.public_key(), &t).is_err(), "two answers");
        // Rewritten as one answer whose account swallows the rest: the bytes differ now.
        let spliced = ReceiveAnswer {
            results: vec![r(
                &t,
                Some(&format!("carol\0not_unspent\0{u}\0carol")),
                "known",
            )],
            signed: ans.signed.clone(),
        };
        assert!(check_ack(&spliced, &b.public_key(), &t).is_err());
        // A good one, then each alteration.
        let one = vec![r(&t, Some("carol"), "credited")];
        let good = ReceiveAnswer {
            signed: Some(ReceiptAck::sign(&b, "bank-b", 5, &one)),
            results: one,
        };
        assert_eq!(check_ack(&good, &b.public_key(), &t).unwrap(), "credited");
        assert!(
            check_ack(&good, &b.public_key(), &u).is_err(),
            "another output"
        );
        let stranger = SecretKey::from_seed(&[8; 32]).public_key();
        assert!(check_ack(&good, &stranger, &t).is_err(), "another key");
        let mut g = good.clone();
        g.results[0].outcome = "known".into();
        assert!(
            check_ack(&g, &b.public_key(), &t).is_err(),
            "outcome changed"
        );
        let mut g = good.clone();
        g.signed = None;
        assert!(check_ack(&g, &b.public_key(), &t).is_err(), "unsigned");
        // Ill-formed results are refused even when signed.
        let odd = vec![r("zz", None, "credited")];
        let g = ReceiveAnswer {
            signed: Some(ReceiptAck::sign(&b, "bank-b", 5, &odd)),
            results: odd,
        };
        assert!(check_ack(&g, &b.public_key(), "zz").is_err());
        let odd = vec![r(&t, None, "paid, honest")];
        let g = ReceiveAnswer {
            signed: Some(ReceiptAck::sign(&b, "bank-b", 5, &odd)),
            results: odd,
        };
        assert!(check_ack(&g, &b.public_key(), &t).is_err());
    }

    #[test]
    fn an_offer_binds_each_field_apart() {
        let b = SecretKey::from_seed(&[7; 32]);
        let o = PayeeOffer::sign(&b, "bank-b", "carol", "ed25519:00", 9);
        assert_eq!(o.verify().unwrap(), b.public_key());
        // Moving bytes from one field to the next changes what was signed.
        let mut m = o.clone();
        m.psp = "bank-bc".into();
        m.account = "arol".into();
        assert!(m.verify().is_err());
        let mut m = o.clone();
        m.at = 10;
        assert!(m.verify().is_err());
    }
}

//! Filia's remote transfer (`004_…` 4.1, Fig. 1b) between providers:
//!
//! 1. The customer asks its provider to start a transfer (`POST /v1/psp/transfers`); the
//!    provider announces it to the payee's provider (`POST /v1/psp/announce`, peer-signed, ①).
//! 2. The payee's provider answers a signed offer with a fresh note key `R1 = P + τ1·G` of
//!    the payee's account (②, ③; DKLs23 accounts — others get a standing offer of their key).
//! 3. The paying provider picks `r2`, and the customer authorizes a payment to `R1 + R2`
//!    (④, ⑤); it is paid on the ledger and confirmed (⑥, the proof).
//! 4. With the acknowledgement the paying provider hands over `r2` (⑦); the payee's provider
//!    credits the output under the note key `P + (τ1 + r2)·G`, which its nodes sign as (⑧).
//!
//! Neither provider keeps state for an offer: `τ1` and `r2` are pseudo-random functions of a
//! secret only the provider holds (derived from its peer key) and the transfer's id, so a
//! restart loses nothing and announcements cannot fill any table. Until `r2` is handed over
//! no one can spend the output: the payee's network lacks `r2`, the payer never held `r1`.

use florin_crypto::{hash, P256PublicKey};
use florin_ledger::Encumbrance;
use rand::RngCore;
use zeroize::Zeroizing;

use super::api::{Announce, Handover, StartTransfer, TransferOffer};
use super::proof::PayeeOffer;
use super::store::{now, AccountRecord};
use super::{valid_account, PeerPsp, Psp, PspError};
use crate::custody::EcdsaEngine;

/// A 32-byte secret scalar, erased when dropped.
pub(super) type Secret = Zeroizing<[u8; 32]>;

/// The path of `announce` (what a peer signs).
pub const ANNOUNCE_PATH: &str = "/v1/psp/announce";

impl Psp {
    /// A scalar only this provider can compute, for `what` and `parts`: `H(seed, …)` with
    /// the seed from its peer key (a signature over a fixed digest of a domain of its own, so
    /// never one it sends), rehashed with a counter until it is a usable P-256 scalar.
    fn secret_scalar(&self, what: &str, parts: &[&[u8]]) -> Zeroizing<[u8; 32]> {
        let seed = Zeroizing::new(
            self.cfg
                .peer_key
                .sign(&hash("florin/psp/note-seed/v1", &[]))
                .0,
        );
        for c in 0u32.. {
            let mut all: Vec<&[u8]> = vec![seed.as_slice(), what.as_bytes()];
            all.extend_from_slice(parts);
            let cb = c.to_le_bytes();
            all.push(&cb);
            let s = Zeroizing::new(hash("florin/psp/note-tweak/v1", &all));
            if florin_custody::dkls::public_of(&s).is_ok() {
                return s;
            }
        }
        unreachable!("a counter of 2^32 hashes finds a scalar")
    }

    /// Whether an account's key has note keys (DKLs23 P-256 keys): its own engine, as its
    /// record keeps it (older records: as the network reports it).
    fn has_notes(&self, rec: &AccountRecord) -> bool {
        if rec.scheme != "p256" {
            return false;
        }
        match &rec.engine {
            Some(e) => e == EcdsaEngine::Dkls23.name(),
            None => self.kmn.ecdsa_engine(&rec.key_id).ok() == Some(EcdsaEngine::Dkls23),
        }
    }

    /// `τ1` of transfer `transfer` to `account`.
    fn r1_tweak(&self, account: &str, transfer: &str) -> Zeroizing<[u8; 32]> {
        self.secret_scalar("r1", &[account.as_bytes(), &[0], transfer.as_bytes()])
    }

    /// The payee's side of ①–③: a signed offer for a payment to `req.account`, announced by
    /// the configured peer `peer`.
    pub fn announce(&self, req: Announce, peer: &str) -> Result<PayeeOffer, PspError> {
        if !valid_account(&req.account) {
            return Err(PspError::BadRequest(format!(
                "{:?} is not an account name",
                req.account
            )));
        }
        if req.amount_cents == 0 {
            return Err(PspError::BadRequest("amount must be positive".into()));
        }
        let rec = self.record(&req.account)?;
        if !self.has_notes(&rec) {
            // A key without note keys is paid as itself.
            return Ok(PayeeOffer::sign_joint(
                &self.cfg.peer_key,
                &self.cfg.name,
                &rec.name,
                &rec.encumbrance,
                now(),
                req.amount_cents,
                None,
            ));
        }
        let mut id = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut id);
        let transfer = format!("{}-{}", peer, hex::encode(id));
        let tweak = self.r1_tweak(&rec.name, &transfer);
        let r1 = self.note_key(&rec, &tweak)?;
        Ok(PayeeOffer::sign_joint(
            &self.cfg.peer_key,
            &self.cfg.name,
            &rec.name,
            &Encumbrance::p256(&P256PublicKey(r1)).to_text(),
            now(),
            req.amount_cents,
            Some((hex::encode(r1), transfer)),
        ))
    }

    /// A P-256 account's key `P` (SEC1 compressed).
    pub(super) fn account_key(&self, rec: &AccountRecord) -> Result<[u8; 33], PspError> {
        hex::decode(&rec.public_key)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| PspError::Storage(format!("account {}: public key", rec.name)))
    }

    /// `P + tweak·G` for a P-256 account.
    pub(super) fn note_key(
        &self,
        rec: &AccountRecord,
        tweak: &[u8; 32],
    ) -> Result<[u8; 33], PspError> {
        florin_custody::dkls::tweak_public(&self.account_key(rec)?, tweak)
            .map_err(|e| PspError::Storage(format!("account {}: note key: {e}", rec.name)))
    }

    /// The paying side of ①–④ for a customer of this provider: announces the payment to
    /// the payee's provider and answers where to pay (`R1 + R2` for a joint key).
    pub async fn start_transfer(&self, req: StartTransfer) -> Result<TransferOffer, PspError> {
        self.record(&req.from)?;
        if req.amount_cents == 0 {
            return Err(PspError::BadRequest("amount must be positive".into()));
        }
        if !valid_account(&req.to) {
            return Err(PspError::BadRequest(format!(
                "payee {:?} is not an account name",
                req.to
            )));
        }
        let peer = self.peer(&req.to_psp)?;
        let body = serde_json::to_vec(&Announce {
            account: req.to.clone(),
            amount_cents: req.amount_cents,
        })
        .map_err(|e| PspError::Storage(e.to_string()))?;
        let auth = super::auth::SignedRequest::header(
            &self.cfg.peer_key,
            &self.cfg.name,
            "POST",
            ANNOUNCE_PATH,
            &body,
        );
        let offer = self.links.peer_announce(&peer.url, body, auth).await?;
        super::pay::check_offer(&peer, &req.to, &offer)?;
        if offer.amount_cents != req.amount_cents {
            return Err(PspError::Refused(format!(
                "the payee's provider {} offered for another amount",
                peer.id
            )));
        }
        let (enc, r2) = self.offer_target(&peer, &offer)?;
        Ok(TransferOffer {
            offer,
            encumbrance: enc.to_text(),
            r2: r2.map(|r| hex::encode(*r)),
        })
    }

    /// Where a payment under `offer` (checked) from the payee's provider `peer` goes, and
    /// `r2` for a joint key.
    pub(super) fn offer_target(
        &self,
        peer: &PeerPsp,
        offer: &PayeeOffer,
    ) -> Result<(Encumbrance, Option<Secret>), PspError> {
        let bad = |e: super::proof::ProofError| {
            PspError::Refused(format!("the payee's provider {}: {e}", peer.id))
        };
        if offer.r1.is_none() {
            return Ok((offer.target(None).map_err(bad)?, None));
        }
        let transfer = offer.transfer.as_deref().unwrap_or_default();
        let r2 = self.secret_scalar("r2", &[peer.key.as_bytes(), &[0], transfer.as_bytes()]);
        let r2_public = florin_custody::dkls::public_of(&r2)
            .map_err(|e| PspError::Storage(format!("r2: {e}")))?;
        Ok((offer.target(Some(&r2_public)).map_err(bad)?, Some(r2)))
    }

    /// The payee's side of ⑦: the account and note tweak (`τ1 + r2`) of a handed-over
    /// output, if `r2` makes the output's key `P + (τ1 + r2)·G`. Registers nothing: the
    /// caller does, with the credit, once the ledger says the output is unspent.
    pub(super) fn handover_key(
        &self,
        h: &Handover,
        output: &florin_ledger::Utxo,
    ) -> Result<Option<(String, Secret)>, PspError> {
        let Ok(rec) = self.record(&h.account) else {
            return Ok(None);
        };
        if !self.has_notes(&rec) {
            return Ok(None);
        }
        let Some(r2) = hex::decode(&h.r2)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(Zeroizing::new)
        else {
            return Ok(None);
        };
        let t1 = self.r1_tweak(&rec.name, &h.transfer);
        let Ok(tweak) = florin_custody::dkls::add_scalars(&t1, &r2) else {
            return Ok(None);
        };
        let enc = Encumbrance::p256(&P256PublicKey(self.note_key(&rec, &tweak)?));
        Ok((enc == output.encumbrance).then_some((rec.name, tweak)))
    }
}

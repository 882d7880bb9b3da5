//! Payments: to an account at this provider (UC1) or at another (UC2), and their repeats.

use std::sync::Arc;
use std::time::Instant;

use florin_ledger::{build, Encumbrance, Output, Transaction, Transfer};

use super::api::{PayReceipt, PayRequest};
use florin_custody::authz::{valid_id, Authorization, AuthzError, PaymentAuth};

use super::store::{self, PendingPayment, Settled};
use super::{blocking_err, check_payee, valid_account, Psp, PspError};
use crate::ledger::TxStatus;

impl Psp {
    /// Pays: same provider (UC1), another provider's customer (UC2) or any ledger
    /// encumbrance. The caller is the account's customer (see
    /// [`Psp::authenticate_customer`]); `req.authorization` is the customer's signed
    /// authorization of exactly this payment, checked here and again by every
    /// key-management node before it signs.
    pub async fn pay(self: &Arc<Self>, req: PayRequest) -> Result<PayReceipt, PspError> {
        let answer = self.pay_inner(req).await;
        // Counted by route when it was made, by the refusal's code when not.
        let (route, outcome) = match &answer {
            Ok(r) if r.repeated => (route_label(&r.route), "repeated"),
            Ok(r) => (route_label(&r.route), "ok"),
            Err(e) => ("refused", e.code()),
        };
        florin_obs::metrics::global()
            .psp_payments
            .get_or_create(&florin_obs::metrics::PaymentLabels {
                route,
                outcome: outcome.to_string(),
            })
            .inc();
        answer
    }

    async fn pay_inner(self: &Arc<Self>, req: PayRequest) -> Result<PayReceipt, PspError> {
        let start = Instant::now();
        if req.amount_cents == 0 {
            return Err(PspError::BadRequest("amount must be positive".into()));
        }
        let rec = self.record(&req.from)?;
        let customer = rec.customer_key()?;
        let Some(id) = &req.id else {
            return Err(PspError::BadRequest(
                "a payment needs its id (the one the customer's authorization names)".into(),
            ));
        };
        if !valid_id(id) {
            return Err(PspError::BadRequest(
                "a payment id is 1–64 printable ASCII characters".into(),
            ));
        }
        let auth = req
            .authorization
            .as_deref()
            .ok_or_else(|| {
                PspError::Forbidden("a payment needs the customer's authorization".into())
            })
            .and_then(|h| {
                hex::decode(h)
                    .ok()
                    .and_then(|b| PaymentAuth::decode(&b).ok())
                    .ok_or_else(|| PspError::BadRequest("malformed authorization".into()))
            })?;
        let forbidden = |e: AuthzError| PspError::Forbidden(format!("authorization: {e}"));
        auth.verify(&customer).map_err(forbidden)?;
        if auth.id != *id {
            return Err(PspError::Forbidden(
                "the authorization is for another payment id".into(),
            ));
        }
        if auth.payer != rec.enc()? {
            return Err(forbidden(AuthzError::WrongPayer));
        }
        if auth.amount_cents != req.amount_cents {
            return Err(PspError::Forbidden(
                "the authorization is for another amount".into(),
            ));
        }
        if let Some(done) = self.repeated(&rec.name, id).await? {
            return Ok(done);
        }
        auth.check_time(store::now()).map_err(forbidden)?;
        // A payee's provider: a configured peer, before any connection is made.
        let to_peer = match &req.to_psp {
            Some(psp) => Some(self.peer(psp)?),
            None => None,
        };
        if req.offer.is_some() && to_peer.is_none() {
            return Err(PspError::BadRequest(
                "an offer comes with `to_psp`, the provider that made it".into(),
            ));
        }
        // Where the money goes (and, across providers, the payee's provider's signed word
        // on it, kept as part of the proof of payment).
        let mut offer = None;
        let mut r2: Option<zeroize::Zeroizing<[u8; 32]>> = None;
        let (payee_enc, payee_account, payee_psp, route, counterparty) = match &to_peer {
            // Filia's remote transfer: an offer from `POST /v1/psp/transfers`.
            Some(peer) if req.offer.is_some() => {
                let o = req.offer.clone().unwrap_or_else(|| unreachable!());
                check_offer(peer, &req.to, &o)?;
                if o.r1.is_some() && o.amount_cents != req.amount_cents {
                    return Err(PspError::BadRequest(format!(
                        "the offer is for {} cents, the payment for {}",
                        o.amount_cents, req.amount_cents
                    )));
                }
                let (enc, secret) = self.offer_target(peer, &o)?;
                check_payee(&enc).map_err(|e| {
                    PspError::Refused(format!("the payee's provider sent an unusable key: {e}"))
                })?;
                if self.books.owner(&enc)?.is_some() {
                    return Err(PspError::BadRequest(
                        "the offer names one of this provider's own keys; pay the account here"
                            .into(),
                    ));
                }
                r2 = secret;
                offer = Some(o);
                (
                    enc,
                    None,
                    Some(peer.url.clone()),
                    "cross_provider",
                    format!("{}@{}", req.to, peer.id),
                )
            }
            Some(peer) => {
                let psp = &peer.url;
                if !valid_account(&req.to) {
                    return Err(PspError::BadRequest(format!(
                        "payee {:?} is not an account name",
                        req.to
                    )));
                }
                let v = self.peer_payee(peer, &req.to).await?;
                let enc = Encumbrance::parse_text(&v.encumbrance).ok_or_else(|| {
                    PspError::Refused("the payee's provider sent a bad encumbrance".into())
                })?;
                check_payee(&enc).map_err(|e| {
                    PspError::Refused(format!("the payee's provider sent an unusable key: {e}"))
                })?;
                // One of our own accounts (our own URL, or a peer naming our customer): pay
                // it here, never trusting another provider to credit it.
                match self.books.owner(&enc)? {
                    Some(a) => (enc, Some(a.clone()), None, "same_provider", a),
                    None => {
                        let o = v.offer.clone().ok_or_else(|| {
                            PspError::Refused(format!(
                                "the payee's provider {}: it did not sign where to pay (an \
                                 older version?); nothing was paid",
                                peer.id
                            ))
                        })?;
                        check_offer(peer, &req.to, &o)?;
                        if o.encumbrance != v.encumbrance || o.r1.is_some() {
                            return Err(PspError::Refused(format!(
                                "the payee's provider {}: its signed answer names another \
                                 encumbrance; nothing was paid",
                                peer.id
                            )));
                        }
                        offer = Some(o);
                        (
                            enc,
                            None,
                            Some(psp.clone()),
                            "cross_provider",
                            format!("{}@{}", req.to, peer.id),
                        )
                    }
                }
            }
            None => match Encumbrance::parse_text(&req.to) {
                Some(enc) => {
                    check_payee(&enc)
                        .map_err(|e| PspError::BadRequest(format!("payee {}: {e}", req.to)))?;
                    // An encumbrance that is one of ours is a same-provider payment.
                    match self.books.owner(&enc)? {
                        Some(a) => (enc, Some(a.clone()), None, "same_provider", a),
                        None => (enc, None, None, "ledger", req.to.clone()),
                    }
                }
                None => {
                    let to = self.record(&req.to)?;
                    (
                        to.enc()?,
                        Some(to.name.clone()),
                        None,
                        "same_provider",
                        to.name,
                    )
                }
            },
        };
        if payee_account.as_deref() == Some(rec.name.as_str()) {
            return Err(PspError::BadRequest("an account cannot pay itself".into()));
        }
        if auth.payee != payee_enc {
            return Err(PspError::Forbidden(format!(
                "the authorization pays {}, the payee is {}",
                auth.payee.to_text(),
                payee_enc.to_text()
            )));
        }
        let signer = self.signer(&rec).await?;
        let lock = self.lock_of(&rec.name);
        let guard = lock.lock().await;
        // A retry that raced the first request: answer it now that the lock is ours.
        if let Some(done) = self.settled_receipt(&rec.name, id)? {
            return Ok(done);
        }
        if self.resolve(Some(&rec.name)).await? > 0 {
            return Err(PspError::Unresolved(format!(
                "an earlier payment from {} is not resolved yet; retry shortly",
                rec.name
            )));
        }
        // The one transaction builder: largest coins first, change back to the account.
        let coins = self.books.coins(&rec.name)?;
        let balance: u64 = coins.iter().map(|u| u.value).sum();
        if balance < req.amount_cents {
            return Err(PspError::InsufficientFunds {
                account: rec.name.clone(),
                balance_cents: balance,
                asked_cents: req.amount_cents,
            });
        }
        let pay = Output {
            value: req.amount_cents,
            encumbrance: payee_enc,
        };
        // Filia's note model (DKLs23 accounts): the change goes to a fresh note key of the
        // account, `P + c·G` with `c` derived from the account key and the customer's
        // authorization (the nodes derive the same), never back to the account's key.
        let notes = signer.uses_notes();
        let change_tweak = match notes {
            true => Some(florin_custody::authz::change_tweak(
                &self.account_key(&rec)?,
                &auth,
            )),
            false => None,
        };
        let change_to = match &change_tweak {
            Some(c) => self.note_enc(&rec, c)?,
            None => rec.enc()?,
        };
        let draft = build::payment(&coins, vec![pay], change_to).map_err(|e| match e {
            build::BuildError::TooManyInputs { needed, max } => PspError::Refused(format!(
                "the payment needs {needed} coins, a transaction takes at most {max}; pay less first"
            )),
            other => PspError::Refused(format!("cannot build the payment: {other}")),
        })?;
        let txid = draft.txid();
        // The nodes check the customer's authorization against this very transaction.
        let authz = Authorization::new(&draft.transfer, &auth);
        // One signature over the txid per key among the inputs: the account's key, and each
        // note key (the nodes sign as `P + t·G` for the note's tweak `t`).
        let mut keys: Vec<(Encumbrance, Option<[u8; 32]>)> = Vec::new();
        for u in &draft.transfer.inputs {
            if keys.iter().any(|(e, _)| *e == u.encumbrance) {
                continue;
            }
            let tweak = self.books.note_tweak(&u.encumbrance)?;
            if tweak.is_some() && !notes {
                return Err(PspError::Storage(format!(
                    "account {} holds a note but its key has no note keys",
                    rec.name
                )));
            }
            keys.push((u.encumbrance, tweak));
        }
        let s0 = Instant::now();
        let sig_signer = signer.clone();
        let signatures = keys.len();
        // The builder checks each witness against its input's encumbrance.
        let t = tokio::task::spawn_blocking(move || -> Result<Transfer, PspError> {
            let mut ws = Vec::with_capacity(keys.len());
            for (enc, tweak) in &keys {
                let a = authz.for_note(*tweak);
                ws.push((*enc, sig_signer.witness_authorized(&txid, &a)?));
            }
            let inputs = draft.transfer.inputs.clone();
            draft
                .sign_with(|i, _| {
                    let enc = inputs.get(i).map(|u| u.encumbrance);
                    ws.iter()
                        .find(|(e, _)| Some(*e) == enc)
                        .map(|(_, w)| *w)
                        .ok_or(build::BuildError::WrongSigner { index: i })
                })
                .map_err(|e| PspError::Refused(format!("cannot sign the payment: {e}")))
        })
        .await
        .map_err(blocking_err)??;
        let sign_ms = s0.elapsed().as_secs_f64() * 1e3;
        let outs = t.output_utxos();
        let pending = PendingPayment {
            from: rec.name.clone(),
            counterparty,
            payee_account,
            payee_psp: payee_psp.clone(),
            route: route.into(),
            amount_cents: req.amount_cents,
            tx: hex::encode(Transaction::Transfer(t.clone()).encode()),
            request_id: req.id.clone(),
            offer,
            change_tweak: change_tweak.map(hex::encode),
            r2: r2.map(|k| hex::encode(*k)),
        };
        self.books.put_pending(&txid, &pending)?;
        let st = match self.submit(&Transaction::Transfer(t.clone())).await {
            Ok(st) => st,
            Err(e) => {
                return Err(PspError::Unresolved(format!(
                    "payment {} sent, outcome unknown ({e}); it is resolved in the background",
                    hex::encode(txid)
                )))
            }
        };
        let st = match st {
            // Expired on its first sending (a clock far off): its inputs say whether it
            // applied.
            // Only just expired: it may still be committing; resolved in the background.
            TxStatus::Expired(_)
                if !florin_ledger::expiry::expired_for_good(
                    t.expires,
                    florin_ledger::expiry::unix_now(),
                ) =>
            {
                TxStatus::Pending
            }
            TxStatus::Expired(_) if self.applied_before_expiry(&t).await? => TxStatus::Confirmed,
            other => other,
        };
        // Cross provider: this payment sends its own acknowledgement; the background upkeep
        // leaves it alone meanwhile (claimed before the notice is written).
        let claim = payee_psp.as_ref().and_then(|_| self.claim_notice(&txid));
        match &st {
            TxStatus::Confirmed => self.books.apply(&txid, &pending, &self.cfg.name)?,
            TxStatus::StaticInvalid(e) | TxStatus::StateInvalid(e) | TxStatus::Expired(e) => {
                self.drop_refused(Some(&txid), &rec.name, &t.inputs).await?;
                return Err(PspError::Refused(format!(
                    "the ledger refused the payment: {} {e}",
                    st.name()
                )));
            }
            TxStatus::Pending => {
                return Err(PspError::Unresolved(format!(
                    "payment {} is {} on the ledger; it is resolved in the background",
                    hex::encode(txid),
                    st.name()
                )))
            }
        }
        drop(guard);
        // Cross provider: hand the payee's provider its output (after the payer's lock is
        // released, so a provider paying itself cannot wait on itself).
        // The payment is settled: from here on errors are logged, never returned (a client
        // that saw an error would pay again).
        let mut notified = payee_psp.is_none();
        if claim.is_some() {
            match self.books.notice(&txid) {
                Ok(Some(n)) => match self.notify(&n).await {
                    Ok(ans) => {
                        if let Err(e) = self.books.drop_notice(&txid, Some(&ans)) {
                            tracing::warn!("psp: {e}");
                        }
                        if let Ok(mut b) = self.notice_backoff.lock() {
                            b.remove(&txid);
                        }
                        notified = true;
                    }
                    Err(e) => tracing::warn!(
                        "psp: payment {}: {} not told yet ({e}); the upkeep tries again",
                        hex::encode(txid),
                        n.psp
                    ),
                },
                Ok(None) => {}
                Err(e) => tracing::warn!("psp: {e}"),
            }
        }
        drop(claim);
        if payee_psp.is_some() {
            // The ledger's signed confirmation, for the proof: asked once here, briefly, so
            // that the proof is whole when the receipt comes; the upkeep asks again while the
            // ledger cannot be asked.
            let asked =
                tokio::time::timeout(std::time::Duration::from_secs(2), self.confirm_proof(&txid))
                    .await;
            if let Ok(Err(e)) | Err(e) =
                asked.map_err(|_| PspError::Unreachable("the ledger: no answer in 2 s".into()))
            {
                tracing::warn!(
                    "psp: payment {}: no ledger confirmation yet ({e}); the upkeep asks again",
                    hex::encode(txid)
                );
            }
        }
        Ok(PayReceipt {
            txid: hex::encode(txid),
            route: route.into(),
            payee_output: hex::encode(outs[0].encode()),
            change_output: outs.get(1).map(|u| hex::encode(u.encode())),
            notified,
            repeated: false,
            signatures,
            sign_ms,
            total_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The receipt of an earlier payment with this client id from `from`, if it settled.
    pub(super) fn settled_receipt(
        &self,
        from: &str,
        id: &str,
    ) -> Result<Option<PayReceipt>, PspError> {
        let Some(done) = self.books.settled(id)? else {
            return Ok(None);
        };
        if done.from != from {
            return Err(PspError::Exists(format!(
                "payment id {id:?} was used by another account"
            )));
        }
        let txid = hex::decode(&done.txid)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| PspError::Storage("receipt txid".into()))?;
        Ok(Some(receipt_of(done, self.books.notice(&txid)?.is_none())))
    }

    /// A repeated payment id: its receipt if settled; if it is still pending, resolved first
    /// (under the account's lock), and `Unresolved` if that is still not possible.
    pub(super) async fn repeated(
        &self,
        from: &str,
        id: &str,
    ) -> Result<Option<PayReceipt>, PspError> {
        if let Some(r) = self.settled_receipt(from, id)? {
            return Ok(Some(r));
        }
        let pending = self
            .books
            .pending(Some(from))?
            .into_iter()
            .any(|(_, p)| p.request_id.as_deref() == Some(id));
        if !pending {
            return Ok(None);
        }
        let lock = self.lock_of(from);
        let _g = lock.lock().await;
        self.resolve(Some(from)).await?;
        match self.settled_receipt(from, id)? {
            Some(r) => Ok(Some(r)),
            None if self
                .books
                .pending(Some(from))?
                .iter()
                .any(|(_, p)| p.request_id.as_deref() == Some(id)) =>
            {
                Err(PspError::Unresolved(format!(
                    "payment {id:?} was sent, its outcome is not known yet; retry shortly"
                )))
            }
            // Refused by the ledger when resolved: a fresh attempt may go ahead.
            None => Ok(None),
        }
    }
}

fn receipt_of(done: Settled, notified: bool) -> PayReceipt {
    PayReceipt {
        txid: done.txid,
        route: done.route,
        payee_output: done.payee_output,
        change_output: done.change_output,
        notified,
        repeated: true,
        signatures: 0,
        sign_ms: 0.0,
        total_ms: 0.0,
    }
}

/// The payee's provider's signed word on where to pay `account`: signed by the peer's
/// configured key, for that account.
pub(super) fn check_offer(
    peer: &super::PeerPsp,
    account: &str,
    offer: &super::proof::PayeeOffer,
) -> Result<(), PspError> {
    let refused = |why: String| {
        PspError::Refused(format!(
            "the payee's provider {}: {why}; nothing was paid",
            peer.id
        ))
    };
    let key = offer.verify().map_err(|e| refused(e.to_string()))?;
    let configured = florin_crypto::PublicKey::parse(&peer.key)
        .map_err(|_| PspError::Storage(format!("peer {}: bad key", peer.id)))?;
    if key != configured {
        return Err(refused(format!(
            "its answer is signed by {}, not by its configured key {}",
            key.to_address(),
            peer.key
        )));
    }
    if offer.account != account {
        return Err(refused("its signed answer names another account".into()));
    }
    Ok(())
}

impl Psp {
    /// The encumbrance of the note key `P + tweak·G` of a P-256 account (`P` its key).
    pub(super) fn note_enc(
        &self,
        rec: &super::store::AccountRecord,
        tweak: &[u8; 32],
    ) -> Result<Encumbrance, PspError> {
        Ok(Encumbrance::p256(&florin_crypto::P256PublicKey(
            self.note_key(rec, tweak)?,
        )))
    }
}

/// A receipt's route as a bounded label.
fn route_label(route: &str) -> &'static str {
    match route {
        "same_provider" => "same_provider",
        "cross_provider" => "cross_provider",
        "ledger" => "ledger",
        _ => "other",
    }
}

//! Background work: resolving pending payments and sending owed acknowledgements.

use std::sync::Arc;
use std::time::Duration;

use florin_ledger::{Transaction, Utxo};

use super::api::{Receive, ReceiveAnswer};
use super::{store, Psp, PspError, RECEIVE_PATH};
use crate::ledger::TxStatus;

impl Psp {
    /// Resolves `from`'s pending payments (the caller holds the account's lock) by sending
    /// each signed transaction again: confirmed ones are applied, refused ones dropped.
    /// Returns how many remain unresolved.
    pub(super) async fn resolve(&self, from: Option<&str>) -> Result<usize, PspError> {
        let mut left = 0;
        for (txid, p) in self.books.pending(from)? {
            let t = p.transfer()?;
            match self.submit(&Transaction::Transfer(t.clone())).await {
                Ok(TxStatus::Confirmed) => self.books.apply(&txid, &p, &self.cfg.name)?,
                Ok(TxStatus::StaticInvalid(_) | TxStatus::StateInvalid(_)) => {
                    self.drop_refused(Some(&txid), &p.from, &t.inputs).await?;
                }
                // Sent again after its expiry: the ledger no longer says whether it applied,
                // its inputs do.
                Ok(TxStatus::Expired(_))
                    if !florin_ledger::expiry::expired_for_good(
                        t.expires,
                        florin_ledger::expiry::unix_now(),
                    ) =>
                {
                    // Only just expired: it may still be committing; asked again later.
                    left += 1;
                }
                Ok(TxStatus::Expired(_)) => {
                    if self.applied_before_expiry(&t).await? {
                        self.books.apply(&txid, &p, &self.cfg.name)?;
                    } else {
                        self.drop_refused(Some(&txid), &p.from, &t.inputs).await?;
                    }
                }
                _ => left += 1,
            }
        }
        Ok(left)
    }

    /// Resolves the pending payments of every account no request is working on (a busy
    /// account resolves its own before it pays again). Returns how many remain.
    pub async fn resolve_idle(&self) -> Result<usize, PspError> {
        let mut accounts: Vec<String> = self
            .books
            .pending(None)?
            .into_iter()
            .map(|(_, p)| p.from)
            .collect();
        accounts.sort();
        accounts.dedup();
        let mut left = 0;
        for a in accounts {
            let lock = self.lock_of(&a);
            let Ok(_g) = lock.try_lock() else {
                left += 1;
                continue;
            };
            // One account's trouble (a ledger error, a corrupt record) does not hold up the
            // others.
            match self.resolve(Some(&a)).await {
                Ok(n) => left += n,
                Err(e) => {
                    tracing::warn!("psp: resolving {a}'s payments: {e}");
                    left += 1;
                }
            }
        }
        Ok(left)
    }

    /// A refused payment: asks the ledger which of its inputs are gone, then drops the
    /// pending record and those coins in one write (if the ledger cannot be asked, nothing
    /// changes and the payment is tried again).
    /// Whether a payment the ledger answers expired applied before its expiry: every input
    /// is spent (the account's pending payment holds its inputs, so nothing else of this
    /// provider spends them). Otherwise it never applied, and now never will.
    pub(super) async fn applied_before_expiry(
        &self,
        t: &florin_ledger::Transfer,
    ) -> Result<bool, PspError> {
        for u in &t.inputs {
            if self.is_unspent(&u.id()).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(super) async fn drop_refused(
        &self,
        txid: Option<&[u8; 32]>,
        account: &str,
        inputs: &[Utxo],
    ) -> Result<(), PspError> {
        let mut gone = Vec::new();
        for u in inputs {
            if !self.is_unspent(&u.id()).await? {
                gone.push(u.id());
            }
        }
        self.books.drop_refused(txid, account, &gone)
    }

    /// Sends the acknowledgements owed to payees' providers; returns how many are still owed.
    pub async fn notify_all(&self) -> Result<usize, PspError> {
        let mut left = 0;
        let now = std::time::Instant::now();
        for (txid, n) in self.books.notices()? {
            // Waiting out its back-off after a refusal.
            if self
                .notice_backoff
                .lock()
                .ok()
                .and_then(|b| b.get(&txid).map(|(next, _)| *next > now))
                .unwrap_or(false)
            {
                left += 1;
                continue;
            }
            // A payment sending its own acknowledgement now: its result stands.
            let Some(_claim) = self.claim_notice(&txid) else {
                left += 1;
                continue;
            };
            // Sent and dropped since the list was read.
            if self.books.notice(&txid)?.is_none() {
                continue;
            }
            match self.notify(&n).await {
                Ok(ans) => {
                    self.books.drop_notice(&txid, Some(&ans))?;
                    if let Ok(mut b) = self.notice_backoff.lock() {
                        b.remove(&txid);
                    }
                }
                // A hand-over (Filia's ⑦) is never given up: the notice holds the only
                // `r2` besides the proof, and without it no one can spend the output. A
                // refusal is asked again with a growing pause (2 s doubling, at most 10
                // minutes); a peer out of reach or busy, at the next round as any notice.
                Err(
                    e @ (PspError::Refused(_) | PspError::NotFound(_) | PspError::BadRequest(_)),
                ) if n.handover.is_some() => {
                    let tries = self
                        .notice_backoff
                        .lock()
                        .ok()
                        .and_then(|b| b.get(&txid).map(|(_, k)| *k))
                        .unwrap_or(0);
                    let wait = Duration::from_secs((2u64 << tries.min(9)).min(600));
                    tracing::warn!(
                        "psp: {} did not take the key handed over with payment {} ({e}); asking \
                         again in {} s",
                        n.psp,
                        hex::encode(txid),
                        wait.as_secs()
                    );
                    if let Ok(mut b) = self.notice_backoff.lock() {
                        b.insert(txid, (now + wait, tries + 1));
                    }
                    left += 1;
                }
                // A refusal is final: asking again will not change the answer. The money is
                // the payee's on the ledger; its provider can still be handed the output.
                Err(
                    e @ (PspError::Refused(_) | PspError::NotFound(_) | PspError::BadRequest(_)),
                ) => {
                    tracing::warn!(
                        "psp: {} refused payment {} ({e}); not asking again",
                        n.psp,
                        hex::encode(txid)
                    );
                    self.books.drop_notice(&txid, None)?;
                }
                Err(_) => left += 1,
            }
        }
        Ok(left)
    }

    /// Hands the payee's provider its output; its answer (signed) when it credited it or
    /// had before.
    pub(super) async fn notify(&self, n: &store::Notice) -> Result<ReceiveAnswer, PspError> {
        let body = serde_json::to_vec(&Receive {
            outputs: vec![n.output.clone()],
            from: Some(format!("{}@{}", n.from, self.cfg.name)),
            handover: n.handover.iter().cloned().collect(),
        })
        .map_err(|e| PspError::Storage(e.to_string()))?;
        // Receiving is idempotent (an output already credited answers `known`), so a call
        // that got no answer is made once more at once, signed afresh (the payee's provider
        // may have seen the first nonce).
        let mut again = true;
        let ans = loop {
            let auth = super::auth::SignedRequest::header(
                &self.cfg.peer_key,
                &self.cfg.name,
                "POST",
                RECEIVE_PATH,
                &body,
            );
            match self.links.peer_receive(&n.psp, body.clone(), auth).await {
                Err(PspError::Unreachable(_)) if again => again = false,
                r => break r?,
            }
        };
        // The answer goes into the proof: it must be the peer's signed word on this output.
        let peer = self.peer(&n.psp)?;
        let key = florin_crypto::PublicKey::parse(&peer.key)
            .map_err(|_| PspError::Storage(format!("peer {}: bad key", peer.id)))?;
        let id = hex::decode(&n.output)
            .ok()
            .and_then(|b| Utxo::decode(&b).ok())
            .map(|u| hex::encode(u.id()))
            .ok_or_else(|| PspError::Storage("notice output".into()))?;
        match super::proof::check_ack(&ans, &key, &id) {
            Ok(o) if o == "credited" || o == "known" => Ok(ans),
            Ok(other) => Err(PspError::Refused(format!(
                "the payee's provider answered {other:?}"
            ))),
            Err(e) => Err(PspError::Refused(format!(
                "the payee's provider's acknowledgement does not hold: {e}"
            ))),
        }
    }

    /// Fetches the ledger's confirmation of a settled cross-provider payment into its proof
    /// (nothing to do if it has one or is no such payment). The signature and the txid are
    /// checked before it is kept.
    pub(super) async fn confirm_proof(&self, txid: &[u8; 32]) -> Result<(), PspError> {
        if !self.books.proof_needs_confirmation(txid)? {
            return Ok(());
        }
        let issuer = self.ledger_issuer().await?;
        let c = self.links.confirmation(&self.cfg.ledger, txid).await?;
        let (ctxid, key) = c
            .verify()
            .map_err(|e| PspError::Unreachable(format!("the ledger's confirmation: {e}")))?;
        if ctxid != *txid {
            return Err(PspError::Unreachable(
                "the ledger confirmed another transaction".into(),
            ));
        }
        if key != issuer {
            return Err(PspError::Unreachable(format!(
                "the confirmation is signed by {}, not by the ledger's issuer {}",
                key.to_address(),
                issuer.to_address()
            )));
        }
        self.books.set_confirmation(txid, &c)
    }

    /// The ledger's issuer key, as its `/v1/info` says (asked once, then remembered).
    async fn ledger_issuer(&self) -> Result<florin_crypto::PublicKey, PspError> {
        if let Some(k) = self.issuer.lock().ok().and_then(|g| *g) {
            return Ok(k);
        }
        let k = self.links.ledger_issuer(&self.cfg.ledger).await?;
        if let Ok(mut g) = self.issuer.lock() {
            *g = Some(k);
        }
        Ok(k)
    }

    /// Fetches the ledger's confirmations that proofs still lack (at most 256 a call);
    /// returns how many are still missing.
    pub async fn confirm_proofs(&self) -> Result<usize, PspError> {
        // Round robin from where the last call stopped, so no entry waits behind others.
        let after = self.confirm_cursor.lock().ok().and_then(|g| *g);
        let todo = self.books.proofs_to_confirm(after, 64)?;
        if let Ok(mut g) = self.confirm_cursor.lock() {
            *g = todo.last().copied();
        }
        let mut left = 0;
        for txid in todo {
            let r = tokio::time::timeout(Duration::from_secs(10), self.confirm_proof(&txid))
                .await
                .unwrap_or_else(|_| {
                    Err(PspError::Unreachable(
                        "the ledger: no answer in 10 s".into(),
                    ))
                });
            let Err(e) = r else {
                continue;
            };
            // The ledger remembers a transfer's txid only until its expiry: past it, no
            // confirmation can be had any more, and asking again is pointless.
            let expires = self
                .books
                .proof(&txid)?
                .and_then(|p| hex::decode(&p.tx).ok())
                .and_then(|b| Transaction::decode(&b).ok())
                .map(|t| match t {
                    Transaction::Transfer(t) => t.expires,
                    _ => 0,
                });
            let now = florin_ledger::expiry::unix_now();
            if expires.is_none_or(|x| florin_ledger::expiry::expired_for_good(x, now)) {
                tracing::warn!(
                    "psp: payment {}: the ledger can no longer confirm it ({e}); its proof stays \
                     without the ledger's confirmation",
                    hex::encode(txid)
                );
                self.books.give_up_confirmation(&txid)?;
            } else {
                tracing::warn!("psp: ledger confirmation of {}: {e}", hex::encode(txid));
                left += 1;
            }
        }
        Ok(left)
    }

    /// Background work: resolve pending payments and send owed acknowledgements, every
    /// `every`, until the returned task is dropped or aborted.
    pub fn spawn_upkeep(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        // A weak reference: the provider closes (its books' file lock included) when the
        // server lets go of it, not when this task next wakes.
        // Resolution and acknowledgements run apart, so a slow peer provider cannot hold up
        // the resolution of payments.
        let weak = Arc::downgrade(self);
        let weak2 = weak.clone();
        let weak3 = weak.clone();
        tokio::spawn(async move {
            let resolving = async move {
                loop {
                    {
                        let Some(me) = weak.upgrade() else { return };
                        if let Err(e) = me.resolve_idle().await {
                            tracing::warn!("psp: resolving payments: {e}");
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            };
            let notifying = async move {
                loop {
                    {
                        let Some(me) = weak2.upgrade() else { return };
                        if let Err(e) = me.notify_all().await {
                            tracing::warn!("psp: acknowledgements: {e}");
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            };
            // Confirmations apart too: a slow ledger does not hold up acknowledgements.
            let confirming = async move {
                loop {
                    {
                        let Some(me) = weak3.upgrade() else { return };
                        if let Err(e) = me.confirm_proofs().await {
                            tracing::warn!("psp: ledger confirmations: {e}");
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            };
            tokio::join!(resolving, notifying, confirming);
        })
    }
}

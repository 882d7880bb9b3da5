//! Money in: the devnet faucet and outputs handed over by payers' providers (UC2).

use std::sync::Arc;

use florin_ledger::Utxo;

use super::api::{AccountView, Receive, ReceiveAnswer, Received};
use super::store::Line;
use super::{Psp, PspError, MAX_RECEIVE};
use crate::api::{LedgerFaucet, LedgerFaucetAnswer};

impl Psp {
    /// The ledger's faucet (devnet) mints `amount_cents` to the account.
    pub async fn fund(
        self: &Arc<Self>,
        name: &str,
        amount_cents: u64,
    ) -> Result<AccountView, PspError> {
        let rec = self.record(name)?;
        if amount_cents == 0 {
            return Err(PspError::BadRequest("amount must be positive".into()));
        }
        let lock = self.lock_of(name);
        let _g = lock.lock().await;
        let ans: LedgerFaucetAnswer = self
            .links
            .faucet(
                &self.cfg.ledger,
                &LedgerFaucet {
                    owner: rec.encumbrance.clone(),
                    amount_cents,
                },
            )
            .await?;
        let coins = ans
            .outputs
            .iter()
            .map(|h| {
                hex::decode(h)
                    .ok()
                    .and_then(|b| Utxo::decode(&b).ok())
                    .ok_or_else(|| PspError::Unreachable("the faucet sent a bad output".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let enc = rec.enc()?;
        if coins.iter().any(|u| u.encumbrance != enc) {
            return Err(PspError::Refused("the faucet paid someone else".into()));
        }
        self.books.credit(
            name,
            &coins,
            Line {
                account: name,
                direction: "funded",
                txid: Some(ans.txid),
                counterparty: "faucet".into(),
                amount_cents,
                route: "faucet",
            },
        )?;
        self.view(&rec)
    }

    /// Credits outputs that pay this provider's accounts, each after the ledger says it is
    /// unspent. Replays change nothing. `peer`: the configured peer that called (see
    /// [`Psp::authenticate_peer`]).
    pub async fn receive(
        self: &Arc<Self>,
        req: Receive,
        peer: &str,
    ) -> Result<ReceiveAnswer, PspError> {
        if req.outputs.len() > MAX_RECEIVE {
            return Err(PspError::BadRequest(format!(
                "at most {MAX_RECEIVE} outputs per call"
            )));
        }
        // The sender's label only as the authenticated peer's: `someone@PEER`.
        let suffix = format!("@{peer}");
        let from = req
            .from
            .as_deref()
            .map(|s| s.chars().take(120).collect::<String>())
            .filter(|s| s.ends_with(&suffix))
            .unwrap_or_else(|| format!("someone{suffix}"));
        // Decode everything first: one malformed output refuses the whole call.
        let utxos = req
            .outputs
            .iter()
            .enumerate()
            .map(|(i, h)| {
                hex::decode(h)
                    .ok()
                    .and_then(|b| Utxo::decode(&b).ok())
                    .ok_or_else(|| PspError::BadRequest(format!("output {i} is not a UTXO")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Keys handed over (Filia's ⑦): each names one output of this call, once.
        if req.handover.len() > utxos.len() {
            return Err(PspError::BadRequest(
                "more keys handed over than outputs".into(),
            ));
        }
        for (i, h) in req.handover.iter().enumerate() {
            if !utxos.iter().any(|u| hex::encode(u.id()) == h.id)
                || req.handover[..i].iter().any(|o| o.id == h.id)
            {
                return Err(PspError::BadRequest(format!(
                    "handover {i} names no output of this call, or one named before"
                )));
            }
        }
        let mut results = Vec::with_capacity(utxos.len());
        let mut asked = std::collections::HashSet::new();
        for u in utxos {
            let id = u.id();
            if !asked.insert(id) {
                return Err(PspError::BadRequest(format!(
                    "output {} is listed twice",
                    hex::encode(id)
                )));
            }
            // A joint key `R1 + R2` is one of ours with its `r2` (if it makes the key); it is
            // registered with the credit, once the ledger says the output is unspent.
            let mut joint = None;
            if let Some(h) = req.handover.iter().find(|h| h.id == hex::encode(id)) {
                if self.books.owner(&u.encumbrance)?.is_none() {
                    joint = self.handover_key(h, &u)?;
                }
            }
            let owner = match &joint {
                Some((a, _)) => Some(a.clone()),
                None => self.books.owner(&u.encumbrance)?,
            };
            let Some(account) = owner else {
                results.push(Received {
                    id: hex::encode(id),
                    account: None,
                    outcome: "not_ours".into(),
                });
                continue;
            };
            // Under the account's lock: a payment cannot spend the coin between the ledger
            // check and the credit.
            let lock = self.lock_of(&account);
            let _g = lock.lock().await;
            let outcome = if self.books.seen(&id)? {
                "known"
            } else if !self.is_unspent(&id).await? {
                "not_unspent"
            } else {
                let fresh = self.books.credit_note(
                    &account,
                    std::slice::from_ref(&u),
                    joint.as_ref().map(|(_, t)| &**t),
                    Line {
                        account: &account,
                        direction: "in",
                        txid: None,
                        counterparty: from.clone(),
                        amount_cents: u.value,
                        route: "cross_provider",
                    },
                )?;
                if fresh.first().copied().unwrap_or(false) {
                    "credited"
                } else {
                    "known"
                }
            };
            results.push(Received {
                id: hex::encode(id),
                account: Some(account),
                outcome: outcome.into(),
            });
        }
        let signed = Some(super::proof::ReceiptAck::sign(
            &self.cfg.peer_key,
            &self.cfg.name,
            super::store::now(),
            &results,
        ));
        Ok(ReceiveAnswer { results, signed })
    }
}

//! Accounts: opening them (distributed key generation) and reading them.

use std::sync::Arc;

use florin_ledger::Encumbrance;

use super::api::{AccountView, HistoryEntry, PayeeView, PspInfo};
use super::store::AccountRecord;
use super::{blocking_err, valid_account, Psp, PspError, PspScheme};
use crate::custody::KmnError;

impl Psp {
    /// Provider facts.
    pub fn info(&self) -> Result<PspInfo, PspError> {
        Ok(PspInfo {
            name: self.cfg.name.clone(),
            scheme: self.cfg.scheme.name().into(),
            t: self.kmn.t(),
            n: self.kmn.n(),
            ledger: self.cfg.ledger.clone(),
            accounts: self.books.accounts()?.len(),
            unresolved: self.books.pending(None)?.len(),
            unnotified: self.books.notices()?.len(),
            peer_key: self.cfg.peer_key.public_key().to_address(),
            peers: self.peers().into_iter().map(|p| p.id).collect(),
        })
    }

    /// Opens an account for the customer key `customer`: the account's key is made by
    /// distributed key generation in the network, which binds it to `customer` first (the
    /// nodes then sign with it only what `customer` authorized).
    pub async fn open_account(
        self: &Arc<Self>,
        name: &str,
        customer: &florin_crypto::PublicKey,
    ) -> Result<AccountView, PspError> {
        if !valid_account(name) {
            return Err(PspError::BadRequest(format!(
                "account name {name:?}: 1–48 of a-z 0-9 - _"
            )));
        }
        let lock = self.lock_of(name);
        let _g = lock.lock().await;
        if self.books.account(name)?.is_some() {
            return Err(PspError::Exists(format!("account {name:?} exists")));
        }
        // A key made ahead, when the pool has one; else one made now under the account's name.
        let pooled = self.reserved_key(name).or_else(|| self.take_pooled());
        let key_id = pooled.clone().unwrap_or_else(|| format!("acct-{name}"));
        let me = self.clone();
        let kid = key_id.clone();
        let cust = *customer;
        let name2 = name.to_string();
        let (public_key, enc) = tokio::task::spawn_blocking(move || -> Result<_, PspError> {
            if pooled.is_some() {
                // Bound while it is pending (it signed nothing yet), then committed; both steps
                // are safe to repeat, so a node that could not be reached gets two more chances.
                let claim = || -> Result<_, KmnError> {
                    me.kmn.bind_customer(&kid, &cust)?;
                    let held = me.kmn.commit_pending(&kid)?;
                    florin_custody::ecdsa::identity_public_key(&held.public)
                        .and_then(|pk| florin_crypto::p256::P256PublicKey::from_sec1(&pk).ok())
                        .filter(|_| held.ecdsa)
                        .ok_or_else(|| {
                            KmnError::Protocol(florin_custody::CustodyError::malformed(
                                "a pooled key's public key",
                            ))
                        })
                };
                let mut attempt = 0;
                let pk = loop {
                    attempt += 1;
                    match claim() {
                        Ok(pk) => break pk,
                        Err(KmnError::Unavailable(_)) if attempt < 3 => {
                            std::thread::sleep(std::time::Duration::from_millis(2_500))
                        }
                        Err(e) => {
                            // Nodes out of reach: the key may be bound to this customer at
                            // some of them already, so it stays reserved for this account's
                            // retry. A refusal (another customer's binding) drops it.
                            if matches!(e, KmnError::Unavailable(_)) {
                                me.reserve_key(&name2, &kid);
                            }
                            return Err(PspError::from(e));
                        }
                    }
                };
                return Ok((hex::encode(pk.0), Encumbrance::p256(&pk)));
            }
            let make = || -> Result<_, KmnError> {
                // Bound before the key exists; a key made before a crash keeps its binding (the
                // nodes refuse another customer for it).
                me.kmn.bind_customer(&kid, &cust)?;
                // A key made before a crash (the account was never stored) is adopted, its
                // commit round finished if the crash cut it short. A key that not every node
                // holds is made again (which replaces its pending shares).
                let held = me
                    .kmn
                    .commit_pending(&kid)
                    .ok()
                    .filter(|h| h.ecdsa == (me.cfg.scheme == PspScheme::P256));
                match me.cfg.scheme {
                    PspScheme::P256 => {
                        let adopted = held.and_then(|h| {
                            florin_custody::ecdsa::identity_public_key(&h.public).and_then(|pk| {
                                florin_crypto::p256::P256PublicKey::from_sec1(&pk).ok()
                            })
                        });
                        let pk = match adopted {
                            Some(pk) => pk,
                            None => me.kmn.ecdsa_keygen_with(&kid, me.cfg.ecdsa_engine)?,
                        };
                        Ok((hex::encode(pk.0), Encumbrance::p256(&pk)))
                    }
                    PspScheme::Ed25519 => {
                        let adopted = held.and_then(|h| {
                            florin_custody::frost::GroupKey::from_bytes(&h.public).ok()
                        });
                        let g = match adopted {
                            Some(g) => g,
                            None => me.kmn.dkg(&kid)?,
                        };
                        let pk = g.public_key();
                        Ok((hex::encode(pk.0), Encumbrance::ed25519(&pk)))
                    }
                }
            };
            // Every step is safe to repeat (the binding is idempotent, a key made before is
            // adopted or made again): a node that could not be reached (starting, busy,
            // restarting) is given two more chances before the customer is told 503.
            let mut attempt = 0;
            loop {
                attempt += 1;
                match make() {
                    Err(KmnError::Unavailable(_)) if attempt < 3 => {
                        std::thread::sleep(std::time::Duration::from_millis(2_500))
                    }
                    r => return r.map_err(PspError::from),
                }
            }
        })
        .await
        .map_err(blocking_err)??;
        let rec = AccountRecord {
            name: name.into(),
            key_id,
            scheme: self.cfg.scheme.name().into(),
            public_key,
            encumbrance: enc.to_text(),
            customer: Some(customer.to_address()),
            engine: (self.cfg.scheme == super::PspScheme::P256)
                .then(|| self.cfg.ecdsa_engine.name().to_string()),
        };
        if !self.books.add_account(&rec)? {
            return Err(PspError::Exists(format!("account {name:?} exists")));
        }
        // Start the presignature pool now, so the first payment is fast.
        let _ = self.signer(&rec).await;
        self.view(&rec)
    }

    pub(super) fn view(&self, rec: &AccountRecord) -> Result<AccountView, PspError> {
        let coins = self.books.coins(&rec.name)?;
        let ready = self
            .signers
            .lock()
            .ok()
            .and_then(|m| m.get(&rec.name).and_then(|s| s.ready()));
        Ok(AccountView {
            name: rec.name.clone(),
            scheme: rec.scheme.clone(),
            public_key: rec.public_key.clone(),
            encumbrance: rec.encumbrance.clone(),
            balance_cents: coins.iter().map(|u| u.value).sum(),
            coins: coins.len(),
            unresolved: self.books.pending(Some(&rec.name))?.len(),
            presignatures_ready: ready,
            customer_key: rec.customer.clone(),
        })
    }

    /// One account.
    pub fn account(&self, name: &str) -> Result<AccountView, PspError> {
        self.view(&self.record(name)?)
    }

    /// Where to pay account `name` here, or at the configured peer `peer`.
    pub async fn payee(&self, name: &str, peer: Option<&str>) -> Result<PayeeView, PspError> {
        if let Some(peer) = peer {
            let p = self.peer(peer)?;
            if !valid_account(name) {
                return Err(PspError::BadRequest(format!(
                    "{name:?} is not an account name"
                )));
            }
            return self.peer_payee(&p, name).await;
        }
        let rec = self.record(name)?;
        let offer = super::proof::PayeeOffer::sign(
            &self.cfg.peer_key,
            &self.cfg.name,
            &rec.name,
            &rec.encumbrance,
            super::store::now(),
        );
        Ok(PayeeView {
            name: rec.name,
            scheme: rec.scheme,
            encumbrance: rec.encumbrance,
            offer: Some(offer),
        })
    }

    /// The proof of account `name`'s cross-provider payment `txid` (hex) (see
    /// [`super::proof`]). `NotFound` for another account's payment, one
    /// that is not cross-provider, or one not settled yet.
    pub fn proof(&self, name: &str, txid: &str) -> Result<super::proof::TransferProof, PspError> {
        let rec = self.record(name)?;
        let id: [u8; 32] = hex::decode(txid)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| PspError::BadRequest("a txid is 64 hex digits".into()))?;
        let none = || {
            PspError::NotFound(format!(
                "no proof of a cross-provider payment {txid} from {name} (a payment within this \
                 provider or to a ledger encumbrance has none; an unsettled one has none yet)"
            ))
        };
        let proof = self.books.proof(&id)?.ok_or_else(none)?;
        if proof.payer != format!("{}@{}", rec.name, self.cfg.name) {
            return Err(none());
        }
        // Handed out as stored: the reader checks it (a part that does not hold is the
        // reader's to see, not a reason to withhold the rest).
        Ok(proof)
    }

    /// Every account.
    pub fn accounts(&self) -> Result<Vec<AccountView>, PspError> {
        self.books
            .accounts()?
            .iter()
            .map(|r| self.view(r))
            .collect()
    }

    /// An account's last `limit` history lines.
    pub fn history(&self, name: &str, limit: usize) -> Result<Vec<HistoryEntry>, PspError> {
        self.record(name)?;
        self.books.history(name, limit)
    }
}

//! A payment service provider (PSP): custodial wallets whose keys live as t-of-n shares in the
//! provider's key-management network, paying on the ledger like any other wallet (the source
//! document's UC1 and UC2).
//!
//! - **Accounts.** Opening an account makes its key by distributed key generation in the
//!   provider's network: threshold ECDSA P-256 (CGGMP24, ledger scheme 2; the default, as the
//!   document's smart cards need) or FROST Ed25519. No machine, the provider's included, ever
//!   holds a customer's whole key; the ledger cannot tell these outputs from any others.
//! - **Same provider (UC1).** The provider builds the transfer, has the network sign it, sends
//!   it to the ledger and, once confirmed, credits the payee's account.
//! - **Across providers (UC2).** The payer's provider asks the payee's provider for the
//!   payee's encumbrance, pays it on the ledger, then hands the payee's provider the new output
//!   (`POST /v1/psp/receive`). The payee's provider credits it only after the ledger says it is
//!   unspent, so providers need not trust each other; an acknowledgement that fails is retried
//!   in the background (the money is the payee's on the ledger either way).
//! - **Crash safety.** See [`store`]: a payment is pending before it reaches the ledger and is
//!   resolved by resending the same signed transaction.

pub mod api;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_crypto::p256::P256Signer;
use florin_crypto::{Digest, Signer};
use florin_ledger::build;
use florin_ledger::{Encumbrance, Output, Transaction, Transfer, Utxo, Witness};
use thiserror::Error;

use crate::api::{LedgerFaucet, LedgerFaucetAnswer};
use crate::custody::{EcdsaSigner, Kmn, KmnError, ThresholdSigner};
use crate::ledger::TxStatus;
use api::{
    AccountView, HistoryEntry, PayReceipt, PayRequest, PspInfo, Receive, ReceiveAnswer, Received,
};
use store::{AccountRecord, Books, Line, PendingPayment, Settled};

/// Most outputs in one `receive`.
pub const MAX_RECEIVE: usize = 256;

/// What a provider asks of others: the ledger, and payees' providers. The service holds one
/// and never sees the wire; `florin-http` implements it over HTTP/JSON. The ledger and each
/// provider are named by their API's base URL.
///
/// Errors: `Unreachable` when the other side cannot be reached or its answer cannot be read
/// (the outcome is unknown), `Refused` when it refused the request, and `NotFound` when a
/// payee's provider has no such account.
#[async_trait::async_trait]
pub trait PspLinks: Send + Sync {
    /// Submits a transaction to the ledger at `ledger`; its status there.
    async fn submit(&self, ledger: &str, tx: &Transaction) -> Result<TxStatus, PspError>;
    /// Whether the output with UHS id `id` is unspent on the ledger at `ledger`.
    async fn is_unspent(&self, ledger: &str, id: &[u8; 32]) -> Result<bool, PspError>;
    /// The ledger's faucet (devnet): mints to an encumbrance.
    async fn faucet(
        &self,
        ledger: &str,
        req: &LedgerFaucet,
    ) -> Result<LedgerFaucetAnswer, PspError>;
    /// An account at the provider `psp` (a payee's).
    async fn peer_account(&self, psp: &str, name: &str) -> Result<AccountView, PspError>;
    /// Hands the provider `psp` outputs that pay its accounts.
    async fn peer_receive(&self, psp: &str, req: &Receive) -> Result<ReceiveAnswer, PspError>;
}

/// Why a provider call failed. Each maps to one HTTP status and a stable code.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PspError {
    /// Malformed or impossible request (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such account (404).
    #[error("{0}")]
    NotFound(String),
    /// The account name is taken (409).
    #[error("{0}")]
    Exists(String),
    /// The account holds less than asked (409).
    #[error("insufficient funds: {account} holds {balance_cents} cents, {asked_cents} asked")]
    InsufficientFunds {
        /// The account.
        account: String,
        /// Its balance.
        balance_cents: u64,
        /// The payment.
        asked_cents: u64,
    },
    /// The ledger or the payee's provider refused (422); nothing was paid.
    #[error("{0}")]
    Refused(String),
    /// The key-management network could not sign or make a key (503).
    #[error("custody: {0}")]
    Custody(String),
    /// The ledger or another provider could not be reached (502).
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// A payment from this account was sent but its outcome is not known yet (503); it is
    /// resolved in the background, and the account pays again once it is.
    #[error("unresolved: {0}")]
    Unresolved(String),
    /// The books failed (500).
    #[error("storage: {0}")]
    Storage(String),
}

impl PspError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) => "not_found",
            Self::Exists(_) => "exists",
            Self::InsufficientFunds { .. } => "insufficient_funds",
            Self::Refused(_) => "refused",
            Self::Custody(_) => "custody",
            Self::Unreachable(_) => "unreachable",
            Self::Unresolved(_) => "unresolved",
            Self::Storage(_) => "storage",
        }
    }
}

crate::error::storage_from!(PspError);

impl From<KmnError> for PspError {
    fn from(e: KmnError) -> Self {
        PspError::Custody(e.to_string())
    }
}

/// The customers' key scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PspScheme {
    /// Threshold ECDSA P-256 (CGGMP24), ledger scheme 2.
    P256,
    /// FROST Ed25519, ledger scheme 1.
    Ed25519,
}

impl PspScheme {
    /// Parses `p256` / `ed25519`.
    pub fn parse(s: &str) -> Option<PspScheme> {
        match s {
            "p256" => Some(PspScheme::P256),
            "ed25519" => Some(PspScheme::Ed25519),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            PspScheme::P256 => "p256",
            PspScheme::Ed25519 => "ed25519",
        }
    }
}

/// How a provider runs.
#[derive(Debug, Clone)]
pub struct PspConfig {
    /// The provider's name (shown to other providers' customers).
    pub name: String,
    /// The books' file.
    pub books: PathBuf,
    /// The ledger's API URL.
    pub ledger: String,
    /// Customers' key scheme.
    pub scheme: PspScheme,
    /// P-256 accounts: presignatures kept ready per account (0: sign interactively).
    pub presign_pool: usize,
}

/// Checks that a payee's encumbrance can be spent by someone before money is signed over to
/// it: an Ed25519 key must be a canonical curve point not of small order (anything else burns
/// the money). A P-256 encumbrance is a key's hash, which cannot be checked; an unknown scheme
/// is refused.
pub fn check_payee(enc: &Encumbrance) -> Result<(), String> {
    match enc.scheme {
        florin_ledger::tx::SCHEME_ED25519 => florin_crypto::PublicKey(enc.key)
            .validate()
            .map_err(|e| e.to_string()),
        florin_ledger::tx::SCHEME_P256 => Ok(()),
        s => Err(format!("unknown key scheme {s}")),
    }
}

/// Account names: short, and safe as key names in the network.
pub fn valid_account(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// An account's signer.
enum KeySigner {
    P256(EcdsaSigner),
    Ed25519(Box<ThresholdSigner>),
}

impl KeySigner {
    /// One witness per input (the signature is over the txid, the same for every input).
    fn witnesses(&self, txid: &Digest, inputs: usize) -> Result<Vec<Witness>, PspError> {
        let w = match self {
            KeySigner::P256(s) => Witness::p256(
                P256Signer::public_key(s),
                s.sign_msg(txid).map_err(PspError::from)?,
            ),
            KeySigner::Ed25519(s) => Witness::ed25519(
                Signer::public_key(s.as_ref()),
                s.sign_msg(txid).map_err(PspError::from)?,
            ),
        };
        Ok(vec![w; inputs])
    }

    fn ready(&self) -> Option<usize> {
        match self {
            KeySigner::P256(s) => Some(s.ready()),
            KeySigner::Ed25519(_) => None,
        }
    }
}

/// A payment service provider.
pub struct Psp {
    cfg: PspConfig,
    kmn: Arc<Kmn>,
    books: Books,
    links: Arc<dyn PspLinks>,
    signers: Mutex<HashMap<String, Arc<KeySigner>>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn blocking_err(e: tokio::task::JoinError) -> PspError {
    PspError::Storage(format!("worker failed: {e}"))
}

impl Psp {
    /// Opens the provider's books; `kmn` is its key-management network (for P-256 accounts,
    /// with its ECDSA auxiliary information made), `links` how it reaches the ledger and other
    /// providers.
    pub fn open(
        cfg: PspConfig,
        kmn: Arc<Kmn>,
        links: Arc<dyn PspLinks>,
    ) -> Result<Arc<Psp>, PspError> {
        if !valid_account(&cfg.name) {
            return Err(PspError::BadRequest(format!(
                "provider name {:?}: 1–48 of a-z 0-9 - _",
                cfg.name
            )));
        }
        let books = Books::open(&cfg.books)?;
        Ok(Arc::new(Psp {
            cfg,
            kmn,
            books,
            links,
            signers: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &PspConfig {
        &self.cfg
    }

    fn lock_of(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut l = match self.locks.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        l.entry(name.to_string()).or_default().clone()
    }

    fn record(&self, name: &str) -> Result<AccountRecord, PspError> {
        self.books
            .account(name)?
            .ok_or_else(|| PspError::NotFound(format!("no account {name:?} at {}", self.cfg.name)))
    }

    /// The signer of an account (made on first use; for P-256 it starts the account's
    /// presignature refill).
    async fn signer(self: &Arc<Self>, rec: &AccountRecord) -> Result<Arc<KeySigner>, PspError> {
        if let Some(s) = self
            .signers
            .lock()
            .ok()
            .and_then(|m| m.get(&rec.name).cloned())
        {
            return Ok(s);
        }
        let me = self.clone();
        let rec2 = rec.clone();
        let s = tokio::task::spawn_blocking(move || -> Result<KeySigner, PspError> {
            Ok(match rec2.scheme.as_str() {
                "p256" => KeySigner::P256(me.kmn.ecdsa_signer(&rec2.key_id, me.cfg.presign_pool)?),
                _ => KeySigner::Ed25519(Box::new(me.kmn.signer(&rec2.key_id)?)),
            })
        })
        .await
        .map_err(blocking_err)??;
        let s = Arc::new(s);
        if let Ok(mut m) = self.signers.lock() {
            return Ok(m.entry(rec.name.clone()).or_insert(s).clone());
        }
        Ok(s)
    }

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
        })
    }

    /// Opens an account: its key is made by distributed key generation in the network.
    pub async fn open_account(self: &Arc<Self>, name: &str) -> Result<AccountView, PspError> {
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
        let key_id = format!("acct-{name}");
        let me = self.clone();
        let kid = key_id.clone();
        let (public_key, enc) = tokio::task::spawn_blocking(move || -> Result<_, PspError> {
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
                        florin_custody::ecdsa::identity_public_key(&h.public)
                            .and_then(|pk| florin_crypto::p256::P256PublicKey::from_sec1(&pk).ok())
                    });
                    let pk = match adopted {
                        Some(pk) => pk,
                        None => me.kmn.ecdsa_keygen(&kid)?,
                    };
                    Ok((hex::encode(pk.0), Encumbrance::p256(&pk)))
                }
                PspScheme::Ed25519 => {
                    let adopted = held
                        .and_then(|h| florin_custody::frost::GroupKey::from_bytes(&h.public).ok());
                    let g = match adopted {
                        Some(g) => g,
                        None => me.kmn.dkg(&kid)?,
                    };
                    let pk = g.public_key();
                    Ok((hex::encode(pk.0), Encumbrance::ed25519(&pk)))
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
        };
        if !self.books.add_account(&rec)? {
            return Err(PspError::Exists(format!("account {name:?} exists")));
        }
        // Start the presignature pool now, so the first payment is fast.
        let _ = self.signer(&rec).await;
        self.view(&rec)
    }

    fn view(&self, rec: &AccountRecord) -> Result<AccountView, PspError> {
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
        })
    }

    /// One account.
    pub fn account(&self, name: &str) -> Result<AccountView, PspError> {
        self.view(&self.record(name)?)
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

    // -- the ledger and other providers ------------------------------------------------------

    async fn submit(&self, tx: &Transaction) -> Result<TxStatus, PspError> {
        self.links.submit(&self.cfg.ledger, tx).await
    }

    async fn is_unspent(&self, id: &[u8; 32]) -> Result<bool, PspError> {
        self.links.is_unspent(&self.cfg.ledger, id).await
    }

    async fn peer_account(&self, psp: &str, name: &str) -> Result<AccountView, PspError> {
        self.links.peer_account(psp, name).await
    }

    // -- money -------------------------------------------------------------------------------

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
    /// unspent. Replays change nothing.
    pub async fn receive(self: &Arc<Self>, req: Receive) -> Result<ReceiveAnswer, PspError> {
        if req.outputs.len() > MAX_RECEIVE {
            return Err(PspError::BadRequest(format!(
                "at most {MAX_RECEIVE} outputs per call"
            )));
        }
        let from = req
            .from
            .as_deref()
            .map(|s| s.chars().take(120).collect::<String>())
            .unwrap_or_else(|| "unknown sender".into());
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
            let Some(account) = self.books.owner(&u.encumbrance)? else {
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
                let fresh = self.books.credit(
                    &account,
                    std::slice::from_ref(&u),
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
        Ok(ReceiveAnswer { results })
    }

    /// Resolves `from`'s pending payments (the caller holds the account's lock) by sending
    /// each signed transaction again: confirmed ones are applied, refused ones dropped.
    /// Returns how many remain unresolved.
    async fn resolve(&self, from: Option<&str>) -> Result<usize, PspError> {
        let mut left = 0;
        for (txid, p) in self.books.pending(from)? {
            let t = p.transfer()?;
            match self.submit(&Transaction::Transfer(t.clone())).await {
                Ok(TxStatus::Confirmed) => self.books.apply(&txid, &p)?,
                Ok(TxStatus::StaticInvalid(_) | TxStatus::StateInvalid(_)) => {
                    self.drop_refused(Some(&txid), &p.from, &t.inputs).await?;
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
                    eprintln!("psp: resolving {a}'s payments: {e}");
                    left += 1;
                }
            }
        }
        Ok(left)
    }

    /// A refused payment: asks the ledger which of its inputs are gone, then drops the
    /// pending record and those coins in one write (if the ledger cannot be asked, nothing
    /// changes and the payment is tried again).
    async fn drop_refused(
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
        for (txid, n) in self.books.notices()? {
            match self.notify(&n).await {
                Ok(()) => self.books.drop_notice(&txid)?,
                // A refusal is final: asking again will not change the answer. The money is
                // the payee's on the ledger; its provider can still be handed the output.
                Err(
                    e @ (PspError::Refused(_) | PspError::NotFound(_) | PspError::BadRequest(_)),
                ) => {
                    eprintln!(
                        "psp: {} refused payment {} ({e}); not asking again",
                        n.psp,
                        hex::encode(txid)
                    );
                    self.books.drop_notice(&txid)?;
                }
                Err(_) => left += 1,
            }
        }
        Ok(left)
    }

    async fn notify(&self, n: &store::Notice) -> Result<(), PspError> {
        let ans = self
            .links
            .peer_receive(
                &n.psp,
                &Receive {
                    outputs: vec![n.output.clone()],
                    from: Some(format!("{}@{}", n.from, self.cfg.name)),
                },
            )
            .await?;
        match ans.results.first().map(|r| r.outcome.as_str()) {
            Some("credited") | Some("known") => Ok(()),
            other => Err(PspError::Refused(format!(
                "the payee's provider answered {other:?}"
            ))),
        }
    }

    /// Pays: same provider (UC1), another provider's customer (UC2) or any ledger
    /// encumbrance.
    pub async fn pay(self: &Arc<Self>, req: PayRequest) -> Result<PayReceipt, PspError> {
        let start = Instant::now();
        if req.amount_cents == 0 {
            return Err(PspError::BadRequest("amount must be positive".into()));
        }
        let rec = self.record(&req.from)?;
        if let Some(id) = &req.id {
            if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(PspError::BadRequest(
                    "a payment id is 1–64 printable ASCII characters".into(),
                ));
            }
            if let Some(done) = self.repeated(&rec.name, id).await? {
                return Ok(done);
            }
        }
        if let Some(psp) = &req.to_psp {
            match url::Url::parse(psp) {
                Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.has_host() => {}
                _ => {
                    return Err(PspError::BadRequest(format!(
                        "to_psp {psp:?} is not an http(s) URL"
                    )))
                }
            }
        }
        // Where the money goes.
        let (payee_enc, payee_account, payee_psp, route, counterparty) = match &req.to_psp {
            Some(psp) => {
                if !valid_account(&req.to) {
                    return Err(PspError::BadRequest(format!(
                        "payee {:?} is not an account name",
                        req.to
                    )));
                }
                let v = self.peer_account(psp, &req.to).await?;
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
                    None => (
                        enc,
                        None,
                        Some(psp.clone()),
                        "cross_provider",
                        format!("{}@{psp}", req.to),
                    ),
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
        let signer = self.signer(&rec).await?;
        let lock = self.lock_of(&rec.name);
        let guard = lock.lock().await;
        if let Some(id) = &req.id {
            // A retry that raced the first request: answer it now that the lock is ours.
            if let Some(done) = self.settled_receipt(&rec.name, id)? {
                return Ok(done);
            }
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
        let draft = build::payment(&coins, vec![pay], rec.enc()?).map_err(|e| match e {
            build::BuildError::TooManyInputs { needed, max } => PspError::Refused(format!(
                "the payment needs {needed} coins, a transaction takes at most {max}; pay less first"
            )),
            other => PspError::Refused(format!("cannot build the payment: {other}")),
        })?;
        let txid = draft.txid();
        let s0 = Instant::now();
        let sig_signer = signer.clone();
        // One signature over the txid serves every input (all are the account's key); the
        // builder checks it against each input's encumbrance.
        let t = tokio::task::spawn_blocking(move || -> Result<Transfer, PspError> {
            let w = sig_signer.witnesses(&txid, 1)?[0];
            draft
                .sign_with(|_, _| Ok(w))
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
        match &st {
            TxStatus::Confirmed => self.books.apply(&txid, &pending)?,
            TxStatus::StaticInvalid(e) | TxStatus::StateInvalid(e) => {
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
        if payee_psp.is_some() {
            if let Ok(Some(n)) = self.books.notice(&txid) {
                if self.notify(&n).await.is_ok() {
                    if let Err(e) = self.books.drop_notice(&txid) {
                        eprintln!("psp: {e}");
                    }
                    notified = true;
                }
            }
        }
        Ok(PayReceipt {
            txid: hex::encode(txid),
            route: route.into(),
            payee_output: hex::encode(outs[0].encode()),
            change_output: outs.get(1).map(|u| hex::encode(u.encode())),
            notified,
            repeated: false,
            sign_ms,
            total_ms: start.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// The receipt of an earlier payment with this client id from `from`, if it settled.
    fn settled_receipt(&self, from: &str, id: &str) -> Result<Option<PayReceipt>, PspError> {
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
    async fn repeated(&self, from: &str, id: &str) -> Result<Option<PayReceipt>, PspError> {
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

    /// Background work: resolve pending payments and send owed acknowledgements, every
    /// `every`, until the returned task is dropped or aborted.
    pub fn spawn_upkeep(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        // A weak reference: the provider closes (its books' file lock included) when the
        // server lets go of it, not when this task next wakes.
        // Resolution and acknowledgements run apart, so a slow peer provider cannot hold up
        // the resolution of payments.
        let weak = Arc::downgrade(self);
        let weak2 = weak.clone();
        tokio::spawn(async move {
            let resolving = async move {
                loop {
                    {
                        let Some(me) = weak.upgrade() else { return };
                        if let Err(e) = me.resolve_idle().await {
                            eprintln!("psp: resolving payments: {e}");
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
                            eprintln!("psp: acknowledgements: {e}");
                        }
                    }
                    tokio::time::sleep(every).await;
                }
            };
            tokio::join!(resolving, notifying);
        })
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
        sign_ms: 0.0,
        total_ms: 0.0,
    }
}

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
pub mod auth;
pub mod proof;
pub mod store;

mod accounts;
mod config;
mod error;
mod key_pool;
mod links;
mod pay;
mod receive;
mod signer;
mod transfer;
mod upkeep;

pub use config::{check_payee, valid_account, PeerPsp, PspConfig, PspScheme};
pub use error::PspError;
pub use florin_custody::authz::{AuthzError, PaymentAuth};
pub use links::PspLinks;
use signer::KeySigner;
pub use transfer::ANNOUNCE_PATH;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

use florin_ledger::Transaction;

use crate::custody::Kmn;
use crate::ledger::TxStatus;
use api::PayeeView;
use store::{AccountRecord, Books};

/// The path of `receive` (what a peer signs).
pub const RECEIVE_PATH: &str = "/v1/psp/receive";

/// Most outputs in one `receive`.
pub const MAX_RECEIVE: usize = 256;

crate::error::storage_from!(PspError);

/// A payment service provider.
pub struct Psp {
    cfg: PspConfig,
    kmn: Arc<Kmn>,
    books: Books,
    links: Arc<dyn PspLinks>,
    signers: Mutex<HashMap<String, Arc<KeySigner>>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The configured peers (replaceable while running: [`Psp::set_peers`]).
    peers: RwLock<Vec<PeerPsp>>,
    /// Request nonces seen recently.
    replay: auth::Replay,
    /// The operator keys and their credentials' nonces.
    operators: crate::operator::OperatorGate,
    /// Acknowledgements being sent now (by txid): a payment and the background upkeep never
    /// send the same one at once, and a payment's receipt says truly whether its own went.
    notifying: Arc<Mutex<HashSet<[u8; 32]>>>,
    /// P-256 keys made ahead, pending at every node (`pool-…`), oldest first.
    key_pool: Mutex<std::collections::VecDeque<String>>,
    /// Pooled keys taken by an account opening that failed half-way: account → key.
    reserved: Mutex<HashMap<String, String>>,
    /// The ledger's issuer key, once asked (its confirmations must be signed by it).
    issuer: Mutex<Option<florin_crypto::PublicKey>>,
    /// Where the background fetching of ledger confirmations goes on.
    confirm_cursor: Mutex<Option<[u8; 32]>>,
    /// Acknowledgements refused by the payee's provider that carry a hand-over: when to ask
    /// again, and how many times they were asked.
    notice_backoff: Mutex<HashMap<[u8; 32], (std::time::Instant, u32)>>,
}

/// A claim on sending one acknowledgement; let go when dropped.
pub(crate) struct NoticeClaim {
    txid: [u8; 32],
    set: Arc<Mutex<HashSet<[u8; 32]>>>,
}

impl Drop for NoticeClaim {
    fn drop(&mut self) {
        match self.set.lock() {
            Ok(mut g) => g.remove(&self.txid),
            Err(p) => p.into_inner().remove(&self.txid),
        };
    }
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
        for p in &cfg.peers {
            check_peer(p)?;
        }
        let books = Books::open(&cfg.books)?;
        let psp = Arc::new(Psp {
            peers: RwLock::new(cfg.peers.clone()),
            replay: auth::Replay::default(),
            operators: crate::operator::OperatorGate::new(cfg.operators.clone()),
            cfg,
            kmn,
            books,
            links,
            signers: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            notifying: Arc::default(),
            key_pool: Mutex::new(std::collections::VecDeque::new()),
            reserved: Mutex::new(HashMap::new()),
            issuer: Mutex::new(None),
            confirm_cursor: Mutex::new(None),
            notice_backoff: Mutex::new(HashMap::new()),
        });
        psp.spawn_key_pool();
        let weak = Arc::downgrade(&psp);
        florin_obs::metrics::global().on_scrape(move || {
            if let Some(p) = weak.upgrade() {
                florin_obs::metrics::global()
                    .custody_pool_depth
                    .get_or_create(&florin_obs::metrics::PoolLabels {
                        pool: "psp_keys".into(),
                    })
                    .set(i64::try_from(p.pool_ready()).unwrap_or(i64::MAX));
            }
        });
        Ok(psp)
    }

    /// The configuration.
    pub fn config(&self) -> &PspConfig {
        &self.cfg
    }

    /// Replaces the configured peers.
    pub fn set_peers(&self, peers: Vec<PeerPsp>) -> Result<(), PspError> {
        for p in &peers {
            check_peer(p)?;
        }
        match self.peers.write() {
            Ok(mut g) => *g = peers,
            Err(p) => *p.into_inner() = peers,
        }
        Ok(())
    }

    fn peers(&self) -> Vec<PeerPsp> {
        match self.peers.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The configured peer `to` names: by name, or by its URL exactly as configured (a
    /// trailing `/` aside). Anything else is refused before any connection is made.
    pub fn peer(&self, to: &str) -> Result<PeerPsp, PspError> {
        let url = to.trim_end_matches('/');
        self.peers()
            .into_iter()
            .find(|p| p.id == to || p.url == url)
            .ok_or_else(|| {
                PspError::BadRequest(format!(
                    "{to:?} is not a configured peer provider (by name or URL); this provider \
                     calls no other"
                ))
            })
    }

    /// Checks a customer's signed request for account `name` (401 unsigned or badly signed,
    /// 403 signed as someone else; an unknown account is 404).
    pub fn authenticate_customer(
        &self,
        name: &str,
        req: &auth::CallerRequest<'_>,
    ) -> Result<(), PspError> {
        let rec = self.record(name)?;
        let key = rec.customer_key()?;
        self.replay.check(req, auth::Caller::Account, name, &key)
    }

    /// Checks the request that opens account `name` for the customer key `customer` (the
    /// request proves the caller holds it).
    pub fn authenticate_opening(
        &self,
        name: &str,
        customer: &str,
        req: &auth::CallerRequest<'_>,
    ) -> Result<florin_crypto::PublicKey, PspError> {
        if !valid_account(name) {
            return Err(PspError::BadRequest(format!(
                "account name {name:?}: 1–48 of a-z 0-9 - _"
            )));
        }
        let key = florin_crypto::PublicKey::parse_valid(customer)
            .map_err(|e| PspError::BadRequest(format!("customer_key: {e}")))?;
        // A configured peer's id is not an account name (their requests are told apart, but
        // a customer named like a peer would confuse people reading the books).
        if self.peers().iter().any(|p| p.id == name) {
            return Err(PspError::Exists(format!(
                "{name:?} is a peer provider's name"
            )));
        }
        // An existing name is refused before anything is remembered: self-signed openings
        // of names that are taken cannot fill the nonce memory.
        if self.books.account(name)?.is_some() {
            return Err(PspError::Exists(format!("account {name:?} exists")));
        }
        self.replay.check(req, auth::Caller::Account, name, &key)?;
        Ok(key)
    }

    /// Checks an operator's credential (`Authorization: Florin-Operator …`, `header` its
    /// value) for the request `method path_and_query` with `body`: `Unauthorized` (401)
    /// without one or a malformed one, `Forbidden` (403) for a stranger's, a forged, expired
    /// or replayed one.
    pub fn authenticate_operator(
        &self,
        header: Option<&[u8]>,
        method: &str,
        path_and_query: &str,
        body: &[u8],
    ) -> Result<(), PspError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        match self
            .operators
            .check(header, method, path_and_query, body, now)
        {
            Ok(_) => Ok(()),
            Err(crate::NodeError::Unauthorized(e)) => Err(PspError::Unauthorized(e.to_string())),
            Err(e) => Err(PspError::Forbidden(e.to_string())),
        }
    }

    /// Checks a peer provider's signed request; its name.
    pub fn authenticate_peer(&self, req: &auth::CallerRequest<'_>) -> Result<String, PspError> {
        let h = req
            .header
            .ok_or_else(|| PspError::Unauthorized(format!("no {} header", auth::AUTH_HEADER)))?;
        let who = auth::SignedRequest::parse(h)?.who;
        let peer = self
            .peers()
            .into_iter()
            .find(|p| p.id == who)
            .ok_or_else(|| PspError::Forbidden(format!("{who:?} is not a configured peer")))?;
        let key = florin_crypto::PublicKey::parse(&peer.key)
            .map_err(|_| PspError::Storage(format!("peer {who}: bad key")))?;
        self.replay.check(req, auth::Caller::Peer, &who, &key)?;
        Ok(who)
    }

    /// Claims the sending of `txid`'s acknowledgement; `None` while someone else sends it.
    pub(crate) fn claim_notice(&self, txid: &[u8; 32]) -> Option<NoticeClaim> {
        let mut g = match self.notifying.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.insert(*txid).then(|| NoticeClaim {
            txid: *txid,
            set: self.notifying.clone(),
        })
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

    // -- the ledger and other providers ------------------------------------------------------

    async fn submit(&self, tx: &Transaction) -> Result<TxStatus, PspError> {
        self.links.submit(&self.cfg.ledger, tx).await
    }

    async fn is_unspent(&self, id: &[u8; 32]) -> Result<bool, PspError> {
        self.links.is_unspent(&self.cfg.ledger, id).await
    }

    async fn peer_payee(&self, psp: &PeerPsp, name: &str) -> Result<PayeeView, PspError> {
        self.links.peer_payee(&psp.url, name).await
    }

    // -- money -------------------------------------------------------------------------------
}

fn check_peer(p: &PeerPsp) -> Result<(), PspError> {
    florin_crypto::PublicKey::parse(&p.key)
        .map_err(|e| PspError::BadRequest(format!("peer {}: key: {e}", p.id)))?;
    match url::Url::parse(&p.url) {
        Ok(u) if (u.scheme() == "http" || u.scheme() == "https") && u.has_host() => Ok(()),
        _ => Err(PspError::BadRequest(format!(
            "peer {}: {:?} is not an http(s) URL",
            p.id, p.url
        ))),
    }
}

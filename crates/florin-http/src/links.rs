//! The reqwest side: how a provider reaches the ledger and other providers over HTTP/JSON
//! ([`PspLinks`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use florin_ledger::Transaction;
use florin_node::api::{LedgerFaucet, LedgerFaucetAnswer, LedgerTxStatus, SubmitTx, Unspent};
use florin_node::psp::api::{PayeeView, ReceiveAnswer};
use florin_node::psp::{PspError, PspLinks};
use florin_node::TxStatus;

use crate::tls::ClientTls;

/// [`PspLinks`] over HTTP/JSON: the node's ledger API and other providers' APIs.
#[derive(Debug, Clone)]
pub struct HttpLinks {
    http: reqwest::Client,
    /// Per ledger as configured (its comma-separated URLs): the index of the URL that last
    /// answered, where the next call starts (a dead first URL costs one connect timeout, not
    /// one per call). Shared by clones.
    preferred: Arc<Mutex<HashMap<String, usize>>>,
}

/// Most ledgers whose preferred URL is remembered (a provider is configured with one).
const PREFERRED_LEDGERS: usize = 64;

impl HttpLinks {
    /// A client with the provider's timeouts (connect 5 s, whole call 60 s), trusting the
    /// system's roots only.
    pub fn new() -> Result<HttpLinks, PspError> {
        Self::with_tls(&ClientTls::system())
    }

    /// [`HttpLinks::new`] trusting what `tls` trusts (the ledger's and peers' CAs).
    pub fn with_tls(tls: &ClientTls) -> Result<HttpLinks, PspError> {
        let http = tls
            .reqwest_builder()
            .map_err(|e| PspError::Storage(format!("HTTP client: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| PspError::Storage(format!("HTTP client: {e}")))?;
        Ok(HttpLinks {
            http,
            preferred: Arc::default(),
        })
    }

    fn preferred(&self, ledger: &str) -> usize {
        self.preferred
            .lock()
            .map(|p| p.get(ledger).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    fn prefer(&self, ledger: &str, index: usize) {
        if let Ok(mut p) = self.preferred.lock() {
            if p.len() >= PREFERRED_LEDGERS && !p.contains_key(ledger) {
                p.clear();
            }
            p.insert(ledger.to_string(), index);
        }
    }

    /// One JSON call. A 404 is `NotFound` only from another provider (its account is
    /// missing); from the ledger it means the ledger is not what was configured.
    async fn call<T: for<'de> serde::Deserialize<'de>>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, PspError> {
        let resp = crate::observe::with_request_id(req)
            .send()
            .await
            .map_err(|e| PspError::Unreachable(format!("{what}: {e}")))?;
        Self::answer(resp, what).await
    }

    /// A call to the ledger, which may be given as several URLs (a cluster's sentinels,
    /// comma-separated): one that cannot be reached is passed over for the next when that is
    /// safe — always when no connection was made (nothing reached the node), and for a read
    /// (`read`) also when the answer broke off. A submission whose answer broke off is
    /// reported, and the provider reconciles by txid as after any lost answer. Calls start at
    /// the URL that last answered without a server error, and go round the list from there.
    async fn ledger_call<T: for<'de> serde::Deserialize<'de>>(
        &self,
        ledger: &str,
        what: &str,
        read: bool,
        req: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<T, PspError> {
        let bases: Vec<&str> = ledger
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .collect();
        let n = bases.len();
        let first = self.preferred(ledger) % n.max(1);
        let mut last = None;
        for k in 0..n {
            let i = (first + k) % n;
            let base = bases[i];
            let more = k + 1 < n;
            match crate::observe::with_request_id(req(base)).send().await {
                Err(e) if more && (e.is_connect() || read) => {
                    last = Some(PspError::Unreachable(format!("{what} at {base}: {e}")));
                }
                Err(e) => return Err(PspError::Unreachable(format!("{what} at {base}: {e}"))),
                Ok(resp) => {
                    if !resp.status().is_server_error() {
                        self.prefer(ledger, i);
                    }
                    return Self::answer(resp, what).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| PspError::Unreachable(format!("{what}: no URL given"))))
    }

    /// The answer to one call (see [`HttpLinks::call`]).
    async fn answer<T: for<'de> serde::Deserialize<'de>>(
        resp: reqwest::Response,
        what: &str,
    ) -> Result<T, PspError> {
        let peer = what.contains("provider");
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| PspError::Unreachable(format!("{what}: {e}")))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| PspError::Unreachable(format!("{what}: unreadable answer: {e}")));
        }
        let (_code, msg) = crate::client::refusal(status, &bytes);
        // Asked to slow down: not an answer about the request itself.
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::REQUEST_TIMEOUT
        {
            return Err(PspError::Unreachable(format!("{what} ({status}): {msg}")));
        }
        if status.is_client_error() {
            if status == reqwest::StatusCode::NOT_FOUND {
                return Err(if peer {
                    PspError::NotFound(format!("{what}: {msg}"))
                } else {
                    PspError::Unreachable(format!("{what} (404): {msg}"))
                });
            }
            Err(PspError::Refused(format!(
                "{what} refused ({status}): {msg}"
            )))
        } else {
            Err(PspError::Unreachable(format!("{what} ({status}): {msg}")))
        }
    }
}

fn url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

#[async_trait::async_trait]
impl PspLinks for HttpLinks {
    async fn submit(&self, ledger: &str, tx: &Transaction) -> Result<TxStatus, PspError> {
        let body = SubmitTx {
            tx: hex::encode(tx.encode()),
        };
        let ans: LedgerTxStatus = self
            .ledger_call(ledger, "the ledger", false, |base| {
                self.http
                    .post(url(base, "/v1/ledger/transactions"))
                    .json(&body)
            })
            .await?;
        ans.to_status().ok_or_else(|| {
            PspError::Unreachable(format!(
                "the ledger: unknown transaction status {:?}",
                ans.status
            ))
        })
    }

    async fn is_unspent(&self, ledger: &str, id: &[u8; 32]) -> Result<bool, PspError> {
        let path = format!("/v1/ledger/unspent/{}", hex::encode(id));
        let u: Unspent = self
            .ledger_call(ledger, "the ledger", true, |base| {
                self.http.get(url(base, &path))
            })
            .await?;
        Ok(u.unspent)
    }

    async fn confirmation(
        &self,
        ledger: &str,
        txid: &[u8; 32],
    ) -> Result<florin_node::api::LedgerConfirmation, PspError> {
        let path = format!("/v1/ledger/transactions/{}/confirmation", hex::encode(txid));
        self.ledger_call(ledger, "the ledger", true, |base| {
            self.http.get(url(base, &path))
        })
        .await
    }

    async fn ledger_issuer(&self, ledger: &str) -> Result<florin_crypto::PublicKey, PspError> {
        let info: florin_node::api::Info = self
            .ledger_call(ledger, "the ledger", true, |base| {
                self.http.get(url(base, "/v1/info"))
            })
            .await?;
        let k = info
            .issuer
            .ok_or_else(|| PspError::Unreachable("the ledger names no issuer key".into()))?;
        florin_crypto::PublicKey::parse(&k)
            .map_err(|e| PspError::Unreachable(format!("the ledger's issuer key: {e}")))
    }

    async fn faucet(
        &self,
        ledger: &str,
        req: &LedgerFaucet,
    ) -> Result<LedgerFaucetAnswer, PspError> {
        self.ledger_call(ledger, "the ledger's faucet", false, |base| {
            self.http.post(url(base, "/v1/ledger/faucet")).json(req)
        })
        .await
    }

    async fn peer_payee(&self, psp: &str, name: &str) -> Result<PayeeView, PspError> {
        self.call(
            self.http.get(url(psp, &format!("/v1/psp/payees/{name}"))),
            "the payee's provider",
        )
        .await
    }

    async fn peer_announce(
        &self,
        psp: &str,
        body: Vec<u8>,
        auth: String,
    ) -> Result<florin_node::psp::proof::PayeeOffer, PspError> {
        self.call(
            self.http
                .post(url(psp, florin_node::psp::ANNOUNCE_PATH))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(florin_node::psp::auth::AUTH_HEADER, auth)
                .body(body),
            "the payee's provider",
        )
        .await
    }

    async fn peer_receive(
        &self,
        psp: &str,
        body: Vec<u8>,
        auth: String,
    ) -> Result<ReceiveAnswer, PspError> {
        self.call(
            self.http
                .post(url(psp, florin_node::psp::RECEIVE_PATH))
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(florin_node::psp::auth::AUTH_HEADER, auth)
                .body(body),
            "the payee's provider",
        )
        .await
    }
}

//! A client for the provider's API (what `florin psp` and other callers use): typed calls in,
//! typed answers out.

use std::time::Duration;

use florin_crypto::SecretKey;
use florin_ledger::Encumbrance;
use florin_node::psp::api::{
    AccountList, AccountView, Fund, History, OpenAccount, PayReceipt, PayRequest, PayeeView,
    PspInfo, StartTransfer, TransferOffer,
};
use florin_node::psp::auth::{SignedRequest, AUTH_HEADER};
use florin_node::psp::PaymentAuth;
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use crate::tls::{ClientTls, TlsError};

/// Why a call to a provider failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The HTTP client could not be made.
    #[error("HTTP client")]
    Setup(#[source] reqwest::Error),
    /// The TLS trust configuration could not be made.
    #[error("cannot set up TLS")]
    Tls(#[source] TlsError),
    /// The provider could not be reached (or its answer not received).
    #[error("cannot reach the provider at {base}")]
    Unreachable {
        /// The provider's URL.
        base: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The provider answered with an error status: the status and `code: message`.
    #[error("the provider refused ({status}): {message}")]
    Refused {
        /// The HTTP status as shown (e.g. `409 Conflict`).
        status: String,
        /// The envelope's stable code (`http_<status>` when the answer was not the envelope).
        code: String,
        /// `code: message` from the answer's envelope, or the start of the body itself.
        message: String,
    },
    /// The answer was not the expected JSON.
    #[error("the provider sent an unreadable answer")]
    Unreadable(#[source] serde_json::Error),
    /// The payment cannot be authorized as asked (a bad payee, an unusable id).
    #[error("cannot authorize the payment: {0}")]
    Authorize(String),
}

/// How long a customer's payment authorization stays valid.
pub const AUTHORIZATION_SECS: u64 = 300;

/// A provider's API at `base` (e.g. `http://127.0.0.1:7500`).
#[derive(Debug, Clone)]
pub struct PspClient {
    base: String,
    http: reqwest::Client,
}

impl PspClient {
    /// A client with a 5 s connect and a 600 s call timeout (a first P-256 account's key
    /// generation can take minutes).
    pub fn new(base: &str) -> Result<PspClient, ClientError> {
        Self::with_tls(base, &ClientTls::system())
    }

    /// [`PspClient::new`] trusting what `tls` trusts (e.g. the provider's `ca.pem`).
    pub fn with_tls(base: &str, tls: &ClientTls) -> Result<PspClient, ClientError> {
        Ok(PspClient {
            base: base.trim_end_matches('/').to_string(),
            http: tls
                .reqwest_builder()
                .map_err(ClientError::Tls)?
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(600))
                .build()
                .map_err(ClientError::Setup)?,
        })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            base: self.base.clone(),
            source,
        };
        let resp = req.send().await.map_err(unreachable)?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            let (code, message) = crate::client::refusal(status, &bytes);
            return Err(ClientError::Refused {
                status: status.to_string(),
                message: format!("{code}: {message}"),
                code,
            });
        }
        serde_json::from_slice(&bytes).map_err(ClientError::Unreadable)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn signed<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Vec<u8>,
        who: &str,
        key: &SecretKey,
    ) -> Result<T, ClientError> {
        let auth = SignedRequest::header(key, who, method.as_str(), path, &body);
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(AUTH_HEADER, auth);
        if !body.is_empty() {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        self.send(req).await
    }

    fn to_json<B: Serialize>(b: &B) -> Result<Vec<u8>, ClientError> {
        serde_json::to_vec(b).map_err(ClientError::Unreadable)
    }

    /// `GET /v1/psp/info`.
    pub async fn info(&self) -> Result<PspInfo, ClientError> {
        self.get("/v1/psp/info").await
    }

    /// `POST /v1/psp/accounts`: opens an account for the customer key `key` (which signs
    /// the request).
    pub async fn open_account(
        &self,
        name: &str,
        key: &SecretKey,
    ) -> Result<AccountView, ClientError> {
        let body = Self::to_json(&OpenAccount {
            name: name.into(),
            customer_key: Some(key.public_key().to_address()),
        })?;
        self.signed(reqwest::Method::POST, "/v1/psp/accounts", body, name, key)
            .await
    }

    /// `GET /v1/psp/payees/{name}` (`peer`: a configured peer provider, by name or URL).
    pub async fn payee(&self, name: &str, peer: Option<&str>) -> Result<PayeeView, ClientError> {
        let req = self
            .http
            .get(format!("{}/v1/psp/payees/{name}", self.base))
            .query(&[("peer", peer)]);
        self.send(req).await
    }

    /// `POST /v1/psp/accounts/{name}/faucet`, signed by the customer's key: the ledger's
    /// faucet funds the account.
    pub async fn fund(
        &self,
        name: &str,
        amount_cents: u64,
        key: &SecretKey,
    ) -> Result<AccountView, ClientError> {
        let body = Self::to_json(&Fund { amount_cents })?;
        let path = format!("/v1/psp/accounts/{name}/faucet");
        self.signed(reqwest::Method::POST, &path, body, name, key)
            .await
    }

    /// `GET /v1/psp/accounts/{name}`, signed by the customer's key.
    pub async fn account(&self, name: &str, key: &SecretKey) -> Result<AccountView, ClientError> {
        let path = format!("/v1/psp/accounts/{name}");
        self.signed(reqwest::Method::GET, &path, Vec::new(), name, key)
            .await
    }

    /// `GET /v1/psp/accounts`, with the provider operator's credential (`operator`).
    pub async fn accounts(&self, operator: &SecretKey) -> Result<Vec<AccountView>, ClientError> {
        let path = "/v1/psp/accounts";
        let mut nonce = [0u8; florin_node::operator::NONCE_LEN];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let cred = florin_node::operator::Credential::sign(operator, "GET", path, &[], now, nonce);
        let req = self
            .http
            .get(format!("{}{path}", self.base))
            .header(reqwest::header::AUTHORIZATION, cred.header());
        Ok(self.send::<AccountList>(req).await?.accounts)
    }

    /// `POST /v1/psp/pay` as sent (signed by `key` as `req.from`).
    pub async fn pay(&self, req: &PayRequest, key: &SecretKey) -> Result<PayReceipt, ClientError> {
        let body = Self::to_json(req)?;
        self.signed(reqwest::Method::POST, "/v1/psp/pay", body, &req.from, key)
            .await
    }

    /// Pays as the customer holding `key`: looks up the payer's and the payee's
    /// encumbrances, signs the authorization of exactly this payment (id `id`, valid for
    /// [`AUTHORIZATION_SECS`]) and sends it in a signed request.
    pub async fn pay_as(
        &self,
        key: &SecretKey,
        from: &str,
        to: &str,
        to_psp: Option<&str>,
        amount_cents: u64,
        id: &str,
    ) -> Result<PayReceipt, ClientError> {
        let payer = self.account(from, key).await?;
        let payer = Encumbrance::parse_text(&payer.encumbrance)
            .ok_or_else(|| ClientError::Authorize("the provider sent a bad encumbrance".into()))?;
        // Across providers, Filia's remote transfer: the payee's provider offers where to
        // pay (a joint key `R1 + R2` where its keys have note keys), through this provider.
        let mut offer = None;
        let payee = match (to_psp, Encumbrance::parse_text(to)) {
            (None, Some(e)) => e,
            (Some(peer), _) => {
                let t = self
                    .start_transfer(
                        &StartTransfer {
                            from: from.into(),
                            to: to.into(),
                            to_psp: peer.into(),
                            amount_cents,
                        },
                        key,
                    )
                    .await?;
                // Checked before the customer signs: the offer is the payee's provider's, and
                // the key paid is its `R1` plus the `r2` this provider chose.
                let bad = |e: String| ClientError::Authorize(format!("the transfer offer: {e}"));
                t.offer.verify().map_err(|e| bad(e.to_string()))?;
                let r2 =
                    t.r2.as_deref()
                        .map(florin_node::psp::proof::r2_public)
                        .transpose()
                        .map_err(|e| bad(e.to_string()))?;
                let target = t
                    .offer
                    .target(r2.as_ref())
                    .map_err(|e| bad(e.to_string()))?;
                if target.to_text() != t.encumbrance
                    || t.offer.account != to
                    || (t.offer.r1.is_some() && t.offer.amount_cents != amount_cents)
                {
                    return Err(bad(
                        "it names another key or account than the payee's provider offered".into(),
                    ));
                }
                offer = Some(t.offer);
                target
            }
            (None, None) => {
                let v = self.payee(to, to_psp).await?;
                Encumbrance::parse_text(&v.encumbrance).ok_or_else(|| {
                    ClientError::Authorize("the provider sent a bad payee encumbrance".into())
                })?
            }
        };
        let expires = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            + AUTHORIZATION_SECS;
        let auth = PaymentAuth::sign(key, payer, payee, amount_cents, expires, id)
            .map_err(|e| ClientError::Authorize(e.to_string()))?;
        let req = PayRequest {
            from: from.into(),
            to: to.into(),
            to_psp: to_psp.map(str::to_string),
            amount_cents,
            id: Some(id.into()),
            authorization: Some(hex::encode(auth.encode())),
            offer,
        };
        self.pay(&req, key).await
    }

    /// `POST /v1/psp/transfers`, signed by the customer's key as `req.from`: where to pay
    /// another provider's customer (Filia's remote transfer).
    pub async fn start_transfer(
        &self,
        req: &StartTransfer,
        key: &SecretKey,
    ) -> Result<TransferOffer, ClientError> {
        let body = Self::to_json(req)?;
        self.signed(
            reqwest::Method::POST,
            "/v1/psp/transfers",
            body,
            &req.from,
            key,
        )
        .await
    }

    /// `GET /v1/psp/accounts/{name}/proofs/{txid}`, signed by the customer's key: the proof
    /// of one of the account's cross-provider payments (check it with
    /// `TransferProof::verify`).
    pub async fn proof(
        &self,
        name: &str,
        txid: &str,
        key: &SecretKey,
    ) -> Result<florin_node::psp::proof::TransferProof, ClientError> {
        let path = format!("/v1/psp/accounts/{name}/proofs/{txid}");
        self.signed(reqwest::Method::GET, &path, Vec::new(), name, key)
            .await
    }

    /// `GET /v1/psp/accounts/{name}/history`, signed by the customer's key.
    pub async fn history(&self, name: &str, key: &SecretKey) -> Result<History, ClientError> {
        let path = format!("/v1/psp/accounts/{name}/history");
        self.signed(reqwest::Method::GET, &path, Vec::new(), name, key)
            .await
    }
}

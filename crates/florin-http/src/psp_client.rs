//! A client for the provider's API (what `florin psp` and other callers use): typed calls in,
//! typed answers out.

use std::time::Duration;

use florin_node::psp::api::{
    AccountList, AccountView, Fund, History, OpenAccount, PayReceipt, PayRequest, PspInfo,
};
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
}

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

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    /// `GET /v1/psp/info`.
    pub async fn info(&self) -> Result<PspInfo, ClientError> {
        self.get("/v1/psp/info").await
    }

    /// `POST /v1/psp/accounts`: opens an account.
    pub async fn open_account(&self, name: &str) -> Result<AccountView, ClientError> {
        self.post("/v1/psp/accounts", &OpenAccount { name: name.into() })
            .await
    }

    /// `POST /v1/psp/accounts/{name}/faucet`: the ledger's faucet funds the account.
    pub async fn fund(&self, name: &str, amount_cents: u64) -> Result<AccountView, ClientError> {
        self.post(
            &format!("/v1/psp/accounts/{name}/faucet"),
            &Fund { amount_cents },
        )
        .await
    }

    /// `GET /v1/psp/accounts/{name}`.
    pub async fn account(&self, name: &str) -> Result<AccountView, ClientError> {
        self.get(&format!("/v1/psp/accounts/{name}")).await
    }

    /// `GET /v1/psp/accounts`.
    pub async fn accounts(&self) -> Result<Vec<AccountView>, ClientError> {
        Ok(self.get::<AccountList>("/v1/psp/accounts").await?.accounts)
    }

    /// `POST /v1/psp/pay`.
    pub async fn pay(&self, req: &PayRequest) -> Result<PayReceipt, ClientError> {
        self.post("/v1/psp/pay", req).await
    }

    /// `GET /v1/psp/accounts/{name}/history`.
    pub async fn history(&self, name: &str) -> Result<History, ClientError> {
        self.get(&format!("/v1/psp/accounts/{name}/history")).await
    }
}

//! A small client for the node's HTTP/JSON API.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use florin_node::api::{
    ApiError, DepositRequest, DepositResponse, FaucetRequest, FaucetResponse, FraudInfo, Info,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The node's API.
pub struct NodeClient {
    base: String,
    http: reqwest::Client,
}

impl NodeClient {
    /// A client for `base` (e.g. `http://127.0.0.1:7400`).
    pub fn new(base: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(600))
            .build()?;
        Ok(NodeClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    async fn decode<T: DeserializeOwned>(&self, resp: reqwest::Response) -> Result<T> {
        let status = resp.status();
        let bytes = resp.bytes().await?;
        if !status.is_success() {
            let msg = serde_json::from_slice::<ApiError>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(anyhow!("node refused ({status}): {msg}"));
        }
        serde_json::from_slice(&bytes).context("node sent an unreadable answer")
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .with_context(|| format!("cannot reach the node at {}", self.base))?;
        self.decode(resp).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the node at {}", self.base))?;
        self.decode(resp).await
    }

    /// `GET /v1/info`.
    pub async fn info(&self) -> Result<Info> {
        self.get("/v1/info").await
    }

    /// `POST /v1/faucet`.
    pub async fn faucet(&self, req: &FaucetRequest) -> Result<FaucetResponse> {
        self.post("/v1/faucet", req).await
    }

    /// `POST /v1/deposit`.
    pub async fn deposit(&self, req: &DepositRequest) -> Result<DepositResponse> {
        self.post("/v1/deposit", req).await
    }

    /// `GET /v1/fraud`.
    pub async fn fraud(&self) -> Result<Vec<FraudInfo>> {
        self.get("/v1/fraud").await
    }
}

/// A current-thread runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

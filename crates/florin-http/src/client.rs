//! The node's HTTP/JSON API client: the wallet's connector (`connect.rs`), `florin audit` and
//! `florin fraud` use it.

use std::time::Duration;

use florin_node::api::{
    ApiError, DepositRequest, DepositResponse, FaucetResponse, FraudInfo, Info, LedgerFaucet,
    LedgerFaucetAnswer, LedgerTxStatus, MailboxList, MailboxMessage, MailboxPut, SubmitTx, Unspent,
    WithdrawRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a call to the node failed: a refusal by the node, or a node that cannot be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The HTTP client could not be set up.
    #[error("cannot set up the HTTP client: {0}")]
    Setup(#[source] reqwest::Error),
    /// The node answered with an error status.
    #[error("node refused ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The envelope's stable code (`http_<status>` when the answer was not the envelope).
        code: String,
        /// The node's message.
        message: String,
    },
    /// The request did not reach the node.
    #[error("cannot reach the node at {node}")]
    Unreachable {
        /// The node's base URL.
        node: String,
        /// Why.
        #[source]
        source: reqwest::Error,
    },
    /// The answer broke off.
    #[error(transparent)]
    Transport(reqwest::Error),
    /// The answer is not what the API promises.
    #[error("node sent an unreadable answer")]
    Unreadable(#[source] serde_json::Error),
}

/// Longest text of an answer that is not the envelope kept in an error.
const MAX_RAW_ERROR: usize = 512;

/// The code and message of an error answer: the envelope's, or (from something that is not a
/// Florin server) `http_<status>` and the start of the body.
pub fn refusal(status: reqwest::StatusCode, body: &[u8]) -> (String, String) {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => (e.error.code, e.error.message),
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(MAX_RAW_ERROR)]);
            (format!("http_{}", status.as_u16()), text.into_owned())
        }
    }
}

impl ClientError {
    /// The envelope's code of a refusal (`None` when the node did not answer).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// The node's API.
pub struct NodeClient {
    base: String,
    http: reqwest::Client,
}

impl NodeClient {
    /// A client for `base` (e.g. `http://127.0.0.1:7400`).
    pub fn new(base: &str) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(600))
            .build()
            .map_err(ClientError::Setup)?;
        Ok(NodeClient {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// The node's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    async fn decode<T: DeserializeOwned>(&self, resp: reqwest::Response) -> Result<T, ClientError> {
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(ClientError::Transport)?;
        if !status.is_success() {
            let (code, message) = refusal(status, &bytes);
            return Err(ClientError::Refused {
                status,
                code,
                message,
            });
        }
        serde_json::from_slice(&bytes).map_err(ClientError::Unreadable)
    }

    fn unreachable(&self, source: reqwest::Error) -> ClientError {
        ClientError::Unreachable {
            node: self.base.clone(),
            source,
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.decode(resp).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        self.decode(resp).await
    }

    /// `GET /v1/info`.
    pub async fn info(&self) -> Result<Info, ClientError> {
        self.get("/v1/info").await
    }

    /// `POST /v1/ledger/faucet`.
    pub async fn ledger_faucet(
        &self,
        req: &LedgerFaucet,
    ) -> Result<LedgerFaucetAnswer, ClientError> {
        self.post("/v1/ledger/faucet", req).await
    }

    /// `POST /v1/ledger/transactions`.
    pub async fn submit(&self, tx_hex: String) -> Result<LedgerTxStatus, ClientError> {
        self.post("/v1/ledger/transactions", &SubmitTx { tx: tx_hex })
            .await
    }

    /// `GET /v1/ledger/unspent/{id}`.
    pub async fn unspent(&self, id: &[u8; 32]) -> Result<bool, ClientError> {
        let u: Unspent = self
            .get(&format!("/v1/ledger/unspent/{}", hex::encode(id)))
            .await?;
        Ok(u.unspent)
    }

    /// `POST /v1/mailbox`.
    pub async fn mailbox_put(&self, to: &str, message: &[u8]) -> Result<u64, ClientError> {
        let m: MailboxMessage = self
            .post(
                "/v1/mailbox",
                &MailboxPut {
                    to: to.into(),
                    message: hex::encode(message),
                },
            )
            .await?;
        Ok(m.seq)
    }

    /// `GET /v1/mailbox/{address}?after=N`.
    pub async fn mailbox_get(&self, address: &str, after: u64) -> Result<MailboxList, ClientError> {
        self.get(&format!("/v1/mailbox/{address}?after={after}"))
            .await
    }

    /// `POST /v1/withdraw`.
    pub async fn withdraw(&self, req: &WithdrawRequest) -> Result<FaucetResponse, ClientError> {
        self.post("/v1/withdraw", req).await
    }

    /// `GET /v1/audit`.
    pub async fn audit(&self) -> Result<serde_json::Value, ClientError> {
        self.get("/v1/audit").await
    }

    /// `POST /v1/deposit`.
    pub async fn deposit(&self, req: &DepositRequest) -> Result<DepositResponse, ClientError> {
        self.post("/v1/deposit", req).await
    }

    /// `GET /v1/fraud`.
    pub async fn fraud(&self) -> Result<Vec<FraudInfo>, ClientError> {
        self.get("/v1/fraud").await
    }
}

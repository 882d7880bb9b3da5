//! The node's HTTP/JSON API client: the wallet's connector (`connect.rs`), `florin audit` and
//! `florin fraud` use it.

use std::time::Duration;

use florin_crypto::SecretKey;
use florin_node::api::{
    AdminBlacklist, AdminEntry, AdminLogEntry, AdminRevoke, ApiError, DepositRequest,
    DepositResponse, FaucetResponse, FraudInfo, Info, LedgerFaucet, LedgerFaucetAnswer,
    LedgerTxStatus, MailboxList, MailboxMessage, MailboxPut, SubmitTx, Unspent, WithdrawRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::tls::{ClientTls, TlsError};

/// Why a call to the node failed: a refusal by the node, or a node that cannot be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The HTTP client could not be set up.
    #[error("cannot set up the HTTP client: {0}")]
    Setup(#[source] reqwest::Error),
    /// The TLS trust configuration could not be made.
    #[error("cannot set up TLS: {0}")]
    Tls(#[source] TlsError),
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

fn unreachable(base: &str, source: reqwest::Error) -> ClientError {
    ClientError::Unreachable {
        node: base.to_string(),
        source,
    }
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, ClientError> {
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

/// The node's API, at one URL or several (a cluster's sentinels: `https://a:7400,https://b:7400`).
///
/// With several, a request goes to the URL that answered last; when it cannot be reached the
/// next is tried, so a wallet fails over when the sentinel it used goes down. A request is
/// sent again elsewhere only when that is safe: always when its connection was never made
/// (nothing reached the node), and for a read (`GET`) also when the answer broke off. A
/// sentinel that runs no token authority (`no_authority`) passes authority requests on to the
/// next URL too, and so does one whose authority group it cannot reach (`unavailable`) for
/// every request but the faucet's: withdrawals, deposits, blacklisting and revocations give the
/// same answer when asked again, and a handoff left twice is collected once.
pub struct NodeClient {
    bases: Vec<String>,
    /// Index in `bases` of the URL that answered last.
    current: std::sync::atomic::AtomicUsize,
    http: reqwest::Client,
    operator: Option<std::sync::Arc<SecretKey>>,
}

/// Whether a request refused `unavailable` (its registry write may or may not have been
/// applied) may be sent again elsewhere: everything but a faucet mint, which would mint again.
fn retry_safe(path: &str) -> bool {
    !path.contains("faucet")
}

impl NodeClient {
    /// A client for `base` (e.g. `https://127.0.0.1:7400`) trusting the system's roots only.
    pub fn new(base: &str) -> Result<Self, ClientError> {
        Self::with_tls(base, &ClientTls::system())
    }

    /// A client for `base` trusting what `tls` trusts (e.g. a devnet's `ca.pem`).
    pub fn with_tls(base: &str, tls: &ClientTls) -> Result<Self, ClientError> {
        let http = tls
            .reqwest_builder()
            .map_err(ClientError::Tls)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(600))
            .build()
            .map_err(ClientError::Setup)?;
        let mut bases: Vec<String> = base
            .split(',')
            .map(|b| b.trim().trim_end_matches('/').to_string())
            .filter(|b| !b.is_empty())
            .collect();
        if bases.is_empty() {
            bases.push(base.trim().to_string());
        }
        Ok(NodeClient {
            bases,
            current: std::sync::atomic::AtomicUsize::new(0),
            http,
            operator: None,
        })
    }

    /// This client signing its operator requests (the faucet, `/v1/admin/…`) with `key`
    /// (`florin_node::operator`).
    pub fn with_operator(mut self, key: SecretKey) -> Self {
        self.operator = Some(std::sync::Arc::new(key));
        self
    }

    /// Whether this client signs operator requests.
    pub fn has_operator(&self) -> bool {
        self.operator.is_some()
    }

    /// Sends `method path` with `body` (JSON bytes, or none), signed by the operator key
    /// when this client has one, failing over between the client's URLs (see [`NodeClient`]).
    async fn send_signed<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        self.send(method, path, body, true).await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        signed: bool,
    ) -> Result<T, ClientError> {
        use std::sync::atomic::Ordering;
        let n = self.bases.len();
        let first = self.current.load(Ordering::Relaxed) % n.max(1);
        let read = method == reqwest::Method::GET;
        let mut last = None;
        for k in 0..n {
            let i = (first + k) % n;
            let base = &self.bases[i];
            let more = k + 1 < n;
            let req = self.request(method.clone(), base, path, body.clone(), signed);
            let resp = match req.send().await {
                Ok(resp) => resp,
                Err(e) if more && (e.is_connect() || read) => {
                    last = Some(unreachable(base, e));
                    continue;
                }
                Err(e) => return Err(unreachable(base, e)),
            };
            let answer = decode(resp).await;
            let pass_on = match &answer {
                Err(ClientError::Refused { code, .. }) => {
                    code == "no_authority" || (code == "unavailable" && retry_safe(path))
                }
                Err(ClientError::Transport(_)) => read,
                _ => false,
            };
            match answer {
                Err(e) if more && pass_on => last = Some(e),
                answer => {
                    self.current.store(i, Ordering::Relaxed);
                    return answer;
                }
            }
        }
        Err(last.unwrap_or_else(|| ClientError::Refused {
            status: reqwest::StatusCode::BAD_REQUEST,
            code: "no_node".into(),
            message: "no node URL given".into(),
        }))
    }

    /// One request to `base`, signed by the operator key when asked and this client has one.
    fn request(
        &self,
        method: reqwest::Method,
        base: &str,
        path: &str,
        body: Option<Vec<u8>>,
        signed: bool,
    ) -> reqwest::RequestBuilder {
        let url = format!("{base}{path}");
        let mut req = self.http.request(method.clone(), &url);
        if let (true, Some(key)) = (signed, &self.operator) {
            // The path as the node sees it: with the base URL's own prefix and the query.
            let signed_path = match reqwest::Url::parse(&url) {
                Ok(u) => match u.query() {
                    Some(q) => format!("{}?{q}", u.path()),
                    None => u.path().to_string(),
                },
                Err(_) => path.to_string(),
            };
            let mut nonce = [0u8; florin_node::operator::NONCE_LEN];
            rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut nonce);
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let cred = florin_node::operator::Credential::sign(
                key,
                method.as_str(),
                &signed_path,
                body.as_deref().unwrap_or(&[]),
                now,
                nonce,
            );
            req = req.header(reqwest::header::AUTHORIZATION, cred.header());
        }
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b);
        }
        req
    }

    async fn post_signed<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(ClientError::Unreadable)?;
        self.send_signed(reqwest::Method::POST, path, Some(bytes))
            .await
    }

    async fn get_signed<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send_signed(reqwest::Method::GET, path, None).await
    }

    /// The node's base URL: the one that answered last (the first before any answer).
    pub fn base(&self) -> &str {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        self.bases
            .get(i)
            .or(self.bases.first())
            .map_or("", String::as_str)
    }

    /// Every URL this client was given, in order.
    pub fn bases(&self) -> &[String] {
        &self.bases
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        self.send(reqwest::Method::GET, path, None, false).await
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(ClientError::Unreadable)?;
        self.send(reqwest::Method::POST, path, Some(bytes), false)
            .await
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
        self.post_signed("/v1/ledger/faucet", req).await
    }

    /// `POST /v1/admin/blacklist` (operator).
    pub async fn admin_blacklist(
        &self,
        serial: &str,
        reason: &str,
    ) -> Result<AdminEntry, ClientError> {
        let req = AdminBlacklist {
            serial: serial.into(),
            reason: reason.into(),
        };
        self.post_signed("/v1/admin/blacklist", &req).await
    }

    /// `POST /v1/admin/revoke` (operator).
    pub async fn admin_revoke(&self, key: &str, reason: &str) -> Result<AdminEntry, ClientError> {
        let req = AdminRevoke {
            key: key.into(),
            reason: reason.into(),
        };
        self.post_signed("/v1/admin/revoke", &req).await
    }

    /// `POST /v1/admin/unrevoke` (operator).
    pub async fn admin_unrevoke(&self, key: &str, reason: &str) -> Result<AdminEntry, ClientError> {
        let req = AdminRevoke {
            key: key.into(),
            reason: reason.into(),
        };
        self.post_signed("/v1/admin/unrevoke", &req).await
    }

    /// `GET /v1/admin/blacklist` (operator).
    pub async fn admin_blacklisted(&self) -> Result<Vec<AdminEntry>, ClientError> {
        self.get_signed("/v1/admin/blacklist").await
    }

    /// `GET /v1/admin/revoked` (operator).
    pub async fn admin_revoked(&self) -> Result<Vec<AdminEntry>, ClientError> {
        self.get_signed("/v1/admin/revoked").await
    }

    /// `GET /v1/admin/log` (operator).
    pub async fn admin_log(&self) -> Result<Vec<AdminLogEntry>, ClientError> {
        self.get_signed("/v1/admin/log").await
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

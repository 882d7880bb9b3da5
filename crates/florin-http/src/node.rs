//! The node's HTTP/JSON API (axum). Handlers are thin: parse, call the service on a blocking
//! thread (storage and signature checks are CPU and disk work), map errors to status codes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Extension, Json, Router};
use tokio::net::TcpListener;

use crate::server::ServeOptions;

use florin_crypto::PublicKey;
use florin_node::api::{
    AdminBlacklist, AdminEntry, AdminLogEntry, AdminRevoke, ApiError, DepositRequest,
    DepositResponse, FaucetResponse, Health, Info, LedgerFaucet, LedgerFaucetAnswer,
    LedgerTxStatus, MailboxList, MailboxMessage, MailboxPut, SubmitBatch, SubmitBatchAnswer,
    SubmitTx, Unspent, WithdrawRequest,
};
use florin_node::bridge::{settle_credit, WithdrawAuth};
use florin_node::error::{BadRequest, Forbidden, NotFound};
use florin_node::{Authority, Ledger, NodeError, TxStatus};
use florin_token::{Serial, Token};

use crate::edge::{self, ApiJson, EdgeError, Limiter, RateLimits, Work};

/// What the API serves: the token authority and, when running, the ledger.
#[derive(Clone)]
pub struct AppState {
    /// The token authority (a cluster's extra sentinels run none: they serve the ledger).
    pub authority: Option<Arc<Authority>>,
    /// The ledger service.
    pub ledger: Option<Arc<Ledger>>,
    /// Rate limits per client address and per key (`RateLimits::default()` unless configured).
    pub limits: RateLimits,
    /// A cluster sentinel's view of its cluster's groups (`GET /v1/cluster`); `None` elsewhere.
    pub cluster: Option<Arc<florin_node::cluster::status::ClusterView>>,
    /// The key-management network the node signs through (`GET /v1/custody`); `None` when its
    /// keys are local.
    pub custody: Option<Arc<florin_node::custody::view::CustodyView>>,
}

impl AppState {
    fn authority(&self) -> Result<Arc<Authority>, NodeError> {
        self.authority
            .clone()
            .ok_or(NodeError::NotFound(NotFound::NoAuthority))
    }

    fn ledger(&self) -> Result<Arc<Ledger>, NodeError> {
        self.ledger
            .clone()
            .ok_or(NodeError::NotFound(NotFound::NoLedger))
    }
}

/// Longest canonical encoding of a ledger transaction: a transfer of [`florin_ledger::MAX_IO`]
/// inputs (73 bytes each), outputs (41) and witnesses (98 for P-256, the longer), with its tag
/// and list lengths (a mint or a redeem is shorter).
pub const MAX_TX_LEN: usize = 16 + florin_ledger::tx::MAX_IO * (73 + 41 + 98);
/// Longest token in a deposit: its 76-byte header and 128-byte links, the anchor, 64 offline
/// hops and the link to the authority.
pub const MAX_DEPOSIT_TOKEN_LEN: usize = 76 + (64 + 2) * 128;
/// Most tokens a wallet sends in one deposit request (it deposits more in several); the body
/// limit of `POST /v1/deposit` is sized for this many of the longest tokens.
pub const MAX_DEPOSIT_TOKENS_PER_REQUEST: usize = florin_wallet::MAX_DEPOSIT_PER_REQUEST;

/// Body limits per route, in bytes: what each route needs, so no request makes the node
/// buffer more (`docs/api.md`). Over them: 413 `too_large`.
pub mod limits {
    use super::*;

    /// `POST /v1/ledger/transactions`: one transaction as hex in JSON (or its bytes).
    pub const TRANSACTION: usize = 2 * MAX_TX_LEN + 1024;
    /// `POST /v1/ledger/batch`: 4,096 typical transactions (up to 1 KiB each, 2 KiB as hex);
    /// a batch of larger ones is sent in parts.
    pub const BATCH: usize = 8 * 1024 * 1024;
    /// `POST /v1/withdraw`: a transaction as hex and a few short fields.
    pub const WITHDRAW: usize = 2 * MAX_TX_LEN + 4096;
    /// `POST /v1/mailbox`: a message of at most 64 KiB as hex and an address.
    pub const MAILBOX: usize = 2 * florin_node::MAX_MAILBOX_MESSAGE + 4096;
    /// `POST /v1/deposit`: [`MAX_DEPOSIT_TOKENS_PER_REQUEST`] of the longest tokens as hex.
    pub const DEPOSIT: usize =
        MAX_DEPOSIT_TOKENS_PER_REQUEST * (2 * MAX_DEPOSIT_TOKEN_LEN + 3) + 4096;
    /// `POST /v1/ledger/faucet` and every other route (their requests have no body).
    pub const SMALL: usize = 4096;
}

/// A service error as an HTTP answer: a status code and an [`ApiError`] body.
#[derive(Debug)]
pub struct HttpError(pub NodeError);

impl From<NodeError> for HttpError {
    fn from(e: NodeError) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let HttpError(e) = self;
        let status = match &e {
            NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            NodeError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Forbidden(_) => StatusCode::FORBIDDEN,
            NodeError::Signer(_) => StatusCode::SERVICE_UNAVAILABLE,
            NodeError::Full(_) => StatusCode::TOO_MANY_REQUESTS,
            NodeError::Storage(florin_node::error::StorageError::Unavailable(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        // A body that is not the JSON it should be is `malformed`, on every route alike.
        let code = match &e {
            NodeError::BadRequest(BadRequest::Json(_)) => "malformed",
            _ => e.code(),
        };
        (status, Json(ApiError::new(code, e.to_string()))).into_response()
    }
}

async fn blocking<T, F>(f: F) -> Result<T, NodeError>
where
    F: FnOnce() -> Result<T, NodeError> + Send + 'static,
    T: Send + 'static,
{
    // The request's span (its request id) follows the work onto the blocking thread.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| NodeError::task("worker", e))?
}

#[utoipa::path(get, path = "/v1/health", tag = "health",
    summary = "Liveness: the process runs",
    responses((status = 200, description = "It runs.", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Ready when the authority's registry and the ledger's store answer a point read (for a
/// cluster's sentinel the ledger's read goes to a shard's leader). Probed at most once a second
/// (`observe::cached_readiness`).
#[utoipa::path(get, path = "/v1/ready", tag = "health",
    summary = "Readiness: the authority's registry and the ledger's store answer",
    responses(
        (status = 200, description = "Ready: every check is `ok`.", body = florin_node::api::Readiness),
        (status = 503, description = "Not ready: the failed checks say why.", body = florin_node::api::Readiness)))]
async fn ready(State(st): State<AppState>) -> Response {
    use crate::observe::check;
    let key = st
        .ledger
        .as_ref()
        .map(|l| Arc::as_ptr(l) as usize)
        .or_else(|| st.authority.as_ref().map(|a| Arc::as_ptr(a) as usize))
        .unwrap_or(0);
    crate::observe::cached_readiness(key, async move {
        let mut checks = Vec::new();
        if let Some(a) = st.authority.clone() {
            checks.push((
                "authority",
                check(blocking(move || a.minted().map(|_| ()))).await,
            ));
        }
        if let Some(l) = st.ledger.clone() {
            checks.push((
                "ledger",
                check(blocking(move || l.is_unspent(&[0u8; 32]).map(|_| ()))).await,
            ));
        }
        checks
    })
    .await
}

#[utoipa::path(get, path = "/v1/info", tag = "tokens",
    summary = "The authority's address, the version, the faucet and the ledger's issuer",
    responses((status = 200, description = "The node.", body = Info)))]
async fn info(State(st): State<AppState>) -> Result<Json<Info>, HttpError> {
    let a = st.authority()?;
    Ok(Json(Info {
        authority: a.public_key().to_address(),
        version: env!("CARGO_PKG_VERSION").into(),
        faucet: a.config().faucet,
        max_faucet_cents: a.config().max_faucet_cents,
        faucet_needs_operator: a.faucet_needs_operator(),
        issuer: st.ledger.as_ref().map(|l| l.issuer().to_address()),
    }))
}

/// An address or hex key from a request (the field `what`).
pub fn parse_key(s: &str, what: &str) -> Result<PublicKey, NodeError> {
    PublicKey::parse(s).map_err(|source| key_error(what, source))
}

/// An address or hex key that value or messages will be sent to (the field `what`), which
/// must be a usable key (a canonical curve point, not of small order): money or a handoff
/// addressed to anything else is lost.
pub fn parse_valid_key(s: &str, what: &str) -> Result<PublicKey, NodeError> {
    PublicKey::parse_valid(s).map_err(|source| key_error(what, source))
}

fn key_error(what: &str, source: florin_crypto::KeyError) -> NodeError {
    NodeError::BadRequest(BadRequest::Key {
        what: what.into(),
        source,
    })
}

/// A token serial: 16 hex digits.
pub fn parse_serial(s: &str) -> Result<Serial, NodeError> {
    hex::decode(s)
        .ok()
        .and_then(|v| Serial::try_from(v.as_slice()).ok())
        .ok_or(NodeError::BadRequest(BadRequest::Serial))
}

/// 32 bytes as 64 hex digits (the field `what`: a txid, a UHS id, a handshake).
pub fn parse_hex32(s: &str, what: &'static str) -> Result<[u8; 32], NodeError> {
    hex::decode(s)
        .ok()
        .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
        .ok_or(NodeError::BadRequest(BadRequest::Hex32(what)))
}

/// A deposit's depositor (an address or hex key, a usable one) and tokens (hex of their
/// encoding; one that does not decode becomes an `Err`, reported back as refused). Refuses
/// more tokens than the authority takes in one deposit before decoding any.
pub fn parse_deposit(
    authority: &Authority,
    depositor: &str,
    tokens_hex: &[String],
) -> Result<(PublicKey, Vec<Result<Token, String>>), NodeError> {
    let depositor = parse_valid_key(depositor, "depositor")?;
    authority.check_deposit_size(tokens_hex.len())?;
    let tokens = tokens_hex
        .iter()
        .map(|h| {
            hex::decode(h)
                .map_err(|_| "token is not hex".to_string())
                .and_then(|b| Token::decode(&b).map_err(|e| format!("malformed token: {e}")))
        })
        .collect();
    Ok((depositor, tokens))
}

#[utoipa::path(post, path = "/v1/deposit", tag = "tokens",
    summary = "Deposit offline tokens: re-anchor them, or credit them on the ledger",
    request_body = DepositRequest,
    responses((status = 200, description = "One report per token, in request order.", body = DepositResponse),
        (status = 403, description = "The depositor's key is revoked.", body = ApiError)))]
async fn deposit(
    State(st): State<AppState>,
    work: Work,
    ApiJson(req): ApiJson<DepositRequest>,
) -> Result<Response, HttpError> {
    if req.tokens.is_empty() {
        return Err(HttpError(BadRequest::EmptyDeposit.into()));
    }
    let a = st.authority()?;
    let (depositor, tokens) = parse_deposit(&a, &req.depositor, &req.tokens)?;
    if let Err(e) = work.spend(tokens.len()) {
        return Ok(e.into_response());
    }
    if !req.credit {
        let results = blocking(move || a.deposit(&depositor, &tokens)).await?;
        return Ok(Json(DepositResponse {
            results,
            credit: None,
        })
        .into_response());
    }
    let ledger = st.ledger()?;
    let (results, intent) = blocking(move || a.deposit_credit(&depositor, &tokens)).await?;
    let credit = match intent {
        None => None,
        Some(intent) => Some(settle_credit(&st.authority()?, &ledger, intent).await?),
    };
    Ok(Json(DepositResponse { results, credit }).into_response())
}

#[utoipa::path(post, path = "/v1/withdraw", tag = "tokens",
    summary = "Withdraw tokens against a confirmed ledger payment to the reserve",
    request_body = WithdrawRequest,
    responses((status = 200, description = "The tokens (hex), first held by the recipient.", body = FaucetResponse),
        (status = 401, description = "No valid signature of the paying key.", body = ApiError),
        (status = 403, description = "The key is revoked or does not own the payment.", body = ApiError)))]
async fn withdraw(
    State(st): State<AppState>,
    Extension(limiter): Extension<Arc<Limiter>>,
    work: Work,
    ApiJson(req): ApiJson<WithdrawRequest>,
) -> Result<Response, HttpError> {
    // Per withdrawing key (or recipient, when no key is given).
    let who = req.key.as_deref().unwrap_or(&req.recipient);
    if let Err(e) = limiter
        .check_key("withdrawal key", who.as_bytes())
        .and_then(|()| work.spend(1))
    {
        return Ok(e.into_response());
    }
    let ledger = st.ledger()?;
    let tx = decode_hex_tx(&req.tx)?;
    let handshake = parse_hex32(&req.handshake, "handshake")?;
    let a = st.authority()?;
    let recipient = parse_valid_key(&req.recipient, "recipient")?;
    let auth = match (&req.key, &req.signature) {
        (Some(k), Some(s)) => Some(WithdrawAuth::parse(k, s).map_err(NodeError::from)?),
        _ => None,
    };
    let tokens = blocking(move || {
        let txid = tx.txid();
        let confirmed = ledger.status(&txid)? == Some(TxStatus::Confirmed);
        let out_id = match &tx {
            florin_ledger::Transaction::Transfer(t) => {
                t.output_utxos().get(req.output).map(|u| u.id())
            }
            _ => None,
        };
        let unspent = match out_id {
            Some(id) => ledger.is_unspent(&id)?,
            None => false,
        };
        // The reserve output unspent proves the transfer applied (only it can create that
        // output), also after the ledger has forgotten its txid at its expiry.
        let confirmed = confirmed || unspent;
        a.withdraw(
            &tx,
            req.output,
            &recipient,
            handshake,
            auth.as_ref(),
            confirmed,
            unspent,
        )
    })
    .await?;
    Ok(Json(FaucetResponse {
        tokens: tokens.iter().map(|t| hex::encode(t.encode())).collect(),
    })
    .into_response())
}

#[utoipa::path(get, path = "/v1/audit", tag = "audit",
    summary = "The supply audit: minted − redeemed = ledger circulating + tokens outstanding",
    responses((status = 200, description = "The audit.", body = florin_node::bridge::Audit)))]
async fn audit_books(
    State(st): State<AppState>,
) -> Result<Json<florin_node::bridge::Audit>, HttpError> {
    let ledger = st.ledger()?;
    let a = st.authority()?;
    Ok(Json(
        blocking(move || florin_node::audit::full_audit(&a, &ledger)).await?,
    ))
}

#[utoipa::path(get, path = "/v1/fraud", tag = "tokens",
    summary = "Every double spend detected, with its culprit and its proof",
    responses((status = 200, description = "The fraud proofs, oldest first.", body = Vec<florin_node::api::FraudInfo>)))]
async fn fraud(State(st): State<AppState>) -> Result<Response, HttpError> {
    let a = st.authority()?;
    let list = blocking(move || a.fraud_list()).await?;
    Ok(Json(list).into_response())
}

#[utoipa::path(get, path = "/v1/tokens/{serial}", tag = "tokens",
    summary = "A token's status, value and holder",
    params(("serial" = String, Path, description = "The token's serial: 16 hex digits.", pattern = "^[0-9a-fA-F]{16}$")),
    responses((status = 200, description = "The token.", body = florin_node::api::TokenInfo)))]
async fn token(
    State(st): State<AppState>,
    Path(serial): Path<String>,
) -> Result<Response, HttpError> {
    let a = st.authority()?;
    let serial = parse_serial(&serial)?;
    let info = blocking(move || a.token(&serial)).await?;
    Ok(Json(info).into_response())
}

/// Most transactions in one batch submission.
pub const MAX_SUBMIT_BATCH: usize = 4096;

/// Whether a body is binary (`application/octet-stream`) or JSON (`application/json`); 415
/// for anything else.
fn is_binary(headers: &HeaderMap) -> Result<bool, EdgeError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.starts_with("application/octet-stream") {
        Ok(true)
    } else if ct.starts_with("application/json") {
        Ok(false)
    } else {
        Err(EdgeError::media_type(
            "application/json or application/octet-stream",
        ))
    }
}

fn decode_tx(bytes: &[u8]) -> Result<florin_ledger::Transaction, NodeError> {
    florin_ledger::Transaction::decode(bytes)
        .map_err(|e| NodeError::BadRequest(BadRequest::Transaction(e)))
}

fn decode_hex_tx(hex_tx: &str) -> Result<florin_ledger::Transaction, NodeError> {
    let bytes = hex::decode(hex_tx).map_err(|_| BadRequest::NotHex("tx"))?;
    decode_tx(&bytes)
}

/// One transaction: JSON `{"tx": hex}`, or its canonical bytes as `application/octet-stream`.
#[utoipa::path(post, path = "/v1/ledger/transactions", tag = "ledger",
    summary = "Submit one transaction; answers once it is decided or after the wait",
    request_body(description = "JSON `{\"tx\": hex}`, or the transaction's canonical bytes.",
        content((SubmitTx = "application/json"), (TxBytes = "application/octet-stream"))),
    responses((status = 200, description = "Its status.", body = LedgerTxStatus)))]
async fn submit_tx(
    State(st): State<AppState>,
    work: Work,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let binary = match is_binary(&headers) {
        Ok(b) => b,
        Err(e) => return Ok(e.into_response()),
    };
    let tx = if binary {
        decode_tx(&body)?
    } else {
        let req: SubmitTx =
            serde_json::from_slice(&body).map_err(|e| NodeError::from(BadRequest::Json(e)))?;
        decode_hex_tx(&req.tx)?
    };
    if let Err(e) = work.spend(1) {
        return Ok(e.into_response());
    }
    let (txid, status) = st.ledger()?.submit(tx).await?;
    Ok(Json(LedgerTxStatus::of(&txid, &status)).into_response())
}

/// Transaction `index` of a batch is refused.
fn in_batch(index: usize, e: NodeError) -> NodeError {
    BadRequest::InBatch {
        index,
        source: Box::new(e),
    }
    .into()
}

/// Splits a binary batch: frames of a little-endian `u32` length and that many bytes, each a
/// transaction's canonical encoding (public for the fuzz targets).
pub fn split_frames(mut body: &[u8]) -> Result<Vec<florin_ledger::Transaction>, NodeError> {
    let mut txs = Vec::new();
    while !body.is_empty() {
        if txs.len() == MAX_SUBMIT_BATCH {
            return Err(BadRequest::BatchTooLarge {
                max: MAX_SUBMIT_BATCH,
            }
            .into());
        }
        let (len, rest) = body
            .split_first_chunk::<4>()
            .ok_or(BadRequest::TruncatedFrame)?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(BadRequest::FrameOverrun {
                frame: txs.len(),
                claimed: len,
                remaining: rest.len(),
            }
            .into());
        }
        txs.push(decode_tx(&rest[..len]).map_err(|e| in_batch(txs.len(), e))?);
        body = &rest[len..];
    }
    Ok(txs)
}

/// Many transactions in one request (a payment service provider forwarding its users'):
/// JSON `{"txs": [hex, ...]}` or length-prefixed frames as `application/octet-stream`. All are
/// decoded before any is submitted: one malformed transaction refuses the whole request.
#[utoipa::path(post, path = "/v1/ledger/batch", tag = "ledger",
    summary = "Submit up to 4,096 transactions at once",
    request_body(description = "JSON `{\"txs\": [hex, ...]}`, or frames of a little-endian u32 length and \
        that many bytes of a transaction.",
        content((SubmitBatch = "application/json"), (TxBytes = "application/octet-stream"))),
    responses((status = 200, description = "One status per transaction, in order.", body = SubmitBatchAnswer)))]
async fn submit_batch(
    State(st): State<AppState>,
    work: Work,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let binary = match is_binary(&headers) {
        Ok(b) => b,
        Err(e) => return Ok(e.into_response()),
    };
    let txs = if binary {
        split_frames(&body)?
    } else {
        let req: SubmitBatch =
            serde_json::from_slice(&body).map_err(|e| NodeError::from(BadRequest::Json(e)))?;
        if req.txs.len() > MAX_SUBMIT_BATCH {
            return Err(HttpError(
                BadRequest::BatchTooLarge {
                    max: MAX_SUBMIT_BATCH,
                }
                .into(),
            ));
        }
        req.txs
            .iter()
            .enumerate()
            .map(|(i, t)| decode_hex_tx(t).map_err(|e| in_batch(i, e)))
            .collect::<Result<_, _>>()?
    };
    if let Err(e) = work.spend(txs.len()) {
        return Ok(e.into_response());
    }
    let answers = st.ledger()?.submit_many(txs).await?;
    Ok(Json(SubmitBatchAnswer {
        results: answers
            .iter()
            .map(|(t, s)| LedgerTxStatus::of(t, s))
            .collect(),
    })
    .into_response())
}

#[utoipa::path(get, path = "/v1/ledger/transactions/{txid}", tag = "ledger",
    summary = "A transaction's status",
    params(("txid" = String, Path, description = "The txid: 64 hex digits.", pattern = "^[0-9a-fA-F]{64}$")),
    responses((status = 200, description = "Its status.", body = LedgerTxStatus)))]
async fn tx_status(
    State(st): State<AppState>,
    Path(txid): Path<String>,
) -> Result<Json<LedgerTxStatus>, HttpError> {
    let ledger = st.ledger()?;
    let id = parse_hex32(&txid, "txid")?;
    let status = blocking(move || ledger.status(&id)).await?;
    match status {
        Some(s) => Ok(Json(LedgerTxStatus::of(&id, &s))),
        None => Err(HttpError(NotFound::Transaction(id).into())),
    }
}

#[utoipa::path(get, path = "/v1/ledger/transactions/{txid}/confirmation", tag = "ledger",
    summary = "The ledger's signed word that a transaction is confirmed",
    params(("txid" = String, Path, description = "The txid: 64 hex digits.", pattern = "^[0-9a-fA-F]{64}$")),
    responses((status = 200, description = "The confirmation, signed by the issuer.", body = florin_node::api::LedgerConfirmation)))]
async fn tx_confirmation(
    State(st): State<AppState>,
    Path(txid): Path<String>,
) -> Result<Json<florin_node::api::LedgerConfirmation>, HttpError> {
    let ledger = st.ledger()?;
    let id = parse_hex32(&txid, "txid")?;
    Ok(Json(blocking(move || ledger.confirmation(&id)).await?))
}

#[utoipa::path(get, path = "/v1/ledger/unspent/{id}", tag = "ledger",
    summary = "Whether an output is unspent",
    params(("id" = String, Path, description = "The output's UHS id: 64 hex digits.", pattern = "^[0-9a-fA-F]{64}$")),
    responses((status = 200, description = "Unspent or not.", body = Unspent)))]
async fn unspent(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Unspent>, HttpError> {
    let ledger = st.ledger()?;
    let uid = parse_hex32(&id, "id")?;
    let unspent = blocking(move || ledger.is_unspent(&uid)).await?;
    Ok(Json(Unspent { id, unspent }))
}

#[utoipa::path(get, path = "/v1/ledger/recent", tag = "admin",
    summary = "The last transactions this node decided (at most 256), newest first (operators: the list tells who paid when)",
    security(("operator" = [])),
    responses((status = 200, description = "What was submitted here and its answer.", body = florin_node::api::RecentTxs),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn recent(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<florin_node::api::RecentTxs>, HttpError> {
    Ok(Json(florin_node::api::RecentTxs {
        transactions: st.ledger()?.recent_decided(),
    }))
}

#[utoipa::path(get, path = "/v1/cluster", tag = "ledger",
    summary = "A cluster sentinel's view of its Raft groups: leaders, terms, each replica's address and lag (operators)",
    security(("operator" = [])),
    responses((status = 200, description = "Every group (asked at most every 2 s).", body = florin_node::api::ClusterStatus),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn cluster(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<florin_node::api::ClusterStatus>, HttpError> {
    let view = st.cluster.clone().ok_or_else(|| {
        NodeError::NotFound(NotFound::Other(
            "this node is not a cluster sentinel: it has no groups to show".into(),
        ))
    })?;
    Ok(Json(blocking(move || Ok(view.status())).await?))
}

#[utoipa::path(get, path = "/v1/custody", tag = "health",
    summary = "The key-management network this node signs through: each node up, its address, keys and pools (operators)",
    security(("operator" = [])),
    responses((status = 200, description = "Every custody node (asked at most every 2 s).", body = florin_node::api::CustodyStatus),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn custody(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<florin_node::api::CustodyStatus>, HttpError> {
    let view = st.custody.clone().ok_or_else(|| {
        NodeError::NotFound(NotFound::Other(
            "this node's keys are local: no key-management network to show".into(),
        ))
    })?;
    Ok(Json(blocking(move || Ok(view.status())).await?))
}

#[utoipa::path(get, path = "/v1/ledger/supply", tag = "ledger",
    summary = "The ledger's own books: minted, redeemed, unspent",
    responses((status = 200, description = "The supply.", body = SupplyDoc)))]
async fn supply(State(st): State<AppState>) -> Result<Json<florin_ledger::Supply>, HttpError> {
    let ledger = st.ledger()?;
    Ok(Json(blocking(move || ledger.supply()).await?))
}

/// Unix seconds now.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Checks the request's operator credential (`florin_node::operator`) against the
/// authority's operators; returns the operator's key and the credential.
fn check_operator(
    a: &Authority,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(PublicKey, florin_node::operator::Credential), NodeError> {
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or_else(|| uri.path());
    let now = unix_now();
    let cred = a.operators().admit(
        headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        now,
    )?;
    a.operators()
        .verify(&cred, method.as_str(), path, body, now)
        .map(|key| (key, cred))
}

/// Records an accepted operator credential in a replicated registry (refused as replayed if
/// another sentinel took it already).
async fn use_credential(
    a: &Arc<Authority>,
    cred: florin_node::operator::Credential,
) -> Result<(), NodeError> {
    if !a.is_replicated() {
        return Ok(());
    }
    let a = a.clone();
    blocking(move || a.use_operator_credential(&cred)).await
}

/// A request signed by one of the node's operators (an extractor: refuses with 401 or 403
/// before the handler runs): the operator's key and the body that was signed.
pub struct Operator {
    /// The operator's key.
    pub key: PublicKey,
    /// The request body.
    pub body: Bytes,
}

impl Operator {
    /// The body as JSON of type `T`.
    fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, NodeError> {
        serde_json::from_slice(&self.body).map_err(|e| NodeError::from(BadRequest::Json(e)))
    }
}

impl FromRequest<AppState> for Operator {
    type Rejection = Response;

    async fn from_request(req: Request, st: &AppState) -> Result<Self, Response> {
        let reject = |e: NodeError| HttpError(e).into_response();
        let a = st.authority().map_err(reject)?;
        let (method, uri) = (req.method().clone(), req.uri().clone());
        // The cheap checks (present, well-formed, an operator, in time) before the body is
        // read; the signature over the body after.
        let now = unix_now();
        let cred = a
            .operators()
            .admit(
                req.headers()
                    .get(header::AUTHORIZATION)
                    .map(|v| v.as_bytes()),
                now,
            )
            .map_err(reject)?;
        let body = Bytes::from_request(req, st)
            .await
            .map_err(IntoResponse::into_response)?;
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or_else(|| uri.path());
        let key = a
            .operators()
            .verify(&cred, method.as_str(), path, &body, now)
            .map_err(reject)?;
        use_credential(&a, cred).await.map_err(reject)?;
        Ok(Operator { key, body })
    }
}

#[utoipa::path(post, path = "/v1/ledger/faucet", tag = "ledger",
    summary = "Mint ledger money (open on the devnet; an operator's elsewhere)",
    request_body = LedgerFaucet,
    security((), ("operator" = [])),
    responses((status = 200, description = "The mint, confirmed and durable.", body = LedgerFaucetAnswer),
        (status = 401, description = "An operator credential is needed and missing or malformed.", body = ApiError),
        (status = 403, description = "The faucet is off, or the credential is refused.", body = ApiError)))]
async fn ledger_faucet(
    State(st): State<AppState>,
    Extension(limiter): Extension<Arc<Limiter>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let a = st.authority()?;
    if !a.config().faucet {
        return Err(HttpError(Forbidden::FaucetOff.into()));
    }
    // Open on the devnet; everywhere else minting needs an operator.
    if a.faucet_needs_operator() {
        let (_, cred) = check_operator(&a, &method, &uri, &headers, &body)?;
        use_credential(&a, cred).await?;
    }
    let req: LedgerFaucet =
        serde_json::from_slice(&body).map_err(|e| NodeError::from(BadRequest::Json(e)))?;
    if let Err(e) = limiter.check_key("faucet owner", req.owner.as_bytes()) {
        return Ok(e.into_response());
    }
    if req.amount_cents > st.authority()?.config().max_faucet_cents {
        return Err(HttpError(
            BadRequest::FaucetLimit {
                max_cents: st.authority()?.config().max_faucet_cents,
            }
            .into(),
        ));
    }
    let ledger = st.ledger()?;
    // A wallet address (or hex key), or an encumbrance's text form (`p256:…` for a P-256
    // wallet, e.g. a payment provider's custodial customer).
    // An Ed25519 owner must be a usable key (money minted to anything else is lost); a P-256
    // encumbrance names a key by its hash, which cannot be checked here.
    let owner = match florin_ledger::Encumbrance::parse_text(&req.owner) {
        Some(e) => {
            if e.scheme == florin_ledger::tx::SCHEME_ED25519 {
                florin_crypto::PublicKey(e.key)
                    .validate()
                    .map_err(|source| key_error("owner", source))?;
            }
            e
        }
        None => florin_ledger::Encumbrance::ed25519(&parse_valid_key(&req.owner, "owner")?),
    };
    // Journaled in the authority's registry, apart from the ledger's log (the audit's check).
    let (txid, utxos) =
        florin_node::audit::issue(&st.authority()?, &ledger, owner, req.amount_cents).await?;
    Ok(Json(LedgerFaucetAnswer {
        txid: hex::encode(txid),
        outputs: utxos.iter().map(|u| hex::encode(u.encode())).collect(),
    })
    .into_response())
}

#[utoipa::path(post, path = "/v1/mailbox", tag = "mailbox",
    summary = "Leave a sealed message for an address (a payment's handoff)",
    request_body = MailboxPut,
    responses((status = 200, description = "Its sequence number (`message` is empty).", body = MailboxMessage)))]
async fn mailbox_put(
    State(st): State<AppState>,
    Extension(limiter): Extension<Arc<Limiter>>,
    ApiJson(req): ApiJson<MailboxPut>,
) -> Result<Response, HttpError> {
    let msg =
        hex::decode(&req.message).map_err(|_| NodeError::from(BadRequest::NotHex("message")))?;
    let a = st.authority()?;
    let to = parse_valid_key(&req.to, "to")?;
    // Per recipient: whoever writes, one mailbox takes so many messages a second.
    if let Err(e) = limiter.check_key("recipient", &to.0) {
        return Ok(e.into_response());
    }
    let seq = blocking(move || a.mailbox_put(&to, &msg)).await?;
    Ok(Json(MailboxMessage {
        seq,
        message: String::new(),
    })
    .into_response())
}

#[derive(serde::Deserialize)]
struct After {
    after: Option<u64>,
}

#[utoipa::path(get, path = "/v1/mailbox/{address}", tag = "mailbox",
    summary = "An address's messages after a sequence number",
    params(("address" = String, Path, description = "The recipient's address (`eur1…`) or hex key."),
        ("after" = Option<u64>, Query, description = "Only messages after this sequence number (default 0).")),
    responses((status = 200, description = "At most 1,000 messages, oldest first.", body = MailboxList)))]
async fn mailbox_get(
    State(st): State<AppState>,
    Path(address): Path<String>,
    Query(q): Query<After>,
) -> Result<Json<MailboxList>, HttpError> {
    let a = st.authority()?;
    let to = parse_key(&address, "address")?;
    let list = blocking(move || a.mailbox_get(&to, q.after.unwrap_or(0))).await?;
    Ok(Json(MailboxList {
        messages: list
            .into_iter()
            .map(|(seq, m)| MailboxMessage {
                seq,
                message: hex::encode(m),
            })
            .collect(),
    }))
}

#[utoipa::path(post, path = "/v1/admin/blacklist", tag = "admin",
    summary = "Take a token out of circulation",
    request_body = AdminBlacklist, security(("operator" = [])),
    responses((status = 200, description = "The entry recorded.", body = AdminEntry),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_blacklist(
    State(st): State<AppState>,
    op: Operator,
) -> Result<Json<AdminEntry>, HttpError> {
    let req: AdminBlacklist = op.json()?;
    let serial = parse_serial(&req.serial)?;
    let a = st.authority()?;
    Ok(Json(
        blocking(move || a.blacklist_by(&serial, Some(&op.key), &req.reason)).await?,
    ))
}

#[utoipa::path(get, path = "/v1/admin/blacklist", tag = "admin",
    summary = "Every blacklisted token", security(("operator" = [])),
    responses((status = 200, description = "The blacklist.", body = Vec<AdminEntry>),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_blacklist_list(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<Vec<AdminEntry>>, HttpError> {
    let a = st.authority()?;
    Ok(Json(blocking(move || a.blacklisted()).await?))
}

#[utoipa::path(post, path = "/v1/admin/revoke", tag = "admin",
    summary = "Revoke a wallet key: it may no longer deposit or withdraw",
    request_body = AdminRevoke, security(("operator" = [])),
    responses((status = 200, description = "The entry recorded.", body = AdminEntry),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_revoke(
    State(st): State<AppState>,
    op: Operator,
) -> Result<Json<AdminEntry>, HttpError> {
    let req: AdminRevoke = op.json()?;
    let key = parse_key(&req.key, "key")?;
    let a = st.authority()?;
    Ok(Json(
        blocking(move || a.revoke(&key, Some(&op.key), &req.reason)).await?,
    ))
}

#[utoipa::path(post, path = "/v1/admin/unrevoke", tag = "admin",
    summary = "Lift a key's revocation",
    request_body = AdminRevoke, security(("operator" = [])),
    responses((status = 200, description = "The entry recorded.", body = AdminEntry),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_unrevoke(
    State(st): State<AppState>,
    op: Operator,
) -> Result<Json<AdminEntry>, HttpError> {
    let req: AdminRevoke = op.json()?;
    let key = parse_key(&req.key, "key")?;
    let a = st.authority()?;
    Ok(Json(
        blocking(move || a.unrevoke(&key, Some(&op.key), &req.reason)).await?,
    ))
}

#[utoipa::path(get, path = "/v1/admin/revoked", tag = "admin",
    summary = "Every revoked key", security(("operator" = [])),
    responses((status = 200, description = "The revoked keys.", body = Vec<AdminEntry>),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_revoked_list(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<Vec<AdminEntry>>, HttpError> {
    let a = st.authority()?;
    Ok(Json(blocking(move || a.revoked()).await?))
}

#[utoipa::path(get, path = "/v1/admin/log", tag = "admin",
    summary = "The operators' audit trail", security(("operator" = [])),
    responses((status = 200, description = "Every operator action, oldest first.", body = Vec<AdminLogEntry>),
        (status = 401, description = "No operator credential, or a malformed one.", body = ApiError),
        (status = 403, description = "The credential is refused.", body = ApiError)))]
async fn admin_log(
    State(st): State<AppState>,
    _op: Operator,
) -> Result<Json<Vec<AdminLogEntry>>, HttpError> {
    let a = st.authority()?;
    Ok(Json(blocking(move || a.admin_log()).await?))
}

/// The operator routes (each needs an operator credential: 401 without, 403 refused).
pub const ADMIN_ROUTES: [(&str, &str); 9] = [
    ("GET", "/v1/ledger/recent"),
    ("GET", "/v1/cluster"),
    ("GET", "/v1/custody"),
    ("POST", "/v1/admin/blacklist"),
    ("GET", "/v1/admin/blacklist"),
    ("POST", "/v1/admin/revoke"),
    ("POST", "/v1/admin/unrevoke"),
    ("GET", "/v1/admin/revoked"),
    ("GET", "/v1/admin/log"),
];

/// A route's handlers with its body limit (`max` bytes).
pub fn limited<S: Clone + Send + Sync + 'static>(
    max: usize,
    route: MethodRouter<S>,
) -> MethodRouter<S> {
    route.layer(from_fn_with_state(max, edge::limit_body))
}

/// A route that validates transactions: its body limit (`max` bytes) and, outside that, the
/// gate of its caller's budget of validation work ([`edge::work_gate`]), so a caller that has
/// spent it is refused before its body is read.
pub fn validating<S: Clone + Send + Sync + 'static>(
    limiter: &Arc<Limiter>,
    max: usize,
    route: MethodRouter<S>,
) -> MethodRouter<S> {
    limited(max, route).layer(from_fn_with_state(limiter.clone(), edge::work_gate))
}

/// 404 `not_found` for a path no route serves.
async fn no_route() -> Response {
    EdgeError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response()
}

/// The API's routes and their OpenAPI document, built from the same list, before the state
/// and the outer layers.
fn api(limiter: &Arc<Limiter>) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use crate::openapi::wrap;
    use limits::*;
    use utoipa_axum::routes;
    let small = |r| limited(SMALL, r);
    let (router, doc) = utoipa_axum::router::OpenApiRouter::<AppState>::new()
        .routes(wrap(routes!(health), small))
        .routes(wrap(routes!(ready), small))
        .routes(wrap(routes!(crate::observe::metrics), small))
        .routes(wrap(routes!(info), small))
        .routes(wrap(routes!(deposit), |r| validating(limiter, DEPOSIT, r)))
        .routes(wrap(routes!(fraud), small))
        .routes(wrap(routes!(token), small))
        .routes(wrap(routes!(submit_tx), |r| {
            validating(limiter, TRANSACTION, r)
        }))
        .routes(wrap(routes!(submit_batch), |r| {
            validating(limiter, BATCH, r)
        }))
        .routes(wrap(routes!(tx_status), small))
        .routes(wrap(routes!(tx_confirmation), small))
        .routes(wrap(routes!(unspent), small))
        .routes(wrap(routes!(supply), small))
        .routes(wrap(routes!(recent), small))
        .routes(wrap(routes!(cluster), small))
        .routes(wrap(routes!(custody), small))
        .routes(wrap(routes!(ledger_faucet), small))
        .routes(wrap(routes!(withdraw), |r| {
            validating(limiter, WITHDRAW, r)
        }))
        .routes(wrap(routes!(audit_books), small))
        .routes(wrap(routes!(mailbox_put), |r| limited(MAILBOX, r)))
        .routes(wrap(routes!(mailbox_get), small))
        .routes(wrap(routes!(admin_blacklist, admin_blacklist_list), small))
        .routes(wrap(routes!(admin_revoke), small))
        .routes(wrap(routes!(admin_unrevoke), small))
        .routes(wrap(routes!(admin_revoked_list), small))
        .routes(wrap(routes!(admin_log), small))
        .split_for_parts();
    (
        router,
        crate::openapi::finish(doc, crate::openapi::Api::Node),
    )
}

/// The node API's OpenAPI 3.1 document (served at `/openapi.json`; `docs/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api(&Limiter::new(RateLimits::default())).1
}

/// The API routes. Every route has its body limit ([`limits`]); every request counts against
/// its client address's rate (`state.limits`); every error, axum's own rejections included,
/// is answered in the JSON envelope.
pub fn router(state: AppState) -> Router {
    let limiter = Limiter::new(state.limits);
    let (mut router, doc) = api(&limiter);
    for (path, route) in crate::openapi::routes(&doc)
        .into_iter()
        .chain(crate::console::routes())
    {
        router = router.route(path, limited(limits::SMALL, route));
    }
    router
        .fallback(no_route)
        // The route's own limit (above) has bounded and buffered the body already.
        .layer(DefaultBodyLimit::disable())
        .layer(Extension(limiter.clone()))
        .layer(from_fn_with_state(limiter, edge::limit_rate))
        .layer(from_fn(edge::envelope_layer))
        .with_state(state)
}

/// A transaction's canonical bytes (`application/octet-stream`; for a batch, its frames).
pub struct TxBytes;

impl utoipa::PartialSchema for TxBytes {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .content_media_type("application/octet-stream")
            .into()
    }
}

impl utoipa::ToSchema for TxBytes {}

/// The ledger's own books, as `GET /v1/ledger/supply` answers them ([`florin_ledger::Supply`],
/// whose crate keeps no API types; a test checks the two have the same fields).
#[derive(utoipa::ToSchema)]
#[schema(as = Supply)]
#[allow(dead_code)]
pub struct SupplyDoc {
    /// Cents ever minted.
    minted_cents: u64,
    /// Cents ever redeemed.
    redeemed_cents: u64,
    /// Cents in unspent outputs.
    unspent_cents: u64,
    /// Unspent outputs.
    unspent_count: u64,
}

/// Serves the API on `listener` until `shutdown` resolves (plain HTTP, default limits; see
/// [`serve_with`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, state, ServeOptions::default(), shutdown).await
}

/// Serves the API on `listener` with `options` (TLS, timeouts, connection cap) until
/// `shutdown` resolves; handlers see the peer as `ConnectInfo<SocketAddr>`.
pub async fn serve_with(
    listener: TcpListener,
    state: AppState,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::server::serve_router(listener, router(state), options, shutdown).await
}

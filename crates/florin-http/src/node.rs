//! The node's HTTP/JSON API (axum). Handlers are thin: parse, call the service on a blocking
//! thread (storage and signature checks are CPU and disk work), map errors to status codes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;

use florin_crypto::PublicKey;
use florin_node::api::{
    ApiError, DepositRequest, DepositResponse, FaucetResponse, Health, Info, LedgerFaucet,
    LedgerFaucetAnswer, LedgerTxStatus, MailboxList, MailboxMessage, MailboxPut, SubmitBatch,
    SubmitBatchAnswer, SubmitTx, Unspent, WithdrawRequest,
};
use florin_node::bridge::settle_credit;
use florin_node::{Authority, Ledger, NodeError, TxStatus};
use florin_token::Token;

/// What the API serves: the token authority and, when running, the ledger.
#[derive(Clone)]
pub struct AppState {
    /// The token authority (a cluster's extra sentinels run none: they serve the ledger).
    pub authority: Option<Arc<Authority>>,
    /// The ledger service.
    pub ledger: Option<Arc<Ledger>>,
}

impl AppState {
    fn authority(&self) -> Result<Arc<Authority>, NodeError> {
        self.authority.clone().ok_or_else(|| {
            NodeError::NotFound(
                "this sentinel runs no token authority: use the cluster's api address".into(),
            )
        })
    }

    fn ledger(&self) -> Result<Arc<Ledger>, NodeError> {
        self.ledger
            .clone()
            .ok_or_else(|| NodeError::NotFound("this node runs no ledger".into()))
    }
}

/// Largest request body: a deposit of ~100,000 tokens.
const MAX_BODY: usize = 256 * 1024 * 1024;

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
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Forbidden(_) => StatusCode::FORBIDDEN,
            NodeError::Signer(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = ApiError {
            code: e.code().into(),
            error: e.to_string(),
        };
        (status, Json(body)).into_response()
    }
}

async fn blocking<T, F>(f: F) -> Result<T, NodeError>
where
    F: FnOnce() -> Result<T, NodeError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NodeError::Io(format!("worker failed: {e}")))?
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

async fn info(State(st): State<AppState>) -> Result<Json<Info>, HttpError> {
    let a = st.authority()?;
    Ok(Json(Info {
        authority: a.public_key().to_address(),
        version: env!("CARGO_PKG_VERSION").into(),
        faucet: a.config().faucet,
        max_faucet_cents: a.config().max_faucet_cents,
    }))
}

/// A deposit's depositor (an address or hex key, a usable one) and tokens (hex of their
/// encoding; one that does not decode becomes an `Err`, reported back as refused). Refuses
/// more tokens than the authority takes in one deposit before decoding any.
pub fn parse_deposit(
    authority: &Authority,
    depositor: &str,
    tokens_hex: &[String],
) -> Result<(PublicKey, Vec<Result<Token, String>>), NodeError> {
    let depositor = PublicKey::parse_valid(depositor)
        .map_err(|e| NodeError::BadRequest(format!("depositor: {e}")))?;
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

async fn deposit(
    State(st): State<AppState>,
    Json(req): Json<DepositRequest>,
) -> Result<Json<DepositResponse>, HttpError> {
    if req.tokens.is_empty() {
        return Err(HttpError(NodeError::BadRequest(
            "a deposit needs at least one token".into(),
        )));
    }
    let a = st.authority()?;
    let (depositor, tokens) = parse_deposit(&a, &req.depositor, &req.tokens)?;
    if !req.credit {
        let results = blocking(move || a.deposit(&depositor, &tokens)).await?;
        return Ok(Json(DepositResponse {
            results,
            credit: None,
        }));
    }
    let ledger = st.ledger()?;
    let (results, intent) = blocking(move || a.deposit_credit(&depositor, &tokens)).await?;
    let credit = match intent {
        None => None,
        Some(intent) => Some(settle_credit(&st.authority()?, &ledger, intent).await?),
    };
    Ok(Json(DepositResponse { results, credit }))
}

async fn withdraw(
    State(st): State<AppState>,
    Json(req): Json<WithdrawRequest>,
) -> Result<Json<FaucetResponse>, HttpError> {
    let ledger = st.ledger()?;
    let bytes = hex::decode(&req.tx).map_err(|_| NodeError::BadRequest("tx is not hex".into()))?;
    let tx = florin_ledger::Transaction::decode(&bytes)
        .map_err(|e| NodeError::BadRequest(format!("malformed transaction: {e}")))?;
    let handshake = hex32(&req.handshake, "handshake")?;
    let a = st.authority()?;
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
        let auth = match (&req.key, &req.signature) {
            (Some(k), Some(s)) => Some((k.as_str(), s.as_str())),
            _ => None,
        };
        a.withdraw(
            &tx,
            req.output,
            &req.recipient,
            handshake,
            auth,
            confirmed,
            unspent,
        )
    })
    .await?;
    Ok(Json(FaucetResponse {
        tokens: tokens.iter().map(|t| hex::encode(t.encode())).collect(),
    }))
}

async fn audit_books(
    State(st): State<AppState>,
) -> Result<Json<florin_node::bridge::Audit>, HttpError> {
    let ledger = st.ledger()?;
    let a = st.authority()?;
    Ok(Json(
        blocking(move || florin_node::audit::full_audit(&a, &ledger)).await?,
    ))
}

async fn fraud(State(st): State<AppState>) -> Result<Response, HttpError> {
    let a = st.authority()?;
    let list = blocking(move || a.fraud_list()).await?;
    Ok(Json(list).into_response())
}

async fn token(
    State(st): State<AppState>,
    Path(serial): Path<String>,
) -> Result<Response, HttpError> {
    let a = st.authority()?;
    let info = blocking(move || a.token(&serial)).await?;
    Ok(Json(info).into_response())
}

fn hex32(s: &str, what: &str) -> Result<[u8; 32], NodeError> {
    hex::decode(s)
        .ok()
        .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
        .ok_or_else(|| NodeError::BadRequest(format!("{what} must be 64 hex digits")))
}

/// Most transactions in one batch submission.
pub const MAX_SUBMIT_BATCH: usize = 4096;

fn is_binary(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/octet-stream"))
}

fn decode_tx(bytes: &[u8]) -> Result<florin_ledger::Transaction, NodeError> {
    florin_ledger::Transaction::decode(bytes)
        .map_err(|e| NodeError::BadRequest(format!("malformed transaction: {e}")))
}

fn decode_hex_tx(hex_tx: &str) -> Result<florin_ledger::Transaction, NodeError> {
    let bytes = hex::decode(hex_tx).map_err(|_| NodeError::BadRequest("tx is not hex".into()))?;
    decode_tx(&bytes)
}

/// One transaction: JSON `{"tx": hex}`, or its canonical bytes as `application/octet-stream`.
async fn submit_tx(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<LedgerTxStatus>, HttpError> {
    let ledger = st.ledger()?;
    let tx = if is_binary(&headers) {
        decode_tx(&body)?
    } else {
        let req: SubmitTx = serde_json::from_slice(&body)
            .map_err(|e| NodeError::BadRequest(format!("bad JSON: {e}")))?;
        decode_hex_tx(&req.tx)?
    };
    let (txid, status) = ledger.submit(tx).await?;
    Ok(Json(LedgerTxStatus::of(&txid, &status)))
}

/// Splits a binary batch: frames of a little-endian `u32` length and that many bytes.
fn split_frames(mut body: &[u8]) -> Result<Vec<florin_ledger::Transaction>, NodeError> {
    let mut txs = Vec::new();
    while !body.is_empty() {
        if txs.len() == MAX_SUBMIT_BATCH {
            return Err(NodeError::BadRequest(format!(
                "more than {MAX_SUBMIT_BATCH} transactions in one batch"
            )));
        }
        let (len, rest) = body
            .split_first_chunk::<4>()
            .ok_or_else(|| NodeError::BadRequest("truncated frame length".into()))?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(NodeError::BadRequest(format!(
                "frame {} claims {len} bytes, {} remain",
                txs.len(),
                rest.len()
            )));
        }
        txs.push(decode_tx(&rest[..len]).map_err(|e| {
            NodeError::BadRequest(format!("transaction {} in the batch: {e}", txs.len()))
        })?);
        body = &rest[len..];
    }
    Ok(txs)
}

/// Many transactions in one request (a payment service provider forwarding its users'):
/// JSON `{"txs": [hex, ...]}` or length-prefixed frames as `application/octet-stream`. All are
/// decoded before any is submitted: one malformed transaction refuses the whole request.
async fn submit_batch(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<SubmitBatchAnswer>, HttpError> {
    let ledger = st.ledger()?;
    let txs = if is_binary(&headers) {
        split_frames(&body)?
    } else {
        let req: SubmitBatch = serde_json::from_slice(&body)
            .map_err(|e| NodeError::BadRequest(format!("bad JSON: {e}")))?;
        if req.txs.len() > MAX_SUBMIT_BATCH {
            return Err(HttpError(NodeError::BadRequest(format!(
                "more than {MAX_SUBMIT_BATCH} transactions in one batch"
            ))));
        }
        req.txs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                decode_hex_tx(t).map_err(|e| {
                    NodeError::BadRequest(format!("transaction {i} in the batch: {e}"))
                })
            })
            .collect::<Result<_, _>>()?
    };
    let answers = ledger.submit_many(txs).await?;
    Ok(Json(SubmitBatchAnswer {
        results: answers
            .iter()
            .map(|(t, s)| LedgerTxStatus::of(t, s))
            .collect(),
    }))
}

async fn tx_status(
    State(st): State<AppState>,
    Path(txid): Path<String>,
) -> Result<Json<LedgerTxStatus>, HttpError> {
    let ledger = st.ledger()?;
    let id = hex32(&txid, "txid")?;
    let status = blocking(move || ledger.status(&id)).await?;
    match status {
        Some(s) => Ok(Json(LedgerTxStatus::of(&id, &s))),
        None => Err(HttpError(NodeError::NotFound(format!(
            "transaction {txid} is unknown"
        )))),
    }
}

async fn unspent(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Unspent>, HttpError> {
    let ledger = st.ledger()?;
    let uid = hex32(&id, "id")?;
    let unspent = blocking(move || ledger.is_unspent(&uid)).await?;
    Ok(Json(Unspent { id, unspent }))
}

async fn supply(State(st): State<AppState>) -> Result<Json<florin_ledger::Supply>, HttpError> {
    let ledger = st.ledger()?;
    Ok(Json(blocking(move || ledger.supply()).await?))
}

async fn ledger_faucet(
    State(st): State<AppState>,
    Json(req): Json<LedgerFaucet>,
) -> Result<Json<LedgerFaucetAnswer>, HttpError> {
    if !st.authority()?.config().faucet {
        return Err(HttpError(NodeError::Forbidden(
            "the faucet is off on this node".into(),
        )));
    }
    if req.amount_cents > st.authority()?.config().max_faucet_cents {
        return Err(HttpError(NodeError::BadRequest(format!(
            "faucet gives at most {} cents per request",
            st.authority()?.config().max_faucet_cents
        ))));
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
                    .map_err(|e| NodeError::BadRequest(format!("owner: {e}")))?;
            }
            e
        }
        None => florin_ledger::Encumbrance::ed25519(
            &florin_crypto::PublicKey::parse_valid(&req.owner)
                .map_err(|e| NodeError::BadRequest(format!("owner: {e}")))?,
        ),
    };
    // Journaled in the authority's registry, apart from the ledger's log (the audit's check).
    let (txid, utxos) =
        florin_node::audit::issue(&st.authority()?, &ledger, owner, req.amount_cents).await?;
    Ok(Json(LedgerFaucetAnswer {
        txid: hex::encode(txid),
        outputs: utxos.iter().map(|u| hex::encode(u.encode())).collect(),
    }))
}

async fn mailbox_put(
    State(st): State<AppState>,
    Json(req): Json<MailboxPut>,
) -> Result<Json<MailboxMessage>, HttpError> {
    let msg = hex::decode(&req.message)
        .map_err(|_| NodeError::BadRequest("message is not hex".into()))?;
    let a = st.authority()?;
    let seq = blocking(move || a.mailbox_put(&req.to, &msg)).await?;
    Ok(Json(MailboxMessage {
        seq,
        message: String::new(),
    }))
}

#[derive(serde::Deserialize)]
struct After {
    after: Option<u64>,
}

async fn mailbox_get(
    State(st): State<AppState>,
    Path(address): Path<String>,
    Query(q): Query<After>,
) -> Result<Json<MailboxList>, HttpError> {
    let a = st.authority()?;
    let list = blocking(move || a.mailbox_get(&address, q.after.unwrap_or(0))).await?;
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

/// The API routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/info", get(info))
        .route("/v1/deposit", post(deposit))
        .route("/v1/fraud", get(fraud))
        .route("/v1/tokens/{serial}", get(token))
        .route("/v1/ledger/transactions", post(submit_tx))
        .route("/v1/ledger/batch", post(submit_batch))
        .route("/v1/ledger/transactions/{txid}", get(tx_status))
        .route("/v1/ledger/unspent/{id}", get(unspent))
        .route("/v1/ledger/supply", get(supply))
        .route("/v1/ledger/faucet", post(ledger_faucet))
        .route("/v1/withdraw", post(withdraw))
        .route("/v1/audit", get(audit_books))
        .route("/v1/mailbox", post(mailbox_put))
        .route("/v1/mailbox/{address}", get(mailbox_get))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

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
use florin_node::bridge::{settle_credit, WithdrawAuth};
use florin_node::error::{BadRequest, Forbidden, NotFound};
use florin_node::{Authority, Ledger, NodeError, TxStatus};
use florin_token::{Serial, Token};

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
            NodeError::Full(_) => StatusCode::TOO_MANY_REQUESTS,
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
        .map_err(|e| NodeError::task("worker", e))?
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

async fn deposit(
    State(st): State<AppState>,
    Json(req): Json<DepositRequest>,
) -> Result<Json<DepositResponse>, HttpError> {
    if req.tokens.is_empty() {
        return Err(HttpError(BadRequest::EmptyDeposit.into()));
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
    let serial = parse_serial(&serial)?;
    let info = blocking(move || a.token(&serial)).await?;
    Ok(Json(info).into_response())
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
        .map_err(|e| NodeError::BadRequest(BadRequest::Transaction(e)))
}

fn decode_hex_tx(hex_tx: &str) -> Result<florin_ledger::Transaction, NodeError> {
    let bytes = hex::decode(hex_tx).map_err(|_| BadRequest::NotHex("tx"))?;
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
        let req: SubmitTx =
            serde_json::from_slice(&body).map_err(|e| NodeError::from(BadRequest::Json(e)))?;
        decode_hex_tx(&req.tx)?
    };
    let (txid, status) = ledger.submit(tx).await?;
    Ok(Json(LedgerTxStatus::of(&txid, &status)))
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
async fn submit_batch(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<SubmitBatchAnswer>, HttpError> {
    let ledger = st.ledger()?;
    let txs = if is_binary(&headers) {
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
    let id = parse_hex32(&txid, "txid")?;
    let status = blocking(move || ledger.status(&id)).await?;
    match status {
        Some(s) => Ok(Json(LedgerTxStatus::of(&id, &s))),
        None => Err(HttpError(NotFound::Transaction(id).into())),
    }
}

async fn unspent(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Unspent>, HttpError> {
    let ledger = st.ledger()?;
    let uid = parse_hex32(&id, "id")?;
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
        return Err(HttpError(Forbidden::FaucetOff.into()));
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
    }))
}

async fn mailbox_put(
    State(st): State<AppState>,
    Json(req): Json<MailboxPut>,
) -> Result<Json<MailboxMessage>, HttpError> {
    let msg =
        hex::decode(&req.message).map_err(|_| NodeError::from(BadRequest::NotHex("message")))?;
    let a = st.authority()?;
    let to = parse_valid_key(&req.to, "to")?;
    let seq = blocking(move || a.mailbox_put(&to, &msg)).await?;
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

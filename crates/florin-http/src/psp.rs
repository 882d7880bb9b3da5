//! The provider's HTTP/JSON API (axum): thin handlers over [`Psp`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;

use florin_node::api::{ApiError, Health};
use florin_node::psp::api::{
    AccountList, AccountView, Fund, History, OpenAccount, PayReceipt, PayRequest, PayeeView,
    PspInfo, ReceiveAnswer,
};
use florin_node::psp::auth::{CallerRequest, AUTH_HEADER};
use florin_node::psp::{Psp, PspError};

/// A provider error as an HTTP answer: a status code and an [`ApiError`] body.
#[derive(Debug)]
pub struct PspHttpError(pub PspError);

impl From<PspError> for PspHttpError {
    fn from(e: PspError) -> Self {
        PspHttpError(e)
    }
}

/// The status code a provider error is answered with.
pub fn status_of(e: &PspError) -> StatusCode {
    match e {
        PspError::BadRequest(_) => StatusCode::BAD_REQUEST,
        PspError::NotFound(_) => StatusCode::NOT_FOUND,
        PspError::Exists(_) | PspError::InsufficientFunds { .. } => StatusCode::CONFLICT,
        PspError::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
        PspError::Custody(_) | PspError::Unresolved(_) => StatusCode::SERVICE_UNAVAILABLE,
        PspError::Unreachable(_) => StatusCode::BAD_GATEWAY,
        PspError::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        PspError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        PspError::Forbidden(_) => StatusCode::FORBIDDEN,
        // A kind added later: the service failed.
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for PspHttpError {
    fn into_response(self) -> Response {
        let PspHttpError(e) = self;
        let body = ApiError {
            code: e.code().into(),
            error: e.to_string(),
        };
        (status_of(&e), Json(body)).into_response()
    }
}

type St = State<Arc<Psp>>;

/// A JSON body, or the typed 400 every other bad input gets (instead of axum's plain text).
fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, PspError> {
    b.map(|Json(v)| v)
        .map_err(|e| PspError::BadRequest(format!("bad JSON body: {}", e.body_text())))
}

/// A signed body's JSON (parsed after its signature was checked).
fn json<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, PspError> {
    serde_json::from_slice(b).map_err(|e| PspError::BadRequest(format!("bad JSON body: {e}")))
}

/// The request as its signature covers it.
fn caller<'a>(
    method: &'a str,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    body: &'a [u8],
) -> CallerRequest<'a> {
    CallerRequest {
        method,
        path: uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"),
        body,
        header: headers.get(AUTH_HEADER).and_then(|v| v.to_str().ok()),
    }
}

async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

async fn info(State(p): St) -> Result<Json<PspInfo>, PspHttpError> {
    Ok(Json(p.info()?))
}

async fn open(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<AccountView>, PspHttpError> {
    let req: OpenAccount = json(&raw)?;
    let customer = req
        .customer_key
        .as_deref()
        .ok_or_else(|| PspError::BadRequest("customer_key is required".into()))?;
    let key = p.authenticate_opening(&req.name, customer, &caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.open_account(&req.name, &key).await?))
}

async fn list(State(p): St) -> Result<Json<AccountList>, PspHttpError> {
    Ok(Json(AccountList {
        accounts: p.accounts()?,
    }))
}

async fn account(
    State(p): St,
    Path(name): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Json<AccountView>, PspHttpError> {
    p.authenticate_customer(&name, &caller("GET", &uri, &headers, &[]))?;
    Ok(Json(p.account(&name)?))
}

#[derive(Deserialize)]
struct PeerQuery {
    peer: Option<String>,
}

async fn payee(
    State(p): St,
    Path(name): Path<String>,
    Query(q): Query<PeerQuery>,
) -> Result<Json<PayeeView>, PspHttpError> {
    Ok(Json(p.payee(&name, q.peer.as_deref()).await?))
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn history(
    State(p): St,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Json<History>, PspHttpError> {
    p.authenticate_customer(&name, &caller("GET", &uri, &headers, &[]))?;
    let limit = q.limit.unwrap_or(1000).min(1000);
    Ok(Json(History {
        entries: p.history(&name, limit)?,
    }))
}

async fn fund(
    State(p): St,
    Path(name): Path<String>,
    req: Result<Json<Fund>, JsonRejection>,
) -> Result<Json<AccountView>, PspHttpError> {
    Ok(Json(p.fund(&name, body(req)?.amount_cents).await?))
}

async fn pay(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<PayReceipt>, PspHttpError> {
    let req: PayRequest = json(&raw)?;
    p.authenticate_customer(&req.from, &caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.pay(req).await?))
}

async fn receive(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<ReceiveAnswer>, PspHttpError> {
    // Who calls first: an unknown or unauthenticated caller learns nothing of the body.
    let peer = p.authenticate_peer(&caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.receive(json(&raw)?, &peer).await?))
}

/// The provider's routes.
pub fn router(psp: Arc<Psp>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/psp/info", get(info))
        .route("/v1/psp/accounts", post(open).get(list))
        .route("/v1/psp/accounts/{name}", get(account))
        .route("/v1/psp/payees/{name}", get(payee))
        .route("/v1/psp/accounts/{name}/history", get(history))
        .route("/v1/psp/accounts/{name}/faucet", post(fund))
        .route("/v1/psp/pay", post(pay))
        .route(florin_node::psp::RECEIVE_PATH, post(receive))
        .with_state(psp)
}

/// Serves the provider on `listener` until `shutdown` resolves, resolving pending payments
/// and owed acknowledgements in the background (at start, then every 2 s).
pub async fn serve(
    listener: TcpListener,
    psp: Arc<Psp>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = psp.spawn_upkeep(Duration::from_secs(2));
    let r = axum::serve(listener, router(psp))
        .with_graceful_shutdown(shutdown)
        .await;
    upkeep.abort();
    // Wait until the task is gone, so the books are closed when this returns.
    let _ = upkeep.await;
    r
}

//! The provider's HTTP/JSON API (axum): thin handlers over [`Psp`].

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::server::ServeOptions;

use florin_node::api::{ApiError, Health};
use florin_node::psp::api::{
    AccountList, AccountView, Fund, History, OpenAccount, PayReceipt, PayRequest, PspInfo, Receive,
    ReceiveAnswer,
};
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
    req: Result<Json<OpenAccount>, JsonRejection>,
) -> Result<Json<AccountView>, PspHttpError> {
    Ok(Json(p.open_account(&body(req)?.name).await?))
}

async fn list(State(p): St) -> Result<Json<AccountList>, PspHttpError> {
    Ok(Json(AccountList {
        accounts: p.accounts()?,
    }))
}

async fn account(
    State(p): St,
    Path(name): Path<String>,
) -> Result<Json<AccountView>, PspHttpError> {
    Ok(Json(p.account(&name)?))
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn history(
    State(p): St,
    Path(name): Path<String>,
    Query(q): Query<Limit>,
) -> Result<Json<History>, PspHttpError> {
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
    req: Result<Json<PayRequest>, JsonRejection>,
) -> Result<Json<PayReceipt>, PspHttpError> {
    Ok(Json(p.pay(body(req)?).await?))
}

async fn receive(
    State(p): St,
    req: Result<Json<Receive>, JsonRejection>,
) -> Result<Json<ReceiveAnswer>, PspHttpError> {
    Ok(Json(p.receive(body(req)?).await?))
}

/// The provider's routes.
pub fn router(psp: Arc<Psp>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/psp/info", get(info))
        .route("/v1/psp/accounts", post(open).get(list))
        .route("/v1/psp/accounts/{name}", get(account))
        .route("/v1/psp/accounts/{name}/history", get(history))
        .route("/v1/psp/accounts/{name}/faucet", post(fund))
        .route("/v1/psp/pay", post(pay))
        .route("/v1/psp/receive", post(receive))
        .with_state(psp)
}

/// Serves the provider on `listener` until `shutdown` resolves (plain HTTP, default limits; see
/// [`serve_with`]), resolving pending payments and owed acknowledgements in the background (at
/// start, then every 2 s).
pub async fn serve(
    listener: TcpListener,
    psp: Arc<Psp>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, psp, ServeOptions::default(), shutdown).await
}

/// [`serve`] with `options` (TLS, timeouts, connection cap).
pub async fn serve_with(
    listener: TcpListener,
    psp: Arc<Psp>,
    options: ServeOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = psp.spawn_upkeep(Duration::from_secs(2));
    let r = crate::server::serve_router(listener, router(psp), options, shutdown).await;
    upkeep.abort();
    // Wait until the task is gone, so the books are closed when this returns.
    let _ = upkeep.await;
    r
}

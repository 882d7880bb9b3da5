//! The HTTP/JSON API (axum). Handlers are thin: parse, call the service on a blocking thread
//! (storage and signature checks are CPU and disk work), map errors to status codes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tokio::net::TcpListener;

use crate::api::{
    ApiError, DepositRequest, DepositResponse, FaucetRequest, FaucetResponse, Health, Info,
};
use crate::authority::Authority;
use crate::error::NodeError;

/// Largest request body: a deposit of ~100,000 tokens.
const MAX_BODY: usize = 256 * 1024 * 1024;

impl IntoResponse for NodeError {
    fn into_response(self) -> Response {
        let status = match &self {
            NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Forbidden(_) => StatusCode::FORBIDDEN,
            NodeError::Signer(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = ApiError {
            code: self.code().into(),
            error: self.to_string(),
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

async fn info(State(a): State<Arc<Authority>>) -> Json<Info> {
    Json(Info {
        authority: a.public_key().to_address(),
        version: env!("CARGO_PKG_VERSION").into(),
        faucet: a.config().faucet,
        max_faucet_cents: a.config().max_faucet_cents,
    })
}

async fn faucet(
    State(a): State<Arc<Authority>>,
    Json(req): Json<FaucetRequest>,
) -> Result<Json<FaucetResponse>, NodeError> {
    let tokens =
        blocking(move || a.faucet(&req.recipient, req.amount_cents, &req.handshake)).await?;
    Ok(Json(FaucetResponse {
        tokens: tokens.iter().map(|t| hex::encode(t.encode())).collect(),
    }))
}

async fn deposit(
    State(a): State<Arc<Authority>>,
    Json(req): Json<DepositRequest>,
) -> Result<Json<DepositResponse>, NodeError> {
    if req.tokens.is_empty() {
        return Err(NodeError::BadRequest(
            "a deposit needs at least one token".into(),
        ));
    }
    let results = blocking(move || a.deposit(&req.depositor, &req.tokens)).await?;
    Ok(Json(DepositResponse { results }))
}

async fn fraud(State(a): State<Arc<Authority>>) -> Result<Response, NodeError> {
    let list = blocking(move || a.fraud_list()).await?;
    Ok(Json(list).into_response())
}

async fn token(
    State(a): State<Arc<Authority>>,
    Path(serial): Path<String>,
) -> Result<Response, NodeError> {
    let info = blocking(move || a.token(&serial)).await?;
    Ok(Json(info).into_response())
}

/// The API routes.
pub fn router(authority: Arc<Authority>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/info", get(info))
        .route("/v1/faucet", post(faucet))
        .route("/v1/deposit", post(deposit))
        .route("/v1/fraud", get(fraud))
        .route("/v1/tokens/{serial}", get(token))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(authority)
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    authority: Arc<Authority>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(authority).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

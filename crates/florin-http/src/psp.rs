//! The provider's HTTP/JSON API (axum): thin handlers over [`Psp`].

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::server::ServeOptions;

use florin_node::api::{ApiError, Health};
use florin_node::psp::api::{
    AccountList, AccountView, Fund, History, OpenAccount, PayReceipt, PayRequest, PayeeView,
    PspInfo, ReceiveAnswer,
};
use florin_node::psp::auth::{CallerRequest, AUTH_HEADER};
use florin_node::psp::{Psp, PspError};

use crate::edge::{self, EdgeError, Limiter, RateLimits, Work};
use crate::node::{limited, validating};

/// Body limits of the provider's routes, in bytes (over them: 413 `too_large`).
pub mod limits {
    /// `POST /v1/psp/receive`: at most [`florin_node::psp::MAX_RECEIVE`] (256) UTXOs of 73
    /// bytes, as hex, each with a key handed over, and the payer's provider.
    pub const RECEIVE: usize = florin_node::psp::MAX_RECEIVE * (2 * 73 + 3 + HANDOVER) + 16 * 1024;
    /// One key handed over with an output, in JSON: two 64-hex ids, an account name, a
    /// 64-hex `r2` and the field names.
    pub const HANDOVER: usize = 300;
    /// Every other route: a name, an amount, a payment's few fields.
    pub const SMALL: usize = 16 * 1024;
}

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
        (status_of(&e), Json(ApiError::new(e.code(), e.to_string()))).into_response()
    }
}

type St = State<Arc<Psp>>;

/// A signed body's JSON (parsed after its signature was checked).
///
/// A signed route keeps its body as bytes (the signature covers them), so it checks here what
/// [`ApiJson`] checks elsewhere: `Content-Type: application/json` (415 otherwise) and a body of
/// the route's shape (400 `malformed` otherwise).
fn json<T: serde::de::DeserializeOwned>(headers: &HeaderMap, b: &[u8]) -> Result<T, Refusal> {
    let is_json = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !is_json {
        return Err(EdgeError::media_type("application/json").into());
    }
    serde_json::from_slice(b)
        .map_err(|e| EdgeError::malformed(format!("bad JSON body: {e}")).into())
}

/// A signed route's refusal: the provider's, or the edge's (content type, shape), both in the
/// envelope.
struct Refusal(Box<Response>);

impl From<PspError> for Refusal {
    fn from(e: PspError) -> Refusal {
        Refusal(Box::new(PspHttpError(e).into_response()))
    }
}

impl From<EdgeError> for Refusal {
    fn from(e: EdgeError) -> Refusal {
        Refusal(Box::new(e.into_response()))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        *self.0
    }
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

#[utoipa::path(get, path = "/v1/health", tag = "health",
    summary = "Liveness: the process runs",
    responses((status = 200, description = "It runs.", body = Health)))]
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Ready when the provider's books answer. Probed off the async threads, at most once a second
/// (`observe::cached_readiness`).
#[utoipa::path(get, path = "/v1/ready", tag = "health",
    summary = "Readiness: the provider's books answer",
    responses(
        (status = 200, description = "Ready: every check is `ok`.", body = florin_node::api::Readiness),
        (status = 503, description = "Not ready: the failed checks say why.", body = florin_node::api::Readiness)))]
async fn ready(State(p): St) -> axum::response::Response {
    let key = Arc::as_ptr(&p) as usize;
    crate::observe::cached_readiness(key, async move {
        let books = crate::observe::check(async move {
            tokio::task::spawn_blocking(move || p.info().map(|_| ()).map_err(|e| e.to_string()))
                .await
                .map_err(|e| e.to_string())?
        })
        .await;
        vec![("books", books)]
    })
    .await
}

#[utoipa::path(get, path = "/v1/psp/info", tag = "provider",
    summary = "The provider's name, key scheme, ledger and peers",
    responses((status = 200, description = "The provider.", body = PspInfo)))]
async fn info(State(p): St) -> Result<Json<PspInfo>, PspHttpError> {
    Ok(Json(p.info()?))
}

/// What opening an account spends of its caller's budget of validation work
/// ([`crate::edge::Work`]), counted in transactions: it starts a key generation on every node
/// of the network. With the default budget one address opens at most four accounts at once
/// and two a second after that.
pub const OPEN_ACCOUNT_WORK: usize = 1_024;

#[utoipa::path(post, path = "/v1/psp/accounts", tag = "accounts",
    summary = "Open an account (signed by the new customer's key)",
    request_body = OpenAccount, security(("customer" = [])),
    responses((status = 200, description = "The account, with its custodial key.", body = AccountView),
        (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 409, description = "Taken, or not enough funds.", body = ApiError)))]
async fn open(
    State(p): St,
    work: Work,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<AccountView>, Refusal> {
    let req: OpenAccount = json(&headers, &raw)?;
    let customer = req
        .customer_key
        .as_deref()
        .ok_or_else(|| PspError::BadRequest("customer_key is required".into()))?;
    let key = p.authenticate_opening(&req.name, customer, &caller("POST", &uri, &headers, &raw))?;
    // Spent only by an opening that will run (a taken or bad name, a bad signature spend
    // nothing); one over the budget is refused before its key generation starts.
    work.spend(OPEN_ACCOUNT_WORK)?;
    Ok(Json(p.open_account(&req.name, &key).await?))
}

/// Every account: the provider's operator only (`Authorization: Florin-Operator …`).
#[utoipa::path(get, path = "/v1/psp/accounts", tag = "accounts",
    summary = "Every account (the provider's operator)",
    security(("operator" = [])),
    responses((status = 200, description = "The accounts.", body = AccountList), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError)))]
async fn list(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Json<AccountList>, PspHttpError> {
    p.authenticate_operator(
        headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        "GET",
        uri.path_and_query().map(|q| q.as_str()).unwrap_or("/"),
        &[],
    )?;
    Ok(Json(AccountList {
        accounts: p.accounts()?,
    }))
}

#[utoipa::path(get, path = "/v1/psp/accounts/{name}", tag = "accounts",
    summary = "An account's balance and key (its customer, signed)",
    params(("name" = String, Path, description = "The account's name.")), security(("customer" = [])),
    responses((status = 200, description = "The account.", body = AccountView), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError)))]
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

#[utoipa::path(get, path = "/v1/psp/payees/{name}", tag = "accounts",
    summary = "Where an account is paid (public)",
    params(("name" = String, Path, description = "The account's name."),
        ("peer" = Option<String>, Query, description = "The paying provider, for a cross-provider payment.")),
    responses((status = 200, description = "The payee.", body = PayeeView), (status = 502, description = "The peer did not answer.", body = ApiError)))]
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

#[utoipa::path(get, path = "/v1/psp/accounts/{name}/history", tag = "accounts",
    summary = "An account's payments, newest first (its customer, signed)",
    params(("name" = String, Path, description = "The account's name."),
        ("limit" = Option<u64>, Query, description = "At most this many entries (default and most 1,000).")), security(("customer" = [])),
    responses((status = 200, description = "The history.", body = History), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError)))]
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

/// The proof of one of the account's cross-provider payments: asked by its customer (signed).
#[utoipa::path(get, path = "/v1/psp/accounts/{name}/proofs/{txid}", tag = "accounts",
    summary = "The proof of one of the account's cross-provider payments (its customer, signed)",
    params(("name" = String, Path, description = "The account's name."),
        ("txid" = String, Path, description = "The payment's txid: 64 hex digits.")), security(("customer" = [])),
    responses((status = 200, description = "The proof.", body = florin_node::psp::proof::TransferProof), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError)))]
async fn proof(
    State(p): St,
    Path((name, txid)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Json<florin_node::psp::proof::TransferProof>, PspHttpError> {
    p.authenticate_customer(&name, &caller("GET", &uri, &headers, &[]))?;
    Ok(Json(p.proof(&name, &txid)?))
}

/// The ledger's faucet funds an account: asked by its customer (signed).
#[utoipa::path(post, path = "/v1/psp/accounts/{name}/faucet", tag = "accounts",
    summary = "Fund an account from the ledger's faucet (devnet; its customer, signed)",
    params(("name" = String, Path, description = "The account's name.")),
    request_body = Fund, security(("customer" = [])),
    responses((status = 200, description = "The account after.", body = AccountView), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 422, description = "The payment was refused (ledger or peer).", body = ApiError), (status = 502, description = "A peer provider or the ledger did not answer.", body = ApiError)))]
async fn fund(
    State(p): St,
    Path(name): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<AccountView>, Refusal> {
    p.authenticate_customer(&name, &caller("POST", &uri, &headers, &raw))?;
    let req: Fund = json(&headers, &raw)?;
    Ok(Json(p.fund(&name, req.amount_cents).await?))
}

#[utoipa::path(post, path = "/v1/psp/pay", tag = "payments",
    summary = "Pay from an account (its customer, signed)",
    request_body = PayRequest, security(("customer" = [])),
    responses((status = 200, description = "The receipt.", body = PayReceipt), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 409, description = "Taken, or not enough funds.", body = ApiError), (status = 422, description = "The payment was refused (ledger or peer).", body = ApiError), (status = 502, description = "A peer provider or the ledger did not answer.", body = ApiError)))]
async fn pay(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<PayReceipt>, Refusal> {
    let req: PayRequest = json(&headers, &raw)?;
    p.authenticate_customer(&req.from, &caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.pay(req).await?))
}

/// Filia's ①–③ at the paying provider: its customer starts a transfer to another provider's
/// customer (signed as `from`).
#[utoipa::path(post, path = "/v1/psp/transfers", tag = "payments",
    summary = "Start a transfer to another provider's customer (its customer, signed)",
    request_body = florin_node::psp::api::StartTransfer, security(("customer" = [])),
    responses((status = 200, description = "The payee provider's offer.", body = florin_node::psp::api::TransferOffer), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 409, description = "Taken, or not enough funds.", body = ApiError), (status = 422, description = "The payment was refused (ledger or peer).", body = ApiError), (status = 502, description = "A peer provider or the ledger did not answer.", body = ApiError)))]
async fn start_transfer(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<florin_node::psp::api::TransferOffer>, Refusal> {
    let req: florin_node::psp::api::StartTransfer = json(&headers, &raw)?;
    p.authenticate_customer(&req.from, &caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.start_transfer(req).await?))
}

/// Filia's ①–③ at the payee's provider: a peer announces a payment (peer-signed).
#[utoipa::path(post, path = "/v1/psp/announce", tag = "peers",
    summary = "A peer provider announces a payment to one of this provider's customers (peer-signed)",
    request_body = florin_node::psp::api::Announce, security(("peer" = [])),
    responses((status = 200, description = "Where to pay, signed.", body = florin_node::psp::proof::PayeeOffer), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 422, description = "The payment was refused (ledger or peer).", body = ApiError)))]
async fn announce(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<florin_node::psp::proof::PayeeOffer>, Refusal> {
    let peer = p.authenticate_peer(&caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.announce(json(&headers, &raw)?, &peer)?))
}

#[utoipa::path(post, path = "/v1/psp/receive", tag = "peers",
    summary = "A peer provider hands over outputs it paid to this provider's customers (peer-signed)",
    request_body = florin_node::psp::api::Receive, security(("peer" = [])),
    responses((status = 200, description = "What was taken.", body = ReceiveAnswer), (status = 401, description = "No signature, or one that does not verify.", body = ApiError), (status = 403, description = "The signer may not do this.", body = ApiError), (status = 422, description = "The payment was refused (ledger or peer).", body = ApiError), (status = 502, description = "The ledger did not answer.", body = ApiError)))]
async fn receive(
    State(p): St,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Result<Json<ReceiveAnswer>, Refusal> {
    // Who calls first: an unknown or unauthenticated caller learns nothing of the body.
    let peer = p.authenticate_peer(&caller("POST", &uri, &headers, &raw))?;
    Ok(Json(p.receive(json(&headers, &raw)?, &peer).await?))
}

/// 404 `not_found` for a path no route serves.
async fn no_route() -> Response {
    EdgeError::new(StatusCode::NOT_FOUND, "not_found", "no such route").into_response()
}

/// The provider's routes and their OpenAPI document, built from the same list, before the
/// state and the outer layers.
fn api(limiter: &Arc<Limiter>) -> (Router<Arc<Psp>>, utoipa::openapi::OpenApi) {
    use crate::openapi::wrap;
    use limits::*;
    use utoipa_axum::routes;
    let small = |r| limited(SMALL, r);
    let (router, doc) = utoipa_axum::router::OpenApiRouter::<Arc<Psp>>::new()
        .routes(wrap(routes!(health), small))
        .routes(wrap(routes!(ready), small))
        .routes(wrap(routes!(crate::observe::metrics), small))
        .routes(wrap(routes!(info), small))
        .routes(wrap(routes!(open), |r| validating(limiter, SMALL, r)))
        .routes(wrap(routes!(list), small))
        .routes(wrap(routes!(account), small))
        .routes(wrap(routes!(payee), small))
        .routes(wrap(routes!(history), small))
        .routes(wrap(routes!(proof), small))
        .routes(wrap(routes!(fund), small))
        .routes(wrap(routes!(pay), small))
        .routes(wrap(routes!(start_transfer), small))
        .routes(wrap(routes!(announce), small))
        .routes(wrap(routes!(receive), |r| limited(RECEIVE, r)))
        .split_for_parts();
    (
        router,
        crate::openapi::finish(doc, crate::openapi::Api::Psp),
    )
}

/// A provider's OpenAPI 3.1 document (served at `/openapi.json`; `docs/openapi-psp.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    api(&Limiter::new(RateLimits::default())).1
}

/// The provider's routes, with the default rate limits.
pub fn router(psp: Arc<Psp>) -> Router {
    router_with_limits(psp, RateLimits::default())
}

/// The provider's routes: each with its body limit ([`limits`]), every request counted
/// against its client address (`limits`), every error in the JSON envelope.
pub fn router_with_limits(psp: Arc<Psp>, limits: RateLimits) -> Router {
    let limiter = Limiter::new(limits);
    let (mut router, doc) = api(&limiter);
    for (path, route) in crate::openapi::routes(&doc) {
        router = router.route(path, limited(limits::SMALL, route));
    }
    router
        .fallback(no_route)
        .layer(DefaultBodyLimit::disable())
        .layer(from_fn_with_state(limiter, edge::limit_rate))
        .layer(from_fn(edge::envelope_layer))
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
    serve_with_limits(listener, psp, options, RateLimits::default(), shutdown).await
}

/// [`serve_with`] with rate limits `limits` (a load generator from one address turns them
/// off).
pub async fn serve_with_limits(
    listener: TcpListener,
    psp: Arc<Psp>,
    options: ServeOptions,
    limits: RateLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let upkeep = psp.spawn_upkeep(Duration::from_secs(2));
    let router = router_with_limits(psp, limits);
    let r = crate::server::serve_router(listener, router, options, shutdown).await;
    upkeep.abort();
    // Wait until the task is gone, so the books are closed when this returns.
    let _ = upkeep.await;
    r
}

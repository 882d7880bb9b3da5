//! What every HTTP listener of Florin logs and counts: the outermost layer of every router
//! [`crate::server::serve_router`] serves.
//!
//! Each request gets a request id (the caller's `x-request-id` when it is a valid one, else a
//! fresh one; see [`florin_obs::request_id`]), answered in `x-request-id` and carried in an
//! `http` span (`request_id`, `method`, `route`) that the handler's work — its blocking part
//! included — runs in, so every line it logs names the request. When the answer is ready, one
//! line (target `florin::access`) gives its status and latency, and the request is counted in
//! `florin_http_requests_total` and `florin_http_request_duration_seconds`.
//!
//! Labels are bounded: the route is the router's template (`unmatched` for no route) and the
//! method one of the standard ones (`other` for the rest), never what the caller wrote.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;
use florin_obs::request_id;
use tracing::Instrument;

/// The request id of the request being handled (in its extensions), for handlers that call on.
#[derive(Clone, Debug)]
pub struct RequestId(pub Arc<str>);

tokio::task_local! {
    /// The id of the request the current task answers.
    static CURRENT: Arc<str>;
}

/// The id of the request this task is answering, if any: the calls a handler makes to other
/// Florin services (a provider's to the ledger and to other providers) send it on in
/// `x-request-id`, so one payment is one id in every process's log.
pub fn current_request_id() -> Option<Arc<str>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// `req` with the current request id, when there is one.
pub fn with_request_id(req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match current_request_id() {
        Some(id) => req.header(request_id::HEADER, &*id),
        None => req,
    }
}

/// The method as a bounded label.
fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// Middleware: request id, span, access line and request metrics (see the module's text).
pub async fn observe(mut req: Request, next: Next) -> Response {
    if !florin_obs::enabled() {
        return next.run(req).await;
    }
    let start = Instant::now();
    let given = req
        .headers()
        .get(request_id::HEADER)
        .and_then(|v| v.to_str().ok());
    let id = request_id::accept(given);
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = method_label(req.method());
    let span = tracing::info_span!("http", request_id = %id, method, route = %route);
    let shared: Arc<str> = Arc::from(id.as_str());
    req.extensions_mut().insert(RequestId(shared.clone()));
    let mut resp = CURRENT
        .scope(shared, next.run(req).instrument(span.clone()))
        .await;
    let took = start.elapsed();
    let status = resp.status().as_u16();
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(request_id::HEADER, v);
    }
    span.in_scope(|| {
        let latency_ms = took.as_secs_f64() * 1e3;
        // A flood the rate limits turn away costs a line only at debug level (it is counted
        // in the metrics all the same): refusing it stays cheap and the log stays readable.
        if status == 429 {
            tracing::debug!(target: "florin::access", status, latency_ms, "request");
        } else {
            tracing::info!(target: "florin::access", status, latency_ms, "request");
        }
    });
    florin_obs::metrics::global().http_request(&route, method, status, took);
    resp
}

/// `GET /metrics`: the process's metrics as OpenMetrics text.
#[utoipa::path(get, path = "/metrics", tag = "health",
    summary = "The process's metrics (Prometheus / OpenMetrics text)",
    responses((status = 200, description = "Every metric family (`docs/operations.md`).",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
pub async fn metrics() -> Response {
    use axum::response::IntoResponse;
    // Scrape hooks may read files or ask a replica for its state: off the async threads.
    match tokio::task::spawn_blocking(|| florin_obs::metrics::global().encode()).await {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                florin_obs::metrics::CONTENT_TYPE,
            )],
            text,
        )
            .into_response(),
        Err(e) => crate::edge::envelope(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("encoding the metrics failed: {e}"),
        ),
    }
}

/// The routes of a process without an API (a shard, coordinator or engine replica):
/// `/metrics` and `/v1/health`.
pub fn metrics_router() -> axum::Router {
    use axum::routing::get;
    axum::Router::new().route("/metrics", get(metrics)).route(
        "/v1/health",
        get(|| async {
            axum::Json(florin_node::api::Health {
                status: "ok".into(),
            })
        }),
    )
}

/// How long a readiness check may take before it counts as failed.
pub const READY_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Runs one readiness check with [`READY_CHECK_TIMEOUT`].
pub async fn check<E: std::fmt::Display>(
    fut: impl std::future::Future<Output = Result<(), E>>,
) -> Result<(), String> {
    match tokio::time::timeout(READY_CHECK_TIMEOUT, fut).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} s",
            READY_CHECK_TIMEOUT.as_secs()
        )),
    }
}

/// How long a readiness answer is reused: a load balancer polling every process often costs
/// each one probe a second at most.
pub const READY_CACHE: std::time::Duration = std::time::Duration::from_secs(1);

type Checks = Vec<(&'static str, Result<(), String>)>;

/// The last readiness of each service in this process (by the address of its state), and
/// whether a probe of it is running.
struct ReadyState {
    last: Option<(std::time::Instant, Checks)>,
    probing: bool,
}

/// `GET /v1/ready` for the service identified by `key`: runs `probe` at most once per
/// [`READY_CACHE`] and never twice at once — while a probe runs, others get the last answer
/// (or `not_ready`, `"probe": "running"`, before the first).
pub async fn cached_readiness(
    key: usize,
    probe: impl std::future::Future<Output = Checks> + Send + 'static,
) -> Response {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static STATES: OnceLock<Mutex<HashMap<usize, ReadyState>>> = OnceLock::new();
    let states = STATES.get_or_init(|| Mutex::new(HashMap::new()));
    let reuse = {
        let mut map = states.lock().unwrap_or_else(|p| p.into_inner());
        let st = map.entry(key).or_insert(ReadyState {
            last: None,
            probing: false,
        });
        match &st.last {
            Some((at, checks)) if at.elapsed() < READY_CACHE || st.probing => Some(checks.clone()),
            None if st.probing => Some(vec![("probe", Err("running".to_string()))]),
            _ => {
                st.probing = true;
                None
            }
        }
    };
    if let Some(checks) = reuse {
        return readiness(checks);
    }
    // The probe runs as its own task: a caller that hangs up (a load balancer's short
    // timeout) does not stop it, so it always records its answer and clears `probing`.
    let task = tokio::spawn(async move {
        let checks = probe.await;
        let mut map = states.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = map.get_mut(&key) {
            st.last = Some((std::time::Instant::now(), checks.clone()));
            st.probing = false;
        }
        checks
    });
    match task.await {
        Ok(checks) => readiness(checks),
        Err(e) => {
            let mut map = states.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(st) = map.get_mut(&key) {
                st.probing = false;
            }
            readiness(vec![("probe", Err(format!("the probe failed: {e}")))])
        }
    }
}

/// The answer of `GET /v1/ready`: 200 `{"status":"ready","checks":{…:"ok"}}` when every check
/// passed, else 503 with `"status":"not_ready"` and each failed check's reason.
pub fn readiness(checks: Checks) -> Response {
    use axum::response::IntoResponse;
    let ready = checks.iter().all(|(_, r)| r.is_ok());
    let checks = checks
        .into_iter()
        .map(|(name, r)| {
            (
                name.to_string(),
                r.err().unwrap_or_else(|| "ok".to_string()),
            )
        })
        .collect();
    let status = if ready {
        axum::http::StatusCode::OK
    } else {
        axum::http::StatusCode::SERVICE_UNAVAILABLE
    };
    let body = florin_node::api::Readiness {
        status: if ready { "ready" } else { "not_ready" }.to_string(),
        checks,
    };
    (status, axum::Json(body)).into_response()
}

//! What every route of the node and of a provider shares at the edge: the one JSON error
//! envelope (`{"error": {"code": …, "message": …}}`, also for axum's own rejections), body
//! limits sized per route (413 before the body is buffered), and rate limits (429 with
//! `Retry-After`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use florin_node::api::ApiError;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::de::DeserializeOwned;

/// An error answer in the envelope: a status, a stable code and a message.
#[derive(Debug, Clone)]
pub struct EdgeError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code.
    pub code: &'static str,
    /// The message.
    pub message: String,
    /// Seconds to wait before asking again (429).
    pub retry_after: Option<u64>,
}

impl EdgeError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> EdgeError {
        EdgeError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 413 `too_large`: a body over the route's limit.
    pub fn too_large(max: usize) -> EdgeError {
        EdgeError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is larger than this route takes ({max} bytes)"),
        )
    }

    /// 415 `unsupported_media_type`.
    pub fn media_type(expected: &str) -> EdgeError {
        EdgeError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the request's content type must be {expected}"),
        )
    }

    /// 400 `malformed`: a body that does not parse.
    pub fn malformed(message: impl Into<String>) -> EdgeError {
        EdgeError::new(StatusCode::BAD_REQUEST, "malformed", message)
    }

    /// 429 `rate_limited`, with how long to wait.
    pub fn rate_limited(what: &str, wait: Duration) -> EdgeError {
        // Whole seconds, rounded up: a client that waits that long is let through.
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        EdgeError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "rate_limited",
            message: format!("too many requests {what}; retry in {secs} s"),
            retry_after: Some(secs.max(1)),
        }
    }
}

impl IntoResponse for EdgeError {
    fn into_response(self) -> Response {
        let mut r = envelope(self.status, self.code, self.message);
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The envelope as a response.
pub fn envelope(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(ApiError::new(code, message))).into_response()
}

/// The code an error status gets when nothing more specific is known (axum's own rejections).
pub fn code_of_status(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "malformed",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::TOO_MANY_REQUESTS => "rate_limited",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        s if s.is_server_error() => "internal",
        _ => "error",
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// Longest text of a rejection kept in the envelope's message.
const MAX_REJECTION_TEXT: usize = 1024;

/// Middleware: an error answer that is not already the JSON envelope (axum's rejections:
/// unknown route, wrong method, a path or query that does not parse, a JSON body of the wrong
/// type) is rewritten into it; axum's 422 for a JSON body of the wrong shape becomes 400
/// `malformed`.
pub async fn envelope_layer(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(resp.headers()) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, MAX_REJECTION_TEXT).await {
        Ok(b) if !b.is_empty() => String::from_utf8_lossy(&b).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_string(),
    };
    let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
        StatusCode::BAD_REQUEST
    } else {
        status
    };
    let mut out = envelope(status, code_of_status(status), text);
    for name in [header::RETRY_AFTER, header::ALLOW] {
        if let Some(v) = parts.headers.get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}

/// Middleware (with the route's limit as state): a body longer than `max` bytes is refused
/// with 413 `too_large` whatever its content type: at once when its `Content-Length` says so
/// (nothing of it is read), else as soon as `max` bytes have streamed in. What passes is
/// buffered (at most `max` bytes) and handed on.
pub async fn limit_body(State(max): State<usize>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return EdgeError::too_large(max).into_response();
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(e) => {
            // Over the limit while streaming, or the body broke off.
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                return EdgeError::too_large(max).into_response();
            }
            return EdgeError::malformed(format!("the request body broke off: {e}"))
                .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// A JSON body whose rejections are answered in the envelope: 415 `unsupported_media_type`
/// without `Content-Type: application/json`, 400 `malformed` for a body that does not parse
/// or has the wrong shape, 413 `too_large` over the route's limit.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = EdgeError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::rejection::JsonRejection;
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(JsonRejection::MissingJsonContentType(_)) => {
                Err(EdgeError::media_type("application/json"))
            }
            Err(JsonRejection::BytesRejection(e))
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
            {
                Err(EdgeError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    e.body_text(),
                ))
            }
            Err(e) => Err(EdgeError::malformed(format!(
                "bad JSON body: {}",
                e.body_text()
            ))),
        }
    }
}

/// The limits live with the API's types, so a sentinel's `node.toml` can name them.
pub use florin_node::api::RateLimits;

/// Most addresses or keys a limiter tracks before it forgets those that are back to full.
const MAX_TRACKED: usize = 100_000;
/// Least time between two sweeps of a limiter's table once it is over [`MAX_TRACKED`] (a
/// sweep reads every entry, so it must not run on every request).
const TIDY_EVERY: Duration = Duration::from_secs(1);

/// The address a client is counted under: an IPv4 address as it is (an IPv4-mapped IPv6
/// address as its IPv4 one), an IPv6 address by its /64 (one subscriber is given a whole
/// /64, so counting single IPv6 addresses would give each client 2^64 budgets).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

fn keyed<K: std::hash::Hash + Eq + Clone>(
    per_sec: u32,
    burst: u32,
) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(per_sec)?;
    let burst = NonZeroU32::new(burst.max(per_sec)).unwrap_or(rate);
    Some(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

/// A budget of validation work per client address: a bucket of `burst` transactions refilled
/// at `rate` per second. A request may spend it only while the bucket is above zero, and then
/// spends all it costs (the bucket may go below zero: a batch of 4,096 passes even when the
/// burst is smaller); while it is below zero the address's work requests are refused before
/// their bodies are read. So one address has at most `rate` transactions per second validated
/// over time, whatever the size of its requests.
struct WorkBudget {
    rate: f64,
    burst: f64,
    table: Mutex<WorkTable>,
}

struct WorkTable {
    buckets: HashMap<IpAddr, (f64, Instant)>,
    tidied: Instant,
}

impl WorkBudget {
    fn new(per_sec: u32, burst: u32) -> Option<WorkBudget> {
        if per_sec == 0 {
            return None;
        }
        Some(WorkBudget {
            rate: f64::from(per_sec),
            burst: f64::from(burst.max(per_sec)),
            table: Mutex::new(WorkTable {
                buckets: HashMap::new(),
                tidied: Instant::now(),
            }),
        })
    }

    /// What is left in `ip`'s bucket now, after refilling (a full bucket for a new address).
    fn level(&self, t: &mut WorkTable, ip: IpAddr, now: Instant) -> f64 {
        if t.buckets.len() > MAX_TRACKED && now.duration_since(t.tidied) >= TIDY_EVERY {
            let (rate, burst) = (self.rate, self.burst);
            t.buckets.retain(|_, (level, at)| {
                *level + rate * now.duration_since(*at).as_secs_f64() < burst
            });
            t.tidied = now;
        }
        let (rate, burst) = (self.rate, self.burst);
        let b = t.buckets.entry(ip).or_insert((burst, now));
        b.0 = (b.0 + rate * now.duration_since(b.1).as_secs_f64()).min(burst);
        b.1 = now;
        b.0
    }

    /// How long `ip` must wait before it may spend again, when its bucket is not above zero.
    fn wait(&self, level: f64) -> Option<Duration> {
        (level <= 0.0).then(|| Duration::from_secs_f64((1.0 - level) / self.rate))
    }

    /// `Err(wait)` while `ip` has nothing left to spend.
    fn check(&self, ip: IpAddr) -> Result<(), Duration> {
        let Ok(mut t) = self.table.lock() else {
            return Ok(());
        };
        let level = self.level(&mut t, ip, Instant::now());
        self.wait(level).map_or(Ok(()), Err)
    }

    /// Spends `n` of `ip`'s budget; `Err(wait)` when there is nothing left to spend.
    fn spend(&self, ip: IpAddr, n: usize) -> Result<(), Duration> {
        let Ok(mut t) = self.table.lock() else {
            return Ok(());
        };
        let now = Instant::now();
        let level = self.level(&mut t, ip, now);
        if let Some(wait) = self.wait(level) {
            return Err(wait);
        }
        if let Some(b) = t.buckets.get_mut(&ip) {
            b.0 -= n as f64;
        }
        Ok(())
    }
}

/// The limiters a router shares (one set per process).
pub struct Limiter {
    by_ip: Option<DefaultKeyedRateLimiter<IpAddr>>,
    by_key: Option<DefaultKeyedRateLimiter<Vec<u8>>>,
    work: Option<WorkBudget>,
    clock: DefaultClock,
    /// When each table (by address, by key) was last swept.
    tidied: [Mutex<Instant>; 2],
}

impl Limiter {
    /// Limiters for `limits`.
    pub fn new(limits: RateLimits) -> Arc<Limiter> {
        Arc::new(Limiter {
            by_ip: keyed(limits.per_ip_per_sec, limits.per_ip_burst),
            by_key: keyed(limits.per_key_per_sec, limits.per_key_burst),
            work: WorkBudget::new(limits.per_ip_tx_per_sec, limits.per_ip_tx_burst),
            clock: DefaultClock::default(),
            tidied: [Mutex::new(Instant::now()), Mutex::new(Instant::now())],
        })
    }

    /// Forgets the entries that are back to full once a table is over [`MAX_TRACKED`], at
    /// most once per [`TIDY_EVERY`] (for every table of this limiter).
    fn tidy<K: std::hash::Hash + Eq + Clone>(&self, l: &DefaultKeyedRateLimiter<K>, table: usize) {
        if l.len() <= MAX_TRACKED {
            return;
        }
        let Some(Ok(mut at)) = self.tidied.get(table).map(|m| m.lock()) else {
            return;
        };
        if at.elapsed() >= TIDY_EVERY {
            l.retain_recent();
            *at = Instant::now();
        }
    }

    /// One request from `ip`: `Err` (429) when it is over its rate.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), EdgeError> {
        let Some(l) = &self.by_ip else { return Ok(()) };
        self.tidy(l, 0);
        l.check_key(&client_key(ip)).map_err(|not_until| {
            EdgeError::rate_limited(
                "from this address",
                not_until.wait_time_from(self.clock.now()),
            )
        })
    }

    /// One request naming `key` (`what` says which, for the message): `Err` (429) when over.
    pub fn check_key(&self, what: &str, key: &[u8]) -> Result<(), EdgeError> {
        let Some(l) = &self.by_key else { return Ok(()) };
        self.tidy(l, 1);
        l.check_key(&key.to_vec()).map_err(|not_until| {
            EdgeError::rate_limited(
                &format!("for this {what}"),
                not_until.wait_time_from(self.clock.now()),
            )
        })
    }

    /// `Err` (429) while `ip` has spent its budget of validation work.
    pub fn check_work(&self, ip: IpAddr) -> Result<(), EdgeError> {
        let Some(w) = &self.work else { return Ok(()) };
        w.check(client_key(ip))
            .map_err(|wait| EdgeError::rate_limited("to validate from this address", wait))
    }

    /// Spends `n` transactions of `ip`'s budget of validation work: `Err` (429, nothing
    /// spent) when it has none left.
    pub fn spend_work(&self, ip: IpAddr, n: usize) -> Result<(), EdgeError> {
        let Some(w) = &self.work else { return Ok(()) };
        w.spend(client_key(ip), n)
            .map_err(|wait| EdgeError::rate_limited("to validate from this address", wait))
    }
}

fn peer_ip(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// Middleware (with the limiter as state): every request counts against its client
/// address (from `ConnectInfo`; a router served without it is not limited by address).
pub async fn limit_rate(State(l): State<Arc<Limiter>>, req: Request, next: Next) -> Response {
    if let Some(ip) = peer_ip(&req) {
        if let Err(e) = l.check_ip(ip) {
            return e.into_response();
        }
    }
    next.run(req).await
}

/// What a route that validates transactions spends of its caller's budget of validation work
/// (see [`work_gate`]); handlers take it as an extractor and call [`Work::spend`] once they
/// know how many transactions a request holds, before validating any.
#[derive(Clone)]
pub struct Work(Option<(Arc<Limiter>, IpAddr)>);

impl Work {
    /// Spends `n` transactions of the caller's budget; `Err` (429) when it has none left.
    pub fn spend(&self, n: usize) -> Result<(), EdgeError> {
        match &self.0 {
            Some((l, ip)) => l.spend_work(*ip, n),
            None => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Work {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        // A route served without the gate spends nothing.
        Ok(parts
            .extensions
            .get::<Work>()
            .cloned()
            .unwrap_or(Work(None)))
    }
}

/// Middleware (with the limiter as state) on a route that validates transactions: a client
/// address that has spent its budget of validation work is refused with 429 **before its body
/// is read** (the connection is then closed rather than drained); otherwise the handler gets
/// a [`Work`] to spend from.
pub async fn work_gate(State(l): State<Arc<Limiter>>, mut req: Request, next: Next) -> Response {
    let ip = peer_ip(&req);
    if let Some(ip) = ip {
        if let Err(e) = l.check_work(ip) {
            let mut r = e.into_response();
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
    }
    req.extensions_mut().insert(Work(ip.map(|ip| (l, ip))));
    next.run(req).await
}

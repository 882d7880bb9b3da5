//! The edge of the node's router, in process (`tower::ServiceExt::oneshot`):
//! the one JSON error envelope for every refusal (axum's own included), body limits per route
//! (413 whatever the content type, also for a streamed body), content types (415), unknown
//! routes (404) and methods (405), and rate limits by address and by key (429 with
//! `Retry-After`, recovering after the window). The provider's router shares this edge
//! (`florin_http::edge`); its envelope is checked in `florin-node/tests/psp.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::too_many_arguments)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use florin_crypto::{LocalSigner, SecretKey};
use florin_http::{AppState, RateLimits};
use florin_node::{Authority, AuthorityConfig};
use rand::rngs::OsRng;
use serde_json::Value;
use tower::ServiceExt;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A node router with no services behind it (enough for what is refused at the edge).
fn bare(limits: RateLimits) -> Router {
    florin_http::router(AppState {
        authority: None,
        ledger: None,
        limits,
        cluster: None,
        custody: None,
    })
}

/// A node router with an authority (mailbox, deposit), in `dir`.
fn with_authority(dir: &std::path::Path, limits: RateLimits) -> Router {
    let a = Authority::open(
        AuthorityConfig::devnet(dir),
        Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng))),
    )
    .unwrap();
    florin_http::router(AppState {
        authority: Some(Arc::new(a)),
        ledger: None,
        limits,
        cluster: None,
        custody: None,
    })
}

struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

fn call(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    from: &str,
    method: Method,
    path: &str,
    ctype: Option<&str>,
    body: Body,
    length: Option<usize>,
) -> Answer {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(c) = ctype {
        req = req.header(header::CONTENT_TYPE, c);
    }
    if let Some(n) = length {
        req = req.header(header::CONTENT_LENGTH, n);
    }
    let mut req = req.body(body).unwrap();
    let addr: SocketAddr = from.parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    let resp = rt.block_on(app.clone().oneshot(req)).unwrap();
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.to_str().unwrap().starts_with("application/json"));
    let bytes = rt
        .block_on(axum::body::to_bytes(resp.into_body(), 1 << 20))
        .unwrap();
    assert!(is_json || status.is_success(), "{status}: not JSON");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        retry_after,
        body,
    }
}

fn post_json(rt: &tokio::runtime::Runtime, app: &Router, path: &str, json: &str) -> Answer {
    call(
        rt,
        app,
        "10.0.0.1:5000",
        Method::POST,
        path,
        Some("application/json"),
        Body::from(json.to_string()),
        None,
    )
}

/// The answer is the envelope with `code`, and nothing else.
fn envelope(a: &Answer, status: StatusCode, code: &str) {
    assert_eq!(a.status, status, "{}", a.body);
    let obj = a.body.as_object().expect("a JSON object");
    assert_eq!(obj.len(), 1, "only `error`: {}", a.body);
    assert_eq!(a.body["error"]["code"], code, "{}", a.body);
    assert!(
        a.body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        a.body
    );
}

#[test]
fn every_refusal_is_the_envelope() {
    let rt = rt();
    let app = bare(RateLimits::default());
    let get = |path: &str| {
        call(
            &rt,
            &app,
            "10.0.0.1:5000",
            Method::GET,
            path,
            None,
            Body::empty(),
            None,
        )
    };
    // Unknown route, wrong method, a service that is not running here.
    envelope(&get("/v1/nope"), StatusCode::NOT_FOUND, "not_found");
    envelope(
        &get("/v1/deposit"),
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    envelope(&get("/v1/info"), StatusCode::NOT_FOUND, "no_authority");
    // A path parameter that does not parse: the service's typed 400.
    let dir = tempfile::tempdir().unwrap();
    let full = with_authority(dir.path(), RateLimits::default());
    let a = call(
        &rt,
        &full,
        "10.0.0.1:5000",
        Method::GET,
        "/v1/tokens/zz",
        None,
        Body::empty(),
        None,
    );
    envelope(&a, StatusCode::BAD_REQUEST, "bad_request");

    // Malformed JSON, JSON of the wrong shape: 400 malformed (not axum's 422 or plain text).
    envelope(
        &post_json(&rt, &full, "/v1/mailbox", "{not json"),
        StatusCode::BAD_REQUEST,
        "malformed",
    );
    envelope(
        &post_json(&rt, &full, "/v1/mailbox", r#"{"to": 5}"#),
        StatusCode::BAD_REQUEST,
        "malformed",
    );
    envelope(
        &post_json(&rt, &app, "/v1/ledger/transactions", "{not json"),
        StatusCode::BAD_REQUEST,
        "malformed",
    );
    // Wrong or missing content type: 415, on JSON routes and on the binary-or-JSON ones.
    for (path, ctype) in [
        ("/v1/mailbox", Some("text/plain")),
        ("/v1/deposit", None),
        ("/v1/ledger/transactions", Some("text/plain")),
        ("/v1/ledger/batch", None),
    ] {
        let a = call(
            &rt,
            &full,
            "10.0.0.1:5000",
            Method::POST,
            path,
            ctype,
            Body::from("{}"),
            None,
        );
        envelope(
            &a,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        );
    }
    // A typed service refusal keeps its code, inside the envelope.
    let a = post_json(
        &rt,
        &full,
        "/v1/mailbox",
        r#"{"to": "not-an-address", "message": "00"}"#,
    );
    envelope(&a, StatusCode::BAD_REQUEST, "bad_request");
}

#[test]
fn an_oversized_body_is_413_whatever_its_content_type() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let app = with_authority(dir.path(), RateLimits::default());
    let routes = [
        ("/v1/mailbox", florin_http::node::limits::MAILBOX),
        ("/v1/deposit", florin_http::node::limits::DEPOSIT),
        (
            "/v1/ledger/transactions",
            florin_http::node::limits::TRANSACTION,
        ),
        ("/v1/ledger/batch", florin_http::node::limits::BATCH),
        ("/v1/ledger/faucet", florin_http::node::limits::SMALL),
        ("/v1/withdraw", florin_http::node::limits::WITHDRAW),
        ("/v1/health", florin_http::node::limits::SMALL),
    ];
    for (path, max) in routes {
        for ctype in [
            Some("application/json"),
            Some("application/octet-stream"),
            Some("text/plain"),
            None,
        ] {
            // Declared too long: refused before a byte of the body is read (the body here
            // is empty; only the header says how long it would be).
            let a = call(
                &rt,
                &app,
                "10.0.0.1:5000",
                Method::POST,
                path,
                ctype,
                Body::empty(),
                Some(max + 1),
            );
            envelope(&a, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
        }
        // Streamed without a length: refused once one byte more than the limit came in.
        let chunks = (0..=max / 65_536 + 1).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 65_536]));
        let stream = Body::from_stream(futures_stream(chunks.collect()));
        let a = call(
            &rt,
            &app,
            "10.0.0.1:5000",
            Method::POST,
            path,
            Some("text/plain"),
            stream,
            None,
        );
        envelope(&a, StatusCode::PAYLOAD_TOO_LARGE, "too_large");
    }
    // A body at the limit is not refused for its size (here: not JSON, so 400 or 415).
    let a = call(
        &rt,
        &app,
        "10.0.0.1:5000",
        Method::POST,
        "/v1/mailbox",
        Some("application/json"),
        Body::from(vec![b' '; florin_http::node::limits::MAILBOX]),
        None,
    );
    envelope(&a, StatusCode::BAD_REQUEST, "malformed");
}

/// A body that streams `chunks` (no length known in advance).
fn futures_stream(
    chunks: Vec<Result<Vec<u8>, std::io::Error>>,
) -> impl futures_core::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    struct Chunks(std::vec::IntoIter<Result<Vec<u8>, std::io::Error>>);
    impl futures_core::Stream for Chunks {
        type Item = Result<Vec<u8>, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            std::task::Poll::Ready(self.0.next())
        }
    }
    Chunks(chunks.into_iter())
}

#[test]
fn rate_limits_trigger_and_recover() {
    let rt = rt();
    let dir = tempfile::tempdir().unwrap();
    let limits = RateLimits {
        per_ip_per_sec: 2,
        per_ip_burst: 3,
        per_key_per_sec: 1,
        per_key_burst: 2,
        ..RateLimits::off()
    };
    let app = with_authority(dir.path(), limits);
    let health = |from: &str| {
        call(
            &rt,
            &app,
            from,
            Method::GET,
            "/v1/health",
            None,
            Body::empty(),
            None,
        )
    };
    // By address: the burst passes, the next is refused with Retry-After.
    for _ in 0..3 {
        assert_eq!(health("10.0.0.7:1").status, StatusCode::OK);
    }
    let refused = health("10.0.0.7:2");
    envelope(&refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    let wait: u64 = refused.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    // Another address is not affected; unknown routes count too.
    assert_eq!(health("10.0.0.8:1").status, StatusCode::OK);
    // After the window the address is let through again.
    std::thread::sleep(Duration::from_millis(wait * 1000 + 100));
    assert_eq!(health("10.0.0.7:3").status, StatusCode::OK);

    // By key: mailbox writes to one recipient, from many addresses.
    let to = florin_crypto::SecretKey::generate(&mut OsRng)
        .public_key()
        .to_address();
    let other = florin_crypto::SecretKey::generate(&mut OsRng)
        .public_key()
        .to_address();
    let put = |from: &str, to: &str| {
        call(
            &rt,
            &app,
            from,
            Method::POST,
            "/v1/mailbox",
            Some("application/json"),
            Body::from(format!(r#"{{"to": "{to}", "message": "00"}}"#)),
            None,
        )
    };
    assert_eq!(put("10.1.0.1:1", &to).status, StatusCode::OK);
    assert_eq!(put("10.1.0.2:1", &to).status, StatusCode::OK);
    let refused = put("10.1.0.3:1", &to);
    envelope(&refused, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert!(refused.retry_after.is_some());
    assert_eq!(put("10.1.0.4:1", &other).status, StatusCode::OK);
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(put("10.1.0.5:1", &to).status, StatusCode::OK);
}

#[test]
fn default_limits_do_not_refuse_a_busy_client() {
    let rt = rt();
    let app = bare(RateLimits::default());
    for _ in 0..2_000 {
        let a = call(
            &rt,
            &app,
            "127.0.0.1:1",
            Method::GET,
            "/v1/health",
            None,
            Body::empty(),
            None,
        );
        assert_eq!(a.status, StatusCode::OK);
    }
}

#[test]
fn the_largest_transaction_fits_its_route() {
    use florin_crypto::{P256PublicKey, P256Signature};
    use florin_ledger::tx::{Encumbrance, Output, Transfer, Utxo, Witness, MAX_IO};
    let utxo = |i: u32| Utxo {
        value: 1,
        encumbrance: Encumbrance {
            scheme: florin_ledger::tx::SCHEME_P256,
            key: [1; 32],
        },
        serial: {
            let mut s = [0u8; 32];
            s[..4].copy_from_slice(&i.to_le_bytes());
            s
        },
    };
    let t = Transfer {
        expires: florin_ledger::expiry::default_expiry(),
        inputs: (0..MAX_IO as u32).map(utxo).collect(),
        outputs: vec![
            Output {
                value: 1,
                encumbrance: Encumbrance {
                    scheme: florin_ledger::tx::SCHEME_P256,
                    key: [2; 32],
                },
            };
            MAX_IO
        ],
        witnesses: vec![Witness::p256(P256PublicKey([2; 33]), P256Signature([3; 64])); MAX_IO],
    };
    let len = florin_ledger::Transaction::Transfer(t).encode().len();
    assert!(
        len <= florin_http::node::MAX_TX_LEN,
        "{len} > {}",
        florin_http::node::MAX_TX_LEN
    );
    // As hex in JSON, it fits the transaction route's limit.
    assert!(2 * len + 16 < florin_http::node::limits::TRANSACTION);
}

/// A batch of `n` small transfers as length-prefixed frames (they decode; nothing spends them).
fn frames(n: usize) -> Vec<u8> {
    use florin_crypto::{P256PublicKey, P256Signature};
    use florin_ledger::tx::{Encumbrance, Output, Transfer, Utxo, Witness};
    let key = Encumbrance {
        scheme: florin_ledger::tx::SCHEME_P256,
        key: [1; 32],
    };
    let mut body = Vec::new();
    for i in 0..n {
        let mut serial = [0u8; 32];
        serial[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let t = Transfer {
            expires: florin_ledger::expiry::default_expiry(),
            inputs: vec![Utxo {
                value: 1,
                encumbrance: key,
                serial,
            }],
            outputs: vec![Output {
                value: 1,
                encumbrance: key,
            }],
            witnesses: vec![Witness::p256(
                P256PublicKey([2; 33]),
                P256Signature([3; 64]),
            )],
        };
        let tx = florin_ledger::Transaction::Transfer(t).encode();
        body.extend_from_slice(&(tx.len() as u32).to_le_bytes());
        body.extend_from_slice(&tx);
    }
    body
}

/// A body that records whether anything read it.
fn watched(bytes: Vec<u8>, read: Arc<std::sync::atomic::AtomicBool>) -> Body {
    struct Once(Option<Vec<u8>>, Arc<std::sync::atomic::AtomicBool>);
    impl futures_core::Stream for Once {
        type Item = Result<Vec<u8>, std::io::Error>;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Self::Item>> {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
            std::task::Poll::Ready(self.0.take().map(Ok))
        }
    }
    Body::from_stream(Once(Some(bytes), read))
}

#[test]
fn the_validation_budget_counts_transactions_and_refuses_before_the_body() {
    let rt = rt();
    let limits = RateLimits {
        per_ip_tx_per_sec: 10,
        per_ip_tx_burst: 10,
        ..RateLimits::off()
    };
    let app = bare(limits);
    let batch = |from: &str, n: usize, read: Arc<std::sync::atomic::AtomicBool>| {
        call(
            &rt,
            &app,
            from,
            Method::POST,
            "/v1/ledger/batch",
            Some("application/octet-stream"),
            watched(frames(n), read),
            None,
        )
    };
    let flag = || Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A batch larger than the burst passes while the address has budget left (this node runs
    // no ledger, so it gets as far as 404 `no ledger`), and spends all 20.
    let read = flag();
    let first = batch("10.2.0.1:1", 20, read.clone());
    assert_eq!(first.status, StatusCode::NOT_FOUND, "{}", first.body);
    assert!(read.load(std::sync::atomic::Ordering::SeqCst));
    // In debt now: the next request of any size is refused, its body never read.
    for path in ["/v1/ledger/batch", "/v1/ledger/transactions"] {
        let read = flag();
        let a = call(
            &rt,
            &app,
            "10.2.0.1:2",
            Method::POST,
            path,
            Some("application/octet-stream"),
            watched(frames(1), read.clone()),
            None,
        );
        envelope(&a, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
        let wait: u64 = a.retry_after.as_deref().unwrap().parse().unwrap();
        assert!((1..=2).contains(&wait), "Retry-After {wait}");
        assert!(
            !read.load(std::sync::atomic::Ordering::SeqCst),
            "{path}: the body was read"
        );
    }
    // Cheap requests from the same address are not validation work.
    let health = call(
        &rt,
        &app,
        "10.2.0.1:3",
        Method::GET,
        "/v1/health",
        None,
        Body::empty(),
        None,
    );
    assert_eq!(health.status, StatusCode::OK);
    // Another address has its own budget.
    assert_eq!(batch("10.2.0.2:1", 5, flag()).status, StatusCode::NOT_FOUND);
    // IPv6 addresses are counted by their /64: another host in the same /64 shares the debt,
    // another /64 does not.
    assert_eq!(
        batch("[2001:db8:1:2::1]:1", 20, flag()).status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        batch("[2001:db8:1:2:ffff::9]:1", 1, flag()).status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        batch("[2001:db8:1:3::1]:1", 1, flag()).status,
        StatusCode::NOT_FOUND
    );
    // Once the debt is paid back (20 - 10 at 10 a second: about 1.1 s), the address is let
    // through again.
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(batch("10.2.0.1:4", 1, flag()).status, StatusCode::NOT_FOUND);
}

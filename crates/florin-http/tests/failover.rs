//! `NodeClient` given several node URLs (a cluster's sentinels): it fails over to the next
//! when one cannot be reached or runs no token authority, sticks to the one that answered, and
//! never sends a write again after it may have reached a node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use florin_http::{ClientTls, NodeClient};
use florin_node::api::{ApiError, Info, LedgerTxStatus};

fn info() -> Info {
    Info {
        authority: "eur1test".into(),
        version: "test".into(),
        faucet: false,
        max_faucet_cents: 0,
        faucet_needs_operator: true,
        issuer: None,
    }
}

/// A node on loopback: `role` "ok" answers, "no_authority" answers as a sentinel without the
/// authority, "broken" cuts every connection after reading the request. Counts requests.
async fn node(role: &'static str, hits: Arc<AtomicUsize>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    if role == "broken" {
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                hits.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
                drop(s);
            }
        });
        return addr;
    }
    let (h1, h2) = (hits.clone(), hits);
    let app = Router::new()
        .route(
            "/v1/info",
            get(move || {
                let h = h1.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    if role == "no_authority" {
                        Err((
                            StatusCode::NOT_FOUND,
                            Json(ApiError::new(
                                "no_authority",
                                "this sentinel runs no token authority",
                            )),
                        ))
                    } else {
                        Ok(Json(info()))
                    }
                }
            }),
        )
        .route(
            "/v1/ledger/transactions",
            post(move || {
                let h = h2.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    Json(LedgerTxStatus {
                        txid: "00".into(),
                        status: "confirmed".into(),
                        error: None,
                    })
                }
            }),
        );
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// A loopback address nothing listens on.
fn closed() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn client(urls: &[String]) -> NodeClient {
    NodeClient::with_tls(&urls.join(","), &ClientTls::system()).unwrap()
}

#[tokio::test]
async fn reads_and_writes_fail_over_to_the_next_url_and_stay_there() {
    let hits = Arc::new(AtomicUsize::new(0));
    let up = node("ok", hits.clone()).await;
    let urls = vec![format!("http://{}", closed()), format!("http://{up}")];
    let c = client(&urls);
    assert_eq!(c.bases(), &urls[..]);
    assert_eq!(c.info().await.unwrap().authority, "eur1test");
    assert_eq!(c.base(), urls[1], "sticks to the node that answered");
    // A write whose connection was refused went nowhere: sent to the next node.
    let c = client(&urls);
    assert_eq!(c.submit("00".into()).await.unwrap().status, "confirmed");
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_sentinel_without_the_authority_passes_to_the_next() {
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let sentinel = node("no_authority", a.clone()).await;
    let authority = node("ok", b.clone()).await;
    let c = client(&[format!("http://{sentinel}"), format!("http://{authority}")]);
    assert_eq!(c.info().await.unwrap().version, "test");
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 1));
    // Alone, the sentinel's refusal is the answer.
    let c = client(&[format!("http://{sentinel}")]);
    let e = c.info().await.unwrap_err();
    assert_eq!(e.code(), Some("no_authority"));
}

#[tokio::test]
async fn a_write_that_may_have_arrived_is_never_sent_again() {
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let broken = node("broken", a.clone()).await;
    let up = node("ok", b.clone()).await;
    let urls = [format!("http://{broken}"), format!("http://{up}")];
    // The write reached the first node, whose answer broke off: not resent (the caller
    // reconciles by txid), so the second node never sees it.
    let e = client(&urls).submit("00".into()).await.unwrap_err();
    assert!(
        matches!(e, florin_http::client::ClientError::Unreachable { .. }),
        "{e:?}"
    );
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 0));
    // A read is safe to repeat: it goes on to the second.
    assert_eq!(client(&urls).info().await.unwrap().version, "test");
    assert_eq!(b.load(Ordering::SeqCst), 1);
}

/// A ledger on loopback for a provider's links: `/v1/ledger/unspent/{id}` answers unspent,
/// `/v1/ledger/faucet` mints (counting requests); "broken" cuts every connection.
async fn ledger(role: &'static str, hits: Arc<AtomicUsize>) -> SocketAddr {
    if role == "broken" {
        return node("broken", hits).await;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (h1, h2) = (hits.clone(), hits);
    let app = Router::new()
        .route(
            "/v1/ledger/unspent/{id}",
            get(
                move |axum::extract::Path(id): axum::extract::Path<String>| {
                    let h = h1.clone();
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        Json(florin_node::api::Unspent { id, unspent: true })
                    }
                },
            ),
        )
        .route(
            "/v1/ledger/faucet",
            post(move || {
                let h = h2.clone();
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    Json(florin_node::api::LedgerFaucetAnswer {
                        txid: "11".into(),
                        outputs: vec![],
                    })
                }
            }),
        );
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

#[tokio::test]
async fn a_providers_ledger_links_fail_over_only_when_safe() {
    use florin_node::psp::PspLinks;
    let links = florin_http::HttpLinks::new().unwrap();
    let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let up = ledger("ok", b.clone()).await;
    // Nothing listening at the first URL: reads and writes go on to the next.
    let urls = format!("http://{},http://{up}", closed());
    assert!(links.is_unspent(&urls, &[7; 32]).await.unwrap());
    let req = florin_node::api::LedgerFaucet {
        owner: "eur1x".into(),
        amount_cents: 1,
    };
    assert_eq!(links.faucet(&urls, &req).await.unwrap().txid, "11");
    assert_eq!(b.load(Ordering::SeqCst), 2);
    // The first cuts the answer off: a write (a mint that may have happened) is not asked
    // again at the next; a read is.
    let links = florin_http::HttpLinks::new().unwrap();
    let broken = ledger("broken", a.clone()).await;
    let urls = format!("http://{broken},http://{up}");
    assert!(links.faucet(&urls, &req).await.is_err());
    assert!(links.is_unspent(&urls, &[7; 32]).await.unwrap());
    assert_eq!(
        (a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)),
        (2, 3),
        "the broken node saw both; the next only the read"
    );
    // Once the next has answered, calls start there: the broken node is not asked again.
    assert!(links.is_unspent(&urls, &[7; 32]).await.unwrap());
    assert_eq!(links.faucet(&urls, &req).await.unwrap().txid, "11");
    assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (2, 5));
}

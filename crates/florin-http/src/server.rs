//! One hardened server loop for every HTTP listener (the node's API, [`crate::serve`], and the
//! provider's, [`crate::psp::serve`]).
//!
//! - TLS (rustls) when [`ServeOptions::tls`] is set, else plain HTTP/1.1.
//! - A TLS handshake must finish within [`ServeOptions::tls_handshake_timeout`], and a
//!   request's header within [`ServeOptions::header_read_timeout`] (the clock also runs while a
//!   kept-alive connection waits for its next request, so idle connections are closed too).
//! - A request's body must arrive within [`ServeOptions::body_read_timeout`] of the handler
//!   starting to read it; a slower body fails the request.
//! - At most [`ServeOptions::max_connections`] connections are open at once; one accepted over
//!   the cap is **closed at once** (the client sees a reset and may retry), so a flood of idle
//!   connections costs a file descriptor for a moment, never a queue that grows.
//! - Shutdown stops accepting, lets every open connection finish its request in flight (closing
//!   it afterwards), and gives up waiting after [`ServeOptions::drain_timeout`].
//! - Handlers see the peer's address as `axum::extract::ConnectInfo<SocketAddr>`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::tls::ServerTls;

/// How a listener is served. [`Default`] is plain HTTP with the limits below.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// TLS; `None` serves plain HTTP (the CLI allows that only on loopback).
    pub tls: Option<ServerTls>,
    /// Longest wait for a request's header (and for the next request on a kept-alive
    /// connection). Default 10 s.
    pub header_read_timeout: Duration,
    /// Longest TLS handshake. Default 10 s.
    pub tls_handshake_timeout: Duration,
    /// Longest wait for a whole request body once its handler reads it. Default 30 s.
    pub body_read_timeout: Duration,
    /// Most connections open at once; more are closed at once. Default 1,024.
    pub max_connections: usize,
    /// Longest wait at shutdown for requests in flight. Default 30 s.
    pub drain_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            tls: None,
            header_read_timeout: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

impl ServeOptions {
    /// The defaults with `tls` (or plain HTTP for `None`).
    pub fn with_tls(tls: Option<ServerTls>) -> ServeOptions {
        ServeOptions {
            tls,
            ..ServeOptions::default()
        }
    }
}

/// A request body that fails once its deadline passes.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl hyper::body::Body for TimedBody {
    type Data = hyper::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(r) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(r.map(|f| f.map_err(Into::into)));
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err("request body read timed out".into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `router` on `listener` with `options` until `shutdown` resolves, then drains.
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = options
        .tls
        .as_ref()
        .map(|t| tokio_rustls::TlsAcceptor::from(t.config()));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    let options = Arc::new(options);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little, never spin.
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::Interrupted
                    ) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Over the cap: closed at once.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let acceptor = acceptor.clone();
        let http = http.clone();
        let options = options.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _permit = permit;
            let body_timeout = options.body_read_timeout;
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (mut parts, body) = req.into_parts();
                parts.extensions.insert(ConnectInfo(peer));
                let body = Body::new(TimedBody {
                    inner: body,
                    deadline: Box::pin(tokio::time::sleep(body_timeout)),
                });
                router.clone().oneshot(Request::from_parts(parts, body))
            });
            match acceptor {
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(
                        options.tls_handshake_timeout,
                        acceptor.accept(stream),
                    )
                    .await
                    {
                        Ok(Ok(s)) => s,
                        // A failed or slow handshake: the connection is dropped.
                        _ => return,
                    };
                    let conn = http.serve_connection(TokioIo::new(tls), svc);
                    let _ = watcher.watch(conn).await;
                }
                None => {
                    let conn = http.serve_connection(TokioIo::new(stream), svc);
                    let _ = watcher.watch(conn).await;
                }
            }
        });
    }
    drop(listener);
    let drain = options.drain_timeout;
    let _ = tokio::time::timeout(drain, graceful.shutdown()).await;
    Ok(())
}

/// The address type handlers extract.
pub type PeerAddr = ConnectInfo<SocketAddr>;

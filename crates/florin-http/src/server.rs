//! One hardened server loop for every HTTP listener (the node's API, [`crate::serve`], and the
//! provider's, [`crate::psp::serve`]).
//!
//! - TLS (rustls) when [`ServeOptions::tls`] is set, else plain HTTP/1.1.
//! - A TLS handshake must finish within [`ServeOptions::tls_handshake_timeout`], and a
//!   request's header within [`ServeOptions::header_read_timeout`] (the clock also runs while a
//!   kept-alive connection waits for its next request, so idle connections are closed too).
//! - A request's body must arrive within [`ServeOptions::body_read_timeout`] of the handler
//!   starting to read it; a slower body fails the request.
//! - At most [`ServeOptions::max_connections`] connections are open at once, at most
//!   [`ServeOptions::max_connections_per_ip`] from one client address (an IPv6 /64), and one
//!   address may open at most [`ServeOptions::new_connections_per_ip_per_sec`] a second; a
//!   connection accepted over any of these is never served: it is **parked** (held unread, no
//!   TLS work, one timer) for [`ServeOptions::park_for`] and then closed, or closed at once when
//!   [`ServeOptions::max_parked`] are parked already. Parking keeps a client that floods
//!   connections waiting instead of telling it at once to try again, so the flood does not turn
//!   into a churn of handshakes that costs the machine's kernel more than the node; one
//!   address cannot take every slot, and nothing grows past the caps.
//! - A write that makes no progress for [`ServeOptions::write_timeout`] (a client that stops
//!   reading its answers) closes the connection, so such a client does not keep its slot.
//! - Shutdown stops accepting, lets every open connection finish its request in flight (closing
//!   it afterwards), and gives up waiting after [`ServeOptions::drain_timeout`].
//! - Handlers see the peer's address as `axum::extract::ConnectInfo<SocketAddr>`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
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
    /// Most connections open at once; more are refused (parked or closed). Default 1,024.
    pub max_connections: usize,
    /// Most connections one client address (an IPv6 /64) may hold open at once; more are
    /// refused. Default 256.
    pub max_connections_per_ip: usize,
    /// New connections one client address may open per second, sustained, with a burst of
    /// ten times as many; more are refused. 0: no limit. Default 200.
    pub new_connections_per_ip_per_sec: u32,
    /// Longest a write to the client may make no progress before the connection is closed.
    /// Default 30 s.
    pub write_timeout: Duration,
    /// Most connections refused by a cap that are held unread before being closed (each
    /// costs a file descriptor); more are closed at once. 0: close every one at once.
    /// Default 2,048.
    pub max_parked: usize,
    /// How long a refused connection is held before it is closed. Default 10 s.
    pub park_for: Duration,
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
            max_connections_per_ip: 256,
            new_connections_per_ip_per_sec: 200,
            write_timeout: Duration::from_secs(30),
            max_parked: 2048,
            park_for: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(30),
        }
    }
}

impl ServeOptions {
    /// These options without the per-address connection limits (for a load generator that
    /// opens many connections from one address; the global cap stays).
    pub fn without_per_address_limits(self) -> ServeOptions {
        ServeOptions {
            max_connections_per_ip: usize::MAX,
            new_connections_per_ip_per_sec: 0,
            ..self
        }
    }

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

/// The connections each client address holds open, and how fast it opens new ones.
struct PerAddress {
    open: std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>,
    max_open: usize,
    opening: Option<governor::DefaultKeyedRateLimiter<IpAddr>>,
}

/// One open connection of `ip`, counted until dropped.
struct AddressSlot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    fn new(options: &ServeOptions) -> PerAddress {
        let opening = std::num::NonZeroU32::new(options.new_connections_per_ip_per_sec).map(|r| {
            let burst = std::num::NonZeroU32::new(r.get().saturating_mul(10)).unwrap_or(r);
            governor::RateLimiter::keyed(governor::Quota::per_second(r).allow_burst(burst))
        });
        PerAddress {
            open: std::sync::Mutex::new(std::collections::HashMap::new()),
            max_open: options.max_connections_per_ip.max(1),
            opening,
        }
    }

    /// A slot for a new connection from `peer`, or `None` when the address is over a limit.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<AddressSlot> {
        let ip = crate::edge::client_key(peer);
        if let Some(l) = &self.opening {
            if l.len() > 100_000 {
                l.retain_recent();
            }
            l.check_key(&ip).ok()?;
        }
        let mut open = self.open.lock().ok()?;
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max_open {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        // Entries go when their last connection does, so the table holds at most one per
        // open connection.
        let mut open = match self.table.open.lock() {
            Ok(o) => o,
            Err(p) => p.into_inner(),
        };
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Connections refused by a cap, held unread for a while (see the module's documentation).
struct Parking {
    parked: Arc<std::sync::atomic::AtomicUsize>,
    max: usize,
    hold: Duration,
}

/// File descriptors kept free for everything but the connections (stores, logs, peers).
const FD_RESERVE: usize = 256;

/// The process's soft limit of open files (`None` where it cannot be read).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

impl Parking {
    fn new(options: &ServeOptions) -> Parking {
        // Parked connections hold file descriptors: never so many that the process runs out
        // (the open connections and a reserve come first).
        let room = open_files_limit().map_or(options.max_parked, |n| {
            n.saturating_sub(options.max_connections.saturating_add(FD_RESERVE))
        });
        Parking {
            parked: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max: options.max_parked.min(room),
            hold: options.park_for,
        }
    }

    /// Holds `stream` unread for a while, or closes it at once when the lot is full.
    fn refuse(&self, stream: tokio::net::TcpStream) {
        use std::sync::atomic::Ordering;
        let parked = self.parked.clone();
        if parked.fetch_add(1, Ordering::Relaxed) >= self.max {
            parked.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let hold = self.hold;
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            drop(stream);
            parked.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// A connection whose writes fail once one has made no progress for `limit`.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// After a write returned `Pending`: `Ready(Err)` once it has been pending too long.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn track<T>(
        &mut self,
        r: Poll<std::io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<T>> {
        match r {
            Poll::Pending => match self.check(cx) {
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Pending,
            },
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(r, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.track(r, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.track(r, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Counts a connection refused before any request, and says so at debug level.
fn refused(reason: &'static str) {
    tracing::debug!(reason, "connection refused");
    florin_obs::metrics::global()
        .http_connections_refused
        .get_or_create(&florin_obs::metrics::ReasonLabels {
            reason: reason.to_string(),
        })
        .inc();
}

/// Serves `router` on `listener` with `options` until `shutdown` resolves, then drains.
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Outermost: every answer, the edge's refusals included, is logged and counted.
    let router = router.layer(axum::middleware::from_fn(crate::observe::observe));
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let per_address = Arc::new(PerAddress::new(&options));
    let parking = Parking::new(&options);
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
        // Over a cap: parked, or closed at once.
        let Some(slot) = per_address.admit(peer.ip()) else {
            refused("per_address");
            parking.refuse(stream);
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused("capacity");
            parking.refuse(stream);
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
            let _slot = slot;
            let stream = WriteDeadline::new(stream, options.write_timeout);
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

#[cfg(test)]
mod tests {
    use super::ServeOptions;

    /// A sentinel's `[connections]` left out of its `node.toml` means what `florin devnet`
    /// gets by default.
    #[test]
    fn a_sentinels_default_connection_limits_are_the_servers() {
        let node = florin_node::api::ConnectionLimits::default();
        let server = ServeOptions::default();
        assert_eq!(node.max, server.max_connections);
        assert_eq!(node.per_ip, server.max_connections_per_ip);
        assert_eq!(
            node.new_per_ip_per_sec,
            server.new_connections_per_ip_per_sec
        );
    }
}

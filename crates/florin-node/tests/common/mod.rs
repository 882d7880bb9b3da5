//! What the node's API test files share: a plain HTTP/1.0 client, a tokio runtime, and a
//! ledger node (authority with faucet, ledger on the embedded store) serving on loopback.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use florin_crypto::{LocalSigner, SecretKey};
use florin_http::AppState;
use florin_node::{Authority, AuthorityConfig, Ledger};
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};
use serde_json::Value;

/// One HTTP/1.0 request: `body` is its content type and bytes; answers the status code and
/// the body as JSON (`Null` if it is not JSON). `timeout` bounds the wait for the answer.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<(&str, &[u8])>,
    timeout: Option<Duration>,
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    if timeout.is_some() {
        s.set_read_timeout(timeout).unwrap();
    }
    let req = match body {
        Some((kind, b)) => {
            let mut req = format!(
                "{method} {path} HTTP/1.0\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
                b.len()
            )
            .into_bytes();
            req.extend_from_slice(b);
            req
        }
        None => format!("{method} {path} HTTP/1.0\r\n\r\n").into_bytes(),
    };
    s.write_all(&req).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code: u16 = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A request with a JSON body (or none), waiting as long as it takes.
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    request(
        addr,
        method,
        path,
        body.map(|b| ("application/json", b.as_bytes())),
        None,
    )
}

/// The multi-threaded runtime a test server runs on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The ledger node (authority with faucet, ledger on the embedded store) serving the API on
/// loopback. Dropped, it tells the server to stop.
pub struct LedgerNode {
    pub addr: SocketAddr,
    pub authority: Arc<Authority>,
    pub rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl LedgerNode {
    pub fn start() -> LedgerNode {
        LedgerNode::start_with(|dir| AuthorityConfig::devnet(dir))
    }

    /// A node whose authority runs `config(data dir)`.
    pub fn start_with(config: impl FnOnce(&std::path::Path) -> AuthorityConfig) -> LedgerNode {
        let dir = tempfile::tempdir().unwrap();
        let auth = Arc::new(LocalSigner::new(SecretKey::from_seed(&[9; 32])));
        let authority = Arc::new(Authority::open(config(dir.path()), auth).unwrap());
        let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("ledger"))).unwrap();
        let issuer = Arc::new(LocalSigner::new(SecretKey::from_seed(&[8; 32])));
        let rt = runtime();
        let ledger = rt.block_on(async { Ledger::start(Arc::new(store), issuer) });
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let state = AppState {
            authority: Some(authority.clone()),
            ledger: Some(ledger),
            limits: florin_http::RateLimits::default(),
            cluster: None,
            custody: None,
        };
        let server = rt.spawn(florin_http::serve(listener, state, async {
            let _ = rx.await;
        }));
        LedgerNode {
            addr,
            authority,
            rt,
            stop: Some(stop),
            server: Some(server),
            _dir: dir,
        }
    }

    /// Stops the server and checks it ended cleanly.
    pub fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.server.take() {
            self.rt.block_on(h).unwrap().unwrap();
        }
    }
}

impl Drop for LedgerNode {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

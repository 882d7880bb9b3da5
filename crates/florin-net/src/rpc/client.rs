//! The calling side of the RPC layer: a pooled, authenticated link to one peer.
//!
//! - **Pinned key.** Every connection proves the peer's key ([`crate::channel::connect`] with
//!   the expected key); a peer holding another key is refused.
//! - **A pool of idle connections** per peer, at most [`RpcClient::new`]'s `max_idle`; a
//!   request takes one or dials a fresh one.
//! - **One retry, only where it is safe.** A pooled connection the peer closed while idle
//!   (a send or read that finds the connection closed or reset) is retried once on a fresh
//!   connection; any other failure (a timeout, an answer too large, a broken frame) is not. A fresh connection that fails, or any request that times out, is not sent
//!   again: the peer may be working on it, and sending it twice would double the stall.
//! - **Send, then read.** [`RpcClient::send`] returns a [`Pending`] request, so a caller can
//!   send to several peers before reading any answer and let them work in parallel.
//!
//! The client sees bytes; each caller keeps its own message types and codec (as the server
//! does).

use std::io::ErrorKind;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use florin_crypto::{LocalSigner, PublicKey};

use crate::channel::{connect, Channel, ChannelConfig, NetError};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// No connection could be made (refused, no route, handshake failed, wrong key).
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The peer.
        addr: String,
        /// Why.
        source: NetError,
    },
    /// The peer did not answer in time; the request may or may not have been carried out.
    #[error("{addr} did not answer in time")]
    TimedOut {
        /// The peer.
        addr: String,
    },
    /// The connection broke while sending or reading.
    #[error("connection to {addr} lost: {source}")]
    Lost {
        /// The peer.
        addr: String,
        /// Why.
        source: NetError,
    },
}

impl CallError {
    /// Whether the peer may have received the request (so a caller must not assume it was
    /// not carried out).
    pub fn maybe_delivered(&self) -> bool {
        !matches!(self, CallError::Connect { .. })
    }
}

/// Whether `e` says the peer had closed the connection (what a pooled connection the peer
/// dropped while idle gives), the one failure worth sending again on a fresh connection. A
/// timeout, a frame too large, a broken frame or any other error may follow the peer acting
/// on the request: never sent again.
fn closed(e: &NetError) -> bool {
    match e {
        NetError::Closed => true,
        NetError::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
        ),
        _ => false,
    }
}

fn timed_out(e: &NetError) -> bool {
    matches!(e, NetError::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
}

/// Where a client dials.
#[derive(Debug, Clone)]
enum Target {
    Resolved(SocketAddr),
    Named(String),
}

/// A pooled, authenticated link to one peer.
pub struct RpcClient {
    target: Target,
    name: String,
    key: PublicKey,
    me: Arc<LocalSigner>,
    pool: Mutex<Vec<Channel>>,
    max_idle: usize,
    connect_timeout: Duration,
    max_message: usize,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("peer", &self.name)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientLimits {
    /// Idle connections kept.
    pub max_idle: usize,
    /// Longest a connection and its handshake may take.
    pub connect_timeout: Duration,
    /// Largest answer read.
    pub max_message: usize,
}

impl RpcClient {
    /// A link to the peer at `addr` (resolved at each dial when it is a name) that must prove
    /// `key`, authenticating as `me`.
    pub fn new(
        addr: &str,
        key: PublicKey,
        me: Arc<LocalSigner>,
        limits: &ClientLimits,
    ) -> RpcClient {
        let target = match addr.parse::<SocketAddr>() {
            Ok(a) => Target::Resolved(a),
            Err(_) => Target::Named(addr.to_string()),
        };
        RpcClient {
            target,
            name: addr.to_string(),
            key,
            me,
            pool: Mutex::new(Vec::new()),
            max_idle: limits.max_idle,
            connect_timeout: limits.connect_timeout,
            max_message: limits.max_message,
        }
    }

    /// The peer's address, as given.
    pub fn addr(&self) -> &str {
        &self.name
    }

    /// The key the peer must prove.
    pub fn key(&self) -> &PublicKey {
        &self.key
    }

    /// Drops the idle connections (e.g. after the peer failed).
    pub fn clear(&self) {
        if let Ok(mut p) = self.pool.lock() {
            p.clear();
        }
    }

    fn dial(&self) -> Result<Channel, CallError> {
        let cfg = ChannelConfig {
            timeout: self.connect_timeout,
            ..ChannelConfig::default()
        };
        let r = match &self.target {
            Target::Resolved(a) => connect(*a, self.me.as_ref(), Some(self.key), &cfg),
            Target::Named(n) => {
                // Resolve the name first so one that does not resolve is a connect error.
                match n.to_socket_addrs() {
                    Ok(mut it) => match it.next() {
                        Some(a) => connect(a, self.me.as_ref(), Some(self.key), &cfg),
                        None => Err(NetError::Protocol("no address to dial".into())),
                    },
                    Err(e) => Err(NetError::Io(e)),
                }
            }
        };
        r.map_err(|source| CallError::Connect {
            addr: self.name.clone(),
            source,
        })
    }

    fn lost(&self, source: NetError) -> CallError {
        if timed_out(&source) {
            CallError::TimedOut {
                addr: self.name.clone(),
            }
        } else {
            CallError::Lost {
                addr: self.name.clone(),
                source,
            }
        }
    }

    /// Sends `request`; [`Pending::finish`] reads the answer.
    pub fn send(&self, request: Vec<u8>) -> Result<Pending<'_>, CallError> {
        let pooled = self.pool.lock().ok().and_then(|mut p| p.pop());
        let (mut ch, reused) = match pooled {
            Some(c) => (c, true),
            None => (self.dial()?, false),
        };
        if let Err(e) = ch.send(&request) {
            if !reused || !closed(&e) {
                return Err(self.lost(e));
            }
            // A pooled connection the peer closed while idle: one fresh try.
            ch = self.dial()?;
            ch.send(&request).map_err(|e| self.lost(e))?;
            return Ok(Pending {
                client: self,
                ch,
                reused: false,
                request,
            });
        }
        Ok(Pending {
            client: self,
            ch,
            reused,
            request,
        })
    }

    /// One request, one answer, waiting at most `timeout` for the answer.
    pub fn call(&self, request: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, CallError> {
        self.send(request)?.finish(timeout)
    }
}

/// A request sent and not yet answered.
pub struct Pending<'a> {
    client: &'a RpcClient,
    ch: Channel,
    reused: bool,
    request: Vec<u8>,
}

impl Pending<'_> {
    /// Reads the answer, waiting at most `timeout`; the connection goes back to the pool.
    pub fn finish(self, timeout: Duration) -> Result<Vec<u8>, CallError> {
        let Pending {
            client,
            mut ch,
            reused,
            request,
        } = self;
        let _ = ch.set_timeout(timeout);
        let answer = match ch.recv(client.max_message) {
            Ok(b) => b,
            Err(first) => {
                // Only a pooled connection the peer closed is worth one fresh try; a peer that
                // timed out is slow or hung, and may be working on the request.
                if !reused || !closed(&first) {
                    return Err(client.lost(first));
                }
                ch = client.dial()?;
                let _ = ch.set_timeout(timeout);
                ch.send(&request)
                    .and_then(|_| ch.recv(client.max_message))
                    .map_err(|e| client.lost(e))?
            }
        };
        if let Ok(mut p) = client.pool.lock() {
            if p.len() < client.max_idle {
                p.push(ch);
            }
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{RpcLimits, RpcServer, Service};
    use florin_crypto::{SecretKey, Signer};
    use rand::rngs::OsRng;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// Echoes; `sleep:` requests sleep first; counts requests.
    struct Echo {
        seen: AtomicUsize,
    }

    impl Service for Echo {
        type Session = ();
        fn admit(&self, _: &PublicKey) -> Option<()> {
            Some(())
        }
        fn handle(&self, _: &PublicKey, _: &mut (), req: &[u8]) -> Option<Vec<u8>> {
            self.seen.fetch_add(1, Ordering::SeqCst);
            if req.starts_with(b"sleep") {
                std::thread::sleep(Duration::from_millis(600));
            }
            Some(req.to_vec())
        }
    }

    fn key() -> Arc<LocalSigner> {
        Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng)))
    }

    fn server(idle: Duration) -> std::io::Result<(RpcServer, Arc<Echo>, Arc<LocalSigner>)> {
        let k = key();
        let echo = Arc::new(Echo {
            seen: AtomicUsize::new(0),
        });
        let limits = RpcLimits {
            max_connections: 8,
            max_handshakes: 4,
            handshake_deadline: Duration::from_secs(2),
            idle,
            write_deadline: Duration::from_secs(2),
            max_message: 1024,
        };
        let s = RpcServer::start(
            TcpListener::bind("127.0.0.1:0")?,
            k.clone(),
            limits,
            "t",
            echo.clone(),
        )?;
        Ok((s, echo, k))
    }

    fn limits() -> ClientLimits {
        ClientLimits {
            max_idle: 2,
            connect_timeout: Duration::from_secs(2),
            max_message: 1024,
        }
    }

    #[test]
    fn pools_connections_and_retries_only_a_closed_idle_one(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (srv, echo, k) = server(Duration::from_millis(300))?;
        let c = RpcClient::new(&srv.addr().to_string(), k.public_key(), key(), &limits());
        let t = Duration::from_secs(2);
        assert_eq!(c.call(b"a".to_vec(), t)?, b"a");
        assert_eq!(c.call(b"b".to_vec(), t)?, b"b");
        // Two requests sent before either is read run on two connections.
        let p1 = c.send(b"c".to_vec())?;
        let p2 = c.send(b"d".to_vec())?;
        assert_eq!(p2.finish(t)?, b"d");
        assert_eq!(p1.finish(t)?, b"c");
        // The server closes idle connections; the next call retries once on a fresh one.
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(c.call(b"e".to_vec(), t)?, b"e");
        assert_eq!(echo.seen.load(Ordering::SeqCst), 5);
        // A request that times out is not sent again.
        let before = Instant::now();
        let r = c.call(b"sleep".to_vec(), Duration::from_millis(100));
        assert!(matches!(r, Err(CallError::TimedOut { .. })), "{r:?}");
        assert!(before.elapsed() < Duration::from_millis(550));
        std::thread::sleep(Duration::from_millis(700));
        assert_eq!(echo.seen.load(Ordering::SeqCst), 6);
        Ok(())
    }

    #[test]
    fn refuses_a_peer_with_another_key_and_a_dead_address() -> Result<(), Box<dyn std::error::Error>>
    {
        let (srv, _, _) = server(Duration::from_secs(5))?;
        let impostor = RpcClient::new(
            &srv.addr().to_string(),
            key().public_key(),
            key(),
            &limits(),
        );
        let r = impostor.call(b"a".to_vec(), Duration::from_secs(1));
        assert!(
            matches!(
                r,
                Err(CallError::Connect {
                    source: NetError::WrongPeer { .. },
                    ..
                })
            ),
            "{r:?}"
        );
        let dead = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let c = RpcClient::new(&dead.to_string(), key().public_key(), key(), &limits());
        let r = c.call(b"a".to_vec(), Duration::from_secs(1));
        assert!(
            matches!(&r, Err(e @ CallError::Connect { .. }) if !e.maybe_delivered()),
            "{r:?}"
        );
        Ok(())
    }
}

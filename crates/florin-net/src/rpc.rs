//! The one authenticated request/answer layer of Florin's services (the ledger cluster's nodes
//! and the custody network's nodes): Noise channels with pinned keys ([`crate::channel`]), one
//! request at a time per connection, and the same limits everywhere. This file is the serving
//! side; [`client`] is the calling side ([`RpcClient`]: pooled connections per peer, one retry
//! only where it is safe).
//!
//! - **Handshakes in their own slots.** At most [`RpcLimits::max_handshakes`] connections may
//!   be in the Noise handshake (unauthenticated) at once; when all are taken, the *oldest* is
//!   cut, so a flood of silent connections cannot lock an honest peer out: a flood must open
//!   that many connections within one honest handshake to cut it. A handshake that takes
//!   longer than [`RpcLimits::handshake_deadline`] is dropped.
//! - **Admission by key.** After the handshake the [`Service`] decides from the peer's proven
//!   key whether to serve it ([`Service::admit`]); at most [`RpcLimits::max_connections`]
//!   admitted connections are served at once.
//! - **Bounded messages and time.** A request larger than [`RpcLimits::max_message`] closes the
//!   connection; an idle connection is closed after [`RpcLimits::idle`]; a peer that stops
//!   reading its answer is cut after [`RpcLimits::write_deadline`].
//! - **Stopping** closes every open connection and handshake at once.
//!
//! The service sees bytes: each caller keeps its own message types and codec.

pub mod client;
pub use client::{CallError, ClientLimits, Pending, RpcClient};

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use florin_crypto::{LocalSigner, PublicKey};

use crate::channel::{accept_on, ChannelConfig, NetError};

/// The limits a server keeps.
#[derive(Debug, Clone)]
pub struct RpcLimits {
    /// Admitted connections served at once.
    pub max_connections: usize,
    /// Connections in the handshake at once (the oldest is cut beyond).
    pub max_handshakes: usize,
    /// Longest a peer may take over its handshake.
    pub handshake_deadline: Duration,
    /// An admitted connection idle this long is closed.
    pub idle: Duration,
    /// Longest a peer may take to read an answer.
    pub write_deadline: Duration,
    /// Largest request.
    pub max_message: usize,
}

/// What a server does for its peers.
pub trait Service: Send + Sync + 'static {
    /// Per-connection state (e.g. the peer's rights).
    type Session: Send;
    /// Whether to serve `peer` (its key proven by the handshake), and its session.
    fn admit(&self, peer: &PublicKey) -> Option<Self::Session>;
    /// Answers one request; `None` closes the connection (e.g. the peer was revoked).
    fn handle(
        &self,
        peer: &PublicKey,
        session: &mut Self::Session,
        request: &[u8],
    ) -> Option<Vec<u8>>;
}

struct Shared {
    stop: AtomicBool,
    next: AtomicU64,
    connections: AtomicUsize,
    /// Connections in their handshake, oldest first.
    handshakes: Mutex<VecDeque<(u64, TcpStream)>>,
    /// Admitted connections, to close them when stopping.
    open: Mutex<HashMap<u64, TcpStream>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running server. Dropping it stops it.
pub struct RpcServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl RpcServer {
    /// Serves `service` on `listener` as `identity`, under `limits`. `name` names its threads.
    pub fn start<S: Service>(
        listener: TcpListener,
        identity: Arc<LocalSigner>,
        limits: RpcLimits,
        name: &str,
        service: Arc<S>,
    ) -> std::io::Result<RpcServer> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            next: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            handshakes: Mutex::new(VecDeque::new()),
            open: Mutex::new(HashMap::new()),
        });
        let s = shared.clone();
        let conn_name = format!("{name}-conn");
        let accept = thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || accept_loop(&s, listener, &identity, &limits, &conn_name, &service))?;
        Ok(RpcServer {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Blocks until the server stops (another thread calls [`RpcServer::stop`], or the
    /// process ends).
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// Stops accepting and closes every connection and handshake now.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for (_, s) in lock(&self.shared.open).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, s) in lock(&self.shared.handshakes).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop<S: Service>(
    shared: &Arc<Shared>,
    listener: TcpListener,
    identity: &Arc<LocalSigner>,
    limits: &RpcLimits,
    conn_name: &str,
    service: &Arc<S>,
) {
    for stream in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        let id = shared.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut hs = lock(&shared.handshakes);
            if hs.len() >= limits.max_handshakes {
                if let Some((_, oldest)) = hs.pop_front() {
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            hs.push_back((id, copy));
        }
        let (shared2, identity, limits2, service) = (
            shared.clone(),
            identity.clone(),
            limits.clone(),
            service.clone(),
        );
        let spawned = thread::Builder::new()
            .name(conn_name.to_string())
            .spawn(move || serve_stream(&shared2, id, stream, &identity, &limits2, &*service));
        if spawned.is_err() {
            end_handshake(shared, id);
        }
    }
}

fn end_handshake(shared: &Shared, id: u64) {
    lock(&shared.handshakes).retain(|(i, _)| *i != id);
}

fn serve_stream<S: Service>(
    shared: &Shared,
    id: u64,
    stream: TcpStream,
    identity: &LocalSigner,
    limits: &RpcLimits,
    service: &S,
) {
    let cfg = ChannelConfig {
        timeout: limits.handshake_deadline,
        ..ChannelConfig::default()
    };
    let ch = accept_on(stream, identity, &cfg);
    end_handshake(shared, id);
    let Ok(mut ch) = ch else { return };
    let peer = ch.peer();
    let Some(mut session) = service.admit(&peer) else {
        return;
    };
    if shared.connections.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    if let Ok(c) = ch.try_clone_stream() {
        lock(&shared.open).insert(id, c);
    }
    let _ = ch.set_timeout(limits.idle);
    let _ = ch.set_write_timeout(limits.write_deadline);
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(bytes) = ch.recv(limits.max_message) else {
            break;
        };
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let Some(answer) = service.handle(&peer, &mut session, &bytes) else {
            break;
        };
        if let Err(NetError::Closed | NetError::Io(_)) = ch.send(&answer) {
            break;
        }
    }
    lock(&shared.open).remove(&id);
    shared.connections.fetch_sub(1, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::connect;
    use florin_crypto::{SecretKey, Signer};
    use rand::rngs::OsRng;

    struct Echo {
        allowed: PublicKey,
    }

    impl Service for Echo {
        type Session = u64;
        fn admit(&self, peer: &PublicKey) -> Option<u64> {
            (*peer == self.allowed).then_some(0)
        }
        fn handle(&self, _: &PublicKey, n: &mut u64, req: &[u8]) -> Option<Vec<u8>> {
            *n += 1;
            (req != b"bye").then(|| [req, &n.to_le_bytes()].concat())
        }
    }

    fn limits() -> RpcLimits {
        RpcLimits {
            max_connections: 2,
            max_handshakes: 2,
            handshake_deadline: Duration::from_secs(2),
            idle: Duration::from_secs(5),
            write_deadline: Duration::from_secs(5),
            max_message: 64,
        }
    }

    fn key() -> LocalSigner {
        LocalSigner::new(SecretKey::generate(&mut OsRng))
    }

    #[test]
    fn serves_admitted_peers_under_its_limits() -> Result<(), Box<dyn std::error::Error>> {
        let (server_key, client, stranger) = (Arc::new(key()), key(), key());
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let service = Arc::new(Echo {
            allowed: client.public_key(),
        });
        let server = RpcServer::start(listener, server_key.clone(), limits(), "t", service)?;
        let cfg = ChannelConfig::default();
        let pinned = Some(server_key.public_key());
        // Sessions are per connection; requests are answered in order.
        let mut a = connect(server.addr(), &client, pinned, &cfg)?;
        a.send(b"x")?;
        assert_eq!(a.recv(64)?, [&b"x"[..], &1u64.to_le_bytes()].concat());
        a.send(b"y")?;
        assert_eq!(a.recv(64)?, [&b"y"[..], &2u64.to_le_bytes()].concat());
        // A stranger completes the handshake and is dropped.
        let mut s = connect(server.addr(), &stranger, pinned, &cfg)?;
        let _ = s.send(b"x");
        assert!(s.recv(64).is_err());
        // Silent connections beyond the handshake slots cut the oldest, not the service.
        let silent: Vec<TcpStream> = (0..8)
            .map(|_| TcpStream::connect(server.addr()))
            .collect::<Result<_, _>>()?;
        let mut b = connect(server.addr(), &client, pinned, &cfg)?;
        b.send(b"z")?;
        assert_eq!(b.recv(64)?, [&b"z"[..], &1u64.to_le_bytes()].concat());
        drop(silent);
        // The connection cap: a third admitted connection is closed.
        let mut c = connect(server.addr(), &client, pinned, &cfg)?;
        let _ = c.send(b"w");
        assert!(c.recv(64).is_err());
        // Too large a request, or a service that ends the session, closes the connection.
        a.send(&[0u8; 65])?;
        assert!(a.recv(64).is_err());
        b.send(b"bye")?;
        assert!(b.recv(64).is_err());
        // Stopping closes what is open.
        let mut d = connect(server.addr(), &client, pinned, &cfg)?;
        d.send(b"q")?;
        d.recv(64)?;
        server.stop();
        let _ = d.send(b"q");
        assert!(d.recv(64).is_err());
        Ok(())
    }
}

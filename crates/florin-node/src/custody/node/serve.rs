//! The node as a [`florin_net::rpc::Service`]: admits clients and administrators by key, and
//! re-reads access before every request, so a revoked peer is dropped at its next request.
//! Connections, handshake slots, limits and stopping are the shared RPC server's.

use florin_net::rpc::{RpcLimits, Service};

use super::*;

/// The limits the node's server keeps.
pub(super) fn limits() -> RpcLimits {
    RpcLimits {
        max_connections: MAX_CONNECTIONS,
        max_handshakes: MAX_HANDSHAKES,
        handshake_deadline: HANDSHAKE_DEADLINE,
        idle: IDLE,
        write_deadline: WRITE_DEADLINE,
        max_message: MAX_WIRE,
    }
}

/// The node's requests, served to the peers its access list names.
pub(super) struct NodeService(pub(super) Arc<Inner>);

impl Service for NodeService {
    /// The peer's rights and the access generation they were read at.
    type Session = (Rights, u64);

    fn admit(&self, peer: &PublicKey) -> Option<(Rights, u64)> {
        let seen = self.0.access_gen.load(Ordering::SeqCst);
        access(&self.0).rights(peer).map(|r| (r, seen))
    }

    fn handle(
        &self,
        peer: &PublicKey,
        (rights, seen): &mut (Rights, u64),
        bytes: &[u8],
    ) -> Option<Vec<u8>> {
        let inner = &self.0;
        if inner.stop.load(Ordering::Relaxed) {
            return None;
        }
        // The access list changed since this peer's rights were read: read them again, and
        // drop a peer that was revoked, before serving anything more.
        let now = inner.access_gen.load(Ordering::SeqCst);
        if now != *seen {
            *seen = now;
            *rights = access(inner).rights(peer)?;
        }
        let answer = match wire::decode::<Request>(bytes, "request") {
            Ok(req) => {
                handle(inner, rights, req).unwrap_or_else(|e| Response::Refused(Refusal::from(&e)))
            }
            Err(e) => Response::Refused(Refusal::from(&e)),
        };
        Some(wire::encode(&answer))
    }
}

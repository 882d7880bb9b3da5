//! Between replicas: the RPC messages ([`RaftRpc`], [`RpcReply`], postcard-encoded), the
//! [`RaftTransport`] that carries them as opaque bytes, and openraft's network side (a client
//! per peer) on top of it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, SnapshotMismatch, Unreachable,
};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, RaftNetwork, RaftNetworkFactory};
use serde::{Deserialize, Serialize};

use super::{NodeId, OrRaftError, TypeConfig};

/// The future a [`RaftTransport`] call returns.
pub type TransportFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, TransportError>> + Send>>;

/// Why a [`RaftTransport`] call brought back no answer from the peer. The replica only reports
/// it (openraft counts the peer as unreachable and retries later); the peer's own refusals
/// travel inside the answer instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// The transport knows no route to this member.
    #[error("unknown member {target} at {addr}")]
    UnknownMember {
        /// The member called.
        target: NodeId,
        /// The address it was called at.
        addr: String,
    },
    /// The member cannot be reached now (down, or cut off).
    #[error("node {target} unreachable")]
    Unreachable {
        /// The member called.
        target: NodeId,
    },
    /// The call failed on its way (connection, handshake, deadline): the transport's own error.
    #[error("{source}")]
    Failed {
        /// The member called.
        target: NodeId,
        /// The transport's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The peer answered, but not with a raft answer.
    #[error("unexpected answer {answer}")]
    UnexpectedAnswer {
        /// The member called.
        target: NodeId,
        /// The answer it gave, as `Debug` shows it.
        answer: String,
    },
}

impl TransportError {
    /// A call to `target` that failed with the transport's error `source`.
    pub fn failed(
        target: NodeId,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        TransportError::Failed {
            target,
            source: source.into(),
        }
    }
}

/// How a replica reaches a peer: send one encoded raft RPC, get the encoded answer (the bytes the
/// peer's [`super::Replica::handle_rpc`] returned). An `Err` means the peer could not be reached.
pub trait RaftTransport: Send + Sync + 'static {
    /// Sends `request` to replica `target` at `addr` and returns its answer.
    fn call(&self, target: NodeId, addr: &str, request: Vec<u8>) -> TransportFuture;
}

type NetError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, OrRaftError<E>>;

/// A request from one replica to another.
#[derive(Serialize, Deserialize)]
pub(super) enum RaftRpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A successful answer; on the wire it travels as `Result<RpcReply, String>`.
#[derive(Serialize, Deserialize)]
pub(super) enum RpcReply {
    Append(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, SnapshotMismatch>),
}

/// Decodes a raft request as a replica reads it ([`super::Replica::handle_rpc`]: trailing bytes
/// ignored) and encodes it again; `None` when the bytes are not a request. For the fuzz targets.
pub fn reencode_rpc(request: &[u8]) -> Option<Vec<u8>> {
    let (rpc, _) = postcard::take_from_bytes::<RaftRpc>(request).ok()?;
    postcard::to_allocvec(&rpc).ok()
}

/// Decodes a replica's answer as a peer reads it (`Result<RpcReply, String>`) and encodes it
/// again; `None` when the bytes are not an answer. For the fuzz targets.
pub fn reencode_reply(answer: &[u8]) -> Option<Vec<u8>> {
    let reply: Result<RpcReply, String> = postcard::from_bytes(answer).ok()?;
    postcard::to_allocvec(&reply).ok()
}

/// A vote request from `candidate` for `term`, encoded as replicas send it (seeds for the fuzz
/// targets).
pub fn encode_vote_request(term: u64, candidate: NodeId) -> Option<Vec<u8>> {
    let rpc = RaftRpc::Vote(VoteRequest::new(openraft::Vote::new(term, candidate), None));
    postcard::to_allocvec(&rpc).ok()
}

pub(super) struct NetworkFactory {
    pub(super) transport: Arc<dyn RaftTransport>,
    pub(super) backoff: Duration,
}

pub(super) struct Peer {
    transport: Arc<dyn RaftTransport>,
    target: NodeId,
    addr: String,
    backoff: Duration,
}

fn net_err<E: std::error::Error>(msg: impl ToString) -> NetError<E> {
    RPCError::Network(NetworkError::new(&AnyError::error(msg)))
}

impl Peer {
    async fn call<E: std::error::Error>(&self, rpc: &RaftRpc) -> Result<RpcReply, NetError<E>> {
        let request = postcard::to_allocvec(rpc).map_err(net_err)?;
        let answer = self
            .transport
            .call(self.target, &self.addr, request)
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&AnyError::error(e))))?;
        let reply: Result<RpcReply, String> = postcard::from_bytes(&answer).map_err(net_err)?;
        reply.map_err(|e| net_err(format!("replica {}: {e}", self.target)))
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Peer {
        Peer {
            transport: self.transport.clone(),
            target,
            addr: node.addr.clone(),
            backoff: self.backoff,
        }
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, NetError> {
        match self.call(&RaftRpc::Append(rpc)).await? {
            RpcReply::Append(r) => Ok(r),
            _ => Err(net_err("mismatched reply to append-entries")),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, NetError<InstallSnapshotError>> {
        match self.call(&RaftRpc::Snapshot(rpc)).await? {
            RpcReply::Snapshot(Ok(r)) => Ok(r),
            RpcReply::Snapshot(Err(mismatch)) => {
                Err(RPCError::RemoteError(openraft::error::RemoteError::new(
                    self.target,
                    OrRaftError::APIError(InstallSnapshotError::SnapshotMismatch(mismatch)),
                )))
            }
            _ => Err(net_err("mismatched reply to install-snapshot")),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, NetError> {
        match self.call(&RaftRpc::Vote(rpc)).await? {
            RpcReply::Vote(r) => Ok(r),
            _ => Err(net_err("mismatched reply to vote")),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.backoff))
    }
}

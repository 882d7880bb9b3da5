//! Inter-node messages of the cluster and their transport: the shared authenticated RPC layer
//! ([`florin_net::rpc`]: Noise, each side's key pinned from the cluster spec, bounded
//! handshakes and connections, one request at a time per connection; on the calling side a
//! pooled [`RpcClient`] per peer).

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use florin_cluster::atomizer::shard::{BlockReply, TxStatus, Verdict};
use florin_cluster::atomizer::{Attempt, Attestation, Block, Height, TxKey};
use florin_cluster::raft::ReplicaStatus;
use florin_cluster::shard::{Fenced, ShardReply};
use florin_crypto::{Digest, LocalSigner, PublicKey};
use florin_ledger::{CompactTx, Supply, SwapOutcome, UhsId};
use florin_net::rpc::{CallError, ClientLimits, RpcClient, RpcLimits, RpcServer, Service};
use serde::{Deserialize, Serialize};

/// Largest message (a batch of a few tens of thousands of transactions, or a snapshot).
pub const MAX_RPC: usize = 256 * 1024 * 1024;
/// Most connections a node serves at once.
const MAX_CONNECTIONS: usize = 512;
/// Most connections still in their handshake (unauthenticated) at once.
const MAX_HANDSHAKES: usize = 32;
/// An authenticated connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(300);
/// Idle connections kept per peer.
const POOL: usize = 16;

/// A request to a cluster node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// A Raft message for this node's group (from a member of it).
    Raft(#[serde(with = "florin_ledger::bin_serde::bytes")] Vec<u8>),
    /// Compact transactions to apply (to a coordinator leader, from a sentinel), with the
    /// sentinel's clock (Unix seconds; [`florin_ledger::expiry`]).
    Submit(Vec<CompactTx>, u64),
    /// Which of these ids are unspent (a shard leader; linearizable).
    Unspent(#[serde(with = "florin_ledger::bin_serde::ids")] Vec<UhsId>),
    /// Which of these txids are confirmed (a shard leader; linearizable).
    Confirmed(#[serde(with = "florin_ledger::bin_serde::ids")] Vec<Digest>),
    /// The shard's books (a shard leader; linearizable).
    Books,
    /// The node's Raft status.
    Status,
    /// A two-phase-commit command with its sender's group and term (to a shard leader, from a
    /// coordinator of that group).
    Fenced(Fenced),
    /// A registry write set (`florin_node::registry`) to replicate (to the authority group's
    /// leader, from a member).
    RegistryWrite(#[serde(with = "florin_ledger::bin_serde::bytes")] Vec<u8>),
    /// The registry version the authority group's leader has applied (linearizable; from a
    /// member, as a read barrier).
    RegistryVersion,
    /// Atomizer architecture: attest these transactions (to a shard, from a sentinel); the
    /// attestations go on to the atomizer, the verdicts come back.
    AtomAttest(Vec<AttestAsk>),
    /// Atomizer architecture: attestations (to the atomizer's leader, from a shard member).
    AtomForward(Vec<Attestation>),
    /// Atomizer architecture: blocks to apply, in order (to a shard, from an atomizer member).
    AtomBlocks(Vec<Block>),
    /// Atomizer architecture: what became of these txids (to their shard, from a sentinel),
    /// read at a height at least the given one.
    AtomStatus(Vec<StatusAsk>),
    /// Atomizer architecture: which ids are unspent, at a height at least the given one (to a
    /// shard, from a sentinel).
    AtomUnspent(
        #[serde(with = "florin_ledger::bin_serde::ids")] Vec<UhsId>,
        Height,
    ),
    /// Atomizer architecture: which txids are confirmed, at a height at least the given one.
    AtomConfirmed(
        #[serde(with = "florin_ledger::bin_serde::ids")] Vec<Digest>,
        Height,
    ),
    /// Atomizer architecture: the atomizer's committed height (its leader; linearizable).
    AtomHeight,
    /// Atomizer architecture: blocks `from..=to` from an atomizer member's block log (at most
    /// [`MAX_BLOCKS_READ`]).
    AtomReadBlocks(Height, Height),
    /// Atomizer architecture: the shard's decision feed after this height (`None`: its height
    /// alone), to a shard from a sentinel.
    AtomDecided(Option<Height>),
}

/// Most blocks one [`Request::AtomReadBlocks`] answers.
pub const MAX_BLOCKS_READ: u64 = 1024;

/// A transaction to attest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttestAsk {
    /// The transaction.
    pub tx: CompactTx,
    /// Its key.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub key: TxKey,
    /// The sentinel's tries of it, oldest first (the last is the current one).
    pub attempts: Vec<Attempt>,
    /// The lowest height to check at.
    pub min_height: Height,
    /// The sentinel's clock (Unix seconds).
    pub now: u64,
}

/// A txid whose status is asked, and the lowest height to read it at.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusAsk {
    /// The txid.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub txid: Digest,
    /// The lowest height.
    pub min_height: Height,
}

/// A cluster node's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    /// A Raft answer.
    Raft(#[serde(with = "florin_ledger::bin_serde::bytes")] Vec<u8>),
    /// A shard's answer.
    Shard(ShardReply),
    /// One outcome per submitted transaction.
    Submitted(Vec<SwapOutcome>),
    /// One answer per asked id.
    Bools(Vec<bool>),
    /// Books.
    Books(Supply),
    /// Status.
    Status(NodeStatus),
    /// This node is not its group's leader; the leader's address if known.
    NotLeader(Option<String>),
    /// Refused or failed.
    Error(String),
    /// The leader took the request and refuses it for good: asking again, here or at
    /// another member, gets the same answer (a shard refused a batch of it).
    Refused(String),
    /// The authority group's answer to a registry write (an encoded `registry::Applied`).
    Registry(#[serde(with = "florin_ledger::bin_serde::bytes")] Vec<u8>),
    /// A shard's verdicts, one per transaction asked.
    Verdicts(Vec<Verdict>),
    /// A shard's answer to blocks.
    BlockReply(BlockReply),
    /// Statuses, one per txid asked.
    Statuses(Vec<TxStatus>),
    /// A height.
    Height(Height),
    /// Blocks.
    Blocks(Vec<Block>),
    /// The shard has not yet applied the height asked for: it is at this one (ask again).
    NotYet(Height),
    /// Taken (nothing to answer).
    Taken,
    /// A shard's decisions: complete up to `reached`, its feed whole after `feed_from`.
    Decided {
        /// The height the decisions are complete to.
        reached: Height,
        /// Every decision after this height is in the feed.
        feed_from: Height,
        /// Txids decided, with their status.
        decisions: Vec<(Digest, TxStatus)>,
    },
    /// Not taken: the atomizer's leader admits no more for now (ask again later).
    Busy,
}

/// What `Status` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `shard` or `coordinator`.
    pub role: String,
    /// Shard index or coordinator group index.
    pub group: u16,
    /// Raft status.
    pub raft: ReplicaStatus,
    /// Coordinator: transactions waiting and batches in flight; shard: prepared batches and
    /// locks held.
    pub load: (u64, u64),
    /// Coordinator: how many alerts it raised since it started (a shard refused a two-phase
    /// command), and the last one's words.
    pub alerts: (u64, Option<String>),
    /// Shard: confirmed txids it remembers to answer replays (transfers until their expiry,
    /// mints for ever: the replay-answer state `florin_ledger::expiry` bounds).
    pub remembered: u64,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// Could not reach the peer, the connection broke, or it did not answer in time.
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        /// The peer.
        addr: String,
        /// Why.
        source: Box<CallError>,
    },
    /// The answer did not decode.
    #[error("bad answer from {0}")]
    BadAnswer(String),
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

fn decode<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Option<T> {
    postcard::from_bytes(b).ok()
}

/// A peer: its address and a pooled link that pins its key ([`RpcClient`]).
pub struct Peer {
    /// Where it listens.
    pub addr: String,
    client: RpcClient,
    timeout: Duration,
}

impl Peer {
    /// A peer at `addr` that must prove `key`; answers are awaited at most `timeout`.
    pub fn new(addr: String, key: PublicKey, me: Arc<LocalSigner>, timeout: Duration) -> Peer {
        let limits = ClientLimits {
            max_idle: POOL,
            connect_timeout: timeout.min(Duration::from_secs(2)),
            max_message: MAX_RPC,
        };
        Peer {
            client: RpcClient::new(&addr, key, me, &limits),
            addr,
            timeout,
        }
    }

    /// One request, one answer (blocking).
    pub fn call(&self, req: &Request) -> Result<Response, RpcError> {
        self.call_within(req, self.timeout)
    }

    /// The default wait for an answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// [`Peer::call`] waiting at most `timeout` for the answer.
    pub fn call_within(&self, req: &Request, timeout: Duration) -> Result<Response, RpcError> {
        let answer =
            self.client
                .call(encode(req), timeout)
                .map_err(|source| RpcError::Unreachable {
                    addr: self.addr.clone(),
                    source: Box::new(source),
                })?;
        decode::<Response>(&answer).ok_or_else(|| RpcError::BadAnswer(self.addr.clone()))
    }

    /// [`Peer::call`] from async code.
    pub async fn call_async(self: &Arc<Self>, req: Request) -> Result<Response, RpcError> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.call(&req)).await {
            Ok(r) => r,
            // The blocking task panicked or was cancelled: no answer.
            Err(_) => Err(RpcError::BadAnswer(self.addr.clone())),
        }
    }
}

/// What a node does with a request from an authenticated peer.
pub trait Handler: Send + Sync + 'static {
    /// Answers `req` from `peer`.
    fn handle(
        &self,
        peer: &PublicKey,
        req: Request,
    ) -> impl std::future::Future<Output = Response> + Send;
}

/// A running RPC server: the shared [`RpcServer`] serving cluster requests to members.
pub struct Server(RpcServer);

/// The limits cluster nodes keep.
fn limits() -> RpcLimits {
    RpcLimits {
        max_connections: MAX_CONNECTIONS,
        max_handshakes: MAX_HANDSHAKES,
        handshake_deadline: Duration::from_secs(2),
        idle: IDLE,
        // An answer may be a snapshot of hundreds of megabytes.
        write_deadline: Duration::from_secs(120),
        max_message: MAX_RPC,
    }
}

struct ClusterService<H> {
    allowed: HashSet<PublicKey>,
    handler: Arc<H>,
    rt: tokio::runtime::Handle,
}

impl<H: Handler> Service for ClusterService<H> {
    type Session = ();

    fn admit(&self, peer: &PublicKey) -> Option<()> {
        self.allowed.contains(peer).then_some(())
    }

    fn handle(&self, peer: &PublicKey, _: &mut (), bytes: &[u8]) -> Option<Vec<u8>> {
        let answer = match decode::<Request>(bytes) {
            Some(req) => self.rt.block_on(self.handler.handle(peer, req)),
            None => Response::Error("undecodable request".into()),
        };
        Some(encode(&answer))
    }
}

impl Server {
    /// Serves `handler` on `listener` to peers whose keys are in `allowed`, running handlers
    /// on `rt`.
    pub fn start<H: Handler>(
        listener: TcpListener,
        me: Arc<LocalSigner>,
        allowed: HashSet<PublicKey>,
        handler: Arc<H>,
        rt: tokio::runtime::Handle,
    ) -> std::io::Result<Server> {
        let service = ClusterService {
            allowed,
            handler,
            rt,
        };
        RpcServer::start(listener, me, limits(), "cluster", Arc::new(service)).map(Server)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// Stops accepting and closes its connections.
    pub fn stop(&self) {
        self.0.stop();
    }
}

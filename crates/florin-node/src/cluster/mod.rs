//! The sharded ledger as processes: shard replicas and coordinator replicas (Raft groups of
//! `florin-cluster`'s state machines) talking over authenticated channels, and the sentinel's
//! swap store that routes to them.
//!
//! - [`ClusterSpec`]: the topology every process reads (groups, members, addresses, keys).
//! - [`start_member`]: one shard or coordinator replica on a listener.
//! - [`ClusterStore`]: a [`SwapStore`] over the cluster, so the sentinel is the ordinary
//!   ledger service with this store behind it.
//! - [`LocalCluster`]: every member in one process on loopback sockets (tests, benchmarks).

pub mod atomizer;
pub mod authority;
pub mod client;
pub mod deploy;
pub mod engine;
pub mod rpc;
pub mod service;
pub mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use florin_cluster::coordinator::CoordinatorConfig;
use florin_cluster::raft::{
    NodeId, RaftOptions, RaftTransport, Replica, TransportError, TransportFuture,
};
use florin_cluster::route::ShardMap;
use florin_crypto::{Digest, LocalSigner, PublicKey, SecretKey, Signer};
use florin_ledger::{CompactTx, StoreError, Supply, SwapOutcome, SwapStore, UhsId};
use serde::{Deserialize, Serialize};

use crate::error::{BadRequest, NodeError, StorageError};
use client::GroupClient;
use florin_cluster::atomizer::machine::AtomizerConfig;
use florin_cluster::atomizer::replicated::{AtomizerMachine, BlockShardMachine};
use rpc::{Peer, Request, Response, Server};
use service::{CoordMachine, CoordService, ShardMachine, ShardService};

/// One replica of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSpec {
    /// Its Raft id within the group (1, 2, …).
    pub id: NodeId,
    /// Where it listens for cluster RPC (`127.0.0.1:PORT`).
    pub addr: String,
    /// Its identity key (`eur1…`), pinned by every peer.
    pub key: String,
}

/// A Raft group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Its replicas.
    pub members: Vec<MemberSpec>,
}

fn default_batch() -> usize {
    4096
}
fn default_one_phase() -> bool {
    true
}
fn default_inflight() -> usize {
    8
}

/// The cluster's topology and tuning; every process reads the same one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpec {
    /// Shard `i` owns ids whose two-byte prefix is in `[shard_starts[i], shard_starts[i+1])`.
    pub shard_starts: Vec<u16>,
    /// Shard groups, by index.
    pub shards: Vec<GroupSpec>,
    /// Coordinator groups.
    pub coordinators: Vec<GroupSpec>,
    /// Keys of the sentinels: they submit transactions and read.
    pub clients: Vec<String>,
    /// Keys allowed only to ask members for their status (`florin cluster status`).
    #[serde(default)]
    pub observers: Vec<String>,
    /// Raft timing and compaction.
    #[serde(default)]
    pub raft: RaftOptions,
    /// Most transactions per batch.
    #[serde(default = "default_batch")]
    pub max_batch: usize,
    /// Most batches in flight per coordinator.
    #[serde(default = "default_inflight")]
    pub max_inflight: usize,
    /// Commit transactions that lie wholly on one shard in one phase (default); `false` sends
    /// every transaction through two-phase commit.
    #[serde(default = "default_one_phase")]
    pub one_phase: bool,
    /// The token authority's group: its members are sentinels (each member's key is a
    /// sentinel's, its address where that sentinel serves the group), each holding a replica
    /// of the registry ([`authority`]). Absent: the sentinel configured with `authority`
    /// holds the only registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<GroupSpec>,
    /// Which of Hamilton's two designs the cluster runs (two-phase commit unless named).
    #[serde(default, skip_serializing_if = "Architecture::is_two_phase")]
    pub architecture: Architecture,
    /// The atomizer's group (the atomizer architecture only; it has no coordinators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atomizer: Option<GroupSpec>,
    /// The atomizer's settings (every replica must have the same).
    #[serde(default, skip_serializing_if = "is_default_atomizer")]
    pub atomizer_config: AtomizerConfig,
}

/// Hamilton's two architectures (docs/cluster.md, docs/atomizer.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// Locking shards and two-phase-commit coordinators.
    #[default]
    TwoPhase,
    /// Block-applying shards and one atomizer ordering every transaction into blocks.
    Atomizer,
}

fn is_default_atomizer(c: &AtomizerConfig) -> bool {
    *c == AtomizerConfig::default()
}

impl Architecture {
    fn is_two_phase(&self) -> bool {
        *self == Architecture::TwoPhase
    }
}

/// Which kind of group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A shard replica.
    Shard,
    /// A coordinator replica.
    Coordinator,
    /// A sentinel (the HTTP API; runs in the `florin` binary).
    Sentinel,
    /// The single-node engine behind the cluster's RPC ([`engine`]; the reference of the
    /// emulated-hosts benchmark).
    Engine,
    /// An atomizer replica ([`atomizer`]).
    Atomizer,
}

fn key_of(s: &str) -> Result<PublicKey, NodeError> {
    PublicKey::parse(s).map_err(|source| {
        NodeError::from(BadRequest::Key {
            what: format!("bad key {s}"),
            source,
        })
    })
}

impl ClusterSpec {
    /// Reads a spec (TOML).
    pub fn load(path: &Path) -> Result<ClusterSpec, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|source| StorageError::File {
            action: "read",
            path: path.into(),
            source,
        })?;
        let spec: ClusterSpec = toml::from_str(&text).map_err(|e| BadRequest::Config {
            path: path.into(),
            source: Box::new(e),
        })?;
        spec.check()?;
        Ok(spec)
    }

    /// Writes it (TOML).
    pub fn save(&self, path: &Path) -> Result<(), NodeError> {
        let text = toml::to_string_pretty(self)
            .map_err(|e| NodeError::storage(format!("cannot encode the spec: {e}")))?;
        std::fs::write(path, text).map_err(|source| {
            StorageError::File {
                action: "write",
                path: path.into(),
                source,
            }
            .into()
        })
    }

    /// Refuses an inconsistent spec.
    pub fn check(&self) -> Result<(), NodeError> {
        let map = self.map()?;
        if map.len() != self.shards.len() {
            return Err(NodeError::bad_request(format!(
                "{} shard ranges for {} shard groups",
                map.len(),
                self.shards.len()
            )));
        }
        match self.architecture {
            Architecture::TwoPhase if self.coordinators.is_empty() => {
                return Err(NodeError::bad_request(
                    "a cluster needs a coordinator group",
                ));
            }
            Architecture::TwoPhase if self.atomizer.is_some() => {
                return Err(NodeError::bad_request(
                    "an [atomizer] group is for `architecture = \"atomizer\"` only",
                ));
            }
            Architecture::Atomizer if self.atomizer.is_none() || !self.coordinators.is_empty() => {
                return Err(NodeError::bad_request(
                    "an atomizer cluster has one [atomizer] group and no coordinators",
                ));
            }
            _ => {}
        }
        for g in self
            .shards
            .iter()
            .chain(&self.coordinators)
            .chain(&self.atomizer)
        {
            if g.members.is_empty() {
                return Err(NodeError::bad_request("a group has no members"));
            }
            for m in &g.members {
                key_of(&m.key)?;
            }
        }
        for k in self.clients.iter().chain(&self.observers) {
            key_of(k)?;
        }
        if let Some(a) = &self.authority {
            let clients = self.client_keys();
            let mut ids = HashSet::new();
            for m in &a.members {
                if !clients.contains(&key_of(&m.key)?) {
                    return Err(NodeError::bad_request(format!(
                        "authority member {} is not a sentinel (its key is not a client's)",
                        m.id
                    )));
                }
                if !ids.insert(m.id) {
                    return Err(NodeError::bad_request(format!(
                        "authority member id {} appears twice",
                        m.id
                    )));
                }
            }
            if a.members.is_empty() {
                return Err(NodeError::bad_request("the authority group has no members"));
            }
        }
        Ok(())
    }

    /// The shard map.
    pub fn map(&self) -> Result<ShardMap, NodeError> {
        ShardMap::from_starts(self.shard_starts.clone())
            .map_err(|e| NodeError::bad_request(e.to_string()))
    }

    fn group(&self, role: Role, group: u16) -> Result<&GroupSpec, NodeError> {
        let groups = match role {
            Role::Shard => &self.shards,
            Role::Coordinator => &self.coordinators,
            Role::Atomizer => {
                return self
                    .atomizer
                    .as_ref()
                    .filter(|_| group == 0)
                    .ok_or_else(|| NodeError::bad_request(format!("no atomizer group {group}")));
            }
            Role::Sentinel | Role::Engine => {
                return Err(NodeError::bad_request("sentinels and engines are no group"))
            }
        };
        groups
            .get(group as usize)
            .ok_or_else(|| NodeError::bad_request(format!("no {role:?} group {group}")))
    }

    /// Every key allowed to connect to a member (all members, clients and observers).
    pub fn allowed(&self) -> HashSet<PublicKey> {
        self.shards
            .iter()
            .chain(&self.coordinators)
            .chain(&self.atomizer)
            .flat_map(|g| g.members.iter().filter_map(|m| key_of(&m.key).ok()))
            .chain(
                self.clients
                    .iter()
                    .chain(&self.observers)
                    .filter_map(|k| key_of(k).ok()),
            )
            .collect()
    }

    /// Keys of every coordinator replica (the only senders of two-phase-commit commands).
    pub fn coordinator_keys(&self) -> HashSet<PublicKey> {
        self.coordinators
            .iter()
            .flat_map(|g| g.members.iter().filter_map(|m| key_of(&m.key).ok()))
            .collect()
    }

    /// Every coordinator replica's key with its group (a shard takes a group's two-phase-commit
    /// commands only from that group's members).
    pub fn coordinator_groups(&self) -> HashMap<PublicKey, u16> {
        self.coordinators
            .iter()
            .enumerate()
            .flat_map(|(g, group)| {
                group
                    .members
                    .iter()
                    .filter_map(move |m| key_of(&m.key).ok().map(|k| (k, g as u16)))
            })
            .collect()
    }

    /// Keys of the clients (sentinels): the only submitters, and readers with coordinators.
    pub fn client_keys(&self) -> HashSet<PublicKey> {
        self.clients.iter().filter_map(|k| key_of(k).ok()).collect()
    }

    /// A client of each of these groups, signing as `me`.
    pub fn clients_of(&self, groups: &[GroupSpec], me: &Arc<LocalSigner>) -> Vec<Arc<GroupClient>> {
        groups
            .iter()
            .map(|g| {
                Arc::new(GroupClient::new(
                    g.members
                        .iter()
                        .filter_map(|m| {
                            let key = key_of(&m.key).ok()?;
                            Some((
                                m.id,
                                Arc::new(Peer::new(
                                    m.addr.clone(),
                                    key,
                                    me.clone(),
                                    Duration::from_secs(10),
                                )),
                            ))
                        })
                        .collect(),
                ))
            })
            .collect()
    }
}

/// The keys of a group's members.
fn keys_of(g: &GroupSpec) -> HashSet<PublicKey> {
    g.members
        .iter()
        .filter_map(|m| key_of(&m.key).ok())
        .collect()
}

/// A link to each member of `group` (its Raft id and a pooled, key-pinned peer) whose calls
/// wait `timeout` for an answer.
fn peers_of(
    group: &GroupSpec,
    me: &Arc<LocalSigner>,
    timeout: Duration,
) -> Vec<(NodeId, Arc<Peer>)> {
    group
        .members
        .iter()
        .filter_map(|m| {
            let key = key_of(&m.key).ok()?;
            Some((
                m.id,
                Arc::new(Peer::new(m.addr.clone(), key, me.clone(), timeout)),
            ))
        })
        .collect()
}

struct PeerTransport {
    peers: BTreeMap<NodeId, Arc<Peer>>,
}

impl RaftTransport for PeerTransport {
    fn call(&self, target: NodeId, addr: &str, request: Vec<u8>) -> TransportFuture {
        let peer = self.peers.get(&target).cloned();
        let addr = addr.to_string();
        Box::pin(async move {
            let peer = peer.ok_or(TransportError::UnknownMember { target, addr })?;
            match peer.call_async(Request::Raft(request)).await {
                Ok(Response::Raft(b)) => Ok(b),
                Ok(other) => Err(TransportError::UnexpectedAnswer {
                    target,
                    answer: format!("{other:?}"),
                }),
                Err(e) => Err(TransportError::failed(target, e)),
            }
        })
    }
}

/// A running shard or coordinator replica.
pub struct Member {
    /// Its role.
    pub role: Role,
    /// Its group.
    pub group: u16,
    /// Its id in the group.
    pub id: NodeId,
    server: Server,
    replica: MemberReplica,
}

enum MemberReplica {
    Shard(Arc<Replica<ShardMachine>>),
    Coordinator(Arc<Replica<CoordMachine>>),
    BlockShard(Arc<Replica<BlockShardMachine>>),
    Atomizer(Arc<Replica<AtomizerMachine>>),
}

impl Member {
    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// Whether its replica leads its group.
    pub fn is_leader(&self) -> bool {
        match &self.replica {
            MemberReplica::Shard(r) => r.is_leader(),
            MemberReplica::Coordinator(r) => r.is_leader(),
            MemberReplica::BlockShard(r) => r.is_leader(),
            MemberReplica::Atomizer(r) => r.is_leader(),
        }
    }

    /// A shard replica: how many confirmed txids it remembers to answer replays (0 for a
    /// coordinator).
    pub fn remembered(&self) -> u64 {
        match &self.replica {
            MemberReplica::Shard(r) => r.with_machine(|m| m.0.remembered().0 as u64),
            MemberReplica::Coordinator(_)
            | MemberReplica::BlockShard(_)
            | MemberReplica::Atomizer(_) => 0,
        }
    }

    /// Its Raft status.
    pub fn status(&self) -> florin_cluster::raft::ReplicaStatus {
        match &self.replica {
            MemberReplica::Shard(r) => r.status(),
            MemberReplica::Coordinator(r) => r.status(),
            MemberReplica::BlockShard(r) => r.status(),
            MemberReplica::Atomizer(r) => r.status(),
        }
    }

    /// Stops serving and shuts its replica down (what is durable stays).
    pub async fn stop(self) {
        self.server.stop();
        let _ = match &self.replica {
            MemberReplica::Shard(r) => r.shutdown().await,
            MemberReplica::Coordinator(r) => r.shutdown().await,
            MemberReplica::BlockShard(r) => r.shutdown().await,
            MemberReplica::Atomizer(r) => r.shutdown().await,
        };
    }
}

/// Starts replica `id` of group `group` (`role` shard or coordinator) with its state in `dir`,
/// serving on `listener`. Call inside a tokio runtime.
pub async fn start_member(
    spec: &ClusterSpec,
    role: Role,
    group: u16,
    id: NodeId,
    dir: &Path,
    me: Arc<LocalSigner>,
    listener: TcpListener,
) -> Result<Member, NodeError> {
    let g = spec.group(role, group)?;
    if !g.members.iter().any(|m| m.id == id) {
        return Err(NodeError::bad_request(format!(
            "{role:?} group {group} has no member {id}"
        )));
    }
    let mine = g.members.iter().find(|m| m.id == id).map(|m| m.key.clone());
    if mine.as_deref() != Some(me.public_key().to_address().as_str()) {
        return Err(NodeError::bad_request(format!(
            "this key is not {role:?} {group}/{id}'s key in the spec"
        )));
    }
    std::fs::create_dir_all(dir).map_err(|source| StorageError::File {
        action: "create",
        path: dir.into(),
        source,
    })?;
    let addrs: BTreeMap<NodeId, String> =
        g.members.iter().map(|m| (m.id, m.addr.clone())).collect();
    let members: HashSet<PublicKey> = g
        .members
        .iter()
        .filter_map(|m| key_of(&m.key).ok())
        .collect();
    let transport = Arc::new(PeerTransport {
        peers: peers_of(
            g,
            &me,
            Duration::from_millis(spec.raft.election_max_ms.max(1000)),
        )
        .into_iter()
        .collect(),
    });
    let raft_err = |e: florin_cluster::raft::RaftError| NodeError::from(StorageError::from(e));
    let rt = tokio::runtime::Handle::current();
    let allowed = spec.allowed();
    let (server, replica) = match role {
        Role::Shard if spec.architecture == Architecture::Atomizer => {
            let replica = Arc::new(
                Replica::open(
                    dir,
                    id,
                    addrs,
                    BlockShardMachine::new(spec.map()?, group),
                    transport,
                    spec.raft.clone(),
                )
                .await
                .map_err(raft_err)?,
            );
            crate::obs::export_raft(format!("shard-{group}"), id, &replica);
            let atomizer = spec
                .atomizer
                .as_ref()
                .ok_or_else(|| NodeError::bad_request("no atomizer group"))?;
            let svc = Arc::new(atomizer::BlockShardService {
                shard: group,
                replica: replica.clone(),
                members,
                atomizer_keys: keys_of(atomizer),
                clients: spec.client_keys(),
                atomizer: spec
                    .clients_of(std::slice::from_ref(atomizer), &me)
                    .remove(0),
                map: spec.map()?,
                busy_until: atomizer::BusyUntil::default(),
            });
            let server = Server::start(listener, me, allowed, svc, rt)
                .map_err(|e| StorageError::Server(Box::new(e)))?;
            (server, MemberReplica::BlockShard(replica))
        }
        Role::Atomizer => {
            let log = Arc::new(
                florin_cluster::atomizer::blocklog::BlockLog::open(&dir.join("blocks"))
                    .map_err(|e| NodeError::storage(e.to_string()))?,
            );
            let replica = Arc::new(
                Replica::open(
                    dir,
                    id,
                    addrs,
                    AtomizerMachine::new(spec.atomizer_config, spec.map()?, log.clone()),
                    transport,
                    spec.raft.clone(),
                )
                .await
                .map_err(raft_err)?,
            );
            crate::obs::export_raft("atomizer".to_string(), id, &replica);
            let shard_keys: HashMap<PublicKey, u16> = spec
                .shards
                .iter()
                .enumerate()
                .flat_map(|(g, group)| keys_of(group).into_iter().map(move |k| (k, g as u16)))
                .collect();
            let readers: HashSet<PublicKey> = spec
                .client_keys()
                .into_iter()
                .chain(spec.observers.iter().filter_map(|k| key_of(k).ok()))
                .collect();
            let svc = atomizer::AtomizerService::start(
                replica.clone(),
                log,
                members,
                shard_keys,
                readers,
                spec.clients_of(&spec.shards, &me),
                florin_cluster::atomizer::leader::LeaderConfig::default(),
            );
            let server = Server::start(listener, me, allowed, svc, rt)
                .map_err(|e| StorageError::Server(Box::new(e)))?;
            (server, MemberReplica::Atomizer(replica))
        }
        Role::Shard => {
            let replica = Arc::new(
                Replica::open(
                    dir,
                    id,
                    addrs,
                    ShardMachine::default(),
                    transport,
                    spec.raft.clone(),
                )
                .await
                .map_err(raft_err)?,
            );
            crate::obs::export_raft(format!("shard-{group}"), id, &replica);
            let svc = Arc::new(ShardService {
                map: spec.map()?,
                shard: group,
                replica: replica.clone(),
                members,
                coordinators: spec.coordinator_groups(),
                readers: spec
                    .client_keys()
                    .union(&spec.coordinator_keys())
                    .copied()
                    .collect(),
            });
            let server = Server::start(listener, me, allowed, svc, rt)
                .map_err(|e| StorageError::Server(Box::new(e)))?;
            (server, MemberReplica::Shard(replica))
        }
        _ => {
            let replica = Arc::new(
                Replica::open(
                    dir,
                    id,
                    addrs.clone(),
                    CoordMachine::default(),
                    transport,
                    spec.raft.clone(),
                )
                .await
                .map_err(raft_err)?,
            );
            crate::obs::export_raft(format!("coordinator-{group}"), id, &replica);
            let cfg = CoordinatorConfig {
                max_batch: spec.max_batch,
                max_inflight: spec.max_inflight,
                one_phase: spec.one_phase,
                ..CoordinatorConfig::default()
            };
            let svc = CoordService::start(
                group,
                replica.clone(),
                members,
                spec.client_keys(),
                addrs,
                spec.map()?,
                spec.clients_of(&spec.shards, &me),
                cfg,
            );
            let server = Server::start(listener, me, allowed, svc, rt)
                .map_err(|e| StorageError::Server(Box::new(e)))?;
            (server, MemberReplica::Coordinator(replica))
        }
    };
    Ok(Member {
        role,
        group,
        id,
        server,
        replica,
    })
}

/// The sentinel's view of the cluster: a [`SwapStore`] that sends batches to a coordinator
/// group's leader and reads from shard leaders (linearizable reads).
pub struct ClusterStore {
    map: ShardMap,
    shards: Vec<Arc<GroupClient>>,
    coordinators: Vec<Arc<GroupClient>>,
    next: AtomicUsize,
    patience: Duration,
}

impl ClusterStore {
    /// A store over the cluster in `spec`, authenticating as `me` (a key in `spec.clients`).
    pub fn new(spec: &ClusterSpec, me: Arc<LocalSigner>) -> Result<ClusterStore, NodeError> {
        Ok(ClusterStore {
            map: spec.map()?,
            shards: spec.clients_of(&spec.shards, &me),
            coordinators: spec.clients_of(&spec.coordinators, &me),
            next: AtomicUsize::new(0),
            patience: Duration::from_secs(30),
        })
    }

    fn backend(e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!("cluster: {e}"))
    }

    fn ask_shard(&self, id: &[u8; 32], req: Request) -> Result<Response, StoreError> {
        let s = self.map.shard_of(id) as usize;
        self.shards[s]
            .call(&req, self.patience)
            .map_err(Self::backend)
    }

    fn one_bool(r: Response) -> Result<bool, StoreError> {
        match r {
            Response::Bools(v) if v.len() == 1 => Ok(v[0]),
            other => Err(Self::backend(format!("unexpected answer {other:?}"))),
        }
    }
}

impl ClusterStore {
    /// Which of these txids are confirmed, asking each shard once (linearizable reads).
    pub fn confirmed_many(&self, txids: &[Digest]) -> Result<Vec<bool>, StoreError> {
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); self.shards.len()];
        for (i, t) in txids.iter().enumerate() {
            by_shard[self.map.shard_of(t) as usize].push(i);
        }
        let mut out = vec![false; txids.len()];
        for (s, idx) in by_shard.iter().enumerate() {
            for chunk in idx.chunks(100_000) {
                let ask: Vec<Digest> = chunk.iter().map(|i| txids[*i]).collect();
                match self.shards[s]
                    .call(&Request::Confirmed(ask), self.patience)
                    .map_err(Self::backend)?
                {
                    Response::Bools(v) if v.len() == chunk.len() => {
                        for (i, b) in chunk.iter().zip(v) {
                            out[*i] = b;
                        }
                    }
                    other => return Err(Self::backend(format!("unexpected answer {other:?}"))),
                }
            }
        }
        Ok(out)
    }
}

impl SwapStore for ClusterStore {
    /// `now` (the sentinel's clock) goes with the batch: a coordinator's clock is the highest
    /// its submissions carried, and a shard's the highest its coordinators sent. A sentinel's
    /// clock far ahead makes shards refuse transactions as expired early (availability, never
    /// safety: a forgotten transfer's spent inputs stop any replay).
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let n = self.coordinators.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let start = std::time::Instant::now();
        let mut last = String::new();
        let mut attempt = 0;
        // A coordinator that loses leadership mid-batch answers an error; the batch is
        // resubmitted (replays are recognised by txid, and a batch the old leader began is
        // finished by the new one).
        while start.elapsed() < self.patience {
            let c = &self.coordinators[(first + attempt) % n];
            attempt += 1;
            match c.call(&Request::Submit(batch.to_vec(), now), self.patience) {
                Ok(Response::Submitted(v)) if v.len() == batch.len() => return Ok(v),
                // A shard refused a batch of it (every coordinator would get the same answer),
                // or a transaction stayed locked through every try. Some of its transactions
                // may have committed in other batches: the batch is in doubt, as after a
                // timeout (a resubmission is answered by txid).
                Ok(Response::Refused(why)) => {
                    return Err(Self::backend(format!("the batch is in doubt: {why}")))
                }
                Ok(other) => last = format!("{other:?}"),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(Self::backend(format!(
            "no coordinator took the batch: {last}"
        )))
    }

    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        Self::one_bool(self.ask_shard(id, Request::Unspent(vec![*id]))?)
    }

    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        Self::one_bool(self.ask_shard(txid, Request::Confirmed(vec![*txid]))?)
    }

    fn supply(&self) -> Result<Supply, StoreError> {
        // Shards are read one after another: a cross-shard transfer committing between two
        // reads shows as an imbalance. Read again until the sum balances (a consistent cut).
        let mut last = self.supply_once()?;
        for _ in 0..50 {
            if last.minted_cents.checked_sub(last.redeemed_cents) == Some(last.unspent_cents) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            last = self.supply_once()?;
        }
        Ok(last)
    }
}

impl ClusterStore {
    fn supply_once(&self) -> Result<Supply, StoreError> {
        let mut total = Supply::default();
        for s in &self.shards {
            match s
                .call(&Request::Books, self.patience)
                .map_err(Self::backend)?
            {
                Response::Books(b) => {
                    total.minted_cents += b.minted_cents;
                    total.redeemed_cents += b.redeemed_cents;
                    total.unspent_cents += b.unspent_cents;
                    total.unspent_count += b.unspent_count;
                }
                other => return Err(Self::backend(format!("unexpected answer {other:?}"))),
            }
        }
        Ok(total)
    }
}

/// The sentinel's store over the cluster in `spec`, authenticating as `me`: the two-phase
/// [`ClusterStore`], or the atomizer's [`atomizer::AtomizerStore`].
pub fn open_store(
    spec: &ClusterSpec,
    me: Arc<LocalSigner>,
) -> Result<Arc<dyn SwapStore>, NodeError> {
    match (&spec.architecture, &spec.atomizer) {
        (Architecture::Atomizer, Some(a)) => Ok(Arc::new(
            atomizer::AtomizerStore::new(
                spec.map()?,
                spec.clients_of(&spec.shards, &me),
                spec.clients_of(std::slice::from_ref(a), &me).remove(0),
            )
            .map_err(|e| NodeError::storage(e.to_string()))?,
        )),
        _ => Ok(Arc::new(ClusterStore::new(spec, me)?)),
    }
}

/// Every member of a cluster in this process, on loopback sockets with real disks.
pub struct LocalCluster {
    /// The topology.
    pub spec: ClusterSpec,
    /// The client key (listed in `spec.clients`).
    pub client: Arc<LocalSigner>,
    dir: PathBuf,
    keys: BTreeMap<(u8, u16, NodeId), Arc<LocalSigner>>,
    members: BTreeMap<(u8, u16, NodeId), Member>,
}

fn role_code(r: Role) -> u8 {
    match r {
        Role::Shard => 0,
        Role::Coordinator => 1,
        Role::Sentinel => 2,
        Role::Engine => 3,
        Role::Atomizer => 4,
    }
}

impl LocalCluster {
    /// Starts `shards` shard groups and `coordinators` coordinator groups of `replicas` each
    /// under `dir`. Call inside a multi-threaded tokio runtime.
    pub async fn start(
        dir: &Path,
        shards: usize,
        coordinators: usize,
        replicas: usize,
        raft: RaftOptions,
        max_batch: usize,
    ) -> Result<LocalCluster, NodeError> {
        Self::start_with(dir, shards, coordinators, replicas, raft, max_batch, true).await
    }

    /// [`LocalCluster::start`], choosing whether single-shard transactions commit in one phase
    /// ([`ClusterSpec::one_phase`]).
    pub async fn start_with(
        dir: &Path,
        shards: usize,
        coordinators: usize,
        replicas: usize,
        raft: RaftOptions,
        max_batch: usize,
        one_phase: bool,
    ) -> Result<LocalCluster, NodeError> {
        Self::start_inner(
            dir,
            shards,
            coordinators,
            replicas,
            raft,
            max_batch,
            one_phase,
            Architecture::TwoPhase,
        )
        .await
    }

    /// `shards` block-applying shard groups and one atomizer group of `replicas` each under
    /// `dir` (the atomizer architecture). Call inside a multi-threaded tokio runtime.
    pub async fn start_atomizer(
        dir: &Path,
        shards: usize,
        replicas: usize,
        raft: RaftOptions,
    ) -> Result<LocalCluster, NodeError> {
        Self::start_inner(
            dir,
            shards,
            1,
            replicas,
            raft,
            4096,
            true,
            Architecture::Atomizer,
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_inner(
        dir: &Path,
        shards: usize,
        coordinators: usize,
        replicas: usize,
        raft: RaftOptions,
        max_batch: usize,
        one_phase: bool,
        architecture: Architecture,
    ) -> Result<LocalCluster, NodeError> {
        let mut keys = BTreeMap::new();
        let mut listeners = BTreeMap::new();
        let mut group = |role: Role, g: u16| -> Result<GroupSpec, NodeError> {
            let mut members = Vec::new();
            for id in 1..=replicas as NodeId {
                let l = TcpListener::bind("127.0.0.1:0").map_err(StorageError::from)?;
                let addr = l.local_addr().map_err(StorageError::from)?;
                let key = Arc::new(LocalSigner::new(SecretKey::generate(
                    &mut rand::rngs::OsRng,
                )));
                members.push(MemberSpec {
                    id,
                    addr: addr.to_string(),
                    key: key.public_key().to_address(),
                });
                keys.insert((role_code(role), g, id), key);
                listeners.insert((role_code(role), g, id), l);
            }
            Ok(GroupSpec { members })
        };
        let map = ShardMap::even(shards).map_err(|e| NodeError::bad_request(e.to_string()))?;
        let shard_groups = (0..shards as u16)
            .map(|g| group(Role::Shard, g))
            .collect::<Result<Vec<_>, _>>()?;
        let (coord_groups, atomizer) = if architecture == Architecture::Atomizer {
            (vec![], Some(group(Role::Atomizer, 0)?))
        } else {
            let c = (0..coordinators as u16)
                .map(|g| group(Role::Coordinator, g))
                .collect::<Result<Vec<_>, _>>()?;
            (c, None)
        };
        let client = Arc::new(LocalSigner::new(SecretKey::generate(
            &mut rand::rngs::OsRng,
        )));
        let spec = ClusterSpec {
            shard_starts: map.starts().to_vec(),
            shards: shard_groups,
            coordinators: coord_groups,
            clients: vec![client.public_key().to_address()],
            observers: vec![],
            raft,
            max_batch,
            max_inflight: default_inflight(),
            one_phase,
            authority: None,
            architecture,
            atomizer,
            atomizer_config: AtomizerConfig::default(),
        };
        let mut c = LocalCluster {
            spec,
            client,
            dir: dir.to_path_buf(),
            keys,
            members: BTreeMap::new(),
        };
        for ((r, g, id), l) in listeners {
            let role = match r {
                0 => Role::Shard,
                4 => Role::Atomizer,
                _ => Role::Coordinator,
            };
            c.launch(role, g, id, l).await?;
        }
        Ok(c)
    }

    fn member_dir(&self, role: Role, g: u16, id: NodeId) -> PathBuf {
        let r = match role {
            Role::Shard => "shard",
            Role::Atomizer => "atomizer",
            _ => "coord",
        };
        self.dir.join(format!("{r}-{g}-{id}"))
    }

    async fn launch(
        &mut self,
        role: Role,
        g: u16,
        id: NodeId,
        l: TcpListener,
    ) -> Result<(), NodeError> {
        let spec = self.spec.clone();
        self.launch_with(&spec, role, g, id, l).await
    }

    async fn launch_with(
        &mut self,
        spec: &ClusterSpec,
        role: Role,
        g: u16,
        id: NodeId,
        l: TcpListener,
    ) -> Result<(), NodeError> {
        let k = (role_code(role), g, id);
        let key = self
            .keys
            .get(&k)
            .cloned()
            .ok_or_else(|| NodeError::not_found(format!("no member {role:?} {g}/{id}")))?;
        let dir = self.member_dir(role, g, id);
        let m = start_member(spec, role, g, id, &dir, key, l).await?;
        self.members.insert(k, m);
        Ok(())
    }

    /// A swap store over this cluster.
    pub fn store(&self) -> Result<ClusterStore, NodeError> {
        ClusterStore::new(&self.spec, self.client.clone())
    }

    /// A swap store over this cluster, whichever its architecture.
    pub fn any_store(&self) -> Result<Arc<dyn SwapStore>, NodeError> {
        open_store(&self.spec, self.client.clone())
    }

    /// The current leader of a group, if one is known by a running member.
    pub fn leader(&self, role: Role, g: u16) -> Option<NodeId> {
        self.members
            .iter()
            .filter(|((r, gg, _), _)| *r == role_code(role) && *gg == g)
            .find(|(_, m)| m.is_leader())
            .map(|((_, _, id), _)| *id)
    }

    /// Waits until every group has a leader (bounded).
    pub async fn wait_for_leaders(&self, within: Duration) -> Result<(), NodeError> {
        let start = std::time::Instant::now();
        loop {
            let all = (0..self.spec.shards.len() as u16)
                .all(|g| self.leader(Role::Shard, g).is_some())
                && (0..self.spec.coordinators.len() as u16)
                    .all(|g| self.leader(Role::Coordinator, g).is_some())
                && (self.spec.atomizer.is_none() || self.leader(Role::Atomizer, 0).is_some());
            if all {
                return Ok(());
            }
            if start.elapsed() > within {
                return Err(NodeError::storage("groups did not elect leaders in time"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills a member (its sockets close; what it made durable stays on disk).
    pub async fn kill(&mut self, role: Role, g: u16, id: NodeId) -> bool {
        match self.members.remove(&(role_code(role), g, id)) {
            Some(m) => {
                m.stop().await;
                true
            }
            None => false,
        }
    }

    /// Restarts a killed member from its directory, on its old address.
    pub async fn restart(&mut self, role: Role, g: u16, id: NodeId) -> Result<(), NodeError> {
        let spec = self.spec.clone();
        self.restart_with(&spec, role, g, id).await
    }

    /// Restarts a killed member with another spec than the cluster's (configuration-mistake
    /// drills: e.g. a coordinator given other `shard_starts`).
    pub async fn restart_with(
        &mut self,
        spec: &ClusterSpec,
        role: Role,
        g: u16,
        id: NodeId,
    ) -> Result<(), NodeError> {
        let group = self.spec.group(role, g)?;
        let addr = group
            .members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.addr.clone())
            .ok_or_else(|| NodeError::not_found(format!("no member {id}")))?;
        let mut tries = 0;
        let l = loop {
            match TcpListener::bind(&addr) {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(NodeError::storage(format!("cannot rebind {addr}: {e}"))),
            }
        };
        self.launch_with(spec, role, g, id, l).await
    }

    /// Every running member's status.
    pub fn statuses(&self) -> Vec<(Role, u16, florin_cluster::raft::ReplicaStatus)> {
        self.members
            .values()
            .map(|m| (m.role, m.group, m.status()))
            .collect()
    }

    /// The most confirmed txids any shard replica remembers (the replay-answer state).
    pub fn remembered(&self) -> u64 {
        self.members
            .values()
            .map(Member::remembered)
            .max()
            .unwrap_or(0)
    }

    /// Stops every member.
    pub async fn stop(mut self) {
        for (_, m) in std::mem::take(&mut self.members) {
            m.stop().await;
        }
    }
}

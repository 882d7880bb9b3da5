//! The replicated token authority: every sentinel of a cluster with an `authority` group holds
//! one replica of the authority's registry (tokens and their histories, fraud proofs, the
//! mailbox, the reserve and credits, withdrawals, the issuer's journal, blacklist, revocations
//! and the operators' trail) and serves every route. Writes are write sets
//! ([`crate::registry`]) replicated by Raft over the cluster's RPC; losing a sentinel, or its
//! disk, loses nothing while a majority of the group is up.
//!
//! A sentinel runs an operation against its own replica, then hands what it wrote to the
//! group's leader ([`Request::RegistryWrite`]), which replicates it; every replica applies it
//! in log order if it was computed on the registry's current version, and answers a conflict
//! otherwise (the sentinel runs the operation again). Reads are served by the local replica,
//! which may be behind the leader by the time its next append takes (milliseconds); a sentinel
//! waits for its own writes before it answers, so a wallet reads what it wrote.

use std::collections::{BTreeMap, HashSet};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_cluster::raft::{NodeId, Replica};
use florin_crypto::{LocalSigner, PublicKey, Signer};

use super::client::GroupClient;
use super::rpc::{Handler, NodeStatus, Request, Response, Server};
use super::service::not_leader;
use super::{key_of, peers_of, ClusterSpec, PeerTransport};
use crate::error::{NodeError, StorageError};
use crate::registry::{RegistryMachine, Replicate};
use crate::Authority;

/// How long a registry write waits for the group (a new leader is elected within seconds).
const WRITE_PATIENCE: Duration = Duration::from_secs(10);
/// How long one call to a member of the group waits for its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a read barrier waits for the group's leader.
const SYNC_PATIENCE: Duration = Duration::from_secs(5);
/// How long a sentinel waits for its own replica to apply its write before answering.
const APPLY_WAIT: Duration = Duration::from_secs(3);

/// One authority replica's RPC service: Raft messages and registry writes from the group's
/// members, status for anyone admitted.
pub struct AuthorityService {
    replica: Arc<Replica<RegistryMachine>>,
    members: HashSet<PublicKey>,
    applied: Arc<AtomicU64>,
}

impl Handler for AuthorityService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        match req {
            Request::Raft(b) if self.members.contains(peer) => {
                Response::Raft(self.replica.handle_rpc(&b).await)
            }
            Request::RegistryWrite(set) if self.members.contains(peer) => {
                match self.replica.write(set).await {
                    Ok(b) => Response::Registry(b),
                    Err(e) => not_leader(e),
                }
            }
            Request::RegistryVersion if self.members.contains(peer) => {
                match self.replica.read(|m| m.version()).await {
                    Ok(v) => Response::Registry(v.to_le_bytes().to_vec()),
                    Err(e) => not_leader(e),
                }
            }
            Request::Raft(_) | Request::RegistryWrite(_) | Request::RegistryVersion => {
                Response::Error("authority group messages only from its members".into())
            }
            Request::Status => Response::Status(NodeStatus {
                role: "authority".into(),
                group: 0,
                raft: self.replica.status(),
                load: (self.applied.load(Ordering::Acquire), 0),
                alerts: (0, None),
                remembered: 0,
            }),
            _ => Response::Error(
                "an authority replica takes Raft messages, registry writes and status".into(),
            ),
        }
    }
}

/// A sentinel's link to its authority group (what [`Authority::join`] is given).
pub struct RegistryGroup {
    client: GroupClient,
    applied: Arc<AtomicU64>,
}

impl Replicate for RegistryGroup {
    fn replicate(&self, set: Vec<u8>) -> Result<Vec<u8>, NodeError> {
        match self
            .client
            .call(&Request::RegistryWrite(set), WRITE_PATIENCE)
        {
            Ok(Response::Registry(b)) => Ok(b),
            Ok(other) => Err(StorageError::Unavailable(format!(
                "the authority group answered a registry write with {other:?}"
            ))
            .into()),
            Err(e) => Err(StorageError::Unavailable(format!("the authority group: {e}")).into()),
        }
    }

    fn sync(&self) -> Result<(), NodeError> {
        let v = match self.client.call(&Request::RegistryVersion, SYNC_PATIENCE) {
            Ok(Response::Registry(b)) => <[u8; 8]>::try_from(b.as_slice())
                .map(u64::from_le_bytes)
                .map_err(|_| StorageError::Unavailable("a bad registry version".into()))?,
            Ok(other) => {
                return Err(StorageError::Unavailable(format!(
                    "the authority group answered a version request with {other:?}"
                ))
                .into())
            }
            Err(e) => {
                return Err(StorageError::Unavailable(format!("the authority group: {e}")).into())
            }
        };
        self.wait_applied(v);
        if self.applied.load(Ordering::Acquire) < v {
            return Err(StorageError::Unavailable(
                "this sentinel's replica of the registry is behind the group".into(),
            )
            .into());
        }
        Ok(())
    }

    fn wait_applied(&self, version: u64) {
        let start = Instant::now();
        while self.applied.load(Ordering::Acquire) < version && start.elapsed() < APPLY_WAIT {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A running authority replica (stop it with [`AuthorityMember::stop`]).
pub struct AuthorityMember {
    server: Server,
    replica: Arc<Replica<RegistryMachine>>,
}

impl AuthorityMember {
    /// Its Raft status.
    pub fn status(&self) -> florin_cluster::raft::ReplicaStatus {
        self.replica.status()
    }

    /// Whether it leads the group.
    pub fn is_leader(&self) -> bool {
        self.replica.is_leader()
    }

    /// Where it listens.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// Stops serving and shuts the replica down (what is durable stays).
    pub async fn stop(&self) {
        self.server.stop();
        let _ = self.replica.shutdown().await;
    }
}

/// This sentinel's member of the spec's authority group, if it has one: its Raft id and the
/// address it listens on.
pub fn membership(spec: &ClusterSpec, me: &PublicKey) -> Option<(NodeId, String)> {
    let mine = me.to_address();
    spec.authority
        .as_ref()?
        .members
        .iter()
        .find(|m| m.key == mine)
        .map(|m| (m.id, m.addr.clone()))
}

/// Starts this sentinel's replica of the authority group (Raft state in `dir`, serving the
/// group on `listener`) over `authority`'s registry, which must be opened replicated, and
/// joins `authority` to the group. Call inside a tokio runtime.
pub async fn start_replica(
    spec: &ClusterSpec,
    authority: &Arc<Authority>,
    dir: &Path,
    me: Arc<LocalSigner>,
    listener: TcpListener,
) -> Result<AuthorityMember, NodeError> {
    if !authority.is_replicated() {
        return Err(NodeError::bad_request(
            "an authority replica needs a registry opened as replicated",
        ));
    }
    let group = spec
        .authority
        .as_ref()
        .ok_or_else(|| NodeError::bad_request("the cluster spec has no authority group"))?;
    let (id, _) = membership(spec, &me.public_key()).ok_or_else(|| {
        NodeError::bad_request("this sentinel's key is not in the authority group")
    })?;
    std::fs::create_dir_all(dir).map_err(|e| NodeError::io_at(dir, e))?;
    let timeout = Duration::from_millis(spec.raft.election_max_ms.max(1000));
    let peers = peers_of(group, &me, timeout);
    let addrs: BTreeMap<NodeId, String> = group
        .members
        .iter()
        .map(|m| (m.id, m.addr.clone()))
        .collect();
    let members: HashSet<PublicKey> = group
        .members
        .iter()
        .filter_map(|m| key_of(&m.key).ok())
        .collect();
    let applied = Arc::new(AtomicU64::new(0));
    let machine = RegistryMachine::new(authority.registry_db(), applied.clone())?;
    let transport = Arc::new(PeerTransport {
        peers: peers.iter().cloned().collect(),
    });
    // The sentinel's own calls to the group (writes, read barriers) wait longer than a Raft
    // message: a write's answer comes once it is committed and applied.
    let client_peers = peers_of(group, &me, CALL_TIMEOUT);
    let replica = Arc::new(
        Replica::open(dir, id, addrs, machine, transport, spec.raft.clone())
            .await
            .map_err(|e| NodeError::from(StorageError::from(e)))?,
    );
    crate::obs::export_raft("authority".into(), id, &replica);
    let svc = Arc::new(AuthorityService {
        replica: replica.clone(),
        members: members.clone(),
        applied: applied.clone(),
    });
    // The group's members, and for status the observers and the cluster's clients (a sentinel
    // outside the group shows it on its console); the service answers them nothing else.
    let allowed: HashSet<PublicKey> = members
        .iter()
        .copied()
        .chain(spec.observers.iter().filter_map(|k| key_of(k).ok()))
        .chain(spec.clients.iter().filter_map(|k| key_of(k).ok()))
        .collect();
    let server = Server::start(
        listener,
        me,
        allowed,
        svc,
        tokio::runtime::Handle::current(),
    )
    .map_err(|e| StorageError::Server(Box::new(e)))?;
    authority.join(Arc::new(RegistryGroup {
        client: GroupClient::new(client_peers),
        applied,
    }));
    Ok(AuthorityMember { server, replica })
}

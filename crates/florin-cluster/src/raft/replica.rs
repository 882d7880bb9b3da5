//! The [`Replica`]: opening a member's durable state and starting Raft on it, writes and
//! linearizable reads, serving peers' RPCs, status and snapshots on demand; with its options
//! ([`RaftOptions`]), errors ([`RaftError`]) and monitoring view ([`ReplicaStatus`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError, InstallSnapshotError,
};
use openraft::metrics::WaitError;
use openraft::raft::VoteRequest;
use openraft::{
    BasicNode, Config, LogIdOptionExt, Raft, RaftMetrics, ServerState, SnapshotPolicy,
    StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::log_store::LogStore;
use super::snapshot::{read_snapshot_file, split_snapshot, SNAPSHOT_FILE};
use super::state_machine::{Machine, SmState, SmStore};
use super::transport::{NetworkFactory, RaftRpc, RaftTransport, RpcReply};
use super::{blocking, read_lock, Bytes, NodeId, OrRaftError, TypeConfig};

/// Timing and compaction settings of a [`Replica`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftOptions {
    /// Leader heartbeat interval (ms). Also openraft's time limit for one append-entries round
    /// trip, follower fsync included, so keep it well above the disk's fsync latency.
    pub heartbeat_ms: u64,
    /// Minimum election timeout (ms); must exceed `heartbeat_ms`.
    pub election_min_ms: u64,
    /// Maximum election timeout (ms); must exceed `election_min_ms`.
    pub election_max_ms: u64,
    /// Build a snapshot once this many log entries have been applied since the last one and,
    /// when the last snapshot was 1 MiB or more, their commands add up to at least its size and
    /// at least [`RaftOptions::snapshot_log_bytes`] (0: only on demand). The size condition
    /// keeps snapshot work proportional to the log written (at most one byte of snapshot per
    /// byte of log, however large the state), while a restart still replays at most this many
    /// entries or the larger of one state's size and `snapshot_log_bytes` of log, never the
    /// whole history.
    pub snapshot_every: u64,
    /// Log entries already in the snapshot that are kept for lagging followers.
    pub keep_logs: u64,
    /// A state of 1 MiB or more is snapshotted only once at least this many bytes of commands
    /// were applied since the last snapshot (default 256 MiB, as the single-node engine's log):
    /// the bound on what a restart replays, and on the log kept on disk.
    #[serde(default = "default_snapshot_log_bytes")]
    pub snapshot_log_bytes: u64,
    /// Most log entries in one append to a follower (openraft's `max_payload_entries`). Each
    /// append must be answered within `heartbeat_ms` or it is sent again: on small machines,
    /// where a follower needs longer to take a few hundred batch-sized entries, a smaller
    /// number (or a longer heartbeat) lets a follower that fell behind catch up instead of
    /// timing out for ever.
    #[serde(default = "default_max_payload_entries")]
    pub max_payload_entries: u64,
}

fn default_snapshot_log_bytes() -> u64 {
    256 << 20
}

fn default_max_payload_entries() -> u64 {
    300
}

impl RaftOptions {
    /// Timing for small machines (a fraction of a core each, e.g. emulated hosts): a longer
    /// heartbeat and election timeout, and appends of at most 16 entries, so that a follower
    /// starved of CPU still answers each append in time.
    pub fn small_hosts() -> RaftOptions {
        RaftOptions {
            heartbeat_ms: 250,
            election_min_ms: 500,
            election_max_ms: 750,
            max_payload_entries: 16,
            ..RaftOptions::default()
        }
    }
}

impl Default for RaftOptions {
    fn default() -> Self {
        Self {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 750,
            snapshot_every: 1000,
            keep_logs: 500,
            snapshot_log_bytes: default_snapshot_log_bytes(),
            max_payload_entries: default_max_payload_entries(),
        }
    }
}

/// Errors of a [`Replica`].
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RaftError {
    /// This replica is not the leader; retry on `leader` (at `addr`) when known.
    #[error("not the leader (leader: {leader:?}, address: {addr:?})")]
    NotLeader {
        /// The current leader, if this replica knows it.
        leader: Option<NodeId>,
        /// The leader's address, if known.
        addr: Option<String>,
    },
    /// The group cannot answer now (e.g. no quorum confirmed the leadership).
    #[error("raft group unavailable: {0}")]
    Unavailable(String),
    /// The durable state could not be read or written.
    #[error("raft storage: {0}")]
    Storage(String),
    /// The replica is stopped or failed; it must be reopened.
    #[error("raft replica stopped: {0}")]
    Fatal(String),
    /// Invalid options or membership.
    #[error("raft configuration: {0}")]
    Config(String),
}

/// A snapshot of a replica's state, for monitoring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// This replica's id.
    pub id: NodeId,
    /// `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub state: String,
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// The current term.
    pub term: u64,
    /// Index of the last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to the machine.
    pub last_applied: Option<u64>,
    /// Index of the last entry in the current snapshot.
    pub snapshot: Option<u64>,
    /// Index of the last purged log entry.
    pub purged: Option<u64>,
}

/// A replica's status from one snapshot of openraft's metrics.
fn status_of(id: NodeId, m: &RaftMetrics<NodeId, BasicNode>) -> ReplicaStatus {
    let state = match m.state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    };
    ReplicaStatus {
        id,
        state: state.into(),
        leader: m.current_leader,
        term: m.current_term,
        last_log_index: m.last_log_index,
        last_applied: m.last_applied.index(),
        snapshot: m.snapshot.index(),
        purged: m.purged.index(),
    }
}

/// What a replica knows of its group's replication, for metrics (not on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The replica's status.
    pub status: ReplicaStatus,
    /// On the leader: the last log index each member is known to hold (`None`: nothing yet).
    pub matched: Option<BTreeMap<NodeId, Option<u64>>>,
    /// The voting members (learners, which openraft also replicates to, do not count).
    pub voters: std::collections::BTreeSet<NodeId>,
}

impl Progress {
    /// The commit index: on the leader, the highest index a majority of the voters holds; on
    /// another replica, the last index it applied (it knows no more of the commit point).
    pub fn commit_index(&self) -> Option<u64> {
        let Some(matched) = &self.matched else {
            return self.status.last_applied;
        };
        // What each voter holds: the leader its own log, a voter not in the map nothing yet.
        let mut held: Vec<Option<u64>> = self
            .voters
            .iter()
            .map(|v| match matched.get(v) {
                _ if *v == self.status.id => self.status.last_log_index,
                Some(m) => *m,
                None => None,
            })
            .collect();
        if held.is_empty() {
            return None;
        }
        held.sort_unstable_by(|a, b| b.cmp(a));
        held.get(held.len() / 2).copied().flatten()
    }

    /// On the leader: how many entries each other member lacks.
    pub fn follower_lag(&self) -> Vec<(NodeId, u64)> {
        let (Some(matched), Some(last)) = (&self.matched, self.status.last_log_index) else {
            return Vec::new();
        };
        matched
            .iter()
            .filter(|(id, _)| **id != self.status.id)
            .map(|(id, m)| (*id, m.map_or(last + 1, |m| last.saturating_sub(m))))
            .collect()
    }
}

/// One member of a Raft group, replicating the machine `M`.
pub struct Replica<M: Machine> {
    id: NodeId,
    raft: Raft<TypeConfig>,
    state: Arc<RwLock<SmState<M>>>,
    members: BTreeMap<NodeId, String>,
    /// The task that triggers snapshots by [`RaftOptions::snapshot_every`].
    watcher: Option<tokio::task::AbortHandle>,
}

impl<M: Machine> Drop for Replica<M> {
    fn drop(&mut self) {
        if let Some(w) = &self.watcher {
            w.abort();
        }
    }
}

impl<M: Machine> Replica<M> {
    /// Opens (or creates) the durable state under `dir`, restores the machine from the latest
    /// snapshot, and starts Raft; openraft re-applies the committed entries after the snapshot
    /// before this returns.
    ///
    /// `members` maps every member id to its transport address. A group that was never
    /// initialized is bootstrapped by its smallest member with exactly `members`; afterwards the
    /// membership comes from the log, `members` only serves to name a leader's address.
    pub async fn open(
        dir: &Path,
        id: NodeId,
        members: BTreeMap<NodeId, String>,
        mut machine: M,
        transport: Arc<dyn RaftTransport>,
        opts: RaftOptions,
    ) -> Result<Self, RaftError> {
        if !members.contains_key(&id) {
            return Err(RaftError::Config(format!(
                "replica {id} is not among the members"
            )));
        }
        let config = Config {
            cluster_name: "florin".into(),
            heartbeat_interval: opts.heartbeat_ms,
            election_timeout_min: opts.election_min_ms,
            election_timeout_max: opts.election_max_ms,
            // A snapshot's last chunk waits for its restore: on small hosts that takes longer
            // than an election timeout.
            install_snapshot_timeout: (opts.heartbeat_ms * 8).max(opts.election_max_ms).max(1000),
            // Snapshots are triggered by this replica's own watcher (see `snapshot_every`).
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: opts.keep_logs,
            max_payload_entries: opts.max_payload_entries.max(1),
            ..Config::default()
        }
        .validate()
        .map_err(|e| RaftError::Config(e.to_string()))?;

        std::fs::create_dir_all(dir)
            .map_err(|e| RaftError::Storage(format!("{}: {e}", dir.display())))?;
        let dir = dir.to_path_buf();
        // The snapshot first (reading changes nothing), so that the log can be checked against
        // it before the log's own open changes anything.
        let (log, file) = {
            let dir = dir.clone();
            blocking(move || {
                let file = read_snapshot_file(&dir)?;
                let at = file.as_ref().map(|(m, _)| m.last_log_id.index());
                Ok((LogStore::open_with(&dir, Some(at.flatten()))?, file))
            })
            .await
            .map_err(|e| RaftError::Storage(e.to_string()))?
        };
        let mut sm = SmState::new(machine, None, StoredMembership::default(), 0);
        let mut persisted = None;
        if let Some((meta, data)) = file {
            let ((applied, _), bytes) = split_snapshot(&data)
                .map_err(|e| RaftError::Storage(format!("{SNAPSHOT_FILE}: {e}")))?;
            if applied != meta.last_log_id {
                return Err(RaftError::Storage(format!(
                    "{}: its data is of entry {applied:?}, its metadata of {:?}",
                    dir.join(SNAPSHOT_FILE).display(),
                    meta.last_log_id
                )));
            }
            machine = sm.machine;
            machine
                .restore(bytes)
                .map_err(|e| RaftError::Storage(format!("restore: {e}")))?;
            sm = SmState::new(
                machine,
                meta.last_log_id,
                meta.last_membership,
                bytes.len() as u64,
            );
            persisted = meta.last_log_id;
        }
        let state = Arc::new(RwLock::new(sm));
        let store = SmStore {
            state: state.clone(),
            dir,
            persisted: Arc::new(tokio::sync::Mutex::new(persisted)),
        };
        let network = NetworkFactory {
            transport,
            // Short enough that one failed send does not silence a follower for longer than
            // its election timeout.
            backoff: Duration::from_millis(opts.heartbeat_ms * 2),
        };

        let raft = Raft::new(id, Arc::new(config), network, log, store)
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        let watcher = (opts.snapshot_every > 0).then(|| {
            let (raft, state) = (raft.clone(), Arc::downgrade(&state));
            let (every, floor) = (opts.snapshot_every, opts.snapshot_log_bytes);
            // A few atomic loads per tick: cheap enough to check often.
            let tick = Duration::from_millis(20);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(tick).await;
                    let Some(state) = state.upgrade() else { break };
                    let due = read_lock(&state).snapshot_due(every, floor);
                    drop(state);
                    if due && raft.trigger().snapshot().await.is_err() {
                        break;
                    }
                }
            })
            .abort_handle()
        });
        let replica = Self {
            id,
            raft,
            state,
            members,
            watcher,
        };

        let initialized = replica
            .raft
            .is_initialized()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        if !initialized && replica.members.keys().next() == Some(&id) {
            let nodes: BTreeMap<NodeId, BasicNode> = replica
                .members
                .iter()
                .map(|(k, a)| (*k, BasicNode::new(a)))
                .collect();
            match replica.raft.initialize(nodes).await {
                Ok(()) | Err(OrRaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => return Err(RaftError::Config(e.to_string())),
            }
        }
        Ok(replica)
    }

    /// This replica's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    fn not_leader(&self, f: ForwardToLeader<NodeId, BasicNode>) -> RaftError {
        let addr = f
            .leader_node
            .map(|n| n.addr)
            .or_else(|| f.leader_id.and_then(|l| self.members.get(&l).cloned()));
        RaftError::NotLeader {
            leader: f.leader_id,
            addr,
        }
    }

    /// Replicates a command and returns the machine's reply once it is committed and applied on
    /// this replica, which must be the leader ([`RaftError::NotLeader`] otherwise).
    pub async fn write(&self, cmd: Vec<u8>) -> Result<Vec<u8>, RaftError> {
        match self.raft.client_write(Bytes::from(cmd)).await {
            Ok(resp) => Ok(Vec::from(resp.data.0)),
            Err(OrRaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(self.not_leader(f))
            }
            Err(OrRaftError::APIError(e)) => Err(RaftError::Unavailable(e.to_string())),
            Err(OrRaftError::Fatal(e)) => Err(RaftError::Fatal(e.to_string())),
        }
    }

    /// Linearizable read: confirms leadership with a quorum, waits until everything committed
    /// before the call is applied here, then runs `f` on the machine.
    pub async fn read<R>(&self, f: impl FnOnce(&M) -> R) -> Result<R, RaftError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(self.with_machine(f)),
            Err(OrRaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(self.not_leader(f))
            }
            Err(OrRaftError::APIError(e)) => Err(RaftError::Unavailable(e.to_string())),
            Err(OrRaftError::Fatal(e)) => Err(RaftError::Fatal(e.to_string())),
        }
    }

    /// Runs `f` on the local machine as applied so far (possibly stale on a follower).
    pub fn with_machine<R>(&self, f: impl FnOnce(&M) -> R) -> R {
        f(&read_lock(&self.state).machine)
    }

    /// A replica that holds nothing beyond the group's initial membership entry (a first start,
    /// or a directory that was wiped) votes only in the bootstrap election, where the candidate
    /// also holds at most that entry. Once a group has a log, an empty replica may have voted in
    /// the current term before it lost its disk, and a second vote in that term could elect a
    /// second leader; so it waits until a leader has sent it the group's state (log entries or a
    /// snapshot), which also restores the vote it follows. The cost is availability in one corner:
    /// a group that never started one of its members cannot elect a new leader without the old one.
    fn vote_guard(&self, req: &VoteRequest<NodeId>) -> Option<String> {
        let m = self.raft.metrics().borrow().clone();
        let holds_nothing = m.last_log_index.unwrap_or(0) == 0 && m.snapshot.is_none();
        let candidate_has_log = req.last_log_id.is_some_and(|l| l.index > 0);
        (holds_nothing && candidate_has_log).then(|| {
            format!(
                "replica {} holds no log (new or wiped): it votes only after a leader has sent it \
                 the group's state",
                self.id
            )
        })
    }

    async fn serve(&self, rpc: RaftRpc) -> Result<RpcReply, String> {
        match rpc {
            RaftRpc::Append(req) => self.raft.append_entries(req).await.map(RpcReply::Append),
            RaftRpc::Vote(req) => {
                if let Some(refusal) = self.vote_guard(&req) {
                    return Err(refusal);
                }
                self.raft.vote(req).await.map(RpcReply::Vote)
            }
            RaftRpc::Snapshot(req) => {
                return match self.raft.install_snapshot(req).await {
                    Ok(r) => Ok(RpcReply::Snapshot(Ok(r))),
                    Err(OrRaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) => {
                        Ok(RpcReply::Snapshot(Err(m)))
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        }
        .map_err(|e| e.to_string())
    }

    /// Serves an encoded raft RPC from a peer and returns the encoded answer: a postcard
    /// `Result<reply, String>`, where `Err` carries a readable error (undecodable request, replica
    /// stopped). Never panics on bad input.
    pub async fn handle_rpc(&self, request: &[u8]) -> Vec<u8> {
        let answer = match postcard::take_from_bytes::<RaftRpc>(request) {
            Ok((rpc, [])) => self.serve(rpc).await,
            Ok(_) => Err("undecodable raft rpc: trailing bytes".to_string()),
            Err(e) => Err(format!("undecodable raft rpc: {e}")),
        };
        postcard::to_allocvec(&answer).unwrap_or_default()
    }

    /// Where this replica stands.
    pub fn status(&self) -> ReplicaStatus {
        status_of(self.id, &self.raft.metrics().borrow())
    }

    /// Its status with what it knows of the others' progress (for metrics).
    pub fn progress(&self) -> Progress {
        // One snapshot of openraft's metrics for all of it.
        let m = self.raft.metrics().borrow().clone();
        Progress {
            status: status_of(self.id, &m),
            matched: m.replication.as_ref().map(|r| {
                r.iter()
                    .map(|(id, log)| (*id, log.as_ref().map(|l| l.index)))
                    .collect()
            }),
            voters: m.membership_config.membership().voter_ids().collect(),
        }
    }

    /// openraft's metrics; the receiver changes whenever state, term or leadership changes, so a
    /// service can react when it becomes leader.
    pub fn metrics(&self) -> tokio::sync::watch::Receiver<RaftMetrics<NodeId, BasicNode>> {
        self.raft.metrics()
    }

    /// Whether this replica currently believes it is the leader.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The term this replica leads in, if it currently believes it is the leader (read from one
    /// metrics snapshot, so the term is the one it was elected in).
    pub fn leader_term(&self) -> Option<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// Builds a snapshot of everything applied so far and waits until it is in place (the log is
    /// then purged up to it, minus [`RaftOptions::keep_logs`]).
    pub async fn snapshot_now(&self) -> Result<(), RaftError> {
        let applied = self.raft.metrics().borrow().last_applied.index();
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))?;
        if let Some(want) = applied {
            self.raft
                .wait(Some(Duration::from_secs(60)))
                .metrics(
                    |m| m.snapshot.index().is_some_and(|i| i >= want),
                    "snapshot_now",
                )
                .await
                .map_err(|e| match e {
                    WaitError::ShuttingDown => RaftError::Fatal(e.to_string()),
                    WaitError::Timeout(..) => RaftError::Unavailable(e.to_string()),
                })?;
        }
        Ok(())
    }

    /// Stops Raft; the directory can then be reopened.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftError::Fatal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(
        id: NodeId,
        last: Option<u64>,
        matched: Option<&[(NodeId, Option<u64>)]>,
    ) -> Progress {
        Progress {
            status: ReplicaStatus {
                id,
                state: if matched.is_some() {
                    "leader"
                } else {
                    "follower"
                }
                .into(),
                leader: Some(1),
                term: 3,
                last_log_index: last,
                last_applied: Some(7),
                snapshot: None,
                purged: None,
            },
            matched: matched.map(|m| m.iter().copied().collect()),
            voters: (1..=5).collect(),
        }
    }

    #[test]
    fn the_commit_index_is_what_a_majority_holds() {
        // Leader 1 at 20; followers at 20, 15, 9 and one that has nothing yet.
        let p = progress(
            1,
            Some(20),
            Some(&[
                (1, Some(20)),
                (2, Some(20)),
                (3, Some(15)),
                (4, Some(9)),
                (5, None),
            ]),
        );
        assert_eq!(p.commit_index(), Some(15));
        let mut lag = p.follower_lag();
        lag.sort_unstable();
        assert_eq!(lag, vec![(2, 0), (3, 5), (4, 11), (5, 21)]);
        // The leader's own entry missing from the map counts with its last log index.
        let p = progress(1, Some(20), Some(&[(2, Some(12)), (3, Some(4))]));
        assert_eq!(p.commit_index(), Some(4), "5 voters: 3 must hold it");
        // A follower knows only what it applied.
        let p = progress(2, Some(20), None);
        assert_eq!(p.commit_index(), Some(7));
        assert!(p.follower_lag().is_empty());
    }
}

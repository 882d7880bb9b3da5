//! Raft replication of any deterministic state machine, on openraft 0.9.
//!
//! A [`Replica`] is one member of a Raft group. It keeps:
//!
//! - a durable log (`log/` under its directory, the `seglog` module): append-only segment files
//!   of entries written and synced by a writer thread (group commit), the vote and the last
//!   purged log id, and the committed log id;
//! - a snapshot file (`snapshot.bin`, written atomically: tmp file, fsync, rename) holding the
//!   machine's full state with the last applied log id and membership, behind a header with its
//!   length and CRC32; a file that does not match them, or a missing one when the log was
//!   purged past it, refuses to open (before the log is touched) and is left as it was;
//! - the [`Machine`] itself in memory, restored from the snapshot on open; openraft then re-applies
//!   the committed entries that follow it.
//!
//! Log compaction: a snapshot is built every [`RaftOptions::snapshot_every`] applied entries and
//! the log is purged up to it, keeping [`RaftOptions::keep_logs`] entries for lagging followers.
//! A follower too far behind receives the snapshot instead.
//!
//! RPCs between replicas are opaque bytes carried by a [`RaftTransport`]: the sender encodes a
//! request, the peer answers with [`Replica::handle_rpc`]. Everything is postcard-encoded.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError, InstallSnapshotError,
    NetworkError, RPCError, SnapshotMismatch, Unreachable,
};
use openraft::metrics::WaitError;
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, BasicNode, Config, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId,
    LogIdOptionExt, LogState, Raft, RaftLogReader, RaftMetrics, RaftNetwork, RaftNetworkFactory,
    RaftSnapshotBuilder, ServerState, Snapshot, SnapshotMeta, SnapshotPolicy, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::seglog::{self, SegLog};

/// A replica's id within its group.
pub type NodeId = u64;

/// A command or a reply: opaque bytes, shared (a clone is a reference count, so the log's cache,
/// replication to each follower and the state machine share one copy of an entry), encoded as
/// one byte string (not byte by byte) in the log, the snapshots and on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bytes(pub bytes::Bytes);

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        florin_ledger::bin_serde::bytes::serialize(&self.0, s)
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v.into())
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        florin_ledger::bin_serde::bytes::deserialize(d).map(|v| Bytes(v.into()))
    }
}

openraft::declare_raft_types!(
    /// The openraft type configuration: opaque byte commands and replies, `u64` node ids,
    /// [`BasicNode`] addresses, in-memory snapshot buffers, tokio.
    pub TypeConfig:
        D = Bytes,
        R = Bytes,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A deterministic replicated state machine. Commands and replies are opaque bytes (the caller
/// encodes them).
///
/// [`Machine::snapshot`] runs under the replica's read lock (applying waits for it), so it
/// should encode at memory speed; the bytes are written to disk after the lock is released.
pub trait Machine: Send + Sync + 'static {
    /// Applies one committed command and returns the reply. Must be deterministic: every replica
    /// applies the same commands in the same order and must reach the same state.
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8>;
    /// The full state, as bytes [`Machine::restore`] accepts.
    fn snapshot(&self) -> Vec<u8>;
    /// Appends [`Machine::snapshot`] to `out` (the replica's snapshot buffer, which already
    /// holds a header). Override it to encode a large state without an intermediate copy.
    fn snapshot_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.snapshot());
    }
    /// Replaces the whole state with a snapshot's.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String>;
}

/// The future a [`RaftTransport`] call returns.
pub type TransportFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, String>> + Send>>;

/// How a replica reaches a peer: send one encoded raft RPC, get the encoded answer (the bytes the
/// peer's [`Replica::handle_rpc`] returned). An `Err` means the peer could not be reached.
pub trait RaftTransport: Send + Sync + 'static {
    /// Sends `request` to replica `target` at `addr` and returns its answer.
    fn call(&self, target: NodeId, addr: &str, request: Vec<u8>) -> TransportFuture;
}

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
}

fn default_snapshot_log_bytes() -> u64 {
    256 << 20
}

impl Default for RaftOptions {
    fn default() -> Self {
        Self {
            heartbeat_ms: 100,
            election_min_ms: 500,
            election_max_ms: 1000,
            snapshot_every: 1000,
            keep_logs: 500,
            snapshot_log_bytes: default_snapshot_log_bytes(),
        }
    }
}

/// Errors of a [`Replica`].
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
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

// ---------------------------------------------------------------- helpers

type OrRaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
type NetError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, OrRaftError<E>>;

/// Why the replica's durable state (its log, its snapshot file) could not be read or written;
/// where it crosses into openraft it becomes a [`StorageError`] (see [`sto`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StoreError {
    /// The log's files.
    #[error(transparent)]
    Log(#[from] seglog::LogError),
    /// A value could not be encoded, or stored bytes could not be decoded.
    #[error("{what}: {source}")]
    Codec {
        /// What was being encoded or decoded.
        what: &'static str,
        /// postcard's error.
        #[source]
        source: postcard::Error,
    },
    /// An input/output operation on one of the replica's files failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The directory holds a replica written by an older Florin (`raft.redb`).
    #[error(
        "{}: this replica was written by an older Florin (raft.redb); its log format is gone: \
         recreate the cluster directory",
        dir.display()
    )]
    OldFormat {
        /// The replica's directory.
        dir: PathBuf,
    },
    /// Snapshot data shorter than the header at its start says.
    #[error("snapshot data: truncated header")]
    TruncatedHead,
    /// A received snapshot whose data is of another entry than its metadata.
    #[error("snapshot data does not match its meta")]
    SnapshotMismatch,
    /// The machine refused a snapshot's state ([`Machine::restore`]).
    #[error("restore: {0}")]
    Restore(String),
    /// The blocking task that did the disk work panicked or was cancelled.
    #[error("raft storage task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl StoreError {
    fn codec(what: &'static str) -> impl FnOnce(postcard::Error) -> StoreError {
        move |source| StoreError::Codec { what, source }
    }
}

/// A storage error for openraft, built from a typed one (its sources are kept).
fn sto<E: std::error::Error + 'static>(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: &E,
) -> StorageError<NodeId> {
    StorageIOError::new(subject, verb, AnyError::new(e)).into()
}

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Runs blocking disk work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await?
}

/// Writes `dir/name` atomically and durably ([`florin_fs::write_atomic`]).
fn write_atomic(dir: &Path, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    florin_fs::write_atomic(&dir.join(name), parts)
}

// ---------------------------------------------------------------- durable log

/// The log's own directory under a replica's directory.
const LOG_DIR: &str = "log";

/// What the log keeps durably besides its entries.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct LogMeta {
    vote: Option<Vote<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

/// The log store openraft writes through: a `SegLog` of encoded entries, with the entries themselves cached in memory.
struct LogStore {
    log: SegLog<Entry<TypeConfig>>,
    meta: LogMeta,
    /// The last entry appended (whether or not synced yet), if any is left.
    last: Option<LogId<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// A log reader for replication tasks (it keeps working, reading nothing new, once the
/// replica has shut down).
struct LogReader {
    reader: seglog::Reader<Entry<TypeConfig>>,
}

/// Reads a range of entries; errors are for [`log_read_err`].
fn read_entries(
    reader: &seglog::Reader<Entry<TypeConfig>>,
    range: (Bound<u64>, Bound<u64>),
) -> Result<Vec<Entry<TypeConfig>>, StoreError> {
    let start = match range.0 {
        Bound::Included(i) => i,
        Bound::Excluded(i) => i.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.1 {
        Bound::Included(i) => i.saturating_add(1),
        Bound::Excluded(i) => i,
        Bound::Unbounded => u64::MAX,
    };
    reader
        .read(start, end)?
        .into_iter()
        .map(|g| match g {
            seglog::Got::Cached(e) => Ok(e),
            seglog::Got::Disk(p) => {
                postcard::from_bytes(&p).map_err(StoreError::codec("a log entry"))
            }
        })
        .collect()
}

fn log_read_err(e: StoreError) -> StorageError<NodeId> {
    sto(ErrorSubject::Logs, ErrorVerb::Read, &e)
}

fn bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

/// A callback for the log writer that resolves a oneshot.
fn completion() -> (
    seglog::Done,
    tokio::sync::oneshot::Receiver<Result<(), seglog::LogError>>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

async fn completed(
    rx: tokio::sync::oneshot::Receiver<Result<(), seglog::LogError>>,
) -> Result<(), seglog::LogError> {
    rx.await.map_err(|_| seglog::LogError::Stopped)?
}

impl LogStore {
    /// Opens the log without comparing it with a snapshot (tests of the log alone).
    #[cfg(test)]
    fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, None)
    }

    /// Opens the log. `snapshot`, when given, is the last index the replica's snapshot file
    /// holds (`None`: no snapshot): the log must not have been purged past it.
    fn open_with(dir: &Path, snapshot: Option<Option<u64>>) -> Result<Self, StoreError> {
        if dir.join("raft.redb").exists() {
            return Err(StoreError::OldFormat {
                dir: dir.to_path_buf(),
            });
        }
        let log_dir = dir.join(LOG_DIR);
        let bounds = |meta: Option<&[u8]>, committed: Option<&[u8]>| {
            let meta = meta
                .map(postcard::from_bytes::<LogMeta>)
                .transpose()
                .map_err(|e| {
                    seglog::Damage::new(
                        log_dir.join("meta.bin"),
                        8,
                        "the vote and purge point",
                        e.to_string(),
                    )
                })?;
            let purged = meta.and_then(|m| m.purged.map(|p| p.index));
            if let (Some(snapshot), Some(p)) = (snapshot, purged) {
                if snapshot.is_none_or(|s| s < p) {
                    return Err(seglog::Damage::new(
                        dir.join(SNAPSHOT_FILE),
                        0,
                        format!(
                            "a snapshot up to entry {p} or later (the log is purged up to {p})"
                        ),
                        match snapshot {
                            Some(s) => format!("a snapshot up to entry {s}"),
                            None => "no file".into(),
                        },
                    )
                    .into());
                }
            }
            Ok(seglog::Bounds {
                purged,
                // A copy that does not decode is a torn one: no bound.
                committed: committed
                    .and_then(|c| postcard::from_bytes::<Option<LogId<NodeId>>>(c).ok())
                    .flatten()
                    .map(|c| c.index),
                covered: snapshot.flatten(),
                // openraft's first entry (the group's first membership) is entry 0, and a
                // replica saves a vote before it accepts any entry after it.
                origin: Some(0),
            })
        };
        let (log, found) = SegLog::open(&log_dir, seglog::Limits::default(), bounds)?;
        let meta: LogMeta = match &found.meta {
            Some(m) => postcard::from_bytes(m).map_err(StoreError::codec("the log's metadata"))?,
            None => LogMeta::default(),
        };
        let last = match &found.last {
            Some((_, p)) => Some(
                postcard::from_bytes::<Entry<TypeConfig>>(p)
                    .map_err(StoreError::codec("the log's last entry"))?
                    .log_id,
            ),
            None => None,
        };
        if found.torn_bytes > 0 {
            eprintln!(
                "florin raft: {}: cut {} bytes of an append torn by a crash (never acknowledged)",
                dir.display(),
                found.torn_bytes
            );
        }
        // The commit point is written without a sync: never trust one beyond the log.
        let committed = found
            .committed
            .and_then(|c| postcard::from_bytes::<Option<LogId<NodeId>>>(&c).ok())
            .flatten()
            .filter(|c| last.is_some_and(|l| c.index <= l.index));
        Ok(LogStore {
            log,
            meta,
            last,
            committed,
        })
    }

    /// Encodes the entries straight into one buffer of framed records and hands it to the
    /// writer; they are readable when this returns, `done` runs once they are synced.
    fn submit(
        &mut self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
        done: seglog::Done,
    ) -> Result<(), StoreError> {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let size: usize = entries
            .iter()
            .map(|e| match &e.payload {
                EntryPayload::Normal(b) => b.0.len() + 64,
                _ => 256,
            })
            .sum();
        let mut buf = Vec::with_capacity(size);
        let mut records = Vec::with_capacity(entries.len());
        for e in entries {
            let index = e.log_id.index;
            let start = buf.len();
            seglog::frame_with(&mut buf, index, |b| {
                postcard::to_extend(&e, std::mem::take(b)).map(|v| *b = v)
            })
            .map_err(StoreError::codec("a log entry"))?;
            let len = (buf.len() - start - seglog::HEADER) as u32;
            self.last = Some(e.log_id);
            records.push((index, e, len));
        }
        Ok(self.log.append_framed(buf, records, done)?)
    }

    async fn save_meta(&self) -> Result<(), StoreError> {
        let (done, rx) = completion();
        let meta =
            postcard::to_allocvec(&self.meta).map_err(StoreError::codec("the log's metadata"))?;
        self.log.save_meta(meta, done)?;
        Ok(completed(rx).await?)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        read_entries(&self.log.reader(), bounds(&range)).map_err(log_read_err)
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        read_entries(&self.reader, bounds(&range)).map_err(log_read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let purged = self.meta.purged;
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: if purged > self.last {
                purged
            } else {
                self.last
            },
        })
    }

    async fn get_log_reader(&mut self) -> LogReader {
        LogReader {
            reader: self.log.reader(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.meta.vote = Some(*vote);
        self.save_meta()
            .await
            .map_err(|e| sto(ErrorSubject::Vote, ErrorVerb::Write, &e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.meta.vote)
    }

    /// Not synced (a lost `committed` only means less is re-applied at startup, the leader
    /// re-commits the rest).
    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.committed = committed;
        let bytes = postcard::to_allocvec(&committed)
            .map_err(StoreError::codec("the commit point"))
            .map_err(|e| sto(ErrorSubject::Store, ErrorVerb::Write, &e))?;
        self.log
            .save_committed(bytes)
            .map_err(|e| sto(ErrorSubject::Store, ErrorVerb::Write, &e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.committed)
    }

    /// Returns once the entries are readable; the writer thread syncs them (with whatever else
    /// queued up meanwhile) and then tells openraft through `callback`.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        self.submit(
            entries,
            Box::new(move |r| callback.log_io_completed(r.map_err(std::io::Error::other))),
        )
        .map_err(|e| sto(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let err = |e: seglog::LogError| sto(ErrorSubject::Logs, ErrorVerb::Delete, &e);
        let (done, rx) = completion();
        self.log.truncate(log_id.index, done).map_err(err)?;
        completed(rx).await.map_err(err)?;
        self.last = match log_id.index.checked_sub(1) {
            Some(prev) => read_entries(
                &self.log.reader(),
                (Bound::Included(prev), Bound::Included(prev)),
            )
            .map_err(log_read_err)?
            .pop()
            .map(|e| e.log_id),
            None => None,
        };
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let err = |e: seglog::LogError| sto(ErrorSubject::Logs, ErrorVerb::Delete, &e);
        self.meta.purged = Some(log_id);
        let meta = postcard::to_allocvec(&self.meta)
            .map_err(StoreError::codec("the log's metadata"))
            .map_err(|e| sto(ErrorSubject::Logs, ErrorVerb::Delete, &e))?;
        let (done, rx) = completion();
        self.log.purge(log_id.index, meta, done).map_err(err)?;
        completed(rx).await.map_err(err)?;
        if self.last.is_some_and(|l| l.index <= log_id.index) {
            self.last = None;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- state machine and snapshots

const SNAPSHOT_FILE: &str = "snapshot.bin";

/// Below this size (bytes of machine state) a snapshot is cheap: it is taken by entry count
/// alone.
const SMALL_SNAPSHOT: u64 = 1 << 20;

/// The machine with the raft bookkeeping that must travel with it.
struct SmState<M> {
    machine: M,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    /// Commands applied since the last snapshot was taken, and their bytes (atomics: a
    /// snapshot resets them under the read lock it encodes under).
    since_entries: AtomicU64,
    since_bytes: AtomicU64,
    /// Size of the machine's part of the last snapshot taken, installed or restored.
    snapshot_len: AtomicU64,
}

impl<M> SmState<M> {
    fn new(
        machine: M,
        applied: Option<LogId<NodeId>>,
        membership: StoredMembership<NodeId, BasicNode>,
        snapshot_len: u64,
    ) -> Self {
        SmState {
            machine,
            applied,
            membership,
            since_entries: AtomicU64::new(0),
            since_bytes: AtomicU64::new(0),
            snapshot_len: AtomicU64::new(snapshot_len),
        }
    }

    /// Whether the snapshot policy of [`RaftOptions::snapshot_every`] calls for one now.
    fn snapshot_due(&self, every: u64, floor: u64) -> bool {
        let len = self.snapshot_len.load(Ordering::Relaxed);
        every > 0
            && self.since_entries.load(Ordering::Relaxed) >= every
            && (len < SMALL_SNAPSHOT || self.since_bytes.load(Ordering::Relaxed) >= len.max(floor))
    }

    fn reset_since(&self, snapshot_len: u64) {
        self.since_entries.store(0, Ordering::Relaxed);
        self.since_bytes.store(0, Ordering::Relaxed);
        self.snapshot_len.store(snapshot_len, Ordering::Relaxed);
    }
}

/// Appends `head` (a postcard value) with its length in front: `len u32 ‖ postcard`.
fn put_head<T: Serialize>(out: &mut Vec<u8>, head: &T) -> Result<(), StoreError> {
    let bytes = postcard::to_allocvec(head).map_err(StoreError::codec("snapshot head"))?;
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Splits what [`put_head`] wrote (and whatever follows it).
fn take_head<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<(T, &[u8]), StoreError> {
    let (len, rest) = b
        .split_first_chunk::<4>()
        .ok_or(StoreError::TruncatedHead)?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(StoreError::TruncatedHead);
    }
    let (head, rest) = rest.split_at(len);
    let head = postcard::from_bytes(head).map_err(StoreError::codec("snapshot data"))?;
    Ok((head, rest))
}

/// Where a snapshot stands in the log: the first part of its data (the snapshot data sent to
/// peers is `put_head(SnapshotHead) ‖ the machine's bytes`, so the machine writes its state
/// straight into the buffer, and reads it back in place).
type SnapshotHead = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// The parts of a snapshot's data: its head and the machine's bytes.
fn split_snapshot(data: &[u8]) -> Result<(SnapshotHead, &[u8]), StoreError> {
    take_head(data)
}

/// The state machine store openraft drives; also its snapshot builder.
struct SmStore<M> {
    state: Arc<RwLock<SmState<M>>>,
    dir: PathBuf,
    /// Serialises snapshot file writes; holds the last log id of the persisted snapshot.
    persisted: Arc<tokio::sync::Mutex<Option<LogId<NodeId>>>>,
}

impl<M> Clone for SmStore<M> {
    fn clone(&self) -> Self {
        Self {
            state: self.state.clone(),
            dir: self.dir.clone(),
            persisted: self.persisted.clone(),
        }
    }
}

/// A snapshot read from disk: its metadata and its data.
type StoredSnapshot = (SnapshotMeta<NodeId, BasicNode>, Vec<u8>);

/// The first bytes of `snapshot.bin`.
const SNAPSHOT_MAGIC: &[u8; 8] = b"FLSNAP02";
/// Bytes of `snapshot.bin` before its body: magic, body length, checksum.
const SNAPSHOT_HEADER: u64 = 20;

/// The header of `snapshot.bin` for a body of `parts`: `FLSNAP02 ‖ body length u64 ‖ crc32 of
/// the body u32` (little endian).
fn snapshot_header(parts: &[&[u8]]) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    let mut len = 0u64;
    for p in parts {
        h.update(p);
        len += p.len() as u64;
    }
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER as usize);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out
}

/// `snapshot.bin`: a [`snapshot_header`], then the body: `put_head(meta)` and the snapshot's
/// data. Read in steps so the data (a whole state) lands in its own buffer without another
/// copy. A file that is shorter or longer than its header says, or whose body does not match
/// its checksum, is refused as [`seglog::Damage`]. A file from before the checksum (no magic)
/// is read as it was written, unchecked; the next snapshot replaces it.
fn read_snapshot_file(dir: &Path) -> Result<Option<StoredSnapshot>, seglog::LogError> {
    use std::io::Read;
    let path = dir.join(SNAPSHOT_FILE);
    let other = |e: std::io::Error| seglog::LogError::io(&path, "read", e);
    let bad = |offset: u64, expected: String, found: String| {
        seglog::LogError::from(seglog::Damage::new(path.clone(), offset, expected, found))
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(other(e)),
    };
    let file_len = file.metadata().map_err(other)?.len();
    let mut magic = [0u8; 8];
    if file_len >= 8 {
        file.read_exact(&mut magic).map_err(other)?;
    }
    if file_len >= 8 && &magic != SNAPSHOT_MAGIC {
        return read_old_snapshot(&magic, file, file_len)
            .map(Some)
            .map_err(|found| {
                bad(
                    0,
                    format!(
                        "{} (or an older snapshot)",
                        String::from_utf8_lossy(SNAPSHOT_MAGIC)
                    ),
                    found,
                )
            });
    }
    if file_len < SNAPSHOT_HEADER {
        return Err(bad(
            file_len,
            format!("a {SNAPSHOT_HEADER}-byte header (magic, length, checksum)"),
            format!("a file of {file_len} bytes"),
        ));
    }
    let mut rest = [0u8; 12];
    file.read_exact(&mut rest).map_err(other)?;
    let (len, sum) = rest.split_at(8);
    let body_len = u64::from_le_bytes(len.try_into().unwrap_or_default());
    let sum = u32::from_le_bytes(sum.try_into().unwrap_or_default());
    let want = SNAPSHOT_HEADER.saturating_add(body_len);
    if file_len != want {
        return Err(bad(
            file_len.min(want),
            format!("a file of {want} bytes (its header gives a {body_len}-byte body)"),
            format!("{file_len} bytes"),
        ));
    }
    let mut len = [0u8; 4];
    file.read_exact(&mut len).map_err(other)?;
    let head_len = u32::from_le_bytes(len) as u64;
    if head_len + 4 > body_len {
        return Err(bad(
            SNAPSHOT_HEADER,
            format!("a snapshot head within the {body_len}-byte body"),
            format!("a head of {head_len} bytes"),
        ));
    }
    let mut head = vec![0u8; head_len as usize];
    file.read_exact(&mut head).map_err(other)?;
    let mut data = Vec::with_capacity((body_len - 4 - head_len) as usize);
    file.read_to_end(&mut data).map_err(other)?;
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(&head);
    h.update(&data);
    let computed = h.finalize();
    if computed != sum {
        return Err(bad(
            SNAPSHOT_HEADER,
            format!("a body summing to the header's checksum {sum:#010x}"),
            format!("one summing to {computed:#010x}"),
        ));
    }
    let meta = postcard::from_bytes(&head).map_err(|e| {
        bad(
            SNAPSHOT_HEADER + 4,
            "the snapshot's metadata".into(),
            e.to_string(),
        )
    })?;
    Ok(Some((meta, data)))
}

/// A `snapshot.bin` from before the checksum: `put_head(meta)` and the data. `start` is its
/// first 8 bytes, already read.
fn read_old_snapshot(
    start: &[u8; 8],
    mut file: std::fs::File,
    file_len: u64,
) -> Result<StoredSnapshot, String> {
    use std::io::Read;
    let head_len = u32::from_le_bytes([start[0], start[1], start[2], start[3]]) as u64;
    if 4 + head_len > file_len {
        return Err(format!(
            "a header giving a {head_len}-byte head in a file of {file_len} bytes"
        ));
    }
    let mut head = start[4..].to_vec();
    head.resize(head_len as usize, 0);
    if head_len > 4 {
        file.read_exact(&mut head[4..]).map_err(|e| e.to_string())?;
    } else {
        return Err(format!("a head of {head_len} bytes"));
    }
    let meta = postcard::from_bytes(&head).map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    file.read_to_end(&mut data).map_err(|e| e.to_string())?;
    Ok((meta, data))
}

impl<M: Machine> SmStore<M> {
    /// Persists a snapshot unless a newer one is already on disk.
    async fn persist(
        &self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        data: Vec<u8>,
    ) -> Result<Vec<u8>, StorageError<NodeId>> {
        let mut persisted = self.persisted.lock().await;
        if *persisted > meta.last_log_id {
            return Ok(data);
        }
        let err = |e: StoreError| {
            sto(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                &e,
            )
        };
        let mut head = Vec::new();
        put_head(&mut head, meta).map_err(err)?;
        let dir = self.dir.clone();
        let data = blocking(move || {
            let header = snapshot_header(&[&head, &data]);
            write_atomic(&dir, SNAPSHOT_FILE, &[&header, &head, &data]).map_err(|source| {
                StoreError::Io {
                    path: dir.join(SNAPSHOT_FILE),
                    source,
                }
            })?;
            Ok(data)
        })
        .await
        .map_err(err)?;
        *persisted = meta.last_log_id;
        Ok(data)
    }
}

impl<M: Machine> RaftSnapshotBuilder<TypeConfig> for SmStore<M> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let (data, applied, last_membership) = {
            let st = read_lock(&self.state);
            let mut data = Vec::new();
            put_head(&mut data, &(st.applied, &st.membership))
                .map_err(|e| sto(ErrorSubject::StateMachine, ErrorVerb::Read, &e))?;
            let start = data.len();
            st.machine.snapshot_into(&mut data);
            st.reset_since((data.len() - start) as u64);
            (data, st.applied, st.membership.clone())
        };
        let snapshot_id = format!(
            "{}-{}-{:016x}",
            applied.map_or(0, |l| l.leader_id.term),
            applied.index().unwrap_or(0),
            rand::random::<u64>()
        );
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership,
            snapshot_id,
        };
        let data = self.persist(&meta, data).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl<M: Machine> RaftStateMachine<TypeConfig> for SmStore<M> {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        let st = read_lock(&self.state);
        Ok((st.applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Bytes>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut st = write_lock(&self.state);
        let mut replies = Vec::new();
        for entry in entries {
            st.applied = Some(entry.log_id);
            replies.push(Bytes::from(match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(cmd) => {
                    st.since_entries.fetch_add(1, Ordering::Relaxed);
                    st.since_bytes
                        .fetch_add(cmd.0.len() as u64, Ordering::Relaxed);
                    st.machine.apply(&cmd.0)
                }
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(entry.log_id), m);
                    Vec::new()
                }
            }));
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let err = |e: StoreError| {
            sto(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Write,
                &e,
            )
        };
        let data = snapshot.into_inner();
        {
            let ((applied, _), machine) = split_snapshot(&data).map_err(err)?;
            if applied != meta.last_log_id {
                return Err(err(StoreError::SnapshotMismatch));
            }
            let mut st = write_lock(&self.state);
            st.machine
                .restore(machine)
                .map_err(|e| err(StoreError::Restore(e)))?;
            st.reset_since(machine.len() as u64);
            st.applied = meta.last_log_id;
            st.membership = meta.last_membership.clone();
        }
        self.persist(meta, data).await.map(|_| ())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let _guard = self.persisted.lock().await;
        let dir = self.dir.clone();
        let file = blocking(move || Ok(read_snapshot_file(&dir)?))
            .await
            .map_err(|e| sto(ErrorSubject::Snapshot(None), ErrorVerb::Read, &e))?;
        Ok(file.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

// ---------------------------------------------------------------- network

/// A request from one replica to another.
#[derive(Serialize, Deserialize)]
enum RaftRpc {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A successful answer; on the wire it travels as `Result<RpcReply, String>`.
#[derive(Serialize, Deserialize)]
enum RpcReply {
    Append(AppendEntriesResponse<NodeId>),
    Vote(VoteResponse<NodeId>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, SnapshotMismatch>),
}

struct NetworkFactory {
    transport: Arc<dyn RaftTransport>,
    backoff: Duration,
}

struct Peer {
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

// ---------------------------------------------------------------- replica

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
            install_snapshot_timeout: opts.election_max_ms.max(1000),
            // Snapshots are triggered by this replica's own watcher (see `snapshot_every`).
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: opts.keep_logs,
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
            backoff: Duration::from_millis(opts.heartbeat_ms * 4),
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
        let m = self.raft.metrics().borrow().clone();
        let state = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        ReplicaStatus {
            id: self.id,
            state: state.into(),
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.index(),
            snapshot: m.snapshot.index(),
            purged: m.purged.index(),
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
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};

    /// A machine that records the commands it applied.
    #[derive(Default)]
    struct Recorder(Vec<Vec<u8>>);

    impl Machine for Recorder {
        fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
            self.0.push(cmd.to_vec());
            cmd.to_vec()
        }
        fn snapshot(&self) -> Vec<u8> {
            postcard::to_allocvec(&self.0).unwrap()
        }
        fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
            self.0 = postcard::from_bytes(snapshot).map_err(|e| e.to_string())?;
            Ok(())
        }
    }

    struct OnDisk;

    impl StoreBuilder<TypeConfig, LogStore, SmStore<Recorder>, tempfile::TempDir> for OnDisk {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, SmStore<Recorder>), StorageError<NodeId>>
        {
            let dir = tempfile::tempdir().unwrap();
            let log = LogStore::open(dir.path()).unwrap();
            let sm = SmStore {
                state: Arc::new(RwLock::new(SmState::new(
                    Recorder::default(),
                    None,
                    StoredMembership::default(),
                    0,
                ))),
                dir: dir.path().to_path_buf(),
                persisted: Arc::new(tokio::sync::Mutex::new(None)),
            };
            Ok((dir, log, sm))
        }
    }

    type S = Suite<TypeConfig, LogStore, SmStore<Recorder>, OnDisk, tempfile::TempDir>;

    /// Runs one test of openraft's suite on a fresh store.
    fn run<F, Fu>(name: &str, test: F)
    where
        F: FnOnce(LogStore, SmStore<Recorder>) -> Fu,
        Fu: Future<Output = Result<(), StorageError<NodeId>>>,
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let (_dir, log, sm) = OnDisk.build().await.unwrap();
            if let Err(e) = test(log, sm).await {
                panic!("{name}: {e}");
            }
        });
    }

    /// openraft's own conformance suite for log stores and state machines, test by test.
    /// Left out: `get_initial_state_membership_from_log_and_sm`, which appends entry 3 after
    /// entry 1 — a hole, which openraft's contract forbids and this store refuses
    /// (`append_with_a_hole_is_refused` below).
    #[test]
    fn openraft_storage_suite() {
        macro_rules! suite {
            ($($t:ident),* $(,)?) => { $( run(stringify!($t), S::$t); )* };
        }
        suite!(
            last_membership_in_log_initial,
            last_membership_in_log,
            last_membership_in_log_multi_step,
            get_membership_initial,
            get_membership_from_log_and_empty_sm,
            get_membership_from_empty_log_and_sm,
            get_membership_from_log_le_sm_last_applied,
            get_membership_from_log_gt_sm_last_applied_1,
            get_membership_from_log_gt_sm_last_applied_2,
            get_initial_state_without_init,
            get_initial_state_with_state,
            get_initial_state_last_log_gt_sm,
            get_initial_state_last_log_lt_sm,
            get_initial_state_log_ids,
            get_initial_state_re_apply_committed,
            save_vote,
            get_log_entries,
            limited_get_log_entries,
            try_get_log_entry,
            initial_logs,
            get_log_state,
            get_log_id,
            last_id_in_log,
            last_applied_state,
            purge_logs_upto_0,
            purge_logs_upto_5,
            purge_logs_upto_20,
            delete_logs_since_11,
            delete_logs_since_0,
            append_to_log,
            snapshot_meta,
            apply_single,
            apply_multiple,
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(S::transfer_snapshot(&OnDisk)).unwrap();
    }

    #[test]
    fn append_with_a_hole_is_refused() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let (_dir, mut log, _) = OnDisk.build().await.unwrap();
            let e = |index| Entry::<TypeConfig> {
                log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Blank,
            };
            let (done, rx) = completion();
            log.submit([e(1)], done).unwrap();
            completed(rx).await.unwrap();
            let Err(err) = log.submit([e(3)], Box::new(|_| {})) else {
                panic!("a hole must be refused");
            };
            assert!(err.to_string().contains("does not follow"), "{err}");
            assert_eq!(log.try_get_log_entries(0..).await.unwrap().len(), 1);
        });
    }

    /// What the log store reports survives closing and reopening it, including after a
    /// truncation and a purge.
    #[test]
    fn log_store_reopens_where_it_left_off() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let id = |term, index| LogId::new(openraft::CommittedLeaderId::new(term, 1), index);
            let entry = |term, index: u64| Entry::<TypeConfig> {
                log_id: id(term, index),
                payload: EntryPayload::Normal(Bytes::from(index.to_le_bytes().to_vec())),
            };
            {
                let mut log = LogStore::open(dir.path()).unwrap();
                let (done, rx) = completion();
                log.submit((1..=20).map(|i| entry(1, i)), done).unwrap();
                completed(rx).await.unwrap();
                log.save_vote(&Vote::new(2, 1)).await.unwrap();
                log.truncate(id(1, 15)).await.unwrap();
                log.purge(id(1, 5)).await.unwrap();
                log.save_committed(Some(id(1, 12))).await.unwrap();
                let st = log.get_log_state().await.unwrap();
                assert_eq!(st.last_log_id, Some(id(1, 14)));
                assert_eq!(st.last_purged_log_id, Some(id(1, 5)));
            }
            let mut log = LogStore::open(dir.path()).unwrap();
            let st = log.get_log_state().await.unwrap();
            assert_eq!(st.last_log_id, Some(id(1, 14)));
            assert_eq!(st.last_purged_log_id, Some(id(1, 5)));
            assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(2, 1)));
            assert_eq!(log.read_committed().await.unwrap(), Some(id(1, 12)));
            let got = log.try_get_log_entries(1..6).await.unwrap();
            assert!(got.is_empty(), "purged entries are not served");
            let got = log.try_get_log_entries(1..100).await.unwrap();
            assert_eq!(
                got.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
                (6..=14).collect::<Vec<_>>()
            );
            assert_eq!(got[0].payload, entry(1, 6).payload);
        });
    }

    /// A replica directory from the redb era is refused with a clear message.
    #[test]
    fn an_old_redb_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("raft.redb"), b"old").unwrap();
        let Err(e) = LogStore::open(dir.path()) else {
            panic!("a redb-era directory must be refused");
        };
        assert!(e.to_string().contains("older Florin"), "{e}");
    }
}

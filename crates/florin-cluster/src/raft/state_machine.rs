//! The [`Machine`] trait, and the state machine store openraft drives: it applies committed
//! entries to the machine, builds snapshots of it (by [`super::RaftOptions::snapshot_every`]),
//! persists them and installs those a leader sends.

use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, LogIdOptionExt,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StoredMembership,
};

use super::error::{sto, StoreError};
use super::snapshot::{
    put_head, read_snapshot_file, snapshot_header, split_snapshot, write_atomic, SNAPSHOT_FILE,
};
use super::{blocking, read_lock, write_lock, Bytes, NodeId, TypeConfig};

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
    /// Why [`Machine::restore`] refuses a snapshot's bytes.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Replaces the whole state with a snapshot's.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), Self::Error>;
}

/// Below this size (bytes of machine state) a snapshot is cheap: it is taken by entry count
/// alone.
const SMALL_SNAPSHOT: u64 = 1 << 20;

/// The machine with the raft bookkeeping that must travel with it.
pub(super) struct SmState<M> {
    pub(super) machine: M,
    pub(super) applied: Option<LogId<NodeId>>,
    pub(super) membership: StoredMembership<NodeId, BasicNode>,
    /// Commands applied since the last snapshot was taken, and their bytes (atomics: a
    /// snapshot resets them under the read lock it encodes under).
    since_entries: AtomicU64,
    since_bytes: AtomicU64,
    /// Size of the machine's part of the last snapshot taken, installed or restored.
    snapshot_len: AtomicU64,
}

impl<M> SmState<M> {
    pub(super) fn new(
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

    /// Whether the snapshot policy of [`super::RaftOptions::snapshot_every`] calls for one now.
    pub(super) fn snapshot_due(&self, every: u64, floor: u64) -> bool {
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

/// The state machine store openraft drives; also its snapshot builder.
pub(super) struct SmStore<M> {
    pub(super) state: Arc<RwLock<SmState<M>>>,
    pub(super) dir: PathBuf,
    /// Serialises snapshot file writes; holds the last log id of the persisted snapshot.
    pub(super) persisted: Arc<tokio::sync::Mutex<Option<LogId<NodeId>>>>,
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
                .map_err(|e| err(StoreError::Restore(Box::new(e))))?;
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

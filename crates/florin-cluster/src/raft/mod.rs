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
//!
//! The module's parts, one responsibility each:
//!
//! - `replica`: the [`Replica`] (open, write, read, status, snapshot on demand, serving peers'
//!   RPCs), its [`RaftOptions`], [`RaftError`] and [`ReplicaStatus`];
//! - `state_machine`: the [`Machine`] trait and the state machine store openraft drives
//!   (applying entries, building and installing snapshots);
//! - `snapshot`: the snapshot file (`snapshot.bin`) and the layout of snapshot data;
//! - `log_store`: the durable log openraft writes through, on the `seglog` segment files;
//! - `transport`: the RPC messages between replicas and the [`RaftTransport`] that carries them;
//! - `error`: the typed storage errors and their conversion into openraft's.

use std::io::Cursor;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::{BasicNode, Entry};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod error;
mod log_store;
mod replica;
mod snapshot;
mod state_machine;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
mod transport;

use error::StoreError;
pub use replica::{Progress, RaftError, RaftOptions, Replica, ReplicaStatus};
pub use state_machine::Machine;
pub use transport::{
    encode_vote_request, reencode_reply, reencode_rpc, RaftTransport, TransportError,
    TransportFuture,
};

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

// ---------------------------------------------------------------- helpers

/// openraft's error, or the API error `E` of one call.
pub(super) type OrRaftError<E = openraft::error::Infallible> =
    openraft::error::RaftError<NodeId, E>;

pub(super) fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Runs blocking disk work off the async workers.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f).await?
}

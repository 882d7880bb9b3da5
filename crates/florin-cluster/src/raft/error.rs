//! The replica's typed storage errors ([`StoreError`]) and their conversion into openraft's
//! [`StorageError`] where they cross into it ([`sto`]).

use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageError, StorageIOError};

use super::NodeId;
use crate::seglog;

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
    /// The machine refused a snapshot's state ([`super::Machine::restore`]).
    #[error("restore: {0}")]
    Restore(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task that did the disk work panicked or was cancelled.
    #[error("raft storage task: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl StoreError {
    pub(super) fn codec(what: &'static str) -> impl FnOnce(postcard::Error) -> StoreError {
        move |source| StoreError::Codec { what, source }
    }
}

/// A storage error for openraft, built from a typed one (its sources are kept).
pub(super) fn sto<E: std::error::Error + 'static>(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: &E,
) -> StorageError<NodeId> {
    StorageIOError::new(subject, verb, AnyError::new(e)).into()
}

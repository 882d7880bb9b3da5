//! Why the log could not be opened, read or written ([`LogError`]), and the damage found when
//! opening it ([`Damage`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Damage found when the log (or a replica's snapshot) is opened: the file, the byte where it
/// is, what was expected there and what was found. Opening refuses and changes nothing on disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[error(
    "{} is damaged at byte {offset}: expected {expected}, found {found} (nothing was changed on \
     disk; see \"Damage and recovery\" in docs/cluster.md)",
    path.display()
)]
pub(crate) struct Damage {
    /// The damaged (or missing) file.
    pub path: PathBuf,
    /// Where in it.
    pub offset: u64,
    /// What should be there.
    pub expected: String,
    /// What is there.
    pub found: String,
}

impl Damage {
    pub(crate) fn new(
        path: PathBuf,
        offset: u64,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Self {
        Damage {
            path,
            offset,
            expected: expected.into(),
            found: found.into(),
        }
    }
}

/// Why the log could not be opened, read or written. `Clone`: one failed sync is reported to
/// every append that waited for it, and kept as the reason the log refuses further appends.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum LogError {
    /// A durable file is damaged, or missing, in a way a crash cannot explain (found by
    /// [`super::SegLog::open`], which then changes nothing).
    #[error(transparent)]
    Damaged(#[from] Damage),
    /// An input/output operation on one of the log's files (or its directory) failed.
    #[error("raft log {}: {op}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`"read"`, `"sync"`, ...).
        op: &'static str,
        /// The operating system's error (shared: the error may be reported to several callers).
        #[source]
        source: Arc<io::Error>,
    },
    /// The directory's lock is held by another open log (another replica or process).
    #[error("{}: the raft log is in use by another replica", dir.display())]
    Locked {
        /// The log's directory.
        dir: PathBuf,
    },
    /// A record read back from a segment does not match its length, index or checksum.
    #[error("raft log {}: entry {index} is damaged", path.display())]
    EntryDamaged {
        /// The segment file.
        path: PathBuf,
        /// The entry read.
        index: u64,
    },
    /// The segment that should hold an entry is not open (deleted meanwhile).
    #[error("raft log: segment {} is missing", path.display())]
    MissingSegment {
        /// The segment file.
        path: PathBuf,
    },
    /// An append whose entries are not consecutive or do not follow the log's last entry.
    #[error("raft log: append of entry {first} does not follow entry {last:?}")]
    OutOfOrder {
        /// The append's first entry.
        first: u64,
        /// The log's last entry (`None`: the log is empty).
        last: Option<u64>,
    },
    /// The writer has no segment to append to (a bug: a segment is started before writing).
    #[error("raft log: no active segment")]
    NoActiveSegment,
    /// The log was closed: nothing more can be submitted.
    #[error("raft log closed")]
    Closed,
    /// The writer thread is gone (it stopped, or the log was dropped before the job ran).
    #[error("raft log writer stopped")]
    Stopped,
}

impl LogError {
    /// An input/output error on `path` while doing `op`.
    pub(crate) fn io(path: &Path, op: &'static str, source: io::Error) -> Self {
        LogError::Io {
            path: path.to_path_buf(),
            op,
            source: Arc::new(source),
        }
    }
}

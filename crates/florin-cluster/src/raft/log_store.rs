//! The durable log openraft writes through ([`LogStore`]): entries, the vote, the purge point
//! and the commit point, kept in the `seglog` segment files under the replica's `log/`.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, LogState, RaftLogReader, StorageError,
    Vote,
};
use serde::{Deserialize, Serialize};

use super::error::{sto, StoreError};
use super::snapshot::SNAPSHOT_FILE;
use super::{NodeId, TypeConfig};
use crate::seglog::{self, SegLog};

/// The log's own directory under a replica's directory.
const LOG_DIR: &str = "log";

/// What the log keeps durably besides its entries.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct LogMeta {
    vote: Option<Vote<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

/// The log store openraft writes through: a `SegLog` of encoded entries, with the entries themselves cached in memory.
pub(super) struct LogStore {
    log: SegLog<Entry<TypeConfig>>,
    meta: LogMeta,
    /// The last entry appended (whether or not synced yet), if any is left.
    last: Option<LogId<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

/// A log reader for replication tasks (it keeps working, reading nothing new, once the
/// replica has shut down).
pub(super) struct LogReader {
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
pub(super) fn completion() -> (
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

pub(super) async fn completed(
    rx: tokio::sync::oneshot::Receiver<Result<(), seglog::LogError>>,
) -> Result<(), seglog::LogError> {
    rx.await.map_err(|_| seglog::LogError::Stopped)?
}

impl LogStore {
    /// Opens the log without comparing it with a snapshot (tests of the log alone).
    #[cfg(test)]
    pub(super) fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, None)
    }

    /// Opens the log. `snapshot`, when given, is the last index the replica's snapshot file
    /// holds (`None`: no snapshot): the log must not have been purged past it.
    pub(super) fn open_with(dir: &Path, snapshot: Option<Option<u64>>) -> Result<Self, StoreError> {
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
            tracing::warn!(
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
    pub(super) fn submit(
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

//! The Raft log on disk: append-only segment files, written by one writer thread.
//!
//! Why not an embedded database: a Raft log is written at its end, cut at its end (a follower's
//! conflicting suffix) and dropped at its start (compaction). A B-tree store pays for
//! generality it does not need: with redb the cluster spent a fifth of its CPU laying large
//! entries out in pages, zeroing pages and copying them to the file. Here an entry costs one
//! copy into the file's page cache and a share of one `fdatasync`.
//!
//! Layout of the directory:
//! - `seg-<first index>.log`: records `len u32 ‖ crc32 u32 ‖ index u64 ‖ payload` (little
//!   endian; the CRC covers index and payload), consecutive indexes; a new segment starts once
//!   the current one passes [`Limits::segment_bytes`], or when the log restarts after everything in it
//!   was purged;
//! - `meta.bin`: the caller's durable metadata (vote and purge point), written atomically;
//! - `committed.bin`: the caller's commit point (`len u32 ‖ crc32 u32 ‖ body`), overwritten in
//!   place and never synced (losing it only means re-learning it from the leader); a torn copy
//!   fails its CRC and reads as none; created when the log is first opened, so a log with
//!   segments or metadata but no `committed.bin` is refused;
//! - `synced.bin`: `crc32 u32 ‖ index u64`, the last index synced, overwritten in place after
//!   each sync and before the appends it covers are acknowledged (no sync of its own, so no
//!   extra fsync per append; a truncation that lowers it syncs it);
//! - `LOCK`: held while the log is open, so two processes never write one log.
//!
//! Writes go through a writer thread in submission order. Appends that queue up while a sync
//! is running are written together and synced once (group commit), and each append's callback
//! runs once its records are synced. An entry is readable from the moment its append is
//! submitted: the in-memory cache holds every entry that is not yet synced, and entries leave
//! the cache (oldest first, above a byte budget) only once they are on disk.
//!
//! # Damage and the torn tail
//!
//! [`SegLog::open`] checks everything before it changes anything. It cuts a *torn tail*, and
//! nothing else: damage at the end of the last segment, with no valid record anywhere after
//! it, whose entry can never have been acknowledged. An append is acknowledged (its callback
//! runs, and openraft tells the leader) only after its segment is synced and `synced.bin`
//! names its index; a commit point is written only after the appends before it are synced.
//! So an entry at or below the index in `synced.bin` or `committed.bin` was acknowledged: its
//! damage refuses to open, as does a log that ends before either index (a lost last segment),
//! rather than shortening a log that a leader counted towards a commit. Above both it was
//! never acknowledged by this process. The two files are hints written without a sync, so
//! after a power failure they may name less than was acknowledged; cutting an acknowledged
//! entry then needs that entry's own bytes damaged by the same failure, which a synced record
//! is not (stated in docs/cluster.md, "Damage and recovery").
//!
//! Anything else refuses with [`Damage`], naming the file, the byte and what was expected, and
//! leaves every file as it was: a damaged record followed by a valid one (found by trying every
//! later offset), damage in a segment before the last, an empty segment before the last, a hole
//! between segments (each segment starts where the one before it ends), a log that starts after
//! the purge point or (with [`Bounds::origin`]) not at the origin when nothing was purged, a
//! damaged `meta.bin` or `synced.bin`, a missing `meta.bin` when the log holds more than its
//! first entry, a missing `committed.bin`. A whole last segment with no valid record, past both
//! marks, is a segment created just before a crash and is deleted.
//!
//! # Parts
//!
//! - `format`: the bytes on disk (records, segment names, checked files, `synced.bin`);
//! - `reader`: the in-memory index of where each entry lies, the cache, and reads;
//! - `recovery`: [`SegLog::open`]: scanning and checking everything, cutting a torn tail;
//! - `writer`: the writer thread (group commit, syncs, new segments, truncation, purge);
//! - `error`: [`LogError`] and [`Damage`].

use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

mod error;
mod format;
mod reader;
mod recovery;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
mod writer;

pub(crate) use error::{Damage, LogError};
#[cfg(test)]
use format::frame;
pub(crate) use format::{frame_with, HEADER};
pub(crate) use reader::{Got, Reader};
pub(crate) use recovery::Bounds;
use writer::Job;

/// Sizes of a [`SegLog`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// A segment is closed, and the next append starts a new one, once it reaches this size.
    pub segment_bytes: u64,
    /// Bytes of entries kept in memory once they are on disk (the newest).
    pub cache_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            segment_bytes: 64 << 20,
            cache_bytes: 64 << 20,
        }
    }
}

/// What an append's caller is told once its records are synced (or failed).
pub(crate) type Done = Box<dyn FnOnce(Result<(), LogError>) + Send>;

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A durable, append-only log of opaque records with one writer thread. `T` is the caller's
/// in-memory form of an entry, kept in the cache.
pub(crate) struct SegLog<T> {
    reader: Reader<T>,
    jobs: Option<mpsc::Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

impl<T> Drop for SegLog<T> {
    fn drop(&mut self) {
        // Close the queue, then wait for the writer to finish what was submitted (so a reopen
        // never races a writer still running).
        self.jobs = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl<T: Clone + Send + 'static> SegLog<T> {
    /// A read handle.
    pub(crate) fn reader(&self) -> Reader<T> {
        self.reader.clone()
    }

    fn submit(&self, job: Job) -> Result<(), LogError> {
        self.jobs
            .as_ref()
            .ok_or(LogError::Closed)?
            .send(job)
            .map_err(|_| LogError::Stopped)
    }

    /// Appends entries: `(index, in-memory form, payload)`, consecutive and following the last
    /// one. They are readable when this returns; `done` runs once they are synced.
    #[cfg(test)]
    pub(crate) fn append(
        &self,
        entries: Vec<(u64, T, Vec<u8>)>,
        done: Done,
    ) -> Result<(), LogError> {
        let mut buf = Vec::new();
        let records = entries
            .into_iter()
            .map(|(index, item, payload)| {
                frame(&mut buf, index, &payload);
                (index, item, payload.len() as u32)
            })
            .collect();
        self.append_framed(buf, records, done)
    }

    /// Appends records framed with [`frame_with`] into `buf`; `records` gives each one's index,
    /// in-memory form and payload length. The indexes must be consecutive and follow the log's
    /// last. The entries are readable when this returns; `done` runs once they are synced.
    pub(crate) fn append_framed(
        &self,
        buf: Vec<u8>,
        records: Vec<(u64, T, u32)>,
        done: Done,
    ) -> Result<(), LogError> {
        let Some(first) = records.first().map(|e| e.0) else {
            done(Ok(()));
            return Ok(());
        };
        let mut lens = Vec::with_capacity(records.len());
        {
            let mut sh = lock(&self.reader.shared);
            if let Some(f) = &sh.failed {
                return Err(f.clone());
            }
            if sh.next.is_some_and(|n| n != first)
                || records.windows(2).any(|w| w[1].0 != w[0].0 + 1)
            {
                return Err(LogError::OutOfOrder {
                    first,
                    last: sh.next.map(|n| n.wrapping_sub(1)),
                });
            }
            for (index, item, len) in records {
                lens.push((index, len));
                sh.cache_bytes += len as usize;
                sh.cache.insert(index, (item, len as usize));
                sh.next = Some(index + 1);
            }
        }
        self.submit(Job::Append {
            buf,
            records: lens,
            done,
        })
    }

    /// Removes every entry from `from` on; `done` runs once that is durable. The removed
    /// entries are unreadable from the moment this returns.
    pub(crate) fn truncate(&self, from: u64, done: Done) -> Result<(), LogError> {
        {
            let mut sh = lock(&self.reader.shared);
            let gone: Vec<u64> = sh.cache.range(from..).map(|(i, _)| *i).collect();
            for i in gone {
                if let Some((_, n)) = sh.cache.remove(&i) {
                    sh.cache_bytes -= n;
                }
            }
            let keep = from.saturating_sub(sh.first) as usize;
            sh.locs.truncate(keep);
            // The log still holds an entry before `from` (on disk or queued): appends go on at
            // `from`; otherwise it is empty.
            let holds = !sh.locs.is_empty() || sh.cache.range(..from).next().is_some();
            sh.next = holds.then_some(from);
        }
        self.submit(Job::Truncate { from, done })
    }

    /// Drops every entry up to `upto` after writing `meta` (which must record the purge point)
    /// durably; `done` runs once the metadata is durable.
    pub(crate) fn purge(&self, upto: u64, meta: Vec<u8>, done: Done) -> Result<(), LogError> {
        {
            let mut sh = lock(&self.reader.shared);
            let gone: Vec<u64> = sh.cache.range(..=upto).map(|(i, _)| *i).collect();
            for i in gone {
                if let Some((_, n)) = sh.cache.remove(&i) {
                    sh.cache_bytes -= n;
                }
            }
            while sh.first <= upto && !sh.locs.is_empty() {
                sh.locs.pop_front();
                sh.first += 1;
            }
            if sh.next.is_none_or(|n| n <= upto + 1) {
                // Everything is purged: the next append may start anywhere after it.
                sh.next = None;
                sh.first = upto + 1;
            }
        }
        self.submit(Job::Purge { upto, meta, done })
    }

    /// Writes the caller's metadata durably; `done` runs once it is.
    pub(crate) fn save_meta(&self, meta: Vec<u8>, done: Done) -> Result<(), LogError> {
        self.submit(Job::Meta { meta, done })
    }

    /// Writes the caller's commit point, without syncing.
    pub(crate) fn save_committed(&self, bytes: Vec<u8>) -> Result<(), LogError> {
        self.submit(Job::Committed(bytes))
    }
}

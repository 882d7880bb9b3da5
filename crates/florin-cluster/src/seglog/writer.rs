//! The writer thread: it takes jobs in submission order, writes appends that queue up together
//! and syncs them once (group commit), starts new segments, and carries out truncations,
//! purges and metadata writes.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use florin_fs::sync_dir;

use super::format::{checked, seg_name, synced_bytes, HEADER, META, SYNCED};
use super::reader::{Loc, Shared};
use super::recovery::{scan, Scan};
use super::{lock, Done, Limits, LogError};

/// A job for the writer thread.
pub(super) enum Job {
    Append {
        buf: Vec<u8>,
        /// (index, payload length) of each record in `buf`.
        records: Vec<(u64, u32)>,
        done: Done,
    },
    Truncate {
        from: u64,
        done: Done,
    },
    Purge {
        upto: u64,
        meta: Vec<u8>,
        done: Done,
    },
    Meta {
        meta: Vec<u8>,
        done: Done,
    },
    Committed(Vec<u8>),
}

/// The segment being appended to.
pub(super) struct Active {
    pub(super) first: u64,
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) next: u64,
}

pub(super) struct Writer<T> {
    pub(super) dir: PathBuf,
    pub(super) limits: Limits,
    pub(super) shared: Arc<Mutex<Shared<T>>>,
    pub(super) active: Option<Active>,
    pub(super) committed: File,
    /// `synced.bin`, and the index it holds: the last entry synced (a hint, never synced
    /// itself, except when a truncation lowers it).
    pub(super) synced_file: File,
    pub(super) synced: Option<u64>,
    pub(super) _lock: File,
}

impl<T> Writer<T> {
    pub(super) fn run(&mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            // Everything queued behind it goes in the same round: consecutive appends share
            // one sync.
            let mut round = vec![job];
            round.extend(jobs.try_iter());
            let mut unsynced: Vec<Done> = Vec::new();
            let mut synced_to = None;
            for job in round {
                match job {
                    Job::Append { buf, records, done } => match self.write(&buf, &records) {
                        Ok(()) => {
                            unsynced.push(done);
                            synced_to = records.last().map(|r| r.0).or(synced_to);
                        }
                        Err(e) => {
                            self.fail(&e);
                            done(Err(e));
                        }
                    },
                    other => {
                        self.sync(&mut unsynced, synced_to.take());
                        self.other(other);
                    }
                }
            }
            self.sync(&mut unsynced, synced_to);
        }
        // The queue is closed: everything submitted has been written and synced.
    }

    fn fail(&self, e: &LogError) {
        let mut sh = lock(&self.shared);
        if sh.failed.is_none() {
            sh.failed = Some(e.clone());
        }
    }

    /// Syncs the active segment and tells the appends waiting for it.
    fn sync(&mut self, unsynced: &mut Vec<Done>, synced_to: Option<u64>) {
        if unsynced.is_empty() {
            return;
        }
        let r = match &self.active {
            Some(a) => a.file.sync_data().map_err(|e| self.io(a.first, "sync", e)),
            None => Ok(()),
        };
        if let Err(e) = &r {
            self.fail(e);
        } else if let Some(to) = synced_to {
            // Before anyone hears of the sync: whatever the process acknowledged, this file
            // names (best effort: a stale copy only bounds less).
            if self.synced_file.write_all_at(&synced_bytes(to), 0).is_ok() {
                self.synced = Some(to);
            }
            self.evict(to);
        }
        for done in unsynced.drain(..) {
            done(r.clone());
        }
    }

    /// Drops cached entries that are on disk, oldest first, while the cache is over budget.
    fn evict(&self, synced_to: u64) {
        let mut sh = lock(&self.shared);
        while sh.cache_bytes > self.limits.cache_bytes {
            let Some((&i, _)) = sh.cache.first_key_value() else {
                break;
            };
            if i > synced_to {
                break;
            }
            if let Some((_, n)) = sh.cache.remove(&i) {
                sh.cache_bytes -= n;
            }
        }
    }

    /// An input/output error on the segment that starts at `seg`.
    fn io(&self, seg: u64, op: &'static str, e: io::Error) -> LogError {
        LogError::io(&self.dir.join(seg_name(seg)), op, e)
    }

    /// Starts a new segment whose first entry is `first`; the current one is synced first
    /// (its appends are still waiting for their sync).
    fn roll(&mut self, first: u64) -> Result<(), LogError> {
        if let Some(a) = &self.active {
            a.file
                .sync_data()
                .map_err(|e| self.io(a.first, "sync", e))?;
        }
        let path = self.dir.join(seg_name(first));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)
            .map_err(|e| self.io(first, "create", e))?;
        sync_dir(&self.dir).map_err(|e| LogError::io(&self.dir, "sync the directory", e))?;
        let read = File::open(&path).map_err(|e| self.io(first, "open", e))?;
        lock(&self.shared).files.insert(first, Arc::new(read));
        self.active = Some(Active {
            first,
            file,
            len: 0,
            next: first,
        });
        Ok(())
    }

    fn write(&mut self, buf: &[u8], records: &[(u64, u32)]) -> Result<(), LogError> {
        let Some(&(first, _)) = records.first() else {
            return Ok(());
        };
        let roll = match &self.active {
            Some(a) => a.next != first || a.len >= self.limits.segment_bytes,
            None => true,
        };
        if roll {
            self.roll(first)?;
        }
        let Some(a) = self.active.as_mut() else {
            return Err(LogError::NoActiveSegment);
        };
        let (seg, start) = (a.first, a.len);
        if let Err(e) = a.file.write_all_at(buf, start) {
            return Err(LogError::io(&self.dir.join(seg_name(seg)), "write", e));
        }
        a.len += buf.len() as u64;
        a.next = records.last().map_or(a.next, |r| r.0 + 1);
        let mut sh = lock(&self.shared);
        let mut offset = start;
        for &(index, len) in records {
            if sh.locs.is_empty() {
                sh.first = index;
            }
            // Only if the entry is still wanted (a truncate may already have cut it).
            if sh.first + sh.locs.len() as u64 == index && sh.next.is_some_and(|n| index < n) {
                sh.locs.push_back(Loc { seg, offset, len });
            }
            offset += HEADER as u64 + len as u64;
        }
        Ok(())
    }

    fn other(&mut self, job: Job) {
        match job {
            Job::Append { .. } => {}
            Job::Truncate { from, done } => {
                let r = self.truncate(from);
                if let Err(e) = &r {
                    self.fail(e);
                }
                done(r);
            }
            Job::Purge { upto, meta, done } => {
                let r = self.write_meta(&meta).and_then(|()| self.purge(upto));
                done(r);
            }
            Job::Meta { meta, done } => done(self.write_meta(&meta)),
            Job::Committed(bytes) => {
                if lock(&self.shared).failed.is_some() {
                    // A failed sync: the commit point might name entries not on disk.
                    return;
                }
                let body = checked(&bytes);
                // Best effort: never synced, checked on reading.
                let _ = self.committed.write_all_at(&body, 0);
            }
        }
    }

    fn write_meta(&self, meta: &[u8]) -> Result<(), LogError> {
        let path = self.dir.join(META);
        florin_fs::write_atomic(&path, &[&checked(meta)])
            .map_err(|e| LogError::io(&path, "write", e))
    }

    /// Cuts the log before `from`: later segments are deleted newest first (a crash half way
    /// leaves a shorter log, never a hole), then the segment holding `from` is cut.
    fn truncate(&mut self, from: u64) -> Result<(), LogError> {
        // First lower the synced mark below the cut, durably: otherwise a crash could leave a
        // shorter log than the mark says, which would refuse to open.
        if self.synced.is_some_and(|s| s >= from) {
            let below = from.checked_sub(1);
            let f = &self.synced_file;
            match below {
                Some(b) => f.write_all_at(&synced_bytes(b), 0),
                None => f.set_len(0),
            }
            .and_then(|()| f.sync_all())
            .map_err(|e| LogError::io(&self.dir.join(SYNCED), "lower the synced mark", e))?;
            self.synced = below;
        }
        let mut sh = lock(&self.shared);
        let firsts: Vec<u64> = sh.files.keys().copied().collect();
        let mut deleted = false;
        for &first in firsts.iter().rev() {
            if first < from {
                break;
            }
            sh.files.remove(&first);
            if self.active.as_ref().is_some_and(|a| a.first == first) {
                self.active = None;
            }
            fs::remove_file(self.dir.join(seg_name(first)))
                .map_err(|e| self.io(first, "remove", e))?;
            deleted = true;
        }
        if deleted {
            sync_dir(&self.dir).map_err(|e| LogError::io(&self.dir, "sync the directory", e))?;
        }
        // The segment that holds `from`, if any: cut it at that record.
        let Some((&first, _)) = sh.files.range(..from).next_back() else {
            return Ok(());
        };
        let path = self.dir.join(seg_name(first));
        let file = OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| self.io(first, "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| self.io(first, "stat", e))?
            .len();
        // Where `from` starts: scan the segment's records (truncation is rare).
        let Scan { recs, end, .. } = scan(&path, first).map_err(|e| self.io(first, "read", e))?;
        let cut = recs
            .iter()
            .find(|(i, _)| *i >= from)
            .map_or(end, |(_, l)| l.offset);
        if cut < len {
            file.set_len(cut)
                .map_err(|e| self.io(first, "truncate", e))?;
            file.sync_all().map_err(|e| self.io(first, "sync", e))?;
        }
        let next = recs
            .iter()
            .take_while(|(i, _)| *i < from)
            .last()
            .map_or(first, |(i, _)| i + 1);
        self.active = Some(Active {
            first,
            file,
            len: cut,
            next,
        });
        Ok(())
    }

    /// Deletes the segments whose every entry is at most `upto` (the purge point is durable).
    fn purge(&mut self, upto: u64) -> Result<(), LogError> {
        let mut sh = lock(&self.shared);
        let firsts: Vec<u64> = sh.files.keys().copied().collect();
        for (k, &first) in firsts.iter().enumerate() {
            // A segment ends where the next begins; the active one at its next index.
            let end = match firsts.get(k + 1) {
                Some(next) => *next,
                None => match &self.active {
                    Some(a) if a.first == first => a.next,
                    _ => break,
                },
            };
            if end > upto + 1 {
                break;
            }
            sh.files.remove(&first);
            if self.active.as_ref().is_some_and(|a| a.first == first) {
                self.active = None;
            }
            fs::remove_file(self.dir.join(seg_name(first)))
                .map_err(|e| self.io(first, "remove", e))?;
        }
        Ok(())
    }
}

//! The read side: where every entry lies on disk, the cache of entries in memory (every one not
//! yet synced, and recent ones), shared with the writer, and [`Reader`], which reads from both.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::format::{crc, seg_name, HEADER};
use super::{lock, LogError};

/// Where an entry lies: its segment (by first index), the record's offset and payload length.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loc {
    pub(super) seg: u64,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// An entry as [`Reader::read`] finds it.
pub(crate) enum Got<T> {
    /// Still in memory.
    Cached(T),
    /// Read back from disk: the payload to decode.
    Disk(Vec<u8>),
}

pub(super) struct Shared<T> {
    /// The log's directory (for error messages).
    pub(super) dir: PathBuf,
    /// Where every entry from `first` on lies on disk (set once written, before it is synced).
    pub(super) locs: VecDeque<Loc>,
    pub(super) first: u64,
    /// Entries in memory with their sizes: every entry not yet synced, and recent ones.
    pub(super) cache: BTreeMap<u64, (T, usize)>,
    pub(super) cache_bytes: usize,
    /// The index the next append must have (`None`: the log is empty, any index).
    pub(super) next: Option<u64>,
    /// Read handles of the segments, by first index.
    pub(super) files: BTreeMap<u64, Arc<File>>,
    /// The first write failure: from then on the log refuses to append.
    pub(super) failed: Option<LogError>,
}

impl<T> Shared<T> {
    pub(super) fn loc(&self, index: u64) -> Option<Loc> {
        let k = index.checked_sub(self.first)?;
        self.locs.get(usize::try_from(k).ok()?).copied()
    }
}

/// The read side of a [`super::SegLog`]; cheap to clone, usable after the log is closed.
pub(crate) struct Reader<T> {
    pub(super) shared: Arc<Mutex<Shared<T>>>,
}

impl<T> Clone for Reader<T> {
    fn clone(&self) -> Self {
        Reader {
            shared: self.shared.clone(),
        }
    }
}

impl<T: Clone> Reader<T> {
    /// The entries of `start..end` that the log holds, in order (the log has no holes, so they
    /// are consecutive; the range may begin before its first entry or end after its last).
    pub(crate) fn read(&self, start: u64, end: u64) -> Result<Vec<Got<T>>, LogError> {
        let sh = lock(&self.shared);
        let on_disk = (!sh.locs.is_empty()).then_some(sh.first);
        let in_memory = sh.cache.first_key_value().map(|(i, _)| *i);
        let first = match (on_disk, in_memory) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(f) => f,
                None => return Ok(Vec::new()),
            },
        };
        let mut out = Vec::new();
        for index in start.max(first)..end {
            if let Some((t, _)) = sh.cache.get(&index) {
                out.push(Got::Cached(t.clone()));
                continue;
            }
            let Some(loc) = sh.loc(index) else { break };
            let path = || sh.dir.join(seg_name(loc.seg));
            let file = sh
                .files
                .get(&loc.seg)
                .ok_or_else(|| LogError::MissingSegment { path: path() })?;
            let mut rec = vec![0u8; HEADER + loc.len as usize];
            file.read_exact_at(&mut rec, loc.offset)
                .map_err(|e| LogError::io(&path(), "read", e))?;
            let payload = rec.split_off(HEADER);
            let ok = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) == loc.len
                && u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]) == crc(index, &payload)
                && rec[8..16] == index.to_le_bytes();
            if !ok {
                return Err(LogError::EntryDamaged {
                    path: path(),
                    index,
                });
            }
            out.push(Got::Disk(payload));
        }
        Ok(out)
    }
}

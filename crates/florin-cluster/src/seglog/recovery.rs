//! Opening a log ([`SegLog::open`]): every segment is scanned and every file checked against
//! the others and the caller's [`Bounds`] before anything changes; then a torn tail is cut, and
//! the read side and the writer thread start.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use florin_fs::sync_dir;

use super::format::{
    crc, first_of, le32, le64, seg_name, unframe, COMMITTED, HEADER, LOCK, MAX_RECORD, META, SYNCED,
};
use super::reader::{Loc, Reader, Shared};
use super::writer::{Active, Writer};
use super::{Damage, Limits, LogError, SegLog};

/// What [`SegLog::open`] found on disk.
pub(crate) struct Recovered {
    /// The caller's metadata, as last written.
    pub meta: Option<Vec<u8>>,
    /// The caller's commit point, if a valid copy was found.
    pub committed: Option<Vec<u8>>,
    /// The last entry's index and payload, if the log holds any.
    pub last: Option<(u64, Vec<u8>)>,
    /// Bytes cut from a torn record at the end of the log.
    pub torn_bytes: u64,
}

/// What the caller's own records say about the log, given to [`SegLog::open`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Bounds {
    /// The purge point: the last index dropped from the log's start (entries up to it are
    /// ignored).
    pub purged: Option<u64>,
    /// The commit point, as `committed.bin` holds it: entries up to it were acknowledged.
    pub committed: Option<u64>,
    /// Entries up to this index are held elsewhere (the caller's snapshot): a commit point up
    /// to it needs no log entry.
    pub covered: Option<u64>,
    /// The index the log begins at when nothing was ever purged; and once the log holds an
    /// entry after it, the metadata file must exist. `None`: neither is checked.
    pub origin: Option<u64>,
}

/// A torn append found by [`SegLog::open`], to cut once every check has passed.
struct Torn {
    path: PathBuf,
    /// Where the valid records end.
    end: u64,
    file_len: u64,
    /// No valid record at all: the file goes.
    remove: bool,
}

/// What [`scan`] found in one segment file.
pub(super) struct Scan {
    /// Index and location of each valid record, in order.
    pub(super) recs: Vec<(u64, Loc)>,
    /// Where the valid records end: everything after is torn or damaged.
    pub(super) end: u64,
    /// The file's length.
    pub(super) file_len: u64,
    /// The last valid record's payload (empty if none).
    last_payload: Vec<u8>,
    /// What lies at `end` instead of the next valid record (for error messages).
    found: String,
    /// A valid record somewhere after `end` (its offset and index): then what lies at `end` is
    /// damage, not a torn append.
    resumes: Option<(u64, u64)>,
}

/// Scans one segment file for its valid records.
pub(super) fn scan(path: &Path, first: u64) -> io::Result<Scan> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let mut out: Vec<(u64, Loc)> = Vec::new();
    let mut pos = 0usize;
    let mut last_payload = Vec::new();
    let found = loop {
        let expected = out.last().map_or(first, |(i, _)| i + 1);
        let left = bytes.len() - pos;
        if left == 0 {
            break if bytes.is_empty() {
                "an empty file".to_string()
            } else {
                "the end of the file".to_string()
            };
        }
        if left < HEADER {
            break format!("{left} bytes, less than a {HEADER}-byte record header");
        }
        let h = &bytes[pos..pos + HEADER];
        let (len, sum, index) = (le32(h) as usize, le32(&h[4..]), le64(&h[8..]));
        if len > MAX_RECORD || HEADER + len > left {
            break format!(
                "a header giving a {len}-byte payload with {} bytes left in the file",
                left - HEADER
            );
        }
        let payload = &bytes[pos + HEADER..pos + HEADER + len];
        let computed = crc(index, payload);
        if computed != sum {
            break format!(
                "a record whose checksum reads {sum:#010x} but whose bytes sum to {computed:#010x}"
            );
        }
        if index != expected {
            break format!("a valid record of entry {index}");
        }
        out.push((
            index,
            Loc {
                seg: first,
                offset: pos as u64,
                len: len as u32,
            },
        ));
        last_payload = payload.to_vec();
        pos += HEADER + len;
    };
    let expected = out.last().map_or(first, |(i, _)| i + 1);
    let resumes = (pos < bytes.len())
        .then(|| valid_after(&bytes, pos + 1, expected))
        .flatten();
    Ok(Scan {
        recs: out,
        end: pos as u64,
        file_len: bytes.len() as u64,
        last_payload,
        found,
        resumes,
    })
}

/// The first valid record at or after byte `from` whose index is `expected` or later (as the
/// records after a damaged one would be): its offset and index.
fn valid_after(bytes: &[u8], from: usize, expected: u64) -> Option<(u64, u64)> {
    let most = (bytes.len() / HEADER) as u64 + 1;
    let mut p = from;
    while p + HEADER <= bytes.len() {
        let h = &bytes[p..p + HEADER];
        let (len, index) = (le32(h) as usize, le64(&h[8..]));
        let fits = len <= bytes.len() - p - HEADER;
        if fits
            && index.checked_sub(expected).is_some_and(|d| d <= most)
            && crc(index, &bytes[p + HEADER..p + HEADER + len]) == le32(&h[4..])
        {
            return Some((p as u64, index));
        }
        p += 1;
    }
    None
}

/// Reads `synced.bin`: `None` if it is missing, empty or all zeros (created, or extended by a
/// crash before its first write reached the disk), the index if it is whole.
pub(super) fn read_synced(path: &Path) -> Result<Option<u64>, LogError> {
    let b = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LogError::io(path, "read", e)),
    };
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    if b.len() != 12 {
        return Err(Damage::new(
            path.to_path_buf(),
            0,
            "12 bytes (checksum, index)",
            format!("a file of {} bytes", b.len()),
        )
        .into());
    }
    let (sum, index) = (le32(&b), le64(&b[4..]));
    let computed = crc32fast::hash(&b[4..]);
    if computed != sum {
        return Err(Damage::new(
            path.to_path_buf(),
            0,
            format!("the checksum {computed:#010x} of the index that follows"),
            format!("{sum:#010x}"),
        )
        .into());
    }
    Ok(Some(index))
}

/// Reads a file, `None` if it does not exist.
fn read_opt(path: &Path) -> Result<Option<Vec<u8>>, LogError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(LogError::io(path, "read", e)),
    }
}

/// Maps an input/output error on `path` while doing `op` to a [`LogError`].
fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> LogError + 'a {
    move |e| LogError::io(path, op, e)
}

/// Takes the directory's lock, waiting briefly for a log closed a moment ago.
fn take_lock(dir: &Path) -> Result<File, LogError> {
    let path = dir.join(LOCK);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| LogError::io(&path, "open", e))?;
    for _ in 0..40 {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(50)),
            Err(TryLockError::Error(e)) => return Err(LogError::io(&path, "lock", e)),
        }
    }
    Err(LogError::Locked {
        dir: dir.to_path_buf(),
    })
}

impl<T: Clone + Send + 'static> SegLog<T> {
    /// Opens (or creates) the log in `dir`. `bounds_of` reads the caller's metadata and commit
    /// point (the bodies of `meta.bin` and `committed.bin`, if whole) into [`Bounds`].
    ///
    /// Everything is checked before anything is changed: a torn append at the end of the last
    /// segment that was never acknowledged is cut; any other damage, hole or missing file
    /// refuses with [`LogError::Damaged`] and leaves the directory as it was.
    pub(crate) fn open(
        dir: &Path,
        limits: Limits,
        bounds_of: impl FnOnce(Option<&[u8]>, Option<&[u8]>) -> Result<Bounds, LogError>,
    ) -> Result<(SegLog<T>, Recovered), LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir, "create the directory"))?;
        let lock_file = take_lock(dir)?;
        let meta_path = dir.join(META);
        let meta = match read_opt(&meta_path)? {
            Some(b) => Some(unframe(&b).map_err(|(offset, expected, found)| {
                Damage::new(meta_path.clone(), offset, expected, found)
            })?),
            None => None,
        };
        let committed_path = dir.join(COMMITTED);
        let committed_file = read_opt(&committed_path)?;
        // Written in place without a sync: a torn copy is a crash's doing and reads as none.
        let committed = committed_file.as_deref().and_then(|b| unframe(b).ok());
        let synced_path = dir.join(SYNCED);
        let synced = read_synced(&synced_path)?;
        let bounds = bounds_of(meta.as_deref(), committed.as_deref())?;
        let purged = bounds.purged;
        // Entries up to here were acknowledged: they may never be cut.
        let acked = [(synced, SYNCED), (bounds.committed, COMMITTED)]
            .into_iter()
            .filter_map(|(b, name)| b.map(|b| (b, name)))
            .max();

        let mut firsts: Vec<u64> = fs::read_dir(dir)
            .map_err(io_err(dir, "list the directory"))?
            .filter_map(|e| e.ok())
            .filter_map(|e| first_of(&e.file_name().to_string_lossy()))
            .collect();
        firsts.sort_unstable();
        let mut segs = Vec::with_capacity(firsts.len());
        let mut torn = None;
        for (k, &first) in firsts.iter().enumerate() {
            let path = dir.join(seg_name(first));
            let s = scan(&path, first).map_err(io_err(&path, "read"))?;
            let at = s.recs.last().map_or(first, |(i, _)| i + 1);
            if s.end < s.file_len || s.recs.is_empty() {
                if k + 1 < firsts.len() {
                    return Err(Damage::new(
                        path,
                        s.end,
                        format!("entry {at} (segments before the last hold only whole records)"),
                        s.found,
                    )
                    .into());
                }
                if let Some((offset, index)) = s.resumes {
                    return Err(Damage::new(
                        path,
                        s.end,
                        format!("entry {at}"),
                        format!(
                            "{}, and a valid record of entry {index} at byte {offset} after it \
                             (not a torn append)",
                            s.found
                        ),
                    )
                    .into());
                }
                if let Some((a, name)) = acked.filter(|(a, _)| at <= *a) {
                    return Err(Damage::new(
                        path,
                        s.end,
                        format!("entry {at}, acknowledged ({name} records entries up to {a})"),
                        s.found,
                    )
                    .into());
                }
                torn = Some(Torn {
                    path: path.clone(),
                    end: s.end,
                    file_len: s.file_len,
                    remove: s.recs.is_empty(),
                });
            }
            segs.push((first, path, s));
        }
        // A segment starts where the one before it ends (unless the entries between are purged).
        for w in segs.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            let a_last = a.2.recs.last().map_or(a.0, |(i, _)| *i);
            let need = b.0.saturating_sub(1);
            if purged.is_none_or(|p| need > p) && a_last != need {
                return Err(Damage::new(
                    dir.join(seg_name(a_last + 1)),
                    0,
                    format!(
                        "a segment from entry {} (the one before ends there)",
                        a_last + 1
                    ),
                    format!(
                        "the next segment starts at entry {}: a hole in the log",
                        b.0
                    ),
                )
                .into());
            }
        }
        let mut all: Vec<(u64, Loc)> = Vec::new();
        let mut files = BTreeMap::new();
        let mut last = None;
        let mut active = None;
        let mut end_of = (dir.join(seg_name(0)), 0);
        for (first, path, s) in segs {
            if s.recs.is_empty() {
                continue;
            }
            if let Some((i, _)) = s.recs.last() {
                last = Some((*i, s.last_payload));
                active = Some((first, s.end, i + 1));
            }
            end_of = (path, s.end);
            files.insert(first, ());
            all.extend(s.recs);
        }
        all.retain(|(i, _)| purged.is_none_or(|p| *i > p));
        let last = last.filter(|(i, _)| purged.is_none_or(|p| *i > p));
        if let Some(w) = all.windows(2).find(|w| w[1].0 != w[0].0 + 1) {
            return Err(Damage::new(
                dir.join(seg_name(w[0].0 + 1)),
                0,
                format!("entry {}", w[0].0 + 1),
                format!("entry {}: a hole in the log", w[1].0),
            )
            .into());
        }
        let first_kept = all.first().map(|(i, _)| *i);
        if let (Some(p), Some(i)) = (purged, first_kept) {
            if i != p + 1 {
                return Err(Damage::new(
                    dir.join(seg_name(p + 1)),
                    0,
                    format!("a segment holding entry {} (the purge point is {p})", p + 1),
                    format!("the log starts at entry {i}"),
                )
                .into());
            }
        }
        if let Some(o) = bounds.origin {
            if let (None, Some(i)) = (purged, first_kept) {
                if i != o {
                    return Err(Damage::new(
                        dir.join(seg_name(o)),
                        0,
                        format!("the first segment, from entry {o} (nothing was purged)"),
                        format!("the log starts at entry {i}"),
                    )
                    .into());
                }
            }
            if let (None, Some((l, _))) = (&meta, &last) {
                if *l > o {
                    return Err(Damage::new(
                        meta_path,
                        0,
                        format!("the caller's metadata (the log holds entries up to {l})"),
                        "no file",
                    )
                    .into());
                }
            }
        }
        // The log (with the purge point and the snapshot) reaches everything acknowledged.
        let reach = [last.as_ref().map(|l| l.0), purged, bounds.covered]
            .into_iter()
            .flatten()
            .max();
        for (bound, name, what) in [
            (synced, SYNCED, "synced"),
            (bounds.committed, COMMITTED, "committed"),
        ] {
            if let Some(b) = bound.filter(|b| reach.is_none_or(|r| r < *b)) {
                return Err(Damage::new(
                    end_of.0,
                    end_of.1,
                    format!("entries up to {b} ({name} records them as {what})"),
                    match reach {
                        Some(r) => format!("the end of the log at entry {r}"),
                        None => "no entry at all".into(),
                    },
                )
                .into());
            }
        }
        if committed_file.is_none() && (!firsts.is_empty() || meta.is_some()) {
            return Err(Damage::new(
                committed_path,
                0,
                "the commit point file (created when the log was first opened)",
                "no file",
            )
            .into());
        }

        // Every check passed: only now is anything changed.
        let mut torn_bytes = 0;
        if let Some(t) = torn {
            if t.remove {
                // Created just before a crash, before its first record was synced.
                fs::remove_file(&t.path).map_err(io_err(&t.path, "remove"))?;
                sync_dir(dir).map_err(io_err(dir, "sync the directory"))?;
            } else {
                // A torn append: the process died before it was synced and acknowledged.
                let f = OpenOptions::new()
                    .write(true)
                    .open(&t.path)
                    .map_err(io_err(&t.path, "open"))?;
                f.set_len(t.end)
                    .map_err(io_err(&t.path, "cut the torn tail"))?;
                f.sync_all().map_err(io_err(&t.path, "sync"))?;
            }
            torn_bytes = t.file_len - t.end;
        }
        let mut handles = BTreeMap::new();
        for first in files.into_keys() {
            let path = dir.join(seg_name(first));
            let file = File::open(&path).map_err(io_err(&path, "open"))?;
            handles.insert(first, Arc::new(file));
        }
        let shared = Shared {
            dir: dir.to_path_buf(),
            first: all.first().map_or(0, |(i, _)| *i),
            next: last.as_ref().map(|(i, _)| i + 1),
            locs: all.into_iter().map(|(_, l)| l).collect(),
            cache: BTreeMap::new(),
            cache_bytes: 0,
            files: handles,
            failed: None,
        };
        let shared = Arc::new(Mutex::new(shared));
        let active = match active {
            Some((first, len, next)) => {
                let path = dir.join(seg_name(first));
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_err(&path, "open"))?;
                Some(Active {
                    first,
                    file,
                    len,
                    next,
                })
            }
            None => None,
        };
        let open_rw = |path: &Path| {
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(path)
                .map_err(io_err(path, "open"))
        };
        let committed_file = open_rw(&committed_path)?;
        let synced_file = open_rw(&synced_path)?;
        let (tx, rx) = mpsc::channel();
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            limits,
            shared: shared.clone(),
            active,
            committed: committed_file,
            synced_file,
            synced,
            _lock: lock_file,
        };
        let handle = std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || writer.run(rx))
            .map_err(io_err(dir, "start the writer thread"))?;
        Ok((
            SegLog {
                reader: Reader { shared },
                jobs: Some(tx),
                writer: Some(handle),
            },
            Recovered {
                meta,
                committed,
                last,
                torn_bytes,
            },
        ))
    }
}

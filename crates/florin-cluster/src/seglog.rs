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

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

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
/// Largest record payload accepted when reading.
const MAX_RECORD: usize = 1 << 30;
/// Bytes of a record before its payload.
pub(crate) const HEADER: usize = 16;
const META: &str = "meta.bin";
const COMMITTED: &str = "committed.bin";
const SYNCED: &str = "synced.bin";
const LOCK: &str = "LOCK";

/// What an append's caller is told once its records are synced (or failed).
pub(crate) type Done = Box<dyn FnOnce(Result<(), LogError>) + Send>;

fn seg_name(first: u64) -> String {
    format!("seg-{first:020}.log")
}

fn first_of(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

fn crc(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

use florin_fs::sync_dir;

/// Appends one framed record (`index`, `payload`) to `buf`.
#[cfg(test)]
fn frame(buf: &mut Vec<u8>, index: u64, payload: &[u8]) {
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(&crc(index, payload).to_le_bytes());
    buf.extend_from_slice(&index.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// Frames a record whose payload `encode` appends to `buf` (no intermediate copy).
pub(crate) fn frame_with<E>(
    buf: &mut Vec<u8>,
    index: u64,
    encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<(), E> {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER]);
    encode(buf)?;
    let len = (buf.len() - start - HEADER) as u32;
    let sum = crc(index, &buf[start + HEADER..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&sum.to_le_bytes());
    buf[start + 8..start + 16].copy_from_slice(&index.to_le_bytes());
    Ok(())
}

/// Where an entry lies: its segment (by first index), the record's offset and payload length.
#[derive(Debug, Clone, Copy)]
struct Loc {
    seg: u64,
    offset: u64,
    len: u32,
}

/// An entry as [`SegLog::read`] finds it.
pub(crate) enum Got<T> {
    /// Still in memory.
    Cached(T),
    /// Read back from disk: the payload to decode.
    Disk(Vec<u8>),
}

struct Shared<T> {
    /// The log's directory (for error messages).
    dir: PathBuf,
    /// Where every entry from `first` on lies on disk (set once written, before it is synced).
    locs: VecDeque<Loc>,
    first: u64,
    /// Entries in memory with their sizes: every entry not yet synced, and recent ones.
    cache: BTreeMap<u64, (T, usize)>,
    cache_bytes: usize,
    /// The index the next append must have (`None`: the log is empty, any index).
    next: Option<u64>,
    /// Read handles of the segments, by first index.
    files: BTreeMap<u64, Arc<File>>,
    /// The first write failure: from then on the log refuses to append.
    failed: Option<LogError>,
}

impl<T> Shared<T> {
    fn loc(&self, index: u64) -> Option<Loc> {
        let k = index.checked_sub(self.first)?;
        self.locs.get(usize::try_from(k).ok()?).copied()
    }
}

/// The read side of a [`SegLog`]; cheap to clone, usable after the log is closed.
pub(crate) struct Reader<T> {
    shared: Arc<Mutex<Shared<T>>>,
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

enum Job {
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
    /// [`SegLog::open`], which then changes nothing).
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
struct Scan {
    /// Index and location of each valid record, in order.
    recs: Vec<(u64, Loc)>,
    /// Where the valid records end: everything after is torn or damaged.
    end: u64,
    /// The file's length.
    file_len: u64,
    /// The last valid record's payload (empty if none).
    last_payload: Vec<u8>,
    /// What lies at `end` instead of the next valid record (for error messages).
    found: String,
    /// A valid record somewhere after `end` (its offset and index): then what lies at `end` is
    /// damage, not a torn append.
    resumes: Option<(u64, u64)>,
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Scans one segment file for its valid records.
fn scan(path: &Path, first: u64) -> io::Result<Scan> {
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

/// The body of a `len ‖ crc32 ‖ body` file, or where and how it is damaged: (offset, expected,
/// found).
fn unframe(bytes: &[u8]) -> Result<Vec<u8>, (u64, String, String)> {
    if bytes.len() < 8 {
        return Err((
            0,
            "an 8-byte header (length, checksum)".into(),
            format!("a file of {} bytes", bytes.len()),
        ));
    }
    let len = le32(bytes) as usize;
    let sum = le32(&bytes[4..]);
    let Some(body) = bytes.get(8..8 + len) else {
        return Err((
            bytes.len() as u64,
            format!("{} bytes (the header gives a {len}-byte body)", 8 + len),
            format!("a file of {} bytes", bytes.len()),
        ));
    };
    let computed = crc32fast::hash(body);
    if computed != sum {
        return Err((
            8,
            format!("a body summing to the checksum {sum:#010x}"),
            format!("one summing to {computed:#010x}"),
        ));
    }
    Ok(body.to_vec())
}

fn checked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The contents of `synced.bin`: `crc32 ‖ index u64`, the last index synced.
fn synced_bytes(index: u64) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&crc32fast::hash(&index.to_le_bytes()).to_le_bytes());
    b[4..].copy_from_slice(&index.to_le_bytes());
    b
}

/// Reads `synced.bin`: `None` if it is missing, empty or all zeros (created, or extended by a
/// crash before its first write reached the disk), the index if it is whole.
fn read_synced(path: &Path) -> Result<Option<u64>, LogError> {
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

/// The segment being appended to.
struct Active {
    first: u64,
    file: File,
    len: u64,
    next: u64,
}

struct Writer<T> {
    dir: PathBuf,
    limits: Limits,
    shared: Arc<Mutex<Shared<T>>>,
    active: Option<Active>,
    committed: File,
    /// `synced.bin`, and the index it holds: the last entry synced (a hint, never synced
    /// itself, except when a truncation lowers it).
    synced_file: File,
    synced: Option<u64>,
    _lock: File,
}

impl<T> Writer<T> {
    fn run(&mut self, jobs: mpsc::Receiver<Job>) {
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::Write;

    type Log = SegLog<u64>;

    /// Small segments and a small cache, so tests cross segment boundaries and read from disk.
    const SMALL: Limits = Limits {
        segment_bytes: 2000,
        cache_bytes: 3000,
    };

    fn purged_of(meta: Option<&[u8]>) -> Option<u64> {
        meta.map(|m| u64::from_le_bytes(m[..8].try_into().unwrap()))
    }

    /// The purge point from the metadata (a `u64`), the commit point from `committed.bin` (a
    /// `u64`).
    fn bounds(meta: Option<&[u8]>, committed: Option<&[u8]>) -> Result<Bounds, LogError> {
        Ok(Bounds {
            purged: purged_of(meta),
            committed: committed
                .and_then(|c| c.get(..8))
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
            ..Bounds::default()
        })
    }

    fn open(dir: &Path) -> (Log, Recovered) {
        SegLog::open(dir, SMALL, bounds).unwrap()
    }

    fn payload(i: u64) -> Vec<u8> {
        let n = (i % 7) as usize * 100 + 10;
        vec![(i % 251) as u8; n]
    }

    fn wait(f: impl FnOnce(Done) -> Result<(), LogError>) {
        let (tx, rx) = mpsc::channel();
        f(Box::new(move |r| tx.send(r).unwrap())).unwrap();
        rx.recv().unwrap().unwrap();
    }

    /// Appends (one append per entry, so segments roll) and waits for the syncs.
    fn append(log: &Log, range: std::ops::Range<u64>) {
        for i in range {
            wait(|d| log.append(vec![(i, i, payload(i))], d));
        }
    }

    /// Every entry in `range` reads back (from memory or disk) with its payload, and nothing
    /// after it.
    fn check(log: &Log, range: std::ops::Range<u64>) {
        let got = log.reader().read(range.start, range.end + 5).unwrap();
        assert_eq!(got.len() as u64, range.end - range.start);
        for (i, g) in range.zip(got) {
            match g {
                Got::Cached(v) => assert_eq!(v, i),
                Got::Disk(p) => assert_eq!(p, payload(i)),
            }
        }
    }

    fn segments(dir: &Path) -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| first_of(&e.unwrap().file_name().to_string_lossy()))
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn append_read_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (log, rec) = open(dir.path());
        assert!(rec.last.is_none() && rec.meta.is_none());
        append(&log, 1..40);
        // Several entries in one append.
        wait(|d| log.append((40..45).map(|i| (i, i, payload(i))).collect(), d));
        check(&log, 1..45);
        assert!(segments(dir.path()).len() > 3);
        // Old entries were read back from disk.
        assert!(matches!(log.reader().read(1, 2).unwrap()[0], Got::Disk(_)));
        // Not contiguous: refused, nothing changes.
        assert!(log
            .append(vec![(60, 60, payload(60))], Box::new(|_| {}))
            .is_err());
        log.save_committed(b"c42".to_vec()).unwrap();
        drop(log);
        let (log, rec) = open(dir.path());
        assert_eq!(rec.last.as_ref().map(|l| l.0), Some(44));
        assert_eq!(rec.last.unwrap().1, payload(44));
        assert_eq!(rec.committed.as_deref(), Some(&b"c42"[..]));
        check(&log, 1..45);
        append(&log, 45..60);
        check(&log, 1..60);
    }

    #[test]
    fn torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..10);
        drop(log);
        let last = *segments(dir.path()).last().unwrap();
        let seg = dir.path().join(seg_name(last));
        // A torn append: half a record at the end.
        let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
        let mut half = Vec::new();
        frame(&mut half, 10, &payload(10));
        f.write_all(&half[..half.len() / 2]).unwrap();
        drop(f);
        let (log, rec) = open(dir.path());
        assert_eq!(rec.torn_bytes, (half.len() / 2) as u64);
        assert_eq!(rec.last.map(|l| l.0), Some(9));
        append(&log, 10..12);
        check(&log, 1..12);
        drop(log);
        // A segment created just before a crash, with nothing synced in it, is dropped.
        fs::write(dir.path().join(seg_name(12)), b"").unwrap();
        let (log, rec) = open(dir.path());
        assert_eq!(rec.last.map(|l| l.0), Some(11));
        append(&log, 12..14);
        check(&log, 1..14);
    }

    #[test]
    fn damage_before_the_last_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..20);
        drop(log);
        let first = segments(dir.path())[0];
        let path = dir.path().join(seg_name(first));
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEADER + 1] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let Err(e) = SegLog::<u64>::open(dir.path(), SMALL, bounds) else {
            panic!("a damaged segment before the last must be refused");
        };
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    #[test]
    fn a_hole_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Vec::new();
        frame(&mut a, 1, &payload(1));
        fs::write(dir.path().join(seg_name(1)), &a).unwrap();
        let mut b = Vec::new();
        frame(&mut b, 3, &payload(3));
        fs::write(dir.path().join(seg_name(3)), &b).unwrap();
        let Err(e) = SegLog::<u64>::open(dir.path(), SMALL, bounds) else {
            panic!("a hole must be refused");
        };
        assert!(e.to_string().contains("hole"), "{e}");
        // Unless the entries before it are purged.
        fs::write(dir.path().join(META), checked(&2u64.to_le_bytes())).unwrap();
        fs::write(dir.path().join(COMMITTED), b"").unwrap();
        let (log, rec) = open(dir.path());
        assert_eq!(rec.last.map(|l| l.0), Some(3));
        assert!(log.reader().read(1, 3).unwrap().is_empty());
        assert_eq!(log.reader().read(3, 4).unwrap().len(), 1);
    }

    #[test]
    fn truncate_across_segments_then_append() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..40);
        let before = segments(dir.path());
        assert!(before.len() > 3);
        wait(|d| log.truncate(15, d));
        assert!(log.reader().read(15, 16).unwrap().is_empty());
        check(&log, 1..15);
        assert!(segments(dir.path()).iter().all(|s| *s < 15));
        append(&log, 15..18);
        check(&log, 1..18);
        drop(log);
        let (log, rec) = open(dir.path());
        assert_eq!(rec.last.map(|l| l.0), Some(17));
        check(&log, 1..18);
        // Truncating everything empties the log; any index may follow.
        wait(|d| log.truncate(1, d));
        assert!(segments(dir.path()).is_empty());
        check(&log, 1..1);
        append(&log, 7..9);
        check(&log, 7..9);
    }

    #[test]
    fn truncate_of_entries_still_queued() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..5);
        // Submitted, and cut before the writer gets to them.
        log.append(
            (5..9).map(|i| (i, i, payload(i))).collect(),
            Box::new(|_| {}),
        )
        .unwrap();
        wait(|d| log.truncate(7, d));
        check(&log, 1..7);
        append(&log, 7..9);
        check(&log, 1..9);
        drop(log);
        let (log, _) = open(dir.path());
        check(&log, 1..9);
    }

    #[test]
    fn purge_drops_segments_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..30);
        wait(|d| log.purge(14, 14u64.to_le_bytes().to_vec(), d));
        assert!(log.reader().read(1, 15).unwrap().is_empty());
        check(&log, 15..30);
        assert!(segments(dir.path())[0] <= 15);
        assert!(segments(dir.path())[0] > 1);
        // Everything purged (a snapshot installed far ahead): the log restarts after it.
        wait(|d| log.purge(100, 100u64.to_le_bytes().to_vec(), d));
        append(&log, 101..105);
        check(&log, 101..105);
        drop(log);
        let (log, rec) = open(dir.path());
        assert_eq!(purged_of(rec.meta.as_deref()), Some(100));
        assert_eq!(rec.last.map(|l| l.0), Some(104));
        check(&log, 101..105);
        assert!(segments(dir.path()).iter().all(|s| *s >= 101));
        // Everything purged and nothing after it: reopening gives an empty log.
        wait(|d| log.purge(104, 104u64.to_le_bytes().to_vec(), d));
        drop(log);
        let (log, rec) = open(dir.path());
        assert!(rec.last.is_none());
        append(&log, 105..107);
        check(&log, 105..107);
    }

    #[test]
    fn entries_leave_the_cache_only_once_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        append(&log, 1..30);
        let got = log.reader().read(1, 30).unwrap();
        assert_eq!(got.len(), 29);
        // The oldest come from disk, the newest from memory.
        assert!(matches!(got[0], Got::Disk(_)));
        assert!(matches!(got[28], Got::Cached(29)));
        let cached = lock(&log.reader.shared).cache_bytes;
        assert!(cached <= SMALL.cache_bytes, "{cached}");
    }

    #[test]
    fn a_second_open_of_one_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, _) = open(dir.path());
        let Err(e) = SegLog::<u64>::open(dir.path(), SMALL, bounds) else {
            panic!("two writers on one log");
        };
        assert!(e.to_string().contains("in use"), "{e}");
        assert!(matches!(e, LogError::Locked { .. }), "{e:?}");
    }

    #[test]
    fn errors_name_the_file_and_keep_their_source() {
        use std::error::Error as _;
        let path = Path::new("/x/seg-00000000000000000001.log");
        let e = LogError::io(path, "sync", io::Error::other("disk on fire"));
        let text = e.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains("sync") && text.contains("disk on fire"),
            "{text}"
        );
        assert_eq!(
            e.source().map(|s| s.to_string()).as_deref(),
            Some("disk on fire")
        );
        // Shared by every append that waited for the failed sync.
        assert_eq!(e.clone().to_string(), text);
        let e = LogError::OutOfOrder {
            first: 3,
            last: Some(1),
        };
        assert_eq!(
            e.to_string(),
            "raft log: append of entry 3 does not follow entry Some(1)"
        );
    }

    #[test]
    fn meta_is_durable_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = open(dir.path());
        wait(|d| log.save_meta(9u64.to_le_bytes().to_vec(), d));
        drop(log);
        let (log, rec) = open(dir.path());
        assert_eq!(rec.meta.as_deref(), Some(&9u64.to_le_bytes()[..]));
        drop(log);
        let mut bytes = fs::read(dir.path().join(META)).unwrap();
        bytes[9] ^= 1;
        fs::write(dir.path().join(META), bytes).unwrap();
        let Err(e) = SegLog::<u64>::open(dir.path(), SMALL, bounds) else {
            panic!("damaged metadata must be refused");
        };
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    // ------------------------------------------------ crash and corruption

    /// Segments of two or three records, read back from disk.
    const TINY: Limits = Limits {
        segment_bytes: 700,
        cache_bytes: 0,
    };

    /// As [`bounds`], and the log begins at entry 1 with its metadata written before it.
    fn strict(meta: Option<&[u8]>, committed: Option<&[u8]>) -> Result<Bounds, LogError> {
        Ok(Bounds {
            origin: Some(1),
            ..bounds(meta, committed)?
        })
    }

    /// Every file of `dir` and its bytes.
    fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, fs::read(e.path()).unwrap())
            })
            .collect()
    }

    fn restore(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
        for e in fs::read_dir(dir).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
        for (name, bytes) in files {
            fs::write(dir.join(name), bytes).unwrap();
        }
    }

    /// The matrix's log: entries `1..=n` in several segments, the metadata (purge point 0),
    /// and a commit point of 5.
    fn build(dir: &Path, n: u64) {
        let (log, _) = SegLog::<u64>::open(dir, TINY, strict).unwrap();
        wait(|d| log.save_meta(0u64.to_le_bytes().to_vec(), d));
        append(&log, 1..n + 1);
        log.save_committed(5u64.to_le_bytes().to_vec()).unwrap();
        drop(log);
        assert!(segments(dir).len() >= 4, "{:?}", segments(dir));
    }

    /// Each segment (by first index) with its records: (index, offset, length in bytes).
    /// A segment's first index and its records: (index, offset, length in bytes).
    type Layout = (u64, Vec<(u64, usize, usize)>);

    fn layout(dir: &Path) -> Vec<Layout> {
        segments(dir)
            .into_iter()
            .map(|first| {
                let s = scan(&dir.join(seg_name(first)), first).unwrap();
                assert_eq!(s.end, s.file_len);
                let recs = s
                    .recs
                    .iter()
                    .map(|(i, l)| (*i, l.offset as usize, HEADER + l.len as usize))
                    .collect();
                (first, recs)
            })
            .collect()
    }

    /// Opens the damaged log in `dir`, whose entries `1..=n` were all appended and whose
    /// entries up to `acked` were acknowledged. Either it opens holding exactly `1..=m` with
    /// their payloads, `m >= acked` (returned), or it refuses with damage naming a file in
    /// `dir` (returned) and the directory is byte for byte as it was.
    fn attempt(dir: &Path, n: u64, acked: u64) -> Result<u64, Damage> {
        let before = contents(dir);
        match SegLog::<u64>::open(dir, TINY, strict) {
            Err(LogError::Damaged(d)) => {
                assert_eq!(
                    contents(dir),
                    before,
                    "a refusal changed the directory: {d}"
                );
                assert!(d.path.starts_with(dir), "{d}");
                assert!(d.to_string().contains(&format!("byte {}", d.offset)), "{d}");
                Err(d)
            }
            Err(e) => panic!("not a damage error: {e}"),
            Ok((log, rec)) => {
                let got = log.reader().read(0, u64::MAX).unwrap();
                let m = got.len() as u64;
                assert!(m >= acked, "acknowledged entries lost: {m} < {acked}");
                assert!(m <= n);
                assert_eq!(rec.last.as_ref().map(|l| l.0), (m > 0).then_some(m));
                for (i, g) in (1..).zip(got) {
                    match g {
                        Got::Disk(p) => assert_eq!(p, payload(i), "entry {i} differs"),
                        Got::Cached(_) => panic!("nothing is cached after opening"),
                    }
                }
                // The log goes on, and reopens.
                append(&log, m + 1..m + 3);
                drop(log);
                let (log, _) = SegLog::<u64>::open(dir, TINY, strict).unwrap();
                check(&log, 1..m + 3);
                Ok(m)
            }
        }
    }

    #[test]
    fn crash_and_corruption_matrix() {
        let n = 14;
        let base = tempfile::tempdir().unwrap();
        build(base.path(), n);
        let pristine = contents(base.path());
        let segs = layout(base.path());
        let last_first = segs.last().unwrap().0;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let mut cases = 0;
        // All of the log acknowledged (as written), or only up to the last segment (a crash
        // after its records were written, before they were synced: `synced.bin` still names
        // the earlier point).
        for acked in [n, last_first - 1] {
            let mut start = pristine.clone();
            start.insert(SYNCED.into(), synced_bytes(acked).to_vec());
            // Truncation at and inside every record of the last segment, and inside a record
            // of every other segment.
            for (k, (first, recs)) in segs.iter().enumerate() {
                let is_last = k + 1 == segs.len();
                let name = seg_name(*first);
                for &(index, off, len) in recs {
                    let cuts: &[usize] = if is_last {
                        &[0, 1, HEADER - 1, HEADER, len - 1]
                    } else {
                        &[HEADER + 1]
                    };
                    for &c in cuts {
                        restore(dir, &start);
                        let f = OpenOptions::new()
                            .write(true)
                            .open(dir.join(&name))
                            .unwrap();
                        f.set_len((off + c) as u64).unwrap();
                        drop(f);
                        let r = attempt(dir, n, acked);
                        cases += 1;
                        match r {
                            Ok(m) => {
                                // Only a torn tail past the acknowledged point is cut, and
                                // exactly the entries before it survive.
                                assert!(is_last && index > acked, "{name} cut at {c} of {index}");
                                assert_eq!(m, index - 1);
                            }
                            Err(d) => {
                                assert!(!is_last || index <= acked, "{name}: {d}");
                                if c > 0 {
                                    assert_eq!(d.path, dir.join(&name), "{d}");
                                }
                            }
                        }
                    }
                }
            }
            // A byte changed in every region of every record of every segment: length,
            // checksum, index, the payload's first and last bytes.
            for (k, (first, recs)) in segs.iter().enumerate() {
                let is_last = k + 1 == segs.len();
                let name = seg_name(*first);
                for (r, &(index, off, len)) in recs.iter().enumerate() {
                    let last_record = is_last && r + 1 == recs.len();
                    for at in [0, 3, 4, 7, 8, 15, HEADER, len - 1] {
                        for flip in [0x01u8, 0x80] {
                            restore(dir, &start);
                            let mut bytes = start[&name].clone();
                            bytes[off + at] ^= flip;
                            fs::write(dir.join(&name), &bytes).unwrap();
                            cases += 1;
                            match attempt(dir, n, acked) {
                                Ok(m) => {
                                    assert!(last_record && index > acked, "{name} byte {at}");
                                    assert_eq!(m, index - 1);
                                }
                                Err(d) => {
                                    assert!(!last_record || index <= acked, "{d}");
                                    assert_eq!(d.path, dir.join(&name), "{d}");
                                    assert_eq!(d.offset, off as u64, "{d}");
                                }
                            }
                        }
                    }
                }
            }
            // Every file deleted, and emptied.
            for name in start.keys().filter(|f| *f != LOCK) {
                for delete in [true, false] {
                    restore(dir, &start);
                    if delete {
                        fs::remove_file(dir.join(name)).unwrap();
                    } else {
                        fs::write(dir.join(name), b"").unwrap();
                    }
                    cases += 1;
                    let r = attempt(dir, n, acked);
                    let last_seg = *name == seg_name(last_first);
                    let hint = [SYNCED, COMMITTED].contains(&name.as_str());
                    match r {
                        // The last segment held nothing acknowledged; the hints are hints
                        // (but `committed.bin` may not vanish).
                        Ok(m) => {
                            assert!(
                                (last_seg && acked < last_first)
                                    || (hint && !(delete && name == COMMITTED)),
                                "{name} {delete}"
                            );
                            assert_eq!(m, if last_seg { last_first - 1 } else { n });
                        }
                        Err(d) => {
                            assert!(!hint || (delete && name == COMMITTED), "{d}");
                            assert!(!last_seg || acked >= last_first, "{d}");
                        }
                    }
                }
            }
            // The metadata and the hints damaged.
            for name in [META, COMMITTED, SYNCED] {
                for at in 0..start[name].len() {
                    restore(dir, &start);
                    let mut bytes = start[name].clone();
                    bytes[at] ^= 0x10;
                    fs::write(dir.join(name), &bytes).unwrap();
                    cases += 1;
                    match attempt(dir, n, acked) {
                        // A torn commit point reads as none.
                        Ok(m) => assert!(name == COMMITTED && m == n, "{name} byte {at}"),
                        Err(d) => {
                            assert_ne!(name, COMMITTED, "{d}");
                            assert_eq!(d.path, dir.join(name), "{d}");
                        }
                    }
                }
            }
        }
        assert!(cases > 300, "{cases}");
    }

    #[test]
    fn a_torn_tail_at_or_below_the_commit_point_is_refused() {
        let n = 14;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        build(dir, n);
        let last = *segments(dir).last().unwrap();
        let seg = dir.join(seg_name(last));
        let len = fs::metadata(&seg).unwrap().len();
        // The synced mark lost (power failure): the commit point still covers the tail.
        fs::remove_file(dir.join(SYNCED)).unwrap();
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(len - 1).unwrap();
        drop(f);
        let mut c = OpenOptions::new()
            .write(true)
            .open(dir.join(COMMITTED))
            .unwrap();
        c.write_all(&checked(&n.to_le_bytes())).unwrap();
        drop(c);
        let e = attempt(dir, n, n).unwrap_err();
        assert!(e.expected.contains(COMMITTED), "{e}");
        assert_eq!((e.path.as_path(), e.offset), (seg.as_path(), e.offset));
        // With no bound at all, the same tail is taken for a torn append and cut.
        fs::write(dir.join(COMMITTED), b"").unwrap();
        assert_eq!(attempt(dir, n, 0).unwrap(), n - 1);
    }

    #[test]
    fn a_lost_last_segment_is_refused() {
        let n = 14;
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        build(dir, n);
        let last = *segments(dir).last().unwrap();
        fs::remove_file(dir.join(seg_name(last))).unwrap();
        let e = attempt(dir, n, n).unwrap_err();
        assert!(e.expected.contains(&format!("entries up to {n}")), "{e}");
        assert!(e.found.contains(&format!("entry {}", last - 1)), "{e}");
    }

    #[test]
    fn truncation_lowers_the_synced_mark_durably() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        build(dir, 14);
        let (log, _) = SegLog::<u64>::open(dir, TINY, strict).unwrap();
        wait(|d| log.truncate(9, d));
        drop(log);
        assert_eq!(read_synced(&dir.join(SYNCED)).unwrap(), Some(8));
        // Entries 9.. written again but torn before their sync: cut, not refused.
        let last = *segments(dir).last().unwrap();
        let mut torn = Vec::new();
        frame(&mut torn, 9, &payload(9));
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.join(seg_name(last)))
            .unwrap();
        f.write_all(&torn[..torn.len() - 3]).unwrap();
        drop(f);
        assert_eq!(attempt(dir, 14, 8).unwrap(), 8);
    }

    mod damage_prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Append(u8),
            Truncate(u8),
            Purge(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => (1u8..6).prop_map(Op::Append),
                1 => (0u8..8).prop_map(Op::Truncate),
                1 => (0u8..8).prop_map(Op::Purge),
            ]
        }

        fn body(i: u64, generation: u64) -> Vec<u8> {
            let mut v = vec![(i ^ generation) as u8; (i % 5) as usize * 60 + 3];
            v.extend_from_slice(&generation.to_le_bytes());
            v
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

            /// Random histories of appends, truncations and purges, then one random byte
            /// changed or the file cut short anywhere in one file of the log: the log either
            /// refuses (changing nothing) or holds exactly what was appended and kept.
            #[test]
            fn damage_never_changes_what_the_log_returns(
                ops in proptest::collection::vec(op(), 1..16),
                pick in any::<proptest::sample::Index>(),
                at in any::<proptest::sample::Index>(),
                flip in 1u8..=255,
                cut in any::<bool>(),
            ) {
                let dir = tempfile::tempdir().unwrap();
                let dir = dir.path();
                let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
                let mut purged = 0u64;
                {
                    let (log, _) = SegLog::<u64>::open(dir, TINY, bounds).unwrap();
                    wait(|d| log.save_meta(0u64.to_le_bytes().to_vec(), d));
                    let mut generation = 0;
                    for op in ops {
                        let next = model.keys().next_back().map_or(purged + 1, |l| l + 1);
                        match op {
                            Op::Append(k) => {
                                generation += 1;
                                let batch: Vec<_> = (next..next + k as u64)
                                    .map(|i| (i, i, body(i, generation)))
                                    .collect();
                                for (i, _, b) in &batch {
                                    model.insert(*i, b.clone());
                                }
                                wait(|d| log.append(batch, d));
                            }
                            Op::Truncate(k) => {
                                let from = next.saturating_sub(k as u64).max(purged + 1);
                                model.retain(|i, _| *i < from);
                                wait(|d| log.truncate(from, d));
                            }
                            Op::Purge(k) => {
                                let upto = next.saturating_sub(k as u64 + 1).max(purged);
                                purged = upto;
                                model.retain(|i, _| *i > upto);
                                wait(|d| log.purge(upto, upto.to_le_bytes().to_vec(), d));
                            }
                        }
                    }
                }
                let files: Vec<String> = contents(dir).into_keys().filter(|f| f != LOCK).collect();
                let name = &files[pick.index(files.len())];
                let mut bytes = fs::read(dir.join(name)).unwrap();
                if !bytes.is_empty() {
                    let at = at.index(bytes.len());
                    if cut {
                        bytes.truncate(at);
                    } else {
                        bytes[at] ^= flip;
                    }
                    fs::write(dir.join(name), &bytes).unwrap();
                }
                let before = contents(dir);
                match SegLog::<u64>::open(dir, TINY, bounds) {
                    Err(LogError::Damaged(d)) => {
                        prop_assert_eq!(contents(dir), before, "{}", d);
                        prop_assert!(d.path.starts_with(dir));
                    }
                    Err(e) => prop_assert!(false, "{}", e),
                    Ok((log, _)) => {
                        // Everything appended was synced, so acknowledged: nothing may be
                        // missing, and nothing may differ.
                        let got = log.reader().read(0, u64::MAX).unwrap();
                        let got: Vec<Vec<u8>> = got
                            .into_iter()
                            .map(|g| match g {
                                Got::Disk(p) => p,
                                Got::Cached(_) => Vec::new(),
                            })
                            .collect();
                        let want: Vec<Vec<u8>> = model.values().cloned().collect();
                        prop_assert_eq!(got, want, "{} damaged", name);
                    }
                }
            }
        }
    }
}

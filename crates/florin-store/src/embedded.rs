//! Florin's default swap store: the unspent set in memory, made durable by a write-ahead log
//! with one sync per batch (group commit) and periodic snapshots that bound recovery time.
//!
//! Why not a general-purpose engine: on this machine fjall, RocksDB and redb reach 15–40 K
//! swaps/s, while an in-memory set with a group-committed log reaches ≈ 700 K
//! (`shared/MEASURED.md`). The unspent set of one node fits in memory (100 M ids ≈ 5 GB), and
//! Hamilton's and OpenCBDC's shards make the same choice.
//!
//! Layout of the directory:
//! - `snapshot-<gen>.bin`: the whole state after the records before it (magic `FLSNAP03`, the
//!   number of records it contains, the store's clock, counters, ids with values, remembered
//!   txids with their expiry, CRC-32 of everything before it; `FLSNAP01`/`02` snapshots, whose
//!   txids have no expiry, are still read and keep those txids for ever);
//! - `wal-<gen>.log`: records appended since that snapshot, each `len u32 ‖ crc32 u32 ‖
//!   payload`, the payload `3 ‖ seq u64 ‖ clock u64 ‖ count u32 ‖ transactions` (each with its
//!   expiry): the confirmed compact transactions of one batch under a sequence number that counts
//!   every record since the store was created, and the clock they were applied at (version 1
//!   and 2 payloads, written before sequence numbers or expiries existed, are still read);
//! - `acked.bin`: the acknowledgement mark, two 32-byte slots written alternately (`FLACK001 ‖
//!   generation u64 ‖ records acknowledged u64 ‖ reserved ‖ crc32`), the valid slot with the
//!   higher generation counting. A background thread writes it at most every
//!   [`EmbeddedConfig::mark_every`] (100 ms) once batches were acknowledged, and at close.
//!
//! A batch is acknowledged only after its record is synced (per [`SyncPolicy`]).
//!
//! **Recovery and damage.** Opening loads the newest snapshot and replays its log. Every record
//! must carry the next sequence number. At the first record that does not read back (short
//! header, length past the end, checksum, payload), recovery decides between a torn tail and
//! damage:
//! - if any valid record follows anywhere in the file, the bad one is damage, not a crash;
//! - if the mark says that record was acknowledged, it is damage: an acknowledged record was
//!   synced before the answer left, so no crash can have torn it;
//! - otherwise it is a torn tail (a crash during the append of a batch nobody was told about),
//!   and it is cut.
//!
//! Damage refuses to open with [`StoreError::Damaged`] naming the file, the offset and what
//! was expected, and changes nothing on disk. So does a log that ends before the mark's count
//! (acknowledged records missing), a missing log or snapshot, or a missing mark in a directory
//! written with one. The one case the mark cannot cover: a crash within `mark_every` of an
//! acknowledgement *and* media damage to exactly that last record — then the record is cut as
//! torn; the supply audit's cross-checks against the authority's independent records
//! (issuance journal, reserve outputs) still catch lost mints and withdrawals.
//! [`EmbeddedStore::check`] runs the same checks read-only (`florin node check`).

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use florin_crypto::Digest;
use florin_ledger::compact::{CompactTx, TxKind};
use florin_ledger::expiry::FOR_EVER;
use florin_ledger::memory::UhsState;
use florin_ledger::store::{StoreError, Supply, SwapOutcome, SwapStore};
use florin_ledger::tx::UhsId;

const SNAPSHOT_MAGIC_V1: &[u8; 8] = b"FLSNAP01";
const SNAPSHOT_MAGIC_V2: &[u8; 8] = b"FLSNAP02";
const SNAPSHOT_MAGIC: &[u8; 8] = b"FLSNAP03";
const WAL_V1: u8 = 1;
const WAL_V2: u8 = 2;
/// Records with the store's clock and each transaction's expiry.
const WAL_V3: u8 = 3;
/// The acknowledgement mark's file name.
pub const MARK_FILE: &str = "acked.bin";
const MARK_MAGIC: &[u8; 8] = b"FLACK001";
const MARK_SLOT: usize = 32;

/// When a batch's log record is synced before the batch is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// `fdatasync` per batch (default): an acknowledged batch survives a crash or power loss.
    Data,
    /// `fsync` per batch (also flushes metadata).
    Full,
    /// No sync: survives a process crash (the OS has the data) but not a power loss (after
    /// one the store may refuse to open: the mark can reach the disk before the log). For
    /// experiments only.
    Never,
}

/// Configuration of the embedded store.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// The directory.
    pub dir: PathBuf,
    /// Take a snapshot once the log exceeds this many bytes.
    pub snapshot_after_bytes: u64,
    /// Sync policy.
    pub sync: SyncPolicy,
    /// How often at most the acknowledgement mark is written while batches are acknowledged;
    /// `None` writes no mark and version-1 records (the store as it was before the integrity
    /// checks: only for the `integrity_overhead_ratio` benchmark).
    pub mark_every: Option<Duration>,
}

impl EmbeddedConfig {
    /// Defaults: fdatasync per batch, snapshot every 256 MiB of log, mark every 100 ms.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        EmbeddedConfig {
            dir: dir.into(),
            snapshot_after_bytes: 256 << 20,
            sync: SyncPolicy::Data,
            mark_every: Some(Duration::from_millis(100)),
        }
    }
}

struct Inner {
    state: UhsState,
    wal: File,
    wal_bytes: u64,
    /// Generation of the current snapshot and log.
    gen: u64,
    /// Sequence number of the next record.
    next_seq: u64,
    /// Set when a write failed: memory may be ahead of disk, so the store refuses further work
    /// until reopened (recovery rebuilds from disk).
    poisoned: bool,
}

/// The background writer of the acknowledgement mark.
struct Marker {
    shared: Arc<MarkShared>,
    thread: Option<JoinHandle<()>>,
}

struct MarkShared {
    /// Records acknowledged (durable and answered).
    acked: AtomicU64,
    /// Marks that failed to write (they weaken only the torn-tail decision, never data).
    failures: AtomicU64,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// The embedded durable swap store.
pub struct EmbeddedStore {
    cfg: EmbeddedConfig,
    inner: Mutex<Inner>,
    marker: Option<Marker>,
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::Io(format!("{}: {e}", path.display()))
}

fn damaged(
    file: &Path,
    offset: u64,
    expected: impl Into<String>,
    found: impl Into<String>,
) -> StoreError {
    StoreError::Damaged {
        file: file.display().to_string(),
        offset,
        expected: expected.into(),
        found: found.into(),
    }
}

fn snapshot_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("snapshot-{seq:020}.bin"))
}

fn wal_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("wal-{seq:020}.log"))
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn seq_of(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// What recovery found (or, for [`EmbeddedStore::check`], would do), for operators and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The snapshot loaded, if any.
    pub snapshot_seq: Option<u64>,
    /// Log records replayed.
    pub records_replayed: u64,
    /// Bytes cut from a torn log tail (by `check`: that would be cut).
    pub torn_bytes: u64,
    /// Records in the store's history (the sequence number of the next one).
    pub records_total: u64,
    /// Records the acknowledgement mark says were acknowledged (`None`: no mark yet, a new
    /// directory or one written before marks existed).
    pub acknowledged: Option<u64>,
    /// The books recovered.
    pub supply: Supply,
}

/// The result of reading a directory, before anything on disk is changed.
struct Plan {
    state: UhsState,
    gen: u64,
    next_seq: u64,
    /// Length of the valid log prefix, and the log file's length (0, 0 if absent).
    good_len: u64,
    file_len: u64,
    wal_exists: bool,
    mark: Option<u64>,
    snapshots: Vec<u64>,
    wals: Vec<u64>,
    report: Recovery,
}

/// Reads a store directory and decides what opening it means; changes nothing.
fn plan(dir: &Path) -> Result<Plan, StoreError> {
    let mut snapshots = Vec::new();
    let mut wals = Vec::new();
    match fs::read_dir(dir) {
        Ok(rd) => {
            for entry in rd {
                let name = entry
                    .map_err(io_at(dir))?
                    .file_name()
                    .to_string_lossy()
                    .into_owned();
                if let Some(s) = seq_of(&name, "snapshot-", ".bin") {
                    snapshots.push(s);
                } else if let Some(s) = seq_of(&name, "wal-", ".log") {
                    wals.push(s);
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_at(dir)(e)),
    }
    snapshots.sort_unstable();
    wals.sort_unstable();
    let mark_path = dir.join(MARK_FILE);
    let mark = read_mark(&mark_path)?;
    let mut report = Recovery {
        acknowledged: mark,
        ..Recovery::default()
    };
    let mut state = UhsState::default();
    let mut gen = 0;
    let mut next_seq = 0;
    let mut versioned = false;
    // The newest snapshot. Its predecessors' logs are gone once it exists, so if it does not
    // read back intact, refuse to open rather than start from an incomplete state.
    if let Some(&s) = snapshots.last() {
        let (st, n, v2) = read_snapshot(&snapshot_path(dir, s))?;
        state = st;
        next_seq = n;
        versioned |= v2;
        gen = s;
        report.snapshot_seq = Some(s);
    }
    if let Some(&w) = wals.last() {
        if w > gen {
            return Err(damaged(
                &snapshot_path(dir, w),
                0,
                format!("the snapshot that starts log {w} (wal-{w:020}.log exists)"),
                "no such file",
            ));
        }
    }
    let path = wal_path(dir, gen);
    let bytes = match fs::read(&path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_at(&path)(e)),
    };
    let wal_exists = bytes.is_some();
    let bytes = match bytes {
        Some(b) => b,
        None => {
            // Legitimately absent: a new directory, or a crash between renaming a new snapshot
            // into place and creating its (empty) log, while the previous log still exists.
            let fresh = snapshots.is_empty() && wals.is_empty() && mark.is_none();
            let between = gen > 0 && wals.contains(&(gen - 1));
            if !fresh && !between {
                return Err(damaged(
                    &path,
                    0,
                    "the log of the newest snapshot (this directory holds a store)",
                    "no such file",
                ));
            }
            Vec::new()
        }
    };
    let mut pos = 0usize;
    let start_seq = next_seq;
    while pos < bytes.len() {
        match parse_frame(&bytes, pos) {
            Ok(frame) => {
                if let Some(seq) = frame.seq {
                    versioned = true;
                    if seq != next_seq {
                        return Err(damaged(
                            &path,
                            pos as u64,
                            format!("record {next_seq}"),
                            format!("record {seq} (a valid record out of sequence)"),
                        ));
                    }
                }
                // Logged transactions were confirmed at the record's clock (none had expired
                // by it); replay them at that clock.
                state.advance(frame.now);
                for t in &frame.txs {
                    state.apply(t);
                }
                pos += frame.len;
                next_seq += 1;
            }
            Err(why) => {
                if let Some(q) = find_valid_frame(&bytes, pos + 1, next_seq, !versioned) {
                    return Err(damaged(
                        &path,
                        pos as u64,
                        format!("record {next_seq}"),
                        format!("{why}, and a valid record follows at byte {q}: not a torn tail"),
                    ));
                }
                if let Some(acked) = mark.filter(|&a| a > next_seq) {
                    return Err(damaged(
                        &path,
                        pos as u64,
                        format!(
                            "record {next_seq}, acknowledged ({} says {acked} records were)",
                            MARK_FILE
                        ),
                        why,
                    ));
                }
                // A torn tail: a crash during an append nobody was told about.
                break;
            }
        }
    }
    if let Some(acked) = mark.filter(|&a| a > next_seq) {
        return Err(damaged(
            &path,
            pos as u64,
            format!("records up to {acked} (acknowledged, per {MARK_FILE})"),
            format!("the log ends after record {next_seq}: acknowledged records are missing"),
        ));
    }
    if mark.is_none() && versioned {
        return Err(damaged(
            &mark_path,
            0,
            "the acknowledgement mark (this store was written with one)",
            "no such file",
        ));
    }
    report.records_replayed = next_seq - start_seq;
    report.records_total = next_seq;
    report.torn_bytes = (bytes.len() - pos) as u64;
    report.supply = state.supply();
    Ok(Plan {
        state,
        gen,
        next_seq,
        good_len: pos as u64,
        file_len: bytes.len() as u64,
        wal_exists,
        mark,
        snapshots,
        wals,
        report,
    })
}

impl EmbeddedStore {
    /// Opens (or creates) the store, recovering from snapshot and log.
    pub fn open(cfg: EmbeddedConfig) -> Result<Self, StoreError> {
        Self::open_with_report(cfg).map(|(s, _)| s)
    }

    /// Checks a store directory read-only: what opening it would recover, or why it would
    /// refuse. Changes nothing on disk.
    pub fn check(dir: &Path) -> Result<Recovery, StoreError> {
        if !dir.exists() {
            return Err(damaged(
                dir,
                0,
                "a ledger store directory",
                "no such directory",
            ));
        }
        plan(dir).map(|p| p.report)
    }

    /// Opens the store and reports what recovery did.
    pub fn open_with_report(cfg: EmbeddedConfig) -> Result<(Self, Recovery), StoreError> {
        // Every check first; only then is anything on disk changed.
        let p = plan(&cfg.dir)?;
        let dir = &cfg.dir;
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let path = wal_path(dir, p.gen);
        let mut wal = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(io_at(&path))?;
        if p.file_len != p.good_len {
            // Proved a torn tail above: nothing valid follows and it was never acknowledged.
            wal.set_len(p.good_len).map_err(io_at(&path))?;
            wal.sync_all().map_err(io_at(&path))?;
        } else if !p.wal_exists {
            wal.sync_all().map_err(io_at(&path))?;
        }
        use std::io::Seek;
        wal.seek(std::io::SeekFrom::End(0)).map_err(io_at(&path))?;
        let mark_path = dir.join(MARK_FILE);
        let marker = match cfg.mark_every {
            Some(every) => {
                if p.mark.is_none() {
                    create_mark(&mark_path, p.next_seq)?;
                }
                Some(Marker::start(
                    &mark_path,
                    p.mark.unwrap_or(p.next_seq),
                    p.next_seq,
                    every,
                )?)
            }
            None => None,
        };
        sync_dir(dir)?;
        // Files older than the state we loaded are obsolete.
        for s in p.snapshots.iter().filter(|&&s| s < p.gen) {
            let _ = fs::remove_file(snapshot_path(dir, *s));
        }
        for s in p.wals.iter().filter(|&&s| s < p.gen) {
            let _ = fs::remove_file(wal_path(dir, *s));
        }
        let inner = Inner {
            state: p.state,
            wal,
            wal_bytes: p.good_len,
            gen: p.gen,
            next_seq: p.next_seq,
            poisoned: false,
        };
        Ok((
            EmbeddedStore {
                cfg,
                inner: Mutex::new(inner),
                marker,
            },
            p.report,
        ))
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, StoreError> {
        let g = self
            .inner
            .lock()
            .map_err(|_| StoreError::Corrupt("a writer panicked".into()))?;
        if g.poisoned {
            return Err(StoreError::Io(
                "an earlier write failed; reopen the store to recover".into(),
            ));
        }
        Ok(g)
    }

    /// Takes a snapshot now and starts a new log.
    pub fn snapshot(&self) -> Result<(), StoreError> {
        let mut g = self.lock()?;
        self.snapshot_locked(&mut g)
    }

    /// A consistent copy of the store's files while it runs, as (file name, bytes): the
    /// snapshot, the log as far as it is synced, and a mark counting every record in that log
    /// (taken under the store's lock, between batches, so every record copied is durable).
    /// Written into an empty directory, the files open as this store did at that moment.
    pub fn backup_files(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        // Under the lock only pin the files (hard links: a snapshot roll cannot delete them)
        // and note the log's synced length; read them after, so swaps are not held up.
        let pin = self
            .cfg
            .dir
            .join(format!("backup-pin.{}", std::process::id()));
        let _ = fs::remove_dir_all(&pin);
        fs::create_dir(&pin).map_err(io_at(&pin))?;
        let pinned = (|| {
            let g = self.lock()?;
            let dir = &self.cfg.dir;
            let mut names = Vec::new();
            let snap = snapshot_path(dir, g.gen);
            if snap.exists() {
                fs::hard_link(&snap, pin.join(name_of(&snap))).map_err(io_at(&snap))?;
                names.push((name_of(&snap), None));
            }
            let wal = wal_path(dir, g.gen);
            fs::hard_link(&wal, pin.join(name_of(&wal))).map_err(io_at(&wal))?;
            names.push((name_of(&wal), Some(g.wal_bytes)));
            Ok::<_, StoreError>((names, g.next_seq))
        })();
        let read = pinned.and_then(|(names, records)| {
            let mut out = Vec::new();
            for (name, len) in names {
                let p = pin.join(&name);
                let mut bytes = fs::read(&p).map_err(io_at(&p))?;
                if let Some(len) = len {
                    bytes.truncate(len as usize);
                }
                out.push((name, bytes));
            }
            let mut mark = vec![0u8; MARK_SLOT];
            mark.extend_from_slice(&mark_slot(1, records));
            out.push((MARK_FILE.to_string(), mark));
            Ok(out)
        });
        let _ = fs::remove_dir_all(&pin);
        read
    }

    /// Marks that failed to write since the store was opened.
    pub fn mark_failures(&self) -> u64 {
        self.marker
            .as_ref()
            .map_or(0, |m| m.shared.failures.load(Ordering::Relaxed))
    }

    fn snapshot_locked(&self, g: &mut Inner) -> Result<(), StoreError> {
        let next = g.gen + 1;
        let dir = &self.cfg.dir;
        let tmp = dir.join("snapshot.tmp");
        write_snapshot(&tmp, &g.state, g.next_seq)?;
        // The snapshot first, then its empty log: a crash between the two leaves the previous
        // log beside the new snapshot, which recovery recognises.
        fs::rename(&tmp, snapshot_path(dir, next)).map_err(io)?;
        // From here the new snapshot is what recovery loads: if its log cannot be made, no
        // further batch may go to the old log (recovery would not read it). Stop; reopening
        // recovers from the new snapshot, which holds every batch so far.
        let started = (|| {
            let wal = OpenOptions::new()
                .create(true)
                .read(true)
                .write(true)
                .truncate(true)
                .open(wal_path(dir, next))?;
            wal.sync_all()?;
            File::open(dir)?.sync_all()?;
            Ok(wal)
        })();
        let wal = match started {
            Ok(w) => w,
            Err(e) => {
                g.poisoned = true;
                return Err(io(e));
            }
        };
        let old = g.gen;
        g.wal = wal;
        g.wal_bytes = 0;
        g.gen = next;
        let _ = fs::remove_file(wal_path(dir, old));
        let _ = fs::remove_file(snapshot_path(dir, old));
        Ok(())
    }
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        if let Some(m) = self.marker.as_mut() {
            m.stop();
        }
    }
}

impl EmbeddedStore {
    /// How many confirmed txids the store remembers to answer replays (transfers until their
    /// expiry, mints for ever), and its clock.
    pub fn remembered(&self) -> Result<(usize, u64), StoreError> {
        let g = self.lock()?;
        Ok((g.state.applied.len(), g.state.applied.now()))
    }
}

impl SwapStore for EmbeddedStore {
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        let mut g = self.lock()?;
        g.state.advance(now);
        let outcomes: Vec<SwapOutcome> = batch.iter().map(|tx| g.state.apply(tx)).collect();
        let confirmed: Vec<&CompactTx> = batch
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| **o == SwapOutcome::Confirmed)
            .map(|(t, _)| t)
            .collect();
        if confirmed.is_empty() {
            return Ok(outcomes);
        }
        let seq = self.marker.as_ref().map(|_| g.next_seq);
        let record = encode_record(seq, g.state.applied.now(), &confirmed);
        let written = (|| {
            g.wal.write_all(&record)?;
            match self.cfg.sync {
                SyncPolicy::Data => g.wal.sync_data(),
                SyncPolicy::Full => g.wal.sync_all(),
                SyncPolicy::Never => Ok(()),
            }
        })();
        if let Err(e) = written {
            // Memory is ahead of disk now: stop, so nothing unlogged is ever acknowledged.
            g.poisoned = true;
            return Err(io(e));
        }
        g.wal_bytes += record.len() as u64;
        g.next_seq += 1;
        if let Some(m) = &self.marker {
            m.shared.acked.store(g.next_seq, Ordering::Release);
        }
        if g.wal_bytes >= self.cfg.snapshot_after_bytes {
            if let Err(e) = self.snapshot_locked(&mut g) {
                // The batch is durable (in the old log, or in the new snapshot if the store
                // stopped itself): acknowledge it. A snapshot that failed before its rename
                // leaves the old log in use; one that failed after poisoned the store.
                let _ = e;
            }
        }
        Ok(outcomes)
    }

    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        Ok(self.lock()?.state.unspent.contains_key(id))
    }

    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        Ok(self.lock()?.state.applied.contains(txid))
    }

    fn inputs_hint(&self, txid: &Digest, inputs: &[UhsId]) -> Option<bool> {
        // Never waits: while a commit holds the lock (on the disk), the validators verify in
        // full instead of queueing behind it.
        let g = self.inner.try_lock().ok()?;
        if g.poisoned {
            return None;
        }
        Some(g.state.inputs_present(txid, inputs))
    }

    fn supply(&self) -> Result<Supply, StoreError> {
        Ok(self.lock()?.state.supply())
    }
}

// ---------------------------------------------------------------- the acknowledgement mark

fn mark_slot(generation: u64, acked: u64) -> [u8; MARK_SLOT] {
    let mut b = [0u8; MARK_SLOT];
    b[..8].copy_from_slice(MARK_MAGIC);
    b[8..16].copy_from_slice(&generation.to_le_bytes());
    b[16..24].copy_from_slice(&acked.to_le_bytes());
    let crc = crc32fast::hash(&b[..MARK_SLOT - 4]);
    b[MARK_SLOT - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Reads the mark: `None` if the file does not exist; the acknowledged count of the valid
/// slot with the higher generation; damage if no slot is valid.
fn read_mark(path: &Path) -> Result<Option<u64>, StoreError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(path)(e)),
    };
    if bytes.len() != 2 * MARK_SLOT {
        return Err(damaged(
            path,
            bytes.len().min(2 * MARK_SLOT) as u64,
            format!("{} bytes (two slots)", 2 * MARK_SLOT),
            format!("{} bytes", bytes.len()),
        ));
    }
    let best = bytes
        .chunks_exact(MARK_SLOT)
        .filter(|s| slot_valid(s))
        .map(|s| {
            let g = u64::from_le_bytes(s[8..16].try_into().unwrap_or_default());
            let a = u64::from_le_bytes(s[16..24].try_into().unwrap_or_default());
            (g, a)
        })
        .max();
    match best {
        Some((_, acked)) => Ok(Some(acked)),
        None => Err(damaged(
            path,
            0,
            "a slot with a valid checksum",
            "two damaged slots",
        )),
    }
}

/// Whether a mark slot has the magic and a matching checksum.
fn slot_valid(s: &[u8]) -> bool {
    s.len() == MARK_SLOT
        && &s[..8] == MARK_MAGIC
        && crc32fast::hash(&s[..MARK_SLOT - 4]).to_le_bytes() == s[MARK_SLOT - 4..]
}

fn create_mark(path: &Path, acked: u64) -> Result<(), StoreError> {
    // Generation g lives in slot g % 2: the next write (generation 2) goes to the other slot
    // than this one, so a torn write never hits the only valid slot.
    let mut b = vec![0u8; MARK_SLOT];
    b.extend_from_slice(&mark_slot(1, acked));
    florin_fs::write_atomic(path, &[&b]).map_err(io_at(path))?;
    Ok(())
}

impl Marker {
    fn start(path: &Path, written: u64, acked: u64, every: Duration) -> Result<Self, StoreError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_at(path))?;
        // Continue the generation of the slots on disk.
        let mut generation = 1u64;
        let mut buf = [0u8; 2 * MARK_SLOT];
        if file.read_exact_at(&mut buf, 0).is_ok() {
            for s in buf.chunks_exact(MARK_SLOT) {
                if slot_valid(s) {
                    generation =
                        generation.max(u64::from_le_bytes(s[8..16].try_into().unwrap_or_default()));
                }
            }
        }
        let shared = Arc::new(MarkShared {
            acked: AtomicU64::new(acked),
            failures: AtomicU64::new(0),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("florin-ledger-mark".into())
            .spawn(move || {
                let mut written = written;
                loop {
                    // Wait first: a mark says only what was acknowledged by the time it is
                    // written, `every` after the batches it covers at the earliest.
                    let stopping = match sh.stop.lock() {
                        Ok(g) => match sh.wake.wait_timeout_while(g, every, |s| !*s) {
                            Ok((g, _)) => *g,
                            Err(_) => true,
                        },
                        Err(_) => true,
                    };
                    let a = sh.acked.load(Ordering::Acquire);
                    if a > written {
                        generation = generation.wrapping_add(1).max(1);
                        let slot = (generation % 2) * MARK_SLOT as u64;
                        let ok = file
                            .write_all_at(&mark_slot(generation, a), slot)
                            .and_then(|_| file.sync_data());
                        match ok {
                            Ok(()) => written = a,
                            Err(_) => {
                                sh.failures.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    if stopping {
                        return;
                    }
                }
            })
            .map_err(io)?;
        Ok(Marker {
            shared,
            thread: Some(thread),
        })
    }

    /// Writes the final mark and stops the thread.
    fn stop(&mut self) {
        if let Ok(mut s) = self.shared.stop.lock() {
            *s = true;
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------- records

/// A record's payload: version 3 with a sequence number (the store keeps a mark), else version
/// 1 (stores opened without a mark, as before sequence numbers existed: no clock, no expiries).
fn encode_record(seq: Option<u64>, now: u64, txs: &[&CompactTx]) -> Vec<u8> {
    let mut p = Vec::with_capacity(24 + txs.len() * 200);
    match seq {
        Some(s) => {
            p.push(WAL_V3);
            p.extend_from_slice(&s.to_le_bytes());
            p.extend_from_slice(&now.to_le_bytes());
        }
        None => p.push(WAL_V1),
    }
    p.extend_from_slice(&(txs.len() as u32).to_le_bytes());
    for t in txs {
        p.extend_from_slice(&t.txid);
        p.push(t.kind.to_byte());
        if seq.is_some() {
            p.extend_from_slice(&t.expires.to_le_bytes());
        }
        p.extend_from_slice(&(t.inputs.len() as u32).to_le_bytes());
        for i in &t.inputs {
            p.extend_from_slice(i);
        }
        p.extend_from_slice(&(t.outputs.len() as u32).to_le_bytes());
        for (o, v) in &t.outputs {
            p.extend_from_slice(o);
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(p.len() + 8);
    out.extend_from_slice(&(p.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&p).to_le_bytes());
    out.extend_from_slice(&p);
    out
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        Some(h)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    }
    fn id(&mut self) -> Option<[u8; 32]> {
        self.take(32).and_then(|b| b.try_into().ok())
    }
}

/// One record's payload decoded.
struct Payload {
    /// Its sequence number (versions 2 and 3).
    seq: Option<u64>,
    /// The store's clock when it was applied (version 3; 0 before).
    now: u64,
    /// Its confirmed transactions (those of versions 1 and 2 never expire).
    txs: Vec<CompactTx>,
}

/// Decodes one record's payload.
fn decode_payload(p: &[u8]) -> Option<Payload> {
    let mut c = Cursor(p);
    let version = c.take(1)?[0];
    let (seq, now) = match version {
        WAL_V1 => (None, 0),
        WAL_V2 => (Some(c.u64()?), 0),
        WAL_V3 => (Some(c.u64()?), c.u64()?),
        _ => return None,
    };
    let n = c.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(p.len() / 40));
    for _ in 0..n {
        let txid = c.id()?;
        let kind = TxKind::from_byte(c.take(1)?[0])?;
        let expires = if version == WAL_V3 {
            c.u64()?
        } else {
            FOR_EVER
        };
        let ni = c.u32()? as usize;
        if ni > c.0.len() / 32 {
            return None;
        }
        let inputs = (0..ni).map(|_| c.id()).collect::<Option<Vec<_>>>()?;
        let no = c.u32()? as usize;
        if no > c.0.len() / 40 {
            return None;
        }
        let outputs = (0..no)
            .map(|_| Some((c.id()?, c.u64()?)))
            .collect::<Option<Vec<_>>>()?;
        out.push(CompactTx {
            txid,
            kind,
            inputs,
            outputs,
            expires,
        });
    }
    c.0.is_empty().then_some(Payload { seq, now, txs: out })
}

/// One record read back.
struct Frame {
    seq: Option<u64>,
    /// The store's clock when it was applied.
    now: u64,
    txs: Vec<CompactTx>,
    /// Bytes of the frame (header and payload).
    len: usize,
}

/// Reads the record at `pos`, or says why it does not read back.
fn parse_frame(bytes: &[u8], pos: usize) -> Result<Frame, String> {
    let rest = &bytes[pos..];
    if rest.len() < 8 {
        return Err(format!(
            "a record header cut short ({} of 8 bytes)",
            rest.len()
        ));
    }
    let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
    let Some(payload) = rest.get(8..8 + len) else {
        return Err(format!(
            "a record of {len} bytes with only {} left in the file",
            rest.len() - 8
        ));
    };
    let actual = crc32fast::hash(payload);
    if actual != crc {
        return Err(format!(
            "checksum {actual:08x} of the record's {len} bytes, stored {crc:08x}"
        ));
    }
    let Payload { seq, now, txs } =
        decode_payload(payload).ok_or("a payload that does not decode")?;
    Ok(Frame {
        seq,
        now,
        txs,
        len: 8 + len,
    })
}

/// The offset of the first valid record at or after `from` that could follow record
/// `min_seq − 1`: evidence that the damage before it is not a torn tail. A version-2 record
/// must carry a sequence number between `min_seq` and the most records the rest of the file
/// could hold; those cheap checks come before the checksum, so a long damaged log is scanned in
/// linear time. Version-1 records (no sequence number) count only in a log without version-2
/// records (`v1_possible`).
fn find_valid_frame(bytes: &[u8], from: usize, min_seq: u64, v1_possible: bool) -> Option<usize> {
    let last = bytes.len().checked_sub(9)?;
    // The smallest record: header (8), version (1), sequence (8), count (4).
    let max_seq = min_seq.saturating_add((bytes.len() / 21) as u64);
    (from..=last).find(|&q| {
        let len = u32::from_le_bytes([bytes[q], bytes[q + 1], bytes[q + 2], bytes[q + 3]]) as usize;
        if len < 5 || len > bytes.len() - q - 8 {
            return false;
        }
        match bytes[q + 8] {
            WAL_V2 | WAL_V3 => {
                let Some(seq) = bytes
                    .get(q + 9..q + 17)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                else {
                    return false;
                };
                if seq < min_seq || seq > max_seq {
                    return false;
                }
            }
            WAL_V1 if v1_possible => {}
            _ => return false,
        }
        parse_frame(bytes, q).is_ok()
    })
}

// ---------------------------------------------------------------- snapshots

fn write_snapshot(path: &Path, s: &UhsState, next_seq: u64) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io)?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut crc = crc32fast::Hasher::new();
    let mut put = |w: &mut BufWriter<File>, b: &[u8]| -> Result<(), StoreError> {
        crc.update(b);
        w.write_all(b).map_err(io)
    };
    put(&mut w, SNAPSHOT_MAGIC)?;
    put(&mut w, &next_seq.to_le_bytes())?;
    put(&mut w, &s.applied.now().to_le_bytes())?;
    put(&mut w, &s.minted.to_le_bytes())?;
    put(&mut w, &s.redeemed.to_le_bytes())?;
    put(&mut w, &(s.unspent.len() as u64).to_le_bytes())?;
    for (id, v) in &s.unspent {
        put(&mut w, id)?;
        put(&mut w, &v.to_le_bytes())?;
    }
    put(&mut w, &(s.applied.len() as u64).to_le_bytes())?;
    for (t, (), expires) in s.applied.iter() {
        put(&mut w, t)?;
        put(&mut w, &expires.to_le_bytes())?;
    }
    let sum = crc.finalize();
    w.write_all(&sum.to_le_bytes()).map_err(io)?;
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)
}

/// Reads a snapshot: (state, records it contains, whether it is version 2).
fn read_snapshot(path: &Path) -> Result<(UhsState, u64, bool), StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io_at(path))?;
    if bytes.len() < 8 + 4 {
        return Err(damaged(
            path,
            bytes.len() as u64,
            "a snapshot of at least 12 bytes",
            format!("{} bytes", bytes.len()),
        ));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 4);
    let actual = crc32fast::hash(body);
    if actual.to_le_bytes() != sum {
        return Err(damaged(
            path,
            body.len() as u64,
            format!(
                "checksum {actual:08x} of the {} bytes before it",
                body.len()
            ),
            format!(
                "{:08x}",
                u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]])
            ),
        ));
    }
    let mut c = Cursor(body);
    let at = |c: &Cursor| (body.len() - c.0.len()) as u64;
    let short =
        |c: &Cursor, what: &str| damaged(path, at(c), what.to_string(), "the end of the file");
    let version = match c.take(8) {
        Some(m) if m == SNAPSHOT_MAGIC => 3,
        Some(m) if m == SNAPSHOT_MAGIC_V2 => 2,
        Some(m) if m == SNAPSHOT_MAGIC_V1 => 1,
        _ => {
            return Err(damaged(
                path,
                0,
                "magic FLSNAP03",
                format!("{:02x?}", &body[..8]),
            ))
        }
    };
    let v2 = version >= 2;
    let next_seq = if v2 {
        c.u64().ok_or_else(|| short(&c, "the record count"))?
    } else {
        0
    };
    let now = if version >= 3 {
        c.u64().ok_or_else(|| short(&c, "the clock"))?
    } else {
        0
    };
    let mut s = UhsState {
        minted: c.u64().ok_or_else(|| short(&c, "minted"))?,
        redeemed: c.u64().ok_or_else(|| short(&c, "redeemed"))?,
        ..Default::default()
    };
    let n = c.u64().ok_or_else(|| short(&c, "the id count"))? as usize;
    // Twice the entries, as `keep_room` keeps it (no rehash of the whole set at the first
    // swap after opening).
    s.unspent.reserve(2 * n.min(body.len() / 40));
    for _ in 0..n {
        let id = c.id().ok_or_else(|| short(&c, "an id"))?;
        s.unspent
            .insert(id, c.u64().ok_or_else(|| short(&c, "a value"))?);
    }
    s.advance(now);
    let m = c.u64().ok_or_else(|| short(&c, "the txid count"))? as usize;
    s.applied.reserve(m.min(body.len() / 32));
    for _ in 0..m {
        let txid = c.id().ok_or_else(|| short(&c, "a txid"))?;
        let expires = if version >= 3 {
            c.u64().ok_or_else(|| short(&c, "an expiry"))?
        } else {
            FOR_EVER
        };
        s.applied.insert(txid, (), expires);
    }
    if !c.0.is_empty() {
        return Err(damaged(
            path,
            at(&c),
            "the checksum",
            format!("{} more bytes", c.0.len()),
        ));
    }
    Ok((s, next_seq, v2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_ledger::store::testing::{id, mint, run_suite};

    fn cfg(dir: &Path) -> EmbeddedConfig {
        EmbeddedConfig::new(dir)
    }

    #[test]
    fn shared_suite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run_suite(
            || EmbeddedStore::open(cfg(&path)).unwrap(),
            |s| {
                drop(s);
                EmbeddedStore::open(cfg(&path)).unwrap()
            },
        );
    }

    #[test]
    fn shared_suite_across_snapshots() {
        // A tiny snapshot threshold: every batch rolls the log.
        let dir = tempfile::tempdir().unwrap();
        let c = EmbeddedConfig {
            snapshot_after_bytes: 1,
            ..cfg(dir.path())
        };
        run_suite(
            || EmbeddedStore::open(c.clone()).unwrap(),
            |s| {
                drop(s);
                EmbeddedStore::open(c.clone()).unwrap()
            },
        );
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names.iter().filter(|n| n.starts_with("snapshot-")).count(),
            1,
            "{names:?}"
        );
        assert_eq!(
            names.iter().filter(|n| n.starts_with("wal-")).count(),
            1,
            "{names:?}"
        );
    }

    /// Every file of a directory and its bytes, to prove a refused open changed nothing.
    fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    fn copy_dir(from: &Path, to: &Path) {
        for (name, bytes) in contents(from) {
            fs::write(to.join(name), bytes).unwrap();
        }
    }

    /// Record `i` of the test history: a mint of id `i`.
    fn record(i: u64) -> CompactTx {
        mint(i, &[(i, 10 + i)])
    }

    /// The records a store holds, checked to be exactly a prefix of the history: returns its
    /// length, or panics if the store holds anything else.
    fn prefix_len(s: &EmbeddedStore, n: u64) -> u64 {
        let held: Vec<bool> = (0..n)
            .map(|i| s.is_confirmed(&record(i).txid).unwrap())
            .collect();
        let k = held.iter().take_while(|h| **h).count() as u64;
        assert!(
            held[k as usize..].iter().all(|h| !h),
            "not a prefix: {held:?}"
        );
        let minted: u64 = (0..k).map(|i| 10 + i).sum();
        assert_eq!(s.supply().unwrap().minted_cents, minted);
        for i in 0..n {
            assert_eq!(s.is_unspent(&id(i)).unwrap(), i < k);
        }
        k
    }

    /// A store of `n` one-record batches in one log, with `acked` of them covered by the mark
    /// (the rest were appended after the last mark, as a crash leaves them).
    fn history(dir: &Path, n: u64, acked: u64) {
        let quiet = EmbeddedConfig {
            mark_every: Some(Duration::from_secs(3600)),
            ..cfg(dir)
        };
        {
            let s = EmbeddedStore::open(quiet.clone()).unwrap();
            for i in 0..acked {
                s.swap(&[record(i)]).unwrap();
            }
        } // closing writes the mark
        let s = EmbeddedStore::open(quiet).unwrap();
        for i in acked..n {
            s.swap(&[record(i)]).unwrap();
        }
        // A crash: no final mark (the marker sleeps for an hour and the store is never dropped).
        std::mem::forget(s);
    }

    /// Record boundaries of the one log in `dir`.
    fn boundaries(dir: &Path) -> (PathBuf, Vec<usize>) {
        let wal = wal_path(dir, 0);
        let bytes = fs::read(&wal).unwrap();
        let mut b = vec![0];
        let mut pos = 0;
        while pos < bytes.len() {
            pos += parse_frame(&bytes, pos).unwrap().len;
            b.push(pos);
        }
        (wal, b)
    }

    /// Opens a damaged copy: either it recovers a prefix holding every acknowledged record, or
    /// it refuses and changed nothing. Returns the prefix recovered.
    fn open_damaged(dir: &Path, n: u64, acked: u64) -> Option<u64> {
        let before = contents(dir);
        match EmbeddedStore::open(cfg(dir)) {
            Ok(s) => {
                let k = prefix_len(&s, n);
                assert!(k >= acked, "acknowledged records lost: {k} < {acked}");
                Some(k)
            }
            Err(e) => {
                assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
                assert_eq!(
                    contents(dir),
                    before,
                    "a refused open changed the directory"
                );
                None
            }
        }
    }

    #[test]
    fn crash_and_corruption_matrix_of_the_log() {
        const N: u64 = 6;
        for acked in [0, 3, N] {
            let base = tempfile::tempdir().unwrap();
            history(base.path(), N, acked);
            let (wal, b) = boundaries(base.path());
            let len = *b.last().unwrap();
            let case = |damage: &dyn Fn(&Path)| -> Option<u64> {
                let d = tempfile::tempdir().unwrap();
                copy_dir(base.path(), d.path());
                damage(d.path());
                open_damaged(d.path(), N, acked)
            };
            let name = wal.file_name().unwrap().to_owned();
            // Truncation at and inside every record.
            for cut in 0..len {
                let got = case(&|d: &Path| {
                    let f = OpenOptions::new().write(true).open(d.join(&name)).unwrap();
                    f.set_len(cut as u64).unwrap();
                });
                let whole = b.iter().filter(|&&x| x <= cut).count() as u64 - 1;
                if whole >= acked {
                    assert_eq!(got, Some(whole), "acked {acked}, cut at {cut}");
                } else {
                    assert_eq!(got, None, "acked {acked}, cut at {cut}");
                }
            }
            // A flipped bit in every byte of every record.
            for at in 0..len {
                let got = case(&|d: &Path| {
                    let p = d.join(&name);
                    let mut bytes = fs::read(&p).unwrap();
                    bytes[at] ^= 0x10;
                    fs::write(&p, bytes).unwrap();
                });
                let rec = b.iter().filter(|&&x| x <= at).count() as u64 - 1;
                if rec == N - 1 && rec >= acked {
                    // The last record, never acknowledged: a torn tail, cut.
                    assert_eq!(got, Some(N - 1), "acked {acked}, flip at {at}");
                } else {
                    assert_eq!(got, None, "acked {acked}, flip at {at}");
                }
            }
            // Garbage appended after the last record: a torn append, cut.
            assert_eq!(
                case(&|d: &Path| {
                    let mut f = OpenOptions::new().append(true).open(d.join(&name)).unwrap();
                    f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap();
                }),
                Some(N)
            );
            // Deleted or emptied files.
            for file in [name.to_string_lossy().into_owned(), MARK_FILE.to_string()] {
                assert_eq!(
                    case(&|d: &Path| fs::remove_file(d.join(&file)).unwrap()),
                    None
                );
                let emptied = case(&|d: &Path| fs::write(d.join(&file), b"").unwrap());
                if file == MARK_FILE || acked > 0 {
                    assert_eq!(emptied, None, "{file} emptied, acked {acked}");
                }
            }
            // A damaged mark slot: the other slot still counts (never fewer than it said).
            let got = case(&|d: &Path| {
                let p = d.join(MARK_FILE);
                let mut bytes = fs::read(&p).unwrap();
                let (g0, g1) = (bytes[8], bytes[MARK_SLOT + 8]);
                let newer = if g1 > g0 { MARK_SLOT } else { 0 };
                bytes[newer + 20] ^= 1;
                fs::write(&p, bytes).unwrap();
            });
            assert!(got.is_none() || got == Some(N), "acked {acked}: {got:?}");
        }
    }

    #[test]
    fn crash_and_corruption_matrix_of_snapshots() {
        let base = tempfile::tempdir().unwrap();
        let c = EmbeddedConfig {
            snapshot_after_bytes: 1,
            ..cfg(base.path())
        };
        {
            let s = EmbeddedStore::open(c.clone()).unwrap();
            for i in 0..4 {
                s.swap(&[record(i)]).unwrap();
            }
        }
        let snap = snapshot_path(base.path(), 4);
        let len = fs::read(&snap).unwrap().len();
        let case = |damage: &dyn Fn(&Path)| -> Option<u64> {
            let d = tempfile::tempdir().unwrap();
            copy_dir(base.path(), d.path());
            damage(d.path());
            open_damaged(d.path(), 4, 4)
        };
        assert_eq!(case(&|_| {}), Some(4));
        let name = snap.file_name().unwrap().to_owned();
        for at in (0..len).step_by(3).chain([len - 1]) {
            let got = case(&|d: &Path| {
                let p = d.join(&name);
                let mut b = fs::read(&p).unwrap();
                b[at] ^= 0x01;
                fs::write(&p, b).unwrap();
            });
            assert_eq!(got, None, "flip at {at}");
        }
        for cut in [0, 4, 11, len / 2, len - 1] {
            let got = case(&|d: &Path| {
                let f = OpenOptions::new().write(true).open(d.join(&name)).unwrap();
                f.set_len(cut as u64).unwrap();
            });
            assert_eq!(got, None, "cut at {cut}");
        }
        assert_eq!(
            case(&|d: &Path| fs::remove_file(d.join(&name)).unwrap()),
            None
        );
        // The snapshot's log deleted.
        let wal = wal_path(base.path(), 4);
        let wal_name = wal.file_name().unwrap().to_owned();
        assert_eq!(
            case(&|d: &Path| fs::remove_file(d.join(&wal_name)).unwrap()),
            None
        );
        // Every file deleted but the mark: refused, never a fresh empty ledger.
        assert_eq!(
            case(&|d: &Path| {
                fs::remove_file(d.join(&name)).unwrap();
                fs::remove_file(d.join(&wal_name)).unwrap();
            }),
            None
        );
    }

    #[test]
    fn check_reports_without_changing_anything() {
        let dir = tempfile::tempdir().unwrap();
        history(dir.path(), 3, 2);
        let wal = wal_path(dir.path(), 0);
        let mut f = OpenOptions::new().append(true).open(&wal).unwrap();
        f.write_all(&[9, 9, 9]).unwrap();
        drop(f);
        let before = contents(dir.path());
        let r = EmbeddedStore::check(dir.path()).unwrap();
        assert_eq!(
            (r.records_total, r.torn_bytes, r.acknowledged),
            (3, 3, Some(2))
        );
        assert_eq!(contents(dir.path()), before);
        let (_, rep) = EmbeddedStore::open_with_report(cfg(dir.path())).unwrap();
        assert_eq!(rep.torn_bytes, 3);
        assert!(EmbeddedStore::check(&dir.path().join("absent")).is_err());
    }

    #[test]
    fn a_backup_of_a_running_store_opens_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let c = EmbeddedConfig {
            snapshot_after_bytes: 600,
            ..cfg(dir.path())
        };
        let s = EmbeddedStore::open(c).unwrap();
        for i in 0..7 {
            s.swap(&[record(i)]).unwrap();
        }
        let files = s.backup_files().unwrap();
        s.swap(&[record(7)]).unwrap();
        let copy = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            fs::write(copy.path().join(name), bytes).unwrap();
        }
        let r = EmbeddedStore::check(copy.path()).unwrap();
        assert_eq!(
            (r.records_total, r.acknowledged, r.torn_bytes),
            (7, Some(7), 0)
        );
        assert!(r.snapshot_seq.is_some(), "the test should cover a snapshot");
        let b = EmbeddedStore::open(cfg(copy.path())).unwrap();
        assert_eq!(prefix_len(&b, 8), 7);
        assert_eq!(prefix_len(&s, 8), 8);
    }

    #[test]
    fn a_store_written_before_marks_opens_and_gains_one() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = EmbeddedConfig {
            mark_every: None,
            ..cfg(dir.path())
        };
        {
            let s = EmbeddedStore::open(legacy).unwrap();
            s.swap(&[record(0)]).unwrap();
            s.swap(&[record(1)]).unwrap();
        }
        assert!(!dir.path().join(MARK_FILE).exists());
        {
            let s = EmbeddedStore::open(cfg(dir.path())).unwrap();
            assert_eq!(prefix_len(&s, 3), 2);
            s.swap(&[record(2)]).unwrap();
        }
        let r = EmbeddedStore::check(dir.path()).unwrap();
        assert_eq!((r.records_total, r.acknowledged), (3, Some(3)));
        // From now on the mark is required.
        fs::remove_file(dir.path().join(MARK_FILE)).unwrap();
        assert!(matches!(
            EmbeddedStore::open(cfg(dir.path())),
            Err(StoreError::Damaged { .. })
        ));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Random histories and random damage: the store never serves a history other than
        /// a prefix holding every acknowledged record, and a refusal changes nothing.
        #[test]
        fn damage_never_yields_a_different_history(
            n in 1u64..10,
            acked_frac in 0u64..=4,
            snap in proptest::bool::ANY,
            kind in 0u8..3,
            at in proptest::num::usize::ANY,
            bit in 0u8..8,
        ) {
            let acked = n * acked_frac / 4;
            let dir = tempfile::tempdir().unwrap();
            history(dir.path(), n, acked);
            if snap {
                // Also a snapshot in the middle of the history: its file is damaged too.
                let s = EmbeddedStore::open(EmbeddedConfig {
                    mark_every: Some(Duration::from_secs(3600)),
                    ..cfg(dir.path())
                }).unwrap();
                s.snapshot().unwrap();
                drop(s);
            }
            let mut files: Vec<PathBuf> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            files.sort();
            let f = &files[at % files.len()];
            let mut bytes = fs::read(f).unwrap();
            match kind {
                0 if !bytes.is_empty() => {
                    let i = (at / files.len()) % bytes.len();
                    bytes[i] ^= 1 << bit;
                }
                1 => bytes.truncate((at / files.len()) % (bytes.len() + 1)),
                _ => bytes.extend_from_slice(&[bit, 0, 0, 0, 7]),
            }
            fs::write(f, bytes).unwrap();
            let acked = if snap { n } else { acked };
            open_damaged(dir.path(), n, acked);
        }
    }

    #[test]
    fn torn_tail_is_cut_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        history(dir.path(), 2, 0);
        // Half a record appended, as a crash mid-write leaves it.
        let wal = wal_path(dir.path(), 0);
        let mut f = OpenOptions::new().append(true).open(&wal).unwrap();
        f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 5]).unwrap();
        drop(f);
        let (s, rep) = EmbeddedStore::open_with_report(cfg(dir.path())).unwrap();
        assert_eq!((rep.records_replayed, rep.torn_bytes), (2, 9));
        assert!(s.is_unspent(&id(1)).unwrap());
        drop(s);
        // A flipped byte inside the last record, which the mark now covers: damage, refused.
        let mut bytes = fs::read(&wal).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 1;
        fs::write(&wal, &bytes).unwrap();
        let err = EmbeddedStore::open(cfg(dir.path())).err().unwrap();
        assert!(err.to_string().contains("acknowledged"), "{err}");
        assert_eq!(fs::read(&wal).unwrap(), bytes);
    }

    #[test]
    fn torn_tail_of_an_unacknowledged_record_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        history(dir.path(), 2, 1);
        let wal = wal_path(dir.path(), 0);
        let mut bytes = fs::read(&wal).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 1;
        fs::write(&wal, bytes).unwrap();
        let (s, rep) = EmbeddedStore::open_with_report(cfg(dir.path())).unwrap();
        assert_eq!(rep.records_replayed, 1);
        assert!(s.is_unspent(&id(0)).unwrap());
    }

    #[test]
    fn corrupt_or_missing_snapshot_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = EmbeddedConfig {
            snapshot_after_bytes: 1,
            ..cfg(dir.path())
        };
        {
            let s = EmbeddedStore::open(c.clone()).unwrap();
            s.swap(&[mint(1, &[(1, 10)])]).unwrap();
        }
        let snap = snapshot_path(dir.path(), 1);
        let mut b = fs::read(&snap).unwrap();
        b[20] ^= 1;
        fs::write(&snap, b).unwrap();
        // The snapshot is corrupt: refuse to open rather than start from an incomplete state.
        assert!(matches!(
            EmbeddedStore::open(c.clone()),
            Err(StoreError::Damaged { .. })
        ));
        // A missing snapshot with a newer log is refused too.
        fs::remove_file(&snap).unwrap();
        assert!(matches!(
            EmbeddedStore::open(c),
            Err(StoreError::Damaged { .. })
        ));
    }
}

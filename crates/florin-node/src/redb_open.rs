//! Opening a redb file strictly: damage is refused with an error naming the file, missing or
//! emptied state is never recreated, and a refused open changes nothing on disk.
//!
//! # What redb 4.5.0 (the version in `Cargo.lock`) guarantees, and what it does not
//!
//! - **Checksums.** Every b-tree page is covered by an XXH3-128 checksum stored in its parent
//!   (the roots' in the commit slot); each of the two commit slots of the header carries its
//!   own checksum. The file's first 9 bytes are a magic number; byte 9 (the "god byte") holds
//!   the primary-slot bit, the recovery-required flag (set while a writer has the file open,
//!   cleared on a clean close) and the two-phase-commit flag.
//! - **A plain `Database::open` trusts a file that was closed cleanly**: it verifies no page
//!   checksum and "may panic if it was corrupted outside redb" (its own documentation).
//!   `Builder::set_check_integrity_on_open(true)` verifies every page of the committed trees on
//!   every open and reports damage as `StorageError::Corrupted` instead.
//! - **Repair on open after an unclean shutdown**: the open walks the trees, and if the newest
//!   commit (the primary slot) fails its checksums and that commit was written with one-phase
//!   commit (redb's default), it *rolls back to the previous commit* (`repair_primary_corrupted`)
//!   and commits that. A one-phase commit writes its pages and its slot and then fsyncs once, so
//!   after a crash a newest commit that fails its checksums is one whose fsync never returned:
//!   a commit nobody was told succeeded. That rollback is the torn-tail case and is allowed.
//!   The same rollback after a *clean* close (or under `check_integrity_on_open`) would remove
//!   an acknowledged commit; [`open_strict`] aborts it through the repair callback and refuses.
//!   With two-phase commit (`WriteTransaction::set_two_phase_commit(true)`) redb itself refuses
//!   a primary that fails its checksums ("Primary is corrupted despite 2-phase commit").
//! - **Header slots.** With one-phase commit, a primary slot whose own checksum fails (or a
//!   secondary slot with a newer transaction id) makes redb silently serve the other slot, the
//!   previous commit. [`open_strict`] opens a cleanly closed file read-only first, which keeps
//!   the recorded primary and refuses a corrupted one ("Primary commit slot is corrupted"), and
//!   refuses a cleanly closed file whose secondary slot names a newer transaction than the
//!   primary (a flipped primary bit: under two-phase commit redb would serve the older commit).
//! - **`Database::create` on an existing file** opens it if it is a valid redb file and
//!   initialises a new, empty database in it if the file is *empty* (0 bytes): an emptied file
//!   silently becomes an empty database. [`open_strict`] never calls `create` on an existing
//!   path; a first start creates the database under a temporary name and renames it in.
//! - **Truncation.** A cleanly closed file shorter than its recorded layout is refused
//!   ("File truncated below stored layout"); after a crash the layout is rebuilt from the file
//!   length and a length that is no region boundary is refused; pages cut off fail their
//!   checksums. A file shorter than the 320-byte header is refused here before redb reads it.
//! - **Writes before a refusal.** An open that needs recovery rewrites the header before it
//!   verifies the pages, so a refused recovery could leave the header changed. [`open_strict`]
//!   therefore verifies a file that needs recovery on a copy first, and touches the real file
//!   only once the copy opened. A cleanly closed file is written only after it verified.
//! - **Not covered**: free pages (they hold no committed data), the unused header bytes, and
//!   the secondary slot's own checksum under two-phase commit (the previous commit, never
//!   served). Damage there loses nothing that was committed.
//!
//! Writers of a strictly opened file should commit with two-phase commit, so that the rule
//! "the newest commit verifies or the file is refused" holds through crashes too.
//!
//! # Use
//!
//! ```ignore
//! let expect = if first_start { Expect::FirstStart } else { Expect::Existing };
//! let db: redb::Database = open_strict(&path, expect)?; // RedbOpenError names the file
//! let mut tx = db.begin_write()?;
//! tx.set_two_phase_commit(true);
//! ```
//!
//! `first_start` must come from the service's own records (a data-directory manifest, a
//! marker written once the database exists), never from whether the file exists.

use std::fs;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError, StorageError};

/// redb's magic number, the file's first 9 bytes.
const MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
/// The header: magic, god byte, geometry (64 bytes), then two 128-byte commit slots.
const HEADER_LEN: usize = 320;
const GOD_BYTE: usize = 9;
const PRIMARY_BIT: u8 = 1;
const RECOVERY_REQUIRED: u8 = 2;
const PRIMARY_UNFLUSHED: u8 = 8;
const SLOT_0: usize = 64;
const SLOT_LEN: usize = 128;
/// Offset of the last committed transaction id (u64, little-endian) in a commit slot.
const SLOT_TXN_ID: usize = 104;

/// Whether the caller expects the database to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The service's own records say it has never run here: a missing file is created empty.
    /// An existing file is still opened strictly, never reinitialised.
    FirstStart,
    /// The service has run here: the file must exist.
    Existing,
}

/// Why [`open_strict`] refused a file. Every variant names the file; none changed it.
#[derive(Debug, thiserror::Error)]
pub enum RedbOpenError {
    /// The file is missing although the caller's records say it exists.
    #[error(
        "{path}: database file missing (expected an existing redb database; it is never \
         recreated empty — restore it from a backup)"
    )]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file has 0 bytes (redb would silently initialise a new database in it).
    #[error(
        "{path}: database file is empty at offset 0 (expected a redb header of {HEADER_LEN} bytes)"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file ends inside the header.
    #[error("{path}: truncated at offset {len} (expected a redb header of {HEADER_LEN} bytes)")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// The first bytes are not redb's magic number.
    #[error("{path}: damaged at offset 0: not redb's magic number (found {found})")]
    NotRedb {
        /// The file.
        path: PathBuf,
        /// The first 9 bytes, hex.
        found: String,
    },
    /// A cleanly closed file whose secondary commit slot is newer than its primary.
    #[error(
        "{path}: damaged header at offset {GOD_BYTE}: the primary commit slot (offset \
         {primary_at}) holds transaction {primary_txn} but the other slot holds the newer \
         {secondary_txn} in a file closed cleanly (expected the primary to be the newest)"
    )]
    SlotsOutOfOrder {
        /// The file.
        path: PathBuf,
        /// Offset of the primary slot.
        primary_at: usize,
        /// Its transaction id.
        primary_txn: u64,
        /// The other slot's transaction id.
        secondary_txn: u64,
    },
    /// redb found damage (checksums, layout, slots: "redb reports: …") or would have rolled
    /// back a commit.
    #[error("{path}: damaged: {detail}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What redb reported.
        detail: String,
    },
    /// Another handle has the file open.
    #[error("{path}: already open by another process or handle")]
    AlreadyOpen {
        /// The file.
        path: PathBuf,
    },
    /// I/O failed (nothing was found wrong with the file).
    #[error("{path}: {detail}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

impl RedbOpenError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Missing { path }
            | Self::Empty { path }
            | Self::Truncated { path, .. }
            | Self::NotRedb { path, .. }
            | Self::SlotsOutOfOrder { path, .. }
            | Self::Damaged { path, .. }
            | Self::AlreadyOpen { path }
            | Self::Io { path, .. } => path,
        }
    }
}

fn io_err(path: &Path, what: &str, e: std::io::Error) -> RedbOpenError {
    RedbOpenError::Io {
        path: path.to_path_buf(),
        detail: format!("{what}: {e}"),
    }
}

/// Opens the redb database at `path` strictly (see the module documentation):
/// - missing: created empty if `expect` is [`Expect::FirstStart`], else [`RedbOpenError::Missing`];
/// - empty, shorter than the header, not redb, header slots out of order: refused before redb
///   reads it;
/// - every page of the committed trees is verified (`check_integrity_on_open`); damage is
///   [`RedbOpenError::Damaged`] with redb's words, and a rollback of an acknowledged commit is
///   refused (aborted in the repair callback);
/// - a file left by a crash is verified and repaired on a copy first: the file itself is
///   repaired (the torn last commit cut) only if the copy opened.
///
/// A refused open leaves the file byte for byte as it was.
pub fn open_strict(path: &Path, expect: Expect) -> Result<Database, RedbOpenError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return match expect {
                Expect::FirstStart => create_fresh(path),
                Expect::Existing => Err(RedbOpenError::Missing {
                    path: path.to_path_buf(),
                }),
            }
        }
        Err(e) => return Err(io_err(path, "cannot stat", e)),
        Ok(m) if !m.is_file() => {
            return Err(RedbOpenError::Io {
                path: path.to_path_buf(),
                detail: "not a regular file".into(),
            })
        }
        Ok(_) => {}
    }
    let unclean = check_header(path)?;
    // A read-only open writes nothing: it refuses a corrupted primary slot (keeping the
    // recorded primary), a file another handle has open, and a file that needs recovery.
    let ro = catch_unwind(AssertUnwindSafe(|| {
        redb::Builder::new().open_read_only(path)
    }))
    .map_err(|_| damaged(path, "redb panicked reading the header".into()))?;
    match ro {
        Ok(db) => drop(db),
        Err(DatabaseError::DatabaseAlreadyOpen) => {
            return Err(RedbOpenError::AlreadyOpen {
                path: path.to_path_buf(),
            })
        }
        Err(DatabaseError::RepairAborted) if unclean => {
            // Recovery rewrites the header before it verifies the pages: try it on a copy.
            let copy = sibling(path, "verify-tmp");
            let _ = fs::remove_file(&copy);
            fs::copy(path, &copy).map_err(|e| io_err(path, "cannot copy for verification", e))?;
            let trial = open_verified(&copy, true).map(drop).map_err(|e| match e {
                RedbOpenError::Damaged { detail, .. } => RedbOpenError::Damaged {
                    path: path.to_path_buf(),
                    detail,
                },
                RedbOpenError::Io { detail, .. } => RedbOpenError::Io {
                    path: path.to_path_buf(),
                    detail,
                },
                other => other,
            });
            let _ = fs::remove_file(&copy);
            trial?;
        }
        Err(DatabaseError::RepairAborted) => {
            // Closed cleanly, yet the layout does not match the file's length.
            return Err(damaged(
                path,
                "the file's length does not match its recorded layout in a file closed cleanly"
                    .into(),
            ));
        }
        Err(e) => return Err(map_err(path, e, false)),
    }
    open_verified(path, unclean)
}

/// Reads the header: `true` if the last writer did not close the file cleanly.
fn check_header(path: &Path) -> Result<bool, RedbOpenError> {
    let mut f = fs::File::open(path).map_err(|e| io_err(path, "cannot open", e))?;
    let len = f
        .metadata()
        .map_err(|e| io_err(path, "cannot stat", e))?
        .len();
    if len == 0 {
        return Err(RedbOpenError::Empty {
            path: path.to_path_buf(),
        });
    }
    if len < HEADER_LEN as u64 {
        return Err(RedbOpenError::Truncated {
            path: path.to_path_buf(),
            len,
        });
    }
    let mut h = [0u8; HEADER_LEN];
    f.read_exact(&mut h)
        .map_err(|e| io_err(path, "cannot read the header", e))?;
    if h[..MAGIC.len()] != MAGIC {
        return Err(RedbOpenError::NotRedb {
            path: path.to_path_buf(),
            found: hex::encode(&h[..MAGIC.len()]),
        });
    }
    let god = h[GOD_BYTE];
    let unclean = god & (RECOVERY_REQUIRED | PRIMARY_UNFLUSHED) != 0;
    let primary = usize::from(god & PRIMARY_BIT != 0);
    let txn = |slot: usize| {
        let at = SLOT_0 + slot * SLOT_LEN + SLOT_TXN_ID;
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (p, s) = (txn(primary), txn(1 - primary));
    if !unclean && s > p {
        return Err(RedbOpenError::SlotsOutOfOrder {
            path: path.to_path_buf(),
            primary_at: SLOT_0 + primary * SLOT_LEN,
            primary_txn: p,
            secondary_txn: s,
        });
    }
    Ok(unclean)
}

/// Opens with every committed page verified. A rollback of the newest commit is allowed only
/// for a file a crash left (`torn_tail_allowed`).
fn open_verified(path: &Path, torn_tail_allowed: bool) -> Result<Database, RedbOpenError> {
    let mut b = redb::Builder::new();
    b.set_check_integrity_on_open(true);
    b.set_repair_callback(move |s| {
        // Progress 0.3 is reported only when the newest commit failed its checksums, just
        // before redb rolls it back to the previous commit.
        let p = s.progress();
        if !torn_tail_allowed && p > 0.2 && p < 0.5 {
            s.abort();
        }
    });
    let r = catch_unwind(AssertUnwindSafe(|| b.open(path)))
        .map_err(|_| damaged(path, "redb panicked while verifying the file".into()))?;
    r.map_err(|e| map_err(path, e, true))
}

fn damaged(path: &Path, detail: String) -> RedbOpenError {
    RedbOpenError::Damaged {
        path: path.to_path_buf(),
        detail,
    }
}

fn map_err(path: &Path, e: DatabaseError, verifying: bool) -> RedbOpenError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => RedbOpenError::AlreadyOpen {
            path: path.to_path_buf(),
        },
        DatabaseError::RepairAborted if verifying => damaged(
            path,
            "the newest commit fails its checksums in a file that was closed cleanly; redb \
             would roll it back to the previous commit (refused)"
                .into(),
        ),
        DatabaseError::Storage(StorageError::Io(io))
            if io.kind() != std::io::ErrorKind::InvalidData
                && io.kind() != std::io::ErrorKind::UnexpectedEof =>
        {
            io_err(path, "I/O", io)
        }
        other => damaged(path, format!("redb reports: {other}")),
    }
}

/// `path` with `.tag` appended to its file name.
fn sibling(path: &Path, tag: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{tag}"));
    path.with_file_name(name)
}

/// A first start: the database is made under a temporary name, synced, and renamed in, so
/// the path never holds a half-initialised file.
fn create_fresh(path: &Path) -> Result<Database, RedbOpenError> {
    let tmp = sibling(path, "init-tmp");
    let _ = fs::remove_file(&tmp);
    let db = Database::create(&tmp).map_err(|e| map_err(&tmp, e, false))?;
    db.close().map_err(|e| map_err(&tmp, e, false))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err(&tmp, "cannot sync", e))?;
    fs::rename(&tmp, path).map_err(|e| io_err(path, "cannot rename the new database in", e))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(dir, "cannot sync the directory", e))?;
    }
    open_verified(path, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

    /// A database with `n` committed two-phase transactions, each a marked value.
    fn build(path: &Path, n: u64) {
        let db = open_strict(path, Expect::FirstStart).unwrap();
        for i in 0..n {
            let mut tx = db.begin_write().unwrap();
            tx.set_two_phase_commit(true);
            {
                let mut t = tx.open_table(T).unwrap();
                let v = vec![0xA0 | (i as u8 & 0x0F); 3000];
                t.insert(i, v.as_slice()).unwrap();
            }
            tx.commit().unwrap();
        }
        db.close().unwrap();
    }

    /// Offsets of every stored copy of the 3000-byte value filled with `b`.
    fn copies(file: &[u8], b: u8) -> Vec<usize> {
        let mut out = Vec::new();
        let mut i = 0;
        while i + 3000 <= file.len() {
            if file[i..i + 3000].iter().all(|&x| x == b) {
                out.push(i);
                i += 3000;
            } else {
                i += 1;
            }
        }
        out
    }

    fn read_all(db: &Database) -> Vec<(u64, Vec<u8>)> {
        let tx = db.begin_read().unwrap();
        let t = tx.open_table(T).unwrap();
        use redb::ReadableTable;
        t.iter()
            .unwrap()
            .map(|r| {
                let (k, v) = r.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect()
    }

    /// Asserts a refusal that names the file and leaves it unchanged.
    fn refused(path: &Path, expect: Expect) -> RedbOpenError {
        let before = fs::read(path).ok();
        let e = match open_strict(path, expect) {
            Ok(_) => panic!("{} opened", path.display()),
            Err(e) => e,
        };
        assert_eq!(e.path(), path);
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_eq!(
            fs::read(path).ok(),
            before,
            "a refused open changed {}",
            path.display()
        );
        e
    }

    #[test]
    fn a_database_open_elsewhere_is_refused_as_open_not_as_damaged() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        build(&p, 2);
        let held = open_strict(&p, Expect::Existing).unwrap();
        let e = open_strict(&p, Expect::Existing).err().unwrap();
        assert!(matches!(e, RedbOpenError::AlreadyOpen { .. }), "{e}");
        assert!(!sibling(&p, "verify-tmp").exists());
        drop(held);
        assert_eq!(
            read_all(&open_strict(&p, Expect::Existing).unwrap()).len(),
            2
        );
    }

    #[test]
    fn a_clean_database_reopens_with_every_commit() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        build(&p, 5);
        let db = open_strict(&p, Expect::Existing).unwrap();
        assert_eq!(read_all(&db).len(), 5);
        drop(db);
        // FirstStart on an existing file opens it, never reinitialises it.
        let db = open_strict(&p, Expect::FirstStart).unwrap();
        assert_eq!(read_all(&db).len(), 5);
    }

    #[test]
    fn missing_empty_truncated_and_foreign_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        assert!(matches!(
            refused(&p, Expect::Existing),
            RedbOpenError::Missing { .. }
        ));
        assert!(!p.exists(), "a refused open created the file");
        build(&p, 3);
        let good = fs::read(&p).unwrap();
        fs::write(&p, b"").unwrap();
        assert!(matches!(
            refused(&p, Expect::Existing),
            RedbOpenError::Empty { .. }
        ));
        // Even a first start does not turn an emptied file into a new database.
        assert!(matches!(
            refused(&p, Expect::FirstStart),
            RedbOpenError::Empty { .. }
        ));
        fs::write(&p, &good[..100]).unwrap();
        assert!(matches!(
            refused(&p, Expect::Existing),
            RedbOpenError::Truncated { .. }
        ));
        for cut in [HEADER_LEN, 4096, good.len() / 2, good.len() - 1] {
            fs::write(&p, &good[..cut]).unwrap();
            let e = refused(&p, Expect::Existing);
            assert!(matches!(e, RedbOpenError::Damaged { .. }), "cut {cut}: {e}");
        }
        let mut foreign = good.clone();
        foreign[0] ^= 0x20;
        fs::write(&p, &foreign).unwrap();
        assert!(matches!(
            refused(&p, Expect::Existing),
            RedbOpenError::NotRedb { .. }
        ));
    }

    #[test]
    fn flipped_bytes_in_header_slots_and_committed_pages_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        build(&p, 4);
        let good = fs::read(&p).unwrap();
        let primary = usize::from(good[GOD_BYTE] & PRIMARY_BIT != 0);
        let slot = SLOT_0 + primary * SLOT_LEN;
        // Committed values: the first and the last written (every copy on disk, since a freed
        // page may still hold an old one).
        let first = copies(&good, 0xA0).into_iter().map(|o| o + 10).collect();
        let last = copies(&good, 0xA3).into_iter().map(|o| o + 2999).collect();
        let cases: [(&str, Vec<usize>, u8); 6] = [
            ("primary bit", vec![GOD_BYTE], PRIMARY_BIT),
            ("primary slot root", vec![slot + 8], 1),
            ("primary slot txn id", vec![slot + SLOT_TXN_ID], 1),
            ("primary slot checksum", vec![slot + SLOT_LEN - 1], 0x80),
            ("first committed value", first, 1),
            ("last committed value", last, 1),
        ];
        for (what, at, bit) in cases {
            assert!(!at.is_empty(), "{what}");
            let mut bad = good.clone();
            for a in at {
                bad[a] ^= bit;
            }
            fs::write(&p, &bad).unwrap();
            let e = refused(&p, Expect::Existing);
            eprintln!("{what}: {e}");
        }
        fs::write(&p, &good).unwrap();
        assert_eq!(
            read_all(&open_strict(&p, Expect::Existing).unwrap()).len(),
            4
        );
    }

    #[test]
    fn one_phase_damage_after_a_clean_close_is_not_rolled_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        let db = open_strict(&p, Expect::FirstStart).unwrap();
        for i in 0..3u64 {
            let tx = db.begin_write().unwrap();
            tx.open_table(T)
                .unwrap()
                .insert(i, [0xB0 | i as u8; 2000].as_slice())
                .unwrap();
            tx.commit().unwrap();
        }
        db.close().unwrap();
        let good = fs::read(&p).unwrap();
        let mut bad = good.clone();
        let at = good
            .windows(2000)
            .enumerate()
            .filter(|(_, w)| w.iter().all(|&x| x == 0xB2));
        let mut n = 0;
        for (o, _) in at.step_by(1) {
            if o >= n {
                bad[o + 5] ^= 1;
                n = o + 2000;
            }
        }
        assert!(n > 0);
        fs::write(&p, &bad).unwrap();
        let e = refused(&p, Expect::Existing);
        assert!(matches!(e, RedbOpenError::Damaged { .. }), "{e}");
    }

    #[test]
    fn a_crash_leaves_a_file_that_reopens_with_its_commits() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("db.redb");
        build(&p, 2);
        // As a crashed writer leaves it: the recovery flag set.
        let mut bytes = fs::read(&p).unwrap();
        bytes[GOD_BYTE] |= RECOVERY_REQUIRED;
        fs::write(&p, &bytes).unwrap();
        let db = open_strict(&p, Expect::Existing).unwrap();
        assert_eq!(read_all(&db).len(), 2);
        drop(db);
        assert!(!sibling(&p, "verify-tmp").exists());
        // A crash flag with a damaged committed value: refused, file unchanged.
        for o in copies(&bytes.clone(), 0xA1) {
            bytes[o + 7] ^= 1;
        }
        fs::write(&p, &bytes).unwrap();
        refused(&p, Expect::Existing);
        assert!(!sibling(&p, "verify-tmp").exists());
    }
}

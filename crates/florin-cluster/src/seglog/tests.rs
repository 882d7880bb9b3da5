//! Tests of the segment log: appends, reads, reopening, truncation, purge, the cache, the lock,
//! and the crash and corruption matrix of what opening cuts or refuses.

use super::*;
use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

use super::format::{checked, first_of, seg_name, synced_bytes, COMMITTED, LOCK, META, SYNCED};
use super::recovery::{read_synced, scan, Recovered};

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

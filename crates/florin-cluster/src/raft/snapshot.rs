//! Snapshots at rest and in transit: the `snapshot.bin` file (header with length and CRC32,
//! written atomically, read back checked) and the layout of snapshot data (a head naming the
//! last applied log id and membership, then the machine's bytes).

use std::path::Path;

use openraft::{BasicNode, LogId, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};

use super::error::StoreError;
use super::NodeId;
use crate::seglog;

/// The snapshot file's name in the replica's directory.
pub(super) const SNAPSHOT_FILE: &str = "snapshot.bin";

/// Writes `dir/name` atomically and durably ([`florin_fs::write_atomic`]).
pub(super) fn write_atomic(dir: &Path, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
    florin_fs::write_atomic(&dir.join(name), parts)
}

/// Appends `head` (a postcard value) with its length in front: `len u32 ‖ postcard`.
pub(super) fn put_head<T: Serialize>(out: &mut Vec<u8>, head: &T) -> Result<(), StoreError> {
    let bytes = postcard::to_allocvec(head).map_err(StoreError::codec("snapshot head"))?;
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&bytes);
    Ok(())
}

/// Splits what [`put_head`] wrote (and whatever follows it).
fn take_head<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<(T, &[u8]), StoreError> {
    let (len, rest) = b
        .split_first_chunk::<4>()
        .ok_or(StoreError::TruncatedHead)?;
    let len = u32::from_le_bytes(*len) as usize;
    if rest.len() < len {
        return Err(StoreError::TruncatedHead);
    }
    let (head, rest) = rest.split_at(len);
    let head = postcard::from_bytes(head).map_err(StoreError::codec("snapshot data"))?;
    Ok((head, rest))
}

/// Where a snapshot stands in the log: the first part of its data (the snapshot data sent to
/// peers is `put_head(SnapshotHead) ‖ the machine's bytes`, so the machine writes its state
/// straight into the buffer, and reads it back in place).
pub(super) type SnapshotHead = (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>);

/// The parts of a snapshot's data: its head and the machine's bytes.
pub(super) fn split_snapshot(data: &[u8]) -> Result<(SnapshotHead, &[u8]), StoreError> {
    take_head(data)
}

/// A snapshot read from disk: its metadata and its data.
pub(super) type StoredSnapshot = (SnapshotMeta<NodeId, BasicNode>, Vec<u8>);

/// The first bytes of `snapshot.bin`.
const SNAPSHOT_MAGIC: &[u8; 8] = b"FLSNAP02";
/// Bytes of `snapshot.bin` before its body: magic, body length, checksum.
const SNAPSHOT_HEADER: u64 = 20;

/// The header of `snapshot.bin` for a body of `parts`: `FLSNAP02 ‖ body length u64 ‖ crc32 of
/// the body u32` (little endian).
pub(super) fn snapshot_header(parts: &[&[u8]]) -> Vec<u8> {
    let mut h = crc32fast::Hasher::new();
    let mut len = 0u64;
    for p in parts {
        h.update(p);
        len += p.len() as u64;
    }
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER as usize);
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&h.finalize().to_le_bytes());
    out
}

/// `snapshot.bin`: a [`snapshot_header`], then the body: `put_head(meta)` and the snapshot's
/// data. Read in steps so the data (a whole state) lands in its own buffer without another
/// copy. A file that is shorter or longer than its header says, or whose body does not match
/// its checksum, is refused as [`seglog::Damage`]. A file from before the checksum (no magic)
/// is read as it was written, unchecked; the next snapshot replaces it.
pub(super) fn read_snapshot_file(dir: &Path) -> Result<Option<StoredSnapshot>, seglog::LogError> {
    use std::io::Read;
    let path = dir.join(SNAPSHOT_FILE);
    let other = |e: std::io::Error| seglog::LogError::io(&path, "read", e);
    let bad = |offset: u64, expected: String, found: String| {
        seglog::LogError::from(seglog::Damage::new(path.clone(), offset, expected, found))
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(other(e)),
    };
    let file_len = file.metadata().map_err(other)?.len();
    let mut magic = [0u8; 8];
    if file_len >= 8 {
        file.read_exact(&mut magic).map_err(other)?;
    }
    if file_len >= 8 && &magic != SNAPSHOT_MAGIC {
        return read_old_snapshot(&magic, file, file_len)
            .map(Some)
            .map_err(|found| {
                bad(
                    0,
                    format!(
                        "{} (or an older snapshot)",
                        String::from_utf8_lossy(SNAPSHOT_MAGIC)
                    ),
                    found,
                )
            });
    }
    if file_len < SNAPSHOT_HEADER {
        return Err(bad(
            file_len,
            format!("a {SNAPSHOT_HEADER}-byte header (magic, length, checksum)"),
            format!("a file of {file_len} bytes"),
        ));
    }
    let mut rest = [0u8; 12];
    file.read_exact(&mut rest).map_err(other)?;
    let (len, sum) = rest.split_at(8);
    let body_len = u64::from_le_bytes(len.try_into().unwrap_or_default());
    let sum = u32::from_le_bytes(sum.try_into().unwrap_or_default());
    let want = SNAPSHOT_HEADER.saturating_add(body_len);
    if file_len != want {
        return Err(bad(
            file_len.min(want),
            format!("a file of {want} bytes (its header gives a {body_len}-byte body)"),
            format!("{file_len} bytes"),
        ));
    }
    let mut len = [0u8; 4];
    file.read_exact(&mut len).map_err(other)?;
    let head_len = u32::from_le_bytes(len) as u64;
    if head_len + 4 > body_len {
        return Err(bad(
            SNAPSHOT_HEADER,
            format!("a snapshot head within the {body_len}-byte body"),
            format!("a head of {head_len} bytes"),
        ));
    }
    let mut head = vec![0u8; head_len as usize];
    file.read_exact(&mut head).map_err(other)?;
    let mut data = Vec::with_capacity((body_len - 4 - head_len) as usize);
    file.read_to_end(&mut data).map_err(other)?;
    let mut h = crc32fast::Hasher::new();
    h.update(&len);
    h.update(&head);
    h.update(&data);
    let computed = h.finalize();
    if computed != sum {
        return Err(bad(
            SNAPSHOT_HEADER,
            format!("a body summing to the header's checksum {sum:#010x}"),
            format!("one summing to {computed:#010x}"),
        ));
    }
    let meta = postcard::from_bytes(&head).map_err(|e| {
        bad(
            SNAPSHOT_HEADER + 4,
            "the snapshot's metadata".into(),
            e.to_string(),
        )
    })?;
    Ok(Some((meta, data)))
}

/// A `snapshot.bin` from before the checksum: `put_head(meta)` and the data. `start` is its
/// first 8 bytes, already read.
fn read_old_snapshot(
    start: &[u8; 8],
    mut file: std::fs::File,
    file_len: u64,
) -> Result<StoredSnapshot, String> {
    use std::io::Read;
    let head_len = u32::from_le_bytes([start[0], start[1], start[2], start[3]]) as u64;
    if 4 + head_len > file_len {
        return Err(format!(
            "a header giving a {head_len}-byte head in a file of {file_len} bytes"
        ));
    }
    let mut head = start[4..].to_vec();
    head.resize(head_len as usize, 0);
    if head_len > 4 {
        file.read_exact(&mut head[4..]).map_err(|e| e.to_string())?;
    } else {
        return Err(format!("a head of {head_len} bytes"));
    }
    let meta = postcard::from_bytes(&head).map_err(|e| e.to_string())?;
    let mut data = Vec::new();
    file.read_to_end(&mut data).map_err(|e| e.to_string())?;
    Ok((meta, data))
}

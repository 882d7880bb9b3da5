//! The log's bytes on disk: the file names, the record frame (`len u32 ‖ crc32 u32 ‖ index u64
//! ‖ payload`), segment names, the checked `len ‖ crc32 ‖ body` files and `synced.bin`.

/// Largest record payload accepted when reading.
pub(super) const MAX_RECORD: usize = 1 << 30;
/// Bytes of a record before its payload.
pub(crate) const HEADER: usize = 16;
pub(super) const META: &str = "meta.bin";
pub(super) const COMMITTED: &str = "committed.bin";
pub(super) const SYNCED: &str = "synced.bin";
pub(super) const LOCK: &str = "LOCK";

pub(super) fn seg_name(first: u64) -> String {
    format!("seg-{first:020}.log")
}

pub(super) fn first_of(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

pub(super) fn crc(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends one framed record (`index`, `payload`) to `buf`.
#[cfg(test)]
pub(super) fn frame(buf: &mut Vec<u8>, index: u64, payload: &[u8]) {
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

pub(super) fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

pub(super) fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// The body of a `len ‖ crc32 ‖ body` file, or where and how it is damaged: (offset, expected,
/// found).
pub(super) fn unframe(bytes: &[u8]) -> Result<Vec<u8>, (u64, String, String)> {
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

pub(super) fn checked(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The contents of `synced.bin`: `crc32 ‖ index u64`, the last index synced.
pub(super) fn synced_bytes(index: u64) -> [u8; 12] {
    let mut b = [0u8; 12];
    b[..4].copy_from_slice(&crc32fast::hash(&index.to_le_bytes()).to_le_bytes());
    b[4..].copy_from_slice(&index.to_le_bytes());
    b
}

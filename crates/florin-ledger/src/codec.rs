//! The canonical little-endian encoding of ledger objects.

use thiserror::Error;

/// Why bytes are not a valid encoding. Decoders never panic on any input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended early.
    #[error("truncated: needed {needed} more bytes for {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Missing bytes.
        needed: usize,
    },
    /// Bytes remain after the object.
    #[error("{0} trailing bytes after the object")]
    TrailingBytes(usize),
    /// Unknown version byte.
    #[error("unknown {what} version {found}")]
    UnknownVersion {
        /// The object.
        what: &'static str,
        /// Version found.
        found: u8,
    },
    /// A field out of range.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated {
                what,
                needed: n - self.buf.len(),
            });
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count, bounded by what the remaining bytes could hold at `min_item` bytes per item.
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        min_item: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u16(what)? as usize;
        if n * min_item > self.buf.len() {
            return Err(DecodeError::Truncated {
                what,
                needed: n * min_item - self.buf.len(),
            });
        }
        Ok(n)
    }

    pub(crate) fn version(&mut self, expected: u8, what: &'static str) -> Result<(), DecodeError> {
        match self.u8(what)? {
            v if v == expected => Ok(()),
            found => Err(DecodeError::UnknownVersion { what, found }),
        }
    }

    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }
}

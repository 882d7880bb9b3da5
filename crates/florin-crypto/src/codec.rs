//! The canonical little-endian encoding shared by Florin's formats (tokens, payments, fraud
//! proofs, ledger transactions): a bounds-checked reader and its error. Decoders never panic.

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
    /// A token's value byte maps to no denomination.
    #[error("invalid denomination byte {0}")]
    InvalidDenomination(u8),
}

/// Reads a canonical little-endian encoding; every read is bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
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

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    /// A byte.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u32.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian u64.
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u16 count, refused if the remaining bytes cannot hold that many items of `min_item` bytes.
    pub fn count(&mut self, what: &'static str, min_item: usize) -> Result<usize, DecodeError> {
        let n = self.u16(what)? as usize;
        if n * min_item > self.buf.len() {
            return Err(DecodeError::Truncated {
                what,
                needed: n * min_item - self.buf.len(),
            });
        }
        Ok(n)
    }

    /// The version byte, which must be `expected`.
    pub fn version(&mut self, expected: u8, what: &'static str) -> Result<(), DecodeError> {
        match self.u8(what)? {
            v if v == expected => Ok(()),
            found => Err(DecodeError::UnknownVersion { what, found }),
        }
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Succeeds only if every byte was read.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes(self.buf.len()))
        }
    }
}

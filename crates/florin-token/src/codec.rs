//! The canonical little-endian encoding shared by every Florin offline-cash object.

use thiserror::Error;

/// Why bytes are not a valid encoding. Decoders never panic on any input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended before the object did.
    #[error("truncated: needed {needed} more bytes for {what}")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// How many bytes were missing.
        needed: usize,
    },
    /// Bytes remain after the object.
    #[error("{0} trailing bytes after the object")]
    TrailingBytes(usize),
    /// The version byte is not one this build understands.
    #[error("unknown {what} version {found}")]
    UnknownVersion {
        /// The object.
        what: &'static str,
        /// The version found.
        found: u8,
    },
    /// The value byte maps to no denomination.
    #[error("invalid denomination byte {0}")]
    InvalidDenomination(u8),
    /// A field holds a value outside its range.
    #[error("invalid {0}")]
    Invalid(&'static str),
}

pub(crate) use florin_crypto::codec::Reader;

impl From<florin_crypto::codec::DecodeError> for DecodeError {
    fn from(e: florin_crypto::codec::DecodeError) -> Self {
        use florin_crypto::codec::DecodeError as C;
        match e {
            C::Truncated { what, needed } => DecodeError::Truncated { what, needed },
            C::TrailingBytes(n) => DecodeError::TrailingBytes(n),
            C::UnknownVersion { what, found } => DecodeError::UnknownVersion { what, found },
            C::Invalid(what) => DecodeError::Invalid(what),
            _ => DecodeError::Invalid("encoding"),
        }
    }
}

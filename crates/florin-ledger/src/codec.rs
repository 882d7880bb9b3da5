//! The canonical little-endian encoding of ledger objects: the shared reader and error of
//! `florin-crypto`.

pub use florin_crypto::codec::{DecodeError, Reader};

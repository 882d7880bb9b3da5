//! The canonical little-endian encoding shared by every Florin offline-cash object: the
//! bounds-checked reader and its error, one definition for every format
//! ([`florin_crypto::codec`]).

pub use florin_crypto::codec::DecodeError;
pub(crate) use florin_crypto::codec::Reader;

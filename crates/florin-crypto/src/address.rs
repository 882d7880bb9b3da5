//! Bech32m addresses with human-readable part `eur`.

use bech32::{Bech32m, Hrp};
use thiserror::Error;

/// The human-readable part of every Florin address.
pub const ADDRESS_HRP: &str = "eur";

/// Why a string is not a valid address.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddressError {
    /// Not bech32m, or the checksum does not match.
    #[error("not a valid bech32m address: {0}")]
    Encoding(String),
    /// Valid bech32m but for another network or purpose.
    #[error("address has human-readable part {found:?}, expected {ADDRESS_HRP:?}")]
    WrongHrp {
        /// The prefix found.
        found: String,
    },
    /// The payload is not a 32-byte key.
    #[error("address payload is {0} bytes, expected 32")]
    WrongLength(usize),
}

pub(crate) fn encode(key: &[u8; 32]) -> String {
    // The HRP is a valid constant and 32 bytes are far below bech32m's length limit, so
    // encoding cannot fail.
    let hrp = Hrp::parse_unchecked(ADDRESS_HRP);
    bech32::encode::<Bech32m>(hrp, key).unwrap_or_default()
}

pub(crate) fn decode(s: &str) -> Result<[u8; 32], AddressError> {
    let checked = bech32::primitives::decode::CheckedHrpstring::new::<Bech32m>(s)
        .map_err(|e| AddressError::Encoding(e.to_string()))?;
    let hrp = checked.hrp();
    if hrp.as_str() != ADDRESS_HRP {
        return Err(AddressError::WrongHrp {
            found: hrp.to_string(),
        });
    }
    let data: Vec<u8> = checked.byte_iter().collect();
    <[u8; 32]>::try_from(data.as_slice()).map_err(|_| AddressError::WrongLength(data.len()))
}

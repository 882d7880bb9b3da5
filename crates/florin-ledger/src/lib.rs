//! The online ledger (Hamilton, `003_…` sections 2–3): UTXOs committed to by 32-byte hashes in
//! the UTXO hash set (UHS), transaction-local validation by sentinels, compaction, and the one
//! primitive the state needs, `swap`.
//!
//! Nothing here does I/O. Stores implement [`SwapStore`], and every store must pass the one
//! shared suite, [`store::testing::run_suite`]; the in-memory store ([`memory::MemoryStore`])
//! lives here, the durable ones (embedded, PostgreSQL) in the `florin-store` crate.

pub mod bin_serde;
pub mod build;
mod codec;
pub mod compact;
pub mod expiry;
pub mod memory;
pub mod store;
pub mod tx;
pub mod validate;
pub mod withdraw;

pub use build::{BuildError, Draft};
pub use codec::DecodeError;
pub use compact::{CompactTx, TxKind};
pub use expiry::{ExpiryError, DEFAULT_TTL_SECS, MAX_TTL_SECS};
pub use store::{StoreError, Supply, SwapOutcome, SwapStore};
pub use tx::{Encumbrance, Mint, Output, Redeem, Transaction, Transfer, UhsId, Utxo, Witness};
pub use validate::{validate, ValidationError};

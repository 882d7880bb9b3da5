//! Florin's services. For now: the token authority — a durable registry of every token's
//! verified history in redb, a fraud registry, minting (the devnet faucet) and deposits — and
//! the HTTP/JSON API wallets talk to.
//!
//! Protocol decisions come from `florin-token` (pure); this crate adds storage, parallel
//! batched verification, keys on disk and the network.

pub mod api;
pub mod audit;
mod authority;
pub mod bridge;
pub mod cluster;
pub mod custody;
mod error;
mod keyfile;
pub mod ledger;
pub mod manifest;
pub mod psp;
pub mod redb_open;
mod server;
mod store;

pub use authority::{parallel_verify, Authority, AuthorityConfig, BATCH_SIGNATURES};
pub use error::NodeError;
pub use keyfile::{load_key, load_or_create_key, write_private};
pub use ledger::{Ledger, TxStatus};
pub use server::{router, serve, settle_credit, AppState, MAX_SUBMIT_BATCH};

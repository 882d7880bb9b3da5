//! Florin's services: the token authority — a durable registry of every token's verified
//! history in redb, a fraud registry, minting (the devnet faucet), deposits and the mailbox —
//! the ledger service, the payment service provider and the custody (key-management) network.
//!
//! Protocol decisions come from `florin-token` (pure); this crate adds storage, parallel
//! batched verification and keys on disk. Services take and return typed values and know
//! nothing of HTTP: the HTTP/JSON surface (routers and clients) lives in `florin-http`, and
//! this crate depends on no HTTP library (axum, hyper, reqwest).

pub mod api;
pub mod audit;
mod authority;
pub mod bridge;
pub mod cluster;
pub mod custody;
pub mod error;
pub mod hosts;
mod keyfile;
pub mod ledger;
pub mod manifest;
pub mod obs;
pub mod operator;
pub mod psp;
pub mod redb_open;
pub mod registry;
pub mod snapshot;
mod store;

pub use authority::{
    parallel_verify, Authority, AuthorityConfig, MailboxLimits, BATCH_SIGNATURES,
    MAX_MAILBOX_MESSAGE, MAX_REASON,
};
pub use bridge::{settle_credit, WithdrawAuth};
pub use error::NodeError;
pub use keyfile::{load_key, load_or_create_key, write_private};
pub use ledger::{Ledger, TxStatus};

//! The Florin wallet: one key, a purse of tokens, payment requests it issued, proofs it has
//! accepted, payments it made and deposits in flight.
//!
//! Every operation changes the in-memory [`Wallet`]; the caller persists it through a
//! [`WalletStore`] *before* anything leaves the wallet (a payment file, a deposit request), so
//! a crash never makes the wallet sign the same token twice. Paying the same request again
//! re-emits the same payment instead of signing anew.
//!
//! The online flows (pay, withdraw, sync, deposit) live in [`flows`], over the node operations
//! of a [`connector::Connector`] that a front end implements for its transport. Both sides of
//! the offline exchange over a device channel (the payer's [`peer::pay_peer`], the payee's
//! per-connection [`peer::serve_payer`]) live in [`peer`], over channel traits likewise.

pub mod backup;
pub mod connector;
pub mod flows;
pub mod online;
pub mod peer;
mod select;
mod store;
mod wallet;

pub use connector::{Connector, ConnectorError};
pub use flows::{FlowError, Flows, Notice};
pub use select::select_exact;
pub use store::{
    FileStore, Kdf, LockingStore, PassphraseSource, StoreError, WalletLock, WalletStore,
};
pub use wallet::{
    Balance, DenominationCount, DepositItem, DepositResult, HistoryEntry, PendingDeposit,
    TokenState, Wallet, WalletError, DEFAULT_MAX_HOPS, DEFAULT_MAX_OFFLINE_CENTS,
    MAX_DEPOSIT_PER_REQUEST, MAX_HOPS_LIMIT,
};

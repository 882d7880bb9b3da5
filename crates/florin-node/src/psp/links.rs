//! What a provider asks of the ledger and of other providers ([`PspLinks`]).

use florin_ledger::Transaction;

use super::api::{PayeeView, ReceiveAnswer};
use super::PspError;
use crate::api::{LedgerFaucet, LedgerFaucetAnswer};
use crate::ledger::TxStatus;

/// What a provider asks of others: the ledger, and payees' providers. The service holds one
/// and never sees the wire; `florin-http` implements it over HTTP/JSON. The ledger and each
/// provider are named by their API's base URL.
///
/// Errors: `Unreachable` when the other side cannot be reached or its answer cannot be read
/// (the outcome is unknown), `Refused` when it refused the request, and `NotFound` when a
/// payee's provider has no such account.
#[async_trait::async_trait]
pub trait PspLinks: Send + Sync {
    /// Submits a transaction to the ledger at `ledger`; its status there.
    async fn submit(&self, ledger: &str, tx: &Transaction) -> Result<TxStatus, PspError>;
    /// Whether the output with UHS id `id` is unspent on the ledger at `ledger`.
    async fn is_unspent(&self, ledger: &str, id: &[u8; 32]) -> Result<bool, PspError>;
    /// The ledger's signed confirmation of a confirmed transaction.
    async fn confirmation(
        &self,
        ledger: &str,
        txid: &[u8; 32],
    ) -> Result<crate::api::LedgerConfirmation, PspError>;
    /// The ledger's issuer key (its `/v1/info`), which signs its confirmations.
    async fn ledger_issuer(&self, ledger: &str) -> Result<florin_crypto::PublicKey, PspError>;
    /// The ledger's faucet (devnet): mints to an encumbrance.
    async fn faucet(
        &self,
        ledger: &str,
        req: &LedgerFaucet,
    ) -> Result<LedgerFaucetAnswer, PspError>;
    /// Where to pay an account at the provider `psp` (a configured peer's URL).
    async fn peer_payee(&self, psp: &str, name: &str) -> Result<PayeeView, PspError>;
    /// Announces a payment to the provider `psp` (`POST /v1/psp/announce`; `body` the JSON
    /// of an `Announce`, `auth` its `florin-auth` header): its signed offer.
    async fn peer_announce(
        &self,
        psp: &str,
        body: Vec<u8>,
        auth: String,
    ) -> Result<super::proof::PayeeOffer, PspError>;
    /// Hands the provider `psp` outputs that pay its accounts: `body` is the JSON of a
    /// `Receive`, `auth` the `florin-auth` header signing it with this provider's peer key.
    async fn peer_receive(
        &self,
        psp: &str,
        body: Vec<u8>,
        auth: String,
    ) -> Result<ReceiveAnswer, PspError>;
}

//! Why a provider call failed ([`PspError`]).

use thiserror::Error;

use crate::custody::KmnError;

/// Why a provider call failed. Each maps to one HTTP status and a stable code.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PspError {
    /// Malformed or impossible request (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such account (404).
    #[error("{0}")]
    NotFound(String),
    /// The account name is taken (409).
    #[error("{0}")]
    Exists(String),
    /// The account holds less than asked (409).
    #[error("insufficient funds: {account} holds {balance_cents} cents, {asked_cents} asked")]
    InsufficientFunds {
        /// The account.
        account: String,
        /// Its balance.
        balance_cents: u64,
        /// The payment.
        asked_cents: u64,
    },
    /// The ledger or the payee's provider refused (422); nothing was paid.
    #[error("{0}")]
    Refused(String),
    /// The key-management network could not sign or make a key (503).
    #[error("custody: {0}")]
    Custody(String),
    /// The ledger or another provider could not be reached (502).
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// A payment from this account was sent but its outcome is not known yet (503); it is
    /// resolved in the background, and the account pays again once it is.
    #[error("unresolved: {0}")]
    Unresolved(String),
    /// The request is not signed, or its signature does not hold (401).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The caller is known but may not do this: another account's request, a payment that
    /// differs from the customer's authorization, an unknown peer (403).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The books failed (500).
    #[error("storage: {0}")]
    Storage(String),
}

impl PspError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) => "not_found",
            Self::Exists(_) => "exists",
            Self::InsufficientFunds { .. } => "insufficient_funds",
            Self::Refused(_) => "refused",
            Self::Custody(_) => "custody",
            Self::Unreachable(_) => "unreachable",
            Self::Unresolved(_) => "unresolved",
            Self::Storage(_) => "storage",
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(_) => "forbidden",
        }
    }
}

impl From<KmnError> for PspError {
    fn from(e: KmnError) -> Self {
        if let KmnError::Unauthorized { .. } = e {
            return PspError::Forbidden(e.to_string());
        }
        PspError::Custody(e.to_string())
    }
}

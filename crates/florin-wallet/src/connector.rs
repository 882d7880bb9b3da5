//! What the wallet's flows need from the network: the ledger, the authority, the mailbox.
//!
//! [`Connector`] is the seam between the flows in [`crate::flows`] and a transport. The
//! `florin` command line implements it over the node's HTTP/JSON API; another front end (a
//! GUI, a mobile app, a test) implements it over whatever reaches a node, and reuses every
//! flow unchanged. The model is cdk's `MintConnector`.
//!
//! Methods are `async fn` in the trait; the flows take `&impl Connector`, so no boxing and no
//! runtime is assumed (the flows never spawn). A connector answers in domain values and tells
//! a refusal by the node ([`ConnectorError::Refused`]) apart from a node it could not reach
//! ([`ConnectorError::Unreachable`]): the flows keep what they saved in the second case and
//! say it will be retried.

use std::error::Error as StdError;
use std::fmt;

use florin_crypto::PublicKey;
use florin_ledger::{Transaction, UhsId, Utxo};
use florin_token::Token;

use crate::online::WithdrawAuth;
use crate::wallet::DepositItem;

/// A boxed cause.
pub type Cause = Box<dyn StdError + Send + Sync + 'static>;

/// Why a connector call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectorError {
    /// The node answered and refused.
    #[error("node refused ({status}): {message}")]
    Refused {
        /// The transport's status, as text (e.g. `400 Bad Request`).
        status: String,
        /// The node's stable error code (`bad_request`, `quota`, `rate_limited`, ...).
        code: String,
        /// The node's message.
        message: String,
    },
    /// The node could not be reached (or did not answer): nothing is known about the call.
    #[error("cannot reach the node at {node}")]
    Unreachable {
        /// Where the node was expected.
        node: String,
        /// The transport's error.
        #[source]
        source: Cause,
    },
    /// The node answered something the connector cannot read.
    #[error("{what}")]
    Unreadable {
        /// What was wrong.
        what: String,
        /// The decoder's error, if any.
        #[source]
        source: Option<Cause>,
    },
}

impl ConnectorError {
    /// An unreadable answer described by `what`.
    pub fn unreadable(what: impl fmt::Display) -> Self {
        ConnectorError::Unreadable {
            what: what.to_string(),
            source: None,
        }
    }

    /// An unreadable answer: `what`, caused by `source`.
    pub fn unreadable_by(what: impl fmt::Display, source: impl Into<Cause>) -> Self {
        ConnectorError::Unreadable {
            what: what.to_string(),
            source: Some(source.into()),
        }
    }

    /// Whether the node answered (refused or garbled) rather than being unreachable.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, ConnectorError::Unreachable { .. })
    }
}

/// The ledger's verdict on a submitted transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TxVerdict {
    /// Committed and durable.
    Confirmed,
    /// Accepted, not decided yet.
    Pending,
    /// Malformed or badly signed: it can never be valid.
    StaticInvalid,
    /// Its inputs are not (all) unspent.
    StateInvalid,
    /// Its expiry passed and the ledger does not remember applying it: it will never apply
    /// now. Whether it applied before its expiry, its inputs tell.
    Expired,
    /// A status this wallet does not know, as the node wrote it.
    Other(String),
}

impl TxVerdict {
    /// The verdict from the ledger API's status string.
    pub fn parse(s: &str) -> Self {
        match s {
            "confirmed" => TxVerdict::Confirmed,
            "pending" => TxVerdict::Pending,
            "static_invalid" => TxVerdict::StaticInvalid,
            "state_invalid" => TxVerdict::StateInvalid,
            "expired" => TxVerdict::Expired,
            other => TxVerdict::Other(other.to_string()),
        }
    }

    /// The ledger API's status string.
    pub fn as_str(&self) -> &str {
        match self {
            TxVerdict::Confirmed => "confirmed",
            TxVerdict::Pending => "pending",
            TxVerdict::StaticInvalid => "static_invalid",
            TxVerdict::StateInvalid => "state_invalid",
            TxVerdict::Expired => "expired",
            TxVerdict::Other(s) => s,
        }
    }
}

impl fmt::Display for TxVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ledger's answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxAnswer {
    /// The verdict.
    pub verdict: TxVerdict,
    /// Why it is invalid, when it is.
    pub error: Option<String>,
}

/// One message of a mailbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    /// Its sequence number (the cursor to ask after).
    pub seq: u64,
    /// The sealed bytes (empty when the node held something unreadable: noise to skip).
    pub message: Vec<u8>,
}

/// A request for the tokens of a withdrawal paid on the ledger.
#[derive(Debug, Clone)]
pub struct Withdrawal {
    /// The transfer paying the reserve (hex, as the wallet keeps it).
    pub tx: String,
    /// Which of its outputs pays the reserve.
    pub output: usize,
    /// The tokens' first recipient.
    pub recipient: PublicKey,
    /// The recipient's handshake (64 hex).
    pub handshake: String,
    /// The signature by the key of one of the transfer's inputs.
    pub auth: WithdrawAuth,
}

/// The node operations the wallet's flows use.
///
/// Every method may be retried: submission, mailbox delivery, withdrawal and deposit are
/// idempotent on the node for the same bytes.
#[allow(async_fn_in_trait)] // the flows are generic over the connector; no `Send` bound needed
pub trait Connector {
    /// The authority the node serves (the key a wallet trusts for tokens).
    async fn authority(&self) -> Result<PublicKey, ConnectorError>;

    /// Devnet faucet: the issuer mints `cents` on the ledger to `owner`. Returns the created
    /// outputs, confirmed.
    async fn faucet(&self, owner: &PublicKey, cents: u64) -> Result<Vec<Utxo>, ConnectorError>;

    /// Submits a transaction (idempotent) and returns the ledger's verdict.
    async fn submit(&self, tx: &Transaction) -> Result<TxAnswer, ConnectorError>;

    /// Whether the ledger holds the output `id` unspent.
    async fn unspent(&self, id: &UhsId) -> Result<bool, ConnectorError>;

    /// Leaves a sealed message in `to`'s mailbox; returns its sequence number.
    async fn mailbox_put(&self, to: &PublicKey, sealed: &[u8]) -> Result<u64, ConnectorError>;

    /// The messages in `owner`'s mailbox after sequence number `after`, oldest first (a
    /// bounded page: an empty answer means there are no more).
    async fn mailbox_get(&self, owner: &PublicKey, after: u64)
        -> Result<Vec<Mail>, ConnectorError>;

    /// The tokens of a withdrawal paid on the ledger.
    async fn withdraw(&self, req: &Withdrawal) -> Result<Vec<Token>, ConnectorError>;

    /// Deposits tokens signed over to the authority: re-anchored, or (`credit`) credited to
    /// `depositor` on the ledger through its mailbox. One outcome per token, in order.
    async fn deposit(
        &self,
        depositor: &PublicKey,
        tokens: &[Token],
        credit: bool,
    ) -> Result<Vec<DepositItem>, ConnectorError>;
}

/// `e` and its causes, joined by `: ` (what `anyhow` prints for `{:#}`).
pub fn error_chain(e: &(dyn StdError + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

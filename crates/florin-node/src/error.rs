//! Errors of the node's services.
//!
//! [`NodeError`] names the kind of failure (it decides the HTTP status and the stable
//! [`NodeError::code`]); each kind carries a typed reason ([`BadRequest`], [`NotFound`],
//! [`Forbidden`], [`StorageError`], [`Corrupt`], [`IoError`], [`SignerFailure`]) that keeps the
//! underlying error as its source. The texts are the API's error messages.

use std::net::SocketAddr;
use std::path::PathBuf;

use florin_crypto::{KeyError, P256Error, SignatureError, SignerError};
use florin_token::Serial;
use thiserror::Error;

use crate::authority::MAX_MAILBOX_MESSAGE;

/// A boxed error from a lower layer whose type this crate does not name.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a service call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The caller sent something invalid (400).
    #[error(transparent)]
    BadRequest(#[from] BadRequest),
    /// The thing asked for does not exist (404).
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// A privileged operation without a usable operator credential (401).
    #[error(transparent)]
    Unauthorized(#[from] crate::operator::Unauthorized),
    /// A feature is off on this node, or the caller may not do this (403).
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
    /// Storage failed (500).
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    /// Stored bytes are corrupt (500).
    #[error("corrupt record: {0}")]
    Corrupt(#[from] Corrupt),
    /// I/O on key or data files failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The signer failed (503).
    #[error("signer: {0}")]
    Signer(#[from] SignerFailure),
    /// A quota is used up; the same request may succeed later (429).
    #[error(transparent)]
    Full(#[from] Full),
}

impl NodeError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            // A sentinel without the authority: clients given several URLs try the next.
            Self::NotFound(NotFound::NoAuthority) => "no_authority",
            Self::NotFound(_) => "not_found",
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(f) => f.code(),
            Self::Storage(StorageError::Unavailable(_)) => "unavailable",
            Self::Storage(_) => "storage",
            Self::Corrupt(_) => "corrupt",
            Self::Io(_) => "io",
            Self::Signer(_) => "signer",
            Self::Full(_) => "quota",
        }
    }

    /// A refusal of the caller's input in words (rare one-off refusals; the common ones are
    /// typed [`BadRequest`] reasons).
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::BadRequest(BadRequest::Other(msg.into()))
    }

    /// Something not found, in words (rare cases; the common ones are typed [`NotFound`]).
    pub fn not_found(msg: impl Into<String>) -> Self {
        Self::NotFound(NotFound::Other(msg.into()))
    }

    /// A storage failure in words (an invariant the stored state breaks).
    pub fn storage(msg: impl Into<String>) -> Self {
        Self::Storage(StorageError::Other(msg.into()))
    }

    /// Corrupt state described in words (a file's damage with its remedy).
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Self::Corrupt(Corrupt::Other(msg.into()))
    }

    /// An I/O failure on the file or directory `path`.
    pub fn io_at(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io(IoError::File {
            path: path.into(),
            source,
        })
    }

    /// A worker task (`what`) that panicked or was cancelled.
    pub fn task(what: &'static str, source: tokio::task::JoinError) -> Self {
        Self::Io(IoError::Task { what, source })
    }
}

/// Why a request is invalid (400).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BadRequest {
    /// A key or address (`what`: the field, or the key's role) that does not parse or is not
    /// a usable key.
    #[error("{what}: {source}")]
    Key {
        /// The field or role.
        what: String,
        /// Why the key is refused.
        #[source]
        source: KeyError,
    },
    /// A field that must be 32 bytes in hex (a txid, a UHS id, a handshake).
    #[error("{0} must be 64 hex digits")]
    Hex32(&'static str),
    /// A token serial that is not 8 bytes in hex.
    #[error("serial must be 16 hex digits")]
    Serial,
    /// A field that must be hex.
    #[error("{0} is not hex")]
    NotHex(&'static str),
    /// A transaction that does not decode.
    #[error("malformed transaction: {0}")]
    Transaction(#[source] florin_ledger::DecodeError),
    /// A request body that is not the JSON expected.
    #[error("bad JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// One transaction of a batch (numbered from 0) is refused.
    #[error("transaction {index} in the batch: {source}")]
    InBatch {
        /// Its place in the batch.
        index: usize,
        /// Why.
        #[source]
        source: Box<NodeError>,
    },
    /// More transactions in one batch than taken.
    #[error("more than {max} transactions in one batch")]
    BatchTooLarge {
        /// The most taken.
        max: usize,
    },
    /// A binary batch cut inside a frame's length.
    #[error("truncated frame length")]
    TruncatedFrame,
    /// A binary batch frame longer than what remains.
    #[error("frame {frame} claims {claimed} bytes, {remaining} remain")]
    FrameOverrun {
        /// The frame (from 0).
        frame: usize,
        /// The length it claims.
        claimed: usize,
        /// The bytes left.
        remaining: usize,
    },
    /// An amount of zero where value is asked for.
    #[error("amount must be positive")]
    ZeroAmount,
    /// A faucet request above the node's limit.
    #[error("faucet gives at most {max_cents} cents per request")]
    FaucetLimit {
        /// The limit, in cents.
        max_cents: u64,
    },
    /// A deposit without tokens.
    #[error("a deposit needs at least one token")]
    EmptyDeposit,
    /// A deposit of more tokens than taken in one request.
    #[error("a deposit may carry at most {max} tokens")]
    DepositTooLarge {
        /// The most taken.
        max: usize,
    },
    /// A mailbox message that is empty or too long.
    #[error("a message is 1 to {MAX_MAILBOX_MESSAGE} bytes")]
    MessageSize,
    /// A withdrawal the authority cannot honour.
    #[error(transparent)]
    Withdrawal(#[from] WithdrawalRefused),
    /// A message that cannot be sealed to its recipient.
    #[error(transparent)]
    Seal(#[from] florin_crypto::sealed::SealError),
    /// A configuration file that does not parse.
    #[error("{}: {source}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: BoxError,
    },
    /// An operator's reason longer than kept.
    #[error("a reason is at most {max} bytes")]
    ReasonTooLong {
        /// The most kept.
        max: usize,
    },
    /// A rare one-off refusal (configuration and setup commands), in words.
    #[error("{0}")]
    Other(String),
}

/// Why a withdrawal is refused (400).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WithdrawalRefused {
    /// The paying transaction is not a transfer.
    #[error("a withdrawal is paid by a transfer")]
    NotATransfer,
    /// The output index is past the transfer's outputs.
    #[error("no such output")]
    NoSuchOutput,
    /// The output pays someone else.
    #[error("that output does not pay the authority's reserve")]
    NotToReserve,
    /// The transfer is not confirmed on the ledger.
    #[error("the payment to the reserve is not confirmed")]
    NotConfirmed,
    /// The output was spent (and not withdrawn here).
    #[error("that reserve output is already spent")]
    AlreadySpent,
}

/// What was not found (404).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NotFound {
    /// A serial the registry does not know.
    #[error("token {} is unknown", hex::encode(.0))]
    Token(Serial),
    /// A transaction the ledger does not know.
    #[error("transaction {} is unknown", hex::encode(.0))]
    Transaction([u8; 32]),
    /// This node runs no token authority.
    #[error("this sentinel runs no token authority: use the cluster's api address")]
    NoAuthority,
    /// This node runs no ledger.
    #[error("this node runs no ledger")]
    NoLedger,
    /// Something else (cluster members), in words.
    #[error("{0}")]
    Other(String),
}

/// Why the caller may not do this (403).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Forbidden {
    /// The faucet is off on this node.
    #[error("the faucet is off on this node")]
    FaucetOff,
    /// A withdrawal not signed by whoever paid the reserve.
    #[error(
        "withdrawal not authorized: {0} (sign the request with the key of an input of the \
         transfer that paid the reserve)"
    )]
    Withdrawal(#[source] WithdrawAuthError),
    /// An operator credential that is refused (not an operator, expired, forged, replayed).
    #[error("operator credential refused: {0}")]
    Operator(#[source] crate::operator::OperatorRefused),
    /// The key (`role`: depositor, recipient, signer) was revoked by an operator.
    #[error(
        "{role} {key} is revoked by the operator: it can no longer deposit or withdraw ({reason})"
    )]
    Revoked {
        /// The key's role in the request.
        role: &'static str,
        /// The key (address).
        key: String,
        /// The operator's reason.
        reason: String,
    },
}

impl Forbidden {
    /// The stable code of this refusal (`NodeError::code`).
    pub fn code(&self) -> &'static str {
        match self {
            Forbidden::Revoked { .. } => "revoked",
            Forbidden::Operator(_) => "operator_refused",
            Forbidden::FaucetOff => "faucet_off",
            _ => "forbidden",
        }
    }
}

/// Why a withdrawal's authorization is refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WithdrawAuthError {
    /// No key and signature.
    #[error("the request carries no signature")]
    Missing,
    /// The key is not hex.
    #[error("the key is not hex")]
    KeyNotHex,
    /// The signature is not 64 bytes of hex.
    #[error("the signature is not 128 hex digits")]
    SignatureNotHex,
    /// The key is neither an Ed25519 nor a compressed P-256 key.
    #[error("the key is {0} bytes (32 for Ed25519, 33 for P-256)")]
    KeyLength(usize),
    /// The P-256 key does not parse.
    #[error("bad P-256 key ({0})")]
    P256Key(#[source] P256Error),
    /// The key owns none of the transfer's inputs.
    #[error("the key owns no input of the transfer")]
    NotAnInput,
    /// The Ed25519 signature does not verify.
    #[error("bad signature ({0})")]
    Signature(#[source] SignatureError),
    /// The P-256 signature does not verify.
    #[error("bad signature ({0})")]
    P256Signature(#[source] P256Error),
}

/// Why storage failed (500).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StorageError {
    /// redb.
    #[error(transparent)]
    Redb(#[from] redb::Error),
    /// redb, opening.
    #[error(transparent)]
    Database(#[from] redb::DatabaseError),
    /// redb, a transaction.
    #[error(transparent)]
    Transaction(#[from] redb::TransactionError),
    /// redb, a table.
    #[error(transparent)]
    Table(#[from] redb::TableError),
    /// redb, the storage layer.
    #[error(transparent)]
    Storage(#[from] redb::StorageError),
    /// redb, a commit.
    #[error(transparent)]
    Commit(#[from] redb::CommitError),
    /// The ledger's store.
    #[error(transparent)]
    Ledger(#[from] florin_ledger::StoreError),
    /// The cluster's replication.
    #[error(transparent)]
    Raft(#[from] florin_cluster::raft::RaftError),
    /// A cluster file or directory (`action`: read, write, create).
    #[error("cannot {action} {}: {source}", path.display())]
    File {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// A socket or other OS resource of the cluster.
    #[error(transparent)]
    Os(#[from] std::io::Error),
    /// A cluster member's server did not start.
    #[error(transparent)]
    Server(BoxError),
    /// The swap engine stopped or answered nothing.
    #[error("{0}")]
    Engine(&'static str),
    /// The reserve holds less than a credit needs.
    #[error(
        "the reserve holds {have} cents, less than the {need} to credit: tokens not backed by \
         the reserve"
    )]
    ReserveShort {
        /// Cents in the reserve.
        have: u64,
        /// Cents to credit.
        need: u64,
    },
    /// A credit's payment could not be built.
    #[error("crediting {cents} cents: {source}")]
    Credit {
        /// Cents to credit.
        cents: u64,
        /// The builder's error.
        #[source]
        source: florin_ledger::BuildError,
    },
    /// Something else the stored state or the storage layer breaks, in words.
    #[error("{0}")]
    Other(String),
    /// A replicated store could not take the write now (no leader reachable, or other
    /// writes kept coming first); nothing was written, and the same request may succeed
    /// later or at another node (503).
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Which quota a request would exceed (429).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Full {
    /// The recipient's mailbox holds as many messages, or bytes, as it may.
    #[error(
        "the recipient's mailbox is full ({messages} messages, {bytes} bytes waiting); \
         messages older than the retention time are removed, try again later"
    )]
    Mailbox {
        /// Messages waiting for the recipient.
        messages: u64,
        /// Their bytes.
        bytes: u64,
    },
    /// As many operator nonces are remembered as the node keeps (operator requests within the
    /// replay window).
    #[error(
        "too many operator requests within the replay window (at most {max}); try again later"
    )]
    OperatorNonces {
        /// The most remembered.
        max: usize,
    },
    /// Every mailbox together holds as many bytes as the node keeps.
    #[error("the node's mailboxes are full ({bytes} bytes waiting); try again later")]
    Mailboxes {
        /// Bytes waiting in all mailboxes.
        bytes: u64,
    },
}

/// What is corrupt (500).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Corrupt {
    /// A stored token, token record or ledger output that does not decode (every format
    /// shares one decode error).
    #[error(transparent)]
    Encoding(#[from] florin_token::DecodeError),
    /// A stored fraud proof.
    #[error(transparent)]
    Fraud(#[from] florin_token::FraudProofError),
    /// A stored record (named) that does not decode.
    #[error("{0}")]
    Record(&'static str),
    /// A key file whose contents are not a key.
    #[error("key file {}: {source}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why it is not a key.
        #[source]
        source: KeyError,
    },
    /// A database file refused on opening.
    #[error(transparent)]
    Database(#[from] crate::redb_open::RedbOpenError),
    /// A file that is damaged: `detail` says how.
    #[error("{}: {detail}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The damage.
        detail: String,
    },
    /// State that is missing or inconsistent, in words (with its remedy).
    #[error("{0}")]
    Other(String),
}

/// Why I/O failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum IoError {
    /// On a file or directory.
    #[error("{}: {source}", path.display())]
    File {
        /// The file or directory.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// On a key file.
    #[error("key file {}: {source}", path.display())]
    KeyFile {
        /// The key file.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// Creating the data directory.
    #[error("data dir {}: {source}", path.display())]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// Listening on an address.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// Elsewhere (sockets, threads, files named by the error itself).
    #[error(transparent)]
    Os(#[from] std::io::Error),
    /// A worker task that panicked or was cancelled.
    #[error("{what} failed: {source}")]
    Task {
        /// The task.
        what: &'static str,
        /// Why.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The OS's randomness.
    #[error(transparent)]
    Rng(#[from] rand::Error),
    /// Encoding a file's JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A database file that could not be made (a backup copy).
    #[error(transparent)]
    Database(#[from] crate::redb_open::RedbOpenError),
    /// Sealing a file for the disk.
    #[error(transparent)]
    Seal(#[from] florin_custody::CustodyError),
}

/// Why signing failed (503).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SignerFailure {
    /// The signer refused or is unreachable.
    #[error(transparent)]
    Signer(#[from] SignerError),
    /// A transaction could not be signed.
    #[error(transparent)]
    Build(#[from] florin_ledger::BuildError),
}

/// `From` each redb error for an error type with a `Storage(String)` variant.
macro_rules! storage_from {
    ($target:ident) => {
        $crate::error::storage_from!(
            $target:
            redb::Error,
            redb::DatabaseError,
            redb::TransactionError,
            redb::TableError,
            redb::StorageError,
            redb::CommitError
        );
    };
    ($target:ident: $($t:ty),*) => {$(
        impl From<$t> for $target {
            fn from(e: $t) -> Self {
                $target::Storage(e.to_string())
            }
        }
    )*};
}
pub(crate) use storage_from;

/// `From` each redb error for [`NodeError`], keeping it as the source.
macro_rules! node_storage_from {
    ($($t:ty),*) => {$(
        impl From<$t> for NodeError {
            fn from(e: $t) -> Self {
                NodeError::Storage(StorageError::from(e))
            }
        }
    )*};
}
node_storage_from!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    florin_ledger::StoreError
);

impl From<SignerError> for NodeError {
    fn from(e: SignerError) -> Self {
        NodeError::Signer(SignerFailure::Signer(e))
    }
}

impl From<WithdrawalRefused> for NodeError {
    fn from(e: WithdrawalRefused) -> Self {
        NodeError::BadRequest(BadRequest::Withdrawal(e))
    }
}

impl From<WithdrawAuthError> for NodeError {
    fn from(e: WithdrawAuthError) -> Self {
        NodeError::Forbidden(Forbidden::Withdrawal(e))
    }
}

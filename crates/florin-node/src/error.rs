//! Errors of the node's services.

use thiserror::Error;

/// Why a service call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The caller sent something invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// The thing asked for does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// A feature is off on this node (403).
    #[error("{0}")]
    Forbidden(String),
    /// Storage failed (500).
    #[error("storage: {0}")]
    Storage(String),
    /// Stored bytes are corrupt (500).
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// I/O on key or data files failed.
    #[error("{0}")]
    Io(String),
    /// The signer failed (503).
    #[error("signer: {0}")]
    Signer(String),
}

impl NodeError {
    /// A stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::NotFound(_) => "not_found",
            Self::Forbidden(_) => "forbidden",
            Self::Storage(_) => "storage",
            Self::Corrupt(_) => "corrupt",
            Self::Io(_) => "io",
            Self::Signer(_) => "signer",
        }
    }
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
storage_from!(NodeError);

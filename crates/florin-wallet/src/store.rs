//! Where a wallet lives. The file store writes atomically: a crash leaves either the old or the
//! new wallet, never a torn one.
//!
//! The file is JSON and carries its own checksum as its first field:
//!
//! ```text
//! {
//!   "checksum": "<64 hex>",
//!   "format": 1,
//!   ...
//! }
//! ```
//!
//! The checksum is `H("florin/wallet/file/v1", body)` (Florin's domain-separated SHA-256) of
//! the *body*: the file with the checksum line removed (`{` newline, then everything after the
//! checksum line). A file whose body does not hash to its checksum is refused on load, naming
//! the file and both values, and nothing is written. A file without a checksum line (written
//! before checksums existed) still loads — as long as it holds nothing but wallet fields, so a
//! damaged checksum line is not mistaken for an old file — and gets a checksum on its next
//! save.

use std::fs;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::wallet::Wallet;

/// Why a wallet could not be loaded or saved.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file is missing.
    #[error("no wallet at {0} (create one with `florin wallet new`)")]
    NotFound(PathBuf),
    /// The file exists already.
    #[error("a wallet already exists at {0}; refusing to overwrite it")]
    Exists(PathBuf),
    /// I/O failure.
    #[error("wallet file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file's content does not match its checksum: damaged on disk (or edited by hand).
    #[error(
        "wallet file {path} is damaged: its checksum says {expected}, but its content hashes to \
         {found}; nothing was changed — restore the file from a backup"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// The checksum the file carries.
        expected: String,
        /// What its content hashes to.
        found: String,
    },
    /// The file is not a wallet.
    #[error("wallet file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Persistence for a wallet.
pub trait WalletStore {
    /// Loads the wallet.
    fn load(&self) -> Result<Wallet, StoreError>;
    /// Saves the wallet durably.
    fn save(&self, wallet: &Wallet) -> Result<(), StoreError>;
    /// Saves a new wallet, refusing to overwrite an existing one.
    fn create(&self, wallet: &Wallet) -> Result<(), StoreError>;
}

/// A store whose wallet several callers may change side by side (the payee's sessions in
/// [`crate::peer::serve_payer`]): each change takes the lock, loads, changes, saves and lets go,
/// so no caller holds the wallet longer than one change.
pub trait LockingStore: WalletStore {
    /// The held lock, released on drop.
    type Lock<'a>
    where
        Self: 'a;
    /// Waits for and takes the wallet's exclusive lock.
    fn lock(&self) -> Result<Self::Lock<'_>, StoreError>;
}

/// A wallet in one JSON file (mode 0600 on Unix).
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
}

/// Domain of the wallet file's checksum.
pub const FILE_CHECKSUM_DOMAIN: &str = "florin/wallet/file/v1";
const HEAD: &[u8] = b"{\n  \"checksum\": \"";
const HEAD_END: &[u8] = b"\",\n";

fn checksum_hex(body: &[u8]) -> String {
    hex::encode(florin_crypto::hash(FILE_CHECKSUM_DOMAIN, &[body]))
}

/// Adds the checksum line to a wallet's JSON (`{` newline, fields…).
pub fn seal_file(body: &[u8]) -> Vec<u8> {
    let sum = checksum_hex(body);
    let mut out = Vec::with_capacity(body.len() + 96);
    out.extend_from_slice(HEAD);
    out.extend_from_slice(sum.as_bytes());
    out.extend_from_slice(HEAD_END);
    out.extend_from_slice(body.strip_prefix(b"{\n").unwrap_or(body));
    out
}

/// Checks a file's checksum and returns its body: `Ok(body)` for a file whose checksum
/// matches, `Ok(whole file)` for a file without a checksum line (older wallets), and
/// `Err((expected, found))` for a file whose content does not match.
pub fn open_file(bytes: &[u8]) -> Result<std::borrow::Cow<'_, [u8]>, (String, String)> {
    let Some(rest) = bytes.strip_prefix(HEAD) else {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    };
    let expected = rest
        .get(..64)
        .map(|h| String::from_utf8_lossy(h).into_owned())
        .unwrap_or_default();
    let Some(after) = rest.get(64..).and_then(|r| r.strip_prefix(HEAD_END)) else {
        return Err((
            expected,
            "nothing: the checksum line is malformed (expected 64 hex digits, a quote, a \
             comma and a newline)"
                .into(),
        ));
    };
    let mut body = b"{\n".to_vec();
    body.extend_from_slice(after);
    let found = checksum_hex(&body);
    if found != expected {
        return Err((expected, found));
    }
    Ok(std::borrow::Cow::Owned(body))
}

impl FileStore {
    /// A store at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileStore { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// An exclusive lock on a wallet file, held from load to save so that two commands never
/// spend the same tokens at once. Released on drop.
#[derive(Debug)]
pub struct WalletLock {
    _file: fs::File,
}

impl FileStore {
    /// Waits for and takes the wallet's exclusive lock (a `.lock` file beside it).
    pub fn lock(&self) -> Result<WalletLock, StoreError> {
        let mut name = self.path.as_os_str().to_owned();
        name.push(".lock");
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(PathBuf::from(name))
            .map_err(|e| self.io(e))?;
        file.lock().map_err(|e| self.io(e))?;
        Ok(WalletLock { _file: file })
    }
}

impl LockingStore for FileStore {
    type Lock<'a> = WalletLock;

    fn lock(&self) -> Result<WalletLock, StoreError> {
        FileStore::lock(self)
    }
}

impl WalletStore for FileStore {
    fn load(&self) -> Result<Wallet, StoreError> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotFound(self.path.clone()))
            }
            Err(e) => return Err(self.io(e)),
        };
        let body = open_file(&bytes).map_err(|(expected, found)| StoreError::Damaged {
            path: self.path.clone(),
            expected,
            found,
        })?;
        Wallet::from_json(&body).map_err(|reason| StoreError::Corrupt {
            path: self.path.clone(),
            reason,
        })
    }

    fn save(&self, wallet: &Wallet) -> Result<(), StoreError> {
        let json = seal_file(&wallet.to_json());
        // Owner-only, atomic and durable: the wallet holds its secret key.
        florin_fs::write_private(&self.path, &[&json]).map_err(|e| self.io(e))
    }

    fn create(&self, wallet: &Wallet) -> Result<(), StoreError> {
        if self.path.exists() {
            return Err(StoreError::Exists(self.path.clone()));
        }
        self.save(wallet)
    }
}

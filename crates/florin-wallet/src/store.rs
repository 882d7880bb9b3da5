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
//!
//! **Encrypted at rest** (format 2): the body is an envelope instead of the wallet's fields.
//!
//! ```text
//! {
//!   "checksum": "<64 hex>",
//!   "format": 2,
//!   "address": "<the wallet's address>",
//!   "kdf": { "algorithm": "argon2id", "memory_kib": 65536, "iterations": 3,
//!            "parallelism": 1, "salt": "<32 hex>" },
//!   "cipher": "xchacha20poly1305",
//!   "nonce": "<48 hex>",
//!   "ciphertext": "<hex: the format-1 wallet JSON, sealed>"
//! }
//! ```
//!
//! The key is Argon2id of the passphrase (64 MiB, 3 passes: RFC 9106's second recommended
//! setting); the AEAD's associated data binds the format, address, KDF and cipher, so none can
//! be changed or swapped without the file failing to open. A fresh random nonce seals every
//! save. The checksum still covers the whole envelope, so a damaged byte reads as **damaged**
//! (naming the file), and only a file whose checksum holds but whose seal does not open reads
//! as a **wrong passphrase**: neither changes the file. The address stays readable without the
//! passphrase (it is public).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use florin_crypto::PublicKey;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::Zeroizing;

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
    /// The file is encrypted and no passphrase could be had.
    #[error("wallet file {path} is encrypted and no passphrase was given: {reason}")]
    Locked {
        /// The file.
        path: PathBuf,
        /// Why none was given.
        reason: String,
    },
    /// The passphrase does not open the file. Nothing was changed.
    #[error("wrong passphrase for wallet file {path}; nothing was changed")]
    WrongPassphrase {
        /// The file.
        path: PathBuf,
    },
    /// The wallet was exported to another file (moved): it refuses to spend, so the two copies
    /// never spend the same money.
    #[error(
        "the wallet in {path} was moved to {to:?} by `florin wallet export`; use that file, or \
         take it back here with `florin wallet import`"
    )]
    Moved {
        /// The file.
        path: PathBuf,
        /// Where it went.
        to: String,
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

/// Where a store gets a passphrase when the file turns out to be encrypted (a terminal
/// prompt, an environment variable): `Err` says why none can be had.
pub type PassphraseSource = Arc<dyn Fn() -> Result<Zeroizing<String>, String> + Send + Sync>;

/// A wallet in one JSON file (mode 0600 on Unix), in the clear or encrypted under a passphrase.
/// Clones share what they learned: the key derived from the passphrase is kept in memory after
/// the first load, so saves do not run the KDF again.
#[derive(Clone)]
pub struct FileStore {
    path: PathBuf,
    passphrase: Option<PassphraseSource>,
    sealing: Arc<Mutex<Sealing>>,
    read_moved: bool,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("path", &self.path)
            .field("encrypted", &self.is_encrypted())
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
enum Sealing {
    /// Not known yet (nothing loaded or chosen).
    Unknown,
    /// Saved in the clear.
    Plain,
    /// Saved encrypted under this key.
    Encrypted(Arc<FileKey>),
}

struct FileKey {
    kdf: Kdf,
    key: Zeroizing<[u8; 32]>,
}

/// The passphrase KDF's settings, as stored in an encrypted wallet file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kdf {
    /// Always `argon2id`.
    pub algorithm: String,
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
    /// 16 random bytes, hex.
    pub salt: String,
}

/// Memory of the KDF for new files (64 MiB).
pub const KDF_MEMORY_KIB: u32 = 64 * 1024;
/// Passes of the KDF for new files.
pub const KDF_ITERATIONS: u32 = 3;
/// Largest KDF memory a file may ask for (256 MiB, four times the default): a hostile file
/// cannot make a load allocate more, or run for long.
pub const KDF_MAX_MEMORY_KIB: u32 = 256 * 1024;
const KDF_MAX_ITERATIONS: u32 = 8;
const KDF_MAX_PARALLELISM: u32 = 4;
const ENCRYPTED_FORMAT: u32 = 2;
const CIPHER: &str = "xchacha20poly1305";
const AAD_DOMAIN: &[u8] = b"florin/wallet/file/v2\n";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    format: u32,
    address: PublicKey,
    kdf: Kdf,
    cipher: String,
    nonce: String,
    ciphertext: String,
}

impl Envelope {
    fn aad(&self) -> Vec<u8> {
        let head = (self.format, &self.address, &self.kdf, &self.cipher);
        let mut aad = AAD_DOMAIN.to_vec();
        aad.extend_from_slice(&serde_json::to_vec(&head).unwrap_or_default());
        aad
    }
}

/// Only the format number, to tell an envelope from a wallet.
#[derive(Deserialize)]
struct Probe {
    format: Option<u32>,
}

impl Kdf {
    fn fresh() -> Kdf {
        let mut salt = [0u8; 16];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        Kdf {
            algorithm: "argon2id".into(),
            memory_kib: KDF_MEMORY_KIB,
            iterations: KDF_ITERATIONS,
            parallelism: 1,
            salt: hex::encode(salt),
        }
    }

    fn check(&self) -> Result<Vec<u8>, String> {
        if self.algorithm != "argon2id" {
            return Err(format!("unknown KDF {:?}", self.algorithm));
        }
        if self.memory_kib > KDF_MAX_MEMORY_KIB
            || self.iterations == 0
            || self.iterations > KDF_MAX_ITERATIONS
            || self.parallelism == 0
            || self.parallelism > KDF_MAX_PARALLELISM
        {
            return Err("KDF settings out of bounds".into());
        }
        let salt = hex::decode(&self.salt).map_err(|_| "KDF salt is not hex".to_string())?;
        if salt.len() < 16 || salt.len() > 64 {
            return Err("KDF salt must be 16 to 64 bytes".into());
        }
        Ok(salt)
    }

    fn derive(&self, passphrase: &str) -> Result<FileKey, String> {
        let salt = self.check()?;
        let params =
            argon2::Params::new(self.memory_kib, self.iterations, self.parallelism, Some(32))
                .map_err(|e| format!("KDF settings: {e}"))?;
        let kdf = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut key = Zeroizing::new([0u8; 32]);
        kdf.hash_password_into(passphrase.as_bytes(), &salt, key.as_mut())
            .map_err(|e| format!("KDF: {e}"))?;
        Ok(FileKey {
            kdf: self.clone(),
            key,
        })
    }
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
        FileStore {
            path: path.into(),
            passphrase: None,
            sealing: Arc::new(Mutex::new(Sealing::Unknown)),
            read_moved: false,
        }
    }

    /// Where to get the passphrase if the file is encrypted (asked at most once per store).
    pub fn with_passphrase(mut self, source: PassphraseSource) -> Self {
        self.passphrase = Some(source);
        self
    }

    /// Loads a wallet even if it was moved by an export (to show its address and balance, or
    /// to take it back by import).
    pub fn reading_moved(mut self) -> Self {
        self.read_moved = true;
        self
    }

    fn sealing(&self) -> Sealing {
        match self.sealing.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set_sealing(&self, s: Sealing) {
        match self.sealing.lock() {
            Ok(mut g) => *g = s,
            Err(p) => *p.into_inner() = s,
        }
    }

    /// Whether saves write the file encrypted.
    pub fn is_encrypted(&self) -> bool {
        matches!(self.sealing(), Sealing::Encrypted(_))
    }

    /// From now on, saves encrypt the file under `passphrase` (a fresh salt: the KDF runs
    /// once, here). Used to create an encrypted wallet or to change a passphrase.
    pub fn encrypt_with(&self, passphrase: &str) -> Result<(), StoreError> {
        let key = Kdf::fresh()
            .derive(passphrase)
            .map_err(|reason| self.corrupt(reason))?;
        self.set_sealing(Sealing::Encrypted(Arc::new(key)));
        Ok(())
    }

    /// Saves the wallet under the same passphrase key as `other` (an export keeps the
    /// passphrase of the wallet it came from).
    pub fn seal_like(&self, other: &FileStore) {
        self.set_sealing(other.sealing());
    }

    /// From now on, saves write the file in the clear (tests, demos, or removing a
    /// passphrase).
    pub fn write_plain(&self) {
        self.set_sealing(Sealing::Plain);
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            reason,
        }
    }

    /// Whether the file on disk is encrypted (without opening it).
    pub fn file_is_encrypted(&self) -> Result<bool, StoreError> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(self.io(e)),
        };
        let body = open_file(&bytes).map_err(|(expected, found)| StoreError::Damaged {
            path: self.path.clone(),
            expected,
            found,
        })?;
        Ok(serde_json::from_slice::<Probe>(&body)
            .ok()
            .and_then(|p| p.format)
            == Some(ENCRYPTED_FORMAT))
    }

    /// The address an encrypted file declares, readable without its passphrase but not
    /// verified (`false`: whoever can write the file can change it; opening the file checks
    /// it), or the wallet's own address (`true`) for a file in the clear.
    pub fn declared_address(&self) -> Result<(PublicKey, bool), StoreError> {
        let bytes = self.read()?;
        let body = self.checked(&bytes)?;
        if let Ok(env) = serde_json::from_slice::<Envelope>(&body) {
            return Ok((env.address, false));
        }
        self.load().map(|w| (w.public_key(), true))
    }

    fn read(&self) -> Result<Vec<u8>, StoreError> {
        match fs::read(&self.path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NotFound(self.path.clone()))
            }
            Err(e) => Err(self.io(e)),
        }
    }

    fn checked<'b>(&self, bytes: &'b [u8]) -> Result<std::borrow::Cow<'b, [u8]>, StoreError> {
        open_file(bytes).map_err(|(expected, found)| StoreError::Damaged {
            path: self.path.clone(),
            expected,
            found,
        })
    }

    /// Opens an encrypted envelope: the key in memory if its KDF settings match, else one
    /// derived from the passphrase source.
    fn open_envelope(&self, body: &[u8]) -> Result<Wallet, StoreError> {
        let env: Envelope = serde_json::from_slice(body)
            .map_err(|e| self.corrupt(format!("encrypted envelope: {e}")))?;
        if env.cipher != CIPHER {
            return Err(self.corrupt(format!("unknown cipher {:?}", env.cipher)));
        }
        env.kdf.check().map_err(|r| self.corrupt(r))?;
        let nonce = hex::decode(&env.nonce)
            .ok()
            .filter(|n| n.len() == 24)
            .ok_or_else(|| self.corrupt("the nonce is not 24 bytes of hex".into()))?;
        let ciphertext = hex::decode(&env.ciphertext)
            .map_err(|_| self.corrupt("the ciphertext is not hex".into()))?;
        let key = match self.sealing() {
            Sealing::Encrypted(k) if k.kdf == env.kdf => k,
            _ => {
                let source = self.passphrase.as_ref().ok_or_else(|| StoreError::Locked {
                    path: self.path.clone(),
                    reason: "this program has no way to ask for one".into(),
                })?;
                let pass = source().map_err(|reason| StoreError::Locked {
                    path: self.path.clone(),
                    reason,
                })?;
                Arc::new(env.kdf.derive(&pass).map_err(|r| self.corrupt(r))?)
            }
        };
        let cipher = XChaCha20Poly1305::new(key.key.as_ref().into());
        let plain = Zeroizing::new(
            cipher
                .decrypt(
                    XNonce::from_slice(&nonce),
                    Payload {
                        msg: &ciphertext,
                        aad: &env.aad(),
                    },
                )
                .map_err(|_| StoreError::WrongPassphrase {
                    path: self.path.clone(),
                })?,
        );
        let wallet = Wallet::from_json(&plain).map_err(|r| self.corrupt(r))?;
        if wallet.public_key() != env.address {
            return Err(self
                .corrupt("the envelope's address is not the address of the wallet inside".into()));
        }
        self.set_sealing(Sealing::Encrypted(key));
        Ok(wallet)
    }

    fn seal(&self, key: &FileKey, wallet: &Wallet) -> Result<Vec<u8>, StoreError> {
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let mut env = Envelope {
            format: ENCRYPTED_FORMAT,
            address: wallet.public_key(),
            kdf: key.kdf.clone(),
            cipher: CIPHER.into(),
            nonce: hex::encode(nonce),
            ciphertext: String::new(),
        };
        let plain = Zeroizing::new(wallet.to_json());
        let cipher = XChaCha20Poly1305::new(key.key.as_ref().into());
        let sealed = cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &plain,
                    aad: &env.aad(),
                },
            )
            .map_err(|_| self.corrupt("encryption failed".into()))?;
        env.ciphertext = hex::encode(sealed);
        let json = serde_json::to_vec_pretty(&env)
            .map_err(|e| self.corrupt(format!("encoding the envelope: {e}")))?;
        Ok(seal_file(&json))
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
        let bytes = self.read()?;
        let body = self.checked(&bytes)?;
        let encrypted = serde_json::from_slice::<Probe>(&body)
            .ok()
            .and_then(|p| p.format)
            == Some(ENCRYPTED_FORMAT);
        let wallet = if encrypted {
            if matches!(body, std::borrow::Cow::Borrowed(_)) {
                // Encrypted files were never written without a checksum: the line is damaged.
                return Err(self.corrupt(
                    "an encrypted wallet without its checksum line (the line is damaged)".into(),
                ));
            }
            self.open_envelope(&body)?
        } else {
            let w = Wallet::from_json(&body).map_err(|reason| self.corrupt(reason))?;
            // What the file is now decides how it is saved (a passphrase removed by another
            // process is not put back by a key this one still holds).
            self.set_sealing(Sealing::Plain);
            w
        };
        if let (Some(to), false) = (wallet.moved_to(), self.read_moved) {
            return Err(StoreError::Moved {
                path: self.path.clone(),
                to: to.to_string(),
            });
        }
        Ok(wallet)
    }

    fn save(&self, wallet: &Wallet) -> Result<(), StoreError> {
        let json = match self.sealing() {
            Sealing::Encrypted(key) => self.seal(&key, wallet)?,
            Sealing::Plain => seal_file(&wallet.to_json()),
            Sealing::Unknown => {
                // Never loaded or chosen: never write over an encrypted file in the clear.
                if self.file_is_encrypted()? {
                    return Err(StoreError::Locked {
                        path: self.path.clone(),
                        reason: "the file is encrypted: load it (with its passphrase) before \
                                 saving over it"
                            .into(),
                    });
                }
                seal_file(&wallet.to_json())
            }
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn pass(p: &'static str) -> PassphraseSource {
        Arc::new(move || Ok(Zeroizing::new(p.to_string())))
    }

    fn wallet() -> Wallet {
        Wallet::generate(&mut rand::rngs::StdRng::seed_from_u64(3), None)
    }

    #[test]
    fn an_encrypted_wallet_opens_with_its_passphrase_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.json");
        let w = wallet();
        let store = FileStore::new(&path);
        let t = std::time::Instant::now();
        store.encrypt_with("correct horse").unwrap();
        eprintln!("argon2id 64 MiB × 3: {:?}", t.elapsed());
        store.create(&w).unwrap();
        let bytes = fs::read(&path).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("\"format\": 2") && text.contains("argon2id"));
        // Nothing secret in the clear: not the key, not the words.
        assert!(!text.contains(&w.signer().secret().to_hex()));
        let words = w.backup_words().unwrap().phrase().to_string();
        assert!(!text.contains(&words));

        let opened = FileStore::new(&path)
            .with_passphrase(pass("correct horse"))
            .load()
            .unwrap();
        assert_eq!(opened.public_key(), w.public_key());
        assert_eq!(
            opened.backup_words().unwrap().phrase(),
            w.backup_words().unwrap().phrase()
        );
        // Without the passphrase the address is still readable (unverified).
        assert_eq!(
            FileStore::new(&path).declared_address().unwrap(),
            (w.public_key(), false)
        );

        let e = FileStore::new(&path)
            .with_passphrase(pass("wrong"))
            .load()
            .err()
            .unwrap();
        assert!(matches!(e, StoreError::WrongPassphrase { .. }), "{e}");
        let e = FileStore::new(&path).load().err().unwrap();
        assert!(matches!(e, StoreError::Locked { .. }), "{e}");
        // A store that never opened the file does not write over it in the clear.
        let e = FileStore::new(&path).save(&w).err().unwrap();
        assert!(matches!(e, StoreError::Locked { .. }), "{e}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "refusals changed the file");

        // Saving again reseals under the same key with a fresh nonce.
        let again = FileStore::new(&path).with_passphrase(pass("correct horse"));
        let w2 = again.load().unwrap();
        again.save(&w2).unwrap();
        let resealed = fs::read(&path).unwrap();
        assert_ne!(resealed, bytes);
        assert!(again.is_encrypted());
    }

    #[test]
    fn a_damaged_byte_is_damage_not_a_wrong_passphrase() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.json");
        let store = FileStore::new(&path);
        store.encrypt_with("pw").unwrap();
        store.create(&wallet()).unwrap();
        let good = fs::read(&path).unwrap();
        let at = good.len() - 20;
        let mut bad = good.clone();
        bad[at] ^= 1;
        fs::write(&path, &bad).unwrap();
        let e = FileStore::new(&path)
            .with_passphrase(pass("pw"))
            .load()
            .err()
            .unwrap();
        assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
        assert!(e.to_string().contains("w.json"));
        assert_eq!(fs::read(&path).unwrap(), bad);
    }

    #[test]
    fn hostile_envelopes_are_refused_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.json");
        let store = FileStore::new(&path);
        store.encrypt_with("pw").unwrap();
        store.create(&wallet()).unwrap();
        let body = open_file(&fs::read(&path).unwrap()).unwrap().into_owned();
        let env: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let cases: Vec<(&str, serde_json::Value)> = vec![
            ("memory_kib", serde_json::json!(u32::MAX)),
            ("iterations", serde_json::json!(0)),
            ("algorithm", serde_json::json!("scrypt")),
            ("salt", serde_json::json!("00")),
        ];
        for (field, value) in cases {
            let mut e = env.clone();
            e["kdf"][field] = value;
            let sealed = seal_file(&serde_json::to_vec_pretty(&e).unwrap());
            fs::write(&path, &sealed).unwrap();
            let err = FileStore::new(&path)
                .with_passphrase(pass("pw"))
                .load()
                .err()
                .unwrap();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{field}: {err}");
        }
        // A changed address (under a valid checksum) does not open: it is bound to the seal.
        let mut e = env.clone();
        e["address"] = serde_json::json!(wallet_other().public_key());
        fs::write(&path, seal_file(&serde_json::to_vec_pretty(&e).unwrap())).unwrap();
        let err = FileStore::new(&path)
            .with_passphrase(pass("pw"))
            .load()
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::WrongPassphrase { .. }), "{err}");
        // An envelope whose checksum line is gone is not taken for an old file.
        let unsealed = serde_json::to_vec_pretty(&env).unwrap();
        fs::write(&path, &unsealed).unwrap();
        let err = FileStore::new(&path)
            .with_passphrase(pass("pw"))
            .load()
            .err()
            .unwrap();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }

    fn wallet_other() -> Wallet {
        Wallet::generate(&mut rand::rngs::StdRng::seed_from_u64(4), None)
    }

    #[test]
    fn a_moved_wallet_refuses_to_load_for_spending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.json");
        let mut w = wallet();
        w.set_moved_to(Some("/elsewhere.json".into()));
        FileStore::new(&path).create(&w).unwrap();
        let e = FileStore::new(&path).load().err().unwrap();
        assert!(matches!(e, StoreError::Moved { .. }), "{e}");
        assert!(e.to_string().contains("/elsewhere.json"));
        let read = FileStore::new(&path).reading_moved().load().unwrap();
        assert_eq!(read.moved_to(), Some("/elsewhere.json"));
    }
}

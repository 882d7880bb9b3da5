//! Keys on disk: created on first start, 0600, written atomically.

use std::fs;
use std::path::Path;

use florin_crypto::SecretKey;
use rand::rngs::OsRng;

use crate::error::{Corrupt, IoError, NodeError};

/// Loads the key at `path`, or creates it if the file does not exist.
pub fn load_or_create_key(path: &Path) -> Result<SecretKey, NodeError> {
    match fs::read_to_string(path) {
        Ok(s) => SecretKey::from_hex(s.trim()).map_err(|source| {
            Corrupt::KeyFile {
                path: path.into(),
                source,
            }
            .into()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = SecretKey::generate(&mut OsRng);
            write_private(path, key.to_hex().as_bytes())?;
            Ok(key)
        }
        Err(source) => Err(IoError::KeyFile {
            path: path.into(),
            source,
        }
        .into()),
    }
}

/// Loads the key at `path`, which must exist: for a service whose key was created when its
/// directory was initialized (a missing key is never replaced by a new one).
pub fn load_key(path: &Path) -> Result<SecretKey, NodeError> {
    match fs::read_to_string(path) {
        Ok(s) => SecretKey::from_hex(s.trim()).map_err(|source| {
            Corrupt::KeyFile {
                path: path.into(),
                source,
            }
            .into()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NodeError::corrupt(format!(
            "key file {} is missing: refusing to create a new key over existing state (restore it from a backup)",
            path.display()
        ))),
        Err(source) => Err(IoError::KeyFile {
            path: path.into(),
            source,
        }
        .into()),
    }
}

/// Writes `bytes` to `path` atomically and durably, readable by the owner only
/// ([`florin_fs::write_private`]).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    // The error names the file.
    florin_fs::write_private(path, &[bytes]).map_err(|e| IoError::Os(e).into())
}

/// Syncs the directory holding `path`, making a rename into it durable.
pub fn sync_dir(path: &Path) -> Result<(), NodeError> {
    // The error names the directory.
    florin_fs::sync_parent(path).map_err(|e| IoError::Os(e).into())
}

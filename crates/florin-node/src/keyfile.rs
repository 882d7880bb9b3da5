//! Keys on disk: created on first start, 0600, written atomically.

use std::fs;
use std::io::Write;
use std::path::Path;

use florin_crypto::SecretKey;
use rand::rngs::OsRng;

use crate::error::NodeError;

/// Loads the key at `path`, or creates it if the file does not exist.
pub fn load_or_create_key(path: &Path) -> Result<SecretKey, NodeError> {
    match fs::read_to_string(path) {
        Ok(s) => SecretKey::from_hex(s.trim())
            .map_err(|e| NodeError::Corrupt(format!("key file {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = SecretKey::generate(&mut OsRng);
            write_private(path, key.to_hex().as_bytes())?;
            Ok(key)
        }
        Err(e) => Err(NodeError::Io(format!("key file {}: {e}", path.display()))),
    }
}

/// Loads the key at `path`, which must exist: for a service whose key was created when its
/// directory was initialized (a missing key is never replaced by a new one).
pub fn load_key(path: &Path) -> Result<SecretKey, NodeError> {
    match fs::read_to_string(path) {
        Ok(s) => SecretKey::from_hex(s.trim())
            .map_err(|e| NodeError::Corrupt(format!("key file {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NodeError::Corrupt(format!(
            "key file {} is missing: refusing to create a new key over existing state (restore it from a backup)",
            path.display()
        ))),
        Err(e) => Err(NodeError::Io(format!("key file {}: {e}", path.display()))),
    }
}

/// Writes `bytes` to `path` atomically and durably, readable by the owner only: a temporary
/// file created with mode 0600, synced, renamed over `path`, and the directory synced.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    // The whole name plus a suffix: `K.share` and `K.p256` must not share a temporary file.
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let _ = fs::remove_file(&tmp);
    let io = |e: std::io::Error| NodeError::Io(format!("{}: {e}", path.display()));
    let mut opts = fs::OpenOptions::new();
    // create_new: the mode applies to a file we create, never to a leftover.
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)?;
    // The rename is durable only once the directory is synced.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    }
    Ok(())
}

/// Syncs the directory holding `path`, making a rename into it durable.
pub fn sync_dir(path: &Path) -> Result<(), NodeError> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| NodeError::Io(format!("{}: {e}", dir.display()))),
        None => Ok(()),
    }
}

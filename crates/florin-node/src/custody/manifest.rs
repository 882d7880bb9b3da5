//! A node's record of the keys it has committed (`DIR/keys.sealed`): key name → scheme
//! (`frost` or `ecdsa`), sealed under the node's key-encryption key like its shares (so damage
//! and a wrong seal key are both detected), written atomically at every commit.
//!
//! It is what lets a node tell a share file that was lost (deleted, or the whole `shares/`
//! directory) from a key it never held: a key in the record whose file is missing or does not
//! open is *lost* — the node starts, serves its other keys, refuses that one naming the file,
//! and `florin custody repair` restores it. A share is never regenerated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use florin_custody::{vault, PartyId};
use rand::rngs::OsRng;

use crate::error::NodeError;
use crate::keyfile::write_private;

/// The record's file in the node's directory.
pub(super) fn path(dir: &Path) -> PathBuf {
    dir.join("keys.sealed")
}

fn name(party: PartyId) -> String {
    format!("florin/custody/keys/{party}")
}

/// The committed keys; `None` if the node has no record yet.
pub(super) fn load(
    dir: &Path,
    kek: &[u8; 32],
    party: PartyId,
    seal_path: &Path,
) -> Result<Option<BTreeMap<String, String>>, NodeError> {
    let p = path(dir);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(NodeError::io_at(&p, e)),
    };
    let plain = vault::open(kek, &name(party), &bytes).map_err(|_| {
        NodeError::corrupt(format!(
            "{}: damaged or sealed under another seal key than {} ({} bytes; expected the \
             node's sealed record of its keys)",
            p.display(),
            seal_path.display(),
            bytes.len()
        ))
    })?;
    serde_json::from_slice(&plain).map(Some).map_err(|e| {
        crate::error::Corrupt::File {
            detail: e.to_string(),
            path: p.clone(),
        }
        .into()
    })
}

/// Replaces the record, atomically and durably.
pub(super) fn store(
    dir: &Path,
    kek: &[u8; 32],
    party: PartyId,
    keys: &BTreeMap<String, String>,
) -> Result<(), NodeError> {
    let json = serde_json::to_vec(keys).map_err(crate::error::IoError::from)?;
    let sealed =
        vault::seal(kek, &name(party), &json, &mut OsRng).map_err(crate::error::IoError::from)?;
    write_private(&path(dir), &sealed)
}

//! A data directory's manifest: written when the directory is first initialized, it says what
//! the directory must hold from then on, so that a later start which finds a required file
//! missing or emptied refuses instead of quietly creating a fresh one (a fresh key over an
//! existing ledger, an empty registry that no longer knows the tokens in circulation, an empty
//! ledger served with health 200).
//!
//! `manifest.json` holds the manifest and a SHA-256 of its canonical JSON, so damage to the
//! manifest itself is refused too. Only a directory that holds a manifest is held to it: the
//! first start of an empty or absent directory initializes it, and a directory written before
//! manifests existed is adopted (its manifest written) only if it holds every required file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Corrupt, IoError, NodeError};
use crate::keyfile::write_private;

/// The manifest's file name in a data directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The manifest's format version.
const FORMAT: u32 = 1;

/// What a data directory must hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub format: u32,
    /// What kind of directory: "devnet", "cluster-authority", …
    pub kind: String,
    /// Unix seconds of the first initialization.
    pub created_at: u64,
    /// Public keys the directory's services sign with, by role ("authority", "issuer"): a
    /// key file replaced by another key is refused.
    pub keys: Vec<(String, String)>,
    /// Files (relative paths) that must exist and be non-empty.
    pub files: Vec<String>,
    /// Written before the first start creates anything and cleared once it finished: a first
    /// start that failed or was killed half-way is simply continued, never held to files it
    /// had not created yet.
    #[serde(default)]
    pub initializing: bool,
}

#[derive(Serialize, Deserialize)]
struct Sealed {
    manifest: Manifest,
    sha256: String,
}

fn digest(m: &Manifest) -> Result<String, NodeError> {
    let bytes = serde_json::to_vec(m).map_err(IoError::from)?;
    Ok(hex::encode(florin_crypto::hash(
        "florin/manifest/v1",
        &[&bytes],
    )))
}

impl Manifest {
    /// A manifest for a directory of `kind` requiring `files`, with the keys of each role.
    pub fn new(kind: &str, keys: Vec<(String, String)>, files: Vec<String>) -> Self {
        Manifest {
            format: FORMAT,
            kind: kind.into(),
            created_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            keys,
            files,
            initializing: false,
        }
    }

    /// The manifest a first start writes before it creates anything.
    pub fn provisional(kind: &str, files: Vec<String>) -> Self {
        Manifest {
            initializing: true,
            ..Manifest::new(kind, Vec::new(), files)
        }
    }

    /// The manifest of `dir`, `None` if it has none; refuses a damaged one.
    pub fn load(dir: &Path) -> Result<Option<Manifest>, NodeError> {
        let path = dir.join(MANIFEST_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(NodeError::io_at(path, e)),
        };
        let sealed: Sealed = serde_json::from_slice(&bytes).map_err(|e| {
            NodeError::Corrupt(Corrupt::File {
                detail: format!(
                    "damaged at byte {}: expected the manifest's JSON ({e})",
                    byte_of(&bytes, e.line(), e.column())
                ),
                path: path.clone(),
            })
        })?;
        let want = digest(&sealed.manifest)?;
        if want != sealed.sha256 {
            return Err(Corrupt::File {
                detail: format!(
                    "damaged: expected sha256 {want} of the manifest, found {}",
                    sealed.sha256
                ),
                path,
            }
            .into());
        }
        if sealed.manifest.format != FORMAT {
            return Err(Corrupt::File {
                detail: format!(
                    "format {} is not known to this build (expected {FORMAT})",
                    sealed.manifest.format
                ),
                path,
            }
            .into());
        }
        Ok(Some(sealed.manifest))
    }

    /// Writes the manifest into `dir` (atomically and durably).
    pub fn save(&self, dir: &Path) -> Result<(), NodeError> {
        let sealed = Sealed {
            manifest: self.clone(),
            sha256: digest(self)?,
        };
        let mut bytes = serde_json::to_vec_pretty(&sealed).map_err(IoError::from)?;
        bytes.push(b'\n');
        write_private(&dir.join(MANIFEST_FILE), &bytes)
    }

    /// Refuses if a required file is missing or empty.
    pub fn verify_files(&self, dir: &Path) -> Result<(), NodeError> {
        for f in &self.files {
            check_present(&dir.join(f), &dir.join(MANIFEST_FILE))?;
        }
        Ok(())
    }

    /// Refuses if the key of `role` is not the one the manifest recorded.
    pub fn verify_key(&self, role: &str, address: &str, dir: &Path) -> Result<(), NodeError> {
        match self.keys.iter().find(|(r, _)| r == role) {
            Some((_, want)) if want != address => Err(NodeError::corrupt(format!(
                "{}: the {role} key is {address}, but this directory was initialized with {want}: a key file was replaced; restore the original (or a backup) instead of starting with a new key",
                dir.display()
            ))),
            _ => Ok(()),
        }
    }
}

/// Refuses a missing or empty file (or directory) that `manifest` requires.
fn check_present(path: &Path, manifest: &Path) -> Result<(), NodeError> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() || m.len() > 0 => Ok(()),
        Ok(_) => Err(NodeError::corrupt(format!(
            "{} is empty, but {} says this directory holds it: refusing to start rather than recreate it (restore it from a backup: florin node restore)",
            path.display(),
            manifest.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(NodeError::corrupt(format!(
            "{} is missing, but {} says this directory holds it: refusing to start rather than recreate it (restore it from a backup: florin node restore)",
            path.display(),
            manifest.display()
        ))),
        Err(e) => Err(NodeError::io_at(path, e)),
    }
}

/// Opening a data directory against its manifest.
#[derive(Debug)]
pub enum DirState {
    /// Nothing there yet: initialize it, then save this manifest.
    Fresh,
    /// Written before manifests: every required file is there; save the manifest once opened.
    Adopted,
    /// Held to its manifest, which checked out.
    Known(Manifest),
}

/// Checks `dir` before a service opens it: with a manifest, every file it requires must be
/// there; without one, either none of `required` exists (a first start) or all do (a directory
/// from before manifests); anything in between is refused, naming what is missing.
pub fn check_dir(dir: &Path, required: &[String]) -> Result<DirState, NodeError> {
    if let Some(m) = Manifest::load(dir)? {
        if m.initializing {
            // A first start that did not finish: continue it.
            return Ok(DirState::Fresh);
        }
        m.verify_files(dir)?;
        return Ok(DirState::Known(m));
    }
    let present: Vec<PathBuf> = required
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.exists())
        .collect();
    if present.is_empty() {
        return Ok(DirState::Fresh);
    }
    for f in required {
        let p = dir.join(f);
        match std::fs::metadata(&p) {
            Ok(m) if m.is_dir() || m.len() > 0 => {}
            _ => {
                return Err(NodeError::corrupt(format!(
                    "{} holds {} but not {} (missing or empty): refusing to start rather than recreate it",
                    dir.display(),
                    present
                        .iter()
                        .map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    f
                )))
            }
        }
    }
    Ok(DirState::Adopted)
}

/// The byte offset of a (1-based) line and column.
fn byte_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut l = 1;
    for (i, b) in bytes.iter().enumerate() {
        if l == line {
            return (i + column.saturating_sub(1)).min(bytes.len());
        }
        if *b == b'\n' {
            l += 1;
        }
    }
    bytes.len()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn files() -> Vec<String> {
        vec!["a.key".into(), "db".into(), "ledger/acked.bin".into()]
    }

    fn populate(dir: &Path) {
        std::fs::write(dir.join("a.key"), b"k").unwrap();
        std::fs::write(dir.join("db"), b"d").unwrap();
        std::fs::create_dir_all(dir.join("ledger")).unwrap();
        std::fs::write(dir.join("ledger/acked.bin"), b"m").unwrap();
    }

    #[test]
    fn fresh_adopted_and_known() {
        let d = tempfile::tempdir().unwrap();
        assert!(matches!(check_dir(d.path(), &files()), Ok(DirState::Fresh)));
        assert!(matches!(
            check_dir(&d.path().join("absent"), &files()),
            Ok(DirState::Fresh)
        ));
        populate(d.path());
        assert!(matches!(
            check_dir(d.path(), &files()),
            Ok(DirState::Adopted)
        ));
        let m = Manifest::new("test", vec![("authority".into(), "eur1x".into())], files());
        m.save(d.path()).unwrap();
        match check_dir(d.path(), &files()).unwrap() {
            DirState::Known(k) => assert_eq!(k, m),
            other => panic!("{other:?}"),
        }
        assert!(m.verify_key("authority", "eur1x", d.path()).is_ok());
        let e = m.verify_key("authority", "eur1y", d.path()).unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
    }

    #[test]
    fn an_unfinished_first_start_is_continued() {
        let d = tempfile::tempdir().unwrap();
        Manifest::provisional("test", files())
            .save(d.path())
            .unwrap();
        std::fs::write(d.path().join("a.key"), b"k").unwrap();
        assert!(matches!(check_dir(d.path(), &files()), Ok(DirState::Fresh)));
        populate(d.path());
        Manifest::new("test", vec![], files())
            .save(d.path())
            .unwrap();
        std::fs::remove_file(d.path().join("db")).unwrap();
        assert!(check_dir(d.path(), &files()).is_err());
    }

    #[test]
    fn a_missing_or_emptied_file_is_refused() {
        for (victim, empty) in [("a.key", false), ("db", true), ("ledger/acked.bin", false)] {
            let d = tempfile::tempdir().unwrap();
            populate(d.path());
            Manifest::new("test", vec![], files())
                .save(d.path())
                .unwrap();
            if empty {
                std::fs::write(d.path().join(victim), b"").unwrap();
            } else {
                std::fs::remove_file(d.path().join(victim)).unwrap();
            }
            let e = check_dir(d.path(), &files()).unwrap_err();
            assert!(e.to_string().contains(victim), "{e}");
        }
        // Without a manifest, a partial directory is refused too.
        let d = tempfile::tempdir().unwrap();
        populate(d.path());
        std::fs::remove_file(d.path().join("db")).unwrap();
        let e = check_dir(d.path(), &files()).unwrap_err();
        assert!(e.to_string().contains("not db"), "{e}");
    }

    #[test]
    fn a_damaged_manifest_is_refused() {
        let d = tempfile::tempdir().unwrap();
        populate(d.path());
        Manifest::new("test", vec![("issuer".into(), "eur1q".into())], files())
            .save(d.path())
            .unwrap();
        let p = d.path().join(MANIFEST_FILE);
        let good = std::fs::read(&p).unwrap();
        // A changed character in a value: the checksum catches it.
        let s = String::from_utf8(good.clone())
            .unwrap()
            .replace("eur1q", "eur1p");
        std::fs::write(&p, s).unwrap();
        assert!(check_dir(d.path(), &files())
            .unwrap_err()
            .to_string()
            .contains("sha256"));
        // Truncated: not JSON any more, refused naming an offset.
        std::fs::write(&p, &good[..good.len() / 2]).unwrap();
        assert!(check_dir(d.path(), &files())
            .unwrap_err()
            .to_string()
            .contains("damaged at byte"));
        // Emptied.
        std::fs::write(&p, b"").unwrap();
        assert!(check_dir(d.path(), &files()).is_err());
    }
}

//! The one way Florin replaces a small file on disk: atomically and durably.
//!
//! Keys, manifests, wallets, marks, Raft metadata and snapshots are written whole through
//! [`write_atomic`] (or [`write_private`] for secrets): the bytes go to a fresh temporary file
//! beside the target, which is synced, renamed over the target, and the directory is synced so
//! the rename itself survives a power cut. A reader therefore sees the old file or the new one,
//! never a mix, and a crash leaves at most a stray temporary file (named `.NAME.PID.N.tmp`),
//! never a half-written target.
//!
//! Errors are `std::io::Error`s whose message names the path and the step that failed; callers
//! wrap them in their own typed errors.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn context(path: &Path, step: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {step}: {e}", path.display()))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Syncs directory `dir`, making a rename or a file creation in it durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| context(dir, "cannot sync the directory", e))
}

/// Syncs the directory holding `path`.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    sync_dir(&parent(path))
}

/// Replaces `path` with `parts` (written one after the other), atomically and durably.
pub fn write_atomic(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    write(path, parts, None)
}

/// [`write_atomic`] for secrets: the file is created readable and writable by its owner only
/// (mode 0600 on Unix) before any byte is written.
pub fn write_private(path: &Path, parts: &[&[u8]]) -> io::Result<()> {
    write(path, parts, Some(0o600))
}

fn write(path: &Path, parts: &[&[u8]], mode: Option<u32>) -> io::Result<()> {
    let dir = parent(path);
    let name = path
        .file_name()
        .ok_or_else(|| context(path, "not a file name", io::ErrorKind::InvalidInput.into()))?;
    // The whole name, the process and a counter: two files, processes or threads never share
    // a temporary file.
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut opts = OpenOptions::new();
    // create_new: the mode applies to a file this call creates, never to a leftover.
    opts.write(true).create_new(true);
    #[cfg(unix)]
    if let Some(m) = mode {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(m);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| {
        let mut f = opts
            .open(&tmp)
            .map_err(|e| context(&tmp, "cannot create", e))?;
        for p in parts {
            f.write_all(p)
                .map_err(|e| context(&tmp, "cannot write", e))?;
        }
        f.sync_all().map_err(|e| context(&tmp, "cannot sync", e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| context(path, "cannot rename into place", e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    sync_dir(&dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_and_leaves_no_temporary() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let p = d.path().join("f.json");
        write_atomic(&p, &[b"one"])?;
        write_atomic(&p, &[b"two", b" parts"])?;
        assert_eq!(fs::read(&p)?, b"two parts");
        assert_eq!(fs::read_dir(d.path())?.count(), 1);
        Ok(())
    }

    #[cfg(unix)]
    #[test]
    fn secrets_are_owner_only() -> io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir()?;
        let p = d.path().join("k.key");
        write_private(&p, &[b"secret"])?;
        assert_eq!(fs::metadata(&p)?.permissions().mode() & 0o777, 0o600);
        Ok(())
    }

    #[test]
    fn failures_name_the_path_and_clean_up() -> io::Result<()> {
        let d = tempfile::tempdir()?;
        let missing = d.path().join("no/such/dir/f");
        let e = write_atomic(&missing, &[b"x"])
            .err()
            .ok_or(io::ErrorKind::Other)?;
        assert!(e.to_string().contains("no/such/dir"), "{e}");
        // A directory in the way: the rename fails, the temporary file is removed.
        let target = d.path().join("taken");
        fs::create_dir(&target)?;
        fs::write(target.join("x"), b"")?;
        assert!(write_atomic(&target, &[b"x"]).is_err());
        assert_eq!(fs::read_dir(d.path())?.count(), 1);
        Ok(())
    }
}

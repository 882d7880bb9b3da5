//! `florin node check | backup | restore`: an operator's tools for a data directory (a devnet's
//! or a cluster authority's). `check` verifies every durable file offline and changes nothing;
//! `backup` copies a stopped node's directory into one checksummed archive after checking it;
//! `restore` brings an archive back into an empty directory and checks the result.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use florin_ledger::embedded::EmbeddedStore;
use florin_node::manifest::{Manifest, MANIFEST_FILE};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::util::print_json;

/// `florin node …` on a data directory.
#[derive(Subcommand)]
pub enum NodeCommand {
    /// Verify every durable file of a data directory offline; exit 0 only if all are sound.
    Check {
        /// The data directory.
        #[arg(long, default_value = "./florin-data")]
        data: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Copy a stopped node's data directory into one checksummed archive (checked first).
    Backup {
        /// The data directory.
        #[arg(long, default_value = "./florin-data")]
        data: PathBuf,
        /// The archive to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Restore an archive written by `backup` into a new (absent or empty) data directory.
    Restore {
        /// The archive.
        #[arg(long)]
        from: PathBuf,
        /// The data directory to create.
        #[arg(long, default_value = "./florin-data")]
        data: PathBuf,
    },
}

/// The lock a running devnet or authority sentinel holds on its data directory.
pub const LOCK_FILE: &str = ".lock";

/// Takes the data directory's lock for the life of the returned file: one process at a time.
pub fn lock_dir(dir: &Path) -> Result<fs::File> {
    let path = dir.join(LOCK_FILE);
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(fs::TryLockError::WouldBlock) => bail!(
            "{} is in use by another process (a running devnet or sentinel): stop it first",
            dir.display()
        ),
        Err(fs::TryLockError::Error(e)) => Err(e).context(format!("locking {}", path.display())),
    }
}

/// One file's verdict.
#[derive(Debug, Serialize)]
struct Finding {
    file: String,
    ok: bool,
    detail: String,
}

/// Checks every durable file the directory holds; changes nothing.
fn check_dir(dir: &Path) -> Result<Vec<Finding>> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let mut out = Vec::new();
    let mut add = |file: &str, r: Result<String>| {
        let (ok, detail) = match r {
            Ok(d) => (true, d),
            Err(e) => (false, format!("{e:#}")),
        };
        out.push(Finding {
            file: file.into(),
            ok,
            detail,
        });
    };
    // The manifest and what it requires.
    let manifest = Manifest::load(dir);
    let manifest = match manifest {
        Ok(m) => {
            add(
                MANIFEST_FILE,
                Ok(match &m {
                    Some(m) => format!("{} directory, {} required files", m.kind, m.files.len()),
                    None => "absent (a directory from before manifests, or not a node's)".into(),
                }),
            );
            m
        }
        Err(e) => {
            add(MANIFEST_FILE, Err(e.into()));
            None
        }
    };
    if let Some(m) = &manifest {
        add(
            "required files",
            m.verify_files(dir)
                .map(|()| format!("all {} present", m.files.len()))
                .map_err(Into::into),
        );
    }
    // Keys: each must parse, and match the manifest's record of it.
    for (role, file) in [("authority", "authority.key"), ("issuer", "issuer.key")] {
        let p = dir.join(file);
        if !p.exists() {
            continue;
        }
        add(
            file,
            florin_node::load_key(&p)
                .map_err(anyhow::Error::from)
                .and_then(|k| {
                    let addr = k.public_key().to_address();
                    if let Some(m) = &manifest {
                        m.verify_key(role, &addr, dir)?;
                    }
                    Ok(format!("{role} key {addr}"))
                }),
        );
    }
    // The ledger's log, snapshot and acknowledgement mark.
    let ledger = dir.join("ledger");
    if ledger.exists() {
        add(
            "ledger/",
            EmbeddedStore::check(&ledger)
                .map(|r| {
                    let mut d = format!(
                        "{} records ({} acknowledged per the mark), snapshot {}, minted {} cents, {} unspent outputs",
                        r.records_total,
                        r.acknowledged.map_or("none".into(), |a| a.to_string()),
                        r.snapshot_seq.map_or("none".into(), |s| s.to_string()),
                        r.supply.minted_cents,
                        r.supply.unspent_count
                    );
                    if r.torn_bytes > 0 {
                        d.push_str(&format!(
                            "; a torn tail of {} bytes (never acknowledged) will be cut at the next start",
                            r.torn_bytes
                        ));
                    }
                    d
                })
                .map_err(Into::into),
        );
    }
    // The authority's registry.
    let redb = dir.join("authority.redb");
    if redb.exists() {
        add("authority.redb", check_redb(&redb));
    }
    Ok(out)
}

/// Checks a redb file without touching it: a copy is opened strictly (a cleanly closed file
/// has every page's checksum verified; an unclean one is repaired only in the copy).
fn check_redb(path: &Path) -> Result<String> {
    let tmp = tempfile::tempdir()?;
    let copy = tmp.path().join("check.redb");
    fs::copy(path, &copy).with_context(|| format!("copying {}", path.display()))?;
    florin_node::redb_open::open_strict(&copy, florin_node::redb_open::Expect::Existing).map_err(
        |e| {
            anyhow!(
                "{}",
                e.to_string()
                    .replace(&copy.display().to_string(), &path.display().to_string())
            )
        },
    )?;
    Ok("opens strictly: commit slots and page checksums verified".into())
}

/// Runs `florin node check|backup|restore`.
pub fn run(cmd: NodeCommand) -> Result<ExitCode> {
    match cmd {
        NodeCommand::Check { data, json } => {
            let findings = check_dir(&data)?;
            let ok = findings.iter().all(|f| f.ok);
            if json {
                print_json(&json!({ "data": data, "ok": ok, "files": findings }));
            } else {
                for f in &findings {
                    println!(
                        "{:<6} {:<16} {}",
                        if f.ok { "ok" } else { "DAMAGED" },
                        f.file,
                        f.detail
                    );
                }
                println!(
                    "{}",
                    if ok {
                        "every file checked is sound"
                    } else {
                        "damage found: the node will refuse to start (see docs/ledger.md#damage-and-recovery)"
                    }
                );
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        NodeCommand::Backup { data, out } => {
            let _lock = lock_dir(&data)?;
            let findings = check_dir(&data)?;
            if let Some(f) = findings.iter().find(|f| !f.ok) {
                bail!(
                    "refusing to back up a damaged directory: {}: {}",
                    f.file,
                    f.detail
                );
            }
            let n = write_archive(&data, &out)?;
            println!(
                "backed up {n} files of {} to {}",
                data.display(),
                out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Restore { from, data } => {
            let n = restore_archive(&from, &data)?;
            let findings = check_dir(&data)?;
            if let Some(f) = findings.iter().find(|f| !f.ok) {
                bail!(
                    "restored {n} files into {}, but the result does not check: {}: {}",
                    data.display(),
                    f.file,
                    f.detail
                );
            }
            println!(
                "restored {n} files into {}; every file checked is sound",
                data.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

// ---------------------------------------------------------------- the archive

const ARCHIVE_MAGIC: &[u8] = b"FLORIN-BACKUP-1\n";

#[derive(Serialize, Deserialize)]
struct Entry {
    path: String,
    len: u64,
    sha256: String,
}

fn sha(b: &[u8]) -> String {
    hex::encode(florin_crypto::hash("florin/backup/file", &[b]))
}

/// Every regular file under `dir` (relative paths, sorted), without the lock and temporaries.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(dir.join(&rel))
            .with_context(|| format!("reading {}", dir.join(&rel).display()))?
        {
            let e = e?;
            let name = rel.join(e.file_name());
            let t = e.file_type()?;
            let s = e.file_name().to_string_lossy().into_owned();
            if t.is_dir() {
                stack.push(name);
            } else if t.is_file() && s != LOCK_FILE && !s.ends_with(".tmp") && !s.contains(".tmp.")
            {
                out.push(name);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Archive: magic, a JSON line listing (path, len, sha256) of each file, the files' bytes in
/// that order, then the sha256 of everything before it. Written to a temporary file, synced
/// and renamed into place.
fn write_archive(dir: &Path, out: &Path) -> Result<usize> {
    let files = files_under(dir)?;
    let mut bodies = Vec::with_capacity(files.len());
    let mut entries = Vec::with_capacity(files.len());
    for f in &files {
        let b = fs::read(dir.join(f)).with_context(|| format!("reading {}", f.display()))?;
        entries.push(Entry {
            path: f.to_string_lossy().into_owned(),
            len: b.len() as u64,
            sha256: sha(&b),
        });
        bodies.push(b);
    }
    let mut all = ARCHIVE_MAGIC.to_vec();
    all.extend_from_slice(&serde_json::to_vec(&entries)?);
    all.push(b'\n');
    for b in &bodies {
        all.extend_from_slice(b);
    }
    let sum = florin_crypto::hash("florin/backup/archive", &[&all]);
    all.extend_from_slice(&sum);
    let tmp = out.with_extension("partial");
    let mut f = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&all)?;
    f.sync_all()?;
    fs::rename(&tmp, out)?;
    Ok(files.len())
}

fn restore_archive(from: &Path, dir: &Path) -> Result<usize> {
    if dir.exists() && fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{} is not empty: restore into a new directory (never over a node's state)",
            dir.display()
        );
    }
    let mut all = Vec::new();
    fs::File::open(from)
        .with_context(|| format!("opening {}", from.display()))?
        .read_to_end(&mut all)?;
    let bad = |offset: usize, what: &str| {
        anyhow!(
            "{}: damaged at byte {offset}: expected {what}",
            from.display()
        )
    };
    if all.len() < ARCHIVE_MAGIC.len() + 32 || !all.starts_with(ARCHIVE_MAGIC) {
        return Err(bad(0, "a florin backup archive"));
    }
    let (body, sum) = all.split_at(all.len() - 32);
    if florin_crypto::hash("florin/backup/archive", &[body]).as_slice() != sum {
        return Err(bad(body.len(), "the archive's checksum"));
    }
    let start = ARCHIVE_MAGIC.len();
    let nl = body[start..]
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| bad(start, "the file list"))?;
    let entries: Vec<Entry> = serde_json::from_slice(&body[start..start + nl])
        .map_err(|_| bad(start, "the file list"))?;
    let mut pos = start + nl + 1;
    let staging = dir.with_extension("restoring");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    for e in &entries {
        let rel = Path::new(&e.path);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!(
                "{}: file name {:?} leaves the directory",
                from.display(),
                e.path
            );
        }
        let end = pos
            .checked_add(e.len as usize)
            .filter(|&end| end <= body.len())
            .ok_or_else(|| bad(pos, "the bytes the file list announces"))?;
        let b = &body[pos..end];
        if sha(b) != e.sha256 {
            return Err(bad(pos, &format!("{} with sha256 {}", e.path, e.sha256)));
        }
        let p = staging.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent)?;
        }
        let mut f = fs::File::create(&p)?;
        f.write_all(b)?;
        f.sync_all()?;
        pos = end;
    }
    if pos != body.len() {
        return Err(bad(pos, "the end of the files"));
    }
    if dir.exists() {
        fs::remove_dir(dir)?;
    }
    fs::rename(&staging, dir)?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::File::open(parent)?.sync_all()?;
    }
    Ok(entries.len())
}

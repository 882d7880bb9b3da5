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
use florin_node::manifest::{Manifest, MANIFEST_FILE};
use florin_store::embedded::EmbeddedStore;
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

/// The directory (mode 0700: its owner only) holding the Unix socket `sock` a running devnet
/// answers `backup` on.
pub const ADMIN_DIR: &str = "admin";

/// Asks the devnet running on `dir` for a consistent copy of itself (an archive).
fn backup_running(dir: &Path) -> Result<Vec<u8>> {
    use std::io::BufRead;
    let path = dir.join(ADMIN_DIR).join("sock");
    let mut s = std::os::unix::net::UnixStream::connect(&path).with_context(|| {
        format!(
            "{} is in use, but its admin socket {} does not answer",
            dir.display(),
            path.display()
        )
    })?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(600)))?;
    s.write_all(b"backup\n")?;
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end();
    if let Some(len) = line.strip_prefix("OK ") {
        let len: usize = len.parse().context("the devnet's answer")?;
        let mut bytes = vec![0u8; len];
        r.read_exact(&mut bytes)?;
        Ok(bytes)
    } else {
        bail!(
            "the running devnet refused the backup: {}",
            line.trim_start_matches("ERR ")
        )
    }
}

/// Binds `DIR/admin/sock`, the socket a running devnet answers `backup` on (in a directory only
/// its owner can enter). Bound before the devnet says it is listening, so a `florin node
/// backup` that follows finds it.
pub fn bind_admin(dir: &Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    // The socket lives in a directory only the owner can enter, made so before the socket
    // exists (a socket's own mode is set only after bind, too late).
    let sock_dir = dir.join(ADMIN_DIR);
    let _ = fs::remove_dir_all(&sock_dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&sock_dir)
        .with_context(|| format!("creating {}", sock_dir.display()))?;
    fs::set_permissions(&sock_dir, fs::Permissions::from_mode(0o700))?;
    let path = sock_dir.join("sock");
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("cannot listen on {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves `backup` on the admin socket ([`bind_admin`]) for a running devnet: a consistent copy
/// taken in the process, registry first (a read transaction copied table by table), then the
/// ledger (under its lock), so the copy's ledger is never behind its registry.
pub async fn serve_admin(
    listener: tokio::net::UnixListener,
    dir: PathBuf,
    authority: std::sync::Arc<florin_node::Authority>,
    store: std::sync::Arc<EmbeddedStore>,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    loop {
        let (stream, _) = listener.accept().await?;
        let (dir, authority, store) = (dir.clone(), authority.clone(), store.clone());
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut line = String::new();
            // One short command line: at most 64 bytes are read.
            let mut rd = tokio::io::BufReader::new(rd.take(64));
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(5), rd.read_line(&mut line))
                    .await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let answer = if line.trim() == "backup" {
                tokio::task::spawn_blocking(move || live_copy(&dir, &authority, &store))
                    .await
                    .map_err(|e| anyhow!("{e}"))
                    .and_then(|r| r)
            } else {
                Err(anyhow!(
                    "unknown command {:?} (this socket answers: backup)",
                    line.trim()
                ))
            };
            let _ = match answer {
                Ok(bytes) => {
                    let head = format!("OK {}\n", bytes.len());
                    match wr.write_all(head.as_bytes()).await {
                        Ok(()) => wr.write_all(&bytes).await,
                        Err(e) => Err(e),
                    }
                }
                Err(e) => {
                    wr.write_all(
                        format!("ERR {}\n", format!("{e:#}").replace('\n', " ")).as_bytes(),
                    )
                    .await
                }
            };
        });
    }
}

/// The running devnet's consistent copy, as an archive.
fn live_copy(
    dir: &Path,
    authority: &florin_node::Authority,
    store: &EmbeddedStore,
) -> Result<Vec<u8>> {
    let mut entries = Vec::new();
    let tmp = tempfile::tempdir()?;
    let reg = tmp.path().join("authority.redb");
    // The ledger is copied while the registry copy's write transaction still keeps every
    // registry writer (and every mint) out: the two are of one moment.
    let ledger = authority.backup_registry_then(&reg, || {
        store.backup_files().map_err(florin_node::NodeError::from)
    })?;
    entries.push(("authority.redb".to_string(), fs::read(&reg)?));
    for (name, bytes) in ledger {
        entries.push((format!("ledger/{name}"), bytes));
    }
    // Every other file as it is: keys and the manifest never change while running, and
    // custody nodes (their own processes) replace their files atomically.
    for f in files_under(dir)? {
        let name = f.to_string_lossy().into_owned();
        if name == "authority.redb" || name.starts_with("ledger/") || name.starts_with("admin/") {
            continue;
        }
        entries.push((name, fs::read(dir.join(&f))?));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    archive(&entries)
}

/// The lock a running devnet or authority sentinel holds on its data directory.
pub const LOCK_FILE: &str = ".lock";

/// Whether a process holds the directory's lock (without creating the lock file).
fn in_use(dir: &Path) -> bool {
    match fs::OpenOptions::new().write(true).open(dir.join(LOCK_FILE)) {
        Ok(f) => matches!(f.try_lock(), Err(fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

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
    for (role, file) in [
        ("authority", "authority.key"),
        ("issuer", "issuer.key"),
        ("operator", "operator.key"),
    ] {
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
    // A threshold devnet's key-management network: its nodes check their own files (every
    // share and record sealed and checksummed) when they start; here, that it is there.
    let custody = dir.join("custody");
    if custody.exists() {
        add(
            "custody/",
            if custody.join("network.json").is_file() {
                Ok("a key-management network; its nodes verify their shares when they start (`florin custody status --data DIR/custody`)".into())
            } else {
                Err(anyhow!("{} has no network.json", custody.display()))
            },
        );
    }
    // The authority's registry: a copy taken while a devnet writes it could be mid-commit.
    let redb = dir.join("authority.redb");
    if redb.exists() {
        add(
            "authority.redb",
            if in_use(dir) {
                Ok("not checked: a running devnet holds it (`florin node backup` checks a consistent copy of a running node)".into())
            } else {
                check_redb(&redb)
            },
        );
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
            let _lock = match lock_dir(&data) {
                Ok(l) => l,
                Err(_) if data.join(ADMIN_DIR).join("sock").exists() => {
                    // A running devnet: it takes the consistent copy itself.
                    let bytes = backup_running(&data)?;
                    // Prove the archive restores and checks before calling it a backup.
                    let trial = tempfile::tempdir()?;
                    let n = restore_bytes(&bytes, &out, &trial.path().join("data"))?;
                    if let Some(f) = check_dir(&trial.path().join("data"))?
                        .iter()
                        .find(|f| !f.ok)
                    {
                        bail!(
                            "the running node's copy does not check: {}: {}",
                            f.file,
                            f.detail
                        );
                    }
                    write_durably(&out, &bytes)?;
                    println!(
                        "backed up {n} files of the running node in {} to {}",
                        data.display(),
                        out.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                Err(e) => return Err(e),
            };
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

/// Every regular file under `dir` (relative paths, sorted), without the lock, temporaries and
/// custody nodes' presignatures (`presigs/`): a presignature restored after it signed would
/// sign a second message, which reveals the key.
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
            if t.is_dir() && s == "presigs" {
                continue;
            }
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
/// that order, then the sha256 of everything before it.
pub fn archive(entries: &[(String, Vec<u8>)]) -> Result<Vec<u8>> {
    let list: Vec<Entry> = entries
        .iter()
        .map(|(p, b)| Entry {
            path: p.clone(),
            len: b.len() as u64,
            sha256: sha(b),
        })
        .collect();
    let mut all = ARCHIVE_MAGIC.to_vec();
    all.extend_from_slice(&serde_json::to_vec(&list)?);
    all.push(b'\n');
    for (_, b) in entries {
        all.extend_from_slice(b);
    }
    let sum = florin_crypto::hash("florin/backup/archive", &[&all]);
    all.extend_from_slice(&sum);
    Ok(all)
}

/// Writes `bytes` to `out` through a temporary file, synced and renamed into place.
fn write_durably(out: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = out.with_extension("partial");
    let mut f = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, out)?;
    Ok(())
}

/// Archives a stopped node's directory file by file.
fn write_archive(dir: &Path, out: &Path) -> Result<usize> {
    let files = files_under(dir)?;
    let mut entries = Vec::with_capacity(files.len());
    for f in &files {
        let b = fs::read(dir.join(f)).with_context(|| format!("reading {}", f.display()))?;
        entries.push((f.to_string_lossy().into_owned(), b));
    }
    write_durably(out, &archive(&entries)?)?;
    Ok(files.len())
}

fn restore_archive(from: &Path, dir: &Path) -> Result<usize> {
    let mut all = Vec::new();
    fs::File::open(from)
        .with_context(|| format!("opening {}", from.display()))?
        .read_to_end(&mut all)?;
    restore_bytes(&all, from, dir)
}

/// Restores archive bytes (`from` names them in errors) into the new directory `dir`.
fn restore_bytes(all: &[u8], from: &Path, dir: &Path) -> Result<usize> {
    if dir.exists() && fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{} is not empty: restore into a new directory (never over a node's state)",
            dir.display()
        );
    }
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
    let mut staging_name = dir.as_os_str().to_owned();
    staging_name.push(".restoring");
    let staging = PathBuf::from(staging_name);
    if staging.exists() {
        bail!(
            "{} exists (an earlier restore that did not finish?): remove it first",
            staging.display()
        );
    }
    let written = stage(
        &body[start + nl + 1..],
        &entries,
        &staging,
        from,
        start + nl + 1,
    );
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
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

/// Writes the archive's files (their bytes `files`, starting at byte `base` of the archive)
/// into `staging`, each checked against its hash first.
fn stage(files: &[u8], entries: &[Entry], staging: &Path, from: &Path, base: usize) -> Result<()> {
    let bad = |offset: usize, what: &str| {
        anyhow!(
            "{}: damaged at byte {offset}: expected {what}",
            from.display()
        )
    };
    fs::create_dir_all(staging)?;
    let mut pos = 0usize;
    for e in entries {
        let rel = Path::new(&e.path);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            bail!(
                "{}: file name {:?} leaves the directory",
                from.display(),
                e.path
            );
        }
        let end = pos
            .checked_add(e.len as usize)
            .filter(|&end| end <= files.len())
            .ok_or_else(|| bad(base + pos, "the bytes the file list announces"))?;
        let b = &files[pos..end];
        if sha(b) != e.sha256 {
            return Err(bad(
                base + pos,
                &format!("{} with sha256 {}", e.path, e.sha256),
            ));
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
    if pos != files.len() {
        return Err(bad(base + pos, "the end of the files"));
    }
    Ok(())
}

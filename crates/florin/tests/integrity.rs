//! Damage as an operator meets it: a real devnet process killed with `kill -9`, its files
//! damaged on disk, then `florin node check`, a restart that must refuse (changing nothing),
//! a rolled-back ledger that the audit must call unbalanced, and backup and restore.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{florin, Devnet, BIN};
use serde_json::Value;

/// Starts a devnet that must refuse: returns its error output (it must exit by itself).
fn start_refused(data: &Path) -> String {
    let mut child = Command::new(BIN)
        .args(["devnet", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            assert!(!status.success(), "the devnet must refuse to start");
            return String::from_utf8_lossy(&out.stderr).into_owned();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the devnet started on a damaged directory");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `florin wallet --wallet WALLET ARGS`, which must succeed: its output.
fn wallet(home: &Path, node: &str, wallet: &str, args: &[&str]) -> String {
    let mut a = vec!["wallet", "--wallet", wallet];
    a.extend_from_slice(args);
    ok(florin(home, node, &a))
}

/// `florin audit --json` against `node`, which must succeed.
fn audit_json(home: &Path, node: &str) -> Value {
    serde_json::from_str(&ok(florin(home, node, &["audit", "--json"]))).unwrap()
}

/// A command without a node (`florin node …`), which must succeed: its output.
fn offline(home: &Path, args: &[&str]) -> String {
    ok(florin(home, "", args))
}

/// Every file under `dir` with its bytes (but the empty lock file a start takes).
fn tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() && !p.ends_with(".lock") {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn copy_tree(from: &Path, to: &Path) {
    for (p, b) in tree(from) {
        let q = to.join(p.strip_prefix(from).unwrap());
        std::fs::create_dir_all(q.parent().unwrap()).unwrap();
        std::fs::write(q, b).unwrap();
    }
}

fn wal(data: &Path) -> PathBuf {
    let dir = data.join("ledger");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("wal-"))
        .unwrap()
}

#[test]
fn damaged_files_are_refused_and_lost_history_is_audited() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let data = home.join("data");

    // History part one: a faucet payment. Then a crash.
    let d = Devnet::start(&data);
    wallet(home, &d.url, "a.json", &["new", "--no-passphrase"]);
    wallet(home, &d.url, "a.json", &["faucet", "50"]);
    d.crash();
    let early = home.join("early");
    copy_tree(&data, &early);

    // Part two: a withdrawal (a payment to the reserve) and another mint.
    let d = Devnet::start(&data);
    wallet(home, &d.url, "a.json", &["withdraw", "10"]);
    wallet(home, &d.url, "a.json", &["faucet", "5"]);
    let audit: Value = audit_json(home, &d.url);
    assert_eq!(audit["balanced"], true, "{audit}");
    d.crash();
    let check = offline(home, &["node", "check", "--data", "data"]);
    assert!(check.contains("every file checked is sound"), "{check}");
    let good = home.join("good");
    copy_tree(&data, &good);

    // A flipped byte in the first log record, valid records after it: refused, unchanged.
    let w = wal(&data);
    let mut bytes = std::fs::read(&w).unwrap();
    bytes[20] ^= 0x04;
    std::fs::write(&w, &bytes).unwrap();
    let before = tree(&data);
    let o = florin(home, "", &["node", "check", "--data", "data", "--json"]);
    assert!(!o.status.success());
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let err = start_refused(&data);
    assert!(
        err.contains("wal-")
            && err.contains("damaged at byte 0")
            && err.contains("not a torn tail"),
        "{err}"
    );
    let after = tree(&data);
    let changed: Vec<_> = before
        .iter()
        .zip(&after)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.display().to_string())
        .collect();
    assert!(
        changed.is_empty() && before.len() == after.len(),
        "a refused start changed {changed:?}"
    );

    // The last record cut short: it was acknowledged (the mark says so), so it is damage.
    std::fs::write(&w, std::fs::read(wal(&good)).unwrap()).unwrap();
    let len = std::fs::metadata(&w).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let err = start_refused(&data);
    assert!(err.contains("acknowledged"), "{err}");
    assert_eq!(
        std::fs::metadata(&w).unwrap().len(),
        len - 5,
        "never shortened further"
    );

    // Required files deleted or emptied: refused, never recreated.
    for victim in ["authority.key", "authority.redb", "ledger/acked.bin"] {
        std::fs::remove_dir_all(&data).unwrap();
        copy_tree(&good, &data);
        std::fs::remove_file(data.join(victim)).unwrap();
        let err = start_refused(&data);
        assert!(
            err.contains(victim.rsplit('/').next().unwrap()),
            "{victim}: {err}"
        );
        assert!(!data.join(victim).exists(), "{victim} was recreated");
    }
    std::fs::remove_dir_all(&data).unwrap();
    copy_tree(&good, &data);
    std::fs::write(data.join("authority.redb"), b"").unwrap();
    let err = start_refused(&data);
    assert!(err.contains("authority.redb"), "{err}");

    // A ledger rolled back to an older, internally consistent state (an old copy of its
    // directory): it opens, but the audit finds the lost mint and the lost reserve output.
    std::fs::remove_dir_all(&data).unwrap();
    copy_tree(&good, &data);
    std::fs::remove_dir_all(data.join("ledger")).unwrap();
    copy_tree(&early.join("ledger"), &data.join("ledger"));
    let d = Devnet::start(&data);
    let o = florin(home, &d.url, &["audit", "--json"]);
    assert!(!o.status.success(), "an unbalanced audit exits non-zero");
    let audit: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(audit["balanced"], false, "{audit}");
    let problems = audit["problems"].to_string();
    assert!(
        problems.contains("is missing from the ledger"),
        "{problems}"
    );
    assert!(problems.contains("reserve output"), "{problems}");
    drop(d);

    // Backup and restore: the restored directory checks and serves the same books.
    std::fs::remove_dir_all(&data).unwrap();
    copy_tree(&good, &data);
    // Of a running devnet: a consistent copy over its admin socket, while it keeps serving.
    let d = Devnet::start(&data);
    let o = offline(
        home,
        &["node", "backup", "--data", "data", "--out", "live.bin"],
    );
    assert!(o.contains("running node"), "{o}");
    wallet(home, &d.url, "a.json", &["faucet", "1"]);
    // Copies taken while mints land: each restores to books that balance.
    let url = d.url.clone();
    let h = home.to_path_buf();
    let minting = std::thread::spawn(move || {
        for _ in 0..12 {
            wallet(&h, &url, "a.json", &["faucet", "0.01"]);
        }
    });
    for i in 0..3 {
        let name = format!("busy{i}.bin");
        offline(home, &["node", "backup", "--data", "data", "--out", &name]);
        let dir = format!("busy{i}");
        offline(home, &["node", "restore", "--from", &name, "--data", &dir]);
        let b = Devnet::start(&home.join(&dir));
        let audit: Value = audit_json(home, &b.url);
        assert_eq!(audit["balanced"], true, "copy {i}: {audit}");
    }
    minting.join().unwrap();
    drop(d);
    offline(
        home,
        &["node", "restore", "--from", "live.bin", "--data", "live"],
    );
    let d = Devnet::start(&home.join("live"));
    let audit: Value = audit_json(home, &d.url);
    assert_eq!(audit["balanced"], true, "{audit}");
    assert_eq!(
        audit["minted_cents"], 5500,
        "the copy is of the moment it was taken"
    );
    assert_eq!(audit["issued_journal_cents"], 5500);
    drop(d);
    std::fs::remove_dir_all(&data).unwrap();
    copy_tree(&good, &data);
    offline(
        home,
        &["node", "backup", "--data", "data", "--out", "b.bin"],
    );
    let o = florin(
        home,
        "",
        &["node", "restore", "--from", "b.bin", "--data", "data"],
    );
    assert!(!o.status.success(), "restore never writes over a directory");
    offline(
        home,
        &["node", "restore", "--from", "b.bin", "--data", "restored"],
    );
    let d = Devnet::start(&home.join("restored"));
    let audit: Value = audit_json(home, &d.url);
    assert_eq!(audit["balanced"], true, "{audit}");
    assert_eq!(audit["minted_cents"], 5500);
    drop(d);
    // A damaged archive is refused and creates nothing.
    let mut b = std::fs::read(home.join("b.bin")).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 1;
    std::fs::write(home.join("bad.bin"), b).unwrap();
    let o = florin(
        home,
        "",
        &["node", "restore", "--from", "bad.bin", "--data", "r2"],
    );
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("damaged at byte"));
    assert!(!home.join("r2").exists());
}

#[test]
fn a_provider_with_books_never_gets_a_new_configuration_or_network() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("psp");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("psp.redb.created"), b"").unwrap();
    let serve = |d: &Path| {
        Command::new(BIN)
            .args(["psp", "serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(d)
            .output()
            .unwrap()
    };
    // psp.json missing beside the books: refused, nothing written.
    let o = serve(&data);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("psp.json is missing"), "{err}");
    assert!(!data.join("psp.json").exists() && !data.join("custody").exists());
    // The configuration there, its key-management network gone: refused too.
    std::fs::write(
        data.join("psp.json"),
        br#"{"name":"bank","scheme":"ed25519"}"#,
    )
    .unwrap();
    let o = serve(&data);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("custody is missing"), "{err}");
    assert!(!data.join("custody").exists());
}

/// A wallet holding more coins than one ledger transaction takes (1,024 inputs) pays its whole
/// balance: it consolidates first instead of building a transaction the ledger cannot decode
/// (which it would have retried for ever).
#[test]
fn a_wallet_with_more_coins_than_one_transaction_takes_pays_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path();
    let d = Devnet::start(&home.join("data"));
    wallet(home, &d.url, "a.json", &["new", "--no-passphrase"]);
    wallet(home, &d.url, "b.json", &["new", "--no-passphrase"]);
    // €3.88 is minted as 8 outputs (one per denomination): 130 × 8 = 1,040 coins.
    for _ in 0..130 {
        wallet(home, &d.url, "a.json", &["faucet", "3.88"]);
    }
    let b = wallet(home, &d.url, "b.json", &["address"]);
    let o = florin(
        home,
        &d.url,
        &[
            "wallet",
            "--wallet",
            "a.json",
            "--json",
            "pay",
            b.trim(),
            "504.40",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let paid: Value = serde_json::from_str(&ok(o)).unwrap();
    assert_eq!(paid["status"], "confirmed", "{paid}");
    assert_eq!(paid["online_cents"], 0);
    assert!(err.contains("consolidated"), "{err}");
    wallet(home, &d.url, "b.json", &["sync"]);
    let bal: Value =
        serde_json::from_str(&wallet(home, &d.url, "b.json", &["--json", "balance"])).unwrap();
    assert_eq!(bal["online_cents"], 50440, "{bal}");
}

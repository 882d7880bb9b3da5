//! Backup words, encrypted wallet files, export and import, as a user runs them against a
//! real devnet: a wallet restored from its words alone on an empty directory finds the same
//! ledger balance and pays; a wrong passphrase is refused without touching the file; an
//! exported wallet pays from where it was imported, and the file it left refuses to.

#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{ca_for, Devnet, BIN};
use serde_json::Value;

const PASS: &str = "correct horse battery staple";

/// `florin wallet --wallet NAME --json ARGS` in `dir`, with the passphrase `pass` (if any) in
/// the environment and no terminal.
fn wallet(dir: &Path, node: &str, pass: Option<&str>, name: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir)
        .env("FLORIN_NODE", node)
        .env_remove("FLORIN_WALLET_PASSPHRASE")
        .args(["wallet", "--wallet", name, "--json"])
        .args(args)
        .stdin(std::process::Stdio::null());
    if let Some(p) = pass {
        cmd.env("FLORIN_WALLET_PASSPHRASE", p);
    }
    if let Some(ca) = ca_for(node) {
        cmd.env("FLORIN_CA_CERT", ca);
    }
    cmd.output().unwrap()
}

fn ok(out: Output) -> Value {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The error envelope's code of a command that must fail.
fn code(out: Output) -> String {
    assert!(!out.status.success(), "should fail");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("no envelope: {}", String::from_utf8_lossy(&out.stdout)));
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[test]
fn words_restore_the_ledger_funds_and_files_are_encrypted_moved_and_refused_rightly() {
    let dir = tempfile::tempdir().unwrap();
    let net = Devnet::start(&dir.path().join("data"));
    let node = net.url.as_str();
    let home = dir.path();
    let w = |pass: Option<&str>, name: &str, args: &[&str]| wallet(home, node, pass, name, args);

    // A new wallet without a passphrase, a terminal or --no-passphrase is refused.
    let refused = w(None, "plain.json", &["new"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--no-passphrase"));
    assert!(!home.join("plain.json").exists());

    let created = ok(w(Some(PASS), "alice.json", &["new"]));
    assert_eq!(created["encrypted"], true);
    let words = created["backup_words"].as_str().unwrap().to_string();
    assert_eq!(words.split(' ').count(), 12, "{created}");
    let file = std::fs::read_to_string(home.join("alice.json")).unwrap();
    assert!(file.contains("\"format\": 2"));
    for word in words.split(' ') {
        assert!(
            !file.contains(&format!("\"{word}")),
            "a backup word in the clear"
        );
    }
    assert!(!file.contains(&words));
    ok(w(None, "bob.json", &["new", "--no-passphrase"]));
    let bob = ok(w(None, "bob.json", &["address"]))["address"]
        .as_str()
        .unwrap()
        .to_string();
    // The address of an encrypted wallet is readable without its passphrase (unverified),
    // and verified with it.
    let declared = ok(w(None, "alice.json", &["address"]));
    assert_eq!(declared["verified"], false);
    let alice = declared["address"].as_str().unwrap().to_string();
    let checked = ok(w(Some(PASS), "alice.json", &["address"]));
    assert_eq!(
        (checked["address"].as_str(), checked["verified"].as_bool()),
        (Some(alice.as_str()), Some(true))
    );

    // Money in every form a restore must find: a faucet output, change to a derived key, and
    // a payment handed off by someone else.
    ok(w(Some(PASS), "alice.json", &["faucet", "50"]));
    ok(w(Some(PASS), "alice.json", &["pay", &bob, "12.34"]));
    ok(w(None, "bob.json", &["faucet", "10"]));
    ok(w(None, "bob.json", &["pay", &alice, "5"]));
    let synced = ok(w(Some(PASS), "alice.json", &["sync"]));
    assert_eq!(synced["online_cents"], 4266, "{synced}");

    // A wrong passphrase, or none, is refused and changes nothing.
    let before = std::fs::read(home.join("alice.json")).unwrap();
    assert_eq!(
        code(w(Some("wrong"), "alice.json", &["pay", &bob, "1"])),
        "wrong_passphrase"
    );
    assert_eq!(
        code(w(None, "alice.json", &["balance"])),
        "passphrase_needed"
    );
    assert_eq!(std::fs::read(home.join("alice.json")).unwrap(), before);

    // The words come back on request, the same.
    let shown = ok(w(Some(PASS), "alice.json", &["backup"]));
    assert_eq!(shown["backup_words"].as_str(), Some(words.as_str()));

    // Export moves the wallet: the old file refuses to spend, the imported one pays.
    let moved = ok(w(
        Some(PASS),
        "alice.json",
        &["export", "--out", "moved.json"],
    ));
    assert!(moved["exported"].as_str().unwrap().ends_with("moved.json"));
    assert_eq!(
        code(w(Some(PASS), "alice.json", &["pay", &bob, "1"])),
        "wallet_moved"
    );
    assert_eq!(
        code(w(
            Some(PASS),
            "alice.json",
            &["export", "--out", "again.json"]
        )),
        "wallet_moved"
    );
    // Another machine: an empty directory.
    let other = tempfile::tempdir().unwrap();
    std::fs::copy(home.join("moved.json"), other.path().join("moved.json")).unwrap();
    let o = |pass: Option<&str>, name: &str, args: &[&str]| {
        wallet(other.path(), node, pass, name, args)
    };
    assert_eq!(
        code(o(Some("wrong"), "alice2.json", &["import", "moved.json"])),
        "wrong_passphrase"
    );
    // A file imported into itself is refused (it would wait on its own lock).
    assert!(!o(Some(PASS), "moved.json", &["import", "moved.json"])
        .status
        .success());
    let imported = ok(o(Some(PASS), "alice2.json", &["import", "moved.json"]));
    assert_eq!(imported["total_cents"], 4266, "{imported}");
    ok(o(Some(PASS), "alice2.json", &["pay", &bob, "1"]));
    assert_eq!(
        code(o(Some(PASS), "moved.json", &["pay", &bob, "1"])),
        "wallet_moved"
    );
    let left = ok(o(Some(PASS), "alice2.json", &["balance"]));
    assert_eq!(left["online_cents"], 4166, "{left}");

    // Restore on a third, empty machine from the words alone.
    let empty = tempfile::tempdir().unwrap();
    let e = |pass: Option<&str>, name: &str, args: &[&str]| {
        wallet(empty.path(), node, pass, name, args)
    };
    // Wrong words: a typed refusal, nothing written, the words never echoed. Twelve listed
    // words whose checksum fails, and a misspelt word.
    for (bad, secret) in [
        ("abandon ".repeat(12), "abandon abandon abandon"),
        (
            words.replacen(words.split(' ').next().unwrap(), "zzzsecret", 1),
            "zzzsecret",
        ),
    ] {
        std::fs::write(empty.path().join("bad.txt"), &bad).unwrap();
        let out = e(
            None,
            "r.json",
            &["restore", "--mnemonic-file", "bad.txt", "--no-passphrase"],
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(code(out), "bad_backup_words");
        assert!(!text.contains(secret), "{text}");
        assert!(!empty.path().join("r.json").exists());
    }
    // No words file and no terminal: refused, never read from the command line.
    assert!(!e(None, "r.json", &["restore", "--no-passphrase"])
        .status
        .success());
    std::fs::write(empty.path().join("words.txt"), format!("{words}\n")).unwrap();
    let restored = ok(e(
        Some(PASS),
        "restored.json",
        &["restore", "--mnemonic-file", "words.txt"],
    ));
    assert_eq!(restored["address"].as_str(), Some(alice.as_str()));
    assert_eq!(restored["encrypted"], true);
    assert_eq!(restored["online_cents"], 4166, "{restored}");
    assert!(restored["not_restorable"]
        .as_str()
        .unwrap()
        .contains("offline"));
    // The restored wallet spends what it found (its main key's and a derived key's outputs).
    let paid = ok(e(Some(PASS), "restored.json", &["pay", &bob, "41.66"]));
    assert_eq!(paid["online_cents"], 0, "{paid}");
    let b = ok(w(None, "bob.json", &["sync"]));
    assert!(b["received_cents"].as_u64().unwrap() >= 4166, "{b}");
}

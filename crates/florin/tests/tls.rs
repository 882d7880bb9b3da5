//! TLS as a user meets it: a devnet process serves HTTPS from the CA it made; a wallet pays over
//! HTTPS end to end trusting that CA (`FLORIN_CA_CERT` or `--ca-cert`); a client without the
//! CA is refused with a certificate error; plain HTTP only on loopback; the CA is reused on
//! restart and a damaged one is refused, naming the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{florin, Devnet, BIN};
use serde_json::Value;

fn ok(o: Output) -> Value {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
}

fn wallet(home: &Path, node: &str, w: &str, args: &[&str]) -> Value {
    let mut a = vec!["wallet", "--json", "--wallet", w];
    a.extend_from_slice(args);
    ok(florin(home, node, &a))
}

#[test]
fn a_wallet_pays_over_https_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let data = home.join("data");
    let net = Devnet::start(&data);
    assert!(net.url.starts_with("https://"), "{}", net.url);
    let ca = data.join("tls").join("ca.pem");
    assert!(ca.exists());
    // FLORIN_CA_CERT (set by `florin`) trusts the devnet.
    wallet(home, &net.url, "alice.json", &["new", "--no-passphrase"]);
    wallet(home, &net.url, "bob.json", &["new", "--no-passphrase"]);
    let f = wallet(home, &net.url, "alice.json", &["faucet", "20"]);
    assert_eq!(f["received_cents"], 2000, "{f}");
    let bob = wallet(home, &net.url, "bob.json", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    let p = wallet(home, &net.url, "alice.json", &["pay", &bob, "7.50"]);
    assert_eq!(p["status"], "confirmed", "{p}");
    // `--ca-cert FILE` instead of the environment, for the payee.
    let o = Command::new(BIN)
        .current_dir(home)
        .env_remove("FLORIN_CA_CERT")
        .args(["--ca-cert"])
        .arg(&ca)
        .args([
            "wallet", "--json", "--wallet", "bob.json", "--node", &net.url,
        ])
        .arg("sync")
        .output()
        .unwrap();
    let s = ok(o);
    assert_eq!(s["received_cents"], 750, "{s}");
    let audit = ok(florin(home, &net.url, &["audit", "--json"]));
    assert_eq!(audit["balanced"], true, "{audit}");
}

#[test]
fn a_client_without_the_ca_is_refused_with_a_certificate_error() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let net = Devnet::start(&home.join("data"));
    let o = Command::new(BIN)
        .current_dir(home)
        .env_remove("FLORIN_CA_CERT")
        .args(["audit", "--node", &net.url])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("certificate"), "{err}");
    assert!(err.contains("--ca-cert"), "{err}");
    // Another devnet's CA is no better.
    let other = Devnet::start(&home.join("other"));
    let o = Command::new(BIN)
        .current_dir(home)
        .env(
            "FLORIN_CA_CERT",
            home.join("other").join("tls").join("ca.pem"),
        )
        .args(["audit", "--node", &net.url])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("certificate"));
    drop(other);
    // A CA file that is not there: an error naming it.
    let o = Command::new(BIN)
        .current_dir(home)
        .env("FLORIN_CA_CERT", home.join("nope.pem"))
        .args(["audit", "--node", &net.url])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope.pem"));
}

#[test]
fn plain_http_is_refused_off_loopback_and_served_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    for args in [
        vec![
            "devnet",
            "--plain-http",
            "--listen",
            "0.0.0.0:0",
            "--data",
            "d1",
        ],
        vec![
            "psp",
            "serve",
            "--plain-http",
            "--listen",
            "0.0.0.0:0",
            "--data",
            "p1",
        ],
        vec![
            "cluster",
            "up",
            "--plain-http",
            "--api",
            "0.0.0.0:7400",
            "--data",
            "c1",
        ],
    ] {
        let o = Command::new(BIN)
            .current_dir(home)
            .args(&args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?} must be refused");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("loopback"), "{args:?}: {err}");
    }
    // Refused before anything was written.
    for d in ["d1", "p1", "c1"] {
        assert!(!home.join(d).exists(), "{d} was created");
    }
    // On loopback, by explicit choice: plain HTTP, and no CA is made.
    let net = Devnet::start_with(&home.join("plain"), &["--plain-http"]);
    assert!(net.url.starts_with("http://"), "{}", net.url);
    assert!(!home.join("plain").join("tls").exists());
    assert_eq!(net.get("/v1/health")["status"], "ok");
}

#[test]
fn the_ca_is_reused_on_restart_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let data = home.join("data");
    let net = Devnet::start(&data);
    let ca = data.join("tls").join("ca.pem");
    let pem = std::fs::read(&ca).unwrap();
    wallet(home, &net.url, "a.json", &["new", "--no-passphrase"]);
    net.kill();
    // Restarted: the same CA, and a client holding the old ca.pem still trusts it.
    let net = Devnet::start(&data);
    assert_eq!(std::fs::read(&ca).unwrap(), pem);
    wallet(home, &net.url, "a.json", &["faucet", "1"]);
    net.kill();
    // Damaged: the devnet refuses to start, naming the file, and leaves it as it is.
    let mut bad = pem.clone();
    let mid = bad.len() / 2;
    bad[mid] = if bad[mid] == b'A' { b'B' } else { b'A' };
    std::fs::write(&ca, &bad).unwrap();
    let o = Command::new(BIN)
        .args(["devnet", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ca.pem"), "{err}");
    assert_eq!(std::fs::read(&ca).unwrap(), bad, "never regenerated over");
    // The key gone: refused too, naming it.
    std::fs::write(&ca, &pem).unwrap();
    std::fs::remove_file(data.join("tls").join("ca.key")).unwrap();
    let o = Command::new(BIN)
        .args(["devnet", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("ca.key") && err.contains("missing"), "{err}");
}

/// Stops a key-management network when dropped (`florin custody down`).
struct CustodyDown(std::path::PathBuf);

impl Drop for CustodyDown {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args(["custody", "down", "--data"])
            .arg(&self.0)
            .output();
    }
}

/// A provider serves HTTPS from its own CA by default; its customers' commands trust that CA,
/// and the provider reaches the devnet's ledger over TLS trusting the devnet's CA.
#[test]
fn a_provider_serves_https_and_reaches_the_ledger_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let net = Devnet::start(&home.join("devnet"));
    let psp_data = home.join("psp");
    let _down = CustodyDown(psp_data.join("custody"));
    let mut cmd = Command::new(BIN);
    cmd.args([
        "psp",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--scheme",
        "ed25519",
    ])
    .args(["--name", "bank-t", "--ledger", &net.url, "--data"])
    .arg(&psp_data)
    .env(
        "FLORIN_CA_CERT",
        home.join("devnet").join("tls").join("ca.pem"),
    );
    let (child, url) = common::spawn_listening(cmd);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Kill(child);
    assert!(url.starts_with("https://"), "{url}");
    let psp_ca = psp_data.join("tls").join("ca.pem");
    let psp = |ca: Option<&Path>, args: &[&str]| {
        let mut c = Command::new(BIN);
        c.current_dir(home)
            .env("FLORIN_PSP", &url)
            .args(["psp"])
            .args(args);
        match ca {
            Some(ca) => c.env("FLORIN_CA_CERT", ca),
            None => c.env_remove("FLORIN_CA_CERT"),
        };
        c.output().unwrap()
    };
    // Without the provider's CA: a certificate error.
    let o = psp(None, &["info", "--json"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("certificate"));
    // With it: open an account and fund it from the ledger's faucet (provider → ledger, TLS).
    let info = ok(psp(Some(&psp_ca), &["info", "--json"]));
    assert_eq!(info["name"], "bank-t", "{info}");
    ok(psp(Some(&psp_ca), &["open", "alice", "--json"]));
    let o = psp(Some(&psp_ca), &["fund", "alice", "5"]);
    assert!(
        o.status.success(),
        "fund: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bal = ok(psp(Some(&psp_ca), &["balance", "alice", "--json"]));
    assert_eq!(bal[0]["balance_cents"], 500, "{bal}");
}

//! Operator actions through the `florin` command line against real processes: the devnet
//! writes its operator key; `florin admin` blacklists a token and revokes a key with it; the
//! wallet's deposits are then refused with the typed reason and a non-zero exit; the lists
//! survive a restart; a cluster sentinel's faucet is off by default and, turned on, serves
//! only requests signed by the operator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{florin, Devnet, BIN};
use serde_json::Value;

struct User {
    dir: PathBuf,
    node: String,
}

impl User {
    fn run(&self, args: &[&str]) -> Output {
        florin(&self.dir, &self.node, args)
    }

    fn ok(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "florin {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// A command that must fail: its one-line error.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "florin {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    fn wallet(&self, name: &str, args: &[&str]) -> Value {
        let mut a = vec!["wallet", "--wallet", name, "--json"];
        a.extend_from_slice(args);
        self.ok(&a)
    }

    fn address(&self, name: &str) -> String {
        self.wallet(name, &["address"])["address"]
            .as_str()
            .unwrap()
            .to_string()
    }

    /// `payee` requests `amount` offline from `payer`, who pays; `payee` accepts.
    fn pay(&self, payer: &str, payee: &str, amount: &str, tag: &str) {
        let req = format!("{tag}.req");
        let pay = format!("{tag}.pay");
        self.wallet(payee, &["offline", "request", amount, "--out", &req]);
        self.wallet(payer, &["offline", "pay", &req, "--out", &pay]);
        self.wallet(payee, &["offline", "accept", &pay]);
    }

    /// The serials of the tokens `name` received offline (from its wallet file).
    fn offline_serials(&self, name: &str) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join(name)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["state"] == "offline")
            .map(|t| {
                let bytes = hex::decode(t["token"].as_str().unwrap()).unwrap();
                florin_token::Token::decode(&bytes).unwrap().serial_hex()
            })
            .collect()
    }
}

#[cfg(unix)]
fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn operator_blacklists_and_revokes_and_deposits_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let net = Devnet::start(&data);
    let key = data.join("operator.key");
    let key_s = key.to_str().unwrap().to_string();
    assert!(key.exists(), "the devnet writes its operator key");
    #[cfg(unix)]
    assert_eq!(mode(&key), 0o600);
    let u = User {
        dir: dir.path().to_path_buf(),
        node: net.url.clone(),
    };
    for w in ["payer", "alice", "bob"] {
        u.wallet(w, &["new", "--no-passphrase"]);
    }
    // The devnet's faucet needs no credential.
    u.wallet("payer", &["faucet", "10"]);
    u.wallet("payer", &["withdraw", "10"]);
    u.pay("payer", "alice", "1", "a");
    u.pay("payer", "bob", "1", "b");
    let alice_serials = u.offline_serials("alice");
    assert!(!alice_serials.is_empty());

    // No key, a stranger's key, a damaged key file: refused, nothing done.
    let err = u.fails(&["admin", "list"]);
    assert!(err.contains("--operator-key"), "{err}");
    std::fs::write(dir.path().join("stranger.key"), "11".repeat(32)).unwrap();
    let err = u.fails(&["admin", "list", "--operator-key", "stranger.key"]);
    assert!(
        err.contains("403") && err.contains("not an operator"),
        "{err}"
    );
    std::fs::write(dir.path().join("bad.key"), "zz").unwrap();
    let err = u.fails(&["admin", "list", "--operator-key", "bad.key"]);
    assert!(err.contains("bad.key"), "the error names the file: {err}");

    // Blacklist alice's tokens: her deposit is refused, typed, with a non-zero exit.
    for s in &alice_serials {
        let e = u.ok(&[
            "admin",
            "blacklist",
            s,
            "--reason",
            "reported stolen",
            "--operator-key",
            &key_s,
            "--json",
        ]);
        assert_eq!(e["subject"], s.as_str(), "{e}");
    }
    let out = u.run(&["wallet", "--wallet", "alice", "--json", "deposit"]);
    assert!(!out.status.success(), "a refused deposit exits non-zero");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("blacklisted"), "{err}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        printed["refused"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("blacklisted: "),
        "{printed}"
    );
    // The wallet is usable afterwards, the refused token no longer counted as held.
    let b = u.wallet("alice", &["balance"]);
    assert_eq!(b["offline_cents"], 0, "{b}");

    // Revoke bob's key (the key from the environment this time): refused, typed, kept pending.
    let bob = u.address("bob");
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .env("FLORIN_NODE", &net.url)
        .env("FLORIN_CA_CERT", common::ca_for(&net.url).unwrap())
        .env("FLORIN_OPERATOR_KEY", &key)
        .args(["admin", "revoke", &bob, "--reason", "double spender"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = u.fails(&["wallet", "--wallet", "bob", "deposit"]);
    assert!(
        err.contains("revoked") && err.contains("double spender"),
        "{err}"
    );
    let b = u.wallet("bob", &["balance"]);
    assert_eq!(
        b["pending_deposit_cents"], 100,
        "kept pending, not lost: {b}"
    );
    // Nor withdraw: the payment to the reserve is confirmed, its tokens are refused (the
    // command exits non-zero) and stay owed to the wallet.
    u.wallet("bob", &["faucet", "2"]);
    let err = u.fails(&["wallet", "--wallet", "bob", "withdraw", "1"]);
    assert!(err.contains("revoked"), "{err}");
    let b = u.wallet("bob", &["balance"]);
    assert_eq!(b["verified_cents"], 0, "{b}");
    assert_eq!(b["withdrawing_cents"], 100, "{b}");

    // Both lists, with who and why; they survive a restart.
    let list = |u: &User| u.ok(&["admin", "list", "--json", "--operator-key", &key_s]);
    let before = list(&u);
    let operator = before["blacklist"][0]["operator"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(operator.starts_with("eur1"), "{before}");
    assert_eq!(
        before["blacklist"].as_array().unwrap().len(),
        alice_serials.len()
    );
    assert_eq!(before["revoked"][0]["subject"], bob.as_str(), "{before}");
    assert_eq!(before["revoked"][0]["reason"], "double spender");
    net.kill();
    let net = Devnet::start(&data);
    let u = User {
        dir: dir.path().to_path_buf(),
        node: net.url.clone(),
    };
    assert_eq!(list(&u), before, "the lists survive a restart");
    let log = u.ok(&["admin", "log", "--json", "--operator-key", &key_s]);
    assert_eq!(
        log.as_array().unwrap().len(),
        alice_serials.len() + 1,
        "{log}"
    );
    let err = u.fails(&["wallet", "--wallet", "bob", "deposit"]);
    assert!(
        err.contains("revoked"),
        "still revoked after the restart: {err}"
    );

    // Lifted: bob's pending deposit goes through.
    u.ok(&[
        "admin",
        "unrevoke",
        &bob,
        "--reason",
        "appeal",
        "--operator-key",
        &key_s,
    ]);
    let d = u.wallet("bob", &["deposit"]);
    assert_eq!(d["credited_cents"], 100, "{d}");
    u.wallet("bob", &["sync"]);
    let b = u.wallet("bob", &["balance"]);
    assert_eq!(
        b["verified_cents"], 100,
        "the withdrawal's tokens arrive: {b}"
    );
    assert_eq!(b["withdrawing_cents"], 0, "{b}");

    // The same key on every start; a damaged key file is refused, naming it.
    let first = std::fs::read_to_string(&key).unwrap();
    net.kill();
    let net = Devnet::start(&data);
    assert_eq!(std::fs::read_to_string(&key).unwrap(), first);
    net.kill();
    std::fs::write(&key, "not a key").unwrap();
    let out = Command::new(BIN)
        .args(["devnet", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a damaged operator key stops the start"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("operator.key"), "{err}");
    // `florin node check` finds it too.
    let out = Command::new(BIN)
        .args(["node", "check", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "node check fails on a damaged operator key"
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("operator.key"), "{all}");
}

/// A cluster sentinel: no faucet by default; turned on in its config, for the operator only.
#[test]
fn cluster_faucet_is_off_by_default_and_operator_only_when_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data_s = data.to_str().unwrap().to_string();
    struct Down(String);
    impl Drop for Down {
        fn drop(&mut self) {
            let _ = Command::new(BIN)
                .args(["cluster", "down", "--data", &self.0])
                .output();
        }
    }
    let _down = Down(data_s.clone());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = format!("127.0.0.1:{port}");
    let up = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args(["cluster", "up", "--shards", "1", "--replicas", "1"])
            .args(["--coordinators", "1", "--data", &data_s, "--api", &api])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cluster up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    up(&[]);
    let key = data.join("operator.key");
    let key_s = key.to_str().unwrap().to_string();
    assert!(key.exists(), "cluster up writes the operator key");
    #[cfg(unix)]
    assert_eq!(mode(&key), 0o600);
    // The sentinel serves TLS with a certificate from the CA `cluster up` made.
    let url = format!("https://{api}");
    common::register_ca(&url, &data.join("tls").join("ca.pem"));
    let u = User {
        dir: dir.path().to_path_buf(),
        node: url.clone(),
    };
    u.wallet("w", &["new", "--no-passphrase"]);
    // Off by default: even the operator gets none.
    let err = u.fails(&[
        "wallet",
        "--wallet",
        "w",
        "faucet",
        "5",
        "--operator-key",
        &key_s,
    ]);
    assert!(
        err.contains("403") && err.contains("faucet is off"),
        "{err}"
    );
    let err = u.fails(&["wallet", "--wallet", "w", "faucet", "5"]);
    assert!(err.contains("faucet is off"), "{err}");

    // The operator turns it on in the sentinel's config and restarts it.
    let cfg_path = data.join("sentinel-0").join("node.toml");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    assert!(cfg.contains("faucet = false"), "the config says so");
    std::fs::write(&cfg_path, cfg.replace("faucet = false", "faucet = true")).unwrap();
    let out = Command::new(BIN)
        .args(["cluster", "kill", "sentinel/0", "--data", &data_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    up(&[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let info = std::net::TcpStream::connect(&api)
            .ok()
            .map(|_| common::http_get(&url, "/v1/info"))
            .unwrap_or_default();
        if info.contains("\"faucet\":true") {
            assert!(info.contains("\"faucet_needs_operator\":true"), "{info}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sentinel did not come back: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let err = u.fails(&["wallet", "--wallet", "w", "faucet", "5"]);
    assert!(
        err.contains("401") && err.contains("operator credential"),
        "{err}"
    );
    let err = u.fails(&[
        "wallet",
        "--wallet",
        "w",
        "faucet",
        "5",
        "--operator-key",
        "stranger.key",
    ]);
    assert!(err.contains("stranger.key"), "{err}");
    let got = u.wallet("w", &["faucet", "5", "--operator-key", &key_s]);
    assert_eq!(got["received_cents"], 500, "{got}");

    // A misspelt setting is refused, not ignored: `cluster status` names the sentinel whose
    // config cannot be read and still shows the rest; `cluster up` refuses to start it.
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(&cfg_path, format!("fuacet = true\n{cfg}")).unwrap();
    let out = Command::new(BIN)
        .args(["cluster", "status", "--json", "--data", &data_s])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let members = status["members"].as_array().unwrap();
    let bad: Vec<&serde_json::Value> = members
        .iter()
        .filter(|m| m["config_error"].is_string())
        .collect();
    assert_eq!(bad.len(), 1, "{status}");
    assert!(
        bad[0]["config_error"].as_str().unwrap().contains("fuacet"),
        "{status}"
    );
    assert!(
        members
            .iter()
            .any(|m| m["role"] == "shard" && m["up"] == true),
        "{status}"
    );
    std::fs::write(&cfg_path, cfg).unwrap();
}

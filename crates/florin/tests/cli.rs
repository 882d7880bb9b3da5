//! The `florin` CLI as a user runs it: a real devnet process on loopback, wallet files, payment
//! files, deposits, fraud proofs, and a `kill -9` in the middle.

#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{florin, http_get, spawn_listening, Devnet, BIN};
use serde_json::Value;

/// A child process killed when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct User {
    dir: PathBuf,
    node: String,
}

impl User {
    /// A user in `dir` whose commands go to the node at `node`.
    fn new(dir: &Path, node: &str) -> User {
        User {
            dir: dir.to_path_buf(),
            node: node.to_string(),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        florin(&self.dir, &self.node, args)
    }

    /// Runs a command that must succeed.
    fn succeeds(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "florin {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn ok(&self, args: &[&str]) -> Value {
        let out = self.succeeds(args);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Runs a command that must succeed and returns its standard output as text.
    fn stdout(&self, args: &[&str]) -> String {
        let out = self.succeeds(args);
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(!out.status.success(), "florin {args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.trim().lines().count(), 1, "errors are one line: {err}");
        assert!(err.starts_with("error: "));
        err
    }

    fn wallet(&self, name: &str, args: &[&str]) -> Value {
        let mut a = vec!["wallet", "--wallet", name, "--json"];
        a.extend_from_slice(args);
        self.ok(&a)
    }

    /// Ledger funds from the faucet, withdrawn into tokens.
    fn tokens(&self, name: &str, amount: &str) {
        self.wallet(name, &["faucet", amount]);
        let w = self.wallet(name, &["withdraw", amount]);
        assert!(w["withdrawn_cents"].as_u64().unwrap() > 0, "{w}");
    }

    fn total(&self, name: &str) -> u64 {
        self.wallet(name, &["balance"])["total_cents"]
            .as_u64()
            .unwrap()
    }

    /// `payee` requests `amount` from `payer`, who pays; `payee` accepts.
    fn pay(&self, payer: &str, payee: &str, amount: &str, tag: &str) {
        let req = format!("{tag}.req");
        let pay = format!("{tag}.pay");
        self.wallet(payee, &["offline", "request", amount, "--out", &req]);
        self.wallet(payer, &["offline", "pay", &req, "--out", &pay]);
        self.wallet(payee, &["offline", "accept", &pay]);
    }
}

/// Wallets `names` paying each its neighbour €0.01 in a loop from threads (each payment a
/// `florin wallet pay` process), collecting the txids answered "confirmed".
struct PayLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handles: Vec<std::thread::JoinHandle<(Vec<String>, usize)>>,
}

impl PayLoad {
    /// Starts `rounds` payments per wallet; with `stop_on_failure` a wallet stops at its first
    /// failed payment (the node died), else it counts failures and goes on.
    fn start(u: &User, names: &[&str], rounds: usize, stop_on_failure: bool) -> PayLoad {
        let addrs: Vec<String> = names
            .iter()
            .map(|n| {
                u.wallet(n, &["address"])["address"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handles = (0..names.len())
            .map(|i| {
                let (dir, node, stop) = (u.dir.clone(), u.node.clone(), stop.clone());
                let (payer, payee) = (names[i].to_string(), addrs[(i + 1) % names.len()].clone());
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    let mut failures = 0;
                    for _ in 0..rounds {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let mut cmd = Command::new(BIN);
                        if let Some(ca) = common::ca_for(&node) {
                            cmd.env("FLORIN_CA_CERT", ca);
                        }
                        let out = cmd
                            .current_dir(&dir)
                            .env("FLORIN_NODE", &node)
                            .args([
                                "wallet", "--wallet", &payer, "--json", "pay", &payee, "0.01",
                            ])
                            .output()
                            .unwrap();
                        if !out.status.success() {
                            failures += 1;
                            if stop_on_failure {
                                break;
                            }
                            continue;
                        }
                        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                        if v["status"] == "confirmed" {
                            acked.push(v["txid"].as_str().unwrap().to_string());
                        }
                    }
                    (acked, failures)
                })
            })
            .collect();
        PayLoad { stop, handles }
    }

    /// Stops the load; returns every acknowledged txid and how many payments failed.
    fn finish(self) -> (Vec<String>, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut acked = Vec::new();
        let mut failures = 0;
        for h in self.handles {
            let (a, f) = h.join().unwrap();
            acked.extend(a);
            failures += f;
        }
        (acked, failures)
    }
}

/// A devnet on a fresh data directory, and a user with `wallets` created.
fn setup(wallets: &[&str]) -> (tempfile::TempDir, Devnet, User) {
    let dir = tempfile::tempdir().unwrap();
    let net = Devnet::start(&dir.path().join("data"));
    let u = User::new(dir.path(), &net.url);
    for w in wallets {
        let v = u.wallet(w, &["new", "--no-passphrase"]);
        assert!(v["address"].as_str().unwrap().starts_with("eur1"));
    }
    (dir, net, u)
}

#[test]
fn a_closed_standard_output_ends_quietly() {
    // `florin … | head`: the reader goes away before florin prints. No panic, no backtrace:
    // exit 141 (as if killed by SIGPIPE), or 0 should the output have fit in before.
    let dir = tempfile::tempdir().unwrap();
    for _ in 0..3 {
        let w = dir.path().join(format!("w{}.json", rand_suffix()));
        let mut child = Command::new(BIN)
            .args(["wallet", "--node", "http://127.0.0.1:1", "--wallet"])
            .arg(&w)
            .args(["new", "--no-passphrase"])
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            out.status.success() || out.status.code() == Some(141),
            "{:?}: {err}",
            out.status
        );
    }
}

fn rand_suffix() -> u64 {
    use std::time::SystemTime;
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[test]
fn faucet_five_offline_hops_then_deposit() {
    let (_dir, _net, u) = setup(&["w0", "w1", "w2", "w3", "w4", "w5"]);
    u.tokens("w0", "20");
    assert_eq!(u.wallet("w0", &["balance"])["verified_cents"], 2000);
    // Five hops: w0 → w1 → w2 → w3 → w4 → w5, €5 each time.
    for i in 0..5 {
        u.pay(
            &format!("w{i}"),
            &format!("w{}", i + 1),
            "5",
            &format!("hop{i}"),
        );
    }
    let b = u.wallet("w5", &["balance"]);
    assert_eq!(b["offline_cents"], 500);
    assert_eq!(b["total_cents"], 500);
    assert_eq!(u.total("w0"), 1500);
    let d = u.wallet("w5", &["deposit", "--reanchor"]);
    assert_eq!(d["credited_cents"], 500);
    assert_eq!(d["fraud"].as_array().unwrap().len(), 0);
    let b = u.wallet("w5", &["balance"]);
    assert_eq!(
        (b["verified_cents"].as_u64(), b["offline_cents"].as_u64()),
        (Some(500), Some(0))
    );
    // The re-anchored tokens are spendable again.
    u.wallet("w6", &["new", "--no-passphrase"]);
    u.pay("w5", "w6", "5", "again");
    assert_eq!(u.total("w6"), 500);
    let fraud = u.ok(&["fraud", "list", "--json"]);
    assert_eq!(fraud.as_array().unwrap().len(), 0);
}

#[test]
fn copied_wallet_double_spend_yields_one_proof_naming_the_payer() {
    let (dir, _net, u) = setup(&["payer", "alice", "bob"]);
    u.tokens("payer", "0.05"); // a single 5-cent token
    let payer_addr = u.wallet("payer", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::copy(dir.path().join("payer"), dir.path().join("payer-copy")).unwrap();
    u.pay("payer", "alice", "0.05", "a");
    u.pay("payer-copy", "bob", "0.05", "b");
    let a = u.wallet("alice", &["deposit"]);
    let b = u.wallet("bob", &["deposit"]);
    // Exactly one of the two deposits is credited; the other reports the fraud.
    let credited = a["credited_cents"].as_u64().unwrap() + b["credited_cents"].as_u64().unwrap();
    assert_eq!(credited, 5);
    assert_eq!(b["fraud"][0]["culprit"], payer_addr.as_str());
    let list = u.ok(&["fraud", "list", "--json", "--save", "proofs"]);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "exactly one fraud proof");
    assert_eq!(list[0]["culprit"], payer_addr.as_str());
    let proof_file = format!("proofs/{}.proof", list[0]["id"].as_str().unwrap());
    let authority = u.ok(&["wallet", "--wallet", "alice", "--json", "balance"]); // wallet usable
    assert!(authority.is_object());
    let v = u.ok(&["fraud", "verify", &proof_file, "--json"]);
    assert_eq!(v["valid"], true);
    assert_eq!(v["culprit"], payer_addr.as_str());
    // A tampered proof fails with a non-zero exit.
    let mut bytes = std::fs::read(dir.path().join(&proof_file)).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 1;
    std::fs::write(dir.path().join("bad.proof"), bytes).unwrap();
    u.fails(&["fraud", "verify", "bad.proof"]);
    std::fs::write(dir.path().join("junk.proof"), b"not a proof").unwrap();
    u.fails(&["fraud", "verify", "junk.proof"]);
    // Depositing again changes nothing.
    let again = u.wallet("bob", &["deposit"]);
    assert_eq!(again["credited_cents"], 0);
    assert_eq!(
        u.ok(&["fraud", "list", "--json"]).as_array().unwrap().len(),
        1
    );
}

#[test]
fn replayed_payment_and_bad_input_are_refused() {
    let (dir, _net, u) = setup(&["a", "b", "c"]);
    u.tokens("a", "3");
    u.pay("a", "b", "1", "p1");
    let err = u.fails(&["wallet", "--wallet", "b", "offline", "accept", "p1.pay"]);
    assert!(
        err.contains("replayed") || err.contains("no open request"),
        "{err}"
    );
    // The replayed file against a new request of the same payee is refused too.
    u.wallet("b", &["offline", "request", "1", "--out", "p2.req"]);
    u.fails(&["wallet", "--wallet", "b", "offline", "accept", "p1.pay"]);
    // Someone else's payment.
    u.fails(&["wallet", "--wallet", "c", "offline", "accept", "p1.pay"]);
    // Malformed files and amounts.
    std::fs::write(dir.path().join("garbage"), b"\x01garbage").unwrap();
    u.fails(&["wallet", "--wallet", "b", "offline", "accept", "garbage"]);
    u.fails(&[
        "wallet", "--wallet", "a", "offline", "pay", "garbage", "--out", "x",
    ]);
    u.fails(&["wallet", "--wallet", "a", "faucet", "1.234"]);
    u.fails(&["wallet", "--wallet", "a", "faucet", "-1"]);
    u.fails(&["wallet", "--wallet", "missing", "balance"]);
    u.fails(&["wallet", "--wallet", "a", "new", "--no-passphrase"]);
    // Exact change impossible is explained (a single 5-cent token cannot pay 3 cents).
    u.tokens("c", "0.05");
    u.wallet("b", &["offline", "request", "0.03", "--out", "three.req"]);
    let err = u.fails(&[
        "wallet",
        "--wallet",
        "c",
        "offline",
        "pay",
        "three.req",
        "--out",
        "x",
    ]);
    assert!(err.contains("exact change is impossible"), "{err}");
    // Insufficient funds is explained.
    u.wallet("c", &["offline", "request", "50", "--out", "big.req"]);
    let err = u.fails(&[
        "wallet", "--wallet", "a", "offline", "pay", "big.req", "--out", "x",
    ]);
    assert!(err.contains("insufficient"), "{err}");
    assert_eq!(u.total("a"), 200);
    assert_eq!(u.total("b"), 100);
}

#[test]
fn concurrent_commands_on_one_wallet_never_sign_a_token_twice() {
    let (dir, _net, u) = setup(&["payer", "p1", "p2", "p3", "p4"]);
    u.tokens("payer", "0.05"); // one token
    let payees = ["p1", "p2", "p3", "p4"];
    for p in payees {
        u.wallet(
            p,
            &["offline", "request", "0.05", "--out", &format!("{p}.req")],
        );
    }
    // Four payments of the same token at once: the wallet lock lets exactly one through.
    let children: Vec<_> = payees
        .iter()
        .map(|p| {
            Command::new(BIN)
                .current_dir(dir.path())
                .args([
                    "wallet",
                    "--wallet",
                    "payer",
                    "offline",
                    "pay",
                    &format!("{p}.req"),
                    "--out",
                    &format!("{p}.pay"),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let ok = children
        .into_iter()
        .map(|mut c| c.wait().unwrap().success())
        .filter(|s| *s)
        .count();
    assert_eq!(ok, 1, "exactly one payment may spend the token");
    assert_eq!(u.total("payer"), 0);
}

#[test]
fn acknowledged_state_survives_kill_9() {
    let (dir, net, u) = setup(&["a", "b", "c"]);
    u.tokens("a", "2");
    std::fs::copy(dir.path().join("a"), dir.path().join("a-copy")).unwrap();
    u.pay("a", "b", "2", "x");
    u.wallet("b", &["deposit", "--reanchor"]);
    net.kill();

    // Restart on the same data: same authority key, history kept.
    let net = Devnet::start(&dir.path().join("data"));
    let u = User::new(dir.path(), &net.url);
    u.pay("a-copy", "c", "2", "y");
    let d = u.wallet("c", &["deposit"]);
    assert_eq!(
        d["credited_cents"], 0,
        "the history from before the crash catches the double spend"
    );
    assert!(!d["fraud"].as_array().unwrap().is_empty());
    // b's re-anchored tokens from before the crash still deposit cleanly after more hops.
    u.pay("b", "c", "2", "z");
    let d = u.wallet("c", &["deposit"]);
    assert_eq!(d["credited_cents"], 200);
}

/// Runs `florin bench SUITE --json --quick EXTRA…` in a fresh directory without a PostgreSQL
/// URL; checks it succeeded and printed its suite. Returns the JSON and stderr.
fn bench_json(suite: &str, extra: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .env_remove("FLORIN_BENCH_PG")
        .args(["bench", suite, "--json", "--quick"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["suite"], suite);
    (v, stderr)
}

#[test]
fn bench_offline_quick_prints_the_contract() {
    let (v, _) = bench_json("offline", &["--tokens", "60"]);
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    let names: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for n in [
        "mint_tokens_per_s",
        "client_verify_tokens_per_s",
        "authority_verify_sigs_per_s_per_core",
        "e2e_authority_sign_tokens_per_s",
        "e2e_recipient1_validate_tokens_per_s",
        "e2e_recipient2_validate_tokens_per_s",
        "e2e_authority_validate_tokens_per_s",
    ] {
        assert!(names.contains(&n), "missing {n}");
    }
    for r in v["results"].as_array().unwrap() {
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn bench_ledger_quick_prints_the_contract() {
    let (v, stderr) = bench_json("ledger", &[]);
    let results = v["results"].as_array().unwrap();
    let has = |name: &str, store: Option<&str>| {
        results
            .iter()
            .any(|r| r["name"] == name && store.is_none_or(|s| r["params"]["store"] == s))
    };
    assert!(has("swap_per_s", Some("memory")) && has("swap_per_s", Some("embedded")));
    assert!(has("sentinel_tx_per_s_per_core", None) && has("sentinel_tx_per_s_all_cores", None));
    for name in [
        "e2e_tx_per_s",
        "e2e_latency_ms_p50",
        "e2e_latency_ms_p99",
        "e2e_latency_ms_p999",
        "e2e_vs_sentinel_ratio",
    ] {
        assert!(has(name, None), "{name} missing");
    }
    // Hamilton Fig. 7: both axes from 0 to 30 %.
    let mix = |ds: u64, large: u64| {
        results.iter().any(|r| {
            r["name"] == "mix_valid_tx_per_s"
                && r["params"]["double_spend_pct"] == ds
                && r["params"]["large_pct"] == large
                && r["value"].as_f64().unwrap() > 0.0
        })
    };
    assert!(mix(0, 0) && mix(30, 0) && mix(0, 30));
    // What logging and metrics cost, both ways of submitting (the quick scale's figure is
    // noisy: only its presence and sense are checked here; the target is the benchmark's).
    for api in ["single", "batch"] {
        let r = results
            .iter()
            .find(|r| r["name"] == "observability_cpu_overhead_ratio" && r["params"]["api"] == api)
            .unwrap_or_else(|| panic!("observability_cpu_overhead_ratio {api} missing"));
        assert!(r["value"].as_f64().unwrap() > 0.0);
        assert!(r["params"]["on_cpu_us_per_tx"].as_f64().unwrap() > 0.0);
        assert!(r["params"]["pairs"].as_u64().unwrap() >= 5);
    }
    // Without a PostgreSQL URL the PostgreSQL store is skipped, and says so.
    assert!(stderr.contains("PostgreSQL store skipped"));
}

#[test]
fn bench_transfer_quick_prints_the_contract() {
    let (v, _) = bench_json("transfer", &[]);
    let results = v["results"].as_array().unwrap();
    let get = |name: &str, layer: Option<&str>| {
        results
            .iter()
            .find(|r| r["name"] == name && layer.is_none_or(|l| r["params"]["layer"] == l))
            .unwrap_or_else(|| panic!("{name} {layer:?} missing"))["value"]
            .as_f64()
            .unwrap()
    };
    for layer in ["udp_raw", "tcp", "channel"] {
        assert!(get("transfer_mb_per_s", Some(layer)) > 0.0);
    }
    assert!(get("channel_vs_tcp_ratio", None) > 0.0);
    assert!(get("channel_vs_eva_ratio", None) > 0.0);
    assert!(get("e2e_tokens_per_s", None) > 0.0);
    assert_eq!(get("lost_or_duplicated_tokens", None), 0.0);
}

#[test]
fn walkthrough_faucet_pay_sync_withdraw_offline_deposit_audit() {
    let (_dir, _net, u) = setup(&["alice", "bob", "carol"]);
    u.wallet("alice", &["faucet", "50"]);
    let bob = u.wallet("bob", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    let p = u.wallet("alice", &["pay", &bob, "12.50"]);
    assert_eq!(p["status"], "confirmed");
    // Bob counts the money only after sync: handoff from the mailbox, checked unspent.
    assert_eq!(u.wallet("bob", &["balance"])["online_cents"], 0);
    assert_eq!(u.wallet("bob", &["sync"])["received_cents"], 1250);
    assert_eq!(
        u.wallet("bob", &["sync"])["received_cents"],
        0,
        "a handoff counts once"
    );
    // Withdraw into tokens, pay Carol offline, Carol deposits back to the ledger.
    let w = u.wallet("bob", &["withdraw", "10"]);
    assert_eq!(w["withdrawn_cents"], 1000);
    u.pay("bob", "carol", "7.50", "off");
    let d = u.wallet("carol", &["deposit"]);
    assert_eq!(d["credited_cents"], 750);
    let c = u.wallet("carol", &["balance"]);
    assert_eq!(
        (c["online_cents"].as_u64(), c["offline_cents"].as_u64()),
        (Some(750), Some(0))
    );
    let b = u.wallet("bob", &["balance"]);
    assert_eq!(
        (b["online_cents"].as_u64(), b["verified_cents"].as_u64()),
        (Some(250), Some(250))
    );
    assert_eq!(u.total("alice"), 3750);
    // The books add up: €50 minted = €40 on the ledger with users + €2.50 in tokens (backed by
    // the reserve) ... exactly.
    let a = u.ok(&["audit", "--json"]);
    assert_eq!(a["balanced"], true, "{a}");
    assert_eq!(a["minted_cents"], 5000);
    assert_eq!(a["tokens_outstanding_cents"], 250);
    assert_eq!(a["reserve_cents"], 250);
    assert_eq!(a["ledger_circulating_cents"], 4750);
    // Bad input: paying more than held, a malformed address.
    u.fails(&["wallet", "--wallet", "bob", "pay", &bob, "1000"]);
    u.fails(&["wallet", "--wallet", "bob", "pay", "eur1nonsense", "1"]);
}

#[test]
fn kill_9_under_load_loses_no_acknowledged_transaction() {
    let names = ["p0", "p1", "p2", "p3"];
    let (dir, net, u) = setup(&names);
    for n in names {
        u.wallet(n, &["faucet", "100"]);
    }
    // Each payer pays its neighbour in a loop until the node dies; every confirmed answer is
    // an acknowledgement that must survive.
    let load = PayLoad::start(&u, &names, 200, true);
    std::thread::sleep(Duration::from_millis(1500));
    net.kill();
    let (acked, _) = load.finish();
    assert!(
        acked.len() >= 4,
        "the load ran ({} acknowledged)",
        acked.len()
    );

    let net = Devnet::start(&dir.path().join("data"));
    let u = User::new(dir.path(), &net.url);
    let addr = net.url.trim_start_matches("http://").to_string();
    for txid in &acked {
        let body = http_get(&addr, &format!("/v1/ledger/transactions/{txid}"));
        assert!(
            body.contains("\"confirmed\""),
            "acknowledged transaction {txid} lost: {body}"
        );
    }
    // Wallets resume whatever was in flight (a payer delivers handoffs its crash left in its
    // outbox on its own sync, so a second round lets every payee collect), and the books add up.
    for _round in 0..2 {
        for n in names {
            u.wallet(n, &["sync"]);
        }
    }
    let total: u64 = names.iter().map(|n| u.total(n)).sum();
    assert_eq!(total, 40_000, "no money created or lost");
    assert_eq!(u.ok(&["audit", "--json"])["balanced"], true);
}

/// `devnet --custody threshold`: the issuer's and the authority's keys live as shares in a
/// 2-of-3 network of node processes; faucet, payment, withdraw and deposit work as with key
/// files, and keep working with one node killed.
/// Runs `florin SUBCOMMAND down --data DIR` when dropped, so a failing test leaves no
/// processes behind.
struct Down(&'static str, String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(BIN)
            .args([self.0, "down", "--data", &self.1])
            .output();
    }
}

/// Runs `florin ARGS` (no node set), which must succeed.
fn run_ok(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "florin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A loopback address whose port was free when picked.
fn free_api() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

#[test]
fn threshold_custody_devnet_faucet_pay_withdraw_deposit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let custody = data.join("custody");
    let custody_s = custody.to_str().unwrap().to_string();
    let _down = Down("custody", custody_s.clone());
    let net = Devnet::start_with(&data, &["--custody", "threshold"]);
    let u = User::new(dir.path(), &net.url);
    // No key files: the keys exist only as shares.
    assert!(!data.join("authority.key").exists());
    assert!(!data.join("issuer.key").exists());
    let st = u.ok(&["custody", "status", "--data", &custody_s, "--json"]);
    assert_eq!(st["up"], 3, "{st}");
    let keys = st["nodes"][0]["keys"].as_array().unwrap();
    let authority_pk = keys.iter().find(|k| k[0] == "authority").unwrap()[1].clone();
    for w in ["alice", "bob", "carol"] {
        u.wallet(w, &["new", "--no-passphrase"]);
    }
    // The authority the wallets see is the threshold key.
    let info = net.get("/v1/info");
    assert_eq!(info["authority"], authority_pk, "{info}");
    u.wallet("alice", &["faucet", "30"]);
    let bob = u.wallet("bob", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        u.wallet("alice", &["pay", &bob, "10"])["status"],
        "confirmed"
    );
    assert_eq!(u.wallet("bob", &["sync"])["received_cents"], 1000);
    // One node dies: a quorum of two still mints and signs tokens.
    u.ok(&["custody", "kill", "1", "--data", &custody_s]);
    assert_eq!(u.wallet("bob", &["withdraw", "6"])["withdrawn_cents"], 600);
    u.pay("bob", "carol", "4", "thr");
    assert_eq!(u.wallet("carol", &["deposit"])["credited_cents"], 400);
    let a = u.ok(&["audit", "--json"]);
    assert_eq!(a["balanced"], true, "{a}");
    assert_eq!(a["minted_cents"], 3000);
    // A second node dies: below the threshold, minting fails with a clear error, not a hang.
    u.ok(&["custody", "kill", "2", "--data", &custody_s]);
    let start = Instant::now();
    let err = u.fails(&["wallet", "--wallet", "carol", "faucet", "1"]);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    assert!(err.contains("key-management"), "{err}");
    // Nodes tied to a devnet exit within 250 ms of it: wait until none answers, so the next
    // devnet starts its own instead of finding the old ones about to go.
    let all_down = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = u.run(&["custody", "status", "--data", &custody_s, "--json"]);
            let st: Value = serde_json::from_slice(&st.stdout).unwrap_or(Value::Null);
            if st["up"] == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "nodes did not exit: {st}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The devnet restarts the missing nodes; their shares survived.
    drop(net);
    all_down();
    let net = Devnet::start_with(&data, &["--custody", "threshold"]);
    let u = User::new(dir.path(), &net.url);
    assert_eq!(net.get("/v1/info")["authority"], authority_pk);
    u.wallet("carol", &["faucet", "1"]);
    let a = u.ok(&["audit", "--json"]);
    assert_eq!(a["balanced"], true, "{a}");
    assert_eq!(a["minted_cents"], 3100);
    // Proactive refresh while the devnet runs: every share is new, the keys are the same,
    // and the devnet's signers take up the new shares by themselves.
    let out = u.run(&["custody", "refresh", "--all", "--data", &custody_s]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("authority") && text.contains("issuer"),
        "{text}"
    );
    assert!(text.contains(authority_pk.as_str().unwrap()), "{text}");
    u.wallet("carol", &["faucet", "1"]);
    assert_eq!(
        u.wallet("carol", &["withdraw", "1"])["withdrawn_cents"],
        100
    );
    assert_eq!(net.get("/v1/info")["authority"], authority_pk);
    let a = u.ok(&["audit", "--json"]);
    assert_eq!(a["balanced"], true, "{a}");
    assert_eq!(a["minted_cents"], 3200);
    let err = u.fails(&["custody", "refresh", "--data", &custody_s]);
    assert!(err.contains("--all"), "{err}");
    // Export gives the signing scalar in a form no key-file reader mistakes for a seed.
    let out = u.run(&["custody", "export", "issuer", "--data", &custody_s]);
    assert!(out.status.success());
    let exported = dir.path().join("issuer.exported");
    std::fs::write(&exported, &out.stdout).unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ed25519-scalar:"));
    let err = u.fails(&[
        "custody",
        "import",
        "again",
        "--from",
        exported.to_str().unwrap(),
        "--data",
        &custody_s,
    ]);
    assert!(err.contains("scalar"), "{err}");
    // The devnet's keys are in the network: local mode refuses instead of making new ones.
    drop(net);
    let out = Command::new(BIN)
        .args(["devnet", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--custody threshold"));
    // Node 3 loses its share of the issuer key; `repair` rebuilds it from the other two.
    all_down();
    let nodes = Devnet::start_with(&data, &["--custody", "threshold"]);
    let share3 = custody.join("node-3").join("shares").join("issuer.share");
    u.ok(&["custody", "kill", "3", "--data", &custody_s]);
    std::fs::remove_file(&share3).unwrap();
    drop(nodes);
    all_down();
    let node = |p: u16| {
        let cfg = custody.join(format!("node-{p}")).join("node.json");
        KillOnDrop(
            Command::new(BIN)
                .args(["custody", "node", "--config"])
                .arg(cfg)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let running: Vec<KillOnDrop> = (1..=3).map(node).collect();
    let holds_issuer = |p: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = u.run(&["custody", "status", "--data", &custody_s, "--json"]);
            let st: Value = serde_json::from_slice(&st.stdout).unwrap_or(Value::Null);
            if st["up"] == 3 {
                return st["nodes"][p]["keys"].to_string().contains("issuer");
            }
            assert!(Instant::now() < deadline, "nodes did not come up: {st}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(!holds_issuer(2));
    u.ok(&[
        "custody", "repair", "issuer", "--party", "3", "--data", &custody_s,
    ]);
    assert!(share3.exists());
    assert!(holds_issuer(2));
    drop(running);
    all_down();
    // The devnet does it by itself when it starts nodes and finds a share lost.
    std::fs::remove_file(&share3).unwrap();
    let net = Devnet::start_with(&data, &["--custody", "threshold"]);
    assert!(holds_issuer(2));
    assert!(share3.exists());
    // A node that answers with its identity is not replaced.
    let err = u.fails(&[
        "custody",
        "replace-node",
        "--party",
        "3",
        "--data",
        &custody_s,
    ]);
    assert!(err.contains("not lost"), "{err}");
    drop(net);
    // Node 3's machine is lost whole (identity and seal keys, shares, config): it gets a new
    // identity in every config, and the next devnet rebuilds its shares of both keys.
    all_down();
    let node3 = custody.join("node-3");
    let old_identity = std::fs::read(node3.join("identity.key")).unwrap();
    std::fs::remove_dir_all(&node3).unwrap();
    let out = u.run(&[
        "custody",
        "replace-node",
        "--party",
        "3",
        "--data",
        &custody_s,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(
        std::fs::read(node3.join("identity.key")).unwrap(),
        old_identity
    );
    let net = Devnet::start_with(&data, &["--custody", "threshold"]);
    assert!(holds_issuer(2));
    let st = u.ok(&["custody", "status", "--data", &custody_s, "--json"]);
    assert!(
        st["nodes"][2]["keys"].to_string().contains("authority"),
        "{st}"
    );
    // Node 3 signs with node 2 alone.
    u.ok(&["custody", "kill", "1", "--data", &custody_s]);
    let w = User::new(dir.path(), &net.url);
    w.wallet("carol", &["faucet", "1"]);
    assert_eq!(
        w.wallet("carol", &["withdraw", "1"])["withdrawn_cents"],
        100
    );
    drop(net);
    // A client key limited to some keys, then revoked, in every node's config.
    let node1 = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(custody.join("node-1").join("node.json")).unwrap())
            .unwrap()
    };
    let keys = "psp-a-*,ops";
    u.ok(&[
        "custody", "grant", &bob, "--keys", keys, "--data", &custody_s,
    ]);
    assert_eq!(
        node1()["grants"][&bob],
        serde_json::json!(["psp-a-*", "ops"])
    );
    assert!(node1()["clients"]
        .as_array()
        .unwrap()
        .contains(&bob.clone().into()));
    let err = u.fails(&[
        "custody", "grant", &bob, "--keys", "PSP", "--data", &custody_s,
    ]);
    assert!(err.contains("key pattern"), "{err}");
    u.ok(&["custody", "revoke", &bob, "--data", &custody_s]);
    assert!(node1()["grants"].get(&bob).is_none());
    assert!(!node1()["clients"].as_array().unwrap().contains(&bob.into()));
}

/// `florin custody` with ECDSA: a network at the insecure test level, a P-256 key by DKG,
/// interactive and presignature signing, export then import of the same key, refusals.
#[test]
fn custody_ecdsa_keygen_sign_export_import() {
    let dir = tempfile::tempdir().unwrap();
    let kmn = dir.path().join("kmn");
    let k = kmn.to_str().unwrap().to_string();
    let _down = Down("custody", k.clone());
    let u = User::new(dir.path(), "http://127.0.0.1:9");
    u.ok(&[
        "custody",
        "up",
        "--data",
        &k,
        "--keys",
        "issuer",
        "--ecdsa",
        "insecure-test",
    ]);
    let st = u.ok(&["custody", "status", "--data", &k, "--json"]);
    for node in st["nodes"].as_array().unwrap() {
        assert_eq!(node["ecdsa"]["aux_ready"], true, "{st}");
    }
    let key = u.ok(&[
        "custody", "keygen", "w1", "--scheme", "p256", "--data", &k, "--json",
    ]);
    let pk = key["public_key"].as_str().unwrap().to_string();
    assert_eq!(pk.len(), 66);
    // Each node serves its own metrics: its pools, the ECDSA key just made among its keys.
    for party in 1..=3 {
        let cfg: Value = serde_json::from_slice(
            &std::fs::read(kmn.join(format!("node-{party}/node.json"))).unwrap(),
        )
        .unwrap();
        let addr = cfg["metrics"]
            .as_str()
            .expect("custody up assigns a metrics address");
        let text = http_get(addr, "/metrics");
        let depth = |what: &str| -> f64 {
            let name = format!("florin_custody_pool_depth{{pool=\"party{party}-{what}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(name.as_str()))
                .unwrap_or_else(|| panic!("no {name} in {text}"))
                .trim()
                .parse()
                .unwrap()
        };
        assert!(depth("nonces") > 0.0, "party {party}: FROST nonces ready");
        assert!(depth("keys") >= 1.0, "party {party}: the ECDSA key");
        assert!(depth("presignatures") >= 0.0);
    }
    for extra in [&[][..], &["--presigned"][..]] {
        let mut a = vec!["custody", "sign", "w1", "c0ffee", "--data", &k, "--json"];
        a.extend_from_slice(extra);
        let s = u.ok(&a);
        assert_eq!(s["valid"], true, "{s}");
        assert_eq!(s["public_key"], pk.as_str());
    }
    // One name, one key; a FROST key of that name is refused too.
    let err = u.fails(&["custody", "keygen", "w1", "--data", &k]);
    assert!(err.contains("exists"), "{err}");
    // Export, then import under another name: the same public key.
    let out = u.run(&["custody", "export", "w1", "--data", &k]);
    assert!(out.status.success());
    std::fs::write(dir.path().join("w1.secret"), &out.stdout).unwrap();
    let imported = u.stdout(&[
        "custody",
        "import",
        "w2",
        "--scheme",
        "p256",
        "--from",
        "w1.secret",
        "--data",
        &k,
    ]);
    assert!(imported.contains(&pk));
    // Key addition: w1 + a key handed over; its holder's key differs from the sum.
    let r2 = "p256-secret:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    std::fs::write(dir.path().join("r2.secret"), r2).unwrap();
    let sum = u.stdout(&[
        "custody",
        "add-key",
        "w4",
        "--from",
        "w1",
        "--addend",
        "r2.secret",
        "--data",
        &k,
    ]);
    assert!(sum.starts_with("w4  p256:") && !sum.contains(&pk), "{sum}");
    let s = u.ok(&["custody", "sign", "w4", "c0ffee", "--data", &k, "--json"]);
    assert_eq!(s["valid"], true, "{s}");
    assert_eq!(
        format!("w4  p256:{}", s["public_key"].as_str().unwrap()),
        sum.trim()
    );
    let err = u.fails(&[
        "custody",
        "add-key",
        "w5",
        "--from",
        "nope",
        "--addend",
        "r2.secret",
        "--data",
        &k,
    ]);
    assert!(err.contains("nope"), "{err}");
    std::fs::write(dir.path().join("bad.secret"), "not hex").unwrap();
    u.fails(&[
        "custody",
        "add-key",
        "w5",
        "--from",
        "w1",
        "--addend",
        "bad.secret",
        "--data",
        &k,
    ]);
    u.fails(&[
        "custody",
        "import",
        "w3",
        "--scheme",
        "p256",
        "--from",
        "bad.secret",
        "--data",
        &k,
    ]);
    u.fails(&["custody", "up", "--data", &k, "--ecdsa", "weak"]);
    // `commit` finishes a key every node holds (here already committed: it changes nothing)
    // and refuses one that no node holds.
    let again = u.stdout(&["custody", "commit", "w4", "--data", &k]);
    assert_eq!(again.trim(), sum.trim());
    let issuer = u.stdout(&["custody", "commit", "issuer", "--data", &k]);
    assert!(issuer.starts_with("issuer  "), "{issuer}");
    let err = u.fails(&["custody", "commit", "w9", "--data", &k]);
    assert!(err.contains("does not hold it"), "{err}");
}

#[test]
fn bench_custody_quick_prints_the_contract() {
    let (v, _) = bench_json("custody", &[]);
    let results = v["results"].as_array().unwrap();
    let find = |name: &str, key: &str, val: &str| {
        results
            .iter()
            .find(|r| r["name"] == name && r["params"][key] == val)
            .unwrap_or_else(|| panic!("{name} {key}={val} missing"))["value"]
            .as_f64()
            .unwrap()
    };
    for name in ["dkg_ms", "presign_ms", "sign_ms"] {
        assert!(find(name, "part", "compute") > 0.0, "{name}");
    }
    assert!(find("dkg_ms", "part", "wait") >= 0.0);
    for custody in ["threshold", "single"] {
        let r = results
            .iter()
            .filter(|r| {
                r["name"] == "e2e_payments_per_s"
                    && r["params"]["custody"] == custody
                    && r["params"]["path"].is_null()
            })
            .count();
        assert_eq!(r, 4, "{custody}: 2 user counts × 2 routes");
    }
    // Through the payment-provider service with threshold ECDSA keys, both engines: CGGMP24
    // at the insecure test level, DKLs23 at production.
    for (engine, level) in [("cggmp24", "insecure-test"), ("dkls23", "production")] {
        let psp: Vec<&Value> = results
            .iter()
            .filter(|r| {
                r["name"] == "ecdsa_e2e_payments_per_s"
                    && r["params"]["path"] == "psp"
                    && r["params"]["engine"] == engine
            })
            .collect();
        assert_eq!(psp.len(), 4, "{engine}: 2 user counts × 2 routes");
        for r in psp {
            assert_eq!(r["params"]["scheme"], "p256");
            assert_eq!(r["params"]["level"], level);
            assert_eq!(r["params"]["signatures_per_payment"], 1);
            assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
        }
        let errors = results
            .iter()
            .filter(|r| r["name"] == "e2e_error_rate" && r["params"]["engine"] == engine)
            .count();
        assert_eq!(errors, 4, "{engine}: an error rate per point");
    }
    for name in ["dkg_ms", "refresh_ms", "sign_ms"] {
        assert!(
            results.iter().any(|r| r["name"] == name
                && r["params"]["scheme"] == "dkls23-p256"
                && r["params"]["part"] == "compute"
                && r["value"].as_f64().unwrap() > 0.0),
            "dkls23 {name}"
        );
    }
    assert!(find("frost_e2e_vs_seed_ratio", "route", "same_provider") > 0.0);
    assert!(find("threshold_vs_single_e2e_ratio", "route", "same_provider") > 0.0);
    // The floor of that ratio with every party on this machine: above 1, since a threshold
    // signature costs more CPU than the single key's one signature it replaces.
    assert!(
        find(
            "threshold_vs_single_e2e_cpu_floor",
            "route",
            "same_provider"
        ) > 1.0
    );
    assert!(find("sign_ms", "part", "compute_all_parties") > find("sign_ms", "part", "compute"));
    // The ECDSA (CGGMP24) half, labelled with its security level.
    for name in ["aux_info_ms", "dkg_ms", "presign_ms", "sign_ms"] {
        assert!(
            results.iter().any(|r| r["name"] == name
                && r["params"]["scheme"] == "cggmp24-p256"
                && r["params"]["level"] == "insecure-test"
                && r["value"].as_f64().unwrap() > 0.0),
            "ecdsa {name}"
        );
    }
    let p99 = find("ecdsa_online_sign_ms_p99", "level", "insecure-test");
    assert!(p99 > 0.0 && p99 < 1_000.0, "{p99}");
    // And through real key-management nodes, split into total and wait.
    for part in ["total", "wait"] {
        assert!(
            results.iter().any(|r| r["name"] == "sign_ms"
                && r["params"]["scheme"] == "cggmp24-p256"
                && r["params"]["path"] == "network"
                && r["params"]["mode"] == "presignature"
                && r["params"]["part"] == part),
            "networked ecdsa sign_ms {part}"
        );
    }
    assert!(find("ecdsa_presign_refill_per_s", "level", "insecure-test") > 0.0);
}

/// `florin cluster up` with 2 shards × 3 replicas and 3 coordinator replicas as separate
/// processes; wallets pay under load while `kill -9` takes out the leaders of a shard and of
/// the coordinators, then of the other shard; every acknowledged payment is committed, the
/// killed processes restart from their disks, and the books add up.
#[test]
fn cluster_processes_survive_leader_kill_9_under_wallet_load() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data_s = data.to_str().unwrap().to_string();
    let _down = Down("cluster", data_s.clone());
    let api = free_api();
    // The faucet is off on a cluster unless turned on, and then for the operator only.
    run_ok(&[
        "cluster",
        "up",
        "--shards",
        "2",
        "--replicas",
        "3",
        "--coordinators",
        "1",
        "--data",
        &data_s,
        "--api",
        &api,
        "--faucet",
    ]);
    // The sentinels serve TLS with certificates from the CA `cluster up` made.
    let url = format!("https://{api}");
    common::register_ca(&url, &data.join("tls").join("ca.pem"));
    let u = User::new(dir.path(), &url);
    let st = u.ok(&["cluster", "status", "--data", &data_s, "--json"]);
    assert_eq!(st["api"], u.node.as_str(), "{st}");
    assert_eq!(st["healthy"], true, "{st}");
    assert_eq!(st["members"].as_array().unwrap().len(), 10, "{st}");
    raft_metrics_show_one_leader_per_group(&data, &url);

    let names = ["p0", "p1", "p2", "p3"];
    let operator_key = data.join("operator.key");
    let operator_key = operator_key.to_str().unwrap();
    for n in names {
        u.wallet(n, &["new", "--no-passphrase"]);
        u.wallet(n, &["faucet", "100", "--operator-key", operator_key]);
    }
    let load = PayLoad::start(&u, &names, 300, false);
    std::thread::sleep(Duration::from_millis(1500));
    let k1 = u.run(&["cluster", "kill", "shard/0", "--data", &data_s]);
    let k2 = u.run(&["cluster", "kill", "coordinator/0", "--data", &data_s]);
    assert!(k1.status.success() && k2.status.success());
    std::thread::sleep(Duration::from_millis(2500));
    let k3 = u.run(&["cluster", "kill", "shard/1", "--data", &data_s]);
    assert!(
        k3.status.success(),
        "{}",
        String::from_utf8_lossy(&k3.stderr)
    );
    std::thread::sleep(Duration::from_millis(2500));
    let (acked, failures) = load.finish();
    assert!(
        acked.len() >= 8,
        "the load ran ({} acknowledged)",
        acked.len()
    );
    // The surviving majorities elected new leaders: still healthy with three processes dead.
    let st = u.ok(&["cluster", "status", "--data", &data_s, "--json"]);
    assert_eq!(st["healthy"], true, "{st}");
    let down = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["up"] == false)
        .count();
    assert_eq!(down, 3, "{st}");
    let addr = url.clone();
    for txid in &acked {
        let body = http_get(&addr, &format!("/v1/ledger/transactions/{txid}"));
        assert!(
            body.contains("\"confirmed\""),
            "acknowledged transaction {txid} lost: {body}"
        );
    }
    // The killed shard 1 leader also lost its disk: everything but its config and identity key
    // is wiped, and it must rejoin under its old id and receive the group's state.
    let k3_out = String::from_utf8_lossy(&k3.stdout).to_string();
    let wiped_id: u64 = k3_out
        .split_whitespace()
        .nth(2)
        .and_then(|g| g.split('/').nth(1))
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("which replica was killed? {k3_out}"));
    let wiped = data.join(format!("shard-1-{wiped_id}"));
    for entry in std::fs::read_dir(&wiped).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !["node.toml", "identity.key"].contains(&name.as_str()) {
            if path.is_dir() {
                std::fs::remove_dir_all(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    // `cluster up` restarts the killed processes (two from their disks, one from nothing); they
    // catch up.
    run_ok(&["cluster", "up", "--data", &data_s]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = u.ok(&["cluster", "status", "--data", &data_s, "--json"]);
        let ms = st["members"].as_array().unwrap();
        let all_up = ms.iter().all(|m| m["up"] == true);
        let caught_up = ["shard", "coordinator"].iter().all(|role| {
            (0..2).all(|g| {
                let applied: Vec<&Value> = ms
                    .iter()
                    .filter(|m| m["role"] == *role && m["group"] == g)
                    .map(|m| &m["last_applied"])
                    .collect();
                applied.windows(2).all(|w| w[0] == w[1])
            })
        });
        if all_up && caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "restarted members did not catch up: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for _round in 0..2 {
        for n in names {
            u.wallet(n, &["sync"]);
        }
    }
    let total: u64 = names.iter().map(|n| u.total(n)).sum();
    assert_eq!(
        total, 40_000,
        "no money created or lost ({failures} failed payments)"
    );
    assert_eq!(u.ok(&["audit", "--json"])["balanced"], true);
}

/// Every shard and coordinator replica serves `/metrics` at the address its `node.toml` names:
/// each group has exactly one replica that says it leads, all agree on the term and the
/// leader, and the leader reports each follower's lag; the sentinel's API serves the
/// authority group's and its requests'.
fn raft_metrics_show_one_leader_per_group(data: &Path, api: &str) {
    let value = |text: &str, name: &str| -> Option<f64> {
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then(|| v.parse().unwrap())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    for (role, dir, groups) in [("shard", "shard", 2), ("coordinator", "coord", 1)] {
        for g in 0..groups {
            loop {
                let mut leaders = Vec::new();
                let mut terms = Vec::new();
                let mut lags = 0;
                for id in 1..=3 {
                    let toml =
                        std::fs::read_to_string(data.join(format!("{dir}-{g}-{id}/node.toml")))
                            .unwrap();
                    let addr = toml
                        .lines()
                        .find_map(|l| l.strip_prefix("metrics = \""))
                        .map(|a| a.trim_end_matches('"').to_string())
                        .unwrap_or_else(|| panic!("no metrics address in {toml}"));
                    let text = http_get(&addr, "/metrics");
                    let labels = format!("{{group=\"{role}-{g}\",replica=\"{id}\"}}");
                    if value(&text, &format!("florin_raft_is_leader{labels}")) == Some(1.0) {
                        leaders.push(id);
                        lags = text
                            .lines()
                            .filter(|l| l.starts_with("florin_raft_follower_lag{"))
                            .count();
                    }
                    terms.push(value(&text, &format!("florin_raft_term{labels}")));
                }
                if leaders.len() == 1 && terms.windows(2).all(|w| w[0] == w[1]) && lags == 2 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{role} {g}: leaders {leaders:?}, terms {terms:?}, lags {lags}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    let text = http_get(api, "/metrics");
    let text = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    assert!(
        text.contains("florin_raft_term{group=\"authority\",replica=\"1\"}"),
        "{text}"
    );
    // The first scrape is counted once answered: the second shows it.
    let text = http_get(api, "/metrics");
    assert!(
        text.contains(
            "florin_http_requests_total{route=\"/metrics\",method=\"GET\",status=\"200\"}"
        ),
        "{text}"
    );
}

/// The atomizer architecture as processes (`cluster up --architecture atomizer`): 2 block
/// shards × 3 and 3 atomizer replicas, each process on its own emulated host where the machine
/// can make them (always in CI), else on loopback. Wallets pay while the atomizer's leader and
/// then a shard's leader are killed; every acknowledged payment is confirmed, the block log
/// verifies as one chain holding them, and it still verifies after the killed processes
/// restart from their disks.
#[test]
fn atomizer_cluster_pays_through_leader_kills_and_verifies_its_block_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data_s = data.to_str().unwrap().to_string();
    let _down = Down("cluster", data_s.clone());
    let hosts = hosts_or_skip("atomizer_cluster_on_emulated_hosts");
    let api = free_api();
    let mut up = vec![
        "cluster",
        "up",
        "--architecture",
        "atomizer",
        "--shards",
        "2",
        "--replicas",
        "3",
        "--data",
        &data_s,
        "--faucet",
    ];
    if hosts {
        up.push("--emulate-hosts");
    } else {
        up.extend(["--api", &api]);
    }
    run_ok(&up);
    let st = cluster_status_json(&data_s);
    assert_eq!(st["healthy"], true, "{st}");
    let url = st["api"].as_str().unwrap().to_string();
    if hosts {
        assert!(url.starts_with("https://10.77."), "{st}");
        assert_eq!(st["emulated_hosts"]["hosts"], 10, "{st}");
    }
    common::register_ca(&url, &data.join("tls").join("ca.pem"));
    let u = User::new(dir.path(), &url);
    let members = st["members"].as_array().unwrap();
    assert_eq!(members.len(), 10, "{st}");
    assert_eq!(
        members.iter().filter(|m| m["role"] == "atomizer").count(),
        3,
        "{st}"
    );
    assert!(!members.iter().any(|m| m["role"] == "coordinator"), "{st}");
    let names = ["a0", "a1", "a2"];
    let operator_key = data.join("operator.key");
    let operator_key = operator_key.to_str().unwrap();
    for n in names {
        u.wallet(n, &["new", "--no-passphrase"]);
        u.wallet(n, &["faucet", "100", "--operator-key", operator_key]);
    }
    let load = PayLoad::start(&u, &names, 200, false);
    std::thread::sleep(Duration::from_millis(1500));
    let k1 = u.run(&["cluster", "kill", "atomizer", "--data", &data_s]);
    assert!(
        k1.status.success(),
        "{}",
        String::from_utf8_lossy(&k1.stderr)
    );
    std::thread::sleep(Duration::from_millis(2000));
    let k2 = u.run(&["cluster", "kill", "shard/1", "--data", &data_s]);
    assert!(k2.status.success());
    std::thread::sleep(Duration::from_millis(2000));
    let (acked, _failures) = load.finish();
    assert!(
        acked.len() >= 8,
        "the load ran ({} acknowledged)",
        acked.len()
    );
    for txid in &acked {
        let body = http_get(&url, &format!("/v1/ledger/transactions/{txid}"));
        assert!(
            body.contains("\"confirmed\""),
            "acknowledged transaction {txid} lost: {body}"
        );
    }
    // The block log verifies as one chain holding every acknowledged payment.
    let blocks = u.ok(&["cluster", "blocks", "--data", &data_s, "--json"]);
    assert_eq!(blocks["verified"], true, "{blocks}");
    assert!(
        blocks["txs"].as_u64().unwrap() >= acked.len() as u64 + 3,
        "{blocks}"
    );
    assert_eq!(
        blocks["blocks"].as_array().unwrap().len() as u64,
        blocks["height"].as_u64().unwrap()
    );
    // The killed processes restart from their disks and the log still verifies.
    run_ok(&["cluster", "up", "--data", &data_s]);
    let again = u.ok(&[
        "cluster",
        "blocks",
        "--data",
        &data_s,
        "--summary",
        "--json",
    ]);
    assert_eq!(again["verified"], true, "{again}");
    assert!(again["height"].as_u64() >= blocks["height"].as_u64());
    // A two-phase cluster has no block log; a missing cluster is an error.
    let none = u.run(&[
        "cluster",
        "blocks",
        "--data",
        dir.path().join("nothing").to_str().unwrap(),
    ]);
    assert!(!none.status.success());
}

/// The token authority replicated on three sentinels (`cluster up --sentinels 3`): a wallet
/// given every sentinel's URL withdraws, pays and deposits while the sentinel it was using is
/// killed (an authority replica with it) and online payments run; a double spend deposited
/// after the kill is caught from the token histories recorded before it; the killed sentinel
/// comes back and catches up, the group's leader is then killed, and the sentinel that was
/// down serves the fraud proof, every acknowledged payment and balanced books.
#[test]
fn cluster_authority_replicas_keep_tokens_deposits_and_fraud_proofs_through_sentinel_losses() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data_s = data.to_str().unwrap().to_string();
    let _down = Down("cluster", data_s.clone());
    let api = free_api();
    run_ok(&[
        "cluster",
        "up",
        "--shards",
        "2",
        "--replicas",
        "3",
        "--coordinators",
        "1",
        "--sentinels",
        "3",
        "--data",
        &data_s,
        "--api",
        &api,
        "--faucet",
    ]);
    let ca = data.join("tls").join("ca.pem");
    let status = |u: &User| u.ok(&["cluster", "status", "--data", &data_s, "--json"]);
    let probe = User::new(dir.path(), &format!("https://{api}"));
    common::register_ca(&probe.node, &ca);
    let st = status(&probe);
    let apis: Vec<String> = st["apis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(apis.len(), 3, "{st}");
    for a in &apis {
        common::register_ca(a, &ca);
    }
    let all = apis.join(",");
    common::register_ca(&all, &ca);
    let u = User::new(dir.path(), &all);
    // Every sentinel is a replica of the authority group, and the group has a leader.
    let sentinels = |st: &Value| -> Vec<Value> {
        st["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "sentinel")
            .cloned()
            .collect()
    };
    let wait_healthy = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = status(&u);
            let s = sentinels(&st);
            let caught_up = s
                .windows(2)
                .all(|w| w[0]["last_applied"] == w[1]["last_applied"]);
            if st["healthy"] == true && caught_up {
                return st;
            }
            assert!(Instant::now() < deadline, "{what}: {st}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let st = wait_healthy("the authority group elects a leader");
    assert_eq!(st["members"].as_array().unwrap().len(), 12, "{st}");

    let operator_key = data.join("operator.key");
    let operator_key = operator_key.to_str().unwrap();
    for n in ["payer", "alice", "bob", "p0", "p1"] {
        u.wallet(n, &["new", "--no-passphrase"]);
    }
    u.wallet("payer", &["faucet", "20", "--operator-key", operator_key]);
    let w = u.wallet("payer", &["withdraw", "20"]);
    assert_eq!(w["withdrawn_cents"], 2000, "{w}");
    std::fs::copy(dir.path().join("payer"), dir.path().join("payer-copy")).unwrap();
    for n in ["p0", "p1"] {
        u.wallet(n, &["faucet", "50", "--operator-key", operator_key]);
    }

    // Online payments (each one leaves a handoff in the replicated mailbox) run while the
    // sentinel every wallet was using is killed.
    let load = PayLoad::start(&u, &["p0", "p1"], 200, false);
    std::thread::sleep(Duration::from_millis(1000));
    let k = u.run(&["cluster", "kill", "sentinel/0", "--data", &data_s]);
    assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));
    // Offline cash on the surviving replicas: a payment deposited, and the same tokens spent
    // again from a copy of the wallet.
    u.pay("payer", "alice", "5", "a");
    let a = u.wallet("alice", &["deposit"]);
    assert_eq!(a["credited_cents"], 500, "{a}");
    u.pay("payer-copy", "bob", "5", "b");
    let b = u.wallet("bob", &["deposit"]);
    assert_eq!(b["credited_cents"], 0, "{b}");
    let payer = u.wallet("payer", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(b["fraud"][0]["culprit"], payer.as_str(), "{b}");
    std::thread::sleep(Duration::from_millis(1500));
    let (acked, failures) = load.finish();
    assert!(
        acked.len() >= 4,
        "the load ran ({} acknowledged)",
        acked.len()
    );

    // The killed sentinel comes back and catches up; then the group's leader is killed.
    run_ok(&["cluster", "up", "--data", &data_s]);
    let st = wait_healthy("the restarted sentinel catches up");
    let leader = sentinels(&st)
        .into_iter()
        .find(|m| m["state"] == "leader")
        .unwrap_or_else(|| panic!("no authority leader: {st}"));
    let target = format!("sentinel/{}", leader["group"]);
    let k = u.run(&["cluster", "kill", &target, "--data", &data_s]);
    assert!(k.status.success(), "{}", String::from_utf8_lossy(&k.stderr));

    // The sentinel that was down serves what was recorded while it was: the fraud proof, the
    // acknowledged payments, the books; a deposit through it still works.
    let first = User::new(dir.path(), &apis[0]);
    let proofs = first.ok(&["fraud", "list", "--json"]);
    assert_eq!(proofs.as_array().unwrap().len(), 1, "{proofs}");
    assert_eq!(proofs[0]["culprit"], payer.as_str());
    for txid in &acked {
        let body = http_get(&apis[0], &format!("/v1/ledger/transactions/{txid}"));
        assert!(
            body.contains("\"confirmed\""),
            "acknowledged {txid} lost: {body}"
        );
    }
    let again = u.wallet("bob", &["deposit"]);
    assert_eq!(again["credited_cents"], 0, "{again}");
    for n in ["alice", "p0", "p1"] {
        u.wallet(n, &["sync"]);
    }
    assert_eq!(u.total("alice"), 500);
    assert_eq!(
        u.total("p0") + u.total("p1"),
        10_000,
        "no money created or lost ({failures} failed payments)"
    );
    let audit = first.ok(&["audit", "--json"]);
    assert_eq!(audit["balanced"], true, "{audit}");
}

/// Whether this machine can emulate hosts (root, `ip`, cgroup v1). In CI it must: the test
/// fails there rather than skip.
fn hosts_or_skip(test: &str) -> bool {
    match florin_node::hosts::check_supported() {
        Ok(()) => true,
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("{test} needs emulated hosts in CI: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: {e}");
            false
        }
    }
}

/// `cluster up --emulate-hosts`: 2 shards × 3 replicas, 3 coordinator replicas and 3 sentinels,
/// each process on its own host (its own network namespace, address and CPU share). Wallets
/// pay through the second sentinel while the first shard leader's host is cut off from the
/// network, the coordinator leader is killed and a shard follower's host is frozen; every
/// acknowledged payment is committed, the groups heal, the books balance, and `cluster down`
/// removes every namespace, link and cgroup it made.
#[test]
fn cluster_on_emulated_hosts_survives_a_cut_link_a_kill_and_a_freeze() {
    if !hosts_or_skip("cluster_on_emulated_hosts_survives_a_cut_link_a_kill_and_a_freeze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let data_s = data.to_str().unwrap().to_string();
    let _down = Down("cluster", data_s.clone());
    let out = Command::new(BIN)
        .args([
            "cluster",
            "up",
            "--emulate-hosts",
            "--shards",
            "2",
            "--replicas",
            "3",
        ])
        .args(["--sentinels", "3", "--data", &data_s, "--faucet"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hosts = std::fs::read_to_string(data.join("hosts.toml")).unwrap();
    let tag = hosts
        .lines()
        .find_map(|l| l.strip_prefix("tag = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let st = cluster_status_json(&data_s);
    assert_eq!(st["healthy"], true, "{st}");
    let apis: Vec<String> = st["apis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(apis.len(), 3, "{st}");
    assert_eq!(st["api"], apis[0].as_str());
    assert!(apis.iter().all(|a| a.starts_with("https://10.77.")), "{st}");
    assert_eq!(st["emulated_hosts"]["hosts"], 12, "{st}");
    for m in st["members"].as_array().unwrap() {
        assert!(m["addr"].as_str().unwrap().starts_with("10.77."), "{m}");
    }
    let ca = data.join("tls").join("ca.pem");
    for a in &apis {
        common::register_ca(a, &ca);
    }
    // The faucet through the first sentinel; payments through the second (each holds a replica
    // of the authority: three, so that one may die).
    let first = User::new(dir.path(), &apis[0]);
    let second = User::new(dir.path(), &apis[1]);
    let names = ["h0", "h1", "h2"];
    let operator_key = data.join("operator.key");
    let operator_key = operator_key.to_str().unwrap();
    for n in names {
        first.wallet(n, &["new", "--no-passphrase"]);
        first.wallet(n, &["faucet", "100", "--operator-key", operator_key]);
    }
    let load = PayLoad::start(&second, &names, 200, false);
    std::thread::sleep(Duration::from_millis(1500));
    let drill = |args: &[&str]| {
        let mut a = vec!["cluster"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--data", &data_s]);
        let out = first.run(&a);
        assert!(
            out.status.success(),
            "{a:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let cut = drill(&["cut", "shard/0"]);
    let cut_name = cut.split_whitespace().next().unwrap().to_string();
    drill(&["kill", "coordinator/0"]);
    // A follower of shard 1 (its id differs from the leader's).
    let leader1 = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "shard" && m["group"] == 1 && m["state"] == "leader")
        .map(|m| m["id"].as_u64().unwrap())
        .unwrap();
    let follower = if leader1 == 1 { 2 } else { 1 };
    drill(&["freeze", &format!("shard/1/{follower}")]);
    std::thread::sleep(Duration::from_millis(4000));
    let (acked, failures) = load.finish();
    assert!(
        acked.len() >= 5,
        "the load ran ({} acknowledged)",
        acked.len()
    );
    let cut_id: u64 = cut_name.rsplit('-').next().unwrap().parse().unwrap();
    drill(&["heal", &format!("shard/0/{cut_id}")]);
    drill(&["thaw", &format!("shard/1/{follower}")]);
    for txid in &acked {
        let body = http_get(&apis[1], &format!("/v1/ledger/transactions/{txid}"));
        assert!(
            body.contains("\"confirmed\""),
            "acknowledged transaction {txid} lost: {body}"
        );
    }
    // `cluster up` restarts the killed coordinator; every group has a leader again.
    run_ok(&["cluster", "up", "--data", &data_s]);
    // Wallets given both sentinels, the one without the authority first: ledger requests are
    // answered there, the authority's (the mailbox in `sync`) are passed on to the first.
    let both = format!("{},{}", apis[1], apis[0]);
    common::register_ca(&both, &ca);
    let any = User::new(dir.path(), &both);
    for _round in 0..2 {
        for n in names {
            any.wallet(n, &["sync"]);
        }
    }
    let total: u64 = names.iter().map(|n| any.total(n)).sum();
    assert_eq!(
        total, 30_000,
        "no money created or lost ({failures} failed payments)"
    );
    // The sentinel the wallets were using dies: they fail over to the other one.
    drill(&["kill", "sentinel/1"]);
    let to = any.wallet("h1", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();
    let paid = any.wallet("h0", &["pay", &to, "1"]);
    assert_eq!(paid["status"], "confirmed", "{paid}");
    any.wallet("h1", &["sync"]);
    let total: u64 = names.iter().map(|n| any.total(n)).sum();
    assert_eq!(total, 30_000);
    assert_eq!(first.ok(&["audit", "--json"])["balanced"], true);
    // Down removes the hosts: no namespace, link or cgroup of this network is left.
    let out = Command::new(BIN)
        .args(["cluster", "down", "--data", &data_s])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&tag));
    assert!(!std::fs::read_dir("/sys/fs/cgroup/cpu").unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(&tag)));
}

#[test]
fn bench_cluster_quick_prints_the_contract() {
    let (v, _) = bench_json("cluster", &[]);
    let results = v["results"].as_array().unwrap();
    let get =
        |name: &str| -> Vec<&Value> { results.iter().filter(|r| r["name"] == name).collect() };
    // Throughput at each shard count and replication.
    for replicas in [1, 3] {
        for shards in [1, 2] {
            assert!(
                get("cluster_tx_per_s")
                    .iter()
                    .any(|r| r["params"]["shards"] == shards
                        && r["params"]["replicas"] == replicas
                        && r["value"].as_f64().unwrap() > 0.0),
                "cluster_tx_per_s {shards}×{replicas} missing"
            );
        }
    }
    for name in [
        "single_node_tx_per_s",
        "cluster_r3_vs_single_ratio",
        "failover_recovery_s",
    ] {
        assert!(get(name)[0]["value"].as_f64().unwrap() > 0.0, "{name}");
    }
    // The target ratio comes from pairs of runs, its spread alongside.
    let ratio = &get("cluster_r3_vs_single_ratio")[0]["params"];
    assert_eq!(ratio["pairs"], 2);
    assert!(ratio["min"].as_f64().unwrap() <= ratio["max"].as_f64().unwrap());
    assert!(get("failover_recovery_s")[0]["params"]["recovered"].is_boolean());
    // The killed shard leader comes back from its disk under load and catches up (or says
    // it did not within the run).
    let rejoin = get("failover_rejoin_catch_up_s")[0];
    assert!(rejoin["value"].as_f64().unwrap() >= 0.0);
    assert!(rejoin["params"]["caught_up"].is_boolean());
    // The failover run loses nothing and accepts no double spend.
    assert_eq!(get("failover_lost_tx")[0]["value"], 0.0);
    assert_eq!(get("failover_double_spend_accepted")[0]["value"], 0.0);
    assert!(get("failover_tx_per_s").len() >= 8);
}

/// `florin bench cluster --emulate-hosts --only failures --quick`: Hamilton's Fig. 6 at
/// replication 1 and 3, each replica on its own emulated host; the figure and the ratio to no
/// replication come out with their parameters, and no other part of the suite runs.
#[test]
fn bench_cluster_on_emulated_hosts_prints_fig_6() {
    if !hosts_or_skip("bench_cluster_on_emulated_hosts_prints_fig_6") {
        return;
    }
    let (v, _) = bench_json("cluster", &["--emulate-hosts", "--only", "failures"]);
    let results = v["results"].as_array().unwrap();
    let rows: Vec<&Value> = results
        .iter()
        .filter(|r| r["name"] == "cluster_hosts_tx_per_s_by_failures")
        .collect();
    assert_eq!(rows.len(), 2, "{v}");
    for (row, (r, f)) in rows.iter().zip([(1, 0), (3, 1)]) {
        assert_eq!(row["params"]["replicas"], r);
        assert_eq!(row["params"]["tolerated_failures"], f);
        assert_eq!(row["params"]["emulated_hosts"], 2 * r + 1);
        assert!(row["value"].as_f64().unwrap() > 0.0, "{row}");
    }
    let ratio = results
        .iter()
        .find(|r| r["name"] == "cluster_failures_vs_none_ratio")
        .unwrap();
    assert!(ratio["value"].as_f64().unwrap() > 0.0, "{ratio}");
    // Only the part asked for ran.
    assert!(!results
        .iter()
        .any(|r| r["name"] == "cluster_hosts_tx_per_s" || r["name"] == "dc_failover_recovery_s"));
}

/// `florin bench cluster --emulate-hosts --only sentinels --quick`: signed transfers through
/// sentinels deployed by `cluster up --emulate-hosts`, each process on its own host; every
/// transfer sent is confirmed (the load generators fail on any other answer), and the
/// sentinels' CPU per transaction comes out beside the checks alone, measured in the same run.
#[test]
fn bench_cluster_on_emulated_hosts_prints_the_sentinels_cpu_per_transaction() {
    if !hosts_or_skip("bench_cluster_on_emulated_hosts_prints_the_sentinels_cpu_per_transaction") {
        return;
    }
    let (v, _) = bench_json("cluster", &["--emulate-hosts", "--only", "sentinels"]);
    let results = v["results"].as_array().unwrap();
    let get = |name: &str| {
        results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {v}"))
    };
    let rate = get("cluster_hosts_e2e_tx_per_s");
    assert!(rate["value"].as_f64().unwrap() > 0.0, "{rate}");
    assert_eq!(rate["params"]["sentinels"], 2);
    assert_eq!(rate["params"]["emulated_hosts"], 10);
    let cpu = get("sentinel_cpu_us_per_tx");
    let (us, alone) = (
        cpu["value"].as_f64().unwrap(),
        cpu["baseline"]["value"].as_f64().unwrap(),
    );
    // A sentinel does the checks and more (TLS, HTTP, compaction, the cluster client).
    assert!(us > 0.0 && alone > 0.0, "{cpu}");
    assert!(cpu["params"]["engine_cpu_us_per_tx"].as_f64().unwrap() > 0.0);
    // Only the part asked for ran.
    assert!(!results
        .iter()
        .any(|r| r["name"] == "cluster_hosts_tx_per_s" || r["name"] == "dc_failover_recovery_s"));
}

/// `florin bench cluster --emulate-hosts --architecture atomizer --only scaling --quick`: the
/// atomizer and two-phase commit at 1 and 2 shards on the same hosts in one run; every
/// transaction the load generators send is confirmed (they fail on any other answer), and the
/// atomizer leader's CPU per transaction and share used come out for each size.
#[test]
fn bench_cluster_on_emulated_hosts_measures_the_atomizer_beside_two_phase_commit() {
    if !hosts_or_skip(
        "bench_cluster_on_emulated_hosts_measures_the_atomizer_beside_two_phase_commit",
    ) {
        return;
    }
    let (v, _) = bench_json(
        "cluster",
        &[
            "--emulate-hosts",
            "--only",
            "scaling",
            "--architecture",
            "atomizer",
        ],
    );
    let results = v["results"].as_array().unwrap();
    let rows = |name: &str, arch: &str| -> Vec<&Value> {
        results
            .iter()
            .filter(|r| r["name"] == name && r["params"]["architecture"] == arch)
            .collect()
    };
    for arch in ["two-phase", "atomizer"] {
        let rates = rows("cluster_hosts_tx_per_s", arch);
        assert_eq!(rates.len(), 2, "{arch}: {v}");
        for r in &rates {
            assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    let atom = rows("cluster_hosts_tx_per_s", "atomizer");
    assert_eq!(atom[0]["params"]["coordinators"], 0);
    assert_eq!(atom[0]["params"]["emulated_hosts"], 7);
    assert_eq!(atom[0]["seed"]["value"], 170_000.0, "{}", atom[0]);
    assert!(atom[0]["params"]["atomizer_tries_per_tx"].as_f64().unwrap() >= 1.0);
    let cpu: Vec<&Value> = results
        .iter()
        .filter(|r| r["name"] == "atomizer_leader_cpu_us_per_tx")
        .collect();
    assert_eq!(cpu.len(), 2, "{v}");
    assert!(cpu.iter().all(|r| r["value"].as_f64().unwrap() > 0.0));
    assert!(results
        .iter()
        .any(|r| r["name"] == "atomizer_leader_cpu_share" && r["value"].as_f64().unwrap() > 0.0));
    assert!(results
        .iter()
        .any(|r| r["name"] == "atomizer_vs_two_phase_ratio" && r["params"]["shards"] == 2));
    // The atomizer is measured where Hamilton measured it: another part is refused.
    let out = Command::new(BIN)
        .args([
            "bench",
            "cluster",
            "--emulate-hosts",
            "--architecture",
            "atomizer",
        ])
        .args(["--only", "failover", "--quick"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("scaling and failures"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only the part asked for ran; the one-phase rows are not part of this comparison.
    assert!(!results
        .iter()
        .any(|r| r["name"] == "cluster_hosts_tx_per_s_by_failures"
            || r["params"]["commit"] == "one-phase where a transaction lies on one shard"));
}

/// `florin bench soak --emulate-hosts`: a three-replica cluster with every replica its own
/// process on its own host; each process's resident memory is read at each reading (three
/// here, through `FLORIN_SOAK_MARKS`), the shard's replicas remember txids, and the largest
/// growth of any one process is reported with the process it belongs to.
#[test]
fn bench_soak_on_emulated_hosts_reads_every_process_apart() {
    if !hosts_or_skip("bench_soak_on_emulated_hosts_reads_every_process_apart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .env("FLORIN_SOAK_MARKS", "100000,300000,500000")
        .args(["bench", "soak", "--json", "--quick", "--emulate-hosts"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    let rss: Vec<&Value> = results
        .iter()
        .filter(|r| r["name"] == "soak_rss_mb")
        .collect();
    let processes: std::collections::BTreeSet<&str> = rss
        .iter()
        .map(|r| r["params"]["process"].as_str().unwrap())
        .collect();
    let want = [
        "coord-0-1",
        "coord-0-2",
        "coord-0-3",
        "loadgen-0",
        "shard-0-1",
        "shard-0-2",
        "shard-0-3",
    ];
    assert_eq!(processes, want.into_iter().collect(), "{v}");
    // Three readings of every process, each a live process's memory.
    assert_eq!(rss.len(), 3 * want.len());
    for r in &rss {
        assert!(r["value"].as_f64().unwrap() > 1.0, "{r}");
        assert!(r["params"]["after_tx"].as_u64().unwrap() >= 100_000);
    }
    let remembered = results
        .iter()
        .filter(|r| r["name"] == "soak_remembered_txids")
        .map(|r| r["value"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(remembered > 0.0, "{v}");
    let growth = results
        .iter()
        .find(|r| r["name"] == "soak_rss_growth_ratio")
        .unwrap();
    assert!(growth["value"].as_f64().unwrap() > 0.0);
    assert!(want.contains(&growth["params"]["process"].as_str().unwrap()));
    assert_eq!(
        growth["params"]["every_process"].as_array().unwrap().len(),
        want.len()
    );
}

/// `florin bench custody --emulate-hosts`: the ledger, two payment providers and their two
/// 2-of-3 key-management networks, each process on its own emulated host. Single-key and
/// threshold payments run for each scheme (Ed25519 with FROST, P-256 with DKLs23); the
/// threshold runs spend CPU on the key-management hosts and the single-key runs none there,
/// and each scheme's ratio is its single-key rate over its threshold one.
#[test]
fn bench_custody_on_emulated_hosts_puts_every_party_on_its_own_host() {
    if !hosts_or_skip("bench_custody_on_emulated_hosts_puts_every_party_on_its_own_host") {
        return;
    }
    let (v, _) = bench_json("custody", &["--emulate-hosts"]);
    let results = v["results"].as_array().unwrap();
    for (scheme, engine) in [("ed25519", "frost"), ("p256", "dkls23")] {
        let rate = |custody: &str, route: &str| {
            results
                .iter()
                .find(|r| {
                    r["name"] == "e2e_payments_per_s"
                        && r["params"]["custody"] == custody
                        && r["params"]["scheme"] == scheme
                        && r["params"]["route"] == route
                })
                .unwrap_or_else(|| panic!("no {scheme} {custody} {route} rate in {v}"))
        };
        for custody in ["single", "threshold"] {
            for route in ["same_provider", "cross_provider"] {
                let r = rate(custody, route);
                assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
                assert_eq!(r["params"]["placement"], "emulated_hosts");
                assert_eq!(r["params"]["hosts"], 9);
                let want = if custody == "threshold" {
                    engine
                } else {
                    "single"
                };
                assert_eq!(r["params"]["engine"], want, "{r}");
                let cpu = &r["params"]["cpu_us_per_payment"];
                assert!(cpu["ledger"].as_f64().unwrap() > 0.0, "{r}");
                assert!(cpu["providers"].as_f64().unwrap() > 0.0, "{r}");
                assert!(r["params"]["requests_sent_again"].as_u64().is_some(), "{r}");
                assert!(r["params"]["kmn_hosts_settled"].is_boolean(), "{r}");
                let kmn = cpu["kmn_nodes"].as_f64().unwrap();
                if custody == "threshold" {
                    // Two nodes' signature shares per payment, at least.
                    assert!(kmn > 50.0, "{r}");
                } else {
                    assert!(
                        kmn < 50.0,
                        "the single-key run used the key-management hosts: {r}"
                    );
                }
            }
        }
        let ratio = results
            .iter()
            .find(|r| {
                r["name"] == "threshold_vs_single_e2e_ratio" && r["params"]["scheme"] == scheme
            })
            .unwrap_or_else(|| panic!("no {scheme} ratio in {v}"));
        assert_eq!(ratio["params"]["engine"], engine);
        let (thr, single) = (
            ratio["params"]["threshold"].as_f64().unwrap(),
            ratio["params"]["single"].as_f64().unwrap(),
        );
        let value = ratio["value"].as_f64().unwrap();
        assert!((value - single / thr).abs() < 1e-9, "{ratio}");
        // Each tier's capacity at its share; the nodes take no part in single-key payments.
        let capacity = |kind: &str, tier: &str| ratio["params"][kind][tier].clone();
        for tier in ["providers", "kmn_nodes", "ledger"] {
            let c = capacity("threshold_tier_capacity_payments_per_s", tier);
            assert!(c.as_f64().unwrap() > 0.0, "{ratio}");
        }
        let ledger = capacity("single_tier_capacity_payments_per_s", "ledger");
        assert!(ledger.as_f64().unwrap() > 0.0, "{ratio}");
        // With single keys the nodes sign nothing: their tier is idle (null), or, when their
        // background work (nonce refills) shows up in a short quick run, never the bottleneck.
        let nodes = capacity("single_tier_capacity_payments_per_s", "kmn_nodes");
        assert!(
            nodes.is_null() || nodes.as_f64().unwrap() > ledger.as_f64().unwrap(),
            "{ratio}"
        );
    }
    // Only the emulated-host part ran.
    assert!(!results.iter().any(|r| r["name"] == "dkg_ms"));
}

/// A `florin psp serve` process; its URL is the first line it prints. It serves plain HTTP on
/// loopback (these tests are about payments; TLS has its own tests) and reaches the ledger over
/// TLS, trusting the devnet's CA.
struct PspProc {
    child: Child,
    url: String,
}

impl PspProc {
    fn start(data: &Path, ledger: &str, extra: &[&str]) -> PspProc {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "psp",
            "serve",
            "--plain-http",
            "--listen",
            "127.0.0.1:0",
            "--ledger",
            ledger,
        ])
        .arg("--data")
        .arg(data)
        .args(extra);
        if let Some(ca) = common::ca_for(ledger) {
            cmd.env("FLORIN_CA_CERT", ca);
        }
        let (child, url) = spawn_listening(cmd);
        PspProc { child, url }
    }
}

impl Drop for PspProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two payment providers as processes, each with its own key-management network (provider A:
/// threshold ECDSA P-256 with DKLs23, account keys made ahead; provider B: FROST Ed25519), on a
/// devnet ledger: open, fund, pay within A, pay across to B, refusals, history, the books
/// balance. (CGGMP24 accounts through the provider: `florin-node/tests/psp.rs`.)
#[test]
fn psp_processes_pay_within_and_across_providers() {
    let dir = tempfile::tempdir().unwrap();
    let net = Devnet::start(&dir.path().join("devnet"));
    let (da, db) = (dir.path().join("psp-a"), dir.path().join("psp-b"));
    let _down_a = Down("custody", da.join("custody").to_str().unwrap().to_string());
    let _down_b = Down("custody", db.join("custody").to_str().unwrap().to_string());
    let a_args = ["--name", "bank-a", "--scheme", "p256", "--ecdsa", "dkls23"];
    let u = User::new(dir.path(), &net.url);
    // Providers know each other as peers (name, URL, peer key): A's key first, then B with
    // A as its peer (B only takes `receive` from A, so A's URL does not matter to it), then
    // A again with B as its peer.
    let a = PspProc::start(&da, &net.url, &a_args);
    let a_key = u.ok(&["psp", "info", "--psp", &a.url, "--json"])["peer_key"]
        .as_str()
        .unwrap()
        .to_string();
    drop(a);
    // Its key-management nodes exit with it, once they notice (within a quarter second); the
    // provider restarted below at once waits for them to go and starts its own, rather than
    // adopting nodes about to exit.
    let b = PspProc::start(
        &db,
        &net.url,
        &[
            "--name",
            "bank-b",
            "--scheme",
            "ed25519",
            "--peer",
            &format!("bank-a=http://127.0.0.1:9={a_key}"),
        ],
    );
    let b_info = u.ok(&["psp", "info", "--psp", &b.url, "--json"]);
    assert_eq!(b_info["peers"], serde_json::json!(["bank-a"]));
    let b_peer = format!("bank-b={}={}", b.url, b_info["peer_key"].as_str().unwrap());
    let mut a_with_peer = a_args.to_vec();
    a_with_peer.extend(["--peer", b_peer.as_str()]);
    let a = PspProc::start(&da, &net.url, &a_with_peer);
    let alice = u.ok(&["psp", "open", "alice", "--psp", &a.url, "--json"]);
    assert!(alice["encumbrance"].as_str().unwrap().starts_with("p256:"));
    u.ok(&["psp", "open", "bob", "--psp", &a.url, "--json"]);
    u.ok(&["psp", "open", "carol", "--psp", &b.url, "--json"]);
    let err = u.fails(&["psp", "open", "alice", "--psp", &a.url]);
    assert!(err.contains("exists"), "{err}");
    u.ok(&["psp", "fund", "alice", "50", "--psp", &a.url]);
    let r = u.ok(&["psp", "pay", "alice", "bob", "5", "--psp", &a.url, "--json"]);
    assert_eq!(r["route"], "same_provider");
    let r = u.ok(&[
        "psp", "pay", "alice", "carol", "2.50", "--to-psp", "bank-b", "--psp", &a.url, "--json",
    ]);
    assert_eq!(r["route"], "cross_provider");
    assert_eq!(r["notified"], true);
    // The proof of that payment, fetched by alice, saved, and checked offline against the
    // ledger's issuer and B's peer key; an altered copy does not hold (exit 2).
    let txid = r["txid"].as_str().unwrap();
    let info = http_get(&net.url, "/v1/info");
    let info: Value = serde_json::from_str(info.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let issuer = info["issuer"].as_str().unwrap().to_string();
    let b_key = b_info["peer_key"].as_str().unwrap();
    let proof_file = dir.path().join("proof.json");
    let p = u.ok(&[
        "psp",
        "proof",
        txid,
        "--account",
        "alice",
        "--psp",
        &a.url,
        "--out",
        proof_file.to_str().unwrap(),
        "--issuer",
        &issuer,
        "--payee-key",
        b_key,
        "--json",
    ]);
    assert_eq!(p["valid"], true, "{p}");
    assert_eq!(p["check"]["complete"], true, "{p}");
    assert_eq!(p["check"]["amount_cents"], 250, "{p}");
    let text = u.stdout(&[
        "psp",
        "proof",
        "--file",
        proof_file.to_str().unwrap(),
        "--issuer",
        &issuer,
        "--payee-key",
        b_key,
    ]);
    assert!(text.contains("holds and is complete"), "{text}");
    // Unpinned, it holds only with the keys it names: not a proof yet (exit 3).
    let out = u.run(&["psp", "proof", "--file", proof_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    // Pinned to another ledger's key, it does not hold.
    let out = u.run(&[
        "psp",
        "proof",
        "--file",
        proof_file.to_str().unwrap(),
        "--issuer",
        &a_key,
        "--payee-key",
        b_key,
    ]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let mut altered: Value = serde_json::from_slice(&std::fs::read(&proof_file).unwrap()).unwrap();
    altered["amount_cents"] = 25_000.into();
    let bad_file = dir.path().join("altered.json");
    std::fs::write(&bad_file, altered.to_string()).unwrap();
    let out = u.run(&["psp", "proof", "--file", bad_file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does NOT hold"),
        "{out:?}"
    );
    // A URL that is not a configured peer is refused; without alice's key file nothing pays.
    let err = u.fails(&[
        "psp", "pay", "alice", "carol", "1", "--to-psp", &net.url, "--psp", &a.url,
    ]);
    assert!(err.contains("not a configured peer"), "{err}");
    let err = u.fails(&[
        "psp",
        "pay",
        "alice",
        "bob",
        "1",
        "--customer-key",
        "nobody.key",
        "--psp",
        &a.url,
    ]);
    assert!(err.contains("customer key"), "{err}");
    // Bob's key cannot pay from alice's account.
    let err = u.fails(&[
        "psp",
        "pay",
        "alice",
        "bob",
        "1",
        "--customer-key",
        "bob.customer.key",
        "--psp",
        &a.url,
    ]);
    assert!(err.contains("401") || err.contains("unauthorized"), "{err}");
    // Every account at once: the provider's operator only (its key is DATA/operator.key).
    let err = u.fails(&["psp", "balance", "--psp", &a.url]);
    assert!(err.contains("operator key"), "{err}");
    let stranger = dir.path().join("stranger.key");
    std::fs::write(
        &stranger,
        florin_crypto::SecretKey::generate(&mut rand::rngs::OsRng).to_hex(),
    )
    .unwrap();
    let err = u.fails(&[
        "--operator-key",
        stranger.to_str().unwrap(),
        "psp",
        "balance",
        "--psp",
        &a.url,
    ]);
    assert!(err.contains("403") || err.contains("forbidden"), "{err}");
    let operator = da.join("operator.key");
    let bal = u.ok(&[
        "--operator-key",
        operator.to_str().unwrap(),
        "psp",
        "balance",
        "--psp",
        &a.url,
        "--json",
    ]);
    let cents = |v: &Value, name: &str| -> u64 {
        v.as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap()["balance_cents"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(cents(&bal, "alice"), 4_250);
    assert_eq!(cents(&bal, "bob"), 500);
    let bal_b = u.ok(&["psp", "balance", "carol", "--psp", &b.url, "--json"]);
    assert_eq!(cents(&bal_b, "carol"), 250);
    let err = u.fails(&["psp", "pay", "bob", "alice", "100", "--psp", &a.url]);
    assert!(err.contains("insufficient_funds"), "{err}");
    let err = u.fails(&["psp", "pay", "bob", "alice", "abc", "--psp", &a.url]);
    assert!(err.contains("abc") || err.contains("amount"), "{err}");
    let h = u.ok(&["psp", "history", "alice", "--psp", &a.url, "--json"]);
    let dirs: Vec<&str> = h["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["direction"].as_str().unwrap())
        .collect();
    assert_eq!(dirs, ["funded", "out", "out"]);
    let info = u.ok(&["psp", "info", "--psp", &b.url, "--json"]);
    assert_eq!(info["scheme"], "ed25519");
    // The ledger's books balance with the providers' customers' money on it.
    let audit = u.ok(&["audit", "--json"]);
    assert_eq!(audit["balanced"], true, "{audit}");
    // A provider's data keeps its name and scheme.
    drop(a);
    let out = u.run(&[
        "psp",
        "serve",
        "--data",
        da.to_str().unwrap(),
        "--scheme",
        "ed25519",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot change"));
}

/// An HTTP proxy in front of `upstream` that answers a request itself when `rule` says so
/// (method, path, body → status and JSON body) and forwards everything else, one request per
/// connection. Returns its URL.
/// A proxy's rule: (method, path, body) → an answer of its own (status, JSON), or `None` to
/// pass the request on.
type ProxyRule = fn(&str, &str, &[u8]) -> Option<(u16, String)>;

fn proxy(upstream: &str, rule: ProxyRule) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let up = upstream.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { continue };
            let up = up.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 8192];
                let head_end = loop {
                    let n = c.read(&mut tmp).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                    if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break p + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let len = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())
                            .flatten()
                    })
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let n = c.read(&mut tmp).unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&tmp[..n]);
                }
                let body = buf[head_end..head_end + len].to_vec();
                let mut first = head.lines().next().unwrap_or("").split(' ');
                let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
                if let Some((code, json)) = rule(method, path, &body) {
                    let _ = write!(
                        c,
                        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                        json.len()
                    );
                    return;
                }
                let mut u = common::connect(&up).unwrap();
                let mut new_head = String::new();
                for l in head.split("\r\n") {
                    if l.is_empty() || l.to_ascii_lowercase().starts_with("connection:") {
                        continue;
                    }
                    new_head.push_str(l);
                    new_head.push_str("\r\n");
                }
                new_head.push_str("connection: close\r\n\r\n");
                let _ = u.write_all(new_head.as_bytes());
                let _ = u.write_all(&body);
                let _ = u.flush();
                let mut resp = Vec::new();
                let mut tmp = [0u8; 8192];
                // Until the upstream closes (over TLS, with or without `close_notify`).
                while let Ok(n @ 1..) = u.read(&mut tmp) {
                    resp.extend_from_slice(&tmp[..n]);
                }
                let _ = c.write_all(&resp);
            });
        }
    });
    url
}

fn address(u: &User, name: &str) -> String {
    u.wallet(name, &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn payment_to_an_invalid_address_is_refused_before_anything_is_signed() {
    let (dir, net, u) = setup(&["alice"]);
    u.wallet("alice", &["faucet", "5"]);
    let before = std::fs::read(dir.path().join("alice")).unwrap();
    let supply = net.get("/v1/ledger/supply");
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let zero_addr = florin_crypto::PublicKey([0; 32]).to_address();
    let identity_addr = florin_crypto::PublicKey(identity).to_address();
    for bad in [zero_addr.as_str(), identity_addr.as_str(), &"00".repeat(32)] {
        let err = u.fails(&["wallet", "--wallet", "alice", "pay", bad, "1"]);
        assert!(err.contains("small order"), "{err}");
        // Device-to-device payments to such a peer are refused too.
        let err = u.fails(&[
            "wallet", "--wallet", "alice", "offline", "pay", "1", "--peer", bad,
        ]);
        assert!(err.contains("not a usable"), "{err}");
    }
    // Nothing was signed (the wallet file is byte for byte the same) and nothing submitted.
    assert_eq!(std::fs::read(dir.path().join("alice")).unwrap(), before);
    assert_eq!(net.get("/v1/ledger/supply"), supply);
    assert_eq!(u.wallet("alice", &["balance"])["online_cents"], 500);
}

#[test]
fn copied_wallet_that_lost_a_race_pays_again_after_sync() {
    let (dir, _net, u) = setup(&["a", "carol"]);
    let carol = address(&u, "carol");
    u.wallet("a", &["faucet", "10"]);
    let copy = |from: &str, to: &str| {
        std::fs::copy(dir.path().join(from), dir.path().join(to)).unwrap();
    };
    copy("a", "a-copy");
    assert_eq!(u.wallet("a", &["pay", &carol, "10"])["status"], "confirmed");
    // The copy lost the race: pay tells the truth, removes the spent coins, exits non-zero.
    let err = u.fails(&["wallet", "--wallet", "a-copy", "pay", &carol, "4"]);
    assert!(err.contains("already spent elsewhere"), "{err}");
    assert!(err.contains("nothing was paid"), "{err}");
    assert_eq!(u.wallet("a-copy", &["balance"])["online_cents"], 0);
    // With fresh money it pays again.
    u.wallet("a-copy", &["faucet", "5"]);
    assert_eq!(
        u.wallet("a-copy", &["pay", &carol, "5"])["status"],
        "confirmed"
    );
    // A restored backup (copied before that payment) converges with sync.
    u.wallet("a", &["faucet", "7"]);
    copy("a", "a-backup");
    assert_eq!(u.wallet("a", &["pay", &carol, "7"])["status"], "confirmed");
    u.wallet("a-backup", &["faucet", "2"]);
    assert_eq!(u.wallet("a-backup", &["balance"])["online_cents"], 900);
    let s = u.wallet("a-backup", &["sync"]);
    assert!(s["removed_coins"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["removed_cents"], 700, "{s}");
    assert_eq!(s["online_cents"], 200);
    assert_eq!(u.wallet("a-backup", &["sync"])["removed_cents"], 0);
    assert_eq!(
        u.wallet("a-backup", &["pay", &carol, "2"])["status"],
        "confirmed"
    );
    assert_eq!(u.wallet("carol", &["sync"])["received_cents"], 2400);
}

#[test]
fn a_confirmed_payment_whose_handoff_is_undeliverable_reports_paid() {
    let (_dir, net, u) = setup(&["alice", "bob"]);
    let bob = address(&u, "bob");
    u.wallet("alice", &["faucet", "5"]);
    // The mailbox is down; the ledger is not.
    let mailbox_down = proxy(&net.url, |m, p, _| {
        (m == "POST" && p == "/v1/mailbox").then(|| {
            (
                503,
                r#"{"error":{"code":"unavailable","message":"mailbox down"}}"#.to_string(),
            )
        })
    });
    let via = User::new(&u.dir, &mailbox_down);
    let p = via.wallet("alice", &["pay", &bob, "2"]);
    assert_eq!(p["status"], "confirmed", "{p}");
    assert_eq!(p["paid"], true);
    assert_eq!(p["handoff"], "pending");
    assert_eq!(p["handoffs_pending"], 1);
    // Later commands are not blocked by it (another payment through the same broken mailbox).
    let p2 = via.wallet("alice", &["pay", &bob, "1"]);
    assert_eq!(
        (p2["status"].as_str(), p2["handoffs_pending"].as_u64()),
        (Some("confirmed"), Some(2))
    );
    assert_eq!(u.wallet("bob", &["sync"])["received_cents"], 0);
    // Any later command with the mailbox back delivers them.
    let s = u.wallet("alice", &["sync"]);
    assert_eq!(
        (
            s["handoffs_delivered"].as_u64(),
            s["handoffs_pending"].as_u64()
        ),
        (Some(2), Some(0)),
        "{s}"
    );
    assert_eq!(u.wallet("bob", &["sync"])["received_cents"], 300);
}

#[test]
fn deposit_with_every_token_refused_exits_non_zero() {
    let (_dir, net, u) = setup(&["alice", "carol"]);
    u.tokens("alice", "2");
    u.pay("alice", "carol", "2", "d");
    let refusing = proxy(&net.url, |m, p, body| {
        (m == "POST" && p == "/v1/deposit").then(|| {
            let req: Value = serde_json::from_slice(body).unwrap();
            let results: Vec<Value> = req["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|_| {
                    serde_json::json!({ "serial": "00", "value_cents": 0, "outcome": "refused",
                        "token": null, "fraud": null, "error": "token is unknown", "retry": false })
                })
                .collect();
            (200, serde_json::json!({ "results": results }).to_string())
        })
    });
    let via = User::new(&u.dir, &refusing);
    let out = via.run(&["wallet", "--wallet", "carol", "--json", "deposit"]);
    assert!(
        !out.status.success(),
        "nothing deposited must exit non-zero"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["credited_cents"], 0);
    assert!(!v["refused"].as_array().unwrap().is_empty(), "{v}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nothing was deposited"), "{err}");
}

/// `florin completions SHELL` and `florin man --out DIR`, generated from the commands
/// themselves: a bash script bash accepts, naming every command; a page per command and
/// subcommand naming it as typed; a directory that cannot be written is one error line.
#[test]
fn completions_and_manual_pages() {
    let dir = tempfile::tempdir().unwrap();
    let u = User::new(dir.path(), "http://127.0.0.1:9");
    let bash = u.stdout(&["completions", "bash"]);
    for word in [
        "_florin",
        "wallet",
        "cluster",
        "custody",
        "withdraw",
        "--ca-cert",
    ] {
        assert!(bash.contains(word), "no {word} in the bash completions");
    }
    std::fs::write(dir.path().join("florin.bash"), &bash).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(dir.path().join("florin.bash"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "bash rejects the script: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    for shell in ["zsh", "fish"] {
        assert!(!u.stdout(&["completions", shell]).is_empty(), "{shell}");
    }
    // An unknown shell is a usage error (clap's, exit 2), naming the shells there are.
    let out = u.run(&["completions", "tcsh-of-the-future"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash, elvish, fish"));

    let out = u.stdout(&["man", "--out", "man1"]);
    assert!(out.starts_with("wrote "), "{out}");
    let page = std::fs::read_to_string(dir.path().join("man1/florin.1")).unwrap();
    assert!(page.contains(".TH florin 1"), "{page}");
    let pay = std::fs::read_to_string(dir.path().join("man1/florin-wallet-pay.1")).unwrap();
    assert!(pay.contains("florin wallet pay"), "{pay}");
    assert!(pay.contains(".SH OPTIONS"));
    assert!(dir.path().join("man1/florin-cluster-up.1").exists());
    assert!(
        !dir.path().join("man1/florin-help.1").exists(),
        "no pages for clap's help"
    );
    std::fs::write(dir.path().join("a-file"), b"x").unwrap();
    let err = u.fails(&["man", "--out", "a-file/man1"]);
    assert!(err.contains("a-file"), "{err}");
}

/// A command line the CLI refuses is a usage error (exit 2, clap's text on standard error);
/// under `--json` it also prints the error envelope every failed command prints, code `usage`.
#[test]
fn usage_errors_under_json_print_the_envelope() {
    let dir = tempfile::tempdir().unwrap();
    let u = User::new(dir.path(), "http://127.0.0.1:9");
    let out = u.run(&["wallet", "--wallet", "w", "--json", "pay"]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "usage");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("<ADDRESS>") && !msg.contains('\n'), "{msg}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Usage: florin wallet pay"));
    // Without --json: nothing on standard output. Help is no error, with or without.
    let out = u.run(&["wallet", "--wallet", "w", "pay"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let out = u.run(&["wallet", "--json", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\"error\""));
    // An argument *value* spelled `--json` is a value, not the flag: a text error, no JSON.
    let out = u.run(&["wallet", "--wallet=--json", "balance"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no wallet at --json"));
}

/// `florin cluster status --json` of the cluster in `data`, whatever its exit code (a test
/// asserts on what it says).
fn cluster_status_json(data: &str) -> Value {
    let out = Command::new(BIN)
        .args(["cluster", "status", "--data", data, "--json"])
        .output()
        .unwrap();
    serde_json::from_slice::<Value>(&out.stdout).unwrap()
}

//! What an operator sees of a running devnet: JSON log lines carrying request ids, `/metrics`
//! counting exactly what happened, `/v1/ready` apart from `/v1/health`, `RUST_LOG` filtering.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{florin, http_get, BIN};
use serde_json::Value;

/// A plain-HTTP devnet logging JSON to `log`, killed when dropped.
struct Net {
    child: Child,
    url: String,
}

impl Net {
    fn start(dir: &Path, log: &Path, env: &[(&str, &str)], extra: &[&str]) -> Net {
        let mut cmd = Command::new(BIN);
        cmd.args(["--log-format", "json", "devnet", "--plain-http"])
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(dir.join("data"))
            .args(extra)
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap());
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap()
            .to_string();
        Net { child, url }
    }

    /// Stops the devnet with SIGTERM (a clean stop: it writes what it gathered) and waits.
    fn terminate(mut self) {
        let term = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(term.success());
        let deadline = Instant::now() + Duration::from_secs(40);
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "the devnet did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn metrics(&self) -> String {
        let answer = http_get(&self.url, "/metrics");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"));
        assert!(head.contains("application/openmetrics-text"), "{head}");
        assert!(body.ends_with("# EOF\n"));
        body.to_string()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sample's value in a scrape (0 when absent: a labelled counter not yet touched).
fn value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then(|| v.parse().unwrap())
        })
        .unwrap_or(0.0)
}

/// What the counters of interest moved by between two scrapes.
fn delta(before: &str, after: &str, name: &str) -> f64 {
    value(after, name) - value(before, name)
}

const SUBMITTED: &str = "florin_ledger_transactions_total{outcome=\"submitted\",reason=\"\"}";
const CONFIRMED: &str = "florin_ledger_transactions_total{outcome=\"confirmed\",reason=\"\"}";
const REFUSED: &str =
    "florin_ledger_transactions_total{outcome=\"refused\",reason=\"state_invalid\"}";
const MINTED: &str = "florin_tokens_total{event=\"minted\"}";
const DEPOSITED: &str = "florin_tokens_total{event=\"deposited\"}";
const FRAUD: &str = "florin_fraud_proofs_total";

fn wallet(dir: &Path, url: &str, name: &str, args: &[&str]) -> Value {
    let mut all = vec!["wallet", "--wallet", name, "--json"];
    all.extend_from_slice(args);
    let out = florin(dir, url, &all);
    assert!(
        out.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_scraped_counters_equal_what_happened_and_every_log_line_is_json_with_its_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("devnet.log");
    let net = Net::start(dir.path(), &log, &[], &["--audit-every", "1"]);
    let d = dir.path();
    let w = |name: &str, args: &[&str]| wallet(d, &net.url, name, args);
    for name in ["payer", "alice", "bob"] {
        w(name, &["new", "--no-passphrase"]);
    }
    let bob = w("bob", &["address"])["address"]
        .as_str()
        .unwrap()
        .to_string();

    // A faucet payment: one mint on the ledger.
    let s0 = net.metrics();
    w("payer", &["faucet", "1"]);
    let s1 = net.metrics();
    assert_eq!(delta(&s0, &s1, SUBMITTED), 1.0);
    assert_eq!(delta(&s0, &s1, CONFIRMED), 1.0);

    // An online payment: one transfer.
    let paid = w("payer", &["pay", &bob, "0.20"]);
    assert_eq!(paid["status"], "confirmed");
    let s2 = net.metrics();
    assert_eq!(delta(&s1, &s2, SUBMITTED), 1.0);
    assert_eq!(delta(&s1, &s2, CONFIRMED), 1.0);

    // A double spend on the ledger: a copy of the wallet pays another amount with the same
    // coin; the ledger refuses it as state-invalid.
    std::fs::copy(d.join("payer"), d.join("payer-copy")).unwrap();
    w("payer", &["pay", &bob, "0.02"]);
    let refused = florin(
        d,
        &net.url,
        &["wallet", "--wallet", "payer-copy", "pay", &bob, "0.03"],
    );
    assert!(!refused.status.success());
    let s3 = net.metrics();
    assert_eq!(delta(&s2, &s3, SUBMITTED), 2.0);
    assert_eq!(delta(&s2, &s3, CONFIRMED), 1.0);
    assert_eq!(delta(&s2, &s3, REFUSED), 1.0);

    // A withdrawal of one 5-cent token: a payment to the reserve and one token minted.
    let before = net.metrics();
    let out = w("payer", &["withdraw", "0.05"]);
    assert_eq!(out["withdrawn_cents"], 5);
    let s4 = net.metrics();
    assert_eq!(delta(&before, &s4, MINTED), 1.0);
    assert_eq!(delta(&before, &s4, SUBMITTED), 1.0);

    // The token spent twice offline (a copied wallet); both payees deposit: one credit (a
    // ledger payment from the reserve), one fraud proof.
    std::fs::copy(d.join("payer"), d.join("payer-twin")).unwrap();
    for (payer, payee, tag) in [("payer", "alice", "a"), ("payer-twin", "bob", "b")] {
        let (req, pay) = (format!("{tag}.req"), format!("{tag}.pay"));
        w(payee, &["offline", "request", "0.05", "--out", &req]);
        w(payer, &["offline", "pay", &req, "--out", &pay]);
        w(payee, &["offline", "accept", &pay]);
    }
    let a = w("alice", &["deposit"]);
    let b = w("bob", &["deposit"]);
    assert_eq!(
        a["credited_cents"].as_u64().unwrap() + b["credited_cents"].as_u64().unwrap(),
        5
    );
    let s5 = net.metrics();
    assert_eq!(delta(&s4, &s5, DEPOSITED), 1.0);
    assert_eq!(delta(&s4, &s5, FRAUD), 1.0);
    assert_eq!(delta(&s4, &s5, MINTED), 0.0);
    assert_eq!(delta(&s4, &s5, CONFIRMED), 1.0, "the credit's payment");

    // Totals since start: exactly what the steps above did.
    assert_eq!(value(&s5, SUBMITTED), 6.0);
    assert_eq!(value(&s5, CONFIRMED), 5.0);
    assert_eq!(value(&s5, REFUSED), 1.0);
    assert_eq!(value(&s5, MINTED), 1.0);
    assert_eq!(value(&s5, FRAUD), 1.0);
    assert!(
        value(&s5, "florin_swap_batch_size_count") >= 5.0,
        "every confirmed one went through a group commit"
    );
    assert!(
        value(
            &s5,
            "florin_http_requests_total{route=\"/v1/ledger/transactions\",method=\"POST\",status=\"200\"}"
        ) >= 3.0,
        "{s5}"
    );

    // The audit runs every second and balances (a fraud proof changes no books).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = net.metrics();
        if value(&s, "florin_audit_runs_total") >= 2.0 {
            assert_eq!(value(&s, "florin_audit_balanced"), 1.0);
            break;
        }
        assert!(Instant::now() < deadline, "no audit ran");
        std::thread::sleep(Duration::from_millis(200));
    }

    // Readiness apart from liveness.
    let ready = http_get(&net.url, "/v1/ready");
    assert!(ready.starts_with("HTTP/1.0 200") || ready.starts_with("HTTP/1.1 200"));
    assert!(ready.contains("\"status\":\"ready\""), "{ready}");
    assert!(ready.contains("\"ledger\":\"ok\""), "{ready}");

    // A caller's request id is kept and answered; a hostile one is replaced.
    let mut s = common::connect(&net.url).unwrap();
    use std::io::{Read, Write};
    write!(
        s,
        "GET /v1/info HTTP/1.0\r\nx-request-id: trace-me.42\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("x-request-id: trace-me.42"),
        "{answer}"
    );
    let mut s = common::connect(&net.url).unwrap();
    write!(
        s,
        "GET /v1/info HTTP/1.0\r\nx-request-id: {}\r\n\r\n",
        "x".repeat(65)
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(!answer.contains(&"x".repeat(65)));
    assert!(answer.to_ascii_lowercase().contains("x-request-id: "));

    // Every line of the log is one JSON object; each request's line names its route, status,
    // latency and request id, and there is one per request.
    // Info lines are written in batches, at the latest every 200 ms.
    std::thread::sleep(Duration::from_millis(700));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines[0]["message"], "florin devnet");
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "florin::access")
        .collect();
    for l in &access {
        assert_eq!(l["level"], "INFO");
        assert!(l["status"].is_u64(), "{l}");
        assert!(l["latency_ms"].is_f64(), "{l}");
        let id = l["span"]["request_id"].as_str().unwrap();
        assert!(!id.is_empty() && id.len() <= 64, "{l}");
        assert!(l["span"]["route"].is_string(), "{l}");
    }
    let traced: Vec<&&Value> = access
        .iter()
        .filter(|l| l["span"]["request_id"] == "trace-me.42")
        .collect();
    assert_eq!(traced.len(), 1);
    assert_eq!(traced[0]["span"]["route"], "/v1/info");
    let submits = access
        .iter()
        .filter(|l| l["span"]["route"] == "/v1/ledger/transactions")
        .count() as f64;
    let counted: f64 = [200, 400, 409, 422]
        .iter()
        .map(|status| {
            value(
                &s5,
                &format!(
                    "florin_http_requests_total{{route=\"/v1/ledger/transactions\",method=\"POST\",status=\"{status}\"}}"
                ),
            )
        })
        .sum();
    assert_eq!(submits, counted, "one line per counted request");
}

#[test]
fn rust_log_filters_and_a_bad_filter_or_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("quiet.log");
    {
        // At `warn`, neither the banner nor the request lines are written, even when the
        // server stops cleanly and writes out what it gathered.
        let net = Net::start(dir.path(), &log, &[("RUST_LOG", "warn")], &[]);
        let info = http_get(&net.url, "/v1/info");
        assert!(info.contains("authority"));
        net.terminate();
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "");
    // Without a filter the same stop writes the gathered lines: the banner, the request line.
    let log = dir.path().join("loud.log");
    {
        let net = Net::start(dir.path(), &log, &[], &[]);
        http_get(&net.url, "/v1/info");
        net.terminate();
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("\"route\":\"/v1/info\""), "{text}");
    assert!(text.contains("florin devnet stopped"), "{text}");

    let out = Command::new(BIN)
        .args(["--log-format", "json", "devnet", "--plain-http"])
        .env("RUST_LOG", "info,[[[")
        .arg("--data")
        .arg(dir.path().join("d2"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: RUST_LOG"), "{err}");
    assert!(!dir.path().join("d2").exists(), "nothing was started");

    let out = Command::new(BIN)
        .args(["--log-format", "xml", "wallet", "--wallet", "w", "new"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!dir.path().join("w").exists());
}

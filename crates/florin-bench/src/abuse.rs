//! `florin bench abuse`: a legitimate client's latency while an attacker floods the node.
//!
//! The node is a real `florin devnet` process. The attacker is a second `florin` process
//! (`florin bench abuse --attack URL`, hidden) that runs in its own network namespace, so it
//! reaches the node from its own address (per-address limits see it as a stranger), and in its
//! own CPU share (a cgroup v1 `cpu` group holding half a core), so it cannot simply take the
//! machine's cores from the node. The legitimate client runs in this process, in the host
//! namespace, and pays one cent at a time on the ledger, each payment spending the previous
//! change: one signed transaction per request, answered once committed and durable.
//!
//! Unloaded and loaded rounds alternate on the same layout (the attacker process exists in
//! both; it attacks only in loaded rounds), and the pooled p99 of each condition gives
//! `abuse_legit_p99_vs_unloaded_ratio` (target ≤ 3). The attacker floods three ways at once:
//! batches of 4,096 validly signed transfers spending made-up outputs, bodies far over any
//! route's limit, and connections that never finish their request. The node's peak resident
//! memory (`VmHWM`) is reported against a stated bound.
//!
//! Needs root (network namespaces, cgroups) and the `ip` command; says so otherwise.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_ledger::{Draft, Encumbrance, Output, Transaction, Transfer, Utxo, Witness};
use florin_node::api::LedgerFaucet;
use rand::rngs::OsRng;
use rand::RngCore;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Recorder, Scale};

/// The node's peak resident memory must stay under this while attacked.
const MEMORY_BOUND_MIB: f64 = 512.0;
/// The attacker's CPU share: half of one core.
const ATTACKER_QUOTA_US: u64 = 50_000;
const CFS_PERIOD_US: u64 = 100_000;
/// Transactions per bogus batch (the route's maximum).
const BOGUS_BATCH: usize = 4_096;
/// The oversized body: far over every route's limit.
const OVERSIZED: usize = 64 << 20;
/// Connections the attacker keeps open without finishing a request.
const IDLE_CONNECTIONS: usize = 1_000;

/// Sizes of a run.
struct Sizes {
    rounds: usize,
    per_round: usize,
    warmup: Duration,
}

/// Runs the suite.
pub(super) fn run(rec: &mut Recorder, scale: Scale, quick: bool) -> Result<()> {
    let sizes = if quick {
        Sizes {
            rounds: 1,
            per_round: 100,
            warmup: Duration::from_secs(1),
        }
    } else if scale.full {
        Sizes {
            rounds: 5,
            per_round: 600,
            warmup: Duration::from_secs(3),
        }
    } else {
        Sizes {
            rounds: 3,
            per_round: 300,
            warmup: Duration::from_secs(2),
        }
    };
    let exe = std::env::current_exe().context("finding the florin executable")?;
    let iso = Isolation::create()?;
    // The node may be another build (`FLORIN_ABUSE_NODE_EXE`), to compare two builds of the
    // node under the same attacker.
    let node_exe =
        std::env::var_os("FLORIN_ABUSE_NODE_EXE").map_or_else(|| exe.clone(), PathBuf::from);
    let node = NodeProc::start(
        &node_exe,
        SocketAddr::V4(SocketAddrV4::new(iso.host_ip, 7400)),
    )?;
    tracing::info!(
        "node at {} (pid {}), attacker from {} in netns {} with {} of a core",
        node.url,
        node.pid,
        iso.ns_ip,
        iso.ns,
        ATTACKER_QUOTA_US as f64 / CFS_PERIOD_US as f64
    );
    let mut attacker = Attacker::start(&exe, &iso, &node)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mut legit = rt.block_on(Legit::new(&node))?;
    // Warm the path (connections, caches) before measuring.
    rt.block_on(legit.pay(20))?;

    let mut unloaded = Vec::new();
    let mut loaded = Vec::new();
    let mut attack_s = 0.0;
    // The node's CPU time (seconds) and the wall time of the legitimate client's runs.
    let (mut cpu_u, mut wall_u, mut cpu_l, mut wall_l) = (0.0, 0.0, 0.0, 0.0);
    for round in 0..sizes.rounds {
        let (c0, t0) = (node.cpu_seconds()?, Instant::now());
        unloaded.extend(rt.block_on(legit.pay(sizes.per_round))?);
        cpu_u += node.cpu_seconds()? - c0;
        wall_u += t0.elapsed().as_secs_f64();
        attacker.command("go")?;
        let t = Instant::now();
        std::thread::sleep(sizes.warmup);
        let (c0, t0) = (node.cpu_seconds()?, Instant::now());
        loaded.extend(rt.block_on(legit.pay(sizes.per_round))?);
        cpu_l += node.cpu_seconds()? - c0;
        wall_l += t0.elapsed().as_secs_f64();
        attacker.command("stop")?;
        attack_s += t.elapsed().as_secs_f64();
        tracing::info!(
            "round {}/{}: unloaded p99 {:.1} ms, loaded p99 {:.1} ms",
            round + 1,
            sizes.rounds,
            percentile(&unloaded, 0.99),
            percentile(&loaded, 0.99)
        );
        // Let the node close what the attack left open before the next unloaded round.
        std::thread::sleep(Duration::from_secs(1));
    }
    let counters = attacker.finish()?;
    let (rss, hwm) = node.memory_mib()?;
    drop(node);
    drop(iso);

    let params = json!({
        "requests_per_condition": unloaded.len(),
        "rounds": sizes.rounds,
        "attacker_cpu_cores": ATTACKER_QUOTA_US as f64 / CFS_PERIOD_US as f64,
    });
    let p99_u = percentile(&unloaded, 0.99);
    let p99_l = percentile(&loaded, 0.99);
    rec.add(
        "abuse_legit_p50_unloaded_ms",
        percentile(&unloaded, 0.5),
        "ms",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "abuse_legit_p99_unloaded_ms",
        p99_u,
        "ms",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "abuse_legit_p50_loaded_ms",
        percentile(&loaded, 0.5),
        "ms",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "abuse_legit_p99_loaded_ms",
        p99_l,
        "ms",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "abuse_legit_p99_vs_unloaded_ratio",
        if p99_u > 0.0 { p99_l / p99_u } else { 0.0 },
        "ratio (target <= 3)",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "abuse_node_peak_rss_mib",
        hwm,
        "MiB",
        json!({ "bound_mib": MEMORY_BOUND_MIB, "rss_at_end_mib": rss }),
        None,
        None,
    );
    rec.add(
        "abuse_node_cpu_cores_loaded",
        cpu_l / wall_l.max(1e-9),
        "cores",
        json!({ "unloaded_cores": cpu_u / wall_u.max(1e-9), "machine_cores": num_cpus() }),
        None,
        None,
    );
    let per_s = |k: &str| counters[k].as_f64().unwrap_or(0.0) / attack_s.max(1e-9);
    rec.add(
        "abuse_attacker_bogus_txs_per_s",
        per_s("bogus_txs_answered"),
        "transactions/s",
        json!({ "answers": counters["batch_answers"], "what": "in requests the node answered" }),
        None,
        None,
    );
    rec.add(
        "abuse_node_bogus_txs_validated_per_s",
        per_s("bogus_txs_validated"),
        "transactions/s",
        json!({ "budget_per_address": florin_http::RateLimits::default().per_ip_tx_per_sec }),
        None,
        None,
    );
    rec.add(
        "abuse_attacker_oversized_bodies_per_s",
        per_s("oversized_sent"),
        "requests/s",
        json!({ "body_mib": OVERSIZED >> 20, "answers": counters["oversized_answers"] }),
        None,
        None,
    );
    rec.add(
        "abuse_attacker_idle_connections_opened_per_s",
        per_s("idle_opened"),
        "connections/s",
        json!({ "held_at_most": IDLE_CONNECTIONS, "closed_by_node": counters["idle_closed"] }),
        None,
        None,
    );
    if hwm > MEMORY_BOUND_MIB {
        tracing::warn!(
            "the node's peak memory {hwm:.0} MiB is over the {MEMORY_BOUND_MIB} MiB bound"
        );
    }
    Ok(())
}

/// The p-quantile (0..=1) of `xs`, nearest rank.
fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A network namespace joined to the host by a veth pair, and a cgroup v1 `cpu` group; both
/// removed on drop.
struct Isolation {
    ns: String,
    host_if: String,
    host_ip: Ipv4Addr,
    ns_ip: Ipv4Addr,
    cgroup: PathBuf,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Isolation {
    fn create() -> Result<Isolation> {
        let cpu_root = Path::new("/sys/fs/cgroup/cpu");
        if !cpu_root.join("cgroup.procs").exists() {
            bail!("florin bench abuse needs the cgroup v1 cpu controller at /sys/fs/cgroup/cpu");
        }
        let pid = std::process::id();
        let tag = pid % 100_000;
        let subnet = (pid % 250) as u8;
        let iso = Isolation {
            ns: format!("florin-abuse-{pid}"),
            host_if: format!("fab{tag}h"),
            host_ip: Ipv4Addr::new(10, 213, subnet, 1),
            ns_ip: Ipv4Addr::new(10, 213, subnet, 2),
            cgroup: cpu_root.join(format!("florin-abuse-{pid}")),
        };
        let ns_if = format!("fab{tag}n");
        ip(&["netns", "add", &iso.ns]).context(
            "florin bench abuse needs root: it runs the attacker in its own network namespace",
        )?;
        // From here on, drop cleans up whatever was made.
        ip(&[
            "link",
            "add",
            &iso.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        ip(&["link", "set", &ns_if, "netns", &iso.ns])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", iso.host_ip),
            "dev",
            &iso.host_if,
        ])?;
        ip(&["link", "set", &iso.host_if, "up"])?;
        let in_ns = |args: &[&str]| {
            let mut a = vec!["netns", "exec", &iso.ns, "ip"];
            a.extend_from_slice(args);
            ip(&a)
        };
        in_ns(&["addr", "add", &format!("{}/30", iso.ns_ip), "dev", &ns_if])?;
        in_ns(&["link", "set", &ns_if, "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        std::fs::create_dir(&iso.cgroup)
            .with_context(|| format!("creating {}", iso.cgroup.display()))?;
        std::fs::write(
            iso.cgroup.join("cpu.cfs_period_us"),
            CFS_PERIOD_US.to_string(),
        )?;
        std::fs::write(
            iso.cgroup.join("cpu.cfs_quota_us"),
            ATTACKER_QUOTA_US.to_string(),
        )?;
        Ok(iso)
    }

    /// Moves process `pid` (all its threads) into the attacker's CPU share.
    fn adopt(&self, pid: u32) -> Result<()> {
        std::fs::write(self.cgroup.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("moving pid {pid} into {}", self.cgroup.display()))
    }
}

impl Drop for Isolation {
    fn drop(&mut self) {
        // The group can be removed once its processes are gone (the attacker has exited).
        for _ in 0..50 {
            if !self.cgroup.exists() || std::fs::remove_dir(&self.cgroup).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// A `florin devnet` process in a temporary data directory.
struct NodeProc {
    child: Child,
    pid: u32,
    url: String,
    /// The devnet's CA certificate, when it serves HTTPS (its default).
    ca: Option<PathBuf>,
    dir: tempfile::TempDir,
}

impl NodeProc {
    fn start(exe: &Path, listen: SocketAddr) -> Result<NodeProc> {
        let dir = tempfile::tempdir()?;
        let log = std::fs::File::create(dir.path().join("node.log"))?;
        let mut child = Command::new(exe)
            .args(["devnet", "--data"])
            .arg(dir.path().join("data"))
            .args(["--listen", &listen.to_string()])
            // Extra devnet arguments, to compare limits (`docs/benchmarks.md`).
            .args(
                std::env::var("FLORIN_ABUSE_NODE_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting florin devnet")?;
        let pid = child.id();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no stdout from the node"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("listening on ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let mut node = NodeProc {
            child,
            pid,
            url: String::new(),
            ca: None,
            dir,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => {
                if url.starts_with("https://") {
                    node.ca = Some(node.dir.path().join("data").join("tls").join("ca.pem"));
                }
                node.url = url;
            }
            Err(_) => {
                let log =
                    std::fs::read_to_string(node.dir.path().join("node.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                bail!("the node did not start within 60 s (log: {tail})");
            }
        }
        Ok(node)
    }

    /// The CPU time the node has used, user and system, in seconds.
    fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // Fields after the command name (which may hold spaces): state is the 3rd field,
        // utime and stime the 14th and 15th, in clock ticks (100 a second on Linux).
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .ok_or_else(|| anyhow!("unexpected /proc stat"))?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| anyhow!("unexpected /proc stat"))
        };
        Ok((ticks(11)? + ticks(12)?) / 100.0)
    }

    /// (VmRSS, VmHWM) in MiB.
    fn memory_mib(&self) -> Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let field = |name: &str| -> f64 {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        };
        Ok((field("VmRSS:"), field("VmHWM:")))
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The attacker process, driven through its standard input: `go`, `stop`, end of input.
struct Attacker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl Attacker {
    fn start(exe: &Path, iso: &Isolation, node: &NodeProc) -> Result<Attacker> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &iso.ns])
            .arg(exe)
            .args(["bench", "abuse", "--attack", &node.url])
            .env_remove("FLORIN_CA_CERT")
            .envs(node.ca.as_ref().map(|ca| ("FLORIN_CA_CERT", ca)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the attacker")?;
        // `ip netns exec` execs the program in place: the pid is the attacker's.
        if let Err(e) = iso.adopt(child.id()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().map(BufReader::new);
        let mut a = Attacker {
            child,
            stdin,
            stdout,
        };
        // It answers "ready" once its bogus batches are built.
        let line = a.read_line()?;
        if line.trim() != "ready" {
            bail!("the attacker did not start: {}", line.trim());
        }
        Ok(a)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = String::new();
        self.stdout
            .as_mut()
            .ok_or_else(|| anyhow!("attacker output closed"))?
            .read_line(&mut line)?;
        Ok(line)
    }

    fn command(&mut self, c: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("attacker input closed"))?;
        writeln!(stdin, "{c}")?;
        stdin.flush()?;
        Ok(())
    }

    /// Ends the attacker and returns its counters.
    fn finish(mut self) -> Result<Value> {
        self.stdin.take();
        let line = self.read_line()?;
        let _ = self.child.wait();
        serde_json::from_str(line.trim()).context("reading the attacker's counters")
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The legitimate client: one key paying one cent at a time from its own change.
struct Legit {
    client: florin_http::NodeClient,
    signer: LocalSigner,
    coin: Utxo,
    sink: Encumbrance,
}

impl Legit {
    async fn new(node: &NodeProc) -> Result<Legit> {
        let tls = florin_http::ClientTls::from_optional(node.ca.as_deref())?;
        let client = florin_http::NodeClient::with_tls(&node.url, &tls)?;
        let signer = LocalSigner::new(SecretKey::generate(&mut OsRng));
        let answer = client
            .ledger_faucet(&LedgerFaucet {
                owner: signer.public_key().to_address(),
                amount_cents: 1_000_000,
            })
            .await?;
        let first = answer
            .outputs
            .first()
            .ok_or_else(|| anyhow!("the faucet minted nothing"))?;
        let coin = Utxo::decode(&hex::decode(first)?)?;
        let sink =
            Encumbrance::ed25519(&LocalSigner::new(SecretKey::generate(&mut OsRng)).public_key());
        Ok(Legit {
            client,
            signer,
            coin,
            sink,
        })
    }

    /// `n` payments in a row; each one's latency in ms.
    async fn pay(&mut self, n: usize) -> Result<Vec<f64>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let own = self.coin.encumbrance;
            let draft = Draft::new(
                vec![self.coin],
                vec![
                    Output {
                        value: 1,
                        encumbrance: self.sink,
                    },
                    Output {
                        value: self.coin.value - 1,
                        encumbrance: own,
                    },
                ],
            )?;
            let change = draft
                .output_utxos()
                .get(1)
                .cloned()
                .ok_or_else(|| anyhow!("no change output"))?;
            let tx = Transaction::Transfer(draft.sign(&[&self.signer])?);
            let body = hex::encode(tx.encode());
            let t = Instant::now();
            let status = self.client.submit(body).await?;
            out.push(t.elapsed().as_secs_f64() * 1e3);
            if status.status != "confirmed" {
                bail!(
                    "a legitimate payment was not confirmed: {} {}",
                    status.status,
                    status.error.unwrap_or_default()
                );
            }
            self.coin = change;
        }
        Ok(out)
    }
}

/// What the attacker did.
#[derive(Default)]
struct Counters {
    /// Bogus transactions in requests the node answered (whatever the answer).
    bogus_txs_answered: AtomicU64,
    /// Bogus transactions in requests the node took and validated (200).
    bogus_txs_validated: AtomicU64,
    batch_answers: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    oversized_sent: AtomicU64,
    oversized_answers: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    idle_opened: AtomicU64,
    idle_closed: AtomicU64,
}

fn count(map: &std::sync::Mutex<std::collections::BTreeMap<String, u64>>, key: String) {
    if let Ok(mut m) = map.lock() {
        *m.entry(key).or_default() += 1;
    }
}

/// A batch of validly signed transfers that spend outputs nobody created, in the binary batch
/// form (`u32` length, then the transaction, per frame).
fn bogus_batch(n: usize) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut rng = OsRng;
    for _ in 0..n {
        let signer = LocalSigner::new(SecretKey::generate(&mut rng));
        let mut serial = [0u8; 32];
        rng.fill_bytes(&mut serial);
        let input = Utxo {
            value: 1_000,
            encumbrance: Encumbrance::ed25519(&signer.public_key()),
            serial,
        };
        let transfer = Transfer {
            expires: florin_ledger::expiry::default_expiry(),
            inputs: vec![input],
            outputs: vec![Output {
                value: 1_000,
                encumbrance: Encumbrance::ed25519(&signer.public_key()),
            }],
            witnesses: vec![],
        };
        let txid = transfer.txid();
        let sig = signer
            .sign(&txid)
            .map_err(|e| anyhow!("signing a bogus transfer: {e}"))?;
        let transfer = Transfer {
            witnesses: vec![Witness::ed25519(signer.public_key(), sig)],
            ..transfer
        };
        let tx = Transaction::Transfer(transfer).encode();
        body.extend_from_slice(&(tx.len() as u32).to_le_bytes());
        body.extend_from_slice(&tx);
    }
    Ok(body)
}

/// The attacker process (`florin bench abuse --attack URL`, trusting the CA in
/// `FLORIN_CA_CERT` when the node serves HTTPS): builds its batches, says `ready`, attacks
/// between `go` and `stop`, and prints its counters as one JSON line at end of input.
pub(super) fn attack(url: &str) -> Result<ExitCode> {
    let batches: Vec<bytes::Bytes> = (0..4)
        .map(|_| bogus_batch(BOGUS_BATCH).map(bytes::Bytes::from))
        .collect::<Result<_>>()?;
    let oversized = bytes::Bytes::from(vec![b'0'; OVERSIZED]);
    let addr: SocketAddr = {
        let rest = url
            .split_once("://")
            .map(|(_, r)| r)
            .ok_or_else(|| anyhow!("not a URL: {url}"))?;
        rest.trim_end_matches('/').parse()?
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let counters = Arc::new(Counters::default());
    let ca = std::env::var_os("FLORIN_CA_CERT").map(PathBuf::from);
    let http = florin_http::ClientTls::from_optional(ca.as_deref())?
        .reqwest_builder()?
        .timeout(Duration::from_secs(30))
        .build()?;
    let floods = Floods::from_env();
    println!("ready");
    let mut running: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        match line?.trim() {
            "go" => {
                if floods.batches {
                    for b in &batches {
                        running.push(rt.spawn(flood(
                            http.clone(),
                            format!("{url}/v1/ledger/batch"),
                            b.clone(),
                            Flood::Batches,
                            counters.clone(),
                        )));
                    }
                }
                if floods.oversized {
                    for _ in 0..2 {
                        running.push(rt.spawn(flood(
                            http.clone(),
                            format!("{url}/v1/ledger/transactions"),
                            oversized.clone(),
                            Flood::Oversized,
                            counters.clone(),
                        )));
                    }
                }
                if floods.idle {
                    let tls = url.starts_with("https://");
                    for _ in 0..IDLE_CONNECTIONS {
                        running.push(rt.spawn(hold_idle(addr, tls, counters.clone())));
                    }
                }
            }
            "stop" => {
                for t in running.drain(..) {
                    t.abort();
                }
            }
            _ => {}
        }
    }
    for t in running.drain(..) {
        t.abort();
    }
    let answers = |m: &std::sync::Mutex<std::collections::BTreeMap<String, u64>>| {
        m.lock().map(|m| json!(*m)).unwrap_or(Value::Null)
    };
    println!(
        "{}",
        json!({
            "bogus_txs_answered": counters.bogus_txs_answered.load(Ordering::Relaxed),
            "bogus_txs_validated": counters.bogus_txs_validated.load(Ordering::Relaxed),
            "batch_answers": answers(&counters.batch_answers),
            "oversized_sent": counters.oversized_sent.load(Ordering::Relaxed),
            "oversized_answers": answers(&counters.oversized_answers),
            "idle_opened": counters.idle_opened.load(Ordering::Relaxed),
            "idle_closed": counters.idle_closed.load(Ordering::Relaxed),
        })
    );
    drop(rt);
    Ok(ExitCode::SUCCESS)
}

/// Which floods the attacker runs: all three unless `FLORIN_ABUSE_FLOODS` names some
/// (comma-separated `batches`, `oversized`, `idle`), to see what each costs on its own.
struct Floods {
    batches: bool,
    oversized: bool,
    idle: bool,
}

impl Floods {
    fn from_env() -> Floods {
        match std::env::var("FLORIN_ABUSE_FLOODS") {
            Ok(v) if !v.trim().is_empty() => {
                let has = |k: &str| v.split(',').any(|x| x.trim() == k);
                Floods {
                    batches: has("batches"),
                    oversized: has("oversized"),
                    idle: has("idle"),
                }
            }
            _ => Floods {
                batches: true,
                oversized: true,
                idle: true,
            },
        }
    }
}

/// What one flood counts.
#[derive(Clone, Copy)]
enum Flood {
    /// Bogus batches: the transactions of each answered request, and of each accepted one.
    Batches,
    /// Oversized bodies: each request sent.
    Oversized,
}

/// Posts `body` to `url` again and again, as fast as the attacker's CPU share allows: a
/// refusal is followed at once by the next request; only a broken connection waits 1 ms.
async fn flood(
    http: reqwest::Client,
    url: String,
    body: bytes::Bytes,
    kind: Flood,
    c: Arc<Counters>,
) {
    loop {
        let r = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(body.clone())
            .send()
            .await;
        let key = match &r {
            Ok(resp) => resp.status().as_u16().to_string(),
            Err(_) => "cut off".to_string(),
        };
        match kind {
            Flood::Batches => {
                if r.is_ok() {
                    c.bogus_txs_answered
                        .fetch_add(BOGUS_BATCH as u64, Ordering::Relaxed);
                }
                if key == "200" {
                    c.bogus_txs_validated
                        .fetch_add(BOGUS_BATCH as u64, Ordering::Relaxed);
                }
                count(&c.batch_answers, key);
            }
            Flood::Oversized => {
                c.oversized_sent.fetch_add(1, Ordering::Relaxed);
                count(&c.oversized_answers, key);
            }
        }
        if r.is_err() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// One connection that starts a request and never finishes it (over TLS: never finishes its
/// handshake); opened again when the node closes it.
async fn hold_idle(addr: SocketAddr, tls: bool, c: Arc<Counters>) {
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
            c.idle_opened.fetch_add(1, Ordering::Relaxed);
            if !tls {
                let _ = s
                    .write_all(b"POST /v1/ledger/batch HTTP/1.1\r\nHost: a\r\n")
                    .await;
            }
            let mut buf = [0u8; 256];
            // Until the node closes it.
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
            c.idle_closed.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

//! `florin bench custody --emulate-hosts`: the custodial payments of the custody suite as
//! deployed. Every party is its own process on its own emulated host ([`florin_node::hosts`]:
//! a network namespace with its own address and the same CPU share for every host):
//!
//! - the ledger: `florin devnet` (TLS, rate limits off: the providers are its only clients);
//! - two payment providers, each a process running its customers' payments (this binary's
//!   hidden `--loadgen` mode, [`provider`]);
//! - each provider's 2-of-3 key-management network: three `florin custody node` processes
//!   (FROST for Ed25519 keys, DKLs23 for P-256 keys).
//!
//! Each scheme runs twice: single keys held by the provider first (the reference), then
//! threshold keys, on the same hosts; each kind gets a fresh ledger on the ledger host. The
//! P-256 customers' keys are made by key addition (R5: the provider's one DKLs23 key plus a
//! fresh scalar per customer, as a pre-generated pool would hand them out), so that 2 × 300
//! key generations do not take the hosts' shares for an hour; a signature costs the same. Nothing else runs on the hosts' shares:
//! keys, mints and coordination happen before the clock starts, and this process only reads
//! each host's CPU time (`cpuacct`) around each point. `threshold_vs_single_e2e_ratio` is the
//! single-key throughput over the threshold throughput, each the best over the user counts.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use florin_crypto::p256::P256SecretKey;
use florin_crypto::{LocalSigner, SecretKey};
use florin_ledger::{Encumbrance, Transaction};
use florin_node::custody::{EcdsaEngine, EcdsaLevel, Kmn, Layout};
use florin_node::hosts::{HostNet, HostNetGuard};
use rand::rngs::OsRng;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::custody::{coin_mint, doc_rate, drive_payers, pay, seed, Customer, Http, PayKey, Route};
use super::ledger_e2e::percentile;
use super::line_child::LineChild;
use super::{Recorder, Reference};

/// The ledger's API port on its host.
const LEDGER_PORT: u16 = 7400;
/// The key-management nodes' port on their hosts.
const KMN_PORT: u16 = 7500;
/// Providers, each with its own network of [`KMN_N`] nodes.
const PROVIDERS: usize = 2;
const KMN_T: u16 = 2;
const KMN_N: usize = 3;

/// What a provider process is told (`provider.json` in its directory).
#[derive(Serialize, Deserialize)]
struct ProviderConfig {
    /// Tells this mode apart from the cluster suite's load generators.
    provider: bool,
    /// The ledger's API (TLS).
    ledger: SocketAddr,
    /// The CA certificate the ledger's certificate chains to.
    ca: PathBuf,
    /// Threshold custody: the provider's key-management network (its layout directory, with
    /// the coordinator's key). `None`: single keys held by the provider.
    kmn: Option<PathBuf>,
    /// The customers' keys: Ed25519 (FROST with a network) or P-256 (DKLs23 with one).
    p256: bool,
    /// Customers who pay, and as many who are paid.
    payers: usize,
    /// Prefix of the key names made in the network.
    tag: String,
}

/// What a provider says first: its payers' and payees' keys (encumbrances, text form).
#[derive(Serialize, Deserialize)]
struct ProviderKeys {
    payers: Vec<String>,
    payees: Vec<String>,
    /// Seconds the keys took (distributed key generation with threshold custody).
    keygen_s: f64,
}

/// What a provider is told.
#[derive(Serialize, Deserialize)]
enum ProviderCmd {
    /// Its payers' coins (within these mints, hex-encoded transactions) and the other
    /// provider's payees (the cross-provider route pays them).
    Coins {
        mints: Vec<String>,
        others: Vec<String>,
    },
    /// Open fresh connections for the first `users` payers; answered `prepared`.
    Prepare { users: usize },
    /// Run the payments of the first `users` payers for `secs`.
    Go {
        route: Route,
        users: usize,
        secs: f64,
    },
}

/// What a provider reports after a run.
#[derive(Serialize, Deserialize)]
struct ProviderRun {
    /// Payments finished within the window.
    done: u64,
    /// Payments finished at all (those in flight when it closed too).
    done_all: u64,
    /// The latency (µs) of each payment finished within the window.
    latencies_us: Vec<u32>,
    /// Requests sent again on a fresh connection after getting no answer.
    retries: u64,
}

/// `florin bench custody --loadgen FILE` with a provider's config: one payment provider on its
/// host. Makes its customers' keys, prints them, takes its coins, warms every connection up
/// with one payment per payer, says `ready`, then runs what it is told until stdin closes.
pub(super) fn provider(path: &Path) -> Result<ExitCode> {
    let cfg: ProviderConfig = serde_json::from_slice(&std::fs::read(path)?)?;
    if !cfg.provider {
        bail!("{}: not a provider's config", path.display());
    }
    let tls = Arc::new(florin_http::ClientTls::from_ca_file(&cfg.ca)?.rustls_config()?);
    let kmn = match &cfg.kmn {
        Some(dir) => {
            let (net, me) = Layout::new(dir).load()?;
            let kmn = Kmn::new(&net, me)?;
            if !cfg.p256 {
                wait_for_nonces(&kmn)?;
            }
            Some(kmn)
        }
        None => None,
    };
    let st = Instant::now();
    let keys = make_keys(kmn.as_ref(), &cfg)?;
    let keygen_s = st.elapsed().as_secs_f64();
    let (payer_keys, payee_keys) = keys.split_at(cfg.payers);
    let mut out = std::io::stdout();
    let said = ProviderKeys {
        payers: payer_keys
            .iter()
            .map(|k| k.encumbrance().to_text())
            .collect(),
        payees: payee_keys
            .iter()
            .map(|k| k.encumbrance().to_text())
            .collect(),
        keygen_s,
    };
    writeln!(out, "{}", serde_json::to_string(&said)?)?;
    out.flush()?;
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    let read = |stdin: &mut std::io::StdinLock, line: &mut String| -> Result<Option<ProviderCmd>> {
        line.clear();
        if stdin.read_line(line)? == 0 {
            return Ok(None);
        }
        let cmd = serde_json::from_str(line.trim())
            .with_context(|| format!("a command from the parent: {:?}", line.trim()))?;
        Ok(Some(cmd))
    };
    let Some(ProviderCmd::Coins { mints, others }) = read(&mut stdin, &mut line)? else {
        bail!("expected the coins");
    };
    let mut coins = std::collections::HashMap::new();
    for m in &mints {
        if let Transaction::Mint(m) = Transaction::decode(&hex::decode(m)?)
            .map_err(|e| anyhow!("a mint from the parent: {e:?}"))?
        {
            for u in m.output_utxos() {
                coins.insert(u.encumbrance, u);
            }
        }
    }
    let payers: Vec<Mutex<Customer>> = payer_keys
        .iter()
        .map(|key| {
            let coin = *coins
                .get(&key.encumbrance())
                .ok_or_else(|| anyhow!("no coin for a payer"))?;
            Ok(Mutex::new(Customer {
                key: key.clone(),
                coin,
                http: None,
            }))
        })
        .collect::<Result<_>>()?;
    let parse = |v: &[String]| -> Result<Vec<Encumbrance>> {
        v.iter()
            .map(|a| Encumbrance::parse_text(a).ok_or_else(|| anyhow!("a key {a:?}")))
            .collect()
    };
    let own_payees = parse(&said.payees)?;
    let other_payees = parse(&others)?;
    let connect = || Http::connect_tls(cfg.ledger, tls.clone());
    // Warm-up, before the clock: every payer opens its connection and makes one payment
    // (TLS sessions up, each key's first nonce commitments fetched).
    reconnect(&connect, &payers, Some(&own_payees))?;
    writeln!(out, "ready")?;
    out.flush()?;
    while let Some(cmd) = read(&mut stdin, &mut line)? {
        let (route, users, secs) = match cmd {
            ProviderCmd::Prepare { users } => {
                // The ledger closes connections idle for 10 s: fresh ones for this run, opened
                // before the parent reads the hosts' CPU.
                reconnect(&connect, &payers[..users.min(payers.len())], None)?;
                writeln!(out, "prepared")?;
                out.flush()?;
                continue;
            }
            ProviderCmd::Go { route, users, secs } => (route, users, secs),
            ProviderCmd::Coins { .. } => bail!("coins given twice"),
        };
        let payees = match route {
            Route::Same => &own_payees,
            Route::Cross => &other_payees,
        };
        let r = drive_payers(
            &connect,
            &payers[..users.min(payers.len())],
            payees,
            route,
            secs,
        )?;
        let run = ProviderRun {
            done: r.done,
            done_all: r.done_all,
            latencies_us: r.latencies_us,
            retries: r.retries,
        };
        writeln!(out, "{}", serde_json::to_string(&run)?)?;
        out.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Opens a fresh connection to the ledger for every payer, all at once; with `warm`, each
/// payer then pays its payee there once.
fn reconnect(
    connect: &(dyn Fn() -> Result<Http> + Sync),
    payers: &[Mutex<Customer>],
    warm: Option<&[Encumbrance]>,
) -> Result<()> {
    std::thread::scope(|s| -> Result<()> {
        let threads: Vec<_> = payers
            .iter()
            .enumerate()
            .map(|(i, payer)| {
                s.spawn(move || -> Result<()> {
                    let mut c = payer.lock().map_err(|_| anyhow!("lock"))?;
                    let mut http = connect()?;
                    if let Some(payees) = warm.filter(|p| !p.is_empty()) {
                        pay(&mut http, &mut c, &payees[i % payees.len()], Route::Same)?;
                    }
                    c.http = Some(http);
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join()
                .map_err(|_| anyhow!("a connecting thread panicked"))??;
        }
        Ok(())
    })
}

/// Waits until every node answers with its first nonce pool full, so that filling it does
/// not compete with what is measured.
fn wait_for_nonces(kmn: &Kmn) -> Result<()> {
    let full = florin_node::custody::node::NONCE_POOL_START as u64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let st = kmn.status();
        if st.iter().all(|s| s.up && s.nonces_ready >= full) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the key-management nodes were not ready within 120 s: {}",
                st.iter()
                    .map(|s| format!(
                        "node {} {}",
                        s.party,
                        s.error
                            .as_deref()
                            .unwrap_or(if s.up { "up" } else { "down" })
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The provider's payers' keys, then its payees' keys: single keys; FROST keys by distributed
/// key generation in its network (four at a time); or DKLs23 keys by key addition from one
/// DKLs23 key of the provider's.
fn make_keys(kmn: Option<&Arc<Kmn>>, cfg: &ProviderConfig) -> Result<Vec<PayKey>> {
    let total = 2 * cfg.payers;
    let Some(kmn) = kmn else {
        return Ok((0..total)
            .map(|_| {
                if cfg.p256 {
                    PayKey::P256(Arc::new(P256SecretKey::generate(&mut OsRng)))
                } else {
                    PayKey::Ed25519(Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng))))
                }
            })
            .collect());
    };
    let base = format!("{}-base", cfg.tag);
    if cfg.p256 {
        kmn.ecdsa_keygen_with(&base, EcdsaEngine::Dkls23)
            .with_context(|| format!("making key {base}"))?;
    }
    let name = |i: usize| {
        if i < cfg.payers {
            format!("{}-payer-{i}", cfg.tag)
        } else {
            format!("{}-payee-{}", cfg.tag, i - cfg.payers)
        }
    };
    let made: Mutex<Vec<Option<PayKey>>> = Mutex::new(vec![None; total]);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= total {
                            return Ok(());
                        }
                        let key = if cfg.p256 {
                            let mut r2 = [0u8; 32];
                            rand::RngCore::fill_bytes(&mut OsRng, &mut r2);
                            // Below the group order: a scalar.
                            r2[0] &= 0x7f;
                            let pk = kmn
                                .ecdsa_add_key(&name(i), &base, &r2)
                                .with_context(|| format!("making key {}", name(i)))?;
                            PayKey::P256(Arc::new(kmn.dkls_signer(&name(i), pk)))
                        } else {
                            let g = kmn
                                .dkg(&name(i))
                                .with_context(|| format!("making key {}", name(i)))?;
                            PayKey::Ed25519(Arc::new(florin_node::custody::ThresholdSigner::new(
                                kmn.clone(),
                                g,
                            )))
                        };
                        made.lock().map_err(|_| anyhow!("lock"))?[i] = Some(key);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow!("a key generation thread panicked"))??;
        }
        Ok(())
    })?;
    made.into_inner()
        .map_err(|_| anyhow!("lock"))?
        .into_iter()
        .map(|k| k.ok_or_else(|| anyhow!("a key was not made")))
        .collect()
}

/// Sends a provider a command.
fn send(p: &mut LineChild, cmd: &ProviderCmd) -> Result<()> {
    p.send(&serde_json::to_string(cmd)?)
}

/// The deployment: the hosts, both networks running, and the ledger host.
struct Deployment {
    /// Dropped first: the hosts and everything on them go before their directories.
    net: HostNetGuard,
    dir: tempfile::TempDir,
    ledger_addr: SocketAddr,
}

/// A ledger (`florin devnet`) on the ledger host: each kind of provider gets a fresh one.
struct Ledger {
    child: std::process::Child,
    addr: SocketAddr,
    ca: PathBuf,
    issuer: LocalSigner,
    tls: Arc<rustls::ClientConfig>,
}

impl Drop for Ledger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn host_of(kind: &str, p: usize, i: usize) -> String {
    match kind {
        "kmn" => format!("kmn-{p}-{i}"),
        _ => format!("provider-{p}"),
    }
}

/// Makes the hosts and starts the key-management nodes.
fn deploy(exe: &Path, share: f64) -> Result<Deployment> {
    let dir = tempfile::tempdir()?;
    let mut net = HostNetGuard::new(HostNet::claim(Some(share))?);
    let ledger_host = net.0.add("ledger")?;
    let mut kmn_addrs = Vec::new();
    for p in 0..PROVIDERS {
        let mut addrs = Vec::new();
        for i in 1..=KMN_N {
            let h = net.0.add(&host_of("kmn", p, i))?;
            addrs.push(SocketAddr::from((h.addr, KMN_PORT)));
        }
        kmn_addrs.push(addrs);
        net.0.add(&host_of("provider", p, 0))?;
    }
    for (p, addrs) in kmn_addrs.iter().enumerate() {
        let layout = Layout::new(&dir.path().join(format!("kmn-{p}")));
        layout.create(KMN_T, addrs)?;
        // DKLs23 for the P-256 customers' keys (no set-up); FROST as always.
        layout.set_ecdsa(Some(EcdsaLevel::Dkls23))?;
        for i in 1..=KMN_N {
            let log = std::fs::File::create(dir.path().join(format!("kmn-{p}-{i}.log")))?;
            net.0
                .command(&host_of("kmn", p, i), exe)?
                .args(["custody", "node", "--exit-with-parent", "--config"])
                .arg(layout.node_config(i as u16))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .context("starting a key-management node")?;
        }
    }
    Ok(Deployment {
        net,
        dir,
        ledger_addr: SocketAddr::from((ledger_host.addr, LEDGER_PORT)),
    })
}

/// Starts a fresh ledger, as `florin devnet` runs it, on the ledger host (data in
/// `ledger-NAME`, its log in `ledger-NAME.log`). Its only clients are the two providers: no
/// per-address limits. Returns once its API answers over TLS with its CA.
fn start_ledger(d: &Deployment, exe: &Path, name: &str) -> Result<Ledger> {
    let addr = d.ledger_addr;
    let ldir = d.dir.path().join(format!("ledger-{name}"));
    let log_path = d.dir.path().join(format!("ledger-{name}.log"));
    let child = d
        .net
        .0
        .command("ledger", exe)?
        .arg("devnet")
        .arg("--data")
        .arg(&ldir)
        .args(["--listen", &addr.to_string()])
        .args(["--rate-per-ip", "0", "--tx-rate-per-ip", "0"])
        .args(["--conns-per-ip", "100000", "--new-conns-per-ip", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()
        .context("starting the ledger")?;
    let ca = ldir.join("tls").join(florin_http::tls::CA_CERT_FILE);
    let deadline = Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let tried = (|| -> Result<(Arc<rustls::ClientConfig>, LocalSigner)> {
            let tls = Arc::new(florin_http::ClientTls::from_ca_file(&ca)?.rustls_config()?);
            Http::connect_tls(addr, tls.clone())?.call("GET", "/v1/info", &[])?;
            let issuer = LocalSigner::new(florin_node::load_key(&ldir.join("issuer.key"))?);
            Ok((tls, issuer))
        })();
        match tried {
            Ok(ready) => break Ok(ready),
            Err(e) if Instant::now() > deadline => {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                break Err(anyhow!(
                    "the ledger did not answer within 60 s ({e:#}); its log ends: {}",
                    log.lines().rev().take(3).collect::<Vec<_>>().join(" / ")
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let mut child = child;
    match ready {
        Ok((tls, issuer)) => Ok(Ledger {
            child,
            addr,
            ca,
            issuer,
            tls,
        }),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// Mints a coin for each of `keys` through the ledger's API; returns the mints, hex-encoded.
fn mint(l: &Ledger, keys: &[String]) -> Result<Vec<String>> {
    let mut http = Http::connect_tls(l.addr, l.tls.clone())?;
    let mut out = Vec::new();
    for chunk in keys.chunks(200) {
        let encs = chunk
            .iter()
            .map(|k| Encumbrance::parse_text(k).ok_or_else(|| anyhow!("a key {k:?}")))
            .collect::<Result<Vec<_>>>()?;
        let m = coin_mint(&l.issuer, &encs)?;
        let tx = Transaction::Mint(m).encode();
        let body = http.call("POST", "/v1/ledger/transactions", &tx)?;
        let st: florin_node::api::LedgerTxStatus = serde_json::from_slice(&body)?;
        if st.status != "confirmed" {
            bail!("a benchmark mint was not confirmed: {}", st.status);
        }
        out.push(hex::encode(tx));
    }
    Ok(out)
}

/// Starts both providers of one kind and gives them their coins; returns them once ready,
/// with the seconds their keys took.
fn start_providers(
    d: &Deployment,
    ledger: &Ledger,
    exe: &Path,
    threshold: bool,
    p256: bool,
    payers: usize,
) -> Result<(Vec<LineChild>, f64)> {
    let kind = format!(
        "{}-{}",
        if threshold { "threshold" } else { "single" },
        if p256 { "p256" } else { "ed25519" }
    );
    let mut procs = Vec::new();
    for p in 0..PROVIDERS {
        let pdir = d.dir.path().join(format!("provider-{p}-{kind}"));
        std::fs::create_dir_all(&pdir)?;
        let cfg = ProviderConfig {
            provider: true,
            ledger: ledger.addr,
            ca: ledger.ca.clone(),
            kmn: threshold.then(|| d.dir.path().join(format!("kmn-{p}"))),
            p256,
            payers,
            tag: format!("p{p}-{}", if p256 { "ec" } else { "ed" }),
        };
        let path = pdir.join("provider.json");
        std::fs::write(&path, serde_json::to_vec(&cfg)?)?;
        let mut cmd = d.net.0.command(&host_of("provider", p, 0), exe)?;
        cmd.args(["bench", "custody", "--loadgen"]).arg(&path);
        procs.push(LineChild::spawn(
            cmd,
            pdir.join("provider.log"),
            "a payment provider",
        )?);
    }
    let mut keys = Vec::new();
    for p in &mut procs {
        let k: ProviderKeys = serde_json::from_str(&p.line()?).context("a provider's keys")?;
        keys.push(k);
    }
    let keygen_s = keys.iter().map(|k| k.keygen_s).fold(0.0, f64::max);
    let all: Vec<String> = keys.iter().flat_map(|k| k.payers.clone()).collect();
    let mints = mint(ledger, &all)?;
    for (p, proc) in procs.iter_mut().enumerate() {
        send(
            proc,
            &ProviderCmd::Coins {
                mints: mints.clone(),
                others: keys[(p + 1) % PROVIDERS].payees.clone(),
            },
        )?;
    }
    for p in &mut procs {
        p.expect("ready")?;
    }
    Ok((procs, keygen_s))
}

/// Waits until every host whose name starts with `prefix` is idle (under 10 % of its share
/// over half a second): the key-management nodes refilling their nonce pools after a burst of
/// demand (the pools grow to meet it). Returns whether they got there within `within`.
fn settle(d: &Deployment, prefix: &str, within: Duration) -> bool {
    let hosts: Vec<_> = d
        .net
        .0
        .hosts
        .iter()
        .filter(|h| h.name.starts_with(prefix))
        .collect();
    let share = d.net.0.cpu_share.unwrap_or(1.0);
    let cpu = || -> Vec<f64> {
        hosts
            .iter()
            .map(|h| h.cpu_seconds().unwrap_or(0.0))
            .collect()
    };
    let deadline = Instant::now() + within;
    loop {
        let c0 = cpu();
        std::thread::sleep(Duration::from_millis(500));
        let busiest = cpu()
            .iter()
            .zip(&c0)
            .map(|(b, a)| (b - a) / (share * 0.5))
            .fold(0.0, f64::max);
        if busiest < 0.10 {
            return true;
        }
        if Instant::now() > deadline {
            tracing::info!(
                "  note: a {prefix}* host was still busy after {within:?} ({:.0} % of its share)",
                busiest * 100.0
            );
            return false;
        }
    }
}

/// The longest a point may take beyond its own time: the payments in flight at its end
/// finish, and each provider sends its report.
const RUN_GRACE: Duration = Duration::from_secs(120);

/// One measured run of both providers together.
struct HostRun {
    /// Payments finished within the window, per second of it, both providers together.
    per_s: f64,
    done: u64,
    latencies_us: Vec<u32>,
    /// CPU µs per payment on each tier (providers, key-management nodes, the ledger): each
    /// tier's CPU from the start until every payment finished (the nodes' until they were
    /// idle again, their nonce pools refilled), over every payment finished.
    tier_cpu_us: [f64; 3],
    /// The hosts that used most of their share, with that fraction.
    busiest: Vec<(String, f64)>,
    /// Whether the key-management hosts were idle before the run and again after it.
    settled: bool,
    /// Requests sent again on a fresh connection after getting no answer.
    retries: u64,
}

fn run_once(
    d: &Deployment,
    procs: &mut [LineChild],
    route: Route,
    users: usize,
    secs: f64,
) -> Result<HostRun> {
    // Before the connections are opened (the ledger closes connections idle for 10 s).
    let settled_before = settle(d, "kmn-", Duration::from_secs(60));
    let per_provider = users / PROVIDERS;
    for p in procs.iter_mut() {
        send(
            p,
            &ProviderCmd::Prepare {
                users: per_provider,
            },
        )?;
    }
    for p in procs.iter_mut() {
        p.expect("prepared")?;
    }
    let hosts = &d.net.0.hosts;
    let cpu_now = || -> Vec<f64> {
        hosts
            .iter()
            .map(|h| h.cpu_seconds().unwrap_or(0.0))
            .collect()
    };
    let before = cpu_now();
    let t0 = Instant::now();
    for p in procs.iter_mut() {
        send(
            p,
            &ProviderCmd::Go {
                route,
                users: per_provider,
                secs,
            },
        )?;
    }
    let mut runs = Vec::new();
    for p in procs.iter_mut() {
        let line = p.line_within(Duration::from_secs_f64(secs) + RUN_GRACE)?;
        let r: ProviderRun = serde_json::from_str(&line).context("a provider's run")?;
        runs.push(r);
    }
    let window = t0.elapsed().as_secs_f64().max(1e-9);
    let after = cpu_now();
    let settled_after = settle(d, "kmn-", Duration::from_secs(60));
    let after_settle = cpu_now();
    let used: Vec<(String, f64)> = hosts
        .iter()
        .zip(before.iter().zip(after.iter().zip(&after_settle)))
        .map(|(h, (b, (a, s)))| {
            let end = if h.name.starts_with("kmn-") { s } else { a };
            (h.name.clone(), end - b)
        })
        .collect();
    let done_all: u64 = runs.iter().map(|r| r.done_all).sum();
    let per_tier = |prefix: &str| -> f64 {
        let cpu: f64 = used
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, c)| c)
            .sum();
        cpu * 1e6 / done_all.max(1) as f64
    };
    let share = d.net.0.cpu_share.unwrap_or(1.0);
    // Each host's use of its share over the payments' window (refills after it left out).
    let mut busiest: Vec<(String, f64)> = hosts
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(h, (b, a))| (h.name.clone(), (a - b) / window / share))
        .collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    busiest.truncate(4);
    let mut latencies_us: Vec<u32> = runs.iter().flat_map(|r| r.latencies_us.clone()).collect();
    latencies_us.sort_unstable();
    let done = runs.iter().map(|r| r.done).sum();
    Ok(HostRun {
        per_s: done as f64 / secs.max(1e-9),
        done,
        latencies_us,
        tier_cpu_us: [per_tier("provider-"), per_tier("kmn-"), per_tier("ledger")],
        busiest,
        settled: settled_before && settled_after,
        retries: runs.iter().map(|r| r.retries).sum(),
    })
}

/// Runs the suite on emulated hosts.
pub(super) fn run(rec: &mut Recorder, quick: bool, host_cpu: Option<f64>) -> Result<()> {
    florin_node::hosts::check_supported()?;
    florin_node::hosts::remove_on_signal();
    let exe = std::env::current_exe().context("cannot find the florin binary")?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let hosts = 1 + PROVIDERS * (1 + KMN_N);
    let share = host_cpu.unwrap_or(cores as f64 / hosts as f64);
    let users: &[usize] = if quick { &[100] } else { &[20, 100, 300] };
    let secs = if quick { 2.0 } else { 5.0 };
    tracing::info!(
        "custodial payments on emulated hosts: the ledger, {PROVIDERS} providers and \
         {PROVIDERS} x {KMN_N} key-management nodes ({KMN_T}-of-{KMN_N}): {hosts} hosts of \
         {share:.3} core(s); {users:?} users, {secs} s per point"
    );
    let d = deploy(&exe, share)?;
    match measure(rec, &d, &exe, users, secs, share)
        .and_then(|best| report(rec, &best, share, hosts))
    {
        Ok(()) => Ok(()),
        Err(e) => {
            // The hosts go; the logs stay for whoever reads the error.
            let Deployment { net, dir, .. } = d;
            drop(net);
            let kept = dir.keep();
            Err(e.context(format!(
                "the ledger's, the providers' and the nodes' logs are kept in {}",
                kept.display()
            )))
        }
    }
}

/// The best rate of each kind (P-256?, threshold?, same provider?) with its tiers' CPU per
/// payment.
type Best = BTreeMap<(bool, bool, bool), (f64, [f64; 3])>;

/// Every point: for Ed25519 then P-256, single keys first, then threshold keys (FROST,
/// DKLs23), each kind with a fresh ledger and its own provider processes on the same hosts.
fn measure(
    rec: &mut Recorder,
    d: &Deployment,
    exe: &Path,
    users: &[usize],
    secs: f64,
    share: f64,
) -> Result<Best> {
    let hosts = d.net.0.hosts.len();
    let most = users.iter().copied().max().unwrap_or(2);
    let mut best = Best::new();
    for (p256, threshold) in [(false, false), (false, true), (true, false), (true, true)] {
        let custody = if threshold { "threshold" } else { "single" };
        let scheme = if p256 { "p256" } else { "ed25519" };
        let engine = match (threshold, p256) {
            (false, _) => "single",
            (true, false) => "frost",
            (true, true) => "dkls23",
        };
        let ledger = start_ledger(d, exe, &format!("{custody}-{scheme}"))?;
        let (mut procs, keygen_s) =
            start_providers(d, &ledger, exe, threshold, p256, most / PROVIDERS)?;
        if threshold {
            tracing::info!(
                "  {} custodial {engine} keys made on the hosts in {keygen_s:.1} s (both providers \
                 at once{})",
                2 * most,
                if p256 {
                    "; one key generation each, then key addition"
                } else {
                    "; distributed key generation"
                }
            );
        }
        // Warm-up, not recorded: every payer pays for one point's time, so that each key's
        // nonce commitments and each node's pool have grown to what the payments draw.
        run_once(d, &mut procs, Route::Same, most, secs)?;
        for &u in users {
            for route in [Route::Same, Route::Cross] {
                let r = run_once(d, &mut procs, route, u, secs)?;
                let rname = if route == Route::Same {
                    "same_provider"
                } else {
                    "cross_provider"
                };
                // The document's rates are for its ECDSA wallets (P-256) and stand beside both.
                let doc = doc_rate(threshold, route);
                let params = json!({
                    "placement": "emulated_hosts", "custody": custody, "scheme": scheme,
                    "engine": engine, "route": rname,
                    "users": u, "payments": r.done, "host_cpu_cores": share, "hosts": hosts,
                    "window_s": secs,
                    "cpu_us_per_payment": {
                        "providers": r.tier_cpu_us[0].round(),
                        "kmn_nodes": r.tier_cpu_us[1].round(),
                        "ledger": r.tier_cpu_us[2].round(),
                    },
                    "busiest_hosts": r.busiest.iter().map(|(h, u)| json!({ "host": h, "share_used": (u * 100.0).round() / 100.0 })).collect::<Vec<_>>(),
                    "kmn_hosts_settled": r.settled,
                    "requests_sent_again": r.retries,
                });
                rec.add(
                    "e2e_payments_per_s",
                    r.per_s,
                    "payments/s",
                    params,
                    doc,
                    None,
                );
                for (name, p) in [("e2e_latency_ms_p50", 0.5), ("e2e_latency_ms_p99", 0.99)] {
                    rec.add(
                        name,
                        percentile(&r.latencies_us, p),
                        "ms",
                        json!({ "placement": "emulated_hosts", "custody": custody, "scheme": scheme,
                                "engine": engine, "route": rname, "users": u }),
                        None,
                        None,
                    );
                }
                let k = (p256, threshold, route == Route::Same);
                let b = best.entry(k).or_insert((0.0, [0.0; 3]));
                if r.per_s > b.0 {
                    *b = (r.per_s, r.tier_cpu_us);
                }
            }
        }
        drop(procs);
        drop(ledger);
    }
    Ok(best)
}

/// The ratios and the document's comparisons, from the best of each kind, for each scheme.
fn report(rec: &mut Recorder, best: &Best, share: f64, hosts: usize) -> Result<()> {
    // What each tier could carry at its hosts' shares, from the CPU it spent per payment: the
    // lowest is the bottleneck the throughput meets. A tier that took no part (the nodes
    // with single keys: under 10 µs per payment) has none.
    let capacity = |cpu: [f64; 3]| {
        let tier_hosts = [PROVIDERS, PROVIDERS * KMN_N, 1];
        let names = ["providers", "kmn_nodes", "ledger"];
        names
            .iter()
            .zip(cpu.iter().zip(tier_hosts))
            .map(|(n, (us, h))| {
                let v = if *us < 10.0 {
                    serde_json::Value::Null
                } else {
                    json!((h as f64 * share * 1e6 / us) as u64)
                };
                (n.to_string(), v)
            })
            .collect::<serde_json::Map<_, _>>()
    };
    for p256 in [false, true] {
        let get = |k: (bool, bool)| -> Result<(f64, [f64; 3])> {
            best.get(&(p256, k.0, k.1))
                .copied()
                .filter(|(rate, _)| *rate > 0.0)
                .ok_or_else(|| anyhow!("no payment was made in one of the runs"))
        };
        let (thr, thr_cpu) = get((true, true))?;
        let (single, single_cpu) = get((false, true))?;
        let (thr_x, _) = get((true, false))?;
        let (scheme, engine, single_key) = if p256 {
            ("p256", "dkls23", "single P-256 keys")
        } else {
            ("ed25519", "frost", "single Ed25519 keys")
        };
        rec.add(
            "threshold_vs_single_e2e_ratio",
            single / thr,
            "ratio",
            json!({
                "placement": "emulated_hosts", "route": "same_provider", "scheme": scheme,
                "engine": engine, "threshold": thr, "single": single,
                "host_cpu_cores": share, "hosts": hosts,
                "threshold_tier_capacity_payments_per_s": capacity(thr_cpu),
                "single_tier_capacity_payments_per_s": capacity(single_cpu),
                "note": "best over user counts; every party on a host of its own; target ≤ 2",
            }),
            None,
            Some(Reference {
                value: single,
                source: format!("custodial payments with {single_key} on the same hosts, same run"),
            }),
        );
        let name = if p256 {
            "ecdsa_e2e_vs_seed_ratio"
        } else {
            "frost_e2e_vs_seed_ratio"
        };
        rec.add(
            name,
            thr / 10.7,
            "ratio",
            json!({"placement": "emulated_hosts", "route": "same_provider", "florin": thr,
                   "engine": engine}),
            seed(10.7, "UC1 threshold throughput; target ≥ 100×"),
            None,
        );
        rec.add(
            name,
            thr_x / 1.2,
            "ratio",
            json!({"placement": "emulated_hosts", "route": "cross_provider", "florin": thr_x,
                   "engine": engine}),
            seed(1.2, "UC2 threshold throughput"),
            None,
        );
    }
    Ok(())
}

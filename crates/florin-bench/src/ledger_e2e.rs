//! End-to-end ledger benchmarks through the node's HTTP API: many concurrent clients submitting
//! real signed transactions (items 3 and 4 of `florin bench ledger`), and the workload mix of
//! Hamilton's Fig. 7 (double spends and large transactions).
//!
//! The node runs in this process exactly as `florin devnet` runs it (axum API, validator threads,
//! the group-committing swap engine over the embedded durable store with fdatasync per batch),
//! on its own Tokio runtime. The load generator is one thread with `clients` keep-alive HTTP/1.1
//! connections, each with one request in flight; requests are encoded before the clock starts.
//! Clients and node share this machine's cores, so the figures include the clients' cost.
//!
//! The node serves the same API twice, on a plain-HTTP listener and on a TLS listener (its
//! certificate from a CA made for the run), through the same server loop `florin devnet` uses;
//! `e2e_tls_vs_plain_ratio` compares the two in interleaved pairs. Connections (and TLS
//! handshakes) are opened before the clock starts: the figures are for kept-alive connections.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use florin_crypto::{LocalSigner, SecretKey, Signature, Signer};
use florin_http::AppState;
use florin_ledger::{Draft, Encumbrance, Mint, Output, SwapStore, Transaction, Utxo};
use florin_node::api::{LedgerTxStatus, SubmitBatchAnswer};
use florin_node::{Authority, AuthorityConfig, Ledger};
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};
use rand::rngs::{OsRng, StdRng};
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Recorder, Reference, Scale};

const HAMILTON: &str = "003_… (Hamilton, NSDI '23) §6";

/// A node serving the API on loopback, with its ledger.
pub(super) struct Node {
    pub(super) addr: SocketAddr,
    /// The same API over TLS.
    pub(super) tls_addr: SocketAddr,
    /// What a client trusts to reach `tls_addr`.
    tls_client: Arc<rustls::ClientConfig>,
    pub(super) ledger: Arc<Ledger>,
    pub(super) issuer: Arc<LocalSigner>,
    pub(super) rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    stop_tls: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    /// Starts a node whose embedded store already holds `preload` as unspent ids.
    pub(super) fn start(preload: &[florin_ledger::CompactTx]) -> Result<Node> {
        let dir = tempfile::tempdir()?;
        let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path().join("ledger")))?;
        for chunk in preload.chunks(100) {
            store.swap(chunk)?;
        }
        let issuer = Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng)));
        let authority = Arc::new(Authority::open(
            AuthorityConfig::devnet(dir.path()),
            Arc::new(LocalSigner::new(SecretKey::generate(&mut OsRng))),
        )?);
        let ledger = Ledger::start(Arc::new(store), issuer.clone());
        let state = AppState {
            authority: Some(authority),
            ledger: Some(ledger.clone()),
            // A load generator from one address: no rate limits.
            limits: florin_http::RateLimits::off(),
            cluster: None,
            custody: None,
        };
        // The node logs as a production node would: JSON lines, one per request, to a file
        // (`--log-format json 2>FILE`). Its threads stay alive for the whole run, so that the
        // CPU they spend can be read per thread (see `node_cpu_ns`).
        let log = std::fs::File::create(dir.path().join("node.log"))?;
        let dispatch = florin_obs::log::json_dispatch(log);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_keep_alive(std::time::Duration::from_secs(24 * 3600))
            .on_thread_start(move || {
                // The guard would restore the process's logging when dropped: it lives as
                // long as the thread.
                std::mem::forget(tracing::dispatcher::set_default(&dispatch));
            })
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let tls_listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let tls_addr = tls_listener.local_addr()?;
        let (ca, _) = florin_http::LocalCa::load_or_create(&dir.path().join("tls"))?;
        let server_tls = ca.server_tls(&florin_http::tls::server_names(tls_addr, &[]))?;
        let tls_client =
            Arc::new(florin_http::ClientTls::from_ca_file(&ca.cert_path())?.rustls_config()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (stop_tls, stopped_tls) = tokio::sync::oneshot::channel::<()>();
        let tls_state = state.clone();
        // A load generator from one address: no per-address connection limits either.
        rt.spawn(async move {
            let options = florin_http::ServeOptions::default().without_per_address_limits();
            let _ = florin_http::serve_with(listener, state, options, async move {
                let _ = stopped.await;
            })
            .await;
        });
        rt.spawn(async move {
            let options =
                florin_http::ServeOptions::with_tls(Some(server_tls)).without_per_address_limits();
            let _ = florin_http::serve_with(tls_listener, tls_state, options, async move {
                let _ = stopped_tls.await;
            })
            .await;
        });
        Ok(Node {
            addr,
            tls_addr,
            tls_client,
            stop_tls: Some(stop_tls),
            ledger,
            issuer,
            rt,
            stop: Some(stop),
            _dir: dir,
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(s) = self.stop_tls.take() {
            let _ = s.send(());
        }
    }
}

/// A workload: encoded transactions in sending order, and what the ledger must decide.
pub(super) struct Workload {
    pub(super) txs: Vec<Vec<u8>>,
    valid: usize,
    double_spends: usize,
    input_ids: usize,
}

/// Builds `n` transfers: `large_pct` % of them 8-in/8-out, the rest 2-in/2-out, and
/// `double_spend_pct` % conflicting with an earlier transfer (same inputs, other outputs, validly
/// signed). Every input is a distinct UTXO owned by its own key, minted on `node` first.
fn workload(
    node: &Node,
    n: usize,
    double_spend_pct: usize,
    large_pct: usize,
    seed: u64,
) -> Result<Workload> {
    let mut mint = |mint: Mint| -> Result<()> {
        let (_, status) = node
            .rt
            .block_on(node.ledger.submit(Transaction::Mint(mint)))?;
        if status != florin_node::TxStatus::Confirmed {
            bail!("benchmark mint not confirmed: {status:?}");
        }
        Ok(())
    };
    signed_workload(
        &*node.issuer,
        &mut mint,
        n,
        double_spend_pct,
        large_pct,
        seed,
    )
}

/// [`workload`] for any ledger: each mint (signed by `issuer`) is handed to `mint`, which
/// returns once the ledger confirmed it.
pub(super) fn signed_workload(
    issuer: &dyn Signer,
    mint: &mut dyn FnMut(Mint) -> Result<()>,
    n: usize,
    double_spend_pct: usize,
    large_pct: usize,
    seed: u64,
) -> Result<Workload> {
    let mint_one = mint;
    let mut rng = StdRng::seed_from_u64(seed);
    let n_ds = n * double_spend_pct / 100;
    let n_orig = n - n_ds;
    let n_large = (n * large_pct / 100).min(n_orig);
    let sizes: Vec<usize> = (0..n_orig)
        .map(|i| if i < n_large { 8 } else { 2 })
        .collect();
    let total_inputs: usize = sizes.iter().sum();
    let keys = parallel_keys(total_inputs);
    let recipient = LocalSigner::new(SecretKey::generate(&mut OsRng)).public_key();
    // Mint every input, 1,000 outputs per mint.
    let mut utxos: Vec<Utxo> = Vec::with_capacity(total_inputs);
    for chunk in keys.chunks(1000) {
        let mut nonce = [0u8; 32];
        rng.fill(&mut nonce);
        let mut mint = Mint {
            expires: florin_ledger::expiry::default_expiry(),
            nonce,
            outputs: chunk
                .iter()
                .map(|k| Output {
                    value: 100,
                    encumbrance: Encumbrance::ed25519(&k.public_key()),
                })
                .collect(),
            issuer_signature: Signature([0; 64]),
        };
        mint.issuer_signature = issuer.sign(&mint.txid())?;
        utxos.extend(mint.output_utxos());
        mint_one(mint)?;
    }
    // Plans: (position, first input, inputs, variant); a double spend sits after its original.
    let mut plans: Vec<(f64, usize, usize, u8)> = Vec::with_capacity(n);
    let mut first = 0;
    for (i, &k) in sizes.iter().enumerate() {
        plans.push((i as f64, first, k, 0));
        first += k;
    }
    let starts: Vec<(usize, usize)> = plans.iter().map(|p| (p.1, p.2)).collect();
    // Each double spend conflicts with a different original (two copies of one conflict would
    // be the same transaction, a replay).
    for j in rand::seq::index::sample(&mut rng, n_orig, n_ds) {
        let at = rng.gen_range(j as f64 + 0.5..n_orig as f64 + 0.5);
        plans.push((at, starts[j].0, starts[j].1, 1));
    }
    plans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let txs = parallel_map(&plans, |&(_, first, k, variant)| {
        let ins = &utxos[first..first + k];
        let signers: Vec<&dyn Signer> = keys[first..first + k]
            .iter()
            .map(|s| s as &dyn Signer)
            .collect();
        let outputs = (0..k)
            .map(|o| Output {
                // The conflicting variant moves value between outputs: another txid.
                value: if variant == 1 && o < 2 {
                    [150, 50][o]
                } else {
                    100
                },
                encumbrance: Encumbrance::ed25519(&recipient),
            })
            .collect();
        Draft::new(ins.to_vec(), outputs)
            .and_then(|d| d.sign(&signers))
            .map(|t| Transaction::Transfer(t).encode())
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    Ok(Workload {
        txs,
        valid: n_orig,
        double_spends: n_ds,
        input_ids: total_inputs
            + plans
                .iter()
                .filter(|p| p.3 == 1)
                .map(|p| p.2)
                .sum::<usize>(),
    })
}

/// How clients submit.
#[derive(Clone, Copy)]
pub(super) enum Api {
    /// One transaction per request (`POST /v1/ledger/transactions`, binary body).
    Single,
    /// `n` transactions per request (`POST /v1/ledger/batch`, length-prefixed frames).
    Batch(usize),
}

impl Api {
    fn describe(self) -> String {
        match self {
            Api::Single => "HTTP/1.1, one transaction per request (binary body)".into(),
            Api::Batch(n) => format!("HTTP/1.1, {n} transactions per request (/v1/ledger/batch)"),
        }
    }

    /// The HTTP requests carrying `txs`, each with how many transactions it holds.
    fn requests(self, txs: &[Vec<u8>]) -> Vec<(Vec<u8>, usize)> {
        let (path, per) = match self {
            Api::Single => ("/v1/ledger/transactions", 1),
            Api::Batch(n) => ("/v1/ledger/batch", n.max(1)),
        };
        txs.chunks(per)
            .map(|group| {
                let body: Vec<u8> = match self {
                    Api::Single => group[0].clone(),
                    Api::Batch(_) => group
                        .iter()
                        .flat_map(|t| (t.len() as u32).to_le_bytes().into_iter().chain(t.iter().copied()))
                        .collect(),
                };
                let mut r = format!(
                    "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .into_bytes();
                r.extend_from_slice(&body);
                (r, group.len())
            })
            .collect()
    }
}

fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Maps `f` over `items` on all cores, keeping the order.
fn parallel_map<T: Sync, U: Send>(items: &[T], f: impl Fn(&T) -> U + Sync) -> Vec<U> {
    let chunk = items.len().div_ceil(cores()).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = items
            .chunks(chunk)
            .map(|c| s.spawn(|| c.iter().map(&f).collect::<Vec<U>>()))
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

fn parallel_keys(n: usize) -> Vec<LocalSigner> {
    parallel_map(&vec![(); n], |_| {
        LocalSigner::new(SecretKey::generate(&mut OsRng))
    })
}

/// What the clients saw.
pub(super) struct Run {
    pub(super) seconds: f64,
    pub(super) latencies_us: Vec<u32>,
    pub(super) confirmed: usize,
    pub(super) state_invalid: usize,
}

/// Where the load generator connects: the plain listener, or the TLS one with what the client
/// trusts.
#[derive(Clone)]
pub(super) enum Target {
    Plain(SocketAddr),
    Tls(SocketAddr, Arc<rustls::ClientConfig>),
}

impl Node {
    fn plain(&self) -> Target {
        Target::Plain(self.addr)
    }

    fn tls(&self) -> Target {
        Target::Tls(self.tls_addr, self.tls_client.clone())
    }
}

/// Sends every request over `clients` connections, one request in flight on each.
fn drive(target: Target, txs: &[Vec<u8>], api: Api, clients: usize) -> Result<Run> {
    drive_until(target, txs, api, clients, None)
}

/// [`drive`], stopping at `until` when given: no request is sent after it (those in flight
/// are answered and counted).
pub(super) fn drive_until(
    target: Target,
    txs: &[Vec<u8>],
    api: Api,
    clients: usize,
    until: Option<Instant>,
) -> Result<Run> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tracing::info!("sending {} transactions: {}", txs.len(), api.describe());
    let requests = Arc::new(api.requests(txs));
    let next = Arc::new(AtomicUsize::new(0));
    rt.block_on(async move {
        let mut plain = Vec::new();
        let mut tls = Vec::new();
        for _ in 0..clients {
            match &target {
                Target::Plain(addr) => {
                    let s = tokio::net::TcpStream::connect(addr).await?;
                    s.set_nodelay(true)?;
                    plain.push(s);
                }
                Target::Tls(addr, config) => {
                    let s = tokio::net::TcpStream::connect(addr).await?;
                    s.set_nodelay(true)?;
                    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                    let s = tokio_rustls::TlsConnector::from(config.clone())
                        .connect(name, s)
                        .await?;
                    tls.push(s);
                }
            }
        }
        let t = Instant::now();
        let mut tasks: Vec<tokio::task::JoinHandle<ClientResult>> = plain
            .into_iter()
            .map(|s| tokio::spawn(client(s, requests.clone(), next.clone(), until)))
            .collect();
        tasks.extend(
            tls.into_iter()
                .map(|s| tokio::spawn(client(s, requests.clone(), next.clone(), until))),
        );
        let mut run = Run {
            seconds: 0.0,
            latencies_us: Vec::with_capacity(txs.len()),
            confirmed: 0,
            state_invalid: 0,
        };
        for task in tasks {
            let (lat, ok, bad) = task.await??;
            run.latencies_us.extend(lat);
            run.confirmed += ok;
            run.state_invalid += bad;
        }
        run.seconds = t.elapsed().as_secs_f64();
        Ok(run)
    })
}

type ClientResult = Result<(Vec<u32>, usize, usize)>;

/// The longest a client waits for one answer.
const ANSWER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

async fn client<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    requests: Arc<Vec<(Vec<u8>, usize)>>,
    next: Arc<AtomicUsize>,
    until: Option<Instant>,
) -> ClientResult {
    let mut lat = Vec::new();
    let (mut ok, mut bad) = (0, 0);
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut tmp = [0u8; 4096];
    loop {
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some((req, count)) = requests.get(i) else {
            break;
        };
        let t = Instant::now();
        buf.clear();
        let exchange = async {
            s.write_all(req).await?;
            let (head, len) = loop {
                let n = s.read(&mut tmp).await?;
                if n == 0 {
                    bail!("the node closed the connection");
                }
                buf.extend_from_slice(&tmp[..n]);
                if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break (p + 4, content_length(&buf[..p])?);
                }
            };
            while buf.len() < head + len {
                let n = s.read(&mut tmp).await?;
                if n == 0 {
                    bail!("the node closed the connection");
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            Ok((head, len))
        };
        // A node that stops answering fails the run instead of holding it for ever.
        let (head, len) = tokio::time::timeout(ANSWER_WAIT, exchange)
            .await
            .map_err(|_| anyhow!("no answer within {ANSWER_WAIT:?}"))??;
        // Every transaction in the request waited this long.
        let us = t.elapsed().as_micros().min(u32::MAX as u128) as u32;
        lat.extend(std::iter::repeat_n(us, *count));
        if !buf.starts_with(b"HTTP/1.1 200") {
            bail!(
                "the node answered {}",
                String::from_utf8_lossy(&buf[..buf.len().min(200)])
            );
        }
        let body = &buf[head..head + len];
        let answers = if *count == 1 && !body.starts_with(b"{\"results\"") {
            vec![serde_json::from_slice::<LedgerTxStatus>(body)?]
        } else {
            serde_json::from_slice::<SubmitBatchAnswer>(body)?.results
        };
        if answers.len() != *count {
            bail!("{} answers for {count} transactions", answers.len());
        }
        for answer in answers {
            match answer.status.as_str() {
                "confirmed" => ok += 1,
                "state_invalid" => bad += 1,
                other => bail!("unexpected status {other}: {:?}", answer.error),
            }
        }
    }
    Ok((lat, ok, bad))
}

fn content_length(head: &[u8]) -> Result<usize> {
    let head = std::str::from_utf8(head)?;
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .ok_or_else(|| anyhow!("response without content-length"))
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub(super) fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

/// Runs items 3 and 4. `sentinel_bound` is `sentinel_tx_per_s_all_cores` from the same run.
pub fn run(
    rec: &mut Recorder,
    scale: Scale,
    preload: &[florin_ledger::CompactTx],
    preloaded: u64,
    sentinel_bound: f64,
) -> Result<()> {
    let quick = scale.tokens <= 2_000;
    let (n, per_point, clients) = if quick {
        (4_000, 1_000, 32)
    } else if scale.full {
        (200_000, 40_000, 256)
    } else {
        (40_000, 10_000, 128)
    };
    let node = Node::start(preload).context("starting the benchmark node")?;
    tracing::info!(
        "node on http://{} with {preloaded} preloaded ids; {clients} clients",
        node.addr
    );

    // 3. End to end, 2-in/2-out, no conflicts: wallets sending one transaction per request,
    // then a payment service provider's gateways forwarding batches.
    let batch = 64;
    for (api, clients) in [
        (Api::Single, clients),
        (Api::Batch(batch), (clients / 8).max(4)),
    ] {
        let w = workload(&node, n, 0, 0, 1)?;
        let r = drive(node.plain(), &w.txs, api, clients)?;
        check(&r, &w)?;
        let tps = w.txs.len() as f64 / r.seconds;
        let mut lat = r.latencies_us;
        lat.sort_unstable();
        let per_request = match api {
            Api::Single => 1,
            Api::Batch(b) => b,
        };
        let params = json!({
            "clients": clients, "tx_per_request": per_request, "api": api.describe(),
            "io": "2-in/2-out", "preloaded": preloaded, "transactions": n, "store": "embedded",
        });
        rec.add(
            "e2e_tx_per_s",
            tps,
            "transactions/s",
            params.clone(),
            Some(Reference {
                value: 1_700_000.0,
                source: format!("{HAMILTON}: whole geo-distributed cluster, 2-in/2-out"),
            }),
            Some(Reference {
                value: sentinel_bound,
                source: "sentinel_tx_per_s_all_cores, same run (validation alone, no clients)"
                    .into(),
            }),
        );
        for (name, p) in [
            ("e2e_latency_ms_p50", 0.50),
            ("e2e_latency_ms_p99", 0.99),
            ("e2e_latency_ms_p999", 0.999),
        ] {
            // Hamilton's 2PC at 1.7 M tx/s: "under 500ms 50% latency", "less than one second
            // 99% tail latency".
            let seed = match name {
                "e2e_latency_ms_p50" => Some(500.0),
                "e2e_latency_ms_p99" => Some(1000.0),
                _ => None,
            }
            .map(|value| Reference {
                value,
                source: format!("{HAMILTON}, Fig. 4: upper bound at peak, geo-distributed"),
            });
            rec.add(name, percentile(&lat, p), "ms", params.clone(), seed, None);
        }
        rec.add(
            "e2e_vs_sentinel_ratio",
            tps / sentinel_bound,
            "ratio",
            json!({ "target": 0.7, "tx_per_request": per_request, "clients": clients }),
            None,
            Some(Reference {
                value: 1.0,
                source: "sentinel_tx_per_s_all_cores, same run".into(),
            }),
        );
    }

    // TLS beside plain HTTP: interleaved pairs (the order alternating), one transaction per
    // request, the same clients; the ratio is the median of the pairs' ratios.
    let (pairs, per_run) = if quick { (5, 1_000) } else { (7, n / 10) };
    let mut ratios = Vec::with_capacity(pairs);
    let (mut plain_tps, mut tls_tps) = (Vec::new(), Vec::new());
    for k in 0..pairs {
        let one = |tls: bool| -> Result<f64> {
            let w = workload(&node, per_run, 0, 0, 50 + 2 * k as u64 + tls as u64)?;
            let target = if tls { node.tls() } else { node.plain() };
            let r = drive(target, &w.txs, Api::Single, clients)?;
            check(&r, &w)?;
            Ok(w.txs.len() as f64 / r.seconds)
        };
        let (p, t) = if k % 2 == 0 {
            let p = one(false)?;
            (p, one(true)?)
        } else {
            let t = one(true)?;
            (one(false)?, t)
        };
        tracing::info!("pair {k}: plain {p:.0} tx/s, TLS {t:.0} tx/s");
        plain_tps.push(p);
        tls_tps.push(t);
        ratios.push(t / p);
    }
    let params = json!({
        "pairs": pairs, "transactions_per_run": per_run, "clients": clients,
        "api": Api::Single.describe(), "io": "2-in/2-out",
        "tls": "TLS 1.3, ECDSA P-256 certificate, rustls (ring); connections opened before the clock",
    });
    rec.add(
        "e2e_tls_tx_per_s",
        median(&mut tls_tps),
        "transactions/s",
        params.clone(),
        None,
        Some(Reference {
            value: median(&mut plain_tps),
            source: "e2e_plain_tx_per_s: the same API over plain HTTP, interleaved, same run"
                .into(),
        }),
    );
    rec.add(
        "e2e_plain_tx_per_s",
        median(&mut plain_tps),
        "transactions/s",
        params.clone(),
        None,
        None,
    );
    rec.add(
        "e2e_tls_vs_plain_ratio",
        median(&mut ratios),
        "ratio",
        json!({ "target": 0.9, "pairs": pairs, "what": "median over interleaved pairs of TLS tx/s / plain tx/s" }),
        None,
        Some(Reference {
            value: 1.0,
            source: "plain HTTP, same run".into(),
        }),
    );

    observability_overhead(rec, &node, quick, clients, batch)?;

    // 4. Hamilton Fig. 7: vary double spends and large transactions, 0-30 %.
    let points = [(0, 0), (10, 0), (20, 0), (30, 0), (0, 10), (0, 20), (0, 30)];
    for (k, (ds, large)) in points.into_iter().enumerate() {
        let w = workload(&node, per_point, ds, large, 100 + k as u64)?;
        let r = drive(
            node.plain(),
            &w.txs,
            Api::Batch(batch),
            (clients / 8).max(4),
        )?;
        check(&r, &w)?;
        rec.add(
            "mix_valid_tx_per_s",
            r.confirmed as f64 / r.seconds,
            "transactions/s",
            json!({
                "double_spend_pct": ds, "large_pct": large, "large_io": "8-in/8-out",
                "clients": (clients / 8).max(4), "tx_per_request": batch, "transactions": per_point,
                "input_ids_per_s": (w.input_ids as f64 / r.seconds).round(),
                "compare": format!("{HAMILTON}, Fig. 7 (a figure, no table): valid throughput falls as either share grows"),
            }),
            None,
            None,
        );
    }
    Ok(())
}

/// The CPU time, in nanoseconds, a `schedstat` file (`/proc/.../schedstat`) says its thread
/// has run.
pub(crate) fn schedstat_ns(p: &std::path::Path) -> Result<u64> {
    let s = std::fs::read_to_string(p)?;
    s.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("unexpected {}", p.display()))
}

/// CPU time spent so far by every thread of this process but the calling one (the load
/// generator runs on the calling thread: what is left is the node's), in nanoseconds, from
/// `/proc/self/task/*/schedstat`. The node's threads do not exit during a run (its runtime keeps
/// idle threads; the ledger's are long-lived), so nothing is lost between two readings.
fn node_cpu_ns() -> Result<u64> {
    let read = schedstat_ns;
    let me = std::fs::read_link("/proc/thread-self")?;
    let me = me
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow!("unexpected /proc/thread-self"))?
        .to_string();
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc/self/task")? {
        let entry = entry?;
        if entry.file_name().to_str() == Some(me.as_str()) {
            continue;
        }
        // A thread that ended between listing and reading adds nothing.
        if let Ok(ns) = read(&entry.path().join("schedstat")) {
            total += ns;
        }
    }
    Ok(total)
}

/// The node's CPU per transaction with request logging (JSON lines to a file) and metrics on,
/// against off (`florin_obs::set_enabled(false)`: the access layer and the counters step
/// aside), as the median of interleaved pairs (the order alternating), one transaction per
/// request and batched: `observability_cpu_overhead_ratio`.
fn observability_overhead(
    rec: &mut Recorder,
    node: &Node,
    quick: bool,
    clients: usize,
    batch: usize,
) -> Result<()> {
    let pairs = if quick { 5 } else { 7 };
    for (api, clients, per_run, target) in [
        (
            Api::Single,
            clients,
            if quick { 1_500 } else { 8_000 },
            1.10,
        ),
        (
            Api::Batch(batch),
            (clients / 8).max(4),
            if quick { 3_000 } else { 20_000 },
            1.05,
        ),
    ] {
        let mut ratios = Vec::with_capacity(pairs);
        let (mut on_us, mut off_us) = (Vec::new(), Vec::new());
        for k in 0..pairs {
            let one = |on: bool| -> Result<f64> {
                let w = workload(node, per_run, 0, 0, 300 + 2 * k as u64 + on as u64)?;
                florin_obs::set_enabled(on);
                let before = node_cpu_ns();
                let r = drive(node.plain(), &w.txs, api, clients);
                let after = node_cpu_ns();
                // On again whatever happened: the rest of the suite measures a node as it runs.
                florin_obs::set_enabled(true);
                check(&r?, &w)?;
                let spent = after?.saturating_sub(before?);
                if spent == 0 {
                    bail!("no CPU time read from /proc/self/task/*/schedstat (needs Linux)");
                }
                Ok(spent as f64 / 1e3 / w.txs.len() as f64)
            };
            let (on, off) = if k % 2 == 0 {
                let on = one(true)?;
                (on, one(false)?)
            } else {
                let off = one(false)?;
                (one(true)?, off)
            };
            tracing::info!(
                "observability pair {k} ({}): on {on:.1} µs/tx, off {off:.1} µs/tx",
                api.describe()
            );
            on_us.push(on);
            off_us.push(off);
            ratios.push(on / off);
        }
        let (lo, hi) = (
            ratios.iter().copied().fold(f64::INFINITY, f64::min),
            ratios.iter().copied().fold(0.0, f64::max),
        );
        let per_request = match api {
            Api::Single => 1,
            Api::Batch(b) => b,
        };
        rec.add(
            "observability_cpu_overhead_ratio",
            median(&mut ratios),
            "ratio",
            json!({
                "api": if per_request == 1 { "single" } else { "batch" },
                "tx_per_request": per_request, "clients": clients, "pairs": pairs,
                "transactions_per_run": per_run, "min": lo, "max": hi,
                "on_cpu_us_per_tx": median(&mut on_us), "off_cpu_us_per_tx": median(&mut off_us),
                "on": "request id, span and one JSON access line per request (to a file), request and ledger metrics",
                "off": "florin_obs::set_enabled(false): the access layer and the counters step aside",
                "cpu": "node threads only (the load generator's thread excluded), /proc/self/task/*/schedstat",
                "target": format!("<= {target}"),
            }),
            None,
            Some(Reference {
                value: 1.0,
                source: "the same node with logging and metrics off, interleaved in the same run"
                    .into(),
            }),
        );
    }
    Ok(())
}

/// Every valid transaction confirmed, every double spend refused: nothing else.
fn check(r: &Run, w: &Workload) -> Result<()> {
    if r.confirmed != w.valid || r.state_invalid != w.double_spends {
        bail!(
            "ledger decided {} confirmed / {} double spends; expected {} / {}",
            r.confirmed,
            r.state_invalid,
            w.valid,
            w.double_spends
        );
    }
    Ok(())
}

//! `florin bench soak`: memory stays flat under a long run (issue #28's `soak_rss_mb`).
//!
//! The single-node embedded engine and a three-replica cluster (one shard group and one
//! coordinator group of three replicas each, every member in this process, on loopback) take
//! millions of one-in, one-out transfers over a fixed set of coins, so the unspent set keeps
//! its size and only the replay-answer state could grow. Every transfer is valid for
//! [`TTL_SECS`] ([`florin_ledger::expiry`]): a store forgets a transfer's txid once its expiry
//! has passed, so the txids remembered stay near the transaction rate times the validity.
//! Each engine runs in a process of its own (this binary again), so one's heap never counts
//! in the other's reading. Resident memory (`VmRSS` of that process: for the cluster, all six
//! replicas together) and the txids remembered are read after 1, 10, 25 and 50 million
//! transactions (`--quick`: 0.5, 2, 4 and 6 million, transfers valid 1 s);
//! `soak_rss_growth_ratio` is the last reading over the one before (target ≤ 1.10: flat
//! within 10 % after warm-up). Warm-up takes longer than the transfers' validity: the cluster
//! reaches its steady memory after about 15 million transactions here (its replicas' first
//! snapshots, the Raft log they keep, the allocator's arenas), hence the reading at 25 million.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use florin_crypto::hash;
use florin_ledger::expiry::unix_now;
use florin_ledger::{CompactTx, SwapOutcome, SwapStore, TxKind};
use florin_node::cluster::LocalCluster;
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};
use serde_json::json;

use super::Recorder;

/// How long each soak transfer is valid (`--quick`: 1 s).
pub const TTL_SECS: u64 = 5;
const CLIENTS: u64 = 8;
const BATCH: u64 = 2000;

/// The id of coin `slot` after `round` transfers.
fn coin(slot: u64, round: u64) -> [u8; 32] {
    hash(
        "florin/bench/soak/coin",
        &[&slot.to_le_bytes(), &round.to_le_bytes()],
    )
}

/// Resident memory of this process in MiB (`VmRSS`), 0 where `/proc` is missing.
fn rss_mib() -> f64 {
    rss_mib_of(None)
}

/// Resident memory (`VmRSS`, MiB) of process `pid` (this one when `None`), 0 where it cannot
/// be read.
pub(super) fn rss_mib_of(pid: Option<u32>) -> f64 {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// One reading: (transactions so far, RSS MiB, txids remembered).
type Reading = (u64, f64, u64);

/// Mints one coin per slot, then runs `CLIENTS` threads, each moving its own slots' coins
/// round after round, until `marks`' last count; at each mark, `read` gives the resident
/// memory and the txids remembered to keep.
pub(super) fn soak(
    store: &dyn SwapStore,
    slots: u64,
    marks: &[u64],
    ttl: u64,
    read: &(dyn Fn(u64) -> (f64, u64) + Sync),
) -> Result<(Vec<Reading>, f64)> {
    let expires = || unix_now() + ttl;
    for chunk in (0..slots).collect::<Vec<_>>().chunks(BATCH as usize) {
        let mints: Vec<CompactTx> = chunk
            .iter()
            .map(|&s| CompactTx {
                txid: hash("florin/bench/soak/mint", &[&s.to_le_bytes()]),
                kind: TxKind::Mint,
                inputs: vec![],
                outputs: vec![(coin(s, 0), 1)],
                expires: expires(),
            })
            .collect();
        if store
            .swap(&mints)?
            .iter()
            .any(|o| *o != SwapOutcome::Confirmed)
        {
            bail!("a soak mint was refused");
        }
    }
    let total = *marks.last().unwrap_or(&0);
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failed: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    let mut readings = Vec::new();
    let t = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (done, stop, failed) = (&done, &stop, &failed);
            s.spawn(move || {
                let mine: Vec<u64> = (c..slots).step_by(CLIENTS as usize).collect();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for b in mine.chunks(BATCH as usize) {
                        let e = expires();
                        let txs: Vec<CompactTx> = b
                            .iter()
                            .map(|&slot| CompactTx {
                                txid: hash(
                                    "florin/bench/soak/tx",
                                    &[&slot.to_le_bytes(), &round.to_le_bytes()],
                                ),
                                kind: TxKind::Transfer,
                                inputs: vec![coin(slot, round)],
                                outputs: vec![(coin(slot, round + 1), 1)],
                                expires: e,
                            })
                            .collect();
                        let outcome = store.swap(&txs);
                        match outcome {
                            Ok(o) if o.iter().all(|o| *o == SwapOutcome::Confirmed) => {}
                            Ok(o) => {
                                let bad = o.iter().find(|o| **o != SwapOutcome::Confirmed);
                                *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(anyhow::anyhow!("a soak transfer was answered {bad:?}"));
                                stop.store(true, Ordering::Relaxed);
                                return;
                            }
                            Err(e) => {
                                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.into());
                                stop.store(true, Ordering::Relaxed);
                                return;
                            }
                        }
                        done.fetch_add(b.len() as u64, Ordering::Relaxed);
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                    }
                    round += 1;
                }
            });
        }
        // The monitor: a reading as each mark is passed.
        let mut next = 0;
        while next < marks.len() && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            let n = done.load(Ordering::Relaxed);
            if n >= marks[next] {
                let (rss, remembered) = read(n);
                readings.push((n, rss, remembered));
                tracing::info!(
                    "soak: {n} transactions, {rss:.0} MiB resident, {remembered} txids remembered ({:.0} tx/s)",
                    n as f64 / t.elapsed().as_secs_f64()
                );
                next += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let rate = total as f64 / t.elapsed().as_secs_f64();
    Ok((readings, rate))
}

fn report(rec: &mut Recorder, engine: &str, slots: u64, ttl: u64, readings: &[Reading], rate: f64) {
    for (n, rss, remembered) in readings {
        let p = json!({
            "engine": engine, "after_tx": n, "coins": slots, "ttl_s": ttl,
        });
        rec.add("soak_rss_mb", *rss, "MiB", p.clone(), None, None);
        rec.add(
            "soak_remembered_txids",
            *remembered as f64,
            "txids",
            p,
            None,
            None,
        );
    }
    if let [.., (n1, mid, _), (n2, last, _)] = readings {
        rec.add(
            "soak_rss_growth_ratio",
            last / mid.max(1.0),
            "ratio",
            json!({ "engine": engine, "from_tx": n1, "to_tx": n2, "target": "<= 1.10" }),
            None,
            None,
        );
    }
    rec.add(
        "soak_tx_per_s",
        rate,
        "transactions/s",
        json!({ "engine": engine }),
        None,
        None,
    );
}

/// The readings (transaction counts), coins and validity of a run: `--quick` or the default,
/// or the readings in `FLORIN_SOAK_MARKS`.
pub(super) fn shape(quick: bool) -> Result<(Vec<u64>, u64, u64)> {
    let (mut marks, slots, ttl): (Vec<u64>, u64, u64) = if quick {
        (vec![500_000, 2_000_000, 4_000_000, 6_000_000], 100_000, 1)
    } else {
        (
            vec![1_000_000, 10_000_000, 25_000_000, 50_000_000],
            1_000_000,
            TTL_SECS,
        )
    };
    // Other readings, for a closer look at where memory goes (e.g. `5000000,10000000,...`).
    if let Ok(m) = std::env::var("FLORIN_SOAK_MARKS") {
        marks = m.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        if marks.len() < 2 {
            bail!("FLORIN_SOAK_MARKS needs at least two counts");
        }
    }
    Ok((marks, slots, ttl))
}

/// The engines, each run in its own process.
const ENGINES: [&str; 2] = ["embedded", "cluster"];

/// Runs the suite: each engine in a child process (`--soak-engine`), whose results are
/// recorded here; or, in such a child, the one engine.
pub fn run(
    rec: &mut Recorder,
    quick: bool,
    engine: Option<&str>,
    emulate_hosts: bool,
) -> Result<()> {
    if emulate_hosts {
        return super::cluster_hosts::soak_on_hosts(rec, quick);
    }
    let Some(engine) = engine else {
        for e in ENGINES {
            let mut cmd = std::process::Command::new(std::env::current_exe()?);
            cmd.args(["bench", "soak", "--json", "--soak-engine", e]);
            if quick {
                cmd.arg("--quick");
            }
            let out = cmd.stderr(std::process::Stdio::inherit()).output()?;
            if !out.status.success() {
                bail!("the {e} soak failed ({})", out.status);
            }
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
            for r in v["results"].as_array().into_iter().flatten() {
                rec.add(
                    r["name"].as_str().unwrap_or("?"),
                    r["value"].as_f64().unwrap_or(f64::NAN),
                    r["unit"].as_str().unwrap_or(""),
                    r["params"].clone(),
                    None,
                    None,
                );
            }
        }
        return Ok(());
    };
    let (marks, slots, ttl) = shape(quick)?;
    tracing::info!(
        "soak ({engine}): {slots} coins moved by one-in, one-out transfers valid {ttl} s, {CLIENTS} clients, batches of {BATCH}; readings after {marks:?} transactions"
    );
    match engine {
        "embedded" => {
            let dir = tempfile::tempdir()?;
            let store = EmbeddedStore::open(EmbeddedConfig::new(dir.path()))?;
            let read = |_| (rss_mib(), store.remembered().map_or(0, |(n, _)| n as u64));
            let (readings, rate) = soak(&store, slots, &marks, ttl, &read)?;
            report(rec, "embedded", slots, ttl, &readings, rate);
        }
        "cluster" => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()?;
            let dir = tempfile::tempdir()?;
            // Raft's default options, as `florin cluster up` runs.
            let cluster = rt.block_on(LocalCluster::start_with(
                dir.path(),
                1,
                1,
                3,
                florin_cluster::raft::RaftOptions::default(),
                8192,
                true,
            ))?;
            rt.block_on(cluster.wait_for_leaders(Duration::from_secs(20)))?;
            let store = cluster.store()?;
            // The most any replica of the shard remembers.
            let read = |_| (rss_mib(), cluster.remembered());
            let (readings, rate) = soak(&store, slots, &marks, ttl, &read)?;
            report(
                rec,
                "cluster 1 shard × 3 replicas",
                slots,
                ttl,
                &readings,
                rate,
            );
            drop(store);
            rt.block_on(cluster.stop());
        }
        other => bail!("no soak engine {other:?} (embedded, cluster)"),
    }
    Ok(())
}

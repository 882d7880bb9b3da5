//! `florin bench cluster`: the sharded, Raft-replicated engine on loopback (Hamilton §6,
//! Fig. 4 and Fig. 5, scaled to one machine): swap throughput and batch latency versus shard
//! count at replication 1 and 3, the single-node embedded engine on the same workload in the
//! same run as the reference, and a failover run (shard and coordinator leaders killed under
//! load: throughput over time, time to recover, acknowledged transactions lost, double spends
//! accepted).
//!
//! Every member runs in this process (one Raft replica per member, each with its own disk
//! directory and sockets), so all replicas share this machine's cores: replication 3 does
//! three times the shard work on the same CPUs. So that runs on machines of different sizes
//! can be compared, every throughput comes with the CPU time the whole process spent per
//! transaction (`*_cpu_us_per_tx`), and the one-shard, three-replica cluster is also measured
//! with one-phase commit off (every transaction through two-phase commit). The target ratio
//! (`cluster_r3_vs_single_ratio`) is the median of pairs of fresh runs, single node then
//! cluster, not one pass of each.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use florin_cluster::raft::RaftOptions;
use florin_ledger::{CompactTx, SwapOutcome, SwapStore};
use florin_node::cluster::{ClusterStore, LocalCluster, Role};
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};
use serde_json::json;

use super::ledger::{preload_txs, workload};
use super::process_cpu_s;
use super::{Recorder, Reference, Scale};

const HAMILTON: &str = "003_… (Hamilton, NSDI '23) §6";
const CLIENTS: usize = 16;
const BATCH: usize = 2000;

/// The `p` quantile (0–1) of `v` (sorted in place; 0 when empty).
pub(super) fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One measured run: throughput, batch latencies (ms) and CPU µs per transaction.
struct Run {
    rate: f64,
    latencies: Vec<f64>,
    cpu_us_per_tx: Option<f64>,
}

/// Runs `work` in batches of [`BATCH`] from [`CLIENTS`] threads.
fn drive(store: &dyn SwapStore, work: &[CompactTx]) -> Result<Run> {
    let cpu0 = process_cpu_s();
    let (rate, latencies) = drive_clients(store, work)?;
    let cpu_us_per_tx = cpu0
        .zip(process_cpu_s())
        .map(|(a, b)| (b - a) * 1e6 / work.len() as f64);
    Ok(Run {
        rate,
        latencies,
        cpu_us_per_tx,
    })
}

fn drive_clients(store: &dyn SwapStore, work: &[CompactTx]) -> Result<(f64, Vec<f64>)> {
    let chunks: Vec<&[CompactTx]> = work.chunks(work.len().div_ceil(CLIENTS)).collect();
    let lat = Mutex::new(Vec::new());
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = chunks
            .iter()
            .map(|c| {
                let lat = &lat;
                s.spawn(move || -> Result<()> {
                    for b in c.chunks(BATCH) {
                        let t = Instant::now();
                        let out = store.swap(b)?;
                        if out.iter().any(|o| *o != SwapOutcome::Confirmed) {
                            bail!("a benchmark transaction was refused");
                        }
                        if let Ok(mut l) = lat.lock() {
                            l.push(t.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        }
        Ok(())
    })?;
    let rate = work.len() as f64 / t.elapsed().as_secs_f64();
    Ok((rate, lat.into_inner().unwrap_or_default()))
}

pub(super) fn raft() -> RaftOptions {
    RaftOptions {
        heartbeat_ms: 100,
        election_min_ms: 500,
        election_max_ms: 1000,
        snapshot_every: 200,
        keep_logs: 100,
        ..RaftOptions::default()
    }
}

fn rt() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?)
}

fn start(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    shards: usize,
    replicas: usize,
    one_phase: bool,
) -> Result<LocalCluster> {
    let c = rt.block_on(LocalCluster::start_with(
        dir,
        shards,
        1,
        replicas,
        raft(),
        8192,
        one_phase,
    ))?;
    rt.block_on(c.wait_for_leaders(Duration::from_secs(20)))?;
    Ok(c)
}

fn preload(store: &dyn SwapStore, pre: &[CompactTx]) -> Result<()> {
    for chunk in pre.chunks(20) {
        store.swap(chunk)?;
    }
    Ok(())
}

/// Runs the suite.
pub fn run(rec: &mut Recorder, scale: Scale) -> Result<()> {
    let quick = scale.tokens <= 2_000;
    let n_tx: u64 = if quick {
        64_000
    } else if scale.full {
        400_000
    } else {
        160_000
    };
    let pre = preload_txs(2 * n_tx);
    let work = workload(n_tx, 0);
    tracing::info!(
        "workload: {n_tx} 2-in/2-out transfers over {} preloaded ids, {CLIENTS} clients, batches of {BATCH}",
        2 * n_tx
    );

    // The reference: the single-node embedded engine, same workload, same clients.
    let dir = tempfile::tempdir()?;
    let single_run = {
        let emb = EmbeddedStore::open(EmbeddedConfig::new(dir.path()))?;
        preload(&emb, &pre)?;
        drive(&emb, &work)?
    };
    let single = single_run.rate;
    rec.add(
        "single_node_tx_per_s",
        single,
        "transactions/s",
        json!({ "store": "embedded", "clients": CLIENTS, "batch": BATCH }),
        None,
        None,
    );
    if let Some(cpu) = single_run.cpu_us_per_tx {
        rec.add(
            "single_node_cpu_us_per_tx",
            cpu,
            "µs",
            json!({ "store": "embedded", "what": "process CPU time (user + system) per transaction" }),
            None,
            None,
        );
    }

    let rt = rt()?;
    let shard_counts: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4] };
    let mut r3_one = None;
    // (replicas, shards, one-phase commit): the usual grid, then the one-shard, three-replica
    // cluster again with every transaction through two-phase commit.
    let mut grid: Vec<(usize, usize, bool)> = Vec::new();
    for replicas in [1usize, 3] {
        grid.extend(shard_counts.iter().map(|&s| (replicas, s, true)));
    }
    grid.push((3, 1, false));
    for (replicas, shards, one_phase) in grid {
        {
            let dir = tempfile::tempdir()?;
            let cluster = start(&rt, dir.path(), shards, replicas, one_phase)?;
            let store = cluster.store()?;
            preload(&store, &pre)?;
            let Run {
                rate,
                latencies: mut lat,
                cpu_us_per_tx,
            } = drive(&store, &work)?;
            let commit = if one_phase {
                "one-phase where a transaction lies on one shard"
            } else {
                "two-phase for every transaction"
            };
            let params = json!({ "shards": shards, "replicas": replicas, "coordinators": 1, "clients": CLIENTS, "batch": BATCH, "commit": commit });
            if let Some(cpu) = cpu_us_per_tx {
                rec.add(
                    "cluster_cpu_us_per_tx",
                    cpu,
                    "µs",
                    params.clone(),
                    None,
                    single_run.cpu_us_per_tx.map(|v| Reference {
                        value: v,
                        source: "single-node embedded engine, same workload, same run".into(),
                    }),
                );
            }
            rec.add(
                "cluster_tx_per_s",
                rate,
                "transactions/s",
                params.clone(),
                Some(Reference {
                    value: 1_700_000.0,
                    source: format!("{HAMILTON} Fig. 4: peak, 2PC, many shards on many machines"),
                }),
                Some(Reference {
                    value: single,
                    source: "single-node embedded engine, same workload, same run".into(),
                }),
            );
            let p50 = percentile(&mut lat, 0.5);
            let p99 = percentile(&mut lat, 0.99);
            rec.add(
                "cluster_batch_latency_ms",
                p50,
                "ms",
                json!({ "shards": shards, "replicas": replicas, "percentile": 50, "batch": BATCH, "commit": commit }),
                Some(Reference {
                    value: 500.0,
                    source: format!("{HAMILTON} Fig. 4: p50 under 500 ms per transaction at peak"),
                }),
                None,
            );
            rec.add(
                "cluster_batch_latency_ms",
                p99,
                "ms",
                json!({ "shards": shards, "replicas": replicas, "percentile": 99, "batch": BATCH, "commit": commit }),
                Some(Reference {
                    value: 1000.0,
                    source: format!("{HAMILTON} Fig. 4: p99 under 1 s per transaction at peak"),
                }),
                None,
            );
            if replicas == 3 && shards == 1 && one_phase {
                r3_one = Some(rate);
            }
            drop(store);
            rt.block_on(cluster.stop());
        }
    }
    if let Some(r) = r3_one {
        tracing::info!(
            "one pass: shards=1 replicas=3 at {:.2} of the single-node engine (the target \
             ratio is measured next, in pairs)",
            r / single
        );
    }
    let pairs = if quick {
        2
    } else if scale.full {
        7
    } else {
        5
    };
    paired_ratio(rec, &rt, pairs, n_tx)?;
    failover(rec, &rt, quick)
}

/// The median of `v` (0 when empty).
pub(super) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `cluster_r3_vs_single_ratio`, the target: `pairs` pairs of runs, each a fresh single-node
/// engine and a fresh one-shard, three-replica cluster (which goes first alternates), both
/// preloaded alike and given the same workload; the ratio of each pair is taken and the median reported. Single runs of a
/// fraction of a second on a shared machine drift by tens of percent; pairing puts both sides
/// of a ratio in the same conditions. Nothing of one side runs during the other (a cluster
/// left idle still sends heartbeats and takes snapshots).
fn paired_ratio(
    rec: &mut Recorder,
    rt: &tokio::runtime::Runtime,
    pairs: u64,
    seg: u64,
) -> Result<()> {
    let pre = preload_txs(2 * seg);
    let work = workload(seg, 0);
    let (mut singles, mut clusters, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let single_run = || -> Result<f64> {
        let dir = tempfile::tempdir()?;
        let emb = EmbeddedStore::open(EmbeddedConfig::new(dir.path()))?;
        preload(&emb, &pre)?;
        Ok(drive(&emb, &work)?.rate)
    };
    let cluster_run = || -> Result<f64> {
        let dir = tempfile::tempdir()?;
        let cluster = start(rt, dir.path(), 1, 3, true)?;
        let store = cluster.store()?;
        preload(&store, &pre)?;
        let rate = drive(&store, &work);
        drop(store);
        rt.block_on(cluster.stop());
        Ok(rate?.rate)
    };
    for k in 0..pairs {
        // Which side runs first alternates, so that an order effect does not always favour
        // the same side.
        let (s, c) = if k % 2 == 0 {
            let s = single_run()?;
            (s, cluster_run()?)
        } else {
            let c = cluster_run()?;
            (single_run()?, c)
        };
        tracing::info!(
            "  pair {}: single {:.0}/s, cluster {:.0}/s, ratio {:.3}",
            k + 1,
            s,
            c,
            c / s
        );
        singles.push(s);
        clusters.push(c);
        ratios.push(c / s);
    }
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(0.0, f64::max);
    rec.add(
        "cluster_r3_vs_single_ratio",
        median(&ratios),
        "ratio",
        json!({
            "shards": 1, "replicas": 3, "target": 0.5, "pairs": pairs,
            "transactions_per_run": seg, "min": lo, "max": hi,
            "single_tx_per_s_median": median(&singles),
            "cluster_tx_per_s_median": median(&clusters),
            "how": "median over pairs of runs (a fresh single-node engine and a fresh cluster, alternately first) on the same workload",
        }),
        None,
        Some(Reference {
            value: 1.0,
            source: "single-node embedded engine, same workload, same run".into(),
        }),
    );
    Ok(())
}

/// The highest applied log index among a group's running members (its leader's, near enough).
fn group_applied(cluster: &LocalCluster, role: Role, g: u16) -> u64 {
    cluster
        .statuses()
        .into_iter()
        .filter(|(r, grp, _)| *r == role && *grp == g)
        .filter_map(|(_, _, st)| st.last_applied)
        .max()
        .unwrap_or(0)
}

/// One member's applied log index (0 while it has applied nothing or is not running).
fn member_applied(cluster: &LocalCluster, role: Role, g: u16, id: u64) -> u64 {
    cluster
        .statuses()
        .into_iter()
        .find(|(r, grp, st)| *r == role && *grp == g && st.id == id)
        .and_then(|(_, _, st)| st.last_applied)
        .unwrap_or(0)
}

/// Steady load on 2 shards × 3 replicas; the leaders of shard 0 and of the coordinator group
/// are killed mid-run.
fn failover(rec: &mut Recorder, rt: &tokio::runtime::Runtime, quick: bool) -> Result<()> {
    // Load for `secs`; the leaders die at a quarter of it and come back 40 % of it later,
    // which leaves a third for the restarted members to catch up under load.
    let secs = if quick { 8 } else { 15 };
    let kill_at = Duration::from_secs(secs) / 4;
    let dir = tempfile::tempdir()?;
    let mut cluster = start(rt, dir.path(), 2, 3, true)?;
    let store: Arc<ClusterStore> = Arc::new(cluster.store()?);
    // Ids for more than the whole run at the rate this machine reaches (≈ 100 K/s, 2 ids
    // per transaction); should they run out all the same, the run is measured up to there.
    let n_ids: u64 = if quick { 2_000_000 } else { 3_600_000 };
    preload(store.as_ref(), &preload_txs(n_ids))?;
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let began = Instant::now();
    let commits = Arc::new(Mutex::new(Vec::<(f64, usize)>::new()));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let double_spends = Arc::new(AtomicU64::new(0));
    // When the first client found no ids left (µs since `began`; 0: never).
    let ran_out = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (store, stop, next, commits, acked, ds, ran_out) = (
            store.clone(),
            stop.clone(),
            next.clone(),
            commits.clone(),
            acked.clone(),
            double_spends.clone(),
            ran_out.clone(),
        );
        clients.push(std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let k = next.fetch_add(500, Ordering::Relaxed);
                if 2 * (k + 500) > n_ids {
                    let at = began.elapsed().as_micros().max(1) as u64;
                    let _ = ran_out.compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
                    break;
                }
                let mut txs = workload(500, k);
                // A conflicting spend of the batch's first inputs: it must never commit too.
                let mut evil = txs[0].clone();
                evil.txid[0] ^= 0xff;
                evil.outputs = vec![(evil.txid, 20)];
                txs.push(evil);
                let out = store.swap(&txs)?;
                let t = began.elapsed().as_secs_f64();
                // A batch resubmitted after a leader died is answered "already applied" for
                // what its first submission committed: acknowledged all the same.
                let applied = |o: &SwapOutcome| {
                    matches!(o, SwapOutcome::Confirmed | SwapOutcome::AlreadyApplied)
                };
                let ok = out.iter().filter(|o| applied(o)).count();
                if applied(&out[0]) && applied(&out[500]) {
                    ds.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(mut c) = commits.lock() {
                    c.push((t, ok));
                }
                if let Ok(mut a) = acked.lock() {
                    for (tx, o) in txs.iter().zip(&out) {
                        if applied(o) {
                            a.push(tx.txid);
                        }
                    }
                }
            }
            Ok(())
        }));
    }
    std::thread::sleep(kill_at);
    let shard_leader = cluster.leader(Role::Shard, 0);
    let coord_leader = cluster.leader(Role::Coordinator, 0);
    let killed_at = began.elapsed().as_secs_f64();
    let applied_at_kill = shard_leader.map_or(0, |l| member_applied(&cluster, Role::Shard, 0, l));
    if let Some(l) = shard_leader {
        rt.block_on(cluster.kill(Role::Shard, 0, l));
    }
    if let Some(l) = coord_leader {
        rt.block_on(cluster.kill(Role::Coordinator, 0, l));
    }
    // The killed members come back from their disks a while later, under the same load, and
    // must catch up with their groups (by log, or by snapshot once the leader has compacted
    // past them).
    let down = Duration::from_secs(secs) * 2 / 5;
    std::thread::sleep(down);
    let mut rejoin = None;
    // A failed restart stops the load and the cluster before it is reported.
    let mut failure = None;
    if let Some(l) = shard_leader {
        let target = group_applied(&cluster, Role::Shard, 0);
        let at = began.elapsed().as_secs_f64();
        match rt.block_on(cluster.restart(Role::Shard, 0, l)) {
            Ok(()) => rejoin = Some((l, at, target)),
            Err(e) => failure = Some(e),
        }
    }
    if let (None, Some(l)) = (&failure, coord_leader) {
        if let Err(e) = rt.block_on(cluster.restart(Role::Coordinator, 0, l)) {
            failure = Some(e);
        }
    }
    let end = began + Duration::from_secs(secs);
    let mut caught_up = None;
    while failure.is_none() && Instant::now() < end {
        if let (None, Some((id, at, target))) = (caught_up, rejoin) {
            if member_applied(&cluster, Role::Shard, 0, id) >= target {
                caught_up = Some(began.elapsed().as_secs_f64() - at);
            }
        }
        std::thread::sleep(Duration::from_millis(20).min(end - Instant::now().min(end)));
    }
    stop.store(true, Ordering::Relaxed);
    let joined: Result<Vec<()>> = clients
        .into_iter()
        .map(|c| c.join().map_err(|_| anyhow::anyhow!("client panicked"))?)
        .collect();
    if let Some(e) = failure {
        drop(store);
        rt.block_on(cluster.stop());
        return Err(anyhow::Error::from(e).context("restarting the killed members"));
    }
    joined?;
    // Measured up to the end of the load, or to where the ids ran out.
    let total = match ran_out.load(Ordering::Relaxed) {
        0 => began.elapsed().as_secs_f64(),
        at => {
            let at = at as f64 / 1e6;
            tracing::info!("  the workload's ids ran out at {at:.1} s: measured up to there");
            at
        }
    };
    // Throughput per half second.
    let commits = commits.lock().map(|c| c.clone()).unwrap_or_default();
    let buckets = (total / 0.5).ceil() as usize;
    let mut per = vec![0usize; buckets.max(1)];
    // (Batches that finished after the ids ran out are past the measured span.)
    for (t, n) in commits.iter().filter(|(t, _)| *t <= total) {
        let b = ((t / 0.5) as usize).min(per.len() - 1);
        per[b] += n;
    }
    let rate = |b: usize| per[b] as f64 / 0.5;
    let kill_b = (killed_at / 0.5) as usize;
    let before: f64 = (1..kill_b).map(rate).sum::<f64>() / (kill_b.saturating_sub(1)).max(1) as f64;
    // Recovered: the first half second after the kill at ≥ 50 % of the rate before it (the
    // last window, a partial one, does not count).
    let recovered_b = (kill_b + 1..per.len().saturating_sub(1)).find(|b| rate(*b) >= 0.5 * before);
    // Not recovered within the run: the time measured after the kill, a lower bound (and
    // `recovered: false` says so).
    let recovery_s = match recovered_b {
        Some(b) => (b as f64 * 0.5 - killed_at).max(0.0),
        None => total - killed_at,
    };
    for (b, _) in per.iter().enumerate() {
        rec.add(
            "failover_tx_per_s",
            rate(b),
            "transactions/s",
            json!({ "t_s": b as f64 * 0.5, "window_s": 0.5, "killed_at_s": (killed_at * 10.0).round() / 10.0 }),
            None,
            None,
        );
    }
    let after: f64 = recovered_b
        .map(|r| {
            (r..per.len().saturating_sub(1)).map(rate).sum::<f64>()
                / (per.len().saturating_sub(1 + r)).max(1) as f64
        })
        .unwrap_or(0.0);
    rec.add(
        "failover_before_tx_per_s",
        before,
        "transactions/s",
        json!({ "shards": 2, "replicas": 3 }),
        None,
        None,
    );
    rec.add(
        "failover_after_tx_per_s",
        after,
        "transactions/s",
        json!({ "shards": 2, "replicas": 3 }),
        None,
        None,
    );
    rec.add(
        "failover_recovery_s",
        recovery_s,
        "s",
        json!({ "killed": ["shard 0 leader", "coordinator leader"], "recovered_when": "a 0.5 s window at >= 50 % of the rate before", "recovered": recovered_b.is_some(), "target_s": 5 }),
        Some(Reference {
            value: 15.0,
            source: format!("{HAMILTON} Fig. 5: throughput reduced for under 15 s per failure"),
        }),
        None,
    );
    if let Some((_, at, target)) = rejoin {
        rec.add(
            "failover_rejoin_catch_up_s",
            caught_up.unwrap_or((total - at).max(0.0)),
            "s",
            json!({
                "member": "the killed shard 0 leader, restarted from its disk",
                "down_s": down.as_secs_f64(),
                "entries_behind": target.saturating_sub(applied_at_kill),
                "caught_up": caught_up.is_some(),
                "what": "from the restart under load to applying every entry its group had applied at the restart",
            }),
            None,
            None,
        );
    }
    let acked = acked.lock().map(|a| a.clone()).unwrap_or_default();
    let found = store.confirmed_many(&acked)?;
    let lost = found.iter().filter(|f| !**f).count();
    rec.add(
        "failover_lost_tx",
        lost as f64,
        "transactions",
        json!({ "acknowledged": acked.len() }),
        Some(Reference {
            value: 0.0,
            source: format!("{HAMILTON} Fig. 5: no data loss"),
        }),
        None,
    );
    rec.add(
        "failover_double_spend_accepted",
        double_spends.load(Ordering::Relaxed) as f64,
        "transactions",
        json!({ "conflicting_spends_submitted": commits.len() }),
        None,
        None,
    );
    drop(store);
    rt.block_on(cluster.stop());
    Ok(())
}

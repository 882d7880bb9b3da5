//! `florin bench ledger`: the swap stores side by side on the same workload, and sentinel
//! validation per core and on all cores (Hamilton, `003_…` section 6).
//!
//! Workload: 1,000,000 preloaded unspent ids (`--quick`: 100,000); 2-in/2-out compact
//! transactions spending them; batches of 1,000 per durable commit.

use std::time::Instant;

use anyhow::{Context, Result};
use florin_crypto::{hash, LocalSigner, SecretKey, Signature, Signer};
use florin_ledger::memory::MemoryStore;
use florin_ledger::validate::validate_many;
use florin_ledger::{
    CompactTx, Draft, Encumbrance, Mint, Output, SwapOutcome, SwapStore, Transaction, TxKind, UhsId,
};
use florin_store::embedded::{EmbeddedConfig, EmbeddedStore};
use florin_store::pg::PgStore;
use rand::rngs::OsRng;
use serde_json::json;

use super::{Recorder, Reference, Scale};

const HAMILTON: &str = "003_… (Hamilton, NSDI '23) §6";

fn id(n: u64) -> UhsId {
    hash("florin/bench/id", &[&n.to_le_bytes()])
}

/// Compact mints creating ids `0..n` (1,000 per transaction).
pub(super) fn preload_txs(n: u64) -> Vec<CompactTx> {
    mints(0..n.div_ceil(1000), n)
}

/// The mints of [`preload_txs`] numbered `first..first + count`: ids `1000·first ..`.
pub(super) fn preload_range(first: u64, count: u64) -> Vec<CompactTx> {
    mints(first..first + count, u64::MAX)
}

/// Mint `m` creates ids `1000·m .. min(1000·(m+1), n)`.
fn mints(range: std::ops::Range<u64>, n: u64) -> Vec<CompactTx> {
    range
        .map(|m| CompactTx {
            // Straight into stores, past no edge: valid for ever, as before expiries existed
            // (the soak suite measures expiry).
            expires: u64::MAX,
            txid: hash("florin/bench/mint", &[&m.to_le_bytes()]),
            kind: TxKind::Mint,
            inputs: vec![],
            outputs: (m * 1000..((m + 1) * 1000).min(n))
                .map(|i| (id(i), 10))
                .collect(),
        })
        .collect()
}

/// 2-in/2-out transfers spending preloaded ids pairwise: transaction `k` spends `2k, 2k+1`.
pub(super) fn workload(count: u64, offset: u64) -> Vec<CompactTx> {
    (offset..offset + count)
        .map(|k| CompactTx {
            expires: u64::MAX,
            txid: hash("florin/bench/tx", &[&k.to_le_bytes()]),
            kind: TxKind::Transfer,
            inputs: vec![id(2 * k), id(2 * k + 1)],
            outputs: vec![(id((1 << 40) + 2 * k), 10), (id((1 << 40) + 2 * k + 1), 10)],
        })
        .collect()
}

fn measure(store: &dyn SwapStore, txs: &[CompactTx], batch: usize) -> Result<f64> {
    let t = Instant::now();
    for b in txs.chunks(batch) {
        let out = store.swap(b)?;
        if out.iter().any(|o| *o != SwapOutcome::Confirmed) {
            anyhow::bail!("benchmark transaction unexpectedly refused");
        }
    }
    Ok(txs.len() as f64 / t.elapsed().as_secs_f64())
}

/// Runs the suite.
pub fn run(
    rec: &mut Recorder,
    scale: Scale,
    postgres: Option<&str>,
    postgres_ca: Option<&std::path::Path>,
) -> Result<()> {
    let preload: u64 = if scale.tokens <= 2_000 {
        100_000
    } else {
        1_000_000
    };
    let n_tx: u64 = if scale.tokens <= 2_000 {
        50_000
    } else {
        200_000
    }
    .min(preload / 2);
    let seed_pg = Some(Reference {
        value: 61_000.0,
        source: format!("{HAMILTON}: PostgreSQL 13.8 swap function, 32-vCPU c5a.8xlarge"),
    });
    let pre = preload_txs(preload);
    let work = workload(n_tx, 0);
    tracing::info!("preloaded ids: {preload}; measured transactions per store: {n_tx} (2-in/2-out, batches of 1,000)");

    // In memory.
    let mem = MemoryStore::new();
    mem.swap(&pre)?;
    let r = measure(&mem, &work, 1000)?;
    rec.add(
        "swap_per_s",
        r,
        "transactions/s",
        json!({ "store": "memory", "preloaded": preload }),
        None,
        None,
    );

    // Embedded durable store: fdatasync per batch.
    let dir = tempfile::tempdir()?;
    let emb = EmbeddedStore::open(EmbeddedConfig::new(dir.path()))?;
    for chunk in pre.chunks(100) {
        emb.swap(chunk)?;
    }
    let embedded = measure(&emb, &work, 1000)?;
    rec.add(
        "swap_per_s",
        embedded,
        "transactions/s",
        json!({ "store": "embedded", "preloaded": preload, "sync": "fdatasync per batch" }),
        Some(Reference {
            value: 1_700_000.0,
            source: format!("{HAMILTON}: whole geo-distributed cluster"),
        }),
        None,
    );

    integrity_overhead(rec, &pre, &work, if scale.tokens <= 2_000 { 5 } else { 7 })?;

    // PostgreSQL, the same workload, 4 client threads.
    match postgres {
        None => tracing::info!("PostgreSQL store skipped: pass --postgres URL or set FLORIN_BENCH_PG (scripts/pg-test-server.sh starts one)"),
        Some(url) => {
            let schema = format!("florin_bench_{}", std::process::id());
            let tls = postgres_ca
                .map(florin_store::pg_tls::PgTls::from_ca_file)
                .transpose()?;
            let pg = PgStore::connect_with(url, &schema, 4, tls.as_ref()).context("PostgreSQL")?;
            let ids: Vec<(UhsId, u64)> = pre.iter().flat_map(|t| t.outputs.iter().copied()).collect();
            pg.bulk_load(&ids)?;
            let pg_tx = (n_tx / 20).max(2_000) as usize;
            let chunks: Vec<&[CompactTx]> = work[..pg_tx].chunks(pg_tx.div_ceil(4)).collect();
            let t = Instant::now();
            std::thread::scope(|s| -> Result<()> {
                let hs: Vec<_> = chunks.iter().map(|c| s.spawn(|| measure(&pg, c, 100))).collect();
                for h in hs {
                    h.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
                }
                Ok(())
            })?;
            let r = pg_tx as f64 / t.elapsed().as_secs_f64();
            rec.add("swap_per_s", r, "transactions/s", json!({ "store": "postgres", "preloaded": preload, "clients": 4, "batch": 100 }), seed_pg, None);
            rec.add("embedded_vs_postgres_swap_ratio", embedded / r, "ratio", json!({}),
                Some(Reference { value: 26.0, source: format!("{HAMILTON}: Hamilton cluster vs PostgreSQL") }),
                Some(Reference { value: 1.0, source: "PostgreSQL swap function, same workload, same run".into() }));
            drop(pg);
            if let Ok(mut c) = match &tls {
                Some(t) => postgres::Client::connect(url, t.clone()),
                None => postgres::Client::connect(url, postgres::NoTls),
            } {
                let _ = c.batch_execute(&format!("DROP SCHEMA {schema} CASCADE"));
            }
        }
    }

    let bound = sentinel(rec, if scale.tokens <= 2_000 { 4_000 } else { 20_000 })?;
    drop((mem, emb, dir));
    super::ledger_e2e::run(rec, scale, &pre, preload, bound)
}

/// The embedded store with its integrity checks (sequence-numbered records, the
/// acknowledgement mark) against the same store without them, as the median of `pairs`
/// interleaved pairs of fresh stores on the same workload (which runs first alternates).
fn integrity_overhead(
    rec: &mut Recorder,
    pre: &[CompactTx],
    work: &[CompactTx],
    pairs: usize,
) -> Result<()> {
    let run = |checked: bool| -> Result<f64> {
        let dir = tempfile::tempdir()?;
        let mut cfg = EmbeddedConfig::new(dir.path());
        if !checked {
            cfg.mark_every = None;
        }
        let s = EmbeddedStore::open(cfg)?;
        for chunk in pre.chunks(100) {
            s.swap(chunk)?;
        }
        measure(&s, work, 1000)
    };
    let mut ratios = Vec::with_capacity(pairs);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for i in 0..pairs {
        let (a, b) = if i % 2 == 0 {
            let a = run(true)?;
            (a, run(false)?)
        } else {
            let b = run(false)?;
            (run(true)?, b)
        };
        ratios.push(a / b);
        with.push(a);
        without.push(b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let (lo, hi) = (
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
    let r = median(&mut ratios);
    let (w, wo) = (median(&mut with), median(&mut without));
    tracing::info!("integrity overhead: {pairs} pairs, ratio median {r:.3} (min {lo:.3}, max {hi:.3}); with {w:.0}/s, without {wo:.0}/s");
    rec.add(
        "integrity_overhead_ratio",
        r,
        "ratio",
        json!({ "store": "embedded", "pairs": pairs, "min": lo, "max": hi, "with_per_s": w, "without_per_s": wo, "target": ">= 0.9" }),
        None,
        Some(Reference {
            value: 1.0,
            source: "the embedded store without sequence numbers and acknowledgement mark, same workload, interleaved in the same run".into(),
        }),
    );
    Ok(())
}

/// Sentinel validation of real signed 2-in/2-out transfers, each input owned by its own key.
fn sentinel(rec: &mut Recorder, n: usize) -> Result<f64> {
    let issuer = LocalSigner::new(SecretKey::generate(&mut OsRng));
    let owners: Vec<LocalSigner> = (0..2 * n)
        .map(|_| LocalSigner::new(SecretKey::generate(&mut OsRng)))
        .collect();
    let mint = Mint {
        expires: florin_ledger::expiry::default_expiry(),
        nonce: [7; 32],
        outputs: owners
            .iter()
            .map(|o| Output {
                value: 500,
                encumbrance: Encumbrance::ed25519(&o.public_key()),
            })
            .collect(),
        issuer_signature: Signature([0; 64]),
    };
    let utxos = mint.output_utxos();
    let txs: Vec<Transaction> = (0..n)
        .map(|k| -> Result<Transaction> {
            let (a, b) = (&owners[2 * k], &owners[2 * k + 1]);
            let outputs = vec![
                Output {
                    value: 600,
                    encumbrance: Encumbrance::ed25519(&b.public_key()),
                },
                Output {
                    value: 400,
                    encumbrance: Encumbrance::ed25519(&a.public_key()),
                },
            ];
            let t = Draft::new(vec![utxos[2 * k], utxos[2 * k + 1]], outputs)
                .and_then(|d| d.sign(&[a as &dyn Signer, b]))?;
            Ok(Transaction::Transfer(t))
        })
        .collect::<Result<_>>()?;
    let refs: Vec<&Transaction> = txs.iter().collect();
    let ik = issuer.public_key();
    let batch = 256;
    let run = |threads: usize| -> Result<f64> {
        let chunks: Vec<&[&Transaction]> = refs.chunks(batch).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let t = Instant::now();
        let ok = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let mut good = 0usize;
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(c) = chunks.get(i) else { break };
                            good += validate_many(c, &ik, &mut OsRng)
                                .iter()
                                .filter(|r| r.is_ok())
                                .count();
                        }
                        good
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum::<usize>()
        });
        if ok != refs.len() {
            anyhow::bail!("sentinel rejected {} valid transactions", refs.len() - ok);
        }
        Ok(refs.len() as f64 / t.elapsed().as_secs_f64())
    };
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(1);
    let mut one: Vec<f64> = (0..3).map(|_| run(1)).collect::<Result<_>>()?;
    one.sort_by(|a, b| a.total_cmp(b));
    rec.add(
        "sentinel_tx_per_s_per_core",
        one[1],
        "transactions/s",
        json!({ "threads": 1, "io": "2-in/2-out", "batch": batch }),
        None,
        None,
    );
    let mut all: Vec<f64> = (0..3).map(|_| run(cores)).collect::<Result<_>>()?;
    all.sort_by(|a, b| a.total_cmp(b));
    rec.add(
        "sentinel_tx_per_s_all_cores",
        all[1],
        "transactions/s",
        json!({ "threads": cores, "io": "2-in/2-out", "batch": batch }),
        None,
        None,
    );
    Ok(all[1])
}

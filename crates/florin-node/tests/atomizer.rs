//! The atomizer architecture as real Raft groups on loopback sockets and disks, in one process:
//! its store passes the same suite as every store, and leader kills of the atomizer and of a
//! shard lose no acknowledged transaction, the block log stays one verified chain.
#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_cluster::atomizer::{verify_chain, GENESIS};
use florin_cluster::raft::RaftOptions;
use florin_crypto::PublicKey;
use florin_ledger::store::testing::{mint, run_suite, transfer};
use florin_ledger::{Supply, SwapOutcome, SwapStore};
use florin_node::cluster::rpc::{Peer, Request, Response};
use florin_node::cluster::{LocalCluster, Role};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn fast_raft() -> RaftOptions {
    RaftOptions {
        heartbeat_ms: 50,
        election_min_ms: 300,
        election_max_ms: 600,
        snapshot_every: 50,
        keep_logs: 20,
        ..RaftOptions::default()
    }
}

/// The store suite takes a concrete store.
struct Store(Arc<dyn SwapStore>);

impl SwapStore for Store {
    fn swap_at(
        &self,
        now: u64,
        batch: &[florin_ledger::CompactTx],
    ) -> Result<Vec<SwapOutcome>, florin_ledger::StoreError> {
        self.0.swap_at(now, batch)
    }
    fn is_unspent(&self, id: &florin_ledger::UhsId) -> Result<bool, florin_ledger::StoreError> {
        self.0.is_unspent(id)
    }
    fn is_confirmed(&self, t: &florin_crypto::Digest) -> Result<bool, florin_ledger::StoreError> {
        self.0.is_confirmed(t)
    }
    fn supply(&self) -> Result<Supply, florin_ledger::StoreError> {
        self.0.supply()
    }
}

#[test]
fn an_atomizer_cluster_passes_the_store_suite_and_survives_leader_kills() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let mut cluster = rt
        .block_on(LocalCluster::start_atomizer(dir.path(), 2, 3, fast_raft()))
        .unwrap();
    rt.block_on(cluster.wait_for_leaders(Duration::from_secs(10)))
        .unwrap();
    let open = || Store(cluster.any_store().unwrap());
    run_suite(open, |_| open());

    let store = Arc::new(open());
    let base = store.supply().unwrap();
    let coins: Vec<(u64, u64)> = (0..32).map(|i| (5_000_000 + i, 100)).collect();
    assert_eq!(
        store.swap(&[mint(77, &coins)]).unwrap(),
        vec![SwapOutcome::Confirmed]
    );
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..2u64 {
        let (store, stop, acked) = (store.clone(), stop.clone(), acked.clone());
        workers.push(std::thread::spawn(move || {
            let mut current: Vec<u64> = (0..32)
                .filter(|i| i % 2 == w)
                .map(|i| 5_000_000 + i)
                .collect();
            let mut next_id = 10_000_000 * (w + 1);
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = current
                    .iter()
                    .map(|c| {
                        next_id += 1;
                        (transfer(next_id, &[*c], &[(next_id, 100)]), next_id)
                    })
                    .collect();
                let txs: Vec<_> = batch.iter().map(|(t, _)| t.clone()).collect();
                match store.swap(&txs) {
                    Ok(out) => {
                        for ((tx, new), o) in batch.iter().zip(out) {
                            assert_ne!(o, SwapOutcome::MissingInput, "a coin vanished");
                            acked.lock().unwrap().push(tx.txid);
                            let k = current
                                .iter()
                                .position(|c| tx.inputs[0] == florin_ledger::store::testing::id(*c))
                                .unwrap();
                            current[k] = *new;
                        }
                    }
                    Err(e) => panic!("the cluster gave up on a batch: {e}"),
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(800));
    let before = acked.lock().unwrap().len();
    assert!(before > 0, "no progress before the kills");
    let atomizer = cluster.leader(Role::Atomizer, 0).unwrap();
    let shard = cluster.leader(Role::Shard, 1).unwrap();
    assert!(rt.block_on(cluster.kill(Role::Atomizer, 0, atomizer)));
    assert!(rt.block_on(cluster.kill(Role::Shard, 1, shard)));
    let killed = Instant::now();
    let mut recovered = None;
    while killed.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
        if acked.lock().unwrap().len() > before + 32 {
            recovered = Some(killed.elapsed());
            break;
        }
    }
    let recovered = recovered.expect("no progress after the leaders were killed");
    eprintln!("progress resumed {recovered:?} after the kills");
    rt.block_on(cluster.restart(Role::Atomizer, 0, atomizer))
        .unwrap();
    rt.block_on(cluster.restart(Role::Shard, 1, shard)).unwrap();
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    for t in &acked {
        assert!(store.is_confirmed(t).unwrap(), "an acknowledged tx is lost");
    }
    let books = store.supply().unwrap();
    assert_eq!(
        books.unspent_cents - base.unspent_cents,
        3200,
        "value conserved"
    );
    // The block log, read from a member, is one verified chain holding every acknowledged tx.
    let a = &cluster.spec.atomizer.as_ref().unwrap().members[0];
    let peer = Peer::new(
        a.addr.clone(),
        PublicKey::parse(&a.key).unwrap(),
        cluster.client.clone(),
        Duration::from_secs(5),
    );
    let mut blocks = Vec::new();
    loop {
        let from = blocks.len() as u64 + 1;
        match peer
            .call(&Request::AtomReadBlocks(from, from + 999))
            .unwrap()
        {
            Response::Blocks(b) if !b.is_empty() => blocks.extend(b),
            Response::Blocks(_) => break,
            other => panic!("{other:?}"),
        }
    }
    let summary = verify_chain((0, GENESIS), &blocks).unwrap();
    let ordered: std::collections::HashSet<_> = blocks
        .iter()
        .flat_map(|b| b.txs.iter().map(|t| t.tx.txid))
        .collect();
    assert!(acked.iter().all(|t| ordered.contains(t)));
    eprintln!(
        "{} blocks, {} transactions, {} rejections",
        summary.height, summary.txs, summary.rejected
    );
    rt.block_on(cluster.stop());
}

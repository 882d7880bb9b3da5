//! The sharded engine as real Raft groups on loopback sockets and disks, in one process: it
//! passes the same store suite as every single-node store, and survives leader kills with no
//! acknowledged transaction lost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_cluster::raft::RaftOptions;
use florin_cluster::shard::{Fence, Fenced, Part, ShardCmd};
use florin_crypto::PublicKey;
use florin_ledger::store::testing::{id, mint, run_suite, transfer};
use florin_ledger::{SwapOutcome, SwapStore};
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

#[test]
fn a_replicated_cluster_passes_the_store_suite() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let cluster = rt
        .block_on(LocalCluster::start(dir.path(), 2, 1, 3, fast_raft(), 64))
        .unwrap();
    rt.block_on(cluster.wait_for_leaders(Duration::from_secs(10)))
        .unwrap();
    let store = cluster.store().unwrap();
    // `reopen` hands back a new client: the state lives in the groups, not the client.
    run_suite(|| cluster.store().unwrap(), |_| cluster.store().unwrap());
    // Only coordinators may send two-phase-commit commands: a client key that tries to mint
    // by preparing and committing an output of its own is refused, and nothing changes.
    let shard0 = &cluster.spec.shards[0].members[0];
    let peer = Peer::new(
        shard0.addr.clone(),
        PublicKey::parse(&shard0.key).unwrap(),
        cluster.client.clone(),
        Duration::from_secs(5),
    );
    let forged = ShardCmd::Prepare {
        dtx: 42,
        parts: vec![Part {
            txid: id(77),
            owns_txid: false,
            kind: florin_ledger::TxKind::Mint,
            inputs: Default::default(),
            outputs: [(id(78), 1_000_000)].into_iter().collect(),
        }],
    };
    let forged = Fenced {
        by: Fence {
            group: 0,
            term: u64::MAX,
        },
        cmd: forged,
    };
    match peer.call(&Request::Fenced(forged)).unwrap() {
        Response::Error(e) => assert!(e.contains("only from coordinators"), "{e}"),
        other => panic!("a forged prepare was taken: {other:?}"),
    }
    assert!(!store.is_unspent(&id(78)).unwrap());
    rt.block_on(cluster.stop());
}

#[test]
fn leader_kills_lose_no_acknowledged_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let mut cluster = rt
        .block_on(LocalCluster::start(dir.path(), 2, 1, 3, fast_raft(), 256))
        .unwrap();
    rt.block_on(cluster.wait_for_leaders(Duration::from_secs(10)))
        .unwrap();
    let store = Arc::new(cluster.store().unwrap());
    // 64 coins; each worker moves its coins along chains of transfers.
    let coins: Vec<(u64, u64)> = (0..64).map(|i| (i, 100)).collect();
    assert_eq!(
        store.swap(&[mint(1, &coins)]).unwrap(),
        vec![SwapOutcome::Confirmed]
    );
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..4u64 {
        let (store, stop, acked) = (store.clone(), stop.clone(), acked.clone());
        workers.push(std::thread::spawn(move || {
            // Coins w, w+4, …; each step spends the current id into a fresh one.
            let mut current: Vec<u64> = (0..64).filter(|i| i % 4 == w).collect();
            let mut next_id = 1_000_000 * (w + 1);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = current
                    .iter()
                    .map(|c| {
                        next_id += 1;
                        n += 1;
                        (transfer(next_id, &[*c], &[(next_id, 100)]), next_id)
                    })
                    .collect();
                let txs: Vec<_> = batch.iter().map(|(t, _)| t.clone()).collect();
                match store.swap(&txs) {
                    Ok(out) => {
                        for ((tx, new), o) in batch.iter().zip(out) {
                            assert_ne!(o, SwapOutcome::MissingInput, "a coin vanished");
                            acked.lock().unwrap().push(tx.txid);
                            let old = current.iter().position(|c| tx.inputs[0] == id(*c)).unwrap();
                            current[old] = *new;
                        }
                    }
                    Err(e) => panic!("the cluster gave up on a batch: {e}"),
                }
            }
            n
        }));
    }
    std::thread::sleep(Duration::from_millis(800));
    let before = acked.lock().unwrap().len();
    // Kill the leaders of shard 0 and of the coordinator group.
    let shard_leader = cluster.leader(Role::Shard, 0).unwrap();
    let coord_leader = cluster.leader(Role::Coordinator, 0).unwrap();
    assert!(rt.block_on(cluster.kill(Role::Shard, 0, shard_leader)));
    assert!(rt.block_on(cluster.kill(Role::Coordinator, 0, coord_leader)));
    let killed = Instant::now();
    // Progress resumes within the recovery target.
    let mut recovered = None;
    while killed.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
        if acked.lock().unwrap().len() > before + 64 {
            recovered = Some(killed.elapsed());
            break;
        }
    }
    let recovered = recovered.expect("no progress after the leaders were killed");
    eprintln!("progress resumed {recovered:?} after the kills");
    // The killed members come back from their disks and catch up.
    rt.block_on(cluster.restart(Role::Shard, 0, shard_leader))
        .unwrap();
    rt.block_on(cluster.restart(Role::Coordinator, 0, coord_leader))
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > before);
    for t in &acked {
        assert!(store.is_confirmed(t).unwrap(), "an acknowledged tx is lost");
    }
    let books = store.supply().unwrap();
    assert_eq!(books.unspent_cents, 6400, "value conserved");
    assert_eq!(books.unspent_count, 64);
    // Every replica of every group converges.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = cluster.statuses();
        let mut by_group = std::collections::BTreeMap::new();
        for (r, g, s) in &st {
            by_group
                .entry((*r as u8, *g))
                .or_insert_with(Vec::new)
                .push(s.last_applied);
        }
        if by_group
            .values()
            .all(|v| v.len() == 3 && v.iter().all(|x| *x == v[0]))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas did not converge: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    rt.block_on(cluster.stop());
}

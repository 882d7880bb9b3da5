//! The sharded engine as real Raft groups on loopback sockets and disks, in one process: it
//! passes the same store suite as every single-node store, and survives leader kills with no
//! acknowledged transaction lost.
#![allow(clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

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
            expires: u64::MAX,
        }],
        now: 0,
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
                            if o == SwapOutcome::MissingInput {
                                // What the cluster holds now, for whoever reads the failure.
                                panic!(
                                    "a coin vanished: {:?} answered MissingInput; now confirmed \
                                     {:?}, its input unspent {:?}, its output unspent {:?}",
                                    tx.txid,
                                    store.is_confirmed(&tx.txid),
                                    store.is_unspent(&tx.inputs[0]),
                                    store.is_unspent(&id(*new)),
                                );
                            }
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

/// A coordinator configured with another shard map than the shards' (an operator's mistake in
/// `shard_starts`): the shards refuse the commands whose ids are not theirs before replicating
/// them, the batch is aborted with every lock released, the submitter is told, the operator
/// sees an alert in the coordinator's status, and transactions both maps agree on still commit.
#[test]
fn a_coordinator_with_another_shard_map_corrupts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let rt = rt();
    let mut cluster = rt
        .block_on(LocalCluster::start_with(
            dir.path(),
            2,
            1,
            1,
            fast_raft(),
            64,
            false,
        ))
        .unwrap();
    rt.block_on(cluster.wait_for_leaders(Duration::from_secs(10)))
        .unwrap();
    let mut wrong = cluster.spec.clone();
    wrong.shard_starts = vec![0, 0x4000];
    rt.block_on(cluster.kill(Role::Coordinator, 0, 1));
    rt.block_on(cluster.restart_with(&wrong, Role::Coordinator, 0, 1))
        .unwrap();
    rt.block_on(cluster.wait_for_leaders(Duration::from_secs(10)))
        .unwrap();
    let (right_map, wrong_map) = (cluster.spec.map().unwrap(), wrong.map().unwrap());
    let agree = |x: &[u8; 32]| right_map.shard_of(x) == wrong_map.shard_of(x);
    let store = cluster.store().unwrap();
    // Inputs minted through the coordinator, so each mint's ids must be agreed on.
    let ids: Vec<u64> = (1..10_000).filter(|n| agree(&id(*n))).take(2).collect();
    let foreign = (1..10_000).find(|n| !agree(&id(*n))).unwrap();
    let m = (1..)
        .map(|k| mint(k, &[(ids[0], 5), (ids[1], 5)]))
        .find(|t| agree(&t.txid))
        .unwrap();
    assert_eq!(store.swap(&[m]).unwrap(), vec![SwapOutcome::Confirmed]);
    // A transfer naming an id the coordinator routes to the wrong shard.
    let bad = transfer(50, &[ids[0], foreign], &[(20_000, 10)]);
    let err = store.swap(&[bad]).unwrap_err().to_string();
    assert!(err.contains("shard map differs"), "{err}");
    // A mint of an output the coordinator would place on the wrong shard (where readers by
    // the right map never find it): refused too, nothing written.
    let err = store
        .swap(&[mint(70, &[(foreign, 5)])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("shard map differs"), "{err}");
    // Nothing stays locked or prepared on any shard, and the coordinator raised an alert.
    let status = |role: Role, g: usize| {
        let groups = match role {
            Role::Shard => &cluster.spec.shards,
            _ => &cluster.spec.coordinators,
        };
        let m = &groups[g].members[0];
        let peer = Peer::new(
            m.addr.clone(),
            PublicKey::parse(&m.key).unwrap(),
            cluster.client.clone(),
            Duration::from_secs(5),
        );
        match peer.call(&Request::Status).unwrap() {
            Response::Status(s) => s,
            other => panic!("{other:?}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..2).any(|g| status(Role::Shard, g).load != (0, 0)) {
        assert!(Instant::now() < deadline, "locks were left on a shard");
        std::thread::sleep(Duration::from_millis(50));
    }
    let alerts = status(Role::Coordinator, 0).alerts;
    assert!(alerts.0 >= 1, "{alerts:?}");
    assert!(alerts.1.unwrap().contains("aborted"));
    // The agreed input is still there and spendable.
    let good = (60..)
        .map(|k| transfer(k, &[ids[0], ids[1]], &[(30_000 + k, 10)]))
        .find(|t| agree(&t.txid) && t.outputs.iter().all(|(x, _)| agree(x)))
        .unwrap();
    assert_eq!(store.swap(&[good]).unwrap(), vec![SwapOutcome::Confirmed]);
    drop(store);
    rt.block_on(cluster.stop());
}

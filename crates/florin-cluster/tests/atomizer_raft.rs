//! The atomizer group on real Raft replicas and real disks (an in-memory transport): blocks are
//! sealed through leader crashes, every replica's block log holds the same verified chain, a
//! restarted replica checks the blocks it already holds, one that missed a compacted stretch
//! starts its log after the gap, and a damaged block log refuses to open.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_cluster::atomizer::blocklog::{BlockLog, BlockLogError};
use florin_cluster::atomizer::machine::{AtomCmd, AtomizerConfig};
use florin_cluster::atomizer::replicated::{AtomReply, AtomizerMachine};
use florin_cluster::atomizer::{tx_key, verify_chain, Attestation, Height, GENESIS};
use florin_cluster::raft::{
    NodeId, RaftError, RaftOptions, RaftTransport, Replica, TransportError, TransportFuture,
};
use florin_cluster::shard::{decode, encode};
use florin_ledger::{CompactTx, TxKind};
use tempfile::TempDir;

type R = Replica<AtomizerMachine>;

#[derive(Default)]
struct Net {
    nodes: Mutex<HashMap<NodeId, Arc<R>>>,
    cut: Mutex<HashSet<NodeId>>,
}

struct Transport {
    net: Arc<Net>,
    from: NodeId,
}

impl RaftTransport for Transport {
    fn call(&self, target: NodeId, _addr: &str, request: Vec<u8>) -> TransportFuture {
        let cut = self.net.cut.lock().unwrap();
        let node = if cut.contains(&self.from) || cut.contains(&target) {
            None
        } else {
            self.net.nodes.lock().unwrap().get(&target).cloned()
        };
        Box::pin(async move {
            match node {
                Some(node) => Ok(node.handle_rpc(&request).await),
                None => Err(TransportError::Unreachable { target }),
            }
        })
    }
}

struct Group {
    net: Arc<Net>,
    dir: TempDir,
    members: BTreeMap<NodeId, String>,
    logs: Mutex<HashMap<NodeId, Arc<BlockLog>>>,
}

fn opts() -> RaftOptions {
    RaftOptions {
        heartbeat_ms: 50,
        election_min_ms: 300,
        election_max_ms: 600,
        // Compact often, so a replica that is down long enough gets a snapshot.
        snapshot_every: 8,
        keep_logs: 2,
        ..RaftOptions::default()
    }
}

impl Group {
    fn new() -> Group {
        Group {
            net: Arc::default(),
            dir: TempDir::new().unwrap(),
            members: (1..=3).map(|i| (i, format!("mem://{i}"))).collect(),
            logs: Mutex::default(),
        }
    }

    fn blocks_dir(&self, id: NodeId) -> PathBuf {
        self.dir.path().join(format!("a{id}/blocks"))
    }

    async fn open(&self, id: NodeId) {
        let log = Arc::new(reopen(&self.blocks_dir(id)).await);
        self.logs.lock().unwrap().insert(id, log.clone());
        let r = Replica::open(
            &self.dir.path().join(format!("a{id}/raft")),
            id,
            self.members.clone(),
            AtomizerMachine::new(
                AtomizerConfig::default(),
                florin_cluster::route::ShardMap::even(1).unwrap(),
                log,
            ),
            Arc::new(Transport {
                net: self.net.clone(),
                from: id,
            }),
            opts(),
        )
        .await
        .unwrap();
        self.net.nodes.lock().unwrap().insert(id, Arc::new(r));
    }

    async fn kill(&self, id: NodeId) {
        let r = self.net.nodes.lock().unwrap().remove(&id).unwrap();
        r.shutdown().await.unwrap();
        drop(r);
        self.logs.lock().unwrap().remove(&id);
    }

    async fn leader(&self) -> Arc<R> {
        let start = Instant::now();
        loop {
            let nodes: Vec<Arc<R>> = self.net.nodes.lock().unwrap().values().cloned().collect();
            if let Some(l) = nodes.into_iter().find(|r| r.is_leader()) {
                return l;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One step sealing a block of one mint; returns the height after it.
    async fn step(&self, n: u64) -> Height {
        let start = Instant::now();
        loop {
            let l = self.leader().await;
            let height = l.with_machine(|m| m.state.height());
            let mut txid = [0u8; 32];
            txid[..8].copy_from_slice(&n.to_le_bytes());
            let tx = CompactTx {
                txid,
                kind: TxKind::Mint,
                inputs: vec![],
                outputs: vec![([n as u8; 32], 1)],
                expires: u64::MAX,
            };
            let cmd = AtomCmd::Step {
                attestations: vec![Attestation {
                    key: tx_key(&tx),
                    attempt: n,
                    shard: 0,
                    height,
                    inputs: Default::default(),
                    tx: Some(tx),
                    now: 0,
                }],
                seal: true,
                now: 1_000 + n,
            };
            match l.write(encode(&cmd)).await {
                Ok(b) => match decode::<AtomReply>(&b).unwrap() {
                    AtomReply::Stepped(r) => return r.height,
                    other => panic!("{other:?}"),
                },
                Err(RaftError::NotLeader { .. }) | Err(_) => {
                    assert!(start.elapsed() < Duration::from_secs(20), "no step");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    async fn settled(&self, height: Height) {
        let start = Instant::now();
        loop {
            let nodes: Vec<Arc<R>> = self.net.nodes.lock().unwrap().values().cloned().collect();
            if nodes
                .iter()
                .all(|r| r.with_machine(|m| m.state.height()) == height)
            {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "not settled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Opens a block log, waiting while a stopped replica's tasks still hold it.
async fn reopen(dir: &std::path::Path) -> BlockLog {
    let start = Instant::now();
    loop {
        match BlockLog::open(dir) {
            Ok(l) => return l,
            Err(e) if start.elapsed() < Duration::from_secs(20) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_survive_leader_crashes_and_every_replica_logs_the_same_chain() {
    let g = Group::new();
    for id in 1..=3 {
        g.open(id).await;
    }
    let mut height = 0;
    for n in 1..=6 {
        height = g.step(n).await;
    }
    assert_eq!(height, 6);
    // The leader dies; the group goes on.
    let first = g.leader().await.status().id;
    g.kill(first).await;
    for n in 7..=40 {
        height = g.step(n).await;
    }
    // A follower restarts at once and re-applies what it had: its log is checked, not doubled.
    let other = g.leader().await.status().id;
    let follower = (1..=3).find(|i| *i != first && *i != other).unwrap();
    g.kill(follower).await;
    g.open(follower).await;
    // The first leader comes back after the group compacted its log past what it had: it is
    // sent a snapshot, so its block log starts after the gap.
    g.open(first).await;
    for n in 41..=44 {
        height = g.step(n).await;
    }
    g.settled(height).await;
    let logs = g.logs.lock().unwrap().clone();
    let full = logs[&other].read(1, height).unwrap();
    let summary = verify_chain((0, GENESIS), &full).unwrap();
    assert_eq!((summary.height, summary.txs), (44, 44));
    assert_eq!(logs[&follower].read(1, height).unwrap(), full);
    let failed =
        g.net.nodes.lock().unwrap()[&first].with_machine(|m| m.failed().map(str::to_string));
    assert_eq!(failed, None);
    let (start, last, tip) = logs[&first].span();
    assert_eq!((last, tip), (44, summary.tip));
    assert!(start > 1, "the first leader was sent a snapshot");
    {
        assert!(matches!(
            logs[&first].read(1, 2),
            Err(BlockLogError::Purged { .. })
        ));
        let tail = logs[&first].read(start, height).unwrap();
        let before = &full[(start - 2) as usize];
        verify_chain((before.height, before.hash()), &tail).unwrap();
    }
    drop(logs);
    for id in 1..=3 {
        g.kill(id).await;
    }
    // Reopened, every log holds what it held.
    let reopened = reopen(&g.blocks_dir(other)).await;
    assert_eq!(reopened.read(1, height).unwrap(), full);
    drop(reopened);
    // One damaged byte in the middle: refused, naming the file and offset, nothing changed.
    let seg = std::fs::read_dir(g.blocks_dir(other))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.len() / 3;
    bytes[at] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let e = BlockLog::open(&g.blocks_dir(other))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&seg.display().to_string()) && e.contains("damaged at byte"),
        "{e}"
    );
    assert_eq!(std::fs::read(&seg).unwrap(), bytes, "nothing changed");
}

/// A snapshot made under other atomizer settings (a spec that changed them, or a release whose
/// defaults differ) is refused, and the replica keeps its state: taking it would make the
/// replica seal other blocks from the same steps.
#[test]
fn a_snapshot_under_other_settings_is_refused() {
    use florin_cluster::raft::Machine;
    let dir = TempDir::new().unwrap();
    let map = florin_cluster::route::ShardMap::even(1).unwrap();
    let open = |name: &str| Arc::new(BlockLog::open(&dir.path().join(name)).unwrap());
    let other = AtomizerMachine::new(
        AtomizerConfig {
            window: 64,
            ..AtomizerConfig::default()
        },
        map.clone(),
        open("other"),
    );
    let mut mine = AtomizerMachine::new(AtomizerConfig::default(), map.clone(), open("mine"));
    let err = mine.restore(&other.snapshot()).unwrap_err();
    assert!(err.to_string().contains("differ"), "{err}");
    assert_eq!(mine.state.config(), AtomizerConfig::default());
    // The same settings are taken.
    let same = AtomizerMachine::new(AtomizerConfig::default(), map, open("same"));
    mine.restore(&same.snapshot()).unwrap();
}

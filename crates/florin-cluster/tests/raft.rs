//! Raft replication tests over an in-memory transport.
#![allow(
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_cluster::raft::{
    Machine, NodeId, RaftError, RaftOptions, RaftTransport, Replica, TransportError,
    TransportFuture,
};
use tempfile::TempDir;

/// Appends every command; replies with the number of commands so far.
#[derive(Default, Clone)]
struct Counter {
    cmds: Vec<Vec<u8>>,
}

impl Machine for Counter {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        self.cmds.push(cmd.to_vec());
        (self.cmds.len() as u64).to_le_bytes().to_vec()
    }
    fn snapshot(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.cmds).unwrap()
    }
    type Error = postcard::Error;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), postcard::Error> {
        self.cmds = postcard::from_bytes(snapshot)?;
        Ok(())
    }
}

/// The registry of running replicas, and which nodes are cut off.
#[derive(Default)]
struct Net {
    nodes: Mutex<HashMap<NodeId, Arc<Replica<Counter>>>>,
    cut: Mutex<HashSet<NodeId>>,
}

/// One replica's view of the network.
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

fn opts() -> RaftOptions {
    RaftOptions {
        heartbeat_ms: 50,
        election_min_ms: 300,
        election_max_ms: 600,
        snapshot_every: 1000,
        keep_logs: 500,
        ..RaftOptions::default()
    }
}

struct Cluster {
    net: Arc<Net>,
    dirs: HashMap<NodeId, TempDir>,
    members: BTreeMap<NodeId, String>,
    opts: RaftOptions,
}

impl Cluster {
    fn new(ids: &[NodeId], opts: RaftOptions) -> Self {
        Self {
            net: Arc::default(),
            dirs: ids.iter().map(|&i| (i, TempDir::new().unwrap())).collect(),
            members: ids.iter().map(|&i| (i, format!("mem://{i}"))).collect(),
            opts,
        }
    }

    fn dir(&self, id: NodeId) -> PathBuf {
        self.dirs[&id].path().join("replica")
    }

    async fn open(&self, id: NodeId) -> Arc<Replica<Counter>> {
        let transport = Arc::new(Transport {
            net: self.net.clone(),
            from: id,
        });
        let r = Replica::open(
            &self.dir(id),
            id,
            self.members.clone(),
            Counter::default(),
            transport,
            self.opts.clone(),
        )
        .await
        .unwrap();
        let r = Arc::new(r);
        self.net.nodes.lock().unwrap().insert(id, r.clone());
        r
    }

    /// Opens a replica without putting it on the network; the error if it refuses.
    async fn try_open(&self, id: NodeId) -> Result<Replica<Counter>, RaftError> {
        let transport = Arc::new(Transport {
            net: self.net.clone(),
            from: id,
        });
        Replica::open(
            &self.dir(id),
            id,
            self.members.clone(),
            Counter::default(),
            transport,
            self.opts.clone(),
        )
        .await
    }

    async fn start(&self) -> Vec<Arc<Replica<Counter>>> {
        let mut all = Vec::new();
        for &id in self.members.keys() {
            all.push(self.open(id).await);
        }
        all
    }

    fn node(&self, id: NodeId) -> Arc<Replica<Counter>> {
        self.net.nodes.lock().unwrap()[&id].clone()
    }

    /// Shuts a replica down and removes it from the network.
    async fn stop(&self, id: NodeId) {
        let r = self.net.nodes.lock().unwrap().remove(&id).unwrap();
        r.shutdown().await.unwrap();
    }

    /// Waits for a leader among the reachable running replicas.
    async fn leader(&self) -> Arc<Replica<Counter>> {
        wait_for(|| {
            let cut = self.net.cut.lock().unwrap().clone();
            let nodes: Vec<_> = self.net.nodes.lock().unwrap().values().cloned().collect();
            nodes
                .into_iter()
                .find(|n| n.is_leader() && !cut.contains(&n.id()))
                .ok_or_else(|| "no leader elected".to_string())
        })
        .await
    }
}

/// A leader that still leads, in the same term, after several heartbeats.
async fn stable_leader(cluster: &Cluster) -> Arc<Replica<Counter>> {
    let start = Instant::now();
    loop {
        let leader = cluster.leader().await;
        let term = leader.leader_term();
        tokio::time::sleep(Duration::from_millis(700)).await;
        if leader.is_leader() && leader.leader_term() == term {
            return leader;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no stable leader"
        );
    }
}

fn cmd(i: usize) -> Vec<u8> {
    format!("cmd-{i}").into_bytes()
}

fn cmds(range: std::ops::Range<usize>) -> Vec<Vec<u8>> {
    range.map(cmd).collect()
}

/// Polls `probe` every 20 ms until it answers `Ok`, for at most 10 s: then the test fails
/// with the last `Err`, which says what was not reached.
async fn wait_for<T>(mut probe: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match probe() {
            Ok(t) => return t,
            Err(why) => assert!(start.elapsed() < Duration::from_secs(10), "{why}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_applied(r: &Replica<Counter>, n: usize) {
    wait_for(|| {
        if r.with_machine(|c| c.cmds.len()) < n {
            return Err(format!("replica {} stuck: {:?}", r.id(), r.status()));
        }
        Ok(())
    })
    .await
}

/// Waits until `r`'s status shows a snapshot beyond `index` (openraft's metrics follow an
/// installed machine a moment later).
async fn wait_snapshot(r: &Replica<Counter>, index: u64) {
    wait_for(|| {
        let s = r.status();
        if s.snapshot <= Some(index) {
            return Err(format!("{s:?}"));
        }
        Ok(())
    })
    .await
}

/// Writes commands `range` through the leader, checking each reply.
async fn write_all(leader: &Replica<Counter>, range: std::ops::Range<usize>) {
    for i in range {
        let reply = leader.write(cmd(i)).await.unwrap();
        assert_eq!(reply, (i as u64 + 1).to_le_bytes().to_vec());
    }
}

async fn bounded<F: Future<Output = ()>>(f: F) {
    let start = Instant::now();
    tokio::time::timeout(Duration::from_secs(90), f)
        .await
        .expect("test timed out");
    eprintln!("test body took {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_replicate_and_redirect() {
    bounded(async {
        let cluster = Cluster::new(&[1, 2, 3], opts());
        let all = cluster.start().await;
        let leader = cluster.leader().await;
        write_all(&leader, 0..20).await;
        for r in &all {
            wait_applied(r, 20).await;
            assert_eq!(r.with_machine(|c| c.cmds.clone()), cmds(0..20));
        }
        let follower = all.iter().find(|r| r.id() != leader.id()).unwrap();
        match follower.write(b"nope".to_vec()).await {
            Err(RaftError::NotLeader {
                leader: Some(l),
                addr,
            }) => {
                assert_eq!(l, leader.id());
                assert_eq!(addr, Some(format!("mem://{l}")));
            }
            other => panic!("expected NotLeader, got {other:?}"),
        }
        assert!(matches!(
            follower.read(|c| c.cmds.len()).await,
            Err(RaftError::NotLeader { .. })
        ));
        assert_eq!(leader.read(|c| c.cmds.clone()).await.unwrap(), cmds(0..20));
        let status = leader.status();
        assert_eq!(status.state, "leader");
        assert_eq!(status.leader, Some(leader.id()));
        assert!(status.last_applied >= Some(20));
        assert_eq!(follower.status().state, "follower");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failure_and_catch_up() {
    bounded(async {
        let cluster = Cluster::new(&[1, 2, 3], opts());
        cluster.start().await;
        let old = cluster.leader().await;
        let old_id = old.id();
        write_all(&old, 0..10).await;
        drop(old);

        cluster.stop(old_id).await;
        let t = Instant::now();
        let new = cluster.leader().await;
        eprintln!("new leader {} after {:?}", new.id(), t.elapsed());
        assert_ne!(new.id(), old_id);
        write_all(&new, 10..20).await;

        let back = cluster.open(old_id).await;
        wait_applied(&back, 20).await;
        assert_eq!(back.with_machine(|c| c.cmds.clone()), cmds(0..20));

        // A cut (not stopped) leader is replaced too, and catches up once healed.
        let leader = cluster.leader().await;
        let cut_id = leader.id();
        cluster.net.cut.lock().unwrap().insert(cut_id);
        let other = loop {
            let l = cluster.leader().await;
            if l.id() != cut_id {
                break l;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        write_all(&other, 20..25).await;
        assert!(cluster.node(cut_id).with_machine(|c| c.cmds.len()) < 25);
        cluster.net.cut.lock().unwrap().clear();
        wait_applied(&cluster.node(cut_id), 25).await;
        assert_eq!(
            cluster.node(cut_id).with_machine(|c| c.cmds.clone()),
            cmds(0..25)
        );
    })
    .await;
}

fn snapshot_opts() -> RaftOptions {
    RaftOptions {
        snapshot_every: 20,
        keep_logs: 10,
        ..opts()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_compact_and_install() {
    bounded(async {
        let cluster = Cluster::new(&[1, 2, 3], snapshot_opts());
        let all = cluster.start().await;
        let leader = cluster.leader().await;
        let mut followers = all.iter().map(|r| r.id()).filter(|&i| i != leader.id());
        let (lagging, follower) = (followers.next().unwrap(), followers.next().unwrap());
        drop(all);

        // One follower is cut off while 200 commands are written and the log is compacted.
        cluster.net.cut.lock().unwrap().insert(lagging);
        write_all(&leader, 0..200).await;
        wait_applied(&cluster.node(follower), 200).await;
        // Snapshots and purges run in the background after the writes: wait for them (bounded).
        wait_for(|| {
            let (l, f) = (leader.status(), cluster.node(follower).status());
            if l.snapshot > Some(150) && l.purged > Some(100) && f.purged > Some(100) {
                return Ok(());
            }
            Err(format!(
                "no snapshot or purge: leader {l:?}, follower {f:?}"
            ))
        })
        .await;

        // Reopen the other follower from disk: snapshot + remaining log give exactly all
        // commands, before it hears from the leader.
        cluster.stop(follower).await;
        let t = Instant::now();
        let reopened = cluster.open(follower).await;
        eprintln!("reopen with snapshot took {:?}", t.elapsed());
        assert_eq!(reopened.with_machine(|c| c.cmds.clone()), cmds(0..200));
        assert!(reopened.status().snapshot > Some(150));

        // The lagging follower is healed: the entries it misses are purged, so it is sent the
        // snapshot.
        assert!(cluster.node(lagging).with_machine(|c| c.cmds.len()) < 10);
        cluster.net.cut.lock().unwrap().clear();
        let lag = cluster.node(lagging);
        wait_applied(&lag, 200).await;
        assert_eq!(lag.with_machine(|c| c.cmds.clone()), cmds(0..200));
        // openraft's metrics follow the installed machine a moment later (bounded wait: the
        // run here once read them before the install showed).
        wait_snapshot(&lag, 150).await;

        // The group keeps working, and a forced snapshot covers everything applied.
        let leader = cluster.leader().await;
        write_all(&leader, 200..205).await;
        leader.snapshot_now().await.unwrap();
        let s = leader.status();
        assert!(s.snapshot >= Some(205), "{s:?}");
    })
    .await;
}

/// A replica whose directory was wiped rejoins under the same id and receives the state by
/// snapshot, whichever member it is (the smallest member bootstraps a group on its first start).
/// openraft treats this as follower log reversion, allowed by its `loosen-follower-log-revert`
/// feature.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_replica_rejoins_by_snapshot() {
    bounded(async {
        for wipe_smallest in [false, true] {
            let mut cluster = Cluster::new(&[1, 2, 3], snapshot_opts());
            cluster.start().await;
            let leader = cluster.leader().await;
            write_all(&leader, 0..100).await;
            let wiped = [1, 2, 3]
                .into_iter()
                .find(|&i| i != leader.id() && (i == 1) == wipe_smallest)
                .unwrap_or(if leader.id() == 1 { 2 } else { 1 });
            wait_applied(&cluster.node(wiped), 100).await;
            // Snapshots are taken in the background: wait until the leader has one and has
            // purged the log before it, so the rejoining replica can only get the state by
            // snapshot.
            wait_for(|| {
                let l = leader.status();
                if l.snapshot > Some(50) && l.purged > Some(50) {
                    return Ok(());
                }
                Err(format!("no snapshot or purge: {l:?}"))
            })
            .await;
            cluster.stop(wiped).await;
            cluster.dirs.insert(wiped, TempDir::new().unwrap());
            let fresh = cluster.open(wiped).await;
            wait_applied(&fresh, 100).await;
            assert_eq!(fresh.with_machine(|c| c.cmds.clone()), cmds(0..100));
            // openraft's metrics follow the installed machine a moment later (bounded wait,
            // as in `snapshots_compact_and_install`: a clean-clone run read them before the
            // install showed).
            wait_snapshot(&fresh, 50).await;
            let leader = cluster.leader().await;
            write_all(&leader, 100..105).await;
            wait_applied(&fresh, 105).await;
            assert_eq!(leader.read(|c| c.cmds.clone()).await.unwrap(), cmds(0..105));
        }
    })
    .await;
}

/// A wiped replica does not vote before a leader has sent it the group's state: with the
/// leader down, the wiped replica and the remaining follower cannot elect anyone (the wiped one
/// may have voted in this term before it lost its disk). When the old leader returns, a leader
/// is elected, the wiped replica catches up and then votes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_replica_votes_only_after_catching_up() {
    bounded(async {
        let mut cluster = Cluster::new(&[1, 2, 3], opts());
        cluster.start().await;
        let leader = cluster.leader().await;
        write_all(&leader, 0..30).await;
        let old_leader = leader.id();
        let wiped = [2, 3].into_iter().find(|&i| i != old_leader).unwrap();
        let other = [1, 2, 3]
            .into_iter()
            .find(|&i| i != old_leader && i != wiped)
            .unwrap();
        wait_applied(&cluster.node(wiped), 30).await;
        drop(leader);
        cluster.stop(wiped).await;
        cluster.stop(old_leader).await;
        cluster.dirs.insert(wiped, TempDir::new().unwrap());
        let fresh = cluster.open(wiped).await;

        // Several election timeouts: no leader, and the survivor's log is untouched.
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        let survivor = cluster.node(other);
        assert!(!survivor.is_leader(), "{:?}", survivor.status());
        assert!(!fresh.is_leader(), "{:?}", fresh.status());
        assert_eq!(fresh.with_machine(|c| c.cmds.len()), 0);

        // The old leader returns: a leader is elected, the wiped replica catches up. (The
        // survivor's failed campaigns raised its term, so the first leader may be deposed once.)
        cluster.open(old_leader).await;
        let leader = stable_leader(&cluster).await;
        write_all(&leader, 30..35).await;
        wait_applied(&fresh, 35).await;
        assert_eq!(fresh.with_machine(|c| c.cmds.clone()), cmds(0..35));

        // Caught up, it votes again: without the leader, the other two elect one.
        let l = leader.id();
        drop(leader);
        cluster.stop(l).await;
        let leader = stable_leader(&cluster).await;
        assert_ne!(leader.id(), l);
        write_all(&leader, 35..40).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_member_group_survives_reopen() {
    bounded(async {
        let cluster = Cluster::new(&[7], opts());
        cluster.start().await;
        let leader = cluster.leader().await;
        write_all(&leader, 0..5).await;
        assert_eq!(leader.read(|c| c.cmds.clone()).await.unwrap(), cmds(0..5));
        drop(leader);
        cluster.stop(7).await;

        let r = cluster.open(7).await;
        assert_eq!(r.with_machine(|c| c.cmds.clone()), cmds(0..5));
        let leader = cluster.leader().await;
        write_all(&leader, 5..8).await;
        assert_eq!(leader.read(|c| c.cmds.clone()).await.unwrap(), cmds(0..8));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_rpc_gets_error_answer() {
    bounded(async {
        let cluster = Cluster::new(&[1], opts());
        cluster.start().await;
        let leader = cluster.leader().await;
        for garbage in [
            &b""[..],
            b"\xff\xff\xff\xff\xff\xff",
            b"\x09garbage",
            b"\x00",
            b"\x02\x01",
        ] {
            let answer = leader.handle_rpc(garbage).await;
            let decoded: Result<(), String> = postcard::from_bytes(&answer).unwrap();
            let msg = decoded.unwrap_err();
            assert!(msg.contains("undecodable"), "{msg}");
        }
        write_all(&leader, 0..3).await;
    })
    .await;
}

/// Every file under `dir` (recursively) and its bytes.
fn tree(dir: &std::path::Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(tree(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    out
}

/// `snapshot.bin` changed in each of its regions, cut short, emptied, or deleted while the log
/// is purged past it: the replica refuses to open, names the file, and changes nothing on disk;
/// the file as written opens with every command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_refused_and_left_as_it_was() {
    bounded(async {
        let cluster = Cluster::new(
            &[1],
            RaftOptions {
                snapshot_every: 0,
                keep_logs: 0,
                ..opts()
            },
        );
        cluster.start().await;
        let leader = cluster.leader().await;
        write_all(&leader, 0..20).await;
        leader.snapshot_now().await.unwrap();
        wait_for(|| match leader.status().purged {
            None => Err("never purged".to_string()),
            Some(_) => Ok(()),
        })
        .await;
        write_all(&leader, 20..25).await;
        drop(leader);
        cluster.stop(1).await;

        let dir = cluster.dir(1);
        let path = dir.join("snapshot.bin");
        let good = std::fs::read(&path).unwrap();
        let pristine = tree(&dir);
        let mut damaged: Vec<(String, Option<Vec<u8>>)> = Vec::new();
        let len = good.len();
        // Magic, body length, checksum, head length, head, data (first, middle, last byte).
        for at in [
            0,
            7,
            8,
            15,
            16,
            19,
            20,
            24,
            30,
            len - 40,
            len / 2 + 10,
            len - 1,
        ] {
            let mut b = good.clone();
            b[at] ^= 0x04;
            damaged.push((format!("byte {at} changed"), Some(b)));
        }
        for cut in [0, 4, 12, 20, 30, len - 1] {
            damaged.push((format!("cut to {cut} bytes"), Some(good[..cut].to_vec())));
        }
        let mut longer = good.clone();
        longer.push(0);
        damaged.push(("one byte longer".into(), Some(longer)));
        damaged.push(("deleted".into(), None));
        for (what, bytes) in damaged {
            match &bytes {
                Some(b) => std::fs::write(&path, b).unwrap(),
                None => std::fs::remove_file(&path).unwrap(),
            }
            let before = tree(&dir);
            let Err(e) = cluster.try_open(1).await else {
                panic!("snapshot {what}: opened");
            };
            let RaftError::Storage(msg) = &e else {
                panic!("snapshot {what}: {e}");
            };
            assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
            assert!(msg.contains("at byte"), "{what}: {msg}");
            assert_eq!(tree(&dir), before, "snapshot {what}: the directory changed");
            std::fs::write(&path, &good).unwrap();
        }
        assert_eq!(tree(&dir), pristine);
        let r = cluster.open(1).await;
        assert_eq!(r.with_machine(|c| c.cmds.clone()), cmds(0..25));
    })
    .await;
}

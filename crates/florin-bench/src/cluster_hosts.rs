//! `florin bench cluster --emulate-hosts`: Hamilton's Fig. 4 on emulated machines. Every shard
//! replica, every coordinator replica and every load generator is its own `florin` process on
//! its own emulated host ([`florin_node::hosts`]: a network namespace with its own address, and
//! a CPU quota of the same share for every host), so that adding shards adds machines, as in
//! the paper, instead of more replicas on the same two cores.
//!
//! The engine tier only, as in Hamilton's figure: load generators send compact transactions
//! (2-in/2-out transfers over uniformly random ids) straight to the coordinator groups, with
//! the cluster's own authenticated RPC. Each size scales every tier together: S shard groups,
//! S coordinator groups and S load generators, replication 3. Each size is run with every
//! transaction through two-phase commit (Hamilton's commit path) and again with one-phase
//! commit where a transaction lies on one shard (Florin's shortcut, reported beside it).
//!
//! Each load generator preloads its own ids, says it is ready, and on "go" drives its
//! transactions from several client threads for a fixed time; throughput is the sum of the
//! generators' rates over the same window. CPU time is read per host from `cpuacct`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use florin_cluster::raft::RaftOptions;
use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_ledger::{SwapOutcome, SwapStore};
use florin_node::cluster::atomizer::AtomizerStore;
use florin_node::cluster::deploy::{self, NodeConfig};
use florin_node::cluster::rpc::{Peer, Request, Response};
use florin_node::cluster::{Architecture, ClusterSpec, ClusterStore, GroupSpec, MemberSpec, Role};
use florin_node::hosts::{HostNet, HostNetGuard};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::cluster::{median, percentile};
use super::ledger::{preload_range, workload};
use super::ledger_e2e::{drive_until, signed_workload, Api, Target};
use super::line_child::LineChild;
use super::{Recorder, Reference, Scale};

const HAMILTON: &str = "003_… (Hamilton, NSDI '23) §6";
/// Client threads per load generator.
const CLIENTS: usize = 8;
/// Transactions per submission.
const BATCH: usize = 1000;
/// Replication factor of every group.
const REPLICAS: usize = 3;
/// The size the default CPU share is chosen for: 4 shards (4 × 3 shard replicas, 4 × 3
/// coordinator replicas and 4 load generators) fill the machine's cores exactly.
const FIT_SHARDS: usize = 4;

/// How a deployed cluster commits: Hamilton's two architectures, and Florin's one-phase
/// shortcut of the first.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Design {
    /// Shards and coordinator groups, every transaction through two-phase commit.
    TwoPhase,
    /// Shards and coordinator groups, one-phase commit where a transaction lies on one shard.
    OnePhase,
    /// Block-applying shards and one atomizer group ordering every transaction into blocks.
    Atomizer,
}

impl Design {
    /// The `commit` parameter of its rows.
    fn commit(self) -> &'static str {
        match self {
            Design::TwoPhase => "two-phase for every transaction",
            Design::OnePhase => "one-phase where a transaction lies on one shard",
            Design::Atomizer => "atomizer: every transaction ordered into one block stream",
        }
    }

    /// The `architecture` parameter of its rows.
    fn architecture(self) -> &'static str {
        match self {
            Design::TwoPhase | Design::OnePhase => "two-phase",
            Design::Atomizer => "atomizer",
        }
    }

    /// Emulated hosts of a cluster of `shards` groups of `replicas` and `loadgens` load
    /// generators.
    fn hosts(self, shards: usize, replicas: usize, loadgens: usize) -> usize {
        match self {
            Design::Atomizer => (shards + 1) * replicas + loadgens,
            _ => 2 * shards * replicas + loadgens,
        }
    }
}

/// Which architectures `florin bench cluster --emulate-hosts` measures.
#[derive(Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Arch {
    /// Shards and two-phase-commit coordinators (two-phase and one-phase rows).
    #[default]
    TwoPhase,
    /// Hamilton's atomizer, each size run beside two-phase commit on the same hosts in the
    /// same run (scaling and tolerated failures).
    Atomizer,
}

/// What a load generator is told (`loadgen.json` in its directory).
#[derive(Serialize, Deserialize)]
struct LoadgenConfig {
    cluster: PathBuf,
    key: PathBuf,
    /// Its ids: 1,000-id mint chunks `first_chunk ..first_chunk + chunks` (500 transfers each).
    first_chunk: u64,
    chunks: u64,
    clients: usize,
    batch: usize,
    secs: f64,
    /// Failover mode: a conflicting spend in every batch, errors tolerated, throughput per
    /// half second, and every acknowledged transaction checked at the end.
    #[serde(default)]
    failover: bool,
    /// End-to-end mode: signed transactions through a sentinel's HTTP API instead.
    #[serde(default)]
    http: Option<HttpLoad>,
    /// Soak mode: `florin bench soak`'s transfers, a line at each reading.
    #[serde(default)]
    soak: Option<SoakLoad>,
}

/// What a soak load generator runs (see [`super::soak`]).
#[derive(Serialize, Deserialize, Clone)]
struct SoakLoad {
    marks: Vec<u64>,
    slots: u64,
    ttl: u64,
}

/// What an end-to-end load generator sends, and to which sentinel.
#[derive(Serialize, Deserialize, Clone)]
struct HttpLoad {
    /// The sentinel's API address (TLS).
    addr: std::net::SocketAddr,
    /// The cluster's CA certificate.
    ca: PathBuf,
    /// Signed transactions, each as a little-endian `u32` length and its encoding.
    txs: PathBuf,
}

/// What a load generator reports.
#[derive(Serialize, Deserialize)]
struct LoadgenResult {
    count: u64,
    elapsed_s: f64,
    latencies_ms: Vec<f64>,
    ran_out: bool,
    /// Failover mode: acknowledged transactions per half second.
    #[serde(default)]
    series: Vec<u64>,
    #[serde(default)]
    acked: u64,
    #[serde(default)]
    lost: u64,
    #[serde(default)]
    double_spends: u64,
    #[serde(default)]
    errors: u64,
    /// The atomizer: tries begun (preload included) and transactions submitted, all told.
    #[serde(default)]
    tries: Option<(u64, u64)>,
}

/// One configuration deployed on its own emulated network.
struct Deployed {
    /// Dropped first: the hosts and everything on them go before their directories.
    net: HostNetGuard,
    _dir: tempfile::TempDir,
    spec: ClusterSpec,
    members: Vec<(Role, u16, u64, PathBuf)>,
    loadgens: Vec<PathBuf>,
    observer: Arc<LocalSigner>,
    /// End-to-end runs: each load generator's sentinel and transactions.
    http: Vec<HttpLoad>,
}

impl Deployed {
    /// CPU seconds used so far by the hosts whose names start with `prefix`.
    fn host_cpu(&self, prefix: &str) -> f64 {
        self.net
            .0
            .hosts
            .iter()
            .filter(|h| h.name.starts_with(prefix))
            .filter_map(|h| h.cpu_seconds())
            .sum()
    }

    /// CPU seconds of the one host named `name` (`None`: no such host, or unreadable).
    fn cpu_of(&self, name: &str) -> Option<f64> {
        self.net
            .0
            .hosts
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.cpu_seconds())
    }

    /// The process of the member on host `name`, if it runs.
    fn pid_of_host(&self, name: &str) -> Option<u32> {
        self.members
            .iter()
            .find(|(role, g, id, _)| deploy::host_name(*role, *g, *id) == name)
            .and_then(|(_, _, _, dir)| deploy::pid_of(dir))
    }

    fn stop(self) {
        for (_, _, _, dir) in &self.members {
            if let Some(pid) = deploy::pid_of(dir) {
                deploy::signal(pid, "KILL");
            }
        }
        // The guard removes the hosts (and kills anything left on them).
    }
}

/// A deployed cluster's directory: removed after its run, unless `FLORIN_BENCH_KEEP` is set
/// (each member's log and data stay for a post-mortem; the path is logged).
fn run_dir() -> Result<tempfile::TempDir> {
    let keep = std::env::var_os("FLORIN_BENCH_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix("florin-bench-")
        .disable_cleanup(keep)
        .tempdir()?;
    if keep {
        tracing::info!("  keeping {}", dir.path().display());
    }
    Ok(dir)
}

fn raft() -> RaftOptions {
    RaftOptions {
        snapshot_every: 200,
        keep_logs: 100,
        ..RaftOptions::small_hosts()
    }
}

/// Writes and starts a cluster of `shards` shard groups and as many coordinator groups, each
/// replica on its own host, and `loadgens` load-generator hosts (not started).
fn deploy_cluster(
    exe: &Path,
    shards: usize,
    replicas: usize,
    loadgens: usize,
    design: Design,
    share: f64,
) -> Result<Deployed> {
    let dir = run_dir()?;
    let data = dir.path();
    let net = HostNetGuard::new(HostNet::claim(Some(share))?);
    let mut net = net;
    let mut keys = Vec::new();
    let mut groups = |role: Role, count: usize, net: &mut HostNet| -> Result<Vec<GroupSpec>> {
        let mut v = Vec::new();
        for g in 0..count as u16 {
            let mut members = Vec::new();
            for id in 1..=replicas as u64 {
                let key = SecretKey::generate(&mut rand::rngs::OsRng);
                let host = net.add(&deploy::host_name(role, g, id))?;
                members.push(MemberSpec {
                    id,
                    addr: format!("{}:{}", host.addr, deploy::HOST_RPC_PORT),
                    key: key.public_key().to_address(),
                });
                keys.push((role, g, id, key));
            }
            v.push(GroupSpec { members });
        }
        Ok(v)
    };
    let shard_groups = groups(Role::Shard, shards, &mut net.0)?;
    let (coord_groups, atomizer) = if design == Design::Atomizer {
        (Vec::new(), groups(Role::Atomizer, 1, &mut net.0)?.pop())
    } else {
        (groups(Role::Coordinator, shards, &mut net.0)?, None)
    };
    let observer = SecretKey::generate(&mut rand::rngs::OsRng);
    let lg_keys: Vec<SecretKey> = (0..loadgens)
        .map(|_| SecretKey::generate(&mut rand::rngs::OsRng))
        .collect();
    let map = florin_cluster::route::ShardMap::even(shards).map_err(|e| anyhow!("{e}"))?;
    let spec = ClusterSpec {
        shard_starts: map.starts().to_vec(),
        shards: shard_groups,
        coordinators: coord_groups,
        clients: lg_keys
            .iter()
            .map(|k| k.public_key().to_address())
            .collect(),
        observers: vec![observer.public_key().to_address()],
        raft: raft(),
        max_batch: 4096,
        max_inflight: 8,
        one_phase: design == Design::OnePhase,
        authority: None,
        architecture: if design == Design::Atomizer {
            Architecture::Atomizer
        } else {
            Architecture::TwoPhase
        },
        atomizer,
        atomizer_config: Default::default(),
    };
    spec.save(&data.join("cluster.toml"))?;
    let mut members = Vec::new();
    for (role, g, id, key) in keys {
        let mut cfg = NodeConfig::member(role, g, id);
        let name = deploy::host_name(role, g, id);
        cfg.host = Some(name);
        let mdir = deploy::member_dir(data, role, g, id);
        deploy::write_node(&mdir, &cfg, &key)?;
        members.push((role, g, id, mdir));
    }
    let mut lg_dirs = Vec::new();
    for (i, key) in lg_keys.iter().enumerate() {
        let name = format!("loadgen-{i}");
        net.0.add(&name)?;
        let d = data.join(&name);
        std::fs::create_dir_all(&d)?;
        florin_node::write_private(&d.join("identity.key"), key.to_hex().as_bytes())?;
        lg_dirs.push(d);
    }
    for (_, _, _, d) in &members {
        deploy::spawn(d, exe, Some(&net.0))?;
    }
    Ok(Deployed {
        _dir: dir,
        net,
        spec,
        members,
        loadgens: lg_dirs,
        observer: Arc::new(LocalSigner::new(observer)),
        http: Vec::new(),
    })
}

/// The single-node embedded engine as one process on its own host (`florin node` with
/// `role = "engine"`), and one load-generator host, for the equal-hosts reference.
fn deploy_engine(exe: &Path, share: f64) -> Result<Deployed> {
    let dir = run_dir()?;
    let data = dir.path();
    let mut net = HostNetGuard::new(HostNet::claim(Some(share))?);
    let name = deploy::host_name(Role::Engine, 0, 1);
    let host = net.0.add(&name)?;
    let key = SecretKey::generate(&mut rand::rngs::OsRng);
    let member = GroupSpec {
        members: vec![MemberSpec {
            id: 1,
            addr: format!("{}:{}", host.addr, deploy::HOST_RPC_PORT),
            key: key.public_key().to_address(),
        }],
    };
    let observer = SecretKey::generate(&mut rand::rngs::OsRng);
    let lg = SecretKey::generate(&mut rand::rngs::OsRng);
    let spec = ClusterSpec {
        shard_starts: vec![0],
        shards: vec![member.clone()],
        coordinators: vec![member],
        clients: vec![lg.public_key().to_address()],
        observers: vec![observer.public_key().to_address()],
        raft: raft(),
        max_batch: 4096,
        max_inflight: 8,
        one_phase: true,
        authority: None,
        architecture: Default::default(),
        atomizer: None,
        atomizer_config: Default::default(),
    };
    spec.save(&data.join("cluster.toml"))?;
    let mut cfg = NodeConfig::member(Role::Engine, 0, 1);
    cfg.host = Some(name);
    let mdir = deploy::member_dir(data, Role::Engine, 0, 1);
    deploy::write_node(&mdir, &cfg, &key)?;
    net.0.add("loadgen-0")?;
    let lg_dir = data.join("loadgen-0");
    std::fs::create_dir_all(&lg_dir)?;
    florin_node::write_private(&lg_dir.join("identity.key"), lg.to_hex().as_bytes())?;
    deploy::spawn(&mdir, exe, Some(&net.0))?;
    Ok(Deployed {
        _dir: dir,
        net,
        spec,
        members: vec![(Role::Engine, 0, 1, mdir)],
        loadgens: vec![lg_dir],
        observer: Arc::new(LocalSigner::new(observer)),
        http: Vec::new(),
    })
}

/// A client of every shard and coordinator replica (role, group, peer), as the observer.
fn member_peers(d: &Deployed, timeout: Duration) -> Result<Vec<(Role, u16, Peer)>> {
    Ok(member_peers_with_ids(d, timeout)?
        .into_iter()
        .map(|(r, g, _, p)| (r, g, p))
        .collect())
}

/// A client of every shard, coordinator and atomizer replica: (role, group, member id, peer).
fn member_peers_with_ids(d: &Deployed, timeout: Duration) -> Result<Vec<(Role, u16, u64, Peer)>> {
    let mut peers = Vec::new();
    let atomizer: Vec<GroupSpec> = d.spec.atomizer.iter().cloned().collect();
    for (role, groups) in [
        (Role::Shard, &d.spec.shards),
        (Role::Coordinator, &d.spec.coordinators),
        (Role::Atomizer, &atomizer),
    ] {
        for (g, grp) in groups.iter().enumerate() {
            for m in &grp.members {
                let key = PublicKey::parse(&m.key).map_err(|e| anyhow!("{e}"))?;
                let peer = Peer::new(m.addr.clone(), key, d.observer.clone(), timeout);
                peers.push((role, g as u16, m.id, peer));
            }
        }
    }
    Ok(peers)
}

/// Every replicated group of the cluster: shards, coordinators, the atomizer.
fn group_count(d: &Deployed) -> usize {
    d.spec.shards.len() + d.spec.coordinators.len() + d.spec.atomizer.iter().count()
}

/// The emulated host of the atomizer's leader now, if it has one.
fn atomizer_leader(d: &Deployed) -> Option<String> {
    member_peers_with_ids(d, Duration::from_millis(500))
        .ok()?
        .into_iter()
        .filter(|(r, ..)| *r == Role::Atomizer)
        .find_map(|(_, g, id, p)| match p.call(&Request::Status) {
            Ok(Response::Status(s)) if s.raft.state == "leader" => {
                Some(deploy::host_name(Role::Atomizer, g, id))
            }
            _ => None,
        })
}

/// Waits until every group has a leader, asking each member for its state.
fn wait_for_leaders(d: &Deployed, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let peers = member_peers(d, Duration::from_secs(1))?;
    loop {
        let mut leaders = std::collections::HashSet::new();
        for (role, g, p) in &peers {
            if let Ok(Response::Status(s)) = p.call(&Request::Status) {
                if s.raft.state == "leader" {
                    leaders.insert((*role as u8, *g));
                }
            }
        }
        if leaders.len() == group_count(d) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the groups did not all elect a leader in {within:?} (logs under each member's directory)");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The measured load on one deployed cluster.
struct Load {
    rate: f64,
    latencies: Vec<f64>,
    engine_cpu_s: f64,
    loadgen_cpu_s: f64,
    sentinel_cpu_s: f64,
    count: u64,
    secs: f64,
    /// Each load generator's report (failover mode: series, acknowledged, lost, ...).
    results: Vec<LoadgenResult>,
    /// The hosts that used most of their CPU share over the run, with that fraction.
    busiest: Vec<(String, f64)>,
    /// Leader elections during the run, all groups together (terms begun; a fault-free run
    /// should have none); `None` when some group's term could not be read before or after.
    elections: Option<u64>,
    /// The atomizer architecture: its leader's CPU, when one host led throughout.
    atomizer: Option<LeaderCpu>,
}

fn run_load(d: &Deployed, exe: &Path, chunks: u64, secs: f64) -> Result<Load> {
    run_load_with(d, exe, chunks, secs, None)
}

/// A fault schedule run in this process once the load generators have started.
type Faults<'a> = &'a dyn Fn(&Deployed, Instant) -> Result<()>;

fn run_load_with(
    d: &Deployed,
    exe: &Path,
    chunks: u64,
    secs: f64,
    faults: Option<Faults>,
) -> Result<Load> {
    let mut gens = Vec::new();
    for (i, dir) in d.loadgens.iter().enumerate() {
        let cfg = LoadgenConfig {
            cluster: dir.join("../cluster.toml"),
            key: dir.join("identity.key"),
            first_chunk: i as u64 * chunks,
            chunks,
            clients: CLIENTS,
            batch: if !d.http.is_empty() {
                E2E_BATCH
            } else if faults.is_some() {
                500
            } else {
                BATCH
            },
            secs,
            failover: faults.is_some(),
            http: d.http.get(i).cloned(),
            soak: None,
        };
        let path = dir.join("loadgen.json");
        std::fs::write(&path, serde_json::to_vec(&cfg)?)?;
        let mut cmd = d.net.0.command(&format!("loadgen-{i}"), exe)?;
        cmd.args(["bench", "cluster", "--loadgen"]).arg(&path);
        gens.push(LineChild::spawn(
            cmd,
            dir.join("loadgen.log"),
            "a load generator",
        )?);
    }
    for g in &mut gens {
        g.expect("ready")?;
    }
    // The engine tier: shard and coordinator replicas, or the single-node engine.
    let engine_cpu = |d: &Deployed| {
        d.host_cpu("shard-")
            + d.host_cpu("coord-")
            + d.host_cpu("engine-")
            + d.host_cpu("atomizer-")
    };
    // The atomizer's leader: its host's CPU over the window (it must lead throughout).
    let leader = atomizer_leader(d);
    let leader_cpu0 = leader.as_deref().and_then(|n| d.cpu_of(n));
    let leader_pid = leader.as_deref().and_then(|n| d.pid_of_host(n));
    let leader_net0 = leader_pid.and_then(netns_bytes);
    let leader_ticks0 = leader_pid.and_then(proc_ticks);
    let terms0 = group_terms(d);
    let (e0, l0, s0) = (
        engine_cpu(d),
        d.host_cpu("loadgen-"),
        d.host_cpu("sentinel-"),
    );
    let per_host0: Vec<f64> = d
        .net
        .0
        .hosts
        .iter()
        .map(|h| h.cpu_seconds().unwrap_or(0.0))
        .collect();
    let t0 = Instant::now();
    for g in &mut gens {
        g.send("go")?;
    }
    if let Some(f) = faults {
        f(d, Instant::now())?;
    }
    let mut results = Vec::new();
    for g in &mut gens {
        let l = g.line()?;
        results
            .push(serde_json::from_str::<LoadgenResult>(&l).context("a load generator's result")?);
    }
    let (e1, l1, s1) = (
        engine_cpu(d),
        d.host_cpu("loadgen-"),
        d.host_cpu("sentinel-"),
    );
    // Each host's use of its share over the window: where the bottleneck is.
    let window = t0.elapsed().as_secs_f64().max(1e-9);
    let share = d.net.0.cpu_share.unwrap_or(1.0);
    let mut busiest: Vec<(String, f64)> = d
        .net
        .0
        .hosts
        .iter()
        .zip(per_host0)
        .map(|(h, c0)| {
            let used = h.cpu_seconds().unwrap_or(0.0) - c0;
            (h.name.clone(), used / window / share)
        })
        .collect();
    busiest.sort_by(|a, b| b.1.total_cmp(&a.1));
    busiest.truncate(4);
    let leader_cpu1 = leader.as_deref().and_then(|n| d.cpu_of(n));
    let leader_net1 = leader_pid.and_then(netns_bytes);
    let leader_ticks1 = leader_pid.and_then(proc_ticks);
    let atomizer = match (leader, leader_cpu0, leader_cpu1) {
        (Some(host), Some(c0), Some(c1)) if atomizer_leader(d).as_deref() == Some(&host) => {
            Some(LeaderCpu {
                host,
                cpu_s: c1 - c0,
                share_used: (c1 - c0) / window / share,
                net: leader_net0.zip(leader_net1).map(|(a, b)| {
                    // Payload: each packet's Ethernet (14), IPv4 (20) and TCP (32, with
                    // timestamps) headers taken off.
                    let payload = |bytes: u64, packets: u64| bytes.saturating_sub(66 * packets);
                    (
                        payload(b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)),
                        payload(b.2.saturating_sub(a.2), b.3.saturating_sub(a.3)),
                    )
                }),
                kernel_share: leader_ticks0
                    .zip(leader_ticks1)
                    .and_then(|((u0, k0), (u1, k1))| {
                        let (u, k) = (u1.saturating_sub(u0), k1.saturating_sub(k0));
                        (u + k > 0).then(|| (k as f64 / (u + k) as f64, u + k))
                    }),
            })
        }
        (Some(_), ..) => {
            tracing::info!(
                "  note: the atomizer's leader changed during the run: its CPU is not reported"
            );
            None
        }
        _ => None,
    };
    let terms1 = group_terms(d);
    let groups = group_count(d);
    let elections = (terms0.len() == groups && terms1.len() == groups).then(|| {
        terms1
            .iter()
            .map(|(g, t)| t.saturating_sub(terms0.get(g).copied().unwrap_or(*t)))
            .sum()
    });
    if results.iter().any(|r| r.ran_out) {
        tracing::info!(
            "  note: a load generator used all its preloaded ids before the time was up"
        );
    }
    Ok(Load {
        rate: results
            .iter()
            .map(|r| r.count as f64 / r.elapsed_s.max(1e-9))
            .sum(),
        latencies: results
            .iter()
            .flat_map(|r| r.latencies_ms.iter().copied())
            .collect(),
        engine_cpu_s: e1 - e0,
        loadgen_cpu_s: l1 - l0,
        sentinel_cpu_s: s1 - s0,
        count: results.iter().map(|r| r.count).sum(),
        secs: results.iter().map(|r| r.elapsed_s).fold(0.0, f64::max),
        results,
        busiest,
        elections,
        atomizer,
    })
}

/// The atomizer: tries begun per transaction submitted, over every load generator (1 when no
/// try went stale; preloads included).
fn tries_per_tx(results: &[LoadgenResult]) -> Option<f64> {
    let (tries, txs) = results
        .iter()
        .filter_map(|r| r.tries)
        .fold((0, 0), |(a, b), (t, n)| (a + t, b + n));
    (txs > 0).then(|| tries as f64 / txs as f64)
}

/// The atomizer leader's CPU over a run.
struct LeaderCpu {
    host: String,
    cpu_s: f64,
    /// Of its host's CPU share over the window.
    share_used: f64,
    /// TCP payload bytes its host received and sent over the window (the interface's bytes
    /// less 66 bytes of Ethernet, IP and TCP headers a packet; `None`: unreadable).
    net: Option<(u64, u64)>,
    /// The part of its process's CPU spent in the kernel over the window, and the clock ticks
    /// (10 ms) it was measured over.
    kernel_share: Option<(f64, u64)>,
}

/// Bytes and packets received and sent by the network namespace of process `pid`, loopback
/// excepted (`/proc/<pid>/net/dev`): `(rx bytes, rx packets, tx bytes, tx packets)`.
fn netns_bytes(pid: u32) -> Option<(u64, u64, u64, u64)> {
    parse_net_dev(&std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?)
}

/// [`netns_bytes`] from the text of a `net/dev` file.
fn parse_net_dev(text: &str) -> Option<(u64, u64, u64, u64)> {
    let (mut rx, mut rxp, mut tx, mut txp) = (0u64, 0u64, 0u64, 0u64);
    for line in text.lines().skip(2) {
        let (name, rest) = line.split_once(':')?;
        if name.trim() == "lo" {
            continue;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        rx += f.first()?;
        rxp += f.get(1)?;
        tx += f.get(8)?;
        txp += f.get(9)?;
    }
    Some((rx, rxp, tx, txp))
}

/// User and kernel CPU ticks of process `pid` (`/proc/<pid>/stat`).
fn proc_ticks(pid: u32) -> Option<(u64, u64)> {
    parse_stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// [`proc_ticks`] from the text of a `stat` file.
fn parse_stat_ticks(text: &str) -> Option<(u64, u64)> {
    // Fields after the command (which may hold spaces), from the 3rd: utime is the 14th.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// CPU nanoseconds the calling thread used so far (`/proc/thread-self/schedstat`).
fn thread_cpu_ns() -> Result<u64> {
    super::ledger_e2e::schedstat_ns(Path::new("/proc/thread-self/schedstat"))
}

/// The cluster's transport (Noise with AES-GCM over TCP, as every cluster RPC) between two
/// threads on loopback, in the benchmark's own process before any cluster runs (no CPU quota,
/// no bridge): CPU nanoseconds per payload byte to send, and to receive, in 60,000-byte
/// messages (one Noise record each; an atomizer step or a delivery of blocks under load is
/// larger). Bulk transfer is the cheapest a byte gets, so the leader's payload bytes times this
/// is a floor on what its traffic costs (the per-message cost of small RPCs is left out).
fn transport_ns_per_byte() -> Result<(f64, f64)> {
    use florin_net::channel::{self, ChannelConfig, Listener};
    const MSG: usize = 60_000;
    const COUNT: usize = 1024;
    let bytes = (MSG * COUNT) as f64;
    let listener = Listener::bind("127.0.0.1:0", ChannelConfig::default())?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> Result<f64> {
        let signer = LocalSigner::new(SecretKey::generate(&mut rand::rngs::OsRng));
        let mut ch = listener.accept(&signer)?;
        let c0 = thread_cpu_ns()?;
        for _ in 0..COUNT {
            let m = ch.recv(MSG)?;
            if m.len() != MSG {
                bail!(
                    "the transport calibration received {} bytes, not {MSG}",
                    m.len()
                );
            }
        }
        let c1 = thread_cpu_ns()?;
        ch.send(b"done")?;
        Ok(c1.saturating_sub(c0) as f64 / bytes)
    });
    let signer = LocalSigner::new(SecretKey::generate(&mut rand::rngs::OsRng));
    let mut ch = channel::connect(addr, &signer, None, &ChannelConfig::default())?;
    let msg = vec![0x5au8; MSG];
    let c0 = thread_cpu_ns()?;
    for _ in 0..COUNT {
        ch.send(&msg)?;
    }
    let c1 = thread_cpu_ns()?;
    ch.recv(16)?;
    let recv = server
        .join()
        .map_err(|_| anyhow!("the transport calibration's receiver panicked"))??;
    Ok((c1.saturating_sub(c0) as f64 / bytes, recv))
}

/// The atomizer leader's own work per transaction, without transport, storage or scheduling,
/// in this process: decoding the attestations shards send, encoding the step it replicates,
/// applying the step (ordering, conflict checks, sealing, block hashes) and encoding each block
/// once (its log record and deliveries). Transfers of 2 inputs and 2 outputs with random ids
/// over `shards` shards (the load generators' mix), 4,096 a step, each step sealed; CPU of
/// this thread per transaction ordered.
fn atomizer_compute_us_per_tx(shards: usize) -> Result<f64> {
    use florin_cluster::atomizer::machine::{AtomCmd, AtomizerConfig, AtomizerState};
    use florin_cluster::atomizer::{tx_key, Attestation};
    use florin_ledger::{CompactTx, TxKind};
    use rand::{RngCore, SeedableRng};
    const STEP: usize = 4096;
    const STEPS: usize = 24;
    let map = florin_cluster::route::ShardMap::even(shards).map_err(|e| anyhow!("{e}"))?;
    let mut state = AtomizerState::new(AtomizerConfig::default(), map.clone());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut id = || {
        let mut x = [0u8; 32];
        rng.fill_bytes(&mut x);
        x
    };
    let now = florin_ledger::expiry::unix_now();
    let (mut cpu_ns, mut ordered) = (0u64, 0usize);
    for _ in 0..STEPS {
        // The shards' requests (made outside the measured part: the shards' work).
        let height = state.height();
        let mut attestations: Vec<Attestation> = Vec::with_capacity(STEP * 2);
        for _ in 0..STEP {
            let tx = CompactTx {
                txid: id(),
                kind: TxKind::Transfer,
                inputs: vec![id(), id()],
                outputs: vec![(id(), 500), (id(), 700)],
                expires: now + 3600,
            };
            let key = tx_key(&tx);
            let owner = map.shard_of(&tx.txid);
            let mut concerned: Vec<u16> = tx.inputs.iter().map(|i| map.shard_of(i)).collect();
            concerned.push(owner);
            concerned.sort_unstable();
            concerned.dedup();
            for shard in concerned {
                attestations.push(Attestation {
                    key,
                    attempt: 1,
                    shard,
                    height,
                    inputs: (0..tx.inputs.len() as u16)
                        .filter(|k| map.shard_of(&tx.inputs[*k as usize]) == shard)
                        .collect(),
                    tx: (shard == owner).then(|| tx.clone()),
                    now,
                });
            }
        }
        let wire = florin_cluster::shard::encode(&attestations);
        let c0 = thread_cpu_ns()?;
        let attestations: Vec<Attestation> =
            florin_cluster::shard::decode(&wire).map_err(|e| anyhow!("{e}"))?;
        let cmd = AtomCmd::Step {
            attestations,
            seal: true,
            now,
        };
        let entry = florin_cluster::shard::encode(&cmd);
        let (_, blocks) = state.apply(cmd);
        let mut encoded = 0usize;
        for b in &blocks {
            encoded += florin_cluster::shard::encode(b).len();
            ordered += b.txs.len();
        }
        cpu_ns += thread_cpu_ns()?.saturating_sub(c0);
        std::hint::black_box((entry.len(), encoded));
    }
    if ordered < STEP * STEPS {
        bail!(
            "the atomizer ordered {ordered} of {} transactions in its compute measurement",
            STEP * STEPS
        );
    }
    Ok(cpu_ns as f64 / 1000.0 / ordered as f64)
}

/// Each shard and coordinator group's highest Raft term among the members that answer.
fn group_terms(d: &Deployed) -> BTreeMap<(u8, u16), u64> {
    let mut terms = BTreeMap::new();
    for (role, g, peer) in member_peers(d, Duration::from_millis(500)).unwrap_or_default() {
        if let Ok(Response::Status(s)) = peer.call(&Request::Status) {
            let t = terms.entry((role as u8, g)).or_insert(0);
            *t = (*t).max(s.raft.term);
        }
    }
    terms
}

/// The mean number of shards a workload transaction touches (its inputs, outputs and txid) at
/// `shards` even shards: each touched shard gets a part of it, so two-phase work per
/// transaction grows with the shards (≈ 1, 1.9, 3.0 and 4.1 at 1, 2, 4 and 8).
fn shards_per_tx(shards: usize) -> f64 {
    let Ok(map) = florin_cluster::route::ShardMap::even(shards) else {
        return 0.0;
    };
    let txs = workload(10_000, 0);
    let touched: usize = txs
        .iter()
        .map(|t| {
            let mut s: Vec<u16> = t
                .inputs
                .iter()
                .chain(t.outputs.iter().map(|(x, _)| x))
                .chain(std::iter::once(&t.txid))
                .map(|x| map.shard_of(x))
                .collect();
            s.sort_unstable();
            s.dedup();
            s.len()
        })
        .sum();
    touched as f64 / txs.len() as f64
}

/// Runs the emulated-host suite.
/// A part of the emulated-hosts suite (`--only`).
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// Hamilton's Fig. 4: throughput and latency versus shards.
    Scaling,
    /// One shard of 3 replicas against the single-node engine on equal hosts.
    Replication,
    /// Hamilton's Fig. 5: two data centres lost under load.
    Failover,
    /// Hamilton's Fig. 6: peak throughput versus tolerated failures (replication 1 to 9).
    Failures,
    /// End to end: signed transactions through signature-checking sentinels on hosts of
    /// their own (`sentinel_cpu_us_per_tx`).
    Sentinels,
}

pub(super) fn run(
    rec: &mut Recorder,
    scale: Scale,
    quick: bool,
    share: Option<f64>,
    only: Option<Part>,
    arch: Arch,
) -> Result<()> {
    if arch == Arch::Atomizer && only.is_some_and(|p| !matches!(p, Part::Scaling | Part::Failures))
    {
        bail!("--architecture atomizer measures the scaling and failures parts (Hamilton's Fig. 4 and 6)");
    }
    florin_node::hosts::check_supported()?;
    // Interrupted (Ctrl-C), the run removes its hosts and their processes before exiting.
    florin_node::hosts::remove_on_signal();
    let exe = std::env::current_exe().context("cannot find the florin binary")?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    // The atomizer is measured where Hamilton measured it: Fig. 4 and Fig. 6.
    let runs = |p: Part| {
        only.map_or(
            arch == Arch::TwoPhase || matches!(p, Part::Scaling | Part::Failures),
            |o| o == p,
        )
    };
    if runs(Part::Scaling) {
        scaling(rec, &exe, cores, scale, quick, share, arch)?;
    }
    if runs(Part::Replication) {
        let pairs = if quick {
            1
        } else if scale.full {
            5
        } else {
            3
        };
        // A larger share (7 hosts fill the machine) runs ≈ 4x faster: more ids, as long a
        // window.
        let (r_secs, r_chunks) = if quick {
            (3.0, 400)
        } else if scale.full {
            (15.0, 3200)
        } else {
            (8.0, 1600)
        };
        replication_vs_single(rec, &exe, cores, pairs, r_secs, r_chunks)?;
    }
    if runs(Part::Failover) {
        dc_failover(rec, &exe, cores, quick)?;
    }
    if runs(Part::Failures) {
        failures_vs_throughput(rec, &exe, cores, scale, quick, arch)?;
    }
    if runs(Part::Sentinels) {
        sentinels_e2e(rec, &exe, cores, scale, quick, share)?;
    }
    Ok(())
}

/// Hamilton's Fig. 4: throughput and latency versus shards at replication 3, each replica,
/// coordinator or atomizer replica and load generator on its own host: two-phase and one-phase
/// commit, or (`arch` atomizer) two-phase commit and the atomizer, size by size in one run.
fn scaling(
    rec: &mut Recorder,
    exe: &Path,
    cores: usize,
    scale: Scale,
    quick: bool,
    share: Option<f64>,
    arch: Arch,
) -> Result<()> {
    let fit_hosts = FIT_SHARDS * (2 * REPLICAS + 1);
    let share = share.unwrap_or(cores as f64 / fit_hosts as f64);
    let sizes: &[usize] = if quick { &[1, 2] } else { &[1, 2, 4, 8] };
    let (secs, chunks) = if quick {
        (4.0, 120)
    } else if scale.full {
        (20.0, 800)
    } else {
        (10.0, 400)
    };
    let designs: &[Design] = match arch {
        Arch::TwoPhase => &[Design::TwoPhase, Design::OnePhase],
        Arch::Atomizer => &[Design::TwoPhase, Design::Atomizer],
    };
    tracing::info!(
        "emulated hosts: {share:.3} core(s) each ({cores} cores / {fit_hosts} hosts at {FIT_SHARDS} shards); \
         replication {REPLICAS}; {designs:?}; coordinator groups (or one atomizer group) = shards = load generators; \
         {CLIENTS} clients x {BATCH} transactions per generator; {secs} s per run"
    );
    // What the cluster's transport costs per byte on this machine, before any cluster runs:
    // the atomizer leader's bytes per transaction times this is what its traffic alone costs.
    let transport = match arch {
        Arch::Atomizer => match transport_ns_per_byte() {
            Ok((send, recv)) => {
                for (direction, ns) in [("send", send), ("receive", recv)] {
                    rec.add(
                        "cluster_transport_cpu_ns_per_byte",
                        ns,
                        "ns",
                        json!({ "direction": direction, "message_bytes": 60_000, "what": "CPU per payload byte of the cluster's transport (Noise AES-GCM over TCP, florin-net's channel) between two threads of the benchmark on loopback, before any cluster runs, one side" }),
                        None,
                        None,
                    );
                }
                Some((send, recv))
            }
            Err(e) => {
                tracing::info!("  note: the transport calibration failed: {e:#}");
                None
            }
        },
        Arch::TwoPhase => None,
    };
    // The leader's own work per transaction at each size, measured here before any cluster
    // runs (pure CPU, no quota).
    let mut compute: BTreeMap<usize, f64> = BTreeMap::new();
    if arch == Arch::Atomizer {
        for &shards in sizes {
            match atomizer_compute_us_per_tx(shards) {
                Ok(us) => {
                    rec.add(
                        "atomizer_leader_compute_us_per_tx",
                        us,
                        "µs",
                        json!({ "shards": shards, "what": "the leader's own work per transaction in the benchmark's process (decode the shards' attestations, encode the replicated step, apply it: order, check, seal, hash; encode each block once), without transport, storage or scheduling" }),
                        None,
                        None,
                    );
                    compute.insert(shards, us);
                }
                Err(e) => tracing::info!("  note: the atomizer compute measurement failed: {e:#}"),
            }
        }
    }
    // Each design's rate by size (its scaling is judged against its own one-shard rate).
    let mut rates: BTreeMap<&str, Vec<(usize, f64)>> = BTreeMap::new();
    for &shards in sizes {
        for &design in designs {
            let hosts = design.hosts(shards, REPLICAS, shards);
            let fits = hosts as f64 * share <= cores as f64 + 1e-9;
            let d = deploy_cluster(exe, shards, REPLICAS, shards, design, share)?;
            let measured = wait_for_leaders(&d, Duration::from_secs(60))
                .and_then(|_| run_load(&d, exe, chunks, secs));
            d.stop();
            let Load {
                rate,
                mut latencies,
                engine_cpu_s,
                loadgen_cpu_s,
                count,
                secs: window,
                busiest,
                elections,
                atomizer,
                results,
                ..
            } = measured?;
            let commit = design.commit();
            let architecture = design.architecture();
            tracing::info!("  {shards} shard(s), {commit}: {rate:.0} transactions/s");
            let params = json!({
                "shards": shards, "replicas": REPLICAS, "architecture": architecture,
                "coordinators": if design == Design::Atomizer { 0 } else { shards },
                "atomizer_replicas": if design == Design::Atomizer { REPLICAS } else { 0 },
                "load_generators": shards, "commit": commit, "emulated_hosts": hosts,
                "host_cpu_cores": share, "hosts_fit_machine": fits,
                "clients_per_generator": CLIENTS, "batch": BATCH,
                "transactions": count, "window_s": window,
                "shards_per_tx": shards_per_tx(shards), "elections_during_run": elections,
                "busiest_hosts": busiest.iter().map(|(h, u)| json!({ "host": h, "share_used": (u * 100.0).round() / 100.0 })).collect::<Vec<_>>(),
                "atomizer_tries_per_tx": tries_per_tx(&results),
                "batches_in_doubt": results.iter().map(|r| r.errors).sum::<u64>(),
            });
            if design != Design::OnePhase {
                rates.entry(architecture).or_default().push((shards, rate));
            }
            let reference = if design == Design::Atomizer {
                Reference {
                    value: 170_000.0,
                    source: format!("{HAMILTON} Fig. 4: the atomizer's peak, bound by its leader"),
                }
            } else {
                Reference {
                    value: 1_700_000.0,
                    source: format!("{HAMILTON} Fig. 4: peak, 2PC, many shards on many machines"),
                }
            };
            rec.add(
                "cluster_hosts_tx_per_s",
                rate,
                "transactions/s",
                params.clone(),
                Some(reference),
                None,
            );
            for (p, seed) in [(0.5, 500.0), (0.99, 1000.0)] {
                rec.add(
                    "cluster_hosts_batch_latency_ms",
                    percentile(&mut latencies, p),
                    "ms",
                    json!({ "shards": shards, "replicas": REPLICAS, "percentile": (p * 100.0) as u32, "batch": BATCH, "commit": commit, "architecture": architecture }),
                    Some(Reference {
                        value: seed,
                        source: format!("{HAMILTON} Fig. 4: p50 under 500 ms, p99 under 1 s per transaction at peak"),
                    }),
                    None,
                );
            }
            if count > 0 {
                rec.add(
                    "cluster_hosts_engine_cpu_us_per_tx",
                    engine_cpu_s * 1e6 / count as f64,
                    "µs",
                    json!({ "shards": shards, "replicas": REPLICAS, "commit": commit, "architecture": architecture, "what": "CPU of every shard, coordinator and atomizer host (cpuacct) per transaction" }),
                    None,
                    None,
                );
                rec.add(
                    "cluster_hosts_loadgen_cpu_us_per_tx",
                    loadgen_cpu_s * 1e6 / count as f64,
                    "µs",
                    json!({ "shards": shards, "commit": commit, "architecture": architecture }),
                    None,
                    None,
                );
            }
            // Nothing confirmed: no CPU per transaction to speak of (the rate row says 0).
            if let (Design::Atomizer, Some(l), true) = (design, &atomizer, count > 0) {
                let floor = (transport, compute.get(&shards).copied());
                atomizer_leader_rows(rec, shards, REPLICAS, share, count, l, floor);
            }
        }
    }
    for (architecture, by_size) in &rates {
        let Some(one) = by_size
            .iter()
            .find(|(s, _)| *s == 1)
            .map(|(_, r)| *r)
            .filter(|r| *r > 0.0)
        else {
            continue;
        };
        let atomizer = *architecture == "atomizer";
        for (shards, rate) in by_size.iter().filter(|(s, _)| *s > 1) {
            let target = if *shards == 4 && !atomizer {
                json!(3.5)
            } else {
                json!(null)
            };
            let commit = if atomizer {
                Design::Atomizer.commit()
            } else {
                Design::TwoPhase.commit()
            };
            rec.add(
                "cluster_scaling_vs_one_shard",
                rate / one,
                "ratio",
                json!({
                    "shards": shards, "commit": commit, "architecture": architecture,
                    "target": target, "linear": shards,
                    "hamilton": if atomizer { "Fig. 4: the atomizer's line grows, then stays flat once its leader saturates (170 K tx/s)" } else { "Fig. 4: linear in shards" },
                    "shards_per_tx": shards_per_tx(*shards),
                    "parts_per_s_vs_one_shard": rate / one * shards_per_tx(*shards) / shards_per_tx(1),
                }),
                (!atomizer).then(|| Reference {
                    value: *shards as f64,
                    source: format!("{HAMILTON} Fig. 4: throughput linear in shards"),
                }),
                Some(Reference {
                    value: one,
                    source: "one shard (3 replicas, the same design, 1 load generator), same hosts, same run".into(),
                }),
            );
        }
        // Hamilton's finding, as ratios of one run: how much the last doubling of shards
        // added, per architecture.
        if let [.., (s0, r0), (s1, r1)] = by_size.as_slice() {
            if *r0 > 0.0 {
                rec.add(
                    "cluster_last_doubling_growth",
                    r1 / r0,
                    "ratio",
                    json!({
                        "architecture": architecture, "from_shards": s0, "to_shards": s1,
                        "what": "throughput at the largest size over the size before it, same hosts, same run",
                    }),
                    None,
                    None,
                );
            }
        }
    }
    if let (Some(a), Some(t)) = (rates.get("atomizer"), rates.get("two-phase")) {
        for ((shards, ra), (_, rt)) in a.iter().zip(t) {
            if *rt > 0.0 {
                rec.add(
                    "atomizer_vs_two_phase_ratio",
                    ra / rt,
                    "ratio",
                    json!({ "shards": shards, "replicas": REPLICAS, "host_cpu_cores": share }),
                    None,
                    Some(Reference {
                        value: *rt,
                        source: "two-phase commit at the same size, same hosts, same run".into(),
                    }),
                );
            }
        }
    }
    Ok(())
}

/// The atomizer leader's rows of one run: its CPU per transaction (the 1 µs target at 2 shards)
/// and how much of its host it used (where it saturates).
fn atomizer_leader_rows(
    rec: &mut Recorder,
    shards: usize,
    replicas: usize,
    share: f64,
    count: u64,
    l: &LeaderCpu,
    (transport, compute): (Option<(f64, f64)>, Option<f64>),
) {
    let us = l.cpu_s * 1e6 / count.max(1) as f64;
    let n = count.max(1) as f64;
    if let Some((rx, tx)) = l.net {
        rec.add(
            "atomizer_leader_net_bytes_per_tx",
            (rx + tx) as f64 / n,
            "bytes",
            json!({
                "shards": shards, "replicas": replicas, "host": l.host,
                "received_per_tx": rx as f64 / n, "sent_per_tx": tx as f64 / n,
                "what": "TCP payload bytes through the leader host's network interface over the run (its namespace's counters less 66 bytes of headers a packet), per transaction confirmed",
            }),
            None,
            None,
        );
        if let Some((send, recv)) = transport {
            let floor = (rx as f64 * recv + tx as f64 * send) / n / 1000.0;
            rec.add(
                "atomizer_leader_transport_floor_us_per_tx",
                floor,
                "µs",
                json!({
                    "shards": shards, "replicas": replicas, "host": l.host,
                    "of_leader_cpu": if us > 0.0 { floor / us } else { 0.0 },
                    "what": "the leader's payload bytes per transaction times the transport's bulk CPU per byte (cluster_transport_cpu_ns_per_byte, same run): a floor on what its traffic alone costs, before ordering, storage, scheduling or any per-message cost",
                }),
                None,
                None,
            );
            if let Some(c) = compute {
                rec.add(
                    "atomizer_leader_floor_us_per_tx",
                    floor + c,
                    "µs",
                    json!({
                        "shards": shards, "replicas": replicas, "host": l.host,
                        "transport_us": floor, "compute_us": c,
                        "target": if shards == 2 { json!(1.0) } else { json!(null) },
                        "of_leader_cpu": if us > 0.0 { (floor + c) / us } else { 0.0 },
                        "what": "atomizer_leader_transport_floor_us_per_tx + atomizer_leader_compute_us_per_tx: the least this design's leader spends per transaction on this machine, before storage (fsync), scheduling and per-message costs",
                    }),
                    None,
                    None,
                );
            }
        }
    }
    if let Some((k, ticks)) = l.kernel_share {
        rec.add(
            "atomizer_leader_kernel_share",
            k,
            "fraction",
            json!({
                "shards": shards, "replicas": replicas, "host": l.host, "ticks": ticks,
                "what": "the part of the leader process's CPU spent in the kernel over the run (/proc/<pid>/stat, in 10 ms ticks): sockets, fsync, scheduling (softirq time for arriving packets may not be charged to it)",
            }),
            None,
            None,
        );
    }
    rec.add(
        "atomizer_leader_cpu_us_per_tx",
        us,
        "µs",
        json!({
            "shards": shards, "replicas": replicas, "host": l.host, "host_cpu_cores": share,
            "target": if shards == 2 { json!(1.0) } else { json!(null) },
            "one_core_orders_tx_per_s": if us > 0.0 { 1e6 / us } else { 0.0 },
            "what": "CPU of the atomizer leader's host (cpuacct) over the run, per transaction confirmed",
        }),
        Some(Reference {
            value: 1e6 / 170_000.0,
            source: format!("{HAMILTON}: 170 K tx/s for the whole atomizer, i.e. ≥ 5.9 µs per transaction on its leader's core"),
        }),
        None,
    );
    rec.add(
        "atomizer_leader_cpu_share",
        l.share_used,
        "fraction",
        json!({
            "shards": shards, "replicas": replicas, "host": l.host, "host_cpu_cores": share,
            "what": "the leader host's CPU over the run / its share: near 1, the leader is the bottleneck",
        }),
        None,
        None,
    );
}

/// Hamilton's Fig. 6: peak throughput versus the failures each replicated service tolerates.
/// One shard group and one coordinator group of `r` replicas (r = 1, 3, 5, 7, 9: f = 0 to 4
/// failures), every replica on its own host, fed by one load generator on its own host, every
/// transaction through two-phase commit (Hamilton's 2PC line). Every size runs on hosts of the
/// same share, the one at which the largest fits the machine, so only the replication changes.
/// Each size runs once per pass, the passes in alternate order (drift on the machine falls on
/// both ends alike); the median over passes is reported.
fn failures_vs_throughput(
    rec: &mut Recorder,
    exe: &Path,
    cores: usize,
    scale: Scale,
    quick: bool,
    arch: Arch,
) -> Result<()> {
    let sizes: &[usize] = if quick { &[1, 3] } else { &[1, 3, 5, 7, 9] };
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let share = cores as f64 / (2 * largest + 1) as f64;
    let (secs, chunks, passes) = if quick {
        (3.0, 300, 1)
    } else if scale.full {
        (20.0, 1600, 3)
    } else {
        (10.0, 800, 2)
    };
    let designs: &[Design] = match arch {
        Arch::TwoPhase => &[Design::TwoPhase],
        Arch::Atomizer => &[Design::TwoPhase, Design::Atomizer],
    };
    tracing::info!(
        "Fig. 6: replication {sizes:?}, {designs:?}, one shard and one coordinator (or atomizer) group, {share:.3} core(s) \
         per host ({cores} cores / {} hosts at replication {largest}); {secs} s per run, \
         {passes} pass(es)",
        2 * largest + 1
    );
    /// One size's passes: each rate and CPU per transaction, the first pass's busiest hosts,
    /// whether a load generator ran out of ids.
    #[derive(Default)]
    struct Runs {
        rates: Vec<f64>,
        cpu: Vec<f64>,
        busiest: Vec<(String, f64)>,
        ran_out: bool,
        elections: Vec<Option<u64>>,
        /// The atomizer's leader: CPU per transaction and share used, per run.
        leader: Vec<(f64, f64)>,
    }
    let mut runs: BTreeMap<(&str, usize), Runs> = BTreeMap::new();
    for pass in 0..passes {
        let order: Vec<usize> = if pass % 2 == 0 {
            sizes.to_vec()
        } else {
            sizes.iter().rev().copied().collect()
        };
        for (r, &design) in order
            .into_iter()
            .flat_map(|r| designs.iter().map(move |d| (r, d)))
        {
            let d = deploy_cluster(exe, 1, r, 1, design, share)?;
            let measured = wait_for_leaders(&d, Duration::from_secs(60))
                .and_then(|_| run_load(&d, exe, chunks, secs));
            d.stop();
            let l = measured?;
            tracing::info!(
                "  pass {}, replication {r} (f = {}), {}: {:.0} transactions/s",
                pass + 1,
                (r - 1) / 2,
                design.architecture(),
                l.rate
            );
            let e = runs.entry((design.architecture(), r)).or_default();
            if let (Some(a), true) = (&l.atomizer, l.count > 0) {
                e.leader
                    .push((a.cpu_s * 1e6 / l.count.max(1) as f64, a.share_used));
            }
            e.rates.push(l.rate);
            e.cpu.push(l.engine_cpu_s * 1e6 / l.count.max(1) as f64);
            if e.busiest.is_empty() {
                e.busiest = l.busiest.clone();
            }
            e.ran_out |= l.results.iter().any(|g| g.ran_out);
            e.elections.push(l.elections);
        }
    }
    for (
        (architecture, r),
        Runs {
            rates,
            cpu,
            busiest,
            ran_out,
            elections,
            leader,
        },
    ) in &runs
    {
        let none = runs
            .get(&(*architecture, 1))
            .map(|r| median(&r.rates))
            .filter(|v| *v > 0.0);
        let atomizer = *architecture == "atomizer";
        let commit = if atomizer {
            Design::Atomizer.commit()
        } else {
            Design::TwoPhase.commit()
        };
        let f = (r - 1) / 2;
        let rate = median(rates);
        let leader_us: Vec<f64> = leader.iter().map(|l| l.0).collect();
        let leader_share: Vec<f64> = leader.iter().map(|l| l.1).collect();
        rec.add(
            "cluster_hosts_tx_per_s_by_failures",
            rate,
            "transactions/s",
            json!({
                "replicas": r, "tolerated_failures": f, "shards": 1,
                "coordinators": if atomizer { 0 } else { 1 }, "atomizer_groups": if atomizer { 1 } else { 0 },
                "architecture": architecture,
                "load_generators": 1, "emulated_hosts": 2 * r + 1, "host_cpu_cores": share,
                "commit": commit, "window_s": secs,
                "atomizer_leader_cpu_us_per_tx": (!leader_us.is_empty()).then(|| median(&leader_us)),
                "atomizer_leader_cpu_share": (!leader_share.is_empty()).then(|| median(&leader_share)),
                "passes": passes, "runs_tx_per_s": rates, "ran_out_of_ids": ran_out,
                "engine_cpu_us_per_tx": median(cpu), "elections_during_runs": elections,
                "busiest_hosts": busiest.iter().map(|(h, u)| json!({ "host": h, "share_used": (u * 100.0).round() / 100.0 })).collect::<Vec<_>>(),
                "hamilton": if atomizer {
                    "Fig. 6: the atomizer's peak falls as replication grows, more steeply than 2PC's (every transaction passes its one leader); the text gives no values"
                } else {
                    "Fig. 6 plots peak throughput falling as replication grows (the leader's bandwidth to its followers); the text gives no values"
                },
            }),
            None,
            None,
        );
        if let (true, Some(one)) = (*r > 1, none) {
            rec.add(
                "cluster_failures_vs_none_ratio",
                rate / one,
                "ratio",
                json!({ "replicas": r, "tolerated_failures": f, "host_cpu_cores": share, "passes": passes, "architecture": architecture }),
                None,
                Some(Reference {
                    value: one,
                    source: "replication 1 (no failure tolerated), the same design, same hosts, same run".into(),
                }),
            );
        }
    }
    Ok(())
}

/// Hamilton's Fig. 5: replication 5 across 5 emulated data centres — replica `k` of every
/// group (2 shard groups, 2 coordinator groups) lives in centre `k`, each on its own host —
/// and two centres lost one after the other (every host of the centre cut off from the
/// network and its processes frozen), under load from two load generators in failover mode
/// (a conflicting spend in every batch). Throughput per half second before, during and after;
/// the time each loss kept throughput under half its rate before; acknowledged transactions
/// lost (every one is looked up after the faults); double spends accepted.
fn dc_failover(rec: &mut Recorder, exe: &Path, cores: usize, quick: bool) -> Result<()> {
    const CENTRES: usize = 5;
    const SHARDS: usize = 2;
    let hosts = 2 * SHARDS * CENTRES + SHARDS;
    let share = cores as f64 / hosts as f64;
    let secs: f64 = if quick { 12.0 } else { 24.0 };
    let chunks = if quick { 400 } else { 800 };
    let (first_at, second_at) = (secs / 4.0, secs / 2.0);
    let d = deploy_cluster(exe, SHARDS, CENTRES, SHARDS, Design::OnePhase, share)?;
    // Centre k: every member with replica id k.
    let centre = |k: usize| -> Vec<String> {
        d.net
            .0
            .hosts
            .iter()
            .filter(|h| !h.name.starts_with("loadgen") && h.name.ends_with(&format!("-{k}")))
            .map(|h| h.name.clone())
            .collect()
    };
    let lose = |d: &Deployed, k: usize| -> Result<()> {
        for h in centre(k) {
            d.net.0.cut(&h)?;
            d.net.0.freeze(&h)?;
        }
        Ok(())
    };
    let losses = Mutex::new(Vec::new());
    let faults = |d: &Deployed, go: Instant| -> Result<()> {
        std::thread::sleep(Duration::from_secs_f64(first_at));
        lose(d, 1)?;
        if let Ok(mut l) = losses.lock() {
            l.push(Instant::now());
        }
        let at = go.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_secs_f64((second_at - at).max(0.0)));
        lose(d, 2)?;
        if let Ok(mut l) = losses.lock() {
            l.push(Instant::now());
        }
        Ok(())
    };
    let measured = wait_for_leaders(&d, Duration::from_secs(60)).and_then(|_| {
        let watch = LeaderWatch::start(&d)?;
        let load = run_load_with(&d, exe, chunks, secs, Some(&faults));
        Ok((load?, watch.stop()))
    });
    d.stop();
    let (load, leaders) = measured?;
    let losses = losses.into_inner().unwrap_or_default();
    // Each group's first leader of a later term after each loss: how long elections took.
    let mut elections = Vec::new();
    for (k, lost) in losses.iter().enumerate() {
        let mut per_group = serde_json::Map::new();
        for ((role, g), seen) in &leaders {
            let before = seen
                .iter()
                .filter(|(t, _)| t <= lost)
                .map(|(_, term)| *term)
                .max()
                .unwrap_or(0);
            let after = seen
                .iter()
                .find(|(t, term)| t > lost && *term > before)
                .map(|(t, _)| (t.duration_since(*lost).as_secs_f64() * 10.0).round() / 10.0);
            per_group.insert(format!("{role}-{g}"), json!(after));
        }
        tracing::info!(
            "  centre {} lost: new leaders after (s): {per_group:?}",
            k + 1
        );
        elections.push(serde_json::Value::Object(per_group));
    }
    let buckets = (secs / SERIES_S).ceil() as usize;
    let mut per = vec![0u64; buckets];
    for r in &load.results {
        for (b, n) in r.series.iter().enumerate().take(buckets) {
            per[b] += n;
        }
    }
    let rate = |b: usize| per[b] as f64 / SERIES_S;
    let params = json!({
        "centres": CENTRES, "replicas": CENTRES, "shards": SHARDS, "coordinators": SHARDS,
        "emulated_hosts": hosts, "host_cpu_cores": share,
        "lost": "every host of the centre cut off and its processes frozen",
        "centre_1_lost_at_s": first_at, "centre_2_lost_at_s": second_at,
    });
    for (b, _) in per.iter().enumerate() {
        rec.add(
            "dc_failover_tx_per_s",
            rate(b),
            "transactions/s",
            json!({ "t_s": b as f64 * SERIES_S, "window_s": SERIES_S }),
            None,
            None,
        );
    }
    // Each loss: the rate before it (from 1 s, or from the previous loss's recovery), and the
    // time until a window at half of that again (the last window, a partial one, not counted).
    let mut from = (1.0 / SERIES_S) as usize;
    let mut first_before = None;
    for (i, at) in [first_at, second_at].into_iter().enumerate() {
        let b0 = (at / SERIES_S) as usize;
        let mut before =
            (from..b0).map(rate).sum::<f64>() / (b0.saturating_sub(from)).max(1) as f64;
        // A loss during the previous one's dip is measured against the rate before that one.
        let in_previous_dip = first_before.is_some_and(|f: f64| before < 0.5 * f || from >= b0);
        if in_previous_dip {
            before = first_before.unwrap_or(before);
        }
        first_before.get_or_insert(before);
        // Two whole windows in a row at half the rate before, after the one the loss fell in
        // (which still holds completions from before it).
        let recovered = (b0 + 1..buckets.saturating_sub(2))
            .find(|b| rate(*b) >= 0.5 * before && rate(*b + 1) >= 0.5 * before);
        let recovery = match recovered {
            Some(b) => ((b as f64 + 1.0) * SERIES_S - at).max(0.0),
            None => secs - at,
        };
        rec.add(
            "dc_failover_recovery_s",
            recovery,
            "s",
            json!({
                "centre": i + 1, "lost_at_s": at, "rate_before_tx_per_s": before,
                "during_previous_dip": in_previous_dip,
                "recovered": recovered.is_some(), "target_s": 5,
                "new_leader_after_s": elections.get(i),
                "recovered_when": "the end of the first of two half seconds in a row at >= 50 % of the rate before, from the window after the loss's",
            }),
            Some(Reference {
                value: 15.0,
                source: format!(
                    "{HAMILTON} Fig. 5: throughput reduced for under 15 s per data-centre loss"
                ),
            }),
            None,
        );
        if let Some(b) = recovered {
            from = b + 1;
        }
    }
    let acked: u64 = load.results.iter().map(|r| r.acked).sum();
    rec.add(
        "dc_failover_lost_tx",
        load.results.iter().map(|r| r.lost).sum::<u64>() as f64,
        "transactions",
        json!({ "acknowledged": acked, "in_doubt_batches": load.results.iter().map(|r| r.errors).sum::<u64>() }),
        Some(Reference {
            value: 0.0,
            source: format!("{HAMILTON} Fig. 5: no data loss"),
        }),
        None,
    );
    rec.add(
        "dc_failover_double_spend_accepted",
        load.results.iter().map(|r| r.double_spends).sum::<u64>() as f64,
        "transactions",
        params,
        None,
        None,
    );
    Ok(())
}

/// Watches every shard and coordinator member during a failover run: each member is asked
/// for its state every 100 ms (a frozen one times out), and each time one says it leads, the
/// time and term are kept per group.
struct LeaderWatch {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, u16, std::thread::JoinHandle<Sightings>)>,
}

/// When a member said it leads, and in which term.
type Sightings = Vec<(Instant, u64)>;

impl Drop for LeaderWatch {
    /// A run that failed stops its watchers too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl LeaderWatch {
    fn start(d: &Deployed) -> Result<LeaderWatch> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (role, g, peer) in member_peers(d, Duration::from_millis(500))? {
            let stop = stop.clone();
            let h = std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Response::Status(s)) = peer.call(&Request::Status) {
                        if s.raft.state == "leader" {
                            seen.push((Instant::now(), s.raft.term));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                seen
            });
            let role = if role == Role::Shard {
                "shard"
            } else {
                "coord"
            };
            threads.push((role.to_string(), g, h));
        }
        Ok(LeaderWatch { stop, threads })
    }

    /// Every group's sightings of a leader, in time order.
    fn stop(mut self) -> BTreeMap<(String, u16), Sightings> {
        self.stop.store(true, Ordering::Relaxed);
        let mut out: BTreeMap<(String, u16), Sightings> = BTreeMap::new();
        for (role, g, h) in std::mem::take(&mut self.threads) {
            if let Ok(seen) = h.join() {
                out.entry((role, g)).or_default().extend(seen);
            }
        }
        for v in out.values_mut() {
            v.sort_by_key(|(t, _)| *t);
        }
        out
    }
}

/// `cluster_r3_vs_single_ratio` on equal hosts: one shard of 3 replicas (and a coordinator
/// group of 3), each on its own host, against the single-node embedded engine on one host of
/// the same share; each fed by one load generator on a host of its own, over the same RPC.
/// The share fills the machine with the cluster's 7 hosts. Median of `pairs` pairs of runs,
/// which side goes first alternating.
fn replication_vs_single(
    rec: &mut Recorder,
    exe: &Path,
    cores: usize,
    pairs: usize,
    secs: f64,
    chunks: u64,
) -> Result<()> {
    let share = cores as f64 / (2 * REPLICAS + 1) as f64;
    let one = |engine: bool| -> Result<(f64, f64)> {
        let d = if engine {
            deploy_engine(exe, share)?
        } else {
            deploy_cluster(exe, 1, REPLICAS, 1, Design::OnePhase, share)?
        };
        let measured = wait_for_leaders(&d, Duration::from_secs(60))
            .and_then(|_| run_load(&d, exe, chunks, secs));
        d.stop();
        let l = measured?;
        Ok((l.rate, l.engine_cpu_s * 1e6 / l.count.max(1) as f64))
    };
    let (mut ratios, mut singles, mut clusters) = (Vec::new(), Vec::new(), Vec::new());
    let mut cpu = (Vec::new(), Vec::new());
    for k in 0..pairs {
        let ((s, sc), (c, cc)) = if k % 2 == 0 {
            let s = one(true)?;
            (s, one(false)?)
        } else {
            let c = one(false)?;
            (one(true)?, c)
        };
        tracing::info!(
            "  pair {}: single {s:.0}/s, cluster {c:.0}/s, ratio {:.3}",
            k + 1,
            c / s
        );
        ratios.push(c / s.max(1e-9));
        singles.push(s);
        clusters.push(c);
        cpu.0.push(sc);
        cpu.1.push(cc);
    }
    rec.add(
        "cluster_hosts_single_engine_tx_per_s",
        median(&singles),
        "transactions/s",
        json!({ "host_cpu_cores": share, "pairs": pairs, "cpu_us_per_tx": median(&cpu.0), "what": "the embedded engine as one process on its own host, fed over the cluster's RPC by a load generator on its own host" }),
        None,
        None,
    );
    rec.add(
        "cluster_r3_vs_single_ratio",
        median(&ratios),
        "ratio",
        json!({
            "shards": 1, "replicas": REPLICAS, "coordinators": 1, "emulated_hosts": true,
            "host_cpu_cores": share, "target": 0.5, "pairs": pairs,
            "min": ratios.iter().copied().fold(f64::INFINITY, f64::min),
            "max": ratios.iter().copied().fold(0.0, f64::max),
            "single_tx_per_s_median": median(&singles),
            "cluster_tx_per_s_median": median(&clusters),
            "single_cpu_us_per_tx": median(&cpu.0),
            "cluster_cpu_us_per_tx": median(&cpu.1),
            "how": "each replica and coordinator replica on its own emulated host, the single engine on one host of the same share, each fed by a load generator on its own host; median over pairs, alternately first",
        }),
        None,
        Some(Reference {
            value: 1.0,
            source: "single-node embedded engine on one host of the same share, same run".into(),
        }),
    );
    Ok(())
}

/// Signed transactions per HTTP request of the end-to-end load generators
/// (`POST /v1/ledger/batch`, as a payment provider sends them).
const E2E_BATCH: usize = 100;

/// The end-to-end row: signed 2-in/2-out transfers from load generators through
/// signature-checking sentinels, each on a host of its own, into a cluster of `shards` shard
/// groups and as many coordinator groups at replication 3, every host with the same share.
/// Deployed with `florin cluster up --emulate-hosts` itself (TLS, the sentinels' authority
/// group, everything as an operator gets it); the sentinels' per-address rate limits are
/// lifted in their `node.toml` (`[limits]`), as behind a load balancer, because each load
/// generator is one address. Reports the sentinels' CPU per transaction
/// (`sentinel_cpu_us_per_tx`), beside the signature and balance checks alone measured in this
/// process in the same run, so the sentinel tier's size for a throughput is known.
fn sentinels_e2e(
    rec: &mut Recorder,
    exe: &Path,
    cores: usize,
    scale: Scale,
    quick: bool,
    share: Option<f64>,
) -> Result<()> {
    // (shards, sentinels): two sentinels per shard group, one load generator per sentinel.
    let sizes: &[(usize, usize)] = if quick {
        &[(1, 2)]
    } else if scale.full {
        &[(2, 4), (4, 8)]
    } else {
        &[(2, 4)]
    };
    let secs = if quick { 4.0 } else { 10.0 };
    for &(shards, sentinels) in sizes {
        sentinels_e2e_at(rec, exe, cores, shards, sentinels, secs, share)?;
    }
    Ok(())
}

/// One size of [`sentinels_e2e`]; every host gets `share`, by default the machine's cores
/// over this size's hosts.
fn sentinels_e2e_at(
    rec: &mut Recorder,
    exe: &Path,
    cores: usize,
    shards: usize,
    sentinels: usize,
    secs: f64,
    share: Option<f64>,
) -> Result<()> {
    let hosts = 2 * shards * REPLICAS + 2 * sentinels;
    let share = share.unwrap_or(cores as f64 / hosts as f64);
    // More signed transactions than a sentinel could check in the window at 60 K/s per core
    // (the checks alone run at about 37 K/s per core here): no generator runs out.
    // Capped for machines with many cores (a generator that runs out says so).
    let per_gen = ((share * secs * 60_000.0) as usize).clamp(2 * E2E_BATCH, 250_000);
    tracing::info!(
        "end to end: {shards} shard group(s) and {shards} coordinator group(s) x {REPLICAS}, \
         {sentinels} sentinels, {sentinels} load generators: {hosts} emulated hosts of {share:.3} core(s); \
         {per_gen} signed transfers per generator, {E2E_BATCH} per request, {secs} s"
    );
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("cluster");
    let logs = dir.path().to_path_buf();
    let up = |what: &str| -> Result<()> {
        let log_path = logs.join(format!("cluster-up-{what}.log"));
        let status = std::process::Command::new(exe)
            .args(["cluster", "up", "--data"])
            .arg(&data)
            .args(["--shards", &shards.to_string()])
            .args(["--replicas", &REPLICAS.to_string()])
            .args(["--coordinators", &shards.to_string()])
            .args(["--sentinels", &sentinels.to_string()])
            .args(["--emulate-hosts", "--host-cpu", &share.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path)?)
            .status()
            .context("running florin cluster up")?;
        if !status.success() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(4).collect();
            bail!(
                "`florin cluster up` failed: {}",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            );
        }
        Ok(())
    };
    let first = up("create");
    // Whatever `up` made is removed when this run ends, even if it failed part-way.
    let hosts_file = data.join("hosts.toml");
    let net = match HostNet::load(&hosts_file) {
        Ok(net) => HostNetGuard::new(net),
        Err(e) => {
            first?;
            return Err(e.into());
        }
    };
    first?;
    let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
    // Every replica and sentinel `cluster up` wrote, each with its directory.
    let members = deploy::processes(&data, &spec);
    let sentinel_dirs: Vec<PathBuf> = members
        .iter()
        .filter(|(role, ..)| *role == Role::Sentinel)
        .map(|(.., dir)| dir.clone())
        .collect();
    if sentinel_dirs.len() != sentinels {
        bail!(
            "cluster up wrote {} sentinels, not {sentinels}",
            sentinel_dirs.len()
        );
    }
    let observer = florin_node::load_key(&data.join("client.key"))?;
    let mut d = Deployed {
        _dir: dir,
        net,
        spec,
        members,
        loadgens: Vec::new(),
        observer: Arc::new(LocalSigner::new(observer)),
        http: Vec::new(),
    };
    let measured = sentinel_load(&mut d, exe, &data, &sentinel_dirs, per_gen, secs, &up);
    d.stop();
    let (load, check_us) = measured?;
    let Load {
        rate,
        mut latencies,
        engine_cpu_s,
        loadgen_cpu_s,
        sentinel_cpu_s,
        count,
        secs: window,
        busiest,
        elections,
        ..
    } = load;
    if count == 0 {
        bail!("no signed transaction was confirmed end to end");
    }
    let per_tx = |cpu: f64| cpu * 1e6 / count as f64;
    let sentinel_us = per_tx(sentinel_cpu_s);
    let engine_us = per_tx(engine_cpu_s);
    let params = json!({
        "shards": shards, "replicas": REPLICAS, "coordinators": shards, "sentinels": sentinels,
        "load_generators": sentinels, "emulated_hosts": hosts, "host_cpu_cores": share,
        "io": "2-in/2-out, signed (ed25519)", "api": format!("POST /v1/ledger/batch over TLS, {E2E_BATCH} per request, {CLIENTS} connections per generator"),
        "commit": "one-phase where a transaction lies on one shard (cluster up's default)",
        "transactions": count, "window_s": window, "elections_during_run": elections,
        "busiest_hosts": busiest.iter().map(|(h, u)| json!({ "host": h, "share_used": (u * 100.0).round() / 100.0 })).collect::<Vec<_>>(),
    });
    rec.add(
        "cluster_hosts_e2e_tx_per_s",
        rate,
        "transactions/s",
        params.clone(),
        Some(Reference {
            value: 1_700_000.0,
            source: format!(
                "{HAMILTON} Fig. 4: peak with signed 2-in/2-out transactions through sentinels, many machines"
            ),
        }),
        None,
    );
    for p in [0.5, 0.99] {
        rec.add(
            "cluster_hosts_e2e_request_latency_ms",
            percentile(&mut latencies, p),
            "ms",
            json!({ "percentile": (p * 100.0) as u32, "transactions_per_request": E2E_BATCH, "sentinels": sentinels, "shards": shards }),
            Some(Reference {
                value: if p < 0.9 { 500.0 } else { 1000.0 },
                source: format!("{HAMILTON} Fig. 4: p50 under 500 ms, p99 under 1 s per transaction at peak"),
            }),
            None,
        );
    }
    rec.add(
        "sentinel_cpu_us_per_tx",
        sentinel_us,
        "µs",
        json!({
            "what": "CPU of every sentinel host (cpuacct) per confirmed transaction: TLS, HTTP, decoding, signature and balance checks, compaction, the cluster client",
            "cores_per_100k_tx_per_s": sentinel_us * 0.1,
            "engine_cpu_us_per_tx": engine_us,
            "sentinel_vs_engine_cpu": sentinel_us / engine_us.max(1e-9),
            "loadgen_cpu_us_per_tx": per_tx(loadgen_cpu_s),
            "checks_alone_us_per_tx": check_us,
            "sentinels": sentinels, "host_cpu_cores": share, "shards": shards,
        }),
        None,
        Some(Reference {
            value: check_us,
            source: "signature and balance checks alone on the same transactions (validate_many, one thread of this process, batches of 100, best of 2), same run".into(),
        }),
    );
    Ok(())
}

/// The end-to-end run on a deployed cluster: lifts the sentinels' per-address limits and
/// restarts them, adds a load-generator host per sentinel, mints the inputs through the API
/// (the issuer's key from the cluster directory), signs the transfers here (outside the
/// hosts' shares) and runs the load. Returns it with the checks-alone cost (µs per
/// transaction, one thread).
fn sentinel_load(
    d: &mut Deployed,
    exe: &Path,
    data: &Path,
    sentinel_dirs: &[PathBuf],
    per_gen: usize,
    secs: f64,
    up: &dyn Fn(&str) -> Result<()>,
) -> Result<(Load, f64)> {
    for dir in sentinel_dirs {
        let mut cfg = NodeConfig::load(&dir.join("node.toml"))?;
        cfg.limits = Some(florin_node::api::RateLimits {
            per_ip_per_sec: 0,
            per_ip_tx_per_sec: 0,
            ..Default::default()
        });
        deploy::write_node(dir, &cfg, &florin_node::load_key(&cfg.key)?)?;
    }
    for dir in sentinel_dirs {
        if let Some(pid) = deploy::pid_of(dir) {
            deploy::signal(pid, "KILL");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while sentinel_dirs.iter().any(|s| deploy::pid_of(s).is_some()) {
        if Instant::now() > deadline {
            bail!("a sentinel did not stop");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    up("restart")?;
    let ca = data.join("tls").join(florin_http::tls::CA_CERT_FILE);
    let tls = Arc::new(florin_http::ClientTls::from_ca_file(&ca)?.rustls_config()?);
    let mut addrs = Vec::new();
    for dir in sentinel_dirs {
        let cfg = NodeConfig::load(&dir.join("node.toml"))?;
        addrs.push(
            cfg.http
                .ok_or_else(|| anyhow!("a sentinel without an API address"))?,
        );
    }
    for i in 0..sentinel_dirs.len() {
        let name = format!("loadgen-{i}");
        d.net.0.add(&name)?;
        d.net.0.save(&data.join("hosts.toml"))?;
        let dir = data.join(&name);
        std::fs::create_dir_all(&dir)?;
        let key = SecretKey::generate(&mut rand::rngs::OsRng);
        florin_node::write_private(&dir.join("identity.key"), key.to_hex().as_bytes())?;
        d.loadgens.push(dir);
    }
    // The inputs, minted through the sentinels in turn; then the transfers, signed here.
    let issuer = LocalSigner::new(florin_node::load_key(&data.join("issuer.key"))?);
    let mut turn = 0usize;
    let mut mint = |m: florin_ledger::Mint| -> Result<()> {
        let addr = addrs[turn % addrs.len()];
        turn += 1;
        let tx = florin_ledger::Transaction::Mint(m).encode();
        let run = drive_until(Target::Tls(addr, tls.clone()), &[tx], Api::Single, 1, None)?;
        if run.confirmed != 1 {
            bail!("a benchmark mint was not confirmed");
        }
        Ok(())
    };
    let t = Instant::now();
    let w = signed_workload(&issuer, &mut mint, per_gen * addrs.len(), 0, 0, 7)?;
    tracing::info!(
        "  minted and signed {} transfers in {:.1} s",
        w.txs.len(),
        t.elapsed().as_secs_f64()
    );
    // The checks alone, on one thread of this process (no share), on the same transactions.
    let sample: Vec<florin_ledger::Transaction> = w
        .txs
        .iter()
        .take(4096)
        .map(|b| florin_ledger::Transaction::decode(b))
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow!("{e:?}"))?;
    let refs: Vec<&florin_ledger::Transaction> = sample.iter().collect();
    // In batches of a request's size; the faster of two passes (the first warms up).
    let mut check_us = f64::INFINITY;
    for _ in 0..2 {
        let t = Instant::now();
        let ok = refs
            .chunks(E2E_BATCH)
            .map(|c| {
                florin_ledger::validate::validate_many(
                    c,
                    &issuer.public_key(),
                    &mut rand::rngs::OsRng,
                )
                .iter()
                .filter(|r| r.is_ok())
                .count()
            })
            .sum::<usize>();
        check_us = check_us.min(t.elapsed().as_secs_f64() * 1e6 / refs.len().max(1) as f64);
        if ok != refs.len() {
            bail!(
                "{} benchmark transfers failed their own checks",
                refs.len() - ok
            );
        }
    }
    for (i, (chunk, addr)) in w.txs.chunks(per_gen).zip(&addrs).enumerate() {
        let path = d.loadgens[i].join("txs.bin");
        let mut bytes = Vec::new();
        for tx in chunk {
            bytes.extend_from_slice(&(tx.len() as u32).to_le_bytes());
            bytes.extend_from_slice(tx);
        }
        std::fs::write(&path, bytes)?;
        d.http.push(HttpLoad {
            addr: *addr,
            ca: ca.clone(),
            txs: path,
        });
    }
    Ok((run_load(d, exe, 0, secs)?, check_us))
}

/// The soak on emulated hosts (`florin bench soak --emulate-hosts`): one shard group and one
/// coordinator group of 3 replicas, each replica its own process on its own host, and one
/// load generator on a host of its own running the soak's transfers (see [`super::soak`]).
/// At each reading the resident memory of every process is read apart (`VmRSS` from `/proc`),
/// with the txids the shard's replicas remember; each process's growth from the reading
/// before the last to the last is reported, and the largest as `soak_rss_growth_ratio`.
pub(super) fn soak_on_hosts(rec: &mut Recorder, quick: bool) -> Result<()> {
    florin_node::hosts::check_supported()?;
    florin_node::hosts::remove_on_signal();
    let exe = std::env::current_exe().context("cannot find the florin binary")?;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let (marks, slots, ttl) = super::soak::shape(quick)?;
    // A batch's round trip on hosts this small can take a second: transfers valid at least
    // 5 s, so none expires before it is applied.
    let ttl = ttl.max(super::soak::TTL_SECS);
    let hosts = 2 * REPLICAS + 1;
    let share = cores as f64 / hosts as f64;
    tracing::info!(
        "soak on emulated hosts: 1 shard and 1 coordinator group x {REPLICAS}, 1 load generator: \
         {hosts} hosts of {share:.3} core(s); {slots} coins, transfers valid {ttl} s; readings after {marks:?}"
    );
    let d = deploy_cluster(&exe, 1, REPLICAS, 1, Design::OnePhase, share)?;
    let measured = wait_for_leaders(&d, Duration::from_secs(60))
        .and_then(|_| soak_readings(&d, &exe, &marks, slots, ttl));
    d.stop();
    let (readings, rate) = measured?;
    let engine = "cluster on emulated hosts";
    let mut growth: Vec<(String, f64)> = Vec::new();
    let processes: Vec<String> = readings
        .first()
        .map(|(_, per, _)| per.iter().map(|(p, _)| p.clone()).collect())
        .unwrap_or_default();
    for (k, process) in processes.iter().enumerate() {
        for (n, per, remembered) in &readings {
            let rss = per.get(k).map_or(0.0, |(_, r)| *r);
            rec.add(
                "soak_rss_mb",
                rss,
                "MiB",
                json!({
                    "engine": engine, "process": process, "after_tx": n, "coins": slots,
                    "ttl_s": ttl, "host_cpu_cores": share, "shard_txids_remembered": remembered,
                }),
                None,
                None,
            );
        }
        if let [.., (_, mid, _), (_, last, _)] = readings.as_slice() {
            let (m, l) = (
                mid.get(k).map_or(0.0, |(_, r)| *r),
                last.get(k).map_or(0.0, |(_, r)| *r),
            );
            growth.push((process.clone(), l / m.max(1.0)));
        }
    }
    if let (Some((worst, g)), [.., (n1, _, _), (n2, _, _)]) = (
        growth.iter().max_by(|a, b| a.1.total_cmp(&b.1)),
        readings.as_slice(),
    ) {
        rec.add(
            "soak_rss_growth_ratio",
            *g,
            "ratio",
            json!({
                "engine": engine, "from_tx": n1, "to_tx": n2, "target": "<= 1.10",
                "process": worst, "what": "the largest growth of any one process",
                "every_process": growth.iter().map(|(p, g)| json!({ "process": p, "growth": (g * 1000.0).round() / 1000.0 })).collect::<Vec<_>>(),
            }),
            None,
            None,
        );
    }
    for (n, _, remembered) in &readings {
        rec.add(
            "soak_remembered_txids",
            *remembered as f64,
            "txids",
            json!({ "engine": engine, "after_tx": n, "ttl_s": ttl, "what": "the most any shard replica remembers" }),
            None,
            None,
        );
    }
    rec.add(
        "soak_tx_per_s",
        rate,
        "transactions/s",
        json!({ "engine": engine, "host_cpu_cores": share }),
        None,
        None,
    );
    Ok(())
}

/// One soak reading on emulated hosts: transactions, each process's resident MiB, the most
/// txids a shard replica remembers.
type HostReading = (u64, Vec<(String, f64)>, u64);

/// Runs the soak's load generator and reads every process at each of its marks.
fn soak_readings(
    d: &Deployed,
    exe: &Path,
    marks: &[u64],
    slots: u64,
    ttl: u64,
) -> Result<(Vec<HostReading>, f64)> {
    let dir = d
        .loadgens
        .first()
        .ok_or_else(|| anyhow!("no load generator host"))?;
    let cfg = LoadgenConfig {
        cluster: dir.join("../cluster.toml"),
        key: dir.join("identity.key"),
        first_chunk: 0,
        chunks: 0,
        clients: CLIENTS,
        batch: BATCH,
        secs: 0.0,
        failover: false,
        http: None,
        soak: Some(SoakLoad {
            marks: marks.to_vec(),
            slots,
            ttl,
        }),
    };
    let path = dir.join("loadgen.json");
    std::fs::write(&path, serde_json::to_vec(&cfg)?)?;
    let mut cmd = d.net.0.command("loadgen-0", exe)?;
    cmd.args(["bench", "cluster", "--loadgen"]).arg(&path);
    let mut g = LineChild::spawn(cmd, dir.join("loadgen.log"), "the soak load generator")?;
    let shard_peers: Vec<Peer> = d.spec.shards[0]
        .members
        .iter()
        .filter_map(|m| {
            let key = PublicKey::parse(&m.key).ok()?;
            Some(Peer::new(
                m.addr.clone(),
                key,
                d.observer.clone(),
                Duration::from_secs(2),
            ))
        })
        .collect();
    let mut readings = Vec::new();
    loop {
        let line = g.line()?;
        if let Some(n) = line.strip_prefix("mark ") {
            let n: u64 = n.parse().context("a soak mark")?;
            let mut per = Vec::new();
            for (role, group, id, mdir) in &d.members {
                let name = deploy::host_name(*role, *group, *id);
                // A process that died (an out-of-memory kill, say) fails the soak.
                let pid = deploy::pid_of(mdir)
                    .ok_or_else(|| anyhow!("{name} is not running after {n} transactions"))?;
                let rss = super::soak::rss_mib_of(Some(pid));
                if rss <= 0.0 {
                    bail!("cannot read {name}'s memory (pid {pid})");
                }
                per.push((name, rss));
            }
            per.push((
                "loadgen-0".to_string(),
                super::soak::rss_mib_of(Some(g.id())),
            ));
            let remembered = shard_peers
                .iter()
                .filter_map(|p| match p.call(&Request::Status) {
                    Ok(Response::Status(s)) => Some(s.remembered),
                    _ => None,
                })
                .max()
                .unwrap_or(0);
            tracing::info!(
                "  after {n} transactions: {} (shard remembers {remembered} txids)",
                per.iter()
                    .map(|(p, r)| format!("{p} {r:.0} MiB"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            readings.push((n, per, remembered));
        } else if let Some(rate) = line.strip_prefix("done ") {
            return Ok((readings, rate.parse().context("the soak's rate")?));
        } else {
            bail!("the soak load generator said {line:?}");
        }
    }
}

/// The soak's load generator: [`super::soak::soak`] against the cluster, a `mark N` line as
/// each reading's count is passed (the parent reads every process then), `done RATE` at the
/// end.
fn soak_loadgen(cfg: &LoadgenConfig, s: &SoakLoad) -> Result<ExitCode> {
    let spec = ClusterSpec::load(&cfg.cluster)?;
    let me = Arc::new(LocalSigner::new(florin_node::load_key(&cfg.key)?));
    let store = ClusterStore::new(&spec, me)?;
    let out = Mutex::new(std::io::stdout());
    let read = |n: u64| {
        if let Ok(mut o) = out.lock() {
            let _ = writeln!(o, "mark {n}");
            let _ = o.flush();
        }
        (0.0, 0)
    };
    let (_, rate) = super::soak::soak(&store, s.slots, &s.marks, s.ttl, &read)?;
    let mut o = out.lock().map_err(|_| anyhow!("stdout"))?;
    writeln!(o, "done {rate}")?;
    o.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// An end-to-end load generator: its signed transactions in batches over TLS to its sentinel,
/// from `clients` connections, for `secs`.
fn http_loadgen(cfg: &LoadgenConfig, h: &HttpLoad) -> Result<ExitCode> {
    let bytes = std::fs::read(&h.txs)?;
    let mut txs = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| anyhow!("{}: cut at {at}", h.txs.display()))? as usize;
        let tx = bytes
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| anyhow!("{}: cut at {at}", h.txs.display()))?;
        txs.push(tx.to_vec());
        at += 4 + len;
    }
    let tls = Arc::new(florin_http::ClientTls::from_ca_file(&h.ca)?.rustls_config()?);
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let until = Instant::now() + Duration::from_secs_f64(cfg.secs);
    let batch = cfg.batch.max(1);
    let run = drive_until(
        Target::Tls(h.addr, tls),
        &txs,
        Api::Batch(batch),
        cfg.clients,
        Some(until),
    )?;
    if run.state_invalid > 0 {
        bail!("{} valid transfers were refused", run.state_invalid);
    }
    let result = LoadgenResult {
        count: run.confirmed as u64,
        elapsed_s: run.seconds,
        // One per request (each transaction of a request waited as long).
        latencies_ms: run
            .latencies_us
            .iter()
            .step_by(batch)
            .map(|us| *us as f64 / 1e3)
            .collect(),
        ran_out: run.confirmed >= txs.len(),
        series: Vec::new(),
        acked: 0,
        lost: 0,
        double_spends: 0,
        errors: 0,
        tries: None,
    };
    writeln!(out, "{}", serde_json::to_string(&result)?)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `florin bench cluster --loadgen FILE`: one load generator on its host (see the module).
pub(super) fn loadgen(path: &Path) -> Result<ExitCode> {
    let cfg: LoadgenConfig = serde_json::from_slice(&std::fs::read(path)?)?;
    if let Some(h) = &cfg.http {
        return http_loadgen(&cfg, h);
    }
    if let Some(s) = &cfg.soak {
        return soak_loadgen(&cfg, s);
    }
    let spec = ClusterSpec::load(&cfg.cluster)?;
    let me = Arc::new(LocalSigner::new(florin_node::load_key(&cfg.key)?));
    // The two-phase store keeps its batched lookup for the failover check; the atomizer's is
    // the sentinel's store over blocks.
    let two_phase = match spec.architecture {
        Architecture::TwoPhase => Some(Arc::new(ClusterStore::new(&spec, me.clone())?)),
        Architecture::Atomizer => None,
    };
    let atomizer = match (&spec.architecture, &spec.atomizer) {
        (Architecture::Atomizer, Some(a)) => Some(Arc::new(AtomizerStore::new(
            spec.map()?,
            spec.clients_of(&spec.shards, &me),
            spec.clients_of(std::slice::from_ref(a), &me).remove(0),
        )?)),
        _ => None,
    };
    let store: Arc<dyn SwapStore> = match (&two_phase, &atomizer) {
        (Some(c), _) => c.clone(),
        (None, Some(a)) => a.clone(),
        (None, None) => bail!("an atomizer cluster without an [atomizer] group"),
    };
    // Two mints (2,000 outputs over every shard) per submission: at a small CPU share a
    // larger one can outlast the cluster client's patience.
    let submitted = Arc::new(AtomicU64::new(0));
    for chunk in preload_range(cfg.first_chunk, cfg.chunks).chunks(2) {
        submitted.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        let out = store.swap(chunk)?;
        if out.iter().any(|o| *o != SwapOutcome::Confirmed) {
            bail!("a preload mint was refused: {out:?}");
        }
    }
    let mut out = std::io::stdout();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    // Transfers `k` spend ids `2k, 2k+1`: this generator's are `first_chunk*500 ..`.
    let first = cfg.first_chunk * 500;
    let end = (cfg.first_chunk + cfg.chunks) * 500;
    let next = Arc::new(AtomicU64::new(first));
    let ran_out = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let began = Instant::now();
    let stop_at = began + Duration::from_secs_f64(cfg.secs);
    let mut threads = Vec::new();
    for _ in 0..cfg.clients {
        let (store, next, ran_out, count, lat, tally, submitted) = (
            store.clone(),
            next.clone(),
            ran_out.clone(),
            count.clone(),
            lat.clone(),
            tally.clone(),
            submitted.clone(),
        );
        let (batch, failover) = (cfg.batch as u64, cfg.failover);
        let in_doubt_counts = failover || atomizer.is_some();
        threads.push(std::thread::spawn(move || -> Result<()> {
            while Instant::now() < stop_at {
                let k = next.fetch_add(batch, Ordering::Relaxed);
                if k + batch > end {
                    ran_out.store(true, Ordering::Relaxed);
                    break;
                }
                let mut txs = workload(batch, k);
                if failover {
                    // A conflicting spend of the batch's first inputs: it must never commit
                    // beside the first transaction.
                    let mut evil = txs[0].clone();
                    evil.txid[0] ^= 0xff;
                    evil.outputs = vec![(evil.txid, 20)];
                    txs.push(evil);
                }
                let t = Instant::now();
                submitted.fetch_add(txs.len() as u64, Ordering::Relaxed);
                let out = match store.swap(&txs) {
                    Ok(out) => out,
                    // Under faults a batch may find no coordinator within the client's
                    // patience, and an overloaded atomizer may not decide one within the
                    // sentinel's deadline: in doubt, counted, and not acknowledged.
                    Err(_) if in_doubt_counts => {
                        if let Ok(mut t) = tally.lock() {
                            t.errors += 1;
                        }
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                };
                let at = began.elapsed().as_secs_f64();
                if failover {
                    let applied = |o: &SwapOutcome| {
                        matches!(o, SwapOutcome::Confirmed | SwapOutcome::AlreadyApplied)
                    };
                    if let Ok(mut t) = tally.lock() {
                        let n = batch as usize;
                        if applied(&out[0]) && applied(&out[n]) {
                            t.double_spends += 1;
                        }
                        let ok = out[..n].iter().filter(|o| applied(o)).count();
                        let bucket = (at / SERIES_S) as usize;
                        if t.series.len() <= bucket {
                            t.series.resize(bucket + 1, 0);
                        }
                        t.series[bucket] += ok as u64;
                        for (tx, o) in txs.iter().zip(&out) {
                            if applied(o) {
                                t.acked.push(tx.txid);
                            }
                        }
                    }
                    continue;
                }
                if out.iter().any(|o| *o != SwapOutcome::Confirmed) {
                    bail!("a benchmark transaction was refused");
                }
                if Instant::now() <= stop_at {
                    count.fetch_add(batch, Ordering::Relaxed);
                    if let Ok(mut l) = lat.lock() {
                        l.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            Ok(())
        }));
    }
    for t in threads {
        t.join()
            .map_err(|_| anyhow!("a client thread panicked"))??;
    }
    let elapsed = began.elapsed().as_secs_f64().min(cfg.secs);
    let tally = tally.lock().map(|t| t.clone()).unwrap_or_default();
    // After the faults: is every acknowledged transaction there?
    let lost = if cfg.failover {
        let found = match &two_phase {
            Some(c) => c.confirmed_many(&tally.acked)?,
            None => tally
                .acked
                .iter()
                .map(|t| store.is_confirmed(t))
                .collect::<Result<Vec<bool>, _>>()?,
        };
        found.iter().filter(|f| !**f).count() as u64
    } else {
        0
    };
    let result = LoadgenResult {
        count: count.load(Ordering::Relaxed).max(tally.series.iter().sum()),
        elapsed_s: elapsed,
        latencies_ms: lat.lock().map(|l| l.clone()).unwrap_or_default(),
        ran_out: ran_out.load(Ordering::Relaxed),
        series: tally.series,
        acked: tally.acked.len() as u64,
        lost,
        double_spends: tally.double_spends,
        errors: tally.errors,
        tries: atomizer
            .as_ref()
            .map(|a| (a.tries(), submitted.load(Ordering::Relaxed))),
    };
    writeln!(out, "{}", serde_json::to_string(&result)?)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// What a load generator in failover mode counts.
#[derive(Default, Clone)]
struct Tally {
    /// Acknowledged transactions per [`SERIES_S`], by completion time.
    series: Vec<u64>,
    acked: Vec<florin_crypto::Digest>,
    double_spends: u64,
    errors: u64,
}

/// The failover run's throughput window.
const SERIES_S: f64 = 0.5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_counts_every_interface_but_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:     500       5    0    0    0     0          0         0      500       5    0    0    0     0       0          0\n  \
             eth0:   10000      20    0    0    0     0          0         0    30000      40    0    0    0     0       0          0\n  \
             veth1:    100       1    0    0    0     0          0         0      300       3    0    0    0     0       0          0\n";
        assert_eq!(parse_net_dev(text), Some((10_100, 21, 30_300, 43)));
        // A cut line is refused, not read as zeros.
        assert_eq!(parse_net_dev("h\nh\n  eth0: 1 2 3\n"), None);
        assert_eq!(parse_net_dev("h\nh\n  eth0 1 2 3\n"), None);
    }

    #[test]
    fn stat_ticks_are_read_after_a_command_with_spaces_and_parentheses() {
        let text =
            "42 (flo rin) (x)) S 1 42 42 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_stat_ticks(text), Some((1234, 567)));
        assert_eq!(parse_stat_ticks("42 (florin) S 1 2"), None);
        assert_eq!(parse_stat_ticks("42 (florin)"), None);
        assert_eq!(parse_stat_ticks(""), None);
        // This process's own files parse.
        assert!(proc_ticks(std::process::id()).is_some());
        assert!(netns_bytes(std::process::id()).is_some());
        assert!(thread_cpu_ns().is_ok());
    }
}

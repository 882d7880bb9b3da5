//! `florin node --config FILE` (one cluster process: a shard replica, a coordinator replica
//! or a sentinel) and `florin cluster up|status|kill|cut|heal|freeze|thaw|down` (a whole
//! cluster on 127.0.0.1, or each process on its own emulated host). The directory layout and
//! process handling are `florin_node::cluster::deploy`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_http::{serve_with, AppState};
use florin_node::cluster::deploy::{self, NodeConfig};
use florin_node::cluster::rpc::{Peer, Request, Response};
use florin_node::cluster::{start_member, ClusterSpec, GroupSpec, MemberSpec, Role};
use florin_node::hosts::HostNet;
use florin_node::manifest::{check_dir, DirState, Manifest};
use florin_node::{load_key, load_or_create_key, Authority, AuthorityConfig, Ledger};
use serde::{Deserialize, Serialize};

/// Options of `florin node`: run a cluster process from its config, or check, back up or
/// restore a data directory.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeArgs {
    /// The process's config (`node.toml`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A data-directory command instead.
    #[command(subcommand)]
    command: Option<crate::node_cmd::NodeCommand>,
}

impl NodeArgs {
    /// Whether this runs a cluster process (rather than a data-directory command).
    pub fn runs_a_process(&self) -> bool {
        self.command.is_none()
    }
}

/// `florin cluster …`.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Write the configs (first time) and start every process (on 127.0.0.1, or each on its
    /// own emulated host).
    Up {
        /// Shard groups.
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Replicas per group (shards and coordinators).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Coordinator groups (two-phase commit only).
        #[arg(long, default_value_t = 1)]
        coordinators: usize,
        /// Which of Hamilton's designs (first start only): `two-phase` (locking shards and
        /// two-phase-commit coordinators) or `atomizer` (one Raft group orders every
        /// transaction into hash-chained blocks; docs/atomizer.md).
        #[arg(long, value_enum, default_value_t = Arch::TwoPhase)]
        architecture: Arch,
        /// Sentinels (HTTP API processes, each with a replica of the token authority; three or
        /// five survive the loss of one or two).
        #[arg(long, default_value_t = 1)]
        sentinels: usize,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
        /// The first sentinel's HTTP address (the wallet-facing API).
        #[arg(long, default_value = "127.0.0.1:7400")]
        api: SocketAddr,
        /// Largest faucet request, in euros.
        #[arg(long, default_value = "10000")]
        max_faucet: String,
        /// Turn the faucet on (first start only; off by default). Each faucet request then
        /// needs the operator's credential (DATA/operator.key).
        #[arg(long)]
        faucet: bool,
        /// The sentinels' TLS (by default, from a CA made in `DATA/tls` when the cluster is
        /// created) or plain HTTP; kept in the configs written at creation.
        #[command(flatten)]
        tls: crate::tls_args::ServeTlsArgs,
        /// Put every process on its own emulated host (first start only; needs root): its own
        /// network namespace and address on a private bridge (10.77.N.0/24) and its own CPU
        /// share. Members listen on HOST:7000, sentinels on HOST:<--api's port>.
        #[arg(long)]
        emulate_hosts: bool,
        /// Each emulated host's CPU share in cores (e.g. 0.25); by default the machine's cores
        /// split evenly over every process.
        #[arg(long, requires = "emulate_hosts")]
        host_cpu: Option<f64>,
    },
    /// An atomizer cluster's block log: reads every block from the atomizer's replicas,
    /// verifies the hash chain (and that no id is spent twice), and prints it. Exit code 0 when
    /// the chain verifies, 1 when it does not.
    Blocks {
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
        /// The first block to print (all are verified).
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Print only the summary.
        #[arg(long)]
        summary: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Every group's leader, term, log index and health, and the API URL.
    Status {
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Kill -9 a process for fault drills: `shard/S`, `coordinator/C`, `atomizer` (the group's
    /// leader), `shard/S/R`, `coordinator/C/R`, `atomizer/0/R`, `sentinel/N`.
    Kill {
        /// What to kill.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Cut an emulated host's link (fault drills; `--emulate-hosts` clusters): `shard/S/R`,
    /// `coordinator/C/R`, `sentinel/N`, `shard/S` or `coordinator/C` (the group's leader).
    Cut {
        /// Whose host.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Restore a cut link.
    Heal {
        /// Whose host.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Freeze every process of an emulated host (as if its machine stalled).
    Freeze {
        /// Whose host.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Thaw a frozen host.
    Thaw {
        /// Whose host.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Remove every Florin emulated host on this machine (namespaces, links, cgroups, bridges,
    /// and the processes on them) found by name, without a cluster directory: what a killed
    /// benchmark or a lost directory left behind. Running clusters' hosts go too.
    SweepHosts,
    /// Stop every process (and remove the emulated hosts; `up` makes them again).
    Down {
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
}

/// `--architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// Locking shards and two-phase-commit coordinators.
    TwoPhase,
    /// Block-applying shards and the atomizer.
    Atomizer,
}

// ------------------------------------------------------------------------- layout

/// What `cluster up` creates.
struct Shape<'a> {
    shards: usize,
    replicas: usize,
    coordinators: usize,
    architecture: Arch,
    sentinels: usize,
    api: SocketAddr,
    max_faucet: &'a str,
    faucet: bool,
    tls: &'a crate::tls_args::ServeTlsArgs,
    /// Each process on its own emulated host with this CPU share (cores; none: no quota).
    emulate_hosts: Option<Option<f64>>,
}

/// Where each process listens: a free loopback port, or its own emulated host.
enum Placement {
    Loopback(std::vec::IntoIter<SocketAddr>),
    Hosts(HostNet),
}

impl Placement {
    /// The address for the process `name`, on `port` where it has a host of its own (the
    /// hosts file is saved after each host, so `down` or the next `up` removes what a failed
    /// creation made).
    fn addr(&mut self, name: &str, port: u16, data: &Path) -> Result<SocketAddr> {
        match self {
            Placement::Loopback(free) => free.next().ok_or_else(|| anyhow!("out of ports")),
            Placement::Hosts(net) => {
                let added = net.add(name);
                net.save(&data.join(HOSTS_FILE))?;
                Ok(SocketAddr::new(added?.addr.into(), port))
            }
        }
    }

    /// A second address for the process `name` (already placed by [`Placement::addr`]): a
    /// new loopback port, or `port` on its host.
    fn second_addr(&mut self, name: &str, port: u16) -> Result<SocketAddr> {
        match self {
            Placement::Loopback(free) => free.next().ok_or_else(|| anyhow!("out of ports")),
            Placement::Hosts(net) => Ok(SocketAddr::new(net.host(name)?.addr.into(), port)),
        }
    }

    fn host(&self, name: &str) -> Option<String> {
        matches!(self, Placement::Hosts(_)).then(|| name.to_string())
    }
}

fn create(data: &Path, shape: &Shape) -> Result<ClusterSpec> {
    let Shape {
        shards,
        replicas,
        coordinators,
        sentinels,
        api,
        ..
    } = *shape;
    if shards == 0 || replicas == 0 || coordinators == 0 || sentinels == 0 {
        bail!("shards, replicas, coordinators and sentinels must each be at least 1");
    }
    let atomizer = shape.architecture == Arch::Atomizer;
    // An atomizer cluster has one atomizer group in place of the coordinator groups.
    let coordinators = if atomizer { 0 } else { coordinators };
    let extra_groups = if atomizer { 1 } else { coordinators };
    std::fs::create_dir_all(data)?;
    let mut place = match shape.emulate_hosts {
        None => {
            // Each sentinel's authority replica needs a port too (the first sentinel's HTTP
            // port is the one asked for); each shard and coordinator replica one for its
            // metrics.
            let n = 2 * (shards + extra_groups) * replicas + 2 * sentinels - 1;
            Placement::Loopback(florin_node::custody::free_loopback_addrs(n)?.into_iter())
        }
        Some(share) => {
            let n = (shards + extra_groups) * replicas + sentinels;
            if n > florin_node::hosts::MAX_HOSTS {
                bail!(
                    "{n} processes do not fit one emulated network ({} hosts at most)",
                    florin_node::hosts::MAX_HOSTS
                );
            }
            // The default share: the machine's cores split evenly over every process, so the
            // whole cluster fits the machine.
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            let share = share.unwrap_or(cores as f64 / n as f64);
            let net = HostNet::claim(Some(share))?;
            // Recorded at once, so `cluster down` can remove it even if creation fails below.
            net.save(&data.join(HOSTS_FILE))?;
            Placement::Hosts(net)
        }
    };
    let mut keys = Vec::new();
    let mut groups = |role: Role, count: usize, place: &mut Placement| -> Result<Vec<GroupSpec>> {
        let mut v = Vec::new();
        for g in 0..count as u16 {
            let mut members = Vec::new();
            for id in 1..=replicas as u64 {
                let key = SecretKey::generate(&mut rand::rngs::OsRng);
                let addr =
                    place.addr(&deploy::host_name(role, g, id), deploy::HOST_RPC_PORT, data)?;
                members.push(MemberSpec {
                    id,
                    addr: addr.to_string(),
                    key: key.public_key().to_address(),
                });
                keys.push((role, g, id, key));
            }
            v.push(GroupSpec { members });
        }
        Ok(v)
    };
    let shard_groups = groups(Role::Shard, shards, &mut place)?;
    let coord_groups = groups(Role::Coordinator, coordinators, &mut place)?;
    let atomizer_group = if atomizer {
        groups(Role::Atomizer, 1, &mut place)?.pop()
    } else {
        None
    };
    let sentinel_keys: Vec<SecretKey> = (0..sentinels)
        .map(|_| SecretKey::generate(&mut rand::rngs::OsRng))
        .collect();
    let client = load_or_create_key(&data.join("client.key"))?;
    let operator = load_or_create_key(&data.join(crate::devnet::OPERATOR_KEY_FILE))?;
    let map = florin_cluster::route::ShardMap::even(shards).map_err(|e| anyhow!("{e}"))?;
    // Every sentinel serves the API and holds a replica of the authority's registry.
    let mut sentinel_addrs = Vec::new();
    for i in 0..sentinels {
        let name = deploy::host_name(Role::Sentinel, i as u16, 0);
        let http = match (&place, i) {
            (Placement::Loopback(_), 0) => api,
            _ => place.addr(&name, api.port(), data)?,
        };
        let rpc = place.second_addr(&name, deploy::HOST_RPC_PORT)?;
        sentinel_addrs.push((http, rpc));
    }
    let authority = GroupSpec {
        members: sentinel_keys
            .iter()
            .zip(&sentinel_addrs)
            .enumerate()
            .map(|(i, (k, (_, rpc)))| MemberSpec {
                id: i as u64 + 1,
                addr: rpc.to_string(),
                key: k.public_key().to_address(),
            })
            .collect(),
    };
    let spec = ClusterSpec {
        shard_starts: map.starts().to_vec(),
        shards: shard_groups,
        coordinators: coord_groups,
        clients: sentinel_keys
            .iter()
            .map(|k| k.public_key().to_address())
            .collect(),
        observers: vec![client.public_key().to_address()],
        // A host of less than half a core needs Raft's timing for small machines.
        raft: match &place {
            Placement::Hosts(net) if net.cpu_share.is_some_and(|c| c < 0.5) => {
                florin_cluster::raft::RaftOptions::small_hosts()
            }
            _ => Default::default(),
        },
        max_batch: 4096,
        max_inflight: 8,
        one_phase: true,
        authority: Some(authority),
        architecture: if atomizer {
            florin_node::cluster::Architecture::Atomizer
        } else {
            florin_node::cluster::Architecture::TwoPhase
        },
        atomizer: atomizer_group,
        atomizer_config: Default::default(),
    };
    for (role, g, id, key) in keys {
        let mut cfg = NodeConfig::member(role, g, id);
        let name = deploy::host_name(role, g, id);
        cfg.host = place.host(&name);
        cfg.metrics = Some(place.second_addr(&name, deploy::HOST_METRICS_PORT)?);
        deploy::write_node(&deploy::member_dir(data, role, g, id), &cfg, &key)?;
    }
    for (i, key) in sentinel_keys.iter().enumerate() {
        let name = deploy::host_name(Role::Sentinel, i as u16, 0);
        let mut cfg = NodeConfig::member(Role::Sentinel, i as u16, 0);
        cfg.host = place.host(&name);
        cfg.http = Some(sentinel_addrs[i].0);
        cfg.authority = true;
        cfg.issuer_key = Some("../issuer.key".into());
        cfg.authority_key = Some("../authority.key".into());
        cfg.max_faucet = Some(shape.max_faucet.to_string());
        cfg.faucet = shape.faucet;
        cfg.operators = vec![operator.public_key().to_address()];
        cfg.tls_dir =
            (!shape.tls.plain_http).then(|| PathBuf::from("..").join(crate::tls_args::TLS_DIR));
        cfg.tls_names = shape.tls.tls_names.clone();
        deploy::write_node(
            &deploy::member_dir(data, Role::Sentinel, i as u16, 0),
            &cfg,
            key,
        )?;
    }
    load_or_create_key(&data.join("issuer.key"))?;
    load_or_create_key(&data.join("authority.key"))?;
    if !shape.tls.plain_http {
        florin_http::LocalCa::load_or_create(&data.join(crate::tls_args::TLS_DIR))?;
    }
    if let Placement::Hosts(net) = &place {
        net.save(&data.join(HOSTS_FILE))?;
    }
    // Written last: a directory without it is not a cluster yet, and `up` creates it afresh.
    spec.save(&data.join("cluster.toml"))?;
    Ok(spec)
}

/// The emulated hosts of a cluster that has them.
const HOSTS_FILE: &str = "hosts.toml";

fn hosts_of(data: &Path) -> Result<Option<HostNet>> {
    let path = data.join(HOSTS_FILE);
    if !path.exists() {
        return Ok(None);
    }
    Ok(Some(HostNet::load(&path)?))
}

// ------------------------------------------------------------------------- processes

fn canonical(data: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(data)?;
    Ok(data.canonicalize()?)
}

// ------------------------------------------------------------------------- status

/// One member's state as `cluster status` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberState {
    /// `shard`, `coordinator` or `sentinel`.
    pub role: Role,
    /// Its group.
    pub group: u16,
    /// Its id in the group.
    pub id: u64,
    /// Where it listens.
    pub addr: String,
    /// Its emulated host, if the cluster has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Whether it answered.
    pub up: bool,
    /// Its process id, if running.
    pub pid: Option<u32>,
    /// `leader`, `follower`, `candidate`, …
    pub state: Option<String>,
    /// The leader it knows.
    pub leader: Option<u64>,
    /// Raft term.
    pub term: Option<u64>,
    /// Last log index.
    pub last_log_index: Option<u64>,
    /// Last applied index.
    pub last_applied: Option<u64>,
    /// Last index in its snapshot.
    pub snapshot: Option<u64>,
    /// Coordinators: alerts raised since the process started (a shard refused a two-phase
    /// command: see its node.log), and the last one's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alerts: Option<u64>,
    /// The last alert's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_alert: Option<String>,
    /// Shards: confirmed txids remembered to answer replays (bounded by transaction expiry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remembered: Option<u64>,
    /// Sentinels: why its `node.toml` could not be read (it is not started until fixed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
}

impl MemberState {
    /// A member as its Raft status (if it answered) shows it.
    fn of(
        role: Role,
        (group, id): (u16, u64),
        addr: String,
        host: Option<String>,
        pid: Option<u32>,
        up: bool,
        st: Option<&florin_cluster::raft::ReplicaStatus>,
    ) -> MemberState {
        MemberState {
            role,
            group,
            id,
            addr,
            host,
            up,
            pid,
            state: st.map(|s| s.state.clone()),
            leader: st.and_then(|s| s.leader),
            term: st.map(|s| s.term),
            last_log_index: st.and_then(|s| s.last_log_index),
            last_applied: st.and_then(|s| s.last_applied),
            snapshot: st.and_then(|s| s.snapshot),
            alerts: None,
            last_alert: None,
            config_error: None,
            remembered: None,
        }
    }
}

/// A cluster's emulated network, as `cluster status --json` reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EmulatedNet {
    /// Its addresses.
    pub subnet: String,
    /// The bridge's address (this machine's side).
    pub gateway: String,
    /// Each host's CPU share in cores (none: no quota).
    pub cpu_share: Option<f64>,
    /// How many hosts.
    pub hosts: usize,
}

/// What `cluster status --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    /// The wallet-facing API (the first sentinel's URL).
    pub api: String,
    /// Every sentinel's URL, the first first (wallets may be given them all and fail over).
    pub apis: Vec<String>,
    /// The emulated network (`10.77.N.0/24`) and each host's CPU share, if the cluster has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulated_hosts: Option<EmulatedNet>,
    /// Every process.
    pub members: Vec<MemberState>,
    /// Whether every group has a leader and every sentinel answers.
    pub healthy: bool,
}

fn state(data: &Path) -> Result<ClusterState> {
    let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
    let me = Arc::new(LocalSigner::new(load_or_create_key(
        &data.join("client.key"),
    )?));
    let hosts = hosts_of(data)?;
    let mut members = Vec::new();
    let mut apis = Vec::new();
    for (role, g, id, dir) in deploy::processes(data, &spec) {
        let pid = deploy::pid_of(&dir);
        let host = hosts.as_ref().and_then(|h| {
            h.host(&deploy::host_name(role, g, id))
                .ok()
                .map(|h| h.name.clone())
        });
        if role == Role::Sentinel {
            let cfg = match NodeConfig::load(&dir.join("node.toml")) {
                Ok(cfg) => cfg,
                Err(e) => {
                    // Said on its line; the rest of the cluster is still shown.
                    let mut state =
                        MemberState::of(role, (g, id), String::new(), host, pid, false, None);
                    state.config_error = Some(e.to_string());
                    members.push(state);
                    continue;
                }
            };
            let http = cfg.http.map(|a| a.to_string()).unwrap_or_default();
            if let Some(url) = cfg.api_url() {
                apis.push(url);
            }
            let up = std::net::TcpStream::connect_timeout(
                &http
                    .parse()
                    .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
                Duration::from_millis(500),
            )
            .is_ok();
            // Its replica of the authority's registry, if the cluster has an authority group.
            let sentinel_key = load_key(&cfg.key).ok().map(|k| k.public_key());
            let st = sentinel_key
                .and_then(|k| florin_node::cluster::authority::membership(&spec, &k))
                .and_then(|(_, addr)| {
                    let key = sentinel_key?;
                    let peer = Peer::new(addr, key, me.clone(), Duration::from_secs(1));
                    match peer.call(&Request::Status) {
                        Ok(Response::Status(s)) => Some(s.raft),
                        _ => None,
                    }
                });
            let up = up && (spec.authority.is_none() || st.is_some());
            members.push(MemberState::of(
                role,
                (g, id),
                http,
                host,
                pid,
                up,
                st.as_ref(),
            ));
            continue;
        }
        let atomizer: Vec<GroupSpec> = spec.atomizer.iter().cloned().collect();
        let groups = match role {
            Role::Shard => &spec.shards,
            Role::Atomizer => &atomizer,
            _ => &spec.coordinators,
        };
        let Some(m) = groups
            .get(g as usize)
            .and_then(|gr| gr.members.iter().find(|m| m.id == id))
        else {
            continue;
        };
        let key = PublicKey::parse(&m.key).map_err(|e| anyhow!("{e}"))?;
        let peer = Peer::new(m.addr.clone(), key, me.clone(), Duration::from_secs(1));
        let (st, alerts, remembered) = match peer.call(&Request::Status) {
            Ok(Response::Status(s)) => (Some(s.raft), s.alerts, Some(s.remembered)),
            _ => (None, (0, None), None),
        };
        let up = st.is_some();
        let mut state = MemberState::of(role, (g, id), m.addr.clone(), host, pid, up, st.as_ref());
        state.alerts = (alerts.0 > 0).then_some(alerts.0);
        state.last_alert = alerts.1;
        state.remembered = remembered.filter(|_| role == Role::Shard);
        members.push(state);
    }
    let mut healthy = members
        .iter()
        .filter(|m| m.role == Role::Sentinel)
        .all(|m| m.up);
    if spec.authority.is_some() {
        // The authority group needs a leader too (its replicas are the sentinels).
        healthy &= members
            .iter()
            .any(|m| m.role == Role::Sentinel && m.state.as_deref() == Some("leader"));
    }
    for (role, n) in [
        (Role::Shard, spec.shards.len()),
        (Role::Coordinator, spec.coordinators.len()),
        (Role::Atomizer, usize::from(spec.atomizer.is_some())),
    ] {
        for g in 0..n as u16 {
            healthy &= members
                .iter()
                .any(|m| m.role == role && m.group == g && m.state.as_deref() == Some("leader"));
        }
    }
    Ok(ClusterState {
        api: apis.first().cloned().unwrap_or_default(),
        apis,
        emulated_hosts: hosts.map(|h| EmulatedNet {
            subnet: format!(
                "{}/24",
                std::net::Ipv4Addr::from((u32::from(h.gateway())) & !0xff)
            ),
            gateway: h.gateway().to_string(),
            cpu_share: h.cpu_share,
            hosts: h.hosts.len(),
        }),
        members,
        healthy,
    })
}

fn print_state(s: &ClusterState) {
    println!("api  {}", s.apis.join(" "));
    if let Some(h) = &s.emulated_hosts {
        let share = h.cpu_share.map_or("no CPU quota".to_string(), |c| {
            format!("{c:.3} core(s) each")
        });
        println!(
            "hosts {} emulated on {} (reached via {}), {share}",
            h.hosts, h.subnet, h.gateway
        );
    }
    println!(
        "{:<12} {:>5} {:>3}  {:<22} {:<10} {:>6} {:>5} {:>9} {:>9} {:>9}",
        "role", "group", "id", "address", "state", "leader", "term", "log", "applied", "snapshot"
    );
    let opt = |x: Option<u64>| x.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for m in &s.members {
        let role = match m.role {
            Role::Shard => "shard",
            Role::Coordinator => "coordinator",
            Role::Sentinel => "sentinel",
            Role::Engine => "engine",
            Role::Atomizer => "atomizer",
        };
        let state = if m.up {
            m.state.clone().unwrap_or_else(|| "up".into())
        } else {
            "DOWN".into()
        };
        println!(
            "{:<12} {:>5} {:>3}  {:<22} {:<10} {:>6} {:>5} {:>9} {:>9} {:>9}",
            role,
            m.group,
            m.id,
            m.addr,
            state,
            opt(m.leader),
            opt(m.term),
            opt(m.last_log_index),
            opt(m.last_applied),
            opt(m.snapshot)
        );
    }
    for m in s.members.iter() {
        if let Some(e) = &m.config_error {
            println!("CONFIG sentinel {}: {e}", m.group);
        }
    }
    for m in s.members.iter().filter(|m| m.alerts.is_some()) {
        println!(
            "ALERT coordinator {}/{}: {} alert(s), last: {}",
            m.group,
            m.id,
            m.alerts.unwrap_or(0),
            m.last_alert.as_deref().unwrap_or("-")
        );
    }
    println!("{}", if s.healthy { "healthy" } else { "NOT healthy" });
}

// ------------------------------------------------------------------------- commands

/// Runs `florin cluster …`.
pub fn run(cmd: ClusterCommand) -> Result<ExitCode> {
    match cmd {
        ClusterCommand::Up {
            shards,
            replicas,
            coordinators,
            architecture,
            sentinels,
            data,
            api,
            max_faucet,
            faucet,
            tls,
            emulate_hosts,
            host_cpu,
        } => {
            // Refused before anything is written.
            if !data.join("cluster.toml").exists() {
                if emulate_hosts && tls.plain_http {
                    bail!("emulated hosts are reached over their own addresses, not loopback: their sentinels serve TLS (drop --plain-http)");
                }
                if emulate_hosts {
                    florin_node::hosts::check_supported()?;
                } else {
                    tls.check(api)?;
                }
            }
            let data = canonical(&data)?;
            if !data.join("cluster.toml").exists() {
                // A creation that failed part-way left its hosts: removed before a new start.
                if let Some(old) = hosts_of(&data)? {
                    for e in old.remove() {
                        tracing::warn!("{e}");
                    }
                    std::fs::remove_file(data.join(HOSTS_FILE))?;
                }
                let shape = Shape {
                    shards,
                    replicas,
                    coordinators,
                    architecture,
                    sentinels,
                    api,
                    max_faucet: &max_faucet,
                    faucet,
                    tls: &tls,
                    emulate_hosts: emulate_hosts.then_some(host_cpu),
                };
                create(&data, &shape)?;
            } else {
                tracing::info!("using the existing cluster in {}", data.display());
                if emulate_hosts != hosts_of(&data)?.is_some() {
                    tracing::info!("note: --emulate-hosts is chosen when a cluster is created; this one keeps its placement");
                }
            }
            let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
            let hosts = hosts_of(&data)?;
            if let Some(h) = &hosts {
                h.ensure()?;
            }
            let exe = std::env::current_exe().context("cannot find the florin binary")?;
            let mut started = 0;
            for (_, _, _, dir) in deploy::processes(&data, &spec) {
                if deploy::pid_of(&dir).is_none() {
                    deploy::spawn(&dir, &exe, hosts.as_ref())?;
                    started += 1;
                }
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            let wait = crate::progress::spinner(format!(
                "started {started} process(es); waiting for every group to elect its leader"
            ));
            let st = loop {
                let st = state(&data)?;
                if st.healthy {
                    break st;
                }
                if Instant::now() > deadline {
                    print_state(&st);
                    bail!(
                        "the cluster did not become healthy (logs: {}/*/node.log)",
                        data.display()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            drop(wait);
            tracing::info!(
                "started {started} process(es): {} shard group(s), {}, {} replica(s) each",
                spec.shards.len(),
                if spec.atomizer.is_some() {
                    "the atomizer".to_string()
                } else {
                    format!("{} coordinator group(s)", spec.coordinators.len())
                },
                spec.shards[0].members.len()
            );
            print_state(&st);
            let ca = data
                .join(crate::tls_args::TLS_DIR)
                .join(florin_http::tls::CA_CERT_FILE);
            if st.api.starts_with("https://") {
                tracing::info!(
                    "tls  CA {} (clients: --ca-cert or FLORIN_CA_CERT)",
                    ca.display()
                );
            }
            println!("listening on {}", st.api);
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Blocks {
            data,
            from,
            summary,
            json,
        } => blocks(&canonical(&data)?, from, summary, json),
        ClusterCommand::Status { data, json } => {
            let st = state(&canonical(&data)?)?;
            if json {
                crate::util::printed_json();
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print_state(&st);
            }
            Ok(if st.healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
        ClusterCommand::Kill { target, data } => {
            let data = canonical(&data)?;
            let victim = find_member(&state(&data)?, &target)?;
            let role = victim.role;
            let pid = victim
                .pid
                .ok_or_else(|| anyhow!("{target}: no process running"))?;
            deploy::signal(pid, "KILL");
            println!(
                "killed {:?} {}/{} (pid {pid}, was {})",
                role,
                victim.group,
                victim.id,
                victim.state.clone().unwrap_or_else(|| "up".into())
            );
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Cut { target, data } => {
            host_drill(&target, &data, "cut off", |net, h| net.cut(h))
        }
        ClusterCommand::Heal { target, data } => {
            host_drill(&target, &data, "reconnected", |net, h| net.heal(h))
        }
        ClusterCommand::Freeze { target, data } => {
            host_drill(&target, &data, "frozen", |net, h| net.freeze(h))
        }
        ClusterCommand::Thaw { target, data } => {
            host_drill(&target, &data, "thawed", |net, h| net.thaw(h))
        }
        ClusterCommand::SweepHosts => {
            florin_node::hosts::check_supported()?;
            let errors = florin_node::hosts::sweep(None);
            for e in &errors {
                tracing::error!("{e}");
            }
            if !errors.is_empty() {
                bail!("some emulated hosts could not be removed (above)");
            }
            println!("removed every Florin emulated host on this machine");
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Down { data } => {
            let data = canonical(&data)?;
            let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
            let hosts = hosts_of(&data)?;
            // A frozen process cannot act on SIGTERM: thaw every host first.
            if let Some(h) = &hosts {
                for host in &h.hosts {
                    let _ = h.thaw(&host.name);
                }
            }
            let mut pids = Vec::new();
            for (_, _, _, dir) in deploy::processes(&data, &spec) {
                if let Some(pid) = deploy::pid_of(&dir) {
                    deploy::signal(pid, "TERM");
                    pids.push((pid, dir));
                }
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            for (pid, dir) in &pids {
                while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if deploy::pid_of(dir).is_some() {
                    deploy::signal(*pid, "KILL");
                }
                let _ = std::fs::remove_file(dir.join("pid"));
            }
            println!("stopped {} process(es)", pids.len());
            if let Some(h) = hosts {
                let errors = h.remove();
                for e in &errors {
                    tracing::error!("{e}");
                }
                if !errors.is_empty() {
                    bail!("some emulated hosts could not be removed (above)");
                }
                println!(
                    "removed {} emulated host(s) ({}; `cluster up` makes them again)",
                    h.hosts.len(),
                    h.bridge()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Resolves a drill's target (as `kill` names them) to its emulated host and acts on it.
fn host_drill(
    target: &str,
    data: &Path,
    done: &str,
    act: impl Fn(&HostNet, &str) -> Result<(), florin_node::hosts::HostError>,
) -> Result<ExitCode> {
    let data = canonical(data)?;
    let net = hosts_of(&data)?.ok_or_else(|| {
        anyhow!("this cluster has no emulated hosts (it was created without --emulate-hosts)")
    })?;
    let m = find_member(&state(&data)?, target)?;
    let name = deploy::host_name(m.role, m.group, m.id);
    act(&net, &name)?;
    println!("{name} ({}) {done}", net.host(&name)?.addr);
    Ok(ExitCode::SUCCESS)
}

/// `florin cluster blocks`.
fn blocks(data: &Path, from: u64, summary: bool, json: bool) -> Result<ExitCode> {
    use florin_cluster::atomizer::{Block, ChainVerifier, GENESIS};
    let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
    let group = spec.atomizer.clone().ok_or_else(|| {
        anyhow!("this cluster runs two-phase commit: only an atomizer cluster has a block log")
    })?;
    let me = Arc::new(LocalSigner::new(load_key(&data.join("client.key"))?));
    let peers: Vec<Peer> = group
        .members
        .iter()
        .map(|m| {
            Ok(Peer::new(
                m.addr.clone(),
                PublicKey::parse(&m.key).map_err(|e| anyhow!("{e}"))?,
                me.clone(),
                Duration::from_secs(10),
            ))
        })
        .collect::<Result<_>>()?;
    // The committed height (the leader's, linearizable), then the blocks up to it in pieces,
    // from whichever replica holds them (one that restarted may not have caught up yet, one
    // that received a snapshot starts its log later).
    let mut last = String::from("no atomizer replica answered");
    let target = peers
        .iter()
        .find_map(|p| match p.call(&Request::AtomHeight) {
            Ok(Response::Height(h)) => Some(h),
            Ok(other) => {
                last = format!("{other:?}");
                None
            }
            Err(e) => {
                last = e.to_string();
                None
            }
        })
        .ok_or_else(|| anyhow!("the atomizer's height: {last}"))?;
    let read = |at: u64| -> Result<Vec<Block>> {
        let mut last = String::from("no atomizer replica");
        for p in &peers {
            match p.call(&Request::AtomReadBlocks(at, at + 999)) {
                Ok(Response::Blocks(b)) if !b.is_empty() => return Ok(b),
                Ok(other) => last = format!("{other:?}"),
                Err(e) => last = e.to_string(),
            }
        }
        bail!("no atomizer replica holds block {at}: {last}")
    };
    // One verifier over every piece: an id spent twice is found however far apart.
    let mut verifier = ChainVerifier::new((0, GENESIS));
    let mut shown = Vec::new();
    let mut broken = None;
    while verifier.summary().height < target && broken.is_none() {
        let got = read(verifier.summary().height + 1)?;
        let mut ok = Vec::with_capacity(got.len());
        for b in got {
            match verifier.push(&b) {
                Ok(()) => ok.push(b),
                Err(e) => {
                    broken = Some(e.to_string());
                    break;
                }
            }
        }
        let got = ok;
        if !summary {
            shown.extend(got.into_iter().filter(|b| b.height >= from).map(|b| {
                serde_json::json!({
                    "height": b.height,
                    "hash": hex(&b.hash()),
                    "prev": hex(&b.prev),
                    "clock": b.now,
                    "txs": b.txs.len(),
                    "rejected": b.rejected.len(),
                })
            }));
        }
    }
    let sum = verifier.summary();
    if json {
        crate::util::printed_json();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "verified": broken.is_none(),
                "error": broken,
                "height": sum.height,
                "tip": hex(&sum.tip),
                "txs": sum.txs,
                "rejected": sum.rejected,
                "blocks": shown,
            }))?
        );
    } else {
        for b in &shown {
            println!(
                "block {:>8}  {}…  {:>6} tx  {:>4} rejected  clock {}",
                b["height"].as_u64().unwrap_or(0),
                b["hash"].as_str().unwrap_or("").get(..16).unwrap_or(""),
                b["txs"].as_u64().unwrap_or(0),
                b["rejected"].as_u64().unwrap_or(0),
                b["clock"].as_u64().unwrap_or(0)
            );
        }
        match &broken {
            None => println!(
                "{} block(s) verified: one hash chain, no id spent twice; {} transaction(s), {} rejected; tip {}",
                sum.height,
                sum.txs,
                sum.rejected,
                hex(&sum.tip)
            ),
            Some(e) => println!("NOT verified after block {}: {e}", sum.height),
        }
    }
    Ok(if broken.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The member a fault drill names: `shard/S[/R]`, `coordinator/C[/R]` (no replica: the
/// group's leader) or `sentinel/N`.
fn find_member(st: &ClusterState, target: &str) -> Result<MemberState> {
    let parts: Vec<&str> = target.split('/').collect();
    let role = match parts.first().copied() {
        Some("shard") => Role::Shard,
        Some("coordinator") | Some("coord") => Role::Coordinator,
        Some("atomizer") => Role::Atomizer,
        Some("sentinel") => Role::Sentinel,
        _ => bail!("which? shard/S[/R], coordinator/C[/R], atomizer[/0/R] or sentinel/N"),
    };
    let group: u16 = parts.get(1).map(|g| g.parse()).transpose()?.unwrap_or(0);
    let id: Option<u64> = parts.get(2).map(|i| i.parse()).transpose()?;
    st.members
        .iter()
        .filter(|m| m.role == role && m.group == group)
        .find(|m| match (role, id) {
            (Role::Sentinel, _) => true,
            (_, Some(id)) => m.id == id,
            (_, None) => m.state.as_deref() == Some("leader"),
        })
        .cloned()
        .ok_or_else(|| anyhow!("no member {target} (or no leader to pick)"))
}

/// Serves `/metrics` (and `/v1/health`) in plain HTTP on `addr`, for a process without an API
/// (a shard, coordinator or engine replica, a custody node); the task ends with the runtime.
pub(crate) async fn serve_metrics(
    addr: Option<SocketAddr>,
) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    // Metrics are not worth a replica: one that cannot listen for them serves without.
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!("cannot listen on {addr} for metrics ({e}); serving without them");
            return Ok(None);
        }
    };
    tracing::info!("metrics on http://{addr}/metrics");
    Ok(Some(tokio::spawn(async move {
        let router = florin_http::observe::metrics_router();
        let options = florin_http::ServeOptions::default();
        if let Err(e) =
            florin_http::server::serve_router(listener, router, options, std::future::pending())
                .await
        {
            tracing::warn!("the metrics listener stopped: {e}");
        }
    })))
}

/// Runs `florin node --config FILE` until SIGTERM or Ctrl-C.
pub fn run_node(args: NodeArgs) -> Result<ExitCode> {
    let config = match (args.command, args.config) {
        (Some(cmd), _) => return crate::node_cmd::run(cmd),
        (None, Some(c)) => c,
        (None, None) => {
            bail!("florin node needs --config FILE or a command (check, backup, restore)")
        }
    };
    let cfg = NodeConfig::load(&config)?;
    let spec = ClusterSpec::load(&cfg.cluster)?;
    let me = Arc::new(LocalSigner::new(load_or_create_key(&cfg.key)?));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cfg.role {
        Role::Shard | Role::Coordinator | Role::Atomizer => rt.block_on(async {
            let atomizer: Vec<GroupSpec> = spec.atomizer.iter().cloned().collect();
            let groups = match cfg.role {
                Role::Shard => &spec.shards,
                Role::Atomizer => &atomizer,
                _ => &spec.coordinators,
            };
            let addr = groups
                .get(cfg.group as usize)
                .and_then(|g| g.members.iter().find(|m| m.id == cfg.id))
                .map(|m| m.addr.clone())
                .ok_or_else(|| {
                    anyhow!(
                        "{:?} {}/{} is not in the cluster spec",
                        cfg.role,
                        cfg.group,
                        cfg.id
                    )
                })?;
            // `listen` overrides the advertised address (e.g. 0.0.0.0:7000 behind a name).
            let bind = cfg.listen.clone().unwrap_or(addr.clone());
            let listener = std::net::TcpListener::bind(&bind)
                .with_context(|| format!("cannot listen on {bind}"))?;
            let member =
                start_member(&spec, cfg.role, cfg.group, cfg.id, &cfg.data, me, listener).await?;
            let _metrics = serve_metrics(cfg.metrics).await?;
            florin_node::obs::export_store_files(
                &format!("{:?}-{}/{}", cfg.role, cfg.group, cfg.id).to_lowercase(),
                cfg.data.clone(),
                Some("log"),
            );
            tracing::info!(
                "florin node: {:?} {}/{} on {addr}",
                cfg.role,
                cfg.group,
                cfg.id
            );
            crate::devnet::shutdown_signal().await;
            member.stop().await;
            tracing::info!("florin node stopped");
            Ok(ExitCode::SUCCESS)
        }),
        Role::Sentinel => run_sentinel(&cfg, &spec, me, rt),
        Role::Engine => rt.block_on(async {
            // The single-node embedded engine behind the cluster's RPC (the reference of
            // `florin bench cluster --emulate-hosts`).
            let addr = spec
                .shards
                .first()
                .and_then(|g| g.members.first())
                .map(|m| m.addr.clone())
                .ok_or_else(|| anyhow!("an engine's spec names it as shard 0's member"))?;
            let bind = cfg.listen.clone().unwrap_or(addr.clone());
            let listener = std::net::TcpListener::bind(&bind)
                .with_context(|| format!("cannot listen on {bind}"))?;
            let dir = cfg.data.join("engine");
            let store = florin_store::embedded::EmbeddedStore::open(
                florin_store::embedded::EmbeddedConfig::new(&dir),
            )
            .with_context(|| format!("cannot open the engine in {}", dir.display()))?;
            let server = florin_node::cluster::engine::serve(&spec, me, Arc::new(store), listener)?;
            let _metrics = serve_metrics(cfg.metrics).await?;
            tracing::info!("florin node: engine on {addr}");
            crate::devnet::shutdown_signal().await;
            server.stop();
            tracing::info!("florin node stopped");
            Ok(ExitCode::SUCCESS)
        }),
    }
}

fn run_sentinel(
    cfg: &NodeConfig,
    spec: &ClusterSpec,
    me: Arc<LocalSigner>,
    rt: tokio::runtime::Runtime,
) -> Result<ExitCode> {
    let http = cfg.http.ok_or_else(|| anyhow!("a sentinel needs `http`"))?;
    let issuer_key = cfg
        .issuer_key
        .clone()
        .ok_or_else(|| anyhow!("a sentinel needs `issuer_key`"))?;
    // `cluster up` created the keys: a missing one is refused, never replaced.
    let issuer: Arc<dyn Signer> = Arc::new(LocalSigner::new(load_key(&issuer_key)?));
    // A member of the spec's authority group holds a replica of the registry.
    let replica_of = florin_node::cluster::authority::membership(spec, &me.public_key());
    let store = florin_node::cluster::open_store(spec, me.clone())?;
    let ledger = Ledger::start(store, issuer);
    if spec.authority.is_some() && cfg.authority && replica_of.is_none() {
        bail!(
            "this sentinel has `authority = true` but is not a member of the cluster's [authority] \
             group: a registry of its own would serve the reserve a second time"
        );
    }
    let authority = if cfg.authority || replica_of.is_some() {
        let key = cfg
            .authority_key
            .clone()
            .ok_or_else(|| anyhow!("the authority sentinel needs `authority_key`"))?;
        // The registry, once initialized, is required (never silently a fresh one).
        let required = vec!["authority.redb".to_string()];
        let dir_state = check_dir(&cfg.data, &required)?;
        std::fs::create_dir_all(&cfg.data)?;
        // No faucet unless the operator turned it on, and then only for operators.
        let mut config = AuthorityConfig::closed(&cfg.data);
        config.faucet = cfg.faucet;
        if let Some(m) = &cfg.max_faucet {
            config.max_faucet_cents = florin_token::amount::parse_euros(m)?;
        }
        config.operators = cfg
            .operators
            .iter()
            .map(|k| {
                PublicKey::parse_valid(k)
                    .with_context(|| format!("operator key {k} in the node config"))
            })
            .collect::<Result<_>>()?;
        if cfg.faucet && config.operators.is_empty() {
            tracing::info!(
                "note: the faucet is on but no operator is configured: nobody can use it"
            );
        }
        let signer: Arc<dyn Signer> = Arc::new(LocalSigner::new(load_key(&key)?));
        let address = signer.public_key().to_address();
        let issuer_address = ledger.issuer().to_address();
        if let DirState::Known(m) = &dir_state {
            m.verify_key("authority", &address, &cfg.data)?;
            m.verify_key("issuer", &issuer_address, &cfg.data)?;
        }
        let a = Arc::new(if replica_of.is_some() {
            Authority::open_replicated(config, signer)?
        } else {
            Authority::open(config, signer)?
        });
        if !matches!(dir_state, DirState::Known(_)) {
            Manifest::new(
                "cluster-authority",
                vec![
                    ("authority".into(), address),
                    ("issuer".into(), issuer_address),
                ],
                required,
            )
            .save(&cfg.data)?;
        }
        Some(a)
    } else {
        None
    };
    if let Some(l) = &cfg.limits {
        tracing::info!(
            "florin sentinel {}: API rate limits from node.toml: {l:?}",
            cfg.group
        );
        if l.per_ip_per_sec == 0 || l.per_ip_tx_per_sec == 0 {
            tracing::warn!(
                "florin sentinel {}: per-address rate limits are off ([limits] in node.toml): \
                 run it only behind a load balancer that limits each client",
                cfg.group
            );
        }
    }
    let state = AppState {
        authority: authority.clone(),
        ledger: Some(ledger.clone()),
        limits: cfg.limits.unwrap_or_default(),
        cluster: Some(florin_node::cluster::status::ClusterView::new(
            spec.clone(),
            me.clone(),
        )),
        custody: None,
    };
    // TLS from the cluster's CA (made by `cluster up`; never made here), or plain HTTP on
    // loopback for a config without `tls_dir`.
    let mut served = crate::tls_args::serve_options(
        cfg.tls_dir.is_none(),
        &cfg.tls_names,
        cfg.tls_dir.as_deref().unwrap_or(Path::new(".")),
        http,
        false,
    )?;
    if let Some(c) = &cfg.connections {
        tracing::info!(
            "florin sentinel {}: API connection limits from node.toml: {c:?}",
            cfg.group
        );
        served.options.max_connections = c.max.max(1);
        served.options.max_connections_per_ip = match c.per_ip {
            0 => usize::MAX,
            n => n,
        };
        served.options.new_connections_per_ip_per_sec = c.new_per_ip_per_sec;
        if c.per_ip == 0 || c.per_ip > c.max {
            tracing::info!(
                "note: florin sentinel {}: one address may hold up to all {} connections \
                 ([connections] max)",
                cfg.group,
                c.max
            );
        }
    }
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(http)
            .await
            .with_context(|| format!("cannot listen on {http}"))?;
        let replica = match (&authority, &replica_of) {
            (Some(a), Some((_, addr))) => {
                let bind = cfg.listen.clone().unwrap_or(addr.clone());
                let l = std::net::TcpListener::bind(&bind)
                    .with_context(|| format!("cannot listen on {bind}"))?;
                let dir = cfg.data.join("authority-raft");
                let r = florin_node::cluster::authority::start_replica(spec, a, &dir, me, l)
                    .await?;
                tracing::info!("florin sentinel {}: authority replica on {addr}", cfg.group);
                Some(Arc::new(r))
            }
            _ => None,
        };
        if let (Some(a), Some(r)) = (&authority, &replica) {
            // The group may not have a leader yet (its other sentinels are starting): the
            // baseline and credits in flight are taken care of in the background, credits by
            // the group's leader only (one settler, one handoff each).
            tokio::spawn(replica_duties(a.clone(), ledger.clone(), r.clone()));
        } else if let Some(a) = &authority {
            // Mints from before the issuer's journal existed (the audit's baseline), once.
            let (a2, l2) = (a.clone(), ledger.clone());
            let baseline = tokio::task::spawn_blocking(move || {
                l2.supply()
                    .and_then(|s| a2.ensure_issuance_baseline(s.minted_cents))
            })
            .await?;
            if let Err(e) = baseline {
                tracing::info!("note: the audit's issuance baseline is not set yet ({e}); it is set at the next start");
            }
            for intent in a.pending_credits()? {
                florin_node::settle_credit(a, &ledger, intent).await?;
            }
        }
        tracing::info!(
            "florin sentinel {} on {}://{http} ({} shard(s), {} coordinator group(s))",
            cfg.group,
            served.scheme,
            spec.shards.len(),
            spec.coordinators.len()
        );
        serve_with(
            listener,
            state,
            served.options,
            crate::devnet::shutdown_signal(),
        )
        .await?;
        if let Some(r) = replica {
            r.stop().await;
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// How often a replicated authority's leader looks for credits in flight.
const CREDIT_SWEEP: Duration = Duration::from_secs(5);

/// A replicated authority's background work: the issuance baseline (0) once the group answers,
/// then, while this replica leads, settling credits recorded but not confirmed (a deposit
/// whose sentinel failed before settling it).
async fn replica_duties(
    a: Arc<Authority>,
    ledger: Arc<Ledger>,
    r: Arc<florin_node::cluster::authority::AuthorityMember>,
) {
    // The baseline is 0: a replicated registry exists from the cluster's first start (one made
    // by a single authority cannot join a group), so every ledger mint is in its journal. Not
    // read from the ledger, where a mint confirmed meanwhile through another sentinel would be
    // counted twice.
    loop {
        let a2 = a.clone();
        let done = tokio::task::spawn_blocking(move || a2.ensure_issuance_baseline(0)).await;
        if matches!(done, Ok(Ok(()))) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // A credit is settled here only once it was pending at two sweeps in a row: the sentinel
    // that took the deposit settles it at once, and a second settler would hand its output
    // to the depositor twice.
    let mut seen = std::collections::HashSet::new();
    loop {
        tokio::time::sleep(CREDIT_SWEEP).await;
        if !r.is_leader() {
            seen.clear();
            continue;
        }
        let Ok(pending) = a.pending_credits() else {
            continue;
        };
        let before = std::mem::take(&mut seen);
        for intent in pending {
            let txid = florin_node::bridge::intent_txid(&intent);
            seen.insert(txid);
            if !before.contains(&txid) {
                continue;
            }
            if let Err(e) = florin_node::settle_credit(&a, &ledger, intent).await {
                tracing::info!("note: a credit in flight is not settled yet: {e}");
            }
        }
    }
}

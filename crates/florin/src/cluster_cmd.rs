//! `florin node --config FILE` (one cluster process: a shard replica, a coordinator replica
//! or a sentinel) and `florin cluster up|status|kill|down` (a whole cluster on 127.0.0.1).
//!
//! Layout of a cluster directory:
//! - `cluster.toml`: the topology every process reads (groups, members, addresses, keys);
//! - `shard-S-R/`, `coord-C-R/`, `sentinel-N/`: one per process, each with `node.toml`,
//!   `identity.key`, `pid`, `node.log` and its durable state;
//! - `issuer.key`, `authority.key`: the ledger's and the token authority's keys (sentinels);
//! - `client.key`: the key `florin cluster status` uses to ask members for their state.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
use florin_http::{serve_with, AppState};
use florin_node::cluster::rpc::{Peer, Request, Response};
use florin_node::cluster::{start_member, ClusterSpec, ClusterStore, GroupSpec, MemberSpec, Role};
use florin_node::manifest::{check_dir, DirState, Manifest};
use florin_node::{load_key, load_or_create_key, Authority, AuthorityConfig, Ledger};
use serde::{Deserialize, Serialize};

/// One process's configuration (`node.toml`). Relative paths are relative to the file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeConfig {
    /// `shard`, `coordinator` or `sentinel`.
    pub role: Role,
    /// Shard index, coordinator group index, or sentinel index.
    pub group: u16,
    /// Replica id within the group (shards and coordinators).
    #[serde(default)]
    pub id: u64,
    /// The cluster's topology.
    pub cluster: PathBuf,
    /// This process's identity key.
    pub key: PathBuf,
    /// Its durable state.
    pub data: PathBuf,
    /// Sentinels: the HTTP API address.
    #[serde(default)]
    pub http: Option<SocketAddr>,
    /// Sentinels: whether this one runs the token authority (exactly one should).
    #[serde(default)]
    pub authority: bool,
    /// Sentinels: the issuer's key file.
    #[serde(default)]
    pub issuer_key: Option<PathBuf>,
    /// Sentinels: the authority's key file.
    #[serde(default)]
    pub authority_key: Option<PathBuf>,
    /// Sentinels: largest faucet request, in euros.
    #[serde(default)]
    pub max_faucet: Option<String>,
    /// Sentinels: whether the faucet is on (off unless the operator turns it on; when on,
    /// each request needs an operator credential).
    #[serde(default)]
    pub faucet: bool,
    /// Sentinels: the operator keys (addresses) whose signed requests are accepted.
    #[serde(default)]
    pub operators: Vec<String>,
    /// Sentinels: the cluster's TLS directory (its CA, `ca.pem` and `ca.key`); the sentinel
    /// serves TLS with a certificate issued from it at each start. Absent: plain HTTP, allowed
    /// only on loopback.
    #[serde(default)]
    pub tls_dir: Option<PathBuf>,
    /// Sentinels: more names for the server certificate (`--tls-name`).
    #[serde(default)]
    pub tls_names: Vec<String>,
}

impl NodeConfig {
    fn load(path: &Path) -> Result<NodeConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut c: NodeConfig = toml::from_str(&text)
            .with_context(|| format!("{}: bad node config", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        abs(&mut c.cluster);
        abs(&mut c.key);
        abs(&mut c.data);
        if let Some(p) = c.issuer_key.as_mut() {
            abs(p);
        }
        if let Some(p) = c.authority_key.as_mut() {
            abs(p);
        }
        if let Some(p) = c.tls_dir.as_mut() {
            abs(p);
        }
        Ok(c)
    }
}

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

/// `florin cluster …`.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Write the configs (first time) and start every process on 127.0.0.1.
    Up {
        /// Shard groups.
        #[arg(long, default_value_t = 2)]
        shards: usize,
        /// Replicas per group (shards and coordinators).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Coordinator groups.
        #[arg(long, default_value_t = 1)]
        coordinators: usize,
        /// Sentinels (HTTP API processes; the first also runs the token authority).
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
    /// Kill -9 a process for fault drills: `shard/S`, `coordinator/C` (the group's leader),
    /// `shard/S/R`, `coordinator/C/R`, `sentinel/N`.
    Kill {
        /// What to kill.
        target: String,
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
    /// Stop every process.
    Down {
        /// The cluster's directory.
        #[arg(long, default_value = "./florin-cluster")]
        data: PathBuf,
    },
}

// ------------------------------------------------------------------------- layout

fn member_dir(data: &Path, role: Role, group: u16, id: u64) -> PathBuf {
    match role {
        Role::Shard => data.join(format!("shard-{group}-{id}")),
        Role::Coordinator => data.join(format!("coord-{group}-{id}")),
        Role::Sentinel => data.join(format!("sentinel-{group}")),
    }
}

/// Every process of a cluster: (role, group, id, its directory).
fn processes(data: &Path, spec: &ClusterSpec) -> Vec<(Role, u16, u64, PathBuf)> {
    let mut v = Vec::new();
    for (role, groups) in [
        (Role::Shard, &spec.shards),
        (Role::Coordinator, &spec.coordinators),
    ] {
        for (g, group) in groups.iter().enumerate() {
            for m in &group.members {
                v.push((role, g as u16, m.id, member_dir(data, role, g as u16, m.id)));
            }
        }
    }
    let mut n = 0u16;
    while member_dir(data, Role::Sentinel, n, 0)
        .join("node.toml")
        .exists()
    {
        v.push((Role::Sentinel, n, 0, member_dir(data, Role::Sentinel, n, 0)));
        n += 1;
    }
    v
}

fn write_node(dir: &Path, cfg: &NodeConfig, key: &SecretKey) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    florin_node::write_private(&dir.join("identity.key"), key.to_hex().as_bytes())?;
    std::fs::write(dir.join("node.toml"), toml::to_string_pretty(cfg)?)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn create(
    data: &Path,
    shards: usize,
    replicas: usize,
    coordinators: usize,
    sentinels: usize,
    api: SocketAddr,
    max_faucet: &str,
    faucet: bool,
    tls: &crate::tls_args::ServeTlsArgs,
) -> Result<ClusterSpec> {
    if shards == 0 || replicas == 0 || coordinators == 0 || sentinels == 0 {
        bail!("shards, replicas, coordinators and sentinels must each be at least 1");
    }
    std::fs::create_dir_all(data)?;
    let n = (shards + coordinators) * replicas + sentinels.saturating_sub(1);
    let mut addrs = florin_node::custody::free_loopback_addrs(n)?.into_iter();
    let mut next = || addrs.next().ok_or_else(|| anyhow!("out of ports"));
    let mut keys = Vec::new();
    let mut group =
        |role: Role, g: u16, next: &mut dyn FnMut() -> Result<SocketAddr>| -> Result<GroupSpec> {
            let mut members = Vec::new();
            for id in 1..=replicas as u64 {
                let key = SecretKey::generate(&mut rand::rngs::OsRng);
                members.push(MemberSpec {
                    id,
                    addr: next()?.to_string(),
                    key: key.public_key().to_address(),
                });
                keys.push((role, g, id, key));
            }
            Ok(GroupSpec { members })
        };
    let shard_groups = (0..shards as u16)
        .map(|g| group(Role::Shard, g, &mut next))
        .collect::<Result<Vec<_>>>()?;
    let coord_groups = (0..coordinators as u16)
        .map(|g| group(Role::Coordinator, g, &mut next))
        .collect::<Result<Vec<_>>>()?;
    let sentinel_keys: Vec<SecretKey> = (0..sentinels)
        .map(|_| SecretKey::generate(&mut rand::rngs::OsRng))
        .collect();
    let client = load_or_create_key(&data.join("client.key"))?;
    let operator = load_or_create_key(&data.join(crate::devnet::OPERATOR_KEY_FILE))?;
    let map = florin_cluster::route::ShardMap::even(shards).map_err(|e| anyhow!("{e}"))?;
    let spec = ClusterSpec {
        shard_starts: map.starts().to_vec(),
        shards: shard_groups,
        coordinators: coord_groups,
        clients: sentinel_keys
            .iter()
            .map(|k| k.public_key().to_address())
            .collect(),
        observers: vec![client.public_key().to_address()],
        raft: Default::default(),
        max_batch: 4096,
        max_inflight: 8,
        one_phase: true,
    };
    spec.save(&data.join("cluster.toml"))?;
    for (role, g, id, key) in keys {
        let cfg = NodeConfig {
            role,
            group: g,
            id,
            cluster: "../cluster.toml".into(),
            key: "identity.key".into(),
            data: ".".into(),
            http: None,
            authority: false,
            issuer_key: None,
            authority_key: None,
            max_faucet: None,
            faucet: false,
            operators: Vec::new(),
            tls_dir: None,
            tls_names: Vec::new(),
        };
        write_node(&member_dir(data, role, g, id), &cfg, &key)?;
    }
    for (i, key) in sentinel_keys.iter().enumerate() {
        let http = if i == 0 { api } else { next()? };
        let cfg = NodeConfig {
            role: Role::Sentinel,
            group: i as u16,
            id: 0,
            cluster: "../cluster.toml".into(),
            key: "identity.key".into(),
            data: ".".into(),
            http: Some(http),
            authority: i == 0,
            issuer_key: Some("../issuer.key".into()),
            authority_key: Some("../authority.key".into()),
            max_faucet: Some(max_faucet.to_string()),
            faucet,
            operators: vec![operator.public_key().to_address()],
            tls_dir: (!tls.plain_http).then(|| PathBuf::from("..").join(crate::tls_args::TLS_DIR)),
            tls_names: tls.tls_names.clone(),
        };
        write_node(&member_dir(data, Role::Sentinel, i as u16, 0), &cfg, key)?;
    }
    load_or_create_key(&data.join("issuer.key"))?;
    load_or_create_key(&data.join("authority.key"))?;
    if !tls.plain_http {
        florin_http::LocalCa::load_or_create(&data.join(crate::tls_args::TLS_DIR))?;
    }
    Ok(spec)
}

// ------------------------------------------------------------------------- processes

fn pid_of(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let want = dir.join("node.toml");
    let want = want.to_string_lossy();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (args.iter().any(|a| a == "node") && args.iter().any(|a| *a == want)).then_some(pid)
}

fn spawn(dir: &Path) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find the florin binary")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("node.log"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["node", "--config"])
        .arg(dir.join("node.toml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let child = cmd.spawn().context("cannot start a cluster process")?;
    std::fs::write(dir.join("pid"), child.id().to_string())?;
    Ok(child.id())
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

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
}

/// What `cluster status --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterState {
    /// The wallet-facing API.
    pub api: String,
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
    let mut members = Vec::new();
    let mut api = String::new();
    for (role, g, id, dir) in processes(data, &spec) {
        let pid = pid_of(&dir);
        if role == Role::Sentinel {
            let cfg = NodeConfig::load(&dir.join("node.toml"))?;
            let http = cfg.http.map(|a| a.to_string()).unwrap_or_default();
            if g == 0 {
                let scheme = if cfg.tls_dir.is_some() {
                    "https"
                } else {
                    "http"
                };
                api = format!("{scheme}://{http}");
            }
            let up = std::net::TcpStream::connect_timeout(
                &http
                    .parse()
                    .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
                Duration::from_millis(500),
            )
            .is_ok();
            members.push(MemberState {
                role,
                group: g,
                id,
                addr: http,
                up,
                pid,
                state: None,
                leader: None,
                term: None,
                last_log_index: None,
                last_applied: None,
                snapshot: None,
            });
            continue;
        }
        let groups = if role == Role::Shard {
            &spec.shards
        } else {
            &spec.coordinators
        };
        let Some(m) = groups[g as usize].members.iter().find(|m| m.id == id) else {
            continue;
        };
        let key = PublicKey::parse(&m.key).map_err(|e| anyhow!("{e}"))?;
        let peer = Peer::new(m.addr.clone(), key, me.clone(), Duration::from_secs(1));
        let st = match peer.call(&Request::Status) {
            Ok(Response::Status(s)) => Some(s.raft),
            _ => None,
        };
        members.push(MemberState {
            role,
            group: g,
            id,
            addr: m.addr.clone(),
            up: st.is_some(),
            pid,
            state: st.as_ref().map(|s| s.state.clone()),
            leader: st.as_ref().and_then(|s| s.leader),
            term: st.as_ref().map(|s| s.term),
            last_log_index: st.as_ref().and_then(|s| s.last_log_index),
            last_applied: st.as_ref().and_then(|s| s.last_applied),
            snapshot: st.as_ref().and_then(|s| s.snapshot),
        });
    }
    let mut healthy = members
        .iter()
        .filter(|m| m.role == Role::Sentinel)
        .all(|m| m.up);
    for (role, n) in [
        (Role::Shard, spec.shards.len()),
        (Role::Coordinator, spec.coordinators.len()),
    ] {
        for g in 0..n as u16 {
            healthy &= members
                .iter()
                .any(|m| m.role == role && m.group == g && m.state.as_deref() == Some("leader"));
        }
    }
    Ok(ClusterState {
        api,
        members,
        healthy,
    })
}

fn print_state(s: &ClusterState) {
    println!("api  {}", s.api);
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
            sentinels,
            data,
            api,
            max_faucet,
            faucet,
            tls,
        } => {
            tls.check(api)?;
            let data = canonical(&data)?;
            if !data.join("cluster.toml").exists() {
                create(
                    &data,
                    shards,
                    replicas,
                    coordinators,
                    sentinels,
                    api,
                    &max_faucet,
                    faucet,
                    &tls,
                )?;
            } else {
                eprintln!("using the existing cluster in {}", data.display());
            }
            let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
            let mut started = 0;
            for (_, _, _, dir) in processes(&data, &spec) {
                if pid_of(&dir).is_none() {
                    spawn(&dir)?;
                    started += 1;
                }
            }
            let deadline = Instant::now() + Duration::from_secs(60);
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
            eprintln!(
                "started {started} process(es): {} shard group(s), {} coordinator group(s), {} replica(s) each",
                spec.shards.len(),
                spec.coordinators.len(),
                spec.shards[0].members.len()
            );
            print_state(&st);
            let ca = data
                .join(crate::tls_args::TLS_DIR)
                .join(florin_http::tls::CA_CERT_FILE);
            if st.api.starts_with("https://") {
                eprintln!(
                    "tls  CA {} (clients: --ca-cert or FLORIN_CA_CERT)",
                    ca.display()
                );
            }
            println!("listening on {}", st.api);
            Ok(ExitCode::SUCCESS)
        }
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
            let st = state(&data)?;
            let parts: Vec<&str> = target.split('/').collect();
            let role = match parts.first().copied() {
                Some("shard") => Role::Shard,
                Some("coordinator") | Some("coord") => Role::Coordinator,
                Some("sentinel") => Role::Sentinel,
                _ => bail!("kill what? shard/S[/R], coordinator/C[/R] or sentinel/N"),
            };
            let group: u16 = parts.get(1).map(|g| g.parse()).transpose()?.unwrap_or(0);
            let id: Option<u64> = parts.get(2).map(|i| i.parse()).transpose()?;
            let victim = st
                .members
                .iter()
                .filter(|m| m.role == role && m.group == group)
                .find(|m| match (role, id) {
                    (Role::Sentinel, _) => true,
                    (_, Some(id)) => m.id == id,
                    (_, None) => m.state.as_deref() == Some("leader"),
                })
                .ok_or_else(|| anyhow!("no running {target} (or no leader to kill)"))?;
            let pid = victim
                .pid
                .ok_or_else(|| anyhow!("{target}: no process running"))?;
            signal(pid, "KILL");
            println!(
                "killed {:?} {}/{} (pid {pid}, was {})",
                role,
                victim.group,
                victim.id,
                victim.state.clone().unwrap_or_else(|| "up".into())
            );
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Down { data } => {
            let data = canonical(&data)?;
            let spec = ClusterSpec::load(&data.join("cluster.toml"))?;
            let mut pids = Vec::new();
            for (_, _, _, dir) in processes(&data, &spec) {
                if let Some(pid) = pid_of(&dir) {
                    signal(pid, "TERM");
                    pids.push((pid, dir));
                }
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            for (pid, dir) in &pids {
                while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if pid_of(dir).is_some() {
                    signal(*pid, "KILL");
                }
                let _ = std::fs::remove_file(dir.join("pid"));
            }
            println!("stopped {} process(es)", pids.len());
            Ok(ExitCode::SUCCESS)
        }
    }
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
        Role::Shard | Role::Coordinator => rt.block_on(async {
            let groups = if cfg.role == Role::Shard {
                &spec.shards
            } else {
                &spec.coordinators
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
            let listener = std::net::TcpListener::bind(&addr)
                .with_context(|| format!("cannot listen on {addr}"))?;
            let member =
                start_member(&spec, cfg.role, cfg.group, cfg.id, &cfg.data, me, listener).await?;
            eprintln!(
                "florin node: {:?} {}/{} on {addr}",
                cfg.role, cfg.group, cfg.id
            );
            crate::devnet::shutdown_signal().await;
            member.stop().await;
            eprintln!("florin node stopped");
            Ok(ExitCode::SUCCESS)
        }),
        Role::Sentinel => run_sentinel(&cfg, &spec, me, rt),
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
    let store = ClusterStore::new(spec, me)?;
    let ledger = Ledger::start(Arc::new(store), issuer);
    let authority = if cfg.authority {
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
            eprintln!("note: the faucet is on but no operator is configured: nobody can use it");
        }
        let signer: Arc<dyn Signer> = Arc::new(LocalSigner::new(load_key(&key)?));
        let address = signer.public_key().to_address();
        let issuer_address = ledger.issuer().to_address();
        if let DirState::Known(m) = &dir_state {
            m.verify_key("authority", &address, &cfg.data)?;
            m.verify_key("issuer", &issuer_address, &cfg.data)?;
        }
        let a = Arc::new(Authority::open(config, signer)?);
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
    let state = AppState {
        authority: authority.clone(),
        ledger: Some(ledger.clone()),
        limits: florin_http::RateLimits::default(),
    };
    // TLS from the cluster's CA (made by `cluster up`; never made here), or plain HTTP on
    // loopback for a config without `tls_dir`.
    let served = crate::tls_args::serve_options(
        cfg.tls_dir.is_none(),
        &cfg.tls_names,
        cfg.tls_dir.as_deref().unwrap_or(Path::new(".")),
        http,
        false,
    )?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(http)
            .await
            .with_context(|| format!("cannot listen on {http}"))?;
        if let Some(a) = &authority {
            // Mints from before the issuer's journal existed (the audit's baseline), once.
            let (a2, l2) = (a.clone(), ledger.clone());
            let baseline = tokio::task::spawn_blocking(move || {
                l2.supply()
                    .and_then(|s| a2.ensure_issuance_baseline(s.minted_cents))
            })
            .await?;
            if let Err(e) = baseline {
                eprintln!("note: the audit's issuance baseline is not set yet ({e}); it is set at the next start");
            }
            for intent in a.pending_credits()? {
                florin_node::settle_credit(a, &ledger, intent).await?;
            }
        }
        eprintln!(
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
        Ok(ExitCode::SUCCESS)
    })
}

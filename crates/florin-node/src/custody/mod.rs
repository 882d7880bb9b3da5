//! The key-management network's services: the node ([`node`]), the coordinator's client and
//! threshold signer ([`client`]), and the on-disk layout of a local network ([`Layout`]) that
//! `florin custody up` and `florin devnet --custody threshold` share.

pub mod client;
pub mod client_ecdsa;
mod commit;
mod manifest;
pub mod node;
mod node_ecdsa;
pub mod view;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use florin_crypto::{LocalSigner, PublicKey, Signer};
use florin_custody::PartyId;

pub use client::{Kmn, KmnError, NetworkConfig, ThresholdSigner};
pub use client_ecdsa::{EcdsaNodeState, EcdsaSigner, EcdsaSignerStats, PRESIG_POOL};
pub use commit::HeldKey;
pub use node::{CustodyNode, CustodyNodeConfig, KeyPattern, Member, RunningNode};
pub use node_ecdsa::{AnyShare, EcdsaEngine, EcdsaLevel, MAX_PRESIGS, MAX_RUNS_PER_CLIENT};

use crate::error::NodeError;
use crate::keyfile::{load_or_create_key, write_private};

/// Where a local network keeps its files:
///
/// ```text
/// DIR/network.json          threshold and members (what a coordinator needs)
/// DIR/coordinator.key       the coordinator's identity (a client and admin of every node)
/// DIR/node-P/node.json      node P's config
/// DIR/node-P/identity.key   node P's identity (its Noise channel and envelope signatures)
/// DIR/node-P/seal.key       node P's key-encryption key
/// DIR/node-P/shares/K.share node P's share of key K, encrypted
/// ```
#[derive(Debug, Clone)]
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The layout under `dir`.
    pub fn new(dir: &Path) -> Layout {
        Layout {
            dir: dir.to_path_buf(),
        }
    }

    /// The network's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `network.json`.
    pub fn network_file(&self) -> PathBuf {
        self.dir.join("network.json")
    }

    /// The coordinator's key file.
    pub fn coordinator_key(&self) -> PathBuf {
        self.dir.join("coordinator.key")
    }

    /// Node `p`'s directory.
    pub fn node_dir(&self, p: PartyId) -> PathBuf {
        self.dir.join(format!("node-{p}"))
    }

    /// Node `p`'s config file.
    pub fn node_config(&self, p: PartyId) -> PathBuf {
        self.node_dir(p).join("node.json")
    }

    /// Whether a network was created here.
    pub fn exists(&self) -> bool {
        self.network_file().exists()
    }

    /// Creates a t-of-n network whose node `i` listens on `addrs[i]`: identities, configs,
    /// the coordinator's key. Refuses to overwrite an existing network.
    pub fn create(&self, t: u16, addrs: &[SocketAddr]) -> Result<NetworkConfig, NodeError> {
        if self.exists() {
            return Err(NodeError::bad_request(format!(
                "a network already exists in {}",
                self.dir.display()
            )));
        }
        let n = addrs.len();
        if t < 2 || t as usize > n || n > florin_custody::frost::MAX_PARTIES as usize {
            return Err(NodeError::bad_request(format!(
                "threshold {t} of {n} nodes"
            )));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| NodeError::io_at(&self.dir, e))?;
        let coordinator = LocalSigner::new(load_or_create_key(&self.coordinator_key())?);
        let mut members = Vec::with_capacity(n);
        for (i, addr) in addrs.iter().enumerate() {
            let p = (i + 1) as PartyId;
            let d = self.node_dir(p);
            std::fs::create_dir_all(&d).map_err(|e| NodeError::io_at(&d, e))?;
            let id = load_or_create_key(&d.join("identity.key"))?;
            members.push(Member {
                party: p,
                addr: *addr,
                key: id.public_key().to_address(),
            });
        }
        let me = coordinator.public_key().to_address();
        // Each node's metrics listener: a loopback port of its own when the network is on
        // loopback (none otherwise: the operator chooses where metrics are served).
        let metrics: Vec<Option<SocketAddr>> = if addrs.iter().all(|a| a.ip().is_loopback()) {
            let mut free = free_loopback_addrs(2 * n)?;
            free.retain(|a| !addrs.iter().any(|m| m.port() == a.port()));
            (0..n).map(|i| free.get(i).copied()).collect()
        } else {
            vec![None; n]
        };
        for (m, metrics) in members.iter().zip(metrics) {
            let cfg = CustodyNodeConfig {
                metrics,
                party: m.party,
                listen: m.addr,
                dir: self.node_dir(m.party),
                seal_key: None,
                t,
                members: members.clone(),
                clients: vec![me.clone()],
                admins: vec![me.clone()],
                grants: Default::default(),
                ecdsa: None,
            };
            let json = serde_json::to_vec_pretty(&cfg).map_err(crate::error::IoError::from)?;
            write_private(&self.node_config(m.party), &json)?;
        }
        let net = NetworkConfig { t, members };
        let json = serde_json::to_vec_pretty(&net).map_err(crate::error::IoError::from)?;
        write_private(&self.network_file(), &json)?;
        Ok(net)
    }

    /// Turns ECDSA P-256 on (at `level`) in every node's config, or off with `None`. Nodes
    /// read it when they start; a node with ECDSA on generates its Paillier primes in the
    /// background on its first start (minutes at the production level).
    pub fn set_ecdsa(&self, level: Option<EcdsaLevel>) -> Result<(), NodeError> {
        self.edit_configs(|cfg| {
            cfg.ecdsa = level;
            Ok(())
        })
    }

    /// Lets `client` (an `eur1…` key) take nonce commitments and signature shares at every
    /// node: of the keys `patterns` names (whole names, or prefixes ending in `*`), or of
    /// every key with `None`. Replaces what the client was granted before. Running nodes take
    /// it up within [`node::CONFIG_POLL`] (they watch their config).
    pub fn grant(&self, client: &str, patterns: Option<&[String]>) -> Result<(), NodeError> {
        PublicKey::parse(client).map_err(|source| {
            NodeError::from(crate::error::BadRequest::Key {
                what: format!("client key {client}"),
                source,
            })
        })?;
        if let Some(ps) = patterns {
            for p in ps {
                node::KeyPattern::parse(p)?;
            }
        }
        self.edit_configs(|cfg| {
            if !cfg.clients.iter().any(|c| c == client) {
                cfg.clients.push(client.to_string());
            }
            match patterns {
                Some(ps) => cfg.grants.insert(client.to_string(), ps.to_vec()),
                None => cfg.grants.remove(client),
            };
            Ok(())
        })
    }

    /// Removes `client` from every node's clients and grants (not from its admins). Running
    /// nodes drop it within [`node::CONFIG_POLL`], open connections included.
    pub fn revoke(&self, client: &str) -> Result<(), NodeError> {
        self.edit_configs(|cfg| {
            cfg.clients.retain(|c| c != client);
            cfg.grants.remove(client);
            Ok(())
        })
    }

    /// Rewrites every node's config through `f`.
    fn edit_configs(
        &self,
        mut f: impl FnMut(&mut CustodyNodeConfig) -> Result<(), NodeError>,
    ) -> Result<(), NodeError> {
        let (net, _) = self.load()?;
        for m in &net.members {
            let path = self.node_config(m.party);
            let mut cfg = CustodyNodeConfig::load(&path)?;
            f(&mut cfg)?;
            let json = serde_json::to_vec_pretty(&cfg).map_err(crate::error::IoError::from)?;
            write_private(&path, &json)?;
        }
        Ok(())
    }

    /// Gives node `p` a new identity key, for a node whose machine or disk was lost together
    /// with its `identity.key` (or whose key leaked): writes the new key into its directory,
    /// recreates its `node.json` from another node's if that was lost too, and names the new
    /// key in every node's config and in `network.json`. The other nodes take it up when they
    /// next start; its FROST shares then come back by share repair (`custody up` and `devnet
    /// --custody threshold` do that by themselves). Stop node `p` first. Returns the new key.
    pub fn replace_identity(&self, p: PartyId) -> Result<PublicKey, NodeError> {
        let (mut net, _) = self.load()?;
        let member = net
            .members
            .iter()
            .find(|m| m.party == p)
            .cloned()
            .ok_or_else(|| NodeError::bad_request(format!("the network has no node {p}")))?;
        let dir = self.node_dir(p);
        std::fs::create_dir_all(&dir).map_err(|e| NodeError::io_at(&dir, e))?;
        let cfg_path = self.node_config(p);
        let mut own = match CustodyNodeConfig::load(&cfg_path) {
            Ok(c) => c,
            Err(_) => {
                // Lost with the disk: the other nodes' configs say everything but its place.
                let other = net
                    .members
                    .iter()
                    .filter(|m| m.party != p)
                    .find_map(|m| CustodyNodeConfig::load(&self.node_config(m.party)).ok())
                    .ok_or_else(|| {
                        NodeError::bad_request("no other node's config to start from")
                    })?;
                CustodyNodeConfig {
                    party: p,
                    listen: member.addr,
                    dir: dir.clone(),
                    seal_key: None,
                    ..other
                }
            }
        };
        let key_path = dir.join("identity.key");
        match std::fs::remove_file(&key_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(NodeError::io_at(&key_path, e)),
        }
        let fresh = load_or_create_key(&key_path)?.public_key();
        let addr = fresh.to_address();
        let rename = |members: &mut Vec<Member>| {
            for m in members.iter_mut().filter(|m| m.party == p) {
                m.key = addr.clone();
            }
        };
        rename(&mut own.members);
        let json = serde_json::to_vec_pretty(&own).map_err(crate::error::IoError::from)?;
        write_private(&cfg_path, &json)?;
        self.edit_configs(|cfg| {
            rename(&mut cfg.members);
            Ok(())
        })?;
        rename(&mut net.members);
        let json = serde_json::to_vec_pretty(&net).map_err(crate::error::IoError::from)?;
        write_private(&self.network_file(), &json)?;
        Ok(fresh)
    }

    /// The ECDSA level the nodes are configured with (node 1's config).
    pub fn ecdsa(&self) -> Result<Option<EcdsaLevel>, NodeError> {
        Ok(CustodyNodeConfig::load(&self.node_config(1))?.ecdsa)
    }

    /// Reads the network and the coordinator's key.
    pub fn load(&self) -> Result<(NetworkConfig, LocalSigner), NodeError> {
        let net = NetworkConfig::load(&self.network_file())
            .map_err(|e| NodeError::bad_request(e.to_string()))?;
        // The network's administrator key: never made again once the network exists (the
        // nodes would not know a new one).
        let key = self.coordinator_key();
        if !key.exists() {
            return Err(NodeError::corrupt(format!(
                "{}: coordinator key missing while {} exists (the nodes admit only the key they \
                 were made with) — restore it from a backup",
                key.display(),
                self.network_file().display()
            )));
        }
        let me = LocalSigner::new(load_or_create_key(&key)?);
        Ok((net, me))
    }

    /// Starts every node in this process (background threads, real sockets): for tests,
    /// benchmarks and single-process demos.
    pub fn start_in_process(&self) -> Result<Vec<RunningNode>, NodeError> {
        let (net, _) = self.load()?;
        let mut out = Vec::new();
        for m in &net.members {
            let cfg = CustodyNodeConfig::load(&self.node_config(m.party))?;
            let listener = std::net::TcpListener::bind(cfg.listen).map_err(|e| {
                crate::error::IoError::Listen {
                    addr: cfg.listen,
                    source: e,
                }
            })?;
            let node = CustodyNode::open(&cfg)?.start(listener)?;
            node.watch_config(self.node_config(m.party))?;
            out.push(node);
        }
        Ok(out)
    }
}

/// `n` free loopback ports (bound and released).
///
/// They are picked below the kernel's ephemeral port range
/// (`/proc/sys/net/ipv4/ip_local_port_range`). The kernel never hands such a port to an outgoing
/// connection or to a `bind` on port 0, so a port found free here stays free until its node
/// binds it. Ports from the ephemeral range could be taken in between by any connection this
/// or another process opens; that made parallel tests fail with "address already in use".
/// Falls back to the ephemeral range when no room is left below it.
pub fn free_loopback_addrs(n: usize) -> Result<Vec<SocketAddr>, NodeError> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let first = low.saturating_sub(16_000).max(1024);
    let mut held: Vec<std::net::TcpListener> = Vec::with_capacity(n);
    let mut tries = 0;
    while held.len() < n && first < low && tries < 64 * n.max(1) {
        tries += 1;
        let port = first + (rand::random::<u16>() % (low - first));
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    while held.len() < n {
        held.push(std::net::TcpListener::bind("127.0.0.1:0").map_err(crate::error::IoError::from)?);
    }
    held.iter()
        .map(|l| {
            l.local_addr()
                .map_err(|e| NodeError::from(crate::error::IoError::from(e)))
        })
        .collect()
}

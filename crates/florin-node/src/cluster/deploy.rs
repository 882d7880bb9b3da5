//! A cluster on disk and as processes: each process's configuration (`node.toml`), the layout
//! of a cluster directory, and starting, finding and signalling its processes, on this
//! machine or each on its own emulated host ([`crate::hosts`]). `florin cluster up` and
//! `florin bench cluster --emulate-hosts` both deploy through this module.
//!
//! Layout of a cluster directory:
//! - `cluster.toml`: the topology every process reads (groups, members, addresses, keys);
//! - `hosts.toml`: the emulated hosts, when the cluster has them;
//! - `shard-S-R/`, `coord-C-R/`, `sentinel-N/`: one per process, each with `node.toml`,
//!   `identity.key`, `pid`, `node.log` and its durable state. On emulated hosts, each process's
//!   host has the same name as its directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use florin_crypto::SecretKey;
use serde::{Deserialize, Serialize};

use super::GroupSpec;
use super::{ClusterSpec, Role};
use crate::error::{BadRequest, NodeError};
use crate::hosts::HostNet;

/// The port every member listens on for cluster RPC on an emulated host (each has its own
/// address, so they can all use the same port, as on real machines).
pub const HOST_RPC_PORT: u16 = 7000;

/// The port a shard, coordinator or engine replica serves `/metrics` on, on an emulated host.
pub const HOST_METRICS_PORT: u16 = 9100;

/// One process's configuration (`node.toml`). Relative paths are relative to the file. A key
/// it does not know is refused, not ignored: a misspelt setting would otherwise quietly keep
/// its default.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Shards, coordinators and sentinels in an authority group: where to listen for cluster
    /// RPC, when not the address the cluster spec
    /// advertises for this member (for example `0.0.0.0:7000` behind a host name).
    #[serde(default)]
    pub listen: Option<String>,
    /// The emulated host the process runs on (`cluster up --emulate-hosts`).
    #[serde(default)]
    pub host: Option<String>,
    /// Shards, coordinators and engines: where to serve `/metrics` (plain HTTP; sentinels
    /// serve it on their API).
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Sentinels: the HTTP API address to listen on.
    #[serde(default)]
    pub http: Option<std::net::SocketAddr>,
    /// Sentinels: the URL wallets use, when not `http(s)://` + the listen address (a sentinel
    /// behind a name or a load balancer).
    #[serde(default)]
    pub public_url: Option<String>,
    /// Sentinels: whether this one runs the token authority (in a cluster without an
    /// `authority` group exactly one should; in one with it, every member does).
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
    /// Sentinels: the API's rate limits (`[limits]`; fields left out keep their defaults).
    /// Behind a load balancer every request comes from its address: lift the per-address
    /// limits there (0 turns a limit off).
    #[serde(default)]
    pub limits: Option<crate::api::RateLimits>,
    /// Sentinels: the API's connection limits per client address (`[connections]`; fields
    /// left out keep their defaults). Behind a load balancer, raise them.
    #[serde(default)]
    pub connections: Option<crate::api::ConnectionLimits>,
}

impl NodeConfig {
    /// A shard or coordinator replica's configuration, in its directory under the cluster's.
    pub fn member(role: Role, group: u16, id: u64) -> NodeConfig {
        NodeConfig {
            role,
            group,
            id,
            cluster: "../cluster.toml".into(),
            key: "identity.key".into(),
            data: ".".into(),
            listen: None,
            host: None,
            http: None,
            metrics: None,
            public_url: None,
            authority: false,
            issuer_key: None,
            authority_key: None,
            max_faucet: None,
            faucet: false,
            operators: Vec::new(),
            tls_dir: None,
            tls_names: Vec::new(),
            limits: None,
            connections: None,
        }
    }

    /// Reads a `node.toml`, making its relative paths absolute.
    pub fn load(path: &Path) -> Result<NodeConfig, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|e| NodeError::io_at(path, e))?;
        let mut c: NodeConfig = toml::from_str(&text).map_err(|e| BadRequest::Config {
            path: path.into(),
            source: Box::new(e),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        abs(&mut c.cluster);
        abs(&mut c.key);
        abs(&mut c.data);
        for p in [&mut c.issuer_key, &mut c.authority_key, &mut c.tls_dir]
            .into_iter()
            .flatten()
        {
            abs(p);
        }
        Ok(c)
    }

    /// The URL wallets use for this sentinel (`public_url`, else the listen address).
    pub fn api_url(&self) -> Option<String> {
        if let Some(u) = &self.public_url {
            return Some(u.clone());
        }
        let scheme = if self.tls_dir.is_some() {
            "https"
        } else {
            "http"
        };
        self.http.map(|a| format!("{scheme}://{a}"))
    }
}

/// A process's directory (and, on emulated hosts, its host's name).
pub fn member_dir(data: &Path, role: Role, group: u16, id: u64) -> PathBuf {
    data.join(host_name(role, group, id))
}

/// The name of a process's directory and emulated host: `shard-S-R`, `coord-C-R`,
/// `sentinel-N`.
pub fn host_name(role: Role, group: u16, id: u64) -> String {
    match role {
        Role::Shard => format!("shard-{group}-{id}"),
        Role::Coordinator => format!("coord-{group}-{id}"),
        Role::Sentinel => format!("sentinel-{group}"),
        Role::Engine => format!("engine-{group}"),
        Role::Atomizer => format!("atomizer-{id}"),
    }
}

/// Every process of a cluster in `data`: (role, group, id, its directory); shard and
/// coordinator replicas from the spec, then each sentinel whose `node.toml` is there.
pub fn processes(data: &Path, spec: &ClusterSpec) -> Vec<(Role, u16, u64, PathBuf)> {
    let mut v = Vec::new();
    let atomizer: Vec<GroupSpec> = spec.atomizer.iter().cloned().collect();
    for (role, groups) in [
        (Role::Shard, &spec.shards),
        (Role::Coordinator, &spec.coordinators),
        (Role::Atomizer, &atomizer),
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

/// Writes a process's directory: its identity key (0600) and `node.toml`.
pub fn write_node(dir: &Path, cfg: &NodeConfig, key: &SecretKey) -> Result<(), NodeError> {
    std::fs::create_dir_all(dir).map_err(|e| NodeError::io_at(dir, e))?;
    crate::write_private(&dir.join("identity.key"), key.to_hex().as_bytes())?;
    let text = toml::to_string_pretty(cfg).map_err(|e| BadRequest::Config {
        path: dir.join("node.toml"),
        source: Box::new(e),
    })?;
    let path = dir.join("node.toml");
    florin_fs::write_atomic(&path, &[text.as_bytes()]).map_err(|e| NodeError::io_at(&path, e))
}

/// The pid in `dir/pid`, if that process is alive and is `florin node --config dir/node.toml`
/// (a stale pid file, or a pid reused by another program, is not it).
pub fn pid_of(dir: &Path) -> Option<u32> {
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

/// Starts `program node --config dir/node.toml` (on its emulated host when `hosts` is given
/// and the config names one), in its own process group, logging to `dir/node.log`, and
/// records its pid.
pub fn spawn(dir: &Path, program: &Path, hosts: Option<&HostNet>) -> Result<u32, NodeError> {
    let cfg = NodeConfig::load(&dir.join("node.toml"))?;
    let log_path = dir.join("node.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| NodeError::io_at(&log_path, e))?;
    let err = log
        .try_clone()
        .map_err(|e| NodeError::io_at(&log_path, e))?;
    let mut cmd = match (hosts, &cfg.host) {
        (Some(net), Some(h)) => net
            .command(h, program)
            .map_err(|e| NodeError::storage(e.to_string()))?,
        (None, Some(h)) => {
            return Err(NodeError::storage(format!(
                "{} runs on emulated host {h}, but the cluster has no hosts.toml",
                dir.display()
            )))
        }
        _ => Command::new(program),
    };
    cmd.args(["node", "--config"])
        .arg(dir.join("node.toml"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let child = cmd
        .spawn()
        .map_err(|e| NodeError::storage(format!("cannot start {}: {e}", program.display())))?;
    let pid_path = dir.join("pid");
    std::fs::write(&pid_path, child.id().to_string())
        .map_err(|e| NodeError::io_at(&pid_path, e))?;
    Ok(child.id())
}

/// Sends `kill -SIG pid` (errors ignored: the process may be gone).
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RateLimits;

    #[test]
    fn a_sentinels_limits_are_read_from_its_config_and_fields_left_out_keep_their_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node.toml");
        let mut cfg = NodeConfig::member(Role::Sentinel, 0, 0);
        let base = toml::to_string_pretty(&cfg).unwrap();
        std::fs::write(&path, &base).unwrap();
        assert_eq!(NodeConfig::load(&path).unwrap().limits, None);
        // Behind a load balancer: the per-address limits lifted, the per-key ones kept.
        std::fs::write(
            &path,
            format!("{base}\n[limits]\nper_ip_per_sec = 0\nper_ip_tx_per_sec = 0\n"),
        )
        .unwrap();
        let limits = NodeConfig::load(&path).unwrap().limits.unwrap();
        assert_eq!(limits.per_ip_per_sec, 0);
        assert_eq!(limits.per_ip_tx_per_sec, 0);
        assert_eq!(
            limits.per_key_per_sec,
            RateLimits::default().per_key_per_sec
        );
        assert_eq!(limits.per_ip_burst, RateLimits::default().per_ip_burst);
        // A misspelt limit is refused, not ignored.
        std::fs::write(&path, format!("{base}\n[limits]\nper_ip_per_second = 0\n")).unwrap();
        let err = NodeConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("per_ip_per_second"), "{err}");
        // Connection limits: absent by default, fields left out keep their defaults, a
        // misspelt one refused.
        std::fs::write(&path, &base).unwrap();
        assert_eq!(NodeConfig::load(&path).unwrap().connections, None);
        std::fs::write(&path, format!("{base}\n[connections]\nper_ip = 5000\n")).unwrap();
        let c = NodeConfig::load(&path).unwrap().connections.unwrap();
        assert_eq!(c.per_ip, 5000);
        assert_eq!(c.max, crate::api::ConnectionLimits::default().max);
        assert_eq!(
            c.new_per_ip_per_sec,
            crate::api::ConnectionLimits::default().new_per_ip_per_sec
        );
        std::fs::write(
            &path,
            format!("{base}\n[connections]\nper_address = 5000\n"),
        )
        .unwrap();
        let err = NodeConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("per_address"), "{err}");
        // A misspelt top-level key is refused too.
        std::fs::write(&path, format!("public_ur = \"https://x\"\n{base}")).unwrap();
        let err = NodeConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("public_ur"), "{err}");
        // Written and read back.
        cfg.limits = Some(RateLimits::off());
        std::fs::write(&path, toml::to_string_pretty(&cfg).unwrap()).unwrap();
        assert_eq!(
            NodeConfig::load(&path).unwrap().limits,
            Some(RateLimits::off())
        );
    }
}

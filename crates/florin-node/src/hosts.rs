//! Emulated hosts: many small machines on this one, for deployment drills and honest scaling
//! benchmarks (`florin cluster up --emulate-hosts`, `florin bench cluster --emulate-hosts`).
//!
//! Each host is a Linux **network namespace** with its own address on a private bridge
//! (`10.77.N.0/24`, the bridge `flbrN` in the caller's namespace holding `10.77.N.1`), and its
//! own cgroup v1 groups: `cpu` (a CPU quota, the host's share of a core), `cpuacct` (the CPU
//! time it used) and `freezer` (to freeze the host, as if its machine stalled). A process is
//! started on a host by entering its cgroups and then `ip netns exec`: it sees only its own
//! address and loopback, reaches the other hosts over the bridge, and is reached from the
//! caller's namespace (wallets, `cluster status`) through the bridge's address.
//!
//! Nothing outside these namespaces is contacted or changed: no routes, no forwarding, no
//! firewall rules. [`HostNet::remove`] deletes every namespace, link and cgroup it made. It
//! needs root (namespaces and cgroups); [`check_supported`] says plainly what is missing.
//!
//! Every name carries the network's random tag, so two clusters never share a namespace or a
//! cgroup, and the bridge's alias names the tag, so a network id taken by another cluster is
//! refused rather than joined.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// The first two octets of every emulated network (`10.77.N.0/24`).
pub const SUBNET: [u8; 2] = [10, 77];
/// Most hosts on one emulated network (addresses `.2` to `.251`).
pub const MAX_HOSTS: usize = 250;
/// The shortest CPU quota period (10 ms). The kernel's default is 100 ms; a host held to a
/// small share would then run in bursts and stall for most of each 100 ms, which no real small
/// machine does. Shorter periods spread its share evenly (the period is lengthened only where
/// the quota would fall under the kernel's 1 ms minimum).
const MIN_PERIOD_US: u64 = 10_000;
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
const CONTROLLERS: [&str; 3] = ["cpu", "cpuacct", "freezer"];

/// Why hosts cannot be emulated or changed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// This process may not create namespaces or cgroups, or the tools are missing.
    #[error("emulated hosts are not available here: {0}")]
    Unsupported(String),
    /// A command or a cgroup file failed.
    #[error("{what}: {detail}")]
    Failed {
        /// What was being done.
        what: String,
        /// The tool's or the kernel's words.
        detail: String,
    },
    /// No such host in this network.
    #[error("no emulated host named {0}")]
    NoHost(String),
    /// Every network id is taken, or too many hosts.
    #[error("{0}")]
    Full(String),
    /// The hosts file cannot be read or written.
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

fn failed(what: impl Into<String>, detail: impl std::fmt::Display) -> HostError {
    HostError::Failed {
        what: what.into(),
        detail: detail.to_string(),
    }
}

/// Whether this process can emulate hosts: effective root, `ip` (iproute2) and the cgroup v1
/// `cpu`, `cpuacct` and `freezer` controllers mounted under `/sys/fs/cgroup`.
pub fn check_supported() -> Result<(), HostError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok());
    if euid != Some(0) {
        return Err(HostError::Unsupported(
            "creating network namespaces and cgroups needs root (run as root, or without \
             --emulate-hosts)"
                .into(),
        ));
    }
    if Command::new("ip")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        return Err(HostError::Unsupported(
            "the `ip` command (iproute2) is missing: install the iproute2 package".into(),
        ));
    }
    for c in CONTROLLERS {
        if !Path::new(CGROUP_ROOT).join(c).join("cgroup.procs").exists() {
            return Err(HostError::Unsupported(format!(
                "the cgroup v1 `{c}` controller is not mounted at {CGROUP_ROOT}/{c}"
            )));
        }
    }
    Ok(())
}

/// Runs `ip ARGS`, failing with its words.
fn ip(args: &[&str]) -> Result<(), HostError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(format!("ip {}", args.join(" ")), e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            format!("ip {}", args.join(" ")),
            String::from_utf8_lossy(&out.stderr).trim(),
        ))
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn alias_of(link: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{link}/ifalias"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

fn netns_exists(name: &str) -> bool {
    Path::new("/var/run/netns").join(name).exists()
}

fn write(path: &Path, text: &str) -> Result<(), HostError> {
    std::fs::write(path, text).map_err(|e| failed(format!("write {}", path.display()), e))
}

/// One emulated host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmulatedHost {
    /// Its name (`shard-0-1`, `sentinel-0`, `loadgen-2`, …).
    pub name: String,
    /// Its address on the emulated network.
    pub addr: Ipv4Addr,
    /// Its network namespace.
    pub netns: String,
    /// The bridge-side end of its link (in the caller's namespace); down = cut off.
    pub link: String,
    /// Its cgroup's name (the same under `cpu`, `cpuacct` and `freezer`).
    pub cgroup: String,
}

impl EmulatedHost {
    fn cgroup_dir(&self, controller: &str) -> PathBuf {
        Path::new(CGROUP_ROOT).join(controller).join(&self.cgroup)
    }

    /// CPU time its processes used since it was made (seconds), from `cpuacct.usage`.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let ns: u64 = std::fs::read_to_string(self.cgroup_dir("cpuacct").join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(ns as f64 / 1e9)
    }

    /// The processes on it now.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.cgroup_dir("freezer").join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// The cgroup `cpu` period and quota (µs) for a share of `share` cores (quota -1: none).
fn quota_of(share: Option<f64>) -> (u64, i64) {
    match share {
        None => (MIN_PERIOD_US, -1),
        Some(s) => {
            let period = ((1000.0 / s).ceil() as u64).clamp(MIN_PERIOD_US, 1_000_000);
            (period, ((s * period as f64).round() as i64).max(1000))
        }
    }
}

/// An emulated network of hosts, as recorded in a cluster's `hosts.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostNet {
    /// The network id: addresses `10.77.<net>.x`, bridge `flbr<net>`.
    pub net: u8,
    /// A random tag in every name this network made.
    pub tag: String,
    /// Each host's CPU share in cores (`0.25` = a quarter of one core); none = no quota.
    pub cpu_share: Option<f64>,
    /// The hosts, in order of creation.
    pub hosts: Vec<EmulatedHost>,
}

impl HostNet {
    /// Claims a free network id (by creating its bridge) for a new network with no hosts.
    pub fn claim(cpu_share: Option<f64>) -> Result<HostNet, HostError> {
        check_supported()?;
        if let Some(s) = cpu_share {
            if !(s.is_finite() && s > 0.0 && s <= 64.0) {
                return Err(failed(
                    "--host-cpu",
                    format!("{s} is not a CPU share (cores, above 0, e.g. 0.25)"),
                ));
            }
        }
        let tag = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        for net in 0..=255u8 {
            let candidate = HostNet {
                net,
                tag: tag.clone(),
                cpu_share,
                hosts: Vec::new(),
            };
            if link_exists(&candidate.bridge()) {
                continue;
            }
            // Creating the bridge is the claim: it fails if another caller took the id first.
            if ip(&["link", "add", &candidate.bridge(), "type", "bridge"]).is_ok() {
                candidate.ensure()?;
                return Ok(candidate);
            }
        }
        Err(HostError::Full(
            "every emulated network id (flbr0 … flbr255) is in use: take some down".into(),
        ))
    }

    /// The bridge's name.
    pub fn bridge(&self) -> String {
        format!("flbr{}", self.net)
    }

    /// The bridge's address, which the caller's namespace uses to reach every host.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET[0], SUBNET[1], self.net, 1)
    }

    fn alias(&self) -> String {
        format!("florin-{}", self.tag)
    }

    /// A host by name.
    pub fn host(&self, name: &str) -> Result<&EmulatedHost, HostError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| HostError::NoHost(name.to_string()))
    }

    /// Adds a host and builds it (its namespace, link, address and cgroups).
    pub fn add(&mut self, name: &str) -> Result<EmulatedHost, HostError> {
        if let Ok(h) = self.host(name) {
            return Ok(h.clone());
        }
        let i = self.hosts.len();
        if i >= MAX_HOSTS {
            return Err(HostError::Full(format!(
                "an emulated network holds at most {MAX_HOSTS} hosts"
            )));
        }
        if !valid_name(name) {
            return Err(failed(
                "emulated host name",
                format!("{name:?}: use letters, digits, '-' and '_'"),
            ));
        }
        let host = self.host_at(i, name);
        // Recorded first: a build that fails part-way is removed with the rest.
        self.hosts.push(host.clone());
        self.build(&host)?;
        Ok(host)
    }

    /// Builds whatever is missing: the bridge and every host (after a reboot or `remove`).
    /// Refuses a bridge of the same id that another network made.
    pub fn ensure(&self) -> Result<(), HostError> {
        check_supported()?;
        let bridge = self.bridge();
        if link_exists(&bridge) {
            let alias = std::fs::read_to_string(format!("/sys/class/net/{bridge}/ifalias"))
                .unwrap_or_default();
            let alias = alias.trim();
            if !alias.is_empty() && alias != self.alias() {
                return Err(failed(
                    format!("emulated network {}", self.net),
                    format!(
                        "{bridge} belongs to another emulated network ({alias}); take that one down first"
                    ),
                ));
            }
        } else {
            ip(&["link", "add", &bridge, "type", "bridge"])?;
        }
        ip(&["link", "set", &bridge, "alias", &self.alias()])?;
        let gw = format!("{}/24", self.gateway());
        let has_addr = Command::new("ip")
            .args(["-4", "-o", "addr", "show", "dev", &bridge])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&gw))
            .unwrap_or(false);
        if !has_addr {
            ip(&["addr", "add", &gw, "dev", &bridge])?;
        }
        ip(&["link", "set", &bridge, "up"])?;
        for h in &self.hosts {
            self.build(h)?;
        }
        Ok(())
    }

    fn build(&self, h: &EmulatedHost) -> Result<(), HostError> {
        if !netns_exists(&h.netns) {
            ip(&["netns", "add", &h.netns])?;
        }
        if link_exists(&h.link) && alias_of(&h.link) != self.alias() {
            return Err(failed(
                format!("emulated host {}", h.name),
                format!("link {} belongs to something else", h.link),
            ));
        }
        if !link_exists(&h.link) {
            ip(&[
                "link", "add", &h.link, "type", "veth", "peer", "name", "eth0", "netns", &h.netns,
            ])?;
            ip(&["link", "set", &h.link, "alias", &self.alias()])?;
            let addr = format!("{}/24", h.addr);
            ip(&["-n", &h.netns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", &h.netns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &h.netns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                &h.netns,
                "route",
                "add",
                "default",
                "via",
                &self.gateway().to_string(),
            ])?;
        }
        ip(&["link", "set", &h.link, "master", &self.bridge(), "up"])?;
        for c in CONTROLLERS {
            let dir = h.cgroup_dir(c);
            std::fs::create_dir_all(&dir)
                .map_err(|e| failed(format!("create cgroup {}", dir.display()), e))?;
        }
        let cpu = h.cgroup_dir("cpu");
        let (period, quota) = quota_of(self.cpu_share);
        // The quota first: a period shorter than the old one could otherwise be refused.
        write(&cpu.join("cpu.cfs_quota_us"), "-1")?;
        write(&cpu.join("cpu.cfs_period_us"), &period.to_string())?;
        write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())
    }

    /// A command that runs `program` on host `name`: in its cgroups, then in its namespace
    /// (`ip netns exec` replaces itself with the program, so the child's pid is the program's).
    pub fn command(&self, name: &str, program: &Path) -> Result<Command, HostError> {
        let h = self.host(name)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(
                "for g in \"$FLORIN_HOST_CPU\" \"$FLORIN_HOST_ACCT\" \"$FLORIN_HOST_FREEZER\"; do \
                 echo $$ > \"$g/cgroup.procs\" || exit 125; done; \
                 exec ip netns exec \"$FLORIN_HOST_NETNS\" \"$@\"",
            )
            .arg("florin-host")
            .arg(program)
            .env("FLORIN_HOST_CPU", h.cgroup_dir("cpu"))
            .env("FLORIN_HOST_ACCT", h.cgroup_dir("cpuacct"))
            .env("FLORIN_HOST_FREEZER", h.cgroup_dir("freezer"))
            .env("FLORIN_HOST_NETNS", &h.netns);
        Ok(cmd)
    }

    /// Cuts a host's link: nobody reaches it and it reaches nobody (its processes run on).
    pub fn cut(&self, name: &str) -> Result<(), HostError> {
        ip(&["link", "set", &self.own_link(name)?, "down"])
    }

    /// Restores a cut link.
    pub fn heal(&self, name: &str) -> Result<(), HostError> {
        ip(&["link", "set", &self.own_link(name)?, "up"])
    }

    /// A host's link, if it exists and is this network's (its alias names the tag).
    fn own_link(&self, name: &str) -> Result<String, HostError> {
        let link = self.host(name)?.link.clone();
        if !link_exists(&link) || alias_of(&link) != self.alias() {
            return Err(failed(
                format!("emulated host {name}"),
                format!("its link {link} is not there (run `cluster up` to make the hosts again)"),
            ));
        }
        Ok(link)
    }

    /// Freezes every process on a host (as if its machine stalled).
    pub fn freeze(&self, name: &str) -> Result<(), HostError> {
        write(
            &self.host(name)?.cgroup_dir("freezer").join("freezer.state"),
            "FROZEN",
        )
    }

    /// Thaws a frozen host.
    pub fn thaw(&self, name: &str) -> Result<(), HostError> {
        write(
            &self.host(name)?.cgroup_dir("freezer").join("freezer.state"),
            "THAWED",
        )
    }

    /// Kills -9 every process left on every host, then deletes every namespace, link and
    /// cgroup, and the bridge. Goes on past errors and returns them all.
    pub fn remove(&self) -> Vec<HostError> {
        let mut errors = Vec::new();
        for h in &self.hosts {
            let _ = write(&h.cgroup_dir("freezer").join("freezer.state"), "THAWED");
            for pid in h.pids() {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for h in &self.hosts {
            // Deleting the namespace deletes its end of the link, and so the pair.
            if netns_exists(&h.netns) {
                if let Err(e) = ip(&["netns", "del", &h.netns]) {
                    errors.push(e);
                }
            }
            // (The kernel deletes the pair a moment after its namespace.)
            let mut tries = 0;
            while link_exists(&h.link) && tries < 50 {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // Only a link this network made (another network may hold the same name now).
            if link_exists(&h.link) && alias_of(&h.link) == self.alias() {
                if let Err(e) = ip(&["link", "del", &h.link]) {
                    if link_exists(&h.link) {
                        errors.push(e);
                    }
                }
            }
            for c in CONTROLLERS {
                let dir = h.cgroup_dir(c);
                // A cgroup is removable once its last process is gone (killed above).
                let mut tries = 0;
                while dir.exists() && std::fs::remove_dir(&dir).is_err() && tries < 100 {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                if dir.exists() {
                    errors.push(failed(
                        format!("remove cgroup {}", dir.display()),
                        "processes are still in it",
                    ));
                }
            }
        }
        let bridge = self.bridge();
        let ours = alias_of(&bridge) == self.alias();
        if link_exists(&bridge) && ours {
            if let Err(e) = ip(&["link", "del", &bridge]) {
                errors.push(e);
            }
        }
        errors
    }

    /// Reads a hosts file.
    pub fn load(path: &Path) -> Result<HostNet, HostError> {
        let text = std::fs::read_to_string(path).map_err(|e| HostError::File {
            path: path.into(),
            detail: e.to_string(),
        })?;
        let net: HostNet = toml::from_str(&text).map_err(|e| HostError::File {
            path: path.into(),
            detail: format!("bad hosts file: {e}"),
        })?;
        // Every name is derived again and must match: a hosts file is acted on as root, so
        // an edited one must never name another namespace, link or cgroup.
        net.check().map_err(|detail| HostError::File {
            path: path.into(),
            detail,
        })?;
        Ok(net)
    }

    /// Whether every recorded name is the one this network would make.
    fn check(&self) -> Result<(), String> {
        if self.tag.len() != 6 || !self.tag.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!("tag {:?} is not 6 hex digits", self.tag));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if !valid_name(&h.name) {
                return Err(format!("host name {:?}", h.name));
            }
            let want = self.host_at(i, &h.name);
            if *h != want {
                return Err(format!(
                    "host {} does not match the names this network makes ({want:?})",
                    h.name
                ));
            }
        }
        Ok(())
    }

    /// The host this network makes as its `i`-th, named `name`.
    fn host_at(&self, i: usize, name: &str) -> EmulatedHost {
        EmulatedHost {
            name: name.to_string(),
            addr: Ipv4Addr::new(SUBNET[0], SUBNET[1], self.net, (i + 2) as u8),
            netns: format!("florin-{}-{name}", self.tag),
            link: format!("fv{}x{i}", self.net),
            cgroup: format!("florin-{}-{name}", self.tag),
        }
    }

    /// Writes a hosts file (atomically).
    pub fn save(&self, path: &Path) -> Result<(), HostError> {
        let text = toml::to_string_pretty(self).map_err(|e| HostError::File {
            path: path.into(),
            detail: e.to_string(),
        })?;
        florin_fs::write_atomic(path, &[text.as_bytes()]).map_err(|e| HostError::File {
            path: path.into(),
            detail: e.to_string(),
        })
    }
}

/// Removes a network when dropped (benchmarks and tests: nothing is left behind on error).
/// With [`remove_on_signal`], also when the process is interrupted.
pub struct HostNetGuard(pub HostNet);

impl HostNetGuard {
    /// Guards `net` (and registers it for [`remove_on_signal`]).
    pub fn new(net: HostNet) -> HostNetGuard {
        if let Ok(mut live) = LIVE.lock() {
            live.push(net.tag.clone());
        }
        HostNetGuard(net)
    }
}

impl Drop for HostNetGuard {
    fn drop(&mut self) {
        for e in self.0.remove() {
            tracing::warn!("cleaning up emulated hosts: {e}");
        }
        if let Ok(mut live) = LIVE.lock() {
            live.retain(|t| *t != self.0.tag);
        }
    }
}

/// Tags of the networks guarded in this process.
static LIVE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// On SIGINT or SIGTERM, removes every network guarded in this process (their processes
/// included) and exits with 130: an interrupted benchmark leaves no host behind. Call once,
/// from outside any async runtime.
pub fn remove_on_signal() {
    std::thread::spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let tags = LIVE.lock().map(|l| l.clone()).unwrap_or_default();
            for tag in tags {
                for e in sweep(Some(&tag)) {
                    tracing::warn!("cleaning up emulated hosts: {e}");
                }
            }
            florin_obs::log::flush();
            std::process::exit(130);
        });
    });
}

/// Removes emulated hosts found on this machine by their names, without their hosts file:
/// those of network `tag`, or with `None` every Florin emulated host (every cluster's and
/// benchmark's on this machine). Kills the processes in their cgroups, then deletes their
/// namespaces (and so their links), cgroups and bridges. For hosts left behind by a process
/// that was killed; a cluster's own are removed by `cluster down`.
pub fn sweep(tag: Option<&str>) -> Vec<HostError> {
    // `florin-<6 hex digits>-…`: exactly the names a network makes.
    let ours = |name: &str| match name.strip_prefix("florin-") {
        Some(rest) => {
            let (t, after) = rest.split_at(rest.len().min(6));
            t.len() == 6
                && t.chars().all(|c| c.is_ascii_hexdigit())
                && after.starts_with('-')
                && tag.is_none_or(|want| want == t)
        }
        None => false,
    };
    let mut errors = Vec::new();
    let groups = |c: &str| -> Vec<PathBuf> {
        std::fs::read_dir(Path::new(CGROUP_ROOT).join(c))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| ours(&e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    };
    for g in groups("freezer") {
        let _ = write(&g.join("freezer.state"), "THAWED");
    }
    for c in CONTROLLERS {
        for g in groups(c) {
            let pids = std::fs::read_to_string(g.join("cgroup.procs")).unwrap_or_default();
            for pid in pids.lines() {
                let _ = Command::new("kill")
                    .args(["-KILL", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
    let netns: Vec<String> = std::fs::read_dir("/var/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| ours(n))
                .collect()
        })
        .unwrap_or_default();
    for n in netns {
        if let Err(e) = ip(&["netns", "del", &n]) {
            errors.push(e);
        }
    }
    for c in CONTROLLERS {
        for g in groups(c) {
            let mut tries = 0;
            while g.exists() && std::fs::remove_dir(&g).is_err() && tries < 100 {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if g.exists() {
                errors.push(failed(
                    format!("remove cgroup {}", g.display()),
                    "processes are still in it",
                ));
            }
        }
    }
    let bridges: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("flbr"))
                .collect()
        })
        .unwrap_or_default();
    for b in bridges {
        let alias =
            std::fs::read_to_string(format!("/sys/class/net/{b}/ifalias")).unwrap_or_default();
        let alias = alias.trim();
        let matches = match (tag, alias.strip_prefix("florin-")) {
            (Some(t), Some(a)) => a == t,
            (None, Some(a)) => a.len() == 6 && a.chars().all(|c| c.is_ascii_hexdigit()),
            _ => false,
        };
        if matches {
            if let Err(e) = ip(&["link", "del", &b]) {
                errors.push(e);
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_get_addresses_links_and_cgroups_and_are_removed() {
        if check_supported().is_err() {
            eprintln!("skipped: emulated hosts need root and cgroup v1 here");
            return;
        }
        let mut net = HostNet::claim(Some(0.1)).expect("claim");
        let a = net.add("a").expect("add a");
        let b = net.add("b").expect("add b");
        assert_ne!(a.addr, b.addr);
        assert!(netns_exists(&a.netns) && link_exists(&a.link));
        let quota =
            std::fs::read_to_string(a.cgroup_dir("cpu").join("cpu.cfs_quota_us")).expect("quota");
        assert_eq!(quota.trim(), "1000");
        assert_eq!(quota_of(Some(0.07)), (14_286, 1000));
        assert_eq!(quota_of(Some(0.5)), (10_000, 5000));
        // A process on host a sees its own address only, and lands in a's cgroups.
        let out = net
            .command("a", Path::new("sh"))
            .expect("command")
            .args(["-c", "ip -4 -o addr show dev eth0; cat /proc/self/cgroup"])
            .output()
            .expect("run");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&a.addr.to_string()), "{text}");
        assert!(text.contains(&format!("cpu:/{}", a.cgroup)), "{text}");
        // A hosts file naming anything this network would not make is refused (it is acted
        // on as root): another link, namespace or cgroup, or a tag that is not one.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("hosts.toml");
        net.save(&file).expect("save");
        assert_eq!(HostNet::load(&file).expect("load"), net);
        let text = std::fs::read_to_string(&file).expect("read");
        for (from, to) in [
            (a.link.as_str(), "eth0"),
            (a.netns.as_str(), "cni-1234"),
            (&*format!("cgroup = \"{}\"", a.cgroup), "cgroup = \"\""),
        ] {
            std::fs::write(&file, text.replacen(from, to, 1)).expect("write");
            assert!(HostNet::load(&file).is_err(), "{from} -> {to} accepted");
        }
        // Another network cannot take this one's bridge.
        let mut other = net.clone();
        other.tag = "000000".into();
        assert!(other.ensure().is_err());
        assert!(net.remove().is_empty());
        assert!(!netns_exists(&a.netns) && !link_exists(&a.link) && !link_exists(&net.bridge()));
        assert!(!a.cgroup_dir("cpu").exists());
    }
}

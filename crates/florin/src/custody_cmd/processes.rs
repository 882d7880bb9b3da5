//! The network's node processes: layout, start (`ensure_up`), stop (`down`), status report.

use super::*;

/// The layout under `data` as an absolute path, so pid checks match however the directory was
/// named on the command line.
pub fn layout_at(data: &Path) -> Result<Layout> {
    let abs = match std::fs::canonicalize(data) {
        Ok(p) => p,
        Err(_) => match (data.parent().map(std::fs::canonicalize), data.file_name()) {
            (Some(Ok(parent)), Some(name)) => parent.join(name),
            _ => std::env::current_dir()?.join(data),
        },
    };
    Ok(Layout::new(&abs))
}

pub(super) fn existing(data: &Path) -> Result<Layout> {
    let layout = layout_at(data)?;
    if !layout.exists() {
        bail!(
            "no key-management network in {} (run `florin custody up --data {}`)",
            data.display(),
            data.display()
        );
    }
    Ok(layout)
}

pub(super) fn open(layout: &Layout) -> Result<Arc<Kmn>> {
    let (net, me) = layout.load()?;
    Ok(Kmn::new(&net, me)?)
}

/// Exits the process when its parent exits (nodes started by `devnet`).
pub(super) fn watch_parent() {
    #[cfg(unix)]
    {
        let parent = std::os::unix::process::parent_id();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            if std::os::unix::process::parent_id() != parent {
                florin_obs::log::flush();
                std::process::exit(0);
            }
        });
    }
}

pub(super) fn pid_file(layout: &Layout, p: PartyId) -> PathBuf {
    layout.node_dir(p).join("pid")
}

/// The pid file: the node's pid, then the pid of the process that started it (older files hold
/// the node's pid alone).
fn read_pid_file(layout: &Layout, p: PartyId) -> Option<(u32, Option<u32>)> {
    let text = std::fs::read_to_string(pid_file(layout, p)).ok()?;
    let mut words = text.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    Some((pid, words.next().and_then(|w| w.parse().ok())))
}

/// The pid of node `p` if that process is alive and is that node.
pub(super) fn node_pid(layout: &Layout, p: PartyId) -> Option<u32> {
    let (pid, _) = read_pid_file(layout, p)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let cfg = layout.node_config(p);
    let want = cfg.to_string_lossy();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    (args.iter().any(|a| a == "custody") && args.iter().any(|a| *a == want)).then_some(pid)
}

/// Whether node process `pid` was started tied to a parent (`--exit-with-parent`) and that
/// parent is gone: it was reparented (to init or a subreaper), so it exits within a moment and
/// must not be adopted. `started_by` is the parent the pid file records: the node is orphaned
/// when its parent is another process now (what the node's own watcher checks). Without that
/// record (an older pid file), the parent is gone when it is no `florin` process any more.
fn orphaned_tied(pid: u32, started_by: Option<u32>) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let tied = cmdline
        .split(|&b| b == 0)
        .any(|a| a == b"--exit-with-parent");
    if !tied {
        return false;
    }
    let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // After the command name (which may hold spaces): state, then the parent's pid.
            let rest = s.rsplit_once(')')?.1.to_string();
            rest.split_whitespace().nth(1)?.parse::<u32>().ok()
        });
    let Some(ppid) = ppid else { return false };
    if let Some(parent) = started_by {
        return ppid != parent;
    }
    // The parent is gone when it is no `florin` process any more (a tied node is reparented
    // to init or a subreaper). What cannot be read says nothing: not orphaned.
    let exe = |p: u32| std::fs::read_link(format!("/proc/{p}/exe")).ok();
    match (exe(ppid), exe(pid)) {
        (Some(parent), Some(node)) => parent != node,
        _ => false,
    }
}

/// Waits (a few seconds at most) for the nodes whose tied parent is gone to exit, so that
/// they are started again rather than adopted while they are exiting; one still there is
/// stopped.
fn let_orphans_exit(layout: &Layout) {
    let Ok((net, _)) = layout.load() else { return };
    for p in net.members.iter().map(|m| m.party) {
        let Some(pid) = node_pid(layout, p) else {
            continue;
        };
        let started_by = read_pid_file(layout, p).and_then(|(_, by)| by);
        if !orphaned_tied(pid, started_by) {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while node_pid(layout, p) == Some(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Still that same process: stopped (never one started since under the same pid file).
        if node_pid(layout, p) == Some(pid) {
            let _ = signal(pid, "KILL");
        }
    }
}

pub(super) fn signal(pid: u32, sig: &str) -> Result<()> {
    let st = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .context("cannot run kill")?;
    if !st.success() {
        bail!("kill -{sig} {pid} failed");
    }
    Ok(())
}

/// Stops every node; returns how many were running.
pub fn down(layout: &Layout) -> Result<usize> {
    let (net, _) = layout.load()?;
    let mut pids = Vec::new();
    for m in &net.members {
        if let Some(pid) = node_pid(layout, m.party) {
            let _ = signal(pid, "TERM");
            pids.push((m.party, pid));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for &(p, pid) in &pids {
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if node_pid(layout, p).is_some() {
            let _ = signal(pid, "KILL");
        }
        let _ = std::fs::remove_file(pid_file(layout, p));
    }
    Ok(pids.len())
}

/// Creates the network if needed, starts the nodes that do not answer (as child processes of
/// this binary; with `tied`, they exit when this process exits), and makes each missing key:
/// imported from the given seed, or else by distributed key generation. Returns the handle
/// and how many nodes were started.
pub fn ensure_up(
    layout: &Layout,
    t: u16,
    n: u16,
    base_port: u16,
    keys: &[(String, Option<[u8; 32]>)],
    tied: bool,
    ecdsa: Option<EcdsaLevel>,
) -> Result<(Arc<Kmn>, usize)> {
    let fresh = !layout.exists();
    if fresh {
        let addrs = if base_port == 0 {
            free_loopback_addrs(n as usize)?
        } else {
            (0..n)
                .map(|i| std::net::SocketAddr::from(([127, 0, 0, 1], base_port + i)))
                .collect()
        };
        layout.create(t, &addrs)?;
    }
    if let Some(level) = ecdsa {
        let before = layout.ecdsa()?;
        if before != Some(level) {
            layout.set_ecdsa(Some(level))?;
            if !fresh {
                tracing::info!(
                    "note: ECDSA set to {} in every node.json; running nodes take it when restarted \
                     (`florin custody down`, then `up`)",
                    level.name()
                );
            }
        }
    }
    let kmn = open(layout)?;
    if kmn.t() != t || kmn.n() != n {
        tracing::info!(
            "note: {} holds a {}-of-{} network; using it as it is",
            layout.dir().display(),
            kmn.t(),
            kmn.n()
        );
    }
    let_orphans_exit(layout);
    let exe = std::env::current_exe().context("cannot find the florin binary")?;
    let mut started = 0;
    let mut start_down = |st: &[florin_node::custody::client::NodeState]| -> Result<()> {
        for s in st {
            // Down and not running (a node still starting, or still exiting, is left alone
            // and looked at again on the next pass).
            if s.up || node_pid(layout, s.party).is_some() {
                continue;
            }
            let cfg = layout.node_config(s.party);
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(layout.node_dir(s.party).join("node.log"))?;
            let mut cmd = Command::new(&exe);
            cmd.args(["custody", "node", "--config"])
                .arg(&cfg)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            if tied {
                cmd.arg("--exit-with-parent");
            }
            #[cfg(unix)]
            {
                use std::os::unix::process::CommandExt;
                // Its own process group: a Ctrl-C in this terminal does not reach the nodes.
                cmd.process_group(0);
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("cannot start node {}", s.party))?;
            std::fs::write(
                pid_file(layout, s.party),
                format!("{} {}", child.id(), std::process::id()),
            )?;
            started += 1;
        }
        Ok(())
    };
    // Wait for every node to answer.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = kmn.status();
        start_down(&st)?;
        let down: Vec<String> = st
            .iter()
            .filter(|s| !s.up)
            .map(|s| format!("node {}: {}", s.party, s.error.clone().unwrap_or_default()))
            .collect();
        if down.is_empty() {
            for (key, seed) in keys {
                // A key some nodes have committed and others not: an earlier creation stopped
                // in its commit round, or a node lost its share. Finish the commit if every
                // node holds the key; rebuild the share of a node that holds nothing from t
                // others (a key is committed only after every node stored it, so such a
                // node lost it). Using the key as it is would leave no spare share.
                let holders: Vec<&(String, String)> = st
                    .iter()
                    .filter_map(|s| s.keys.iter().find(|k| &k.0 == key))
                    .collect();
                // Every node holds the key and one holds it pending too: a refresh stopped in
                // its commit round. Finish it (or keep the old shares if not every node
                // stored the new ones), so no node is left on the old sharing.
                let refreshing = st.iter().any(|s| s.pending.iter().any(|k| &k.0 == key));
                if holders.len() == st.len() && refreshing {
                    kmn.commit_pending(key).map_err(|e| {
                        anyhow!("key {key}: a refresh stopped midway and cannot be finished: {e}")
                    })?;
                }
                if !holders.is_empty() && holders.len() < st.len() {
                    let lost: Vec<u16> = st
                        .iter()
                        .filter(|s| {
                            !s.keys.iter().any(|k| &k.0 == key)
                                && !s.pending.iter().any(|k| &k.0 == key)
                        })
                        .map(|s| s.party)
                        .collect();
                    let cannot = |e: &dyn std::fmt::Display| {
                        anyhow!(
                            "key {key} is committed at {} of {} nodes (an earlier key creation \
                             stopped midway, or nodes lost their shares) and cannot be finished: {e}",
                            holders.len(),
                            st.len()
                        )
                    };
                    for p in lost {
                        kmn.repair(key, p).map_err(|e| cannot(&e))?;
                        tracing::info!("key {key}: rebuilt node {p}'s lost share from the others");
                    }
                    kmn.commit_pending(key).map_err(|e| cannot(&e))?;
                    tracing::info!("key {key}: held by every node again");
                }
                if let Some(h) = holders.first() {
                    if let Some(seed) = seed {
                        let pk = florin_crypto::SecretKey::from_seed(seed).public_key();
                        if pk.to_address() != h.1 {
                            bail!(
                                "the key file for {key} holds {}, but the network holds another {key} key ({})",
                                pk.to_address(),
                                h.1
                            );
                        }
                    }
                    continue;
                }
                let g = match seed {
                    Some(seed) => kmn.import_seed(key, seed)?,
                    None => kmn.dkg(key)?,
                };
                tracing::info!(
                    "key {key}: {} ({} of {}, {})",
                    g.public_key().to_address(),
                    g.threshold(),
                    g.parties(),
                    if seed.is_some() {
                        "imported"
                    } else {
                        "generated by the nodes"
                    }
                );
            }
            return Ok((kmn, started));
        }
        if Instant::now() > deadline {
            bail!(
                "key-management nodes did not start (logs in {}/node-*/node.log): {}",
                layout.dir().display(),
                down.join("; ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Prints the network's state; returns how many nodes answered.
pub(super) fn report(layout: &Layout, kmn: &Kmn, json: bool, started: usize) -> Result<usize> {
    let st = kmn.status();
    let up = st.iter().filter(|s| s.up).count();
    if json {
        print_json(&json!({
            "data": layout.dir(),
            "t": kmn.t(),
            "n": kmn.n(),
            "up": up,
            "started": started,
            "nodes": st,
        }));
    } else {
        println!(
            "key-management network {} ({} of {}), {up} of {} nodes up",
            layout.dir().display(),
            kmn.t(),
            kmn.n(),
            kmn.n()
        );
        for s in &st {
            let state = if s.up {
                "up".to_string()
            } else {
                format!("DOWN ({})", s.error.clone().unwrap_or_default())
            };
            println!("  node {}  {}  {}  {state}", s.party, s.addr, s.key);
            if s.up {
                println!(
                    "      FROST nonces ready {} (shared by all keys)",
                    s.nonces_ready
                );
            }
            for (k, pk) in &s.keys {
                println!("      {k:<12} {pk}");
            }
            if let Some(e) = &s.ecdsa {
                if e.level == "dkls23" {
                    println!("      ECDSA (DKLs23 keys only)");
                } else {
                    println!(
                        "      ECDSA ({}): auxiliary info {}, primes {}",
                        e.level,
                        if e.aux_ready { "ready" } else { "not made" },
                        if e.primes_ready {
                            "ready"
                        } else if e.aux_ready {
                            "used"
                        } else {
                            "generating"
                        }
                    );
                }
                for (k, pk, held) in &e.keys {
                    if e.dkls23.contains(k) {
                        println!("      {k:<12} p256:{pk}  dkls23");
                    } else {
                        println!("      {k:<12} p256:{pk}  cggmp24, presignatures held {held}");
                    }
                }
                if !e.banned.is_empty() {
                    println!(
                        "      banned from DKLs23 runs (failed an OT check): parties {:?}",
                        e.banned
                    );
                }
            }
            for (k, scheme, pk) in &s.pending {
                let pk = if scheme == "p256" {
                    format!("p256:{pk}")
                } else {
                    pk.clone()
                };
                if s.keys.iter().any(|(c, _)| c == k) {
                    println!(
                        "      {k:<12} {pk}  REFRESHED SHARES PENDING: the old ones sign until \
                         committed (`florin custody commit {k}`)"
                    );
                } else {
                    println!("      {k:<12} {pk}  PENDING: signs nothing until committed");
                }
            }
        }
    }
    Ok(up)
}

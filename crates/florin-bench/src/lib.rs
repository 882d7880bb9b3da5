//! Florin's system-level benchmarks: every suite (`offline`, `ledger`, `transfer`, `custody`,
//! `cluster`, `abuse`), their command-line options ([`BenchArgs`]) and the runner ([`run`]) that prints
//! the JSON shape of `docs/benchmarks.md` (one object on stdout with `--json`, a table
//! otherwise).
//!
//! This crate owns the benchmarks; the `florin` command line only dispatches to it:
//! `florin bench <suite> …` parses [`BenchArgs`] and calls [`run`].

mod abuse;
mod cluster;
mod cluster_hosts;
mod custody;
mod custody_ecdsa;
mod custody_hosts;
mod custody_psp;
mod ledger;
mod ledger_e2e;
mod libsodium;
mod line_child;
mod offline;
mod report;
mod soak;
mod transfer;

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};

/// Options of `florin bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Which suite.
    suite: Suite,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Smoke-test sizes (under 30 s).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long variants.
    #[arg(long)]
    full: bool,
    /// Override the number of tokens per measurement.
    #[arg(long)]
    tokens: Option<usize>,
    /// PostgreSQL connection string for the ledger suite's PostgreSQL store (default: the
    /// `FLORIN_BENCH_PG` environment variable; skipped with a message when unset).
    #[arg(long, env = "FLORIN_BENCH_PG")]
    postgres: Option<String>,
    /// CA certificate (PEM) the PostgreSQL server's certificate must chain to: connects over
    /// TLS (`sslmode=require` in the connection string refuses a server without it).
    #[arg(long, env = "FLORIN_BENCH_PG_CA")]
    postgres_ca: Option<std::path::PathBuf>,
    /// `cluster`: every process on its own emulated host (network namespace and CPU share;
    /// needs root): Hamilton's Fig. 4 scaling on emulated machines. `soak`: a three-replica
    /// cluster on emulated hosts, every process's memory read apart. `custody`: custodial
    /// payments with the ledger, each provider and each key-management node on a host of its
    /// own.
    #[arg(long)]
    emulate_hosts: bool,
    /// With `--emulate-hosts`: each host's CPU share in cores (default: the machine's cores
    /// over the hosts of the 4-shard run for `cluster`, over its 9 hosts for `custody`).
    #[arg(long, requires = "emulate_hosts")]
    host_cpu: Option<f64>,
    /// With `--emulate-hosts`: run only this part of the suite.
    #[arg(long, requires = "emulate_hosts", value_enum)]
    only: Option<cluster_hosts::Part>,
    /// `cluster --emulate-hosts`: `atomizer` measures Hamilton's atomizer beside two-phase
    /// commit, size by size in the same run (the scaling and failures parts).
    #[arg(
        long,
        requires = "emulate_hosts",
        value_enum,
        default_value = "two-phase"
    )]
    architecture: cluster_hosts::Arch,
    /// Internal: run as one of the load generators of `florin bench cluster --emulate-hosts`,
    /// or as one of the payment providers of `florin bench custody --emulate-hosts`.
    #[arg(long, hide = true)]
    loadgen: Option<std::path::PathBuf>,
    /// Internal: run as `florin bench abuse`'s attacker against this node URL.
    #[arg(long, hide = true)]
    attack: Option<String>,
    /// Internal: run one engine of `florin bench soak` (each runs in a process of its own).
    #[arg(long, hide = true)]
    soak_engine: Option<String>,
    /// `report`: read the suites' JSON files from this directory instead of running them.
    #[arg(long)]
    from: Option<std::path::PathBuf>,
    /// `report`: the HTML page to write.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// `report`: run only these suites (comma-separated; default: offline, ledger, transfer,
    /// custody, cluster).
    #[arg(long, value_delimiter = ',')]
    suites: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Suite {
    /// Offline cash: minting, client and authority verification, the thesis's Table I.
    Offline,
    /// Online ledger: swap stores side by side, sentinel validation (Hamilton section 6).
    Ledger,
    /// Device-to-device transfer: raw UDP, TCP, the Florin channel, tokens end to end.
    Transfer,
    /// Threshold custody: key generation, presigning and signing versus (t, n); custodial
    /// payments end to end with threshold and single keys (the source document's section 6).
    Custody,
    /// Sharded, Raft-replicated engine: throughput and latency versus shards and replication,
    /// the single-node engine as reference, leader failover (Hamilton §6, Fig. 4 and 5).
    Cluster,
    /// Memory soak: the single-node engine and a three-replica cluster take tens of millions
    /// of transfers; resident memory and the txids remembered for replays stay flat.
    Soak,
    /// Abuse: a legitimate client's p99 latency while an attacker in its own network namespace
    /// and CPU share floods bogus batches, oversized bodies and idle connections; the node's
    /// memory (needs root).
    Abuse,
    /// One HTML page with every seed figure beside Florin's (SVG plots): runs the suites
    /// (`--quick` for smoke sizes) or reads their JSON from `--from DIR`; writes `--out FILE`.
    Report,
}

/// A figure from a source document or a peer measured in the same run.
#[derive(Serialize, Clone)]
pub struct Reference {
    /// The figure.
    pub value: f64,
    /// Where it comes from.
    pub source: String,
}

/// One result.
#[derive(Serialize)]
pub struct BenchResult {
    /// Stable name.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Unit.
    pub unit: String,
    /// Parameters of this point.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub params: Value,
    /// The source document's figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<Reference>,
    /// A peer measured in the same run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub baseline: Option<Reference>,
}

/// Collects results and reports progress on stderr: a line per result, and on a terminal (not
/// under `--json`) a spinner with the suite's time and the results so far.
pub struct Recorder {
    results: Vec<BenchResult>,
    started: Instant,
    spinner: Option<indicatif::ProgressBar>,
}

impl Recorder {
    fn new(suite: &str, json: bool) -> Self {
        use std::io::IsTerminal;
        let spinner = (!json && std::io::stderr().is_terminal()).then(|| {
            let pb = indicatif::ProgressBar::with_draw_target(
                None,
                indicatif::ProgressDrawTarget::stderr(),
            )
            .with_finish(indicatif::ProgressFinish::AndClear);
            if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            {
                pb.set_style(style);
            }
            pb.set_message(format!("florin bench {suite}: measuring"));
            pb.enable_steady_tick(std::time::Duration::from_millis(120));
            pb
        });
        Recorder {
            results: Vec::new(),
            started: Instant::now(),
            spinner,
        }
    }

    /// Records a result.
    pub fn add(
        &mut self,
        name: &str,
        value: f64,
        unit: &str,
        params: Value,
        seed: Option<Reference>,
        baseline: Option<Reference>,
    ) {
        let line = || {
            tracing::info!(
                "[{:>6.1}s] {name} {params} = {value:.1} {unit}",
                self.started.elapsed().as_secs_f64()
            )
        };
        match &self.spinner {
            // The line above the spinner, not through it.
            Some(pb) => {
                pb.suspend(line);
                pb.set_message(format!(
                    "{} result(s) so far; measuring after {name}",
                    self.results.len() + 1
                ));
            }
            None => line(),
        }
        self.results.push(BenchResult {
            name: name.into(),
            value,
            unit: unit.into(),
            params,
            seed,
            baseline,
        });
    }
}

/// Sizes of a run.
#[derive(Clone, Copy)]
pub struct Scale {
    /// Tokens per measurement.
    pub tokens: usize,
    /// Long variants.
    pub full: bool,
}

fn machine() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|x| x.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    json!({ "cores": cores, "cpu": cpu })
}

/// When and how a suite ran: the sizes, the time it finished (UTC), and the source's commit
/// when the binary runs inside its git checkout (`git rev-parse`; absent otherwise).
fn run_info(quick: bool, full: bool) -> Value {
    let now = florin_ledger::expiry::unix_now();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty());
    json!({
        "quick": quick,
        "full": full,
        "finished_unix": now,
        "finished_utc": utc(now),
        "commit": commit,
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (the proleptic Gregorian calendar).
pub(crate) fn utc(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3_600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Runs a suite.
pub fn run(args: BenchArgs) -> Result<ExitCode> {
    if cfg!(debug_assertions) {
        tracing::warn!(
            "this is a debug build; benchmark figures are meaningful only with --release"
        );
    }
    match (args.suite, args.loadgen.as_deref()) {
        (Suite::Cluster, Some(path)) => return cluster_hosts::loadgen(path),
        (Suite::Custody, Some(path)) => return custody_hosts::provider(path),
        _ => {}
    }
    if let (Suite::Abuse, Some(url)) = (args.suite, args.attack.as_deref()) {
        return abuse::attack(url);
    }
    if let Suite::Report = args.suite {
        let Some(out) = args.out.as_deref() else {
            anyhow::bail!("`florin bench report` needs --out FILE (the HTML page to write)");
        };
        return report::run(
            args.quick,
            args.from.as_deref(),
            &args.suites,
            out,
            args.json,
        );
    }
    if args.from.is_some() || args.out.is_some() || !args.suites.is_empty() {
        anyhow::bail!("--from, --out and --suites belong to `florin bench report`");
    }
    let tokens = args.tokens.unwrap_or(if args.quick {
        2_000
    } else if args.full {
        100_000
    } else {
        20_000
    });
    let scale = Scale {
        tokens: tokens.max(10),
        full: args.full,
    };
    if args.only.is_some() && !matches!(args.suite, Suite::Cluster) {
        anyhow::bail!("--only names a part of `florin bench cluster --emulate-hosts`");
    }
    let name = args
        .suite
        .to_possible_value()
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    let mut rec = Recorder::new(&name, args.json);
    let suite = match args.suite {
        Suite::Offline => {
            offline::run(&mut rec, scale)?;
            "offline"
        }
        Suite::Ledger => {
            ledger::run(
                &mut rec,
                scale,
                args.postgres.as_deref(),
                args.postgres_ca.as_deref(),
            )?;
            "ledger"
        }
        Suite::Transfer => {
            transfer::run(&mut rec, scale)?;
            "transfer"
        }
        Suite::Custody if args.emulate_hosts => {
            custody_hosts::run(&mut rec, args.quick, args.host_cpu)?;
            "custody"
        }
        Suite::Custody => {
            custody::run(&mut rec, scale)?;
            "custody"
        }
        Suite::Cluster if args.emulate_hosts => {
            cluster_hosts::run(
                &mut rec,
                scale,
                args.quick,
                args.host_cpu,
                args.only,
                args.architecture,
            )?;
            "cluster"
        }
        Suite::Cluster => {
            cluster::run(&mut rec, scale)?;
            "cluster"
        }
        Suite::Abuse => {
            abuse::run(&mut rec, scale, args.quick)?;
            "abuse"
        }
        Suite::Report => anyhow::bail!("`florin bench report` is handled before the suites"),
        Suite::Soak => {
            soak::run(
                &mut rec,
                args.quick,
                args.soak_engine.as_deref(),
                args.emulate_hosts,
            )?;
            "soak"
        }
    };
    if args.json {
        let out = json!({
            "suite": suite,
            "florin_version": env!("CARGO_PKG_VERSION"),
            "machine": machine(),
            "run": run_info(args.quick, args.full),
            "results": rec.results,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{:<46} {:>14} {:<14} {:>12}  params / source",
            "result", "florin", "unit", "reference"
        );
        for r in &rec.results {
            let (refv, src) = match (&r.seed, &r.baseline) {
                (_, Some(b)) => (format!("{:.1}", b.value), b.source.clone()),
                (Some(s), None) => (format!("{:.1}", s.value), s.source.clone()),
                _ => (String::new(), String::new()),
            };
            let params = if r.params.is_null() {
                String::new()
            } else {
                r.params.to_string()
            };
            println!(
                "{:<46} {:>14.1} {:<14} {:>12}  {params} {src}",
                r.name, r.value, r.unit, refv
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat` (Linux,
/// whose `USER_HZ` is 100); `None` elsewhere.
pub(crate) fn process_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

//! `florin bench report`: one self-contained HTML page with every seed figure beside Florin's,
//! as SVG plots (plotters' SVG back end: no fonts, no bitmaps, no script).
//!
//! The suites run as child processes of this binary (`florin bench SUITE --json [--quick]`), or
//! their JSON files are read from `--from DIR`. Each figure names the results it plots; the
//! seed's series is the source document's figure for the same points (each result's `seed`),
//! plus figures the source text states for the figure itself ([`Seed`]). A figure whose results
//! are absent says "not yet measured" and how to produce them; a figure whose source text
//! gives no numbers says so, rather than inventing a curve.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;

/// The suites a report runs, in order.
pub const SUITES: &[&str] = &["offline", "ledger", "transfer", "custody", "cluster"];

/// One suite's output (the `--json` object), or why it is missing.
struct Run {
    suite: String,
    output: Option<Value>,
    error: Option<String>,
}

impl Run {
    fn results(&self) -> &[Value] {
        self.output
            .as_ref()
            .and_then(|o| o["results"].as_array())
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    fn machine(&self) -> String {
        let Some(o) = &self.output else {
            return "—".into();
        };
        let m = &o["machine"];
        let run = &o["run"];
        let mut s = format!(
            "{} ({} cores), florin {}",
            m["cpu"].as_str().unwrap_or("unknown CPU"),
            m["cores"].as_u64().unwrap_or(0),
            o["florin_version"].as_str().unwrap_or("?")
        );
        if let Some(c) = run["commit"].as_str() {
            let _ = write!(s, ", commit {c}");
        }
        if let Some(at) = run["finished_utc"].as_str() {
            let _ = write!(s, ", run finished {at}");
        }
        if run["quick"].as_bool() == Some(true) {
            s.push_str(", --quick sizes");
        }
        s
    }
}

/// The x of a point: a numeric parameter, or a category.
#[derive(Clone, Copy)]
enum X {
    /// A numeric parameter of the result.
    Param(&'static str),
    /// A string parameter of the result, one bar group per value.
    Category(&'static str),
    /// The result's name, with a prefix and suffix cut off (Table I's steps).
    Name(&'static str, &'static str),
    /// The series' own label: one bar group per series (results of different names), all of
    /// Florin's in one colour.
    Series,
}

/// One of Florin's series: results named `name` whose params match `when`; `times` multiplies
/// each value by one of its params (a per-core figure times its threads).
struct Series {
    label: &'static str,
    name: &'static str,
    when: &'static [(&'static str, &'static str)],
    times: Option<&'static str>,
}

const fn series(
    label: &'static str,
    name: &'static str,
    when: &'static [(&'static str, &'static str)],
) -> Series {
    Series {
        label,
        name,
        when,
        times: None,
    }
}

/// What the source documents say for a figure, beyond each result's own `seed`.
enum Seed {
    /// The results' own seed figures, one point per x (the first where several differ).
    FromResults,
    /// Points a text gives, as a series of their own: (legend, source, [(x, y)]).
    Points(&'static str, &'static str, &'static [(&'static str, f64)]),
    /// A figure a text states for the whole range, drawn as a horizontal line: (legend,
    /// source, value).
    Bound(&'static str, &'static str, f64),
    /// A time window a text states after an event at the results' `killed_at_s` (Fig. 5:
    /// throughput back within it), drawn as a band.
    Window(&'static str, f64),
}

struct Figure {
    id: &'static str,
    title: &'static str,
    doc: &'static str,
    suite: &'static str,
    how: &'static str,
    x: X,
    x_label: &'static str,
    y_label: &'static str,
    log_y: bool,
    series: Vec<Series>,
    seed: Vec<Seed>,
    /// Said under the plot (what differs from the seed's set-up).
    note: &'static str,
}

const THESIS: &str = "001_… TU Delft thesis (final)";
const HAMILTON: &str = "003_… Hamilton (NSDI '23)";
const THRESHOLD: &str = "004_… Threshold signatures for CBDCs (TUM / G+D)";
const ONE_PHASE: &str = "one-phase where a transaction lies on one shard";
const TWO_PHASE: &str = "two-phase for every transaction";

fn figures() -> Vec<Figure> {
    vec![
        Figure {
            id: "thesis-fig3",
            title: "Thesis Fig. 3: signing and verifying, by threads",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Param("threads"),
            x_label: "threads",
            y_label: "per second (log; units in the legend)",
            log_y: true,
            series: vec![
                series("Florin: mint (tokens/s)", "mint_tokens_per_s", &[]),
                series("Florin: client verify (tokens/s)", "client_verify_tokens_per_s", &[]),
                Series {
                    label: "Florin: authority verify, all threads (signatures/s)",
                    name: "authority_verify_sigs_per_s_per_core",
                    when: &[("links", "3")],
                    times: Some("threads"),
                },
            ],
            seed: vec![
                Seed::Points(
                    "thesis: signing, 1 CPU (tokens/s)",
                    "Fig. 3 (text, VI-A, L660-665): on 1 CPU, signing ≈38,239 tokens/s (5.62 MB/s); throughput stops rising after 4 CPUs",
                    &[("1", 38_239.0)],
                ),
                Seed::Points(
                    "thesis: verifying, 1 CPU (tokens/s, 3 signatures each)",
                    "verifying ≈5,840 tokens/s (2.47 MB/s) on 1 CPU (L662-665; the OCR's \"45840\" at L692 is ≈5840)",
                    &[("1", 5_840.0)],
                ),
            ],
            note: "The thesis measured Kotlin with Lazysodium on a laptop (i5 @ 2.11 GHz); Florin is Rust with ed25519-dalek on this machine. A token's verification checks 3 signatures.",
        },
        Figure {
            id: "thesis-fig4",
            title: "Thesis Fig. 4: Ed25519 libraries at the token's message size (147 bytes)",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Category("op"),
            x_label: "operation",
            y_label: "operations/s (1 thread)",
            log_y: false,
            series: vec![
                series("Florin (ed25519-dalek; cofactored verification)", "ed25519_ops_per_s", &[("library", "ed25519-dalek")]),
                series("ring (same run)", "ed25519_ops_per_s", &[("library", "ring")]),
                series("libsodium (same run)", "ed25519_ops_per_s", &[("library", "libsodium")]),
            ],
            seed: vec![Seed::FromResults],
            note: "Same message size as the thesis (147 bytes, its upper bound per token operation). Its text gives numbers for libsodium only (Bouncy Castle and I2P: none); 17,687 verifications/s is its 2.60 MB/s over 147 bytes.",
        },
        Figure {
            id: "thesis-fig5",
            title: "Thesis Fig. 5: authority verification by chain length",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Param("links"),
            x_label: "links in the token's chain (3: minted, paid once, deposited)",
            y_label: "signatures/s (1 thread)",
            log_y: false,
            series: vec![series("Florin: authority verify", "authority_verify_sigs_per_s_per_core", &[("threads", "1")])],
            seed: vec![Seed::Bound(
                "thesis: at most ≈17,000 signatures/s per thread",
                "Table I discussion (L855-859): at most roughly 17,000 signatures per second per thread, whatever the token's size (Fig. 5 itself has no numbers in the text)",
                17_000.0,
            )],
            note: "",
        },
        Figure {
            id: "thesis-fig6",
            title: "Thesis Fig. 6: throughput of the transfer layers",
            doc: THESIS,
            suite: "transfer",
            how: "florin bench transfer",
            x: X::Category("layer"),
            x_label: "layer",
            y_label: "MB/s (log)",
            log_y: true,
            series: vec![series("Florin", "transfer_mb_per_s", &[])],
            seed: vec![Seed::FromResults],
            note: "Seed beside each layer: local UDP (801.16), the native pipeline beside TCP (1,652.28; a pipe, the thesis's upper bound), EVA beside the channel (8.25), Kotlin-IPv8 with encryption beside ChaChaPoly (14.99).",
        },
        Figure {
            id: "thesis-table1",
            title: "Thesis Table I: end-to-end token throughput, step by step",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Name("e2e_", "_tokens_per_s"),
            x_label: "step",
            y_label: "tokens/s (log)",
            log_y: true,
            series: vec![series("Florin", "e2e_*", &[])],
            seed: vec![Seed::FromResults],
            note: "Receiving here is decoding (the network is Fig. 6); the authority's validation also checks forks, re-anchors and commits durably.",
        },
        Figure {
            id: "thesis-fig7",
            title: "Thesis Fig. 7: UDP loss by blocks per window (106,496-byte buffer)",
            doc: THESIS,
            suite: "transfer",
            how: "florin bench transfer",
            x: X::Param("window"),
            x_label: "1,200-byte blocks per window",
            y_label: "fraction of blocks lost",
            log_y: false,
            series: vec![series("Florin: raw UDP, EVA-like windows", "udp_window_loss_fraction", &[])],
            seed: vec![],
            note: "The receiver does per-block work (8 SHA-256 passes), as the prototype's did: a receiver slower than its sender. The device channel loses nothing (TCP underneath: lost_or_duplicated_tokens = 0). The thesis's text: loss soars at 256 blocks per window without encryption, none with it.",
        },
        Figure {
            id: "thesis-fig8",
            title: "Thesis Fig. 8: UDP loss by receive buffer (256 blocks per window)",
            doc: THESIS,
            suite: "transfer",
            how: "florin bench transfer",
            x: X::Param("rcvbuf"),
            x_label: "SO_RCVBUF requested (bytes; the kernel grants twice)",
            y_label: "fraction of blocks lost",
            log_y: false,
            series: vec![series("Florin: raw UDP, 256 blocks per window", "udp_buffer_loss_fraction", &[])],
            seed: vec![],
            note: "The thesis's text: packet loss falls as the buffer grows from its 106k bytes, and near 0 % a larger buffer no longer helps.",
        },
        Figure {
            id: "thesis-fig9",
            title: "Thesis Fig. 9: where the authority's time goes in deposits",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Category("part"),
            x_label: "part",
            y_label: "% of the time",
            log_y: false,
            series: vec![series("Florin", "deposit_cpu_share_pct", &[])],
            seed: vec![Seed::FromResults],
            note: "Not a sampling profile: the deposits' cryptography (batch verification on one thread, one re-anchor signature per token) is timed alone on the same tokens and divided by the deposits' time.",
        },
        Figure {
            id: "eurotoken-bounds",
            title: "Eurotoken draft Fig. 1–2: the LAN and verification bounds beside Florin's rates",
            doc: "002_… Eurotoken draft",
            suite: "offline",
            how: "florin bench offline and florin bench transfer",
            x: X::Series,
            x_label: "",
            y_label: "tokens/s (log)",
            log_y: true,
            series: vec![
                series("verification, 1 core", "client_verify_tokens_per_s", &[("threads", "1")]),
                series("device channel, end to end", "e2e_tokens_per_s", &[]),
            ],
            seed: vec![
                Seed::Points(
                    "draft: verification bound, all cores of its laptop",
                    "Fig. 2: verification ≈90 MB/s, stated bound ≈630,000 tokens/s (its own 90 MB/s ÷ 157 B would be ≈573,000)",
                    &[("verification, all cores (draft)", 630_000.0)],
                ),
                Seed::Points(
                    "derived here: a 1 GbE LAN's bound",
                    "Fig. 1: a LAN ≈125 MB/s; ÷ 157 bytes a token ≈796,000 tokens/s (the division is this report's, not the draft's)",
                    &[("LAN 1 GbE (derived)", 796_178.0)],
                ),
            ],
            note: "Florin has no LAN here (loopback only): its channel's rate is Fig. 6's.",
        },
        Figure {
            id: "hamilton-fig4",
            title: "Hamilton Fig. 4: throughput by shards",
            doc: HAMILTON,
            suite: "cluster",
            how: "florin bench cluster (one machine); florin bench cluster --emulate-hosts --only scaling [--architecture atomizer] (emulated machines, root)",
            x: X::Param("shards"),
            x_label: "shards",
            y_label: "transactions/s (log)",
            log_y: true,
            series: vec![
                series("Florin, one machine: replication 1", "cluster_tx_per_s", &[("replicas", "1"), ("commit", ONE_PHASE)]),
                series("Florin, one machine: replication 3", "cluster_tx_per_s", &[("replicas", "3"), ("commit", ONE_PHASE)]),
                series("Florin, emulated hosts: 2PC, replication 3", "cluster_hosts_tx_per_s", &[("commit", TWO_PHASE)]),
                series("Florin, emulated hosts: one-phase, replication 3", "cluster_hosts_tx_per_s", &[("commit", ONE_PHASE)]),
                series("Florin, emulated hosts: atomizer, replication 3", "cluster_hosts_tx_per_s", &[("architecture", "atomizer")]),
            ],
            seed: vec![
                Seed::Bound(
                    "Hamilton: 1.7 M tx/s peak (many shards on many machines)",
                    "Fig. 4 (L87): 1.7 M transactions/s with 2PC at its largest configuration (measured, not a bound: drawn across for comparison)",
                    1_700_000.0,
                ),
                Seed::Bound(
                    "Hamilton: the atomizer's peak, 170 K tx/s",
                    "§6: the atomizer architecture tops out at 170 K transactions/s, bound by its leader",
                    170_000.0,
                ),
                Seed::Points(
                    "Hamilton's baseline: CockroachDB",
                    "§6 (L354): CockroachDB 3.4 K, 5.7 K and 11 K tx/s on 1, 2 and 4 shards",
                    &[("1", 3_400.0), ("2", 5_700.0), ("4", 11_000.0)],
                ),
            ],
            note: "On one machine all shards share its cores: Hamilton's scaling needs a machine per shard (--emulate-hosts).",
        },
        Figure {
            id: "hamilton-fig5",
            title: "Hamilton Fig. 5: throughput around a leader's failure",
            doc: HAMILTON,
            suite: "cluster",
            how: "florin bench cluster",
            x: X::Param("t_s"),
            x_label: "seconds (a shard leader killed at the line)",
            y_label: "transactions/s (0.5 s windows)",
            log_y: false,
            series: vec![series("Florin", "failover_tx_per_s", &[])],
            seed: vec![Seed::Window(
                "Fig. 5 (L367): after each data-centre failure throughput was reduced for less than 15 s before recovering, no data loss (its throughput values are not in the text)",
                15.0,
            )],
            note: "Florin's recovery time and lost transactions are results of their own (failover_recovery_s, failover_lost_tx).",
        },
        Figure {
            id: "hamilton-fig6",
            title: "Hamilton Fig. 6: peak throughput by tolerated failures",
            doc: HAMILTON,
            suite: "cluster",
            how: "florin bench cluster --emulate-hosts --only failures [--architecture atomizer] (root)",
            x: X::Param("tolerated_failures"),
            x_label: "failures tolerated per group ((replicas − 1) / 2)",
            y_label: "transactions/s",
            log_y: false,
            series: vec![
                series("Florin, emulated hosts: 2PC", "cluster_hosts_tx_per_s_by_failures", &[("commit", TWO_PHASE)]),
                series("Florin, emulated hosts: atomizer", "cluster_hosts_tx_per_s_by_failures", &[("architecture", "atomizer")]),
            ],
            seed: vec![],
            note: "Hamilton's text says only that peak throughput falls as replication grows, the atomizer's more steeply.",
        },
        Figure {
            id: "hamilton-fig7",
            title: "Hamilton Fig. 7: valid throughput with double spends and large transactions",
            doc: HAMILTON,
            suite: "ledger",
            how: "florin bench ledger",
            x: X::Param("pct"),
            x_label: "% of the workload",
            y_label: "valid transactions/s",
            log_y: false,
            series: vec![
                series("Florin: double spends", "mix_valid_tx_per_s", &[("large_pct", "0")]),
                series("Florin: large (8-in/8-out)", "mix_valid_tx_per_s", &[("double_spend_pct", "0")]),
            ],
            seed: vec![],
            note: "Hamilton's text says only that valid throughput falls as either share grows, large transactions most.",
        },
        Figure {
            id: "hamilton-postgres",
            title: "Hamilton §6: the UHS swap, Florin's stores beside PostgreSQL",
            doc: HAMILTON,
            suite: "ledger",
            how: "florin bench ledger (PostgreSQL with FLORIN_BENCH_PG)",
            x: X::Category("store"),
            x_label: "store",
            y_label: "swaps/s (log)",
            log_y: true,
            series: vec![series("Florin", "swap_per_s", &[])],
            seed: vec![Seed::FromResults],
            note: "Hamilton's PostgreSQL reached 63.4 K swaps/s at most, 61 K on average, on one c5a.8xlarge (L337); Hamilton's 1.7 M, 26× that (L87), was a geo-distributed cluster, beside which this machine's embedded store is drawn.",
        },
        Figure {
            id: "threshold-fig2",
            title: "Threshold document Fig. 2: distributed key generation by nodes",
            doc: THRESHOLD,
            suite: "custody",
            how: "florin bench custody",
            x: X::Param("n"),
            x_label: "nodes (n)",
            y_label: "ms (computation)",
            log_y: false,
            series: vec![series("Florin: FROST key generation", "dkg_ms", &[("part", "compute"), ("scheme", "frost-ed25519")])],
            seed: vec![Seed::Points(
                "document: CGGMP21 key generation",
                "Fig. 2 (L248): CGGMP21 key generation up to 2,500 ms of computation at n = 52, t = 32, growing quadratically",
                &[("52", 2_500.0)],
            )],
            note: "The document measured up to n = 52 on 64-vCPU nodes; Florin's suite measures fewer nodes on this machine.",
        },
        Figure {
            id: "threshold-fig3-4",
            title: "Threshold document Fig. 3–4: pre-signing and signing by threshold",
            doc: THRESHOLD,
            suite: "custody",
            how: "florin bench custody",
            x: X::Param("t"),
            x_label: "threshold (t)",
            y_label: "ms (computation)",
            log_y: false,
            series: vec![
                series("Florin: FROST pre-signing", "presign_ms", &[("part", "compute"), ("scheme", "frost-ed25519")]),
                series("Florin: FROST signing", "sign_ms", &[("part", "compute"), ("scheme", "frost-ed25519")]),
            ],
            seed: vec![],
            note: "The document's text says only that both grow quadratically with t and differ little.",
        },
        Figure {
            id: "threshold-fig5",
            title: "Threshold document Fig. 5: payments end to end, single and threshold keys",
            doc: THRESHOLD,
            suite: "custody",
            how: "florin bench custody",
            x: X::Series,
            x_label: "",
            y_label: "payments/s (log)",
            log_y: true,
            series: vec![
                series("same provider, single key", "e2e_payments_per_s", &[("custody", "single"), ("route", "same_provider"), ("users", "10")]),
                series("same provider, threshold", "e2e_payments_per_s", &[("custody", "threshold"), ("route", "same_provider"), ("users", "10")]),
                series("across providers, single key", "e2e_payments_per_s", &[("custody", "single"), ("route", "cross_provider"), ("users", "10")]),
                series("across providers, threshold", "e2e_payments_per_s", &[("custody", "threshold"), ("route", "cross_provider"), ("users", "10")]),
            ],
            seed: vec![Seed::Points(
                "document: 100–300 users",
                "Fig. 5 (L260): 190 → ≈10.7 payments/s within a provider and 60 → ≈1.2 across, single → threshold keys, at 100–300 concurrent users",
                &[
                    ("same provider, single key", 190.0),
                    ("same provider, threshold", 10.7),
                    ("across providers, single key", 60.0),
                    ("across providers, threshold", 1.2),
                ],
            )],
            note: "Florin: 10 concurrent users, FROST 2-of-3 as the threshold key.",
        },
    ]
}

/// A parameter as text (strings without quotes, numbers as written).
fn param(r: &Value, k: &str) -> Option<String> {
    match &r["params"][k] {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn matches(r: &Value, s: &Series) -> bool {
    let name = r["name"].as_str().unwrap_or_default();
    let named = match s.name.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == s.name,
    };
    named
        && s.when
            .iter()
            .all(|(k, v)| param(r, k).as_deref() == Some(*v))
}

/// The x of a result under `x`.
fn x_of(r: &Value, x: X) -> Option<String> {
    match x {
        X::Param("pct") => {
            // Fig. 7: whichever share is not zero (0 when both are).
            let d = param(r, "double_spend_pct")?;
            let l = param(r, "large_pct")?;
            Some(if d != "0" { d } else { l })
        }
        X::Param(k) | X::Category(k) => param(r, k),
        X::Name(prefix, suffix) => {
            let n = r["name"].as_str()?;
            n.strip_prefix(prefix)?
                .strip_suffix(suffix)
                .map(str::to_string)
        }
        X::Series => None,
    }
}

/// What a plot draws.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Florin,
    Seed,
}

/// A plotted series: (x, y) points.
struct Plotted {
    label: String,
    points: Vec<(String, f64)>,
    kind: Kind,
}

/// Most categories or points a plot draws (a hostile file cannot make one huge).
const MAX_POINTS: usize = 256;

/// A usable y: finite, not absurd, and positive on a log axis.
fn usable(y: f64, log: bool) -> bool {
    y.is_finite() && y.abs() < 1e15 && (!log || y > 0.0)
}

fn collect(fig: &Figure, results: &[Value]) -> (Vec<Plotted>, Vec<String>) {
    let mut out: Vec<Plotted> = Vec::new();
    let mut from_results: Vec<(String, f64)> = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    let numeric = matches!(fig.x, X::Param(_));
    let take_seeds = fig.seed.iter().any(|sd| matches!(sd, Seed::FromResults));
    for s in &fig.series {
        let mut pts = Vec::new();
        for r in results.iter().filter(|r| matches(r, s)) {
            let x = match fig.x {
                X::Series => Some(s.label.to_string()),
                other => x_of(r, other),
            };
            let Some(x) = x.filter(|x| !numeric || x.parse::<f64>().is_ok_and(f64::is_finite))
            else {
                continue;
            };
            let factor = s.times.and_then(|k| r["params"][k].as_f64()).unwrap_or(1.0);
            let Some(y) = r["value"]
                .as_f64()
                .map(|v| v * factor)
                .filter(|y| usable(*y, fig.log_y))
            else {
                continue;
            };
            if pts.len() < MAX_POINTS {
                pts.push((x.clone(), y));
            }
            if take_seeds {
                if let (Some(v), Some(src)) =
                    (r["seed"]["value"].as_f64(), r["seed"]["source"].as_str())
                {
                    // One seed per x: the first (a figure's seed is one number per point).
                    if usable(v, fig.log_y)
                        && v != 0.0
                        && !from_results.iter().any(|(px, _)| *px == x)
                    {
                        from_results.push((x, v));
                        if !sources.iter().any(|s| s == src) {
                            sources.push(src.to_string());
                        }
                    }
                }
            }
        }
        out.push(Plotted {
            label: s.label.to_string(),
            points: pts,
            kind: Kind::Florin,
        });
    }
    if matches!(fig.x, X::Series) {
        // One colour for Florin: the categories are the series.
        let points: Vec<(String, f64)> = out.drain(..).flat_map(|p| p.points).collect();
        out.push(Plotted {
            label: "Florin".into(),
            points,
            kind: Kind::Florin,
        });
    }
    if !from_results.is_empty() {
        out.push(Plotted {
            label: "seed (source document)".into(),
            points: from_results,
            kind: Kind::Seed,
        });
    }
    for sd in &fig.seed {
        match sd {
            Seed::Points(label, src, pts) => {
                out.push(Plotted {
                    label: label.to_string(),
                    points: pts.iter().map(|(x, y)| (x.to_string(), *y)).collect(),
                    kind: Kind::Seed,
                });
                sources.push(src.to_string());
            }
            Seed::Bound(_, src, _) | Seed::Window(src, _) => sources.push(src.to_string()),
            Seed::FromResults => {}
        }
    }
    (out, sources)
}

const FLORIN_COLORS: [RGBColor; 3] = [
    RGBColor(29, 78, 216),
    RGBColor(21, 128, 61),
    RGBColor(126, 34, 206),
];
const SEED_COLORS: [RGBColor; 3] = [
    RGBColor(220, 38, 38),
    RGBColor(234, 88, 12),
    RGBColor(133, 77, 14),
];

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing: {e:?}")
}

/// The SVG of one figure.
fn plot(fig: &Figure, series: &[Plotted], event_at: Option<f64>) -> Result<String> {
    let numeric = matches!(fig.x, X::Param(_));
    let bound = fig.seed.iter().find_map(|s| match s {
        Seed::Bound(label, _, v) => Some((*label, *v)),
        _ => None,
    });
    let log = fig.log_y;
    let ty = |v: f64| if log { v.log10() } else { v };
    // Categories in the order they first appear (Florin's first), at most MAX_POINTS.
    let mut cats: Vec<String> = Vec::new();
    for s in series {
        for (x, _) in &s.points {
            if !cats.contains(x) && cats.len() < MAX_POINTS {
                cats.push(x.clone());
            }
        }
    }
    let window = fig.seed.iter().find_map(|s| match s {
        Seed::Window(_, w) => event_at.filter(|a| a.is_finite()).map(|at| (at, at + w)),
        _ => None,
    });
    let xs: Vec<f64> = if numeric {
        series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|(x, _)| x.parse::<f64>().ok()))
            .chain(window.iter().flat_map(|(a, b)| [*a, *b]))
            .filter(|x| x.is_finite())
            .collect()
    } else {
        (0..cats.len()).map(|i| i as f64).collect()
    };
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, y)| *y))
        .chain(bound.map(|(_, b)| b))
        .filter(|y| usable(*y, log))
        .map(ty)
        .collect();
    if xs.is_empty() || ys.is_empty() {
        bail!("nothing to plot");
    }
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let (ymin, ymax) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let (x0, x1) = if numeric {
        let pad = ((xmax - xmin) * 0.05).max(0.5);
        (xmin - pad, xmax + pad)
    } else {
        (-0.6, cats.len() as f64 - 0.4)
    };
    // Log axes span whole decades and bars start at the lowest one; linear axes start at 0.
    let (y0, y1) = if log {
        (ymin.floor(), (ymax.ceil()).max(ymin.floor() + 1.0))
    } else {
        (ymin.min(0.0), (ymax * 1.15).max(f64::EPSILON))
    };
    if !(x0.is_finite() && x1.is_finite() && y0.is_finite() && y1.is_finite()) {
        bail!("the values cannot be drawn (not finite)");
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(if numeric { 40 } else { 70 })
            .y_label_area_size(80)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(plot_err)?;
        let cats_fmt = cats.clone();
        let y_fmt = move |v: &f64| human(if log { 10f64.powf(*v) } else { *v });
        let x_fmt = move |v: &f64| {
            let i = v.round();
            if (v - i).abs() < 0.01 && i >= 0.0 {
                cats_fmt.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        };
        let num_fmt = |v: &f64| human(*v);
        let mut mesh = chart.configure_mesh();
        mesh.x_desc(fig.x_label)
            .y_desc(fig.y_label)
            .light_line_style(WHITE.mix(0.0))
            .y_label_formatter(&y_fmt);
        if log {
            mesh.y_labels(((y1 - y0) as usize + 1).min(12));
        }
        if numeric {
            mesh.x_label_formatter(&num_fmt);
        } else {
            mesh.x_labels(cats.len().max(1)).x_label_formatter(&x_fmt);
        }
        mesh.draw().map_err(plot_err)?;
        let drawn: Vec<&Plotted> = series.iter().filter(|s| !s.points.is_empty()).collect();
        let width = 0.8 / drawn.len().max(1) as f64;
        let (mut nf, mut ns) = (0, 0);
        for (j, s) in drawn.iter().enumerate() {
            let color = match s.kind {
                Kind::Florin => {
                    nf += 1;
                    FLORIN_COLORS[(nf - 1) % FLORIN_COLORS.len()]
                }
                Kind::Seed => {
                    ns += 1;
                    SEED_COLORS[(ns - 1) % SEED_COLORS.len()]
                }
            };
            if numeric {
                let mut pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .filter_map(|(x, y)| x.parse::<f64>().ok().map(|x| (x, ty(*y))))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let anno = if s.kind == Kind::Seed {
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| TriangleMarker::new((x, y), 7, color.filled())),
                        )
                        .map_err(plot_err)?
                } else {
                    chart
                        .draw_series(
                            LineSeries::new(pts.clone(), color.stroke_width(2)).point_size(3),
                        )
                        .map_err(plot_err)?
                };
                anno.label(s.label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3))
                });
            } else {
                let anno = chart
                    .draw_series(s.points.iter().filter_map(|(x, y)| {
                        let i = cats.iter().position(|c| c == x)? as f64;
                        let left = i - 0.4 + j as f64 * width;
                        Some(Rectangle::new(
                            [(left, y0), (left + width * 0.9, ty(*y))],
                            color.filled(),
                        ))
                    }))
                    .map_err(plot_err)?;
                anno.label(s.label.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            }
        }
        if let Some((from, to)) = window {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(from, y0), (to, y1)],
                    SEED_COLORS[0].mix(0.12).filled(),
                )))
                .map_err(plot_err)?
                .label(format!(
                    "Hamilton: back within {:.0} s of a failure",
                    to - from
                ))
                .legend(|(x, y)| {
                    Rectangle::new(
                        [(x, y - 5), (x + 14, y + 5)],
                        SEED_COLORS[0].mix(0.3).filled(),
                    )
                });
            chart
                .draw_series(LineSeries::new(
                    vec![(from, y0), (from, y1)],
                    BLACK.stroke_width(1),
                ))
                .map_err(plot_err)?;
        }
        if let Some((label, b)) = bound.filter(|(_, b)| usable(*b, log)) {
            chart
                .draw_series(LineSeries::new(
                    vec![(x0, ty(b)), (x1, ty(b))],
                    SEED_COLORS[0].stroke_width(2),
                ))
                .map_err(plot_err)?
                .label(label.to_string())
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], SEED_COLORS[0].stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn human(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{:.1} M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0} k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Runs `florin bench SUITE --json [--quick]` as a child of this binary.
fn run_suite(suite: &str, quick: bool) -> Run {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            return Run {
                suite: suite.into(),
                output: None,
                error: Some(e.to_string()),
            };
        }
    };
    tracing::info!(
        "bench report: running `florin bench {suite} --json{}`",
        if quick { " --quick" } else { "" }
    );
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["bench", suite, "--json"]);
    if quick {
        cmd.arg("--quick");
    }
    cmd.stderr(std::process::Stdio::inherit())
        .stdout(std::process::Stdio::piped());
    let fail = |e: String| Run {
        suite: suite.into(),
        output: None,
        error: Some(e),
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return fail(e.to_string()),
    };
    // Read stdout on the side so a chatty child never blocks; stop a suite that hangs.
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(out) = stdout.as_mut() {
            let _ = std::io::Read::read_to_end(out, &mut buf);
        }
        buf
    });
    let limit = std::time::Duration::from_secs(if quick { 15 * 60 } else { 90 * 60 });
    let started = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return fail(format!(
                    "stopped after {} s without finishing",
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(200)),
            Err(e) => return fail(e.to_string()),
        }
    };
    let out = reader.join().unwrap_or_default();
    let parsed: Option<Value> = serde_json::from_slice(&out).ok();
    match (status.success(), parsed) {
        (true, Some(v)) => Run {
            suite: suite.into(),
            output: Some(v),
            error: None,
        },
        (true, None) => fail("its output is not JSON".into()),
        (false, v) => fail(
            v.as_ref()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| format!("exited with {status}")),
        ),
    }
}

/// Reads every `*.json` in `dir` that is a suite's output (`suite` and `results`).
fn read_dir(dir: &Path) -> Result<Vec<Run>> {
    let mut runs: BTreeMap<String, Run> = BTreeMap::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    for p in entries {
        let bytes = std::fs::read(&p).with_context(|| p.display().to_string())?;
        let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
            tracing::warn!("bench report: {} is not JSON; skipped", p.display());
            continue;
        };
        let (Some(suite), true) = (v["suite"].as_str(), v["results"].is_array()) else {
            tracing::warn!(
                "bench report: {} is not a suite's output; skipped",
                p.display()
            );
            continue;
        };
        let suite = suite.to_string();
        match runs.get_mut(&suite) {
            // Two files of one suite (e.g. the default run and --emulate-hosts): results joined.
            Some(Run {
                output: Some(o), ..
            }) => {
                if let (Some(a), Some(b)) = (o["results"].as_array_mut(), v["results"].as_array()) {
                    a.extend(b.iter().cloned());
                }
            }
            _ => {
                runs.insert(
                    suite.clone(),
                    Run {
                        suite,
                        output: Some(v),
                        error: None,
                    },
                );
            }
        }
    }
    Ok(runs.into_values().collect())
}

/// What one figure became on the page (for the caller and the tests).
pub struct Drawn {
    /// The figure's id.
    pub id: &'static str,
    /// Florin's points.
    pub florin_points: usize,
    /// The seed's points (a bound counts as one).
    pub seed_points: usize,
}

/// Writes the report page from `runs`; returns what each figure drew.
fn render(runs: &[Run], quick: bool, out: &Path) -> Result<Vec<Drawn>> {
    let mut html = String::new();
    let mut drawn = Vec::new();
    let generated = crate::utc(florin_ledger::expiry::unix_now());
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Florin benchmark report</title>\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\
         <style>body{{font:15px/1.45 system-ui,sans-serif;margin:24px;max-width:960px;color:#1b1f24}}\
         figure{{margin:28px 0;padding:12px;border:1px solid #e5e7eb;border-radius:8px}}\
         figcaption{{font-size:13px;color:#4b5563}} .missing{{color:#92400e;background:#fef3c7;padding:8px}}\
         table{{border-collapse:collapse;font-size:13px}} td,th{{padding:3px 8px;border-bottom:1px solid #e5e7eb;text-align:left}}</style>\
         </head><body><h1>Florin benchmark report</h1>\
         <p>Every figure of the source documents that Florin reproduces: Florin's measurement (blue, green, purple) \
         beside the document's figure (red) where its text gives one. Generated {generated}{}.</p><h2>Runs</h2><table>\
         <tr><th>suite</th><th>machine and run</th></tr>",
        if quick { " from --quick runs (smoke-test sizes: shapes, not peak figures)" } else { "" }
    );
    for r in runs {
        let what = match &r.error {
            Some(e) => format!("not measured: {}", escape(e)),
            None => escape(&r.machine()),
        };
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{what}</td></tr>",
            escape(&r.suite)
        );
    }
    html.push_str("</table>");
    for fig in figures() {
        let run = runs.iter().find(|r| r.suite == fig.suite);
        let all: Vec<Value> = runs
            .iter()
            .flat_map(|r| r.results().iter().cloned())
            .collect();
        let results = all.as_slice();
        let (series, sources) = collect(&fig, results);
        let florin: usize = series
            .iter()
            .filter(|s| s.kind == Kind::Florin)
            .map(|s| s.points.len())
            .sum();
        let event_at = results
            .iter()
            .find_map(|r| r["params"]["killed_at_s"].as_f64());
        let seed_pts = series
            .iter()
            .filter(|s| s.kind == Kind::Seed)
            .map(|s| s.points.len())
            .sum::<usize>()
            + fig
                .seed
                .iter()
                .filter(|s| match s {
                    Seed::Bound(..) => true,
                    Seed::Window(..) => event_at.is_some(),
                    _ => false,
                })
                .count();
        let _ = write!(
            html,
            "<figure id=\"{}\" data-florin-points=\"{florin}\" data-seed-points=\"{seed_pts}\"><h2>{}</h2>",
            fig.id,
            escape(fig.title)
        );
        if florin == 0 {
            let _ = write!(
                html,
                "<p class=\"missing\">Not yet measured in these runs: <code>{}</code> produces it.</p>",
                escape(fig.how)
            );
        } else {
            match plot(&fig, &series, event_at) {
                Ok(svg) => html.push_str(&svg),
                Err(e) => {
                    let _ = write!(
                        html,
                        "<p class=\"missing\">Could not be drawn: {}</p>",
                        escape(&e.to_string())
                    );
                }
            }
        }
        let seed_text = if seed_pts == 0 {
            "The source text gives no numbers for this figure (its plot was lost with the PDF's figures)".to_string()
        } else {
            sources.join("; ")
        };
        let _ = write!(
            html,
            "<figcaption><b>Seed</b> ({}): {}.<br><b>Florin</b>: <code>{}</code> on {}.{}{}</figcaption></figure>",
            escape(fig.doc),
            escape(&seed_text),
            escape(fig.how),
            escape(&run.map(Run::machine).unwrap_or_else(|| "—".into())),
            if fig.note.is_empty() { "" } else { " " },
            escape(fig.note)
        );
        drawn.push(Drawn {
            id: fig.id,
            florin_points: florin,
            seed_points: seed_pts,
        });
    }
    html.push_str("</body></html>\n");
    florin_fs::write_atomic(out, &[html.as_bytes()])
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(drawn)
}

/// `florin bench report`.
pub fn run(
    quick: bool,
    from: Option<&Path>,
    only: &[String],
    out: &Path,
    json: bool,
) -> Result<ExitCode> {
    if let Some(bad) = only.iter().find(|s| !SUITES.contains(&s.as_str())) {
        bail!("--suites: {bad:?} is not one of {}", SUITES.join(", "));
    }
    let wanted = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    let runs: Vec<Run> = match from {
        Some(dir) => read_dir(dir)?
            .into_iter()
            .filter(|r| wanted(&r.suite))
            .collect(),
        None => SUITES
            .iter()
            .filter(|s| wanted(s))
            .map(|s| run_suite(s, quick))
            .collect(),
    };
    if runs.is_empty() {
        bail!("no suite's results to report");
    }
    // The page says --quick when any run it shows was one (from the files' own record).
    let quick = quick
        || runs
            .iter()
            .any(|r| r.output.as_ref().is_some_and(|o| o["run"]["quick"] == true));
    let drawn = render(&runs, quick, out)?;
    let missing: Vec<&str> = runs
        .iter()
        .filter(|r| r.error.is_some())
        .map(|r| r.suite.as_str())
        .collect();
    if json {
        let figs: Vec<Value> = drawn
            .iter()
            .map(|d| serde_json::json!({ "id": d.id, "florin_points": d.florin_points, "seed_points": d.seed_points }))
            .collect();
        println!(
            "{}",
            serde_json::json!({ "report": out.display().to_string(), "figures": figs, "suites_failed": missing })
        );
    } else {
        println!("wrote {} ({} figures)", out.display(), drawn.len());
        for d in &drawn {
            println!(
                "  {:<20} florin {:>3} points, seed {:>2}",
                d.id, d.florin_points, d.seed_points
            );
        }
    }
    if !missing.is_empty() {
        bail!(
            "suites that did not finish: {} (their figures say so in the page)",
            missing.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

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
    /// The series' own label: one bar group per series (results of different names).
    Series,
}

/// One of Florin's series: results named `name` whose params match `when`.
struct Series {
    label: &'static str,
    name: &'static str,
    when: &'static [(&'static str, &'static str)],
}

/// What the source document says for a figure, beyond each result's own `seed`.
enum Seed {
    /// Only the results' own seed figures.
    FromResults,
    /// Points the text gives: (x, y), x a number or a category.
    Points(&'static str, &'static [(&'static str, f64)]),
    /// A bound the text states, drawn as a horizontal line.
    Bound(&'static str, f64),
    /// A time window the text states after an event at the results' `killed_at_s` (Fig. 5:
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
    series: &'static [Series],
    seed: &'static [Seed],
    /// Said under the plot (what differs from the seed's set-up).
    note: &'static str,
}

const THESIS: &str = "001_… TU Delft thesis (final)";
const HAMILTON: &str = "003_… Hamilton (NSDI '23)";
const THRESHOLD: &str = "004_… Threshold signatures for CBDCs (TUM / G+D)";

fn figures() -> Vec<Figure> {
    vec![
        Figure {
            id: "thesis-fig3",
            title: "Thesis Fig. 3: signing and verifying tokens, by threads",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Param("threads"),
            x_label: "threads",
            y_label: "per second",
            log_y: false,
            series: &[
                Series { label: "Florin: mint (tokens/s)", name: "mint_tokens_per_s", when: &[] },
                Series { label: "Florin: client verify (tokens/s)", name: "client_verify_tokens_per_s", when: &[] },
                Series {
                    label: "Florin: authority verify, 3 links (signatures/s per core)",
                    name: "authority_verify_sigs_per_s_per_core",
                    when: &[("links", "3")],
                },
            ],
            seed: &[Seed::Points(
                "Fig. 3 (text, VI-A, L660-665): on 1 CPU, signing ≈38,239 tokens/s and verifying ≈5,840 tokens/s (5.62 and 2.47 MB/s); throughput stops rising after 4 CPUs",
                &[("1", 38_239.0), ("1", 5_840.0)],
            )],
            note: "The thesis measured Kotlin with Lazysodium on a laptop (i5 @ 2.11 GHz); Florin is Rust with ed25519-dalek on this machine. Its token verification checks 3 signatures.",
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
            series: &[
                Series { label: "Florin: ed25519-dalek", name: "ed25519_ops_per_s", when: &[("library", "ed25519-dalek")] },
                Series { label: "Florin: ring", name: "ed25519_ops_per_s", when: &[("library", "ring")] },
                Series { label: "Florin: libsodium (same run)", name: "ed25519_ops_per_s", when: &[("library", "libsodium")] },
            ],
            seed: &[Seed::FromResults],
            note: "Same message size as the thesis (147 bytes, its upper bound per token operation). Its text gives numbers for libsodium only (Bouncy Castle and I2P: none); 17,687 verifications/s is its 2.60 MB/s over 147 bytes.",
        },
        Figure {
            id: "thesis-fig5",
            title: "Thesis Fig. 5: authority verification by chain length",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Param("links"),
            x_label: "links in the token's chain (2 = online)",
            y_label: "signatures/s (1 thread)",
            log_y: false,
            series: &[Series {
                label: "Florin: authority verify",
                name: "authority_verify_sigs_per_s_per_core",
                when: &[("threads", "1")],
            }],
            seed: &[Seed::FromResults],
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
            series: &[Series { label: "Florin", name: "transfer_mb_per_s", when: &[] }],
            seed: &[Seed::FromResults],
            note: "Seed beside each layer: UDP (801.16), the native pipeline for TCP (1,652.28), EVA for the channel (8.25), Kotlin-IPv8 with encryption for ChaChaPoly (14.99).",
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
            series: &[Series { label: "Florin", name: "e2e_*", when: &[] }],
            seed: &[Seed::FromResults],
            note: "Receiving here is decoding (the network is Fig. 6); the authority's validation also checks forks, re-anchors and commits durably.",
        },
        Figure {
            id: "hamilton-fig4",
            title: "Hamilton Fig. 4: throughput by shards",
            doc: HAMILTON,
            suite: "cluster",
            how: "florin bench cluster (one machine); --emulate-hosts for emulated machines",
            x: X::Param("shards"),
            x_label: "shards",
            y_label: "transactions/s (log)",
            log_y: true,
            series: &[
                Series { label: "Florin: replication 1", name: "cluster_tx_per_s", when: &[("replicas", "1")] },
                Series { label: "Florin: replication 3", name: "cluster_tx_per_s", when: &[("replicas", "3")] },
            ],
            seed: &[
                Seed::Bound("Fig. 4: 1.7 M tx/s peak with many shards on many machines (L87)", 1_700_000.0),
                Seed::Points(
                    "§6 baseline: CockroachDB 3.4 K, 5.7 K and 11 K tx/s on 1, 2 and 4 shards (L354)",
                    &[("1", 3_400.0), ("2", 5_700.0), ("4", 11_000.0)],
                ),
            ],
            note: "All shards share this machine's cores here: Hamilton's scaling needs a machine per shard (--emulate-hosts).",
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
            series: &[Series { label: "Florin", name: "failover_tx_per_s", when: &[] }],
            seed: &[Seed::Window(
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
            how: "florin bench cluster --emulate-hosts --only fig6 (root)",
            x: X::Param("replicas"),
            x_label: "replicas per group",
            y_label: "transactions/s",
            log_y: false,
            series: &[Series { label: "Florin", name: "fig6_peak_tx_per_s", when: &[] }],
            seed: &[Seed::FromResults],
            note: "Hamilton plots the fall with replication but its text gives no values.",
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
            series: &[
                Series { label: "Florin: double spends", name: "mix_valid_tx_per_s", when: &[("large_pct", "0")] },
                Series { label: "Florin: large (8-in/8-out)", name: "mix_valid_tx_per_s", when: &[("double_spend_pct", "0")] },
            ],
            seed: &[Seed::FromResults],
            note: "Hamilton's text says only that valid throughput falls as either share grows.",
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
            series: &[Series { label: "Florin", name: "swap_per_s", when: &[] }],
            seed: &[
                Seed::FromResults,
                Seed::Points(
                    "§6 (L337): PostgreSQL at most 63.4 K swaps/s on one c5a.8xlarge; Hamilton 26× that",
                    &[("postgres", 63_400.0)],
                ),
            ],
            note: "",
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
            series: &[Series {
                label: "Florin: FROST key generation",
                name: "dkg_ms",
                when: &[("part", "compute"), ("scheme", "frost-ed25519")],
            }],
            seed: &[Seed::Points(
                "Fig. 2 (L248): CGGMP21 key generation up to 2,500 ms of computation at n = 52, t = 32, growing quadratically",
                &[("52", 2_500.0)],
            )],
            note: "The document measured up to n = 52 on 64-vCPU nodes; Florin's suite measures n = 3 and 5 here.",
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
            series: &[
                Series { label: "Florin: FROST pre-signing", name: "presign_ms", when: &[("part", "compute"), ("scheme", "frost-ed25519")] },
                Series { label: "Florin: FROST signing", name: "sign_ms", when: &[("part", "compute"), ("scheme", "frost-ed25519")] },
            ],
            seed: &[Seed::FromResults],
            note: "The document's text says only that both grow quadratically with t and differ little.",
        },
        Figure {
            id: "threshold-fig5",
            title: "Threshold document Fig. 5: payments end to end, single and threshold keys",
            doc: THRESHOLD,
            suite: "custody",
            how: "florin bench custody",
            x: X::Param("users"),
            x_label: "concurrent users",
            y_label: "payments/s",
            log_y: false,
            series: &[
                Series { label: "Florin: single key, same provider", name: "e2e_payments_per_s", when: &[("custody", "single"), ("route", "same_provider")] },
                Series { label: "Florin: FROST 2-of-3, same provider", name: "e2e_payments_per_s", when: &[("custody", "threshold"), ("route", "same_provider")] },
                Series { label: "Florin: FROST 2-of-3, across providers", name: "e2e_payments_per_s", when: &[("custody", "threshold"), ("route", "cross_provider")] },
            ],
            seed: &[Seed::FromResults],
            note: "The document's figures (190 → 10.7 payments/s same provider, 60 → 1.2 across, single → threshold) were measured at 100–300 users; each is drawn at Florin's user counts.",
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
            series: &[
                Series { label: "verification, 1 core", name: "client_verify_tokens_per_s", when: &[("threads", "1")] },
                Series { label: "end to end, device channel", name: "e2e_tokens_per_s", when: &[] },
            ],
            seed: &[Seed::Points(
                "Fig. 2: verification ≈90 MB/s, bound ≈630,000 tokens/s; Fig. 1: a 1 GbE LAN ≈125 MB/s (≈796,000 tokens/s of 157 bytes)",
                &[("verification, 1 core", 630_000.0), ("LAN (1 GbE)", 796_178.0)],
            )],
            note: "Florin has no LAN here (loopback only): its channel's rate is Fig. 6's. The draft's verification bound is for all cores of its laptop.",
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
            series: &[Series { label: "Florin: raw UDP, EVA-like windows", name: "udp_window_loss_fraction", when: &[] }],
            seed: &[],
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
            series: &[Series { label: "Florin: raw UDP, 256 blocks per window", name: "udp_buffer_loss_fraction", when: &[] }],
            seed: &[],
            note: "The thesis's text: packet loss falls as the buffer grows, and near 0 % a larger buffer no longer helps (from 106k bytes up).",
        },
        Figure {
            id: "thesis-fig9",
            title: "Thesis Fig. 9: where the authority's time goes in deposits",
            doc: THESIS,
            suite: "offline",
            how: "florin bench offline",
            x: X::Category("part"),
            x_label: "part",
            y_label: "% of CPU",
            log_y: false,
            series: &[Series { label: "Florin", name: "deposit_cpu_share_pct", when: &[] }],
            seed: &[Seed::FromResults],
            note: "Not a sampling profile: the deposits' cryptography (batch verification on one thread, one re-anchor signature per token) is timed alone on the same tokens and divided by the deposits' time.",
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

/// A plotted series: (x, y) points.
struct Plotted {
    label: String,
    points: Vec<(String, f64)>,
    seed: bool,
}

fn collect(fig: &Figure, results: &[Value]) -> (Vec<Plotted>, Vec<String>) {
    let mut out = Vec::new();
    let mut seed_points = Vec::new();
    let mut sources: Vec<String> = Vec::new();
    for s in fig.series {
        let mut pts = Vec::new();
        for r in results.iter().filter(|r| matches(r, s)) {
            let x = match fig.x {
                X::Series => Some(s.label.to_string()),
                other => x_of(r, other),
            };
            let (Some(x), Some(y)) = (x, r["value"].as_f64()) else {
                continue;
            };
            pts.push((x.clone(), y));
            if fig.seed.iter().any(|sd| matches!(sd, Seed::FromResults)) {
                if let (Some(v), Some(src)) =
                    (r["seed"]["value"].as_f64(), r["seed"]["source"].as_str())
                {
                    if v > 0.0
                        && !seed_points
                            .iter()
                            .any(|(px, pv): &(String, f64)| *px == x && *pv == v)
                    {
                        seed_points.push((x, v));
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
            seed: false,
        });
    }
    for sd in fig.seed {
        match sd {
            Seed::Points(src, pts) => {
                if !pts.is_empty() {
                    seed_points.extend(pts.iter().map(|(x, y)| (x.to_string(), *y)));
                }
                sources.push(src.to_string());
            }
            Seed::Bound(src, _) | Seed::Window(src, _) => sources.push(src.to_string()),
            Seed::FromResults => {}
        }
    }
    if !seed_points.is_empty() {
        out.push(Plotted {
            label: "seed (source document)".into(),
            points: seed_points,
            seed: true,
        });
    }
    (out, sources)
}

const FLORIN_COLORS: [RGBColor; 3] = [
    RGBColor(29, 78, 216),
    RGBColor(21, 128, 61),
    RGBColor(126, 34, 206),
];
const SEED_COLOR: RGBColor = RGBColor(220, 38, 38);

/// The SVG of one figure.
fn plot(fig: &Figure, series: &[Plotted], event_at: Option<f64>) -> Result<String> {
    let numeric = matches!(fig.x, X::Param(_));
    let bound = fig.seed.iter().find_map(|s| match s {
        Seed::Bound(_, v) => Some(*v),
        _ => None,
    });
    let ty = |v: f64| if fig.log_y { v.max(1e-3).log10() } else { v };
    // Categories in the order they first appear (Florin's first).
    let mut cats: Vec<String> = Vec::new();
    for s in series {
        for (x, _) in &s.points {
            if !cats.contains(x) {
                cats.push(x.clone());
            }
        }
    }
    let window = fig.seed.iter().find_map(|s| match s {
        Seed::Window(_, w) => event_at.map(|at| (at, at + w)),
        _ => None,
    });
    let xs: Vec<f64> = if numeric {
        series
            .iter()
            .flat_map(|s| s.points.iter().filter_map(|(x, _)| x.parse::<f64>().ok()))
            .chain(window.iter().flat_map(|(a, b)| [*a, *b]))
            .collect()
    } else {
        (0..cats.len()).map(|i| i as f64).collect()
    };
    let ys: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|(_, y)| ty(*y)))
        .chain(bound.map(ty))
        .collect();
    let (xmin, xmax) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let (ymin, ymax) = ys
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    if xs.is_empty() || ys.is_empty() {
        bail!("nothing to plot");
    }
    let (x0, x1) = if numeric {
        let pad = ((xmax - xmin) * 0.05).max(0.5);
        (xmin - pad, xmax + pad)
    } else {
        (-0.6, cats.len() as f64 - 0.4)
    };
    let (y0, y1) = if fig.log_y {
        (ymin.floor() - 0.1, ymax.ceil() + 0.1)
    } else {
        (0.0, ymax * 1.15 + f64::EPSILON)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(if numeric { 40 } else { 70 })
            .y_label_area_size(80)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let cats_fmt = cats.clone();
        let log = fig.log_y;
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
        if numeric {
            mesh.x_label_formatter(&num_fmt);
        } else {
            mesh.x_labels(cats.len().max(1)).x_label_formatter(&x_fmt);
        }
        mesh.draw().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let groups = series.len().max(1) as f64;
        let width = 0.8 / groups;
        for (j, s) in series.iter().enumerate() {
            let color = if s.seed {
                SEED_COLOR
            } else {
                FLORIN_COLORS[j % FLORIN_COLORS.len()]
            };
            let style = color.stroke_width(2);
            if numeric {
                let mut pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .filter_map(|(x, y)| x.parse::<f64>().ok().map(|x| (x, ty(*y))))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let anno = if s.seed {
                    chart
                        .draw_series(
                            pts.iter()
                                .map(|&(x, y)| TriangleMarker::new((x, y), 7, color.filled())),
                        )
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?
                } else {
                    chart
                        .draw_series(LineSeries::new(pts.clone(), style).point_size(3))
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?
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
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                anno.label(s.label.clone()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                });
            }
        }
        if let Some((from, to)) = window {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(from, y0), (to, y1)],
                    SEED_COLOR.mix(0.12).filled(),
                )))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(format!(
                    "seed: back within {:.0} s of the failure",
                    to - from
                ))
                .legend(|(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 14, y + 5)], SEED_COLOR.mix(0.3).filled())
                });
            chart
                .draw_series(LineSeries::new(
                    vec![(from, y0), (from, y1)],
                    BLACK.stroke_width(1),
                ))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
        if let Some(b) = bound {
            chart
                .draw_series(LineSeries::new(
                    vec![(x0, ty(b)), (x1, ty(b))],
                    SEED_COLOR.stroke_width(2),
                ))
                .map_err(|e| anyhow::anyhow!("{e:?}"))?
                .label(format!("seed bound: {}", human(b)))
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], SEED_COLOR.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
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
    cmd.stderr(std::process::Stdio::inherit());
    match cmd.output() {
        Ok(out) if out.status.success() => match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(v) => Run {
                suite: suite.into(),
                output: Some(v),
                error: None,
            },
            Err(e) => Run {
                suite: suite.into(),
                output: None,
                error: Some(format!("its output is not JSON: {e}")),
            },
        },
        Ok(out) => {
            let v: Option<Value> = serde_json::from_slice(&out.stdout).ok();
            let msg = v
                .as_ref()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| format!("exited with {}", out.status));
            Run {
                suite: suite.into(),
                output: None,
                error: Some(msg),
            }
        }
        Err(e) => Run {
            suite: suite.into(),
            output: None,
            error: Some(e.to_string()),
        },
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
            .filter(|s| !s.seed)
            .map(|s| s.points.len())
            .sum();
        let event_at = results
            .iter()
            .find_map(|r| r["params"]["killed_at_s"].as_f64());
        let seed_pts = series
            .iter()
            .filter(|s| s.seed)
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

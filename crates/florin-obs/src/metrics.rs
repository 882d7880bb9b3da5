//! The process's metrics: one registry, every family registered up front (so a scrape always names
//! them, at zero until something happens), encoded as OpenMetrics text for `/metrics`.
//!
//! Labels are bounded: routes are the router's templates (`/v1/ledger/transactions/{txid}`, or
//! `unmatched`), reasons are error codes, groups and parties are configuration. Nothing a caller
//! sends becomes a label value.
//!
//! Values that are cheaper to read than to keep (a Raft group's term, a pool's depth, a file's
//! size) are refreshed by *scrape hooks* ([`Metrics::on_scrape`]) that run just before each
//! encoding.

use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An HTTP request's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route template, or `unmatched`.
    pub route: String,
    /// The method.
    pub method: String,
    /// The status code.
    pub status: u16,
}

/// A route's labels (latency histograms).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template, or `unmatched`.
    pub route: String,
}

/// A bounded reason (an error code, a refusal kind).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The reason.
    pub reason: String,
}

/// A ledger transaction's outcome and, when refused, why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TxLabels {
    /// `submitted`, `confirmed` or `refused`.
    pub outcome: &'static str,
    /// For `refused`, the error code; empty otherwise.
    pub reason: String,
}

/// A durable file's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FileLabels {
    /// Which store (`ledger`, `authority`, `raft`, …).
    pub store: String,
    /// `wal`, `snapshot` or `db`.
    pub kind: &'static str,
}

/// A Raft replica's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupLabels {
    /// The group's name (`shard-0`, `coordinator-0`, `authority`).
    pub group: String,
    /// The replica's node id within the group.
    pub replica: String,
}

/// A follower's labels within a Raft group, seen from the leader.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowerLabels {
    /// The group's name.
    pub group: String,
    /// The leader's node id (the replica that reports).
    pub replica: String,
    /// The follower's node id.
    pub follower: String,
}

/// A token event (`minted`, `deposited`, `reanchored`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The event.
    pub event: &'static str,
}

/// A pool's labels (custody nonces and presignatures, the PSP's key pool).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool.
    pub pool: String,
}

/// A signature scheme's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SchemeLabels {
    /// `frost`, `cggmp24`, `dkls23`, `p256`.
    pub scheme: &'static str,
}

/// A payment's route and outcome at a provider.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PaymentLabels {
    /// `same_provider`, `cross_provider` or `ledger`; `refused` when no payment was made.
    pub route: &'static str,
    /// `ok`, `repeated` (a retry answered with the earlier receipt) or the refusal's code.
    pub outcome: String,
}

/// What a family is, for the names its samples take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `NAME_total`.
    Counter,
    /// `NAME`.
    Gauge,
    /// `NAME_bucket`, `NAME_sum`, `NAME_count`.
    Histogram,
}

impl Kind {
    /// The names of a family's samples.
    pub fn samples(self, name: &str) -> Vec<String> {
        match self {
            Kind::Counter => vec![format!("{name}_total")],
            Kind::Gauge => vec![name.to_string()],
            Kind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{name}{s}"))
                .collect(),
        }
    }
}

/// A metric type with its [`Kind`].
trait Kinded: prometheus_client::registry::Metric {
    const KIND: Kind;
}

impl Kinded for Counter {
    const KIND: Kind = Kind::Counter;
}
impl Kinded for Gauge {
    const KIND: Kind = Kind::Gauge;
}
impl Kinded for Histogram {
    const KIND: Kind = Kind::Histogram;
}
impl<S, M, C> Kinded for Family<S, M, C>
where
    S: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    M: Kinded + prometheus_client::metrics::TypedMetric,
    C: MetricConstructor<M> + Clone + Send + Sync + std::fmt::Debug + 'static,
{
    const KIND: Kind = M::KIND;
}

/// Registers families and remembers their names and kinds.
struct Registrar<'a> {
    registry: &'a mut Registry,
    names: &'a mut Vec<(&'static str, Kind)>,
}

impl Registrar<'_> {
    fn add<M: Kinded>(&mut self, name: &'static str, help: &str, metric: M) {
        self.names.push((name, M::KIND));
        self.registry.register(name, help, metric);
    }
}

/// Histograms of seconds, 50 µs to about 50 s.
#[derive(Clone, Debug)]
pub struct SecondsBuckets;

impl MetricConstructor<Histogram> for SecondsBuckets {
    fn new_metric(&self) -> Histogram {
        seconds_histogram()
    }
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

type Hook = Box<dyn Fn() + Send + Sync>;

/// Every metric a Florin process has (a process that is not, say, a provider leaves the
/// provider's at zero).
pub struct Metrics {
    registry: Registry,
    names: Vec<(&'static str, Kind)>,
    hooks: Mutex<Vec<Hook>>,
    /// `florin_http_requests_total{route,method,status}`.
    pub http_requests: Family<HttpLabels, Counter>,
    /// `florin_http_request_duration_seconds{route}`.
    pub http_duration: Family<RouteLabels, Histogram, SecondsBuckets>,
    /// `florin_http_connections_refused_total{reason}`: connections closed before a request.
    pub http_connections_refused: Family<ReasonLabels, Counter>,
    /// `florin_ledger_transactions_total{outcome,reason}`.
    pub ledger_transactions: Family<TxLabels, Counter>,
    /// `florin_ledger_transactions_total{outcome="submitted"}` (a handle kept: counted often).
    pub tx_submitted: Counter,
    /// `florin_ledger_transactions_total{outcome="confirmed"}`.
    pub tx_confirmed: Counter,
    /// `florin_swap_batch_size`: transactions per group commit.
    pub swap_batch_size: Histogram,
    /// `florin_swap_commit_seconds`: one group commit, store write and sync included.
    pub swap_commit_seconds: Histogram,
    /// `florin_store_bytes{store,kind}`.
    pub store_bytes: Family<FileLabels, Gauge>,
    /// `florin_raft_term{group}`.
    pub raft_term: Family<GroupLabels, Gauge>,
    /// `florin_raft_leader{group}`: the leader's node id (-1 when none is known).
    pub raft_leader: Family<GroupLabels, Gauge>,
    /// `florin_raft_is_leader{group}`: 1 on the replica that leads.
    pub raft_is_leader: Family<GroupLabels, Gauge>,
    /// `florin_raft_commit_index{group}`.
    pub raft_commit_index: Family<GroupLabels, Gauge>,
    /// `florin_raft_applied_index{group}`.
    pub raft_applied_index: Family<GroupLabels, Gauge>,
    /// `florin_raft_follower_lag{group,follower}`: entries a follower lacks (on the leader).
    pub raft_follower_lag: Family<FollowerLabels, Gauge>,
    /// `florin_2pc_batches_in_flight`: two-phase batches a coordinator has open.
    pub twopc_in_flight: Gauge,
    /// `florin_tokens_total{event}`: tokens minted, deposited, re-anchored.
    pub tokens: Family<EventLabels, Counter>,
    /// `florin_fraud_proofs_total`: double spends proved (offline cash).
    pub fraud_proofs: Counter,
    /// `florin_custody_pool_depth{pool}`.
    pub custody_pool_depth: Family<PoolLabels, Gauge>,
    /// `florin_custody_sign_seconds{scheme}`: a threshold signature, seen by the client.
    pub custody_sign_seconds: Family<SchemeLabels, Histogram, SecondsBuckets>,
    /// `florin_psp_payments_total{route,outcome}`.
    pub psp_payments: Family<PaymentLabels, Counter>,
    /// `florin_audit_balanced`: 1 when the last supply audit balanced, 0 when it did not, -1
    /// before the first.
    pub audit_balanced: Gauge,
    /// `florin_audit_runs_total`.
    pub audit_runs: Counter,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            registry: Registry::default(),
            names: Vec::new(),
            hooks: Mutex::new(Vec::new()),
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(SecondsBuckets),
            http_connections_refused: Family::default(),
            ledger_transactions: Family::default(),
            tx_submitted: Counter::default(),
            tx_confirmed: Counter::default(),
            swap_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            swap_commit_seconds: seconds_histogram(),
            store_bytes: Family::default(),
            raft_term: Family::default(),
            raft_leader: Family::default(),
            raft_is_leader: Family::default(),
            raft_commit_index: Family::default(),
            raft_applied_index: Family::default(),
            raft_follower_lag: Family::default(),
            twopc_in_flight: Gauge::default(),
            tokens: Family::default(),
            fraud_proofs: Counter::default(),
            custody_pool_depth: Family::default(),
            custody_sign_seconds: Family::new_with_constructor(SecondsBuckets),
            psp_payments: Family::default(),
            audit_balanced: Gauge::default(),
            audit_runs: Counter::default(),
        };
        m.audit_balanced.set(-1);
        // Families with labels show only once a label set exists: the fixed ones exist from the
        // start, so a scrape names them at zero.
        for event in ["minted", "deposited", "reanchored"] {
            let _ = m.tokens.get_or_create(&EventLabels { event });
        }
        let tx = |outcome| {
            m.ledger_transactions.get_or_create_owned(&TxLabels {
                outcome,
                reason: String::new(),
            })
        };
        let (tx_submitted, tx_confirmed) = (tx("submitted"), tx("confirmed"));
        let mut names = Vec::new();
        let mut r = Registrar {
            registry: &mut registry,
            names: &mut names,
        };
        r.add(
            "florin_http_requests",
            "HTTP requests answered, by route template, method and status",
            m.http_requests.clone(),
        );
        r.add(
            "florin_http_request_duration_seconds",
            "HTTP request latency, from the request's head to its answer",
            m.http_duration.clone(),
        );
        r.add(
            "florin_http_connections_refused",
            "Connections closed before any request (limits, handshakes)",
            m.http_connections_refused.clone(),
        );
        r.add(
            "florin_ledger_transactions",
            "Ledger transactions: submitted, confirmed, refused (by error code)",
            m.ledger_transactions.clone(),
        );
        r.add(
            "florin_swap_batch_size",
            "Transactions per group commit of the swap engine",
            m.swap_batch_size.clone(),
        );
        r.add(
            "florin_swap_commit_seconds",
            "One group commit of the swap engine, store write and sync included",
            m.swap_commit_seconds.clone(),
        );
        r.add(
            "florin_store_bytes",
            "Bytes in a store's write-ahead log and snapshot",
            m.store_bytes.clone(),
        );
        r.add(
            "florin_raft_term",
            "A Raft group's current term",
            m.raft_term.clone(),
        );
        r.add(
            "florin_raft_leader",
            "The node id of a Raft group's leader (-1: none known)",
            m.raft_leader.clone(),
        );
        r.add(
            "florin_raft_is_leader",
            "1 on the replica that leads its Raft group",
            m.raft_is_leader.clone(),
        );
        r.add(
            "florin_raft_commit_index",
            "A Raft group's committed log index, as this replica knows it",
            m.raft_commit_index.clone(),
        );
        r.add(
            "florin_raft_applied_index",
            "The last log index this replica applied",
            m.raft_applied_index.clone(),
        );
        r.add(
            "florin_raft_follower_lag",
            "Log entries a follower lacks, seen from the leader",
            m.raft_follower_lag.clone(),
        );
        r.add(
            "florin_2pc_batches_in_flight",
            "Two-phase commit batches a coordinator has open",
            m.twopc_in_flight.clone(),
        );
        r.add(
            "florin_tokens",
            "Tokens minted (withdrawn), deposited, re-anchored",
            m.tokens.clone(),
        );
        r.add(
            "florin_fraud_proofs",
            "Double spends of offline cash proved",
            m.fraud_proofs.clone(),
        );
        r.add(
            "florin_custody_pool_depth",
            "Ready nonces, presignatures or keys in a custody pool",
            m.custody_pool_depth.clone(),
        );
        r.add(
            "florin_custody_sign_seconds",
            "A threshold signature, request to signature, by scheme",
            m.custody_sign_seconds.clone(),
        );
        r.add(
            "florin_psp_payments",
            "Payments a provider made, by route and outcome",
            m.psp_payments.clone(),
        );
        r.add(
            "florin_audit_balanced",
            "1 when the last supply audit balanced, 0 when not, -1 before the first",
            m.audit_balanced.clone(),
        );
        r.add(
            "florin_audit_runs",
            "Supply audits run",
            m.audit_runs.clone(),
        );
        Metrics {
            registry,
            names,
            tx_submitted,
            tx_confirmed,
            ..m
        }
    }

    /// Every family's name and kind (a family with labels shows in a scrape only once it has
    /// a sample: this list is the whole set, for dashboards and tests).
    pub fn families(&self) -> &[(&'static str, Kind)] {
        &self.names
    }

    /// Runs `hook` before every encoding (to refresh values read from elsewhere).
    pub fn on_scrape(&self, hook: impl Fn() + Send + Sync + 'static) {
        if let Ok(mut h) = self.hooks.lock() {
            h.push(Box::new(hook));
        }
    }

    /// The registry as OpenMetrics text (what `/metrics` answers), scrape hooks run first.
    pub fn encode(&self) -> String {
        if let Ok(hooks) = self.hooks.lock() {
            for h in hooks.iter() {
                h();
            }
        }
        let mut out = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
            let _ = writeln!(out, "# EOF");
        }
        out
    }

    /// Counts one answered HTTP request.
    pub fn http_request(&self, route: &str, method: &str, status: u16, took: Duration) {
        self.http_requests
            .get_or_create(&HttpLabels {
                route: route.to_string(),
                method: method.to_string(),
                status,
            })
            .inc();
        self.http_duration
            .get_or_create(&RouteLabels {
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts ledger transactions with `outcome` (`submitted`, `confirmed`, `refused`); `reason`
    /// is the error code of a refusal.
    pub fn transactions(&self, outcome: &'static str, reason: &str, n: u64) {
        if n == 0 || !crate::enabled() {
            return;
        }
        self.ledger_transactions
            .get_or_create(&TxLabels {
                outcome,
                reason: reason.to_string(),
            })
            .inc_by(n);
    }

    /// Counts `n` token events (`minted`, `deposited`, `reanchored`).
    pub fn token_event(&self, event: &'static str, n: u64) {
        if n > 0 {
            self.tokens.get_or_create(&EventLabels { event }).inc_by(n);
        }
    }
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

/// One sample of a scrape: the metric's name with its labels, and its value.
pub fn parse_sample(line: &str) -> Option<(&str, f64)> {
    if line.starts_with('#') || line.is_empty() {
        return None;
    }
    let (name, value) = line.rsplit_once(' ')?;
    Some((name, value.parse().ok()?))
}

/// The value of the sample named exactly `name` (labels included, in the encoder's order) in a
/// scrape's text.
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(parse_sample)
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_families_are_named_before_anything_happens() {
        let m = Metrics::new();
        let text = m.encode();
        for name in [
            "florin_ledger_transactions",
            "florin_swap_batch_size",
            "florin_swap_commit_seconds",
            "florin_2pc_batches_in_flight",
            "florin_tokens",
            "florin_fraud_proofs",
            "florin_audit_balanced",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} in {text}"
            );
        }
        assert_eq!(sample(&text, "florin_audit_balanced"), Some(-1.0));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn counts_and_hooks_show_in_the_scrape() {
        let m = Metrics::new();
        m.http_request("/v1/info", "GET", 200, Duration::from_millis(2));
        m.http_request("/v1/info", "GET", 200, Duration::from_millis(3));
        m.transactions("refused", "double_spend", 2);
        let g = m.raft_term.clone();
        m.on_scrape(move || {
            g.get_or_create(&GroupLabels {
                group: "shard-0".into(),
                replica: "1".into(),
            })
            .set(7);
        });
        let text = m.encode();
        assert_eq!(
            sample(
                &text,
                "florin_http_requests_total{route=\"/v1/info\",method=\"GET\",status=\"200\"}"
            ),
            Some(2.0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "florin_ledger_transactions_total{outcome=\"refused\",reason=\"double_spend\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "florin_raft_term{group=\"shard-0\",replica=\"1\"}"),
            Some(7.0)
        );
        assert_eq!(
            sample(
                &text,
                "florin_http_request_duration_seconds_count{route=\"/v1/info\"}"
            ),
            Some(2.0)
        );
    }
}

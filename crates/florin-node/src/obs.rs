//! What the services report to the process's metrics ([`florin_obs::metrics`]) beyond what
//! their code counts as it goes: values read at scrape time.

use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use florin_cluster::raft::{Machine, NodeId, Replica};
use florin_obs::metrics::{global, FollowerLabels, GroupLabels};

/// Reports replica `id` of Raft group `group` at every scrape while it lives: term, leader,
/// whether it leads, commit and applied index, and on the leader each follower's lag. Once the
/// replica is gone its series are removed.
pub fn export_raft<M: Machine>(group: String, id: NodeId, replica: &Arc<Replica<M>>) {
    let weak: Weak<Replica<M>> = Arc::downgrade(replica);
    let labels = GroupLabels {
        group: group.clone(),
        replica: id.to_string(),
    };
    // The follower series this replica reported last time (it stops when it stops leading).
    let reported: Mutex<Vec<FollowerLabels>> = Mutex::new(Vec::new());
    global().on_scrape(move || {
        let m = global();
        let Ok(mut reported) = reported.lock() else {
            return;
        };
        let Some(replica) = weak.upgrade() else {
            for family in [
                &m.raft_term,
                &m.raft_leader,
                &m.raft_is_leader,
                &m.raft_commit_index,
                &m.raft_applied_index,
            ] {
                family.remove(&labels);
            }
            for f in reported.drain(..) {
                m.raft_follower_lag.remove(&f);
            }
            return;
        };
        let p = replica.progress();
        let as_gauge = |v: Option<u64>| v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX));
        m.raft_term
            .get_or_create(&labels)
            .set(as_gauge(Some(p.status.term)));
        m.raft_leader
            .get_or_create(&labels)
            .set(as_gauge(p.status.leader));
        m.raft_is_leader
            .get_or_create(&labels)
            .set(i64::from(p.status.state == "leader"));
        m.raft_commit_index
            .get_or_create(&labels)
            .set(as_gauge(p.commit_index()));
        m.raft_applied_index
            .get_or_create(&labels)
            .set(as_gauge(p.status.last_applied));
        let now: Vec<FollowerLabels> = p
            .follower_lag()
            .into_iter()
            .map(|(follower, lag)| {
                let f = FollowerLabels {
                    group: group.clone(),
                    replica: labels.replica.clone(),
                    follower: follower.to_string(),
                };
                m.raft_follower_lag
                    .get_or_create(&f)
                    .set(as_gauge(Some(lag)));
                f
            })
            .collect();
        for old in reported.drain(..) {
            if !now.contains(&old) {
                m.raft_follower_lag.remove(&old);
            }
        }
        *reported = now;
    });
}

/// Runs a threshold signature and records how long it took under `scheme` (`frost`,
/// `cggmp24`, `dkls23`) when it succeeded.
pub fn time_signature<T, E>(
    scheme: &'static str,
    sign: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let start = Instant::now();
    let r = sign();
    if r.is_ok() && florin_obs::enabled() {
        global()
            .custody_sign_seconds
            .get_or_create(&florin_obs::metrics::SchemeLabels { scheme })
            .observe(start.elapsed().as_secs_f64());
    }
    r
}

type Depth = Box<dyn Fn() -> Option<usize> + Send + Sync>;

/// Adds a threshold ECDSA signer's presignature pool to `florin_custody_pool_depth{pool=
/// "presignatures"}`, the sum over the process's live signers (one per key: a label per key
/// would grow without bound).
pub fn count_presignatures<S: Send + Sync + 'static>(
    signer: Weak<S>,
    depth: impl Fn(&S) -> usize + Send + Sync + 'static,
) {
    static POOLS: OnceLock<Mutex<Vec<Depth>>> = OnceLock::new();
    let mut first = false;
    let pools = POOLS.get_or_init(|| {
        first = true;
        Mutex::new(Vec::new())
    });
    if let Ok(mut p) = pools.lock() {
        p.push(Box::new(move || signer.upgrade().map(|s| depth(&s))));
    }
    if first {
        global().on_scrape(|| {
            let Some(pools) = POOLS.get() else { return };
            let Ok(mut pools) = pools.lock() else { return };
            let mut total = 0usize;
            // Signers gone are forgotten.
            pools.retain(|d| match d() {
                Some(n) => {
                    total += n;
                    true
                }
                None => false,
            });
            global()
                .custody_pool_depth
                .get_or_create(&florin_obs::metrics::PoolLabels {
                    pool: "presignatures".into(),
                })
                .set(i64::try_from(total).unwrap_or(i64::MAX));
        });
    }
}

/// Reports the bytes of a store's files in `dir` at every scrape, as
/// `florin_store_bytes{store,kind}`: `kind="wal"` for write-ahead log files (`wal-*`, and every
/// file in the subdirectory `log_dir` when given: a Raft log's segments), `snapshot` for
/// snapshots (`snapshot*`), `db` for redb files (`*.redb`). Files are listed, never opened; a
/// directory that cannot be read reports nothing.
pub fn export_store_files(store: &str, dir: std::path::PathBuf, log_dir: Option<&str>) {
    let store = store.to_string();
    let log_dir = log_dir.map(|l| dir.join(l));
    global().on_scrape(move || {
        let files = |d: &std::path::Path| -> Vec<(String, u64)> {
            std::fs::read_dir(d)
                .map(|entries| {
                    entries
                        .flatten()
                        .filter_map(|e| {
                            let meta = e.metadata().ok()?;
                            meta.is_file()
                                .then(|| (e.file_name().to_string_lossy().into_owned(), meta.len()))
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let (mut wal, mut snapshot, mut db) = (0u64, 0u64, 0u64);
        for (name, len) in files(&dir) {
            if name.starts_with("snapshot") {
                snapshot += len;
            } else if name.ends_with(".redb") {
                db += len;
            } else if name.starts_with("wal-") {
                wal += len;
            }
        }
        if let Some(l) = &log_dir {
            wal += files(l).iter().map(|(_, len)| len).sum::<u64>();
        }
        for (kind, v) in [("wal", wal), ("snapshot", snapshot), ("db", db)] {
            global()
                .store_bytes
                .get_or_create(&florin_obs::metrics::FileLabels {
                    store: store.clone(),
                    kind,
                })
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    });
}

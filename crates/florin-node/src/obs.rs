//! What the services report to the process's metrics ([`florin_obs::metrics`]) beyond what
//! their code counts as it goes: values read at scrape time.

use std::sync::{Arc, Mutex, Weak};

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

//! What a sentinel sees of its cluster: every Raft group's replicas and their state, asked over
//! the cluster's RPC (`Request::Status`) in parallel, by one caller at a time and at most once
//! every two seconds however often it is asked ([`Snapshot`]: nobody waits while it asks), over
//! links kept from one round to the next (`GET /v1/cluster`, the console's groups).

use std::sync::Arc;
use std::time::Duration;

use florin_crypto::{LocalSigner, PublicKey};

use super::rpc::{Peer, Request, Response};
use super::ClusterSpec;
use crate::api::{ClusterStatus, GroupStatus, MemberStatus};
use crate::snapshot::Snapshot;

/// How long an answer is reused.
const FRESH_FOR: Duration = Duration::from_secs(2);
/// How long one replica may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// One replica to ask: its id, address, and a link pinned to its key (`None`: a key the spec
/// names that does not parse; it shows as down).
struct Replica {
    id: u64,
    addr: String,
    peer: Option<Peer>,
}

/// A sentinel's view of its cluster's groups.
pub struct ClusterView {
    groups: Vec<(&'static str, u16, Vec<Replica>)>,
    last: Snapshot<ClusterStatus>,
}

impl ClusterView {
    /// A view of `spec`'s groups, asked as `me` (a key the spec lets ask: a sentinel's).
    pub fn new(spec: ClusterSpec, me: Arc<LocalSigner>) -> Arc<ClusterView> {
        let replicas = |g: &super::GroupSpec| -> Vec<Replica> {
            g.members
                .iter()
                .map(|m| Replica {
                    id: m.id,
                    addr: m.addr.clone(),
                    peer: PublicKey::parse(&m.key)
                        .ok()
                        .map(|k| Peer::new(m.addr.clone(), k, me.clone(), ASK_TIMEOUT)),
                })
                .collect()
        };
        let mut groups = Vec::new();
        for (i, g) in spec.shards.iter().enumerate() {
            groups.push(("shard", i as u16, replicas(g)));
        }
        for (i, g) in spec.coordinators.iter().enumerate() {
            groups.push(("coordinator", i as u16, replicas(g)));
        }
        if let Some(g) = &spec.authority {
            groups.push(("authority", 0, replicas(g)));
        }
        Arc::new(ClusterView {
            groups,
            last: Snapshot::new(FRESH_FOR),
        })
    }

    /// Every group's state (blocking when this caller asks: each replica at most
    /// [`ASK_TIMEOUT`] to answer, all at once). A replica that does not answer is `up: false`;
    /// a group is healthy when its replicas agree on one leader that answers, a majority
    /// answering. Before the first answer, while another caller is asking: no groups, not
    /// healthy.
    pub fn status(&self) -> ClusterStatus {
        self.last.get(|| self.ask_all()).unwrap_or(ClusterStatus {
            healthy: false,
            groups: Vec::new(),
        })
    }

    fn ask_all(&self) -> ClusterStatus {
        let groups: Vec<GroupStatus> = std::thread::scope(|s| {
            let asks: Vec<_> = self
                .groups
                .iter()
                .map(|(role, index, members)| {
                    let members: Vec<_> = members.iter().map(|m| s.spawn(move || ask(m))).collect();
                    (role, index, members)
                })
                .collect();
            asks.into_iter()
                .map(|(role, index, members)| {
                    let members = members.into_iter().filter_map(|h| h.join().ok()).collect();
                    group_status(role, *index, members)
                })
                .collect()
        });
        ClusterStatus {
            healthy: groups.iter().all(|g| g.healthy),
            groups,
        }
    }
}

fn ask(m: &Replica) -> MemberStatus {
    let mut member = MemberStatus {
        id: m.id,
        addr: m.addr.clone(),
        up: false,
        state: None,
        leader: None,
        term: None,
        last_log_index: None,
        last_applied: None,
        lag: None,
    };
    if let Some(Ok(Response::Status(s))) = m.peer.as_ref().map(|p| p.call(&Request::Status)) {
        member.up = true;
        member.state = Some(s.raft.state);
        member.leader = s.raft.leader;
        member.term = Some(s.raft.term);
        member.last_log_index = s.raft.last_log_index;
        member.last_applied = s.raft.last_applied;
    }
    member
}

/// A group's state from its replicas' answers: the leader they agree on, the highest term,
/// each replica's lag behind the leader's log, and whether it is healthy.
fn group_status(role: &str, group: u16, mut members: Vec<MemberStatus>) -> GroupStatus {
    let leaders: Vec<u64> = members
        .iter()
        .filter(|m| m.state.as_deref() == Some("leader"))
        .map(|m| m.id)
        .collect();
    let leader = match leaders.as_slice() {
        [one] => Some(*one),
        _ => None,
    };
    let head = leader
        .and_then(|l| members.iter().find(|m| m.id == l))
        .and_then(|m| m.last_log_index);
    for m in &mut members {
        if let (Some(head), true) = (head, m.up) {
            m.lag = Some(head.saturating_sub(m.last_applied.unwrap_or(0)));
        }
    }
    let up = members.iter().filter(|m| m.up).count();
    let agree = members
        .iter()
        .filter(|m| m.up)
        .all(|m| m.leader.is_some() && m.leader == leader);
    GroupStatus {
        role: role.to_string(),
        group,
        leader,
        term: members.iter().filter_map(|m| m.term).max(),
        healthy: leader.is_some() && agree && up * 2 > members.len(),
        members,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, state: Option<&str>, leader: Option<u64>, applied: u64) -> MemberStatus {
        MemberStatus {
            id,
            addr: format!("127.0.0.1:{id}"),
            up: state.is_some(),
            state: state.map(str::to_string),
            leader,
            term: state.map(|_| 3),
            last_log_index: state.map(|_| applied),
            last_applied: state.map(|_| applied),
            lag: None,
        }
    }

    #[test]
    fn a_group_with_one_agreed_leader_and_a_majority_is_healthy() {
        let g = group_status(
            "shard",
            0,
            vec![
                member(1, Some("leader"), Some(1), 10),
                member(2, Some("follower"), Some(1), 7),
                member(3, None, None, 0),
            ],
        );
        assert!(g.healthy);
        assert_eq!((g.leader, g.term), (Some(1), Some(3)));
        assert_eq!(g.members[1].lag, Some(3));
        assert_eq!(g.members[2].lag, None, "a replica that is down has no lag");
    }

    #[test]
    fn no_leader_two_leaders_or_no_majority_is_unhealthy() {
        let none = group_status(
            "shard",
            0,
            vec![
                member(1, Some("candidate"), None, 1),
                member(2, Some("follower"), None, 1),
            ],
        );
        assert!(!none.healthy && none.leader.is_none());
        let two = group_status(
            "coordinator",
            0,
            vec![
                member(1, Some("leader"), Some(1), 1),
                member(2, Some("leader"), Some(2), 1),
            ],
        );
        assert!(!two.healthy && two.leader.is_none());
        let minority = group_status(
            "shard",
            1,
            vec![
                member(1, Some("leader"), Some(1), 1),
                member(2, None, None, 0),
                member(3, None, None, 0),
            ],
        );
        assert!(!minority.healthy);
    }
}

//! What a sentinel sees of its cluster: every Raft group's replicas and their state, asked over
//! the cluster's RPC (`Request::Status`) in parallel, at most once every two seconds however
//! often it is asked (`GET /v1/cluster`, the console's groups).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use florin_crypto::{LocalSigner, PublicKey};

use super::rpc::{Peer, Request, Response};
use super::{ClusterSpec, GroupSpec};
use crate::api::{ClusterStatus, GroupStatus, MemberStatus};

/// How long an answer is reused.
const FRESH_FOR: Duration = Duration::from_secs(2);
/// How long one replica may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// A sentinel's view of its cluster's groups.
pub struct ClusterView {
    spec: ClusterSpec,
    me: Arc<LocalSigner>,
    last: Mutex<Option<(Instant, ClusterStatus)>>,
}

impl ClusterView {
    /// A view of `spec`'s groups, asked as `me` (a key the spec lets read: a sentinel's).
    pub fn new(spec: ClusterSpec, me: Arc<LocalSigner>) -> Arc<ClusterView> {
        Arc::new(ClusterView {
            spec,
            me,
            last: Mutex::new(None),
        })
    }

    /// Every group's state (blocking: it asks each replica, at most [`ASK_TIMEOUT`] each, all
    /// at once). A replica that does not answer is `up: false`; a group is healthy when its
    /// replicas agree on one leader that answers.
    pub fn status(&self) -> ClusterStatus {
        let mut last = match self.last.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if let Some((at, st)) = last.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return st.clone();
            }
        }
        let mut groups: Vec<(&str, u16, &GroupSpec)> = Vec::new();
        for (i, g) in self.spec.shards.iter().enumerate() {
            groups.push(("shard", i as u16, g));
        }
        for (i, g) in self.spec.coordinators.iter().enumerate() {
            groups.push(("coordinator", i as u16, g));
        }
        if let Some(g) = &self.spec.authority {
            groups.push(("authority", 0, g));
        }
        let groups: Vec<GroupStatus> = std::thread::scope(|s| {
            let asks: Vec<_> = groups
                .iter()
                .map(|(role, index, g)| {
                    let members: Vec<_> = g
                        .members
                        .iter()
                        .map(|m| s.spawn(move || self.ask(m.id, &m.addr, &m.key)))
                        .collect();
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
        let status = ClusterStatus {
            healthy: groups.iter().all(|g| g.healthy),
            groups,
        };
        *last = Some((Instant::now(), status.clone()));
        status
    }

    fn ask(&self, id: u64, addr: &str, key: &str) -> MemberStatus {
        let mut member = MemberStatus {
            id,
            addr: addr.to_string(),
            up: false,
            state: None,
            leader: None,
            term: None,
            last_log_index: None,
            last_applied: None,
            lag: None,
        };
        let Ok(key) = PublicKey::parse(key) else {
            return member;
        };
        let peer = Peer::new(addr.to_string(), key, self.me.clone(), ASK_TIMEOUT);
        if let Ok(Response::Status(s)) = peer.call(&Request::Status) {
            member.up = true;
            member.state = Some(s.raft.state);
            member.leader = s.raft.leader;
            member.term = Some(s.raft.term);
            member.last_log_index = s.raft.last_log_index;
            member.last_applied = s.raft.last_applied;
        }
        member
    }
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

//! Reaching a Raft group's leader: try the last known leader, follow `NotLeader` hints, rotate
//! through the members while an election runs, give up after a deadline.
//!
//! A leader that went silent (its machine stalled, its link cut: no connection error, just no
//! answer) must not hold callers for the whole answer timeout. Requests that are safe to send
//! again (reads, `Status`, and the coordinators' two-phase commands, which are idempotent per
//! batch id) wait at most what is left of the caller's patience (reads at most
//! [`READ_WAIT`]) before the next member is tried. A `Submit`, which may take long to answer
//! and is not sent twice, is watched instead: while it waits, the other members are asked every
//! [`PROBE_AFTER`] which leader they follow, and once another member leads, the call moves
//! there (the sentinel's resubmission is answered by txid, as after a leader's death). A
//! two-phase command that may wait longer than that is watched the same way. The others are
//! asked at once, and their answer serves every call of the client for [`PROBE_FRESH`]. A member
//! that did not answer is no longer the first one tried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{Peer, Request, Response, RpcError};
use florin_cluster::raft::NodeId;

/// How long a `Submit` or a two-phase command waits on a member before asking the others
/// whether another leads.
pub const PROBE_AFTER: Duration = Duration::from_millis(500);
/// How long one such answer serves every call of this client (so that calls waiting together
/// ask once, not each).
const PROBE_FRESH: Duration = Duration::from_millis(250);
/// How long such a question waits for each member's answer.
const PROBE_WAIT: Duration = Duration::from_millis(500);
/// The longest wait for a read's answer from one member.
pub const READ_WAIT: Duration = Duration::from_secs(5);
/// The shortest wait for an answer (however little patience is left).
const MIN_WAIT: Duration = Duration::from_millis(300);

/// The members of one group, as a client sees them.
pub struct GroupClient {
    peers: Vec<Arc<Peer>>,
    /// Each member's Raft id (to follow what the others say about who leads).
    ids: Vec<NodeId>,
    leader: AtomicUsize,
    /// The last answer to "who leads, if not member i": when, i, and the answer.
    probed: std::sync::Mutex<Option<(Instant, usize, Option<usize>)>>,
}

/// One attempt's end.
enum Attempt {
    Answer(Result<Response, RpcError>),
    /// Another member leads now: go there.
    MovedTo(usize),
}

/// Why a group call failed.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// No member answered as leader before the deadline.
    #[error("no leader answered within {waited:?} (last error: {last})")]
    NoLeader {
        /// How long it tried.
        waited: Duration,
        /// The last member's error.
        last: String,
    },
    /// The leader refused the request.
    #[error("refused: {0}")]
    Refused(String),
}

impl GroupClient {
    /// A client of a group with these members (Raft id, peer).
    pub fn new(members: Vec<(NodeId, Arc<Peer>)>) -> GroupClient {
        let (ids, peers) = members.into_iter().unzip();
        GroupClient {
            peers,
            ids,
            leader: AtomicUsize::new(0),
            probed: std::sync::Mutex::new(None),
        }
    }

    /// One attempt at member `i`, waiting as the request allows (see the module).
    fn attempt(&self, i: usize, req: &Request, left: Duration) -> Attempt {
        let peer = &self.peers[i];
        match req {
            Request::Submit(..) if self.peers.len() > 1 => self.watched(i, req, None),
            Request::Submit(..) | Request::Raft(_) | Request::RegistryWrite(_) => {
                Attempt::Answer(peer.call(req))
            }
            Request::Unspent(_)
            | Request::Confirmed(_)
            | Request::Books
            | Request::Status
            | Request::RegistryVersion
            | Request::AtomAttest(_)
            | Request::AtomStatus(_)
            | Request::AtomDecided(_)
            | Request::AtomUnspent(..)
            | Request::AtomConfirmed(..)
            | Request::AtomHeight
            | Request::AtomReadBlocks(..) => {
                let wait = left.min(READ_WAIT).max(MIN_WAIT).min(peer.timeout());
                Attempt::Answer(peer.call_within(req, wait))
            }
            Request::AtomForward(_) | Request::AtomBlocks(_) => {
                let wait = left.max(MIN_WAIT).min(peer.timeout());
                Attempt::Answer(peer.call_within(req, wait))
            }
            Request::Fenced(_) => {
                let wait = left.max(MIN_WAIT).min(peer.timeout());
                if self.peers.len() > 1 && wait > PROBE_AFTER {
                    // A silent leader is left as soon as another member leads, not after
                    // the whole wait: a new coordinator leader's first call after a centre's
                    // loss goes to the old shard leader.
                    self.watched(i, req, Some(wait))
                } else {
                    Attempt::Answer(peer.call_within(req, wait))
                }
            }
        }
    }

    /// A request to member `i` on a thread of its own, asking the others who leads every
    /// [`PROBE_AFTER`] while it waits (at most `within`, when given; else the peer's timeout).
    fn watched(&self, i: usize, req: &Request, within: Option<Duration>) -> Attempt {
        let (tx, rx) = std::sync::mpsc::channel();
        let (peer, r) = (self.peers[i].clone(), req.clone());
        let call = move || match within {
            Some(w) => peer.call_within(&r, w),
            None => peer.call(&r),
        };
        let spawned = std::thread::Builder::new()
            .name("florin-watched-call".into())
            .spawn({
                let call = call.clone();
                move || {
                    let _ = tx.send(call());
                }
            });
        if spawned.is_err() {
            // No thread to spare: wait without watching.
            return Attempt::Answer(call());
        }
        let deadline = within.map(|w| Instant::now() + w);
        loop {
            let wait = deadline.map_or(PROBE_AFTER, |d| {
                PROBE_AFTER.min(d.saturating_duration_since(Instant::now()) + MIN_WAIT)
            });
            match rx.recv_timeout(wait) {
                Ok(answer) => return Attempt::Answer(answer),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Attempt::Answer(Err(RpcError::BadAnswer(self.peers[i].addr.clone())))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(j) = self.leader_elsewhere(i) {
                        // An answer that came while the others were asked wins.
                        if let Ok(answer) = rx.try_recv() {
                            return Attempt::Answer(answer);
                        }
                        return Attempt::MovedTo(j);
                    }
                }
            }
        }
    }

    /// Another member than `i` that some member reports as the leader, if any. The others are
    /// asked at once, each on a thread of its own, so members that are down cost one
    /// [`PROBE_WAIT`] together, not one each.
    fn leader_elsewhere(&self, i: usize) -> Option<usize> {
        if let Ok(p) = self.probed.lock() {
            if let Some((at, asked, answer)) = *p {
                if asked == i && at.elapsed() < PROBE_FRESH {
                    return answer;
                }
            }
        }
        let answer = self.ask_who_leads(i);
        if let Ok(mut p) = self.probed.lock() {
            *p = Some((Instant::now(), i, answer));
        }
        answer
    }

    /// [`GroupClient::leader_elsewhere`] without the shared answer: the member of the highest
    /// term that some other member says leads.
    fn ask_who_leads(&self, i: usize) -> Option<usize> {
        let me = self.ids.get(i).copied();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut asked = 0;
        for (j, p) in self.peers.iter().enumerate() {
            if j == i {
                continue;
            }
            let (p, tx) = (p.clone(), tx.clone());
            let spawned = std::thread::Builder::new()
                .name("florin-who-leads".into())
                .spawn(move || {
                    let leader = match p.call_within(&Request::Status, PROBE_WAIT) {
                        Ok(Response::Status(s)) => s.raft.leader.map(|l| (s.raft.term, l)),
                        _ => None,
                    };
                    let _ = tx.send(leader);
                });
            if spawned.is_ok() {
                asked += 1;
            }
        }
        drop(tx);
        // Every answer within the wait; the leader named in the highest term wins (a member
        // that missed an election still names the old one).
        let deadline = Instant::now() + PROBE_WAIT + MIN_WAIT;
        let mut best: Option<(u64, usize)> = None;
        for _ in 0..asked {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(answer) = rx.recv_timeout(left) else {
                break;
            };
            if let Some((term, l)) = answer {
                if best.is_none_or(|(t, _)| term > t) {
                    if let Some(k) = self.ids.iter().position(|x| *x == l) {
                        best = Some((term, k));
                    }
                }
            }
        }
        best.map(|(_, k)| k).filter(|k| Some(self.ids[*k]) != me)
    }

    /// Member `i` did not answer: the next call starts with the next member.
    fn passed_over(&self, i: usize) {
        let n = self.peers.len().max(1);
        let _ = self
            .leader
            .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Calls the leader (blocking), retrying until `deadline` passes.
    pub fn call(&self, req: &Request, patience: Duration) -> Result<Response, GroupError> {
        let start = Instant::now();
        let mut last = String::from("no member");
        let mut i = self.leader.load(Ordering::Relaxed) % self.peers.len().max(1);
        let mut round = 0u32;
        while start.elapsed() < patience && !self.peers.is_empty() {
            let peer = &self.peers[i];
            let left = patience.saturating_sub(start.elapsed());
            let answer = match self.attempt(i, req, left) {
                Attempt::Answer(a) => a,
                Attempt::MovedTo(j) => {
                    last = format!(
                        "{} stopped answering; {} leads",
                        peer.addr, self.peers[j].addr
                    );
                    self.passed_over(i);
                    i = j;
                    continue;
                }
            };
            match answer {
                Ok(Response::NotLeader(hint)) => {
                    last = format!("{} is not the leader", peer.addr);
                    match hint.and_then(|a| self.peers.iter().position(|p| p.addr == a)) {
                        Some(j) if j != i => {
                            i = j;
                            continue;
                        }
                        _ => i = (i + 1) % self.peers.len(),
                    }
                }
                Ok(Response::Error(e)) => {
                    // An election in progress reads as unavailable: try again.
                    last = e;
                    i = (i + 1) % self.peers.len();
                }
                Ok(r) => {
                    self.leader.store(i, Ordering::Relaxed);
                    return Ok(r);
                }
                Err(e @ (RpcError::Unreachable { .. } | RpcError::BadAnswer(_))) => {
                    last = e.to_string();
                    self.passed_over(i);
                    i = (i + 1) % self.peers.len();
                }
            }
            if i == self.leader.load(Ordering::Relaxed) % self.peers.len() {
                round += 1;
                std::thread::sleep(Duration::from_millis((20 * round as u64).min(200)));
            }
        }
        Err(GroupError::NoLeader {
            waited: start.elapsed(),
            last,
        })
    }

    /// [`GroupClient::call`] from async code.
    pub async fn call_async(
        self: &Arc<Self>,
        req: Request,
        patience: Duration,
    ) -> Result<Response, GroupError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.call(&req, patience))
            .await
            .map_err(|e| GroupError::Refused(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use florin_cluster::raft::ReplicaStatus;
    use florin_cluster::shard::{Fence, Fenced, ShardCmd};
    use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};

    use super::*;
    use crate::cluster::rpc::{Handler, NodeStatus, Server};

    /// A member that answers: `Status` with who it follows, anything else as the leader
    /// (its own status) or with `NotLeader`; or, while `silent` is set, nothing (a frozen
    /// host: the connection is up, no answer comes).
    struct Member {
        id: NodeId,
        leader: NodeId,
        term: u64,
        silent: Option<Arc<std::sync::atomic::AtomicBool>>,
    }

    impl Handler for Member {
        async fn handle(&self, _: &PublicKey, req: Request) -> Response {
            if let Some(s) = &self.silent {
                while s.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            let status = Response::Status(NodeStatus {
                role: "shard".into(),
                group: 0,
                raft: ReplicaStatus {
                    id: self.id,
                    state: if self.id == self.leader {
                        "leader"
                    } else {
                        "follower"
                    }
                    .into(),
                    leader: Some(self.leader),
                    term: self.term,
                    last_log_index: None,
                    last_applied: None,
                    snapshot: None,
                    purged: None,
                },
                load: (0, 0),
                alerts: (0, None),
                remembered: 0,
            });
            match req {
                Request::Status => status,
                _ if self.id == self.leader => status,
                _ => Response::NotLeader(None),
            }
        }
    }

    fn key() -> LocalSigner {
        LocalSigner::new(SecretKey::generate(&mut rand::rngs::OsRng))
    }

    /// The old leader (member 1) takes connections and requests and never answers, as a
    /// frozen host does; member 2 missed the election and still names member 1 (term 1),
    /// member 3 leads in term 2. A two-phase command and a submission sent to member 1 move to
    /// member 3 once the others are asked who leads, long before the caller's patience (30 s)
    /// or the peer's timeout (60 s) runs out: without watching, the command would wait its
    /// whole patience on member 1.
    #[test]
    fn a_silent_leader_is_left_for_the_member_the_others_follow() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let me = Arc::new(key());
        let silent = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let mut members = Vec::new();
        let mut servers = Vec::new();
        for (id, leader, term, quiet) in [(1, 1, 1, true), (2, 1, 1, false), (3, 3, 2, false)] {
            let server_key = Arc::new(key());
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let server = Server::start(
                listener,
                server_key.clone(),
                HashSet::from([me.public_key()]),
                Arc::new(Member {
                    id,
                    leader,
                    term,
                    silent: quiet.then(|| silent.clone()),
                }),
                rt.handle().clone(),
            )
            .unwrap();
            members.push((
                id,
                Arc::new(Peer::new(
                    server.addr().to_string(),
                    server_key.public_key(),
                    me.clone(),
                    Duration::from_secs(60),
                )),
            ));
            servers.push(server);
        }
        let group = GroupClient::new(members);
        let fenced = Request::Fenced(Fenced {
            by: Fence { group: 0, term: 1 },
            cmd: ShardCmd::Discard { dtx: 7 },
        });
        for req in [fenced, Request::Submit(Vec::new(), 0)] {
            // Member 1 first, as a client that last saw it lead.
            group.leader.store(0, Ordering::Relaxed);
            if let Ok(mut p) = group.probed.lock() {
                *p = None;
            }
            let t = Instant::now();
            let answer = group.call(&req, Duration::from_secs(30)).unwrap();
            let Response::Status(s) = answer else {
                panic!("{answer:?}")
            };
            assert_eq!(s.raft.id, 3);
            // Moved after one probe (0.5 s, plus at most one probe's wait).
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            // The silent member is no longer the first one tried.
            assert_ne!(group.leader.load(Ordering::Relaxed), 0);
        }
        silent.store(false, Ordering::Relaxed);
        drop(servers);
    }
}

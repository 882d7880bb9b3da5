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
//! there (the sentinel's resubmission is answered by txid, as after a leader's death). A member
//! that did not answer is no longer the first one tried.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{Peer, Request, Response, RpcError};
use florin_cluster::raft::NodeId;

/// How long a `Submit` waits on a member before asking the others whether another leads.
pub const PROBE_AFTER: Duration = Duration::from_millis(1000);
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
        }
    }

    /// One attempt at member `i`, waiting as the request allows (see the module).
    fn attempt(&self, i: usize, req: &Request, left: Duration) -> Attempt {
        let peer = &self.peers[i];
        match req {
            Request::Submit(..) if self.peers.len() > 1 => self.watched(i, req),
            Request::Submit(..) | Request::Raft(_) | Request::RegistryWrite(_) => {
                Attempt::Answer(peer.call(req))
            }
            Request::Unspent(_)
            | Request::Confirmed(_)
            | Request::Books
            | Request::Status
            | Request::RegistryVersion => {
                let wait = left.min(READ_WAIT).max(MIN_WAIT).min(peer.timeout());
                Attempt::Answer(peer.call_within(req, wait))
            }
            Request::Fenced(_) => {
                let wait = left.max(MIN_WAIT).min(peer.timeout());
                Attempt::Answer(peer.call_within(req, wait))
            }
        }
    }

    /// A `Submit` to member `i` on a thread of its own, asking the others who leads while it
    /// waits.
    fn watched(&self, i: usize, req: &Request) -> Attempt {
        let (tx, rx) = std::sync::mpsc::channel();
        let (peer, r) = (self.peers[i].clone(), req.clone());
        std::thread::spawn(move || {
            let _ = tx.send(peer.call(&r));
        });
        loop {
            match rx.recv_timeout(PROBE_AFTER) {
                Ok(answer) => return Attempt::Answer(answer),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Attempt::Answer(Err(RpcError::BadAnswer(self.peers[i].addr.clone())))
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(j) = self.leader_elsewhere(i) {
                        return Attempt::MovedTo(j);
                    }
                }
            }
        }
    }

    /// Another member than `i` that some member reports as the leader, if any.
    fn leader_elsewhere(&self, i: usize) -> Option<usize> {
        let me = self.ids.get(i).copied();
        for (j, p) in self.peers.iter().enumerate() {
            if j == i {
                continue;
            }
            if let Ok(Response::Status(s)) = p.call_within(&Request::Status, PROBE_WAIT) {
                if let Some(l) = s.raft.leader.filter(|l| Some(*l) != me) {
                    if let Some(k) = self.ids.iter().position(|x| *x == l) {
                        return Some(k);
                    }
                }
            }
        }
        None
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

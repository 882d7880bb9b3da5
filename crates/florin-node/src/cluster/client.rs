//! Reaching a Raft group's leader: try the last known leader, follow `NotLeader` hints, rotate
//! through the members while an election runs, give up after a deadline.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rpc::{Peer, Request, Response, RpcError};

/// The members of one group, as a client sees them.
pub struct GroupClient {
    peers: Vec<Arc<Peer>>,
    leader: AtomicUsize,
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
    /// A client of a group with these members.
    pub fn new(peers: Vec<Arc<Peer>>) -> GroupClient {
        GroupClient {
            peers,
            leader: AtomicUsize::new(0),
        }
    }

    /// Calls the leader (blocking), retrying until `deadline` passes.
    pub fn call(&self, req: &Request, patience: Duration) -> Result<Response, GroupError> {
        let start = Instant::now();
        let mut last = String::from("no member");
        let mut i = self.leader.load(Ordering::Relaxed) % self.peers.len().max(1);
        let mut round = 0u32;
        while start.elapsed() < patience && !self.peers.is_empty() {
            let peer = &self.peers[i];
            match peer.call(req) {
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

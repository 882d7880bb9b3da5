//! What a node that signs through a key-management network sees of it: each custody node up or
//! not, its keys and pools (`GET /v1/custody`, the console's custody view). Asked at most once
//! every two seconds however often it is asked.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Kmn;
use crate::api::{CustodyNodeStatus, CustodyStatus};

/// How long an answer is reused.
const FRESH_FOR: Duration = Duration::from_secs(2);

/// A view of one key-management network.
pub struct CustodyView {
    kmn: Arc<Kmn>,
    last: Mutex<Option<(Instant, CustodyStatus)>>,
}

impl CustodyView {
    /// A view of the network `kmn` reaches.
    pub fn new(kmn: Arc<Kmn>) -> Arc<CustodyView> {
        Arc::new(CustodyView {
            kmn,
            last: Mutex::new(None),
        })
    }

    /// Every node's state (blocking: one status round, bounded by the client's timeout).
    /// Healthy while at least the threshold of nodes answer.
    pub fn status(&self) -> CustodyStatus {
        let mut last = match self.last.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if let Some((at, st)) = last.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return st.clone();
            }
        }
        let nodes: Vec<CustodyNodeStatus> = self
            .kmn
            .status()
            .into_iter()
            .map(|s| CustodyNodeStatus {
                party: s.party,
                addr: s.addr.to_string(),
                up: s.up,
                error: s.error,
                keys: (s.keys.len() + s.ecdsa.as_ref().map_or(0, |e| e.keys.len())) as u64,
                nonces_ready: s.nonces_ready,
                presignatures: s
                    .ecdsa
                    .as_ref()
                    .map_or(0, |e| e.keys.iter().map(|k| k.2).sum()),
            })
            .collect();
        let up = nodes.iter().filter(|n| n.up).count();
        let status = CustodyStatus {
            t: self.kmn.t(),
            n: self.kmn.n(),
            healthy: up >= self.kmn.t() as usize,
            nodes,
        };
        *last = Some((Instant::now(), status.clone()));
        status
    }
}

//! What a node that signs through a key-management network sees of it: each custody node up or
//! not, its keys and pools (`GET /v1/custody`, the console's custody view). Asked by one caller
//! at a time and at most once every two seconds however often it is asked ([`Snapshot`]).

use std::sync::Arc;
use std::time::Duration;

use super::Kmn;
use crate::api::{CustodyNodeStatus, CustodyStatus};
use crate::snapshot::Snapshot;

/// How long an answer is reused.
const FRESH_FOR: Duration = Duration::from_secs(2);

/// A view of one key-management network.
pub struct CustodyView {
    kmn: Arc<Kmn>,
    last: Snapshot<CustodyStatus>,
}

impl CustodyView {
    /// A view of the network `kmn` reaches.
    pub fn new(kmn: Arc<Kmn>) -> Arc<CustodyView> {
        Arc::new(CustodyView {
            kmn,
            last: Snapshot::new(FRESH_FOR),
        })
    }

    /// Every node's state (blocking when this caller asks: one status round, bounded by the
    /// client's timeout). Healthy while at least the threshold of nodes answer. Before the
    /// first answer, while another caller is asking: no nodes, not healthy.
    pub fn status(&self) -> CustodyStatus {
        self.last.get(|| self.ask()).unwrap_or(CustodyStatus {
            t: self.kmn.t(),
            n: self.kmn.n(),
            healthy: false,
            nodes: Vec::new(),
        })
    }

    fn ask(&self) -> CustodyStatus {
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
        CustodyStatus {
            t: self.kmn.t(),
            n: self.kmn.n(),
            healthy: up >= self.kmn.t() as usize,
            nodes,
        }
    }
}

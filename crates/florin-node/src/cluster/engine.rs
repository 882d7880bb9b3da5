//! The single-node engine behind the cluster's RPC: one process holding a [`SwapStore`] (the
//! embedded engine, opened by `florin node` with `role = "engine"`) that takes the same
//! `Submit` batches of compact transactions as a coordinator group and the same reads as a
//! shard. It is the reference a replicated shard is measured against on equal emulated hosts
//! (`florin bench cluster --emulate-hosts`: `cluster_r3_vs_single_ratio`), fed by the same load
//! generators over the same authenticated transport, so that the ratio compares the engines
//! and not the ways they are reached.
//!
//! Its spec names the one process as the only member of one shard group and of one
//! coordinator group (so a [`super::ClusterStore`] reaches it unchanged); the clients are the
//! spec's `clients`.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Arc;

use florin_cluster::raft::ReplicaStatus;
use florin_crypto::{LocalSigner, PublicKey, Signer};
use florin_ledger::SwapStore;

use super::rpc::{Handler, NodeStatus, Request, Response, Server};
use super::ClusterSpec;
use crate::error::NodeError;

/// The engine as an RPC handler.
pub struct EngineService {
    store: Arc<dyn SwapStore>,
    /// Who may submit and read (the spec's clients).
    clients: HashSet<PublicKey>,
}

impl EngineService {
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn SwapStore) -> Result<T, florin_ledger::StoreError> + Send + 'static,
        ok: impl FnOnce(T) -> Response,
    ) -> Response {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || f(store.as_ref())).await {
            Ok(Ok(v)) => ok(v),
            Ok(Err(e)) => Response::Error(e.to_string()),
            Err(_) => Response::Error("the engine's worker stopped".into()),
        }
    }
}

impl Handler for EngineService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        if !matches!(req, Request::Status) && !self.clients.contains(peer) {
            return Response::Error("submissions and reads only from the engine's clients".into());
        }
        match req {
            Request::Submit(txs, now) => {
                // Never more than the tolerated skew past this machine's clock.
                let now = now.min(
                    florin_ledger::expiry::unix_now() + florin_ledger::expiry::CLOCK_SKEW_SECS,
                );
                self.blocking(move |s| s.swap_at(now, &txs), Response::Submitted)
                    .await
            }
            Request::Unspent(ids) => {
                self.blocking(
                    move |s| ids.iter().map(|i| s.is_unspent(i)).collect(),
                    Response::Bools,
                )
                .await
            }
            Request::Confirmed(ids) => {
                self.blocking(
                    move |s| ids.iter().map(|i| s.is_confirmed(i)).collect(),
                    Response::Bools,
                )
                .await
            }
            Request::Books => self.blocking(|s| s.supply(), Response::Books).await,
            Request::Status => Response::Status(NodeStatus {
                role: "engine".into(),
                group: 0,
                // One process: always its own leader.
                raft: ReplicaStatus {
                    id: 1,
                    state: "leader".into(),
                    leader: Some(1),
                    term: 1,
                    last_log_index: None,
                    last_applied: None,
                    snapshot: None,
                    purged: None,
                },
                load: (0, 0),
                alerts: (0, None),
                remembered: 0,
            }),
            _ => Response::Error("the engine serves Submit, reads and Status".into()),
        }
    }
}

/// Serves `store` on `listener` to the spec's clients and observers. Call inside a tokio
/// runtime.
pub fn serve(
    spec: &ClusterSpec,
    me: Arc<LocalSigner>,
    store: Arc<dyn SwapStore>,
    listener: TcpListener,
) -> Result<Server, NodeError> {
    let mine = me.public_key();
    let is_member = spec
        .shards
        .iter()
        .chain(&spec.coordinators)
        .all(|g| g.members.len() == 1 && g.members[0].key == mine.to_address());
    if !is_member || spec.shards.len() != 1 || spec.coordinators.len() != 1 {
        return Err(NodeError::bad_request(
            "an engine's spec has one shard group and one coordinator group, each with this process as its only member",
        ));
    }
    let svc = Arc::new(EngineService {
        store,
        clients: spec.client_keys(),
    });
    Server::start(
        listener,
        me,
        spec.allowed(),
        svc,
        tokio::runtime::Handle::current(),
    )
    .map_err(|e| NodeError::storage(format!("cannot serve the engine: {e}")))
}

//! One custody node as the coordinator sees it: a pooled, authenticated link to it (the shared
//! [`RpcClient`]), whether it is skipped for a recent failure, and the nonce commitments held
//! from it.

use super::*;

use florin_net::rpc::{self, ClientLimits, RpcClient};

pub(super) struct Link {
    pub(super) party: PartyId,
    pub(super) addr: SocketAddr,
    pub(super) key: PublicKey,
    client: RpcClient,
    pub(super) down_until: Mutex<Option<Instant>>,
    /// The node's nonce commitments this coordinator holds and has not used (any key).
    pub(super) commitments: Mutex<CommitmentQueue>,
}

/// A request sent to one node and not yet answered.
pub(super) struct Pending<'a> {
    link: &'a Link,
    inner: rpc::Pending<'a>,
}

impl Link {
    pub(super) fn new(
        party: PartyId,
        addr: SocketAddr,
        key: PublicKey,
        me: Arc<LocalSigner>,
    ) -> Link {
        let limits = ClientLimits {
            max_idle: MAX_IDLE,
            connect_timeout: CONNECT_TIMEOUT,
            max_message: MAX_WIRE,
        };
        Link {
            party,
            addr,
            key,
            client: RpcClient::new(&addr.to_string(), key, me, &limits),
            down_until: Mutex::new(None),
            commitments: Mutex::new(CommitmentQueue {
                q: VecDeque::new(),
                batch: COMMIT_BATCH_START,
            }),
        }
    }

    pub(super) fn is_down(&self) -> bool {
        self.down_until
            .lock()
            .map(|d| d.is_some_and(|t| Instant::now() < t))
            .unwrap_or(false)
    }

    pub(super) fn mark_down(&self) {
        if let Ok(mut d) = self.down_until.lock() {
            *d = Some(Instant::now() + DOWN_FOR);
        }
        self.client.clear();
    }

    fn failed(&self, e: &dyn std::fmt::Display) -> String {
        self.mark_down();
        format!("node {}: {e}", self.party)
    }

    /// Sends `req`; [`Pending::finish`] reads the answer. Sending to several nodes before
    /// reading any lets them work in parallel. A node that cannot be reached is skipped for
    /// [`DOWN_FOR`].
    pub(super) fn send(&self, req: &Request) -> Result<Pending<'_>, String> {
        match self.client.send(wire::encode(req)) {
            Ok(inner) => Ok(Pending { link: self, inner }),
            Err(e) => Err(self.failed(&e)),
        }
    }
}

impl Pending<'_> {
    /// Reads the answer, waiting at most `timeout`.
    pub(super) fn finish(self, timeout: Duration) -> Result<Response, String> {
        let link = self.link;
        let answer = self.inner.finish(timeout).map_err(|e| link.failed(&e))?;
        wire::decode::<Response>(&answer, "answer").map_err(|e| link.failed(&e))
    }
}

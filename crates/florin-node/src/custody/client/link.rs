//! A pooled, authenticated connection to one custody node, and requests in flight on it.

use super::*;

pub(super) struct Link {
    pub(super) party: PartyId,
    pub(super) addr: SocketAddr,
    pub(super) key: PublicKey,
    pub(super) idle: Mutex<Vec<Channel>>,
    pub(super) down_until: Mutex<Option<Instant>>,
    /// The node's nonce commitments this coordinator holds and has not used (any key).
    pub(super) commitments: Mutex<CommitmentQueue>,
}

pub(super) struct Pending<'a> {
    pub(super) link: &'a Link,
    pub(super) ch: Option<Channel>,
    pub(super) reused: bool,
    pub(super) req: Vec<u8>,
}

impl Link {
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
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }

    pub(super) fn fresh(&self, me: &LocalSigner) -> Result<Channel, String> {
        let cfg = ChannelConfig {
            timeout: CONNECT_TIMEOUT,
            ..ChannelConfig::default()
        };
        connect(self.addr, me, Some(self.key), &cfg).map_err(|e| {
            self.mark_down();
            format!("node {} at {}: {e}", self.party, self.addr)
        })
    }

    /// Sends `req`; [`Pending::finish`] reads the answer. Sending to several nodes before
    /// reading any lets them work in parallel.
    pub(super) fn send(&self, me: &LocalSigner, req: &Request) -> Result<Pending<'_>, String> {
        let req = wire::encode(req);
        let pooled = self.idle.lock().ok().and_then(|mut v| v.pop());
        let (mut ch, reused) = match pooled {
            Some(c) => (c, true),
            None => (self.fresh(me)?, false),
        };
        if ch.send(&req).is_err() {
            if !reused {
                self.mark_down();
                return Err(format!("node {}: connection lost", self.party));
            }
            // A pooled connection the node closed while idle: one fresh try.
            ch = self.fresh(me)?;
            ch.send(&req).map_err(|e| {
                self.mark_down();
                format!("node {}: {e}", self.party)
            })?;
            return Ok(Pending {
                link: self,
                ch: Some(ch),
                reused: false,
                req,
            });
        }
        Ok(Pending {
            link: self,
            ch: Some(ch),
            reused,
            req,
        })
    }
}

impl Pending<'_> {
    pub(super) fn finish(
        mut self,
        me: &LocalSigner,
        timeout: Duration,
    ) -> Result<Response, String> {
        let link = self.link;
        let Some(mut ch) = self.ch.take() else {
            return Err("no channel".into());
        };
        let _ = ch.set_timeout(timeout);
        let answer = match ch.recv(MAX_WIRE) {
            Ok(b) => b,
            Err(first) => {
                // Only a pooled connection the node closed is worth one fresh try; a node that
                // timed out is slow or hung, and waiting again would double the stall.
                let timed_out = matches!(&first, florin_net::NetError::Io(e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
                if !self.reused || timed_out {
                    link.mark_down();
                    return Err(format!("node {}: {first}", link.party));
                }
                ch = link.fresh(me)?;
                let _ = ch.set_timeout(timeout);
                ch.send(&self.req)
                    .and_then(|_| ch.recv(MAX_WIRE))
                    .map_err(|e| {
                        link.mark_down();
                        format!("node {}: {e}", link.party)
                    })?
            }
        };
        let resp = wire::decode::<Response>(&answer, "answer").map_err(|e| {
            link.mark_down();
            format!("node {}: {e}", link.party)
        })?;
        if let Ok(mut idle) = link.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push(ch);
            }
        }
        Ok(resp)
    }
}

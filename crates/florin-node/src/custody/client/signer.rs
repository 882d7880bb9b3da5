//! The threshold `Signer`: nonce commitments queued ahead, t nodes per signature, aggregation.

use super::*;

/// Nonce commitments a node handed out and no signature used yet: (nonce id, bytes), and
/// the size of the next fetch. One queue per node serves every key.
pub(super) struct CommitmentQueue {
    pub(super) q: VecDeque<(u64, Vec<u8>)>,
    pub(super) batch: u32,
}

/// Signs with a threshold key held by the network. Its signatures are ordinary Ed25519
/// signatures under [`GroupKey::public_key`].
pub struct ThresholdSigner {
    pub(super) kmn: Arc<Kmn>,
    /// The sharing signatures are aggregated with, and its digest; replaced when the nodes
    /// report a refreshed sharing of the same public key.
    pub(super) group: RwLock<Arc<(GroupKey, [u8; 32])>>,
    pub(super) public: PublicKey,
    pub(super) threshold: u16,
    pub(super) key_id: String,
    pub(super) next: AtomicUsize,
}

impl ThresholdSigner {
    /// A signer for `group` on `kmn`.
    pub fn new(kmn: Arc<Kmn>, group: GroupKey) -> ThresholdSigner {
        // Start the rotation at a random node, so a coordinator's many keys spread their
        // signing over all n nodes from the first signature.
        let start = (OsRng.next_u32() as usize) % kmn.links.len().max(1);
        ThresholdSigner {
            key_id: group.key_id().to_string(),
            public: group.public_key(),
            threshold: group.threshold(),
            kmn,
            group: RwLock::new(Arc::new((group.clone(), group.digest()))),
            next: AtomicUsize::new(start),
        }
    }

    pub(super) fn current(&self) -> Arc<(GroupKey, [u8; 32])> {
        match self.group.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Takes up the sharing the nodes hold now, after a node said `used` is stale (its
    /// shares were refreshed). The public key must not change.
    pub(super) fn reload(&self, used: &[u8; 32]) -> Result<(), KmnError> {
        if self.current().1 != *used {
            return Ok(()); // another thread reloaded already
        }
        let fresh = self.kmn.group(&self.key_id)?;
        if fresh.public_key() != self.public || fresh.threshold() != self.threshold {
            return Err(KmnError::Protocol(CustodyError::Inconsistent(format!(
                "the nodes now hold another key named {}",
                self.key_id
            ))));
        }
        let digest = fresh.digest();
        if let Ok(mut g) = self.group.write() {
            *g = Arc::new((fresh, digest));
        }
        Ok(())
    }

    pub(super) fn queue(&self, p: PartyId) -> Option<std::sync::MutexGuard<'_, CommitmentQueue>> {
        self.kmn.link(p)?.commitments.lock().ok()
    }

    /// The key's public side, as of the last signature (a refresh changes the public shares,
    /// not the public key).
    pub fn group(&self) -> GroupKey {
        self.current().0.clone()
    }

    /// t nodes to ask, rotating, nodes that recently failed last.
    pub(super) fn choose(&self, excluded: &[PartyId]) -> Vec<PartyId> {
        let links = &self.kmn.links;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let order: Vec<&Link> = (0..links.len())
            .map(|i| &links[(start + i) % links.len()])
            .filter(|l| !excluded.contains(&l.party))
            .collect();
        let mut up: Vec<PartyId> = order
            .iter()
            .filter(|l| !l.is_down())
            .map(|l| l.party)
            .collect();
        up.extend(order.iter().filter(|l| l.is_down()).map(|l| l.party));
        up.truncate(self.threshold as usize);
        up
    }

    pub(super) fn pop(&self, p: PartyId) -> Option<(u64, Vec<u8>)> {
        self.queue(p)?.q.pop_front()
    }

    pub(super) fn push_back(&self, p: PartyId, c: (u64, Vec<u8>)) {
        if let Some(mut q) = self.queue(p) {
            q.q.push_front(c);
        }
    }

    pub(super) fn clear(&self, p: PartyId) {
        if let Some(mut q) = self.queue(p) {
            q.q.clear();
        }
    }

    /// Signs `msg`: see the module documentation for what happens when nodes fail.
    pub fn sign_msg(&self, msg: &[u8]) -> Result<Signature, KmnError> {
        crate::obs::time_signature("frost", || self.sign_inner(msg, None))
    }

    /// Signs the txid `msg` with a key bound to a customer, sending each node the
    /// transaction and the customer's authorization (`KmnError::Unauthorized` when a node
    /// finds it does not hold).
    pub fn sign_authorized(
        &self,
        msg: &[u8],
        authz: &florin_custody::authz::Authorization,
    ) -> Result<Signature, KmnError> {
        crate::obs::time_signature("frost", || self.sign_inner(msg, Some(authz)))
    }

    fn sign_inner(
        &self,
        msg: &[u8],
        authz: Option<&florin_custody::authz::Authorization>,
    ) -> Result<Signature, KmnError> {
        let t = self.threshold as usize;
        let mut excluded: Vec<PartyId> = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        for _attempt in 0..(self.kmn.links.len() + 2) {
            let group = self.current();
            let chosen = self.choose(&excluded);
            if chosen.len() < t {
                break;
            }
            // Commitments: from the cache, else one batch fetch from the nodes that ran out.
            let mut commitments: BTreeMap<PartyId, (u64, Vec<u8>)> = BTreeMap::new();
            let mut fetch = Vec::new();
            for &p in &chosen {
                match self.pop(p) {
                    Some(c) => {
                        commitments.insert(p, c);
                    }
                    None => {
                        let count = match self.queue(p) {
                            Some(mut q) => {
                                let c = q.batch;
                                q.batch = (c * 2).min(COMMIT_BATCH);
                                c
                            }
                            None => COMMIT_BATCH_START,
                        };
                        fetch.push((p, Request::Commitments { count }))
                    }
                }
            }
            let mut failed = false;
            for (p, r) in self.kmn.round(fetch, SIGN_TIMEOUT) {
                match r {
                    Ok(Response::Commitments(list)) if !list.is_empty() => {
                        let mut it = list.into_iter();
                        if let Some(first) = it.next() {
                            commitments.insert(p, first);
                        }
                        if let Some(mut q) = self.queue(p) {
                            q.q.extend(it);
                        }
                    }
                    Ok(Response::Refused(r)) => {
                        errors.push(format!("node {p}: {}", r.message));
                        excluded.push(p);
                        failed = true;
                    }
                    Ok(_) => {
                        errors.push(format!("node {p}: unexpected answer"));
                        excluded.push(p);
                        failed = true;
                    }
                    Err(e) => {
                        errors.push(e);
                        excluded.push(p);
                        failed = true;
                    }
                }
            }
            if failed {
                // Unused commitments stay valid for the next attempt.
                for (p, c) in commitments {
                    self.push_back(p, c);
                }
                continue;
            }
            let plain: BTreeMap<PartyId, Vec<u8>> =
                commitments.iter().map(|(p, c)| (*p, c.1.clone())).collect();
            let package = match SigningPackage::new(&plain, msg) {
                Ok(pk) => pk,
                Err(CustodyError::Misbehaved { party, reason }) => {
                    errors.push(format!("node {party}: {reason}"));
                    excluded.push(party);
                    self.clear(party);
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let bytes = package.to_bytes()?;
            let reqs = commitments
                .iter()
                .map(|(p, c)| {
                    let req = match authz {
                        None => Request::Sign {
                            key_id: self.key_id.clone(),
                            group: group.1,
                            nonce: c.0,
                            package: bytes.clone(),
                        },
                        Some(a) => Request::SignAuthorized {
                            key_id: self.key_id.clone(),
                            group: group.1,
                            nonce: c.0,
                            package: bytes.clone(),
                            authz: a.clone(),
                        },
                    };
                    (*p, req)
                })
                .collect();
            let mut shares = BTreeMap::new();
            let mut stale = Vec::new();
            let mut unauthorized = None;
            for (p, r) in self.kmn.round(reqs, SIGN_TIMEOUT) {
                match r {
                    Ok(Response::Share(s)) => {
                        shares.insert(p, s);
                    }
                    Ok(Response::Refused(r)) if r.stale_group => {
                        // Refused before its nonce was used: the commitment stays valid.
                        if let Some(c) = commitments.get(&p) {
                            self.push_back(p, c.clone());
                        }
                        errors.push(format!("node {p}: {}", r.message));
                        stale.push(p);
                    }
                    Ok(Response::Refused(r)) if r.unauthorized.is_some() => {
                        // Refused before its nonce was used: another node would refuse the
                        // same authorization, so stop here.
                        if let Some(c) = commitments.get(&p) {
                            self.push_back(p, c.clone());
                        }
                        unauthorized.get_or_insert(refused(p, r));
                    }
                    Ok(Response::Refused(r)) if r.stale_nonce => {
                        // The node restarted or dropped the nonce: fresh commitments next time.
                        self.clear(p);
                        errors.push(format!("node {p}: {}", r.message));
                    }
                    Ok(Response::Refused(r)) => {
                        errors.push(format!("node {p}: {}", r.message));
                        // A node that blames another's commitment: check the claim here, so
                        // a lying node cannot get an honest one left out.
                        match r.culprit {
                            Some(q) if q != p && package.check_commitment(q).is_err() => {
                                excluded.push(q);
                                self.clear(q);
                            }
                            _ => excluded.push(p),
                        }
                    }
                    Ok(_) => {
                        errors.push(format!("node {p}: unexpected answer"));
                        excluded.push(p);
                    }
                    Err(e) => {
                        errors.push(e);
                        excluded.push(p);
                    }
                }
            }
            if let Some(e) = unauthorized {
                return Err(e);
            }
            if !stale.is_empty() {
                // The shares were refreshed: take up the sharing the nodes hold and sign
                // again. If that is the sharing used here already, the refusing node is the
                // one behind (a refresh whose commit did not reach it): go on without it.
                if let Err(e) = self.reload(&group.1) {
                    errors.push(e.to_string());
                }
                if self.current().1 == group.1 {
                    excluded.extend(stale);
                }
                continue;
            }
            if shares.len() < t {
                continue;
            }
            match frost::aggregate(&group.0, &package, &shares) {
                Ok(sig) => return Ok(sig),
                Err(CustodyError::Misbehaved { party, reason }) => {
                    errors.push(format!("node {party} sent a bad signature share: {reason}"));
                    excluded.push(party);
                    self.clear(party);
                }
                Err(e) => return Err(e.into()),
            }
        }
        errors.dedup();
        Err(KmnError::Unavailable(format!(
            "cannot sign with {}: {} of {} key-management nodes needed; {}",
            self.key_id,
            t,
            self.kmn.links.len(),
            errors.join("; ")
        )))
    }
}

impl Signer for ThresholdSigner {
    fn public_key(&self) -> PublicKey {
        self.public
    }

    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError> {
        self.sign_msg(msg)
            .map_err(|e| SignerError::Unavailable(e.to_string()))
    }
}

//! Protocol runs in progress: starting, stepping and aborting them, the envelopes between
//! nodes, run limits and ids, and storing what a finished run produced.

use super::*;

pub(super) struct Run {
    tx: mpsc::Sender<Cmd>,
    /// The envelopes' session: the first half of the execution id, so envelopes of one run
    /// cannot be opened in another run or for another job.
    tag: [u8; 16],
    step: u8,
    /// A step is being computed: another request for this run meanwhile is refused.
    busy: bool,
    parties: Vec<PartyId>,
    job: EcdsaJob,
    last: Instant,
    /// The client that started it; `None` for an administrator (no per-client limit).
    client: Option<PublicKey>,
}

impl Run {
    /// Whether `party` takes part.
    pub(super) fn involves(&self, party: PartyId) -> bool {
        self.parties.contains(&party)
    }

    /// Whether it is a DKLs23 run.
    pub(super) fn is_dkls(&self) -> bool {
        matches!(
            self.job,
            EcdsaJob::DklsKeygen { .. }
                | EcdsaJob::DklsSign { .. }
                | EcdsaJob::DklsRefresh { .. }
                | EcdsaJob::DklsRefreshComplete { .. }
        )
    }

    fn idle_limit(&self) -> Duration {
        if self.job == EcdsaJob::Aux {
            AUX_IDLE
        } else {
            RUN_IDLE
        }
    }

    fn step_limit(&self) -> Duration {
        if self.job == EcdsaJob::Aux {
            AUX_STEP_LIMIT
        } else {
            STEP_LIMIT
        }
    }
}

#[derive(Default)]
pub(super) struct Seen {
    set: std::collections::HashSet<[u8; 16]>,
    order: VecDeque<[u8; 16]>,
}

impl Seen {
    /// Records `s`; false if it was seen before.
    fn insert(&mut self, s: [u8; 16]) -> bool {
        if !self.set.insert(s) {
            return false;
        }
        self.order.push_back(s);
        if self.order.len() > MAX_SEEN {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// The 32-byte execution id every party derives alike: it binds the run to its job, so a
/// relay cannot replay one run's messages into another.
fn execution_id(session: &[u8; 16], job: &EcdsaJob, n: u16) -> [u8; 32] {
    let tag = florin_custody::wire::encode(job);
    hash(
        "florin/custody/ecdsa/run/v1",
        &[session, &n.to_le_bytes(), &tag],
    )
}

impl EcdsaNode {
    /// Starts this node's part of `job`; `frost_has` tells whether a FROST key has the name
    /// (one namespace for both schemes).
    pub(in crate::custody) fn start(
        &self,
        session: [u8; 16],
        job: EcdsaJob,
        frost_has: bool,
        client: Option<PublicKey>,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let cggmp = matches!(
            job,
            EcdsaJob::Aux
                | EcdsaJob::Keygen { .. }
                | EcdsaJob::Presign { .. }
                | EcdsaJob::Sign { .. }
        );
        if cggmp && self.level == EcdsaLevel::Dkls23 {
            return Err(dkls_only());
        }
        let (spec, parties) = match &job {
            EcdsaJob::Aux => {
                // A run that finished at only some nodes can be repeated until the first key
                // uses the auxiliary information (the primes are kept until then).
                let has_keys = !self.keys.read().map_err(|_| lock_err())?.is_empty()
                    || !self.pending.lock().map_err(|_| lock_err())?.is_empty();
                if self.aux.read().map_err(|_| lock_err())?.is_some() && has_keys {
                    return Err(CustodyError::BadParameters(
                        "auxiliary information already made and in use by keys (a refresh is \
                         not built)"
                            .into(),
                    ));
                }
                let primes = self.primes.lock().map_err(|_| lock_err())?.clone();
                let Some(primes) = primes else {
                    return Err(CustodyError::BadParameters(format!(
                        "party {}: primes not ready yet (generating in the background; \
                         minutes at the production level)",
                        self.party
                    )));
                };
                (Spec::Aux { primes }, (1..=self.n).collect::<Vec<_>>())
            }
            EcdsaJob::Keygen { key_id, t } => {
                self.check_new_key(key_id, *t, frost_has)?;
                (Spec::Keygen { t: *t }, (1..=self.n).collect())
            }
            EcdsaJob::Presign { key_id, signers } => {
                let spec = self.sign_spec(key_id, signers)?;
                let parties = spec.signers.clone();
                (Spec::Presign(spec), parties)
            }
            EcdsaJob::Sign {
                key_id,
                signers,
                message,
            } => {
                let spec = self.sign_spec(key_id, signers)?;
                let parties = spec.signers.clone();
                (Spec::Sign(spec, message.clone()), parties)
            }
            EcdsaJob::DklsKeygen { key_id, t } => {
                self.check_new_key(key_id, *t, frost_has)?;
                let parties: Vec<PartyId> = (1..=self.n).collect();
                self.check_not_banned(&parties)?;
                (Spec::DklsKeygen { t: *t }, parties)
            }
            EcdsaJob::DklsSign {
                key_id,
                signers,
                message,
                authz,
            } => {
                let k = self.dkls_key(key_id)?;
                let mut parties = signers.clone();
                parties.sort_unstable();
                self.check_not_banned(&parties)?;
                (
                    Spec::DklsSign {
                        share: k.core.clone(),
                        signers: signers.clone(),
                        message: message.clone(),
                        // A note key (checked against the transaction with the rest of the
                        // authorization before the run starts).
                        tweak: authz.as_ref().and_then(|a| a.tweak),
                    },
                    parties,
                )
            }
            EcdsaJob::DklsRefresh { key_id } => {
                let k = self.dkls_key(key_id)?;
                let parties: Vec<PartyId> = (1..=self.n).collect();
                self.check_not_banned(&parties)?;
                (
                    Spec::DklsRefresh {
                        share: k.core.clone(),
                        complete: false,
                    },
                    parties,
                )
            }
            EcdsaJob::DklsRefreshComplete { key_id } => {
                // A node whose share was rebuilt by repair takes part with it (hollow, pending).
                let k = self.complete_refresh_share(key_id)?;
                let parties: Vec<PartyId> = (1..=self.n).collect();
                self.check_not_banned(&parties)?;
                (
                    Spec::DklsRefresh {
                        share: k.core.clone(),
                        complete: true,
                    },
                    parties,
                )
            }
        };
        let eid = execution_id(&session, &job, self.n);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&eid[..16]);
        let (tx, limit) = {
            let mut runs = self.runs.lock().map_err(|_| lock_err())?;
            runs.retain(|_, r| r.busy || r.last.elapsed() < r.idle_limit());
            if runs.len() >= MAX_RUNS {
                return Err(CustodyError::Busy(format!(
                    "{} ECDSA runs in progress, the most this node takes",
                    runs.len()
                )));
            }
            if let Some(c) = &client {
                let own = runs
                    .values()
                    .filter(|r| r.client.as_ref() == Some(c))
                    .count();
                if own >= MAX_RUNS_PER_CLIENT {
                    return Err(CustodyError::Busy(format!(
                        "this client has {own} ECDSA runs in progress, the most one client \
                         may have (finish or abort one)"
                    )));
                }
            }
            // One auxiliary-information run, and one key generation per name, at a time.
            if runs.values().any(|r| match (&r.job, &job) {
                (EcdsaJob::Aux, EcdsaJob::Aux) => true,
                (EcdsaJob::Keygen { key_id: a, .. }, EcdsaJob::Keygen { key_id: b, .. })
                | (
                    EcdsaJob::DklsKeygen { key_id: a, .. },
                    EcdsaJob::DklsKeygen { key_id: b, .. },
                )
                | (
                    EcdsaJob::DklsRefresh { key_id: a }
                    | EcdsaJob::DklsRefreshComplete { key_id: a },
                    EcdsaJob::DklsRefresh { key_id: b }
                    | EcdsaJob::DklsRefreshComplete { key_id: b },
                ) => a == b,
                _ => false,
            }) {
                return Err(CustodyError::BadParameters(
                    "the same setup or key generation is already running".into(),
                ));
            }
            if !self.seen.lock().map_err(|_| lock_err())?.insert(session) {
                return Err(CustodyError::OutOfOrder(
                    "this run id was used before (a run id is used once)".into(),
                ));
            }
            let tx = spawn_run(self.level, eid, self.party, self.n, spec)?;
            let run = Run {
                tx: tx.clone(),
                tag,
                step: 0,
                busy: true,
                parties,
                job: job.clone(),
                last: Instant::now(),
                client,
            };
            let limit = run.step_limit();
            runs.insert(session, run);
            (tx, limit)
        };
        let r = self.drive(&tx, Vec::new(), limit);
        self.idle(&session, 0);
        self.after_step(session, tag, 0, &job, r, identity, members)
    }

    /// Ends run `session` at once (the coordinator gave up on it). Runs of key generation
    /// and auxiliary information only for an administrator.
    /// Ends run `session`, if `may` allows its job to the asking client.
    pub(in crate::custody) fn abort(
        &self,
        session: &[u8; 16],
        may: &dyn Fn(&EcdsaJob) -> Result<(), CustodyError>,
    ) -> Result<(), CustodyError> {
        let mut runs = self.runs.lock().map_err(|_| lock_err())?;
        if let Some(r) = runs.get(session) {
            may(&r.job)?;
            runs.remove(session);
        }
        Ok(())
    }

    /// A new key's name and threshold: a valid name no key has, 2 ≤ t ≤ n.
    fn check_new_key(&self, key_id: &str, t: u16, frost_has: bool) -> Result<(), CustodyError> {
        if !crate::custody::node::valid_key_id(key_id) {
            return Err(CustodyError::BadParameters(format!("key name {key_id:?}")));
        }
        if frost_has || self.has_key(key_id) {
            return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
        }
        if t < 2 || t > self.n {
            return Err(CustodyError::BadParameters(format!(
                "threshold {t} of {}",
                self.n
            )));
        }
        Ok(())
    }

    /// The share a complete refresh of `key_id` starts from: the committed one, or where this
    /// node's committed share is lost (or it never had the key, its disk replaced), the hollow
    /// share a repair left pending.
    fn complete_refresh_share(&self, key_id: &str) -> Result<Arc<EcdsaKey>, CustodyError> {
        // `keys` before `pending`, as everywhere; neither is held when `dkls_key` locks again.
        let hollow = {
            let keys = self.keys.read().map_err(|_| lock_err())?;
            if keys.contains_key(key_id) {
                None
            } else {
                let pending = self.pending.lock().map_err(|_| lock_err())?;
                pending.get(key_id).filter(|p| p.hollow).cloned()
            }
        };
        match hollow {
            Some(p) => Ok(p),
            None => self.dkls_key(key_id),
        }
    }

    /// A committed DKLs23 key.
    pub(super) fn dkls_key(&self, key_id: &str) -> Result<Arc<EcdsaKey>, CustodyError> {
        let k = self.key(key_id)?;
        if k.engine != EcdsaEngine::Dkls23 {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id} is a CGGMP24 key, not a DKLs23 key"
            )));
        }
        Ok(k)
    }

    fn sign_spec(&self, key_id: &str, signers: &[PartyId]) -> Result<SignSpec, CustodyError> {
        let k = self.key(key_id)?;
        if k.engine != EcdsaEngine::Cggmp24 {
            return Err(super::keys::not_cggmp(key_id));
        }
        let mut sorted = signers.to_vec();
        sorted.sort_unstable();
        Ok(SignSpec {
            signers: sorted,
            core: k.core.clone(),
            aux: self.aux()?,
        })
    }

    /// The next step of run `session`. Runs of key generation and auxiliary information
    /// are stepped by administrators only, like they are started.
    pub(in crate::custody) fn step(
        &self,
        session: [u8; 16],
        incoming: Vec<Envelope>,
        may: &dyn Fn(&EcdsaJob) -> Result<(), CustodyError>,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let (tag, step, parties, job, tx, limit) = {
            let mut runs = self.runs.lock().map_err(|_| lock_err())?;
            let run = runs
                .get_mut(&session)
                .ok_or_else(|| CustodyError::OutOfOrder("no ECDSA run with this session".into()))?;
            may(&run.job)?;
            if run.busy {
                return Err(CustodyError::OutOfOrder(
                    "this run is computing a step already".into(),
                ));
            }
            if run.step == u8::MAX {
                return Err(CustodyError::OutOfOrder("run too long".into()));
            }
            // A party banned since the run started: not one more message to it.
            if run.is_dkls() {
                self.check_not_banned(&run.parties)?;
            }
            run.busy = true;
            run.last = Instant::now();
            (
                run.tag,
                run.step,
                run.parties.clone(),
                run.job.clone(),
                run.tx.clone(),
                run.step_limit(),
            )
        };
        let mut msgs = Vec::with_capacity(incoming.len());
        for e in &incoming {
            match self.open_one(e, &tag, step, &parties, identity, members) {
                Ok(m) => msgs.push(m),
                Err(err) => {
                    // Fail closed: a run that saw a bad message ends.
                    self.forget(&session);
                    return Err(err);
                }
            }
        }
        let r = self.drive(&tx, msgs, limit);
        self.idle(&session, step + 1);
        self.after_step(session, tag, step + 1, &job, r, identity, members)
    }

    /// Marks run `session` as done computing, waiting for the messages of step `step`.
    fn idle(&self, session: &[u8; 16], step: u8) {
        if let Ok(mut runs) = self.runs.lock() {
            if let Some(run) = runs.get_mut(session) {
                run.step = step;
                run.busy = false;
                run.last = Instant::now();
            }
        }
    }

    /// Checks and opens one incoming envelope of step `step` of the run tagged `tag`.
    fn open_one(
        &self,
        e: &Envelope,
        tag: &[u8; 16],
        step: u8,
        parties: &[PartyId],
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<WireMsg, CustodyError> {
        if e.from == self.party || !parties.contains(&e.from) {
            return Err(CustodyError::BadParameters(format!(
                "message from party {}, not another party of this run",
                e.from
            )));
        }
        let k = members.get(&e.from).ok_or_else(|| {
            CustodyError::BadParameters(format!("message from unknown party {}", e.from))
        })?;
        // The coordinator checked the sender's signature when it took the envelope from the
        // sender; a signature broken since then was broken on the way, by no party of the run.
        if !e.verify(k) {
            return Err(CustodyError::Inconsistent(format!(
                "the message from party {} does not carry its signature (altered in transit)",
                e.from
            )));
        }
        let body = e.open(tag, step, self.party, k, identity.secret())?;
        Ok(WireMsg {
            from: e.from,
            to: (e.to != EVERYONE).then_some(self.party),
            body,
        })
    }

    fn drive(&self, tx: &mpsc::Sender<Cmd>, msgs: Vec<WireMsg>, limit: Duration) -> StepResult {
        let (rtx, rrx) = mpsc::sync_channel(1);
        tx.send((msgs, rtx))
            .map_err(|_| CustodyError::Ecdsa("the run has ended".into()))?;
        rrx.recv_timeout(limit)
            .map_err(|_| CustodyError::Ecdsa("the run's step did not finish".into()))?
    }

    /// Wraps a step's messages in envelopes and, when the run finished, stores its result.
    #[allow(clippy::too_many_arguments)]
    fn after_step(
        &self,
        session: [u8; 16],
        tag: [u8; 16],
        step: u8,
        job: &EcdsaJob,
        r: StepResult,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let (out, done) = match r {
            Ok(x) => x,
            Err(e) => {
                self.forget(&session);
                // The library proved a party failed an OT check: never run with it again.
                if let CustodyError::Banned { party, .. } = &e {
                    self.ban(*party)?;
                }
                return Err(e);
            }
        };
        let mut envs = Vec::with_capacity(out.len());
        for m in out {
            envs.push(match m.to {
                None => Envelope::broadcast(identity, tag, step, self.party, m.body)?,
                Some(to) => {
                    let k = members
                        .get(&to)
                        .ok_or_else(|| CustodyError::BadParameters(format!("party {to}")))?;
                    Envelope::direct(identity, tag, step, self.party, to, k, &m.body, &mut OsRng)?
                }
            });
        }
        let Some(out) = done else {
            return Ok((envs, None));
        };
        self.forget(&session);
        let done = match (out, job) {
            (Out::Aux(bytes), _) => {
                self.store_aux(bytes)?;
                EcdsaDone::Aux
            }
            (Out::Key(core), EcdsaJob::Keygen { key_id, .. }) => {
                EcdsaDone::Key(self.store_key(key_id, &AnyShare::Cggmp(core), false)?)
            }
            (Out::DklsKey(share), EcdsaJob::DklsKeygen { key_id, .. }) => {
                EcdsaDone::Key(self.store_key(key_id, &AnyShare::Dkls(share), false)?)
            }
            (
                Out::DklsKey(share),
                EcdsaJob::DklsRefresh { key_id } | EcdsaJob::DklsRefreshComplete { key_id },
            ) => {
                let id = self.store_key(key_id, &AnyShare::Dkls(share), true)?;
                let d = florin_custody::wire::refresh_attestation_digest(key_id, &id);
                let sig = florin_crypto::Signer::sign(identity, &d)
                    .map_err(|e| CustodyError::Ecdsa(format!("attestation: {e}")))?;
                EcdsaDone::Refreshed {
                    identity: id,
                    attestation: sig.0.to_vec(),
                }
            }
            (Out::Presig(presig, public), EcdsaJob::Presign { key_id, .. }) => {
                let k = self.key(key_id)?;
                let public = public.to_bytes();
                // Kept durably before it is reported.
                self.store_presig(key_id, &k, &session, &presig, &public)?;
                let mut evicted = Vec::new();
                {
                    let mut store = k.presigs.lock().map_err(|_| lock_err())?;
                    if store
                        .map
                        .insert(session, (*presig, public.clone()))
                        .is_none()
                    {
                        store.order.push_back(session);
                    }
                    while store.order.len() > MAX_PRESIGS {
                        if let Some(old) = store.order.pop_front() {
                            store.map.remove(&old);
                            evicted.push(old);
                        }
                    }
                }
                for old in evicted {
                    // Unused: a file left behind only comes back unused.
                    let _ = self.drop_presig(key_id, &old);
                }
                EcdsaDone::Presig(public)
            }
            (Out::Sig(sig), _) => EcdsaDone::Signature(sig.to_vec()),
            _ => {
                return Err(CustodyError::Ecdsa(
                    "a run ended with another job's result".into(),
                ))
            }
        };
        Ok((envs, Some(done)))
    }

    fn forget(&self, session: &[u8; 16]) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(session);
        }
    }
}

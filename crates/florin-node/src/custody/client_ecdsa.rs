//! The coordinator's ECDSA P-256 side (CGGMP24): it relays protocol runs among the nodes and
//! signs through them as a [`P256Signer`], so a payment provider's custodial wallet pays on the
//! ledger with a threshold key exactly as with a key file (scheme 2).
//!
//! A run is a star: the coordinator starts it at every party, then each step hands every node
//! the envelopes the other parties addressed to it in the previous step, until all report a
//! result. Envelopes are signed by their sender and, when direct, sealed to their recipient,
//! so the coordinator can neither read shares nor forge messages; the nodes check everything.
//!
//! Signing takes a presignature from the signer's pool and asks its t signers for their
//! partial signatures in parallel: one round trip, a few milliseconds. A background thread
//! keeps the pool at its target by running presignature generations (seconds each at the
//! production level), rotating the signer set among the nodes that answer. When the pool is
//! empty, or every pooled presignature involves a node that is down, signing falls back to the
//! interactive protocol with t live nodes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use florin_crypto::p256::{self, P256PublicKey, P256Signature, P256Signer};
use florin_crypto::SignerError;
use florin_custody::dkls::{self, DklsShare};
use florin_custody::ecdsa::{self, CoreShare, Partial, PresigPublic};
use florin_custody::envelope::{Envelope, EVERYONE};
use florin_custody::wire::{EcdsaDone, EcdsaJob, Request, Response};
use florin_custody::{CustodyError, PartyId};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Serialize;
use zeroize::Zeroizing;

use super::client::{refused, unexpected, Kmn, KmnError, Priority};
use super::{AnyShare, EcdsaEngine};

/// Presignatures a signer keeps ready by default.
pub const PRESIG_POOL: usize = 16;
/// Most steps a run may take (CGGMP24's protocols take at most six).
const MAX_STEPS: usize = 32;
/// Longest a node may take for one step of auxiliary-information generation (production
/// primes make its proofs slow) and of the other protocols.
const AUX_STEP_TIMEOUT: Duration = Duration::from_secs(600);
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
const PARTIAL_TIMEOUT: Duration = Duration::from_secs(10);
const ABORT_TIMEOUT: Duration = Duration::from_secs(2);

/// One node's ECDSA state as `status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct EcdsaNodeState {
    /// Security level.
    pub level: String,
    /// Auxiliary information made.
    pub aux_ready: bool,
    /// Primes waiting for the auxiliary-information run.
    pub primes_ready: bool,
    /// Keys: (name, public key hex, presignatures held).
    pub keys: Vec<(String, String, u64)>,
    /// The names among `keys` that are DKLs23 keys.
    pub dkls23: Vec<String>,
    /// Parties this node refuses DKLs23 runs with for good.
    pub banned: Vec<PartyId>,
}

fn fresh_session() -> [u8; 16] {
    let mut s = [0u8; 16];
    OsRng.fill_bytes(&mut s);
    s
}

impl Kmn {
    /// Runs `job` among `parties`, relaying every step, and returns each party's result.
    /// Any refusal ends the run with that node's error (naming a culprit when it proved one).
    pub fn ecdsa_run(
        &self,
        session: [u8; 16],
        parties: &[PartyId],
        job: EcdsaJob,
    ) -> Result<BTreeMap<PartyId, EcdsaDone>, KmnError> {
        self.ecdsa_run_relaying(session, parties, job, &mut |_, _| {})
    }

    /// [`Kmn::ecdsa_run`], with `relay` seeing (and able to change) each step's envelopes
    /// before they are delivered: for fault drills, which play a dishonest relay or sender.
    pub fn ecdsa_run_relaying(
        &self,
        session: [u8; 16],
        parties: &[PartyId],
        job: EcdsaJob,
        relay: &mut dyn FnMut(usize, &mut Vec<Envelope>),
    ) -> Result<BTreeMap<PartyId, EcdsaDone>, KmnError> {
        self.ecdsa_run_as(session, parties, job, relay, Priority::Foreground)
    }

    /// [`Kmn::ecdsa_run`] for work made ahead (pools): it takes at most half of each node's
    /// places for this client and fails at once (`Unavailable`) rather than wait for one.
    pub(crate) fn ecdsa_run_background(
        &self,
        session: [u8; 16],
        parties: &[PartyId],
        job: EcdsaJob,
    ) -> Result<BTreeMap<PartyId, EcdsaDone>, KmnError> {
        self.ecdsa_run_as(session, parties, job, &mut |_, _| {}, Priority::Background)
    }

    fn ecdsa_run_as(
        &self,
        session: [u8; 16],
        parties: &[PartyId],
        job: EcdsaJob,
        relay: &mut dyn FnMut(usize, &mut Vec<Envelope>),
        priority: Priority,
    ) -> Result<BTreeMap<PartyId, EcdsaDone>, KmnError> {
        // No node sees more of this client's runs at once than it takes.
        let _slot = self.runs.enter(parties, STEP_TIMEOUT, priority)?;
        let r = self.relay_run(session, parties, job, relay);
        if r.is_err() {
            // Free the run at every node now rather than when it idles out.
            let reqs = parties
                .iter()
                .map(|&p| (p, Request::EcdsaAbort { session }))
                .collect();
            let _ = self.round(reqs, ABORT_TIMEOUT);
        }
        r
    }

    fn relay_run(
        &self,
        session: [u8; 16],
        parties: &[PartyId],
        job: EcdsaJob,
        relay: &mut dyn FnMut(usize, &mut Vec<Envelope>),
    ) -> Result<BTreeMap<PartyId, EcdsaDone>, KmnError> {
        let timeout = if job == EcdsaJob::Aux {
            AUX_STEP_TIMEOUT
        } else {
            STEP_TIMEOUT
        };
        let mut reqs: Vec<(PartyId, Request)> = parties
            .iter()
            .map(|&p| {
                (
                    p,
                    Request::EcdsaStart {
                        session,
                        job: job.clone(),
                    },
                )
            })
            .collect();
        let mut done: BTreeMap<PartyId, EcdsaDone> = BTreeMap::new();
        for step in 0..MAX_STEPS {
            let mut sent: Vec<Envelope> = Vec::new();
            let mut down = Vec::new();
            for (p, r) in self.round(reqs, timeout) {
                match r {
                    Ok(Response::EcdsaStep { out, done: d }) => {
                        // Taken from p over its authenticated channel: a bad signature here
                        // is p's own (later, it could be anyone's on the way).
                        self.check_signed(p, &out)?;
                        sent.extend(out);
                        if let Some(d) = d {
                            done.insert(p, d);
                        }
                    }
                    Ok(Response::Refused(r)) => return Err(refused(p, r)),
                    Ok(_) => return Err(unexpected(p)),
                    Err(e) => down.push(e),
                }
            }
            if !down.is_empty() {
                return Err(KmnError::Unavailable(format!(
                    "an ECDSA run needs all of parties {parties:?}: {}",
                    down.join("; ")
                )));
            }
            if done.len() == parties.len() {
                return Ok(done);
            }
            relay(step, &mut sent);
            reqs = parties
                .iter()
                .filter(|p| !done.contains_key(p))
                .map(|&p| {
                    let incoming = sent
                        .iter()
                        .filter(|e| e.from != p && (e.to == EVERYONE || e.to == p))
                        .cloned()
                        .collect();
                    (p, Request::EcdsaStep { session, incoming })
                })
                .collect();
        }
        Err(KmnError::Unavailable("the ECDSA run did not finish".into()))
    }

    /// Makes the network's auxiliary information (once per network, all n nodes), waiting
    /// up to `wait` for nodes still generating their primes.
    pub fn ecdsa_setup(&self, wait: Duration) -> Result<(), KmnError> {
        let parties: Vec<PartyId> = self.parties();
        let until = Instant::now() + wait;
        loop {
            let states = self.status();
            let missing: Vec<String> = states
                .iter()
                .filter_map(|s| match &s.ecdsa {
                    Some(e) if e.aux_ready || e.primes_ready => None,
                    Some(_) => Some(format!("node {}: primes still generating", s.party)),
                    None if s.up => Some(format!("node {}: ECDSA not enabled", s.party)),
                    None => Some(format!(
                        "node {}: {}",
                        s.party,
                        s.error.clone().unwrap_or_default()
                    )),
                })
                .collect();
            if states
                .iter()
                .all(|s| s.ecdsa.as_ref().is_some_and(|e| e.aux_ready))
            {
                return Ok(());
            }
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= until {
                return Err(KmnError::Unavailable(missing.join("; ")));
            }
            thread::sleep(Duration::from_millis(200));
        }
        let done = self.ecdsa_run(fresh_session(), &parties, EcdsaJob::Aux)?;
        if done.values().any(|d| *d != EcdsaDone::Aux) {
            return Err(KmnError::Unavailable(
                "auxiliary information: unexpected result".into(),
            ));
        }
        Ok(())
    }

    /// Distributed generation of a t-of-n P-256 key among all n nodes (CGGMP24).
    pub fn ecdsa_keygen(&self, key_id: &str) -> Result<P256PublicKey, KmnError> {
        self.ecdsa_keygen_with(key_id, EcdsaEngine::Cggmp24)
    }

    /// Distributed generation of a t-of-n P-256 key among all n nodes with `engine`.
    pub fn ecdsa_keygen_with(
        &self,
        key_id: &str,
        engine: EcdsaEngine,
    ) -> Result<P256PublicKey, KmnError> {
        let parties = self.parties();
        let (key_id, t) = (key_id.to_string(), self.t());
        let job = match engine {
            EcdsaEngine::Cggmp24 => EcdsaJob::Keygen {
                key_id: key_id.clone(),
                t,
            },
            EcdsaEngine::Dkls23 => EcdsaJob::DklsKeygen {
                key_id: key_id.clone(),
                t,
            },
        };
        let key_id = key_id.as_str();
        let (identity, pk) =
            self.ecdsa_keygen_uncommitted(key_id, job, &parties, Priority::Foreground)?;
        self.commit_everywhere(key_id, &identity)?;
        Ok(pk)
    }

    /// A key made ahead (a key pool): generated with `engine` and left *pending* at every
    /// node, where it signs nothing until [`Kmn::commit_pending`] commits it (after, say, a
    /// customer is bound to it). Returns its public key.
    pub fn ecdsa_keygen_pending(
        &self,
        key_id: &str,
        engine: EcdsaEngine,
    ) -> Result<P256PublicKey, KmnError> {
        let parties = self.parties();
        let (key, t) = (key_id.to_string(), self.t());
        let job = match engine {
            EcdsaEngine::Cggmp24 => EcdsaJob::Keygen { key_id: key, t },
            EcdsaEngine::Dkls23 => EcdsaJob::DklsKeygen { key_id: key, t },
        };
        // A pool's key, made ahead: it gives way to signatures someone waits for.
        Ok(self
            .ecdsa_keygen_uncommitted(key_id, job, &parties, Priority::Background)?
            .1)
    }

    fn ecdsa_keygen_uncommitted(
        &self,
        key_id: &str,
        job: EcdsaJob,
        parties: &[PartyId],
        priority: Priority,
    ) -> Result<(Vec<u8>, P256PublicKey), KmnError> {
        self.refuse_if_committed(key_id)?;
        let done = self.ecdsa_run_as(fresh_session(), parties, job, &mut |_, _| {}, priority)?;
        same_key(done.into_values().map(|d| match d {
            EcdsaDone::Key(k) => Some(k),
            _ => None,
        }))
    }

    /// Key import: splits `secret` (a P-256 scalar, big-endian) into one share per node,
    /// sends each to its node over its encrypted channel, and forgets it. Needs every node.
    pub fn ecdsa_import(&self, key_id: &str, secret: &[u8; 32]) -> Result<P256PublicKey, KmnError> {
        self.ecdsa_import_with(key_id, secret, EcdsaEngine::Cggmp24)
    }

    /// [`Kmn::ecdsa_import`] as a key of `engine`. After a DKLs23 import, refresh it
    /// ([`Kmn::ecdsa_refresh`]: new shares). The dealer also made every pair's OT set-up, which
    /// the fast refresh re-randomizes and only a complete refresh (not built yet) replaces.
    pub fn ecdsa_import_with(
        &self,
        key_id: &str,
        secret: &[u8; 32],
        engine: EcdsaEngine,
    ) -> Result<P256PublicKey, KmnError> {
        let shares: Vec<AnyShare> = match engine {
            EcdsaEngine::Cggmp24 => ecdsa::import(secret, self.t(), self.n(), &mut OsRng)?
                .into_iter()
                .map(AnyShare::Cggmp)
                .collect(),
            EcdsaEngine::Dkls23 => dkls::import(secret, self.t(), self.n())?
                .into_iter()
                .map(|d| AnyShare::Dkls(Box::new(d)))
                .collect(),
        };
        let reqs = shares
            .iter()
            .map(|s| {
                (
                    s.party(),
                    Request::EcdsaImport {
                        key_id: key_id.into(),
                        share: s.to_stored().to_vec(),
                    },
                )
            })
            .collect();
        self.every_node_key(key_id, reqs, "key import")
    }

    /// Key addition (R5): makes `key_id` the sum of the key `from`, which this network holds
    /// (`r1`), and `addend`, a whole P-256 secret key handed over by someone else (`r2`). Every
    /// node adds `r2` to its share of `r1`; the new public key is `R1 + R2`. Whoever handed
    /// over `r2` cannot sign for it, and neither can any t − 1 nodes. `from` is kept. Needs every
    /// node, like an import; administrator only.
    pub fn ecdsa_add_key(
        &self,
        key_id: &str,
        from: &str,
        addend: &[u8; 32],
    ) -> Result<P256PublicKey, KmnError> {
        let reqs = self
            .parties()
            .into_iter()
            .map(|p| {
                (
                    p,
                    Request::EcdsaAddKey {
                        key_id: key_id.into(),
                        from: from.into(),
                        addend: addend.to_vec(),
                    },
                )
            })
            .collect();
        self.every_node_key(key_id, reqs, "key addition")
    }

    /// Sends one request per node (none if a node has `key_id` committed already), expects
    /// every node to answer with the same public key, then commits it everywhere.
    fn every_node_key(
        &self,
        key_id: &str,
        reqs: Vec<(PartyId, Request)>,
        what: &str,
    ) -> Result<P256PublicKey, KmnError> {
        self.refuse_if_committed(key_id)?;
        let mut keys = Vec::new();
        for (p, r) in self.round(reqs, STEP_TIMEOUT) {
            match r {
                Ok(Response::Key(k)) => keys.push(Some(k)),
                Ok(Response::Refused(r)) => return Err(refused(p, r)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => {
                    return Err(KmnError::Unavailable(format!(
                        "{what} needs every node: {e}"
                    )))
                }
            }
        }
        let (identity, pk) = same_key(keys.into_iter())?;
        self.commit_everywhere(key_id, &identity)?;
        Ok(pk)
    }

    /// Key export: rebuilds the secret key from t nodes' shares (administrator only), checked
    /// against the public key.
    pub fn ecdsa_export(&self, key_id: &str) -> Result<Zeroizing<[u8; 32]>, KmnError> {
        let reqs = self
            .parties()
            .into_iter()
            .map(|p| {
                (
                    p,
                    Request::EcdsaExport {
                        key_id: key_id.into(),
                    },
                )
            })
            .collect();
        let mut shares: Vec<AnyShare> = Vec::new();
        let mut errors = Vec::new();
        for (p, r) in self.round(reqs, STEP_TIMEOUT) {
            match r {
                Ok(Response::Exported(b)) => {
                    let s = AnyShare::from_stored(&b)?;
                    if s.party() != p {
                        return Err(unexpected(p));
                    }
                    shares.push(s);
                }
                Ok(Response::Refused(r)) => errors.push(format!("node {p}: {}", r.message)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => errors.push(e),
            }
        }
        if shares.len() < self.t() as usize {
            return Err(KmnError::Unavailable(format!(
                "export needs {} shares, {} nodes gave one: {}",
                self.t(),
                shares.len(),
                errors.join("; ")
            )));
        }
        let mut cggmp: Vec<CoreShare> = Vec::new();
        let mut dkls23: Vec<DklsShare> = Vec::new();
        for s in shares {
            match s {
                AnyShare::Cggmp(c) => cggmp.push(c),
                AnyShare::Dkls(d) => dkls23.push(*d),
            }
        }
        match (cggmp.is_empty(), dkls23.is_empty()) {
            (false, true) => Ok(Zeroizing::new(ecdsa::export(&cggmp)?)),
            (true, false) => Ok(dkls::export(&dkls23)?),
            _ => Err(KmnError::Protocol(CustodyError::Inconsistent(format!(
                "the nodes hold {key_id} under different engines"
            )))),
        }
    }

    /// Proactive refresh of DKLs23 key `key_id` by all n nodes (administrator only): new
    /// shares of the same public key, committed everywhere once every node reports the same
    /// new sharing. Shares from before no longer sign with the new ones.
    pub fn ecdsa_refresh(&self, key_id: &str) -> Result<P256PublicKey, KmnError> {
        self.dkls_refresh(
            key_id,
            EcdsaJob::DklsRefresh {
                key_id: key_id.into(),
            },
        )
    }

    /// Complete refresh of DKLs23 key `key_id` by all n nodes (administrator only): as
    /// [`Kmn::ecdsa_refresh`], but every pair of nodes makes its OT set-up anew (seconds, like
    /// a key generation). Run it after a DKLs23 import (the dealer made the old set-up);
    /// [`Kmn::ecdsa_repair`] runs it itself.
    pub fn ecdsa_refresh_complete(&self, key_id: &str) -> Result<P256PublicKey, KmnError> {
        self.dkls_refresh(
            key_id,
            EcdsaJob::DklsRefreshComplete {
                key_id: key_id.into(),
            },
        )
    }

    /// DKLs23 share repair (administrator only): rebuilds node `target`'s lost share of
    /// `key_id` (its disk lost or replaced, same identity) from t other nodes, without
    /// rebuilding the key. Each helper sends the target a masked term sealed to it; the target
    /// adds them, checks the sum against its public share and stores it *hollow* (no OT
    /// set-up); then all n nodes run a complete refresh, which gives every node new shares
    /// and the target its OT set-up, and commit it. Returns the helpers.
    pub fn ecdsa_repair(&self, key_id: &str, target: PartyId) -> Result<Vec<PartyId>, KmnError> {
        if !self.parties().contains(&target) {
            return Err(KmnError::Config(format!("no node {target}")));
        }
        let pk = self.ecdsa_public_key(key_id)?;
        let t = self.t() as usize;
        let mut helpers: Vec<PartyId> = self
            .status()
            .into_iter()
            .filter(|s| {
                s.up && s.party != target
                    && s.ecdsa
                        .as_ref()
                        .is_some_and(|e| e.dkls23.iter().any(|k| k == key_id))
            })
            .map(|s| s.party)
            .take(t)
            .collect();
        helpers.sort_unstable();
        if helpers.len() < t {
            return Err(KmnError::Unavailable(format!(
                "repair needs {t} nodes holding DKLs23 key {key_id} besides node {target}; {} \
                 answer",
                helpers.len()
            )));
        }
        let session = fresh_session();
        let mut terms = Vec::with_capacity(t);
        let reqs = helpers
            .iter()
            .map(|&p| {
                (
                    p,
                    Request::DklsRepairTerm {
                        session,
                        key_id: key_id.into(),
                        helpers: helpers.clone(),
                        target,
                    },
                )
            })
            .collect();
        for (p, r) in self.round(reqs, STEP_TIMEOUT) {
            match r {
                Ok(Response::Repair(envs)) => {
                    self.check_signed(p, &envs)?;
                    terms.extend(envs);
                }
                Ok(Response::Refused(r)) => return Err(refused(p, r)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => return Err(KmnError::Unavailable(format!("repair: {e}"))),
            }
        }
        let finish = Request::DklsRepairFinish {
            session,
            key_id: key_id.into(),
            helpers: helpers.clone(),
            terms,
        };
        match self.ask(target, finish)? {
            Response::Key(id) if id.get(..33) == Some(&pk.0[..]) => {}
            Response::Key(_) => {
                return Err(KmnError::Protocol(CustodyError::Inconsistent(
                    "the repaired share is of another key".into(),
                )))
            }
            Response::Refused(r) => return Err(refused(target, r)),
            _ => return Err(unexpected(target)),
        }
        self.ecdsa_refresh_complete(key_id)?;
        Ok(helpers)
    }

    /// Runs a DKLs23 refresh job by all n nodes and commits it with every node's attestation.
    fn dkls_refresh(&self, key_id: &str, job: EcdsaJob) -> Result<P256PublicKey, KmnError> {
        let before = self.ecdsa_public_key(key_id)?;
        let done = self.ecdsa_run(fresh_session(), &self.parties(), job)?;
        let mut attestations = Vec::with_capacity(done.len());
        let mut identities = Vec::with_capacity(done.len());
        for (p, d) in done {
            let EcdsaDone::Refreshed {
                identity,
                attestation,
            } = d
            else {
                return Err(unexpected(p));
            };
            identities.push(Some(identity));
            attestations.push((p, attestation));
        }
        let (identity, pk) = same_key(identities.into_iter())?;
        if pk != before {
            return Err(KmnError::Protocol(CustodyError::Inconsistent(
                "the refresh changed the public key".into(),
            )));
        }
        self.commit_refresh(key_id, identity, attestations)?;
        Ok(pk)
    }

    /// Finishes a DKLs23 refresh of `key_id` that was committed at only some nodes (a
    /// coordinator that stopped half-way): every node attests the sharing it would end with
    /// (its pending refresh, else its committed sharing); when all n name the same one, it is
    /// committed everywhere. Returns the public key.
    pub fn ecdsa_finish_refresh(&self, key_id: &str) -> Result<P256PublicKey, KmnError> {
        let reqs = self
            .parties()
            .into_iter()
            .map(|p| {
                (
                    p,
                    Request::AttestRefresh {
                        key_id: key_id.into(),
                    },
                )
            })
            .collect();
        let mut identities = Vec::new();
        let mut attestations = Vec::new();
        for (p, r) in self.round(reqs, STEP_TIMEOUT) {
            match r {
                Ok(Response::Attested {
                    identity,
                    attestation,
                }) => {
                    identities.push(Some(identity));
                    attestations.push((p, attestation));
                }
                Ok(Response::Refused(r)) => return Err(refused(p, r)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => {
                    return Err(KmnError::Unavailable(format!(
                        "finishing a refresh needs every node: {e}"
                    )))
                }
            }
        }
        let (identity, pk) = same_key(identities.into_iter())?;
        self.commit_refresh(key_id, identity, attestations)?;
        Ok(pk)
    }

    /// Sends `CommitRefresh` with every node's attestation to every node.
    fn commit_refresh(
        &self,
        key_id: &str,
        identity: Vec<u8>,
        attestations: Vec<(PartyId, Vec<u8>)>,
    ) -> Result<(), KmnError> {
        // Every node holds the new sharing and said so (signed); each node checks every
        // attestation before it replaces its committed share.
        let req = Request::CommitRefresh {
            key_id: key_id.into(),
            identity: identity.clone(),
            attestations,
        };
        let mut errors = Vec::new();
        for (p, r) in self.round(
            self.parties()
                .into_iter()
                .map(|p| (p, req.clone()))
                .collect(),
            STEP_TIMEOUT,
        ) {
            match r {
                Ok(Response::Key(k)) if k == identity => {}
                Ok(Response::Refused(r)) => errors.push(format!("node {p}: {}", r.message)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => errors.push(format!("node {p}: {e}")),
            }
        }
        if !errors.is_empty() {
            return Err(KmnError::Unavailable(format!(
                "refresh of {key_id} made but not committed everywhere (the nodes keep it \
                 pending; `florin custody refresh {key_id} --finish` commits it): {}",
                errors.join("; ")
            )));
        }
        Ok(())
    }

    /// The engine of ECDSA key `key_id`, as at least t nodes report it.
    pub fn ecdsa_engine(&self, key_id: &str) -> Result<EcdsaEngine, KmnError> {
        let mut dkls = 0usize;
        let mut cggmp = 0usize;
        for s in self.status() {
            if let Some(e) = s.ecdsa {
                if e.dkls23.iter().any(|k| k == key_id) {
                    dkls += 1;
                } else if e.keys.iter().any(|(k, _, _)| k == key_id) {
                    cggmp += 1;
                }
            }
        }
        let t = self.t() as usize;
        if dkls >= t {
            Ok(EcdsaEngine::Dkls23)
        } else if cggmp >= t {
            Ok(EcdsaEngine::Cggmp24)
        } else {
            Err(KmnError::Unavailable(format!(
                "fewer than {t} nodes report ECDSA key {key_id}"
            )))
        }
    }

    /// The public key of ECDSA key `key_id`, as at least t nodes report it.
    pub fn ecdsa_public_key(&self, key_id: &str) -> Result<P256PublicKey, KmnError> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut errors = Vec::new();
        for s in self.status() {
            match s.ecdsa {
                Some(e) => {
                    if let Some((_, pk, _)) = e.keys.iter().find(|(k, _, _)| k == key_id) {
                        *seen.entry(pk.clone()).or_default() += 1;
                    }
                }
                None => errors.push(format!(
                    "node {}: {}",
                    s.party,
                    s.error.unwrap_or_else(|| "ECDSA not enabled".into())
                )),
            }
        }
        match seen.into_iter().max_by_key(|(_, c)| *c) {
            Some((pk, c)) if c >= self.t() as usize => {
                let b = hex::decode(pk).map_err(|_| CustodyError::malformed("public key"))?;
                P256PublicKey::from_sec1(&b)
                    .map_err(|_| KmnError::Protocol(CustodyError::malformed("public key")))
            }
            Some((_, c)) => Err(KmnError::Unavailable(format!(
                "only {c} node(s) report ECDSA key {key_id}, {} needed; {}",
                self.t(),
                errors.join("; ")
            ))),
            None => Err(KmnError::Config(format!(
                "the network holds no ECDSA key {key_id} {}",
                errors.join("; ")
            ))),
        }
    }

    /// A threshold P-256 signer for `key_id` keeping `pool` presignatures ready (0: always
    /// interactive).
    pub fn ecdsa_signer(
        self: &Arc<Self>,
        key_id: &str,
        pool: usize,
    ) -> Result<EcdsaSigner, KmnError> {
        let public = self.ecdsa_public_key(key_id)?;
        let engine = self.ecdsa_engine(key_id)?;
        let s = EcdsaSigner::new(self.clone(), key_id, public, engine, pool);
        if engine == EcdsaEngine::Cggmp24 && pool > 0 {
            // The nodes keep unused presignatures across restarts (theirs and this
            // coordinator's): take them back into the pool.
            s.inner.adopt();
        }
        Ok(s)
    }
}

impl Kmn {
    /// A DKLs23 signer for `key_id` whose public key the caller already holds (it made the
    /// key, e.g. with [`Kmn::ecdsa_add_key`]): no lookup round at the nodes. The caller must
    /// pass the key's true public key and a DKLs23 key: with a wrong one every signature is
    /// refused as not verifying, blaming an honest node, and a CGGMP24 key's runs are refused
    /// (use [`Kmn::ecdsa_signer`] when unsure).
    pub fn dkls_signer(self: &Arc<Self>, key_id: &str, public: P256PublicKey) -> EcdsaSigner {
        EcdsaSigner::new(self.clone(), key_id, public, EcdsaEngine::Dkls23, 0)
    }
}

/// Every node must report the same key.
/// Every node's answer must be the same sharing identity ([`CoreShare::identity`]: the
/// public key and a digest of every public share), not just the same public key: two splits
/// of one key must never be committed together. Returns the identity and the public key.
fn same_key(
    keys: impl Iterator<Item = Option<Vec<u8>>>,
) -> Result<(Vec<u8>, P256PublicKey), KmnError> {
    let mut first: Option<Vec<u8>> = None;
    for k in keys {
        let Some(k) = k else {
            return Err(KmnError::Unavailable("a node reported no key".into()));
        };
        match &first {
            None => first = Some(k),
            Some(f) if *f == k => {}
            Some(_) => {
                return Err(KmnError::Protocol(CustodyError::Inconsistent(
                    "the nodes report different keys (or different splits of one key)".into(),
                )))
            }
        }
    }
    let k = first.ok_or_else(|| KmnError::Unavailable("no node answered".into()))?;
    let pk = ecdsa::identity_public_key(&k)
        .and_then(|pk| P256PublicKey::from_sec1(&pk).ok())
        .ok_or_else(|| KmnError::Protocol(CustodyError::malformed("public key")))?;
    Ok((k, pk))
}

struct Pooled {
    id: [u8; 16],
    public: PresigPublic,
}

/// Counters of an [`EcdsaSigner`].
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct EcdsaSignerStats {
    /// Signatures from a presignature.
    pub from_presig: u64,
    /// Signatures by the interactive fallback.
    pub interactive: u64,
    /// Presignatures made.
    pub presigs_made: u64,
    /// Presignatures thrown away (a signer down or restarted).
    pub presigs_wasted: u64,
}

impl EcdsaSigner {
    /// The background refill's last error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.inner.last_error.lock().ok().and_then(|e| e.clone())
    }
}

struct SignerInner {
    kmn: Arc<Kmn>,
    key_id: String,
    public: P256PublicKey,
    engine: EcdsaEngine,
    pool: Mutex<VecDeque<Pooled>>,
    target: usize,
    rotate: AtomicUsize,
    stop: AtomicBool,
    from_presig: AtomicU64,
    interactive: AtomicU64,
    made: AtomicU64,
    wasted: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// Signs with a threshold P-256 key held by the network (see the module docs).
pub struct EcdsaSigner {
    inner: Arc<SignerInner>,
}

impl EcdsaSigner {
    fn new(
        kmn: Arc<Kmn>,
        key_id: &str,
        public: P256PublicKey,
        engine: EcdsaEngine,
        target: usize,
    ) -> EcdsaSigner {
        // DKLs23 has no presignatures: every signature is a three-round run.
        let target = if engine == EcdsaEngine::Dkls23 {
            0
        } else {
            target
        };
        let inner = Arc::new(SignerInner {
            kmn,
            key_id: key_id.into(),
            public,
            engine,
            pool: Mutex::new(VecDeque::new()),
            target,
            rotate: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            from_presig: AtomicU64::new(0),
            interactive: AtomicU64::new(0),
            made: AtomicU64::new(0),
            wasted: AtomicU64::new(0),
            last_error: Mutex::new(None),
        });
        crate::obs::count_presignatures(Arc::downgrade(&inner), |i: &SignerInner| {
            i.pool.lock().map(|p| p.len()).unwrap_or(0)
        });
        if target > 0 {
            let weak = Arc::downgrade(&inner);
            let _ = thread::Builder::new()
                .name("ecdsa-presign".into())
                .spawn(move || refill_loop(weak));
        }
        EcdsaSigner { inner }
    }

    /// The key's engine.
    pub fn engine(&self) -> EcdsaEngine {
        self.inner.engine
    }

    /// Presignatures ready.
    pub fn ready(&self) -> usize {
        self.inner.pool.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Counters.
    pub fn stats(&self) -> EcdsaSignerStats {
        let i = &self.inner;
        EcdsaSignerStats {
            from_presig: i.from_presig.load(Ordering::Relaxed),
            interactive: i.interactive.load(Ordering::Relaxed),
            presigs_made: i.made.load(Ordering::Relaxed),
            presigs_wasted: i.wasted.load(Ordering::Relaxed),
        }
    }

    /// Waits until `n` presignatures are ready or `timeout` passes; returns how many are.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> usize {
        let until = Instant::now() + timeout;
        loop {
            let r = self.ready();
            if r >= n || Instant::now() >= until {
                return r;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Makes one presignature now (what the background refill does), with t nodes that
    /// answer.
    pub fn presign(&self) -> Result<(), KmnError> {
        self.inner.presign_one(false)
    }

    /// Signs `msg` (ECDSA-P256-SHA256, low-S).
    pub fn sign_msg(&self, msg: &[u8]) -> Result<P256Signature, KmnError> {
        crate::obs::time_signature(self.inner.engine.name(), || self.inner.sign(msg))
    }

    /// The public key of the note `key + tweak·G` (DKLs23 keys sign as it, see
    /// `Authorization::tweak`).
    pub fn note_public(&self, tweak: &[u8; 32]) -> Result<P256PublicKey, KmnError> {
        Ok(P256PublicKey(
            florin_custody::dkls::tweak_public(&self.inner.public.0, tweak)
                .map_err(KmnError::Protocol)?,
        ))
    }

    /// Signs the txid `msg` with a key bound to a customer: always from a presignature (one
    /// is made now if the pool is empty), each signer checking the transaction and the
    /// customer's authorization before it uses its half (`KmnError::Unauthorized` when it
    /// does not hold).
    pub fn sign_authorized(
        &self,
        msg: &[u8],
        authz: &florin_custody::authz::Authorization,
    ) -> Result<P256Signature, KmnError> {
        crate::obs::time_signature(self.inner.engine.name(), || {
            self.inner.sign_authorized(msg, authz)
        })
    }
}

impl Drop for EcdsaSigner {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
    }
}

impl P256Signer for EcdsaSigner {
    fn public_key(&self) -> P256PublicKey {
        self.inner.public
    }

    fn sign(&self, msg: &[u8]) -> Result<P256Signature, SignerError> {
        self.sign_msg(msg)
            .map_err(|e| SignerError::Unavailable(e.to_string()))
    }
}

fn refill_loop(weak: Weak<SignerInner>) {
    let mut failures = 0u32;
    loop {
        let Some(s) = weak.upgrade() else { return };
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        let ready = s.pool.lock().map(|p| p.len()).unwrap_or(usize::MAX);
        if ready >= s.target {
            drop(s);
            thread::sleep(Duration::from_millis(20));
            continue;
        }
        match s.presign_one(true) {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = (failures + 1).min(5);
                let refused = matches!(e, KmnError::Refused { .. } | KmnError::Protocol(_));
                if let Ok(mut last) = s.last_error.lock() {
                    *last = Some(e.to_string());
                }
                drop(s);
                // Back off while too few nodes answer (100 ms doubling up to 3.2 s), and for
                // 30 s after a refusal, which retrying at once would not change.
                thread::sleep(if refused {
                    Duration::from_secs(30)
                } else {
                    Duration::from_millis(100 << failures)
                });
            }
        }
    }
}

impl SignerInner {
    /// Takes into the pool the presignatures the nodes still hold unused: each one that
    /// every one of its signers reports, with the same public half. A presignature another
    /// coordinator also took is used by whichever asks first; the other's partial is refused
    /// (`stale`) and it moves on, since a node deletes one before it signs with it.
    fn adopt(&self) {
        // By (session, public half): one node reporting another public half for a session
        // neither blocks nor joins the others' reports.
        let mut seen: BTreeMap<([u8; 16], Vec<u8>), Vec<PartyId>> = BTreeMap::new();
        for p in self.kmn.live_parties() {
            let Ok(Response::Presigs(list)) = self.kmn.ask(
                p,
                Request::EcdsaPresigs {
                    key_id: self.key_id.clone(),
                },
            ) else {
                continue;
            };
            for (id, public) in list {
                seen.entry((id, public)).or_default().push(p);
            }
        }
        let Ok(mut pool) = self.pool.lock() else {
            return;
        };
        let (t, n) = (self.kmn.t() as usize, self.kmn.n());
        for ((id, public), holders) in seen {
            let Ok(public) = PresigPublic::from_bytes(&public) else {
                continue;
            };
            // Exactly t signers of this network, every one of them holding it.
            if public.signers.len() == t
                && public
                    .signers
                    .iter()
                    .all(|s| (1..=n).contains(s) && holders.contains(s))
                && !pool.iter().any(|x| x.id == id)
            {
                pool.push_back(Pooled { id, public });
            }
        }
    }

    /// t nodes not known to be down, rotating so the work spreads over all n.
    fn choose(&self) -> Result<Vec<PartyId>, KmnError> {
        let live = self.kmn.live_parties();
        let t = self.kmn.t() as usize;
        if live.len() < t {
            return Err(KmnError::Unavailable(format!(
                "{} of {} nodes answer, {t} needed to sign",
                live.len(),
                self.kmn.n()
            )));
        }
        let start = self.rotate.fetch_add(1, Ordering::Relaxed) % live.len();
        let mut set: Vec<PartyId> = (0..t).map(|k| live[(start + k) % live.len()]).collect();
        set.sort_unstable();
        Ok(set)
    }

    /// One presignature into the pool: `background` for the refill loop (it gives way to
    /// signatures someone waits for), foreground when a signature needs it now.
    fn presign_one(&self, background: bool) -> Result<(), KmnError> {
        let signers = self.choose()?;
        let session = fresh_session();
        let job = EcdsaJob::Presign {
            key_id: self.key_id.clone(),
            signers: signers.clone(),
        };
        let done = if background {
            self.kmn.ecdsa_run_background(session, &signers, job)?
        } else {
            self.kmn.ecdsa_run(session, &signers, job)?
        };
        let mut public: Option<Vec<u8>> = None;
        for (p, d) in done {
            let EcdsaDone::Presig(b) = d else {
                return Err(unexpected(p));
            };
            match &public {
                None => public = Some(b),
                Some(x) if *x == b => {}
                Some(_) => {
                    return Err(KmnError::Protocol(CustodyError::Inconsistent(
                        "signers report different presignature commitments".into(),
                    )))
                }
            }
        }
        let public = PresigPublic::from_bytes(&public.unwrap_or_default())?;
        if public.signers != signers {
            return Err(KmnError::Protocol(CustodyError::Inconsistent(
                "presignature for another signer set".into(),
            )));
        }
        self.pool
            .lock()
            .map_err(|_| KmnError::Unavailable("lock".into()))?
            .push_back(Pooled {
                id: session,
                public,
            });
        self.made.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The next pooled presignature whose signers are all up; those with a down signer are
    /// dropped (their other halves may be gone with a restart anyway).
    fn take(&self) -> Option<Pooled> {
        let mut pool = self.pool.lock().ok()?;
        while let Some(p) = pool.pop_front() {
            if p.public.signers.iter().all(|&s| self.kmn.is_up(s)) {
                return Some(p);
            }
            self.wasted.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    fn sign(&self, msg: &[u8]) -> Result<P256Signature, KmnError> {
        if self.engine == EcdsaEngine::Dkls23 {
            return self.sign_interactive(msg, None);
        }
        // A presignature whose signer failed is spent at the others: try a few, then fall
        // back to interactive signing.
        for _ in 0..4 {
            let Some(p) = self.take() else { break };
            match self.sign_with(&p, msg) {
                Ok(sig) => {
                    self.from_presig.fetch_add(1, Ordering::Relaxed);
                    return Ok(sig);
                }
                Err(Retry::Next) => {
                    self.wasted.fetch_add(1, Ordering::Relaxed);
                }
                Err(Retry::Blame(p, e)) => {
                    // Leave the node out for a while; the others still sign.
                    self.kmn.suspect(p);
                    self.wasted.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut last) = self.last_error.lock() {
                        *last = Some(e.to_string());
                    }
                }
                Err(Retry::Fail(e)) => return Err(e),
            }
        }
        self.sign_interactive(msg, None)
    }

    fn sign_authorized(
        &self,
        msg: &[u8],
        authz: &florin_custody::authz::Authorization,
    ) -> Result<P256Signature, KmnError> {
        if self.engine == EcdsaEngine::Dkls23 {
            return self.sign_interactive(msg, Some(authz));
        }
        let mut last = None;
        for attempt in 0..8u32 {
            if attempt > 0 && last.is_some() {
                // Nodes that failed are skipped for a while (`DOWN_FOR`): wait that out
                // rather than spend every attempt at once.
                thread::sleep(Duration::from_millis(250 << attempt.min(3)));
            }
            let p = match self.take() {
                Some(p) => p,
                None => {
                    if let Err(e) = self.presign_one(false) {
                        last = Some(e);
                        continue;
                    }
                    match self.take() {
                        Some(p) => p,
                        None => continue,
                    }
                }
            };
            match self.sign_with_authz(&p, msg, Some(authz)) {
                Ok(sig) => {
                    self.from_presig.fetch_add(1, Ordering::Relaxed);
                    return Ok(sig);
                }
                Err(Retry::Next) => {
                    self.wasted.fetch_add(1, Ordering::Relaxed);
                }
                Err(Retry::Blame(party, e)) => {
                    self.kmn.suspect(party);
                    self.wasted.fetch_add(1, Ordering::Relaxed);
                    last = Some(e);
                }
                Err(Retry::Fail(e)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| KmnError::Unavailable("no presignature could sign".into())))
    }

    fn sign_with(&self, p: &Pooled, msg: &[u8]) -> Result<P256Signature, Retry> {
        self.sign_with_authz(p, msg, None)
    }

    fn sign_with_authz(
        &self,
        p: &Pooled,
        msg: &[u8],
        authz: Option<&florin_custody::authz::Authorization>,
    ) -> Result<P256Signature, Retry> {
        let reqs = p
            .public
            .signers
            .iter()
            .map(|&s| {
                let req = match authz {
                    None => Request::EcdsaPartial {
                        key_id: self.key_id.clone(),
                        presig: p.id,
                        message: msg.to_vec(),
                    },
                    Some(a) => Request::EcdsaPartialAuthorized {
                        key_id: self.key_id.clone(),
                        presig: p.id,
                        message: msg.to_vec(),
                        authz: a.clone(),
                    },
                };
                (s, req)
            })
            .collect();
        let mut partials = Vec::with_capacity(p.public.signers.len());
        for (s, r) in self.kmn.round(reqs, PARTIAL_TIMEOUT) {
            match r {
                Ok(Response::EcdsaPartial(b)) => {
                    let part = Partial::from_bytes(&b).map_err(|_| {
                        Retry::Blame(
                            s,
                            KmnError::Protocol(CustodyError::Misbehaved {
                                party: s,
                                reason: "sent a malformed partial signature".into(),
                            }),
                        )
                    })?;
                    // The channel authenticated the node: it must sign in its own name.
                    if part.party != s {
                        return Err(Retry::Blame(
                            s,
                            KmnError::Protocol(CustodyError::Misbehaved {
                                party: s,
                                reason: "sent a partial signature in another party's name".into(),
                            }),
                        ));
                    }
                    partials.push(part);
                }
                // A restarted node lost its presignatures; a down node is skipped next time.
                Ok(Response::Refused(r)) if r.stale_nonce => return Err(Retry::Next),
                // The customer's authorization does not hold: no other presignature helps.
                Ok(Response::Refused(r)) if r.unauthorized.is_some() => {
                    return Err(Retry::Fail(refused(s, r)))
                }
                Ok(Response::Refused(r)) => return Err(Retry::Blame(s, refused(s, r))),
                Ok(_) => return Err(Retry::Blame(s, unexpected(s))),
                Err(_) => return Err(Retry::Next),
            }
        }
        let sig =
            ecdsa::combine(&p.public, &partials, msg, &self.public.0).map_err(|e| match e {
                CustodyError::Misbehaved { party, .. } => {
                    Retry::Blame(party, KmnError::Protocol(e))
                }
                e => Retry::Fail(KmnError::Protocol(e)),
            })?;
        let sig = P256Signature(sig);
        p256::verify(&self.public, msg, &sig)
            .map_err(|e| Retry::Fail(KmnError::Unavailable(format!("signature: {e}"))))?;
        Ok(sig)
    }

    /// Interactive signing (CGGMP24's fallback, DKLs23's only way), with the customer's
    /// authorization for a DKLs23 key bound to one.
    fn sign_interactive(
        &self,
        msg: &[u8],
        authz: Option<&florin_custody::authz::Authorization>,
    ) -> Result<P256Signature, KmnError> {
        let mut last = None;
        // A node that fails mid-run is marked down; one more try picks t others.
        for _ in 0..2 {
            let signers = self.choose()?;
            let job = match self.engine {
                EcdsaEngine::Cggmp24 => EcdsaJob::Sign {
                    key_id: self.key_id.clone(),
                    signers: signers.clone(),
                    message: msg.to_vec(),
                },
                EcdsaEngine::Dkls23 => EcdsaJob::DklsSign {
                    key_id: self.key_id.clone(),
                    signers: signers.clone(),
                    message: msg.to_vec(),
                    authz: authz.cloned(),
                },
            };
            match self.kmn.ecdsa_run(fresh_session(), &signers, job) {
                Ok(done) => {
                    let Some((p, EcdsaDone::Signature(b))) = done.into_iter().next() else {
                        return Err(KmnError::Unavailable("no signature".into()));
                    };
                    let b: [u8; 64] = b.try_into().map_err(|_| unexpected(p))?;
                    let sig = P256Signature(b);
                    // A note key's signature verifies under the note key.
                    let public = match authz.and_then(|a| a.tweak) {
                        Some(t) => P256PublicKey(
                            florin_custody::dkls::tweak_public(&self.public.0, &t)
                                .map_err(KmnError::Protocol)?,
                        ),
                        None => self.public,
                    };
                    p256::verify(&public, msg, &sig).map_err(|e| {
                        KmnError::Protocol(CustodyError::Misbehaved {
                            party: p,
                            reason: format!("reported a signature that does not verify: {e}"),
                        })
                    })?;
                    self.interactive.fetch_add(1, Ordering::Relaxed);
                    return Ok(sig);
                }
                // The customer's authorization does not hold: other signers will not differ.
                Err(e @ KmnError::Unauthorized { .. }) => return Err(e),
                Err(e @ KmnError::Unavailable(_)) => last = Some(e),
                Err(KmnError::Refused {
                    party,
                    message,
                    culprit,
                }) => {
                    // Leave out the node the refusal points at, then try t others.
                    self.kmn.suspect(culprit.unwrap_or(party));
                    last = Some(KmnError::Refused {
                        party,
                        message,
                        culprit,
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| KmnError::Unavailable("interactive signing failed".into())))
    }
}

enum Retry {
    /// Spend no more effort on this presignature; try the next.
    Next,
    /// This node failed where the others did not: leave it out for a while, try the next.
    Blame(PartyId, KmnError),
    /// A real failure.
    Fail(KmnError),
}

//! The coordinator's side of the key-management network: it relays key generation among the
//! nodes, and signs through them as a [`Signer`], so the issuer, the authority or a payment
//! provider use a threshold key exactly as they use a key file.
//!
//! Signing is one round trip to t nodes in parallel: nonce commitments are fetched ahead, in
//! batches of [`COMMIT_BATCH`], and the chosen nodes rotate so the load spreads over all n.
//! A node that does not answer is skipped (and retried after [`DOWN_FOR`]); a node whose
//! share is bad is named and left out; with fewer than t nodes answering, signing fails at
//! once with the list of what each node said.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use florin_crypto::{LocalSigner, PublicKey, Signature, Signer, SignerError};
use florin_custody::envelope::Envelope;
use florin_custody::frost::{self, GroupKey, KeyShare, SigningPackage};
use florin_custody::wire::{self, Request, Response, MAX_WIRE};
use florin_custody::{CustodyError, PartyId};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use zeroize::Zeroizing;

use super::client_ecdsa::EcdsaNodeState;
use super::node::Member;

mod link;
mod signer;

use link::*;
pub use signer::ThresholdSigner;
use signer::*;

/// Most nonce commitments fetched from a node at a time; a key's batch starts at
/// [`COMMIT_BATCH_START`] and doubles with each fetch.
pub const COMMIT_BATCH: u32 = 512;
/// A key's first batch of commitments per node.
pub const COMMIT_BATCH_START: u32 = 16;
/// How long a node that failed is skipped.
pub const DOWN_FOR: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const SIGN_TIMEOUT: Duration = Duration::from_secs(10);
const DKG_TIMEOUT: Duration = Duration::from_secs(120);
/// Idle connections kept per node.
const MAX_IDLE: usize = 64;

/// The network as a coordinator sees it (`network.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkConfig {
    /// Threshold for keys made on this network.
    pub t: u16,
    /// The nodes.
    pub members: Vec<Member>,
}

impl NetworkConfig {
    /// Reads a `network.json`.
    pub fn load(path: &Path) -> Result<Self, KmnError> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| KmnError::Config(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&s).map_err(|e| KmnError::Config(format!("{}: {e}", path.display())))
    }
}

/// Why the network could not do what was asked.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KmnError {
    /// Too few nodes answered.
    #[error("{0}")]
    Unavailable(String),
    /// A node refused; `culprit` is a party it proved misbehaved.
    #[error("node {party} refused: {message}")]
    Refused {
        /// The node that refused.
        party: PartyId,
        /// Its reason.
        message: String,
        /// The party it blames, if any.
        culprit: Option<PartyId>,
    },
    /// Protocol data was invalid; a culprit is named in it when one is known.
    #[error(transparent)]
    Protocol(#[from] CustodyError),
    /// The configuration is unusable.
    #[error("config: {0}")]
    Config(String),
    /// A node refused to sign with a customer's key: the customer's authorization was
    /// missing or did not hold (no share was released).
    #[error("node {party} refused: the customer's authorization: {reason}")]
    Unauthorized {
        /// The node that refused.
        party: PartyId,
        /// Why.
        reason: florin_custody::authz::AuthzError,
    },
}

/// A coordinator's handle on the network.
pub struct Kmn {
    t: u16,
    links: Vec<Link>,
    /// ECDSA runs of this client in progress (see [`RunGate`]).
    pub(super) runs: RunGate,
}

/// Each node takes at most [`super::MAX_RUNS_PER_CLIENT`] ECDSA runs of one client at once
/// (and 64 in all) and refuses more as busy: not a fault. The client keeps to that quota per
/// node itself, so that a provider with more signatures to make (hundreds of customers paying)
/// queues them here instead of being refused. Runs are counted per node: a node that hangs
/// holds only its own places, and runs among the other nodes go on. Background work (pools
/// filled ahead) takes at most half of a node's places and never waits for one.
pub(super) struct RunGate {
    busy: Mutex<HashMap<PartyId, usize>>,
    free: std::sync::Condvar,
}

/// Whether a run is asked for now or made ahead.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Priority {
    /// Someone waits for it: it waits for places.
    Foreground,
    /// A pool made ahead: at most half the places, and no waiting.
    Background,
}

/// A run's places at the gate, given back when dropped.
pub(super) struct RunSlot<'a> {
    gate: &'a RunGate,
    parties: Vec<PartyId>,
}

impl RunGate {
    fn new() -> RunGate {
        RunGate {
            busy: Mutex::new(HashMap::new()),
            free: std::sync::Condvar::new(),
        }
    }

    /// A place at every one of `parties`, waiting up to `wait` for them (foreground work).
    pub(super) fn enter(
        &self,
        parties: &[PartyId],
        wait: Duration,
        priority: Priority,
    ) -> Result<RunSlot<'_>, KmnError> {
        let limit = match priority {
            Priority::Foreground => super::MAX_RUNS_PER_CLIENT,
            Priority::Background => super::MAX_RUNS_PER_CLIENT / 2,
        };
        let deadline = Instant::now() + wait;
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        loop {
            let full = parties
                .iter()
                .find(|p| busy.get(p).copied().unwrap_or(0) >= limit);
            let Some(&full) = full else { break };
            let left = deadline.saturating_duration_since(Instant::now());
            if priority == Priority::Background || left.is_zero() {
                return Err(KmnError::Unavailable(format!(
                    "node {full} has {} of this client's ECDSA runs in progress{}",
                    busy.get(&full).copied().unwrap_or(0),
                    if priority == Priority::Background {
                        " (background work waits for a quieter time)"
                    } else {
                        ", and none ended in time"
                    }
                )));
            }
            busy = self
                .free
                .wait_timeout(busy, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        for p in parties {
            *busy.entry(*p).or_insert(0) += 1;
        }
        Ok(RunSlot {
            gate: self,
            parties: parties.to_vec(),
        })
    }
}

impl Drop for RunSlot<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .gate
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for p in &self.parties {
            if let Some(n) = busy.get_mut(p) {
                *n = n.saturating_sub(1);
            }
        }
        drop(busy);
        // Runs waiting on other nodes may now fit: every waiter looks again.
        self.gate.free.notify_all();
    }
}

/// One node as `status` saw it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeState {
    /// Party number.
    pub party: PartyId,
    /// Address.
    pub addr: SocketAddr,
    /// Identity key.
    pub key: String,
    /// Whether it answered.
    pub up: bool,
    /// Why not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Keys it holds: (name, public key).
    pub keys: Vec<(String, String)>,
    /// FROST nonces it has ready (one pool for all its keys).
    pub nonces_ready: u64,
    /// Its ECDSA state, when it runs ECDSA.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ecdsa: Option<EcdsaNodeState>,
    /// Keys stored but not committed (they sign nothing): (name, scheme, public key).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<(String, String, String)>,
}

/// The public key in an ECDSA key's identity, for display.
pub(super) fn public_part(identity: &[u8]) -> &[u8] {
    identity.get(..33).unwrap_or(identity)
}

pub(super) fn refused(party: PartyId, r: wire::Refusal) -> KmnError {
    if let Some(reason) = r.unauthorized {
        return KmnError::Unauthorized { party, reason };
    }
    if r.busy {
        // Not a fault: the caller tries again or asks other nodes, without suspecting this one.
        return KmnError::Unavailable(format!("node {party}: {}", r.message));
    }
    KmnError::Refused {
        party,
        message: r.message,
        culprit: r.culprit,
    }
}

pub(super) fn unexpected(party: PartyId) -> KmnError {
    KmnError::Unavailable(format!("node {party} answered out of protocol"))
}

impl Kmn {
    /// A handle on `net`, authenticating as `me` (a key the nodes list as client or admin).
    pub fn new(net: &NetworkConfig, me: LocalSigner) -> Result<Arc<Kmn>, KmnError> {
        let me = Arc::new(me);
        let mut links = Vec::with_capacity(net.members.len());
        for m in &net.members {
            let key = PublicKey::parse(&m.key)
                .map_err(|e| KmnError::Config(format!("member {}: {e}", m.party)))?;
            links.push(Link::new(m.party, m.addr, key, me.clone()));
        }
        links.sort_by_key(|l| l.party);
        if net.t < 2 || net.t as usize > links.len() {
            return Err(KmnError::Config(format!(
                "threshold {} of {} nodes",
                net.t,
                links.len()
            )));
        }
        Ok(Arc::new(Kmn {
            t: net.t,
            links,
            runs: RunGate::new(),
        }))
    }

    /// Nodes in the network.
    pub fn n(&self) -> u16 {
        self.links.len() as u16
    }

    /// Threshold.
    pub fn t(&self) -> u16 {
        self.t
    }

    fn link(&self, party: PartyId) -> Option<&Link> {
        self.links.iter().find(|l| l.party == party)
    }

    /// Every party, in order.
    pub fn parties(&self) -> Vec<PartyId> {
        self.links.iter().map(|l| l.party).collect()
    }

    /// Parties not skipped for a recent failure, in order.
    pub fn live_parties(&self) -> Vec<PartyId> {
        self.links
            .iter()
            .filter(|l| !l.is_down())
            .map(|l| l.party)
            .collect()
    }

    /// Skips party `p` for a while (it refused or misbehaved while others did not).
    pub fn suspect(&self, p: PartyId) {
        if let Some(l) = self.link(p) {
            l.mark_down();
        }
    }

    /// Party `p`'s identity key.
    pub(super) fn member_key(&self, p: PartyId) -> Option<&PublicKey> {
        self.link(p).map(|l| &l.key)
    }

    /// Checks that every envelope party `p` just sent over its authenticated channel is in
    /// its own name and carries its signature: a bad one here is `p`'s own doing, so `p` is
    /// named. (Nodes that later find a broken signature know it broke on the way.)
    pub(super) fn check_signed(&self, p: PartyId, envs: &[Envelope]) -> Result<(), KmnError> {
        let key = self.member_key(p).ok_or_else(|| unexpected(p))?;
        if let Some(e) = envs.iter().find(|e| e.from != p || !e.verify(key)) {
            return Err(KmnError::Protocol(CustodyError::Misbehaved {
                party: p,
                reason: if e.from != p {
                    "sent a message in another party's name".into()
                } else {
                    "sent a message without its valid signature".into()
                },
            }));
        }
        Ok(())
    }

    /// Whether party `p` is not skipped for a recent failure.
    pub fn is_up(&self, p: PartyId) -> bool {
        self.link(p).is_some_and(|l| !l.is_down())
    }

    /// Sends one request to each listed node, then reads every answer.
    pub(super) fn round(
        &self,
        reqs: Vec<(PartyId, Request)>,
        timeout: Duration,
    ) -> Vec<(PartyId, Result<Response, String>)> {
        let mut pending = Vec::with_capacity(reqs.len());
        for (p, req) in reqs {
            match self.link(p) {
                Some(l) => pending.push((p, l.send(&req))),
                None => pending.push((p, Err(format!("no node {p}")))),
            }
        }
        pending
            .into_iter()
            .map(|(p, r)| (p, r.and_then(|pd| pd.finish(timeout))))
            .collect()
    }

    /// Asks every node for its state.
    pub fn status(&self) -> Vec<NodeState> {
        let reqs = self
            .links
            .iter()
            .map(|l| (l.party, Request::Status))
            .collect();
        self.round(reqs, SIGN_TIMEOUT)
            .into_iter()
            .map(|(p, r)| {
                let l = self.link(p);
                let mut s = NodeState {
                    party: p,
                    addr: l
                        .map(|l| l.addr)
                        .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                    key: l.map(|l| l.key.to_address()).unwrap_or_default(),
                    up: false,
                    error: None,
                    keys: vec![],
                    nonces_ready: 0,
                    ecdsa: None,
                    pending: vec![],
                };
                match r {
                    Ok(Response::Status {
                        keys,
                        nonces_ready,
                        ecdsa,
                        pending,
                        ..
                    }) => {
                        s.up = true;
                        s.nonces_ready = nonces_ready;
                        s.pending = pending
                            .into_iter()
                            .map(|k| {
                                if k.ecdsa {
                                    (k.key_id, "p256".into(), hex::encode(public_part(&k.public)))
                                } else {
                                    let pk = GroupKey::from_bytes(&k.public)
                                        .map(|g| g.public_key().to_address())
                                        .unwrap_or_else(|e| format!("({e})"));
                                    (k.key_id, "ed25519".into(), pk)
                                }
                            })
                            .collect();
                        s.ecdsa = ecdsa.map(|e| EcdsaNodeState {
                            level: e.level,
                            aux_ready: e.aux_ready,
                            primes_ready: e.primes_ready,
                            keys: e
                                .keys
                                .into_iter()
                                .map(|(k, id, held)| (k, hex::encode(public_part(&id)), held))
                                .collect(),
                            dkls23: e.dkls23,
                            banned: e.banned,
                        });
                        s.keys = keys
                            .into_iter()
                            .map(|k| {
                                let pk = GroupKey::from_bytes(&k.group)
                                    .map(|g| g.public_key().to_address())
                                    .unwrap_or_else(|e| format!("({e})"));
                                (k.key_id, pk)
                            })
                            .collect();
                    }
                    Ok(Response::Refused(r)) => s.error = Some(r.message),
                    Ok(_) => s.error = Some("answered out of protocol".into()),
                    Err(e) => s.error = Some(e),
                }
                s
            })
            .collect()
    }

    /// The group key `key_id` as the nodes hold it: at least t nodes must report the same one.
    pub fn group(&self, key_id: &str) -> Result<GroupKey, KmnError> {
        let reqs = self
            .links
            .iter()
            .map(|l| (l.party, Request::Status))
            .collect();
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut errors = Vec::new();
        for (p, r) in self.round(reqs, SIGN_TIMEOUT) {
            match r {
                Ok(Response::Status { keys, .. }) => {
                    if let Some(k) = keys.into_iter().find(|k| k.key_id == key_id) {
                        *seen.entry(k.group).or_default() += 1;
                    }
                }
                Ok(_) => errors.push(format!("node {p}: unexpected answer")),
                Err(e) => errors.push(e),
            }
        }
        match seen.into_iter().max_by_key(|(_, c)| *c) {
            Some((g, c)) if c >= self.t as usize => Ok(GroupKey::from_bytes(&g)?),
            Some((_, c)) => Err(KmnError::Unavailable(format!(
                "only {c} node(s) report key {key_id}, {} needed; {}",
                self.t,
                errors.join("; ")
            ))),
            None if errors.len() + (self.t as usize) > self.links.len() => {
                Err(KmnError::Unavailable(format!(
                    "key {key_id}: too few nodes answer ({})",
                    errors.join("; ")
                )))
            }
            None => Err(KmnError::Config(format!(
                "the network holds no key {key_id}"
            ))),
        }
    }

    /// Binds `customer` to `key_id` at every node, before the key is made: from then on the
    /// nodes sign with it only what the customer authorized (see
    /// [`florin_custody::authz`]). Needs every node; repeating it with the same customer is
    /// harmless, another customer for a committed key is refused.
    pub fn bind_customer(&self, key_id: &str, customer: &PublicKey) -> Result<(), KmnError> {
        let reqs = self
            .parties()
            .into_iter()
            .map(|p| {
                (
                    p,
                    Request::BindCustomer {
                        key_id: key_id.to_string(),
                        customer: customer.0,
                    },
                )
            })
            .collect::<Vec<_>>();
        // Binding is idempotent: a node that could not be reached (a connection reset while
        // the network is busy) is asked again, past the link's 2 s pause after a failure.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut unreachable = None;
            for (p, r) in self.round(reqs.clone(), SIGN_TIMEOUT) {
                match r {
                    Ok(Response::Key(k)) if k == customer.0 => {}
                    Ok(Response::Refused(r)) => return Err(refused(p, r)),
                    Ok(_) => return Err(unexpected(p)),
                    Err(e) => unreachable = Some(e),
                }
            }
            match unreachable {
                None => return Ok(()),
                Some(e) if attempt >= 3 => {
                    return Err(KmnError::Unavailable(format!(
                        "binding the customer of {key_id} needs every node: {e}"
                    )))
                }
                Some(_) => std::thread::sleep(std::time::Duration::from_millis(2_500)),
            }
        }
    }

    /// Distributed key generation of a new key `key_id` among all n nodes: no machine ever
    /// holds the whole key. The coordinator only relays signed envelopes; shares travel sealed
    /// to their recipient.
    pub fn dkg(&self, key_id: &str) -> Result<GroupKey, KmnError> {
        let (t, n) = (self.t, self.n());
        let g = self.run_dkg("key generation", |session| Request::DkgStart {
            session,
            key_id: key_id.to_string(),
            t,
            n,
        })?;
        let group = GroupKey::from_bytes(&g)?;
        self.commit_everywhere(key_id, &g)?;
        Ok(group)
    }

    /// Proactive share refresh of FROST key `key_id` (`florin custody refresh`): every node
    /// deals a sharing of zero to the others and adds what it gets to its share, so the
    /// public key stays and every share changes; shares stolen before the refresh do not
    /// combine with shares stolen after it. Needs all n nodes and an administrator key.
    /// Each node stores its new share pending; only when every node reports the same new
    /// sharing does the coordinator commit it, and each node then replaces its old share.
    /// A refresh whose commit round was cut short is finished first (see
    /// [`Kmn::commit_pending`]). Signers pick up the new sharing by themselves.
    pub fn refresh(&self, key_id: &str) -> Result<GroupKey, KmnError> {
        let old = self.settled(key_id)?;
        let digest = old.digest();
        let g = self.run_dkg("key refresh", |session| Request::RefreshStart {
            session,
            key_id: key_id.to_string(),
            group: digest,
        })?;
        let group = GroupKey::from_bytes(&g)?;
        if !group.is_refresh_of(&old) {
            return Err(KmnError::Protocol(CustodyError::Inconsistent(format!(
                "the nodes' refresh of {key_id} is not a new sharing of the same key"
            ))));
        }
        self.commit_everywhere(key_id, &g)?;
        Ok(group)
    }

    /// The sharing of `key_id` that every node holds committed, after finishing a refresh
    /// whose commit was cut short. Every node must answer.
    fn settled(&self, key_id: &str) -> Result<GroupKey, KmnError> {
        let held = self.commit_pending(key_id)?;
        if held.ecdsa {
            return Err(KmnError::Config(format!(
                "{key_id} is an ECDSA key; only FROST keys are refreshed yet"
            )));
        }
        Ok(GroupKey::from_bytes(&held.public)?)
    }

    /// The three relayed steps of a key generation or refresh among all n nodes, the first
    /// request made by `start`; returns the group key every node ended with.
    fn run_dkg(
        &self,
        what: &str,
        start: impl Fn([u8; 16]) -> Request,
    ) -> Result<Vec<u8>, KmnError> {
        let mut session = [0u8; 16];
        OsRng.fill_bytes(&mut session);
        let n = self.n();
        let parties: Vec<PartyId> = self.links.iter().map(|l| l.party).collect();
        let all = |rs: Vec<(PartyId, Result<Response, String>)>| -> Result<Vec<(PartyId, Response)>, KmnError> {
            let mut out = Vec::with_capacity(rs.len());
            let mut down = Vec::new();
            for (p, r) in rs {
                match r {
                    Ok(Response::Refused(r)) => return Err(refused(p, r)),
                    Ok(x) => out.push((p, x)),
                    Err(e) => down.push(e),
                }
            }
            if down.is_empty() {
                Ok(out)
            } else {
                Err(KmnError::Unavailable(format!(
                    "{what} needs all {n} nodes: {}",
                    down.join("; ")
                )))
            }
        };
        // Round 1.
        let r1 = all(self.round(
            parties.iter().map(|&p| (p, start(session))).collect(),
            DKG_TIMEOUT,
        ))?;
        let mut round1 = Vec::new();
        for (p, r) in r1 {
            match r {
                Response::DkgRound1(e) if e.from == p => {
                    self.check_signed(p, std::slice::from_ref(&e))?;
                    round1.push(e)
                }
                _ => return Err(unexpected(p)),
            }
        }
        // Round 2.
        let r2 = all(self.round(
            parties
                .iter()
                .map(|&p| {
                    let others = round1.iter().filter(|e| e.from != p).cloned().collect();
                    (
                        p,
                        Request::DkgRound2 {
                            session,
                            round1: others,
                        },
                    )
                })
                .collect(),
            DKG_TIMEOUT,
        ))?;
        let mut echoes: Vec<Envelope> = Vec::new();
        let mut direct: Vec<Envelope> = Vec::new();
        for (p, r) in r2 {
            match r {
                Response::DkgRound2 { echo, direct: d } if echo.from == p => {
                    self.check_signed(p, std::slice::from_ref(&echo))?;
                    self.check_signed(p, &d)?;
                    echoes.push(echo);
                    direct.extend(d.into_iter().filter(|e| e.from == p));
                }
                _ => return Err(unexpected(p)),
            }
        }
        // Round 3.
        let r3 = all(self.round(
            parties
                .iter()
                .map(|&p| {
                    (
                        p,
                        Request::DkgFinish {
                            session,
                            echoes: echoes.iter().filter(|e| e.from != p).cloned().collect(),
                            direct: direct.iter().filter(|e| e.to == p).cloned().collect(),
                        },
                    )
                })
                .collect(),
            DKG_TIMEOUT,
        ))?;
        let mut group: Option<Vec<u8>> = None;
        for (p, r) in r3 {
            let Response::Key(g) = r else {
                return Err(unexpected(p));
            };
            match &group {
                None => group = Some(g),
                Some(x) if *x == g => {}
                Some(_) => {
                    return Err(KmnError::Unavailable(format!(
                        "node {p} ended the {what} with another group key"
                    )))
                }
            }
        }
        group.ok_or_else(|| KmnError::Config("empty network".into()))
    }

    /// Key import (trusted dealer): splits an existing Ed25519 key (its 32-byte seed, as in
    /// Florin's key files) into shares and gives each node its own. All n nodes must take it.
    pub fn import_seed(&self, key_id: &str, seed: &[u8; 32]) -> Result<GroupKey, KmnError> {
        let (group, shares) =
            frost::split_ed25519_seed(key_id, seed, self.t, self.n(), &mut OsRng)?;
        self.install(key_id, &group, &shares)?;
        Ok(group)
    }

    fn install(&self, key_id: &str, group: &GroupKey, shares: &[KeyShare]) -> Result<(), KmnError> {
        self.refuse_if_committed(key_id)?;
        let reqs = shares
            .iter()
            .map(|s| {
                (
                    s.party(),
                    Request::Import {
                        key_id: key_id.to_string(),
                        share: s.to_bytes().to_vec(),
                    },
                )
            })
            .collect();
        let mut down = Vec::new();
        for (p, r) in self.round(reqs, SIGN_TIMEOUT) {
            match r {
                Ok(Response::Key(g)) if g == group.to_bytes() => {}
                Ok(Response::Refused(r)) => return Err(refused(p, r)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => down.push(e),
            }
        }
        if !down.is_empty() {
            return Err(KmnError::Unavailable(format!(
                "import needs all {} nodes: {}",
                self.n(),
                down.join("; ")
            )));
        }
        self.commit_everywhere(key_id, &group.to_bytes())
    }

    /// Share repair: rebuilds party `target`'s lost share of FROST key `key_id` (a node
    /// whose disk was lost or replaced, same identity) from t other nodes, without
    /// reconstructing the key. Each helper splits its share into sealed random deltas for the
    /// other helpers; each sums what it got into a sigma sealed to the target; the target adds
    /// the sigmas, checks the result against its public share, stores it and, once committed,
    /// signs again. The coordinator sees only sealed envelopes. Needs an administrator key.
    /// Returns the helpers.
    pub fn repair(&self, key_id: &str, target: PartyId) -> Result<Vec<PartyId>, KmnError> {
        let group = self.group(key_id)?;
        if self.link(target).is_none() {
            return Err(KmnError::Config(format!("no node {target}")));
        }
        let helpers: Vec<PartyId> = self
            .status()
            .into_iter()
            .filter(|s| s.up && s.party != target && s.keys.iter().any(|(k, _)| k == key_id))
            .map(|s| s.party)
            .take(self.t as usize)
            .collect();
        if helpers.len() < self.t as usize {
            return Err(KmnError::Unavailable(format!(
                "repair needs {} nodes holding {key_id} besides node {target}; {} answer",
                self.t,
                helpers.len()
            )));
        }
        let mut session = [0u8; 16];
        OsRng.fill_bytes(&mut session);
        let answers =
            |rs: Vec<(PartyId, Result<Response, String>)>| -> Result<Vec<Envelope>, KmnError> {
                let mut out = Vec::new();
                for (p, r) in rs {
                    match r {
                        Ok(Response::Repair(envs)) => {
                            self.check_signed(p, &envs)?;
                            out.extend(envs);
                        }
                        Ok(Response::Refused(r)) => return Err(refused(p, r)),
                        Ok(_) => return Err(unexpected(p)),
                        Err(e) => return Err(KmnError::Unavailable(format!("repair: {e}"))),
                    }
                }
                Ok(out)
            };
        let deltas = answers(
            self.round(
                helpers
                    .iter()
                    .map(|&p| {
                        let req = Request::RepairStart {
                            session,
                            key_id: key_id.to_string(),
                            helpers: helpers.clone(),
                            target,
                        };
                        (p, req)
                    })
                    .collect(),
                SIGN_TIMEOUT,
            ),
        )?;
        let sigmas = answers(
            self.round(
                helpers
                    .iter()
                    .map(|&p| {
                        let mine = deltas.iter().filter(|e| e.to == p).cloned().collect();
                        (
                            p,
                            Request::RepairSigma {
                                session,
                                deltas: mine,
                            },
                        )
                    })
                    .collect(),
                SIGN_TIMEOUT,
            ),
        )?;
        let finish = Request::RepairFinish {
            session,
            group: group.to_bytes(),
            sigmas,
        };
        match self.ask(target, finish)? {
            Response::Key(g) if g == group.to_bytes() => {}
            Response::Refused(r) => return Err(refused(target, r)),
            _ => return Err(unexpected(target)),
        }
        let commit = Request::Commit {
            key_id: key_id.to_string(),
            public: group.to_bytes(),
        };
        match self.ask(target, commit)? {
            Response::Key(_) => Ok(helpers),
            Response::Refused(r) => Err(refused(target, r)),
            _ => Err(unexpected(target)),
        }
    }

    /// Key export (R4): collects t shares and rebuilds the signing scalar, checked against the
    /// group key. Needs an administrator key.
    pub fn export(&self, key_id: &str) -> Result<Zeroizing<[u8; 32]>, KmnError> {
        let group = self.group(key_id)?;
        let reqs = self
            .links
            .iter()
            .map(|l| {
                (
                    l.party,
                    Request::Export {
                        key_id: key_id.to_string(),
                    },
                )
            })
            .collect();
        let mut shares = Vec::new();
        let mut errors = Vec::new();
        for (p, r) in self.round(reqs, SIGN_TIMEOUT) {
            match r {
                Ok(Response::Exported(b)) => match KeyShare::from_bytes(&b) {
                    Ok(s) if s.party() == p && *s.group() == group => shares.push(s),
                    _ => errors.push(format!("node {p}: share does not match the key")),
                },
                Ok(Response::Refused(r)) => errors.push(format!("node {p}: {}", r.message)),
                Ok(_) => errors.push(format!("node {p}: unexpected answer")),
                Err(e) => errors.push(e),
            }
        }
        if shares.len() < self.t as usize {
            return Err(KmnError::Unavailable(format!(
                "export needs {} shares, got {}: {}",
                self.t,
                shares.len(),
                errors.join("; ")
            )));
        }
        Ok(frost::reconstruct(&shares)?)
    }

    /// A signer for `key_id`.
    pub fn signer(self: &Arc<Self>, key_id: &str) -> Result<ThresholdSigner, KmnError> {
        let group = self.group(key_id)?;
        Ok(ThresholdSigner::new(self.clone(), group))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const MAX: usize = super::super::MAX_RUNS_PER_CLIENT;

    #[test]
    fn the_run_gate_counts_per_node_and_background_gives_way() {
        let gate = RunGate::new();
        let short = Duration::from_millis(50);
        // Node 1 full with foreground runs.
        let held: Vec<RunSlot> = (0..MAX)
            .map(|_| gate.enter(&[1], short, Priority::Foreground).unwrap())
            .collect();
        // Runs among the other nodes go on; one that needs node 1 waits, then gives up.
        let other = gate.enter(&[2, 3], short, Priority::Foreground).unwrap();
        let t0 = Instant::now();
        let err = gate
            .enter(&[1, 2], short, Priority::Foreground)
            .err()
            .expect("node 1 is full");
        assert!(t0.elapsed() >= short);
        assert!(err.to_string().contains("node 1"), "{err}");
        // Background work takes at most half a node's places and never waits.
        let bg: Vec<RunSlot> = (0..MAX / 2 - 1)
            .map(|_| gate.enter(&[3], short, Priority::Background).unwrap())
            .collect();
        let t0 = Instant::now();
        assert!(gate
            .enter(&[3], Duration::from_secs(10), Priority::Background)
            .is_err());
        assert!(t0.elapsed() < Duration::from_secs(1));
        // Foreground work still gets node 3's other half.
        let fg3 = gate.enter(&[3], short, Priority::Foreground).unwrap();
        drop((bg, fg3, other));
        // A run waiting for node 1 gets in when one of its runs ends.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                gate.enter(&[1, 2], Duration::from_secs(10), Priority::Foreground)
                    .map(|_| ())
            });
            std::thread::sleep(Duration::from_millis(100));
            let mut held = held;
            held.pop();
            waiter.join().unwrap().unwrap();
        });
        assert!(gate.busy.lock().unwrap().values().all(|&n| n == 0));
    }

    #[test]
    fn a_busy_node_is_not_a_refusing_node() {
        let busy = wire::Refusal::from(&CustodyError::Busy("64 runs".into()));
        assert!(busy.busy);
        assert!(matches!(refused(2, busy), KmnError::Unavailable(_)));
        let other = wire::Refusal::from(&CustodyError::BadParameters("no".into()));
        assert!(matches!(refused(2, other), KmnError::Refused { .. }));
    }
}

//! The commit step of key creation. Key generation, import and key addition each end with
//! every node storing its share as *pending*: a pending share signs nothing. Only when the
//! coordinator has seen all n nodes report the same key does it send `Commit`, and the
//! nodes make the key usable. A coordinator that fails before that leaves no half-made key
//! in use, and a new run of the same name replaces the pending shares; one that fails
//! during the commit round leaves a key that every node holds, which
//! [`Kmn::commit_pending`] (`florin custody commit`) finishes.

use std::thread;
use std::time::Duration;

use florin_custody::wire::{Request, Response};
use florin_custody::{CustodyError, PartyId};
use serde::Serialize;

use super::client::{refused, unexpected, Kmn, KmnError};

/// Rounds of `Commit` to nodes that did not answer, and the pause before each retry.
const COMMIT_TRIES: u32 = 4;
const COMMIT_PAUSE: Duration = Duration::from_millis(250);
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// A key as the nodes hold it, from [`Kmn::commit_pending`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldKey {
    /// ECDSA P-256 (else FROST Ed25519).
    pub ecdsa: bool,
    /// `GroupKey::to_bytes` for FROST; for ECDSA the sharing identity, which starts with the
    /// SEC1-compressed public key (`ecdsa::CoreShare::identity`).
    pub public: Vec<u8>,
}

impl Kmn {
    /// Sends one request to one node and returns its answer, refusals included (drills,
    /// tools and tests; the node applies its usual access rules).
    pub fn ask(&self, party: PartyId, req: Request) -> Result<Response, KmnError> {
        self.round(vec![(party, req)], COMMIT_TIMEOUT)
            .pop()
            .ok_or_else(|| KmnError::Config(format!("no node {party}")))?
            .1
            .map_err(KmnError::Unavailable)
    }

    /// Commits `key_id`, which every node reported as `public`, at every node: retried for
    /// nodes that do not answer, refused at once if a node holds something else.
    pub(super) fn commit_everywhere(&self, key_id: &str, public: &[u8]) -> Result<(), KmnError> {
        let n = self.parties().len();
        let mut left = self.parties();
        let mut errors = Vec::new();
        // Refusals are not retried (a node that holds another key will go on holding it),
        // but the round still goes on, so the report says how far the commit got.
        let mut refusals = Vec::new();
        for attempt in 0..COMMIT_TRIES {
            if attempt > 0 {
                thread::sleep(COMMIT_PAUSE * attempt);
            }
            errors.clear();
            let reqs = left
                .iter()
                .map(|&p| {
                    (
                        p,
                        Request::Commit {
                            key_id: key_id.into(),
                            public: public.to_vec(),
                        },
                    )
                })
                .collect();
            let mut still = Vec::new();
            for (p, r) in self.round(reqs, COMMIT_TIMEOUT) {
                match r {
                    Ok(Response::Key(k)) if k == public => {}
                    Ok(Response::Refused(r)) => refusals.push(refused(p, r)),
                    Ok(_) => refusals.push(unexpected(p)),
                    Err(e) => {
                        still.push(p);
                        errors.push(e);
                    }
                }
            }
            left = still;
            if left.is_empty() {
                break;
            }
        }
        if refusals.is_empty() && left.is_empty() {
            return Ok(());
        }
        let done = n - left.len() - refusals.len();
        if refusals.len() == 1 && left.is_empty() && done == 0 {
            return Err(refusals.remove(0));
        }
        let mut why: Vec<String> = refusals.iter().map(|e| e.to_string()).collect();
        why.extend(errors);
        Err(KmnError::Unavailable(format!(
            "key {key_id} is stored at every node but committed at only {done} of {n} ({}); \
             once they answer, run `florin custody commit {key_id}`",
            why.join("; ")
        )))
    }

    /// Refuses a new key under a name some node has committed, before any node is sent a
    /// share: an import or key addition must not replace the pending shares that a
    /// half-committed key of that name still needs. Every node must answer (the new key
    /// needs every node anyway).
    pub(super) fn refuse_if_committed(&self, key_id: &str) -> Result<(), KmnError> {
        let states = self.status();
        let down: Vec<String> = states
            .iter()
            .filter(|s| !s.up)
            .map(|s| format!("node {}: {}", s.party, s.error.clone().unwrap_or_default()))
            .collect();
        if !down.is_empty() {
            return Err(KmnError::Unavailable(format!(
                "a new key needs every node: {}",
                down.join("; ")
            )));
        }
        for s in states {
            let frost = s.keys.iter().any(|(k, _)| k == key_id);
            let ecdsa = s
                .ecdsa
                .as_ref()
                .is_some_and(|e| e.keys.iter().any(|(k, _, _)| k == key_id));
            if frost || ecdsa {
                return Err(KmnError::Refused {
                    party: s.party,
                    message: format!(
                        "key {key_id} exists (if its creation stopped half-way, `florin \
                         custody commit {key_id}` finishes it)"
                    ),
                    culprit: None,
                });
            }
        }
        Ok(())
    }

    /// Finishes key `key_id` after a coordinator failed during the commit round: if all n
    /// nodes hold the same key under the name, committed or pending, commits it everywhere
    /// (idempotent). A key that some node does not hold cannot be committed; make it again
    /// (a new key generation or import replaces pending shares).
    ///
    /// A FROST key being refreshed is held twice at a node: the committed sharing and the
    /// pending refreshed one. The sharing that every node holds in either form is the one
    /// committed, the refreshed one when every node stored it (nodes that committed it
    /// already have dropped the old shares, and a refresh that every node stored is as good
    /// as the old sharing), else the old one, which then needs nothing.
    pub fn commit_pending(&self, key_id: &str) -> Result<HeldKey, KmnError> {
        let reqs = self
            .parties()
            .into_iter()
            .map(|p| (p, Request::Status))
            .collect();
        // Per node: what it holds under the name, committed first.
        let mut held: Vec<Vec<HeldKey>> = Vec::new();
        let mut missing = Vec::new();
        for (p, r) in self.round(reqs, COMMIT_TIMEOUT) {
            match r {
                Ok(Response::Status {
                    keys,
                    ecdsa,
                    pending,
                    ..
                }) => {
                    let mut mine: Vec<HeldKey> = keys
                        .into_iter()
                        .filter(|k| k.key_id == key_id)
                        .map(|k| HeldKey {
                            ecdsa: false,
                            public: k.group,
                        })
                        .collect();
                    if let Some(e) = ecdsa {
                        mine.extend(e.keys.into_iter().filter(|(k, _, _)| k == key_id).map(
                            |(_, public, _)| HeldKey {
                                ecdsa: true,
                                public,
                            },
                        ));
                    }
                    mine.extend(pending.into_iter().filter(|k| k.key_id == key_id).map(|k| {
                        HeldKey {
                            ecdsa: k.ecdsa,
                            public: k.public,
                        }
                    }));
                    if mine.is_empty() {
                        missing.push(format!("node {p} does not hold it"));
                    } else {
                        held.push(mine);
                    }
                }
                Ok(Response::Refused(r)) => return Err(refused(p, r)),
                Ok(_) => return Err(unexpected(p)),
                Err(e) => missing.push(e),
            }
        }
        if !missing.is_empty() {
            return Err(KmnError::Unavailable(format!(
                "key {key_id} is committed only when every node holds it ({}); retry once every \
                 node answers, or, if a node never stored it, make the key again",
                missing.join("; ")
            )));
        }
        let common: Vec<&HeldKey> = held
            .first()
            .map(|first| {
                first
                    .iter()
                    .filter(|h| held.iter().all(|m| m.contains(h)))
                    .collect()
            })
            .unwrap_or_default();
        // Prefer what some node holds only pending (a refresh to finish) over what every
        // node has committed (nothing to do).
        let all_committed = |h: &HeldKey| held.iter().all(|m| m.first() == Some(h));
        let first = common
            .iter()
            .find(|h| !all_committed(h))
            .or(common.first())
            .map(|h| (*h).clone())
            .ok_or_else(|| {
                if held.is_empty() {
                    KmnError::Config("empty network".into())
                } else {
                    KmnError::Protocol(CustodyError::Inconsistent(format!(
                        "the nodes hold different keys named {key_id}"
                    )))
                }
            })?;
        self.commit_everywhere(key_id, &first.public)?;
        Ok(first)
    }
}

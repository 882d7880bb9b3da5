//! P-256 account keys made ahead (`PspConfig::key_pool`): a background thread keeps that many
//! keys generated and *pending* at every node of the provider's network, where they sign
//! nothing. Opening an account claims the oldest: its customer is bound to it (allowed while
//! it is pending), then it is committed, in milliseconds instead of a key generation on the
//! request. The document generates keys ahead and assigns them the same way.
//!
//! Pool keys are named `pool-` and 16 random hex digits. A restarted provider adopts the pool
//! keys every node still holds pending. A provider that crashes between a claim's commit and
//! storing the account leaves that key committed and bound to the customer but unused (it never
//! held value); the customer's retry opens the account with another key.

use std::sync::{Arc, Weak};
use std::time::Duration;

use rand::RngCore;

use super::{Psp, PspScheme};
use crate::custody::KmnError;

/// Prefix of a pooled key's name.
const PREFIX: &str = "pool-";
/// Pooled keys kept for the retry of an account opening that failed half-way.
const MAX_RESERVED: usize = 256;

impl Psp {
    /// Starts the background thread that keeps the key pool full (P-256 providers with a
    /// pool only). It ends when the provider is dropped.
    pub(super) fn spawn_key_pool(self: &Arc<Self>) {
        if self.cfg.key_pool == 0 || self.cfg.scheme != PspScheme::P256 {
            return;
        }
        let weak = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("psp-key-pool".into())
            .spawn(move || fill_loop(weak));
    }

    /// Keys ready in the pool.
    pub fn pool_ready(&self) -> usize {
        self.key_pool.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Takes the oldest pooled key, if any: (name).
    pub(super) fn take_pooled(&self) -> Option<String> {
        self.key_pool.lock().ok()?.pop_front()
    }

    /// The pooled key an earlier, failed opening of account `name` took (and may have bound
    /// to its customer at some nodes), taken back out.
    pub(super) fn reserved_key(&self, name: &str) -> Option<String> {
        self.reserved.lock().ok()?.remove(name)
    }

    /// Keeps `key` for the retry of account `name`'s opening. At most [`MAX_RESERVED`] are
    /// kept; beyond that the oldest reservation is forgotten (its key stays pending, unused).
    pub(super) fn reserve_key(&self, name: &str, key: &str) {
        if let Ok(mut r) = self.reserved.lock() {
            if r.len() >= MAX_RESERVED {
                if let Some(k) = r.keys().next().cloned() {
                    r.remove(&k);
                }
            }
            r.insert(name.to_string(), key.to_string());
        }
    }

    /// Pool keys every node holds pending with one public key (after a restart); `None` while
    /// a node does not answer.
    fn adopt_pending(&self) -> Option<Vec<String>> {
        let states = self.kmn.status();
        if states.iter().any(|s| !s.up) {
            return None;
        }
        let mut names: Vec<String> = states
            .first()
            .map(|s| {
                s.pending
                    .iter()
                    .filter(|(k, scheme, _)| k.starts_with(PREFIX) && scheme == "p256")
                    .map(|(k, _, _)| k.clone())
                    .collect()
            })
            .unwrap_or_default();
        names.retain(|k| {
            let first = states[0].pending.iter().find(|(n, _, _)| n == k);
            states
                .iter()
                .all(|s| s.pending.iter().find(|(n, _, _)| n == k) == first)
        });
        names.sort();
        Some(names)
    }
}

fn fill_loop(weak: Weak<Psp>) {
    let mut adopted = false;
    let mut failures = 0u32;
    loop {
        let Some(me) = weak.upgrade() else { return };
        if !adopted {
            // Adopted once every node answers (a node down would hide its pending keys).
            match me.adopt_pending() {
                Some(found) => {
                    if let Ok(mut p) = me.key_pool.lock() {
                        p.extend(found);
                    }
                    adopted = true;
                }
                None => {
                    drop(me);
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            }
        }
        if me.pool_ready() >= me.cfg.key_pool {
            drop(me);
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        let mut id = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut id);
        let name = format!("{PREFIX}{}", hex::encode(id));
        match me.kmn.ecdsa_keygen_pending(&name, me.cfg.ecdsa_engine) {
            Ok(_) => {
                failures = 0;
                if let Ok(mut p) = me.key_pool.lock() {
                    p.push_back(name);
                }
            }
            Err(e) => {
                failures = (failures + 1).min(6);
                if !matches!(e, KmnError::Unavailable(_)) || failures == 1 {
                    tracing::warn!("psp: making a pool key: {e}");
                }
                drop(me);
                // 0.2 s doubling to 12.8 s while nodes are down or refuse.
                std::thread::sleep(Duration::from_millis(200 << failures));
            }
        }
    }
}

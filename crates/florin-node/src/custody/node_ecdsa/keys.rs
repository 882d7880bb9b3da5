//! The node's ECDSA keys in use: lookup, pending and lost keys, commit, status, import,
//! addition, export, and a partial signature from a held presignature.

use super::*;

impl EcdsaNode {
    /// Whether a key of this name exists.
    pub(in crate::custody) fn has_key(&self, key_id: &str) -> bool {
        self.keys
            .read()
            .map(|k| k.contains_key(key_id))
            .unwrap_or(false)
    }

    /// Whether a committed key of this name is lost (its share missing or damaged).
    pub(in crate::custody) fn is_lost(&self, key_id: &str) -> bool {
        self.lost
            .read()
            .map(|l| l.contains_key(key_id))
            .unwrap_or(false)
    }

    /// Marks a committed key lost (the node's record names it, its file is missing).
    pub(in crate::custody) fn mark_lost(&self, key_id: &str, why: String) {
        if let Ok(mut l) = self.lost.write() {
            l.insert(key_id.to_string(), why);
        }
    }

    /// Committed keys, served or lost.
    pub(in crate::custody) fn committed_and_lost(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .keys
            .read()
            .map(|k| k.keys().cloned().collect())
            .unwrap_or_default();
        if let Ok(l) = self.lost.read() {
            out.extend(l.keys().cloned());
        }
        out
    }

    /// The pending keys, for `Status`.
    pub(in crate::custody) fn pending_keys(&self) -> Vec<PendingKey> {
        self.pending
            .lock()
            .map(|p| {
                p.iter()
                    .map(|(id, e)| PendingKey {
                        key_id: id.clone(),
                        ecdsa: true,
                        public: e.identity.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The DKLs23 sharing of `key_id` this node would end a refresh with: its pending refresh
    /// (the committed key's public key and engine) if it holds one, else the committed one. A
    /// node whose share was repaired has no committed one: its pending complete refresh.
    pub(in crate::custody) fn refresh_candidate(
        &self,
        key_id: &str,
    ) -> Result<Vec<u8>, CustodyError> {
        let committed = self
            .keys
            .read()
            .map_err(|_| lock_err())?
            .contains_key(key_id);
        if !committed {
            let pending = self.pending.lock().map_err(|_| lock_err())?;
            if let Some(p) = pending
                .get(key_id)
                .filter(|p| p.engine == EcdsaEngine::Dkls23 && p.refreshed && !p.hollow)
            {
                return Ok(p.identity.clone());
            }
        }
        let c = self.key(key_id)?;
        if c.engine != EcdsaEngine::Dkls23 {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id} is not a DKLs23 key"
            )));
        }
        let pending = self.pending.lock().map_err(|_| lock_err())?;
        Ok(match pending.get(key_id) {
            Some(p) if p.engine == c.engine && p.identity.get(..33) == c.identity.get(..33) => {
                p.identity.clone()
            }
            _ => c.identity.clone(),
        })
    }

    /// Whether a committed ECDSA key of this name is `identity`: `None` if there is no
    /// committed key of the name.
    pub(in crate::custody) fn committed_as(&self, key_id: &str, identity: &[u8]) -> Option<bool> {
        self.keys
            .read()
            .ok()?
            .get(key_id)
            .map(|e| e.identity == identity)
    }

    /// [`Request::Commit`](florin_custody::wire::Request::Commit) of a pending ECDSA key:
    /// `false` when no pending key of the name is `identity`.
    pub(in crate::custody) fn commit(
        &self,
        key_id: &str,
        identity: &[u8],
        replace: bool,
    ) -> Result<bool, CustodyError> {
        let mut keys = self.keys.write().map_err(|_| lock_err())?;
        let mut pending = self.pending.lock().map_err(|_| lock_err())?;
        let Some(p) = pending.get(key_id).filter(|e| e.identity == identity) else {
            return Ok(false);
        };
        if p.hollow {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id}: this node's share was rebuilt by repair and has no OT set-up; \
                 it is committed by the complete refresh that follows the repair"
            )));
        }
        if p.refreshed && !replace {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id}: this node's pending share was made by a refresh; it is committed \
                 only with every node's attestation (`florin custody refresh {key_id} --finish`)"
            )));
        }
        // A committed key is replaced only by an attested refresh of it: the same public key.
        if let Some(c) = keys.get(key_id) {
            if !replace || c.identity.get(..33) != p.identity.get(..33) || c.engine != p.engine {
                return Ok(false);
            }
        }
        let (done, waiting) = share_paths(&self.dir, key_id);
        let mut lost = self.lost.write().map_err(|_| lock_err())?;
        if lost.contains_key(key_id) && done.exists() {
            // A share committed over a damaged one (a repaired and refreshed share, or a new
            // key of the name): the damaged file is kept aside, never deleted.
            let mut aside = done.file_name().unwrap_or_default().to_os_string();
            aside.push(format!(".damaged-{}", crate::psp::store::now()));
            std::fs::rename(&done, done.with_file_name(aside))
                .map_err(|e| CustodyError::Ecdsa(format!("cannot move the damaged share: {e}")))?;
        }
        std::fs::rename(&waiting, &done)
            .map_err(|e| CustodyError::Ecdsa(format!("cannot commit the share: {e}")))?;
        lost.remove(key_id);
        drop(lost);
        if let Some(e) = pending.remove(key_id) {
            keys.insert(key_id.to_string(), e);
        }
        drop(pending);
        drop(keys);
        // Committed in memory once renamed: a failed sync is reported, and a retry finds the
        // key committed.
        sync_dir(&done)
            .map_err(|e| CustodyError::Ecdsa(format!("cannot commit the share: {e}")))?;
        Ok(true)
    }

    /// Stores party's share of DKLs23 key `key_id` rebuilt by repair: hollow, pending, until
    /// the complete refresh that follows is committed. Refused where the node holds a committed
    /// share of the name that opens (a repair is for a lost share, never a replacement).
    pub(in crate::custody) fn store_repaired(
        &self,
        key_id: &str,
        share: DklsShare,
    ) -> Result<Vec<u8>, CustodyError> {
        if self
            .keys
            .read()
            .map_err(|_| lock_err())?
            .contains_key(key_id)
        {
            return Err(CustodyError::BadParameters(format!(
                "node {} holds its share of {key_id}: a repair rebuilds a lost share only",
                self.party
            )));
        }
        if !share.is_hollow() {
            return Err(CustodyError::BadParameters(
                "a repaired share comes without OT set-up".into(),
            ));
        }
        self.store_key(key_id, &AnyShare::Dkls(Box::new(share)), false)
    }

    /// This helper's sealed-to-be part of rebuilding `target`'s lost share of DKLs23 key
    /// `key_id` ([`dkls::repair_term`]), for repair run `session`.
    pub(in crate::custody) fn repair_term(
        &self,
        key_id: &str,
        session: &[u8; 16],
        helpers: &[PartyId],
        target: PartyId,
    ) -> Result<Zeroizing<Vec<u8>>, CustodyError> {
        let k = self.dkls_key(key_id)?;
        let mut parties = helpers.to_vec();
        parties.push(target);
        self.check_not_banned(&parties)?;
        let share = match AnyShare::from_stored(&k.core)? {
            AnyShare::Dkls(d) => d,
            AnyShare::Cggmp(_) => return Err(not_dkls(key_id)),
        };
        let repair_id = hash(
            "florin/custody/dkls23/repair/v1",
            &[session, key_id.as_bytes(), &target.to_be_bytes()],
        );
        dkls::repair_term(&share, helpers, target, &repair_id)
    }

    /// Forgets a pending key of this name (another scheme's key of the name was committed).
    pub(in crate::custody) fn drop_pending(&self, key_id: &str) {
        if let Ok(mut p) = self.pending.lock() {
            if p.remove(key_id).is_some() {
                let _ = std::fs::remove_file(share_paths(&self.dir, key_id).1);
            }
        }
    }

    /// For `Status`.
    pub(in crate::custody) fn status(&self) -> EcdsaStatus {
        let mut keys: Vec<(String, Vec<u8>, u64)> = self
            .keys
            .read()
            .map(|k| {
                k.iter()
                    .map(|(id, e)| {
                        let held = e.presigs.lock().map(|p| p.map.len() as u64).unwrap_or(0);
                        (id.clone(), e.identity.clone(), held)
                    })
                    .collect()
            })
            .unwrap_or_default();
        keys.sort();
        let mut dkls23: Vec<String> = self
            .keys
            .read()
            .map(|k| {
                k.iter()
                    .filter(|(_, e)| e.engine == EcdsaEngine::Dkls23)
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default();
        dkls23.sort();
        EcdsaStatus {
            level: self.level.name().into(),
            aux_ready: self.aux.read().map(|a| a.is_some()).unwrap_or(false),
            primes_ready: self.primes.lock().map(|p| p.is_some()).unwrap_or(false),
            keys,
            dkls23,
            banned: self
                .banned
                .read()
                .map(|b| b.iter().copied().collect())
                .unwrap_or_default(),
        }
    }

    pub(super) fn key(&self, key_id: &str) -> Result<Arc<EcdsaKey>, CustodyError> {
        if let Some(why) = self.lost.read().ok().and_then(|l| l.get(key_id).cloned()) {
            return Err(CustodyError::BadParameters(format!(
                "node {p} cannot use ECDSA key {key_id}: its share is {why}; the node serves \
                 nothing for this key until `florin custody repair {key_id} --party {p}` \
                 restores it (a DKLs23 key; a CGGMP24 share comes back only from a backup)",
                p = self.party
            )));
        }
        self.keys
            .read()
            .map_err(|_| lock_err())?
            .get(key_id)
            .cloned()
            .ok_or_else(|| CustodyError::BadParameters(format!("no ECDSA key {key_id}")))
    }

    /// A committed key's public key.
    pub(in crate::custody) fn public_key(
        &self,
        key_id: &str,
    ) -> Result<florin_crypto::p256::P256PublicKey, CustodyError> {
        let k = self.key(key_id)?;
        florin_custody::ecdsa::identity_public_key(&k.identity)
            .and_then(|pk| florin_crypto::p256::P256PublicKey::from_sec1(&pk).ok())
            .ok_or_else(|| CustodyError::malformed(format!("public key of {key_id}")))
    }

    pub(super) fn aux(&self) -> Result<Arc<Zeroizing<Vec<u8>>>, CustodyError> {
        self.aux
            .read()
            .map_err(|_| lock_err())?
            .clone()
            .ok_or_else(|| {
                CustodyError::BadParameters(
                    "no ECDSA auxiliary information yet: run `florin custody ecdsa-setup`".into(),
                )
            })
    }

    /// Key import: a dealer's share.
    pub(in crate::custody) fn import(
        &self,
        key_id: &str,
        share: &[u8],
        frost_has: bool,
    ) -> Result<Vec<u8>, CustodyError> {
        if !crate::custody::node::valid_key_id(key_id) || frost_has {
            return Err(CustodyError::BadParameters(format!(
                "key name {key_id:?} invalid or taken"
            )));
        }
        let share = AnyShare::from_stored(share)?;
        self.store_key(key_id, &share, false)
    }

    /// Key addition (R5): this node's share of `from` plus the whole key `addend`, stored as
    /// `key_id`. `from` stays as it was.
    pub(in crate::custody) fn add_key(
        &self,
        key_id: &str,
        from: &str,
        addend: &[u8],
        frost_has: bool,
    ) -> Result<Vec<u8>, CustodyError> {
        if !crate::custody::node::valid_key_id(key_id) || frost_has {
            return Err(CustodyError::BadParameters(format!(
                "key name {key_id:?} invalid or taken"
            )));
        }
        let addend = Zeroizing::new(
            <[u8; 32]>::try_from(addend)
                .map_err(|_| CustodyError::BadParameters("the addend must be 32 bytes".into()))?,
        );
        let sum = match AnyShare::from_stored(&self.key(from)?.core)? {
            AnyShare::Cggmp(core) => AnyShare::Cggmp(ecdsa::add_key(&core, &addend)?),
            AnyShare::Dkls(d) => AnyShare::Dkls(Box::new(dkls::add_key(&d, &addend)?)),
        };
        self.store_key(key_id, &sum, false)
    }

    /// Key export: this node's share.
    pub(in crate::custody) fn export(&self, key_id: &str) -> Result<Vec<u8>, CustodyError> {
        Ok(self.key(key_id)?.core.to_vec())
    }

    /// A partial signature from a presignature, which is forgotten first.
    pub(in crate::custody) fn partial(
        &self,
        key_id: &str,
        presig: [u8; 16],
        message: &[u8],
    ) -> Result<Vec<u8>, CustodyError> {
        let k = self.key(key_id)?;
        if k.engine != EcdsaEngine::Cggmp24 {
            return Err(not_cggmp(key_id));
        }
        let p = {
            let mut store = k.presigs.lock().map_err(|_| lock_err())?;
            let p = store.map.remove(&presig);
            if p.is_some() {
                store.order.retain(|s| *s != presig);
            }
            p
        };
        let Some((p, _)) = p else {
            let mut id = [0u8; 8];
            id.copy_from_slice(&presig[..8]);
            return Err(CustodyError::UnknownNonce(u64::from_le_bytes(id)));
        };
        // Marked used for good (its file deleted durably) before its half leaves.
        self.drop_presig(key_id, &presig)?;
        Ok(ecdsa::partial_sign(self.party, p, message).to_bytes())
    }

    /// The unused presignatures of `key_id`: sessions and public halves.
    pub(in crate::custody) fn presigs(
        &self,
        key_id: &str,
    ) -> Result<Vec<florin_custody::wire::HeldPresig>, CustodyError> {
        let k = self.key(key_id)?;
        let store = k.presigs.lock().map_err(|_| lock_err())?;
        Ok(store
            .order
            .iter()
            .filter_map(|s| store.map.get(s).map(|(_, public)| (*s, public.clone())))
            .collect())
    }
}

/// A CGGMP24 request (presignature, partial, interactive signing) for a DKLs23 key.
pub(super) fn not_dkls(key_id: &str) -> CustodyError {
    CustodyError::BadParameters(format!("key {key_id} is not a DKLs23 key"))
}

pub(super) fn not_cggmp(key_id: &str) -> CustodyError {
    CustodyError::BadParameters(format!(
        "key {key_id} is a DKLs23 key: it signs by a DKLs23 run, with no presignatures"
    ))
}

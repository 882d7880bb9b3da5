//! The node's shares on disk: sealed, written pending, committed once every node holds its own.

use super::*;

/// Stores a new share durably (sealed, fsynced) as *pending* before it is acknowledged: it
/// signs nothing until the coordinator, having seen every node report the same key, commits
/// it. A pending share of the same name (an earlier run that did not finish) is replaced.
pub(super) fn store(inner: &Inner, share: KeyShare) -> Result<Response, CustodyError> {
    let key_id = share.group().key_id().to_string();
    // Checked and written under the write lock: two concurrent creations of one name cannot
    // overwrite each other's share.
    let keys = inner
        .keys
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let group = share.group().to_bytes();
    if let Some(e) = keys.get(&key_id) {
        if e.share == share {
            return Ok(Response::Key(group));
        }
        return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
    }
    stage(inner, key_id, share, group)
}

/// Stores a refreshed share durably as *pending* next to the committed one it refreshes; the
/// old share signs on until [`Request::Commit`] names the new sharing. A pending share of the
/// name (an earlier run that was not committed) is replaced.
pub(super) fn store_refresh(inner: &Inner, share: KeyShare) -> Result<Response, CustodyError> {
    let key_id = share.group().key_id().to_string();
    let keys = inner
        .keys
        .read()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let group = share.group().to_bytes();
    match keys.get(&key_id) {
        Some(e) if e.share == share => return Ok(Response::Key(group)),
        Some(e) if share.group().is_refresh_of(e.share.group()) && share.party() == inner.party => {
        }
        _ => {
            return Err(CustodyError::Inconsistent(format!(
                "the refresh of {key_id} does not refresh the share this node holds"
            )))
        }
    }
    stage(inner, key_id, share, group)
}

/// Writes `share` durably as the pending share of `key_id` (once: the same share again is a
/// repeat) and answers with its group key.
fn stage(
    inner: &Inner,
    key_id: String,
    share: KeyShare,
    group: Vec<u8>,
) -> Result<Response, CustodyError> {
    let mut pending = inner
        .pending
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if pending.get(&key_id) == Some(&share) {
        return Ok(Response::Key(group));
    }
    write_pending(inner, &share)?;
    pending.insert(key_id, share);
    Ok(Response::Key(group))
}

pub(super) fn write_pending(inner: &Inner, share: &KeyShare) -> Result<(), CustodyError> {
    let key_id = share.group().key_id();
    let sealed = vault::seal(
        &inner.kek,
        &share_name(key_id, inner.party),
        &share.to_bytes(),
        &mut OsRng,
    )?;
    write_private(&share_paths(&inner.dir, key_id).1, &sealed)
        .map_err(|e| CustodyError::Frost(format!("cannot store the share: {e}")))
}

/// [`Request::Commit`]: a pending share (of either scheme) whose key is `public` becomes a key
/// that signs, and a pending share of the other scheme under the name is dropped; a key
/// already committed as `public` answers again.
pub(super) fn commit(inner: &Inner, key_id: &str, public: &[u8]) -> Result<Response, CustodyError> {
    let answer = Response::Key(public.to_vec());
    let frost = key(inner, key_id)
        .ok()
        .map(|e| e.share.group().to_bytes() == public);
    let ecdsa = inner
        .ecdsa
        .as_ref()
        .and_then(|e| e.committed_as(key_id, public));
    match frost.or(ecdsa) {
        Some(true) => return Ok(answer),
        // A refresh replaces the committed sharing.
        Some(false) if frost.is_some() && commit_frost(inner, key_id, public)? => {
            record(inner, key_id, "frost")?;
            return Ok(answer);
        }
        Some(false) => {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id} is committed as another key"
            )))
        }
        None => {}
    }
    if commit_frost(inner, key_id, public)? {
        if let Some(e) = &inner.ecdsa {
            e.drop_pending(key_id);
        }
        record(inner, key_id, "frost")?;
        return Ok(answer);
    }
    if let Some(e) = &inner.ecdsa {
        if e.commit(key_id, public, false)? {
            drop_frost_pending(inner, key_id);
            record(inner, key_id, "ecdsa")?;
            return Ok(answer);
        }
    }
    Err(CustodyError::BadParameters(format!(
        "no pending key {key_id} with this public key (none was stored here, or a later key \
         creation replaced it)"
    )))
}

/// Adds a committed key to the record (`keys.sealed`), durably; a key already recorded
/// under `scheme` costs nothing.
pub(super) fn record(inner: &Inner, key_id: &str, scheme: &str) -> Result<(), CustodyError> {
    let mut r = inner
        .record
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if r.get(key_id).map(String::as_str) == Some(scheme) {
        return Ok(());
    }
    let mut next = r.clone();
    next.insert(key_id.to_string(), scheme.to_string());
    super::super::manifest::store(&inner.dir, &inner.kek, inner.party, &next)
        .map_err(|e| CustodyError::Frost(format!("cannot record the committed key: {e}")))?;
    *r = next;
    Ok(())
}

/// Commits a pending FROST share whose group key is `public`: `false` if there is none. A
/// pending refresh of a committed key replaces it, old share and file alike.
pub(super) fn commit_frost(
    inner: &Inner,
    key_id: &str,
    public: &[u8],
) -> Result<bool, CustodyError> {
    let mut keys = inner
        .keys
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let committed = keys.get(key_id).cloned();
    if let Some(e) = &committed {
        if e.share.group().to_bytes() == public {
            // A concurrent commit of the same key got here first.
            return Ok(true);
        }
    }
    let mut pending = inner
        .pending
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let fits = pending.get(key_id).is_some_and(|s| {
        s.group().to_bytes() == public
            && committed
                .as_ref()
                .is_none_or(|e| s.group().is_refresh_of(e.share.group()))
    });
    if !fits {
        return Ok(false);
    }
    let (done, waiting) = share_paths(&inner.dir, key_id);
    let mut lost = inner
        .lost
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if lost.contains_key(key_id) && done.exists() {
        // A repair replaces a damaged share: the damaged file is kept aside, never deleted.
        let mut aside = done.file_name().unwrap_or_default().to_os_string();
        aside.push(format!(".damaged-{}", crate::psp::store::now()));
        std::fs::rename(&done, done.with_file_name(aside))
            .map_err(|e| CustodyError::Frost(format!("cannot move the damaged share: {e}")))?;
    }
    std::fs::rename(&waiting, &done)
        .map_err(|e| CustodyError::Frost(format!("cannot commit the share: {e}")))?;
    lost.remove(key_id);
    drop(lost);
    if let Some(share) = pending.remove(key_id) {
        keys.insert(key_id.to_string(), Arc::new(entry_for(share)));
    }
    drop(pending);
    drop(keys);
    // Committed in memory once renamed: a failed sync is reported, and a retry finds the key
    // committed.
    sync_dir(&done).map_err(|e| CustodyError::Frost(format!("cannot commit the share: {e}")))?;
    Ok(true)
}

/// Forgets a pending FROST share of this name (an ECDSA key of the name was committed).
pub(super) fn drop_frost_pending(inner: &Inner, key_id: &str) {
    if let Ok(mut p) = inner.pending.lock() {
        if p.remove(key_id).is_some() {
            let _ = std::fs::remove_file(share_paths(&inner.dir, key_id).1);
        }
    }
}

/// [`Request::CommitRefresh`](florin_custody::wire::Request::CommitRefresh): a DKLs23 refresh
/// replaces the committed sharing only with every member's signed attestation that it holds
/// the same new sharing pending.
pub(super) fn commit_refresh(
    inner: &Inner,
    key_id: &str,
    identity: &[u8],
    attestations: &[(PartyId, Vec<u8>)],
) -> Result<Response, CustodyError> {
    let e = super::handle::ecdsa(inner)?;
    let d = florin_custody::wire::refresh_attestation_digest(key_id, identity);
    for (p, member) in &inner.members {
        let ok = attestations.iter().any(|(q, sig)| {
            q == p
                && <[u8; 64]>::try_from(sig.as_slice()).is_ok_and(|s| {
                    florin_crypto::verify(member, &d, &florin_crypto::Signature(s)).is_ok()
                })
        });
        if !ok {
            return Err(CustodyError::BadParameters(format!(
                "refresh of {key_id}: no valid attestation from node {p} that it holds the new \
                 sharing; every node's is needed"
            )));
        }
    }
    if e.committed_as(key_id, identity) == Some(true) {
        return Ok(Response::Key(identity.to_vec()));
    }
    if e.commit(key_id, identity, true)? {
        record(inner, key_id, "ecdsa")?;
        return Ok(Response::Key(identity.to_vec()));
    }
    Err(CustodyError::BadParameters(format!(
        "no pending refresh of {key_id} with this identity here"
    )))
}

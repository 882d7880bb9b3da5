//! What a node does with one request: key generation, signing, refresh, repair, import,
//! export, and the ECDSA requests.

use super::customers::PayerKey;
use super::*;
use florin_custody::authz::{Authorization, AuthzError};
use florin_ledger::Encumbrance;

pub(super) fn forbidden(what: &str) -> CustodyError {
    CustodyError::Forbidden(format!("{what} needs an administrator key"))
}

pub(super) fn handle(
    inner: &Inner,
    rights: &Rights,
    req: Request,
) -> Result<Response, CustodyError> {
    let admin = rights.admin;
    match req {
        Request::Status => {
            let keys = inner
                .keys
                .read()
                .map_err(|_| CustodyError::Frost("lock".into()))?;
            let mut list: Vec<wire::KeyInfo> = keys
                .iter()
                .map(|(id, e)| wire::KeyInfo {
                    key_id: id.clone(),
                    group: e.share.group().to_bytes(),
                })
                .collect();
            list.sort_by(|a, b| a.key_id.cmp(&b.key_id));
            // Read under the `keys` lock: a commit moves a key between the two whole.
            let mut pending: Vec<wire::PendingKey> = inner
                .pending
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?
                .iter()
                .map(|(id, share)| wire::PendingKey {
                    key_id: id.clone(),
                    ecdsa: false,
                    public: share.group().to_bytes(),
                })
                .collect();
            if let Some(e) = &inner.ecdsa {
                pending.extend(e.pending_keys());
            }
            drop(keys);
            pending.sort_by(|a, b| a.key_id.cmp(&b.key_id));
            Ok(Response::Status {
                party: inner.party,
                keys: list,
                nonces_ready: inner
                    .nonces
                    .pool
                    .lock()
                    .map(|p| p.ready() as u64)
                    .unwrap_or(0),
                ecdsa: inner.ecdsa.as_ref().map(|e| e.status()),
                pending,
            })
        }
        Request::Commitments { count } => {
            let n = &inner.nonces;
            let count = count.min(MAX_COMMITMENTS) as usize;
            let lock = || {
                n.pool
                    .lock()
                    .map_err(|_| CustodyError::Frost("lock".into()))
            };
            let mut out = lock()?.issue(count);
            if out.len() < count {
                // Demand outgrew the pool: keep more ready from now on, and make the
                // shortfall now (outside the lock, so signing goes on) rather than answer short.
                let t = n.target.load(Ordering::Relaxed);
                n.target.store(
                    NONCE_POOL_TARGET.min(t.max(2 * count).max(2 * t)),
                    Ordering::Relaxed,
                );
                let batch = NoncePool::generate(&n.hedge, count - out.len(), &mut OsRng);
                let mut pool = lock()?;
                pool.add(batch);
                out.extend(pool.issue(count - out.len()));
            }
            if let Ok(pool) = lock() {
                n.low_water.fetch_min(pool.ready(), Ordering::Relaxed);
            }
            Ok(Response::Commitments(out))
        }
        Request::Sign {
            key_id,
            group,
            nonce,
            package,
        } => frost_sign(inner, rights, key_id, group, nonce, &package, None),
        Request::SignAuthorized {
            key_id,
            group,
            nonce,
            package,
            authz,
        } => frost_sign(inner, rights, key_id, group, nonce, &package, Some(&authz)),
        Request::BindCustomer { key_id, customer } => {
            if !admin {
                return Err(forbidden("binding a customer"));
            }
            if !valid_key_id(&key_id) {
                return Err(CustodyError::BadParameters(format!("key name {key_id:?}")));
            }
            // Any share of the name, committed, lost or pending (a key generation, refresh or
            // repair under way), fixes the binding: changing it then would let the binding be
            // swapped between a repair and its commit. One exception: a pending ECDSA key
            // with no binding yet may take its first one (a key made ahead for an account that
            // opens later, which signs nothing until committed). ECDSA shares are never
            // pending from a repair, and a binding, once made, still never changes.
            let committed = frost_has(inner, &key_id)
                || ecdsa_has(inner, &key_id)
                || share_of_name(inner, &key_id, inner.customers.bound(&key_id).is_some());
            inner
                .customers
                .bind(&key_id, PublicKey(customer), committed)?;
            Ok(Response::Key(customer.to_vec()))
        }
        Request::DkgStart {
            session,
            key_id,
            t,
            n,
        } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            if !valid_key_id(&key_id) {
                return Err(CustodyError::BadParameters(format!("key name {key_id:?}")));
            }
            if n != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "{n} parties asked, the network has {}",
                    inner.n
                )));
            }
            if key(inner, &key_id).is_ok() || ecdsa_has(inner, &key_id) {
                return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
            }
            let (party, msg) = DkgParty::start(&key_id, inner.party, t, n, &mut OsRng)?;
            begin_run(inner, session, party, msg)
        }
        Request::RefreshStart {
            session,
            key_id,
            group,
        } => {
            if !admin {
                return Err(forbidden("key refresh"));
            }
            let e = key(inner, &key_id)?;
            if e.digest != group {
                return Err(CustodyError::StaleGroup(key_id));
            }
            if e.share.group().parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "key {key_id} has {} parties, the network {}",
                    e.share.group().parties(),
                    inner.n
                )));
            }
            let (party, msg) = DkgParty::start_refresh(&e.share, &mut OsRng)?;
            begin_run(inner, session, party, msg)
        }
        Request::DkgRound2 { session, round1 } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            let mut run = take_run(inner, &session)?;
            let msgs = open_all(inner, &session, 1, &round1)?;
            let out = run.party.round2(&msgs)?;
            for e in round1.iter().filter(|e| e.from != inner.party) {
                let att = e.attestation();
                run.round1.insert(e.from, att.payload_hash);
                run.seen.push(att);
            }
            let echo = DkgEcho {
                frost: out.echo,
                seen: std::mem::take(&mut run.seen),
            };
            let echo = Envelope::broadcast(
                &inner.identity,
                session,
                2,
                inner.party,
                wire::encode(&echo),
            )?;
            let mut direct = Vec::with_capacity(out.direct.len());
            for (to, m) in &out.direct {
                direct.push(sealed_to(inner, session, 3, *to, m)?);
            }
            put_run(inner, session, run)?;
            Ok(Response::DkgRound2 { echo, direct })
        }
        Request::DkgFinish {
            session,
            echoes,
            direct,
        } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            let mut run = take_run(inner, &session)?;
            let echoes = open_all(inner, &session, 2, &echoes)?;
            let mut frost_echoes = BTreeMap::new();
            let mut attested = BTreeMap::new();
            for (w, bytes) in echoes {
                let echo: DkgEcho =
                    wire::decode(&bytes, "echo").map_err(|_| CustodyError::Misbehaved {
                        party: w,
                        reason: "malformed echo".into(),
                    })?;
                frost_echoes.insert(w, echo.frost);
                attested.insert(w, echo.seen);
            }
            // Signed evidence first: it names an equivocating sender or a lying witness.
            check_echoes(&session, 1, &run.round1, &attested, |p| {
                inner.members.get(&p).cloned()
            })?;
            let direct = open_all(inner, &session, 3, &direct)?;
            let refresh = run.party.is_refresh();
            let share = run
                .party
                .finish(&frost_echoes, &direct)
                .map_err(|e| match e {
                    // The witness's signed attestations agreed with ours, its digests do not:
                    // the witness contradicts itself.
                    CustodyError::Equivocation { witness, .. } => CustodyError::Misbehaved {
                        party: witness,
                        reason: "its echo's digests contradict its signed attestations".into(),
                    },
                    other => other,
                })?;
            if refresh {
                store_refresh(inner, share)
            } else {
                store(inner, share)
            }
        }
        Request::Import { key_id, share } => {
            if !admin {
                return Err(forbidden("key import"));
            }
            let share = KeyShare::from_bytes(&share)?;
            if share.group().key_id() != key_id
                || !valid_key_id(&key_id)
                || ecdsa_has(inner, &key_id)
            {
                return Err(CustodyError::BadParameters(format!(
                    "key name {key_id:?} invalid or taken"
                )));
            }
            if share.party() != inner.party || share.group().parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "share for party {} of {}, this is party {} of {}",
                    share.party(),
                    share.group().parties(),
                    inner.party,
                    inner.n
                )));
            }
            store(inner, share)
        }
        Request::Export { key_id } => {
            if !admin {
                return Err(forbidden("key export"));
            }
            refuse_if_bound(inner, &key_id, "exported")?;
            let e = key(inner, &key_id)?;
            Ok(Response::Exported(e.share.to_bytes().to_vec()))
        }
        Request::RepairStart {
            session,
            key_id,
            helpers,
            target,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let e = key(inner, &key_id)?;
            let mut deltas = frost::repair_deltas(&e.share, &helpers, target, &mut OsRng)?;
            let own = deltas
                .remove(&inner.party)
                .ok_or_else(|| CustodyError::BadParameters("not a helper".into()))?;
            let mut out = Vec::with_capacity(deltas.len());
            for (to, d) in &deltas {
                out.push(sealed_to(inner, session, REPAIR_DELTA, *to, d)?);
            }
            let mut runs = inner
                .repairs
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?;
            runs.retain(|_, r| r.started.elapsed() < DKG_DEADLINE);
            if runs.len() >= MAX_DKG_RUNS || runs.contains_key(&session) {
                return Err(CustodyError::OutOfOrder(
                    "repair run taken, or too many running".into(),
                ));
            }
            runs.insert(
                session,
                RepairRun {
                    key_id,
                    helpers,
                    target,
                    own,
                    started: Instant::now(),
                },
            );
            Ok(Response::Repair(out))
        }
        Request::RepairSigma { session, deltas } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let run = inner
                .repairs
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?
                .remove(&session)
                .ok_or_else(|| CustodyError::OutOfOrder("no repair with this session".into()))?;
            let mut got = open_secrets(inner, &session, REPAIR_DELTA, &deltas)?;
            let expected: Vec<PartyId> = run
                .helpers
                .iter()
                .copied()
                .filter(|&h| h != inner.party)
                .collect();
            if got.keys().copied().ne(expected.iter().copied()) {
                return Err(CustodyError::OutOfOrder(format!(
                    "repair of {}: deltas from {:?}, helpers {expected:?}",
                    run.key_id,
                    got.keys().collect::<Vec<_>>()
                )));
            }
            got.insert(inner.party, run.own);
            let sigma = frost::repair_sigma(&got)?;
            // The key's customer binding goes with the sigma, sealed and signed by this helper:
            // the repaired node takes it from its t helpers, so that no coordinator can hand it
            // a bound key without its binding (it would then sign without the customer).
            let payload = with_binding(inner, &run.key_id, &sigma);
            Ok(Response::Repair(vec![sealed_to(
                inner,
                session,
                REPAIR_SIGMA,
                run.target,
                &payload,
            )?]))
        }
        Request::RepairFinish {
            session,
            group,
            sigmas,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let group = GroupKey::from_bytes(&group)?;
            let key_id = group.key_id().to_string();
            if !valid_key_id(&key_id) || ecdsa_has(inner, &key_id) || group.parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "key {key_id:?}: not a key of this network's kind"
                )));
            }
            let opened = open_secrets(inner, &session, REPAIR_SIGMA, &sigmas)?;
            let (binding, sigmas) = repair_binding(&key_id, opened)?;
            let share = frost::repair_finish(&group, inner.party, &sigmas)?;
            // The binding first: a share stored without it would sign without the customer. It
            // is added where the node has none (its disk lost, or only its `customers/`), and
            // never replaces another.
            if let Some(customer) = binding {
                inner.customers.bind_missing(&key_id, customer)?;
            }
            store(inner, share)
        }
        Request::DklsRepairTerm {
            session,
            key_id,
            helpers,
            target,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let term = ecdsa(inner)?.repair_term(&key_id, &session, &helpers, target)?;
            // With the key's customer binding, as a FROST sigma carries it: the repaired node
            // takes it from its helpers, never from the coordinator.
            let payload = with_binding(inner, &key_id, &term);
            Ok(Response::Repair(vec![sealed_to(
                inner,
                session,
                DKLS_REPAIR_TERM,
                target,
                &payload,
            )?]))
        }
        Request::DklsRepairFinish {
            session,
            key_id,
            helpers,
            terms,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            if !valid_key_id(&key_id) || frost_has(inner, &key_id) {
                return Err(CustodyError::BadParameters(format!(
                    "key {key_id:?}: not a DKLs23 key this node could hold"
                )));
            }
            let e = ecdsa(inner)?;
            // Before anything is written (the binding included): a repair never touches a
            // node that holds its share.
            if e.has_key(&key_id) {
                return Err(CustodyError::BadParameters(format!(
                    "node {} holds its share of {key_id}: a repair rebuilds a lost share only",
                    inner.party
                )));
            }
            let opened = open_secrets(inner, &session, DKLS_REPAIR_TERM, &terms)?;
            let mut expected = helpers.clone();
            expected.sort_unstable();
            expected.dedup();
            if expected.contains(&inner.party)
                || opened.keys().copied().ne(expected.iter().copied())
            {
                return Err(CustodyError::OutOfOrder(format!(
                    "repair of {key_id}: terms from {:?}, helpers {helpers:?} (the target is not \
                     a helper)",
                    opened.keys().collect::<Vec<_>>()
                )));
            }
            let (binding, parts) = repair_binding(&key_id, opened)?;
            let parts: Vec<(PartyId, Zeroizing<Vec<u8>>)> = parts.into_iter().collect();
            let share = florin_custody::dkls::repair_assemble(inner.party, &parts, None)?;
            if share.n() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "repair of {key_id}: a key of {} parties, the network has {}",
                    share.n(),
                    inner.n
                )));
            }
            if let Some(customer) = binding {
                inner.customers.bind_missing(&key_id, customer)?;
            }
            Ok(Response::Key(e.store_repaired(&key_id, share)?))
        }
        Request::Commit { key_id, public } => {
            if !admin {
                return Err(forbidden("committing a key"));
            }
            commit(inner, &key_id, &public)
        }
        Request::CommitRefresh {
            key_id,
            identity,
            attestations,
        } => {
            if !admin {
                return Err(forbidden("committing a key"));
            }
            super::shares::commit_refresh(inner, &key_id, &identity, &attestations)
        }
        Request::AttestRefresh { key_id } => {
            if !admin {
                return Err(forbidden("attesting a refresh"));
            }
            let identity = ecdsa(inner)?.refresh_candidate(&key_id)?;
            let d = florin_custody::wire::refresh_attestation_digest(&key_id, &identity);
            let sig = florin_crypto::Signer::sign(&inner.identity, &d)
                .map_err(|e| CustodyError::Ecdsa(format!("attestation: {e}")))?;
            Ok(Response::Attested {
                identity,
                attestation: sig.0.to_vec(),
            })
        }
        req @ (Request::EcdsaStart { .. }
        | Request::EcdsaStep { .. }
        | Request::EcdsaPartial { .. }
        | Request::EcdsaPartialAuthorized { .. }
        | Request::EcdsaAbort { .. }
        | Request::EcdsaImport { .. }
        | Request::EcdsaExport { .. }
        | Request::EcdsaPresigs { .. }
        | Request::EcdsaAddKey { .. }) => handle_ecdsa(inner, rights, req),
    }
}

/// A repair payload: the key's customer binding at this helper (a tag, then the customer key
/// when bound), then `body` (a FROST sigma or a DKLs23 term). [`repair_binding`] splits it.
fn with_binding(inner: &Inner, key_id: &str, body: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut payload = Zeroizing::new(Vec::with_capacity(33 + body.len()));
    match inner.customers.bound(key_id) {
        Some(c) => {
            payload.push(1);
            payload.extend_from_slice(&c.0);
        }
        None => payload.push(0),
    }
    payload.extend_from_slice(body);
    payload
}

/// Splits the helpers' repair payloads (a binding tag, the customer key when bound, then the
/// FROST sigma or the DKLs23 term) into the key's customer binding and the rest. Fails closed: a helper that states a
/// binding is believed over one that states none (a node that lost its `customers/` says
/// "unbound"), and two helpers naming different customers stop the repair.
#[allow(clippy::type_complexity)]
fn repair_binding(
    key_id: &str,
    opened: BTreeMap<PartyId, Zeroizing<Vec<u8>>>,
) -> Result<(Option<PublicKey>, BTreeMap<PartyId, Zeroizing<Vec<u8>>>), CustodyError> {
    let mut binding: Option<PublicKey> = None;
    let mut sigmas = BTreeMap::new();
    for (p, b) in opened {
        let (stated, rest) = match b.split_first() {
            Some((0, rest)) => (None, rest),
            Some((1, rest)) if rest.len() >= 32 => {
                let (k, rest) = rest.split_at(32);
                let mut c = [0u8; 32];
                c.copy_from_slice(k);
                (Some(PublicKey(c)), rest)
            }
            _ => {
                return Err(CustodyError::BadParameters(format!(
                    "repair of {key_id}: malformed repair payload from party {p}"
                )))
            }
        };
        match (binding, stated) {
            (Some(b), Some(s)) if b != s => {
                return Err(CustodyError::Inconsistent(format!(
                    "repair of {key_id}: the helpers disagree on the key's customer binding \
                     (party {p} names another customer); refusing to store a share whose \
                     binding is in doubt"
                )))
            }
            (None, Some(s)) => binding = Some(s),
            _ => {}
        }
        sigmas.insert(p, Zeroizing::new(rest.to_vec()));
    }
    Ok((binding, sigmas))
}

/// A key bound to a customer signs only what the customer authorized: no administrator may
/// export its shares or derive a key from it (either would let the holder of the
/// administrator's key rebuild the secret and sign anything).
fn refuse_if_bound(inner: &Inner, key_id: &str, what: &str) -> Result<(), CustodyError> {
    if inner.customers.bound(key_id).is_some() {
        return Err(CustodyError::Forbidden(format!(
            "key {key_id} is bound to a customer: it is never {what}"
        )));
    }
    Ok(())
}

/// Whether an ECDSA key of the name is committed (one namespace for both schemes; a pending
/// key of either takes no name, and the first of the two to commit drops the other).
pub(super) fn ecdsa_has(inner: &Inner, key_id: &str) -> bool {
    inner.ecdsa.as_ref().is_some_and(|e| e.has_key(key_id))
}

/// Whether a FROST key of the name is committed.
pub(super) fn frost_has(inner: &Inner, key_id: &str) -> bool {
    key(inner, key_id).is_ok()
}

/// Whether this node holds any other share of the name: a FROST key marked lost, a pending
/// FROST share, a lost ECDSA key, or (when `ecdsa_pending` counts) a pending ECDSA key.
fn share_of_name(inner: &Inner, key_id: &str, ecdsa_pending: bool) -> bool {
    let lost = inner.lost.read().map_or(true, |l| l.contains_key(key_id));
    let pending = inner
        .pending
        .lock()
        .map_or(true, |p| p.contains_key(key_id));
    let ecdsa = inner.ecdsa.as_ref().is_some_and(|e| {
        e.is_lost(key_id) || (ecdsa_pending && e.pending_keys().iter().any(|k| k.key_id == key_id))
    });
    lost || pending || ecdsa
}

pub(super) fn ecdsa(inner: &Inner) -> Result<&Arc<EcdsaNode>, CustodyError> {
    inner.ecdsa.as_ref().ok_or_else(|| {
        CustodyError::BadParameters(format!(
            "node {} does not run ECDSA (`ecdsa` in its node.json)",
            inner.party
        ))
    })
}

pub(super) fn handle_ecdsa(
    inner: &Inner,
    rights: &Rights,
    req: Request,
) -> Result<Response, CustodyError> {
    let admin = rights.admin;
    let e = ecdsa(inner)?;
    match req {
        Request::EcdsaStart { session, job } => {
            rights.check_job(&job)?;
            if let EcdsaJob::Sign { key_id, .. } = &job {
                // Interactive signing carries no authorization: a customer's key signs only
                // from a presignature, through `EcdsaPartialAuthorized`.
                if inner.customers.bound(key_id).is_some() {
                    return Err(CustodyError::Unauthorized(AuthzError::Missing));
                }
            }
            if let EcdsaJob::DklsSign {
                key_id,
                message,
                authz,
                ..
            } = &job
            {
                // Note keys are a customer key's notes: no one signs as a shifted key that no
                // customer authorization covers.
                if authz.as_ref().is_some_and(|a| a.uses_notes())
                    && inner.customers.bound(key_id).is_none()
                {
                    return Err(CustodyError::BadParameters(format!(
                        "key {key_id} is bound to no customer: it has no note keys"
                    )));
                }
                // Checked before this node's first message: a refusal leaks nothing.
                inner.customers.authorize(
                    key_id,
                    || Ok(PayerKey::Notes(e.public_key(key_id)?.0)),
                    message,
                    authz.as_ref(),
                )?;
            }
            let frost_has = match &job {
                EcdsaJob::Keygen { key_id, .. } | EcdsaJob::DklsKeygen { key_id, .. } => {
                    frost_has(inner, key_id)
                }
                _ => false,
            };
            let client = (!rights.admin).then_some(rights.peer);
            let (out, done) = e.start(
                session,
                job,
                frost_has,
                client,
                &inner.identity,
                &inner.members,
            )?;
            Ok(Response::EcdsaStep { out, done })
        }
        Request::EcdsaStep { session, incoming } => {
            let may = |job: &EcdsaJob| rights.check_job(job);
            let (out, done) = e.step(session, incoming, &may, &inner.identity, &inner.members)?;
            Ok(Response::EcdsaStep { out, done })
        }
        Request::EcdsaAbort { session } => {
            e.abort(&session, &|job: &EcdsaJob| rights.check_job(job))?;
            Ok(Response::Aborted)
        }
        Request::EcdsaPartial {
            key_id,
            presig,
            message,
        } => {
            rights.check_key(&key_id)?;
            inner
                .customers
                .authorize(&key_id, || ecdsa_payer(e, &key_id), &message, None)?;
            Ok(Response::EcdsaPartial(
                e.partial(&key_id, presig, &message)?,
            ))
        }
        Request::EcdsaPartialAuthorized {
            key_id,
            presig,
            message,
            authz,
        } => {
            rights.check_key(&key_id)?;
            // Checked before the presignature is touched: a refusal leaves it usable.
            inner.customers.authorize(
                &key_id,
                || ecdsa_payer(e, &key_id),
                &message,
                Some(&authz),
            )?;
            Ok(Response::EcdsaPartial(
                e.partial(&key_id, presig, &message)?,
            ))
        }
        Request::EcdsaPresigs { key_id } => {
            rights.check_key(&key_id)?;
            Ok(Response::Presigs(e.presigs(&key_id)?))
        }
        Request::EcdsaImport { key_id, share } => {
            if !admin {
                return Err(forbidden("key import"));
            }
            let frost_has = frost_has(inner, &key_id);
            Ok(Response::Key(
                e.import(&key_id, &share, frost_has)?.to_vec(),
            ))
        }
        Request::EcdsaExport { key_id } => {
            if !admin {
                return Err(forbidden("key export"));
            }
            refuse_if_bound(inner, &key_id, "exported")?;
            Ok(Response::Exported(e.export(&key_id)?))
        }
        Request::EcdsaAddKey {
            key_id,
            from,
            addend,
        } => {
            if !admin {
                return Err(forbidden("key addition"));
            }
            // A key derived from a customer's key by a known addend is the customer's key
            // again (export the sum, subtract the addend).
            refuse_if_bound(inner, &from, "used to derive another key")?;
            let frost_has = frost_has(inner, &key_id);
            Ok(Response::Key(
                e.add_key(&key_id, &from, &addend, frost_has)?.to_vec(),
            ))
        }
        _ => Err(CustodyError::BadParameters("not an ECDSA request".into())),
    }
}

/// A FROST signature share, after the customer's authorization when the key is bound to one
/// (checked before the nonce is taken, so a refusal leaves it usable).
fn frost_sign(
    inner: &Inner,
    rights: &Rights,
    key_id: String,
    group: [u8; 32],
    nonce: u64,
    package: &[u8],
    authz: Option<&Authorization>,
) -> Result<Response, CustodyError> {
    rights.check_key(&key_id)?;
    let e = key(inner, &key_id)?;
    if e.digest != group {
        // Checked before the nonce is taken: the coordinator retries with it.
        return Err(CustodyError::StaleGroup(key_id));
    }
    let package = SigningPackage::from_bytes(package)?;
    inner.customers.authorize(
        &key_id,
        || {
            Ok(PayerKey::Plain(Encumbrance::ed25519(
                &e.share.group().public_key(),
            )))
        },
        package.message(),
        authz,
    )?;
    let nonces = inner
        .nonces
        .pool
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .take(nonce)?;
    Ok(Response::Share(florin_custody::frost::sign_share(
        &e.share, &nonces, &package,
    )?))
}

/// The encumbrance of an ECDSA key (what a customer's authorization names as the payer).
fn ecdsa_payer(e: &EcdsaNode, key_id: &str) -> Result<PayerKey, CustodyError> {
    Ok(PayerKey::Plain(Encumbrance::p256(&e.public_key(key_id)?)))
}

/// The refusal for a key whose share this node lost.
pub(super) fn lost_error(party: PartyId, key_id: &str, why: &str) -> CustodyError {
    CustodyError::BadParameters(format!(
        "node {party} cannot use key {key_id}: its share is {why}; the node serves nothing for \
         this key until `florin custody repair {key_id} --party {party}` restores it"
    ))
}

pub(super) fn key(inner: &Inner, key_id: &str) -> Result<Arc<KeyEntry>, CustodyError> {
    if let Some(why) = inner.lost.read().ok().and_then(|l| l.get(key_id).cloned()) {
        return Err(lost_error(inner.party, key_id, &why));
    }
    inner
        .keys
        .read()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .get(key_id)
        .cloned()
        .ok_or_else(|| CustodyError::BadParameters(format!("no key {key_id}")))
}

/// Registers a key generation or refresh run that `party` started, and answers with its
/// signed round-1 broadcast.
pub(super) fn begin_run(
    inner: &Inner,
    session: [u8; 16],
    party: DkgParty,
    msg: Vec<u8>,
) -> Result<Response, CustodyError> {
    let mut dkgs = inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    dkgs.retain(|_, r| r.started.elapsed() < DKG_DEADLINE);
    if dkgs.len() >= MAX_DKG_RUNS {
        return Err(CustodyError::BadParameters(
            "too many key generations running".into(),
        ));
    }
    if dkgs.contains_key(&session) {
        return Err(CustodyError::OutOfOrder("session already started".into()));
    }
    let own = Envelope::broadcast(&inner.identity, session, 1, inner.party, msg)?;
    let att = own.attestation();
    dkgs.insert(
        session,
        DkgRun {
            party,
            started: Instant::now(),
            round1: [(inner.party, att.payload_hash)].into(),
            seen: vec![att],
        },
    );
    Ok(Response::DkgRound1(own))
}

pub(super) fn take_run(inner: &Inner, session: &[u8; 16]) -> Result<DkgRun, CustodyError> {
    inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .remove(session)
        .ok_or_else(|| CustodyError::OutOfOrder("no key generation with this session".into()))
}

pub(super) fn put_run(inner: &Inner, session: [u8; 16], run: DkgRun) -> Result<(), CustodyError> {
    inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .insert(session, run);
    Ok(())
}

/// A secret message from this node to party `to`, sealed to its identity key.
pub(super) fn sealed_to(
    inner: &Inner,
    session: [u8; 16],
    step: u8,
    to: PartyId,
    payload: &[u8],
) -> Result<Envelope, CustodyError> {
    let to_key = inner
        .members
        .get(&to)
        .ok_or_else(|| CustodyError::BadParameters(format!("party {to}")))?;
    Envelope::direct(
        &inner.identity,
        session,
        step,
        inner.party,
        to,
        to_key,
        payload,
        &mut OsRng,
    )
}

/// [`open_all`] for sealed secrets: the plaintexts are wiped when dropped.
pub(super) fn open_secrets(
    inner: &Inner,
    session: &[u8; 16],
    step: u8,
    envs: &[Envelope],
) -> Result<BTreeMap<PartyId, Zeroizing<Vec<u8>>>, CustodyError> {
    Ok(open_all(inner, session, step, envs)?
        .into_iter()
        .map(|(p, d)| (p, Zeroizing::new(d)))
        .collect())
}

/// Opens other parties' envelopes of one step: each must come from a distinct member other
/// than this node and carry that member's signature.
pub(super) fn open_all(
    inner: &Inner,
    session: &[u8; 16],
    step: u8,
    envs: &[Envelope],
) -> Result<std::collections::BTreeMap<PartyId, Vec<u8>>, CustodyError> {
    let mut out = std::collections::BTreeMap::new();
    for e in envs {
        if e.from == inner.party {
            continue;
        }
        let k = inner.members.get(&e.from).ok_or_else(|| {
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
        let m = e.open(session, step, inner.party, k, inner.identity.secret())?;
        if out.insert(e.from, m).is_some() {
            return Err(CustodyError::Misbehaved {
                party: e.from,
                reason: "two messages for one step".into(),
            });
        }
    }
    Ok(out)
}

//! The ledger service: sentinel validation and the swap engine behind one queue.
//!
//! A two-stage pipeline. Validator threads (one per core) take whatever submissions are waiting
//! and check each group as one signature batch (sentinel validation); the committer thread
//! drains everything validated, applies the valid transactions with one `swap` — one durable
//! commit for the whole group (group commit) — and answers each submitter. Validation keeps
//! running while the committer waits on the disk. "Confirmed" is only ever reported after that
//! commit returned.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use florin_crypto::{Digest, PublicKey, Signature, Signer};
use florin_ledger::expiry::ExpiryError;
use florin_ledger::validate::{inputs_of, validate_many, validate_many_gated};
use florin_ledger::{
    CompactTx, Encumbrance, Mint, Output, Supply, SwapOutcome, SwapStore, Transaction, Utxo,
    ValidationError,
};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Serialize;

use crate::error::{BadRequest, NodeError, StorageError};

/// Most transactions validated and committed together.
pub const MAX_BATCH: usize = 4096;
/// Statuses of rejected transactions remembered for status queries.
const RECENT_LIMIT: usize = 1_000_000;

/// Where a transaction stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "error", rename_all = "snake_case")]
pub enum TxStatus {
    /// Received, not yet decided.
    Pending,
    /// Fails transaction-local validation (the error says which rule).
    StaticInvalid(String),
    /// Valid, but an input is spent or unknown: nothing changed.
    StateInvalid(String),
    /// Committed and durable.
    Confirmed,
    /// Its expiry has passed (or lies too far ahead) and the ledger does not remember applying
    /// it: nothing changed. Final once [`florin_ledger::expiry::expired_for_good`]; then
    /// whether it applied before its expiry its inputs tell (spent or not).
    Expired(String),
}

impl TxStatus {
    /// The status's name in answers: `pending`, `static_invalid`, `state_invalid` or
    /// `confirmed`.
    pub fn name(&self) -> &'static str {
        match self {
            TxStatus::Pending => "pending",
            TxStatus::StaticInvalid(_) => "static_invalid",
            TxStatus::StateInvalid(_) => "state_invalid",
            TxStatus::Confirmed => "confirmed",
            TxStatus::Expired(_) => "expired",
        }
    }

    /// Why the transaction is invalid, if it is.
    pub fn error(&self) -> Option<&str> {
        match self {
            TxStatus::StaticInvalid(e) | TxStatus::StateInvalid(e) | TxStatus::Expired(e) => {
                Some(e)
            }
            TxStatus::Pending | TxStatus::Confirmed => None,
        }
    }
}

struct Job {
    tx: Transaction,
    reply: tokio::sync::oneshot::Sender<(Digest, TxStatus)>,
}

/// The ledger service.
pub struct Ledger {
    store: Arc<dyn SwapStore>,
    issuer: Arc<dyn Signer>,
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Submissions not yet taken by a validator.
    queued: Arc<AtomicUsize>,
    recent: Arc<Mutex<HashMap<Digest, TxStatus>>>,
    /// The last [`RECENT_DECIDED`] transactions this node decided, oldest first (the console).
    decided: Mutex<std::collections::VecDeque<crate::api::RecentTx>>,
}

/// How many decided transactions [`Ledger::recent_decided`] keeps.
pub const RECENT_DECIDED: usize = 256;

impl Ledger {
    /// Starts the engine over `store`, with `issuer` as the minting key.
    pub fn start(store: Arc<dyn SwapStore>, issuer: Arc<dyn Signer>) -> Arc<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let recent = Arc::new(Mutex::new(HashMap::new()));
        let engine_store = store.clone();
        let hint_store = store.clone();
        let engine_recent = recent.clone();
        let issuer_key = issuer.public_key();
        let (validated_tx, validated_rx) = mpsc::channel::<Validated>();
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        for i in 0..threads {
            let (rx, out, queued) = (rx.clone(), validated_tx.clone(), queued.clone());
            let store = hint_store.clone();
            std::thread::Builder::new()
                .name(format!("florin-sentinel-{i}"))
                .spawn(move || validator(rx, out, issuer_key, queued, threads, store))
                .ok();
        }
        drop(validated_tx);
        std::thread::Builder::new()
            .name("florin-swap-engine".into())
            .spawn(move || committer(validated_rx, engine_store, engine_recent, issuer_key))
            .ok();
        Arc::new(Ledger {
            store,
            issuer,
            jobs: Mutex::new(tx),
            queued,
            recent,
            decided: Mutex::new(std::collections::VecDeque::with_capacity(RECENT_DECIDED)),
        })
    }

    /// The last answers this node gave to submissions (at most [`RECENT_DECIDED`]), newest
    /// first: each transaction and its status when answered (`pending` when the store gave
    /// no outcome in time), for the operators' console.
    pub fn recent_decided(&self) -> Vec<crate::api::RecentTx> {
        self.decided
            .lock()
            .map(|d| d.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    fn remember_decided(&self, answers: &[(Digest, TxStatus)]) {
        let at = florin_ledger::expiry::unix_now();
        let skip = answers.len().saturating_sub(RECENT_DECIDED);
        // Built before the lock: the submit path holds it only to move entries.
        let fresh: Vec<crate::api::RecentTx> = answers[skip..]
            .iter()
            .map(|(txid, status)| crate::api::RecentTx {
                txid: hex::encode(txid),
                status: status.name().into(),
                error: status.error().map(str::to_string),
                at,
            })
            .collect();
        let evicted: Vec<crate::api::RecentTx> = {
            let Ok(mut d) = self.decided.lock() else {
                return;
            };
            let over = (d.len() + fresh.len()).saturating_sub(RECENT_DECIDED);
            let n = over.min(d.len());
            let evicted = d.drain(..n).collect();
            d.extend(fresh);
            evicted
        };
        drop(evicted);
    }

    /// The issuer's key.
    pub fn issuer(&self) -> PublicKey {
        self.issuer.public_key()
    }

    /// Submits a transaction and waits until it is decided (and, if valid, durable).
    /// Resubmitting a transaction returns its status and changes nothing.
    pub async fn submit(&self, tx: Transaction) -> Result<(Digest, TxStatus), NodeError> {
        let mut out = self.submit_many(vec![tx]).await?;
        out.pop().ok_or(NodeError::Storage(StorageError::Engine(
            "the swap engine answered nothing",
        )))
    }

    /// Submits several transactions at once (they are validated and committed as the engine
    /// batches them, not atomically together) and waits until every one is decided. Answers
    /// come in the order given.
    pub async fn submit_many(
        &self,
        txs: Vec<Transaction>,
    ) -> Result<Vec<(Digest, TxStatus)>, NodeError> {
        let mut waits = Vec::with_capacity(txs.len());
        let now = florin_ledger::expiry::unix_now();
        if florin_obs::enabled() {
            florin_obs::metrics::global()
                .tx_submitted
                .inc_by(txs.len() as u64);
        }
        {
            let jobs = self
                .jobs
                .lock()
                .map_err(|_| StorageError::Engine("engine queue poisoned"))?;
            for tx in txs {
                // The edge's expiry check, before any signature is verified. An expired mint
                // still goes to the store, which remembers every mint it applied (a replay of
                // one is answered confirmed); a transfer or redeem past its expiry is refused
                // here (the store would answer the same).
                match florin_ledger::expiry::check(tx.expires(), now) {
                    Err(e @ ExpiryError::TooFarAhead { .. }) => {
                        let status = TxStatus::Expired(e.to_string());
                        count_decided(0, 0, &[&status]);
                        waits.push(Err((tx.txid(), status)));
                        continue;
                    }
                    Err(e) if !matches!(tx, Transaction::Mint(_)) => {
                        let status = TxStatus::Expired(e.to_string());
                        count_decided(0, 0, &[&status]);
                        waits.push(Err((tx.txid(), status)));
                        continue;
                    }
                    _ => {}
                }
                let (reply, rx) = tokio::sync::oneshot::channel();
                self.queued.fetch_add(1, Ordering::Relaxed);
                jobs.send(Job { tx, reply })
                    .map_err(|_| StorageError::Engine("the swap engine stopped"))?;
                waits.push(Ok(rx));
            }
        }
        let mut out = Vec::with_capacity(waits.len());
        for w in waits {
            match w {
                Ok(rx) => out.push(rx.await.map_err(|_| {
                    StorageError::Engine("the swap engine failed; see the node's log")
                })?),
                Err(answer) => out.push(answer),
            }
        }
        self.remember_decided(&out);
        Ok(out)
    }

    /// A transaction's status: confirmed from the store, else what the engine decided
    /// recently, else `None`.
    pub fn status(&self, txid: &Digest) -> Result<Option<TxStatus>, NodeError> {
        if self.store.is_confirmed(txid)? {
            return Ok(Some(TxStatus::Confirmed));
        }
        Ok(self.recent.lock().ok().and_then(|r| r.get(txid).cloned()))
    }

    /// The ledger's signed confirmation of `txid`, which must be confirmed (else
    /// `NotFound`, naming what it is). Signed by the issuer's key (see
    /// [`crate::api::LedgerConfirmation`]); blocking when the issuer is a threshold key.
    pub fn confirmation(&self, txid: &Digest) -> Result<crate::api::LedgerConfirmation, NodeError> {
        match self.status(txid)? {
            Some(TxStatus::Confirmed) => {}
            Some(other) => {
                return Err(crate::error::NotFound::Other(format!(
                    "transaction {} is {}, not confirmed: there is no confirmation to sign",
                    hex::encode(txid),
                    other.name()
                ))
                .into())
            }
            None => return Err(crate::error::NotFound::Transaction(*txid).into()),
        }
        let at = florin_ledger::expiry::unix_now();
        let sig = self
            .issuer
            .sign(&crate::api::LedgerConfirmation::digest(txid, at))?;
        Ok(crate::api::LedgerConfirmation {
            txid: hex::encode(txid),
            issuer: self.issuer.public_key().to_address(),
            at,
            signature: hex::encode(sig.0),
        })
    }

    /// Whether a UHS id is unspent (read from the store: never stale).
    pub fn is_unspent(&self, id: &Digest) -> Result<bool, NodeError> {
        self.store.is_unspent(id).map_err(NodeError::from)
    }

    /// The ledger's books.
    pub fn supply(&self) -> Result<Supply, NodeError> {
        self.store.supply().map_err(NodeError::from)
    }

    /// The issuer mints `amount_cents` to `owner` (devnet faucet): one output per
    /// denomination-like chunk so the owner can pay without waiting for change. Returns the
    /// created UTXOs once durable.
    pub async fn mint_to(
        &self,
        enc: Encumbrance,
        amount_cents: u64,
    ) -> Result<(Digest, Vec<Utxo>), NodeError> {
        let (tx, utxos) = self.build_mint(enc, amount_cents)?;
        self.submit_mint(tx).await.map(|txid| (txid, utxos))
    }

    /// Builds and signs the issuer's mint of `amount_cents` to `enc` without submitting it
    /// (so that the issuance can be journaled first). Returns the mint and its outputs.
    pub fn build_mint(
        &self,
        enc: Encumbrance,
        amount_cents: u64,
    ) -> Result<(Transaction, Vec<Utxo>), NodeError> {
        if amount_cents == 0 {
            return Err(BadRequest::ZeroAmount.into());
        }
        let parts = florin_token::Denomination::spendable_split(amount_cents);
        // Group the split into at most 8 outputs: enough change, few UTXOs.
        let n = parts.len().clamp(1, 8);
        let mut values = vec![0u64; n];
        for (i, d) in parts.iter().enumerate() {
            values[i % n] += d.cents();
        }
        let mut nonce = [0u8; 32];
        OsRng.fill_bytes(&mut nonce);
        let mut mint = Mint {
            nonce,
            outputs: values
                .into_iter()
                .map(|value| Output {
                    value,
                    encumbrance: enc,
                })
                .collect(),
            issuer_signature: Signature([0; 64]),
            expires: florin_ledger::expiry::default_expiry(),
        };
        mint.issuer_signature = self.issuer.sign(&mint.txid())?;
        let utxos = mint.output_utxos();
        Ok((Transaction::Mint(mint), utxos))
    }

    /// Submits a mint built by [`Ledger::build_mint`]; its txid once confirmed.
    pub async fn submit_mint(&self, tx: Transaction) -> Result<Digest, NodeError> {
        let (txid, status) = self.submit(tx).await?;
        match status {
            TxStatus::Confirmed => Ok(txid),
            other => Err(NodeError::storage(format!("mint not confirmed: {other:?}"))),
        }
    }
}

/// Most transactions one validator takes from the queue at a time.
const VALIDATE_BATCH: usize = 256;
/// A validator takes at least this many when they are waiting (batch verification pays off).
const VALIDATE_MIN: usize = 16;

/// A validator's verdict: `None` when the transaction's inputs were found missing before any
/// of its signatures was verified (the committer looks again after its commit).
type Verdict = Option<Result<CompactTx, ValidationError>>;

/// Validated jobs on their way to the committer.
type Validated = (Vec<Job>, Vec<Verdict>);

/// The answer to a transaction the store found expired.
const EXPIRED: &str =
    "the transaction expired before the ledger applied it (or it applied and was forgotten): build it again from unspent coins";

/// The answer to a transaction whose input is spent or unknown.
const MISSING_INPUT: &str = "an input is spent or does not exist";

/// Validator threads: each takes its share of what is waiting (between [`VALIDATE_MIN`] and
/// [`VALIDATE_BATCH`], so that every core gets work) and validates it as one signature batch.
/// Validation runs on every core while the committer waits on the disk.
///
/// Cheap checks come first: after the stateless rules, the store is asked whether the inputs
/// exist ([`SwapStore::inputs_hint`], which never waits); a transaction with a missing input
/// has none of its signatures verified, so a batch of made-up inputs costs lookups, not
/// signature work.
fn validator(
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
    out: mpsc::Sender<Validated>,
    issuer: PublicKey,
    queued: Arc<AtomicUsize>,
    threads: usize,
    store: Arc<dyn SwapStore>,
) {
    loop {
        let jobs = {
            let Ok(rx) = rx.lock() else { return };
            let Ok(first) = rx.recv() else { return };
            let share =
                (queued.load(Ordering::Relaxed) / threads).clamp(VALIDATE_MIN, VALIDATE_BATCH);
            let mut jobs = vec![first];
            while jobs.len() < share {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            queued.fetch_sub(jobs.len(), Ordering::Relaxed);
            jobs
        };
        let txs: Vec<&Transaction> = jobs.iter().map(|j| &j.tx).collect();
        let verdicts = validate_many_gated(&txs, &issuer, &mut OsRng, |tx, txid| {
            let inputs = inputs_of(tx);
            if inputs.is_empty() {
                return true;
            }
            // The first input alone first: made-up inputs cost one hash, not one per input.
            // Unknown (a busy store, a remote one): verify in full, as always.
            match store.inputs_hint(txid, &[inputs[0].id()]) {
                Some(true) if inputs.len() > 1 => {}
                Some(answer) => return answer,
                None => return true,
            }
            let ids: Vec<Digest> = inputs.iter().map(|u| u.id()).collect();
            store.inputs_hint(txid, &ids).unwrap_or(true)
        });
        if out.send((jobs, verdicts)).is_err() {
            return;
        }
    }
}

/// The committer: drains everything validated (up to [`MAX_BATCH`] transactions), applies it
/// with one `swap` — one durable commit — and only then answers the submitters. Transactions
/// a validator found an input missing for are looked at again after the commit (an earlier
/// transaction of the same group may have created it): still missing, they are answered
/// `state_invalid` without any signature verified; present now, they are validated in full
/// and committed with a second swap, as if they had come in the next group.
fn committer(
    rx: mpsc::Receiver<Validated>,
    store: Arc<dyn SwapStore>,
    recent: Arc<Mutex<HashMap<Digest, TxStatus>>>,
    issuer: PublicKey,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let mut n = batch[0].0.len();
        while n < MAX_BATCH {
            match rx.try_recv() {
                Ok(b) => {
                    n += b.0.len();
                    batch.push(b);
                }
                Err(_) => break,
            }
        }
        let mut deferred = decide(batch, n, &store, &recent);
        // Rounds until nothing more appears: a chain inside one group (tx1 → tx2 → tx3)
        // confirms one link per round, each round a commit; what is still missing when a
        // round commits nothing is state-invalid.
        while !deferred.is_empty() {
            let (mut now_present, mut gone) = (Vec::new(), Vec::new());
            for job in deferred {
                let txid = job.tx.txid();
                let ids: Vec<Digest> = inputs_of(&job.tx).iter().map(|u| u.id()).collect();
                // A read that fails says nothing: validate in full and let the swap decide.
                let present = store.is_confirmed(&txid).unwrap_or(true)
                    || ids.iter().all(|id| store.is_unspent(id).unwrap_or(true));
                if present {
                    now_present.push(job);
                } else {
                    gone.push(job);
                }
            }
            if now_present.is_empty() {
                let statuses: Vec<(Digest, TxStatus)> = gone
                    .iter()
                    .map(|j| (j.tx.txid(), TxStatus::StateInvalid(MISSING_INPUT.into())))
                    .collect();
                count_decided(0, 0, &statuses.iter().map(|(_, s)| s).collect::<Vec<_>>());
                remember(&recent, statuses);
                for job in gone {
                    let txid = job.tx.txid();
                    let _ = job
                        .reply
                        .send((txid, TxStatus::StateInvalid(MISSING_INPUT.into())));
                }
                break;
            }
            let txs: Vec<&Transaction> = now_present.iter().map(|j| &j.tx).collect();
            let verdicts: Vec<Verdict> = validate_many(&txs, &issuer, &mut OsRng)
                .into_iter()
                .map(Some)
                .collect();
            let n = now_present.len();
            // Every verdict is `Some`: `decide` defers nothing of these.
            let _ = decide(vec![(now_present, verdicts)], n, &store, &recent);
            deferred = gone;
        }
    }
}

/// Counts transactions the engine decided, in the metrics (counted where they are decided, so a
/// submitter that went away does not take its transactions out of the count): `confirmed`
/// (applied now), `repeated` (applied before: a resubmission), `refused` by status.
fn count_decided(confirmed: u64, repeated: u64, refused: &[&TxStatus]) {
    if !florin_obs::enabled() {
        return;
    }
    let m = florin_obs::metrics::global();
    m.tx_confirmed.inc_by(confirmed);
    m.transactions("repeated", "", repeated);
    for s in refused {
        // Undecided (the store answered fewer outcomes than it was given): not a refusal.
        if matches!(s, TxStatus::Pending) {
            m.transactions("pending", "", 1);
        } else {
            m.transactions("refused", s.name(), 1);
        }
    }
}

/// Records the statuses of transactions not confirmed, for status queries.
fn remember(recent: &Mutex<HashMap<Digest, TxStatus>>, decided: Vec<(Digest, TxStatus)>) {
    if decided.is_empty() {
        return;
    }
    if let Ok(mut r) = recent.lock() {
        if r.len() > RECENT_LIMIT {
            r.clear();
        }
        r.extend(decided);
    }
}

/// Applies one group of `n` validated transactions with one `swap` and answers their
/// submitters; returns the jobs a validator deferred (an input missing), unanswered.
fn decide(
    batch: Vec<Validated>,
    n: usize,
    store: &Arc<dyn SwapStore>,
    recent: &Mutex<HashMap<Digest, TxStatus>>,
) -> Vec<Job> {
    let valid: Vec<CompactTx> = batch
        .iter()
        .flat_map(|(_, verdicts)| {
            verdicts
                .iter()
                .filter_map(|v| v.as_ref().and_then(|v| v.as_ref().ok()).cloned())
        })
        .collect();
    let started = std::time::Instant::now();
    let outcomes = match store.swap(&valid) {
        Ok(o) => {
            if florin_obs::enabled() {
                let m = florin_obs::metrics::global();
                m.swap_batch_size.observe(valid.len() as f64);
                m.swap_commit_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            o
        }
        Err(e) => {
            // Nothing is acknowledged; submitters get an error and may retry.
            tracing::warn!("swap engine: store failed: {e}");
            if florin_obs::enabled() {
                florin_obs::metrics::global().transactions("failed", "store", n as u64);
            }
            return Vec::new();
        }
    };
    let mut outcomes = outcomes.into_iter();
    let mut decided = Vec::with_capacity(n);
    let mut answers = Vec::with_capacity(n);
    let mut deferred = Vec::new();
    // Verified in full (the store was busy when they were looked at) but an input missing at
    // the swap: an input may be made by a deferred transaction of this group, so they wait
    // with the deferred ones when there are any.
    let mut missing = Vec::new();
    let (mut fresh, mut repeated) = (0u64, 0u64);
    for (jobs, verdicts) in batch {
        for (job, verdict) in jobs.into_iter().zip(verdicts) {
            let (txid, status) = match verdict {
                None => {
                    deferred.push(job);
                    continue;
                }
                Some(Err(e)) => (job.tx.txid(), TxStatus::StaticInvalid(e.to_string())),
                Some(Ok(c)) => (
                    c.txid,
                    match outcomes.next() {
                        Some(SwapOutcome::Confirmed) => {
                            fresh += 1;
                            TxStatus::Confirmed
                        }
                        Some(SwapOutcome::AlreadyApplied) => {
                            repeated += 1;
                            TxStatus::Confirmed
                        }
                        Some(SwapOutcome::MissingInput) => {
                            missing.push((job, c.txid));
                            continue;
                        }
                        Some(SwapOutcome::Expired) => TxStatus::Expired(EXPIRED.into()),
                        None => TxStatus::Pending,
                    },
                ),
            };
            if status != TxStatus::Confirmed {
                decided.push((txid, status.clone()));
            }
            answers.push((job.reply, txid, status));
        }
    }
    if deferred.is_empty() {
        for (job, txid) in missing {
            let status = TxStatus::StateInvalid(MISSING_INPUT.into());
            decided.push((txid, status.clone()));
            answers.push((job.reply, txid, status));
        }
    } else {
        deferred.extend(missing.into_iter().map(|(job, _)| job));
    }
    count_decided(
        fresh,
        repeated,
        &decided.iter().map(|(_, s)| s).collect::<Vec<_>>(),
    );
    // Recorded before anyone is answered: a status asked right after an answer finds it.
    remember(recent, decided);
    for (reply, txid, status) in answers {
        let _ = reply.send((txid, status));
    }
    deferred
}

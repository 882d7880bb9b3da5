//! The ledger service: sentinel validation and the swap engine behind one queue.
//!
//! Submissions go to a single engine thread that drains everything waiting (up to
//! [`MAX_BATCH`]), validates it as one signature batch spread over all cores, applies the valid
//! transactions with one `swap` — one durable commit for the whole batch (group commit) — and
//! answers each submitter. "Confirmed" is only ever reported after that commit returned.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use florin_crypto::{Digest, PublicKey, Signature, Signer};
use florin_ledger::validate::validate_many;
use florin_ledger::{
    CompactTx, Encumbrance, Mint, Output, Supply, SwapOutcome, SwapStore, Transaction, Utxo,
    ValidationError,
};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Serialize;

use crate::error::NodeError;

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
    recent: Arc<Mutex<HashMap<Digest, TxStatus>>>,
}

impl Ledger {
    /// Starts the engine over `store`, with `issuer` as the minting key.
    pub fn start(store: Arc<dyn SwapStore>, issuer: Arc<dyn Signer>) -> Arc<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let recent = Arc::new(Mutex::new(HashMap::new()));
        let engine_store = store.clone();
        let engine_recent = recent.clone();
        let issuer_key = issuer.public_key();
        std::thread::Builder::new()
            .name("florin-swap-engine".into())
            .spawn(move || engine(rx, engine_store, issuer_key, engine_recent))
            .ok();
        Arc::new(Ledger {
            store,
            issuer,
            jobs: Mutex::new(tx),
            recent,
        })
    }

    /// The issuer's key.
    pub fn issuer(&self) -> PublicKey {
        self.issuer.public_key()
    }

    /// Submits a transaction and waits until it is decided (and, if valid, durable).
    /// Resubmitting a transaction returns its status and changes nothing.
    pub async fn submit(&self, tx: Transaction) -> Result<(Digest, TxStatus), NodeError> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .lock()
            .map_err(|_| NodeError::Storage("engine queue poisoned".into()))?
            .send(Job { tx, reply })
            .map_err(|_| NodeError::Storage("the swap engine stopped".into()))?;
        rx.await
            .map_err(|_| NodeError::Storage("the swap engine failed; see the node's log".into()))
    }

    /// A transaction's status: confirmed from the store, else what the engine decided
    /// recently, else `None`.
    pub fn status(&self, txid: &Digest) -> Result<Option<TxStatus>, NodeError> {
        if self
            .store
            .is_confirmed(txid)
            .map_err(|e| NodeError::Storage(e.to_string()))?
        {
            return Ok(Some(TxStatus::Confirmed));
        }
        Ok(self.recent.lock().ok().and_then(|r| r.get(txid).cloned()))
    }

    /// Whether a UHS id is unspent (read from the store: never stale).
    pub fn is_unspent(&self, id: &Digest) -> Result<bool, NodeError> {
        self.store
            .is_unspent(id)
            .map_err(|e| NodeError::Storage(e.to_string()))
    }

    /// The ledger's books.
    pub fn supply(&self) -> Result<Supply, NodeError> {
        self.store
            .supply()
            .map_err(|e| NodeError::Storage(e.to_string()))
    }

    /// The issuer mints `amount_cents` to `owner` (devnet faucet): one output per
    /// denomination-like chunk so the owner can pay without waiting for change. Returns the
    /// created UTXOs once durable.
    pub async fn mint_to(
        &self,
        owner: PublicKey,
        amount_cents: u64,
    ) -> Result<(Digest, Vec<Utxo>), NodeError> {
        if amount_cents == 0 {
            return Err(NodeError::BadRequest("amount must be positive".into()));
        }
        let enc = Encumbrance::ed25519(&owner);
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
        };
        mint.issuer_signature = self
            .issuer
            .sign(&mint.txid())
            .map_err(|e| NodeError::Signer(e.to_string()))?;
        let utxos = mint.output_utxos();
        let (txid, status) = self.submit(Transaction::Mint(mint)).await?;
        match status {
            TxStatus::Confirmed => Ok((txid, utxos)),
            other => Err(NodeError::Storage(format!("mint not confirmed: {other:?}"))),
        }
    }
}

fn engine(
    rx: mpsc::Receiver<Job>,
    store: Arc<dyn SwapStore>,
    issuer: PublicKey,
    recent: Arc<Mutex<HashMap<Digest, TxStatus>>>,
) {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let txs: Vec<&Transaction> = jobs.iter().map(|j| &j.tx).collect();
        let verdicts = validate_parallel(&txs, &issuer, threads);
        let valid: Vec<CompactTx> = verdicts
            .iter()
            .filter_map(|v| v.as_ref().ok().cloned())
            .collect();
        let outcomes = match store.swap(&valid) {
            Ok(o) => o,
            Err(e) => {
                // Nothing is acknowledged; submitters get an error and may retry.
                eprintln!("swap engine: store failed: {e}");
                continue;
            }
        };
        let mut outcomes = outcomes.into_iter();
        let mut decided = Vec::with_capacity(jobs.len());
        for (job, verdict) in jobs.into_iter().zip(verdicts) {
            let (txid, status) = match verdict {
                Err(e) => (job.tx.txid(), TxStatus::StaticInvalid(e.to_string())),
                Ok(c) => (
                    c.txid,
                    match outcomes.next() {
                        Some(SwapOutcome::Confirmed) | Some(SwapOutcome::AlreadyApplied) => {
                            TxStatus::Confirmed
                        }
                        Some(SwapOutcome::MissingInput) => {
                            TxStatus::StateInvalid("an input is spent or does not exist".into())
                        }
                        None => TxStatus::Pending,
                    },
                ),
            };
            decided.push((txid, status.clone()));
            let _ = job.reply.send((txid, status));
        }
        if let Ok(mut r) = recent.lock() {
            if r.len() > RECENT_LIMIT {
                r.clear();
            }
            for (txid, s) in decided {
                if s != TxStatus::Confirmed {
                    r.insert(txid, s);
                }
            }
        }
    }
}

/// Sentinel validation of `txs`, split into chunks over `threads` threads.
fn validate_parallel(
    txs: &[&Transaction],
    issuer: &PublicKey,
    threads: usize,
) -> Vec<Result<CompactTx, ValidationError>> {
    if txs.len() < 512 || threads < 2 {
        return validate_many(txs, issuer, &mut OsRng);
    }
    let chunk = txs.len().div_ceil(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = txs
            .chunks(chunk)
            .map(|c| {
                (
                    c.len(),
                    s.spawn(move || validate_many(c, issuer, &mut OsRng)),
                )
            })
            .collect();
        hs.into_iter()
            .flat_map(|(n, h)| {
                h.join()
                    .unwrap_or_else(|_| vec![Err(ValidationError::NoInputs); n])
            })
            .collect()
    })
}

//! The supply audit's cross-checks: the ledger's books against records kept elsewhere, so
//! that lost ledger history shows up as unbalanced instead of as a smaller but consistent
//! ledger (summing what is there balances after losing any suffix of the log).
//!
//! Two independent records, both in the authority's registry (a different file, written by a
//! different commit protocol than the ledger's log):
//! - **the issuer's journal**: every ledger mint is recorded (txid, value) before it is
//!   submitted and marked confirmed once the ledger confirmed it. The ledger must hold every
//!   confirmed mint, and its minted total must equal the journal's (plus the mints from
//!   before the journal existed, fixed once as a baseline);
//! - **the reserve**: every reserve output the authority counts as backing tokens must be
//!   unspent on the ledger (a withdrawal's payment to the reserve that the ledger lost leaves
//!   tokens unbacked).
//!
//! In the spirit of Taler's auditor, which recomputes the exchange's books from records the
//! exchange cannot all lose together.

use std::sync::Arc;

use florin_crypto::Digest;
use florin_ledger::{Encumbrance, Transaction, Utxo};
use redb::{ReadableDatabase, ReadableTable};

use crate::authority::Authority;
use crate::bridge::{Audit, CreditIntent};
use crate::error::{Corrupt, NodeError};
use crate::ledger::{Ledger, TxStatus};
use crate::store::{CREDITS, ISSUANCE, META, RESERVE};

/// One mint in the issuer's journal.
struct Issued {
    txid: Digest,
    cents: u64,
    confirmed: bool,
}

const RECORDED: u8 = 0;
const CONFIRMED: u8 = 1;

fn entry(cents: u64, state: u8) -> [u8; 9] {
    let mut b = [0u8; 9];
    b[..8].copy_from_slice(&cents.to_le_bytes());
    b[8] = state;
    b
}

fn decode_entry(b: &[u8]) -> Result<(u64, u8), NodeError> {
    match b {
        [v @ .., s] if v.len() == 8 && (*s == RECORDED || *s == CONFIRMED) => Ok((
            u64::from_le_bytes(v.try_into().map_err(|_| Corrupt::Record("issuance"))?),
            *s,
        )),
        _ => Err(NodeError::corrupt(format!(
            "issuance journal entry of {} bytes (expected 9)",
            b.len()
        ))),
    }
}

impl Authority {
    /// Journals a mint before it is submitted.
    pub fn record_mint(&self, txid: &Digest, cents: u64) -> Result<(), NodeError> {
        self.transact(|tx| {
            tx.open_table(ISSUANCE)?
                .insert(txid.as_slice(), entry(cents, RECORDED).as_slice())?;
            Ok(())
        })
    }

    /// Marks a journaled mint confirmed by the ledger.
    pub fn confirm_mint(&self, txid: &Digest, cents: u64) -> Result<(), NodeError> {
        self.transact(|tx| {
            tx.open_table(ISSUANCE)?
                .insert(txid.as_slice(), entry(cents, CONFIRMED).as_slice())?;
            Ok(())
        })
    }

    /// Fixes, once, the ledger mints made before this registry kept a journal (0 for a new
    /// directory). Call at start with the ledger's minted total.
    pub fn ensure_issuance_baseline(&self, ledger_minted_cents: u64) -> Result<(), NodeError> {
        self.transact(|tx| {
            let mut meta = tx.open_table(META)?;
            if meta.get("issuance_baseline_set")?.is_some() {
                return Ok(());
            }
            let mut journaled = 0u64;
            for item in tx.open_table(ISSUANCE)?.iter()? {
                let (_, v) = item?;
                let (cents, state) = decode_entry(v.value())?;
                if state == CONFIRMED {
                    journaled += cents;
                }
            }
            meta.insert(
                "issuance_baseline_cents",
                ledger_minted_cents.saturating_sub(journaled),
            )?;
            meta.insert("issuance_baseline_set", 1)?;
            Ok(())
        })
    }

    /// The journal: the baseline (cents minted before it existed) and its entries.
    fn issuance(&self) -> Result<(Option<u64>, Vec<Issued>), NodeError> {
        let tx = self.db().begin_read()?;
        let meta = tx.open_table(META)?;
        let baseline = match meta.get("issuance_baseline_set")? {
            Some(_) => Some(
                meta.get("issuance_baseline_cents")?
                    .map_or(0, |v| v.value()),
            ),
            None => None,
        };
        let mut out = Vec::new();
        for item in tx.open_table(ISSUANCE)?.iter()? {
            let (k, v) = item?;
            let txid: Digest = k
                .value()
                .try_into()
                .map_err(|_| Corrupt::Record("issuance journal key"))?;
            let (cents, state) = decode_entry(v.value())?;
            out.push(Issued {
                txid,
                cents,
                confirmed: state == CONFIRMED,
            });
        }
        Ok((baseline, out))
    }

    /// Reserve outputs the authority relies on, and credits in flight, as one read
    /// transaction sees them (a credit moves outputs from one to the other atomically).
    fn reserve_records(&self) -> Result<(Vec<Utxo>, Vec<CreditIntent>), NodeError> {
        let tx = self.db().begin_read()?;
        let mut reserve = Vec::new();
        for item in tx.open_table(RESERVE)?.iter()? {
            let (_, v) = item?;
            reserve.push(Utxo::decode(v.value()).map_err(Corrupt::from)?);
        }
        let mut credits = Vec::new();
        for item in tx.open_table(CREDITS)?.iter()? {
            let (_, v) = item?;
            credits.push(
                CreditIntent::decode_stored(v.value()).ok_or(Corrupt::Record("credit intent"))?,
            );
        }
        Ok((reserve, credits))
    }

    /// Whether a reserve output is (still) in the reserve table.
    fn in_reserve(&self, id: &Digest) -> Result<bool, NodeError> {
        let tx = self.db().begin_read()?;
        let t = tx.open_table(RESERVE)?;
        Ok(t.get(id.as_slice())?.is_some())
    }
}

impl Authority {
    /// Writes a consistent copy of the registry to `to` (a new file) while it keeps serving,
    /// then runs `then` (e.g. copying the ledger) before any registry write or mint can land:
    /// a mint in flight is waited for, and a write transaction is held (and aborted) around
    /// both, so the copied ledger is never behind the copied registry nor ahead of its journal.
    /// Blocking: call from a blocking thread.
    pub fn backup_registry_then<T>(
        &self,
        to: &std::path::Path,
        then: impl FnOnce() -> Result<T, NodeError>,
    ) -> Result<T, NodeError> {
        let _no_mint = self.issuing.blocking_lock();
        let hold = self.begin_write()?;
        crate::store::copy_consistent(hold.inner(), to)?;
        let out = then();
        hold.abort()?;
        out
    }
}

/// The issuer mints `cents` to `owner` on the ledger, journaled in the authority's registry
/// (recorded before submission, confirmed after). Returns the txid and the new outputs.
pub async fn issue(
    authority: &Arc<Authority>,
    ledger: &Arc<Ledger>,
    owner: Encumbrance,
    cents: u64,
) -> Result<(Digest, Vec<Utxo>), NodeError> {
    let (tx, utxos) = ledger.build_mint(owner, cents)?;
    let txid = tx.txid();
    // One mint at a time between its journal record and its confirmation, and none while the
    // audit or a live backup reads the journal and the ledger together.
    let _minting = authority.issuing.lock().await;
    let a = authority.clone();
    tokio::task::spawn_blocking(move || a.record_mint(&txid, cents))
        .await
        .map_err(|e| NodeError::task("worker", e))??;
    let txid = ledger.submit_mint(tx).await?;
    let a = authority.clone();
    tokio::task::spawn_blocking(move || a.confirm_mint(&txid, cents))
        .await
        .map_err(|e| NodeError::task("worker", e))??;
    Ok((txid, utxos))
}

/// The whole audit: the books summed, then cross-checked against the issuer's journal and
/// the reserve records. Blocking (reads both stores).
pub fn full_audit(authority: &Authority, ledger: &Ledger) -> Result<Audit, NodeError> {
    let mut problems = Vec::new();
    let confirmed = |txid: &Digest| -> Result<bool, NodeError> {
        Ok(ledger.status(txid)? == Some(TxStatus::Confirmed))
    };
    // No mint between reading the ledger's books and the journal: the two agree exactly.
    let minting = authority.issuing.blocking_lock();
    let supply = ledger.supply()?;
    let (reserve_cents, outstanding) = authority.audit_parts()?;
    let mut audit = crate::bridge::audit(supply, reserve_cents, outstanding);

    // The issuer's journal.
    let (baseline, entries) = authority.issuance()?;
    let mut journaled = 0u64;
    for Issued {
        txid,
        cents,
        confirmed: was_confirmed,
    } in &entries
    {
        let on_ledger = confirmed(txid)?;
        if *was_confirmed && !on_ledger {
            problems.push(format!(
                "mint {} of {cents} cents, confirmed per the issuer's journal, is missing from the ledger",
                hex::encode(txid)
            ));
        }
        if *was_confirmed || on_ledger {
            journaled += cents;
        }
    }
    drop(minting);
    if let Some(base) = baseline {
        let expected = base + journaled;
        audit.issued_journal_cents = Some(expected);
        if supply.minted_cents != expected {
            problems.push(format!(
                "the ledger says {} cents were minted, the issuer's journal {expected}",
                supply.minted_cents
            ));
        }
    }

    // The reserve: every output backing tokens must be unspent on the ledger. Read with the
    // credits in flight in one transaction; an output a credit took meanwhile is re-checked.
    let (reserve, credits) = authority.reserve_records()?;
    for u in &reserve {
        if !ledger.is_unspent(&u.id())? && authority.in_reserve(&u.id())? {
            problems.push(format!(
                "reserve output {} of {} cents, which backs tokens in circulation, is not unspent on the ledger",
                hex::encode(u.id()),
                u.value
            ));
        }
    }
    // Inputs of a credit in flight: unspent, or spent by that credit (checked in that order:
    // a credit confirmed in between is seen as confirmed).
    let mut checked = reserve.len() as u64;
    for c in &credits {
        // A credit's joins create outputs its later transactions spend: such an input exists
        // only once its join is confirmed.
        let mut created: std::collections::HashMap<Digest, Digest> = Default::default();
        for tx in c.transactions() {
            let Transaction::Transfer(t) = tx else {
                continue;
            };
            let txid = tx.txid();
            for u in &t.inputs {
                if let Some(by) = created.get(&u.id()) {
                    if !confirmed(by)? {
                        continue;
                    }
                }
                checked += 1;
                if !ledger.is_unspent(&u.id())? && !confirmed(&txid)? {
                    problems.push(format!(
                        "reserve output {} of {} cents, held for credit {}, is neither unspent nor spent by that credit",
                        hex::encode(u.id()),
                        u.value,
                        hex::encode(c.tx.txid())
                    ));
                }
            }
            created.extend(t.output_utxos().iter().map(|o| (o.id(), txid)));
        }
    }
    audit.reserve_outputs_checked = checked;
    if !problems.is_empty() {
        audit.balanced = false;
    }
    audit.problems = problems;
    let m = florin_obs::metrics::global();
    m.audit_runs.inc();
    m.audit_balanced.set(i64::from(audit.balanced));
    Ok(audit)
}

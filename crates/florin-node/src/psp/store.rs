//! The provider's books in redb (one ACID file, every commit fsynced before it returns):
//! accounts, the unspent outputs each holds, payments sent to the ledger whose outcome is not
//! applied yet, cross-provider acknowledgements still owed, and each account's history.
//!
//! The rule that keeps the books right across crashes: a payment is recorded as *pending*
//! (with the signed transaction) before it is sent to the ledger, and its effects — inputs
//! gone, change and local payee credited, history — are applied in one write transaction
//! once the ledger says it is confirmed. A pending payment is resolved by sending the same
//! transaction again, which the ledger answers idempotently.

use std::path::{Path, PathBuf};

use florin_ledger::{Encumbrance, Transaction, Utxo};
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::api::HistoryEntry;
use super::PspError;
use crate::keyfile::write_private;
use crate::redb_open::{open_strict, Expect};

/// name → JSON [`AccountRecord`].
const ACCOUNTS: TableDefinition<&str, &[u8]> = TableDefinition::new("psp_accounts_v1");
/// scheme ‖ key (33 bytes) → account name.
const OWNERS: TableDefinition<&[u8], &str> = TableDefinition::new("psp_owners_v1");
/// name ‖ 0 ‖ UHS id → UTXO encoding.
const COINS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_coins_v1");
/// txid → JSON [`PendingPayment`].
const PENDING: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_pending_v1");
/// txid → JSON [`Notice`].
const NOTICES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_notices_v1");
/// name ‖ 0 ‖ seq (u64 big-endian) → JSON [`HistoryEntry`].
const HISTORY: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_history_v1");
/// UHS id → () for every coin ever credited to any account: a coin is credited at most once,
/// whichever path (faucet, change, same-provider payee, `receive`) reports it first.
const SEEN: TableDefinition<&[u8], ()> = TableDefinition::new("psp_seen_v1");
/// the client's payment id → JSON [`Settled`].
const RECEIPTS: TableDefinition<&str, &[u8]> = TableDefinition::new("psp_receipts_v1");
/// "seq".
const META: TableDefinition<&str, u64> = TableDefinition::new("psp_meta_v1");
/// Proofs of cross-provider payments: txid → JSON of `proof::TransferProof`.
const PROOFS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_proofs_v1");
/// Filia's note keys: an account's note encumbrance (scheme byte ‖ 32) → the tweak `t` of
/// its key `P + t·G` (32 bytes), `P` the account's key. Coins under the account's key itself
/// have no entry.
const NOTE_KEYS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("psp_note_keys_v1");
/// Proofs still without the ledger's confirmation (txids).
const TO_CONFIRM: TableDefinition<&[u8], ()> = TableDefinition::new("psp_proofs_to_confirm_v1");

/// A custodial account.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccountRecord {
    /// Name.
    pub name: String,
    /// The key's name in the key-management network.
    pub key_id: String,
    /// `p256` or `ed25519`.
    pub scheme: String,
    /// Public key (hex).
    pub public_key: String,
    /// Text form of the account's encumbrance.
    pub encumbrance: String,
    /// The customer's key (`eur1…`): signs the account's requests and payments. Accounts
    /// opened before customer keys have none and cannot pay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    /// P-256: the key's engine (`cggmp24` / `dkls23`); absent in books from before it was
    /// kept (then the network is asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

impl AccountRecord {
    pub(crate) fn customer_key(&self) -> Result<florin_crypto::PublicKey, PspError> {
        let c = self.customer.as_deref().ok_or_else(|| {
            PspError::Forbidden(format!(
                "account {} has no customer key (opened before customer keys); it cannot be \
                 used — open a new account",
                self.name
            ))
        })?;
        florin_crypto::PublicKey::parse(c)
            .map_err(|_| PspError::Storage(format!("account {} is corrupt", self.name)))
    }

    pub(crate) fn enc(&self) -> Result<Encumbrance, PspError> {
        Encumbrance::parse_text(&self.encumbrance)
            .ok_or_else(|| PspError::Storage(format!("account {} is corrupt", self.name)))
    }
}

/// A payment sent (or about to be sent) to the ledger.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PendingPayment {
    /// The paying account.
    pub from: String,
    /// The payee as shown in history.
    pub counterparty: String,
    /// A local payee account (same provider).
    pub payee_account: Option<String>,
    /// The payee's provider (cross provider).
    pub payee_psp: Option<String>,
    /// `same_provider`, `cross_provider` or `ledger`.
    pub route: String,
    /// Amount paid.
    pub amount_cents: u64,
    /// The signed transaction (hex of its encoding); output 0 pays the payee, output 1 (if
    /// any) is the change.
    pub tx: String,
    /// The client's payment id, if it gave one.
    #[serde(default)]
    pub request_id: Option<String>,
    /// Cross provider: the payee's provider's signed word on where to pay (for the proof).
    #[serde(default)]
    pub offer: Option<super::proof::PayeeOffer>,
    /// The change's note tweak (hex), when the change goes to a fresh note key of the payer
    /// (DKLs23 accounts): written here before the payment is sent, so a crash cannot lose
    /// the key of the change.
    #[serde(default)]
    pub change_tweak: Option<String>,
    /// Filia's `r2` (hex) for a payment to a joint key `R1 + R2`: handed over with the
    /// output once the payment is confirmed.
    #[serde(default)]
    pub r2: Option<String>,
}

/// What a client's payment id settled as (kept for good, so a retried request is answered
/// with the first outcome instead of paying twice).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settled {
    /// The paying account.
    pub from: String,
    /// txid (hex).
    pub txid: String,
    /// Route.
    pub route: String,
    /// The payee's output (hex UTXO).
    pub payee_output: String,
    /// The change (hex UTXO).
    pub change_output: Option<String>,
}

impl PendingPayment {
    pub(crate) fn transfer(&self) -> Result<florin_ledger::Transfer, PspError> {
        let bytes = hex::decode(&self.tx).map_err(|_| PspError::Storage("pending tx".into()))?;
        match Transaction::decode(&bytes) {
            Ok(Transaction::Transfer(t)) => Ok(t),
            _ => Err(PspError::Storage("pending tx is not a transfer".into())),
        }
    }
}

/// An acknowledgement owed by a payee's provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notice {
    /// The payee's provider (API URL).
    pub psp: String,
    /// The paying account (shown to the payee).
    pub from: String,
    /// The payee's output (hex UTXO).
    pub output: String,
    /// For a joint key: `r2` to hand over with it.
    #[serde(default)]
    pub handover: Option<super::api::Handover>,
}

fn owner_key(e: &Encumbrance) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = e.scheme;
    k[1..].copy_from_slice(&e.key);
    k
}

fn prefixed(name: &str, tail: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(name.len() + 1 + tail.len());
    k.extend_from_slice(name.as_bytes());
    k.push(0);
    k.extend_from_slice(tail);
    k
}

/// The range of keys under `name`: `name ‖ 0 ‖ …`.
fn bounds(name: &str) -> (Vec<u8>, Vec<u8>) {
    let mut lo = name.as_bytes().to_vec();
    lo.push(0);
    let mut hi = name.as_bytes().to_vec();
    hi.push(1);
    (lo, hi)
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, PspError> {
    serde_json::to_vec(v).map_err(|e| PspError::Storage(e.to_string()))
}

fn unjson<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, PspError> {
    serde_json::from_slice(b).map_err(|e| PspError::Storage(format!("corrupt record: {e}")))
}

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `PATH.created`: says the books at `PATH` exist (written at their first start).
pub fn created_marker(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".created");
    path.with_file_name(name)
}

/// A write transaction committed with two-phase commit: redb then refuses a newest commit
/// that fails its checksums instead of rolling back to the previous one (see
/// [`crate::redb_open`]).
fn begin(db: &redb::Database) -> Result<redb::WriteTransaction, PspError> {
    let mut tx = db.begin_write()?;
    tx.set_two_phase_commit(true);
    Ok(tx)
}

/// The books.
pub struct Books {
    db: redb::Database,
}

/// A history line to append (the store numbers it).
pub(crate) struct Line<'a> {
    pub account: &'a str,
    pub direction: &'a str,
    pub txid: Option<String>,
    pub counterparty: String,
    pub amount_cents: u64,
    pub route: &'a str,
}

/// The tables a credit or a payment writes, open in one write transaction.
struct Writer<'t> {
    coins: redb::Table<'t, &'static [u8], &'static [u8]>,
    seen: redb::Table<'t, &'static [u8], ()>,
    meta: redb::Table<'t, &'static str, u64>,
    history: redb::Table<'t, &'static [u8], &'static [u8]>,
}

impl<'t> Writer<'t> {
    fn open(tx: &'t redb::WriteTransaction) -> Result<Writer<'t>, PspError> {
        Ok(Writer {
            coins: tx.open_table(COINS)?,
            seen: tx.open_table(SEEN)?,
            meta: tx.open_table(META)?,
            history: tx.open_table(HISTORY)?,
        })
    }

    /// Gives `u` to `name` unless some account was credited it before; `true` if new.
    fn hold(&mut self, name: &str, u: &Utxo) -> Result<bool, PspError> {
        let new = self.seen.insert(u.id().as_slice(), ())?.is_none();
        if new {
            self.coins
                .insert(prefixed(name, &u.id()).as_slice(), u.encode().as_slice())?;
        }
        Ok(new)
    }

    /// Appends a numbered history line.
    fn line(&mut self, line: Line<'_>) -> Result<(), PspError> {
        let seq = self.meta.get("seq")?.map(|v| v.value()).unwrap_or(0) + 1;
        self.meta.insert("seq", seq)?;
        let e = HistoryEntry {
            seq,
            direction: line.direction.into(),
            txid: line.txid,
            counterparty: line.counterparty,
            amount_cents: line.amount_cents,
            route: line.route.into(),
            at: now(),
        };
        self.history.insert(
            prefixed(line.account, &seq.to_be_bytes()).as_slice(),
            json(&e)?.as_slice(),
        )?;
        Ok(())
    }
}

impl Books {
    /// Opens the books at `path` strictly ([`crate::redb_open::open_strict`]): a missing file is
    /// created only on the provider's first start, which the marker `PATH.created` (written once
    /// the books exist) tells apart from books that were lost; an emptied, truncated or damaged
    /// file is refused with an error naming it, and a refused open changes nothing on disk.
    pub fn open(path: &Path) -> Result<Books, PspError> {
        let marker = created_marker(path);
        let expect = if marker.exists() {
            Expect::Existing
        } else {
            Expect::FirstStart
        };
        let db = open_strict(path, expect).map_err(|e| PspError::Storage(e.to_string()))?;
        if expect == Expect::FirstStart {
            write_private(
                &marker,
                b"the provider's books were created next to this file; they are never \
                  recreated while it exists\n",
            )
            .map_err(|e| PspError::Storage(e.to_string()))?;
        }
        let tx = begin(&db)?;
        {
            tx.open_table(ACCOUNTS)?;
            tx.open_table(OWNERS)?;
            tx.open_table(COINS)?;
            tx.open_table(PENDING)?;
            tx.open_table(NOTICES)?;
            tx.open_table(HISTORY)?;
            tx.open_table(META)?;
            tx.open_table(SEEN)?;
            tx.open_table(RECEIPTS)?;
            tx.open_table(PROOFS)?;
            tx.open_table(TO_CONFIRM)?;
            tx.open_table(NOTE_KEYS)?;
        }
        tx.commit()?;
        Ok(Books { db })
    }

    pub(crate) fn account(&self, name: &str) -> Result<Option<AccountRecord>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(ACCOUNTS)?;
        let v = t.get(name)?;
        v.map(|v| unjson(v.value())).transpose()
    }

    pub(crate) fn accounts(&self) -> Result<Vec<AccountRecord>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(ACCOUNTS)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (_, v) = item?;
            out.push(unjson(v.value())?);
        }
        Ok(out)
    }

    /// Stores a new account; `false` if the name is taken.
    pub(crate) fn add_account(&self, rec: &AccountRecord) -> Result<bool, PspError> {
        let enc = rec.enc()?;
        let tx = begin(&self.db)?;
        {
            let mut a = tx.open_table(ACCOUNTS)?;
            if a.get(rec.name.as_str())?.is_some() {
                return Ok(false);
            }
            a.insert(rec.name.as_str(), json(rec)?.as_slice())?;
            let mut o = tx.open_table(OWNERS)?;
            o.insert(owner_key(&enc).as_slice(), rec.name.as_str())?;
        }
        tx.commit()?;
        Ok(true)
    }

    /// The note tweak of one of this provider's note encumbrances (`None`: no note, e.g.
    /// an account's own key).
    pub(crate) fn note_tweak(&self, enc: &Encumbrance) -> Result<Option<[u8; 32]>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(NOTE_KEYS)?;
        let v = t.get(owner_key(enc).as_slice())?;
        v.map(|v| <[u8; 32]>::try_from(v.value()).map_err(|_| PspError::Storage("note key".into())))
            .transpose()
    }

    /// The account an encumbrance belongs to.
    pub(crate) fn owner(&self, enc: &Encumbrance) -> Result<Option<String>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(OWNERS)?;
        let v = t.get(owner_key(enc).as_slice())?;
        Ok(v.map(|v| v.value().to_string()))
    }

    pub(crate) fn coins(&self, name: &str) -> Result<Vec<Utxo>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(COINS)?;
        let (lo, hi) = bounds(name);
        let mut out = Vec::new();
        for item in t.range(lo.as_slice()..hi.as_slice())? {
            let (_, v) = item?;
            out.push(
                Utxo::decode(v.value())
                    .map_err(|e| PspError::Storage(format!("corrupt coin: {e}")))?,
            );
        }
        Ok(out)
    }

    /// Whether a coin was ever credited here (held now or spent since).
    pub(crate) fn seen(&self, id: &[u8; 32]) -> Result<bool, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(SEEN)?;
        let v = t.get(id.as_slice())?;
        Ok(v.is_some())
    }

    /// Credits outputs to `name` (those not held already) with one history line for their
    /// sum; returns which were new.
    pub(crate) fn credit(
        &self,
        name: &str,
        coins: &[Utxo],
        line: Line<'_>,
    ) -> Result<Vec<bool>, PspError> {
        self.credit_note(name, coins, None, line)
    }

    /// [`Books::credit`], registering first, in the same write, `note`: the tweak of the
    /// coins' note key (a joint key `R1 + R2` handed over).
    pub(crate) fn credit_note(
        &self,
        name: &str,
        coins: &[Utxo],
        note: Option<&[u8; 32]>,
        line: Line<'_>,
    ) -> Result<Vec<bool>, PspError> {
        let tx = begin(&self.db)?;
        let mut fresh = Vec::with_capacity(coins.len());
        {
            if let Some(t) = note {
                let mut keys = tx.open_table(NOTE_KEYS)?;
                let mut owners = tx.open_table(OWNERS)?;
                for u in coins {
                    let k = owner_key(&u.encumbrance);
                    keys.insert(k.as_slice(), t.as_slice())?;
                    owners.insert(k.as_slice(), name)?;
                }
            }
            let mut w = Writer::open(&tx)?;
            let mut sum = 0u64;
            for u in coins {
                let new = w.hold(name, u)?;
                if new {
                    sum = sum.saturating_add(u.value);
                }
                fresh.push(new);
            }
            if sum > 0 {
                w.line(Line {
                    amount_cents: sum,
                    ..line
                })?;
            }
        }
        tx.commit()?;
        Ok(fresh)
    }

    /// Drops a refused payment's pending record (if any) and the coins the ledger no longer
    /// holds unspent, in one write.
    pub(crate) fn drop_refused(
        &self,
        txid: Option<&[u8; 32]>,
        name: &str,
        ids: &[[u8; 32]],
    ) -> Result<(), PspError> {
        let tx = begin(&self.db)?;
        {
            if let Some(txid) = txid {
                tx.open_table(PENDING)?.remove(txid.as_slice())?;
            }
            let mut c = tx.open_table(COINS)?;
            for id in ids {
                c.remove(prefixed(name, id).as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub(crate) fn put_pending(&self, txid: &[u8; 32], p: &PendingPayment) -> Result<(), PspError> {
        let tx = begin(&self.db)?;
        tx.open_table(PENDING)?
            .insert(txid.as_slice(), json(p)?.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Pending payments (of `from` only, if given).
    pub(crate) fn pending(
        &self,
        from: Option<&str>,
    ) -> Result<Vec<([u8; 32], PendingPayment)>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(PENDING)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let p: PendingPayment = unjson(v.value())?;
            if from.is_none_or(|f| f == p.from) {
                let id: [u8; 32] = k
                    .value()
                    .try_into()
                    .map_err(|_| PspError::Storage("pending key".into()))?;
                out.push((id, p));
            }
        }
        Ok(out)
    }

    /// Applies a confirmed payment: its inputs leave the payer, the change (output 1) returns
    /// to it, a local payee gets output 0, both histories get a line, a cross-provider payee
    /// is owed a notice; the pending record goes. One write transaction.
    ///
    /// A cross-provider payment also starts its proof (`psp`: this provider's name).
    pub(crate) fn apply(
        &self,
        txid: &[u8; 32],
        p: &PendingPayment,
        psp: &str,
    ) -> Result<(), PspError> {
        let t = p.transfer()?;
        let outs = t.output_utxos();
        let hex_txid = hex::encode(txid);
        let tx = begin(&self.db)?;
        {
            let mut pending = tx.open_table(PENDING)?;
            if pending.remove(txid.as_slice())?.is_none() {
                // Applied already (a concurrent resolution got here first).
                return Ok(());
            }
            let mut w = Writer::open(&tx)?;
            for u in &t.inputs {
                w.coins.remove(prefixed(&p.from, &u.id()).as_slice())?;
            }
            if let Some(change) = outs.get(1) {
                w.hold(&p.from, change)?;
                if let Some(t) = &p.change_tweak {
                    let tweak = hex::decode(t)
                        .ok()
                        .filter(|b| b.len() == 32)
                        .ok_or_else(|| PspError::Storage("pending change tweak".into()))?;
                    let k = owner_key(&change.encumbrance);
                    tx.open_table(NOTE_KEYS)?
                        .insert(k.as_slice(), tweak.as_slice())?;
                    tx.open_table(OWNERS)?
                        .insert(k.as_slice(), p.from.as_str())?;
                }
            }
            let payee = outs
                .first()
                .ok_or_else(|| PspError::Storage("pending tx pays no one".into()))?;
            w.line(Line {
                account: &p.from,
                direction: "out",
                txid: Some(hex_txid.clone()),
                counterparty: p.counterparty.clone(),
                amount_cents: p.amount_cents,
                route: &p.route,
            })?;
            if let Some(to) = &p.payee_account {
                // Not credited again if someone handed it to `receive` first.
                w.hold(to, payee)?;
                w.line(Line {
                    account: to,
                    direction: "in",
                    txid: Some(hex_txid),
                    counterparty: p.from.clone(),
                    amount_cents: p.amount_cents,
                    route: &p.route,
                })?;
            }
            let handover = match (&p.offer, &p.r2) {
                (Some(o), Some(r2)) => Some(super::api::Handover {
                    id: hex::encode(payee.id()),
                    transfer: o.transfer.clone().unwrap_or_default(),
                    account: o.account.clone(),
                    r2: r2.clone(),
                }),
                _ => None,
            };
            if let Some(peer) = &p.payee_psp {
                let n = Notice {
                    psp: peer.clone(),
                    from: p.from.clone(),
                    output: hex::encode(payee.encode()),
                    handover,
                };
                tx.open_table(NOTICES)?
                    .insert(txid.as_slice(), json(&n)?.as_slice())?;
            }
            if let Some(offer) = &p.offer {
                let proof = super::proof::TransferProof {
                    version: super::proof::PROOF_VERSION,
                    txid: hex::encode(txid),
                    tx: p.tx.clone(),
                    output: 0,
                    amount_cents: p.amount_cents,
                    payer: format!("{}@{psp}", p.from),
                    payee: p.counterparty.clone(),
                    offer: offer.clone(),
                    r2: p.r2.clone(),
                    confirmation: None,
                    acknowledgement: None,
                };
                tx.open_table(PROOFS)?
                    .insert(txid.as_slice(), json(&proof)?.as_slice())?;
                tx.open_table(TO_CONFIRM)?.insert(txid.as_slice(), ())?;
            }
            if let Some(id) = &p.request_id {
                let done = Settled {
                    from: p.from.clone(),
                    txid: hex::encode(txid),
                    route: p.route.clone(),
                    payee_output: hex::encode(payee.encode()),
                    change_output: outs.get(1).map(|u| hex::encode(u.encode())),
                };
                tx.open_table(RECEIPTS)?
                    .insert(id.as_str(), json(&done)?.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub(crate) fn notices(&self) -> Result<Vec<([u8; 32], Notice)>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(NOTICES)?;
        let mut out = Vec::new();
        for item in t.iter()? {
            let (k, v) = item?;
            let id: [u8; 32] = k
                .value()
                .try_into()
                .map_err(|_| PspError::Storage("notice key".into()))?;
            out.push((id, unjson(v.value())?));
        }
        Ok(out)
    }

    pub(crate) fn notice(&self, txid: &[u8; 32]) -> Result<Option<Notice>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(NOTICES)?;
        let v = t.get(txid.as_slice())?;
        v.map(|v| unjson(v.value())).transpose()
    }

    /// What a client's payment id settled as.
    pub(crate) fn settled(&self, id: &str) -> Result<Option<Settled>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(RECEIPTS)?;
        let v = t.get(id)?;
        v.map(|v| unjson(v.value())).transpose()
    }

    /// Drops an owed acknowledgement; `ack`, the payee's provider's answer, goes into the
    /// payment's proof in the same write.
    pub(crate) fn drop_notice(
        &self,
        txid: &[u8; 32],
        ack: Option<&super::api::ReceiveAnswer>,
    ) -> Result<(), PspError> {
        let tx = begin(&self.db)?;
        tx.open_table(NOTICES)?.remove(txid.as_slice())?;
        if let Some(ack) = ack {
            let mut proofs = tx.open_table(PROOFS)?;
            let current = proofs.get(txid.as_slice())?.map(|v| v.value().to_vec());
            if let Some(b) = current {
                let mut proof: super::proof::TransferProof = unjson(&b)?;
                proof.acknowledgement = Some(ack.clone());
                proofs.insert(txid.as_slice(), json(&proof)?.as_slice())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The proof of the cross-provider payment `txid`, if this provider made one.
    pub(crate) fn proof(
        &self,
        txid: &[u8; 32],
    ) -> Result<Option<super::proof::TransferProof>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(PROOFS)?;
        let v = t.get(txid.as_slice())?;
        v.map(|v| unjson(v.value())).transpose()
    }

    /// Whether `txid`'s proof still lacks the ledger's confirmation.
    pub(crate) fn proof_needs_confirmation(&self, txid: &[u8; 32]) -> Result<bool, PspError> {
        let r = self.db.begin_read()?;
        Ok(r.open_table(TO_CONFIRM)?.get(txid.as_slice())?.is_some())
    }

    /// Up to `limit` txids whose proofs lack the ledger's confirmation, the first after
    /// `after` (wrapping round to the first).
    pub(crate) fn proofs_to_confirm(
        &self,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Vec<[u8; 32]>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(TO_CONFIRM)?;
        let mut out: Vec<[u8; 32]> = Vec::new();
        let take = |it: redb::Range<'_, &'static [u8], ()>,
                    skip: Option<[u8; 32]>,
                    out: &mut Vec<[u8; 32]>| {
            for item in it {
                if out.len() >= limit {
                    break;
                }
                let (k, _) = item?;
                let id: [u8; 32] = k
                    .value()
                    .try_into()
                    .map_err(|_| PspError::Storage("proof key".into()))?;
                if skip != Some(id) && !out.contains(&id) {
                    out.push(id);
                }
            }
            Ok::<(), PspError>(())
        };
        match after {
            // Those after the cursor, then from the start round to it.
            Some(a) => {
                take(t.range(a.as_slice()..)?, Some(a), &mut out)?;
                take(t.range::<&[u8]>(..=a.as_slice())?, None, &mut out)?;
            }
            None => take(t.range::<&[u8]>(..)?, None, &mut out)?,
        }
        Ok(out)
    }

    /// Stops asking the ledger to confirm `txid` (it no longer can).
    pub(crate) fn give_up_confirmation(&self, txid: &[u8; 32]) -> Result<(), PspError> {
        let tx = begin(&self.db)?;
        tx.open_table(TO_CONFIRM)?.remove(txid.as_slice())?;
        tx.commit()?;
        Ok(())
    }

    /// Puts the ledger's confirmation into `txid`'s proof.
    pub(crate) fn set_confirmation(
        &self,
        txid: &[u8; 32],
        c: &crate::api::LedgerConfirmation,
    ) -> Result<(), PspError> {
        let tx = begin(&self.db)?;
        {
            let mut proofs = tx.open_table(PROOFS)?;
            let current = proofs.get(txid.as_slice())?.map(|v| v.value().to_vec());
            let Some(b) = current else {
                return Err(PspError::Storage(format!(
                    "no proof of {} to confirm",
                    hex::encode(txid)
                )));
            };
            // Confirmed already (the payment and the upkeep both asked): the first stands.
            if tx
                .open_table(TO_CONFIRM)?
                .remove(txid.as_slice())?
                .is_none()
            {
                return Ok(());
            }
            let mut proof: super::proof::TransferProof = unjson(&b)?;
            proof.confirmation = Some(c.clone());
            proofs.insert(txid.as_slice(), json(&proof)?.as_slice())?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The last `limit` history lines of `name`, oldest first.
    pub(crate) fn history(&self, name: &str, limit: usize) -> Result<Vec<HistoryEntry>, PspError> {
        let r = self.db.begin_read()?;
        let t = r.open_table(HISTORY)?;
        let (lo, hi) = bounds(name);
        let mut out = Vec::new();
        for item in t.range(lo.as_slice()..hi.as_slice())?.rev().take(limit) {
            let (_, v) = item?;
            out.push(unjson(v.value())?);
        }
        out.reverse();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use florin_crypto::SecretKey;

    /// Books with `n` accounts, each committed in its own transaction, closed cleanly.
    fn books_with_accounts(path: &Path, n: u8) {
        let books = Books::open(path).unwrap();
        for i in 0..n {
            let key = SecretKey::from_seed(&[i + 1; 32]).public_key();
            let rec = AccountRecord {
                name: format!("account-{i}-{}", "x".repeat(40)),
                key_id: format!("psp-test-{i}"),
                scheme: "ed25519".into(),
                public_key: hex::encode(key.0),
                encumbrance: Encumbrance::ed25519(&key).to_text(),
                customer: None,
                engine: None,
            };
            assert!(books.add_account(&rec).unwrap());
        }
        drop(books);
    }

    fn refused(path: &Path) -> String {
        let dir = path.parent().unwrap();
        let snapshot = |d: &Path| {
            let mut v: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| {
                    let p = e.unwrap().path();
                    let b = std::fs::read(&p).unwrap();
                    (p, b)
                })
                .collect();
            v.sort();
            v
        };
        let before = snapshot(dir);
        let e = match Books::open(path) {
            Ok(_) => panic!("damaged books opened"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&path.display().to_string()), "{e}");
        assert_eq!(
            snapshot(dir),
            before,
            "a refused open changed the directory"
        );
        e
    }

    /// Every copy on disk of `needle` (a freed page may still hold an old one).
    fn copies(file: &[u8], needle: &[u8]) -> Vec<usize> {
        file.windows(needle.len())
            .enumerate()
            .filter(|(_, w)| *w == needle)
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn damaged_truncated_emptied_or_lost_books_refuse_to_open_and_change_nothing() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("psp.redb");
        books_with_accounts(&path, 3);
        assert!(created_marker(&path).exists());
        let good = std::fs::read(&path).unwrap();
        assert_eq!(Books::open(&path).unwrap().accounts().unwrap().len(), 3);
        let good_after_open = std::fs::read(&path).unwrap();

        let first = copies(&good_after_open, b"account-0-xxxxxxxx");
        let last = copies(&good_after_open, b"account-2-xxxxxxxx");
        assert!(!first.is_empty() && !last.is_empty());
        type Damage = Box<dyn Fn(&mut Vec<u8>)>;
        let damage: Vec<(&str, Damage)> = vec![
            ("magic", Box::new(|b| b[3] ^= 1)),
            ("primary bit", Box::new(|b| b[9] ^= 1)),
            (
                "primary commit slot",
                Box::new(|b| {
                    let slot = 64 + 128 * usize::from(b[9] & 1);
                    b[slot + 8] ^= 1
                }),
            ),
            (
                "first account",
                Box::new(move |b| first.iter().for_each(|&o| b[o + 12] ^= 1)),
            ),
            (
                "last account",
                Box::new(move |b| last.iter().for_each(|&o| b[o + 17] ^= 1)),
            ),
            ("header cut", Box::new(|b| b.truncate(200))),
            ("half cut", Box::new(|b| b.truncate(b.len() / 2))),
            ("last byte cut", Box::new(|b| b.truncate(b.len() - 1))),
            ("emptied", Box::new(|b| b.clear())),
        ];
        for (what, f) in damage {
            let mut bad = good_after_open.clone();
            f(&mut bad);
            std::fs::write(&path, &bad).unwrap();
            let e = refused(&path);
            eprintln!("{what}: {e}");
        }
        // Deleted while the marker says the books existed: refused, not recreated.
        std::fs::remove_file(&path).unwrap();
        let e = refused(&path);
        assert!(e.contains("missing"), "{e}");
        assert!(!path.exists());
        // Put back, the books open with every account.
        std::fs::write(&path, &good).unwrap();
        assert_eq!(Books::open(&path).unwrap().accounts().unwrap().len(), 3);
    }
}

//! The authority's registry as replicated state: every write is a **write set** (the rows it
//! puts and removes) replicated by Raft and applied, in log order, to every replica's redb file.
//!
//! Why write sets rather than commands: the authority's operations are not deterministic —
//! minting draws random serials and nonces, deposits and withdrawals sign with the authority's
//! key (in production a threshold network, whose signatures differ run to run), the mailbox
//! dates messages with the clock. A replica that re-ran a command would reach another state.
//! So an operation runs once, on the replica that took the request, against its registry
//! inside a redb write transaction that is **never committed**: [`RegTx`] records each insert
//! and remove, aborts, and hands the rows to the group. Applying a write set is then pure data
//! (puts and removes), the same bytes on every replica.
//!
//! Serialization is optimistic: a write set carries the registry **version** (count of write
//! sets applied) it was computed on, and is applied only if that is still the version when its
//! entry is applied; otherwise it is answered [`Applied::Conflict`], changes nothing, and the
//! operation runs again on the newer state ([`crate::Authority`] retries a bounded number of
//! times). Two sentinels can therefore never both take the last reserve output or both
//! answer a withdrawal with different tokens: whichever entry the log orders second is refused
//! and re-run, and then sees the first. Re-applying the log after a restart is harmless for the
//! same reason (an entry whose base is behind the registry is a conflict and changes nothing).
//!
//! A write set is applied with the rows' byte encodings, table by table: the tables are the
//! registry's own (`store.rs`), addressed by their index in [`TABLES`]; a set naming another
//! table, or rows whose lengths do not fit the table's types, is refused whole (the same way on
//! every replica).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redb::{
    Key, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
    Value,
};
use serde::{Deserialize, Serialize};

use crate::error::NodeError;
use crate::store::{
    ADMIN_LOG, BLACKLIST, CREDITS, FRAUD, ISSUANCE, MAILBOX, MAILBOX_AGES, MAILBOX_USAGE, META,
    OPERATOR_NONCES, REGISTRY_SETS, REGISTRY_SET_ORDER, RESERVE, REVOKED, TOKENS, WITHDRAWALS,
};

/// The registry's tables, by the index a write set names them with. Append only: an index
/// never changes meaning.
pub(crate) const TABLES: [&str; 16] = [
    "tokens_v1",
    "fraud_v1",
    "mailbox_v1",
    "mailbox_usage_v1",
    "mailbox_ages_v1",
    "reserve_v1",
    "credits_v1",
    "withdrawals_v1",
    "issuance_v1",
    "blacklist_v1",
    "revoked_v1",
    "admin_log_v1",
    "meta_v1",
    "registry_sets_v1",
    "registry_set_order_v1",
    "operator_nonces_v1",
];

/// Index in [`TABLES`] of `META`.
const META_TABLE: u8 = 12;
/// Indices in [`TABLES`] of the tables only applying writes (the applied sets' ids): a write
/// set may not touch them.
const GROUP_TABLES: [u8; 2] = [13, 14];

/// Applied write sets remembered by id (a resend of one older than this many sets is a
/// conflict, and its operation runs again).
pub const SET_MEMORY: u64 = 100_000;

/// The registry's version in `META`: how many write sets it has applied. Operations never
/// write it; applying a write set does.
pub(crate) const VERSION: &str = "registry_version";

/// One row put (`value` some) or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The table's index in [`TABLES`].
    pub table: u8,
    /// The key's bytes (the table's key type's encoding).
    #[serde(with = "florin_ledger::bin_serde::bytes")]
    pub key: Vec<u8>,
    /// The value's bytes, or `None` to remove the row.
    pub value: Option<ByteVec>,
}

/// Bytes encoded as one byte string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteVec(#[serde(with = "florin_ledger::bin_serde::bytes")] pub Vec<u8>);

/// What one operation wrote, and the registry version it read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteSet {
    /// The version the operation ran on.
    pub base: u64,
    /// A random id: the set delivered again is answered as the first time.
    pub id: [u8; 16],
    /// Its rows, in the order written.
    pub changes: Vec<Change>,
}

/// A replica's answer to a write set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// Applied: the registry is now at `version`.
    Done {
        /// The version after it.
        version: u64,
    },
    /// Not applied: the registry was at `version`, not the set's base (run the operation again).
    Conflict {
        /// The registry's version.
        version: u64,
    },
    /// Not applied, and never will be: the set is malformed.
    Refused(String),
}

/// How a replicated authority hands write sets to its group.
pub trait Replicate: Send + Sync + 'static {
    /// Replicates `set` (an encoded [`WriteSet`]) through the group's leader and returns the
    /// applied answer (an encoded [`Applied`]). Blocking; an error means the group could not
    /// be reached or did not answer (the set may or may not have been applied: the caller
    /// runs the operation again, and a set that did apply makes it a conflict).
    fn replicate(&self, set: Vec<u8>) -> Result<Vec<u8>, NodeError>;
    /// Waits (bounded) until this replica's registry has applied `version`.
    fn wait_applied(&self, version: u64);
    /// A read barrier: waits until this replica has applied everything the group's leader had
    /// applied when asked (an error if the leader cannot be asked, or the replica does not
    /// catch up in time).
    fn sync(&self) -> Result<(), NodeError>;
}

/// A registry write transaction: redb's, recording what it writes when the registry is
/// replicated. Commit with [`RegTx::commit`].
pub(crate) struct RegTx {
    tx: redb::WriteTransaction,
    log: Option<RefCell<Vec<Change>>>,
    base: u64,
}

/// What committing a [`RegTx`] did.
pub(crate) enum Committed {
    /// Durable (and, when replicated, applied by the group).
    Done,
    /// Another write came first: run the operation again on the registry as it is now.
    Conflict,
}

impl RegTx {
    /// Begins a write on `db`; `recording` when the registry is replicated.
    pub(crate) fn begin(db: &redb::Database, recording: bool) -> Result<RegTx, NodeError> {
        let mut tx = db.begin_write()?;
        tx.set_two_phase_commit(true);
        let base = if recording {
            tx.open_table(META)?.get(VERSION)?.map_or(0, |v| v.value())
        } else {
            0
        };
        Ok(RegTx {
            tx,
            log: recording.then(|| RefCell::new(Vec::new())),
            base,
        })
    }

    /// The registry version the transaction reads (0 when not recording).
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    /// Whether it has written anything (always `true` when not recording: unknown).
    pub(crate) fn has_changes(&self) -> bool {
        self.log.as_ref().is_none_or(|l| !l.borrow().is_empty())
    }

    /// Opens one of the registry's tables for reading and writing.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        def: TableDefinition<K, V>,
    ) -> Result<RegTable<'_, K, V>, NodeError> {
        let id = TABLES
            .iter()
            .position(|n| *n == def.name())
            .and_then(|i| u8::try_from(i).ok())
            .ok_or_else(|| NodeError::storage(format!("{} is not a registry table", def.name())))?;
        Ok(RegTable {
            table: self.tx.open_table(def)?,
            id,
            log: self.log.as_ref(),
        })
    }

    /// redb's transaction (reads and the consistent copy of a backup; writes go through
    /// [`RegTx::open_table`]).
    pub(crate) fn inner(&self) -> &redb::WriteTransaction {
        &self.tx
    }

    /// Aborts: nothing written.
    pub(crate) fn abort(self) -> Result<(), NodeError> {
        self.tx.abort()?;
        Ok(())
    }

    /// Commits: locally, or through the group (`replicate`) when recording.
    pub(crate) fn commit(self, replicate: Option<&dyn Replicate>) -> Result<Committed, NodeError> {
        let (Some(log), Some(group)) = (self.log, replicate) else {
            self.tx.commit()?;
            return Ok(Committed::Done);
        };
        let changes = log.into_inner();
        // The registry changes only by applied write sets, also on this replica.
        self.tx.abort()?;
        if changes.is_empty() {
            return Ok(Committed::Done);
        }
        let mut id = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut id);
        let set = encode(&WriteSet {
            base: self.base,
            id,
            changes,
        });
        let answer = group.replicate(set)?;
        match decode::<Applied>(&answer) {
            Some(Applied::Done { version }) => {
                group.wait_applied(version);
                Ok(Committed::Done)
            }
            Some(Applied::Conflict { version }) => {
                group.wait_applied(version);
                Ok(Committed::Conflict)
            }
            Some(Applied::Refused(why)) => Err(NodeError::storage(format!(
                "the authority group refused a registry write: {why}"
            ))),
            None => Err(NodeError::storage(
                "the authority group's answer to a registry write does not decode",
            )),
        }
    }
}

/// A table of a [`RegTx`]: reads as redb's table (it dereferences to it); `insert` and
/// `remove` are recorded when the registry is replicated.
pub(crate) struct RegTable<'t, K: Key + 'static, V: Value + 'static> {
    table: redb::Table<'t, K, V>,
    id: u8,
    log: Option<&'t RefCell<Vec<Change>>>,
}

impl<'t, K: Key + 'static, V: Value + 'static> std::ops::Deref for RegTable<'t, K, V> {
    type Target = redb::Table<'t, K, V>;
    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl<K: Key + 'static, V: Value + 'static> RegTable<'_, K, V> {
    /// Puts a row (as redb's `insert`).
    pub(crate) fn insert<'k, 'v>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
        value: impl std::borrow::Borrow<V::SelfType<'v>>,
    ) -> Result<Option<redb::AccessGuard<'_, V>>, redb::StorageError> {
        if let Some(log) = self.log {
            log.borrow_mut().push(Change {
                table: self.id,
                key: K::as_bytes(key.borrow()).as_ref().to_vec(),
                value: Some(ByteVec(V::as_bytes(value.borrow()).as_ref().to_vec())),
            });
        }
        self.table.insert(key, value)
    }

    /// Removes a row (as redb's `remove`).
    pub(crate) fn remove<'k>(
        &mut self,
        key: impl std::borrow::Borrow<K::SelfType<'k>>,
    ) -> Result<Option<redb::AccessGuard<'_, V>>, redb::StorageError> {
        if let Some(log) = self.log {
            log.borrow_mut().push(Change {
                table: self.id,
                key: K::as_bytes(key.borrow()).as_ref().to_vec(),
                value: None,
            });
        }
        self.table.remove(key)
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

fn decode<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Option<T> {
    postcard::from_bytes(b).ok()
}

/// What to do to one table.
enum TableOp<'a> {
    Put(&'a [u8], &'a [u8]),
    Remove(&'a [u8]),
    Clear,
    Dump(&'a mut Vec<Change>),
}

/// Whether `bytes` can be the encoding of a `T` (redb's decoders assume they are).
fn fits<T: Value>(bytes: &[u8], is_str: bool) -> bool {
    T::fixed_width().is_none_or(|w| w == bytes.len())
        && (!is_str || std::str::from_utf8(bytes).is_ok())
}

fn on_table<K: Key + 'static, V: Value + 'static>(
    tx: &redb::WriteTransaction,
    def: TableDefinition<K, V>,
    id: u8,
    op: TableOp<'_>,
) -> Result<Result<(), String>, NodeError> {
    let str_keys = def.name() == "meta_v1";
    match op {
        TableOp::Put(k, v) => {
            if !fits::<K>(k, str_keys) || !fits::<V>(v, false) {
                return Ok(Err(format!("a row that does not fit table {}", def.name())));
            }
            tx.open_table(def)?
                .insert(K::from_bytes(k), V::from_bytes(v))?;
        }
        TableOp::Remove(k) => {
            if !fits::<K>(k, str_keys) {
                return Ok(Err(format!("a key that does not fit table {}", def.name())));
            }
            tx.open_table(def)?.remove(K::from_bytes(k))?;
        }
        TableOp::Clear => {
            tx.delete_table(def)?;
            tx.open_table(def)?;
        }
        TableOp::Dump(out) => {
            for item in tx.open_table(def)?.iter()? {
                let (k, v) = item?;
                out.push(Change {
                    table: id,
                    key: K::as_bytes(&k.value()).as_ref().to_vec(),
                    value: Some(ByteVec(V::as_bytes(&v.value()).as_ref().to_vec())),
                });
            }
        }
    }
    Ok(Ok(()))
}

/// Runs `op` on table `id`; `Ok(Err(why))` for a table or row the registry does not have.
fn table_op(
    tx: &redb::WriteTransaction,
    id: u8,
    op: TableOp<'_>,
) -> Result<Result<(), String>, NodeError> {
    match id {
        0 => on_table(tx, TOKENS, id, op),
        1 => on_table(tx, FRAUD, id, op),
        2 => on_table(tx, MAILBOX, id, op),
        3 => on_table(tx, MAILBOX_USAGE, id, op),
        4 => on_table(tx, MAILBOX_AGES, id, op),
        5 => on_table(tx, RESERVE, id, op),
        6 => on_table(tx, CREDITS, id, op),
        7 => on_table(tx, WITHDRAWALS, id, op),
        8 => on_table(tx, ISSUANCE, id, op),
        9 => on_table(tx, BLACKLIST, id, op),
        10 => on_table(tx, REVOKED, id, op),
        11 => on_table(tx, ADMIN_LOG, id, op),
        12 => on_table(tx, META, id, op),
        13 => on_table(tx, REGISTRY_SETS, id, op),
        14 => on_table(tx, REGISTRY_SET_ORDER, id, op),
        15 => on_table(tx, OPERATOR_NONCES, id, op),
        other => Ok(Err(format!("no registry table {other}"))),
    }
}

/// Applies an encoded [`WriteSet`] to `db` in one durable transaction, if its base is the
/// registry's version. Deterministic: the answer and the state depend only on the registry
/// and the bytes.
pub fn apply(db: &redb::Database, set: &[u8]) -> Result<Applied, NodeError> {
    let Some(set) = decode::<WriteSet>(set) else {
        return Ok(Applied::Refused("a write set that does not decode".into()));
    };
    let mut tx = db.begin_write()?;
    tx.set_two_phase_commit(true);
    let version = tx.open_table(META)?.get(VERSION)?.map_or(0, |v| v.value());
    // Delivered before (a resend): the first answer.
    let before = tx
        .open_table(REGISTRY_SETS)?
        .get(set.id.as_slice())?
        .map(|v| v.value());
    if let Some(v) = before {
        tx.abort()?;
        return Ok(Applied::Done { version: v });
    }
    if set.base != version {
        tx.abort()?;
        return Ok(Applied::Conflict { version });
    }
    for c in &set.changes {
        let op = match &c.value {
            Some(v) => TableOp::Put(&c.key, &v.0),
            None => TableOp::Remove(&c.key),
        };
        let meta_version = c.table == META_TABLE && c.key == VERSION.as_bytes();
        let outcome = if meta_version {
            Err("a write set may not set the registry version".into())
        } else if GROUP_TABLES.contains(&c.table) {
            Err("a write set may not write the applied sets' ids".into())
        } else {
            table_op(&tx, c.table, op)?
        };
        if let Err(why) = outcome {
            tx.abort()?;
            return Ok(Applied::Refused(why));
        }
    }
    let now = version + 1;
    tx.open_table(META)?.insert(VERSION, now)?;
    {
        let mut ids = tx.open_table(REGISTRY_SETS)?;
        let mut order = tx.open_table(REGISTRY_SET_ORDER)?;
        ids.insert(set.id.as_slice(), now)?;
        order.insert(now, set.id.as_slice())?;
        if now > SET_MEMORY {
            let old = order.remove(now - SET_MEMORY)?.map(|v| v.value().to_vec());
            if let Some(old) = old {
                ids.remove(old.as_slice())?;
            }
        }
    }
    tx.commit()?;
    Ok(Applied::Done {
        version: version + 1,
    })
}

/// The whole registry as bytes ([`restore`] takes them): every row of every table.
pub fn dump(db: &redb::Database) -> Result<Vec<u8>, NodeError> {
    // A write transaction (aborted) reads the same as a read one and lets one helper serve
    // both; it also keeps writers out while the copy is taken.
    let tx = db.begin_write()?;
    let mut rows = Vec::new();
    for id in 0..TABLES.len() as u8 {
        if let Err(why) = table_op(&tx, id, TableOp::Dump(&mut rows))? {
            return Err(NodeError::storage(why));
        }
    }
    tx.abort()?;
    let version = rows
        .iter()
        .find(|c| c.table == META_TABLE && c.key == VERSION.as_bytes())
        .and_then(|c| c.value.as_ref())
        .and_then(|v| <[u8; 8]>::try_from(v.0.as_slice()).ok())
        .map_or(0, u64::from_le_bytes);
    let rows: Vec<Change> = rows
        .into_iter()
        .filter(|c| !(c.table == META_TABLE && c.key == VERSION.as_bytes()))
        .collect();
    Ok(encode(&WriteSet {
        base: version,
        id: [0; 16],
        changes: rows,
    }))
}

/// Why a snapshot of the registry is refused.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// The bytes do not decode, or name rows the registry cannot hold.
    #[error("registry snapshot refused: {0}")]
    Refused(String),
    /// The registry could not be written.
    #[error("registry snapshot not installed: {0}")]
    Storage(#[from] NodeError),
}

/// Replaces the whole registry in `db` by a [`dump`], in one durable transaction.
pub fn restore(db: &redb::Database, snapshot: &[u8]) -> Result<u64, RestoreError> {
    let set = decode::<WriteSet>(snapshot)
        .ok_or_else(|| RestoreError::Refused("a snapshot that does not decode".into()))?;
    let mut tx = db.begin_write().map_err(NodeError::from)?;
    tx.set_two_phase_commit(true);
    for id in 0..TABLES.len() as u8 {
        table_op(&tx, id, TableOp::Clear)?.map_err(RestoreError::Refused)?;
    }
    for c in &set.changes {
        let Some(v) = &c.value else {
            return Err(RestoreError::Refused(
                "a snapshot row without a value".into(),
            ));
        };
        table_op(&tx, c.table, TableOp::Put(&c.key, &v.0))?.map_err(RestoreError::Refused)?;
    }
    tx.open_table(META)
        .map_err(NodeError::from)?
        .insert(VERSION, set.base)
        .map_err(NodeError::from)?;
    tx.commit().map_err(NodeError::from)?;
    Ok(set.base)
}

/// Installs a snapshot of the group's registry unless this registry already holds it: its
/// version is the snapshot's or later (both are prefixes of the same log of write sets, so
/// the later holds the earlier). Raft installs the replica's last snapshot at every start and
/// then re-applies the log after it; sets this registry already applied are answered as
/// before and change nothing, so skipping the install never rolls the registry back to the
/// snapshot (its reads would be older than what it served before the restart) nor rewrites it
/// whole at each start. Returns the registry's version.
pub fn install(db: &redb::Database, snapshot: &[u8]) -> Result<u64, RestoreError> {
    let set = decode::<WriteSet>(snapshot)
        .ok_or_else(|| RestoreError::Refused("a snapshot that does not decode".into()))?;
    let now = version(db)?;
    if now >= set.base {
        return Ok(now);
    }
    restore(db, snapshot)
}

/// Refuses to serve as a replica a registry that holds rows but no version: one made by a
/// single authority, whose state no other replica has (applying the group's write sets on
/// top of it would make replicas that differ while their versions agree).
pub fn check_replica(db: &redb::Database, dir: &std::path::Path) -> Result<(), NodeError> {
    if version(db)? > 0 {
        return Ok(());
    }
    let r = db.begin_read()?;
    let holds = r.open_table(TOKENS)?.len()? > 0
        || r.open_table(META)?.len()? > 0
        || r.open_table(MAILBOX)?.len()? > 0
        || r.open_table(RESERVE)?.len()? > 0
        || r.open_table(ISSUANCE)?.len()? > 0
        || r.open_table(FRAUD)?.len()? > 0;
    if holds {
        return Err(NodeError::corrupt(format!(
            "the registry in {} was made by a single authority (it holds rows but no replica \
             version): it cannot join an authority group; keep it on a cluster without an \
             [authority] group",
            dir.display()
        )));
    }
    Ok(())
}

/// The registry's version as stored.
pub fn version(db: &redb::Database) -> Result<u64, NodeError> {
    let r = db.begin_read()?;
    let v = r.open_table(META)?.get(VERSION)?.map_or(0, |v| v.value());
    Ok(v)
}

/// The registry as a Raft state machine: write sets applied to the replica's redb file.
///
/// A replica whose file cannot be written cannot go on without leaving the group's state: it
/// stops the process (`exit` 74) after saying why, and on restart re-applies the log.
pub struct RegistryMachine {
    db: Arc<redb::Database>,
    applied: Arc<AtomicU64>,
}

impl RegistryMachine {
    /// The registry version it has applied.
    pub fn version(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// The machine over `db`, whose version it reports through `applied`.
    pub fn new(db: Arc<redb::Database>, applied: Arc<AtomicU64>) -> Result<Self, NodeError> {
        applied.store(version(&db)?, Ordering::Release);
        Ok(RegistryMachine { db, applied })
    }
}

fn fatal(what: &str, e: &NodeError) -> ! {
    tracing::error!(
        "FATAL florin authority replica: {what}: {e}; stopping (the log is re-applied on restart)"
    );
    std::process::exit(74)
}

impl florin_cluster::raft::Machine for RegistryMachine {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        match apply(&self.db, cmd) {
            Ok(a) => {
                if let Applied::Done { version } = a {
                    // A set delivered twice is answered with its first (older) version: the
                    // applied version never goes back.
                    self.applied.fetch_max(version, Ordering::AcqRel);
                }
                encode(&a)
            }
            Err(e) => fatal("a registry write could not be applied", &e),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        match dump(&self.db) {
            Ok(b) => b,
            Err(e) => fatal("the registry could not be read for a snapshot", &e),
        }
    }

    type Error = RestoreError;

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), RestoreError> {
        let v = install(&self.db, snapshot)?;
        self.applied.store(v, Ordering::Release);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::{Authority, AuthorityConfig};
    use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signer};
    use std::path::Path;
    use std::sync::Mutex;

    /// A group in one process: applies each set to every replica's registry in order, as the
    /// Raft log would, and answers with the first's (the writer's) answer. `interleave` sets
    /// are applied first, as if another sentinel's writes were ordered before this one.
    struct Group {
        dbs: Vec<Arc<redb::Database>>,
        interleave: Mutex<Vec<Vec<u8>>>,
    }

    impl Replicate for Group {
        fn replicate(&self, set: Vec<u8>) -> Result<Vec<u8>, NodeError> {
            let pending: Vec<Vec<u8>> = std::mem::take(&mut *self.interleave.lock().unwrap());
            for s in pending.iter().chain(std::iter::once(&set)) {
                let answers: Vec<Applied> =
                    self.dbs.iter().map(|db| apply(db, s).unwrap()).collect();
                assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
                if s == &set {
                    return Ok(encode(&answers[0]));
                }
            }
            unreachable!()
        }
        fn wait_applied(&self, _: u64) {}
        fn sync(&self) -> Result<(), NodeError> {
            Ok(())
        }
    }

    fn signer() -> Arc<dyn Signer> {
        Arc::new(LocalSigner::new(SecretKey::from_seed(&[5; 32])))
    }

    fn key(i: u8) -> PublicKey {
        LocalSigner::new(SecretKey::from_seed(&[i; 32])).public_key()
    }

    fn replica(dir: &Path) -> Authority {
        Authority::open_replicated(AuthorityConfig::devnet(dir), signer()).unwrap()
    }

    fn other_db(dir: &Path) -> Arc<redb::Database> {
        let a = replica(dir);
        a.registry_db()
    }

    #[test]
    fn replicas_that_apply_the_same_write_sets_hold_the_same_registry() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = replica(d1.path());
        // Not joined yet: a write is refused, and nothing is written.
        let err = a.mint(key(1), 100, [0; 32]).unwrap_err();
        assert_eq!(err.code(), "unavailable", "{err}");
        let group = Arc::new(Group {
            dbs: vec![a.registry_db(), other_db(d2.path())],
            interleave: Mutex::new(Vec::new()),
        });
        a.join(group.clone());
        let tokens = a.mint(key(1), 350, [1; 32]).unwrap();
        assert!(!tokens.is_empty());
        a.mailbox_put(&key(2), b"sealed handoff").unwrap();
        a.blacklist_by(&tokens[0].serial, None, "lost").unwrap();
        a.revoke(&key(3), None, "stolen").unwrap();
        a.unrevoke(&key(3), None, "found").unwrap();
        // The writer reads its own writes; the other replica holds exactly the same rows.
        assert_eq!(a.mailbox_get(&key(2), 0).unwrap().len(), 1);
        assert_eq!(a.admin_log().unwrap().len(), 3);
        let (s1, s2) = (dump(&group.dbs[0]).unwrap(), dump(&group.dbs[1]).unwrap());
        assert_eq!(s1, s2);
        assert_eq!(version(&group.dbs[1]).unwrap(), 5);
        // A read-only operation writes nothing, so no version is spent on it.
        a.revoke(&key(4), None, "x").unwrap();
        a.revoke(&key(4), None, "again").unwrap();
        assert_eq!(version(&group.dbs[1]).unwrap(), 6);

        // A replica that is already past a snapshot keeps what it has (a restart installs
        // the last snapshot, then re-applies the log after it).
        let at6 = dump(&group.dbs[0]).unwrap();
        a.mailbox_put(&key(2), b"after").unwrap();
        let at7 = dump(&group.dbs[0]).unwrap();
        assert_eq!(install(&group.dbs[0], &at6).unwrap(), 7);
        assert_eq!(dump(&group.dbs[0]).unwrap(), at7);

        // A snapshot installs the whole registry elsewhere, version included.
        let d3 = tempfile::tempdir().unwrap();
        let db3 = other_db(d3.path());
        assert_eq!(install(&db3, &dump(&group.dbs[0]).unwrap()).unwrap(), 7);
        assert_eq!(dump(&db3).unwrap(), dump(&group.dbs[1]).unwrap());
    }

    #[test]
    fn a_write_another_came_before_runs_again_on_the_newer_registry() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = replica(d1.path());
        let b = replica(d2.path());
        let group = Arc::new(Group {
            dbs: vec![a.registry_db(), b.registry_db()],
            interleave: Mutex::new(Vec::new()),
        });
        a.join(group.clone());
        b.join(group.clone());
        a.mailbox_put(&key(2), b"first").unwrap();
        // What B would write for the same mailbox, computed now (on version 1)...
        let mut rec = RegTx::begin(&b.registry_db(), true).unwrap();
        {
            let mut t = rec.open_table(MAILBOX).unwrap();
            t.insert([7u8; 40].as_slice(), b"foreign".as_slice())
                .unwrap();
        }
        let foreign = encode(&WriteSet {
            base: rec.base,
            id: [7; 16],
            changes: rec.log.take().unwrap().into_inner(),
        });
        rec.abort().unwrap();
        // ...is ordered before A's next write: A's first attempt conflicts, runs again on the
        // registry with B's row, and both rows are there, once each.
        group.interleave.lock().unwrap().push(foreign.clone());
        let seq = a.mailbox_put(&key(2), b"second").unwrap();
        assert_eq!(a.mailbox_get(&key(2), 0).unwrap().len(), 2);
        assert_eq!(seq, 2, "the second message takes the next number once");
        // Three sets applied: A's first, B's, and A's second (its first attempt changed nothing).
        assert_eq!(version(&group.dbs[0]).unwrap(), 3);
        let r = group.dbs[0].begin_read().unwrap();
        let t = r.open_table(MAILBOX).unwrap();
        assert!(t.get([7u8; 40].as_slice()).unwrap().is_some());
        assert_eq!(dump(&group.dbs[0]).unwrap(), dump(&group.dbs[1]).unwrap());
        // Delivered again (the group's client resent it, or the log is re-applied after a
        // restart), it changes nothing and gets its first answer.
        let before = dump(&group.dbs[0]).unwrap();
        assert_eq!(
            apply(&group.dbs[0], &foreign).unwrap(),
            Applied::Done { version: 2 }
        );
        assert_eq!(dump(&group.dbs[0]).unwrap(), before);
        // Another set computed on the same old registry is a conflict.
        let mut other: WriteSet = decode(&foreign).unwrap();
        other.id = [8; 16];
        assert_eq!(
            apply(&group.dbs[0], &encode(&other)).unwrap(),
            Applied::Conflict { version: 3 }
        );
    }

    #[test]
    fn an_operator_credential_taken_by_one_replica_is_refused_by_the_others() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (a, b) = (replica(d1.path()), replica(d2.path()));
        let group = Arc::new(Group {
            dbs: vec![a.registry_db(), b.registry_db()],
            interleave: Mutex::new(Vec::new()),
        });
        a.join(group.clone());
        b.join(group.clone());
        let op = SecretKey::from_seed(&[40; 32]);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let cred = |ts: u64, n: u8| {
            crate::operator::Credential::sign(&op, "POST", "/v1/admin/revoke", b"{}", ts, [n; 16])
        };
        a.use_operator_credential(&cred(now, 1)).unwrap();
        // The same credential at the other sentinel: a replay.
        let err = b.use_operator_credential(&cred(now, 1)).unwrap_err();
        assert_eq!(err.code(), "operator_refused", "{err}");
        b.use_operator_credential(&cred(now, 2)).unwrap();
        // Those whose time has passed are forgotten as new ones come.
        a.use_operator_credential(&cred(now - 1_000, 3)).unwrap();
        a.use_operator_credential(&cred(now, 4)).unwrap();
        let r = a.registry_db().begin_read().unwrap();
        assert_eq!(r.open_table(OPERATOR_NONCES).unwrap().len().unwrap(), 3);
        // A registry that is not replicated leaves it to its gate.
        let d3 = tempfile::tempdir().unwrap();
        let solo = Authority::open(AuthorityConfig::devnet(d3.path()), signer()).unwrap();
        solo.use_operator_credential(&cred(now, 1)).unwrap();
        solo.use_operator_credential(&cred(now, 1)).unwrap();
    }

    #[test]
    fn a_set_delivered_twice_never_takes_the_applied_version_back() {
        use florin_cluster::raft::Machine;
        let d = tempfile::tempdir().unwrap();
        let db = other_db(d.path());
        let applied = Arc::new(AtomicU64::new(0));
        let mut m = RegistryMachine::new(db.clone(), applied.clone()).unwrap();
        let set = |base: u64, id: u8| {
            encode(&WriteSet {
                base,
                id: [id; 16],
                changes: vec![Change {
                    table: 2,
                    key: vec![id; 40],
                    value: Some(ByteVec(vec![id])),
                }],
            })
        };
        let x = set(0, 1);
        m.apply(&x);
        m.apply(&set(1, 2));
        // X again (the group's client resent it): answered with its first version, 1...
        let again: Applied = decode(&m.apply(&x)).unwrap();
        assert_eq!(again, Applied::Done { version: 1 });
        // ...while the registry, and what the replica reports to read barriers, stay at 2.
        assert_eq!((m.version(), version(&db).unwrap()), (2, 2));
    }

    #[test]
    fn a_single_authoritys_registry_cannot_join_a_group() {
        let d = tempfile::tempdir().unwrap();
        {
            let a = Authority::open(AuthorityConfig::devnet(d.path()), signer()).unwrap();
            a.mint(key(1), 100, [0; 32]).unwrap();
        }
        let err = Authority::open_replicated(AuthorityConfig::devnet(d.path()), signer())
            .err()
            .unwrap();
        assert!(err.to_string().contains("single authority"), "{err}");
        // A new one may.
        let d = tempfile::tempdir().unwrap();
        Authority::open_replicated(AuthorityConfig::devnet(d.path()), signer()).unwrap();
    }

    #[test]
    fn malformed_write_sets_are_refused_whole() {
        let d = tempfile::tempdir().unwrap();
        let db = other_db(d.path());
        let before = dump(&db).unwrap();
        let set = |changes: Vec<Change>| {
            encode(&WriteSet {
                base: 0,
                id: [1; 16],
                changes,
            })
        };
        let good = Change {
            table: 2,
            key: vec![1; 40],
            value: Some(ByteVec(b"ok".to_vec())),
        };
        let cases = [
            // A table the registry does not have.
            vec![
                good.clone(),
                Change {
                    table: 200,
                    ..good.clone()
                },
            ],
            // A key of the wrong width for a u64-keyed table.
            vec![
                good.clone(),
                Change {
                    table: 0,
                    key: vec![1; 3],
                    ..good.clone()
                },
            ],
            // A value of the wrong width for META's u64 values.
            vec![Change {
                table: 12,
                key: b"minted_count".to_vec(),
                value: Some(ByteVec(vec![1])),
            }],
            // A META key that is not text.
            vec![Change {
                table: 12,
                key: vec![0xff, 0xfe],
                value: Some(ByteVec(vec![0; 8])),
            }],
            // The applied sets' ids.
            vec![Change {
                table: 13,
                key: vec![1; 16],
                value: Some(ByteVec(vec![0; 8])),
            }],
            // The version itself.
            vec![Change {
                table: 12,
                key: VERSION.as_bytes().to_vec(),
                value: Some(ByteVec(vec![9; 8])),
            }],
        ];
        for c in cases {
            assert!(
                matches!(apply(&db, &set(c.clone())).unwrap(), Applied::Refused(_)),
                "{c:?}"
            );
        }
        assert!(matches!(
            apply(&db, b"\xff\xff\xff").unwrap(),
            Applied::Refused(_)
        ));
        assert!(restore(&db, b"\x01").is_err());
        assert_eq!(
            dump(&db).unwrap(),
            before,
            "nothing of a refused set was applied"
        );
        assert_eq!(
            apply(&db, &set(vec![good])).unwrap(),
            Applied::Done { version: 1 }
        );
    }
}

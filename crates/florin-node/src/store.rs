//! The authority's registry in redb: one ACID file, crash-safe, every commit fsynced before it
//! returns (redb's `Durability::Immediate`, its default).
//!
//! Why redb: pure Rust (builds in about a minute, no C++ toolchain in CI), a stable file
//! format, ACID transactions with MVCC readers, and the registry's workload — a read-modify-write
//! of a few kilobytes per deposited token — is what a B-tree does well. fjall would also do;
//! RocksDB costs ≈ 45 CPU-minutes to build here.

use redb::{ReadableDatabase, TableDefinition};

/// serial (u64 from the 8 serial bytes, little-endian) → encoded `TokenRecord`.
pub(crate) const TOKENS: TableDefinition<u64, &[u8]> = TableDefinition::new("tokens_v1");
/// proof id (32 bytes) → detected_at (u64 LE) ‖ encoded `FraudProof`.
pub(crate) const FRAUD: TableDefinition<&[u8], &[u8]> = TableDefinition::new("fraud_v1");
/// payment-handoff mailbox: recipient key (32) ‖ sequence (u64 big-endian) → sealed message.
pub(crate) const MAILBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("mailbox_v1");
/// each mailbox's usage: recipient key (32) → messages waiting (u64 LE) ‖ their bytes (u64 LE).
pub(crate) const MAILBOX_USAGE: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("mailbox_usage_v1");
/// mailbox messages by age: put time (unix seconds, u64 big-endian) ‖ recipient (32) ‖ sequence
/// (u64 big-endian) → the message's length (u64 LE); the retention sweep walks it oldest first.
pub(crate) const MAILBOX_AGES: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("mailbox_ages_v1");
/// the authority's reserve on the ledger: UHS id → UTXO encoding (spendable by the authority).
pub(crate) const RESERVE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("reserve_v1");
/// credits recorded but not yet confirmed on the ledger: txid → transaction ‖ change UTXO.
pub(crate) const CREDITS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("credits_v1");
/// withdrawals served: reserve output id → the tokens issued for it.
pub(crate) const WITHDRAWALS: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("withdrawals_v1");
/// the issuer's journal of ledger mints, kept apart from the ledger's own log: txid → value
/// (u64 LE) ‖ state (0: recorded before submission, 1: confirmed by the ledger).
pub(crate) const ISSUANCE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("issuance_v1");
/// blacklisted tokens: serial (as `TOKENS`) → JSON `AdminEntry` (who, when, why).
pub(crate) const BLACKLIST: TableDefinition<u64, &[u8]> = TableDefinition::new("blacklist_v1");
/// revoked wallet keys: key (32 bytes) → JSON `AdminEntry` (who, when, why).
pub(crate) const REVOKED: TableDefinition<&[u8], &[u8]> = TableDefinition::new("revoked_v1");
/// the operators' audit trail, append-only: sequence (from 1) → JSON `AdminLogEntry`.
pub(crate) const ADMIN_LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("admin_log_v1");
/// counters: "minted_count", "minted_cents", "issuance_baseline_cents" (ledger mints from
/// before the journal existed), "issuance_baseline_set"; the mailbox's "mailbox_seq" (the last
/// sequence number given, across all mailboxes), "mailbox_bytes" (bytes waiting in all) and
/// "mailbox_indexed" (set once messages from before the quotas are counted).
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta_v1");
/// A replicated registry's applied write sets, by id (16 random bytes) → the registry version
/// after it: a set delivered twice (its answer was lost and the group's client resent it) is
/// answered as the first time. Bounded: see `REGISTRY_SET_ORDER`.
pub(crate) const REGISTRY_SETS: TableDefinition<&[u8], u64> =
    TableDefinition::new("registry_sets_v1");
/// Operator credentials used on a replicated registry (so a credential accepted by one
/// sentinel is refused as replayed by the others): acceptable-until time (unix seconds,
/// big-endian) ‖ operator key (32) ‖ nonce (16) → nothing; swept once the time has passed.
pub(crate) const OPERATOR_NONCES: TableDefinition<&[u8], &[u8]> =
    TableDefinition::new("operator_nonces_v1");
/// The same, by version → id, so the oldest are forgotten (`registry::SET_MEMORY` kept).
pub(crate) const REGISTRY_SET_ORDER: TableDefinition<u64, &[u8]> =
    TableDefinition::new("registry_set_order_v1");

pub(crate) fn serial_key(serial: &[u8; 8]) -> u64 {
    u64::from_le_bytes(*serial)
}

/// Creates the tables so readers never meet a missing one.
pub(crate) fn init(db: &redb::Database) -> Result<(), crate::NodeError> {
    let mut tx = db.begin_write()?;
    tx.set_two_phase_commit(true);
    {
        tx.open_table(TOKENS)?;
        tx.open_table(FRAUD)?;
        tx.open_table(META)?;
        tx.open_table(MAILBOX)?;
        tx.open_table(RESERVE)?;
        tx.open_table(CREDITS)?;
        tx.open_table(WITHDRAWALS)?;
        tx.open_table(ISSUANCE)?;
        tx.open_table(MAILBOX_USAGE)?;
        tx.open_table(MAILBOX_AGES)?;
        tx.open_table(BLACKLIST)?;
        tx.open_table(REVOKED)?;
        tx.open_table(ADMIN_LOG)?;
        tx.open_table(REGISTRY_SETS)?;
        tx.open_table(REGISTRY_SET_ORDER)?;
        tx.open_table(OPERATOR_NONCES)?;
    }
    tx.commit()?;
    let _ = db.begin_read()?;
    Ok(())
}

/// Copies every table as the write transaction `src` sees it (holding it keeps every other
/// writer out) into a new database at `to`, which must not exist.
pub(crate) fn copy_consistent(
    src: &redb::WriteTransaction,
    to: &std::path::Path,
) -> Result<(), crate::NodeError> {
    use redb::ReadableTable;
    let dst = crate::redb_open::open_strict(to, crate::redb_open::Expect::FirstStart)
        .map_err(crate::error::IoError::from)?;
    let mut w = dst.begin_write()?;
    w.set_two_phase_commit(true);
    {
        let (from, mut into) = (src.open_table(TOKENS)?, w.open_table(TOKENS)?);
        for item in from.iter()? {
            let (k, v) = item?;
            into.insert(k.value(), v.value())?;
        }
        for t in [
            FRAUD,
            OPERATOR_NONCES,
            MAILBOX,
            MAILBOX_USAGE,
            MAILBOX_AGES,
            RESERVE,
            CREDITS,
            WITHDRAWALS,
            ISSUANCE,
            REVOKED,
        ] {
            let (from, mut into) = (src.open_table(t)?, w.open_table(t)?);
            for item in from.iter()? {
                let (k, v) = item?;
                into.insert(k.value(), v.value())?;
            }
        }
        {
            let (from, mut into) = (src.open_table(REGISTRY_SETS)?, w.open_table(REGISTRY_SETS)?);
            for item in from.iter()? {
                let (k, v) = item?;
                into.insert(k.value(), v.value())?;
            }
        }
        for t in [BLACKLIST, ADMIN_LOG, REGISTRY_SET_ORDER] {
            let (from, mut into) = (src.open_table(t)?, w.open_table(t)?);
            for item in from.iter()? {
                let (k, v) = item?;
                into.insert(k.value(), v.value())?;
            }
        }
        let (from, mut into) = (src.open_table(META)?, w.open_table(META)?);
        for item in from.iter()? {
            let (k, v) = item?;
            into.insert(k.value(), v.value())?;
        }
    }
    w.commit()?;
    Ok(())
}

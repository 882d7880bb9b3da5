//! Florin's durable swap stores: implementations of [`florin_ledger::SwapStore`] that keep the
//! ledger's unspent set across restarts.
//!
//! - [`embedded`]: the default store, [`embedded::EmbeddedStore`]: the unspent set in memory,
//!   made durable by a group-committed write-ahead log, snapshots and an acknowledgement mark,
//!   with recovery that cuts only a provably torn tail and refuses to open on any other damage;
//! - [`pg`]: [`pg::PgStore`], `swap` as a stored function in PostgreSQL, for operators who
//!   prefer an existing database.
//!
//! The formats, validation, the [`SwapStore`](florin_ledger::SwapStore) contract with its shared
//! test suite ([`florin_ledger::store::testing::run_suite`], which both stores here pass) and the
//! in-memory store stay in `florin-ledger`, which does no I/O; this crate owns the files, the
//! database driver and everything a store does to survive a crash.

pub mod embedded;
pub mod pg;
pub mod pg_tls;

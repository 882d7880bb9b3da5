//! Florin's sharded swap engine (Hamilton, `003_…` sections 4 and 6).
//!
//! - [`route`]: which shard owns an id (by its two-byte prefix, configurable ranges).
//! - [`shard`]: the locking shard as a deterministic state machine (`prepare`, `commit`,
//!   `discard`), replicated by Raft.
//! - [`coordinator`]: the two-phase-commit coordinator as a pure event machine that emits
//!   commands (replicate this, send that to shard s, answer that submitter), and its replicated
//!   log of in-flight batches.
//! - [`raft`]: Raft replication of any deterministic state machine on openraft, with a durable
//!   log of append-only segment files, snapshots and log compaction.
//!
//! Nothing here opens a socket: the services in `florin-node` carry the commands.

pub mod atomizer;
pub mod coordinator;
pub mod raft;
pub mod route;
pub(crate) mod seglog;
pub mod shard;

/// A distributed transaction (batch) id: random, never reused.
pub type Dtx = u128;

//! Hamilton's second architecture, the **atomizer** (`003_…` sections 4.3 and 6), as pure state
//! machines beside the two-phase-commit ones.
//!
//! Where two-phase commit locks inputs on the shards that own them, the atomizer puts every
//! transaction in one global order:
//!
//! 1. A sentinel ([`submit::Submitter`]) sends each compact transaction to the shards owning its
//!    inputs and to the shard owning its txid.
//! 2. Each shard ([`shard::BlockShard`]) checks, at its block height, that the inputs it owns
//!    are unspent (and, for the txid's shard, that the txid is not confirmed), and sends an
//!    [`Attestation`] to the atomizer. Only the txid's shard sends the transaction's body;
//!    the others send its key and the inputs they vouch for, so the atomizer receives each
//!    transaction once (Hamilton's shards each send it whole).
//! 3. The atomizer ([`machine::AtomizerState`], replicated by Raft) collects attestations until
//!    a transaction is complete, rejects it if an input was spent (or its txid confirmed) in a
//!    block after the height it was attested at, or by a transaction earlier in the open block,
//!    and puts it in the open block. Blocks are sealed at intervals, hash-chained, and carry the
//!    transactions the atomizer rejected with why.
//! 4. The atomizer's leader ([`leader::AtomizerLeader`]) sends every sealed block to every
//!    shard; shards apply blocks strictly in order (deleting spent inputs, creating outputs,
//!    recording confirmed and rejected txids) and a shard that is behind is sent the blocks it
//!    lacks from the block log.
//! 5. The txid's shard answers the transaction's status (confirmed in which block and under
//!    which attempt, or rejected and why): the shards are the watchtowers. A sentinel reads at
//!    a height at least the atomizer's committed height when it began, so what it reads is
//!    linearizable.
//!
//! An attestation is valid for [`machine::AtomizerConfig::window`] blocks: the atomizer keeps
//! the spent inputs and txids of that many recent blocks (Hamilton's spent-output cache) and
//! rejects older attestations as stale, so its memory is bounded whatever the load.
//!
//! Confirmed still means committed and durable: a transaction is confirmed once the block
//! holding it is committed by the atomizer's Raft group and applied by its txid's shard (itself
//! a Raft group).

use florin_crypto::Digest;
use florin_ledger::CompactTx;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::route::ShardId;

pub mod blocklog;
pub mod leader;
pub mod machine;
pub mod replicated;
pub mod shard;
pub mod submit;

/// A block's height: the first block is 1; 0 is the state before any block.
pub type Height = u64;

/// One try of a sentinel at a transaction (random, so different sentinels' tries differ): a
/// block records the try it included, so a sentinel tells its own confirmation from a replay's.
pub type Attempt = u64;

/// What an attestation names a transaction by: a hash of its compact encoding (two attestations
/// of the same txid with different bodies never merge).
pub type TxKey = Digest;

/// The previous-block hash of block 1.
pub const GENESIS: Digest = [0u8; 32];

/// Most inputs of a transaction the atomizer takes (an attestation names inputs by a 16-bit
/// index).
pub const MAX_INPUTS: usize = 1 << 12;

/// The key of a compact transaction.
pub fn tx_key(tx: &CompactTx) -> TxKey {
    florin_crypto::hash("florin/atomizer/tx/v1", &[&crate::shard::encode(tx)])
}

/// A shard's word to the atomizer about one transaction: at `height`, the inputs it lists are
/// unspent on this shard, and, when it carries the body (only the txid's shard does), the txid
/// is not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attestation {
    /// The transaction.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub key: TxKey,
    /// The sentinel's try it comes from.
    pub attempt: Attempt,
    /// The shard vouching.
    pub shard: ShardId,
    /// The shard's height when it checked.
    pub height: Height,
    /// Indices (into the transaction's inputs) of the inputs it vouches for.
    pub inputs: SmallVec<[u16; 2]>,
    /// The transaction, from the txid's shard.
    pub tx: Option<CompactTx>,
    /// The sentinel's clock (Unix seconds): the atomizer's clock is at least the highest its
    /// attestations carry, up to the tolerated skew past its leader's.
    pub now: u64,
}

/// Why the atomizer left a complete transaction out of every block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reject {
    /// An input was spent after it was attested, by a block or earlier in the open block (or
    /// the transaction names an input twice): a double spend.
    Spent,
    /// Its txid is in a block after the txid's shard attested it (a replay of a transaction
    /// in flight).
    Replay,
    /// Its expiry is before the atomizer's clock.
    Expired,
    /// An attestation is older than the window the atomizer can check, or the transaction
    /// stayed incomplete for a whole window (an attestation was lost): never ordered, so the
    /// sentinel tries again.
    Stale,
}

/// A transaction the atomizer rejected, published in the next block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// The transaction's id.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub txid: Digest,
    /// The tries this rejection answers.
    pub attempts: SmallVec<[Attempt; 2]>,
    /// Why.
    pub reason: Reject,
}

/// A transaction in a block, with the try the atomizer ordered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockTx {
    /// The transaction.
    pub tx: CompactTx,
    /// The try of it that was ordered.
    pub attempt: Attempt,
}

/// A block: the atomizer's ordered, hash-chained unit of history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// Its height (the previous block's plus one).
    pub height: Height,
    /// The previous block's hash ([`GENESIS`] for block 1).
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub prev: Digest,
    /// The atomizer's clock when it was sealed (Unix seconds; never decreases): shards forget
    /// expired txids by it.
    pub now: u64,
    /// The transactions, in order: each applies after the ones before it.
    pub txs: Vec<BlockTx>,
    /// Transactions rejected since the previous block.
    pub rejected: Vec<Rejection>,
}

impl Block {
    /// The block's hash: what the next block's `prev` holds.
    pub fn hash(&self) -> Digest {
        Block::hash_of_encoding(&crate::shard::encode(self))
    }

    /// The hash of a block from its encoding (postcard, as [`crate::shard::encode`] makes
    /// it): for a caller that encodes the block anyway.
    pub fn hash_of_encoding(bytes: &[u8]) -> Digest {
        florin_crypto::hash("florin/atomizer/block/v1", &[bytes])
    }
}

/// Why a sequence of blocks is not one chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A block's height is not the previous one's plus one.
    #[error("block at position {position} has height {height}, expected {expected}")]
    Height {
        /// Where in the sequence.
        position: usize,
        /// Its height.
        height: Height,
        /// The height it should have.
        expected: Height,
    },
    /// A block's `prev` is not the previous block's hash.
    #[error("block {height} does not follow the block before it (its prev hash differs)")]
    Link {
        /// The block.
        height: Height,
    },
    /// An input is spent twice in the chain.
    #[error("block {height} spends an id already spent in block {first}")]
    DoubleSpend {
        /// The block spending it again.
        height: Height,
        /// The block that spent it first.
        first: Height,
    },
}

/// What [`verify_chain`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChainSummary {
    /// The last block's height.
    pub height: Height,
    /// The last block's hash.
    pub tip: Digest,
    /// Transactions ordered.
    pub txs: u64,
    /// Transactions rejected.
    pub rejected: u64,
}

/// Checks blocks one at a time as one chain: consecutive heights, each `prev` the hash of the
/// block before, and no id spent twice anywhere in what it has checked (so a history read in
/// pieces is checked as a whole).
#[derive(Debug, Clone)]
pub struct ChainVerifier {
    spent: std::collections::HashMap<florin_ledger::UhsId, Height>,
    summary: ChainSummary,
    checked: usize,
}

impl ChainVerifier {
    /// A verifier continuing a chain at `from` (its height and tip; `(0, GENESIS)` for the
    /// whole chain).
    pub fn new(from: (Height, Digest)) -> ChainVerifier {
        ChainVerifier {
            spent: std::collections::HashMap::new(),
            summary: ChainSummary {
                height: from.0,
                tip: from.1,
                ..ChainSummary::default()
            },
            checked: 0,
        }
    }

    /// Checks the next block.
    pub fn push(&mut self, b: &Block) -> Result<(), ChainError> {
        let s = &mut self.summary;
        if b.height != s.height + 1 {
            return Err(ChainError::Height {
                position: self.checked,
                height: b.height,
                expected: s.height + 1,
            });
        }
        if b.prev != s.tip {
            return Err(ChainError::Link { height: b.height });
        }
        for t in &b.txs {
            for i in &t.tx.inputs {
                if let Some(first) = self.spent.insert(*i, b.height) {
                    return Err(ChainError::DoubleSpend {
                        height: b.height,
                        first,
                    });
                }
            }
        }
        s.height = b.height;
        s.tip = b.hash();
        s.txs += b.txs.len() as u64;
        s.rejected += b.rejected.len() as u64;
        self.checked += 1;
        Ok(())
    }

    /// What has been checked so far.
    pub fn summary(&self) -> ChainSummary {
        self.summary
    }
}

/// Checks that `blocks` continue a chain at `from` (its height and tip; `(0, GENESIS)` for the
/// whole chain): consecutive heights, each `prev` the hash of the block before, and no id spent
/// twice within the blocks checked.
pub fn verify_chain<'a>(
    from: (Height, Digest),
    blocks: impl IntoIterator<Item = &'a Block>,
) -> Result<ChainSummary, ChainError> {
    let mut v = ChainVerifier::new(from);
    for b in blocks {
        v.push(b)?;
    }
    Ok(v.summary())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;

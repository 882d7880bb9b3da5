//! A shard of the atomizer architecture: the UHS ids of its range, correct at a block height.
//! It applies blocks strictly in order ([`BlockShard::apply`], replicated by the shard's Raft
//! group), vouches for unspent inputs at its height ([`BlockShard::attest`]), and, as the
//! watchtower of the txids in its range, answers what became of a transaction
//! ([`BlockShard::status`]).

use std::collections::{HashMap, VecDeque};

use florin_crypto::Digest;
use florin_ledger::expiry::{TxMemory, FOR_EVER};
use florin_ledger::{CompactTx, Supply, TxKind, UhsId};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use super::{Attempt, Attestation, Block, Height, Reject, TxKey, GENESIS};
use crate::route::{ShardId, ShardMap};

/// Rejections a shard remembers for the txids of its range (the oldest are forgotten first):
/// enough for every sentinel to read its answer long after the block that carried it.
pub const REJECTIONS_REMEMBERED: usize = 1 << 16;

/// Seconds a transfer's or redeem's confirmation is remembered past its expiry (twice the
/// clock skew a sentinel is allowed, as `florin_ledger::expiry::expired_for_good`), so the sentinel that submitted it reads it as confirmed even if
/// the block holding it moved the clock past the expiry.
pub const CONFIRMED_GRACE_SECS: u64 = 2 * florin_ledger::expiry::CLOCK_SKEW_SECS;

/// What applying a block did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlockReply {
    /// Applied now or before: the shard's height is this.
    Applied(Height),
    /// The shard lacks blocks before this one: send the blocks after this height.
    Behind(Height),
    /// The block is at the next height but does not follow this shard's last block: a
    /// different history (nothing changed; the operator must look).
    Fork {
        /// The shard's height.
        height: Height,
        /// Its last block's hash.
        #[serde(with = "florin_ledger::bin_serde::id")]
        tip: Digest,
    },
}

/// A shard's answer to a sentinel's request to attest a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Everything of the transaction on this shard holds at `height`: the attestation goes to
    /// the atomizer.
    Attested(Attestation),
    /// An input this shard owns is not unspent at this height (or named twice).
    Missing(Height),
    /// The txid is confirmed (by the block at this height, under this try).
    Confirmed(Height, Attempt),
    /// The transaction's expiry is before the shard's clock at this height, and its txid is
    /// not confirmed here.
    Expired(Height),
    /// The shard has not yet applied the height the sentinel reads at: ask again.
    Behind(Height),
    /// Everything held, but the atomizer's leader is busy (its admission control refused the
    /// attestation) or could not be reached: ask again later.
    Busy,
}

/// A block as one shard's Raft group keeps it: only the transactions and rejections that touch
/// the shard (an input, an output or the txid it owns), with the whole block's hash. A shard
/// group so replicates its share of the history, not all of it (each shard applies only what it
/// owns anyway); the leader that received the whole block from the atomizer computed the
/// hash, which chains the next block as the whole block's would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardBlock {
    /// The block, filtered (height, `prev` and clock unchanged).
    pub block: Block,
    /// The whole block's hash.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub hash: Digest,
}

impl ShardBlock {
    /// The part of `block` shard `shard` of `map` keeps.
    pub fn of(block: &Block, map: &ShardMap, shard: ShardId) -> ShardBlock {
        let mine = |id: &[u8; 32]| map.owns(shard, id);
        ShardBlock {
            block: Block {
                height: block.height,
                prev: block.prev,
                now: block.now,
                txs: block
                    .txs
                    .iter()
                    .filter(|t| {
                        mine(&t.tx.txid)
                            || t.tx.inputs.iter().any(mine)
                            || t.tx.outputs.iter().any(|(o, _)| mine(o))
                    })
                    .cloned()
                    .collect(),
                rejected: block
                    .rejected
                    .iter()
                    .filter(|r| mine(&r.txid))
                    .cloned()
                    .collect(),
            },
            hash: block.hash(),
        }
    }
}

/// What became of a transaction, as its txid's shard knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxStatus {
    /// In the block at this height, under this try.
    Confirmed(Height, Attempt),
    /// Rejected: each try rejected, with why.
    Rejected(SmallVec<[(Attempt, Reject); 2]>),
    /// Nothing known at this height.
    Unknown(Height),
    /// The shard has not yet applied the height asked for.
    Behind(Height),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Rest {
    height: Height,
    #[serde(with = "florin_ledger::bin_serde::id")]
    tip: Digest,
    books: Supply,
    rejected: HashMap<Digest, SmallVec<[(Attempt, Reject); 2]>>,
    rejected_order: VecDeque<Digest>,
}

/// The state of one shard.
#[derive(Debug, Clone)]
pub struct BlockShard {
    map: ShardMap,
    shard: ShardId,
    unspent: HashMap<UhsId, u64>,
    /// Confirmed txids of this range with the height and try that confirmed them: transfers
    /// and redeems until their expiry, mints for ever (as the locking shard).
    confirmed: TxMemory<(Height, Attempt)>,
    rest: Rest,
    /// The decision feed: this shard's txids confirmed or rejected, by the height that
    /// decided them, the last [`DECISIONS_FED`]. Not replicated state (a replica restored from
    /// a snapshot starts it afresh): sentinels read it to learn outcomes without asking per
    /// transaction, and fall back to asking where it has a gap.
    decided: VecDeque<(Height, Digest)>,
    /// Every decision after this height is in the feed.
    feed_from: Height,
}

/// Decisions the feed keeps (about 10 s of a shard confirming 100 K transactions a second).
pub const DECISIONS_FED: usize = 1 << 20;

/// Most decisions in one answer of [`BlockShard::decided_since`].
pub const DECISIONS_PER_READ: usize = 1 << 15;

impl BlockShard {
    /// Shard `shard` of `map`, before any block.
    pub fn new(map: ShardMap, shard: ShardId) -> BlockShard {
        BlockShard {
            map,
            shard,
            unspent: HashMap::new(),
            confirmed: TxMemory::default(),
            rest: Rest {
                tip: GENESIS,
                ..Rest::default()
            },
            decided: VecDeque::new(),
            feed_from: 0,
        }
    }

    /// The decisions after height `from` (its txids confirmed or rejected, with their status
    /// now), whole blocks at a time and at most about [`DECISIONS_PER_READ`]: the height the
    /// answer is complete to, the height the feed starts after (a `from` below it has missed
    /// decisions) and the decisions.
    pub fn decided_since(&self, from: Height) -> (Height, Height, Vec<(Digest, TxStatus)>) {
        let start = self.decided.partition_point(|(h, _)| *h <= from);
        let mut out = Vec::new();
        let mut reached = self.rest.height;
        let mut last: Option<Height> = None;
        for (h, txid) in self.decided.iter().skip(start) {
            // Whole blocks only: the rest is read from the next block on.
            if out.len() >= DECISIONS_PER_READ && last != Some(*h) {
                reached = last.unwrap_or(from);
                break;
            }
            out.push((*txid, self.status(txid, 0)));
            last = Some(*h);
        }
        (reached, self.feed_from, out)
    }

    /// The last block applied.
    pub fn height(&self) -> Height {
        self.rest.height
    }

    /// The last block's hash.
    pub fn tip(&self) -> Digest {
        self.rest.tip
    }

    /// The shard's books.
    pub fn books(&self) -> Supply {
        self.rest.books
    }

    /// Whether an id is unspent at the shard's height.
    pub fn is_unspent(&self, id: &UhsId) -> bool {
        self.unspent.contains_key(id)
    }

    /// Whether a txid of this range is confirmed.
    pub fn is_confirmed(&self, txid: &Digest) -> bool {
        self.confirmed.contains(txid)
    }

    /// Every unspent id with its value.
    pub fn unspent(&self) -> impl Iterator<Item = (&UhsId, &u64)> {
        self.unspent.iter()
    }

    /// Every confirmed txid remembered.
    pub fn confirmed(&self) -> impl Iterator<Item = &Digest> {
        self.confirmed.iter().map(|(t, _, _)| t)
    }

    /// Inserts unspent outputs directly (genesis in tests and simulations).
    pub fn seed(&mut self, outputs: &[(UhsId, u64)]) {
        for (o, v) in outputs {
            if self.map.owns(self.shard, o) && self.unspent.insert(*o, *v).is_none() {
                self.rest.books.unspent_cents += v;
                self.rest.books.unspent_count += 1;
                self.rest.books.minted_cents += v;
            }
        }
    }

    /// Applies the next block: its transactions' ids in this range (inputs deleted, outputs
    /// created, txids recorded) and its rejections of txids in this range.
    pub fn apply(&mut self, block: &Block) -> BlockReply {
        self.apply_hashed(block, None)
    }

    /// Applies a [`ShardBlock`]: the block's part for this shard, whose hash (the shard's
    /// next tip) came with it. The same state results as from the whole block.
    pub fn apply_part(&mut self, part: &ShardBlock) -> BlockReply {
        self.apply_hashed(&part.block, Some(part.hash))
    }

    fn apply_hashed(&mut self, block: &Block, hash: Option<Digest>) -> BlockReply {
        let h = self.rest.height;
        if block.height <= h {
            return BlockReply::Applied(h);
        }
        if block.height > h + 1 {
            return BlockReply::Behind(h);
        }
        if block.prev != self.rest.tip {
            return BlockReply::Fork {
                height: h,
                tip: self.rest.tip,
            };
        }
        self.confirmed.advance(block.now);
        let b = &mut self.rest.books;
        for t in &block.txs {
            let tx = &t.tx;
            for i in &tx.inputs {
                if !self.map.owns(self.shard, i) {
                    continue;
                }
                if let Some(v) = self.unspent.remove(i) {
                    b.unspent_cents = b.unspent_cents.saturating_sub(v);
                    b.unspent_count = b.unspent_count.saturating_sub(1);
                    if tx.kind == TxKind::Redeem {
                        b.redeemed_cents = b.redeemed_cents.saturating_add(v);
                    }
                }
            }
            for (o, v) in &tx.outputs {
                if !self.map.owns(self.shard, o) {
                    continue;
                }
                if let std::collections::hash_map::Entry::Vacant(e) = self.unspent.entry(*o) {
                    e.insert(*v);
                    b.unspent_cents = b.unspent_cents.saturating_add(*v);
                    b.unspent_count += 1;
                    if tx.kind == TxKind::Mint {
                        b.minted_cents = b.minted_cents.saturating_add(*v);
                    }
                }
            }
            if self.map.owns(self.shard, &tx.txid) {
                // Past its expiry by a grace: the sentinel that submitted it reads its status
                // after the block, whose clock may pass the expiry before it asks.
                let keep = if tx.kind == TxKind::Mint {
                    FOR_EVER
                } else {
                    tx.expires.saturating_add(CONFIRMED_GRACE_SECS)
                };
                self.confirmed
                    .insert(tx.txid, (block.height, t.attempt), keep);
                self.decided.push_back((block.height, tx.txid));
            }
        }
        for r in &block.rejected {
            if !self.map.owns(self.shard, &r.txid) {
                continue;
            }
            // Each try's rejection is kept with its own reason: a late rejection of an older
            // try never hides the current try's.
            let tries = match self.rest.rejected.entry(r.txid) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    self.rest.rejected_order.push_back(r.txid);
                    e.insert(SmallVec::new())
                }
            };
            for a in &r.attempts {
                if !tries.iter().any(|(x, _)| x == a) && tries.len() < 16 {
                    tries.push((*a, r.reason));
                }
            }
            self.decided.push_back((block.height, r.txid));
            while self.rest.rejected_order.len() > REJECTIONS_REMEMBERED {
                if let Some(old) = self.rest.rejected_order.pop_front() {
                    self.rest.rejected.remove(&old);
                }
            }
        }
        while self.decided.len() > DECISIONS_FED {
            if let Some((h, _)) = self.decided.pop_front() {
                // Decisions of that height may be left in the feed: it is whole only after it.
                self.feed_from = h;
            }
        }
        self.rest.height = block.height;
        self.rest.tip = hash.unwrap_or_else(|| block.hash());
        BlockReply::Applied(block.height)
    }

    /// Checks, at the shard's height (at least `min_height`), what of `tx` lies on this shard:
    /// its inputs here unspent and, if the txid is this shard's, the txid not confirmed. On
    /// success the attestation to send the atomizer (carrying the body if the txid is this
    /// shard's), under the last of `attempts` (the sentinel's tries of it, oldest first).
    /// Expiry is judged at the later of the shard's clock and the sentinel's `now`; a txid
    /// confirmed under another sentinel's try is answered expired once its expiry has passed
    /// (a mint's never), as by every store: never applied again either way.
    pub fn attest(
        &self,
        tx: &CompactTx,
        key: TxKey,
        attempts: &[Attempt],
        min_height: Height,
        now: u64,
    ) -> Verdict {
        let h = self.rest.height;
        if h < min_height {
            return Verdict::Behind(h);
        }
        let expired = tx.expires < self.confirmed.now().max(now);
        let owns_txid = self.map.owns(self.shard, &tx.txid);
        if owns_txid {
            if let Some((at, a)) = self.confirmed.get(&tx.txid) {
                // A mint's confirmation is kept and answered for ever.
                if expired && tx.kind != TxKind::Mint && !attempts.contains(a) {
                    return Verdict::Expired(h);
                }
                return Verdict::Confirmed(*at, *a);
            }
        }
        if expired {
            return Verdict::Expired(h);
        }
        let mut inputs = SmallVec::new();
        for (k, i) in tx.inputs.iter().enumerate() {
            if !self.map.owns(self.shard, i) {
                continue;
            }
            let Ok(k) = u16::try_from(k) else {
                return Verdict::Missing(h);
            };
            if !self.unspent.contains_key(i) || tx.inputs[..k as usize].contains(i) {
                return Verdict::Missing(h);
            }
            inputs.push(k);
        }
        Verdict::Attested(Attestation {
            key,
            attempt: attempts.last().copied().unwrap_or_default(),
            shard: self.shard,
            height: h,
            inputs,
            tx: owns_txid.then(|| tx.clone()),
            now,
        })
    }

    /// What became of `txid` (a txid of this shard's range), read at a height at least
    /// `min_height`.
    pub fn status(&self, txid: &Digest, min_height: Height) -> TxStatus {
        let h = self.rest.height;
        if h < min_height {
            return TxStatus::Behind(h);
        }
        if let Some((at, a)) = self.confirmed.get(txid) {
            return TxStatus::Confirmed(*at, *a);
        }
        match self.rest.rejected.get(txid) {
            Some(tries) => TxStatus::Rejected(tries.clone()),
            None => TxStatus::Unknown(h),
        }
    }

    /// The shard's state as bytes: the clock, the unspent ids and the confirmed txids as
    /// counted flat records, then the rest with postcard.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.unspent.len() * 40 + self.confirmed.len() * 56);
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&self.confirmed.now().to_le_bytes());
        out.extend_from_slice(&(self.unspent.len() as u64).to_le_bytes());
        for (id, v) in &self.unspent {
            out.extend_from_slice(id);
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.confirmed.len() as u64).to_le_bytes());
        for (txid, (h, a), e) in self.confirmed.iter() {
            out.extend_from_slice(txid);
            out.extend_from_slice(&h.to_le_bytes());
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        if let Ok(v) = postcard::to_extend(&self.rest, out) {
            return v;
        }
        Vec::new()
    }

    /// Shard `shard` of `map` from [`BlockShard::snapshot`]'s bytes.
    pub fn from_snapshot(
        map: ShardMap,
        shard: ShardId,
        b: &[u8],
    ) -> Result<BlockShard, SnapshotError> {
        let mut r = Reader(b);
        if r.take(SNAPSHOT_MAGIC.len())? != SNAPSHOT_MAGIC {
            return Err(SnapshotError::Magic);
        }
        let mut confirmed = TxMemory::default();
        confirmed.advance(r.word()?);
        let n = r.count(40)?;
        let mut unspent = HashMap::with_capacity(n);
        for _ in 0..n {
            let id = r.id()?;
            unspent.insert(id, r.word()?);
        }
        let n = r.count(56)?;
        confirmed.reserve(n);
        for _ in 0..n {
            let txid = r.id()?;
            let (h, a, e) = (r.word()?, r.word()?, r.word()?);
            confirmed.insert(txid, (h, a), e);
        }
        let rest: Rest =
            postcard::from_bytes(r.0).map_err(|e| SnapshotError::Undecodable(e.to_string()))?;
        let feed_from = rest.height;
        Ok(BlockShard {
            map,
            shard,
            unspent,
            confirmed,
            rest,
            decided: VecDeque::new(),
            feed_from,
        })
    }
}

/// The first bytes of a block shard's snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"FLBSHD01";

/// Why [`BlockShard::from_snapshot`] refused bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Not a block shard's snapshot.
    #[error("block shard snapshot: no FLBSHD01 magic")]
    Magic,
    /// It ends before what it announces.
    #[error("block shard snapshot: truncated")]
    Truncated,
    /// The rest does not decode.
    #[error("block shard snapshot: undecodable: {0}")]
    Undecodable(String),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if self.0.len() < n {
            return Err(SnapshotError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn word(&mut self) -> Result<u64, SnapshotError> {
        let mut w = [0u8; 8];
        w.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(w))
    }
    fn id(&mut self) -> Result<[u8; 32], SnapshotError> {
        let mut w = [0u8; 32];
        w.copy_from_slice(self.take(32)?);
        Ok(w)
    }
    /// A count of records of `size` bytes, refused if the bytes left cannot hold them.
    fn count(&mut self, size: usize) -> Result<usize, SnapshotError> {
        let n = usize::try_from(self.word()?).map_err(|_| SnapshotError::Truncated)?;
        if n.checked_mul(size).is_none_or(|l| l > self.0.len()) {
            return Err(SnapshotError::Truncated);
        }
        Ok(n)
    }
}

//! The atomizer's replicated state: transactions being attested, the open block, and the spent
//! inputs and txids of the last [`AtomizerConfig::window`] blocks. One command,
//! [`AtomCmd::Step`], takes a batch of attestations and may seal the open block; every replica
//! applies the same steps in the same order and seals the same blocks.

use std::collections::{HashMap, HashSet, VecDeque};

use florin_crypto::Digest;
use florin_ledger::{CompactTx, UhsId};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::route::{ShardId, ShardMap};

/// Ids are hashes already: a fast hasher (the ones std uses by default cost a third of a
/// replica's time here).
type Fast = foldhash::fast::RandomState;

use super::{
    Attempt, Attestation, Block, BlockTx, Height, Reject, Rejection, TxKey, GENESIS, MAX_INPUTS,
};

/// The atomizer's fixed settings (the same on every replica: they decide what is ordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AtomizerConfig {
    /// Blocks an attestation stays valid for, and a transaction may stay incomplete for: the
    /// depth of the spent-input cache.
    pub window: u64,
    /// Most transactions in one block (a full open block is sealed at once).
    pub max_block: usize,
    /// Most incomplete transactions held (beyond it, new ones are rejected as stale).
    pub max_pending: usize,
}

impl Default for AtomizerConfig {
    fn default() -> Self {
        AtomizerConfig {
            window: 256,
            max_block: 1 << 16,
            max_pending: 1 << 20,
        }
    }
}

/// A command to the atomizer's state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AtomCmd {
    /// Take these attestations, in order; then seal the open block if `seal` (and it holds
    /// anything).
    Step {
        /// Attestations from shards.
        attestations: Vec<Attestation>,
        /// Whether to seal the open block after them.
        seal: bool,
        /// The leader's clock (Unix seconds): the atomizer's clock is the highest given.
        now: u64,
    },
}

/// What a step did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StepReply {
    /// The height after the step (of the last sealed block).
    pub height: Height,
    /// Blocks the step sealed (a full open block seals before the step's end).
    pub sealed: Vec<Height>,
}

/// A transaction whose attestations are not all in.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    tx: Option<CompactTx>,
    /// The try that brought the body.
    attempt: Attempt,
    attempts: SmallVec<[Attempt; 2]>,
    /// Attested input indices (sorted, unique), each with the shard that vouched for it.
    inputs: SmallVec<[(u16, ShardId); 4]>,
    /// The lowest height an attestation was made at.
    min_height: Height,
    /// The height when the first attestation arrived.
    since: Height,
}

/// The spent inputs and txids of one block (each at most once: a transaction spending an id
/// already spent in the window is rejected). The lookups go through the state's index; these
/// lists are what leaves it when the block leaves the window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Spent {
    height: Height,
    inputs: Vec<UhsId>,
    txids: Vec<Digest>,
}

/// The atomizer's state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AtomizerState {
    cfg: AtomizerConfig,
    /// Which shard owns which ids: an input counts as attested only by its own shard, a body
    /// only from the txid's.
    map: ShardMap,
    height: Height,
    #[serde(with = "florin_ledger::bin_serde::id")]
    tip: Digest,
    /// The clock the open block's transactions are decided at (and sealed with): fixed while
    /// a block is open, so every transaction in a block is unexpired at the block's clock.
    now: u64,
    /// The highest clock a step gave since: the next block's.
    next_now: u64,
    pending: HashMap<TxKey, Pending, Fast>,
    /// Pending keys by arrival (for eviction; a key no longer pending, or pending since
    /// another height, is skipped).
    pending_order: VecDeque<(Height, TxKey)>,
    open_txs: Vec<BlockTx>,
    /// What the open block spends (indexed at the open block's height, one past `height`).
    open: Spent,
    open_rejected: Vec<Rejection>,
    /// The last `window` sealed blocks, oldest first.
    recent: VecDeque<Spent>,
    /// Transactions ordered and rejected since the atomizer began.
    totals: (u64, u64),
    /// Index of `recent` and `open`: each input spent and each txid ordered there, with the
    /// (latest) height of the block that holds it (the open block's: `height + 1`). A check
    /// is one lookup, not one per block in the window. Derived: rebuilt when a snapshot is
    /// read.
    #[serde(skip)]
    spent_at: HashMap<UhsId, Height, Fast>,
    #[serde(skip)]
    ordered_at: HashMap<Digest, Height, Fast>,
}

impl AtomizerState {
    /// An atomizer before any block, for shards routed by `map`.
    pub fn new(cfg: AtomizerConfig, map: ShardMap) -> AtomizerState {
        AtomizerState {
            cfg,
            map,
            height: 0,
            tip: GENESIS,
            now: 0,
            next_now: 0,
            pending: HashMap::default(),
            pending_order: VecDeque::new(),
            open_txs: Vec::new(),
            open: Spent::default(),
            open_rejected: Vec::new(),
            recent: VecDeque::new(),
            totals: (0, 0),
            spent_at: HashMap::default(),
            ordered_at: HashMap::default(),
        }
    }

    /// Its fixed settings.
    pub fn config(&self) -> AtomizerConfig {
        self.cfg
    }

    fn index(&mut self, s: &Spent) {
        for i in &s.inputs {
            self.index_input(*i, s.height);
        }
        for t in &s.txids {
            self.index_txid(*t, s.height);
        }
    }

    fn index_input(&mut self, id: UhsId, height: Height) {
        let e = self.spent_at.entry(id).or_default();
        *e = (*e).max(height);
    }

    fn index_txid(&mut self, txid: Digest, height: Height) {
        let e = self.ordered_at.entry(txid).or_default();
        *e = (*e).max(height);
    }

    fn unindex(&mut self, s: &Spent) {
        for i in &s.inputs {
            if self.spent_at.get(i) == Some(&s.height) {
                self.spent_at.remove(i);
            }
        }
        for t in &s.txids {
            if self.ordered_at.get(t) == Some(&s.height) {
                self.ordered_at.remove(t);
            }
        }
    }

    /// The last sealed block's height.
    pub fn height(&self) -> Height {
        self.height
    }

    /// The last sealed block's hash.
    pub fn tip(&self) -> Digest {
        self.tip
    }

    /// Transactions waiting for attestations, and in the open block.
    pub fn load(&self) -> (usize, usize) {
        (self.pending.len(), self.open_txs.len())
    }

    /// Transactions ordered and rejected since the atomizer began.
    pub fn totals(&self) -> (u64, u64) {
        self.totals
    }

    /// Applies one command; the blocks it sealed are returned beside the reply, for the block
    /// log.
    pub fn apply(&mut self, cmd: AtomCmd) -> (StepReply, Vec<Block>) {
        let AtomCmd::Step {
            attestations,
            seal,
            now,
        } = cmd;
        self.next_now = self.next_now.max(now);
        if self.open_txs.is_empty() {
            // Nothing decided in the open block yet: it takes the newest clock.
            self.now = self.next_now;
        }
        let mut blocks = Vec::new();
        for a in attestations {
            self.attest(a);
            if self.open_txs.len() >= self.cfg.max_block {
                blocks.push(self.seal());
            }
        }
        if seal && !(self.open_txs.is_empty() && self.open_rejected.is_empty()) {
            blocks.push(self.seal());
        }
        (
            StepReply {
                height: self.height,
                sealed: blocks.iter().map(|b| b.height).collect(),
            },
            blocks,
        )
    }

    fn reject(&mut self, txid: Digest, attempts: SmallVec<[Attempt; 2]>, reason: Reject) {
        self.totals.1 += 1;
        self.open_rejected.push(Rejection {
            txid,
            attempts,
            reason,
        });
    }

    fn attest(&mut self, a: Attestation) {
        // An attestation from beyond the atomizer's height (no shard can be ahead of it), or
        // with an input index no transaction has, is not to be trusted: dropped. So is one too
        // old to check; its transaction is rejected as stale if its body is known.
        let bad_index = a.inputs.iter().any(|i| *i as usize >= MAX_INPUTS)
            || a.tx.as_ref().is_some_and(|t| {
                t.inputs.len() > MAX_INPUTS
                    || a.inputs.iter().any(|i| *i as usize >= t.inputs.len())
            });
        // A body only from the txid's shard (what vouches that the txid is not confirmed).
        let wrong_body =
            a.tx.as_ref()
                .is_some_and(|t| self.map.shard_of(&t.txid) != a.shard);
        if a.height > self.height || bad_index || wrong_body {
            return;
        }
        if self.height - a.height > self.cfg.window {
            if let Some(tx) = &a.tx {
                self.reject(tx.txid, SmallVec::from_elem(a.attempt, 1), Reject::Stale);
            }
            return;
        }
        if !self.pending.contains_key(&a.key) {
            if self.pending.len() >= self.cfg.max_pending {
                if let Some(tx) = &a.tx {
                    self.reject(tx.txid, SmallVec::from_elem(a.attempt, 1), Reject::Stale);
                }
                return;
            }
            self.pending_order.push_back((self.height, a.key));
            self.pending.insert(
                a.key,
                Pending {
                    tx: None,
                    attempt: a.attempt,
                    attempts: SmallVec::new(),
                    inputs: SmallVec::new(),
                    min_height: a.height,
                    since: self.height,
                },
            );
        }
        let Some(p) = self.pending.get_mut(&a.key) else {
            return;
        };
        p.min_height = p.min_height.min(a.height);
        if !p.attempts.contains(&a.attempt) && p.attempts.len() < 8 {
            p.attempts.push(a.attempt);
        }
        for i in &a.inputs {
            if let Err(at) = p.inputs.binary_search_by_key(i, |(k, _)| *k) {
                p.inputs.insert(at, (*i, a.shard));
            }
        }
        if p.tx.is_none() {
            if let Some(tx) = a.tx {
                p.tx = Some(tx);
                p.attempt = a.attempt;
            }
        }
        let complete =
            p.tx.as_ref()
                .is_some_and(|t| p.inputs.len() == t.inputs.len());
        if complete {
            if let Some(p) = self.pending.remove(&a.key) {
                self.decide(p);
            }
        }
    }

    fn decide(&mut self, p: Pending) {
        let Some(tx) = p.tx else { return };
        // Each input vouched for by the shard that owns it; anything else is not to be trusted
        // (a member routing by another map, or a faulty one): never ordered.
        let misrouted = p.inputs.iter().any(|(i, s)| {
            tx.inputs
                .get(*i as usize)
                .is_none_or(|id| self.map.shard_of(id) != *s)
        });
        let reason = if misrouted {
            Some(Reject::Stale)
        } else if tx.expires < self.now {
            Some(Reject::Expired)
        } else if self.height - p.min_height > self.cfg.window {
            Some(Reject::Stale)
        // The open block's ids are indexed at its height, above any attestation's.
        } else if self
            .ordered_at
            .get(&tx.txid)
            .is_some_and(|h| *h > p.min_height)
        {
            Some(Reject::Replay)
        } else if tx
            .inputs
            .iter()
            .any(|i| self.spent_at.get(i).is_some_and(|h| *h > p.min_height))
            || has_duplicate(&tx.inputs)
        {
            Some(Reject::Spent)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.reject(tx.txid, p.attempts, reason);
            return;
        }
        self.totals.0 += 1;
        let open = self.height + 1;
        for i in &tx.inputs {
            self.index_input(*i, open);
        }
        self.index_txid(tx.txid, open);
        self.open.inputs.extend(tx.inputs.iter().copied());
        self.open.txids.push(tx.txid);
        self.open_txs.push(BlockTx {
            tx,
            attempt: p.attempt,
        });
    }

    fn seal(&mut self) -> Block {
        self.height += 1;
        // Transactions incomplete for a whole window can no longer be checked: stale.
        while let Some((since, key)) = self.pending_order.front().copied() {
            if self.height - since <= self.cfg.window {
                break;
            }
            self.pending_order.pop_front();
            if self.pending.get(&key).is_some_and(|p| p.since == since) {
                if let Some(p) = self.pending.remove(&key) {
                    if let Some(tx) = &p.tx {
                        self.reject(tx.txid, p.attempts, Reject::Stale);
                    }
                }
            }
        }
        let block = Block {
            height: self.height,
            prev: self.tip,
            now: self.now,
            txs: std::mem::take(&mut self.open_txs),
            rejected: std::mem::take(&mut self.open_rejected),
        };
        self.tip = block.hash();
        self.now = self.next_now;
        let mut spent = std::mem::take(&mut self.open);
        // Indexed at this height when decided.
        spent.height = self.height;
        self.recent.push_back(spent);
        while self.recent.len() as u64 > self.cfg.window {
            if let Some(old) = self.recent.pop_front() {
                self.unindex(&old);
            }
        }
        block
    }

    /// The state as bytes ([`AtomizerState::from_snapshot`] reads them back).
    pub fn snapshot(&self) -> Vec<u8> {
        crate::shard::encode(self)
    }

    /// A state from [`AtomizerState::snapshot`]'s bytes.
    pub fn from_snapshot(b: &[u8]) -> Result<AtomizerState, crate::shard::DecodeError> {
        let mut s: AtomizerState = crate::shard::decode(b)?;
        let recent = std::mem::take(&mut s.recent);
        for r in &recent {
            s.index(r);
        }
        s.recent = recent;
        let mut open = std::mem::take(&mut s.open);
        open.height = s.height + 1;
        s.index(&open);
        open.height = 0;
        s.open = open;
        Ok(s)
    }
}

fn has_duplicate(ids: &[UhsId]) -> bool {
    if ids.len() <= 16 {
        // The common case (a handful of inputs): no allocation.
        return ids
            .iter()
            .enumerate()
            .any(|(n, i)| ids[n + 1..].contains(i));
    }
    let mut seen = HashSet::with_capacity(ids.len());
    !ids.iter().all(|i| seen.insert(i))
}

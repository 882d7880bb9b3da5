//! The locking shard (Hamilton's two-phase-commit "shard"), as a deterministic state machine.
//!
//! A shard owns the UHS ids of one id range ([`crate::route`]) and the confirmation records of
//! the transaction ids in that range. Three commands, each idempotent per batch id:
//! - `Prepare { dtx, parts }`: for each transaction's part on this shard, votes and, on `Ok`,
//!   locks its inputs (and its txid, which stops a duplicate submission committing twice).
//! - `Commit { dtx, commit }`: for each part, deletes inputs and inserts outputs if committed,
//!   records the txid as confirmed; unlocks everything the batch locked.
//! - `Discard { dtx }`: forgets the batch (a prepared batch that is discarded is aborted).
//! - `Apply { dtx, parts }`: one-phase commit of a batch whose every transaction lives wholly on
//!   this shard (inputs, outputs and txid): each part is voted on as in `Prepare` and, on `Ok`,
//!   applied at once, in order. Nothing stays locked, so nothing is left for a coordinator to
//!   finish. A resent or duplicated `Apply` applies nothing: it answers `Ok` again for the
//!   parts it confirmed the first time (every confirmed txid remembers a tag of the batch that
//!   confirmed it), `Applied` for parts another batch confirmed, and `Busy` for the rest, so a
//!   coordinator that lost the first answer retries those in a new batch (the shard remembers
//!   the last [`APPLIED_MEMORY`] one-phase batches). Without this, a part refused the first
//!   time (its input missing) could be applied by the resend once its input appeared, after
//!   the coordinator had answered it refused.
//!
//! A retried phase gets the answer of the first attempt: `Prepare` returns the stored votes,
//! `Commit` after a commit acknowledges, and `Prepare` of a finished batch is refused, never
//! re-locks. The state is replicated by applying the same commands in the same order on every
//! replica (Raft): it must not read clocks or randomness.
//!
//! **Expiry** ([`florin_ledger::expiry`]): `Prepare` and `Apply` carry the coordinator's clock
//! (Unix seconds, from the submissions it took); the shard's clock is the highest it was given,
//! so every replica moves it at the same command. A part whose expiry is before the clock votes
//! [`Vote::Expired`] unless its txid is remembered as confirmed; a confirmed transfer's or
//! redeem's txid is forgotten once the clock passes its expiry (mints' are kept), so the
//! confirmed set holds at most [`florin_ledger::MAX_TTL_SECS`] of transactions.
//!
//! Every command carries a [`Fence`]: the sending coordinator group and the Raft term its
//! leader was elected in. The shard remembers the highest term seen from each group and answers
//! [`ShardReply::Deposed`] to a command from a lower one, changing nothing: a deposed leader's
//! late `Prepare` cannot re-lock a batch the group's new leader has finished, however long ago.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// Ids are uniformly random hashes: a fast non-cryptographic hasher is safe here (iteration
/// order never affects a reply, so replicas stay deterministic).
type Fast = foldhash::fast::RandomState;

use florin_crypto::Digest;
use florin_ledger::expiry::{TxMemory, FOR_EVER};
use florin_ledger::{Supply, TxKind, UhsId};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::Dtx;

/// Batch ids remembered after `Discard` (so a late duplicate `Prepare` of the same leader
/// cannot re-lock; a deposed leader's is refused by its [`Fence`] whatever this remembers).
pub const DISCARDED_MEMORY: usize = 1 << 16;

/// One-phase batch ids remembered after their `Apply` ran (so a resent or duplicated `Apply`
/// is answered without applying anything again).
pub const APPLIED_MEMORY: usize = 1 << 16;

/// Who sends a command: a coordinator group and the Raft term of the leader sending it. A group
/// has at most one leader per term and its terms only grow, so once a shard has taken a command
/// of term `t` from a group, any sender of an earlier term of that group is a deposed leader.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The coordinator group.
    pub group: u16,
    /// Its leader's Raft term.
    pub term: u64,
}

/// A command with its sender: what a coordinator sends and what a shard replicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fenced {
    /// The sender.
    pub by: Fence,
    /// The command.
    pub cmd: ShardCmd,
}

/// One transaction's part on one shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// The transaction's id.
    #[serde(with = "florin_ledger::bin_serde::id")]
    pub txid: Digest,
    /// Whether this shard owns the txid (records its confirmation, detects its replay).
    pub owns_txid: bool,
    /// The transaction's kind (for the books).
    pub kind: TxKind,
    /// Inputs in this shard's range: must exist and be unlocked.
    #[serde(with = "florin_ledger::bin_serde::ids")]
    pub inputs: PartInputs,
    /// Outputs in this shard's range, with their values.
    #[serde(with = "florin_ledger::bin_serde::valued_ids")]
    pub outputs: PartOutputs,
    /// The transaction's expiry (Unix seconds).
    pub expires: u64,
}

/// A part's inputs: up to two inline, so the usual part is decoded without an allocation on
/// each replica (a batch of thousands of parts is decoded by every replica of the shard).
pub type PartInputs = SmallVec<[UhsId; 2]>;
/// A part's outputs with their values: up to two inline, as [`PartInputs`].
pub type PartOutputs = SmallVec<[(UhsId, u64); 2]>;

/// A shard's vote on one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Vote {
    /// Inputs exist and are now locked for this batch.
    Ok,
    /// An input is spent or never existed (or appears twice).
    Missing,
    /// An input is locked by a batch in flight: try again later.
    Busy,
    /// The txid itself is locked: the same transaction is in flight in another batch.
    InFlight,
    /// The txid is already confirmed (a replay).
    Applied,
    /// The txid is confirmed by a two-phase batch whose commit may not have reached the
    /// transaction's other shards yet (the batch is not discarded here): a replay, to be
    /// answered once that commit is done everywhere.
    Committing,
    /// The part's expiry is before the shard's clock and its txid is not remembered as
    /// confirmed: nothing changes. (Last, so older encodings still decode.)
    Expired,
}

/// A command to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardCmd {
    /// Phase one.
    Prepare {
        /// The batch.
        dtx: Dtx,
        /// This shard's parts, in the batch's order.
        parts: Vec<Part>,
        /// The coordinator's clock (Unix seconds).
        now: u64,
    },
    /// Phase two: one decision per prepared part.
    Commit {
        /// The batch.
        dtx: Dtx,
        /// Whether each part commits.
        commit: Vec<bool>,
    },
    /// Forget the batch.
    Discard {
        /// The batch.
        dtx: Dtx,
    },
    /// One-phase commit: every part lies wholly on this shard (its inputs, outputs and txid);
    /// each is voted on and, if `Ok`, applied at once, in order.
    Apply {
        /// The batch.
        dtx: Dtx,
        /// The parts, each with `owns_txid` set.
        parts: Vec<Part>,
        /// The coordinator's clock (Unix seconds).
        now: u64,
    },
}

impl ShardCmd {
    /// The batch the command is about.
    pub fn dtx(&self) -> Dtx {
        match self {
            ShardCmd::Prepare { dtx, .. }
            | ShardCmd::Commit { dtx, .. }
            | ShardCmd::Discard { dtx }
            | ShardCmd::Apply { dtx, .. } => *dtx,
        }
    }
}

/// Checks that every id of `cmd` lies in shard `shard`'s range under `map`: each part's
/// inputs and outputs, and its txid exactly when the part claims it (`owns_txid`), and that no
/// part is empty here. A coordinator routing by another map (a configuration that differs
/// between coordinator and shard) fails this; the shard's service refuses such a command
/// before it is replicated, so it never changes the shard's state.
pub fn check_range(
    map: &crate::route::ShardMap,
    shard: crate::route::ShardId,
    cmd: &ShardCmd,
) -> Result<(), String> {
    let parts = match cmd {
        ShardCmd::Prepare { parts, .. } | ShardCmd::Apply { parts, .. } => parts,
        ShardCmd::Commit { .. } | ShardCmd::Discard { .. } => return Ok(()),
    };
    let outside = |what: &str, i: usize, id: &[u8; 32]| {
        Err(format!(
            "part {i}: {what} {} is shard {}'s, not shard {shard}'s (the coordinator's shard map differs from this shard's: check shard_starts in cluster.toml)",
            id[..8].iter().map(|b| format!("{b:02x}")).collect::<String>(),
            map.shard_of(id)
        ))
    };
    for (i, p) in parts.iter().enumerate() {
        if p.owns_txid != map.owns(shard, &p.txid) {
            return outside("txid", i, &p.txid);
        }
        if let Some(x) = p.inputs.iter().find(|x| !map.owns(shard, x)) {
            return outside("input", i, x);
        }
        if let Some((x, _)) = p.outputs.iter().find(|(x, _)| !map.owns(shard, x)) {
            return outside("output", i, x);
        }
        if !p.owns_txid && p.inputs.is_empty() && p.outputs.is_empty() {
            return Err(format!("part {i} has nothing on shard {shard}"));
        }
    }
    Ok(())
}

/// A shard's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardReply {
    /// Votes, one per part.
    Prepared(Vec<Vote>),
    /// The batch's decisions are applied (now or before).
    Committed,
    /// The batch is forgotten.
    Discarded,
    /// A one-phase batch is applied: one vote per part, `Ok` meaning committed.
    Applied(Vec<Vote>),
    /// The command does not fit the shard's state (it changed nothing, except that a newer
    /// term of its sender's group is now the newest).
    Refused(String),
    /// The sender's term is below the newest term this shard has taken from its group: it is a
    /// deposed leader (nothing changed). Carries that newest term.
    Deposed(u64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Prepared {
    parts: Vec<Part>,
    votes: Vec<Vote>,
}

/// The shard's state.
///
/// A snapshot ([`ShardState::snapshot_into`]) writes the two large maps as flat records straight
/// into the output buffer (one pass over each map, no intermediate copy: a shard of millions of
/// ids snapshots at memory speed and needs one state's size of memory for it, not three) and
/// the rest with postcard.
#[derive(Debug, Clone, Default)]
pub struct ShardState {
    unspent: HashMap<UhsId, u64, Fast>,
    /// What `unspent` could hold when last sized ([`florin_ledger::expiry::keep_room`]).
    unspent_room: usize,
    /// Confirmed txids, each with the [`tag`] of the batch that confirmed it: transfers and
    /// redeems until their expiry, mints for ever. Its clock is the shard's.
    confirmed: TxMemory<u64>,
    rest: Rest,
    /// One-phase batches whose `Apply` ran here (snapshotted after `rest`).
    applied: AppliedBatches,
}

/// The one-phase batches whose `Apply` ran, newest last, at most [`APPLIED_MEMORY`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AppliedBatches {
    ids: HashSet<Dtx>,
    order: VecDeque<Dtx>,
}

impl AppliedBatches {
    fn remember(&mut self, dtx: Dtx) {
        if self.ids.insert(dtx) {
            self.order.push_back(dtx);
            while self.order.len() > APPLIED_MEMORY {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
    }
}

/// Everything but the two large maps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Rest {
    /// Locked inputs and txids, by batch.
    #[serde(with = "florin_ledger::bin_serde::id_map")]
    locks: HashMap<Digest, Dtx, Fast>,
    prepared: HashMap<Dtx, Prepared>,
    committed: HashSet<Dtx>,
    discarded: HashSet<Dtx>,
    discarded_order: VecDeque<Dtx>,
    books: Supply,
    /// The newest term taken from each coordinator group.
    fences: BTreeMap<u16, u64>,
}

/// Bytes of one record of a snapshot's unspent map: a 32-byte id and a little-endian u64.
const RECORD: usize = 40;
/// Bytes of one confirmed txid in a snapshot: the txid, its tag and its expiry.
const CONFIRMED_RECORD: usize = 48;
/// The first bytes of a snapshot written with expiries (older ones begin with the unspent
/// count, which can never equal these bytes read as a count: no snapshot is that long).
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"FLSHRD02";

fn put_map(out: &mut Vec<u8>, m: &HashMap<[u8; 32], u64, Fast>) {
    out.extend_from_slice(&(m.len() as u64).to_le_bytes());
    for (k, v) in m {
        out.extend_from_slice(k);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Why [`ShardState::from_snapshot`] refused a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The snapshot ends before the maps it announces.
    #[error("shard snapshot: truncated")]
    Truncated,
    /// A map's length does not fit this machine's address space.
    #[error("shard snapshot: too large")]
    TooLarge,
    /// The rest of the state (after the maps) does not decode.
    #[error("undecodable: {0}")]
    Undecodable(#[from] postcard::Error),
    /// Written before transactions carried an expiry (no `FLSHRD02` magic): this version does
    /// not read it. Such a cluster is recreated (`florin cluster down`, then `up`).
    #[error("shard snapshot: written before transaction expiry (no FLSHRD02 magic); this version does not read it: recreate the cluster")]
    Legacy,
}

fn take_map(b: &mut &[u8]) -> Result<HashMap<[u8; 32], u64, Fast>, SnapshotError> {
    let (n, rest) = b.split_first_chunk::<8>().ok_or(SnapshotError::Truncated)?;
    let n = usize::try_from(u64::from_le_bytes(*n)).map_err(|_| SnapshotError::TooLarge)?;
    let len = n
        .checked_mul(RECORD)
        .filter(|l| *l <= rest.len())
        .ok_or(SnapshotError::Truncated)?;
    let (records, rest) = rest.split_at(len);
    // Twice the entries, as `keep_room` keeps it: the first apply after loading does not
    // rehash the whole set inside a Raft apply.
    let mut m = HashMap::with_capacity_and_hasher(2 * n + 1024, Fast::default());
    for r in records.chunks_exact(RECORD) {
        let mut id = [0u8; 32];
        id.copy_from_slice(&r[..32]);
        let mut v = [0u8; 8];
        v.copy_from_slice(&r[32..]);
        m.insert(id, u64::from_le_bytes(v));
    }
    *b = rest;
    Ok(m)
}

impl ShardState {
    /// An empty shard.
    pub fn new() -> ShardState {
        ShardState::default()
    }

    /// Applies one command from `by`: refused with [`ShardReply::Deposed`] if a newer term of
    /// `by`'s group was taken before; otherwise `by`'s term becomes the group's newest.
    pub fn apply(&mut self, by: Fence, cmd: ShardCmd) -> ShardReply {
        let newest = self.rest.fences.entry(by.group).or_insert(by.term);
        if by.term < *newest {
            return ShardReply::Deposed(*newest);
        }
        *newest = by.term;
        match cmd {
            ShardCmd::Prepare { dtx, parts, now } => {
                self.confirmed.advance(now);
                self.prepare(dtx, parts)
            }
            ShardCmd::Commit { dtx, commit } => self.commit(dtx, &commit),
            ShardCmd::Discard { dtx } => self.discard(dtx),
            ShardCmd::Apply { dtx, parts, now } => {
                self.confirmed.advance(now);
                self.apply_one_phase(dtx, &parts)
            }
        }
    }

    fn prepare(&mut self, dtx: Dtx, parts: Vec<Part>) -> ShardReply {
        if let Some(p) = self.rest.prepared.get(&dtx) {
            return ShardReply::Prepared(p.votes.clone());
        }
        if self.rest.committed.contains(&dtx) || self.rest.discarded.contains(&dtx) {
            return ShardReply::Refused(format!("batch {dtx:032x} is already finished"));
        }
        let mut votes = Vec::with_capacity(parts.len());
        for part in &parts {
            let vote = self.vote(part);
            if vote == Vote::Ok {
                for i in &part.inputs {
                    self.rest.locks.insert(*i, dtx);
                }
                if part.owns_txid {
                    self.rest.locks.insert(part.txid, dtx);
                }
            }
            votes.push(vote);
        }
        self.rest.prepared.insert(
            dtx,
            Prepared {
                parts,
                votes: votes.clone(),
            },
        );
        ShardReply::Prepared(votes)
    }

    fn vote(&self, part: &Part) -> Vote {
        if part.owns_txid {
            if let Some(t) = self.confirmed.get(&part.txid) {
                // Confirmed by a two-phase batch not yet discarded here: its commit may still
                // be on its way to the transaction's other shards (a batch is discarded only
                // once every shard has committed it). A replay waits until then, so that once
                // it is answered as applied, every output of the first submission is readable.
                if self.rest.committed.iter().any(|d| tag(*d) == *t) {
                    return Vote::Committing;
                }
                return Vote::Applied;
            }
        }
        if part.owns_txid && self.rest.locks.contains_key(&part.txid) {
            return Vote::InFlight;
        }
        // A locked input first: the batch holding it may be this very transaction's, still
        // committing here after its other shards (whose txid record may already be past its
        // expiry). Answered expired now, a wallet would find this input unspent and be told
        // nothing was paid; retried, it is answered once that batch has finished.
        if part.inputs.iter().any(|i| self.rest.locks.contains_key(i)) {
            return Vote::Busy;
        }
        if part.expires < self.confirmed.now() {
            return Vote::Expired;
        }
        if part.inputs.iter().any(|i| !self.unspent.contains_key(i)) || has_duplicate(&part.inputs)
        {
            return Vote::Missing;
        }
        Vote::Ok
    }

    fn commit(&mut self, dtx: Dtx, commit: &[bool]) -> ShardReply {
        if self.rest.committed.contains(&dtx) || self.rest.discarded.contains(&dtx) {
            return ShardReply::Committed;
        }
        let Some(p) = self.rest.prepared.get(&dtx) else {
            // Aborting a batch never prepared here (this shard refused its `Prepare`, or never
            // got it) has nothing to undo. (A `Prepare` arriving later is undone by the
            // batch's `Discard`, or refused after it.)
            if commit.iter().all(|c| !c) {
                return ShardReply::Committed;
            }
            return ShardReply::Refused(format!("batch {dtx:032x} was never prepared here"));
        };
        if p.parts.len() != commit.len() {
            return ShardReply::Refused(format!(
                "batch {dtx:032x} has {} parts here, the commit names {}",
                p.parts.len(),
                commit.len()
            ));
        }
        if let Some(i) = (0..commit.len()).find(|i| commit[*i] && p.votes[*i] != Vote::Ok) {
            return ShardReply::Refused(format!(
                "batch {dtx:032x}: part {i} voted {:?} and cannot commit",
                p.votes[i]
            ));
        }
        let Some(p) = self.rest.prepared.remove(&dtx) else {
            return ShardReply::Refused("unreachable".into());
        };
        for (part, (&yes, vote)) in p.parts.iter().zip(commit.iter().zip(&p.votes)) {
            if *vote == Vote::Ok {
                self.unlock(part, dtx);
            }
            if !yes {
                continue;
            }
            self.effect(part, tag(dtx));
        }
        self.rest.committed.insert(dtx);
        ShardReply::Committed
    }

    /// Deletes a committed part's inputs, inserts its outputs and records its txid.
    fn effect(&mut self, part: &Part, tag: u64) {
        // Saturating: the books must never panic inside a replicated apply.
        let b = &mut self.rest.books;
        for i in &part.inputs {
            if let Some(v) = self.unspent.remove(i) {
                b.unspent_cents = b.unspent_cents.saturating_sub(v);
                b.unspent_count = b.unspent_count.saturating_sub(1);
                if part.kind == TxKind::Redeem {
                    b.redeemed_cents = b.redeemed_cents.saturating_add(v);
                }
            }
        }
        self.effect_outputs(part, tag);
    }

    /// The outputs and txid half of [`Self::effect`].
    fn effect_outputs(&mut self, part: &Part, tag: u64) {
        florin_ledger::expiry::keep_room(
            &mut self.unspent,
            &mut self.unspent_room,
            part.outputs.len(),
        );
        let b = &mut self.rest.books;
        for (o, v) in &part.outputs {
            // An existing id is never overwritten (as in every single-node store).
            if let std::collections::hash_map::Entry::Vacant(e) = self.unspent.entry(*o) {
                e.insert(*v);
                b.unspent_cents = b.unspent_cents.saturating_add(*v);
                b.unspent_count += 1;
                if part.kind == TxKind::Mint {
                    b.minted_cents = b.minted_cents.saturating_add(*v);
                }
            }
        }
        if part.owns_txid {
            let keep = if part.kind == TxKind::Mint {
                FOR_EVER
            } else {
                part.expires
            };
            self.confirmed.insert(part.txid, tag, keep);
        }
    }

    /// One-phase commit of a batch wholly on this shard.
    fn apply_one_phase(&mut self, dtx: Dtx, parts: &[Part]) -> ShardReply {
        if self.rest.prepared.contains_key(&dtx)
            || self.rest.committed.contains(&dtx)
            || self.rest.discarded.contains(&dtx)
        {
            return ShardReply::Refused(format!("batch {dtx:032x} is a two-phase batch here"));
        }
        if let Some(i) = parts.iter().position(|p| !p.owns_txid) {
            return ShardReply::Refused(format!(
                "batch {dtx:032x}: part {i} does not lie wholly on this shard"
            ));
        }
        let tag = tag(dtx);
        if self.applied.ids.contains(&dtx) {
            // A resent or duplicated `Apply`: nothing is applied again. A part this batch
            // confirmed is `Ok` as the first time; one another batch confirmed is `Applied`;
            // any other was not applied the first time (missing or busy then) and must not be
            // now (the coordinator may already have answered it refused): `Busy`, so that a
            // coordinator that lost the first answer retries it in a new batch, which decides
            // it afresh.
            let votes = parts
                .iter()
                .map(|part| match self.confirmed.get(&part.txid) {
                    Some(t) if *t == tag => Vote::Ok,
                    Some(_) => Vote::Applied,
                    None => Vote::Busy,
                })
                .collect();
            return ShardReply::Applied(votes);
        }
        self.applied.remember(dtx);
        let votes = parts
            .iter()
            .map(|part| {
                if let Some(t) = self.confirmed.get(&part.txid) {
                    // Confirmed by an earlier batch: a replay.
                    return if *t == tag { Vote::Ok } else { Vote::Applied };
                }
                if part.expires < self.confirmed.now()
                    && !part.inputs.iter().any(|i| self.rest.locks.contains_key(i))
                {
                    return Vote::Expired;
                }
                if self.rest.locks.is_empty() && part.inputs.len() <= 16 {
                    return self.apply_unlocked(part, tag);
                }
                let vote = self.vote(part);
                if vote == Vote::Ok {
                    self.effect(part, tag);
                }
                vote
            })
            .collect();
        ShardReply::Applied(votes)
    }

    /// [`Self::vote`] then [`Self::effect`] for a part with at most 16 inputs, when nothing is
    /// locked and its txid is not confirmed: each input is looked up once (removed, and put
    /// back if a later one is missing).
    fn apply_unlocked(&mut self, part: &Part, tag: u64) -> Vote {
        if has_duplicate(&part.inputs) {
            return Vote::Missing;
        }
        let mut values = [0u64; 16];
        for (k, i) in part.inputs.iter().enumerate() {
            match self.unspent.remove(i) {
                Some(v) => values[k] = v,
                None => {
                    for (j, v) in part.inputs[..k].iter().zip(values) {
                        self.unspent.insert(*j, v);
                    }
                    return Vote::Missing;
                }
            }
        }
        let b = &mut self.rest.books;
        for v in &values[..part.inputs.len()] {
            b.unspent_cents = b.unspent_cents.saturating_sub(*v);
            b.unspent_count = b.unspent_count.saturating_sub(1);
            if part.kind == TxKind::Redeem {
                b.redeemed_cents = b.redeemed_cents.saturating_add(*v);
            }
        }
        // The inputs are gone already: only outputs and the txid are left to record.
        self.effect_outputs(part, tag);
        Vote::Ok
    }

    fn unlock(&mut self, part: &Part, dtx: Dtx) {
        for i in part
            .inputs
            .iter()
            .chain(part.owns_txid.then_some(&part.txid))
        {
            if self.rest.locks.get(i) == Some(&dtx) {
                self.rest.locks.remove(i);
            }
        }
    }

    fn discard(&mut self, dtx: Dtx) -> ShardReply {
        if let Some(p) = self.rest.prepared.remove(&dtx) {
            // Discarding a batch that never committed aborts it.
            for (part, vote) in p.parts.iter().zip(&p.votes) {
                if *vote == Vote::Ok {
                    self.unlock(part, dtx);
                }
            }
        }
        self.rest.committed.remove(&dtx);
        if self.rest.discarded.insert(dtx) {
            self.rest.discarded_order.push_back(dtx);
            while self.rest.discarded_order.len() > DISCARDED_MEMORY {
                if let Some(old) = self.rest.discarded_order.pop_front() {
                    self.rest.discarded.remove(&old);
                }
            }
        }
        ShardReply::Discarded
    }

    /// About how many bytes the state's snapshot takes (to size its buffer).
    pub fn encoded_size_hint(&self) -> usize {
        4096 + self.unspent.len() * RECORD
            + self.confirmed.len() * CONFIRMED_RECORD
            + self.rest.locks.len() * 49
    }

    /// Appends the state's snapshot to `out`: [`SNAPSHOT_MAGIC`] and the shard's clock, the
    /// unspent map as counted flat records (id, value), the confirmed txids as counted flat
    /// records (txid, tag, expiry), then the rest (locks, batches, books, fences) with postcard.
    pub fn snapshot_into(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_size_hint());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&self.confirmed.now().to_le_bytes());
        put_map(out, &self.unspent);
        out.extend_from_slice(&(self.confirmed.len() as u64).to_le_bytes());
        for (txid, t, expires) in self.confirmed.iter() {
            out.extend_from_slice(txid);
            out.extend_from_slice(&t.to_le_bytes());
            out.extend_from_slice(&expires.to_le_bytes());
        }
        if let Ok(v) = postcard::to_extend(&self.rest, std::mem::take(out)) {
            *out = v;
        }
        if let Ok(v) = postcard::to_extend(&self.applied, std::mem::take(out)) {
            *out = v;
        }
    }

    /// The state a snapshot holds; a truncated or damaged snapshot is an error.
    pub fn from_snapshot(mut b: &[u8]) -> Result<ShardState, SnapshotError> {
        let mut confirmed = TxMemory::default();
        let unspent;
        if let Some(rest) = b.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
            let (now, rest) = rest
                .split_first_chunk::<8>()
                .ok_or(SnapshotError::Truncated)?;
            confirmed.advance(u64::from_le_bytes(*now));
            b = rest;
            unspent = take_map(&mut b)?;
            let (n, rest) = b.split_first_chunk::<8>().ok_or(SnapshotError::Truncated)?;
            let n = usize::try_from(u64::from_le_bytes(*n)).map_err(|_| SnapshotError::TooLarge)?;
            let len = n
                .checked_mul(CONFIRMED_RECORD)
                .filter(|l| *l <= rest.len())
                .ok_or(SnapshotError::Truncated)?;
            let (records, rest) = rest.split_at(len);
            confirmed.reserve(n + n / 4);
            for r in records.chunks_exact(CONFIRMED_RECORD) {
                let mut txid = [0u8; 32];
                txid.copy_from_slice(&r[..32]);
                let word = |at: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&r[at..at + 8]);
                    u64::from_le_bytes(w)
                };
                confirmed.insert(txid, word(32), word(40));
            }
            b = rest;
        } else {
            // Written before transaction expiry: its prepared parts have no expiry, so the rest
            // of it would decode shifted (postcard keeps no field names). Refused, not misread.
            return Err(SnapshotError::Legacy);
        }
        let (rest, tail) = postcard::take_from_bytes(b)?;
        // Snapshots written before the one-phase memory existed end after `rest`.
        let applied = if tail.is_empty() {
            AppliedBatches::default()
        } else {
            postcard::from_bytes(tail)?
        };
        Ok(ShardState {
            unspent_room: unspent.capacity(),
            unspent,
            confirmed,
            rest,
            applied,
        })
    }

    /// Whether an id is unspent (locked ids are still unspent).
    pub fn is_unspent(&self, id: &UhsId) -> bool {
        self.unspent.contains_key(id)
    }

    /// Whether a txid owned by this shard is confirmed.
    pub fn is_confirmed(&self, txid: &Digest) -> bool {
        self.confirmed.contains(txid)
    }

    /// How many confirmed txids the shard remembers (the replay-answer state), and its clock.
    pub fn remembered(&self) -> (usize, u64) {
        (self.confirmed.len(), self.confirmed.now())
    }

    /// This shard's books (sum them over shards for the ledger's).
    pub fn books(&self) -> Supply {
        self.rest.books
    }

    /// The newest term taken from a coordinator group (`None` before its first command).
    pub fn fence(&self, group: u16) -> Option<u64> {
        self.rest.fences.get(&group).copied()
    }

    /// Batches prepared and not yet committed or discarded, and locks held.
    pub fn in_flight(&self) -> (usize, usize) {
        (
            self.rest.prepared.len() + self.rest.committed.len(),
            self.rest.locks.len(),
        )
    }

    /// Inserts unspent outputs directly (genesis in tests and simulations).
    pub fn seed(&mut self, outputs: &[(UhsId, u64)]) {
        for (o, v) in outputs {
            if self.unspent.insert(*o, *v).is_none() {
                self.rest.books.unspent_cents += v;
                self.rest.books.unspent_count += 1;
                self.rest.books.minted_cents += v;
            }
        }
    }

    /// Every unspent id with its value (for audits in tests).
    pub fn unspent(&self) -> impl Iterator<Item = (&UhsId, &u64)> {
        self.unspent.iter()
    }

    /// Every confirmed txid.
    pub fn confirmed(&self) -> impl Iterator<Item = &Digest> {
        self.confirmed.iter().map(|(t, _, _)| t)
    }
}

/// The 64-bit tag a confirmed txid keeps of the batch that confirmed it (batch ids are
/// random, so two batches share a tag with probability 2⁻⁶⁴).
fn tag(dtx: Dtx) -> u64 {
    dtx as u64
}

fn has_duplicate(ids: &[UhsId]) -> bool {
    if ids.len() < 2 {
        return false;
    }
    if ids.len() <= 16 {
        // Pairwise, without allocating: transactions have a handful of inputs.
        return ids
            .iter()
            .enumerate()
            .any(|(k, a)| ids[k + 1..].contains(a));
    }
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.windows(2).any(|w| w[0] == w[1])
}

/// Encodes a value with postcard (commands, replies, snapshots).
pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).unwrap_or_default()
}

/// Why [`decode`] refused bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not a postcard encoding of the expected type.
    #[error("undecodable: {0}")]
    Undecodable(#[from] postcard::Error),
    /// The bytes decode, but to a state this replica must not take.
    #[error("refused: {0}")]
    Refused(String),
}

/// Decodes a postcard value.
pub fn decode<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<T, DecodeError> {
    Ok(postcard::from_bytes(b)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use florin_ledger::store::testing::id;

    /// The sender of the tests that are not about fencing.
    const BY: Fence = Fence { group: 0, term: 1 };

    fn part(txid: u64, owns: bool, inputs: &[u64], outputs: &[(u64, u64)]) -> Part {
        Part {
            expires: u64::MAX,
            txid: id(1000 + txid),
            owns_txid: owns,
            kind: TxKind::Transfer,
            inputs: inputs.iter().map(|i| id(*i)).collect(),
            outputs: outputs.iter().map(|(i, v)| (id(*i), *v)).collect(),
        }
    }

    fn round_trip(s: &ShardState) -> ShardState {
        let mut bytes = Vec::new();
        s.snapshot_into(&mut bytes);
        ShardState::from_snapshot(&bytes).unwrap()
    }

    fn seeded() -> ShardState {
        let mut s = ShardState::new();
        s.seed(&[(id(1), 10), (id(2), 20), (id(3), 30)]);
        s
    }

    #[test]
    fn prepare_locks_commit_swaps_discard_forgets() {
        let mut s = seeded();
        let parts = vec![
            part(1, true, &[1], &[(10, 10)]),
            part(2, true, &[1, 2], &[(11, 30)]),
            part(3, true, &[99], &[]),
        ];
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                dtx: 7,
                parts,
                now: 0,
            },
        );
        // The second part finds input 1 locked by the first: busy, not spent.
        assert_eq!(
            r,
            ShardReply::Prepared(vec![Vote::Ok, Vote::Busy, Vote::Missing])
        );
        assert_eq!(s.in_flight(), (1, 2)); // input 1 and txid 1
                                           // A retried prepare answers the same and locks nothing more.
        assert_eq!(
            s.apply(
                BY,
                ShardCmd::Prepare {
                    now: 0,
                    dtx: 7,
                    parts: vec![]
                }
            ),
            r
        );
        assert_eq!(
            s.apply(
                BY,
                ShardCmd::Commit {
                    dtx: 7,
                    commit: vec![true, false, false]
                }
            ),
            ShardReply::Committed
        );
        assert!(!s.is_unspent(&id(1)) && s.is_unspent(&id(10)) && s.is_unspent(&id(2)));
        assert!(s.is_confirmed(&id(1001)) && !s.is_confirmed(&id(1002)));
        assert_eq!(s.in_flight(), (1, 0));
        // A retried commit is acknowledged and changes nothing.
        let books = s.books();
        assert_eq!(
            s.apply(
                BY,
                ShardCmd::Commit {
                    dtx: 7,
                    commit: vec![true, false, false]
                }
            ),
            ShardReply::Committed
        );
        assert_eq!(s.books(), books);
        assert_eq!(books.unspent_cents, 60);
        assert_eq!(
            s.apply(BY, ShardCmd::Discard { dtx: 7 }),
            ShardReply::Discarded
        );
        assert_eq!(s.in_flight(), (0, 0));
        // A late duplicate prepare of a finished batch is refused and locks nothing.
        let late = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 7,
                parts: vec![part(4, true, &[2], &[])],
            },
        );
        assert!(matches!(late, ShardReply::Refused(_)));
        assert_eq!(s.in_flight(), (0, 0));
    }

    #[test]
    fn replays_and_bad_commits_are_refused() {
        let mut s = seeded();
        s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 1,
                parts: vec![part(1, true, &[1], &[(10, 10)])],
            },
        );
        // Commit naming the wrong number of parts, or committing a non-Ok vote: refused.
        assert!(matches!(
            s.apply(
                BY,
                ShardCmd::Commit {
                    dtx: 1,
                    commit: vec![true, true]
                }
            ),
            ShardReply::Refused(_)
        ));
        // Aborting a batch never prepared here has nothing to undo; committing one is refused.
        assert_eq!(
            s.apply(
                BY,
                ShardCmd::Commit {
                    dtx: 9,
                    commit: vec![false, false]
                }
            ),
            ShardReply::Committed
        );
        assert!(matches!(
            s.apply(
                BY,
                ShardCmd::Commit {
                    dtx: 9,
                    commit: vec![true]
                }
            ),
            ShardReply::Refused(_)
        ));
        s.apply(
            BY,
            ShardCmd::Commit {
                dtx: 1,
                commit: vec![true],
            },
        );
        // The same transaction in a new batch while batch 1 is not yet discarded: it waits
        // (batch 1 may still be committing elsewhere); once discarded, a replay.
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 2,
                parts: vec![part(1, true, &[1], &[(10, 10)])],
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Vote::Committing]));
        s.apply(BY, ShardCmd::Discard { dtx: 2 });
        s.apply(BY, ShardCmd::Discard { dtx: 1 });
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 12,
                parts: vec![part(1, true, &[1], &[(10, 10)])],
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Vote::Applied]));
        // A part that is not ours to confirm sees only the spent input.
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 3,
                parts: vec![part(1, false, &[1], &[])],
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Vote::Missing]));
        // Spending one input twice in one transaction is refused.
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 4,
                parts: vec![part(5, true, &[2, 2], &[])],
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Vote::Missing]));
        // Discarding a prepared batch aborts it: its locks go.
        s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 5,
                parts: vec![part(6, true, &[3], &[])],
            },
        );
        assert_eq!(s.in_flight().1, 2);
        s.apply(BY, ShardCmd::Discard { dtx: 5 });
        assert!(s.is_unspent(&id(3)));
        assert_eq!(
            s.apply(
                BY,
                ShardCmd::Prepare {
                    now: 0,
                    dtx: 6,
                    parts: vec![part(6, true, &[3], &[])]
                }
            ),
            ShardReply::Prepared(vec![Vote::Ok])
        );
    }

    #[test]
    fn books_count_mints_and_redemptions_where_the_ids_live() {
        let mut s = ShardState::new();
        let mut mint = part(1, true, &[], &[(1, 100)]);
        mint.kind = TxKind::Mint;
        s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 1,
                parts: vec![mint],
            },
        );
        s.apply(
            BY,
            ShardCmd::Commit {
                dtx: 1,
                commit: vec![true],
            },
        );
        let mut redeem = part(2, false, &[1], &[]);
        redeem.kind = TxKind::Redeem;
        s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 2,
                parts: vec![redeem],
            },
        );
        s.apply(
            BY,
            ShardCmd::Commit {
                dtx: 2,
                commit: vec![true],
            },
        );
        let b = s.books();
        assert_eq!(
            (b.minted_cents, b.redeemed_cents, b.unspent_cents),
            (100, 100, 0)
        );
        // The state survives a snapshot round trip.
        let back = round_trip(&s);
        assert_eq!(back.books(), b);
        assert!(ShardState::from_snapshot(&[0xff; 3]).is_err());
    }

    fn prepare(dtx: Dtx, parts: Vec<Part>) -> ShardCmd {
        ShardCmd::Prepare { dtx, parts, now: 0 }
    }

    fn commit(dtx: Dtx, commit: &[bool]) -> ShardCmd {
        ShardCmd::Commit {
            dtx,
            commit: commit.to_vec(),
        }
    }

    #[test]
    fn a_deposed_leaders_late_prepare_of_a_forgotten_batch_locks_nothing() {
        let old = Fence { group: 0, term: 1 };
        let new = Fence { group: 0, term: 2 };
        let mut s = seeded();
        // The old leader prepares batch 7, then is deposed.
        let spend = || vec![part(1, true, &[1], &[(10, 10)])];
        assert_eq!(
            s.apply(old, prepare(7, spend())),
            ShardReply::Prepared(vec![Vote::Ok])
        );
        // The new leader resumes it from `Begin`: its retried prepare gets the stored votes;
        // the batch is decided not to commit (say another shard was busy), then discarded.
        assert_eq!(
            s.apply(new, prepare(7, spend())),
            ShardReply::Prepared(vec![Vote::Ok])
        );
        assert_eq!(s.apply(new, commit(7, &[false])), ShardReply::Committed);
        assert_eq!(
            s.apply(new, ShardCmd::Discard { dtx: 7 }),
            ShardReply::Discarded
        );
        assert_eq!(s.in_flight(), (0, 0));
        // So many later batches are discarded that batch 7 is forgotten.
        for dtx in 100..100 + DISCARDED_MEMORY as Dtx {
            s.apply(new, ShardCmd::Discard { dtx });
        }
        assert!(!s.rest.discarded.contains(&7));
        // The old leader, still resending, must not lock input 1 again: nobody would release it.
        assert_eq!(s.apply(old, prepare(7, spend())), ShardReply::Deposed(2));
        assert_eq!(s.apply(old, commit(7, &[true])), ShardReply::Deposed(2));
        assert_eq!(
            s.apply(old, ShardCmd::Discard { dtx: 7 }),
            ShardReply::Deposed(2)
        );
        assert_eq!(s.in_flight(), (0, 0));
        assert!(s.is_unspent(&id(1)) && !s.is_unspent(&id(10)));
        // Input 1 is free for the next batch.
        assert_eq!(
            s.apply(new, prepare(8, vec![part(2, true, &[1], &[])])),
            ShardReply::Prepared(vec![Vote::Ok])
        );
        // A restarted shard (its snapshot) still knows the group's newest term.
        let back = round_trip(&s);
        assert_eq!(back.fence(0), Some(2));
        let mut back = back;
        assert_eq!(back.apply(old, prepare(7, spend())), ShardReply::Deposed(2));
    }

    #[test]
    fn phases_stay_idempotent_across_leaders_and_groups_are_fenced_apart() {
        let (t1, t2, t3) = (
            Fence { group: 0, term: 1 },
            Fence { group: 0, term: 2 },
            Fence { group: 0, term: 3 },
        );
        let other = Fence { group: 1, term: 1 };
        let mut s = seeded();
        let p = || vec![part(1, true, &[1], &[(10, 10)]), part(2, true, &[99], &[])];
        let votes = ShardReply::Prepared(vec![Vote::Ok, Vote::Missing]);
        // Retries within a term get the first answer.
        assert_eq!(s.apply(t1, prepare(7, p())), votes);
        assert_eq!(s.apply(t1, prepare(7, p())), votes);
        // The new leader finishes the old leader's batch from its last phase: prepare again
        // (stored votes), then commit, each retried.
        assert_eq!(s.apply(t2, prepare(7, p())), votes);
        assert_eq!(s.apply(t1, prepare(7, p())), ShardReply::Deposed(2));
        assert_eq!(
            s.apply(t2, commit(7, &[true, false])),
            ShardReply::Committed
        );
        let books = s.books();
        assert_eq!(
            s.apply(t2, commit(7, &[true, false])),
            ShardReply::Committed
        );
        assert_eq!(s.books(), books);
        // A third leader resumes at `Decide` (the second died before `Done`): commit again is
        // acknowledged, discard forgets; both retried.
        assert_eq!(
            s.apply(t3, commit(7, &[true, false])),
            ShardReply::Committed
        );
        for _ in 0..2 {
            assert_eq!(
                s.apply(t3, ShardCmd::Discard { dtx: 7 }),
                ShardReply::Discarded
            );
        }
        assert_eq!(
            s.apply(t3, commit(7, &[true, false])),
            ShardReply::Committed
        );
        assert_eq!(s.books(), books);
        assert!(s.is_confirmed(&id(1001)) && s.is_unspent(&id(10)));
        assert_eq!(s.in_flight(), (0, 0));
        // Another coordinator group's terms are its own: its term 1 is not deposed by group
        // 0's term 3, and a refused command leaves the newest terms as they were.
        assert_eq!(
            s.apply(other, prepare(9, vec![part(3, true, &[2], &[])])),
            ShardReply::Prepared(vec![Vote::Ok])
        );
        assert_eq!(
            (s.fence(0), s.fence(1), s.fence(2)),
            (Some(3), Some(1), None)
        );
    }

    #[test]
    fn apply_commits_in_one_phase_and_answers_a_retry_as_the_first_time() {
        let mut s = seeded();
        let before = s.books();
        let parts = vec![
            part(1, true, &[1], &[(10, 10)]),
            // Spends what the first part made: applied in order within the batch.
            part(2, true, &[10], &[(11, 10)]),
            part(3, true, &[99], &[]),
            part(4, true, &[2, 2], &[(12, 40)]),
            // The second input is missing: the first must stay unspent.
            part(5, true, &[2, 98], &[(13, 20)]),
        ];
        let cmd = ShardCmd::Apply {
            now: 0,
            dtx: 7,
            parts: parts.clone(),
        };
        let first = s.apply(BY, cmd.clone());
        use Vote::*;
        assert_eq!(
            first,
            ShardReply::Applied(vec![Ok, Ok, Missing, Missing, Missing])
        );
        assert!(!s.is_unspent(&id(1)) && !s.is_unspent(&id(10)) && s.is_unspent(&id(11)));
        assert!(s.is_unspent(&id(2)), "a failed part gives back its inputs");
        assert!(s.is_confirmed(&id(1001)) && s.is_confirmed(&id(1002)));
        assert!(!s.is_confirmed(&id(1003)) && !s.is_confirmed(&id(1005)));
        // Nothing stays locked or in flight; value is conserved.
        assert_eq!(s.in_flight(), (0, 0));
        assert_eq!(s.books().unspent_cents, before.unspent_cents);
        assert_eq!(s.books().unspent_count, before.unspent_count);
        // The same command again (a lost answer): the confirmed parts answer as the first time,
        // the others `Busy` (retry in a new batch); nothing is applied twice.
        assert_eq!(
            s.apply(BY, cmd),
            ShardReply::Applied(vec![Ok, Ok, Busy, Busy, Busy])
        );
        assert_eq!(s.books().unspent_cents, before.unspent_cents);
        // Another batch with a confirmed transaction: a replay.
        let again = ShardCmd::Apply {
            now: 0,
            dtx: 8,
            parts: vec![parts[0].clone()],
        };
        assert_eq!(s.apply(BY, again), ShardReply::Applied(vec![Applied]));
    }

    /// Found by the `cluster_model` fuzz target: a part refused for a missing input, whose
    /// input appears afterwards, must not be applied by a resend of the same batch (the
    /// coordinator may have answered it refused already).
    #[test]
    fn a_resent_apply_never_applies_what_the_first_refused() {
        use Vote::*;
        let mut s = seeded();
        let spend_50 = ShardCmd::Apply {
            now: 0,
            dtx: 7,
            parts: vec![part(1, true, &[50], &[(51, 5)])],
        };
        assert_eq!(
            s.apply(BY, spend_50.clone()),
            ShardReply::Applied(vec![Missing])
        );
        // Another batch makes output 50.
        let mint = ShardCmd::Apply {
            now: 0,
            dtx: 8,
            parts: vec![part(2, true, &[], &[(50, 5)])],
        };
        assert_eq!(s.apply(BY, mint), ShardReply::Applied(vec![Ok]));
        // The first batch resent (its answer was lost, or the network duplicated it):
        // nothing is applied; `Busy` sends the coordinator to a new batch.
        let again = s.apply(BY, spend_50.clone());
        assert_eq!(again, ShardReply::Applied(vec![Busy]));
        assert!(s.is_unspent(&id(50)) && !s.is_confirmed(&id(1001)));
        // Also after a snapshot (a restarted replica remembers the batch).
        let mut restored = round_trip(&s);
        assert_eq!(
            restored.apply(BY, spend_50),
            ShardReply::Applied(vec![Busy])
        );
        assert!(restored.is_unspent(&id(50)));
        // A new batch decides it afresh: applied now.
        let retry = ShardCmd::Apply {
            now: 0,
            dtx: 9,
            parts: vec![part(1, true, &[50], &[(51, 5)])],
        };
        assert_eq!(restored.apply(BY, retry), ShardReply::Applied(vec![Ok]));
        assert!(!restored.is_unspent(&id(50)) && restored.is_confirmed(&id(1001)));
    }

    #[test]
    fn expired_parts_change_nothing_and_confirmed_transfers_are_forgotten_at_expiry() {
        use Vote::*;
        let mut s = seeded();
        let timed = |txid: u64, inputs: &[u64], outputs: &[(u64, u64)], expires: u64| Part {
            expires,
            ..part(txid, true, inputs, outputs)
        };
        let apply = |dtx: Dtx, parts: Vec<Part>, now: u64| ShardCmd::Apply { dtx, parts, now };
        // At 100: a transfer valid until 110 applies; one valid until 99 does not.
        let pay = timed(1, &[1], &[(10, 10)], 110);
        let late = timed(2, &[2], &[(11, 20)], 99);
        let mut mint = timed(3, &[], &[(12, 5)], 110);
        mint.kind = TxKind::Mint;
        assert_eq!(
            s.apply(
                BY,
                apply(1, vec![pay.clone(), late.clone(), mint.clone()], 100)
            ),
            ShardReply::Applied(vec![Ok, Expired, Ok])
        );
        assert!(s.is_unspent(&id(2)) && !s.is_unspent(&id(11)));
        assert_eq!(s.remembered(), (2, 100));
        // Within its validity a replay is a replay.
        assert_eq!(
            s.apply(BY, apply(2, vec![pay.clone()], 110)),
            ShardReply::Applied(vec![Applied])
        );
        // Past it, the transfer is forgotten and its replay refused as expired (never
        // applied, never "missing"); the mint is remembered for ever. A snapshot keeps the
        // clock and the expiries.
        let mut s = round_trip(&s);
        assert_eq!(s.remembered(), (2, 110));
        assert_eq!(
            s.apply(BY, apply(3, vec![pay.clone(), mint.clone()], 111)),
            ShardReply::Applied(vec![Expired, Applied])
        );
        assert_eq!(s.remembered(), (1, 111));
        assert!(s.is_confirmed(&mint.txid) && !s.is_confirmed(&pay.txid));
        // A two-phase part that expired votes so and locks nothing; an earlier clock from a
        // lagging coordinator does not turn the shard's back.
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                dtx: 4,
                parts: vec![timed(5, &[3], &[(13, 30)], 110)],
                now: 50,
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Expired]));
        assert_eq!(s.in_flight().1, 0);
        assert_eq!(s.remembered().1, 111);
        // Across shards: a replay after expiry is answered expired, not missing; a mint's
        // replay stays a replay.
        use crate::coordinator::{decide, Decision};
        assert_eq!(decide(&[Expired, Missing]), Decision::Expired);
        assert_eq!(decide(&[Applied, Expired]), Decision::Applied);
        // A locked input elsewhere may be this transaction's own batch still committing: try
        // again rather than answer expired while its input looks unspent.
        assert_eq!(decide(&[Busy, Expired]), Decision::Retry);
        assert_eq!(decide(&[Busy, Missing]), Decision::Retry);
    }

    #[test]
    fn a_snapshot_from_before_expiry_is_refused_not_misread() {
        let s = seeded();
        let mut bytes = Vec::new();
        put_map(&mut bytes, &s.unspent);
        put_map(&mut bytes, &HashMap::default());
        bytes = postcard::to_extend(&s.rest, bytes).unwrap();
        assert_eq!(
            ShardState::from_snapshot(&bytes).unwrap_err(),
            SnapshotError::Legacy
        );
        // One with the magic but cut short is refused too.
        let mut good = Vec::new();
        s.snapshot_into(&mut good);
        assert!(ShardState::from_snapshot(&good[..good.len() / 2]).is_err());
        assert!(ShardState::from_snapshot(&good).is_ok());
    }

    #[test]
    fn apply_respects_two_phase_locks_and_refuses_what_is_not_its_own() {
        let mut s = seeded();
        let r = s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 1,
                parts: vec![part(1, true, &[1], &[(10, 10)])],
            },
        );
        assert_eq!(r, ShardReply::Prepared(vec![Vote::Ok]));
        // Input 1 and txid 1 are locked by the two-phase batch.
        let r = s.apply(
            BY,
            ShardCmd::Apply {
                now: 0,
                dtx: 2,
                parts: vec![
                    part(2, true, &[1], &[(11, 10)]),
                    part(1, true, &[2], &[(12, 20)]),
                    part(3, true, &[3], &[(13, 30)]),
                ],
            },
        );
        assert_eq!(
            r,
            ShardReply::Applied(vec![Vote::Busy, Vote::InFlight, Vote::Ok])
        );
        // A part whose txid is on another shard cannot be applied in one phase.
        let r = s.apply(
            BY,
            ShardCmd::Apply {
                now: 0,
                dtx: 3,
                parts: vec![part(4, false, &[2], &[])],
            },
        );
        assert!(matches!(r, ShardReply::Refused(_)), "{r:?}");
        assert!(s.is_unspent(&id(2)));
        // A two-phase batch id cannot be reused for a one-phase batch.
        let r = s.apply(
            BY,
            ShardCmd::Apply {
                now: 0,
                dtx: 1,
                parts: vec![part(5, true, &[2], &[])],
            },
        );
        assert!(matches!(r, ShardReply::Refused(_)), "{r:?}");
        // A deposed sender changes nothing.
        let old = Fence { group: 0, term: 0 };
        let r = s.apply(
            old,
            ShardCmd::Apply {
                now: 0,
                dtx: 4,
                parts: vec![part(6, true, &[2], &[])],
            },
        );
        assert_eq!(r, ShardReply::Deposed(1));
        assert!(s.is_unspent(&id(2)));
    }

    #[test]
    fn a_snapshot_round_trips_through_the_compact_encoding() {
        let mut s = seeded();
        s.apply(
            BY,
            ShardCmd::Prepare {
                now: 0,
                dtx: 1,
                parts: vec![part(1, true, &[1], &[(10, 10)])],
            },
        );
        s.apply(
            BY,
            ShardCmd::Apply {
                now: 0,
                dtx: 2,
                parts: vec![part(2, true, &[2], &[(11, 20)])],
            },
        );
        let mut bytes = Vec::new();
        s.snapshot_into(&mut bytes);
        assert!(bytes.len() < s.encoded_size_hint());
        // Two counts and one 40-byte record per id (1, 3, 11) and confirmed txid, then the rest.
        assert!(bytes.len() > 16 + 4 * RECORD);
        let back = ShardState::from_snapshot(&bytes).unwrap();
        let mut again = Vec::new();
        back.snapshot_into(&mut again);
        assert_eq!(again.len(), bytes.len());
        assert!(back.is_unspent(&id(1)) && back.is_unspent(&id(11)) && !back.is_unspent(&id(2)));
        assert!(back.is_confirmed(&id(1002)));
        assert_eq!(back.in_flight(), (1, 2));
        assert_eq!(back.books(), s.books());
        // A truncated snapshot is an error, not a smaller state, whatever the cut.
        for cut in [
            0,
            7,
            8,
            50,
            16 + 4 * RECORD + 3,
            bytes.len() / 2,
            bytes.len() - 1,
        ] {
            assert!(
                ShardState::from_snapshot(&bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        // A count larger than the bytes that follow is refused without allocating for it.
        let mut huge = u64::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&bytes[8..]);
        assert!(ShardState::from_snapshot(&huge).is_err());
    }
    #[test]
    fn a_replay_is_applied_only_once_its_first_batch_is_committed_everywhere() {
        // Transaction 1 spends id 1 on shard A, which owns its txid; its output (id 9) lives
        // on shard B. Batch 5 is prepared on both and so far committed on A only.
        let mut a = seeded();
        let mut b = ShardState::new();
        let on_a = part(1, true, &[1], &[]);
        let on_b = part(1, false, &[], &[(9, 10)]);
        a.apply(BY, prepare(5, vec![on_a.clone()]));
        b.apply(BY, prepare(5, vec![on_b.clone()]));
        assert_eq!(a.apply(BY, commit(5, &[true])), ShardReply::Committed);
        assert!(a.is_confirmed(&on_a.txid) && !b.is_unspent(&id(9)));
        // A resubmission of the same transaction (batch 6) must not be told "applied" while
        // batch 5's output is not yet readable on B: it waits.
        assert_eq!(
            a.apply(BY, prepare(6, vec![on_a.clone()])),
            ShardReply::Prepared(vec![Vote::Committing])
        );
        // Once B has committed and the coordinator discarded batch 5, a replay is a replay.
        assert_eq!(b.apply(BY, commit(5, &[true])), ShardReply::Committed);
        assert!(b.is_unspent(&id(9)));
        a.apply(BY, ShardCmd::Discard { dtx: 5 });
        b.apply(BY, ShardCmd::Discard { dtx: 5 });
        assert_eq!(
            a.apply(BY, prepare(7, vec![on_a.clone()])),
            ShardReply::Prepared(vec![Vote::Applied])
        );
        // The same holds across a snapshot taken while batch 5 is committed but not discarded.
        let mut a2 = seeded();
        a2.apply(BY, prepare(5, vec![on_a.clone()]));
        a2.apply(BY, commit(5, &[true]));
        let mut a2 = round_trip(&a2);
        assert_eq!(
            a2.apply(BY, prepare(6, vec![on_a])),
            ShardReply::Prepared(vec![Vote::Committing])
        );
    }

    #[test]
    fn commands_round_trip_with_parts_inline_and_spilled() {
        // Up to two inputs and outputs stay inline; more spill to the heap. Both decode alike.
        let cmd = ShardCmd::Prepare {
            now: 0,
            dtx: 7,
            parts: vec![
                part(1, true, &[], &[]),
                part(2, false, &[1, 2], &[(3, 4), (5, 6)]),
                part(
                    3,
                    true,
                    &[7, 8, 9, 10, 11],
                    &[(12, 1), (13, 2), (14, 3), (15, 4), (16, 5)],
                ),
            ],
        };
        let bytes = encode(&cmd);
        let back: ShardCmd = decode(&bytes).unwrap();
        assert_eq!(back, cmd);
        let ShardCmd::Prepare { parts, .. } = back else {
            panic!("not a prepare")
        };
        assert!(!parts[1].inputs.spilled() && !parts[1].outputs.spilled());
        assert!(parts[2].inputs.spilled() && parts[2].outputs.spilled());
        assert_eq!(parts[2].inputs.len(), 5);
        // Truncated commands are errors whatever the cut.
        for cut in [0, 1, bytes.len() / 2, bytes.len() - 1] {
            assert!(decode::<ShardCmd>(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}

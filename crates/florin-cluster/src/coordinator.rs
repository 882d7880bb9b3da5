//! The two-phase-commit coordinator as a pure event machine.
//!
//! [`Coordinator`] takes [`Input`]s (submissions, replication done, shard answers, clock ticks,
//! a leadership change) and returns [`Output`]s (replicate this entry, send that command to
//! shard s, answer that submitter). It opens no sockets and reads no clock: the service in
//! `florin-node` carries its outputs, and simulations drive it deterministically.
//!
//! One batch (a distributed transaction, `dtx`) goes through:
//! 1. `Begin { dtx, txs }` is replicated (the prepare phase's inputs are durable),
//! 2. `Prepare` to every involved shard, in parallel; votes come back,
//! 3. `Decide { dtx, decisions }` is replicated (the commit phase's inputs are durable),
//! 4. `Commit` to every involved shard; once all acknowledge, submitters are answered,
//! 5. `Discard` to every involved shard, then `Done { dtx }` is replicated.
//!
//! A transaction that lies wholly on one shard (its inputs, outputs and txid) needs no
//! agreement between shards: with [`CoordinatorConfig::one_phase`] (the default) such
//! transactions of a batch go to their shard as one `Apply` command (one-phase commit, the
//! classic single-participant optimisation of 2PC) and nothing is replicated by the
//! coordinator group for them. The shard's own Raft log is then the only record, and nothing
//! stays locked: if this leader fails before answering, the submitter retries with the next
//! one and the shard answers a transaction it already confirmed as a replay. Transactions that
//! span shards take the two-phase path below in the same round.
//!
//! A new leader replays [`CoordLog`], the replicated record of unfinished batches, as
//! [`Input::Resume`] and finishes each batch from its last replicated phase. Every send is
//! repeated on [`Input::Tick`] until answered; shards answer repeats idempotently.
//!
//! Every send carries the coordinator's [`Fence`] (its group and its leader's Raft term). Once a
//! later leader's command has reached a shard, the shard answers a deposed leader with
//! [`ShardReply::Deposed`] and changes nothing. That is what makes it safe for the old leader to
//! go on resending: a batch it was preparing is finished by the new leader (it is in the log),
//! whose `Commit` and `Discard` reach every shard of the batch with the newer term before that
//! shard can forget the batch, so a late `Prepare` of the old leader can never lock again.
//!
//! A transaction that meets an input locked by a batch in flight is retried in a later batch
//! (`max_attempts` times at once, then backing off as below), so concurrent conflicting spends
//! never both commit and an honest spend is not failed by a conflicting one that then aborts.
//! A transaction whose own txid is locked (a resubmission while the first submission is still
//! in flight, e.g. after a leader change) backs off and tries again until that batch has
//! finished, and is then answered as a replay. After `MAX_WAITS` backed-off tries the
//! submission fails as in doubt: a lock says nothing about whether the input is spent, so it is
//! never answered as a missing input.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use florin_ledger::{CompactTx, SwapOutcome, UhsId};
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};

use crate::route::{ShardId, ShardMap};
use crate::shard::{Fence, Part, ShardCmd, ShardReply, Vote};
use crate::Dtx;

/// Ids are uniformly random hashes; a keyed fast hasher is enough (and iteration order never
/// decides anything).
type Fast = foldhash::fast::RandomState;

/// Who asked: the service's handle for a submission.
pub type Ticket = u64;

/// What the coordinator decided for one transaction of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Every shard voted `Ok`: commit.
    Commit,
    /// An input is spent or unknown.
    Missing,
    /// The transaction was confirmed before.
    Applied,
    /// An input was locked by another batch: abort now, try again later (a bounded number
    /// of times).
    Retry,
    /// The same transaction is in flight in another batch: wait for it (not counted as a
    /// try; that batch finishes, after which this one is a replay).
    Wait,
    /// The transaction is confirmed and its batch is still committing on other shards: wait
    /// for that, then answer it as a replay (as a replay too if waiting runs out: it is
    /// confirmed, only its outputs may not be readable everywhere yet).
    Confirming,
    /// A shard refused the batch's `Prepare` (it does not fit that shard: an id outside its
    /// range, bytes that do not decode — a configuration or build that differs between
    /// coordinator and shard). The whole batch aborts, its locks are released, and its
    /// submitters are failed with the shard's words. (Last, so older logs still decode.)
    Refused,
    /// The transaction's expiry is before a shard's clock and it is not remembered as
    /// confirmed: it is answered expired. (Last, so older logs still decode.)
    Expired,
}

/// An entry of the coordinator's replicated log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoordEntry {
    /// A batch begins (before any prepare is sent).
    Begin {
        /// The batch.
        dtx: Dtx,
        /// Its transactions.
        txs: Vec<CompactTx>,
    },
    /// The batch's decisions (before any commit is sent).
    Decide {
        /// The batch.
        dtx: Dtx,
        /// One per transaction.
        decisions: Vec<Decision>,
    },
    /// The batch is committed and discarded everywhere.
    Done {
        /// The batch.
        dtx: Dtx,
    },
}

/// An unfinished batch as replicated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedBatch {
    /// Its transactions.
    pub txs: Vec<CompactTx>,
    /// Its decisions, once replicated.
    pub decisions: Option<Vec<Decision>>,
}

/// The coordinator's replicated state: unfinished batches.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CoordLog {
    batches: BTreeMap<Dtx, LoggedBatch>,
    /// Batches finished since the group began (for status).
    pub finished: u64,
}

impl CoordLog {
    /// Applies one entry. Unknown batches in `Decide`/`Done` are ignored (a replay).
    pub fn apply(&mut self, e: &CoordEntry) {
        match e {
            CoordEntry::Begin { dtx, txs } => {
                self.batches.entry(*dtx).or_insert_with(|| LoggedBatch {
                    txs: txs.clone(),
                    decisions: None,
                });
            }
            CoordEntry::Decide { dtx, decisions } => {
                if let Some(b) = self.batches.get_mut(dtx) {
                    if b.decisions.is_none() && decisions.len() == b.txs.len() {
                        b.decisions = Some(decisions.clone());
                    }
                }
            }
            CoordEntry::Done { dtx } => {
                if self.batches.remove(dtx).is_some() {
                    self.finished += 1;
                }
            }
        }
    }

    /// Unfinished batches.
    pub fn batches(&self) -> &BTreeMap<Dtx, LoggedBatch> {
        &self.batches
    }
}

/// Tuning.
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorConfig {
    /// Most transactions in one batch.
    pub max_batch: usize,
    /// Most batches between `Begin` and their commit acknowledgements at once.
    pub max_inflight: usize,
    /// Immediate tries for a transaction that keeps meeting locks, before it backs off.
    pub max_attempts: u8,
    /// Repeat an unanswered send after this long (in the caller's clock units, e.g. ms).
    pub resend_after: u64,
    /// Commit transactions that lie wholly on one shard in one phase (no coordinator log, no
    /// locks); off, every transaction takes the two-phase path.
    pub one_phase: bool,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            max_batch: 4096,
            max_inflight: 4,
            max_attempts: 8,
            resend_after: 2000,
            one_phase: true,
        }
    }
}

/// An event for the coordinator.
#[derive(Debug, Clone)]
pub enum Input {
    /// Transactions to apply; answered once, in order, by [`Output::Answer`].
    Submit {
        /// The submitter's handle.
        ticket: Ticket,
        /// The transactions.
        txs: Vec<CompactTx>,
        /// The submitter's clock (Unix seconds): the coordinator's clock, sent to shards with
        /// `Prepare` and `Apply`, is the highest it was given.
        now: u64,
    },
    /// A [`Output::Replicate`] entry is committed by the group.
    Replicated(CoordEntry),
    /// A shard answered.
    Reply {
        /// The batch.
        dtx: Dtx,
        /// The shard.
        shard: ShardId,
        /// Its answer.
        reply: ShardReply,
    },
    /// The clock (the caller's units): repeats unanswered sends.
    Tick(u64),
    /// This replica became leader: finish these unfinished batches (from [`CoordLog`]).
    Resume(BTreeMap<Dtx, LoggedBatch>),
}

/// A command from the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Replicate this entry, then feed it back as [`Input::Replicated`].
    Replicate(CoordEntry),
    /// Send this command to the leader of `shard`, feed its answer back as [`Input::Reply`].
    Send {
        /// The shard.
        shard: ShardId,
        /// The sender: this coordinator's group and term (the shard refuses a deposed term).
        by: Fence,
        /// The command.
        cmd: ShardCmd,
    },
    /// A submission is decided.
    Answer {
        /// The submitter's handle.
        ticket: Ticket,
        /// One outcome per transaction, in order.
        outcomes: Vec<SwapOutcome>,
    },
    /// A submission cannot be decided here: a shard refused a batch holding some of its
    /// transactions (a refusal changes nothing on the shard, and the same command would be
    /// refused again: bytes that do not decode, from a build that differs between coordinator
    /// and shard, or a batch id already used), or one of its transactions found its inputs
    /// locked through every retry and wait. Its other transactions may still commit in other
    /// batches, so the submitter holds the whole submission as in doubt, as after a lost
    /// leader: a resubmission is answered by txid.
    Fail {
        /// The submitter's handle.
        ticket: Ticket,
        /// Why: what the shard said, or that the inputs stayed locked.
        why: String,
    },
    /// Something the operator must hear of (the service logs it and counts it in the
    /// coordinator's status): a shard refused a batch's `Prepare`, and the batch was aborted.
    Alert {
        /// The batch.
        dtx: Dtx,
        /// The shard.
        shard: ShardId,
        /// What happened.
        why: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A one-phase batch: `Apply` sent to its one shard.
    Applying,
    Beginning,
    Preparing,
    Deciding,
    Committing,
    Discarding,
    Finishing,
}

#[derive(Debug, Clone, Copy)]
struct Origin {
    ticket: Ticket,
    pos: usize,
    attempts: u8,
    waits: u16,
}

struct Flight {
    txs: Vec<CompactTx>,
    /// Where each transaction came from (none after a leadership change).
    origins: Vec<Option<Origin>>,
    phase: Phase,
    /// Per shard: the indices of its transactions in `txs`.
    plan: BTreeMap<ShardId, Vec<usize>>,
    /// Shards whose answer to the current phase is awaited.
    waiting: BTreeSet<ShardId>,
    votes: Vec<Vec<Vote>>,
    decisions: Vec<Decision>,
    sent_at: u64,
    /// A shard refused the batch's `Prepare`: its words (the batch aborts).
    refused: Option<String>,
    /// The transactions with a part on a shard that refused (the others are retried).
    refused_txs: BTreeSet<usize>,
}

struct TicketState {
    outcomes: Vec<Option<SwapOutcome>>,
    left: usize,
}

struct Queued {
    tx: CompactTx,
    origin: Origin,
    /// Not before this time (a transaction waiting for its own duplicate backs off).
    not_before: u64,
}

/// The key an output is tracked by while its batch is in flight: the id's first 8 bytes. Ids
/// are SHA-256 hashes, so two outputs in flight share a key with probability 2⁻⁶⁴ per pair,
/// and a shared key only makes a spend wait for a batch it does not depend on; the table is
/// 12 bytes an entry instead of 40 and hashes 8 bytes instead of 32.
fn key(id: &UhsId) -> u64 {
    let mut k = [0u8; 8];
    k.copy_from_slice(&id[..8]);
    u64::from_le_bytes(k)
}

/// Most times a transaction waits for a duplicate of itself in flight elsewhere, or for inputs
/// that stayed locked through its quick retries (each wait backs off `resend_after / 16`),
/// before its submission is failed as in doubt.
const MAX_WAITS: u16 = 160;

/// The coordinator (one per coordinator group leader).
pub struct Coordinator {
    map: ShardMap,
    by: Fence,
    cfg: CoordinatorConfig,
    rng: Box<dyn RngCore + Send>,
    queue: VecDeque<Queued>,
    flights: HashMap<Dtx, Flight>,
    tickets: HashMap<Ticket, TicketState>,
    /// Batches before their commit is acknowledged (the in-flight limit counts these).
    active: usize,
    /// Outputs of batches before their commit is acknowledged (counted: a transaction can be
    /// in two batches, e.g. resumed and resubmitted), by [`key`].
    producing: HashMap<u64, u32, Fast>,
    now: u64,
    /// The clock shards are sent (Unix seconds): the highest a submission carried.
    wall: u64,
}

impl Coordinator {
    /// A coordinator routing by `map`, drawing batch ids from `rng`, for the leader `by` of its
    /// group: every command it sends carries `by`, so shards refuse it once a later leader of
    /// the group has reached them. A new leader makes a new coordinator with its own term.
    pub fn new(
        map: ShardMap,
        cfg: CoordinatorConfig,
        by: Fence,
        rng: Box<dyn RngCore + Send>,
    ) -> Self {
        Coordinator {
            map,
            by,
            cfg,
            rng,
            queue: VecDeque::new(),
            flights: HashMap::new(),
            tickets: HashMap::new(),
            active: 0,
            producing: HashMap::default(),
            now: 0,
            wall: 0,
        }
    }

    /// Transactions waiting for a batch.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Batches not finished.
    pub fn in_flight(&self) -> usize {
        self.flights.len()
    }

    /// Submissions not yet answered.
    pub fn open_tickets(&self) -> usize {
        self.tickets.len()
    }

    /// Handles one event.
    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::Submit { ticket, txs, now } => {
                if !txs.is_empty() {
                    self.wall = self.wall.max(now);
                }
                if txs.is_empty() {
                    out.push(Output::Answer {
                        ticket,
                        outcomes: vec![],
                    });
                } else {
                    self.tickets.insert(
                        ticket,
                        TicketState {
                            outcomes: vec![None; txs.len()],
                            left: txs.len(),
                        },
                    );
                    for (pos, tx) in txs.into_iter().enumerate() {
                        self.queue.push_back(Queued {
                            tx,
                            origin: Origin {
                                ticket,
                                pos,
                                attempts: 0,
                                waits: 0,
                            },
                            not_before: 0,
                        });
                    }
                }
            }
            Input::Replicated(entry) => self.replicated(entry, &mut out),
            Input::Reply { dtx, shard, reply } => self.reply(dtx, shard, reply, &mut out),
            Input::Tick(now) => {
                self.now = now;
                self.resend(&mut out);
            }
            Input::Resume(batches) => {
                for (dtx, b) in batches {
                    if self.flights.contains_key(&dtx) {
                        continue;
                    }
                    let n = b.txs.len();
                    self.produce(&b.txs);
                    let mut f = self.flight(b.txs, vec![None; n]);
                    self.active += 1;
                    match b.decisions {
                        None => self.send_prepares(dtx, &mut f, &mut out),
                        Some(d) => {
                            f.decisions = d;
                            self.send_commits(dtx, &mut f, &mut out);
                        }
                    }
                    self.flights.insert(dtx, f);
                }
            }
        }
        self.pump(&mut out);
        out
    }

    fn flight(&self, txs: Vec<CompactTx>, origins: Vec<Option<Origin>>) -> Flight {
        let mut plan: BTreeMap<ShardId, Vec<usize>> = BTreeMap::new();
        let mut shards: Vec<ShardId> = Vec::new();
        for (i, tx) in txs.iter().enumerate() {
            shards.clear();
            shards.extend(tx.inputs.iter().map(|x| self.map.shard_of(x)));
            shards.extend(tx.outputs.iter().map(|(x, _)| self.map.shard_of(x)));
            shards.push(self.map.shard_of(&tx.txid));
            shards.sort_unstable();
            shards.dedup();
            for s in &shards {
                plan.entry(*s).or_default().push(i);
            }
        }
        let n = txs.len();
        Flight {
            txs,
            origins,
            phase: Phase::Beginning,
            plan,
            waiting: BTreeSet::new(),
            votes: vec![Vec::new(); n],
            decisions: Vec::new(),
            sent_at: self.now,
            refused: None,
            refused_txs: BTreeSet::new(),
        }
    }

    /// Starts batches while there is room. A transaction spending an output that a batch in
    /// flight (or the batch being formed) creates waits for that batch to commit, so a
    /// submission's transactions apply as if one after another, as on a single node.
    fn pump(&mut self, out: &mut Vec<Output>) {
        while self.active < self.cfg.max_inflight && !self.queue.is_empty() {
            let mut batch: Vec<Queued> = Vec::new();
            // Outputs of transactions held back: what spends them is held too. (Outputs of
            // the batch being formed go into `producing` as each transaction joins it.)
            let mut held_made: HashSet<u64, Fast> = HashSet::default();
            let mut held = VecDeque::new();
            while let Some(q) = self.queue.pop_front() {
                if batch.len() >= self.cfg.max_batch.max(1) {
                    self.queue.push_front(q);
                    break;
                }
                let blocked = q.not_before > self.now
                    || q.tx.inputs.iter().any(|i| {
                        self.producing.contains_key(&key(i))
                            || (!held_made.is_empty() && held_made.contains(&key(i)))
                    });
                if blocked {
                    held_made.extend(q.tx.outputs.iter().map(|(o, _)| key(o)));
                    held.push_back(q);
                } else {
                    self.produce(std::slice::from_ref(&q.tx));
                    batch.push(q);
                }
            }
            held.append(&mut self.queue);
            self.queue = held;
            if batch.is_empty() {
                break;
            }
            // Transactions wholly on one shard go to it in one phase, the rest in two.
            let mut single: BTreeMap<ShardId, (Vec<CompactTx>, Vec<Option<Origin>>)> =
                BTreeMap::new();
            let (mut txs, mut origins) = (Vec::new(), Vec::new());
            for q in batch {
                match self.home(&q.tx) {
                    Some(s) => {
                        let e = single.entry(s).or_default();
                        e.0.push(q.tx);
                        e.1.push(Some(q.origin));
                    }
                    None => {
                        txs.push(q.tx);
                        origins.push(Some(q.origin));
                    }
                }
            }
            for (shard, (txs, origins)) in single {
                let dtx: Dtx = self.rng.gen();
                let mut f = self.flight(txs, origins);
                f.phase = Phase::Applying;
                f.waiting = BTreeSet::from([shard]);
                out.push(self.send(shard, self.phase_cmd(dtx, &f, shard)));
                self.flights.insert(dtx, f);
                self.active += 1;
            }
            if txs.is_empty() {
                continue;
            }
            let dtx: Dtx = self.rng.gen();
            let f = self.flight(txs.clone(), origins);
            self.flights.insert(dtx, f);
            self.active += 1;
            out.push(Output::Replicate(CoordEntry::Begin { dtx, txs }));
        }
    }

    /// The one shard a transaction lies on, if one-phase commit is on and it lies on one.
    fn home(&self, tx: &CompactTx) -> Option<ShardId> {
        if !self.cfg.one_phase {
            return None;
        }
        let s = self.map.shard_of(&tx.txid);
        let here = tx.inputs.iter().all(|x| self.map.shard_of(x) == s)
            && tx.outputs.iter().all(|(x, _)| self.map.shard_of(x) == s);
        here.then_some(s)
    }

    fn produce(&mut self, txs: &[CompactTx]) {
        for tx in txs {
            for (o, _) in &tx.outputs {
                *self.producing.entry(key(o)).or_insert(0) += 1;
            }
        }
    }

    fn produced(&mut self, txs: &[CompactTx]) {
        for tx in txs {
            for (o, _) in &tx.outputs {
                if let Some(n) = self.producing.get_mut(&key(o)) {
                    *n -= 1;
                    if *n == 0 {
                        self.producing.remove(&key(o));
                    }
                }
            }
        }
    }

    fn replicated(&mut self, entry: CoordEntry, out: &mut Vec<Output>) {
        match entry {
            CoordEntry::Begin { dtx, .. } => {
                if let Some(mut f) = self.flights.remove(&dtx) {
                    if f.phase == Phase::Beginning {
                        self.send_prepares(dtx, &mut f, out);
                    }
                    self.flights.insert(dtx, f);
                }
            }
            CoordEntry::Decide { dtx, .. } => {
                if let Some(mut f) = self.flights.remove(&dtx) {
                    if f.phase == Phase::Deciding {
                        self.send_commits(dtx, &mut f, out);
                    }
                    self.flights.insert(dtx, f);
                }
            }
            CoordEntry::Done { dtx } => {
                if self.flights.get(&dtx).map(|f| f.phase) == Some(Phase::Finishing) {
                    self.flights.remove(&dtx);
                }
            }
        }
    }

    fn parts(f: &Flight, map: &ShardMap, shard: ShardId) -> Vec<Part> {
        let Some(idx) = f.plan.get(&shard) else {
            return vec![];
        };
        idx.iter()
            .map(|&i| {
                let tx = &f.txs[i];
                Part {
                    txid: tx.txid,
                    owns_txid: map.owns(shard, &tx.txid),
                    kind: tx.kind,
                    inputs: tx
                        .inputs
                        .iter()
                        .filter(|x| map.owns(shard, x))
                        .copied()
                        .collect(),
                    outputs: tx
                        .outputs
                        .iter()
                        .filter(|(x, _)| map.owns(shard, x))
                        .copied()
                        .collect(),
                    expires: tx.expires,
                }
            })
            .collect()
    }

    fn send_prepares(&self, dtx: Dtx, f: &mut Flight, out: &mut Vec<Output>) {
        f.phase = Phase::Preparing;
        f.waiting = f.plan.keys().copied().collect();
        f.sent_at = self.now;
        for s in &f.waiting {
            out.push(self.send(*s, self.phase_cmd(dtx, f, *s)));
        }
    }

    fn send_commits(&self, dtx: Dtx, f: &mut Flight, out: &mut Vec<Output>) {
        f.phase = Phase::Committing;
        f.waiting = f.plan.keys().copied().collect();
        f.sent_at = self.now;
        for s in &f.waiting {
            out.push(self.send(*s, self.phase_cmd(dtx, f, *s)));
        }
    }

    fn send(&self, shard: ShardId, cmd: ShardCmd) -> Output {
        Output::Send {
            shard,
            by: self.by,
            cmd,
        }
    }

    /// The command of the flight's current phase for one shard.
    fn phase_cmd(&self, dtx: Dtx, f: &Flight, shard: ShardId) -> ShardCmd {
        match f.phase {
            Phase::Committing => ShardCmd::Commit {
                dtx,
                commit: f
                    .plan
                    .get(&shard)
                    .map(|idx| {
                        idx.iter()
                            .map(|&i| f.decisions.get(i) == Some(&Decision::Commit))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
            Phase::Discarding => ShardCmd::Discard { dtx },
            Phase::Applying => ShardCmd::Apply {
                dtx,
                parts: Self::parts(f, &self.map, shard),
                now: self.wall,
            },
            _ => ShardCmd::Prepare {
                dtx,
                parts: Self::parts(f, &self.map, shard),
                now: self.wall,
            },
        }
    }

    fn reply(&mut self, dtx: Dtx, shard: ShardId, reply: ShardReply, out: &mut Vec<Output>) {
        let Some(mut f) = self.flights.remove(&dtx) else {
            return;
        };
        match (f.phase, reply) {
            (Phase::Applying, ShardReply::Applied(votes)) if votes.len() == f.txs.len() => {
                f.decisions = votes
                    .iter()
                    .map(|v| decide(std::slice::from_ref(v)))
                    .collect();
                self.answer(&f, out);
                self.active = self.active.saturating_sub(1);
                self.produced(&f.txs);
                // Nothing is locked and nothing was logged here: the batch is finished.
                return;
            }
            (Phase::Applying, ShardReply::Refused(why)) => {
                // Nothing was applied, and resending would be refused alike: fail the
                // submitters and free the slot instead of holding it for ever.
                self.active = self.active.saturating_sub(1);
                self.produced(&f.txs);
                let failed = f.origins.iter().flatten().map(|o| o.ticket).collect();
                let why = format!("shard {shard} refused batch {dtx:032x}: {why}");
                self.fail(failed, &why, out);
                return;
            }
            (Phase::Preparing, ShardReply::Prepared(votes)) if f.waiting.contains(&shard) => {
                let idx = f.plan.get(&shard).cloned().unwrap_or_default();
                if votes.len() == idx.len() {
                    for (i, v) in idx.iter().zip(votes) {
                        f.votes[*i].push(v);
                    }
                    f.waiting.remove(&shard);
                }
                self.decide_if_prepared(dtx, &mut f, out);
            }
            (Phase::Preparing, ShardReply::Refused(why)) if f.waiting.contains(&shard) => {
                // The same command would be refused again: the batch aborts. The other shards'
                // answers are still awaited, so that no `Prepare` is left on its way to lock
                // inputs after the batch's `Commit` (all aborts) and `Discard`.
                let why = format!("shard {shard} refused batch {dtx:032x}: {why}");
                out.push(Output::Alert {
                    dtx,
                    shard,
                    why: format!("{why} (the batch is aborted and its locks released)"),
                });
                f.refused.get_or_insert(why);
                // Only the transactions with a part there are refused; the others are tried
                // again in a later batch (this one aborts as a whole).
                if let Some(idx) = f.plan.get(&shard) {
                    f.refused_txs.extend(idx.iter().copied());
                }
                f.waiting.remove(&shard);
                self.decide_if_prepared(dtx, &mut f, out);
            }
            (Phase::Committing, ShardReply::Committed) => {
                self.committed(dtx, &mut f, shard, out);
            }
            (Phase::Discarding, ShardReply::Discarded) => {
                f.waiting.remove(&shard);
                if f.waiting.is_empty() {
                    f.phase = Phase::Finishing;
                    out.push(Output::Replicate(CoordEntry::Done { dtx }));
                }
            }
            // A late answer to an earlier phase, or a refusal of a `Commit` or `Discard`: the
            // phase's send is repeated on the next tick if still unanswered (the batch's
            // decision is logged and other shards may have applied it, so it is never dropped;
            // the service reports a refused `Commit` to the operator). A shard that refused
            // the `Prepare` takes the all-abort `Commit` as done (it has nothing to undo). (`Deposed` means a
            // later leader of this group has reached the shard: the service stops this
            // coordinator.)
            _ => {}
        }
        self.flights.insert(dtx, f);
    }

    /// Once every shard answered the `Prepare` (or refused it): decide and log the decisions.
    fn decide_if_prepared(&mut self, dtx: Dtx, f: &mut Flight, out: &mut Vec<Output>) {
        if !f.waiting.is_empty() {
            return;
        }
        f.decisions = if f.refused.is_some() {
            (0..f.txs.len())
                .map(|i| {
                    if f.refused_txs.contains(&i) {
                        Decision::Refused
                    } else {
                        Decision::Retry
                    }
                })
                .collect()
        } else {
            f.votes.iter().map(|v| decide(v)).collect()
        };
        f.phase = Phase::Deciding;
        out.push(Output::Replicate(CoordEntry::Decide {
            dtx,
            decisions: f.decisions.clone(),
        }));
    }

    /// One shard took the batch's commit; once all have, answer and discard.
    fn committed(&mut self, dtx: Dtx, f: &mut Flight, shard: ShardId, out: &mut Vec<Output>) {
        f.waiting.remove(&shard);
        if f.waiting.is_empty() {
            self.answer(f, out);
            self.active = self.active.saturating_sub(1);
            self.produced(&f.txs);
            f.phase = Phase::Discarding;
            f.waiting = f.plan.keys().copied().collect();
            f.sent_at = self.now;
            for s in &f.waiting {
                out.push(self.send(*s, ShardCmd::Discard { dtx }));
            }
        }
    }

    /// Answers submitters (or queues retries) once a batch's commits are acknowledged.
    fn answer(&mut self, f: &Flight, out: &mut Vec<Output>) {
        // Retried transactions go back to the front, in their order, ahead of whatever was
        // held behind them.
        let mut again = Vec::new();
        let mut refused = Vec::new();
        let mut gave_up = Vec::new();
        for (i, d) in f.decisions.iter().enumerate() {
            let Some(Some(o)) = f.origins.get(i) else {
                continue;
            };
            let outcome = match d {
                Decision::Refused => {
                    refused.push(o.ticket);
                    continue;
                }
                Decision::Commit => SwapOutcome::Confirmed,
                Decision::Applied => SwapOutcome::AlreadyApplied,
                Decision::Missing => SwapOutcome::MissingInput,
                Decision::Expired => SwapOutcome::Expired,
                Decision::Retry if o.attempts + 1 < self.cfg.max_attempts => {
                    again.push(Queued {
                        tx: f.txs[i].clone(),
                        origin: Origin {
                            attempts: o.attempts + 1,
                            ..*o
                        },
                        not_before: 0,
                    });
                    continue;
                }
                // Past its quick retries, a transaction whose inputs stay locked backs off as
                // one waiting for its own duplicate: the batch holding them may be one a new
                // leader is finishing, or one waiting for a shard to elect a leader.
                Decision::Retry | Decision::Wait | Decision::Confirming if o.waits < MAX_WAITS => {
                    again.push(Queued {
                        tx: f.txs[i].clone(),
                        origin: Origin {
                            waits: o.waits + 1,
                            ..*o
                        },
                        not_before: self.now + (self.cfg.resend_after / 16).max(1),
                    });
                    continue;
                }
                Decision::Confirming => SwapOutcome::AlreadyApplied,
                // Still locked after every try: nothing says the inputs are gone, so the
                // submission is failed as in doubt (never answered as a missing input, which
                // a wallet would take to mean its money is spent).
                Decision::Retry | Decision::Wait => {
                    gave_up.push(o.ticket);
                    continue;
                }
            };
            if let Some(t) = self.tickets.get_mut(&o.ticket) {
                if t.outcomes[o.pos].is_none() {
                    t.outcomes[o.pos] = Some(outcome);
                    t.left -= 1;
                }
                if t.left == 0 {
                    if let Some(t) = self.tickets.remove(&o.ticket) {
                        out.push(Output::Answer {
                            ticket: o.ticket,
                            outcomes: t.outcomes.into_iter().flatten().collect(),
                        });
                    }
                }
            }
        }
        for q in again.into_iter().rev() {
            self.queue.push_front(q);
        }
        // Submissions with a refused transaction: in doubt for the submitter, as after a
        // refused one-phase batch (their other transactions may commit in other batches).
        let why = f.refused.as_deref().unwrap_or("a shard refused the batch");
        self.fail(refused, why, out);
        self.fail(
            gave_up,
            "a transaction's inputs stayed locked by batches in flight through every retry: \
             the submission is in doubt (a resubmission is answered by txid)",
            out,
        );
    }

    /// Fails each of `tickets` still open, once, in ticket order, saying `why`.
    fn fail(&mut self, mut tickets: Vec<Ticket>, why: &str, out: &mut Vec<Output>) {
        tickets.sort_unstable();
        tickets.dedup();
        for ticket in tickets {
            if self.tickets.remove(&ticket).is_some() {
                out.push(Output::Fail {
                    ticket,
                    why: why.to_string(),
                });
            }
        }
    }

    fn resend(&mut self, out: &mut Vec<Output>) {
        let now = self.now;
        let after = self.cfg.resend_after;
        let mut due: Vec<Dtx> = self
            .flights
            .iter()
            .filter(|(_, f)| {
                matches!(
                    f.phase,
                    Phase::Applying | Phase::Preparing | Phase::Committing | Phase::Discarding
                ) && now.saturating_sub(f.sent_at) >= after
            })
            .map(|(d, _)| *d)
            .collect();
        due.sort_unstable();
        for dtx in due {
            if let Some(mut f) = self.flights.remove(&dtx) {
                f.sent_at = now;
                for s in &f.waiting {
                    out.push(self.send(*s, self.phase_cmd(dtx, &f, *s)));
                }
                self.flights.insert(dtx, f);
            }
        }
    }

    /// Drops every submission (the replica lost leadership): their submitters must retry
    /// with the new leader, which finishes the batches already begun.
    pub fn abandon(&mut self) -> Vec<Ticket> {
        self.queue.clear();
        self.flights.clear();
        self.producing.clear();
        self.active = 0;
        let mut open: Vec<Ticket> = self.tickets.drain().map(|(t, _)| t).collect();
        open.sort_unstable();
        open
    }
}

/// Combines one transaction's votes from all its shards.
pub fn decide(votes: &[Vote]) -> Decision {
    if votes.contains(&Vote::Applied) {
        Decision::Applied
    } else if votes.contains(&Vote::Committing) {
        Decision::Confirming
    } else if votes.contains(&Vote::InFlight) {
        Decision::Wait
    } else if votes.contains(&Vote::Busy) {
        // Before expired and missing: the batch holding the input may be this transaction's
        // own, still committing on that shard; answered once it has finished.
        Decision::Retry
    } else if votes.contains(&Vote::Expired) {
        // Before missing: a replay after expiry finds its inputs spent on the other shards.
        Decision::Expired
    } else if votes.contains(&Vote::Missing) {
        Decision::Missing
    } else {
        Decision::Commit
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::shard::{ShardState, DISCARDED_MEMORY};
    use florin_ledger::store::testing::{id, mint, transfer};
    use rand::SeedableRng;

    fn coord(shards: usize) -> Coordinator {
        coord_of(shards, 1)
    }

    fn coord_of(shards: usize, term: u64) -> Coordinator {
        Coordinator::new(
            ShardMap::even(shards).unwrap(),
            CoordinatorConfig {
                max_batch: 16,
                max_inflight: 2,
                max_attempts: 3,
                resend_after: 10,
                one_phase: false,
            },
            Fence { group: 0, term },
            Box::new(rand::rngs::StdRng::seed_from_u64(1)),
        )
    }

    /// A coordinator with one-phase commit on.
    fn one_phase_coord(map: &ShardMap, max_batch: usize, max_inflight: usize) -> Coordinator {
        Coordinator::new(
            map.clone(),
            CoordinatorConfig {
                max_batch,
                max_inflight,
                max_attempts: 3,
                resend_after: 10,
                one_phase: true,
            },
            Fence { group: 0, term: 1 },
            Box::new(rand::rngs::StdRng::seed_from_u64(1)),
        )
    }

    fn begin_of(out: &[Output]) -> (Dtx, Vec<CompactTx>) {
        out.iter()
            .find_map(|o| match o {
                Output::Replicate(CoordEntry::Begin { dtx, txs }) => Some((*dtx, txs.clone())),
                _ => None,
            })
            .unwrap()
    }

    fn sends(out: &[Output]) -> Vec<(ShardId, ShardCmd)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send { shard, cmd, .. } => Some((*shard, cmd.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_batch_walks_through_every_phase_in_order() {
        let map = ShardMap::even(2).unwrap();
        let mut c = coord(2);
        let t = transfer(1, &[1, 2, 3], &[(4, 6)]);
        let involved: BTreeSet<ShardId> = t
            .inputs
            .iter()
            .chain([&t.txid, &t.outputs[0].0])
            .map(|x| map.shard_of(x))
            .collect();
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 9,
            txs: vec![t.clone()],
        });
        // Nothing is sent before the batch is replicated.
        assert_eq!(out.len(), 1);
        let (dtx, txs) = begin_of(&out);
        assert_eq!(txs, vec![t.clone()]);
        let out = c.handle(Input::Replicated(CoordEntry::Begin { dtx, txs }));
        let prepares = sends(&out);
        assert_eq!(
            prepares.iter().map(|(s, _)| *s).collect::<BTreeSet<_>>(),
            involved
        );
        for (s, cmd) in &prepares {
            let ShardCmd::Prepare { parts, .. } = cmd else {
                panic!("expected prepare, got {cmd:?}")
            };
            // Each shard sees exactly its own ids.
            assert!(parts[0].inputs.iter().all(|x| map.owns(*s, x)));
            assert_eq!(parts[0].owns_txid, map.owns(*s, &t.txid));
        }
        // Votes come back; the decision is replicated before any commit goes out.
        let mut out = vec![];
        for (s, _) in &prepares {
            out = c.handle(Input::Reply {
                dtx,
                shard: *s,
                reply: ShardReply::Prepared(vec![Vote::Ok]),
            });
        }
        assert_eq!(
            out,
            vec![Output::Replicate(CoordEntry::Decide {
                dtx,
                decisions: vec![Decision::Commit]
            })]
        );
        let out = c.handle(Input::Replicated(CoordEntry::Decide {
            dtx,
            decisions: vec![Decision::Commit],
        }));
        let commits = sends(&out);
        assert!(commits.iter().all(|(_, c)| *c
            == ShardCmd::Commit {
                dtx,
                commit: vec![true]
            }));
        // The submitter is answered once every shard committed; then discards go out.
        let mut outs = vec![];
        for (s, _) in &commits {
            outs.extend(c.handle(Input::Reply {
                dtx,
                shard: *s,
                reply: ShardReply::Committed,
            }));
        }
        assert!(outs.contains(&Output::Answer {
            ticket: 9,
            outcomes: vec![SwapOutcome::Confirmed]
        }));
        let discards = sends(&outs);
        assert_eq!(discards.len(), involved.len());
        let mut outs = vec![];
        for (s, _) in &discards {
            outs.extend(c.handle(Input::Reply {
                dtx,
                shard: *s,
                reply: ShardReply::Discarded,
            }));
        }
        assert_eq!(outs, vec![Output::Replicate(CoordEntry::Done { dtx })]);
        c.handle(Input::Replicated(CoordEntry::Done { dtx }));
        assert_eq!((c.in_flight(), c.open_tickets(), c.queued()), (0, 0, 0));
    }

    /// Plays a one-shard coordinator's batches from `out` on: round `r`'s prepare gets
    /// `votes(r)`, and every batch commits. Time moves on only while nothing is due. Returns
    /// the submitter's answer or failure, the rounds played, the last round's transactions and
    /// the clock at the answer.
    fn play(
        c: &mut Coordinator,
        mut out: Vec<Output>,
        votes: impl Fn(usize) -> Vec<Vote>,
    ) -> (Output, usize, Vec<CompactTx>, u64) {
        let (mut now, mut rounds, mut last) = (0, 0, vec![]);
        for _ in 0..10_000 {
            if let Some(o) = out
                .iter()
                .find(|o| matches!(o, Output::Answer { .. } | Output::Fail { .. }))
            {
                return (o.clone(), rounds, last, now);
            }
            let begun = out.iter().find_map(|o| match o {
                Output::Replicate(CoordEntry::Begin { dtx, txs }) => Some((*dtx, txs.clone())),
                _ => None,
            });
            let Some((dtx, txs)) = begun else {
                now += 1;
                out = c.handle(Input::Tick(now));
                continue;
            };
            let o = c.handle(Input::Replicated(CoordEntry::Begin {
                dtx,
                txs: txs.clone(),
            }));
            assert_eq!(sends(&o).len(), 1);
            let o = c.handle(Input::Reply {
                dtx,
                shard: 0,
                reply: ShardReply::Prepared(votes(rounds)),
            });
            let Output::Replicate(CoordEntry::Decide { decisions, .. }) = &o[0] else {
                panic!("{o:?}")
            };
            c.handle(Input::Replicated(CoordEntry::Decide {
                dtx,
                decisions: decisions.clone(),
            }));
            out = c.handle(Input::Reply {
                dtx,
                shard: 0,
                reply: ShardReply::Committed,
            });
            (rounds, last) = (rounds + 1, txs);
        }
        panic!("no answer after 10,000 steps");
    }

    #[test]
    fn busy_transactions_are_retried_then_back_off_and_answers_keep_order() {
        // `a` meets a locked input, `b` commits. `a` is retried at once, then backs off; in
        // its fifth round the batch holding the lock has committed and the input is gone.
        let mut c = coord(1);
        let a = transfer(1, &[1], &[(2, 1)]);
        let b = mint(2, &[(3, 1)]);
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![a.clone(), b.clone()],
        });
        let (answer, rounds, last, now) = play(&mut c, out, |r| match r {
            0 => vec![Vote::Busy, Vote::Ok],
            1..=3 => vec![Vote::Busy],
            _ => vec![Vote::Missing],
        });
        assert_eq!(last, vec![a], "only the busy one is retried");
        assert_eq!(rounds, 5);
        // Rounds 1 and 2 went at once (max_attempts 3); rounds 3 and 4 each waited for the
        // clock (resend_after 10 / 16, at least 1).
        assert_eq!(now, 2, "two backed-off rounds");
        assert_eq!(
            answer,
            Output::Answer {
                ticket: 1,
                outcomes: vec![SwapOutcome::MissingInput, SwapOutcome::Confirmed]
            }
        );
    }

    #[test]
    fn a_transaction_locked_through_every_try_fails_in_doubt_and_is_never_called_missing() {
        // The batch holding the input never finishes here (after a leader change, say): the
        // submitter is told the batch is in doubt, not that its money is gone; and the same
        // for a resubmission whose first submission stays in flight.
        for vote in [Vote::Busy, Vote::InFlight] {
            let mut c = coord(1);
            let out = c.handle(Input::Submit {
                now: 0,
                ticket: 1,
                txs: vec![transfer(1, &[1], &[(2, 1)])],
            });
            let (answer, rounds, _, now) = play(&mut c, out, |_| vec![vote]);
            let Output::Fail { ticket: 1, why } = &answer else {
                panic!("{vote:?}: {answer:?}")
            };
            assert!(why.contains("in doubt"), "{why}");
            assert!(rounds > MAX_WAITS as usize, "{vote:?}: {rounds} rounds");
            // Every wait took its turn on the clock: no spinning through the tries.
            assert!(now >= MAX_WAITS as u64, "{vote:?}: gave up at {now}");
            assert_eq!((c.open_tickets(), c.queued()), (0, 0));
            // The failed submission freed its place: the next one is taken.
            let out = c.handle(Input::Submit {
                now: 0,
                ticket: 2,
                txs: vec![mint(3, &[(4, 1)])],
            });
            begin_of(&out);
        }
    }

    #[test]
    fn unanswered_sends_repeat_and_a_new_leader_resumes_from_the_log() {
        let mut c = coord(2);
        let t = transfer(1, &[1], &[(2, 1)]);
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![t.clone()],
        });
        let (dtx, txs) = begin_of(&out);
        let first = sends(&c.handle(Input::Replicated(CoordEntry::Begin { dtx, txs })));
        assert!(sends(&c.handle(Input::Tick(5))).is_empty());
        assert_eq!(sends(&c.handle(Input::Tick(10))), first);

        // The replicated log as a new leader finds it.
        let mut log = CoordLog::default();
        log.apply(&CoordEntry::Begin {
            dtx,
            txs: vec![t.clone()],
        });
        let mut d = coord(2);
        assert_eq!(
            sends(&d.handle(Input::Resume(log.batches().clone()))),
            first
        );
        log.apply(&CoordEntry::Decide {
            dtx,
            decisions: vec![Decision::Missing],
        });
        let mut e = coord(2);
        let commits = sends(&e.handle(Input::Resume(log.batches().clone())));
        assert!(commits.iter().all(|(_, c)| *c
            == ShardCmd::Commit {
                dtx,
                commit: vec![false]
            }));
        log.apply(&CoordEntry::Done { dtx });
        assert!(log.batches().is_empty() && log.finished == 1);
        // Abandoning hands back the open tickets.
        assert_eq!(c.abandon(), vec![1]);
        let _ = id(0);
    }

    /// Walks a one-transaction batch on a one-shard map through replication, an `Ok` vote,
    /// the decision and the commit; returns what the commit acknowledgement emitted.
    fn commit_one(c: &mut Coordinator, dtx: Dtx, txs: Vec<CompactTx>) -> Vec<Output> {
        c.handle(Input::Replicated(CoordEntry::Begin { dtx, txs }));
        c.handle(Input::Reply {
            dtx,
            shard: 0,
            reply: ShardReply::Prepared(vec![Vote::Ok]),
        });
        c.handle(Input::Replicated(CoordEntry::Decide {
            dtx,
            decisions: vec![Decision::Commit],
        }));
        c.handle(Input::Reply {
            dtx,
            shard: 0,
            reply: ShardReply::Committed,
        })
    }

    #[test]
    fn a_spend_of_an_output_in_flight_waits_for_its_batch() {
        let mut c = coord(1);
        let m = mint(1, &[(1, 5)]);
        let t = transfer(2, &[1], &[(2, 5)]);
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![m.clone(), t.clone()],
        });
        // Only the mint starts: the transfer spends its output.
        let (dtx, txs) = begin_of(&out);
        assert_eq!(txs, vec![m]);
        assert_eq!(c.queued(), 1);
        let out = commit_one(&mut c, dtx, txs);
        // Once the mint committed, the transfer's batch begins.
        assert_eq!(begin_of(&out).1, vec![t]);
    }

    #[test]
    fn a_chain_in_one_submission_applies_in_order() {
        let mut c = coord(1);
        let m = mint(1, &[(1, 5)]);
        let t1 = transfer(2, &[1], &[(2, 5)]);
        let t2 = transfer(3, &[2], &[(3, 5)]);
        let mut out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![m.clone(), t1.clone(), t2.clone()],
        });
        for expect in [m, t1, t2] {
            let (dtx, txs) = begin_of(&out);
            assert_eq!(txs, vec![expect], "one link per batch, in order");
            out = commit_one(&mut c, dtx, txs);
        }
        assert!(out.contains(&Output::Answer {
            ticket: 1,
            outcomes: vec![SwapOutcome::Confirmed; 3]
        }));
    }

    /// Delivers every send in `out` to its shard and returns the answers as inputs.
    fn deliver(shards: &mut [ShardState], out: &[Output]) -> Vec<Input> {
        out.iter()
            .filter_map(|o| match o {
                Output::Send { shard, by, cmd } => {
                    let dtx = cmd.dtx();
                    let reply = shards[*shard as usize].apply(*by, cmd.clone());
                    Some(Input::Reply {
                        dtx,
                        shard: *shard,
                        reply,
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// Runs `c` from `out` until it has nothing left to do, over a network that loses nothing
    /// and a group that replicates into `log`; returns the answers given.
    fn drive(
        c: &mut Coordinator,
        log: &mut CoordLog,
        shards: &mut [ShardState],
        out: Vec<Output>,
    ) -> Vec<Vec<SwapOutcome>> {
        let mut answers = Vec::new();
        let mut pending = vec![out];
        while let Some(out) = pending.pop() {
            for input in deliver(shards, &out) {
                pending.push(c.handle(input));
            }
            for o in out {
                match o {
                    Output::Replicate(e) => {
                        log.apply(&e);
                        pending.push(c.handle(Input::Replicated(e)));
                    }
                    Output::Answer { outcomes, .. } => answers.push(outcomes),
                    Output::Fail { ticket, why } => panic!("submission {ticket} failed: {why}"),
                    Output::Alert { why, .. } => panic!("alert: {why}"),
                    Output::Send { .. } => {}
                }
            }
        }
        answers
    }

    #[test]
    fn a_deposed_leader_resending_prepares_locks_nothing_after_its_batch_was_finished() {
        let map = ShardMap::even(2).unwrap();
        let on = |s: ShardId| (0..).find(|n| map.shard_of(&id(*n)) == s).unwrap();
        let (a, b) = (on(0), on(1));
        let mut shards = vec![ShardState::new(), ShardState::new()];
        shards[0].seed(&[(id(a), 5)]);
        // Spends `a` (shard 0, exists) and `b` (shard 1, unknown): shard 0 locks `a`, shard 1
        // votes missing, so the batch aborts and `a` stays unspent.
        let t = transfer(1, &[a, b], &[(a + 1000, 5)]);
        let mut log = CoordLog::default();
        let mut old = coord_of(2, 1);
        let out = old.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![t],
        });
        let (dtx, txs) = begin_of(&out);
        log.apply(&CoordEntry::Begin {
            dtx,
            txs: txs.clone(),
        });
        let prepares = old.handle(Input::Replicated(CoordEntry::Begin { dtx, txs }));
        assert!(sends(&prepares)
            .iter()
            .all(|(_, c)| matches!(c, ShardCmd::Prepare { .. })));
        // The old leader's prepares arrive (its answers do not), then it is deposed.
        deliver(&mut shards, &prepares);
        assert!(shards[0].in_flight().0 == 1 && shards[0].in_flight().1 >= 1);

        // The new leader (term 2) finishes the batch from the log: prepare again (stored votes),
        // decide, commit, discard, done. Every command it sends carries its term.
        let mut new = coord_of(2, 2);
        let resumed = new.handle(Input::Resume(log.batches().clone()));
        assert!(resumed.iter().all(|o| matches!(
            o,
            Output::Send {
                by: Fence { group: 0, term: 2 },
                ..
            }
        )));
        assert!(drive(&mut new, &mut log, &mut shards, resumed).is_empty());
        assert!(log.batches().is_empty() && log.finished == 1);
        assert!(shards.iter().all(|s| s.in_flight() == (0, 0)));
        assert_eq!(new.in_flight(), 0);
        // Shard 0 then discards so many batches that it forgets this one.
        for d in 0..DISCARDED_MEMORY as Dtx {
            shards[0].apply(
                Fence { group: 0, term: 2 },
                ShardCmd::Discard { dtx: d + 1 + dtx },
            );
        }
        // The deposed leader, unaware, resends its prepares: refused, nothing locked.
        let again = old.handle(Input::Tick(1_000));
        assert_eq!(sends(&again), sends(&prepares));
        for input in deliver(&mut shards, &again) {
            let Input::Reply { reply, .. } = input else {
                unreachable!()
            };
            assert_eq!(reply, ShardReply::Deposed(2));
        }
        assert!(shards.iter().all(|s| s.in_flight() == (0, 0)));
        assert!(shards[0].is_unspent(&id(a)));
        // `a` can be spent by the next batch.
        let out = new.handle(Input::Submit {
            now: 0,
            ticket: 2,
            txs: vec![transfer(2, &[a], &[(a + 2000, 5)])],
        });
        assert_eq!(
            drive(&mut new, &mut log, &mut shards, out),
            vec![vec![SwapOutcome::Confirmed]]
        );
        assert!(!shards[0].is_unspent(&id(a)) && shards[0].is_unspent(&id(a + 2000)));
    }

    #[test]
    fn single_shard_transactions_commit_in_one_phase_without_the_log() {
        let map = ShardMap::even(2).unwrap();
        let mut c = one_phase_coord(&map, 16, 2);
        let on = |s: ShardId, from: u64| (from..).find(|n| map.shard_of(&id(*n)) == s).unwrap();
        let a = on(0, 1);
        let b = on(0, a + 1);
        let x = on(1, 1);
        let y = on(0, b + 1);
        let mut shards = vec![ShardState::new(), ShardState::new()];
        shards[0].seed(&[(id(a), 10)]);
        shards[1].seed(&[(id(x), 10)]);
        let local = (100..)
            .map(|k| transfer(k, &[a], &[(b, 10)]))
            .find(|t| map.shard_of(&t.txid) == 0)
            .unwrap();
        let cross = transfer(1, &[x], &[(y, 10)]);
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![local.clone(), cross.clone()],
        });
        // The local transaction goes straight to its shard; only the other one is logged.
        let applies = out
            .iter()
            .filter(|o| {
                matches!(
                    o,
                    Output::Send {
                        shard: 0,
                        cmd: ShardCmd::Apply { .. },
                        ..
                    }
                )
            })
            .count();
        assert_eq!(applies, 1);
        assert_eq!(begin_of(&out).1, vec![cross]);
        let mut log = CoordLog::default();
        let answers = drive(&mut c, &mut log, &mut shards, out.clone());
        assert_eq!(answers, vec![vec![SwapOutcome::Confirmed; 2]]);
        assert!(log.batches().is_empty());
        assert!(shards[0].is_confirmed(&local.txid) && shards[0].is_unspent(&id(b)));
        assert!(!shards[0].is_unspent(&id(a)) && !shards[1].is_unspent(&id(x)));
        assert!(shards.iter().all(|s| s.in_flight() == (0, 0)));
        // The same Apply delivered again (its first answer lost) answers as the first time.
        let again = deliver(&mut shards, &out);
        assert!(again.iter().any(|i| matches!(
            i,
            Input::Reply {
                reply: ShardReply::Applied(v),
                ..
            } if v == &vec![Vote::Ok]
        )));
        // Submitted again, it is a replay.
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 2,
            txs: vec![local],
        });
        assert_eq!(
            drive(&mut c, &mut log, &mut shards, out),
            vec![vec![SwapOutcome::AlreadyApplied]]
        );
    }

    #[test]
    fn votes_combine_replays_first_and_a_confirming_replay_waits() {
        use Vote::*;
        assert_eq!(decide(&[Ok, Applied, Missing]), Decision::Applied);
        assert_eq!(decide(&[Ok, Committing, Missing]), Decision::Confirming);
        assert_eq!(decide(&[InFlight, Busy]), Decision::Wait);
        // A locked input is retried before a missing one is answered: the lock may be this
        // transaction's own batch, still committing on that shard.
        assert_eq!(decide(&[Busy, Missing]), Decision::Retry);
        assert_eq!(decide(&[Ok, Busy]), Decision::Retry);
        assert_eq!(decide(&[Ok, Ok]), Decision::Commit);
        // A replay whose first batch is still committing elsewhere is held back, and answered
        // as a replay (never as a missing input) once waiting runs out.
        let mut c = coord(1);
        let t = mint(1, &[(2, 5)]);
        let mut out = c.handle(Input::Submit {
            now: 0,
            ticket: 9,
            txs: vec![t],
        });
        let mut now = 0;
        for round in 0..=MAX_WAITS {
            let (dtx, _) = begin_of(&out);
            // Replicated: the prepare goes out (the shard's vote is played below).
            c.handle(Input::Replicated(CoordEntry::Begin {
                dtx,
                txs: vec![mint(1, &[(2, 5)])],
            }));
            out = c.handle(Input::Reply {
                dtx,
                shard: 0,
                reply: ShardReply::Prepared(vec![Vote::Committing]),
            });
            out.extend(c.handle(Input::Replicated(CoordEntry::Decide {
                dtx,
                decisions: vec![Decision::Confirming],
            })));
            out.extend(c.handle(Input::Reply {
                dtx,
                shard: 0,
                reply: ShardReply::Committed,
            }));
            let answered = out.iter().find_map(|o| match o {
                Output::Answer { outcomes, .. } => Some(outcomes.clone()),
                _ => None,
            });
            if round < MAX_WAITS {
                assert_eq!(answered, None, "round {round}");
                now += 1_000;
                out = c.handle(Input::Tick(now));
            } else {
                assert_eq!(answered, Some(vec![SwapOutcome::AlreadyApplied]));
            }
        }
    }

    /// Runs a coordinator routing by `coord_map` against shards whose services check ranges by
    /// `shard_map` (as `ShardService` does before replicating), until nothing is left to do.
    fn run_against(
        c: &mut Coordinator,
        shards: &mut [ShardState],
        shard_map: &ShardMap,
        mut out: Vec<Output>,
    ) -> Vec<Output> {
        let mut seen = Vec::new();
        let mut now = 0;
        for _ in 0..200 {
            if out.is_empty() {
                now += 10;
                out = c.handle(Input::Tick(now));
                if out.is_empty() {
                    break;
                }
            }
            let mut next = Vec::new();
            for o in out.drain(..) {
                match &o {
                    Output::Replicate(e) => next.extend(c.handle(Input::Replicated(e.clone()))),
                    Output::Send { shard, by, cmd } => {
                        let reply = match crate::shard::check_range(shard_map, *shard, cmd) {
                            Err(why) => ShardReply::Refused(why),
                            Ok(()) => shards[*shard as usize].apply(*by, cmd.clone()),
                        };
                        next.extend(c.handle(Input::Reply {
                            dtx: cmd.dtx(),
                            shard: *shard,
                            reply,
                        }));
                    }
                    _ => {}
                }
                seen.push(o);
            }
            out = next;
        }
        seen
    }

    #[test]
    fn a_prepare_refused_for_a_foreign_id_aborts_the_batch_and_releases_its_locks() {
        // The coordinator routes by an even split; the shards were configured with another
        // (shard 1 starts at 0x4000): ids in 0x4000..0x8000 are shard 1's for the shards but
        // shard 0's for the coordinator.
        let coord_map = ShardMap::even(2).unwrap();
        let shard_map = ShardMap::from_starts(vec![0, 0x4000]).unwrap();
        let agree = |x: &[u8; 32]| coord_map.shard_of(x) == shard_map.shard_of(x);
        let mut c = coord(2);
        let mut shards = vec![ShardState::new(), ShardState::new()];
        // Seed inputs where they really are.
        let ids: Vec<u64> = (1..).take(4000).collect();
        let on = |want: bool| ids.iter().copied().filter(move |n| agree(&id(*n)) == want);
        let (a, b) = {
            let mut good = on(true);
            (good.next().unwrap(), good.next().unwrap())
        };
        let foreign = on(false).next().unwrap();
        for n in [a, b, foreign] {
            shards[shard_map.shard_of(&id(n)) as usize].seed(&[(id(n), 5)]);
        }
        // A transfer spending a (agreed) and the foreign id: the shard that really owns the
        // foreign id is not asked for it, and the asked one refuses the id as not its own.
        let bad = transfer(7, &[a, foreign], &[(10_001, 10)]);
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![bad],
        });
        let seen = run_against(&mut c, &mut shards, &shard_map, out);
        let failed = seen.iter().find_map(|o| match o {
            Output::Fail { ticket: 1, why } => Some(why.clone()),
            _ => None,
        });
        assert!(
            failed
                .as_deref()
                .is_some_and(|w| w.contains("shard map differs")),
            "{failed:?}"
        );
        assert!(seen.iter().any(|o| matches!(o, Output::Alert { .. })));
        // Nothing committed, nothing left locked or prepared, nothing in flight.
        for s in &shards {
            assert_eq!(s.in_flight(), (0, 0));
        }
        assert!(shards.iter().any(|s| s.is_unspent(&id(a))));
        assert_eq!((c.in_flight(), c.open_tickets()), (0, 0));
        // A transaction whose ids both maps agree on goes through afterwards: a's lock was
        // released.
        let good = (8..)
            .map(|k| transfer(k, &[a, b], &[(10_000 + k, 10)]))
            .find(|t| agree(&t.txid) && t.outputs.iter().all(|(x, _)| agree(x)))
            .unwrap();
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 2,
            txs: vec![good],
        });
        let seen = run_against(&mut c, &mut shards, &shard_map, out);
        assert!(seen.iter().any(|o| matches!(
            o,
            Output::Answer { ticket: 2, outcomes } if outcomes == &vec![SwapOutcome::Confirmed]
        )));
        assert!(!shards.iter().any(|s| s.is_unspent(&id(a))));
    }

    #[test]
    fn ranges_are_checked_part_by_part() {
        let map = ShardMap::even(2).unwrap();
        let n0 = (1..).find(|n| map.shard_of(&id(*n)) == 0).unwrap();
        let n1 = (1..).find(|n| map.shard_of(&id(*n)) == 1).unwrap();
        let part = |txid: [u8; 32], owns: bool, inputs: &[u64]| Part {
            expires: u64::MAX,
            txid,
            owns_txid: owns,
            kind: florin_ledger::TxKind::Transfer,
            inputs: inputs.iter().map(|n| id(*n)).collect(),
            outputs: Default::default(),
        };
        let prep = |p: Part| ShardCmd::Prepare {
            now: 0,
            dtx: 1,
            parts: vec![p],
        };
        let check = |cmd: &ShardCmd| crate::shard::check_range(&map, 0, cmd);
        assert!(check(&prep(part(id(n0), true, &[n0]))).is_ok());
        assert!(check(&prep(part(id(n1), false, &[n0]))).is_ok());
        // An input of the other shard; a txid claimed that is not ours; one not claimed that
        // is; a part with nothing here.
        assert!(check(&prep(part(id(n1), false, &[n1]))).is_err());
        assert!(check(&prep(part(id(n1), true, &[n0]))).is_err());
        assert!(check(&prep(part(id(n0), false, &[n0]))).is_err());
        assert!(check(&prep(part(id(n1), false, &[]))).is_err());
        let apply = ShardCmd::Apply {
            now: 0,
            dtx: 2,
            parts: vec![part(id(n0), true, &[n1])],
        };
        assert!(check(&apply).unwrap_err().contains("input"));
        assert!(check(&ShardCmd::Discard { dtx: 3 }).is_ok());
    }

    #[test]
    fn a_refused_one_phase_batch_fails_its_submitters_and_frees_its_slot() {
        // The shard refuses the Apply (as it refuses bytes that do not decode, from a build
        // that differs from the coordinator's): every resend would be refused alike.
        let map = ShardMap::even(2).unwrap();
        let mut c = one_phase_coord(&map, 1, 1);
        let local = |k: u64| {
            (k..)
                .map(|n| mint(n, &[(n + 1_000, 5)]))
                .find(|t| map.shard_of(&t.txid) == 0 && map.shard_of(&t.outputs[0].0) == 0)
                .unwrap()
        };
        let (t1, t2) = (local(1), local(500));
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 1,
            txs: vec![t1],
        });
        let dtx = match &sends(&out)[..] {
            [(0, ShardCmd::Apply { dtx, .. })] => *dtx,
            other => panic!("expected one Apply, got {other:?}"),
        };
        // A second submission waits: the one slot is taken.
        let out = c.handle(Input::Submit {
            now: 0,
            ticket: 2,
            txs: vec![t2],
        });
        assert!(sends(&out).is_empty());
        let out = c.handle(Input::Reply {
            dtx,
            shard: 0,
            reply: ShardReply::Refused("part 0 does not lie wholly on this shard".into()),
        });
        assert!(out.iter().any(|o| matches!(
            o,
            Output::Fail { ticket: 1, why } if why.contains("does not lie wholly")
        )));
        // The slot is free: the waiting submission goes out, and nothing of the failed one
        // is resent.
        assert!(matches!(&sends(&out)[..], [(0, ShardCmd::Apply { .. })]));
        assert_eq!((c.in_flight(), c.open_tickets()), (1, 1));
        let resent = c.handle(Input::Tick(100));
        assert_eq!(sends(&resent).len(), 1, "only the second batch is resent");
    }
}

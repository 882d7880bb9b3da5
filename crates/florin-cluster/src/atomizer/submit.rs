//! The sentinel's side of the atomizer architecture, as a pure event machine: it takes
//! submissions of compact transactions, asks the shards concerned to attest each one, follows
//! each to its end on the txid's shard, and answers every submission once, in order.
//!
//! For each transaction:
//! 1. **Attest**: every shard owning one of its inputs, and the shard owning its txid, is asked
//!    to attest it at a height at least the atomizer's height when the submission began (so a
//!    missing input means missing then or later: reads are linearizable). A shard that answers
//!    `Confirmed` ends it (confirmed, if the try is this submitter's, else a replay); one that
//!    answers `Expired` or `Missing` ends it unless the txid turns out confirmed (a missing
//!    input may have been spent by an earlier try of the same transaction).
//! 2. **Wait**: once every shard has attested, the txid's shard is asked what became of it
//!    until it answers: confirmed, or rejected for one of this submitter's tries (a stale
//!    rejection starts a new try; the others end it). If no answer comes for
//!    [`SubmitConfig::wait_limit`] (an attestation lost on its way, a leader change), a new try
//!    starts: tries of the same transaction merge in the atomizer, and an earlier try that gets
//!    ordered after all is recognised by its try id.
//!
//! A transaction that runs out of tries fails its submission as in doubt (as in the two-phase
//! design: a resubmission is answered by txid).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use florin_crypto::Digest;
use florin_ledger::{CompactTx, SwapOutcome};
use rand::RngCore;
use smallvec::SmallVec;

use super::shard::{TxStatus, Verdict};
use super::{tx_key, Attempt, Height, Reject, TxKey};
use crate::route::{ShardId, ShardMap};

/// The submitter's handle for a submission.
pub type Ticket = u64;

/// One transaction being followed.
pub type Job = u64;

/// Timing.
#[derive(Debug, Clone, Copy)]
pub struct SubmitConfig {
    /// Ask a shard again after this long without its answer (the caller's units, e.g. ms).
    pub resend_after: u64,
    /// Ask the txid's shard for the status this long after its last answer while waiting
    /// (one question in flight per transaction: a slow shard is not asked faster than it
    /// answers).
    pub poll_every: u64,
    /// While waiting for the outcome of a try every shard attested, ask for it this often:
    /// the decision feed ([`SubmitInput::Decided`]) brings outcomes without asking, so this is
    /// the fallback for what the feed missed.
    pub waiting_poll: u64,
    /// Start a new try after this long waiting without an answer (doubled with each try: see
    /// [`SubmitConfig::wait_for`]).
    pub wait_limit: u64,
    /// Most tries of one transaction.
    pub max_tries: u8,
    /// Most transactions being attested at once, and the first such window: a `Busy` verdict
    /// (the atomizer's leader refused for want of room) narrows the window by a quarter, at
    /// most once per `resend_after`; each try attested everywhere without one widens it by one. Tries beyond
    /// it wait their turn unasked, so an overloaded atomizer is not also flooded with asks
    /// again.
    pub max_attesting: usize,
    /// The narrowest that window gets.
    pub min_attesting: usize,
    /// A transaction not decided this long after its submission fails the submission as in
    /// doubt (an unreachable shard group must not hold a sentinel for ever; and it is well
    /// inside the time a shard remembers a confirmation past its expiry, so a confirmation is
    /// never taken for a missing input).
    pub deadline: u64,
}

impl SubmitConfig {
    /// How long the `tries`-th try waits for an outcome before another: `wait_limit`, doubled
    /// with each try up to 8 times it. An overloaded atomizer is slow, not lossy: tries made
    /// on a fixed clock would multiply its load just when it has least to spare.
    pub fn wait_for(&self, tries: usize) -> u64 {
        self.wait_limit
            .saturating_mul(1 << tries.saturating_sub(1).min(3))
    }
}

impl Default for SubmitConfig {
    fn default() -> Self {
        SubmitConfig {
            resend_after: 1000,
            poll_every: 20,
            waiting_poll: 1000,
            wait_limit: 5000,
            max_tries: 8,
            max_attesting: 16_384,
            min_attesting: 1024,
            deadline: 60_000,
        }
    }
}

/// An event for the submitter.
#[derive(Debug, Clone)]
pub enum SubmitInput {
    /// Transactions to apply; answered once by [`SubmitOutput::Answer`] or
    /// [`SubmitOutput::Fail`].
    Submit {
        /// The caller's handle.
        ticket: Ticket,
        /// The transactions.
        txs: Vec<CompactTx>,
        /// The atomizer's committed height, read when the submission began.
        height: Height,
        /// The submitter's clock (Unix seconds): expiry is judged at least at it.
        now: u64,
    },
    /// A shard's answer to [`SubmitOutput::Attest`].
    Verdict {
        /// The transaction.
        job: Job,
        /// The try asked about.
        attempt: Attempt,
        /// The shard answering.
        shard: ShardId,
        /// Its answer.
        verdict: Verdict,
    },
    /// The txid shard's answer to [`SubmitOutput::AskStatus`].
    Status {
        /// The transaction.
        job: Job,
        /// Its status.
        status: TxStatus,
        /// The height the question asked for (its `min_height`): an answer to an earlier,
        /// lower question says nothing about a later one.
        asked: Height,
    },
    /// Decisions from a shard's feed (its txids confirmed or rejected, with their status):
    /// each applies to the transactions with that txid waiting for their outcome.
    Decided(Vec<(Digest, TxStatus)>),
    /// The clock (the caller's units).
    Tick(u64),
}

/// A command from the submitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitOutput {
    /// Ask `shard` to attest `tx` under try `attempt` at a height at least `min_height`, and to
    /// send the attestation on to the atomizer; feed its answer back as
    /// [`SubmitInput::Verdict`].
    Attest {
        /// The shard.
        shard: ShardId,
        /// The transaction's handle.
        job: Job,
        /// The try (the last of `attempts`).
        attempt: Attempt,
        /// Every try of it so far, oldest first.
        attempts: SmallVec<[Attempt; 2]>,
        /// The submitter's clock.
        now: u64,
        /// The transaction.
        tx: CompactTx,
        /// Its key.
        key: TxKey,
        /// The lowest height to check at.
        min_height: Height,
    },
    /// Ask the txid's shard what became of the transaction (at a height at least
    /// `min_height`); feed its answer back as [`SubmitInput::Status`].
    AskStatus {
        /// The shard.
        shard: ShardId,
        /// The transaction's handle.
        job: Job,
        /// The txid.
        txid: florin_crypto::Digest,
        /// The lowest height to read at.
        min_height: Height,
    },
    /// A submission is decided: one outcome per transaction, in order.
    Answer {
        /// The caller's handle.
        ticket: Ticket,
        /// The outcomes.
        outcomes: Vec<SwapOutcome>,
    },
    /// A submission cannot be decided: a transaction ran out of tries. Some of its
    /// transactions may be confirmed: in doubt.
    Fail {
        /// The caller's handle.
        ticket: Ticket,
        /// Why.
        why: String,
    },
}

#[derive(Debug, Clone)]
enum Stage {
    /// Spends an output of a transaction still in flight here (earlier in the same submission,
    /// or in an earlier one): waits for it, then reads at least at the height it was ordered.
    Blocked,
    /// Waiting for the shards' verdicts on the current try.
    Attesting {
        waiting: BTreeSet<ShardId>,
        missing: Option<Height>,
        /// The height of a shard that found it expired.
        expired: Option<Height>,
    },
    /// A shard found an input missing (or the transaction expired): is the txid confirmed?
    Resolving {
        outcome: SwapOutcome,
        /// The height the txid's shard is read at.
        at: Height,
    },
    /// Every shard attested: waiting for the txid's shard to know.
    Waiting { since: u64 },
    /// A try is due, but the window of transactions being attested is full: waiting its turn.
    Queued,
}

#[derive(Debug, Clone)]
struct JobState {
    ticket: Ticket,
    pos: usize,
    tx: CompactTx,
    key: TxKey,
    /// Each shard concerned (the txid's first).
    shards: SmallVec<[ShardId; 3]>,
    attempts: SmallVec<[Attempt; 2]>,
    min_height: Height,
    stage: Stage,
    /// When the shards or the txid's shard were last asked.
    asked_at: u64,
    /// A status question is in flight (unanswered since `asked_at`).
    polling: bool,
    /// Transactions in flight whose outputs it spends.
    blocked_by: usize,
    /// The submitter's clock when it was submitted.
    wall: u64,
    /// When it was submitted (the caller's units).
    started: u64,
    /// The time of its live entry in the submitter's wake-up queue.
    wake: Option<u64>,
}

impl JobState {
    fn attempt(&self) -> Attempt {
        self.attempts.last().copied().unwrap_or_default()
    }

    /// When the status is next asked: a question in flight is asked again only once overdue
    /// (`resend_after`); otherwise `waiting_poll` after the last answer while waiting (the
    /// feed brings outcomes), `poll_every` while resolving.
    fn poll_at(&self, cfg: &SubmitConfig) -> u64 {
        let every = match self.stage {
            Stage::Waiting { .. } => cfg.waiting_poll,
            _ => cfg.poll_every,
        };
        self.asked_at.saturating_add(if self.polling {
            cfg.resend_after
        } else {
            every
        })
    }
}

struct TicketState {
    outcomes: Vec<Option<SwapOutcome>>,
    left: usize,
}

/// The sentinel's submitter.
pub struct Submitter {
    map: ShardMap,
    cfg: SubmitConfig,
    rng: Box<dyn RngCore + Send>,
    jobs: BTreeMap<Job, JobState>,
    tickets: HashMap<Ticket, TicketState>,
    next_job: Job,
    now: u64,
    /// Answers and failures decided while handling an event.
    done: Vec<SubmitOutput>,
    /// Outputs of transactions in flight, by the job producing them.
    producing: HashMap<florin_ledger::UhsId, Job>,
    /// Jobs waiting for a job's end.
    dependents: HashMap<Job, Vec<Job>>,
    /// When each job next needs the clock (resend, poll, new try, deadline): a tick visits
    /// only the jobs due, not every job in flight. Entries no longer a job's `wake` are stale.
    due: BinaryHeap<Reverse<(u64, Job)>>,
    /// Tries begun, all transactions together (one each when nothing goes stale).
    tries: u64,
    /// Jobs in [`Stage::Attesting`], and how many may be (the window).
    attesting: usize,
    window: usize,
    /// When a `Busy` verdict last narrowed the window.
    narrowed_at: Option<u64>,
    /// Jobs in [`Stage::Queued`], in turn (a job no longer queued is skipped).
    queued: std::collections::VecDeque<Job>,
    /// Whether the current try of a job met a `Busy` verdict.
    busy_jobs: std::collections::HashSet<Job>,
    /// The jobs following each txid (for the decision feed).
    by_txid: HashMap<Digest, SmallVec<[Job; 1]>>,
}

impl Submitter {
    /// A submitter routing by `map`, drawing try ids from `rng`.
    pub fn new(map: ShardMap, cfg: SubmitConfig, rng: Box<dyn RngCore + Send>) -> Submitter {
        Submitter {
            map,
            cfg,
            rng,
            jobs: BTreeMap::new(),
            tickets: HashMap::new(),
            next_job: 0,
            now: 0,
            done: Vec::new(),
            producing: HashMap::new(),
            dependents: HashMap::new(),
            due: BinaryHeap::new(),
            tries: 0,
            attesting: 0,
            window: cfg.max_attesting.max(1),
            narrowed_at: None,
            queued: std::collections::VecDeque::new(),
            busy_jobs: std::collections::HashSet::new(),
            by_txid: HashMap::new(),
        }
    }

    /// Transactions being attested, and how many may be at once now.
    pub fn attesting(&self) -> (usize, usize) {
        (self.attesting, self.window)
    }

    /// Job `j` leaves `stage` (for another, or for good).
    fn left(&mut self, j: Job, stage: &Stage) {
        if matches!(stage, Stage::Attesting { .. }) {
            self.attesting = self.attesting.saturating_sub(1);
            self.busy_jobs.remove(&j);
        }
    }

    /// Starts the tries waiting their turn, while the window has room.
    fn pump(&mut self, out: &mut Vec<SubmitOutput>) {
        while self.attesting < self.window {
            let Some(j) = self.queued.pop_front() else {
                break;
            };
            if self
                .jobs
                .get(&j)
                .is_some_and(|job| matches!(job.stage, Stage::Queued))
            {
                self.start_try(j, out);
                self.schedule(j);
            }
        }
    }

    /// Transactions being followed.
    pub fn in_flight(&self) -> usize {
        self.jobs.len()
    }

    /// Tries begun so far, all transactions together: over the transactions submitted, how
    /// often a try had to be made again.
    pub fn tries(&self) -> u64 {
        self.tries
    }

    /// Submissions not yet answered.
    pub fn open_tickets(&self) -> usize {
        self.tickets.len()
    }

    /// Each transaction being followed, as text (for diagnostics).
    pub fn describe(&self) -> Vec<String> {
        self.jobs
            .iter()
            .map(|(j, s)| {
                format!(
                    "job {j} ticket {} tx {} tries {} from height {}: {:?}",
                    s.ticket,
                    hex8(&s.tx.txid),
                    s.attempts.len(),
                    s.min_height,
                    s.stage
                )
            })
            .collect()
    }

    /// Handles one event.
    pub fn handle(&mut self, input: SubmitInput) -> Vec<SubmitOutput> {
        let mut out = Vec::new();
        match input {
            SubmitInput::Submit {
                ticket,
                txs,
                height,
                now: wall,
            } => {
                if txs.is_empty() {
                    out.push(SubmitOutput::Answer {
                        ticket,
                        outcomes: vec![],
                    });
                    return out;
                }
                self.tickets.insert(
                    ticket,
                    TicketState {
                        outcomes: vec![None; txs.len()],
                        left: txs.len(),
                    },
                );
                for (pos, tx) in txs.into_iter().enumerate() {
                    let mut shards: SmallVec<[ShardId; 3]> = SmallVec::new();
                    shards.push(self.map.shard_of(&tx.txid));
                    for i in &tx.inputs {
                        let s = self.map.shard_of(i);
                        if !shards.contains(&s) {
                            shards.push(s);
                        }
                    }
                    self.next_job += 1;
                    let j = self.next_job;
                    let mut blockers: SmallVec<[Job; 2]> = SmallVec::new();
                    for i in &tx.inputs {
                        if let Some(b) = self.producing.get(i) {
                            if !blockers.contains(b) {
                                blockers.push(*b);
                            }
                        }
                    }
                    for (o, _) in &tx.outputs {
                        self.producing.insert(*o, j);
                    }
                    for b in &blockers {
                        self.dependents.entry(*b).or_default().push(j);
                    }
                    let job = JobState {
                        ticket,
                        pos,
                        key: tx_key(&tx),
                        tx,
                        shards,
                        attempts: SmallVec::new(),
                        min_height: height,
                        stage: Stage::Blocked,
                        asked_at: self.now,
                        polling: false,
                        wake: None,
                        blocked_by: blockers.len(),
                        wall,
                        started: self.now,
                    };
                    self.by_txid.entry(job.tx.txid).or_default().push(j);
                    self.jobs.insert(j, job);
                    if blockers.is_empty() {
                        self.new_try(j, &mut out);
                    }
                    self.schedule(j);
                }
            }
            SubmitInput::Verdict {
                job,
                attempt,
                shard,
                verdict,
            } => {
                self.verdict(job, attempt, shard, verdict, &mut out);
                self.schedule(job);
            }
            SubmitInput::Status { job, status, asked } => {
                self.status(job, status, asked, &mut out);
                self.schedule(job);
            }
            SubmitInput::Decided(decisions) => {
                for (txid, status) in decisions {
                    let Some(jobs) = self.by_txid.get(&txid) else {
                        continue;
                    };
                    let waiting: SmallVec<[Job; 1]> = jobs
                        .iter()
                        .copied()
                        .filter(|j| {
                            self.jobs.get(j).is_some_and(|s| match s.stage {
                                Stage::Waiting { .. } | Stage::Queued => true,
                                Stage::Attesting { .. } => {
                                    matches!(status, TxStatus::Confirmed(..))
                                }
                                _ => false,
                            })
                        })
                        .collect();
                    for j in waiting {
                        // Waiting jobs take any outcome the feed brings; jobs queued for a
                        // new try or still being attested, a confirmation (of this or an
                        // earlier try, or of another submission of the same transaction):
                        // a shard that answered `Busy` for attestations the atomizer took
                        // after all does not hold the job until it is asked again.
                        self.status(j, status.clone(), Height::MAX, &mut out);
                        self.schedule(j);
                    }
                }
            }
            SubmitInput::Tick(now) => {
                self.now = self.now.max(now);
                while let Some(Reverse((at, j))) = self.due.peek().copied() {
                    if at > self.now {
                        break;
                    }
                    self.due.pop();
                    match self.jobs.get_mut(&j) {
                        Some(job) if job.wake == Some(at) => job.wake = None,
                        _ => continue,
                    }
                    self.tick(j, &mut out);
                    self.schedule(j);
                }
            }
        }
        self.pump(&mut out);
        out.append(&mut self.done);
        out
    }

    /// Gives up every submission (this sentinel stops): their tickets, to be failed as in doubt.
    pub fn abandon(&mut self) -> Vec<Ticket> {
        self.jobs.clear();
        self.attesting = 0;
        self.queued.clear();
        self.busy_jobs.clear();
        self.producing.clear();
        self.dependents.clear();
        let mut t: Vec<Ticket> = self.tickets.drain().map(|(t, _)| t).collect();
        t.sort_unstable();
        t
    }

    /// Puts job `j` in the wake-up queue at the next time its state needs the clock, unless
    /// it is there for an earlier time already (an early wake-up finds nothing due and
    /// schedules it again).
    fn schedule(&mut self, j: Job) {
        let cfg = self.cfg;
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        let poll = job.poll_at(&cfg);
        let next = match job.stage {
            Stage::Blocked | Stage::Queued => u64::MAX,
            Stage::Attesting { .. } => job.asked_at + cfg.resend_after,
            Stage::Resolving { .. } => poll,
            Stage::Waiting { since } => poll.min(since + cfg.wait_for(job.attempts.len())),
        }
        .min(job.started + cfg.deadline);
        if job.wake.is_none_or(|w| next < w) {
            job.wake = Some(next);
            self.due.push(Reverse((next, j)));
        }
    }

    /// Job `j` needs a new try: started now if the window has room, else queued.
    fn new_try(&mut self, j: Job, out: &mut Vec<SubmitOutput>) {
        // Behind the jobs already waiting their turn (a slot freed during this event goes to
        // them first: `pump` at the event's end starts this one too if there is room).
        let full = self.attesting >= self.window || !self.queued.is_empty();
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        if full && !matches!(job.stage, Stage::Attesting { .. }) {
            job.stage = Stage::Queued;
            self.queued.push_back(j);
            return;
        }
        self.start_try(j, out);
    }

    fn start_try(&mut self, j: Job, out: &mut Vec<SubmitOutput>) {
        let max = self.cfg.max_tries;
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        if job.attempts.len() >= max as usize {
            let (ticket, txid) = (job.ticket, job.tx.txid);
            self.fail(
                ticket,
                format!(
                    "transaction {} was not ordered after {max} tries",
                    hex8(&txid)
                ),
            );
            return;
        }
        let attempt = self.rng.next_u64();
        self.tries += 1;
        if !matches!(job.stage, Stage::Attesting { .. }) {
            self.attesting += 1;
        }
        self.busy_jobs.remove(&j);
        job.attempts.push(attempt);
        job.asked_at = self.now;
        job.polling = false;
        job.stage = Stage::Attesting {
            waiting: job.shards.iter().copied().collect(),
            missing: None,
            expired: None,
        };
        for s in &job.shards {
            out.push(SubmitOutput::Attest {
                shard: *s,
                job: j,
                attempt,
                attempts: job.attempts.clone(),
                now: job.wall,
                tx: job.tx.clone(),
                key: job.key,
                min_height: job.min_height,
            });
        }
        self.schedule(j);
    }

    fn ask_status(&mut self, j: Job, min_height: Height, out: &mut Vec<SubmitOutput>) {
        if let Some(job) = self.jobs.get_mut(&j) {
            job.asked_at = self.now;
            job.polling = true;
            out.push(SubmitOutput::AskStatus {
                shard: job.shards[0],
                job: j,
                txid: job.tx.txid,
                min_height,
            });
        }
    }

    fn verdict(
        &mut self,
        j: Job,
        attempt: Attempt,
        shard: ShardId,
        verdict: Verdict,
        out: &mut Vec<SubmitOutput>,
    ) {
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        if attempt != job.attempt() {
            return;
        }
        let mine = job.attempts.clone();
        let Stage::Attesting {
            waiting,
            missing,
            expired,
        } = &mut job.stage
        else {
            return;
        };
        if !waiting.contains(&shard) {
            return;
        }
        match verdict {
            Verdict::Confirmed(h, a) => {
                let o = if mine.contains(&a) {
                    SwapOutcome::Confirmed
                } else {
                    SwapOutcome::AlreadyApplied
                };
                self.finish_at(j, o, h);
                return;
            }
            // Asked again on the next resend.
            Verdict::Behind(_) => return,
            // The atomizer's leader refused for want of room: asked again after
            // `resend_after`, and fewer transactions are attested at once.
            Verdict::Busy => {
                self.busy_jobs.insert(j);
                if self
                    .narrowed_at
                    .is_none_or(|t| self.now.saturating_sub(t) >= self.cfg.resend_after)
                {
                    self.narrowed_at = Some(self.now);
                    // Never under `min_attesting`, nor over `max_attesting` (a config whose
                    // least is above its most keeps the most).
                    let most = self.cfg.max_attesting.max(1);
                    let least = self.cfg.min_attesting.clamp(1, most);
                    self.window = (self.window - (self.window / 4).max(1)).max(least);
                }
                return;
            }
            Verdict::Attested(_) => {}
            Verdict::Missing(h) => *missing = Some(missing.unwrap_or(0).max(h)),
            Verdict::Expired(h) => *expired = Some(expired.unwrap_or(0).max(h)),
        }
        waiting.remove(&shard);
        if !waiting.is_empty() {
            return;
        }
        // Attested everywhere: out of the window, which widens unless this try met `Busy`.
        self.attesting = self.attesting.saturating_sub(1);
        if !self.busy_jobs.remove(&j) {
            self.window = (self.window + 1).min(self.cfg.max_attesting.max(1));
        }
        let (missing, expired) = (*missing, *expired);
        if let Some(h) = missing {
            // Spent, unless by an earlier try of this very transaction: the txid's shard at
            // that height or later knows.
            let at = h.max(job.min_height);
            job.stage = Stage::Resolving {
                outcome: SwapOutcome::MissingInput,
                at,
            };
            self.ask_status(j, at, out);
        } else if let Some(h) = expired {
            // Expired, unless confirmed before: the txid's shard at that height or later knows
            // (a shard that applied the block holding it may no longer see the transaction).
            let at = h.max(job.min_height);
            job.stage = Stage::Resolving {
                outcome: SwapOutcome::Expired,
                at,
            };
            self.ask_status(j, at, out);
        } else {
            job.stage = Stage::Waiting { since: self.now };
            let at = job.min_height;
            self.ask_status(j, at, out);
        }
    }

    fn status(&mut self, j: Job, status: TxStatus, asked: Height, out: &mut Vec<SubmitOutput>) {
        let now = self.now;
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        // Resolving at height `at` needs an answer at least there (a confirmation is final at
        // any height): an answer to a question asked lower, still on its way when the job
        // began resolving, is not taken for the txid's absence (nor for the answer to the
        // question in flight).
        if let Stage::Resolving { at, .. } = job.stage {
            if asked < at && !matches!(status, TxStatus::Confirmed(..)) {
                return;
            }
        }
        if job.polling && asked != Height::MAX {
            // The next question waits `poll_every` from this answer (the feed's deliveries,
            // `asked` MAX, leave the question in flight alone).
            job.polling = false;
            job.asked_at = now;
        }
        let current = job.attempt();
        let mine = job.attempts.clone();
        let stage = job.stage.clone();
        match (stage, status) {
            (Stage::Blocked, _) => {}
            (Stage::Attesting { .. }, TxStatus::Confirmed(h, a)) => {
                // As a shard's `Confirmed` verdict: final, whichever try it names.
                let o = if mine.contains(&a) {
                    SwapOutcome::Confirmed
                } else {
                    SwapOutcome::AlreadyApplied
                };
                self.finish_at(j, o, h);
            }
            (Stage::Attesting { .. }, _) => {}
            (
                ref st @ (Stage::Resolving { .. } | Stage::Waiting { .. } | Stage::Queued),
                TxStatus::Confirmed(h, a),
            ) if mine.contains(&a)
                || !matches!(
                    st,
                    Stage::Resolving {
                        outcome: SwapOutcome::Expired,
                        ..
                    }
                ) =>
            {
                let o = if mine.contains(&a) {
                    SwapOutcome::Confirmed
                } else {
                    SwapOutcome::AlreadyApplied
                };
                self.finish_at(j, o, h);
            }
            // Asked again on the next tick; a queued job waits its try.
            (_, TxStatus::Behind(_)) | (Stage::Queued, _) => {}
            (Stage::Resolving { outcome, .. }, _) => self.finish(j, outcome),
            (Stage::Waiting { .. }, TxStatus::Rejected(tries))
                if tries.iter().any(|(a, _)| *a == current) =>
            {
                let reason = tries
                    .iter()
                    .find(|(a, _)| *a == current)
                    .map_or(Reject::Stale, |(_, r)| *r);
                match reason {
                    Reject::Stale => self.new_try(j, out),
                    Reject::Spent => self.finish(j, SwapOutcome::MissingInput),
                    // Its txid was ordered before (by another submission, whose confirmation
                    // this shard would show first, or one old enough to be forgotten).
                    Reject::Replay => self.finish(j, SwapOutcome::AlreadyApplied),
                    Reject::Expired => self.finish(j, SwapOutcome::Expired),
                }
            }
            (Stage::Waiting { .. }, _) => {}
        }
    }

    fn tick(&mut self, j: Job, out: &mut Vec<SubmitOutput>) {
        let now = self.now;
        let cfg = self.cfg;
        let Some(job) = self.jobs.get_mut(&j) else {
            return;
        };
        let idle = now.saturating_sub(job.asked_at);
        let poll_due = now >= job.poll_at(&cfg);
        if now.saturating_sub(job.started) >= cfg.deadline {
            let (ticket, txid) = (job.ticket, job.tx.txid);
            self.fail(
                ticket,
                format!(
                    "transaction {} was not decided within {} ms",
                    hex8(&txid),
                    cfg.deadline
                ),
            );
            return;
        }
        match &job.stage {
            Stage::Blocked | Stage::Queued => {}
            Stage::Attesting { waiting, .. } => {
                if idle < cfg.resend_after {
                    return;
                }
                job.asked_at = now;
                for s in waiting {
                    out.push(SubmitOutput::Attest {
                        shard: *s,
                        job: j,
                        attempt: job.attempt(),
                        attempts: job.attempts.clone(),
                        now: job.wall,
                        tx: job.tx.clone(),
                        key: job.key,
                        min_height: job.min_height,
                    });
                }
            }
            Stage::Resolving { at, .. } => {
                if poll_due {
                    let at = *at;
                    self.ask_status(j, at, out);
                }
            }
            Stage::Waiting { since } => {
                if now.saturating_sub(*since) >= cfg.wait_for(job.attempts.len()) {
                    self.new_try(j, out);
                } else if poll_due {
                    let at = job.min_height;
                    self.ask_status(j, at, out);
                }
            }
        }
    }

    fn finish(&mut self, j: Job, outcome: SwapOutcome) {
        self.finish_at(j, outcome, 0);
    }

    /// Ends job `j` (ordered at `height`, or 0 if that is not known): its dependents read at
    /// least there.
    fn finish_at(&mut self, j: Job, outcome: SwapOutcome, height: Height) {
        let Some(job) = self.jobs.remove(&j) else {
            return;
        };
        self.left(j, &job.stage);
        self.unindex(j, &job.tx.txid);
        self.release(j, &job.tx, height);
        let Some(t) = self.tickets.get_mut(&job.ticket) else {
            return;
        };
        if t.outcomes[job.pos].replace(outcome).is_none() {
            t.left -= 1;
        }
        if t.left == 0 {
            if let Some(t) = self.tickets.remove(&job.ticket) {
                self.done.push(SubmitOutput::Answer {
                    ticket: job.ticket,
                    outcomes: t.outcomes.into_iter().flatten().collect(),
                });
            }
        }
    }

    /// Job `j` (spending `tx`) is over: its outputs are no longer in flight and the jobs
    /// waiting for it go on, at least at `height`.
    fn release(&mut self, j: Job, tx: &CompactTx, height: Height) {
        for (o, _) in &tx.outputs {
            if self.producing.get(o) == Some(&j) {
                self.producing.remove(o);
            }
        }
        let mut out = Vec::new();
        for d in self.dependents.remove(&j).unwrap_or_default() {
            let Some(dj) = self.jobs.get_mut(&d) else {
                continue;
            };
            dj.min_height = dj.min_height.max(height);
            dj.blocked_by = dj.blocked_by.saturating_sub(1);
            if dj.blocked_by == 0 {
                self.new_try(d, &mut out);
            }
        }
        self.done.append(&mut out);
    }

    fn unindex(&mut self, j: Job, txid: &Digest) {
        if let Some(v) = self.by_txid.get_mut(txid) {
            v.retain(|x| *x != j);
            if v.is_empty() {
                self.by_txid.remove(txid);
            }
        }
    }

    fn fail(&mut self, ticket: Ticket, why: String) {
        let gone: Vec<(Job, CompactTx)> = self
            .jobs
            .iter()
            .filter(|(_, s)| s.ticket == ticket)
            .map(|(j, s)| (*j, s.tx.clone()))
            .collect();
        for (j, tx) in &gone {
            if let Some(job) = self.jobs.remove(j) {
                self.left(*j, &job.stage);
            }
            self.unindex(*j, &tx.txid);
        }
        for (j, tx) in &gone {
            self.release(*j, tx, 0);
        }
        if self.tickets.remove(&ticket).is_some() {
            self.done.push(SubmitOutput::Fail { ticket, why });
        }
    }
}

fn hex8(d: &[u8; 32]) -> String {
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

//! What the atomizer group's leader does beside its state machine, as a pure event machine: it
//! gathers the attestations shards send into [`AtomCmd::Step`]s (one replicated at a time, so
//! steps commit in the order they were made), seals a block every
//! [`LeaderConfig::block_every`], and sends every sealed block to every shard until the shard
//! says it has applied it. Blocks come from the block log (what [`LeaderOutput::SendBlocks`]
//! names is read there by the caller), so a shard that fell behind, or a new leader that does
//! not know how far each shard got, catches up by replaying blocks.

use super::machine::AtomCmd;
use super::{Attestation, Height};
use crate::route::ShardId;

/// Timing and batching.
#[derive(Debug, Clone, Copy)]
pub struct LeaderConfig {
    /// Seal the open block this often (the caller's clock units, e.g. ms).
    pub block_every: u64,
    /// Send unacknowledged blocks again after this long.
    pub resend_after: u64,
    /// Most attestations in one step (4,096 by default: about 1.2 MB, which a follower on a
    /// small host appends within its Raft append timeout; a larger step that outlasts it is
    /// sent again, and again, at the moment the group has least to spare).
    pub max_step: usize,
    /// Most attestations waiting for a step, whatever was admitted (more are dropped: their
    /// sentinels try again).
    pub max_buffer: usize,
    /// Most blocks sent to a shard at once.
    pub max_send: u64,
    /// Admission control: steps should be committed within this long (a moving average).
    /// Slower, and the leader admits a quarter fewer attestations; faster after its buffer
    /// reached the limit, a quarter more (see [`AtomizerLeader::room`]).
    pub step_target: u64,
    /// The fewest attestations admitted between steps, however slow they are (at least 1).
    /// The most is half of `max_buffer`: batches admitted while there was room may overshoot
    /// the limit, and the other half keeps them whole (an admitted batch is never cut).
    pub min_admit: usize,
}

impl LeaderConfig {
    /// The lowest admission limit: `min_admit`, at least 1 (a limit of 0 would refuse every
    /// attestation for ever).
    fn admit_lo(&self) -> usize {
        self.min_admit.max(1).min(self.admit_hi())
    }

    /// The highest admission limit: half the hard bound, so that batches admitted while there
    /// was room fit whole however far they overshoot it.
    fn admit_hi(&self) -> usize {
        (self.max_buffer / 2).max(1)
    }
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            block_every: 20,
            resend_after: 2000,
            max_step: 4096,
            max_buffer: 1 << 20,
            max_send: 256,
            step_target: 150,
            min_admit: 4096,
        }
    }
}

/// An event for the leader.
#[derive(Debug, Clone)]
pub enum LeaderInput {
    /// Attestations from a shard.
    Attest(Vec<Attestation>),
    /// The clock: `ms` in the caller's units, `wall` in Unix seconds (for the atomizer's clock).
    Tick {
        /// Monotonic time.
        ms: u64,
        /// Wall-clock seconds.
        wall: u64,
    },
    /// The last [`LeaderOutput::Replicate`] step is committed and applied.
    Replicated {
        /// The atomizer's height now.
        height: Height,
        /// The clock when the answer came (as [`LeaderInput::Tick`]'s `ms`): how long the
        /// step took decides admission.
        ms: u64,
    },
    /// The step could not be replicated (this replica no longer leads): nothing more is sent.
    Failed,
    /// A shard's height, from its answer to blocks sent.
    ShardAt {
        /// The shard.
        shard: ShardId,
        /// The last block it has applied.
        height: Height,
    },
}

/// A command from the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderOutput {
    /// Replicate this step, then feed back [`LeaderInput::Replicated`] with the height after it.
    Replicate(AtomCmd),
    /// Send shard `shard` the blocks `from..=to` from the block log, in order; feed its answer
    /// back as [`LeaderInput::ShardAt`].
    SendBlocks {
        /// The shard.
        shard: ShardId,
        /// The first block.
        from: Height,
        /// The last block.
        to: Height,
    },
}

/// The atomizer group's leader.
#[derive(Debug)]
pub struct AtomizerLeader {
    cfg: LeaderConfig,
    buffer: Vec<Attestation>,
    replicating: bool,
    stopped: bool,
    /// Attestations stepped since the last seal.
    dirty: bool,
    last_seal: u64,
    height: Height,
    /// What each shard last said it has applied (`None`: not heard from since this leader
    /// began), and since when blocks sent to it are unanswered (one delivery in flight per
    /// shard: blocks sealed meanwhile go in the next one, so a slow shard is not sent the same
    /// blocks again and again).
    shards: Vec<(Option<Height>, Option<u64>)>,
    ms: u64,
    dropped: u64,
    /// Attestations admitted to the buffer at most (between `max(min_admit, 1)` and half of
    /// `max_buffer`).
    cap: usize,
    /// When the step being replicated was made.
    step_at: u64,
    /// Whether the buffer reached the admission limit since the last step committed.
    refused: bool,
    /// Steps' commit time, a moving average (each step a quarter of it; `None` before one).
    step_ms: Option<u64>,
}

impl AtomizerLeader {
    /// A leader of an atomizer at `height` (its state machine's), sending blocks to `shards`
    /// shards.
    pub fn new(cfg: LeaderConfig, height: Height, shards: usize) -> AtomizerLeader {
        AtomizerLeader {
            cfg,
            buffer: Vec::new(),
            replicating: false,
            stopped: false,
            // Anything left open by an earlier leader is sealed at the first tick.
            dirty: true,
            last_seal: 0,
            height,
            shards: vec![(None, None); shards],
            ms: 0,
            dropped: 0,
            cap: cfg
                .admit_lo()
                .saturating_mul(4)
                .clamp(cfg.admit_lo(), cfg.admit_hi()),
            step_at: 0,
            refused: false,
            step_ms: None,
        }
    }

    /// How many more attestations this leader admits now (0 once it stopped): a caller
    /// admits a batch of attestations while this is positive (a batch may overshoot it) and
    /// answers "busy" otherwise. The atomizer saturates before it fails: steps that take
    /// longer than [`LeaderConfig::step_target`] to commit shrink what is admitted, so
    /// sentinels are told "busy" and back off, instead of the leader's host falling so far
    /// behind that it misses its heartbeats and the group spends its time electing leaders.
    pub fn room(&self) -> usize {
        if self.stopped {
            return 0;
        }
        self.cap.saturating_sub(self.buffer.len())
    }

    /// The admission limit and the steps' average commit time.
    pub fn admission(&self) -> (usize, u64) {
        (self.cap, self.step_ms.unwrap_or(0))
    }

    /// The atomizer's height as this leader knows it.
    pub fn height(&self) -> Height {
        self.height
    }

    /// Attestations waiting for a step, and how many were dropped for want of room.
    pub fn buffered(&self) -> (usize, u64) {
        (self.buffer.len(), self.dropped)
    }

    /// The lowest height a shard has said it applied (`None` until every shard has spoken).
    pub fn slowest_shard(&self) -> Option<Height> {
        self.shards.iter().map(|s| s.0).min().flatten()
    }

    /// Handles one event.
    pub fn handle(&mut self, input: LeaderInput) -> Vec<LeaderOutput> {
        let mut out = Vec::new();
        if self.stopped {
            return out;
        }
        match input {
            LeaderInput::Attest(a) => {
                // Admitted by the caller (while `room` was positive): taken whole, up to the
                // hard bound.
                let room = self.cfg.max_buffer.saturating_sub(self.buffer.len());
                self.dropped += a.len().saturating_sub(room) as u64;
                self.buffer.extend(a.into_iter().take(room));
                if self.buffer.len() >= self.cap {
                    // Admission is the limit now: callers are refused until the next step.
                    self.refused = true;
                }
            }
            LeaderInput::Tick { ms, wall } => {
                self.ms = self.ms.max(ms);
                self.step(wall, &mut out);
                for s in 0..self.shards.len() {
                    let due = match self.shards[s] {
                        // Unanswered for too long: sent again.
                        (_, Some(at)) => self.ms.saturating_sub(at) >= self.cfg.resend_after,
                        (Some(h), None) => h < self.height,
                        (None, None) => true,
                    };
                    if due {
                        self.send(s, &mut out);
                    }
                }
            }
            LeaderInput::Replicated { height: h, ms } => {
                self.ms = self.ms.max(ms);
                self.replicating = false;
                // Raised only while admission was the limit; lowered while the group falls
                // behind (on the average: one slow step, a disk's hiccup, is not a trend).
                let took = self.ms.saturating_sub(self.step_at);
                let avg = self.step_ms.map_or(took, |a| (3 * a + took) / 4);
                self.step_ms = Some(avg);
                let (lo, hi) = (self.cfg.admit_lo(), self.cfg.admit_hi());
                if avg > self.cfg.step_target {
                    self.cap = (self.cap - (self.cap / 4).max(1)).clamp(lo, hi);
                } else if self.refused {
                    self.cap = self.cap.saturating_add(self.cap / 4 + 1).clamp(lo, hi);
                }
                self.refused = false;
                if h > self.height {
                    self.height = h;
                    for s in 0..self.shards.len() {
                        if self.shards[s].1.is_none() {
                            self.send(s, &mut out);
                        }
                    }
                }
            }
            LeaderInput::Failed => {
                self.stopped = true;
                self.buffer.clear();
            }
            LeaderInput::ShardAt { shard, height } => {
                let Some(s) = self.shards.get_mut(shard as usize) else {
                    return out;
                };
                s.0 = Some(height.min(self.height));
                // Answered. Behind: the rest at once; caught up: nothing more until a new block.
                s.1 = None;
                if height < self.height {
                    self.send(shard as usize, &mut out);
                }
            }
        }
        out
    }

    fn step(&mut self, wall: u64, out: &mut Vec<LeaderOutput>) {
        if self.replicating {
            return;
        }
        let seal_due = self.ms.saturating_sub(self.last_seal) >= self.cfg.block_every;
        let seal = seal_due && (self.dirty || !self.buffer.is_empty());
        // Attestations wait for the block's time unless a full step is waiting: each step is a
        // Raft round (an entry, a sync, a message to every follower), so steps are made as
        // seldom as blocks, not as often as attestations arrive.
        if !seal && self.buffer.len() < self.cfg.max_step {
            return;
        }
        let n = self.buffer.len().min(self.cfg.max_step);
        let attestations: Vec<Attestation> = self.buffer.drain(..n).collect();
        // The sentinels' clocks count, up to the tolerated skew past this leader's.
        let theirs = attestations.iter().map(|a| a.now).max().unwrap_or(0);
        let wall =
            wall.max(theirs.min(wall.saturating_add(florin_ledger::expiry::CLOCK_SKEW_SECS)));
        self.dirty = if seal { false } else { self.dirty || n > 0 };
        if seal {
            self.last_seal = self.ms;
        }
        self.replicating = true;
        self.step_at = self.ms;
        out.push(LeaderOutput::Replicate(AtomCmd::Step {
            attestations,
            seal,
            now: wall,
        }));
    }

    /// Sends shard `s` what it lacks (the tip alone when its height is unknown: its answer
    /// says where it is).
    fn send(&mut self, s: usize, out: &mut Vec<LeaderOutput>) {
        if self.height == 0 {
            return;
        }
        let Some(entry) = self.shards.get_mut(s) else {
            return;
        };
        let from = match entry.0 {
            Some(h) if h >= self.height => return,
            Some(h) => h + 1,
            None => self.height,
        };
        let to = self.height.min(from + self.cfg.max_send - 1);
        entry.1 = Some(self.ms);
        out.push(LeaderOutput::SendBlocks {
            shard: s as ShardId,
            from,
            to,
        });
    }
}

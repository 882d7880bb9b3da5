//! Deterministic simulation of the atomizer architecture: the real submitter, shard, atomizer
//! and leader machines over a seeded network that drops, duplicates, delays and reorders, with
//! shards cut off for a while and the atomizer's leader crashing (a step being replicated at the
//! crash may or may not commit; the next leader starts from the replicated state and does not
//! know how far each shard got). Some transactions conflict, some are replays, some expire in
//! flight. A fault phase is followed by a recovery phase; then the invariants are checked: the
//! block log is one hash chain with no id spent twice, every shard has applied all of it, no
//! acknowledged transaction is missing from it and no refused one is in it, value is conserved,
//! and the shards' state is exactly the log replayed.
//!
//! Replication within each group is modelled (a shard's and the atomizer's applied state is
//! durable): Raft itself is tested in `tests/raft.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use florin_cluster::atomizer::leader::{AtomizerLeader, LeaderConfig, LeaderInput, LeaderOutput};
use florin_cluster::atomizer::machine::{AtomCmd, AtomizerConfig, AtomizerState};
use florin_cluster::atomizer::shard::{BlockShard, TxStatus, Verdict};
use florin_cluster::atomizer::submit::{
    Job, SubmitConfig, SubmitInput, SubmitOutput, Submitter, Ticket,
};
use florin_cluster::atomizer::{verify_chain, Attempt, Attestation, Block, Height, GENESIS};
use florin_cluster::route::{ShardId, ShardMap};
use florin_ledger::{CompactTx, SwapOutcome, TxKind, UhsId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug)]
enum Ev {
    Tick,
    Submit,
    /// A sentinel asks a shard to attest.
    Attest(
        usize,
        ShardId,
        Job,
        Vec<Attempt>,
        CompactTx,
        [u8; 32],
        Height,
        u64,
    ),
    /// A sentinel asks a shard for a status.
    Ask(usize, ShardId, Job, [u8; 32], Height),
    /// A shard's answer reaches a sentinel.
    Verdict(usize, Job, Attempt, ShardId, Verdict),
    Status(usize, Job, TxStatus, Height),
    /// A shard's decision feed reaches a sentinel.
    Feed(usize, Vec<([u8; 32], TxStatus)>),
    /// Attestations reach the atomizer's leader.
    ToAtomizer(Vec<Attestation>),
    /// A step's replication finishes (for the given epoch).
    Replicated(u64),
    /// Blocks reach a shard (sent by the leader of the given epoch).
    Blocks(ShardId, Vec<Block>, u64),
    /// A shard's height reaches the leader.
    ShardAt(ShardId, Height, u64),
    Crash,
    Restart,
    Cut(ShardId, bool),
}

struct Sim {
    rng: StdRng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Ev>>,
    map: ShardMap,
    shards: Vec<BlockShard>,
    atomizer: AtomizerState,
    log: Vec<Block>,
    leader: Option<AtomizerLeader>,
    epoch: u64,
    replicating: Option<(AtomCmd, u64)>,
    sentinels: Vec<Submitter>,
    /// Each sentinel's place in each shard's decision feed.
    feeds: Vec<Vec<Height>>,
    faults: bool,
    cut: HashSet<ShardId>,
    // Workload.
    all_txs: HashMap<UhsId, CompactTx>,
    view: BTreeMap<UhsId, u64>,
    tickets: HashMap<(usize, Ticket), Vec<CompactTx>>,
    next_ticket: Ticket,
    in_doubt: Vec<CompactTx>,
    acked: Vec<CompactTx>,
    refused: HashMap<UhsId, SwapOutcome>,
    answered: u64,
    /// (crashes, cuts, missing-input answers, replay answers, expired answers, attestations
    /// refused as busy)
    seen: [u64; 6],
    next_id: u64,
}

fn uid(rng: &mut StdRng) -> UhsId {
    let mut x = [0u8; 32];
    rng.fill(&mut x);
    x
}

const CFG: AtomizerConfig = AtomizerConfig {
    window: 16,
    max_block: 64,
    max_pending: 4096,
};

impl Sim {
    fn new(seed: u64, shards: usize) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let map = ShardMap::even(shards).unwrap();
        let mut states: Vec<BlockShard> = (0..shards)
            .map(|s| BlockShard::new(map.clone(), s as ShardId))
            .collect();
        let mut view = BTreeMap::new();
        for _ in 0..64 {
            let id = uid(&mut rng);
            states[map.shard_of(&id) as usize].seed(&[(id, 100)]);
            view.insert(id, 100);
        }
        let sentinels = (0..2)
            .map(|_| {
                let seed = rng.gen();
                Submitter::new(
                    map.clone(),
                    SubmitConfig {
                        resend_after: 60,
                        poll_every: 10,
                        // Outcomes mostly from the feed; asking is the fallback.
                        waiting_poll: 150,
                        wait_limit: 400,
                        max_tries: 6,
                        // Narrow enough that the window fills and tries queue.
                        max_attesting: 48,
                        min_attesting: 4,
                        deadline: 5_000,
                    },
                    Box::new(StdRng::seed_from_u64(seed)),
                )
            })
            .collect();
        let mut s = Sim {
            rng,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            slots: Vec::new(),
            map: map.clone(),
            shards: states,
            atomizer: AtomizerState::new(CFG, map.clone()),
            log: Vec::new(),
            leader: None,
            epoch: 0,
            replicating: None,
            feeds: vec![vec![0; shards]; 2],
            sentinels,
            faults: true,
            cut: HashSet::new(),
            all_txs: HashMap::new(),
            view,
            tickets: HashMap::new(),
            next_ticket: 1,
            in_doubt: Vec::new(),
            acked: Vec::new(),
            refused: HashMap::new(),
            answered: 0,
            seen: [0; 6],
            next_id: 0,
        };
        s.leader = Some(s.new_leader());
        s.at(1, Ev::Tick);
        s.at(1, Ev::Submit);
        s
    }

    fn new_leader(&self) -> AtomizerLeader {
        AtomizerLeader::new(
            LeaderConfig {
                block_every: 15,
                resend_after: 80,
                max_step: 32,
                max_buffer: 10_000,
                max_send: 4,
                step_target: 20,
                min_admit: 8,
            },
            self.atomizer.height(),
            self.shards.len(),
        )
    }

    fn wall(&self) -> u64 {
        1_000 + self.now / 20
    }

    fn at(&mut self, delay: u64, ev: Ev) {
        self.seq += 1;
        self.slots.push(Some(ev));
        self.events
            .push(Reverse((self.now + delay, self.seq, self.slots.len() - 1)));
    }

    fn net_delay(&mut self) -> u64 {
        if self.faults {
            self.rng.gen_range(1..30)
        } else {
            self.rng.gen_range(1..4)
        }
    }

    fn lost(&mut self) -> bool {
        self.faults && self.rng.gen_bool(0.08)
    }

    /// Sends `ev` over the network: maybe lost, maybe twice.
    fn send(&mut self, ev: impl Fn() -> Ev) {
        if self.lost() {
            return;
        }
        let d = self.net_delay();
        if self.faults && self.rng.gen_bool(0.04) {
            self.at(d + 9, ev());
        }
        self.at(d, ev());
    }

    fn run_sentinel(&mut self, s: usize, out: Vec<SubmitOutput>) {
        for o in out {
            match o {
                SubmitOutput::Attest {
                    shard,
                    job,
                    attempts,
                    tx,
                    key,
                    min_height,
                    now,
                    ..
                } => self.send(|| {
                    Ev::Attest(
                        s,
                        shard,
                        job,
                        attempts.to_vec(),
                        tx.clone(),
                        key,
                        min_height,
                        now,
                    )
                }),
                SubmitOutput::AskStatus {
                    shard,
                    job,
                    txid,
                    min_height,
                } => self.send(|| Ev::Ask(s, shard, job, txid, min_height)),
                SubmitOutput::Fail { ticket, .. } => {
                    let txs = self.tickets.remove(&(s, ticket)).expect("failed once");
                    self.in_doubt.extend(txs);
                }
                SubmitOutput::Answer { ticket, outcomes } => {
                    let txs = self.tickets.remove(&(s, ticket)).expect("answered once");
                    assert_eq!(txs.len(), outcomes.len());
                    self.answered += 1;
                    for (tx, o) in txs.into_iter().zip(outcomes) {
                        match o {
                            // A replay of an acknowledged transaction past its expiry (and
                            // the grace) is answered by its spent inputs or its expiry, as in
                            // every store; only a first answer must hold.
                            SwapOutcome::MissingInput | SwapOutcome::Expired => {
                                self.seen[if o == SwapOutcome::Expired { 4 } else { 2 }] += 1;
                                if !self.acked.iter().any(|a| a.txid == tx.txid) {
                                    self.refused.insert(tx.txid, o);
                                }
                            }
                            SwapOutcome::AlreadyApplied | SwapOutcome::Confirmed => {
                                if o == SwapOutcome::AlreadyApplied {
                                    self.seen[3] += 1;
                                }
                                // Confirmed means on its txid's shard now.
                                let owner = &self.shards[self.map.shard_of(&tx.txid) as usize];
                                assert!(
                                    owner.is_confirmed(&tx.txid) || tx.expires < 2_000,
                                    "answered {o:?} but not confirmed on its shard"
                                );
                                assert!(
                                    !self.refused.contains_key(&tx.txid),
                                    "answered {o:?} after it was refused"
                                );
                                for i in &tx.inputs {
                                    self.view.remove(i);
                                }
                                for (id, v) in &tx.outputs {
                                    self.view.insert(*id, *v);
                                }
                                self.acked.push(tx);
                            }
                        }
                    }
                }
            }
        }
    }

    fn run_leader(&mut self, out: Vec<LeaderOutput>) {
        for o in out {
            match o {
                LeaderOutput::Replicate(cmd) => {
                    assert!(self.replicating.is_none(), "one step at a time");
                    // A step takes longer the more it carries (the leader's admission
                    // control takes a quarter less while steps are slow).
                    let AtomCmd::Step { attestations, .. } = &cmd;
                    let d = self.net_delay() + attestations.len() as u64 / 4;
                    self.replicating = Some((cmd, self.epoch));
                    let e = self.epoch;
                    self.at(d, Ev::Replicated(e));
                }
                LeaderOutput::SendBlocks { shard, from, to } => {
                    let blocks: Vec<Block> = self.log[(from - 1) as usize..to as usize].to_vec();
                    let e = self.epoch;
                    self.send(|| Ev::Blocks(shard, blocks.clone(), e));
                }
            }
        }
    }

    fn feed_leader(&mut self, input: LeaderInput) {
        if let Some(l) = self.leader.as_mut() {
            let out = l.handle(input);
            self.run_leader(out);
        }
    }

    fn commit(&mut self, cmd: AtomCmd) {
        let (_, blocks) = self.atomizer.apply(cmd);
        self.log.extend(blocks);
    }

    /// A few transactions from a (possibly stale) view: some conflict, some are replays of
    /// acknowledged ones, some expire soon.
    fn workload(&mut self) -> Vec<CompactTx> {
        let mut txs = Vec::new();
        let n = self.rng.gen_range(1..5);
        let ids: Vec<(UhsId, u64)> = self.view.iter().map(|(k, v)| (*k, *v)).collect();
        for _ in 0..n {
            self.next_id += 1;
            if !self.acked.is_empty() && self.rng.gen_bool(0.03) {
                let k = self.rng.gen_range(0..self.acked.len());
                txs.push(self.acked[k].clone());
                continue;
            }
            let txid = uid(&mut self.rng);
            let roll = self.rng.gen_range(0..100);
            let expires = if roll % 17 == 0 {
                self.wall() + 1
            } else {
                u64::MAX
            };
            let tx = if ids.is_empty() || roll < 5 {
                CompactTx {
                    expires,
                    txid,
                    kind: TxKind::Mint,
                    inputs: vec![],
                    outputs: vec![(uid(&mut self.rng), self.rng.gen_range(1..50))],
                }
            } else {
                let k = self.rng.gen_range(1..=3.min(ids.len()));
                let mut inputs = Vec::new();
                let mut total = 0;
                for _ in 0..k {
                    let (id, v) = ids[self.rng.gen_range(0..ids.len())];
                    if !inputs.contains(&id) {
                        inputs.push(id);
                        total += v;
                    }
                }
                if roll < 10 {
                    CompactTx {
                        expires,
                        txid,
                        kind: TxKind::Redeem,
                        inputs,
                        outputs: vec![],
                    }
                } else {
                    let a = self.rng.gen_range(0..=total);
                    let mut outputs = vec![(uid(&mut self.rng), a)];
                    if a < total {
                        outputs.push((uid(&mut self.rng), total - a));
                    }
                    CompactTx {
                        expires,
                        txid,
                        kind: TxKind::Transfer,
                        inputs,
                        outputs,
                    }
                }
            };
            self.all_txs.insert(tx.txid, tx.clone());
            txs.push(tx);
        }
        txs
    }

    fn submit(&mut self, txs: Vec<CompactTx>) {
        let s = self.rng.gen_range(0..self.sentinels.len());
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert((s, ticket), txs.clone());
        // The atomizer's committed height, read first (a linearizable read of its group).
        let height = self.atomizer.height();
        let now = self.wall();
        let out = self.sentinels[s].handle(SubmitInput::Submit {
            ticket,
            txs,
            height,
            now,
        });
        self.run_sentinel(s, out);
    }

    fn step(&mut self) -> bool {
        let Some(Reverse((t, _, slot))) = self.events.pop() else {
            return false;
        };
        self.now = t;
        let ev = self.slots[slot].take().expect("each event runs once");
        match ev {
            Ev::Tick => {
                let now = self.now;
                for s in 0..self.sentinels.len() {
                    let out = self.sentinels[s].handle(SubmitInput::Tick(now));
                    self.run_sentinel(s, out);
                    // Each shard's decision feed, read on and off, through the lossy network
                    // (what it drops, the sentinel learns by asking).
                    for shard in 0..self.shards.len() {
                        if self.cut.contains(&(shard as ShardId)) || self.rng.gen_bool(0.5) {
                            continue;
                        }
                        let (reached, _, decisions) =
                            self.shards[shard].decided_since(self.feeds[s][shard]);
                        self.feeds[s][shard] = self.feeds[s][shard].max(reached);
                        if !decisions.is_empty() {
                            self.send(|| Ev::Feed(s, decisions.clone()));
                        }
                    }
                }
                let wall = self.wall();
                self.feed_leader(LeaderInput::Tick { ms: now, wall });
                self.at(5, Ev::Tick);
            }
            Ev::Submit => {
                if self.leader.is_some() {
                    let txs = self.workload();
                    self.submit(txs);
                    let doubt = std::mem::take(&mut self.in_doubt);
                    if !doubt.is_empty() {
                        self.submit(doubt);
                    }
                }
                if self.faults {
                    let d = self.rng.gen_range(1..8);
                    self.at(d, Ev::Submit);
                    if self.rng.gen_bool(0.004) {
                        self.at(0, Ev::Crash);
                    }
                    if self.rng.gen_bool(0.01) {
                        let s = self.rng.gen_range(0..self.shards.len()) as ShardId;
                        self.at(0, Ev::Cut(s, true));
                        let d = self.rng.gen_range(20..300);
                        self.at(d, Ev::Cut(s, false));
                    }
                }
            }
            Ev::Attest(s, shard, job, attempts, tx, key, min_height, now) => {
                if self.cut.contains(&shard) {
                    return true;
                }
                let attempt = attempts.last().copied().unwrap_or_default();
                let mut verdict =
                    self.shards[shard as usize].attest(&tx, key, &attempts, min_height, now);
                if let Verdict::Attested(a) = &verdict {
                    // The shard forwards and waits for the leader's word: no room, and the
                    // sentinel is told to ask again later.
                    if self.leader.as_ref().is_some_and(|l| l.room() == 0) {
                        verdict = Verdict::Busy;
                        self.seen[5] += 1;
                    } else {
                        let a = a.clone();
                        self.send(|| Ev::ToAtomizer(vec![a.clone()]));
                    }
                }
                self.send(|| Ev::Verdict(s, job, attempt, shard, verdict.clone()));
            }
            Ev::Ask(s, shard, job, txid, min_height) => {
                if self.cut.contains(&shard) {
                    return true;
                }
                let status = self.shards[shard as usize].status(&txid, min_height);
                self.send(|| Ev::Status(s, job, status.clone(), min_height));
            }
            Ev::Verdict(s, job, attempt, shard, verdict) => {
                let out = self.sentinels[s].handle(SubmitInput::Verdict {
                    job,
                    attempt,
                    shard,
                    verdict,
                });
                self.run_sentinel(s, out);
            }
            Ev::Status(s, job, status, asked) => {
                let out = self.sentinels[s].handle(SubmitInput::Status { job, status, asked });
                self.run_sentinel(s, out);
            }
            Ev::Feed(s, decisions) => {
                let out = self.sentinels[s].handle(SubmitInput::Decided(decisions));
                self.run_sentinel(s, out);
            }
            Ev::ToAtomizer(a) => self.feed_leader(LeaderInput::Attest(a)),
            Ev::Replicated(epoch) => {
                if epoch == self.epoch {
                    if let Some((cmd, _)) = self.replicating.take() {
                        self.commit(cmd);
                        let h = self.atomizer.height();
                        let ms = self.now;
                        self.feed_leader(LeaderInput::Replicated { height: h, ms });
                    }
                }
            }
            Ev::Blocks(shard, blocks, epoch) => {
                if self.cut.contains(&shard) {
                    return true;
                }
                let mut h = 0;
                for b in &blocks {
                    h = match self.shards[shard as usize].apply(b) {
                        florin_cluster::atomizer::shard::BlockReply::Applied(h)
                        | florin_cluster::atomizer::shard::BlockReply::Behind(h) => h,
                        other => panic!("shard {shard}: {other:?}"),
                    };
                }
                self.send(|| Ev::ShardAt(shard, h, epoch));
            }
            Ev::ShardAt(shard, height, epoch) => {
                if epoch == self.epoch {
                    self.feed_leader(LeaderInput::ShardAt { shard, height });
                }
            }
            Ev::Crash => {
                if self.leader.take().is_some() {
                    self.seen[0] += 1;
                    // A step being replicated either reached a majority (the next leader has
                    // it) or is lost.
                    if let Some((cmd, _)) = self.replicating.take() {
                        if self.rng.gen_bool(0.5) {
                            self.commit(cmd);
                        }
                    }
                    self.epoch += 1;
                    let d = self.rng.gen_range(10..100);
                    self.at(d, Ev::Restart);
                }
            }
            Ev::Restart => {
                if self.leader.is_none() {
                    self.leader = Some(self.new_leader());
                }
            }
            Ev::Cut(s, on) => {
                if on {
                    self.seen[1] += 1;
                    self.cut.insert(s);
                } else {
                    self.cut.remove(&s);
                }
            }
        }
        true
    }

    fn quiescent(&self) -> bool {
        let h = self.log.len() as Height;
        self.leader.is_some()
            && self.tickets.is_empty()
            && self.in_doubt.is_empty()
            && self.atomizer.load().1 == 0
            && self.shards.iter().all(|s| s.height() == h)
    }

    fn check(&self, seed: u64) {
        // One chain, no id spent twice.
        let summary =
            verify_chain((0, GENESIS), &self.log).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(summary.tip, self.atomizer.tip());
        for s in &self.shards {
            assert_eq!((s.height(), s.tip()), (summary.height, summary.tip));
        }
        // Each txid ordered at most once; acknowledged ones are, refused ones are not.
        let mut ordered = HashSet::new();
        for b in &self.log {
            for t in &b.txs {
                assert!(
                    ordered.insert(t.tx.txid),
                    "seed {seed}: a txid ordered twice"
                );
            }
        }
        for tx in &self.acked {
            assert!(
                ordered.contains(&tx.txid),
                "seed {seed}: acknowledged tx lost"
            );
        }
        for (t, o) in &self.refused {
            if ordered.contains(t) {
                let (h, bt) = self
                    .log
                    .iter()
                    .flat_map(|b| b.txs.iter().map(move |t| (b.height, t)))
                    .find(|(_, x)| x.tx.txid == *t)
                    .unwrap();
                panic!(
                    "seed {seed}: refused ({o:?}) tx {:02x?} ordered in block {h} (expires {}, acked too: {}, clock {:?}) {:?}",
                    &t[..4],
                    bt.tx.expires,
                    self.acked.iter().any(|a| a.txid == *t),
                    self.log.iter().find(|b| b.height == h).map(|b| b.now),
                    self.log
                        .iter()
                        .flat_map(|b| b.rejected.iter().map(move |r| (b.height, r)))
                        .filter(|(_, r)| r.txid == *t)
                        .collect::<Vec<_>>()
                );
            }
        }
        // The shards' state is the log replayed from genesis.
        let mut replay: Vec<BlockShard> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, _)| BlockShard::new(self.map.clone(), i as ShardId))
            .collect();
        let genesis: Vec<(UhsId, u64)> = {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..64).map(|_| (uid(&mut rng), 100)).collect()
        };
        for r in &mut replay {
            r.seed(&genesis);
            for b in &self.log {
                r.apply(b);
            }
        }
        let mut minted = 0;
        let mut redeemed = 0;
        let mut in_set = 0;
        let mut sum = 0;
        for (s, r) in self.shards.iter().zip(&replay) {
            let mut a: Vec<_> = s.unspent().collect();
            let mut b: Vec<_> = r.unspent().collect();
            a.sort();
            b.sort();
            assert_eq!(a, b, "seed {seed}: a shard's set is not the log replayed");
            let books = s.books();
            assert_eq!(books, r.books());
            minted += books.minted_cents;
            redeemed += books.redeemed_cents;
            in_set += books.unspent_cents;
            sum += a.iter().map(|(_, v)| **v).sum::<u64>();
        }
        assert_eq!(
            minted - redeemed,
            in_set,
            "seed {seed}: value not conserved"
        );
        assert_eq!(in_set, sum);
        // Every spent input existed: created by genesis or an earlier block.
        let mut created: HashSet<UhsId> = genesis.iter().map(|(i, _)| *i).collect();
        for b in &self.log {
            for t in &b.txs {
                for i in &t.tx.inputs {
                    assert!(
                        created.contains(i),
                        "seed {seed}: spent an id never created"
                    );
                }
                created.extend(t.tx.outputs.iter().map(|(o, _)| *o));
            }
        }
    }
}

fn run(seed: u64, shards: usize) -> (u64, u64, [u64; 6], (u64, u64)) {
    let mut sim = Sim::new(seed, shards);
    while sim.now < 3_000 && sim.step() {}
    sim.faults = false;
    sim.cut.clear();
    if sim.leader.is_none() {
        sim.at(1, Ev::Restart);
    }
    let mut guard = 0;
    while !sim.quiescent() {
        assert!(sim.step(), "seed {seed}: ran out of events");
        if sim.leader.is_some() && !sim.in_doubt.is_empty() && sim.tickets.is_empty() {
            let doubt = std::mem::take(&mut sim.in_doubt);
            sim.submit(doubt);
        }
        guard += 1;
        assert!(
            guard < 2_000_000,
            "seed {seed}: did not settle at {}: tickets {} {:?} doubt {} atomizer {:?} log {} shards {:?}",
            sim.now,
            sim.tickets.len(),
            sim.sentinels
                .iter()
                .map(|s| s.describe().into_iter().take(3).collect::<Vec<_>>())
                .collect::<Vec<_>>(),
            sim.in_doubt.len(),
            sim.atomizer.load(),
            sim.log.len(),
            sim.shards.iter().map(BlockShard::height).collect::<Vec<_>>()
        );
    }
    sim.check(seed);
    (
        sim.acked.len() as u64,
        sim.answered,
        sim.seen,
        sim.atomizer.totals(),
    )
}

#[test]
fn seeded_faults_then_recovery_keep_every_invariant() {
    let mut acked = 0;
    let mut seen = [0u64; 6];
    let mut rejected = 0;
    for seed in 0..24 {
        let shards = 1 + (seed % 4) as usize;
        let (a, answered, s, totals) = run(seed, shards);
        assert!(answered > 10, "seed {seed}: too little load ({answered})");
        acked += a;
        rejected += totals.1;
        for i in 0..6 {
            seen[i] += s[i];
        }
    }
    println!("acknowledged {acked}, atomizer rejections {rejected}, seen {seen:?}");
    assert!(acked > 1000, "the workload commits something ({acked})");
    let [crashes, cuts, missing, replays, expired, busy] = seen;
    assert!(crashes >= 5 && cuts >= 10, "faults: {seen:?}");
    assert!(
        busy >= 10,
        "the leader's admission control refused nothing: {seen:?}"
    );
    assert!(
        missing >= 50 && replays >= 10 && expired >= 1 && rejected >= 10,
        "conflicts, replays, expiries and rejections: {seen:?}, {rejected} rejected"
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    assert_eq!(run(7, 3), run(7, 3));
}

//! Deterministic simulation of the sharded engine: the real shard and coordinator state
//! machines over a seeded network that drops, duplicates, delays, reorders and partitions,
//! with coordinator crashes (a new leader resumes from the replicated log, and an entry being
//! replicated at the crash may or may not have committed). Half the time the crashed leader is
//! only deposed: it goes on resending its commands under its old term for a while, and the
//! shards must refuse them once the new leader has reached them. A fault phase is followed by a
//! recovery phase; then the invariants are checked: no double spend, no lost acknowledged
//! transaction, all-or-nothing transactions, value conserved, every batch completed, every
//! submission answered.
//!
//! Replication of each group is modelled (a shard's state is durable and never lost; the
//! coordinator's log keeps what was committed): Raft itself is tested in `tests/raft.rs`
//! against real disks and by the multi-process test in the `florin` crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};

use florin_cluster::coordinator::{
    CoordEntry, CoordLog, Coordinator, CoordinatorConfig, Input, Output, Ticket,
};
use florin_cluster::route::{ShardId, ShardMap};
use florin_cluster::shard::{Fence, ShardCmd, ShardReply, ShardState};
use florin_cluster::Dtx;
use florin_ledger::{CompactTx, SwapOutcome, TxKind, UhsId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug)]
enum Ev {
    Tick,
    Submit,
    /// A command reaches a shard.
    ToShard(ShardId, Fence, ShardCmd, u64),
    /// A shard's answer reaches the coordinator (of the given epoch).
    ToCoord(Dtx, ShardId, ShardReply, u64),
    /// An entry's replication finishes (for the given epoch).
    Replicated(CoordEntry, u64),
    Crash,
    Restart,
    Partition(ShardId, bool),
}

struct Sim {
    /// Whether single-shard transactions take the one-phase path.
    one_phase: bool,
    rng: StdRng,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slots: Vec<Option<Ev>>,
    map: ShardMap,
    shards: Vec<ShardState>,
    log: CoordLog,
    coord: Option<Coordinator>,
    /// A deposed leader that does not know it yet, and until when it keeps resending.
    zombie: Option<(Coordinator, u64)>,
    epoch: u64,
    replicating: Vec<CoordEntry>,
    faults: bool,
    cut: HashSet<ShardId>,
    // Workload.
    all_txs: HashMap<UhsId, CompactTx>,
    view: BTreeMap<UhsId, u64>,
    tickets: HashMap<Ticket, Vec<CompactTx>>,
    next_ticket: Ticket,
    in_doubt: Vec<CompactTx>,
    acked: HashSet<UhsId>,
    answered: u64,
    /// (crashes, partitions, missing-input answers, replay answers, deposed leaders' commands
    /// refused)
    seen: [u64; 5],
    minted: u64,
    redeemed_max: u64,
    next_id: u64,
}

fn uid(rng: &mut StdRng) -> UhsId {
    let mut x = [0u8; 32];
    rng.fill(&mut x);
    x
}

impl Sim {
    fn new(seed: u64, shards: usize) -> Sim {
        let mut rng = StdRng::seed_from_u64(seed);
        let map = ShardMap::even(shards).unwrap();
        let mut states = vec![ShardState::new(); shards];
        let mut view = BTreeMap::new();
        for _ in 0..64 {
            let id = uid(&mut rng);
            states[map.shard_of(&id) as usize].seed(&[(id, 100)]);
            view.insert(id, 100);
        }
        let mut s = Sim {
            rng,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            slots: Vec::new(),
            map,
            shards: states,
            log: CoordLog::default(),
            coord: None,
            zombie: None,
            epoch: 0,
            replicating: Vec::new(),
            faults: true,
            // Half the seeds of each shard count run each commit path.
            one_phase: (seed / 4).is_multiple_of(2),
            cut: HashSet::new(),
            all_txs: HashMap::new(),
            view,
            tickets: HashMap::new(),
            next_ticket: 1,
            in_doubt: Vec::new(),
            acked: HashSet::new(),
            answered: 0,
            seen: [0; 5],
            minted: 64 * 100,
            redeemed_max: 0,
            next_id: 0,
        };
        s.coord = Some(s.new_coord());
        s.at(1, Ev::Tick);
        s.at(1, Ev::Submit);
        s
    }

    fn new_coord(&mut self) -> Coordinator {
        let seed = self.rng.gen();
        Coordinator::new(
            self.map.clone(),
            CoordinatorConfig {
                max_batch: 8,
                max_inflight: 3,
                max_attempts: 6,
                resend_after: 40,
                one_phase: self.one_phase,
            },
            // The group's Raft term: every new leader's is higher.
            Fence {
                group: 0,
                term: self.epoch + 1,
            },
            Box::new(StdRng::seed_from_u64(seed)),
        )
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
        self.faults && self.rng.gen_bool(0.1)
    }

    fn run_outputs(&mut self, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Replicate(e) => {
                    let d = self.net_delay();
                    self.replicating.push(e.clone());
                    self.at(d, Ev::Replicated(e, self.epoch));
                }
                Output::Send { shard, by, cmd } => {
                    if self.lost() {
                        continue;
                    }
                    let d = self.net_delay();
                    if self.faults && self.rng.gen_bool(0.05) {
                        self.at(d + 7, Ev::ToShard(shard, by, cmd.clone(), self.epoch));
                    }
                    self.at(d, Ev::ToShard(shard, by, cmd, self.epoch));
                }
                Output::Fail { ticket, why } => {
                    // Never in this simulation (shards and coordinators agree on the map).
                    panic!("submission {ticket} failed: {why}");
                }
                Output::Alert { why, .. } => panic!("alert: {why}"),
                Output::Answer { ticket, outcomes } => {
                    let txs = self.tickets.remove(&ticket).expect("answered once");
                    assert_eq!(txs.len(), outcomes.len());
                    self.answered += 1;
                    for (tx, o) in txs.iter().zip(outcomes) {
                        match o {
                            SwapOutcome::MissingInput => self.seen[2] += 1,
                            SwapOutcome::AlreadyApplied => self.seen[3] += 1,
                            SwapOutcome::Confirmed => {}
                            // Nothing expires here: every transaction is valid for ever.
                            SwapOutcome::Expired => panic!("{:02x?} expired", &tx.txid[..8]),
                        }
                        if matches!(o, SwapOutcome::Confirmed | SwapOutcome::AlreadyApplied) {
                            if !self.acked.contains(&tx.txid) {
                                self.check_readable(tx, o);
                            }
                            self.acked.insert(tx.txid);
                            for i in &tx.inputs {
                                self.view.remove(i);
                            }
                            for (id, v) in &tx.outputs {
                                self.view.insert(*id, *v);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Reads after an acknowledgement see it: when a transaction is first acknowledged
    /// (confirmed, or answered as a replay), its txid is confirmed and its outputs are unspent
    /// on their shards right then (nobody can have spent them yet: wallets learn outputs only
    /// from acknowledgements), and its inputs are gone.
    fn check_readable(&self, tx: &CompactTx, o: SwapOutcome) {
        let shard = |id: &UhsId| &self.shards[self.map.shard_of(id) as usize];
        assert!(
            shard(&tx.txid).is_confirmed(&tx.txid),
            "answered {o:?} but the txid is not confirmed on its shard"
        );
        for (id, _) in &tx.outputs {
            assert!(
                shard(id).is_unspent(id),
                "answered {o:?} but an output is not yet readable as unspent"
            );
        }
        for id in &tx.inputs {
            assert!(
                !shard(id).is_unspent(id),
                "answered {o:?} but an input is still unspent"
            );
        }
    }

    fn feed(&mut self, input: Input) {
        if let Some(c) = self.coord.as_mut() {
            let out = c.handle(input);
            self.run_outputs(out);
        }
    }

    /// A few transactions from the wallet's (possibly stale) view; some conflict on purpose.
    fn workload(&mut self) -> Vec<CompactTx> {
        let mut txs = Vec::new();
        let n = self.rng.gen_range(1..6);
        let ids: Vec<(UhsId, u64)> = self.view.iter().map(|(k, v)| (*k, *v)).collect();
        for _ in 0..n {
            self.next_id += 1;
            let mut txid = uid(&mut self.rng);
            txid[31] = 0;
            let kind_roll = self.rng.gen_range(0..100);
            let tx = if ids.is_empty() || kind_roll < 5 {
                let v = self.rng.gen_range(1..50);
                self.minted += v;
                CompactTx {
                    expires: u64::MAX,
                    txid,
                    kind: TxKind::Mint,
                    inputs: vec![],
                    outputs: vec![(uid(&mut self.rng), v)],
                }
            } else {
                let k = self.rng.gen_range(1..=2.min(ids.len()));
                let mut inputs = Vec::new();
                let mut total = 0;
                for _ in 0..k {
                    let (id, v) = ids[self.rng.gen_range(0..ids.len())];
                    if !inputs.contains(&id) {
                        inputs.push(id);
                        total += v;
                    }
                }
                if kind_roll < 10 {
                    self.redeemed_max += total;
                    CompactTx {
                        expires: u64::MAX,
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
                        expires: u64::MAX,
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
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(ticket, txs.clone());
        self.feed(Input::Submit {
            ticket,
            txs,
            now: 0,
        });
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
                self.feed(Input::Tick(now));
                // The deposed leader resends what it has in flight (its entries never
                // replicate and it hears no answers: only its sends go out).
                if let Some((mut z, until)) = self.zombie.take() {
                    if now < until {
                        let sends = z
                            .handle(Input::Tick(now))
                            .into_iter()
                            .filter(|o| matches!(o, Output::Send { .. }))
                            .collect();
                        self.run_outputs(sends);
                        self.zombie = Some((z, until));
                    }
                }
                self.at(5, Ev::Tick);
            }
            Ev::Submit => {
                if self.coord.is_some() {
                    let txs = self.workload();
                    self.submit(txs);
                    // Resubmit what was in doubt after a crash (idempotent).
                    let doubt = std::mem::take(&mut self.in_doubt);
                    if !doubt.is_empty() {
                        self.submit(doubt);
                    }
                }
                if self.faults {
                    let d = self.rng.gen_range(1..8);
                    self.at(d, Ev::Submit);
                }
                if self.faults && self.rng.gen_bool(0.004) {
                    self.at(0, Ev::Crash);
                }
                if self.faults && self.rng.gen_bool(0.01) {
                    let s = self.rng.gen_range(0..self.shards.len()) as ShardId;
                    self.at(0, Ev::Partition(s, true));
                    let d = self.rng.gen_range(20..200);
                    self.at(d, Ev::Partition(s, false));
                }
            }
            Ev::ToShard(s, by, cmd, epoch) => {
                if self.cut.contains(&s) || self.lost() {
                    return true;
                }
                let dtx = cmd.dtx();
                let reply = self.shards[s as usize].apply(by, cmd);
                if matches!(reply, ShardReply::Deposed(_)) {
                    self.seen[4] += 1;
                }
                if !self.lost() {
                    let d = self.net_delay();
                    self.at(d, Ev::ToCoord(dtx, s, reply, epoch));
                }
            }
            Ev::ToCoord(dtx, shard, reply, epoch) => {
                if epoch == self.epoch && !self.cut.contains(&shard) {
                    self.feed(Input::Reply { dtx, shard, reply });
                }
            }
            Ev::Replicated(e, epoch) => {
                if epoch == self.epoch {
                    if let Some(i) = self.replicating.iter().position(|x| *x == e) {
                        self.replicating.swap_remove(i);
                    }
                    self.log.apply(&e);
                    self.feed(Input::Replicated(e));
                }
            }
            Ev::Crash => {
                if let Some(mut c) = self.coord.take() {
                    self.seen[0] += 1;
                    // Entries being replicated when the leader dies: each either reached a
                    // majority (the next leader commits it before serving) or is lost.
                    for e in std::mem::take(&mut self.replicating) {
                        if self.rng.gen_bool(0.5) {
                            self.log.apply(&e);
                        }
                    }
                    if self.faults && self.rng.gen_bool(0.5) {
                        // Deposed, not dead: its submitters give up on it all the same.
                        let mut open: Vec<Ticket> = self.tickets.keys().copied().collect();
                        open.sort_unstable();
                        for t in open {
                            if let Some(txs) = self.tickets.remove(&t) {
                                self.in_doubt.extend(txs);
                            }
                        }
                        let until = self.now + self.rng.gen_range(100..600);
                        self.zombie = Some((c, until));
                    } else {
                        for t in c.abandon() {
                            if let Some(txs) = self.tickets.remove(&t) {
                                self.in_doubt.extend(txs);
                            }
                        }
                    }
                    self.epoch += 1;
                    let d = self.rng.gen_range(10..100);
                    self.at(d, Ev::Restart);
                }
            }
            Ev::Restart => {
                if self.coord.is_some() {
                    return true;
                }
                let c = self.new_coord();
                self.coord = Some(c);
                let batches = self.log.batches().clone();
                self.feed(Input::Resume(batches));
            }
            Ev::Partition(s, on) => {
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
        self.coord.is_some()
            && self.tickets.is_empty()
            && self.in_doubt.is_empty()
            && self.log.batches().is_empty()
            && self
                .coord
                .as_ref()
                .is_some_and(|c| c.in_flight() == 0 && c.queued() == 0)
            && self.shards.iter().all(|s| s.in_flight() == (0, 0))
    }

    fn check(&self, seed: u64) {
        let confirmed: HashSet<UhsId> = self
            .shards
            .iter()
            .flat_map(|s| s.confirmed().copied())
            .collect();
        // No lost acknowledged transaction.
        for t in &self.acked {
            assert!(confirmed.contains(t), "seed {seed}: acknowledged tx lost");
        }
        // No double spend: confirmed transactions' inputs are disjoint.
        let mut spent = HashSet::new();
        for t in &confirmed {
            let tx = &self.all_txs[t];
            for i in &tx.inputs {
                assert!(spent.insert(*i), "seed {seed}: an id was spent twice");
            }
        }
        // All or nothing: outputs of confirmed txs exist unless spent; of others never.
        let unspent: HashMap<UhsId, u64> = self
            .shards
            .iter()
            .flat_map(|s| s.unspent().map(|(k, v)| (*k, *v)))
            .collect();
        for tx in self.all_txs.values() {
            let ok = confirmed.contains(&tx.txid);
            for (o, _) in &tx.outputs {
                if ok {
                    assert!(
                        unspent.contains_key(o) || spent.contains(o),
                        "seed {seed}: output of a confirmed tx missing"
                    );
                } else {
                    assert!(
                        !unspent.contains_key(o) && !spent.contains(o),
                        "seed {seed}: output of an unconfirmed tx exists"
                    );
                }
            }
            if ok {
                assert!(tx.inputs.iter().all(|i| !unspent.contains_key(i)));
            }
        }
        // Value conserved, and the books agree with the set.
        let mut minted = 0;
        let mut redeemed = 0;
        let mut in_set = 0;
        for s in &self.shards {
            let b = s.books();
            minted += b.minted_cents;
            redeemed += b.redeemed_cents;
            in_set += b.unspent_cents;
        }
        assert_eq!(
            minted - redeemed,
            in_set,
            "seed {seed}: value not conserved"
        );
        assert_eq!(in_set, unspent.values().sum::<u64>());
        assert!(minted <= self.minted && redeemed <= self.redeemed_max);
    }
}

fn run(seed: u64, shards: usize) -> (usize, u64, [u64; 5]) {
    let mut sim = Sim::new(seed, shards);
    // Fault phase.
    while sim.now < 3_000 && sim.step() {}
    // Recovery phase: heal everything, stop the load, let every batch finish.
    sim.faults = false;
    sim.cut.clear();
    if sim.coord.is_none() {
        sim.at(1, Ev::Restart);
    }
    let mut guard = 0;
    while !sim.quiescent() {
        assert!(sim.step(), "seed {seed}: ran out of events");
        if sim.coord.is_some() && !sim.in_doubt.is_empty() && sim.tickets.is_empty() {
            let doubt = std::mem::take(&mut sim.in_doubt);
            sim.submit(doubt);
        }
        guard += 1;
        if guard >= 2_000_000 {
            panic!(
                "seed {seed}: did not settle: tickets {} doubt {} log {:?} coord {:?} shards {:?}",
                sim.tickets.len(),
                sim.in_doubt.len(),
                sim.log.batches().len(),
                sim.coord
                    .as_ref()
                    .map(|c| (c.in_flight(), c.queued(), c.open_tickets())),
                sim.shards.iter().map(|s| s.in_flight()).collect::<Vec<_>>()
            );
        }
    }
    sim.check(seed);
    let confirmed = sim.shards.iter().map(|s| s.confirmed().count()).sum();
    (confirmed, sim.answered, sim.seen)
}

#[test]
fn seeded_faults_then_recovery_keep_every_invariant() {
    let mut total = 0;
    let mut seen = [0u64; 5];
    for seed in 0..24 {
        let shards = 1 + (seed % 4) as usize;
        let (confirmed, answered, s) = run(seed, shards);
        assert!(answered > 10, "seed {seed}: too little load ({answered})");
        total += confirmed;
        for i in 0..5 {
            seen[i] += s[i];
        }
    }
    assert!(total > 1000, "the workload commits something ({total})");
    // The runs did meet what they are meant to survive.
    let [crashes, partitions, conflicts, replays, fenced] = seen;
    assert!(
        crashes >= 5 && partitions >= 10 && fenced >= 100,
        "faults: {seen:?}"
    );
    assert!(
        conflicts >= 50 && replays >= 1,
        "conflicts and replays: {seen:?}"
    );
}

#[test]
fn the_same_seed_gives_the_same_run() {
    assert_eq!(run(7, 3), run(7, 3));
}

//! The sharded ledger in process: the real coordinator (`florin_cluster::coordinator`) and
//! locking shards (`florin_cluster::shard`) driven by fuzzer-chosen operations, checked against
//! a reference model (a set of unspent ids).
//!
//! Operations: submit transactions (transfers, mints and redeems over known ids, unknown ids,
//! duplicated inputs, replays of earlier transactions), deliver, drop or duplicate any message
//! in flight (commands to shards, shards' answers, replication of the coordinator's log), let
//! the clock run (resends), and crash the coordinator leader (its log entries being replicated
//! commit or are lost, a new leader of a higher term resumes from the log, the old leader's
//! commands still in the network arrive late). Then the network heals and everything drains.
//!
//! Checked at the end: every submission to a live leader is answered once, with one outcome per
//! transaction; no acknowledged transaction is lost (confirmed or already-applied answers are
//! confirmed on the shards); no input is spent by two committed transactions; the committed
//! transactions replay on the reference model from the genesis set, each input unspent when
//! spent, and the model's final set equals the shards' unspent ids with the same values; money
//! is conserved (books and unspent sums agree with genesis plus mints minus redeems); reads
//! (`is_unspent`) agree with the model; no lock or batch is left behind.

use std::collections::{HashMap, HashSet};

use florin_cluster::coordinator::{
    CoordEntry, CoordLog, Coordinator, CoordinatorConfig, Input as CIn, Output, Ticket,
};
use florin_cluster::route::{ShardId, ShardMap};
use florin_cluster::shard::{Fence, ShardCmd, ShardReply, ShardState};
use florin_cluster::Dtx;
use florin_crypto::hash;
use florin_ledger::{CompactTx, SwapOutcome, TxKind, UhsId};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::Input;

/// Outputs in the genesis set, each worth this much.
const GENESIS: u64 = 8;
const GENESIS_VALUE: u64 = 100;
/// Most operations taken from one input.
const MAX_OPS: usize = 400;
/// Most steps of the final drain (a healthy cluster needs far fewer).
const MAX_DRAIN: usize = 50_000;

enum Msg {
    ToShard(ShardId, Fence, ShardCmd),
    ToCoord(Dtx, ShardId, ShardReply, u64),
    Replicated(CoordEntry, u64),
}

impl Clone for Msg {
    fn clone(&self) -> Self {
        match self {
            Msg::ToShard(s, f, c) => Msg::ToShard(*s, *f, c.clone()),
            Msg::ToCoord(d, s, r, e) => Msg::ToCoord(*d, *s, r.clone(), *e),
            Msg::Replicated(c, e) => Msg::Replicated(c.clone(), *e),
        }
    }
}

struct World {
    map: ShardMap,
    shards: Vec<ShardState>,
    log: CoordLog,
    coord: Coordinator,
    epoch: u64,
    seed: u64,
    one_phase: bool,
    net: Vec<Msg>,
    now: u64,
    /// Open tickets of the live leader, with their transactions.
    tickets: HashMap<Ticket, Vec<CompactTx>>,
    next_ticket: Ticket,
    /// Transactions whose submission was lost with a leader (may or may not have committed).
    in_doubt: usize,
    /// Acknowledged: confirmed or already applied.
    acked: HashSet<UhsId>,
    /// Answered missing-input, for transactions submitted once only.
    refused: Vec<UhsId>,
    submitted: HashMap<UhsId, (CompactTx, u32)>,
    values: HashMap<UhsId, u64>,
    known: Vec<UhsId>,
    next_id: u64,
}

fn id(tag: &str, n: u64) -> UhsId {
    hash(
        "florin/fuzz/cluster-model",
        &[tag.as_bytes(), &n.to_le_bytes()],
    )
}

fn config(one_phase: bool) -> CoordinatorConfig {
    CoordinatorConfig {
        max_batch: 4,
        max_inflight: 2,
        max_attempts: 4,
        resend_after: 16,
        one_phase,
    }
}

impl World {
    fn new(shards: usize, one_phase: bool, seed: u64) -> World {
        let map = match ShardMap::even(shards) {
            Ok(m) => m,
            Err(e) => panic!("shard map of {shards}: {e}"),
        };
        let mut states = vec![ShardState::new(); shards];
        let mut values = HashMap::new();
        let mut known = Vec::new();
        for i in 0..GENESIS {
            let g = id("genesis", i);
            states[usize::from(map.shard_of(&g))].seed(&[(g, GENESIS_VALUE)]);
            values.insert(g, GENESIS_VALUE);
            known.push(g);
        }
        let coord = Coordinator::new(
            map.clone(),
            config(one_phase),
            Fence { group: 0, term: 1 },
            Box::new(StdRng::seed_from_u64(seed)),
        );
        World {
            map,
            shards: states,
            log: CoordLog::default(),
            coord,
            epoch: 1,
            seed,
            one_phase,
            net: Vec::new(),
            now: 0,
            tickets: HashMap::new(),
            next_ticket: 1,
            in_doubt: 0,
            acked: HashSet::new(),
            refused: Vec::new(),
            submitted: HashMap::new(),
            values,
            known,
            next_id: 0,
        }
    }

    fn feed(&mut self, input: CIn) {
        let out = self.coord.handle(input);
        for o in out {
            match o {
                Output::Replicate(e) => self.net.push(Msg::Replicated(e, self.epoch)),
                Output::Send { shard, by, cmd } => self.net.push(Msg::ToShard(shard, by, cmd)),
                Output::Answer { ticket, outcomes } => {
                    let Some(txs) = self.tickets.remove(&ticket) else {
                        panic!("ticket {ticket} answered twice or never submitted");
                    };
                    assert!(txs.len() == outcomes.len(), "one outcome per transaction");
                    for (tx, o) in txs.iter().zip(outcomes) {
                        match o {
                            SwapOutcome::Confirmed | SwapOutcome::AlreadyApplied => {
                                self.acked.insert(tx.txid);
                            }
                            SwapOutcome::MissingInput => self.refused.push(tx.txid),
                            // Every transaction here is valid for ever.
                            SwapOutcome::Expired => panic!("a transaction expired"),
                        }
                    }
                }
                Output::Fail { ticket, .. } => {
                    if let Some(txs) = self.tickets.remove(&ticket) {
                        self.in_doubt += txs.len();
                    }
                }
                // The model's shards and coordinators share one map: a refusal is a bug.
                Output::Alert { why, .. } => panic!("alert: {why}"),
            }
        }
    }

    fn fresh(&mut self, value: u64) -> (UhsId, u64) {
        self.next_id += 1;
        let o = id("output", self.next_id);
        self.values.insert(o, value);
        self.known.push(o);
        (o, value)
    }

    fn make_tx(&mut self, input: &mut Input<'_>) -> CompactTx {
        let op = input.u8();
        if op % 8 == 7 && !self.submitted.is_empty() {
            // A replay of an earlier transaction, byte for byte.
            let mut all: Vec<&UhsId> = self.submitted.keys().collect();
            all.sort_unstable();
            let pick = *all[input.below(all.len())];
            return self.submitted[&pick].0.clone();
        }
        let kind = match op % 8 {
            5 => TxKind::Mint,
            6 => TxKind::Redeem,
            _ => TxKind::Transfer,
        };
        let mut inputs = Vec::new();
        if kind != TxKind::Mint {
            for _ in 0..1 + input.below(3) {
                let r = input.u8();
                if r == 255 {
                    self.next_id += 1;
                    inputs.push(id("unknown", self.next_id));
                } else if r == 254 && !inputs.is_empty() {
                    inputs.push(inputs[0]);
                } else {
                    let k = self.known.len();
                    // Mostly recent ids: chains of spends.
                    let back = input.below(k.min(16));
                    inputs.push(self.known[k - 1 - back]);
                }
            }
        }
        let total: u64 = match kind {
            TxKind::Mint => 1 + u64::from(input.u8()),
            _ => inputs
                .iter()
                .map(|i| self.values.get(i).copied().unwrap_or(0))
                .sum(),
        };
        let mut outputs = Vec::new();
        if kind != TxKind::Redeem {
            let n = 1 + input.below(2) as u64;
            let mut left = total;
            for k in 0..n {
                let v = if k + 1 == n { left } else { left / 2 };
                left -= v;
                outputs.push(self.fresh(v));
            }
        }
        self.next_id += 1;
        let tx = CompactTx {
            txid: id("txid", self.next_id),
            kind,
            inputs,
            outputs,
            expires: u64::MAX,
        };
        self.submitted.insert(tx.txid, (tx.clone(), 0));
        tx
    }

    fn submit(&mut self, input: &mut Input<'_>) {
        let n = 1 + input.below(3);
        let txs: Vec<CompactTx> = (0..n).map(|_| self.make_tx(input)).collect();
        for t in &txs {
            if let Some(e) = self.submitted.get_mut(&t.txid) {
                e.1 += 1;
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(ticket, txs.clone());
        self.feed(CIn::Submit {
            ticket,
            txs,
            now: 0,
        });
    }

    fn deliver(&mut self, i: usize) {
        let m = self.net.remove(i);
        match m {
            Msg::ToShard(s, by, cmd) => {
                let dtx = cmd.dtx();
                let reply = self.shards[usize::from(s)].apply(by, cmd);
                self.net.push(Msg::ToCoord(dtx, s, reply, self.epoch));
            }
            Msg::ToCoord(dtx, shard, reply, epoch) => {
                if epoch == self.epoch {
                    self.feed(CIn::Reply { dtx, shard, reply });
                }
            }
            Msg::Replicated(e, epoch) => {
                self.log.apply(&e);
                if epoch == self.epoch {
                    self.feed(CIn::Replicated(e));
                }
            }
        }
    }

    /// The leader fails: entries in replication commit or not (`commit`), its submitters
    /// give up, and a leader of the next term resumes from the log.
    fn crash(&mut self, commit: &mut Input<'_>) {
        let mut kept = Vec::new();
        for m in std::mem::take(&mut self.net) {
            match m {
                Msg::Replicated(e, epoch) if epoch == self.epoch => {
                    if commit.u8() & 1 == 1 {
                        self.log.apply(&e);
                    }
                }
                other => kept.push(other),
            }
        }
        self.net = kept;
        for (_, txs) in self.tickets.drain() {
            self.in_doubt += txs.len();
        }
        self.epoch += 1;
        self.coord = Coordinator::new(
            self.map.clone(),
            config(self.one_phase),
            Fence {
                group: 0,
                term: self.epoch,
            },
            Box::new(StdRng::seed_from_u64(self.seed ^ (self.epoch << 32))),
        );
        let batches = self.log.batches().clone();
        self.feed(CIn::Resume(batches));
    }

    fn tick(&mut self, by: u64) {
        self.now += by;
        let now = self.now;
        self.feed(CIn::Tick(now));
    }

    fn drain(&mut self) {
        for _ in 0..MAX_DRAIN {
            if self.net.is_empty() {
                if self.tickets.is_empty()
                    && self.log.batches().is_empty()
                    && self.coord.in_flight() == 0
                    && self.coord.queued() == 0
                {
                    return;
                }
                self.tick(17);
            } else {
                self.deliver(0);
            }
        }
        panic!(
            "the cluster did not settle: {} tickets open, {} batches logged, {} in flight, {} queued",
            self.tickets.len(),
            self.log.batches().len(),
            self.coord.in_flight(),
            self.coord.queued()
        );
    }

    fn check(&self) {
        let owner = |x: &UhsId| &self.shards[usize::from(self.map.shard_of(x))];
        let committed: Vec<&CompactTx> = self
            .submitted
            .values()
            .map(|(t, _)| t)
            .filter(|t| owner(&t.txid).is_confirmed(&t.txid))
            .collect();
        for t in &self.acked {
            assert!(
                owner(t).is_confirmed(t),
                "an acknowledged transaction is lost"
            );
        }
        for t in &self.refused {
            if self.submitted.get(t).is_some_and(|(_, n)| *n == 1) {
                assert!(!owner(t).is_confirmed(t), "a refused transaction committed");
            }
        }
        let confirmed_total: usize = self.shards.iter().map(|s| s.confirmed().count()).sum();
        assert!(
            confirmed_total == committed.len(),
            "a shard confirmed an unknown transaction"
        );
        // No double spend.
        let mut spent = HashSet::new();
        for t in &committed {
            for i in &t.inputs {
                assert!(spent.insert(*i), "an input is spent twice");
            }
        }
        // Replay on the model.
        let mut model: HashSet<UhsId> = (0..GENESIS).map(|i| id("genesis", i)).collect();
        let mut left: Vec<&CompactTx> = committed.clone();
        let mut expected_total = GENESIS * GENESIS_VALUE;
        while !left.is_empty() {
            let before = left.len();
            left.retain(|t| {
                if t.inputs.iter().all(|i| model.contains(i)) {
                    for i in &t.inputs {
                        model.remove(i);
                    }
                    model.extend(t.outputs.iter().map(|(o, _)| *o));
                    let ins: u64 = t.inputs.iter().map(|i| self.values[i]).sum();
                    let outs: u64 = t.outputs.iter().map(|(_, v)| v).sum();
                    expected_total = expected_total + outs - ins;
                    false
                } else {
                    true
                }
            });
            assert!(
                left.len() < before,
                "a committed transaction spent an input that was not unspent"
            );
        }
        let mut on_shards = HashSet::new();
        let mut unspent_total = 0;
        for (k, s) in self.shards.iter().enumerate() {
            assert!(
                s.in_flight() == (0, 0),
                "shard {k} keeps locks after the drain"
            );
            for (i, v) in s.unspent() {
                assert!(self.map.owns(k as ShardId, i), "an id on the wrong shard");
                assert!(self.values.get(i) == Some(v), "an output's value changed");
                on_shards.insert(*i);
                unspent_total += v;
            }
        }
        assert!(
            on_shards == model,
            "the shards' unspent set differs from the model"
        );
        assert!(unspent_total == expected_total, "money is not conserved");
        let (mut minted, mut redeemed, mut books_unspent) = (0, 0, 0);
        for s in &self.shards {
            let b = s.books();
            minted += b.minted_cents;
            redeemed += b.redeemed_cents;
            books_unspent += b.unspent_cents;
        }
        assert!(
            books_unspent == unspent_total,
            "books disagree with the unspent outputs"
        );
        assert!(
            minted - redeemed == unspent_total,
            "minted - redeemed != unspent"
        );
        for k in &self.known {
            assert!(
                owner(k).is_unspent(k) == model.contains(k),
                "a read disagrees with the model"
            );
        }
    }
}

/// The target.
pub fn cluster_model(data: &[u8]) {
    let mut input = Input::new(data);
    let shards = 1 + input.below(3);
    let one_phase = input.u8() & 1 == 1;
    let seed = input.u64();
    let mut w = World::new(shards, one_phase, seed);
    for _ in 0..MAX_OPS {
        if input.is_empty() {
            break;
        }
        match input.u8() % 16 {
            0..=3 => w.submit(&mut input),
            4..=8 => {
                if !w.net.is_empty() {
                    let i = input.below(w.net.len());
                    w.deliver(i);
                }
            }
            9 | 10 => {
                // Drop a message (not the live leader's log replication: Raft does not lose
                // a committed entry, and a leader waits for its own).
                if !w.net.is_empty() {
                    let i = input.below(w.net.len());
                    if !matches!(w.net[i], Msg::Replicated(_, e) if e == w.epoch) {
                        w.net.remove(i);
                    }
                }
            }
            11 => {
                // Duplicate a message (the network may; log replication is delivered once).
                if !w.net.is_empty() && w.net.len() < 256 {
                    let i = input.below(w.net.len());
                    if !matches!(w.net[i], Msg::Replicated(..)) {
                        let m = w.net[i].clone();
                        w.net.push(m);
                    }
                }
            }
            12 | 13 => {
                let by = u64::from(input.u8() % 40);
                w.tick(by);
            }
            14 => w.crash(&mut input),
            _ => {
                // Deliver everything in flight now, in order.
                for _ in 0..w.net.len().min(32) {
                    w.deliver(0);
                }
            }
        }
    }
    w.drain();
    w.check();
    let _ = w.in_doubt;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Two shards, two-phase: twenty transfers, each spending the newest output (all-zero
    /// input picks one transfer of the newest known id per submission).
    fn busy_world() -> World {
        let mut w = World::new(2, false, 9);
        let ops = vec![0u8; 4000];
        let mut input = Input::new(&ops);
        for _ in 0..20 {
            w.submit(&mut input);
            w.drain();
        }
        w
    }

    #[test]
    fn the_model_sees_commits_and_agrees() {
        let w = busy_world();
        w.check();
        assert!(
            w.acked.len() == 20,
            "only {} transactions committed",
            w.acked.len()
        );
    }

    #[test]
    fn the_check_catches_money_from_nowhere() {
        let mut w = busy_world();
        // An output no transaction made appears on a shard.
        let rogue = id("rogue", 1);
        let s = usize::from(w.map.shard_of(&rogue));
        w.shards[s].seed(&[(rogue, 5)]);
        w.values.insert(rogue, 5);
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.check())).is_err());
    }

    #[test]
    fn the_check_catches_a_lost_acknowledgement() {
        let mut w = busy_world();
        w.acked.insert(id("txid", 999_999));
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.check())).is_err());
    }
}

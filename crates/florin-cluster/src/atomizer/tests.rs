//! Each machine by the commands it takes and emits.

use florin_ledger::{CompactTx, SwapOutcome, TxKind};
use rand::SeedableRng;
use smallvec::smallvec;

use super::leader::{AtomizerLeader, LeaderConfig, LeaderInput, LeaderOutput};
use super::machine::{AtomCmd, AtomizerConfig, AtomizerState};
use super::shard::{BlockReply, BlockShard, TxStatus, Verdict};
use super::submit::{SubmitConfig, SubmitInput, SubmitOutput, Submitter};
use super::*;
use crate::route::ShardMap;

/// An id whose first byte puts it on shard 0 (`< 0x80`) or 1 of an even two-shard map.
fn id(shard: u8, n: u8) -> [u8; 32] {
    let mut x = [n; 32];
    x[0] = if shard == 0 { 0x10 } else { 0x90 };
    x
}

fn tx(txid: [u8; 32], inputs: Vec<[u8; 32]>, outputs: Vec<([u8; 32], u64)>) -> CompactTx {
    CompactTx {
        txid,
        kind: if inputs.is_empty() {
            TxKind::Mint
        } else {
            TxKind::Transfer
        },
        inputs,
        outputs,
        expires: u64::MAX,
    }
}

fn att(t: &CompactTx, shard: ShardId, height: Height, inputs: &[u16], body: bool) -> Attestation {
    Attestation {
        key: tx_key(t),
        attempt: 7,
        shard,
        height,
        inputs: inputs.iter().copied().collect(),
        tx: body.then(|| t.clone()),
        now: 0,
    }
}

fn step(a: &mut AtomizerState, attestations: Vec<Attestation>) -> Vec<Block> {
    a.apply(AtomCmd::Step {
        attestations,
        seal: true,
        now: 100,
    })
    .1
}

fn cfg() -> AtomizerConfig {
    AtomizerConfig {
        window: 4,
        max_block: 100,
        max_pending: 100,
    }
}

#[test]
fn a_transaction_is_ordered_once_every_shard_has_attested() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2), id(1, 3)], vec![(id(1, 4), 5)]);
    // The txid's shard (0) alone: shard 1's input is not vouched for yet.
    assert!(step(&mut a, vec![att(&t, 0, 0, &[0], true)]).is_empty());
    assert_eq!(a.load(), (1, 0));
    let blocks = step(&mut a, vec![att(&t, 1, 0, &[1], false)]);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].txs[0].tx, t);
    assert_eq!(blocks[0].txs[0].attempt, 7);
    assert_eq!((blocks[0].height, blocks[0].prev), (1, GENESIS));
    assert_eq!(a.tip(), blocks[0].hash());
    assert_eq!(verify_chain((0, GENESIS), &blocks).unwrap().txs, 1);
    // A step with nothing open seals nothing.
    assert!(step(&mut a, vec![]).is_empty());
}

#[test]
fn double_spends_replays_and_stale_attestations_are_rejected() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let i = id(0, 2);
    let t1 = tx(id(0, 1), vec![i], vec![(id(0, 4), 5)]);
    let t2 = tx(id(0, 5), vec![i], vec![(id(0, 6), 5)]);
    // Both attested at height 0 in the same step: the second spends what the first did.
    let b = step(
        &mut a,
        vec![att(&t1, 0, 0, &[0], true), att(&t2, 0, 0, &[0], true)],
    );
    assert_eq!(b[0].txs.len(), 1);
    assert_eq!(b[0].rejected[0].reason, Reject::Spent);
    assert_eq!(b[0].rejected[0].txid, t2.txid);
    // Attested at height 0 again, after block 1 spent it: still a double spend.
    let t3 = tx(id(0, 7), vec![i], vec![]);
    let b = step(&mut a, vec![att(&t3, 0, 0, &[0], true)]);
    assert_eq!(b[0].rejected[0].reason, Reject::Spent);
    // The same transaction as block 1's, attested before block 1: a replay.
    let b = step(&mut a, vec![att(&t1, 0, 0, &[0], true)]);
    assert_eq!(b[0].rejected[0].reason, Reject::Replay);
    // Past the window: stale.
    for n in 0..4 {
        let h = a.height();
        step(
            &mut a,
            vec![att(&tx(id(0, 20 + n), vec![], vec![]), 0, h, &[], true)],
        );
    }
    let t4 = tx(id(0, 30), vec![id(0, 31)], vec![]);
    let b = step(&mut a, vec![att(&t4, 0, 1, &[0], true)]);
    assert_eq!(b[0].rejected[0].reason, Reject::Stale);
    // From beyond the atomizer's height, or naming an input the transaction lacks: dropped.
    let h = a.height();
    assert!(step(&mut a, vec![att(&t4, 0, h + 1, &[0], true)]).is_empty());
    assert!(step(&mut a, vec![att(&t4, 0, h, &[3], true)]).is_empty());
    assert_eq!(a.load(), (0, 0));
}

#[test]
fn incomplete_transactions_go_stale_after_the_window_and_expired_ones_are_refused() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2), id(1, 3)], vec![]);
    assert!(step(&mut a, vec![att(&t, 0, 0, &[0], true)]).is_empty());
    let mut rejected = vec![];
    for n in 0..6 {
        let m = tx(id(0, 40 + n), vec![], vec![(id(0, 50 + n), 1)]);
        let h = a.height();
        for b in step(&mut a, vec![att(&m, 0, h, &[], true)]) {
            rejected.extend(b.rejected);
        }
    }
    assert_eq!(rejected.len(), 1);
    assert_eq!(
        (rejected[0].txid, rejected[0].reason),
        (t.txid, Reject::Stale)
    );
    assert_eq!(rejected[0].attempts.as_slice(), &[7]);
    let mut old = tx(id(0, 60), vec![], vec![]);
    old.expires = 99;
    let h = a.height();
    let b = step(&mut a, vec![att(&old, 0, h, &[], true)]);
    assert_eq!(b[0].rejected[0].reason, Reject::Expired);
}

#[test]
fn replicas_from_a_snapshot_seal_the_same_blocks() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2), id(1, 3)], vec![]);
    step(&mut a, vec![att(&t, 0, 0, &[0], true)]);
    let mut b = AtomizerState::from_snapshot(&a.snapshot()).unwrap();
    let next = vec![att(&t, 1, 0, &[1], false)];
    assert_eq!(step(&mut a, next.clone()), step(&mut b, next));
    assert!(AtomizerState::from_snapshot(&[1, 2, 3]).is_err());
}

#[test]
fn a_snapshot_with_an_open_block_keeps_its_spends() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(1).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2)], vec![]);
    let (_, sealed) = a.apply(AtomCmd::Step {
        attestations: vec![att(&t, 0, 0, &[0], true)],
        seal: false,
        now: 100,
    });
    assert!(
        sealed.is_empty() && a.load() == (0, 1),
        "t is in the open block"
    );
    let mut b = AtomizerState::from_snapshot(&a.snapshot()).unwrap();
    // Spending t's input again, attested before t: rejected by both, in the same block.
    let again = tx(id(0, 3), vec![id(0, 2)], vec![]);
    let next = vec![att(&again, 0, 0, &[0], true)];
    let (x, y) = (step(&mut a, next.clone()), step(&mut b, next));
    assert_eq!(x, y);
    assert_eq!(x[0].txs.len(), 1);
    assert_eq!(x[0].rejected[0].reason, Reject::Spent);
    // And t's txid stays ordered once its block leaves the open state.
    let replay = vec![att(&t, 0, 0, &[0], true)];
    assert_eq!(step(&mut a, replay.clone()), step(&mut b, replay));
}

/// A leader's settings for the admission tests: steps that should commit within 50 ms, a hard
/// bound of 100 attestations, at least `min_admit` admitted.
fn admission_cfg(min_admit: usize) -> LeaderConfig {
    LeaderConfig {
        block_every: 10,
        resend_after: 100,
        max_step: 1_000,
        max_buffer: 100,
        max_send: 2,
        step_target: 50,
        min_admit,
    }
}

#[test]
fn the_leader_admits_less_when_steps_are_slow_and_more_when_it_had_to_refuse() {
    let cfg = admission_cfg(2);
    let mut l = AtomizerLeader::new(cfg, 0, 1);
    let t = tx(id(0, 1), vec![], vec![]);
    let a = |n: usize| vec![att(&t, 0, 0, &[], true); n];
    assert_eq!(l.room(), 8, "four times the least at first");
    // An admitted batch is taken whole, past the limit: nothing more is admitted.
    l.handle(LeaderInput::Attest(a(10)));
    assert_eq!((l.buffered(), l.room()), ((10, 0), 0));
    let steps = |out: Vec<LeaderOutput>| {
        out.iter()
            .filter(|o| matches!(o, LeaderOutput::Replicate(_)))
            .count()
    };
    assert_eq!(steps(l.handle(LeaderInput::Tick { ms: 10, wall: 9 })), 1);
    // Committed in 20 ms, after reaching the limit: a quarter more admitted.
    l.handle(LeaderInput::Replicated { height: 1, ms: 30 });
    assert_eq!((l.room(), l.admission()), (11, (11, 20)));
    l.handle(LeaderInput::Attest(a(4)));
    assert_eq!(steps(l.handle(LeaderInput::Tick { ms: 40, wall: 9 })), 1);
    // Fast, but under the limit: admission stays (the average: (3 × 20 + 5) / 4).
    l.handle(LeaderInput::Replicated { height: 2, ms: 45 });
    assert_eq!(l.admission(), (11, 16));
    // Slow steps bring the average over 50 ms: a quarter less each, down to the least.
    let mut at = 60;
    let mut seen = vec![];
    for h in 3..20 {
        l.handle(LeaderInput::Attest(a(1)));
        assert_eq!(steps(l.handle(LeaderInput::Tick { ms: at, wall: 9 })), 1);
        at += 140;
        l.handle(LeaderInput::Replicated { height: h, ms: at });
        seen.push(l.admission());
    }
    assert_eq!(&seen[..4], &[(11, 47), (9, 70), (7, 87), (6, 100)]);
    assert_eq!(l.admission().0, 2);
    // A leader that lost its place admits nothing.
    l.handle(LeaderInput::Failed);
    assert_eq!(l.room(), 0);
}

#[test]
fn the_admission_limit_stays_within_half_the_hard_bound_and_above_zero() {
    let cfg = admission_cfg(0);
    let mut l = AtomizerLeader::new(cfg, 0, 1);
    let t = tx(id(0, 1), vec![], vec![]);
    // A least of 0 is taken as 1: the first limit is 4 × 1, not 0.
    assert_eq!(l.room(), 4);
    // Fast steps after reaching the limit raise it, but never past half of `max_buffer`.
    let mut at = 0;
    for h in 1..40 {
        let room = l.room();
        l.handle(LeaderInput::Attest(vec![
            att(&t, 0, 0, &[], true);
            room.max(1)
        ]));
        l.handle(LeaderInput::Tick { ms: at, wall: 9 });
        at += 10;
        l.handle(LeaderInput::Replicated { height: h, ms: at });
    }
    assert_eq!(l.admission().0, 50);
    // So a batch admitted at the limit's last unit fits whole: nothing dropped.
    l.handle(LeaderInput::Attest(vec![att(&t, 0, 0, &[], true); 49]));
    assert_eq!(l.room(), 1);
    l.handle(LeaderInput::Attest(vec![att(&t, 0, 0, &[], true); 50]));
    assert_eq!((l.buffered(), l.room()), ((99, 0), 0));
    // Slow steps bring it down to the least, 1, never 0.
    for h in 40..80 {
        l.handle(LeaderInput::Tick { ms: at, wall: 9 });
        at += 500;
        l.handle(LeaderInput::Replicated { height: h, ms: at });
    }
    assert_eq!(l.admission().0, 1);
    assert_eq!(l.room(), 1);
}

#[test]
fn a_shard_group_keeping_its_part_of_each_block_ends_where_whole_blocks_lead() {
    use super::replicated::{shard_parts_command, BlockShardMachine};
    use super::shard::ShardBlock;
    use crate::raft::Machine;
    let map = ShardMap::even(2).unwrap();
    let mut a = AtomizerState::new(cfg(), map.clone());
    // Mints on both shards, then a transfer between them and one within shard 1.
    let m0 = tx(id(0, 1), vec![], vec![(id(0, 2), 5)]);
    let m1 = tx(id(1, 3), vec![], vec![(id(1, 4), 7)]);
    let mut blocks = step(
        &mut a,
        vec![att(&m0, 0, 0, &[], true), att(&m1, 1, 0, &[], true)],
    );
    let cross = tx(id(1, 5), vec![id(0, 2)], vec![(id(1, 6), 5)]);
    let within = tx(id(1, 7), vec![id(1, 4)], vec![(id(1, 8), 7)]);
    let h = a.height();
    blocks.extend(step(
        &mut a,
        vec![
            att(&cross, 1, h, &[], true),
            att(&cross, 0, h, &[0], false),
            att(&within, 1, h, &[0], true),
        ],
    ));
    // Then a double spend of `cross`'s input (rejected; its txid on shard 0) and a redeem of
    // `within`'s output (its txid on shard 0, its input on shard 1).
    let again = tx(id(0, 9), vec![id(0, 2)], vec![(id(0, 10), 5)]);
    let mut redeem = tx(id(0, 11), vec![id(1, 8)], vec![]);
    redeem.kind = TxKind::Redeem;
    // (attested at the height before `cross`'s block, when the input was unspent)
    let before = h;
    let h = a.height();
    blocks.extend(step(
        &mut a,
        vec![
            att(&again, 0, before, &[0], true),
            att(&redeem, 1, h, &[0], false),
            att(&redeem, 0, h, &[], true),
        ],
    ));
    assert_eq!(blocks.iter().map(|b| b.txs.len()).sum::<usize>(), 5);
    assert_eq!(blocks.iter().map(|b| b.rejected.len()).sum::<usize>(), 1);
    for shard in [0, 1] {
        let mut whole = BlockShard::new(map.clone(), shard);
        let mut parts = BlockShardMachine::new(map.clone(), shard);
        let mut old = BlockShardMachine::new(map.clone(), shard);
        for b in &blocks {
            assert_eq!(whole.apply(b), BlockReply::Applied(b.height));
        }
        let p: Vec<ShardBlock> = blocks
            .iter()
            .map(|b| ShardBlock::of(b, &map, shard))
            .collect();
        parts.apply(&shard_parts_command(&p));
        // A run of whole blocks: the command of the earlier releases.
        old.apply(&crate::shard::encode(&blocks));
        // The same state (compared by what it answers: maps iterate in their own orders).
        let ids: Vec<[u8; 32]> = blocks
            .iter()
            .flat_map(|b| &b.txs)
            .flat_map(|t| {
                let mut v = t.tx.inputs.clone();
                v.extend(t.tx.outputs.iter().map(|(o, _)| *o));
                v.push(t.tx.txid);
                v
            })
            .collect();
        let seen = |m: &BlockShard| {
            (
                m.height(),
                m.tip(),
                m.books(),
                ids.iter()
                    .map(|i| (m.is_unspent(i), m.status(i, 0)))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(seen(&parts.state), seen(&whole), "shard {shard}");
        assert_eq!(seen(&old.state), seen(&whole), "shard {shard}");
        assert_eq!(parts.state.tip(), a.tip());
        // Each keeps what touches it: shard 0 leaves out shard 1's mint and the transfer
        // within shard 1, shard 1 shard 0's mint; both keep the redeem; the rejection is
        // shard 0's (its txid's).
        let kept: usize = p.iter().map(|x| x.block.txs.len()).sum();
        assert_eq!(kept, if shard == 0 { 3 } else { 4 });
        let rejected: usize = p.iter().map(|x| x.block.rejected.len()).sum();
        assert_eq!(rejected, if shard == 0 { 1 } else { 0 });
        // The redeem shows in shard 1's books, the rejection in shard 0's answers.
        if shard == 1 {
            assert_eq!(parts.state.books().redeemed_cents, 7);
        } else {
            assert!(matches!(
                parts.state.status(&again.txid, 0),
                TxStatus::Rejected(_)
            ));
        }
    }
}

#[test]
fn verify_chain_finds_broken_links_and_double_spends() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let mut blocks = vec![];
    for n in 0..3 {
        let t = tx(id(0, n), vec![id(0, 100 + n)], vec![]);
        let h = a.height();
        blocks.extend(step(&mut a, vec![att(&t, 0, h, &[0], true)]));
    }
    assert_eq!(verify_chain((0, GENESIS), &blocks).unwrap().height, 3);
    assert!(verify_chain((1, blocks[0].hash()), &blocks[1..]).is_ok());
    let mut bad = blocks.clone();
    bad[1].now += 1;
    assert_eq!(
        verify_chain((0, GENESIS), &bad),
        Err(ChainError::Link { height: 3 })
    );
    let mut dup = blocks.clone();
    dup[2].txs[0].tx.inputs = dup[0].txs[0].tx.inputs.clone();
    assert_eq!(
        verify_chain((0, GENESIS), &dup),
        Err(ChainError::DoubleSpend {
            height: 3,
            first: 1
        })
    );
    assert!(matches!(
        verify_chain((0, GENESIS), &blocks[1..]),
        Err(ChainError::Height { .. })
    ));
}

#[test]
fn a_shard_applies_blocks_in_order_and_answers_as_watchtower() {
    let map = ShardMap::even(2).unwrap();
    let mut s = BlockShard::new(map.clone(), 0);
    s.seed(&[(id(0, 2), 10), (id(1, 3), 10)]);
    assert_eq!(s.books().unspent_cents, 10, "only its own range");
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2), id(1, 3)], vec![(id(0, 4), 20)]);
    let v = s.attest(&t, tx_key(&t), &[7], 0, 0);
    let Verdict::Attested(mine) = v else {
        panic!("{v:?}")
    };
    assert_eq!(
        (mine.inputs.as_slice(), mine.tx.is_some()),
        (&[0u16][..], true)
    );
    let b1 = step(&mut a, vec![mine, att(&t, 1, 0, &[1], false)]);
    let m = tx(id(0, 9), vec![], vec![(id(0, 10), 1)]);
    let b2 = step(&mut a, vec![att(&m, 0, 1, &[], true)]);
    assert_eq!(s.apply(&b2[0]), BlockReply::Behind(0));
    assert_eq!(s.attest(&t, tx_key(&t), &[7], 1, 0), Verdict::Behind(0));
    assert_eq!(s.apply(&b1[0]), BlockReply::Applied(1));
    assert_eq!(s.apply(&b1[0]), BlockReply::Applied(1), "idempotent");
    assert!(!s.is_unspent(&id(0, 2)) && s.is_unspent(&id(0, 4)));
    assert_eq!(s.status(&t.txid, 1), TxStatus::Confirmed(1, 7));
    assert_eq!(
        s.attest(&t, tx_key(&t), &[8], 0, 0),
        Verdict::Confirmed(1, 7)
    );
    let t2 = tx(id(0, 11), vec![id(0, 2)], vec![]);
    assert_eq!(s.attest(&t2, tx_key(&t2), &[1], 0, 0), Verdict::Missing(1));
    assert_eq!(s.status(&t2.txid, 5), TxStatus::Behind(1));
    assert_eq!(s.status(&t2.txid, 1), TxStatus::Unknown(1));
    // A block at the next height from another history changes nothing.
    let mut fork = b2[0].clone();
    fork.prev = [9; 32];
    assert!(matches!(s.apply(&fork), BlockReply::Fork { height: 1, .. }));
    assert_eq!(s.apply(&b2[0]), BlockReply::Applied(2));
    // Its own books only: shard 1's input paid for part of the output here (the ledger's
    // books are the sum over shards).
    let b = s.books();
    assert_eq!(
        (b.minted_cents, b.unspent_cents, b.unspent_count),
        (11, 21, 2)
    );
    // The snapshot holds everything; damaged ones are refused.
    let snap = s.snapshot();
    let r = BlockShard::from_snapshot(map.clone(), 0, &snap).unwrap();
    assert_eq!(
        (r.height(), r.tip(), r.books()),
        (s.height(), s.tip(), s.books())
    );
    assert_eq!(r.status(&t.txid, 2), TxStatus::Confirmed(1, 7));
    assert!(BlockShard::from_snapshot(map.clone(), 0, &snap[..snap.len() / 2]).is_err());
    assert!(BlockShard::from_snapshot(map, 0, b"FLSHRD02").is_err());
}

#[test]
fn a_shard_refuses_expired_transactions_and_records_rejections() {
    let map = ShardMap::even(2).unwrap();
    let mut s = BlockShard::new(map, 0);
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let mut t = tx(id(0, 1), vec![], vec![]);
    t.expires = 50;
    let b = step(&mut a, vec![att(&t, 0, 0, &[], true)]);
    s.apply(&b[0]);
    assert_eq!(s.attest(&t, tx_key(&t), &[1], 0, 0), Verdict::Expired(1));
    assert_eq!(
        s.status(&t.txid, 0),
        TxStatus::Rejected(smallvec![(7, Reject::Expired)])
    );
}

#[test]
fn the_leader_replicates_one_step_at_a_time_and_brings_shards_up_to_date() {
    let cfg = LeaderConfig {
        block_every: 10,
        resend_after: 100,
        max_step: 2,
        max_buffer: 3,
        max_send: 2,
        step_target: 1_000,
        min_admit: 3,
    };
    let mut l = AtomizerLeader::new(cfg, 5, 2);
    let t = tx(id(0, 1), vec![], vec![]);
    l.handle(LeaderInput::Attest(vec![att(&t, 0, 0, &[], true); 4]));
    assert_eq!(l.buffered(), (3, 1), "one dropped for want of room");
    let out = l.handle(LeaderInput::Tick { ms: 20, wall: 9 });
    let replicate: Vec<_> = out
        .iter()
        .filter_map(|o| match o {
            LeaderOutput::Replicate(AtomCmd::Step {
                attestations,
                seal,
                now,
            }) => Some((attestations.len(), *seal, *now)),
            _ => None,
        })
        .collect();
    assert_eq!(replicate, vec![(2, true, 9)]);
    // Shards of unknown height are sent the tip.
    assert!(out.contains(&LeaderOutput::SendBlocks {
        shard: 1,
        from: 5,
        to: 5
    }));
    // Nothing more is replicated until the step is.
    let out = l.handle(LeaderInput::Tick { ms: 40, wall: 9 });
    assert!(!out.iter().any(|o| matches!(o, LeaderOutput::Replicate(_))));
    let out = l.handle(LeaderInput::Replicated { height: 6, ms: 0 });
    assert!(
        out.is_empty(),
        "both shards have a delivery in flight: the new block waits for their answers: {out:?}"
    );
    // A shard far behind is sent what it lacks, `max_send` at a time.
    let out = l.handle(LeaderInput::ShardAt {
        shard: 0,
        height: 1,
    });
    assert_eq!(
        out,
        vec![LeaderOutput::SendBlocks {
            shard: 0,
            from: 2,
            to: 3
        }]
    );
    assert!(l
        .handle(LeaderInput::ShardAt {
            shard: 1,
            height: 6
        })
        .is_empty());
    assert_eq!(l.slowest_shard(), Some(1));
    // A shard that answered is sent the next block at once; one still answering is not.
    let out = l.handle(LeaderInput::Replicated { height: 7, ms: 0 });
    assert_eq!(
        out,
        vec![LeaderOutput::SendBlocks {
            shard: 1,
            from: 7,
            to: 7
        }]
    );
    // Unanswered sends are repeated.
    let out = l.handle(LeaderInput::Tick { ms: 200, wall: 9 });
    assert!(out.contains(&LeaderOutput::SendBlocks {
        shard: 0,
        from: 2,
        to: 3
    }));
    l.handle(LeaderInput::Failed);
    assert!(l.handle(LeaderInput::Tick { ms: 900, wall: 9 }).is_empty());
}

fn submitter() -> Submitter {
    Submitter::new(
        ShardMap::even(2).unwrap(),
        SubmitConfig {
            resend_after: 100,
            poll_every: 10,
            waiting_poll: 10,
            wait_limit: 50,
            max_tries: 2,
            max_attesting: 1_000,
            min_attesting: 1,
            deadline: 100_000,
        },
        Box::new(rand::rngs::StdRng::seed_from_u64(1)),
    )
}

#[test]
fn a_busy_atomizer_narrows_the_submitters_window_and_queued_tries_wait_their_turn() {
    let mut s = Submitter::new(
        ShardMap::even(1).unwrap(),
        SubmitConfig {
            resend_after: 100,
            poll_every: 10,
            waiting_poll: 10,
            wait_limit: 50,
            max_tries: 2,
            max_attesting: 2,
            min_attesting: 1,
            deadline: 1_000,
        },
        Box::new(rand::rngs::StdRng::seed_from_u64(1)),
    );
    let txs: Vec<CompactTx> = (1..=4)
        .map(|n| tx(id(0, n), vec![id(0, 10 + n)], vec![]))
        .collect();
    let jobs = |out: &[SubmitOutput]| -> Vec<(u64, u64)> {
        out.iter()
            .filter_map(|o| match o {
                SubmitOutput::Attest { job, attempt, .. } => Some((*job, *attempt)),
                _ => None,
            })
            .collect()
    };
    let out = s.handle(SubmitInput::Submit {
        ticket: 1,
        txs: txs.clone(),
        height: 0,
        now: 0,
    });
    let asked = jobs(&out);
    assert_eq!(
        asked.iter().map(|a| a.0).collect::<Vec<_>>(),
        vec![1, 2],
        "two at once"
    );
    assert_eq!(s.attesting(), (2, 2));
    // Job 1 is refused as busy: the window narrows (by a quarter, at least one) to one, job 1
    // stays in it.
    let out = s.handle(SubmitInput::Verdict {
        job: 1,
        attempt: asked[0].1,
        shard: 0,
        verdict: Verdict::Busy,
    });
    assert!(jobs(&out).is_empty());
    assert_eq!(s.attesting(), (2, 1));
    // Job 2 attested: out of the window, which widens by one: job 3 comes in.
    let out = s.handle(SubmitInput::Verdict {
        job: 2,
        attempt: asked[1].1,
        shard: 0,
        verdict: Verdict::Attested(att(&txs[1], 0, 0, &[0], true)),
    });
    assert_eq!(jobs(&out).iter().map(|a| a.0).collect::<Vec<_>>(), vec![3]);
    assert_eq!(s.attesting(), (2, 2));
    // Job 4 waits unasked; job 1 is asked again after `resend_after`.
    assert!(jobs(&s.handle(SubmitInput::Tick(50))).is_empty());
    let out = s.handle(SubmitInput::Tick(100));
    let again = jobs(&out);
    assert!(
        again.contains(&asked[0]),
        "the refused try is asked again, unchanged"
    );
    assert!(
        !again.iter().any(|a| a.0 == 4),
        "job 4 still waits: {again:?}"
    );
    // Job 4 waited unasked; past the deadline every one fails, the queued one too.
    let out = s.handle(SubmitInput::Tick(1_000));
    assert!(out
        .iter()
        .any(|o| matches!(o, SubmitOutput::Fail { ticket: 1, .. })));
    assert_eq!((s.in_flight(), s.attesting().0), (0, 0));
}

#[test]
fn queued_and_attesting_tries_take_a_confirmation_from_the_feed_without_being_asked() {
    let mut s = Submitter::new(
        ShardMap::even(1).unwrap(),
        SubmitConfig {
            max_attesting: 1,
            ..SubmitConfig::default()
        },
        Box::new(rand::rngs::StdRng::seed_from_u64(1)),
    );
    let a = tx(id(0, 1), vec![id(0, 11)], vec![]);
    let b = tx(id(0, 2), vec![id(0, 12)], vec![]);
    let out = s.handle(SubmitInput::Submit {
        ticket: 1,
        txs: vec![a.clone()],
        height: 0,
        now: 0,
    });
    assert_eq!(attests(&out).len(), 1);
    let a_try = attests(&out)[0].1;
    let out = s.handle(SubmitInput::Submit {
        ticket: 2,
        txs: vec![b.clone()],
        height: 0,
        now: 0,
    });
    assert!(attests(&out).is_empty(), "the window is full: b is queued");
    assert_eq!((s.in_flight(), s.attesting()), (2, (1, 1)));
    // Another sentinel's submission of b was ordered: b's job ends as already applied, and
    // never asks the shards.
    let out = s.handle(SubmitInput::Decided(vec![(
        b.txid,
        TxStatus::Confirmed(4, 99),
    )]));
    assert!(attests(&out).is_empty());
    assert!(out.iter().any(|o| matches!(
        o,
        SubmitOutput::Answer { ticket: 2, outcomes } if outcomes == &[SwapOutcome::AlreadyApplied]
    )));
    assert_eq!((s.in_flight(), s.attesting()), (1, (1, 1)));
    // A status answer other than a confirmation leaves a queued job queued.
    let c = tx(id(0, 3), vec![id(0, 13)], vec![]);
    s.handle(SubmitInput::Submit {
        ticket: 3,
        txs: vec![c.clone()],
        height: 0,
        now: 0,
    });
    let out = s.handle(SubmitInput::Decided(vec![(
        c.txid,
        TxStatus::Rejected(smallvec![(5, Reject::Spent)]),
    )]));
    assert!(out.is_empty());
    assert_eq!(s.in_flight(), 2);
    // a, still being attested (its shard said `Busy`, but the atomizer had taken it), is
    // confirmed by the feed: answered at once, and c takes its place in the window.
    s.handle(SubmitInput::Verdict {
        job: 1,
        attempt: a_try,
        shard: 0,
        verdict: Verdict::Busy,
    });
    let out = s.handle(SubmitInput::Decided(vec![(
        a.txid,
        TxStatus::Confirmed(5, a_try),
    )]));
    assert!(out.iter().any(|o| matches!(
        o,
        SubmitOutput::Answer { ticket: 1, outcomes } if outcomes == &[SwapOutcome::Confirmed]
    )));
    assert_eq!(attests(&out).len(), 1, "c is asked now");
    assert_eq!((s.in_flight(), s.attesting().0), (1, 1));
}

fn attests(out: &[SubmitOutput]) -> Vec<(ShardId, u64, Height)> {
    out.iter()
        .filter_map(|o| match o {
            SubmitOutput::Attest {
                shard,
                attempt,
                min_height,
                ..
            } => Some((*shard, *attempt, *min_height)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_submitter_follows_a_transaction_to_its_block() {
    let mut s = submitter();
    let t = tx(id(1, 1), vec![id(0, 2)], vec![]);
    let out = s.handle(SubmitInput::Submit {
        ticket: 1,
        txs: vec![t.clone()],
        height: 4,
        now: 0,
    });
    let asked = attests(&out);
    assert_eq!(asked.len(), 2);
    assert_eq!(
        (asked[0].0, asked[1].0, asked[0].2),
        (1, 0, 4),
        "txid's shard first"
    );
    let attempt = asked[0].1;
    for shard in [0, 1] {
        let v = Verdict::Attested(att(&t, shard, 4, &[], shard == 1));
        let out = s.handle(SubmitInput::Verdict {
            job: 1,
            attempt,
            shard,
            verdict: v,
        });
        if shard == 1 {
            assert!(matches!(
                out[..],
                [SubmitOutput::AskStatus { shard: 1, .. }]
            ));
        }
    }
    assert!(s
        .handle(SubmitInput::Status {
            job: 1,
            status: TxStatus::Unknown(4),
            asked: 4,
        })
        .is_empty());
    let out = s.handle(SubmitInput::Status {
        job: 1,
        status: TxStatus::Confirmed(5, attempt),
        asked: 4,
    });
    assert_eq!(
        out,
        vec![SubmitOutput::Answer {
            ticket: 1,
            outcomes: vec![SwapOutcome::Confirmed]
        }]
    );
    assert_eq!((s.in_flight(), s.open_tickets()), (0, 0));
}

#[test]
fn the_submitter_learns_outcomes_from_the_decision_feed() {
    let mut s = submitter();
    let t = tx(id(1, 1), vec![id(0, 2)], vec![]);
    let u = tx(id(1, 3), vec![id(0, 4)], vec![]);
    let out = s.handle(SubmitInput::Submit {
        ticket: 1,
        txs: vec![t.clone(), u.clone()],
        height: 4,
        now: 0,
    });
    let tries: Vec<u64> = attests(&out).iter().map(|a| a.1).collect();
    for (job, tx, attempt) in [(1, &t, tries[0]), (2, &u, tries[2])] {
        for shard in [0, 1] {
            s.handle(SubmitInput::Verdict {
                job,
                attempt,
                shard,
                verdict: Verdict::Attested(att(tx, shard, 4, &[], shard == 1)),
            });
        }
    }
    // Waiting: the feed says one was ordered under its try and the other's try was spent;
    // unrelated txids and foreign tries change nothing.
    let out = s.handle(SubmitInput::Decided(vec![
        (id(1, 9), TxStatus::Confirmed(5, 1)),
        (u.txid, TxStatus::Rejected(smallvec![(777, Reject::Stale)])),
    ]));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(s.in_flight(), 2);
    let out = s.handle(SubmitInput::Decided(vec![
        (t.txid, TxStatus::Confirmed(5, tries[0])),
        (
            u.txid,
            TxStatus::Rejected(smallvec![(tries[2], Reject::Spent)]),
        ),
    ]));
    assert_eq!(
        out,
        vec![SubmitOutput::Answer {
            ticket: 1,
            outcomes: vec![SwapOutcome::Confirmed, SwapOutcome::MissingInput]
        }]
    );
    assert_eq!((s.in_flight(), s.open_tickets()), (0, 0));
}

#[test]
fn a_shards_decision_feed_gives_whole_blocks_after_a_height() {
    let map = ShardMap::even(1).unwrap();
    let mut sh = BlockShard::new(map, 0);
    let mut prev = GENESIS;
    let mut txids = Vec::new();
    for h in 1..=3u8 {
        let t = tx(id(0, 100 + h), vec![], vec![(id(0, 200 + h), 5)]);
        txids.push(t.txid);
        let b = Block {
            height: h as u64,
            prev,
            now: 1,
            txs: vec![BlockTx { tx: t, attempt: 7 }],
            rejected: vec![],
        };
        prev = b.hash();
        assert_eq!(sh.apply(&b), BlockReply::Applied(h as u64));
    }
    let (reached, from, d) = sh.decided_since(1);
    assert_eq!((reached, from), (3, 0));
    assert_eq!(
        d,
        vec![
            (txids[1], TxStatus::Confirmed(2, 7)),
            (txids[2], TxStatus::Confirmed(3, 7))
        ]
    );
    assert!(sh.decided_since(3).2.is_empty());
    // A replica restored from a snapshot starts its feed afresh: a reader below it has a gap.
    let restored =
        BlockShard::from_snapshot(ShardMap::even(1).unwrap(), 0, &sh.snapshot()).unwrap();
    assert_eq!(restored.decided_since(1), (3, 3, vec![]));
}

#[test]
fn the_submitter_tells_missing_inputs_from_its_own_earlier_tries_and_gives_up_in_doubt() {
    let mut s = submitter();
    let t = tx(id(1, 1), vec![id(0, 2)], vec![]);
    let out = s.handle(SubmitInput::Submit {
        ticket: 1,
        txs: vec![t.clone(), t.clone()],
        height: 0,
        now: 0,
    });
    let a1 = attests(&out)[0].1;
    let a2 = attests(&out)[2].1;
    // Job 1: the input shard finds the input spent at height 3; the txid's shard, read at 3
    // or later, knows nothing: missing.
    s.handle(SubmitInput::Verdict {
        job: 1,
        attempt: a1,
        shard: 0,
        verdict: Verdict::Missing(3),
    });
    let out = s.handle(SubmitInput::Verdict {
        job: 1,
        attempt: a1,
        shard: 1,
        verdict: Verdict::Attested(att(&t, 1, 2, &[], true)),
    });
    assert!(matches!(
        out[..],
        [SubmitOutput::AskStatus { min_height: 3, .. }]
    ));
    // An answer to a lower question (asked before the input was found spent, still on its
    // way) does not say the txid is absent at 3: the job waits for the answer at 3.
    s.handle(SubmitInput::Status {
        job: 1,
        status: TxStatus::Unknown(2),
        asked: 0,
    });
    assert_eq!(s.in_flight(), 2, "{:?}", s.describe());
    s.handle(SubmitInput::Status {
        job: 1,
        status: TxStatus::Unknown(3),
        asked: 3,
    });
    // Job 2: attested everywhere, then nothing for the wait limit: a second try; then the
    // txid's shard says another sentinel's try was ordered: a replay.
    for shard in [0, 1] {
        s.handle(SubmitInput::Verdict {
            job: 2,
            attempt: a2,
            shard,
            verdict: Verdict::Attested(att(&t, shard, 0, &[], shard == 1)),
        });
    }
    let out = s.handle(SubmitInput::Tick(60));
    let again = attests(&out);
    assert_eq!(again.len(), 2);
    assert_ne!(again[0].1, a2, "a new try");
    let out = s.handle(SubmitInput::Verdict {
        job: 2,
        attempt: again[0].1,
        shard: 1,
        verdict: Verdict::Confirmed(2, 999),
    });
    assert_eq!(
        out,
        vec![SubmitOutput::Answer {
            ticket: 1,
            outcomes: vec![SwapOutcome::MissingInput, SwapOutcome::AlreadyApplied]
        }]
    );
    // Out of tries (two here): the submission fails as in doubt.
    let out = s.handle(SubmitInput::Submit {
        ticket: 2,
        txs: vec![t.clone()],
        height: 0,
        now: 0,
    });
    let mut attempt = attests(&out)[0].1;
    let mut failed = false;
    for now in [200, 400] {
        for shard in [0, 1] {
            s.handle(SubmitInput::Verdict {
                job: 3,
                attempt,
                shard,
                verdict: Verdict::Attested(att(&t, shard, 0, &[], shard == 1)),
            });
        }
        let out = s.handle(SubmitInput::Tick(now));
        failed |= out
            .iter()
            .any(|o| matches!(o, SubmitOutput::Fail { ticket: 2, .. }));
        if let Some(a) = attests(&out).first() {
            attempt = a.1;
        }
    }
    assert!(failed, "{:?}", s.describe());
    assert_eq!((s.in_flight(), s.open_tickets()), (0, 0));
}

#[test]
fn only_the_owning_shards_attestations_count() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let t = tx(id(0, 1), vec![id(0, 2), id(1, 3)], vec![]);
    // A body from a shard that does not own the txid is dropped.
    assert!(step(&mut a, vec![att(&t, 1, 0, &[1], true)]).is_empty());
    assert_eq!(a.load(), (0, 0), "the whole attestation is dropped");
    // Shard 0 vouching for shard 1's input as well: never ordered.
    let b = step(&mut a, vec![att(&t, 0, 0, &[0], true)]);
    assert!(
        b.is_empty(),
        "input 1 is only vouched for by shard 1 so far"
    );
    let t2 = tx(id(0, 5), vec![id(0, 6), id(1, 7)], vec![]);
    let b = step(&mut a, vec![att(&t2, 0, 0, &[0, 1], true)]);
    assert_eq!(b[0].rejected[0].txid, t2.txid);
    assert_eq!(b[0].rejected[0].reason, Reject::Stale);
    assert!(b[0].txs.is_empty());
}

#[test]
fn a_chain_checked_in_pieces_is_checked_as_a_whole() {
    let mut a = AtomizerState::new(cfg(), ShardMap::even(2).unwrap());
    let mut blocks = vec![];
    for n in 0..4 {
        let h = a.height();
        let t = tx(id(0, n), vec![id(0, 100 + n)], vec![]);
        blocks.extend(step(&mut a, vec![att(&t, 0, h, &[0], true)]));
    }
    // Block 4 spends block 1's input again: found even when read in two pieces.
    blocks[3].txs[0].tx.inputs = blocks[0].txs[0].tx.inputs.clone();
    let mut v = ChainVerifier::new((0, GENESIS));
    for b in &blocks[..2] {
        v.push(b).unwrap();
    }
    assert!(v.push(&blocks[2]).is_ok());
    assert_eq!(
        v.push(&blocks[3]),
        Err(ChainError::DoubleSpend {
            height: 4,
            first: 1
        })
    );
}

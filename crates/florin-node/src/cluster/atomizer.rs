//! The atomizer architecture as processes ([`florin_cluster::atomizer`]; docs/atomizer.md): an
//! atomizer replica ([`AtomizerService`]: the Raft replica of the atomizer's machine with its
//! block log, and, while it leads, the leader's loop), a shard replica
//! ([`BlockShardService`]), and the sentinel's store over them ([`AtomizerStore`]: a
//! [`SwapStore`] driving the submitter machine).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_cluster::atomizer::blocklog::BlockLog;
use florin_cluster::atomizer::leader::{AtomizerLeader, LeaderConfig, LeaderInput, LeaderOutput};
use florin_cluster::atomizer::replicated::{
    shard_parts_command, AtomReply, AtomizerMachine, BlockShardMachine, ShardBlockReply,
};
use florin_cluster::atomizer::shard::{BlockReply, ShardBlock, TxStatus, Verdict};
use florin_cluster::atomizer::submit::{SubmitConfig, SubmitInput, SubmitOutput, Submitter};
use florin_cluster::atomizer::{Attestation, Height};
use florin_cluster::raft::Replica;
use florin_cluster::route::{ShardId, ShardMap};
use florin_cluster::shard::{decode, encode};
use florin_crypto::{Digest, PublicKey};
use florin_ledger::{CompactTx, StoreError, Supply, SwapOutcome, SwapStore, UhsId};
use tokio::sync::mpsc;

use super::client::GroupClient;
use super::rpc::{AttestAsk, Handler, NodeStatus, Request, Response, StatusAsk, MAX_BLOCKS_READ};
use super::service::not_leader;

/// Attestation batches queued for the leader's loop at most.
const ATTEST_QUEUE: usize = 1024;

/// How long a shard answers `Busy` without asking again, once the atomizer's leader said it
/// admits no more (so refused sentinels cost the leader nothing): doubled with each refusal in
/// a row up to [`BUSY_MAX`], and back to this once the leader takes a batch.
const BUSY_FOR: Duration = Duration::from_millis(50);
/// The longest a shard answers `Busy` without asking the atomizer's leader.
const BUSY_MAX: Duration = Duration::from_millis(800);

/// How long a shard waits for the atomizer's leader to take attestations (the sentinel's
/// `resend_after`, 1 s). A forward that timed out may still have been taken: the shard answers
/// `Busy`, the sentinel's next ask forwards the same attestations again (the atomizer counts
/// them once), and the decision feed ends the job as soon as it is ordered. A shorter wait
/// (500 ms) turned a slow leader's takes into more `Busy` answers, each narrowing the
/// sentinels' window, on a machine loaded by the test suite.
const FORWARD_WAIT: Duration = Duration::from_millis(1000);

/// About how many bytes a block takes on the wire (to keep a message of blocks under the RPC
/// limit).
fn block_bytes(b: &florin_cluster::atomizer::Block) -> usize {
    128 + b
        .txs
        .iter()
        .map(|t| 96 + 40 * (t.tx.inputs.len() + t.tx.outputs.len()))
        .sum::<usize>()
        + 64 * b.rejected.len()
}

/// Keeps the first blocks of `v` that fit `limit` bytes (at least one).
fn fit(
    mut v: Vec<florin_cluster::atomizer::Block>,
    limit: usize,
) -> Vec<florin_cluster::atomizer::Block> {
    let mut total = 0;
    let keep = v
        .iter()
        .position(|b| {
            total += block_bytes(b);
            total > limit
        })
        .unwrap_or(v.len())
        .max(1);
    v.truncate(keep);
    v
}

/// One replica of the atomizer group.
pub struct AtomizerService {
    replica: Arc<Replica<AtomizerMachine>>,
    log: Arc<BlockLog>,
    /// Keys of the group's members.
    members: HashSet<PublicKey>,
    /// Keys of shard replicas with their shard (the only ones whose attestations are taken,
    /// each only for its own shard).
    shards: HashMap<PublicKey, ShardId>,
    /// Keys allowed to read the height and the blocks (sentinels and observers).
    readers: HashSet<PublicKey>,
    attest: mpsc::Sender<Vec<Attestation>>,
    /// Attestations the leader admits now (its admission control; 0 while not leading).
    room: Arc<std::sync::atomic::AtomicUsize>,
    /// Attestations admitted and queued for the leader's loop, not yet in its buffer.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    /// Attestations answered `Busy` since this replica started.
    busy: Arc<AtomicU64>,
    load: Arc<std::sync::Mutex<(u64, u64)>>,
}

impl AtomizerService {
    /// Serves `replica` (whose machine writes to `log`) and, while it leads, runs the leader's
    /// loop, sending blocks to `shard_groups`.
    pub fn start(
        replica: Arc<Replica<AtomizerMachine>>,
        log: Arc<BlockLog>,
        members: HashSet<PublicKey>,
        shards: HashMap<PublicKey, ShardId>,
        readers: HashSet<PublicKey>,
        shard_groups: Vec<Arc<GroupClient>>,
        cfg: LeaderConfig,
    ) -> Arc<AtomizerService> {
        // Bounded: while the leader's loop is busy, more batches are refused (their sentinels
        // try again), never queued without end.
        let (tx, rx) = mpsc::channel(ATTEST_QUEUE);
        let load = Arc::new(std::sync::Mutex::new((0, 0)));
        let room = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let busy = Arc::new(AtomicU64::new(0));
        tokio::spawn(leader_loop(
            replica.clone(),
            log.clone(),
            shard_groups,
            cfg,
            rx,
            load.clone(),
            Admission {
                room: room.clone(),
                queued: queued.clone(),
                busy: busy.clone(),
            },
        ));
        Arc::new(AtomizerService {
            replica,
            log,
            members,
            shards,
            readers,
            attest: tx,
            room,
            queued,
            busy,
            load,
        })
    }
}

impl Handler for AtomizerService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        match req {
            Request::Raft(b) if self.members.contains(peer) => {
                Response::Raft(self.replica.handle_rpc(&b).await)
            }
            Request::AtomForward(a) if self.shards.contains_key(peer) => {
                if !self.replica.is_leader() {
                    return Response::NotLeader(None);
                }
                if self.replica.with_machine(|m| m.failed().is_some()) {
                    return Response::Error("this atomizer replica's block log failed".into());
                }
                // A shard member vouches only for its own shard.
                let mine = self.shards.get(peer).copied();
                let a: Vec<Attestation> = a.into_iter().filter(|x| Some(x.shard) == mine).collect();
                // Admission control: a batch is taken while the leader has room (it may
                // overshoot it), reserved here (the loop sets the room again after each event).
                let n = a.len();
                let admitted = self
                    .room
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                        (r > 0).then(|| r.saturating_sub(n))
                    })
                    .is_ok();
                if admitted {
                    self.queued.fetch_add(n, Ordering::AcqRel);
                    if self.attest.try_send(a).is_ok() {
                        return Response::Taken;
                    }
                    self.queued.fetch_sub(n, Ordering::AcqRel);
                }
                self.busy.fetch_add(n as u64, Ordering::Relaxed);
                Response::Busy
            }
            Request::AtomHeight if self.readers.contains(peer) => self
                .replica
                .read(|m| m.state.height())
                .await
                .map_or_else(not_leader, Response::Height),
            Request::AtomReadBlocks(from, to) if self.readers.contains(peer) => {
                let to = to.min(from.saturating_add(MAX_BLOCKS_READ - 1));
                match self.log.read(from.max(1), to) {
                    Ok(b) => Response::Blocks(fit(b, super::rpc::MAX_RPC / 4)),
                    Err(e) => Response::Refused(e.to_string()),
                }
            }
            Request::Status => {
                let (pending, open) = self.replica.with_machine(|m| m.state.load());
                let failed = self
                    .replica
                    .with_machine(|m| m.failed().map(str::to_string));
                Response::Status(NodeStatus {
                    role: "atomizer".into(),
                    group: 0,
                    raft: self.replica.status(),
                    load: self
                        .load
                        .lock()
                        .map(|l| *l)
                        .unwrap_or((pending as u64, open as u64)),
                    alerts: (u64::from(failed.is_some()), failed),
                    remembered: self.replica.with_machine(|m| m.state.height()),
                })
            }
            _ => Response::Error(
                "the atomizer serves Raft, attestations from shards, its height, blocks and Status"
                    .into(),
            ),
        }
    }
}

/// What the leader's loop shares with the request handlers for admission control.
struct Admission {
    /// Attestations the handlers may admit until the loop's next event.
    room: Arc<std::sync::atomic::AtomicUsize>,
    /// Attestations admitted but not yet taken from the queue by the loop.
    queued: Arc<std::sync::atomic::AtomicUsize>,
    /// Attestations answered `Busy`.
    busy: Arc<AtomicU64>,
}

enum LeaderMsg {
    Replicated(u64, Result<Height, String>),
    ShardAt(u64, ShardId, Height),
}

async fn leader_loop(
    replica: Arc<Replica<AtomizerMachine>>,
    log: Arc<BlockLog>,
    shards: Vec<Arc<GroupClient>>,
    cfg: LeaderConfig,
    mut attest: mpsc::Receiver<Vec<Attestation>>,
    load: Arc<std::sync::Mutex<(u64, u64)>>,
    admission: Admission,
) {
    let Admission { room, queued, busy } = admission;
    let start = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<LeaderMsg>();
    let mut leader: Option<(AtomizerLeader, u64)> = None;
    let mut epoch = 0u64;
    let mut stopping = false;
    let mut reported = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let ms = start.elapsed().as_millis() as u64;
        let mut outputs = Vec::new();
        tokio::select! {
            a = attest.recv() => {
                let Some(a) = a else { return };
                queued.fetch_sub(a.len().min(queued.load(Ordering::Acquire)), Ordering::AcqRel);
                if let Some((l, _)) = leader.as_mut() {
                    outputs = l.handle(LeaderInput::Attest(a));
                }
            }
            m = rx.recv() => {
                let Some(m) = m else { return };
                match (m, leader.as_mut()) {
                    (LeaderMsg::Replicated(e, r), Some((l, _))) if e == epoch => match r {
                        Ok(height) => {
                            outputs = l.handle(LeaderInput::Replicated {
                                height,
                                ms: start.elapsed().as_millis() as u64,
                            });
                        }
                        Err(why) => {
                            // This leader's state is done with (what it buffered is dropped:
                            // the sentinels try again). Still leading, the next tick begins a
                            // new one from the committed height, instead of answering `Busy`
                            // for the rest of the term.
                            tracing::warn!("atomizer leader: a step was not replicated ({why}): starting again from the committed height");
                            l.handle(LeaderInput::Failed);
                            leader = None;
                            epoch += 1;
                        }
                    },
                    (LeaderMsg::ShardAt(e, shard, height), Some((l, _))) if e == epoch => {
                        outputs = l.handle(LeaderInput::ShardAt { shard, height });
                    }
                    _ => {}
                }
            }
            _ = tick.tick() => {
                let leads = replica.leader_term();
                let fit = replica.with_machine(|m| m.failed().is_none());
                if leads.is_some() && !fit && !stopping {
                    // A leader that cannot write blocks stops its replica, so that the group
                    // elects one that can (the operator must replace the disk).
                    stopping = true;
                    tracing::error!("ALERT florin atomizer: this replica's block log failed while it leads: stopping the replica");
                    let r = replica.clone();
                    tokio::spawn(async move {
                        let _ = r.shutdown().await;
                    });
                }
                match (&leader, leads) {
                    (None, Some(t)) if fit => {
                        // Everything committed before this term is applied once a
                        // linearizable read returns.
                        if let Ok(h) = replica.read(|m| m.state.height()).await {
                            if replica.leader_term() == Some(t) {
                                epoch += 1;
                                leader = Some((AtomizerLeader::new(cfg, h, shards.len()), t));
                            }
                        }
                    }
                    (Some((_, t)), now) if now != Some(*t) || !fit => {
                        leader = None;
                        epoch += 1;
                    }
                    _ => {}
                }
                if let Some((l, _)) = leader.as_mut() {
                    outputs = l.handle(LeaderInput::Tick {
                        ms,
                        wall: florin_ledger::expiry::unix_now(),
                    });
                    if let Ok(mut x) = load.lock() {
                        *x = (l.buffered().0 as u64, l.height());
                    }
                    if ms.saturating_sub(reported) >= 5_000 {
                        reported = ms;
                        let ((cap, step_ms), (buffered, refused)) = (l.admission(), l.buffered());
                        tracing::info!(
                            height = l.height(),
                            admitting = cap,
                            last_step_ms = step_ms,
                            buffered,
                            dropped = refused,
                            refused = busy.load(Ordering::Relaxed),
                            "atomizer leader"
                        );
                    }
                }
            }
        }
        // What the handlers may admit until the next event (less what they admitted that
        // is still queued).
        room.store(
            leader.as_ref().map_or(0, |(l, _)| {
                l.room().saturating_sub(queued.load(Ordering::Acquire))
            }),
            Ordering::Release,
        );
        for o in outputs {
            match o {
                LeaderOutput::Replicate(cmd) => {
                    let (replica, tx, e) = (replica.clone(), tx.clone(), epoch);
                    tokio::spawn(async move {
                        let r = match replica.write(encode(&cmd)).await {
                            Ok(b) => match decode::<AtomReply>(&b) {
                                Ok(AtomReply::Stepped(r)) => Ok(r.height),
                                Ok(AtomReply::Refused(why)) => Err(why),
                                Err(e) => Err(e.to_string()),
                            },
                            Err(e) => Err(e.to_string()),
                        };
                        let _ = tx.send(LeaderMsg::Replicated(e, r));
                    });
                }
                LeaderOutput::SendBlocks { shard, from, to } => {
                    let Some(client) = shards.get(shard as usize).cloned() else {
                        continue;
                    };
                    let blocks = match log.read(from, to) {
                        Ok(b) if !b.is_empty() => fit(b, super::rpc::MAX_RPC / 4),
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::error!("ALERT florin atomizer: cannot send shard {shard} blocks {from}..={to}: {e}");
                            continue;
                        }
                    };
                    let (tx, e) = (tx.clone(), epoch);
                    // Each block is one write on the shard's group.
                    // Answered before the leader would send again: deliveries to one shard
                    // do not overlap.
                    let patience = Duration::from_millis(cfg.resend_after * 3 / 4);
                    tokio::spawn(async move {
                        match client
                            .call_async(Request::AtomBlocks(blocks), patience)
                            .await
                        {
                            Ok(Response::BlockReply(
                                BlockReply::Applied(h) | BlockReply::Behind(h),
                            )) => {
                                let _ = tx.send(LeaderMsg::ShardAt(e, shard, h));
                            }
                            Ok(Response::BlockReply(BlockReply::Fork { height, .. })) => {
                                tracing::error!("ALERT florin atomizer: shard {shard} at block {height} holds another history");
                            }
                            _ => {}
                        }
                    });
                }
            }
        }
    }
}

/// One replica of a shard in the atomizer architecture.
pub struct BlockShardService {
    /// The shard's index.
    pub shard: ShardId,
    /// Its Raft replica.
    pub replica: Arc<Replica<BlockShardMachine>>,
    /// Keys of the shard's members.
    pub members: HashSet<PublicKey>,
    /// Keys of the atomizer's members (the only senders of blocks).
    pub atomizer_keys: HashSet<PublicKey>,
    /// Keys allowed to ask for attestations and to read (sentinels).
    pub clients: HashSet<PublicKey>,
    /// The atomizer group (attestations go to its leader).
    pub atomizer: Arc<GroupClient>,
    /// The cluster's shard map.
    pub map: ShardMap,
    /// Set when the atomizer's leader refused attestations.
    pub busy_until: BusyUntil,
}

/// Until when a shard answers `Busy` for what it would attest, without asking the atomizer.
#[derive(Debug)]
pub struct BusyUntil {
    start: Instant,
    /// Milliseconds since `start`.
    until: AtomicU64,
    /// Refusals in a row.
    refusals: AtomicU64,
}

impl Default for BusyUntil {
    fn default() -> Self {
        BusyUntil {
            start: Instant::now(),
            until: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        }
    }
}

impl BusyUntil {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Whether the atomizer said it is busy less than [`BUSY_FOR`] ago.
    pub fn busy(&self) -> bool {
        self.now() < self.until.load(Ordering::Acquire)
    }

    /// The atomizer refused: busy for [`BUSY_FOR`], doubled for each refusal in a row (up to
    /// [`BUSY_MAX`]).
    pub fn set(&self) {
        let n = self.refusals.fetch_add(1, Ordering::AcqRel).min(8);
        let ms = (BUSY_FOR.as_millis() as u64)
            .saturating_mul(1 << n)
            .min(BUSY_MAX.as_millis() as u64);
        self.until.store(self.now() + ms, Ordering::Release);
    }

    /// The atomizer took a batch: not busy (a refusal of a batch sent meanwhile is out of
    /// date), and the next refusal starts from [`BUSY_FOR`] again.
    pub fn clear(&self) {
        self.refusals.store(0, Ordering::Release);
        self.until.store(0, Ordering::Release);
    }
}

impl Handler for BlockShardService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        match req {
            Request::Raft(b) if self.members.contains(peer) => {
                Response::Raft(self.replica.handle_rpc(&b).await)
            }
            Request::AtomBlocks(blocks) if self.atomizer_keys.contains(peer) => {
                // Blocks already applied are not written again; the rest are one Raft write of
                // each block's part for this shard (the group replicates its share of the
                // history, not all of it).
                let have = self.replica.with_machine(|m| m.state.height());
                let parts: Vec<ShardBlock> = blocks
                    .iter()
                    .filter(|b| b.height > have)
                    .map(|b| ShardBlock::of(b, &self.map, self.shard))
                    .collect();
                if parts.is_empty() {
                    return Response::BlockReply(BlockReply::Applied(have));
                }
                match self.replica.write(shard_parts_command(&parts)).await {
                    Ok(r) => match decode::<ShardBlockReply>(&r) {
                        Ok(ShardBlockReply::Block(r)) => Response::BlockReply(r),
                        Ok(ShardBlockReply::Refused(why)) => Response::Refused(why),
                        Err(e) => Response::Error(e.to_string()),
                    },
                    Err(e) => not_leader(e),
                }
            }
            Request::AtomAttest(_) if !self.replica.is_leader() => {
                // Attested at the leader's state: a deposed or lagging replica would answer
                // `Behind` for ever.
                Response::NotLeader(None)
            }
            Request::AtomAttest(asks) if self.clients.contains(peer) => {
                if let Some(outside) = asks.iter().find(|a| {
                    !self.map.owns(self.shard, &a.tx.txid)
                        && !a.tx.inputs.iter().any(|i| self.map.owns(self.shard, i))
                }) {
                    return Response::Refused(format!(
                        "transaction {} has nothing on shard {}",
                        hex8(&outside.tx.txid),
                        self.shard
                    ));
                }
                let mut verdicts: Vec<Verdict> = self.replica.with_machine(|m| {
                    asks.iter()
                        .map(|a| {
                            // The key is this shard's own hash of the body, not the asker's.
                            let key = florin_cluster::atomizer::tx_key(&a.tx);
                            m.state.attest(&a.tx, key, &a.attempts, a.min_height, a.now)
                        })
                        .collect()
                });
                let forward: Vec<Attestation> = verdicts
                    .iter()
                    .filter_map(|v| match v {
                        Verdict::Attested(a) => Some(a.clone()),
                        _ => None,
                    })
                    .collect();
                // Forwarded before the sentinel is answered, so that a busy atomizer's
                // refusal reaches the sentinel (which asks again later: admission control
                // ends at the sentinels, not in queues). Not taken for sure (refused, or no
                // answer): `Busy`; should the leader have taken them after all, the
                // sentinel's next ask merges with them.
                if !forward.is_empty() {
                    let ask = !self.busy_until.busy();
                    let taken = ask
                        && matches!(
                            self.atomizer
                                .call_async(Request::AtomForward(forward), FORWARD_WAIT)
                                .await,
                            Ok(Response::Taken)
                        );
                    if taken {
                        self.busy_until.clear();
                    } else {
                        if ask {
                            self.busy_until.set();
                        }
                        for v in &mut verdicts {
                            if matches!(v, Verdict::Attested(_)) {
                                *v = Verdict::Busy;
                            }
                        }
                    }
                }
                Response::Verdicts(verdicts)
            }
            // Reads at a height: the asker read the atomizer's committed height first (the
            // linearization point), and a shard's state at that height or later holds every
            // block up to it, each one final once applied. So any replica that has applied that
            // far answers from its state, without a Raft round of its own (these are the
            // sentinels' polls, the hottest requests a shard serves).
            Request::AtomStatus(asks) if self.clients.contains(peer) => {
                Response::Statuses(self.replica.with_machine(|m| {
                    asks.iter()
                        .map(|a| m.state.status(&a.txid, a.min_height))
                        .collect()
                }))
            }
            Request::AtomDecided(from) if self.clients.contains(peer) => {
                self.replica.with_machine(|m| {
                    let (reached, feed_from, decisions) = match from {
                        Some(f) => m.state.decided_since(f),
                        None => (m.state.height(), m.state.height(), Vec::new()),
                    };
                    Response::Decided {
                        reached,
                        feed_from,
                        decisions,
                    }
                })
            }
            Request::AtomUnspent(ids, h) if self.clients.contains(peer) => {
                self.replica.with_machine(|m| {
                    if m.state.height() < h {
                        return Response::NotYet(m.state.height());
                    }
                    Response::Bools(ids.iter().map(|i| m.state.is_unspent(i)).collect())
                })
            }
            Request::AtomConfirmed(ids, h) if self.clients.contains(peer) => {
                self.replica.with_machine(|m| {
                    if m.state.height() < h {
                        return Response::NotYet(m.state.height());
                    }
                    Response::Bools(ids.iter().map(|i| m.state.is_confirmed(i)).collect())
                })
            }
            Request::Books if self.clients.contains(peer) => self
                .replica
                .read(|m| (m.state.books(), m.state.height()))
                .await
                .map_or_else(not_leader, |(b, _)| Response::Books(b)),
            Request::Status => Response::Status(NodeStatus {
                role: "shard".into(),
                group: self.shard,
                raft: self.replica.status(),
                load: (self.replica.with_machine(|m| m.state.height()), 0),
                alerts: (0, None),
                remembered: 0,
            }),
            _ => Response::Error(format!(
                "shard {} (atomizer architecture) does not take this request from this key",
                self.shard
            )),
        }
    }
}

fn hex8(d: &[u8; 32]) -> String {
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

type Answer = Result<Vec<SwapOutcome>, String>;

/// Transactions, the atomizer's height and the sentinel's clock, and where the answer goes.
type Submission = (
    Vec<CompactTx>,
    Height,
    u64,
    std::sync::mpsc::SyncSender<Answer>,
);

/// The sentinel's [`SwapStore`] over an atomizer cluster: submissions go through the
/// submitter machine, run on a thread of its own; reads go to shards at a height at least the
/// atomizer's committed height (linearizable).
pub struct AtomizerStore {
    map: ShardMap,
    shards: Vec<Arc<GroupClient>>,
    atomizer: Arc<GroupClient>,
    submit: mpsc::UnboundedSender<Submission>,
    patience: Duration,
    tries: Arc<std::sync::atomic::AtomicU64>,
}

impl AtomizerStore {
    /// A store over these groups; starts the submitter's thread.
    pub fn new(
        map: ShardMap,
        shards: Vec<Arc<GroupClient>>,
        atomizer: Arc<GroupClient>,
    ) -> Result<AtomizerStore, StoreError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot start the submitter: {e}")))?;
        let (m, s) = (map.clone(), shards.clone());
        let tries = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let t = tries.clone();
        std::thread::Builder::new()
            .name("florin-submitter".into())
            .spawn(move || rt.block_on(submit_loop(m, s, rx, t)))
            .map_err(|e| StoreError::Backend(format!("cannot start the submitter: {e}")))?;
        Ok(AtomizerStore {
            map,
            shards,
            atomizer,
            submit: tx,
            patience: Duration::from_secs(30),
            tries,
        })
    }

    /// Tries begun so far by this store's submitter, all transactions together (one per
    /// transaction when none went stale).
    pub fn tries(&self) -> u64 {
        self.tries.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn backend(e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!("atomizer cluster: {e}"))
    }

    /// The atomizer's committed height.
    pub fn height(&self) -> Result<Height, StoreError> {
        match self
            .atomizer
            .call(&Request::AtomHeight, self.patience)
            .map_err(Self::backend)?
        {
            Response::Height(h) => Ok(h),
            other => Err(Self::backend(format!("unexpected answer {other:?}"))),
        }
    }

    /// Asks the shard owning `id`, at a height at least the atomizer's now, until it has it.
    fn read_at(&self, id: &[u8; 32], req: impl Fn(Height) -> Request) -> Result<bool, StoreError> {
        let h = self.height()?;
        let shard = &self.shards[self.map.shard_of(id) as usize];
        let start = Instant::now();
        while start.elapsed() < self.patience {
            match shard.call(&req(h), self.patience).map_err(Self::backend)? {
                Response::Bools(v) if v.len() == 1 => return Ok(v[0]),
                Response::NotYet(_) => std::thread::sleep(Duration::from_millis(5)),
                other => return Err(Self::backend(format!("unexpected answer {other:?}"))),
            }
        }
        Err(Self::backend(
            "the shard did not reach the atomizer's height",
        ))
    }
}

impl SwapStore for AtomizerStore {
    /// `now` (the sentinel's clock) goes with the attestations: shards judge expiry at least at
    /// it, and the atomizer's clock is at least the highest it was given, up to the tolerated
    /// skew past its leader's.
    fn swap_at(&self, now: u64, batch: &[CompactTx]) -> Result<Vec<SwapOutcome>, StoreError> {
        if batch.is_empty() {
            return Ok(vec![]);
        }
        let h = self.height()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit
            .send((
                batch.to_vec(),
                h,
                now.min(florin_ledger::expiry::unix_now() + florin_ledger::expiry::CLOCK_SKEW_SECS),
                tx,
            ))
            .map_err(|_| Self::backend("the submitter stopped"))?;
        // The submitter fails a transaction not decided within its deadline; this is the
        // backstop should its thread stall.
        match rx
            .recv_timeout(Duration::from_millis(SubmitConfig::default().deadline) + self.patience)
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(why)) => Err(Self::backend(format!("the batch is in doubt: {why}"))),
            Err(_) => Err(Self::backend(
                "the submitter gave no answer: the batch is in doubt",
            )),
        }
    }

    fn is_unspent(&self, id: &UhsId) -> Result<bool, StoreError> {
        self.read_at(id, |h| Request::AtomUnspent(vec![*id], h))
    }

    fn is_confirmed(&self, txid: &Digest) -> Result<bool, StoreError> {
        self.read_at(txid, |h| Request::AtomConfirmed(vec![*txid], h))
    }

    fn supply(&self) -> Result<Supply, StoreError> {
        // Shards apply blocks independently: a cut is consistent once every shard reports
        // books at the same height; read until the sum balances (as the two-phase store).
        let mut last = Supply::default();
        for _ in 0..50 {
            last = Supply::default();
            for s in &self.shards {
                match s
                    .call(&Request::Books, self.patience)
                    .map_err(Self::backend)?
                {
                    Response::Books(b) => {
                        last.minted_cents += b.minted_cents;
                        last.redeemed_cents += b.redeemed_cents;
                        last.unspent_cents += b.unspent_cents;
                        last.unspent_count += b.unspent_count;
                    }
                    other => return Err(Self::backend(format!("unexpected answer {other:?}"))),
                }
            }
            if last.minted_cents.checked_sub(last.redeemed_cents) == Some(last.unspent_cents) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(last)
    }
}

/// A shard's share of a round's status questions: (job, height asked) and the ask, in order.
type StatusBatch = (Vec<(u64, Height)>, Vec<StatusAsk>);

/// A shard's share of a round's attestation requests: (job, try) and the ask, in order.
type AttestBatch = (Vec<(u64, u64)>, Vec<AttestAsk>);

enum Io {
    Verdicts(ShardId, Vec<(u64, u64)>, Result<Vec<Verdict>, String>),
    /// Answers to status questions: each job with the height it asked at.
    Statuses(Vec<(u64, Height)>, Result<Vec<TxStatus>, String>),
    /// A shard's decision feed: how far it is complete, and the decisions.
    Decided(ShardId, Option<(Height, Vec<(Digest, TxStatus)>)>),
}

/// How often the submitter reads each shard's decision feed while it follows transactions
/// (one read in flight per shard).
const FEED_EVERY: Duration = Duration::from_millis(20);

/// The submitter's place in one shard's decision feed.
#[derive(Default)]
struct Feed {
    /// Decisions up to this height have been read (`None`: not yet asked).
    cursor: Option<Height>,
    busy: bool,
    last: Option<Instant>,
}

async fn submit_loop(
    map: ShardMap,
    shards: Vec<Arc<GroupClient>>,
    mut rx: mpsc::UnboundedReceiver<Submission>,
    tries: Arc<std::sync::atomic::AtomicU64>,
) {
    let start = Instant::now();
    let mut sub = Submitter::new(
        map,
        SubmitConfig::default(),
        Box::new(<rand::rngs::StdRng as rand::SeedableRng>::from_entropy()),
    );
    let (io_tx, mut io_rx) = mpsc::unbounded_channel::<Io>();
    let mut waiters: HashMap<u64, std::sync::mpsc::SyncSender<Answer>> = HashMap::new();
    let mut next = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut feeds: Vec<Feed> = shards.iter().map(|_| Feed::default()).collect();
    loop {
        let mut out = Vec::new();
        tokio::select! {
            s = rx.recv() => {
                let Some((txs, height, now, reply)) = s else { return };
                next += 1;
                waiters.insert(next, reply);
                out = sub.handle(SubmitInput::Submit { ticket: next, txs, height, now });
            }
            io = io_rx.recv() => {
                let Some(io) = io else { return };
                match io {
                    Io::Verdicts(shard, jobs, Ok(v)) if v.len() == jobs.len() => {
                        for ((job, attempt), verdict) in jobs.into_iter().zip(v) {
                            out.extend(sub.handle(SubmitInput::Verdict { job, attempt, shard, verdict }));
                        }
                    }
                    Io::Statuses(jobs, Ok(v)) if v.len() == jobs.len() => {
                        for ((job, asked), status) in jobs.into_iter().zip(v) {
                            out.extend(sub.handle(SubmitInput::Status { job, status, asked }));
                        }
                    }
                    Io::Decided(shard, answer) => {
                        if let Some(f) = feeds.get_mut(shard as usize) {
                            f.busy = false;
                            f.last = Some(Instant::now());
                            if let Some((reached, decisions)) = answer {
                                f.cursor = Some(f.cursor.map_or(reached, |c| c.max(reached)));
                                if !decisions.is_empty() {
                                    out.extend(sub.handle(SubmitInput::Decided(decisions)));
                                }
                            }
                        }
                    }
                    // Unanswered: the submitter asks again on its clock.
                    _ => {}
                }
            }
            _ = tick.tick() => {
                out = sub.handle(SubmitInput::Tick(start.elapsed().as_millis() as u64));
                // Outcomes come from each shard's decision feed, one read in flight per shard.
                if sub.in_flight() > 0 {
                    for (shard, f) in feeds.iter_mut().enumerate() {
                        if f.busy || f.last.is_some_and(|t| t.elapsed() < FEED_EVERY) {
                            continue;
                        }
                        let Some(c) = shards.get(shard).cloned() else {
                            continue;
                        };
                        f.busy = true;
                        let (io, from) = (io_tx.clone(), f.cursor);
                        tokio::spawn(async move {
                            let r = match c
                                .call_async(Request::AtomDecided(from), Duration::from_secs(2))
                                .await
                            {
                                Ok(Response::Decided { reached, feed_from, decisions }) => {
                                    if from.is_some_and(|f| f < feed_from) {
                                        tracing::debug!("shard {shard}'s decision feed starts after {feed_from}: outcomes before it come from asking");
                                    }
                                    Some((reached, decisions))
                                }
                                _ => None,
                            };
                            let _ = io.send(Io::Decided(shard as ShardId, r));
                        });
                    }
                }
            }
        }
        tries.store(sub.tries(), std::sync::atomic::Ordering::Relaxed);
        let mut attest: BTreeMap<ShardId, AttestBatch> = BTreeMap::new();
        let mut status: BTreeMap<ShardId, StatusBatch> = BTreeMap::new();
        for o in out {
            match o {
                SubmitOutput::Attest {
                    shard,
                    job,
                    attempt,
                    attempts,
                    now,
                    tx,
                    key,
                    min_height,
                } => {
                    let e = attest.entry(shard).or_default();
                    e.0.push((job, attempt));
                    e.1.push(AttestAsk {
                        tx,
                        key,
                        attempts: attempts.to_vec(),
                        min_height,
                        now,
                    });
                }
                SubmitOutput::AskStatus {
                    shard,
                    job,
                    txid,
                    min_height,
                } => {
                    let e = status.entry(shard).or_default();
                    e.0.push((job, min_height));
                    e.1.push(StatusAsk { txid, min_height });
                }
                SubmitOutput::Answer { ticket, outcomes } => {
                    if let Some(w) = waiters.remove(&ticket) {
                        let _ = w.send(Ok(outcomes));
                    }
                }
                SubmitOutput::Fail { ticket, why } => {
                    if let Some(w) = waiters.remove(&ticket) {
                        let _ = w.send(Err(why));
                    }
                }
            }
        }
        for (shard, (jobs, asks)) in attest {
            let Some(c) = shards.get(shard as usize).cloned() else {
                continue;
            };
            let io = io_tx.clone();
            tokio::spawn(async move {
                let r = match c
                    .call_async(Request::AtomAttest(asks), Duration::from_secs(2))
                    .await
                {
                    Ok(Response::Verdicts(v)) => Ok(v),
                    Ok(other) => Err(format!("{other:?}")),
                    Err(e) => Err(e.to_string()),
                };
                let _ = io.send(Io::Verdicts(shard, jobs, r));
            });
        }
        for (shard, (jobs, asks)) in status {
            let Some(c) = shards.get(shard as usize).cloned() else {
                continue;
            };
            let io = io_tx.clone();
            tokio::spawn(async move {
                let r = match c
                    .call_async(Request::AtomStatus(asks), Duration::from_secs(2))
                    .await
                {
                    Ok(Response::Statuses(v)) => Ok(v),
                    Ok(other) => Err(format!("{other:?}")),
                    Err(e) => Err(e.to_string()),
                };
                let _ = io.send(Io::Statuses(jobs, r));
            });
        }
    }
}

//! The cluster's services: a shard replica and a coordinator replica, each a Raft replica of
//! its group's state machine behind the RPC [`Handler`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_cluster::coordinator::{
    CoordEntry, CoordLog, Coordinator, CoordinatorConfig, Input, Output, Ticket,
};
use florin_cluster::raft::{Machine, RaftError, Replica};
use florin_cluster::route::{ShardId, ShardMap};
use florin_cluster::shard::{
    check_range, decode, encode, DecodeError, Fence, Fenced, ShardCmd, ShardReply, ShardState,
    SnapshotError,
};
use florin_cluster::Dtx;
use florin_crypto::PublicKey;
use florin_ledger::{CompactTx, SwapOutcome};
use rand::SeedableRng;
use tokio::sync::{mpsc, oneshot};

use super::client::GroupClient;
use super::rpc::{Handler, NodeStatus, Request, Response};

/// The shard state machine as Raft replicates it.
#[derive(Default, Clone)]
pub struct ShardMachine(pub ShardState);

impl Machine for ShardMachine {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        let reply = match decode::<Fenced>(cmd) {
            Ok(f) => self.0.apply(f.by, f.cmd),
            Err(e) => ShardReply::Refused(e.to_string()),
        };
        encode(&reply)
    }
    fn snapshot(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.0.snapshot_into(&mut out);
        out
    }
    fn snapshot_into(&self, out: &mut Vec<u8>) {
        // Straight into the snapshot's buffer: the state can be millions of ids.
        self.0.snapshot_into(out)
    }
    type Error = SnapshotError;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), SnapshotError> {
        self.0 = ShardState::from_snapshot(snapshot)?;
        Ok(())
    }
}

/// The coordinator's replicated log of unfinished batches.
#[derive(Default, Clone)]
pub struct CoordMachine(pub CoordLog);

impl Machine for CoordMachine {
    fn apply(&mut self, cmd: &[u8]) -> Vec<u8> {
        if let Ok(e) = decode::<CoordEntry>(cmd) {
            self.0.apply(&e);
        }
        Vec::new()
    }
    fn snapshot(&self) -> Vec<u8> {
        encode(&self.0)
    }
    type Error = DecodeError;
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), DecodeError> {
        self.0 = decode(snapshot)?;
        Ok(())
    }
}

pub(super) fn not_leader(e: RaftError) -> Response {
    match e {
        RaftError::NotLeader { addr, .. } => Response::NotLeader(addr),
        e => Response::Error(e.to_string()),
    }
}

/// One replica of one shard.
pub struct ShardService {
    /// The shard's index.
    pub shard: ShardId,
    /// Its Raft replica.
    pub replica: Arc<Replica<ShardMachine>>,
    /// Keys of the shard's members (the only ones whose Raft messages are taken).
    pub members: HashSet<PublicKey>,
    /// Keys of coordinator replicas, with their group (the only ones whose 2PC commands are
    /// taken, each only for its own group).
    pub coordinators: HashMap<PublicKey, u16>,
    /// Keys allowed to read (clients and coordinators).
    pub readers: HashSet<PublicKey>,
    /// The cluster's shard map: a command with an id outside this shard's range is refused
    /// before it is replicated.
    pub map: ShardMap,
}

impl ShardService {
    async fn write(&self, f: &Fenced) -> Response {
        match self.replica.write(encode(f)).await {
            Ok(b) => match decode::<ShardReply>(&b) {
                Ok(r) => Response::Shard(r),
                Err(e) => Response::Error(e.to_string()),
            },
            Err(e) => not_leader(e),
        }
    }
}

impl Handler for ShardService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        match req {
            Request::Raft(b) if self.members.contains(peer) => {
                Response::Raft(self.replica.handle_rpc(&b).await)
            }
            Request::Raft(_) => Response::Error("raft messages only from members".into()),
            Request::Fenced(_) if !self.coordinators.contains_key(peer) => {
                Response::Error("two-phase-commit commands only from coordinators".into())
            }
            Request::Fenced(f) if self.coordinators.get(peer) != Some(&f.by.group) => {
                Response::Error(format!(
                    "a coordinator speaks only for its own group, not group {}",
                    f.by.group
                ))
            }
            Request::Unspent(_) | Request::Confirmed(_) | Request::Books
                if !self.readers.contains(peer) =>
            {
                Response::Error("reads only from clients and coordinators".into())
            }
            Request::Fenced(f) => {
                if let Err(why) = check_range(&self.map, self.shard, &f.cmd) {
                    return Response::Shard(ShardReply::Refused(why));
                }
                self.write(&f).await
            }
            Request::Unspent(ids) => self
                .replica
                .read(|m| ids.iter().map(|i| m.0.is_unspent(i)).collect())
                .await
                .map_or_else(not_leader, Response::Bools),
            Request::Confirmed(ids) => self
                .replica
                .read(|m| ids.iter().map(|i| m.0.is_confirmed(i)).collect())
                .await
                .map_or_else(not_leader, Response::Bools),
            Request::Books => self
                .replica
                .read(|m| m.0.books())
                .await
                .map_or_else(not_leader, Response::Books),
            Request::Status => {
                let ((a, b), remembered) = self
                    .replica
                    .with_machine(|m| (m.0.in_flight(), m.0.remembered().0));
                Response::Status(NodeStatus {
                    role: "shard".into(),
                    group: self.shard,
                    raft: self.replica.status(),
                    load: (a as u64, b as u64),
                    alerts: (0, None),
                    remembered: remembered as u64,
                })
            }
            Request::Submit(..) => Response::Error("a shard takes no submissions".into()),
            Request::RegistryWrite(_) | Request::RegistryVersion => {
                Response::Error("a shard holds no registry".into())
            }
            _ => Response::Error(
                "a two-phase-commit shard takes no atomizer requests (check the cluster's architecture)"
                    .into(),
            ),
        }
    }
}

/// Why a submission got no outcomes.
enum Failed {
    /// Try again (this replica lost leadership, or its engine stopped).
    Retry(String),
    /// A shard refused a batch of it (asking again gets the same answer), or one of its
    /// transactions stayed locked through every try: in doubt either way.
    Refused(String),
}

type Answer = Result<Vec<SwapOutcome>, Failed>;

enum EngineMsg {
    /// Transactions and the submitter's clock (Unix seconds).
    Submit(Vec<CompactTx>, u64, oneshot::Sender<Answer>),
    Input(u64, Input),
    StepDown(u64),
    /// For the operator (see [`alert`]).
    Alert(Dtx, ShardId, String),
}

/// Most (batch, shard) pairs whose alert is remembered, so a refusal resent on the clock is
/// reported once (forgotten all at once beyond that).
const ALERTS_REMEMBERED: usize = 4096;

/// Reports what the operator must look at: in the node's log (`ALERT …`) and in the
/// coordinator's status (`cluster status`: a count and the last one's words), once per batch
/// and shard.
fn alert(
    group: u16,
    alerts: &Alerts,
    seen: &mut HashSet<(Dtx, ShardId)>,
    dtx: Dtx,
    shard: ShardId,
    why: String,
) {
    if seen.len() >= ALERTS_REMEMBERED {
        seen.clear();
    }
    if !seen.insert((dtx, shard)) {
        return;
    }
    tracing::error!("ALERT florin coordinator group {group}: {why}");
    if let Ok(mut a) = alerts.lock() {
        a.0 += 1;
        a.1 = Some(why);
    }
}

/// One replica of a coordinator group. When its replica leads, it runs the 2PC engine.
pub struct CoordService {
    /// The group's index.
    pub group: u16,
    /// Its Raft replica.
    pub replica: Arc<Replica<CoordMachine>>,
    /// Keys of the group's members.
    pub members: HashSet<PublicKey>,
    /// Keys allowed to submit (sentinels).
    pub clients: HashSet<PublicKey>,
    addrs: BTreeMap<u64, String>,
    engine: mpsc::UnboundedSender<EngineMsg>,
    load: Arc<std::sync::Mutex<(u64, u64)>>,
    alerts: Alerts,
}

/// A coordinator's alerts: how many, and the last one's words.
type Alerts = Arc<std::sync::Mutex<(u64, Option<String>)>>;

impl CoordService {
    /// Starts the engine task for `replica` (it drives batches while the replica leads).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        group: u16,
        replica: Arc<Replica<CoordMachine>>,
        members: HashSet<PublicKey>,
        clients: HashSet<PublicKey>,
        addrs: BTreeMap<u64, String>,
        map: ShardMap,
        shards: Vec<Arc<GroupClient>>,
        cfg: CoordinatorConfig,
    ) -> Arc<CoordService> {
        let (tx, rx) = mpsc::unbounded_channel();
        let load = Arc::new(std::sync::Mutex::new((0, 0)));
        let alerts: Alerts = Arc::default();
        let svc = Arc::new(CoordService {
            group,
            replica: replica.clone(),
            members,
            clients,
            addrs,
            engine: tx.clone(),
            load: load.clone(),
            alerts: alerts.clone(),
        });
        tokio::spawn(engine_loop(
            group, replica, map, shards, cfg, tx, rx, load, alerts,
        ));
        svc
    }
}

impl Handler for CoordService {
    async fn handle(&self, peer: &PublicKey, req: Request) -> Response {
        match req {
            Request::Raft(b) if self.members.contains(peer) => {
                Response::Raft(self.replica.handle_rpc(&b).await)
            }
            Request::Raft(_) => Response::Error("raft messages only from members".into()),
            Request::Submit(..) if !self.clients.contains(peer) => {
                Response::Error("submissions only from the cluster's clients".into())
            }
            Request::Submit(txs, now) => {
                if !self.replica.is_leader() {
                    let leader = self.replica.status().leader;
                    return Response::NotLeader(leader.and_then(|l| self.addrs.get(&l).cloned()));
                }
                let (tx, rx) = oneshot::channel();
                // A submitter's clock never moves this group's past its own by more than the
                // tolerated skew (a clock stepped far ahead would otherwise make every shard
                // refuse transactions as expired until real time caught up).
                let now = now.min(
                    florin_ledger::expiry::unix_now() + florin_ledger::expiry::CLOCK_SKEW_SECS,
                );
                if self.engine.send(EngineMsg::Submit(txs, now, tx)).is_err() {
                    return Response::Error("the coordinator engine stopped".into());
                }
                match rx.await {
                    Ok(Ok(v)) => Response::Submitted(v),
                    Ok(Err(Failed::Retry(e))) => Response::Error(e),
                    Ok(Err(Failed::Refused(e))) => Response::Refused(e),
                    Err(_) => Response::Error("the coordinator lost leadership; retry".into()),
                }
            }
            Request::Status => Response::Status(NodeStatus {
                role: "coordinator".into(),
                group: self.group,
                raft: self.replica.status(),
                load: self.load.lock().map(|l| *l).unwrap_or_default(),
                alerts: self.alerts.lock().map(|a| a.clone()).unwrap_or_default(),
                remembered: 0,
            }),
            _ => Response::Error("a coordinator serves Submit and Status".into()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn engine_loop(
    group: u16,
    replica: Arc<Replica<CoordMachine>>,
    map: ShardMap,
    shards: Vec<Arc<GroupClient>>,
    cfg: CoordinatorConfig,
    tx: mpsc::UnboundedSender<EngineMsg>,
    mut rx: mpsc::UnboundedReceiver<EngineMsg>,
    load: Arc<std::sync::Mutex<(u64, u64)>>,
    alerts: Alerts,
) {
    let start = Instant::now();
    let mut engine: Option<Coordinator> = None;
    // The term the engine leads in: its commands carry it, and it stops when the replica no
    // longer leads in exactly that term.
    let mut term = 0u64;
    let mut epoch = 0u64;
    let mut next_ticket: Ticket = 0;
    let mut waiters: HashMap<Ticket, oneshot::Sender<Answer>> = HashMap::new();
    let mut alerted = HashSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let mut outputs = Vec::new();
        tokio::select! {
            msg = rx.recv() => {
                let Some(msg) = msg else { return };
                match msg {
                    EngineMsg::Submit(txs, now, reply) => match engine.as_mut() {
                        Some(e) => {
                            next_ticket += 1;
                            waiters.insert(next_ticket, reply);
                            outputs = e.handle(Input::Submit {
                                ticket: next_ticket,
                                txs,
                                now,
                            });
                        }
                        None => {
                            let _ = reply.send(Err(Failed::Retry("not the leader; retry".into())));
                        }
                    },
                    EngineMsg::Input(ep, Input::Reply { dtx, shard, reply: ShardReply::Refused(why) })
                        if ep == epoch =>
                    {
                        tracing::warn!("florin coordinator: shard {shard} refused batch {dtx:032x}: {why}");
                        // A refused one-phase batch fails its submitters; a refused two-phase
                        // command is resent.
                        if let Some(e) = engine.as_mut() {
                            outputs = e.handle(Input::Reply {
                                dtx,
                                shard,
                                reply: ShardReply::Refused(why),
                            });
                        }
                    }
                    // A later leader of this group has reached the shard: this one is deposed.
                    EngineMsg::Input(ep, Input::Reply { shard, reply: ShardReply::Deposed(newer), .. })
                        if ep == epoch =>
                    {
                        tracing::warn!(
                            "florin coordinator: shard {shard} has seen term {newer} of this group, \
                             this leader's is {term}: stepping down"
                        );
                        step_down(&mut engine, &mut waiters, &mut epoch);
                    }
                    EngineMsg::Input(ep, input) if ep == epoch => {
                        if let Some(e) = engine.as_mut() {
                            outputs = e.handle(input);
                        }
                    }
                    EngineMsg::StepDown(ep) if ep == epoch => {
                        step_down(&mut engine, &mut waiters, &mut epoch);
                    }
                    EngineMsg::Alert(dtx, shard, why) => {
                        alert(group, &alerts, &mut alerted, dtx, shard, why);
                    }
                    _ => {}
                }
            }
            _ = tick.tick() => {
                let leads = replica.leader_term();
                if let (Some(t), None) = (leads, &engine) {
                    // Everything committed before this term is applied once a linearizable
                    // read returns: the unfinished batches are complete.
                    let read = replica.read(|m| m.0.batches().clone()).await;
                    if let (Ok(batches), true) = (read, replica.leader_term() == Some(t)) {
                        epoch += 1;
                        term = t;
                        let mut e = Coordinator::new(
                            map.clone(),
                            cfg,
                            Fence { group, term },
                            Box::new(rand::rngs::StdRng::from_entropy()),
                        );
                        e.handle(Input::Tick(start.elapsed().as_millis() as u64));
                        outputs = e.handle(Input::Resume(batches));
                        engine = Some(e);
                    }
                } else if engine.is_some() && leads != Some(term) {
                    // Not the leader any more, or leader again in a later term without this
                    // engine having noticed: stop; a new engine resumes under the new term.
                    step_down(&mut engine, &mut waiters, &mut epoch);
                } else if let Some(e) = engine.as_mut() {
                    outputs = e.handle(Input::Tick(start.elapsed().as_millis() as u64));
                    if let Ok(mut l) = load.lock() {
                        *l = (e.queued() as u64, e.in_flight() as u64);
                    }
                    florin_obs::metrics::global()
                        .twopc_in_flight
                        .set(i64::try_from(e.in_flight()).unwrap_or(i64::MAX));
                }
            }
        }
        for o in outputs {
            match o {
                Output::Replicate(entry) => {
                    let (replica, tx) = (replica.clone(), tx.clone());
                    tokio::spawn(async move {
                        let msg = match replica.write(encode(&entry)).await {
                            Ok(_) => EngineMsg::Input(epoch, Input::Replicated(entry)),
                            Err(_) => EngineMsg::StepDown(epoch),
                        };
                        let _ = tx.send(msg);
                    });
                }
                Output::Send { shard, by, cmd } => {
                    let Some(client) = shards.get(shard as usize).cloned() else {
                        continue;
                    };
                    let tx = tx.clone();
                    let dtx = cmd.dtx();
                    // Give up a little before the engine resends, so calls rarely overlap.
                    let patience = Duration::from_millis(cfg.resend_after * 3 / 4);
                    let commits = matches!(&cmd, ShardCmd::Commit { commit, .. } if commit.iter().any(|c| *c));
                    tokio::spawn(async move {
                        if let Ok(Response::Shard(reply)) = client
                            .call_async(Request::Fenced(Fenced { by, cmd }), patience)
                            .await
                        {
                            if let (true, ShardReply::Refused(why)) = (commits, &reply) {
                                // A logged commit the shard will not take: other shards may
                                // have applied it, so it cannot be undone and is resent; the
                                // operator must look.
                                let _ = tx.send(EngineMsg::Alert(
                                    dtx,
                                    shard,
                                    format!("shard {shard} refused the commit of batch {dtx:032x}: {why} (resent until it is taken)"),
                                ));
                            }
                            let _ = tx
                                .send(EngineMsg::Input(epoch, Input::Reply { dtx, shard, reply }));
                        }
                    });
                }
                Output::Answer { ticket, outcomes } => {
                    if let Some(w) = waiters.remove(&ticket) {
                        let _ = w.send(Ok(outcomes));
                    }
                }
                Output::Fail { ticket, why } => {
                    if let Some(w) = waiters.remove(&ticket) {
                        let _ = w.send(Err(Failed::Refused(why)));
                    }
                }
                Output::Alert { dtx, shard, why } => {
                    alert(group, &alerts, &mut alerted, dtx, shard, why);
                }
            }
        }
    }
}

fn step_down(
    engine: &mut Option<Coordinator>,
    waiters: &mut HashMap<Ticket, oneshot::Sender<Answer>>,
    epoch: &mut u64,
) {
    if let Some(mut e) = engine.take() {
        // A replica that does not lead has nothing in flight.
        florin_obs::metrics::global().twopc_in_flight.set(0);
        for t in e.abandon() {
            if let Some(w) = waiters.remove(&t) {
                let _ = w.send(Err(Failed::Retry(
                    "the coordinator lost leadership; retry".into(),
                )));
            }
        }
    }
    for (_, w) in waiters.drain() {
        let _ = w.send(Err(Failed::Retry(
            "the coordinator lost leadership; retry".into(),
        )));
    }
    *epoch += 1;
}

//! A key-management node's ECDSA P-256 half (CGGMP24, `florin_custody::ecdsa`).
//!
//! - **Primes** for the node's Paillier key are generated in a background thread when the node
//!   has neither primes nor auxiliary information, and stored sealed (`ecdsa/primes.sealed`):
//!   minutes of CPU at the production level, never on a request path. They are deleted once an
//!   auxiliary-information run that used them has been stored.
//! - **Auxiliary information** (`ecdsa/aux.sealed`) is made once per network with every node;
//!   every ECDSA key reuses it.
//! - **Key shares** (`shares/K.p256`) are sealed like FROST shares, fsynced before the node
//!   reports the key.
//! - **Presignatures** stay in this process's memory only: a presignature used twice reveals
//!   the key, and a restart must not bring back one that already signed. A restart loses them;
//!   the coordinator sees `stale` and makes new ones.
//!
//! Each protocol run lives on its own thread (the library's state machine is not `Send`); the
//! coordinator moves messages between nodes as signed envelopes, direct ones sealed to their
//! recipient, so the relay can neither read the secret shares nor forge a message.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use florin_crypto::{hash, LocalSigner, PublicKey};
use florin_custody::ecdsa::{
    self, AuxShare, CoreShare, InsecureTest, PresigPublic, Presignature, Primes, Production,
    SecurityLevel, Session, WireMsg,
};
use florin_custody::envelope::{Envelope, EVERYONE};
use florin_custody::wire::{EcdsaDone, EcdsaJob, EcdsaStatus, PendingKey};
use florin_custody::{vault, CustodyError, PartyId};
use rand::rngs::OsRng;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::NodeError;
use crate::keyfile::{sync_dir, write_private};

/// Presignatures a node keeps per key; the oldest is dropped beyond this.
pub const MAX_PRESIGS: usize = 4096;
/// ECDSA runs in progress at once.
const MAX_RUNS: usize = 64;
/// ECDSA runs one client key (not an administrator) may have in progress at once, so no
/// client holds more than half of a node's run slots and others are always served.
pub const MAX_RUNS_PER_CLIENT: usize = MAX_RUNS / 2;
/// A run nobody stepped for this long is dropped (its thread ends): an auxiliary-information
/// run, whose steps take tens of seconds at the production level, and the others.
const AUX_IDLE: Duration = Duration::from_secs(900);
const RUN_IDLE: Duration = Duration::from_secs(240);
/// Longest one step may compute, matching the coordinator's patience.
const AUX_STEP_LIMIT: Duration = Duration::from_secs(600);
const STEP_LIMIT: Duration = Duration::from_secs(120);
/// Run ids a node remembers, so none is ever run twice (the protocols' proofs assume a fresh
/// execution id).
const MAX_SEEN: usize = 1 << 16;

/// The ECDSA security level a network runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EcdsaLevel {
    /// 128-bit security, 1536-bit Paillier primes: minutes per node to generate.
    Production,
    /// 768-bit primes, for tests and demos only; **never for keys that hold value**.
    InsecureTest,
}

impl EcdsaLevel {
    /// The name used in configs and status.
    pub fn name(self) -> &'static str {
        match self {
            EcdsaLevel::Production => "production",
            EcdsaLevel::InsecureTest => "insecure-test",
        }
    }

    /// Parses [`EcdsaLevel::name`].
    pub fn parse(s: &str) -> Option<EcdsaLevel> {
        match s {
            "production" => Some(EcdsaLevel::Production),
            "insecure-test" => Some(EcdsaLevel::InsecureTest),
            _ => None,
        }
    }
}

struct EcdsaKey {
    core: Zeroizing<Vec<u8>>,
    /// [`CoreShare::identity`]: what a `Commit` names and what key creation answers.
    identity: Vec<u8>,
    presigs: Mutex<PresigStore>,
}

#[derive(Default)]
struct PresigStore {
    map: HashMap<[u8; 16], Presignature>,
    order: VecDeque<[u8; 16]>,
}

/// What a run's thread hands back when the run ends.
enum Out {
    Aux(Zeroizing<Vec<u8>>),
    Key(CoreShare),
    Presig(Box<Presignature>, PresigPublic),
    Sig([u8; 64]),
}

type StepResult = Result<(Vec<WireMsg>, Option<Out>), CustodyError>;
type Cmd = (Vec<WireMsg>, mpsc::SyncSender<StepResult>);

struct Run {
    tx: mpsc::Sender<Cmd>,
    /// The envelopes' session: the first half of the execution id, so envelopes of one run
    /// cannot be opened in another run or for another job.
    tag: [u8; 16],
    step: u8,
    /// A step is being computed: another request for this run meanwhile is refused.
    busy: bool,
    parties: Vec<PartyId>,
    job: EcdsaJob,
    last: Instant,
    /// The client that started it; `None` for an administrator (no per-client limit).
    client: Option<PublicKey>,
}

impl Run {
    fn idle_limit(&self) -> Duration {
        if self.job == EcdsaJob::Aux {
            AUX_IDLE
        } else {
            RUN_IDLE
        }
    }

    fn step_limit(&self) -> Duration {
        if self.job == EcdsaJob::Aux {
            AUX_STEP_LIMIT
        } else {
            STEP_LIMIT
        }
    }
}

#[derive(Default)]
struct Seen {
    set: std::collections::HashSet<[u8; 16]>,
    order: VecDeque<[u8; 16]>,
}

impl Seen {
    /// Records `s`; false if it was seen before.
    fn insert(&mut self, s: [u8; 16]) -> bool {
        if !self.set.insert(s) {
            return false;
        }
        self.order.push_back(s);
        if self.order.len() > MAX_SEEN {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// What a run's thread needs to build its session (all `Send`).
enum Spec {
    Aux { primes: Zeroizing<Vec<u8>> },
    Keygen { t: u16 },
    Presign(SignSpec),
    Sign(SignSpec, Vec<u8>),
}

struct SignSpec {
    signers: Vec<PartyId>,
    core: Zeroizing<Vec<u8>>,
    aux: Arc<Zeroizing<Vec<u8>>>,
}

/// The node's ECDSA state.
pub(super) struct EcdsaNode {
    level: EcdsaLevel,
    party: PartyId,
    n: u16,
    dir: PathBuf,
    kek: Zeroizing<[u8; 32]>,
    aux: RwLock<Option<Arc<Zeroizing<Vec<u8>>>>>,
    primes: Mutex<Option<Zeroizing<Vec<u8>>>>,
    generating: AtomicBool,
    keys: RwLock<HashMap<String, Arc<EcdsaKey>>>,
    /// Shares stored but not committed (`shares/NAME.p256-pending`); locked after `keys`.
    pending: Mutex<HashMap<String, Arc<EcdsaKey>>>,
    /// Committed keys whose share file is missing or damaged: key → why. They sign nothing;
    /// ECDSA shares are not rebuilt by repair yet.
    lost: RwLock<HashMap<String, String>>,
    runs: Mutex<HashMap<[u8; 16], Run>>,
    seen: Mutex<Seen>,
}

fn lock_err() -> CustodyError {
    CustodyError::Ecdsa("lock".into())
}

fn read_sealed(
    kek: &[u8; 32],
    name: &str,
    path: &Path,
) -> Result<Option<Zeroizing<Vec<u8>>>, NodeError> {
    match std::fs::read(path) {
        Ok(b) => vault::open(kek, name, &b)
            .map(|p| Some(Zeroizing::new(p.to_vec())))
            .map_err(|_| {
                NodeError::corrupt(format!(
                    "{}: damaged or sealed under another seal key ({} bytes)",
                    path.display(),
                    b.len()
                ))
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(NodeError::io_at(path, e)),
    }
}

fn write_sealed(kek: &[u8; 32], name: &str, path: &Path, plain: &[u8]) -> Result<(), CustodyError> {
    let sealed = vault::seal(kek, name, plain, &mut OsRng)?;
    write_private(path, &sealed)
        .map_err(|e| CustodyError::Ecdsa(format!("cannot store {}: {e}", path.display())))
}

fn share_name(key_id: &str, party: PartyId) -> String {
    format!("florin/custody/ecdsa-share/{key_id}/{party}")
}

/// A committed share's file, and a pending one's.
fn share_paths(dir: &Path, key_id: &str) -> (PathBuf, PathBuf) {
    let shares = dir.join("shares");
    (
        shares.join(format!("{key_id}.p256")),
        shares.join(format!("{key_id}.p256-pending")),
    )
}

/// The 32-byte execution id every party derives alike: it binds the run to its job, so a
/// relay cannot replay one run's messages into another.
fn execution_id(session: &[u8; 16], job: &EcdsaJob, n: u16) -> [u8; 32] {
    let tag = florin_custody::wire::encode(job);
    hash(
        "florin/custody/ecdsa/run/v1",
        &[session, &n.to_le_bytes(), &tag],
    )
}

impl EcdsaNode {
    /// Opens the node's ECDSA files under `dir` (`ecdsa/` and `shares/*.p256`).
    pub(super) fn open(
        level: EcdsaLevel,
        party: PartyId,
        n: u16,
        dir: &Path,
        kek: &[u8; 32],
    ) -> Result<EcdsaNode, NodeError> {
        let edir = dir.join("ecdsa");
        std::fs::create_dir_all(&edir).map_err(|e| NodeError::io_at(&edir, e))?;
        let aux = read_sealed(kek, &aux_name(party), &edir.join("aux.sealed"))?;
        if let Some(a) = &aux {
            let n_aux = match level {
                EcdsaLevel::Production => AuxShare::<Production>::from_bytes(a).map(|a| a.n()),
                EcdsaLevel::InsecureTest => AuxShare::<InsecureTest>::from_bytes(a).map(|a| a.n()),
            }
            .map_err(|e| NodeError::corrupt(format!("ecdsa/aux.sealed: {e} (level {level:?}?)")))?;
            if n_aux != n {
                return Err(NodeError::corrupt(format!(
                    "ecdsa/aux.sealed is for {n_aux} parties, the network has {n}"
                )));
            }
        }
        let primes = read_sealed(kek, &primes_name(party), &edir.join("primes.sealed"))?;
        let mut keys = HashMap::new();
        let mut pending = HashMap::new();
        let mut lost = HashMap::new();
        let shares = dir.join("shares");
        if let Ok(rd) = std::fs::read_dir(&shares) {
            for entry in rd {
                let path = entry.map_err(crate::error::IoError::from)?.path();
                let (Some(stem), Some(ext @ ("p256" | "p256-pending"))) = (
                    path.file_stem().and_then(|s| s.to_str()),
                    path.extension().and_then(|s| s.to_str()),
                ) else {
                    continue;
                };
                let opened = match read_sealed(kek, &share_name(stem, party), &path) {
                    Ok(Some(plain)) => CoreShare::from_bytes(&plain)
                        .map_err(|e| format!("damaged: {e} ({})", path.display()))
                        .and_then(|core| {
                            if core.party() != party || core.n() != n {
                                Err(format!(
                                    "a share of party {} of {}, not this node's ({})",
                                    core.party(),
                                    core.n(),
                                    path.display()
                                ))
                            } else {
                                Ok(core)
                            }
                        }),
                    Ok(None) => continue,
                    Err(NodeError::Corrupt(_)) => Err(format!(
                        "damaged or sealed under another seal key ({})",
                        path.display()
                    )),
                    Err(e) => return Err(e),
                };
                let core = match opened {
                    Ok(c) => c,
                    Err(why) if ext == "p256" => {
                        lost.insert(stem.to_string(), why);
                        continue;
                    }
                    Err(why) => {
                        eprintln!("custody node {party}: pending ECDSA share ignored: {why}");
                        continue;
                    }
                };
                let entry = Arc::new(key_entry(&core));
                if ext == "p256" {
                    keys.insert(stem.to_string(), entry);
                } else {
                    pending.insert(stem.to_string(), entry);
                }
            }
        }
        pending.retain(|k, _| !keys.contains_key(k));
        Ok(EcdsaNode {
            level,
            party,
            n,
            dir: dir.to_path_buf(),
            kek: Zeroizing::new(*kek),
            aux: RwLock::new(aux.map(Arc::new)),
            primes: Mutex::new(primes),
            generating: AtomicBool::new(false),
            keys: RwLock::new(keys),
            pending: Mutex::new(pending),
            lost: RwLock::new(lost),
            runs: Mutex::new(HashMap::new()),
            seen: Mutex::new(Seen::default()),
        })
    }

    fn edir(&self) -> PathBuf {
        self.dir.join("ecdsa")
    }

    /// Starts generating primes in the background if the node has neither primes nor
    /// auxiliary information. Returns at once.
    pub(super) fn ensure_primes(self: &Arc<Self>) {
        let have = self.aux.read().map(|a| a.is_some()).unwrap_or(true)
            || self.primes.lock().map(|p| p.is_some()).unwrap_or(true);
        if have || self.generating.swap(true, Ordering::SeqCst) {
            return;
        }
        let me = self.clone();
        let spawned = thread::Builder::new()
            .name("ecdsa-primes".into())
            .spawn(move || {
                let mut rng = ecdsa::session_rng();
                let bytes = Zeroizing::new(match me.level {
                    EcdsaLevel::Production => Primes::<Production>::generate(&mut rng).to_bytes(),
                    EcdsaLevel::InsecureTest => {
                        Primes::<InsecureTest>::generate(&mut rng).to_bytes()
                    }
                });
                let path = me.edir().join("primes.sealed");
                match write_sealed(&me.kek, &primes_name(me.party), &path, &bytes) {
                    Ok(()) => {
                        if let Ok(mut p) = me.primes.lock() {
                            *p = Some(bytes);
                        }
                    }
                    Err(e) => eprintln!("custody node {}: {e}", me.party),
                }
                me.generating.store(false, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.generating.store(false, Ordering::SeqCst);
        }
    }

    /// Whether a key of this name exists.
    pub(super) fn has_key(&self, key_id: &str) -> bool {
        self.keys
            .read()
            .map(|k| k.contains_key(key_id))
            .unwrap_or(false)
    }

    /// Whether a committed key of this name is lost (its share missing or damaged).
    pub(super) fn is_lost(&self, key_id: &str) -> bool {
        self.lost
            .read()
            .map(|l| l.contains_key(key_id))
            .unwrap_or(false)
    }

    /// Marks a committed key lost (the node's record names it, its file is missing).
    pub(super) fn mark_lost(&self, key_id: &str, why: String) {
        if let Ok(mut l) = self.lost.write() {
            l.insert(key_id.to_string(), why);
        }
    }

    /// Committed keys, served or lost.
    pub(super) fn committed_and_lost(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .keys
            .read()
            .map(|k| k.keys().cloned().collect())
            .unwrap_or_default();
        if let Ok(l) = self.lost.read() {
            out.extend(l.keys().cloned());
        }
        out
    }

    /// The pending keys, for `Status`.
    pub(super) fn pending_keys(&self) -> Vec<PendingKey> {
        self.pending
            .lock()
            .map(|p| {
                p.iter()
                    .map(|(id, e)| PendingKey {
                        key_id: id.clone(),
                        ecdsa: true,
                        public: e.identity.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether a committed ECDSA key of this name is `identity`: `None` if there is no
    /// committed key of the name.
    pub(super) fn committed_as(&self, key_id: &str, identity: &[u8]) -> Option<bool> {
        self.keys
            .read()
            .ok()?
            .get(key_id)
            .map(|e| e.identity == identity)
    }

    /// [`Request::Commit`](florin_custody::wire::Request::Commit) of a pending ECDSA key:
    /// `false` when no pending key of the name is `identity`.
    pub(super) fn commit(&self, key_id: &str, identity: &[u8]) -> Result<bool, CustodyError> {
        let mut keys = self.keys.write().map_err(|_| lock_err())?;
        let mut pending = self.pending.lock().map_err(|_| lock_err())?;
        if pending.get(key_id).map(|e| e.identity == identity) != Some(true) {
            return Ok(false);
        }
        let (done, waiting) = share_paths(&self.dir, key_id);
        std::fs::rename(&waiting, &done)
            .map_err(|e| CustodyError::Ecdsa(format!("cannot commit the share: {e}")))?;
        if let Some(e) = pending.remove(key_id) {
            keys.insert(key_id.to_string(), e);
        }
        drop(pending);
        drop(keys);
        // Committed in memory once renamed: a failed sync is reported, and a retry finds the
        // key committed.
        sync_dir(&done)
            .map_err(|e| CustodyError::Ecdsa(format!("cannot commit the share: {e}")))?;
        Ok(true)
    }

    /// Forgets a pending key of this name (another scheme's key of the name was committed).
    pub(super) fn drop_pending(&self, key_id: &str) {
        if let Ok(mut p) = self.pending.lock() {
            if p.remove(key_id).is_some() {
                let _ = std::fs::remove_file(share_paths(&self.dir, key_id).1);
            }
        }
    }

    /// For `Status`.
    pub(super) fn status(&self) -> EcdsaStatus {
        let mut keys: Vec<(String, Vec<u8>, u64)> = self
            .keys
            .read()
            .map(|k| {
                k.iter()
                    .map(|(id, e)| {
                        let held = e.presigs.lock().map(|p| p.map.len() as u64).unwrap_or(0);
                        (id.clone(), e.identity.clone(), held)
                    })
                    .collect()
            })
            .unwrap_or_default();
        keys.sort();
        EcdsaStatus {
            level: self.level.name().into(),
            aux_ready: self.aux.read().map(|a| a.is_some()).unwrap_or(false),
            primes_ready: self.primes.lock().map(|p| p.is_some()).unwrap_or(false),
            keys,
        }
    }

    fn key(&self, key_id: &str) -> Result<Arc<EcdsaKey>, CustodyError> {
        if let Some(why) = self.lost.read().ok().and_then(|l| l.get(key_id).cloned()) {
            return Err(CustodyError::BadParameters(format!(
                "node {} cannot use ECDSA key {key_id}: its share is {why}; ECDSA shares are not \
                 rebuilt by repair yet — restore the file from a backup",
                self.party
            )));
        }
        self.keys
            .read()
            .map_err(|_| lock_err())?
            .get(key_id)
            .cloned()
            .ok_or_else(|| CustodyError::BadParameters(format!("no ECDSA key {key_id}")))
    }

    fn aux(&self) -> Result<Arc<Zeroizing<Vec<u8>>>, CustodyError> {
        self.aux
            .read()
            .map_err(|_| lock_err())?
            .clone()
            .ok_or_else(|| {
                CustodyError::BadParameters(
                    "no ECDSA auxiliary information yet: run `florin custody ecdsa-setup`".into(),
                )
            })
    }

    /// Starts this node's part of `job`; `frost_has` tells whether a FROST key has the name
    /// (one namespace for both schemes).
    pub(super) fn start(
        &self,
        session: [u8; 16],
        job: EcdsaJob,
        frost_has: bool,
        client: Option<PublicKey>,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let (spec, parties) = match &job {
            EcdsaJob::Aux => {
                // A run that finished at only some nodes can be repeated until the first key
                // uses the auxiliary information (the primes are kept until then).
                let has_keys = !self.keys.read().map_err(|_| lock_err())?.is_empty()
                    || !self.pending.lock().map_err(|_| lock_err())?.is_empty();
                if self.aux.read().map_err(|_| lock_err())?.is_some() && has_keys {
                    return Err(CustodyError::BadParameters(
                        "auxiliary information already made and in use by keys (a refresh is \
                         not built)"
                            .into(),
                    ));
                }
                let primes = self.primes.lock().map_err(|_| lock_err())?.clone();
                let Some(primes) = primes else {
                    return Err(CustodyError::BadParameters(format!(
                        "party {}: primes not ready yet (generating in the background; \
                         minutes at the production level)",
                        self.party
                    )));
                };
                (Spec::Aux { primes }, (1..=self.n).collect::<Vec<_>>())
            }
            EcdsaJob::Keygen { key_id, t } => {
                if !super::node::valid_key_id(key_id) {
                    return Err(CustodyError::BadParameters(format!("key name {key_id:?}")));
                }
                if frost_has || self.has_key(key_id) {
                    return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
                }
                if *t < 2 || *t > self.n {
                    return Err(CustodyError::BadParameters(format!(
                        "threshold {t} of {}",
                        self.n
                    )));
                }
                (Spec::Keygen { t: *t }, (1..=self.n).collect())
            }
            EcdsaJob::Presign { key_id, signers } => {
                let spec = self.sign_spec(key_id, signers)?;
                let parties = spec.signers.clone();
                (Spec::Presign(spec), parties)
            }
            EcdsaJob::Sign {
                key_id,
                signers,
                message,
            } => {
                let spec = self.sign_spec(key_id, signers)?;
                let parties = spec.signers.clone();
                (Spec::Sign(spec, message.clone()), parties)
            }
        };
        let eid = execution_id(&session, &job, self.n);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&eid[..16]);
        let (tx, limit) = {
            let mut runs = self.runs.lock().map_err(|_| lock_err())?;
            runs.retain(|_, r| r.busy || r.last.elapsed() < r.idle_limit());
            if runs.len() >= MAX_RUNS {
                return Err(CustodyError::BadParameters(
                    "too many ECDSA runs in progress".into(),
                ));
            }
            if let Some(c) = &client {
                let own = runs
                    .values()
                    .filter(|r| r.client.as_ref() == Some(c))
                    .count();
                if own >= MAX_RUNS_PER_CLIENT {
                    return Err(CustodyError::BadParameters(format!(
                        "this client has {own} ECDSA runs in progress, the most one client \
                         may have (finish or abort one)"
                    )));
                }
            }
            // One auxiliary-information run, and one key generation per name, at a time.
            if runs.values().any(|r| match (&r.job, &job) {
                (EcdsaJob::Aux, EcdsaJob::Aux) => true,
                (EcdsaJob::Keygen { key_id: a, .. }, EcdsaJob::Keygen { key_id: b, .. }) => a == b,
                _ => false,
            }) {
                return Err(CustodyError::BadParameters(
                    "the same setup or key generation is already running".into(),
                ));
            }
            if !self.seen.lock().map_err(|_| lock_err())?.insert(session) {
                return Err(CustodyError::OutOfOrder(
                    "this run id was used before (a run id is used once)".into(),
                ));
            }
            let tx = spawn_run(self.level, eid, self.party, self.n, spec)?;
            let run = Run {
                tx: tx.clone(),
                tag,
                step: 0,
                busy: true,
                parties,
                job: job.clone(),
                last: Instant::now(),
                client,
            };
            let limit = run.step_limit();
            runs.insert(session, run);
            (tx, limit)
        };
        let r = self.drive(&tx, Vec::new(), limit);
        self.idle(&session, 0);
        self.after_step(session, tag, 0, &job, r, identity, members)
    }

    /// Ends run `session` at once (the coordinator gave up on it). Runs of key generation
    /// and auxiliary information only for an administrator.
    /// Ends run `session`, if `may` allows its job to the asking client.
    pub(super) fn abort(
        &self,
        session: &[u8; 16],
        may: &dyn Fn(&EcdsaJob) -> Result<(), CustodyError>,
    ) -> Result<(), CustodyError> {
        let mut runs = self.runs.lock().map_err(|_| lock_err())?;
        if let Some(r) = runs.get(session) {
            may(&r.job)?;
            runs.remove(session);
        }
        Ok(())
    }

    fn sign_spec(&self, key_id: &str, signers: &[PartyId]) -> Result<SignSpec, CustodyError> {
        let k = self.key(key_id)?;
        let mut sorted = signers.to_vec();
        sorted.sort_unstable();
        Ok(SignSpec {
            signers: sorted,
            core: k.core.clone(),
            aux: self.aux()?,
        })
    }

    /// The next step of run `session`. Runs of key generation and auxiliary information
    /// are stepped by administrators only, like they are started.
    pub(super) fn step(
        &self,
        session: [u8; 16],
        incoming: Vec<Envelope>,
        may: &dyn Fn(&EcdsaJob) -> Result<(), CustodyError>,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let (tag, step, parties, job, tx, limit) = {
            let mut runs = self.runs.lock().map_err(|_| lock_err())?;
            let run = runs
                .get_mut(&session)
                .ok_or_else(|| CustodyError::OutOfOrder("no ECDSA run with this session".into()))?;
            may(&run.job)?;
            if run.busy {
                return Err(CustodyError::OutOfOrder(
                    "this run is computing a step already".into(),
                ));
            }
            if run.step == u8::MAX {
                return Err(CustodyError::OutOfOrder("run too long".into()));
            }
            run.busy = true;
            run.last = Instant::now();
            (
                run.tag,
                run.step,
                run.parties.clone(),
                run.job.clone(),
                run.tx.clone(),
                run.step_limit(),
            )
        };
        let mut msgs = Vec::with_capacity(incoming.len());
        for e in &incoming {
            match self.open_one(e, &tag, step, &parties, identity, members) {
                Ok(m) => msgs.push(m),
                Err(err) => {
                    // Fail closed: a run that saw a bad message ends.
                    self.forget(&session);
                    return Err(err);
                }
            }
        }
        let r = self.drive(&tx, msgs, limit);
        self.idle(&session, step + 1);
        self.after_step(session, tag, step + 1, &job, r, identity, members)
    }

    /// Marks run `session` as done computing, waiting for the messages of step `step`.
    fn idle(&self, session: &[u8; 16], step: u8) {
        if let Ok(mut runs) = self.runs.lock() {
            if let Some(run) = runs.get_mut(session) {
                run.step = step;
                run.busy = false;
                run.last = Instant::now();
            }
        }
    }

    /// Checks and opens one incoming envelope of step `step` of the run tagged `tag`.
    fn open_one(
        &self,
        e: &Envelope,
        tag: &[u8; 16],
        step: u8,
        parties: &[PartyId],
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<WireMsg, CustodyError> {
        if e.from == self.party || !parties.contains(&e.from) {
            return Err(CustodyError::BadParameters(format!(
                "message from party {}, not another party of this run",
                e.from
            )));
        }
        let k = members.get(&e.from).ok_or_else(|| {
            CustodyError::BadParameters(format!("message from unknown party {}", e.from))
        })?;
        // The coordinator checked the sender's signature when it took the envelope from the
        // sender; a signature broken since then was broken on the way, by no party of the run.
        if !e.verify(k) {
            return Err(CustodyError::Inconsistent(format!(
                "the message from party {} does not carry its signature (altered in transit)",
                e.from
            )));
        }
        let body = e.open(tag, step, self.party, k, identity.secret())?;
        Ok(WireMsg {
            from: e.from,
            to: (e.to != EVERYONE).then_some(self.party),
            body,
        })
    }

    fn drive(&self, tx: &mpsc::Sender<Cmd>, msgs: Vec<WireMsg>, limit: Duration) -> StepResult {
        let (rtx, rrx) = mpsc::sync_channel(1);
        tx.send((msgs, rtx))
            .map_err(|_| CustodyError::Ecdsa("the run has ended".into()))?;
        rrx.recv_timeout(limit)
            .map_err(|_| CustodyError::Ecdsa("the run's step did not finish".into()))?
    }

    /// Wraps a step's messages in envelopes and, when the run finished, stores its result.
    #[allow(clippy::too_many_arguments)]
    fn after_step(
        &self,
        session: [u8; 16],
        tag: [u8; 16],
        step: u8,
        job: &EcdsaJob,
        r: StepResult,
        identity: &LocalSigner,
        members: &HashMap<PartyId, PublicKey>,
    ) -> Result<(Vec<Envelope>, Option<EcdsaDone>), CustodyError> {
        let (out, done) = match r {
            Ok(x) => x,
            Err(e) => {
                self.forget(&session);
                return Err(e);
            }
        };
        let mut envs = Vec::with_capacity(out.len());
        for m in out {
            envs.push(match m.to {
                None => Envelope::broadcast(identity, tag, step, self.party, m.body)?,
                Some(to) => {
                    let k = members
                        .get(&to)
                        .ok_or_else(|| CustodyError::BadParameters(format!("party {to}")))?;
                    Envelope::direct(identity, tag, step, self.party, to, k, &m.body, &mut OsRng)?
                }
            });
        }
        let Some(out) = done else {
            return Ok((envs, None));
        };
        self.forget(&session);
        let done = match (out, job) {
            (Out::Aux(bytes), _) => {
                self.store_aux(bytes)?;
                EcdsaDone::Aux
            }
            (Out::Key(core), EcdsaJob::Keygen { key_id, .. }) => {
                EcdsaDone::Key(self.store_key(key_id, &core)?)
            }
            (Out::Presig(presig, public), EcdsaJob::Presign { key_id, .. }) => {
                let k = self.key(key_id)?;
                let mut store = k.presigs.lock().map_err(|_| lock_err())?;
                if store.map.insert(session, *presig).is_none() {
                    store.order.push_back(session);
                }
                while store.order.len() > MAX_PRESIGS {
                    if let Some(old) = store.order.pop_front() {
                        store.map.remove(&old);
                    }
                }
                EcdsaDone::Presig(public.to_bytes())
            }
            (Out::Sig(sig), _) => EcdsaDone::Signature(sig.to_vec()),
            _ => {
                return Err(CustodyError::Ecdsa(
                    "a run ended with another job's result".into(),
                ))
            }
        };
        Ok((envs, Some(done)))
    }

    fn forget(&self, session: &[u8; 16]) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(session);
        }
    }

    fn store_aux(&self, bytes: Zeroizing<Vec<u8>>) -> Result<(), CustodyError> {
        let mut aux = self.aux.write().map_err(|_| lock_err())?;
        write_sealed(
            &self.kek,
            &aux_name(self.party),
            &self.edir().join("aux.sealed"),
            &bytes,
        )?;
        *aux = Some(Arc::new(bytes));
        // The primes stay until the first key uses this auxiliary information: a run that
        // finished at only some nodes can then be repeated.
        Ok(())
    }

    /// The primes are inside the stored Paillier key; once a key depends on the auxiliary
    /// information the loose copy goes.
    fn drop_primes(&self) {
        if let Ok(mut p) = self.primes.lock() {
            if p.take().is_some() {
                let _ = std::fs::remove_file(self.edir().join("primes.sealed"));
            }
        }
    }

    /// Stores a new share durably (sealed, fsynced) as *pending* before it is reported; it
    /// signs nothing until committed. A pending share of the same name is replaced.
    /// Answers the key's identity ([`CoreShare::identity`]).
    fn store_key(&self, key_id: &str, core: &CoreShare) -> Result<Vec<u8>, CustodyError> {
        if core.party() != self.party || core.n() != self.n {
            return Err(CustodyError::BadParameters(format!(
                "share for party {} of {}, this is party {} of {}",
                core.party(),
                core.n(),
                self.party,
                self.n
            )));
        }
        let keys = self.keys.write().map_err(|_| lock_err())?;
        let bytes = Zeroizing::new(core.to_bytes());
        if let Some(e) = keys.get(key_id) {
            if e.core[..] == bytes[..] {
                return Ok(e.identity.clone());
            }
            return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
        }
        let mut pending = self.pending.lock().map_err(|_| lock_err())?;
        if let Some(e) = pending.get(key_id) {
            if e.core[..] == bytes[..] {
                return Ok(e.identity.clone());
            }
        }
        write_sealed(
            &self.kek,
            &share_name(key_id, self.party),
            &share_paths(&self.dir, key_id).1,
            &bytes,
        )?;
        let entry = key_entry(core);
        let identity = entry.identity.clone();
        pending.insert(key_id.to_string(), Arc::new(entry));
        drop(pending);
        drop(keys);
        self.drop_primes();
        Ok(identity)
    }

    /// Key import: a dealer's share.
    pub(super) fn import(
        &self,
        key_id: &str,
        share: &[u8],
        frost_has: bool,
    ) -> Result<Vec<u8>, CustodyError> {
        if !super::node::valid_key_id(key_id) || frost_has {
            return Err(CustodyError::BadParameters(format!(
                "key name {key_id:?} invalid or taken"
            )));
        }
        let core = CoreShare::from_bytes(share)?;
        self.store_key(key_id, &core)
    }

    /// Key addition (R5): this node's share of `from` plus the whole key `addend`, stored as
    /// `key_id`. `from` stays as it was.
    pub(super) fn add_key(
        &self,
        key_id: &str,
        from: &str,
        addend: &[u8],
        frost_has: bool,
    ) -> Result<Vec<u8>, CustodyError> {
        if !super::node::valid_key_id(key_id) || frost_has {
            return Err(CustodyError::BadParameters(format!(
                "key name {key_id:?} invalid or taken"
            )));
        }
        let addend = Zeroizing::new(
            <[u8; 32]>::try_from(addend)
                .map_err(|_| CustodyError::BadParameters("the addend must be 32 bytes".into()))?,
        );
        let core = CoreShare::from_bytes(&self.key(from)?.core)?;
        let sum = ecdsa::add_key(&core, &addend)?;
        self.store_key(key_id, &sum)
    }

    /// Key export: this node's share.
    pub(super) fn export(&self, key_id: &str) -> Result<Vec<u8>, CustodyError> {
        Ok(self.key(key_id)?.core.to_vec())
    }

    /// A partial signature from a presignature, which is forgotten first.
    pub(super) fn partial(
        &self,
        key_id: &str,
        presig: [u8; 16],
        message: &[u8],
    ) -> Result<Vec<u8>, CustodyError> {
        let k = self.key(key_id)?;
        let p = {
            let mut store = k.presigs.lock().map_err(|_| lock_err())?;
            let p = store.map.remove(&presig);
            if p.is_some() {
                store.order.retain(|s| *s != presig);
            }
            p
        };
        let Some(p) = p else {
            let mut id = [0u8; 8];
            id.copy_from_slice(&presig[..8]);
            return Err(CustodyError::UnknownNonce(u64::from_le_bytes(id)));
        };
        Ok(ecdsa::partial_sign(self.party, p, message).to_bytes())
    }
}

fn aux_name(party: PartyId) -> String {
    format!("florin/custody/ecdsa-aux/{party}")
}

fn primes_name(party: PartyId) -> String {
    format!("florin/custody/ecdsa-primes/{party}")
}

fn key_entry(core: &CoreShare) -> EcdsaKey {
    EcdsaKey {
        core: Zeroizing::new(core.to_bytes()),
        identity: core.identity(),
        presigs: Mutex::new(PresigStore::default()),
    }
}

/// A run's session, whatever its output.
enum AnySession<L: SecurityLevel> {
    Aux(Session<AuxShare<L>>),
    Key(Session<CoreShare>),
    Presig(Session<(Presignature, PresigPublic)>),
    Sig(Session<[u8; 64]>),
}

impl<L: SecurityLevel> AnySession<L> {
    fn build(eid: [u8; 32], me: PartyId, n: u16, spec: Spec) -> Result<Self, CustodyError> {
        let share = |s: &SignSpec| {
            ecdsa::KeyShare::<L>::from_parts(
                CoreShare::from_bytes(&s.core)?,
                AuxShare::<L>::from_bytes(&s.aux)?,
            )
        };
        Ok(match spec {
            Spec::Aux { primes } => AnySession::Aux(ecdsa::aux_session::<L>(
                eid,
                me,
                n,
                Primes::<L>::from_bytes(&primes)?,
            )?),
            Spec::Keygen { t } => AnySession::Key(ecdsa::keygen_session::<L>(eid, me, n, t)?),
            Spec::Presign(s) => {
                let ks = share(&s)?;
                AnySession::Presig(ecdsa::presign_session(eid, &s.signers, ks)?)
            }
            Spec::Sign(s, message) => {
                let ks = share(&s)?;
                AnySession::Sig(ecdsa::sign_session(eid, &s.signers, ks, &message)?)
            }
        })
    }

    fn step(&mut self, incoming: Vec<WireMsg>) -> StepResult {
        Ok(match self {
            AnySession::Aux(s) => {
                let st = s.step(incoming)?;
                (
                    st.out,
                    st.done.map(|a| Out::Aux(Zeroizing::new(a.to_bytes()))),
                )
            }
            AnySession::Key(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(Out::Key))
            }
            AnySession::Presig(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(|(p, q)| Out::Presig(Box::new(p), q)))
            }
            AnySession::Sig(s) => {
                let st = s.step(incoming)?;
                (st.out, st.done.map(Out::Sig))
            }
        })
    }
}

fn spawn_run(
    level: EcdsaLevel,
    eid: [u8; 32],
    me: PartyId,
    n: u16,
    spec: Spec,
) -> Result<mpsc::Sender<Cmd>, CustodyError> {
    let (tx, rx) = mpsc::channel::<Cmd>();
    let spawned = thread::Builder::new()
        .name("ecdsa-run".into())
        .spawn(move || match level {
            EcdsaLevel::Production => run_thread::<Production>(eid, me, n, spec, rx),
            EcdsaLevel::InsecureTest => run_thread::<InsecureTest>(eid, me, n, spec, rx),
        });
    spawned.map_err(|e| CustodyError::Ecdsa(format!("cannot start a run: {e}")))?;
    Ok(tx)
}

/// One run: builds the session on this thread, then steps it once per command until it ends,
/// fails, or its node forgets it (the sender is dropped) or stops stepping it.
fn run_thread<L: SecurityLevel>(
    eid: [u8; 32],
    me: PartyId,
    n: u16,
    spec: Spec,
    rx: mpsc::Receiver<Cmd>,
) {
    let mut session = match AnySession::<L>::build(eid, me, n, spec) {
        Ok(s) => s,
        Err(e) => {
            if let Ok((_, reply)) = rx.recv_timeout(RUN_IDLE) {
                let _ = reply.send(Err(e));
            }
            return;
        }
    };
    while let Ok((incoming, reply)) = rx.recv_timeout(RUN_IDLE) {
        let r = session.step(incoming);
        let end = !matches!(r, Ok((_, None)));
        let _ = reply.send(r);
        if end {
            return;
        }
    }
}

//! A key-management node: holds one share of each threshold key, encrypted at rest, and
//! answers an authorised coordinator over a Noise channel (`florin-net`): distributed key
//! generation, import, nonce commitments, signature shares, export.
//!
//! Who may ask what: keys listed as `clients` may read status, take nonce commitments and ask
//! for signature shares (of every key, or of the keys their `grants` entry names); keys
//! listed as `admins` may also create, import and export keys, and use every key. Any other
//! peer is dropped after the handshake.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use florin_crypto::{LocalSigner, PublicKey, Signer};
use florin_custody::envelope::{check_echoes, Attestation, Envelope};
use florin_custody::frost::{
    self, DkgParty, GroupKey, KeyShare, NonceHedge, NoncePool, SigningPackage,
};
use florin_custody::wire::{
    self, DkgEcho, EcdsaJob, Refusal, Request, Response, MAX_COMMITMENTS, MAX_WIRE,
};
use florin_custody::{vault, CustodyError, PartyId};
use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::node_ecdsa::{EcdsaLevel, EcdsaNode};
use crate::error::NodeError;
use crate::keyfile::{load_or_create_key, sync_dir, write_private};

mod access;
mod customers;
mod handle;
mod serve;
mod shares;

use access::*;
pub use access::{KeyPattern, CONFIG_POLL};
use customers::Customers;
pub use customers::MAX_LIVE_PAYMENTS;
use handle::*;
use serve::*;
use shares::*;

/// Most FROST nonces a node keeps ready. One pool serves every key (a nonce is not tied to
/// a key; see `NonceHedge`), so its size follows the node's signing rate: the target starts
/// at [`NONCE_POOL_START`] and doubles whenever a request finds the pool too short to
/// answer (and halves after a quiet 30 s window), and thousands of idle custodial keys
/// cost nothing. A nonce costs two scalar
/// multiplications (≈ 65 µs here), so a full pool is about half a second of one core.
pub const NONCE_POOL_TARGET: usize = 8192;
/// The nonce pool's first target.
pub const NONCE_POOL_START: usize = 1024;
/// Handed-out nonces a node remembers before dropping the oldest.
const MAX_ISSUED: usize = 1 << 17;
/// Concurrent authenticated connections (clients and admins) a node serves.
const MAX_CONNECTIONS: usize = 256;
/// Connections still in the Noise handshake, counted apart so that unauthenticated peers
/// cannot crowd out the coordinator: when all slots are taken, the oldest handshake is cut.
/// A flood must then open this many connections within one honest handshake (a round trip
/// and a few scalar multiplications) to cut it.
const MAX_HANDSHAKES: usize = 64;
/// Longest a peer may take over its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(3);
/// Longest a peer may take to read an answer.
const WRITE_DEADLINE: Duration = Duration::from_secs(30);
/// Concurrent key generations in progress, and how long one may take.
const MAX_DKG_RUNS: usize = 64;
const DKG_DEADLINE: Duration = Duration::from_secs(300);
/// An idle connection is closed after this.
const IDLE: Duration = Duration::from_secs(600);

/// One member of the network, as every node's config lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Member {
    /// Party number, 1 to n.
    pub party: PartyId,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its identity key (`eur1…`).
    pub key: String,
}

/// A node's configuration file (`node.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CustodyNodeConfig {
    /// This node's party number.
    pub party: PartyId,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Directory holding `identity.key`, `shares/` and (unless `seal_key` says otherwise)
    /// `seal.key`.
    pub dir: PathBuf,
    /// The key-encryption key's file; keep it on another medium than the shares in
    /// production (a TPM-sealed or mounted secret).
    #[serde(default)]
    pub seal_key: Option<PathBuf>,
    /// Threshold of keys made by DKG on this network.
    pub t: u16,
    /// Every member, this node included.
    pub members: Vec<Member>,
    /// Keys allowed to take commitments and signature shares.
    pub clients: Vec<String>,
    /// Keys allowed to create, import and export keys.
    pub admins: Vec<String>,
    /// Per-client key rights: a client key (`eur1…`) → the key names it may sign with (FROST
    /// signature shares, ECDSA presignatures and signatures). Each entry is a whole name or a
    /// prefix ending in `*` (`psp-a-*`; `*` alone is every key). A client without an entry
    /// may use every key, as before grants existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub grants: BTreeMap<String, Vec<String>>,
    /// Whether the node runs ECDSA P-256 (CGGMP24), and at which security level. Off when
    /// absent: a production node spends minutes of CPU on its Paillier primes first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecdsa: Option<EcdsaLevel>,
    /// Where `florin custody node` serves `/metrics` and `/v1/health` (plain HTTP; `custody
    /// up` assigns a loopback port). None: no metrics listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<SocketAddr>,
}

impl CustodyNodeConfig {
    /// Reads a `node.json`.
    pub fn load(path: &Path) -> Result<Self, NodeError> {
        let s = std::fs::read_to_string(path).map_err(|e| NodeError::io_at(path, e))?;
        serde_json::from_str(&s).map_err(|e| {
            crate::error::BadRequest::Config {
                path: path.into(),
                source: Box::new(e),
            }
            .into()
        })
    }
}

struct KeyEntry {
    share: KeyShare,
    /// `GroupKey::digest` of the share's group: what a `Sign` request must name.
    digest: [u8; 32],
}

/// The node's FROST nonces, for all its keys.
struct Nonces {
    hedge: NonceHedge,
    pool: Mutex<NoncePool>,
    /// How many ready nonces the refill keeps.
    target: AtomicUsize,
    /// The fewest ready nonces left after a hand-out since the last look (`usize::MAX`:
    /// none handed out), for shrinking the target when demand drops.
    low_water: AtomicUsize,
}

/// How often the refill looks at the demand since its last look.
const DEMAND_WINDOW: Duration = Duration::from_secs(30);

/// The nonce pool's next target: halved (not below [`NONCE_POOL_START`]) when a whole window
/// left at least half of it unused (`low_water`: the fewest ready nonces seen after a
/// hand-out, `usize::MAX` if none), else kept. Growth happens on demand, in the request.
fn next_target(target: usize, low_water: usize) -> usize {
    if low_water >= target / 2 {
        (target / 2).max(NONCE_POOL_START)
    } else {
        target
    }
}

/// Envelope steps of a share repair (apart from key generation's 1 to 3). A sigma travels with
/// the helper's customer binding of the key (step 23; step 22, a sigma alone, is retired: a
/// repair through a node from before is refused as out of order).
const REPAIR_DELTA: u8 = 21;
const REPAIR_SIGMA: u8 = 23;
/// A DKLs23 repair term, with the helper's customer binding, sealed to the target.
const DKLS_REPAIR_TERM: u8 = 25;

/// A helper's share repair between its two steps.
struct RepairRun {
    key_id: String,
    helpers: Vec<PartyId>,
    target: PartyId,
    /// The delta this helper keeps for itself.
    own: Zeroizing<Vec<u8>>,
    started: Instant,
}

struct DkgRun {
    party: DkgParty,
    started: Instant,
    /// Payload hashes of the round-1 broadcasts as this node got them, its own included.
    round1: BTreeMap<PartyId, [u8; 32]>,
    /// The same with their senders' signatures, for the echo.
    seen: Vec<Attestation>,
}

struct Inner {
    party: PartyId,
    n: u16,
    dir: PathBuf,
    identity: LocalSigner,
    kek: Zeroizing<[u8; 32]>,
    members: HashMap<PartyId, PublicKey>,
    /// Who may connect and what each may use: replaced whole when the config changes (see
    /// [`RunningNode::reload_access`]); `access_gen` counts the replacements, so open
    /// connections re-check their peer's rights at their next request.
    access: RwLock<Arc<Access>>,
    access_gen: AtomicU64,
    keys: RwLock<HashMap<String, Arc<KeyEntry>>>,
    nonces: Nonces,
    /// Shares stored but not committed (`shares/NAME.share-pending`): they sign nothing
    /// until [`Request::Commit`]. Locked after `keys` when both are.
    pending: Mutex<HashMap<String, KeyShare>>,
    /// Committed FROST keys whose share file is missing or damaged: key → why. They sign
    /// nothing until a repair stores their share again.
    lost: RwLock<HashMap<String, String>>,
    /// The record of committed keys (`keys.sealed`), as last written.
    record: Mutex<std::collections::BTreeMap<String, String>>,
    dkgs: Mutex<HashMap<[u8; 16], DkgRun>>,
    repairs: Mutex<HashMap<[u8; 16], RepairRun>>,
    ecdsa: Option<Arc<EcdsaNode>>,
    /// Customer keys bound to keys, and the payment ids their authorizations used.
    customers: Customers,
    stop: AtomicBool,
}

/// A key-management node.
pub struct CustodyNode {
    inner: Arc<Inner>,
}

/// Reports this node's pools at every scrape of the process's metrics, as
/// `florin_custody_pool_depth{pool="party<P>-<what>"}`: FROST nonces ready, keys held (FROST
/// and ECDSA), ECDSA presignatures held. One label set per party (a process holds a few at
/// most); the hook ends with the node.
fn export_pools(inner: &Arc<Inner>) {
    let weak = Arc::downgrade(inner);
    let party = inner.party;
    let labels = move |what: &str| florin_obs::metrics::PoolLabels {
        pool: format!("party{party}-{what}"),
    };
    const POOLS: [&str; 3] = ["nonces", "keys", "presignatures"];
    florin_obs::metrics::global().on_scrape(move || {
        let m = florin_obs::metrics::global();
        let live = weak
            .upgrade()
            .filter(|i| !i.stop.load(std::sync::atomic::Ordering::Relaxed));
        let Some(inner) = live else {
            // A stopped node reports nothing (not its last values). The hook itself stays,
            // a few bytes, in a process that starts many nodes (tests, benchmarks).
            for what in POOLS {
                m.custody_pool_depth.remove(&labels(what));
            }
            return;
        };
        let nonces = inner.nonces.pool.lock().map(|p| p.ready()).unwrap_or(0);
        let frost_keys = inner.keys.read().map(|k| k.len()).unwrap_or(0);
        let (ecdsa_keys, presignatures) = inner
            .ecdsa
            .as_ref()
            .map(|e| {
                let st = e.status();
                (st.keys.len(), st.keys.iter().map(|k| k.2).sum::<u64>())
            })
            .unwrap_or((0, 0));
        for (what, n) in POOLS.into_iter().zip([
            nonces as u64,
            (frost_keys + ecdsa_keys) as u64,
            presignatures,
        ]) {
            m.custody_pool_depth
                .get_or_create(&labels(what))
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    });
}

/// A node serving in background threads (tests, benchmarks, `devnet` in one process).
pub struct RunningNode {
    inner: Arc<Inner>,
    addr: SocketAddr,
    server: Option<florin_net::rpc::RpcServer>,
}

fn parse_keys(list: &[String], what: &str) -> Result<Vec<PublicKey>, NodeError> {
    list.iter()
        .map(|k| {
            PublicKey::parse(k).map_err(|source| {
                NodeError::from(crate::error::BadRequest::Key {
                    what: format!("{what} key {k}"),
                    source,
                })
            })
        })
        .collect()
}

/// Key names: short, and safe as file names.
pub fn valid_key_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Sealed files in `dir` (shares of either scheme, the key record, ECDSA set-up), for
/// deciding whether a missing seal key may be made: only for a node that holds nothing.
fn sealed_state(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in [dir.join("shares"), dir.join("ecdsa")] {
        if let Ok(rd) = std::fs::read_dir(&d) {
            out.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
        }
    }
    let record = super::manifest::path(dir);
    if record.exists() {
        out.push(record);
    }
    out
}

/// The key-encryption key; made only on a node that holds no sealed file yet (a lost seal
/// key is never replaced: every share sealed under it would be unreadable).
fn load_kek(path: &Path, dir: &Path) -> Result<Zeroizing<[u8; 32]>, NodeError> {
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let b = hex::decode(s.trim()).map_err(|_| {
                NodeError::corrupt(format!(
                    "{}: damaged: not hex (expected 64 hex digits)",
                    path.display()
                ))
            })?;
            let k: [u8; 32] = b.try_into().map_err(|_| {
                NodeError::corrupt(format!(
                    "{}: damaged: not 32 bytes (expected 64 hex digits)",
                    path.display()
                ))
            })?;
            Ok(Zeroizing::new(k))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let held = sealed_state(dir);
            if let Some(f) = held.first() {
                return Err(NodeError::corrupt(format!(
                    "{}: seal key missing while the node holds {} sealed file(s) ({} …); it is \
                     never made again — restore it (or, if it is lost for good, repair the node's \
                     shares: move them away and run `florin custody repair`)",
                    path.display(),
                    held.len(),
                    f.display()
                )));
            }
            let mut k = Zeroizing::new([0u8; 32]);
            OsRng.fill_bytes(&mut k[..]);
            write_private(path, hex::encode(&k[..]).as_bytes())?;
            Ok(k)
        }
        Err(e) => Err(NodeError::io_at(path, e)),
    }
}

fn share_name(key_id: &str, party: PartyId) -> String {
    format!("florin/custody/share/{key_id}/{party}")
}

/// A committed share's file, and a pending one's.
fn share_paths(dir: &Path, key_id: &str) -> (PathBuf, PathBuf) {
    let shares = dir.join("shares");
    (
        shares.join(format!("{key_id}.share")),
        shares.join(format!("{key_id}.share-pending")),
    )
}

impl CustodyNode {
    /// Opens the node's directory: identity key and key-encryption key (created on first
    /// start), and every stored share, each decrypted and checked against its group key.
    pub fn open(cfg: &CustodyNodeConfig) -> Result<CustodyNode, NodeError> {
        let id_path = cfg.dir.join("identity.key");
        if !id_path.exists() {
            return Err(NodeError::corrupt(format!(
                "{}: identity key missing (the member list names it; a new one is made only by \
                 `florin custody replace-node`)",
                id_path.display()
            )));
        }
        let identity = LocalSigner::new(load_or_create_key(&id_path)?);
        let seal_path = cfg.seal_key.clone().unwrap_or(cfg.dir.join("seal.key"));
        let kek = load_kek(&seal_path, &cfg.dir)?;
        let record = super::manifest::load(&cfg.dir, &kek, cfg.party, &seal_path)?;
        let mut members = HashMap::new();
        for m in &cfg.members {
            let k = PublicKey::parse(&m.key).map_err(|source| {
                NodeError::from(crate::error::BadRequest::Key {
                    what: format!("member {}", m.party),
                    source,
                })
            })?;
            members.insert(m.party, k);
        }
        let n = cfg.members.len() as u16;
        if members.get(&cfg.party) != Some(&identity.public_key()) {
            return Err(NodeError::bad_request(format!(
                "party {} in the member list is not this node's identity {}",
                cfg.party,
                identity.public_key().to_address()
            )));
        }
        let mut keys = HashMap::new();
        let mut pending = HashMap::new();
        // Committed keys whose share is missing or does not open: key → why.
        let mut lost: HashMap<String, String> = HashMap::new();
        let shares_dir = cfg.dir.join("shares");
        let rd = match std::fs::read_dir(&shares_dir) {
            Ok(rd) => rd.collect::<Vec<_>>(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(NodeError::io_at(&shares_dir, e)),
        };
        for entry in rd {
            let path = entry.map_err(crate::error::IoError::from)?.path();
            let (Some(stem), Some(ext @ ("share" | "share-pending"))) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let bytes = std::fs::read(&path).map_err(|e| NodeError::io_at(&path, e))?;
            let share = vault::open(&kek, &share_name(stem, cfg.party), &bytes)
                .map_err(|_| {
                    format!(
                        "damaged or sealed under another seal key ({}, {} bytes)",
                        path.display(),
                        bytes.len()
                    )
                })
                .and_then(|plain| {
                    KeyShare::from_bytes(&plain)
                        .map_err(|e| format!("damaged: {e} ({})", path.display()))
                })
                .and_then(|share| {
                    if share.group().key_id() == stem && share.party() == cfg.party {
                        Ok(share)
                    } else {
                        Err(format!(
                            "not this node's share of {stem} ({})",
                            path.display()
                        ))
                    }
                });
            let share = match share {
                Ok(s) => s,
                Err(why) if ext == "share" => {
                    lost.insert(stem.to_string(), why);
                    continue;
                }
                Err(why) => {
                    // Not committed: it signs nothing, and the next key creation replaces it.
                    tracing::warn!("custody node {}: pending share ignored: {why}", cfg.party);
                    continue;
                }
            };
            if ext == "share" {
                keys.insert(stem.to_string(), Arc::new(entry_for(share)));
            } else {
                pending.insert(stem.to_string(), share);
            }
        }
        // A committed share wins over a leftover pending file of the same name, unless that
        // file is a refresh of it waiting for its commit.
        pending.retain(|k, p: &mut KeyShare| {
            keys.get(k)
                .is_none_or(|e: &Arc<KeyEntry>| p.group().is_refresh_of(e.share.group()))
        });
        let ecdsa = match cfg.ecdsa {
            Some(level) => Some(Arc::new(EcdsaNode::open(
                level, cfg.party, n, &cfg.dir, &kek,
            )?)),
            None => None,
        };
        // The record of committed keys: every key in it must have opened above, and a
        // committed share file it does not list (a crash between the commit's rename and the
        // record's update, or a node older than the record) is added to it.
        let had_record = record.is_some();
        let mut record = record.unwrap_or_default();
        let before = record.clone();
        for (k, scheme) in &before {
            let held = match scheme.as_str() {
                "ecdsa" => ecdsa.as_ref().is_none_or(|e| e.has_key(k) || e.is_lost(k)),
                _ => keys.contains_key(k) || lost.contains_key(k),
            };
            if !held {
                let file = match scheme.as_str() {
                    "ecdsa" => shares_dir.join(format!("{k}.p256")),
                    _ => shares_dir.join(format!("{k}.share")),
                };
                let why = format!("missing ({})", file.display());
                match (scheme.as_str(), &ecdsa) {
                    ("ecdsa", Some(e)) => e.mark_lost(k, why),
                    _ => {
                        lost.insert(k.clone(), why);
                    }
                }
            }
        }
        for k in keys.keys().chain(lost.keys()) {
            record.entry(k.clone()).or_insert_with(|| "frost".into());
        }
        if let Some(e) = &ecdsa {
            for k in e.committed_and_lost() {
                record.entry(k).or_insert_with(|| "ecdsa".into());
            }
        }
        for (k, why) in &lost {
            tracing::warn!(
                "custody node {}: key {k} is not served: its share is {why}; run `florin custody \
                 repair {k} --party {}`",
                cfg.party,
                cfg.party
            );
        }
        let access = Access::from_config(cfg)?;
        let hedge = NonceHedge::derive(&kek[..])
            .map_err(|e| NodeError::corrupt(format!("nonce hedge: {e}")))?;
        std::fs::create_dir_all(&shares_dir).map_err(|e| NodeError::io_at(&shares_dir, e))?;
        if !had_record || record != before {
            super::manifest::store(&cfg.dir, &kek, cfg.party, &record)?;
        }
        Ok(CustodyNode {
            inner: Arc::new(Inner {
                customers: Customers::open(&cfg.dir)?,
                party: cfg.party,
                n,
                dir: cfg.dir.clone(),
                identity,
                kek,
                members,
                access: RwLock::new(Arc::new(access)),
                access_gen: AtomicU64::new(0),
                keys: RwLock::new(keys),
                nonces: Nonces {
                    hedge,
                    pool: Mutex::new(NoncePool::new(OsRng.next_u64() >> 1, MAX_ISSUED)),
                    target: AtomicUsize::new(NONCE_POOL_START),
                    low_water: AtomicUsize::new(usize::MAX),
                },
                pending: Mutex::new(pending),
                lost: RwLock::new(lost),
                record: Mutex::new(record),
                dkgs: Mutex::new(HashMap::new()),
                repairs: Mutex::new(HashMap::new()),
                ecdsa,
                stop: AtomicBool::new(false),
            }),
        })
    }

    /// This node's identity key.
    pub fn identity(&self) -> PublicKey {
        self.inner.identity.public_key()
    }

    /// Serves on `listener` in background threads: one per connection, and one that keeps
    /// every key's nonce pool full.
    pub fn start(self, listener: TcpListener) -> Result<RunningNode, NodeError> {
        let addr = listener.local_addr().map_err(crate::error::IoError::from)?;
        let inner = self.inner;
        export_pools(&inner);
        if let Some(e) = &inner.ecdsa {
            e.ensure_primes();
        }
        let refill = inner.clone();
        thread::Builder::new()
            .name("custody-refill".into())
            .spawn(move || refill_loop(&refill))
            .map_err(crate::error::IoError::from)?;
        let server = florin_net::rpc::RpcServer::start(
            listener,
            Arc::new(inner.identity.clone()),
            limits(),
            "custody",
            Arc::new(NodeService(inner.clone())),
        )
        .map_err(crate::error::IoError::from)?;
        Ok(RunningNode {
            inner,
            addr,
            server: Some(server),
        })
    }
}

fn entry_for(share: KeyShare) -> KeyEntry {
    KeyEntry {
        digest: share.group().digest(),
        share,
    }
}

impl RunningNode {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Takes up the `clients`, `admins` and `grants` of `cfg` at once: new peers and open
    /// connections alike are served under them from their next request, and a revoked peer
    /// is dropped. A config that does not parse changes nothing. Other fields (members,
    /// address, directory, ECDSA) apply at the next start.
    pub fn reload_access(&self, cfg: &CustodyNodeConfig) -> Result<(), NodeError> {
        reload_access(&self.inner, cfg)
    }

    /// Looks at the node's config file every [`CONFIG_POLL`] in a background thread and
    /// applies changed access ([`RunningNode::reload_access`]), so `florin custody grant` and
    /// `revoke` take effect on running nodes. A config that does not parse is reported on
    /// stderr and the node keeps serving under the access it had.
    pub fn watch_config(&self, path: PathBuf) -> Result<(), NodeError> {
        let inner = self.inner.clone();
        let stamp = |p: &Path| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.modified().ok(), m.len()))
        };
        let mut last = stamp(&path);
        thread::Builder::new()
            .name("custody-config".into())
            .spawn(move || {
                loop {
                    thread::sleep(CONFIG_POLL);
                    // A stopped node's directory may be gone already: nothing to report.
                    if inner.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let now = stamp(&path);
                    if now == last {
                        continue;
                    }
                    last = now;
                    let applied = CustodyNodeConfig::load(&path).and_then(|cfg| {
                        reload_access(&inner, &cfg)?;
                        Ok(cfg)
                    });
                    match applied {
                        Ok(cfg) => tracing::info!(
                            "custody node {}: access reloaded from {} ({} clients, {} admins, \
                             {} grants)",
                            inner.party,
                            path.display(),
                            cfg.clients.len(),
                            cfg.admins.len(),
                            cfg.grants.len()
                        ),
                        Err(e) => tracing::warn!(
                            "custody node {}: {} not applied, access unchanged: {e}",
                            inner.party,
                            path.display()
                        ),
                    }
                }
            })
            .map_err(crate::error::IoError::from)?;
        Ok(())
    }

    /// Blocks until the node stops.
    pub fn wait(mut self) {
        if let Some(server) = self.server.take() {
            server.wait();
        }
    }

    /// Stops accepting and closes the node's connections now (a crashed node, for tests:
    /// nothing is flushed because nothing is pending).
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Some(server) = &self.server {
            server.stop();
        }
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
        self.stop();
    }
}

fn refill_loop(inner: &Inner) {
    let n = &inner.nonces;
    let mut window = Instant::now();
    while !inner.stop.load(Ordering::Relaxed) {
        if window.elapsed() >= DEMAND_WINDOW {
            // Demand dropped after a burst: keep fewer nonces (and free their memory).
            window = Instant::now();
            let low = n.low_water.swap(usize::MAX, Ordering::Relaxed);
            let target = n.target.load(Ordering::Relaxed);
            let next = next_target(target, low);
            if next < target {
                n.target.store(next, Ordering::Relaxed);
                if let Ok(mut p) = n.pool.lock() {
                    p.trim(next);
                }
            }
        }
        let target = n.target.load(Ordering::Relaxed);
        let ready = n.pool.lock().map(|p| p.ready()).unwrap_or(target);
        if ready < target {
            // Made outside the lock, so handing out and signing never wait for it.
            let batch = NoncePool::generate(&n.hedge, 256.min(target - ready), &mut OsRng);
            if let Ok(mut p) = n.pool.lock() {
                p.add(batch);
            }
        } else {
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs a node from its config until the process is stopped.
/// `config_path`, the file `cfg` was read from, is watched for changed access.
pub fn run_node(cfg: &CustodyNodeConfig, config_path: Option<&Path>) -> Result<(), NodeError> {
    let node = CustodyNode::open(cfg)?;
    let listener = TcpListener::bind(cfg.listen).map_err(|e| crate::error::IoError::Listen {
        addr: cfg.listen,
        source: e,
    })?;
    tracing::info!(
        "custody node {} listening on {} as {}",
        cfg.party,
        cfg.listen,
        node.identity().to_address()
    );
    let running = node.start(listener)?;
    if let Some(path) = config_path {
        running.watch_config(path.to_path_buf())?;
    }
    running.wait();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nonce_target_shrinks_only_after_a_quiet_window() {
        // No hand-out in a window: halve, down to the start.
        assert_eq!(next_target(8192, usize::MAX), 4096);
        assert_eq!(next_target(NONCE_POOL_START, usize::MAX), NONCE_POOL_START);
        assert_eq!(next_target(1500, usize::MAX), NONCE_POOL_START);
        // Demand kept the pool below half: keep the target.
        assert_eq!(next_target(8192, 4095), 8192);
        assert_eq!(next_target(8192, 0), 8192);
        // Half or more never used: halve.
        assert_eq!(next_target(8192, 4096), 4096);
    }

    #[test]
    fn trim_drops_only_ready_nonces() {
        let hedge = NonceHedge::derive(&[7u8; 32]).unwrap_or_else(|e| panic!("{e}"));
        let mut pool = NoncePool::new(1, 16);
        pool.add(NoncePool::generate(&hedge, 10, &mut OsRng));
        let issued = pool.issue(2);
        assert_eq!(pool.trim(3), 5);
        assert_eq!(pool.ready(), 3);
        assert_eq!(pool.trim(8), 0);
        // Handed-out nonces still sign.
        assert!(pool.take(issued[0].0).is_ok());
    }
}

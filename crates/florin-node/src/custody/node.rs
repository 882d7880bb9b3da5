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
use florin_net::channel::{accept_on, Channel, ChannelConfig};
use florin_net::NetError;
use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::node_ecdsa::{EcdsaLevel, EcdsaNode};
use crate::error::NodeError;
use crate::keyfile::{load_or_create_key, sync_dir, write_private};

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
}

impl CustodyNodeConfig {
    /// Reads a `node.json`.
    pub fn load(path: &Path) -> Result<Self, NodeError> {
        let s = std::fs::read_to_string(path)
            .map_err(|e| NodeError::Io(format!("{}: {e}", path.display())))?;
        serde_json::from_str(&s)
            .map_err(|e| NodeError::BadRequest(format!("{}: {e}", path.display())))
    }
}

struct KeyEntry {
    share: KeyShare,
    /// `GroupKey::digest` of the share's group: what a `Sign` request must name.
    digest: [u8; 32],
}

/// A key-name pattern of a grant: a whole key name, or a prefix ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    prefix: String,
    whole: bool,
}

impl KeyPattern {
    /// Parses `name`, `prefix*` or `*`.
    pub fn parse(s: &str) -> Result<KeyPattern, NodeError> {
        let (prefix, whole) = match s.strip_suffix('*') {
            Some(p) => (p, false),
            None => (s, true),
        };
        let ok = if whole {
            valid_key_id(prefix)
        } else {
            prefix.is_empty() || valid_key_id(prefix)
        };
        if !ok {
            return Err(NodeError::BadRequest(format!(
                "key pattern {s:?}: a key name ([a-z0-9_-], 1 to 64) or a prefix ending in *"
            )));
        }
        Ok(KeyPattern {
            prefix: prefix.to_string(),
            whole,
        })
    }

    /// Whether key `key_id` matches.
    pub fn matches(&self, key_id: &str) -> bool {
        if self.whole {
            key_id == self.prefix
        } else {
            key_id.starts_with(&self.prefix)
        }
    }
}

/// What one authenticated peer may do.
struct Rights {
    peer: PublicKey,
    admin: bool,
    /// The keys it may use; `None`: every key.
    keys: Option<Vec<KeyPattern>>,
}

impl Rights {
    fn may_use(&self, key_id: &str) -> bool {
        self.admin
            || self
                .keys
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|p| p.matches(key_id)))
    }

    fn check_key(&self, key_id: &str) -> Result<(), CustodyError> {
        if self.may_use(key_id) {
            Ok(())
        } else {
            Err(CustodyError::Forbidden(format!(
                "key {key_id} is not granted to this client"
            )))
        }
    }

    /// Whether it may start, step or abort an ECDSA run of `job`.
    fn check_job(&self, job: &EcdsaJob) -> Result<(), CustodyError> {
        match job {
            EcdsaJob::Aux | EcdsaJob::Keygen { .. } if !self.admin => {
                Err(forbidden("key generation"))
            }
            EcdsaJob::Aux | EcdsaJob::Keygen { .. } => Ok(()),
            EcdsaJob::Presign { key_id, .. } | EcdsaJob::Sign { key_id, .. } => {
                self.check_key(key_id)
            }
        }
    }
}

/// Who may connect to a node, and what each peer may use (from `clients`, `admins` and
/// `grants` of its config).
struct Access {
    clients: Vec<PublicKey>,
    admins: Vec<PublicKey>,
    grants: Vec<(PublicKey, Vec<KeyPattern>)>,
}

impl Access {
    fn from_config(cfg: &CustodyNodeConfig) -> Result<Access, NodeError> {
        let clients = parse_keys(&cfg.clients, "client")?;
        Ok(Access {
            grants: parse_grants(cfg, &clients)?,
            clients,
            admins: parse_keys(&cfg.admins, "admin")?,
        })
    }

    /// What `peer` may do; `None`: it is neither a client nor an administrator.
    fn rights(&self, peer: &PublicKey) -> Option<Rights> {
        let admin = self.admins.contains(peer);
        if !admin && !self.clients.contains(peer) {
            return None;
        }
        Some(Rights {
            peer: *peer,
            admin,
            keys: self
                .grants
                .iter()
                .find(|(k, _)| k == peer)
                .map(|(_, ps)| ps.clone()),
        })
    }
}

/// How often a node started from a config file looks at it for changed access.
pub const CONFIG_POLL: Duration = Duration::from_millis(500);

/// Parses the grants of a config; every granted key must be a client.
fn parse_grants(
    cfg: &CustodyNodeConfig,
    clients: &[PublicKey],
) -> Result<Vec<(PublicKey, Vec<KeyPattern>)>, NodeError> {
    let mut out = Vec::with_capacity(cfg.grants.len());
    for (k, patterns) in &cfg.grants {
        let key = PublicKey::parse(k)
            .map_err(|e| NodeError::BadRequest(format!("grant for {k}: {e}")))?;
        if !clients.contains(&key) {
            return Err(NodeError::BadRequest(format!(
                "grant for {k}, which is not in `clients`"
            )));
        }
        let ps = patterns
            .iter()
            .map(|p| KeyPattern::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        out.push((key, ps));
    }
    Ok(out)
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

/// Envelope steps of a share repair (apart from key generation's 1 to 3).
const REPAIR_DELTA: u8 = 21;
const REPAIR_SIGMA: u8 = 22;

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
    connections: AtomicUsize,
    /// Connections in their handshake, oldest first (see [`MAX_HANDSHAKES`]).
    handshakes: Mutex<std::collections::VecDeque<(u64, std::net::TcpStream)>>,
    /// Open connections' sockets, to close them when the node stops.
    open: Mutex<HashMap<u64, std::net::TcpStream>>,
    next_conn: std::sync::atomic::AtomicU64,
    stop: AtomicBool,
}

/// A key-management node.
pub struct CustodyNode {
    inner: Arc<Inner>,
}

/// A node serving in background threads (tests, benchmarks, `devnet` in one process).
pub struct RunningNode {
    inner: Arc<Inner>,
    addr: SocketAddr,
    accept: Option<thread::JoinHandle<()>>,
}

fn parse_keys(list: &[String], what: &str) -> Result<Vec<PublicKey>, NodeError> {
    list.iter()
        .map(|k| {
            PublicKey::parse(k).map_err(|e| NodeError::BadRequest(format!("{what} key {k}: {e}")))
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
                NodeError::Corrupt(format!(
                    "{}: damaged: not hex (expected 64 hex digits)",
                    path.display()
                ))
            })?;
            let k: [u8; 32] = b.try_into().map_err(|_| {
                NodeError::Corrupt(format!(
                    "{}: damaged: not 32 bytes (expected 64 hex digits)",
                    path.display()
                ))
            })?;
            Ok(Zeroizing::new(k))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let held = sealed_state(dir);
            if let Some(f) = held.first() {
                return Err(NodeError::Corrupt(format!(
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
        Err(e) => Err(NodeError::Io(format!("{}: {e}", path.display()))),
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
            return Err(NodeError::Corrupt(format!(
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
            let k = PublicKey::parse(&m.key)
                .map_err(|e| NodeError::BadRequest(format!("member {}: {e}", m.party)))?;
            members.insert(m.party, k);
        }
        let n = cfg.members.len() as u16;
        if members.get(&cfg.party) != Some(&identity.public_key()) {
            return Err(NodeError::BadRequest(format!(
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
            Err(e) => return Err(NodeError::Io(format!("{}: {e}", shares_dir.display()))),
        };
        for entry in rd {
            let path = entry.map_err(|e| NodeError::Io(e.to_string()))?.path();
            let (Some(stem), Some(ext @ ("share" | "share-pending"))) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) else {
                continue;
            };
            let bytes = std::fs::read(&path)
                .map_err(|e| NodeError::Io(format!("{}: {e}", path.display())))?;
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
                    eprintln!("custody node {}: pending share ignored: {why}", cfg.party);
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
            eprintln!(
                "custody node {}: key {k} is not served: its share is {why}; run `florin custody \
                 repair {k} --party {}`",
                cfg.party, cfg.party
            );
        }
        let access = Access::from_config(cfg)?;
        let hedge = NonceHedge::derive(&kek[..])
            .map_err(|e| NodeError::Corrupt(format!("nonce hedge: {e}")))?;
        std::fs::create_dir_all(&shares_dir)
            .map_err(|e| NodeError::Io(format!("{}: {e}", shares_dir.display())))?;
        if !had_record || record != before {
            super::manifest::store(&cfg.dir, &kek, cfg.party, &record)?;
        }
        Ok(CustodyNode {
            inner: Arc::new(Inner {
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
                connections: AtomicUsize::new(0),
                handshakes: Mutex::new(std::collections::VecDeque::new()),
                open: Mutex::new(HashMap::new()),
                next_conn: std::sync::atomic::AtomicU64::new(0),
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
        let addr = listener
            .local_addr()
            .map_err(|e| NodeError::Io(e.to_string()))?;
        let inner = self.inner;
        if let Some(e) = &inner.ecdsa {
            e.ensure_primes();
        }
        let refill = inner.clone();
        thread::Builder::new()
            .name("custody-refill".into())
            .spawn(move || refill_loop(&refill))
            .map_err(|e| NodeError::Io(e.to_string()))?;
        let acc = inner.clone();
        let accept = thread::Builder::new()
            .name("custody-accept".into())
            .spawn(move || accept_loop(&acc, listener))
            .map_err(|e| NodeError::Io(e.to_string()))?;
        Ok(RunningNode {
            inner,
            addr,
            accept: Some(accept),
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
                        Ok(cfg) => eprintln!(
                            "custody node {}: access reloaded from {} ({} clients, {} admins, \
                             {} grants)",
                            inner.party,
                            path.display(),
                            cfg.clients.len(),
                            cfg.admins.len(),
                            cfg.grants.len()
                        ),
                        Err(e) => eprintln!(
                            "custody node {}: {} not applied, access unchanged: {e}",
                            inner.party,
                            path.display()
                        ),
                    }
                }
            })
            .map_err(|e| NodeError::Io(e.to_string()))?;
        Ok(())
    }

    /// Blocks until the node stops.
    pub fn wait(mut self) {
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// Stops accepting and closes the node's connections as they next wake (a crashed node,
    /// for tests: nothing is flushed because nothing is pending).
    pub fn stop(&self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        if let Ok(mut open) = self.inner.open.lock() {
            for (_, s) in open.drain() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        if let Ok(mut hs) = self.inner.handshakes.lock() {
            for (_, s) in hs.drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        // Wake the accept loop.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

impl Drop for RunningNode {
    fn drop(&mut self) {
        self.stop();
    }
}

fn reload_access(inner: &Inner, cfg: &CustodyNodeConfig) -> Result<(), NodeError> {
    let fresh = Access::from_config(cfg)?;
    match inner.access.write() {
        Ok(mut a) => *a = Arc::new(fresh),
        Err(p) => *p.into_inner() = Arc::new(fresh),
    }
    inner.access_gen.fetch_add(1, Ordering::SeqCst);
    Ok(())
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

fn accept_loop(inner: &Arc<Inner>, listener: TcpListener) {
    let cfg = ChannelConfig {
        timeout: HANDSHAKE_DEADLINE,
        ..ChannelConfig::default()
    };
    for stream in listener.incoming() {
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(mut hs) = inner.handshakes.lock() else {
            continue;
        };
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        if hs.len() >= MAX_HANDSHAKES {
            if let Some((_, oldest)) = hs.pop_front() {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        hs.push_back((id, copy));
        drop(hs);
        let conn = inner.clone();
        let cfg = cfg.clone();
        let spawned = thread::Builder::new()
            .name("custody-conn".into())
            .spawn(move || serve_stream(&conn, id, stream, &cfg));
        if spawned.is_err() {
            end_handshake(inner, id);
        }
    }
}

fn end_handshake(inner: &Inner, id: u64) {
    if let Ok(mut hs) = inner.handshakes.lock() {
        hs.retain(|(i, _)| *i != id);
    }
}

/// One connection: the handshake in its own slot, then (for a client or admin within the
/// connection cap) the requests.
fn serve_stream(inner: &Inner, id: u64, stream: std::net::TcpStream, cfg: &ChannelConfig) {
    let ch = accept_on(stream, &inner.identity, cfg);
    end_handshake(inner, id);
    let Ok(ch) = ch else { return };
    let peer = ch.peer();
    let seen = inner.access_gen.load(Ordering::SeqCst);
    let Some(rights) = access(inner).rights(&peer) else {
        return;
    };
    if inner.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        inner.connections.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    if let (Ok(c), Ok(mut open)) = (ch.try_clone_stream(), inner.open.lock()) {
        open.insert(id, c);
    }
    serve_connection(inner, ch, rights, seen);
    if let Ok(mut open) = inner.open.lock() {
        open.remove(&id);
    }
    inner.connections.fetch_sub(1, Ordering::SeqCst);
}

fn access(inner: &Inner) -> Arc<Access> {
    match inner.access.read() {
        Ok(a) => a.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

fn serve_connection(inner: &Inner, mut ch: Channel, mut rights: Rights, mut seen: u64) {
    let _ = ch.set_timeout(IDLE);
    let _ = ch.set_write_timeout(WRITE_DEADLINE);
    let peer = ch.peer();
    loop {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        let bytes = match ch.recv(MAX_WIRE) {
            Ok(b) => b,
            Err(_) => return,
        };
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        // The access list changed since this peer's rights were read: read them again, and
        // drop a peer that was revoked, before serving anything more.
        let now = inner.access_gen.load(Ordering::SeqCst);
        if now != seen {
            seen = now;
            match access(inner).rights(&peer) {
                Some(r) => rights = r,
                None => return,
            }
        }
        let answer = match wire::decode::<Request>(&bytes, "request") {
            Ok(req) => {
                handle(inner, &rights, req).unwrap_or_else(|e| Response::Refused(Refusal::from(&e)))
            }
            Err(e) => Response::Refused(Refusal::from(&e)),
        };
        if let Err(NetError::Closed | NetError::Io(_)) = ch.send(&wire::encode(&answer)) {
            return;
        }
    }
}

fn forbidden(what: &str) -> CustodyError {
    CustodyError::Forbidden(format!("{what} needs an administrator key"))
}

fn handle(inner: &Inner, rights: &Rights, req: Request) -> Result<Response, CustodyError> {
    let admin = rights.admin;
    match req {
        Request::Status => {
            let keys = inner
                .keys
                .read()
                .map_err(|_| CustodyError::Frost("lock".into()))?;
            let mut list: Vec<wire::KeyInfo> = keys
                .iter()
                .map(|(id, e)| wire::KeyInfo {
                    key_id: id.clone(),
                    group: e.share.group().to_bytes(),
                })
                .collect();
            list.sort_by(|a, b| a.key_id.cmp(&b.key_id));
            // Read under the `keys` lock: a commit moves a key between the two whole.
            let mut pending: Vec<wire::PendingKey> = inner
                .pending
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?
                .iter()
                .map(|(id, share)| wire::PendingKey {
                    key_id: id.clone(),
                    ecdsa: false,
                    public: share.group().to_bytes(),
                })
                .collect();
            if let Some(e) = &inner.ecdsa {
                pending.extend(e.pending_keys());
            }
            drop(keys);
            pending.sort_by(|a, b| a.key_id.cmp(&b.key_id));
            Ok(Response::Status {
                party: inner.party,
                keys: list,
                nonces_ready: inner
                    .nonces
                    .pool
                    .lock()
                    .map(|p| p.ready() as u64)
                    .unwrap_or(0),
                ecdsa: inner.ecdsa.as_ref().map(|e| e.status()),
                pending,
            })
        }
        Request::Commitments { count } => {
            let n = &inner.nonces;
            let count = count.min(MAX_COMMITMENTS) as usize;
            let lock = || {
                n.pool
                    .lock()
                    .map_err(|_| CustodyError::Frost("lock".into()))
            };
            let mut out = lock()?.issue(count);
            if out.len() < count {
                // Demand outgrew the pool: keep more ready from now on, and make the
                // shortfall now (outside the lock, so signing goes on) rather than answer short.
                let t = n.target.load(Ordering::Relaxed);
                n.target.store(
                    NONCE_POOL_TARGET.min(t.max(2 * count).max(2 * t)),
                    Ordering::Relaxed,
                );
                let batch = NoncePool::generate(&n.hedge, count - out.len(), &mut OsRng);
                let mut pool = lock()?;
                pool.add(batch);
                out.extend(pool.issue(count - out.len()));
            }
            if let Ok(pool) = lock() {
                n.low_water.fetch_min(pool.ready(), Ordering::Relaxed);
            }
            Ok(Response::Commitments(out))
        }
        Request::Sign {
            key_id,
            group,
            nonce,
            package,
        } => {
            rights.check_key(&key_id)?;
            let e = key(inner, &key_id)?;
            if e.digest != group {
                // Checked before the nonce is taken: the coordinator retries with it.
                return Err(CustodyError::StaleGroup(key_id));
            }
            let package = SigningPackage::from_bytes(&package)?;
            let nonces = inner
                .nonces
                .pool
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?
                .take(nonce)?;
            Ok(Response::Share(florin_custody::frost::sign_share(
                &e.share, &nonces, &package,
            )?))
        }
        Request::DkgStart {
            session,
            key_id,
            t,
            n,
        } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            if !valid_key_id(&key_id) {
                return Err(CustodyError::BadParameters(format!("key name {key_id:?}")));
            }
            if n != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "{n} parties asked, the network has {}",
                    inner.n
                )));
            }
            if key(inner, &key_id).is_ok() || ecdsa_has(inner, &key_id) {
                return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
            }
            let (party, msg) = DkgParty::start(&key_id, inner.party, t, n, &mut OsRng)?;
            begin_run(inner, session, party, msg)
        }
        Request::RefreshStart {
            session,
            key_id,
            group,
        } => {
            if !admin {
                return Err(forbidden("key refresh"));
            }
            let e = key(inner, &key_id)?;
            if e.digest != group {
                return Err(CustodyError::StaleGroup(key_id));
            }
            if e.share.group().parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "key {key_id} has {} parties, the network {}",
                    e.share.group().parties(),
                    inner.n
                )));
            }
            let (party, msg) = DkgParty::start_refresh(&e.share, &mut OsRng)?;
            begin_run(inner, session, party, msg)
        }
        Request::DkgRound2 { session, round1 } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            let mut run = take_run(inner, &session)?;
            let msgs = open_all(inner, &session, 1, &round1)?;
            let out = run.party.round2(&msgs)?;
            for e in round1.iter().filter(|e| e.from != inner.party) {
                let att = e.attestation();
                run.round1.insert(e.from, att.payload_hash);
                run.seen.push(att);
            }
            let echo = DkgEcho {
                frost: out.echo,
                seen: std::mem::take(&mut run.seen),
            };
            let echo = Envelope::broadcast(
                &inner.identity,
                session,
                2,
                inner.party,
                wire::encode(&echo),
            )?;
            let mut direct = Vec::with_capacity(out.direct.len());
            for (to, m) in &out.direct {
                direct.push(sealed_to(inner, session, 3, *to, m)?);
            }
            put_run(inner, session, run)?;
            Ok(Response::DkgRound2 { echo, direct })
        }
        Request::DkgFinish {
            session,
            echoes,
            direct,
        } => {
            if !admin {
                return Err(forbidden("key generation"));
            }
            let mut run = take_run(inner, &session)?;
            let echoes = open_all(inner, &session, 2, &echoes)?;
            let mut frost_echoes = BTreeMap::new();
            let mut attested = BTreeMap::new();
            for (w, bytes) in echoes {
                let echo: DkgEcho =
                    wire::decode(&bytes, "echo").map_err(|_| CustodyError::Misbehaved {
                        party: w,
                        reason: "malformed echo".into(),
                    })?;
                frost_echoes.insert(w, echo.frost);
                attested.insert(w, echo.seen);
            }
            // Signed evidence first: it names an equivocating sender or a lying witness.
            check_echoes(&session, 1, &run.round1, &attested, |p| {
                inner.members.get(&p).cloned()
            })?;
            let direct = open_all(inner, &session, 3, &direct)?;
            let refresh = run.party.is_refresh();
            let share = run
                .party
                .finish(&frost_echoes, &direct)
                .map_err(|e| match e {
                    // The witness's signed attestations agreed with ours, its digests do not:
                    // the witness contradicts itself.
                    CustodyError::Equivocation { witness, .. } => CustodyError::Misbehaved {
                        party: witness,
                        reason: "its echo's digests contradict its signed attestations".into(),
                    },
                    other => other,
                })?;
            if refresh {
                store_refresh(inner, share)
            } else {
                store(inner, share)
            }
        }
        Request::Import { key_id, share } => {
            if !admin {
                return Err(forbidden("key import"));
            }
            let share = KeyShare::from_bytes(&share)?;
            if share.group().key_id() != key_id
                || !valid_key_id(&key_id)
                || ecdsa_has(inner, &key_id)
            {
                return Err(CustodyError::BadParameters(format!(
                    "key name {key_id:?} invalid or taken"
                )));
            }
            if share.party() != inner.party || share.group().parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "share for party {} of {}, this is party {} of {}",
                    share.party(),
                    share.group().parties(),
                    inner.party,
                    inner.n
                )));
            }
            store(inner, share)
        }
        Request::Export { key_id } => {
            if !admin {
                return Err(forbidden("key export"));
            }
            let e = key(inner, &key_id)?;
            Ok(Response::Exported(e.share.to_bytes().to_vec()))
        }
        Request::RepairStart {
            session,
            key_id,
            helpers,
            target,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let e = key(inner, &key_id)?;
            let mut deltas = frost::repair_deltas(&e.share, &helpers, target, &mut OsRng)?;
            let own = deltas
                .remove(&inner.party)
                .ok_or_else(|| CustodyError::BadParameters("not a helper".into()))?;
            let mut out = Vec::with_capacity(deltas.len());
            for (to, d) in &deltas {
                out.push(sealed_to(inner, session, REPAIR_DELTA, *to, d)?);
            }
            let mut runs = inner
                .repairs
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?;
            runs.retain(|_, r| r.started.elapsed() < DKG_DEADLINE);
            if runs.len() >= MAX_DKG_RUNS || runs.contains_key(&session) {
                return Err(CustodyError::OutOfOrder(
                    "repair run taken, or too many running".into(),
                ));
            }
            runs.insert(
                session,
                RepairRun {
                    key_id,
                    helpers,
                    target,
                    own,
                    started: Instant::now(),
                },
            );
            Ok(Response::Repair(out))
        }
        Request::RepairSigma { session, deltas } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let run = inner
                .repairs
                .lock()
                .map_err(|_| CustodyError::Frost("lock".into()))?
                .remove(&session)
                .ok_or_else(|| CustodyError::OutOfOrder("no repair with this session".into()))?;
            let mut got = open_secrets(inner, &session, REPAIR_DELTA, &deltas)?;
            let expected: Vec<PartyId> = run
                .helpers
                .iter()
                .copied()
                .filter(|&h| h != inner.party)
                .collect();
            if got.keys().copied().ne(expected.iter().copied()) {
                return Err(CustodyError::OutOfOrder(format!(
                    "repair of {}: deltas from {:?}, helpers {expected:?}",
                    run.key_id,
                    got.keys().collect::<Vec<_>>()
                )));
            }
            got.insert(inner.party, run.own);
            let sigma = frost::repair_sigma(&got)?;
            Ok(Response::Repair(vec![sealed_to(
                inner,
                session,
                REPAIR_SIGMA,
                run.target,
                &sigma,
            )?]))
        }
        Request::RepairFinish {
            session,
            group,
            sigmas,
        } => {
            if !admin {
                return Err(forbidden("share repair"));
            }
            let group = GroupKey::from_bytes(&group)?;
            let key_id = group.key_id().to_string();
            if !valid_key_id(&key_id) || ecdsa_has(inner, &key_id) || group.parties() != inner.n {
                return Err(CustodyError::BadParameters(format!(
                    "key {key_id:?}: not a key of this network's kind"
                )));
            }
            let sigmas = open_secrets(inner, &session, REPAIR_SIGMA, &sigmas)?;
            let share = frost::repair_finish(&group, inner.party, &sigmas)?;
            store(inner, share)
        }
        Request::Commit { key_id, public } => {
            if !admin {
                return Err(forbidden("committing a key"));
            }
            commit(inner, &key_id, &public)
        }
        req @ (Request::EcdsaStart { .. }
        | Request::EcdsaStep { .. }
        | Request::EcdsaPartial { .. }
        | Request::EcdsaAbort { .. }
        | Request::EcdsaImport { .. }
        | Request::EcdsaExport { .. }
        | Request::EcdsaAddKey { .. }) => handle_ecdsa(inner, rights, req),
    }
}

/// Whether an ECDSA key of the name is committed (one namespace for both schemes; a pending
/// key of either takes no name, and the first of the two to commit drops the other).
fn ecdsa_has(inner: &Inner, key_id: &str) -> bool {
    inner.ecdsa.as_ref().is_some_and(|e| e.has_key(key_id))
}

/// Whether a FROST key of the name is committed.
fn frost_has(inner: &Inner, key_id: &str) -> bool {
    key(inner, key_id).is_ok()
}

fn ecdsa(inner: &Inner) -> Result<&Arc<EcdsaNode>, CustodyError> {
    inner.ecdsa.as_ref().ok_or_else(|| {
        CustodyError::BadParameters(format!(
            "node {} does not run ECDSA (`ecdsa` in its node.json)",
            inner.party
        ))
    })
}

fn handle_ecdsa(inner: &Inner, rights: &Rights, req: Request) -> Result<Response, CustodyError> {
    let admin = rights.admin;
    let e = ecdsa(inner)?;
    match req {
        Request::EcdsaStart { session, job } => {
            rights.check_job(&job)?;
            let frost_has = match &job {
                EcdsaJob::Keygen { key_id, .. } => frost_has(inner, key_id),
                _ => false,
            };
            let client = (!rights.admin).then_some(rights.peer);
            let (out, done) = e.start(
                session,
                job,
                frost_has,
                client,
                &inner.identity,
                &inner.members,
            )?;
            Ok(Response::EcdsaStep { out, done })
        }
        Request::EcdsaStep { session, incoming } => {
            let may = |job: &EcdsaJob| rights.check_job(job);
            let (out, done) = e.step(session, incoming, &may, &inner.identity, &inner.members)?;
            Ok(Response::EcdsaStep { out, done })
        }
        Request::EcdsaAbort { session } => {
            e.abort(&session, &|job: &EcdsaJob| rights.check_job(job))?;
            Ok(Response::Aborted)
        }
        Request::EcdsaPartial {
            key_id,
            presig,
            message,
        } => {
            rights.check_key(&key_id)?;
            Ok(Response::EcdsaPartial(
                e.partial(&key_id, presig, &message)?,
            ))
        }
        Request::EcdsaImport { key_id, share } => {
            if !admin {
                return Err(forbidden("key import"));
            }
            let frost_has = frost_has(inner, &key_id);
            Ok(Response::Key(
                e.import(&key_id, &share, frost_has)?.to_vec(),
            ))
        }
        Request::EcdsaExport { key_id } => {
            if !admin {
                return Err(forbidden("key export"));
            }
            Ok(Response::Exported(e.export(&key_id)?))
        }
        Request::EcdsaAddKey {
            key_id,
            from,
            addend,
        } => {
            if !admin {
                return Err(forbidden("key addition"));
            }
            let frost_has = frost_has(inner, &key_id);
            Ok(Response::Key(
                e.add_key(&key_id, &from, &addend, frost_has)?.to_vec(),
            ))
        }
        _ => Err(CustodyError::BadParameters("not an ECDSA request".into())),
    }
}

/// The refusal for a key whose share this node lost.
pub(super) fn lost_error(party: PartyId, key_id: &str, why: &str) -> CustodyError {
    CustodyError::BadParameters(format!(
        "node {party} cannot use key {key_id}: its share is {why}; the node serves nothing for \
         this key until `florin custody repair {key_id} --party {party}` restores it"
    ))
}

fn key(inner: &Inner, key_id: &str) -> Result<Arc<KeyEntry>, CustodyError> {
    if let Some(why) = inner.lost.read().ok().and_then(|l| l.get(key_id).cloned()) {
        return Err(lost_error(inner.party, key_id, &why));
    }
    inner
        .keys
        .read()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .get(key_id)
        .cloned()
        .ok_or_else(|| CustodyError::BadParameters(format!("no key {key_id}")))
}

/// Registers a key generation or refresh run that `party` started, and answers with its
/// signed round-1 broadcast.
fn begin_run(
    inner: &Inner,
    session: [u8; 16],
    party: DkgParty,
    msg: Vec<u8>,
) -> Result<Response, CustodyError> {
    let mut dkgs = inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    dkgs.retain(|_, r| r.started.elapsed() < DKG_DEADLINE);
    if dkgs.len() >= MAX_DKG_RUNS {
        return Err(CustodyError::BadParameters(
            "too many key generations running".into(),
        ));
    }
    if dkgs.contains_key(&session) {
        return Err(CustodyError::OutOfOrder("session already started".into()));
    }
    let own = Envelope::broadcast(&inner.identity, session, 1, inner.party, msg)?;
    let att = own.attestation();
    dkgs.insert(
        session,
        DkgRun {
            party,
            started: Instant::now(),
            round1: [(inner.party, att.payload_hash)].into(),
            seen: vec![att],
        },
    );
    Ok(Response::DkgRound1(own))
}

fn take_run(inner: &Inner, session: &[u8; 16]) -> Result<DkgRun, CustodyError> {
    inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .remove(session)
        .ok_or_else(|| CustodyError::OutOfOrder("no key generation with this session".into()))
}

fn put_run(inner: &Inner, session: [u8; 16], run: DkgRun) -> Result<(), CustodyError> {
    inner
        .dkgs
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?
        .insert(session, run);
    Ok(())
}

/// A secret message from this node to party `to`, sealed to its identity key.
fn sealed_to(
    inner: &Inner,
    session: [u8; 16],
    step: u8,
    to: PartyId,
    payload: &[u8],
) -> Result<Envelope, CustodyError> {
    let to_key = inner
        .members
        .get(&to)
        .ok_or_else(|| CustodyError::BadParameters(format!("party {to}")))?;
    Envelope::direct(
        &inner.identity,
        session,
        step,
        inner.party,
        to,
        to_key,
        payload,
        &mut OsRng,
    )
}

/// [`open_all`] for sealed secrets: the plaintexts are wiped when dropped.
fn open_secrets(
    inner: &Inner,
    session: &[u8; 16],
    step: u8,
    envs: &[Envelope],
) -> Result<BTreeMap<PartyId, Zeroizing<Vec<u8>>>, CustodyError> {
    Ok(open_all(inner, session, step, envs)?
        .into_iter()
        .map(|(p, d)| (p, Zeroizing::new(d)))
        .collect())
}

/// Opens other parties' envelopes of one step: each must come from a distinct member other
/// than this node and carry that member's signature.
fn open_all(
    inner: &Inner,
    session: &[u8; 16],
    step: u8,
    envs: &[Envelope],
) -> Result<std::collections::BTreeMap<PartyId, Vec<u8>>, CustodyError> {
    let mut out = std::collections::BTreeMap::new();
    for e in envs {
        if e.from == inner.party {
            continue;
        }
        let k = inner.members.get(&e.from).ok_or_else(|| {
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
        let m = e.open(session, step, inner.party, k, inner.identity.secret())?;
        if out.insert(e.from, m).is_some() {
            return Err(CustodyError::Misbehaved {
                party: e.from,
                reason: "two messages for one step".into(),
            });
        }
    }
    Ok(out)
}

/// Stores a new share durably (sealed, fsynced) as *pending* before it is acknowledged: it
/// signs nothing until the coordinator, having seen every node report the same key, commits
/// it. A pending share of the same name (an earlier run that did not finish) is replaced.
fn store(inner: &Inner, share: KeyShare) -> Result<Response, CustodyError> {
    let key_id = share.group().key_id().to_string();
    // Checked and written under the write lock: two concurrent creations of one name cannot
    // overwrite each other's share.
    let keys = inner
        .keys
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let group = share.group().to_bytes();
    if let Some(e) = keys.get(&key_id) {
        if e.share == share {
            return Ok(Response::Key(group));
        }
        return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
    }
    let mut pending = inner
        .pending
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if pending.get(&key_id) == Some(&share) {
        return Ok(Response::Key(group));
    }
    write_pending(inner, &share)?;
    pending.insert(key_id, share);
    Ok(Response::Key(group))
}

/// Stores a refreshed share durably as *pending* next to the committed one it refreshes; the
/// old share signs on until [`Request::Commit`] names the new sharing. A pending share of the
/// name (an earlier run that was not committed) is replaced.
fn store_refresh(inner: &Inner, share: KeyShare) -> Result<Response, CustodyError> {
    let key_id = share.group().key_id().to_string();
    let keys = inner
        .keys
        .read()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let group = share.group().to_bytes();
    match keys.get(&key_id) {
        Some(e) if e.share == share => return Ok(Response::Key(group)),
        Some(e) if share.group().is_refresh_of(e.share.group()) && share.party() == inner.party => {
        }
        _ => {
            return Err(CustodyError::Inconsistent(format!(
                "the refresh of {key_id} does not refresh the share this node holds"
            )))
        }
    }
    let mut pending = inner
        .pending
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if pending.get(&key_id) == Some(&share) {
        return Ok(Response::Key(group));
    }
    write_pending(inner, &share)?;
    pending.insert(key_id, share);
    Ok(Response::Key(group))
}

fn write_pending(inner: &Inner, share: &KeyShare) -> Result<(), CustodyError> {
    let key_id = share.group().key_id();
    let sealed = vault::seal(
        &inner.kek,
        &share_name(key_id, inner.party),
        &share.to_bytes(),
        &mut OsRng,
    )?;
    write_private(&share_paths(&inner.dir, key_id).1, &sealed)
        .map_err(|e| CustodyError::Frost(format!("cannot store the share: {e}")))
}

/// [`Request::Commit`]: a pending share (of either scheme) whose key is `public` becomes a key
/// that signs, and a pending share of the other scheme under the name is dropped; a key
/// already committed as `public` answers again.
fn commit(inner: &Inner, key_id: &str, public: &[u8]) -> Result<Response, CustodyError> {
    let answer = Response::Key(public.to_vec());
    let frost = key(inner, key_id)
        .ok()
        .map(|e| e.share.group().to_bytes() == public);
    let ecdsa = inner
        .ecdsa
        .as_ref()
        .and_then(|e| e.committed_as(key_id, public));
    match frost.or(ecdsa) {
        Some(true) => return Ok(answer),
        // A refresh replaces the committed sharing.
        Some(false) if frost.is_some() && commit_frost(inner, key_id, public)? => {
            record(inner, key_id, "frost")?;
            return Ok(answer);
        }
        Some(false) => {
            return Err(CustodyError::BadParameters(format!(
                "key {key_id} is committed as another key"
            )))
        }
        None => {}
    }
    if commit_frost(inner, key_id, public)? {
        if let Some(e) = &inner.ecdsa {
            e.drop_pending(key_id);
        }
        record(inner, key_id, "frost")?;
        return Ok(answer);
    }
    if let Some(e) = &inner.ecdsa {
        if e.commit(key_id, public)? {
            drop_frost_pending(inner, key_id);
            record(inner, key_id, "ecdsa")?;
            return Ok(answer);
        }
    }
    Err(CustodyError::BadParameters(format!(
        "no pending key {key_id} with this public key (none was stored here, or a later key \
         creation replaced it)"
    )))
}

/// Adds a committed key to the record (`keys.sealed`), durably; a key already recorded
/// under `scheme` costs nothing.
fn record(inner: &Inner, key_id: &str, scheme: &str) -> Result<(), CustodyError> {
    let mut r = inner
        .record
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if r.get(key_id).map(String::as_str) == Some(scheme) {
        return Ok(());
    }
    let mut next = r.clone();
    next.insert(key_id.to_string(), scheme.to_string());
    super::manifest::store(&inner.dir, &inner.kek, inner.party, &next)
        .map_err(|e| CustodyError::Frost(format!("cannot record the committed key: {e}")))?;
    *r = next;
    Ok(())
}

/// Commits a pending FROST share whose group key is `public`: `false` if there is none. A
/// pending refresh of a committed key replaces it, old share and file alike.
fn commit_frost(inner: &Inner, key_id: &str, public: &[u8]) -> Result<bool, CustodyError> {
    let mut keys = inner
        .keys
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let committed = keys.get(key_id).cloned();
    if let Some(e) = &committed {
        if e.share.group().to_bytes() == public {
            // A concurrent commit of the same key got here first.
            return Ok(true);
        }
    }
    let mut pending = inner
        .pending
        .lock()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    let fits = pending.get(key_id).is_some_and(|s| {
        s.group().to_bytes() == public
            && committed
                .as_ref()
                .is_none_or(|e| s.group().is_refresh_of(e.share.group()))
    });
    if !fits {
        return Ok(false);
    }
    let (done, waiting) = share_paths(&inner.dir, key_id);
    let mut lost = inner
        .lost
        .write()
        .map_err(|_| CustodyError::Frost("lock".into()))?;
    if lost.contains_key(key_id) && done.exists() {
        // A repair replaces a damaged share: the damaged file is kept aside, never deleted.
        let mut aside = done.file_name().unwrap_or_default().to_os_string();
        aside.push(format!(".damaged-{}", crate::psp::store::now()));
        std::fs::rename(&done, done.with_file_name(aside))
            .map_err(|e| CustodyError::Frost(format!("cannot move the damaged share: {e}")))?;
    }
    std::fs::rename(&waiting, &done)
        .map_err(|e| CustodyError::Frost(format!("cannot commit the share: {e}")))?;
    lost.remove(key_id);
    drop(lost);
    if let Some(share) = pending.remove(key_id) {
        keys.insert(key_id.to_string(), Arc::new(entry_for(share)));
    }
    drop(pending);
    drop(keys);
    // Committed in memory once renamed: a failed sync is reported, and a retry finds the key
    // committed.
    sync_dir(&done).map_err(|e| CustodyError::Frost(format!("cannot commit the share: {e}")))?;
    Ok(true)
}

/// Forgets a pending FROST share of this name (an ECDSA key of the name was committed).
fn drop_frost_pending(inner: &Inner, key_id: &str) {
    if let Ok(mut p) = inner.pending.lock() {
        if p.remove(key_id).is_some() {
            let _ = std::fs::remove_file(share_paths(&inner.dir, key_id).1);
        }
    }
}

/// Runs a node from its config until the process is stopped.
/// `config_path`, the file `cfg` was read from, is watched for changed access.
pub fn run_node(cfg: &CustodyNodeConfig, config_path: Option<&Path>) -> Result<(), NodeError> {
    let node = CustodyNode::open(cfg)?;
    let listener = TcpListener::bind(cfg.listen)
        .map_err(|e| NodeError::Io(format!("cannot listen on {}: {e}", cfg.listen)))?;
    eprintln!(
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

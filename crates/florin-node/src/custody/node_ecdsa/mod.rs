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
//! - **Presignatures** are kept across restarts without ever being used twice (one used twice
//!   reveals the key): each is sealed to `presigs/KEY/SESSION` (fsynced) before the node
//!   reports it, and that file is deleted, and the deletion made durable (the directory
//!   fsynced), before its partial signature is computed and sent. A crash at any point either
//!   leaves the file, and then no partial of it ever left, or not, and then it is gone for
//!   good. A restarted coordinator takes the unused ones back (`Request::EcdsaPresigs`).
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
use florin_custody::dkls::{self, DklsShare};
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

mod keys;
mod run_thread;
mod runs;
mod storage;

use run_thread::*;
use runs::*;
pub use storage::AnyShare;
use storage::*;

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
    /// DKLs23 keys only: no Paillier primes, no auxiliary information, CGGMP24 refused.
    /// DKLs23 has one security level (its OT and proofs at 128-bit security), so its keys
    /// are production keys at every setting above too.
    Dkls23,
}

impl EcdsaLevel {
    /// The name used in configs and status.
    pub fn name(self) -> &'static str {
        match self {
            EcdsaLevel::Production => "production",
            EcdsaLevel::InsecureTest => "insecure-test",
            EcdsaLevel::Dkls23 => "dkls23",
        }
    }

    /// Parses [`EcdsaLevel::name`].
    pub fn parse(s: &str) -> Option<EcdsaLevel> {
        match s {
            "production" => Some(EcdsaLevel::Production),
            "insecure-test" => Some(EcdsaLevel::InsecureTest),
            "dkls23" => Some(EcdsaLevel::Dkls23),
            _ => None,
        }
    }
}

/// Which threshold ECDSA protocol a key's shares are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EcdsaEngine {
    /// CGGMP24: Paillier-based, identifiable abort, presignatures.
    Cggmp24,
    /// DKLs23: OT-based, fast key generation and signing, no identifiable abort.
    Dkls23,
}

impl EcdsaEngine {
    /// The name in configs, status and benchmark params.
    pub fn name(self) -> &'static str {
        match self {
            EcdsaEngine::Cggmp24 => "cggmp24",
            EcdsaEngine::Dkls23 => "dkls23",
        }
    }

    /// Parses [`EcdsaEngine::name`].
    pub fn parse(s: &str) -> Option<EcdsaEngine> {
        match s {
            "cggmp24" => Some(EcdsaEngine::Cggmp24),
            "dkls23" => Some(EcdsaEngine::Dkls23),
            _ => None,
        }
    }
}

struct EcdsaKey {
    engine: EcdsaEngine,
    /// A DKLs23 share rebuilt by repair, without OT set-up: never committed, it only takes
    /// part in the complete refresh that makes it whole.
    hollow: bool,
    /// Stored by a DKLs23 refresh (the file's marker): pending with no committed share of the
    /// name (a repaired node's), it is committed only with every node's attestation.
    refreshed: bool,
    /// The stored share ([`AnyShare::to_stored`]).
    core: Zeroizing<Vec<u8>>,
    /// [`CoreShare::identity`]: what a `Commit` names and what key creation answers.
    identity: Vec<u8>,
    presigs: Mutex<PresigStore>,
}

/// A key's unused presignatures: this node's secret half and the public half, by session.
/// Each is also in a sealed file (`presigs/KEY/SESSION`) from before it is offered until
/// before its partial signature leaves (see `storage.rs`).
#[derive(Default)]
struct PresigStore {
    map: HashMap<[u8; 16], (Presignature, Vec<u8>)>,
    order: VecDeque<[u8; 16]>,
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
    /// Committed keys whose share file is missing or damaged: key → why. They sign nothing
    /// until a DKLs23 repair and complete refresh give the node its share again (CGGMP24
    /// shares are not repaired).
    lost: RwLock<HashMap<String, String>>,
    runs: Mutex<HashMap<[u8; 16], Run>>,
    seen: Mutex<Seen>,
    /// Parties that failed a DKLs23 OT check (`ecdsa/banned`): no DKLs23 run with them, ever.
    banned: RwLock<std::collections::BTreeSet<PartyId>>,
}

fn lock_err() -> CustodyError {
    CustodyError::Ecdsa("lock".into())
}

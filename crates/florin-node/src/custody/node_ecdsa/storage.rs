//! The node's ECDSA files: sealed key shares (pending and committed), the auxiliary
//! information and the Paillier primes, and opening them all when the node starts.

use super::*;

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
pub(super) fn share_paths(dir: &Path, key_id: &str) -> (PathBuf, PathBuf) {
    let shares = dir.join("shares");
    (
        shares.join(format!("{key_id}.p256")),
        shares.join(format!("{key_id}.p256-pending")),
    )
}

/// The seal name of a presignature of `key_id`'s sharing `identity`: a file from another
/// sharing of the name (or another node) does not open.
fn presig_name(key_id: &str, party: PartyId, identity: &[u8], session: &[u8; 16]) -> String {
    format!(
        "florin/custody/ecdsa-presig/{key_id}/{party}/{}/{}",
        hex::encode(hash("florin/custody/ecdsa-presig-sharing/v1", &[identity])),
        hex::encode(session)
    )
}

/// Where a key's presignatures are kept.
fn presig_dir(dir: &Path, key_id: &str) -> PathBuf {
    dir.join("presigs").join(key_id)
}

/// Opens the presignatures kept for a CGGMP24 key. One that does not open (damaged, or from
/// an earlier sharing of the name) is never used: it is renamed `….unusable`, and said so.
fn load_presigs(dir: &Path, key_id: &str, party: PartyId, kek: &[u8; 32], k: &EcdsaKey) {
    let pdir = presig_dir(dir, key_id);
    let Ok(rd) = std::fs::read_dir(&pdir) else {
        return;
    };
    let Ok(mut store) = k.presigs.lock() else {
        return;
    };
    for entry in rd.flatten() {
        let path = entry.path();
        let Some(session) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| hex::decode(n).ok())
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
        else {
            continue;
        };
        // The seal names the session too: a file copied or renamed to another run's name does
        // not open (the same presignature under two names could sign twice).
        let opened = match read_sealed(
            kek,
            &presig_name(key_id, party, &k.identity, &session),
            &path,
        ) {
            Err(NodeError::Io(e)) => {
                // Not damage: left alone, and not used this time.
                tracing::warn!(
                    "custody node {party}: presignature file {} cannot be read ({e}); not used",
                    path.display()
                );
                continue;
            }
            r => r.ok().flatten(),
        }
        .and_then(|plain| {
            let n = u32::from_le_bytes(plain.get(..4)?.try_into().ok()?) as usize;
            let public = plain.get(4..4 + n)?.to_vec();
            PresigPublic::from_bytes(&public).ok()?;
            let presig = Presignature::from_bytes(plain.get(4 + n..)?).ok()?;
            Some((presig, public))
        });
        match opened {
            Some(p) => {
                if store.map.insert(session, p).is_none() {
                    store.order.push_back(session);
                }
            }
            None => {
                let mut to = path.clone().into_os_string();
                to.push(".unusable");
                let moved = std::fs::rename(&path, &to);
                tracing::warn!(
                    "custody node {party}: presignature file {} does not open (damaged, or \
                     from an earlier sharing); never used, renamed ({moved:?})",
                    path.display()
                );
            }
        }
    }
}

fn aux_name(party: PartyId) -> String {
    format!("florin/custody/ecdsa-aux/{party}")
}

fn primes_name(party: PartyId) -> String {
    format!("florin/custody/ecdsa-primes/{party}")
}

/// What starts a stored DKLs23 share (a CGGMP24 share is JSON and starts with `{`).
const DKLS_MAGIC: &[u8] = b"florin/dkls23-share/v1\n";
/// What starts a DKLs23 share a refresh made (pending, and once committed): a node that holds
/// such a share pending with no committed one (a share repaired, then refreshed) commits it
/// only with every node's attestation (`CommitRefresh`), never by a plain `Commit`.
const DKLS_REFRESH_MAGIC: &[u8] = b"florin/dkls23-refresh/v1\n";

/// A node's share of an ECDSA key, of either engine.
pub enum AnyShare {
    /// CGGMP24.
    Cggmp(CoreShare),
    /// DKLs23.
    Dkls(Box<DklsShare>),
}

impl AnyShare {
    /// The bytes stored (sealed) and exported: a DKLs23 share carries a marker.
    pub fn to_stored(&self) -> Zeroizing<Vec<u8>> {
        self.to_stored_as(false)
    }

    /// [`AnyShare::to_stored`], a DKLs23 share marked as made by a refresh when `refreshed`.
    fn to_stored_as(&self, refreshed: bool) -> Zeroizing<Vec<u8>> {
        match self {
            AnyShare::Cggmp(c) => Zeroizing::new(c.to_bytes()),
            AnyShare::Dkls(d) => {
                let magic = if refreshed {
                    DKLS_REFRESH_MAGIC
                } else {
                    DKLS_MAGIC
                };
                let b = d.to_bytes();
                let mut out = Zeroizing::new(Vec::with_capacity(magic.len() + b.len()));
                out.extend_from_slice(magic);
                out.extend_from_slice(&b);
                out
            }
        }
    }

    /// Decodes [`AnyShare::to_stored`].
    pub fn from_stored(b: &[u8]) -> Result<AnyShare, CustodyError> {
        match b
            .strip_prefix(DKLS_MAGIC)
            .or_else(|| b.strip_prefix(DKLS_REFRESH_MAGIC))
        {
            Some(rest) => Ok(AnyShare::Dkls(Box::new(DklsShare::from_bytes(rest)?))),
            None => Ok(AnyShare::Cggmp(CoreShare::from_bytes(b)?)),
        }
    }

    /// The engine.
    pub fn engine(&self) -> EcdsaEngine {
        match self {
            AnyShare::Cggmp(_) => EcdsaEngine::Cggmp24,
            AnyShare::Dkls(_) => EcdsaEngine::Dkls23,
        }
    }

    /// The share's party.
    pub fn party(&self) -> PartyId {
        match self {
            AnyShare::Cggmp(c) => c.party(),
            AnyShare::Dkls(d) => d.party(),
        }
    }

    /// Parties of the key.
    pub fn n(&self) -> u16 {
        match self {
            AnyShare::Cggmp(c) => c.n(),
            AnyShare::Dkls(d) => d.n(),
        }
    }

    /// Whether it is a DKLs23 share rebuilt by repair that has no OT set-up yet.
    pub fn is_hollow(&self) -> bool {
        matches!(self, AnyShare::Dkls(d) if d.is_hollow())
    }

    /// The sharing's identity: the SEC1-compressed public key, then a digest of the sharing.
    pub fn identity(&self) -> Vec<u8> {
        match self {
            AnyShare::Cggmp(c) => c.identity(),
            AnyShare::Dkls(d) => d.identity(),
        }
    }
}

/// The entry of a share stored as `core` ([`AnyShare::to_stored`] or a refresh's).
fn key_entry(share: &AnyShare, core: Zeroizing<Vec<u8>>) -> EcdsaKey {
    EcdsaKey {
        hollow: share.is_hollow(),
        refreshed: core.starts_with(DKLS_REFRESH_MAGIC),
        engine: share.engine(),
        core,
        identity: share.identity(),
        presigs: Mutex::new(PresigStore::default()),
    }
}

/// Reads `ecdsa/banned`: one party number a line.
fn read_banned(path: &Path) -> Result<std::collections::BTreeSet<PartyId>, NodeError> {
    match std::fs::read_to_string(path) {
        Ok(s) => s
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                l.trim().parse::<PartyId>().map_err(|_| {
                    NodeError::corrupt(format!("{}: line {} is not a party", path.display(), i + 1))
                })
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(NodeError::io_at(path, e)),
    }
}

impl EcdsaNode {
    /// Opens the node's ECDSA files under `dir` (`ecdsa/` and `shares/*.p256`).
    pub(in crate::custody) fn open(
        level: EcdsaLevel,
        party: PartyId,
        n: u16,
        dir: &Path,
        kek: &[u8; 32],
    ) -> Result<EcdsaNode, NodeError> {
        let edir = dir.join("ecdsa");
        std::fs::create_dir_all(&edir).map_err(|e| NodeError::io_at(&edir, e))?;
        let aux = match level {
            // A node that serves DKLs23 only leaves CGGMP24's files alone.
            EcdsaLevel::Dkls23 => None,
            _ => read_sealed(kek, &aux_name(party), &edir.join("aux.sealed"))?,
        };
        if let Some(a) = &aux {
            let n_aux = match level {
                EcdsaLevel::Production | EcdsaLevel::Dkls23 => {
                    AuxShare::<Production>::from_bytes(a).map(|a| a.n())
                }
                EcdsaLevel::InsecureTest => AuxShare::<InsecureTest>::from_bytes(a).map(|a| a.n()),
            }
            .map_err(|e| NodeError::corrupt(format!("ecdsa/aux.sealed: {e} (level {level:?}?)")))?;
            if n_aux != n {
                return Err(NodeError::corrupt(format!(
                    "ecdsa/aux.sealed is for {n_aux} parties, the network has {n}"
                )));
            }
        }
        let primes = match level {
            EcdsaLevel::Dkls23 => None,
            _ => read_sealed(kek, &primes_name(party), &edir.join("primes.sealed"))?,
        };
        let banned = read_banned(&edir.join("banned"))?;
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
                    Ok(Some(plain)) => AnyShare::from_stored(&plain)
                        .map_err(|e| format!("damaged: {e} ({})", path.display()))
                        .and_then(|core| {
                            if core.party() != party || core.n() != n {
                                Err(format!(
                                    "a share of party {} of {}, not this node's ({})",
                                    core.party(),
                                    core.n(),
                                    path.display()
                                ))
                            } else if ext == "p256" && core.is_hollow() {
                                // Never committed by this code: a file put there by hand.
                                Err(format!(
                                    "a share rebuilt by repair and never refreshed, which \
                                     cannot sign ({})",
                                    path.display()
                                ))
                            } else {
                                Ok((core, plain))
                            }
                        }),
                    Ok(None) => continue,
                    Err(NodeError::Corrupt(_)) => Err(format!(
                        "damaged or sealed under another seal key ({})",
                        path.display()
                    )),
                    Err(e) => return Err(e),
                };
                let (core, plain) = match opened {
                    Ok(c) => c,
                    Err(why) if ext == "p256" => {
                        lost.insert(stem.to_string(), why);
                        continue;
                    }
                    Err(why) => {
                        tracing::warn!("custody node {party}: pending ECDSA share ignored: {why}");
                        continue;
                    }
                };
                let entry = Arc::new(key_entry(&core, plain));
                if ext == "p256" && entry.engine == EcdsaEngine::Cggmp24 {
                    load_presigs(dir, stem, party, kek, &entry);
                }
                if ext == "p256" {
                    keys.insert(stem.to_string(), entry);
                } else {
                    pending.insert(stem.to_string(), entry);
                }
            }
        }
        // A pending share of a committed name is kept only when it is a refresh of it (the same
        // public key and engine) that waits for its commit; anything else is stale.
        pending.retain(|k, p| {
            keys.get(k).is_none_or(|c: &Arc<EcdsaKey>| {
                c.engine == EcdsaEngine::Dkls23
                    && c.engine == p.engine
                    && c.identity.get(..33) == p.identity.get(..33)
                    && c.identity != p.identity
            })
        });
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
            banned: RwLock::new(banned),
        })
    }

    fn edir(&self) -> PathBuf {
        self.dir.join("ecdsa")
    }

    /// Keeps a presignature (sealed, fsynced) before the node reports it.
    pub(super) fn store_presig(
        &self,
        key_id: &str,
        k: &EcdsaKey,
        session: &[u8; 16],
        presig: &Presignature,
        public: &[u8],
    ) -> Result<(), CustodyError> {
        let pdir = presig_dir(&self.dir, key_id);
        let fresh = !pdir.exists();
        std::fs::create_dir_all(&pdir)
            .map_err(|e| CustodyError::Ecdsa(format!("cannot create {}: {e}", pdir.display())))?;
        let mut plain = Zeroizing::new(Vec::with_capacity(4 + public.len() + 4096));
        plain.extend_from_slice(&(public.len() as u32).to_le_bytes());
        plain.extend_from_slice(public);
        plain.extend_from_slice(&presig.to_bytes());
        write_sealed(
            &self.kek,
            &presig_name(key_id, self.party, &k.identity, session),
            &pdir.join(hex::encode(session)),
            &plain,
        )?;
        if fresh {
            // A new directory is durable in its parents too, as the file is in it.
            sync_dir(&pdir).map_err(|e| CustodyError::Ecdsa(format!("{e}")))?;
            if let Some(parent) = pdir.parent() {
                sync_dir(parent).map_err(|e| CustodyError::Ecdsa(format!("{e}")))?;
            }
        }
        Ok(())
    }

    /// Deletes a presignature's file and makes the deletion durable: once this returns, no
    /// restart brings the presignature back. Called before its partial signature is made.
    pub(super) fn drop_presig(&self, key_id: &str, session: &[u8; 16]) -> Result<(), CustodyError> {
        let path = presig_dir(&self.dir, key_id).join(hex::encode(session));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(CustodyError::Ecdsa(format!(
                    "cannot delete {}: {e}",
                    path.display()
                )))
            }
        }
        sync_dir(&path).map_err(|e| CustodyError::Ecdsa(format!("{e}")))
    }

    /// Starts generating primes in the background if the node has neither primes nor
    /// auxiliary information. Returns at once.
    pub(in crate::custody) fn ensure_primes(self: &Arc<Self>) {
        if self.level == EcdsaLevel::Dkls23 {
            return;
        }
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
                    EcdsaLevel::Production | EcdsaLevel::Dkls23 => {
                        Primes::<Production>::generate(&mut rng).to_bytes()
                    }
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
                    Err(e) => tracing::warn!("custody node {}: {e}", me.party),
                }
                me.generating.store(false, Ordering::SeqCst);
            });
        if spawned.is_err() {
            self.generating.store(false, Ordering::SeqCst);
        }
    }

    pub(super) fn store_aux(&self, bytes: Zeroizing<Vec<u8>>) -> Result<(), CustodyError> {
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
    /// `refresh`: the share is a new sharing of the committed key of this name (same public
    /// key), which the commit then replaces. Answers the key's identity.
    pub(super) fn store_key(
        &self,
        key_id: &str,
        share: &AnyShare,
        refresh: bool,
    ) -> Result<Vec<u8>, CustodyError> {
        if share.party() != self.party || share.n() != self.n {
            return Err(CustodyError::BadParameters(format!(
                "share for party {} of {}, this is party {} of {}",
                share.party(),
                share.n(),
                self.party,
                self.n
            )));
        }
        if share.engine() == EcdsaEngine::Cggmp24 && self.level == EcdsaLevel::Dkls23 {
            return Err(dkls_only());
        }
        let keys = self.keys.write().map_err(|_| lock_err())?;
        let bytes = share.to_stored_as(refresh);
        let identity = share.identity();
        if let Some(e) = keys.get(key_id) {
            if e.core[..] == bytes[..] {
                return Ok(e.identity.clone());
            }
            let same_key = e.identity.get(..33) == identity.get(..33) && e.engine == share.engine();
            if !(refresh && same_key) {
                return Err(CustodyError::BadParameters(format!("key {key_id} exists")));
            }
        }
        let mut pending = self.pending.lock().map_err(|_| lock_err())?;
        if refresh && !keys.contains_key(key_id) {
            // Only a share rebuilt by repair (hollow, pending, this key) is refreshed without
            // a committed one.
            let repaired = pending.get(key_id).is_some_and(|p| {
                p.hollow && p.engine == share.engine() && p.identity.get(..33) == identity.get(..33)
            });
            if !repaired {
                return Err(CustodyError::BadParameters(format!(
                    "no ECDSA key {key_id}"
                )));
            }
        }
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
        let entry = key_entry(share, bytes);
        pending.insert(key_id.to_string(), Arc::new(entry));
        drop(pending);
        drop(keys);
        if share.engine() == EcdsaEngine::Cggmp24 {
            self.drop_primes();
        }
        Ok(identity)
    }

    /// Whether any of `parties` is banned from DKLs23 runs.
    pub(super) fn check_not_banned(&self, parties: &[PartyId]) -> Result<(), CustodyError> {
        let banned = self.banned.read().map_err(|_| lock_err())?;
        match parties.iter().find(|p| banned.contains(p)) {
            Some(p) => Err(CustodyError::Banned {
                party: *p,
                reason: format!(
                    "banned from DKLs23 runs at node {} (it failed an OT check; see {})",
                    self.party,
                    self.edir().join("banned").display()
                ),
            }),
            None => Ok(()),
        }
    }

    /// Bans `party` from DKLs23 runs for good: written (and fsynced) before it takes effect
    /// in memory, so no restart forgets it.
    pub(super) fn ban(&self, party: PartyId) -> Result<(), CustodyError> {
        let mut banned = self.banned.write().map_err(|_| lock_err())?;
        if banned.contains(&party) || party == self.party {
            return Ok(());
        }
        // In memory at once, whatever happens to the file: runs with the party stop now.
        banned.insert(party);
        let text: String = banned.iter().map(|p| format!("{p}\n")).collect();
        drop(banned);
        if let Ok(mut runs) = self.runs.lock() {
            runs.retain(|_, r| !r.involves(party) || !r.is_dkls());
        }
        tracing::warn!(
            "custody node {}: party {party} banned from DKLs23 runs for good (failed an OT check)",
            self.party
        );
        let path = self.edir().join("banned");
        write_private(&path, text.as_bytes()).map_err(|e| {
            CustodyError::Ecdsa(format!(
                "party {party} is banned in memory, but {} could not be written ({e}): \
                 a restart would forget the ban; fix the disk and ban it again",
                path.display()
            ))
        })
    }
}

pub(super) fn dkls_only() -> CustodyError {
    CustodyError::BadParameters(
        "this node serves DKLs23 ECDSA keys only (`ecdsa: dkls23` in its node.json)".into(),
    )
}

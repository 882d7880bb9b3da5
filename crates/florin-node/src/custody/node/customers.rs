//! Customer bindings: the customer key bound to a key when it was made, and the payment ids
//! the customer's authorizations spent (see [`florin_custody::authz`]).
//!
//! Files, in the node's directory:
//! - `customers/KEY.customer`: the `eur1…` key bound to key `KEY`. Written by
//!   [`Request::BindCustomer`] before the key is made; once the key is committed it never
//!   changes (a bind for a committed key is refused unless it names the same customer).
//! - `customers/used.log`: one line per authorized payment id, `KEY ID-HEX TXID-HEX EXPIRES`,
//!   appended and fsynced before the signature share leaves the node. Lines whose
//!   authorization expired are dropped when the file is rewritten (at start, and when it has
//!   grown to twice the live lines): an expired authorization is refused anyway.

use std::collections::HashMap;
use std::io::Write;

use florin_custody::authz::{Authorization, AuthzError};
use florin_ledger::Encumbrance;

use super::*;

/// Most live (unexpired) payment ids a node remembers; past that it refuses new ones
/// ([`AuthzError::Busy`]) until some expire.
pub const MAX_LIVE_PAYMENTS: usize = 1 << 18;

pub(super) struct Customers {
    dir: PathBuf,
    bound: RwLock<HashMap<String, PublicKey>>,
    used: Mutex<Used>,
}

struct Used {
    /// (key, payment id) → (txid, expires).
    live: HashMap<(String, String), ([u8; 32], u64)>,
    lines: usize,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn io(path: &Path, e: std::io::Error) -> NodeError {
    NodeError::io_at(path, e)
}

impl Customers {
    /// Reads `DIR/customers`.
    pub(super) fn open(dir: &Path) -> Result<Customers, NodeError> {
        let dir = dir.join("customers");
        let mut bound = HashMap::new();
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                for entry in rd {
                    let path = entry.map_err(crate::error::IoError::from)?.path();
                    let (Some(stem), Some("customer")) = (
                        path.file_stem().and_then(|s| s.to_str()),
                        path.extension().and_then(|s| s.to_str()),
                    ) else {
                        continue;
                    };
                    let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
                    let key = PublicKey::parse(text.trim()).map_err(|_| {
                        NodeError::corrupt(format!(
                            "{}: damaged: not a customer key",
                            path.display()
                        ))
                    })?;
                    bound.insert(stem.to_string(), key);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&dir, e)),
        }
        let log = dir.join("used.log");
        let mut live = HashMap::new();
        match std::fs::read_to_string(&log) {
            Ok(s) => {
                let t = now();
                // A torn last line (a crash mid-append) is dropped: its share never left.
                for line in s.lines() {
                    let f: Vec<&str> = line.split(' ').collect();
                    let parsed = (|| {
                        let [k, id, txid, exp] = f.as_slice() else {
                            return None;
                        };
                        let id = String::from_utf8(hex::decode(id).ok()?).ok()?;
                        let txid: [u8; 32] = hex::decode(txid).ok()?.try_into().ok()?;
                        Some((k.to_string(), id, txid, exp.parse::<u64>().ok()?))
                    })();
                    if let Some((k, id, txid, exp)) = parsed {
                        if exp > t {
                            live.insert((k, id), (txid, exp));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&log, e)),
        }
        let c = Customers {
            dir,
            bound: RwLock::new(bound),
            used: Mutex::new(Used { live, lines: 0 }),
        };
        if log.exists() {
            let mut u = c.used.lock().map_err(|_| NodeError::corrupt("lock"))?;
            c.rewrite(&mut u)?;
        }
        Ok(c)
    }

    fn log(&self) -> PathBuf {
        self.dir.join("used.log")
    }

    fn rewrite(&self, u: &mut Used) -> Result<(), NodeError> {
        let mut s = String::new();
        for ((k, id), (txid, exp)) in &u.live {
            s.push_str(&format!(
                "{k} {} {} {exp}\n",
                hex::encode(id),
                hex::encode(txid)
            ));
        }
        write_private(&self.log(), s.as_bytes())?;
        u.lines = u.live.len();
        Ok(())
    }

    /// The customer key bound to `key_id`.
    pub(super) fn bound(&self, key_id: &str) -> Option<PublicKey> {
        // A panic elsewhere while the lock was held cannot leave the map half-changed (one
        // insert), so a poisoned lock still gives the bindings: never "unbound" by accident.
        self.bound
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key_id)
            .copied()
    }

    /// Binds `customer` to `key_id` (durably). `committed`: whether the key is committed;
    /// then only the same binding is accepted again.
    pub(super) fn bind(
        &self,
        key_id: &str,
        customer: PublicKey,
        committed: bool,
    ) -> Result<(), CustodyError> {
        let current = self.bound(key_id);
        if current == Some(customer) {
            return Ok(());
        }
        if committed {
            return Err(CustodyError::Forbidden(format!(
                "key {key_id} exists; its customer binding never changes"
            )));
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| CustodyError::BadParameters(format!("customers directory: {e}")))?;
        let path = self.dir.join(format!("{key_id}.customer"));
        write_private(&path, customer.to_address().as_bytes())
            .map_err(|e| CustodyError::BadParameters(format!("customer binding: {e}")))?;
        self.bound
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key_id.to_string(), customer);
        Ok(())
    }

    /// Binds `customer` to `key_id` where the node knows no binding for it (share repair: the
    /// binding comes from the helpers); the same binding again is nothing, another one is
    /// refused.
    pub(super) fn bind_missing(
        &self,
        key_id: &str,
        customer: PublicKey,
    ) -> Result<(), CustodyError> {
        match self.bound(key_id) {
            Some(c) if c == customer => Ok(()),
            Some(_) => Err(CustodyError::Inconsistent(format!(
                "key {key_id}: this node's customer binding differs from its helpers'; \
                 refusing to repair it"
            ))),
            None => self.bind(key_id, customer, false),
        }
    }

    /// The check before a signature with `key_id` (see [`PayerKey`]) (whose encumbrance `payer` gives) over
    /// `message`: nothing for a key without a customer; for a bound key, `authz` must pass
    /// every check, and its payment id is recorded (durably) for this transaction.
    pub(super) fn authorize(
        &self,
        key_id: &str,
        payer: impl FnOnce() -> Result<PayerKey, CustodyError>,
        message: &[u8],
        authz: Option<&Authorization>,
    ) -> Result<(), CustodyError> {
        let Some(customer) = self.bound(key_id) else {
            return Ok(());
        };
        let refuse = CustodyError::Unauthorized;
        let authz = authz.ok_or_else(|| refuse(AuthzError::Missing))?;
        let t = now();
        let (auth, txid) = match payer()? {
            PayerKey::Plain(_) if authz.uses_notes() => Err(AuthzError::NoNotes),
            PayerKey::Plain(payer) => authz.check(&customer, &payer, message, t),
            PayerKey::Notes(base) => authz.check_notes(&customer, &base, message, t),
        }
        .map_err(refuse)?;
        let mut u = self
            .used
            .lock()
            .map_err(|_| CustodyError::Frost("lock".into()))?;
        let slot = (key_id.to_string(), auth.id.clone());
        match u.live.get(&slot) {
            Some((seen, _)) if *seen == txid => return Ok(()),
            Some(_) => return Err(refuse(AuthzError::Reused(auth.id))),
            None => {}
        }
        if u.live.len() >= MAX_LIVE_PAYMENTS {
            u.live.retain(|_, (_, exp)| *exp > t);
            if u.live.len() >= MAX_LIVE_PAYMENTS {
                return Err(refuse(AuthzError::Busy));
            }
        }
        let line = format!(
            "{key_id} {} {} {}\n",
            hex::encode(&auth.id),
            hex::encode(txid),
            auth.expires
        );
        let append = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.dir)?;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log())?;
            f.write_all(line.as_bytes())?;
            f.sync_data()
        };
        append().map_err(|e| CustodyError::BadParameters(format!("payment log: {e}")))?;
        u.live.insert(slot, (txid, auth.expires));
        u.lines += 1;
        if u.lines > 2 * u.live.len() + 1024 {
            u.live.retain(|_, (_, exp)| *exp > t);
            if let Err(e) = self.rewrite(&mut u) {
                tracing::warn!("custody node: compacting the payment log: {e}");
            }
        }
        Ok(())
    }
}

/// The key a signature is asked of, as [`Customers::authorize`] checks it.
pub(super) enum PayerKey {
    /// A key that signs only as itself: its encumbrance.
    Plain(Encumbrance),
    /// A DKLs23 P-256 key (SEC1 compressed), which also signs as its note keys (the key plus
    /// a tweak, `Authorization::tweak`).
    Notes([u8; 33]),
}

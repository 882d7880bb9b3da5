//! Who may do what: clients, administrators, per-key grants, and taking up a changed config.

use super::*;

/// A key-name pattern of a grant: a whole key name, or a prefix ending in `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    pub(super) prefix: String,
    pub(super) whole: bool,
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
            return Err(NodeError::bad_request(format!(
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
pub(super) struct Rights {
    pub(super) peer: PublicKey,
    pub(super) admin: bool,
    /// The keys it may use; `None`: every key.
    pub(super) keys: Option<Vec<KeyPattern>>,
}

impl Rights {
    pub(super) fn may_use(&self, key_id: &str) -> bool {
        self.admin
            || self
                .keys
                .as_ref()
                .is_none_or(|ps| ps.iter().any(|p| p.matches(key_id)))
    }

    pub(super) fn check_key(&self, key_id: &str) -> Result<(), CustodyError> {
        if self.may_use(key_id) {
            Ok(())
        } else {
            Err(CustodyError::Forbidden(format!(
                "key {key_id} is not granted to this client"
            )))
        }
    }

    /// Whether it may start, step or abort an ECDSA run of `job`.
    pub(super) fn check_job(&self, job: &EcdsaJob) -> Result<(), CustodyError> {
        match job {
            EcdsaJob::Aux | EcdsaJob::Keygen { .. } | EcdsaJob::DklsKeygen { .. }
                if !self.admin =>
            {
                Err(forbidden("key generation"))
            }
            EcdsaJob::DklsRefresh { .. } | EcdsaJob::DklsRefreshComplete { .. } if !self.admin => {
                Err(forbidden("key refresh"))
            }
            EcdsaJob::Aux
            | EcdsaJob::Keygen { .. }
            | EcdsaJob::DklsKeygen { .. }
            | EcdsaJob::DklsRefresh { .. }
            | EcdsaJob::DklsRefreshComplete { .. } => Ok(()),
            EcdsaJob::Presign { key_id, .. }
            | EcdsaJob::Sign { key_id, .. }
            | EcdsaJob::DklsSign { key_id, .. } => self.check_key(key_id),
        }
    }
}

/// Who may connect to a node, and what each peer may use (from `clients`, `admins` and
/// `grants` of its config).
pub(super) struct Access {
    pub(super) clients: Vec<PublicKey>,
    pub(super) admins: Vec<PublicKey>,
    pub(super) grants: Vec<(PublicKey, Vec<KeyPattern>)>,
}

impl Access {
    pub(super) fn from_config(cfg: &CustodyNodeConfig) -> Result<Access, NodeError> {
        let clients = parse_keys(&cfg.clients, "client")?;
        Ok(Access {
            grants: parse_grants(cfg, &clients)?,
            clients,
            admins: parse_keys(&cfg.admins, "admin")?,
        })
    }

    /// What `peer` may do; `None`: it is neither a client nor an administrator.
    pub(super) fn rights(&self, peer: &PublicKey) -> Option<Rights> {
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
pub(super) fn parse_grants(
    cfg: &CustodyNodeConfig,
    clients: &[PublicKey],
) -> Result<Vec<(PublicKey, Vec<KeyPattern>)>, NodeError> {
    let mut out = Vec::with_capacity(cfg.grants.len());
    for (k, patterns) in &cfg.grants {
        let key = PublicKey::parse(k).map_err(|source| {
            NodeError::from(crate::error::BadRequest::Key {
                what: format!("grant for {k}"),
                source,
            })
        })?;
        if !clients.contains(&key) {
            return Err(NodeError::bad_request(format!(
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

pub(super) fn reload_access(inner: &Inner, cfg: &CustodyNodeConfig) -> Result<(), NodeError> {
    let fresh = Access::from_config(cfg)?;
    match inner.access.write() {
        Ok(mut a) => *a = Arc::new(fresh),
        Err(p) => *p.into_inner() = Arc::new(fresh),
    }
    inner.access_gen.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

pub(super) fn access(inner: &Inner) -> Arc<Access> {
    match inner.access.read() {
        Ok(a) => a.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

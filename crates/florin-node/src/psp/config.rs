//! How a provider runs: its configuration, its customers' key scheme, and the checks on
//! account names and payees.

use std::path::PathBuf;

use florin_crypto::SecretKey;
use florin_ledger::Encumbrance;
use serde::{Deserialize, Serialize};

/// The customers' key scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PspScheme {
    /// Threshold ECDSA P-256 (CGGMP24), ledger scheme 2.
    P256,
    /// FROST Ed25519, ledger scheme 1.
    Ed25519,
}

impl PspScheme {
    /// Parses `p256` / `ed25519`.
    pub fn parse(s: &str) -> Option<PspScheme> {
        match s {
            "p256" => Some(PspScheme::P256),
            "ed25519" => Some(PspScheme::Ed25519),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            PspScheme::P256 => "p256",
            PspScheme::Ed25519 => "ed25519",
        }
    }
}

/// How a provider runs.
#[derive(Debug, Clone)]
pub struct PspConfig {
    /// The provider's name (shown to other providers' customers).
    pub name: String,
    /// The books' file.
    pub books: PathBuf,
    /// The ledger's API URL.
    pub ledger: String,
    /// Customers' key scheme.
    pub scheme: PspScheme,
    /// P-256 accounts: presignatures kept ready per account (0: sign interactively; DKLs23
    /// keys always sign interactively).
    pub presign_pool: usize,
    /// P-256 accounts: the threshold ECDSA engine of new accounts' keys (an account keeps the
    /// engine its key was made with).
    pub ecdsa_engine: crate::custody::EcdsaEngine,
    /// P-256 accounts: keys made ahead in the background and kept *pending* at the nodes
    /// (they sign nothing), so opening an account binds its customer to one and commits it
    /// instead of running key generation on the request (0: none).
    pub key_pool: usize,
    /// This provider's peer key: signs its `receive` calls to other providers.
    pub peer_key: SecretKey,
    /// The providers this one pays and takes `receive` calls from.
    pub peers: Vec<PeerPsp>,
    /// The provider's operator keys: their signed requests (`Florin-Operator`,
    /// [`crate::operator`]) may list every account. None: nobody may.
    pub operators: Vec<florin_crypto::PublicKey>,
}

/// Another provider this one knows: the only URLs it ever calls besides the ledger's, and
/// the only callers of its `receive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerPsp {
    /// Its name (what it signs its calls as; `pay` may name it as `to_psp`).
    pub id: String,
    /// Its API URL.
    pub url: String,
    /// Its peer key (`eur1…`).
    pub key: String,
}

impl PeerPsp {
    /// Parses `ID=URL=KEY` (the command line's `--peer`).
    pub fn parse(s: &str) -> Option<PeerPsp> {
        let (id, rest) = s.split_once('=')?;
        let (url, key) = rest.rsplit_once('=')?;
        florin_crypto::PublicKey::parse(key).ok()?;
        let u = url::Url::parse(url).ok()?;
        if !(u.scheme() == "http" || u.scheme() == "https") || !u.has_host() || !valid_account(id) {
            return None;
        }
        Some(PeerPsp {
            id: id.into(),
            url: url.trim_end_matches('/').into(),
            key: key.into(),
        })
    }
}

/// Checks that a payee's encumbrance can be spent by someone before money is signed over to
/// it: an Ed25519 key must be a canonical curve point not of small order (anything else burns
/// the money). A P-256 encumbrance is a key's hash, which cannot be checked; an unknown scheme
/// is refused.
pub fn check_payee(enc: &Encumbrance) -> Result<(), String> {
    match enc.scheme {
        florin_ledger::tx::SCHEME_ED25519 => florin_crypto::PublicKey(enc.key)
            .validate()
            .map_err(|e| e.to_string()),
        florin_ledger::tx::SCHEME_P256 => Ok(()),
        s => Err(format!("unknown key scheme {s}")),
    }
}

/// Account names: short, and safe as key names in the network.
pub fn valid_account(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

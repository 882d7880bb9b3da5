//! Small helpers shared by the commands.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use florin_crypto::SecretKey;
use florin_http::NodeClient;

/// The operator key file given by `--operator-key` or `FLORIN_OPERATOR_KEY` (set once by
/// `main`).
static OPERATOR_KEY: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Records the operator key file for the commands that call privileged routes.
pub fn set_operator_key(path: Option<PathBuf>) {
    let _ = OPERATOR_KEY.set(path);
}

/// The operator key file, if one was given.
pub fn operator_key_path() -> Option<&'static Path> {
    OPERATOR_KEY.get().and_then(|p| p.as_deref())
}

/// Reads an operator key file (64 hex digits, as `florin devnet` and `cluster up` write it);
/// an error names the file.
pub fn read_operator_key(path: &Path) -> Result<SecretKey> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the operator key {}", path.display()))?;
    SecretKey::from_hex(text.trim())
        .with_context(|| format!("operator key {} is damaged", path.display()))
}

/// A client for `node` that signs operator requests with the operator key, when one was
/// given (`--operator-key`, `FLORIN_OPERATOR_KEY`).
pub fn node_client(node: &str, trust: &Trust) -> Result<NodeClient> {
    let client = trust.node(node)?;
    Ok(match operator_key_path() {
        Some(p) => client.with_operator(read_operator_key(p)?),
        None => client,
    })
}

/// A client for `node` that signs with the operator key, which must have been given.
pub fn operator_client(node: &str, trust: &Trust) -> Result<NodeClient> {
    if operator_key_path().is_none() {
        bail!("this command needs the operator's key: --operator-key FILE or FLORIN_OPERATOR_KEY (the devnet and `cluster up` write DATA/operator.key)");
    }
    node_client(node, trust)
}

/// Writes `bytes` to `path` atomically and durably ([`florin_fs::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    florin_fs::write_atomic(path, &[bytes])
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Reads a file with a clear error.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Whether this command printed JSON on stdout already (then a failure does not add the
/// error envelope: stdout stays one JSON document, or JSON lines).
static PRINTED_JSON: AtomicBool = AtomicBool::new(false);

/// Notes that JSON went to stdout.
pub fn printed_json() {
    PRINTED_JSON.store(true, Ordering::Relaxed);
}

/// Whether [`printed_json`] was called.
pub fn has_printed_json() -> bool {
    PRINTED_JSON.load(Ordering::Relaxed)
}

/// Prints JSON on stdout.
pub fn print_json(v: &serde_json::Value) {
    printed_json();
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// A current-thread runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// What `https://` clients trust: the system's roots and the CA file given by `--ca-cert` or
/// `FLORIN_CA_CERT`, read when a client is made (so commands that make none never read it).
#[derive(Clone, Debug, Default)]
pub struct Trust {
    ca_cert: Option<PathBuf>,
}

impl Trust {
    /// Trust for `--ca-cert` (or none).
    pub fn new(ca_cert: Option<PathBuf>) -> Trust {
        Trust { ca_cert }
    }

    /// The client TLS configuration.
    pub fn client_tls(&self) -> Result<florin_http::ClientTls> {
        florin_http::ClientTls::from_optional(self.ca_cert.as_deref()).context("--ca-cert")
    }

    /// A client for the node's API at `base`.
    pub fn node(&self, base: &str) -> Result<florin_http::NodeClient> {
        Ok(florin_http::NodeClient::with_tls(
            base,
            &self.client_tls()?,
        )?)
    }
}

/// A warning the user must read even in `--json` mode (stdout stays the JSON), on standard
/// error whatever the log settings: the care backup words need, what a restore cannot bring
/// back.
#[allow(clippy::print_stderr)]
pub fn warn_user(msg: &str) {
    florin_obs::log::flush();
    eprintln!("warning: {msg}");
}

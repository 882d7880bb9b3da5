//! Small helpers shared by the commands.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Writes `bytes` to `path` atomically and durably ([`florin_fs::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    florin_fs::write_atomic(path, &[bytes])
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Reads a file with a clear error.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Prints JSON on stdout.
pub fn print_json(v: &serde_json::Value) {
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

//! Server TLS options shared by `florin devnet`, `florin psp serve` and `florin cluster up`:
//! TLS from a local CA in `DATA/tls` by default, plain HTTP only by `--plain-http` on loopback.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use florin_http::tls::{check_plain_http, is_valid_name, server_names};
use florin_http::{LocalCa, ServeOptions};

/// The TLS directory inside a data directory.
pub const TLS_DIR: &str = "tls";

/// `--plain-http` and `--tls-name`.
#[derive(Args, Clone, Debug, Default)]
pub struct ServeTlsArgs {
    /// Serve plain HTTP instead of TLS (allowed only on a loopback address).
    #[arg(long)]
    pub plain_http: bool,
    /// Another name (DNS name or IP address) the server certificate covers, besides
    /// localhost, 127.0.0.1, ::1 and the listen address; repeatable.
    #[arg(long = "tls-name", value_name = "NAME")]
    pub tls_names: Vec<String>,
}

impl ServeTlsArgs {
    /// Checks the options for a server on `bind`, before anything is written.
    pub fn check(&self, bind: SocketAddr) -> Result<()> {
        check_names(&self.tls_names)?;
        if self.plain_http {
            check_plain_http(bind)?;
            if !self.tls_names.is_empty() {
                bail!("--tls-name has no use with --plain-http");
            }
        }
        Ok(())
    }
}

/// Every `--tls-name` is a DNS name or an IP address.
pub fn check_names(names: &[String]) -> Result<()> {
    for n in names {
        if !is_valid_name(n) {
            bail!("--tls-name {n:?} is neither a DNS name nor an IP address");
        }
    }
    Ok(())
}

/// What a server prints and serves with.
pub struct Served {
    /// The serve loop's options (TLS or not).
    pub options: ServeOptions,
    /// `https` or `http`.
    pub scheme: &'static str,
    /// The CA certificate clients trust (TLS only).
    pub ca_cert: Option<PathBuf>,
    /// Whether the CA was made by this start.
    pub ca_created: bool,
}

/// Serve options for a server on `bind`: TLS with a certificate issued now from the CA in
/// `tls_dir` (made there when `create` and neither CA file exists), or plain HTTP when `plain`
/// (loopback only).
pub fn serve_options(
    plain: bool,
    names: &[String],
    tls_dir: &Path,
    bind: SocketAddr,
    create: bool,
) -> Result<Served> {
    if plain {
        check_plain_http(bind)?;
        return Ok(Served {
            options: ServeOptions::default(),
            scheme: "http",
            ca_cert: None,
            ca_created: false,
        });
    }
    check_names(names)?;
    let (ca, created) = if create {
        LocalCa::load_or_create(tls_dir)?
    } else {
        (LocalCa::load(tls_dir)?, false)
    };
    let tls = ca
        .server_tls(&server_names(bind, names))
        .context("issuing the server certificate")?;
    Ok(Served {
        options: ServeOptions::with_tls(Some(tls)),
        scheme: "https",
        ca_cert: Some(ca.cert_path()),
        ca_created: created,
    })
}

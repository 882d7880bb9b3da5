//! TLS for every HTTP listener and client (rustls, the `ring` provider).
//!
//! - A server's identity comes from a **local CA** ([`LocalCa`]): `DIR/ca.pem` (the CA's
//!   certificate, the file clients trust) and `DIR/ca.key` (its private key, mode 0600), made
//!   once with ECDSA P-256 and reused on every start. The server certificate is issued afresh
//!   from the CA at each start for the names the server answers to ([`server_names`]), so a
//!   changed bind address or `--tls-name` needs no new CA. A damaged, unreadable or half-present
//!   CA is an error naming the file: it is never regenerated over.
//! - A client trusts the system's roots plus the certificates of a CA file ([`ClientTls`]):
//!   `--ca-cert FILE` or `FLORIN_CA_CERT` in the CLI. The file may hold several certificates
//!   (a bundle).
//! - Plain HTTP is allowed only on loopback ([`check_plain_http`]).

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The CA certificate's file name in a TLS directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// The CA private key's file name in a TLS directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// The CA's subject (fixed: server certificates are issued under it at every start).
const CA_NAME: &str = "Florin local CA";

/// What went wrong with TLS material or settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file is there but is not what it should be.
    #[error("{path} is damaged: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One file of a pair is missing.
    #[error("{path} is missing but {other} exists: refusing to make a new CA over it (restore the file, or remove both to start afresh)")]
    Missing {
        /// The missing file.
        path: PathBuf,
        /// The file that is there.
        other: PathBuf,
    },
    /// A certificate could not be made.
    #[error("cannot issue a certificate: {0}")]
    Issue(String),
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// Plain HTTP asked for on an address that is not loopback.
    #[error("--plain-http is allowed only on a loopback address, not {0} (serve TLS instead)")]
    PlainNotLoopback(SocketAddr),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Refuses plain HTTP on an address that is not loopback.
pub fn check_plain_http(bind: SocketAddr) -> Result<(), TlsError> {
    if bind.ip().is_loopback() {
        Ok(())
    } else {
        Err(TlsError::PlainNotLoopback(bind))
    }
}

/// Whether `name` can be a server certificate's name (a DNS name or an IP address).
pub fn is_valid_name(name: &str) -> bool {
    ServerName::try_from(name).is_ok()
}

/// The names a server on `bind` answers to: `localhost`, `127.0.0.1`, `::1`, the bind address
/// (unless it is a wildcard) and `extra` (e.g. `--tls-name`).
pub fn server_names(bind: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        IpAddr::V4(Ipv4Addr::LOCALHOST).to_string(),
        IpAddr::V6(Ipv6Addr::LOCALHOST).to_string(),
    ];
    if !bind.ip().is_unspecified() {
        names.push(bind.ip().to_string());
    }
    for n in extra {
        if !names.contains(n) {
            names.push(n.clone());
        }
    }
    names.dedup();
    names
}

/// A server's TLS configuration (certificate chain and key), cheap to clone.
#[derive(Clone)]
pub struct ServerTls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl ServerTls {
    /// From a certificate chain (leaf first) and its private key, both PEM.
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<ServerTls, TlsError> {
        let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Issue(format!("certificate PEM: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TlsError::Issue(format!("key PEM: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ServerTls(Arc::new(config)))
    }

    /// The rustls configuration.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.0.clone()
    }
}

/// A local certificate authority kept in a directory (see the module's documentation).
pub struct LocalCa {
    dir: PathBuf,
    cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for LocalCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCa").field("dir", &self.dir).finish()
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn read_text(path: &Path) -> Result<String, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    String::from_utf8(bytes).map_err(|_| TlsError::Damaged {
        path: path.to_path_buf(),
        reason: "not PEM text".into(),
    })
}

/// Writes `bytes` to `path` through a temporary file and a rename, with `mode` (Unix).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let err = |source| TlsError::Write {
        path: path.to_path_buf(),
        source,
    };
    // One temporary name per file (`ca.key.tmp`, `ca.pem.tmp`).
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    // A temporary file left by an earlier crash may have other permissions (a mode applies
    // only when a file is created): it goes, and ours is created afresh.
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = opts.open(&tmp).map_err(err)?;
    // The umask may have taken bits away, never added them; set exactly `mode` anyway.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(err)?;
    }
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(err)?;
    // The rename itself is durable once the directory is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(err)?;
    }
    Ok(())
}

impl LocalCa {
    /// The CA in `dir`, made there (directory mode 0700) when neither file exists.
    /// Returns whether it was made now.
    pub fn load_or_create(dir: &Path) -> Result<(LocalCa, bool), TlsError> {
        let (cert, key) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        if !cert.exists() && !key.exists() {
            return Ok((Self::create(dir)?, true));
        }
        Ok((Self::load(dir)?, false))
    }

    /// The CA in `dir`; both files must be there and sound.
    pub fn load(dir: &Path) -> Result<LocalCa, TlsError> {
        let (cert_path, key_path) = (dir.join(CA_CERT_FILE), dir.join(CA_KEY_FILE));
        for (a, b) in [(&cert_path, &key_path), (&key_path, &cert_path)] {
            if !a.exists() {
                return Err(TlsError::Missing {
                    path: a.clone(),
                    other: b.clone(),
                });
            }
        }
        let cert_pem = read_text(&cert_path)?;
        let key_pem = read_text(&key_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::Damaged {
            path: key_path.clone(),
            reason: format!("not a private key ({e})"),
        })?;
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Damaged {
                path: cert_path.clone(),
                reason: format!("not a PEM certificate ({e})"),
            })?;
        if certs.len() != 1 {
            return Err(TlsError::Damaged {
                path: cert_path,
                reason: format!("expected one certificate, found {}", certs.len()),
            });
        }
        let ca = LocalCa {
            dir: dir.to_path_buf(),
            cert_pem,
            key,
        };
        // The certificate must be the key's: a server certificate issued now must verify
        // against it (this also parses the certificate fully).
        let (leaf, _) = ca.issue(&["localhost".to_string()])?;
        let client = ClientTls::from_pem_bytes(ca.cert_pem.as_bytes(), &cert_path)?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(client.root_store(false)),
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Damaged {
            path: cert_path.clone(),
            reason: format!("not a usable CA certificate ({e})"),
        })?;
        let leaf_der = CertificateDer::from_pem_slice(leaf.as_bytes())
            .map_err(|e| TlsError::Issue(e.to_string()))?;
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(
                &leaf_der,
                &[],
                &ServerName::try_from("localhost").map_err(|e| TlsError::Issue(e.to_string()))?,
                &[],
                rustls::pki_types::UnixTime::now(),
            )
            .map_err(|e| TlsError::Damaged {
                path: cert_path.clone(),
                reason: format!("does not belong to the key in {} ({e})", key_path.display()),
            })?;
        Ok(ca)
    }

    fn create(dir: &Path) -> Result<LocalCa, TlsError> {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            b.mode(0o700);
        }
        b.create(dir).map_err(|source| TlsError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TlsError::Issue(e.to_string()))?;
        let cert = ca_params()
            .self_signed(&key)
            .map_err(|e| TlsError::Issue(e.to_string()))?;
        // The key first: a start killed between the two leaves a key without a certificate,
        // refused clearly at the next start.
        write_new(
            &dir.join(CA_KEY_FILE),
            key.serialize_pem().as_bytes(),
            0o600,
        )?;
        write_new(&dir.join(CA_CERT_FILE), cert.pem().as_bytes(), 0o644)?;
        Ok(LocalCa {
            dir: dir.to_path_buf(),
            cert_pem: cert.pem(),
            key,
        })
    }

    /// The CA certificate's file (what clients trust).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CA_CERT_FILE)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A fresh server certificate for `names` (PEM chain: leaf, CA) and its key (PEM).
    pub fn issue(&self, names: &[String]) -> Result<(String, String), TlsError> {
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(|e| TlsError::Issue(e.to_string()))?;
        let mut params =
            CertificateParams::new(names.to_vec()).map_err(|e| TlsError::Issue(e.to_string()))?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let issuer = Issuer::new(ca_params(), &self.key);
        let leaf = params
            .signed_by(&leaf_key, &issuer)
            .map_err(|e| TlsError::Issue(e.to_string()))?;
        Ok((
            format!("{}{}", leaf.pem(), self.cert_pem),
            leaf_key.serialize_pem(),
        ))
    }

    /// A server configuration with a certificate issued now for `names`.
    pub fn server_tls(&self, names: &[String]) -> Result<ServerTls, TlsError> {
        let (chain, key) = self.issue(names)?;
        ServerTls::from_pem(&chain, &key)
    }
}

/// What a client trusts: the system's roots and, when given, the certificates of a CA file.
#[derive(Clone, Default)]
pub struct ClientTls {
    extra: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("extra_roots", &self.extra.len())
            .finish()
    }
}

impl ClientTls {
    /// The system's roots only.
    pub fn system() -> ClientTls {
        ClientTls::default()
    }

    /// The system's roots and every certificate in the PEM file `path`.
    pub fn from_ca_file(path: &Path) -> Result<ClientTls, TlsError> {
        let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_pem_bytes(&bytes, path)
    }

    /// [`ClientTls::from_ca_file`] when `path` is given, else [`ClientTls::system`].
    pub fn from_optional(path: Option<&Path>) -> Result<ClientTls, TlsError> {
        match path {
            Some(p) => Self::from_ca_file(p),
            None => Ok(Self::system()),
        }
    }

    fn from_pem_bytes(bytes: &[u8], path: &Path) -> Result<ClientTls, TlsError> {
        let damaged = |reason: String| TlsError::Damaged {
            path: path.to_path_buf(),
            reason,
        };
        let extra = CertificateDer::pem_slice_iter(bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| damaged(format!("not PEM certificates ({e})")))?;
        if extra.is_empty() {
            return Err(damaged("holds no PEM certificate".into()));
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in &extra {
            roots
                .add(c.clone())
                .map_err(|e| damaged(format!("not a usable CA certificate ({e})")))?;
        }
        Ok(ClientTls { extra })
    }

    fn root_store(&self, system: bool) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        if system {
            // Unreadable system certificates are skipped: the given CA still works.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
        roots.add_parsable_certificates(self.extra.iter().cloned());
        roots
    }

    /// The rustls client configuration (HTTP/1.1).
    pub fn rustls_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(self.root_store(true))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A reqwest client builder that trusts what this trusts.
    pub fn reqwest_builder(&self) -> Result<reqwest::ClientBuilder, TlsError> {
        // Florin's servers close a kept-alive connection idle for 10 s
        // (`ServeOptions::header_read_timeout`); a client that picked one up at that moment
        // would race the close and lose its request. Idle connections are let go first.
        Ok(reqwest::Client::builder()
            .use_preconfigured_tls(self.rustls_config()?)
            .pool_idle_timeout(std::time::Duration::from_secs(5)))
    }
}

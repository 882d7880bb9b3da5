//! PostgreSQL over TLS, with rustls (the same TLS stack as the rest of Florin: one rustls, one
//! `ring`). [`PgTls`] is what `postgres::Client::connect` takes instead of `NoTls`: it verifies
//! the server's certificate against the given CA (or the system's roots) and the host name in
//! the connection string (`host=db.example` or an IP address the certificate names).
//!
//! A store given a [`PgTls`] requires TLS whatever the connection string's `sslmode` says (with
//! `prefer`, libpq's default, a man in the middle could answer "no TLS" and the session would
//! go on in the clear). SCRAM channel binding is not offered (`ChannelBinding::none`): the
//! certificate check already binds the session to the server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use florin_ledger::StoreError;

/// TLS for PostgreSQL connections: the roots a server's certificate must chain to.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTls").finish_non_exhaustive()
    }
}

impl PgTls {
    /// Trusts the CA certificates in `pem` (PEM text; one or more certificates).
    pub fn from_ca_pem(pem: &[u8]) -> Result<PgTls, StoreError> {
        let mut roots = rustls::RootCertStore::empty();
        let mut n = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| {
                StoreError::Backend(format!("PostgreSQL CA: not PEM certificates: {e}"))
            })?;
            roots
                .add(cert)
                .map_err(|e| StoreError::Backend(format!("PostgreSQL CA: {e}")))?;
            n += 1;
        }
        if n == 0 {
            return Err(StoreError::Backend(
                "PostgreSQL CA: no certificate in the file".into(),
            ));
        }
        Self::with_roots(roots)
    }

    /// Trusts the CA certificates in the file `path`.
    pub fn from_ca_file(path: &std::path::Path) -> Result<PgTls, StoreError> {
        let pem = std::fs::read(path)
            .map_err(|e| StoreError::Backend(format!("PostgreSQL CA {}: {e}", path.display())))?;
        Self::from_ca_pem(&pem)
    }

    fn with_roots(roots: rustls::RootCertStore) -> Result<PgTls, StoreError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Backend(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(PgTls {
            config: Arc::new(config),
        })
    }
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<PgTlsConnect, Self::Error> {
        Ok(PgTlsConnect {
            connector: tokio_rustls::TlsConnector::from(self.config.clone()),
            name: ServerName::try_from(host.to_string())?,
        })
    }
}

/// One connection's TLS handshake (made by [`PgTls`]).
pub struct PgTlsConnect {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<PgTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            self.connector
                .connect(self.name, stream)
                .await
                .map(|s| PgTlsStream(Box::new(s)))
        })
    }
}

/// A PostgreSQL connection over TLS.
pub struct PgTlsStream<S>(Box<tokio_rustls::client::TlsStream<S>>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

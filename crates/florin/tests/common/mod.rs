//! What the CLI's test files share: the `florin` binary, a devnet process on loopback (TLS by
//! default, its CA registered for its URL), running `florin` commands (with `FLORIN_CA_CERT`
//! set to the CA of the server they talk to), and HTTP GETs over TLS or plain HTTP.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_florin");

/// Starts a server process and reads the URL it prints first (`listening on URL`).
pub fn spawn_listening(mut cmd: Command) -> (Child, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the process prints its URL first, got {line:?}"))
        .to_string();
    (child, url)
}

/// The CA certificates of the TLS servers the tests started, by base URL (tests run in
/// parallel threads: each server's URL is unique).
static CAS: Mutex<Vec<(String, PathBuf)>> = Mutex::new(Vec::new());

/// Remembers that the server at `url` (`https://host:port`) has its certificate from `ca`.
pub fn register_ca(url: &str, ca: &Path) {
    let url = url.trim_end_matches('/').to_string();
    let mut cas = CAS.lock().unwrap();
    // A port used again by a later server: the later one's CA.
    cas.retain(|(u, _)| *u != url);
    cas.push((url, ca.to_path_buf()));
}

/// The CA registered for the server at `url`.
pub fn ca_for(url: &str) -> Option<PathBuf> {
    let url = url.trim_end_matches('/');
    CAS.lock()
        .unwrap()
        .iter()
        .find(|(u, _)| u == url)
        .map(|(_, c)| c.clone())
}

/// `florin ARGS` in `dir` against the node at `node` (trusting its CA when it serves TLS).
pub fn florin(dir: &Path, node: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir).env("FLORIN_NODE", node).args(args);
    match ca_for(node) {
        Some(ca) => cmd.env("FLORIN_CA_CERT", ca),
        None => cmd.env_remove("FLORIN_CA_CERT"),
    };
    cmd.output().unwrap()
}

/// A byte stream to a server.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// A rustls client trusting exactly the certificates in `ca` (PEM).
pub fn tls_client(ca: &Path) -> Arc<rustls::ClientConfig> {
    let pem = std::fs::read(ca).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        let c: rustls::pki_types::CertificateDer<'static> = c.unwrap();
        roots.add(c).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// A connection to `target`: `https://host:port` (TLS, trusting the CA registered for it),
/// `http://host:port` or `host:port` (plain).
pub fn connect(target: &str) -> std::io::Result<Box<dyn Stream>> {
    if let Some(hostport) = target.strip_prefix("https://") {
        let hostport = hostport.trim_end_matches('/');
        let ca = ca_for(target).unwrap_or_else(|| panic!("no CA registered for {target}"));
        let tcp = std::net::TcpStream::connect(hostport)?;
        let host = hostport.rsplit_once(':').map(|h| h.0).unwrap_or(hostport);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
        let conn = rustls::ClientConnection::new(tls_client(&ca), name).unwrap();
        return Ok(Box::new(rustls::StreamOwned::new(conn, tcp)));
    }
    let addr = target.trim_start_matches("http://").trim_end_matches('/');
    Ok(Box::new(std::net::TcpStream::connect(addr)?))
}

/// Reads until the peer closes (a TLS peer that closes without `close_notify` ends it too).
fn read_all(s: &mut dyn Stream) -> String {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        match s.read(&mut tmp) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// GET `path` from `target` (an `https://` or `http://` URL, or `host:port`) over HTTP/1.0:
/// the whole answer, head and body.
pub fn http_get(target: &str, path: &str) -> String {
    let mut s = connect(target).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nhost: florin\r\n\r\n").unwrap();
    s.flush().unwrap();
    read_all(&mut *s)
}

/// A `florin devnet` process, killed when dropped.
pub struct Devnet {
    pub child: Child,
    pub url: String,
}

impl Devnet {
    pub fn start(data: &Path) -> Devnet {
        Self::start_with(data, &[])
    }

    pub fn start_with(data: &Path, extra: &[&str]) -> Devnet {
        let mut cmd = Command::new(BIN);
        cmd.args(["devnet", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
            .args(extra);
        let (child, url) = spawn_listening(cmd);
        if url.starts_with("https://") {
            register_ca(&url, &data.join("tls").join("ca.pem"));
        }
        let d = Devnet { child, url };
        d.wait_healthy();
        d
    }

    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = connect(&self.url) {
                let _ = s.write_all(b"GET /v1/health HTTP/1.0\r\n\r\n");
                let _ = s.flush();
                let buf = read_all(&mut *s);
                if buf.starts_with("HTTP/1.0 200") || buf.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("devnet did not become healthy");
    }

    /// GET `path` (JSON).
    pub fn get(&self, path: &str) -> Value {
        let buf = http_get(&self.url, path);
        let body = buf.split("\r\n\r\n").nth(1).unwrap_or("");
        serde_json::from_str(body).unwrap()
    }

    /// `kill -9`.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `kill -9` once the acknowledgement mark has had time to follow (it is written every
    /// 100 ms).
    pub fn crash(mut self) {
        std::thread::sleep(Duration::from_millis(400));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Devnet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

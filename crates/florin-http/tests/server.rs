//! The server loop on real sockets: the header read timeout, the TLS handshake timeout, the
//! connection cap, the peer's address for handlers, draining at shutdown, and TLS from a local
//! CA (trusted with the CA, refused without it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use florin_http::server::serve_router;
use florin_http::{ClientTls, LocalCa, ServeOptions};

/// A server on loopback in its own runtime; stopped (and drained) when dropped.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::sync::mpsc::Receiver<()>>,
    _rt: tokio::runtime::Runtime,
}

fn app() -> Router {
    Router::new()
        .route(
            "/peer",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        )
        .route("/big", get(|| async { vec![7u8; 64 << 20] }))
        .route(
            "/id",
            get(|| async {
                florin_http::observe::current_request_id()
                    .map(|id| id.to_string())
                    .unwrap_or_default()
            }),
        )
        .route("/item/{n}", get(|| async { "item" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(800)).await;
                "slow done"
            }),
        )
}

impl Server {
    fn start(options: ServeOptions) -> Server {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = std::sync::mpsc::channel();
        rt.spawn(async move {
            serve_router(listener, app(), options, async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
            let _ = done_tx.send(());
        });
        Server {
            addr,
            stop: Some(stop),
            done: Some(done),
            _rt: rt,
        }
    }

    /// Asks the server to stop; returns when its loop has returned.
    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.recv_timeout(Duration::from_secs(20))
                .expect("the server loop returns after draining");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// GET `path` over a fresh plain connection: the whole answer.
fn get_plain(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nhost: t\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    buf
}

/// Whether the server closed `s` (end of stream or reset) within `within`, reading and
/// discarding anything it sent first (e.g. a 408 answer).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut tmp = [0u8; 1024];
    loop {
        match s.read(&mut tmp) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

/// A raw request with `head` (the request line and headers, CRLF-separated, no final blank
/// line): the whole answer.
fn raw(addr: SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "{head}\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    buf
}

#[test]
fn every_request_gets_an_id_handlers_can_send_on_and_is_counted_by_route_template() {
    let server = Server::start(ServeOptions::default());
    // A valid id is kept, answered, and what the handler's task sees.
    let a = raw(
        server.addr,
        "GET /id HTTP/1.0\r\nx-request-id: pay-42.retry_1",
    );
    assert!(
        a.to_ascii_lowercase()
            .contains("x-request-id: pay-42.retry_1"),
        "{a}"
    );
    assert!(a.ends_with("pay-42.retry_1"), "{a}");
    // Hostile ids are replaced by a fresh one, which the handler sees too.
    for bad in ["has space", "quote\"", &"x".repeat(65), "semi;colon"] {
        let a = raw(
            server.addr,
            &format!("GET /id HTTP/1.0\r\nx-request-id: {bad}"),
        );
        let body = a.split("\r\n\r\n").nth(1).unwrap();
        assert_eq!(body.len(), 16, "{a}");
        assert!(!a.contains(bad));
        assert!(a.contains(&format!("x-request-id: {body}")), "{a}");
    }
    // Counted under the route's template, never the path asked; odd methods as `other`.
    let before = florin_obs::metrics::global().encode();
    for n in 0..3 {
        raw(server.addr, &format!("GET /item/{n} HTTP/1.0"));
    }
    raw(server.addr, "FROB /item/9 HTTP/1.0");
    raw(server.addr, "GET /no/such/thing HTTP/1.0");
    let after = florin_obs::metrics::global().encode();
    let delta = |name: &str| {
        florin_obs::metrics::sample(&after, name).unwrap_or(0.0)
            - florin_obs::metrics::sample(&before, name).unwrap_or(0.0)
    };
    assert_eq!(
        delta("florin_http_requests_total{route=\"/item/{n}\",method=\"GET\",status=\"200\"}"),
        3.0,
        "{after}"
    );
    assert_eq!(
        delta("florin_http_requests_total{route=\"/item/{n}\",method=\"other\",status=\"405\"}"),
        1.0,
        "{after}"
    );
    assert_eq!(
        delta("florin_http_requests_total{route=\"unmatched\",method=\"GET\",status=\"404\"}"),
        1.0,
        "{after}"
    );
    assert!(!after.contains("/item/0") && !after.contains("/no/such"));
}

#[test]
fn handlers_see_the_peer_address() {
    let server = Server::start(ServeOptions::default());
    let mut s = TcpStream::connect(server.addr).unwrap();
    let local = s.local_addr().unwrap();
    write!(s, "GET /peer HTTP/1.0\r\nhost: t\r\n\r\n").unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    assert!(buf.starts_with("HTTP/1.0 200"), "{buf}");
    assert!(buf.ends_with(&local.to_string()), "{buf}");
}

#[test]
fn half_a_header_is_closed_after_the_timeout_while_others_are_served() {
    // Other clients connect as fast as they can, from the same address.
    let server = Server::start(ServeOptions {
        header_read_timeout: Duration::from_secs(2),
        ..ServeOptions::default().without_per_address_limits()
    });
    let mut slow = TcpStream::connect(server.addr).unwrap();
    slow.write_all(b"GET /peer HTTP/1.1\r\nhost: t\r\nx-half: ")
        .unwrap();
    let started = Instant::now();
    // Meanwhile other clients are served, again and again.
    let mut served = 0;
    while started.elapsed() < Duration::from_millis(1200) {
        let answer = get_plain(server.addr, "/peer");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        served += 1;
    }
    assert!(served >= 2);
    // Not yet closed before its deadline...
    assert!(
        !closed_within(&mut slow, Duration::from_millis(200)),
        "closed before the header timeout"
    );
    // ...and closed after it (generous margin: no timing claim beyond "closed").
    assert!(
        closed_within(&mut slow, Duration::from_secs(10)),
        "a half-sent header must not hold its connection open"
    );
}

#[test]
fn an_idle_connection_is_closed_after_the_header_timeout() {
    let server = Server::start(ServeOptions {
        header_read_timeout: Duration::from_secs(1),
        ..ServeOptions::default()
    });
    let mut idle = TcpStream::connect(server.addr).unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(10)));
}

#[test]
fn the_connection_cap_holds_and_frees_on_close() {
    let server = Server::start(ServeOptions {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(60),
        park_for: Duration::from_millis(300),
        ..ServeOptions::default()
    });
    // Two connections hold the two places (each proven served once: it is open, accepted).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(server.addr).unwrap();
        s.write_all(b"GET /peer HTTP/1.1\r\nhost: t\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut tmp = [0u8; 1024];
        let n = s.read(&mut tmp).unwrap();
        assert!(tmp[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    // A third is never answered (parked a moment, then closed).
    for _ in 0..3 {
        let mut extra = TcpStream::connect(server.addr).unwrap();
        let _ = extra.write_all(b"GET /peer HTTP/1.0\r\nhost: t\r\n\r\n");
        extra
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = Vec::new();
        let _ = extra.read_to_end(&mut buf);
        assert!(
            buf.is_empty(),
            "a connection over the cap is served: {} bytes",
            buf.len()
        );
    }
    // The held ones are still served.
    held[0]
        .write_all(b"GET /peer HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    let mut tmp = [0u8; 1024];
    let n = held[0].read(&mut tmp).unwrap();
    assert!(tmp[..n].starts_with(b"HTTP/1.1 200"));
    // One closes: a new connection is served again (once the server has seen the close).
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = TcpStream::connect(server.addr).unwrap();
        let _ = s.write_all(b"GET /peer HTTP/1.0\r\nhost: t\r\n\r\n");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = String::new();
        let _ = s.read_to_string(&mut buf);
        if buf.starts_with("HTTP/1.0 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the freed place is never reused");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn shutdown_drains_a_request_in_flight() {
    let mut server = Server::start(ServeOptions::default());
    let addr = server.addr;
    let t = std::thread::spawn(move || get_plain(addr, "/slow"));
    std::thread::sleep(Duration::from_millis(200));
    server.shutdown();
    let answer = t.join().unwrap();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("slow done"), "{answer}");
    // Stopped: nothing is accepted any more.
    assert!(TcpStream::connect(addr).is_err() || get_plain_fails(addr));
}

fn get_plain_fails(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return true;
    };
    let _ = s.write_all(b"GET /peer HTTP/1.0\r\n\r\n");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf.is_empty()
}

/// A TLS server from a fresh local CA, and that CA's certificate file.
fn tls_server(dir: &std::path::Path, options: ServeOptions) -> (Server, std::path::PathBuf) {
    let (ca, created) = LocalCa::load_or_create(&dir.join("tls")).unwrap();
    assert!(created);
    let names = florin_http::tls::server_names("127.0.0.1:0".parse().unwrap(), &[]);
    let tls = ca.server_tls(&names).unwrap();
    let server = Server::start(ServeOptions {
        tls: Some(tls),
        ..options
    });
    (server, ca.cert_path())
}

#[test]
fn tls_is_served_to_a_client_trusting_the_ca_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = tls_server(dir.path(), ServeOptions::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{}/peer", server.addr.port());
    // Trusting the CA file: served, over TLS.
    let trusted = ClientTls::from_ca_file(&ca)
        .unwrap()
        .reqwest_builder()
        .unwrap()
        .build()
        .unwrap();
    let body = rt
        .block_on(async { trusted.get(&url).send().await?.text().await })
        .unwrap();
    assert!(body.starts_with("127.0.0.1:"), "{body}");
    // The same name by `localhost` is covered too.
    let by_name = format!("https://localhost:{}/peer", server.addr.port());
    let body = rt
        .block_on(async { trusted.get(&by_name).send().await?.text().await })
        .unwrap();
    assert!(body.starts_with("127.0.0.1:"), "{body}");
    // The system's roots alone: a certificate error.
    let untrusted = ClientTls::system()
        .reqwest_builder()
        .unwrap()
        .build()
        .unwrap();
    let err = rt
        .block_on(async { untrusted.get(&url).send().await })
        .unwrap_err();
    let chain = error_chain(&err);
    assert!(
        chain.contains("certificate"),
        "a certificate error, got: {chain}"
    );
    // Plain HTTP to the TLS port gets no answer.
    let mut s = TcpStream::connect(server.addr).unwrap();
    let _ = s.write_all(b"GET /peer HTTP/1.0\r\n\r\n");
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(!buf.starts_with(b"HTTP/1.0 200"));
}

#[test]
fn a_stalled_tls_handshake_is_closed_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = tls_server(
        dir.path(),
        ServeOptions {
            tls_handshake_timeout: Duration::from_secs(1),
            ..ServeOptions::default()
        },
    );
    let mut s = TcpStream::connect(server.addr).unwrap();
    // A TLS record header and nothing more.
    s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).unwrap();
    assert!(
        closed_within(&mut s, Duration::from_secs(10)),
        "a stalled handshake must not hold its connection open"
    );
}

#[test]
fn a_local_ca_is_reused_and_refused_when_damaged_or_half_there() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    let (ca, created) = LocalCa::load_or_create(&tls).unwrap();
    assert!(created);
    let pem = std::fs::read(ca.cert_path()).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tls.join("ca.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the CA key is private: {mode:o}");
    }
    // Reused on the next start.
    let (again, created) = LocalCa::load_or_create(&tls).unwrap();
    assert!(!created);
    assert_eq!(std::fs::read(again.cert_path()).unwrap(), pem);
    // A damaged certificate: an error naming it; nothing is rewritten.
    let mut bad = pem.clone();
    let mid = bad.len() / 2;
    bad[mid] = if bad[mid] == b'A' { b'B' } else { b'A' };
    std::fs::write(tls.join("ca.pem"), &bad).unwrap();
    let err = LocalCa::load_or_create(&tls).unwrap_err().to_string();
    assert!(err.contains("ca.pem"), "{err}");
    assert_eq!(std::fs::read(tls.join("ca.pem")).unwrap(), bad);
    // Another CA's certificate beside this key: refused.
    let other = dir.path().join("other");
    LocalCa::load_or_create(&other).unwrap();
    std::fs::copy(other.join("ca.pem"), tls.join("ca.pem")).unwrap();
    let err = LocalCa::load_or_create(&tls).unwrap_err().to_string();
    assert!(
        err.contains("ca.pem") && err.contains("does not belong"),
        "{err}"
    );
    // A damaged key.
    std::fs::write(tls.join("ca.pem"), &pem).unwrap();
    LocalCa::load_or_create(&tls).unwrap();
    std::fs::write(
        tls.join("ca.key"),
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let err = LocalCa::load_or_create(&tls).unwrap_err().to_string();
    assert!(err.contains("ca.key"), "{err}");
    // The key gone, the certificate there: refused, never a new CA.
    std::fs::remove_file(tls.join("ca.key")).unwrap();
    let err = LocalCa::load_or_create(&tls).unwrap_err().to_string();
    assert!(err.contains("ca.key") && err.contains("missing"), "{err}");
    assert!(!tls.join("ca.key").exists());
    // A CA file for clients that holds no certificate: refused, naming it.
    std::fs::write(dir.path().join("empty.pem"), b"nothing").unwrap();
    let err = ClientTls::from_ca_file(&dir.path().join("empty.pem"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty.pem"), "{err}");
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A plain connection to `addr` from the loopback address `from` (127.0.0.0/8 is all local).
fn connect_from(from: &str, addr: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{from}:0").parse().unwrap()).unwrap();
        s.connect(addr).await.unwrap().into_std().unwrap()
    })
}

/// Whether a GET on a fresh connection from `from` is answered (not closed unanswered).
fn served_from(from: &str, addr: SocketAddr) -> bool {
    let mut s = connect_from(from, addr);
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(b"GET /peer HTTP/1.0\r\nhost: t\r\n\r\n");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    buf.starts_with(b"HTTP/1.0 200")
}

#[test]
fn one_address_cannot_take_every_place() {
    let server = Server::start(ServeOptions {
        max_connections: 100,
        max_connections_per_ip: 2,
        header_read_timeout: Duration::from_secs(60),
        park_for: Duration::from_millis(300),
        ..ServeOptions::default()
    });
    // 127.0.0.5 holds its two places (each proven accepted by an answer).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from("127.0.0.5", server.addr);
        s.set_nonblocking(false).unwrap();
        s.write_all(b"GET /peer HTTP/1.1\r\nhost: t\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut tmp = [0u8; 1024];
        let n = s.read(&mut tmp).unwrap();
        assert!(tmp[..n].starts_with(b"HTTP/1.1 200"));
        held.push(s);
    }
    // Its third is closed unanswered; another address is served.
    assert!(!served_from("127.0.0.5", server.addr));
    assert!(served_from("127.0.0.6", server.addr));
    // Once one of its connections closes, the address is served again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !served_from("127.0.0.5", server.addr) {
        assert!(Instant::now() < deadline, "the freed place is never reused");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn new_connections_per_address_are_rate_limited() {
    let server = Server::start(ServeOptions {
        new_connections_per_ip_per_sec: 1,
        park_for: Duration::from_millis(100),
        ..ServeOptions::default()
    });
    // A burst of ten times the rate passes; then the address is closed at once until its
    // rate lets it in again; another address is not affected.
    let served = (0..14)
        .filter(|_| served_from("127.0.0.7", server.addr))
        .count();
    assert!((10..=12).contains(&served), "{served} of 14 served");
    assert!(!served_from("127.0.0.7", server.addr));
    assert!(served_from("127.0.0.8", server.addr));
    std::thread::sleep(Duration::from_millis(1100));
    assert!(served_from("127.0.0.7", server.addr));
}

#[test]
fn a_client_that_stops_reading_loses_its_place() {
    let server = Server::start(ServeOptions {
        max_connections_per_ip: 1,
        write_timeout: Duration::from_secs(1),
        park_for: Duration::from_millis(100),
        ..ServeOptions::default()
    });
    // Asks for 64 MiB and reads none of it: the node's writes stall once the buffers are full.
    let mut stalled = connect_from("127.0.0.9", server.addr);
    stalled.set_nonblocking(false).unwrap();
    stalled
        .write_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // It holds the address's one place...
    assert!(!served_from("127.0.0.9", server.addr));
    // ...until the write deadline closes it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !served_from("127.0.0.9", server.addr) {
        assert!(
            Instant::now() < deadline,
            "the stalled connection keeps its place"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // What it gets is cut short.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = 0usize;
    let mut tmp = vec![0u8; 1 << 16];
    while let Ok(n) = stalled.read(&mut tmp) {
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(got < 64 << 20, "the whole answer arrived ({got} bytes)");
}

/// Whether `s` stays open and unanswered for `at_least`, then is closed within `then`.
fn parked(s: &mut TcpStream, at_least: Duration, then: Duration) -> bool {
    let start = Instant::now();
    s.set_read_timeout(Some(at_least + then)).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let held = start.elapsed();
    buf.is_empty() && held >= at_least && held < at_least + then
}

#[test]
fn refused_connections_are_parked_then_closed_and_the_lot_is_bounded() {
    let server = Server::start(ServeOptions {
        max_connections_per_ip: 1,
        header_read_timeout: Duration::from_secs(60),
        max_parked: 2,
        park_for: Duration::from_millis(1500),
        ..ServeOptions::default()
    });
    // 127.0.0.10 holds its one place.
    let mut held = connect_from("127.0.0.10", server.addr);
    held.set_nonblocking(false).unwrap();
    held.write_all(b"GET /peer HTTP/1.1\r\nhost: t\r\n\r\n")
        .unwrap();
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut tmp = [0u8; 1024];
    let n = held.read(&mut tmp).unwrap();
    assert!(tmp[..n].starts_with(b"HTTP/1.1 200"));
    // Two more fill the lot: held unanswered, then closed.
    let parked_at = Instant::now();
    let mut lot: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect_from("127.0.0.10", server.addr);
            s.set_nonblocking(false).unwrap();
            let _ = s.write_all(b"GET /peer HTTP/1.0\r\nhost: t\r\n\r\n");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // The lot is full: the next is closed at once.
    let mut extra = connect_from("127.0.0.10", server.addr);
    extra.set_nonblocking(false).unwrap();
    let _ = extra.write_all(b"GET /peer HTTP/1.0\r\nhost: t\r\n\r\n");
    assert!(parked(
        &mut extra,
        Duration::ZERO,
        Duration::from_millis(1000)
    ));
    for s in &mut lot {
        assert!(parked(s, Duration::ZERO, Duration::from_secs(5)));
    }
    let held_for = parked_at.elapsed();
    assert!(
        held_for >= Duration::from_millis(1400),
        "parked only {held_for:?}"
    );
    // Another address is served all along.
    assert!(served_from("127.0.0.11", server.addr));
}

#[cfg(unix)]
#[test]
fn a_stale_temporary_file_does_not_loosen_the_ca_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    // Left by a crash, readable by everyone.
    std::fs::write(tls.join("ca.key.tmp"), b"left by a crash").unwrap();
    std::fs::set_permissions(
        tls.join("ca.key.tmp"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    let (_, created) = LocalCa::load_or_create(&tls).unwrap();
    assert!(created);
    let mode = std::fs::metadata(tls.join("ca.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the CA key is private: {mode:o}");
    assert!(!tls.join("ca.key.tmp").exists());
}

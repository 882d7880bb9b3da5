//! Finding nearby wallets: a listening wallet announces its key and port by UDP multicast on the
//! local network (group 239.255.70.77, port 7477) once a second; a payer collects announcements
//! for a moment and dials the one whose key it wants. Announcements are not trusted: the channel
//! handshake proves the key, so a false announcement can only waste a connection attempt.
//! Direct addressing (`--peer HOST:PORT`) needs no discovery.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use florin_crypto::PublicKey;
use socket2::{Domain, Protocol, Socket, Type};

use crate::channel::NetError;

/// The multicast group.
pub const GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 70, 77);
/// The discovery port.
pub const PORT: u16 = 7477;
const MAGIC: &[u8; 8] = b"FLORINP1";

/// Key, the listening address (0.0.0.0: "the address this announcement came from") and port.
fn announcement(key: &PublicKey, at: SocketAddr) -> Vec<u8> {
    let ip = match at.ip() {
        std::net::IpAddr::V4(v4) => v4,
        std::net::IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
    };
    [&MAGIC[..], &key.0, &ip.octets(), &at.port().to_le_bytes()].concat()
}

fn parse(b: &[u8], from: SocketAddr) -> Option<(PublicKey, SocketAddr)> {
    if b.len() != 46 || &b[..8] != MAGIC {
        return None;
    }
    let key = PublicKey(b[8..40].try_into().ok()?);
    let ip = Ipv4Addr::new(b[40], b[41], b[42], b[43]);
    let port = u16::from_le_bytes([b[44], b[45]]);
    let host = if ip.is_unspecified() {
        from.ip()
    } else {
        ip.into()
    };
    Some((key, SocketAddr::new(host, port)))
}

/// Announces until dropped.
pub struct Announcer {
    stop: Arc<AtomicBool>,
}

impl Announcer {
    /// Starts announcing `key` listening at `listening` (sent to `to`, by default the multicast
    /// group). A listener on 0.0.0.0 is announced as "dial the address this came from".
    pub fn start(
        key: PublicKey,
        listening: SocketAddr,
        to: Option<SocketAddr>,
    ) -> Result<Announcer, NetError> {
        let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        sock.set_multicast_loop_v4(true)?;
        sock.set_multicast_ttl_v4(1)?;
        let to = to.unwrap_or(SocketAddr::V4(SocketAddrV4::new(GROUP, PORT)));
        let msg = announcement(&key, listening);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("florin-announce".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    // A network without multicast makes this fail; direct addressing still works.
                    let _ = sock.send_to(&msg, to);
                    for _ in 0..10 {
                        if flag.load(Ordering::Relaxed) {
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })?;
        Ok(Announcer { stop })
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Listens for announcements for up to `wait` (returning early once `want` is seen) and
/// returns each key heard with the address to dial.
pub fn discover(
    wait: Duration,
    want: Option<PublicKey>,
) -> Result<Vec<(PublicKey, SocketAddr)>, NetError> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, PORT)).into())?;
    s.join_multicast_v4(&GROUP, &Ipv4Addr::UNSPECIFIED)?;
    let sock: UdpSocket = s.into();
    let deadline = Instant::now() + wait;
    let mut found: Vec<(PublicKey, SocketAddr)> = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        sock.set_read_timeout(Some(left.min(Duration::from_millis(200))))?;
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        if let Some((key, addr)) = parse(&buf[..n], from) {
            if !found.iter().any(|(k, _)| *k == key) {
                found.push((key, addr));
            }
            if want == Some(key) {
                break;
            }
        }
    }
    Ok(found)
}

//! The node's connections: accept, the Noise handshake in its own bounded slots, the
//! connection cap, and the request loop that re-reads access before every request.

use super::*;

pub(super) fn accept_loop(inner: &Arc<Inner>, listener: TcpListener) {
    let cfg = ChannelConfig {
        timeout: HANDSHAKE_DEADLINE,
        ..ChannelConfig::default()
    };
    for stream in listener.incoming() {
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(mut hs) = inner.handshakes.lock() else {
            continue;
        };
        let Ok(copy) = stream.try_clone() else {
            continue;
        };
        if hs.len() >= MAX_HANDSHAKES {
            if let Some((_, oldest)) = hs.pop_front() {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        hs.push_back((id, copy));
        drop(hs);
        let conn = inner.clone();
        let cfg = cfg.clone();
        let spawned = thread::Builder::new()
            .name("custody-conn".into())
            .spawn(move || serve_stream(&conn, id, stream, &cfg));
        if spawned.is_err() {
            end_handshake(inner, id);
        }
    }
}

pub(super) fn end_handshake(inner: &Inner, id: u64) {
    if let Ok(mut hs) = inner.handshakes.lock() {
        hs.retain(|(i, _)| *i != id);
    }
}

/// One connection: the handshake in its own slot, then (for a client or admin within the
/// connection cap) the requests.
pub(super) fn serve_stream(
    inner: &Inner,
    id: u64,
    stream: std::net::TcpStream,
    cfg: &ChannelConfig,
) {
    let ch = accept_on(stream, &inner.identity, cfg);
    end_handshake(inner, id);
    let Ok(ch) = ch else { return };
    let peer = ch.peer();
    let seen = inner.access_gen.load(Ordering::SeqCst);
    let Some(rights) = access(inner).rights(&peer) else {
        return;
    };
    if inner.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        inner.connections.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    if let (Ok(c), Ok(mut open)) = (ch.try_clone_stream(), inner.open.lock()) {
        open.insert(id, c);
    }
    serve_connection(inner, ch, rights, seen);
    if let Ok(mut open) = inner.open.lock() {
        open.remove(&id);
    }
    inner.connections.fetch_sub(1, Ordering::SeqCst);
}

pub(super) fn serve_connection(inner: &Inner, mut ch: Channel, mut rights: Rights, mut seen: u64) {
    let _ = ch.set_timeout(IDLE);
    let _ = ch.set_write_timeout(WRITE_DEADLINE);
    let peer = ch.peer();
    loop {
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        let bytes = match ch.recv(MAX_WIRE) {
            Ok(b) => b,
            Err(_) => return,
        };
        if inner.stop.load(Ordering::Relaxed) {
            return;
        }
        // The access list changed since this peer's rights were read: read them again, and
        // drop a peer that was revoked, before serving anything more.
        let now = inner.access_gen.load(Ordering::SeqCst);
        if now != seen {
            seen = now;
            match access(inner).rights(&peer) {
                Some(r) => rights = r,
                None => return,
            }
        }
        let answer = match wire::decode::<Request>(&bytes, "request") {
            Ok(req) => {
                handle(inner, &rights, req).unwrap_or_else(|e| Response::Refused(Refusal::from(&e)))
            }
            Err(e) => Response::Refused(Refusal::from(&e)),
        };
        if let Err(NetError::Closed | NetError::Io(_)) = ch.send(&wire::encode(&answer)) {
            return;
        }
    }
}

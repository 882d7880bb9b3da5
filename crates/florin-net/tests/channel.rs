//! The channel over real loopback sockets.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_net::channel::{accept_on, NOISE_CHACHA};
use florin_net::{connect, ChannelConfig, Listener, Msg, NetError};

fn key(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

#[test]
fn messages_of_every_size_both_ways_and_identities_proven() {
    for noise in [
        ChannelConfig::default(),
        ChannelConfig {
            noise: NOISE_CHACHA,
            ..Default::default()
        },
    ] {
        let l = Listener::bind("127.0.0.1:0", noise.clone()).unwrap();
        let addr = l.local_addr().unwrap();
        let (alice, bob) = (key(1), key(2));
        let bob_pk = bob.public_key();
        let server = std::thread::spawn(move || {
            let mut c = l.accept(&bob).unwrap();
            assert_eq!(c.peer(), key(1).public_key());
            for _ in 0..5 {
                let m = c.recv(64 << 20).unwrap();
                c.send(&m).unwrap();
            }
        });
        let mut c = connect(addr, &alice, Some(bob_pk), &noise).unwrap();
        assert_eq!(c.peer(), bob_pk);
        let big: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
        for m in [vec![], vec![7u8], vec![1; 65_519], vec![2; 65_520], big] {
            c.send(&m).unwrap();
            assert_eq!(c.recv(64 << 20).unwrap(), m);
        }
        server.join().unwrap();
    }
}

#[test]
fn a_peer_with_another_key_is_refused() {
    let cfg = ChannelConfig::default();
    let l = Listener::bind("127.0.0.1:0", cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let _ = l.accept(&key(3));
    });
    match connect(addr, &key(1), Some(key(2).public_key()), &cfg) {
        Err(NetError::WrongPeer { expected, got }) => {
            assert_eq!(expected, key(2).public_key());
            assert_eq!(got, key(3).public_key());
        }
        other => panic!("expected WrongPeer, got {:?}", other.map(|c| c.peer())),
    }
    server.join().unwrap();
}

#[test]
fn tampered_bytes_and_garbage_fail_cleanly() {
    let cfg = ChannelConfig {
        timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    // Garbage instead of a handshake.
    let raw = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = raw.local_addr().unwrap();
    let c2 = cfg.clone();
    let server = std::thread::spawn(move || {
        let (s, _) = raw.accept().unwrap();
        accept_on(s, &key(2), &c2).map(|_| ())
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0, 5, 1, 2, 3, 4, 5]).unwrap();
    drop(s);
    assert!(server.join().unwrap().is_err());

    // A man in the middle flipping one byte of an encrypted message: the receiver refuses it.
    let real = Listener::bind("127.0.0.1:0", cfg.clone()).unwrap();
    let real_addr = real.local_addr().unwrap();
    let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut c = real.accept(&key(2)).unwrap();
        c.recv(1 << 20).map(|_| ())
    });
    std::thread::spawn(move || {
        let (mut a, _) = proxy.accept().unwrap();
        let mut b = TcpStream::connect(real_addr).unwrap();
        let mut b2 = b.try_clone().unwrap();
        let mut a2 = a.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut b2, &mut a2);
        });
        let mut total = 0usize;
        let mut buf = [0u8; 4096];
        loop {
            let n = match a.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // The handshake is 32 + 2 and 64 + 96 + 16 + 2 bytes from this side: flip a byte
            // after it.
            if total + n > 300 && total <= 300 {
                buf[300 - total] ^= 1;
            }
            total += n;
            if b.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut c = connect(proxy_addr, &key(1), Some(key(2).public_key()), &cfg).unwrap();
    c.send(&[9u8; 2000]).unwrap();
    assert!(matches!(server.join().unwrap(), Err(NetError::Noise(_))));
}

#[test]
fn oversized_and_unknown_messages_are_refused() {
    let cfg = ChannelConfig::default();
    let l = Listener::bind("127.0.0.1:0", cfg.clone()).unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut c = l.accept(&key(2)).unwrap();
        let too_big = c.recv(1000);
        let unknown = c.recv_msg();
        (too_big.err(), unknown.err())
    });
    let mut c = connect(addr, &key(1), None, &cfg).unwrap();
    c.send(&[0u8; 5000]).unwrap();
    c.send(&[99u8, 1, 2]).unwrap();
    let (a, b) = server.join().unwrap();
    assert!(matches!(a, Some(NetError::TooLarge(5000))));
    assert!(matches!(b, Some(NetError::Protocol(_))) || b.is_some());
    assert!(Msg::decode(&[]).is_err());
    assert!(Msg::decode(&[4, 1, 2]).is_err());
}

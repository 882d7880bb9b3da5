//! The channel's handshake and transport run in memory through `pair_over` (the steps of
//! `connect` and `accept_on`), where every byte on the wire can be changed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signature, Signer, SignerError};
use florin_net::channel::{pair_over, Channel, MemoryLink};
use florin_net::{ChannelConfig, NetError};

fn key(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

fn pair(
    a: &dyn Signer,
    expected: PublicKey,
    tamper: impl FnMut(usize, &mut Vec<u8>),
) -> Result<(Channel<MemoryLink>, Channel<MemoryLink>), NetError> {
    pair_over(
        MemoryLink::default(),
        a,
        MemoryLink::default(),
        &key(2),
        &ChannelConfig::default(),
        Some(expected),
        tamper,
    )
}

/// Moves what `from` wrote to what `to` reads, through `f`.
fn carry(
    from: &mut Channel<MemoryLink>,
    to: &mut Channel<MemoryLink>,
    f: impl FnOnce(&mut Vec<u8>),
) {
    let mut wire = std::mem::take(&mut from.stream_mut().tx);
    f(&mut wire);
    to.stream_mut().rx.extend(wire);
}

#[test]
fn an_honest_pair_carries_messages_both_ways() {
    let (mut a, mut b) = pair(&key(1), key(2).public_key(), |_, _| {}).unwrap();
    assert_eq!(a.peer(), key(2).public_key());
    assert_eq!(b.peer(), key(1).public_key());
    let msgs = [
        vec![],
        vec![9u8; 65_515],
        vec![8u8; 65_516],
        vec![7u8; 200_000],
    ];
    for m in &msgs {
        a.send(m).unwrap();
    }
    carry(&mut a, &mut b, |_| {});
    for m in &msgs {
        assert_eq!(&b.recv(1 << 20).unwrap(), m);
    }
    assert!(matches!(b.recv(1 << 20), Err(NetError::Closed)));
    b.send(b"back").unwrap();
    carry(&mut b, &mut a, |_| {});
    assert_eq!(a.recv(16).unwrap(), b"back");
}

#[test]
fn any_changed_handshake_byte_fails_the_handshake() {
    for msg in 0..3 {
        for at in [0usize, 5, 40, 100] {
            let r = pair(&key(1), key(2).public_key(), |i, m| {
                if i == msg {
                    let at = at % m.len();
                    m[at] ^= 1;
                }
            });
            assert!(
                r.is_err(),
                "message {msg}, byte {at} changed and the handshake passed"
            );
        }
        // A byte added at the end (a payload the sender never wrote) fails it too.
        let r = pair(&key(1), key(2).public_key(), |i, m| {
            if i == msg {
                m.push(0);
            }
        });
        assert!(r.is_err(), "message {msg} grew and the handshake passed");
    }
}

struct Liar;

impl Signer for Liar {
    fn public_key(&self) -> PublicKey {
        key(3).public_key()
    }
    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError> {
        key(1).sign(msg)
    }
}

#[test]
fn a_signer_that_claims_another_key_or_a_wrong_peer_is_refused() {
    assert!(matches!(
        pair(&Liar, key(2).public_key(), |_, _| {}),
        Err(NetError::BadIdentity)
    ));
    assert!(matches!(
        pair(&key(1), key(4).public_key(), |_, _| {}),
        Err(NetError::WrongPeer { .. })
    ));
}

#[test]
fn changed_dropped_or_forged_transport_bytes_never_yield_a_message() {
    // A flipped byte in the second message: the first still arrives, the second never does.
    let (mut a, mut b) = pair(&key(1), key(2).public_key(), |_, _| {}).unwrap();
    a.send(b"first").unwrap();
    let first_len = a.stream_mut().tx.len();
    a.send(b"second").unwrap();
    carry(&mut a, &mut b, |w| {
        let last = w.len() - 1;
        w[last] ^= 0x80;
    });
    assert_eq!(b.recv(64).unwrap(), b"first");
    assert!(matches!(b.recv(64), Err(NetError::Noise(_))));
    assert!(first_len > 0);

    // A frame dropped: the next one is out of sequence (its nonce) and refused.
    let (mut a, mut b) = pair(&key(1), key(2).public_key(), |_, _| {}).unwrap();
    a.send(b"one").unwrap();
    let cut = a.stream_mut().tx.len();
    a.send(b"two").unwrap();
    carry(&mut a, &mut b, |w| {
        w.drain(..cut);
    });
    assert!(matches!(b.recv(64), Err(NetError::Noise(_))));

    // Bytes the peer never made, framed like transport messages.
    let (_, mut b) = pair(&key(1), key(2).public_key(), |_, _| {}).unwrap();
    let mut junk = 40u16.to_be_bytes().to_vec();
    junk.extend([0x55; 40]);
    b.stream_mut().rx.extend(junk);
    assert!(b.recv(64).is_err());

    // A message over the receiver's limit is refused by its length alone.
    let (mut a, mut b) = pair(&key(1), key(2).public_key(), |_, _| {}).unwrap();
    a.send(&[1u8; 100]).unwrap();
    carry(&mut a, &mut b, |_| {});
    assert!(matches!(b.recv(99), Err(NetError::TooLarge(100))));
}

//! The offline device channel (`florin_net::channel`: Noise `XX` with identity proofs, then
//! length-prefixed messages cut into Noise transport messages) end to end, in memory.
//!
//! Each run makes a real handshake through `florin_net::channel::pair_over` (the steps `connect`
//! and `accept_on` run), with fuzzer-chosen edits to any of the three handshake messages, a
//! protocol (AES-GCM or ChaCha), either side's signer possibly lying (claiming the other's key,
//! or replaying a proof made for another Noise key), and an expected responder key that may be
//! wrong. Then one side sends fuzzer-made messages (empty to several Noise messages long), the
//! ciphertext on the wire is edited (overwrite, insert, delete, truncate, garbage frames
//! appended) and the other receives with a fuzzer-chosen size limit. Or, raw: the responder
//! reads fuzzer bytes as if the peer sent them.
//!
//! Checked: the handshake succeeds exactly when no message changed, both signers are honest and
//! the expected key is right, and each side then knows the other's key; an unchanged handshake
//! fails for the right reason (`BadIdentity` for a lie, `WrongPeer` for another key), and an
//! honest initiator never proves its identity to a responder it refused; what the responder
//! receives is always a prefix of what was sent, in order, each message whole (never a changed,
//! merged or split message); with an untouched wire and a big enough limit it is all of it and
//! then `Closed`; a message over the limit is `TooLarge`; bytes not made by the peer's
//! transport keys never yield a message.

use std::sync::atomic::{AtomicUsize, Ordering};

use florin_crypto::{LocalSigner, PublicKey, SecretKey, Signature, Signer, SignerError};
use florin_net::channel::{
    pair_over, ChannelConfig, MemoryLink, NetError, NOISE_AESGCM, NOISE_CHACHA,
};

use crate::Input;

/// A dishonest signer: claims one key and signs with another, or signs with its own key a
/// proof for another Noise static key (a proof replayed from another connection).
struct Liar {
    claims: PublicKey,
    signs: LocalSigner,
    replays: bool,
}

impl Signer for Liar {
    fn public_key(&self) -> PublicKey {
        self.claims
    }
    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError> {
        if self.replays {
            self.signs.sign(&florin_crypto::hash(
                "florin/net/noise-static/v1",
                &[&[7u8; 32]],
            ))
        } else {
            self.signs.sign(msg)
        }
    }
}

/// An honest signer that counts its signatures.
struct Counting {
    key: LocalSigner,
    signed: AtomicUsize,
}

impl Signer for Counting {
    fn public_key(&self) -> PublicKey {
        self.key.public_key()
    }
    fn sign(&self, msg: &[u8]) -> Result<Signature, SignerError> {
        self.signed.fetch_add(1, Ordering::Relaxed);
        self.key.sign(msg)
    }
}

/// Applies 1–3 fuzzer-chosen edits to `b`.
fn edit(inp: &mut Input<'_>, b: &mut Vec<u8>) {
    for _ in 0..1 + inp.below(3) {
        let at = inp.below(b.len() + 1);
        match inp.u8() % 5 {
            0 if at < b.len() => b[at] ^= inp.u8() | 1,
            1 => b.insert(at, inp.u8()),
            2 if at < b.len() => {
                b.remove(at);
            }
            3 => b.truncate(at),
            _ => {
                // A frame the peer never sent: a length and bytes.
                let junk = inp.bytes(64);
                b.splice(
                    at..at,
                    (junk.len() as u16)
                        .to_be_bytes()
                        .into_iter()
                        .chain(junk.iter().copied()),
                );
            }
        }
    }
}

/// The fuzz target.
pub fn noise_channel(data: &[u8]) {
    let mut inp = Input::new(data);
    let mode = inp.u8();
    let cfg = ChannelConfig {
        noise: if mode & 1 == 0 {
            NOISE_AESGCM
        } else {
            NOISE_CHACHA
        },
        ..ChannelConfig::default()
    };
    let a_key = LocalSigner::new(SecretKey::from_seed(&[1; 32]));
    let b_key = LocalSigner::new(SecretKey::from_seed(&[2; 32]));
    // Either side may lie: claim the other's key (signing with its own), or replay a proof.
    let liar = |claims: &LocalSigner, signs: &LocalSigner, replays: bool| Liar {
        claims: if replays {
            signs.public_key()
        } else {
            claims.public_key()
        },
        signs: signs.clone(),
        replays,
    };
    let a_lies = mode & 2 != 0 && inp.u8() < 64;
    let b_lies = mode & 2 != 0 && inp.u8() < 64;
    let replays = inp.u8() & 1 == 1;
    let a_liar = liar(&b_key, &a_key, replays);
    let b_liar = liar(&a_key, &b_key, replays);
    let a_honest = Counting {
        key: a_key.clone(),
        signed: AtomicUsize::new(0),
    };
    let a_signer: &dyn Signer = if a_lies { &a_liar } else { &a_honest };
    let b_signer: &dyn Signer = if b_lies { &b_liar } else { &b_key };
    let wrong_expected = mode & 4 != 0 && inp.u8() < 64;
    let expected = if wrong_expected {
        a_key.public_key()
    } else {
        b_key.public_key()
    };
    // Which handshake messages to edit (a bit each), then the edits.
    let hs_edits = if mode & 8 != 0 { inp.u8() & 7 } else { 0 };
    let mut changed = false;
    let pair = pair_over(
        MemoryLink::default(),
        a_signer,
        MemoryLink::default(),
        b_signer,
        &cfg,
        Some(expected),
        |i, msg| {
            if hs_edits & (1 << i) != 0 {
                let before = msg.clone();
                edit(&mut inp, msg);
                changed |= *msg != before;
            }
        },
    );
    let honest = !changed && !a_lies && !b_lies && !wrong_expected;
    let (mut a, mut b) = match pair {
        Ok(p) => p,
        Err(e) => {
            assert!(!honest, "an honest handshake failed: {e}");
            if !changed {
                // The initiator checks the responder's proof, then the key it expected, and
                // only then proves its own identity; the responder then checks that proof.
                let want = if b_lies {
                    "BadIdentity"
                } else if wrong_expected {
                    "WrongPeer"
                } else {
                    "BadIdentity"
                };
                let got = match e {
                    NetError::BadIdentity => "BadIdentity",
                    NetError::WrongPeer { .. } => "WrongPeer",
                    _ => "another error",
                };
                assert_eq!(got, want, "the handshake failed for the wrong reason: {e}");
                if (b_lies || wrong_expected) && !a_lies {
                    assert_eq!(
                        a_honest.signed.load(Ordering::Relaxed),
                        0,
                        "the initiator proved its identity to a peer it had refused"
                    );
                }
            }
            return;
        }
    };
    assert!(
        honest,
        "a handshake succeeded with changed messages or a lying signer"
    );
    assert_eq!(
        a.peer(),
        b_key.public_key(),
        "the initiator knows another peer"
    );
    assert_eq!(
        b.peer(),
        a_key.public_key(),
        "the responder knows another peer"
    );

    if mode & 16 != 0 {
        // Raw: bytes the responder's peer never made.
        b.stream_mut().rx.extend(inp.rest());
        if let Ok(m) = b.recv(1 << 20) {
            panic!("{} bytes from no sender came out as a message", m.len());
        }
        return;
    }

    // Either direction: the initiator sends and the responder receives, or the other way.
    if mode & 128 != 0 {
        std::mem::swap(&mut a, &mut b);
    }
    // Messages: mostly small, some spanning several Noise messages.
    let mut sent: Vec<Vec<u8>> = Vec::new();
    for _ in 0..inp.below(6) {
        let len = match inp.u8() % 8 {
            0 => 0,
            1 => 65_519 - 4 + inp.below(8) - 4, // around the first message's chunk boundary
            2 => 65_519 * 2 + inp.below(200),
            _ => inp.below(300),
        };
        let fill = inp.u8();
        let m: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
        if let Err(e) = a.send(&m) {
            panic!("cannot send {len} bytes: {e}");
        }
        sent.push(m);
    }
    let mut wire = std::mem::take(&mut a.stream_mut().tx);
    let original = wire.clone();
    if mode & 32 != 0 {
        edit(&mut inp, &mut wire);
    }
    let tampered = wire != original;
    let limit = if mode & 64 != 0 {
        inp.below(70_000)
    } else {
        usize::MAX
    };
    b.stream_mut().rx.extend(wire);
    let mut got = 0;
    loop {
        match b.recv(limit) {
            Ok(m) => {
                assert!(got < sent.len(), "a message no one sent");
                assert!(m == sent[got], "message {got} changed on the way");
                assert!(m.len() <= limit, "a message over the limit");
                got += 1;
            }
            Err(e) => {
                if !tampered {
                    match &e {
                        NetError::Closed => {
                            assert_eq!(got, sent.len(), "messages lost on an untouched wire")
                        }
                        NetError::TooLarge(n) => {
                            assert!(got < sent.len() && *n == sent[got].len() && *n > limit)
                        }
                        other => panic!("an untouched wire failed: {other}"),
                    }
                }
                break;
            }
        }
    }
}

//! Decoder targets: every decoder that takes bytes from outside. Each must never panic, and
//! whatever it accepts must round-trip through its encoder (the same bytes where the encoding
//! is canonical; otherwise the same value, and a stable re-encoding).

use std::sync::OnceLock;

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_node::{Authority, AuthorityConfig};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::Input;

/// Encodes with postcard; a value that decoded must encode.
fn pc<T: Serialize>(v: &T) -> Vec<u8> {
    match postcard::to_allocvec(v) {
        Ok(b) => b,
        Err(e) => panic!("a decoded value does not encode: {e}"),
    }
}

/// For a postcard type: whatever `decode` accepts encodes, decodes again to an equal value and
/// encodes to the same bytes.
fn postcard_round_trip<T, D>(data: &[u8], decode: D)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    D: Fn(&[u8]) -> Option<T>,
{
    if let Some(v) = decode(data) {
        let once = pc(&v);
        let Some(again) = decode(&once) else {
            panic!("the re-encoding of an accepted value is refused");
        };
        assert!(again == v, "a value changed on a round trip");
        assert!(pc(&again) == once, "re-encoding is not stable");
    }
}

/// The same for types without `PartialEq`: the re-encoding decodes and is stable.
fn postcard_stable<T, D>(data: &[u8], decode: D)
where
    T: Serialize + DeserializeOwned,
    D: Fn(&[u8]) -> Option<T>,
{
    if let Some(v) = decode(data) {
        let once = pc(&v);
        let Some(again) = decode(&once) else {
            panic!("the re-encoding of an accepted value is refused");
        };
        assert!(pc(&again) == once, "re-encoding is not stable");
    }
}

/// Offline tokens (`florin_token::Token::decode`): canonical, so accepted bytes re-encode to
/// themselves.
pub fn decode_token(data: &[u8]) {
    if let Ok(t) = florin_token::Token::decode(data) {
        assert!(t.encode() == data, "token does not re-encode to its bytes");
        let _ = (t.holder(), t.hops(), t.message(t.hops()), t.serial_hex());
    }
}

/// Offline payments and payment requests (the device channel's and the QR codes' contents).
pub fn decode_payment(data: &[u8]) {
    if let Ok(p) = florin_token::Payment::decode(data) {
        assert!(
            p.encode() == data,
            "payment does not re-encode to its bytes"
        );
        let _ = p.amount_cents();
    }
    if let Ok(r) = florin_token::PaymentRequest::decode(data) {
        assert!(
            r.encode() == data,
            "request does not re-encode to its bytes"
        );
    }
}

/// Fraud proofs (`florin fraud verify FILE` takes any file): decoding and verification.
pub fn decode_fraud_proof(data: &[u8]) {
    if let Ok(p) = florin_token::FraudProof::decode(data) {
        assert!(
            p.encode() == data,
            "fraud proof does not re-encode to its bytes"
        );
        let _ = p.verify(None);
        let _ = (p.culprit(), p.id());
    }
}

/// The issuer key the ledger targets validate against.
fn issuer() -> &'static LocalSigner {
    static ISSUER: OnceLock<LocalSigner> = OnceLock::new();
    ISSUER.get_or_init(|| LocalSigner::new(SecretKey::from_seed(&[7; 32])))
}

/// Ledger transactions (`POST /v1/ledger/transactions`, the public HTTP input) and UTXOs:
/// canonical; an accepted transaction is also validated (signatures, balance) without panic.
pub fn decode_tx(data: &[u8]) {
    if let Ok(tx) = florin_ledger::Transaction::decode(data) {
        assert!(
            tx.encode() == data,
            "transaction does not re-encode to its bytes"
        );
        let _ = tx.txid();
        let mut rng = StdRng::seed_from_u64(1);
        let _ = florin_ledger::validate(&tx, &issuer().public_key(), &mut rng);
        let _ = florin_ledger::CompactTx::from_tx(&tx);
    }
    if let Ok(u) = florin_ledger::Utxo::decode(data) {
        assert!(u.encode() == data, "utxo does not re-encode to its bytes");
    }
}

/// `POST /v1/ledger/batch`: the first byte picks the binary body (frames of a u32 length and a
/// transaction, split by the handler's own `split_frames`) or the JSON one (`{"txs": [hex]}`,
/// as the handler reads it). Accepted frames re-frame to the same bytes.
pub fn decode_batch(data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        if let Ok(txs) = florin_http::node::split_frames(body) {
            let mut again = Vec::with_capacity(body.len());
            for tx in &txs {
                let b = tx.encode();
                again.extend_from_slice(&(b.len() as u32).to_le_bytes());
                again.extend_from_slice(&b);
            }
            assert!(again == body, "batch does not re-frame to its bytes");
        }
    } else if let Ok(req) = serde_json::from_slice::<florin_node::api::SubmitBatch>(body) {
        for t in req.txs.iter().take(florin_http::MAX_SUBMIT_BATCH) {
            if let Ok(b) = hex::decode(t) {
                if let Ok(tx) = florin_ledger::Transaction::decode(&b) {
                    assert!(
                        tx.encode() == b,
                        "transaction does not re-encode to its bytes"
                    );
                }
            }
        }
    }
}

/// The authority the deposit parser is given (a registry in a temporary directory, opened
/// once per process; parsing reads only its configuration).
fn parse_authority() -> &'static Authority {
    static A: OnceLock<(tempfile::TempDir, Authority)> = OnceLock::new();
    let (_, a) = A.get_or_init(|| {
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("no temporary directory: {e}"),
        };
        let signer = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
        match Authority::open(
            AuthorityConfig::devnet(dir.path()),
            std::sync::Arc::new(signer),
        ) {
            Ok(a) => (dir, a),
            Err(e) => panic!("cannot open an authority: {e}"),
        }
    });
    a
}

/// `POST /v1/deposit`'s parser (`florin_http::node::parse_deposit`): the input is the
/// depositor (first line) and the tokens in hex (one a line). Every token that parses
/// re-encodes to its bytes.
pub fn decode_deposit(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let depositor = lines.next().unwrap_or_default();
    let tokens: Vec<String> = lines.map(str::to_string).collect();
    if let Ok((_key, parsed)) =
        florin_http::node::parse_deposit(parse_authority(), depositor, &tokens)
    {
        assert!(parsed.len() == tokens.len(), "a token was lost in parsing");
        for (t, h) in parsed.iter().zip(&tokens) {
            if let Ok(t) = t {
                let bytes = hex::decode(h).unwrap_or_default();
                assert!(
                    t.encode() == bytes,
                    "deposited token does not re-encode to its bytes"
                );
            }
        }
    }
}

/// Cluster shard messages (`florin_cluster::shard::decode`): the first byte picks the type: a
/// fenced command (what a coordinator sends and a shard replicates), a shard's reply, a
/// compact transaction, or a shard snapshot (`ShardState::from_snapshot`).
pub fn decode_shard_msg(data: &[u8]) {
    use florin_cluster::shard::{decode, Fenced, ShardReply, ShardState};
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => postcard_round_trip(body, |b| decode::<Fenced>(b).ok()),
        1 => postcard_round_trip(body, |b| decode::<ShardReply>(b).ok()),
        2 => postcard_round_trip(body, |b| decode::<florin_ledger::CompactTx>(b).ok()),
        _ => {
            if let Ok(s) = ShardState::from_snapshot(body) {
                let mut once = Vec::new();
                s.snapshot_into(&mut once);
                let Ok(again) = ShardState::from_snapshot(&once) else {
                    panic!("a snapshot's re-encoding is refused");
                };
                assert!(
                    again.books() == s.books(),
                    "books changed on a snapshot round trip"
                );
                assert!(
                    again.unspent().count() == s.unspent().count()
                        && s.unspent().all(|(id, _)| again.is_unspent(id)),
                    "unspent set changed on a snapshot round trip"
                );
                assert!(
                    again.confirmed().count() == s.confirmed().count()
                        && s.confirmed().all(|t| again.is_confirmed(t)),
                    "confirmed set changed on a snapshot round trip"
                );
            }
        }
    }
}

/// Cluster RPC (`florin_node::cluster::rpc`): a node's request and response frames, and the
/// Raft RPC frames between replicas (`florin_cluster::raft`: request as a replica reads it,
/// and the answer as a peer reads it).
pub fn decode_cluster_rpc(data: &[u8]) {
    use florin_node::cluster::rpc::{Request, Response};
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => postcard_stable(body, |b| postcard::from_bytes::<Request>(b).ok()),
        1 => postcard_stable(body, |b| postcard::from_bytes::<Response>(b).ok()),
        2 => {
            if let Some(once) = florin_cluster::raft::reencode_rpc(body) {
                let again = florin_cluster::raft::reencode_rpc(&once);
                assert!(
                    again.as_deref() == Some(&once[..]),
                    "raft request re-encoding not stable"
                );
            }
        }
        _ => {
            if let Some(once) = florin_cluster::raft::reencode_reply(body) {
                let again = florin_cluster::raft::reencode_reply(&once);
                assert!(
                    again.as_deref() == Some(&once[..]),
                    "raft reply re-encoding not stable"
                );
            }
        }
    }
}

/// The custody party every envelope target opens as, and the key of the sender it trusts.
fn custody_keys() -> &'static (LocalSigner, SecretKey) {
    static K: OnceLock<(LocalSigner, SecretKey)> = OnceLock::new();
    K.get_or_init(|| {
        (
            LocalSigner::new(SecretKey::from_seed(&[21; 32])),
            SecretKey::from_seed(&[22; 32]),
        )
    })
}

/// Custody wire (`florin_custody::wire`): requests and answers between coordinator and
/// key-management nodes, the serialized key material they carry (`GroupKey`, `KeyShare`,
/// `SigningPackage`), and envelopes: a decoded envelope is opened as party 2, and a
/// correctly signed envelope around fuzzer bytes (sealed or not) is opened too, so the
/// unsealing of garbage is reached.
pub fn decode_custody_wire(data: &[u8]) {
    use florin_custody::envelope::Envelope;
    use florin_custody::frost::{GroupKey, KeyShare, SigningPackage};
    use florin_custody::wire::{decode, Request, Response};
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    match mode % 6 {
        0 => postcard_round_trip(body, |b| decode::<Request>(b, "request").ok()),
        1 => postcard_round_trip(body, |b| decode::<Response>(b, "response").ok()),
        2 => {
            if let Ok(k) = GroupKey::from_bytes(body) {
                let once = k.to_bytes();
                let again = GroupKey::from_bytes(&once).map(|k| k.to_bytes());
                assert!(again.ok() == Some(once), "group key round trip");
            }
            if let Ok(k) = KeyShare::from_bytes(body) {
                let once = k.to_bytes();
                let again = KeyShare::from_bytes(&once).map(|k| k.to_bytes());
                assert!(again.ok() == Some(once), "key share round trip");
            }
        }
        3 => {
            if let Ok(p) = SigningPackage::from_bytes(body) {
                if let Ok(once) = p.to_bytes() {
                    let again = SigningPackage::from_bytes(&once).and_then(|p| p.to_bytes());
                    assert!(again.ok() == Some(once), "signing package round trip");
                }
            }
        }
        4 => {
            let (sender, me) = custody_keys();
            if let Ok(e) = decode::<Envelope>(body, "envelope") {
                let _ = e.open(&e.session, e.step, 2, &sender.public_key(), me);
                let _ = e.verify(&sender.public_key());
            }
        }
        _ => {
            let (sender, me) = custody_keys();
            let mut input = Input::new(body);
            let sealed = input.u8() & 1 == 1;
            let payload = input.rest().to_vec();
            let made = if sealed {
                // A box that claims to be sealed but holds fuzzer bytes.
                Envelope::direct(
                    sender,
                    [1; 16],
                    1,
                    1,
                    2,
                    &me.public_key(),
                    b"x",
                    &mut StdRng::seed_from_u64(3),
                )
                .map(|mut e| {
                    e.payload = payload.clone();
                    e
                })
            } else {
                Envelope::broadcast(sender, [1; 16], 1, 1, payload.clone())
            };
            if let Ok(e) = made {
                let opened = e.open(&[1; 16], 1, 2, &sender.public_key(), me);
                if !sealed {
                    assert!(
                        opened.ok() == Some(payload),
                        "a signed broadcast does not open"
                    );
                }
            }
        }
    }
}

/// The offline device channel's protocol messages (`florin_net::Msg`, what a payer or payee
/// reads from the Noise channel): canonical except a refusal's text, which is cut and made
/// valid UTF-8.
pub fn decode_peer_msg(data: &[u8]) {
    if let Ok(m) = florin_net::Msg::decode(data) {
        let once = m.encode();
        match m {
            florin_net::Msg::Refused(_) => {
                let again = florin_net::Msg::decode(&once);
                assert!(again.ok() == Some(m), "a refusal does not round-trip");
            }
            _ => assert!(once == data, "message does not re-encode to its bytes"),
        }
    }
}

/// QR parts (`florin_net::qr`): the input is cut into parts (a length byte before each); each
/// parsed part re-serializes to its bytes and the parts are joined without panic. The input as
/// a message also splits and joins back to itself.
pub fn decode_qr(data: &[u8]) {
    use florin_net::qr::{join, parse_part, split, Kind};
    let mut input = Input::new(data);
    let mut parts = Vec::new();
    while !input.is_empty() && parts.len() < 64 {
        let n = usize::from(input.u8()) * 8;
        let raw = input.bytes(n);
        if let Ok(p) = parse_part(raw) {
            let mut again = b"FQ\x01".to_vec();
            again.push(match p.kind {
                Kind::Request => 1,
                Kind::Payment => 2,
            });
            again.extend_from_slice(&p.id);
            again.extend_from_slice(&(p.index as u16).to_le_bytes());
            again.extend_from_slice(&(p.total as u16).to_le_bytes());
            again.extend_from_slice(&p.data);
            assert!(again == raw, "part does not re-serialize to its bytes");
            parts.push(p);
        }
    }
    let _ = join(&parts);
    if let Ok(payloads) = split(Kind::Payment, data) {
        let mut parsed = Vec::new();
        for p in payloads.iter().rev() {
            match parse_part(p) {
                Ok(p) => parsed.push(p),
                Err(e) => panic!("a part split from a message does not parse: {e}"),
            }
        }
        match join(&parsed) {
            Ok((Kind::Payment, msg)) => assert!(msg == data, "split and join changed the message"),
            other => panic!(
                "split parts do not join: {:?}",
                other.map(|(k, m)| (k, m.len()))
            ),
        }
    }
}

/// Sealed boxes (`florin_crypto::sealed`, HPKE; legacy v1 boxes read only): opening any bytes
/// never panics, and sealing the input to a key opens back to it with that key only.
///
/// Opening is what outside bytes reach, and it runs on every input. The round trip (a seal and
/// two opens, three X25519 operations more) checks the encoder rather than the decoder, and
/// runs on inputs whose length is a multiple of 8 only, so that the fuzzer spends its time on
/// the opening path (about 4× the executions a second).
pub fn decode_sealed(data: &[u8]) {
    use florin_crypto::sealed::{open, seal};
    let (_, me) = custody_keys();
    let _ = open(me, data);
    if !data.len().is_multiple_of(8) {
        return;
    }
    let mut rng = StdRng::seed_from_u64(data.len() as u64);
    match seal(&me.public_key(), data, &mut rng) {
        Ok(b) => {
            assert!(
                open(me, &b).ok().as_deref() == Some(data),
                "a sealed box does not open"
            );
            let other = SecretKey::from_seed(&[23; 32]);
            assert!(open(&other, &b).is_err(), "a box opens with the wrong key");
        }
        Err(e) => panic!("cannot seal to a valid key: {e}"),
    }
}

/// Payment handoffs from the mailbox (`florin_wallet::online::decode_handoff`, what a payee's
/// sync reads): canonical.
pub fn decode_handoff(data: &[u8]) {
    if let Some(u) = florin_wallet::online::decode_handoff(data) {
        assert!(
            florin_wallet::online::encode_handoff(&u) == data,
            "handoff does not re-encode to its bytes"
        );
    }
}

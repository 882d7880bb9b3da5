//! The authority service on a real redb file and a real socket.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;

use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_node::api::{DepositReport, TokenInfo};
use florin_node::{Authority, AuthorityConfig, NodeError};
use florin_token::Token;

fn open(dir: &std::path::Path, seed: u8) -> (Authority, LocalSigner) {
    let signer = LocalSigner::new(SecretKey::from_seed(&[seed; 32]));
    let a = Authority::open(AuthorityConfig::devnet(dir), Arc::new(signer.clone())).unwrap();
    (a, signer)
}

/// A deposit as the API takes it: the depositor's address and hex tokens, parsed as the
/// handler parses them.
fn deposit(
    a: &Authority,
    depositor: &str,
    tokens: &[String],
) -> Result<Vec<DepositReport>, NodeError> {
    let (depositor, tokens) = florin_http::node::parse_deposit(a, depositor, tokens)?;
    a.deposit(&depositor, &tokens)
}

/// A token look-up as the API takes it: the serial in hex, parsed as the handler parses it.
fn token(a: &Authority, serial: &str) -> Result<TokenInfo, NodeError> {
    a.token(&florin_http::node::parse_serial(serial)?)
}

/// A faucet request with the recipient's address and the handshake in hex, parsed as a handler
/// parses them.
fn faucet(
    a: &Authority,
    recipient: &str,
    cents: u64,
    handshake: &str,
) -> Result<Vec<Token>, NodeError> {
    let recipient = florin_http::node::parse_valid_key(recipient, "recipient")?;
    let handshake = florin_http::node::parse_hex32(handshake, "handshake")?;
    a.faucet(&recipient, cents, handshake)
}

fn wallet(i: u8) -> LocalSigner {
    LocalSigner::new(SecretKey::from_seed(&[i; 32]))
}

/// Mints a token to w1, passes it to w2, and signs it over to the authority.
fn deposit_ready(a: &Authority, auth: &LocalSigner) -> (Token, LocalSigner) {
    let (w1, w2) = (wallet(1), wallet(2));
    let t = a.mint(w1.public_key(), 500, [1; 32]).unwrap().remove(0);
    let t = t.transfer(&w1, w2.public_key(), [2; 32]).unwrap();
    (t.transfer(&w2, auth.public_key(), [3; 32]).unwrap(), w2)
}

#[test]
fn registry_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (serial, signed, depositor) = {
        let (a, auth) = open(dir.path(), 9);
        let (t, w2) = deposit_ready(&a, &auth);
        (t.serial_hex(), t, w2)
    };
    let (a, _) = open(dir.path(), 9);
    assert_eq!(token(&a, &serial).unwrap().status, "in_circulation");
    let split = florin_token::Denomination::spendable_split(500).len() as u64;
    assert_eq!(a.minted().unwrap(), (split, 500));
    let hexed = vec![hex::encode(signed.encode())];
    let r = deposit(&a, &depositor.public_key().to_address(), &hexed).unwrap();
    assert_eq!(r[0].outcome, "reanchored");
    drop(a);
    let (a, _) = open(dir.path(), 9);
    let info = token(&a, &serial).unwrap();
    assert_eq!(
        (info.anchors, info.holder),
        (2, depositor.public_key().to_address())
    );
    // The same deposit again is answered with the same re-anchored token.
    let again = deposit(&a, &depositor.public_key().to_address(), &hexed).unwrap();
    assert_eq!(again[0].outcome, "repeated");
    assert_eq!(again[0].token, r[0].token);
}

#[test]
fn bad_deposits_get_typed_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, auth) = open(dir.path(), 9);
    let (t, w2) = deposit_ready(&a, &auth);
    let dep = w2.public_key().to_address();
    assert!(matches!(
        deposit(&a, "nonsense", &[]),
        Err(NodeError::BadRequest(_))
    ));
    let mut forged = t.clone();
    forged.links[1].proof.0[5] ^= 1;
    let mut bad_bytes = t.encode();
    bad_bytes.push(0);
    let items = vec![
        "not hex".to_string(),
        hex::encode(&bad_bytes),
        hex::encode(forged.encode()),
        hex::encode(t.encode()),
    ];
    let wrong_depositor = wallet(1).public_key().to_address();
    let r = deposit(&a, &wrong_depositor, &items).unwrap();
    assert!(
        r.iter()
            .all(|x| x.outcome == "refused" && x.error.is_some()),
        "{r:?}"
    );
    assert_eq!(token(&a, &t.serial_hex()).unwrap().anchors, 1);
    assert!(a.fraud_list().unwrap().is_empty());
    // Another authority's token.
    let other = LocalSigner::new(SecretKey::from_seed(&[77; 32]));
    let foreign = Token::mint(
        &other,
        [5; 8],
        t.value,
        [0; 64],
        wallet(1).public_key(),
        [0; 32],
    )
    .unwrap();
    let r = deposit(&a, &dep, &[hex::encode(foreign.encode())]).unwrap();
    assert_eq!(r[0].outcome, "refused");
    // Blacklisted tokens are refused.
    a.blacklist(&t.serial).unwrap();
    let r = deposit(&a, &dep, &[hex::encode(t.encode())]).unwrap();
    assert!(r[0].error.as_deref().unwrap().contains("blacklisted"));
    assert!(matches!(token(&a, "00"), Err(NodeError::BadRequest(_))));
    // Unknown serials are refused (before any signature work).
    let mut unknown = t.clone();
    unknown.serial = [0xee; 8];
    let r = deposit(&a, &dep, &[hex::encode(unknown.encode())]).unwrap();
    assert!(r[0].error.as_deref().unwrap().contains("unknown"), "{r:?}");
    assert!(matches!(
        token(&a, "0000000000000000"),
        Err(NodeError::NotFound(_))
    ));
}

#[test]
fn faucet_limits() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = open(dir.path(), 9);
    let w = wallet(1).public_key().to_address();
    let hs = hex::encode([0u8; 32]);
    assert!(matches!(
        faucet(&a, &w, 0, &hs),
        Err(NodeError::BadRequest(_))
    ));
    assert!(matches!(
        faucet(&a, &w, 100_000_000, &hs),
        Err(NodeError::BadRequest(_))
    ));
    assert!(matches!(
        faucet(&a, "eur1xyz", 100, &hs),
        Err(NodeError::BadRequest(_))
    ));
    let tokens = faucet(&a, &w, 1250, &hs).unwrap();
    assert_eq!(tokens.iter().map(|t| t.value.cents()).sum::<u64>(), 1250);
}

fn http(addr: std::net::SocketAddr, req: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn http_api_answers_bad_input_with_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = open(dir.path(), 9);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let state = florin_http::AppState {
        authority: Some(Arc::new(a)),
        ledger: None,
        limits: florin_http::RateLimits::default(),
        cluster: None,
        custody: None,
    };
    let server = rt.spawn(florin_http::serve(listener, state, async {
        let _ = rx.await;
    }));
    let post = |path: &str, body: &str| {
        http(addr, &format!(
            "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ))
    };
    assert!(http(addr, "GET /v1/health HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200"));
    assert!(http(addr, "GET /v1/info HTTP/1.0\r\n\r\n").contains("eur1"));
    assert!(post("/v1/deposit", "{not json").contains(" 400 "));
    assert!(post(
        "/v1/deposit",
        r#"{"depositor":"x","handshake":"00","tokens":[]}"#
    )
    .contains(" 400 "));
    assert!(post("/v1/mailbox", r#"{"to":"bad","message":"00"}"#).contains(" 400 "));
    assert!(post("/v1/mailbox", r#"{"to":"bad","message":"zz"}"#).contains(" 400 "));
    assert!(http(addr, "GET /v1/mailbox/bad HTTP/1.0\r\n\r\n").contains(" 400 "));
    // Without a ledger, ledger routes say so.
    assert!(http(addr, "GET /v1/ledger/supply HTTP/1.0\r\n\r\n").contains(" 404 "));
    assert!(http(addr, "GET /v1/tokens/abc HTTP/1.0\r\n\r\n").contains(" 400 "));
    assert!(http(addr, "GET /v1/tokens/0000000000000000 HTTP/1.0\r\n\r\n").contains(" 404 "));
    let w = wallet(3).public_key().to_address();
    let ok = post(
        "/v1/mailbox",
        &format!(r#"{{"to":"{w}","message":"0102"}}"#),
    );
    assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
    let _ = tx.send(());
    rt.block_on(server).unwrap().unwrap();
}

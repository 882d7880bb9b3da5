//! The operator credential over real sockets: every privileged route refused without a
//! credential (401), with a malformed one (401), a forged, foreign, expired or replayed one
//! (403), and served with a valid one; the devnet's faucet open, a configured node's faucet
//! off by default and, when on, for operators only; revoked keys and blacklisted tokens
//! refused at deposit and withdrawal with their typed codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{SystemTime, UNIX_EPOCH};

use common::LedgerNode;
use florin_crypto::SecretKey;
use florin_node::operator::{Credential, NONCE_LEN};
use florin_node::AuthorityConfig;
use serde_json::Value;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// One HTTP/1.0 request with an optional `Authorization` header: (status, JSON body).
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: &[u8],
) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.0\r\n");
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code: u16 = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("");
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn op_key() -> SecretKey {
    SecretKey::from_seed(&[42; 32])
}

/// A node with a ledger whose authority has `op_key()` as its operator and the faucet on,
/// for operators only (a configured node's faucet, turned on).
fn closed_node_with_faucet() -> LedgerNode {
    LedgerNode::start_with(|dir| {
        let mut c = AuthorityConfig::closed(dir);
        c.faucet = true;
        c.operators = vec![op_key().public_key()];
        c
    })
}

fn nonce(n: u64) -> [u8; NONCE_LEN] {
    let mut out = [0u8; NONCE_LEN];
    out[..8].copy_from_slice(&n.to_le_bytes());
    out[8..].copy_from_slice(&now().to_le_bytes());
    out
}

fn sign(key: &SecretKey, method: &str, path: &str, body: &[u8], ts: u64, n: u64) -> Credential {
    Credential::sign(key, method, path, body, ts, nonce(n))
}

#[test]
fn every_privileged_route_needs_a_valid_fresh_operator_credential() {
    let node = closed_node_with_faucet();
    let addr = node.addr;
    let op = op_key();
    let stranger = SecretKey::from_seed(&[7; 32]);
    let owner = SecretKey::from_seed(&[5; 32]).public_key().to_address();
    let token = node
        .authority
        .mint(SecretKey::from_seed(&[5; 32]).public_key(), 100, [1; 32])
        .unwrap()
        .remove(0);
    let serial = token.serial_hex();
    let victim = SecretKey::from_seed(&[6; 32]).public_key().to_address();
    let faucet_body = format!(r#"{{"owner":"{owner}","amount_cents":100}}"#);
    let blacklist_body = format!(r#"{{"serial":"{serial}","reason":"stolen"}}"#);
    let revoke_body = format!(r#"{{"key":"{victim}","reason":"double spender"}}"#);
    // Each route, in an order where every valid call succeeds (unrevoke after revoke).
    let routes: Vec<(&str, &str, String)> = vec![
        ("POST", "/v1/ledger/faucet", faucet_body),
        ("POST", "/v1/admin/blacklist", blacklist_body),
        ("GET", "/v1/admin/blacklist", String::new()),
        ("POST", "/v1/admin/revoke", revoke_body.clone()),
        ("GET", "/v1/admin/revoked", String::new()),
        ("POST", "/v1/admin/unrevoke", revoke_body),
        ("GET", "/v1/admin/log", String::new()),
        ("GET", "/v1/ledger/recent", String::new()),
        ("GET", "/v1/cluster", String::new()),
        ("GET", "/v1/custody", String::new()),
    ];
    // Every route of the router's operator list is among them.
    for (m, p) in florin_http::node::ADMIN_ROUTES {
        assert!(
            routes.iter().any(|(rm, rp, _)| *rm == m && *rp == p),
            "{m} {p} untested"
        );
    }
    for (i, (method, path, body)) in routes.iter().enumerate() {
        let body = body.as_bytes();
        let n = i as u64 * 10;
        let what = format!("{method} {path}");
        // No credential: 401.
        let (code, v) = call(addr, method, path, None, body);
        assert_eq!(code, 401, "{what} without a credential: {v}");
        assert_eq!(v["error"]["code"], "unauthorized", "{what}");
        // Malformed: 401.
        let (code, _) = call(
            addr,
            method,
            path,
            Some("Florin-Operator v1 nonsense"),
            body,
        );
        assert_eq!(code, 401, "{what} with a malformed credential");
        let (code, _) = call(addr, method, path, Some("Bearer abc"), body);
        assert_eq!(code, 401, "{what} with another scheme");
        // Forged: the operator's name, a stranger's signature.
        let genuine = sign(&op, method, path, body, now(), n + 1);
        let forged = Credential {
            signature: sign(&stranger, method, path, body, genuine.timestamp, n + 1).signature,
            ..genuine.clone()
        };
        let (code, v) = call(addr, method, path, Some(&forged.header()), body);
        assert_eq!(code, 403, "{what} forged: {v}");
        assert_eq!(v["error"]["code"], "operator_refused", "{what}");
        // Signed for another route: forged too.
        let other = sign(&op, method, "/v1/admin/other", body, now(), n + 2);
        let (code, _) = call(addr, method, path, Some(&other.header()), body);
        assert_eq!(code, 403, "{what} signed for another path");
        // A stranger signing as itself: not an operator.
        let foreign = sign(&stranger, method, path, body, now(), n + 3);
        let (code, v) = call(addr, method, path, Some(&foreign.header()), body);
        assert_eq!(code, 403, "{what} by a stranger: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not an operator"),
            "{v}"
        );
        // Expired (and from the future).
        for ts in [now() - 120, now() + 120] {
            let old = sign(&op, method, path, body, ts, n + 4);
            let (code, v) = call(addr, method, path, Some(&old.header()), body);
            assert_eq!(code, 403, "{what} at {ts}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("more than 60 s"),
                "{v}"
            );
        }
        // Valid: served (this node is no cluster sentinel and its keys are local: those two
        // views are not found here, once the credential passed).
        let served = if ["/v1/cluster", "/v1/custody"].contains(path) {
            404
        } else {
            200
        };
        let (code, v) = call(addr, method, path, Some(&genuine.header()), body);
        assert_eq!(code, served, "{what} with a valid credential: {v}");
        // Replayed: refused, and nothing happens twice.
        let (code, v) = call(addr, method, path, Some(&genuine.header()), body);
        assert_eq!(code, 403, "{what} replayed: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("replayed"),
            "{v}"
        );
    }
    // Each valid action was applied once, with who and why, in the trail.
    let log = node.authority.admin_log().unwrap();
    let actions: Vec<&str> = log.iter().map(|l| l.action.as_str()).collect();
    assert_eq!(actions, ["blacklist", "revoke", "unrevoke"]);
    assert_eq!(log[0].entry.operator, op.public_key().to_address());
    assert_eq!(log[0].entry.reason, "stolen");
    assert_eq!(log[1].entry.subject, victim);
    let supply: Value = common::http(addr, "GET", "/v1/ledger/supply", None).1;
    assert_eq!(
        supply["minted_cents"], 100,
        "the faucet minted once: {supply}"
    );
    node.stop();
}

#[test]
fn devnet_faucet_is_open_and_a_configured_node_has_none_by_default() {
    // The devnet: open to anyone, no credential.
    let devnet = LedgerNode::start();
    let owner = SecretKey::from_seed(&[5; 32]).public_key().to_address();
    let body = format!(r#"{{"owner":"{owner}","amount_cents":100}}"#);
    let (code, v) = call(
        devnet.addr,
        "POST",
        "/v1/ledger/faucet",
        None,
        body.as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    let (_, info) = common::http(devnet.addr, "GET", "/v1/info", None);
    assert_eq!(info["faucet_needs_operator"], false, "{info}");
    devnet.stop();

    // A configured node: no faucet, even for an operator.
    let closed = LedgerNode::start_with(|dir| {
        let mut c = AuthorityConfig::closed(dir);
        c.operators = vec![op_key().public_key()];
        c
    });
    let cred = sign(
        &op_key(),
        "POST",
        "/v1/ledger/faucet",
        body.as_bytes(),
        now(),
        1,
    );
    for auth in [None, Some(cred.header())] {
        let (code, v) = call(
            closed.addr,
            "POST",
            "/v1/ledger/faucet",
            auth.as_deref(),
            body.as_bytes(),
        );
        assert_eq!(code, 403, "{v}");
        assert_eq!(v["error"]["code"], "faucet_off", "{v}");
    }
    let (_, info) = common::http(closed.addr, "GET", "/v1/info", None);
    assert_eq!(info["faucet"], false, "{info}");
    closed.stop();

    // Turned on: operators only (the rest of the matrix is above).
    let on = closed_node_with_faucet();
    let (code, _) = call(on.addr, "POST", "/v1/ledger/faucet", None, body.as_bytes());
    assert_eq!(code, 401);
    let cred = sign(
        &op_key(),
        "POST",
        "/v1/ledger/faucet",
        body.as_bytes(),
        now(),
        2,
    );
    let (code, v) = call(
        on.addr,
        "POST",
        "/v1/ledger/faucet",
        Some(&cred.header()),
        body.as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    on.stop();
}

#[test]
fn revoked_depositor_and_blacklisted_token_are_refused_with_their_codes() {
    let node = LedgerNode::start_with(|dir| {
        let mut c = AuthorityConfig::devnet(dir);
        c.operators = vec![op_key().public_key()];
        c
    });
    let addr = node.addr;
    let a = node.authority.clone();
    // Minted to `first`, paid offline to `holder`, who deposits.
    let first = SecretKey::from_seed(&[4; 32]);
    let holder = SecretKey::from_seed(&[5; 32]);
    let minted = a.mint(first.public_key(), 300, [1; 32]).unwrap();
    assert!(minted.len() >= 2, "at least two tokens");
    let deposit_body = |t: &florin_token::Token| {
        let hop = t
            .transfer(
                &florin_crypto::LocalSigner::new(first.clone()),
                holder.public_key(),
                [2; 32],
            )
            .unwrap();
        let signed = hop
            .transfer(
                &florin_crypto::LocalSigner::new(holder.clone()),
                a.public_key(),
                [3; 32],
            )
            .unwrap();
        format!(
            r#"{{"depositor":"{}","tokens":["{}"]}}"#,
            holder.public_key().to_address(),
            hex::encode(signed.encode())
        )
    };
    // Blacklisted: that token's deposit is refused with the code `blacklisted`.
    let body = format!(
        r#"{{"serial":"{}","reason":"stolen"}}"#,
        minted[0].serial_hex()
    );
    let cred = sign(
        &op_key(),
        "POST",
        "/v1/admin/blacklist",
        body.as_bytes(),
        now(),
        1,
    );
    let (code, v) = call(
        addr,
        "POST",
        "/v1/admin/blacklist",
        Some(&cred.header()),
        body.as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = call(
        addr,
        "POST",
        "/v1/deposit",
        None,
        deposit_body(&minted[0]).as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["results"][0]["outcome"], "refused", "{v}");
    assert_eq!(v["results"][0]["code"], "blacklisted", "{v}");
    assert_eq!(v["results"][0]["retry"], false, "{v}");
    // Revoked: the whole deposit is refused (403, `revoked`) and changes nothing.
    let body = format!(
        r#"{{"key":"{}","reason":"double spender"}}"#,
        holder.public_key().to_address()
    );
    let cred = sign(
        &op_key(),
        "POST",
        "/v1/admin/revoke",
        body.as_bytes(),
        now(),
        2,
    );
    let (code, v) = call(
        addr,
        "POST",
        "/v1/admin/revoke",
        Some(&cred.header()),
        body.as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = call(
        addr,
        "POST",
        "/v1/deposit",
        None,
        deposit_body(&minted[1]).as_bytes(),
    );
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["error"]["code"], "revoked", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("double spender"),
        "{v}"
    );
    let info = a.token(&minted[1].serial).unwrap();
    assert_eq!(info.status, "in_circulation");
    // Lifted: the same deposit goes through.
    let cred = sign(
        &op_key(),
        "POST",
        "/v1/admin/unrevoke",
        body.as_bytes(),
        now(),
        3,
    );
    let (code, v) = call(
        addr,
        "POST",
        "/v1/admin/unrevoke",
        Some(&cred.header()),
        body.as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    let (code, v) = call(
        addr,
        "POST",
        "/v1/deposit",
        None,
        deposit_body(&minted[1]).as_bytes(),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["results"][0]["outcome"], "reanchored", "{v}");
    node.stop();
}

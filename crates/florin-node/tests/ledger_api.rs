//! The ledger API over a real socket, on the embedded durable store.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{http, request, LedgerNode};
use florin_crypto::{LocalSigner, SecretKey, Signer};
use florin_ledger::{Encumbrance, Output, Transaction, Transfer, Utxo, Witness};
use serde_json::Value;

/// Submits `tx` as JSON.
fn submit(addr: std::net::SocketAddr, tx: &Transaction) -> (u16, Value) {
    let body = format!(r#"{{"tx":"{}"}}"#, hex::encode(tx.encode()));
    http(addr, "POST", "/v1/ledger/transactions", Some(&body))
}

/// `unspent` of the ledger's answer for UTXO id `id` (hex).
fn unspent(addr: std::net::SocketAddr, id: &str) -> Value {
    http(addr, "GET", &format!("/v1/ledger/unspent/{id}"), None).1["unspent"].clone()
}

/// `status` of the ledger's answer for transaction `txid` (hex).
fn tx_status(addr: std::net::SocketAddr, txid: &str) -> Value {
    http(
        addr,
        "GET",
        &format!("/v1/ledger/transactions/{txid}"),
        None,
    )
    .1["status"]
        .clone()
}

/// The UTXOs a faucet answer lists.
fn minted_utxos(minted: &Value) -> Vec<Utxo> {
    minted["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| Utxo::decode(&hex::decode(h.as_str().unwrap()).unwrap()).unwrap())
        .collect()
}

fn pay(inputs: Vec<Utxo>, owner: &LocalSigner, to: &LocalSigner, amount: u64) -> Transaction {
    pay_until(
        inputs,
        owner,
        to,
        amount,
        florin_ledger::expiry::default_expiry(),
    )
}

/// [`pay`] valid until `expires` (Unix seconds).
fn pay_until(
    inputs: Vec<Utxo>,
    owner: &LocalSigner,
    to: &LocalSigner,
    amount: u64,
    expires: u64,
) -> Transaction {
    let total: u64 = inputs.iter().map(|u| u.value).sum();
    let mut outputs = vec![Output {
        value: amount,
        encumbrance: Encumbrance::ed25519(&to.public_key()),
    }];
    if total > amount {
        outputs.push(Output {
            value: total - amount,
            encumbrance: Encumbrance::ed25519(&owner.public_key()),
        });
    }
    let mut t = Transfer {
        expires,
        inputs,
        outputs,
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = t
        .inputs
        .iter()
        .map(|_| Witness::ed25519(owner.public_key(), owner.sign(&txid).unwrap()))
        .collect();
    Transaction::Transfer(t)
}

/// The devnet faucet mints `cents` to `owner`; returns the created UTXOs.
fn faucet(addr: std::net::SocketAddr, owner: &LocalSigner, cents: u64) -> Vec<Utxo> {
    let (code, minted) = http(
        addr,
        "POST",
        "/v1/ledger/faucet",
        Some(&format!(
            r#"{{"owner":"{}","amount_cents":{cents}}}"#,
            owner.public_key()
        )),
    );
    assert_eq!(code, 200, "{minted}");
    minted_utxos(&minted)
}

#[test]
fn replays_inside_the_validity_are_replays_and_after_it_are_expired() {
    use florin_ledger::expiry::{unix_now, MAX_TTL_SECS};
    let node = LedgerNode::start();
    let addr = node.addr;
    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    let utxos = faucet(addr, &alice, 1250);
    // Valid until the end of the next second.
    let until = unix_now() + 1;
    let tx = pay_until(vec![utxos[0]], &alice, &bob, utxos[0].value, until);
    let (code, ans) = submit(addr, &tx);
    assert_eq!(
        (code, ans["status"].as_str()),
        (200, Some("confirmed")),
        "{ans}"
    );
    let txid = ans["txid"].as_str().unwrap().to_string();
    // Inside its validity a replay is answered confirmed and changes nothing.
    let before = http(addr, "GET", "/v1/ledger/supply", None).1;
    assert_eq!(submit(addr, &tx).1["status"], "confirmed");
    assert_eq!(http(addr, "GET", "/v1/ledger/supply", None).1, before);
    // After it: "expired", never applied again and never "state_invalid" (its input is
    // spent by itself); its output is still there, which is how a wallet tells it applied.
    while unix_now() <= until {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (code, ans) = submit(addr, &tx);
    assert_eq!(
        (code, ans["status"].as_str()),
        (200, Some("expired")),
        "{ans}"
    );
    assert!(ans["error"].as_str().unwrap().contains("expired"), "{ans}");
    assert_eq!(http(addr, "GET", "/v1/ledger/supply", None).1, before);
    let out = match &tx {
        Transaction::Transfer(t) => t.output_utxos()[0].id(),
        _ => unreachable!(),
    };
    assert_eq!(unspent(addr, &hex::encode(out)), true);
    // Once the store's clock has moved past the expiry (its next swap, here a mint), the
    // txid is forgotten: its status is unknown (404), as documented.
    faucet(addr, &bob, 1);
    let (code, _) = http(
        addr,
        "GET",
        &format!("/v1/ledger/transactions/{txid}"),
        None,
    );
    assert_eq!(code, 404);
    // A transaction built already expired, or valid further ahead than any ledger keeps a
    // txid, is refused as expired before anything else, and changes nothing.
    let stale = pay_until(vec![utxos[1]], &alice, &bob, utxos[1].value, unix_now() - 1);
    assert_eq!(submit(addr, &stale).1["status"], "expired");
    let far = pay_until(
        vec![utxos[1]],
        &alice,
        &bob,
        utxos[1].value,
        unix_now() + MAX_TTL_SECS + 3600,
    );
    let (_, ans) = submit(addr, &far);
    assert_eq!(ans["status"], "expired", "{ans}");
    assert!(
        ans["error"].as_str().unwrap().contains("after now"),
        "{ans}"
    );
    assert_eq!(unspent(addr, &hex::encode(utxos[1].id())), true);
}

#[test]
fn submit_status_unspent_and_idempotency() {
    let node = LedgerNode::start();
    let addr = node.addr;

    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    let utxos = faucet(addr, &alice, 1250);
    assert_eq!(utxos.iter().map(|u| u.value).sum::<u64>(), 1250);
    let id0 = hex::encode(utxos[0].id());
    assert_eq!(unspent(addr, &id0), true);

    // Pay Bob with the first output.
    let tx = pay(vec![utxos[0]], &alice, &bob, 100.min(utxos[0].value));
    let (code, ans) = submit(addr, &tx);
    assert_eq!(
        (code, ans["status"].as_str()),
        (200, Some("confirmed")),
        "{ans}"
    );
    let txid = ans["txid"].as_str().unwrap().to_string();
    assert_eq!(unspent(addr, &id0), false);
    // Resubmitting returns its status and changes nothing.
    let before = http(addr, "GET", "/v1/ledger/supply", None).1;
    let (_, again) = submit(addr, &tx);
    assert_eq!(again["status"], "confirmed");
    assert_eq!(http(addr, "GET", "/v1/ledger/supply", None).1, before);
    assert_eq!(tx_status(addr, &txid), "confirmed");
    // A double spend of the same input is state-invalid, never confirmed.
    let dbl = pay(vec![utxos[0]], &alice, &alice, utxos[0].value);
    let (_, ans) = submit(addr, &dbl);
    assert_eq!(ans["status"], "state_invalid", "{ans}");
    let dbl_id = ans["txid"].as_str().unwrap().to_string();
    assert_eq!(tx_status(addr, &dbl_id), "state_invalid");
    // Bob cannot spend Alice's output: static-invalid with the rule named.
    let theft = pay(vec![utxos[1]], &bob, &bob, utxos[1].value);
    let (_, ans) = submit(addr, &theft);
    assert_eq!(ans["status"], "static_invalid");
    assert!(
        ans["error"].as_str().unwrap().contains("another key"),
        "{ans}"
    );
    // Malformed input is a 400; unknown ids are 404.
    assert_eq!(
        http(
            addr,
            "POST",
            "/v1/ledger/transactions",
            Some(r#"{"tx":"0102"}"#)
        )
        .0,
        400
    );
    assert_eq!(
        http(addr, "POST", "/v1/ledger/transactions", Some("{")).0,
        400
    );
    assert_eq!(
        http(
            addr,
            "GET",
            &format!("/v1/ledger/transactions/{}", "00".repeat(32)),
            None
        )
        .0,
        404
    );
    assert_eq!(http(addr, "GET", "/v1/ledger/unspent/xyz", None).0, 400);
    // The books add up.
    let s = http(addr, "GET", "/v1/ledger/supply", None).1;
    assert_eq!(s["minted_cents"], 1250);
    assert_eq!(s["unspent_cents"], 1250);
    node.stop();
}

fn http_bytes(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> (u16, Value) {
    request(
        addr,
        "POST",
        path,
        Some(("application/octet-stream", body)),
        None,
    )
}

fn frames(txs: &[&Transaction]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in txs {
        let b = t.encode();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn binary_and_batch_submission() {
    let node = LedgerNode::start();
    let addr = node.addr;
    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    let utxos = faucet(addr, &alice, 38880);
    assert!(utxos.len() >= 4, "{utxos:?}");

    // One transaction as raw bytes.
    let t0 = pay(vec![utxos[0]], &alice, &bob, 1);
    let (code, ans) = http_bytes(addr, "/v1/ledger/transactions", &t0.encode());
    assert_eq!(
        (code, ans["status"].as_str()),
        (200, Some("confirmed")),
        "{ans}"
    );

    // A batch: a fresh payment, a replay of t0 (still confirmed, changes nothing), a double
    // spend of t0's input and a theft; answers come in order.
    let t1 = pay(vec![utxos[1]], &alice, &bob, 1);
    let dbl = pay(vec![utxos[0]], &alice, &alice, utxos[0].value);
    let theft = pay(vec![utxos[2]], &bob, &bob, utxos[2].value);
    let (code, ans) = http_bytes(addr, "/v1/ledger/batch", &frames(&[&t1, &t0, &dbl, &theft]));
    assert_eq!(code, 200, "{ans}");
    let statuses: Vec<&str> = ans["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["confirmed", "confirmed", "state_invalid", "static_invalid"]
    );
    assert_eq!(ans["results"][0]["txid"], hex::encode(t1.txid()));

    // The JSON form.
    let t3 = pay(vec![utxos[3]], &alice, &bob, 1);
    let body = format!(r#"{{"txs":["{}"]}}"#, hex::encode(t3.encode()));
    let (code, ans) = http(addr, "POST", "/v1/ledger/batch", Some(&body));
    assert_eq!(
        (code, ans["results"][0]["status"].as_str()),
        (200, Some("confirmed"))
    );

    // Bad batches are refused whole, before anything is submitted.
    let spare = pay(vec![utxos[utxos.len() - 1]], &alice, &bob, 1);
    let mut truncated = frames(&[&spare]);
    truncated.pop();
    for bad in [
        truncated,
        vec![1, 0],
        [frames(&[&spare]), vec![3, 0, 0, 0, 1, 2, 3]].concat(),
    ] {
        let (code, ans) = http_bytes(addr, "/v1/ledger/batch", &bad);
        assert_eq!(code, 400, "{ans}");
    }
    let (code, _) = http(addr, "POST", "/v1/ledger/batch", Some(r#"{"txs":["zz"]}"#));
    assert_eq!(code, 400);
    let (code, _) = http_bytes(addr, "/v1/ledger/transactions", &[1, 2, 3]);
    assert_eq!(code, 400);
    let too_many = frames(&vec![&spare; florin_http::MAX_SUBMIT_BATCH + 1]);
    assert_eq!(http_bytes(addr, "/v1/ledger/batch", &too_many).0, 400);
    // None of the refused batches spent the spare output.
    let id = hex::encode(utxos[utxos.len() - 1].id());
    assert_eq!(unspent(addr, &id), true);
    node.stop();
}

/// Cheap checks first: a transaction spending made-up inputs is refused as `state_invalid`
/// without its signatures being looked at (here they are garbage: verified, they would make it
/// `static_invalid`), while a transaction spending an output created earlier in the same batch
/// is still confirmed (looked at again after the commit that created its input), however long
/// the chain.
#[test]
fn inputs_are_looked_up_before_signatures() {
    let node = LedgerNode::start();
    let addr = node.addr;
    let (alice, bob) = (
        LocalSigner::new(SecretKey::from_seed(&[1; 32])),
        LocalSigner::new(SecretKey::from_seed(&[2; 32])),
    );
    let utxos = faucet(addr, &alice, 38880);

    // Made-up inputs owned by alice, witnesses by alice's key with a garbage signature.
    let made_up = |seed: u8| {
        let u = Utxo {
            value: 5,
            encumbrance: Encumbrance::ed25519(&alice.public_key()),
            serial: [seed; 32],
        };
        Transaction::Transfer(Transfer {
            expires: florin_ledger::expiry::default_expiry(),
            inputs: vec![u],
            outputs: vec![Output {
                value: 5,
                encumbrance: Encumbrance::ed25519(&bob.public_key()),
            }],
            witnesses: vec![Witness::ed25519(
                alice.public_key(),
                florin_crypto::Signature([7; 64]),
            )],
        })
    };
    // The same garbage signature on a real input: verified, and refused for it.
    let forged = match made_up(9) {
        Transaction::Transfer(mut t) => {
            t.inputs = vec![utxos[0]];
            t.outputs[0].value = utxos[0].value;
            Transaction::Transfer(t)
        }
        _ => unreachable!(),
    };
    let (_, ans) = submit(addr, &forged);
    assert_eq!(ans["status"], "static_invalid", "{ans}");

    // A chain within one batch: t1 pays bob from alice's coin, t2 spends t1's output.
    let t1 = pay(vec![utxos[1]], &alice, &bob, utxos[1].value);
    let t1_out = match &t1 {
        Transaction::Transfer(t) => t.output_utxos()[0],
        _ => unreachable!(),
    };
    let t2 = pay(vec![t1_out], &bob, &alice, t1_out.value);
    // And a third link: t3 spends t2's output (two rounds after the first commit).
    let t2_out = match &t2 {
        Transaction::Transfer(t) => t.output_utxos()[0],
        _ => unreachable!(),
    };
    let t3 = pay(vec![t2_out], &alice, &bob, t2_out.value);
    let (code, ans) = http_bytes(
        addr,
        "/v1/ledger/batch",
        &frames(&[&made_up(1), &t1, &t2, &t3, &made_up(2)]),
    );
    assert_eq!(code, 200, "{ans}");
    let statuses: Vec<&str> = ans["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    // The first is looked up before anything of this batch commits: the store is idle, the
    // hint answers, and no signature is verified. The last may reach a validator while the
    // committer holds the store for the first group; the hint never waits, so it is then
    // verified in full (`static_invalid` for its garbage signature). Either way it is refused.
    assert_eq!(
        statuses[..4],
        ["state_invalid", "confirmed", "confirmed", "confirmed"],
        "{ans}"
    );
    assert!(
        ["state_invalid", "static_invalid"].contains(&statuses[4]),
        "{ans}"
    );
    assert_eq!(
        ans["results"][0]["error"], "an input is spent or does not exist",
        "{ans}"
    );
    node.stop();
}

/// Body of a `/v1/withdraw` request for output 0 of `tx`, signed by `signer` (if any) over the
/// authorization message for `recipient` and `handshake`.
fn withdraw_body(
    tx: &Transaction,
    recipient: &florin_crypto::PublicKey,
    handshake: [u8; 32],
    auth: Option<(String, String)>,
) -> String {
    let mut v = serde_json::json!({
        "tx": hex::encode(tx.encode()),
        "output": 0,
        "recipient": recipient.to_address(),
        "handshake": hex::encode(handshake),
    });
    if let Some((k, s)) = auth {
        v["key"] = k.into();
        v["signature"] = s.into();
    }
    v.to_string()
}

fn ed_auth(
    signer: &LocalSigner,
    tx: &Transaction,
    recipient: &florin_crypto::PublicKey,
    handshake: [u8; 32],
) -> Option<(String, String)> {
    let msg = florin_node::api::withdraw_message(&tx.txid(), 0, recipient, &handshake);
    Some((
        hex::encode(signer.public_key().0),
        hex::encode(signer.sign(&msg).unwrap().0),
    ))
}

#[test]
fn withdrawal_is_bound_to_the_key_that_paid_the_reserve() {
    let node = LedgerNode::start();
    let addr = node.addr;
    let reserve = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
    let owner = LocalSigner::new(SecretKey::from_seed(&[1; 32]));
    let thief = LocalSigner::new(SecretKey::from_seed(&[66; 32]));
    let utxos = faucet(addr, &owner, 500);
    let tx = pay(utxos, &owner, &reserve, 300);
    let (code, st) = submit(addr, &tx);
    assert_eq!(
        (code, st["status"].as_str()),
        (200, Some("confirmed")),
        "{st}"
    );
    let thief_key = thief.public_key();
    let owner_key = owner.public_key();
    // Someone who saw the transaction: no signature, their own signature (they own no input),
    // or the owner's signature lifted onto their own recipient or handshake.
    let owner_auth = ed_auth(&owner, &tx, &owner_key, [1; 32]);
    for (who, body) in [
        (
            "no signature",
            withdraw_body(&tx, &thief_key, [7; 32], None),
        ),
        (
            "a key owning no input",
            withdraw_body(
                &tx,
                &thief_key,
                [7; 32],
                ed_auth(&thief, &tx, &thief_key, [7; 32]),
            ),
        ),
        (
            "the owner's signature, another recipient",
            withdraw_body(&tx, &thief_key, [1; 32], owner_auth.clone()),
        ),
        (
            "the owner's signature, another handshake",
            withdraw_body(&tx, &owner_key, [7; 32], owner_auth.clone()),
        ),
        (
            "a garbage signature",
            withdraw_body(
                &tx,
                &thief_key,
                [7; 32],
                Some((hex::encode(owner_key.0), "00".repeat(64))),
            ),
        ),
    ] {
        let (code, e) = http(addr, "POST", "/v1/withdraw", Some(&body));
        assert_eq!(code, 403, "{who}: {e}");
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not authorized"),
            "{who}: {e}"
        );
    }
    // The owner still collects its tokens, addressed to it.
    let (code, ok) = http(
        addr,
        "POST",
        "/v1/withdraw",
        Some(&withdraw_body(&tx, &owner_key, [1; 32], owner_auth.clone())),
    );
    assert_eq!(code, 200, "{ok}");
    let tokens = ok["tokens"].as_array().unwrap().clone();
    let total: u64 = tokens
        .iter()
        .map(|t| {
            let t =
                florin_token::Token::decode(&hex::decode(t.as_str().unwrap()).unwrap()).unwrap();
            assert_eq!(t.links.last().unwrap().recipient, owner_key);
            t.value.cents()
        })
        .sum();
    assert_eq!(total, 300);
    // A repeat without the owner's signature is refused too; with it, the same tokens.
    let (code, _) = http(
        addr,
        "POST",
        "/v1/withdraw",
        Some(&withdraw_body(&tx, &thief_key, [7; 32], None)),
    );
    assert_eq!(code, 403);
    let (code, again) = http(
        addr,
        "POST",
        "/v1/withdraw",
        Some(&withdraw_body(&tx, &owner_key, [1; 32], owner_auth)),
    );
    assert_eq!((code, again["tokens"].as_array().unwrap()), (200, &tokens));
    node.stop();
}

#[test]
fn p256_owners_sign_their_withdrawals_too() {
    use rand::SeedableRng;
    let node = LedgerNode::start();
    let addr = node.addr;
    let reserve = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let sk = florin_crypto::P256SecretKey::generate(&mut rng);
    let pk = sk.public_key();
    let enc = Encumbrance::p256(&pk);
    let (code, minted) = http(
        addr,
        "POST",
        "/v1/ledger/faucet",
        Some(&format!(
            r#"{{"owner":"{}","amount_cents":200}}"#,
            enc.to_text()
        )),
    );
    assert_eq!(code, 200, "{minted}");
    let inputs: Vec<Utxo> = minted_utxos(&minted);
    let mut t = Transfer {
        expires: florin_ledger::expiry::default_expiry(),
        inputs,
        outputs: vec![Output {
            value: 200,
            encumbrance: Encumbrance::ed25519(&reserve.public_key()),
        }],
        witnesses: vec![],
    };
    let txid = t.txid();
    t.witnesses = t
        .inputs
        .iter()
        .map(|_| Witness::p256(pk, sk.sign(&txid).unwrap()))
        .collect();
    let tx = Transaction::Transfer(t);
    let (code, st) = submit(addr, &tx);
    assert_eq!(
        (code, st["status"].as_str()),
        (200, Some("confirmed")),
        "{st}"
    );
    let recipient = LocalSigner::new(SecretKey::from_seed(&[3; 32])).public_key();
    let msg = florin_node::api::withdraw_message(&tx.txid(), 0, &recipient, &[4; 32]);
    let good = (hex::encode(pk.0), hex::encode(sk.sign(&msg).unwrap().0));
    let other = florin_node::api::withdraw_message(&tx.txid(), 0, &recipient, &[5; 32]);
    let wrong = (hex::encode(pk.0), hex::encode(sk.sign(&other).unwrap().0));
    let (code, _) = http(
        addr,
        "POST",
        "/v1/withdraw",
        Some(&withdraw_body(&tx, &recipient, [4; 32], Some(wrong))),
    );
    assert_eq!(code, 403);
    let (code, ok) = http(
        addr,
        "POST",
        "/v1/withdraw",
        Some(&withdraw_body(&tx, &recipient, [4; 32], Some(good))),
    );
    assert_eq!(code, 200, "{ok}");
    node.stop();
}

#[test]
fn invalid_addresses_are_refused_at_the_api() {
    let node = LedgerNode::start();
    let addr = node.addr;
    let zero = florin_crypto::PublicKey([0; 32]);
    let mut identity = [0u8; 32];
    identity[0] = 1;
    let identity = florin_crypto::PublicKey(identity);
    for bad in [zero, identity] {
        for owner in [
            bad.to_address(),
            hex::encode(bad.0),
            format!("ed25519:{}", hex::encode(bad.0)),
        ] {
            let (code, e) = http(
                addr,
                "POST",
                "/v1/ledger/faucet",
                Some(&format!(r#"{{"owner":"{owner}","amount_cents":100}}"#)),
            );
            assert_eq!(code, 400, "faucet to {owner}: {e}");
            assert!(
                e["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("small order"),
                "{e}"
            );
        }
        let (code, e) = http(
            addr,
            "POST",
            "/v1/mailbox",
            Some(&format!(r#"{{"to":"{bad}","message":"00"}}"#)),
        );
        assert_eq!(code, 400, "{e}");
        let (code, e) = http(
            addr,
            "POST",
            "/v1/deposit",
            Some(&format!(r#"{{"depositor":"{bad}","tokens":["00"]}}"#)),
        );
        assert_eq!(code, 400, "{e}");
    }
    // The ledger's supply did not move: nothing was minted to the bad keys.
    let (_, s) = http(addr, "GET", "/v1/ledger/supply", None);
    assert_eq!(s["minted_cents"], 0, "{s}");
    // A good key still works.
    let ok = LocalSigner::new(SecretKey::from_seed(&[1; 32]));
    assert_eq!(
        faucet(addr, &ok, 100).iter().map(|u| u.value).sum::<u64>(),
        100
    );
    node.stop();
}

/// A deposit of more tokens than one ledger transaction takes inputs, each backed by its own
/// small reserve output: the reserve joins its outputs (1,024 at a time) and then pays the
/// depositor; the credit is confirmed, its output is the depositor's and the books balance.
#[test]
fn a_credit_needing_more_reserve_outputs_than_a_transaction_takes() {
    use florin_token::Token;
    let node = LedgerNode::start();
    let addr = node.addr;
    let reserve = LocalSigner::new(SecretKey::from_seed(&[9; 32]));
    let owner = LocalSigner::new(SecretKey::from_seed(&[1; 32]));
    let n = florin_ledger::tx::MAX_IO + 76;
    // n withdrawals of one cent each: n reserve outputs, n one-cent tokens to the owner.
    let mut coin = faucet(addr, &owner, n as u64 + 10);
    let mut tokens: Vec<Token> = Vec::with_capacity(n);
    for i in 0..n {
        let tx = pay(std::mem::take(&mut coin), &owner, &reserve, 1);
        let (code, st) = submit(addr, &tx);
        assert_eq!(
            (code, st["status"].as_str()),
            (200, Some("confirmed")),
            "{st}"
        );
        let Transaction::Transfer(t) = &tx else {
            unreachable!()
        };
        coin = vec![t.output_utxos()[1]];
        let hs = [(i % 251) as u8; 32];
        let auth = ed_auth(&owner, &tx, &owner.public_key(), hs);
        let (code, w) = http(
            addr,
            "POST",
            "/v1/withdraw",
            Some(&withdraw_body(&tx, &owner.public_key(), hs, auth)),
        );
        assert_eq!(code, 200, "{w}");
        for h in w["tokens"].as_array().unwrap() {
            tokens.push(Token::decode(&hex::decode(h.as_str().unwrap()).unwrap()).unwrap());
        }
    }
    assert_eq!(tokens.len(), n);
    // Every token paid offline to bob, who deposits them all, credited, in one deposit.
    let bob = LocalSigner::new(SecretKey::from_seed(&[2; 32]));
    let signed: Vec<String> = tokens
        .iter()
        .map(|t| {
            let t = t.transfer(&owner, bob.public_key(), [41; 32]).unwrap();
            hex::encode(
                t.transfer(&bob, reserve.public_key(), [42; 32])
                    .unwrap()
                    .encode(),
            )
        })
        .collect();
    let body = serde_json::json!({
        "depositor": bob.public_key().to_address(),
        "tokens": signed,
        "credit": true,
    })
    .to_string();
    let (code, d) = http(addr, "POST", "/v1/deposit", Some(&body));
    assert_eq!(code, 200, "{}", d["error"]);
    let credited = d["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outcome"] == "credited")
        .count();
    assert_eq!(credited, n, "{}", d["results"][0]);
    assert_eq!(d["credit"]["status"], "confirmed", "{}", d["credit"]);
    let out = Utxo::decode(&hex::decode(d["credit"]["output"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(out.value, n as u64);
    assert_eq!(out.encumbrance, Encumbrance::ed25519(&bob.public_key()));
    let id = hex::encode(out.id());
    assert_eq!(unspent(addr, &id), true);
    // The whole reserve went to the credit; the books balance with nothing outstanding.
    let (_, a) = http(addr, "GET", "/v1/audit", None);
    assert_eq!(a["balanced"], true, "{a}");
    assert_eq!(
        (
            a["reserve_cents"].as_u64(),
            a["tokens_outstanding_cents"].as_u64()
        ),
        (Some(0), Some(0)),
        "{a}"
    );
    // The same deposit again credits nothing twice.
    let (code, again) = http(addr, "POST", "/v1/deposit", Some(&body));
    assert_eq!(code, 200, "{}", again["error"]);
    assert!(again["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["outcome"] == "already_credited"));
    node.stop();
}
